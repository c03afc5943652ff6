// cuda_api.cpp: dlopen of libcuda and libnvrtc.
#include "cuda_api.hpp"

#include <dlfcn.h>

#include <cstring>
#include <sys/stat.h>

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "../fork_watch.hpp"

namespace smla::cuda {

namespace {

void* open_first(const std::vector<std::string>& names, std::string* opened, std::string* err) {
  for (const auto& n : names) {
    if (n.empty()) continue;
    if (void* h = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      *opened = n;
      return h;
    }
    const char* e = dlerror();
    if (err->empty() && e) *err = e;
  }
  return nullptr;
}

std::string env_or(const char* name, const std::string& fallback = {}) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

// The libraries to try: the one `var` names alone when it is set (a path that does not open is an error naming it,
// as SMLA_LIBHIP's: falling back to the system's library hid a mistyped path), else `defaults`.
std::vector<std::string> library_candidates(const char* var, std::vector<std::string> defaults) {
  if (std::string v = env_or(var); !v.empty()) return {v};
  return defaults;
}

// "could not be opened: <dlerror>", naming `var` when its value was the one tried.
std::string open_failure(const char* var, const std::string& what, const std::string& err) {
  const std::string v = env_or(var);
  return v.empty() ? what + " could not be opened: " + err
                   : std::string(var) + "='" + v + "' could not be opened (" + err + ")";
}

// The toolkit roots the environment names, in the order looked in: $CUDA_HOME, then $CUDA_PATH (each when set and not
// empty: an empty one is no root, "/lib64/libnvrtc.so" was tried).
std::vector<std::string> toolkit_roots() {
  std::vector<std::string> roots;
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"})
    if (std::string r = env_or(var); !r.empty()) roots.push_back(r);
  return roots;
}

bool file_exists(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0;
}

std::atomic<bool> g_driver_opened{false};  // driver()'s first call has finished (whatever it found)
struct CudaForkTag;
using CudaFork = ForkWatch<CudaForkTag>;  // this process was forked from the one that initialised the driver

// The driver as a forked child sees it: the same entry points (error names still work), not usable, and why.
const Driver& forked_driver(const Driver& d) {
  static const Driver f = [&d] {
    Driver c = d;
    c.ok = false;
    c.why = "CUDA was initialised in process " + std::to_string(CudaFork::init_pid()) +
            " before it forked this one, and a forked child cannot use the CUDA driver: start the worker with "
            "spawn/exec (Python multiprocessing's 'spawn' or 'forkserver'), or use CUDA only after the fork";
    return c;
  }();
  return f;
}

}  // namespace

bool forked_after_init() { return CudaFork::forked(); }

const Driver* driver_if_opened() { return g_driver_opened.load(std::memory_order_acquire) ? &driver() : nullptr; }

const Driver& driver() {
  static Driver d;
  static std::once_flag once;
  std::call_once(once, [] {
    struct Opened {  // set on every way out of the initialisation
      ~Opened() { g_driver_opened.store(true, std::memory_order_release); }
    } opened;
    std::string err;
    void* h = open_first(library_candidates("SMLA_LIBCUDA", {"libcuda.so.1", "libcuda.so"}), &d.path, &err);
    if (!h) {
      d.why = open_failure("SMLA_LIBCUDA", "the CUDA driver (libcuda.so.1)", err);
      return;
    }
    // cuda.h 13 names cuEventElapsedTime_v2 (drivers >= 12.8); older drivers have only the unversioned one, with the
    // same signature. Only timing (smla-bench, tests) uses it: without this fallback the whole backend was unusable on
    // an R535/R550 driver for its sake.
    auto fallback = [h](const char* sym) -> void* {
      return std::strcmp(sym, "cuEventElapsedTime_v2") == 0 ? dlsym(h, "cuEventElapsedTime") : nullptr;
    };
#define SMLA_LOAD(member, sym)                                               \
  d.member = reinterpret_cast<decltype(d.member)>(dlsym(h, SMLA_STR(sym)));  \
  if (!d.member) d.member = reinterpret_cast<decltype(d.member)>(fallback(SMLA_STR(sym))); \
  if (!d.member) {                                                           \
    d.why = std::string("libcuda has no symbol ") + SMLA_STR(sym);            \
    return;                                                                  \
  }
    SMLA_CUDA_DRIVER_FUNCS(SMLA_LOAD)
#undef SMLA_LOAD
    CUresult r = d.Init(0);
    if (r != CUDA_SUCCESS) {
      const char* name = nullptr;
      d.GetErrorName(r, &name);
      d.why = std::string("cuInit failed: ") + (name ? name : "?");
      // What a child forked from a process that had initialised CUDA (PyTorch, say) gets.
      if (r == CUDA_ERROR_NOT_INITIALIZED)
        d.why += " (a process forked from one that had initialised CUDA cannot use it: start workers with spawn, not "
                 "fork)";
      return;
    }
    int n = 0;
    if (d.DeviceGetCount(&n) != CUDA_SUCCESS || n == 0) {
      d.why = "the CUDA driver reports no device";
      return;
    }
    d.ok = true;
    CudaFork::arm();
  });
  if (CudaFork::forked()) return forked_driver(d);
  return d;
}

std::vector<std::string> nvrtc_candidates() {
  std::vector<std::string> defaults{"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};
  for (const std::string& r : toolkit_roots()) defaults.push_back(r + "/lib64/libnvrtc.so");
  defaults.push_back("/usr/local/cuda/lib64/libnvrtc.so");
  return library_candidates("SMLA_LIBNVRTC", defaults);
}

const Nvrtc& nvrtc() {
  static Nvrtc n;
  static std::once_flag once;
  std::call_once(once, [] {
    std::string err;
    void* h = open_first(nvrtc_candidates(), &n.path, &err);
    if (!h) {
      n.why = open_failure("SMLA_LIBNVRTC", "NVRTC (libnvrtc.so)", err);
      if (env_or("SMLA_LIBNVRTC").empty()) n.why += " (set SMLA_LIBNVRTC to its path)";
      return;
    }
#define SMLA_LOAD(member, sym)                                               \
  n.member = reinterpret_cast<decltype(n.member)>(dlsym(h, SMLA_STR(sym)));  \
  if (!n.member) {                                                           \
    n.why = std::string("libnvrtc has no symbol ") + SMLA_STR(sym);           \
    return;                                                                  \
  }
    SMLA_NVRTC_FUNCS(SMLA_LOAD)
#undef SMLA_LOAD
    n.ok = true;
  });
  return n;
}

void check(CUresult r, const char* call, const char* file, int line) {
  if (r == CUDA_SUCCESS) return;
  const char* name = nullptr;
  const char* text = nullptr;
  if (driver().GetErrorName) driver().GetErrorName(r, &name);
  if (driver().GetErrorString) driver().GetErrorString(r, &text);
  throw Error(Status::DriverError,
              std::string(name ? name : "CUDA error ") + (name ? "" : std::to_string(r)) + ": " +
                  (text ? text : "(no description)"),
              file, line, call);
}

bool is_binary_refusal(const Error& e) {
  if (e.status() != Status::DriverError) return false;
  // check() starts the message with the result's name, or "CUDA error <code>" when the driver
  // could not name it.
  struct Refusal {
    CUresult code;
    const char* name;
  };
#define SMLA_REFUSAL(r) Refusal{r, #r}
  static const Refusal refusals[] = {
      SMLA_REFUSAL(CUDA_ERROR_INVALID_IMAGE),   SMLA_REFUSAL(CUDA_ERROR_NO_BINARY_FOR_GPU),
      SMLA_REFUSAL(CUDA_ERROR_INVALID_PTX),     SMLA_REFUSAL(CUDA_ERROR_UNSUPPORTED_PTX_VERSION),
      SMLA_REFUSAL(CUDA_ERROR_INVALID_SOURCE),  SMLA_REFUSAL(CUDA_ERROR_JIT_COMPILER_NOT_FOUND),
      SMLA_REFUSAL(CUDA_ERROR_JIT_COMPILATION_DISABLED)};
#undef SMLA_REFUSAL
  const std::string& m = e.message();
  for (const Refusal& r : refusals) {
    for (const std::string& head : {std::string(r.name), "CUDA error " + std::to_string(int(r.code))})
      if (m.compare(0, head.size(), head) == 0 && m.size() > head.size() && m[head.size()] == ':') return true;
  }
  return false;
}

std::string cuda_include_dir() {
  // SMLA_CUDA_INCLUDE, when set, alone (NvrtcCompiler::available() then names it when it holds no cuda.h).
  if (std::string v = env_or("SMLA_CUDA_INCLUDE"); !v.empty()) return file_exists(v + "/cuda.h") ? v : std::string();
  std::vector<std::string> cands;
  for (const std::string& r : toolkit_roots()) cands.push_back(r + "/include");
  cands.push_back("/usr/local/cuda/include");
  for (const auto& c : cands)
    if (!c.empty() && file_exists(c + "/cuda.h")) return c;
  return {};
}

}  // namespace smla::cuda
