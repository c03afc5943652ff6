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
// c54 (H100) found the st.async exchange no cheaper than v17's cluster barriers (~1600 cycles a round at 4 KB) and
// not hidden by `pipe`; likely cause, one remote mbarrier update a 16-byte piece. The bulk modes (perf notes v32) send
// a warp's pieces as one copy instead: each thread stores its pieces into a local staging buffer, and one lane a warp
// issues cp.async.bulk.shared::cluster into the peer (one complete_tx a warp); the peer hands a buffer back with one
// remote arrive a warp. Three receive and three staging buffers.
//   bulk      the exchange alone, by bulk copies
//   bpipe     `pipe` with the bulk exchange (round r sent and received under round r + 1's S/dP)
//   blate     the wait a tile later: round r + 1's S/dP issued, round r received (sent one step before) and its dQ
//             issued, then round r + 1 sent once its S/dP is done. The copy then has a whole S/dP to land.
// Standalone (not part of the library or its tests; ctest Bench.DsmemAsyncBuildsForSm90a builds it):
//   nvcc -gencode arch=compute_90a,code=sm_90a -std=c++17 -O3 -I kernel_src -o dsmem_async bench/dsmem_async.cu
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include "cuda_check.cuh"
#include <cstdio>

#include "common.cuh"  // smla_smem_addr
#include "wgmma.cuh"
#include "sm90_sync.cuh"  // smla_mbar_init
#include "cluster_sync.cuh"

namespace cg = cooperative_groups;

constexpr int kRounds = 1000;
constexpr int kThreads = 256;                 // two warpgroups
constexpr int kOps = 64 * 1024;               // A: 2 x 32 KB (one a warpgroup), B: 32 KB; swizzled 64-column chunks
constexpr int kNb = 3;                        // receive buffers (and the bulk modes' staging buffers)
constexpr int kBuf = 16 * 1024;               // up to 16 KB each
constexpr int kRecv = kNb * kBuf;
constexpr int kStage = kNb * kBuf;
constexpr int kBars = 2 * kNb * 8;            // full[kNb], empty[kNb]
constexpr int kSmem = kOps + 32 * 1024 + kRecv + kStage + kBars + 1024;  // + 1024: the base's alignment
enum Mode { kMma = 0, kXchg = 1, kSerial = 2, kPipe = 3, kBulk = 4, kBPipe = 5, kBLate = 6 };
const char* const kModeName[] = {"mma", "xchg", "serial", "pipe", "bulk", "bpipe", "blate"};

__device__ __forceinline__ void st_async16(unsigned remote, const float (&v)[4], unsigned remote_bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(remote),
               "r"(__float_as_uint(v[0])), "r"(__float_as_uint(v[1])), "r"(__float_as_uint(v[2])),
               "r"(__float_as_uint(v[3])), "r"(remote_bar)
               : "memory");
}

// 16 k-steps of m64n64k16: this warpgroup's A (64 x 256) against B (64 x 256), both K-major, 128-byte swizzle.
// acc0: the first k-step's accumulate flag, 0 at run time but a kernel argument, so ptxas cannot see that the chain
// overwrites d. With `kk > 0` (a constant) a round whose result nobody reads before the next round overwrites it is
// dead code to ptxas, and it deleted 7 of 8 such S/dP chains in `mma` mode (read in the SASS, perf notes v33): the
// column read 2.2x the tensor peak in c54 and c55.
__device__ __forceinline__ void issue_mma(float (&d)[32], unsigned a, unsigned b, int acc0) {
  smla_fence_regs(d);
  smla_wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 16; ++kk) {
    const unsigned long long da = smla_wgmma_desc(a + (kk >> 2) * 8192 + (kk & 3) * 32, 16, 1024);
    const unsigned long long db = smla_wgmma_desc(b + (kk >> 2) * 8192 + (kk & 3) * 32, 16, 1024);
    smla_wgmma_m64n64k16<0, 0>(d, da, db, kk > 0 || acc0);
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

// Round r uses buffer r % kNb for its k = r / kNb-th time: its barriers' phase parity is k & 1.
__device__ __forceinline__ int buf_of(int r) { return r % kNb; }
__device__ __forceinline__ unsigned parity_of(int r) { return (r / kNb) & 1; }

// One exchange of round r by st.async: this thread's `pieces` 16-byte pieces of `d` into the peer's receive buffer, the
// peer's pieces read back from ours, our buffer handed back. Barriers (this CTA's addresses): full[kNb] (count 1:
// thread 0's expect_tx; the peer's st.async complete the bytes), empty[kNb] (count kThreads: the peer's threads,
// remotely).
template <int PIECES>
__device__ __forceinline__ float exchange(const float (&d)[32], int r, unsigned recv, unsigned full, unsigned empty,
                                          unsigned peer) {
  const int buf = buf_of(r);
  const unsigned phase = parity_of(r);
  float s = 0.f;
  if constexpr (PIECES == 0) return s;
  if (threadIdx.x == 0) mbar_expect_tx(full + 8 * buf, PIECES * 16 * kThreads);
  // The peer's buffer `buf` is free once the peer read round r - kNb from it (its threads arrive on our empty[buf]).
  if (r >= kNb) mbar_wait_cluster(empty + 8 * buf, phase ^ 1);
  const unsigned mine = recv + buf * kBuf + threadIdx.x * 16;  // piece j of a thread at + j * 16 * kThreads
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

// The bulk exchange, in two halves so that a round's receive can come a step after its send. A warp's pieces are
// contiguous: piece j of lane l of warp w at w * PIECES * 512 + j * 512 + l * 16, in the staging buffer and in the
// peer's receive buffer alike. Barriers: full[kNb] (count 1: thread 0's expect_tx; one complete_tx a peer warp),
// empty[kNb] (count kWarps: one remote arrive a peer warp). Our staging buffer `buf` is free again once the peer has
// freed its receive buffer `buf` (the copy out of it completed before the peer's full barrier did).
constexpr int kWarps = kThreads / 32;
template <int PIECES>
__device__ __forceinline__ void bulk_send(const float (&d)[32], int r, unsigned stage, unsigned recv, unsigned full,
                                          unsigned empty, unsigned peer) {
  if constexpr (PIECES == 0) return;
  const int buf = buf_of(r);
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) mbar_expect_tx(full + 8 * buf, PIECES * 16 * kThreads);
  if (r >= kNb) mbar_wait_cluster(empty + 8 * buf, parity_of(r) ^ 1);
  const unsigned off = buf * kBuf + warp * PIECES * 512;
#pragma unroll
  for (int j = 0; j < PIECES; ++j)
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(stage + off + j * 512 + lane * 16), "f"(d[4 * j]),
                 "f"(d[4 * j + 1]), "f"(d[4 * j + 2]), "f"(d[4 * j + 3])
                 : "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the stores, seen by the copy engine
  __syncwarp();
  if (lane == 0)
    asm volatile(
        "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
            mapa(recv + off, peer)),
        "r"(stage + off), "r"(PIECES * 512), "r"(mapa(full + 8 * buf, peer))
        : "memory");
}
template <int PIECES>
__device__ __forceinline__ float bulk_recv(int r, unsigned recv, unsigned full, unsigned empty, unsigned peer) {
  float s = 0.f;
  if constexpr (PIECES == 0) return s;
  const int buf = buf_of(r);
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  mbar_wait_cluster(full + 8 * buf, parity_of(r));  // every peer warp's copy has landed
  const unsigned off = buf * kBuf + warp * PIECES * 512;
#pragma unroll
  for (int j = 0; j < PIECES; ++j) {
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(recv + off + j * 512 + lane * 16));
    s += v.x + v.y + v.z + v.w;
  }
  __syncwarp();
  if (lane == 0) mbar_arrive_remote(mapa(empty + 8 * buf, peer));  // the peer may send into buffer `buf` again
  return s;
}

template <int PIECES>
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(kThreads, 1)
    xchg_kernel(int mode, long long* cycles, float* sink, int* bad, int acc0) {  // acc0: 0 (issue_mma)
  extern __shared__ __align__(1024) char smem_raw[];
  char* smem = reinterpret_cast<char*>((reinterpret_cast<size_t>(smem_raw) + 1023) & ~size_t(1023));
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned peer = cluster.block_rank() ^ 1u;
  const int wg = threadIdx.x / 128;
  const unsigned base = smla_smem_addr(smem);
  const unsigned a = base + wg * 32768, b = base + kOps;
  const unsigned recv = base + kOps + 32768, stage = recv + kRecv;
  const unsigned full = stage + kStage, empty = full + 8 * kNb;
  const bool bulk_mode = mode >= kBulk;
  for (int i = threadIdx.x; i < (kOps + 32768) / 4; i += blockDim.x)  // nonzero operands (bf16 in 1/16 .. 1)
    reinterpret_cast<unsigned*>(smem)[i] = 0x3D803D80u + ((i * 2654435761u) >> 25) * 0x00010001u;
  if (threadIdx.x == 0) {
    for (int i = 0; i < kNb; ++i) {
      smla_mbar_init(full + 8 * i, 1);
      smla_mbar_init(empty + 8 * i, bulk_mode ? kWarps : kThreads);
    }
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
      issue_mma(d0, a, b, acc0);
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
      issue_mma(d0, a, b, acc0);
      smla_wgmma_wait<0>();
      smla_fence_regs(d0);
      s += exchange<PIECES>(d0, r, recv, full, empty, peer);
      issue_dq(q, qa, qb);
      smla_wgmma_wait<0>();
      smla_fence_regs(q);
    }
  } else if (mode == kPipe) {  // round r + 1's S/dP runs under round r's exchange (two accumulator sets), then round r's dQ
    issue_mma(d0, a, b, acc0);
    smla_wgmma_wait<0>();
    smla_fence_regs(d0);
    for (int r = 0; r < kRounds; r += 2) {
      issue_mma(d1, a, b, acc0);
      s += exchange<PIECES>(d0, r, recv, full, empty, peer);
      issue_dq(q, qa, qb);
      smla_wgmma_wait<1>();  // the S/dP into d1 (committed before the dQ)
      smla_fence_regs(d1);
      issue_mma(d0, a, b, acc0);
      s += exchange<PIECES>(d1, r + 1, recv, full, empty, peer);
      issue_dq(q, qa, qb);
      smla_wgmma_wait<1>();
      smla_fence_regs(d0);
    }
    smla_wgmma_wait<0>();
    smla_fence_regs(q);
  } else if (mode == kBulk) {
    for (int r = 0; r < kRounds; ++r) {
      d0[0] += 1.f;
      bulk_send<PIECES>(d0, r, stage, recv, full, empty, peer);
      s += bulk_recv<PIECES>(r, recv, full, empty, peer);
    }
  } else if (mode == kBPipe) {  // kPipe with the bulk exchange
    issue_mma(d0, a, b, acc0);
    smla_wgmma_wait<0>();
    smla_fence_regs(d0);
    for (int r = 0; r < kRounds; r += 2) {
      issue_mma(d1, a, b, acc0);
      bulk_send<PIECES>(d0, r, stage, recv, full, empty, peer);
      s += bulk_recv<PIECES>(r, recv, full, empty, peer);
      issue_dq(q, qa, qb);
      smla_wgmma_wait<1>();
      smla_fence_regs(d1);
      issue_mma(d0, a, b, acc0);
      bulk_send<PIECES>(d1, r + 1, stage, recv, full, empty, peer);
      s += bulk_recv<PIECES>(r + 1, recv, full, empty, peer);
      issue_dq(q, qa, qb);
      smla_wgmma_wait<1>();
      smla_fence_regs(d0);
    }
    smla_wgmma_wait<0>();
    smla_fence_regs(q);
  } else {  // kBLate: round r's receive a step after its send; round r's accumulators live until then
    issue_mma(d0, a, b, acc0);
    smla_wgmma_wait<0>();
    smla_fence_regs(d0);
    bulk_send<PIECES>(d0, 0, stage, recv, full, empty, peer);
    for (int r = 0; r < kRounds; r += 2) {
      issue_mma(d1, a, b, acc0);  // round r + 1's S/dP
      s += bulk_recv<PIECES>(r, recv, full, empty, peer) + d0[0];
      issue_dq(q, qa, qb);  // round r's dQ
      smla_wgmma_wait<1>();
      smla_fence_regs(d1);
      bulk_send<PIECES>(d1, r + 1, stage, recv, full, empty, peer);
      issue_mma(d0, a, b, acc0);  // round r + 2's (one extra at the end: a round's S/dP, not counted)
      s += bulk_recv<PIECES>(r + 1, recv, full, empty, peer) + d1[0];
      issue_dq(q, qa, qb);
      smla_wgmma_wait<1>();
      smla_fence_regs(d0);
      if (r + 2 < kRounds) bulk_send<PIECES>(d0, r + 2, stage, recv, full, empty, peer);
    }
    smla_wgmma_wait<0>();
    smla_fence_regs(q);
  }
  __syncthreads();  // the CTA's time, not warpgroup 0's (c54 read warpgroup 0 alone: 682 cycles for ~1536 of MMA)
  const long long t1 = clock64();
  cluster.sync();  // no CTA leaves while its peer may still write into it or arrive on it
  if (blockIdx.x == 0 && threadIdx.x == 0) *cycles = t1 - t0;
  // The exchange-alone modes check what arrived: round r's pieces sum to r + 1 (d0[0] counts the rounds, the rest of
  // the sent pieces are 0), so the rounds sum to kRounds (kRounds + 1) / 2, exact in fp32.
  if ((mode == kXchg || mode == kBulk) && PIECES > 0 && s != 0.5f * kRounds * (kRounds + 1)) atomicAdd(bad, 1);
#pragma unroll
  for (int j = 0; j < 32; ++j) s += d0[j] + d1[j] + q[j] + q[j + 32];
  if (s == 1234.5f) sink[threadIdx.x] = s;  // keeps the work
}

// One row of the table: BYTES a CTA a round (PIECES 16-byte pieces a thread), every mode.
template <int PIECES>
void row(int blocks, long long* dc, float* ds, int* db) {
  CHECK(cudaFuncSetAttribute(xchg_kernel<PIECES>, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
  printf("%6d", PIECES * 16 * kThreads);
  for (int mode = kMma; mode <= kBLate; ++mode) {
    CHECK(cudaMemset(db, 0, sizeof(int)));
    xchg_kernel<PIECES><<<blocks, kThreads, 200 * 1024>>>(mode, dc, ds, db, 0);  // warm-up
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    median_ms([&] { xchg_kernel<PIECES><<<blocks, kThreads, 200 * 1024>>>(mode, dc, ds, db, 0); }, 5, 0);
    long long cyc = 0;
    CHECK(cudaMemcpy(&cyc, dc, sizeof(cyc), cudaMemcpyDeviceToHost));
    int nbad = 0;
    CHECK(cudaMemcpy(&nbad, db, sizeof(nbad), cudaMemcpyDeviceToHost));
    if (nbad) printf(" %8s", "WRONG");  // the pieces did not arrive as sent
    else printf(" %8.1f", (double)cyc / kRounds);
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
  int* db;
  CHECK(cudaMalloc(&db, sizeof(int)));
  static_assert(kSmem <= 200 * 1024, "dsmem_async: the carve exceeds what is asked for");
  const int blocks = sms & ~1;  // whole clusters, one CTA an SM
  printf("clusters of 2, one CTA an SM, %d CTAs; SM cycles a round (a warpgroup's S/dP 16 wgmma m64n64k16, dQ 4 "
         "m64n128k16; exchange of BYTES a CTA each way: st.async + mbarrier, or bulk copies a warp)\n",
         blocks);
  printf("%6s", "BYTES");
  for (const char* m : kModeName) printf(" %8s", m);
  printf("\n");
  row<0>(blocks, dc, ds, db);
  row<1>(blocks, dc, ds, db);
  row<2>(blocks, dc, ds, db);
  row<4>(blocks, dc, ds, db);
  printf("(pipe, bpipe or blate ~ mma: the exchange hides under the next tile's MMA; ~ serial: it does not)\n");
  CHECK(cudaFree(dc));
  CHECK(cudaFree(ds));
  CHECK(cudaFree(db));
  return 0;
}
