// smla-bench: runs the backward through the public API on random inputs with the contract's
// benchmark top-k; times it (device events on a GPU, median of repeats after warm-up) and, with
// --check, compares dq, dkv and d_sink with the float64 reference. With several dq or dkv_interm bodies
// (--dq-impl 2,3, --dkv-impl 2,3: every pair) it plans each on the same tensors and times them in alternating
// rounds in this one process, printing each one's time and its ratio to the first.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <sstream>

#include "cli_parse.hpp"  // beside this file
#include "tools/tool_main.hpp"
#include "tools/case_runner.hpp"
#include "tools/inputs_file.hpp"
#include "runtime/cuda/cublas_api.hpp"
#include "runtime/stats.hpp"
#include "smla/smla.hpp"
#include "tests/reference/reference.hpp"

namespace {

struct Options {
  std::string backend = "auto";
  std::string shape;
  std::string inputs_dir;  // --inputs-dir: the reference inputs kept between processes (tools/inputs_file.hpp)
  int64_t r_chunk = 0;
  int64_t t_chunk = 0;
  bool no_sink = false, check = false, json = false, breakdown = false, uniform = false;
  int warmup = -1, repeat = -1;
  int gemm_n = 8192;
  uint64_t seed = 1;
  std::vector<int> dq_impls{0};   // TileConfig::dq_impl of each plan to time (0: the planner's choice)
  std::vector<int> dkv_impls{0};  // TileConfig::dkv_impl likewise; the plans are every (dq, dkv) pair
  int rounds = 0;                // rounds (alternating when several bodies are timed); 0: 3 with several, else 1
  bool backends = false;         // --backends: print what each backend can do here, and stop
};

// What each backend can do here: usable (devices, target), can compile (with which compiler build: the cache key's
// identity, so two machines can be compared before a cache warmed on one is carried to the other). With --json, one
// JSON object {"backends": [...]} (the text lines were printed under --json too, which no JSON reader takes).
int print_backends(bool json) {
  smla::Runtime rt;
  nlohmann::json all = nlohmann::json::array();
  for (const smla::BackendStatus& b : rt.backends()) {
    if (json)
      all.push_back({{"name", b.name}, {"usable", b.usable}, {"can_compile", b.can_compile}, {"detail", b.detail}});
    else
      std::printf("%-5s usable=%d can_compile=%d  %s\n", b.name.c_str(), b.usable ? 1 : 0, b.can_compile ? 1 : 0,
                  b.detail.c_str());
  }
  if (json) std::printf("%s\n", smla::tools::json_text(nlohmann::json{{"backends", all}}).c_str());
  return 0;
}

double flops(const smla::Problem& p) { return 10.0 * p.T * p.H * p.topk * 512.0; }

using smla::median;

// One plan (one pair of dq and dkv_interm bodies) of the problem and what was measured with it.
struct Case {
  int dq_impl = 0, dkv_impl = 0;
  std::string label() const {
    return "dq_impl " + std::to_string(dq_impl) + (dkv_impl ? " dkv_impl " + std::to_string(dkv_impl) : "");
  }
  std::shared_ptr<const smla::Plan> plan;
  double plan_ms = 0, plan2_ms = 0;
  smla::tools::Outputs out;  // of the first run, made right after the outputs were poisoned
  std::map<std::string, std::string> out_last;  // digests of the outputs after the timed runs
  double ms = 0;  // median of the rounds' medians
  nlohmann::json j;
  bool pass = true;
};

// Milliseconds of one call of `work` on `stream`: device events on a GPU, the host clock elsewhere.
template <class F>
double timed_ms(bool gpu, void* stream, F&& work) {
  if (gpu) {
    smla::cuda::Event e0, e1;
    e0.record(static_cast<CUstream>(stream));
    work();
    e1.record(static_cast<CUstream>(stream));
    return e1.since(e0);
  }
  const auto t0 = std::chrono::steady_clock::now();
  work();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Median of `repeat` timed runs of the plan.
double median_run_ms(const Case& c, smla::tools::CaseRunner& cr, bool gpu, int repeat) {
  void* ws = cr.workspace(c.plan->workspace_bytes());
  std::vector<double> times;
  for (int i = 0; i < repeat; ++i)
    times.push_back(timed_ms(gpu, cr.stream(), [&] { c.plan->run(cr.tensors(), ws, c.plan->workspace_bytes(), cr.stream()); }));
  return median(times);
}

// --breakdown for one plan: each phase's time and share, and (GPU) every launch in order on one stream.
void breakdown(Case& c, smla::tools::CaseRunner& cr, bool gpu, const Options& o, int repeat) {
  nlohmann::json& j = c.j;
  const double ms = c.ms;
  smla::Tensors& t = cr.tensors();
  void* ws = cr.workspace(c.plan->workspace_bytes());
  void* s = cr.stream();
  const auto& plan = c.plan;
  // Each launch timed inside whole runs of the pipeline (events between launches), so phases
  // that update the workspace in place (the csr scan, chunk carries) see the state they expect.
  const size_t n = plan->launch_count();
  std::vector<std::vector<double>> per(n);
  for (int r = 0; r < std::max(3, repeat / 2); ++r) {
    if (gpu) {
      std::vector<std::unique_ptr<smla::cuda::Event>> ev(n + 1);
      for (auto& e : ev) e = std::make_unique<smla::cuda::Event>();
      ev[0]->record(static_cast<CUstream>(s));
      for (size_t i = 0; i < n; ++i) {
        plan->run_launch(i, t, ws, plan->workspace_bytes(), s);
        ev[i + 1]->record(static_cast<CUstream>(s));
      }
      for (size_t i = 0; i < n; ++i) per[i].push_back(ev[i + 1]->since(*ev[i]));
    } else {
      for (size_t i = 0; i < n; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        plan->run_launch(i, t, ws, plan->workspace_bytes(), s);
        per[i].push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
    }
  }
  std::map<std::string, double> phase_ms;
  std::vector<std::string> order;
  for (size_t i = 0; i < n; ++i) {
    const std::string ph = plan->launch_phase(i);
    if (!phase_ms.count(ph)) order.push_back(ph);
    phase_ms[ph] += median(per[i]);
  }
  double sum = 0;
  for (auto& kv : phase_ms) sum += kv.second;
  if (!o.json) std::printf("%-12s %10s %7s\n", "phase", "ms", "share");
  for (const auto& ph : order) {
    j["phases"][ph] = phase_ms[ph];
    if (!o.json) std::printf("%-12s %10.3f %6.1f%%\n", ph.c_str(), phase_ms[ph], 100.0 * phase_ms[ph] / sum);
  }
  if (!o.json) std::printf("%-12s %10.3f (sum of phases; end to end %.3f ms)\n", "total", sum, ms);
  if (gpu) {
    // The same launches in order on the one stream (no side stream), timed like `ms`: what
    // running csr beside the other phases saves, measured in this process.
    std::vector<double> in_order;
    for (int r = 0; r < repeat; ++r)
      in_order.push_back(timed_ms(gpu, s, [&] {
        for (size_t i = 0; i < n; ++i) plan->run_launch(i, t, ws, plan->workspace_bytes(), s);
      }));
    j["in_order_ms"] = median(in_order);
    if (!o.json) std::printf("%-12s %10.3f ms (every launch in order on one stream)\n", "in order", median(in_order));
  }
}

// The ceiling to compare with: a dense bf16 GEMM (cuBLAS, fp32 accumulation) measured once in this
// process on the run's stream, after the op, so both see the same clocks and device state; the
// fraction and the end-to-end line of every plan.
void report_gemm(std::vector<Case>& cases, smla::tools::CaseRunner& cr, bool gpu, const Options& o, double flop) {
  std::string why;
  std::optional<smla::cuda::GemmRate> gemm;
  if (gpu)
    gemm = smla::cuda::dense_gemm_rate(o.gemm_n, static_cast<CUstream>(cr.stream()), &why);
  else
    why = "the " + cases.front().plan->info().backend + " backend ran: the reference is a cuBLAS GEMM on a CUDA device";
  for (Case& c : cases) {
    nlohmann::json& j = c.j;
    const double ms = c.ms, tflops = flop / (ms * 1e-3) / 1e12;
    j["gemm_n"] = o.gemm_n;
    j["gemm_tflops"] = gemm ? nlohmann::json(gemm->tflops) : nlohmann::json();
    j["gemm_fraction"] = gemm ? nlohmann::json(tflops / gemm->tflops) : nlohmann::json();
    if (gemm) {
      j["gemm_ms"] = gemm->ms;
      j["gemm_library"] = gemm->library;
    } else {
      j["gemm_why"] = why;
    }
    if (!o.json) {
      if (gemm) {
        std::printf("%-12s %10.3f ms, %.1f TFLOP/s, %.1f%% of the dense GEMM rate (%s)\n", "end to end", ms,
                    tflops, 100.0 * tflops / gemm->tflops, c.label().c_str());
        if (&c == &cases.back())
          std::printf("%-12s %10.3f ms, %.1f TFLOP/s (bf16 %dx%dx%d, fp32 accumulation, median of %d; %s)\n",
                      "dense GEMM", gemm->ms, gemm->tflops, gemm->n, gemm->n, gemm->n, gemm->repeats,
                      gemm->library.c_str());
      } else {
        std::printf("%-12s %10.3f ms, %.3g TFLOP/s (%s)\n", "end to end", ms, tflops, c.label().c_str());
        if (&c == &cases.back()) std::printf("dense GEMM rate: not measured (%s)\n", why.c_str());
      }
    }
  }
}

int run(const Options& o) {
  smla::Runtime rt;
  smla::Problem p;
  // Its tensors live in host memory or CUDA memory (CaseRunner): the HIP backend, never run on an AMD GPU in this
  // workplace, is not one it can feed. auto is CUDA where usable, else the CPU (not HIP, which would refuse them).
  if (o.backend == "hip")
    throw smla::Error(smla::Status::Unsupported,
                      "--backend hip: smla-bench makes its tensors in host or CUDA memory only (the HIP backend is "
                      "compiled and checked offline here, never run); use --backend cpu or cuda");
  const bool cuda_here = rt.resolve(smla::BackendKind::Auto) == smla::BackendKind::Cuda;
  p.backend = o.backend == "cuda" || (o.backend == "auto" && cuda_here) ? smla::BackendKind::Cuda
                                                                        : smla::BackendKind::Cpu;
  const bool gpu = p.backend == smla::BackendKind::Cuda;
  // The bodies are the GPU's: the CPU backend has one a phase, and would time it under each label.
  for (const auto& [option, impls] : {std::pair{"--dq-impl", &o.dq_impls}, std::pair{"--dkv-impl", &o.dkv_impls}})
    if (!gpu && std::any_of(impls->begin(), impls->end(), [](int i) { return i != 0; }))
      throw smla::Error(smla::Status::InvalidArgument,
                        std::string(option) + " names GPU kernel bodies, and the " + smla::backend_name(p.backend) +
                            " backend runs its one body for each phase, whatever the label: time them with "
                            "--backend cuda (0, the planner's choice, is the CPU's body; 0,0 times it twice)");
  std::string shape = o.shape.empty() ? (gpu ? "4096,128,5120,512" : "256,16,320,160") : o.shape;
  smla::tools::set_one_shape(p, shape);
  p.has_sink = !o.no_sink;
  p.r_chunk = o.r_chunk;
  p.t_chunk = o.t_chunk;

  // One plan per (dq body, dkv_interm body) pair asked for (a body that cannot run here fails with the planner's
  // reason).
  std::vector<Case> cases;
  for (int impl : o.dq_impls)
    for (int dkv : o.dkv_impls) {
      Case c;
      c.dq_impl = impl, c.dkv_impl = dkv;
      smla::TileConfig cfg;
      cfg.dq_impl = impl, cfg.dkv_impl = dkv;
      // Both 0 plans as a user would (the tuning database may answer); otherwise it asks for those bodies.
      auto make = [&] { return impl || dkv ? rt.plan(p, cfg) : rt.plan(p); };
      c.plan_ms = timed_ms(false, nullptr, [&] { c.plan = make(); });
      c.plan2_ms = timed_ms(false, nullptr, [&] { make(); });  // served by the in-process cache
      cases.push_back(std::move(c));
    }

  // Wall seconds of each stage of this process (JSON "stage_s"): where a slow benchmark process spends its time.
  nlohmann::json stage_s;
  auto stage_t0 = std::chrono::steady_clock::now();
  auto stage = [&](const char* name) {
    const auto now = std::chrono::steady_clock::now();
    stage_s[name] = std::chrono::duration<double>(now - stage_t0).count();
    stage_t0 = now;
  };
  smla::tools::InputsSource inputs_source;
  smla::ref::Inputs in = smla::tools::inputs_via_file(
      o.inputs_dir, int(p.T), int(p.H), int(p.num_kv), int(p.topk), p.has_sink, o.seed,
      o.uniform ? smla::ref::TopkKind::Uniform : smla::ref::TopkKind::Benchmark, &inputs_source);
  if (!inputs_source.note.empty()) std::fprintf(stderr, "smla-bench: inputs: %s\n", inputs_source.note.c_str());
  stage("inputs");
  smla::tools::CaseRunner cr(p, in);
  stage("upload");
  smla::Tensors& t = cr.tensors();
  const size_t nq = size_t(p.T) * p.H * 512, nkv = size_t(p.num_kv) * 512;

  // Test only (ctest SmlaBench.ACheckThatFailsExitsOne): SMLA_BENCH_TEST_FAULT=dq, dkv or d_sink makes that output of
  // each checked run wrong (its first element NaN), =repeat makes the timed runs' outputs read as different, so that
  // the test sees --check fail on each count. Named in no help text; it changes what is checked, never a kernel, and
  // says so on stderr.
  const char* fault_env = std::getenv("SMLA_BENCH_TEST_FAULT");
  const std::string fault = fault_env ? fault_env : "";
  if (!fault.empty()) {
    if (fault != "dq" && fault != "dkv" && fault != "d_sink" && fault != "repeat")
      throw smla::Error(smla::Status::InvalidArgument,
                        "SMLA_BENCH_TEST_FAULT=" + fault + ": expected dq, dkv, d_sink or repeat (a test's fault)");
    std::fprintf(stderr, "smla-bench: SMLA_BENCH_TEST_FAULT=%s: outputs made wrong on purpose (a test)\n", fault.c_str());
  }
  auto read_outputs = [&] {  // (the same fault in the timed runs' outputs: only the output's own check sees it)
    smla::tools::Outputs out = cr.read_outputs();
    if (fault == "dq" && !out.dq.empty()) out.dq[0] = 0x7fc0;  // bf16 NaN
    if (fault == "dkv" && !out.dkv.empty()) out.dkv[0] = 0x7fc0;
    if (fault == "d_sink" && !out.d_sink.empty()) out.d_sink[0] = std::numeric_limits<float>::quiet_NaN();
    return out;
  };
  // First run of each plan: the one checked (outputs were poisoned just before it).
  // Each on a poisoned workspace too: a plan after the first would otherwise start on what the one before left there
  // (P, dS, interm, the csr), and one that did not write some of it would pass on the other's.
  for (Case& c : cases) {
    c.plan->run(t, cr.poisoned_for_run(c.plan->workspace_bytes()), c.plan->workspace_bytes(), cr.stream());
    c.out = read_outputs();
  }
  stage("first_runs");

  const int warmup = o.warmup >= 0 ? o.warmup : (gpu ? 5 : 0);
  const int repeat = o.repeat > 0 ? o.repeat : (gpu ? 20 : 3);
  // Rounds alternate the plans, so that clock and thermal drift fall on each of them.
  // (A --rounds given is honoured with one plan too: it was dropped there without a word, and the JSON said 1.)
  const int rounds = o.rounds > 0 ? o.rounds : cases.size() > 1 ? 3 : 1;
  for (int r = 0; r < rounds; ++r)
    for (Case& c : cases) {
      if (r == 0) median_run_ms(c, cr, gpu, warmup);
      c.j["round_ms"].push_back(median_run_ms(c, cr, gpu, repeat));
    }
  for (Case& c : cases) c.ms = median(c.j["round_ms"].get<std::vector<double>>());
  stage("timing");
  // The outputs of the timed runs: the last of them read back (each plan's, run once more after the other plans'
  // rounds) and compared bitwise with the first, checked run's. The first run alone was read, so a body that did less
  // on later runs (state left in the workspace by the first) was timed at the lower cost and still passed --check.
  // Outputs poisoned before that run (with one plan there was none: the buffers still held the first run's results,
  // and a later run that wrote nothing compared equal).
  // The workspace poisoned as well: a body that reads what an earlier run left there, instead of writing it, gives
  // other outputs on it.
  for (Case& c : cases) {
    c.plan->run(t, cr.poisoned_for_run(c.plan->workspace_bytes()), c.plan->workspace_bytes(), cr.stream());
    c.out_last = smla::tools::output_digests(read_outputs());
    if (fault == "repeat") c.out_last["dq"] = "0000000000000000";
  }
  stage("read_back");
  if (o.breakdown) {
    for (Case& c : cases) {
      if (cases.size() > 1 && !o.json) std::printf("== %s\n", c.label().c_str());
      breakdown(c, cr, gpu, o, repeat);
    }
    report_gemm(cases, cr, gpu, o, flops(p));
    stage("breakdown_and_gemm");
  }

  std::optional<smla::ref::Grads> g;
  if (o.check) {
    g = smla::ref::backward(in);
    stage("reference");
  }
  bool pass = true;
  for (Case& c : cases) {
    const smla::PlanInfo& info = c.plan->info();
    nlohmann::json& j = c.j;
    const double ms = c.ms;
    const double tflops = flops(p) / (ms * 1e-3) / 1e12;
    j["backend"] = info.backend;
    j["target"] = info.target;
    j["T"] = p.T, j["H"] = p.H, j["num_kv"] = p.num_kv, j["topk"] = p.topk;
    j["r_chunk"] = info.r_chunk, j["n_chunks"] = info.n_chunks, j["sink"] = p.has_sink;
    j["t_chunk"] = info.t_chunk, j["t_chunks"] = info.t_chunks;
    j["config"] = info.config_source;
    j["dq_impl"] = c.dq_impl, j["dkv_impl"] = c.dkv_impl;
    j["ms"] = ms, j["tflops"] = tflops, j["repeats"] = repeat, j["rounds"] = rounds;
    j["plan_ms"] = c.plan_ms, j["plan2_ms"] = c.plan2_ms, j["compiled"] = info.compiled;
    j["loaded_from_disk"] = info.loaded_from_disk;
    j["stage_s"] = stage_s;
    j["out_xxh64"] = smla::tools::output_digests(c.out);  // the first (checked) run's outputs, bitwise
    // The timed runs left the checked outputs, bit for bit; with --check a run that did not fails.
    j["out_xxh64_last"] = c.out_last;
    const bool repeat_bitwise = c.out_last == j["out_xxh64"].get<std::map<std::string, std::string>>();
    j["repeat_bitwise"] = repeat_bitwise;
    if (!repeat_bitwise)
      std::fprintf(stderr, "smla-bench: %s: the outputs after the timed runs differ from the first (checked) run's\n",
                   c.label().c_str());
    j["inputs_from_file"] = inputs_source.from_file;
    // What made the inputs and the timing, so that two records say whether they are comparable (out_xxh64 is compared
    // across processes and builds): the seed, the top-k's kind, the device's class and the warm-up runs.
    j["seed"] = o.seed;
    j["topk_kind"] = o.uniform ? "uniform" : "benchmark";
    j["device_class"] = info.device_class;
    j["warmup"] = warmup;
    if (cases.size() > 1) j["ratio_to_first"] = ms / cases[0].ms;
    if (g) {
      auto report = [&](const char* name, const smla::ref::Compare& cmp) {
        j["rel_err"][name] = cmp.rel_err;
        j["cosine"][name] = cmp.cosine;
        j["unwritten"][name] = cmp.unwritten;
        const bool ok = smla::ref::meets_bar(cmp);
        c.pass = c.pass && ok;
        if (!o.json)
          std::printf("check %-6s rel_err %.3e  cosine %.6f  finite %s  unwritten %zu  %s\n", name, cmp.rel_err,
                      cmp.cosine, cmp.finite ? "yes" : "NO", cmp.unwritten, ok ? "ok" : "FAIL");
      };
      report("dq", smla::ref::compare(g->dq, c.out.dq.data(), nq));
      report("dkv", smla::ref::compare(g->dkv, c.out.dkv.data(), nkv));
      if (p.has_sink) report("d_sink", smla::ref::compare(g->d_sink, c.out.d_sink.data(), p.H));
      c.pass = c.pass && repeat_bitwise;
      j["pass"] = c.pass;
      pass = pass && c.pass;
    }
    if (o.json) {
      std::printf("%s\n", smla::tools::json_text(j).c_str());
    } else {
      std::printf("smla %s (%s) T=%lld H=%lld num_kv=%lld topk=%lld r_chunk=%lld t_chunk=%lld%s %s: %.3f ms, %.3g TFLOP/s "
                  "(median of %d rounds of %d; %s config; plan %.1f ms, %d compiled, %d from disk; second plan "
                  "%.2f ms)%s\n",
                  info.backend.c_str(), info.target.c_str(), (long long)p.T, (long long)p.H, (long long)p.num_kv,
                  (long long)p.topk, (long long)info.r_chunk, (long long)info.t_chunk, p.has_sink ? " sink" : "", c.label().c_str(), ms, tflops,
                  rounds, repeat, info.config_source.c_str(), c.plan_ms, info.compiled, info.loaded_from_disk,
                  c.plan2_ms,
                  cases.size() > 1 ? (" ratio to the first " + std::to_string(j["ratio_to_first"].get<double>())).c_str()
                                   : "");
    }
  }
  return pass ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"smla-bench: time and check the sparse-MLA backward"};
  Options o;
  app.add_option("--backend", o.backend, "auto (CUDA where usable, else the CPU) | cuda | cpu; hip is refused: "
                 "its tensors would be host memory")
      ->check(CLI::IsMember({"auto", "cuda", "cpu", "hip"}));
  app.add_option("--shape", o.shape, "T,H,NUM_KV,TOPK (default: 4096,128,5120,512 on a GPU, 256,16,320,160 on the CPU)")
      ->check(smla::tools::non_empty_value());
  app.add_option("--r-chunk", o.r_chunk, "R_CHUNK: top-k slots a chunk (0: the planner's choice, all of them)")
      ->transform(smla::tools::decimal(o.r_chunk));
  app.add_option("--t-chunk", o.t_chunk, "tokens a chunk (0: the planner's choice: as few equal chunks as the interm budget allows)")
      ->transform(smla::tools::decimal(o.t_chunk));
  app.add_flag("--no-sink", o.no_sink, "run without attn_sink");
  app.add_flag("--check", o.check, "compare with the float64 reference (exit 1 when off the bar)");
  app.add_flag("--json", o.json, "one JSON object per run on its own line");
  CLI::Option* breakdown = app.add_flag(
      "--breakdown", o.breakdown,
      "time each phase on its own, and compare end to end with a dense bf16 GEMM (cuBLAS) timed here");
  app.add_option("--gemm-n", o.gemm_n, "size n of the n x n x n GEMM of --breakdown")
      ->transform(smla::tools::decimal(o.gemm_n))
      ->check(CLI::Range(16, 32768))
      ->needs(breakdown);  // without it no GEMM runs: the option was ignored, silently
  app.add_flag("--uniform", o.uniform, "uniform random top-k instead of the benchmark top-k");
  app.add_option("--warmup", o.warmup, "warm-up runs (default 5 on a GPU, 0 on the CPU)")
      ->transform(smla::tools::decimal(o.warmup))
      ->check(CLI::Range(0, 1000000));
  app.add_option("--repeat", o.repeat, "timed runs (default 20 on a GPU, 3 on the CPU)")
      ->transform(smla::tools::decimal(o.repeat))
      ->check(CLI::Range(1, 1000000));
  app.add_option("--seed", o.seed, "random seed of the inputs")->transform(smla::tools::decimal(o.seed));
  app.add_option("--inputs-dir", o.inputs_dir,
                 "keep the random inputs (and their float64 forward) in this directory and read them back in later "
                 "processes with the same problem and seed: most of a large shape's process time otherwise")
      ->check(smla::tools::non_empty_path());
  app.add_option("--dq-impl", o.dq_impls,
                 "dq bodies to plan and time on the same tensors, comma-separated: 0 the planner's choice, 1 mma.sync, "
                 "2 wgmma, 3 wgmma with a producer warpgroup, 4 the same persistent (the planner's on sm_90a: at H 128, 4 "
                 "at one top-k chunk of 256 slots or fewer, else 3; at H 64, 3; at H 16 and 32, 1) (several: timed in "
                 "alternating rounds, each with its ratio to the first); the GPU's: on the CPU backend only 0")
      ->delimiter(',')
      ->transform(smla::tools::decimal(o.dq_impls))
      ->check(CLI::Range(0, smla::TileConfig::kMaxDqImpl));
  app.add_option("--dkv-impl", o.dkv_impls,
                 "dkv_interm bodies likewise: 0 the planner's choice, 1 mma.sync, 2 wgmma, 3 wgmma with a producer "
                 "warpgroup, 4 fused into dq (H 64, with dq_impl 3: dq writes interm, no dkv_interm kernel) (with "
                 "several --dq-impl: every pair)")
      ->delimiter(',')
      ->transform(smla::tools::decimal(o.dkv_impls))
      ->check(CLI::Range(0, smla::TileConfig::kMaxDkvImpl));
  app.add_option("--rounds", o.rounds,
                 "rounds of --repeat runs, alternating the plans when several are timed; the time is the median of "
                 "the rounds' medians (default 3 with several plans, else 1)")
      ->transform(smla::tools::decimal(o.rounds))
      ->check(CLI::Range(1, 100));
  CLI::Option* backends = app.add_flag(
      "--backends", o.backends,
      "print each backend's status (devices, target, compiler identity as in the cache keys) and exit (with --json: "
      "one JSON object)");
  // Nothing runs with --backends: an option of a run beside it was ignored without a word (exit 0).
  for (CLI::Option* opt : app.get_options())
    if (opt != backends && opt->get_name() != "--json" && opt->get_name() != "--help") backends->excludes(opt);
  SMLA_TOOL_PARSE(app, argc, argv);
  if (!smla::tools::list_items_ok(argc, argv, {"--dq-impl", "--dkv-impl"})) return 2;
  if (o.backends) return smla::tools::run_tool("smla-bench", [&] { return print_backends(o.json); }, 2, o.json);
  return smla::tools::run_tool("smla-bench", [&] { return run(o); }, 2, o.json);
}
