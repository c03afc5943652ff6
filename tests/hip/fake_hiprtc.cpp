// fake_hiprtc.cpp: a stand-in libhiprtc.so.6 (ROCm 6 moved hipRTC out of libamdhip64), for the test of which library
// smla binds hipRTC from. Nothing here is meant to be called: every function fails. Built with
// SMLA_FAKE_HIPRTC_NO_CREATE it lacks hiprtcCreateProgram, as a library that is not hipRTC would.
#define SMLA_FAKE(name) \
  extern "C" __attribute__((visibility("default"))) int name() { return 1; }

SMLA_FAKE(hiprtcVersion)
#ifndef SMLA_FAKE_HIPRTC_NO_CREATE
SMLA_FAKE(hiprtcCreateProgram)
#endif
SMLA_FAKE(hiprtcGetErrorString)
SMLA_FAKE(hiprtcCompileProgram)
SMLA_FAKE(hiprtcGetProgramLogSize)
SMLA_FAKE(hiprtcGetProgramLog)
SMLA_FAKE(hiprtcGetCodeSize)
SMLA_FAKE(hiprtcGetCode)
SMLA_FAKE(hiprtcDestroyProgram)
