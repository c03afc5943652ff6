// test_warmup.cpp: smla-warmup without a GPU: the kernels it compiles are exactly those plan()
// looks up (same keys), a second run compiles nothing, the directory serves as a system cache;
// the T policy; --shape parsing and the tool's errors.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cache/kernel_cache.hpp"
#include "runtime/cuda/cuda_backend.hpp"
#include "runtime/cuda/kernels_cuda.hpp"
#include "runtime/cuda/nvrtc_compiler.hpp"
#include "runtime/env.hpp"
#include "runtime/hip/hiprtc_compiler.hpp"
#include "runtime/hip/rocprim_sort.hpp"
#include "runtime/kernel_key.hpp"
#include "runtime/planner.hpp"
#include "runtime/sources.hpp"
#include "tests/read_text_file.hpp"
#include "runtime/tuning_db.hpp"
#include "runtime/warmup.hpp"

#if __has_include("runtime/hip/kernels_hip.hpp")
#include "runtime/hip/kernels_hip.hpp"
#define HAVE_HIP_KERNELS 1
#else
#define HAVE_HIP_KERNELS 0
#endif

namespace smla {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/smla-warmup-test-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path); }
};

struct ToolRun {
  int code = -1;
  std::string out, err;
};

// Runs smla-warmup (built next to this test, in bin/) with an empty tuning database and a
// private lock directory, so nothing of the user's environment leaks in.
// `env`: more VAR=VALUE words for the tool's environment.
ToolRun warmup_tool(const std::string& args, const TempDir& scratch, const std::string& env = "") {
  const fs::path exe = fs::read_symlink("/proc/self/exe").parent_path() / "smla-warmup";
  if (!fs::exists(exe)) {
    ADD_FAILURE() << exe << " is missing: build the smla-warmup target";
    return {};
  }
  const std::string o = scratch.path + "/stdout", e = scratch.path + "/stderr";
  const std::string cmd = "env " + env + " SMLA_TUNING_DB=" + scratch.path + "/no-tuning.json SMLA_CACHE_LOCK_DIR=" + scratch.path +
                          "/locks " + exe.string() + " " + args + " >" + o + " 2>" + e;
  const int st = std::system(cmd.c_str());
  ToolRun r;
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.out = test::read_text_file(o);
  r.err = test::read_text_file(e);
  return r;
}

nlohmann::json json_of(const ToolRun& r) {
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << "stdout is not one JSON object:\n" << r.out << "\nstderr:\n" << r.err;
  return j;
}

Problem seed_problem() {
  Problem p;
  p.T = 4096, p.H = 128, p.num_kv = 5120, p.topk = 512, p.has_sink = true;
  return p;
}

// What plan() looks up for `p` on `target`, computed the way runtime.cpp does (heuristic shape,
// order_steps, kernel_key_fields), independently of warm_kernels.
std::vector<cache::KeyFields> plan_keys(const std::string& target, const Problem& p, const RtcCompiler& rtc,
                                        const KernelsOf& kernels) {
  KernelSources sources;
  std::vector<cache::KeyFields> out;
  std::set<std::string> seen;
  ShapeInfo shape = choose_shape(p, runtime_env().interm_budget);
  apply_config(shape, nullptr, target);  // the target's features, as plan() applies them
  for (const Step& st : order_steps(shape, kernels)) {
    if (st.spec.stem[0] == '@') continue;  // a library routine (rocPRIM on AMD), not compiled
    cache::KeyFields f = kernel_key_fields(st.spec, sources, rtc, target, nullptr);
    if (seen.insert(cache::make_key(f).entry_name()).second) out.push_back(std::move(f));
  }
  return out;
}

std::set<std::string> names(const std::vector<cache::KeyFields>& fs) {
  std::set<std::string> s;
  for (const auto& f : fs) s.insert(cache::make_key(f).entry_name());
  return s;
}

// The CI cycle for one target: dry run lists plan()'s keys; a run on an empty directory compiles
// them; a second run compiles nothing; the directory as a system cache serves every key.
// `full_targets`: what devices of `arch` may report (plan() keys with that).
void warm_cycle(const std::string& arch, const std::vector<std::string>& full_targets, const RtcCompiler& rtc,
                const KernelsOf& kernels) {
  TempDir scratch;
  const std::string out = scratch.path + "/aot";
  const std::string args = "--arch " + arch + " --shape 4096,128,5120,512 --sink on -j 2 --json --out " + out;
  std::vector<cache::KeyFields> keys;
  for (const std::string& t : full_targets) {
    const auto k = plan_keys(t, seed_problem(), rtc, kernels);
    ASSERT_GE(k.size(), 5u) << t;
    keys.insert(keys.end(), k.begin(), k.end());
  }

  const ToolRun dry = warmup_tool(args + " --dry-run", scratch);
  ASSERT_EQ(dry.code, 0) << dry.err;
  std::set<std::string> listed;
  const auto jd = json_of(dry);
  for (const auto& k : jd["kernels"]) listed.insert(k["key"].get<std::string>());
  EXPECT_EQ(listed, names(keys)) << "warm-up would compile other kernels than plan() looks up";
  EXPECT_FALSE(fs::exists(out + "/entries")) << "a dry run wrote to the cache";
  EXPECT_FALSE(fs::exists(out)) << "a dry run made the output directory";
  EXPECT_EQ(jd["cached"], 0);
  for (const auto& k : jd["kernels"]) EXPECT_EQ(k["state"], "planned") << k.dump();
  // The compiler identity each target's keys carry, as plan() computes it: what to compare with a job's machine.
  for (const std::string& t : full_targets) {
    ASSERT_TRUE(jd["compilers"].contains(t)) << jd["compilers"].dump();
    EXPECT_EQ(jd["compilers"][t].get<std::string>(), rtc.identity()) << t;
  }
  EXPECT_EQ(jd["compilers"].size(), full_targets.size()) << jd["compilers"].dump();

  const ToolRun first = warmup_tool(args, scratch);
  ASSERT_EQ(first.code, 0) << first.out << first.err;
  const auto j1 = json_of(first);
  EXPECT_EQ(j1["failed"], 0) << first.out;
  EXPECT_EQ(j1["compiled"].get<size_t>(), keys.size());
  EXPECT_EQ(j1["cached"], 0);
  EXPECT_GT(j1["seconds"].get<double>(), 0);

  const ToolRun second = warmup_tool(args, scratch);
  ASSERT_EQ(second.code, 0) << second.err;
  const auto j2 = json_of(second);
  EXPECT_EQ(j2["compiled"], 0) << "the second run compiled again";
  EXPECT_EQ(j2["cached"], j1["compiled"]);
  EXPECT_EQ(j2["failed"], 0);
  // A dry run now finds every kernel in the directory (it said "already cached 0" whatever the directory held).
  const ToolRun dry2 = warmup_tool(args + " --dry-run", scratch);
  ASSERT_EQ(dry2.code, 0) << dry2.err;
  const auto jd2 = json_of(dry2);
  EXPECT_EQ(jd2["cached"], j1["compiled"]) << dry2.out;
  for (const auto& k : jd2["kernels"]) EXPECT_EQ(k["state"], "cached") << k.dump();
  // The text listing says it too, a column on each kernel's line (it gave only the entry).
  const std::string text_args = "--arch " + arch + " --shape 4096,128,5120,512 --sink on -j 2 --out " + out;
  const ToolRun dry3 = warmup_tool(text_args + " --dry-run", scratch);
  ASSERT_EQ(dry3.code, 0) << dry3.err;
  size_t cached_lines = 0;
  for (const auto& k : keys) {
    const size_t at = dry3.out.find(cache::make_key(k).entry_name());
    if (at == std::string::npos) continue;
    const size_t bol = dry3.out.rfind('\n', at) + 1;  // (npos + 1: the first line)
    cached_lines += dry3.out.substr(bol, at - bol).find(" cached ") != std::string::npos;
  }
  EXPECT_EQ(cached_lines, keys.size()) << dry3.out;

  // Another machine: an empty user cache, the warm-up output as the read-only system cache.
  cache::Settings cs;
  cs.dir = scratch.path + "/user";
  cs.system_dir = out;
  cs.lock_dir = scratch.path + "/locks";
  cache::DiskCache disk(cs);
  for (const auto& f : keys) {
    const cache::Fetched got = disk.get_or_compile(f, [&]() -> cache::CompileOutput {
      ADD_FAILURE() << f.kernel << " [" << f.shape_tag << "] was compiled: not served by the system cache";
      return {};
    });
    EXPECT_EQ(got.origin, cache::Origin::SystemDisk) << f.kernel;
    ASSERT_GT(got.binary.size(), 4u);
    EXPECT_EQ(std::string(got.binary.begin(), got.binary.begin() + 4), "\x7f" "ELF") << f.kernel;
  }
  EXPECT_EQ(disk.stats().compiles, 0);
  EXPECT_EQ(disk.stats().system_hits, int64_t(keys.size()));
}

// A dry run (keys listed, nothing compiled) into `out`, without the tuning database.
WarmupOptions dry_run_options(const std::string& out) {
  WarmupOptions o;
  o.out_dir = out;
  o.dry_run = true;
  o.use_tuning_db = false;
  return o;
}

TEST(Warmup, Sm90aCompilesThePlansKernelsOnceAndServesThemAsSystemCache) {
  cuda::NvrtcCompiler nvrtc;
  std::string why;
  ASSERT_TRUE(nvrtc.available(&why)) << "CI has NVRTC: " << why;
  warm_cycle("sm_90a", {"sm_90a"}, nvrtc, cuda_phase_kernels);
}

// A device reports its full target id, and HSA_XNACK=1 turns gfx90a:sramecc+:xnack- into
// ...:xnack+ on the same GPU: a plain "gfx90a" warms both, an explicit feature only its own.
TEST(Warmup, AmdTargetIdsCoverBothXnackModesUnlessGiven) {
  using V = std::vector<std::string>;
  EXPECT_EQ(hip::hip_target_ids("gfx90a"), (V{"gfx90a:sramecc+:xnack-", "gfx90a:sramecc+:xnack+"}));
  EXPECT_EQ(hip::hip_target_ids("gfx942"), (V{"gfx942:sramecc+:xnack-", "gfx942:sramecc+:xnack+"}));
  EXPECT_EQ(hip::hip_target_ids("gfx90a:xnack+"), V{"gfx90a:sramecc+:xnack+"});
  EXPECT_EQ(hip::hip_target_ids("gfx950:xnack-"), V{"gfx950:sramecc+:xnack-"});
  EXPECT_EQ(hip::hip_target_ids("gfx90a:sramecc-"), (V{"gfx90a:sramecc-:xnack-", "gfx90a:sramecc-:xnack+"}));
  EXPECT_EQ(hip::hip_target_ids("gfx90a:sramecc+:xnack+"), V{"gfx90a:sramecc+:xnack+"});
  EXPECT_EQ(hip::hip_target_ids("gfx90a:foo+"), V{"gfx90a:foo+"}) << "unknown feature: left to hipRTC";
  EXPECT_EQ(hip::hip_target_ids("gfx1100"), V{"gfx1100"});
  EXPECT_EQ(warm_targets({"sm_90a", "gfx90a", "gfx90a:xnack+"}),
            (V{"sm_90a", "gfx90a:sramecc+:xnack-", "gfx90a:sramecc+:xnack+"}));
}

#if HAVE_HIP_KERNELS
TEST(Warmup, Gfx90aCompilesThePlansKernelsOnceAndServesThemAsSystemCache) {
  hip::HipRtcCompiler hiprtc;
  std::string why;
  if (!hiprtc.available(&why)) GTEST_SKIP() << "hipRTC cannot be loaded here: " << why;
  const std::vector<std::string> targets = {"gfx90a:sramecc+:xnack-", "gfx90a:sramecc+:xnack+"};
  for (const auto& t : targets)
    if (!hip::hip_target_known(t, &why)) GTEST_SKIP() << "this hipRTC does not compile " << t << ": " << why;
  warm_cycle("gfx90a", targets, hiprtc, [](Phase ph, const ShapeInfo& s) {
    using namespace hip;
    return hip_phase_kernels(ph, s);
  });
}
#else
TEST(Warmup, Gfx90aWithoutAmdKernelSourcesFailsClearly) {
  TempDir scratch;
  const ToolRun r = warmup_tool("--arch gfx90a --shape 4096,128,5120,512 --out " + scratch.path + "/aot", scratch);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("no AMD kernel sources in this build"), std::string::npos) << r.out;
  GTEST_SKIP() << "no AMD kernel sources in this build (runtime/hip/kernels_hip.hpp is missing): the gfx90a "
                  "compile cycle is not tested; checked only that smla-warmup says so and fails";
}
#endif

// T policy: a new T with everything else the same compiles nothing new, although the planner's
// chunking differs; only a tuned config of another T bucket may change the kernel set.
TEST(Warmup, TPolicyNewTReusesTheKernels) {
  TempDir scratch;
  WarmupOptions o = dry_run_options(scratch.path + "/aot");
  auto keys_for = [&](int64_t T) {
    Problem p = seed_problem();
    p.T = T;
    const WarmupResult r = warm_kernels({p}, {"sm_90a"}, o);
    EXPECT_EQ(r.failed, 0) << (r.errors.empty() ? "" : r.errors[0]);
    std::set<std::string> s;
    for (const auto& it : r.items) s.insert(it.entry);
    return s;
  };
  const size_t budget = runtime_env().interm_budget;
  Problem p1 = seed_problem(), p9 = seed_problem();
  p1.T = 1000, p9.T = 9000;
  ASSERT_NE(choose_shape(p1, budget).t_chunks, choose_shape(p9, budget).t_chunks) << "the test needs T to change the chunking";
  const auto k1000 = keys_for(1000), k4096 = keys_for(4096), k9000 = keys_for(9000);
  EXPECT_FALSE(k4096.empty());
  EXPECT_EQ(k1000, k4096);
  EXPECT_EQ(k9000, k4096);

  // With a tuned config for the 4096 bucket: T = 3000 and 4096 share it, 9000 keeps the heuristic.
  o.use_tuning_db = true;
  o.tuning_db = scratch.path + "/tuning.json";
  TuningDb db(o.tuning_db);
  TuningEntry e;
  e.config = TileConfig{32, 64, 0, 0, 0};
  db.store("sm_90a", seed_problem(), e);
  const auto t3000 = keys_for(3000), t4096 = keys_for(4096), t9000 = keys_for(9000);
  EXPECT_EQ(t3000, t4096);
  EXPECT_NE(t4096, k4096) << "the tuned config was not applied";
  EXPECT_EQ(t9000, k9000);
}

// A problem plan() refuses for its chunk pairs (here: a small interm budget, 100000 token chunks) is a failure of the
// warm-up, not a list of kernels and exit 0.
TEST(Warmup, AProblemWithTooManyChunkPairsFailsAsPlanWould) {
  TempDir scratch;
  WarmupOptions o = dry_run_options(scratch.path + "/aot");
  o.interm_budget = 16384;
  Problem p;
  p.T = 100000, p.H = 16, p.num_kv = 128, p.topk = 16;
  const WarmupResult r = warm_kernels({p}, {"sm_90a"}, o);
  EXPECT_EQ(r.failed, 1);
  ASSERT_EQ(r.errors.size(), 1u);
  EXPECT_NE(r.errors[0].find("chunk pairs"), std::string::npos) << r.errors[0];
  EXPECT_TRUE(r.items.empty()) << "its kernels were listed";
}

// The dkv_interm body: the heuristic on sm_90a lists the wgmma one (H = 128), elsewhere the
// mma.sync one; a tuned dkv_impl = 1 in the database switches sm_90a's warm-up to mma.sync.
TEST(Warmup, DkvBodyFollowsTargetAndTunedConfig) {
  TempDir scratch;
  WarmupOptions o = dry_run_options(scratch.path + "/aot");
  auto dkv_tags = [&](const std::string& target) {
    const WarmupResult r = warm_kernels({seed_problem()}, {target}, o);
    EXPECT_EQ(r.failed, 0) << (r.errors.empty() ? "" : r.errors[0]);
    std::vector<std::string> tags;
    for (const auto& it : r.items)
      if (it.kernel == "dkv_interm") tags.push_back(it.tag);
    return tags;
  };
  auto wgmma = [](const std::vector<std::string>& tags) {
    return tags.size() == 1 && tags[0].find("DKV_WGMMA1") != std::string::npos;
  };
  const auto h90a = dkv_tags("sm_90a"), h80 = dkv_tags("sm_80");
  ASSERT_EQ(h90a.size(), 1u);
  ASSERT_EQ(h80.size(), 1u);
  EXPECT_TRUE(wgmma(h90a)) << h90a[0];
  EXPECT_EQ(h80[0].find("DKV_WGMMA"), std::string::npos) << h80[0];

  o.use_tuning_db = true;
  o.tuning_db = scratch.path + "/tuning.json";
  TuningEntry e;
  e.config.dkv_impl = 1;
  TuningDb(o.tuning_db).store("sm_90a/NVIDIA H200/132sm", seed_problem(), e);
  const auto t90a = dkv_tags("sm_90a");  // the heuristic's (for the devices without an entry) and the tuned one
  ASSERT_EQ(t90a.size(), 2u);
  EXPECT_TRUE(wgmma({t90a[0]})) << t90a[0];
  EXPECT_EQ(t90a[1].find("DKV_WGMMA"), std::string::npos) << "the tuned dkv_impl = 1 was not applied: " << t90a[1];
  EXPECT_NE(t90a[1].find("BLOCK_R64-BLOCK_D256"), std::string::npos) << t90a[1];
}

// smla-tune may now store dq_impl 4 (the persistent producer body; faster than 3 at small top-k): warming from the
// tuning database compiles that body, not the planner's dq_impl 3.
TEST(Warmup, TunedPersistentDqBodyIsWarmed) {
  TempDir scratch;
  WarmupOptions o;
  o.out_dir = scratch.path + "/aot";
  o.dry_run = true;
  o.tuning_db = scratch.path + "/tuning.json";
  auto dq_tags = [&](bool use_db) {
    o.use_tuning_db = use_db;
    const WarmupResult r = warm_kernels({seed_problem()}, {"sm_90a"}, o);
    EXPECT_EQ(r.failed, 0) << (r.errors.empty() ? "" : r.errors[0]);
    std::vector<std::string> tags;
    for (const auto& it : r.items)
      if (it.kernel == "dq") tags.push_back(it.tag);
    return tags;
  };
  const auto heuristic = dq_tags(false);
  ASSERT_EQ(heuristic.size(), 1u);
  EXPECT_NE(heuristic[0].find("DQW_PRODUCER1"), std::string::npos) << heuristic[0];
  EXPECT_EQ(heuristic[0].find("DQW_PERSIST1"), std::string::npos) << heuristic[0];
  TuningEntry e;
  e.config.dq_impl = 4;
  TuningDb(o.tuning_db).store("sm_90a/NVIDIA H100 80GB HBM3/132sm", seed_problem(), e);
  auto tuned = dq_tags(true);
  ASSERT_EQ(tuned.size(), 2u);
  EXPECT_EQ(tuned[0], heuristic[0]);
  EXPECT_NE(tuned[1].find("DQW_PERSIST1"), std::string::npos) << "the tuned dq_impl = 4 was not applied: " << tuned[1];
  // A second device of the same target with its own entry: its config is warmed too (warm-up cannot know which
  // device will run); an entry of another target is not.
  e.config.dq_impl = 1;
  TuningDb(o.tuning_db).store("sm_90a/NVIDIA H200/132sm", seed_problem(), e);
  e.config.dq_impl = 2;
  TuningDb(o.tuning_db).store("sm_90/NVIDIA H200/132sm", seed_problem(), e);
  tuned = dq_tags(true);
  ASSERT_EQ(tuned.size(), 3u);
  EXPECT_EQ(std::count_if(tuned.begin(), tuned.end(),
                          [](const std::string& t) { return t.find("DQ_WGMMA") == std::string::npos; }),
            1) << "the H200's mma.sync body (dq_impl 1) was not warmed";
}

// A tuned entry plan() would pass over for the heuristic (here its r_chunk makes too many chunk pairs at this interm
// budget) is skipped by the warm-up too: the problem's heuristic kernels are listed and nothing fails. It failed the
// whole problem before.
TEST(Warmup, ATunedEntryPlanPassesOverIsSkippedNotAFailure) {
  TempDir scratch;
  WarmupOptions o = dry_run_options(scratch.path + "/aot");
  o.use_tuning_db = true;
  o.tuning_db = scratch.path + "/tuning.json";
  o.interm_budget = 16 << 10;  // one token a chunk: the heuristic's 4096 x 1 pairs, the tuned r_chunk's 4096 x 32
  const Problem p = seed_problem();
  TuningEntry e;
  e.config.r_chunk = 16;
  TuningDb(o.tuning_db).store("sm_90a/NVIDIA H200/132sm", p, e);
  std::string why;
  ASSERT_FALSE(tuned_entry_fits(BackendKind::Cuda, p, e.config, o.interm_budget, "sm_90a", &why))
      << "the entry was meant to be one plan() passes over";
  ASSERT_NE(why.find("chunk pairs"), std::string::npos) << why;
  const WarmupResult r = warm_kernels({p}, {"sm_90a"}, o);
  EXPECT_EQ(r.failed, 0) << (r.errors.empty() ? "" : r.errors[0]);
  EXPECT_EQ(r.tuned_configs, 0);
  o.use_tuning_db = false;
  const WarmupResult heuristic = warm_kernels({p}, {"sm_90a"}, o);
  ASSERT_EQ(heuristic.failed, 0);
  ASSERT_EQ(r.items.size(), heuristic.items.size());
  for (size_t i = 0; i < r.items.size(); ++i) EXPECT_EQ(r.items[i].entry, heuristic.items[i].entry);
}

// The database keys a tuned entry by the lse convention of the job that tuned it, and no kernel depends on that
// convention: a --shape problem (the default convention) warms the configs tuned under the others too.
TEST(Warmup, TunedEntriesOfEveryLseConventionAreWarmed) {
  TempDir scratch;
  WarmupOptions o = dry_run_options(scratch.path + "/aot");
  o.use_tuning_db = true;
  o.tuning_db = scratch.path + "/tuning.json";
  auto dq_tags = [&](const Problem& p) {
    const WarmupResult r = warm_kernels({p}, {"sm_90a"}, o);
    EXPECT_EQ(r.failed, 0) << (r.errors.empty() ? "" : r.errors[0]);
    std::vector<std::string> tags;
    for (const auto& it : r.items)
      if (it.kernel == "dq") tags.push_back(it.tag);
    return std::make_pair(tags, r.tuned_configs);
  };
  Problem base2 = seed_problem();
  base2.lse.base2 = true;
  TuningEntry e;
  e.config.dq_impl = 4;
  TuningDb(o.tuning_db).store("sm_90a/NVIDIA H200/132sm", base2, e);
  Problem excl = seed_problem();
  excl.lse.includes_sink = false;
  e.config.dq_impl = 1;
  TuningDb(o.tuning_db).store("sm_90a/NVIDIA H200/132sm", excl, e);
  const auto [tags, tuned] = dq_tags(seed_problem());
  EXPECT_EQ(tuned, 2);
  ASSERT_EQ(tags.size(), 3u);
  EXPECT_EQ(std::count_if(tags.begin(), tags.end(),
                          [](const std::string& t) { return t.find("DQW_PERSIST1") != std::string::npos; }),
            1) << "the base-2 job's tuned dq_impl 4 was not warmed";
  EXPECT_EQ(std::count_if(tags.begin(), tags.end(),
                          [](const std::string& t) { return t.find("DQ_WGMMA") == std::string::npos; }),
            1) << "the excluding job's tuned dq_impl 1 was not warmed";
  // Without a sink there is nothing to exclude: only the base-2 entry (stored with a sink) is of another problem, so
  // nothing tuned is warmed for the sinkless problem.
  Problem no_sink = seed_problem();
  no_sink.has_sink = false;
  EXPECT_EQ(dq_tags(no_sink).second, 0);
}

// An AMD target the build's csr sort (libsmla_rocprim.so) has no code for: plan() refuses every problem there, so the
// warm-up (a dry run too) says so for the target instead of listing its kernels as if a job could use them.
TEST(Warmup, AnAmdTargetTheCsrSortLacksFailsAsPlanWould) {
#if !HAVE_HIP_KERNELS
  GTEST_SKIP() << "no AMD kernel sources in this build";
#else
  std::string why;
  const hip::RocprimSort* sort = hip::RocprimSort::get(&why);
  if (!sort) GTEST_SKIP() << "no libsmla_rocprim.so here: " << why;
  std::string lacking, having;
  for (const char* proc : {"gfx90a", "gfx942", "gfx950"}) {
    std::string w;
    (sort->supports(proc, &w) ? having : lacking) = proc;
  }
  if (lacking.empty()) GTEST_SKIP() << "this build's csr sort has code for gfx90a, gfx942 and gfx950";
  TempDir scratch;
  const WarmupOptions o = dry_run_options(scratch.path + "/aot");
  const WarmupResult bad = warm_kernels({seed_problem()}, {lacking + ":sramecc+:xnack-"}, o);
  EXPECT_EQ(bad.failed, 1);
  ASSERT_EQ(bad.errors.size(), 1u);
  EXPECT_NE(bad.errors[0].find("plan() of this build refuses it"), std::string::npos) << bad.errors[0];
  EXPECT_TRUE(bad.items.empty()) << "its kernels were listed";
  if (!having.empty()) {
    const WarmupResult good = warm_kernels({seed_problem()}, {having + ":sramecc+:xnack-"}, o);
    EXPECT_EQ(good.failed, 0) << (good.errors.empty() ? "" : good.errors[0]);
    EXPECT_FALSE(good.items.empty());
  }
#endif
}

TEST(Warmup, DeduplicatesAcrossProblemsAndReportsUnsupported) {
  TempDir scratch;
  WarmupOptions o = dry_run_options(scratch.path);
  Problem a = seed_problem(), b = seed_problem(), bad = seed_problem();
  b.T = 8192;
  bad.H = 48;
  const WarmupResult one = warm_kernels({a}, {"sm_90a"}, o);
  const WarmupResult two = warm_kernels({a, b, bad}, {"sm_90a", "xyz"}, o);
  EXPECT_EQ(two.items.size(), one.items.size());
  EXPECT_EQ(two.failed, 2);  // H = 48 and the unknown target
  ASSERT_EQ(two.errors.size(), 2u);
  EXPECT_NE(two.errors[0].find("H = 48"), std::string::npos) << two.errors[0];  // targets in order: sm_90a first
  EXPECT_NE(two.errors[1].find("unknown target 'xyz'"), std::string::npos) << two.errors[1];
  for (const auto& it : one.items) EXPECT_EQ(it.state, WarmupItem::State::Planned);
  // csr launches several entries from one translation unit: listed on one item.
  bool csr = false;
  for (const auto& it : one.items)
    if (it.kernel == "csr") csr = it.entries.size() >= 3;
  EXPECT_TRUE(csr);
}

// A dry run names an AMD processor or target id plan() would refuse, as a real warm-up does (it listed their kernels).
TEST(Warmup, DryRunRefusesAnAmdTargetPlanWouldRefuse) {
  TempDir scratch;
  WarmupOptions o = dry_run_options(scratch.path);
  const WarmupResult r = warm_kernels({seed_problem()}, {"gfx908", "gfx90a:xnack+:xnack-"}, o);
  EXPECT_TRUE(r.items.empty());
  ASSERT_EQ(r.errors.size(), 2u);
  EXPECT_NE(r.errors[0].find("'gfx908'"), std::string::npos) << r.errors[0];
  EXPECT_NE(r.errors[0].find("not supported"), std::string::npos) << r.errors[0];
  EXPECT_NE(r.errors[1].find("xnack"), std::string::npos) << r.errors[1];
}

// The same for NVIDIA: a target no GPU runs plan()'s kernels for was listed by a dry run and warmed (sm_90 filled keys
// that plan(), which compiles sm_90a on Hopper, never looks up); sm_70 and sm_91 failed only kernel by kernel.
TEST(Warmup, DryRunRefusesACudaTargetPlanNeverUses) {
  TempDir scratch;
  WarmupOptions o = dry_run_options(scratch.path);
  const WarmupResult r = warm_kernels({seed_problem()}, {"sm_70", "sm_91", "sm_90", "sm_", "sm_90a", "sm_80"}, o);
  ASSERT_EQ(r.errors.size(), 4u);
  for (const char* t : {"'sm_70'", "'sm_91'", "'sm_90'", "'sm_'"}) {
    bool named = false;
    for (const auto& e : r.errors) named = named || e.find(t) != std::string::npos;
    EXPECT_TRUE(named) << t;
  }
  for (const auto& e : r.errors) {
    EXPECT_NE(e.find("sm_90a"), std::string::npos) << "the message lists what is known: " << e;
    if (e.rfind("sm_90:", 0) == 0) EXPECT_NE(e.find("warm sm_90a"), std::string::npos) << e;
  }
  std::set<std::string> listed;
  for (const auto& it : r.items) listed.insert(it.target);
  EXPECT_EQ(listed, (std::set<std::string>{"sm_90a", "sm_80"}));
}

// One parse of "sm_NN[a|f]" (parse_cuda_target) serves the planner's shared-memory table and warm-up's target check.
// Each had its own before, and they disagreed: the table read "sm_090" and "sm_080" as sm_90 and sm_80 (227 and 163
// KB) while the check refused them.
TEST(Warmup, CudaTargetNamesHaveOneParse) {
  std::optional<CudaTargetName> n = parse_cuda_target("sm_90a");
  ASSERT_TRUE(n);
  EXPECT_EQ(n->cc, 90);
  EXPECT_EQ(n->suffix, 'a');
  n = parse_cuda_target("sm_100f");
  ASSERT_TRUE(n);
  EXPECT_EQ(n->cc, 100);
  EXPECT_EQ(n->suffix, 'f');
  n = parse_cuda_target("sm_80");
  ASSERT_TRUE(n);
  EXPECT_EQ(n->cc, 80);
  EXPECT_EQ(n->suffix, '\0');
  for (const char* t : {"sm_090", "sm_080", "sm_9", "sm_1000", "sm_90b", "sm_90af", "sm_", "sm90a", "SM_90a", "gfx950"}) {
    EXPECT_FALSE(parse_cuda_target(t)) << t;
    EXPECT_EQ(cuda_smem_limit(t), 0u) << t;
    EXPECT_FALSE(cuda::cuda_target_supported(t, nullptr)) << t;
  }
  // Every name the check accepts is in the table; these, and no others, are accepted.
  std::set<std::string> accepted;
  for (int cc = 10; cc < 1000; ++cc)
    for (const char* suffix : {"", "a", "f"}) {
      const std::string t = "sm_" + std::to_string(cc) + suffix;
      if (!cuda::cuda_target_supported(t, nullptr)) continue;
      accepted.insert(t);
      EXPECT_NE(cuda_smem_limit(t), 0u) << t;
    }
  EXPECT_EQ(accepted, (std::set<std::string>{"sm_80", "sm_86", "sm_87", "sm_89", "sm_90a", "sm_100", "sm_101",
                                             "sm_103", "sm_110", "sm_120", "sm_121"}));
}

TEST(ShapeSpec, NumbersRangesAndNames) {
  auto ps = parse_shape_spec("4096,128,5120,512");
  ASSERT_EQ(ps.size(), 1u);
  EXPECT_EQ(ps[0].T, 4096);
  EXPECT_EQ(ps[0].H, 128);
  EXPECT_EQ(ps[0].num_kv, 5120);
  EXPECT_EQ(ps[0].topk, 512);
  EXPECT_EQ(ps[0].r_chunk, 0);

  ps = parse_shape_spec("T=4096:16384:4096,128,5120,512,128");
  ASSERT_EQ(ps.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(ps[i].T, int64_t(4096 * (i + 1)));
    EXPECT_EQ(ps[i].r_chunk, 128);
  }
  ps = parse_shape_spec("1024:8192:*2,H=64:128:64,NUM_KV=5120,TOPK=640");
  ASSERT_EQ(ps.size(), 8u);  // T 1024..8192 (4) x H 64, 128
  std::set<int64_t> Ts, Hs;
  for (const auto& p : ps) Ts.insert(p.T), Hs.insert(p.H);
  EXPECT_EQ(Ts, (std::set<int64_t>{1024, 2048, 4096, 8192}));
  EXPECT_EQ(Hs, (std::set<int64_t>{64, 128}));
  ps = parse_shape_spec("topk=512,t=10:12:1,h=16,num_kv=20");  // names in any order, any case
  ASSERT_EQ(ps.size(), 3u);
  EXPECT_EQ(ps[2].T, 12);
  EXPECT_EQ(ps[2].topk, 512);
}

// A range ends at its last value <= B even where the next step would pass 2^63 - 1 (the step overflowed, wrapped
// below B and the range ran on until "too many values").
TEST(ShapeSpec, RangesNearTheTopOfInt64EndAtB) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  auto ps = parse_shape_spec("9223372036854775800:9223372036854775807:5,16,80,32");
  ASSERT_EQ(ps.size(), 2u);
  EXPECT_EQ(ps[1].T, kMax - 2);
  ps = parse_shape_spec("1:9223372036854775807:*2,16,80,32");
  ASSERT_EQ(ps.size(), 63u);
  EXPECT_EQ(ps.back().T, int64_t(1) << 62);
  ps = parse_shape_spec("-9223372036854775807:9223372036854775807:9223372036854775807,16,80,32");
  ASSERT_EQ(ps.size(), 3u);
  EXPECT_EQ(ps[2].T, kMax);
}

TEST(ShapeSpec, ErrorsSayWhatIsWrong) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"4096,128,5120", "TOPK is missing"},
      {"4096,128,abc,512", "'abc' is not an integer"},
      {"8192:4096:1024,128,5120,512", "goes down"},
      {"4096:8192,128,5120,512", "A:B:STEP"},
      {"4096:8192:0,128,5120,512", "step"},
      {"1:8:*1,128,5120,512", "factor"},
      {"X=1,128,5120,512", "unknown field name 'X'"},
      {"T=1,T=2,128,5120", "T given twice"},
      {"1,2,3,4,5,6", "6 fields"},
      {"", "0 fields"},
      // a trailing comma (",$RC" with RC unset) was R_CHUNK left to the planner; a blank or a '+' was taken by stoll
      {"4096,128,5120,512,", "an empty field"},
      {"4096,128,5120,", "an empty field"},
      {"4096,,5120,512", "an empty field"},
      {" 4096,128,5120,512", "' 4096' is not an integer"},
      {"4096,128,5120,+512", "'+512' is not an integer"},
      {"4096,128,5120,512:1024: 256", "' 256' is not an integer"},
      {"--4096,128,5120,512", "'--4096' is not an integer"},
  };
  for (const auto& [spec, why] : bad) {
    try {
      parse_shape_spec(spec);
      ADD_FAILURE() << "'" << spec << "' was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::InvalidArgument);
      EXPECT_NE(e.message().find(why), std::string::npos) << spec << ": " << e.message();
      EXPECT_NE(e.message().find("T,H,NUM_KV,TOPK"), std::string::npos) << "no hint at the syntax";
    }
  }
}

// --sink both (smla-warmup's default) warms each shape with and without the sink; on and off one of them.
TEST(ShapeSpec, SinkBothGivesEachShapeTwice) {
  const auto both = collect_problems({"64,16,128,16", "32,16,64,16"}, "both", "", true);
  ASSERT_EQ(both.size(), 4u);
  for (size_t i = 0; i < both.size(); ++i) {
    EXPECT_EQ(both[i].has_sink, i % 2 == 0) << i;
    EXPECT_EQ(both[i].T, i < 2 ? 64 : 32) << i;
    EXPECT_TRUE(both[i].check_indices) << i;
  }
  const auto on = collect_problems({"64,16,128,16"}, "on", "", false);
  ASSERT_EQ(on.size(), 1u);
  EXPECT_TRUE(on[0].has_sink);
  const auto off = collect_problems({"64,16,128,16"}, "off", "", false);
  ASSERT_EQ(off.size(), 1u);
  EXPECT_FALSE(off[0].has_sink);
}

TEST(ShapeSpec, JsonProblems) {
  const auto ps = parse_problems_json(R"({"problems": [
      {"T": "4096:8192:4096", "H": 128, "num_kv": 5120, "topk": 512, "sink": true, "lse_base2": true,
       "lse_includes_sink": false, "r_chunk": 256},
      {"T": 100, "H": 16, "num_kv": 200, "topk": 64, "check_indices": true, "dkv_fp32": true}]})");
  ASSERT_EQ(ps.size(), 3u);
  EXPECT_EQ(ps[1].T, 8192);
  EXPECT_TRUE(ps[1].has_sink && ps[1].lse.base2 && !ps[1].lse.includes_sink);
  EXPECT_EQ(ps[1].r_chunk, 256);
  EXPECT_FALSE(ps[2].has_sink);
  EXPECT_TRUE(ps[2].check_indices && ps[2].dkv_fp32);
  EXPECT_THROW(parse_problems_json("[{\"T\": 1, \"H\": 16, \"topk\": 64}]"), Error);  // num_kv missing
  EXPECT_THROW(parse_problems_json("[{\"T\": 1, \"H\": 16, \"num_kv\": 5, \"topk\": 64, \"sink\": 1}]"), Error);
  EXPECT_THROW(parse_problems_json("{not json"), Error);
  // Past 2^63 - 1: named as it was written (it wrapped to T = -1).
  try {
    parse_problems_json("[{\"T\": 18446744073709551615, \"H\": 16, \"num_kv\": 5, \"topk\": 64}]");
    ADD_FAILURE() << "a T past 2^63 - 1 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("\"T\" = 18446744073709551615 is past 2^63 - 1"), std::string::npos) << e.message();
  }
}

TEST(WarmupTool, UsageErrors) {
  TempDir scratch;
  ToolRun r = warmup_tool("--arch sm_90a --shape 4096,128,x,512 --out " + scratch.path, scratch);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--shape '4096,128,x,512'"), std::string::npos) << r.err;

  r = warmup_tool("--arch sm_90a --out " + scratch.path, scratch);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--shape"), std::string::npos) << r.err;

  // An unknown target is the options' fault (it was a failed item, exit 1, as a kernel that failed).
  r = warmup_tool("--arch foo --shape 4096,128,5120,512 --dry-run --out " + scratch.path, scratch);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--arch: unknown target 'foo'"), std::string::npos) << r.err;
  // So is a target of a known family that plan() refuses by its name (sm_90 without the a, a processor smla has no
  // kernels for), and before anything is compiled for the good targets beside it.
  for (const std::string bad : {"sm_90", "sm_100a", "gfx123"}) {
    const std::string out = scratch.path + "/bad-" + bad;
    r = warmup_tool("--arch sm_90a," + bad + " --shape 64,16,80,32 --out " + out, scratch);
    EXPECT_EQ(r.code, 2) << bad << ": " << r.out << r.err;
    EXPECT_NE(r.err.find("--arch: " + bad + ": "), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(out)) << bad << ": kernels were compiled before the bad target was refused";
  }

  // A --tuning-db that is not there is a mistyped path (it warmed the heuristic configs alone, silently).
  r = warmup_tool("--arch sm_90a --shape 64,16,80,32 --dry-run --out " + scratch.path + " --tuning-db " +
                      scratch.path + "/typo.json",
                  scratch);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("tuning db " + scratch.path + "/typo.json: no such file"), std::string::npos) << r.err;
  // Nor is a directory or a file that is no tuning database (a warning in the log, none of its configs, exit 0).
  const std::string notes = scratch.path + "/notes.txt";
  std::ofstream(notes) << "not a database\n";
  for (const auto& [db, says] : {std::pair<std::string, std::string>{scratch.path, "is a directory"},
                                 {notes, "not a tuning database"}}) {
    r = warmup_tool("--arch sm_90a --shape 64,16,80,32 --dry-run --out " + scratch.path + "/aot --tuning-db " + db,
                    scratch);
    EXPECT_EQ(r.code, 2) << db << ": " << r.out << r.err;
    EXPECT_NE(r.err.find("tuning db " + db + " " + says), std::string::npos) << r.err;
  }

  r = warmup_tool("--help", scratch);
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("A:B:STEP"), std::string::npos) << "--help does not document ranges";
}

// A copy of the repository's kernel sources in `scratch` (its path; "" with a failure when they are not there).
std::string copy_of_kernel_src(const TempDir& scratch) {
  const fs::path repo_src = fs::path(__FILE__).parent_path().parent_path() / "kernel_src";
  if (!fs::exists(repo_src / "dq.cu") || !fs::exists(repo_src / "common.cuh")) {
    ADD_FAILURE() << "no kernel sources at " << repo_src;
    return "";
  }
  const std::string src = scratch.path + "/kernel_src";
  fs::copy(repo_src, src);
  return src;
}

// A unit that fails to compile is one line in the report that still names the cause: the compile log's first line
// saying "error" after the message's first line (a static_assert's text here, in the header every unit includes).
TEST(Warmup, AFailedCompileNamesItsCauseInItsLine) {
  cuda::NvrtcCompiler nvrtc;
  std::string why;
  ASSERT_TRUE(nvrtc.available(&why)) << "CI has NVRTC: " << why;
  TempDir scratch;
  const std::string src = copy_of_kernel_src(scratch);
  ASSERT_FALSE(src.empty());
  std::ofstream(src + "/common.cuh", std::ios::app) << "\nstatic_assert(sizeof(int) == 3, \"smla-test-boom\");\n";
  WarmupOptions o;
  o.out_dir = scratch.path + "/aot";
  o.use_tuning_db = false;
  o.kernel_src_dir = src;
  Problem p = seed_problem();
  p.has_sink = false;
  const WarmupResult r = warm_kernels({p}, {"sm_90a"}, o);
  ASSERT_FALSE(r.items.empty());
  EXPECT_EQ(r.failed, int(r.items.size()));
  for (const WarmupItem& it : r.items) {
    EXPECT_EQ(it.state, WarmupItem::State::Failed) << it.kernel;
    EXPECT_NE(it.error.find("smla-test-boom"), std::string::npos) << it.kernel << ": " << it.error;
    EXPECT_EQ(it.error.find('\n'), std::string::npos) << it.kernel << ": not one line: " << it.error;
  }
}

// SMLA_KERNEL_SRC_DIR swaps the kernel sources of plan(); warm-up must compile the same ones, or it fills
// keys no plan looks up. A copy of the sources with one byte more in dq.cu: dq's key changes, no other.
TEST(WarmupTool, KernelSourceDirFromTheEnvironmentAsPlanReadsIt) {
  TempDir scratch;
  const std::string src = copy_of_kernel_src(scratch);
  ASSERT_FALSE(src.empty());
  std::ofstream(src + "/dq.cu", std::ios::app) << "\n";
  // The keys of a dry run, per kernel, with `env` (VAR=VALUE words) in the tool's environment.
  auto keys = [&](const std::string& env) {
    const fs::path exe = fs::read_symlink("/proc/self/exe").parent_path() / "smla-warmup";
    const std::string o = scratch.path + "/keys-out";
    const std::string cmd = "env " + env + " SMLA_TUNING_DB=" + scratch.path + "/no-tuning.json SMLA_CACHE_LOCK_DIR=" +
                            scratch.path + "/locks " + exe.string() +
                            " --arch sm_90a --shape 4096,128,5120,512 --dry-run --json --out " + scratch.path +
                            "/cache >" + o + " 2>/dev/null";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    std::map<std::string, std::string> k;
    const auto j = nlohmann::json::parse(test::read_text_file(o), nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << test::read_text_file(o);
    if (j.is_discarded()) return k;
    for (const auto& item : j.value("kernels", nlohmann::json::array()))
      k[item.value("kernel", "")] = item.value("key", "");
    return k;
  };
  auto plain = keys("-u SMLA_KERNEL_SRC_DIR"), from_env = keys("SMLA_KERNEL_SRC_DIR=" + src);
  ASSERT_EQ(from_env.size(), plain.size());
  ASSERT_TRUE(plain.count("dq"));
  for (const auto& [kernel, key] : plain)
    if (kernel == "dq")
      EXPECT_NE(from_env[kernel], key) << "warm-up did not read dq from SMLA_KERNEL_SRC_DIR";
    else
      EXPECT_EQ(from_env[kernel], key) << kernel;
}

// A kernel compiled but not written (a full disk, by the cache's test hook) is one failure: its
// line says so and why, the summary counts it once (it was counted as compiled and then again as
// failed) and names it.
TEST(WarmupTool, KernelNotWrittenIsOneFailureNamed) {
  cuda::NvrtcCompiler nvrtc;
  std::string why;
  ASSERT_TRUE(nvrtc.available(&why)) << "CI has NVRTC: " << why;
  TempDir scratch;
  const std::string out = scratch.path + "/aot";
  const std::string args = "--arch sm_90a --shape 4096,128,5120,512 --sink on -j 2 --out " + out;
  const ToolRun dry = warmup_tool(args + " --dry-run --json", scratch);
  ASSERT_EQ(dry.code, 0) << dry.err;
  const auto jd = json_of(dry);
  std::set<std::string> kernels;
  for (const auto& k : jd["kernels"]) kernels.insert(k["kernel"].get<std::string>());
  const size_t n = jd["kernels"].size();
  ASSERT_GE(n, 2u);

  const ToolRun r = warmup_tool(args, scratch, "SMLA_CACHE_TEST_FAIL_WRITES=1");
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  const std::string total = "/" + std::to_string(n) + "] ";
  size_t lines = 0;
  std::istringstream err(r.err);
  for (std::string line; std::getline(err, line);) {
    if (line.find(total) == std::string::npos) continue;
    ++lines;
    EXPECT_NE(line.find("FAILED"), std::string::npos) << line;
    EXPECT_NE(line.find("compiled but not written to " + out), std::string::npos) << line;
    EXPECT_NE(line.find("No space left on device"), std::string::npos) << "no reason: " << line;
  }
  EXPECT_EQ(lines, n) << r.err;
  EXPECT_NE(r.out.find("compiled 0, already cached 0, failed " + std::to_string(n) + " "), std::string::npos)
      << "each kernel counted once: " << r.out;
  std::set<std::string> named;
  std::istringstream o(r.out);
  for (std::string line; std::getline(o, line);)
    if (line.rfind("failed: ", 0) == 0) {
      named.insert(line.substr(8, line.find(' ', 8) - 8));
      EXPECT_NE(line.find("compiled but not written"), std::string::npos) << line;
    }
  EXPECT_EQ(named, kernels) << r.out;
}

// A warm-up that could not be done is exit 1, as a failed kernel is: the options were sound (an --out that cannot be
// written, here under a regular file: root too is refused). 2 stays for usage errors, a --json-file that is not there
// too. Every error thrown was 2 before.
TEST(WarmupTool, ARunThatFailsIs1AndAUsageError2) {
  TempDir scratch;
  ToolRun r = warmup_tool("--arch sm_80 --json-file " + scratch.path + "/none.json --out " + scratch.path + "/aot", scratch);
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find(scratch.path + "/none.json"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(scratch.path + "/aot")) << "a usage error warmed nothing";

  std::string why;
  ASSERT_TRUE(cuda::NvrtcCompiler().available(&why)) << "CI has NVRTC (without it nothing is to be written): " << why;
  const std::string file = scratch.path + "/a-file";
  std::ofstream(file) << "not a directory\n";
  r = warmup_tool("--arch sm_80 --shape 64,16,80,32 --out " + file + "/aot", scratch);
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("smla-warmup: cannot write the warm-up output directory " + file + "/aot ("), std::string::npos)
      << r.err;
  // The reason is in the error, and the runtime cache's advice (set SMLA_CACHE_DIR, kernels kept in memory) is not
  // given: the warm-up writes to --out, never to the user cache.
  EXPECT_NE(r.err.find("Not a directory"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("SMLA_CACHE_DIR"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("in memory"), std::string::npos) << r.err;
  // A dry run says so too, writing nothing (it exited 0: a job script it passed then failed).
  r = warmup_tool("--arch sm_80 --shape 64,16,80,32 --dry-run --out " + file + "/aot", scratch);
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("cannot write the warm-up output directory " + file + "/aot (its parent " + file +
                       " is not a directory)"),
            std::string::npos)
      << r.err;
  r = warmup_tool("--arch sm_80 --shape 64,16,80,32 --dry-run --out " + file, scratch);
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("(" + file + " is not a directory)"), std::string::npos) << r.err;
  // Nor may it pass an --out where nothing can be made, though access() says root may write there (it did: exit 0).
  for (const std::string pseudo : {"/proc/smla-aot", "/sys/kernel/smla-aot"}) {
    if (!fs::is_directory(fs::path(pseudo).parent_path())) continue;
    r = warmup_tool("--arch sm_80 --shape 64,16,80,32 --dry-run --out " + pseudo, scratch);
    EXPECT_EQ(r.code, 1) << pseudo << ": " << r.out << r.err;
    EXPECT_NE(r.err.find("cannot write the warm-up output directory " + pseudo + " (its parent "), std::string::npos)
        << r.err;
  }
  r = warmup_tool("--arch sm_80 --shape 64,16,80,32 --dry-run --out " + scratch.path + "/new/deeper/aot", scratch);
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_FALSE(fs::exists(scratch.path + "/new")) << "a dry run made the output directory";
}

// A problem list's key outside its list is refused, not dropped ("Sink" warmed no d_sink kernel, exit 0).
TEST(ShapeSpec, JsonProblemsRefuseAnUnknownKey) {
  for (const char* key : {"Sink", "rchunk", "num-kv"}) {
    const std::string doc =
        std::string("[{\"T\": 64, \"H\": 16, \"num_kv\": 80, \"topk\": 32, \"") + key + "\": true}]";
    try {
      parse_problems_json(doc);
      ADD_FAILURE() << key << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::InvalidArgument);
      EXPECT_NE(e.message().find(std::string("problem list entry 0: unknown key \"") + key + "\""), std::string::npos)
          << e.message();
    }
  }
}

// Without --out the warm-up writes the user cache, which SMLA_CACHE_READONLY=1 and SMLA_CACHE_DISABLE=1 say is not to
// be written: refused, and nothing made there (it was written anyway). A dry run writes nothing and goes on; an --out
// is written whatever they say.
TEST(WarmupTool, AReadOnlyUserCacheIsNotWarmedWithoutOut) {
  TempDir scratch;
  const std::string user = scratch.path + "/user-cache";
  for (const char* var : {"SMLA_CACHE_READONLY=1", "SMLA_CACHE_DISABLE=1"}) {
    const std::string env = std::string(var) + " SMLA_CACHE_DIR=" + user;
    ToolRun r = warmup_tool("--arch sm_90a --shape 64,16,80,32", scratch, env);
    EXPECT_EQ(r.code, 2) << var << ": " << r.out << r.err;
    EXPECT_NE(r.err.find(std::string(var) + " says the user cache (" + user + ") is not to be written"),
              std::string::npos)
        << r.err;
    EXPECT_FALSE(fs::exists(user)) << var << ": the user cache was made";
    r = warmup_tool("--arch sm_90a --shape 64,16,80,32 --dry-run", scratch, env);
    EXPECT_EQ(r.code, 0) << var << ": " << r.err;
  }
}

// The cache's warnings go to stderr through smla's logger (SMLA_LOG_LEVEL) in the tool too: they went through
// spdlog's default logger, to stdout, ahead of --json's document.
TEST(WarmupTool, CacheWarningsStayOffStdout) {
  TempDir scratch;
  const std::string env =
      "SMLA_CACHE_DIR=" + scratch.path + "/user SMLA_CACHE_MAX_BYTES=12Q SMLA_INTERM_BUDGET_BYTES=4GB";
  ToolRun r = warmup_tool("--arch sm_90a --shape 64,16,80,32 --dry-run --json", scratch, env);
  ASSERT_EQ(r.code, 0) << r.err;
  json_of(r);  // stdout is the document alone
  EXPECT_NE(r.err.find("ignoring SMLA_CACHE_MAX_BYTES='12Q'"), std::string::npos) << r.err;
  // The runtime's settings the warm-up plans with, as a Runtime says them (they were ignored without a word here).
  EXPECT_NE(r.err.find("ignoring SMLA_INTERM_BUDGET_BYTES='4GB'"), std::string::npos) << r.err;
  r = warmup_tool("--arch sm_90a --shape 64,16,80,32 --dry-run --json", scratch, env + " SMLA_LOG_LEVEL=off");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err.find("ignoring"), std::string::npos) << "SMLA_LOG_LEVEL=off: " << r.err;
}

// The runtime's knobs: each value a Runtime does not take is named in a warning. 0, -1 and +5 were taken as budgets
// (0 gave one-token chunks, -1 read as 2^64 - 1), and a side stream or log level mistyped went unsaid.
TEST(WarmupTool, EveryRuntimeKnobValueItDoesNotTakeIsNamed) {
  TempDir scratch;
  const std::string base = "SMLA_CACHE_DIR=" + scratch.path + "/user ";
  const std::string args = "--arch sm_90a --shape 64,16,80,32 --dry-run";
  for (const std::string v : {"0", "-1", "+5", "' 5'", "5x", "99999999999999999999999"}) {
    const ToolRun r = warmup_tool(args, scratch, base + "SMLA_INTERM_BUDGET_BYTES=" + v);
    ASSERT_EQ(r.code, 0) << r.err;
    const std::string shown = v[0] == '\'' ? v.substr(1, v.size() - 2) : v;
    EXPECT_NE(r.err.find("ignoring SMLA_INTERM_BUDGET_BYTES='" + shown + "'"), std::string::npos) << v << ": " << r.err;
  }
  ToolRun r = warmup_tool(args, scratch, base + "SMLA_SIDE_STREAM=00 SMLA_LOG_LEVEL=warnn");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("ignoring SMLA_SIDE_STREAM='00'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("ignoring SMLA_LOG_LEVEL='warnn'"), std::string::npos) << r.err;
  // Values it takes say nothing.
  r = warmup_tool(args, scratch, base + "SMLA_INTERM_BUDGET_BYTES=5000000000 SMLA_SIDE_STREAM=0 SMLA_LOG_LEVEL=warn");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err.find("ignoring"), std::string::npos) << r.err;
}

// Which tuning database a warm-up read, whether it exists and how many tuned configs it warmed: a warm-up run as
// another user (root on a login node) read that user's database, or none, and said nothing, so every job whose plan()
// applied its own tuned configs compiled them at its start.
TEST(WarmupTool, SaysWhichTuningDatabaseItRead) {
  TempDir scratch;
  // The default database (warmup_tool sets SMLA_TUNING_DB to a file that does not exist); a named --tuning-db that
  // does not exist is refused outright.
  const std::string absent = scratch.path + "/no-tuning.json";
  ToolRun r = warmup_tool("--arch sm_90a --shape 4096,128,5120,512 --dry-run --json", scratch);
  ASSERT_EQ(r.code, 0) << r.err;
  nlohmann::json j = json_of(r);
  EXPECT_EQ(j.value("tuning_db", std::string()), absent) << r.out;
  EXPECT_FALSE(j.value("tuning_db_exists", true));
  EXPECT_EQ(j.value("tuned_configs", -1), 0);
  r = warmup_tool("--arch sm_90a --shape 4096,128,5120,512 --dry-run", scratch);
  EXPECT_NE(r.out.find("tuning database " + absent + " (does not exist): 0 tuned config(s) warmed"), std::string::npos)
      << r.out;
  const std::string db = scratch.path + "/tuning.json";
  TuningEntry e;
  e.config.dkv_impl = 1;
  TuningDb(db).store("sm_90a/NVIDIA H200/132sm", seed_problem(), e);
  r = warmup_tool("--arch sm_90a --shape 4096,128,5120,512 --dry-run --json --tuning-db " + db, scratch);
  ASSERT_EQ(r.code, 0) << r.err;
  j = json_of(r);
  EXPECT_EQ(j.value("tuning_db", std::string()), db);
  EXPECT_TRUE(j.value("tuning_db_exists", false));
  EXPECT_EQ(j.value("tuned_configs", -1), 1);
  r = warmup_tool("--arch sm_90a --shape 4096,128,5120,512 --dry-run --tuning-db " + db, scratch);
  EXPECT_NE(r.out.find("tuning database " + db + ": 1 tuned config(s) warmed"), std::string::npos) << r.out;
}

// SMLA_CACHE_DISABLE=1 in the warm-up's environment: it still fills (or lists) its directory, and says that a plan()
// with that setting reads no cache (a dry run's "cached" would otherwise promise what such a job does not get).
TEST(WarmupTool, SaysThatACacheDisabledPlanCompilesAnyway) {
  TempDir scratch;
  ToolRun r = warmup_tool("--arch sm_90a --shape 64,16,128,16 --sink off --dry-run --out " + scratch.path + "/aot",
                          scratch, "SMLA_CACHE_DISABLE=1");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("SMLA_CACHE_DISABLE is set: this warm-up still lists what is in " + scratch.path + "/aot"),
            std::string::npos) << r.err;
  r = warmup_tool("--arch sm_90a --shape 64,16,128,16 --sink off --dry-run --out " + scratch.path + "/aot", scratch);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err.find("SMLA_CACHE_DISABLE"), std::string::npos) << r.err;
}

// A user without a home (no HOME, XDG_CACHE_HOME or passwd entry) warms /tmp/smla-cache-<uid> by default: that
// predictable name keeps its privacy check (another user's directory there is neither read nor written), as the
// runtime's cache does; only a directory the caller names with --out is taken as given.
TEST(WarmupTool, TheTmpFallbackKeepsItsPrivacyCheck) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to act as a user without a home";
  const uid_t uid = 54371;
  const std::string fallback = "/tmp/smla-cache-" + std::to_string(uid);
  std::error_code ec;
  fs::remove_all(fallback, ec);
  ASSERT_TRUE(fs::create_directory(fallback));
  ASSERT_EQ(::chmod(fallback.c_str(), 0777), 0);  // root's, open to all: planted
  const std::string exe = (fs::read_symlink("/proc/self/exe").parent_path() / "smla-warmup").string();
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::setresgid(uid, uid, uid) != 0 || ::setresuid(uid, uid, uid) != 0) ::_exit(99);
    for (const char* v : {"HOME", "XDG_CACHE_HOME", "SMLA_CACHE_DIR", "SMLA_TUNING_DB"}) ::unsetenv(v);
    const std::string cmd = exe + " --arch sm_90a --shape 64,16,80,32 --no-tuned >/dev/null 2>&1";
    const int st = std::system(cmd.c_str());
    ::_exit(WIFEXITED(st) ? WEXITSTATUS(st) : 98);
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  const int code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  const bool wrote = fs::exists(fallback + "/entries");
  fs::remove_all(fallback, ec);
  ASSERT_NE(code, 99) << "could not become uid " << uid;
  EXPECT_NE(code, 0) << "warmed another user's directory in /tmp";
  EXPECT_FALSE(wrote) << "wrote into another user's directory in /tmp";
}

TEST(WarmupTool, NoGpuAndNoArchNamesTheOption) {
  TempDir scratch;
  std::string why;
  if (!present_targets(&why).empty()) GTEST_SKIP() << "a GPU is present: the default --arch comes from it";
  const ToolRun r = warmup_tool("--shape 4096,128,5120,512 --out " + scratch.path, scratch);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--arch"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace smla
