// dsmem_async.cu: can a D-split dq pair hide its partial-S/dP exchange under the next tile's MMA? (perf notes v31)
//
// dsmem_pingpong.cu timed the pair's exchange with cluster-wide barriers: 782 cycles a round with nothing sent, 2225
// with 16 KB (v17), about a whole tile, and the D split was dropped on that. This times the exchange a pipelined pair
// would use instead, with no cluster barrier on the path: each thread writes its piece into the peer's shared memory
// with st.async, which counts the bytes on the peer's mbarrier (complete_tx); the peer waits on its own mbarrier,
// reads, and hands the buffer back by arriving on the sender's "empty" mbarrier remotely. Two buffers.
//
// Clusters of two CTAs, one CTA an SM (200 KB of shared memory), two warpgroups a CTA, every SM busy. A round is one
// 64-row kv tile of the pair: each warpgroup issues "S/dP", 16 wgmma m64n64k16 (K = 256, both operands in shared
// memory: the partial S or dP over half of D), and "dQ", 4 wgmma m64n128k16 (K = 64 kv rows: the warpgroup's 128 of
// the CTA's 256 dQ columns). By mode:
//   mma       S/dP, wait, dQ, wait: the tile's tensor work alone (its floor)
//   xchg      the exchange alone: BYTES / 256 bytes a thread to the peer, wait for the peer's, add them up, free the
//             buffer
//   serial    S/dP, wait, exchange its result, dQ, wait: a pair without pipelining
//   pipe      the next round's S/dP issued into the other accumulator set first, then this round's exchange while it
//             runs, then this round's dQ; wait for the next S/dP only (dQ stays in flight): the pipelined pair.
//             pipe ~ mma: the exchange hides under the tensor work; pipe ~ serial: it does not (the issue of the next
//             S/dP then holds the warpgroup until the tensor pipe has taken it, as dq-sdp-ahead found, v25).
// Standalone (not part of the library or its tests; ctest Bench.DsmemAsyncBuildsForSm90a builds it):
//   nvcc -gencode arch=compute_90a,code=sm_90a -std=c++17 -O3 -I kernel_src -o dsmem_async bench/dsmem_async.cu
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include "cuda_check.cuh"
#include <cstdio>

#include "common.cuh"  // smla_smem_addr
#include "wgmma.cuh"
#include "sm90_sync.cuh"  // smla_mbar_init

namespace cg = cooperative_groups;

constexpr int kRounds = 1000;
constexpr int kThreads = 256;                 // two warpgroups
constexpr int kOps = 64 * 1024;               // A: 2 x 32 KB (one a warpgroup), B: 32 KB; swizzled 64-column chunks
constexpr int kRecv = 2 * 16 * 1024;          // two receive buffers of up to 16 KB
constexpr int kSmem = kOps + 32 * 1024 + kRecv + 1024 + 64;
enum Mode { kMma = 0, kXchg = 1, kSerial = 2, kPipe = 3 };
const char* const kModeName[] = {"mma", "xchg", "serial", "pipe"};

__device__ __forceinline__ unsigned mapa(unsigned addr, unsigned rank) {
  unsigned r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
__device__ __forceinline__ void st_async16(unsigned remote, const float (&v)[4], unsigned remote_bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(remote),
               "r"(__float_as_uint(v[0])), "r"(__float_as_uint(v[1])), "r"(__float_as_uint(v[2])),
               "r"(__float_as_uint(v[3])), "r"(remote_bar)
               : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive_remote(unsigned remote_bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(remote_bar) : "memory");
}
__device__ __forceinline__ void mbar_wait_cluster(unsigned bar, unsigned parity) {
  unsigned done;
  do {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

// 16 k-steps of m64n64k16: this warpgroup's A (64 x 256) against B (64 x 256), both K-major, 128-byte swizzle.
__device__ __forceinline__ void issue_mma(float (&d)[32], unsigned a, unsigned b) {
  smla_fence_regs(d);
  smla_wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 16; ++kk) {
    const unsigned long long da = smla_wgmma_desc(a + (kk >> 2) * 8192 + (kk & 3) * 32, 16, 1024);
    const unsigned long long db = smla_wgmma_desc(b + (kk >> 2) * 8192 + (kk & 3) * 32, 16, 1024);
    smla_wgmma_m64n64k16<0, 0>(d, da, db, kk > 0);
  }
  smla_wgmma_commit();
}

// 4 k-steps of m64n128k16 (dQ's shape: dS 64 x 64 kv rows against 128 columns of the kv tile; K-major here, the
// layout does not change the bytes).
__device__ __forceinline__ void issue_dq(float (&q)[64], unsigned a, unsigned b) {
  smla_fence_regs(q);
  smla_wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const unsigned long long da = smla_wgmma_desc(a + kk * 32, 16, 1024);
    const unsigned long long db = smla_wgmma_desc(b + kk * 32, 16, 1024);
    smla_wgmma_m64n128k16<0, 0>(q, da, db, 1);
  }
  smla_wgmma_commit();
}

// One exchange of round r: this thread's `pieces` 16-byte pieces of `d` into the peer's receive buffer r % 2, the
// peer's pieces read back from ours, our buffer handed back. Barriers (this CTA's addresses): full[2] (count 1: thread
// 0's expect_tx; the peer's st.async complete the bytes), empty[2] (count kThreads: the peer's threads, remotely).
template <int PIECES>
__device__ __forceinline__ float exchange(const float (&d)[32], int r, unsigned recv, unsigned full, unsigned empty,
                                          unsigned peer) {
  const int buf = r & 1;
  const unsigned phase = (r >> 1) & 1;
  float s = 0.f;
  if constexpr (PIECES == 0) return s;
  if (threadIdx.x == 0) mbar_expect_tx(full + 8 * buf, PIECES * 16 * kThreads);
  // The peer's buffer `buf` is free once the peer read round r - 2 from it (its threads arrive on our empty[buf]).
  if (r >= 2) mbar_wait_cluster(empty + 8 * buf, phase ^ 1);
  const unsigned mine = recv + buf * 16384 + threadIdx.x * 16;  // piece j of a thread at + j * 16 * kThreads
  const unsigned rbar = mapa(full + 8 * buf, peer);
#pragma unroll
  for (int j = 0; j < PIECES; ++j) {
    const float v[4] = {d[4 * j], d[4 * j + 1], d[4 * j + 2], d[4 * j + 3]};
    st_async16(mapa(mine + j * 16 * kThreads, peer), v, rbar);
  }
  mbar_wait_cluster(full + 8 * buf, phase);  // the peer's pieces are here
#pragma unroll
  for (int j = 0; j < PIECES; ++j) {
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(mine + j * 16 * kThreads));
    s += v.x + v.y + v.z + v.w;
  }
  mbar_arrive_remote(mapa(empty + 8 * buf, peer));  // the peer may write our buffer `buf` again
  return s;
}

template <int PIECES>
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(kThreads, 1)
    xchg_kernel(int mode, long long* cycles, float* sink) {
  extern __shared__ __align__(1024) char smem_raw[];
  char* smem = reinterpret_cast<char*>((reinterpret_cast<size_t>(smem_raw) + 1023) & ~size_t(1023));
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned peer = cluster.block_rank() ^ 1u;
  const int wg = threadIdx.x / 128;
  const unsigned base = smla_smem_addr(smem);
  const unsigned a = base + wg * 32768, b = base + kOps;
  const unsigned recv = base + kOps + 32768;
  const unsigned full = recv + kRecv, empty = full + 16;
  for (int i = threadIdx.x; i < (kOps + 32768) / 4; i += blockDim.x)  // nonzero operands (bf16 in 1/16 .. 1)
    reinterpret_cast<unsigned*>(smem)[i] = 0x3D803D80u + ((i * 2654435761u) >> 25) * 0x00010001u;
  if (threadIdx.x == 0) {
    smla_mbar_init(full, 1);
    smla_mbar_init(full + 8, 1);
    smla_mbar_init(empty, kThreads);
    smla_mbar_init(empty + 8, kThreads);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  cluster.sync();  // both CTAs' barriers are initialised before any remote arrival
  float d0[32], d1[32], q[64];
#pragma unroll
  for (int j = 0; j < 32; ++j) d0[j] = d1[j] = 0.f;
#pragma unroll
  for (int j = 0; j < 64; ++j) q[j] = 0.f;
  const unsigned qa = base + 16384 + wg * 8192, qb = b + (wg & 1) * 16384;  // dS and this warpgroup's column half
  float s = 0.f;
  const long long t0 = clock64();
  if (mode == kMma) {
    for (int r = 0; r < kRounds; ++r) {
      issue_mma(d0, a, b);
      smla_wgmma_wait<0>();
      smla_fence_regs(d0);
      issue_dq(q, qa, qb);
      smla_wgmma_wait<0>();
      smla_fence_regs(q);
    }
  } else if (mode == kXchg) {
    for (int r = 0; r < kRounds; ++r) {
      d0[0] += 1.f;
      s += exchange<PIECES>(d0, r, recv, full, empty, peer);
    }
  } else if (mode == kSerial) {
    for (int r = 0; r < kRounds; ++r) {
      issue_mma(d0, a, b);
      smla_wgmma_wait<0>();
      smla_fence_regs(d0);
      s += exchange<PIECES>(d0, r, recv, full, empty, peer);
      issue_dq(q, qa, qb);
      smla_wgmma_wait<0>();
      smla_fence_regs(q);
    }
  } else {  // kPipe: round r + 1's S/dP runs under round r's exchange (two accumulator sets), then round r's dQ
    issue_mma(d0, a, b);
    smla_wgmma_wait<0>();
    smla_fence_regs(d0);
    for (int r = 0; r < kRounds; r += 2) {
      issue_mma(d1, a, b);
      s += exchange<PIECES>(d0, r, recv, full, empty, peer);
      issue_dq(q, qa, qb);
      smla_wgmma_wait<1>();  // the S/dP into d1 (committed before the dQ)
      smla_fence_regs(d1);
      issue_mma(d0, a, b);
      s += exchange<PIECES>(d1, r + 1, recv, full, empty, peer);
      issue_dq(q, qa, qb);
      smla_wgmma_wait<1>();
      smla_fence_regs(d0);
    }
    smla_wgmma_wait<0>();
    smla_fence_regs(q);
  }
  __syncthreads();  // the CTA's time, not warpgroup 0's (c54 read warpgroup 0 alone: 682 cycles for ~1536 of MMA)
  const long long t1 = clock64();
  cluster.sync();  // no CTA leaves while its peer may still write into it or arrive on it
  if (blockIdx.x == 0 && threadIdx.x == 0) *cycles = t1 - t0;
#pragma unroll
  for (int j = 0; j < 32; ++j) s += d0[j] + d1[j] + q[j] + q[j + 32];
  if (s == 1234.5f) sink[threadIdx.x] = s;  // keeps the work
}

// One row of the table: BYTES a CTA a round (PIECES 16-byte pieces a thread), every mode.
template <int PIECES>
void row(int blocks, long long* dc, float* ds) {
  CHECK(cudaFuncSetAttribute(xchg_kernel<PIECES>, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
  printf("%6d", PIECES * 16 * kThreads);
  for (int mode = kMma; mode <= kPipe; ++mode) {
    xchg_kernel<PIECES><<<blocks, kThreads, 200 * 1024>>>(mode, dc, ds);  // warm-up
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    median_ms([&] { xchg_kernel<PIECES><<<blocks, kThreads, 200 * 1024>>>(mode, dc, ds); }, 5, 0);
    long long cyc = 0;
    CHECK(cudaMemcpy(&cyc, dc, sizeof(cyc), cudaMemcpyDeviceToHost));
    printf(" %8.1f", (double)cyc / kRounds);
  }
  printf("\n");
}

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  long long* dc;
  float* ds;
  CHECK(cudaMalloc(&dc, sizeof(long long)));
  CHECK(cudaMalloc(&ds, kThreads * sizeof(float)));
  static_assert(kSmem <= 200 * 1024, "dsmem_async: the carve exceeds what is asked for");
  const int blocks = sms & ~1;  // whole clusters, one CTA an SM
  printf("clusters of 2, one CTA an SM, %d CTAs; SM cycles a round (a warpgroup's S/dP 16 wgmma m64n64k16, dQ 4 "
         "m64n128k16; exchange of BYTES a CTA each way by st.async + mbarrier)\n",
         blocks);
  printf("%6s", "BYTES");
  for (const char* m : kModeName) printf(" %8s", m);
  printf("\n");
  row<0>(blocks, dc, ds);
  row<1>(blocks, dc, ds);
  row<2>(blocks, dc, ds);
  row<4>(blocks, dc, ds);
  printf("(pipe ~ mma: the exchange hides under the next tile's MMA; pipe ~ serial: it does not)\n");
  CHECK(cudaFree(dc));
  CHECK(cudaFree(ds));
  return 0;
}
