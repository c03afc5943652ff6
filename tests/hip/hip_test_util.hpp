// hip_test_util.hpp: shared helpers of the HIP tests (sources, files, a shell-out).
#pragma once
#include <sys/stat.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/backend.hpp"
#include "runtime/hip/hip_api.hpp"

/// Skips the calling test (GTEST_SKIP returns from the test body, so this must be a macro).
#define SMLA_REQUIRE_HIPRTC()                                                                   \
  do {                                                                                          \
    std::string smla_why_;                                                                      \
    if (!::smla::hip::Api::get(&smla_why_)) GTEST_SKIP() << "hipRTC not installed here: " << smla_why_; \
  } while (0)

namespace smla::hip::test {

inline std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

/// A kernel that takes SmlaParams by value (its header passed by name, as the runtime does) and
/// issues one bf16 MFMA, present on gfx90a, gfx942 and gfx950.
inline RenderedSource mfma_source(const std::string& entry) {
  RenderedSource s;
  s.name = entry + ".hip";
  s.headers = {{"smla_params.h", read_text(SMLA_SOURCE_DIR "/kernel_src/smla_params.h")}};
  s.text = R"(#include "smla_params.h"
typedef short smla_bf16x4 __attribute__((ext_vector_type(4)));
typedef float smla_f32x16 __attribute__((ext_vector_type(16)));
extern "C" __global__ void )" + entry + R"((SmlaParams p) {
  int lane = threadIdx.x;
  smla_bf16x4 a, b;
  for (int i = 0; i < 4; ++i) {
    a[i] = (short)p.q[lane * 4 + i];
    b[i] = (short)p.kv[lane * 4 + i];
  }
  smla_f32x16 acc = {};
  acc = __builtin_amdgcn_mfma_f32_32x32x8bf16_1k(a, b, acc, 0, 0, 0);
  for (int i = 0; i < 16; ++i) p.dkv_acc[lane * 16 + i] = acc[i] * p.scale;
}
)";
  return s;
}

/// Runs a shell command, returns its stdout and exit status.
inline std::string run_command(const std::string& cmd, int* status) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    *status = -1;
    return out;
  }
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  *status = pclose(p);
  return out;
}

// Sets an environment variable for one scope (unset again, or its old value restored).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* v = std::getenv(name)) old_ = v, had_ = true;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_) setenv(name_.c_str(), old_.c_str(), 1);
    else unsetenv(name_.c_str());
  }

 private:
  std::string name_, old_;
  bool had_ = false;
};

/// Writes an executable shell script `dir`/`name` ("#!/bin/sh" then `body`) and returns its path:
/// a fake smla-hiprtc-worker (it gets <request> <code-object-out> <log-out> like the real one).
inline std::string write_script(const std::string& dir, const std::string& name, const std::string& body) {
  const std::string path = dir + "/" + name;
  std::ofstream(path) << "#!/bin/sh\n" << body << "\n";
  chmod(path.c_str(), 0755);
  return path;
}

/// A fake worker that runs the real one for the target probe (its source names smla_probe) and
/// `otherwise` (shell) for everything else.
inline std::string probe_passing_worker(const std::string& dir, const std::string& name, const std::string& otherwise) {
  return write_script(dir, name,
                      "if grep -qs -e smla_probe -- \"$@\"; then exec '" SMLA_HIPRTC_WORKER_PATH "' \"$@\"; fi\n" + otherwise);
}

inline bool contains(const std::vector<std::string>& v, const std::string& s) {
  for (const auto& x : v)
    if (x == s) return true;
  return false;
}

}  // namespace smla::hip::test
