// test_tuning_db.cpp: the tuning database without a GPU: keys and buckets, round trips, several
// processes storing at once, corrupt and foreign files, runtime-version isolation.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "runtime/planner.hpp"
#include "runtime/sources.hpp"
#include "runtime/tuning_db.hpp"
#include "smla/smla.hpp"

namespace smla {
const std::vector<std::pair<std::string, std::string>>& embedded_kernel_sources();  // generated, in the library
namespace {

namespace fs = std::filesystem;

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/smla-tuning-test-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path); }
};

Problem problem(int64_t T, int64_t H = 128, int64_t num_kv = 5120, int64_t topk = 512, bool sink = true) {
  Problem p;
  p.T = T, p.H = H, p.num_kv = num_kv, p.topk = topk, p.has_sink = sink;
  return p;
}

TuningEntry entry(int bh, int64_t rc, double ms = 1.0) {
  TuningEntry e;
  e.config = TileConfig{bh, 64, 32, 128, rc};
  e.ms = ms;
  e.heuristic_ms = ms * 1.25;
  e.T_tuned = 4096;
  e.num_kv_tuned = 5120;
  return e;
}

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(TuningDb, BucketsAndClassKey) {
  EXPECT_EQ(pow2_bucket(1), 1);
  EXPECT_EQ(pow2_bucket(1000), 1024);
  EXPECT_EQ(pow2_bucket(4096), 4096);
  EXPECT_EQ(pow2_bucket(4097), 8192);
  const std::string v = "v1";
  // Same bucket, same class; across a power of two, another class.
  EXPECT_EQ(tuning_key("sm_90a", problem(3000), v), tuning_key("sm_90a", problem(4096), v));
  EXPECT_NE(tuning_key("sm_90a", problem(4096), v), tuning_key("sm_90a", problem(4097), v));
  EXPECT_NE(tuning_key("sm_90a", problem(4096), v), tuning_key("gfx950", problem(4096), v));
  EXPECT_NE(tuning_key("sm_90a", problem(4096), v), tuning_key("sm_90a", problem(4096), "v2"));
  EXPECT_NE(tuning_key("sm_90a", problem(4096, 128, 5120, 512), v), tuning_key("sm_90a", problem(4096, 128, 9000, 512), v));
  // The lse convention matters with a sink, and is one class without one.
  Problem a = problem(4096), b = problem(4096);
  b.lse.includes_sink = false;
  EXPECT_NE(tuning_key("sm_90a", a, v), tuning_key("sm_90a", b, v));
  a.has_sink = b.has_sink = false;
  EXPECT_EQ(tuning_key("sm_90a", a, v), tuning_key("sm_90a", b, v));
}

TEST(TuningDb, RuntimeVersionFollowsTheKernelSources) {
  const std::string v = tuning_runtime_version(KernelSources());
  EXPECT_NE(v.find("kernels="), std::string::npos) << v;
  // The same files from a directory: the same version; one kernel edited: another.
  TempDir d;
  for (const auto& f : embedded_kernel_sources()) std::ofstream(d.path + "/" + f.first, std::ios::binary) << f.second;
  EXPECT_EQ(tuning_runtime_version(KernelSources(d.path)), v);
  std::ofstream(d.path + "/dq.cu", std::ios::app) << "\n// edited\n";
  EXPECT_NE(tuning_runtime_version(KernelSources(d.path)), v);
}

TEST(TuningDb, StoreThenLookupInAnotherInstance) {
  TempDir d;
  const std::string path = d.path + "/sub/dir/tuning.json";  // parents are created
  TuningDb db(path, "v1");
  EXPECT_FALSE(db.lookup("sm_90a", problem(4096)));
  db.store("sm_90a", problem(4096), entry(32, 256, 0.8));
  TuningDb other(path, "v1");
  auto c = other.lookup("sm_90a", problem(3500));  // same bucket
  ASSERT_TRUE(c);
  EXPECT_EQ(*c, (TileConfig{32, 64, 32, 128, 256}));
  auto e = other.find("sm_90a", problem(4096));
  ASSERT_TRUE(e);
  EXPECT_DOUBLE_EQ(e->ms, 0.8);
  EXPECT_DOUBLE_EQ(e->heuristic_ms, 1.0);
  EXPECT_FALSE(other.lookup("sm_90a", problem(9000)));  // another bucket
  EXPECT_FALSE(other.lookup("sm_90a", problem(4096, 64)));
  EXPECT_TRUE(other.warnings().empty());
  // The file is the documented format, and the lock file sits beside it.
  const auto doc = nlohmann::json::parse(read(path));
  EXPECT_EQ(doc["format"], "smla-tuning-db");
  EXPECT_EQ(doc["schema"], kTuningSchema);
  EXPECT_TRUE(fs::exists(path + ".lock"));
}

// The bodies (dq_impl, dkv_impl) survive a store and a lookup; an entry written before a body
// existed reads as 0 (the planner's choice); a value out of range rejects the entry with a warning.
TEST(TuningDb, BodiesRoundTripAndOldEntriesReadAsDefault) {
  TempDir d;
  const std::string path = d.path + "/tuning.json";
  for (int dkv : {0, 1, 2, 3}) {
    TuningEntry e = entry(64, 16);  // r_chunk 16 divides the four topk values used here
    e.config.dq_impl = 3 - dkv;  // 3, 2, 1, 0: every dq body
    e.config.dkv_impl = dkv;
    TuningDb(path, "v1").store("sm_90a", problem(4096, 128, 5120, 512 + 16 * dkv), e);
  }
  auto doc = nlohmann::json::parse(read(path));
  ASSERT_EQ(doc["entries"].size(), 4u);
  for (auto& [key, v] : doc["entries"].items()) {
    ASSERT_TRUE(v["config"].contains("dkv_impl")) << key;
    ASSERT_TRUE(v["config"].contains("dq_impl")) << key;
  }
  for (int dkv : {0, 1, 2, 3}) {
    auto c = TuningDb(path, "v1").lookup("sm_90a", problem(4096, 128, 5120, 512 + 16 * dkv));
    ASSERT_TRUE(c) << dkv;
    EXPECT_EQ(c->dkv_impl, dkv);
    EXPECT_EQ(c->dq_impl, 3 - dkv);
    TileConfig want = entry(64, 16).config;
    want.dq_impl = 3 - dkv;
    want.dkv_impl = dkv;
    EXPECT_EQ(*c, want);
  }
  // TileConfig::operator== sees dkv_impl.
  TileConfig a, b;
  b.dkv_impl = 2;
  EXPECT_FALSE(a == b);

  // Rewrite the file by hand: one entry without the body keys (an older smla), one with dkv_impl
  // out of range, one with dkv_impl not an integer, one with dq_impl out of range.
  const Problem old_p = problem(4096, 128, 5120, 512), range_p = problem(4096, 128, 5120, 528),
                type_p = problem(4096, 128, 5120, 544), dq_range_p = problem(4096, 128, 5120, 560);
  auto& entries = doc["entries"];
  entries[tuning_key("sm_90a", old_p, "v1")]["config"].erase("dkv_impl");
  entries[tuning_key("sm_90a", old_p, "v1")]["config"].erase("dq_impl");
  entries[tuning_key("sm_90a", range_p, "v1")]["config"]["dkv_impl"] = 4;
  entries[tuning_key("sm_90a", type_p, "v1")]["config"]["dkv_impl"] = "2";
  entries[tuning_key("sm_90a", dq_range_p, "v1")] = entries[tuning_key("sm_90a", type_p, "v1")];
  entries[tuning_key("sm_90a", dq_range_p, "v1")]["config"]["dkv_impl"] = 2;
  entries[tuning_key("sm_90a", dq_range_p, "v1")]["config"]["dq_impl"] = 5;
  std::ofstream(path, std::ios::trunc) << doc.dump();
  TuningDb db(path, "v1");
  auto old_c = db.lookup("sm_90a", old_p);
  ASSERT_TRUE(old_c) << "an entry without dkv_impl must still be read";
  EXPECT_EQ(old_c->dkv_impl, 0);
  EXPECT_EQ(old_c->dq_impl, 0);
  EXPECT_EQ(old_c->dq_block_h, 64);
  EXPECT_FALSE(db.lookup("sm_90a", range_p)) << "dkv_impl = 4 was accepted";
  EXPECT_FALSE(db.lookup("sm_90a", type_p)) << "dkv_impl = \"2\" was accepted";
  EXPECT_FALSE(db.lookup("sm_90a", dq_range_p)) << "dq_impl = 5 was accepted";
  const auto w = db.warnings();
  ASSERT_EQ(w.size(), 3u);
  for (const auto& m : w) EXPECT_NE(m.find("malformed entry"), std::string::npos) << m;
}

TEST(TuningDb, CallerRChunkWinsAndTheBudgetSplitsTokens) {
  TempDir d;
  TuningDb db(d.path + "/t.json", "v1");
  db.store("sm_90a", problem(4096), entry(64, 512));
  Problem p = problem(4096);
  p.r_chunk = 128;
  EXPECT_EQ(db.lookup("sm_90a", p)->r_chunk, 128);
  // The tuned r_chunk is kept at any T of the bucket; 4096 x 512 x 512 bf16 = 2 GiB over a 1 GiB budget is two token
  // chunks, not another r_chunk.
  const auto t = db.lookup("sm_90a", problem(4096));
  ASSERT_TRUE(t);
  EXPECT_EQ(t->r_chunk, 512);
  EXPECT_EQ(t->dq_block_h, 64);
  const ShapeInfo s = shape_with_config(problem(4096), &*t, size_t(1) << 30);
  EXPECT_EQ(s.r_chunk, 512);
  EXPECT_EQ(s.t_chunks, 2);
  EXPECT_LE(double(s.chunk_items()) * 1024, double(size_t(1) << 30));
}

TEST(TuningDb, ShapeWithConfigMatchesPlan) {
  Runtime rt;
  Problem p = problem(300, 16, 400, 160);
  p.backend = BackendKind::Cpu;
  const TileConfig cfg{16, 32, 32, 64, 32};
  EXPECT_EQ(rt.plan(p, cfg)->info().r_chunk, shape_with_config(p, &cfg, size_t(2) << 30).r_chunk);
  EXPECT_EQ(rt.plan(p)->info().r_chunk, shape_with_config(p, nullptr, size_t(2) << 30).r_chunk);
  const ShapeInfo s = shape_with_config(p, &cfg, size_t(2) << 30);
  EXPECT_EQ(s.dq_block_h, 16);
  EXPECT_EQ(s.dkv_block_d, 64);
  EXPECT_EQ(s.n_chunks, 5);
  EXPECT_EQ(s.dq_impl, 0);
  EXPECT_EQ(s.dkv_impl, 0);
  // The bodies are copied too, and the target's features set.
  TileConfig bodies = cfg;
  bodies.dq_impl = 1, bodies.dkv_impl = 2;
  const ShapeInfo b = shape_with_config(p, &bodies, size_t(2) << 30, "sm_90a");
  EXPECT_EQ(b.dq_impl, 1);
  EXPECT_EQ(b.dkv_impl, 2);
  EXPECT_TRUE(b.sm90a);
  ShapeInfo applied;
  apply_config(applied, &bodies, "sm_80");
  EXPECT_EQ(applied.dkv_impl, 2);
  EXPECT_FALSE(applied.sm90a);
}

// Four processes store 25 entries each, interleaved: a read-modify-write without the lock loses
// entries; with it, all 100 are there.
TEST(TuningDb, ConcurrentWritersMerge) {
  TempDir d;
  const std::string path = d.path + "/tuning.json";
  constexpr int kProcs = 4, kEach = 25;
  std::vector<pid_t> kids;
  for (int c = 0; c < kProcs; ++c) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int rc = 0;
      try {
        TuningDb db(path, "v1");
        for (int i = 0; i < kEach; ++i) db.store("sm_90a", problem(4096, 128, 5120, 16 * (c * kEach + i + 1)), entry(16, 16, c + i));
      } catch (...) {
        rc = 1;
      }
      ::_exit(rc);
    }
    kids.push_back(pid);
  }
  for (pid_t k : kids) {
    int st = 0;
    ASSERT_EQ(::waitpid(k, &st, 0), k);
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "a writer failed";
  }
  TuningDb db(path, "v1");
  for (int c = 0; c < kProcs; ++c)
    for (int i = 0; i < kEach; ++i) {
      auto e = db.find("sm_90a", problem(4096, 128, 5120, 16 * (c * kEach + i + 1)));
      ASSERT_TRUE(e) << "entry of writer " << c << " #" << i << " lost";
      EXPECT_DOUBLE_EQ(e->ms, c + i);
    }
  EXPECT_EQ(nlohmann::json::parse(read(path))["entries"].size(), size_t(kProcs * kEach));
  EXPECT_TRUE(db.warnings().empty());
  // No temp file left behind.
  for (const auto& f : fs::directory_iterator(d.path))
    EXPECT_EQ(f.path().filename().string().find(".tmp."), std::string::npos) << f.path();
}

class CorruptFile : public ::testing::TestWithParam<std::string> {};

TEST_P(CorruptFile, IgnoredWithWarningThenRewritten) {
  TempDir d;
  const std::string path = d.path + "/tuning.json";
  {
    TuningDb db(path, "v1");
    db.store("sm_90a", problem(4096), entry(32, 256));
  }
  const std::string valid = read(path);
  std::string bad = GetParam() == "garbage" ? std::string("\x00\xff\x13garbage{{", 11)
                    : GetParam() == "truncated" ? valid.substr(0, valid.size() / 2)
                                                : std::string("{\"hello\": 1}");
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bad;

  TuningDb db(path, "v1");
  EXPECT_FALSE(db.lookup("sm_90a", problem(4096)));
  ASSERT_EQ(db.warnings().size(), 1u);
  EXPECT_NE(db.warnings()[0].find("corrupt"), std::string::npos) << db.warnings()[0];
  EXPECT_FALSE(db.lookup("sm_90a", problem(4096)));
  EXPECT_EQ(db.warnings().size(), 1u) << "an unchanged corrupt file warns once";

  db.store("sm_90a", problem(8192), entry(16, 128));
  const auto doc = nlohmann::json::parse(read(path));  // valid again
  EXPECT_EQ(doc["entries"].size(), 1u);
  EXPECT_EQ(db.lookup("sm_90a", problem(8192))->dq_block_h, 16);
  TuningDb fresh(path, "v1");
  EXPECT_TRUE(fresh.lookup("sm_90a", problem(8192)));
  EXPECT_TRUE(fresh.warnings().empty());
}

INSTANTIATE_TEST_SUITE_P(Kinds, CorruptFile, ::testing::Values("garbage", "truncated", "not_ours"));

TEST(TuningDb, OtherRuntimeVersionOrSchemaIgnored) {
  TempDir d;
  const std::string path = d.path + "/tuning.json";
  TuningDb old_db(path, "smla-0.0.9;kernels=1");
  old_db.store("sm_90a", problem(4096), entry(32, 256));
  TuningDb db(path, "smla-0.1.0;kernels=2");
  EXPECT_FALSE(db.lookup("sm_90a", problem(4096))) << "a measurement of other kernels was used";
  EXPECT_TRUE(db.warnings().empty());
  db.store("sm_90a", problem(4096), entry(64, 128));
  EXPECT_EQ(db.lookup("sm_90a", problem(4096))->dq_block_h, 64);
  EXPECT_EQ(old_db.lookup("sm_90a", problem(4096))->dq_block_h, 32) << "the other version's entry was clobbered";

  // A file of another schema: ignored with a warning, rewritten by the next store.
  auto doc = nlohmann::json::parse(read(path));
  doc["schema"] = kTuningSchema + 1;
  std::ofstream(path, std::ios::trunc) << doc.dump();
  TuningDb next(path, "smla-0.1.0;kernels=2");
  EXPECT_FALSE(next.lookup("sm_90a", problem(4096)));
  ASSERT_EQ(next.warnings().size(), 1u);
  EXPECT_NE(next.warnings()[0].find("schema"), std::string::npos);
  next.store("sm_90a", problem(4096), entry(16, 64));
  EXPECT_EQ(nlohmann::json::parse(read(path))["schema"], kTuningSchema);
  EXPECT_EQ(next.lookup("sm_90a", problem(4096))->dq_block_h, 16);
}

TEST(TuningDb, UnwritableLocationThrowsNamingThePath) {
  TuningDb db("/proc/smla-no-such-dir/tuning.json", "v1");
  EXPECT_FALSE(db.lookup("sm_90a", problem(4096)));
  try {
    db.store("sm_90a", problem(4096), entry(32, 256));
    FAIL() << "store into /proc succeeded";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("/proc/smla-no-such-dir"), std::string::npos) << e.message();
  }
}

}  // namespace
}  // namespace smla
