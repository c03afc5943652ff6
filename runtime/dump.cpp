// dump.cpp: writes failed translation units where a user can read them: NVRTC's, hipRTC's and the hipRTC worker's.
#include "dump.hpp"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace smla {

namespace fs = std::filesystem;

namespace {
// FNV-1a: the same name for the same failure in every process and build (std::hash promises neither).
uint64_t fnv1a(const std::string& s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
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
    if (dir.empty()) {
      const char* tmp = std::getenv("TMPDIR");
      dir = std::string(tmp && *tmp ? tmp : "/tmp") + "/smla-failed";
    }
    std::string safe_target = target;  // "gfx90a:xnack-"
    for (char& c : safe_target)
      if (c == ':' || c == '/') c = '_';
    // A directory a failure, the source beside its headers under their own names: it compiles again as it is.
    const fs::path sub = fs::path(dir) / (fs::path(src.name).stem().string() + "-" + safe_target + "-" + hex);
    auto write = [&](const std::string& name, const std::string& text) {
      const fs::path file = sub / name;
      fs::create_directories(file.parent_path());
      std::ofstream out(file, std::ios::binary);
      out << text;
      out.close();
      if (!out) throw std::runtime_error("cannot write " + file.string());
    };
    write(src.name, src.text);
    for (const auto& hd : src.headers) write(hd.first, hd.second);
    return (sub / src.name).string();
  } catch (const std::exception& e) {
    return std::string("(not written: ") + e.what() + ")";  // the compile's log still reaches the user
  }
}

}  // namespace smla
