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
}  // namespace detail

/// The environment `env` (NULL-terminated, like environ) plus AMD_COMGR_CACHE=0 unless it sets
/// AMD_COMGR_CACHE: what a hipRTC worker runs with.
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

/// A fresh directory under $TMPDIR, removed with its content on destruction.
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

}  // namespace smla::hip
