// kernels_cuda.hpp: the CUDA kernels of every phase and their launch geometry (pure functions of
// the shape). The one place that lists the CUDA variants.
#pragma once
#include <string>
#include <vector>

#include "../phases.hpp"

namespace smla {

/// Whether the CUDA kernels support this shape and the planner's choices in it; `why` says what
/// does not fit (and which constraint) when not.
bool cuda_shape_supported(const ShapeInfo& s, std::string* why);

/// The launches of one phase (for chunked phases: of one chunk; the runtime fills r_start/chunk in
/// SmlaParams), in order. Throws smla::Error(Unsupported) when cuda_shape_supported says no.
std::vector<KernelSpec> cuda_phase_kernels(Phase phase, const ShapeInfo& s);

/// Every distinct kernel (stem, entry, defines) the phases of these shapes launch, each once
/// (first occurrence's geometry kept), for offline compile tests and warm-up.
std::vector<KernelSpec> cuda_all_kernels(const std::vector<ShapeInfo>& shapes);

/// The dkv body the planner takes for this shape (TileConfig::dkv_impl's numbering; 4: dq writes interm, no
/// dkv_interm kernel, no P or dS in the workspace).
int cuda_dkv_impl(const ShapeInfo& s);

/// Bytes of csr's sort scratch (bins, tile counters, look-back) in the csr_hist region for this shape.
long long cuda_csr_scratch_bytes(const ShapeInfo& s);

}  // namespace smla
