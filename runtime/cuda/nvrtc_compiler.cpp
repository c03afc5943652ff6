// nvrtc_compiler.cpp: compiles rendered kernels to cubins with NVRTC.
#include "nvrtc_compiler.hpp"
#include "nvrtc_options.hpp"

#include <dlfcn.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <utility>

#include "../../cache/entry_store.hpp"
#include "../dump.hpp"
#include "cuda_api.hpp"

namespace smla::cuda {

std::string read_define(const std::string& path, const std::string& name) {
  std::ifstream in(path);
  std::string line;
  const std::regex re("^\\s*#\\s*define\\s+" + name + "\\s+([0-9A-Za-z_.]+)");
  std::smatch m;
  while (std::getline(in, line))
    if (line.find(name) != std::string::npos && std::regex_search(line, m, re)) return m[1];  // cuda.h: 1 MB
  return {};
}

// The CCCL (CUB, libcu++) a compile includes, found in the order of its -I options: <inc>/cccl (CUDA 13's layout),
// then <inc> (CUDA 12's). Only CUDA 13's was read, so on CUDA 12 the version was empty and a CCCL upgrade kept the
// key and its old binaries. CUB older than CCCL 2.3 has no CCCL_VERSION: its CUB_VERSION then.
std::string cccl_version(const std::string& inc) {
  for (const std::string& root : {inc + "/cccl", inc}) {
    if (std::string v = read_define(root + "/cuda/std/__cccl/version.h", "CCCL_VERSION"); !v.empty()) return v;
    if (std::string v = read_define(root + "/cub/version.cuh", "CUB_VERSION"); !v.empty()) return "cub-" + v;
  }
  return "?";
}

// The headers a compile can open, by content: what a version define does not tell apart (CCCL's development snapshots
// share one CCCL_VERSION; a header patched in place keeps it) would otherwise keep the key and the binaries built
// against the old text. On CUDA 13.0 a compile of every kernel opens 696 files under cccl/ and, at the top of the
// include directory, cuda.h, cuda_runtime_api.h and the number formats' headers below, nothing else (strace, perf
// notes v47). So: every file of CCCL's tree where the compile's -I order finds it (<inc>/cccl on CUDA 13; cub, thrust,
// cuda, nv at the top on CUDA 12), and those top-level headers by name. Not every cuda*.h of the directory: which of
// them a machine has depends on the packages installed, and a cache warmed on a build machine must still be found on
// a GPU node with the same compiler and the same headers. Paths enter relative to <inc>, so one toolkit installed at
// two places gives one digest. ~17 MB read once a compiler (~20 ms here).
std::string cuda_headers_digest(const std::string& inc) {
  namespace fs = std::filesystem;
  if (inc.empty()) return "?";  // no headers (the compiler is unavailable): not the working directory's
  std::vector<std::string> files;  // relative to inc
  std::error_code ec;
  // With cccl/ (searched first), CUDA 13's top-level nv/ is shadowed and never opened: not in the digest.
  const std::vector<const char*> trees = fs::is_directory(fs::path(inc) / "cccl", ec)
                                             ? std::vector<const char*>{"cccl"}
                                             : std::vector<const char*>{"cub", "thrust", "cuda", "nv"};
  for (const char* sub : trees) {
    const fs::path root = fs::path(inc) / sub;
    if (!fs::is_directory(root, ec)) continue;
    const auto opts = fs::directory_options::follow_directory_symlink | fs::directory_options::skip_permission_denied;
    for (fs::recursive_directory_iterator it(root, opts, ec), end; !ec && it != end; it.increment(ec)) {
      if (it.depth() > 32) it.disable_recursion_pending();  // a directory link into its own parent
      std::error_code fe;
      if (it->is_regular_file(fe)) files.push_back(fs::path(it->path()).lexically_relative(inc).generic_string());
    }
    ec.clear();
  }
  for (const char* name : {"cuda.h", "cuda_runtime_api.h", "cuda_fp16.h", "cuda_fp16.hpp", "cuda_bf16.h",
                           "cuda_bf16.hpp", "cuda_fp8.h", "cuda_fp8.hpp", "cuda_fp6.h", "cuda_fp6.hpp", "cuda_fp4.h",
                           "cuda_fp4.hpp"}) {
    std::error_code fe;
    if (fs::is_regular_file(fs::path(inc) / name, fe)) files.push_back(name);
  }
  std::sort(files.begin(), files.end());
  std::string manifest;
  for (const std::string& f : files) {
    std::ifstream in(fs::path(inc) / f, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    const std::string t = text.str();
    // Length-prefixed names: no two file lists serialize alike. An unreadable file is named as such (NVRTC could not
    // read it either), and becomes readable only with a new digest.
    const std::string content = in ? std::to_string(t.size()) + ":" + cache::detail::hash_hex(t) : "unreadable";
    manifest += std::to_string(f.size()) + ":" + f + ":" + content + ";";
  }
  return cache::detail::hash_hex(manifest);
}

NvrtcCompiler::NvrtcCompiler() : NvrtcCompiler(cuda_include_dir()) {}

NvrtcCompiler::NvrtcCompiler(std::string include_dir) : include_dir_(std::move(include_dir)) {}

bool NvrtcCompiler::available(std::string* why) const {
  if (!nvrtc().ok) {
    if (why) *why = nvrtc().why;
    return false;
  }
  if (include_dir_.empty()) {
    if (why) {
      const char* v = std::getenv("SMLA_CUDA_INCLUDE");
      *why = v && *v ? std::string("SMLA_CUDA_INCLUDE='") + v + "' holds no cuda.h"
                     : "no CUDA include directory (cuda.h, CUB) found: set SMLA_CUDA_INCLUDE or CUDA_HOME";
    }
    return false;
  }
  return true;
}

namespace {
// Size of the file `path` resolves to; -1 if none.
long long real_file_bytes(const std::string& path) {
  char real[PATH_MAX];
  struct stat st {};
  if (!::realpath(path.c_str(), real) || ::stat(real, &st) != 0) return -1;
  return static_cast<long long>(st.st_size);
}
}  // namespace

std::string nvrtc_build_stamp(const void* nvrtc_symbol, int major, int minor) {
  Dl_info info{};
  if (!nvrtc_symbol || !::dladdr(nvrtc_symbol, &info) || !info.dli_fname) return "libnvrtc-bytes=?";
  const std::string lib = info.dli_fname;
  // NVRTC dlopens its builtins by this name: the loader looks in LD_LIBRARY_PATH first (another build there is the one
  // loaded: the stamp named the file beside libnvrtc while another compiled), then beside libnvrtc (the directory it
  // was found in, which may hold only a symlink to it).
  const std::string builtins = "libnvrtc-builtins.so." + std::to_string(major) + "." + std::to_string(minor);
  char real[PATH_MAX];
  const std::string resolved = ::realpath(lib.c_str(), real) ? real : lib;
  std::vector<std::string> dirs;
  if (const char* lp = std::getenv("LD_LIBRARY_PATH")) {
    std::stringstream ss(lp);
    for (std::string d; std::getline(ss, d, ':');) dirs.push_back(d.empty() ? "." : d);  // empty: the working dir
  }
  for (const std::string& p : {lib, resolved}) dirs.push_back(p.substr(0, p.rfind('/')));
  long long b = -1;
  for (const std::string& d : dirs)
    if (b < 0) b = real_file_bytes(d + "/" + builtins);
  return "libnvrtc-bytes=" + std::to_string(real_file_bytes(lib)) + ";builtins-bytes=" + std::to_string(b);
}

std::string NvrtcCompiler::identity() const {
  // Read once a compiler: neither the library nor the headers in include_dir_ change under a running process.
  std::call_once(identity_once_, [this] {
    int maj = 0, min = 0;
    if (nvrtc().ok) nvrtc().Version(&maj, &min);
    // nvrtcVersion is major.minor only: a patch release (13.0.48 -> 13.0.88) kept the key and
    // its old binaries. The library's size changes with the build yet is the same on every
    // machine with that build, so shared caches still hit.
    identity_ = "nvrtc-" + std::to_string(maj) + "." + std::to_string(min) +
                ";cuda-" + read_define(include_dir_ + "/cuda.h", "CUDA_VERSION") +
                ";cccl-" + cccl_version(include_dir_) + ";headers-" + cuda_headers_digest(include_dir_) + ";" +
                nvrtc_build_stamp(nvrtc().ok ? reinterpret_cast<const void*>(nvrtc().Version) : nullptr, maj, min);
  });
  return identity_;
}

std::vector<std::string> NvrtcCompiler::options(const std::string& target) const {
  // Include paths are deliberately not part of this list (they differ between machines and are
  // covered by the identity's header versions); compile() appends them.
  return nvrtc_base_options(target);
}

namespace {
struct Program {
  nvrtcProgram p = nullptr;
  ~Program() {
    if (p) nvrtc().DestroyProgram(&p);
  }
};
}  // namespace

CompileResult NvrtcCompiler::compile(const RenderedSource& src, const std::string& target) const {
  std::string why;
  if (!available(&why)) throw Error(Status::NoBackend, why, __FILE__, __LINE__, "nvrtc");
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<const char*> hdr_src, hdr_names;
  for (const auto& h : src.headers) {
    hdr_names.push_back(h.first.c_str());
    hdr_src.push_back(h.second.c_str());
  }
  Program prog;
  nvrtcResult r = nvrtc().CreateProgram(&prog.p, src.text.c_str(), src.name.c_str(), (int)hdr_src.size(),
                                        hdr_src.data(), hdr_names.data());
  if (r != NVRTC_SUCCESS)
    throw Error(Status::CompileError, nvrtc().GetErrorString(r), __FILE__, __LINE__, "nvrtcCreateProgram");

  std::vector<std::string> opts = options(target);
  opts.insert(opts.end(), extra_options.begin(), extra_options.end());
  opts.push_back("-I" + include_dir_ + "/cccl");
  opts.push_back("-I" + include_dir_);
  std::vector<const char*> copts;
  for (const auto& o : opts) copts.push_back(o.c_str());
  r = nvrtc().CompileProgram(prog.p, (int)copts.size(), copts.data());

  CompileResult out;
  size_t log_size = 0;
  nvrtc().GetProgramLogSize(prog.p, &log_size);
  out.log.resize(log_size);
  if (log_size) nvrtc().GetProgramLog(prog.p, out.log.data());
  while (!out.log.empty() && (out.log.back() == '\0' || out.log.back() == '\n')) out.log.pop_back();
  if (r != NVRTC_SUCCESS) {
    const std::string path = dump_failed_source(src, target);
    throw Error(Status::CompileError,
                std::string("NVRTC failed to compile ") + src.name + " for " + target + " (" +
                    nvrtc().GetErrorString(r) + "); source dumped to " + path + "\n" + out.log,
                __FILE__, __LINE__, "nvrtcCompileProgram");
  }
  size_t n = 0;
  nvrtc().GetCUBINSize(prog.p, &n);
  out.binary.resize(n);
  nvrtc().GetCUBIN(prog.p, reinterpret_cast<char*>(out.binary.data()));
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace smla::cuda
