// bundle.cpp: export/import of cache entries as one file, to seed another machine or a shared
// system cache. Format (little-endian):
//   "SMLACB01"  then per entry: u32 name_len, name, u32 n_files, n_files x (u32 len, file name,
//   u64 size, bytes)  and finally u32 0.
// The bundle carries no trust: import re-verifies every entry exactly as a load would.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "entry_store.hpp"
#include "kernel_cache.hpp"

namespace fs = std::filesystem;

namespace smla::cache {
using namespace detail;

namespace {

constexpr char kMagic[8] = {'S', 'M', 'L', 'A', 'C', 'B', '0', '1'};
constexpr uint64_t kMaxFile = uint64_t(1) << 31;  // sanity bound against garbage sizes

template <class T>
void put(std::ostream& o, T v) {
  unsigned char b[sizeof(T)];
  for (size_t i = 0; i < sizeof(T); ++i) b[i] = (unsigned char)(uint64_t(v) >> (8 * i));
  o.write(reinterpret_cast<const char*>(b), sizeof b);
}
template <class T>
bool get(std::istream& in, T* v) {
  unsigned char b[sizeof(T)];
  if (!in.read(reinterpret_cast<char*>(b), sizeof b)) return false;
  uint64_t x = 0;
  for (size_t i = 0; i < sizeof(T); ++i) x |= uint64_t(b[i]) << (8 * i);
  *v = T(x);
  return true;
}
// `n` bytes, refused past the end of the stream (sized at `total` bytes) before anything is allocated: a garbage size
// in a damaged bundle allocated up to 2 GiB, and where that failed, the import ended in std::bad_alloc.
bool get_bytes(std::istream& in, uint64_t n, std::string* s, uint64_t total) {
  const std::streamoff at = in.tellg();
  if (at < 0 || uint64_t(at) > total || n > total - uint64_t(at)) return false;
  s->resize(size_t(n));
  return n == 0 || bool(in.read(&(*s)[0], std::streamsize(n)));
}

}  // namespace

BulkResult DiskCache::export_bundle(const std::string& file_named) const {
  BulkResult r;
  // The file replaced is the one a symbolic link names (the link stays); what is there and not a regular file (a
  // device, a FIFO, a directory) is refused: the rename below replaced /dev/null itself, run as root.
  std::string file = file_named;
  {
    struct stat st {};
    if (::lstat(file.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
      char* real = ::realpath(file.c_str(), nullptr);
      if (!real) {
        r.error = file + " is a symbolic link to nothing (" + std::strerror(errno) + "): name the bundle's file itself";
        r.refused = true;
        return r;
      }
      file = real;
      std::free(real);
    }
    if (::stat(file.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
      r.error = file_named + " is " + (S_ISDIR(st.st_mode) ? "a directory" : "not a regular file") +
                ": not replaced by the bundle";
      r.refused = true;
      return r;
    }
  }
  // A temp file of this process beside `file`, flushed to disk before it is renamed into place, so that `file` is
  // the old bundle or the whole new one; on any failure it is removed and nothing counts as exported. (It was
  // "<file>.partial", shared by two exports to one name, never fsynced, and left behind when the rename failed, with
  // "exported: N entries" printed.)
  const std::string tmp = file + ".tmp." + owner_tag();
  // An export killed before its rename left a full-size temp file that nothing removed: those whose writer is gone.
  remove_left_over_temps(file, s_.stale_staging_s);
  auto fail = [&](const std::string& why) {
    std::remove(tmp.c_str());
    r.error = why;
    r.done = 0;
    return r;
  };
  {
    std::ofstream o(tmp, std::ios::binary | std::ios::trunc);
    if (!o) return fail("cannot create " + tmp + ": " + std::strerror(errno));
    o.write(kMagic, sizeof kMagic);
    uint64_t size = sizeof kMagic + sizeof(uint32_t);  // the magic and the closing 0
    for (const auto& e : verify()) {
      if (!e.ok) {
        r.rejected.push_back(e.name + ": " + e.problem);
        continue;
      }
      // Read before anything of the entry is written: one removed since verify() (a prune elsewhere) is rejected,
      // not exported with empty files.
      const char* files[] = {kManifest, kBinary, kSource};
      std::vector<uint8_t> bytes[3];
      std::string err;
      bool read_ok = true;
      for (int i = 0; i < 3 && read_ok; ++i)
        read_ok = read_file(Root{s_.dir}.entry(e.name) + "/" + files[i], &bytes[i], &err);
      if (!read_ok) {
        std::error_code ec;
        if (!fs::exists(Root{s_.dir}.entry(e.name), ec) && !ec) continue;  // removed since verify(): nothing to export
        r.rejected.push_back(e.name + ": " + err);
        continue;
      }
      size += sizeof(uint32_t) + e.name.size() + sizeof(uint32_t);
      for (int i = 0; i < 3; ++i) size += sizeof(uint32_t) + std::strlen(files[i]) + sizeof(uint64_t) + bytes[i].size();
      // Past the file size limit (ulimit -f) SIGXFSZ would end this process part way, its temp file left behind.
      if (std::string why; !detail::within_file_size_limit(size, tmp, &why)) {
        o.close();
        return fail(why);
      }
      put<uint32_t>(o, uint32_t(e.name.size()));
      o << e.name;
      put<uint32_t>(o, 3);
      for (int i = 0; i < 3; ++i) {
        put<uint32_t>(o, uint32_t(std::strlen(files[i])));
        o << files[i];
        put<uint64_t>(o, bytes[i].size());
        o.write(reinterpret_cast<const char*>(bytes[i].data()), std::streamsize(bytes[i].size()));
      }
      ++r.done;
    }
    put<uint32_t>(o, 0);
    o.flush();
    if (!o) return fail("cannot write " + tmp + ": " + std::strerror(errno));
  }
  const int fd = ::open(tmp.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) {
    const int e = errno;
    if (fd >= 0) ::close(fd);
    return fail("cannot flush " + tmp + " to disk: " + std::strerror(e));
  }
  ::close(fd);
  if (std::rename(tmp.c_str(), file.c_str()) != 0)
    return fail("cannot rename " + tmp + " to " + file + ": " + std::strerror(errno));
  const fs::path parent = fs::path(file).parent_path();
  fsync_dir(parent.empty() ? "." : parent.string());  // the rename itself, durable
  return r;
}

BulkResult DiskCache::import_bundle(const std::string& file) {
  BulkResult r;
  if (!writable_) {
    r.error = "cache directory " + s_.dir + " is not writable";
    return r;
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) {  // (a file it may not read was "not an smla-cache bundle")
    r.error = "cannot open " + file + ": " + std::strerror(errno);
    return r;
  }
  struct stat st {};
  const uint64_t total = ::stat(file.c_str(), &st) == 0 ? uint64_t(st.st_size) : 0;
  char magic[8];
  if (!in.read(magic, 8) || std::memcmp(magic, kMagic, 8) != 0) {
    r.error = file + " is not an smla-cache bundle";
    return r;
  }
  // The renames into entries/ made durable once, however the import ends (as a publish makes its own).
  struct SyncEntries {
    std::string dir;
    bool any = false;
    ~SyncEntries() {
      if (any) fsync_dir(dir);
    }
  } sync{Root{s_.dir}.entries()};
  for (int64_t index = 0;; ++index) {
    std::string where = file + ": entry " + std::to_string(index);
    uint32_t name_len = 0, n_files = 0;
    if (!get(in, &name_len)) {
      r.error = where + ": bundle truncated";
      return r;
    }
    if (name_len == 0) return r;  // end marker
    std::string name, digest;
    if (name_len > 512 || !get_bytes(in, name_len, &name, total) || !get(in, &n_files) || n_files > 8) {
      r.error = where + ": bundle truncated or malformed";
      return r;
    }
    // The name becomes a path: accept only well-formed entry names (no '/', no "..").
    bool name_ok = valid_entry_name(name, &digest);
    std::string err;
    std::string stage = name_ok ? make_staging(Root{s_.dir}, "stage", &err) : "";
    // Removed however this entry ends unless renamed into place (an exception, say, left it in .staging/).
    struct StageGuard {
      std::string& path;
      ~StageGuard() {
        std::error_code ec;
        if (!path.empty()) fs::remove_all(path, ec);
      }
    } stage_guard{stage};
    bool files_ok = true;
    for (uint32_t i = 0; i < n_files; ++i) {
      uint32_t fl = 0;
      uint64_t size = 0;
      std::string fname, bytes;
      if (!get(in, &fl) || fl > 64 || !get_bytes(in, fl, &fname, total) || !get(in, &size) ||
          size > kMaxFile || !get_bytes(in, size, &bytes, total)) {
        std::error_code ec;
        if (!stage.empty()) fs::remove_all(stage, ec);
        r.error = where + " (" + name + "): bundle truncated or malformed";
        return r;
      }
      bool known = fname == kManifest || fname == kBinary || fname == kSource;
      if (!stage.empty() && known)
        files_ok = write_file(stage + "/" + fname, bytes.data(), bytes.size(), s_.test_fail_writes, &err) && files_ok;
    }
    if (!name_ok) {
      r.rejected.push_back(name + ": not a cache entry name");
      continue;
    }
    if (stage.empty() || !files_ok) {
      std::error_code ec;
      if (!stage.empty()) fs::remove_all(stage, ec);
      r.rejected.push_back(name + ": " + err);
      continue;
    }
    Loaded L = load_entry(stage, digest);
    std::error_code ec;
    if (!L.ok) {
      fs::remove_all(stage, ec);
      r.rejected.push_back(name + ": " + L.problem);
      continue;
    }
    fsync_dir(stage);
    std::string dst = Root{s_.dir}.entry(name);
    int rc = ::rename(stage.c_str(), dst.c_str());
    int e = rc == 0 ? 0 : errno;
    const Loaded local = rc != 0 && (e == EEXIST || e == ENOTEMPTY) ? load_entry(dst, digest) : Loaded{true};
    if (local.unavailable) {  // no verdict on the local copy (EMFILE, EIO, EACCES): it stays, the import skips it
      fs::remove_all(stage, ec);
      r.rejected.push_back(name + ": the local copy cannot be read (" + local.problem + "); left in place");
      continue;
    }
    if (!local.ok) {
      // A corrupt local copy gives way to the verified one, if we may remove it.
      if (!remove_entry(Root{s_.dir}, name, &err, nullptr, &local)) {
        fs::remove_all(stage, ec);
        r.rejected.push_back(name + ": the local copy is bad and " + err);
        continue;
      }
      rc = ::rename(stage.c_str(), dst.c_str());
      e = rc == 0 ? 0 : errno;
    }
    if (rc == 0) {
      stage.clear();  // it is the entry now
      touch(dst);
      sync.any = true;
      ++r.done;
    } else {
      fs::remove_all(stage, ec);
      if (e == EEXIST || e == ENOTEMPTY) ++r.done;  // a verified copy is already present
      else r.rejected.push_back(name + ": cannot rename into place: " + std::strerror(e));
    }
  }
}

}  // namespace smla::cache
