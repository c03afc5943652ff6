// test_nvrtc_offline.cpp: NVRTC compiles, offline (no driver, no GPU), every CUDA kernel variant
// the planner can choose for the supported shapes, for sm_90a (and the generic sm_80 path).
// Needs NVRTC and the CUDA headers, which CI has: a missing NVRTC fails, it does not skip.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>

#include "runtime/cuda/kernels_cuda.hpp"
#include "runtime/cuda/nvrtc_compiler.hpp"
#include "runtime/env.hpp"
#include "runtime/planner.hpp"
#include "tests/planner_shapes.hpp"
#include "runtime/sources.hpp"

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

TEST(NvrtcOffline, EveryPlannerVariantCompilesForSm90a) {
  std::vector<ShapeInfo> shapes;
  for (const ShapeInfo& s : planner_shapes())
    if (cuda_shape_supported(s, nullptr)) shapes.push_back(s);
  ASSERT_FALSE(shapes.empty());
  const auto specs = cuda_all_kernels(shapes);
  std::set<std::string> entries;
  for (const auto& k : specs) entries.insert(k.entry);
  // Every phase is represented.
  for (const char* e : {"smla_delta", "smla_dq", "smla_dkv_interm", "smla_gather", "smla_d_sink"})
    EXPECT_TRUE(entries.count(e)) << e << " is never planned";
  compile_all("sm_90a", specs);
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
