// lock_file.hpp (internal): an exclusive flock on a lock file that neither a fork() nor an exec()
// carries away. Used by the kernel cache (one lock per key) and the tuning database.
//
// flock belongs to the open file description, which a fork() shares with the child: a worker
// forked while another thread held the lock kept it held until the worker exited, although the
// parent had closed its descriptor. So:
//   - descriptors are opened O_CLOEXEC (an exec'd child never has them);
//   - every descriptor of this process's lock files is in a registry, and a pthread_atfork child
//     handler closes the child's copies (never LOCK_UN: that would release the parent's lock);
//   - the owning process releases with LOCK_UN before closing, so the lock goes at once even if
//     some child got the descriptor by a path the atfork handler does not see (clone, vfork);
//   - a LockFile used in a child of the process that opened it does nothing to the descriptor
//     number (the child handler closed it; the number may be reused by now).
// Lock files may be removed (remove_unused, by prune/clear/eviction of the kernel cache): a
// remover unlinks only a file it holds locked, and a locker checks after locking that the path
// still names the file it locked (fstat against stat), starting over otherwise.
#pragma once
#include <sys/types.h>

#include <functional>
#include <string>

namespace smla::cache::detail {

class LockFile {
 public:
  enum Result { Acquired, TimedOut, Stopped, Unavailable };
  LockFile() = default;
  ~LockFile() { release(); }
  LockFile(const LockFile&) = delete;
  LockFile& operator=(const LockFile&) = delete;

  /// Opens `path` (created 0666 less the umask; opened read-only when it exists but is not
  /// writable by us, which flock does not need) and takes an exclusive lock, polling until
  /// `timeout_s` has passed (TimedOut) or `stop`, called between polls, returns true (Stopped).
  /// Unavailable: the file cannot be opened or locked; `*err` (if given) says why.
  Result acquire(const std::string& path, double timeout_s, const std::function<bool()>& stop = {},
                 std::string* err = nullptr);
  /// Unlocks and closes (only in the process that acquired it). Idempotent.
  void release();
  bool held() const { return fd_ >= 0; }

  /// Unlinks the lock file at `path` if nobody holds it (see above: safe against lockers that
  /// opened it before). True when it is gone (or was already); false when it is in use or could
  /// not be removed.
  static bool remove_unused(const std::string& path);

  /// "pid N" (or "pids N, M") holding an flock on the file at `path`, from /proc/locks; "" when
  /// unknown. For messages only.
  static std::string holders(const std::string& path);

 private:
  int fd_ = -1;
  pid_t owner_ = 0;
};

}  // namespace smla::cache::detail
