// csr.cu: per chunk, a stable LSD radix sort of the chunk's slots by kv row, then row_ptr.
//
// Item i = t*r_chunk + rr has key = topk[t, r_start + rr] when valid, else num_kv (an empty slot), and value i.
// Per pass (SmlaParams::pass): hist counts each tile's digits, scan turns the digit-major
// counts into global start positions, scatter ranks each tile stably (CUB block radix sort on the
// pass's bits) and writes keys/values to their positions. Pass p reads buffer p % 2 (pass 0
// reads topk) and writes (p + 1) % 2. rowptr then marks where each kv row's run starts.
// Pass 0 drops the empty slots: it neither counts nor writes them, so the later passes sort only the n_valid valid
// items, at positions 0 .. n_valid - 1 (the causal top-k's rows end in empty slots: 14% of the seed's items, 45% at
// TOPK 1152). n_valid is the pass-0 scan's total, kept in row_ptr[num_kv] (where the sorted row_ptr ends anyway:
// the first position whose key >= num_kv); the positions past it are left unwritten (nothing reads them).
// Constants are CSR_-prefixed: CUB uses RADIX_BITS etc. as template parameter names.
#include "smla_params.h"
#include "common.cuh"
#include <cub/block/block_radix_sort.cuh>

#ifndef CSR_RADIX_BITS
#define CSR_RADIX_BITS 8
#endif
#ifndef CSR_TILE_ITEMS
#define CSR_TILE_ITEMS 2048
#endif
#ifndef CSR_THREADS
#define CSR_THREADS 256
#endif
#ifndef CSR_SCAN_THREADS
#define CSR_SCAN_THREADS 1024
#endif

#define CSR_DIGITS (1 << CSR_RADIX_BITS)
#define CSR_ITEMS (CSR_TILE_ITEMS / CSR_THREADS)
#define CSR_PAD_KEY 0xffffffffu  // past the end of the last tile: sorts last, never written

static_assert(CSR_RADIX_BITS >= 1 && CSR_RADIX_BITS <= 8, "CSR_RADIX_BITS must be in 1..8");
static_assert(CSR_TILE_ITEMS % CSR_THREADS == 0, "CSR_TILE_ITEMS must be a multiple of CSR_THREADS");
static_assert(CSR_SCAN_THREADS % 32 == 0 && CSR_SCAN_THREADS <= 1024, "CSR_SCAN_THREADS: whole warps, at most 1024");

__device__ __forceinline__ int csr_n(const SmlaParams& p) { return p.T * p.r_chunk; }  // < 2^31: host-checked

__device__ __forceinline__ unsigned csr_key_from_topk(const SmlaParams& p, int i) {
  const int t = i / p.r_chunk, rr = i - t * p.r_chunk;
  if (p.r_start + rr >= p.topk_n) return (unsigned)p.num_kv;  // ragged last chunk: empty
  const int k = p.topk[t * p.topk_st + p.r_start + rr];
  return smla_valid_index(k, p.num_kv) ? (unsigned)k : (unsigned)p.num_kv;
}

__device__ __forceinline__ unsigned csr_key(const SmlaParams& p, int i) {
  return p.pass == 0 ? csr_key_from_topk(p, i) : (unsigned)p.csr_keys[p.pass % 2][i];
}

__device__ __forceinline__ int csr_digit(unsigned key, int shift) { return (int)((key >> shift) & (CSR_DIGITS - 1)); }

// The items a pass sorts: all of the chunk's in pass 0, the valid ones after it (written by pass 0's scan; read by
// kernels launched after it, never by the one that writes it).
__device__ __forceinline__ int csr_items(const SmlaParams& p) { return p.pass == 0 ? csr_n(p) : p.row_ptr[p.num_kv]; }

extern "C" __global__ void __launch_bounds__(CSR_THREADS) smla_csr_hist(SmlaParams p) {
  __shared__ int cnt[CSR_DIGITS];
  for (int d = threadIdx.x; d < CSR_DIGITS; d += CSR_THREADS) cnt[d] = 0;
  __syncthreads();
  const int n = csr_items(p), shift = p.pass * CSR_RADIX_BITS;
  const int base = blockIdx.x * CSR_TILE_ITEMS;
  for (int j = threadIdx.x; j < CSR_TILE_ITEMS; j += CSR_THREADS) {
    const int i = base + j;
    if (i >= n) continue;  // (a tile past the valid items still writes its zero counts below)
    const unsigned key = csr_key(p, i);
    if (key != (unsigned)p.num_kv) atomicAdd(&cnt[csr_digit(key, shift)], 1);  // integer counts: order-free
  }
  __syncthreads();
  for (int d = threadIdx.x; d < CSR_DIGITS; d += CSR_THREADS) p.csr_hist[d * p.csr_tiles + blockIdx.x] = cnt[d];
}

// Exclusive scan of csr_hist in place, one block, over chunks of CSR_SCAN_THREADS * SCAN_ITEMS
// counts: coalesced loads into shared memory, each thread scans SCAN_ITEMS consecutive counts,
// a block scan joins the threads, coalesced stores; a carry runs across chunks.
#define SCAN_ITEMS 8
#define SCAN_CHUNK (CSR_SCAN_THREADS * SCAN_ITEMS)
#define SCAN_PAD(i) ((i) + (i) / 32)  // one spare word per 32: thread-contiguous reads hit 32 banks

// Exclusive block-wide scan of v; *total gets the sum. Every thread of the block must call it.
__device__ __forceinline__ int csr_block_exclusive_scan(int v, int* warp_tot, int* total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int u = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += u;
  }
  if (lane == 31) warp_tot[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    int w = lane < CSR_SCAN_THREADS / 32 ? warp_tot[lane] : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int u = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += u;
    }
    if (lane < CSR_SCAN_THREADS / 32) warp_tot[lane] = w;
  }
  __syncthreads();
  *total = warp_tot[CSR_SCAN_THREADS / 32 - 1];
  const int excl = incl - v + (warp > 0 ? warp_tot[warp - 1] : 0);
  __syncthreads();  // warp_tot is reused by the next call
  return excl;
}

extern "C" __global__ void __launch_bounds__(CSR_SCAN_THREADS) smla_csr_scan(SmlaParams p) {
  __shared__ int buf[SCAN_PAD(SCAN_CHUNK)];
  __shared__ int warp_tot[32];
  const int n = CSR_DIGITS * p.csr_tiles;
  int carry = 0;
  for (int base = 0; base < n; base += SCAN_CHUNK) {
#pragma unroll
    for (int j = 0; j < SCAN_ITEMS; ++j) {
      const int i = j * CSR_SCAN_THREADS + threadIdx.x;
      buf[SCAN_PAD(i)] = base + i < n ? p.csr_hist[base + i] : 0;
    }
    __syncthreads();
    int local = 0;
#pragma unroll
    for (int j = 0; j < SCAN_ITEMS; ++j) local += buf[SCAN_PAD(threadIdx.x * SCAN_ITEMS + j)];
    int total;
    int run = carry + csr_block_exclusive_scan(local, warp_tot, &total);
#pragma unroll
    for (int j = 0; j < SCAN_ITEMS; ++j) {
      const int k = SCAN_PAD(threadIdx.x * SCAN_ITEMS + j);
      const int c = buf[k];
      buf[k] = run;
      run += c;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < SCAN_ITEMS; ++j) {
      const int i = j * CSR_SCAN_THREADS + threadIdx.x;
      if (base + i < n) p.csr_hist[base + i] = buf[SCAN_PAD(i)];
    }
    carry += total;
    __syncthreads();  // buf is refilled by the next chunk
  }
  if (p.pass == 0 && threadIdx.x == 0) p.row_ptr[p.num_kv] = carry;  // n_valid: the items the later passes sort
}

extern "C" __global__ void __launch_bounds__(CSR_THREADS) smla_csr_scatter(SmlaParams p) {
  typedef cub::BlockRadixSort<unsigned, CSR_THREADS, CSR_ITEMS, int> BlockSort;
  __shared__ typename BlockSort::TempStorage sort_tmp;
  __shared__ int s_start[CSR_DIGITS];  // first tile-sorted rank of each digit
  __shared__ int s_last[CSR_THREADS];  // digit of each thread's last sorted item

  const int n = csr_items(p), shift = p.pass * CSR_RADIX_BITS;
  const int base = blockIdx.x * CSR_TILE_ITEMS;
  if (base >= n) return;  // a tile past the valid items (pass >= 1): nothing to sort
  // Pass 0 sorts a tile by its digit with one more bit, set for an empty slot or an item past the chunk (CSR_DIGITS):
  // those rank after every valid item of the tile and are not written; the valid key is read again from the top-k
  // by its value (the item) when it is written. Later passes sort the keys themselves; their only padding is past
  // the last valid item (CSR_PAD_KEY, last in input order, so it never ranks before a valid item of its digit).
  const bool first = p.pass == 0;
  unsigned keys[CSR_ITEMS];
  int vals[CSR_ITEMS];
  // Blocked arrangement: rank order = input order, which the stable block sort keeps per digit.
#pragma unroll
  for (int j = 0; j < CSR_ITEMS; ++j) {
    const int i = base + threadIdx.x * CSR_ITEMS + j;
    if (first) {
      const unsigned key = i < n ? csr_key_from_topk(p, i) : (unsigned)p.num_kv;
      keys[j] = key == (unsigned)p.num_kv ? CSR_DIGITS : (unsigned)csr_digit(key, 0);
      vals[j] = i;
    } else if (i < n) {
      keys[j] = (unsigned)p.csr_keys[p.pass % 2][i];
      vals[j] = p.csr_vals[p.pass % 2][i];
    } else {
      keys[j] = CSR_PAD_KEY;
      vals[j] = -1;
    }
  }
  if (first)
    BlockSort(sort_tmp).Sort(keys, vals, 0, CSR_RADIX_BITS + 1);
  else
    BlockSort(sort_tmp).Sort(keys, vals, shift, shift + CSR_RADIX_BITS);
  // An item's digit (CSR_DIGITS: not written) after the sort.
  auto digit_of = [&](unsigned key) {
    return first ? (int)key : key == CSR_PAD_KEY ? CSR_DIGITS : csr_digit(key, shift);
  };

  s_last[threadIdx.x] = digit_of(keys[CSR_ITEMS - 1]);
  __syncthreads();
  int prev = threadIdx.x == 0 ? -1 : s_last[threadIdx.x - 1];
#pragma unroll
  for (int j = 0; j < CSR_ITEMS; ++j) {
    const int d = digit_of(keys[j]);
    if (d != prev && d < CSR_DIGITS) s_start[d] = threadIdx.x * CSR_ITEMS + j;  // one writer per digit
    prev = d;
  }
  __syncthreads();

  int* keys_out = p.csr_keys[(p.pass + 1) % 2];
  int* vals_out = p.csr_vals[(p.pass + 1) % 2];
#pragma unroll
  for (int j = 0; j < CSR_ITEMS; ++j) {
    const int d = digit_of(keys[j]);
    if (d == CSR_DIGITS) continue;
    const int pos = p.csr_hist[d * p.csr_tiles + blockIdx.x] + (threadIdx.x * CSR_ITEMS + j - s_start[d]);
    keys_out[pos] = first ? (int)csr_key_from_topk(p, vals[j]) : (int)keys[j];
    vals_out[pos] = vals[j];
  }
}

// row_ptr[j] = first sorted position whose key >= j, j = 0..num_kv - 1 (row_ptr[num_kv] = n_valid is pass 0's).
// Position i (0..n_valid) writes the j in (key[i-1], key[i]] (with key[-1] = -1 and key[n_valid] = num_kv): each j
// exactly once.
extern "C" __global__ void __launch_bounds__(CSR_THREADS) smla_csr_rowptr(SmlaParams p) {
  const int n = p.row_ptr[p.num_kv];
  const long long i = (long long)blockIdx.x * CSR_THREADS + threadIdx.x;
  if (i > n) return;
  const int* keys = p.csr_keys[p.csr_final];
  const int cur = i < n ? keys[i] : p.num_kv;
  const int prev = i == 0 ? -1 : keys[i - 1];
  const int hi = min(cur, p.num_kv - 1);
  for (int j = prev + 1; j <= hi; ++j) p.row_ptr[j] = (int)i;
}
