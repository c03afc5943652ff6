// gather.cu: dkv row j = sum of the interm rows of its contributors, in sorted (= slot) order,
// fp32; then the chunk carry through dkv_acc and the output (bf16 dkv, or fp32 dkv_f32).
//
// The benchmark top-k gives some pool rows thousands of contributors (4096,128,4128,160: 32 rows of
// ~4090 against a mean of 156), so the time of the longest row (a chain of dependent load rounds)
// matters, not only the bytes. One block per kv row of GATHER_GROUPS groups of SMLA_D / 4 threads
// (the host picks 1 or 4 from the top-k; a compile-time count: a run-time one, tried, made both paths
// slower, seed 0.481 -> 0.549 ms with one group and 0.291 -> 0.352 with four; with four groups the blocks take the
// rows from the last, so that the hot pool rows start first);
// group g sums the g-th contiguous segment of the row's contributors, each thread 4 columns (one
// 8-byte load per contributor), UNROLL contributors in flight per round while the next round's
// indices load; then group 0 adds the other groups' sums in group order. Every output element is
// summed in a fixed order (contributor order within a segment, segments in order): deterministic.
#include "smla_params.h"
#include "common.cuh"

#ifndef UNROLL
#define UNROLL 16
#endif
#ifndef GATHER_GROUPS
#define GATHER_GROUPS 1
#endif
#define GATHER_COLS 4
#define GATHER_GROUP_THREADS (SMLA_D / GATHER_COLS)
#define GATHER_THREADS (GATHER_GROUPS * GATHER_GROUP_THREADS)
static_assert(GATHER_GROUPS >= 1 && GATHER_GROUPS <= 8, "GATHER_GROUPS must be in 1..8");

extern "C" __global__ void __launch_bounds__(GATHER_THREADS) smla_gather(SmlaParams p) {
#if GATHER_GROUPS > 1
  // The rows from the last: the top-k's pool rows (after the T window rows) are the hot ones, and started first
  // their long chains run beside the many short rows instead of after them. Measured (perf notes v13, TOPK 160):
  // gather 0.291 -> 0.229 ms; with one group (the seed, T 8192) the reversal measured even or slower, so only here.
  const int j = p.num_kv - 1 - (int)blockIdx.x;
  if (j < 0) return;
#else
  const int j = blockIdx.x;
  if (j >= p.num_kv) return;
#endif
  const int* vals = p.csr_vals[p.csr_final];
#if GATHER_GROUPS > 1
  const int row_beg = p.row_ptr[j], row_end = p.row_ptr[j + 1];
  const int g = threadIdx.x / GATHER_GROUP_THREADS, tg = threadIdx.x % GATHER_GROUP_THREADS;
  const int seg = (row_end - row_beg + GATHER_GROUPS - 1) / GATHER_GROUPS;
  const int beg = min(row_end, row_beg + g * seg), end = min(row_end, beg + seg);
#else  // the one-group code as measured before the split (0.481 ms at the seed): nvcc gives it the same
       // instructions as then, up to register choice (the split form above cost the one-group case 68 registers)
  const int beg = p.row_ptr[j], end = p.row_ptr[j + 1];
  const int tg = threadIdx.x;
#endif
  const int d = tg * GATHER_COLS;
  const smla_bf16* base = p.interm + d;

  float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
  int idx[UNROLL];
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) idx[u] = beg + u < end ? __ldg(vals + beg + u) : 0;

  for (int i = beg; i < end; i += UNROLL) {
    uint2 x[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      if (i + u < end) x[u] = __ldg(reinterpret_cast<const uint2*>(base + (long long)idx[u] * SMLA_D));
    // the next round's rows, while this round's loads are in flight
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) idx[u] = i + UNROLL + u < end ? __ldg(vals + i + UNROLL + u) : 0;
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      if (i + u < end) {  // in contributor order
        a0 += smla_lo_f(x[u].x);
        a1 += smla_hi_f(x[u].x);
        a2 += smla_lo_f(x[u].y);
        a3 += smla_hi_f(x[u].y);
      }
  }
#if GATHER_GROUPS > 1
  // The segments' sums, in group order, into group 0.
  __shared__ float4 part[GATHER_GROUPS - 1][GATHER_GROUP_THREADS];
  if (g > 0) part[g - 1][tg] = make_float4(a0, a1, a2, a3);
  __syncthreads();
  if (g > 0) return;
#pragma unroll
  for (int k = 0; k < GATHER_GROUPS - 1; ++k) {
    const float4 q = part[k][tg];
    a0 += q.x;
    a1 += q.y;
    a2 += q.z;
    a3 += q.w;
  }
#endif

  if (p.n_chunks > 1) {
    float4* carry = reinterpret_cast<float4*>(p.dkv_acc + (long long)j * SMLA_D + d);
    if (p.chunk > 0) {
      const float4 c = *carry;
      a0 = c.x + a0;
      a1 = c.y + a1;
      a2 = c.z + a2;
      a3 = c.w + a3;
    }
    if (p.chunk != p.n_chunks - 1) {
      *carry = make_float4(a0, a1, a2, a3);
      return;
    }
  }
  if (p.dkv_f32 != nullptr)
    *reinterpret_cast<float4*>(p.dkv_f32 + j * p.dkv_s + d) = make_float4(a0, a1, a2, a3);
  else
    *reinterpret_cast<uint2*>(p.dkv + j * p.dkv_s + d) = make_uint2(smla_pack_bf2(a0, a1), smla_pack_bf2(a2, a3));
}
