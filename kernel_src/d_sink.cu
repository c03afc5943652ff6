// d_sink.cu: d_sink[h] = -sum_t exp(sink[h] - lse_n[t,h]) * delta[t,h]. One block per head; the
// sum is in double, per thread over a fixed stride of t, then a fixed-shape tree: bitwise stable.
#include "smla_params.h"
#include "common.cuh"

#ifndef NUM_THREADS
#define NUM_THREADS 256
#endif
static_assert(NUM_THREADS % 32 == 0 && NUM_THREADS <= 1024, "NUM_THREADS: whole warps, at most 1024");

extern "C" __global__ void __launch_bounds__(NUM_THREADS) smla_d_sink(SmlaParams p) {
  __shared__ double warp_sums[NUM_THREADS / 32];
  const int h = blockIdx.x;
  const float sk = p.sink[h];
  double acc = 0.0;
  // A sink of -inf has probability 0 in every row: no terms (a token with no valid slot has lse -inf too, and
  // exp(-inf - -inf) would be NaN).
  const bool no_sink = sk == -__int_as_float(0x7f800000);
  // A sink of +inf takes every row whole: probability 1 (lse_n is +inf too, and exp(inf - inf) would be NaN).
  const bool whole = sk == __int_as_float(0x7f800000);
  for (int t = no_sink ? p.T : threadIdx.x; t < p.T; t += NUM_THREADS) {
    const long long i = (long long)t * p.H + h;
    // The sink's probability is at most 1: lse_n holds the sink. An lse rounded to fp32 (a base-2 one, times ln 2)
    // can land below a huge sink, and exp of the difference overflowed to +inf, times a delta of 0: NaN. A NaN stays.
    float x = sk - p.lse_n[i];
    if (x > 0.f) x = 0.f;
    acc += (whole ? 1.0 : (double)expf(x)) * (double)p.delta[i];
  }
  acc = smla_warp_sum_d(acc);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int w = 0; w < NUM_THREADS / 32; ++w) total += warp_sums[w];
    p.d_sink[h] = (float)(0.0 - total);  // +0, not -0, where there is no term (the CPU backend's bits)
  }
}
