// hip_subprocess.cpp: see hip_subprocess.hpp.
#include "hip_subprocess.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "hip_log.hpp"
#include "hiprtc_compiler.hpp"
#include "smla/smla.hpp"

extern char** environ;

namespace smla::hip {
namespace fs = std::filesystem;

std::string ChildStatus::describe() const {
  if (!started) return "could not start: " + spawn_error;
  if (exited) return "exit status " + std::to_string(code);
  return "killed by signal " + std::to_string(signal) + " (" + strsignal(signal) + ")";
}

namespace {

ChildStatus run_one(const std::vector<std::string>& argv, const std::string& output, char* const* envp) {
  ChildStatus st;
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  auto t0 = std::chrono::steady_clock::now();
  pid_t pid = 0;
  // posix_spawn, not fork: safe from a multi-threaded host process and cheap on a large one.
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!output.empty()) {
    posix_spawn_file_actions_addopen(&actions, 1, output.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
  }
  int rc = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), envp);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    st.spawn_error = std::string(args[0]) + ": " + std::strerror(rc);
    return st;
  }
  st.started = true;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      st.spawn_error = std::string("waitpid: ") + std::strerror(errno);
      st.started = false;
      return st;
    }
  }
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (WIFEXITED(status)) {
    st.exited = true;
    st.code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    st.signal = WTERMSIG(status);
  }
  return st;
}

bool executable(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec) && access(p.c_str(), X_OK) == 0;
}

}  // namespace

std::vector<std::string> worker_environment(const char* const* env) {
  std::vector<std::string> out;
  bool user_set = false;
  for (; env && *env; ++env) {
    out.emplace_back(*env);
    user_set = user_set || out.back().rfind("AMD_COMGR_CACHE=", 0) == 0;
  }
  // comgr (ROCm >= 7) keeps its own on-disk cache by default, under ours: redundant, and it
  // crashed with SIGBUS on NFS under contention (CACHE-LESSONS.md). Off unless the user chose.
  // Older comgr ignores the variable.
  if (!user_set) out.emplace_back("AMD_COMGR_CACHE=0");
  return out;
}

std::vector<ChildStatus> run_children(const std::vector<std::vector<std::string>>& argvs, int jobs,
                                      const std::vector<std::string>& output_files) {
  std::vector<ChildStatus> out(argvs.size());
  std::vector<std::string> env = worker_environment(environ);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(&e[0]);
  envp.push_back(nullptr);
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i; (i = next++) < argvs.size();)
      out[i] = run_one(argvs[i], i < output_files.size() ? output_files[i] : "", envp.data());
  };
  std::vector<std::thread> pool;
  size_t n = std::min<size_t>(static_cast<size_t>(std::max(1, jobs)), argvs.size());
  for (size_t t = 0; t < n; ++t) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
  return out;
}

TempDir::TempDir(const std::string& prefix) {
  std::string tmpl = (fs::temp_directory_path() / (prefix + "-XXXXXX")).string();
  if (!mkdtemp(&tmpl[0]))
    throw Error(Status::Internal, "cannot create a temporary directory " + tmpl + ": " + std::strerror(errno),
                __FILE__, __LINE__, "mkdtemp");
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

std::string hip_worker_path(const std::string& hint) {
  const char* name = "smla-hiprtc-worker";
  if (!hint.empty()) return executable(hint) ? hint : "";
  if (const char* env = std::getenv("SMLA_HIPRTC_WORKER"); env && *env) {
    if (executable(env)) return env;
    detail::warn_once(std::string("ignoring SMLA_HIPRTC_WORKER='") + env +
                      "' (expected the path of the smla-hiprtc-worker executable)");
  }
  std::vector<fs::path> dirs;
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) dirs.push_back(exe.parent_path());
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&hip_worker_path), &info) && info.dli_fname) {
    fs::path lib = fs::absolute(info.dli_fname, ec).parent_path();
    dirs.push_back(lib);
    dirs.push_back(lib.parent_path() / "bin");
  }
#ifdef SMLA_HIPRTC_WORKER_DIR
  dirs.push_back(SMLA_HIPRTC_WORKER_DIR);  // the build tree, for tests and development
#endif
  for (const auto& d : dirs)
    if (executable(d / name)) return (d / name).string();
  return "";
}

}  // namespace smla::hip
