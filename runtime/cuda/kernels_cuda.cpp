// kernels_cuda.cpp: which kernel_src/*.cu entries each phase launches on CUDA, with which
// constants and geometry. Shared-memory sizes come from the layout functions in common.cuh, the
// same ones the kernels carve their shared memory with.
#include "kernels_cuda.hpp"
#include "../planner.hpp"
#include "../shared_specs.hpp"

#include <algorithm>
#include <set>
#include <sstream>
#include <tuple>

#include "../../kernel_src/common.cuh"
#include "../../kernel_src/smla_params.h"
#include "smla/smla.hpp"

namespace smla {
namespace {

constexpr unsigned kMaxSmem = 227u * 1024u;  // per-block opt-in limit of sm_90; the planner checks the device's own
constexpr int kSmallThreads = 256;           // block size of the memory-bound kernels
// csr (csr.cu): CUB's onesweep radix sort; its tiles as CUB tunes them for sm_90 (4-byte keys and values).
constexpr int kCsrOsThreads = 384, kCsrOsItems = 23, kCsrOsTile = kCsrOsThreads * kCsrOsItems;
constexpr int kCsrHistThreads = 128, kCsrHistItems = 16;
constexpr int kCsrSumThreads = 256;           // CSR_SUM_THREADS
constexpr int kCsrCtrInts = 32;               // CSR_CTR_INTS
constexpr long long kCsrMaxItems = ((1ll << 28) - 1) / kCsrOsTile * kCsrOsTile;  // one onesweep portion

// The matrix kernels' tiles after applying the backend defaults (0 in ShapeInfo).
struct Tiles {
  int dq_impl;  // 1 mma.sync, 2 wgmma, 3 wgmma with a producer warpgroup (the default on sm_90a)
  int dq_block_h, dq_block_r, dq_warps;
  int dkv_impl;  // 1 mma.sync, 2 wgmma, 3 wgmma with a producer warpgroup
  int dkv_block_r, dkv_block_d, dkv_warps, dkv_warps_m;
};

// Largest multiple of 16 that divides H and is at most 64 (a dq block keeps Q and dO of its heads
// in shared memory: 64 heads is what fits next to two kv buffers).
int default_dq_block_h(int H) {
  for (int b = 64; b >= 16; b -= 16)
    if (H % b == 0) return b;
  return 16;
}

// The wgmma body's only tile: 64 heads (wgmma's M) x 32 kv rows, two warpgroups (three with the producer of
// dq_impl 3 and 4, dq_wgmma.cuh's DQW_PRODUCER; dq_impl 4 is its persistent form, DQW_PERSIST).
constexpr int kWgmmaBlockH = 64, kWgmmaBlockR = 32, kWgmmaWarps = 8, kWgmmaProducerWarps = 12;
bool is_wgmma_dq(int dq_impl) { return dq_impl >= 2 && dq_impl <= 4; }
bool is_producer_dq(int dq_impl) { return dq_impl == 3 || dq_impl == 4; }

// The dkv_interm wgmma body's only tile: 64 slot rows (wgmma's M) x 256 columns, two warpgroups;
// its K = 2H must be a multiple of 64 (H % 32 == 0).
// dkv_impl 3 (dkv_wgmma.cuh's DKW_PRODUCER) has the same tile and a third, producer warpgroup.
constexpr int kDkvWgmmaBlockR = SMLA_DKV_WGMMA_ROWS, kDkvWgmmaBlockD = SMLA_DKV_WGMMA_COLS, kDkvWgmmaWarps = 8;
constexpr int kDkvWgmmaProducerWarps = 12;
constexpr int kDkvWgmmaHeads = 32;
bool is_wgmma_dkv(int dkv_impl) { return dkv_impl == 2 || dkv_impl == 3; }
// dkv_impl 4: no dkv_interm kernel; the dq body writes interm (dq_wgmma.cuh's DQW_INTERM).
bool is_fused_dkv(int dkv_impl) { return dkv_impl == 4; }

// The longest dq kv tile a caller or a tuning database may ask for (the mma.sync body's tiles are 32 or 64 rows; a
// 256-row one already needs ~280 KB at 64 heads): it keeps dq_smem_bytes() far from wrapping.
constexpr int kMaxDqBlockR = 256;

// dq's shared memory: Q, dO and kv as common.cuh lays them out, then the dS and P tiles stored
// transposed ([BLOCK_R][BLOCK_H + pad], see kernel_src/dq.cu), then the kv row flags.
unsigned dq_smem_bytes(int block_h, int block_r) {
  return smla_dq_qdo_bytes(block_h) + smla_dq_kv_bytes(block_r) + 2u * block_r * (block_h + SMLA_ROW_PAD) * 2u +
         smla_dq_flag_bytes(block_r);
}

// The shared memory the target lets a block have (ShapeInfo::smem_limit; 0: Hopper's).
unsigned smem_limit_of(const ShapeInfo& s) { return s.smem_limit ? s.smem_limit : kMaxSmem; }

Tiles tiles_of(const ShapeInfo& s) {
  Tiles t{};
  const unsigned limit = smem_limit_of(s);
  // Default dq body: wgmma with the producer warpgroup (dq_impl 3) on sm_90a when its one tile fits the shape and
  // the caller's tiles. It beat dq_impl 2 on every DSv4 shape, 1.2-2.9% end to end, and passed the float64 check at
  // the seed, TOPK 160, H 64 and a two-chunk shape (docs/perf-notes.md v9).
  const bool wgmma_fits = s.H % kWgmmaBlockH == 0 && (s.dq_block_h == 0 || s.dq_block_h == kWgmmaBlockH) &&
                          (s.dq_block_r == 0 || s.dq_block_r == kWgmmaBlockR);
  // Its persistent form (dq_impl 4) where the top-k is one chunk of 8 tiles or fewer: -7% end to end at
  // 4096,128,4128,160 and -6% at 4096,128,5120,256 on the H200; from 10 tiles up even there and 1-3% slower on an
  // H100 (perf notes v28). Not with several chunks: an earlier chunk's fp32 carry leaves dq_impl 4's epilogue as
  // fragment stores (its Q and dO buffers may already hold the next block's rows), which v16 found store-bound.
  const bool persist_dq = s.n_chunks == 1 && s.r_chunk <= 8 * kWgmmaBlockR;
  // dkv_impl 4 (dq writes interm; no dkv_interm kernel) where one dq block holds every head of its token (H 64) and the
  // caller asked for no other dq or dkv body or dkv tile: faster end to end than dq_impl 3 or 4 with dkv_interm by
  // 14-15% on the H100 at 4096,64,5120,640 / 160 and 4096,64,8192,2048, by 8.5% (640) and 13% (160) on the H200
  // (perf notes v29, v30). It runs in dq_impl 3's body only
  // (dq_wgmma.cuh: dq_impl 4's consumers spill with it).
  const bool fused_dkv =
      s.dkv_impl == 4 || (s.dkv_impl == 0 && s.sm90a && wgmma_fits && s.H == kWgmmaBlockH &&
                          (s.dq_impl == 0 || s.dq_impl == 3) && s.dkv_block_r == 0 && s.dkv_block_d == 0);
  t.dq_impl = s.dq_impl                 ? s.dq_impl
              : !(s.sm90a && wgmma_fits) ? 1
              : persist_dq && !fused_dkv ? 4
                                         : 3;
  t.dq_block_h = s.dq_block_h ? s.dq_block_h : is_wgmma_dq(t.dq_impl) ? kWgmmaBlockH : default_dq_block_h(s.H);
  t.dq_block_r = s.dq_block_r ? s.dq_block_r : 32;
  // mma.sync on a target with less shared memory than Hopper (an A100's 163 KB): fewer heads a block, while they
  // divide H, until the tile fits (cuda_shape_supported refuses what still does not).
  if (!s.dq_block_h && !is_wgmma_dq(t.dq_impl))
    while (dq_smem_bytes(t.dq_block_h, t.dq_block_r) > limit) {
      int next = t.dq_block_h - 16;
      while (next >= 16 && s.H % next != 0) next -= 16;
      if (next < 16) break;
      t.dq_block_h = next;
    }
  // mma.sync: (BLOCK_H/16) x 2 warps, each holds 16 heads x 256 dq columns; wgmma: two warpgroups (and a producer).
  t.dq_warps = is_producer_dq(t.dq_impl) ? kWgmmaProducerWarps : t.dq_impl == 2 ? kWgmmaWarps : t.dq_block_h / 8;
  // Default dkv body: wgmma on sm_90a when the shape and the caller's tiles allow its one tile.
  const bool dkv_wgmma_fits = s.H % kDkvWgmmaHeads == 0 &&
                              (s.dkv_block_r == 0 || s.dkv_block_r == kDkvWgmmaBlockR) &&
                              (s.dkv_block_d == 0 || s.dkv_block_d == kDkvWgmmaBlockD);
  // Of the two wgmma bodies, dkv_impl 3 (a producer warpgroup, a 64 x 256 tile per consumer) where it measured faster:
  // H 64 with chunks of 8 tiles or more (4096,64,5120,640: dkv_interm 1.28-1.29 -> 1.17-1.19 ms, end to end 0.964-0.968
  // in three calls). At H 128 it was even or slower (seed 0.99-1.00, T 8192 1.00, TOPK 1152 0.99 of dkv_impl 2's
  // dkv_interm time; TOPK 160, three tiles a chunk: 1.14-1.25), so dkv_impl 2 stays there (docs/perf-notes.md v10).
  const bool dkv_producer = s.H == 64 && s.r_chunk >= 8 * kDkvWgmmaBlockR;
  t.dkv_impl = fused_dkv ? 4 : s.dkv_impl ? s.dkv_impl : (s.sm90a && dkv_wgmma_fits ? (dkv_producer ? 3 : 2) : 1);
  t.dkv_block_r = s.dkv_block_r ? s.dkv_block_r : is_wgmma_dkv(t.dkv_impl) ? kDkvWgmmaBlockR : 64;
  t.dkv_block_d = s.dkv_block_d ? s.dkv_block_d : is_wgmma_dkv(t.dkv_impl) ? kDkvWgmmaBlockD : 256;
  // mma.sync with less shared memory: narrower column blocks first (they keep the rows a block shares), then fewer
  // rows; only the fields the caller left to the planner.
  if (!is_wgmma_dkv(t.dkv_impl)) {
    while (smla_dkv_smem_bytes(s.H, t.dkv_block_r, t.dkv_block_d) > limit && !s.dkv_block_d && t.dkv_block_d > 64)
      t.dkv_block_d /= 2;
    while (smla_dkv_smem_bytes(s.H, t.dkv_block_r, t.dkv_block_d) > limit && !s.dkv_block_r && t.dkv_block_r > 32)
      t.dkv_block_r /= 2;
  }
  t.dkv_warps = t.dkv_impl == 3 ? kDkvWgmmaProducerWarps : t.dkv_impl == 2 ? kDkvWgmmaWarps : 8;
  t.dkv_warps_m = 2;  // mma.sync's warp grid; passed to the wgmma body too, which ignores it
  return t;
}

unsigned dq_smem_of(const Tiles& t) {
  return is_wgmma_dq(t.dq_impl) ? smla_dq_wgmma_smem_bytes(t.dq_block_r, is_fused_dkv(t.dkv_impl))
                                : dq_smem_bytes(t.dq_block_h, t.dq_block_r);
}

unsigned dkv_smem_of(const Tiles& t, int H) {
  if (is_fused_dkv(t.dkv_impl)) return 0;
  return is_wgmma_dkv(t.dkv_impl) ? smla_dkv_wgmma_smem_bytes(H, t.dkv_impl == 3)
                                  : smla_dkv_smem_bytes(H, t.dkv_block_r, t.dkv_block_d);
}

}  // namespace

bool cuda_shape_supported(const ShapeInfo& s, std::string* why) {
  std::ostringstream e;
  const Tiles t = tiles_of(s);
  shared_shape_errors(s, "CUDA", e);
  // dq
  if (t.dq_block_h % 16 != 0 || t.dq_block_h > 64 || (s.H > 0 && s.H % t.dq_block_h != 0))
    e << "dq_block_h = " << t.dq_block_h << " must be a multiple of 16, <= 64, dividing H; ";
  // Bounded (a tuning database entry or a caller's TileConfig may say anything): dq_smem_bytes() is 32-bit, and
  // dq_block_r 1966560 wrapped it to 33 KB and was launched.
  if (t.dq_block_r < 32 || t.dq_block_r % 32 != 0 || t.dq_block_r > kMaxDqBlockR)
    e << "dq_block_r = " << t.dq_block_r << " must be a multiple of 32 in [32, " << kMaxDqBlockR << "]; ";
  if (t.dq_impl < 1 || t.dq_impl > TileConfig::kMaxDqImpl)
    e << "dq_impl = " << t.dq_impl
      << " must be 0 (default), 1 (mma.sync), 2 (wgmma), 3 (wgmma, producer warpgroup) or 4 (3, persistent); ";
  if (is_wgmma_dq(t.dq_impl)) {
    const std::string what = "dq_impl = " + std::to_string(t.dq_impl) + " (wgmma)";
    if (!s.sm90a) e << what << " needs an sm_90a target; ";
    if (s.H % kWgmmaBlockH != 0) e << what << " needs H a multiple of 64 (H = " << s.H << "); ";
    if (t.dq_block_h != kWgmmaBlockH || t.dq_block_r != kWgmmaBlockR)
      e << what << " has one tile, 64 x 32 (asked " << t.dq_block_h << "x" << t.dq_block_r << "); ";
  }
  const unsigned limit = smem_limit_of(s);
  const std::string on_target = s.smem_limit ? " on this target" : "";
  if (t.dq_block_r <= kMaxDqBlockR && t.dq_block_h <= 64 && dq_smem_of(t) > limit)
    e << "dq tile " << t.dq_block_h << "x" << t.dq_block_r << " needs " << dq_smem_of(t) << " B of shared memory (max "
      << limit << on_target << "); ";
  // dkv_interm
  if (t.dkv_impl < 1 || t.dkv_impl > TileConfig::kMaxDkvImpl)
    e << "dkv_impl = " << t.dkv_impl
      << " must be 0 (default), 1 (mma.sync), 2 (wgmma), 3 (wgmma, producer warpgroup) or 4 (fused into dq); ";
  if (is_fused_dkv(t.dkv_impl)) {
    if (!s.sm90a) e << "dkv_impl = 4 (fused into dq) needs an sm_90a target; ";
    if (s.H != 64) e << "dkv_impl = 4 (fused into dq) needs H == 64, a dq block holding every head (H = " << s.H << "); ";
    if (t.dq_impl != 3) e << "dkv_impl = 4 (fused into dq) needs dq_impl 3 (dq_impl = " << t.dq_impl << "); ";
  }
  if (is_wgmma_dkv(t.dkv_impl)) {
    const std::string what = "dkv_impl = " + std::to_string(t.dkv_impl) + " (wgmma)";
    if (!s.sm90a) e << what << " needs an sm_90a target; ";
    if (s.H % kDkvWgmmaHeads != 0)
      e << what << " needs H a multiple of 32 (K = 2H a multiple of 64; H = " << s.H << "); ";
    if (t.dkv_block_r != kDkvWgmmaBlockR || t.dkv_block_d != kDkvWgmmaBlockD)
      e << what << " has one tile, " << kDkvWgmmaBlockR << " x " << kDkvWgmmaBlockD << " (asked "
        << t.dkv_block_r << "x" << t.dkv_block_d << "); ";
  }
  if (t.dkv_impl == 1) {
    // mma.sync: warp tile (BLOCK_R/2) x (BLOCK_D/4), multiples of 16; <= 128 fp32 accumulators per thread.
    if (t.dkv_block_r < 32 || t.dkv_block_r % 32 != 0)
      e << "dkv_block_r = " << t.dkv_block_r << " must be a multiple of 32; ";
    if (t.dkv_block_d < 64 || t.dkv_block_d % 64 != 0 || SMLA_D % t.dkv_block_d != 0)
      e << "dkv_block_d = " << t.dkv_block_d << " must be a multiple of 64 dividing 512; ";
    if (static_cast<long long>(t.dkv_block_r) * t.dkv_block_d > 32768)
      e << "dkv tile " << t.dkv_block_r << "x" << t.dkv_block_d << " exceeds 32768 outputs; ";
  }
  if (dkv_smem_of(t, s.H) > limit)
    e << "dkv_interm tile " << t.dkv_block_r << "x" << t.dkv_block_d << " needs " << dkv_smem_of(t, s.H)
      << " B of shared memory (max " << limit << on_target << "); ";
  // csr
  if (s.radix_bits < kCsrMinRadixBits || s.radix_bits > 8)
    e << "radix_bits = " << s.radix_bits << " must be in [" << kCsrMinRadixBits << ", 8] (CUB's onesweep); ";
  if (s.radix_passes > kCsrCtrInts) e << "radix_passes = " << s.radix_passes << " must be at most " << kCsrCtrInts << "; ";
  if (s.chunk_items() > kCsrMaxItems)
    e << "t_chunk x r_chunk = " << s.chunk_items() << " exceeds csr's " << kCsrMaxItems
      << " items a chunk (one onesweep portion); use a smaller t_chunk; ";
  // keys are 0..num_kv; shifts stay below 32
  if (s.radix_passes < 1 || s.radix_passes * s.radix_bits > 32 ||
      (s.radix_passes * s.radix_bits < 32 && (static_cast<long long>(s.num_kv) >> (s.radix_passes * s.radix_bits)) != 0))
    e << "radix_passes = " << s.radix_passes << " x radix_bits = " << s.radix_bits << " do not cover keys 0..num_kv; ";
  const std::string msg = e.str();
  if (why) *why = msg;
  return msg.empty();
}

std::vector<KernelSpec> cuda_phase_kernels(Phase phase, const ShapeInfo& s) {
  std::string why;
  if (!cuda_shape_supported(s, &why))
    throw Error(Status::Unsupported, "shape not supported by the CUDA kernels: " + why, __FILE__, __LINE__,
                "cuda_phase_kernels");
  const Tiles t = tiles_of(s);
  // The wgmma dq bodies compute delta and lse_n themselves at chunk 0 (dq_wgmma.cuh): no delta launch.
  if (phase == Phase::Delta && is_wgmma_dq(t.dq_impl)) return {};
  if (is_shared_phase(phase)) return shared_phase_kernels(phase, s, 32);
  switch (phase) {
    case Phase::Dq: {
      std::vector<std::pair<std::string, long long>> d{
          {"HEADS", s.H}, {"BLOCK_H", t.dq_block_h}, {"BLOCK_R", t.dq_block_r}, {"NUM_WARPS", t.dq_warps}};
      if (is_wgmma_dq(t.dq_impl)) d.emplace_back("DQ_WGMMA", 1);
      if (is_producer_dq(t.dq_impl)) d.emplace_back("DQW_PRODUCER", 1);
      if (t.dq_impl == 4) d.emplace_back("DQW_PERSIST", 1);
      if (is_fused_dkv(t.dkv_impl)) d.emplace_back("DQW_INTERM", 1);
      d.emplace_back("SMLA_SMEM_BYTES", dq_smem_of(t));  // checked against the source's carve (common.cuh)
      // dq_impl 4: one dimension of T * H / 64 blocks of work, launched as at most one block an SM.
      const Dim3 grid = t.dq_impl == 4 ? grid_xy(static_cast<unsigned>(s.T) * (s.H / t.dq_block_h))
                                       : grid_xy(s.T, s.H / t.dq_block_h);
      KernelSpec k = make_spec("dq", "smla_dq", std::move(d), grid, t.dq_warps * 32, dq_smem_of(t));
      if (is_producer_dq(t.dq_impl)) k.launch_regs = smla_launch_regs(t.dq_warps * 32);  // setmaxnreg (dq_wgmma.cuh)
      k.persistent = t.dq_impl == 4;
      return {k};
    }
    case Phase::DkvInterm: {
      if (is_fused_dkv(t.dkv_impl)) return {};  // dq wrote interm
      std::vector<std::pair<std::string, long long>> d{{"HEADS", s.H},
                                                       {"BLOCK_R", t.dkv_block_r},
                                                       {"BLOCK_D", t.dkv_block_d},
                                                       {"NUM_WARPS", t.dkv_warps},
                                                       {"WARPS_M", t.dkv_warps_m}};
      if (is_wgmma_dkv(t.dkv_impl)) d.emplace_back("DKV_WGMMA", 1);
      if (t.dkv_impl == 3) d.emplace_back("DKW_PRODUCER", 1);
      d.emplace_back("SMLA_SMEM_BYTES", dkv_smem_of(t, s.H));  // checked against the source's carve (common.cuh)
      KernelSpec k = make_spec("dkv_interm", "smla_dkv_interm", std::move(d),
                               grid_xy(static_cast<unsigned>(s.T) * (SMLA_D / t.dkv_block_d)), t.dkv_warps * 32,
                               dkv_smem_of(t, s.H));
      if (t.dkv_impl == 3) k.launch_regs = smla_launch_regs(t.dkv_warps * 32);  // setmaxnreg (dkv_wgmma.cuh)
      return {k};
    }
    case Phase::Csr: {
      const std::vector<std::pair<std::string, long long>> d{
          {"CSR_RADIX_BITS", s.radix_bits},     {"CSR_THREADS", kSmallThreads},
          {"CSR_OS_THREADS", kCsrOsThreads},    {"CSR_OS_ITEMS", kCsrOsItems},
          {"CSR_HIST_THREADS", kCsrHistThreads}, {"CSR_HIST_ITEMS", kCsrHistItems}};
      const long long items = s.chunk_items();  // the slots of one chunk, as cuda_csr_scratch_bytes counts them
      const long long scratch_ints = cuda_csr_scratch_bytes(s) / static_cast<long long>(sizeof(int));
      std::vector<KernelSpec> v;
      v.push_back(make_spec("csr", "smla_csr_keys", d,
                            grid_xy(ceil_div(std::max(items, scratch_ints), kSmallThreads)), kSmallThreads, 0, 0));
      // the histogram's blocks stride over its tiles: a few waves of them, not one a tile
      const long long hist_blocks = std::min<long long>(ceil_div(items, kCsrHistThreads * kCsrHistItems), 1024);
      v.push_back(make_spec("csr", "smla_csr_histogram", d, grid_xy(std::max<long long>(hist_blocks, 1)),
                            kCsrHistThreads, 0, 0));
      v.push_back(make_spec("csr", "smla_csr_exclusive", d, grid_xy(s.radix_passes), kCsrSumThreads, 0, 0));
      for (int pass = 0; pass < s.radix_passes; ++pass)
        v.push_back(make_spec("csr", "smla_csr_onesweep", d, grid_xy(ceil_div(items, kCsrOsTile)), kCsrOsThreads, 0,
                              pass));
      // positions 0..n inclusive: n + 1 threads
      v.push_back(make_spec("csr", "smla_csr_rowptr", d, grid_xy(ceil_div(items + 1, kSmallThreads)), kSmallThreads,
                            0, s.radix_passes - 1));
      return v;
    }
    default:
      break;
  }
  throw Error(Status::Internal, "unknown phase", __FILE__, __LINE__, "cuda_phase_kernels");
}

int cuda_dkv_impl(const ShapeInfo& s) { return tiles_of(s).dkv_impl; }

long long cuda_csr_scratch_bytes(const ShapeInfo& s) {
  // csr.cu's layout in csr_hist: bins [passes][digits], the tile counters (kCsrCtrInts), look-back
  // [passes][tiles][digits]
  const long long digits = 1ll << s.radix_bits, tiles = ceil_div(s.chunk_items(), kCsrOsTile);
  return (s.radix_passes * digits + kCsrCtrInts + s.radix_passes * tiles * digits) * static_cast<long long>(sizeof(int));
}

std::vector<KernelSpec> cuda_all_kernels(const std::vector<ShapeInfo>& shapes) {
  return distinct_kernels(shapes, cuda_phase_kernels);
}

}  // namespace smla
