// planner.hpp: validation of a problem, the planner's choices, and the order of the launches.
// Pure functions of their inputs (no device, no files), so they are unit-tested in CI.
#pragma once
#include <functional>
#include <vector>

#include "phases.hpp"
#include "smla/smla.hpp"

namespace smla {

/// Throws smla::Error naming the field and what is expected when the problem is invalid or
/// unsupported. Changes nothing.
void validate_problem(const Problem& p);

/// Largest divisor of `topk` that is a multiple of 16 and keeps the interm buffer
/// (T x r_chunk x 512 bf16) within `interm_budget_bytes`; 16 at least.
int64_t default_r_chunk(int64_t T, int64_t topk, size_t interm_budget_bytes);

/// Number of radix passes of `bits` bits that cover keys 0..num_kv.
int radix_passes_for(int64_t num_kv, int bits);

/// The planner's choices for a validated problem (chunking, csr geometry, tiles).
ShapeInfo choose_shape(const Problem& p, size_t interm_budget_bytes);

struct Step {
  Phase phase;
  int chunk = 0;  ///< chunk index for per-chunk phases, 0 otherwise
  KernelSpec spec;
};

using KernelsOf = std::function<std::vector<KernelSpec>(Phase, const ShapeInfo&)>;

/// The launch order: check_topk (opt-in), delta, then per chunk dq, dkv_interm, csr, gather,
/// then d_sink (with a sink).
std::vector<Step> order_steps(const ShapeInfo& s, const KernelsOf& kernels_of);

}  // namespace smla
