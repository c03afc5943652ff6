// entry_store.hpp (internal): one cache directory on disk, independent of any key logic beyond
// names and manifests. Layout under a root:
//   entries/<tag>-<digest>/{manifest.json, kernel.bin, source.txt}   published, immutable
//   .staging/{stage,trash,probe}.<host>.<pid>.<rand>/                in flight or being deleted
// An entry's directory mtime is its LRU recency stamp (set explicitly on publish and on each hit).
#pragma once
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <spdlog/logger.h>

#include "kernel_cache.hpp"

namespace smla::cache::detail {

constexpr const char* kManifest = "manifest.json";
constexpr const char* kBinary = "kernel.bin";
constexpr const char* kSource = "source.txt";

/// The logger named "smla": the one a host program or the runtime registered, else one made here (stderr, at
/// SMLA_LOG_LEVEL, default warn; cache/logger.cpp).
spdlog::logger& log();

/// Bytes as lowercase hex, two chars a byte.
std::string to_hex(const void* data, size_t n);
/// XXH3-128 of bytes, 32 lowercase hex chars.
std::string hash_hex(const void* data, size_t n);
inline std::string hash_hex(const std::string& s) { return hash_hex(s.data(), s.size()); }

/// The key digest from its material: hashes of the source and headers (so a manifest alone, plus
/// the stored source, suffices to recompute it when verifying). Sorts options and headers.
std::string digest_of(const std::string& kernel, const std::string& shape_tag,
                      const std::string& source_hash,
                      std::vector<std::pair<std::string, std::string>> header_hashes,
                      std::vector<std::string> options, const std::string& target,
                      const std::string& compiler_id);

/// "<readable>-<32 hex>" with a safe charset and no leading dot; the digest part is returned.
bool valid_entry_name(const std::string& name, std::string* digest = nullptr);

/// Whether a file of `bytes` stays within this process's file size limit (RLIMIT_FSIZE, `ulimit -f`, which batch
/// schedulers pass on to jobs): a write past it raises SIGXFSZ, whose default action ends the process (the host
/// application, for the kernel cache). False, with `err` naming the limit and `path`, where it would not.
bool within_file_size_limit(uint64_t bytes, const std::string& path, std::string* err);

/// Writes and fsyncs a new file (O_EXCL). `inject_failure` simulates a full disk (test hook). A file past the file size
/// limit is not written (EFBIG; see within_file_size_limit).
bool write_file(const std::string& path, const void* data, size_t n, bool inject_failure,
                std::string* err, int* err_no = nullptr);
/// Reads a whole regular file (a symlink, FIFO or device in its place is an error: never followed, opened without
/// blocking). `*missing` is set when it does not exist; `*unavailable` when it could not be read for a reason that says
/// nothing about what the cache holds (too many open files, an I/O or network file system error, no permission):
/// such an entry is neither served nor deleted.
bool read_file(const std::string& path, std::vector<uint8_t>* out, std::string* err,
               bool* missing = nullptr, bool* unavailable = nullptr);
/// read_file() of `name` relative to the directory `dirfd` (AT_FDCWD: the working directory); `path` names it in
/// messages.
bool read_file_at(int dirfd, const std::string& name, const std::string& path, std::vector<uint8_t>* out,
                  std::string* err, bool* missing = nullptr, bool* unavailable = nullptr);
bool fsync_dir(const std::string& path);

/// Sets a path's mtime to "now", strictly increasing within this process so LRU order is exact.
void touch(const std::string& path);

struct Root {
  std::string dir;
  std::string entries() const { return dir + "/entries"; }
  std::string staging() const { return dir + "/.staging"; }
  std::string entry(const std::string& name) const { return entries() + "/" + name; }
};

/// Whether `path` itself is a symbolic link (lstat).
bool is_symlink(const std::string& path);
/// Why entries/ or .staging/ of `r` cannot be written or cleaned: "" when neither is a symbolic link. A link there
/// (a group member's, in a shared cache) would have evictions and staging clean-ups delete outside the cache.
std::string linked_subdir(const Root& r);
/// mkdir(dir) with the mode of `root` (group write and setgid of a group's cache), whatever this process's umask:
/// one member's umask 022 would otherwise leave every other member a cache it cannot publish to. False (errno
/// set) when it was not made here (e.g. it exists).
bool make_dir_like_root(const std::string& dir, const std::string& root);
/// A fresh directory .staging/<kind>.<host>.<pid>.<rand>; empty string (and *err) on failure.
std::string make_staging(const Root& r, const char* kind, std::string* err, int* err_no = nullptr);
/// The writability probe: a fresh staging dir renamed into entries/ and removed, as a publish
/// does. False and *err when that fails: e.g. entries/ linked to another filesystem than .staging/
/// (EXDEV), where every publish would fail.
bool probe_publish(const Root& r, std::string* err);
/// "<path> is a dangling symlink to <target>" for the first such path among `path` and its
/// parents, else "".
std::string dangling_symlink(const std::string& path);
struct Loaded;
/// Removes an entry so that nobody sees it half-deleted: rename into .staging, then delete.
/// True when it is gone (or was already: *was_gone); false and *err when it could not be removed (e.g.
/// another user's entry that is not writable by us). `only`: the entry as load_entry() judged it; a directory
/// published under the name since then (a good entry) is left in place.
bool remove_entry(const Root& r, const std::string& name, std::string* err, bool* was_gone = nullptr,
                  const Loaded* only = nullptr);
/// This host's name as owner tags carry it ('/' and ' ' replaced; "host" when it has none).
const std::string& host_name();
/// "<host>.<pid>.<rand>": the tail of the names of this process's staging dirs and temp files
/// (here and in the tuning database), which owner_gone() reads back.
std::string owner_tag();
/// A staging dir of this host whose pid is dead is removed only once older than this: the pid
/// may be a live process of another PID namespace with the same hostname.
constexpr int64_t kDeadOwnerGraceS = 600;
/// Whether something named "...<tail>", `tail` an owner_tag() (a name without one: ""), last
/// modified `age_ns` ago, is left over: its owner on this host is dead (and it is older than
/// `dead_grace_s`), or it is older than `stale_s` whoever made it. Never this process's.
bool owner_gone(const std::string& tail, int64_t age_ns, int64_t stale_s, int64_t dead_grace_s = kDeadOwnerGraceS);
/// Nanoseconds since `path` was last modified (since 1970 when it cannot be stat'ed).
int64_t age_ns(const std::string& path);
/// Removes the temp files "<file>.tmp.<owner_tag>" that writers of `file` left when they were killed, those whose
/// owner_gone() (also "<file>.tmp.<pid>.<rand>" and "<file>.tmp.<pid>" of older writers, by age alone); returns the
/// paths removed. Best effort: what cannot be read or removed is left.
std::vector<std::string> remove_left_over_temps(const std::string& file, int64_t stale_s);
/// Removes staging dirs, and probe dirs left in entries/ (probe_publish killed before its rmdir),
/// whose owner_gone().
int clean_stale_staging(const Root& r, int64_t stale_s);

/// The name of a network or cluster filesystem type (statfs f_type: "nfs", "lustre", "fuse", ...),
/// where flock may not work or not across nodes; nullptr for a local one (or an unknown type).
const char* network_fs_type(long f_type);
/// network_fs_type() of the filesystem holding `path`; nullptr when local or when `path` does not exist;
/// "unknown (statfs failed)" when it exists but statfs fails (treated as not local).
const char* network_fs_of(const std::string& path);

/// A verified entry or why it is not one. `missing`: no such entry (a plain miss, not corrupt).
struct Loaded {
  bool ok = false;
  bool missing = false;
  bool unavailable = false;  ///< not read, for a reason outside the entry (read_file): not a verdict on it
  std::string problem;
  std::vector<uint8_t> binary;
  nlohmann::json manifest;
  dev_t dev = 0;  ///< the directory read (0 0: none was opened), for remove_entry's `only`
  ino_t ino = 0;
};
/// Checks manifest (format, recomputed key digest == `digest`), source and binary (size and
/// checksum, binary non-empty).
Loaded load_entry(const std::string& entry_dir, const std::string& digest);

/// A manifest's string field `k`, or null when it is absent or of another type (`j` need not be an object).
const std::string* string_field(const nlohmann::json& j, const char* k);
/// A key field as a manifest holds it: the string itself where it is UTF-8 (every field smla makes), else
/// {"hex": "<its bytes>"}. A JSON string holds only UTF-8, and the replacement characters the dump put in for other
/// bytes (a HIPRTC_COMPILE_OPTIONS_APPEND typed in a Latin-1 shell, in the compiler identity) no longer hashed to the
/// entry's digest: every lookup took the entry for corrupt, deleted it and compiled it again.
nlohmann::json key_text(const std::string& s);
/// The field key_text() wrote; throws std::runtime_error naming `what` for anything else.
std::string key_text_of(const nlohmann::json& v, const std::string& what);

nlohmann::json make_manifest(const KeyFields& f, const Key& k, const CompileOutput& out);

/// Stages source, binary and manifest, fsyncs them and the directory, renames into place.
/// Another process winning the rename counts as success (`*lost_race` set). `*bytes`: the size
/// of the entry this call added (0 if it lost the race). `*no_space`: it failed for want of space (ENOSPC, EDQUOT).
bool publish_entry(const Root& r, const std::string& name, const nlohmann::json& manifest,
                   const std::string& source, const std::vector<uint8_t>& binary,
                   const Settings& s, bool* lost_race, int64_t* bytes, std::string* err,
                   bool* no_space = nullptr);

struct Scanned {
  std::string name;
  int64_t bytes = 0;
  int64_t mtime_ns = 0;
};
std::vector<Scanned> scan_entries(const Root& r);
struct Evicted {
  std::vector<std::string> removed;  ///< names
  std::vector<std::string> failed;   ///< why, for each entry that could not be removed
  int64_t total = 0;                 ///< bytes of the entries left, less `pinned`
  int64_t pinned = 0;                ///< bytes of entries this user may not remove (not counted in `total`)
};
/// Evicts least recently used entries until the total is <= max_bytes, never `keep`. Entries this user may not
/// remove (write permission on the entry and on entries/, or a removal that failed) are left out of the total; an
/// entry dated more than kFutureSlackS ahead of now counts as the least recently used.
constexpr int64_t kFutureSlackS = 300;
Evicted evict(const Root& r, int64_t max_bytes, const std::string& keep);
/// The same, down to target_of(the bytes this user may remove), from the one scan.
Evicted evict_to(const Root& r, const std::function<int64_t(int64_t)>& target_of, const std::string& keep);

}  // namespace smla::cache::detail
