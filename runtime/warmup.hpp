// warmup.hpp: the offline compile driver behind smla-warmup: every kernel the planner would
// launch for a list of problems and targets, compiled ahead of time into a cache directory
// (no GPU needed). The directory then serves as SMLA_CACHE_SYSTEM_DIR (read-only) on other
// machines, or as the user cache itself.
//
// T policy: no kernel has T compiled in (T, num_kv, r_chunk and the chunk index are run-time
// arguments in SmlaParams), so a new T with everything else the same reuses every compiled
// kernel. The only way T changes the kernel set is through the tuning database: its T buckets
// (powers of two) may hold different tile configs; warm-up applies them the way plan() does.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "smla/smla.hpp"

namespace smla {

struct WarmupItem {
  enum class State { Planned, Compiled, Cached, Failed };
  std::string target;  ///< as compiled for ("sm_90a", "gfx90a:sramecc+:xnack-")
  std::string kernel;  ///< source stem ("dq")
  std::string tag;     ///< constants of the translation unit ("HEADS128-BLOCK_H64-...")
  std::string entry;   ///< cache entry name "<stem>-<tag>-<digest>" ("" when it failed before keying)
  std::vector<std::string> entries;  ///< kernel entry points launched from this translation unit
  State state = State::Planned;
  std::string error;   ///< first line of the error (Failed), e.g. "compiled but not written to DIR: why"
  double seconds = 0;  ///< compile time (Compiled)
};

struct WarmupResult {
  /// Each item counts once: compiled (and written), cached (already there) or failed (including
  /// compiled but not written); `failed` also counts `errors`.
  int compiled = 0, cached = 0, failed = 0;
  double seconds = 0;
  std::vector<WarmupItem> items;    ///< one per distinct translation unit and target
  std::vector<std::string> errors;  ///< failures before any kernel (unknown target, unsupported shape); each counts in `failed`
  /// The tuning database read (empty when WarmupOptions::use_tuning_db is off), whether that file exists, and how many
  /// of its tuned configs had their kernels added: a job whose plan() applies a tuned config this warm-up never saw
  /// (another user's database, a path that does not exist here) compiles it at its start.
  std::string tuning_db;
  bool tuning_db_exists = false;
  int tuned_configs = 0;
  /// Each target's compiler identity, part of every key written for it: a job finds these entries only where its own
  /// compiler says the same (smla-bench --backends prints it), so a cache warmed on one machine is checked for another.
  std::vector<std::pair<std::string, std::string>> compilers;  ///< (target, identity), in the order first met
};

struct WarmupOptions {
  std::string out_dir;            ///< the cache directory written (required)
  int jobs = 0;                   ///< concurrent compiles; 0 = hardware threads
  bool dry_run = false;           ///< list kernels and keys, compile nothing
  bool use_tuning_db = true;      ///< also the configs tuned for each device of a target (plan() picks its own)
  std::string tuning_db;          ///< empty: default_tuning_db_path()
  std::string kernel_src_dir;     ///< empty: SMLA_KERNEL_SRC_DIR if set (what plan() uses), else the embedded sources
  std::string hip_worker;         ///< path hint for smla-hiprtc-worker
  size_t interm_budget = 0;       ///< 0: runtime_env().interm_budget (what plan() uses)
  /// Non-empty: plan each problem with each of these explicit configs instead of the
  /// heuristic/tuned one (smla-tune precompiles its candidates this way).
  std::vector<TileConfig> configs;
  /// Called after each item finishes (from worker threads, serialized): the item, done, total.
  std::function<void(const WarmupItem&, size_t, size_t)> progress;
};

/// Targets of the GPUs present (deduplicated), e.g. {"sm_90a"}; empty with `why` when none.
std::vector<std::string> present_targets(std::string* why);

/// Family of a target id: "cuda" for sm_*, "hip" for gfx*, "" otherwise.
std::string target_family(const std::string& target);

/// The full target ids warm_kernels compiles for: AMD names completed as the devices report them
/// (plan() keys with that), a plain "gfx90a" as both its xnack- and xnack+ ids (HSA_XNACK=1 on the
/// same GPU gives xnack+): see hip::hip_target_ids. Others as given, duplicates dropped.
std::vector<std::string> warm_targets(const std::vector<std::string>& given);

/// Why plan() would refuse `target` by its name alone (its family, syntax, processor), whatever the compilers here;
/// empty when it would not. warm_kernels() reports such a target as a failed item; smla-warmup refuses it up front.
std::string target_name_problem(const std::string& target);

/// Compiles (or, dry run, lists) every distinct translation unit the planner would launch for
/// each problem on each target (as warm_targets() completes them) into a DiskCache at
/// opts.out_dir; NVRTC on threads, hipRTC in worker subprocesses. Failures are counted and
/// described, never thrown; throws smla::Error only for unusable options (no out_dir, an
/// unwritable out_dir).
WarmupResult warm_kernels(const std::vector<Problem>& problems, const std::vector<std::string>& targets,
                          const WarmupOptions& opts);

/// Parses one --shape: comma-separated fields `[NAME=]SPEC`, NAME one of T, H, NUM_KV, TOPK,
/// R_CHUNK (a field without a name takes its position's name), SPEC a number, `A:B:STEP`
/// (A, A+STEP, ... <= B) or `A:B:*F` (A, A*F, ... <= B). T, H, NUM_KV and TOPK are required;
/// the problems are the cross product of the ranges. Throws smla::Error(InvalidArgument).
std::vector<Problem> parse_shape_spec(const std::string& spec);

/// "T=4096 H=128 num_kv=5120 topk=512[ r_chunk=R][ sink]": a problem in the tools' messages.
std::string describe_problem(const Problem& p);

/// Problems from JSON: an array (or {"problems": [...]}) of objects with T, H, num_kv, topk
/// (numbers or range strings as in parse_shape_spec) and optional r_chunk, sink, lse_base2,
/// lse_includes_sink, check_indices, dkv_fp32. Throws smla::Error(InvalidArgument).
std::vector<Problem> parse_problems_json(const std::string& text);

/// The problems of a tool's command line: every --shape spec, with the sink "on", "off" or "both",
/// and the opt-in index check; then the problems of a JSON file (empty path: none). Throws
/// smla::Error naming a file that cannot be read. May return an empty list.
std::vector<Problem> collect_problems(const std::vector<std::string>& shapes, const std::string& sink,
                                      const std::string& json_file, bool check_indices);

}  // namespace smla
