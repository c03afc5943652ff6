// dump.cpp: writes failed translation units where a user can read them.
#include "dump.hpp"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <functional>

namespace smla {

std::string dump_failed_source(const RenderedSource& src, const std::string& target) {
  std::string dir;
  if (const char* d = std::getenv("SMLA_DUMP_DIR")) dir = d;
  if (dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    dir = std::string(tmp && *tmp ? tmp : "/tmp") + "/smla-failed";
  }
  std::string safe_target = target;
  for (char& c : safe_target)
    if (c == ':' || c == '/') c = '_';
  const std::string sub = dir + "/" + src.name + "-" + safe_target + "-" +
                          std::to_string(std::hash<std::string>{}(src.text) & 0xffffffffu);
  mkdir(dir.c_str(), 0755);
  mkdir(sub.c_str(), 0755);
  bool ok = true;
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream out(sub + "/" + name, std::ios::binary);
    out << text;
    ok = ok && out.good();
  };
  write(src.name, src.text);
  for (const auto& h : src.headers) write(h.first, h.second);
  return ok ? sub + "/" + src.name : "(not written: " + sub + " is not writable)";
}

}  // namespace smla
