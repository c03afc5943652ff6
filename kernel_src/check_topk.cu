// check_topk.cu: count the out-of-range slots (k < -1 || k >= num_kv) of the whole top-k and
// report the row-major first. Three launches: init writes the report from scratch, scan adds
// per-block counts and takes the minimum linear position with integer atomics (both
// order-independent), final turns that position into (t, r, value).
#include "smla_params.h"
#include "common.cuh"

#ifndef NUM_THREADS
#define NUM_THREADS 256
#endif
static_assert(NUM_THREADS % 32 == 0 && NUM_THREADS <= 1024, "NUM_THREADS: whole warps, at most 1024");

#define CT_NONE 0x7fffffff  // "no bad slot yet" as a linear position

extern "C" __global__ void smla_check_topk_init(SmlaParams p) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    p.index_report[0] = 0;
    p.index_report[1] = CT_NONE;
    p.index_report[2] = -1;
    p.index_report[3] = 0;
  }
}

extern "C" __global__ void __launch_bounds__(NUM_THREADS) smla_check_topk_scan(SmlaParams p) {
  __shared__ int s_count[NUM_THREADS / 32], s_first[NUM_THREADS / 32];
  const long long n = (long long)p.T * p.topk_n;  // < 2^31: checked on the host
  int count = 0, first = CT_NONE;
  for (long long e = (long long)blockIdx.x * NUM_THREADS + threadIdx.x; e < n; e += (long long)gridDim.x * NUM_THREADS) {
    const int t = (int)(e / p.topk_n), r = (int)(e % p.topk_n);
    const int k = p.topk[t * p.topk_st + r];
    if (k < -1 || k >= p.num_kv) {
      ++count;
      first = min(first, (int)e);
    }
  }
  count = smla_warp_sum_i(count);
  first = smla_warp_min_i(first);
  if (threadIdx.x % 32 == 0) {
    s_count[threadIdx.x / 32] = count;
    s_first[threadIdx.x / 32] = first;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < NUM_THREADS / 32; ++w) {
      count += s_count[w];
      first = min(first, s_first[w]);
    }
    if (count > 0) {
      atomicAdd(&p.index_report[0], count);
      atomicMin(&p.index_report[1], first);
    }
  }
}

extern "C" __global__ void smla_check_topk_final(SmlaParams p) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  const int e = p.index_report[1];
  if (p.index_report[0] == 0 || e == CT_NONE) {
    p.index_report[1] = -1;
    p.index_report[2] = -1;
    p.index_report[3] = 0;
    return;
  }
  const int t = e / p.topk_n, r = e % p.topk_n;
  p.index_report[1] = t;
  p.index_report[2] = r;
  p.index_report[3] = p.topk[t * p.topk_st + r];
}
