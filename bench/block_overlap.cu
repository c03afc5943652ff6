// block_overlap.cu: would a second block on the SM hide dq's per-block transfers? A model of dq_impl 3's block, run
// two ways over the same total work and bytes:
//   D 512 (as now): one CTA an SM (197 KB of shared memory); a block loads Q and dO (64 heads x 512 bf16 each) into
//     shared memory and O into registers, runs TILES tiles, stores dQ (64 KB); 8192 blocks.
//   D 256 (the D-split pair of perf notes v16, without its exchange): two CTAs an SM (101 KB each); a block does the
//     same on half the columns (half the MACs a tile, half the bytes); 16384 blocks.
// A tile, in both: the next tile's 32 kv rows (D columns of them) gathered from an L2-resident table with cp.async
// (double-buffered), the S/dP chain (two warpgroups, m64n32k16 over D), a stand-in for the element stage (a barrier,
// dS written to shared memory, P/dS written to global memory: 8 KB a tile at D 512, 4 KB at D 256 for a pair's 16
// slots), then dQ (m64nNk16, N = D / 2 a warpgroup, over the tile's 32 slots). Operands are nonzero pseudo-random
// bf16 (degenerate ones draw less power and run faster: perf notes v16).
// Each mode is also run without the per-block transfers (--no-io rows): the difference is the block term that the
// SM does not hide. If two CTAs an SM hide it, the D 256 rows with and without transfers come out close while the
// D 512 ones do not. Not modeled: the pair's DSMEM exchange and cluster barriers (bench/dsmem_pingpong.cu times
// those). Standalone (not part of the library or its tests):
//   nvcc -gencode arch=compute_90a,code=sm_90a -std=c++17 -O3 -I kernel_src -o block_overlap bench/block_overlap.cu
//   ./block_overlap [TILES ...]     (default: 5 14, TOPK 160 and the seed's valid tiles)
#include <cuda_runtime.h>
#include "cuda_check.cuh"
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "common.cuh"  // smla_smem_addr, the cp.async wrappers, smla_pack_bf2_rn
#include "wgmma.cuh"
#include "sm90_sync.cuh"  // smla_named_sync

constexpr int kKvRows = 8192;  // rows of 1 KB in the kv table (8 MB: L2-resident, like dq's kv)

template <int D>
struct Cfg {
  static constexpr int kChunks = D / 64;                 // 64-column chunks of an operand row
  static constexpr int kOpBytes = kChunks * 8192;         // Q or dO: 64 rows x D bf16, 128-byte swizzled atoms
  static constexpr int kKvChunk = 32 * 128;               // one 64-column chunk of a 32-row kv tile
  static constexpr int kKvBytes = kChunks * kKvChunk;     // a kv tile buffer
  static constexpr int kDsBytes = 32 * 128;               // dS: 32 slots x 64 heads bf16 (dQ's MN-major A)
  static constexpr int kSmem = 2 * kOpBytes + 2 * kKvBytes + kDsBytes + 1024;
  static constexpr int kOpPieces = kOpBytes / 16;         // 16-byte pieces of one operand
  static constexpr int kOutBytes = 64 * D * 2;            // dQ of the block
  static constexpr int kPdsBytes = D == 512 ? 8192 : 4096;  // P and dS written a tile
  static constexpr int kDqN = D / 2;                      // dQ columns a warpgroup
  static constexpr int kBlocks = D == 512 ? 8192 : 16384;
  static constexpr int kCtasPerSm = D == 512 ? 1 : 2;
};

template <int N>
__device__ __forceinline__ void dq_mma(float (&d)[N / 2], unsigned long long da, unsigned long long db) {
  if constexpr (N == 128) smla_wgmma_m64n128k16<1, 1>(d, da, db, 1);
  if constexpr (N == 256) smla_wgmma_m64n256k16<1, 1>(d, da, db, 1);
}

// Eight floats as eight bf16 in 16 bytes.
__device__ __forceinline__ uint4 pack8(const float* v) {
  return make_uint4(smla_pack_bf2_rn(v[0], v[1]), smla_pack_bf2_rn(v[2], v[3]), smla_pack_bf2_rn(v[4], v[5]),
                    smla_pack_bf2_rn(v[6], v[7]));
}

// The 32 kv rows of tile `tile` (D columns each) into a buffer, swizzled as dq's: every thread its 16-byte pieces.
template <int D>
__device__ __forceinline__ void load_kv(unsigned buf, const uint4* kv, int blk, int tile) {
  using C = Cfg<D>;
  constexpr int kPieces = 32 * D / 8;  // 16-byte pieces of the tile
#pragma unroll
  for (int j = 0; j < kPieces / 256; ++j) {
    const int i = threadIdx.x + 256 * j, row = i / (D / 8), piece = i % (D / 8);
    const unsigned r = (unsigned)(blk * 7919 + tile * 104729 + row * 15485863) % kKvRows;
    const int chunk = piece / 8, p8 = piece % 8;
    smla_cp_async16_zfill(buf + chunk * C::kKvChunk + row * 128 + ((p8 ^ (row & 7)) << 4), kv + (size_t)r * 64 + piece,
                          true);
  }
}

template <int D>
__global__ void __launch_bounds__(256, Cfg<D>::kCtasPerSm)
    block_model(int tiles, int io, const uint4* in, uint4* out, uint4* pds, const uint4* kv, float* sink) {
  using C = Cfg<D>;
  extern __shared__ char smem_raw[];
  char* smem = smla_align1024(smem_raw);
  const unsigned base = smla_smem_addr(smem);
  const int wg = threadIdx.x / 128, blk = blockIdx.x;
  const unsigned aop = base + wg * C::kOpBytes, akv0 = base + 2 * C::kOpBytes, ads = akv0 + 2 * C::kKvBytes;
  // Nonzero operands everywhere (the transfers overwrite Q and dO when they run).
  for (int i = threadIdx.x; i < (C::kSmem - 1024) / 4; i += 256)
    reinterpret_cast<unsigned*>(smem)[i] = 0x3D803D80u + ((i * 2654435761u) >> 25) * 0x00010001u;
  float o_sum = 0.f;
  if (io) {  // Q and dO into shared memory (cp.async), O into registers (16-byte loads), as dq's block start
    const uint4* src = in + (size_t)blk * 3 * C::kOpPieces;
    for (int i = threadIdx.x; i < 2 * C::kOpPieces; i += 256) smla_cp_async16_zfill(base + i * 16, src + i, true);
    uint4 ov[C::kOpPieces / 256];
#pragma unroll
    for (int j = 0; j < C::kOpPieces / 256; ++j) ov[j] = __ldg(src + 2 * C::kOpPieces + threadIdx.x + 256 * j);
#pragma unroll
    for (int j = 0; j < C::kOpPieces / 256; ++j) o_sum += __uint_as_float(ov[j].x & 0xffff0000u);
  }
  load_kv<D>(akv0, kv, blk, 0);
  smla_cp_async_commit();
  float acc[C::kDqN / 2];
#pragma unroll
  for (int j = 0; j < C::kDqN / 2; ++j) acc[j] = 0.f;
  for (int tile = 0; tile < tiles; ++tile) {
    const unsigned akv = akv0 + (tile & 1) * C::kKvBytes;
    smla_cp_async_wait<0>();
    smla_fence_proxy_async();
    __syncthreads();  // this tile landed (and, at tile 0, Q and dO); the other buffer is free
    float sd[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) sd[j] = 0.f;
    smla_fence_regs(sd);
    smla_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4 * C::kChunks; ++kk) {
      const unsigned long long da = smla_wgmma_desc(aop + (kk >> 2) * 8192 + (kk & 3) * 32, 16, 1024);
      const unsigned long long db = smla_wgmma_desc(akv + (kk >> 2) * C::kKvChunk + (kk & 3) * 32, 16, 1024);
      smla_wgmma_m64n32k16<0, 0>(sd, da, db, kk > 0);
    }
    smla_wgmma_commit();
    if (tile + 1 < tiles) load_kv<D>(akv0 + ((tile + 1) & 1) * C::kKvBytes, kv, blk, tile + 1);
    smla_cp_async_commit();
    smla_wgmma_wait<0>();
    smla_fence_regs(sd);
    // The element stage's stand-in: dS (from S/dP's values) into shared memory, P and dS to global memory.
    smla_named_sync<1, 256>();
    const uint4 w = pack8(sd);
    *reinterpret_cast<uint4*>(smem + (ads - base) + threadIdx.x * 16) = w;
    if (io) {
      uint4* dst = pds + ((size_t)blk * tiles + tile) * (C::kPdsBytes / 16);
#pragma unroll
      for (int j = 0; j < C::kPdsBytes / 16 / 256; ++j) dst[threadIdx.x + 256 * j] = w;
    }
    smla_fence_proxy_async();
    smla_named_sync<1, 256>();
    smla_fence_regs(acc);
    smla_wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      const unsigned long long da = smla_wgmma_desc(ads + ks * 2048, C::kDsBytes, 1024);
      const unsigned long long db =
          smla_wgmma_desc(akv + (C::kDqN / 64) * wg * C::kKvChunk + ks * 2048, C::kKvChunk, 1024);
      dq_mma<C::kDqN>(acc, da, db);
    }
    smla_wgmma_commit();
    smla_wgmma_wait<0>();
    smla_fence_regs(acc);
  }
  if (io) {  // dQ out: 16-byte coalesced stores
    uint4* dst = out + (size_t)blk * (C::kOutBytes / 16);
#pragma unroll
    for (int j = 0; j < C::kOutBytes / 16 / 256; ++j)
      dst[threadIdx.x + 256 * j] = pack8(acc + 8 * j);
  } else {
    float s = o_sum;
#pragma unroll
    for (int j = 0; j < C::kDqN / 2; ++j) s += acc[j];
    if (s == 1234.5f) sink[threadIdx.x] = s;  // keeps the MMA live
  }
}

__global__ void fill(unsigned* p, size_t words, unsigned seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < words; i += (size_t)gridDim.x * blockDim.x)
    p[i] = 0x3D803D80u + (unsigned)(((i + seed) * 2654435761u) >> 25) * 0x00010001u;
}

template <int D>
float run(int tiles, int io, const uint4* in, uint4* out, uint4* pds, const uint4* kv, float* sink) {
  using C = Cfg<D>;
  CHECK(cudaFuncSetAttribute(block_model<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem));
  int resident = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, block_model<D>, 256, C::kSmem));
  if (resident != C::kCtasPerSm)
    fprintf(stderr, "block_overlap: D %d runs %d CTA(s) an SM, not the %d it models\n", D, resident, C::kCtasPerSm);
  auto launch = [&] { block_model<D><<<C::kBlocks, 256, C::kSmem>>>(tiles, io, in, out, pds, kv, sink); };
  const float ms = median_ms(launch, 10, 3);
  CHECK(cudaGetLastError());
  return ms;
}

int main(int argc, char** argv) {
  std::vector<int> tile_counts;
  for (int i = 1; i < argc; ++i) tile_counts.push_back(atoi(argv[i]));
  if (tile_counts.empty()) tile_counts = {5, 14};
  for (int t : tile_counts)
    if (t < 1 || t > 64) {
      fprintf(stderr, "block_overlap: tiles must be 1..64 (got %d)\n", t);
      return 2;
    }
  int max_tiles = 0;
  for (int t : tile_counts) max_tiles = t > max_tiles ? t : max_tiles;
  // Inputs: 8192 blocks x (Q, dO, O) of 64 KB each = 1.5 GB (the D 256 blocks read half each, twice as many);
  // dQ 0.5 GB; P/dS 8 KB a tile a block; the kv table 8 MB.
  const size_t in_bytes = (size_t)8192 * 3 * 65536, out_bytes = (size_t)8192 * 65536;
  const size_t pds_bytes = (size_t)8192 * max_tiles * 8192, kv_bytes = (size_t)kKvRows * 1024;
  uint4 *in, *out, *pds, *kv;
  float* sink;
  CHECK(cudaMalloc(&in, in_bytes));
  CHECK(cudaMalloc(&out, out_bytes));
  CHECK(cudaMalloc(&pds, pds_bytes));
  CHECK(cudaMalloc(&kv, kv_bytes));
  CHECK(cudaMalloc(&sink, 256 * sizeof(float)));
  fill<<<1024, 256>>>(reinterpret_cast<unsigned*>(in), in_bytes / 4, 1);
  fill<<<1024, 256>>>(reinterpret_cast<unsigned*>(kv), kv_bytes / 4, 2);
  CHECK(cudaDeviceSynchronize());
  printf("block model of dq (median of 10 launches, ms; same MACs and bytes in both forms)\n");
  for (int t : tile_counts) {
    const float a_io = run<512>(t, 1, in, out, pds, kv, sink), a_no = run<512>(t, 0, in, out, pds, kv, sink);
    const float b_io = run<256>(t, 1, in, out, pds, kv, sink), b_no = run<256>(t, 0, in, out, pds, kv, sink);
    printf("tiles %2d  D 512, 1 CTA an SM:  %.3f (no transfers %.3f, block term %.3f)\n", t, a_io, a_no, a_io - a_no);
    printf("tiles %2d  D 256, 2 CTAs an SM: %.3f (no transfers %.3f, block term %.3f)  ratio to D 512: %.3f\n", t,
           b_io, b_no, b_io - b_no, b_io / a_io);
  }
  CHECK(cudaFree(in));
  CHECK(cudaFree(out));
  CHECK(cudaFree(pds));
  CHECK(cudaFree(kv));
  CHECK(cudaFree(sink));
  return 0;
}
