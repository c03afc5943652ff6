// delta.cu: delta = rowsum(O * dO) per (t, h), and lse_n = the caller's lse as natural-log,
// sink-inclusive. One warp per (t, h) row: each lane reads two 16-byte pieces of o and dout.
#include "smla_params.h"
#include "common.cuh"

#ifndef NUM_WARPS
#define NUM_WARPS 8
#endif

extern "C" __global__ void __launch_bounds__(NUM_WARPS * 32) smla_delta(SmlaParams p) {
  const int lane = threadIdx.x % 32;
  const long long row = (long long)blockIdx.x * NUM_WARPS + threadIdx.x / 32;
  if (row >= (long long)p.T * p.H) return;
  const int t = (int)(row / p.H), h = (int)(row % p.H);
  const smla_bf16* o = p.o + t * p.o_st + h * p.o_sh;
  const smla_bf16* g = p.dout + t * p.do_st + h * p.do_sh;

  float sum = 0.f;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int d = half * (SMLA_D / 2) + lane * 8;
    const uint4 ov = *reinterpret_cast<const uint4*>(o + d);
    const uint4 gv = *reinterpret_cast<const uint4*>(g + d);
    const unsigned ow[4] = {ov.x, ov.y, ov.z, ov.w}, gw[4] = {gv.x, gv.y, gv.z, gv.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      sum = fmaf(smla_lo_f(ow[e]), smla_lo_f(gw[e]), sum);
      sum = fmaf(smla_hi_f(ow[e]), smla_hi_f(gw[e]), sum);
    }
  }
  sum = smla_warp_sum(sum);
  if (lane != 0) return;

  p.delta[row] = sum;
  p.lse_n[row] = smla_lse_natural(p.lse[t * p.lse_st + h * p.lse_sh], p.lse_mode, p.sink, h);
}
