// hiprtc_compiler.cpp: see hiprtc_compiler.hpp.
#include "hiprtc_compiler.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <fstream>
#include <locale>
#include <map>
#include <sstream>

#include "../dump.hpp"
#include "amdgpu_elf.hpp"
#include "hip_api.hpp"
#include "hip_log.hpp"
#include "hip_subprocess.hpp"

namespace smla::hip {

namespace {

// comgr's locks are process-wide, so one mutex covers every compiler object.
std::mutex& compile_mutex() {
  static std::mutex m;
  return m;
}

const char* const kProbeSource =
    "extern \"C\" __global__ void smla_probe(int* p) { if (p) p[threadIdx.x] = 1; }\n";

struct Program {  // RAII hiprtcProgram: destroyed on every path, errors included
  const Api& api;
  hiprtcProgram p = nullptr;
  explicit Program(const Api& a) : api(a) {}
  ~Program() {
    if (p) api.hiprtcDestroyProgram(&p);
  }
};

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

struct ProbeCache {
  std::mutex m;
  std::map<std::string, std::pair<bool, std::string>> known;  // target -> (known, why)
  std::vector<uint8_t> any_binary;                            // a probe's code object
};
ProbeCache& probes() {
  static ProbeCache c;
  return c;
}

// Said in the warning of an in-process compile: there comgr's own cache follows the caller's environment (smla sets
// nothing in it), where the worker's is off.
std::string comgr_cache_note() {
  if (std::getenv("AMD_COMGR_CACHE")) return "";
  return "; comgr's own on-disk cache (ROCm >= 7) is then on unless AMD_COMGR_CACHE=0 is in this process's environment "
         "(smla does not set it here: setenv is not safe beside other threads)";
}

CompileResult compile_locked(const Api& api, const RenderedSource& src, const std::string& target,
                             const std::vector<std::string>& opts) {
  // comgr (ROCm >= 7) keeps its own on-disk cache by default, beside ours: redundant, and it crashed with SIGBUS on
  // NFS under contention (CACHE-LESSONS.md). The worker's environment turns it off (hip_subprocess.cpp). A compile in
  // this process (no worker, or one without hipRTC) leaves the caller's environment alone: a library's setenv races
  // every other thread's getenv (glibc may move environ under it), so comgr's cache there follows AMD_COMGR_CACHE as
  // the caller set it, and the warning of an in-process compile says so (comgr_cache_note).
  auto t0 = std::chrono::steady_clock::now();
  std::vector<const char*> hdr_text, hdr_name;
  for (const auto& h : src.headers) {
    hdr_name.push_back(h.first.c_str());
    hdr_text.push_back(h.second.c_str());
  }
  Program prog(api);
  SMLA_HIPRTC_CHECK(api, hiprtcCreateProgram(&prog.p, src.text.c_str(), src.name.c_str(),
                                             static_cast<int>(hdr_text.size()), hdr_text.data(),
                                             hdr_name.data()));
  std::vector<const char*> argv;
  for (const auto& o : opts) argv.push_back(o.c_str());
  hiprtcResult rc = api.hiprtcCompileProgram(prog.p, static_cast<int>(argv.size()), argv.data());

  CompileResult out;
  size_t log_size = 0;
  if (api.hiprtcGetProgramLogSize(prog.p, &log_size) == kHiprtcSuccess && log_size > 1) {
    out.log.resize(log_size);
    if (api.hiprtcGetProgramLog(prog.p, &out.log[0]) != kHiprtcSuccess) out.log.clear();
    while (!out.log.empty() && out.log.back() == '\0') out.log.pop_back();
  }
  if (rc != kHiprtcSuccess) {
    std::string dumped = dump_failed_source(src, target);
    throw Error(Status::CompileError,
                "hipRTC failed to compile " + src.name + " for " + target + " (" +
                    hiprtc_error_text(api, rc) + "); source dumped to " + dumped + "\n" + out.log,
                __FILE__, __LINE__, "hiprtcCompileProgram");
  }
  size_t code_size = 0;
  SMLA_HIPRTC_CHECK(api, hiprtcGetCodeSize(prog.p, &code_size));
  out.binary.resize(code_size);
  SMLA_HIPRTC_CHECK(api, hiprtcGetCode(prog.p, reinterpret_cast<char*>(out.binary.data())));
  if (code_size == 0)
    throw Error(Status::CompileError, "hipRTC returned an empty code object for " + src.name, __FILE__,
                __LINE__, "hiprtcGetCode");
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

// The HIP runtime version (HIP_VERSION: major * 10^7 + minor * 10^5 + patch) of the first ROCm whose
// hipRTC compiles for `processor`, with its name; 0 where every ROCm smla loads (>= 5.0) does.
std::pair<int, const char*> min_rocm_of(const std::string& processor) {
  if (processor == "gfx950") return {70000000, "7.0"};
  if (processor == "gfx942") return {50700000, "5.7"};
  return {0, ""};
}

// "; gfx950 needs ROCm >= 7.0 (this is HIP 5.2.21153)" for the processors a ROCm may be too old for, else "".
std::string rocm_hint(const std::string& target) {
  const std::string proc = hip_target_processor(target);
  const auto [version, name] = min_rocm_of(proc);
  if (!version) return "";
  std::string have;
  if (const Api* api = Api::get()) {
    try {
      have = " (this is HIP " + hip_version_string(hip_runtime_version(*api)) + ")";
    } catch (const std::exception&) {
    }
  }
  return "; " + proc + " needs ROCm >= " + name + have;
}

// One source compiled in a worker process: a compile error is reported as the in-process compile reports it (the
// worker's log is that message), any other end of the worker (a signal: hipRTC or LLVM aborted) names it. Nothing
// when the worker could not open hipRTC (exit 4) where this process could (a HIP runtime only this process has,
// e.g. a framework's bundled one): the caller compiles here then.
std::optional<CompileResult> compile_in_worker(const RenderedSource& src, const std::string& target,
                                               const std::string& exe) {
  std::vector<HipWorkerResult> r = hip_compile_in_subprocesses({src}, target, 1, exe);
  if (r.at(0).ok) return std::move(r[0].result);
  if (r[0].exit_status == 2 && !r[0].result.log.empty())
    throw Error(Status::CompileError, r[0].result.log, __FILE__, __LINE__, "hiprtcCompileProgram");
  if (r[0].exit_status == 4) {
    detail::warn_once("smla-hiprtc-worker (" + exe + ") cannot open hipRTC (" + r[0].error +
                      "): hipRTC compiles in this process, where a compiler crash ends the process" +
                      comgr_cache_note());
    return std::nullopt;
  }
  if (r[0].exit_status == 6)  // hipRTC failed outside the compile (or the worker ran out of memory): no dump
    throw Error(Status::CompileError,
                "smla-hiprtc-worker (" + exe + ") could not compile " + src.name + " for " + target + ": " +
                    r[0].error + (r[0].result.log.empty() ? "" : ": " + r[0].result.log),
                __FILE__, __LINE__, "hiprtcCompileProgram");
  if (r[0].exit_status == 7)  // compiled, its result not written: no dump
    throw Error(Status::CompileError,
                "smla-hiprtc-worker (" + exe + ") compiled " + src.name + " for " + target +
                    " but could not hand back its result: " + r[0].error,
                __FILE__, __LINE__, "hiprtcCompileProgram");
  if (r[0].exit_status == 3 || r[0].exit_status == 5)  // the source is not at fault: no dump
    throw Error(Status::CompileError,
                "smla-hiprtc-worker (" + exe + ") did not compile " + src.name + " for " + target + ": " +
                    r[0].error +
                    (r[0].exit_status == 3 ? " (a worker of another smla version? SMLA_HIPRTC_WORKER names the one "
                                             "to use)"
                                           : ""),
                __FILE__, __LINE__, "hiprtcCompileProgram");
  const std::string dumped = dump_failed_source(src, target);
  throw Error(Status::CompileError,
              "smla-hiprtc-worker (" + exe + ") failed to compile " + src.name + " for " + target + ": " +
                  r[0].error + "; source dumped to " + dumped,
              __FILE__, __LINE__, "hiprtcCompileProgram");
}

}  // namespace

// ---------------------------------------------------------------- targets

std::vector<std::string> hip_known_targets() {
  // MI355X, MI300X/MI325X, MI250X as their drivers report them.
  return {"gfx950:sramecc+:xnack-", "gfx942:sramecc+:xnack-", "gfx90a:sramecc+:xnack-"};
}

std::string hip_default_target() { return hip_known_targets().front(); }

std::string hip_target_processor(const std::string& target_id) {
  return target_id.substr(0, target_id.find(':'));
}

std::vector<std::string> hip_supported_processors() {
  std::vector<std::string> out;
  for (const std::string& k : hip_known_targets()) out.push_back(hip_target_processor(k));
  return out;
}

namespace {

// Target-id syntax (LLVM's): a processor "gfx" + hex digits, then ":<feature><+|->" for each of
// sramecc and xnack at most once. Empty when `target` is well formed, else what is wrong.
std::string target_id_error(const std::string& target) {
  const std::string example = " (smla supports gfx90a, gfx942 and gfx950: e.g. gfx942 or gfx942:sramecc+:xnack-)";
  const std::string proc = hip_target_processor(target);
  bool hex = proc.size() > 3 && proc.compare(0, 3, "gfx") == 0;
  for (size_t i = 3; hex && i < proc.size(); ++i) hex = std::isxdigit(static_cast<unsigned char>(proc[i])) &&
                                                       !std::isupper(static_cast<unsigned char>(proc[i]));
  if (!hex) return "'" + proc + "' is not an AMD processor name" + example;
  std::vector<std::string> seen;
  for (size_t b = target.find(':'); b != std::string::npos;) {
    const size_t e = target.find(':', b + 1);
    const std::string f = target.substr(b + 1, e == std::string::npos ? e : e - b - 1);
    const char sign = f.empty() ? '\0' : f.back();
    const std::string name = f.empty() ? f : f.substr(0, f.size() - 1);
    if (name != "sramecc" && name != "xnack") {
      if (sign != '+' && sign != '-' && (f == "sramecc" || f == "xnack"))
        return "the feature '" + f + "' needs a + or -" + example;
      return "unknown feature '" + f + "' (features: sramecc+/-, xnack+/-)" + example;
    }
    if (sign != '+' && sign != '-') return "the feature '" + f + "' needs a + or -" + example;
    if (std::find(seen.begin(), seen.end(), name) != seen.end()) return "the feature " + name + " is named twice";
    seen.push_back(name);
    b = e;
  }
  return "";
}

}  // namespace

bool hip_target_supported(const std::string& target, std::string* why) {
  if (const std::string bad = target_id_error(target); !bad.empty()) {
    if (why) *why = "malformed AMD target id '" + target + "': " + bad;
    return false;
  }
  const std::vector<std::string> procs = hip_supported_processors();
  const std::string proc = hip_target_processor(target);
  if (std::find(procs.begin(), procs.end(), proc) != procs.end()) return true;
  if (why) {
    std::string list;
    for (const std::string& p : procs) list += (list.empty() ? "" : ", ") + p;
    *why = "AMD processor '" + proc + "' (target '" + target + "') is not supported: smla's AMD kernels use the bf16 " +
           "MFMA instructions of " + list + " only (ROCm's compiler aborts on them for other processors)";
  }
  return false;
}

std::vector<std::string> hip_target_ids(const std::string& given) {
  if (!target_id_error(given).empty()) return {given};  // refused, saying why, where it is used
  const std::string proc = hip_target_processor(given);
  std::string known;
  for (const std::string& k : hip_known_targets())
    if (hip_target_processor(k) == proc) known = k;
  if (known.empty()) return {given};  // not one of ours: hipRTC's probe judges it as given
  // (name, '+' or '-') in the known id's order, which is LLVM's canonical one.
  using Features = std::vector<std::pair<std::string, char>>;
  auto features = [](const std::string& id, Features* f) {
    for (size_t b = id.find(':'); b != std::string::npos;) {
      const size_t e = id.find(':', b + 1);
      const std::string s = id.substr(b + 1, e == std::string::npos ? e : e - b - 1);
      if (s.size() < 2 || (s.back() != '+' && s.back() != '-')) return false;
      f->emplace_back(s.substr(0, s.size() - 1), s.back());
      b = e;
    }
    return true;
  };
  Features f, g;
  if (!features(known, &f) || !features(given, &g)) return {given};
  bool xnack_given = false;
  for (const auto& [name, sign] : g) {
    auto it = std::find_if(f.begin(), f.end(), [&](const auto& x) { return x.first == name; });
    if (it == f.end()) return {given};
    it->second = sign;
    xnack_given |= name == "xnack";
  }
  auto id = [&] {
    std::string s = proc;
    for (const auto& [name, sign] : f) s += ":" + name + sign;
    return s;
  };
  std::vector<std::string> out = {id()};
  // HSA_XNACK=1 makes the same GPU report xnack+ (a per-process switch, so one machine sees
  // both); a plain "gfx90a" is meant to cover it. sramecc is a board setting: kept as known.
  if (!xnack_given)
    for (auto& [name, sign] : f)
      if (name == "xnack") {
        sign = sign == '-' ? '+' : '-';
        out.push_back(id());
      }
  return out;
}

namespace detail {

ProbeVerdict probe_verdict(const HipWorkerResult& r) {
  if (r.ok) return read_elf(r.result.binary).valid ? ProbeVerdict::Known : ProbeVerdict::Refused;
  if (r.timed_out) return ProbeVerdict::TimedOut;
  // hipRTC reported an error on a one-line kernel: it does not know the target (ROCm >= 6 says so).
  if (r.exit_status == 2) return ProbeVerdict::Refused;
  // hipRTC or its LLVM crashed on it (ROCm 5.x aborts on a processor it does not know).
  switch (r.signal) {
    case SIGABRT:
    case SIGSEGV:
    case SIGBUS:
    case SIGILL:
    case SIGFPE:
      return ProbeVerdict::Refused;
    default:
      break;
  }
  // Anything else says nothing about the target: the worker could not try (3, 4), failed outside the compile (6) or
  // could not hand back its result (7), was killed
  // (SIGKILL by the OOM killer, SIGTERM, SIGINT), its exit status was lost, it could not start.
  return ProbeVerdict::NoVerdict;
}

ProbeVerdict probe_target(const std::string& target, std::string* why, const std::string& worker, bool* worker_ran,
                          int* worker_exit) {
  if (worker_ran) *worker_ran = false;
  if (worker_exit) *worker_exit = -1;
  // A malformed id or another processor is refused as such: no worker runs (hipRTC took
  // "gfx90a:xnack" for a target and crashed on it; it aborts compiling the kernels for gfx908).
  if (!hip_target_supported(target, why)) return ProbeVerdict::Refused;
  ProbeCache& c = probes();
  {
    std::lock_guard<std::mutex> lk(c.m);
    auto it = c.known.find(target);
    if (it != c.known.end()) {
      if (why) *why = it->second.second;
      return it->second.first ? ProbeVerdict::Known : ProbeVerdict::Refused;
    }
  }
  RenderedSource probe{"smla_probe.cpp", kProbeSource, {}};
  std::vector<HipWorkerResult> r;
  try {
    r = hip_compile_in_subprocesses({probe}, target, 1, worker);
  } catch (const std::exception& e) {
    if (why) *why = std::string("the hipRTC probe of ") + target + " could not run: " + e.what();
    return ProbeVerdict::NoVerdict;  // not cached: a worker may appear later (e.g. a path hint)
  }
  const ProbeVerdict v = probe_verdict(r.at(0));
  if (worker_ran) *worker_ran = r[0].started;
  if (worker_exit) *worker_exit = r[0].exit_status;
  if (v == ProbeVerdict::NoVerdict || v == ProbeVerdict::TimedOut) {  // not cached: the next compile probes again
    if (why) {
      *why = "the hipRTC probe of " + target + " gave no verdict: " + r[0].error;
      if (!r[0].result.log.empty()) *why += "; " + r[0].result.log;
    }
    return v;
  }
  std::string reason;
  if (v == ProbeVerdict::Refused) {
    reason = "hipRTC cannot compile for " + target + ": ";
    reason += r[0].ok ? "its code object is not a valid AMDGPU ELF" : r[0].error;
    reason += rocm_hint(target);
  }
  std::lock_guard<std::mutex> lk(c.m);
  c.known[target] = {v == ProbeVerdict::Known, reason};
  if (v == ProbeVerdict::Known && c.any_binary.empty()) c.any_binary = r[0].result.binary;
  if (why) *why = reason;
  return v;
}

void forget_probes() {
  std::lock_guard<std::mutex> lk(probes().m);
  probes().known.clear();
}

}  // namespace detail

bool hip_target_known(const std::string& target, std::string* why, const std::string& worker) {
  try {
    return detail::probe_target(target, why, worker) == detail::ProbeVerdict::Known;
  } catch (const std::exception& e) {  // e.g. std::bad_alloc: this one throws nothing
    if (why) *why = std::string("the hipRTC probe of ") + target + " failed: " + e.what();
    return false;
  }
}

// ---------------------------------------------------------------- compiler

HipRtcCompiler::HipRtcCompiler(bool probe_targets, std::string worker)
    : probe_targets_(probe_targets), worker_(std::move(worker)) {}

bool HipRtcCompiler::available(std::string* why) const { return Api::get(why) != nullptr; }

std::vector<std::string> HipRtcCompiler::options(const std::string& target) const {
  std::vector<std::string> o = {"--offload-arch=" + target, "-O3", "-std=c++17"};
  std::sort(o.begin(), o.end());
  return o;
}

namespace detail {
std::string hiprtc_env_options() {
  std::string s;
  for (const char* name : {"HIPRTC_COMPILE_OPTIONS_APPEND", "HIPRTC_LINK_OPTIONS_APPEND"}) {
    const char* v = std::getenv(name);
    if (v && *v) s += std::string(";") + name + "=" + v;
  }
  return s;
}
}  // namespace detail

std::string HipRtcCompiler::identity() const {
  // hipRTC appends these variables' options to every compile or link, here and in the workers
  // (which inherit our environment): they change the code, so they are part of the key. Read on
  // every call, not once, so the key follows the environment the compile will see.
  return base_identity() + detail::hiprtc_env_options();
}

namespace {
// The identity without the environment, once computed (a failed computation keeps nothing: the next plan() asks again).
struct IdentityCache {
  std::mutex m;
  std::string id;
};
IdentityCache& identity_cache() {
  static IdentityCache c;
  return c;
}
}  // namespace

void detail::forget_identity() {
  std::lock_guard<std::mutex> lk(identity_cache().m);
  identity_cache().id.clear();
}

std::string HipRtcCompiler::base_identity() const {
  IdentityCache& cache = identity_cache();
  std::lock_guard<std::mutex> lk(cache.m);
  if (!cache.id.empty()) return cache.id;
  {
    const Api& api = Api::require();
    std::ostringstream s;
    s << "hip-runtime=" << hip_runtime_version(api);
    size_t major = 0, minor = 0;
    if (api.amd_comgr_get_version) {
      api.amd_comgr_get_version(&major, &minor);
      s << ";comgr=" << major << "." << minor;
    } else {
      s << ";comgr=unknown";
    }
    // The clang that hipRTC runs stamps its version into .comment of what it produces. Take it
    // from a probe compiled in a worker; without a worker, compile the probe here for gfx90a,
    // which every ROCm from 5.0 on knows.
    std::vector<uint8_t> bin;
    const std::string fallback = "gfx90a";
    std::string why;
    bool worker_ran = false;
    int worker_exit = -1;
    const detail::ProbeVerdict v = detail::probe_target(fallback, &why, worker_, &worker_ran, &worker_exit);
    // A worker that hung on the probe: hipRTC in this process would hang plan() with no time limit. One that ran and
    // gave no verdict for another reason (killed by a signal: the OOM killer, a SIGTERM; a worker of another smla
    // version) says nothing of whether hipRTC here would survive it either. Both are said instead (the identity is
    // asked again by the next plan()); only a worker without hipRTC (exit 4), or none at all, leaves the probe to this
    // process, as compile() does.
    if (v == detail::ProbeVerdict::TimedOut ||
        (v == detail::ProbeVerdict::NoVerdict && worker_ran && worker_exit != 4))
      throw Error(Status::CompileError, "the compiler's identity (part of every AMD cache key) is unknown: " + why,
                  __FILE__, __LINE__, "hiprtcCompileProgram");
    if (v == detail::ProbeVerdict::Known) {
      std::lock_guard<std::mutex> lk(probes().m);
      bin = probes().any_binary;
    } else if (v == detail::ProbeVerdict::NoVerdict) {  // no worker, or one without hipRTC: gfx90a is safe here
      std::lock_guard<std::mutex> lk(compile_mutex());
      bin = compile_locked(api, RenderedSource{"smla_probe.cpp", kProbeSource, {}}, fallback,
                           options(fallback)).binary;
    }
    ElfInfo elf = read_elf(bin);
    s << ";clang=";
    for (size_t i = 0; i < elf.comments.size(); ++i) s << (i ? "|" : "") << elf.comments[i];
    cache.id = s.str();
  }
  return cache.id;
}

CompileResult HipRtcCompiler::compile_with(const RenderedSource& src, const std::string& target,
                                           const std::vector<std::string>& options) const {
  const Api& api = Api::require();
  std::lock_guard<std::mutex> lk(compile_mutex());
  return compile_locked(api, src, target, options);
}

CompileResult HipRtcCompiler::compile(const RenderedSource& src, const std::string& target) const {
  if (!probe_targets_) {  // the worker: compile here, as asked
    const Api& api = Api::require();
    std::lock_guard<std::mutex> lk(compile_mutex());
    return compile_locked(api, src, target, options(target));
  }
  std::string why;
  if (!hip_target_supported(target, &why))
    throw Error(Status::Unsupported, why, __FILE__, __LINE__, "hiprtcCompileProgram");
  const Api& api = Api::require();
  const std::string exe = hip_worker_path(worker_);
  if (!exe.empty()) {
    // A probe that could not run (the worker was killed) is no verdict: the compile itself runs in a worker too, so
    // nothing is risked by going on. One that timed out on a one-line kernel fails the compile at once (it waited a
    // second timeout behind it, the same hang most likely: 20 minutes a plan() at the default 600 s).
    const detail::ProbeVerdict v = detail::probe_target(target, &why, exe);
    if (v == detail::ProbeVerdict::Refused || v == detail::ProbeVerdict::TimedOut)
      throw Error(Status::CompileError, why, __FILE__, __LINE__, "hiprtcCompileProgram");
    if (std::optional<CompileResult> r = compile_in_worker(src, target, exe)) return std::move(*r);
    // The worker has no hipRTC (its probe was no verdict): here, under the same guard as without a worker.
    return compile_here(api, src, target, "smla-hiprtc-worker (" + exe + ") could not open hipRTC to probe it", false);
  }
  return compile_here(api, src, target,
                      "smla-hiprtc-worker was not found to probe it: set SMLA_HIPRTC_WORKER or install it next to the "
                      "executable or libsmla",
                      true);
}

// This process compiles, and a hipRTC abort would end it. Refuse what this ROCm is known to be too old for (hipRTC
// 5.x aborts on an unknown processor), warn about the rest (compile_in_worker warned already where it ran).
CompileResult HipRtcCompiler::compile_here(const Api& api, const RenderedSource& src, const std::string& target,
                                           const std::string& no_probe, bool warn) const {
  const std::string proc = hip_target_processor(target);
  const auto [need, need_name] = min_rocm_of(proc);
  const int have = hip_runtime_version(api);
  if (have < need)
    throw Error(Status::CompileError,
                "hipRTC of HIP " + hip_version_string(have) + " cannot compile for " + target + ": " + proc +
                    " needs ROCm >= " + need_name + " (" + no_probe + ")",
                __FILE__, __LINE__, "hiprtcCompileProgram");
  if (warn)
    detail::warn_once(
        "smla-hiprtc-worker not found (set SMLA_HIPRTC_WORKER to it, or install it next to the executable or "
        "libsmla): hipRTC compiles in this process, where a compiler crash (ROCm's LLVM aborts on some errors) "
        "ends the process" + comgr_cache_note());
  std::lock_guard<std::mutex> lk(compile_mutex());
  return compile_locked(api, src, target, options(target));
}

// ---------------------------------------------------------------- subprocesses

std::vector<HipWorkerResult> hip_compile_in_subprocesses(const std::vector<RenderedSource>& sources,
                                                         const std::string& target, int jobs,
                                                         const std::string& worker) {
  std::string exe = hip_worker_path(worker);
  if (exe.empty())
    throw Error(Status::CompileError,
                "smla-hiprtc-worker not found (looked next to the executable, next to the smla "
                "library and in the build tree); build the smla-hiprtc-worker target",
                __FILE__, __LINE__, "posix_spawn");
  TempDir dir("smla-hiprtc");
  std::vector<std::vector<std::string>> argvs;
  std::vector<std::string> outputs;
  for (size_t i = 0; i < sources.size(); ++i) {
    std::string base = dir.path() + "/" + std::to_string(i);
    // The options of the key (this library's): the worker compiles with them, whichever build it is.
    detail::write_request(base + ".req", sources[i], target, HipRtcCompiler(false).options(target));
    argvs.push_back({exe, "--status", base + ".status", "--parent", std::to_string(getpid()), base + ".req",
                     base + ".co", base + ".log"});
    outputs.push_back(base + ".out");
  }
  std::vector<ChildStatus> st = run_children(argvs, std::max(1, jobs), outputs, hip_worker_timeout_s());

  std::vector<HipWorkerResult> out(sources.size());
  for (size_t i = 0; i < sources.size(); ++i) {
    std::string base = dir.path() + "/" + std::to_string(i);
    if (st[i].lost) {
      // Its exit status went to the kernel (SIGCHLD ignored here): the worker writes it last to
      // a file, so a file says how it ended, and none says it did not finish.
      std::vector<uint8_t> status = read_file(base + ".status");
      std::string text(status.begin(), status.end());
      char* end = nullptr;
      const long code = std::strtol(text.c_str(), &end, 10);
      if (!text.empty() && end && *end == '\n' && code >= 0 && code < 256) {
        st[i].lost = false;
        st[i].exited = true;
        st[i].code = static_cast<int>(code);
      }
    }
    std::vector<uint8_t> log = read_file(base + ".log");
    out[i].result.log.assign(log.begin(), log.end());
    out[i].result.seconds = st[i].seconds;
    out[i].exit_status = st[i].exited ? st[i].code : -1;
    out[i].signal = st[i].started && !st[i].exited ? st[i].signal : 0;
    out[i].timed_out = st[i].timed_out;
    out[i].started = st[i].started;
    if (st[i].exited && st[i].code == 0) {
      out[i].result.binary = read_file(base + ".co");
      out[i].ok = !out[i].result.binary.empty();
      if (!out[i].ok) out[i].error = "the worker wrote no code object";
    } else {
      out[i].error = st[i].describe();
      if (st[i].lost) out[i].error += "; it wrote no status file: it died before finishing";
      // Exit 2: the compile's log; 4: why hipRTC could not be opened (both written to the log file).
      if (st[i].exited && (st[i].code == 2 || st[i].code == 4)) out[i].error += "; " + out[i].result.log;
      // What the worker printed (an LLVM fatal error, a libc abort) says why it died.
      std::vector<uint8_t> printed = read_file(base + ".out");
      std::string text(printed.begin(), printed.end());
      while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
      if (text.size() > 2000) text = "..." + text.substr(text.size() - 2000);
      if (!text.empty()) out[i].error += "; worker output: " + text;
    }
  }
  return out;
}

// ---------------------------------------------------------------- files

namespace detail {

// Records are "<decimal length>\n<bytes>", so any byte may appear in a source.
void write_request(const std::string& path, const RenderedSource& src, const std::string& target,
                   const std::vector<std::string>& options) {
  std::ofstream f(path, std::ios::binary);
  // The lengths in the C locale whatever the host made global: "1,234" in en_US was read back as 1 by the worker.
  f.imbue(std::locale::classic());
  auto rec = [&](const std::string& s) { f << s.size() << '\n' << s; };
  rec(kRequestFormat);
  rec(target);
  rec(std::to_string(options.size()));
  for (const auto& o : options) rec(o);
  rec(src.name);
  rec(src.text);
  rec(std::to_string(src.headers.size()));
  for (const auto& h : src.headers) {
    rec(h.first);
    rec(h.second);
  }
  f.close();
  if (!f) throw Error(Status::Internal, "cannot write the hipRTC worker request " + path, __FILE__, __LINE__, "write");
}

bool read_request(const std::string& path, RenderedSource* src, std::string* target,
                  std::vector<std::string>* options) {
  std::ifstream f(path, std::ios::binary);
  f.imbue(std::locale::classic());
  auto rec = [&](std::string* s) {
    size_t n = 0;
    if (!(f >> n) || f.get() != '\n' || n > (size_t(1) << 30)) return false;
    s->resize(n);
    return n == 0 || static_cast<bool>(f.read(&(*s)[0], static_cast<std::streamsize>(n)));
  };
  std::string format, count;
  if (!rec(&format) || format != kRequestFormat || !rec(target) || !rec(&count)) return false;
  options->assign(std::strtoul(count.c_str(), nullptr, 10), std::string());
  for (auto& o : *options)
    if (!rec(&o)) return false;
  if (!rec(&src->name) || !rec(&src->text) || !rec(&count)) return false;
  size_t n = std::strtoul(count.c_str(), nullptr, 10);
  src->headers.resize(n);
  for (auto& h : src->headers)
    if (!rec(&h.first) || !rec(&h.second)) return false;
  return true;
}

}  // namespace detail
}  // namespace smla::hip
