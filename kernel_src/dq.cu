// dq.cu: per chunk of the top-k, recompute S and dP, emit P and scale*dS (bf16), accumulate dQ.
// Two bodies: mma.sync (sm_80 and later, any BLOCK_H; below) and, with DQ_WGMMA 1, warpgroup MMA
// for sm_90a (dq_wgmma.cuh; BLOCK_H 64). The planner picks the second on sm_90a when H % 64 == 0.
//
// A block owns one token t and BLOCK_H heads. Q and dO of those heads stay in shared memory; the
// chunk's kv rows stream through two shared buffers of BLOCK_R rows (cp.async, double-buffered).
// Warps form an MT x WN grid (MT = BLOCK_H / 16): for S and dP warp (wm, wn) owns heads
// 16*wm.. and BN = BLOCK_R / WN kv rows; for dQ it owns the same heads and DW = 512 / WN columns,
// accumulated in registers over the whole chunk. dS goes through shared memory between the two.
//
// The dS and P tiles are kept transposed, [BLOCK_R][BLOCK_H + pad] (h fastest, as in the
// workspace), so each tile leaves for pm/ds in 16-byte pieces; dQ reads dS with ldmatrix.trans.
// This is not common.cuh's smla_dq_dsp_bytes layout: the host sizes shared memory with
// dq_smem_bytes() in runtime/cuda/kernels_cuda.cpp (same carve order as below).
#include "smla_params.h"
#include "common.cuh"

// Heads as a constant: named HEADS, since "H" would rewrite SmlaParams::H.
#ifndef HEADS
#define HEADS 128
#endif
#ifndef BLOCK_H
#define BLOCK_H (HEADS < 64 ? HEADS : 64)
#endif
#ifndef BLOCK_R
#define BLOCK_R 32
#endif
#ifndef NUM_WARPS
#define NUM_WARPS (BLOCK_H / 8)
#endif
#ifndef DQ_WGMMA
#define DQ_WGMMA 0  // 1: the sm_90a warpgroup-MMA body (dq_wgmma.cuh) instead of the mma.sync one below
#endif

#if DQ_WGMMA
#include "dq_wgmma.cuh"
#else

#define DQ_THREADS (NUM_WARPS * 32)
#define DQ_MT (BLOCK_H / 16)          // warp rows (16 heads each)
#define DQ_WN (NUM_WARPS / DQ_MT)     // warp columns
#define DQ_BN (BLOCK_R / DQ_WN)       // kv rows of S per warp
#define DQ_DW (SMLA_D / DQ_WN)        // dQ columns per warp
#define DQ_ROW (SMLA_D + SMLA_ROW_PAD)  // smem row stride of Q, dO, kv (elements)
#define DQ_TROW (BLOCK_H + SMLA_ROW_PAD)  // smem row stride of the transposed dS and P tiles

static_assert(BLOCK_H % 16 == 0 && HEADS % BLOCK_H == 0, "BLOCK_H must be a multiple of 16 dividing HEADS");
static_assert(NUM_WARPS % DQ_MT == 0, "NUM_WARPS must be a multiple of BLOCK_H / 16");
static_assert(BLOCK_R % (16 * DQ_WN) == 0, "each warp's share of BLOCK_R must be a multiple of 16");
static_assert(SMLA_D % (16 * DQ_WN) == 0, "each warp's share of D must be a multiple of 16");
// The carve of smla_dq below: sQ, sDO, two kv buffers (rows of DQ_ROW), sDS and sP (rows of DQ_TROW), flags.
SMLA_CHECK_SMEM((2 * BLOCK_H + 2 * BLOCK_R) * DQ_ROW * 2 + 2 * BLOCK_R * DQ_TROW * 2 + 2 * BLOCK_R * 4);

#define DQ_LOG2E 1.4426950408889634f

// Issue the copies of kv tile `tile` of the chunk into buffer `buf`. Empty slots (and slots past
// the chunk's or the top-k's end) get a zero row, so that 0 * row never meets garbage, and a zero flag.
__device__ __forceinline__ void dq_load_kv(const SmlaParams& p, const int* topk_row, smla_bf16* skv, int* sflag,
                                           int tile) {
  constexpr int CHUNKS = SMLA_D / 8;  // 16-byte pieces of a row
  for (int i = threadIdx.x; i < BLOCK_R * CHUNKS; i += DQ_THREADS) {
    const int row = i / CHUNKS, c = i % CHUNKS;
    const int rr = tile * BLOCK_R + row;
    // past the chunk, or past topk in a ragged last chunk: empty
    const int k = (rr < p.r_chunk && p.r_start + rr < p.topk_n) ? topk_row[rr] : -1;
    const bool valid = smla_valid_index(k, p.num_kv);
    smla_bf16* dst = skv + row * DQ_ROW + c * 8;
    if (valid)
      smla_cp_async16(dst, p.kv + (long long)k * p.kv_s + c * 8);
    else
      smla_st_shared_zero16(dst);
    if (c == 0) sflag[row] = valid ? 1 : 0;
  }
}

extern "C" __global__ void __launch_bounds__(DQ_THREADS, 1) smla_dq(SmlaParams p) {
  extern __shared__ uint4 smem_u4[];
  smla_bf16* sQ = reinterpret_cast<smla_bf16*>(smem_u4);
  smla_bf16* sDO = sQ + BLOCK_H * DQ_ROW;
  smla_bf16* sKV = sDO + BLOCK_H * DQ_ROW;  // two buffers of BLOCK_R rows
  smla_bf16* sDS = sKV + 2 * BLOCK_R * DQ_ROW;  // [BLOCK_R][DQ_TROW]
  smla_bf16* sP = sDS + BLOCK_R * DQ_TROW;        // [BLOCK_R][DQ_TROW]
  int* sFlag = reinterpret_cast<int*>(sP + BLOCK_R * DQ_TROW);  // [2][BLOCK_R]

  const int t = blockIdx.x;
  const int h0 = blockIdx.y * BLOCK_H;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int wm = warp % DQ_MT, wn = warp / DQ_MT;
  const int r_chunk = p.r_chunk;
  const int n_tiles = (r_chunk + BLOCK_R - 1) / BLOCK_R;
  const int* topk_row = smla_topk_row(p, t);

  // Q and dO of the block's heads, once.
  for (int i = threadIdx.x; i < BLOCK_H * (SMLA_D / 8); i += DQ_THREADS) {
    const int hh = i / (SMLA_D / 8), c = i % (SMLA_D / 8);
    smla_cp_async16(sQ + hh * DQ_ROW + c * 8, p.q + t * p.q_st + (h0 + hh) * p.q_sh + c * 8);
    smla_cp_async16(sDO + hh * DQ_ROW + c * 8, p.dout + t * p.do_st + (h0 + hh) * p.do_sh + c * 8);
  }
  if (n_tiles > 0) dq_load_kv(p, topk_row, sKV, sFlag, 0);
  smla_cp_async_commit();

  // The two heads of this thread's accumulator rows (fragment rows g and g + 8).
  const int hl_a = wm * 16 + lane / 4, hl_b = hl_a + 8;
  const long long th = (long long)t * HEADS + h0;
  const float lse2_a = p.lse_n[th + hl_a] * DQ_LOG2E, lse2_b = p.lse_n[th + hl_b] * DQ_LOG2E;
  const float dl_a = p.delta[th + hl_a], dl_b = p.delta[th + hl_b];
  const float sl2 = p.scale * DQ_LOG2E;

  // ldmatrix lane offsets: A (row-major m x k) and B stored [n][k] use (row, col) =
  // (l%8 + 8*((l/8)%2), 8*(l/16)) and (l%8 + 8*(l/16), 8*((l/8)%2)); B stored [k][n] (trans)
  // uses the A pattern with k as the row.
  const int a_row = (lane % 8) + 8 * ((lane / 8) % 2), a_col = 8 * (lane / 16);
  const int bn_row = (lane % 8) + 8 * (lane / 16), bn_col = 8 * ((lane / 8) % 2);

  float acc[DQ_DW / 8][4];
#pragma unroll
  for (int j = 0; j < DQ_DW / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;

  for (int tile = 0; tile < n_tiles; ++tile) {
    const int buf = tile & 1;
    smla_cp_async_wait<0>();
    __syncthreads();  // this tile has landed; every warp is done with the other buffer and sDS/sP
    if (tile + 1 < n_tiles)
      dq_load_kv(p, topk_row, sKV + (buf ^ 1) * BLOCK_R * DQ_ROW, sFlag + (buf ^ 1) * BLOCK_R, tile + 1);
    smla_cp_async_commit();

    const smla_bf16* kvb = sKV + buf * BLOCK_R * DQ_ROW;
    const int* flag = sFlag + buf * BLOCK_R;

    // ---- S = Q K^T and dP = dO K^T for this warp's 16 heads x DQ_BN kv rows (K = D).
    float s[DQ_BN / 8][4], dp[DQ_BN / 8][4];
#pragma unroll
    for (int j = 0; j < DQ_BN / 8; ++j)
      s[j][0] = s[j][1] = s[j][2] = s[j][3] = dp[j][0] = dp[j][1] = dp[j][2] = dp[j][3] = 0.f;
#pragma unroll 4
    for (int kk = 0; kk < SMLA_D / 16; ++kk) {
      unsigned qa[4], da[4];
      smla_ldsm_x4(qa, sQ + (wm * 16 + a_row) * DQ_ROW + kk * 16 + a_col);
      smla_ldsm_x4(da, sDO + (wm * 16 + a_row) * DQ_ROW + kk * 16 + a_col);
#pragma unroll
      for (int np = 0; np < DQ_BN / 16; ++np) {
        unsigned b[4];
        smla_ldsm_x4(b, kvb + (wn * DQ_BN + np * 16 + bn_row) * DQ_ROW + kk * 16 + bn_col);
        smla_mma_bf16(s[2 * np], qa, b[0], b[1]);
        smla_mma_bf16(s[2 * np + 1], qa, b[2], b[3]);
        smla_mma_bf16(dp[2 * np], da, b[0], b[1]);
        smla_mma_bf16(dp[2 * np + 1], da, b[2], b[3]);
      }
    }

    // ---- P and scale*dS in registers, to shared memory as bf16 (empty slots: exactly 0).
#pragma unroll
    for (int j = 0; j < DQ_BN / 8; ++j) {
      const int col = wn * DQ_BN + j * 8 + 2 * (lane % 4);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float lse2 = half ? lse2_b : lse2_a, dl = half ? dl_b : dl_a;
        float pv[2], dv[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const bool valid = flag[col + e] != 0;
          const float pe = exp2f(fmaf(s[j][2 * half + e], sl2, -lse2));
          pv[e] = valid ? pe : 0.f;
          dv[e] = valid ? pe * (dp[j][2 * half + e] - dl) * p.scale : 0.f;
        }
        const int hl = half ? hl_b : hl_a;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          sP[(col + e) * DQ_TROW + hl] = smla_f2bf(pv[e]);
          sDS[(col + e) * DQ_TROW + hl] = smla_f2bf(dv[e]);
        }
      }
    }
    __syncthreads();

    // ---- this tile's P and dS rows to the workspace ((t*r_chunk + rr)*HEADS + h), h fastest.
    for (int i = threadIdx.x; i < BLOCK_R * (BLOCK_H / 8); i += DQ_THREADS) {
      const int rl = i / (BLOCK_H / 8), c = i % (BLOCK_H / 8);
      const int rr = tile * BLOCK_R + rl;
      if (rr < r_chunk) {
        const long long o = ((long long)t * r_chunk + rr) * HEADS + h0 + c * 8;
        *reinterpret_cast<uint4*>(p.pm + o) = *reinterpret_cast<const uint4*>(sP + rl * DQ_TROW + c * 8);
        *reinterpret_cast<uint4*>(p.ds + o) = *reinterpret_cast<const uint4*>(sDS + rl * DQ_TROW + c * 8);
      }
    }

    // ---- dQ(16 heads x DQ_DW) += dS(16 x BLOCK_R) K(BLOCK_R x DQ_DW).
#pragma unroll
    for (int kk = 0; kk < BLOCK_R / 16; ++kk) {
      unsigned a[4];  // dS stored [k = slot][m = head]: the transposed load gives the row-major fragment
      smla_ldsm_x4_trans(a, sDS + (kk * 16 + bn_row) * DQ_TROW + wm * 16 + bn_col);
#pragma unroll
      for (int np = 0; np < DQ_DW / 16; ++np) {
        unsigned b[4];
        smla_ldsm_x4_trans(b, kvb + (kk * 16 + a_row) * DQ_ROW + wn * DQ_DW + np * 16 + a_col);
        smla_mma_bf16(acc[2 * np], a, b[0], b[1]);
        smla_mma_bf16(acc[2 * np + 1], a, b[2], b[3]);
      }
    }
  }

  // ---- epilogue: the chunk carry (dq_acc), every load before any store (smla_dq_add_carry), and the bf16 output.
  // In batches of DQ_EPI_BATCH column groups: all of a batch's carry loads, then its stores. sm_90: one batch. sm_8x:
  // two, since ptxas there hoisted every carry load ahead and spilled 8 bytes at 254 registers (check_compile.sh);
  // the first batch's stores keep the second batch's loads behind them.
#if __CUDA_ARCH__ < 900
#define DQ_EPI_BATCH (DQ_DW / 16)
#else
#define DQ_EPI_BATCH (DQ_DW / 8)
#endif
#pragma unroll
  for (int j0 = 0; j0 < DQ_DW / 8; j0 += DQ_EPI_BATCH) {
    if (p.n_chunks > 1 && p.chunk > 0) {
#pragma unroll
      for (int j = j0; j < j0 + DQ_EPI_BATCH; ++j)
#pragma unroll
        for (int half = 0; half < 2; ++half)
          smla_dq_add_carry<HEADS>(p, t, h0 + (half ? hl_b : hl_a), wn * DQ_DW + j * 8 + 2 * (lane % 4),
                                   acc[j][2 * half], acc[j][2 * half + 1]);
    }
#pragma unroll
    for (int j = j0; j < j0 + DQ_EPI_BATCH; ++j)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        smla_dq_store_pair<HEADS>(p, t, h0 + (half ? hl_b : hl_a), wn * DQ_DW + j * 8 + 2 * (lane % 4),
                                  acc[j][2 * half], acc[j][2 * half + 1]);
  }
#undef DQ_EPI_BATCH
}
#endif  // DQ_WGMMA
