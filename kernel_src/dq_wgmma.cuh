// dq_wgmma.cuh: the sm_90a body of dq.cu (included when DQ_WGMMA is 1): per chunk of the top-k,
// recompute S and dP, emit P and scale*dS (bf16), accumulate dQ, with warpgroup MMA (wgmma).
//
// A block owns one token t and 64 heads (wgmma's M) and runs two warpgroups (256 threads).
// At chunk 0 it also computes delta = rowsum(O * dO) and the natural-log lse of its heads (O read
// while Q and dO land; dO from shared memory) and writes both for d_sink and the later chunks: on
// CUDA the separate delta phase is not planned with this body (kernels_cuda.cpp).
// Shared memory, every operand in 1024-byte aligned atoms with the 128-byte swizzle (wgmma.cuh):
//   sQ, sDO  [8 column chunks][64 heads][64 columns]     K-major A of S and dP     64 KB each
//   sKV[2]   [8 column chunks][BLOCK_R rows][64 columns] K-major B of S and dP,    BLOCK_R KB each
//                                                        and MN-major B of dQ
//   sPf      fp32 halves of S and dP exchanged between the warpgroups (register order)
//   sP, sDS  bf16 [BLOCK_R slots][64 heads]              MN-major A of dQ (sDS); both leave for
//                                                        pm/ds in 16-byte pieces
//   sFlag    [2][BLOCK_R] validity of each kv row
//   sIdx     [2][BLOCK_R] top-k indices of the next two tiles (cp.async two tiles ahead, so that no
//            global load of an index sits between a barrier and the copies that need it), in the
//            order of dqw_idx_slot: a thread's 8 rows are consecutive
// Per kv tile of BLOCK_R rows (cp.async by every thread, double-buffered, empty slots as zero rows,
// issued by the previous tile right after its S/dP wgmma instructions):
//   warpgroup 0: S = Q K^T, warpgroup 1: dP = dO K^T (64 heads x BLOCK_R rows, fp32 registers)
//   exchange: each hands the other half of its tile (fp32), then warpgroup 0 makes P and scale*dS
//            for slots 0-15 and warpgroup 1 for slots 16-31 -> sP and sDS (bf16)
//   both:     dQ[:, 256 w .. 256 w + 255] += dS (64 x BLOCK_R) K (BLOCK_R x 256), fp32 in registers
// Measured on the H200 (docs/perf-notes.md, v2): splitting the element work this way beat one
// warpgroup making P and the other dS; having only warpgroup 0 issue the copies was slower.
// The host sizes shared memory with smla_dq_wgmma_smem_bytes() (common.cuh).
//
// With DQW_PRODUCER 1 (dq_impl 3, the planner's choice on sm_90a past one chunk of 256 slots; NUM_WARPS 12) a third
// warpgroup issues the kv copies:
//   warpgroups 0-1 (consumers, setmaxnreg 224): everything above but the copies; they wait for a tile on the
//            mbarrier full[buf] and hand its buffer back through empty[buf] once their dQ wgmma is done, and
//            synchronize among themselves on named barrier 1 (256 threads) instead of the block barrier
//   warpgroup 2 (producer, setmaxnreg 56): per tile, waits for empty[buf], reads the tile's 32 indices from
//            global memory (one tile ahead), copies the rows (cp.async, zero rows for empty slots), waits for
//            its own copies, fences them for the async proxy and arrives on full[buf]
//   sIdx holds the four mbarriers instead of indices; delta and lse are handed over in sP instead of sPf (the
//   first exchange may start before every consumer has read them: no block barrier at the top of a tile).
// Why: the consumers issue the copies between their wgmma in the two-warpgroup body; knocked out, dq ran
// 2.70 -> 2.33 ms at the seed (perf notes v7), which bounds what this body can gain.
//
// With DQW_PERSIST 1 as well (dq_impl 4; the host launches at most one CTA an SM, KernelSpec::persistent) each CTA
// takes the blocks blockIdx.x, + gridDim.x, ... (block = token t, heads h0; t fastest) in turn:
//   producer: per block, loads the token's top-k chunk and counts the run (the tiles up to the last valid slot, as
//            dq_impl 3), waits on qfree until the consumers are done with the last block's Q and dO (they arrive
//            after their last tile's S/dP wgmma: nothing reads Q or dO after it), copies this block's Q and dO,
//            then the run's kv tiles as above; Q and dO are announced on qfull with tile 0, the run in s_nt. Its
//            tile count g runs on over the blocks (buffer g % 2, mbarrier phase g / 2). Before a block's last tile's
//            copies (DQW_PF_LEAD) it prefetches the CTA's next block's Q, dO, O rows and top-k chunk into L2.
//   consumers: per block, named barrier 1 (sP, which holds delta, is free), wait qfull, the fused delta with O in
//            two rounds of four heads (32 registers), the tiles, the epilogue: at the last chunk the bf16 dQ staged
//            through the last tile's kv buffer in two passes of 32 heads, that buffer handed back after it (Q and
//            dO's buffers may hold the next block's rows by then); an earlier chunk's fp32 carry from fragments.
// So the next block's Q/dO copies run during this block's last element stage, dQ MMA, P/dS stores and epilogue.
// setmaxnreg 208 / 88: the split with no local memory for this body (224 / 56 spilled the producer's block loop).
// Measured on the H200 (perf notes v12), before the run count, the staged epilogue and the prefetch: correct, but not
// faster than dq_impl 3: dq 2.47 against 2.41 ms at the seed, 1.22 against 1.20 at TOPK 160 (end to end even there).
// The overlapped copies bought nothing then (with qfree moved after the epilogue, no overlap at all, it ran the same);
// prefetching the O rows into L2 was slower (+0.035 ms). With them (v25, v28): dq 1.214 -> 1.083 ms at TOPK 160,
// even from 320 slots up; the planner's choice where the top-k is one chunk of 256 slots or fewer.
//
// With DQW_INTERM 1 (dkv_impl 4, the planner's at H 64: a block then holds every head of its token) the producer body
// (dq_impl 3) writes interm itself instead of P and dS: sP and sDS hold two tiles, and after every second tile (and the
// last) the consumers compute the pair's interm rows from them and from sQ / sDO (dqw_interm_pair); no dkv_interm
// kernel runs. 8 KB more shared memory (the second tile of P and dS). Measured on an H100 (perf notes v29): dq 1.2 ->
// 2.0 ms and dkv_interm's 1.2 ms gone at 4096,64,5120,640, -15% end to end (the H200, v30: -8.5%, its dkv_interm being
// faster); outputs bitwise dkv_impl 3's.
#include "wgmma.cuh"
#include "sm90_sync.cuh"  // the producer body's mbarriers, named barrier and setmaxnreg

#ifndef DQW_PRODUCER
#define DQW_PRODUCER 0
#endif
#ifndef DQW_PERSIST
#define DQW_PERSIST 0  // 1 (dq_impl 4): the producer body, persistent (see below)
#endif
// dq_impl 3 runs the tiles up to its token's last valid slot of the chunk only (smla_valid_slots_*, common.cuh). Its
// consumers load the chunk's indices first thing and reduce them before their post-delta barrier; the producer loads
// them before its tile 0 and reduces them after issuing it (a barrier of its own four warps). Neither waits on the
// read before its first copies. dq_impl 4 runs the same tiles, counted by its producer alone (dqw_producer_persist,
// handed over in s_nt); dq_impl 2 runs every tile of the chunk.
#define DQW_SKIP (DQW_PRODUCER && !DQW_PERSIST)
#ifndef DQW_INTERM
#define DQW_INTERM 0  // 1 (dkv_impl 4): interm rows written here, not P and dS (see dqw_interm_pair)
#endif
#if DQW_INTERM && (!DQW_PRODUCER || DQW_PERSIST || HEADS != 64)
// (dq_impl 4's consumers, at setmaxnreg 208, spill with it: 516 bytes, and ptxas serializes the wgmma; not planned.)
#error "the fused interm needs the producer body (dq_impl 3) and H 64 (a block holds every head of its token)"
#endif
#if DQW_PERSIST && !DQW_PRODUCER
#error "the persistent dq body is the producer body's (DQW_PRODUCER 1)"
#endif

#if BLOCK_H != 64
#error "the wgmma dq body needs BLOCK_H == 64 (wgmma's M)"
#endif
#if BLOCK_R != 32
#error "the wgmma dq body needs BLOCK_R == 32 (two kv buffers next to 128 KB of Q and dO)"
#endif
#if !DQW_PRODUCER && NUM_WARPS != 8
#error "the wgmma dq body runs two warpgroups (NUM_WARPS 8)"
#endif
#if DQW_PRODUCER && NUM_WARPS != 12
#error "the wgmma dq body with a producer runs three warpgroups (NUM_WARPS 12)"
#endif

#define DQW_THREADS 256                        // the threads that compute (all of them without a producer)
#define DQW_BLOCK_THREADS (NUM_WARPS * 32)
#define DQW_QBYTES (64 * 1024)                 // one of sQ / sDO
#define DQW_KVCHUNK (BLOCK_R * 128)            // one 64-column chunk of a kv buffer
#define DQW_KVBYTES (8 * DQW_KVCHUNK)          // one kv buffer
#define DQW_PF_BYTES (64 * BLOCK_R * 4)
#define DQW_T_BYTES (BLOCK_R * 128)            // one tile of sP or sDS
#define DQW_T_ALL (DQW_INTERM ? 2 * DQW_T_BYTES : DQW_T_BYTES)  // sP or sDS: two tiles for the fused interm
#define DQW_LOG2E 1.4426950408889634f
#define DQW_DELTA_HEADS (64 / (DQW_THREADS / 32))  // heads of the fused delta per warp
// Head (0..63 in the block) of a warp's j-th fused-delta row.
__device__ __forceinline__ int dqw_delta_head(int j) { return (threadIdx.x / 32) * DQW_DELTA_HEADS + j; }
// The carve below, plus the alignment slack, is what the host asks for (common.cuh).
static_assert(2 * DQW_QBYTES + 2 * DQW_KVBYTES + DQW_PF_BYTES + 2 * DQW_T_ALL + 2 * BLOCK_R * 4 + 2 * BLOCK_R * 4 + 1024 ==
                  smla_dq_wgmma_smem_bytes(BLOCK_R, DQW_INTERM),
              "dq_wgmma's shared-memory carve and smla_dq_wgmma_smem_bytes() disagree");
SMLA_CHECK_SMEM(smla_dq_wgmma_smem_bytes(BLOCK_R, DQW_INTERM));

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "the wgmma dq body needs sm_90a"
#endif

// This lane's share of rowsum(O * dO) for head hh of the block: its 16 columns of O (two 16-byte pieces, `o`, from
// global memory) against dO's in shared memory (swizzled, `sdo`).
__device__ __forceinline__ float dqw_delta_dot(const uint4 (&o)[2], const char* sdo, int hh) {
  float sum = 0.f;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int c = half * 32 + threadIdx.x % 32;  // 16-byte piece of the row
    const uint4 gv = *reinterpret_cast<const uint4*>(sdo + (c >> 3) * (64 * 128) + smla_swz128(hh, (c & 7) * 8));
    const unsigned ow[4] = {o[half].x, o[half].y, o[half].z, o[half].w};
    const unsigned gw[4] = {gv.x, gv.y, gv.z, gv.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      sum = fmaf(smla_lo_f(ow[e]), smla_lo_f(gw[e]), sum);
      sum = fmaf(smla_hi_f(ow[e]), smla_hi_f(gw[e]), sum);
    }
  }
  return sum;
}

// Four 8 x 8 bf16 blocks from fragment registers (w[m]: the two elements of row lane / 4, columns 2 (lane % 4), + 1,
// of block m) into shared memory: row j of block m at the address lane 8 m + j gives; TRANS: transposed (row j of
// the stored block is column j of block m).
template <bool TRANS>
__device__ __forceinline__ void dqw_stmatrix_x4(unsigned addr, const unsigned (&w)[4]) {
  if constexpr (TRANS)
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(w[0]),
                 "r"(w[1]), "r"(w[2]), "r"(w[3])
                 : "memory");
  else
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(w[0]),
                 "r"(w[1]), "r"(w[2]), "r"(w[3])
                 : "memory");
}

// f(h, d, v0, v1) on each of this thread's 64 dQ fragment pairs (v0, v1: references into acc): acc[4 i + 2 half + e] is
// head h0 + hl_a (half 0) or hl_b (half 1), column 256 wg + 8 i + 2 (lane % 4) + e.
template <class F>
__device__ __forceinline__ void dqw_each_pair(float (&acc)[128], int h0, int hl_a, int hl_b, int wg, int lane, F&& f) {
#pragma unroll
  for (int i = 0; i < 32; ++i)
#pragma unroll
    for (int half = 0; half < 2; ++half)
      f(h0 + (half ? hl_b : hl_a), 256 * wg + 8 * i + 2 * (lane % 4), acc[4 * i + 2 * half], acc[4 * i + 2 * half + 1]);
}

// This warp's 16 rows of the warpgroup's dQ half as bf16 into a staging buffer with stmatrix (dq_impl 3's and 4's
// epilogues): lane group mb = lane / 8 addresses row r (8 (mb % 2) + lane % 8 of the warp's 16, as the caller counts
// rows) and the 16-byte piece piece0 + i + mb / 2 (8 columns) of it for fragment pair i; rows of ROW_BYTES, the piece j
// of row r at j ^ (r % 8), so stmatrix's 8 rows fall on distinct banks.
template <int ROW_BYTES>
__device__ __forceinline__ void dqw_stage_bf16(const float (&acc)[128], unsigned base, int r, int piece0, int mb) {
#pragma unroll
  for (int i = 0; i < 32; i += 2) {
    const unsigned w[4] = {smla_pack_bf2_rn(acc[4 * i], acc[4 * i + 1]),
                           smla_pack_bf2_rn(acc[4 * i + 2], acc[4 * i + 3]),
                           smla_pack_bf2_rn(acc[4 * i + 4], acc[4 * i + 5]),
                           smla_pack_bf2_rn(acc[4 * i + 6], acc[4 * i + 7])};
    const int piece = piece0 + i + (mb >> 1);
    dqw_stmatrix_x4<false>(base + r * ROW_BYTES + ((piece ^ (r & 7)) << 4), w);
  }
}

// Q and dO of the block's heads (token t, heads h0 ..) into sQ and sDO, swizzled: row = head, 8 chunks of 64
// columns; 16-byte pieces first, first + stride, ... (the computing threads, or the persistent producer's).
__device__ __forceinline__ void dqw_load_qdo(const SmlaParams& p, char* sQ, char* sDO, int t, int h0, int first,
                                             int stride) {
  for (int i = first; i < 64 * 64; i += stride) {
    const int hh = i / 64, c = i % 64;
    const unsigned off = (c >> 3) * (64 * 128) + smla_swz128(hh, (c & 7) * 8);
    smla_cp_async16(sQ + off, p.q + t * p.q_st + (h0 + hh) * p.q_sh + c * 8);
    smla_cp_async16(sDO + off, p.dout + t * p.do_st + (h0 + hh) * p.do_sh + c * 8);
  }
}

// Slot of a tile's row in `sidx`: the 8 rows r0 + 4 j (j = 0..7) that thread r0 * 64 + c copies are 8 consecutive
// ints, read with two 16-byte loads.
__device__ __forceinline__ int dqw_idx_slot(int row) { return (row % 4) * 8 + row / 4; }

// Top-k indices of tile `tile` of the chunk into `sidx` (BLOCK_R ints); -1 past the chunk or the top-k.
__device__ __forceinline__ void dqw_load_idx(const SmlaParams& p, const int* topk_row, int* sidx, int tile) {
  if (threadIdx.x < BLOCK_R) {
    const int rr = tile * BLOCK_R + threadIdx.x;
    int* dst = sidx + dqw_idx_slot(threadIdx.x);
    if (rr < p.r_chunk && p.r_start + rr < p.topk_n)
      smla_cp_async4(dst, topk_row + rr);
    else
      *dst = -1;
  }
}

// This thread's 8 kv rows of a tile (rows threadIdx / 64 + 4 j) into registers, read before the S/dP wgmma are
// issued: a shared load issued after them queues behind their operand reads, and the copies waited on it
// (measured, perf notes v8: dq 2.70 -> 2.67 ms at the seed).
__device__ __forceinline__ void dqw_read_idx(const int* sidx, int (&k)[8]) {
  static_assert((2 * DQW_QBYTES + 2 * DQW_KVBYTES + DQW_PF_BYTES + 2 * DQW_T_ALL + 2 * BLOCK_R * 4) % 16 == 0 &&
                    BLOCK_R * 4 % 16 == 0,
                "dqw_read_idx: sIdx's buffers must be 16-byte aligned");
  const int4* s = reinterpret_cast<const int4*>(sidx + (threadIdx.x / 64) * 8);
  const int4 a = s[0], b = s[1];
  k[0] = a.x, k[1] = a.y, k[2] = a.z, k[3] = a.w, k[4] = b.x, k[5] = b.y, k[6] = b.z, k[7] = b.w;
}

// 16-byte piece c (0..63) of kv row k into row `row` of the kv buffer at shared address `skv`, with its flag; `swz`
// is row % 8 (the 128-byte swizzle), given by each caller in the form that compiles to the fewest instructions for
// its row mapping. An empty slot (or one past the chunk or the top-k) becomes a zero row with a zero flag: a
// zero-fill copy (src-size 0) of kv row 0, no branch.
__device__ __forceinline__ void dqw_copy_piece(const SmlaParams& p, int k, unsigned skv, int* sflag, int row, int c,
                                               int swz) {
  const bool valid = smla_valid_index(k, p.num_kv);
  const unsigned dst = skv + (c >> 3) * DQW_KVCHUNK + row * 128 + ((((c & 7) ^ swz) & 7) << 4);
  smla_cp_async16_zfill(dst, p.kv + (unsigned long long)(valid ? k : 0) * p.kv_s + c * 8, valid);
  if (c == 0) sflag[row] = valid ? 1 : 0;
}

// Piece j (0..7) of this thread's share of one kv tile (k: the row's index) into the buffer at shared address
// `skv` (two-warpgroup body): 16-byte piece c = threadIdx % 64 of row threadIdx / 64 + 4 j. Everything but the
// row's index is the same for every tile (row % 8 = threadIdx / 64 + 4 (j % 2)), so a piece is a handful of
// instructions.
__device__ __forceinline__ void dqw_load_kv_piece(const SmlaParams& p, int k, unsigned skv, int* sflag, int j) {
  const int r0 = threadIdx.x / 64, c = threadIdx.x % 64;
  dqw_copy_piece(p, k, skv, sflag, r0 + 4 * j, c, r0 + 4 * (j & 1));
}
static_assert(BLOCK_R * 64 / DQW_THREADS == 8 && DQW_THREADS == 256, "dqw_load_kv_piece: 8 pieces, rows r0 + 4 j");

// The whole kv tile: the 8 pieces of every thread (its indices from dqw_read_idx).
__device__ __forceinline__ void dqw_load_kv(const SmlaParams& p, const int (&k)[8], unsigned skv, int* sflag) {
#pragma unroll
  for (int j = 0; j < BLOCK_R * 64 / DQW_THREADS; ++j) dqw_load_kv_piece(p, k[j], skv, sflag, j);
}

#if DQW_PRODUCER
// The consumers' barrier (named barrier 1, the 256 computing threads).
__device__ __forceinline__ void dqw_sync() { smla_named_sync<1, DQW_THREADS>(); }
#ifndef DQW_REGS_CONSUMER  // (overridable only so that a test can show the check below refusing a split)
#define DQW_REGS_CONSUMER (DQW_PERSIST ? 208 : 224)  // persistent: 208 / 88, the split with no local memory
#endif
#ifndef DQW_REGS_PRODUCER
#define DQW_REGS_PRODUCER (DQW_PERSIST ? 88 : 56)
#endif
static_assert(smla_setmaxnreg_fits(2, DQW_REGS_CONSUMER, DQW_REGS_PRODUCER), "setmaxnreg: more than the block's registers");
#define DQW_PROD_THREADS 128  // the producer warpgroup
#define DQW_PROD_ROWS (BLOCK_R / 2)  // kv rows a producer thread copies a piece of: rows 16 (tp / 64) + j

// Producer thread tp's indices of tile `tile`: rows 16 (tp / 64) + j; -1 past the chunk or the top-k.
__device__ __forceinline__ void dqw_prod_idx(const SmlaParams& p, const int* topk_row, int tile, int (&k)[DQW_PROD_ROWS]) {
  const int tp = threadIdx.x - DQW_THREADS;
#pragma unroll
  for (int j = 0; j < DQW_PROD_ROWS; ++j) {
    const int rr = tile * BLOCK_R + (tp / 64) * DQW_PROD_ROWS + j;
    k[j] = rr < p.r_chunk && p.r_start + rr < p.topk_n ? __ldg(topk_row + rr) : -1;
  }
}

// One kv tile of the chunk by the producer warpgroup, the g-th of the kernel (buffer g % 2): waits until the buffer's
// previous tile (g - 2) has been consumed (its dQ wgmma are done), copies this thread's pieces of the rows (indices
// k; piece c of rows rbase + j) and commits them, then loads tile + 1's indices into k while they are in flight. The
// caller announces.
__device__ __forceinline__ void dqw_produce_tile(const SmlaParams& p, const int* topk_row, int (&k)[DQW_PROD_ROWS],
                                                 int tile, int n_tiles, int g, int c, int rbase, unsigned akv0,
                                                 int* sFlag, unsigned empty0) {
  const int buf = g & 1;
  if (g >= 2) smla_mbar_wait(empty0 + 8 * buf, ((g >> 1) - 1) & 1);
  const unsigned skv = akv0 + buf * DQW_KVBYTES;
  int* flag = sFlag + buf * BLOCK_R;
#pragma unroll
  for (int j = 0; j < DQW_PROD_ROWS; ++j) dqw_copy_piece(p, k[j], skv, flag, rbase + j, c, j & 7);  // row % 8 == j % 8
  smla_cp_async_commit();
  if (tile + 1 < n_tiles) dqw_prod_idx(p, topk_row, tile + 1, k);
}

// The producer warpgroup's loop (dq_impl 3): every tile of the run into buffer tile % 2, in order. The run (the tiles
// up to the chunk's last valid slot, maybe none) is the producer's own count: its warps load the indices before tile
// 0's and reduce them after issuing tile 0 (copied and announced even when the run is empty), then meet at named
// barrier 2 (s_last: one int a producer warp).
__device__ __forceinline__ void dqw_producer(const SmlaParams& p, const int* topk_row, int n_chunk_tiles, unsigned akv0,
                                             int* sFlag, unsigned full0, unsigned empty0, int* s_last) {
  const int tp = threadIdx.x - DQW_THREADS, c = tp % 64, rbase = (tp / 64) * DQW_PROD_ROWS;
  int kvs[4];
  smla_valid_slots_load<DQW_PROD_THREADS>(p, topk_row, tp, kvs);
  int k[DQW_PROD_ROWS];
  dqw_prod_idx(p, topk_row, 0, k);
  dqw_produce_tile(p, topk_row, k, 0, n_chunk_tiles, 0, c, rbase, akv0, sFlag, empty0);
  smla_valid_slots_reduce<DQW_PROD_THREADS>(p, topk_row, tp, kvs, s_last);
  smla_named_sync<2, DQW_PROD_THREADS>();
  const int n_tiles = (smla_valid_slots_end<DQW_PROD_THREADS / 32>(s_last) + BLOCK_R - 1) / BLOCK_R;
  smla_cp_async_announce<0>(full0);  // tile 0: this thread's copies and zero rows, for wgmma
  for (int tile = 1; tile < n_tiles; ++tile) {
    dqw_produce_tile(p, topk_row, k, tile, n_tiles, tile, c, rbase, akv0, sFlag, empty0);
    smla_cp_async_announce<0>(full0 + 8 * (tile & 1));
  }
}

#if DQW_PERSIST
#ifndef DQW_PF_LEAD
// Tiles from a block's end at which the producer prefetches its CTA's next block (1: before its last tile's copies).
// Perf notes v28, dq_impl 4 end to end: 1 against 3 -1.4% at TOPK 160 (two calls) and -1.9% at 256; no prefetch +2.5%
// at 160; 2, and a prefetch after the last tile's copies, slower than 1 at TOPK 160.
#define DQW_PF_LEAD 1
#endif
__device__ __forceinline__ void dqw_l2_prefetch_line(const void* a) { asm volatile("prefetch.global.L2 [%0];" ::"l"(a)); }
// Block `blk`'s Q, dO and O rows and its top-k chunk into L2 (prefetch.global.L2, one 128-byte line an instruction, no
// register written): thread tp the row of head tp % 64 of Q (tp < 64) or dO, threads 0-63 that head's O row too.
__device__ __forceinline__ void dqw_prefetch_block(const SmlaParams& p, int blk) {
  if (blk >= p.T * (HEADS / 64)) return;
  const int t = blk % p.T, h0 = (blk / p.T) * 64;
  const int tp = threadIdx.x - DQW_THREADS, hh = tp % 64;
  const smla_bf16* row = tp < 64 ? p.q + t * p.q_st + (h0 + hh) * p.q_sh : p.dout + t * p.do_st + (h0 + hh) * p.do_sh;
#pragma unroll
  for (int seg = 0; seg < 8; ++seg) dqw_l2_prefetch_line(row + seg * 64);
  if (tp < 64) {
    const smla_bf16* orow = p.o + t * p.o_st + (h0 + hh) * p.o_sh;
#pragma unroll
    for (int seg = 0; seg < 8; ++seg) dqw_l2_prefetch_line(orow + seg * 64);
  }
  if (tp * 32 < smla_chunk_slots(p)) dqw_l2_prefetch_line(smla_topk_row(p, t) + tp * 32);
}

// The persistent producer: the blocks blockIdx.x, + gridDim.x, ... in turn. Per block it loads the token's top-k
// indices (the run: the tiles up to the chunk's last valid slot, as dq_impl 3), waits on qfree until the consumers are
// done reading the previous block's Q and dO (they arrive after their last S/dP wgmma), copies this block's Q and dO
// rows (one commit group), then its kv tiles as dqw_producer does; the run's tile count goes to s_nt[it % 2] and Q and
// dO are announced on qfull once their group has landed (with tile 0, or alone when the run is empty). DQW_PF_LEAD
// tiles from a block's end (1: its last tile) it prefetches the CTA's next block's start-up rows into L2. g counts
// tiles over the blocks: buffer g % 2, phases g / 2. s_last: [2][producer warps], the run's reduction, a buffer a
// block in turn.
__device__ __forceinline__ void dqw_producer_persist(const SmlaParams& p, char* sQ, char* sDO, unsigned akv0,
                                                     int* sFlag, unsigned full0, unsigned empty0, unsigned qfull,
                                                     unsigned qfree, int (*s_last)[DQW_PROD_THREADS / 32], int* s_nt) {
  const int tp = threadIdx.x - DQW_THREADS, c = tp % 64, rbase = (tp / 64) * DQW_PROD_ROWS;
  const int n_blocks = p.T * (HEADS / 64);
  const int n_chunk_tiles = (p.r_chunk + BLOCK_R - 1) / BLOCK_R;
  int g = 0;
  for (int blk = blockIdx.x, it = 0; blk < n_blocks; blk += gridDim.x, ++it) {
    const int t = blk % p.T, h0 = (blk / p.T) * 64;
    const int* topk_row = smla_topk_row(p, t);
    int kvs[4];
    smla_valid_slots_load<DQW_PROD_THREADS>(p, topk_row, tp, kvs);  // before the copies (smla_valid_slots_*)
    if (it > 0) smla_mbar_wait(qfree, (it - 1) & 1);
    dqw_load_qdo(p, sQ, sDO, t, h0, tp, 128);
    smla_cp_async_commit();
    int k[DQW_PROD_ROWS];
    dqw_prod_idx(p, topk_row, 0, k);
    smla_valid_slots_reduce<DQW_PROD_THREADS>(p, topk_row, tp, kvs, s_last[it & 1]);
    smla_named_sync<2, DQW_PROD_THREADS>();
    const int n_tiles = min((smla_valid_slots_end<DQW_PROD_THREADS / 32>(s_last[it & 1]) + BLOCK_R - 1) / BLOCK_R,
                            n_chunk_tiles);
    if (tp == 0) s_nt[it & 1] = n_tiles;  // read by the consumers after qfull, which this thread's arrival releases
    if (n_tiles == 0) {
      dqw_prefetch_block(p, blk + gridDim.x);
      smla_cp_async_announce<0>(qfull);  // Q and dO (dO for the delta; no tile reads them)
      continue;
    }
    const int pf_tile = max(n_tiles - DQW_PF_LEAD, 0);
    for (int tile = 0; tile < n_tiles; ++tile, ++g) {
      if (tile == pf_tile) dqw_prefetch_block(p, blk + gridDim.x);
      dqw_produce_tile(p, topk_row, k, tile, n_tiles, g, c, rbase, akv0, sFlag, empty0);
      if (tile == 0) smla_cp_async_announce<1>(qfull);  // Q and dO (the group before this tile's)
      smla_cp_async_announce<0>(full0 + 8 * (g & 1));
    }
  }
}
#endif  // DQW_PERSIST
#endif  // DQW_PRODUCER

#if DQW_INTERM
// The fused interm (dkv_impl 4, H 64: a block holds every head of its token, so a slot's interm row is whole here).
// P and dS live in two halves of sP / sDS, a tile's 32 slots each (tile % 2); after every second tile's dQ (and after
// the last tile), the pair's 64 slots get interm = dS^T Q + P^T dO, the product dkv_interm computes from the
// workspace's P and dS, in the same K order (dS's 64 heads, then P's): M = the 64 slots (A = dS^T, P^T: K-major,
// [slot][head] as the dQ product reads them), N = columns (B = Q, dO: MN-major from sQ / sDO, as dQ reads kv).
// Warpgroup wg takes columns 256 wg .. + 255 in two passes of m64n128 (64 fp32 a thread: the S/dP registers are free
// by then and the dQ accumulator keeps its 128), each stored as bf16 to interm rows (t * r_chunk + slot) * 512 in
// rounds of 32 columns through the warp's staging: stmatrix into the 1 KB of sPf that the warp itself writes in the
// next tile's S/dP exchange (so no other warp touches it until this one is through), then 16-byte stores, a row's 64
// bytes by four lanes. (Straight from the fragments, 4-byte stores 16 bytes to a row a warp instruction, the stores
// were a fifth of the kernel's samples, waiting on the memory pipe, on the H100: perf notes v29.) Per 64 slots each
// warpgroup issues 16 m64n128k16 (6 KB of shared-memory operands each) where per-tile m64n32 blocks of interm^T took
// 64 m64n32k16 (3 KB each), measured 26% slower end to end at V4-Flash than dkv_interm (perf notes v29).
__device__ __forceinline__ void dqw_interm_issue(float (&ia)[64], unsigned aq, unsigned ado, unsigned ads, unsigned ap,
                                                 int chunk) {
  smla_fence_regs(ia);
  smla_wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < 4; ++ks)
    smla_wgmma_m64n128k16<0, 1>(ia, smla_wgmma_desc(ads + ks * 32, 16, 1024),
                                smla_wgmma_desc(aq + chunk * (64 * 128) + ks * 2048, 64 * 128, 1024), ks > 0);
#pragma unroll
  for (int ks = 0; ks < 4; ++ks)
    smla_wgmma_m64n128k16<0, 1>(ia, smla_wgmma_desc(ap + ks * 32, 16, 1024),
                                smla_wgmma_desc(ado + chunk * (64 * 128) + ks * 2048, 64 * 128, 1024), 1);
  smla_wgmma_commit();
}

// 16 bytes from shared memory by address.
__device__ __forceinline__ uint4 dqw_ld_shared16(unsigned addr) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}

// The pair `pair`'s interm rows (slots 64 pair ..; those at or past `end`, the run's or the chunk's end, not stored):
// this warpgroup's columns in two passes, issued after the tile's dQ group; `stg`: the shared address of the warp's
// staging rows 0-7 (8 - 15 at + 2048), 64 bytes each, the 16-byte piece m of row r at m ^ ((r / 2) % 4). dq_done()
// runs once the dQ group is complete (groups complete in order: at the first wait that leaves only an interm group in
// flight), so that the kv buffer goes back to the producer before the interm work. Fragment ia[4 i + 2 half + e] is
// slot 16 warp + lane / 4 + 8 half, column 8 i + 2 (lane % 4) + e of the pass's 128.

template <class F>
__device__ __forceinline__ void dqw_interm_pair(const SmlaParams& p, unsigned aq, unsigned ado, unsigned ads,
                                                unsigned ap, unsigned stg, int t, int pair, int end, int wg, int warp,
                                                int lane, F&& dq_done) {
  float ia[64];
  // stmatrix: lane 8 m + j gives row j of block m (slot rows 8 h + j, the round's columns 8 m ..); the read-out: lane
  // reads piece lane % 4 of rows lane / 4 and 8 + lane / 4, and stores it to interm.
  const int j = lane & 7, m = lane >> 3, rj = lane >> 2, rm = lane & 3;
  const unsigned st_addr = stg + j * 64 + ((m ^ ((j >> 1) & 3)) << 4);
  const unsigned rd_addr = stg + rj * 64 + ((rm ^ ((rj >> 1) & 3)) << 4);
  const int slot_a = 64 * pair + 16 * warp + rj;  // the read-out's first slot; the second is 8 on
  smla_bf16* row_a = p.interm + ((long long)t * p.r_chunk + slot_a) * SMLA_D + 256 * wg + 8 * rm;
#pragma unroll
  for (int pass = 0; pass < 2; ++pass) {
    dqw_interm_issue(ia, aq, ado, ads, ap, 4 * wg + 2 * pass);
    if (pass == 0) {
      smla_wgmma_wait<1>();
      dq_done();
    }
    smla_wgmma_wait<0>();
    smla_fence_regs(ia);
#pragma unroll
    for (int k = 0; k < 4; ++k) {  // columns 32 k .. of the pass
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        unsigned w[4];
#pragma unroll
        for (int b = 0; b < 4; ++b)
          w[b] = smla_pack_bf2_rn(ia[4 * (4 * k + b) + 2 * half], ia[4 * (4 * k + b) + 2 * half + 1]);
        dqw_stmatrix_x4<false>(st_addr + half * 2048, w);
      }
      __syncwarp();
      const uint4 v0 = dqw_ld_shared16(rd_addr), v1 = dqw_ld_shared16(rd_addr + 2048);
      __syncwarp();  // every lane has read its pieces before the next round's stmatrix
      smla_bf16* dst = row_a + 128 * pass + 32 * k;
      if (slot_a < end) *reinterpret_cast<uint4*>(dst) = v0;
      if (slot_a + 8 < end) *reinterpret_cast<uint4*>(dst + 8 * SMLA_D) = v1;
    }
  }
}
#endif  // DQW_INTERM

extern "C" __global__ void __launch_bounds__(DQW_BLOCK_THREADS, 1) smla_dq(SmlaParams p) {
  extern __shared__ uint4 smem_u4[];
  // 1024-byte alignment of the swizzle atoms (the host asks for 1 KB more than the carve below).
  char* base = reinterpret_cast<char*>(smem_u4);
  base = smla_align1024(base);
  char* sQ = base;
  char* sDO = sQ + DQW_QBYTES;
  char* sKV = sDO + DQW_QBYTES;  // two buffers
  float* sPf = reinterpret_cast<float*>(sKV + 2 * DQW_KVBYTES);
  char* sP = reinterpret_cast<char*>(sPf) + DQW_PF_BYTES;
  char* sDS = sP + DQW_T_ALL;
  int* sFlag = reinterpret_cast<int*>(sDS + DQW_T_ALL);
  int* sIdx = sFlag + 2 * BLOCK_R;

#if !DQW_PERSIST
  const int t = blockIdx.x;
  const int h0 = blockIdx.y * 64;
#endif
  const int wg = threadIdx.x / 128, tw = threadIdx.x % 128;
  const int warp = tw / 32, lane = tw % 32;
  const int r_chunk = p.r_chunk;
#if !DQW_PERSIST
  const int* topk_row = smla_topk_row(p, t);
#endif
#if DQW_SKIP
  const int n_chunk_tiles = (r_chunk + BLOCK_R - 1) / BLOCK_R;
  __shared__ int s_last_prod[DQW_PROD_THREADS / 32], s_last_cons[DQW_THREADS / 32];
#elif DQW_PERSIST
  // The producer's run reduction (a buffer a block in turn) and each block's run, handed to the consumers with qfull.
  __shared__ int s_last_pp[2][DQW_PROD_THREADS / 32], s_nt[2];
#else
  const int n_tiles = (r_chunk + BLOCK_R - 1) / BLOCK_R;
#endif

#if DQW_PRODUCER
  // sIdx holds full[2] (count: the 128 producer threads) and empty[2] (count: the 256 consumers).
  // The persistent body adds qfull (count 128) and qfree (count 256): Q and dO landed, and done with.
  static_assert(2 * BLOCK_R * 4 >= 6 * 8, "dq producer: six mbarriers in sIdx");
  const unsigned full0 = smla_smem_addr(sIdx), empty0 = full0 + 16;
#if DQW_PERSIST
  const unsigned qfull = full0 + 32, qfree = full0 + 40;
#endif
  if (threadIdx.x == 0) {
    smla_mbar_init(full0, 128);
    smla_mbar_init(full0 + 8, 128);
    smla_mbar_init(empty0, DQW_THREADS);
    smla_mbar_init(empty0 + 8, DQW_THREADS);
#if DQW_PERSIST
    smla_mbar_init(qfull, 128);
    smla_mbar_init(qfree, DQW_THREADS);
#endif
  }
  __syncthreads();  // the last block-wide barrier: from here on the consumers use dqw_sync()
  if (threadIdx.x >= DQW_THREADS) {
    smla_setmaxnreg_dec<DQW_REGS_PRODUCER>();
#if DQW_PERSIST
    dqw_producer_persist(p, sQ, sDO, smla_smem_addr(sKV), sFlag, full0, empty0, qfull, qfree, s_last_pp, s_nt);
#else
    dqw_producer(p, topk_row, n_chunk_tiles, smla_smem_addr(sKV), sFlag, full0, empty0, s_last_prod);
#endif
    return;
  }
  smla_setmaxnreg_inc<DQW_REGS_CONSUMER>();
#define DQW_SYNC() dqw_sync()
#else
#define DQW_SYNC() __syncthreads()
#endif

#if DQW_PERSIST
  // The blocks (token t, heads h0 ..) blockIdx.x, + gridDim.x, ...; g0: the producer's tile count at tile 0 (the
  // runs of the blocks before, each read from s_nt).
  const int n_blocks = p.T * (HEADS / 64);
  int g_next = 0;
  for (int blk = blockIdx.x, it = 0; blk < n_blocks; blk += gridDim.x, ++it) {
    const int t = blk % p.T, h0 = (blk / p.T) * 64, g0 = g_next;
    if (it > 0) DQW_SYNC();  // every consumer is done with the last block's sP (delta lives there next)
#else
    {
#if DQW_PRODUCER
    constexpr int g0 = 0;
#endif
#endif

#if !DQW_PERSIST
#if DQW_SKIP
    // The chunk's indices first (reduced before the barrier after Q and dO land: the run's tile count).
    int kvs[4];
    smla_valid_slots_load<DQW_THREADS>(p, topk_row, threadIdx.x, kvs);
#endif
    // Q and dO of the block's heads, once.
    dqw_load_qdo(p, sQ, sDO, t, h0, threadIdx.x, DQW_THREADS);
#if !DQW_PRODUCER
    // Indices of tiles 0 and 1; tile 0's kv rows as soon as its indices are in.
    for (int j = 0; j < 2 && j < n_tiles; ++j) dqw_load_idx(p, topk_row, sIdx + j * BLOCK_R, j);
#endif
    smla_cp_async_commit();
#endif  // !DQW_PERSIST
    // Fused delta (chunk 0): this warp's 8 heads of O, 16 columns a lane, in flight with Q and dO.
    const bool fuse_delta = p.chunk == 0;
#if !DQW_PERSIST
    uint4 ov[DQW_DELTA_HEADS][2];
    if (fuse_delta) {
#pragma unroll
      for (int j = 0; j < DQW_DELTA_HEADS; ++j)
#pragma unroll
        for (int half = 0; half < 2; ++half)
          ov[j][half] = __ldg(reinterpret_cast<const uint4*>(p.o + t * p.o_st + (h0 + dqw_delta_head(j)) * p.o_sh +
                                                              half * 256 + (threadIdx.x % 32) * 8));
    }
#endif
    // This lane's head of the fused delta (lanes 0-7: head dqw_delta_head(lane)): its natural-log lse, loaded with O
    // so that the latency is spent in the Q/dO wait, not after the reductions.
    float lse_mine = 0.f;
    if (fuse_delta && threadIdx.x % 32 < DQW_DELTA_HEADS) {
      const int h = h0 + dqw_delta_head(threadIdx.x % 32);
      lse_mine = smla_lse_natural(p.lse[t * p.lse_st + h * p.lse_sh], p.lse_mode, p.sink, h);
    }
#if DQW_PERSIST
    smla_mbar_wait(qfull, it & 1);  // Q and dO landed (the producer fenced them), and the block's run in s_nt
    const int n_tiles = s_nt[it & 1];
    g_next = g0 + n_tiles;
#else
    smla_cp_async_wait<0>();
#if DQW_PRODUCER
    smla_fence_proxy_async();  // Q and dO, for wgmma (the two-warpgroup body fences them at its barrier A)
#endif
#if DQW_SKIP
    smla_valid_slots_reduce<DQW_THREADS>(p, topk_row, threadIdx.x, kvs, s_last_cons);
#endif
    DQW_SYNC();
#if DQW_SKIP
    const int n_tiles = (smla_valid_slots_end<DQW_THREADS / 32>(s_last_cons) + BLOCK_R - 1) / BLOCK_R;
#endif
#endif
#if !DQW_PRODUCER
    if (n_tiles > 0) {
      int k0[8];
      dqw_read_idx(sIdx, k0);
      dqw_load_kv(p, k0, smla_smem_addr(sKV), sFlag);
    }
    smla_cp_async_commit();
#endif

    // This thread's two accumulator rows (heads) of the 64 x N fragments.
    const int hl_a = warp * 16 + lane / 4, hl_b = hl_a + 8;
    const long long th = (long long)t * HEADS + h0;
    // delta and natural-log lse of the block's heads: computed here at chunk 0 (the separate delta
    // phase is not planned with this body), written for d_sink and the later chunks, which read them.
#if DQW_PRODUCER
    float* sDelta = reinterpret_cast<float*>(sP);  // free until the first element stage, after barrier B
#else
    float* sDelta = sPf;  // free until the first exchange, after barrier A
#endif
    float* sLse = sDelta + 64;
    if (fuse_delta) {
      // The eight heads' partial sums first, then their butterflies interleaved (eight independent chains, not
      // eight dependent reductions with a one-lane branch between them), then lane j writes head j.
      float sums[DQW_DELTA_HEADS];
#if DQW_PERSIST
      // O in two rounds of four heads after the qfull wait: 32 registers, not 64 (64 across the wait spilled 96 bytes
      // in this body); the producer prefetched the rows into L2 during the last block.
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        uint4 ov[DQW_DELTA_HEADS / 2][2];
#pragma unroll
        for (int j = 0; j < DQW_DELTA_HEADS / 2; ++j)
#pragma unroll
          for (int half = 0; half < 2; ++half)
            ov[j][half] = __ldg(reinterpret_cast<const uint4*>(
                p.o + t * p.o_st + (h0 + dqw_delta_head(4 * r + j)) * p.o_sh + half * 256 + (threadIdx.x % 32) * 8));
#pragma unroll
        for (int j = 0; j < DQW_DELTA_HEADS / 2; ++j)
          sums[4 * r + j] = dqw_delta_dot(ov[j], sDO, dqw_delta_head(4 * r + j));
      }
#else
#pragma unroll
      for (int j = 0; j < DQW_DELTA_HEADS; ++j) sums[j] = dqw_delta_dot(ov[j], sDO, dqw_delta_head(j));
#endif
      smla_warp_sums(sums);
      const int jl = threadIdx.x % 32;
      if (jl < DQW_DELTA_HEADS) {
        float sum = sums[0];
#pragma unroll
        for (int j = 1; j < DQW_DELTA_HEADS; ++j) sum = jl == j ? sums[j] : sum;
        const int hh = dqw_delta_head(jl);
        sDelta[hh] = sum;
        sLse[hh] = lse_mine;
        p.delta[th + hh] = sum;
        p.lse_n[th + hh] = lse_mine;
      }
    } else if (threadIdx.x < 64) {
      sDelta[threadIdx.x] = p.delta[th + threadIdx.x];
      sLse[threadIdx.x] = p.lse_n[th + threadIdx.x];
    }
#if DQW_PERSIST
    if (n_tiles == 0) smla_mbar_arrive(qfree);  // no S/dP reads Q or dO (the delta above was the last reader)
#endif
    DQW_SYNC();
    // lse (base 2) and delta of the two rows
    const float la = sLse[hl_a] * DQW_LOG2E, lb = sLse[hl_b] * DQW_LOG2E;
    const float dla = sDelta[hl_a], dlb = sDelta[hl_b];
    const float sl2 = p.scale * DQW_LOG2E;

    const unsigned aq = smla_smem_addr(wg == 0 ? sQ : sDO);
    const unsigned akv0 = smla_smem_addr(sKV);
    const unsigned ads = smla_smem_addr(sDS);

    float acc[128];
#pragma unroll
    for (int j = 0; j < 128; ++j) acc[j] = 0.f;
    // S/dP's A descriptors: the low word (address field, LBO 16) once; a k-step's offset adds to its address field
    // without a carry (every shared-memory address is below 256 KB, the field's reach), the high word is a constant.
    // Written per k-step from aq, ptxas recomputed all 32 in vector registers every tile in dq_impl 4 (208
    // registers); measured: dq_impl 4's dq -0.05 ms at the seed, dq_impl 3's -0.02 at TOPK 160 (perf notes v12).
    const unsigned long long daq = smla_wgmma_desc(aq, 16, 1024);
    const unsigned daq_lo = (unsigned)daq;
    const unsigned long long daq_hi = daq & ~0xFFFFFFFFull;  // SBO and swizzle: constants

#if !DQW_INTERM
    // This thread's piece of the per-tile P/dS store (below): row pds_rl of the tile, 16-byte piece pds_c (8 heads).
    const int pds_rl = threadIdx.x / 8, pds_c = threadIdx.x % 8;
    const unsigned pds_so = smla_swz128(pds_rl, pds_c * 8);
    const long long pds_o = ((long long)t * r_chunk + pds_rl) * HEADS + h0 + pds_c * 8;
#endif

    // The persistent body's last chunk stages its bf16 dQ through the last tile's kv buffer (the epilogue below): the
    // consumers hand that buffer back to the producer after the staging, not after the tile's dQ.
    [[maybe_unused]] const bool defer_last = DQW_PERSIST && p.chunk == p.n_chunks - 1;
#if DQW_INTERM
    const int interm_end = min(r_chunk, n_tiles * BLOCK_R);  // slots past the run or the chunk get no interm row
    // The interm staging of this warp: the bytes of sPf it gives in the exchange (float4 tw and 128 + tw of its
    // warpgroup's 4 KB), rows 0-7 at 512 warp, 8-15 at 2048 + 512 warp.
    const unsigned interm_stg = smla_smem_addr(sPf) + wg * 4096 + warp * 512;
#endif
    for (int tile = 0; tile < n_tiles; ++tile) {
#if DQW_PRODUCER
      const int buf = (g0 + tile) & 1;
      // (A) this tile has landed (the producer fenced its copies before arriving). sP, sDS and sPf are reused
      // only after barrier B, which every consumer reaches after it is done with the previous tile.
      smla_mbar_wait(full0 + 8 * buf, ((g0 + tile) >> 1) & 1);
#else
      const int buf = tile & 1;
      smla_cp_async_wait<0>();
      smla_fence_proxy_async();  // this thread's copies and zero rows, for wgmma
      __syncthreads();  // (A) this tile has landed; everyone is done with the other buffer, sP, sDS, sPf
#endif
      const unsigned akv = akv0 + buf * DQW_KVBYTES;
      const int* flag = sFlag + buf * BLOCK_R;
#if DQW_INTERM
      const unsigned pds_half = (tile & 1) * DQW_T_BYTES;  // this tile's half of sP and sDS
#else
      constexpr unsigned pds_half = 0;
#endif
#if !DQW_PRODUCER
      int kn[8];  // the next tile's kv rows (its indices landed before barrier A)
      if (tile + 1 < n_tiles) dqw_read_idx(sIdx + ((tile + 1) & 1) * BLOCK_R, kn);
#endif

      // ---- S (warpgroup 0) or dP (warpgroup 1): 64 heads x BLOCK_R rows, K = 512.
      float sd[16];
#pragma unroll
      for (int j = 0; j < 16; ++j) sd[j] = 0.f;
      smla_fence_regs(sd);
      smla_wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 32; ++kk) {
        const unsigned long long da = daq_hi | (daq_lo + (unsigned)(((kk >> 2) * (64 * 128) + (kk & 3) * 32) >> 4));
        const unsigned long long db = smla_wgmma_desc(akv + (kk >> 2) * DQW_KVCHUNK + (kk & 3) * 32, 16, 1024);
        smla_wgmma_m64n32k16<0, 0>(sd, da, db, kk > 0);
      }
      smla_wgmma_commit();
      // ---- while it runs: the indices of the tile after next into the slot this tile's indices used, and
      // the next tile's kv rows (its indices landed before barrier A) into the other buffer (free: its dQ
      // was waited for before (A)). Measured at the seed (docs/perf-notes.md, v7), dq ms: 2.71 issued here,
      // 2.91 one piece between every 4 S/dP wgmma (the body before), 2.81 after the element work. They must
      // be committed before the next tile's cp.async.wait_group: an uncommitted copy is not waited for (a
      // placement after this commit read rows before they landed and failed --check).
#if !DQW_PRODUCER
      if (tile + 2 < n_tiles) dqw_load_idx(p, topk_row, sIdx + (tile & 1) * BLOCK_R, tile + 2);
      if (tile + 1 < n_tiles)
        dqw_load_kv(p, kn, akv0 + (buf ^ 1) * DQW_KVBYTES, sFlag + (buf ^ 1) * BLOCK_R);
      smla_cp_async_commit();
#endif
      smla_wgmma_wait<0>();
      smla_fence_regs(sd);
#if DQW_PERSIST
      if (tile == n_tiles - 1) smla_mbar_arrive(qfree);  // done with Q and dO: the next block's may land
#endif

      // ---- both: warpgroup 0 takes slots 0-15 (i = 0, 1), warpgroup 1 slots 16-31 (i = 2, 3); each
      // hands the other the half of its S or dP that the other needs (fp32, register order).
      {
        float4* give = reinterpret_cast<float4*>(sPf) + wg * 256;        // wg 0: S(i 2,3); wg 1: dP(i 0,1)
        const float4* take = reinterpret_cast<const float4*>(sPf) + (wg ^ 1) * 256;
        float g[8];  // (static register indices only: a computed index would put sd in local memory)
#pragma unroll
        for (int r = 0; r < 8; ++r) g[r] = wg == 0 ? sd[8 + r] : sd[r];
        give[tw] = make_float4(g[0], g[1], g[2], g[3]);
        give[128 + tw] = make_float4(g[4], g[5], g[6], g[7]);
        // Validity of this thread's four slots (8 i + 2 (lane % 4) + e, i = i0, i0 + 1), read here, before
        // any store below: read between the stores, each element became one dependent chain (shared
        // load, exp2, stores) ~8 times over (measured: the element stage was ~1200 cycles a tile).
        const int i0 = wg == 0 ? 0 : 2;
        const int2 fv0 = *reinterpret_cast<const int2*>(flag + 8 * i0 + 2 * (lane % 4));
        const int2 fv1 = *reinterpret_cast<const int2*>(flag + 8 * (i0 + 1) + 2 * (lane % 4));
        DQW_SYNC();  // (B) the halves are exchanged
        const float4 t0 = take[tw], t1 = take[128 + tw];
        const float other[8] = {t0.x, t0.y, t0.z, t0.w, t1.x, t1.y, t1.z, t1.w};
        const bool valid[4] = {fv0.x != 0, fv0.y != 0, fv1.x != 0, fv1.y != 0};  // [2 (i - i0) + e]
        // All eight exponentials first (independent), then dS, then the stores.
        float pe[8];
#pragma unroll
        for (int r = 0; r < 8; ++r) {
          const int half = (r >> 1) & 1;
          const float s_ = wg == 0 ? sd[r] : other[r];
          // Branch-free: an empty slot's exponent is -inf, so p = 0 and dS = 0 (its kv row is zero, dP finite).
          pe[r] = smla_ex2_ftz(valid[2 * (r >> 2) + (r & 1)] ? fmaf(s_, sl2, -(half ? lb : la))
                                                               : -__int_as_float(0x7f800000));
        }
        // The warp's 8 x 8 blocks m = 2 (i - i0) + half (heads 16 warp + 8 half .., slots 8 i ..): this thread's pair
        // of slots 8 i + 2 (lane % 4) + e of head hl_a / hl_b is element r = 2 m + e, one bf16x2 word a block, which
        // is stmatrix's fragment layout; .trans stores each block's columns (slots) as the rows of sP / sDS
        // ([slot][head], 16 bytes of 8 heads a row). Lane 8 m + j gives the address of block m's slot row j.
        unsigned wpm[4], wds[4];
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          float dv[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int r = 2 * m + e, half = m & 1;
            const float dp_ = wg == 0 ? other[r] : sd[8 + r];
            // An empty slot's dS is 0 even where dP - delta is not finite (a token's NaN o or dout: without the
            // select, 0 * NaN made the dq of a token with no valid slot NaN in the bodies that run its tiles).
            dv[e] = valid[2 * (r >> 2) + (r & 1)] ? pe[r] * (dp_ - (half ? dlb : dla)) * p.scale : 0.f;
          }
          wpm[m] = smla_pack_bf2_rn(pe[2 * m], pe[2 * m + 1]);
          wds[m] = smla_pack_bf2_rn(dv[0], dv[1]);
        }
        const int mb = lane >> 3;
        const unsigned so = smla_swz128(8 * (i0 + (mb >> 1)) + (lane & 7), 16 * warp + 8 * (mb & 1));
        dqw_stmatrix_x4<true>(smla_smem_addr(sP) + pds_half + so, wpm);
        dqw_stmatrix_x4<true>(smla_smem_addr(sDS) + pds_half + so, wds);
      }
      smla_fence_proxy_async();  // both wrote dS
      DQW_SYNC();  // (C) dS is in shared memory, visible to wgmma

      // ---- dQ[:, 256 wg ..] += dS (64 x BLOCK_R, M-major in sDS) * K (BLOCK_R x 256, N-major in the kv buffer).
      smla_fence_regs(acc);
      smla_wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < BLOCK_R / 16; ++ks) {
        const unsigned long long da = smla_wgmma_desc(ads + pds_half + ks * 2048, DQW_T_BYTES, 1024);
        const unsigned long long db = smla_wgmma_desc(akv + 4 * wg * DQW_KVCHUNK + ks * 2048, DQW_KVCHUNK, 1024);
        smla_wgmma_m64n256k16<1, 1>(acc, da, db, 1);
      }
      smla_wgmma_commit();

      // ---- meanwhile, this tile's P and dS rows to the workspace ((t*r_chunk + rr)*HEADS + h), h fastest: one
      // 16-byte piece of each a thread (BLOCK_R rows x 8 pieces = DQW_THREADS), row pds_rl, piece pds_c, written as
      // straight-line code (a loop from threadIdx.x was compiled as a general loop, unrolled by four with a
      // remainder, for its one trip).
      static_assert(BLOCK_R * 8 == DQW_THREADS, "dq's P/dS store: one 16-byte piece a consumer thread");
#if DQW_INTERM
      // (or, fused: after every second tile and the last, the pair's interm rows, from Q, dO and the P and dS in
      // shared memory; dkv_interm is not planned)
      const bool pair_end = (tile & 1) || tile == n_tiles - 1;
      if (pair_end)
        dqw_interm_pair(p, smla_smem_addr(sQ), smla_smem_addr(sDO), ads, smla_smem_addr(sP), interm_stg, t, tile >> 1,
                        interm_end, wg, warp, lane, [&] {
                          smla_fence_regs(acc);
                          smla_mbar_arrive(empty0 + 8 * buf);
                        });
#else
      if (tile * BLOCK_R + pds_rl < r_chunk) {
        const long long o = pds_o + (long long)tile * (BLOCK_R * HEADS);
        *reinterpret_cast<uint4*>(p.pm + o) = *reinterpret_cast<const uint4*>(sP + pds_so);
        *reinterpret_cast<uint4*>(p.ds + o) = *reinterpret_cast<const uint4*>(sDS + pds_so);
      }
#endif
      smla_wgmma_wait<0>();
      smla_fence_regs(acc);
#if DQW_INTERM
      if (!pair_end) smla_mbar_arrive(empty0 + 8 * buf);  // (a pair's end handed it back in dqw_interm_pair)
#elif DQW_PRODUCER
      if (!(defer_last && tile == n_tiles - 1)) smla_mbar_arrive(empty0 + 8 * buf);  // this thread's wgmma are done with it
#endif
    }
#undef DQW_SYNC

    // ---- epilogue: the chunk carry (dq_acc) and the bf16 output; columns 256 wg + 8 i + 2 (lane % 4). The carry
    // of the chunks before first, every load before any store (smla_dq_add_carry).
    if (p.n_chunks > 1 && p.chunk > 0)
      dqw_each_pair(acc, h0, hl_a, hl_b, wg, lane,
                    [&](int h, int d, float& v0, float& v1) { smla_dq_add_carry<HEADS>(p, t, h, d, v0, v1); });
#if !DQW_PERSIST
#if DQW_INTERM
    // Each warpgroup's interm product reads both sQ and sDO (its columns of each), which the staging below overwrites
    // (warpgroup 0's dQ in sQ, 1's in sDO): both are done with them first.
    dqw_sync();
#endif
    // The staging buffer of this warpgroup's half of dQ: its own S/dP operand buffer (sQ for warpgroup 0, sDO for 1:
    // neither is read again in this block once the last S/dP wgmma was waited for, and the other warpgroup never reads
    // it), written and read back between the warpgroup's own barrier (named barrier 3 or 4, 128 threads).
#if DQW_INTERM
    // (from aq, the shared address of the same buffer: with the fused interm's registers in the loop, ptxas otherwise
    // kept the block's generic shared-memory base in local memory across it, 4 bytes)
    char* stage = static_cast<char*>(__cvta_shared_to_generic(aq));
#else
    char* stage = wg == 0 ? sQ : sDO;
#endif
    auto stage_sync = [wg] {
      if (wg == 0)
        smla_named_sync<3, 128>();
      else
        smla_named_sync<4, 128>();
    };
    if (p.chunk == p.n_chunks - 1) {
      // The bf16 dQ half of this warpgroup (64 heads x 256 columns) through the staging buffer with stmatrix, then
      // to global memory in 16-byte pieces, a warp one head's 512 contiguous bytes an instruction. Rows of 512 bytes
      // (dqw_stage_bf16): stmatrix's 8 rows and the read-out's 32 pieces fall on distinct banks. Why: the fragment stores (4 bytes a
      // lane into 8 rows) held the epilogue at the SM's store path: stored into 8 MB that stay in L2 they cost as
      // much, and leaving them out saved 0.11-0.17 ms of dq (perf notes v16).
      const int mb = lane >> 3;                           // stmatrix: block of this lane's address
      const int sr = 16 * warp + 8 * (mb & 1) + (lane & 7);  // its row (head in the block)
      dqw_stage_bf16<512>(acc, smla_smem_addr(stage), sr, 0, mb);
      stage_sync();
      smla_bf16* dst = p.dq + t * p.dq_st + h0 * p.dq_sh + 256 * wg + 8 * lane;
#pragma unroll
      for (int k = 0; k < 16; ++k) {
        const int r = warp + 4 * k;
        *reinterpret_cast<uint4*>(dst + r * p.dq_sh) =
            *reinterpret_cast<const uint4*>(stage + r * 512 + ((lane ^ (r & 7)) << 4));
      }
    } else {
      // An earlier chunk: the fp32 carry of this warpgroup's half (64 heads x 256 columns, 1 KB a head) through the
      // same buffer (64 KB: exactly its size), then to dq_acc in 16-byte pieces, a warp half a head's row an
      // instruction, instead of 8-byte fragment stores into 8 rows a warp instruction. Rows of 1 KB, the 16-byte
      // piece j of row r at j ^ (r % 8): a warp's fragment stores (8 rows x 32 bytes) take two wavefronts.
      dqw_each_pair(acc, 0, hl_a, hl_b, wg, lane, [&](int r, int d, float& v0, float& v1) {
        const int j = (d - 256 * wg) >> 2;  // the 16-byte piece of the row (d is even: v0, v1 share it)
        *reinterpret_cast<float2*>(stage + r * 1024 + ((j ^ (r & 7)) << 4) + 4 * (d & 3)) = make_float2(v0, v1);
      });
      stage_sync();
      float* dst = p.dq_acc + ((long long)t * HEADS + h0) * SMLA_D + 256 * wg + 4 * lane;
#pragma unroll
      for (int k = 0; k < 16; ++k) {
        const int r = warp + 4 * k;
#pragma unroll
        for (int s = 0; s < 2; ++s)
          *reinterpret_cast<uint4*>(dst + r * SMLA_D + 128 * s) =
              *reinterpret_cast<const uint4*>(stage + r * 1024 + (((lane + 32 * s) ^ (r & 7)) << 4));
      }
    }
#else
    if (defer_last && n_tiles > 0) {
      // The bf16 dQ (64 heads x 512 columns, 64 KB) through the last tile's kv buffer X (32 KB: Q and dO may already
      // hold the next block's rows) in two passes of 32 heads: the warps holding them (2 pass and 2 pass + 1 of each
      // warpgroup) write their fragments with stmatrix into rows of 1 KB (the 16-byte piece j of row r at j ^ (r % 8),
      // as dq_impl 3's staging), then every consumer stores 8 pieces, a warp 512 contiguous bytes an instruction.
      // X goes back to the producer (empty) once this thread has read its last pieces out.
      const int xb = (g0 + n_tiles - 1) & 1;
      char* X = sKV + xb * DQW_KVBYTES;
      const unsigned x0 = smla_smem_addr(X);
      const int mb = lane >> 3;
      const int sr = 16 * warp + 8 * (mb & 1) + (lane & 7);  // the row (head of the block) of this lane's address
      const int oj = threadIdx.x % 64, orow = threadIdx.x / 64;  // read-out: piece oj of rows orow + 4 k
      dqw_sync();  // both warpgroups' last dQ wgmma are done with X
#pragma unroll
      for (int pass = 0; pass < 2; ++pass) {
        if ((warp >> 1) == pass) {
          dqw_stage_bf16<1024>(acc, x0, sr - 32 * pass, 32 * wg, mb);  // the warpgroup's half of the 1 KB row
        }
        dqw_sync();  // this pass's rows are in X
        smla_bf16* dst = p.dq + t * p.dq_st + (h0 + 32 * pass) * p.dq_sh + 8 * oj;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          const int r = orow + 4 * k;
          *reinterpret_cast<uint4*>(dst + r * p.dq_sh) =
              *reinterpret_cast<const uint4*>(X + r * 1024 + ((oj ^ (r & 7)) << 4));
        }
        if (pass == 0) dqw_sync();  // every piece of the first pass is read before the second overwrites X
      }
      smla_mbar_arrive(empty0 + 8 * xb);
    } else {
      dqw_each_pair(acc, h0, hl_a, hl_b, wg, lane,
                    [&](int h, int d, float& v0, float& v1) { smla_dq_store_pair<HEADS>(p, t, h, d, v0, v1); });
    }
#endif
  }  // the block (the persistent body: the blocks of this CTA)
}
