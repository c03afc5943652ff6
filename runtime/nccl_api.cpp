// nccl_api.cpp: dlopen of libnccl.so.2 and one communicator per rank.
#include "nccl_api.hpp"

#include <dlfcn.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

#include "check.hpp"
#include "cuda/cuda_api.hpp"
#include "log.hpp"

namespace smla::nccl {

static_assert(sizeof(UniqueId) == sizeof(ncclUniqueId), "UniqueId must hold an ncclUniqueId");

struct Api {
  decltype(&::ncclGetVersion) GetVersion = nullptr;
  decltype(&::ncclGetUniqueId) GetUniqueId = nullptr;
  decltype(&::ncclCommInitRank) CommInitRank = nullptr;
  decltype(&::ncclAllReduce) AllReduce = nullptr;
  decltype(&::ncclCommDestroy) CommDestroy = nullptr;
  decltype(&::ncclCommAbort) CommAbort = nullptr;  // optional (NCCL >= 2.4): without it abort() only forgets the comm
  decltype(&::ncclGetErrorString) GetErrorString = nullptr;
  decltype(&::ncclGetLastError) GetLastError = nullptr;  // optional: older NCCLs lack it
  bool ok = false;
  std::string why;
  std::string path;
  int version = 0;
};

std::string version_text(int v) {
  if (v <= 0) return "of an unknown version";
  const bool wide = v >= 20900;
  return std::to_string(wide ? v / 10000 : v / 1000) + "." + std::to_string(wide ? (v / 100) % 100 : (v / 100) % 10) +
         "." + std::to_string(v % 100);
}

namespace {

constexpr const char* kSoname = "libnccl.so.2";

std::shared_ptr<Api> load(const std::string& path) {
  auto a = std::make_shared<Api>();
  a->path = path;
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    a->why = std::string("NCCL (") + kSoname + ") could not be opened from '" + path + "': " + (e ? e : "?") +
             " (install NCCL, add its lib directory to LD_LIBRARY_PATH, or set SMLA_LIBNCCL to the file)";
    return a;
  }
  auto sym = [&](auto& member, const char* name, bool required) {
    member = reinterpret_cast<std::remove_reference_t<decltype(member)>>(dlsym(h, name));
    if (!member && required && a->why.empty())
      a->why = std::string("NCCL (") + kSoname + ") at '" + path + "' has no symbol " + name;
  };
  sym(a->GetVersion, "ncclGetVersion", true);
  sym(a->GetUniqueId, "ncclGetUniqueId", true);
  sym(a->CommInitRank, "ncclCommInitRank", true);
  sym(a->AllReduce, "ncclAllReduce", true);
  sym(a->CommDestroy, "ncclCommDestroy", true);
  sym(a->CommAbort, "ncclCommAbort", false);
  sym(a->GetErrorString, "ncclGetErrorString", true);
  sym(a->GetLastError, "ncclGetLastError", false);
  if (!a->why.empty()) return a;
  if (a->GetVersion(&a->version) != ncclSuccess) a->version = 0;
  a->ok = true;
  log().debug("NCCL {} opened from '{}'", version_text(a->version), path);
  return a;
}

void check(const Api& a, ncclResult_t r, ncclComm_t comm, const char* call, int line) {
  if (r == ncclSuccess) return;
  std::string msg = std::string("NCCL error ") + std::to_string(int(r)) + ": " + a.GetErrorString(r);
  msg += " (NCCL " + version_text(a.version) + " from '" + a.path + "')";  // which library said it
  if (a.GetLastError) {
    const char* last = a.GetLastError(comm);
    if (last && *last) msg += std::string(" (") + last + ")";
  }
  msg += "; run with NCCL_DEBUG=WARN for NCCL's own account";
  throw Error(Status::DriverError, msg, __FILE__, line, call);
}

void require(const Api& a) {
  if (!a.ok) SMLA_THROW(Status::NoBackend, a.why);
}

}  // namespace

#define SMLA_NCCL(api, comm, call) check((api), (call), (comm), #call, __LINE__)

std::shared_ptr<const Api> library() {
  static std::shared_ptr<const Api> lib;
  static std::once_flag once;
  std::call_once(once, [] {
    const char* env = std::getenv("SMLA_LIBNCCL");
    lib = load(env && *env ? std::string(env) : std::string(kSoname));
  });
  return lib;
}

std::shared_ptr<const Api> open_library(const std::string& path) { return load(path); }

bool available(const Api& api, std::string* why) {
  if (!api.ok && why) *why = api.why;
  return api.ok;
}

void disable_nvlink_multicast() {
  static std::mutex mu;  // setenv is not thread-safe against itself
  std::lock_guard<std::mutex> lock(mu);
  const char* v = std::getenv("NCCL_NVLS_ENABLE");
  if (v && std::strcmp(v, "0") == 0) return;
  if (v) log().warn("NCCL_NVLS_ENABLE={} overridden to 0: NVLink multicast stays off on shared hosts", v);
  setenv("NCCL_NVLS_ENABLE", "0", 1);
}

UniqueId unique_id(const Api& api) {
  require(api);
  disable_nvlink_multicast();
  ncclUniqueId id;
  SMLA_NCCL(api, nullptr, api.GetUniqueId(&id));
  UniqueId out;
  std::memcpy(out.bytes, &id, sizeof(id));
  return out;
}

Communicator::Communicator(std::shared_ptr<const Api> api, const UniqueId& id, int rank, int nranks, int device)
    : api_(std::move(api)), rank_(rank), nranks_(nranks), device_(device) {
  require(*api_);
  SMLA_REQUIRE(nranks >= 1 && rank >= 0 && rank < nranks, Status::InvalidArgument,
               "NCCL rank " + std::to_string(rank) + " is not in [0, " + std::to_string(nranks) + ")");
  const auto& d = cuda::driver();
  if (!d.ok) SMLA_THROW(Status::NoBackend, "NCCL needs a CUDA device, and the CUDA driver is not usable: " + d.why);
  int count = 0;
  SMLA_CU(d.DeviceGetCount(&count));
  SMLA_REQUIRE(device >= 0 && device < count, Status::InvalidArgument,
               "device " + std::to_string(device) + " does not exist (" + std::to_string(count) + " CUDA devices)");
  disable_nvlink_multicast();  // before the communicator exists: NCCL reads it at init
  // ncclCommInitRank binds to the calling thread's current device: make `device`'s primary
  // context current (the CUDA runtime inside NCCL follows the driver's current context), for the call only: the
  // caller's thread keeps the context it had.
  CUdevice dev;
  CUcontext ctx = nullptr;
  SMLA_CU(d.DeviceGet(&dev, device));
  SMLA_CU(d.DevicePrimaryCtxRetain(&ctx, dev));
  retained_ctx_ = true;
  ctx_ = ctx;
  try {
    cuda::ContextScope use(ctx);
    ncclUniqueId nid;
    std::memcpy(&nid, id.bytes, sizeof(nid));
    ncclComm_t comm = nullptr;
    SMLA_NCCL(*api_, nullptr, api_->CommInitRank(&comm, nranks, nid, rank));
    comm_ = comm;
  } catch (...) {
    d.DevicePrimaryCtxRelease(dev);
    retained_ctx_ = false;
    throw;
  }
}

Communicator::~Communicator() {
  if (comm_) {  // best effort: no throw here
    try {
      // Under the communicator's context, as every other call: NCCL's group end sets its device back, and on a thread
      // with no current context that made device 0's primary context current (created where it was not).
      cuda::ContextScope use(static_cast<CUcontext>(ctx_));
      api_->CommDestroy(static_cast<ncclComm_t>(comm_));
    } catch (...) {
    }
  }
  CUdevice dev;
  if (retained_ctx_ && cuda::driver().DeviceGet(&dev, device_) == CUDA_SUCCESS)
    cuda::driver().DevicePrimaryCtxRelease(dev);
}

void Communicator::abort() {
  void* comm = comm_;
  comm_ = nullptr;
  aborted_ = true;
  if (!comm || !api_->CommAbort) return;  // (an NCCL without ncclCommAbort: the comm is left, never destroyed)
  try {
    cuda::ContextScope use(static_cast<CUcontext>(ctx_));
    api_->CommAbort(static_cast<ncclComm_t>(comm));
  } catch (...) {
  }
}

void Communicator::all_reduce_sum(float* device_buf, size_t count, void* stream) {
  SMLA_REQUIRE(!aborted_, Status::InvalidArgument,
               "NCCL communicator of rank " + std::to_string(rank_) + " was aborted (a failed backward): make a new one");
  auto comm = static_cast<ncclComm_t>(comm_);
  cuda::ContextScope use(static_cast<CUcontext>(ctx_));  // the communicator's device, the caller's context kept
  // CUstream and cudaStream_t are the same handle type (CUstream_st*).
  SMLA_NCCL(*api_, comm,
            api_->AllReduce(device_buf, device_buf, count, ncclFloat32, ncclSum, comm, static_cast<cudaStream_t>(stream)));
}

}  // namespace smla::nccl
