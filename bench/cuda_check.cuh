// cuda_check.cuh: CHECK(x) for the standalone microbenchmarks of bench/ (wgmma_rate.cu, gather_rate.cu): a CUDA
// runtime call that fails prints where and why, and the program exits 1.
#pragma once
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>

#define CHECK(x)                                                                         \
  do {                                                                                   \
    cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                             \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)
