// csr.hip: the csr phase on AMD, around rocPRIM's radix_sort_pairs (libsmla_rocprim.so, built
// ahead of time; launched by HipBackend as the pseudo-kernel "@rocprim").
//
//   smla_csr_keys    item i = t*r_chunk + rr: key = topk[t, r_start+rr] if valid else num_kv,
//                    value i, into buffer in = 1 - csr_final;
//   @rocprim         stable sort of (key, value) from buffer `in` to buffer csr_final, on bits
//                    [0, radix_bits_for(num_kv)), with csr_hist as its temporary storage;
//   smla_csr_rowptr  row_ptr[j] = first sorted position whose key >= j, j = 0..num_kv.
// The result lands where the CUDA sort leaves it (csr_keys/csr_vals[csr_final]), so gather is
// the same on both.
#include "smla_params.h"
#include "common.cuh"
#include "csr_rowptr.cuh"

#ifndef CSR_THREADS
#define CSR_THREADS 256
#endif

extern "C" __global__ void __launch_bounds__(CSR_THREADS) smla_csr_keys(SmlaParams p) {
  const int n = p.T * p.r_chunk;  // < 2^31: host-checked
  const long long i = (long long)blockIdx.x * CSR_THREADS + threadIdx.x;
  if (i >= n) return;
  const int t = (int)(i / p.r_chunk), rr = (int)(i - (long long)t * p.r_chunk);
  int key = p.num_kv;  // empty, out of range, or past topk in a ragged last chunk
  if (p.r_start + rr < p.topk_n) {
    const int k = p.topk[t * p.topk_st + p.r_start + rr];
    if (smla_valid_index(k, p.num_kv)) key = k;
  }
  const int in = 1 - p.csr_final;
  p.csr_keys[in][i] = key;
  p.csr_vals[in][i] = (int)i;
}

// row_ptr over all n items, the empty slots keyed num_kv (row_ptr[num_kv]: where they start):
// csr_rowptr.cuh's binary search a kv row, over the n + 1 threads the launch has.
extern "C" __global__ void __launch_bounds__(CSR_THREADS) smla_csr_rowptr(SmlaParams p) {
  smla_csr_rowptr_rows(p.csr_keys[p.csr_final], p.T * p.r_chunk, p.num_kv, p.row_ptr,
                       (long long)blockIdx.x * CSR_THREADS + threadIdx.x, (long long)gridDim.x * CSR_THREADS);
}
