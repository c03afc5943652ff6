// test_nvrtc_offline.cpp: NVRTC compiles, offline (no driver, no GPU), every CUDA kernel variant
// the planner can choose for the supported shapes, for sm_90a (and the generic sm_80 path).
// Needs NVRTC and the CUDA headers, which CI has: a missing NVRTC fails, it does not skip.
#include <gtest/gtest.h>

#include <chrono>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <regex>
#include <set>
#include <stdexcept>
#include <thread>

#include "kernel_src/common.cuh"
#include "runtime/cuda/kernels_cuda.hpp"
#include "runtime/cuda/nvrtc_compiler.hpp"
#include "runtime/dump.hpp"
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

bool has_define(const KernelSpec& k, const char* name, long long value) {
  for (const auto& d : k.defines)
    if (d.first == name) return d.second == value;
  return false;
}

// Compiles every spec for `target` (failures are added to the test); returns how many wgmma bodies had their
// ptxas report checked.
int compile_all(const std::string& target, const std::vector<KernelSpec>& specs) {
  cuda::NvrtcCompiler nvrtc;
  std::string why;
  if (!nvrtc.available(&why)) {
    ADD_FAILURE() << "NVRTC must be present for the offline compile test: " << why;
    return 0;
  }
  nvrtc.extra_options = {"--ptxas-options=-v"};  // ptxas's report in the log (never cached here)
  std::atomic<int> wgmma_checked{0};
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
        if (!has_define(specs[i], "DQ_WGMMA", 1) && !has_define(specs[i], "DKV_WGMMA", 1)) continue;
        // The wgmma bodies, from ptxas's report: no local memory, no "wgmma serialized" (C7514/C7515/C7518:
        // every wgmma of the kernel then waits for the one before; nvcc reported it for a dkv_interm
        // pipeline and for dq variants, so NVRTC's report, which is what runs, is the one checked).
        std::string bad;
        if (r.log.find("Used ") == std::string::npos) bad = "no ptxas report in the log";
        else if (std::regex_search(r.log, std::regex("[1-9][0-9]* bytes (stack frame|spill)"))) bad = "uses local memory";
        else if (r.log.find("C7514") != std::string::npos || r.log.find("C7515") != std::string::npos ||
                 r.log.find("C7518") != std::string::npos)
          bad = "wgmma serialized";
        else if (specs[i].launch_regs > 0) {
          // The setmaxnreg bodies: ptxas must have given them the registers their split is sized for (the backend
          // refuses any other count at load, since the block would hang).
          std::smatch m;
          if (!std::regex_search(r.log, m, std::regex("Used ([0-9]+) registers")))
            bad = "no register count in ptxas's report";
          else if (std::stoi(m[1]) != specs[i].launch_regs)
            bad = "ptxas gave " + m[1].str() + " registers, the setmaxnreg split needs " +
                  std::to_string(specs[i].launch_regs);
        }
        ++wgmma_checked;
        if (!bad.empty()) {
          std::string name = specs[i].stem;
          for (const auto& d : specs[i].defines) name += " " + d.first + "=" + std::to_string(d.second);
          std::lock_guard<std::mutex> l(mu);
          failures.push_back(name + ": " + bad + "\n" + r.log);
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
  return wgmma_checked.load();
}

// The (first) launch of `phase` planned for `s`.
KernelSpec launch_of(Phase phase, const ShapeInfo& s) {
  for (const KernelSpec& k : cuda_phase_kernels(phase, s)) return k;
  throw std::runtime_error("no launch of the phase");
}

long long define_of(const KernelSpec& k, const char* name) {
  for (const auto& d : k.defines)
    if (d.first == name) return d.second;
  return -1;
}

TEST(NvrtcOffline, EveryPlannerVariantCompilesForSm90a) {
  // Both dq bodies: what the planner picks on sm_90a (wgmma where H % 64 == 0) and the mma.sync one
  // (the only one elsewhere, and what a tuned config may ask for on sm_90a). Likewise both dkv_interm
  // bodies (wgmma where H % 32 == 0 on sm_90a, mma.sync 64 x 256 otherwise), for every planner shape.
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
  std::set<long long> wgmma_dkv_heads, mma_dkv_heads, fused_dq_heads;
  for (const auto& k : specs) {
    entries.insert(k.entry);
    if (k.entry == "smla_dq") ++(has_define(k, "DQ_WGMMA", 1) ? wgmma_dq : mma_dq);
    if (has_define(k, "DQW_INTERM", 1)) fused_dq_heads.insert(define_of(k, "HEADS"));
    if (k.entry == "smla_dkv_interm")
      (has_define(k, "DKV_WGMMA", 1) ? wgmma_dkv_heads : mma_dkv_heads).insert(define_of(k, "HEADS"));
  }
  // Every phase is represented, and both dq bodies.
  for (const char* e : {"smla_delta", "smla_dq", "smla_dkv_interm", "smla_gather", "smla_d_sink"})
    EXPECT_TRUE(entries.count(e)) << e << " is never planned";
  EXPECT_GT(wgmma_dq, 0);
  EXPECT_GT(mma_dq, 0);
  // Every H of the planner shapes with the mma.sync dkv body, every H % 32 == 0 with the wgmma one but 64, where dq
  // writes interm on sm_90a (dkv_impl 4: no dkv_interm kernel).
  EXPECT_EQ(mma_dkv_heads, (std::set<long long>{16, 32, 64, 128}));
  EXPECT_EQ(wgmma_dkv_heads, (std::set<long long>{32, 128}));
  EXPECT_EQ(fused_dq_heads, (std::set<long long>{64}));
  EXPECT_GE(compile_all("sm_90a", specs), 4);  // dq and dkv_interm wgmma bodies, at several H
}

TEST(NvrtcOffline, CsrCompilesAtEveryDigitWidthThePlannerPicks) {
  // CUB's onesweep (csr.cu) instantiates per digit width, and below 5 bits it does not compile: every width the
  // planner can pick (keys of 3 bits at num_kv 5 up to 3 passes at 2^20) is compiled for sm_90a here.
  std::vector<ShapeInfo> shapes;
  std::set<int> widths;
  for (int64_t num_kv : {1, 5, 40, 100, 200, 5120, 70000, 1 << 20}) {
    Problem p;
    p.T = 257, p.H = 64, p.num_kv = num_kv, p.topk = 512, p.has_sink = true;
    ShapeInfo s = choose_shape(p, runtime_env().interm_budget);
    s.sm90a = true;
    std::string why;
    EXPECT_TRUE(cuda_shape_supported(s, &why)) << "num_kv " << num_kv << ": " << why;
    widths.insert(s.radix_bits);
    shapes.push_back(s);
  }
  EXPECT_EQ(widths, (std::set<int>{5, 6, 7, 8}));
  std::vector<KernelSpec> csr;  // one launch a width: the whole unit is compiled (onesweep's entry is checked)
  for (const KernelSpec& k : cuda_all_kernels(shapes))
    if (k.entry == "smla_csr_onesweep") csr.push_back(k);
  std::set<long long> compiled_widths;
  for (const KernelSpec& k : csr) compiled_widths.insert(define_of(k, "CSR_RADIX_BITS"));
  EXPECT_EQ(compiled_widths, (std::set<long long>{5, 6, 7, 8}));
  compile_all("sm_90a", csr);
}

TEST(NvrtcOffline, DqBodyFollowsTheTargetAndTheShape) {
  Problem p;
  p.T = 4096, p.H = 128, p.num_kv = 5120, p.topk = 512, p.has_sink = true;
  auto dq_of = [](const ShapeInfo& s) { return launch_of(Phase::Dq, s); };
  ShapeInfo s = shape_with_config(p, nullptr, runtime_env().interm_budget, "sm_90a");
  KernelSpec k = dq_of(s);
  EXPECT_TRUE(has_define(k, "DQ_WGMMA", 1));
  EXPECT_TRUE(has_define(k, "DQW_PRODUCER", 1));  // the default on sm_90a: dq_impl 3
  EXPECT_EQ(k.block.x, 384u);
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
  // A dq tile past 256 rows is refused by its bound: the 32-bit shared-memory size wrapped at 1966560 rows (a tuning
  // database entry said so) and the kernel was planned with 33 KB.
  TileConfig big;
  big.dq_impl = 1;
  for (int rows : {288, 1966560}) {
    big.dq_block_r = rows;
    EXPECT_FALSE(cuda_shape_supported(shape_with_config(p, &big, runtime_env().interm_budget, "sm_90a"), &why)) << rows;
    EXPECT_NE(why.find("must be a multiple of 32 in [32, 256]"), std::string::npos) << why;
  }
  // The persistent body (dq_impl 4) where the top-k is one chunk of 256 slots or fewer, the producer body (3) from
  // 272 up or where the caller's r_chunk makes several chunks; a caller's dq_impl is kept either way.
  for (int64_t H : {64, 128})
    for (int64_t topk = 16; topk <= 272; topk += 16) {
      p.H = H, p.topk = topk, p.num_kv = 1024, p.r_chunk = 0;
      const auto persistent = [&](const TileConfig* cfg) {
        const KernelSpec d = dq_of(shape_with_config(p, cfg, runtime_env().interm_budget, "sm_90a"));
        EXPECT_TRUE(has_define(d, "DQW_PRODUCER", 1)) << "H " << H << " top-k " << topk;
        return has_define(d, "DQW_PERSIST", 1);
      };
      // (H 64: the planner's fused dkv, which runs in dq_impl 3's body)
      EXPECT_EQ(persistent(nullptr), topk <= 256 && H != 64) << "H " << H << " top-k " << topk;
      if (topk % 32 == 0) {
        p.r_chunk = topk / 2;  // two chunks: the fp32 carry
        EXPECT_FALSE(persistent(nullptr)) << "H " << H << " top-k " << topk << " in two chunks";
        p.r_chunk = 0;
      }
      TileConfig three;
      three.dq_impl = 3;
      EXPECT_FALSE(persistent(&three)) << "H " << H << " top-k " << topk;
      TileConfig four;
      four.dq_impl = 4;
      EXPECT_TRUE(persistent(&four)) << "H " << H << " top-k " << topk;
    }
}

// The wgmma dq bodies: dq_impl 3 (a producer warpgroup; the planner's choice on sm_90a, so also compiled by the sweep
// above), dq_impl 2 (two warpgroups; asked for only) and dq_impl 4 (3 made persistent; the planner's where the top-k
// is one chunk of 256 slots or fewer). Three or two warpgroups, the producer and persistent defines, the grid (one
// dimension of blocks of work for dq_impl 4), the same tile and shared memory; all compile for sm_90a with no local
// memory and no serialized wgmma (setmaxnreg lets the producer bodies' consumers exceed the 168 registers of a
// 384-thread launch); asking for one where it cannot run is a clear error.
TEST(NvrtcOffline, BothWgmmaDqBodiesArePlannableAndCompile) {
  Problem p;
  p.T = 4096, p.H = 128, p.num_kv = 5120, p.topk = 512, p.has_sink = true;
  const size_t budget = runtime_env().interm_budget;
  auto dq_of = [](const ShapeInfo& s) { return launch_of(Phase::Dq, s); };
  EXPECT_TRUE(has_define(dq_of(shape_with_config(p, nullptr, budget, "sm_90a")), "DQW_PRODUCER", 1));
  TileConfig c;
  std::vector<KernelSpec> specs;
  c.dkv_impl = 3;  // (at H 64 the planner would fuse dkv into dq_impl 3: FusedDkvIsPlannedIntoDqAndCompiles)
  for (int impl : {2, 3, 4})
    for (int64_t H : {64, 128}) {
      c.dq_impl = impl;
      p.H = H;
      const ShapeInfo s = shape_with_config(p, &c, budget, "sm_90a");
      const KernelSpec k = dq_of(s);
      const bool producer = impl >= 3;
      EXPECT_TRUE(has_define(k, "DQ_WGMMA", 1));
      EXPECT_EQ(has_define(k, "DQW_PRODUCER", 1), producer);
      EXPECT_EQ(has_define(k, "DQW_PERSIST", 1), impl == 4);
      EXPECT_EQ(define_of(k, "NUM_WARPS"), producer ? 12 : 8);
      EXPECT_EQ(k.block.x, producer ? 384u : 256u);
      // dq_impl 4 counts its T * H / 64 blocks of work in one dimension; the backend launches at most one an SM.
      EXPECT_EQ(k.persistent, impl == 4);
      EXPECT_EQ(k.grid.x, impl == 4 ? unsigned(4096 * H / 64) : 4096u);
      EXPECT_EQ(k.grid.y, impl == 4 ? 1u : unsigned(H / 64));
      EXPECT_EQ(k.smem_bytes, smla_dq_wgmma_smem_bytes(32));
      EXPECT_EQ(k.launch_regs, producer ? 168 : 0);  // 65536 / 384, down to a multiple of 8: setmaxnreg's pool
      EXPECT_TRUE(cuda_phase_kernels(Phase::Delta, s).empty()) << "the wgmma bodies fuse delta";
      specs.push_back(k);
    }
  EXPECT_EQ(compile_all("sm_90a", specs), 6);  // every one had its ptxas report checked
  c.dq_impl = 3;
  std::string why;
  p.H = 128;
  EXPECT_FALSE(cuda_shape_supported(shape_with_config(p, &c, budget, "sm_80"), &why));
  EXPECT_NE(why.find("dq_impl = 3 (wgmma) needs an sm_90a target"), std::string::npos) << why;
  p.H = 32;
  EXPECT_FALSE(cuda_shape_supported(shape_with_config(p, &c, budget, "sm_90a"), &why));
  EXPECT_NE(why.find("multiple of 64"), std::string::npos) << why;
  c.dq_impl = 4;
  p.H = 128;
  EXPECT_FALSE(cuda_shape_supported(shape_with_config(p, &c, budget, "sm_80"), &why));
  EXPECT_NE(why.find("dq_impl = 4 (wgmma) needs an sm_90a target"), std::string::npos) << why;
  c.dq_impl = 5;
  EXPECT_FALSE(cuda_shape_supported(shape_with_config(p, &c, budget, "sm_90a"), &why));
  EXPECT_NE(why.find("dq_impl = 5 must be"), std::string::npos) << why;
}

// The two wgmma dkv_interm bodies: dkv_impl 2 (two warpgroups sharing each 64-row tile, the planner's choice) and
// dkv_impl 3 (a producer warpgroup; each consumer warpgroup one 64 x 256 tile with m64n256k16). Three or two
// warpgroups, the producer define, 64 bytes more shared memory for dkv_impl 3's mbarriers; both compile for sm_90a
// at H 32, 64 and 128 with no local memory and no serialized wgmma.
TEST(NvrtcOffline, BothWgmmaDkvBodiesArePlannableAndCompile) {
  Problem p;
  p.T = 4096, p.H = 128, p.num_kv = 5120, p.topk = 512, p.has_sink = true;
  const size_t budget = runtime_env().interm_budget;
  TileConfig c;
  std::vector<KernelSpec> specs;
  for (int impl : {2, 3})
    for (int64_t H : {32, 64, 128}) {
      c.dkv_impl = impl;
      p.H = H;
      const KernelSpec k = launch_of(Phase::DkvInterm, shape_with_config(p, &c, budget, "sm_90a"));
      EXPECT_TRUE(has_define(k, "DKV_WGMMA", 1));
      EXPECT_EQ(has_define(k, "DKW_PRODUCER", 1), impl == 3);
      EXPECT_EQ(define_of(k, "NUM_WARPS"), impl == 3 ? 12 : 8);
      EXPECT_EQ(k.block.x, impl == 3 ? 384u : 256u);
      EXPECT_EQ(k.grid.x, 4096u * (512u / SMLA_DKV_WGMMA_COLS));
      EXPECT_EQ(k.smem_bytes, smla_dkv_wgmma_smem_bytes(int(H)) + (impl == 3 ? 64u : 0u));
      EXPECT_LE(k.smem_bytes, 227u * 1024u);
      EXPECT_EQ(k.launch_regs, impl == 3 ? 168 : 0);
      specs.push_back(k);
    }
  EXPECT_EQ(compile_all("sm_90a", specs), 6);  // every one had its ptxas report checked
}

// dkv_impl 4 (fused into dq, H 64): the dq body gets DQW_INTERM and the interm staging's shared memory, runs as
// dq_impl 3 (the planner's dq_impl 4 at a short top-k gives way; dq_impl 4 asked for is refused), no dkv_interm kernel
// is planned, and the body compiles for sm_90a with no local memory and no serialized wgmma; where it cannot run
// (H 128, another target, dq_impl 2) it is a clear error.
TEST(NvrtcOffline, FusedDkvIsPlannedIntoDqAndCompiles) {
  Problem p;
  p.T = 4096, p.H = 64, p.num_kv = 5120, p.topk = 640, p.has_sink = true;
  const size_t budget = runtime_env().interm_budget;
  TileConfig c;
  c.dkv_impl = 4;
  std::vector<KernelSpec> specs;
  for (int64_t topk : {640, 160}) {  // dq_impl 3 by the planner; dq_impl 4 by the planner without the fusion
    p.topk = topk;
    const ShapeInfo s = shape_with_config(p, &c, budget, "sm_90a");
    std::string why;
    ASSERT_TRUE(cuda_shape_supported(s, &why)) << why;
    const KernelSpec k = launch_of(Phase::Dq, s);
    EXPECT_TRUE(has_define(k, "DQW_INTERM", 1)) << "top-k " << topk;
    EXPECT_TRUE(has_define(k, "DQW_PRODUCER", 1)) << "top-k " << topk;
    EXPECT_FALSE(has_define(k, "DQW_PERSIST", 1)) << "top-k " << topk;
    EXPECT_EQ(k.smem_bytes, smla_dq_wgmma_smem_bytes(32, true));
    EXPECT_EQ(k.smem_bytes, smla_dq_wgmma_smem_bytes(32) + smla_dq_interm_extra_bytes(32));
    EXPECT_LE(k.smem_bytes, 227u * 1024u);
    EXPECT_TRUE(cuda_phase_kernels(Phase::DkvInterm, s).empty()) << "dq writes interm";
    EXPECT_FALSE(cuda_phase_kernels(Phase::Gather, s).empty());
    // The planner's choice at H 64 on sm_90a; with the dkv_interm body asked for, dq is its own again (persistent up to
    // 256 slots), and so it is where the caller asks for dq_impl 4 or a dkv tile.
    EXPECT_EQ(launch_of(Phase::Dq, shape_with_config(p, nullptr, budget, "sm_90a")).defines, k.defines);
    EXPECT_EQ(cuda_dkv_impl(shape_with_config(p, nullptr, budget, "sm_90a")), 4);
    TileConfig three;
    three.dkv_impl = 3;
    const KernelSpec unfused = launch_of(Phase::Dq, shape_with_config(p, &three, budget, "sm_90a"));
    EXPECT_FALSE(has_define(unfused, "DQW_INTERM", 1));
    EXPECT_EQ(has_define(unfused, "DQW_PERSIST", 1), topk <= 256);
    TileConfig dq4, tile;
    dq4.dq_impl = 4;
    tile.dkv_block_d = 256;
    for (const TileConfig* other : {&dq4, &tile}) {
      const ShapeInfo o = shape_with_config(p, other, budget, "sm_90a");
      EXPECT_NE(cuda_dkv_impl(o), 4);
      EXPECT_FALSE(has_define(launch_of(Phase::Dq, o), "DQW_INTERM", 1));
      EXPECT_EQ(cuda_phase_kernels(Phase::DkvInterm, o).size(), 1u);
    }
    if (specs.empty()) specs.push_back(k);
    EXPECT_EQ(k.defines, specs[0].defines) << "no top-k is compiled in";
  }
  EXPECT_EQ(compile_all("sm_90a", specs), 1);  // its ptxas report checked
  std::string why;
  const auto refused = [&](const TileConfig& cfg, const char* target, const std::string& want) {
    EXPECT_FALSE(cuda_shape_supported(shape_with_config(p, &cfg, budget, target), &why)) << want;
    EXPECT_NE(why.find(want), std::string::npos) << why;
  };
  p.H = 128;
  refused(c, "sm_90a", "dkv_impl = 4 (fused into dq) needs H == 64");
  p.H = 64;
  refused(c, "sm_80", "dkv_impl = 4 (fused into dq) needs an sm_90a target");
  for (int dq : {2, 4}) {
    TileConfig d = c;
    d.dq_impl = dq;
    refused(d, "sm_90a", "dkv_impl = 4 (fused into dq) needs dq_impl 3 (dq_impl = " + std::to_string(dq) + ")");
  }
}

TEST(NvrtcOffline, DkvBodyFollowsTheTargetAndTheShape) {
  Problem p;
  p.T = 4096, p.H = 128, p.num_kv = 5120, p.topk = 512, p.has_sink = true;
  const size_t budget = runtime_env().interm_budget;
  auto dkv_of = [](const ShapeInfo& s) { return launch_of(Phase::DkvInterm, s); };
  // sm_90a, H = 128: the wgmma body, its one tile, two warpgroups, its shared-memory formula.
  KernelSpec k = dkv_of(shape_with_config(p, nullptr, budget, "sm_90a"));
  EXPECT_TRUE(has_define(k, "DKV_WGMMA", 1));
  EXPECT_EQ(define_of(k, "HEADS"), 128);
  EXPECT_EQ(define_of(k, "BLOCK_R"), SMLA_DKV_WGMMA_ROWS);
  EXPECT_EQ(define_of(k, "BLOCK_D"), SMLA_DKV_WGMMA_COLS);
  EXPECT_EQ(define_of(k, "NUM_WARPS"), 8);
  EXPECT_EQ(define_of(k, "WARPS_M"), 2);
  EXPECT_EQ(k.block.x, 256u);
  EXPECT_EQ(k.grid.x, 4096u * (512u / SMLA_DKV_WGMMA_COLS));
  EXPECT_EQ(k.smem_bytes, smla_dkv_wgmma_smem_bytes(128));
  EXPECT_LE(k.smem_bytes, 227u * 1024u);
  // The same shape elsewhere, or the mma.sync body asked for on sm_90a: no DKV_WGMMA define at all
  // (the mma.sync kernels keep their cache keys), the same 64 x 256 tile with its own smem where it fits (sm_90), a
  // 64 x 128 one in an A100's 163 KB (sm_80).
  for (auto [target, block_d] : {std::pair<const char*, int>{"sm_80", 128}, {"sm_90", 256}}) {
    k = dkv_of(shape_with_config(p, nullptr, budget, target));
    EXPECT_EQ(define_of(k, "DKV_WGMMA"), -1) << target;
    EXPECT_EQ(define_of(k, "BLOCK_D"), block_d) << target;
    EXPECT_EQ(k.smem_bytes, smla_dkv_smem_bytes(128, 64, block_d)) << target;
  }
  TileConfig mma;
  mma.dkv_impl = 1;
  k = dkv_of(shape_with_config(p, &mma, budget, "sm_90a"));
  EXPECT_EQ(define_of(k, "DKV_WGMMA"), -1);
  EXPECT_EQ(define_of(k, "BLOCK_R"), 64);
  EXPECT_EQ(define_of(k, "BLOCK_D"), 256);
  // The caller's dkv tiles decide the default: 64 x 256 (or one of the two unset) keeps wgmma,
  // another tile means mma.sync.
  TileConfig tiles;
  tiles.dkv_block_r = 64;
  EXPECT_TRUE(has_define(dkv_of(shape_with_config(p, &tiles, budget, "sm_90a")), "DKV_WGMMA", 1));
  tiles.dkv_block_d = 128;
  k = dkv_of(shape_with_config(p, &tiles, budget, "sm_90a"));
  EXPECT_EQ(define_of(k, "DKV_WGMMA"), -1);
  EXPECT_EQ(define_of(k, "BLOCK_D"), 128);
  // H = 64: dq writes interm (dkv_impl 4, no dkv_interm kernel). Where the caller keeps dq from it (dq_impl 4), with
  // chunks of 8 tiles or more the producer body (measured faster there); shorter chunks: dkv_impl 2.
  p.H = 64, p.topk = 640;
  EXPECT_TRUE(cuda_phase_kernels(Phase::DkvInterm, shape_with_config(p, nullptr, budget, "sm_90a")).empty());
  TileConfig dq4;
  dq4.dq_impl = 4;
  k = dkv_of(shape_with_config(p, &dq4, budget, "sm_90a"));
  EXPECT_TRUE(has_define(k, "DKW_PRODUCER", 1));
  EXPECT_EQ(k.block.x, 384u);
  p.topk = 160;
  k = dkv_of(shape_with_config(p, &dq4, budget, "sm_90a"));
  EXPECT_TRUE(has_define(k, "DKV_WGMMA", 1));
  EXPECT_FALSE(has_define(k, "DKW_PRODUCER", 1));
  p.topk = 512;
  // H = 32 on sm_90a: K = 64, wgmma; H = 16: K = 32 is not a multiple of 64, so mma.sync.
  p.H = 32;
  EXPECT_TRUE(has_define(dkv_of(shape_with_config(p, nullptr, budget, "sm_90a")), "DKV_WGMMA", 1));
  p.H = 16;
  EXPECT_EQ(define_of(dkv_of(shape_with_config(p, nullptr, budget, "sm_90a")), "DKV_WGMMA"), -1);
}

// Asking for the wgmma dkv body where it cannot run: Unsupported, naming the reason, never a silent
// fallback to mma.sync.
TEST(NvrtcOffline, DkvWgmmaWhereItCannotRunIsAClearError) {
  Problem p;
  p.T = 4096, p.H = 128, p.num_kv = 5120, p.topk = 512, p.has_sink = true;
  const size_t budget = runtime_env().interm_budget;
  auto expect_unsupported = [&](const Problem& pr, const TileConfig& c, const std::string& target,
                                const std::string& reason) {
    const ShapeInfo s = shape_with_config(pr, &c, budget, target);
    std::string why;
    EXPECT_FALSE(cuda_shape_supported(s, &why)) << target << " H=" << pr.H;
    EXPECT_NE(why.find(reason), std::string::npos) << why;
    try {
      cuda_phase_kernels(Phase::DkvInterm, s);
      ADD_FAILURE() << "planned dkv_impl " << c.dkv_impl << " on " << target << " H=" << pr.H;
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::Unsupported);
      EXPECT_NE(e.message().find(reason), std::string::npos) << e.message();
    }
  };
  TileConfig c;
  c.dkv_impl = 2;
  ASSERT_TRUE(cuda_shape_supported(shape_with_config(p, &c, budget, "sm_90a"), nullptr));  // the legal case
  expect_unsupported(p, c, "sm_80", "dkv_impl = 2 (wgmma) needs an sm_90a target");
  expect_unsupported(p, c, "sm_90", "dkv_impl = 2 (wgmma) needs an sm_90a target");
  Problem h16 = p;
  h16.H = 16;
  expect_unsupported(h16, c, "sm_90a", "dkv_impl = 2 (wgmma) needs H a multiple of 32");
  for (auto [r, d] : std::vector<std::pair<int, int>>{{32, 256}, {64, 128}, {128, 256}}) {
    TileConfig t = c;
    t.dkv_block_r = r, t.dkv_block_d = d;
    expect_unsupported(p, t, "sm_90a", "dkv_impl = 2 (wgmma) has one tile, 64 x 256");
  }
  TileConfig c3;
  c3.dkv_impl = 3;
  ASSERT_TRUE(cuda_shape_supported(shape_with_config(p, &c3, budget, "sm_90a"), nullptr));
  expect_unsupported(p, c3, "sm_80", "dkv_impl = 3 (wgmma) needs an sm_90a target");
  expect_unsupported(h16, c3, "sm_90a", "dkv_impl = 3 (wgmma) needs H a multiple of 32");
  c3.dkv_block_d = 128;
  expect_unsupported(p, c3, "sm_90a", "dkv_impl = 3 (wgmma) has one tile, 64 x 256");
  for (int bad : {5, -1}) {
    TileConfig t;
    t.dkv_impl = bad;
    expect_unsupported(p, t, "sm_90a",
                       "dkv_impl = " + std::to_string(bad) +
                           " must be 0 (default), 1 (mma.sync), 2 (wgmma), 3 (wgmma, producer warpgroup) or 4");
  }
  // The mma.sync tile rules still apply to the mma.sync body.
  TileConfig m;
  m.dkv_impl = 1, m.dkv_block_r = 48;
  expect_unsupported(p, m, "sm_90a", "dkv_block_r = 48 must be a multiple of 32");
}

// dq and dkv_interm take their shared memory from the host, which sizes it with the headers compiled into
// the library; each launch carries that size (SMLA_SMEM_BYTES) and the kernel checks it against the carve of
// the source being compiled. So a kernel source tree given at run time (SMLA_KERNEL_SRC_DIR) whose carve
// differs fails to compile, naming the cause, instead of running with too little shared memory. Here the
// host's number is made 1 KB off (still a legal amount) for every body of both kernels.
TEST(NvrtcOffline, ASourceWhoseCarveDiffersFromTheLaunchDoesNotCompile) {
  Problem p;
  p.T = 4096, p.H = 128, p.num_kv = 5120, p.topk = 512, p.has_sink = true;
  const size_t budget = runtime_env().interm_budget;
  cuda::NvrtcCompiler nvrtc;
  std::string why;
  ASSERT_TRUE(nvrtc.available(&why)) << why;
  KernelSources sources;
  TileConfig mma;
  mma.dq_impl = 1, mma.dkv_impl = 1;
  int checked = 0;
  for (const TileConfig* c : std::vector<const TileConfig*>{nullptr, &mma}) {
    const ShapeInfo s = shape_with_config(p, c, budget, "sm_90a");
    for (Phase ph : {Phase::Dq, Phase::DkvInterm})
      for (KernelSpec k : cuda_phase_kernels(ph, s)) {
        const std::string name = k.entry + (c ? " (mma.sync)" : " (wgmma)");
        ASSERT_GT(k.smem_bytes, 0u) << name;
        ASSERT_EQ(define_of(k, "SMLA_SMEM_BYTES"), static_cast<long long>(k.smem_bytes)) << name;
        for (auto& d : k.defines)
          if (d.first == "SMLA_SMEM_BYTES") d.second += 1024;
        try {
          nvrtc.compile(sources.render(k, "cuda"), "sm_90a");
          ADD_FAILURE() << name << " compiled with a shared-memory size its carve does not have";
        } catch (const Error& e) {
          EXPECT_EQ(e.status(), Status::CompileError) << name;
          EXPECT_NE(e.message().find("do not match the library"), std::string::npos) << name << ": " << e.message();
        }
        ++checked;
      }
  }
  EXPECT_EQ(checked, 4);  // dq and dkv_interm, each with both bodies
}

// The gather's groups per kv row follow the top-k (below ~440 the hottest rows, up to T contributors,
// outlast the bytes): one group at the seed and at 8192,128,9216,512, four at 4096,128,4128,160; not T.
TEST(NvrtcOffline, GatherSplitsRowsWhereTheHottestAreTheTail) {
  Problem p;
  p.T = 4096, p.H = 128, p.num_kv = 5120, p.topk = 512, p.has_sink = true;
  const size_t budget = runtime_env().interm_budget;
  auto gather_of = [&](const Problem& q) {
    for (const KernelSpec& k : cuda_phase_kernels(Phase::Gather, shape_with_config(q, nullptr, budget, "sm_90a")))
      return k;
    throw std::runtime_error("no gather launch");
  };
  const KernelSpec seed = gather_of(p);
  EXPECT_EQ(define_of(seed, "GATHER_GROUPS"), 1);
  EXPECT_EQ(seed.block.x, 128u);
  EXPECT_EQ(seed.grid.x, 5120u);
  p.num_kv = 4128, p.topk = 160;
  const KernelSpec hot = gather_of(p);
  EXPECT_EQ(define_of(hot, "GATHER_GROUPS"), 4);
  EXPECT_EQ(hot.block.x, 512u);
  EXPECT_EQ(hot.grid.x, 4128u);
  // A T large enough to chunk the top-k keeps the same gather (the cache serves every T).
  p.T = 1 << 20;
  const KernelSpec big_t = gather_of(p);
  EXPECT_EQ(big_t.defines, hot.defines);
  EXPECT_EQ(big_t.block.x, 512u);
  p.T = 8192, p.num_kv = 9216, p.topk = 512;
  EXPECT_EQ(define_of(gather_of(p), "GATHER_GROUPS"), 1);
  compile_all("sm_80", {seed, hot});  // a generic kernel: sm_80 covers it (sm_90a compiles are of the wgmma bodies)
}

// sm_80 (an A100: 163 KB of shared memory a block, not Hopper's 227 KB): the planner picks mma.sync tiles that fit
// (fewer dq heads a block, narrower dkv column blocks) for every H, and they compile. Before, the Hopper-sized
// defaults were planned and refused at load ("needs 209152 bytes ... the device allows 166912").
TEST(NvrtcOffline, Sm80PlansTilesThatFitAnA100AndTheyCompile) {
  EXPECT_EQ(cuda_smem_limit("sm_80"), 163u * 1024);
  Problem p;
  p.T = 4096, p.H = 128, p.num_kv = 5120, p.topk = 512, p.has_sink = true;
  std::vector<ShapeInfo> shapes;
  for (int H : {16, 32, 64, 128}) {
    p.H = H;
    ShapeInfo s = shape_with_config(p, nullptr, runtime_env().interm_budget, "sm_80");
    std::string why;
    EXPECT_TRUE(cuda_shape_supported(s, &why)) << "H " << H << ": " << why;
    for (const KernelSpec& k : cuda_all_kernels({s}))
      EXPECT_LE(k.smem_bytes, 163u * 1024) << k.entry << " at H " << H;
    shapes.push_back(s);
  }
  // The seed's tiles: dq 32 heads x 32 rows, dkv 64 x 128.
  const KernelSpec dq = launch_of(Phase::Dq, shapes.back());
  EXPECT_TRUE(has_define(dq, "BLOCK_H", 32)) << "dq";
  EXPECT_TRUE(has_define(launch_of(Phase::DkvInterm, shapes.back()), "BLOCK_D", 128)) << "dkv_interm";
  // sm_90a keeps its tiles.
  p.H = 128;
  EXPECT_TRUE(has_define(launch_of(Phase::Dq, shape_with_config(p, nullptr, runtime_env().interm_budget, "sm_90a")),
                         "DQ_WGMMA", 1));
  compile_all("sm_80", cuda_all_kernels(shapes));
}

// sm_86 / sm_89 (99 KB a block): dq's smallest tile (16 heads x 32 rows, 103168 B) does not fit, so plan() refuses
// with the tile, its bytes and the target's limit instead of failing at load. A caller's explicit tile that does not
// fit the target is refused the same way.
TEST(NvrtcOffline, TargetsWithLessSharedMemoryAreRefusedByName) {
  EXPECT_EQ(cuda_smem_limit("sm_86"), 99u * 1024);
  EXPECT_EQ(cuda_smem_limit("sm_89"), 99u * 1024);
  EXPECT_EQ(cuda_smem_limit("sm_90a"), 227u * 1024);
  EXPECT_EQ(cuda_smem_limit("gfx950"), 0u);
  EXPECT_EQ(cuda_smem_limit("sm_999"), 0u);
  Problem p;
  p.T = 4096, p.H = 128, p.num_kv = 5120, p.topk = 512, p.has_sink = true;
  std::string why;
  EXPECT_FALSE(cuda_shape_supported(shape_with_config(p, nullptr, runtime_env().interm_budget, "sm_89"), &why));
  EXPECT_NE(why.find("dq tile 16x32 needs"), std::string::npos) << why;
  EXPECT_NE(why.find("max 101376 on this target"), std::string::npos) << why;
  TileConfig c;
  c.dq_impl = 1, c.dkv_impl = 1, c.dkv_block_r = 64, c.dkv_block_d = 256;
  EXPECT_FALSE(cuda_shape_supported(shape_with_config(p, &c, runtime_env().interm_budget, "sm_80"), &why));
  EXPECT_NE(why.find("dkv_interm tile 64x256 needs"), std::string::npos) << why;
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

// setmaxnreg moves registers inside the block's launch allocation: a split it cannot cover hangs on the GPU (a dq
// candidate at 232 / 48 did, eleventh session), so both producer bodies refuse one at compile time. 232 / 40 fits
// (2 x 232 + 40 = 3 x 168), so does 240 / 24; 232 / 48 and 240 / 32 do not.
TEST(NvrtcOffline, ProducerBodiesRefuseARegisterSplitTheirLaunchCannotCover) {
  Problem p;
  p.T = 256, p.H = 128, p.num_kv = 1024, p.topk = 512, p.has_sink = true;
  const size_t budget = runtime_env().interm_budget;
  TileConfig c;
  c.dq_impl = 3, c.dkv_impl = 3;
  const ShapeInfo s = shape_with_config(p, &c, budget, "sm_90a");
  cuda::NvrtcCompiler nvrtc;
  ASSERT_TRUE(nvrtc.available(nullptr));
  KernelSources sources;
  for (const auto& [phase, pre] : {std::pair<Phase, std::string>{Phase::Dq, "DQW"}, {Phase::DkvInterm, "DKW"}}) {
    for (const auto& [consumer, producer] : {std::pair<int, int>{232, 48}, {240, 32}}) {
      KernelSpec k = launch_of(phase, s);
      k.defines.emplace_back(pre + "_REGS_CONSUMER", consumer);
      k.defines.emplace_back(pre + "_REGS_PRODUCER", producer);
      try {
        nvrtc.compile(sources.render(k, "cuda"), "sm_90a");
        ADD_FAILURE() << k.stem << " compiled with setmaxnreg " << consumer << " / " << producer;
      } catch (const Error& e) {
        EXPECT_EQ(e.status(), Status::CompileError);
        EXPECT_NE(std::string(e.what()).find("setmaxnreg: more than the block's registers"), std::string::npos)
            << k.stem << ": " << e.what();
      }
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

// csr's launches cover their work at every planner shape: keys' threads every slot of the chunk and every scratch int it
// clears, onesweep's blocks every slot (a tile is CSR_OS_THREADS x CSR_OS_ITEMS), one onesweep a radix pass in order,
// rowptr's threads positions 0..n inclusive. A grid short by one block leaves slots unsorted on the GPU only.
TEST(CudaKernelSpecs, CsrLaunchesCoverTheirWork) {
  auto define = [](const KernelSpec& k, const char* name) {
    for (const auto& d : k.defines)
      if (d.first == name) return d.second;
    ADD_FAILURE() << k.entry << " has no " << name;
    return 0ll;
  };
  int checked = 0;
  for (const ShapeInfo& s : planner_shapes()) {
    if (!cuda_shape_supported(s, nullptr)) continue;
    SCOPED_TRACE("T " + std::to_string(s.T) + " H " + std::to_string(s.H) + " topk " + std::to_string(s.topk) +
                 " num_kv " + std::to_string(s.num_kv));
    const long long items = s.chunk_items(), scratch_ints = cuda_csr_scratch_bytes(s) / 4;
    int passes = 0, rowptr = 0, keys = 0;
    for (const KernelSpec& k : cuda_phase_kernels(Phase::Csr, s)) {
      const long long threads = (long long)k.grid.x * k.grid.y * k.grid.z * k.block.x;
      if (k.entry == "smla_csr_keys") {
        ++keys;
        EXPECT_GE(threads, std::max(items, scratch_ints));
      }
      if (k.entry == "smla_csr_rowptr") {
        ++rowptr;
        EXPECT_GE(threads, items + 1);
      }
      if (k.entry == "smla_csr_exclusive") EXPECT_EQ(int(k.grid.x), s.radix_passes);
      if (k.entry == "smla_csr_onesweep") {
        EXPECT_EQ(k.block.x, unsigned(define(k, "CSR_OS_THREADS")));
        EXPECT_GE((long long)k.grid.x * k.grid.y * define(k, "CSR_OS_THREADS") * define(k, "CSR_OS_ITEMS"), items);
        EXPECT_EQ(k.pass, passes++);
      }
    }
    EXPECT_EQ(keys, 1);
    EXPECT_EQ(rowptr, 1);
    EXPECT_EQ(passes, s.radix_passes);
    ++checked;
  }
  EXPECT_GT(checked, 100);
}

// A quoted include that is not attached to the program is not read from the working directory (NVRTC's default for a
// source without a directory): those bytes never reach the cache key, so a changed file there served an old binary.
TEST(NvrtcOffline, AnUnattachedIncludeIsNotReadFromTheWorkingDirectory) {
  cuda::NvrtcCompiler nvrtc;
  std::string why;
  ASSERT_TRUE(nvrtc.available(&why)) << "CI has NVRTC: " << why;
  char tmpl[] = "/tmp/smla-cwd-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::ofstream(std::string(tmpl) + "/stray.cuh") << "#error smla-test-read-from-the-working-directory\n";
  const std::filesystem::path before = std::filesystem::current_path();
  std::filesystem::current_path(tmpl);
  std::string said;
  try {
    nvrtc.compile(RenderedSource{"delta.cu", "#include \"stray.cuh\"\n", {}}, "sm_90a");
    said = "(compiled)";
  } catch (const Error& e) {
    said = e.message();
  }
  std::filesystem::current_path(before);
  std::filesystem::remove_all(tmpl);
  EXPECT_EQ(said.find("smla-test-read-from-the-working-directory"), std::string::npos) << said;
  EXPECT_NE(said.find("stray.cuh"), std::string::npos) << said;
}

// A compile error cites the kernel file's own line: the rendered unit's defines come before a #line naming the file.
TEST(NvrtcOffline, ACompileErrorCitesTheSourceFilesOwnLine) {
  cuda::NvrtcCompiler nvrtc;
  std::string why;
  ASSERT_TRUE(nvrtc.available(&why)) << "CI has NVRTC: " << why;
  char tmpl[] = "/tmp/smla-src-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  std::ofstream(dir + "/delta.cu") << "// line 1\n// line 2\nint on_line_3 = smla_test_undefined_name;\n";
  const KernelSpec spec = make_spec("delta", "smla_delta", {{"HEADS", 16}, {"UNROLL", 4}}, grid_xy(1), 32);
  try {
    nvrtc.compile(KernelSources(dir).render(spec, "cuda"), "sm_90a");
    ADD_FAILURE() << "a source naming an undefined identifier compiled";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("delta.cu(3)"), std::string::npos) << e.message();
  }
  std::filesystem::remove_all(dir);
}

// With exactly as many older dumps as are kept, a new one removes the oldest: the newest 32 stay, the new one among them.
TEST(NvrtcOffline, ANewDumpBesideAFullDirectoryRemovesTheOldest) {
  char tmpl[] = "/tmp/smla-dump-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::filesystem::path root = tmpl;
  ::setenv("SMLA_DUMP_DIR", root.c_str(), 1);
  std::vector<std::filesystem::path> old;
  for (int i = 0; i < 32; ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "old%02d-sm_90a-%016x", i, i);
    old.push_back(root / name);
    std::filesystem::create_directories(old.back());
    std::filesystem::last_write_time(old.back(),
                                     std::filesystem::file_time_type::clock::now() - std::chrono::hours(100 - i));
  }
  const std::filesystem::path fresh = dump_failed_source(RenderedSource{"dq.cu", "// fresh\n", {}}, "sm_90a");
  ASSERT_TRUE(std::filesystem::is_regular_file(fresh)) << fresh;
  size_t dumps = 0;
  for (const auto& e : std::filesystem::directory_iterator(root)) dumps += e.is_directory();
  EXPECT_EQ(dumps, 32u);
  EXPECT_FALSE(std::filesystem::exists(old[0])) << "the oldest dump was kept beyond the 32";
  EXPECT_TRUE(std::filesystem::exists(old[1]));
  ::unsetenv("SMLA_DUMP_DIR");
  std::filesystem::remove_all(root);
}

// A SMLA_KERNEL_SRC_DIR tree is read whole or refused, naming the file: a quoted include missing from it (NVRTC then
// read it from the working directory, from bytes the cache key never saw: a changed header there served the old
// binary), a name reaching out of it, a directory in a file's place (attached as an empty header), an unreadable file.
TEST(NvrtcOffline, ASourceDirectoryIsReadWholeOrRefused) {
  char tmpl[] = "/tmp/smla-src-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  auto write = [&](const std::string& name, const std::string& text) { std::ofstream(dir + "/" + name) << text; };
  const KernelSpec spec{"delta", "", {}, {}, {}, 0, 0};
  auto refusal = [&]() -> std::string {
    try {
      KernelSources(dir).render(spec, "cuda");
      return "(rendered)";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::InvalidArgument) << e.message();
      return e.message();
    }
  };
  write("delta.cu", "#include \"present.h\"\n#include \"missing.h\"\n");
  write("present.h", "// here\n");
  EXPECT_NE(refusal().find("kernel source 'missing.h', included by the delta.cu translation unit, is not in the "
                           "source directory '" + dir + "'"),
            std::string::npos)
      << refusal();
  write("delta.cu", "#include \"../outside.h\"\n");
  EXPECT_NE(refusal().find("'../outside.h': not a path inside the source directory"), std::string::npos) << refusal();
  write("delta.cu", "#include \"/etc/hostname\"\n");
  EXPECT_NE(refusal().find("'/etc/hostname': not a path inside the source directory"), std::string::npos) << refusal();
  write("delta.cu", "#include \"adir.h\"\n");
  std::filesystem::create_directory(dir + "/adir.h");
  EXPECT_NE(refusal().find("kernel source 'adir.h' in '" + dir + "' is not a regular file"), std::string::npos)
      << refusal();
  write("delta.cu", "#include \"present.h\"\n");
  const RenderedSource ok = KernelSources(dir).render(spec, "cuda");
  ASSERT_EQ(ok.headers.size(), 1u);
  EXPECT_EQ(ok.headers[0].first, "present.h");
  std::filesystem::remove_all(dir);
}

// The one writer of failed sources (NVRTC's, hipRTC's, the hipRTC worker's): a directory a failure under
// SMLA_DUMP_DIR, made with its parents, the source beside its headers (in their subdirectories too), named by every
// byte. The two writers before did each a part of this: NVRTC's made only the last directory and named a failure by
// its text alone (the same text with other headers overwrote the first dump); hipRTC's put the headers elsewhere.
TEST(NvrtcOffline, FailedSourcesAreDumpedWhole) {
  char tmpl[] = "/tmp/smla-dump-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::filesystem::path root = tmpl;
  const std::string dump_dir = (root / "not" / "yet").string();
  ::setenv("SMLA_DUMP_DIR", dump_dir.c_str(), 1);
  auto slurp = [](const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  RenderedSource src{"dq.cu", "#include \"common.cuh\"\n#include \"sub/x.h\"\n", {{"common.cuh", "// one\n"}, {"sub/x.h", "// x\n"}}};
  const std::filesystem::path first = dump_failed_source(src, "gfx90a:xnack-");
  ASSERT_TRUE(std::filesystem::is_regular_file(first)) << first;
  EXPECT_EQ(first.parent_path().parent_path().string(), dump_dir);
  EXPECT_EQ(first.filename(), "dq.cu");
  EXPECT_EQ(first.parent_path().filename().string().rfind("dq-gfx90a_xnack--", 0), 0u) << first;
  EXPECT_EQ(slurp(first), src.text);
  EXPECT_EQ(slurp(first.parent_path() / "common.cuh"), "// one\n");
  EXPECT_EQ(slurp(first.parent_path() / "sub" / "x.h"), "// x\n");

  src.headers[0].second = "// two\n";  // the same text, another header: another dump, the first one kept
  const std::filesystem::path second = dump_failed_source(src, "gfx90a:xnack-");
  EXPECT_NE(second, first);
  EXPECT_EQ(slurp(second.parent_path() / "common.cuh"), "// two\n");
  EXPECT_EQ(slurp(first.parent_path() / "common.cuh"), "// one\n");
  EXPECT_EQ(dump_failed_source(src, "gfx90a:xnack-"), second.string()) << "the same failure, the same place";

  // Only the newest 32 dumps stay (a directory a distinct failure filled $TMPDIR across sweeps of source trees);
  // what is not a dump stays too.
  std::filesystem::create_directories(std::filesystem::path(dump_dir) / "notes");
  std::vector<std::filesystem::path> old;
  for (int i = 0; i < 40; ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "old%02d-sm_90a-%016x", i, i);
    old.push_back(std::filesystem::path(dump_dir) / name);
    std::filesystem::create_directories(old.back());
    std::filesystem::last_write_time(old.back(), std::filesystem::file_time_type::clock::now() -
                                                     std::chrono::hours(100 - i));  // old39 the newest of them
  }
  RenderedSource third{"dkv.cu", "// third\n", {}};
  const std::filesystem::path newest = dump_failed_source(third, "sm_90a");
  ASSERT_TRUE(std::filesystem::is_regular_file(newest)) << newest;
  size_t dumps = 0;
  for (const auto& e : std::filesystem::directory_iterator(dump_dir)) dumps += e.path().filename() != "notes";
  EXPECT_EQ(dumps, 32u);
  EXPECT_TRUE(std::filesystem::exists(std::filesystem::path(dump_dir) / "notes"));
  // Kept beside the new one: the two above (just written) and old39..old11; old10..old00 removed.
  EXPECT_TRUE(std::filesystem::exists(first.parent_path()));
  EXPECT_TRUE(std::filesystem::exists(second.parent_path()));
  EXPECT_TRUE(std::filesystem::exists(old[11])) << "a dump among the newest 32 was removed";
  EXPECT_FALSE(std::filesystem::exists(old[10])) << "a dump older than the newest 32 was kept";

  std::ofstream(root / "a-file") << "not a directory\n";  // a dump that cannot be written says so, never throws
  ::setenv("SMLA_DUMP_DIR", (root / "a-file" / "d").c_str(), 1);
  EXPECT_EQ(dump_failed_source(src, "sm_90a").rfind("(not written: ", 0), 0u);

  // A header named out of the dump (absolute, or with ".."; a SMLA_KERNEL_SRC_DIR source may say anything) is not
  // written anywhere: the file outside keeps its bytes.
  ::setenv("SMLA_DUMP_DIR", dump_dir.c_str(), 1);
  const std::filesystem::path outside = root / "outside.h";
  std::ofstream(outside) << "original\n";
  for (const std::string name : {outside.string(), std::string("../../outside.h"), std::string("sub/../../../outside.h")}) {
    RenderedSource evil{"dq.cu", "// bad\n", {{name, "// overwritten\n"}}};
    EXPECT_EQ(dump_failed_source(evil, "sm_90a").rfind("(not written: ", 0), 0u) << name;
    EXPECT_EQ(slurp(outside), "original\n") << name;
  }
  // A link planted in the dump's place of a file is not written through.
  RenderedSource linked{"dq.cu", "// linked\n", {}};
  const std::filesystem::path at = dump_failed_source(linked, "sm_90a");
  ASSERT_TRUE(std::filesystem::is_regular_file(at)) << at;
  std::filesystem::remove(at);
  std::filesystem::create_symlink(outside, at);
  EXPECT_EQ(dump_failed_source(linked, "sm_90a").rfind("(not written: ", 0), 0u);
  EXPECT_EQ(slurp(outside), "original\n");

  // The default: $TMPDIR/smla-failed-<uid>, the user's own (mode 0700); refused when it is a link or another user's
  // (a shared /tmp with predictable names: the first user's directory blocked every other user's dumps, or a planted
  // link took the writes).
  ::unsetenv("SMLA_DUMP_DIR");
  const char* old_tmp = std::getenv("TMPDIR");
  const std::string saved_tmp = old_tmp ? old_tmp : "";
  ::setenv("TMPDIR", root.c_str(), 1);
  const std::filesystem::path mine = root / ("smla-failed-" + std::to_string(::geteuid()));
  const std::filesystem::path def = dump_failed_source(src, "sm_90a");
  EXPECT_EQ(def.parent_path().parent_path(), mine) << def;
  struct stat st {};
  ASSERT_EQ(::stat(mine.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  std::filesystem::remove_all(mine);
  std::filesystem::create_directory_symlink(root / "not", mine);
  EXPECT_NE(dump_failed_source(src, "sm_90a").find("is not a directory"), std::string::npos);
  std::filesystem::remove(mine);
  if (::geteuid() == 0) {  // another user's directory (only root can make one here)
    std::filesystem::create_directory(mine);
    ASSERT_EQ(::chown(mine.c_str(), 4242, 4242), 0);
    EXPECT_NE(dump_failed_source(src, "sm_90a").find("belongs to another user"), std::string::npos);
  }
  if (old_tmp) ::setenv("TMPDIR", saved_tmp.c_str(), 1);
  else ::unsetenv("TMPDIR");
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace smla
