// fake_amdhip64.cpp: a stand-in libamdhip64.so.6 (SONAME libamdhip64.so.6, as PyTorch-ROCm bundles
// one) that exports every entry point smla binds, for the tests of which HIP runtime smla opens.
// Nothing here is meant to be called: every function fails (hipErrorNoDevice), except the version.
#include <cstddef>
#include <cstdlib>

#define SMLA_FAKE(name) \
  extern "C" __attribute__((visibility("default"))) int name() { return 100; }

SMLA_FAKE(hipInit)
SMLA_FAKE(hipDriverGetVersion)
SMLA_FAKE(hipGetLastError)
SMLA_FAKE(hipGetDeviceCount)
SMLA_FAKE(hipDeviceGet)
SMLA_FAKE(hipGetDevice)
SMLA_FAKE(hipSetDevice)
SMLA_FAKE(hipDeviceGetAttribute)
SMLA_FAKE(hipGetDeviceProperties)
SMLA_FAKE(hipModuleLoadData)
SMLA_FAKE(hipModuleUnload)
SMLA_FAKE(hipModuleGetFunction)
SMLA_FAKE(hipModuleLaunchKernel)
SMLA_FAKE(hipFuncSetAttribute)
SMLA_FAKE(hipPointerGetAttributes)
SMLA_FAKE(hipStreamSynchronize)
SMLA_FAKE(hipDeviceSynchronize)
SMLA_FAKE(hipMalloc)
SMLA_FAKE(hipFree)
SMLA_FAKE(hipMemcpy)
SMLA_FAKE(hipMemcpyHtoD)
SMLA_FAKE(hipMemcpyDtoH)
#include "fake_hiprtc_symbols.h"

extern "C" __attribute__((visibility("default"))) int hipRuntimeGetVersion(int* v) {
  // The real one initializes every GPU: a test that must not reach it sets this and expects no exit 7.
  if (std::getenv("SMLA_FAKE_HIP_VERSION_EXITS")) std::_Exit(7);
  *v = 60399999;  // "6.3.99999"
  return 0;
}
extern "C" __attribute__((visibility("default"))) const char* hipGetErrorName(int) { return "fakeHipError"; }
extern "C" __attribute__((visibility("default"))) const char* hipGetErrorString(int) { return "fake HIP runtime"; }
extern "C" __attribute__((visibility("default"))) const char* hiprtcGetErrorString(int) { return "fake hipRTC"; }
