// csr.cu: per chunk, a stable LSD radix sort of the chunk's slots by kv row, then row_ptr.
//
// Item i = t*r_chunk + rr has key = topk[t, r_start + rr] when valid, else num_kv (an empty slot: it sorts last), and
// value i. The sort is CUB's onesweep (the agents of cub::DeviceRadixSort, launched here one by one):
//   keys       writes the keys and values into csr_keys[0] / csr_vals[0] and zeroes the sort's scratch;
//   histogram  counts every pass's digits over all the keys at once (the digit counts of a pass do not depend on the
//              order the earlier passes left), into bins[pass][digit];
//   exclusive  one block a pass turns its counts into the digits' first positions;
//   onesweep   one launch a pass (SmlaParams::pass): each tile ranks its keys by the pass's digit in shared memory,
//              learns how many of each digit the tiles before it hold by decoupled look-back, and scatters keys and
//              values to the other buffer. Pass p reads buffer p % 2 and writes (p + 1) % 2, so the result is in
//              csr_final = passes % 2. Stable (tiles in order, ranks in input order within a tile): equal keys keep
//              slot order, and the result does not depend on scheduling.
//   rowptr     marks where each kv row's run starts; row_ptr[num_kv] = where the empty slots' run starts.
// The scratch in csr_hist, in ints: bins [passes][CSR_DIGITS], tile counters [passes] (CSR_CTR_INTS), look-back
// [passes][tiles][CSR_DIGITS], tiles = ceil(items / CSR_OS_TILE). The host sizes it the same way
// (cuda_csr_scratch_bytes in runtime/cuda/kernels_cuda.cpp). Why onesweep (perf notes v19): the per-tile-histogram
// sort before it took ~200 us at the seed in seven launches (its two scatters two thirds of it), and csr's time
// counts almost fully end to end.
// Constants are CSR_-prefixed: CUB uses RADIX_BITS etc. as template parameter names.
#include "smla_params.h"
#include "common.cuh"
#include "csr_rowptr.cuh"
#include <cub/agent/agent_radix_sort_histogram.cuh>
#include <cub/agent/agent_radix_sort_onesweep.cuh>
#include <cub/block/block_scan.cuh>

#ifndef CSR_RADIX_BITS
#define CSR_RADIX_BITS 8
#endif
#ifndef CSR_THREADS
#define CSR_THREADS 256  // keys and rowptr
#endif
// onesweep's tile: CUB's sm_90 tuning for 4-byte keys and values with 32-bit offsets (384 x 23)
#ifndef CSR_OS_THREADS
#define CSR_OS_THREADS 384
#endif
#ifndef CSR_OS_ITEMS
#define CSR_OS_ITEMS 23
#endif
// the histogram's tile: CUB's sm_90 tuning (128 x 16)
#ifndef CSR_HIST_THREADS
#define CSR_HIST_THREADS 128
#endif
#ifndef CSR_HIST_ITEMS
#define CSR_HIST_ITEMS 16
#endif
#define CSR_SUM_THREADS 256

#define CSR_DIGITS (1 << CSR_RADIX_BITS)
#define CSR_OS_TILE (CSR_OS_THREADS * CSR_OS_ITEMS)
#define CSR_CTR_INTS 32  // the tile counters' slot (passes <= 32), keeping the look-back 128-byte aligned

// CUB's onesweep ranks with its warps' 32 lanes over the digits (BlockRadixRankMatchEarlyCounts): at least 32 of
// them. The planner never picks fewer than kCsrMinRadixBits (planner.hpp).
static_assert(CSR_RADIX_BITS >= 5 && CSR_RADIX_BITS <= 8, "CSR_RADIX_BITS must be in 5..8");

typedef cub::AgentRadixSortHistogramPolicy<CSR_HIST_THREADS, CSR_HIST_ITEMS, 1, unsigned, CSR_RADIX_BITS>
    CsrHistPolicy;
typedef cub::AgentRadixSortOnesweepPolicy<CSR_OS_THREADS, CSR_OS_ITEMS, unsigned, 1,
                                          cub::RADIX_RANK_MATCH_EARLY_COUNTS_ANY, cub::BLOCK_SCAN_RAKING_MEMOIZE,
                                          cub::RADIX_SORT_STORE_DIRECT, CSR_RADIX_BITS>
    CsrOnesweepPolicy;
static_assert(CsrOnesweepPolicy::BLOCK_THREADS == CSR_OS_THREADS && CsrOnesweepPolicy::ITEMS_PER_THREAD == CSR_OS_ITEMS,
              "the onesweep tile must be what the host sized the look-back for");

__device__ __forceinline__ int csr_n(const SmlaParams& p) { return p.T * p.r_chunk; }  // < 2^31: host-checked

__device__ __forceinline__ unsigned csr_key_from_topk(const SmlaParams& p, int i) {
  const int t = i / p.r_chunk, rr = i - t * p.r_chunk;
  if (p.r_start + rr >= p.topk_n) return (unsigned)p.num_kv;  // ragged last chunk: empty
  const int k = p.topk[t * p.topk_st + p.r_start + rr];
  return smla_valid_index(k, p.num_kv) ? (unsigned)k : (unsigned)p.num_kv;
}

__device__ __forceinline__ int csr_os_tiles(const SmlaParams& p) { return (csr_n(p) + CSR_OS_TILE - 1) / CSR_OS_TILE; }
__device__ __forceinline__ int* csr_bins(const SmlaParams& p) { return p.csr_hist; }
__device__ __forceinline__ int* csr_ctrs(const SmlaParams& p) { return p.csr_hist + p.radix_passes * CSR_DIGITS; }
__device__ __forceinline__ int* csr_lookback(const SmlaParams& p, int pass) {
  return p.csr_hist + p.radix_passes * CSR_DIGITS + CSR_CTR_INTS + (long long)pass * csr_os_tiles(p) * CSR_DIGITS;
}

// Keys and values of the chunk's items into buffer 0; the scratch (bins, counters, every pass's look-back) zeroed.
// Grid: max(items, scratch ints) threads.
extern "C" __global__ void __launch_bounds__(CSR_THREADS) smla_csr_keys(SmlaParams p) {
  const long long i = (long long)blockIdx.x * CSR_THREADS + threadIdx.x;
  if (i < csr_n(p)) {
    p.csr_keys[0][i] = (int)csr_key_from_topk(p, (int)i);
    p.csr_vals[0][i] = (int)i;
  }
  const long long scratch =
      (long long)p.radix_passes * CSR_DIGITS + CSR_CTR_INTS + (long long)p.radix_passes * csr_os_tiles(p) * CSR_DIGITS;
  if (i < scratch) p.csr_hist[i] = 0;
}

// Every pass's digit counts, into bins[pass][digit] (zeroed by smla_csr_keys; blocks add with atomics). Any grid:
// the blocks stride over the tiles.
extern "C" __global__ void __launch_bounds__(CSR_HIST_THREADS) smla_csr_histogram(SmlaParams p) {
  typedef cub::detail::radix_sort::AgentRadixSortHistogram<CsrHistPolicy, false, unsigned, int> Agent;
  __shared__ typename Agent::TempStorage tmp;
  Agent(tmp, csr_bins(p), reinterpret_cast<const unsigned*>(p.csr_keys[0]), csr_n(p), 0,
        CSR_RADIX_BITS * p.radix_passes)
      .Process();
}

// bins[pass][*]: counts -> exclusive prefix sums (the digits' first positions). One block a pass.
extern "C" __global__ void __launch_bounds__(CSR_SUM_THREADS) smla_csr_exclusive(SmlaParams p) {
  constexpr int PER = (CSR_DIGITS + CSR_SUM_THREADS - 1) / CSR_SUM_THREADS;
  typedef cub::BlockScan<int, CSR_SUM_THREADS> Scan;
  __shared__ typename Scan::TempStorage tmp;
  int* bins = csr_bins(p) + blockIdx.x * CSR_DIGITS;
  int v[PER];
#pragma unroll
  for (int u = 0; u < PER; ++u) {
    const int b = threadIdx.x * PER + u;
    v[u] = b < CSR_DIGITS ? bins[b] : 0;
  }
  Scan(tmp).ExclusiveSum(v, v);
#pragma unroll
  for (int u = 0; u < PER; ++u) {
    const int b = threadIdx.x * PER + u;
    if (b < CSR_DIGITS) bins[b] = v[u];
  }
}

// Pass p.pass of the sort: buffer pass % 2 -> (pass + 1) % 2. Grid: csr_os_tiles(p) blocks (each takes the next tile
// from the pass's counter, so the look-back only ever waits for tiles already running).
extern "C" __global__ void __launch_bounds__(CSR_OS_THREADS) smla_csr_onesweep(SmlaParams p) {
  typedef cub::detail::radix_sort::AgentRadixSortOnesweep<CsrOnesweepPolicy, false, unsigned, int, int, int> Agent;
  __shared__ typename Agent::TempStorage tmp;
  const int in = p.pass % 2, out = (p.pass + 1) % 2;
  Agent(tmp, csr_lookback(p, p.pass), csr_ctrs(p) + p.pass, nullptr, csr_bins(p) + p.pass * CSR_DIGITS,
        reinterpret_cast<unsigned*>(p.csr_keys[out]), reinterpret_cast<const unsigned*>(p.csr_keys[in]),
        p.csr_vals[out], p.csr_vals[in], csr_n(p), p.pass * CSR_RADIX_BITS, CSR_RADIX_BITS)
      .Process();
}

// row_ptr over the valid items (the first pass dropped the empty slots; row_ptr[num_kv] is their count):
// csr_rowptr.cuh's binary search a kv row, over the n + 1 threads the launch has.
extern "C" __global__ void __launch_bounds__(CSR_THREADS) smla_csr_rowptr(SmlaParams p) {
  smla_csr_rowptr_rows(p.csr_keys[p.csr_final], csr_n(p), p.num_kv, p.row_ptr,
                       (long long)blockIdx.x * CSR_THREADS + threadIdx.x, (long long)gridDim.x * CSR_THREADS);
}
