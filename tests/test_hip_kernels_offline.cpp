// test_hip_kernels_offline.cpp: hipRTC compiles, offline (no AMD GPU), every AMD kernel variant
// the planner can choose, for gfx90a (which Debian's ROCm 5.2 knows) and for gfx950 where this
// hipRTC knows it; the code objects are inspected (AMDGPU ELF, entry symbols, MFMA instructions
// and no scratch spills in the matrix kernels where an amdgcn llvm-objdump / llvm-readelf exists).
// Nothing here runs a kernel: no AMD result is claimed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <thread>

#include <unistd.h>

#include "runtime/env.hpp"
#include "runtime/hip/amdgpu_elf.hpp"
#include "runtime/hip/hip_api.hpp"
#include "runtime/hip/hip_subprocess.hpp"
#include "runtime/hip/hiprtc_compiler.hpp"
#include "runtime/hip/kernels_hip.hpp"
#include "runtime/planner.hpp"
#include "tests/planner_shapes.hpp"
#include "runtime/sources.hpp"

namespace smla {
namespace {

using test::planner_shapes;

// One translation unit per (stem, defines): the entries of a stem share it, as in the cache.
struct Unit {
  KernelSpec spec;                 // the first spec of the unit
  std::set<std::string> entries;   // every entry launched from it
};

std::vector<Unit> compile_units() {
  std::map<std::pair<std::string, std::vector<std::pair<std::string, long long>>>, Unit> by_tu;
  for (const KernelSpec& k : hip_all_kernels(planner_shapes())) {
    if (hip_is_library_kernel(k)) continue;
    Unit& u = by_tu[{k.stem, k.defines}];
    if (u.entries.empty()) u.spec = k;
    u.entries.insert(k.entry);
  }
  std::vector<Unit> out;
  for (auto& kv : by_tu) out.push_back(kv.second);
  return out;
}

std::string shell(const std::string& cmd, int* status) {
  std::string out;
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) {
    *status = -1;
    return out;
  }
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  *status = pclose(f);
  return out;
}

// An LLVM tool (llvm-objdump, llvm-readelf) that knows amdgcn: $SMLA_LLVM_BIN/<tool>, ROCm's,
// Debian's versioned ones, then PATH. Empty when none.
// llvm-readelf is target-independent (its --version lists no targets: asking it for "amdgcn" had dropped the scratch
// check everywhere), llvm-objdump must know amdgcn to disassemble.
std::string amdgcn_tool(const std::string& tool, bool needs_amdgcn_target = true) {
  std::vector<std::string> cands;
  if (const char* d = std::getenv("SMLA_LLVM_BIN")) cands.push_back(std::string(d) + "/" + tool);
  cands.push_back("/opt/rocm/llvm/bin/" + tool);
  for (int v = 20; v >= 14; --v) cands.push_back("/usr/lib/llvm-" + std::to_string(v) + "/bin/" + tool);
  cands.push_back(tool);
  for (const std::string& c : cands) {
    int st = 0;
    std::string ver = shell("'" + c + "' --version 2>/dev/null", &st);
    if (st == 0 && ver.find(needs_amdgcn_target ? "amdgcn" : "LLVM") != std::string::npos) return c;
  }
  return {};
}

std::string write_temp(const hip::TempDir& dir, const std::string& name, const std::vector<uint8_t>& bin) {
  const std::string path = dir.path() + "/" + name;
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bin.data()), std::streamsize(bin.size()));
  return path;
}

// ---------------------------------------------------------------- launch specs (no hipRTC)

TEST(HipKernelSpecs, EveryPlannerShapeIsSupportedWithSaneGeometry) {
  for (const ShapeInfo& s : planner_shapes()) {
    std::string why;
    ASSERT_TRUE(hip_shape_supported(s, &why)) << "H=" << s.H << " topk=" << s.topk << " T=" << s.T << ": " << why;
    for (Phase ph : {Phase::CheckTopk, Phase::Delta, Phase::Dq, Phase::DkvInterm, Phase::Csr, Phase::Gather,
                     Phase::DSink}) {
      const std::vector<KernelSpec> ks = hip_phase_kernels(ph, s);
      ASSERT_FALSE(ks.empty()) << phase_name(ph);
      for (const KernelSpec& k : ks) {
        if (hip_is_library_kernel(k)) continue;
        const unsigned threads = k.block.x * k.block.y * k.block.z;
        EXPECT_GE(threads, 64u) << k.entry;
        EXPECT_LE(threads, 1024u) << k.entry;
        EXPECT_EQ(threads % 64, 0u) << k.entry << ": whole wavefronts";
        EXPECT_LE(k.smem_bytes, kHipDefaultLds) << k.entry;
        EXPECT_GE(k.grid.x, 1u) << k.entry;
      }
    }
    // dq covers every (token, head block); dkv_interm every (token, column block).
    const KernelSpec dq = hip_phase_kernels(Phase::Dq, s).at(0);
    std::map<std::string, long long> def(dq.defines.begin(), dq.defines.end());
    EXPECT_EQ(dq.grid.x, unsigned(s.T));
    EXPECT_EQ(dq.grid.y * def.at("BLOCK_H"), s.H);
    EXPECT_EQ(dq.block.x, unsigned(64 * (def.at("BLOCK_H") / 16) * (def.at("BLOCK_R") / 16)));  // one wave per 16x16 of S
    const KernelSpec dk = hip_phase_kernels(Phase::DkvInterm, s).at(0);
    def = std::map<std::string, long long>(dk.defines.begin(), dk.defines.end());
    EXPECT_EQ(dk.grid.x, unsigned(s.T));
    EXPECT_EQ(dk.grid.y * def.at("BLOCK_D"), SMLA_D);
  }
}

TEST(HipKernelSpecs, CsrIsKeysThenRocprimThenRowptr) {
  Problem p;
  p.T = 300, p.H = 64, p.topk = 512, p.num_kv = 70000;
  ShapeInfo s = choose_shape(p, runtime_env().interm_budget);
  s.csr_sort_temp_bytes = 123457;  // what plan() sized the csr_hist region to
  const std::vector<KernelSpec> ks = hip_phase_kernels(Phase::Csr, s);
  ASSERT_EQ(ks.size(), 3u);
  EXPECT_EQ(ks[0].entry, "smla_csr_keys");
  EXPECT_TRUE(hip_is_library_kernel(ks[1]));
  EXPECT_EQ(ks[1].stem, kRocprimStem);
  EXPECT_EQ(ks[1].entry, "radix_sort_pairs");
  // The sort is told the plan's region, not a size asked of rocPRIM again at every run().
  EXPECT_EQ(ks[1].scratch_bytes, 123457u);
  EXPECT_EQ(ks[0].scratch_bytes, 0u);
  EXPECT_EQ(ks[2].scratch_bytes, 0u);
  EXPECT_EQ(ks[2].entry, "smla_csr_rowptr");
  // keys: one thread per item; rowptr: one per position 0..n
  EXPECT_GE(long(ks[0].grid.x) * ks[0].block.x, 300L * 512);
  EXPECT_GE(long(ks[2].grid.x) * ks[2].block.x, 300L * 512 + 1);
}

TEST(HipKernelSpecs, RejectsTilesThatDoNotFit) {
  Problem p;
  p.T = 8, p.H = 128, p.topk = 512, p.num_kv = 1000;
  ShapeInfo s = choose_shape(p, runtime_env().interm_budget);
  std::string why;
  s.dq_block_h = 64;  // 8 wavefronts of ~350 registers: does not fit a CU
  EXPECT_FALSE(hip_shape_supported(s, &why));
  EXPECT_NE(why.find("dq tile"), std::string::npos) << why;
  // A product past int: 16 x 2^30 wrapped to 0 and passed (as did the LDS size, in unsigned), so a tuning database's
  // entry like it failed plan() at the compile instead of being refused here.
  s.dq_block_h = 16;
  s.dq_block_r = 1 << 30;
  EXPECT_FALSE(hip_shape_supported(s, &why));
  EXPECT_NE(why.find("dq tile 16x1073741824"), std::string::npos) << why;
  s.dq_block_r = 0;
  s.dq_block_h = 0;
  s.dkv_block_d = 256;  // B^T of 2*128 rows x 256 columns: 135 KB of LDS
  EXPECT_FALSE(hip_shape_supported(s, &why));
  EXPECT_NE(why.find("LDS"), std::string::npos) << why;
  EXPECT_THROW(hip_phase_kernels(Phase::DkvInterm, s), Error);
  // The dkv body's column tile is at most 128 even where its LDS would fit (16 heads).
  p.H = 16;
  s = choose_shape(p, runtime_env().interm_budget);
  ASSERT_TRUE(hip_shape_supported(s, &why)) << why;
  s.dkv_block_d = 256;
  EXPECT_FALSE(hip_shape_supported(s, &why));
  EXPECT_NE(why.find("dkv_block_d = 256 must be a multiple of 16 dividing 512, at most 128"), std::string::npos) << why;
}

// HIP refuses a launch of 2^32 work-items or more in a dimension (gridDim x blockDim): delta's 32 lanes a (t, h) row
// over every token pass it at T H = 2^27. Refused where the launch is planned, naming the kernel (it was a launch
// error in run(), on a shape plan() had accepted); one token fewer passes. Through order_steps, as plan() does.
TEST(HipKernelSpecs, LaunchesPastHipsWorkItemLimitAreRefusedAtPlanTime) {
  Problem p;
  p.H = 128, p.topk = 512, p.num_kv = 5120;
  p.T = int64_t(1) << 20;  // T H = 2^27: delta launches 2^32 work-items
  try {
    order_steps(choose_shape(p, runtime_env().interm_budget), hip_phase_kernels);
    ADD_FAILURE() << "planned a delta launch of 2^32 work-items";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::Unsupported);
    EXPECT_NE(std::string(e.what()).find("smla_delta would launch 4294967296 work-items in x"), std::string::npos)
        << e.what();
  }
  p.T = (int64_t(1) << 20) - 1;
  for (const Step& st : order_steps(choose_shape(p, runtime_env().interm_budget), hip_phase_kernels))
    EXPECT_LE(uint64_t(st.spec.grid.x) * st.spec.block.x, uint64_t(UINT32_MAX)) << st.spec.entry;
}

TEST(HipKernelSpecs, EverySourceIsEmbeddedAndTheMemoryBoundBodiesAreShared) {
  KernelSources src;  // what the library embeds
  for (const Unit& u : compile_units()) EXPECT_TRUE(src.has(source_file_name(u.spec.stem, "hip"))) << u.spec.stem;
  // The code the H200 runs is the code compiled for AMD: the .hip file includes the .cu body.
  for (const char* stem : {"delta", "check_topk", "d_sink", "gather"}) {
    const RenderedSource r = src.render(KernelSpec{stem, "", {}, {}, {}, 0, 0}, "hip");
    bool has_body = false;
    for (const auto& h : r.headers) has_body |= h.first == std::string(stem) + ".cu";
    EXPECT_TRUE(has_body) << stem << ".hip does not include " << stem << ".cu";
  }
}

TEST(HipKernelSpecs, MatrixKernelsPassTheirLdsForTheSourceToCheck) {
  KernelSources src;
  for (const ShapeInfo& s : planner_shapes()) {
    for (Phase ph : {Phase::Dq, Phase::DkvInterm}) {
      const KernelSpec k = hip_phase_kernels(ph, s).at(0);
      const std::map<std::string, long long> def(k.defines.begin(), k.defines.end());
      ASSERT_TRUE(def.count("SMLA_SMEM_BYTES")) << k.stem;
      EXPECT_EQ(def.at("SMLA_SMEM_BYTES"), static_cast<long long>(k.smem_bytes)) << k.stem;
    }
  }
  for (const char* f : {"dq.hip", "dkv_interm.hip"})
    EXPECT_NE(src.file(f).find("\nSMLA_CHECK_SMEM("), std::string::npos) << f << " does not check its LDS carve";
}

// ---------------------------------------------------------------- hipRTC, offline

// A kernel tree (SMLA_KERNEL_SRC_DIR) whose padding makes dq and dkv_interm carve more LDS than the library launches
// them with: on AMD they would have read and written past their LDS. Each must fail to compile, saying why.
TEST(HipKernelsCarve, ATreeWhoseLdsCarveDiffersFailsToCompileForGfx90a) {
  std::string why;
  if (!hip::Api::get(&why)) GTEST_SKIP() << "hipRTC not installed here: " << why;
  const hip::detail::ProbeVerdict v = hip::detail::probe_target("gfx90a", &why);
  ASSERT_EQ(v, hip::detail::ProbeVerdict::Known) << why;  // every ROCm smla loads knows gfx90a

  Problem p;
  p.T = 64, p.H = 64, p.topk = 512, p.num_kv = 1000;
  const ShapeInfo s = choose_shape(p, runtime_env().interm_budget);
  const std::vector<KernelSpec> specs = {hip_phase_kernels(Phase::Dq, s).at(0),
                                         hip_phase_kernels(Phase::DkvInterm, s).at(0)};
  // The tree: the library's own files these two kernels use, written out.
  hip::TempDir tree("smla-test-tree");
  const KernelSources embedded;
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(tree.path() + "/" + name, std::ios::binary) << text;
  };
  for (const KernelSpec& k : specs) {
    write(source_file_name(k.stem, "hip"), embedded.file(source_file_name(k.stem, "hip")));
    for (const auto& h : embedded.render(k, "hip").headers) write(h.first, h.second);
  }
  auto compile = [&](const KernelSources& from) {
    std::vector<RenderedSource> r;
    for (const KernelSpec& k : specs) r.push_back(from.render(k, "hip"));
    return hip::hip_compile_in_subprocesses(r, "gfx90a", 2);
  };
  // As written, the copy compiles (so that the failure below is the padding's).
  for (const hip::HipWorkerResult& r : compile(KernelSources(tree.path()))) ASSERT_TRUE(r.ok) << r.error;

  std::string mfma = embedded.file("amd_mfma.h");
  const std::string pad = "#define SMLA_AMD_PAD 8\n";
  const size_t at = mfma.find(pad);
  ASSERT_NE(at, std::string::npos) << "amd_mfma.h no longer defines SMLA_AMD_PAD 8";
  mfma.replace(at, pad.size(), "#define SMLA_AMD_PAD 64\n");
  write("amd_mfma.h", mfma);
  const std::vector<hip::HipWorkerResult> res = compile(KernelSources(tree.path()));
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_FALSE(res[i].ok) << specs[i].stem << " compiled with a carve larger than its launch";
    EXPECT_NE(res[i].result.log.find("the host launches this kernel with SMLA_SMEM_BYTES"), std::string::npos)
        << specs[i].stem << ": " << res[i].error;
  }
}

class HipKernelsCompile : public ::testing::TestWithParam<const char*> {};

TEST_P(HipKernelsCompile, EveryVariantCompilesToARealCodeObject) {
  const std::string target = GetParam();
  std::string why;
  if (!hip::Api::get(&why)) GTEST_SKIP() << "hipRTC not installed here: " << why;
  // Skipped only where this hipRTC definitely cannot compile for the target; a probe that gave no verdict (no
  // worker, a worker killed or timed out) is a failure, not a skip.
  const hip::detail::ProbeVerdict v = hip::detail::probe_target(target, &why);
  ASSERT_NE(v, hip::detail::ProbeVerdict::NoVerdict) << why;
  if (v == hip::detail::ProbeVerdict::Refused) GTEST_SKIP() << "target " << target << " skipped: " << why;

  const std::vector<Unit> units = compile_units();
  // 4 H values x (dq, dkv_interm) + delta, check_topk, csr, gather (one and four groups a row), d_sink
  ASSERT_EQ(units.size(), 14u);
  KernelSources src;
  std::vector<RenderedSource> rendered;
  for (const Unit& u : units) rendered.push_back(src.render(u.spec, "hip"));
  // hipRTC is serial in a process: two workers use both cores of CI.
  const std::vector<hip::HipWorkerResult> res = hip::hip_compile_in_subprocesses(rendered, target, 2);
  ASSERT_EQ(res.size(), units.size());

  const std::string objdump = amdgcn_tool("llvm-objdump"), readelf = amdgcn_tool("llvm-readelf", false);
  hip::TempDir dir("smla-hip-kernels");
  int mfma_checked = 0;
  for (size_t i = 0; i < units.size(); ++i) {
    const Unit& u = units[i];
    std::string name = u.spec.stem;
    for (const auto& d : u.spec.defines) name += "_" + d.first + std::to_string(d.second);
    ASSERT_TRUE(res[i].ok) << name << " for " << target << ": " << res[i].error << "\n" << res[i].result.log;
    const hip::ElfInfo elf = hip::read_elf(res[i].result.binary);
    ASSERT_TRUE(elf.valid) << name << ": " << elf.error;
    EXPECT_EQ(elf.machine, hip::kEmAmdgpu) << name;
    const std::set<std::string> syms(elf.symbols.begin(), elf.symbols.end());
    for (const std::string& e : u.entries) EXPECT_TRUE(syms.count(e)) << name << " lacks the entry " << e;

    const bool matrix = u.spec.stem == "dq" || u.spec.stem == "dkv_interm";
    if (!matrix || (objdump.empty() && readelf.empty())) continue;
    const std::string co = write_temp(dir, name + ".co", res[i].result.binary);
    int st = 0;
    if (!objdump.empty()) {
      const std::string dis = shell("'" + objdump + "' -d '" + co + "'", &st);
      ASSERT_EQ(st, 0) << objdump << " failed on " << co;
      EXPECT_NE(dis.find("v_mfma_f32_16x16x"), std::string::npos) << name << ": no MFMA in the disassembly";
      ++mfma_checked;
    }
    if (!readelf.empty()) {
      // Registers that spill go to scratch: the matrix kernels' tiles are sized to need none.
      const std::string notes = shell("'" + readelf + "' --notes '" + co + "'", &st);
      ASSERT_EQ(st, 0) << readelf << " failed on " << co;
      const size_t at = notes.find(".private_segment_fixed_size:");
      ASSERT_NE(at, std::string::npos) << name << ": no kernel metadata";
      EXPECT_EQ(std::atoi(notes.c_str() + at + 28), 0) << name << " uses scratch (register spills)";
    }
  }
  if (!objdump.empty()) EXPECT_EQ(mfma_checked, 8);
  // Everything else was checked; reported as skipped so that the missing checks show in ctest's summary.
  if (objdump.empty() || readelf.empty())
    GTEST_SKIP() << "no amdgcn " << (objdump.empty() ? "llvm-objdump" : "") << (objdump.empty() && readelf.empty() ? " or " : "")
                 << (readelf.empty() ? "llvm-readelf" : "")
                 << " here: " << (objdump.empty() ? "MFMA instructions " : "") << (readelf.empty() ? "scratch use " : "")
                 << "not checked";
}

INSTANTIATE_TEST_SUITE_P(Targets, HipKernelsCompile, ::testing::Values("gfx90a", "gfx942", "gfx950"),
                         [](const ::testing::TestParamInfo<const char*>& i) { return std::string(i.param); });

// ---------------------------------------------------------------- gfx950 and gfx942 with a clang of LLVM 20
//
// gfx950 (the MI355X) is the AMD target smla is for, and Debian's ROCm 5.2 hipRTC cannot compile for it, nor for gfx942
// (the MI300X), so the test above skips both. A clang of LLVM 20 or later can: PyPI's ziglang wheel bundles one with
// the AMDGPU backend (`make test` fetches it into BUILD/_tools, pinned by hash; SMLA_GFX950_CLANG names it, or another
// clang >= 20). This compiles every AMD unit the planner can choose to device assembly for each of the two, as HIP with
// hipRTC's options, against ROCm 5.2's HIP headers and the HIP wrapper headers of Debian's clang (which hipcc installs)
// beside clang 20's own builtin headers. It is the closest compile check of their source this workplace allows: not
// the hipRTC of a ROCm that knows them (6.x for gfx942, 7.0 for gfx950), which the runtime uses there, and nothing here
// runs.

// "clang version N" of `cmd --version`; 0 when it does not say.
int clang_major(const std::string& cmd) {
  int st = 0;
  const std::string v = shell(cmd + " --version 2>&1", &st);
  const size_t at = v.find("clang version ");
  return st == 0 && at != std::string::npos ? std::atoi(v.c_str() + at + 14) : 0;
}

// The directory of clang's HIP wrapper headers (__clang_hip_runtime_wrapper.h): Debian's newest clang that has them.
std::string hip_wrapper_dir() {
  for (int v = 20; v >= 14; --v) {
    const std::string base = "/usr/lib/llvm-" + std::to_string(v) + "/lib/clang";
    int st = 0;
    const std::string hit =
        shell("ls -d '" + base + "'/*/include/__clang_hip_runtime_wrapper.h 2>/dev/null | head -n 1", &st);
    if (!hit.empty()) return hit.substr(0, hit.rfind('/'));
  }
  return {};
}

// Every entry of `from` (a directory) linked into `to`, except names already there.
void link_all(const std::string& from, const std::string& to) {
  int st = 0;
  shell("mkdir -p '" + to + "' && for f in '" + from + "'/*; do n=$(basename \"$f\"); [ -e '" + to +
            "'/\"$n\" ] || ln -s \"$f\" '" + to + "'/\"$n\"; done",
        &st);
  ASSERT_EQ(st, 0) << "could not link " << from << " into " << to;
}

// The integer after each occurrence of `key` in the assembly.
std::vector<long> values_after(const std::string& text, const std::string& key) {
  std::vector<long> out;
  for (size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + 1))
    out.push_back(std::atol(text.c_str() + at + key.size()));
  return out;
}

// The clang of SMLA_GFX950_CLANG (or make test's), a resource directory of its builtin headers with Debian clang's HIP
// wrappers added, and hipRTC's options for the target (the parameter): the tests below skip (saying why) where one is
// missing.
class HipKernelsClang20 : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    const char* given = std::getenv("SMLA_GFX950_CLANG");
#ifdef SMLA_GFX950_CLANG_DEFAULT
    if ((!given || !*given) && access(SMLA_GFX950_CLANG_DEFAULT, X_OK) == 0) given = SMLA_GFX950_CLANG_DEFAULT;
#endif
    if (!given || !*given)
      GTEST_SKIP() << "no clang of LLVM >= 20 for gfx950 and gfx942 here: `make test` fetches zig's (PyPI's "
                      "ziglang), or set SMLA_GFX950_CLANG to a clang >= 20 with the AMDGPU backend";
    clang_ = std::string("'") + given + "'";
    std::string builtin;  // clang 20's own builtin headers
    const std::string gs(given);
    if (gs.size() >= 4 && gs.compare(gs.size() - 4, 4, "/zig") == 0) {  // zig: its clang, its headers in lib/include
      clang_ += " clang";
      builtin = gs.substr(0, gs.size() - 4) + "/lib/include";
    } else {
      int st = 0;
      std::string rd = shell(clang_ + " -print-resource-dir 2>/dev/null", &st);
      while (!rd.empty() && (rd.back() == '\n' || rd.back() == '\r')) rd.pop_back();
      builtin = rd + "/include";
    }
    ASSERT_GE(clang_major(clang_), 20) << given << " (SMLA_GFX950_CLANG) is not a clang of LLVM 20 or later (gfx950 "
                                          "came in 20)";
    const std::string wrappers = hip_wrapper_dir();
    if (wrappers.empty())
      GTEST_SKIP() << "no clang HIP wrapper headers under /usr/lib/llvm-*/ (hipcc's clang installs them)";
    processor_ = GetParam();
    const std::vector<std::string> ids = hip::hip_target_ids(processor_);
    ASSERT_FALSE(ids.empty());
    target_ = ids.front();  // e.g. gfx950:sramecc+:xnack-, as the runtime names it
    dir_ = std::make_unique<hip::TempDir>("smla-" + processor_);
    link_all(builtin, dir_->path() + "/rd/include");   // clang 20's headers first,
    link_all(wrappers, dir_->path() + "/rd/include");  // then the HIP (and CUDA) wrappers it lacks
    std::string options;
    for (const std::string& o : hip::HipRtcCompiler(false).options(target_)) options += " '" + o + "'";
    // HIP device code only, to assembly: no AMDGPU linker here, and the assembly has what is checked.
    compile_ = clang_ + " -x hip --cuda-device-only -nogpulib -resource-dir '" + dir_->path() + "/rd'" +
               " --rocm-path=/usr -include hip/hip_runtime.h" + options;
  }

  // The assembly's checks common to every unit: for the target, each entry a kernel, no kernel using scratch.
  void check_assembly(const std::string& name, const std::string& s, const std::set<std::string>& entries,
                      size_t kernels) const {
    EXPECT_NE(s.find(".amdgcn_target \"amdgcn-amd-amdhsa--" + processor_), std::string::npos) << name;
    for (const std::string& e : entries)
      EXPECT_NE(s.find(".globl\t" + e + "\n"), std::string::npos) << name << " lacks the entry " << e;
    const std::vector<long> scratch = values_after(s, ".amdhsa_private_segment_fixed_size ");
    EXPECT_EQ(scratch.size(), kernels) << name;
    for (long v : scratch) EXPECT_EQ(v, 0) << name << " uses scratch (register spills)";
  }

  std::string processor_, clang_, target_, compile_;  // compile_: the command up to the source's own flags
  std::unique_ptr<hip::TempDir> dir_;
};

TEST_P(HipKernelsClang20, EveryVariantCompiles) {
  const hip::TempDir& dir = *dir_;
  const std::string& target = target_;
  const std::vector<Unit> units = compile_units();
  ASSERT_EQ(units.size(), 14u);
  KernelSources src;
  std::vector<std::string> cmds(units.size()), names(units.size());
  for (size_t i = 0; i < units.size(); ++i) {
    const Unit& u = units[i];
    names[i] = u.spec.stem;
    for (const auto& d : u.spec.defines) names[i] += "_" + d.first + std::to_string(d.second);
    const RenderedSource r = src.render(u.spec, "hip");
    const std::string ud = dir.path() + "/u" + std::to_string(i);
    int st = 0;
    shell("mkdir -p '" + ud + "'", &st);
    ASSERT_EQ(st, 0);
    std::ofstream(ud + "/" + r.name, std::ios::binary) << r.text;
    for (const auto& h : r.headers) std::ofstream(ud + "/" + h.first, std::ios::binary) << h.second;
    cmds[i] = compile_ + " -I'" + ud + "' -S '" + ud + "/" + r.name + "' -o '" + ud + "/out.s' 2>&1";
  }
  // Two compiles at a time (CI's two cores).
  std::vector<std::string> logs(units.size());
  std::vector<int> status(units.size(), 0);
  for (size_t i = 0; i < units.size(); i += 2) {
    std::vector<std::thread> th;
    for (size_t j = i; j < std::min(units.size(), i + 2); ++j)
      th.emplace_back([&, j] { logs[j] = shell(cmds[j], &status[j]); });
    for (auto& t : th) t.join();
  }
  int matrix = 0;
  for (size_t i = 0; i < units.size(); ++i) {
    const Unit& u = units[i];
    ASSERT_EQ(status[i], 0) << names[i] << " for " << target << ":\n" << logs[i] << "\n" << cmds[i];
    EXPECT_EQ(logs[i].find("warning:"), std::string::npos) << names[i] << ":\n" << logs[i];
    std::ifstream f(dir.path() + "/u" + std::to_string(i) + "/out.s");
    const std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    check_assembly(names[i], s, u.entries, u.entries.size());
    if (u.spec.stem == "dq" || u.spec.stem == "dkv_interm") {
      ++matrix;
      // gfx950's own MFMA (K = 32, amd_mfma.h) there, the K = 16 form of gfx90a and gfx942 elsewhere.
      const bool k32 = processor_ == "gfx950";
      EXPECT_EQ(s.find("v_mfma_f32_16x16x32_bf16") != std::string::npos, k32) << names[i] << " on " << processor_;
      EXPECT_EQ(s.find("v_mfma_f32_16x16x16") != std::string::npos, !k32) << names[i] << " on " << processor_;
    }
  }
  EXPECT_EQ(matrix, 8);
}

// The csr sort on AMD is rocPRIM's radix sort, built ahead of time by hipcc into libsmla_rocprim.so for the targets
// that hipcc knows (runtime/hip/CMakeLists.txt): ROCm 5.2's hipcc knows neither gfx950 nor gfx942, so their device code,
// with the rocPRIM headers smla builds against, compiles here instead (rocPRIM picks its tuning by target).
TEST_P(HipKernelsClang20, TheRocprimSortCompiles) {
#if defined(SMLA_ROCPRIM_SORT_SOURCE) && defined(SMLA_ROCPRIM_INCLUDE_DIR)
  const std::string out = dir_->path() + "/rocprim_sort.s";
  int st = 0;
  const std::string log = shell(compile_ + " -I'" SMLA_ROCPRIM_INCLUDE_DIR "' '-DSMLA_ROCPRIM_TARGETS=\"" + processor_ +
                                    "\"' -S '" SMLA_ROCPRIM_SORT_SOURCE "' -o '" + out + "' 2>&1", &st);
  ASSERT_EQ(st, 0) << log;
  EXPECT_EQ(log.find("warning:"), std::string::npos) << log;
  std::ifstream f(out);
  const std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  // Kernels counted by their descriptors' opening directive (check_assembly counts their scratch sizes apart).
  size_t kernels = 0;
  for (size_t at = s.find(".amdhsa_kernel "); at != std::string::npos; at = s.find(".amdhsa_kernel ", at + 1)) ++kernels;
  EXPECT_GE(kernels, 2u) << "rocPRIM's radix sort has at least its single-block and onesweep kernels";
  check_assembly("rocprim_sort", s, {}, kernels);
#else
  GTEST_SKIP() << "rocPRIM not found at configure time (librocprim-dev)";
#endif
}

INSTANTIATE_TEST_SUITE_P(Targets, HipKernelsClang20, ::testing::Values("gfx950", "gfx942"),
                         [](const ::testing::TestParamInfo<const char*>& i) { return std::string(i.param); });

}  // namespace
}  // namespace smla
