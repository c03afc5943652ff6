// Degraded modes: whatever is wrong with the cache directory, get_or_compile still returns the
// right binary (from memory when the disk is unusable), warns, and never throws.
#include <gtest/gtest.h>

#include <dlfcn.h>
#include <errno.h>

#include <algorithm>
#include <atomic>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include "entry_store.hpp"

#include "test_util.hpp"

// fsync(2) of this test binary: libc's, unless a test asks every regular file's flush to fail with EIO (a disk that
// took the bytes but cannot make them durable). Defined here, it is what the cache's code calls in this process.
static std::atomic<bool> g_fsync_fails{false};
extern "C" int fsync(int fd) {
  struct stat st {};
  if (g_fsync_fails && ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
    errno = EIO;
    return -1;
  }
  static const auto real = reinterpret_cast<int (*)(int)>(::dlsym(RTLD_NEXT, "fsync"));
  return real(fd);
}

namespace smla::cache::test {

// Two fetches of one key and one of another: the right bytes, one compile per key.
static void expect_works_in_memory(DiskCache& cache) {
  FakeCompiler c;
  KeyFields f = fields("smla_dq"), g = fields("smla_dkv");
  Fetched a, b, d;
  ASSERT_NO_THROW(a = cache.get_or_compile(f, c.fn(f)));
  ASSERT_NO_THROW(b = cache.get_or_compile(f, c.fn(f)));
  ASSERT_NO_THROW(d = cache.get_or_compile(g, c.fn(g)));
  EXPECT_EQ(a.binary, payload(f));
  EXPECT_EQ(b.binary, payload(f));
  EXPECT_EQ(d.binary, payload(g));
  EXPECT_EQ(a.origin, Origin::Compiled);
  EXPECT_EQ(b.origin, Origin::Memory);
  EXPECT_EQ(c.calls, 2);
}

// A cache at `dir` that cannot be written: said once in the log, each of `also` there as often as given, and it
// still works, in memory.
static void expect_unwritable(const TempDir& t, const std::string& dir,
                       const std::vector<std::pair<std::string, int>>& also = {}) {
  Settings s = settings_for(t);
  s.dir = dir;
  LogCapture log;
  DiskCache cache(s);
  EXPECT_FALSE(cache.writable()) << dir;
  EXPECT_EQ(log.count("cannot write cache directory"), 1) << log.text();
  for (const auto& [needle, n] : also) EXPECT_EQ(log.count(needle), n) << needle << " in: " << log.text();
  expect_works_in_memory(cache);
}

// /proc refuses new entries even to root, so this is a truly unwritable directory in CI (which
// runs as root, where chmod would not stop anything).
TEST(Degraded, UnwritableDirectory) {
  TempDir t;
  expect_unwritable(t, "/proc");
}

// A populated directory made read-only with chmod: hits are still served. Root ignores file
// permissions, so as root (CI) the tree is handed to an unprivileged user, who owns it and is
// refused by the chmod alone, and the checks run in a child process as that user.
TEST(Degraded, ChmodReadOnlyDirectoryStillServesHits) {
  TempDir t;
  KeyFields h = fields("smla_sink");
  {
    FakeCompiler c;
    DiskCache(settings_for(t)).get_or_compile(h, c.fn(h));
  }
  const bool root = ::geteuid() == 0;
  const uid_t user = 54321;
  const gid_t group = 54320;
  if (root) {
    ASSERT_EQ(::chmod(t.path.c_str(), 0755), 0);
    for (const auto& e : fs::recursive_directory_iterator(t.path))
      ASSERT_EQ(::lchown(e.path().c_str(), user, group), 0) << e.path();
    ASSERT_EQ(::chown(t.path.c_str(), user, group), 0);
  }
  for (auto d : {t / "cache/entries", t / "cache/.staging", t / "cache"}) ASSERT_EQ(::chmod(d.c_str(), 0555), 0);
  const bool failed_before = ::testing::Test::HasFailure();
  auto read_only_part = [&] {
    DiskCache cache(settings_for(t));
    EXPECT_FALSE(cache.writable());
    FakeCompiler c;
    EXPECT_EQ(cache.get_or_compile(h, c.fn(h)).origin, Origin::Disk);
    expect_works_in_memory(cache);
    EXPECT_EQ(entry_names(t / "cache").size(), 1u) << "nothing was written";
  };
  if (root) {
    // The child's failures print there; its result says whether there were any.
    EXPECT_EQ(run_as(user, group, [&] {
                read_only_part();
                return ::testing::Test::HasFailure() && !failed_before
                           ? "failed as uid " + std::to_string(user) + " (see above)"
                           : std::string();
              }), "");
  } else {
    read_only_part();
  }
  for (auto d : {t / "cache", t / "cache/entries", t / "cache/.staging"}) ::chmod(d.c_str(), 0755);
}

// The /tmp fallback (no home directory: /tmp/smla-cache-<uid>, a name anyone can predict) is used only as a directory
// of this user's alone: one another user made first (here: one others may write into, or a link in its place) is
// neither read nor written, with a warning naming why; an absent one is made, mode 0700, and used.
TEST(Degraded, TheSharedTmpFallbackIsUsedOnlyWhenItIsOurs) {
  TempDir t;
  KeyFields f = fields("smla_dq");
  Settings s = settings_for(t, "fallback");
  s.dir_in_shared_tmp = true;
  {
    LogCapture log;
    DiskCache cache(s);
    EXPECT_TRUE(cache.writable()) << log.text();
    FakeCompiler c;
    cache.get_or_compile(f, c.fn(f));
    struct stat st {};
    ASSERT_EQ(::lstat(s.dir.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0700u);
    EXPECT_EQ(entry_names(s.dir).size(), 1u);
  }
  // Writable by others (as another user's 0777 directory would be): its entries are not read, nothing is written.
  ASSERT_EQ(::chmod(s.dir.c_str(), 0777), 0);
  {
    LogCapture log;
    DiskCache cache(s);
    EXPECT_FALSE(cache.writable());
    EXPECT_EQ(log.count("not using " + s.dir + " (other users may write into it (mode 0777))"), 1) << log.text();
    FakeCompiler c;
    EXPECT_EQ(cache.get_or_compile(f, c.fn(f)).origin, Origin::Compiled) << "an entry of a shared directory was read";
  }
  EXPECT_EQ(entry_names(s.dir).size(), 1u) << "nothing was written there";
  if (::geteuid() == 0) {  // CI runs as root, who can hand the directory to another user: mode 0700, not ours
    ASSERT_EQ(::chmod(s.dir.c_str(), 0700), 0);
    ASSERT_EQ(::chown(s.dir.c_str(), 54321, 54320), 0);
    LogCapture log;
    EXPECT_FALSE(DiskCache(s).writable());
    EXPECT_EQ(log.count("it belongs to another user (uid 54321)"), 1) << log.text();
    ASSERT_EQ(::chown(s.dir.c_str(), 0, 0), 0);
  }
  // A link in its place (to a directory of ours that would pass): refused as well.
  Settings l = settings_for(t, "link");
  l.dir_in_shared_tmp = true;
  ASSERT_EQ(::chmod(s.dir.c_str(), 0700), 0);
  ASSERT_EQ(::symlink(s.dir.c_str(), l.dir.c_str()), 0);
  {
    LogCapture log;
    DiskCache cache(l);
    EXPECT_FALSE(cache.writable());
    EXPECT_EQ(log.count("it is not a directory (a link or a file in its place)"), 1) << log.text();
  }
  // The same directory named by the user (SMLA_CACHE_DIR) is theirs to choose: used.
  l.dir_in_shared_tmp = false;
  EXPECT_TRUE(DiskCache(l).writable());
}

TEST(Degraded, ReadonlyKnobServesHitsAndWritesNothing) {
  TempDir t;
  KeyFields h = fields("smla_sink");
  FakeCompiler c;
  DiskCache(settings_for(t)).get_or_compile(h, c.fn(h));
  Settings s = settings_for(t);
  s.readonly = true;
  LogCapture log;
  DiskCache cache(s);
  EXPECT_FALSE(cache.writable());
  EXPECT_EQ(cache.get_or_compile(h, c.fn(h)).origin, Origin::Disk);
  EXPECT_EQ(log.count("[warning]"), 0) << "a hit says nothing: " << log.text();
  expect_works_in_memory(cache);
  EXPECT_EQ(entry_names(t / "cache").size(), 1u);
  // The misses (two kernels) are said once at the default level: the job compiles what its warm-up did not hold.
  EXPECT_EQ(log.count("[warning]"), 1) << log.text();
  EXPECT_EQ(log.count("not in the read-only cache"), 2) << "once a warning, then debug: " << log.text();
}

// A system cache this user may not enter is named as such: it was "has no entries/ directory", which sent an
// administrator looking for a missing directory that is there. (As root, which enters anything, in a child of
// another uid.)
TEST(Degraded, ASystemCacheThatCannotBeReadIsNamedSo) {
  TempDir t;
  const std::string sys = t / "system";
  fs::create_directories(sys + "/entries");
  ASSERT_EQ(::chmod(sys.c_str(), 0), 0);
  ASSERT_EQ(::chmod(t.path.c_str(), 0777), 0);
  auto open = [&]() -> std::string {
    LogCapture log;
    Settings s = settings_for(t, "user-" + std::to_string(::geteuid()));
    s.system_dir = sys;
    DiskCache cache(s);
    const std::string text = log.text();
    if (text.find("system cache " + sys + " cannot be read") == std::string::npos) return "not named: " + text;
    if (text.find("Permission denied") == std::string::npos) return "no reason: " + text;
    return "";
  };
  EXPECT_EQ(::geteuid() == 0 ? run_as(54321, 54320, open) : open(), "");
  ::chmod(sys.c_str(), 0755);
}

TEST(Degraded, MissingParentIsCreated) {
  TempDir t;
  Settings s = settings_for(t);
  s.dir = t / "no/such/parent/cache";
  {
    DiskCache cache(s);
    EXPECT_TRUE(cache.writable());
    KeyFields f = fields("smla_dq");
    FakeCompiler c;
    Fetched got = cache.get_or_compile(f, c.fn(f));
    EXPECT_EQ(got.origin, Origin::Compiled);
    EXPECT_EQ(got.not_stored, "") << "written";
  }
  DiskCache again(s);
  KeyFields f = fields("smla_dq");
  FakeCompiler c;
  EXPECT_EQ(again.get_or_compile(f, c.fn(f)).origin, Origin::Disk);
}

TEST(Degraded, FileWhereTheDirectoryShouldBe) {
  TempDir t;
  std::ofstream(t / "cache") << "not a directory";
  for (std::string dir : {t / "cache", t / "cache/sub"}) expect_unwritable(t, dir);
  EXPECT_EQ(slurp(t / "cache"), "not a directory") << "the file in the way is left alone";
}

// A dangling symlink where the directory (or its entries/) should be: the warning says so and
// where it points, not just "File exists" from mkdir.
TEST(Degraded, DanglingSymlinkIsNamed) {
  TempDir t;
  ASSERT_EQ(::symlink((t / "gone/cache").c_str(), (t / "link").c_str()), 0);
  ASSERT_EQ(::mkdir((t / "real").c_str(), 0755), 0);
  ASSERT_EQ(::symlink((t / "gone/entries").c_str(), (t / "real/entries").c_str()), 0);
  for (std::string dir : {t / "link", t / "link/sub", t / "real"})
    expect_unwritable(t, dir, {{"is a dangling symlink to " + t / "gone/", 1}, {"File exists", 0}});
  EXPECT_FALSE(fs::exists(t / "gone")) << "the link's target is not created behind the user's back";
}

// A directory on another filesystem than `dir`, or "" when none is found.
static std::string other_filesystem(const std::string& dir) {
  struct stat here {}, there {};
  if (::stat(dir.c_str(), &here) != 0) return "";
  for (const char* c : {"/dev/shm", "/run", "/var/tmp", "/tmp"})
    if (::stat(c, &there) == 0 && there.st_dev != here.st_dev && ::access(c, W_OK) == 0) return c;
  return "";
}

// entries/ symlinked to another filesystem than .staging/: every publish (a rename between the
// two) would fail with EXDEV. Found when the cache is opened: one warning with the reason, the
// cache read-only (hits still served), no publish attempted.
TEST(Degraded, EntriesOnAnotherFilesystemIsNotWritable) {
  TempDir t;
  const std::string other = other_filesystem(t.path);
  if (other.empty()) GTEST_SKIP() << "no second writable filesystem next to " << t.path;
  struct OtherDir {  // a populated cache over there, removed at the end
    std::string path;
    ~OtherDir() {
      std::error_code ec;
      if (!path.empty()) fs::remove_all(path, ec);
    }
  } far;
  std::string tmpl = other + "/smla-cache-test-XXXXXX";
  ASSERT_NE(::mkdtemp(&tmpl[0]), nullptr) << other;
  far.path = tmpl;
  KeyFields h = fields("smla_sink");
  {
    Settings s = settings_for(t);
    s.dir = far.path;
    FakeCompiler c;
    DiskCache(s).get_or_compile(h, c.fn(h));
  }
  ASSERT_EQ(::mkdir((t / "cache").c_str(), 0755), 0);
  ASSERT_EQ(::symlink((far.path + "/entries").c_str(), (t / "cache/entries").c_str()), 0);
  LogCapture log;
  DiskCache cache(settings_for(t));
  EXPECT_FALSE(cache.writable());
  // (Said as the link it is: a linked entries/ is refused before the rename probe that found EXDEV here.)
  EXPECT_EQ(log.count("is a symbolic link"), 1) << log.text();
  EXPECT_EQ(log.count("link the whole cache directory"), 1) << log.text();
  EXPECT_EQ(log.count("[warning]"), 1) << log.text();
  FakeCompiler c;
  EXPECT_EQ(cache.get_or_compile(h, c.fn(h)).origin, Origin::Disk);
  expect_works_in_memory(cache);
  EXPECT_EQ(cache.stats().publish_failures, 0) << "no publish attempted";
  EXPECT_EQ(log.count("[warning]"), 1) << "said once: " << log.text();
  EXPECT_EQ(entry_names(t / "cache").size(), 1u);
}

// A full filesystem, by the test-only write-failure hook (Settings::test_fail_writes, env
// SMLA_CACHE_TEST_FAIL_WRITES): directories can be created, data writes fail with ENOSPC.
TEST(Degraded, FullFilesystemInjected) {
  TempDir t;
  Settings s = settings_for(t);
  s.test_fail_writes = true;
  LogCapture log;
  DiskCache cache(s);
  EXPECT_TRUE(cache.writable()) << "the probe writes no data, like a full disk";
  expect_works_in_memory(cache);
  EXPECT_EQ(cache.stats().publish_failures, 2);
  EXPECT_EQ(log.count("cannot publish"), 2) << "one warning, then debug: " << log.text();
  EXPECT_EQ(log.count("[warning]"), 1) << log.text();
  EXPECT_NE(log.text().find("No space left"), std::string::npos) << log.text();
  EXPECT_TRUE(entry_names(t / "cache").empty());
  EXPECT_EQ(count_dir(t / "cache/.staging"), 0u) << "failed staging dirs are removed";
  KeyFields f = fields("smla_other");
  FakeCompiler c;
  Fetched got = cache.get_or_compile(f, c.fn(f));
  EXPECT_EQ(got.origin, Origin::Compiled);
  EXPECT_NE(got.not_stored.find("No space left"), std::string::npos) << "says why it is not on disk: " << got.not_stored;
}


// A file whose bytes were written but could not be flushed to disk is not published: after a crash it could be an
// entry of zeros under a name that says it is whole. The kernel is kept in memory, and the reason said.
TEST(Degraded, AFlushThatFailsPublishesNothing) {
  TempDir t;
  LogCapture log;
  DiskCache cache(settings_for(t));
  KeyFields f = fields("smla_dq");
  FakeCompiler c;
  g_fsync_fails = true;
  Fetched got = cache.get_or_compile(f, c.fn(f));
  g_fsync_fails = false;
  EXPECT_EQ(got.origin, Origin::Compiled);
  EXPECT_EQ(got.binary, payload(f));
  EXPECT_NE(got.not_stored.find("Input/output error"), std::string::npos) << got.not_stored;
  EXPECT_TRUE(entry_names(t / "cache").empty()) << "published without its flush";
  EXPECT_EQ(count_dir(t / "cache/.staging"), 0u) << "the failed staging was left";
  EXPECT_EQ(cache.stats().publish_failures, 1);
  // The flush working again, the next process publishes.
  DiskCache next(settings_for(t));
  EXPECT_EQ(next.get_or_compile(f, c.fn(f)).origin, Origin::Compiled);
  EXPECT_EQ(entry_names(t / "cache").size(), 1u);
}

// The same for an export: a bundle that could not be flushed is not renamed into place (nor left as a temp file).
TEST(Degraded, AnExportWhoseFlushFailsLeavesNoBundle) {
  TempDir t;
  DiskCache cache(settings_for(t));
  KeyFields f = fields("smla_dq");
  FakeCompiler c;
  cache.get_or_compile(f, c.fn(f));
  fs::create_directories(t / "out");
  g_fsync_fails = true;
  BulkResult r = cache.export_bundle(t / "out/b.smlacb");
  g_fsync_fails = false;
  EXPECT_NE(r.error.find("cannot flush"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("Input/output error"), std::string::npos) << r.error;
  EXPECT_EQ(r.done, 0);
  EXPECT_EQ(count_dir(t / "out"), 0u) << "a bundle or its temp file is there";
}

// A file size limit (ulimit -f, which batch schedulers pass on to jobs) below an entry's size: the entry is not
// written, the kernel is kept in memory and the reason said. Written, the write past the limit raised SIGXFSZ, whose
// default action ended the process (the training job). In a child, whose limit is its own.
TEST(Degraded, AFileSizeLimitKeepsTheKernelInMemoryInsteadOfEndingTheProcess) {
  TempDir t;
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    rlimit lim{1024, 1024};  // under payload()'s 2048 bytes
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) ::_exit(10);
    DiskCache cache(settings_for(t));
    KeyFields f = fields("smla_dq");
    FakeCompiler c;
    const Fetched got = cache.get_or_compile(f, c.fn(f));
    if (got.origin != Origin::Compiled || got.binary != payload(f)) ::_exit(11);
    if (got.not_stored.find("file size limit") == std::string::npos) ::_exit(12);
    if (cache.get_or_compile(f, c.fn(f)).binary != payload(f) || c.calls != 1) ::_exit(13);  // from memory
    ::_exit(0);
  }
  int st = 0;
  ASSERT_EQ(::waitpid(pid, &st, 0), pid);
  ASSERT_FALSE(WIFSIGNALED(st)) << "the child was killed by signal " << WTERMSIG(st) << " (" << strsignal(WTERMSIG(st))
                                << ")";
  EXPECT_EQ(WEXITSTATUS(st), 0) << "10: setrlimit, 11: wrong binary, 12: no reason given, 13: compiled again";
  EXPECT_TRUE(entry_names(t / "cache").empty());
}

// A file system (or quota) that fills before SMLA_CACHE_MAX_BYTES does: the least recently used half goes and the
// publish is tried again. It took no new kernel for good (every later process recompiled them) while the oldest
// entries stayed.
TEST(Degraded, AFullFileSystemMakesRoomAndStillPublishes) {
  TempDir t;
  FakeCompiler c;
  const int64_t one = fake_entry_bytes(t);
  ASSERT_GT(one, 0);
  Settings s = settings_for(t);
  s.test_capacity_bytes = 4 * one + one / 2;  // room for four entries
  s.max_bytes = int64_t(1) << 32;             // the default bound, far away
  LogCapture log;
  DiskCache cache(s);
  for (int i = 0; i < 7; ++i) {
    KeyFields f = fields("k" + std::to_string(i));
    const Fetched r = cache.get_or_compile(f, c.fn(f));
    EXPECT_TRUE(r.not_stored.empty()) << i << ": " << r.not_stored;
  }
  EXPECT_EQ(cache.stats().publish_failures, 0);
  std::vector<std::string> names;
  for (const auto& e : cache.list()) names.push_back(e.tag.substr(0, 2));
  EXPECT_LE(names.size(), 4u);
  EXPECT_NE(std::find(names.begin(), names.end(), "k6"), names.end()) << "the newest is on disk";
  EXPECT_EQ(std::find(names.begin(), names.end(), "k0"), names.end()) << "the oldest made room";
  EXPECT_GE(log.count("no space to publish"), 1) << log.text();
  // Served from disk by a fresh process.
  c.calls = 0;
  EXPECT_EQ(DiskCache(s).get_or_compile(fields("k6"), c.fn(fields("k6"))).origin, Origin::Disk);
  // SMLA_CACHE_MAX_BYTES=0 (unbounded) means never evict: the publish fails instead, as it says.
  s.max_bytes = 0;
  DiskCache unbounded(s);
  for (int i = 7; i < 10; ++i) unbounded.get_or_compile(fields("k" + std::to_string(i)), c.fn(fields("k" + std::to_string(i))));
  EXPECT_EQ(unbounded.list().size(), size_t(s.test_capacity_bytes / one)) << "filled to the capacity, nothing evicted";
  EXPECT_GE(unbounded.stats().publish_failures, 1);
}

// Links planted below a shared cache (a group member may replace .staging/ or entries/ with a link to a directory of
// the victim's, on the same file system): the victim's next open removed everything there older than the stale age
// (.staging/), and an eviction or clear removed every name there (entries/). Nothing is written, cleaned or deleted
// through such a link now; the cache is read-only and says why.
TEST(Degraded, LinkedSubdirectoriesAreNeitherCleanedNorEmptied) {
  TempDir t;
  const auto two_hours_old = [](const std::string& p) {
    struct timespec ts[2];
    ::clock_gettime(CLOCK_REALTIME, &ts[0]);
    ts[0].tv_sec -= 7200;
    ts[1] = ts[0];
    return ::utimensat(AT_FDCWD, p.c_str(), ts, AT_SYMLINK_NOFOLLOW) == 0;
  };
  ASSERT_EQ(::mkdir((t / "outside").c_str(), 0755), 0);
  for (const char* name : {"keep", "stage.host.1.abc"}) {
    std::ofstream((t / "outside/") + name) << "the victim's";
    ASSERT_TRUE(two_hours_old((t / "outside/") + name));
  }
  ASSERT_EQ(::mkdir((t / "cache").c_str(), 0755), 0);
  ASSERT_EQ(::symlink((t / "outside").c_str(), (t / "cache/.staging").c_str()), 0);
  Settings s = settings_for(t);
  s.stale_staging_s = 60;
  {
    LogCapture log;
    DiskCache cache(s);
    EXPECT_FALSE(cache.writable());
    EXPECT_NE(cache.unwritable_reason().find("symbolic link"), std::string::npos) << cache.unwritable_reason();
    expect_works_in_memory(cache);
  }
  EXPECT_TRUE(fs::exists(t / "outside/keep"));
  EXPECT_TRUE(fs::exists(t / "outside/stage.host.1.abc")) << "nothing removed through a linked .staging";

  // entries/ linked to a directory of the victim's: clear() and prune() refuse, nothing there goes.
  TempDir u;
  ASSERT_EQ(::mkdir((u / "out2").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((u / "out2/data").c_str(), 0755), 0);
  std::ofstream(u / "out2/data/file") << "the victim's";
  ASSERT_EQ(::mkdir((u / "cache").c_str(), 0755), 0);
  ASSERT_EQ(::symlink((u / "out2").c_str(), (u / "cache/entries").c_str()), 0);
  DiskCache linked(settings_for(u));
  EXPECT_FALSE(linked.writable());
  EXPECT_FALSE(linked.clear().error.empty());
  EXPECT_FALSE(linked.prune(0).error.empty());
  EXPECT_TRUE(fs::exists(u / "out2/data/file"));
  // The lower layer refuses on its own too (a link made after the cache was opened).
  detail::Root r{u / "cache"};
  std::string err;
  EXPECT_FALSE(detail::remove_entry(r, "data", &err));
  EXPECT_NE(err.find("symbolic link"), std::string::npos) << err;
  EXPECT_TRUE(detail::evict(r, 0, "").removed.empty());
  EXPECT_EQ(detail::clean_stale_staging(r, 0), 0);
  EXPECT_TRUE(fs::exists(u / "out2/data/file"));
}

// Only smla's own names go: a directory in entries/ that is not an entry name is never evicted (verify names it), a
// file in .staging/ of no staging kind is never cleaned.
TEST(Degraded, OnlySmlasOwnNamesAreRemoved) {
  TempDir t;
  Settings s = settings_for(t);
  {
    DiskCache cache(s);
    ASSERT_TRUE(cache.writable());
  }
  ASSERT_EQ(::mkdir((t / "cache/entries/notes").c_str(), 0755), 0);
  std::ofstream(t / "cache/.staging/README") << "kept";
  detail::Root r{t / "cache"};
  EXPECT_TRUE(detail::evict(r, 0, "").removed.empty());
  EXPECT_EQ(detail::clean_stale_staging(r, 0), 0);
  EXPECT_TRUE(fs::exists(t / "cache/entries/notes"));
  EXPECT_TRUE(fs::exists(t / "cache/.staging/README"));
}

// A disk filled by something else: the first publish that finds no space evicts the older half and tries again; when
// that fails too, later publishes evict nothing more (each new kernel halved the cache again: 8 entries, 4, 2, 1).
TEST(Degraded, ADiskFullOfSomethingElseHalvesTheCacheOnceOnly) {
  TempDir t;
  Settings s = settings_for(t);
  s.max_bytes = int64_t(1) << 32;
  {
    DiskCache cache(s);
    FakeCompiler c;
    for (int i = 0; i < 8; ++i) {
      KeyFields f = fields("k" + std::to_string(i));
      cache.get_or_compile(f, c.fn(f));
    }
  }
  ASSERT_EQ(entry_names(t / "cache").size(), 8u);
  s.test_fail_writes = true;
  DiskCache full(s);
  FakeCompiler c;
  for (int i = 0; i < 3; ++i) {
    KeyFields f = fields("n" + std::to_string(i));
    EXPECT_EQ(full.get_or_compile(f, c.fn(f)).binary, payload(f));
  }
  EXPECT_EQ(entry_names(t / "cache").size(), 4u) << "halved once, then left alone";
}

// A relative directory is the working directory's at the open: a host program that chdir()s (into a run directory)
// published into a new cache in each.
TEST(Degraded, ARelativeDirectoryStaysWhereItWasOpened) {
  TempDir t;
  ASSERT_EQ(::mkdir((t / "a").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((t / "b").c_str(), 0755), 0);
  const fs::path was = fs::current_path();
  fs::current_path(t / "a");
  Settings s = settings_for(t);
  s.dir = "rel";
  DiskCache cache(s);
  fs::current_path(t / "b");
  FakeCompiler c;
  KeyFields f = fields("k_rel");
  cache.get_or_compile(f, c.fn(f));
  fs::current_path(was);
  EXPECT_EQ(entry_names(t / "a/rel").size(), 1u);
  EXPECT_FALSE(fs::exists(t / "b/rel"));
}

}  // namespace smla::cache::test
