// test_nvrtc_offline.cpp: NVRTC compiles, offline (no driver, no GPU), every CUDA kernel variant
// the planner can choose for the supported shapes, for sm_90a (and the generic sm_80 path).
// Needs NVRTC and the CUDA headers, which CI has: a missing NVRTC fails, it does not skip.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>

#include "runtime/cuda/kernels_cuda.hpp"
#include "runtime/cuda/nvrtc_compiler.hpp"
#include "runtime/env.hpp"
#include "runtime/planner.hpp"
#include "tests/planner_shapes.hpp"
#include "runtime/sources.hpp"
#include "runtime/tuning_db.hpp"
#include "smla/smla.hpp"

namespace smla {
namespace {

using test::planner_shapes;

bool has_symbol(const std::vector<uint8_t>& bin, const std::string& name) {
  const std::string hay(bin.begin(), bin.end());
  return hay.find(name + '\0') != std::string::npos;
}

void compile_all(const std::string& target, const std::vector<KernelSpec>& specs) {
  cuda::NvrtcCompiler nvrtc;
  std::string why;
  ASSERT_TRUE(nvrtc.available(&why)) << "NVRTC must be present for the offline compile test: " << why;
  KernelSources sources;
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::vector<std::string> failures;
  auto worker = [&] {
    for (size_t i = next++; i < specs.size(); i = next++) {
      try {
        const CompileResult r = nvrtc.compile(sources.render(specs[i], "cuda"), target);
        const bool elf = r.binary.size() > 4 && std::memcmp(r.binary.data(), "\x7f" "ELF", 4) == 0;
        if (!elf || !has_symbol(r.binary, specs[i].entry)) {
          std::lock_guard<std::mutex> l(mu);
          failures.push_back(specs[i].entry + ": not an ELF cubin with its entry symbol");
        }
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> l(mu);
        failures.push_back(specs[i].entry + ": " + e.what());
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned i = 0; i < std::max(2u, std::thread::hardware_concurrency()); ++i) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
  for (const auto& f : failures) ADD_FAILURE() << f;
  std::printf("compiled %zu kernel variants for %s\n", specs.size(), target.c_str());
}

bool has_define(const KernelSpec& k, const char* name, long long value) {
  for (const auto& d : k.defines)
    if (d.first == name) return d.second == value;
  return false;
}

TEST(NvrtcOffline, EveryPlannerVariantCompilesForSm90a) {
  // Both dq bodies: what the planner picks on sm_90a (wgmma where H % 64 == 0) and the mma.sync one
  // (the only one elsewhere, and what a tuned config may ask for on sm_90a).
  std::vector<ShapeInfo> shapes;
  for (ShapeInfo s : planner_shapes())
    for (bool sm90a : {true, false}) {
      s.sm90a = sm90a;
      if (cuda_shape_supported(s, nullptr)) shapes.push_back(s);
    }
  ASSERT_FALSE(shapes.empty());
  const auto specs = cuda_all_kernels(shapes);
  std::set<std::string> entries;
  int wgmma_dq = 0, mma_dq = 0;
  for (const auto& k : specs) {
    entries.insert(k.entry);
    if (k.entry == "smla_dq") ++(has_define(k, "DQ_WGMMA", 1) ? wgmma_dq : mma_dq);
  }
  // Every phase is represented, and both dq bodies.
  for (const char* e : {"smla_delta", "smla_dq", "smla_dkv_interm", "smla_gather", "smla_d_sink"})
    EXPECT_TRUE(entries.count(e)) << e << " is never planned";
  EXPECT_GT(wgmma_dq, 0);
  EXPECT_GT(mma_dq, 0);
  compile_all("sm_90a", specs);
}

TEST(NvrtcOffline, DqBodyFollowsTheTargetAndTheShape) {
  Problem p;
  p.T = 4096, p.H = 128, p.num_kv = 5120, p.topk = 512, p.has_sink = true;
  auto dq_of = [](const ShapeInfo& s) {
    for (const KernelSpec& k : cuda_phase_kernels(Phase::Dq, s)) return k;
    throw std::runtime_error("no dq launch");
  };
  ShapeInfo s = shape_with_config(p, nullptr, runtime_env().interm_budget, "sm_90a");
  KernelSpec k = dq_of(s);
  EXPECT_TRUE(has_define(k, "DQ_WGMMA", 1));
  EXPECT_EQ(k.block.x, 256u);
  EXPECT_EQ(k.grid.y, 2u);  // 64 heads a block
  s = shape_with_config(p, nullptr, runtime_env().interm_budget, "sm_80");
  EXPECT_FALSE(has_define(dq_of(s), "DQ_WGMMA", 1));
  // H = 32 on sm_90a: wgmma's M is 64, so the mma.sync body.
  p.H = 32;
  s = shape_with_config(p, nullptr, runtime_env().interm_budget, "sm_90a");
  EXPECT_FALSE(has_define(dq_of(s), "DQ_WGMMA", 1));
  // Asking for wgmma where it cannot run is a clear error, not a silent fallback.
  TileConfig c;
  c.dq_impl = 2;
  std::string why;
  EXPECT_FALSE(cuda_shape_supported(shape_with_config(p, &c, runtime_env().interm_budget, "sm_90a"), &why));
  EXPECT_NE(why.find("multiple of 64"), std::string::npos) << why;
  p.H = 128;
  EXPECT_FALSE(cuda_shape_supported(shape_with_config(p, &c, runtime_env().interm_budget, "sm_80"), &why));
  EXPECT_NE(why.find("sm_90a"), std::string::npos) << why;
  c.dq_block_r = 64;
  EXPECT_FALSE(cuda_shape_supported(shape_with_config(p, &c, runtime_env().interm_budget, "sm_90a"), &why));
  EXPECT_NE(why.find("one tile"), std::string::npos) << why;
}

TEST(NvrtcOffline, SeedShapeCompilesForTheGenericSm80Path) {
  Problem p;
  p.T = 4096, p.H = 128, p.num_kv = 5120, p.topk = 512, p.has_sink = true;
  compile_all("sm_80", cuda_all_kernels({choose_shape(p, runtime_env().interm_budget)}));
}

TEST(NvrtcOffline, EverySourceCompilesAloneWithItsDefaultConstants) {
  // No #define injected at all: every constant must have its #ifndef default.
  std::vector<KernelSpec> specs;
  for (const char* stem : {"check_topk", "delta", "dq", "dkv_interm", "csr", "gather", "d_sink"}) {
    KernelSpec k;
    k.stem = stem;
    k.entry = std::string("smla_") + stem;  // only for messages: the whole unit is compiled
    specs.push_back(k);
  }
  cuda::NvrtcCompiler nvrtc;
  KernelSources sources;
  for (const auto& k : specs) {
    try {
      const CompileResult r = nvrtc.compile(sources.render(k, "cuda"), "sm_90a");
      EXPECT_GT(r.binary.size(), 4u) << k.stem;
    } catch (const std::exception& e) {
      ADD_FAILURE() << k.stem << ".cu does not compile alone: " << e.what();
    }
  }
}

TEST(NvrtcOffline, CompileErrorsCarryTheLogAndTheDumpedSource) {
  cuda::NvrtcCompiler nvrtc;
  ASSERT_TRUE(nvrtc.available(nullptr));
  RenderedSource bad{"broken.cu", "extern \"C\" __global__ void k() { this_is_not_declared = 1; }", {}};
  try {
    nvrtc.compile(bad, "sm_90a");
    FAIL() << "a broken source compiled";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::CompileError);
    const std::string what = e.what();
    EXPECT_NE(what.find("this_is_not_declared"), std::string::npos) << what;  // the log
    EXPECT_NE(what.find("dumped to"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace smla
