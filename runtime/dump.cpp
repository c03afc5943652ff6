// dump.cpp: writes failed translation units where a user can read them: NVRTC's, hipRTC's and the hipRTC worker's.
#include "dump.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <stdexcept>

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
    return sub + "/" + src.name;
  } catch (const std::exception& e) {
    return std::string("(not written: ") + e.what() + ")";  // the compile's log still reaches the user
  }
}

}  // namespace smla
