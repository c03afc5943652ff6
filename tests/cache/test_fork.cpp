// The cross-process compile lock when the process fork()s (DataLoader workers) or is killed,
// waiters that find the entry published while the lock is still held by someone, and lock files
// removed by prune/clear/eviction without breaking the exclusion.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/file.h>

#include <condition_variable>
#include <mutex>

#include "lock_file.hpp"
#include "logger.hpp"
#include "test_util.hpp"

extern char** environ;

// flock(2) of this test binary: libc's, after running once whatever a test put in g_before_flock
// (so that a test can act in the window between a caller's open and its flock). Defined here, it is
// what the cache's code calls in this process.
static std::atomic<void (*)()> g_before_flock{nullptr};
extern "C" int flock(int fd, int op) {
  if (auto hook = g_before_flock.exchange(nullptr)) hook();
  static const auto real = reinterpret_cast<int (*)(int, int)>(::dlsym(RTLD_NEXT, "flock"));
  return real(fd, op);
}

namespace smla::cache::test {

namespace {

// Holds a fake compile until released (in this process only).
struct Gate {
  std::mutex m;
  std::condition_variable cv;
  bool open = false;
  std::atomic<bool> entered{false};
  void wait() {
    entered = true;
    std::unique_lock<std::mutex> l(m);
    cv.wait(l, [&] { return open; });
  }
  void release() {
    std::lock_guard<std::mutex> l(m);
    open = true;
    cv.notify_all();
  }
};

std::vector<std::string> lock_files(const std::string& dir) {
  std::vector<std::string> v;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), e; !ec && it != e; it.increment(ec))
    if (it->path().extension() == ".lock") v.push_back(it->path().string());
  std::sort(v.begin(), v.end());
  return v;
}

// True when nobody holds an flock on `path` (flock conflicts between open file descriptions even
// inside one process).
bool lock_free(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool ok = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
  ::close(fd);
  return ok;
}

// Exit code of `pid`, or -1 if it is still running after `timeout_s` (then it is killed).
int wait_exit_within(pid_t pid, double timeout_s) {
  int st = 0;
  bool done = wait_until([&] { return ::waitpid(pid, &st, WNOHANG) == pid; }, timeout_s);
  if (!done) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &st, 0);
    return -1;
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

}  // namespace

// A waiter polls the lock; the entry appears on disk while the lock is still held (here by a
// compile that is stuck; in the field, by a forked worker that inherited it). The waiter must
// take the entry as soon as it is there, not wait for the lock or its timeout.
TEST(ForkAndLock, WaiterTakesTheEntryPublishedWhileTheLockIsHeld) {
  TempDir t;
  Settings s = settings_for(t);
  s.lock_timeout_s = 60;
  KeyFields f = fields("k0");
  DiskCache holder(s), waiter(s);
  Gate g;
  std::thread a([&] { holder.get_or_compile(f, [&] { g.wait(); return CompileOutput{payload(f), "a"}; }); });
  ASSERT_TRUE(wait_until([&] { return g.entered.load(); }, 10));
  ASSERT_EQ(lock_files(t / "locks").size(), 1u);
  ASSERT_FALSE(lock_free(lock_files(t / "locks")[0])) << "the holder has the lock";

  FakeCompiler wc;
  std::atomic<bool> done{false};
  Fetched got;
  std::thread w([&] {
    got = waiter.get_or_compile(f, wc.fn(f));
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the waiter polls the lock
  EXPECT_FALSE(done.load());
  // Another process (no lock) publishes the key meanwhile.
  Settings nolock = s;
  nolock.lock = false;
  FakeCompiler pc;
  EXPECT_EQ(DiskCache(nolock).get_or_compile(f, pc.fn(f)).origin, Origin::Compiled);
  bool in_time = wait_until([&] { return done.load(); }, 5);
  EXPECT_TRUE(in_time) << "the waiter kept polling the lock although the entry was published";
  g.release();
  a.join();
  w.join();
  EXPECT_EQ(got.origin, Origin::Disk);
  EXPECT_EQ(got.binary, payload(f));
  EXPECT_EQ(wc.calls, 0);
}

// A worker forked while another thread compiles: once the parent has published, nobody holds
// the lock, although the worker lives on (a DataLoader worker lives for an epoch).
TEST(ForkAndLock, ForkedWorkerDoesNotKeepTheLockAfterThePublish) {
  TempDir t;
  Settings s = settings_for(t);
  DiskCache c(s);
  KeyFields f = fields("k0");
  Gate g;
  std::thread a([&] { c.get_or_compile(f, [&] { g.wait(); return CompileOutput{payload(f), "a"}; }); });
  ASSERT_TRUE(wait_until([&] { return g.entered.load(); }, 10));
  ASSERT_EQ(lock_files(t / "locks").size(), 1u);
  const std::string lock = lock_files(t / "locks")[0];
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  std::fflush(nullptr);
  pid_t worker = ::fork();
  if (worker == 0) {  // lives until the test closes the pipe
    ::close(p[1]);
    char b;
    (void)!::read(p[0], &b, 1);
    ::_exit(0);
  }
  ::close(p[0]);
  EXPECT_FALSE(lock_free(lock)) << "the compiling thread holds it";
  g.release();
  a.join();
  EXPECT_TRUE(lock_free(lock)) << "the forked worker still holds the lock of a published kernel";
  ::close(p[1]);
  EXPECT_EQ(wait_exit_within(worker, 10), 0);
}

// A forked child asks for the key its parent's other thread was compiling at the fork: the
// per-key mutex (locked at the fork by a thread the child does not have) must not hang it.
TEST(ForkAndLock, ChildGetsTheKeyItsParentWasCompiling) {
  TempDir t;
  Settings s = settings_for(t);
  DiskCache c(s);
  KeyFields f = fields("k0");
  Gate g;
  std::thread a([&] { c.get_or_compile(f, [&] { g.wait(); return CompileOutput{payload(f), "a"}; }); });
  ASSERT_TRUE(wait_until([&] { return g.entered.load(); }, 10));
  std::fflush(nullptr);
  pid_t child = ::fork();
  if (child == 0) {
    FakeCompiler fc;
    Fetched r = c.get_or_compile(f, fc.fn(f));
    // The parent publishes while this child waits: it must find that entry, not compile.
    ::_exit(r.binary == payload(f) && r.origin == Origin::Disk && fc.calls == 0 ? 0 : 1);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  g.release();
  a.join();
  int rc = wait_exit_within(child, 15);
  EXPECT_NE(rc, -1) << "the child hung (a mutex locked at the fork by another thread)";
  EXPECT_EQ(rc, 0) << "the child compiled or got a wrong binary";
  // And the child's own key map is its own: a second key compiles normally in another child.
  std::fflush(nullptr);
  child = ::fork();
  if (child == 0) {
    KeyFields h = fields("k1");
    FakeCompiler fc;
    Fetched r = c.get_or_compile(h, fc.fn(h));
    ::_exit(r.binary == payload(h) && r.origin == Origin::Compiled && fc.calls == 1 ? 0 : 1);
  }
  EXPECT_EQ(wait_exit_within(child, 15), 0);
}

// The process that holds the lock is killed mid-compile while a worker it started lives on:
// forked (inherits the descriptor, no exec) or spawned (exec: the descriptor must be close-on-exec).
// The lock must be free at once, not when the worker exits.
static void killed_holder_with_worker(bool exec_worker) {
  TempDir t;
  Settings s = settings_for(t);
  const std::string compiling = t / "compiling", worker_file = t / "worker";
  std::fflush(nullptr);
  pid_t holder = ::fork();
  if (holder == 0) {
    DiskCache c(s);
    KeyFields f = fields("k0");
    std::thread a([&] {
      c.get_or_compile(f, [&] {
        ::close(::open(compiling.c_str(), O_WRONLY | O_CREAT, 0644));
        std::this_thread::sleep_for(std::chrono::seconds(120));
        return CompileOutput{payload(f), ""};
      });
    });
    wait_until([&] { return fs::exists(compiling); }, 20);
    pid_t w = -1;
    if (exec_worker) {
      char arg0[] = "sleep", arg1[] = "60";
      char* argv[] = {arg0, arg1, nullptr};
      if (::posix_spawn(&w, "/bin/sleep", nullptr, nullptr, argv, environ) != 0) ::_exit(2);
    } else {
      w = ::fork();
      if (w == 0) {
        std::this_thread::sleep_for(std::chrono::seconds(60));
        ::_exit(0);
      }
    }
    std::ofstream(worker_file + ".tmp") << w;
    ::rename((worker_file + ".tmp").c_str(), worker_file.c_str());
    std::this_thread::sleep_for(std::chrono::seconds(120));
    ::_exit(0);
  }
  ASSERT_TRUE(wait_until([&] { return fs::exists(worker_file); }, 20)) << "no worker";
  pid_t worker = std::stoi(slurp(worker_file));
  ASSERT_EQ(lock_files(t / "locks").size(), 1u);
  const std::string lock = lock_files(t / "locks")[0];
  EXPECT_FALSE(lock_free(lock)) << "the compiling process holds it";
  ::kill(holder, SIGKILL);
  EXPECT_EQ(wait_exit(holder), 128 + SIGKILL);
  EXPECT_TRUE(wait_until([&] { return lock_free(lock); }, 2))
      << "the " << (exec_worker ? "spawned" : "forked") << " worker of a killed holder keeps its lock";
  ::kill(worker, SIGKILL);  // reparented: init reaps it
}

TEST(ForkAndLock, ForkedWorkerOfAKilledHolderDoesNotHoldItsLock) { killed_holder_with_worker(false); }
TEST(ForkAndLock, SpawnedWorkerOfAKilledHolderDoesNotHoldItsLock) { killed_holder_with_worker(true); }

static std::string lock_name(const std::string& kernel, const std::string& head = "") {
  return head + make_key(fields(kernel)).digest + ".lock";
}

static std::vector<std::string> names(const std::vector<std::string>& paths) {
  std::vector<std::string> v;
  for (const auto& p : paths) v.push_back(fs::path(p).filename().string());
  return v;
}

// One lock file per key ever compiled used to stay for ever. prune and clear remove those of keys
// without an entry, except one held right now (a compile in flight).
TEST(LockFiles, PruneAndClearRemoveLocksOfAbsentKeys) {
  TempDir t;
  Settings s = settings_for(t);
  s.lock_dir = "";  // the default: <cache>/.locks
  DiskCache c(s);
  for (int i = 0; i < 4; ++i) {
    KeyFields f = fields("k" + std::to_string(i));
    c.get_or_compile(f, [&] { return CompileOutput{payload(f), ""}; });
  }
  const std::string locks = t / "cache/.locks";
  ASSERT_EQ(lock_files(locks).size(), 4u);
  const int64_t one = c.list().at(0).bytes;
  BulkResult pr = c.prune(2 * one + one / 2);
  EXPECT_EQ(pr.done, 2);
  std::vector<std::string> want;
  for (const auto& e : c.list()) want.push_back(e.name.substr(e.name.rfind('-') + 1) + ".lock");
  std::sort(want.begin(), want.end());
  ASSERT_EQ(want.size(), 2u);
  EXPECT_EQ(names(lock_files(locks)), want) << "prune keeps exactly the locks of the entries left";

  // A compile in flight in another "process" (own DiskCache) holds its key's lock: clear keeps it.
  DiskCache other(s);
  KeyFields g9 = fields("k9");
  Gate g;
  std::thread a([&] { other.get_or_compile(g9, [&] { g.wait(); return CompileOutput{payload(g9), ""}; }); });
  ASSERT_TRUE(wait_until([&] { return g.entered.load(); }, 10));
  BulkResult cr = c.clear();
  EXPECT_EQ(cr.done, 2);
  EXPECT_EQ(names(lock_files(locks)), std::vector<std::string>{lock_name("k9")});
  EXPECT_FALSE(lock_free(locks + "/" + lock_name("k9"))) << "still held by its compile";
  g.release();
  a.join();
  EXPECT_EQ(c.clear().done, 1);
  EXPECT_TRUE(lock_files(locks).empty());
}

// Eviction past SMLA_CACHE_MAX_BYTES removes the evicted keys' locks too; in a lock directory
// shared by several caches (SMLA_CACHE_LOCK_DIR), another cache's lock files are left alone.
TEST(LockFiles, EvictionRemovesTheLocksOfEvictedKeys) {
  TempDir t;
  Settings probe = settings_for(t, "probe");
  probe.lock = false;
  KeyFields f0 = fields("k0");
  DiskCache(probe).get_or_compile(f0, [&] { return CompileOutput{payload(f0), ""}; });
  const int64_t one = DiskCache(probe).list().at(0).bytes;

  Settings s = settings_for(t);  // lock dir t/locks, shared
  s.max_bytes = 4 * one + one / 2;
  fs::create_directories(t / "locks");
  const std::string foreign = t / ("locks/0badcafe-" + make_key(fields("k1")).digest + ".lock");
  std::ofstream(foreign) << "";
  DiskCache c(s);
  for (int i = 0; i < 12; ++i) {
    KeyFields f = fields("k" + std::to_string(i));
    c.get_or_compile(f, [&] { return CompileOutput{payload(f), ""}; });
  }
  std::vector<std::string> want, got;
  for (const auto& e : c.list()) want.push_back(e.name.substr(e.name.rfind('-') + 1) + ".lock");
  ASSERT_LT(want.size(), 12u) << "nothing was evicted";
  for (const auto& n : names(lock_files(t / "locks")))
    if (n != fs::path(foreign).filename().string()) got.push_back(n.substr(n.find('-') + 1));
  std::sort(want.begin(), want.end());
  EXPECT_EQ(got, want) << "the lock files are exactly those of the entries left";
  c.clear();
  EXPECT_EQ(names(lock_files(t / "locks")), std::vector<std::string>{fs::path(foreign).filename().string()});
}

// Removing a lock file breaks mutual exclusion unless a locker checks, once it holds the lock,
// that the path still names the file it locked. Here a waiter has the file open while a remover
// holds it and unlinks it; a new locker creates the file anew and compiles; then the remover lets
// go. The waiter must not take its lock on the orphan for permission to compile.
TEST(LockFiles, ALockerWhoseFileWasRemovedLocksTheNewOne) {
  TempDir t;
  Settings s = settings_for(t);
  s.lock_dir = "";
  s.lock_timeout_s = 60;
  KeyFields f = fields("k0");
  DiskCache waiter(s), holder(s);
  const std::string lock = t / ("cache/.locks/" + lock_name("k0"));
  const int rfd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);  // the remover
  ASSERT_GE(rfd, 0);
  ASSERT_EQ(::flock(rfd, LOCK_EX), 0);

  FakeCompiler wc;
  std::atomic<bool> done{false};
  Fetched got;
  std::thread w([&] {
    got = waiter.get_or_compile(f, wc.fn(f));
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the waiter polls the old file
  ASSERT_FALSE(done.load());
  ASSERT_EQ(::unlink(lock.c_str()), 0);
  Gate g;
  std::thread x([&] { holder.get_or_compile(f, [&] { g.wait(); return CompileOutput{payload(f), "x"}; }); });
  ASSERT_TRUE(wait_until([&] { return g.entered.load(); }, 10)) << "the new locker did not get the new file";
  ::close(rfd);  // the remover lets go of the orphan
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(wc.calls, 0) << "the waiter compiled under a lock on a removed file, beside the holder";
  g.release();
  x.join();
  w.join();
  EXPECT_EQ(got.origin, Origin::Disk);
  EXPECT_EQ(got.binary, payload(f));
}

// remove_unused between its open and its flock: another remover unlinks the file and a locker
// creates it anew and holds it (compiling). The first remover's flock then takes the orphan it
// opened, which nobody holds; it must see that the path names another file now and leave it,
// or the next locker would create a third file and compile beside the holder.
namespace {
std::string g_race_path;
int g_race_holder = -1;
void replace_and_hold_the_lock_file() {
  ::unlink(g_race_path.c_str());
  g_race_holder = ::open(g_race_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (g_race_holder >= 0) ::flock(g_race_holder, LOCK_EX);  // the hook is spent: libc's flock
}
}  // namespace

TEST(LockFiles, ARemoverLeavesTheFileThatReplacedTheOneItOpened) {
  TempDir t;
  g_race_path = t / "k0.lock";
  const int first = ::open(g_race_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  ASSERT_GE(first, 0);
  ::close(first);
  g_before_flock = replace_and_hold_the_lock_file;
  const bool removed = detail::LockFile::remove_unused(g_race_path);
  ASSERT_EQ(g_before_flock.load(), nullptr) << "remove_unused took no flock";
  ASSERT_GE(g_race_holder, 0);
  EXPECT_FALSE(removed);
  struct stat at_path {}, held {};
  ASSERT_EQ(::fstat(g_race_holder, &held), 0);
  ASSERT_EQ(::stat(g_race_path.c_str(), &at_path), 0) << "the holder's lock file was unlinked";
  EXPECT_EQ(at_path.st_ino, held.st_ino);
  detail::LockFile next;  // excluded by the holder, as long as the file is the holder's
  EXPECT_EQ(next.acquire(g_race_path, 0.1), detail::LockFile::TimedOut);
  ::close(g_race_holder);
  g_race_holder = -1;
  EXPECT_EQ(next.acquire(g_race_path, 5), detail::LockFile::Acquired);
}

// Stress: several caches (one per "process": only the flock excludes them) fetch the same keys
// over and over while another clears the cache and its unused lock files in a loop. Two compiles
// of one key at the same time would mean the removal broke the exclusion.
TEST(LockFiles, ClearingInALoopNeverLetsTwoCompilesOfAKeyOverlap) {
  TempDir t;
  Settings s = settings_for(t);
  s.lock_dir = "";
  s.lock_timeout_s = 60;
  constexpr int kKeys = 3, kWorkers = 4, kRounds = 40;
  std::atomic<int> in_compile[kKeys] = {}, overlaps{0}, compiles{0};
  std::atomic<bool> stop{false};
  std::vector<std::unique_ptr<DiskCache>> caches;
  for (int i = 0; i <= kWorkers; ++i) caches.push_back(std::make_unique<DiskCache>(s));
  std::thread clearer([&] {
    while (!stop) {
      caches[kWorkers]->clear();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  std::vector<std::thread> workers;
  for (int w = 0; w < kWorkers; ++w)
    workers.emplace_back([&, w] {
      for (int r = 0; r < kRounds; ++r)
        for (int k = 0; k < kKeys; ++k) {
          KeyFields f = fields("k" + std::to_string(k));
          caches[w]->get_or_compile(f, [&] {
            if (++in_compile[k] > 1) ++overlaps;
            ++compiles;
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
            --in_compile[k];
            return CompileOutput{payload(f), ""};
          });
        }
    });
  for (auto& x : workers) x.join();
  stop = true;
  clearer.join();
  EXPECT_EQ(overlaps, 0) << "of " << compiles << " compiles";
  EXPECT_GT(compiles, kKeys) << "the clearing never made anyone recompile: the test showed nothing";
}

// A fork() while another thread is inside log() (a plan() logs even lines its level filters out): the child's first
// log() waited for ever on spdlog's registry mutex, which the fork had copied locked. The logger is looked up once now.
TEST(ForkAndLog, AChildForkedWhileAThreadLogsCanLog) {
  logger();  // made before the race, as any earlier smla call would have
  std::atomic<bool> stop{false};
  std::thread t([&] {
    while (!stop) logger().trace("filtered out");
  });
  int hung = 0;
  for (int i = 0; i < 200 && hung == 0; ++i) {
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) {
      logger().trace("child");
      ::_exit(0);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    int status = 0;
    while (::waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        ++hung;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  stop = true;
  t.join();
  EXPECT_EQ(hung, 0) << "a child blocked in its first log()";
}

}  // namespace smla::cache::test
