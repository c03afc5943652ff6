// test_plan_cache.cpp: what plan() does with the disk cache, on the CUDA backend without a GPU: the stub driver of
// tests/stub/libcuda_stub.c (SMLA_LIBCUDA, with SMLA_STUB_MODULES=1: it loads NVRTC's cubins as handles and runs
// nothing) and NVRTC compiling for sm_90a for real. Each Runtime reads the cache's knobs from the environment when it
// is made, so each case sets them first.
//   - a plan under SMLA_CACHE_MAX_BYTES that compiles one kernel keeps the others it needs: its publish evicted the
//     cached kernels it had not yet loaded (the least recently used), and it then compiled those again;
//   - a plan whose kernels are all cached compiles nothing and counts each as loaded from disk;
//   - a plan under a bound smaller than its own kernels compiles each translation unit once: a later compile's publish
//     evicted a unit compiled earlier in the plan before its other entry points loaded, and the plan compiled it again.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "smla/smla.hpp"
#include "tests/e2e_common.hpp"
#include "tests/stub/stub_symbol.hpp"

namespace smla::test {
namespace {

namespace fs = std::filesystem;

struct Entry {
  std::string name;
  int64_t bytes = 0;
  int64_t stamp_ns = 0;  // the recency stamp (the cache stamps entries strictly increasing: LRU order)
};

// The cache's entries, oldest first.
std::vector<Entry> entries_of(const std::string& dir) {
  std::vector<Entry> v;
  std::error_code ec;
  for (fs::directory_iterator it(dir + "/entries", ec), end; !ec && it != end; it.increment(ec)) {
    Entry e;
    e.name = it->path().filename().string();
    struct stat st {};
    if (::stat(it->path().c_str(), &st) != 0) continue;
    e.stamp_ns = int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    for (const auto& f : fs::directory_iterator(it->path())) e.bytes += int64_t(f.file_size());
    v.push_back(e);
  }
  std::sort(v.begin(), v.end(), [](const Entry& a, const Entry& b) { return a.stamp_ns < b.stamp_ns; });
  return v;
}

int64_t total_bytes(const std::vector<Entry>& v) {
  int64_t n = 0;
  for (const auto& e : v) n += e.bytes;
  return n;
}

class PlanCache : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    Runtime probe;
    for (const auto& b : probe.backends())
      if (b.name == "cuda" && !(b.usable && b.can_compile)) why = b.detail;
    if (!why.empty()) GTEST_SKIP() << "the stub driver with NVRTC is not usable here: " << why;
    char tmpl[] = "/tmp/smla-plan-cache-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ::setenv("SMLA_CACHE_DIR", dir_.c_str(), 1);
    ::unsetenv("SMLA_CACHE_MAX_BYTES");
    ::unsetenv("SMLA_CACHE_READONLY");
    ::unsetenv("SMLA_CACHE_DISABLE");
  }
  void TearDown() override {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }
  PlanInfo plan_in_new_runtime(const Case& c) {
    Runtime rt;
    return rt.plan(make_problem(BackendKind::Cuda, c))->info();
  }
  std::string dir_;
};

// Three problems whose kernels differ (H and TOPK select the tiles): `a` is the one the job plans, the other two only
// fill the cache with entries more recent than a's.
const Case kA{64, 16, 80, 32, 0, true, ref::TopkKind::Uniform};
const Case kFill1{64, 32, 80, 64, 0, true, ref::TopkKind::Uniform};
const Case kFill2{64, 32, 9000, 128, 0, false, ref::TopkKind::Uniform};

TEST_F(PlanCache, APlanUnderTheSizeBoundKeepsTheCachedKernelsItLoadsNext) {
  const PlanInfo first = plan_in_new_runtime(kA);
  ASSERT_GE(first.compiled, 3) << "the problem's kernels were compiled";
  const std::vector<Entry> a = entries_of(dir_);
  ASSERT_EQ(int(a.size()), first.compiled);
  const int64_t a_bytes = total_bytes(a);
  plan_in_new_runtime(kFill1);
  plan_in_new_runtime(kFill2);
  const std::vector<Entry> all = entries_of(dir_);
  ASSERT_GT(all.size(), a.size());
  // The first kernel the plan loads (published first, so stamped first) goes: the job compiles it again.
  fs::remove_all(dir_ + "/entries/" + a.front().name);
  // A bound that holds the problem's kernels with room to spare (an eviction goes down to 90% of it), under what the
  // cache holds: publishing the one kernel evicts least recently used entries, which were a's.
  const int64_t bound = a_bytes * 10 / 9 + 4096;
  ASSERT_LT(bound, total_bytes(all)) << "the fillers do not take the cache over the bound";
  ::setenv("SMLA_CACHE_MAX_BYTES", std::to_string(bound).c_str(), 1);
  // Every launch's kernel is compiled, loaded from disk or reused (one translation unit holds several entry points).
  const int launches = first.compiled + first.loaded_from_disk + first.reused_in_process;
  const PlanInfo job = plan_in_new_runtime(kA);
  EXPECT_EQ(job.compiled, 1) << "the plan compiled kernels that were cached when it started";
  EXPECT_EQ(job.compiled + job.loaded_from_disk + job.reused_in_process, launches);
  // And the next process finds them all.
  const std::vector<Entry> after = entries_of(dir_);
  EXPECT_LE(total_bytes(after), bound);
  const PlanInfo next = plan_in_new_runtime(kA);
  EXPECT_EQ(next.compiled, 0);
  EXPECT_EQ(next.loaded_from_disk + next.reused_in_process, launches);
}

TEST_F(PlanCache, APlanUnderABoundBelowItsOwnKernelsCompilesEachUnitOnce) {
  const PlanInfo free_run = plan_in_new_runtime(kA);
  const std::vector<Entry> units = entries_of(dir_);
  ASSERT_EQ(int(units.size()), free_run.compiled);
  const int launches = free_run.compiled + free_run.loaded_from_disk + free_run.reused_in_process;
  ASSERT_GT(launches, int(units.size())) << "no translation unit of the problem holds two entry points";
  fs::remove_all(dir_ + "/entries");
  // Each publish evicts every other entry: only the last unit compiled stays.
  ::setenv("SMLA_CACHE_MAX_BYTES", "1", 1);
  const PlanInfo job = plan_in_new_runtime(kA);
  EXPECT_EQ(job.compiled, free_run.compiled) << "a unit evicted by the plan's own publishes was compiled again";
  EXPECT_EQ(job.compiled + job.loaded_from_disk + job.reused_in_process, launches);
  EXPECT_LE(entries_of(dir_).size(), 1u);
}

// plan() checks each loaded kernel against its launch, by name, before any run(): the threads a block its compile
// allows, the register count a setmaxnreg split is sized for (under another it would hang), and its own static shared
// memory beside the dynamic carve. The stub reports those limits as a compiled kernel would (SMLA_STUB_FUNC_*).
TEST_F(PlanCache, EachKernelIsCheckedAgainstItsLaunchAtPlanTime) {
  // H 128 at the seed's top-k: dq's producer body (384 threads, a register split) with ~200 KB of shared memory.
  const Case seedlike{64, 128, 600, 512, 0, true, ref::TopkKind::Uniform};
  const std::string split = std::to_string(65536 / 384 / 8 * 8);  // smla_launch_regs(384), common.cuh
  auto refusal = [&](const char* var, const std::string& value) -> std::string {
    ::setenv("SMLA_STUB_FUNC_REGS", split.c_str(), 1);
    ::setenv(var, value.c_str(), 1);
    std::string said;
    try {
      const PlanInfo info = plan_in_new_runtime(seedlike);
      said = "(planned: " + std::to_string(info.kernels.size()) + " launches)";
    } catch (const Error& e) {
      said = std::string(status_name(e.status())) + ": " + e.message();
    }
    ::unsetenv(var);
    ::unsetenv("SMLA_STUB_FUNC_REGS");
    return said;
  };
  EXPECT_EQ(refusal("SMLA_STUB_FUNC_REGS", split).rfind("(planned", 0), 0u) << "the premise: the stub's kernels fit";
  std::string r = refusal("SMLA_STUB_FUNC_MAX_THREADS", "128");
  EXPECT_NE(r.find("threads a block; the compiled kernel allows 128"), std::string::npos) << r;
  for (int off : {-8, 8}) {
    r = refusal("SMLA_STUB_FUNC_REGS", std::to_string(std::stoi(split) + off));
    EXPECT_NE(r.find("its setmaxnreg split between warpgroups is sized for " + split), std::string::npos) << off << ": " << r;
  }
  r = refusal("SMLA_STUB_FUNC_STATIC_SMEM", "40000");
  EXPECT_NE(r.find("bytes of shared memory and 40000 of its own; the device allows 232448"), std::string::npos) << r;
}

// One of the stub driver's counters (tests/stub/libcuda_stub.c).
int stub_count(const char* counter) { return stub_counter(SMLA_STUB_LIBCUDA, counter); }

// Once the plan and its Runtime are gone, every module they loaded is unloaded, each after the context's work is done
// (the last plan may go right after its run(), and a module's launches still queued would outlive its handle), and
// the primary context they retained is released.
TEST_F(PlanCache, ModulesAreUnloadedOnceTheContextsWorkIsDone) {
  const int loaded = stub_count("smla_stub_modules_loaded"), unloaded = stub_count("smla_stub_modules_unloaded"),
            after_sync = stub_count("smla_stub_unloads_after_sync"), held = stub_count("smla_stub_primary_contexts_held");
  ASSERT_GE(loaded, 0);
  {
    Runtime rt;
    auto plan = rt.plan(make_problem(BackendKind::Cuda, kA));
    ASSERT_GT(stub_count("smla_stub_modules_loaded"), loaded);
  }
  const int n = stub_count("smla_stub_modules_loaded") - loaded;
  EXPECT_EQ(stub_count("smla_stub_modules_unloaded") - unloaded, n) << "modules left loaded";
  EXPECT_EQ(stub_count("smla_stub_unloads_after_sync") - after_sync, n) << "a module unloaded with work maybe queued";
  EXPECT_EQ(stub_count("smla_stub_primary_contexts_held"), held) << "a primary context retained and never released";
}

}  // namespace
}  // namespace smla::test

int main(int argc, char** argv) {
  // Before anything opens the driver: the stub, with its module loads on.
  ::setenv("SMLA_LIBCUDA", SMLA_STUB_LIBCUDA, 1);
  ::setenv("SMLA_STUB_MODULES", "1", 1);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
