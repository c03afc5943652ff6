// sources.cpp: embedded kernel sources and rendering.
#include "sources.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <mutex>
#include <regex>
#include <set>
#include <sstream>

#include "check.hpp"
#include "relative_path.hpp"

namespace smla {

const std::vector<std::pair<std::string, std::string>>& embedded_kernel_sources();  // generated

namespace {
std::mutex g_load_mutex;
}

KernelSources::KernelSources(std::string dir) : dir_(std::move(dir)) {}

std::string without_comments(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const char c = text[i];
    if (c == '"' || c == '\'') {  // a literal, escapes and all, up to its end or the line's
      const size_t start = i++;
      while (i < text.size() && text[i] != c && text[i] != '\n') i += text[i] == '\\' ? 2 : 1;
      if (i < text.size() && text[i] == c) ++i;
      out.append(text, start, std::min(i, text.size()) - start);
    } else if (c == '/' && i + 1 < text.size() && text[i + 1] == '/') {
      while (i < text.size() && text[i] != '\n') ++i;  // the newline stays
      out += ' ';
    } else if (c == '/' && i + 1 < text.size() && text[i + 1] == '*') {
      const size_t end = text.find("*/", i + 2);
      const size_t stop = end == std::string::npos ? text.size() : end + 2;
      out += ' ';
      for (size_t k = i; k < stop; ++k)
        if (text[k] == '\n') out += '\n';  // lines keep their starts
      i = stop;
    } else {
      out += c;
      ++i;
    }
  }
  return out;
}

namespace {
// An include may not reach out of the source directory.
void require_inside(const std::string& name, const std::string& dir) {
  SMLA_REQUIRE(stays_inside(name), Status::InvalidArgument,
               "kernel source '" + name + "': not a path inside the source directory '" + dir + "'");
}
}  // namespace

bool KernelSources::has(const std::string& name) const {
  if (dir_.empty()) {
    for (const auto& f : embedded_kernel_sources())
      if (f.first == name) return true;
    return false;
  }
  require_inside(name, dir_);
  struct stat st {};
  if (::stat((dir_ + "/" + name).c_str(), &st) != 0) {
    SMLA_REQUIRE(errno == ENOENT || errno == ENOTDIR, Status::InvalidArgument,
                 "kernel source '" + name + "' in '" + dir_ + "': " + std::strerror(errno));
    return false;
  }
  // (A directory of that name was attached as an empty header.)
  SMLA_REQUIRE(S_ISREG(st.st_mode), Status::InvalidArgument,
               "kernel source '" + name + "' in '" + dir_ + "' is not a regular file");
  return true;
}

const std::string& KernelSources::file(const std::string& name) const {
  if (dir_.empty()) {
    for (const auto& f : embedded_kernel_sources())
      if (f.first == name) return f.second;
    SMLA_THROW(Status::Internal, "kernel source '" + name + "' is not embedded in this build of smla");
  }
  std::lock_guard<std::mutex> lock(g_load_mutex);
  for (const auto& f : loaded_)
    if (f.first == name) return f.second;
  // has(): inside the directory, a regular file (it throws saying what else), or absent.
  SMLA_REQUIRE(has(name), Status::InvalidArgument,
               "kernel source '" + name + "' not found in the source directory '" + dir_ + "'");
  std::ifstream in(dir_ + "/" + name, std::ios::binary);
  SMLA_REQUIRE(in.good(), Status::InvalidArgument,
               "kernel source '" + name + "' in the source directory '" + dir_ + "': " + std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  loaded_.emplace_back(name, ss.str());
  return loaded_.back().second;
}

std::string source_file_name(const std::string& stem, const std::string& family) {
  return stem + (family == "hip" ? ".hip" : ".cu");
}

RenderedSource KernelSources::render(const KernelSpec& spec, const std::string& family) const {
  RenderedSource out;
  out.name = source_file_name(spec.stem, family);
  std::ostringstream tu;
  // No entry name here: every entry of one source shares this translation unit (and its binary).
  tu << "// smla kernel source " << spec.stem << " (" << family << "), rendered by the runtime\n";
  for (const auto& d : spec.defines) tu << "#define " << d.first << " " << d.second << "\n";
  tu << "#line 1 \"" << out.name << "\"\n" << file(out.name);
  out.text = tu.str();

  // Attach every quoted include found in kernel_src, transitively, so the compile reads no disk
  // and the cache key sees every byte. Directives only: at a line's start, outside comments (a comment naming an
  // old header failed a source tree's render, and one naming a real header put it in the key). One inside a false
  // #if is still attached: a header more in the key, never one less.
  static const std::regex inc_re("(^|\\n)[ \\t]*#[ \\t]*include[ \\t]*\"([^\"]+)\"");
  std::set<std::string> seen;
  std::vector<std::string> todo{out.text};
  while (!todo.empty()) {
    std::string text = without_comments(todo.back());
    todo.pop_back();
    for (std::sregex_iterator it(text.begin(), text.end(), inc_re), end; it != end; ++it) {
      std::string name = (*it)[2];
      if (!seen.insert(name).second) continue;
      if (!has(name)) {
        // A quoted include absent from a source directory was left to NVRTC, which found it in the working
        // directory: compiled from bytes the cache key never saw (NVRTC is now told not to look there either).
        // Absent from the embedded sources it is a build defect (the build embeds *.cu, *.cuh, *.h and *.hip): hipRTC,
        // which has no --no-source-include, could have found a file of that name elsewhere, outside the key.
        SMLA_REQUIRE(dir_.empty(), Status::InvalidArgument,
                     "kernel source '" + name + "', included by the " + out.name + " translation unit, is not in "
                     "the source directory '" + dir_ + "' (SMLA_KERNEL_SRC_DIR): every quoted include must be there");
        SMLA_THROW(Status::Internal, "kernel source '" + name + "', included by the " + out.name +
                                         " translation unit, is not among the sources embedded in this build");
      }
      out.headers.emplace_back(name, file(name));
      todo.push_back(out.headers.back().second);
    }
  }
  return out;
}

}  // namespace smla
