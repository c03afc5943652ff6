// The smla-cache tool, run as a separate process: list, prune, clear, export and import.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <fstream>
#include <tuple>

#include "test_util.hpp"

namespace smla::cache::test {

static std::pair<int, std::string> tool(const std::string& dir, const std::string& args) {
  return run_cmd(std::string(SMLA_CACHE_TOOL) + " --dir " + dir + " " + args);
}

static void populate(const std::string& dir, int n) {
  Settings s;
  s.dir = dir;
  s.lock = false;
  s.max_bytes = 0;
  DiskCache c(s);
  FakeCompiler fc;
  for (int i = 0; i < n; ++i) {
    KeyFields f = fields("k" + std::to_string(i));
    c.get_or_compile(f, fc.fn(f));
  }
}

// A bundle of `n` fake entries exported from their own cache under `t` (t/a); its path, its bytes in `*bytes`.
static std::string exported_bundle(const TempDir& t, int n, std::string* bytes) {
  populate(t / "a", n);
  const std::string bundle = t / "b.smlacb";
  auto [rc, out] = tool(t / "a", "export " + bundle);
  EXPECT_EQ(rc, 0) << out;
  *bytes = slurp(bundle);
  return bundle;
}

TEST(Tool, ListShowsTagTargetAndSize) {
  TempDir t;
  populate(t / "c", 2);
  auto [rc, out] = tool(t / "c", "list");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("k1-H128-K512-R512"), std::string::npos) << out;
  EXPECT_NE(out.find("sm_90a"), std::string::npos) << out;
  EXPECT_NE(out.find("2 entries"), std::string::npos) << out;
  // Each compiler's entries counted, so a cache carried to another machine is checked against its compiler there.
  EXPECT_NE(out.find("\n2 entries by compiler nvrtc-13.0;cuda-headers-13000\n"), std::string::npos) << out;
  {
    Settings s;
    s.dir = t / "c";
    s.lock = false;
    DiskCache c(s);
    FakeCompiler fc;
    KeyFields f = fields("k9");
    f.compiler_id = "nvrtc-13.0;other-headers";
    c.get_or_compile(f, fc.fn(f));
  }
  auto [rc2, out2] = tool(t / "c", "list");
  EXPECT_EQ(rc2, 0) << out2;
  EXPECT_NE(out2.find("\n2 entries by compiler nvrtc-13.0;cuda-headers-13000\n"), std::string::npos) << out2;
  EXPECT_NE(out2.find("\n1 entries by compiler nvrtc-13.0;other-headers\n"), std::string::npos) << out2;
}

TEST(Tool, PruneKeepsNewestAndClearEmpties) {
  TempDir t;
  populate(t / "c", 4);  // k3 is the most recently used
  int64_t one = 0;
  {
    Settings s;
    s.dir = t / "c";
    s.readonly = true;
    for (const auto& e : DiskCache(s).list()) one = std::max(one, e.bytes);
  }
  auto [rc, out] = tool(t / "c", "prune --max-bytes " + std::to_string(2 * one));
  EXPECT_EQ(rc, 0) << out;
  auto names = entry_names(t / "c");
  ASSERT_EQ(names.size(), 2u) << out;
  EXPECT_EQ(names[0].substr(0, 3), "k2-");
  EXPECT_EQ(names[1].substr(0, 3), "k3-");
  EXPECT_NE(tool(t / "c", "prune --max-bytes 12Q").first, 0) << "a malformed size is an error";
  // It wrapped negative and emptied the cache.
  auto [rc_big, out_big] = tool(t / "c", "prune --max-bytes 9999999T");
  EXPECT_EQ(rc_big, 2) << out_big;
  EXPECT_NE(out_big.find("is not a size"), std::string::npos) << out_big;
  EXPECT_EQ(entry_names(t / "c").size(), 2u) << "an overflowing bound evicts nothing";
  auto [rc2, out2] = tool(t / "c", "clear");
  EXPECT_EQ(rc2, 0) << out2;
  EXPECT_TRUE(entry_names(t / "c").empty());
}

// Names in entries/ that smla did not make (a note, a user's directory) are never removed: clear deleted them (and
// counted them), prune failed on them ("not writable by this user", exit 1).
TEST(Tool, PruneAndClearLeaveWhatSmlaDidNotMake) {
  TempDir t;
  populate(t / "c", 3);
  std::ofstream(t / "c/entries/NOTES.txt") << "mine";
  fs::create_directories(t / "c/entries/my-stuff");
  auto [rc, out] = tool(t / "c", "prune --max-bytes 0");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("evicted: 3 entries"), std::string::npos) << out;
  populate(t / "c", 2);
  auto [rc2, out2] = tool(t / "c", "clear");
  EXPECT_EQ(rc2, 0) << out2;
  EXPECT_NE(out2.find("removed: 2 entries"), std::string::npos) << out2;
  EXPECT_TRUE(fs::exists(t / "c/entries/NOTES.txt"));
  EXPECT_TRUE(fs::is_directory(t / "c/entries/my-stuff"));
}

// Four smla-cache processes with `args` side by side over 200 entries: the sum of the counts they print after `word`,
// each expected to exit 0 rejecting nothing.
static int concurrent_total(const TempDir& t, const std::vector<std::string>& args, const std::string& word) {
  populate(t / "c", 200);
  std::vector<pid_t> pids;
  for (int i = 0; i < 4; ++i) {
    std::vector<std::string> argv{SMLA_CACHE_TOOL, "--dir", t / "c"};
    argv.insert(argv.end(), args.begin(), args.end());
    pids.push_back(spawn(argv, {}, t / ("out" + std::to_string(i))));
  }
  int total = 0;
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(wait_exit(pids[i]), 0);
    const std::string out = slurp(t / ("out" + std::to_string(i)));
    EXPECT_EQ(out.find("rejected"), std::string::npos) << out;
    const size_t at = out.find(word);
    EXPECT_NE(at, std::string::npos) << out;
    if (at != std::string::npos) total += std::atoi(out.c_str() + at + word.size());
  }
  return total;
}

// Prunes side by side: an entry another one removed first is neither "not writable by this user" (exit 1) nor
// evicted twice (the counts summed past the entries there were).
TEST(Tool, ConcurrentPrunesCountEachEntryOnceAndFailNothing) {
  TempDir t;
  EXPECT_EQ(concurrent_total(t, {"prune", "--max-bytes", "0"}, "evicted: "), 200);
  EXPECT_TRUE(entry_names(t / "c").empty());
}

// The same for clears: an entry another clear removed first is not counted again.
TEST(Tool, ConcurrentClearsCountEachEntryOnce) {
  TempDir t;
  EXPECT_EQ(concurrent_total(t, {"clear"}, "removed: "), 200);
  EXPECT_TRUE(entry_names(t / "c").empty());
}

TEST(Tool, ExportImportRoundTrip) {
  TempDir t;
  populate(t / "a", 3);
  std::string bundle = t / "b.smlacb";
  auto [rc, out] = tool(t / "a", "export " + bundle);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("exported: 3"), std::string::npos) << out;
  auto [rc2, out2] = tool(t / "fresh/dir", "import " + bundle);
  ASSERT_EQ(rc2, 0) << out2;
  EXPECT_EQ(entry_names(t / "fresh/dir"), entry_names(t / "a"));
  // Imported entries are real hits for another process.
  Settings s;
  s.dir = t / "fresh/dir";
  s.lock = false;
  DiskCache c(s);
  FakeCompiler fc;
  for (int i = 0; i < 3; ++i) {
    KeyFields f = fields("k" + std::to_string(i));
    Fetched r = c.get_or_compile(f, fc.fn(f));
    EXPECT_EQ(r.origin, Origin::Disk);
    EXPECT_EQ(r.binary, payload(f));
  }
  EXPECT_EQ(fc.calls, 0);
  // Importing again is harmless.
  EXPECT_EQ(tool(t / "fresh/dir", "import " + bundle).first, 0);
}

// An export that cannot finish exports nothing and leaves nothing: onto a directory the rename fails (it left
// "<file>.partial" beside it and printed "exported: 2 entries"); one that finishes leaves the bundle alone.
TEST(Tool, ExportThatFailsLeavesNothing) {
  TempDir t;
  populate(t / "a", 2);
  fs::create_directories(t / "out/taken");
  auto [rc, out] = tool(t / "a", "export " + (t / "out/taken"));
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("a directory"), std::string::npos) << out;
  EXPECT_EQ(count_dir(t / "out"), 1u) << "the failed export left a file beside its target";
  // Through the library too (the tool refuses it first): nothing written, nothing left.
  Settings s;
  s.dir = t / "a";
  s.lock = false;
  BulkResult r = DiskCache(s).export_bundle(t / "out/taken");
  EXPECT_EQ(r.done, 0);
  EXPECT_NE(r.error.find("is a directory: not replaced"), std::string::npos) << r.error;
  EXPECT_EQ(count_dir(t / "out"), 1u);
  auto [rc2, out2] = tool(t / "a", "export " + (t / "out/b.smlacb"));
  ASSERT_EQ(rc2, 0) << out2;
  EXPECT_NE(out2.find("exported: 2 entries"), std::string::npos) << out2;
  EXPECT_EQ(count_dir(t / "out"), 2u) << "a temp file was left beside the bundle";
  EXPECT_TRUE(fs::is_regular_file(t / "out/b.smlacb"));
}

// An entry verify cannot read for a reason outside it (here: no permission to its manifest) is no verdict on it: it is
// named UNREADABLE, not BAD; the exit says verify could not read everything (3), and damage still says damage (1).
// As root (CI), which reads anything, the tool runs as an unprivileged user.
TEST(Tool, VerifyTellsAnEntryItCannotReadFromADamagedOne) {
  TempDir t;
  populate(t / "c", 3);
  const std::vector<std::string> names = entry_names(t / "c");
  ASSERT_EQ(names.size(), 3u);
  const std::string locked = t / ("c/entries/" + names[0] + "/manifest.json");
  ASSERT_EQ(::chmod(locked.c_str(), 0), 0);
  ASSERT_EQ(::chmod(t.path.c_str(), 0755), 0);
  // A copy beside the cache: the build tree may be closed to other users.
  const std::string exe = t / "smla-cache";
  fs::copy_file(SMLA_CACHE_TOOL, exe);
  ASSERT_EQ(::chmod(exe.c_str(), 0755), 0);
  // `verify` as the user who cannot read `locked`, expecting exit `want` and these lines.
  auto check = [&](int want, const std::vector<std::string>& lines) {
    auto run = [&]() -> std::string {
      auto [rc, out] = run_cmd(exe + " --dir " + (t / "c") + " verify");
      std::string r = rc == want ? "" : "exit " + std::to_string(rc) + ", not " + std::to_string(want) + "; ";
      for (const std::string& l : lines)
        if (out.find(l) == std::string::npos) r += "no '" + l + "'; ";
      return r.empty() ? r : r + "\n" + out;
    };
    return ::geteuid() == 0 ? run_as(54321, 54320, run) : run();
  };
  EXPECT_EQ(check(3, {"UNREADABLE " + names[0] + ": ", "3 entries, 0 bad, 1 unreadable"}), "");
  // `list` says so too (it showed a blank tag and exit 0, as if nothing were amiss); it still exits 0.
  auto listed = [&]() -> std::string {
    auto [rc, out] = run_cmd(exe + " --dir " + (t / "c") + " list");
    if (rc != 0) return "exit " + std::to_string(rc) + "\n" + out;
    if (out.find("(manifest unreadable)") == std::string::npos ||
        out.find("3 entries") == std::string::npos || out.find("(1 whose manifest could not be read here") == std::string::npos)
      return "not said:\n" + out;
    return "";
  };
  EXPECT_EQ(::geteuid() == 0 ? run_as(54321, 54320, listed) : listed(), "");
  // Damage beside it: exit 1, each named as what it is.
  std::ofstream(t / ("c/entries/" + names[1] + "/kernel.bin"), std::ios::binary | std::ios::app) << "junk";
  EXPECT_EQ(check(1, {"UNREADABLE " + names[0] + ": ", "BAD " + names[1] + ": ", "3 entries, 1 bad, 1 unreadable"}),
            "");
  ::chmod(locked.c_str(), 0644);
}

// A user with no home (no HOME, no XDG_CACHE_HOME, no passwd entry) gets the /tmp fallback, whose privacy check
// (owned by this user, closed to others) is for that predictable name only. It held for a --dir the user named too: a
// group's shared directory was refused ("not writable").
TEST(Tool, ANamedDirectoryIsNotTheTmpFallback) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to act as a user without a passwd entry";
  TempDir t;
  ASSERT_EQ(::chmod(t.path.c_str(), 0755), 0);
  const gid_t group = 54360;
  ASSERT_EQ(group_dir(t / "g", group), "");
  const mode_t was = ::umask(002);  // entries the group may remove, as a shared cache needs
  populate(t / "g", 2);
  ::umask(was);
  const std::string exe = t / "smla-cache";
  fs::copy_file(SMLA_CACHE_TOOL, exe);
  ASSERT_EQ(::chmod(exe.c_str(), 0755), 0);
  EXPECT_EQ(run_as(54361, group, [&] {
              ::unsetenv("HOME");
              ::unsetenv("XDG_CACHE_HOME");
              ::unsetenv("SMLA_CACHE_DIR");
              auto [rc, out] = run_cmd(exe + " --dir " + (t / "g") + " prune --max-bytes 0");
              return rc == 0 ? std::string() : "exit " + std::to_string(rc) + ": " + out;
            }), "");
  EXPECT_TRUE(entry_names(t / "g").empty()) << "pruned to 0 by the group's member";
}

// Output that cannot be written is an I/O error, exit 1, saying so: a listing longer than stdout's buffer aborted on
// fmt's exception, a short summary (verify) was lost with exit 0.
TEST(Tool, OutputThatCannotBeWrittenIsAnError) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full here to fill stdout with";
  TempDir t;
  populate(t / "c", 100);
  for (const char* cmd : {"list", "verify"}) {
    auto [rc, out] = run_cmd("(" + std::string(SMLA_CACHE_TOOL) + " --dir " + (t / "c") + " " + cmd + " >/dev/full)");
    EXPECT_EQ(rc, 1) << cmd << ": " << out;
    EXPECT_NE(out.find("smla-cache: cannot write the output"), std::string::npos) << cmd << ": " << out;
    EXPECT_NE(out.find("No space left on device"), std::string::npos) << cmd << ": " << out;
  }
}

TEST(Tool, ImportVerifiesEachEntry) {
  TempDir t;
  std::string b;
  const std::string bundle = exported_bundle(t, 3, &b);
  // Flip a byte inside k1's binary in the bundle (its payload starts with a findable marker).
  size_t p = b.find("PAYLOAD:k1:");
  ASSERT_NE(p, std::string::npos);
  b[p + 100] ^= 0x01;
  std::ofstream(bundle, std::ios::binary | std::ios::trunc) << b;
  auto [rc, out] = tool(t / "dst", "import " + bundle);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find(make_key(fields("k1")).entry_name()), std::string::npos) << out;
  EXPECT_NE(out.find("checksum"), std::string::npos) << out;
  auto names = entry_names(t / "dst");
  ASSERT_EQ(names.size(), 2u);
  EXPECT_EQ(names[0].substr(0, 3), "k0-");
  EXPECT_EQ(names[1].substr(0, 3), "k2-");
  EXPECT_EQ(tool(t / "dst", "verify").first, 0);
  EXPECT_EQ(count_dir(t / "dst/.staging"), 0u);
}

// An export past the file size limit (ulimit -f) fails naming it, its temp file removed. It was killed by SIGXFSZ part
// way (exit 153 in a shell), leaving "<bundle>.tmp.*" behind.
TEST(Tool, AnExportPastTheFileSizeLimitFailsSayingSo) {
  TempDir t;
  populate(t / "a", 3);  // three entries of over 2 KB each: past a limit of two 1-KB blocks
  const std::string bundle = t / "b.smlacb";
  auto [rc, out] = run_cmd("ulimit -f 2 && " + std::string(SMLA_CACHE_TOOL) + " --dir " + (t / "a") + " export " +
                           bundle);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("file size limit"), std::string::npos) << out;
  EXPECT_FALSE(std::ifstream(bundle).good()) << "no bundle";
  EXPECT_EQ(count_dir(t.path), 1u) << "only the cache directory: no temp file left";
}

// An export replaced whatever was at FILE by a rename: a FIFO, a device (run as root: /dev/null itself) or a symbolic
// link (the link, not its target). A link's target is replaced now, the link kept; what is not a regular file is
// refused (exit 2), left as it was.
TEST(Tool, ExportWritesALinksTargetAndRefusesWhatIsNoFile) {
  TempDir t;
  populate(t / "a", 2);
  fs::create_directories(t / "out");
  std::ofstream(t / "out/real.smlacb") << "old";
  fs::create_symlink("real.smlacb", t / "out/link.smlacb");
  auto [rc, out] = tool(t / "a", "export " + (t / "out/link.smlacb"));
  EXPECT_EQ(rc, 0) << out;
  EXPECT_TRUE(fs::is_symlink(t / "out/link.smlacb")) << "the link itself was replaced";
  EXPECT_EQ(slurp(t / "out/real.smlacb").substr(0, 8), "SMLACB01") << "the link's target was not written";
  EXPECT_EQ(count_dir(t / "out"), 2u) << "a temp file was left";
  ASSERT_EQ(::mkfifo((t / "out/fifo").c_str(), 0600), 0);
  auto [rc2, out2] = tool(t / "a", "export " + (t / "out/fifo"));
  EXPECT_EQ(rc2, 2) << out2;
  EXPECT_NE(out2.find("not a regular file"), std::string::npos) << out2;
  EXPECT_EQ(fs::status(t / "out/fifo").type(), fs::file_type::fifo) << "the FIFO was replaced";
  fs::create_symlink("nowhere", t / "out/dangling");
  auto [rc3, out3] = tool(t / "a", "export " + (t / "out/dangling"));
  EXPECT_EQ(rc3, 2) << out3;
  EXPECT_NE(out3.find("symbolic link to nothing"), std::string::npos) << out3;
  EXPECT_TRUE(fs::is_symlink(t / "out/dangling"));
  EXPECT_EQ(count_dir(t / "out"), 4u);
}

// The little-endian u32 at `at` of a bundle's bytes, and its encoding.
static size_t bundle_u32(const std::string& b, size_t at) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(uint8_t(b[at + i])) << (8 * i);
  return size_t(v);
}
static std::string le_bytes(uint64_t v, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += char(uint8_t(v >> (8 * i)));
  return s;
}

// A damaged bundle's file size (here 2^31 - 1, under the format's bound) was allocated before it was read: 2 GiB for
// a bundle of a few KB, and where that could not be had, std::bad_alloc ended the tool (abort) with its staging
// directory left in the cache. Sizes past the end of the file are refused before anything is allocated.
TEST(Tool, AGarbageSizeInABundleAllocatesNothing) {
  TempDir t;
  std::string b;
  const std::string bundle = exported_bundle(t, 1, &b);
  // magic, u32 name length, name, u32 file count, u32 file-name length, file name, then the u64 size.
  const size_t name_len = bundle_u32(b, 8), fname_at = 8 + 4 + name_len + 4;
  const size_t size_at = fname_at + 4 + bundle_u32(b, fname_at);
  ASSERT_LT(size_at + 8, b.size());
  b.replace(size_at, 8, le_bytes(0x7fffffff, 8));
  std::ofstream(bundle, std::ios::binary | std::ios::trunc) << b;
  auto [rc, out] = tool(t / "dst", "import " + bundle);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("truncated or malformed"), std::string::npos) << out;
  struct rusage ru {};
  ::getrusage(RUSAGE_CHILDREN, &ru);
  EXPECT_LT(ru.ru_maxrss, 512 * 1024) << "a child of this test (the import) used " << ru.ru_maxrss / 1024 << " MB";
  EXPECT_EQ(count_dir(t / "dst/.staging"), 0u) << "the import left its staging";
}

// A bundle's file names are not paths: an entry carrying a file the format does not know ("../../escaped", which
// from the import's staging directory names a file in the cache directory itself) imports its own three files and
// writes nothing else anywhere.
TEST(Tool, ImportWritesOnlyAnEntrysOwnFiles) {
  TempDir t;
  std::string b;
  const std::string bundle = exported_bundle(t, 1, &b);
  const size_t count_at = 8 + 4 + bundle_u32(b, 8);
  ASSERT_EQ(bundle_u32(b, count_at), 3u);
  b.replace(count_at, 4, le_bytes(4, 4));
  const std::string extra = "../../escaped";
  b.insert(b.size() - 4, le_bytes(extra.size(), 4) + extra + le_bytes(5, 8) + "owned");  // before the end marker
  std::ofstream(bundle, std::ios::binary | std::ios::trunc) << b;
  auto [rc, out] = tool(t / "dst", "import " + bundle);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(entry_names(t / "dst"), std::vector<std::string>{make_key(fields("k0")).entry_name()});
  EXPECT_EQ(tool(t / "dst", "verify").first, 0);
  for (const auto& e : fs::recursive_directory_iterator(t.path))
    EXPECT_EQ(e.path().filename().string().find("escaped"), std::string::npos) << "written: " << e.path();
}

// An import over a local copy that is damaged puts the bundle's verified entry in its place.
TEST(Tool, ImportReplacesADamagedLocalCopy) {
  TempDir t;
  std::string b;
  const std::string bundle = exported_bundle(t, 2, &b);
  populate(t / "dst", 1);  // k0, the same key as the bundle's k0
  const std::string bin = t / ("dst/entries/" + make_key(fields("k0")).entry_name() + "/kernel.bin");
  std::string local = slurp(bin);
  local[local.size() / 2] ^= 0x01;
  std::ofstream(bin, std::ios::binary | std::ios::trunc) << local;
  ASSERT_EQ(tool(t / "dst", "verify").first, 1);
  auto [rc, out] = tool(t / "dst", "import " + bundle);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(tool(t / "dst", "verify").first, 0) << "the damaged copy is still there";
  const std::vector<uint8_t> want = payload(fields("k0"));
  EXPECT_EQ(slurp(bin), std::string(want.begin(), want.end()));
  EXPECT_EQ(entry_names(t / "dst").size(), 2u);
}

// An export takes only entries that verify: a damaged one is named (exit 1), and the bundle holds the others.
TEST(Tool, ExportLeavesOutADamagedEntry) {
  TempDir t;
  populate(t / "a", 3);
  const std::string bad = make_key(fields("k1")).entry_name();
  const std::string bin = t / ("a/entries/" + bad + "/kernel.bin");
  std::string bytes = slurp(bin);
  bytes[bytes.size() / 2] ^= 0x01;
  std::ofstream(bin, std::ios::binary | std::ios::trunc) << bytes;
  const std::string bundle = t / "b.smlacb";
  auto [rc, out] = tool(t / "a", "export " + bundle);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("rejected " + bad), std::string::npos) << out;
  auto [rc2, out2] = tool(t / "dst", "import " + bundle);
  EXPECT_EQ(rc2, 0) << out2;
  EXPECT_EQ(entry_names(t / "dst"),
            (std::vector<std::string>{make_key(fields("k0")).entry_name(), make_key(fields("k2")).entry_name()}));
}

TEST(Tool, TruncatedOrForeignBundleFails) {
  TempDir t;
  std::string b;
  const std::string bundle = exported_bundle(t, 2, &b);
  std::ofstream(bundle, std::ios::binary | std::ios::trunc) << b.substr(0, b.size() - 700);
  auto [rc, out] = tool(t / "dst", "import " + bundle);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("truncated"), std::string::npos) << out;
  EXPECT_EQ(tool(t / "dst", "verify").first, 0) << "whatever was imported is sound";
  std::ofstream(t / "junk") << "hello";
  auto [rc2, out2] = tool(t / "dst", "import " + (t / "junk"));
  EXPECT_EQ(rc2, 1);
  EXPECT_NE(out2.find("not an smla-cache bundle"), std::string::npos) << out2;
}

}  // namespace smla::cache::test
