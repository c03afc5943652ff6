// kernels_hip.hpp: the AMD kernels of every phase and their launch geometry (pure functions of
// the shape). The one place that lists the HIP variants; mirrors runtime/cuda/kernels_cuda.hpp.
//
// The csr phase includes one launch that is not a compiled kernel: stem kRocprimStem ("@rocprim"),
// entry "radix_sort_pairs", rocPRIM's stable sort from libsmla_rocprim.so. The runtime must not
// render or compile it; HipBackend::load/launch handle it (see hip_backend.cpp).
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "../phases.hpp"

namespace smla {

/// The stem of the rocPRIM pseudo-kernel (no source file: '@' cannot start a file stem).
inline const char* const kRocprimStem = "@rocprim";

/// True for a spec that names no source to compile (only "@rocprim" today).
inline bool hip_is_library_kernel(const KernelSpec& k) { return !k.stem.empty() && k.stem[0] == '@'; }

/// LDS every HIP kernel of these tiles fits in: 64 KB (gfx90a, gfx942; gfx950 has 160 KB).
constexpr unsigned kHipDefaultLds = 64u * 1024u;

/// Whether the HIP kernels support this shape and the planner's choices in it; `why` says what
/// does not fit when not.
bool hip_shape_supported(const ShapeInfo& s, std::string* why);

/// The launches of one phase (for chunked phases: of one chunk), in order. Throws
/// smla::Error(Unsupported) when hip_shape_supported says no.
std::vector<KernelSpec> hip_phase_kernels(Phase phase, const ShapeInfo& s);

/// Every distinct kernel (stem, entry, defines) the phases of these shapes launch, each once
/// (first occurrence's geometry kept), "@rocprim" included; for offline compile tests and warm-up.
std::vector<KernelSpec> hip_all_kernels(const std::vector<ShapeInfo>& shapes);

}  // namespace smla
