// Degraded modes: whatever is wrong with the cache directory, get_or_compile still returns the
// right binary (from memory when the disk is unusable), warns, and never throws.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include "test_util.hpp"

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

// /proc refuses new entries even to root, so this is a truly unwritable directory in CI (which
// runs as root, where chmod would not stop anything).
TEST(Degraded, UnwritableDirectory) {
  TempDir t;
  Settings s = settings_for(t);
  s.dir = "/proc";
  LogCapture log;
  DiskCache cache(s);
  EXPECT_FALSE(cache.writable());
  EXPECT_EQ(log.count("cannot write cache directory"), 1) << log.text();
  expect_works_in_memory(cache);
}

// A populated directory made read-only with chmod: hits are still served. Root ignores file
// permissions, so as root this case is covered by UnwritableDirectory and ReadonlyKnob instead.
TEST(Degraded, ChmodReadOnlyDirectoryStillServesHits) {
  if (::geteuid() == 0) GTEST_SKIP() << "running as root: chmod does not make a directory read-only";
  TempDir t;
  KeyFields h = fields("smla_sink");
  FakeCompiler c;
  DiskCache(settings_for(t)).get_or_compile(h, c.fn(h));
  for (auto d : {t / "cache/entries", t / "cache/.staging", t / "cache"}) ::chmod(d.c_str(), 0555);
  DiskCache cache(settings_for(t));
  EXPECT_FALSE(cache.writable());
  EXPECT_EQ(cache.get_or_compile(h, c.fn(h)).origin, Origin::Disk);
  expect_works_in_memory(cache);
  for (auto d : {t / "cache", t / "cache/entries", t / "cache/.staging"}) ::chmod(d.c_str(), 0755);
}

TEST(Degraded, ReadonlyKnobServesHitsAndWritesNothing) {
  TempDir t;
  KeyFields h = fields("smla_sink");
  FakeCompiler c;
  DiskCache(settings_for(t)).get_or_compile(h, c.fn(h));
  Settings s = settings_for(t);
  s.readonly = true;
  DiskCache cache(s);
  EXPECT_FALSE(cache.writable());
  EXPECT_EQ(cache.get_or_compile(h, c.fn(h)).origin, Origin::Disk);
  expect_works_in_memory(cache);
  EXPECT_EQ(entry_names(t / "cache").size(), 1u);
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
    EXPECT_EQ(cache.get_or_compile(f, c.fn(f)).origin, Origin::Compiled);
  }
  DiskCache again(s);
  KeyFields f = fields("smla_dq");
  FakeCompiler c;
  EXPECT_EQ(again.get_or_compile(f, c.fn(f)).origin, Origin::Disk);
}

TEST(Degraded, FileWhereTheDirectoryShouldBe) {
  TempDir t;
  std::ofstream(t / "cache") << "not a directory";
  for (std::string dir : {t / "cache", t / "cache/sub"}) {
    Settings s = settings_for(t);
    s.dir = dir;
    LogCapture log;
    DiskCache cache(s);
    EXPECT_FALSE(cache.writable()) << dir;
    EXPECT_EQ(log.count("cannot write cache directory"), 1) << log.text();
    expect_works_in_memory(cache);
  }
  EXPECT_EQ(slurp(t / "cache"), "not a directory") << "the file in the way is left alone";
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
}

}  // namespace smla::cache::test
