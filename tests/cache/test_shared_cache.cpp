// A cache shared by the members of one group (umask 002, setgid directory): what one member
// publishes, another can replace when it is bad, evict and refresh.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include "test_util.hpp"

namespace smla::cache::test {

// Sets the umask for one scope.
struct Umask {
  mode_t old;
  explicit Umask(mode_t m) : old(::umask(m)) {}
  ~Umask() { ::umask(old); }
};

TEST(SharedCache, Umask002MakesEntriesGroupWritable) {
  TempDir t;
  Umask u(002);
  KeyFields f = fields("smla_dq");
  FakeCompiler c;
  DiskCache cache(settings_for(t));
  ASSERT_EQ(cache.get_or_compile(f, c.fn(f)).origin, Origin::Compiled);
  std::string e = t / ("cache/entries/" + make_key(f).entry_name());
  for (std::string p : {e, e + "/kernel.bin", e + "/manifest.json", e + "/source.txt", t / "cache/entries"}) {
    struct stat st {};
    ASSERT_EQ(::stat(p.c_str(), &st), 0) << p;
    EXPECT_TRUE(st.st_mode & S_IWGRP) << p << " mode " << std::oct << (st.st_mode & 07777);
  }
}

// The lock directory inside a group's cache is made as shared as the cache, whoever makes it: a member with umask
// 022 made it 02755 and every other member compiled without locks (one debug line each), for good.
TEST(SharedCache, TheLockDirectoryIsSharedAsTheCacheIs) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to act as two users of one group";
  const uid_t alice = 54331, bob = 54332;
  const gid_t group = 54330;
  TempDir t;
  ASSERT_EQ(::chmod(t.path.c_str(), 0755), 0);
  const std::string dir = t / "cache";
  ASSERT_EQ(group_dir(dir, group), "");
  for (const char* sub : {"/entries", "/.staging"})  // as the group's admin set them up; .locks left to the users
    ASSERT_EQ(group_dir(dir + sub, group), "");
  Settings s;
  s.dir = dir;
  s.lock = true;
  s.lock_dir = "";  // the default: <cache>/.locks
  s.max_bytes = 0;
  auto compile = [&](const char* key) {
    DiskCache c(s);
    FakeCompiler fc;
    KeyFields f = fields(key);
    return c.get_or_compile(f, fc.fn(f)).origin == Origin::Compiled ? "" : "not compiled";
  };
  EXPECT_EQ(run_as(alice, group, [&] {
              ::umask(022);
              return std::string(compile("k_alice"));
            }), "");
  const std::string locks = dir + "/.locks";
  struct stat st {};
  ASSERT_EQ(::stat(locks.c_str(), &st), 0);
  EXPECT_TRUE((st.st_mode & S_IWGRP) && (st.st_mode & S_ISGID)) << "mode " << std::oct << (st.st_mode & 07777);
  EXPECT_EQ(run_as(bob, group, [&] { return std::string(compile("k_bob")); }), "");
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(locks)) n += e.path().extension() == ".lock";
  EXPECT_EQ(n, 2u) << "bob took no lock in the group's lock directory";
}

// Two users of one group on one cache: the second replaces the first's bad entry, refreshes
// its good one on a hit, and evicts it. Before group-writable creation, the removal failed
// silently: the bad entry stayed and was reported as replaced.
TEST(SharedCache, AnotherMemberReplacesRefreshesAndEvicts) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to act as two users of one group";
  const uid_t alice = 54321, bob = 54322;
  const gid_t group = 54320;
  TempDir t;
  ASSERT_EQ(::chmod(t.path.c_str(), 0755), 0);
  const std::string dir = t / "cache";
  // The group directory: setgid, so everything below belongs to the group.
  ASSERT_EQ(group_dir(dir, group), "");
  Settings s;
  s.dir = dir;
  s.lock = false;
  s.max_bytes = 0;
  KeyFields bad = fields("k_bad"), good = fields("k_good"), other = fields("k_other");
  const std::string bad_dir = dir + "/entries/" + make_key(bad).entry_name();
  const std::string good_dir = dir + "/entries/" + make_key(good).entry_name();

  EXPECT_EQ(run_as(alice, group, [&] {
              DiskCache a(s);
              FakeCompiler c;
              a.get_or_compile(bad, c.fn(bad));
              a.get_or_compile(good, c.fn(good));
              return c.calls == 2 && a.stats().publish_failures == 0 ? "" : "alice could not publish";
            }), "");
  struct stat st {};
  ASSERT_EQ(::stat(bad_dir.c_str(), &st), 0);
  ASSERT_EQ(st.st_uid, alice);
  {  // damage alice's entry in place (root keeps the owner)
    std::string bin = bad_dir + "/kernel.bin", b = slurp(bin);
    b[b.size() / 2] ^= 1;
    std::ofstream(bin, std::ios::binary | std::ios::trunc) << b;
  }
  timespec old[2] = {{::time(nullptr) - 3600, 0}, {::time(nullptr) - 3600, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, good_dir.c_str(), old, 0), 0);

  EXPECT_EQ(run_as(bob, group, [&] {
              std::string r;
              DiskCache b(s);
              FakeCompiler c;
              Fetched x = b.get_or_compile(bad, c.fn(bad));
              if (x.origin != Origin::Compiled || b.stats().corrupt_replaced != 1 || b.stats().corrupt_kept != 0)
                r += "bad entry not replaced; ";
              if (b.get_or_compile(good, c.fn(good)).origin != Origin::Disk) r += "good entry not hit; ";
              return r;
            }), "");
  ASSERT_EQ(::stat(bad_dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, bob) << "the bad entry was replaced by bob's";
  ASSERT_EQ(::stat(good_dir.c_str(), &st), 0);
  EXPECT_GT(st.st_mtime, ::time(nullptr) - 600) << "bob's hit refreshed alice's entry's LRU stamp";
  {
    Settings ro = s;
    ro.readonly = true;
    DiskCache check(ro);
    FakeCompiler c;
    EXPECT_EQ(check.get_or_compile(bad, c.fn(bad)).origin, Origin::Disk) << "the replacement verifies";
  }

  // Bob publishes under a bound that leaves room for one entry: alice's are evicted.
  EXPECT_EQ(run_as(bob, group, [&] {
              Settings sb = s;
              sb.max_bytes = 1;
              DiskCache b(sb);
              FakeCompiler c;
              b.get_or_compile(other, c.fn(other));
              return std::string();
            }), "");
  EXPECT_EQ(entry_names(dir), std::vector<std::string>{make_key(other).entry_name()});
}

// A cache under a directory every user may enter (a shared scratch space), without lock files (their directory
// would be the first user's).
Settings two_users_settings(const TempDir& t) {
  EXPECT_EQ(::chmod(t.path.c_str(), 0777), 0);
  Settings s;
  s.dir = t / "cache";
  s.lock = false;
  s.max_bytes = 0;
  return s;
}

// An entry that is not ours to delete: kept, said so, counted as kept, and the binary served
// from memory (publishing would only "lose" against it).
TEST(SharedCache, EntryNotWritableByUsIsKeptAndSaidSo) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to act as a second user";
  const uid_t alice = 54321, bob = 54322;
  const gid_t group = 54320;
  TempDir t;
  const Settings s = two_users_settings(t);
  KeyFields f = fields("k_bad");
  EXPECT_EQ(run_as(alice, group, [&] {
              ::umask(022);  // alice does not share
              DiskCache a(s);
              FakeCompiler c;
              a.get_or_compile(f, c.fn(f));
              ::chmod((t / "cache/entries").c_str(), 0777);  // but anyone may add entries
              ::chmod((t / "cache/.staging").c_str(), 0777);
              return std::string();
            }), "");
  std::string e = t / ("cache/entries/" + make_key(f).entry_name());
  std::ofstream(e + "/kernel.bin", std::ios::binary | std::ios::trunc) << "garbage";
  EXPECT_EQ(run_as(bob, group, [&] {
              std::string r;
              LogCapture log;
              DiskCache b(s);
              FakeCompiler c;
              if (!b.writable()) return std::string("not writable");
              if (b.get_or_compile(f, c.fn(f)).binary != payload(f)) r += "wrong binary; ";
              if (b.get_or_compile(f, c.fn(f)).origin != Origin::Memory) r += "second fetch not from memory; ";
              if (c.calls != 1) r += "compiled " + std::to_string(c.calls) + " times; ";
              Stats st = b.stats();
              if (st.corrupt_replaced != 0 || st.corrupt_kept != 1) r += "counted as replaced; ";
              if (log.count("cannot remove") < 1 || log.count("keeping it") != 1 || log.count("[warning]") != 1) r += "log: " + log.text();
              // Nor are prune and clear counting it as removed.
              BulkResult p = b.prune(0), c2 = b.clear();
              if (p.done != 0 || p.rejected.size() != 1) r += "prune counted it; ";
              if (c2.done != 0 || c2.rejected.size() != 1) r += "clear counted it; ";
              return r;
            }), "");
  EXPECT_EQ(slurp(e + "/kernel.bin"), "garbage") << "alice's entry is still there";
}

// Another member's entries that this user cannot remove are left out of SMLA_CACHE_MAX_BYTES: counted, they alone
// exceeded the bound and every publish evicted every one of this user's entries but the newest (the cache was as
// good as off for it, and rescanned at every publish).
TEST(SharedCache, OthersEntriesWeCannotRemoveDoNotEvictOurs) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to act as a second user";
  const uid_t alice = 54331, bob = 54332;
  const gid_t group = 54330;
  TempDir t;
  const Settings s = two_users_settings(t);
  EXPECT_EQ(run_as(alice, group, [&] {
              ::umask(022);  // alice does not share her entries
              DiskCache a(s);
              FakeCompiler c;
              for (int i = 0; i < 8; ++i) {
                KeyFields f = fields("a" + std::to_string(i));
                a.get_or_compile(f, c.fn(f));
              }
              ::chmod((t / "cache/entries").c_str(), 0777);
              ::chmod((t / "cache/.staging").c_str(), 0777);
              return std::string();
            }), "");
  const int64_t one = fake_entry_bytes(t);  // each of alice's "aN" entries
  ASSERT_GT(one, 0);
  EXPECT_EQ(run_as(bob, group, [&] {
              std::string r;
              Settings sb = s;
              sb.max_bytes = 3 * one + one / 2;  // alice's 8 entries alone are over it
              DiskCache b(sb);
              FakeCompiler c;
              for (int i = 0; i < 4; ++i) {
                KeyFields f = fields("b" + std::to_string(i));
                b.get_or_compile(f, c.fn(f));
              }
              int ours = 0, alices = 0;
              for (const auto& e : b.list()) (e.tag[0] == 'b' ? ours : alices)++;
              if (ours != 3) r += "bob has " + std::to_string(ours) + " entries, not his newest 3; ";
              if (alices != 8) r += "alice's entries: " + std::to_string(alices) + "; ";
              c.calls = 0;
              for (int i = 1; i < 4; ++i) {
                KeyFields f = fields("b" + std::to_string(i));
                if (DiskCache(sb).get_or_compile(f, c.fn(f)).origin != Origin::Disk) r += "b" + std::to_string(i) + " not a hit; ";
              }
              return r;
            }), "");
}

// The first member to open a group's cache makes entries/ and .staging/. With umask 022 they were 0755 (setgid
// inherited, group write not): every other member's probe failed with EACCES, and they compiled into memory for good.
// They now take the root's mode, as .locks/ does.
TEST(SharedCache, EntriesAndStagingAreMadeSharedAsTheCacheIs) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to act as two users of one group";
  const uid_t alice = 54341, bob = 54342;
  const gid_t group = 54340;
  TempDir t;
  ASSERT_EQ(::chmod(t.path.c_str(), 0755), 0);
  const std::string dir = t / "cache";
  ASSERT_EQ(group_dir(dir, group), "");  // the group's root only: its admin made nothing below it
  Settings s;
  s.dir = dir;
  s.lock = false;
  s.max_bytes = 0;
  EXPECT_EQ(run_as(alice, group, [&] {
              ::umask(022);
              DiskCache c(s);
              FakeCompiler fc;
              KeyFields f = fields("k_alice");
              return c.get_or_compile(f, fc.fn(f)).origin == Origin::Compiled ? std::string() : "not compiled";
            }), "");
  for (const char* sub : {"/entries", "/.staging"}) {
    struct stat st {};
    ASSERT_EQ(::stat((dir + sub).c_str(), &st), 0) << sub;
    EXPECT_EQ(st.st_mode & 07777, 02775u) << sub << ": mode " << std::oct << (st.st_mode & 07777);
  }
  EXPECT_EQ(run_as(bob, group, [&] {
              DiskCache c(s);
              if (!c.writable()) return "bob cannot write the group's cache: " + c.unwritable_reason();
              FakeCompiler fc;
              KeyFields f = fields("k_bob");
              c.get_or_compile(f, fc.fn(f));
              return DiskCache(s).get_or_compile(f, fc.fn(f)).origin == Origin::Disk ? std::string()
                                                                                       : "bob's entry is not on disk";
            }), "");
}

// With the sticky bit on entries/ (a /tmp-like shared directory) write permission is not enough to move another
// member's entry. Bob's eviction counted alice's group-writable entry as his, the rename failed with EPERM, and the
// removal in place emptied her entry without removing it (every reader then took it for corrupt and could not
// replace it). Now it is pinned: left whole.
TEST(SharedCache, StickyEntriesAreLeftToTheirOwner) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to act as two users of one group";
  const uid_t alice = 54351, bob = 54352;
  const gid_t group = 54350;
  TempDir t;
  ASSERT_EQ(::chmod(t.path.c_str(), 0755), 0);
  const std::string dir = t / "cache";
  ASSERT_EQ(group_dir(dir, group), "");
  ASSERT_EQ(group_dir(dir + "/entries", group), "");
  ASSERT_EQ(::chmod((dir + "/entries").c_str(), 03775), 0);
  Settings s;
  s.dir = dir;
  s.lock = false;
  s.max_bytes = 0;
  EXPECT_EQ(run_as(alice, group, [&] {
              DiskCache c(s);
              FakeCompiler fc;
              KeyFields f = fields("k_a");
              c.get_or_compile(f, fc.fn(f));
              return std::string();
            }), "");
  const std::vector<std::string> before = entry_names(dir);
  ASSERT_EQ(before.size(), 1u);
  EXPECT_EQ(run_as(bob, group, [&] {
              Settings sb = s;
              sb.max_bytes = 1;  // everything over it
              DiskCache c(sb);
              FakeCompiler fc;
              KeyFields f = fields("k_b");
              c.get_or_compile(f, fc.fn(f));
              return std::string();
            }), "");
  const std::string alices = dir + "/entries/" + before[0];
  EXPECT_TRUE(!fs::exists(alices) || fs::exists(alices + "/manifest.json"))
      << "alice's entry half-deleted: " << alices;
  EXPECT_TRUE(fs::exists(alices + "/manifest.json")) << "alice's entry is hers to evict";
  FakeCompiler fc;
  KeyFields f = fields("k_a");
  EXPECT_EQ(DiskCache(s).get_or_compile(f, fc.fn(f)).origin, Origin::Disk) << "alice's entry still serves";
}

}  // namespace smla::cache::test
