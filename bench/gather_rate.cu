// gather_rate.cu: how fast 132 SMs gather the benchmark top-k's kv rows (1 KB each) from L2 into shared memory,
// with nothing else running: the floor of a dq body's kv traffic. One block an SM (200 KB of shared memory asked
// for), one block per (token, head group); each block copies its token's TOPK rows (empty slots skipped) in tiles
// of R rows with cp.async, two tiles in flight, and waits for each. Standalone (not part of the library or its
// tests):
//   nvcc -gencode arch=compute_90a,code=sm_90a -std=c++17 -O3 -o gather_rate bench/gather_rate.cu
//   ./gather_rate [T H NUM_KV TOPK]   (default 4096 128 5120 512)
// Why: a dq body with 32-head blocks (S^T and dP^T as one m64n64k16, the design perf notes v11/v12 discuss) gathers
// every kv row four times a token at H 128 instead of twice (8.6 GB at the seed instead of 4.3): whether L2 can
// serve that in well under dq's present 2.4 ms decides whether the design is worth building.
#include <cuda_runtime.h>
#include "cuda_check.cuh"
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

constexpr int kThreads = 256;
constexpr int kSmem = 200 * 1024;  // one block an SM, like the dq bodies

__device__ __forceinline__ void cp16(unsigned dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}

// Block b: token b % T, head group b / T (the groups only repeat the token's gather, as separate blocks do).
template <int R>
__global__ void __launch_bounds__(kThreads, 1)
    gather(const uint4* kv, const int* topk, int T, int topk_n, int* sink) {
  extern __shared__ uint4 smem[];
  const unsigned s0 = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int t = blockIdx.x % T;
  const int* row = topk + (long long)t * topk_n;
  const int n_tiles = (topk_n + R - 1) / R;
  int seen = 0;
  for (int tile = 0; tile < n_tiles; ++tile) {
    const unsigned buf = s0 + (tile & 1) * (R * 1024);
    for (int i = threadIdx.x; i < R * 64; i += kThreads) {  // 64 pieces of 16 B a row
      const int rr = tile * R + i / 64;
      const int k = rr < topk_n ? __ldg(row + rr) : -1;
      if (k >= 0) cp16(buf + i * 16, kv + (long long)k * 64 + i % 64);
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
    if (tile > 0) asm volatile("cp.async.wait_group 1;" ::: "memory");
    __syncthreads();
    seen += reinterpret_cast<const int*>(smem)[threadIdx.x];  // a read of the landed tile
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");
  if (seen == 0x7fffffff) sink[0] = seen;  // keeps the read
}

// The contract's benchmark top-k: slots 0..127 the sliding window t, t-1, ...; the rest distinct visible pool rows
// (pool row j visible to t once 4 (j + 1) <= t + 1), chosen at random; -1 where there are none.
static std::vector<int> bench_topk(int T, int num_kv, int topk_n, unsigned seed) {
  std::vector<int> out((size_t)T * topk_n, -1);
  std::mt19937 rng(seed);
  std::vector<int> pool;
  for (int t = 0; t < T; ++t) {
    int* r = &out[(size_t)t * topk_n];
    const int swa = std::min(topk_n, 128);
    for (int s = 0; s < swa; ++s) r[s] = t - s >= 0 ? t - s : -1;
    const int visible = std::min((t + 1) / 4, num_kv - T);
    pool.resize(visible);
    for (int j = 0; j < visible; ++j) pool[j] = T + j;
    const int want = std::min(topk_n - swa, visible);
    for (int s = 0; s < want; ++s) {  // partial Fisher-Yates
      std::uniform_int_distribution<int> d(s, visible - 1);
      std::swap(pool[s], pool[d(rng)]);
      r[swa + s] = pool[s];
    }
  }
  return out;
}

template <int R>
static void run(const char* name, int groups, int T, int topk_n, long long valid, const uint4* kv, const int* topk,
                int* sink) {
  CHECK(cudaFuncSetAttribute(gather<R>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const double med = median_ms([&] { gather<R><<<T * groups, kThreads, kSmem>>>(kv, topk, T, topk_n, sink); }, 20, 3);
  const double gb = double(valid) * groups * 1024 / 1e9;
  printf("%-34s tiles of %2d rows, %d blocks a token: %6.2f GB in %.3f ms = %5.2f TB/s (median of 20)\n", name, R,
         groups, gb, med, gb / med);  // GB a ms = TB/s
}

int main(int argc, char** argv) {
  const int T = argc > 1 ? atoi(argv[1]) : 4096, H = argc > 2 ? atoi(argv[2]) : 128;
  const int num_kv = argc > 3 ? atoi(argv[3]) : 5120, topk_n = argc > 4 ? atoi(argv[4]) : 512;
  if (T <= 0 || H <= 0 || H % 32 || num_kv <= T || topk_n <= 0) {
    fprintf(stderr, "usage: gather_rate [T H NUM_KV TOPK] (H a multiple of 32, NUM_KV > T)\n");
    return 2;
  }
  const std::vector<int> tk = bench_topk(T, num_kv, topk_n, 1234);
  long long valid = 0;
  for (int k : tk) valid += k >= 0;
  uint4* kv;
  int *topk, *sink;
  CHECK(cudaMalloc(&kv, (size_t)num_kv * 1024));
  CHECK(cudaMemset(kv, 1, (size_t)num_kv * 1024));
  CHECK(cudaMalloc(&topk, tk.size() * sizeof(int)));
  CHECK(cudaMemcpy(topk, tk.data(), tk.size() * sizeof(int), cudaMemcpyHostToDevice));
  CHECK(cudaMalloc(&sink, sizeof(int)));
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  printf("T %d H %d num_kv %d TOPK %d: %lld valid slots, %d SMs\n", T, H, num_kv, topk_n, valid, sms);
  run<32>("64-head blocks (dq_impl 3's traffic)", H / 64, T, topk_n, valid, kv, topk, sink);
  run<64>("64-head blocks", H / 64, T, topk_n, valid, kv, topk, sink);
  run<64>("32-head blocks", H / 32, T, topk_n, valid, kv, topk, sink);
  run<32>("32-head blocks", H / 32, T, topk_n, valid, kv, topk, sink);
  CHECK(cudaFree(kv));
  CHECK(cudaFree(topk));
  CHECK(cudaFree(sink));
  return 0;
}
