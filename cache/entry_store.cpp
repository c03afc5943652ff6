// entry_store.cpp: files, staging, publishing, verification and eviction of one cache root.
#include "entry_store.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <thread>

#include "logger.hpp"

namespace fs = std::filesystem;

namespace smla::cache::detail {

spdlog::logger& log() { return logger(); }

namespace {

std::string errno_text(int e) { return std::strerror(e); }

int64_t realtime_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

int64_t mtime_ns(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 0;
  return int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

}  // namespace

bool is_symlink(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
}

std::string linked_subdir(const Root& r) {
  for (const std::string& d : {r.entries(), r.staging()})
    if (is_symlink(d)) {
      std::error_code ec;
      return d + " is a symbolic link (to " + fs::read_symlink(d, ec).string() +
             "): smla neither writes nor deletes through it; link the whole cache directory instead";
    }
  return "";
}

bool make_dir_like_root(const std::string& dir, const std::string& root) {
  std::error_code ec;
  fs::create_directories(root, ec);  // the root itself: the umask decides, as for any directory of one's own
  if (::mkdir(dir.c_str(), 0777) != 0) return false;
  struct stat st {};
  if (::stat(root.c_str(), &st) == 0) ::chmod(dir.c_str(), st.st_mode & 07777);
  return true;
}

namespace {

std::string random_hex() {
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  uint64_t v = (uint64_t(rd()) << 32) ^ rd() ^ uint64_t(realtime_ns()) ^ (counter++ << 48);
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)v);
  return buf;
}

// Fields of a manifest read defensively: a wrong type is a corrupt entry (thrown here, caught by load_entry), not
// json's type_error.
std::string str(const nlohmann::json& j, const char* k) {
  const std::string* v = string_field(j, k);
  if (!v) throw std::runtime_error(std::string("field ") + k);
  return *v;
}
// A key field (key_text's form).
std::string key_str(const nlohmann::json& j, const char* k) {
  const auto it = j.find(k);
  if (it == j.end()) throw std::runtime_error(std::string("field ") + k);
  return key_text_of(*it, std::string("field ") + k);
}
int64_t num(const nlohmann::json& j, const char* k) {
  auto it = j.find(k);
  if (it == j.end() || !it->is_number_integer()) throw std::runtime_error(std::string("field ") + k);
  return it->get<int64_t>();
}

}  // namespace

nlohmann::json key_text(const std::string& s) {
  try {
    (void)nlohmann::json(s).dump();  // strict: throws on bytes that are not UTF-8
    return s;
  } catch (const nlohmann::json::type_error&) {
    return nlohmann::json{{"hex", to_hex(s.data(), s.size())}};
  }
}

std::string key_text_of(const nlohmann::json& v, const std::string& what) {
  if (v.is_string()) return v.get<std::string>();
  const auto it = v.is_object() && v.size() == 1 ? v.find("hex") : v.end();
  if (it == v.end() || !it->is_string() || it->get_ref<const std::string&>().size() % 2)
    throw std::runtime_error(what);
  const std::string& hex = it->get_ref<const std::string&>();
  auto nibble = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    throw std::runtime_error(what);
  };
  std::string out;
  for (size_t i = 0; i < hex.size(); i += 2) out += char(nibble(hex[i]) << 4 | nibble(hex[i + 1]));
  return out;
}

const std::string* string_field(const nlohmann::json& j, const char* k) {
  const auto it = j.find(k);
  return it != j.end() && it->is_string() ? &it->get_ref<const std::string&>() : nullptr;
}

bool within_file_size_limit(uint64_t bytes, const std::string& path, std::string* err) {
  rlimit lim{};
  if (::getrlimit(RLIMIT_FSIZE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY || bytes <= uint64_t(lim.rlim_cur))
    return true;
  if (err)
    *err = "cannot write " + path + ": its " + std::to_string(bytes) + " bytes exceed this process's file size limit of " +
           std::to_string(uint64_t(lim.rlim_cur)) + " bytes (ulimit -f)";
  return false;
}

bool write_file(const std::string& path, const void* data, size_t n, bool inject_failure,
                std::string* err, int* err_no) {
  if (!within_file_size_limit(n, path, err)) {
    if (err_no) *err_no = EFBIG;
    return false;
  }
  // 0666 and the umask decide: under umask 002 a group cache stays writable by the group, so
  // another member can replace or evict this entry.
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) {
    if (err_no) *err_no = errno;
    *err = "cannot create " + path + ": " + errno_text(errno);
    return false;
  }
  const char* p = static_cast<const char*>(data);
  size_t left = n;
  int e = 0;
  if (inject_failure) e = ENOSPC;  // test hook: behave like a full filesystem
  while (!e && left > 0) {
    ssize_t w = ::write(fd, p, left);
    if (w < 0) {
      if (errno == EINTR) continue;
      e = errno;
    } else {
      p += w;
      left -= size_t(w);
    }
  }
  if (!e && ::fsync(fd) != 0) e = errno;
  if (::close(fd) != 0 && !e) e = errno;
  if (e) *err = "cannot write " + path + ": " + errno_text(e);
  if (e && err_no) *err_no = e;
  return e == 0;
}

bool read_file(const std::string& path, std::vector<uint8_t>* out, std::string* err,
               bool* missing, bool* unavailable) {
  return read_file_at(AT_FDCWD, path, path, out, err, missing, unavailable);
}

bool read_file_at(int dirfd, const std::string& name, const std::string& path, std::vector<uint8_t>* out,
                  std::string* err, bool* missing, bool* unavailable) {
  if (missing) *missing = false;
  if (unavailable) *unavailable = false;
  out->clear();
  // What the path itself is wrong with (absent, a symlink, not a file) is a verdict on the entry; any other failure
  // (EMFILE, ENFILE, ENOMEM, EIO, ESTALE, EACCES, ...) is this process's or the file system's, not the entry's.
  auto outside = [&](int e) {
    if (unavailable) *unavailable = !(e == ENOENT || e == ELOOP || e == EISDIR || e == ENOTDIR || e == ENXIO);
  };
  int fd = ::openat(dirfd, name.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    const int e = errno;
    if (missing) *missing = e == ENOENT;
    outside(e);
    *err = "cannot open " + path + ": " + errno_text(e);
    return false;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    outside(e);
    *err = "cannot stat " + path + ": " + errno_text(e);
    ::close(fd);
    return false;
  }
  if (!S_ISREG(st.st_mode)) {  // a FIFO would block the lookup (and its key's mutex) for good; a device never ends
    *err = path + " is not a regular file";
    ::close(fd);
    return false;
  }
  if (st.st_size > 0) out->reserve(size_t(st.st_size));
  char buf[1 << 16];
  for (;;) {
    ssize_t r = ::read(fd, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int e = errno;
      outside(e);
      *err = "cannot read " + path + ": " + errno_text(e);
      ::close(fd);
      return false;
    }
    if (r == 0) break;
    out->insert(out->end(), buf, buf + r);
  }
  ::close(fd);
  return true;
}

bool fsync_dir(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return false;
  bool ok = ::fsync(fd) == 0;
  ::close(fd);
  return ok;
}

void touch(const std::string& path) {
  // Explicit, strictly increasing stamps: the filesystem's own clock can be coarser than the
  // gap between two hits, which would make LRU order ambiguous.
  static std::atomic<int64_t> last{0};
  int64_t now = realtime_ns(), prev = last.load();
  int64_t v;
  do {
    v = std::max(now, prev + 1);
  } while (!last.compare_exchange_weak(prev, v));
  timespec ts[2];
  ts[0].tv_sec = ts[1].tv_sec = v / 1000000000;
  ts[0].tv_nsec = ts[1].tv_nsec = v % 1000000000;
  if (::utimensat(AT_FDCWD, path.c_str(), ts, 0) == 0) return;
  // Explicit stamps need ownership; "now" needs only write access: another group member's entry
  // in a shared cache is still refreshed. Best effort: a read-only cache keeps old stamps.
  if (errno == EPERM) ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);
}

std::string make_staging(const Root& r, const char* kind, std::string* err, int* err_no) {
  make_dir_like_root(r.staging(), r.dir);
  std::string p = r.staging() + "/" + kind + "." + owner_tag();
  if (::mkdir(p.c_str(), 0777) != 0) {  // the umask decides, as for files (write_file)
    if (err_no) *err_no = errno;
    *err = "cannot create " + p + ": " + errno_text(errno);
    return "";
  }
  return p;
}

bool probe_publish(const Root& r, std::string* err) {
  std::string probe = make_staging(r, "probe", err);
  if (probe.empty()) return false;
  // A dot name: scans of entries/ skip it, should we die before the rmdir.
  std::string in = r.entries() + "/." + fs::path(probe).filename().string();
  if (::rename(probe.c_str(), in.c_str()) == 0) {
    ::rmdir(in.c_str());
    return true;
  }
  int e = errno;
  ::rmdir(probe.c_str());
  if (e == EXDEV) {
    std::error_code ec;
    *err = "entries/ (" + fs::canonical(r.entries(), ec).string() + ") and .staging/ (" +
           fs::canonical(r.staging(), ec).string() +
           ") are on different filesystems: no entry can be renamed into place (" + errno_text(e) +
           "); link the whole cache directory elsewhere, not entries/";
  } else {
    *err = "cannot rename " + probe + " into " + r.entries() + ": " + errno_text(e);
  }
  return false;
}

std::string dangling_symlink(const std::string& path) {
  for (fs::path p(path); !p.empty(); p = p.parent_path()) {
    struct stat st {};
    if (::lstat(p.c_str(), &st) == 0 && S_ISLNK(st.st_mode) && ::stat(p.c_str(), &st) != 0) {
      std::error_code ec;
      return p.string() + " is a dangling symlink to " + fs::read_symlink(p, ec).string();
    }
    if (p == p.root_path()) break;
  }
  return "";
}

bool remove_entry(const Root& r, const std::string& name, std::string* err, bool* was_gone, const Loaded* only) {
  if (was_gone) *was_gone = false;
  // Through a link a group member planted (entries/ or .staging/ to a directory of the caller's own), a removal would
  // delete outside the cache.
  if (std::string why = linked_subdir(r); !why.empty()) {
    *err = "cannot remove " + r.entry(name) + ": " + why;
    return false;
  }
  std::string from = r.entry(name);
  std::string to = r.staging() + "/trash." + owner_tag();
  std::error_code ec;
  make_dir_like_root(r.staging(), r.dir);
  if (::rename(from.c_str(), to.c_str()) == 0) {
    // Only the directory judged bad: one published in its place since it was read (a good entry) goes back, unless
    // yet another took the name meanwhile (then this copy is one too many). The judged one is gone either way.
    struct stat st {};
    if (only && only->ino && ::lstat(to.c_str(), &st) == 0 && (st.st_ino != only->ino || st.st_dev != only->dev) &&
        ::rename(to.c_str(), from.c_str()) == 0)
      return true;
    fs::remove_all(to, ec);  // out of entries/ already; leftovers are stale staging
    return true;
  }
  int e = errno;
  if (e == ENOENT) {  // someone else removed it
    if (was_gone) *was_gone = true;
    return true;
  }
  fs::remove_all(from, ec);  // cannot move it aside: delete in place
  std::error_code xec;
  if (!fs::exists(from, xec)) return true;
  // Typically another user's entry in a shared cache created without group write permission.
  *err = "cannot remove " + from + ": " + (ec ? ec.message() : errno_text(e));
  return false;
}

const std::string& host_name() {
  static const std::string h = [] {
    char buf[256] = {};
    if (gethostname(buf, sizeof buf - 1) != 0 || !buf[0]) return std::string("host");
    std::string s(buf);
    for (char& c : s)
      if (c == '/' || c == ' ') c = '_';
    return s;
  }();
  return h;
}

std::string owner_tag() { return host_name() + "." + std::to_string(getpid()) + "." + random_hex(); }

bool owner_gone(const std::string& tail, int64_t age_ns, int64_t stale_s, int64_t dead_grace_s) {
  // (no stale_s x 1e9: it overflowed past ~292 years). A date as far ahead of now, and more than kFutureSlackS, is a
  // clock that ran ahead (a skewed node's, or a file server's): stale too, else it would never age here; a peer whose
  // clock is a minute ahead is still publishing.
  const int64_t age_s = age_ns / 1000000000LL;
  bool stale = age_ns >= 0 ? age_ns > 0 && age_s >= stale_s : -age_s >= std::max(stale_s, kFutureSlackS);
  // <host>.<pid>.<rand>; the host may itself contain dots.
  size_t d2 = tail.rfind('.');
  size_t d1 = d2 == std::string::npos || d2 == 0 ? std::string::npos : tail.rfind('.', d2 - 1);
  if (d1 == std::string::npos || d1 == 0) return stale;  // no owner to ask: its age alone
  std::string host = tail.substr(0, d1);
  std::string pid_s = tail.substr(d1 + 1, d2 - d1 - 1);
  char* end = nullptr;
  long pid = std::strtol(pid_s.c_str(), &end, 10);
  if (pid_s.empty() || *end || host != host_name() || pid <= 0) return stale;
  if (pid == getpid()) return false;  // ours, maybe in flight on another thread
  // A dead pid alone is no proof: a container in another PID namespace can share the hostname
  // and be publishing right now. An age is, since a publish takes well under a second. (A lock
  // held by the publisher would need flock, unreliable on the network filesystems shared caches
  // live on.)
  return stale || (age_ns > dead_grace_s * 1000000000LL && ::kill(pid_t(pid), 0) != 0 &&
                   errno == ESRCH);
}

int64_t age_ns(const std::string& path) { return realtime_ns() - mtime_ns(path); }

std::vector<std::string> remove_left_over_temps(const std::string& file, int64_t stale_s) {
  const size_t slash = file.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : file.substr(0, slash);
  const std::string prefix = (slash == std::string::npos ? file : file.substr(slash + 1)) + ".tmp.";
  std::vector<std::string> gone, removed;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name.compare(0, prefix.size(), prefix) != 0) continue;
      const std::string path = dir + "/" + name;
      if (owner_gone(name.substr(prefix.size()), age_ns(path), stale_s)) gone.push_back(path);
    }
    ::closedir(d);
  }
  for (const auto& path : gone)
    if (::unlink(path.c_str()) == 0) removed.push_back(path);
  return removed;
}

int clean_stale_staging(const Root& r, int64_t stale_s) {
  std::error_code ec;
  int removed = 0;
  // Nothing through a link (a group member's .staging -> a directory of the caller's would have its old files
  // deleted), and only the names smla makes there.
  if (!linked_subdir(r).empty()) return 0;
  for (fs::directory_iterator it(r.staging(), ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    std::string path = it->path().string();
    // <kind>.<host>.<pid>.<rand>
    size_t d = name.find('.');
    const std::string kind = name.substr(0, d == std::string::npos ? 0 : d);
    if (kind != "probe" && kind != "stage" && kind != "trash") continue;
    if (!owner_gone(d == std::string::npos ? "" : name.substr(d + 1), age_ns(path), stale_s)) continue;
    std::error_code rec;
    fs::remove_all(path, rec);
    if (!rec) ++removed;
  }
  // The writability probe renames its staging dir to entries/.probe.<owner> and removes it: a
  // kill in between left it there (empty, skipped by every scan) for ever.
  const std::string probe = ".probe.";
  std::error_code pec;
  for (fs::directory_iterator it(r.entries(), pec), end; !pec && it != end; it.increment(pec)) {
    std::string name = it->path().filename().string();
    std::string path = it->path().string();
    if (name.compare(0, probe.size(), probe) != 0) continue;
    if (owner_gone(name.substr(probe.size()), age_ns(path), stale_s) && ::rmdir(path.c_str()) == 0)
      ++removed;
  }
  return removed;
}

const char* network_fs_type(long f_type) {
  // Magic numbers from <linux/magic.h> and the filesystems' own sources.
  switch (static_cast<uint32_t>(f_type)) {
    case 0x6969: return "nfs";
    case 0x517B: return "smb";
    case 0xFE534D42: return "smb2";
    case 0xFF534D42: return "cifs";
    case 0x564C: return "ncp";
    case 0x5346414F: return "afs";
    case 0x6B414653: return "kafs";
    case 0x73757245: return "coda";
    case 0x01021997: return "9p";
    case 0x00C36400: return "ceph";
    case 0x0BD00BD0: return "lustre";
    case 0x47504653: return "gpfs";
    case 0x19830326: return "beegfs";
    case 0xAAD7AAEA: return "panfs";
    case 0x13661366: return "orangefs";
    case 0x01161970: return "gfs2";
    case 0x7461636F: return "ocfs2";
    case 0x65735546: return "fuse";  // sshfs, gcsfuse, glusterfs, ...: cannot tell, assume remote
    default: return nullptr;
  }
}

const char* network_fs_of(const std::string& path) {
  struct statfs sf {};
  // A filesystem that cannot say what it is (EIO on a soft NFS mount) is not trusted with locks either.
  if (::statfs(path.c_str(), &sf) != 0) return ::access(path.c_str(), F_OK) == 0 ? "unknown (statfs failed)" : nullptr;
  return network_fs_type(long(sf.f_type));
}

Loaded load_entry(const std::string& dir, const std::string& digest) {
  Loaded L;
  // The files are read through the directory opened once: read by path, a manifest not found because the entry was
  // not published yet (or was just evicted) and a directory found there a moment later (another process's publish)
  // read as a directory without a manifest, "corrupt", and the good entry was deleted. The name's own identity (a
  // symlinked entry's link: a system cache may be a forest of them) is what remove_entry(only) compares.
  struct stat name_st {};
  const bool named = ::lstat(dir.c_str(), &name_st) == 0;
  if (named) L.dev = name_st.st_dev, L.ino = name_st.st_ino;
  // O_PATH: search permission on the entry is enough, as for reads by path (O_RDONLY needed read permission too).
  const int dfd = ::open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) {
    const int e = errno;
    // No entry is a miss; a link to nothing is damage (as a miss, a publish could never rename over it).
    const bool dangling = e == ENOENT && named && S_ISLNK(name_st.st_mode);
    L.missing = e == ENOENT && !dangling;
    L.unavailable = !(e == ENOENT || e == ELOOP || e == ENOTDIR);  // (a file is a verdict on the entry)
    L.problem = L.missing ? "missing" : dangling ? "a symbolic link to nothing" : "cannot open " + dir + ": " + errno_text(e);
    return L;
  }
  struct DirFd {
    int fd;
    ~DirFd() { ::close(fd); }
  } dir_fd{dfd};
  struct stat dst {};
  const bool have_dst = ::fstat(dfd, &dst) == 0;
  // A file of the opened directory that cannot be read (not there, or ESTALE on a network file system) while the
  // name no longer leads to that directory: removed since (an eviction, a clear, elsewhere) or replaced by a newer
  // publish, a miss; still the one at `dir`, it was never published whole (or the failure is the reader's own).
  auto gone = [&] {
    struct stat now {};
    return !have_dst || ::stat(dir.c_str(), &now) != 0 || now.st_ino != dst.st_ino || now.st_dev != dst.st_dev;
  };
  auto read = [&](const char* file, std::vector<uint8_t>* out, std::string* err, const char* what) {
    bool missing = false;
    if (read_file_at(dfd, file, dir + "/" + file, out, err, &missing, &L.unavailable)) return true;
    if (gone()) {
      L.missing = true, L.unavailable = false;
      L.problem = "missing";
    } else {
      L.problem = std::string("unreadable ") + what + " (" + *err + ")";
    }
    return false;
  };
  std::vector<uint8_t> bytes;
  std::string err;
  if (!read(kManifest, &bytes, &err, "manifest")) return L;
  try {
    auto j = nlohmann::json::parse(bytes.begin(), bytes.end(), nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      L.problem = bytes.empty() ? "empty manifest" : "manifest is not valid JSON";
      return L;
    }
    if (num(j, "format") != kFormatVersion) {
      L.problem = "cache format " + std::to_string(num(j, "format")) + ", expected " +
                  std::to_string(kFormatVersion);
      return L;
    }
    std::vector<std::pair<std::string, std::string>> hh;
    for (const auto& h : j.at("headers"))
      hh.emplace_back(key_text_of(h.at(0), "a header's name"), h.at(1).get<std::string>());
    std::vector<std::string> opts;
    for (const auto& o : j.at("options")) opts.push_back(key_text_of(o, "an option"));
    std::string d = digest_of(key_str(j, "kernel"), key_str(j, "shape_tag"), str(j, "source_xxh3"), hh,
                              opts, key_str(j, "target"), key_str(j, "compiler_id"));
    if (d != str(j, "digest")) {
      L.problem = "manifest fields do not hash to its digest";
      return L;
    }
    if (d != digest) {
      L.problem = "wrong key: entry holds " + d + ", expected " + digest;
      return L;
    }
    std::vector<uint8_t> src;
    if (!read(kSource, &src, &err, "source")) return L;
    if (int64_t(src.size()) != num(j, "source_bytes") || hash_hex(src.data(), src.size()) != str(j, "source_xxh3")) {
      L.problem = "source does not match its manifest";
      return L;
    }
    if (!read(kBinary, &L.binary, &err, "binary")) return L;
    int64_t want = num(j, "binary_bytes");
    if (L.binary.empty() || int64_t(L.binary.size()) != want) {
      L.problem = "binary has " + std::to_string(L.binary.size()) + " bytes, manifest says " +
                  std::to_string(want) + " (truncated or zero-length)";
      return L;
    }
    if (hash_hex(L.binary.data(), L.binary.size()) != str(j, "binary_xxh3")) {
      L.problem = "binary checksum mismatch";
      return L;
    }
    L.manifest = std::move(j);
    L.ok = true;
  } catch (const std::exception& e) {
    L.problem = std::string("malformed manifest (") + e.what() + ")";
  }
  if (!L.ok) L.binary.clear();
  return L;
}

nlohmann::json make_manifest(const KeyFields& f, const Key& k, const CompileOutput& out) {
  std::vector<std::string> opts = f.options;
  std::sort(opts.begin(), opts.end());
  std::vector<std::pair<std::string, std::string>> hh;
  for (const auto& h : f.headers) hh.emplace_back(h.first, hash_hex(h.second));
  std::sort(hh.begin(), hh.end());
  nlohmann::json j;
  j["format"] = kFormatVersion;
  j["digest"] = k.digest;
  j["tag"] = k.tag;
  j["kernel"] = key_text(f.kernel);
  j["shape_tag"] = key_text(f.shape_tag);
  j["target"] = key_text(f.target);
  j["compiler_id"] = key_text(f.compiler_id);
  j["options"] = nlohmann::json::array();
  for (const std::string& o : opts) j["options"].push_back(key_text(o));
  j["headers"] = nlohmann::json::array();
  for (const auto& [name, xxh3] : hh) j["headers"].push_back(nlohmann::json::array({key_text(name), xxh3}));
  j["source_bytes"] = int64_t(f.source.size());
  j["source_xxh3"] = hash_hex(f.source);
  j["binary_bytes"] = int64_t(out.binary.size());
  j["binary_xxh3"] = hash_hex(out.binary.data(), out.binary.size());
  j["created_unix"] = int64_t(realtime_ns() / 1000000000);
  j["log"] = out.log.size() > (1 << 20) ? out.log.substr(0, 1 << 20) : out.log;
  return j;
}

bool publish_entry(const Root& r, const std::string& name, const nlohmann::json& manifest,
                   const std::string& source, const std::vector<uint8_t>& binary,
                   const Settings& s, bool* lost_race, int64_t* bytes, std::string* err, bool* no_space) {
  *lost_race = false;
  *bytes = 0;
  int e_no = 0;  // the failure's errno, for *no_space
  if (no_space) *no_space = false;
  auto fail = [&](const std::string& stage) {
    std::error_code ec;
    if (!stage.empty()) fs::remove_all(stage, ec);
    if (no_space) *no_space = e_no == ENOSPC || e_no == EDQUOT;
    return false;
  };
  std::string stage = make_staging(r, "stage", err, &e_no);
  if (stage.empty()) return fail(stage);
  // Compiler logs may hold bytes that are not UTF-8: replace them rather than throw.
  std::string m = manifest.dump(1, ' ', false, nlohmann::json::error_handler_t::replace);
  // Test hook: a file system of test_capacity_bytes that this cache's entries alone fill.
  bool full = s.test_fail_writes;
  if (s.test_capacity_bytes > 0) {
    int64_t used = 0;
    for (const auto& e : scan_entries(r)) used += e.bytes;
    full = full || used + int64_t(source.size() + binary.size() + m.size()) > s.test_capacity_bytes;
  }
  if (!write_file(stage + "/" + kSource, source.data(), source.size(), full, err, &e_no) ||
      !write_file(stage + "/" + kBinary, binary.data(), binary.size(), full, err, &e_no))
    return fail(stage);
  if (s.test_publish_delay_ms > 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(s.test_publish_delay_ms));
  // The manifest goes last: a staged dir without one is visibly incomplete.
  if (!write_file(stage + "/" + kManifest, m.data(), m.size(), full, err, &e_no)) return fail(stage);
  fsync_dir(stage);
  std::error_code ec;
  fs::create_directories(r.entries(), ec);
  std::string dst = r.entry(name);
  auto placed = [&] {
    fsync_dir(r.entries());
    touch(dst);
    *bytes = int64_t(source.size() + binary.size() + m.size());  // as scan_entries counts it
    return true;
  };
  if (::rename(stage.c_str(), dst.c_str()) == 0) return placed();
  e_no = errno;
  if (e_no == EEXIST || e_no == ENOTEMPTY || e_no == ENOTDIR) {
    // Something holds the name: another process's publish of the same key (success: its entry is as good as this
    // one), or a bad entry (a copy in progress, a file), which went unnoticed until a load deleted it. A bad one is
    // removed, that directory only, and the rename tried once more.
    std::string digest;
    valid_entry_name(name, &digest);
    const Loaded there = load_entry(dst, digest);
    // Good, or not to be judged from here (unreadable for a reason outside it): another process's publish.
    bool lost = there.ok || there.unavailable;
    if (!lost) {
      std::string rm_err;
      if (!there.missing && !remove_entry(r, name, &rm_err, nullptr, &there)) {
        *err = "a bad entry holds " + dst + " and " + rm_err;
        return fail(stage);
      }
      if (::rename(stage.c_str(), dst.c_str()) == 0) return placed();
      e_no = errno;
      lost = e_no == EEXIST || e_no == ENOTEMPTY;  // another publish took the name in between
    }
    if (lost) {
      *lost_race = true;  // another process published the same key first: that is success
      fail(stage);
      return true;
    }
  }
  *err = "cannot rename " + stage + " to " + dst + ": " + errno_text(e_no);
  return fail(stage);
}

std::vector<Scanned> scan_entries(const Root& r) {
  std::vector<Scanned> v;
  std::error_code ec;
  for (fs::directory_iterator it(r.entries(), ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (name.empty() || name[0] == '.') continue;
    Scanned s;
    s.name = name;
    s.mtime_ns = mtime_ns(it->path().string());
    std::error_code fec;
    for (fs::directory_iterator f(it->path(), fec), fend; !fec && f != fend; f.increment(fec)) {
      std::error_code sec;
      auto n = fs::file_size(f->path(), sec);
      if (!sec) s.bytes += int64_t(n);
    }
    v.push_back(std::move(s));
  }
  return v;
}

Evicted evict(const Root& r, int64_t max_bytes, const std::string& keep) {
  return evict_to(r, [max_bytes](int64_t) { return max_bytes; }, keep);
}

Evicted evict_to(const Root& r, const std::function<int64_t(int64_t)>& target_of, const std::string& keep) {
  Evicted ev;
  if (std::string why = linked_subdir(r); !why.empty()) {
    ev.failed.push_back("no eviction: " + why);
    return ev;
  }
  std::vector<Scanned> v = scan_entries(r);
  // With the sticky bit on entries/ only an entry's owner (or the directory's) may move it: write permission on both
  // is not enough (the rename failed with EPERM, and the removal in place then emptied the other member's entry
  // without removing it).
  struct stat dst {};
  const bool sticky = ::stat(r.entries().c_str(), &dst) == 0 && (dst.st_mode & S_ISVTX) && dst.st_uid != ::geteuid();
  auto mine_to_remove = [&](const std::string& name) {
    if (!valid_entry_name(name)) return false;  // not an entry smla made: never evicted (verify names it)
    if (::faccessat(AT_FDCWD, r.entry(name).c_str(), W_OK, AT_EACCESS) != 0) return false;
    struct stat est {};
    return !sticky || (::stat(r.entry(name).c_str(), &est) == 0 && est.st_uid == ::geteuid());
  };
  // An entry this process may not remove (another member's made without group write, root's: moving a directory
  // aside takes write permission on it and on entries/) is left out of the bound, which can only be kept over what
  // this process may remove: counted, every removable entry would go at every publish while the others' alone
  // exceeded the bound, the cache as good as off for this user.
  const bool dir_writable = ::faccessat(AT_FDCWD, r.entries().c_str(), W_OK, AT_EACCESS) == 0;
  std::vector<Scanned> mine;
  std::vector<std::string> pinned;
  auto vanished = [&](const std::string& name) {
    struct stat st {};
    return ::lstat(r.entry(name).c_str(), &st) != 0 && errno == ENOENT;
  };
  for (auto& s : v) {
    if (s.name == keep || (dir_writable && mine_to_remove(s.name))) {
      ev.total += s.bytes;
      mine.push_back(std::move(s));
    } else if (!valid_entry_name(s.name)) {
      ev.pinned += s.bytes;  // not smla's: never evicted (verify names it), and no failure of this eviction's
    } else if (!vanished(s.name)) {  // (one another process removed since the scan is nothing to keep or report)
      ev.pinned += s.bytes;
      pinned.push_back(s.name);
    }
  }
  v = std::move(mine);
  const int64_t max_bytes = target_of(ev.total);
  // Recency by mtime, which each client stamps with its own clock: one dated past now + kFutureSlackS ran ahead (a
  // node's skewed clock), and would otherwise stay the most recent for ever; it sorts as the oldest instead.
  const int64_t future = realtime_ns() + kFutureSlackS * 1000000000LL;
  auto recency = [future](const Scanned& s) { return s.mtime_ns > future ? std::numeric_limits<int64_t>::min() : s.mtime_ns; };
  std::sort(v.begin(), v.end(), [&](const Scanned& a, const Scanned& b) {
    return recency(a) != recency(b) ? recency(a) < recency(b) : a.name < b.name;
  });
  for (const auto& s : v) {
    if (ev.total <= max_bytes) break;
    if (s.name == keep) continue;
    std::string err;
    bool was_gone = false;
    if (!remove_entry(r, s.name, &err, &was_gone)) {
      ev.failed.push_back(err);
      ev.total -= s.bytes;  // (as the entries it knew it could not remove)
      ev.pinned += s.bytes;
      continue;
    }
    ev.total -= s.bytes;
    if (!was_gone) ev.removed.push_back(s.name);  // (one another process removed first is not this one's eviction)
  }
  // Said only where they keep the directory over the bound (a prune to 0 names each).
  if (ev.total + ev.pinned > max_bytes)
    for (const auto& n : pinned)
      if (!vanished(n)) ev.failed.push_back("cannot remove " + r.entry(n) + ": not writable by this user");
  return ev;
}

}  // namespace smla::cache::detail
