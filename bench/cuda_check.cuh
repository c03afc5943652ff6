// cuda_check.cuh: for the standalone microbenchmarks of bench/ (wgmma_rate.cu, gather_rate.cu, mem_rate.cu):
// CHECK(x), a CUDA runtime call that fails prints where and why and the program exits 1; median_ms, the median time
// of a launch.
#pragma once
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x)                                                                         \
  do {                                                                                   \
    cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                             \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

// Median milliseconds of `reps` calls of `launch` (kernel launches on the default stream), each timed with events,
// after `warm` calls that are not counted.
template <class F>
float median_ms(F&& launch, int reps, int warm) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int rep = 0; rep < warm + reps; ++rep) {
    CHECK(cudaEventRecord(a));
    launch();
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float m = 0;
    CHECK(cudaEventElapsedTime(&m, a, b));
    if (rep >= warm) ms.push_back(m);
  }
  CHECK(cudaGetLastError());
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}
