// dkv_wgmma.cuh: the sm_90a body of dkv_interm.cu (included when DKV_WGMMA is 1):
// interm[t, rr, :] = sum_h ds[t,rr,h] q[t,h,:] + pm[t,rr,h] dout[t,h,:], with warpgroup MMA (wgmma).
//
// Per token one product [r_chunk x 2H] x [2H x 512]: A = [ds | pm] rows of the chunk (K = 2H
// contiguous), B = [q ; dout] (columns contiguous). A block owns one token and 256 columns and runs
// two warpgroups; warpgroup w computes columns 128 w .. 128 w + 127 of every 64-row tile of A.
// Shared memory, every operand in 1024-byte aligned atoms with the 128-byte swizzle (wgmma.cuh):
//   sB      [4 column chunks][2H rows][64 columns]    MN-major B, loaded once     2H x 512 B
//   sA[3]   [2H/64 K chunks][64 rows][64 K]           K-major A, three slots      max(64 x 4H B, 32 KB) each
//           (after a tile's MMA its slot holds the two warpgroups' bf16 staging halves, 64 x 128 each)
// Per tile of 64 rows (cp.async by every thread, issued two tiles ahead; rows past the chunk are
// zero and never stored): D(64 x 128, fp32) = A_tile B[:, 128 w ..], issued asynchronously; while
// it runs, the previous tile's D -> bf16 -> its slot -> 16-byte coalesced stores to interm (two
// accumulators, the software pipeline at the end of the kernel). The host sizes shared memory with
// smla_dkv_wgmma_smem_bytes() (common.cuh).
#include "wgmma.cuh"

#if BLOCK_R != SMLA_DKV_WGMMA_ROWS || BLOCK_D != SMLA_DKV_WGMMA_COLS
#error "the wgmma dkv body has one tile: BLOCK_R 64 (wgmma's M) x BLOCK_D 256 (two warpgroups of 128 columns)"
#endif
#ifndef DKW_PRODUCER
#define DKW_PRODUCER 0
#endif
#if !DKW_PRODUCER && NUM_WARPS != 8
#error "the wgmma dkv body runs two warpgroups (NUM_WARPS 8)"
#endif
#if DKW_PRODUCER && NUM_WARPS != 12
#error "the wgmma dkv body with a producer runs three warpgroups (NUM_WARPS 12)"
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
#define DKW_OBYTES (2 * DKW_OCHUNK)   // 64 rows x 128 columns bf16, one warpgroup's staging half
// A slot holds one A tile, and after its MMA both warpgroups' staging halves.
#define DKW_ASLOT (DKW_ABYTES > 2 * DKW_OBYTES ? DKW_ABYTES : 2 * DKW_OBYTES)
#define DKW_BARS (DKW_PRODUCER ? 64 : 0)  // dkv_impl 3's mbarriers: B landed, full[3], empty[3]
static_assert(DKW_BBYTES + 3 * DKW_ASLOT + DKW_BARS + 1024 == smla_dkv_wgmma_smem_bytes(HEADS, DKW_PRODUCER),
              "dkv_wgmma's shared-memory carve and smla_dkv_wgmma_smem_bytes() disagree");
SMLA_CHECK_SMEM(smla_dkv_wgmma_smem_bytes(HEADS, DKW_PRODUCER));

// Rows [tile * 64, +64) of the chunk's [ds | pm] into the A buffer at `sa`; rows past the chunk are zero. The
// calling threads are first, first + stride, ... (every thread of the block, or the producer warpgroup's; stride a
// multiple of a row's 2H / 8 pieces), so a thread copies the same 16-byte piece c of every stride / (2H / 8)-th row:
// its source column, destination chunk and (row % 8 being fixed when the step is a multiple of 8) swizzle are
// computed once, not per piece (the per-piece index arithmetic was a fifth of dkv_interm's samples: perf notes v17).
__device__ __forceinline__ void dkw_load_a(const SmlaParams& p, char* sa, int t, int tile, int first = threadIdx.x,
                                           int stride = DKW_THREADS) {
  constexpr int PIECES = DKW_K / 8, HALF = HEADS / 8;  // 16-byte pieces of a row; of its ds half
  const int c = first % PIECES, rstep = stride / PIECES, row0 = first / PIECES;
  const smla_bf16* src = (c < HALF ? p.ds + c * 8 : p.pm + (c - HALF) * 8) +
                         ((long long)t * p.r_chunk + tile * 64 + row0) * HEADS;
  char* dst = sa + (c >> 3) * DKW_ACHUNK + row0 * 128;
  const int rows = p.r_chunk - tile * 64 - row0;  // rows of the chunk from row0 on
#pragma unroll
  for (int n = 0; n < 64 / rstep; ++n) {
    const int row = row0 + n * rstep;
    char* d = dst + n * rstep * 128 + smla_swz128_piece(row, c);
    if (n * rstep < rows)
      smla_cp_async16(d, src + (long long)n * rstep * HEADS);
    else
      smla_st_shared_zero16(d);
  }
}

// B = [q ; dout], columns d0 .. d0 + 255 of token t, into `sb`: row k = head (q) or H + head (dout); rows
// [kb, ke) of it (all by default; kb, ke and H multiples of stride / 32). Threads as in dkw_load_a (stride a multiple
// of 32): a thread copies piece c = first % 32 of every stride / 32-th row, q's rows of the range, then dout's.
__device__ __forceinline__ void dkw_load_b(const SmlaParams& p, char* sb, int t, int d0, int first = threadIdx.x,
                                           int stride = DKW_THREADS, int kb = 0, int ke = DKW_K) {
  const int c = first % 32, kstep = stride / 32, k0 = first / 32;
  char* dst = sb + (c >> 3) * DKW_BCHUNK;
  const smla_bf16* q = p.q + t * p.q_st + k0 * p.q_sh + d0 + c * 8;
  const smla_bf16* dout = p.dout + t * p.do_st + k0 * p.do_sh + d0 + c * 8;
  for (int half = 0; half < 2; ++half) {
    const int lo = max(kb, half * HEADS), hi = min(ke, (half + 1) * HEADS);  // this half's rows of the range
    const smla_bf16* src = half ? dout + (lo - HEADS) * p.do_sh : q + lo * p.q_sh;
    const long long sh = half ? p.do_sh : p.q_sh;
#pragma unroll 4
    for (int n = 0; n < (hi - lo) / kstep; ++n) {
      const int k = lo + k0 + n * kstep;
      smla_cp_async16(dst + k * 128 + smla_swz128_piece(k, c), src + n * kstep * sh);
    }
  }
}

// The epilogue of one tile: acc (64 rows x this warpgroup's 128 columns, fp32) -> bf16 in the
// warpgroup's staging half `so` -> 16-byte coalesced stores to interm. d[4 i + 2 half + e] is row
// 16 warp + lane / 4 + 8 half, column 8 i + 2 (lane % 4) + e; a warp's 8 rows land on 8 distinct
// 16-byte bank groups.
__device__ __forceinline__ void dkw_store_tile(const SmlaParams& p, const float (&acc)[64], char* so, int t, int d0,
                                               int tile) {
  const int wg = threadIdx.x / 128, tw = threadIdx.x % 128, warp = tw / 32, lane = tw % 32;
#pragma unroll
  for (int i = 0; i < 16; ++i)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = 16 * warp + lane / 4 + 8 * half;
      *reinterpret_cast<unsigned*>(so + (i >> 3) * DKW_OCHUNK + smla_swz128(row, (i & 7) * 8 + 2 * (lane % 4))) =
          smla_pack_bf2_rn(acc[4 * i + 2 * half], acc[4 * i + 2 * half + 1]);
    }
  asm volatile("bar.sync %0, 128;" ::"r"(1 + wg) : "memory");  // the warpgroup's staging half is written
  // 16 bytes a thread, 16 threads a 256-byte row piece: thread tw reads piece pc = tw % 16 of rows tw / 16 + 8 it,
  // so its staging offset (row % 8 fixed) and interm address step by constants (no per-piece index arithmetic).
  const int pc = tw % 16, row0 = tw / 16;
  const char* src = so + (pc >> 3) * DKW_OCHUNK + row0 * 128 + smla_swz128_piece(row0, pc);
  smla_bf16* dst = p.interm + ((long long)t * p.r_chunk + tile * 64 + row0) * SMLA_D + d0 + 128 * wg + pc * 8;
  const int rows = p.r_chunk - tile * 64 - row0;  // rows of the chunk from row0 on
#pragma unroll
  for (int it = 0; it < 8; ++it) {
    if (8 * it < rows)
      *reinterpret_cast<uint4*>(dst + 8 * it * SMLA_D) = *reinterpret_cast<const uint4*>(src + 8 * it * 128);
  }
}

// Issue k-steps [K0, K1) of D = A_tile (64 x 2H, K-major, at `aa`) * B (2H x 128, MN-major, at `ab`) into acc.
// (The first k-step ignores acc's old value: no zeroing that would touch registers of an MMA in flight.)
template <int K0, int K1>
__device__ __forceinline__ void dkw_mma_steps(float (&acc)[64], unsigned aa, unsigned ab) {
#pragma unroll
  for (int kk = K0; kk < K1; ++kk) {
    const unsigned long long da = smla_wgmma_desc(aa + (kk >> 2) * DKW_ACHUNK + (kk & 3) * 32, 16, 1024);
    const unsigned long long db = smla_wgmma_desc(ab + kk * 2048, DKW_BCHUNK, 1024);
    smla_wgmma_m64n128k16<0, 1>(acc, da, db, kk > 0);
  }
}
// Issue (not wait for) the whole of it.
__device__ __forceinline__ void dkw_mma(float (&acc)[64], unsigned aa, unsigned ab) {
  smla_fence_regs(acc);
  smla_wgmma_fence();
  dkw_mma_steps<0, DKW_K / 16>(acc, aa, ab);
  smla_wgmma_commit();
}

// Both bodies' shared memory: B at the first 1024-byte boundary (the host asks for 1 KB of slack), then the three
// A slots (then dkv_impl 3's mbarriers).
__device__ __forceinline__ void dkw_carve(uint4* smem, char*& sB, char*& sA) {
  sB = smla_align1024(reinterpret_cast<char*>(smem));
  sA = sB + DKW_BBYTES;
}

#if !DKW_PRODUCER
extern "C" __global__ void __launch_bounds__(DKW_THREADS, 1) smla_dkv_interm(SmlaParams p) {
  extern __shared__ uint4 smem_u4[];
  char *sB, *sA;
  dkw_carve(smem_u4, sB, sA);

  // The two column blocks of a token are neighbours in launch order: the second reads the token's
  // [ds | pm] rows from L2.
  const int t = blockIdx.x / (SMLA_D / 256);
  const int d0 = (blockIdx.x % (SMLA_D / 256)) * 256;
  const int wg = threadIdx.x / 128;

  // The tiles run: those up to the token's last valid slot of the chunk (smla_valid_slots_*), its indices loaded
  // before the copies below and reduced after them; the count is known after the first barrier (tile 0's land()).
  const int* topk_row = smla_topk_row(p, t);
  int kvs[4];
  smla_valid_slots_load<DKW_THREADS>(p, topk_row, threadIdx.x, kvs);
  // Tile 0 with B's first quarter of rows (K 0 .. H / 2 - 1), then B's other three quarters, then tiles 1 and 2
  // (slots 1, 2): one commit group each (maybe empty), so tile 0's MMA can start on B's first quarter while the
  // rest lands (B alone, 128 KB, is most of a block's wait: perf notes v17). In the loop, wait<1> is "tile i + 1
  // has landed" when tile i + 2's group is the only one that may still be in flight. Issued for the chunk's tiles
  // before the run is known (a tile past it is copied and never read).
  const int n_chunk_tiles = (p.r_chunk + 63) / 64;
  if (n_chunk_tiles > 0) dkw_load_a(p, sA, t, 0);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    dkw_load_b(p, sB, t, d0, threadIdx.x, DKW_THREADS, q * DKW_K / 4, (q + 1) * DKW_K / 4);
    smla_cp_async_commit();
  }
#pragma unroll
  for (int j = 1; j < 3; ++j) {
    if (j < n_chunk_tiles) dkw_load_a(p, sA + j * DKW_ASLOT, t, j);
    smla_cp_async_commit();
  }
  __shared__ int s_last[DKW_THREADS / 32];
  smla_valid_slots_reduce<DKW_THREADS>(p, topk_row, threadIdx.x, kvs, s_last);

  const unsigned ab = smla_smem_addr(sB) + 2 * wg * DKW_BCHUNK;
  const unsigned aa0 = smla_smem_addr(sA);

  // Software pipeline, two accumulators: step i issues the MMA of tile i, then finishes tile i - 1
  // while it runs: bf16 staging in tile i - 1's own A slot (free: both warpgroups' MMA of it were
  // waited for at the end of step i - 1), coalesced stores, and that slot refilled with tile i + 2;
  // then it waits for tile i's MMA. The commit group of tile j is the j-th, so "tile i has landed"
  // is wait<1> (wait<2> for tile 0). No wgmma is in flight across a branch: ptxas serializes every
  // wgmma of the kernel (C7514) when the loop carries one over its back edge.
  float acc0[64], acc1[64];
  auto land = [&]() {
    smla_fence_proxy_async();  // this thread's copies and zero rows, for wgmma
    __syncthreads();           // the tile has landed for everyone; the slot of tile i - 1 is free
  };
  smla_cp_async_wait<5>();  // tile 0 and B's first quarter
  land();
  const int n_tiles = (smla_valid_slots_end<DKW_THREADS / 32>(s_last) + 63) / 64;
  if (n_tiles == 0) {
    smla_cp_async_wait<0>();  // no copy may land after the block is gone
    return;
  }
  auto finish = [&](const float (&acc)[64], int j) {
    char* slot = sA + (j % 3) * DKW_ASLOT;
    dkw_store_tile(p, acc, slot + wg * DKW_OBYTES, t, d0, j);
    __syncthreads();  // both warpgroups have read their staging halves back
    if (j + 3 < n_tiles) dkw_load_a(p, slot, t, j + 3);
    smla_cp_async_commit();
  };
  // Tile 0's MMA a quarter of K at a time, each quarter issued once B's rows for it have landed.
  constexpr int KQ = DKW_K / 64;  // k-steps of a quarter
  smla_fence_regs(acc0);
  smla_wgmma_fence();
  dkw_mma_steps<0, KQ>(acc0, aa0, ab);
  smla_cp_async_wait<4>();
  land();
  dkw_mma_steps<KQ, 2 * KQ>(acc0, aa0, ab);
  smla_cp_async_wait<3>();
  land();
  dkw_mma_steps<2 * KQ, 3 * KQ>(acc0, aa0, ab);
  smla_cp_async_wait<2>();
  land();
  dkw_mma_steps<3 * KQ, 4 * KQ>(acc0, aa0, ab);
  smla_wgmma_commit();
  smla_wgmma_wait<0>();
  smla_fence_regs(acc0);
  // Step i: tile i's MMA into `next` while tile i - 1 (in `cur`) is finished. The loop is unrolled
  // by two so that each accumulator keeps fixed registers.
  auto step = [&](float (&next)[64], float (&cur)[64], int i) {
    smla_cp_async_wait<1>();
    land();
    dkw_mma(next, aa0 + (i % 3) * DKW_ASLOT, ab);
    finish(cur, i - 1);
    smla_wgmma_wait<0>();
    smla_fence_regs(next);
  };
  for (int i = 1;; i += 2) {
    if (i >= n_tiles) break;
    step(acc1, acc0, i);
    if (i + 1 >= n_tiles) break;
    step(acc0, acc1, i + 1);
  }
  __syncthreads();  // (land() did this before every other finish)
  if (n_tiles & 1)
    finish(acc0, n_tiles - 1);
  else
    finish(acc1, n_tiles - 1);
  smla_cp_async_wait<0>();  // tiles 1-2 when the run is shorter than the chunk: no copy may land after the block
}
#else  // DKW_PRODUCER: dkv_impl 3
#include "sm90_sync.cuh"

// dkv_impl 3: the same product with a producer warpgroup and one 64 x 256 tile per consumer warpgroup.
//   warpgroup 2 (producer, setmaxnreg 56): B and tiles 0-2 at once, then tile j >= 3 into slot j % 3 once
//            empty[j % 3] says tile j - 3's MMA is done with it (cp.async, zero rows past the chunk); every tile
//            fenced for the async proxy and announced on full[slot] as it lands
//   warpgroups 0-1 (consumers, setmaxnreg 224): warpgroup w takes tiles w, w + 2, ...: D (64 x 256, fp32, 128
//            registers) = A_tile B with m64n256k16 (A read once per k-step instead of once per warpgroup: the N 128
//            form of dkv_impl 2 asks shared memory for 2 x 6 KB per two 64-cycle steps, more than its 128 B a
//            cycle), then arrives on empty[slot] and stores D from its registers (8-byte pieces, two lanes of a
//            quad swapping one word, so that a warp writes whole 32-byte sectors): no staging, no block barrier;
//            one warpgroup's stores overlap the other's MMA.
// Measured (docs/perf-notes.md v10): 9% faster than dkv_impl 2 at H 64 with 10 tiles a chunk (the planner's choice
// there); even at H 128, where dkv_interm is bound by its memory traffic rather than its MMA rate, and slower with
// 3 tiles a chunk (the 2 : 1 split of tiles between the consumers).
#define DKW_BLOCK_THREADS (NUM_WARPS * 32)
#ifndef DKW_REGS_CONSUMER  // (overridable only so that a test can show the check below refusing a split)
#define DKW_REGS_CONSUMER 224
#endif
#ifndef DKW_REGS_PRODUCER
#define DKW_REGS_PRODUCER 56
#endif
static_assert(smla_setmaxnreg_fits(2, DKW_REGS_CONSUMER, DKW_REGS_PRODUCER), "setmaxnreg: more than the block's registers");

// D of one tile (64 rows x 256 columns, this warpgroup's fragments) -> bf16 -> interm rows tile * 64 + .., columns
// d0 + ..; d[4 i + 2 half + e] is row 16 warp + lane / 4 + 8 half, column 8 i + 2 (lane % 4) + e.
__device__ __forceinline__ void dkw_store_direct(const SmlaParams& p, const float (&acc)[128], int t, int d0, int tile) {
  const int tw = threadIdx.x % 128, warp = tw / 32, lane = tw % 32;
  const bool odd = lane & 1;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int rr = tile * 64 + 16 * warp + lane / 4 + 8 * half;
    const bool ok = rr < p.r_chunk;  // every lane shuffles; only rows of the chunk are stored
    smla_bf16* dst = p.interm + ((long long)t * p.r_chunk + rr) * SMLA_D + d0 + 2 * (lane % 4 & ~1);
#pragma unroll
    for (int i = 0; i < 32; i += 2) {
      const unsigned w0 = smla_pack_bf2_rn(acc[4 * i + 2 * half], acc[4 * i + 2 * half + 1]);
      const unsigned w1 = smla_pack_bf2_rn(acc[4 * (i + 1) + 2 * half], acc[4 * (i + 1) + 2 * half + 1]);
      const unsigned got = SMLA_SHFL_XOR(odd ? w0 : w1, 1);
      if (ok) *reinterpret_cast<uint2*>(dst + 8 * (i + (odd ? 1 : 0))) = odd ? make_uint2(got, w1) : make_uint2(w0, got);
    }
  }
}

extern "C" __global__ void __launch_bounds__(DKW_BLOCK_THREADS, 1) smla_dkv_interm(SmlaParams p) {
  extern __shared__ uint4 smem_u4[];
  char *sB, *sA;
  dkw_carve(smem_u4, sB, sA);
  const unsigned bfull = smla_smem_addr(sA + 3 * DKW_ASLOT), full0 = bfull + 8, empty0 = full0 + 24;

  const int t = blockIdx.x / (SMLA_D / 256);
  const int d0 = (blockIdx.x % (SMLA_D / 256)) * 256;
  if (threadIdx.x == 0) {
    smla_mbar_init(bfull, 128);
    for (int s = 0; s < 3; ++s) {
      smla_mbar_init(full0 + 8 * s, 128);
      smla_mbar_init(empty0 + 8 * s, 128);
    }
  }
  // B and tiles 0-2 (the three free slots) by the producer at once, one commit group each (empty past the chunk's
  // tiles), before the barrier: in flight while the consumers read the token's indices. The tiles run are those up
  // to the chunk's last valid slot (smla_valid_slots_*); a tile of 0-2 past it is copied and never read.
  const int n_chunk_tiles = (p.r_chunk + 63) / 64;
  __shared__ int s_last[256 / 32];
  if (threadIdx.x >= 256) {
    const int tp = threadIdx.x - 256;
    dkw_load_b(p, sB, t, d0, tp, 128);
    smla_cp_async_commit();
#pragma unroll
    for (int j = 0; j < 3; ++j) {
      if (j < n_chunk_tiles) dkw_load_a(p, sA + j * DKW_ASLOT, t, j, tp, 128);
      smla_cp_async_commit();
    }
  } else {
    const int* topk_row = smla_topk_row(p, t);
    int kvs[4];
    smla_valid_slots_load<256>(p, topk_row, threadIdx.x, kvs);
    smla_valid_slots_reduce<256>(p, topk_row, threadIdx.x, kvs, s_last);
  }
  __syncthreads();  // the only block-wide barrier
  const int n_tiles = (smla_valid_slots_end<256 / 32>(s_last) + 63) / 64;

  if (threadIdx.x >= 256) {  // ---- producer
    smla_setmaxnreg_dec<DKW_REGS_PRODUCER>();
    const int tp = threadIdx.x - 256;
    // Each of B and tiles 0-2 announced as it lands (smla_cp_async_announce: wait, proxy fence, arrive); an arrival
    // for a tile past the run is one nobody waits for.
    smla_cp_async_announce<3>(bfull);
    smla_cp_async_announce<2>(full0);
    if (n_chunk_tiles > 1) smla_cp_async_announce<1>(full0 + 8);
    if (n_chunk_tiles > 2) smla_cp_async_announce<0>(full0 + 16);
    // Then tile j (>= 3) into slot j % 3 once tile j - 3's MMA is done with it. One commit group behind: after
    // issuing tile j it waits for tile j - 1 (issued earlier; the consumer that needs it next is still busy with
    // tile j - 3's stores) and announces that one.
    for (int j = 3; j < n_tiles; ++j) {
      const int s = j % 3;
      smla_mbar_wait(empty0 + 8 * s, (j / 3 - 1) & 1);
      dkw_load_a(p, sA + s * DKW_ASLOT, t, j, tp, 128);
      smla_cp_async_commit();
      if (j > 3) smla_cp_async_announce<1>(full0 + 8 * ((j - 1) % 3));
    }
    if (n_tiles > 3) smla_cp_async_announce<0>(full0 + 8 * ((n_tiles - 1) % 3));
    return;
  }

  // ---- consumers
  smla_setmaxnreg_inc<DKW_REGS_CONSUMER>();
  const int wg = threadIdx.x / 128;
  const unsigned ab = smla_smem_addr(sB), aa0 = smla_smem_addr(sA);
  smla_mbar_wait(bfull, 0);
  float acc[128];
  for (int j = wg; j < n_tiles; j += 2) {
    const int s = j % 3;
    smla_mbar_wait(full0 + 8 * s, (j / 3) & 1);
    // D = A_tile (64 x 2H, K-major) * B (2H x 256, MN-major); the first k-step ignores acc's old value. Issued and
    // waited for inside the iteration: no wgmma is in flight across the back edge (ptxas would serialize them all).
    smla_fence_regs(acc);
    smla_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < DKW_K / 16; ++kk) {
      const unsigned long long da = smla_wgmma_desc(aa0 + s * DKW_ASLOT + (kk >> 2) * DKW_ACHUNK + (kk & 3) * 32, 16, 1024);
      const unsigned long long db = smla_wgmma_desc(ab + kk * 2048, DKW_BCHUNK, 1024);
      smla_wgmma_m64n256k16<0, 1>(acc, da, db, kk > 0);
    }
    smla_wgmma_commit();
    smla_wgmma_wait<0>();
    smla_fence_regs(acc);
    smla_mbar_arrive(empty0 + 8 * s);  // this thread's wgmma are done with the slot
    dkw_store_direct(p, acc, t, d0, j);
  }
}
#endif  // DKW_PRODUCER
