// cuda_backend.cpp: loads cubins and launches them through the driver API.
#include "cuda_backend.hpp"

#include <atomic>
#include <algorithm>

#include "cuda_api.hpp"
#include "../planner.hpp"  // parse_cuda_target, cuda_smem_limit
#include "../tuning_db.hpp"

namespace smla::cuda {

namespace {
struct CudaKernel : LoadedKernel {
  CUmodule module = nullptr;
  CUfunction fn = nullptr;
  CUcontext ctx = nullptr;
  int device = 0;
  unsigned sms = 0;  // the device's SMs, for a persistent kernel's grid (KernelSpec::persistent)
  ~CudaKernel() override {
    if (!module || !driver().ok) return;  // a forked child: the driver is not to be called
    try {  // best effort: a destructor must not throw
      ContextScope use(ctx);
      // Launches of this module may still be queued: the last plan holding it can go right after its run() (the
      // Runtime, whose map otherwise keeps modules until its own end, may be gone first, as README allows), and the
      // handle's use after cuModuleUnload is undefined. Wait for the context's work first (a destructor of the
      // teardown only: while the Runtime lives it holds every module).
      driver().CtxSynchronize();
      driver().ModuleUnload(module);
    } catch (...) {
    }
  }
};
}  // namespace

Error module_load_error(const Error& refused, int drv, int maj, int min) {
  if (!is_binary_refusal(refused) || drv <= 0 || drv >= maj * 1000 + min * 10) return refused;
  return Error(Status::Unsupported,
               refused.message() + "; the driver supports CUDA " + std::to_string(drv / 1000) + "." +
                   std::to_string(drv % 1000 / 10) + ", older than the NVRTC " + std::to_string(maj) + "." +
                   std::to_string(min) + " that compiled the kernels: update the driver, or set SMLA_LIBNVRTC to an "
                   "NVRTC no newer than the driver (and SMLA_CUDA_INCLUDE to its headers)",
               refused.file(), refused.line(), refused.call());
}

std::string target_for_cc(int major, int minor) {
  if (major < 8)
    SMLA_THROW(Status::Unsupported, "compute capability " + std::to_string(major) + "." + std::to_string(minor) +
                                        " is below the supported minimum 8.0 (mma.sync bf16)");
  if (major == 9 && minor == 0) return "sm_90a";
  return "sm_" + std::to_string(major) + std::to_string(minor);
}

bool cuda_target_supported(const std::string& target, std::string* why) {
  const std::optional<CudaTargetName> name = parse_cuda_target(target);
  std::string canonical;  // what plan() compiles for a GPU of the name's compute capability
  if (name) {
    try {
      canonical = target_for_cc(name->cc / 10, name->cc % 10);
    } catch (const Error&) {  // below sm_80
    }
  }
  if (!canonical.empty() && canonical == target && cuda_smem_limit(target) != 0) return true;
  if (why) {
    std::string known;
    for (int cc = 80; cc < 200; ++cc)
      if (const std::string t = target_for_cc(cc / 10, cc % 10); cuda_smem_limit(t) != 0)
        known += (known.empty() ? "" : ", ") + t;
    *why = "'" + target + "' is not a CUDA target smla plans for (" + known + ")";
    if (!canonical.empty() && canonical != target && cuda_smem_limit(canonical) != 0)
      *why += ": a GPU of compute capability " + std::to_string(name->cc / 10) + "." + std::to_string(name->cc % 10) +
              " runs " + canonical + " kernels, warm " + canonical;
  }
  return false;
}

CudaBackend::CudaBackend() = default;

CudaBackend::~CudaBackend() {
  // Never opened: nothing was retained (and opening it here would initialise CUDA in a CPU-only process). A forked
  // child (or no driver): nothing of the parent's may be released here.
  const Driver* d = driver_if_opened();
  if (!d || !d->ok) return;
  for (size_t i = 0; i < side_.size() && i < ctx_.size(); ++i) {  // best effort: a destructor must not throw
    if (!ctx_[i]) continue;
    try {
      ContextScope use(ctx_[i]);
      for (const auto& f : side_[i].free) driver().StreamDestroy(f.first);
      if (side_[i].event) driver().EventDestroy(side_[i].event);
    } catch (...) {
    }
  }
  for (size_t i = 0; i < ctx_.size(); ++i) {
    CUdevice dev;
    if (ctx_[i] && driver().DeviceGet(&dev, (int)i) == CUDA_SUCCESS) driver().DevicePrimaryCtxRelease(dev);
  }
}

bool CudaBackend::usable(std::string* why) const {
  if (!driver().ok) {
    if (why) *why = driver().why;
    return false;
  }
  return true;
}

int CudaBackend::device_count() const {
  if (!driver().ok) return 0;
  int n = 0;
  SMLA_CU(driver().DeviceGetCount(&n));
  return n;
}

CUdevice CudaBackend::device_handle(int device) const {
  std::string why;
  if (!usable(&why)) SMLA_THROW(Status::NoBackend, "the CUDA backend is not usable here: " + why);
  if (device < 0 || device >= device_count())
    SMLA_THROW(Status::InvalidArgument, "device " + std::to_string(device) + " does not exist (" +
                                            std::to_string(device_count()) + " CUDA devices)");
  CUdevice dev;
  SMLA_CU(driver().DeviceGet(&dev, device));
  return dev;
}

CUcontext CudaBackend::context(int device) const {
  const CUdevice dev = device_handle(device);
  std::lock_guard<std::mutex> lock(mu_);
  if ((int)ctx_.size() <= device) ctx_.resize(device + 1, nullptr);
  if (!ctx_[device]) SMLA_CU(driver().DevicePrimaryCtxRetain(&ctx_[device], dev));
  return ctx_[device];
}

// Attributes need no context: backends() and plan() create none just to read them.
std::string CudaBackend::target(int device) const {
  const CUdevice dev = device_handle(device);
  int major = 0, minor = 0;
  SMLA_CU(driver().DeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
  SMLA_CU(driver().DeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
  return target_for_cc(major, minor);
}

std::string CudaBackend::device_class(int device) const {
  const CUdevice dev = device_handle(device);
  char name[256] = {0};
  int sms = 0;
  SMLA_CU(driver().DeviceGetName(name, sizeof name - 1, dev));
  SMLA_CU(driver().DeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
  return tuning_device_class(target(device), name, sms);
}

size_t CudaBackend::max_shared_memory(int device) const {
  const CUdevice dev = device_handle(device);
  int v = 0;
  SMLA_CU(driver().DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev));
  return (size_t)v;
}

namespace {
std::atomic<int64_t> g_modules_loaded{0};
}  // namespace

int64_t CudaBackend::modules_loaded() { return g_modules_loaded.load(); }

std::shared_ptr<LoadedKernel> CudaBackend::load(const KernelSpec& spec, const std::vector<uint8_t>& binary,
                                                int device) {
  auto k = std::make_shared<CudaKernel>();
  k->device = device;
  k->ctx = context(device);
  ContextScope use(k->ctx);
  try {
    SMLA_CU(driver().ModuleLoadData(&k->module, binary.data()));
    ++g_modules_loaded;
  } catch (const Error& e) {
    // A driver older than the NVRTC that compiled the kernels refuses their images: say which versions and what to
    // change.
    int drv = 0, maj = 0, min = 0;
    if (!is_binary_refusal(e) || driver().DriverGetVersion(&drv) != CUDA_SUCCESS || !nvrtc().ok ||
        nvrtc().Version(&maj, &min) != NVRTC_SUCCESS)
      throw;
    throw module_load_error(e, drv, maj, min);
  }
  SMLA_CU(driver().ModuleGetFunction(&k->fn, k->module, spec.entry.c_str()));
  // A launch spec that drifted from its kernel's __launch_bounds__ fails here, by name, at plan
  // time, instead of as a launch error inside run().
  int max_threads = 0;
  SMLA_CU(driver().FuncGetAttribute(&max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, k->fn));
  const unsigned threads = spec.block.x * spec.block.y * spec.block.z;
  if (threads > static_cast<unsigned>(max_threads))
    SMLA_THROW(Status::Internal, spec.entry + " is launched with " + std::to_string(threads) +
                                     " threads a block; the compiled kernel allows " + std::to_string(max_threads));
  if (spec.launch_regs > 0) {
    int regs = 0;
    SMLA_CU(driver().FuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, k->fn));
    if (regs != spec.launch_regs)
      SMLA_THROW(Status::Internal, spec.entry + " was given " + std::to_string(regs) +
                                       " registers a thread; its setmaxnreg split between warpgroups is sized for " +
                                       std::to_string(spec.launch_regs) + " (under any other count it would hang)");
  }
  if (spec.persistent) {
    CUdevice dev;
    int sms = 0;
    SMLA_CU(driver().DeviceGet(&dev, device));
    SMLA_CU(driver().DeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    k->sms = static_cast<unsigned>(std::max(sms, 1));
  }
  if (spec.smem_bytes > 48 * 1024) {
    // The block's static shared memory (a kernel's own __shared__ arrays) counts against the same limit as the
    // dynamic carve the spec asks for: a sum over the limit fails here, by name, not as a launch error in run().
    const size_t limit = max_shared_memory(device);
    int static_bytes = 0;
    SMLA_CU(driver().FuncGetAttribute(&static_bytes, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, k->fn));
    if (spec.smem_bytes + size_t(static_bytes) > limit)
      SMLA_THROW(Status::Unsupported, spec.entry + " needs " + std::to_string(spec.smem_bytes) +
                                          " bytes of shared memory" +
                                          (static_bytes ? " and " + std::to_string(static_bytes) + " of its own" : "") +
                                          "; the device allows " + std::to_string(limit) +
                                          " (the planner sizes its tiles by the target's limit; an explicit TileConfig "
                                          "must fit too, e.g. dq_block_h 16 or 32, dkv_block_r 32, dkv_block_d 128)");
    SMLA_CU(driver().FuncSetAttribute(k->fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)spec.smem_bytes));
  }
  return k;
}

// The null, legacy and per-thread streams are the current context's, which launch() makes the plan's primary context.
// With another context of the same device current (a driver-API caller's cuCtxCreate), the caller means that
// context's stream, and the work would go unordered with it: refused before anything is queued, as an explicit stream
// of that context is (after the driver's error). One driver call a run when no context or the primary is current.
void CudaBackend::check_stream(int device, void* stream) const {
  const auto s = static_cast<CUstream>(stream);
  if (!driver().ok || (s && s != CU_STREAM_LEGACY && s != CU_STREAM_PER_THREAD)) return;
  CUcontext cur = nullptr;
  if (driver().CtxGetCurrent(&cur) != CUDA_SUCCESS || !cur || cur == context(device)) return;
  CUdevice cdev = -1;
  if (driver().CtxGetDevice(&cdev) != CUDA_SUCCESS || cdev != device_handle(device)) return;
  SMLA_THROW(Status::InvalidArgument,
             "run() was given the default stream (null, legacy or per-thread) while a context of CUDA device " +
                 std::to_string(device) +
                 " other than its primary context is current: smla runs in the primary context, so the work would "
                 "not be ordered with that context's; pass a stream created in the primary context");
}

void CudaBackend::launch(const LoadedKernel& lk, const KernelSpec& spec, const SmlaParams& p, void* stream) {
  const auto& k = static_cast<const CudaKernel&>(lk);
  ContextScope use(k.ctx);
  void* args[] = {const_cast<SmlaParams*>(&p)};
  const unsigned gx = spec.persistent ? std::min(spec.grid.x, k.sms) : spec.grid.x;
  SMLA_CU(driver().LaunchKernel(k.fn, gx, spec.grid.y, spec.grid.z, spec.block.x, spec.block.y, spec.block.z,
                                spec.smem_bytes, static_cast<CUstream>(stream), args, nullptr));
}

// run() asks this of every tensor: one driver call a pointer. Unlike cuPointerGetAttribute, cuPointerGetAttributes
// is no error on memory CUDA does not know (plain host memory): its attributes come back zero, memory type 0.
// Unified addresses need no current context (checked on the H200 by ApiCuda.TheCallersCurrentContextIsLeftAsItWas);
// should a driver want one, the query is asked again with device 0's primary context current, and the caller's put
// back.
PointerInfo CudaBackend::pointer_info(const void* ptr, int device) const {
  if (!driver().ok || !ptr) return {PointerKind::Unknown};
  unsigned int type = 0, managed = 0;  // IS_MANAGED is a boolean: the driver may write fewer bytes than an int
  int ordinal = -1;
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                 CU_POINTER_ATTRIBUTE_IS_MANAGED};
  void* data[] = {&type, &ordinal, &managed};
  const auto p = reinterpret_cast<CUdeviceptr>(ptr);
  CUresult r = driver().PointerGetAttributes(3, attrs, data, p);
  if (r == CUDA_ERROR_INVALID_CONTEXT) {
    ContextScope use(context(0));
    r = driver().PointerGetAttributes(3, attrs, data, p);
  }
  check(r, "cuPointerGetAttributes(MEMORY_TYPE, DEVICE_ORDINAL, IS_MANAGED)", __FILE__, __LINE__);
  if (type != CU_MEMORYTYPE_DEVICE && type != CU_MEMORYTYPE_UNIFIED) return {PointerKind::Host};
  // Managed memory migrates to whichever device touches it.
  const bool elsewhere = ordinal >= 0 && ordinal != device && !managed;
  return {PointerKind::Device, elsewhere ? ordinal : -1};
}

// A pooled stream last joined to the same caller's stream `main`, whose capture status is "none": one left joined to a
// capture that is still open (the caller captured the run into a graph and has not ended the capture) stays in the pool
// untouched until that capture ends, so two captures, or a capture and a plain run, never share one. One last joined
// to another stream is not taken either: its csr may still be queued behind that stream's work, and this run's join
// would then make `main` wait for it (runs on independent streams serialized; a deadlock where the other stream waits
// on the host). No query of the stream's progress: a query during another thread's global-mode capture breaks it.
namespace {
// What the pool keys a caller's stream by: its handle, except CU_STREAM_PER_THREAD, one handle that names another
// stream on every thread (a side stream joined to thread A's would have made thread B's wait for A's work). A run
// acquires and releases on one thread, so a thread's own address stands for its stream (a later thread may get the
// address of one that ended, whose stream's work is then done or still draining: a wait, never a deadlock).
void* pool_key(void* main) {
  thread_local char this_thread;
  return main == static_cast<void*>(CU_STREAM_PER_THREAD) ? static_cast<void*>(&this_thread) : main;
}
}  // namespace

void* CudaBackend::acquire_side_stream(int device, void* main) {
  main = pool_key(main);
  ContextScope use(context(device));
  std::lock_guard<std::mutex> lock(side_mu_);
  if ((int)side_.size() <= device) side_.resize(device + 1);
  Side& sd = side_[device];
  for (size_t i = sd.free.size(); i-- > 0;) {  // the most recently joined first
    if (sd.free[i].second != main) continue;
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    if (driver().StreamIsCapturing(sd.free[i].first, &st) == CUDA_SUCCESS && st == CU_STREAM_CAPTURE_STATUS_NONE) {
      CUstream s = sd.free[i].first;
      sd.free.erase(sd.free.begin() + (long)i);
      return s;
    }
  }
  int least = 0, greatest = 0;
  SMLA_CU(driver().CtxGetStreamPriorityRange(&least, &greatest));
  CUstream s = nullptr;
  SMLA_CU(driver().StreamCreateWithPriority(&s, CU_STREAM_NON_BLOCKING, greatest));
  return s;
}

size_t CudaBackend::pooled_side_streams(int device) {
  std::lock_guard<std::mutex> lock(side_mu_);
  return (int)side_.size() > device ? side_[device].free.size() : 0;
}

void CudaBackend::release_side_stream(int device, void* stream, void* main) {
  if (!stream) return;
  main = pool_key(main);
  std::lock_guard<std::mutex> lock(side_mu_);
  if ((int)side_.size() <= device) side_.resize(device + 1);
  Side& sd = side_[device];
  sd.free.emplace_back(static_cast<CUstream>(stream), main);
  if (sd.free.size() <= kMaxFreeSideStreams || !driver().ok) return;
  // Bounded (a framework that makes a stream per step would grow it for ever): the oldest not in an open capture goes.
  // cuStreamDestroy returns at once and its queued work still runs.
  ContextScope use(context(device));
  for (size_t i = 0; i < sd.free.size(); ++i) {
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    if (driver().StreamIsCapturing(sd.free[i].first, &st) == CUDA_SUCCESS && st == CU_STREAM_CAPTURE_STATUS_NONE) {
      driver().StreamDestroy(sd.free[i].first);
      sd.free.erase(sd.free.begin() + (long)i);
      return;
    }
  }
}

void CudaBackend::stream_wait(int device, void* waiter, void* on) {
  ContextScope use(context(device));
  std::lock_guard<std::mutex> lock(side_mu_);  // record + wait of the one event as a pair
  if ((int)side_.size() <= device) side_.resize(device + 1);
  Side& sd = side_[device];
  if (!sd.event) SMLA_CU(driver().EventCreate(&sd.event, CU_EVENT_DISABLE_TIMING));
  SMLA_CU(driver().EventRecord(sd.event, static_cast<CUstream>(on)));
  // The wait takes the record made just above; re-recording the event later does not change it.
  SMLA_CU(driver().StreamWaitEvent(static_cast<CUstream>(waiter), sd.event, 0));
}

// Asked after a failure only (a query of every run's stream would add a driver call to the hot path). The null stream,
// CU_STREAM_LEGACY and CU_STREAM_PER_THREAD stand for the current context's, which launch() makes the plan's: never
// foreign. A stream the driver cannot place (destroyed, garbage) is left to the driver's own error.
std::string CudaBackend::foreign_stream(int device, void* stream) const {
  const auto s = static_cast<CUstream>(stream);
  if (!driver().ok || !s || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) return {};
  CUcontext sctx = nullptr;
  if (driver().StreamGetCtx(s, &sctx) != CUDA_SUCCESS || !sctx) return {};
  try {
    if (sctx == context(device)) return {};
    CUdevice sdev = -1;
    {
      ContextScope use(sctx);
      SMLA_CU(driver().CtxGetDevice(&sdev));
    }
    if (sdev == device_handle(device))
      return "the stream belongs to a context of CUDA device " + std::to_string(device) +
             " other than its primary context, the one smla loads the plan's kernels in (the runtime API and "
             "PyTorch use it): pass a stream created in the primary context";
    for (int i = 0; i < device_count(); ++i)
      if (device_handle(i) == sdev) return another_devices_stream("CUDA", i, device);
    return {};  // a device the driver did not list: cannot tell
  } catch (const Error&) {
    return {};  // cannot tell: the caller reports the original error
  }
}

// The copy runs in the context of the device that holds `src` (the plan's workspace): the caller's
// thread may have another device's context current, or none.
void CudaBackend::read_back(void* dst, const void* src, size_t bytes, void* stream) const {
  const auto at = reinterpret_cast<CUdeviceptr>(src);
  int ordinal = -1;
  SMLA_CU(driver().PointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, at));
  ContextScope use(context(ordinal));
  SMLA_CU(driver().StreamSynchronize(static_cast<CUstream>(stream)));
  SMLA_CU(driver().MemcpyDtoH(dst, at, bytes));
}

}  // namespace smla::cuda
