// warmup.cpp: smla-warmup's engine: plan every problem on every target without a device, key
// each translation unit exactly as plan() does (kernel_key_fields), dedup, compile into a cache.
#include "warmup.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "../cache/kernel_cache.hpp"
#include "check.hpp"
#include "cuda/cuda_backend.hpp"
#include "cuda/kernels_cuda.hpp"
#include "cuda/nvrtc_compiler.hpp"
#include "env.hpp"
#include "hip/hip_backend.hpp"
#include "hip/hiprtc_compiler.hpp"
#include "hip/rocprim_sort.hpp"
#include "kernel_key.hpp"
#include "log.hpp"
#include "planner.hpp"
#include "relative_path.hpp"  // parent_dir
#include "sources.hpp"
#include "threads.hpp"
#include "writable_dir.hpp"
#include "tuning_db.hpp"

// The AMD kernel table is written separately; until it is in the build, gfx targets report it.
#if __has_include("hip/kernels_hip.hpp")
#include "hip/kernels_hip.hpp"
#define SMLA_WARMUP_HAVE_HIP_KERNELS 1
#else
#define SMLA_WARMUP_HAVE_HIP_KERNELS 0
#endif

namespace smla {
namespace {

// The message's first line, and of a compile log after it the first line that says "error", so that
// one line per failure still names the cause (a static_assert's text, say).
std::string first_line(const std::exception& e) {
  const auto* se = dynamic_cast<const Error*>(&e);
  std::string s = se ? se->message() : e.what();
  const size_t nl = s.find('\n');
  if (nl == std::string::npos) return s;
  std::string out = s.substr(0, nl);
  for (size_t b = nl + 1; b < s.size();) {
    size_t end = s.find('\n', b);
    if (end == std::string::npos) end = s.size();
    const std::string line = s.substr(b, end - b);
    if (line.find("error") != std::string::npos) return out + ": " + line;
    b = end + 1;
  }
  return out;
}

}  // namespace

std::string describe_problem(const Problem& p) {
  std::ostringstream s;
  s << "T=" << p.T << " H=" << p.H << " num_kv=" << p.num_kv << " topk=" << p.topk;
  if (p.r_chunk) s << " r_chunk=" << p.r_chunk;
  if (p.has_sink) s << " sink";
  return s.str();
}

namespace {

struct Job {
  size_t item;
  const RtcCompiler* rtc;
  bool hip;
  cache::KeyFields fields;
  RenderedSource src;
};

// What a family launches per phase; empty when the family has no kernels in this build.
KernelsOf kernels_of(const std::string& family) {
  if (family == "cuda") return cuda_phase_kernels;
#if SMLA_WARMUP_HAVE_HIP_KERNELS
  if (family == "hip")
    return [](Phase ph, const ShapeInfo& s) {
      using namespace hip;  // the table may live in smla or smla::hip
      return hip_phase_kernels(ph, s);
    };
#endif
  return {};
}

bool shape_supported(const std::string& family, const ShapeInfo& s, std::string* why) {
  if (family == "cuda") return cuda_shape_supported(s, why);
#if SMLA_WARMUP_HAVE_HIP_KERNELS
  if (family == "hip") return hip_shape_supported(s, why);
#endif
  return true;
}

// The configs tuned for `p` on every device of `target`, under each lse convention: the database keys its entries by
// the convention (a job's plan() looks up its own), while no kernel depends on it (the convention is a run-time
// argument), so a problem from --shape, which has the default convention, would have missed the entries a job with
// base-2 lse tuned. Duplicates dropped.
std::vector<TileConfig> tuned_configs_of(const TuningDb& db, const std::string& target, const Problem& p) {
  std::vector<TileConfig> out;
  for (bool base2 : {p.lse.base2, !p.lse.base2})
    for (bool includes_sink : {p.lse.includes_sink, !p.lse.includes_sink}) {
      Problem q = p;
      q.lse.base2 = base2;
      q.lse.includes_sink = includes_sink;
      if (!q.has_sink && !includes_sink) continue;  // no sink, nothing to exclude (validate_problem refuses it)
      for (const TileConfig& c : db.lookup_target(target, q))
        if (std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
    }
  return out;
}

}  // namespace

std::vector<std::string> present_targets(std::string* why) {
  std::vector<std::string> out;
  std::string wc, wh;
  cuda::CudaBackend cuda;
  if (cuda.usable(&wc))
    for (int d = 0; d < cuda.device_count(); ++d) out.push_back(cuda.target(d));
  hip::HipBackend hip;
  if (hip.usable(&wh))
    for (int d = 0; d < hip.device_count(); ++d) out.push_back(hip.target(d));
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  if (why) *why = out.empty() ? "cuda: " + wc + "; hip: " + wh : "";
  return out;
}

std::string target_family(const std::string& t) {
  if (t.rfind("sm_", 0) == 0) return "cuda";
  if (t.rfind("gfx", 0) == 0) return "hip";
  return "";
}

std::vector<std::string> warm_targets(const std::vector<std::string>& given) {
  std::vector<std::string> out;
  for (const std::string& t : given) {
    for (const std::string& id : target_family(t) == "hip" ? hip::hip_target_ids(t) : std::vector<std::string>{t})
      if (std::find(out.begin(), out.end(), id) == out.end()) out.push_back(id);
  }
  return out;
}

std::string target_name_problem(const std::string& target) {
  const std::string family = target_family(target);
  if (family.empty())
    return "unknown target '" + target + "': expected sm_* (NVIDIA, e.g. sm_90a) or gfx* (AMD, e.g. gfx950)";
  std::string why;
  if (family == "cuda" && !cuda::cuda_target_supported(target, &why)) return target + ": " + why;
  if (family == "hip" && !hip::hip_target_supported(target, &why)) return target + ": " + why;
  return "";
}

WarmupResult warm_kernels(const std::vector<Problem>& problems, const std::vector<std::string>& targets,
                          const WarmupOptions& opts) {
  const auto t0 = std::chrono::steady_clock::now();
  // The settings a warm-up plans with (SMLA_INTERM_BUDGET_BYTES chooses the chunks, hence the kernels): a value that
  // cannot be read is said here as a Runtime says it (it was ignored without a word).
  for (const std::string& w : runtime_env().warnings) log().warn("{}", w);
  SMLA_REQUIRE(!opts.out_dir.empty(), Status::InvalidArgument, "warm-up needs an output directory (--out)");
  // The cache's settings from the environment, read once (a malformed knob is warned about at each read).
  const cache::Settings env_cache = cache::settings_from_env();
  // The warm-up writes (or, dry run, reads) its directory whatever SMLA_CACHE_DISABLE says; a plan() in this
  // environment would read no cache and compile every kernel, which "cached" must not hide.
  if (env_cache.disable)
    log().warn("SMLA_CACHE_DISABLE is set: this warm-up still {} {}, but a plan() run with it set compiles every kernel "
               "and reads no cache", opts.dry_run ? "lists what is in" : "fills", opts.out_dir);
  WarmupResult res;
  // The sources plan() will compile: the option, else SMLA_KERNEL_SRC_DIR as the runtime reads it, else
  // the embedded ones (a warm-up that ignored the variable would fill keys no plan looks up).
  KernelSources sources(!opts.kernel_src_dir.empty() ? opts.kernel_src_dir : runtime_env().kernel_src_dir);
  cuda::NvrtcCompiler nvrtc;
  hip::HipRtcCompiler hiprtc(/*probe_targets=*/true, opts.hip_worker);
  std::unique_ptr<TuningDb> db;
  if (opts.use_tuning_db && opts.configs.empty()) {  // (explicit configs replace the tuned ones)
    db = std::make_unique<TuningDb>(opts.tuning_db, tuning_runtime_version(sources));
    res.tuning_db = db->path();
    std::error_code ec;
    res.tuning_db_exists = std::filesystem::exists(res.tuning_db, ec);
    if (!res.tuning_db_exists)
      // (Said in the report, WarmupResult::tuning_db_exists; a warning at every warm-up of a site that never tunes
      // would be noise.)
      log().info("warm-up: tuning database {} does not exist: only the heuristic configs are warmed (a job that reads "
                 "another database, SMLA_TUNING_DB, compiles its tuned kernels at its start; --tuning-db names it)",
                 res.tuning_db);
  }
  const size_t budget = opts.interm_budget ? opts.interm_budget : runtime_env().interm_budget;

  // ---- plan: every (target, problem) -> steps -> keyed translation units, deduplicated
  std::vector<Job> jobs;
  std::map<std::string, size_t> by_entry;
  for (const std::string& target : warm_targets(targets)) {
    // A target plan() would refuse (its syntax, its processor) first, whatever the compiler here; a dry run lists
    // without compiling, so only that.
    if (std::string bad = target_name_problem(target); !bad.empty()) {
      res.errors.push_back(std::move(bad));
      continue;
    }
    const std::string family = target_family(target);
    const RtcCompiler* rtc = family == "cuda" ? static_cast<const RtcCompiler*>(&nvrtc) : &hiprtc;
    const KernelsOf kernels = kernels_of(family);
    std::string why;
    if (!kernels) {
      res.errors.push_back(target + ": no AMD kernel sources in this build (runtime/hip/kernels_hip.hpp is missing)");
      continue;
    }
    if (!rtc->available(&why)) {
      res.errors.push_back(target + ": the " + family + " run-time compiler cannot be loaded: " + why);
      continue;
    }
    if (family == "hip" && !opts.dry_run && !hip::hip_target_known(target, &why, opts.hip_worker)) {
      res.errors.push_back(target + ": " + why);
      continue;
    }
    // The AMD csr sort is no compiled kernel but this build's libsmla_rocprim.so: one without code for the target's
    // processor makes plan() refuse every problem there, which a warm-up that compiled the rest must say. Without the
    // library here it may still be on the machine that runs the job: said, not a failure.
    if (family == "hip") {
      if (const hip::RocprimSort* sort = hip::RocprimSort::get(&why)) {
        if (!sort->supports(target, &why)) {
          res.errors.push_back(target + ": plan() of this build refuses it: " + why);
          continue;
        }
      } else {
        log().warn("warm-up: {}: the AMD csr sort is not available here ({}); a job's plan() needs it for {}", target,
                   why, target);
      }
    }
    // Keys every launch of one shape; launches repeat per chunk, so (stem, constants) already
    // seen on this target are skipped before rendering.
    std::map<std::string, size_t> seen;
    auto add_shape = [&](const ShapeInfo& s) {
      check_chunk_count(s);  // what plan() refuses first: too many chunk pairs (a small SMLA_INTERM_BUDGET_BYTES)
      if (!shape_supported(family, s, &why))
        SMLA_THROW(Status::Unsupported, "not supported by the " + family + " kernels: " + why);
      for (const Step& st : order_steps(s, kernels)) {
        if (!st.spec.stem.empty() && st.spec.stem[0] == '@') continue;  // a library routine (rocPRIM): nothing to compile
        const std::string tu = st.spec.stem + "|" + defines_id(st.spec);
        auto known = seen.find(tu);
        if (known == seen.end()) {
          RenderedSource src;
          cache::KeyFields f = kernel_key_fields(st.spec, sources, *rtc, target, &src);
          if (std::none_of(res.compilers.begin(), res.compilers.end(), [&](const auto& c) { return c.first == target; }))
            res.compilers.emplace_back(target, f.compiler_id);
          const std::string name = cache::make_key(f).entry_name();
          auto same = by_entry.find(name);  // e.g. the same constants reached another way
          if (same == by_entry.end()) {
            WarmupItem item;
            item.target = target;
            item.kernel = st.spec.stem;
            item.tag = f.shape_tag;
            item.entry = name;
            by_entry[name] = res.items.size();
            res.items.push_back(std::move(item));
            jobs.push_back(Job{res.items.size() - 1, rtc, family == "hip", std::move(f), std::move(src)});
            same = by_entry.find(name);
          }
          known = seen.emplace(tu, same->second).first;
        }
        auto& e = res.items[known->second].entries;
        if (std::find(e.begin(), e.end(), st.spec.entry) == e.end()) e.push_back(st.spec.entry);
      }
    };
    for (const Problem& p : problems) {
      try {
        validate_problem(p);
        if (!opts.configs.empty()) {
          for (const TileConfig& c : opts.configs) add_shape(shape_with_config(p, &c, budget, target));
          continue;
        }
        // The heuristic's kernels, and those of the config tuned for each device of this target in the database
        // (warm-up has no device to ask which one it will run on; a config the kernels no longer accept is skipped,
        // as plan() falls back then).
        add_shape(shape_with_config(p, nullptr, budget, target));
        if (db)
          for (const TileConfig& tuned : tuned_configs_of(*db, target, p)) {
            // Judged as plan() judges a tuned entry (the chunk pairs, then the target's kernels): one it would pass
            // over for the heuristic is skipped here, not a failure of the problem.
            if (!tuned_entry_fits(family == "cuda" ? BackendKind::Cuda : BackendKind::Hip, p, tuned, budget, target,
                                  nullptr))
              continue;
            add_shape(shape_with_config(p, &tuned, budget, target));
            ++res.tuned_configs;
          }
      } catch (const std::exception& e) {
        res.errors.push_back(target + " " + describe_problem(p) + ": " + first_line(e));
      }
    }
  }
  res.failed = int(res.errors.size());
  auto finish = [&] {
    res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return res;
  };
  if (jobs.empty()) return finish();
  if (opts.dry_run) {
    // Nothing is compiled or written: the output directory is checked as a warm-up would need it, and each kernel
    // looked up in it read-only (Cached, or Planned: a warm-up would compile it).
    if (std::string why = dir_write_problem(opts.out_dir); !why.empty())
      SMLA_THROW(Status::InvalidArgument,
                 "cannot write the warm-up output directory " + opts.out_dir + " (" + why + "); pick another --out");
    cache::Settings ro = env_cache;
    // The /tmp fallback of a user without a home keeps its privacy check (it is the default --out there); a directory
    // the caller named is not that fallback.
    ro.dir_in_shared_tmp = ro.dir_in_shared_tmp && opts.out_dir == ro.dir;
    ro.dir = opts.out_dir;
    ro.system_dir.clear();
    ro.disable = false;
    ro.readonly = true;
    ro.lock = false;
    ro.warn_unwritable = false;
    cache::DiskCache disk(ro);
    struct NotCached {};
    for (const Job& j : jobs) {
      try {
        if (disk.get_or_compile(j.fields, []() -> cache::CompileOutput { throw NotCached{}; }).origin ==
            cache::Origin::Disk) {
          res.items[j.item].state = WarmupItem::State::Cached;
          ++res.cached;
        }
      } catch (const NotCached&) {
      }
    }
    return finish();
  }

  // ---- compile into the output directory, as its user cache (unbounded: never evict here)
  cache::Settings cs = env_cache;
  cs.dir_in_shared_tmp = cs.dir_in_shared_tmp && opts.out_dir == cs.dir;  // (as the dry run's above)
  cs.dir = opts.out_dir;
  cs.system_dir.clear();
  cs.disable = false;
  cs.readonly = false;
  cs.max_bytes = 0;
  cs.warn_unwritable = false;  // the cache's warning would say to set SMLA_CACHE_DIR: the reason goes in the error below
  cache::DiskCache disk(cs);
  SMLA_REQUIRE(disk.writable(), Status::InvalidArgument,
               "cannot write the warm-up output directory " + opts.out_dir + " (" + disk.unwritable_reason() +
                   "); pick another --out");

  std::mutex mu;
  std::atomic<size_t> next{0};
  size_t done = 0;
  auto worker = [&](int) {
    for (size_t i = next++; i < jobs.size(); i = next++) {
      Job& j = jobs[i];
      WarmupItem r;
      {
        std::lock_guard<std::mutex> l(mu);
        r = res.items[j.item];
      }
      const auto c0 = std::chrono::steady_clock::now();
      try {
        auto compile = [&j, &opts]() -> cache::CompileOutput {
          if (!j.hip) {
            CompileResult c = j.rtc->compile(j.src, j.fields.target);
            return {std::move(c.binary), std::move(c.log)};
          }
          // hipRTC serializes a process: each compile runs in its own worker process.
          auto out = hip::hip_compile_in_subprocesses({j.src}, j.fields.target, 1, opts.hip_worker);
          if (!out[0].ok) SMLA_THROW(Status::CompileError, out[0].error + "\n" + out[0].result.log);
          return {std::move(out[0].result.binary), std::move(out[0].result.log)};
        };
        const cache::Fetched f = disk.get_or_compile(j.fields, compile);
        // Only what is in the directory counts: a kernel compiled but not written is a failure,
        // counted once, saying why.
        if (f.origin == cache::Origin::Disk) {
          r.state = WarmupItem::State::Cached;
        } else if (f.origin == cache::Origin::Compiled && f.not_stored.empty()) {
          r.state = WarmupItem::State::Compiled;
        } else {
          r.state = WarmupItem::State::Failed;
          r.error = "compiled but not written to " + opts.out_dir + ": " +
                    (f.not_stored.empty() ? "an earlier publish of it failed" : f.not_stored);
        }
      } catch (const std::exception& e) {
        r.state = WarmupItem::State::Failed;
        r.error = first_line(e);
      }
      r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
      std::lock_guard<std::mutex> l(mu);
      res.items[j.item] = r;
      if (r.state == WarmupItem::State::Compiled) ++res.compiled;
      else if (r.state == WarmupItem::State::Cached) ++res.cached;
      else ++res.failed;
      ++done;
      if (opts.progress) opts.progress(r, done, jobs.size());
    }
  };
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const size_t n = std::min(jobs.size(), size_t(opts.jobs > 0 ? unsigned(opts.jobs) : hw));
  on_threads(int(n), worker);  // (a thread that cannot start leaves its share to the others and to this one)
  // The warm-up never evicts, but a job does: one bound by SMLA_CACHE_MAX_BYTES that finds this directory over the
  // bound evicts its least recently used entries, warmed ones among them, at its first publish. Said here, where the
  // size is made (it was silent: the first job of another shape deleted kernels the warm-up was run for).
  if (env_cache.max_bytes > 0) {
    const int64_t total = disk.total_bytes();
    if (total > env_cache.max_bytes)
      log().warn("warm-up: {} now holds {} bytes, over SMLA_CACHE_MAX_BYTES = {}: a job using it under that bound "
                 "evicts least recently used entries, warmed ones among them, when it publishes a kernel; raise the "
                 "bound (or 0: unbounded) for the job, or warm fewer problems",
                 opts.out_dir, total, env_cache.max_bytes);
  }
  return finish();
}

// ---------------------------------------------------------------- problem lists

namespace {

// `ctx` names what was parsed ("--shape '...'", "problem list entry 2 \"T\"").
[[noreturn]] void bad_spec(const std::string& ctx, const std::string& why) {
  SMLA_THROW(Status::InvalidArgument, ctx + ": " + why +
                                          " (expected T,H,NUM_KV,TOPK[,R_CHUNK]; each field a number, A:B:STEP or "
                                          "A:B:*F, optionally NAME=..., e.g. T=4096:16384:4096,128,5120,512)");
}

// Decimal digits with at most a leading '-', as the tools' integer options (stoll also took leading blanks and '+').
int64_t parse_int(const std::string& s, const std::string& spec) {
  const size_t digits = s.find_first_not_of('-') == 1 ? 1 : 0;
  size_t used = 0;
  long long v = 0;
  if (s.size() > digits && s.find_first_not_of("0123456789", digits) == std::string::npos) {
    try {
      v = std::stoll(s, &used);
    } catch (const std::exception&) {
      used = 0;
    }
  }
  if (s.empty() || used != s.size()) bad_spec(spec, "'" + s + "' is not an integer");
  return v;
}

constexpr size_t kMaxProblems = 100000;  // a typo in a range should not plan forever

std::vector<int64_t> parse_values(const std::string& field, const std::string& spec) {
  if (field.empty()) bad_spec(spec, "an empty field");
  std::vector<std::string> parts;
  std::stringstream ss(field);
  for (std::string s; std::getline(ss, s, ':');) parts.push_back(s);
  if (!field.empty() && field.back() == ':') parts.push_back("");
  if (parts.size() == 1) return {parse_int(parts[0], spec)};
  if (parts.size() != 3) bad_spec(spec, "range '" + field + "' needs A:B:STEP or A:B:*F");
  const int64_t a = parse_int(parts[0], spec), b = parse_int(parts[1], spec);
  const bool geometric = !parts[2].empty() && parts[2][0] == '*';
  const int64_t step = parse_int(geometric ? parts[2].substr(1) : parts[2], spec);
  if (a > b) bad_spec(spec, "range '" + field + "' goes down (A > B)");
  if (geometric ? (step < 2 || a < 1) : step < 1)
    bad_spec(spec, "range '" + field + "': the step must be >= 1 (a factor >= 2 from A >= 1)");
  std::vector<int64_t> v;
  for (int64_t x = a;; x = geometric ? x * step : x + step) {
    v.push_back(x);
    if (v.size() > kMaxProblems) bad_spec(spec, "range '" + field + "' has too many values");
    // Stop before a step past B: near 2^63 the step itself overflowed (undefined), wrapped below B and ran on to
    // "too many values" for a range of two.
    if (geometric ? x > b / step : uint64_t(b) - uint64_t(x) < uint64_t(step)) break;
  }
  return v;
}

std::string upper(std::string s) {
  for (char& c : s) c = char(std::toupper((unsigned char)c));
  return s;
}

// Cross product of the value lists of T, H, NUM_KV, TOPK, R_CHUNK.
std::vector<Problem> expand(const std::vector<std::vector<int64_t>>& vals, const Problem& base, const std::string& what) {
  std::vector<Problem> out;
  for (int64_t T : vals[0])
    for (int64_t H : vals[1])
      for (int64_t kv : vals[2])
        for (int64_t k : vals[3])
          for (int64_t rc : vals[4]) {
            Problem p = base;
            p.T = T, p.H = H, p.num_kv = kv, p.topk = k, p.r_chunk = rc;
            out.push_back(p);
            if (out.size() > kMaxProblems)
              SMLA_THROW(Status::InvalidArgument, what + ": more than " + std::to_string(kMaxProblems) + " problems");
          }
  return out;
}

}  // namespace

std::vector<Problem> parse_shape_spec(const std::string& spec_text) {
  const std::string spec = "--shape '" + spec_text + "'";
  static const char* kNames[] = {"T", "H", "NUM_KV", "TOPK", "R_CHUNK"};
  std::vector<std::vector<int64_t>> vals(5);
  std::vector<std::string> fields;
  std::stringstream ss(spec_text);
  for (std::string f; std::getline(ss, f, ',');) fields.push_back(f);
  // A trailing comma is an empty last field (getline drops it): "...,512,$RC" with RC unset is a mistake to say, not
  // R_CHUNK left to the planner.
  if (!spec_text.empty() && spec_text.back() == ',') fields.push_back("");
  if (fields.empty() || fields.size() > 5) bad_spec(spec, std::to_string(fields.size()) + " fields");
  for (size_t i = 0; i < fields.size(); ++i) {
    std::string f = fields[i];
    size_t slot = i;
    const size_t eq = f.find('=');
    if (eq != std::string::npos) {
      const std::string name = upper(f.substr(0, eq));
      slot = 5;
      for (size_t k = 0; k < 5; ++k)
        if (name == kNames[k]) slot = k;
      if (slot == 5) bad_spec(spec, "unknown field name '" + f.substr(0, eq) + "'");
      f = f.substr(eq + 1);
    }
    if (!vals[slot].empty()) bad_spec(spec, std::string(kNames[slot]) + " given twice");
    vals[slot] = parse_values(f, spec);
  }
  for (size_t k = 0; k < 4; ++k)
    if (vals[k].empty()) bad_spec(spec, std::string(kNames[k]) + " is missing");
  if (vals[4].empty()) vals[4] = {0};
  return expand(vals, Problem{}, spec);
}

std::vector<Problem> parse_problems_json(const std::string& text) {
  using json = nlohmann::json;
  json doc = json::parse(text, nullptr, false);
  if (doc.is_discarded()) SMLA_THROW(Status::InvalidArgument, "problem list: not valid JSON");
  if (doc.is_object() && doc.contains("problems")) doc = doc["problems"];
  if (!doc.is_array()) SMLA_THROW(Status::InvalidArgument, "problem list: expected an array of problems (or {\"problems\": [...]})");
  std::vector<Problem> out;
  for (size_t i = 0; i < doc.size(); ++i) {
    const json& e = doc[i];
    const std::string where = "problem list entry " + std::to_string(i);
    if (!e.is_object()) SMLA_THROW(Status::InvalidArgument, where + ": expected an object");
    // A key outside the list is a mistake ("Sink", "rchunk"), not a comment: dropped, it left kernels unwarmed that a
    // training job then compiled at start-up, with the warm-up's exit status 0.
    static const char* const known[] = {"T",    "H",         "num_kv",            "topk",          "r_chunk",
                                        "sink", "lse_base2", "lse_includes_sink", "check_indices", "dkv_fp32"};
    for (const auto& kv : e.items())
      if (std::find_if(std::begin(known), std::end(known), [&](const char* k) { return kv.key() == k; }) ==
          std::end(known))
        SMLA_THROW(Status::InvalidArgument, where + ": unknown key \"" + kv.key() +
                                                "\" (expected T, H, num_kv, topk, r_chunk, sink, lse_base2, "
                                                "lse_includes_sink, check_indices, dkv_fp32)");
    std::vector<std::vector<int64_t>> vals(5);
    const char* keys[] = {"T", "H", "num_kv", "topk", "r_chunk"};
    for (size_t k = 0; k < 5; ++k) {
      if (!e.contains(keys[k])) {
        if (k < 4) SMLA_THROW(Status::InvalidArgument, where + ": \"" + keys[k] + "\" is missing");
        vals[k] = {0};
        continue;
      }
      const json& v = e[keys[k]];
      // A number past 2^63 - 1 is read as unsigned and get<int64_t>() wrapped it negative ("Problem::T = -1").
      if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
        SMLA_THROW(Status::InvalidArgument, where + ": \"" + keys[k] + "\" = " + v.dump() + " is past 2^63 - 1");
      if (v.is_number_integer()) vals[k] = {v.get<int64_t>()};
      else if (v.is_string()) vals[k] = parse_values(v.get<std::string>(), where + " \"" + keys[k] + "\"");
      else SMLA_THROW(Status::InvalidArgument, where + ": \"" + keys[k] + "\" must be an integer or a range string");
    }
    Problem base;
    auto flag = [&](const char* k, bool def) {
      if (!e.contains(k)) return def;
      if (!e[k].is_boolean()) SMLA_THROW(Status::InvalidArgument, where + ": \"" + k + "\" must be true or false");
      return e[k].get<bool>();
    };
    base.has_sink = flag("sink", false);
    base.lse.base2 = flag("lse_base2", false);
    base.lse.includes_sink = flag("lse_includes_sink", true);
    base.check_indices = flag("check_indices", false);
    base.dkv_fp32 = flag("dkv_fp32", false);
    for (Problem& p : expand(vals, base, where)) out.push_back(p);
  }
  return out;
}

std::vector<Problem> collect_problems(const std::vector<std::string>& shapes, const std::string& sink,
                                      const std::string& json_file, bool check_indices) {
  std::vector<Problem> out;
  for (const std::string& s : shapes)
    for (Problem p : parse_shape_spec(s)) {
      p.check_indices = check_indices;
      if (sink != "off") {
        p.has_sink = true;
        out.push_back(p);
      }
      if (sink != "on") {
        p.has_sink = false;
        out.push_back(p);
      }
    }
  if (!json_file.empty()) {
    // A directory opens as a stream that reads nothing: it was "problem list: not valid JSON", naming no file.
    std::error_code ec;
    if (std::filesystem::is_directory(json_file, ec))
      throw Error(Status::InvalidArgument, "--json-file " + json_file + ": a directory, not a file", __FILE__,
                  __LINE__);
    std::ifstream in(json_file);
    if (!in) throw Error(Status::InvalidArgument, "--json-file " + json_file + ": cannot be read", __FILE__, __LINE__);
    std::stringstream buf;
    buf << in.rdbuf();
    try {
      for (const Problem& p : parse_problems_json(buf.str())) out.push_back(p);
    } catch (const Error& e) {
      throw Error(e.status(), "--json-file " + json_file + ": " + e.message(), __FILE__, __LINE__);
    }
  }
  return out;
}

}  // namespace smla
