// DiskCache in one process: hits across instances, lookup order, in-process deduplication,
// refused binaries, compile failures, LRU eviction and stale staging cleanup.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include "entry_store.hpp"
#include "test_util.hpp"

namespace smla::cache::test {

TEST(DiskCache, SecondInstanceCompilesNothing) {
  TempDir t;
  KeyFields f = fields("smla_dq");
  FakeCompiler c1, c2;
  {
    DiskCache a(settings_for(t));
    ASSERT_TRUE(a.writable());
    Fetched r = a.get_or_compile(f, c1.fn(f));
    EXPECT_EQ(r.origin, Origin::Compiled);
    EXPECT_EQ(r.binary, payload(f));
    EXPECT_EQ(a.stats().compiles, 1);
  }
  // The entry holds binary, source and manifest (with the compiler log).
  std::string e = t / ("cache/entries/" + make_key(f).entry_name());
  EXPECT_EQ(slurp(e + "/source.txt"), f.source);
  EXPECT_NE(slurp(e + "/manifest.json").find("fake compile of smla_dq"), std::string::npos);
  DiskCache b(settings_for(t));
  Fetched r = b.get_or_compile(f, c2.fn(f));
  EXPECT_EQ(r.origin, Origin::Disk);
  EXPECT_EQ(r.binary, payload(f));
  EXPECT_EQ(c2.calls, 0);
  EXPECT_EQ(b.stats().disk_hits, 1);
  // A changed option is a different kernel.
  KeyFields g = f;
  g.options.push_back("-G");
  EXPECT_EQ(b.get_or_compile(g, c2.fn(g)).origin, Origin::Compiled);
  EXPECT_EQ(c2.calls, 1);
}

// Key fields that are not UTF-8 (a compiler identity holding a HIPRTC_COMPILE_OPTIONS_APPEND typed in a Latin-1 shell,
// an option, a header's name) survive the manifest: the entry is found again, verifies, and keeps those bytes apart
// from the same text in UTF-8. The manifest's dump replaced them, its fields no longer hashed to the digest, and every
// lookup took the entry for corrupt, deleted it and compiled it again.
TEST(DiskCache, KeyFieldsThatAreNotUtf8SurviveTheManifest) {
  TempDir t;
  KeyFields f = fields("smla_dq");
  f.compiler_id += ";HIPRTC_COMPILE_OPTIONS_APPEND=-I/home/j\xfcrgen/inc";
  f.options.push_back("-I/opt/\xe9t\xe9");
  f.headers.emplace_back("caf\xe9.h", "#define X 1\n");
  FakeCompiler c;
  EXPECT_EQ(DiskCache(settings_for(t)).get_or_compile(f, c.fn(f)).origin, Origin::Compiled);
  DiskCache b(settings_for(t));
  const Fetched r = b.get_or_compile(f, c.fn(f));
  EXPECT_EQ(r.origin, Origin::Disk);
  EXPECT_EQ(r.binary, payload(f));
  EXPECT_EQ(c.calls, 1);
  EXPECT_EQ(b.stats().corrupt_replaced, 0);
  for (const EntryInfo& e : b.verify()) EXPECT_TRUE(e.ok) << e.name << ": " << e.problem;
  // The same text in UTF-8 is another key.
  KeyFields g = f;
  g.compiler_id = fields("smla_dq").compiler_id + ";HIPRTC_COMPILE_OPTIONS_APPEND=-I/home/j\xc3\xbcrgen/inc";
  EXPECT_EQ(b.get_or_compile(g, c.fn(g)).origin, Origin::Compiled);
}

// An entry removed between verify's listing and its check (a clear, prune or eviction beside a `smla-cache verify` in a
// cron job) is gone, not damaged: left out, where it was "BAD <entry>: missing" and verify's exit said "damaged". One
// still there is checked as ever.
TEST(DiskCache, AnEntryRemovedWhileVerifyRunsIsNotDamage) {
  TempDir t;
  KeyFields f = fields("smla_dq"), g = fields("smla_gather");
  FakeCompiler c;
  DiskCache a(settings_for(t));
  ASSERT_EQ(a.get_or_compile(f, c.fn(f)).origin, Origin::Compiled);
  ASSERT_EQ(a.get_or_compile(g, c.fn(g)).origin, Origin::Compiled);
  const std::vector<EntryInfo> listed = a.list();
  ASSERT_EQ(listed.size(), 2u);
  fs::remove_all(t / ("cache/entries/" + make_key(f).entry_name()));  // as another process's clear would
  const std::vector<EntryInfo> v = a.verify(listed);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].name, make_key(g).entry_name());
  EXPECT_TRUE(v[0].ok) << v[0].problem;
}

TEST(DiskCache, ThreadsShareOneCompilePerKey) {
  TempDir t;
  Settings s = settings_for(t);
  s.lock = false;  // only the in-process deduplication is under test here
  DiskCache cache(s);
  FakeCompiler c;
  c.sleep_ms = 100;
  KeyFields f = fields("smla_dq"), g = fields("smla_dkv");
  std::vector<std::thread> th;
  std::atomic<int> wrong{0};
  for (int i = 0; i < 8; ++i)
    th.emplace_back([&, i] {
      const KeyFields& x = i % 2 ? f : g;
      if (cache.get_or_compile(x, c.fn(x)).binary != payload(x)) ++wrong;
    });
  for (auto& x : th) x.join();
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(c.calls, 2) << "one compile per key";
  EXPECT_EQ(cache.stats().disk_hits, 6);
}

TEST(DiskCache, RefusedBinaryIsDeletedAndRecompiledOnce) {
  TempDir t;
  KeyFields f = fields("smla_dq");
  FakeCompiler c;
  DiskCache(settings_for(t)).get_or_compile(f, c.fn(f));
  LogCapture log;
  DiskCache b(settings_for(t));
  int asked = 0;
  auto refuse = [&](const std::vector<uint8_t>&) { ++asked; return false; };
  Fetched r = b.get_or_compile(f, c.fn(f), refuse);
  EXPECT_EQ(r.origin, Origin::Compiled);
  EXPECT_EQ(asked, 1) << "only binaries read from disk are offered to accept()";
  EXPECT_EQ(c.calls, 2);
  EXPECT_EQ(b.stats().corrupt_replaced, 1);
  EXPECT_EQ(log.count("refused"), 1) << log.text();
  EXPECT_NE(log.text().find(make_key(f).tag), std::string::npos);
  // The replacement is on disk and accepted next time.
  DiskCache d(settings_for(t));
  EXPECT_EQ(d.get_or_compile(f, c.fn(f), [](const std::vector<uint8_t>&) { return true; }).origin,
            Origin::Disk);
}

TEST(DiskCache, CompileErrorPropagatesAndPublishesNothing) {
  TempDir t;
  DiskCache cache(settings_for(t));
  KeyFields f = fields("smla_dq");
  EXPECT_THROW(cache.get_or_compile(f, []() -> CompileOutput { throw std::runtime_error("nvrtc: error"); }),
               std::runtime_error);
  EXPECT_TRUE(entry_names(t / "cache").empty());
  FakeCompiler c;
  EXPECT_EQ(cache.get_or_compile(f, c.fn(f)).binary, payload(f)) << "the key is not poisoned";
}

// A compiler that "succeeds" with no bytes: nothing is published (an entry no driver could load, which every process
// would then read as damage, delete and compile again); the result says why it was not stored.
TEST(DiskCache, AnEmptyCompileIsNotPublished) {
  TempDir t;
  LogCapture log;
  DiskCache cache(settings_for(t));
  KeyFields f = fields("smla_dq");
  Fetched r = cache.get_or_compile(f, [] { return CompileOutput{{}, "ptxas info: nothing"}; });
  EXPECT_EQ(r.origin, Origin::Compiled);
  EXPECT_TRUE(r.binary.empty());
  EXPECT_NE(r.not_stored.find("empty binary"), std::string::npos) << r.not_stored;
  EXPECT_TRUE(entry_names(t / "cache").empty()) << "an empty binary was published";
  EXPECT_EQ(cache.stats().publish_failures, 1);
}

TEST(DiskCache, SystemCacheAfterUserCacheAndNeverWritten) {
  TempDir t;
  KeyFields f = fields("smla_dq"), g = fields("smla_dkv");
  FakeCompiler c;
  {
    DiskCache sys(settings_for(t, "system"));
    sys.get_or_compile(f, c.fn(f));
    sys.get_or_compile(g, c.fn(g));
  }
  // The user cache has its own (different) binary for g: the user copy wins.
  {
    DiskCache u(settings_for(t));
    u.get_or_compile(g, [&] { return CompileOutput{payload(g, 999), ""}; });
  }
  Settings s = settings_for(t);
  s.system_dir = t / "system";
  DiskCache cache(s);
  FakeCompiler c2;
  Fetched rf = cache.get_or_compile(f, c2.fn(f));
  EXPECT_EQ(rf.origin, Origin::SystemDisk);
  EXPECT_EQ(rf.binary, payload(f));
  Fetched rg = cache.get_or_compile(g, c2.fn(g));
  EXPECT_EQ(rg.origin, Origin::Disk);
  EXPECT_EQ(rg.binary.size(), 999u);
  EXPECT_EQ(c2.calls, 0);
  EXPECT_EQ(entry_names(t / "cache").size(), 1u) << "system hits are not copied";
  // A refused system binary is skipped, not deleted (the system cache is read-only to us).
  DiskCache again(s);
  Fetched r = again.get_or_compile(f, c2.fn(f), [](const std::vector<uint8_t>&) { return false; });
  EXPECT_EQ(r.origin, Origin::Compiled);
  EXPECT_EQ(entry_names(t / "system").size(), 2u);
}

TEST(DiskCache, DisabledKeepsKernelsInMemory) {
  TempDir t;
  Settings s = settings_for(t);
  s.disable = true;
  DiskCache cache(s);
  KeyFields f = fields("smla_dq");
  FakeCompiler c;
  EXPECT_EQ(cache.get_or_compile(f, c.fn(f)).origin, Origin::Compiled);
  EXPECT_EQ(cache.get_or_compile(f, c.fn(f)).origin, Origin::Memory);
  EXPECT_EQ(c.calls, 1);
  EXPECT_FALSE(fs::exists(t / "cache"));
}

TEST(DiskCache, EvictionKeepsTheMostRecentlyUsed) {
  TempDir t;
  FakeCompiler c;
  const int64_t one = fake_entry_bytes(t);
  Settings s = settings_for(t);
  s.max_bytes = 3 * one + one / 2;  // room for three entries
  DiskCache cache(s);
  auto get = [&](int i) {
    KeyFields f = fields("k" + std::to_string(i));
    return cache.get_or_compile(f, c.fn(f)).origin;
  };
  for (int i = 0; i < 3; ++i) get(i);
  EXPECT_EQ(get(0), Origin::Disk);  // k0 is now the most recent, k1 the least
  get(3);
  auto names = [&] {
    std::vector<std::string> v;
    for (const auto& e : cache.list()) v.push_back(e.tag.substr(0, 2));
    return v;
  };
  EXPECT_EQ(names(), (std::vector<std::string>{"k0", "k2", "k3"}));
  EXPECT_LE(total_bytes(cache), s.max_bytes);
  EXPECT_EQ(cache.total_bytes(), total_bytes(cache)) << "the size alone differs from list()'s";
  EXPECT_EQ(get(2), Origin::Disk);
  get(4);
  EXPECT_EQ(names(), (std::vector<std::string>{"k2", "k3", "k4"}));
  EXPECT_LE(total_bytes(cache), s.max_bytes);
  EXPECT_EQ(get(1), Origin::Compiled) << "k1 was evicted";
}

// lookup() is get_or_compile() without the compile (plan() looks up all its kernels first, so that a compile's
// eviction takes none of them): a miss is nothing at once, with no file written; a hit is verified, refreshes the
// entry's recency like get_or_compile's, and comes from either cache or from memory.
TEST(DiskCache, LookupFindsWhatIsCachedAndCompilesNothing) {
  TempDir t;
  FakeCompiler c;
  const int64_t one = fake_entry_bytes(t);
  KeyFields sys_only = fields("k9");
  {
    DiskCache sys(settings_for(t, "system"));
    sys.get_or_compile(sys_only, c.fn(sys_only));
  }
  Settings s = settings_for(t);
  s.system_dir = t / "system";
  s.max_bytes = 2 * one + one / 2;  // room for two entries
  DiskCache cache(s);
  KeyFields k0 = fields("k0"), k1 = fields("k1"), k2 = fields("k2");
  EXPECT_FALSE(cache.lookup(k0).has_value());
  EXPECT_TRUE(entry_names(t / "cache").empty());
  EXPECT_EQ(cache.stats().compiles, 0);
  cache.get_or_compile(k0, c.fn(k0));
  cache.get_or_compile(k1, c.fn(k1));
  std::optional<Fetched> hit = cache.lookup(k0);  // k0 the most recent now, k1 the least
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->origin, Origin::Disk);
  EXPECT_EQ(hit->binary, payload(k0));
  cache.get_or_compile(k2, c.fn(k2));
  EXPECT_TRUE(cache.lookup(k0).has_value());
  EXPECT_FALSE(cache.lookup(k1).has_value()) << "k1 was the least recently used";
  std::optional<Fetched> from_sys = cache.lookup(sys_only);
  ASSERT_TRUE(from_sys.has_value());
  EXPECT_EQ(from_sys->origin, Origin::SystemDisk);
  // A binary the driver refuses is no hit; the entry is left, unsaid, for the get_or_compile that follows to judge
  // (which deletes it and compiles).
  {
    LogCapture logs;
    EXPECT_FALSE(cache.lookup(k2, [](const std::vector<uint8_t>&) { return false; }).has_value());
    EXPECT_EQ(logs.text(), "");
  }
  EXPECT_TRUE(cache.lookup(k2).has_value());
  EXPECT_EQ(cache.stats().corrupt_replaced, 0);
  EXPECT_EQ(cache.get_or_compile(k2, c.fn(k2), [](const std::vector<uint8_t>&) { return false; }).origin,
            Origin::Compiled);
  EXPECT_EQ(cache.stats().corrupt_replaced, 1);
  EXPECT_EQ(c.calls, 5) << "lookup compiled";  // k9, k0, k1, k2 and k2 again after its refusal
  Settings off = settings_for(t);
  off.disable = true;
  DiskCache mem(off);
  mem.get_or_compile(k0, c.fn(k0));
  std::optional<Fetched> kept = mem.lookup(k0);
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ(kept->origin, Origin::Memory);
}

// A bad entry that appears under the key's name while the kernel compiles (a copy in progress, a file) was taken for
// another process's publish of the key: "published", the bad entry left for the next load to delete and recompile. It
// is replaced now; a good one there is kept (the lost race).
TEST(DiskCache, APublishReplacesABadEntryInItsWayAndKeepsAGoodOne) {
  TempDir t;
  DiskCache cache(settings_for(t));
  KeyFields f = fields("k0"), g = fields("k1");
  const std::string fe = t / ("cache/entries/" + make_key(f).entry_name());
  auto plant_bad_dir = [&] {
    fs::create_directories(fe);
    std::ofstream(fe + "/kernel.bin") << "junk";
    return CompileOutput{payload(f), ""};
  };
  EXPECT_EQ(cache.get_or_compile(f, plant_bad_dir).origin, Origin::Compiled);
  EXPECT_EQ(cache.stats().publish_failures, 0);
  DiskCache again(settings_for(t));
  FakeCompiler c;
  Fetched r = again.get_or_compile(f, c.fn(f));
  EXPECT_EQ(r.origin, Origin::Disk) << "the bad entry stayed";
  EXPECT_EQ(r.binary, payload(f));
  const std::string ge = t / ("cache/entries/" + make_key(g).entry_name());
  auto plant_file = [&] {
    std::ofstream(ge) << "a file";
    return CompileOutput{payload(g), ""};
  };
  EXPECT_EQ(cache.get_or_compile(g, plant_file).origin, Origin::Compiled);
  EXPECT_EQ(cache.stats().publish_failures, 0) << "a file in the way failed the publish";
  EXPECT_EQ(again.get_or_compile(g, c.fn(g)).origin, Origin::Disk);
  // A good entry of the key published meanwhile (another process's) is kept: a lost race, no failure.
  KeyFields h = fields("k2");
  Settings no_lock = settings_for(t);
  no_lock.lock = false;  // (this process holds the key's lock while `compile` runs)
  DiskCache other(no_lock);
  auto publish_elsewhere = [&] {
    other.get_or_compile(h, c.fn(h));
    return CompileOutput{payload(h), ""};
  };
  EXPECT_EQ(cache.get_or_compile(h, publish_elsewhere).origin, Origin::Compiled);
  EXPECT_EQ(cache.stats().publish_failures, 0);
  EXPECT_EQ(c.calls, 1);
  EXPECT_EQ(again.get_or_compile(h, c.fn(h)).origin, Origin::Disk);
}

// A node whose clock ran ahead dates its entries in the future: such an entry sorts as the least recently used (it
// stayed the most recent for ever, and the entries really used went first).
TEST(DiskCache, EvictionTakesAnEntryDatedInTheFutureFirst) {
  TempDir t;
  FakeCompiler c;
  const int64_t one = fake_entry_bytes(t);
  Settings s = settings_for(t);
  s.max_bytes = 3 * one + one / 2;
  DiskCache cache(s);
  auto get = [&](int i) {
    KeyFields f = fields("k" + std::to_string(i));
    return cache.get_or_compile(f, c.fn(f)).origin;
  };
  for (int i = 0; i < 3; ++i) get(i);
  const std::string k0 = t / ("cache/entries/" + make_key(fields("k0")).entry_name());
  const time_t ahead = ::time(nullptr) + 365 * 24 * 3600;
  timespec ts[2] = {{ahead, 0}, {ahead, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, k0.c_str(), ts, 0), 0);
  get(3);
  std::vector<std::string> names;
  for (const auto& e : cache.list()) names.push_back(e.tag.substr(0, 2));
  EXPECT_EQ(names, (std::vector<std::string>{"k1", "k2", "k3"})) << "k0, dated a year ahead, goes first";
}

// Under a bound, each publish used to rescan and stat every entry: N publishes cost O(N^2)
// (4000 entries: 154 s against 8 s unbounded). Now a bound that is not reached costs about one
// scan, and a bound that is reached still holds after every publish.
TEST(DiskCache, ManyPublishesUnderABoundStayFastAndBounded) {
  TempDir t;
  // A big cache, made directly (no fsync): scanning it is what a publish must not repeat.
  const int existing = 5000, n = 100;
  for (int i = 0; i < existing; ++i) {
    std::string d = t / ("cache/entries/old" + std::to_string(i));
    fs::create_directories(d);
    std::ofstream(d + "/kernel.bin") << "old binary";
  }
  auto publish = [&](const std::string& prefix, int64_t max_bytes) {
    Settings s = settings_for(t);
    s.lock = false;
    s.max_bytes = max_bytes;
    DiskCache cache(s);
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) {
      KeyFields f = fields(prefix + std::to_string(i));
      cache.get_or_compile(f, [&] { return CompileOutput{payload(f, 64), ""}; });
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  double unbounded = publish("a", 0);
  double bounded = publish("b", int64_t(1) << 40);
  std::cout << "[ note ] " << n << " publishes into " << existing << " entries: unbounded " << unbounded
            << " s, under a bound " << bounded << " s\n";
  EXPECT_LT(bounded, 2 * unbounded + 1.0) << "rescanning the cache on every publish?";
  EXPECT_EQ(entry_names(t / "cache").size(), size_t(existing + 2 * n));

  // A bound that is reached holds after every publish, and the newest entries are kept.
  DiskCache probe(settings_for(t, "probe"));
  KeyFields f0 = fields("k0");
  probe.get_or_compile(f0, [&] { return CompileOutput{payload(f0, 64), ""}; });
  const int64_t one = probe.list().at(0).bytes;
  Settings s = settings_for(t, "tight");
  s.max_bytes = 10 * one + one / 2;
  DiskCache cache(s);
  for (int i = 0; i < 60; ++i) {
    KeyFields f = fields("k" + std::to_string(i));
    cache.get_or_compile(f, [&] { return CompileOutput{payload(f, 64), ""}; });
    int64_t total = 0;
    for (const auto& e : cache.list()) total += e.bytes;
    ASSERT_LE(total, s.max_bytes) << "after publish " << i;
  }
  EXPECT_GE(cache.list().size(), 9u) << "evicted down to 90% of the bound at most";
  EXPECT_EQ(cache.get_or_compile(fields("k59"), [] { return CompileOutput{}; }).origin, Origin::Disk);
}

TEST(DiskCache, StaleStagingIsCleanedUp) {
  TempDir t;
  Settings s = settings_for(t);
  const std::string& host = smla::cache::detail::host_name();  // as owner tags spell it
  const pid_t dead = dead_pid();
  std::string st = t / "cache/.staging/";
  fs::create_directories(st);
  std::string mine_dead = st + "stage." + host + "." + std::to_string(dead) + ".1";
  std::string mine_dead_new = st + "stage." + host + "." + std::to_string(dead) + ".5";
  std::string mine_alive = st + "stage." + host + "." + std::to_string(::getppid()) + ".2";
  std::string other_old = st + "stage.otherhost.12.3";
  std::string other_new = st + "stage.otherhost.12.4";
  for (auto& d : {mine_dead, mine_dead_new, mine_alive, other_old, other_new}) {
    fs::create_directories(d);
    std::ofstream(d + "/kernel.bin") << "partial";
  }
  timespec old[2] = {{::time(nullptr) - 7200, 0}, {::time(nullptr) - 7200, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, other_old.c_str(), old, 0), 0);
  // Older than the 10 minutes' grace for dead owners, younger than SMLA_CACHE_STALE_S.
  const time_t past = ::time(nullptr) - 20 * 60;
  timespec dead_old[2] = {{past, 0}, {past, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, mine_dead.c_str(), dead_old, 0), 0);
  DiskCache cache(s);
  EXPECT_FALSE(fs::exists(mine_dead)) << "owner pid is gone and the folder is old";
  EXPECT_TRUE(fs::exists(mine_dead_new))
      << "a dead pid with a fresh folder may be a live publisher in another PID namespace";
  EXPECT_TRUE(fs::exists(mine_alive)) << "owner is alive: may still be publishing";
  EXPECT_FALSE(fs::exists(other_old)) << "older than SMLA_CACHE_STALE_S";
  EXPECT_TRUE(fs::exists(other_new));
}

// The open's writability probe renames a staging dir to entries/.probe.<host>.<pid>.<rand> and
// removes it; a kill between the two left it there for ever. Opening removes those whose owner is
// gone, by the rule for staging dirs.
TEST(DiskCache, ProbeDirsLeftByAKilledOpenAreCleanedUp) {
  TempDir t;
  Settings s = settings_for(t);
  const std::string& host = smla::cache::detail::host_name();  // as owner tags spell it
  const pid_t dead = dead_pid();
  const std::string e = t / "cache/entries/.probe.", me = std::string(host) + ".";
  const std::string dead_old = e + me + std::to_string(dead) + ".1",
                    dead_new = e + me + std::to_string(dead) + ".2",
                    alive = e + me + std::to_string(::getppid()) + ".3", other_old = e + "otherhost.12.4",
                    other_new = e + "otherhost.12.5";
  const time_t now = ::time(nullptr);
  for (const auto& [d, age] : std::vector<std::pair<std::string, time_t>>{
           {dead_old, 20 * 60}, {dead_new, 0}, {alive, 20 * 60}, {other_old, 7200}, {other_new, 20 * 60}}) {
    fs::create_directories(d);
    timespec ts[2] = {{now - age, 0}, {now - age, 0}};
    ASSERT_EQ(::utimensat(AT_FDCWD, d.c_str(), ts, 0), 0);
  }
  DiskCache cache(s);
  ASSERT_TRUE(cache.writable());
  EXPECT_FALSE(fs::exists(dead_old)) << "owner pid is gone and the folder is old";
  EXPECT_TRUE(fs::exists(dead_new)) << "a dead pid with a fresh folder may be a live process in another PID namespace";
  EXPECT_TRUE(fs::exists(alive)) << "owner is alive";
  EXPECT_FALSE(fs::exists(other_old)) << "older than SMLA_CACHE_STALE_S";
  EXPECT_TRUE(fs::exists(other_new));
  // And the open's own probe left nothing behind.
  size_t probes = 0;
  for (const auto& x : fs::directory_iterator(t / "cache/entries"))
    probes += x.path().filename().string().rfind(".probe.", 0) == 0;
  EXPECT_EQ(probes, 3u);
}

}  // namespace smla::cache::test
