// common.cuh: what several kernels share.
//
// Part 1 (host and device): shared-memory layouts of the matrix kernels as constexpr functions,
// so the host's launch spec (runtime/cuda/kernels_cuda.cpp includes this file without
// __CUDACC__) and the kernel carve shared memory from one formula.
// Part 2 (device only): bf16 <-> f32 by bit manipulation and 32-lane reductions, for CUDA and HIP
// (portable.h); mma.sync / ldmatrix / cp.async in inline PTX, for CUDA only. No toolkit headers:
// this compiles under NVRTC and hipRTC as is.
#ifndef SMLA_COMMON_CUH
#define SMLA_COMMON_CUH

#include "smla_params.h"  // SMLA_LSE_* bits
#include "portable.h"  // SMLA_HD, SMLA_DEVICE_CODE, SMLA_SHFL_XOR: CUDA/HIP spellings

// Every bf16 row in shared memory is padded by 8 elements (16 bytes): a row stride of 16*(odd)
// bytes puts the 8 rows one ldmatrix reads on 8 distinct 16-byte bank groups.
#define SMLA_ROW_PAD 8

// ---- The dynamic shared memory the host launches a kernel with, checked against the carve of the
// source being compiled. The host computes it from the headers compiled into the library and passes it
// as SMLA_SMEM_BYTES (runtime/cuda/kernels_cuda.cpp); a kernel source tree given at run time
// (SMLA_KERNEL_SRC_DIR) whose carve differs then fails to compile, naming the cause, instead of
// running with too little shared memory. Without the define (an offline nvcc build) nothing is checked.
#ifdef SMLA_SMEM_BYTES
#define SMLA_CHECK_SMEM(carve)                                                                                  \
  static_assert(SMLA_SMEM_BYTES == (carve),                                                                     \
                "smla: the host launches this kernel with SMLA_SMEM_BYTES of dynamic shared memory, but this " \
                "source's shared-memory carve needs another amount: the kernel sources (SMLA_KERNEL_SRC_DIR?) " \
                "do not match the library")
#else
#define SMLA_CHECK_SMEM(carve) static_assert(true, "")
#endif

// ---- dq: Q and dO tiles [BLOCK_H][D+pad], two KV buffers [BLOCK_R][D+pad], ds and p tiles
// [BLOCK_H][BLOCK_R+pad] (bf16), and a validity flag per KV row of each buffer.
SMLA_HD constexpr unsigned smla_dq_qdo_bytes(int block_h) { return 2u * block_h * (512 + SMLA_ROW_PAD) * 2u; }
SMLA_HD constexpr unsigned smla_dq_kv_bytes(int block_r) { return 2u * block_r * (512 + SMLA_ROW_PAD) * 2u; }
SMLA_HD constexpr unsigned smla_dq_dsp_bytes(int block_h, int block_r) {
  return 2u * block_h * (block_r + SMLA_ROW_PAD) * 2u;
}
SMLA_HD constexpr unsigned smla_dq_flag_bytes(int block_r) { return 2u * block_r * 4u; }
SMLA_HD constexpr unsigned smla_dq_smem_bytes(int block_h, int block_r) {
  return smla_dq_qdo_bytes(block_h) + smla_dq_kv_bytes(block_r) + smla_dq_dsp_bytes(block_h, block_r) +
         smla_dq_flag_bytes(block_r);
}

// Registers a thread gets under __launch_bounds__(threads, 1) when ptxas gives the most it may (what it does for a
// kernel with setmaxnreg): the register file (65536) over the threads, down to the allocation unit of 8. The pool
// that setmaxnreg moves registers in (sm90_sync.cuh), and what the host checks a loaded binary against
// (KernelSpec::launch_regs).
SMLA_HD constexpr int smla_launch_regs(int threads) { return 65536 / threads / 8 * 8; }

// What the fused interm (dq_wgmma.cuh, DQW_INTERM) adds: a second tile of P and of dS (BLOCK_R x 128 B each).
SMLA_HD constexpr unsigned smla_dq_interm_extra_bytes(int block_r) { return 2u * block_r * 128u; }

// ---- dq, sm_90a wgmma body (dq_wgmma.cuh): Q and dO (64 heads x 1 KB each), two kv buffers of
// BLOCK_R rows, fp32 S/dP exchange (64 x BLOCK_R), bf16 P and dS (BLOCK_R x 128 B each), the flags
// and the prefetched top-k indices (two tiles each), with `interm` (dkv_impl 4) P and dS of two tiles,
// and 1 KB of slack to align the start to 1024 bytes (the swizzle atoms).
SMLA_HD constexpr unsigned smla_dq_wgmma_smem_bytes(int block_r, bool interm = false) {
  return 2u * 65536u + 2u * block_r * 1024u + 64u * block_r * 4u + 2u * block_r * 128u + 2u * block_r * 4u +
         2u * block_r * 4u + (interm ? smla_dq_interm_extra_bytes(block_r) : 0u) + 1024u;
}

// ---- dkv_interm: B = [q ; dout] columns of this block [2H][BLOCK_D+pad], two A buffers
// [ds | pm] rows [BLOCK_R][2H+pad].
SMLA_HD constexpr unsigned smla_dkv_b_bytes(int h, int block_d) { return 2u * h * (block_d + SMLA_ROW_PAD) * 2u; }
SMLA_HD constexpr unsigned smla_dkv_a_bytes(int h, int block_r) { return 2u * block_r * (2 * h + SMLA_ROW_PAD) * 2u; }
SMLA_HD constexpr unsigned smla_dkv_smem_bytes(int h, int block_r, int block_d) {
  return smla_dkv_b_bytes(h, block_d) + smla_dkv_a_bytes(h, block_r);
}

// ---- dkv_interm, sm_90a wgmma body (dkv_wgmma.cuh): one tile, 64 slot rows x 256 columns over two
// warpgroups. B = [q ; dout] of the token's 256 columns (2H x 256 bf16), three A slots, each one
// tile of 64 [ds | pm] rows (64 x 2H bf16) or, after its MMA, the two warpgroups' bf16 staging
// halves (64 x 128 each, 32 KB), and 1 KB of slack to align the start to 1024 bytes. H = 128: 230400 B.
#define SMLA_DKV_WGMMA_ROWS 64
#define SMLA_DKV_WGMMA_COLS 256
// producer 1: dkv_impl 3 (dkv_wgmma.cuh's DKW_PRODUCER), 64 bytes more for its mbarriers.
SMLA_HD constexpr unsigned smla_dkv_wgmma_smem_bytes(int h, int producer = 0) {
  return 2u * h * 256u * 2u + 3u * (64u * (2u * h) * 2u > 32768u ? 64u * (2u * h) * 2u : 32768u) + 1024u +
         (producer ? 64u : 0u);
}

#if defined(SMLA_DEVICE_CODE)  // CUDA and HIP: bf16 conversions, reductions, slot validity

// ---------------------------------------------------------------- bf16 <-> f32
__device__ __forceinline__ float smla_bf2f(smla_bf16 b) { return __uint_as_float(((unsigned)b) << 16); }

// Round to nearest even, NaN stays NaN: the same rule as the host's float_to_bf16.
__device__ __forceinline__ unsigned smla_f2bf_bits(float f) {
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;
  u += 0x7fffu + ((u >> 16) & 1u);
  return u >> 16;
}
__device__ __forceinline__ smla_bf16 smla_f2bf(float f) { return (smla_bf16)smla_f2bf_bits(f); }

// Two floats as a bf16x2 word: `lo` at the lower address.
__device__ __forceinline__ unsigned smla_pack_bf2(float lo, float hi) {
  return smla_f2bf_bits(lo) | (smla_f2bf_bits(hi) << 16);
}
__device__ __forceinline__ float smla_lo_f(unsigned w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float smla_hi_f(unsigned w) { return __uint_as_float(w & 0xffff0000u); }

#if defined(__CUDACC__)  // inline PTX: NVIDIA only (the AMD matrix layer is amd_mfma.h)
// ---------------------------------------------------------------- shared memory, async copies
__device__ __forceinline__ unsigned smla_smem_addr(const void* p) {
  unsigned a;
  asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}

// 16-byte global -> shared copy that bypasses registers (sm_80+).
__device__ __forceinline__ void smla_cp_async16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smla_smem_addr(smem)), "l"(gmem) : "memory");
}
// 16 bytes to shared address `smem` from `gmem`, or 16 zero bytes and no global read when `valid` is false
// (src-size 0; `gmem` must still be a valid address).
__device__ __forceinline__ void smla_cp_async16_zfill(unsigned smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem), "l"(gmem), "r"(valid ? 16 : 0) : "memory");
}
// 4-byte global -> shared copy (through L1), for index rows whose alignment is only 4 bytes.
__device__ __forceinline__ void smla_cp_async4(void* smem, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smla_smem_addr(smem)), "l"(gmem) : "memory");
}
__device__ __forceinline__ void smla_cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void smla_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// smla_pack_bf2 in one instruction (sm_80+): round to nearest even, the same bits for every
// finite value and infinities (a NaN stays a NaN, its payload may differ).
__device__ __forceinline__ unsigned smla_pack_bf2_rn(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));  // first source -> upper half
  return r;
}

// dQ's epilogue with several chunks, in two steps a thread: first smla_dq_add_carry on every fragment pair, then
// smla_dq_store_pair on every pair. The carry's loads must all be issued before the first store: p.dq_acc and p.dq
// (or the pairs of p.dq_acc itself) may alias as far as the compiler knows, so a load after a store waits for it,
// and a load-add-store a pair made 64 dependent round trips to device memory a thread a block (dq +30% at
// 4096,128,5120,1152, perf notes v18).
// One fragment pair (v0, v1) of dQ row (t, h), columns d and d + 1 (HEADS_: H): the carry of the chunks before
// added in (several chunks, not the first; the callers test that around their loop too, so that ptxas keeps the 64
// loads under one branch: tested only here, it spilled).
template <int HEADS_>
__device__ __forceinline__ void smla_dq_add_carry(const SmlaParams& p, int t, int h, int d, float& v0, float& v1) {
  if (p.n_chunks > 1 && p.chunk > 0) {
    const float2 c = *reinterpret_cast<const float2*>(p.dq_acc + ((long long)t * HEADS_ + h) * SMLA_D + d);
    v0 += c.x;
    v1 += c.y;
  }
}
// The same pair at the end of a chunk, the carry already added: kept in dq_acc for the next chunk unless this is
// the last (or only) one, which writes the bf16 output.
template <int HEADS_>
__device__ __forceinline__ void smla_dq_store_pair(const SmlaParams& p, int t, int h, int d, float v0, float v1) {
  if (p.n_chunks > 1 && p.chunk != p.n_chunks - 1) {
    *reinterpret_cast<float2*>(p.dq_acc + ((long long)t * HEADS_ + h) * SMLA_D + d) = make_float2(v0, v1);
    return;
  }
  // One cvt a pair: the integer rounding of smla_pack_bf2 was ~10 instructions a pair, 64 pairs a thread a block.
  *reinterpret_cast<unsigned*>(p.dq + t * p.dq_st + h * p.dq_sh + d) = smla_pack_bf2_rn(v0, v1);
}
__device__ __forceinline__ void smla_st_shared_zero16(void* smem) {
  *reinterpret_cast<uint4*>(smem) = make_uint4(0u, 0u, 0u, 0u);
}

// ---------------------------------------------------------------- ldmatrix / mma.sync
// Four 8x8 b16 matrices; lane l gives the address of row (l % 8) of matrix (l / 8).
__device__ __forceinline__ void smla_ldsm_x4(unsigned (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smla_smem_addr(smem)));
}
__device__ __forceinline__ void smla_ldsm_x4_trans(unsigned (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smla_smem_addr(smem)));
}

// D(16x8, f32) += A(16x16, bf16, row) * B(16x8, bf16, col).
// Fragments (g = lane / 4, c = 2 * (lane % 4)): a0 (g, c..c+1), a1 (g+8, c), a2 (g, c+8), a3 (g+8, c+8);
// b0 (k = c..c+1, n = g), b1 (k = c+8.., n = g); d0,d1 (g, c..c+1), d2,d3 (g+8, c..c+1).
__device__ __forceinline__ void smla_mma_bf16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// smla_f2bf in one instruction (sm_80+): the same bits for every finite value and infinities.
__device__ __forceinline__ smla_bf16 smla_f2bf_rn(float f) {
  unsigned short r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
  return (smla_bf16)r;
}

// 2^x in one instruction (MUFU.EX2), results below 2^-126 flushed to zero: exp2f adds a range check
// and two multiplies to keep such subnormal results, which no probability here needs (a bf16 P or dS
// that small is zero beside any other contribution). 2^-inf = +0.
__device__ __forceinline__ float smla_ex2_ftz(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

#endif  // __CUDACC__ (PTX)

// ---------------------------------------------------------------- reductions (fixed order)
__device__ __forceinline__ float smla_warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += SMLA_SHFL_XOR(v, o);
  return v;
}
// smla_warp_sum of N values at once, their butterflies interleaved (N independent chains; the same order of
// additions as smla_warp_sum for each).
template <int N>
__device__ __forceinline__ void smla_warp_sums(float (&v)[N]) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
#pragma unroll
    for (int j = 0; j < N; ++j) v[j] += SMLA_SHFL_XOR(v[j], o);
}
__device__ __forceinline__ double smla_warp_sum_d(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += SMLA_SHFL_XOR(v, o);
  return v;
}
__device__ __forceinline__ int smla_warp_sum_i(int v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += SMLA_SHFL_XOR(v, o);
  return v;
}
__device__ __forceinline__ int smla_warp_min_i(int v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = min(v, SMLA_SHFL_XOR(v, o));
  return v;
}

// An empty slot: anything outside [0, num_kv).
__device__ __forceinline__ bool smla_valid_index(int k, int num_kv) { return (unsigned)k < (unsigned)num_kv; }
// Token t's indices of this chunk: topk[t, r_start ..].
__device__ __forceinline__ const int* smla_topk_row(const SmlaParams& p, int t) {
  return p.topk + (long long)t * p.topk_st + p.r_start;
}
// The slots of this chunk that hold top-k entries: r_chunk, or fewer in a ragged last chunk.
__device__ __forceinline__ int smla_chunk_slots(const SmlaParams& p) { return min(p.r_chunk, p.topk_n - p.r_start); }

// The slots a block of the matrix phases must run: 1 + the last slot of its token's chunk whose index is valid (0 when
// none is). Slots after it are empty, and an empty slot's P and dS are zero, so the tiles past it change nothing
// of dQ, and their interm rows are never read (csr gives an empty slot no kv row). The top-k of causal sparse
// attention ends its rows with empty slots wherever a token sees fewer rows than TOPK (the benchmark top-k: 14% of
// the seed's slots, 44% at TOPK 1152). Three steps, by THREADS threads `tid` 0 .. THREADS - 1 (whole warps):
//   _load:   this thread's first four slots' indices (slots tid + u THREADS) into registers. Issued before the
//            thread's (or its warp's) bulk copies: a load issued after them waits in the memory pipeline behind
//            them (measured, perf notes v14: the read after the copies cost TOPK 160 +8% end to end).
//   _reduce: the last valid slot of this thread (the loaded four, then the rest of a chunk longer than 4 THREADS),
//            the warp's max into warp_last[tid / 32].
//   _end:    after a barrier of those threads, the count (any thread).
#if defined(__CUDACC__)
template <int THREADS>
__device__ __forceinline__ void smla_valid_slots_load(const SmlaParams& p, const int* topk_row, int tid, int (&k)[4]) {
  const int n = smla_chunk_slots(p);
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const int rr = u * THREADS + tid;
    k[u] = rr < n ? __ldg(topk_row + rr) : -1;
  }
}
template <int THREADS>
__device__ __forceinline__ void smla_valid_slots_reduce(const SmlaParams& p, const int* topk_row, int tid,
                                                        const int (&k)[4], int* warp_last) {
  int last = -1;
#pragma unroll
  for (int u = 0; u < 4; ++u)
    if (smla_valid_index(k[u], p.num_kv)) last = u * THREADS + tid;  // u grows: the last valid one
  const int n = smla_chunk_slots(p);
  for (int rr = 4 * THREADS + tid; rr < n; rr += THREADS)
    if (smla_valid_index(__ldg(topk_row + rr), p.num_kv)) last = rr;
  last = __reduce_max_sync(0xffffffffu, last);
  if (tid % 32 == 0) warp_last[tid / 32] = last;
}
template <int WARPS>
__device__ __forceinline__ int smla_valid_slots_end(const int* warp_last) {
  int last = -1;
#pragma unroll
  for (int w = 0; w < WARPS; ++w) last = max(last, warp_last[w]);
  return last + 1;
}
#endif  // __CUDACC__

// The caller's lse `l` of head h as natural-log and sink-inclusive (lse_mode: SMLA_LSE_* bits of
// smla_params.h; sink null when there is none). Used by delta.cu and by the fused delta of dq_wgmma.cuh.
__device__ __forceinline__ float smla_lse_natural(float l, int lse_mode, const float* sink, int h) {
  if (lse_mode & SMLA_LSE_BASE2) l *= 0.69314718055994531f;
  if ((lse_mode & SMLA_LSE_EXCLUDES_SINK) && sink != nullptr) {
    const float sk = sink[h];
    const float m = fmaxf(l, sk);
    // logaddexp; both -inf stays -inf and both +inf stays +inf instead of becoming NaN, and a NaN stays NaN (fmaxf
    // drops one beside an infinity), as the CPU backend's
    if (l != l || sk != sk) l += sk;
    else if (fabsf(m) != __int_as_float(0x7f800000)) l = m + log1pf(expf(-fabsf(l - sk)));
    else l = m;
  }
  return l;
}

#endif  // SMLA_DEVICE_CODE
#endif  // SMLA_COMMON_CUH
