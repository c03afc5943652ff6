// hiprtc_compiler.hpp: hipRTC behind smla::RtcCompiler, plus parallel compiles in subprocesses.
//
// hipRTC is serial inside a process (comgr holds process-wide locks), and in ROCm 5.x it aborts
// the whole process on a target it does not know or on an LLVM selection error. So: compiles in
// this process are serialized by one mutex, a target is first probed in a helper subprocess
// (smla-hiprtc-worker, cached per process), and warm-up of many kernels runs in helper
// subprocesses, as rocFFT and MIOpen do.
#pragma once
#include <mutex>
#include <string>
#include <vector>

#include "../backend.hpp"

namespace smla::hip {

struct Api;

/// Targets smla builds for, as full target ids (what the devices report as gcnArchName).
std::vector<std::string> hip_known_targets();
/// The processors of hip_known_targets(), the only ones smla's AMD kernels are written for (their
/// bf16 MFMA instructions): "gfx950", "gfx942", "gfx90a".
std::vector<std::string> hip_supported_processors();
/// Whether `target` is a well-formed target id (a processor, then each of sramecc and xnack at
/// most once, each with + or -) naming a supported processor. Anything else (gfx908, gfx1100,
/// "gfx90a:xnack", "gfx90a:xnack+:xnack-") is refused before any compile: ROCm's LLVM aborts the
/// process compiling the kernels for another processor, and hipRTC misreads odd spellings. `why`
/// says what is wrong (naming the supported processors). Throws nothing.
bool hip_target_supported(const std::string& target, std::string* why);
/// gfx950 (MI355X), the op's home.
std::string hip_default_target();
/// "gfx942:sramecc+:xnack-" -> "gfx942".
std::string hip_target_processor(const std::string& target_id);
/// The full target ids a device of `given` may report, for warming what plan() will look up
/// (it keys with gcnArchName). A processor ("gfx90a") or partial id ("gfx90a:xnack+") of a known
/// target is completed from hip_known_targets(); without an explicit xnack, both xnack- and
/// xnack+ are returned. Anything else (another processor, an unknown or repeated feature, a
/// feature without + or -) is returned as given, to be refused where it is used.
std::vector<std::string> hip_target_ids(const std::string& given);

/// Path of the smla-hiprtc-worker executable: `hint` if given, else $SMLA_HIPRTC_WORKER if set,
/// else next to the running executable, next to the library holding smla (or its ../bin), else the
/// build tree's bin/. Empty when none is found (or the one named is not an executable file).
std::string hip_worker_path(const std::string& hint = "");

/// Whether this hipRTC compiles for `target`, which must be supported (hip_target_supported: else
/// no worker runs and `why` says why): a tiny kernel is compiled in a worker subprocess (so
/// an abort cannot take this process down). A definite answer is cached for the process's life
/// (see detail::probe_verdict); a probe that gave none (the worker was killed, timed out, could
/// not try) is not, and the next call probes again. `why` explains a no. Throws nothing.
bool hip_target_known(const std::string& target, std::string* why, const std::string& worker = "");

/// hipRTC behind smla::RtcCompiler.
///
/// compile() (what plan() calls) refuses unsupported targets (hip_target_supported), probes the
/// target once in a worker, then compiles in an smla-hiprtc-worker process, so that a compiler
/// crash (ROCm's LLVM aborts on some errors) becomes an smla::Error instead of the caller's death.
/// Without a worker (none found: see hip_worker_path), or with one that cannot open hipRTC, it refuses a target the
/// installed ROCm is too old for, and compiles in this process after a warning (once) saying how to provide one.
class HipRtcCompiler : public RtcCompiler {
 public:
  /// `probe_targets` false only inside the worker itself: compile in this process, as asked,
  /// with no probe and no refusal. `worker`: path hint for hip_worker_path().
  explicit HipRtcCompiler(bool probe_targets = true, std::string worker = "");

  std::string family() const override { return "hip"; }
  bool available(std::string* why) const override;
  /// "hip-runtime=<HIP_VERSION>;comgr=<major.minor>;clang=<.comment of a code object>", then
  /// detail::hiprtc_env_options(). Never hiprtcVersion, which is hard-coded in the library.
  std::string identity() const override;
  std::vector<std::string> options(const std::string& target) const override;
  /// In-process compiles are serialized by a process-wide mutex. Throws Status::Unsupported for a
  /// processor smla does not support, Status::CompileError carrying the hipRTC log and the path of
  /// the dumped source, or what ended the worker.
  CompileResult compile(const RenderedSource& src, const std::string& target) const override;
  /// The worker's compile: in this process, with the options the parent's cache key holds (its request carries
  /// them), not this binary's own options(): a worker from another smla build must not store another compile under
  /// the parent's key.
  CompileResult compile_with(const RenderedSource& src, const std::string& target,
                             const std::vector<std::string>& options) const;

 private:
  std::string base_identity() const;  // everything but the environment; computed once
  /// A compile in this process where no worker could probe the target (`no_probe` says why): refuses a target this
  /// ROCm is too old for; `warn`: say once that a compiler crash would end the process.
  CompileResult compile_here(const Api& api, const RenderedSource& src, const std::string& target,
                             const std::string& no_probe, bool warn) const;
  bool probe_targets_;
  std::string worker_;
};

/// One source compiled by a worker.
struct HipWorkerResult {
  bool ok = false;
  CompileResult result;  // binary when ok; the log in any case
  std::string error;     // what failed (exit status, signal, the dumped-source path)
  int exit_status = -1;  // the worker's exit status (see hiprtc_worker.cpp); -1 if it died
  int signal = 0;        // the signal that ended it, if one did
  bool timed_out = false;
  bool started = false;  // a worker process ran (however it ended: its status may have been lost)
};

/// Compiles `sources` for `target` in up to `jobs` concurrent smla-hiprtc-worker processes, each
/// killed when still running after hip_worker_timeout_s() (SMLA_HIPRTC_TIMEOUT_S).
/// Results are in the order of `sources`. Throws Status::CompileError only when no worker can
/// be started (none found); per-source failures are reported in the results.
std::vector<HipWorkerResult> hip_compile_in_subprocesses(const std::vector<RenderedSource>& sources,
                                                         const std::string& target, int jobs,
                                                         const std::string& worker = "");

namespace detail {
enum class ProbeVerdict { Known, Refused, NoVerdict, TimedOut };
/// What a target probe's worker result says. Known: a valid code object. Refused, a definite no:
/// hipRTC reported an error on the one-line probe kernel (exit 2), or crashed on it (SIGABRT,
/// SIGSEGV, SIGBUS, SIGILL, SIGFPE; ROCm 5.x aborts on a processor it does not know), or produced
/// no valid AMDGPU ELF. TimedOut: no verdict, the worker stopped at SMLA_HIPRTC_TIMEOUT_S on a one-line kernel
/// (hipRTC hangs here: a compile behind it, or one in this process, would hang too). NoVerdict: anything else (the
/// worker could not try, was killed by SIGKILL or SIGTERM, could not start, its exit status was lost).
ProbeVerdict probe_verdict(const HipWorkerResult& r);
/// hip_target_known with the verdict; a Refused `why` adds, for gfx950 and gfx942, the ROCm they need.
/// `worker_ran` (optional): set to whether a worker process ran this probe, however it ended (false: a cached verdict,
/// no worker found, or none could start); `worker_exit` to its exit status (-1 when killed by a signal, or when its
/// status was lost: SIGCHLD ignored and no status file written).
ProbeVerdict probe_target(const std::string& target, std::string* why, const std::string& worker = "",
                          bool* worker_ran = nullptr, int* worker_exit = nullptr);
/// Forgets the cached verdicts (tests).
void forget_probes();
/// Forgets the computed compiler identity (tests): the next identity() probes again.
void forget_identity();
/// ";HIPRTC_COMPILE_OPTIONS_APPEND=<v>;HIPRTC_LINK_OPTIONS_APPEND=<v>" for those set and
/// non-empty: options hipRTC adds to every compile or link, so part of the compiler identity.
std::string hiprtc_env_options();
/// The worker's request file, length-prefixed records: kRequestFormat, the target, the options (a count, then each),
/// then the RenderedSource. read_request() is false on a request of another format (a worker of another smla).
constexpr const char* kRequestFormat = "smla-hiprtc-request 2";
void write_request(const std::string& path, const RenderedSource& src, const std::string& target,
                   const std::vector<std::string>& options);
bool read_request(const std::string& path, RenderedSource* src, std::string* target, std::vector<std::string>* options);
}  // namespace detail

}  // namespace smla::hip
