// kernels_hip.cpp: which kernel_src/*.hip entries each phase launches on AMD, with which
// constants and geometry. LDS sizes come from the layout functions in amd_mfma.h, the same ones
// the kernels carve their LDS with. Launches are sized in 64-lane wavefronts where the kernel is
// AMD-specific (dq, dkv_interm) and in the CUDA kernels' 32-lane "warps" where the body is
// shared (delta, gather, check_topk, d_sink: a wavefront runs two of them).
#include "kernels_hip.hpp"
#include "../shared_specs.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <set>
#include <sstream>
#include <tuple>

#include "../../kernel_src/amd_mfma.h"
#include "../../kernel_src/smla_params.h"
#include "smla/smla.hpp"

namespace smla {
namespace {

constexpr int kSmallThreads = 256;  // block size of the memory-bound kernels
constexpr int kWave = 64;
constexpr int kDkvWaves = 4;
constexpr int kDkvBlockR = 128;     // rows per pass of a dkv_interm block (32 per wavefront)

struct Tiles {
  int dq_block_h, dq_block_r;
  int dkv_block_r, dkv_block_d;
};

// dq keeps Q and dO of 16 heads in each wavefront's registers (~350 VGPRs with AGPRs): at most
// 4 wavefronts per block, i.e. one per SIMD, so BLOCK_H x BLOCK_R <= 32 x 32.
Tiles tiles_of(const ShapeInfo& s) {
  Tiles t{};
  t.dq_block_h = s.dq_block_h ? s.dq_block_h : (s.H % 32 == 0 ? 32 : 16);
  t.dq_block_r = s.dq_block_r ? s.dq_block_r : 32;
  t.dkv_block_r = s.dkv_block_r ? s.dkv_block_r : kDkvBlockR;
  t.dkv_block_d = s.dkv_block_d ? s.dkv_block_d : (s.H <= 64 ? 128 : 64);
  return t;
}

}  // namespace

bool hip_shape_supported(const ShapeInfo& s, std::string* why) {
  std::ostringstream e;
  const Tiles t = tiles_of(s);
  shared_shape_errors(s, "HIP", e);
  // dq
  if (t.dq_block_h % 16 != 0 || (s.H > 0 && s.H % t.dq_block_h != 0))
    e << "dq_block_h = " << t.dq_block_h << " must be a multiple of 16 dividing H; ";
  if (t.dq_block_r < 32 || t.dq_block_r % 32 != 0) e << "dq_block_r = " << t.dq_block_r << " must be a multiple of 32; ";
  // In 64 bits: a dq_block_r from a TileConfig or a tuning database may be anything up to INT_MAX (16 x 2^30 wrapped
  // to 0 and passed, as did the LDS size; the compile failed instead of the plan falling back).
  const bool dq_tile_fits = static_cast<long long>(t.dq_block_h) * t.dq_block_r <= 32 * 32;
  if (!dq_tile_fits)
    e << "dq tile " << t.dq_block_h << "x" << t.dq_block_r
      << " needs more than 4 wavefronts (each holds Q and dO fragments in registers): at most 32x32; ";
  else if (smla_amd_dq_lds_bytes(t.dq_block_h, t.dq_block_r) > kHipDefaultLds)
    e << "dq tile needs " << smla_amd_dq_lds_bytes(t.dq_block_h, t.dq_block_r) << " B of LDS (max " << kHipDefaultLds << "); ";
  // dkv_interm
  if (t.dkv_block_r < 16 * kDkvWaves || t.dkv_block_r % (16 * kDkvWaves) != 0 || t.dkv_block_r > 4 * 16 * kDkvWaves)
    e << "dkv_block_r = " << t.dkv_block_r << " must be a multiple of " << 16 * kDkvWaves << " up to "
      << 4 * 16 * kDkvWaves << "; ";
  if (t.dkv_block_d < 16 || t.dkv_block_d % 16 != 0 || SMLA_D % t.dkv_block_d != 0 || t.dkv_block_d > 128)
    e << "dkv_block_d = " << t.dkv_block_d << " must be a multiple of 16 dividing 512, at most 128; ";
  if (smla_amd_dkv_lds_bytes(s.H, t.dkv_block_d) > kHipDefaultLds)
    e << "dkv_interm tile needs " << smla_amd_dkv_lds_bytes(s.H, t.dkv_block_d) << " B of LDS (max " << kHipDefaultLds
      << "); ";
  // csr: rocPRIM sorts on bits [0, bits(num_kv)); rowptr reads the result where csr_final says.
  if (s.radix_passes < 1) e << "radix_passes = " << s.radix_passes << " must be >= 1; ";
  const std::string msg = e.str();
  if (why) *why = msg;
  return msg.empty();
}

namespace {
// The launches of a phase (hip_phase_kernels checks the shape before and the launches' sizes after).
std::vector<KernelSpec> build_phase_kernels(Phase phase, const ShapeInfo& s) {
  const Tiles t = tiles_of(s);
  const long long items = static_cast<long long>(s.T) * s.r_chunk;
  if (is_shared_phase(phase)) return shared_phase_kernels(phase, s, kWave);
  switch (phase) {
    case Phase::Dq: {
      const unsigned waves = (t.dq_block_h / 16) * (t.dq_block_r / 16);
      const unsigned lds = smla_amd_dq_lds_bytes(t.dq_block_h, t.dq_block_r);
      // SMLA_SMEM_BYTES: checked against the source's carve (SMLA_CHECK_SMEM), so that a kernel tree given at run
      // time (SMLA_KERNEL_SRC_DIR) that carves more LDS than this fails to compile instead of reading past it.
      return {make_spec("dq", "smla_dq",
                        {{"HEADS", s.H}, {"BLOCK_H", t.dq_block_h}, {"BLOCK_R", t.dq_block_r}, {"SMLA_SMEM_BYTES", lds}},
                        grid_xy(s.T, s.H / t.dq_block_h), waves * kWave, lds)};
    }
    case Phase::DkvInterm: {
      const unsigned lds = smla_amd_dkv_lds_bytes(s.H, t.dkv_block_d);
      return {make_spec("dkv_interm", "smla_dkv_interm",
                        {{"HEADS", s.H}, {"BLOCK_D", t.dkv_block_d}, {"BLOCK_R", t.dkv_block_r}, {"NUM_WAVES", kDkvWaves},
                         {"SMLA_SMEM_BYTES", lds}},
                        grid_xy(s.T, SMLA_D / t.dkv_block_d), kDkvWaves * kWave, lds)};
    }
    case Phase::Csr: {
      const std::vector<std::pair<std::string, long long>> d{{"CSR_THREADS", kSmallThreads}};
      KernelSpec sort;
      sort.stem = kRocprimStem;
      sort.entry = "radix_sort_pairs";  // geometry is rocPRIM's own
      sort.scratch_bytes = s.csr_sort_temp_bytes;  // the csr_hist region plan() sized (0 where nobody sized it)
      return {make_spec("csr", "smla_csr_keys", d, grid_xy(ceil_div(items, kSmallThreads)), kSmallThreads), sort,
              make_spec("csr", "smla_csr_rowptr", d, grid_xy(ceil_div(items + 1, kSmallThreads)), kSmallThreads)};
    }
    default:
      break;
  }
  throw Error(Status::Internal, "unknown phase", __FILE__, __LINE__, "hip_phase_kernels");
}
}  // namespace

std::vector<KernelSpec> hip_phase_kernels(Phase phase, const ShapeInfo& s) {
  std::string why;
  if (!hip_shape_supported(s, &why))
    throw Error(Status::Unsupported, "shape not supported by the HIP kernels: " + why, __FILE__, __LINE__,
                "hip_phase_kernels");
  std::vector<KernelSpec> ks = build_phase_kernels(phase, s);
  // HIP refuses a launch of 2^32 work-items or more in a dimension (hipModuleLaunchKernel: gridDim x blockDim; CUDA
  // counts blocks, up to 2^31 - 1): delta's (32 T H over every token) passes it from T H = 2^27, i.e. T 1M at H 128.
  // Refused here, where each launch is planned (plan() fails naming the kernel), not as a launch error in run().
  for (const KernelSpec& k : ks)
    for (const auto& [g, b, axis] : {std::tuple{k.grid.x, k.block.x, 'x'}, std::tuple{k.grid.y, k.block.y, 'y'},
                                     std::tuple{k.grid.z, k.block.z, 'z'}})
      if (uint64_t(g) * uint64_t(b) > uint64_t(std::numeric_limits<uint32_t>::max()))
        throw Error(Status::Unsupported,
                    "shape not supported by the HIP kernels: " + k.entry + " would launch " +
                        std::to_string(uint64_t(g) * uint64_t(b)) + " work-items in " + axis + ", past HIP's 2^32 - 1",
                    __FILE__, __LINE__, "hip_phase_kernels");
  return ks;
}

std::vector<KernelSpec> hip_all_kernels(const std::vector<ShapeInfo>& shapes) {
  return distinct_kernels(shapes, hip_phase_kernels);
}

}  // namespace smla
