// Keys: every input that changes the compiled bytes changes the digest; order-only changes do not.
// Settings: each environment knob is read into the struct; bad values fall back to defaults.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <set>

#include "entry_store.hpp"
#include "test_util.hpp"

namespace smla::cache::test {

TEST(CacheKey, DigestAndName) {
  Key k = make_key(fields("smla_dq"));
  ASSERT_EQ(k.digest.size(), 32u);
  EXPECT_EQ(k.digest.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(k.tag, "smla_dq-H128-K512-R512");
  EXPECT_EQ(k.entry_name(), k.tag + "-" + k.digest);
  EXPECT_EQ(make_key(fields("smla_dq")).digest, k.digest) << "keys must be deterministic";
}

TEST(CacheKey, EveryInputChangesTheDigest) {
  const KeyFields base = fields("smla_dq");
  std::vector<KeyFields> v;
  auto add = [&](auto mutate) {
    KeyFields f = base;
    mutate(f);
    v.push_back(f);
  };
  add([](KeyFields& f) { f.source[f.source.size() / 2] ^= 1; });       // one source byte
  add([](KeyFields& f) { f.headers[1].second += " "; });                // header content
  add([](KeyFields& f) { f.headers[1].first = "tile2.h"; });            // header name
  add([](KeyFields& f) { f.options.push_back("-lineinfo"); });          // an option
  add([](KeyFields& f) { f.options[0] = "-O2"; });
  add([](KeyFields& f) { f.target = "sm_90"; });                        // target id
  add([](KeyFields& f) { f.target = "gfx950:sramecc+:xnack-"; });
  add([](KeyFields& f) { f.target = "gfx950:sramecc-:xnack-"; });       // feature flags count
  add([](KeyFields& f) { f.compiler_id = "nvrtc-13.1;cuda-headers-13010"; });
  add([](KeyFields& f) { f.kernel = "smla_dkv"; });
  add([](KeyFields& f) { f.shape_tag = "H64-K512-R512"; });
  // Field boundaries: moving text from one field to the next must not collide.
  add([](KeyFields& f) { f.options = {"-O3--std=c++17", "-DVARIANT=0"}; });
  // A field's text holding the serialization's own separators and the next label (only the length prefix keeps
  // these two apart: without it, both serialize as "kernel::k;shape::s;shape::;").
  add([](KeyFields& f) { f.kernel = "k;shape::s", f.shape_tag = ""; });
  add([](KeyFields& f) { f.kernel = "k", f.shape_tag = "s;shape::"; });
  std::set<std::string> seen{make_key(base).digest};
  for (size_t i = 0; i < v.size(); ++i)
    EXPECT_TRUE(seen.insert(make_key(v[i]).digest).second) << "mutation " << i << " kept the key";
}

TEST(CacheKey, OrderOfOptionsAndHeadersDoesNotMatter) {
  KeyFields a = fields("smla_dq"), b = a;
  std::reverse(b.options.begin(), b.options.end());
  std::reverse(b.headers.begin(), b.headers.end());
  EXPECT_EQ(make_key(a).digest, make_key(b).digest);
}

TEST(CacheKey, TagIsSanitized) {
  KeyFields f = fields("../evil kernel");
  f.shape_tag = "a/b";
  Key k = make_key(f);
  EXPECT_EQ(k.tag.find('/'), std::string::npos);
  EXPECT_EQ(k.tag.find(' '), std::string::npos);
  EXPECT_NE(k.tag[0], '.');
}

struct EnvGuard {
  std::vector<std::string> names;
  void set(const char* n, const char* v) {
    names.push_back(n);
    ::setenv(n, v, 1);
  }
  ~EnvGuard() {
    for (auto& n : names) ::unsetenv(n.c_str());
  }
};

TEST(CacheSettings, ReadsEveryKnob) {
  EnvGuard g;
  g.set("SMLA_CACHE_DIR", "/x/cache");
  g.set("SMLA_CACHE_SYSTEM_DIR", "/opt/smla/cache");
  g.set("SMLA_CACHE_DISABLE", "1");
  g.set("SMLA_CACHE_READONLY", "yes");
  g.set("SMLA_CACHE_MAX_BYTES", "512M");
  g.set("SMLA_CACHE_LOCK", "0");
  g.set("SMLA_CACHE_LOCK_DIR", "/run/l");
  g.set("SMLA_CACHE_LOCK_TIMEOUT_S", "2.5");
  g.set("SMLA_CACHE_STALE_S", "60");
  g.set("SMLA_CACHE_TEST_FAIL_WRITES", "1");
  g.set("SMLA_CACHE_TEST_PUBLISH_DELAY_MS", "7");
  Settings s = settings_from_env();
  EXPECT_EQ(s.dir, "/x/cache");
  EXPECT_EQ(s.system_dir, "/opt/smla/cache");
  EXPECT_TRUE(s.disable);
  EXPECT_TRUE(s.readonly);
  EXPECT_EQ(s.max_bytes, int64_t(512) << 20);
  EXPECT_FALSE(s.lock);
  EXPECT_EQ(s.lock_dir, "/run/l");
  EXPECT_DOUBLE_EQ(s.lock_timeout_s, 2.5);
  EXPECT_EQ(s.stale_staging_s, 60);
  EXPECT_TRUE(s.test_fail_writes);
  EXPECT_EQ(s.test_publish_delay_ms, 7);
  // Huge values mean never / an hour: they were cast past int64 and int, a negative staging age limit that removed
  // every other process's publish at once, and no delay.
  for (const char* huge : {"99999999999999999999", "1e30", "inf", "10000000000"}) {
    g.set("SMLA_CACHE_STALE_S", huge);
    g.set("SMLA_CACHE_TEST_PUBLISH_DELAY_MS", huge);
    s = settings_from_env();
    EXPECT_EQ(s.stale_staging_s, int64_t(1000000000)) << huge;
    EXPECT_EQ(s.test_publish_delay_ms, 3600000) << huge;
  }
  EXPECT_FALSE(detail::owner_gone("otherhost.4242.abcd", int64_t(5) * 1000000000, s.stale_staging_s))
      << "a 5 s old staging of another host was gone under a huge SMLA_CACHE_STALE_S";
  EXPECT_TRUE(detail::owner_gone("otherhost.4242.abcd", int64_t(61) * 1000000000, 60));
  EXPECT_FALSE(detail::owner_gone("otherhost.4242.abcd", int64_t(59) * 1000000000, 60));
  // Dated as far ahead as the limit and past detail::kFutureSlackS (a clock that ran ahead): stale too; a peer whose
  // clock is a minute ahead is not, even under a limit of a minute.
  EXPECT_TRUE(detail::owner_gone("otherhost.4242.abcd", -(detail::kFutureSlackS + 1) * 1000000000, 60));
  EXPECT_FALSE(detail::owner_gone("otherhost.4242.abcd", -int64_t(61) * 1000000000, 60));
  EXPECT_FALSE(detail::owner_gone("otherhost.4242.abcd", -int64_t(5) * 1000000000, 60));
  // Under a minute would take another process's publish in flight for left over: ignored (0 was accepted).
  for (const char* tiny : {"0", "59", "-1"}) {
    g.set("SMLA_CACHE_STALE_S", tiny);
    EXPECT_EQ(settings_from_env().stale_staging_s, Settings{}.stale_staging_s) << tiny;
  }
}

TEST(CacheSettings, DefaultsAndBadValues) {
  EnvGuard g;
  g.set("XDG_CACHE_HOME", "/xdg");
  g.set("SMLA_CACHE_MAX_BYTES", "lots");
  g.set("SMLA_CACHE_DISABLE", "maybe");
  g.set("SMLA_CACHE_LOCK_TIMEOUT_S", "-3");
  ::unsetenv("SMLA_CACHE_DIR");
  LogCapture log;
  Settings s = settings_from_env();
  Settings d;
  EXPECT_EQ(s.dir, "/xdg/smla");
  EXPECT_EQ(s.max_bytes, d.max_bytes);
  EXPECT_FALSE(s.disable);
  EXPECT_DOUBLE_EQ(s.lock_timeout_s, d.lock_timeout_s);
  EXPECT_EQ(log.count("ignoring"), 3) << log.text();
}

// The lock location must not depend on the environment beyond SMLA_CACHE_LOCK_DIR: processes
// sharing a cache would otherwise use different locks.
TEST(CacheSettings, LockDirFollowsOnlySmlaCacheLockDir) {
  EnvGuard g;
  g.set("SMLA_CACHE_DIR", "/x/cache");
  ::unsetenv("SMLA_CACHE_LOCK_DIR");
  g.set("XDG_RUNTIME_DIR", "/run/user/1234");
  const std::string with_xdg = settings_from_env().lock_dir;
  ::unsetenv("XDG_RUNTIME_DIR");
  EXPECT_EQ(settings_from_env().lock_dir, with_xdg);
  EXPECT_EQ(with_xdg, "") << "empty: derived from the cache directory";
  g.set("SMLA_CACHE_LOCK_DIR", "/run/l");
  EXPECT_EQ(settings_from_env().lock_dir, "/run/l");
}

TEST(CacheSettings, NetworkFilesystemsAreRecognized) {
  EXPECT_STREQ(detail::network_fs_type(0x6969), "nfs");
  EXPECT_STREQ(detail::network_fs_type(0x0BD00BD0), "lustre");
  EXPECT_STREQ(detail::network_fs_type(0x47504653), "gpfs");
  EXPECT_STREQ(detail::network_fs_type(long(0xFF534D42)), "cifs");
  EXPECT_STREQ(detail::network_fs_type(0x65735546), "fuse");
  EXPECT_EQ(detail::network_fs_type(0xEF53), nullptr) << "ext4 is local";
  EXPECT_EQ(detail::network_fs_type(0x01021994), nullptr) << "tmpfs is local";
  EXPECT_EQ(detail::network_fs_of("/proc"), nullptr);
}

TEST(CacheSettings, ByteSizes) {
  int64_t v = 0;
  EXPECT_TRUE(parse_byte_size("1000", &v));
  EXPECT_EQ(v, 1000);
  EXPECT_TRUE(parse_byte_size("4G", &v));
  EXPECT_EQ(v, int64_t(4) << 30);
  EXPECT_TRUE(parse_byte_size("64KiB", &v));
  EXPECT_EQ(v, 64 << 10);
  EXPECT_FALSE(parse_byte_size("4X", &v));
  EXPECT_FALSE(parse_byte_size("", &v));
  EXPECT_FALSE(parse_byte_size("-1", &v));
  // Values that do not fit in int64 are rejected, not wrapped (9999999T was negative).
  v = 7;
  EXPECT_FALSE(parse_byte_size("9999999T", &v));
  EXPECT_FALSE(parse_byte_size("8388608T", &v));
  EXPECT_FALSE(parse_byte_size("999999999999999G", &v));
  EXPECT_FALSE(parse_byte_size("9999999999999999", &v)) << "too many digits";
  EXPECT_EQ(v, 7) << "untouched on failure";
  EXPECT_TRUE(parse_byte_size("8388607T", &v));
  EXPECT_EQ(v, INT64_MAX >> 40 << 40);
  EXPECT_TRUE(parse_byte_size("999999999999999", &v));
  EXPECT_EQ(v, 999999999999999);
}

TEST(CacheSettings, OverflowingMaxBytesKeepsTheDefault) {
  EnvGuard g;
  g.set("SMLA_CACHE_MAX_BYTES", "9999999T");
  LogCapture log;
  EXPECT_EQ(settings_from_env().max_bytes, Settings().max_bytes);
  EXPECT_EQ(log.count("ignoring SMLA_CACHE_MAX_BYTES"), 1) << log.text();
}

}  // namespace smla::cache::test
