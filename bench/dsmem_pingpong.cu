// dsmem_pingpong.cu: what a tile of the D-split dq pair (perf notes v16) would pay to exchange data with its peer:
// clusters of two CTAs, each round every CTA writes BYTES into its peer's shared memory (16 bytes a thread, through
// distributed shared memory), both synchronize the cluster, each reads what it received, and both synchronize again
// (so that the next round's writes do not overtake the reads): the pattern of one exchange. Prints SM cycles a round
// (clock64 on the CTA of rank 0 of cluster 0) for 0, 2, 8 and 16 KB, with one CTA an SM (200 KB of shared memory
// asked for) and two (100 KB each), every SM busy.
// Standalone (not part of the library or its tests):
//   nvcc -gencode arch=compute_90a,code=sm_90a -std=c++17 -O3 -o dsmem_pingpong bench/dsmem_pingpong.cu
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include "cuda_check.cuh"
#include <cstdio>

namespace cg = cooperative_groups;

constexpr int kRounds = 2000;

__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(256, 2)
    pingpong(int bytes, long long* cycles, unsigned* sink) {
  extern __shared__ uint4 recv[];
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned peer = cluster.block_rank() ^ 1u;
  uint4* peer_recv = cluster.map_shared_rank(recv, peer);
  const int pieces = bytes / 16;
  for (int i = threadIdx.x; i < pieces; i += blockDim.x) recv[i] = make_uint4(0u, 0u, 0u, 0u);
  cluster.sync();
  unsigned s = 0;
  const long long t0 = clock64();
  for (int r = 0; r < kRounds; ++r) {
    for (int i = threadIdx.x; i < pieces; i += blockDim.x) peer_recv[i] = make_uint4(r, i, r ^ i, r + i);
    cluster.sync();  // the peer's pieces are here
    for (int i = threadIdx.x; i < pieces; i += blockDim.x) s += recv[i].x ^ recv[i].w;
    cluster.sync();  // both read: the next round may write
  }
  const long long t1 = clock64();
  if (blockIdx.x == 0 && threadIdx.x == 0) *cycles = t1 - t0;
  if (s == 0x12345678u) sink[threadIdx.x] = s;  // keeps the reads
}

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  long long* dc;
  unsigned* ds;
  CHECK(cudaMalloc(&dc, sizeof(long long)));
  CHECK(cudaMalloc(&ds, 256 * sizeof(unsigned)));
  CHECK(cudaFuncSetAttribute(pingpong, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
  printf("cluster of 2, every round: write BYTES into the peer, cluster sync, read, cluster sync\n");
  for (int per_sm = 1; per_sm <= 2; ++per_sm) {
    const int smem = per_sm == 1 ? 200 * 1024 : 100 * 1024;
    int resident = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, pingpong, 256, smem));
    const int blocks = (sms * per_sm) & ~1;  // whole clusters
    for (int bytes : {0, 2048, 8192, 16384}) {
      pingpong<<<blocks, 256, smem>>>(bytes, dc, ds);  // warm-up
      CHECK(cudaGetLastError());
      const float ms = median_ms([&] { pingpong<<<blocks, 256, smem>>>(bytes, dc, ds); }, 5, 1);
      long long cyc = 0;
      CHECK(cudaMemcpy(&cyc, dc, sizeof(cyc), cudaMemcpyDeviceToHost));
      printf("%d CTA(s) an SM (occupancy says %d), %5d bytes: %7.1f SM cycles a round, %.3f us a round\n", per_sm,
             resident, bytes, (double)cyc / kRounds, ms * 1e3 / kRounds);
    }
  }
  CHECK(cudaFree(dc));
  CHECK(cudaFree(ds));
  return 0;
}
