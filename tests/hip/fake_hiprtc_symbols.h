// fake_hiprtc_symbols.h: the hipRTC entry points smla binds, as SMLA_FAKE(name) of the file that includes it (the
// stand-in HIP runtime, which holds hipRTC as ROCm 5's does, and the stand-in libhiprtc of ROCm 6). hiprtcGetErrorString
// is each file's own. SMLA_FAKE_HIPRTC_NO_CREATE leaves out hiprtcCreateProgram.
SMLA_FAKE(hiprtcVersion)
#ifndef SMLA_FAKE_HIPRTC_NO_CREATE
SMLA_FAKE(hiprtcCreateProgram)
#endif
SMLA_FAKE(hiprtcCompileProgram)
SMLA_FAKE(hiprtcGetProgramLogSize)
SMLA_FAKE(hiprtcGetProgramLog)
SMLA_FAKE(hiprtcGetCodeSize)
SMLA_FAKE(hiprtcGetCode)
SMLA_FAKE(hiprtcDestroyProgram)
