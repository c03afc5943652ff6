// gather.cu: dkv row j = sum of the interm rows of its contributors, in sorted (= slot) order,
// fp32; then the chunk carry through dkv_acc and the output (bf16 dkv, or fp32 dkv_f32).
//
// The benchmark top-k gives some pool rows thousands of contributors, so the time of the longest
// row (a chain of dependent load rounds) matters, not only the bytes. One block per kv row; each
// of its SMLA_D / 4 threads owns 4 columns (one 8-byte load per contributor), and UNROLL
// contributors are in flight per round while the next round's indices are already loading.
// Every output element is still summed by one thread in contributor order: bitwise deterministic.
#include "smla_params.h"
#include "common.cuh"

#ifndef UNROLL
#define UNROLL 16
#endif
#define GATHER_COLS 4
#define GATHER_THREADS (SMLA_D / GATHER_COLS)

extern "C" __global__ void __launch_bounds__(GATHER_THREADS) smla_gather(SmlaParams p) {
  const int j = blockIdx.x;
  if (j >= p.num_kv) return;
  const int* vals = p.csr_vals[p.csr_final];
  const int beg = p.row_ptr[j], end = p.row_ptr[j + 1];
  const int d = threadIdx.x * GATHER_COLS;
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
