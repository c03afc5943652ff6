// test_tuning_db.cpp: the tuning database without a GPU: keys and buckets, round trips, several
// processes storing at once, corrupt, foreign, malformed and unreadable files, runtime-version
// isolation, symlinked paths, a group's shared database, smla-tune's verdict on the heuristic.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tests/cache/test_util.hpp"  // run_as: a child process as another uid/gid

#include "runtime/planner.hpp"
#include "runtime/sources.hpp"
#include "runtime/tuning_db.hpp"
#include "smla/smla.hpp"

#include "tests/read_text_file.hpp"

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
  // dkv in fp32 runs other kernels (and other tiles) than bf16: its own class.
  Problem c = problem(4096), d = problem(4096);
  d.dkv_fp32 = true;
  EXPECT_NE(tuning_key("sm_90a", c, v), tuning_key("sm_90a", d, v));
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

// An H100 and an H200 are both sm_90a: each keeps its own entry (a database shared over an NFS home served one's
// measurements to the other), and the class names what it is.
TEST(TuningDb, DevicesOfOneTargetKeepTheirOwnEntries) {
  EXPECT_EQ(tuning_device_class("sm_90a", "NVIDIA H200", 132), "sm_90a/NVIDIA H200/132sm");
  EXPECT_EQ(tuning_device_class("sm_90a", "odd;name/with=marks", 114), "sm_90a/odd_name_with_marks/114sm");
  EXPECT_EQ(target_of_device_class("sm_90a/NVIDIA H200/132sm"), "sm_90a");
  EXPECT_EQ(target_of_device_class("gfx950:sramecc+:xnack-"), "gfx950:sramecc+:xnack-");
  TempDir dir;
  TuningDb db(dir.path + "/tuning.json", "v1");
  const std::string h100 = tuning_device_class("sm_90a", "NVIDIA H100 80GB HBM3", 132),
                    h200 = tuning_device_class("sm_90a", "NVIDIA H200", 132);
  db.store(h100, problem(4096), entry(32, 256, 0.9));
  EXPECT_FALSE(db.lookup(h200, problem(4096))) << "the H100's entry served the H200";
  db.store(h200, problem(4096), entry(64, 128, 0.8));
  EXPECT_EQ(db.lookup(h100, problem(4096))->dq_block_h, 32);
  EXPECT_EQ(db.lookup(h200, problem(4096))->dq_block_h, 64);
  EXPECT_EQ(db.lookup_target("sm_90a", problem(4096)).size(), 2u);
  EXPECT_TRUE(db.lookup_target("sm_90", problem(4096)).empty()) << "sm_90 is another target than sm_90a";
  EXPECT_TRUE(db.lookup_target("sm_90a", problem(9000)).empty()) << "another T bucket";
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
  const auto doc = nlohmann::json::parse(test::read_text_file(path));
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
  auto doc = nlohmann::json::parse(test::read_text_file(path));
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
  entries[tuning_key("sm_90a", range_p, "v1")]["config"]["dkv_impl"] = 5;
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
  EXPECT_FALSE(db.lookup("sm_90a", range_p)) << "dkv_impl = 5 was accepted";
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

// plan() takes a tuned entry only where the backend's own kernels can run it (tuned_entry_fits). On HIP the entry went
// unchecked, and plan() then threw where the heuristic would have planned; a Runtime cannot reach that branch here
// (no AMD GPU: the HIP backend is not usable), so the gate is asked directly, for each backend.
TEST(TuningDb, EachBackendJudgesATunedEntryByItsOwnKernels) {
  const size_t budget = size_t(1) << 30;
  const Problem p = problem(4096);  // H 128, TOPK 512
  TileConfig wide{64, 32, 0, 0, 0};  // a 64 x 32 dq tile: CUDA's wgmma tile; more than 4 wavefronts on AMD
  std::string why;
  EXPECT_TRUE(tuned_entry_fits(BackendKind::Cuda, p, wide, budget, "sm_90a", &why)) << why;
  EXPECT_TRUE(why.empty()) << why;
  EXPECT_FALSE(tuned_entry_fits(BackendKind::Hip, p, wide, budget, "gfx950", &why));
  EXPECT_NE(why.find("dq tile 64x32"), std::string::npos) << why;
  EXPECT_TRUE(tuned_entry_fits(BackendKind::Cpu, p, wide, budget, "cpu", &why)) << why;
  const TileConfig narrow{16, 32, 0, 0, 0};  // fits a CU
  EXPECT_TRUE(tuned_entry_fits(BackendKind::Hip, p, narrow, budget, "gfx950", &why)) << why;
  // A tile no backend can run is refused by each GPU backend, naming the field.
  const TileConfig huge{64, 1966560, 0, 0, 0};
  EXPECT_FALSE(tuned_entry_fits(BackendKind::Cuda, p, huge, budget, "sm_90a", &why));
  EXPECT_NE(why.find("dq_block_r = 1966560"), std::string::npos) << why;
  EXPECT_FALSE(tuned_entry_fits(BackendKind::Hip, p, huge, budget, "gfx950", &why));
  EXPECT_NE(why.find("dq tile 64x1966560"), std::string::npos) << why;
  // A tuned r_chunk that makes too many chunk pairs at this budget is refused on every backend, the CPU's too.
  const TileConfig tiny_chunks{0, 0, 0, 0, 1};
  const ShapeInfo s = shape_with_config(p, &tiny_chunks, 16 << 10, "sm_90a");
  ASSERT_GT(int64_t(s.t_chunks) * s.n_chunks, kMaxChunkPairs);
  for (BackendKind k : {BackendKind::Cpu, BackendKind::Cuda, BackendKind::Hip}) {
    EXPECT_FALSE(tuned_entry_fits(k, p, tiny_chunks, 16 << 10, "sm_90a", &why)) << backend_name(k);
    EXPECT_NE(why.find("chunk pairs"), std::string::npos) << why;
  }
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
  EXPECT_EQ(nlohmann::json::parse(test::read_text_file(path))["entries"].size(), size_t(kProcs * kEach));
  EXPECT_TRUE(db.warnings().empty());
  // No temp file left behind.
  for (const auto& f : fs::directory_iterator(d.path))
    EXPECT_EQ(f.path().filename().string().find(".tmp."), std::string::npos) << f.path();
}

// Exit code of `pid`, or -1 when it is still running after `timeout_s` (then it is killed).
int wait_exit_within(pid_t pid, double timeout_s) {
  int st = 0;
  if (!cache::test::wait_until([&] { return ::waitpid(pid, &st, WNOHANG) == pid; }, timeout_s)) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &st, 0);
    return -1;
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

// A lock held for ever (a hung writer, or a process that inherited it) used to block every store without end. The
// wait is bounded, and the error names the lock file and its holder; nothing is written.
TEST(TuningDb, StoreWaitsForTheLockBoundedAndNamesIt) {
  TempDir d;
  const std::string path = d.path + "/tuning.json";
  TuningDb(path, "v1").store("sm_90a", problem(4096), entry(32, 256));
  const std::string before = test::read_text_file(path);
  const int held = ::open((path + ".lock").c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(held, 0);
  ASSERT_EQ(::flock(held, LOCK_EX), 0);
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(p[0]);
    ::setenv("SMLA_TUNING_DB_LOCK_TIMEOUT_S", "1", 1);
    std::string r;
    int rc = 1;
    try {
      TuningDb(path, "v1").store("sm_90a", problem(8192), entry(16, 64));
      r = "stored although the lock was held";
    } catch (const Error& e) {
      r = e.message();
      rc = 0;
    }
    (void)!::write(p[1], r.data(), r.size());
    ::_exit(rc);
  }
  ::close(p[1]);
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = wait_exit_within(pid, 20);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string msg;
  char buf[512];
  for (ssize_t n; (n = ::read(p[0], buf, sizeof buf)) > 0;) msg.append(buf, size_t(n));
  ::close(p[0]);
  ::close(held);
  ASSERT_NE(rc, -1) << "the store waited for the lock without a bound";
  EXPECT_EQ(rc, 0) << msg;
  EXPECT_GE(s, 0.9);
  EXPECT_LT(s, 10);
  EXPECT_NE(msg.find(path + ".lock"), std::string::npos) << msg;
  EXPECT_NE(msg.find("pid " + std::to_string(::getpid())), std::string::npos) << "the holder is named: " << msg;
  EXPECT_NE(msg.find("SMLA_TUNING_DB_LOCK_TIMEOUT_S"), std::string::npos) << msg;
  EXPECT_EQ(test::read_text_file(path), before) << "nothing stored";
  TuningDb(path, "v1").store("sm_90a", problem(8192), entry(16, 64));  // released: stores again
  EXPECT_TRUE(TuningDb(path, "v1").lookup("sm_90a", problem(8192)));
}

// A worker forked while another thread of its parent was inside a lookup inherited the database's mutex locked by a
// thread it does not have, and hung in its own first lookup. Here the parent's thread is held inside the read by the
// test hook SMLA_TUNING_DB_TEST_READ_DELAY_MS (a FIFO in place of the file held it until a reader no longer blocks on
// one: TuningDb.APathThatIsNotARegularFileIsNoDatabase).
TEST(TuningDb, ForkedChildLooksUpWhileAParentThreadIsInsideALookup) {
  TempDir d;
  const std::string path = d.path + "/tuning.json";
  TuningDb(path, "v1").store("sm_90a", problem(4096), entry(32, 256));
  ASSERT_EQ(::setenv("SMLA_TUNING_DB_TEST_READ_DELAY_MS", "1500", 1), 0);  // before any thread: no getenv races it
  TuningDb db(path, "v1");
  std::atomic<bool> parent_done{false};
  std::thread t([&] {
    db.lookup("sm_90a", problem(4096));  // held in the read, its mutex locked
    parent_done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const bool held = !parent_done.load();
  std::fflush(nullptr);
  const pid_t pid = held ? ::fork() : -1;
  if (pid == 0) {
    const bool found = db.lookup("sm_90a", problem(4096)).has_value();
    ::_exit(found ? 0 : 1);
  }
  int st = 0, rc = -1;
  bool exited = false;
  for (auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
       pid > 0 && !exited && std::chrono::steady_clock::now() < end;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    exited = ::waitpid(pid, &st, WNOHANG) == pid;
  }
  if (pid > 0 && !exited) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &st, 0);
  } else if (exited) {
    rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
  t.join();
  ::unsetenv("SMLA_TUNING_DB_TEST_READ_DELAY_MS");
  ASSERT_TRUE(held) << "the lookup was not held in the read: the test shows nothing";
  EXPECT_NE(rc, -1) << "the forked child hung in lookup() (the mutex a parent thread held at the fork)";
  EXPECT_EQ(rc, 0) << "the forked child's lookup did not find the entry";
}

// A store killed between creating its temp file and the rename left "<db>.tmp.*" (a full copy) beside the database
// for ever. The next store removes those whose writer is gone, by the kernel cache's rule for its staging: this
// host and a dead pid once older than 10 minutes (the pid may be a live process of another PID namespace), any
// writer once older than an hour; never a live writer's, never another file's.
TEST(TuningDb, StoreRemovesTempFilesOfDeadWriters) {
  TempDir d;
  const std::string path = d.path + "/tuning.json";
  TuningDb(path, "v1").store("sm_90a", problem(4096), entry(32, 256));
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof host - 1), 0);
  std::fflush(nullptr);
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(dead, nullptr, 0), dead);
  const std::string me = std::string(host) + ".", tmp = path + ".tmp.";
  const std::string dead_old = tmp + me + std::to_string(dead) + ".1",
                    dead_new = tmp + me + std::to_string(dead) + ".2",
                    alive_old = tmp + me + std::to_string(::getppid()) + ".3",
                    other_host_old = tmp + "otherhost.12.4", other_host_new = tmp + "otherhost.12.5",
                    older_smla_old = tmp + std::to_string(dead) + ".6", older_smla_new = tmp + std::to_string(dead) + ".7",
                    not_ours = d.path + "/other.json.tmp." + me + std::to_string(dead) + ".8";
  const time_t now = ::time(nullptr);
  for (const auto& [f, age] : std::vector<std::pair<std::string, time_t>>{{dead_old, 20 * 60},
                                                                          {dead_new, 0},
                                                                          {alive_old, 20 * 60},
                                                                          {other_host_old, 2 * 3600},
                                                                          {other_host_new, 20 * 60},
                                                                          {older_smla_old, 2 * 3600},
                                                                          {older_smla_new, 20 * 60},
                                                                          {not_ours, 2 * 3600}}) {
    std::ofstream(f) << test::read_text_file(path);
    const timespec t[2] = {{now - age, 0}, {now - age, 0}};
    ASSERT_EQ(::utimensat(AT_FDCWD, f.c_str(), t, 0), 0);
  }
  TuningDb(path, "v1").store("sm_90a", problem(8192), entry(16, 64));
  EXPECT_FALSE(fs::exists(dead_old)) << "this host, dead writer, old";
  EXPECT_TRUE(fs::exists(dead_new)) << "a dead pid with a fresh file may be a writer of another PID namespace";
  EXPECT_TRUE(fs::exists(alive_old)) << "its writer lives (and it is younger than an hour)";
  EXPECT_FALSE(fs::exists(other_host_old)) << "older than an hour";
  EXPECT_TRUE(fs::exists(other_host_new));
  EXPECT_FALSE(fs::exists(older_smla_old)) << "an older smla's name (no host), older than an hour";
  EXPECT_TRUE(fs::exists(older_smla_new));
  EXPECT_TRUE(fs::exists(not_ours)) << "another database's temp file";
  EXPECT_TRUE(TuningDb(path, "v1").lookup("sm_90a", problem(8192)));
}

class CorruptFile : public ::testing::TestWithParam<std::string> {};

// The files beside `path` that a store kept instead of destroying them ("<db>.replaced.<host>.<pid>.<rand>").
std::vector<std::string> replaced_files(const std::string& path) {
  std::vector<std::string> out;
  const std::filesystem::path p(path);
  for (const auto& f : std::filesystem::directory_iterator(p.parent_path()))
    if (f.path().filename().string().rfind(p.filename().string() + ".replaced.", 0) == 0) out.push_back(f.path());
  return out;
}

// A damaged database (it names the format, or is empty) is ignored with a warning, and the next store replaces it,
// keeping its bytes under another name. A file that is no tuning database at all (SMLA_TUNING_DB or --tuning-db
// pointed at the wrong file: smla-tune replaced /etc/passwd with one entry before) is ignored and never replaced.
TEST_P(CorruptFile, IgnoredWithWarningThenReplacedOrLeftAlone) {
  TempDir d;
  const std::string path = d.path + "/tuning.json";
  {
    TuningDb db(path, "v1");
    db.store("sm_90a", problem(4096), entry(32, 256));
  }
  const std::string valid = test::read_text_file(path);
  const std::string kind = GetParam();
  // wrong_types: json's value() would throw type_error out of the lookup (and plan()).
  const std::string bad = kind == "garbage"       ? std::string("\x00\xff\x13garbage{{", 11)
                          : kind == "truncated"   ? valid.substr(0, valid.size() / 2)
                          : kind == "empty"       ? std::string()
                          : kind == "ours_broken" ? std::string("{\"format\": \"smla-tuning-db\", \"schema\": \"2\"}")
                          : kind == "wrong_types" ? std::string("{\"format\": 5, \"schema\": \"1\", \"entries\": {}}")
                                                  : std::string("{\"hello\": 1}");
  const bool foreign = kind == "garbage" || kind == "wrong_types" || kind == "not_ours";
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bad;

  TuningDb db(path, "v1");
  EXPECT_FALSE(db.lookup("sm_90a", problem(4096)));
  ASSERT_EQ(db.warnings().size(), 1u);
  EXPECT_NE(db.warnings()[0].find(foreign ? "not a tuning database" : "corrupt"), std::string::npos)
      << db.warnings()[0];
  EXPECT_FALSE(db.lookup("sm_90a", problem(4096)));
  EXPECT_EQ(db.warnings().size(), 1u) << "an unchanged corrupt file warns once";

  if (foreign) {
    try {
      db.store("sm_90a", problem(8192), entry(16, 128));
      ADD_FAILURE() << "a file that is not a tuning database was replaced";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::InvalidArgument);
      EXPECT_NE(e.message().find("not overwritten"), std::string::npos) << e.message();
    }
    EXPECT_EQ(test::read_text_file(path), bad);
    EXPECT_TRUE(replaced_files(path).empty());
    return;
  }
  db.store("sm_90a", problem(8192), entry(16, 128));
  // What was there is not destroyed: kept byte for byte under the name the warning gives.
  const auto kept = replaced_files(path);
  ASSERT_EQ(kept.size(), 1u);
  EXPECT_EQ(test::read_text_file(kept[0]), bad);
  ASSERT_EQ(db.warnings().size(), 2u);
  EXPECT_NE(db.warnings()[1].find("kept as " + kept[0]), std::string::npos) << db.warnings()[1];
  const auto doc = nlohmann::json::parse(test::read_text_file(path));  // valid again
  EXPECT_EQ(doc["entries"].size(), 1u);
  EXPECT_EQ(db.lookup("sm_90a", problem(8192))->dq_block_h, 16);
  TuningDb fresh(path, "v1");
  EXPECT_TRUE(fresh.lookup("sm_90a", problem(8192)));
  EXPECT_TRUE(fresh.warnings().empty());
}

INSTANTIATE_TEST_SUITE_P(Kinds, CorruptFile, ::testing::Values("garbage", "truncated", "empty", "ours_broken",
                                                              "not_ours", "wrong_types"));

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

  // A file of an older schema: ignored with a warning, rewritten by the next store.
  auto doc = nlohmann::json::parse(test::read_text_file(path));
  doc["schema"] = kTuningSchema - 1;
  std::ofstream(path, std::ios::trunc) << doc.dump();
  TuningDb next(path, "smla-0.1.0;kernels=2");
  EXPECT_FALSE(next.lookup("sm_90a", problem(4096)));
  ASSERT_EQ(next.warnings().size(), 1u);
  EXPECT_NE(next.warnings()[0].find("schema"), std::string::npos);
  const std::string older = test::read_text_file(path);
  next.store("sm_90a", problem(4096), entry(16, 64));
  EXPECT_EQ(nlohmann::json::parse(test::read_text_file(path))["schema"], kTuningSchema);
  const auto kept = replaced_files(path);  // the older smla's database stays usable by it under another name
  ASSERT_EQ(kept.size(), 1u);
  EXPECT_EQ(test::read_text_file(kept[0]), older);
  EXPECT_EQ(next.lookup("sm_90a", problem(4096))->dq_block_h, 16);
}

// A newer smla's file is ignored by lookups and never overwritten: the store throws naming both schemas and the bytes
// stay as they were (an older smla used to rewrite it with its one entry). 2^32 + 2 must not read as schema 2, nor
// 2^32 + 1 as schema 1 (int truncation).
TEST(TuningDb, NewerSchemaIsNeverOverwritten) {
  for (const uint64_t schema : {uint64_t(kTuningSchema) + 1, (uint64_t(1) << 32) + uint64_t(kTuningSchema)}) {
    SCOPED_TRACE(schema);
    TempDir d;
    const std::string path = d.path + "/tuning.json";
    TuningDb(path, "v1").store("sm_90a", problem(4096), entry(32, 256));
    auto doc = nlohmann::json::parse(test::read_text_file(path));
    doc["schema"] = schema;
    doc["added_by_the_newer_smla"] = true;
    std::ofstream(path, std::ios::trunc) << doc.dump();
    const std::string before = test::read_text_file(path);

    TuningDb db(path, "v1");
    EXPECT_FALSE(db.lookup("sm_90a", problem(4096))) << "an entry of another schema was used";
    ASSERT_EQ(db.warnings().size(), 1u);
    EXPECT_NE(db.warnings()[0].find("schema " + std::to_string(schema)), std::string::npos) << db.warnings()[0];
    bool refused = false;
    try {
      db.store("sm_90a", problem(8192), entry(16, 64));
    } catch (const Error& e) {
      refused = true;
      EXPECT_NE(e.message().find("schema " + std::to_string(schema)), std::string::npos) << e.message();
      EXPECT_NE(e.message().find("schema " + std::to_string(kTuningSchema)), std::string::npos) << e.message();
    }
    EXPECT_TRUE(refused) << "a store over a newer schema succeeded";
    EXPECT_EQ(test::read_text_file(path), before) << "the newer database was rewritten";
  }
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

// check_store(), asked by smla-tune before a sweep, refuses what the store at the sweep's end would fail on: a
// directory that cannot take files (it passed, and the sweep's results were lost at the store), and a path ending in
// '/' (an absent "newdir/" read as an absent file; the store then made newdir/ and its lock and failed). It makes
// nothing; a path whose directories are still to be made, below a writable one, passes.
TEST(TuningDb, CheckStoreRefusesADirectoryItCouldNotWriteBeforeTheSweep) {
  TempDir d;
  auto refused = [](const std::string& path, const std::string& says) {
    try {
      TuningDb(path, "v1").check_store();
      return "check_store passed " + path;
    } catch (const Error& e) {
      if (e.status() != Status::InvalidArgument) return "status " + std::string(status_name(e.status()));
      return e.message().find(says) == std::string::npos ? "message: " + e.message() : std::string();
    }
  };
  EXPECT_EQ(refused("/proc/smla-no-such-dir/tuning.json", "cannot be written: its parent /proc "), "");
  EXPECT_EQ(refused(d.path + "/newdir/", "names a directory (it ends in '/')"), "");
  EXPECT_FALSE(fs::exists(d.path + "/newdir")) << "check_store made the directory";
  const std::string file = d.path + "/a-file";
  std::ofstream(file) << "x";
  EXPECT_EQ(refused(file + "/tuning.json", "cannot be written: " + file + " is not a directory"), "");
  EXPECT_NO_THROW(TuningDb(d.path + "/x/y/tuning.json", "v1").check_store());
  EXPECT_FALSE(fs::exists(d.path + "/x")) << "check_store made the directories";
}

// Entries that parse as JSON but are not a config smla-tune could have measured are ignored with one warning each,
// so plan() falls back to the heuristic instead of throwing about Problem::r_chunk, which the user never set; and no
// integer is truncated into range (4294967312 read as 16 by get<int>()).
TEST(TuningDb, MalformedEntriesAreIgnoredNotTruncated) {
  TempDir d;
  const std::string path = d.path + "/tuning.json";
  TuningDb(path, "v1").store("sm_90a", problem(4096), entry(32, 256));  // topk 512: the good one
  auto doc = nlohmann::json::parse(test::read_text_file(path));
  const nlohmann::json good = doc["entries"].begin().value();
  struct Bad {
    const char* name;
    std::function<void(nlohmann::json&)> edit;
  };
  const std::vector<Bad> bads = {
      {"r_chunk 8 (not a multiple of 16)", [](nlohmann::json& v) { v["config"]["r_chunk"] = 8; }},
      {"r_chunk 48 (does not divide topk)", [](nlohmann::json& v) { v["config"]["r_chunk"] = 48; }},
      {"r_chunk 2^32 + 16", [](nlohmann::json& v) { v["config"]["r_chunk"] = (int64_t(1) << 32) + 16; }},
      {"dq_block_h 2^32 + 16", [](nlohmann::json& v) { v["config"]["dq_block_h"] = (int64_t(1) << 32) + 16; }},
      {"dkv_block_d 2^64 - 1", [](nlohmann::json& v) { v["config"]["dkv_block_d"] = ~uint64_t(0); }},
      {"dq_block_r -16", [](nlohmann::json& v) { v["config"]["dq_block_r"] = -16; }},
      {"dq_impl 2^32 + 1", [](nlohmann::json& v) { v["config"]["dq_impl"] = (int64_t(1) << 32) + 1; }},
      {"dkv_impl -1", [](nlohmann::json& v) { v["config"]["dkv_impl"] = -1; }},
      {"ms a string", [](nlohmann::json& v) { v["ms"] = "fast"; }},
      {"T_tuned negative", [](nlohmann::json& v) { v["T_tuned"] = -1; }},
  };
  // Each bad entry in its own problem class: topk 528, 544, ... (48 does not divide 544).
  std::vector<Problem> ps;
  for (size_t i = 0; i < bads.size(); ++i) {
    ps.push_back(problem(4096, 128, 5120, 528 + 16 * int64_t(i)));
    nlohmann::json v = good;
    bads[i].edit(v);
    doc["entries"][tuning_key("sm_90a", ps.back(), "v1")] = v;
  }
  std::ofstream(path, std::ios::trunc) << doc.dump();

  TuningDb db(path, "v1");
  for (int round = 0; round < 2; ++round)
    for (size_t i = 0; i < bads.size(); ++i) {
      EXPECT_FALSE(db.lookup("sm_90a", ps[i])) << bads[i].name << " was accepted";
      EXPECT_FALSE(db.find("sm_90a", ps[i])) << bads[i].name << " was accepted";
    }
  auto c = db.lookup("sm_90a", problem(4096));
  ASSERT_TRUE(c) << "a good entry beside bad ones was lost";
  EXPECT_EQ(*c, (TileConfig{32, 64, 32, 128, 256}));
  const auto w = db.warnings();
  EXPECT_EQ(w.size(), bads.size()) << "one warning per bad entry, not per lookup";
  for (const auto& m : w) EXPECT_NE(m.find("malformed entry"), std::string::npos) << m;
  bool named = false;
  for (const auto& m : w) named = named || m.find("r_chunk 48 does not divide topk 544") != std::string::npos;
  EXPECT_TRUE(named) << "the r_chunk warning does not say why";
}

// SMLA_TUNING_DB naming a directory: lookups and stores say "is a directory" (not "corrupt", not a rename error), and a
// store creates nothing (it left <dir>.lock behind).
TEST(TuningDb, DirectoryPathSaysSoAndCreatesNothing) {
  TempDir d;
  const std::string dir = d.path + "/db";
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  TuningDb db(dir, "v1");
  EXPECT_FALSE(db.lookup("sm_90a", problem(4096)));
  ASSERT_EQ(db.warnings().size(), 1u);
  EXPECT_NE(db.warnings()[0].find("is a directory"), std::string::npos) << db.warnings()[0];
  try {
    db.store("sm_90a", problem(4096), entry(32, 256));
    FAIL() << "a store into a directory succeeded";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find(dir + " is a directory"), std::string::npos) << e.message();
  }
  std::vector<std::string> left;
  for (const auto& f : fs::recursive_directory_iterator(d.path)) left.push_back(f.path().string());
  EXPECT_EQ(left, std::vector<std::string>{dir}) << "the store created files";
}

// A path that is not a regular file (a FIFO here; /dev/null or /dev/zero likewise) is no database: the lookup warns
// and returns at once (a FIFO blocked it until a writer came), and a store refuses it and creates nothing beside it
// (SMLA_TUNING_DB=/dev/null read as an empty, so damaged, database, and a store run as root replaced the device node).
TEST(TuningDb, APathThatIsNotARegularFileIsNoDatabase) {
  TempDir d;
  const std::string fifo = d.path + "/tuning.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto looked = std::async(std::launch::async, [&] {
    TuningDb db(fifo, "v1");
    const bool found = db.lookup("sm_90a", problem(4096)).has_value();
    return std::make_pair(found, db.warnings());
  });
  if (looked.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    const int w = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);  // the reader sees end of file and returns
    if (w >= 0) ::close(w);
    looked.wait();
    FAIL() << "the lookup blocked on the FIFO";
  }
  const auto [found, warnings] = looked.get();
  EXPECT_FALSE(found);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find(fifo + " is not a regular file"), std::string::npos) << warnings[0];
  try {
    TuningDb(fifo, "v1").store("sm_90a", problem(4096), entry(32, 256));
    FAIL() << "a store over a FIFO succeeded";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find(fifo + " is not a regular file: not written"), std::string::npos) << e.message();
  }
  std::vector<std::string> left;
  for (const auto& f : fs::directory_iterator(d.path)) left.push_back(f.path().string());
  EXPECT_EQ(left, std::vector<std::string>{fifo}) << "the store created files";
  struct stat st {};
  ASSERT_EQ(::lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode)) << "the FIFO was replaced";
}

// A database that exists but cannot be read is not "no database": the lookup warns with the reason and a store
// refuses to replace what it could not read. As root (who reads anything) this runs as another user.
TEST(TuningDb, UnreadableFileWarnsWithTheReasonAndIsNotRewritten) {
  TempDir d;
  const std::string path = d.path + "/tuning.json";
  TuningDb(path, "v1").store("sm_90a", problem(4096), entry(32, 256));
  const std::string before = test::read_text_file(path);
  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
  auto check = [&path]() -> std::string {
    TuningDb db(path, "v1");
    if (db.lookup("sm_90a", problem(4096))) return "an unreadable file was read";
    const auto w = db.warnings();
    if (w.size() != 1 || w[0].find(std::strerror(EACCES)) == std::string::npos)
      return "no warning naming the reason: " + (w.empty() ? std::string("(none)") : w[0]);
    try {
      db.store("sm_90a", problem(8192), entry(16, 64));
      return std::string("a store over an unreadable file succeeded");
    } catch (const Error& e) {
      if (e.message().find("not rewritten") == std::string::npos) return "store error: " + e.message();
    }
    return std::string();
  };
  std::string r;
  if (::geteuid() == 0) {
    ASSERT_EQ(::chmod(d.path.c_str(), 0777), 0);  // the other user may create the lock file
    r = cache::test::run_as(4242, 4244, check);
  } else {
    ASSERT_EQ(::chmod(path.c_str(), 0), 0);
    r = check();
    ::chmod(path.c_str(), 0600);
  }
  EXPECT_EQ(r, "");
  EXPECT_EQ(test::read_text_file(path), before);
}

// ~/.cache/smla/tuning.json -> /shared/tuning.json: a store replaces the target, not the link, and writers through
// different links (absolute, relative, a linked directory) take one lock file beside the real file.
TEST(TuningDb, SymlinkedPathKeepsTheLinkAndSharesOneLock) {
  TempDir d;
  for (const char* sub : {"real", "home1", "home2"}) ASSERT_EQ(::mkdir((d.path + "/" + sub).c_str(), 0755), 0);
  const std::string real = d.path + "/real/tuning.json", l1 = d.path + "/home1/tuning.json",
                    l2 = d.path + "/home2/tuning.json", l3 = d.path + "/linkdir/tuning.json";
  ASSERT_EQ(::symlink(real.c_str(), l1.c_str()), 0);  // its target does not exist yet
  ASSERT_EQ(::symlink("../real/tuning.json", l2.c_str()), 0);
  ASSERT_EQ(::symlink((d.path + "/real").c_str(), (d.path + "/linkdir").c_str()), 0);
  TuningDb(l1, "v1").store("sm_90a", problem(4096, 128, 5120, 512), entry(16, 16));
  TuningDb(l2, "v1").store("sm_90a", problem(4096, 128, 5120, 528), entry(32, 16));
  TuningDb(l3, "v1").store("sm_90a", problem(4096, 128, 5120, 544), entry(64, 16));
  EXPECT_TRUE(fs::is_symlink(l1)) << "the link was replaced by a plain file";
  EXPECT_TRUE(fs::is_symlink(l2)) << "the link was replaced by a plain file";
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(real)));
  EXPECT_EQ(nlohmann::json::parse(test::read_text_file(real))["entries"].size(), 3u);
  EXPECT_TRUE(fs::exists(real + ".lock"));
  EXPECT_FALSE(fs::exists(l1 + ".lock")) << "a lock beside the link does not exclude writers through another";
  EXPECT_FALSE(fs::exists(l2 + ".lock"));
  for (const std::string& via : {l1, l2, l3}) {
    TuningDb db(via, "v1");
    for (int64_t topk : {512, 528, 544}) EXPECT_TRUE(db.lookup("sm_90a", problem(4096, 128, 5120, topk))) << via;
  }
  for (const auto& f : fs::recursive_directory_iterator(d.path))
    EXPECT_EQ(f.path().filename().string().find(".tmp."), std::string::npos) << f.path();
}

// A group's shared database (umask 002, a setgid directory): a second user of the group can store into it after the
// first created the directory, the file and the lock (0644/0755 locked everyone else out), and a lock file left
// without group write is still taken, read-only.
TEST(TuningDb, SharedGroupDatabaseWritableByASecondUser) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run as two users of one group (cache::test::run_as)";
  constexpr uid_t kAlice = 4242, kBob = 4243;
  constexpr gid_t kGroup = 4244;
  TempDir d;
  ASSERT_EQ(::chmod(d.path.c_str(), 0755), 0);
  const std::string shared = d.path + "/shared", path = shared + "/sub/tuning.json";  // sub/ made by the first user
  ASSERT_EQ(cache::test::group_dir(shared, kGroup), "");
  auto store_as = [&path](uid_t uid, int64_t topk, int bh) {
    return cache::test::run_as(uid, kGroup, [&] {
      try {
        TuningDb(path, "v1").store("sm_90a", problem(4096, 128, 5120, topk), entry(bh, 16));
        return std::string();
      } catch (const Error& e) {
        return e.message();
      }
    });
  };
  EXPECT_EQ(store_as(kAlice, 512, 16), "");
  EXPECT_EQ(store_as(kBob, 528, 32), "") << "the second user of the group cannot write the shared database";
  struct stat st {};
  for (const std::string& f : {path, path + ".lock"}) {
    ASSERT_EQ(::stat(f.c_str(), &st), 0) << f;
    EXPECT_EQ(st.st_mode & 0777, 0664u) << f;
    EXPECT_EQ(st.st_gid, kGroup) << f;
  }
  ASSERT_EQ(::stat((shared + "/sub").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0775u);
  // The lock file (Alice's) left 0644, as umask 022 or an older smla would: Bob takes it read-only.
  ASSERT_EQ(::chmod((path + ".lock").c_str(), 0644), 0);
  EXPECT_EQ(store_as(kBob, 544, 64), "") << "a lock file without group write stopped the second user";
  TuningDb db(path, "v1");
  for (int64_t topk : {512, 528, 544}) EXPECT_TRUE(db.lookup("sm_90a", problem(4096, 128, 5120, topk))) << topk;
}

// Without a home directory the database falls back to /tmp/smla-tuning-<uid>/, a name anyone can predict: another
// user could make that directory first and plant a database whose entries every plan() of ours would follow. It is
// read and written only while it is this user's alone, as the kernel cache's /tmp fallback (cache/private_dir.hpp).
TEST(TuningDb, SharedTmpFallbackIsUsedOnlyWhilePrivate) {
  {  // the fallback is chosen, and marked, only when there is no home directory
    const char* names[] = {"SMLA_TUNING_DB", "XDG_CACHE_HOME", "HOME"};
    std::vector<std::pair<std::string, std::string>> saved;
    for (const char* n : names)
      if (const char* v = std::getenv(n)) saved.emplace_back(n, v);
    for (const char* n : names) ::unsetenv(n);
    const std::string fallback = default_tuning_db_path();
    ::setenv("HOME", "/nonexistent-home", 1);
    const std::string with_home = default_tuning_db_path();
    ::unsetenv("HOME");
    for (const auto& [n, v] : saved) ::setenv(n.c_str(), v.c_str(), 1);
    // getpwuid() may still name a home directory (root's /root here): then there is no /tmp fallback to check.
    if (fallback.rfind("/tmp/", 0) == 0) {
      EXPECT_EQ(fallback, "/tmp/smla-tuning-" + std::to_string(::getuid()) + "/tuning.json");
      EXPECT_TRUE(tuning_db_in_shared_tmp(fallback));
    }
    EXPECT_TRUE(tuning_db_in_shared_tmp("/tmp/smla-tuning-" + std::to_string(::getuid()) + "/tuning.json"));
    EXPECT_EQ(with_home, "/nonexistent-home/.cache/smla/tuning.json");
    EXPECT_FALSE(tuning_db_in_shared_tmp(with_home));
  }
  TempDir d;
  const std::string dir = d.path + "/fallback", path = dir + "/tuning.json";
  ASSERT_EQ(::mkdir(dir.c_str(), 0777), 0);
  ASSERT_EQ(::chmod(dir.c_str(), 0777), 0);  // made first by "someone", writable by all
  TuningDb(path, "v1").store("sm_90a", problem(4096), entry(32, 256));  // the planted entry (no private_dir check)
  TuningDb db(path, "v1", dir);
  EXPECT_FALSE(db.lookup("sm_90a", problem(4096))) << "an entry in a directory others may write was followed";
  EXPECT_FALSE(db.lookup("sm_90a", problem(4096)));
  ASSERT_EQ(db.warnings().size(), 1u) << "one warning a reason, not one a lookup";
  EXPECT_NE(db.warnings()[0].find("other users may write into it (mode 0777)"), std::string::npos) << db.warnings()[0];
  EXPECT_NE(db.warnings()[0].find("SMLA_TUNING_DB or HOME"), std::string::npos) << db.warnings()[0];
  for (const std::function<void()>& f : {std::function<void()>([&] { db.check_store(); }),
                                        std::function<void()>([&] { db.store("sm_90a", problem(8192), entry(16, 64)); })}) {
    try {
      f();
      ADD_FAILURE() << "a store into a directory others may write went ahead";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::InvalidArgument);
      EXPECT_NE(e.message().find("not using " + dir), std::string::npos) << e.message();
    }
  }
  EXPECT_EQ(test::read_text_file(path).find("T<=8192"), std::string::npos) << "the refused store wrote the file";
  ASSERT_EQ(::chmod(dir.c_str(), 0700), 0);  // now this user's alone: read and written
  EXPECT_TRUE(db.lookup("sm_90a", problem(4096)));
  db.store("sm_90a", problem(8192), entry(16, 64));
  EXPECT_TRUE(db.lookup("sm_90a", problem(8192)));
  if (::geteuid() == 0) {  // another user's directory, even 0700, is not read
    ASSERT_EQ(::chown(dir.c_str(), 4242, 4242), 0);
    EXPECT_FALSE(db.lookup("sm_90a", problem(4096)));
    ASSERT_EQ(db.warnings().size(), 2u);
    EXPECT_NE(db.warnings()[1].find("belongs to another user (uid 4242)"), std::string::npos) << db.warnings()[1];
    ASSERT_EQ(::chown(dir.c_str(), 0, 0), 0);
  }
  const std::string absent = d.path + "/absent";  // an absent directory is made, 0700
  TuningDb(absent + "/tuning.json", "v1", absent).store("sm_90a", problem(4096), entry(32, 256));
  struct stat st {};
  ASSERT_EQ(::stat(absent.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
}

// smla-tune stores under the version of the sources the Runtime compiles: with SMLA_KERNEL_SRC_DIR set, not the
// embedded ones (else no plan() finds what it stored). runtime_env() reads the variable once per process, so a
// fresh process (this test, re-run) reports what it sees.
TEST(TuningDb, TuneVersionFollowsSmlaKernelSrcDir) {
  if (std::getenv("SMLA_TUNING_TEST_CHILD")) {
    std::printf("version=%s\ndb=%s\n", default_tuning_runtime_version().c_str(),
                TuningDb("/nonexistent/tuning.json").runtime_version().c_str());
    return;
  }
  TempDir d;
  for (const auto& f : embedded_kernel_sources()) std::ofstream(d.path + "/" + f.first, std::ios::binary) << f.second;
  std::ofstream(d.path + "/dq.cu", std::ios::app) << "\n// edited\n";
  const std::string edited = tuning_runtime_version(KernelSources(d.path));
  ASSERT_NE(edited, tuning_runtime_version(KernelSources()));
  EXPECT_EQ(default_tuning_runtime_version(d.path), edited);  // RuntimeOptions::kernel_src_dir wins
  const std::string exe = fs::read_symlink("/proc/self/exe").string();
  const auto [rc, out] = cache::test::run_cmd("SMLA_KERNEL_SRC_DIR='" + d.path + "' SMLA_TUNING_TEST_CHILD=1 '" + exe +
                                              "' --gtest_filter=TuningDb.TuneVersionFollowsSmlaKernelSrcDir");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("version=" + edited + "\n"), std::string::npos) << out;
  EXPECT_NE(out.find("db=" + edited + "\n"), std::string::npos) << "TuningDb's default version:\n" << out;
}

// smla-tune fails a problem (exit 1) when the planner's own config is wrong or cannot run: it used to print "no tuned
// config" and exit 0.
TEST(TuningDb, TuneFailsWhenTheHeuristicIsWrongOrCannotRun) {
  EXPECT_EQ(tune_heuristic_error("dq mma 64x64", "timed", "", 12), "");
  for (const char* state : {"wrong", "rejected", "untried"}) {
    const std::string e = tune_heuristic_error("dq mma 64x64", state, "dq rel_err 3.1e-01", 12);
    EXPECT_NE(e.find("heuristic config dq mma 64x64"), std::string::npos) << e;
    EXPECT_NE(e.find("dq rel_err 3.1e-01"), std::string::npos) << e;
    EXPECT_NE(e.find("12 other candidates passed"), std::string::npos) << e;
  }
  EXPECT_NE(tune_heuristic_error("c", "wrong", "x", 0).find("correctness check"), std::string::npos);
}

}  // namespace
}  // namespace smla
