// union_dkv.cu: the premise of a dkv_interm that sums the kv rows a token pair shares before storing them (perf notes
// v46; bench/union_sim.py counts the rows).
//
// Today (dkv_impl 2 at H 128) a block owns one token and 256 columns: B = [q ; dout] for those columns (2H x 256,
// 128 KB) stays in shared memory, and each 64-row tile of A = [ds | pm] (64 x 2H, 32 KB) is read by the token's two
// blocks. A pair of tokens would need both tokens' B: 256 KB for 256 columns, which no SM has. So the pair's blocks own
// 128 columns each (B 2 x 64 KB), four blocks a pair, and each A tile would be read four times from L2 instead of twice
// (+2 GB of L2 reads at the seed, where dkv_interm already runs at 87% of L2's peak). The four blocks as a cluster,
// each fetching a quarter of every A tile and multicasting it to the four (cp.async.bulk ... .multicast::cluster),
// read each A tile from L2 once. What this times is whether either form keeps its tensor pipe fed (c87: the repeats
// cost little, the cluster's lockstep more; perf notes v46).
//
// A unit = one 64-row tile of one token: 16 wgmma k-steps (K = 2H = 256) a warpgroup into the tile's accumulator. A
// group (a token today, NTOK tokens in the union) runs `tiles` tiles; the first GROUP_ALL tiles have a unit for each
// token (rows every token picks), the rest one (rows one token picks). After a tile's last unit its accumulator goes to
// global memory as bf16 (the interm rows). Data are random; no result is checked (the products' layouts are the real
// ones, the values are not), but every accumulator is stored, so none is dead code.
// What it copies from dkv_wgmma.cuh (c87's first form did not, and ran today's shape 2x slower than the real kernel):
// B's first quarter and A's first tile are copied first, and the first tile's MMA runs quarter by quarter as B lands;
// a closed tile is staged as bf16 in its own last A slot and stored 16 bytes a thread, and that slot goes back only
// then. Block: warpgroups 0 and 1 are the consumers (NW columns each, 232 registers by setmaxnreg), warpgroup 2 the
// producer (40 registers; one thread issues bulk copies on mbarriers), as dkv_impl 3 splits its block. Shared memory:
// B (128 KB), three A slots of 32 KB.
//   tok      today's shape: clusters of 1, a block = (token, 256 columns), NW 128, each block copies whole A tiles
//   mcast    clusters of 2 NTOK, a block = (group, 512 / (2 NTOK) columns), each block copies a 1 / (2 NTOK) share of
//            each A tile to every block of the cluster
//   self     the same blocks without the multicast: each copies whole A tiles (2 NTOK L2 reads of each)
//   noa      the same blocks, no A copies at all (the consumers read stale slots): the tensor pipe and the stores alone
// Standalone (not part of the library or its tests; ctest Bench.UnionDkvBuildsForSm90a builds it):
//   nvcc -gencode arch=compute_90a,code=sm_90a -std=c++17 -O3 -I kernel_src -o union_dkv bench/union_dkv.cu
//   ./union_dkv [T TOK_TILES GROUP_TILES GROUP_ALL NTOK]   (default 4096 7 9 6 2: the seed's averages, union_sim B 2)
// NTOK 4: groups of four tokens as clusters of eight blocks of 64 columns (NW 32; B is four tokens' 64 columns).
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include "cuda_check.cuh"
#include <cstdio>
#include <cstdlib>

#include "common.cuh"  // smla_smem_addr
#include "wgmma.cuh"
#include "sm90_sync.cuh"  // smla_mbar_init
#include "cluster_sync.cuh"

namespace cg = cooperative_groups;

constexpr int kK = 256;               // 2H at H 128
constexpr int kUnit = 64 * kK * 2;    // one A tile: 64 rows x 256 K, bf16, four 8 KB K chunks (128-byte swizzle)
constexpr int kSlots = 3;
constexpr int kThreads = 384;  // warpgroups 0 and 1 consume, warpgroup 2 produces (one thread of it)
constexpr int kBBytes = 128 * 1024;   // a block's B
constexpr int kSmem = kBBytes + kSlots * kUnit + 128 + 1024;  // + barriers, + the base's alignment
enum Mode { kTok = 0, kMcast = 1, kSelf = 2, kNoA = 3 };
const char* const kModeName[] = {"tok", "mcast", "self", "noa"};

// Global -> this block's shared memory, completing `bytes` on `bar`.
__device__ __forceinline__ void bulk_g2s(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
// Global -> the same offset in the shared memory of every block of `mask`, completing `bytes` on each one's `bar`.
__device__ __forceinline__ void bulk_g2s_mcast(unsigned dst, const void* src, unsigned bytes, unsigned bar,
                                               unsigned short mask) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1], %2, [%3], %4;"
      ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar), "h"(mask)
      : "memory");
}

// One unit's 16 k-steps into d. FIRSTB: the block's first unit waits for B quarter by quarter (K chunk q of every B
// slice lands on bq + 8 q), so that its MMA starts on the first quarter as dkv_wgmma.cuh's does.
template <int NW, bool FIRSTB>
__device__ __forceinline__ void issue_unit(float (&d)[NW / 2], unsigned a, unsigned b, int acc, unsigned bq) {
  smla_fence_regs(d);
  smla_wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 16; ++kk) {
    if (FIRSTB && (kk & 3) == 0) mbar_wait_cluster(bq + 8 * (kk >> 2), 0);
    const unsigned long long da = smla_wgmma_desc(a + (kk >> 2) * 8192 + (kk & 3) * 32, 16, 1024);
    const unsigned long long db = smla_wgmma_desc(b + (kk >> 2) * (NW * 128) + (kk & 3) * 32, 16, 1024);
    if constexpr (NW == 32)
      smla_wgmma_m64n32k16<0, 0>(d, da, db, kk > 0 || acc);
    else if constexpr (NW == 64)
      smla_wgmma_m64n64k16<0, 0>(d, da, db, kk > 0 || acc);
    else
      smla_wgmma_m64n128k16<0, 0>(d, da, db, kk > 0 || acc);
  }
  smla_wgmma_commit();
}

// A finished tile's accumulator (64 rows x NW columns) as bf16 into out's rows row0.., columns col0.. (512 a row), as
// dkv_wgmma.cuh's epilogue does it: the fragments into the warpgroup's staging half `so` (64-column chunks of 64 rows x
// 128 B, 128-byte swizzle) of the tile's last A slot, then 16-byte coalesced stores.
template <int NW>
__device__ __forceinline__ void store_tile(float (&d)[NW / 2], char* so, int c, smla_bf16* out, long long row0,
                                           int col0) {
  smla_fence_regs(d);
  const int tw = threadIdx.x % 128, warp = tw / 32, lane = tw % 32;
#pragma unroll
  for (int i = 0; i < NW / 8; ++i)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = 16 * warp + lane / 4 + 8 * half;
      *reinterpret_cast<unsigned*>(so + (i >> 3) * 8192 + smla_swz128(row, (i & 7) * 8 + 2 * (lane % 4))) =
          smla_pack_bf2_rn(d[4 * i + 2 * half], d[4 * i + 2 * half + 1]);
    }
  asm volatile("bar.sync %0, 128;" ::"r"(1 + c) : "memory");  // the warpgroup's staging half is written
  constexpr int kPieces = NW / 8, kRows = 128 / kPieces;  // 16-byte pieces a row; rows a pass
  const int pc = tw % kPieces, r0 = tw / kPieces;
#pragma unroll
  for (int r = r0; r < 64; r += kRows) {
    const uint4 v = *reinterpret_cast<const uint4*>(so + (pc >> 3) * 8192 + r * 128 + smla_swz128_piece(r, pc));
    *reinterpret_cast<uint4*>(out + (row0 + r) * 512 + col0 + pc * 8) = v;
  }
}

// What a consumer warpgroup's loop needs.
struct Ctx {
  unsigned sa, sb, full, empty, bq;
  char* slots;  // the A slots, generic address (the staging halves)
  int c, tw, arrivers, n_all, acc0;  // n_all: GROUP_ALL, the tiles every token has a unit in
  smla_bf16* out;
  long long row_base;
  int col0;
};

// Unit n's slot back to whoever copies into it next: lane r < arrivers of the warpgroup's first warp arrives on block
// r's empty barrier (every block of the cluster in mcast, since any of them may copy into the slot next; the own block
// otherwise).
__device__ __forceinline__ void release(const Ctx& x, int n) {
  asm volatile("bar.sync %0, 128;" ::"r"(1 + x.c) : "memory");  // every warp of the warpgroup is past its wait
  const unsigned bar = x.empty + 8 * (n % kSlots);
  if (x.tw < x.arrivers) {
    if (x.arrivers > 1)
      mbar_arrive_remote(mapa(bar, x.tw));
    else
      smla_mbar_arrive(bar);
  }
}

// A closed tile (in acc, its last unit n's slot not yet released) staged in that slot and stored, then the slot
// released. Both warpgroups' MMAs of the slot are done first (barrier 3 over the 256 consumer threads), and both have
// read their staging halves back before the slot goes back.
template <int NW>
__device__ __forceinline__ void finish(const Ctx& x, float (&acc)[NW / 2], int tile, int n) {
  constexpr int kHalf = (NW < 64 ? 64 : NW) * 128;  // a warpgroup's staging half
  asm volatile("bar.sync 3, 256;" ::: "memory");
  store_tile<NW>(acc, x.slots + (n % kSlots) * kUnit + x.c * kHalf, x.c, x.out, x.row_base + tile * 64, x.col0);
  smla_fence_proxy_async();  // the staging's generic accesses before the next bulk copy (async proxy) into the slot
  asm volatile("bar.sync 3, 256;" ::: "memory");
  release(x, n);
}

// One unit into d (first: it opens its tile), waited for; its slot released unless it closes its tile (that slot then
// stages the tile's store, in the next unit's step or at the end). STORE: the tile before (in prev, closed by unit
// n - 1) is finished while this unit runs. No wgmma stays in flight past the step or inside a branch (as in
// dkv_wgmma.cuh: ptxas serializes every wgmma of the kernel otherwise, C7514 / C7518).
template <int NW, bool STORE, bool FIRSTB = false>
__device__ __forceinline__ void consume_unit(const Ctx& x, float (&d)[NW / 2], float (&prev)[NW / 2], int tile, int tok,
                                             int first, int closes, int& n) {
  const int s = n % kSlots;
  mbar_wait_cluster(x.full + 8 * s, (n / kSlots) & 1);
  issue_unit<NW, FIRSTB>(d, x.sa + s * kUnit, x.sb + (tok * 2 + x.c) * (NW * 512), first ? x.acc0 : 1, x.bq);
  if constexpr (STORE) finish<NW>(x, prev, tile - 1, n - 1);
  smla_wgmma_wait<0>();
  smla_fence_regs(d);
  if (!closes) release(x, n);
  ++n;
}
// The units of one tile into d: one a token for the first n_all tiles (rows every token of the group picks), one
// otherwise (the tokens in turn).
template <int NW, int NTOK, bool STORE>
__device__ __forceinline__ void consume_tile(const Ctx& x, float (&d)[NW / 2], float (&prev)[NW / 2], int tile,
                                             int& n) {
  const bool all = tile < x.n_all;
  consume_unit<NW, STORE, !STORE>(x, d, prev, tile, all ? 0 : (tile - x.n_all) % NTOK, 1, !all, n);  // tile 0: B
  if (all)
    for (int tok = 1; tok < NTOK; ++tok) consume_unit<NW, false>(x, d, prev, tile, tok, 0, tok == NTOK - 1, n);
}

// (c87's first form had a producer warp, 288 threads: registers are allocated by four warps, so it got 168 as if 384
// threads and spilled, and under __maxnreg__(224) the runtime refused the launch, "too many resources requested".)
static_assert(smla_setmaxnreg_fits(2, 232, 40), "union_dkv: the register split exceeds the block's pool");

// CL blocks a cluster, NTOK tokens a group; a group is CL blocks (a token's 2 in kTok, whose clusters are of 1; a
// pair's 4 or a quad's 8 otherwise), each of 2 NW columns.
template <int CL, int NW, int NTOK>
__global__ void __launch_bounds__(kThreads, 1) dkv_kernel(const char* A, const char* B, smla_bf16* out, int tiles,
                                                          int n_all, int mode, int acc0) {
  extern __shared__ char smem_raw[];
  char* base = smla_align1024(smem_raw);
  const unsigned sb = smla_smem_addr(base), sa = sb + kBBytes, bars = sa + kSlots * kUnit;
  const unsigned full = bars, empty = bars + 8 * kSlots, bq = bars + 16 * kSlots;  // bq: B's four quarters
  constexpr int kPer = CL == 1 ? 2 : CL;  // blocks a group
  const int group = blockIdx.x / kPer, part = blockIdx.x % kPer;
  const unsigned rank = CL == 1 ? 0u : cg::this_cluster().block_rank();
  const int units = tiles + (NTOK - 1) * n_all;
  const bool mcast = mode == kMcast;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kSlots; ++s) {
      smla_mbar_init(full + 8 * s, 1);
      smla_mbar_init(empty + 8 * s, mcast ? 2 * CL : 2);
    }
    for (int q = 0; q < 4; ++q) smla_mbar_init(bq + 8 * q, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  if constexpr (CL > 1)
    cg::this_cluster().sync();  // every block's barriers are initialised before any remote arrival or copy
  else
    __syncthreads();
  const char* a_group = A + (long long)group * units * kUnit;
  if (threadIdx.x >= 256) {
    smla_setmaxnreg_dec<40>();
    if (threadIdx.x == 256) {
      // B quarter q = K chunk q of every B slice (NTOK tokens x 2 warpgroups, NW * 512 bytes each), on bq + 8 q. The
      // order of dkv_wgmma.cuh: B's first quarter and A's first tile, then the rest of B, then the other tiles.
      const char* b_block = B + (long long)blockIdx.x * kBBytes;
      auto b_quarter = [&](int q) {
        mbar_expect_tx(bq + 8 * q, kBBytes / 4);
        for (int sl = 0; sl < NTOK * 2; ++sl)
          bulk_g2s(sb + sl * (NW * 512) + q * (NW * 128), b_block + sl * (NW * 512) + q * (NW * 128), NW * 128,
                   bq + 8 * q);
      };
      b_quarter(0);
      for (int n = 0; n < units; ++n) {
        const int s = n % kSlots;
        if (n >= kSlots) mbar_wait_cluster(empty + 8 * s, (n / kSlots - 1) & 1);
        const char* src = a_group + (long long)n * kUnit;
        if (mode == kNoA) {
          smla_mbar_arrive(full + 8 * s);
        } else if (mcast) {
          mbar_expect_tx(full + 8 * s, kUnit);  // CL shares land here, one from each block
          bulk_g2s_mcast(sa + s * kUnit + rank * (kUnit / CL), src + rank * (kUnit / CL), kUnit / CL, full + 8 * s,
                         (unsigned short)((1u << CL) - 1));
        } else {
          mbar_expect_tx(full + 8 * s, kUnit);
          bulk_g2s(sa + s * kUnit, src, kUnit, full + 8 * s);
        }
        if (n == 0)  // after the first unit, even when it is the only one (the first unit waits for all of B)
          for (int q = 1; q < 4; ++q) b_quarter(q);
      }
    }
  } else {
    smla_setmaxnreg_inc<232>();
    const int c = threadIdx.x / 128, tw = threadIdx.x % 128;
    float d0[NW / 2], d1[NW / 2];
#pragma unroll
    for (int i = 0; i < NW / 2; ++i) d0[i] = d1[i] = 0.f;
    const long long row_base = (long long)group * tiles * 64;
    const int col0 = part * (2 * NW) + c * NW;
    const Ctx ctx{sa, sb, full, empty, bq, base + kBBytes, c, tw, mcast ? CL : 1, n_all, acc0, out, row_base, col0};
    int n = 0;
    consume_tile<NW, NTOK, false>(ctx, d0, d1, 0, n);
    for (int tile = 1;; tile += 2) {  // odd tiles into d1, even ones into d0: each accumulator in fixed registers
      if (tile >= tiles) break;
      consume_tile<NW, NTOK, true>(ctx, d1, d0, tile, n);
      if (tile + 1 >= tiles) break;
      consume_tile<NW, NTOK, true>(ctx, d0, d1, tile + 1, n);
    }
    if ((tiles - 1) & 1)
      finish<NW>(ctx, d1, tiles - 1, n - 1);
    else
      finish<NW>(ctx, d0, tiles - 1, n - 1);
  }
  if constexpr (CL > 1) cg::this_cluster().sync();  // no block leaves while another may still copy or arrive into it
}

__global__ void fill(unsigned* p, long long n, unsigned seed) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    unsigned x = (unsigned)i * 2654435761u ^ seed;
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    // two bf16 in [-1, 1): sign, exponent 119..126, random mantissa
    const unsigned lo = ((x & 1u) << 15) | ((119u + ((x >> 1) & 7u)) << 7) | ((x >> 4) & 0x7fu);
    const unsigned hi = (((x >> 11) & 1u) << 15) | ((119u + ((x >> 12) & 7u)) << 7) | ((x >> 15) & 0x7fu);
    p[i] = lo | (hi << 16);
  }
}

template <int CL, int NW, int NTOK>
float run(int mode, int blocks, const char* A, const char* B, smla_bf16* out, int tiles, int n_all) {
  auto k = dkv_kernel<CL, NW, NTOK>;
  CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = CL;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.gridDim = dim3(blocks);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmem;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  auto launch = [&] { CHECK(cudaLaunchKernelEx(&cfg, k, A, B, out, tiles, n_all, mode, 0)); };
  launch();
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  return median_ms(launch, 9, 2);
}

int main(int argc, char** argv) {
  const int T = argc > 1 ? atoi(argv[1]) : 4096;
  const int tok_tiles = argc > 2 ? atoi(argv[2]) : 7;
  const int grp_tiles = argc > 3 ? atoi(argv[3]) : 9;
  const int grp_all = argc > 4 ? atoi(argv[4]) : 6;
  const int ntok = argc > 5 ? atoi(argv[5]) : 2;
  if (T < 4 || T % 4 || tok_tiles < 1 || grp_tiles < 1 || grp_all < 0 || grp_all > grp_tiles ||
      (ntok != 2 && ntok != 4)) {
    fprintf(stderr, "usage: union_dkv [T (a multiple of 4) TOK_TILES GROUP_TILES GROUP_ALL (<= GROUP_TILES) "
                    "NTOK (2 or 4)]\n");
    return 2;
  }
  const int groups = T / ntok, grp_units = grp_tiles + (ntok - 1) * grp_all, cl = 2 * ntok;
  const long long a_bytes = std::max((long long)T * tok_tiles, (long long)groups * grp_units) * kUnit;
  const long long b_bytes = (long long)T * 2 * kBBytes;  // 2 blocks a token, 4 a pair, 8 a quad: 2 T blocks in all
  const long long out_rows = std::max((long long)T * tok_tiles, (long long)groups * grp_tiles) * 64;
  char *A, *B;
  smla_bf16* out;
  CHECK(cudaMalloc(&A, a_bytes));
  CHECK(cudaMalloc(&B, b_bytes));
  CHECK(cudaMalloc(&out, out_rows * 512 * 2));
  fill<<<1024, 256>>>(reinterpret_cast<unsigned*>(A), a_bytes / 4, 1u);
  fill<<<1024, 256>>>(reinterpret_cast<unsigned*>(B), b_bytes / 4, 2u);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  // Useful work: today's tiles (one a token's 64 slot rows) x 64 x 512 x 256 multiply-adds.
  const double tok_flop = 2.0 * T * tok_tiles * 64 * 512 * 256;
  printf("T %d: today %d tiles a token; groups of %d tokens (clusters of %d, %d columns a block): %d tiles, %d of them "
         "with every token (%d units); A tile 32 KB, B 128 KB a block, %d B of shared memory\n",
         T, tok_tiles, ntok, cl, 512 / cl, grp_tiles, grp_all, grp_units, kSmem);
  printf("%-6s %8s %10s %10s %10s %12s\n", "mode", "ms", "A L2 GB", "B GB", "out GB", "TFLOP/s*");
  for (int mode = kTok; mode <= kNoA; ++mode) {
    float ms;
    double a_l2, outb;
    if (mode == kTok) {
      ms = run<1, 128, 1>(mode, T * 2, A, B, out, tok_tiles, 0);
      a_l2 = 2.0 * T * tok_tiles * kUnit;
      outb = (double)T * tok_tiles * 64 * 1024;
    } else {
      ms = ntok == 2 ? run<4, 64, 2>(mode, groups * cl, A, B, out, grp_tiles, grp_all)
                     : run<8, 32, 4>(mode, groups * cl, A, B, out, grp_tiles, grp_all);
      a_l2 = (mode == kMcast ? 1.0 : mode == kSelf ? cl : 0.0) * groups * grp_units * kUnit;
      outb = (double)groups * grp_tiles * 64 * 1024;
    }
    printf("%-6s %8.3f %10.2f %10.2f %10.2f %12.1f\n", kModeName[mode], ms, a_l2 / 1e9, b_bytes / 1e9, outb / 1e9,
           tok_flop / ms / 1e9);
  }
  printf("(*: today's multiply-adds over each mode's time, so the column compares times; A L2 GB: the A bytes the "
         "blocks take from L2)\n");
  CHECK(cudaFree(A));
  CHECK(cudaFree(B));
  CHECK(cudaFree(out));
  return 0;
}
