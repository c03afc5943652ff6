// kernel_cache.hpp: the disk cache of compiled kernels (see cache/README.md).
//
//   DiskCache cache(settings_from_env());            // one per Runtime; thread-safe
//   Fetched f = cache.get_or_compile(fields, compile, accept);
//
// Entries are keyed by XXH3-128 over everything that changes the compiled bytes, published by
// renaming a staged directory, verified (manifest + checksum) on every load, evicted LRU past a
// size bound. Failures of the disk never fail the caller: they degrade to an in-memory cache.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace smla::cache {

/// Bumped whenever the layout, the manifest or the key material changes: old entries then simply
/// stop matching and age out by LRU.
constexpr int kFormatVersion = 1;

/// Everything that changes the compiled bytes of one kernel.
struct KeyFields {
  std::string kernel;     ///< the phase's stem, e.g. "dq" (a translation unit may hold several entry points)
  std::string shape_tag;  ///< readable, e.g. "H128-K512-R512"
  std::string source;     ///< rendered translation unit
  std::vector<std::pair<std::string, std::string>> headers;  ///< (name, content) of every include
  std::vector<std::string> options;  ///< compile options, any order (sorted for the key)
  std::string target;       ///< full target id: "sm_90a", "gfx950:sramecc+:xnack-"
  std::string compiler_id;  ///< e.g. "nvrtc-13.0;cuda-headers-13000" (never hiprtcVersion)
};

struct Key {
  std::string digest;  ///< 32 lowercase hex chars, XXH3-128
  std::string tag;     ///< readable "<kernel>-<shape_tag>", restricted to [A-Za-z0-9_.-]
  /// Directory name of the entry: "<tag>-<digest>".
  std::string entry_name() const { return tag + "-" + digest; }
};

/// Hashes the fields (sorted options, headers sorted by name) plus kFormatVersion.
Key make_key(const KeyFields& f);

/// Every knob of the cache, read once from the environment by settings_from_env().
struct Settings {
  std::string dir;         ///< SMLA_CACHE_DIR; default $XDG_CACHE_HOME/smla, else ~/.cache/smla, else (no home
                           ///< directory) /tmp/smla-cache-<uid>
  /// `dir` is the /tmp fallback: used only as a directory of this user's alone (cache/private_dir.hpp), since another
  /// user could have made it first and put binaries in it.
  bool dir_in_shared_tmp = false;
  std::string system_dir;  ///< SMLA_CACHE_SYSTEM_DIR: read-only layered cache; empty = none
  bool disable = false;    ///< SMLA_CACHE_DISABLE=1: no disk at all (in-memory only)
  bool readonly = false;   ///< SMLA_CACHE_READONLY=1: read the user cache, never write it
  int64_t max_bytes = int64_t(4) << 30;  ///< SMLA_CACHE_MAX_BYTES (K/M/G suffixes); 0 = unbounded
  bool lock = true;        ///< SMLA_CACHE_LOCK=0 disables the cross-process compile lock
  std::string lock_dir;    ///< SMLA_CACHE_LOCK_DIR, node-local. Empty (default): <dir>/.locks when
                           ///< the cache is on a local filesystem, else /tmp/smla-locks-<uid>
  double lock_timeout_s = 120;  ///< SMLA_CACHE_LOCK_TIMEOUT_S: then the waiter compiles itself
  /// Whether an unwritable cache directory is logged as a warning (with the hint to set SMLA_CACHE_DIR). A
  /// caller that names the directory itself (smla-warmup's --out) turns it off and reports unwritable_reason().
  bool warn_unwritable = true;
  int64_t stale_staging_s = 3600;  ///< SMLA_CACHE_STALE_S: staging of any other process older than
                                   ///< this is removed (same host: already once its pid is gone
                                   ///< and it is older than 10 minutes)
  // Test-only hooks (CI fault injection; never set them in production).
  bool test_fail_writes = false;   ///< SMLA_CACHE_TEST_FAIL_WRITES=1: data writes fail with ENOSPC
  int64_t test_capacity_bytes = 0; ///< test hook: a publish past this many bytes of entries fails with ENOSPC
  int test_publish_delay_ms = 0;   ///< SMLA_CACHE_TEST_PUBLISH_DELAY_MS: sleep mid-publish, after
                                   ///< the binary is staged and before the manifest is written
};

/// Reads the knobs above. Malformed values are logged and replaced by their defaults.
Settings settings_from_env();
/// "123", "64K", "512M", "4G" (binary units) -> bytes; false if malformed.
bool parse_byte_size(const std::string& s, int64_t* out);

struct CompileOutput {
  std::vector<uint8_t> binary;
  std::string log;
};

enum class Origin { Compiled, Disk, SystemDisk, Memory };
const char* origin_name(Origin o);

struct Fetched {
  std::vector<uint8_t> binary;
  Origin origin = Origin::Compiled;
  /// Origin::Compiled only: why the binary was kept in memory instead of written to the cache
  /// directory (full disk, unwritable...); empty when it was written.
  std::string not_stored;
};

struct Stats {
  int64_t compiles = 0;          ///< calls of `compile`
  int64_t disk_hits = 0;         ///< verified loads from the user cache
  int64_t system_hits = 0;       ///< verified loads from the system cache
  int64_t corrupt_replaced = 0;  ///< entries that failed verification or were refused, deleted
  int64_t corrupt_kept = 0;      ///< such entries that could not be deleted (read-only cache, or
                                 ///< not writable by us): skipped, recompiled into memory
  int64_t unreadable = 0;        ///< user-cache entries that could not be read at all (EMFILE, EIO, EACCES...):
                                 ///< left in place, not counted as corrupt; recompiled into memory
  int64_t publish_failures = 0;  ///< publishes that failed (disk full, unwritable): kept in memory
  int64_t memory_hits = 0;       ///< hits on binaries kept in memory (disk disabled/unwritable/full)
};

/// One entry as seen by list/verify.
struct EntryInfo {
  std::string name;       ///< directory name
  std::string tag, target, compiler_id;
  int64_t bytes = 0;      ///< all files of the entry
  int64_t age_s = 0;      ///< since last use (the entry's recency stamp)
  bool ok = false;        ///< passed verification (only filled by verify())
  bool unreadable = false;  ///< !ok because it could not be read for a reason outside it (EMFILE, EIO, EACCES...):
                            ///< no verdict on the entry, which is left in place (verify() only)
  std::string problem;    ///< why not, if !ok (verify()); list(): why its manifest could not be read, if so
};

/// Outcome of export/import/prune: counts and the names of entries that were skipped.
struct BulkResult {
  int64_t done = 0;
  std::vector<std::string> rejected;  ///< "name: reason"
  std::string error;                  ///< non-empty: the whole operation failed (message)
  bool refused = false;               ///< `error` is a refusal of the caller's argument (nothing was tried)
};

class DiskCache {
 public:
  /// Never throws: an unusable directory is logged and the cache runs in memory.
  explicit DiskCache(Settings s);
  ~DiskCache();
  DiskCache(const DiskCache&) = delete;
  DiskCache& operator=(const DiskCache&) = delete;

  /// Thread-safe. A verified entry from the user cache, else the system cache, else `compile()`
  /// (one compile per key at a time in this process, and across processes under an optional lock
  /// with timeout), then published. `accept(binary)` returning false for a binary read from disk
  /// (the driver refused it) deletes the entry, logs a warning and recompiles once; an entry that
  /// cannot be deleted (read-only or not ours) is skipped and the binary kept in memory. Throws
  /// only what `compile` or `accept` throws (accept: an error that is not the binary's fault).
  Fetched get_or_compile(const KeyFields& f, const std::function<CompileOutput()>& compile,
                         const std::function<bool(const std::vector<uint8_t>&)>& accept = {});

  /// get_or_compile() without the compile: the binary in memory or a verified, accepted entry of the user or system
  /// cache (a hit refreshes its recency, as there), else nothing: no cross-process lock is taken or waited for (only
  /// this process's per-key mutex, held by a get_or_compile of the key in another thread). An entry it cannot use
  /// (damaged, refused, unreadable) is left as it is, unsaid: the get_or_compile() that follows judges it.
  std::optional<Fetched> lookup(const KeyFields& f, const std::function<bool(const std::vector<uint8_t>&)>& accept = {});

  Stats stats() const;
  const Settings& settings() const { return s_; }
  /// True when entries can be published to settings().dir.
  bool writable() const { return writable_; }
  /// Why the directory could not be written (empty when it can, or when it was not to be: read-only, disabled).
  const std::string& unwritable_reason() const { return unwritable_reason_; }

  // Maintenance, for smla-cache (user cache only). Never throw.
  std::vector<EntryInfo> list() const;
  int64_t total_bytes() const;  ///< list()'s sizes summed, without reading any manifest
  std::vector<EntryInfo> verify() const;  ///< checks every entry; leaves them in place
  /// Checks the entries `listed` (list()'s); one removed since (a clear, prune or eviction elsewhere) is left out.
  std::vector<EntryInfo> verify(std::vector<EntryInfo> listed) const;
  BulkResult prune(int64_t max_bytes);    ///< LRU-evict down to max_bytes; also stale staging
                                          ///< and lock files of absent keys nobody holds
  BulkResult clear();                     ///< every entry; also lock files nobody holds
  /// Verified entries only, into a temp file beside `file` renamed into place once on disk: `file` is the old
  /// bundle or the whole new one; on failure (`error`) nothing is left and `done` is 0. A symbolic link's target is
  /// what is replaced; a `file` that is there and not a regular file (a device, a FIFO, a directory) is refused.
  BulkResult export_bundle(const std::string& file) const;
  BulkResult import_bundle(const std::string& file);        ///< each entry verified before use

 private:
  struct Impl;
  Settings s_;
  bool readable_ = false, writable_ = false;
  std::string unwritable_reason_;
  std::unique_ptr<Impl> impl_;
  // Both of the above: `compile` is called only where `found` is null (get_or_compile); with it, a miss returns at once.
  Fetched fetch(const KeyFields& f, const std::function<CompileOutput()>& compile,
                const std::function<bool(const std::vector<uint8_t>&)>& accept, bool* found);
};

}  // namespace smla::cache
