// portable.h: the few spellings that differ between CUDA (nvcc, NVRTC) and HIP (hipcc, hipRTC),
// so that one kernel body compiles for both. Plain preprocessor: no toolkit headers.
//
// SMLA_HIP is set by the compilers themselves (__HIPCC__ under hipcc and hipRTC, __HIPCC_RTC__
// under hipRTC), never by a host header, so a host C++ file that includes common.cuh for the
// layout functions never sees device code.
#ifndef SMLA_PORTABLE_H
#define SMLA_PORTABLE_H

#if defined(__HIPCC__) || defined(__HIPCC_RTC__)
#define SMLA_HIP 1
#endif

#if defined(__CUDACC__) || defined(SMLA_HIP)
#define SMLA_DEVICE_CODE 1
#define SMLA_HD __host__ __device__
#else
#define SMLA_HD
#endif

// A butterfly step inside a group of 32 lanes. The kernels' "warp" is 32 lanes on both sides:
// an AMD wavefront (64 lanes) then holds two of them, and width 32 keeps each reduction inside
// its own half (HIP has no *_sync shuffles before ROCm 6.2, and CDNA lanes run in lockstep).
#if defined(SMLA_HIP)
#define SMLA_SHFL_XOR(v, o) __shfl_xor((v), (o), 32)
#else
#define SMLA_SHFL_XOR(v, o) __shfl_xor_sync(0xffffffffu, (v), (o))
#endif

#endif  // SMLA_PORTABLE_H
