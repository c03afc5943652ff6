// disk_cache.cpp: DiskCache: lookup order, in-process and cross-process deduplication, degraded
// modes, LRU bound. The files themselves are handled in entry_store.cpp.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include <spdlog/spdlog.h>

#include "entry_store.hpp"
#include "kernel_cache.hpp"

namespace fs = std::filesystem;

namespace smla::cache {
using namespace detail;

namespace {

// An flock on a node-local file. The kernel drops it when the holder dies, so a rank killed
// mid-compile never blocks the others; a waiter still gives up after the timeout.
class FileLock {
 public:
  FileLock() = default;
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  ~FileLock() {
    if (fd_ >= 0) ::close(fd_);
  }
  enum Result { Acquired, TimedOut, Unavailable };
  Result acquire(const std::string& path, double timeout_s) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd_ < 0) return Unavailable;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    int sleep_ms = 2;
    for (;;) {
      if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) return Acquired;
      if (errno != EWOULDBLOCK && errno != EINTR) break;
      if (std::chrono::steady_clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
      sleep_ms = std::min(sleep_ms * 2, 50);
    }
    bool timed_out = errno == EWOULDBLOCK || errno == EINTR;
    ::close(fd_);
    fd_ = -1;
    return timed_out ? TimedOut : Unavailable;
  }

 private:
  int fd_ = -1;
};

}  // namespace

struct DiskCache::Impl {
  Root user, system;
  bool system_on = false;
  std::string lock_prefix;  // empty: no cross-process lock
  std::mutex mu;            // guards the two maps
  std::map<std::string, std::shared_ptr<std::mutex>> key_mutex;
  std::map<std::string, std::vector<uint8_t>> memory;  // binaries that could not be published
  std::atomic<int64_t> compiles{0}, disk_hits{0}, system_hits{0}, memory_hits{0},
      corrupt_replaced{0}, publish_failures{0};
  std::atomic<bool> warned_publish{false};

  std::shared_ptr<std::mutex> mutex_for(const std::string& digest) {
    std::lock_guard<std::mutex> g(mu);
    auto& m = key_mutex[digest];
    if (!m) m = std::make_shared<std::mutex>();
    return m;
  }
};

DiskCache::DiskCache(Settings s) : s_(std::move(s)), impl_(std::make_unique<Impl>()) {
  auto& I = *impl_;
  I.user.dir = s_.dir;
  if (s_.disable) {
    log().info("smla-cache: disabled (SMLA_CACHE_DISABLE); compiled kernels stay in memory");
    return;
  }
  std::error_code ec;
  if (!s_.system_dir.empty()) {
    I.system.dir = s_.system_dir;
    I.system_on = fs::is_directory(I.system.entries(), ec);
    if (!I.system_on)
      log().warn("smla-cache: system cache {} has no entries/ directory; ignoring it", s_.system_dir);
  }
  if (s_.dir.empty()) {
    log().warn("smla-cache: no cache directory; compiled kernels stay in memory");
    return;
  }
  if (!s_.readonly) {
    // Creating the tree and a scratch directory in it is the writability probe. Data writes can
    // still fail later (full disk): publish handles that.
    fs::create_directories(I.user.entries(), ec);
    std::string err;
    std::string probe = ec ? "" : make_staging(I.user, "probe", &err);
    if (!probe.empty()) {
      ::rmdir(probe.c_str());
      writable_ = true;
      clean_stale_staging(I.user, s_.stale_staging_s);
    } else {
      log().warn("smla-cache: cannot write cache directory {} ({}); using it read-only if it "
                 "exists, keeping new kernels in memory. Set SMLA_CACHE_DIR to a writable path.",
                 s_.dir, ec ? ec.message() : err);
    }
  }
  readable_ = fs::is_directory(I.user.entries(), ec);
  if (writable_ && s_.lock) {
    std::string ld = s_.lock_dir.empty() ? "/tmp/smla-locks-" + std::to_string(getuid()) : s_.lock_dir;
    fs::create_directories(ld, ec);
    if (fs::is_directory(ld, ec)) {
      // One lock namespace per cache directory: two caches on one node do not serialize.
      std::string canon = fs::weakly_canonical(s_.dir, ec).string();
      I.lock_prefix = ld + "/" + hash_hex(canon).substr(0, 8) + "-";
    } else {
      log().warn("smla-cache: cannot create lock directory {}; ranks may compile the same kernel "
                 "concurrently (harmless, slower)", ld);
    }
  }
}

DiskCache::~DiskCache() = default;

Stats DiskCache::stats() const {
  const auto& I = *impl_;
  Stats st;
  st.compiles = I.compiles;
  st.disk_hits = I.disk_hits;
  st.system_hits = I.system_hits;
  st.memory_hits = I.memory_hits;
  st.corrupt_replaced = I.corrupt_replaced;
  st.publish_failures = I.publish_failures;
  return st;
}

Fetched DiskCache::get_or_compile(const KeyFields& f, const std::function<CompileOutput()>& compile,
                                  const std::function<bool(const std::vector<uint8_t>&)>& accept) {
  auto& I = *impl_;
  const Key k = make_key(f);
  const std::string name = k.entry_name();
  // One caller per key at a time in this process; the others then find its result.
  auto km = I.mutex_for(k.digest);
  std::lock_guard<std::mutex> key_guard(*km);
  {
    std::lock_guard<std::mutex> g(I.mu);
    auto it = I.memory.find(k.digest);
    if (it != I.memory.end()) {
      ++I.memory_hits;
      return {it->second, Origin::Memory};
    }
  }

  // A verified, accepted binary from one root, or nothing. Bad entries of the user cache are
  // deleted (so never served twice); the system cache is read-only and only skipped.
  auto try_root = [&](const Root& r, bool owned, Fetched* out) {
    Loaded L = load_entry(r.entry(name), k.digest);
    if (L.missing) return false;
    const char* what = owned ? "deleting it and recompiling" : "skipping it";
    if (!L.ok) {
      log().warn("smla-cache [{}]: corrupt cache entry {}: {}; {}", k.tag, r.entry(name), L.problem, what);
    } else if (accept && !accept(L.binary)) {
      log().warn("smla-cache [{}]: the driver refused cached binary {}; {}", k.tag, r.entry(name), what);
    } else {
      if (owned && writable_) touch(r.entry(name));  // a hit refreshes LRU recency
      out->binary = std::move(L.binary);
      return true;
    }
    if (owned) {
      ++I.corrupt_replaced;
      if (writable_) remove_entry(r, name);
    }
    return false;
  };

  Fetched out;
  if (readable_ && try_root(I.user, true, &out)) {
    ++I.disk_hits;
    out.origin = Origin::Disk;
    return out;
  }
  if (I.system_on && try_root(I.system, false, &out)) {
    ++I.system_hits;
    out.origin = Origin::SystemDisk;
    return out;
  }

  FileLock xlock;
  if (!I.lock_prefix.empty()) {
    auto t0 = std::chrono::steady_clock::now();
    auto r = xlock.acquire(I.lock_prefix + k.digest + ".lock", s_.lock_timeout_s);
    if (r == FileLock::TimedOut)
      log().warn("smla-cache [{}]: waited {:.1f} s for another process compiling this kernel; "
                 "compiling here (SMLA_CACHE_LOCK_TIMEOUT_S)", k.tag,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    // Whoever held the lock has probably published by now.
    if (r == FileLock::Acquired && try_root(I.user, true, &out)) {
      ++I.disk_hits;
      out.origin = Origin::Disk;
      return out;
    }
  }

  CompileOutput c = compile();
  ++I.compiles;
  log().debug("smla-cache [{}]: compiled {} bytes", k.tag, c.binary.size());
  bool published = false;
  std::string err;
  if (writable_ && c.binary.empty()) {
    err = "the compiler returned an empty binary";
  } else if (writable_) {
    bool lost = false;
    published = publish_entry(I.user, name, make_manifest(f, k, c), f.source, c.binary, s_, &lost, &err);
    if (published && !lost && s_.max_bytes > 0) {
      for (const auto& gone : evict(I.user, s_.max_bytes, name))
        log().info("smla-cache: evicted {} (SMLA_CACHE_MAX_BYTES={})", gone, s_.max_bytes);
    }
  }
  if (!published) {
    if (writable_) {
      ++I.publish_failures;
      // Warn once: a full disk would otherwise log on every kernel.
      if (!I.warned_publish.exchange(true))
        log().warn("smla-cache [{}]: cannot publish to {} ({}); keeping compiled kernels in memory",
                   k.tag, s_.dir, err);
      else
        log().debug("smla-cache [{}]: cannot publish ({})", k.tag, err);
    }
    std::lock_guard<std::mutex> g(I.mu);
    I.memory[k.digest] = c.binary;
  }
  return {std::move(c.binary), Origin::Compiled};
}

// ---- maintenance (smla-cache) ----

std::vector<EntryInfo> DiskCache::list() const {
  std::vector<EntryInfo> v;
  int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                    std::chrono::system_clock::now().time_since_epoch()).count();
  for (const auto& s : scan_entries(impl_->user)) {
    EntryInfo e;
    e.name = s.name;
    e.bytes = s.bytes;
    e.age_s = (now - s.mtime_ns) / 1000000000;
    std::vector<uint8_t> m;
    std::string err;
    if (read_file(impl_->user.entry(s.name) + "/" + kManifest, &m, &err)) {
      auto j = nlohmann::json::parse(m.begin(), m.end(), nullptr, false);
      if (j.is_object()) {
        e.tag = j.value("tag", "");
        e.target = j.value("target", "");
        e.compiler_id = j.value("compiler_id", "");
      }
    }
    v.push_back(std::move(e));
  }
  std::sort(v.begin(), v.end(), [](const EntryInfo& a, const EntryInfo& b) { return a.name < b.name; });
  return v;
}

std::vector<EntryInfo> DiskCache::verify() const {
  std::vector<EntryInfo> v = list();
  for (auto& e : v) {
    std::string digest;
    if (!valid_entry_name(e.name, &digest)) {
      e.problem = "not a cache entry name";
      continue;
    }
    Loaded L = load_entry(impl_->user.entry(e.name), digest);
    e.ok = L.ok;
    e.problem = L.ok ? "" : L.problem;
  }
  return v;
}

BulkResult DiskCache::prune(int64_t max_bytes) {
  BulkResult r;
  if (!writable_) {
    r.error = "cache directory " + s_.dir + " is not writable";
    return r;
  }
  clean_stale_staging(impl_->user, s_.stale_staging_s);
  r.done = int64_t(evict(impl_->user, max_bytes, "").size());
  return r;
}

BulkResult DiskCache::clear() {
  BulkResult r;
  if (!writable_) {
    r.error = "cache directory " + s_.dir + " is not writable";
    return r;
  }
  for (const auto& s : scan_entries(impl_->user)) {
    remove_entry(impl_->user, s.name);
    ++r.done;
  }
  clean_stale_staging(impl_->user, s_.stale_staging_s);
  return r;
}

}  // namespace smla::cache
