// Damaged entries: each kind is named by `smla-cache verify` (exit 1), then on load detected,
// logged with the key's tag, deleted and replaced by a fresh compile, and never served again.
#include <gtest/gtest.h>

#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "entry_store.hpp"
#include "test_util.hpp"

namespace smla::cache::test {

enum class Damage {
  Truncated, BitFlipped, ZeroLength, WrongKey, ManifestGarbage, NoBinary, ForgedDigest,
  EmptyBinaryItsManifestAgrees,  // a zero-byte binary whose manifest says 0 bytes with that checksum
  LinkedBinary,                  // kernel.bin a symbolic link to a copy of its own bytes, outside the entry
};

struct Case {
  Damage d;
  const char* name;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class Corruption : public ::testing::TestWithParam<Case> {};

static void damage(Damage d, const std::string& entry, const std::string& other_entry) {
  std::string bin = entry + "/kernel.bin";
  std::string b = slurp(bin);
  auto write = [](const std::string& p, const std::string& s) {
    std::ofstream(p, std::ios::binary | std::ios::trunc) << s;
  };
  switch (d) {
    case Damage::Truncated: write(bin, b.substr(0, b.size() / 2)); break;
    case Damage::BitFlipped: b[b.size() / 2] ^= 0x10; write(bin, b); break;
    case Damage::ZeroLength: write(bin, ""); break;
    case Damage::WrongKey:  // a complete, self-consistent entry of another key under this name
      for (const char* f : {"kernel.bin", "manifest.json", "source.txt"})
        write(entry + "/" + f, slurp(other_entry + "/" + f));
      break;
    case Damage::ManifestGarbage: write(entry + "/manifest.json", "\x7f" "ELF garbage {"); break;
    case Damage::NoBinary: fs::remove(bin); break;
    case Damage::EmptyBinaryItsManifestAgrees: {  // nothing a driver could load, however consistent the manifest
      nlohmann::json j = nlohmann::json::parse(slurp(entry + "/manifest.json"));
      j["binary_bytes"] = 0;
      j["binary_xxh3"] = detail::hash_hex(std::string());
      write(bin, "");
      write(entry + "/manifest.json", j.dump(2));
      break;
    }
    case Damage::LinkedBinary:  // the bytes would pass every check; a file of an entry is never followed out of it
      write(entry + "/../../../elsewhere.bin", b);
      fs::remove(bin);
      fs::create_symlink("../../../elsewhere.bin", bin);
      break;
    case Damage::ForgedDigest: {  // manifest claims this key's digest but describes another kernel
      std::string m = slurp(entry + "/manifest.json");
      size_t p = m.find("\"target\": \"sm_90a\"");
      ASSERT_NE(p, std::string::npos) << m;
      m.replace(p, 18, "\"target\": \"sm_100\"");
      write(entry + "/manifest.json", m);
      break;
    }
  }
}

TEST_P(Corruption, DetectedNamedReplacedLogged) {
  TempDir t;
  KeyFields f = fields("smla_dq"), g = fields("smla_dkv");
  FakeCompiler c;
  {
    DiskCache a(settings_for(t));
    a.get_or_compile(f, c.fn(f));
    a.get_or_compile(g, c.fn(g));
  }
  std::string name = make_key(f).entry_name(), good = make_key(g).entry_name();
  damage(GetParam().d, t / ("cache/entries/" + name), t / ("cache/entries/" + good));

  auto [rc, out] = run_cmd(std::string(SMLA_CACHE_TOOL) + " --dir " + (t / "cache") + " verify");
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("BAD " + name), std::string::npos) << out;
  EXPECT_EQ(out.find("BAD " + good), std::string::npos) << out;

  LogCapture log;
  DiskCache b(settings_for(t));
  c.calls = 0;
  Fetched r = b.get_or_compile(f, c.fn(f));
  EXPECT_EQ(r.origin, Origin::Compiled);
  EXPECT_EQ(r.binary, payload(f));
  EXPECT_EQ(c.calls, 1);
  EXPECT_EQ(b.stats().corrupt_replaced, 1);
  EXPECT_EQ(b.stats().corrupt_kept, 0);
  EXPECT_EQ(log.count("corrupt cache entry"), 1) << log.text();
  EXPECT_EQ(log.count("deleted it"), 1) << log.text();
  EXPECT_NE(log.text().find("[" + make_key(f).tag + "]"), std::string::npos) << log.text();
  EXPECT_EQ(b.get_or_compile(g, c.fn(g)).origin, Origin::Disk) << "the other entry is untouched";

  // Replaced on disk: verify passes and a fresh process gets a hit, not the damage again.
  auto [rc2, out2] = run_cmd(std::string(SMLA_CACHE_TOOL) + " --dir " + (t / "cache") + " verify");
  EXPECT_EQ(rc2, 0) << out2;
  DiskCache d(settings_for(t));
  Fetched r2 = d.get_or_compile(f, c.fn(f));
  EXPECT_EQ(r2.origin, Origin::Disk);
  EXPECT_EQ(r2.binary, payload(f));
}

INSTANTIATE_TEST_SUITE_P(Kinds, Corruption,
                         ::testing::Values(Case{Damage::Truncated, "Truncated"},
                                           Case{Damage::BitFlipped, "BitFlipped"},
                                           Case{Damage::ZeroLength, "ZeroLength"},
                                           Case{Damage::WrongKey, "WrongKey"},
                                           Case{Damage::ManifestGarbage, "ManifestGarbage"},
                                           Case{Damage::NoBinary, "NoBinary"},
                                           Case{Damage::ForgedDigest, "ForgedDigest"},
                                           Case{Damage::EmptyBinaryItsManifestAgrees, "EmptyBinaryItsManifestAgrees"},
                                           Case{Damage::LinkedBinary, "LinkedBinary"}),
                         [](const auto& i) { return std::string(i.param.name); });

// In read-only mode a bad entry cannot be deleted: it is skipped every time, never served.
TEST(CorruptionReadOnly, SkippedNotServed) {
  TempDir t;
  KeyFields f = fields("smla_dq");
  FakeCompiler c;
  DiskCache(settings_for(t)).get_or_compile(f, c.fn(f));
  damage(Damage::BitFlipped, t / ("cache/entries/" + make_key(f).entry_name()), "");
  Settings s = settings_for(t);
  s.readonly = true;
  LogCapture log;
  DiskCache ro(s);
  EXPECT_FALSE(ro.writable());
  Fetched r = ro.get_or_compile(f, c.fn(f));
  EXPECT_EQ(r.origin, Origin::Compiled);
  EXPECT_EQ(r.binary, payload(f));
  EXPECT_EQ(ro.get_or_compile(f, c.fn(f)).origin, Origin::Memory);
  EXPECT_TRUE(fs::exists(t / ("cache/entries/" + make_key(f).entry_name()))) << "read-only: kept";
  // The log and the counters say it was kept, not deleted.
  EXPECT_EQ(ro.stats().corrupt_replaced, 0);
  EXPECT_EQ(ro.stats().corrupt_kept, 1);
  EXPECT_EQ(log.count("corrupt cache entry"), 1) << log.text();
  EXPECT_EQ(log.count("delet"), 0) << log.text();
  EXPECT_EQ(log.count("keeping it"), 1) << log.text();
}

// An entry that is a symbolic link to a good directory (a system cache made as a forest of links, as Nix and Spack
// views make them) is served, verified, and not damage; removing a bad one removes the link, not what it names.
TEST(EntryAccess, ALinkedEntryIsServedAndOnlyTheLinkIsEverRemoved) {
  TempDir t;
  KeyFields f = fields("k0"), g = fields("k1");
  FakeCompiler c;
  {
    DiskCache warm(settings_for(t, "store"));
    warm.get_or_compile(f, c.fn(f));
    warm.get_or_compile(g, c.fn(g));
  }
  fs::create_directories(t / "sys/entries");
  for (const KeyFields* k : {&f, &g}) {
    const std::string name = make_key(*k).entry_name();
    fs::create_symlink(t / ("store/entries/" + name), t / ("sys/entries/" + name));
  }
  Settings s = settings_for(t);
  s.system_dir = t / "sys";
  {
    LogCapture logs;
    DiskCache cache(s);
    EXPECT_EQ(cache.get_or_compile(f, c.fn(f)).origin, Origin::SystemDisk);
    EXPECT_EQ(logs.count("corrupt"), 0) << logs.text();
  }
  auto [rc, out] = run_cmd(std::string(SMLA_CACHE_TOOL) + " --dir " + (t / "sys") + " verify");
  EXPECT_EQ(rc, 0) << out;
  // In the user cache: a link to a damaged entry is removed as damage, the directory it names left alone.
  const std::string gname = make_key(g).entry_name();
  fs::create_directories(t / "user/entries");
  fs::create_symlink(t / ("store/entries/" + gname), t / ("user/entries/" + gname));
  std::ofstream(t / ("store/entries/" + gname + "/kernel.bin"), std::ios::trunc) << "damaged";
  Settings u = settings_for(t, "user");
  DiskCache user(u);
  EXPECT_EQ(user.get_or_compile(g, c.fn(g)).origin, Origin::Compiled);
  EXPECT_TRUE(fs::is_directory(t / ("store/entries/" + gname))) << "the linked directory was deleted";
  EXPECT_FALSE(fs::is_symlink(t / ("user/entries/" + gname)));
  EXPECT_EQ(DiskCache(u).get_or_compile(g, c.fn(g)).origin, Origin::Disk);
  // A link to nothing is damage, not a miss: a publish could never rename over it, and each process compiled again.
  const std::string fname = make_key(f).entry_name();
  fs::create_symlink(t / "nowhere", t / ("user/entries/" + fname));
  EXPECT_EQ(DiskCache(u).get_or_compile(f, c.fn(f)).origin, Origin::Compiled);
  EXPECT_EQ(DiskCache(u).get_or_compile(f, c.fn(f)).origin, Origin::Disk);
}

// Entries a user may search but not list (mode 0711: another user's, in a shared cache) are read as their files
// always were: opening the entry's directory to read it needed read permission, and such entries were "unreadable".
TEST(EntryAccess, AnEntryThatMayOnlyBeSearchedIsRead) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as another user (CI runs as root)";
  TempDir t;
  KeyFields f = fields("k0");
  {
    FakeCompiler c;
    DiskCache(settings_for(t)).get_or_compile(f, c.fn(f));
  }
  ASSERT_EQ(::chmod(t.path.c_str(), 0755), 0);
  const std::string e = t / ("cache/entries/" + make_key(f).entry_name());
  ASSERT_EQ(::chmod(e.c_str(), 0711), 0);
  Settings s = settings_for(t);
  s.readonly = true;
  s.lock = false;
  EXPECT_EQ(run_as(54321, 54320, [&] {
              DiskCache cache(s);
              FakeCompiler c;
              const Fetched r = cache.get_or_compile(f, c.fn(f));
              return r.origin == Origin::Disk && c.calls == 0 ? std::string()
                                                              : "not served from disk (" +
                                                                    std::string(origin_name(r.origin)) + ")";
            }),
            "");
}

// A publish that finds its name taken, since its lookup, by an entry it cannot read (here one that appeared during the
// compile, mode 0000) has no verdict on it: it is another process's publish, left in place, and this one's kernel is
// the same. Judged bad, it was moved away or the publish failed saying a bad entry held the name.
TEST(EntryAccess, APublishLeavesAnEntryItCannotReadInPlace) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as another user (root reads any entry; CI runs as root)";
  TempDir t;
  KeyFields f = fields("k0");
  const std::string e = t / ("cache/entries/" + make_key(f).entry_name());
  fs::create_directories(t / "cache/entries");
  fs::create_directories(t / "cache/.staging");
  for (const std::string& d : {t.path, t / "cache", t / "cache/entries", t / "cache/.staging"})
    ASSERT_EQ(::chmod(d.c_str(), 0777), 0) << d;
  Settings s = settings_for(t);
  s.lock = false;
  EXPECT_EQ(run_as(54321, 54320, [&] {
              DiskCache cache(s);
              if (!cache.writable()) return std::string("the cache is not writable for this user");
              auto compile = [&] {  // meanwhile, the name is taken by an entry nobody here may read
                fs::create_directories(e);
                std::ofstream(e + "/manifest.json") << "{}";
                ::chmod(e.c_str(), 0);
                return CompileOutput{payload(f), ""};
              };
              const Fetched r = cache.get_or_compile(f, compile);
              if (r.origin != Origin::Compiled || r.binary != payload(f)) return std::string("not compiled");
              if (!r.not_stored.empty()) return "not stored: " + r.not_stored;
              return std::string();
            }),
            "");
  struct stat st {};
  ASSERT_EQ(::stat(e.c_str(), &st), 0) << "the unreadable entry was removed";
  EXPECT_EQ(st.st_mode & 07777, 0u) << "the unreadable entry was replaced";
  EXPECT_EQ(count_dir(t / "cache/.staging"), 0u) << "the publish left its staging";
}

// A manifest that cannot be opened for a reason outside the entry (here: this process is out of file descriptors, as
// a training job at its ulimit is) says nothing about the entry: it is left for the processes that can read it, and
// this one compiles into memory. It used to be "unreadable manifest": deleted, for every rank of the job.
TEST(EntryAccess, TooManyOpenFilesLeavesAGoodEntryInPlace) {
#if defined(__SANITIZE_ADDRESS__)
  // (the sanitizers' runtimes need descriptors of their own: without any, UBSan misreported spdlog's formatter as an
  // invalid vptr; the plain build runs it)
  GTEST_SKIP() << "not under the sanitizers: a process out of file descriptors is out of them for their runtime too";
#endif
  TempDir t;
  KeyFields f = fields("smla_dq");
  FakeCompiler c;
  DiskCache(settings_for(t)).get_or_compile(f, c.fn(f));
  const std::string entry = t / ("cache/entries/" + make_key(f).entry_name());
  ASSERT_TRUE(fs::exists(entry + "/manifest.json"));
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    DiskCache b(settings_for(t));
    while (::open("/dev/null", O_RDONLY) >= 0) {
    }
    if (errno != EMFILE) ::_exit(10);
    FakeCompiler cc;
    const Fetched r = b.get_or_compile(f, cc.fn(f));
    int code = 0;
    if (r.origin != Origin::Compiled || r.binary != payload(f)) code |= 1;
    if (b.stats().unreadable != 1) code |= 2;
    if (b.stats().corrupt_replaced != 0 || b.stats().corrupt_kept != 0) code |= 4;
    if (b.get_or_compile(f, cc.fn(f)).origin != Origin::Memory) code |= 8;
    if (!fs::exists(entry + "/manifest.json")) code |= 16;
    ::_exit(code);
  }
  int st = 0;
  ASSERT_EQ(::waitpid(child, &st, 0), child);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 0) << "1: not compiled or wrong binary, 2: not counted unreadable, 4: counted corrupt, "
                                   "8: not kept in memory, 16: the entry was deleted, 10: no EMFILE";
  DiskCache d(settings_for(t));
  c.calls = 0;
  EXPECT_EQ(d.get_or_compile(f, c.fn(f)).origin, Origin::Disk) << "the good entry is still served";
  EXPECT_EQ(c.calls, 0);
}

// A FIFO (or a device) in an entry's place of a file is a damaged entry: named by verify, deleted and recompiled; the
// lookup does not block on it (it used to wait for a writer for ever, holding the key's mutex).
TEST(EntryAccess, AFifoInAnEntryNeitherBlocksNorIsServed) {
  TempDir t;
  KeyFields f = fields("smla_dq");
  FakeCompiler c;
  DiskCache(settings_for(t)).get_or_compile(f, c.fn(f));
  const std::string name = make_key(f).entry_name(), entry = t / ("cache/entries/" + name);
  for (const char* file : {"manifest.json", "kernel.bin"}) {
    SCOPED_TRACE(file);
    if (!fs::exists(entry + "/manifest.json")) DiskCache(settings_for(t)).get_or_compile(f, c.fn(f));
    fs::remove(entry + "/" + file);
    ASSERT_EQ(::mkfifo((entry + "/" + file).c_str(), 0644), 0);
    auto [rc, out] = run_cmd("timeout 20 " + std::string(SMLA_CACHE_TOOL) + " --dir " + (t / "cache") + " verify");
    EXPECT_EQ(rc, 1) << out;
    EXPECT_NE(out.find("BAD " + name), std::string::npos) << out;
    DiskCache b(settings_for(t));
    c.calls = 0;
    const Fetched r = b.get_or_compile(f, c.fn(f));
    EXPECT_EQ(r.origin, Origin::Compiled);
    EXPECT_EQ(r.binary, payload(f));
    EXPECT_EQ(b.stats().corrupt_replaced, 1);
  }
}

// A manifest whose readable fields have the wrong type: the tool lists and verifies (BAD) instead of aborting.
TEST(EntryAccess, AManifestFieldOfTheWrongTypeIsReportedNotFatal) {
  TempDir t;
  KeyFields f = fields("smla_dq");
  FakeCompiler c;
  DiskCache(settings_for(t)).get_or_compile(f, c.fn(f));
  const std::string name = make_key(f).entry_name(), m = t / ("cache/entries/" + name + "/manifest.json");
  std::string text = slurp(m);
  for (const char* k : {"\"tag\": \"", "\"target\": \"", "\"compiler_id\": \""}) {
    const size_t at = text.find(k);
    ASSERT_NE(at, std::string::npos) << k << text;
    const size_t end = text.find('"', at + std::strlen(k));
    text.replace(at + std::strlen(k) - 1, end - (at + std::strlen(k)) + 2, "5");
  }
  std::ofstream(m, std::ios::trunc) << text;
  for (const char* cmd : {" list", " verify"}) {
    auto [rc, out] = run_cmd(std::string(SMLA_CACHE_TOOL) + " --dir " + (t / "cache") + cmd + " 2>&1");
    EXPECT_EQ(rc, std::string(cmd) == " list" ? 0 : 1) << cmd << ": " << out;
    EXPECT_NE(out.find(name), std::string::npos) << cmd << ": " << out;
    EXPECT_EQ(out.find("terminate"), std::string::npos) << cmd << ": " << out;
  }
}

}  // namespace smla::cache::test
