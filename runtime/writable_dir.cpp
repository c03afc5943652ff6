// writable_dir.cpp: see writable_dir.hpp.
#include "writable_dir.hpp"

#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "relative_path.hpp"  // parent_dir

namespace smla {
namespace {

// A file system that refuses new entries whatever the permissions say: root passes access(W_OK) everywhere, on a
// read-only mount and on the kernel's own file systems (/proc, /sys...) too, where a write then fails. "" if none.
std::string refuses_new_entries(const std::string& d) {
  struct statvfs v {};
  if (::statvfs(d.c_str(), &v) == 0 && (v.f_flag & ST_RDONLY)) return "is on a read-only file system";
  struct statfs f {};
  if (::statfs(d.c_str(), &f) != 0) return "";
  switch (static_cast<unsigned long>(f.f_type)) {
    case 0x9fa0:      // proc
    case 0x62656572:  // sysfs
    case 0x27e0eb:    // cgroup
    case 0x63677270:  // cgroup2
    case 0x64626720:  // debugfs
    case 0x74726163:  // tracefs
    case 0x73636673:  // securityfs
    case 0x62656570:  // configfs
    case 0xcafe4a11:  // bpf
    case 0x6165676c:  // pstore
    case 0x1cd1:      // devpts
    case 0xde5e81e4:  // efivarfs
      return "is on a kernel pseudo file system, where nothing can be made";
    default:
      return "";
  }
}

}  // namespace

std::string dir_write_problem(const std::string& dir) {
  std::string d = dir.empty() ? "." : dir;
  for (bool first = true;; first = false) {
    struct stat st {};
    if (::stat(d.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode)) return (first ? d : "its parent " + d) + " is not a directory";
      if (::access(d.c_str(), W_OK | X_OK) != 0)
        return (first ? d : "its parent " + d) + " is not writable: " + std::strerror(errno);
      if (std::string why = refuses_new_entries(d); !why.empty()) return (first ? d : "its parent " + d) + " " + why;
      return "";
    }
    if (errno != ENOENT && errno != ENOTDIR) return "cannot stat " + d + ": " + std::strerror(errno);
    while (d.size() > 1 && d.back() == '/') d.pop_back();  // then up one level: "a/b/" -> "a"
    d = parent_dir(d);
  }
}

}  // namespace smla
