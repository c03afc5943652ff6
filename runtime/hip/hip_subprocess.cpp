// hip_subprocess.cpp: see hip_subprocess.hpp.
#include "hip_subprocess.hpp"

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <mutex>
#include <set>
#include <thread>

#include "../../cache/entry_store.hpp"
#include "../threads.hpp"
#include "hip_api.hpp"
#include "hip_log.hpp"
#include "hiprtc_compiler.hpp"
#include "smla/smla.hpp"

extern char** environ;

namespace smla::hip {
namespace fs = std::filesystem;

namespace {

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

}  // namespace

std::string ChildStatus::describe() const {
  if (!started) return "could not start: " + spawn_error;
  if (lost)
    return "ended, but its exit status was lost (waitpid: no child: does this process set SIGCHLD to SIG_IGN?)";
  if (timed_out) return "timed out after " + seconds_text(timeout_s) + " s (killed; SMLA_HIPRTC_TIMEOUT_S sets the limit)";
  if (exited) return "exit status " + std::to_string(code);
  return "killed by signal " + std::to_string(signal) + " (" + strsignal(signal) + ")";
}

namespace detail {
bool g_close_by_listing = false;

double parse_timeout_s(const char* v, std::string* warning) {
  if (!v || !*v) return kDefaultWorkerTimeoutS;
  char* end = nullptr;
  errno = 0;
  const double d = std::strtod(v, &end);
  if (end != v && *end == '\0' && errno == 0 && std::isfinite(d) && d > 0) return d;
  if (warning)
    *warning = std::string("ignoring SMLA_HIPRTC_TIMEOUT_S='") + v + "' (expected a positive number of seconds); using " +
               seconds_text(kDefaultWorkerTimeoutS);
  return kDefaultWorkerTimeoutS;
}
}  // namespace detail

double hip_worker_timeout_s() {
  std::string warning;
  const double t = detail::parse_timeout_s(std::getenv("SMLA_HIPRTC_TIMEOUT_S"), &warning);
  if (!warning.empty()) detail::warn_once(warning);
  return t;
}

namespace {

int open_pidfd(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  return -1;
#endif
}

// SIGKILL through the pidfd where there is one: it cannot reach another process that reused the pid.
void kill_child(pid_t pid, int pidfd) {
#ifdef SYS_pidfd_send_signal
  if (pidfd >= 0 && ::syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, nullptr, 0) == 0) return;
#endif
  (void)pidfd;
  ::kill(pid, SIGKILL);
}

// Close actions for every descriptor from 3 up that this process holds now, for a C library without a closefrom action
// (glibc < 2.34, on ROCm's RHEL 8 hosts among others): /proc/self/fd lists them. One opened after the listing is still
// inherited; one closed since is no error (glibc's and musl's spawn ignore a close action's EBADF). Without /proc,
// nothing is added and the descriptors not marked close-on-exec reach the child, as before.
void add_close_actions_by_listing(posix_spawn_file_actions_t* actions) {
  DIR* d = ::opendir("/proc/self/fd");
  if (!d) return;
  const int own = ::dirfd(d);
  while (const dirent* e = ::readdir(d)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end || fd < 3 || fd == own || fd > INT32_MAX) continue;
    posix_spawn_file_actions_addclose(actions, static_cast<int>(fd));
  }
  ::closedir(d);
}

ChildStatus run_one(const std::vector<std::string>& argv, const std::string& output, char* const* envp,
                    double timeout_s) {
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
  // The host's descriptors not marked close-on-exec (pipes, sockets) are no business of the worker's: held open in it
  // for up to the compile's time limit, a host's pipe reader saw no end of file, a listening port stayed busy.
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
  if (!detail::g_close_by_listing)
    posix_spawn_file_actions_addclosefrom_np(&actions, 3);
  else
#endif
    add_close_actions_by_listing(&actions);
  // The host's signal mask and ignored SIGCHLD / SIGPIPE are no business of the child's.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGCHLD);
  sigaddset(&defaults, SIGPIPE);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  int rc = posix_spawn(&pid, args[0], &actions, &attr, args.data(), envp);
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    st.spawn_error = std::string(args[0]) + ": " + std::strerror(rc);
    return st;
  }
  st.started = true;
  // Wait for this child only, polling so that a hung one is noticed: on its pidfd where the kernel
  // has them (woken when it ends), else by sleeps of 1 ms growing to 50 ms.
  const int pidfd = open_pidfd(pid);
  int status = 0;
  int sleep_ms = 1;
  for (;;) {
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == ECHILD) {  // reaped by the kernel (SIGCHLD ignored): ended, status unknown
        st.lost = true;
        break;
      }
      st.spawn_error = std::string("waitpid: ") + std::strerror(errno);
      st.started = false;
      if (pidfd >= 0) close(pidfd);
      return st;
    }
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (timeout_s > 0 && elapsed >= timeout_s) {
      kill_child(pid, pidfd);
      while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      st.timed_out = true;
      st.timeout_s = timeout_s;
      break;
    }
    const double left_ms = timeout_s > 0 ? (timeout_s - elapsed) * 1000 + 1 : 1000;
    const int wait_ms = static_cast<int>(std::max(1.0, std::min(1000.0, left_ms)));
    if (pidfd >= 0) {
      pollfd p{pidfd, POLLIN, 0};
      ::poll(&p, 1, wait_ms);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min(sleep_ms, wait_ms)));
      sleep_ms = std::min(sleep_ms * 2, 50);
    }
  }
  if (pidfd >= 0) close(pidfd);
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (st.timed_out || st.lost) return st;
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
  bool user_set = false, libhip_set = false;
  for (; env && *env; ++env) {
    out.emplace_back(*env);
    user_set = user_set || out.back().rfind("AMD_COMGR_CACHE=", 0) == 0;
    libhip_set = libhip_set || out.back().rfind("SMLA_LIBHIP=", 0) == 0;
  }
  // comgr (ROCm >= 7) keeps its own on-disk cache by default, under ours: redundant, and it
  // crashed with SIGBUS on NFS under contention (CACHE-LESSONS.md). Off unless the user chose.
  // Older comgr ignores the variable.
  if (!user_set) out.emplace_back("AMD_COMGR_CACHE=0");
  // The worker compiles with the HIP runtime (and the hipRTC beside it) this process uses, one already loaded here
  // (a framework's) included: the binary, the cache key's identity and the runtime that loads it agree.
  if (!libhip_set)
    if (const Api* api = Api::get(); api && !api->hip_library.empty()) out.emplace_back("SMLA_LIBHIP=" + api->hip_library);
  return out;
}

std::vector<ChildStatus> run_children(const std::vector<std::vector<std::string>>& argvs, int jobs,
                                      const std::vector<std::string>& output_files, double timeout_s) {
  std::vector<ChildStatus> out(argvs.size());
  std::vector<std::string> env = worker_environment(environ);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(&e[0]);
  envp.push_back(nullptr);
  std::atomic<size_t> next{0};
  auto worker = [&](int) {
    for (size_t i; (i = next++) < argvs.size();)
      out[i] = run_one(argvs[i], i < output_files.size() ? output_files[i] : "", envp.data(), timeout_s);
  };
  // (a thread that cannot start leaves its share to the others and to this one)
  on_threads(int(std::min<size_t>(static_cast<size_t>(std::max(1, jobs)), argvs.size())), worker);
  return out;
}

namespace detail {

const std::string& host_name() { return cache::detail::host_name(); }

int clean_stale_temp_dirs(const std::string& dir, const std::string& prefix, long min_age_s) {
  int removed = 0;
  const time_t now = time(nullptr);
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    struct stat st {};
    if (lstat(it->path().c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid()) continue;
    const long age = static_cast<long>(now - st.st_mtime);
    bool stale = false;
    if (name.size() == prefix.size() + 7 && name.compare(0, prefix.size() + 1, prefix + "-") == 0) {
      stale = age > 24 * 3600;  // the older spelling: no owner to ask
    } else if (name.compare(0, prefix.size() + 1, prefix + ".") == 0) {
      // <prefix>.<owner tag>: the disk cache's rule for its staging (owner on this host dead, and older than
      // min_age_s), or untouched for a day whoever made it.
      stale = cache::detail::owner_gone(name.substr(prefix.size() + 1), int64_t(age) * 1000000000LL, 86400,
                                        min_age_s);
    }
    if (!stale) continue;
    std::error_code rec;
    fs::remove_all(it->path(), rec);
    if (!rec) ++removed;
  }
  return removed;
}

}  // namespace detail

TempDir::TempDir(const std::string& prefix) {
  std::error_code ec;
  const fs::path tmp = fs::temp_directory_path(ec);
  if (ec) {
    const char* env = std::getenv("TMPDIR");
    throw Error(Status::Internal,
                "no temporary directory for " + prefix + ": " + ec.message() +
                    (env ? std::string(" (TMPDIR='") + env + "': set it to an existing writable directory)" : ""),
                __FILE__, __LINE__, "mkdtemp");
  }
  {
    // Once per (directory, prefix) in a process: what interrupted processes left behind.
    static std::mutex m;
    static std::set<std::string> cleaned;
    bool first = false;
    {
      std::lock_guard<std::mutex> lk(m);
      first = cleaned.insert(tmp.string() + "\n" + prefix).second;
    }
    if (first) detail::clean_stale_temp_dirs(tmp.string(), prefix, detail::kStaleTempDirS);
  }
  std::string tmpl =
      (tmp / (prefix + "." + detail::host_name() + "." + std::to_string(getpid()) + ".XXXXXX")).string();
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
