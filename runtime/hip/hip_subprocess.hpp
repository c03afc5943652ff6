// hip_subprocess.hpp: helper processes for hipRTC (spawn, wait, temp dirs). POSIX only.
#pragma once
#include <string>
#include <vector>

namespace smla::hip {

struct ChildStatus {
  bool started = false;
  bool exited = false;  // normal exit (then `code`), else killed by `signal`
  int code = -1;
  int signal = 0;
  bool timed_out = false;  // still running after `timeout_s`: killed (SIGKILL) and reaped
  double timeout_s = 0;
  /// It ended, but its exit status could not be collected (waitpid: ECHILD), as when the host
  /// process sets SIGCHLD to SIG_IGN: the kernel reaps the child itself. The caller judges it by
  /// what it wrote (the hipRTC worker writes a status file last).
  bool lost = false;
  double seconds = 0;
  std::string spawn_error;
  /// "exit status 2", "killed by signal 6 (Aborted)", "timed out after 600 s (killed)",
  /// "could not start: ...".
  std::string describe() const;
};

/// Seconds a worker may run before it is killed: SMLA_HIPRTC_TIMEOUT_S (a positive number),
/// default 600. Read at every call; a value that cannot be read is ignored with a warning (once).
double hip_worker_timeout_s();

namespace detail {
constexpr double kDefaultWorkerTimeoutS = 600;
/// SMLA_HIPRTC_TIMEOUT_S's value `v` (null: unset) as seconds; kDefaultWorkerTimeoutS, with
/// `warning` saying why, when it is not a positive finite number.
double parse_timeout_s(const char* v, std::string* warning);
/// Tests: spawn as with a C library that has no closefrom action (glibc < 2.34), closing the descriptors /proc/self/fd
/// lists instead. Set before any spawn, from one thread.
extern bool g_close_by_listing;
}  // namespace detail

/// The environment `env` (NULL-terminated, like environ) plus AMD_COMGR_CACHE=0 unless it sets
/// AMD_COMGR_CACHE, and SMLA_LIBHIP naming the HIP runtime this process opened unless it sets
/// SMLA_LIBHIP: what a hipRTC worker runs with.
std::vector<std::string> worker_environment(const char* const* env);

/// Runs each argv (argv[0] is the executable path) with at most `jobs` at once, in the
/// environment worker_environment(environ), with no signal blocked and SIGCHLD and SIGPIPE at
/// their defaults; waits for its own children only (never waitpid(-1), which would reap the host
/// application's children).
/// When `output_files` is given, child i's stdout and stderr go to output_files[i] (hipRTC and
/// LLVM print their fatal errors there). A child still running `timeout_s` seconds after its start
/// (> 0; <= 0: no limit) is killed with SIGKILL, reaped, and reported as timed out.
std::vector<ChildStatus> run_children(const std::vector<std::vector<std::string>>& argvs, int jobs,
                                      const std::vector<std::string>& output_files = {}, double timeout_s = 0);

/// A fresh directory $TMPDIR/<prefix>.<host>.<pid>.XXXXXX, removed with its content on
/// destruction. The first one of a prefix in a process removes those that dead processes of this
/// host left behind (detail::clean_stale_temp_dirs): an interrupted process leaves its own.
/// Throws smla::Error naming $TMPDIR when it cannot be created.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

namespace detail {
/// This host's name as the temporary directories carry it (the disk cache's owner tags: '/' and ' ' replaced).
const std::string& host_name();
/// Removes, under `dir`, this user's directories `<prefix>.<host>.<pid>.<random>` by the disk cache's rule for its
/// staging (cache::detail::owner_gone): of this host, whose process is gone (kill(pid, 0): ESRCH) and that nothing
/// modified for `min_age_s` seconds (a dead pid alone is no proof: another PID namespace may share the host name), or
/// untouched for a day whoever made them; and those of the older spelling `<prefix>-XXXXXX` (no owner recorded)
/// untouched for a day. Returns how many.
int clean_stale_temp_dirs(const std::string& dir, const std::string& prefix, long min_age_s);
/// How old a dead process's directory must be before TempDir removes it: an hour.
constexpr long kStaleTempDirS = 3600;
}  // namespace detail

}  // namespace smla::hip
