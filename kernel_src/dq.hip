// dq.hip: the dq phase on AMD (MFMA): per chunk, recompute S and dP, emit P and scale*dS (bf16),
// accumulate dQ. Same meaning, masking, carries and rounding points as dq.cu.
//
// A block owns one token t and BLOCK_H heads; the chunk's kv rows go through one LDS tile of
// BLOCK_R rows. Wavefronts form an MT x WN grid (MT = BLOCK_H / 16, WN = BLOCK_R / 16):
//   S, dP : wave (wm, wn) computes heads 16*wm.. x kv rows 16*wn.. of the tile (K = D), with
//           its Q and dO fragments held in registers for the whole chunk;
//   dQ    : wave (wm, wn) owns heads 16*wm.. x columns DW*wn.. (DW = D / WN) in registers,
//           += dS(16 x BLOCK_R, through LDS) * kv tile.
// LDS: smla_amd_dq_lds_bytes(BLOCK_H, BLOCK_R) (amd_mfma.h); 38 KB for the default 32 x 32.
#include "smla_params.h"
#include "common.cuh"
#include "amd_mfma.h"

// Heads as a constant: named HEADS, since "H" would rewrite SmlaParams::H.
#ifndef HEADS
#define HEADS 128
#endif
#ifndef BLOCK_H
#define BLOCK_H (HEADS % 32 == 0 ? 32 : 16)
#endif
#ifndef BLOCK_R
#define BLOCK_R 32
#endif

#define DQ_MT (BLOCK_H / 16)
#define DQ_WN (BLOCK_R / 16)
#define DQ_WAVES (DQ_MT * DQ_WN)
#define DQ_THREADS (DQ_WAVES * AMD_WAVE)
#define DQ_DW (SMLA_D / DQ_WN)           // dQ columns per wave
#define DQ_ROW (SMLA_D + SMLA_AMD_PAD)   // LDS row stride of the kv tile (elements)
#define DQ_SROW (BLOCK_R + SMLA_AMD_PAD) // LDS row stride of the dS tile
#define DQ_KV_PER_THREAD (BLOCK_R * (SMLA_D / 8) / DQ_THREADS)  // 16-byte pieces

static_assert(BLOCK_H % 16 == 0 && HEADS % BLOCK_H == 0, "BLOCK_H must be a multiple of 16 dividing HEADS");
static_assert(BLOCK_R % 16 == 0 && BLOCK_R % AMD_K == 0, "BLOCK_R must be a multiple of 16 and of the MFMA K");
static_assert(DQ_THREADS <= 1024, "at most 16 wavefronts per block");
static_assert(BLOCK_R * (SMLA_D / 8) % DQ_THREADS == 0, "kv tile pieces must split evenly over the threads");
// The carve of smla_dq below: the kv tile (rows of DQ_ROW), dS (rows of DQ_SROW), a flag per kv row. Checked
// against the LDS the host launches with (SMLA_SMEM_BYTES, runtime/hip/kernels_hip.cpp; common.cuh).
SMLA_CHECK_SMEM(BLOCK_R * DQ_ROW * 2 + BLOCK_H * DQ_SROW * 2 + BLOCK_R * 4);

#define DQ_LOG2E 1.4426950408889634f

// Kv tile `tile` of the chunk into LDS. Empty slots (and slots past the chunk's or the top-k's
// end) get a zero row, so that 0 * row never meets garbage, and a zero flag. Loads first, then
// stores: the loads of a thread's pieces are all in flight together.
__device__ __forceinline__ void dq_load_kv(const SmlaParams& p, const int* topk_row, smla_bf16* skv, int* sflag,
                                           int tile) {
  constexpr int CHUNKS = SMLA_D / 8;
  uint4 v[DQ_KV_PER_THREAD];
#pragma unroll
  for (int u = 0; u < DQ_KV_PER_THREAD; ++u) {
    const int i = u * DQ_THREADS + threadIdx.x;
    const int row = i / CHUNKS, c = i % CHUNKS;
    const int rr = tile * BLOCK_R + row;
    const int k = (rr < p.r_chunk && p.r_start + rr < p.topk_n) ? topk_row[rr] : -1;
    const bool valid = smla_valid_index(k, p.num_kv);
    v[u] = valid ? *reinterpret_cast<const uint4*>(p.kv + (long long)k * p.kv_s + c * 8) : make_uint4(0u, 0u, 0u, 0u);
    if (c == 0) sflag[row] = valid ? 1 : 0;
  }
#pragma unroll
  for (int u = 0; u < DQ_KV_PER_THREAD; ++u) {
    const int i = u * DQ_THREADS + threadIdx.x;
    *reinterpret_cast<uint4*>(skv + (i / CHUNKS) * DQ_ROW + (i % CHUNKS) * 8) = v[u];
  }
}

extern "C" __global__ void __launch_bounds__(DQ_THREADS) smla_dq(SmlaParams p) {
  extern __shared__ uint4 smem_u4[];
  smla_bf16* sKV = reinterpret_cast<smla_bf16*>(smem_u4);  // [BLOCK_R][DQ_ROW]
  smla_bf16* sDS = sKV + BLOCK_R * DQ_ROW;                 // [BLOCK_H][DQ_SROW]
  int* sFlag = reinterpret_cast<int*>(sDS + BLOCK_H * DQ_SROW);

  const int t = blockIdx.x;
  const int h0 = blockIdx.y * BLOCK_H;
  const int lane = threadIdx.x % AMD_WAVE, wave = threadIdx.x / AMD_WAVE;
  const int wm = wave % DQ_MT, wn = wave / DQ_MT;
  const int c16 = lane % 16, kg = (lane / 16) * AMD_KPL;  // fragment row/column, k offset
  const int r_chunk = p.r_chunk;
  const int n_tiles = (r_chunk + BLOCK_R - 1) / BLOCK_R;
  const int* topk_row = smla_topk_row(p, t);

  // Q and dO fragments of this wave's 16 heads, for the whole of K = D.
  amd_frag qf[SMLA_D / AMD_K], df[SMLA_D / AMD_K];
  {
    const int h = h0 + wm * 16 + c16;
    const smla_bf16* qrow = p.q + t * p.q_st + h * p.q_sh + kg;
    const smla_bf16* drow = p.dout + t * p.do_st + h * p.do_sh + kg;
#pragma unroll
    for (int kk = 0; kk < SMLA_D / AMD_K; ++kk) {
      qf[kk] = amd_load_frag(qrow + kk * AMD_K);
      df[kk] = amd_load_frag(drow + kk * AMD_K);
    }
  }

  // The four heads of this lane's accumulator elements (rows 4*g + v of the wave's 16).
  const int hl0 = wm * 16 + 4 * (lane / 16);
  const long long th = (long long)t * HEADS + h0 + hl0;
  float lse2[4], dl[4];
#pragma unroll
  for (int v = 0; v < 4; ++v) {
    lse2[v] = p.lse_n[th + v] * DQ_LOG2E;
    dl[v] = p.delta[th + v];
  }
  const float sl2 = p.scale * DQ_LOG2E;

  amd_acc acc[DQ_DW / 16];
#pragma unroll
  for (int n = 0; n < DQ_DW / 16; ++n) acc[n] = amd_zero_acc();

  for (int tile = 0; tile < n_tiles; ++tile) {
    if (tile > 0) __syncthreads();  // every wave is done with the previous tile's kv and dS
    dq_load_kv(p, topk_row, sKV, sFlag, tile);
    __syncthreads();

    // ---- S = Q K^T and dP = dO K^T: 16 heads x kv rows 16*wn.. of the tile.
    amd_acc s = amd_zero_acc(), dp = amd_zero_acc();
    const smla_bf16* kvrow = sKV + (wn * 16 + c16) * DQ_ROW + kg;
#pragma unroll  // fully: qf/df must stay registers (indexing them at run time spills them)
    for (int kk = 0; kk < SMLA_D / AMD_K; ++kk) {
      const amd_frag b = amd_load_frag(kvrow + kk * AMD_K);
      s = amd_mfma(qf[kk], b, s);
      dp = amd_mfma(df[kk], b, dp);
    }

    // ---- P and scale*dS (empty slots: exactly 0): dS to LDS for dQ, both to the workspace
    // ((t*r_chunk + rr)*HEADS + h): this lane's four heads are contiguous there.
    const int rl = wn * 16 + c16, rr = tile * BLOCK_R + rl;
    const bool valid = sFlag[rl] != 0;
    float pv[4], dv[4];
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const float pe = exp2f(fmaf(s[v], sl2, -lse2[v]));
      pv[v] = valid ? pe : 0.f;
      dv[v] = valid ? pe * (dp[v] - dl[v]) * p.scale : 0.f;
      sDS[(hl0 + v) * DQ_SROW + rl] = smla_f2bf(dv[v]);
    }
    if (rr < r_chunk) {
      const long long o = ((long long)t * r_chunk + rr) * HEADS + h0 + hl0;
      *reinterpret_cast<uint2*>(p.pm + o) = make_uint2(smla_pack_bf2(pv[0], pv[1]), smla_pack_bf2(pv[2], pv[3]));
      *reinterpret_cast<uint2*>(p.ds + o) = make_uint2(smla_pack_bf2(dv[0], dv[1]), smla_pack_bf2(dv[2], dv[3]));
    }
    __syncthreads();

    // ---- dQ(16 heads x DQ_DW) += dS(16 x BLOCK_R) kv(BLOCK_R x DQ_DW).
#pragma unroll
    for (int ks = 0; ks < BLOCK_R / AMD_K; ++ks) {
      const amd_frag a = amd_load_frag(sDS + (wm * 16 + c16) * DQ_SROW + ks * AMD_K + kg);
      const smla_bf16* kvb = sKV + (ks * AMD_K + kg) * DQ_ROW + wn * DQ_DW + c16;
#pragma unroll
      for (int n = 0; n < DQ_DW / 16; ++n) acc[n] = amd_mfma(a, amd_load_frag_strided(kvb + n * 16, DQ_ROW), acc[n]);
    }
  }

  // ---- epilogue: the chunk carry (dq_acc) and the bf16 output. The carry's loads all before any store: dq_acc and
  // dq may alias as far as the compiler knows, and a load-add-store an element serializes them (CUDA's
  // smla_dq_add_carry; there it cost dq 30% at two chunks).
  if (p.n_chunks > 1 && p.chunk > 0) {
#pragma unroll
    for (int n = 0; n < DQ_DW / 16; ++n)
#pragma unroll
      for (int v = 0; v < 4; ++v)
        acc[n][v] += p.dq_acc[((long long)t * HEADS + h0 + hl0 + v) * SMLA_D + wn * DQ_DW + n * 16 + c16];
  }
  const bool keep = p.n_chunks > 1 && p.chunk != p.n_chunks - 1;  // the carry for the next chunk, not the output
#pragma unroll
  for (int n = 0; n < DQ_DW / 16; ++n) {
    const int d = wn * DQ_DW + n * 16 + c16;
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const int h = h0 + hl0 + v;
      const float x = acc[n][v];
      if (keep) {
        p.dq_acc[((long long)t * HEADS + h) * SMLA_D + d] = x;
        continue;
      }
      p.dq[t * p.dq_st + h * p.dq_sh + d] = smla_f2bf(x);
    }
  }
}
