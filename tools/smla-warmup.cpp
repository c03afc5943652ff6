// smla-warmup: compiles, ahead of time and without a GPU, every kernel the planner would launch
// for a list of problems and targets, into a cache directory (the user cache by default; or a
// directory to ship as SMLA_CACHE_SYSTEM_DIR or to export with smla-cache).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "cli_parse.hpp"  // beside this file
#include "tools/tool_main.hpp"
#include "cache/kernel_cache.hpp"
#include "runtime/planner.hpp"
#include "runtime/tuning_db.hpp"
#include "runtime/warmup.hpp"
#include "smla/smla.hpp"

namespace {

struct Options {
  std::vector<std::string> shapes;
  std::string json_file;
  std::vector<std::string> archs;
  int jobs = 0;
  std::string out;
  std::string sink = "both";
  bool check_indices = false, dry_run = false, json = false, no_tuned = false;
  std::string tuning_db;
};

const char* state_name(smla::WarmupItem::State s) {
  switch (s) {
    case smla::WarmupItem::State::Planned: return "planned";
    case smla::WarmupItem::State::Compiled: return "compiled";
    case smla::WarmupItem::State::Cached: return "cached";
    case smla::WarmupItem::State::Failed: return "FAILED";
  }
  return "?";
}

// What happened to an item, for its progress line (the JSON keeps state_name).
const char* outcome(smla::WarmupItem::State s) {
  switch (s) {
    case smla::WarmupItem::State::Compiled: return "compiled and cached";
    case smla::WarmupItem::State::Cached: return "already cached";
    default: return state_name(s);
  }
}

std::vector<smla::Problem> gather_problems(const Options& o) {
  std::vector<smla::Problem> out = smla::collect_problems(o.shapes, o.sink, o.json_file, o.check_indices);
  if (out.empty())
    throw smla::Error(smla::Status::InvalidArgument, "no problems: give --shape T,H,NUM_KV,TOPK (repeatable) or --json-file");
  return out;
}

// What the options ask for: the problems, the targets as compiled and the warm-up's options.
struct Request {
  std::vector<smla::Problem> problems;
  std::vector<std::string> targets;
  smla::WarmupOptions w;
};

// Reads the options; what it throws is a usage error (exit 2): a bad --shape or --json-file, a problem no backend
// takes, no problem, no target or
// an unknown one, a --tuning-db that is not there, no --out where the environment says the user cache is not to be
// written.
Request read_request(const Options& o) {
  Request q;
  q.problems = gather_problems(o);
  // A problem no target could run (H 17, TOPK 33) is a usage error, as in the other tools, not a failed kernel (exit
  // 1); limits of one target only (sm_89's shared memory) stay failures of that target's items.
  for (const smla::Problem& p : q.problems) smla::validate_problem(p);
  q.targets = o.archs;
  if (q.targets.empty()) {
    std::string why;
    q.targets = smla::present_targets(&why);
    if (q.targets.empty())
      throw smla::Error(smla::Status::NoBackend,
                        "no GPU here to take the targets from (" + why +
                            "): name them with --arch, e.g. --arch sm_90a,gfx950");
  }
  // A misspelt --arch is a usage error (exit 2), before any kernel is compiled for the targets named with it;
  // warm_kernels would count it a failed item (exit 1, as a kernel that failed).
  for (const std::string& t : q.targets)
    if (const std::string bad = smla::target_name_problem(t); !bad.empty())
      throw smla::Error(smla::Status::InvalidArgument, "--arch: " + bad);
  q.targets = smla::warm_targets(q.targets);  // as compiled: "gfx90a" -> its xnack- and xnack+ ids
  if (o.out.empty()) {
    // The warm-up writes whatever directory it is given, whatever SMLA_CACHE_READONLY, SMLA_CACHE_DISABLE and
    // SMLA_CACHE_MAX_BYTES say (they are the runtime's); but with no --out the directory is the user cache, which
    // these two say is not to be written.
    const smla::cache::Settings cs = smla::cache::settings_from_env();
    if ((cs.readonly || cs.disable) && !o.dry_run)  // (a dry run writes nothing)
      throw smla::Error(smla::Status::InvalidArgument,
                        std::string(cs.disable ? "SMLA_CACHE_DISABLE" : "SMLA_CACHE_READONLY") +
                            "=1 says the user cache (" + cs.dir +
                            ") is not to be written: unset it, or name the directory to warm with --out");
    q.w.out_dir = cs.dir;
  } else {
    q.w.out_dir = o.out;
  }
  // Only read here: a file that is not there is a mistyped path, not an empty database; one that is no database this
  // smla reads (a directory, another file, another schema) would warm none of its configs, exit 0 with a log line.
  if (!o.tuning_db.empty()) smla::TuningDb(o.tuning_db).check_read();
  q.w.jobs = o.jobs;
  q.w.dry_run = o.dry_run;
  q.w.use_tuning_db = !o.no_tuned;
  q.w.tuning_db = o.tuning_db;
  return q;
}

// Warms what `q` asks for; what it throws is the work failing (exit 1): an output directory it cannot write, say.
int warm(const Options& o, Request& q) {
  const std::vector<smla::Problem>& problems = q.problems;
  const std::vector<std::string>& targets = q.targets;
  smla::WarmupOptions& w = q.w;
  const bool tty = isatty(fileno(stderr));
  w.progress = [&](const smla::WarmupItem& it, size_t done, size_t total) {
    if (tty) {
      const int width = 30, fill = int(width * done / (total ? total : 1));
      std::fprintf(stderr, "\r[%s%s] %zu/%zu %-10s %-12s", std::string(fill, '#').c_str(),
                   std::string(width - fill, '.').c_str(), done, total, state_name(it.state), it.kernel.c_str());
      if (done == total) std::fprintf(stderr, "\n");
    } else {
      std::fprintf(stderr, "[%zu/%zu] %s %s [%s] for %s (%.2f s)%s%s\n", done, total, outcome(it.state),
                   it.kernel.c_str(), it.tag.c_str(), it.target.c_str(), it.seconds, it.error.empty() ? "" : ": ",
                   it.error.c_str());
    }
    std::fflush(stderr);
  };
  const smla::WarmupResult r = smla::warm_kernels(problems, targets, w);

  if (o.json) {
    nlohmann::json j;
    j["compiled"] = r.compiled, j["cached"] = r.cached, j["failed"] = r.failed, j["seconds"] = r.seconds;
    j["out"] = w.out_dir;
    j["targets"] = targets;
    j["problems"] = problems.size();
    j["tuning_db"] = r.tuning_db.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.tuning_db);
    j["tuning_db_exists"] = r.tuning_db_exists;
    j["tuned_configs"] = r.tuned_configs;
    j["compilers"] = nlohmann::json::object();
    for (const auto& [target, id] : r.compilers) j["compilers"][target] = id;
    j["errors"] = nlohmann::json::array();
    for (const auto& e : r.errors) j["errors"].push_back(e);
    j["kernels"] = nlohmann::json::array();
    for (const auto& it : r.items) {
      nlohmann::json k{{"target", it.target}, {"kernel", it.kernel}, {"tag", it.tag}, {"key", it.entry},
                       {"entries", it.entries}, {"state", state_name(it.state)}};
      if (!it.error.empty()) k["error"] = it.error;
      j["kernels"].push_back(k);
    }
    // Paths and compiler messages need not be UTF-8: replaced, not thrown on after the work is done.
    std::printf("%s\n", smla::tools::json_text(j).c_str());
  } else {
    if (o.dry_run) {
      std::printf("%-24s %-12s %-8s %s\n", "target", "kernel", "state", "cache entry (entry points)");
      for (const auto& it : r.items) {
        std::string entries;
        for (const auto& e : it.entries) entries += (entries.empty() ? "" : " ") + e;
        std::printf("%-24s %-12s %-8s %s (%s)\n", it.target.c_str(), it.kernel.c_str(), state_name(it.state),
                    it.entry.c_str(), entries.c_str());
      }
    }
    for (const auto& it : r.items)
      if (it.state == smla::WarmupItem::State::Failed)
        std::printf("failed: %s [%s] for %s: %s\n", it.kernel.c_str(), it.tag.c_str(), it.target.c_str(), it.error.c_str());
    for (const auto& e : r.errors) std::printf("failed: %s\n", e.c_str());
    if (!r.tuning_db.empty())
      std::printf("tuning database %s%s: %d tuned config(s) warmed beside the heuristic's\n", r.tuning_db.c_str(),
                  r.tuning_db_exists ? "" : " (does not exist)", r.tuned_configs);
    // The identity in every key: a job on another machine finds these entries only where its compiler says the same.
    for (const auto& [target, id] : r.compilers)
      std::printf("compiler for %s (in every key; a job's must match, see smla-bench --backends): %s\n", target.c_str(),
                  id.c_str());
    std::printf("%s%zu problem(s) x %zu target(s): %zu distinct kernel(s); compiled %d, already cached %d, failed %d "
                "in %.1f s -> %s\n",
                o.dry_run ? "dry run: " : "", problems.size(), targets.size(), r.items.size(), r.compiled, r.cached,
                r.failed, r.seconds, w.out_dir.c_str());
  }
  return r.failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"smla-warmup: compile ahead of time every kernel the planner would launch for the given problems "
               "and targets (no GPU needed)"};
  app.footer(
      "Shapes: --shape T,H,NUM_KV,TOPK[,R_CHUNK], repeatable. Each field is a number, a range A:B:STEP\n"
      "(A, A+STEP, ... up to B) or A:B:*F (A, A*F, ... up to B), optionally prefixed NAME= (T, H, NUM_KV,\n"
      "TOPK, R_CHUNK) to give fields in any order; ranges multiply out. Examples:\n"
      "  --shape 4096,128,5120,512\n"
      "  --shape T=4096:16384:4096,H=128,NUM_KV=5120,TOPK=512\n"
      "  --shape 1024:32768:*2,64,5120,640\n"
      "JSON (--json-file): [{\"T\": 4096 or \"4096:16384:4096\", \"H\": 128, \"num_kv\": 5120, \"topk\": 512,\n"
      "  \"r_chunk\": 0, \"sink\": true, \"lse_base2\": false, \"lse_includes_sink\": true,\n"
      "  \"check_indices\": false, \"dkv_fp32\": false}, ...] (sink defaults to false there).\n"
      "A new T reuses every kernel (no T is compiled in); only a tuned config (smla-tune) can differ\n"
      "between T buckets (powers of two), and warm-up applies tuned configs as plan() does.\n"
      "AMD targets: the runtime looks kernels up by the device's full target id, which HSA_XNACK=1 turns\n"
      "from gfx90a:sramecc+:xnack- into gfx90a:sramecc+:xnack+; so a plain gfx90a (gfx942, gfx950) warms\n"
      "both, and gfx90a:xnack- (or xnack+) warms only that one.\n"
      "The output directory is written whatever SMLA_CACHE_READONLY, SMLA_CACHE_DISABLE and SMLA_CACHE_MAX_BYTES\n"
      "say (they bind the runtime; the warm-up never evicts); without --out, READONLY=1 or DISABLE=1 is an error\n"
      "(not for --dry-run, which writes nothing).\n"
      "Exit status: 0 when nothing failed, 1 when a kernel or problem failed or the warm-up could not be done (an\n"
      "output directory it cannot write), 2 on usage errors (options, --shape, --json-file, no target or an unknown\n"
      "one, a --tuning-db that is absent or no database this smla reads, no --out under SMLA_CACHE_READONLY=1\n"
      "or SMLA_CACHE_DISABLE=1 without --dry-run).");
  Options o;
  app.add_option("--shape", o.shapes, "T,H,NUM_KV,TOPK[,R_CHUNK] with ranges (see below); repeatable");
  app.add_option("--json-file", o.json_file, "problems from a JSON file (see below)")->check(smla::tools::non_empty_path());
  app.add_option("--arch", o.archs, "targets, comma-separated: sm_90a, gfx950, gfx942, gfx90a (default: the GPUs present); a plain gfx* "
                 "warms its xnack- and xnack+ ids, gfx90a:xnack+ only that one")
      ->delimiter(',');
  app.add_option("-j,--jobs", o.jobs, "concurrent compiles (0, the default: the number of cores)")
      ->transform(smla::tools::decimal(o.jobs))
      ->check(CLI::Range(0, 4096));  // a negative count meant the default, silently
  app.add_option("--out", o.out, "cache directory to fill (default: the user cache, $SMLA_CACHE_DIR, else $XDG_CACHE_HOME/smla, else "
                 "~/.cache/smla, else (no home) /tmp/smla-cache-<uid> while it is this user's alone)")
      ->check(smla::tools::non_empty_path());
  app.add_option("--sink", o.sink, "for --shape problems: on, off or both (default both)")
      ->check(CLI::IsMember({"on", "off", "both"}));
  app.add_flag("--check-indices", o.check_indices, "also the opt-in index check kernels (--shape problems)");
  app.add_flag("--dry-run", o.dry_run, "list the kernels and cache keys, and which --out holds already, compiling and writing nothing (allowed "
               "without --out under SMLA_CACHE_READONLY=1 or SMLA_CACHE_DISABLE=1)");
  app.add_flag("--json", o.json, "print one JSON object: compiled, cached, failed, seconds (and the kernels)");
  CLI::Option* no_tuned = app.add_flag("--no-tuned", o.no_tuned, "ignore the tuning database (heuristic configs only)");
  CLI::Option* tuning_db = app.add_option("--tuning-db", o.tuning_db, "tuning database file (default $SMLA_TUNING_DB, else $XDG_CACHE_HOME/smla/tuning.json, else "
                 "~/.cache/smla/tuning.json, else (no home) /tmp/smla-tuning-<uid>/tuning.json while it is this user's "
                 "alone)")
      ->check(smla::tools::non_empty_path());
  no_tuned->excludes(tuning_db);  // one of the two was ignored, silently
  SMLA_TOOL_PARSE(app, argc, argv);
  if (!smla::tools::list_items_ok(argc, argv, {"--arch"})) return 2;
  Request q;
  auto read = [&] {
    q = read_request(o);
    return 0;
  };
  if (const int rc = smla::tools::run_tool("smla-warmup", read, 2, o.json)) return rc;  // a usage error: 2
  return smla::tools::run_tool("smla-warmup", [&] { return warm(o, q); }, /*thrown=*/1, o.json);
}
