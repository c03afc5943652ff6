// test_util.hpp: fake kernels, temp dirs, log capture and subprocess helpers for the cache tests.
// No GPU: "binaries" are deterministic byte strings derived from the key fields.
#pragma once
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "kernel_cache.hpp"

namespace smla::cache::test {

namespace fs = std::filesystem;

inline KeyFields fields(const std::string& kernel, int variant = 0) {
  KeyFields f;
  f.kernel = kernel;
  f.shape_tag = "H128-K512-R" + std::to_string(512 + variant);
  f.source = "#include \"smla_params.h\"\nextern \"C\" __global__ void " + kernel + "() { /* v" +
             std::to_string(variant) + " */ }\n";
  f.headers = {{"smla_params.h", "struct Params { int h; };\n"}, {"tile.h", "#define TILE 64\n"}};
  f.options = {"-O3", "--std=c++17", "-DVARIANT=" + std::to_string(variant)};
  f.target = "sm_90a";
  f.compiler_id = "nvrtc-13.0;cuda-headers-13000";
  return f;
}

/// The fake compiler's output: begins with a findable marker, then bytes derived from the source.
inline std::vector<uint8_t> payload(const KeyFields& f, size_t n = 2048) {
  std::string head = "PAYLOAD:" + f.kernel + ":" + f.shape_tag + ":";
  std::vector<uint8_t> b(head.begin(), head.end());
  uint32_t x = uint32_t(f.source.size() * 2654435761u);
  for (char c : f.source) x = x * 31 + uint8_t(c);
  while (b.size() < n) {
    x = x * 1103515245u + 12345u;
    b.push_back(uint8_t(x >> 16));
  }
  return b;
}

/// A fake compile that counts its calls.
struct FakeCompiler {
  std::atomic<int> calls{0};
  int sleep_ms = 0;
  std::function<CompileOutput()> fn(const KeyFields& f) {
    return [this, f] {
      ++calls;
      if (sleep_ms) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
      return CompileOutput{payload(f), "ptxas info: fake compile of " + f.kernel};
    };
  }
};

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/smla-cache-test-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& s) const { return path + "/" + s; }
};

/// Settings for a test: its own cache dir and lock dir, no size bound, no environment.
inline Settings settings_for(const TempDir& t, const std::string& sub = "cache") {
  Settings s;
  s.dir = t / sub;
  s.lock_dir = t / "locks";
  s.max_bytes = 0;
  s.lock_timeout_s = 30;
  return s;
}

/// Total bytes of the entries, as the cache counts them.
inline int64_t total_bytes(const DiskCache& c) {
  int64_t n = 0;
  for (const auto& e : c.list()) n += e.bytes;
  return n;
}

/// The bytes of one fake entry as the cache counts them (every fields("kN") entry, and any other two-letter name's,
/// has the same size: same-length names and payloads), measured in a cache of its own under `t`.
inline int64_t fake_entry_bytes(const TempDir& t) {
  DiskCache probe(settings_for(t, "probe"));
  FakeCompiler c;
  KeyFields f = fields("k0");
  probe.get_or_compile(f, c.fn(f));
  return total_bytes(probe);
}

/// Captures everything logged through smla's logger ("smla" in spdlog's registry, cache/logger.hpp) while alive.
struct LogCapture {
  std::ostringstream out;
  std::shared_ptr<spdlog::logger> old, mine;
  LogCapture() {
    old = spdlog::get("smla");
    spdlog::drop("smla");
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
    mine = std::make_shared<spdlog::logger>("smla", sink);
    mine->set_level(spdlog::level::debug);
    spdlog::register_logger(mine);
  }
  ~LogCapture() {
    spdlog::drop("smla");
    if (old) spdlog::register_logger(old);
  }
  std::string text() {
    mine->flush();
    return out.str();
  }
  int count(const std::string& needle) {
    std::string t = text();
    int n = 0;
    for (size_t p = t.find(needle); p != std::string::npos; p = t.find(needle, p + 1)) ++n;
    return n;
  }
};

inline std::vector<std::string> entry_names(const std::string& cache_dir) {
  std::vector<std::string> v;
  std::error_code ec;
  for (fs::directory_iterator it(cache_dir + "/entries", ec), e; !ec && it != e; it.increment(ec))
    v.push_back(it->path().filename().string());
  std::sort(v.begin(), v.end());
  return v;
}

inline size_t count_dir(const std::string& d) {
  std::error_code ec;
  size_t n = 0;
  for (fs::directory_iterator it(d, ec), e; !ec && it != e; it.increment(ec)) ++n;
  return n;
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

/// Starts `argv` with extra "NAME=value" environment entries; returns the pid.
inline pid_t spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                   const std::string& stdout_file = "") {
  pid_t pid = ::fork();
  if (pid == 0) {
    for (const auto& e : env) ::putenv(const_cast<char*>(e.c_str()));
    if (!stdout_file.empty()) {
      int fd = ::open(stdout_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
    }
    std::vector<char*> a;
    for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    ::execv(a[0], a.data());
    ::_exit(127);
  }
  return pid;
}

/// Exit code of a child, or 128+signal.
inline int wait_exit(pid_t pid) {
  int st = 0;
  if (::waitpid(pid, &st, 0) != pid) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/// Makes `path` a group's shared directory: owned by root and `group`, mode 02775 (setgid: what is made below belongs
/// to the group). "" when done, else what failed.
inline std::string group_dir(const std::string& path, gid_t group) {
  if (::mkdir(path.c_str(), 0775) != 0) return "mkdir " + path + " failed";
  if (::chown(path.c_str(), 0, group) != 0 || ::chmod(path.c_str(), 02775) != 0) return "chown/chmod " + path + " failed";
  return "";
}

/// A pid that is certainly gone: a child that exited and was reaped (for owner tags of dead writers).
inline pid_t dead_pid() {
  std::fflush(nullptr);
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  wait_exit(dead);
  return dead;
}

/// Runs `fn` in a child process as uid/gid (a member of only that group, umask 002); returns
/// what it reports ("" = all well). Needs root. gtest failures inside `fn` are not seen by the
/// parent: `fn` must report them in its result.
inline std::string run_as(uid_t uid, gid_t gid, const std::function<std::string()>& fn) {
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed";
  std::fflush(nullptr);  // else the child would write the parent's buffered output again
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    std::string r;
    if (::setgroups(1, &gid) != 0 || ::setresgid(gid, gid, gid) != 0 || ::setresuid(uid, uid, uid) != 0)
      r = "cannot become " + std::to_string(uid) + ":" + std::to_string(gid);
    else {
      ::umask(002);
      r = fn();
    }
    (void)!::write(fds[1], r.data(), r.size());
    std::fflush(nullptr);  // _exit skips it: keep what the child printed
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string out;
  char buf[512];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, size_t(n));
  ::close(fds[0]);
  int rc = wait_exit(pid);
  return rc == 0 ? out : out + " (child exit " + std::to_string(rc) + ")";
}

/// Runs a shell command, returns (exit code, stdout+stderr).
inline std::pair<int, std::string> run_cmd(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  size_t n;
  while (p && (n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int st = p ? ::pclose(p) : -1;
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

template <class Pred>
bool wait_until(Pred p, double timeout_s) {
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < end) {
    if (p()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return p();
}

}  // namespace smla::cache::test
