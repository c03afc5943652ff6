// dump.cpp: writes failed translation units where a user can read them: NVRTC's, hipRTC's and the hipRTC worker's.
#include "dump.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <stdexcept>
#include <utility>
#include <vector>

#include "../cache/entry_store.hpp"
#include "../cache/private_dir.hpp"
#include "relative_path.hpp"

namespace smla {

namespace fs = std::filesystem;

namespace {
// FNV-1a: the same name for the same failure in every process and build (std::hash promises neither).
uint64_t fnv1a(const std::string& s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error(what + ": " + std::strerror(errno)); }

// `dir` as a directory of this user's that is no symlink, made (mode 0700) when absent. The default directory sits in
// a shared /tmp with predictable names: another user could have made it, or planted a link in it, and the dump would
// have written through the link (any file this process may write) or failed for every user but the first.
void own_dir(const std::string& dir) {
  // The user's own directory is not refused for group write (SMLA_DUMP_DIR may name a group's).
  const std::string why = cache::private_dir_problem(dir, /*group_may_write=*/true);
  if (!why.empty()) throw std::runtime_error(dir + ": " + why);
}

void write_file(const std::string& path, const std::string& text) {
  if (std::string why; !cache::detail::within_file_size_limit(text.size(), path, &why))
    throw std::runtime_error(why);  // written, SIGXFSZ would end the process
  // O_NOFOLLOW: a link in the file's place is not written through.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) fail("cannot write " + path);
  for (size_t done = 0; done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      errno = e;
      fail("cannot write " + path);
    }
    done += size_t(n);
  }
  if (::close(fd) != 0) fail("cannot write " + path);
}
// A dump directory's name: "<stem>-<target>-<16 hex digits>" (the hash of every byte).
bool is_dump_name(const std::string& n) {
  if (n.size() < 18 || n[n.size() - 17] != '-') return false;
  return std::all_of(n.end() - 16, n.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); });
}

// Keeps the newest kKeepDumps dumps in `dir` (by their time of writing), besides `fresh`: one directory a distinct
// failure, never removed, filled $TMPDIR for good across sweeps of source trees. Best effort: what cannot be read or
// removed stays (another user's, in a shared SMLA_DUMP_DIR).
constexpr size_t kKeepDumps = 32;
void prune_old_dumps(const std::string& dir, const std::string& fresh) {
  std::error_code ec;
  std::vector<std::pair<fs::file_time_type, fs::path>> dumps;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name == fresh || !is_dump_name(name) || !it->is_directory(ec) || it->is_symlink(ec)) continue;
    const auto t = fs::last_write_time(it->path(), ec);
    if (!ec) dumps.emplace_back(t, it->path());
  }
  if (dumps.size() < kKeepDumps) return;  // with `fresh`, at most kKeepDumps
  std::sort(dumps.begin(), dumps.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = kKeepDumps - 1; i < dumps.size(); ++i) fs::remove_all(dumps[i].second, ec);
}
}  // namespace

std::string dump_failed_source(const RenderedSource& src, const std::string& target) {
  try {
    uint64_t h = fnv1a(target, fnv1a(src.text));
    for (const auto& hd : src.headers) h = fnv1a(hd.second, fnv1a(hd.first, h));
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
    std::string dir;
    if (const char* d = std::getenv("SMLA_DUMP_DIR")) dir = d;
    if (dir.empty()) {  // one directory a user: $TMPDIR/smla-failed-<uid>
      const char* tmp = std::getenv("TMPDIR");
      dir = std::string(tmp && *tmp ? tmp : "/tmp") + "/smla-failed-" + std::to_string(::geteuid());
      own_dir(dir);
    } else {  // the caller's choice, made with its parents, used as it is
      fs::create_directories(dir);
    }
    std::string safe_target = target;  // "gfx90a:xnack-"
    for (char& c : safe_target)
      if (c == ':' || c == '/') c = '_';
    std::string stem = src.name.substr(0, src.name.rfind('.'));
    for (char& c : stem)
      if (c == '/') c = '_';
    // A directory a failure, the source beside its headers under their own names: it compiles again as it is.
    const std::string sub = dir + "/" + stem + "-" + safe_target + "-" + hex;
    own_dir(sub);
    auto write = [&](const std::string& name, const std::string& text) {
      // (an absolute name or one with "..", from a SMLA_KERNEL_SRC_DIR source, would have put the file anywhere)
      if (!stays_inside(name)) throw std::runtime_error("'" + name + "' is not a relative path without '..'");
      for (size_t slash = name.find('/'); slash != std::string::npos; slash = name.find('/', slash + 1))
        own_dir(sub + "/" + name.substr(0, slash));  // "sub/x.h": sub/, the user's, no link
      write_file(sub + "/" + name, text);
    };
    write(src.name, src.text);
    for (const auto& hd : src.headers) write(hd.first, hd.second);
    std::error_code ec;  // (best effort: the dump is written whether or not its time is)
    fs::last_write_time(sub, fs::file_time_type::clock::now(), ec);  // a failure seen again is a recent one
    prune_old_dumps(dir, fs::path(sub).filename().string());
    return sub + "/" + src.name;
  } catch (const std::exception& e) {
    return std::string("(not written: ") + e.what() + ")";  // the compile's log still reaches the user
  }
}

}  // namespace smla
