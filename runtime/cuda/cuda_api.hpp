// cuda_api.hpp: the CUDA driver and NVRTC, opened with dlopen at first use.
//
// Nothing links against libcuda or libnvrtc, so the library loads on a machine with no driver
// (CI, build hosts) and can still compile offline when NVRTC is present.
#pragma once
#include <cuda.h>
#include <nvrtc.h>

#include <string>
#include <vector>

#include "../check.hpp"

namespace smla::cuda {

#define SMLA_STR_(x) #x
#define SMLA_STR(x) SMLA_STR_(x)

// X(member, symbol): the symbol goes through cuda.h's macros, so versioned entry points
// (cuMemAlloc -> cuMemAlloc_v2) resolve to what this header version means.
#define SMLA_CUDA_DRIVER_FUNCS(X)                                                          \
  X(Init, cuInit) X(DriverGetVersion, cuDriverGetVersion) X(DeviceGetCount, cuDeviceGetCount) \
  X(DeviceGet, cuDeviceGet) X(DeviceGetAttribute, cuDeviceGetAttribute)                    \
  X(DeviceGetName, cuDeviceGetName) X(DevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain)    \
  X(DevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease) X(CtxSetCurrent, cuCtxSetCurrent)  \
  X(CtxGetCurrent, cuCtxGetCurrent) X(CtxGetDevice, cuCtxGetDevice)                        \
  X(CtxSynchronize, cuCtxSynchronize) X(ModuleLoadData, cuModuleLoadData)                  \
  X(ModuleUnload, cuModuleUnload) X(ModuleGetFunction, cuModuleGetFunction)                \
  X(FuncSetAttribute, cuFuncSetAttribute) X(FuncGetAttribute, cuFuncGetAttribute)          \
  X(LaunchKernel, cuLaunchKernel) X(PointerGetAttribute, cuPointerGetAttribute)            \
  X(PointerGetAttributes, cuPointerGetAttributes)                                          \
  X(GetErrorString, cuGetErrorString) X(GetErrorName, cuGetErrorName)                      \
  X(MemAlloc, cuMemAlloc) X(MemFree, cuMemFree) X(MemcpyHtoD, cuMemcpyHtoD)                \
  X(MemcpyDtoH, cuMemcpyDtoH) X(MemcpyDtoHAsync, cuMemcpyDtoHAsync)                        \
  X(MemsetD8, cuMemsetD8) X(MemsetD32, cuMemsetD32) X(MemGetInfo, cuMemGetInfo)            \
  X(StreamCreate, cuStreamCreate) X(StreamDestroy, cuStreamDestroy)                        \
  X(StreamSynchronize, cuStreamSynchronize) X(EventCreate, cuEventCreate)                  \
  X(StreamCreateWithPriority, cuStreamCreateWithPriority) X(StreamWaitEvent, cuStreamWaitEvent) \
  X(StreamIsCapturing, cuStreamIsCapturing) X(StreamGetCtx, cuStreamGetCtx)                \
  X(CtxGetStreamPriorityRange, cuCtxGetStreamPriorityRange)                                \
  X(EventDestroy, cuEventDestroy) X(EventRecord, cuEventRecord)                            \
  X(EventSynchronize, cuEventSynchronize) X(EventElapsedTime, cuEventElapsedTime)          \
  X(StreamBeginCapture, cuStreamBeginCapture) X(StreamEndCapture, cuStreamEndCapture)      \
  X(GraphInstantiate, cuGraphInstantiateWithFlags) X(GraphLaunch, cuGraphLaunch)           \
  X(GraphExecDestroy, cuGraphExecDestroy) X(GraphDestroy, cuGraphDestroy)

#define SMLA_NVRTC_FUNCS(X)                                                                   \
  X(Version, nvrtcVersion) X(CreateProgram, nvrtcCreateProgram)                                \
  X(DestroyProgram, nvrtcDestroyProgram) X(CompileProgram, nvrtcCompileProgram)                \
  X(GetProgramLogSize, nvrtcGetProgramLogSize) X(GetProgramLog, nvrtcGetProgramLog)            \
  X(GetCUBINSize, nvrtcGetCUBINSize) X(GetCUBIN, nvrtcGetCUBIN) X(GetErrorString, nvrtcGetErrorString)

struct Driver {
#define SMLA_DECL(member, sym) decltype(&::sym) member = nullptr;
  SMLA_CUDA_DRIVER_FUNCS(SMLA_DECL)
#undef SMLA_DECL
  bool ok = false;
  std::string why;  ///< why the driver is not usable (library missing, cuInit failed, no device)
  std::string path;
};

struct Nvrtc {
#define SMLA_DECL(member, sym) decltype(&::sym) member = nullptr;
  SMLA_NVRTC_FUNCS(SMLA_DECL)
#undef SMLA_DECL
  bool ok = false;
  std::string why;
  std::string path;
};

/// Opened once per process (thread-safe); never throws: check `ok` / `why`. In a process forked from the one that
/// opened it, `ok` is false and `why` says so (the driver cannot be used after fork; the entry points stay set).
const Driver& driver();
/// The driver if driver() has been called in this process, else null, without opening it (the CPU backend's pointer
/// check must not initialise CUDA: a process that did cannot hand CUDA to the children it forks).
const Driver* driver_if_opened();
/// This process was forked from the one that initialised the driver (driver().why says so too).
bool forked_after_init();
const Nvrtc& nvrtc();
/// The files nvrtc() tries, in order: $SMLA_LIBNVRTC alone when set; else the sonames of CUDA 13 and 12 and the bare
/// name (the loader's search), then lib64/libnvrtc.so under $CUDA_HOME, $CUDA_PATH (each when set and not empty) and
/// /usr/local/cuda.
std::vector<std::string> nvrtc_candidates();

/// Throws smla::Error(DriverError) naming the call and the driver's error name and text.
void check(CUresult r, const char* call, const char* file, int line);

/// The CUDA include directory (headers for CUB): $SMLA_CUDA_INCLUDE, $CUDA_HOME/include,
/// $CUDA_PATH/include, /usr/local/cuda/include; empty when none has cuda.h.
std::string cuda_include_dir();

}  // namespace smla::cuda

#define SMLA_CU(call) ::smla::cuda::check((call), #call, __FILE__, __LINE__)

namespace smla::cuda {

/// Makes `ctx` current for the scope and puts the caller's context back at its end, also on a
/// throw: a framework thread (PyTorch) keeps the device it had current. One cuCtxGetCurrent when
/// `ctx` is current already (launches).
class ContextScope {
 public:
  explicit ContextScope(CUcontext ctx) {
    SMLA_CU(driver().CtxGetCurrent(&prev_));
    if (prev_ != ctx) {
      SMLA_CU(driver().CtxSetCurrent(ctx));
      switched_ = true;
    }
  }
  ~ContextScope() {
    if (switched_) driver().CtxSetCurrent(prev_);  // best effort: a destructor must not throw
  }
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;
  /// The context that was current before (put back at the end of the scope).
  CUcontext previous() const { return prev_; }

 private:
  CUcontext prev_ = nullptr;
  bool switched_ = false;
};

/// Whether an error of cuModuleLoadData / cuModuleGetFunction means the driver refused the
/// binary itself (built for another device or a newer toolkit, corrupt, no JIT): recompiling may
/// help. Out of memory, launch limits and the like do not count.
bool is_binary_refusal(const Error& e);

}  // namespace smla::cuda
