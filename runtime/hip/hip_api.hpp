// hip_api.hpp: the HIP runtime and hipRTC, opened with dlopen at first use.
//
// Nothing links to libamdhip64: the library loads on a machine with no ROCm, and the HIP
// backend reports itself unusable there. The few ABI types and enum values needed are declared
// here (checked against ROCm's own headers by tests/hip/hip_abi_test.cpp where they exist), so
// the runtime builds without ROCm headers too.
#pragma once
#include <cstddef>
#include <string>

#include "smla/smla.hpp"

namespace smla::hip {

// ---- ABI (stable across ROCm 5.x..7.x for what is used here)
using hipError_t = int;      // 0 = hipSuccess
using hiprtcResult = int;    // 0 = HIPRTC_SUCCESS
using hipDevice_t = int;
struct ihipModule_t;
struct ihipModuleSymbol_t;
struct ihipStream_t;
struct hiprtcProgramOpaque;
using hipModule_t = ihipModule_t*;
using hipFunction_t = ihipModuleSymbol_t*;
using hipStream_t = ihipStream_t*;
using hiprtcProgram = hiprtcProgramOpaque*;

constexpr hipError_t kHipSuccess = 0;
constexpr hipError_t kHipErrorInvalidValue = 1;
constexpr hipError_t kHipErrorNoDevice = 100;
constexpr hiprtcResult kHiprtcSuccess = 0;
constexpr hiprtcResult kHiprtcErrorCompilation = 6;

// hipDeviceAttribute_t values (the CUDA-compatible block, unchanged since ROCm 5.0).
constexpr int kAttrMaxSharedMemoryPerBlock = 74;
constexpr int kAttrMultiprocessorCount = 63;
// hipFuncAttribute value.
constexpr int kFuncAttrMaxDynamicSharedMemorySize = 8;

/// Leading fields of hipPointerAttribute_t (same prefix in ROCm 5 and 6; the enum differs).
struct PointerAttributes {
  int memory_type;
  int device;
  void* device_pointer;
  void* host_pointer;
  int is_managed;
  unsigned allocation_flags;
  char reserved[64];  // room for fields later releases append
};

/// The entry points used by smla. Function pointers are never null once Api::get() succeeds,
/// except the ones marked optional.
struct Api {
  // runtime
  hipError_t (*hipInit)(unsigned flags);
  hipError_t (*hipRuntimeGetVersion)(int* version);
  hipError_t (*hipDriverGetVersion)(int* version);
  const char* (*hipGetErrorName)(hipError_t);
  const char* (*hipGetErrorString)(hipError_t);
  hipError_t (*hipGetLastError)();
  hipError_t (*hipGetDeviceCount)(int* count);
  hipError_t (*hipDeviceGet)(hipDevice_t* device, int ordinal);
  hipError_t (*hipGetDevice)(int* device);
  hipError_t (*hipSetDevice)(int device);
  hipError_t (*hipDeviceGetAttribute)(int* value, int attr, int device);
  // Raw hipDeviceProp_t: its layout changed in ROCm 6 (R0600); see device_arch_name().
  hipError_t (*hipGetDeviceProperties)(void* prop, int device);
  hipError_t (*hipGetDevicePropertiesR0600)(void* prop, int device);  // optional (ROCm >= 6)
  hipError_t (*hipModuleLoadData)(hipModule_t* module, const void* image);
  hipError_t (*hipModuleUnload)(hipModule_t module);
  hipError_t (*hipModuleGetFunction)(hipFunction_t* fn, hipModule_t module, const char* name);
  hipError_t (*hipModuleLaunchKernel)(hipFunction_t fn, unsigned gx, unsigned gy, unsigned gz,
                                      unsigned bx, unsigned by, unsigned bz, unsigned shared_bytes,
                                      hipStream_t stream, void** kernel_params, void** extra);
  hipError_t (*hipFuncSetAttribute)(const void* fn, int attr, int value);
  hipError_t (*hipPointerGetAttributes)(PointerAttributes* attrs, const void* ptr);
  hipError_t (*hipStreamSynchronize)(hipStream_t stream);
  hipError_t (*hipDeviceSynchronize)();
  hipError_t (*hipStreamGetDevice)(hipStream_t stream, hipDevice_t* device);  // optional (not in ROCm 5.2)
  hipError_t (*hipMalloc)(void** ptr, size_t bytes);
  hipError_t (*hipFree)(void* ptr);
  hipError_t (*hipMemcpy)(void* dst, const void* src, size_t bytes, int kind);
  hipError_t (*hipMemcpyHtoD)(void* dst, const void* src, size_t bytes);
  hipError_t (*hipMemcpyDtoH)(void* dst, const void* src, size_t bytes);
  // hipRTC (inside libamdhip64 up to ROCm 5.x, libhiprtc from 6.0)
  hiprtcResult (*hiprtcVersion)(int* major, int* minor);  // hard-coded: never a cache identity
  const char* (*hiprtcGetErrorString)(hiprtcResult);
  hiprtcResult (*hiprtcCreateProgram)(hiprtcProgram* prog, const char* src, const char* name,
                                      int num_headers, const char* const* headers,
                                      const char* const* include_names);
  hiprtcResult (*hiprtcCompileProgram)(hiprtcProgram prog, int num_options, const char* const* options);
  hiprtcResult (*hiprtcGetProgramLogSize)(hiprtcProgram prog, size_t* size);
  hiprtcResult (*hiprtcGetProgramLog)(hiprtcProgram prog, char* log);
  hiprtcResult (*hiprtcGetCodeSize)(hiprtcProgram prog, size_t* size);
  hiprtcResult (*hiprtcGetCode)(hiprtcProgram prog, char* code);
  hiprtcResult (*hiprtcDestroyProgram)(hiprtcProgram* prog);
  // comgr, hipRTC's compiler layer (optional: only for the compiler identity)
  int (*amd_comgr_get_version)(size_t* major, size_t* minor);

  std::string hip_library;     // path of the opened libamdhip64
  std::string hiprtc_library;  // path of the library the hiprtc* symbols came from
  std::string comgr_library;   // empty when comgr could not be found

  /// Opens the libraries once per process. Null when they are missing; `why` then says what
  /// was tried. Thread-safe.
  static const Api* get(std::string* why = nullptr);
  /// Like get(), but throws smla::Error(NoBackend) naming the missing library.
  static const Api& require();
};

/// "hipErrorNoDevice (no ROCm-capable device is detected)" for messages.
std::string hip_error_text(const Api& api, hipError_t e);
std::string hiprtc_error_text(const Api& api, hiprtcResult r);

/// HIP_VERSION of the loaded runtime (major*1e7 + minor*1e5 + patch), from hipRuntimeGetVersion.
int hip_runtime_version(const Api& api);

/// "5.2.21153" from a HIP_VERSION number.
std::string hip_version_string(int version);
/// The major version in a HIP runtime's file name, after symbolic links (libamdhip64.so.7.0.70000: 7); 0 where the
/// name has none. Calls nothing of the runtime (hipRuntimeGetVersion initializes every GPU).
int hip_major_of_library(const std::string& path);

/// The device's full target id (gcnArchName, "gfx942:sramecc+:xnack-").
std::string device_arch_name(const Api& api, int device);

/// Finds gcnArchName in a raw hipDeviceProp_t of any layout: the NUL-terminated "gfx..." string,
/// preferring one with target features. Exposed for tests.
std::string find_arch_name(const char* prop, size_t size);

}  // namespace smla::hip

/// Checks a HIP runtime call made through smla::hip::Api; throws Status::DriverError naming it.
#define SMLA_HIP_CHECK(api, call)                                                                 \
  do {                                                                                            \
    ::smla::hip::hipError_t smla_hip_rc_ = (api).call;                                            \
    if (smla_hip_rc_ != ::smla::hip::kHipSuccess)                                                 \
      throw ::smla::Error(::smla::Status::DriverError,                                            \
                          std::string(#call) + " failed: " +                                      \
                              ::smla::hip::hip_error_text((api), smla_hip_rc_),                   \
                          __FILE__, __LINE__, #call);                                             \
  } while (0)

/// Checks a hipRTC call; throws Status::CompileError naming it (the compile step itself is
/// checked by HipRtcCompiler, which adds the log).
#define SMLA_HIPRTC_CHECK(api, call)                                                              \
  do {                                                                                            \
    ::smla::hip::hiprtcResult smla_rtc_rc_ = (api).call;                                          \
    if (smla_rtc_rc_ != ::smla::hip::kHiprtcSuccess)                                              \
      throw ::smla::Error(::smla::Status::CompileError,                                           \
                          std::string(#call) + " failed: " +                                      \
                              ::smla::hip::hiprtc_error_text((api), smla_rtc_rc_),                \
                          __FILE__, __LINE__, #call);                                             \
  } while (0)
