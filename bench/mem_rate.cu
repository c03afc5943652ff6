// mem_rate.cu: how many bytes a second one SM moves between device memory and shared memory or registers, by the
// instruction forms smla's kernels use (per-thread cp.async and st.global) against bulk copies (cp.async.bulk, one
// thread issuing whole pieces), with 132, 66 or 33 SMs busy. One block an SM (200 KB of shared memory asked for),
// each streaming its own 16 MB region of a buffer far larger than L2. Standalone (not part of the library or its
// tests):
//   nvcc -gencode arch=compute_90a,code=sm_90a -std=c++17 -O3 -I kernel_src -o mem_rate bench/mem_rate.cu
//   ./mem_rate
// Why (perf notes v13): dq and dkv_interm run side by side on disjoint SMs took as long as one after the other, and
// dq's time grew almost in proportion as it was given fewer SMs, so each is held by what one SM can do, not by the
// device's memory. If an SM's memory traffic is capped by the way it is issued (per-thread 16-byte copies and 4- or
// 16-byte stores), bulk copies would lift the cap; if the cap is the same for both, it is the SM's share of the
// memory system and only fewer bytes help.
#include <cuda_runtime.h>
#include "cuda_check.cuh"
#include <cstdio>

#include "common.cuh"
#include "wgmma.cuh"
#include "sm90_sync.cuh"

constexpr int kThreads = 256;
constexpr int kSmem = 200 * 1024;
constexpr int kStage = 32 * 1024;            // bytes a stage (a dq kv tile)
constexpr long long kPerBlock = 16ll << 20;  // bytes each block streams

// Loads, per-thread cp.async of 16 bytes (dq's and dkv_interm's form): each stage 32 KB, DEPTH stages in flight.
template <int DEPTH>
__global__ void __launch_bounds__(kThreads, 1) load_cp(const char* src, int* sink) {
  extern __shared__ __align__(1024) char smem[];
  const char* base = src + blockIdx.x * kPerBlock;
  const unsigned s0 = smla_smem_addr(smem);
  for (long long st = 0; st < kPerBlock / kStage; ++st) {
    const unsigned buf = s0 + (st % DEPTH) * kStage;
    for (int i = threadIdx.x; i < kStage / 16; i += kThreads)
      smla_cp_async16(smem + (buf - s0) + i * 16, base + st * kStage + i * 16);
    smla_cp_async_commit();
    smla_cp_async_wait<DEPTH - 1>();
  }
  smla_cp_async_wait<0>();
  __syncthreads();
  if (reinterpret_cast<const int*>(smem)[threadIdx.x] == 0x7fffffff) sink[0] = 1;
}

// Loads by bulk copies of PIECE bytes issued by one thread, each stage's landing counted by an mbarrier.
template <int PIECE, int DEPTH>
__global__ void __launch_bounds__(kThreads, 1) load_bulk(const char* src, int* sink) {
  extern __shared__ __align__(1024) char smem[];
  __shared__ __align__(8) unsigned long long bars[DEPTH];
  const char* base = src + blockIdx.x * kPerBlock;
  const unsigned s0 = smla_smem_addr(smem);
  if (threadIdx.x == 0) {
    for (int d = 0; d < DEPTH; ++d) smla_mbar_init(smla_smem_addr(&bars[d]), 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    for (long long st = 0; st < kPerBlock / kStage; ++st) {
      const int d = int(st % DEPTH);
      const unsigned bar = smla_smem_addr(&bars[d]);
      if (st >= DEPTH) smla_mbar_wait(bar, unsigned((st / DEPTH - 1) & 1));
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(kStage) : "memory");
      for (int off = 0; off < kStage; off += PIECE)
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                s0 + d * kStage + off),
            "l"(base + st * kStage + off), "n"(PIECE), "r"(bar)
            : "memory");
    }
    const long long n = kPerBlock / kStage;
    for (long long st = n - DEPTH; st < n; ++st)
      smla_mbar_wait(smla_smem_addr(&bars[st % DEPTH]), unsigned((st / DEPTH) & 1));
  }
  __syncthreads();
  if (reinterpret_cast<const int*>(smem)[threadIdx.x] == 0x7fffffff) sink[0] = 1;
}

// Stores from registers: W = 16, each thread 16 bytes, a warp 512 contiguous bytes; W = 4, dq's epilogue pattern
// (a wgmma accumulator's bf16 pairs: a warp instruction writes 16 bytes into each of 8 rows of 1 KB).
template <int W>
__global__ void __launch_bounds__(kThreads, 1) store_st(char* dst, int salt) {
  char* base = dst + blockIdx.x * kPerBlock;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (W == 16) {
    const uint4 v = make_uint4(salt, threadIdx.x, blockIdx.x, 1);
    for (long long off = threadIdx.x * 16ll; off < kPerBlock; off += kThreads * 16ll)
      *reinterpret_cast<uint4*>(base + off) = v;
  } else {
    // 16 rows of 1 KB a warp and step (8 rows, then the 8 below); each 16-byte column group in turn
    const unsigned v = salt ^ threadIdx.x;
    for (long long blk = warp * 16 * 1024ll; blk < kPerBlock; blk += kThreads / 32 * 16 * 1024ll)
      for (int half = 0; half < 2; ++half)
        for (int c = 0; c < 1024; c += 16)
          *reinterpret_cast<unsigned*>(base + blk + (half * 8 + lane / 4) * 1024 + c + (lane % 4) * 4) = v;
  }
}

// Stores by bulk copies of PIECE bytes from shared memory, one thread issuing, DEPTH stages' copies outstanding.
template <int PIECE, int DEPTH>
__global__ void __launch_bounds__(kThreads, 1) store_bulk(char* dst, int salt) {
  extern __shared__ __align__(1024) char smem[];
  char* base = dst + blockIdx.x * kPerBlock;
  for (int i = threadIdx.x; i < DEPTH * kStage / 4; i += kThreads) reinterpret_cast<int*>(smem)[i] = salt + i;
  smla_fence_proxy_async();
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned s0 = smla_smem_addr(smem);
    for (long long st = 0; st < kPerBlock / kStage; ++st) {
      for (int off = 0; off < kStage; off += PIECE)
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(base + st * kStage + off),
                     "r"(s0 + int(st % DEPTH) * kStage + off), "n"(PIECE)
                     : "memory");
      asm volatile("cp.async.bulk.commit_group;" ::: "memory");
      asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(DEPTH - 1) : "memory");
    }
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  }
}

template <class K, class... A>
static void run(const char* name, K kernel, int blocks, A... args) {
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const double med = median_ms([&] { kernel<<<blocks, kThreads, kSmem>>>(args...); }, 10, 2);
  const double gb = double(kPerBlock) * blocks / 1e9;
  printf("%-40s %3d SMs: %5.2f TB/s, %5.1f GB/s an SM (%.3f ms, median of 10)\n", name, blocks, gb / med,
         gb / med * 1e3 / blocks, med);
}

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  char* buf;
  int* sink;
  CHECK(cudaMalloc(&buf, size_t(sms) * kPerBlock));
  CHECK(cudaMemset(buf, 1, size_t(sms) * kPerBlock));
  CHECK(cudaMalloc(&sink, sizeof(int)));
  printf("%d SMs, %lld MB a block, one block an SM\n", sms, kPerBlock >> 20);
  for (int blocks : {sms, sms / 2, sms / 4}) {
    run("load: cp.async 16 B, 2 stages in flight", load_cp<2>, blocks, (const char*)buf, sink);
    run("load: cp.async 16 B, 4 stages", load_cp<4>, blocks, (const char*)buf, sink);
    run("load: bulk 1 KB pieces, 2 stages", load_bulk<1024, 2>, blocks, (const char*)buf, sink);
    run("load: bulk 1 KB pieces, 4 stages", load_bulk<1024, 4>, blocks, (const char*)buf, sink);
    run("load: bulk 8 KB pieces, 4 stages", load_bulk<8192, 4>, blocks, (const char*)buf, sink);
    run("store: st.global 16 B, coalesced", store_st<16>, blocks, buf, 7);
    run("store: st.global 4 B, dQ fragment pattern", store_st<4>, blocks, buf, 7);
    run("store: bulk 512 B pieces, 2 stages", store_bulk<512, 2>, blocks, buf, 7);
    run("store: bulk 4 KB pieces, 4 stages", store_bulk<4096, 4>, blocks, buf, 7);
  }
  CHECK(cudaFree(buf));
  CHECK(cudaFree(sink));
  return 0;
}
