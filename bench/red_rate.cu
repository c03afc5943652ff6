// red_rate.cu: what dkv's reduction would cost as fp32 reductions into L2 (what cuDNN's and TileLang's sparse-MLA
// backwards do, with atomics) against what smla's interm round trip costs (bf16 rows written to device memory, read
// back in kv-row order). Standalone (not part of the library or its tests):
//   nvcc -gencode arch=compute_90a,code=sm_90a -std=c++17 -O3 -o red_rate bench/red_rate.cu
//   ./red_rate [T H NUM_KV TOPK]      (default the seed, 4096 128 5120 512; H only names the shape)
// The contributions are the benchmark top-k's valid slots (CONTRACT.md: the window t, t-1, ..., then random visible
// pool rows), one 512-float row each, in token order, as dkv_interm produces them. Each form runs once from a zeroed
// table and is checked (the table's sum is the number of contributions times the row's sum), then timed:
//   red.v4     each warp adds a row with red.global.add.v4.f32 (16 bytes a lane, 4 instructions a lane)
//   bulk       each warp's lane 0 adds a row from shared memory with one cp.reduce.async.bulk .add.f32 (2 KB)
//   *-uniform  the same with the rows spread uniformly over the table (no hot rows)
//   store      the interm write it would replace: each row 1 KB of bf16 to its own place (device memory)
//   read       the gather's read: the same rows read back in kv-row order (sorted by row), summed into registers
// Why (perf notes v21): the reduction forms decide whether an opt-in non-deterministic dkv (no interm, no csr, no
// gather) could beat the deterministic CSR design on Hopper.
#include <cuda_runtime.h>
#include "cuda_check.cuh"
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <vector>

constexpr int D = 512;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__global__ void __launch_bounds__(kThreads) red_v4(float* table, const int* rows, int n) {
  const int lane = threadIdx.x % 32;
  const float4 v = make_float4(1.f, 1.f, 1.f, 1.f);
  for (int i = blockIdx.x * kWarps + threadIdx.x / 32; i < n; i += gridDim.x * kWarps) {
    float* r = table + (long long)rows[i] * D + lane * 4;
#pragma unroll
    for (int k = 0; k < 4; ++k)
      asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(r + k * 128), "f"(v.x), "f"(v.y), "f"(v.z),
                   "f"(v.w)
                   : "memory");
  }
}

__global__ void __launch_bounds__(kThreads) red_bulk(float* table, const int* rows, int n) {
  __shared__ __align__(128) float src[kWarps][D];
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int c = lane; c < D; c += 32) src[w][c] = 1.f;
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncwarp();
  if (lane != 0) return;
  const unsigned s = unsigned(__cvta_generic_to_shared(&src[w][0]));
  int issued = 0;
  for (int i = blockIdx.x * kWarps + w; i < n; i += gridDim.x * kWarps) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(
                     table + (long long)rows[i] * D),
                 "r"(s), "r"(D * 4)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    if (++issued % 16 == 0) asm volatile("cp.async.bulk.wait_group.read 16;" ::: "memory");
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

// interm's write: row i's 1 KB of bf16 (here: its 512 bf16 ones) at interm + i * D.
__global__ void __launch_bounds__(kThreads) store_bf16(unsigned short* interm, int n) {
  const int lane = threadIdx.x % 32;
  const uint4 one = make_uint4(0x3f803f80u, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u);
  for (int i = blockIdx.x * kWarps + threadIdx.x / 32; i < n; i += gridDim.x * kWarps) {
    uint4* r = reinterpret_cast<uint4*>(interm + (long long)i * D);
    r[lane] = one;
    r[lane + 32] = one;
  }
}

// The gather's read: contributions in kv-row order (order[j] = the contribution's interm row), a warp per kv row run.
__global__ void __launch_bounds__(kThreads) read_bf16(const unsigned short* interm, const int* order,
                                                       const int* row_ptr, int num_kv, float* out) {
  const int lane = threadIdx.x % 32;
  for (int j = blockIdx.x * kWarps + threadIdx.x / 32; j < num_kv; j += gridDim.x * kWarps) {
    float acc = 0.f;
    for (int c = row_ptr[j]; c < row_ptr[j + 1]; ++c) {
      const uint4* r = reinterpret_cast<const uint4*>(interm + (long long)order[c] * D);
      const uint4 a = r[lane], b = r[lane + 32];
      acc += __uint_as_float(a.x << 16) + __uint_as_float(b.w & 0xffff0000u);
    }
    out[(long long)j * 32 + lane] = acc;
  }
}

int main(int argc, char** argv) {
  int T = 4096, H = 128, num_kv = 5120, K = 512;
  if (argc == 5) T = atoi(argv[1]), H = atoi(argv[2]), num_kv = atoi(argv[3]), K = atoi(argv[4]);
  // The benchmark top-k's valid slots, token-major.
  std::mt19937_64 rng(1);
  std::vector<int> rows;
  const int n_pool = num_kv - T;
  for (int t = 0; t < T; ++t) {
    for (int r = 0; r < std::min(K, 128); ++r)
      if (t - r >= 0) rows.push_back(t - r);
    const int visible = std::min(n_pool, (t + 1) / 4), n_sel = std::min(K - 128, visible);
    std::vector<int> pick(visible);
    std::iota(pick.begin(), pick.end(), 0);
    for (int s = 0; s < n_sel; ++s) {
      std::uniform_int_distribution<int> u(s, visible - 1);
      std::swap(pick[s], pick[u(rng)]);
      rows.push_back(T + pick[s]);
    }
  }
  const int n = int(rows.size());
  std::vector<int> uniform(n);
  for (int i = 0; i < n; ++i) uniform[i] = int(rng() % unsigned(num_kv));
  // kv-row order for the read (a counting sort: stable, as csr's).
  std::vector<int> row_ptr(num_kv + 1, 0), order(n);
  for (int r : rows) ++row_ptr[r + 1];
  std::partial_sum(row_ptr.begin(), row_ptr.end(), row_ptr.begin());
  {
    std::vector<int> fill(row_ptr.begin(), row_ptr.end() - 1);
    for (int i = 0; i < n; ++i) order[fill[rows[i]]++] = i;
  }
  int hottest = 0;
  for (int j = 0; j < num_kv; ++j) hottest = std::max(hottest, row_ptr[j + 1] - row_ptr[j]);
  printf("T %d H %d num_kv %d TOPK %d: %d contributions (rows of 512 fp32: %.2f GB), hottest row %d\n", T, H, num_kv,
         K, n, n * 2048.0 / 1e9, hottest);

  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  float *table, *out;
  int *d_rows, *d_uniform, *d_order, *d_row_ptr;
  unsigned short* interm;
  CHECK(cudaMalloc(&table, (size_t)num_kv * D * 4));
  CHECK(cudaMalloc(&out, (size_t)num_kv * 32 * 4));
  CHECK(cudaMalloc(&d_rows, n * 4));
  CHECK(cudaMalloc(&d_uniform, n * 4));
  CHECK(cudaMalloc(&d_order, n * 4));
  CHECK(cudaMalloc(&d_row_ptr, (num_kv + 1) * 4));
  CHECK(cudaMalloc(&interm, (size_t)n * D * 2));
  CHECK(cudaMemcpy(d_rows, rows.data(), n * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_uniform, uniform.data(), n * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_order, order.data(), n * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_row_ptr, row_ptr.data(), (num_kv + 1) * 4, cudaMemcpyHostToDevice));

  std::vector<float> host((size_t)num_kv * D);
  auto checked = [&](const char* name, auto launch) {
    CHECK(cudaMemset(table, 0, (size_t)num_kv * D * 4));
    launch();
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(host.data(), table, host.size() * 4, cudaMemcpyDeviceToHost));
    const double sum = std::accumulate(host.begin(), host.end(), 0.0), want = double(n) * D;
    if (sum != want) {
      printf("%s: table sum %.0f, expected %.0f: WRONG\n", name, sum, want);
      exit(1);
    }
  };
  auto report = [&](const char* name, int blocks, double bytes, auto launch) {
    const float ms = median_ms(launch, 10, 2);
    printf("%-14s %5d blocks  %8.3f ms  %6.2f TB/s\n", name, blocks, ms, bytes / (ms * 1e-3) / 1e12);
  };
  for (int per_sm : {4, 8}) {
    const int g = sms * per_sm;
    auto v4 = [&] { red_v4<<<g, kThreads>>>(table, d_rows, n); };
    auto v4u = [&] { red_v4<<<g, kThreads>>>(table, d_uniform, n); };
    auto bulk = [&] { red_bulk<<<g, kThreads>>>(table, d_rows, n); };
    auto bulku = [&] { red_bulk<<<g, kThreads>>>(table, d_uniform, n); };
    checked("red.v4", v4);
    checked("bulk", bulk);
    checked("red.v4-uniform", v4u);
    checked("bulk-uniform", bulku);
    report("red.v4", g, n * 2048.0, v4);
    report("red.v4-uniform", g, n * 2048.0, v4u);
    report("bulk", g, n * 2048.0, bulk);
    report("bulk-uniform", g, n * 2048.0, bulku);
    report("store", g, n * 1024.0, [&] { store_bf16<<<g, kThreads>>>(interm, n); });
    report("read", g, n * 1024.0, [&] { read_bf16<<<g, kThreads>>>(interm, d_order, d_row_ptr, num_kv, out); });
  }
  CHECK(cudaGetLastError());
  return 0;
}
