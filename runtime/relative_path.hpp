// relative_path.hpp: path names. Whether a name stays inside the directory it is joined to (kernel sources read from
// SMLA_KERNEL_SRC_DIR, failed sources written under the dump directory): relative, with no empty, "." or ".."
// component. An absolute name or one with ".." reached out of the directory.
#pragma once
#include <algorithm>
#include <string>

namespace smla {

inline bool stays_inside(const std::string& name) {
  if (name.empty() || name[0] == '/') return false;
  for (size_t b = 0; b <= name.size();) {
    const size_t e = std::min(name.find('/', b), name.size());
    const std::string part = name.substr(b, e - b);
    if (part.empty() || part == "." || part == "..") return false;
    b = e + 1;
  }
  return true;
}

/// The directory of `path`: "." for a bare name, "/" for one at the root (the tuning db's files, warm-up's --out).
inline std::string parent_dir(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace smla
