// gather.cu: dkv row j = sum of the interm rows of its contributors, in sorted (= slot) order,
// fp32; then the chunk carry through dkv_acc and the output (bf16 dkv, or fp32 dkv_f32).
// One warp per kv row; lane l owns columns 8l..8l+7 and 256+8l..: two 16-byte loads per
// contributor. UNROLL contributors are loaded ahead of their (in-order) additions.
#include "smla_params.h"
#include "common.cuh"

#ifndef NUM_WARPS
#define NUM_WARPS 8
#endif
#ifndef UNROLL
#define UNROLL 4
#endif

__device__ __forceinline__ void gather_add(float (&a)[16], const uint4& x0, const uint4& x1) {
  const unsigned w[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    a[2 * e] += smla_lo_f(w[e]);
    a[2 * e + 1] += smla_hi_f(w[e]);
  }
}

extern "C" __global__ void __launch_bounds__(NUM_WARPS * 32) smla_gather(SmlaParams p) {
  const int lane = threadIdx.x % 32;
  const int j = blockIdx.x * NUM_WARPS + threadIdx.x / 32;
  if (j >= p.num_kv) return;
  const int* vals = p.csr_vals[p.csr_final];
  const int beg = p.row_ptr[j], end = p.row_ptr[j + 1];
  const int c0 = lane * 8, c1 = SMLA_D / 2 + lane * 8;

  float a[16];
#pragma unroll
  for (int e = 0; e < 16; ++e) a[e] = 0.f;

  int i = beg;
  for (; i + UNROLL <= end; i += UNROLL) {
    uint4 x[UNROLL][2];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const smla_bf16* row = p.interm + (long long)vals[i + u] * SMLA_D;
      x[u][0] = *reinterpret_cast<const uint4*>(row + c0);
      x[u][1] = *reinterpret_cast<const uint4*>(row + c1);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) gather_add(a, x[u][0], x[u][1]);
  }
  for (; i < end; ++i) {
    const smla_bf16* row = p.interm + (long long)vals[i] * SMLA_D;
    gather_add(a, *reinterpret_cast<const uint4*>(row + c0), *reinterpret_cast<const uint4*>(row + c1));
  }

  const bool last = p.chunk == p.n_chunks - 1;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int d = half ? c1 : c0;
    float* v = a + 8 * half;
    if (p.n_chunks > 1) {
      float4* carry = reinterpret_cast<float4*>(p.dkv_acc + (long long)j * SMLA_D + d);
      if (p.chunk > 0) {
        const float4 c0v = carry[0], c1v = carry[1];
        v[0] = c0v.x + v[0]; v[1] = c0v.y + v[1]; v[2] = c0v.z + v[2]; v[3] = c0v.w + v[3];
        v[4] = c1v.x + v[4]; v[5] = c1v.y + v[5]; v[6] = c1v.z + v[6]; v[7] = c1v.w + v[7];
      }
      if (!last) {
        carry[0] = make_float4(v[0], v[1], v[2], v[3]);
        carry[1] = make_float4(v[4], v[5], v[6], v[7]);
        continue;
      }
    }
    if (p.dkv_f32 != nullptr) {
      float4* out = reinterpret_cast<float4*>(p.dkv_f32 + j * p.dkv_s + d);
      out[0] = make_float4(v[0], v[1], v[2], v[3]);
      out[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
      *reinterpret_cast<uint4*>(p.dkv + j * p.dkv_s + d) =
          make_uint4(smla_pack_bf2(v[0], v[1]), smla_pack_bf2(v[2], v[3]), smla_pack_bf2(v[4], v[5]),
                     smla_pack_bf2(v[6], v[7]));
    }
  }
}
