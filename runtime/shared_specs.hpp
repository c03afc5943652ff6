// shared_specs.hpp: launch specs of the phases whose kernel body is one source for every GPU
// family (check_topk, delta, gather, d_sink: kernel_src/<stem>.cu, included by <stem>.hip). One
// body, one geometry: the specs live here so the families cannot drift apart. Also the shape limits
// every family's kernels share (shared_shape_errors).
#pragma once
#include <algorithm>
#include <ostream>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "phases.hpp"
#include "../kernel_src/smla_params.h"

namespace smla {

/// True for the phases this header describes.
inline bool is_shared_phase(Phase p) {
  return p == Phase::CheckTopk || p == Phase::Delta || p == Phase::Gather || p == Phase::DSink;
}

/// `lane_group`: the smallest block a family launches for the single-thread steps (32 on CUDA,
/// a 64-lane wavefront on AMD).
inline std::vector<KernelSpec> shared_phase_kernels(Phase phase, const ShapeInfo& s, unsigned lane_group) {
  constexpr unsigned kSmallThreads = 256;  // block size of the memory-bound kernels
  switch (phase) {
    case Phase::CheckTopk: {
      const std::vector<std::pair<std::string, long long>> d{{"NUM_THREADS", kSmallThreads}};
      // grid-stride scan; 8 slots per thread is enough work per block, 4096 blocks fill any GPU
      const unsigned blocks = std::min(4096u, ceil_div(static_cast<long long>(s.T) * s.topk, kSmallThreads * 8LL));
      return {make_spec("check_topk", "smla_check_topk_init", d, grid_xy(1), lane_group),
              make_spec("check_topk", "smla_check_topk_scan", d, grid_xy(blocks), kSmallThreads),
              make_spec("check_topk", "smla_check_topk_final", d, grid_xy(1), lane_group)};
    }
    case Phase::Delta:  // 8 rows of 32 lanes per block
      return {make_spec("delta", "smla_delta", {{"NUM_WARPS", 8}},
                        grid_xy(ceil_div(static_cast<long long>(s.T) * s.H, 8)), 8 * 32)};
    case Phase::Gather: {
      // One block per kv row, of `groups` groups of 128 threads (4 columns each), each summing a
      // contiguous share of the row's contributors, 16 in flight per round. A row's time is a chain of
      // dependent load rounds (~1.6 us each on the H200), and a row can have up to T contributors
      // (every token picks it; the benchmark top-k has such rows), T / 16 rounds; the bytes (T *
      // r_chunk interm rows of 1 KB at ~4.5 TB/s) take longer than that only from r_chunk ~440 up. So
      // below that the hottest rows are the gather's tail and four groups cut it: topk 160
      // (4096,128,4128,160) gather 0.415 -> 0.291 ms; at topk 512 (the seed) four groups were slower,
      // 0.481 -> 0.536 ms. Measured on the H200, docs/perf-notes.md (v6). Decided on topk, which bounds
      // r_chunk and, unlike it, does not change with T: a new T never compiles another gather. The four-group
      // kernel takes the rows from the last (the pool rows, the hot ones, first): 0.291 -> 0.229 ms at topk 160 (v13).
      const int groups = s.topk <= 320 ? 4 : 1;
      return {make_spec("gather", "smla_gather", {{"UNROLL", 16}, {"GATHER_GROUPS", groups}},
                        grid_xy(static_cast<unsigned>(s.num_kv)), groups * (SMLA_D / 4))};
    }
    case Phase::DSink:
      return {make_spec("d_sink", "smla_d_sink", {{"NUM_THREADS", kSmallThreads}}, grid_xy(s.H), kSmallThreads)};
    default:
      return {};
  }
}

/// The limits every GPU family's kernels share (sizes >= 1, H, the int32 slot ids, r_chunk), written to `e` in the
/// form each family's `*_shape_supported` gives its own; `family` names the kernels ("CUDA", "HIP").
inline void shared_shape_errors(const ShapeInfo& s, const char* family, std::ostream& e) {
  const long long items = static_cast<long long>(s.T) * s.topk;
  if (s.T < 1 || s.num_kv < 1 || s.topk < 1) e << "T, num_kv and topk must be >= 1; ";
  if (s.H < 16 || s.H > 128 || s.H % 16 != 0)
    e << "H = " << s.H << ": the " << family << " kernels need H a multiple of 16 in [16, 128]; ";
  if (items >= (1LL << 31)) e << "T * topk = " << items << " must be < 2^31 (int32 slot ids); ";
  if (static_cast<long long>(s.num_kv) + 1 >= (1LL << 31)) e << "num_kv must be < 2^31 - 1; ";
  if (s.r_chunk < 1 || s.r_chunk > s.topk) e << "r_chunk = " << s.r_chunk << " must be in [1, topk]; ";
}

/// Every distinct kernel (stem, entry, defines) that `phase_kernels` launches for these shapes,
/// each once (first geometry kept): the list offline compile tests and warm-up work from.
template <class PhaseKernels>
std::vector<KernelSpec> distinct_kernels(const std::vector<ShapeInfo>& shapes, PhaseKernels phase_kernels) {
  std::vector<KernelSpec> out;
  std::set<std::tuple<std::string, std::string, std::vector<std::pair<std::string, long long>>>> seen;
  for (const ShapeInfo& s : shapes) {
    std::vector<Phase> phases{Phase::Delta, Phase::Dq, Phase::DkvInterm, Phase::Csr, Phase::Gather};
    if (s.check_indices) phases.push_back(Phase::CheckTopk);
    if (s.has_sink) phases.push_back(Phase::DSink);
    for (Phase ph : phases)
      for (KernelSpec& k : phase_kernels(ph, s))
        if (seen.insert({k.stem, k.entry, k.defines}).second) out.push_back(std::move(k));
  }
  return out;
}

}  // namespace smla
