// dkv_interm.cu: per chunk, interm[t, rr, :] = sum_h ds[t,rr,h] q[t,h,:] + pm[t,rr,h] dout[t,h,:].
// Two bodies: mma.sync (sm_80 and later, any tile; below) and, with DKV_WGMMA 1, warpgroup MMA
// (sm_90a, one tile of 64 rows x 256 columns; dkv_wgmma.cuh).
//
// Per token this is one product [r_chunk x 2H] x [2H x D] with A = [ds | pm] (rows of the chunk)
// and B = [q ; dout]. A block owns one token and BLOCK_D columns: B's columns stay in shared
// memory, and A streams through two buffers of BLOCK_R rows (cp.async, double-buffered). Warps
// form a WARPS_M x WARPS_N grid over the BLOCK_R x BLOCK_D output tile. Grid: T * (D / BLOCK_D)
// blocks, column block fastest.
#include "smla_params.h"
#include "common.cuh"

// Heads as a constant: named HEADS, since "H" would rewrite SmlaParams::H.
#ifndef HEADS
#define HEADS 128
#endif
#ifndef BLOCK_R
#define BLOCK_R 64
#endif
#ifndef BLOCK_D
#define BLOCK_D 256
#endif
#ifndef NUM_WARPS
#define NUM_WARPS 8
#endif
#ifndef WARPS_M
#define WARPS_M 2
#endif
#ifndef DKV_WGMMA
#define DKV_WGMMA 0  // 1: the sm_90a warpgroup-MMA body (dkv_wgmma.cuh) instead of the mma.sync one below
#endif

#if DKV_WGMMA
#include "dkv_wgmma.cuh"
#else

#define DK_THREADS (NUM_WARPS * 32)
#define DK_WN (NUM_WARPS / WARPS_M)
#define DK_WTM (BLOCK_R / WARPS_M)  // rows per warp
#define DK_WTN (BLOCK_D / DK_WN)    // columns per warp
#define DK_MI (DK_WTM / 16)
#define DK_NI (DK_WTN / 8)
#define DK_K (2 * HEADS)
#define DK_AROW (DK_K + SMLA_ROW_PAD)
#define DK_BROW (BLOCK_D + SMLA_ROW_PAD)

static_assert(HEADS % 16 == 0, "HEADS must be a multiple of 16");
static_assert(NUM_WARPS % WARPS_M == 0, "NUM_WARPS must be a multiple of WARPS_M");
static_assert(DK_WTM % 16 == 0 && DK_WTN % 16 == 0, "warp tile must be a multiple of 16 x 16");
static_assert(SMLA_D % BLOCK_D == 0, "BLOCK_D must divide D");
// The carve of smla_dkv_interm below: sB (2H rows of DK_BROW), two A buffers (BLOCK_R rows of DK_AROW).
SMLA_CHECK_SMEM(DK_K * DK_BROW * 2 + 2 * BLOCK_R * DK_AROW * 2);

// Rows [tile*BLOCK_R, +BLOCK_R) of the chunk's [ds | pm] into buffer `sa`; rows past the chunk
// are zero (never stored, but kept finite).
__device__ __forceinline__ void dk_load_a(const SmlaParams& p, smla_bf16* sa, int t, int tile) {
  constexpr int CHUNKS = DK_K / 8, HALF = HEADS / 8;
  for (int i = threadIdx.x; i < BLOCK_R * CHUNKS; i += DK_THREADS) {
    const int row = i / CHUNKS, c = i % CHUNKS;
    const int rr = tile * BLOCK_R + row;
    smla_bf16* dst = sa + row * DK_AROW + c * 8;
    if (rr < p.r_chunk) {
      const long long base = ((long long)t * p.r_chunk + rr) * HEADS;
      const smla_bf16* src = c < HALF ? p.ds + base + c * 8 : p.pm + base + (c - HALF) * 8;
      smla_cp_async16(dst, src);
    } else {
      smla_st_shared_zero16(dst);
    }
  }
}

extern "C" __global__ void __launch_bounds__(DK_THREADS, 1) smla_dkv_interm(SmlaParams p) {
  extern __shared__ uint4 smem_u4[];
  smla_bf16* sB = reinterpret_cast<smla_bf16*>(smem_u4);  // [2H][BLOCK_D + pad]
  smla_bf16* sA = sB + DK_K * DK_BROW;                     // two buffers [BLOCK_R][2H + pad]

  // The column blocks of one token are neighbours in launch order, so the second reads the
  // token's [ds | pm] rows from L2 rather than from device memory.
  const int t = blockIdx.x / (SMLA_D / BLOCK_D);
  const int d0 = (blockIdx.x % (SMLA_D / BLOCK_D)) * BLOCK_D;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int wm = warp % WARPS_M, wn = warp / WARPS_M;
  const int r_chunk = p.r_chunk;
  const int n_tiles = (r_chunk + BLOCK_R - 1) / BLOCK_R;

  // B = [q ; dout] columns d0.. of this token, once.
  for (int i = threadIdx.x; i < DK_K * (BLOCK_D / 8); i += DK_THREADS) {
    const int row = i / (BLOCK_D / 8), c = i % (BLOCK_D / 8);
    const smla_bf16* src = row < HEADS ? p.q + t * p.q_st + row * p.q_sh : p.dout + t * p.do_st + (row - HEADS) * p.do_sh;
    smla_cp_async16(sB + row * DK_BROW + c * 8, src + d0 + c * 8);
  }
  if (n_tiles > 0) dk_load_a(p, sA, t, 0);
  smla_cp_async_commit();

  const int a_row = (lane % 8) + 8 * ((lane / 8) % 2), a_col = 8 * (lane / 16);

  for (int tile = 0; tile < n_tiles; ++tile) {
    const int buf = tile & 1;
    smla_cp_async_wait<0>();
    __syncthreads();  // this tile has landed; every warp is done with the other buffer
    if (tile + 1 < n_tiles) dk_load_a(p, sA + (buf ^ 1) * BLOCK_R * DK_AROW, t, tile + 1);
    smla_cp_async_commit();
    const smla_bf16* sa = sA + buf * BLOCK_R * DK_AROW;

    float acc[DK_MI][DK_NI][4];
#pragma unroll
    for (int mi = 0; mi < DK_MI; ++mi)
#pragma unroll
      for (int j = 0; j < DK_NI; ++j) acc[mi][j][0] = acc[mi][j][1] = acc[mi][j][2] = acc[mi][j][3] = 0.f;

#pragma unroll 2
    for (int kk = 0; kk < DK_K / 16; ++kk) {
      unsigned a[DK_MI][4];
#pragma unroll
      for (int mi = 0; mi < DK_MI; ++mi)
        smla_ldsm_x4(a[mi], sa + (wm * DK_WTM + mi * 16 + a_row) * DK_AROW + kk * 16 + a_col);
#pragma unroll
      for (int np = 0; np < DK_NI / 2; ++np) {
        unsigned b[4];  // B stored [k][n]: transposed load, k as the row
        smla_ldsm_x4_trans(b, sB + (kk * 16 + a_row) * DK_BROW + wn * DK_WTN + np * 16 + a_col);
#pragma unroll
        for (int mi = 0; mi < DK_MI; ++mi) {
          smla_mma_bf16(acc[mi][2 * np], a[mi], b[0], b[1]);
          smla_mma_bf16(acc[mi][2 * np + 1], a[mi], b[2], b[3]);
        }
      }
    }

    // bf16 out, rows past the chunk dropped.
#pragma unroll
    for (int mi = 0; mi < DK_MI; ++mi)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int rr = tile * BLOCK_R + wm * DK_WTM + mi * 16 + lane / 4 + 8 * half;
        if (rr >= r_chunk) continue;
        smla_bf16* out = p.interm + ((long long)t * r_chunk + rr) * SMLA_D + d0 + wn * DK_WTN + 2 * (lane % 4);
#pragma unroll
        for (int j = 0; j < DK_NI; ++j)
          *reinterpret_cast<unsigned*>(out + j * 8) = smla_pack_bf2(acc[mi][j][2 * half], acc[mi][j][2 * half + 1]);
      }
  }
}
#endif  // DKV_WGMMA
