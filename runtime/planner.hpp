// planner.hpp: validation of a problem, the planner's choices, and the order of the launches.
// Pure functions of their inputs (no device, no files), so they are unit-tested in CI.
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "phases.hpp"
#include "smla/smla.hpp"

namespace smla {

/// Throws smla::Error naming the field and what is expected when the problem is invalid or
/// unsupported. Changes nothing.
void validate_problem(const Problem& p);

/// A non-zero r_chunk the planner takes: a multiple of 16 that divides topk (Problem::r_chunk, TileConfig::r_chunk).
bool r_chunk_ok(int64_t r_chunk, int64_t topk);
/// What an r_chunk that is not r_chunk_ok() is told it should be.
std::string r_chunk_expected(int64_t topk);
/// The ranges every backend checks in an explicit TileConfig (the GPU backends then check the tiles against their
/// kernels; the CPU backend has no tiles and ignores them): impls within 0..kMax, tile sizes and r_chunk >= 0.
void validate_config(const TileConfig& c);
/// The most (token chunk, top-k chunk) pairs a plan may have: each is ~4 launches and ~1.2 KB of plan, so a tiny
/// t_chunk and r_chunk over a large problem (8M launches, 2.6 GB of plan, measured) is refused by name instead.
constexpr int64_t kMaxChunkPairs = int64_t(1) << 16;
/// Throws InvalidArgument naming t_chunk and r_chunk when s has more than kMaxChunkPairs chunk pairs.
void check_chunk_count(const ShapeInfo& s);

/// Tokens a chunk: T where the interm buffer (T x r_chunk x 512 bf16) fits `interm_budget_bytes`, else the size of
/// the fewest equal chunks that fit (1 at least).
int64_t default_t_chunk(int64_t T, int64_t r_chunk, size_t interm_budget_bytes);

/// Bits of the csr sort's keys: 0..num_kv (num_kv marks an empty slot).
int csr_key_bits(int64_t num_kv);
/// Radix passes of `bits` bits each that cover the keys.
int radix_passes_for(int64_t num_kv, int bits);
/// The fewest bits per pass with which `passes` passes cover the keys, and at least kCsrMinRadixBits.
int radix_bits_for_passes(int64_t num_kv, int passes);
/// CUDA's csr sort (CUB's onesweep) ranks 2^bits digits with a warp's 32 lanes: at least 32 digits a pass.
constexpr int kCsrMinRadixBits = 5;

/// A CUDA target name split: "sm_<compute capability>[a|f]", the capability two or three digits with no leading 0.
struct CudaTargetName {
  int cc = 0;       ///< major * 10 + minor: 90 for "sm_90a", 100 for "sm_100f"
  char suffix = 0;  ///< 0, 'a' (arch-specific) or 'f' (family)
};
/// The one parse of a CUDA target name, which cuda_smem_limit and cuda::cuda_target_supported both read; nullopt for
/// anything else ("gfx950", "sm_", "sm_9", "sm_090", "sm_1000", "sm_90b").
std::optional<CudaTargetName> parse_cuda_target(const std::string& target);

/// The shared memory a block may opt in to on a CUDA target ("sm_80": 163 KB, "sm_86" and "sm_89": 99 KB, "sm_90a":
/// 227 KB, ...: the CUDA programming guide's table by compute capability), or 0 for a target it does not know (a HIP
/// one, a future sm_*, a name parse_cuda_target refuses): the planner then sizes for Hopper and loading the kernel
/// checks the device itself.
unsigned cuda_smem_limit(const std::string& target);

/// The planner's choices for a validated problem (chunking, csr geometry, tiles).
ShapeInfo choose_shape(const Problem& p, size_t interm_budget_bytes);
/// `s` as token chunk `tc` sees it: T = that chunk's tokens (the last may be shorter), one token chunk.
ShapeInfo token_chunk_shape(const ShapeInfo& s, int tc);

struct Step {
  Phase phase;
  int chunk = 0;  ///< top-k chunk index for per-chunk phases, 0 otherwise
  KernelSpec spec;
  /// Token chunk of a per-chunk phase: its index, first token and token count; t_count 0 for the steps over every
  /// token (check_topk, delta, d_sink). The step's params see tokens t_start.. as 0..t_count-1.
  int t_index = 0, t_start = 0, t_count = 0;
  /// The step's place among the steps whose results its output accumulates over, and their number (the kernels'
  /// chunk / n_chunks: the first writes the fp32 carry, the last the output). dq: the top-k chunks of its tokens
  /// (its carry is per token); gather: every token x top-k chunk (dkv sums over all of them); the others: the top-k
  /// chunk, as `chunk`.
  int acc_index = 0, acc_count = 1;
  /// May run on a side stream beside the steps that follow it, up to the next `join` step (csr:
  /// it reads only the top-k and writes only its own regions).
  bool side = false;
  /// The first step that needs the side steps before it (gather reads csr's output).
  bool join = false;
};

using KernelsOf = std::function<std::vector<KernelSpec>(Phase, const ShapeInfo&)>;

/// The launch order: check_topk (opt-in); per token chunk, per top-k chunk: csr (a side step: it may overlap delta,
/// dq and dkv_interm), [delta before the first dq,] dq, dkv_interm, gather (joins csr); then d_sink (with a sink).
/// In order on one stream this is also a valid sequence.
std::vector<Step> order_steps(const ShapeInfo& s, const KernelsOf& kernels_of);

}  // namespace smla
