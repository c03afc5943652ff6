// dkv_interm.hip: the dkv_interm phase on AMD (MFMA): per chunk,
// interm[t, rr, :] = sum_h ds[t,rr,h] q[t,h,:] + pm[t,rr,h] dout[t,h,:], as dkv_interm.cu.
//
// Per token one product [r_chunk x 2H] x [2H x D], A = [ds | pm], B = [q ; dout]. A block owns
// one token and BLOCK_D columns; B's columns sit in LDS transposed ([BLOCK_D][2H+pad]) so that
// a fragment is one contiguous load. Rows go in tiles of BLOCK_R: wave w owns rows 16*MI*w..
// (MI fragments of 16) across all BLOCK_D columns and reads its A fragments straight from the
// workspace (each A element is used by one wave only).
// LDS: smla_amd_dkv_lds_bytes(HEADS, BLOCK_D) (amd_mfma.h); 33 KB for H = 128, BLOCK_D = 64.
#include "smla_params.h"
#include "common.cuh"
#include "amd_mfma.h"

// Heads as a constant: named HEADS, since "H" would rewrite SmlaParams::H.
#ifndef HEADS
#define HEADS 128
#endif
#ifndef BLOCK_D
#define BLOCK_D (HEADS <= 64 ? 128 : 64)
#endif
#ifndef BLOCK_R
#define BLOCK_R 128
#endif
#ifndef NUM_WAVES
#define NUM_WAVES 4
#endif

#define DK_THREADS (NUM_WAVES * AMD_WAVE)
#define DK_K (2 * HEADS)
#define DK_BROW (DK_K + SMLA_AMD_PAD)  // LDS row stride of B^T (elements)
#define DK_MI (BLOCK_R / (16 * NUM_WAVES))
#define DK_NI (BLOCK_D / 16)

static_assert(HEADS % 16 == 0, "HEADS must be a multiple of 16");
static_assert(DK_K % AMD_K == 0, "2 * HEADS must be a multiple of the MFMA K");
static_assert(BLOCK_R % (16 * NUM_WAVES) == 0, "BLOCK_R must be a multiple of 16 * NUM_WAVES");
static_assert(BLOCK_D % 16 == 0 && SMLA_D % BLOCK_D == 0, "BLOCK_D must be a multiple of 16 dividing D");
// The carve of smla_dkv_interm below: B^T, BLOCK_D rows of DK_BROW. Checked against the LDS the host launches with
// (SMLA_SMEM_BYTES, runtime/hip/kernels_hip.cpp; common.cuh).
SMLA_CHECK_SMEM(BLOCK_D * DK_BROW * 2);

extern "C" __global__ void __launch_bounds__(DK_THREADS) smla_dkv_interm(SmlaParams p) {
  extern __shared__ uint4 smem_u4[];
  smla_bf16* sBt = reinterpret_cast<smla_bf16*>(smem_u4);  // [BLOCK_D][2H + pad]

  const int t = blockIdx.x;
  const int d0 = blockIdx.y * BLOCK_D;
  const int lane = threadIdx.x % AMD_WAVE, wave = threadIdx.x / AMD_WAVE;
  const int c16 = lane % 16, kg = (lane / 16) * AMD_KPL;
  const int r_chunk = p.r_chunk;

  // B^T: 16-byte loads along d of each row of [q ; dout], scattered to columns of sBt.
  for (int i = threadIdx.x; i < DK_K * (BLOCK_D / 8); i += DK_THREADS) {
    const int k = i / (BLOCK_D / 8), c = i % (BLOCK_D / 8);
    const smla_bf16* src = k < HEADS ? p.q + t * p.q_st + k * p.q_sh : p.dout + t * p.do_st + (k - HEADS) * p.do_sh;
    const uint4 v = *reinterpret_cast<const uint4*>(src + d0 + c * 8);
    const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      sBt[(c * 8 + 2 * e) * DK_BROW + k] = (smla_bf16)(w[e] & 0xffffu);
      sBt[(c * 8 + 2 * e + 1) * DK_BROW + k] = (smla_bf16)(w[e] >> 16);
    }
  }
  __syncthreads();

  for (int row0 = wave * 16 * DK_MI; row0 < r_chunk; row0 += BLOCK_R) {
    // A fragment sources: row rr of [ds | pm] (zero past the chunk: never stored, kept finite).
    long long arow[DK_MI];
    bool in[DK_MI];
#pragma unroll
    for (int mi = 0; mi < DK_MI; ++mi) {
      const int rr = row0 + mi * 16 + c16;
      in[mi] = rr < r_chunk;
      arow[mi] = ((long long)t * r_chunk + (in[mi] ? rr : 0)) * HEADS;
    }

    amd_acc acc[DK_MI][DK_NI];
#pragma unroll
    for (int mi = 0; mi < DK_MI; ++mi)
#pragma unroll
      for (int n = 0; n < DK_NI; ++n) acc[mi][n] = amd_zero_acc();

#pragma unroll 4
    for (int ks = 0; ks < DK_K / AMD_K; ++ks) {
      const int k = ks * AMD_K + kg;  // a fragment never straddles ds | pm: HEADS % 16 == 0
      const smla_bf16* src = k < HEADS ? p.ds + k : p.pm + (k - HEADS);
      amd_frag a[DK_MI];
#pragma unroll
      for (int mi = 0; mi < DK_MI; ++mi) a[mi] = in[mi] ? amd_load_frag(src + arow[mi]) : amd_zero_frag();
#pragma unroll
      for (int n = 0; n < DK_NI; ++n) {
        const amd_frag b = amd_load_frag(sBt + (n * 16 + c16) * DK_BROW + k);
#pragma unroll
        for (int mi = 0; mi < DK_MI; ++mi) acc[mi][n] = amd_mfma(a[mi], b, acc[mi][n]);
      }
    }

    // bf16 out, rows past the chunk dropped.
#pragma unroll
    for (int mi = 0; mi < DK_MI; ++mi)
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        const int rr = row0 + mi * 16 + 4 * (lane / 16) + v;
        if (rr >= r_chunk) continue;
        smla_bf16* out = p.interm + ((long long)t * r_chunk + rr) * SMLA_D + d0 + c16;
#pragma unroll
        for (int n = 0; n < DK_NI; ++n) out[n * 16] = smla_f2bf(acc[mi][n][v]);
      }
  }
}
