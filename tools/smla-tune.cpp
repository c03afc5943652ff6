// smla-tune: on the CUDA GPU present, tries the legal tile configs of each problem, checks each
// against the float64 reference at the contract's bar on a small T (a fast wrong config never
// wins), times the survivors at the real T with device events (warm-up, median), and stores the
// winner in the tuning database. The planner's heuristic config is always a candidate, so the
// stored config is never slower than it in the same run.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <charconv>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "cli_parse.hpp"  // beside this file
#include "tools/tool_main.hpp"
#include "cache/kernel_cache.hpp"
#include "runtime/bf16.hpp"
#include "runtime/cuda/kernels_cuda.hpp"
#include "runtime/env.hpp"
#include "runtime/planner.hpp"
#include "runtime/sources.hpp"
#include "runtime/stats.hpp"
#include "runtime/tuning_db.hpp"
#include "runtime/warmup.hpp"
#include "smla/smla.hpp"
#include "tests/reference/reference.hpp"
#include "tools/case_runner.hpp"
#include "tools/tune_check.hpp"

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::vector<std::string> shapes;
  std::string json_file;
  std::string sink = "on";
  double max_seconds = 540;
  int check_t = 257, warmup = 3, repeat = 10;
  bool json = false, no_store = false;
  std::string tuning_db;
  uint64_t seed = 1;
};

struct Candidate {
  smla::TileConfig cfg;      // what plan() is given (all zero for the heuristic)
  smla::TileConfig resolved; // the tiles it resolves to (for the table and deduplication)
  bool heuristic = false;
  std::string state = "untried";  // untried | rejected | wrong | timed
  std::string detail;
  double ms = 0;
};

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

using smla::median;  // of an even --repeat (the default 10) it was the upper middle time, as smla-bench's was

long long define_of(const smla::KernelSpec& k, const char* name) {
  for (const auto& d : k.defines)
    if (d.first == name) return d.second;
  return 0;
}

// The tiles a config resolves to on this problem, read off the kernels it would launch.
smla::TileConfig resolve(const smla::Problem& p, const smla::TileConfig& cfg, size_t budget, const std::string& target) {
  const smla::ShapeInfo s = smla::shape_with_config(p, &cfg, budget, target);
  const smla::KernelSpec dq = smla::cuda_phase_kernels(smla::Phase::Dq, s).at(0);
  const std::vector<smla::KernelSpec> dkvs = smla::cuda_phase_kernels(smla::Phase::DkvInterm, s);
  smla::TileConfig r;
  r.dq_block_h = int(define_of(dq, "BLOCK_H"));
  r.dq_block_r = int(define_of(dq, "BLOCK_R"));
  r.dkv_impl = smla::cuda_dkv_impl(s);
  if (!dkvs.empty()) {  // (dkv_impl 4: dq writes interm, no dkv_interm kernel and no dkv tile)
    r.dkv_block_r = int(define_of(dkvs.front(), "BLOCK_R"));
    r.dkv_block_d = int(define_of(dkvs.front(), "BLOCK_D"));
  }
  r.r_chunk = s.r_chunk;
  r.dq_impl = define_of(dq, "DQW_PERSIST")    ? 4
              : define_of(dq, "DQW_PRODUCER") ? 3
              : define_of(dq, "DQ_WGMMA")     ? 2
                                              : 1;
  return r;
}

// A body's name in the labels: wgmmaN for the warpgroup-MMA bodies (dq_impl / dkv_impl N >= 2), mma for mma.sync.
std::string body_name(int impl) { return impl >= 2 ? "wgmma" + std::to_string(impl) : "mma   "; }

std::string label(const smla::TileConfig& c) {
  char b[128];
  std::snprintf(b, sizeof(b), "dq %s %2dx%-3d dkv %s %3dx%-3d rc %lld", body_name(c.dq_impl).c_str(), c.dq_block_h,
                c.dq_block_r, body_name(c.dkv_impl).c_str(), c.dkv_block_r, c.dkv_block_d, (long long)c.r_chunk);
  return b;
}

// Legal candidates: the grid of tiles x r_chunk (divisors of topk, multiples of 16; any of them holds at every T
// that looks the config up, since past the interm budget the planner splits the tokens), filtered by
// cuda_shape_supported. The heuristic comes first, then the largest r_chunk first (fewest top-k chunks, the
// likeliest winners: each further one costs dq a second pass, perf notes v20), so a --max-seconds cut drops the
// unlikely ones.
std::vector<Candidate> candidates(const smla::Problem& p, size_t budget, const std::string& target) {
  std::vector<Candidate> out;
  Candidate h;
  h.heuristic = true;
  h.resolved = resolve(p, h.cfg, budget, target);
  out.push_back(h);
  for (int64_t rc = p.topk / 16 * 16; rc >= 16; rc -= 16) {
    if (p.topk % rc) continue;
    if (p.r_chunk && rc != p.r_chunk) continue;  // the caller fixed r_chunk
    for (int impl : {3, 4, 2, 1})  // dq body: wgmma with a producer, the same persistent (faster than 3 only at small
                                   // top-k: perf notes v15), wgmma without a producer (sm_90a only; one tile, 64 x 32),
                                   // mma.sync
      for (int dimpl : {4, 3, 2, 1})  // dkv body: fused into dq (sm_90a, H 64, dq_impl 3; no dkv tile), wgmma with
                                        // and without a producer (sm_90a, H % 32 == 0; only their 64 x 256 tile
                                        // passes), mma.sync
        for (int bh : {16, 32, 64})
          for (int br : {32, 64})
            for (int kr : {32, 64, 128})
              for (int kd : {64, 128, 256}) {
                Candidate c;
                c.cfg = smla::TileConfig{bh, br, kr, kd, rc, impl, dimpl};
                if (!smla::cuda_shape_supported(smla::shape_with_config(p, &c.cfg, budget, target), nullptr)) continue;
                c.resolved = resolve(p, c.cfg, budget, target);
                // Each resolved config once (the heuristic's included): the fused dkv has no dkv tile, so every kr x
                // kd of it is the same plan.
                if (std::any_of(out.begin(), out.end(), [&](const Candidate& o) { return o.resolved == c.resolved; }))
                  continue;
                out.push_back(c);
              }
  }
  return out;
}

// Timing inputs at the real T: random bf16 tensors and the benchmark top-k. o and lse need not
// match (the check runs on the small problem), so the float64 forward is skipped here.
smla::ref::Inputs timing_inputs(const smla::Problem& p, uint64_t seed) {
  smla::ref::Inputs in;
  in.T = int(p.T), in.H = int(p.H), in.num_kv = int(p.num_kv), in.topk_n = int(p.topk);
  in.has_sink = p.has_sink;
  in.scale = float(1.0 / std::sqrt(512.0));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 0.5f);
  auto fill = [&](std::vector<uint16_t>& v, size_t n) {
    v.resize(n);
    for (auto& x : v) x = smla::float_to_bf16(nd(rng));
  };
  const size_t nq = size_t(p.T) * p.H * 512;
  fill(in.q, nq);
  fill(in.o, nq);
  fill(in.dout, nq);
  fill(in.kv, size_t(p.num_kv) * 512);
  in.lse.assign(size_t(p.T) * p.H, float(std::log(double(p.topk))));
  in.topk = smla::ref::benchmark_topk(int(p.T), int(p.num_kv), int(p.topk), seed);
  if (p.has_sink) in.sink.assign(size_t(p.H), 0.f);
  return in;
}

double time_config(smla::Runtime& rt, const smla::Problem& p, const smla::TileConfig& cfg,
                   smla::tools::CaseRunner& cr, const Options& o) {
  auto plan = rt.plan(p, cfg);
  void* ws = cr.workspace(plan->workspace_bytes());
  const size_t wsb = cr.workspace_size();
  const auto s = static_cast<CUstream>(cr.stream());
  for (int i = 0; i < o.warmup; ++i) plan->run(cr.tensors(), ws, wsb, s);
  std::vector<double> ms;
  for (int i = 0; i < o.repeat; ++i) {
    smla::cuda::Event e0, e1;
    e0.record(s);
    plan->run(cr.tensors(), ws, wsb, s);
    e1.record(s);
    ms.push_back(e1.since(e0));
  }
  return median(ms);
}

nlohmann::json cfg_json(const smla::TileConfig& c) {
  return {{"dq_block_h", c.dq_block_h}, {"dq_block_r", c.dq_block_r}, {"dkv_block_r", c.dkv_block_r},
          {"dkv_block_d", c.dkv_block_d}, {"r_chunk", c.r_chunk}, {"dq_impl", c.dq_impl},
          {"dkv_impl", c.dkv_impl}};
}

nlohmann::json tune_one(smla::Runtime& rt, smla::TuningDb& db, smla::Problem p, const Options& o) {
  const auto t0 = Clock::now();
  const size_t budget = smla::runtime_env().interm_budget;
  const smla::PlanInfo probe = rt.plan(p, smla::TileConfig{})->info();
  const std::string target = probe.target, device_class = probe.device_class;
  std::vector<Candidate> cands = candidates(p, budget, target);
  std::fprintf(stderr, "smla-tune: T=%lld H=%lld num_kv=%lld topk=%lld%s on %s: %zu candidates\n", (long long)p.T,
               (long long)p.H, (long long)p.num_kv, (long long)p.topk, p.has_sink ? " sink" : "",
               device_class.c_str(), cands.size());

  // Compile every candidate's kernels at once, in parallel, into the user cache plan() reads; not where the
  // environment says that cache is not to be written (the warm-up writes whatever it is given): plan() then compiles
  // each one itself, as it would.
  const smla::cache::Settings cs = smla::cache::settings_from_env();
  if (cs.readonly || cs.disable) {
    std::fprintf(stderr, "smla-tune: no parallel precompile (%s=1: the user cache is not written)\n",
                 cs.disable ? "SMLA_CACHE_DISABLE" : "SMLA_CACHE_READONLY");
  } else {
    smla::WarmupOptions w;
    w.out_dir = cs.dir;
    w.interm_budget = budget;
    for (const Candidate& c : cands) w.configs.push_back(c.cfg);
    try {
      const smla::WarmupResult wr = smla::warm_kernels({p}, {target}, w);
      std::fprintf(stderr, "smla-tune: kernels compiled %d, cached %d, failed %d (%.1f s)\n", wr.compiled, wr.cached,
                   wr.failed, wr.seconds);
    } catch (const smla::Error& e) {  // e.g. an unwritable cache: plan() then compiles each one itself
      std::fprintf(stderr, "smla-tune: no parallel precompile (%s)\n", e.message().c_str());
    }
  }

  smla::tools::TuneChecker checker(p, o.check_t, o.seed + 1);
  const smla::ref::Inputs tin = timing_inputs(p, o.seed);
  std::vector<float> tlse = tin.lse;
  smla::tools::CaseRunner timer(p, tin, &tlse);
  size_t tried = 0;
  for (Candidate& c : cands) {
    if (!c.heuristic && seconds_since(t0) > o.max_seconds) break;  // the heuristic is always measured
    ++tried;
    try {
      const std::string bad = checker.check([&](const smla::Problem& q) { return rt.plan(q, c.cfg); });
      if (!bad.empty()) {
        c.state = "wrong";
        c.detail = bad;
      } else {
        c.ms = time_config(rt, p, c.cfg, timer, o);
        c.state = "timed";
      }
    } catch (const smla::Error& e) {
      c.state = "rejected";
      c.detail = e.message().substr(0, e.message().find('\n'));
    }
    std::fprintf(stderr, "[%zu/%zu] %s%s: %s %s\n", tried, cands.size(), label(c.resolved).c_str(),
                 c.heuristic ? " (heuristic)" : "", c.state.c_str(),
                 c.state == "timed" ? (std::to_string(c.ms) + " ms").c_str() : c.detail.c_str());
  }

  const Candidate& h = cands[0];
  const Candidate* best = nullptr;
  for (const Candidate& c : cands)
    if (c.state == "timed" && (!best || c.ms < best->ms)) best = &c;
  nlohmann::json j{{"T", p.T},       {"H", p.H},        {"num_kv", p.num_kv}, {"topk", p.topk},
                   {"sink", p.has_sink}, {"target", target}, {"device", device_class}, {"candidates", cands.size()}, {"tried", tried}};
  j["wrong"] = std::count_if(cands.begin(), cands.end(), [](const Candidate& c) { return c.state == "wrong"; });
  j["rejected"] = std::count_if(cands.begin(), cands.end(), [](const Candidate& c) { return c.state == "rejected"; });
  j["heuristic"] = {{"config", cfg_json(h.resolved)}, {"state", h.state}, {"ms", h.ms}};
  if (!h.detail.empty()) j["heuristic"]["detail"] = h.detail;
  const size_t others_timed = size_t(
      std::count_if(cands.begin() + 1, cands.end(), [](const Candidate& c) { return c.state == "timed"; }));
  // A heuristic that is wrong or cannot run fails the problem (exit 1): every untuned plan() runs it.
  const std::string herr = smla::tune_heuristic_error(label(h.resolved), h.state, h.detail, others_timed);
  if (!herr.empty()) {
    j["error"] = herr;
    if (o.json) std::fprintf(stderr, "smla-tune: error: %s\n", herr.c_str());  // else in the summary below
  } else {
    j["tuned"] = {{"config", cfg_json(best->resolved)}, {"ms", best->ms}, {"is_heuristic", best->heuristic}};
    j["ratio"] = best->ms / h.ms;
    if (!o.no_store) {
      smla::TuningEntry e;
      e.config = best->cfg;  // the heuristic is stored as all-zero: "the planner's choice"
      e.ms = best->ms;
      e.heuristic_ms = h.ms;
      e.T_tuned = p.T;
      e.num_kv_tuned = p.num_kv;
      db.store(device_class, p, e);
      j["stored"] = db.path();
    }
  }
  j["seconds"] = seconds_since(t0);

  if (!o.json) {
    std::vector<const Candidate*> timed;
    for (const Candidate& c : cands)
      if (c.state == "timed") timed.push_back(&c);
    std::sort(timed.begin(), timed.end(), [](const Candidate* a, const Candidate* b) { return a->ms < b->ms; });
    std::printf("\n%-4s %-44s %10s\n", "rank", "config", "ms");
    for (size_t i = 0; i < timed.size(); ++i)
      if (i < 10 || timed[i]->heuristic)
        std::printf("%-4zu %-44s %10.4f%s\n", i + 1, label(timed[i]->resolved).c_str(), timed[i]->ms,
                    timed[i]->heuristic ? "  <- heuristic" : "");
    if (herr.empty())
      std::printf("tuned %.4f ms vs heuristic %.4f ms: ratio tuned/heuristic %.3f (%zu of %zu tried, %d wrong, %d "
                  "rejected, %.0f s)%s\n",
                  best->ms, h.ms, best->ms / h.ms, tried, cands.size(), int(j["wrong"]), int(j["rejected"]),
                  double(j["seconds"]), o.no_store ? "" : (" -> " + db.path()).c_str());
    else
      std::printf("error: %s\n", herr.c_str());
  }
  return j;
}

// The problems to tune, every one checked before the first is tuned: a bad one in a range or a --json-file stopped
// the tool only when its turn came, after the problems before it had been tuned (with --json, printing none of them).
// Without --shape and --json-file, the seed shape, with --sink as a --shape takes it (it was tuned without a sink
// whatever --sink said, so that plan() of the seed problem, which has one, never found the entry).
std::vector<smla::Problem> gather(const Options& o) {
  const bool none_given = o.shapes.empty() && o.json_file.empty();
  std::vector<smla::Problem> out = smla::collect_problems(
      none_given ? std::vector<std::string>{"4096,128,5120,512"} : o.shapes, o.sink, o.json_file, false);
  if (out.empty()) throw smla::Error(smla::Status::InvalidArgument, "no problems in --json-file " + o.json_file);
  for (smla::Problem& p : out) {
    p.backend = smla::BackendKind::Cuda;
    smla::validate_problem(p);
    // r_chunk is one of the things tuned, and the database keys a problem without it: a shape's R_CHUNK narrowed the
    // candidates and then stored their winner as the whole problem class's, over an unrestricted one.
    if (p.r_chunk)
      throw smla::Error(smla::Status::InvalidArgument,
                        "smla-tune tunes r_chunk itself: " + smla::describe_problem(p) +
                            " gives one (R_CHUNK); drop it (the database keeps one entry per problem class)");
    // plan()'s own limit on chunk pairs: refused only on the problem's turn before, after the ones ahead were tuned.
    smla::check_chunk_count(smla::choose_shape(p, smla::runtime_env().interm_budget));
  }
  // The database keeps one entry per problem class (T and num_kv by power-of-two bucket): two problems of one class
  // in a run each reported "stored", and the second's entry silently replaced the first's. (Measuring only, any mix.)
  if (!o.no_store) {
    std::map<std::string, const smla::Problem*> seen;
    for (const smla::Problem& p : out) {
      const auto [it, fresh] = seen.emplace(smla::tuning_key("", p, ""), &p);
      if (!fresh)
        throw smla::Error(smla::Status::InvalidArgument,
                          smla::describe_problem(*it->second) + " and " + smla::describe_problem(p) +
                              " share one tuning database entry (T and num_kv are kept by power-of-two bucket): tune "
                              "one of them, or measure both with --no-store");
    }
  }
  return out;
}

int run(const Options& o) {
  const std::vector<smla::Problem> problems = gather(o);
  smla::Runtime rt;
  if (rt.resolve(smla::BackendKind::Auto) != smla::BackendKind::Cuda) {
    std::string why;
    for (const auto& b : rt.backends())
      if (b.name == "cuda") why = b.detail;
    // What it would have tuned, so that a job script can be checked on a machine without one.
    std::string what;
    for (size_t i = 0; i < problems.size() && i < 3; ++i) what += (i ? "; " : "") + smla::describe_problem(problems[i]);
    if (problems.size() > 3) what += "; ... (" + std::to_string(problems.size()) + " problems)";
    throw smla::Error(smla::Status::NoBackend, "needs a usable CUDA GPU to tune " + what + " (" + why + ")");
  }
  // The version of the sources the Runtime compiles ($SMLA_KERNEL_SRC_DIR included), so plan() finds the entries.
  smla::TuningDb db(o.tuning_db, smla::default_tuning_runtime_version());
  if (!o.no_store) db.check_store();  // a database the stores would refuse, said before minutes of tuning (exit 2)
  nlohmann::json all = nlohmann::json::array();
  bool ok = true;
  for (const smla::Problem& p : problems) {
    // One problem's failure (its plan refused on this GPU, the database refusing the store) is that problem's: the
    // sweep goes on and --json still prints every problem (it stopped the sweep with exit 2 and printed nothing).
    nlohmann::json j;
    try {
      j = tune_one(rt, db, p, o);
    } catch (const smla::Error& e) {
      j = {{"T", p.T}, {"H", p.H}, {"num_kv", p.num_kv}, {"topk", p.topk}, {"sink", p.has_sink}, {"error", e.message()}};
      std::fprintf(stderr, "smla-tune: %s: error: %s\n", smla::describe_problem(p).c_str(), e.message().c_str());
    }
    ok = ok && !j.contains("error");
    all.push_back(j);
  }
  if (o.json) std::printf("%s\n", smla::tools::json_text(nlohmann::json{{"problems", all}}).c_str());
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"smla-tune: find the fastest correct tile config per problem on this GPU and store it in the tuning "
               "database (the planner then uses it)"};
  app.footer(
      "Shapes as in smla-warmup: --shape T,H,NUM_KV,TOPK, each field a number, A:B:STEP or A:B:*F (no R_CHUNK:\n"
      "r_chunk is tuned) (default: the seed shape 4096,128,5120,512; --sink applies to it too). Every problem is\n"
      "validated before the first is tuned, and the database checked writable; a problem that then fails on the\n"
      "GPU is reported (in --json too) and the sweep goes on (exit 1). Every candidate is first checked\n"
      "against the float64 reference at the contract's bar on T = --check-t (same H, topk, sink and lse\n"
      "convention) on two inputs, the benchmark top-k at the num_kv/T ratio and a uniform top-k that reaches every\n"
      "slot, each run on a poisoned workspace; then timed at the real T with device events. The database: --tuning-db, else $SMLA_TUNING_DB, else\n"
      "$XDG_CACHE_HOME/smla/tuning.json, else ~/.cache/smla/tuning.json, else (no home)\n"
      "/tmp/smla-tuning-<uid>/tuning.json while it is this user's alone; entries are keyed by device (target,\n"
      "name and SMs: an H100 and an H200 keep their own), H, topk, sink, lse convention, dkv dtype and the\n"
      "power-of-two buckets of T and num_kv: two problems of one entry (T 12288 and 16384) are refused before\n"
      "tuning (exit 2) unless --no-store, which only measures.");
  Options o;
  app.add_option("--shape", o.shapes, "problems to tune (repeatable, with ranges)");
  app.add_option("--json-file", o.json_file, "problems from a JSON file (see smla-warmup --help)")
      ->check(smla::tools::non_empty_path());
  app.add_option("--sink", o.sink, "for --shape problems and the default seed shape: on, off or both (default on)")
      ->check(CLI::IsMember({"on", "off", "both"}));
  app.add_option("--max-seconds", o.max_seconds, "time budget per problem, compiles included (default 540)")
      ->transform(CLI::Validator(
          [](std::string& s) -> std::string {
            // A negative budget tried the heuristic alone and NaN every candidate, without a word. Plain decimal, as
            // the integer options (decimal()): strtod's " 5" and "0x10" were taken.
            double v = 0;
            const char* end = s.data() + s.size();
            const std::from_chars_result r = std::from_chars(s.data(), end, v, std::chars_format::general);
            if (s.empty() || r.ec != std::errc() || r.ptr != end || !(v >= 0 && v <= 1e9))
              return "'" + s + "' is not a number of seconds from 0 to 1e9";
            return "";
          },
          ""));
  app.add_option("--check-t", o.check_t, "T of the correctness check (default 257)")
      ->transform(smla::tools::decimal(o.check_t))
      ->check(CLI::Range(1, 4096));
  app.add_option("--warmup", o.warmup, "untimed runs per candidate (default 3)")
      ->transform(smla::tools::decimal(o.warmup))
      ->check(CLI::Range(0, 1000000));
  app.add_option("--repeat", o.repeat, "timed runs per candidate, median taken (default 10)")
      ->transform(smla::tools::decimal(o.repeat))
      ->check(CLI::Range(1, 1000));
  app.add_option("--tuning-db", o.tuning_db,
                 "tuning database file to store into; plan() reads $SMLA_TUNING_DB (else the default), so a job that "
                 "is to use a file given here needs SMLA_TUNING_DB set to it")
      ->check(smla::tools::non_empty_path());
  app.add_flag("--no-store", o.no_store, "measure only; leave the database alone");
  app.add_flag("--json", o.json, "one JSON object on stdout (progress stays on stderr)");
  app.add_option("--seed", o.seed, "random seed of the inputs")->transform(smla::tools::decimal(o.seed));
  SMLA_TOOL_PARSE(app, argc, argv);
  return smla::tools::run_tool("smla-tune", [&] { return run(o); }, 2, o.json);
}
