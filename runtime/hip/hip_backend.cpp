// hip_backend.cpp: see hip_backend.hpp.
#include "hip_backend.hpp"

#include <unistd.h>

#include "../fork_watch.hpp"
#include "hip_api.hpp"
#include "kernels_hip.hpp"
#include "rocprim_sort.hpp"

namespace smla::hip {
namespace {

// Makes `device` current for the scope and puts the caller's device back at its end, also on a throw (the CUDA
// backend's ContextScope): a framework thread (PyTorch-ROCm) keeps allocating and launching on the device it had.
class DeviceScope {
 public:
  DeviceScope(const Api& api, int device) : api_(api) {
    SMLA_HIP_CHECK(api, hipGetDevice(&prev_));
    if (prev_ != device) {
      SMLA_HIP_CHECK(api, hipSetDevice(device));
      switched_ = true;
    }
  }
  ~DeviceScope() {
    if (switched_) api_.hipSetDevice(prev_);  // best effort: a destructor must not throw
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  const Api& api_;
  int prev_ = 0;
  bool switched_ = false;
};

class HipKernel : public LoadedKernel {
 public:
  HipKernel(const Api& api, int device) : api_(api), device_(device), pid_(::getpid()) {}
  ~HipKernel() override {
    // Not in a child forked after the module was loaded (a plan destroyed there, e.g. at a fork worker's exit): the
    // HIP runtime is not to be called in such a child, as CUDA's ~CudaKernel does not call the driver there.
    if (!module_ || ::getpid() != pid_) return;
    try {  // best effort: nothing to report from a destructor
      // Launches of this module may still be queued (the last plan holding it can go right after its run(), the
      // Runtime gone first): wait for the device's work before the unload, as ~CudaKernel does. Compile-checked only.
      DeviceScope use(api_, device_);
      api_.hipDeviceSynchronize();
      api_.hipModuleUnload(module_);
    } catch (...) {
    }
  }
  const Api& api_;
  int device_;
  pid_t pid_;  // the process that loaded the module
  hipModule_t module_ = nullptr;
  hipFunction_t fn_ = nullptr;
};

// The csr sort ("@rocprim"): rocPRIM's radix_sort_pairs from libsmla_rocprim.so, no module.
class RocprimKernel : public LoadedKernel {
 public:
  RocprimKernel(const Api& api, int device, const RocprimSort* sort) : api_(api), device_(device), sort_(sort) {}
  const Api& api_;
  int device_;
  const RocprimSort* sort_;
};

}  // namespace

HipBackend::HipBackend() = default;

namespace {
// The process that initialised the HIP runtime (0: none). A child it forks inherits a runtime it cannot use (as with
// CUDA: a DataLoader-style worker of a PyTorch-ROCm job): there the backend is unusable and says why.
struct HipForkTag;
using HipFork = ForkWatch<HipForkTag>;

std::string forked_why() {
  return "HIP backend unusable: this process was forked from one that had initialised HIP (pid " +
         std::to_string(HipFork::init_pid()) + "), and a forked child cannot use it: start workers with spawn, "
         "not fork";
}
}  // namespace

bool hip_forked_after_init() { return HipFork::forked(); }

void require_not_forked(const char* call) {
  if (hip_forked_after_init()) throw Error(Status::NoBackend, forked_why(), __FILE__, __LINE__, call);
}

const HipBackend::Probe& HipBackend::probe() {
  static const Probe p = [] {
    Probe r;
    std::string why;
    const Api* api = Api::get(&why);
    if (!api) {
      r.why = "HIP backend unusable: " + why;
      return r;
    }
    hipError_t e = api->hipInit(0);
    if (e == kHipSuccess) HipFork::arm();
    int n = 0;
    if (e == kHipSuccess) e = api->hipGetDeviceCount(&n);
    if (e != kHipSuccess || n <= 0) {
      r.why = "HIP backend unusable: no AMD GPU found (" +
              (e == kHipSuccess ? std::string("hipGetDeviceCount returned 0") : hip_error_text(*api, e)) +
              "); HIP " + hip_version_string(hip_runtime_version(*api)) + " is installed at " + api->hip_library;
      api->hipGetLastError();  // leave no sticky error for the host application
      return r;
    }
    r.usable = true;
    r.devices = n;
    return r;
  }();
  return p;
}

bool HipBackend::usable(std::string* why) const {
  try {
    const Probe& p = probe();
    if (p.usable && hip_forked_after_init()) {
      if (why) *why = forked_why();
      return false;
    }
    if (!p.usable && why) *why = p.why;
    return p.usable;
  } catch (const std::exception& e) {  // e.g. hipRuntimeGetVersion failing inside the message
    if (why) *why = std::string("HIP backend unusable: ") + e.what();
    return false;
  }
}

int HipBackend::device_count() const { return usable(nullptr) ? probe().devices : 0; }

std::string HipBackend::target(int device) const {
  const Api& api = Api::require();
  return device_arch_name(api, device);
}

std::shared_ptr<LoadedKernel> HipBackend::load(const KernelSpec& spec, const std::vector<uint8_t>& binary,
                                               int device) {
  require_not_forked("hipModuleLoadData");
  const Api& api = Api::require();
  // Every kernel plan() loads passes here, compiled or taken from a cache: a processor the kernels
  // are not written for is refused before anything runs on it.
  std::string why;
  if (!hip_target_supported(target(device), &why))
    throw Error(Status::Unsupported, "device " + std::to_string(device) + ": " + why, __FILE__, __LINE__,
                "hipModuleLoadData");
  DeviceScope use(api, device);
  if (hip_is_library_kernel(spec)) {  // nothing compiled: `binary` is empty
    const RocprimSort* sort = spec.stem == kRocprimStem ? RocprimSort::get(&why) : nullptr;
    if (!sort)
      throw Error(Status::Unsupported,
                  spec.stem == kRocprimStem ? "the csr sort on AMD needs libsmla_rocprim.so: " + why
                                            : "unknown library kernel " + spec.stem,
                  __FILE__, __LINE__, "dlopen");
    // Built ahead of time for the targets that hipcc accepted: without code for this device, the
    // sort would fail at run() with a bare hipError. Refused here, at plan time, saying so.
    if (!sort->supports(target(device), &why))
      throw Error(Status::Unsupported, "device " + std::to_string(device) + ": " + why, __FILE__, __LINE__,
                  "rocprim::radix_sort_pairs");
    return std::make_shared<RocprimKernel>(api, device, sort);
  }
  // AMD needs no opt-in for dynamic LDS up to the device limit; check the limit here, before a
  // module is loaded for nothing (its unload waits for the device), so that a too large config fails at plan time
  // with a message instead of at launch.
  size_t limit = max_shared_memory(device);
  if (spec.smem_bytes > limit)
    throw Error(Status::Unsupported,
                spec.entry + " needs " + std::to_string(spec.smem_bytes) + " bytes of LDS; device " +
                    std::to_string(device) + " allows " + std::to_string(limit),
                __FILE__, __LINE__, "hipModuleLaunchKernel");
  auto k = std::make_shared<HipKernel>(api, device);
  try {
    SMLA_HIP_CHECK(api, hipModuleLoadData(&k->module_, binary.data()));
    SMLA_HIP_CHECK(api, hipModuleGetFunction(&k->fn_, k->module_, spec.entry.c_str()));
  } catch (const Error&) {
    // A refused binary is handled (recompiled, runtime.cpp), and the error is said in the exception either way. From
    // ROCm 7 on hipGetLastError returns the last error of the thread until read, whatever succeeded since: left
    // pending, it failed rocPRIM's next sort and the host's next launch check. Read here, it is gone. (Not run: no
    // AMD GPU here, and ROCm 5.2's runtime overwrites the error at the next call anyway.)
    api.hipGetLastError();
    throw;
  }
  return k;
}

bool hip_is_binary_refusal(const Error& e) {
  if (e.status() != Status::DriverError || e.call().rfind("hipModuleLoadData(", 0) != 0) return false;
  // SMLA_HIP_CHECK: "<call> failed: <name> (<text>)", or "hipError <code>" where the runtime could not name it.
  static const std::pair<int, const char*> refusals[] = {{200, "hipErrorInvalidImage"},
                                                         {209, "hipErrorNoBinaryForGpu"},
                                                         {218, "hipErrorInvalidKernelFile"},
                                                         {300, "hipErrorInvalidSource"},
                                                         {303, "hipErrorSharedObjectInitFailed"}};
  const std::string& m = e.message();
  const size_t at = m.find(" failed: ");
  if (at == std::string::npos) return false;
  const std::string what = m.substr(at + 9);
  for (const auto& [code, name] : refusals)
    for (const std::string& head : {std::string(name), "hipError " + std::to_string(code)})
      if (what.compare(0, head.size(), head) == 0 && (what.size() == head.size() || what[head.size()] == ' '))
        return true;
  return false;
}

bool HipBackend::is_binary_refusal(const Error& e) const { return hip_is_binary_refusal(e); }

size_t HipBackend::sort_temp_bytes(const RocprimSort& sort, int device, int n, int end_bit) const {
  DeviceScope use(Api::require(), device);
  return sort.temp_bytes(n, 0, end_bit);
}

void HipBackend::launch(const LoadedKernel& lk, const KernelSpec& spec, const SmlaParams& p, void* stream) {
  require_not_forked("hipModuleLaunchKernel");  // a plan made before a fork, run in the child
  if (const auto* rk = dynamic_cast<const RocprimKernel*>(&lk)) {
    // Stable sort of the chunk's (key, slot) pairs from buffer 1 - csr_final (smla_csr_keys
    // wrote it) into buffer csr_final, where rowptr and gather read; csr_hist is rocPRIM's
    // temporary storage, sized by the plan as temp_bytes(chunk_items, 0, end_bit) with its device current
    // (a chunk sorts at most chunk_items pairs). That size is what the sort is told: nothing is asked of
    // rocPRIM here, on run()'s path, and the sort cannot believe it owns more than the plan reserved.
    if (spec.scratch_bytes == 0)
      throw Error(Status::Internal, "the csr sort's launch carries no scratch size (csr_sort_temp_bytes unset)",
                  __FILE__, __LINE__, "rocprim::radix_sort_pairs");
    DeviceScope use(rk->api_, rk->device_);
    const int n = p.T * p.r_chunk, in = 1 - p.csr_final, out = p.csr_final;
    const int end_bit = radix_bits_for(p.num_kv);
    try {
      rk->sort_->sort_pairs(p.csr_hist, spec.scratch_bytes, p.csr_keys[in], p.csr_keys[out], p.csr_vals[in],
                            p.csr_vals[out], n, 0, end_bit, stream);
    } catch (...) {
      rk->api_.hipGetLastError();  // leave no error pending (as load() does): see below
      throw;
    }
    return;
  }
  const auto& k = static_cast<const HipKernel&>(lk);
  const Api& api = k.api_;
  DeviceScope use(api, k.device_);
  SmlaParams params = p;
  params.pass = spec.pass;
  void* args[] = {&params};
  try {
    SMLA_HIP_CHECK(api, hipModuleLaunchKernel(k.fn_, spec.grid.x, spec.grid.y, spec.grid.z, spec.block.x,
                                              spec.block.y, spec.block.z, spec.smem_bytes,
                                              static_cast<hipStream_t>(stream), args, nullptr));
  } catch (...) {
    // A failed launch leaves its error pending on the thread (ROCm >= 7): the next rocPRIM sort of a corrected run
    // and the host framework's next launch check would fail on it. The error is in the exception.
    api.hipGetLastError();
    throw;
  }
}

PointerKind pointer_kind_from(int memory_type, int runtime_version) {
  if (runtime_version >= 60000000) {
    // ROCm 6: Unregistered 0, Host 1, Device 2, Managed 3, Array 10, Unified 11.
    if (memory_type == 2 || memory_type == 3 || memory_type == 11) return PointerKind::Device;
    if (memory_type == 0 || memory_type == 1) return PointerKind::Host;
    return PointerKind::Unknown;
  }
  // ROCm 5: Host 0, Device 1, Array 2, Unified 3.
  if (memory_type == 1 || memory_type == 3) return PointerKind::Device;
  if (memory_type == 0) return PointerKind::Host;
  return PointerKind::Unknown;
}

PointerInfo HipBackend::pointer_info(const void* ptr, int device) const {
  const Api* api = Api::get();
  if (!api || !ptr || !usable(nullptr)) return {PointerKind::Unknown};
  PointerAttributes a{};
  hipError_t e = api->hipPointerGetAttributes(&a, ptr);
  if (e != kHipSuccess) api->hipGetLastError();  // leave nothing pending on the caller's thread
  // ROCm 5 reports memory it does not know (plain host memory, or an allocation already freed) as an invalid value;
  // ROCm 6 gives it the type Unregistered. Either is no failure, and is not device memory.
  if (e == kHipErrorInvalidValue) return {PointerKind::Host};
  // Any other error is the runtime's (not initialised, torn down, out of memory): said as such, not taken for host
  // memory (run() then refused a device pointer as "a host pointer").
  if (e != kHipSuccess)
    throw Error(Status::DriverError, "hipPointerGetAttributes failed: " + hip_error_text(*api, e), __FILE__, __LINE__,
                "hipPointerGetAttributes");
  if (a.is_managed) return {PointerKind::Device};  // managed memory serves every device
  const PointerKind kind = pointer_kind_from(a.memory_type, hip_runtime_version(*api));
  // Device memory of another device than the plan's: run() refuses it by name, as on CUDA.
  const bool elsewhere = kind == PointerKind::Device && a.device >= 0 && a.device != device;
  return {kind, elsewhere ? a.device : -1};
}

size_t HipBackend::max_shared_memory(int device) const {
  const Api& api = Api::require();
  int v = 0;
  SMLA_HIP_CHECK(api, hipDeviceGetAttribute(&v, kAttrMaxSharedMemoryPerBlock, device));
  return static_cast<size_t>(v);
}

// The stream (null: the current device's) is the one the plan ran on, of the device that holds `src` (the plan's
// workspace): that device is made current for the wait and the copy, whichever the caller's thread has.
void HipBackend::read_back(void* dst, const void* src, size_t bytes, void* stream) const {
  require_not_forked("hipMemcpyDtoH");
  const Api& api = Api::require();
  PointerAttributes a{};
  SMLA_HIP_CHECK(api, hipPointerGetAttributes(&a, src));
  int device = a.device;
  if (device < 0) SMLA_HIP_CHECK(api, hipGetDevice(&device));  // no device named: the current one, as before
  DeviceScope use(api, device);
  SMLA_HIP_CHECK(api, hipStreamSynchronize(static_cast<hipStream_t>(stream)));
  SMLA_HIP_CHECK(api, hipMemcpyDtoH(dst, const_cast<void*>(src), bytes));
}

// Asked after a failure only. The null stream is the current device's, which launch() makes the plan's.
std::string HipBackend::foreign_stream(int device, void* stream) const {
  const Api* api = Api::get();
  if (!api || !api->hipStreamGetDevice || !stream) return {};
  hipDevice_t sdev = -1;
  const bool known = api->hipStreamGetDevice(static_cast<hipStream_t>(stream), &sdev) == 0;  // hipSuccess
  if (!known || sdev < 0 || sdev == device) return {};
  return another_devices_stream("HIP", sdev, device);
}

}  // namespace smla::hip
