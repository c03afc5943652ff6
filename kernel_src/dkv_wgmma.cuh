// dkv_wgmma.cuh: the sm_90a body of dkv_interm.cu (included when DKV_WGMMA is 1):
// interm[t, rr, :] = sum_h ds[t,rr,h] q[t,h,:] + pm[t,rr,h] dout[t,h,:], with warpgroup MMA (wgmma).
//
// Per token one product [r_chunk x 2H] x [2H x 512]: A = [ds | pm] rows of the chunk (K = 2H
// contiguous), B = [q ; dout] (columns contiguous). A block owns one token and 256 columns and runs
// two warpgroups; warpgroup w computes columns 128 w .. 128 w + 127 of every 64-row tile of A.
// Shared memory, every operand in 1024-byte aligned atoms with the 128-byte swizzle (wgmma.cuh):
//   sB      [4 column chunks][2H rows][64 columns]    MN-major B, loaded once     2H x 512 B
//   sA[2]   [2H/64 K chunks][64 rows][64 K]           K-major A, double-buffered  64 x 4H B each
//   sOut[2] [2 column chunks][64 rows][64 columns]    bf16 staging per warpgroup, 16 KB each
// Per tile of 64 rows (cp.async by every thread, issued one tile ahead; rows past the chunk are
// zero and never stored): D(64 x 128, fp32) = A_tile B[:, 128 w ..], then D -> bf16 -> sOut ->
// 16-byte coalesced stores to interm. The host sizes shared memory with
// smla_dkv_wgmma_smem_bytes() (common.cuh).
#include "wgmma.cuh"

#if BLOCK_R != SMLA_DKV_WGMMA_ROWS || BLOCK_D != SMLA_DKV_WGMMA_COLS
#error "the wgmma dkv body has one tile: BLOCK_R 64 (wgmma's M) x BLOCK_D 256 (two warpgroups of 128 columns)"
#endif
#if NUM_WARPS != 8
#error "the wgmma dkv body runs two warpgroups (NUM_WARPS 8)"
#endif
#if HEADS % 32 != 0
#error "the wgmma dkv body needs HEADS a multiple of 32 (K = 2H in chunks of 64)"
#endif
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "the wgmma dkv body needs sm_90a"
#endif

#define DKW_THREADS 256
#define DKW_K (2 * HEADS)
#define DKW_KCH (DKW_K / 64)          // 64-element K chunks of an A tile
#define DKW_BCHUNK (DKW_K * 128)      // one 64-column chunk of B: 2H rows of 128 B
#define DKW_BBYTES (4 * DKW_BCHUNK)   // 256 columns
#define DKW_ACHUNK (64 * 128)         // one K chunk of an A tile: 64 rows of 128 B
#define DKW_ABYTES (DKW_KCH * DKW_ACHUNK)
#define DKW_OCHUNK (64 * 128)         // one 64-column chunk of a staging tile
#define DKW_OBYTES (2 * DKW_OCHUNK)   // 64 rows x 128 columns bf16
static_assert(DKW_BBYTES + 2 * DKW_ABYTES + 2 * DKW_OBYTES + 1024 == smla_dkv_wgmma_smem_bytes(HEADS),
              "dkv_wgmma's shared-memory carve and smla_dkv_wgmma_smem_bytes() disagree");

// Rows [tile * 64, +64) of the chunk's [ds | pm] into the A buffer at `sa`; rows past the chunk are zero.
__device__ __forceinline__ void dkw_load_a(const SmlaParams& p, char* sa, int t, int tile) {
  constexpr int PIECES = DKW_K / 8, HALF = HEADS / 8;  // 16-byte pieces of a row; of its ds half
  for (int i = threadIdx.x; i < 64 * PIECES; i += DKW_THREADS) {
    const int row = i / PIECES, c = i % PIECES;
    const int rr = tile * 64 + row;
    char* dst = sa + (c >> 3) * DKW_ACHUNK + smla_swz128(row, (c & 7) * 8);
    if (rr < p.r_chunk) {
      const long long base = ((long long)t * p.r_chunk + rr) * HEADS;
      smla_cp_async16(dst, c < HALF ? p.ds + base + c * 8 : p.pm + base + (c - HALF) * 8);
    } else {
      smla_st_shared_zero16(dst);
    }
  }
}

extern "C" __global__ void __launch_bounds__(DKW_THREADS, 1) smla_dkv_interm(SmlaParams p) {
  extern __shared__ uint4 smem_u4[];
  char* base = reinterpret_cast<char*>(smem_u4);
  base = smla_align1024(base);  // the host asks for 1 KB of slack
  char* sB = base;
  char* sA = sB + DKW_BBYTES;  // two buffers
  char* sOut = sA + 2 * DKW_ABYTES;

  // The two column blocks of a token are neighbours in launch order: the second reads the token's
  // [ds | pm] rows from L2.
  const int t = blockIdx.x / (SMLA_D / 256);
  const int d0 = (blockIdx.x % (SMLA_D / 256)) * 256;
  const int wg = threadIdx.x / 128, tw = threadIdx.x % 128;
  const int warp = tw / 32, lane = tw % 32;
  const int r_chunk = p.r_chunk;
  const int n_tiles = (r_chunk + 63) / 64;

  // B = [q ; dout], columns d0 .. d0 + 255 of this token, once: row k = head (q) or H + head (dout).
  for (int i = threadIdx.x; i < DKW_K * 32; i += DKW_THREADS) {
    const int k = i / 32, c = i % 32;  // c: 16-byte piece of the 512-byte row
    const smla_bf16* src = k < HEADS ? p.q + t * p.q_st + k * p.q_sh : p.dout + t * p.do_st + (k - HEADS) * p.do_sh;
    smla_cp_async16(sB + (c >> 3) * DKW_BCHUNK + smla_swz128(k, (c & 7) * 8), src + d0 + c * 8);
  }
  if (n_tiles > 0) dkw_load_a(p, sA, t, 0);
  smla_cp_async_commit();
  if (n_tiles > 1) dkw_load_a(p, sA + DKW_ABYTES, t, 1);
  smla_cp_async_commit();  // every tile has one commit group (maybe empty): wait<1> below is exact

  const unsigned ab = smla_smem_addr(sB) + 2 * wg * DKW_BCHUNK;
  const unsigned aa0 = smla_smem_addr(sA);
  char* so = sOut + wg * DKW_OBYTES;

  for (int tile = 0; tile < n_tiles; ++tile) {
    const int buf = tile & 1;
    smla_cp_async_wait<1>();   // this tile's group (the next one may still be in flight)
    smla_fence_proxy_async();  // this thread's copies and zero rows, for wgmma
    __syncthreads();           // (A) the tile has landed for everyone

    // ---- D (64 rows x 128 columns) = A_tile (64 x 2H, K-major) * B (2H x 128, MN-major).
    float acc[64];
#pragma unroll
    for (int j = 0; j < 64; ++j) acc[j] = 0.f;
    smla_fence_regs(acc);
    smla_wgmma_fence();
    const unsigned aa = aa0 + buf * DKW_ABYTES;
#pragma unroll
    for (int kk = 0; kk < DKW_K / 16; ++kk) {
      const unsigned long long da = smla_wgmma_desc(aa + (kk >> 2) * DKW_ACHUNK + (kk & 3) * 32, 16, 1024);
      const unsigned long long db = smla_wgmma_desc(ab + kk * 2048, DKW_BCHUNK, 1024);
      smla_wgmma_m64n128k16<0, 1>(acc, da, db, kk > 0);
    }
    smla_wgmma_commit();
    smla_wgmma_wait<0>();
    smla_fence_regs(acc);

    // ---- bf16 into this warpgroup's staging tile: d[4 i + 2 half + e] is row 16 warp + lane / 4 +
    // 8 half, column 8 i + 2 (lane % 4) + e; a warp's 8 rows land on 8 distinct 16-byte bank groups.
#pragma unroll
    for (int i = 0; i < 16; ++i)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = 16 * warp + lane / 4 + 8 * half;
        *reinterpret_cast<unsigned*>(so + (i >> 3) * DKW_OCHUNK + smla_swz128(row, (i & 7) * 8 + 2 * (lane % 4))) =
            smla_pack_bf2_rn(acc[4 * i + 2 * half], acc[4 * i + 2 * half + 1]);
      }
    asm volatile("bar.sync %0, 128;" ::"r"(1 + wg) : "memory");  // the warpgroup's staging tile is written

    // ---- staging -> interm, 16 bytes a thread, 16 threads a 256-byte row piece.
#pragma unroll
    for (int it = 0; it < 8; ++it) {
      const int idx = it * 128 + tw, row = idx / 16, pc = idx % 16;
      const int rr = tile * 64 + row;
      if (rr < r_chunk) {
        const uint4 v = *reinterpret_cast<const uint4*>(so + (pc >> 3) * DKW_OCHUNK + smla_swz128(row, (pc & 7) * 8));
        *reinterpret_cast<uint4*>(p.interm + ((long long)t * r_chunk + rr) * SMLA_D + d0 + 128 * wg + pc * 8) = v;
      }
    }
    __syncthreads();  // (B) both warpgroups are done reading this A buffer and their staging tiles
    if (tile + 2 < n_tiles) dkw_load_a(p, sA + buf * DKW_ABYTES, t, tile + 2);
    smla_cp_async_commit();
  }
}
