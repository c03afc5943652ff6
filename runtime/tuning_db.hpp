// tuning_db.hpp: the tuning database: the best tile config smla-tune measured per target and
// problem class, kept apart from the kernel cache (binaries and measurements age differently).
//
// One versioned JSON file (default $SMLA_TUNING_DB, else $XDG_CACHE_HOME/smla/tuning.json, else
// ~/.cache/smla/tuning.json). Writers resolve symlinks in the path, take an flock on "<file>.lock"
// beside the real file (waiting at most SMLA_TUNING_DB_LOCK_TIMEOUT_S, default 60 s; a fork()ed
// child does not keep it), re-read it, merge their entry and publish by rename, so several tuning
// processes (through any link) merge instead of clobbering; temp files of stores killed part way
// are removed by a later store once their writer is gone (cache::detail::owner_gone). Files and
// directories are created 0666/0777 for the umask to decide (umask 002 and a setgid directory: a
// group's shared database).
// Readers never lock (a rename is atomic). A corrupt file or one of an older schema is ignored
// with a warning and replaced by the next store; one of a newer schema is ignored and never
// overwritten (a store throws).
//
// Problem class: the device class (tuning_device_class: target, device name and multiprocessors, so an H100 and an
// H200, both sm_90a, sharing one database keep their own measurements), H, topk, sink, lse convention, dkv_fp32, T
// and num_kv rounded up to a power of two, and the runtime version (smla version + a digest of the kernel sources), so a
// new T inside a bucket reuses its tuned config (and its kernels: no T is compiled into a kernel)
// and a kernel change invalidates old measurements.
#pragma once
#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "phases.hpp"
#include "smla/smla.hpp"

namespace smla {

class KernelSources;

/// Layout of the file; a file with another schema is ignored (warning); an older one is rewritten on store, a
/// newer one makes store throw. 2: entries keyed by device class (1 keyed by target only).
constexpr int kTuningSchema = 2;

/// The device class tuned entries are kept under: "<target>/<device name>/<multiprocessors>sm" (';', '/' and '=' in
/// the name become '_'), e.g. "sm_90a/NVIDIA H200/132sm"; a bare target is a class too (the backends that report
/// nothing more).
std::string tuning_device_class(const std::string& target, const std::string& device_name, int multiprocessors);
/// The target of a device class (its text before the first '/').
std::string target_of_device_class(const std::string& device_class);

/// Whether a tuned entry may be used for p on `kind`'s kernels at `target` (plan() asks before it takes one): the
/// backend's own shape check on the config (the CPU backend takes any), and no more than kMaxChunkPairs chunk pairs.
/// False says why; the planner then warns and uses its heuristic.
bool tuned_entry_fits(BackendKind kind, const Problem& p, const TileConfig& t, size_t interm_budget,
                      const std::string& target, std::string* why);

/// How long a store waits for another writer's lock by default (SMLA_TUNING_DB_LOCK_TIMEOUT_S overrides it); a store
/// itself takes milliseconds.
constexpr double kTuningDbLockTimeoutS = 60;

/// $SMLA_TUNING_DB, else $XDG_CACHE_HOME/smla/tuning.json, else ~/.cache/smla/tuning.json, else (no home directory)
/// /tmp/smla-tuning-<uid>/tuning.json, a directory of this user's alone (tuning_db_in_shared_tmp()).
std::string default_tuning_db_path();

/// True when `path` is default_tuning_db_path()'s /tmp fallback: a TuningDb there reads and writes only while its
/// directory is private (cache/private_dir.hpp), as the kernel cache's /tmp fallback does. Another user could have
/// made that directory first and planted a database in it.
bool tuning_db_in_shared_tmp(const std::string& path);

/// "smla-0.1.0;kernels=<fnv64 of every kernel source file>": measurements are only valid for
/// the kernels they were taken with.
std::string tuning_runtime_version(const KernelSources& sources);

/// The runtime version a Runtime looks tuned configs up under: that of the sources it compiles (`kernel_src_dir`,
/// else $SMLA_KERNEL_SRC_DIR as runtime_env() read it, else the embedded ones). smla-tune stores under it.
std::string default_tuning_runtime_version(const std::string& kernel_src_dir = {});

/// smla-tune's verdict on one problem from its heuristic candidate (`config` labelled; the config every untuned
/// plan() runs): "" when it passed the check and was timed (only then is a winner stored, beside its time); else the
/// error that fails the run, naming `state` ("wrong", "rejected", ...) and `detail`.
std::string tune_heuristic_error(const std::string& config, const std::string& state, const std::string& detail,
                                 size_t others_timed);

/// Smallest power of two >= v (1 for v <= 1): the T and num_kv buckets.
int64_t pow2_bucket(int64_t v);

/// The problem-class key of `p` on `device_class` (readable; also the JSON object key).
std::string tuning_key(const std::string& device_class, const Problem& p, const std::string& runtime_version);

/// The planner's shape for `p` with `cfg` applied the way Runtime::plan(p, cfg) applies it
/// (cfg->r_chunk overrides p.r_chunk, then the tile fields). `cfg` may be null (heuristic).
/// `target` ("sm_90a", "gfx950", ...) sets ShapeInfo::sm90a, which decides the default dq and dkv bodies.
ShapeInfo shape_with_config(const Problem& p, const TileConfig* cfg, size_t interm_budget_bytes,
                            const std::string& target = "");

/// The tile fields of `cfg` (when not null) and the target's features into `s`.
void apply_config(ShapeInfo& s, const TileConfig* cfg, const std::string& target);

struct TuningEntry {
  TileConfig config;
  double ms = 0;            ///< the winner, at T_tuned
  double heuristic_ms = 0;  ///< the planner's heuristic config, same run
  int64_t T_tuned = 0, num_kv_tuned = 0;
};

class TuningDb {
 public:
  /// `path` empty: default_tuning_db_path(). `runtime_version` empty: default_tuning_runtime_version().
  /// `private_dir` (default: the path's directory when tuning_db_in_shared_tmp(path)): a directory that must be this
  /// user's alone (made 0700 if absent) for the database to be read or written; while it is not, lookups find nothing
  /// (one warning with the reason) and store() / check_store() throw naming it.
  explicit TuningDb(std::string path = {}, std::string runtime_version = {}, std::string private_dir = {});
  ~TuningDb();
  TuningDb(const TuningDb&) = delete;
  TuningDb& operator=(const TuningDb&) = delete;

  /// The tuned config for `p` on `device_class` (tuning_device_class), or nothing (no entry, another runtime version, an
  /// unreadable or corrupt file, a malformed entry: each warned about once). When p.r_chunk is
  /// set, the caller's r_chunk is kept. A tuned r_chunk holds at any T of the bucket: where its
  /// interm would exceed the budget the planner splits the tokens.
  /// Thread-safe, also in a child fork()ed while another thread looked up; re-reads the file only when it changed.
  std::optional<TileConfig> lookup(const std::string& device_class, const Problem& p) const;
  /// The stored entry with its timings.
  std::optional<TuningEntry> find(const std::string& device_class, const Problem& p) const;
  /// The tuned configs for `p` of every device class of `target` (warm-up, which has no device to ask), in the
  /// file's order; the caller's r_chunk kept as in lookup().
  std::vector<TileConfig> lookup_target(const std::string& target, const Problem& p) const;

  /// Adds or replaces the entry of `p`'s class on `device_class` (atomic, merged under a file lock).
  /// Throws smla::Error naming the path when the file cannot be read or written, is a directory,
  /// or has a newer schema (left untouched), or naming the lock file (and its holder) when another
  /// writer held it past the lock timeout (SMLA_TUNING_DB_LOCK_TIMEOUT_S, read at construction).
  void store(const std::string& device_class, const Problem& p, const TuningEntry& e);
  /// Throws what store() would about the file itself (a directory or not a regular file, unreadable, not a tuning
  /// database, a newer schema) and its directory (one that cannot take new files, or be made), writing nothing and
  /// taking no lock: smla-tune asks before minutes of tuning.
  void check_store() const;
  /// Throws unless the file is a database this smla reads (absent, a directory, unreadable, damaged, foreign, another
  /// schema: each of which a lookup only warns about, finding nothing): for a database a user named explicitly.
  void check_read() const;

  const std::string& path() const { return path_; }
  const std::string& runtime_version() const { return version_; }
  /// Warnings raised so far (corrupt file, other schema, malformed entries); also logged.
  std::vector<std::string> warnings() const;

 private:
  // What the mutex guards belongs to one process: a fork()ed child starts its own state, since a thread of the
  // parent may have held the mutex at the fork (the child would wait for it for ever). The inherited state is leaked,
  // not destroyed (destroying a locked mutex is undefined); the child re-reads the file.
  struct State {
    explicit State(pid_t p) : pid(p) {}
    const pid_t pid;
    std::mutex mu;
    std::string stamp;  // identity of the file last parsed (inode, size, mtime)
    std::vector<std::pair<std::string, TuningEntry>> entries;
    std::vector<std::string> warnings;
    std::string private_problem;  // the last reason private_dir_ was refused (warned once a reason)
  };
  State& state() const;
  void refresh(State& st) const;  // under st.mu
  void warn(State& st, const std::string& msg) const;
  std::string unprivate_dir(std::string* why) const;  // "" while private_dir_ is private (or none), else the message
  void refuse_unprivate_dir() const;  // store() / check_store(): throws while private_dir_ is not private

  std::string path_, version_, private_dir_;
  double lock_timeout_s_;
  mutable std::atomic<State*> state_;
};

}  // namespace smla
