// wgmma_rate.cu: how fast one SM runs a chain of 32 wgmma m64nNk16 (K = 512, both operands in shared memory,
// 128-byte swizzle, K-major: the shape of dq's S/dP step) for N = 32, 64, 128, 256 and 1 or 2 warpgroups
// issuing at once. Prints SM cycles per wgmma and FMA a cycle against the dense peak of one SM (2048 bf16 FMA a
// cycle: 989 TFLOP/s at 1.83 GHz on 132 SMs). Standalone (not part of the library or its tests):
//   nvcc -gencode arch=compute_90a,code=sm_90a -std=c++17 -O3 -I kernel_src -o wgmma_rate bench/wgmma_rate.cu
// Also: A from registers (wgmma's RS form; four fragments cycled) and, like dq's tile, 32 KB of
// gathered 1 KB rows copied by every thread (cp.async) while the chain runs.
// Why: dq's S/dP runs 64 wgmma m64n32k16 a tile in ~2350 cycles (docs/perf-notes.md); neither A from registers
// nor two accumulator chains nor hiding the dQ drain moved it much. If small N itself is slow, the fix is a
// wider N.
// acc0 (0 at run time, a kernel argument): with the constant `kk > 0` an iteration's chain, overwritten unread by the
// next, is dead code to ptxas, which may delete it (it deleted 7 of 8 in dsmem_async.cu's `mma` mode; perf notes v33).
#include <cuda_runtime.h>
#include "cuda_check.cuh"
#include <cstdio>
#include <cstdlib>

__device__ __forceinline__ unsigned smla_smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
#include "wgmma.cuh"

constexpr int kSteps = 32;  // k-steps a chain (K = 512)
constexpr int kSmem = 224 * 1024;  // A 2 x 64 KB, B 64 KB, copy destination 32 KB
constexpr int kRows = 65536;        // rows of 1 KB in the copy source

// Register-A form: A (64 x 16, this thread's fragment) from registers, B from shared memory (K-major).
template <int N>
__device__ __forceinline__ void mma_rs(float (&d)[N / 2], const unsigned (&a)[4], unsigned long long db, int acc);
template <>
__device__ __forceinline__ void mma_rs<32>(float (&d)[16], const unsigned (&a)[4], unsigned long long db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, "
      "%13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}
template <>
__device__ __forceinline__ void mma_rs<64>(float (&d)[32], const unsigned (&a)[4], unsigned long long db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, "
      "%13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}

template <int N>
__device__ __forceinline__ void mma(float (&d)[N / 2], unsigned long long da, unsigned long long db, int acc) {
  static_assert(N == 32 || N == 64 || N == 128 || N == 256, "N 24 and 48: the specializations below");
  if constexpr (N == 32) smla_wgmma_m64n32k16<0, 0>(d, da, db, acc);
  if constexpr (N == 64) smla_wgmma_m64n64k16<0, 0>(d, da, db, acc);
  if constexpr (N == 128) smla_wgmma_m64n128k16<0, 0>(d, da, db, acc);
  if constexpr (N == 256) smla_wgmma_m64n256k16<0, 0>(d, da, db, acc);
}
// N 24 and 48 (not in wgmma.cuh): the tile widths a ping-pong of dq's consumers (24-row tiles) or a 48-row tile would
// run S/dP at. Both operands K-major from shared memory, as above.
template <>
__device__ __forceinline__ void mma<24>(float (&d)[12], unsigned long long da, unsigned long long db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %14, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n24k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11}, %12, %13, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11])
      : "l"(da), "l"(db), "r"(acc));
}
template <>
__device__ __forceinline__ void mma<48>(float (&d)[24], unsigned long long da, unsigned long long db, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %26, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n48k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23}, %24, %25, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
      : "l"(da), "l"(db), "r"(acc));
}

// Every warpgroup of the block runs `iters` chains; A (64 rows) at wg * 64 KB, B (N rows) after the A's.
template <int N, bool RS, bool COPY>
__global__ void __launch_bounds__(256, 1) rate(int iters, int wgs, const uint4* src, long long* cycles, float* sink,
                                                int acc0) {
  extern __shared__ __align__(1024) char smem[];
  // Nonzero operands (bf16 pairs between 1/16 and 1). (The RS rows' rates above the peak, once blamed on zero
  // operands, were ptxas deleting chains overwritten unread: acc0.)
  for (int i = threadIdx.x; i < kSmem / 4; i += blockDim.x)
    reinterpret_cast<unsigned*>(smem)[i] = 0x3D803D80u + ((i * 2654435761u) >> 25) * 0x00010001u;
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  const int wg = threadIdx.x / 128;
  if (wg >= wgs) return;
  const unsigned base = smla_smem_addr(smem);
  const unsigned a = base + wg * 65536, b = base + 2 * 65536;  // A: 8 chunks of 64 rows x 128 B; B: 8 chunks of N rows
  const unsigned cdst = base + 3 * 65536;                        // copy destination: 32 rows of 1 KB
  unsigned ar[4][4];  // register-A fragments (cycled)
#pragma unroll
  for (int i = 0; i < 16; ++i) ar[i / 4][i % 4] = 0x3D803D80u + ((threadIdx.x * 16 + i) % 97) * 0x00010001u;
  float d[N / 2];
#pragma unroll
  for (int j = 0; j < N / 2; ++j) d[j] = 0.f;
  const long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
    smla_fence_regs(d);
    smla_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
      const unsigned long long da = smla_wgmma_desc(a + (kk >> 2) * 8192 + (kk & 3) * 32, 16, 1024);
      const unsigned long long db = smla_wgmma_desc(b + (kk >> 2) * (N * 128) % 65536 + (kk & 3) * 32, 16, 1024);
      if constexpr (RS)
        mma_rs<N>(d, ar[kk & 3], db, kk > 0 || acc0);
      else
        mma<N>(d, da, db, kk > 0 || acc0);
    }
    smla_wgmma_commit();
    if constexpr (COPY) {  // 32 rows of 1 KB at pseudo-random places, 16 bytes a thread 8 times (dq's pattern)
      const int t = threadIdx.x % 128 + 128 * wg, c = t % 64;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int row = t / 64 + 4 * j;
        const unsigned r = (unsigned)(blockIdx.x * 7919 + it * 104729 + row * 15485863) % kRows;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(cdst + row * 1024 + c * 16),
                     "l"(src + (size_t)r * 64 + c)
                     : "memory");
      }
      asm volatile("cp.async.commit_group;" ::: "memory");
      asm volatile("cp.async.wait_group 1;" ::: "memory");  // the previous iteration's (double-buffered, as in dq)
    }
    smla_wgmma_wait<0>();
    smla_fence_regs(d);
  }
  if constexpr (COPY) asm volatile("cp.async.wait_group 0;" ::: "memory");
  const long long t1 = clock64();
  if (threadIdx.x % 128 == 0) cycles[blockIdx.x * 2 + wg] = t1 - t0;
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < N / 2; ++j) s += d[j];
  if (s != 0.f) sink[threadIdx.x] = s;
}

template <int N, bool RS = false, bool COPY = false>
void run(int sms, int wgs, const uint4* src) {
  const int iters = 2000;
  long long* dc;
  float* ds;
  CHECK(cudaMalloc(&dc, sizeof(long long) * sms * 2));
  CHECK(cudaMalloc(&ds, sizeof(float) * 256));
  CHECK(cudaFuncSetAttribute(rate<N, RS, COPY>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  rate<N, RS, COPY><<<sms, 256, kSmem>>>(10, wgs, src, dc, ds, 0);  // warm-up
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  CHECK(cudaEventRecord(e0));
  rate<N, RS, COPY><<<sms, 256, kSmem>>>(iters, wgs, src, dc, ds, 0);
  CHECK(cudaEventRecord(e1));
  CHECK(cudaEventSynchronize(e1));
  CHECK(cudaGetLastError());
  float ms = 0.f;
  CHECK(cudaEventElapsedTime(&ms, e0, e1));
  long long c[2];
  CHECK(cudaMemcpy(c, dc, sizeof(c), cudaMemcpyDeviceToHost));
  const double instrs = (double)iters * kSteps * wgs;  // wgmma on SM 0
  const double fma_per_instr = 64.0 * N * 16;
  const double cyc = (double)c[0];
  const double tflops = 2.0 * fma_per_instr * instrs * sms / (ms * 1e-3) / 1e12;
  printf("m64n%-3dk16 %s%s, %d warpgroup(s): %6.1f SM cycles a wgmma, %5.0f FMA a cycle (%3.0f%% of 2048), %6.1f TFLOP/s "
         "on %d SMs\n",
         N, RS ? "RS" : "SS", COPY ? " + 32 KB cp.async" : "                 ", wgs, cyc / instrs, fma_per_instr * instrs / cyc, 100.0 * fma_per_instr * instrs / cyc / 2048, tflops, sms);
  CHECK(cudaFree(dc));
  CHECK(cudaFree(ds));
}

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  uint4* src;
  CHECK(cudaMalloc(&src, (size_t)kRows * 1024));
  CHECK(cudaMemset(src, 0, (size_t)kRows * 1024));
  for (int wgs = 1; wgs <= 2; ++wgs) {
    run<24>(sms, wgs, src);
    run<48>(sms, wgs, src);
    run<32>(sms, wgs, src);
    run<64>(sms, wgs, src);
    run<128>(sms, wgs, src);
    run<256>(sms, wgs, src);
    run<32, true>(sms, wgs, src);
    run<64, true>(sms, wgs, src);
  }
  run<24, false, true>(sms, 2, src);
  run<48, false, true>(sms, 2, src);
  run<32, false, true>(sms, 2, src);
  run<32, true, true>(sms, 2, src);
  run<64, false, true>(sms, 2, src);
  run<64, true, true>(sms, 2, src);
  CHECK(cudaFree(src));
  return 0;
}
