// lock_file.cpp: LockFile and the registry of lock descriptors that a fork()ed child closes.
#include "lock_file.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

namespace smla::cache::detail {
namespace {

// The registry: descriptors of lock files this process has open, which a fork()ed child closes.
// Its mutex is taken by the fork's prepare handler, so a fork never runs while the list changes.
// open() and close() run outside it (on a slow filesystem they may block, and fork() with them);
// a fork while a descriptor is opened but not yet registered is seen by the generation count,
// and that descriptor is closed and opened anew (the child's copy of it was never locked). One
// unregistered already is unlocked: LOCK_UN comes first.
pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
std::vector<int>* g_fds = nullptr;  // never freed: threads may still lock at exit
std::atomic<uint64_t> g_forks{0};   // forks this process made; changed under g_mu
pthread_once_t g_once = PTHREAD_ONCE_INIT;

void before_fork() { pthread_mutex_lock(&g_mu); }
void after_fork_parent() {
  ++g_forks;
  pthread_mutex_unlock(&g_mu);
}
void after_fork_child() {
  // Only the thread that forked lives on here, and it holds g_mu (taken in before_fork). The
  // locks are the parent's: drop the child's references to them without LOCK_UN, which would
  // release them for the parent as well.
  for (int fd : *g_fds) ::close(fd);
  g_fds->clear();
  pthread_mutex_unlock(&g_mu);
}

void init_registry() {
  g_fds = new std::vector<int>();
  g_fds->reserve(16);
  pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

int open_registered(const std::string& path, bool create, int* err) {
  pthread_once(&g_once, init_registry);
  for (;;) {
    const uint64_t gen = g_forks.load();
    // O_NOFOLLOW: a link planted where a lock file goes is not followed (to truncate or create a file elsewhere).
    int fd = ::open(path.c_str(), O_RDWR | (create ? O_CREAT : 0) | O_CLOEXEC | O_NOFOLLOW, 0666);
    *err = errno;
    // Another user's file in a shared directory, created without group write: flock needs only
    // an open descriptor. When that fails too, the first open's reason is the one to report
    // (EACCES on the directory, not the retry's ENOENT).
    if (fd < 0 && *err == EACCES) {
      fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
      if (fd >= 0) *err = 0;
    }
    if (fd < 0) return fd;
    pthread_mutex_lock(&g_mu);
    const bool forked = g_forks.load() != gen;
    if (!forked) {
      try {
        g_fds->push_back(fd);
      } catch (...) {  // out of memory: better no lock than an unregistered one
        pthread_mutex_unlock(&g_mu);
        ::close(fd);
        *err = ENOMEM;
        return -1;
      }
    }
    pthread_mutex_unlock(&g_mu);
    if (!forked) return fd;
    ::close(fd);  // a child has it, unregistered: use another
  }
}

void close_registered(int fd) {
  pthread_mutex_lock(&g_mu);
  auto it = std::find(g_fds->begin(), g_fds->end(), fd);
  if (it != g_fds->end()) g_fds->erase(it);
  pthread_mutex_unlock(&g_mu);
  ::close(fd);
}

// After locking: whether `path` still names the file `fd` locked. A remover (remove_unused) may
// have unlinked it between our open and our lock; a lock on that orphan excludes nobody.
bool still_at_path(int fd, const std::string& path) {
  struct stat a {}, b {};
  if (::fstat(fd, &a) != 0 || ::stat(path.c_str(), &b) != 0) return false;
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

}  // namespace

LockFile::Result LockFile::acquire(const std::string& path, double timeout_s,
                                   const std::function<bool()>& stop, std::string* err) {
  release();
  auto fail = [&](const std::string& what, int e) {
    if (err) *err = what + " " + path + ": " + std::strerror(e);
    release();
    return Unavailable;
  };
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(std::max(0.0, timeout_s));
  int sleep_ms = 2;
  for (;;) {
    if (fd_ < 0) {
      int e = 0;
      fd_ = open_registered(path, true, &e);
      if (fd_ < 0) return fail("cannot open lock file", e);
      owner_ = ::getpid();
    }
    if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) {
      if (still_at_path(fd_, path)) return Acquired;
      release();  // removed while we waited: lock whatever file the path names now
      if (std::chrono::steady_clock::now() >= deadline) return TimedOut;
      // Not a spin where stat and fstat never agree (an odd filesystem): a short pause between tries.
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      continue;
    }
    if (errno != EWOULDBLOCK && errno != EINTR) return fail("cannot lock", errno);
    if (stop && stop()) {
      release();
      return Stopped;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      release();
      return TimedOut;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    sleep_ms = std::min(sleep_ms * 2, 50);
  }
}

void LockFile::release() {
  if (fd_ < 0) return;
  // In a child of the process that opened it, the atfork handler has closed the descriptor.
  if (owner_ == ::getpid()) {
    ::flock(fd_, LOCK_UN);  // harmless when not locked
    close_registered(fd_);
  }
  fd_ = -1;
}

bool LockFile::remove_unused(const std::string& path) {
  int e = 0;
  int fd = open_registered(path, false, &e);
  if (fd < 0) return e == ENOENT;
  // Unlinked only while we hold it and it is still the file at `path`: a locker that opened it
  // before the unlink finds, once it gets the lock, that the path names another file or none,
  // and starts over (acquire); one that holds it now makes our LOCK_NB fail.
  bool removed = ::flock(fd, LOCK_EX | LOCK_NB) == 0 && still_at_path(fd, path) &&
                 ::unlink(path.c_str()) == 0;
  ::flock(fd, LOCK_UN);
  close_registered(fd);
  return removed;
}

std::string LockFile::holders(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "";
  char id[64];
  std::snprintf(id, sizeof id, "%02x:%02x:%llu", major(st.st_dev), minor(st.st_dev),
                (unsigned long long)st.st_ino);
  std::ifstream in("/proc/locks");
  std::vector<std::string> pids;
  // "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"; waiters are listed as "1: -> FLOCK ...".
  for (std::string line; std::getline(in, line);) {
    std::istringstream ls(line);
    std::string n, kind, adv, mode, pid, dev;
    ls >> n >> kind;
    if (kind == "->") continue;
    ls >> adv >> mode >> pid >> dev;
    if (kind == "FLOCK" && dev == id && std::find(pids.begin(), pids.end(), pid) == pids.end())
      pids.push_back(pid);
  }
  if (pids.empty()) return "";
  std::string s = pids.size() == 1 ? "pid " : "pids ";
  for (size_t i = 0; i < pids.size(); ++i) s += (i ? ", " : "") + pids[i];
  return s;
}

}  // namespace smla::cache::detail
