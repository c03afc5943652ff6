// csr_rowptr.cuh: csr's row_ptr, shared by the CUDA (csr.cu) and AMD (csr.hip) kernels.
//
// row_ptr[j] = the first position of the n sorted keys whose key >= j, for j = 0..num_kv (row_ptr[num_kv]: where
// the keys of num_kv, the empty slots, start): one binary search a kv row, the rows strided over the grid from `first`
// by `step`. It replaced a rule by position (position i wrote the j in (key[i-1], key[i]]), under which the position
// after a chunk's largest key wrote every row up to num_kv alone: a serial tail of num_kv minus that key stores (4.1
// of 6.4 ms at 4096,64,1048576,640 on an H100, perf notes v32). Same values.
#pragma once

__device__ inline void smla_csr_rowptr_rows(const int* keys, int n, int num_kv, int* row_ptr, long long first,
                                            long long step) {
  for (long long j = first; j <= num_kv; j += step) {
    int lo = 0, hi = n;  // the first i in [0, n] with keys[i] >= j (keys[n]: past every key)
    while (lo < hi) {
      const int mid = lo + (hi - lo) / 2;
      if (keys[mid] < j) lo = mid + 1;
      else hi = mid;
    }
    row_ptr[j] = lo;
  }
}
