// fake_hiprtc.cpp: a stand-in libhiprtc.so.6 (ROCm 6 moved hipRTC out of libamdhip64), for the test of which library
// smla binds hipRTC from. Nothing here is meant to be called: every function fails. Built with
// SMLA_FAKE_HIPRTC_NO_CREATE it lacks hiprtcCreateProgram, as a library that is not hipRTC would.
#define SMLA_FAKE(name) \
  extern "C" __attribute__((visibility("default"))) int name() { return 1; }

#include "fake_hiprtc_symbols.h"
SMLA_FAKE(hiprtcGetErrorString)
