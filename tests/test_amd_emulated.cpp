// test_amd_emulated.cpp: the HIP kernels (kernel_src/*.hip) run, emulated on the host CPU, in the backward the HIP
// planner orders, against the CPU backend's phases and the float64 reference.
//
// No AMD GPU exists where smla is developed, so these kernels had only ever been compiled. Here each HIP launch is
// rendered as the runtime renders it for hipRTC (its defines, tiles and LDS size from runtime/hip/kernels_hip.cpp),
// compiled by the host's clang with tests/amd_emu/amd_emu.hpp (the HIP device environment: work-items as threads, an
// MFMA as a collective of 64 lanes under the layout amd_mfma.h assumes), and launched with the HIP launch's grid,
// block and LDS; csr's sort is a stand-in for rocPRIM's. Each emulated phase is compared with the CPU phase run on the
// same state, as test_phases_gpu does for CUDA, and the outputs at the end with the float64 reference. Both MFMA
// shapes run: K = 16 (gfx90a, gfx942) and K = 32 (gfx950).
//
// What it cannot see: the AMD compiler, the MFMA hardware's real layout, LDS hazards between wavefronts (a host
// thread's memory is coherent at every barrier), and rocPRIM.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <sstream>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "runtime/env.hpp"
#include "runtime/hip/kernels_hip.hpp"
#include "runtime/kernel_key.hpp"
#include "runtime/plan_impl.hpp"
#include "runtime/planner.hpp"
#include "runtime/sources.hpp"
#include "tests/e2e_common.hpp"
#include "tests/phase_compare.hpp"
#include "tests/read_text_file.hpp"

namespace smla::test {
namespace {

namespace fs = std::filesystem;

using LaunchFn = int (*)(const SmlaParams*, const unsigned*, const unsigned*, unsigned, char*, size_t);

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
    // Within the process: a unit is what selects it (as Runtime's in-process map keys a module), looked up before
    // any rendering, reading or hashing.
    const std::string id = spec.stem + "|" + defines_id(spec) + "|" + spec.entry + (gfx950 ? "|gfx950" : "");
    if (auto it = loaded_.find(id); it != loaded_.end()) return it->second;
    const RenderedSource src = sources_.render(spec, "hip");
    std::string why;
    const std::string cxx = emu_cxx(&why);
    if (cxx.empty()) throw std::runtime_error(why);
    const std::string flags = std::string("-std=c++20 -O1 -fPIC -shared -w -pthread -D__HIPCC__") +
                              (gfx950 ? " -D__gfx950__" : "");
    if (emu_header_.empty()) emu_header_ = read_text_file(SMLA_EMU_HEADER);
    if (emu_header_.empty()) throw std::runtime_error(std::string("cannot read ") + SMLA_EMU_HEADER);
    const std::string unit = with_emulated_lds(src.text) + "\nSMLA_EMU_LAUNCHER(" + spec.entry + ")\n";
    std::vector<std::pair<std::string, std::string>> headers;
    for (const auto& [name, text] : src.headers) headers.emplace_back(name, with_emulated_lds(text));
    std::string all = cxx + "\n" + flags + "\n" + emu_header_ + "\n" + unit;
    for (const auto& [name, text] : headers) all += "\n// " + name + "\n" + text;
    const XXH128_hash_t h = XXH3_128bits(all.data(), all.size());
    char key[40];
    std::snprintf(key, sizeof key, "%016llx%016llx", (unsigned long long)h.high64, (unsigned long long)h.low64);

    const char* cache = std::getenv("SMLA_CACHE_DIR");
    const fs::path dir = fs::path(cache && *cache ? cache : fs::temp_directory_path().string()) / "amd-emu";
    fs::create_directories(dir);
    const fs::path so = dir / (std::string(key) + ".so");
    if (!fs::exists(so)) {
      // A directory of this process's own: two test processes may compile the same unit at once (each renames its
      // result into place; both are the same bytes).
      const fs::path work = dir / (std::string(key) + ".d." + std::to_string(::getpid()));
      fs::create_directories(work);
      for (const auto& [name, text] : headers) std::ofstream(work / name, std::ios::binary) << text;
      std::ofstream(work / "unit.cpp", std::ios::binary) << unit;
      const fs::path out = work / "unit.so", log = work / "log";
      const std::string cmd = "'" + cxx + "' " + flags + " -include '" + SMLA_EMU_HEADER + "' -I'" + work.string() +
                              "' '" + (work / "unit.cpp").string() + "' -o '" + out.string() + "' > '" +
                              log.string() + "' 2>&1";
      const int rc = std::system(cmd.c_str());
      if (rc != 0) {
        const std::string msg = "emulated compile of " + src.name + " (" + spec.entry + ") failed (" +
                                std::to_string(rc) + "): " + cmd + "\n" + read_text_file(log.string()).substr(0, 4000);
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
    loaded_[id] = fn;
    return fn;
  }

 private:
  // What plan() renders: the sources built into the library, or SMLA_KERNEL_SRC_DIR's (a mutation audit's tree).
  KernelSources sources_{runtime_env().kernel_src_dir};
  std::string emu_header_;
  std::map<std::string, LaunchFn> loaded_;  // by stem, defines, entry and target
};

EmuKernels& emu_kernels() {
  static EmuKernels k;
  return k;
}

// Tile choices a case gives the HIP kernels (0: the HIP defaults of kernels_hip.cpp).
struct Tiles {
  int dq_block_h = 0, dq_block_r = 0, dkv_block_r = 0, dkv_block_d = 0;
};

// What the HIP backend's "@rocprim" launch does (hip_backend.cpp): rocPRIM's stable radix sort of the chunk's (key,
// slot) pairs from buffer 1 - csr_final into buffer csr_final, on the key bits [0, radix_bits_for(num_kv)), which hold
// every key (num_kv, the empty slots' key, included): a stable sort by the whole key. rocPRIM itself never runs here.
void rocprim_sort_stand_in(const SmlaParams& p) {
  const long long n = (long long)p.T * p.r_chunk;
  const int in = 1 - p.csr_final, out = p.csr_final;
  std::vector<long long> order(static_cast<size_t>(n));
  for (long long i = 0; i < n; ++i) order[size_t(i)] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](long long a, long long b) { return p.csr_keys[in][a] < p.csr_keys[in][b]; });
  for (long long i = 0; i < n; ++i) {
    p.csr_keys[out][i] = p.csr_keys[in][order[size_t(i)]];
    p.csr_vals[out][i] = p.csr_vals[in][order[size_t(i)]];
  }
}

// The backward of case `c` in the HIP planner's order: the phases of `emulated` run their HIP launches emulated on
// runner `e`, each checked against the CPU phase run on a copy of the same state (runner `h`); the phases not in
// `emulated` run the CPU backend's, on `e`. At the end e's outputs meet the float64 reference. Returns how many
// emulated kernel launches ran.
int run_emulated_backward(const Case& c, const Tiles& tiles, bool gfx950, const std::set<Phase>& emulated,
                          uint64_t seed) {
  const ref::Inputs in = make_case_inputs(c, seed);
  Problem pc = make_problem(BackendKind::Cpu, c);
  pc.check_indices = true;
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
  const WorkspaceLayout& L = cplan->layout_;
  auto same_group = [](const Step& a, const Step& b) {
    return a.phase == b.phase && a.chunk == b.chunk && a.t_index == b.t_index;
  };
  int launches = 0;
  for (size_t k = 0; k < hip_steps.size();) {
    // One phase of one chunk: its HIP launches (check_topk and csr have three), and the CPU plan's steps.
    size_t end = k + 1;
    while (end < hip_steps.size() && same_group(hip_steps[end], hip_steps[k])) ++end;
    const Step& first = hip_steps[k];
    std::vector<size_t> cs;
    for (size_t i = 0; i < cplan->steps_.size(); ++i)
      if (same_group(cplan->steps_[i], first)) cs.push_back(i);
    if (cs.size() != 1) {
      ADD_FAILURE() << "the CPU plan has " << cs.size() << " steps for HIP's " << phase_name(first.phase) << " chunk "
                    << first.chunk << " (one expected)";
      return launches;
    }
    if (!emulated.count(first.phase)) {
      cplan->launch_step(cs[0], ebase, nullptr);
      k = end;
      continue;
    }
    SCOPED_TRACE(std::string(phase_name(first.phase)) + " top-k chunk " + std::to_string(first.chunk) +
                 " token chunk " + std::to_string(first.t_index));
    // The CPU phase on a copy of the emulated run's state.
    std::memcpy(hws, ews, ws);
    std::memcpy(h.tensors().dq, e.tensors().dq, e.dq_bytes());
    std::memcpy(h.tensors().dkv, e.tensors().dkv, e.dkv_bytes());
    if (e.d_sink_bytes()) std::memcpy(h.tensors().d_sink, e.tensors().d_sink, e.d_sink_bytes());
    cplan->launch_step(cs[0], hbase, nullptr);
    // The HIP launches, emulated, with the CPU step's params (its chunk and token offsets) and each launch's pass.
    for (; k < end; ++k) {
      const KernelSpec& spec = hip_steps[k].spec;
      SmlaParams p = cplan->step_params(cs[0], ebase);
      p.pass = spec.pass;
      if (hip_is_library_kernel(spec)) {  // rocPRIM's sort, between csr's two kernels: done here, as it sorts
        rocprim_sort_stand_in(p);
        continue;
      }
      const LaunchFn fn = emu_kernels().get(spec, gfx950);
      const unsigned grid[3] = {spec.grid.x, spec.grid.y, spec.grid.z};
      const unsigned block[3] = {spec.block.x, spec.block.y, spec.block.z};
      char err[512] = {};
      if (fn(&p, grid, block, spec.smem_bytes, err, sizeof err) != 0) {
        ADD_FAILURE() << "emulated launch of " << spec.entry << ": " << err;
        return launches;
      }
      ++launches;
    }
    // What the phase writes, as test_phases_gpu compares it (fp32 sums at 1e-4, the rest at the contract's bar).
    constexpr double kSumBar = 1e-4;
    auto region = [&](const Region& r, bool bf16, bool integer, double bar = 1e-2) {
      compare_region(r.name, bf16, integer, static_cast<const unsigned char*>(ews) + r.offset,
                     static_cast<const unsigned char*>(hws) + r.offset, r.bytes, bar);
    };
    const tools::Outputs eo = e.read_outputs(), ho = h.read_outputs();
    auto bytes = [](const auto& v) { return reinterpret_cast<const unsigned char*>(v.data()); };
    switch (first.phase) {
      case Phase::CheckTopk: region(L.index_report, false, true); break;
      case Phase::Csr:  // every backend sorts the empty slots (key num_kv) last, stably: the final buffers whole
        region(L.row_ptr, false, true);
        region(ebase.csr_final ? L.csr_vals1 : L.csr_vals0, false, true);
        region(ebase.csr_final ? L.csr_keys1 : L.csr_keys0, false, true);
        break;
      case Phase::Delta: region(L.delta, false, false, kSumBar), region(L.lse_n, false, false, kSumBar); break;
      case Phase::Dq:
        region(L.ds, true, false), region(L.pm, true, false), region(L.dq_acc, false, false);
        compare_region("dq", true, false, bytes(eo.dq), bytes(ho.dq), eo.dq.size() * 2);
        break;
      case Phase::DkvInterm: region(L.interm, true, false); break;
      case Phase::Gather:
        region(L.dkv_acc, false, false, kSumBar);
        compare_region("dkv", true, false, bytes(eo.dkv), bytes(ho.dkv), eo.dkv.size() * 2);
        compare_region("dkv (fp32)", false, false, bytes(eo.dkv_f32), bytes(ho.dkv_f32), eo.dkv_f32.size() * 4);
        break;
      case Phase::DSink:
        compare_region("d_sink", false, false, bytes(eo.d_sink), bytes(ho.d_sink), eo.d_sink.size() * 4, kSumBar);
        break;
      default: ADD_FAILURE() << "no comparison for " << phase_name(first.phase);
    }
  }
  check_against_reference(c, in, e.read_outputs());
  return launches;
}

struct EmuCase {
  Case c;
  Tiles tiles;
};

void run_cases(const std::vector<EmuCase>& cases, bool gfx950, const std::set<Phase>& emulated) {
  std::string why;
  if (emu_cxx(&why).empty()) {
    const char* skip = std::getenv("SMLA_SKIP_TEST_TOOLS");
    if (skip && std::string(skip) == "1") GTEST_SKIP() << why << " (SMLA_SKIP_TEST_TOOLS=1): the AMD kernels not run";
    FAIL() << why;
  }
  for (const EmuCase& ec : cases) {
    const Case& c = ec.c;
    const uint64_t seed = 900 + std::random_device{}() % 100;
    SCOPED_TRACE(describe(c) + " tiles " + std::to_string(ec.tiles.dq_block_h) + "x" +
                 std::to_string(ec.tiles.dq_block_r) + " / " + std::to_string(ec.tiles.dkv_block_r) + "x" +
                 std::to_string(ec.tiles.dkv_block_d) + (gfx950 ? " gfx950" : " gfx90a") + " seed " +
                 std::to_string(seed));
    const int n = run_emulated_backward(c, ec.tiles, gfx950, emulated, seed);
    // The kernel launches the HIP planner orders for the emulated phases: per top-k chunk of each token chunk one dq,
    // one dkv_interm, one gather and csr's two (its sort is no kernel); check_topk's three, delta and d_sink once.
    const int chunks = (c.t_chunk ? (c.T + c.t_chunk - 1) / c.t_chunk : 1) * (c.r_chunk ? c.topk / c.r_chunk : 1);
    const int want = chunks * (int(emulated.count(Phase::Dq)) + int(emulated.count(Phase::DkvInterm)) +
                               int(emulated.count(Phase::Gather)) + 2 * int(emulated.count(Phase::Csr))) +
                     3 * int(emulated.count(Phase::CheckTopk)) + int(emulated.count(Phase::Delta)) +
                     (c.sink ? int(emulated.count(Phase::DSink)) : 0);
    EXPECT_EQ(n, want) << "emulated launches";
  }
}

std::vector<EmuCase> cases() {
  using K = ref::TopkKind;
  Case strided{6, 16, 70, 64, 32, true, K::Uniform, true};
  strided.strided = true;
  Case dkv_fp32{7, 16, 60, 96, 0, true, K::Uniform, false, true, LseKind::Base2Incl};
  dkv_fp32.dkv_fp32 = dkv_fp32.strided = dkv_fp32.huge_sink = true;
  Case long_t{260, 16, 40, 32, 0, true, K::Uniform};
  long_t.neg_inf_sink = true;
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
      // dkv in fp32 (gather's other output), strided; head 0's sink 1.475e20 under a base-2 lse (rounded to fp32, the
      // lse lands below the sink: d_sink's clamp).
      {dkv_fp32, {}},
      // More tokens than d_sink's block has work-items; two heads' sink -inf, the last token without a slot.
      {long_t, {}},
  };
}

// Every HIP kernel emulated, at MFMA K 16 (gfx90a, gfx942); csr's sort between its two kernels is a stand-in for
// rocPRIM's. The memory-bound bodies are CUDA's sources, here at AMD's geometry (64-lane wavefronts, each two of the
// kernels' 32-lane warps: the shuffles' width).
TEST(AmdEmulated, EveryHipKernelAtMfmaK16MatchesTheCpuPhasesAndFloat64) {
  run_cases(cases(), false,
            {Phase::CheckTopk, Phase::Csr, Phase::Delta, Phase::Dq, Phase::DkvInterm, Phase::Gather, Phase::DSink});
}

// The matrix phases again at gfx950's MFMA K 32 (the other phases' kernels do not depend on the target).
TEST(AmdEmulated, DqAndDkvIntermAtMfmaK32OfGfx950MatchTheCpuPhasesAndFloat64) {
  run_cases(cases(), true, {Phase::Dq, Phase::DkvInterm});
}

}  // namespace
}  // namespace smla::test
