// test_amd_emulated.cpp: the AMD-only kernels (kernel_src/dq.hip, dkv_interm.hip) run, emulated on the host CPU, in
// the backward the HIP planner orders, against the CPU backend's phases and the float64 reference.
//
// No AMD GPU exists where smla is developed, so these kernels had only ever been compiled. Here each HIP launch of the
// dq and dkv_interm phases is rendered as the runtime renders it for hipRTC (its defines, tiles and LDS size from
// runtime/hip/kernels_hip.cpp), compiled by the host's clang with tests/amd_emu/amd_emu.hpp (the HIP device
// environment: work-items as threads, an MFMA as a collective of 64 lanes under the layout amd_mfma.h assumes), and
// launched with the HIP launch's grid, block and LDS. The other phases run the CPU backend's. Each emulated phase is
// compared with the CPU phase run on the same state, as test_phases_gpu does for CUDA, and the outputs at the end with
// the float64 reference. Both MFMA shapes run: K = 16 (gfx90a, gfx942) and K = 32 (gfx950).
//
// What it cannot see: the AMD compiler, the MFMA hardware's real layout, and LDS hazards between wavefronts (a host
// thread's memory is coherent at every barrier).
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <sstream>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "runtime/env.hpp"
#include "runtime/hip/kernels_hip.hpp"
#include "runtime/plan_impl.hpp"
#include "runtime/planner.hpp"
#include "runtime/sources.hpp"
#include "tests/e2e_common.hpp"
#include "tests/phase_compare.hpp"

namespace smla::test {
namespace {

namespace fs = std::filesystem;

using LaunchFn = int (*)(const SmlaParams*, const unsigned*, const unsigned*, unsigned, char*, size_t);

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The host clang that compiles the emulated units: SMLA_EMU_CXX, else the one CMake found (hipcc's clang-15).
std::string emu_cxx(std::string* why) {
  const char* env = std::getenv("SMLA_EMU_CXX");
  const std::string cxx = env && *env ? env : SMLA_EMU_CXX_DEFAULT;
  if (cxx.empty() || cxx.find("NOTFOUND") != std::string::npos) {
    *why = "no clang++ for the emulated AMD kernels (hipcc's clang-15 is one; set SMLA_EMU_CXX)";
    return {};
  }
  return cxx;
}

// `extern __shared__ T name[];` (the dynamic LDS) -> a pointer to the emulated block's LDS.
std::string with_emulated_lds(const std::string& text) {
  static const std::regex re(R"(extern\s+__shared__\s+(\w+)\s+(\w+)\s*\[\s*\]\s*;)");
  return std::regex_replace(text, re, "$1* $2 = smla_emu::lds<$1>();");
}

// The compiled units, each once a process (and on disk under the test cache, keyed by everything that went in).
class EmuKernels {
 public:
  LaunchFn get(const KernelSpec& spec, bool gfx950) {
    const RenderedSource src = sources_.render(spec, "hip");
    std::string cxx, why;
    cxx = emu_cxx(&why);
    if (cxx.empty()) throw std::runtime_error(why);
    const std::string flags = std::string("-std=c++20 -O1 -fPIC -shared -w -pthread -D__HIPCC__") +
                              (gfx950 ? " -D__gfx950__" : "");
    const std::string emu_header = read_file(SMLA_EMU_HEADER);
    if (emu_header.empty()) throw std::runtime_error(std::string("cannot read ") + SMLA_EMU_HEADER);
    std::string unit = with_emulated_lds(src.text) + "\nSMLA_EMU_LAUNCHER(" + spec.entry + ")\n";
    std::string all = cxx + "\n" + flags + "\n" + emu_header + "\n" + unit;
    for (const auto& [name, text] : src.headers) all += "\n// " + name + "\n" + with_emulated_lds(text);
    const XXH128_hash_t h = XXH3_128bits(all.data(), all.size());
    char key[40];
    std::snprintf(key, sizeof key, "%016llx%016llx", (unsigned long long)h.high64, (unsigned long long)h.low64);
    if (auto it = loaded_.find(key); it != loaded_.end()) return it->second;

    const char* cache = std::getenv("SMLA_CACHE_DIR");
    const fs::path dir = fs::path(cache && *cache ? cache : fs::temp_directory_path().string()) / "amd-emu";
    fs::create_directories(dir);
    const fs::path so = dir / (std::string(key) + ".so");
    if (!fs::exists(so)) {
      // A directory of this process's own: two test processes may compile the same unit at once (each renames its
      // result into place; both are the same bytes).
      const fs::path work = dir / (std::string(key) + ".d." + std::to_string(::getpid()));
      fs::create_directories(work);
      for (const auto& [name, text] : src.headers) std::ofstream(work / name, std::ios::binary) << with_emulated_lds(text);
      std::ofstream(work / "unit.cpp", std::ios::binary) << unit;
      const fs::path out = work / "unit.so", log = work / "log";
      const std::string cmd = "'" + cxx + "' " + flags + " -include '" + SMLA_EMU_HEADER + "' -I'" + work.string() +
                              "' '" + (work / "unit.cpp").string() + "' -o '" + out.string() + "' > '" +
                              log.string() + "' 2>&1";
      const int rc = std::system(cmd.c_str());
      if (rc != 0) {
        const std::string msg = "emulated compile of " + src.name + " (" + spec.entry + ") failed (" +
                                std::to_string(rc) + "): " + cmd + "\n" + read_file(log.string()).substr(0, 4000);
        fs::remove_all(work);
        throw std::runtime_error(msg);
      }
      fs::rename(out, so);
      fs::remove_all(work);
    }
    void* lib = ::dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) throw std::runtime_error(std::string("dlopen ") + so.string() + ": " + ::dlerror());
    auto fn = reinterpret_cast<LaunchFn>(::dlsym(lib, ("smla_emu_launch_" + spec.entry).c_str()));
    if (!fn) throw std::runtime_error("no launcher for " + spec.entry + " in " + so.string());
    loaded_[key] = fn;
    return fn;
  }

 private:
  // What plan() renders: the sources built into the library, or SMLA_KERNEL_SRC_DIR's (a mutation audit's tree).
  KernelSources sources_{runtime_env().kernel_src_dir};
  std::map<std::string, LaunchFn> loaded_;
};

EmuKernels& emu_kernels() {
  static EmuKernels k;
  return k;
}

// Tile choices a case gives the HIP kernels (0: the HIP defaults of kernels_hip.cpp).
struct Tiles {
  int dq_block_h = 0, dq_block_r = 0, dkv_block_r = 0, dkv_block_d = 0;
};

// Bytes of the dq tensor's span under the runner's strides.
size_t dq_span_bytes(const Tensors& t, const Case& c) {
  const int64_t st = t.dq_stride_t ? t.dq_stride_t : int64_t(c.H) * 512, sh = t.dq_stride_h ? t.dq_stride_h : 512;
  return size_t((c.T - 1) * st + (c.H - 1) * sh + 512) * 2;
}

// The backward of case `c` with the HIP planner's steps: dq and dkv_interm emulated (runner `e`), each checked against
// the CPU phase on a copy of the same state (runner `h`); every other phase the CPU's, on `e`. Returns how many
// emulated launches ran.
int run_emulated_backward(const Case& c, const Tiles& tiles, bool gfx950, uint64_t seed) {
  const ref::Inputs in = make_case_inputs(c, seed);
  const Problem pc = make_problem(BackendKind::Cpu, c);
  auto cplan = std::dynamic_pointer_cast<const PlanImpl>(shared_runtime().plan(pc));
  if (!cplan) {
    ADD_FAILURE() << "no CPU plan";
    return 0;
  }
  ShapeInfo hs = cplan->shape_;
  hs.dq_block_h = tiles.dq_block_h, hs.dq_block_r = tiles.dq_block_r;
  hs.dkv_block_r = tiles.dkv_block_r, hs.dkv_block_d = tiles.dkv_block_d;
  std::string why;
  if (!hip_shape_supported(hs, &why)) {
    ADD_FAILURE() << "the HIP kernels do not take this case: " << why;
    return 0;
  }
  const std::vector<Step> hip_steps = order_steps(hs, hip_phase_kernels);

  const std::vector<float> lse = case_lse(c, in);
  const tools::Layout layout = c.strided ? tools::Layout::Strided : tools::Layout::Packed;
  tools::CaseRunner e(pc, in, &lse, layout), h(pc, in, &lse, layout);
  const size_t ws = cplan->workspace_bytes();
  void* ews = e.workspace(ws);
  void* hws = h.workspace(ws);
  e.poison_outputs();
  h.poison_outputs();
  const SmlaParams ebase = cplan->base_params(e.tensors(), ews, e.workspace_size());
  const SmlaParams hbase = cplan->base_params(h.tensors(), hws, h.workspace_size());
  const size_t dq_bytes = dq_span_bytes(e.tensors(), c);
  const WorkspaceLayout& L = cplan->layout_;

  // The CPU plan's steps of a (phase, top-k chunk, token chunk).
  auto cpu_steps = [&](const Step& hst) {
    std::vector<size_t> out;
    for (size_t i = 0; i < cplan->steps_.size(); ++i) {
      const Step& s = cplan->steps_[i];
      if (s.phase == hst.phase && s.chunk == hst.chunk && s.t_index == hst.t_index) out.push_back(i);
    }
    return out;
  };
  int emulated = 0;
  for (size_t k = 0; k < hip_steps.size(); ++k) {
    const Step& hst = hip_steps[k];
    // A phase of several HIP launches (csr: keys, rocPRIM's sort, row_ptr) is the CPU's group once, at its first.
    if (k > 0 && hip_steps[k - 1].phase == hst.phase && hip_steps[k - 1].chunk == hst.chunk &&
        hip_steps[k - 1].t_index == hst.t_index)
      continue;
    const std::vector<size_t> cs = cpu_steps(hst);
    if (cs.empty()) {
      ADD_FAILURE() << "the CPU plan has no step for HIP's " << phase_name(hst.phase) << " chunk " << hst.chunk;
      return emulated;
    }
    const bool emulate = hst.phase == Phase::Dq || hst.phase == Phase::DkvInterm;
    if (!emulate) {
      for (size_t i : cs) cplan->launch_step(i, ebase, nullptr);
      continue;
    }
    SCOPED_TRACE(std::string(phase_name(hst.phase)) + " top-k chunk " + std::to_string(hst.chunk) + " token chunk " +
                 std::to_string(hst.t_index));
    // The CPU phase on a copy of the emulated run's state.
    std::memcpy(hws, ews, ws);
    std::memcpy(h.tensors().dq, e.tensors().dq, dq_bytes);
    for (size_t i : cs) cplan->launch_step(i, hbase, nullptr);
    // The HIP launch, emulated, with the step's params (its chunk and token offsets: the CPU step's).
    if (cs.size() != 1) {
      ADD_FAILURE() << cs.size() << " CPU steps for one HIP launch";
      return emulated;
    }
    const LaunchFn fn = emu_kernels().get(hst.spec, gfx950);
    const SmlaParams p = cplan->step_params(cs[0], ebase);
    const unsigned grid[3] = {hst.spec.grid.x, hst.spec.grid.y, hst.spec.grid.z};
    const unsigned block[3] = {hst.spec.block.x, hst.spec.block.y, hst.spec.block.z};
    char err[512] = {};
    const int rc = fn(&p, grid, block, hst.spec.smem_bytes, err, sizeof err);
    if (rc != 0) {
      ADD_FAILURE() << "emulated launch of " << hst.spec.entry << ": " << err;
      return emulated;
    }
    ++emulated;
    auto region = [&](const Region& r, bool bf16) {
      compare_region(r.name, bf16, false, static_cast<const unsigned char*>(ews) + r.offset,
                     static_cast<const unsigned char*>(hws) + r.offset, r.bytes);
    };
    if (hst.phase == Phase::Dq) {
      region(L.ds, true), region(L.pm, true), region(L.dq_acc, false);
      const std::vector<uint16_t> edq = e.read_outputs().dq, hdq = h.read_outputs().dq;
      compare_region("dq", true, false, reinterpret_cast<const unsigned char*>(edq.data()),
                     reinterpret_cast<const unsigned char*>(hdq.data()), edq.size() * 2);
    } else {
      region(L.interm, true);
    }
  }
  check_against_reference(c, in, e.read_outputs());
  return emulated;
}

struct EmuCase {
  Case c;
  Tiles tiles;
};

void run_cases(const std::vector<EmuCase>& cases, bool gfx950) {
  std::string why;
  if (emu_cxx(&why).empty()) {
    const char* skip = std::getenv("SMLA_SKIP_TEST_TOOLS");
    if (skip && std::string(skip) == "1") GTEST_SKIP() << why << " (SMLA_SKIP_TEST_TOOLS=1): the AMD kernels not run";
    FAIL() << why;
  }
  for (const EmuCase& ec : cases) {
    const Case& c = ec.c;
    SCOPED_TRACE(describe(c) + " tiles " + std::to_string(ec.tiles.dq_block_h) + "x" +
                 std::to_string(ec.tiles.dq_block_r) + " / " + std::to_string(ec.tiles.dkv_block_r) + "x" +
                 std::to_string(ec.tiles.dkv_block_d) + (gfx950 ? " gfx950" : " gfx90a"));
    const int n = run_emulated_backward(c, ec.tiles, gfx950, 900 + std::random_device{}() % 100);
    // Every top-k chunk of every token chunk: one dq and one dkv_interm launch.
    const int t_chunks = c.t_chunk ? (c.T + c.t_chunk - 1) / c.t_chunk : 1;
    const int n_chunks = c.r_chunk ? c.topk / c.r_chunk : 1;
    EXPECT_EQ(n, 2 * t_chunks * n_chunks) << "emulated launches";
  }
}

std::vector<EmuCase> cases() {
  using K = ref::TopkKind;
  Case strided{6, 16, 70, 64, 32, true, K::Uniform, true};
  strided.strided = true;
  return {
      // H 16 (one 16-head dq block, two wavefronts), two top-k chunks (dQ carried in fp32), empty rows and repeats.
      {{6, 16, 50, 64, 32, true, K::Benchmark, true, true}, {}},
      // H 32 (four wavefronts), a chunk of 80 slots (a partial kv tile), out-of-range indices, base-2 lse.
      {{5, 32, 40, 80, 0, false, K::Uniform, false, false, LseKind::Base2Excl, true}, {}},
      // H 64, token chunks of 2 over 5 tokens, top-k chunks of 48 (a kv tile that runs past the chunk's end).
      {{5, 64, 60, 96, 48, true, K::Uniform, true, false, LseKind::Aiter, false, 2}, {}},
      // The benchmark top-k (its window and the visible pool rows, empty slots at the end of early tokens' rows) over
      // enough tokens that the pool is reached, in top-k chunks of 80.
      {{140, 16, 180, 160, 80, true, K::Benchmark}, {}},
      // H 128 (four dq blocks a token; dkv_interm's 64-column blocks).
      {{3, 128, 30, 64, 0, true, K::Uniform, false, true}, {}},
      // Tiles other than the defaults: 16-head dq blocks at H 32, dkv_interm in 64 rows x 32 columns, then in 256 rows.
      {{4, 32, 300, 320, 160, true, K::Uniform, true}, {16, 32, 64, 32}},
      {{3, 32, 90, 288, 0, false, K::Uniform}, {0, 0, 256, 16}},
      // Every stride set (head-major q, o, dout and dq, padded rows, a transposed lse).
      {strided, {}},
  };
}

TEST(AmdEmulated, DqAndDkvIntermAtMfmaK16MatchTheCpuPhasesAndFloat64) { run_cases(cases(), false); }

TEST(AmdEmulated, DqAndDkvIntermAtMfmaK32OfGfx950MatchTheCpuPhasesAndFloat64) { run_cases(cases(), true); }

}  // namespace
}  // namespace smla::test
