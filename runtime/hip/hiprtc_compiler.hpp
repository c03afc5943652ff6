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

/// Targets smla builds for, as full target ids (what the devices report as gcnArchName).
std::vector<std::string> hip_known_targets();
/// gfx950 (MI355X), the op's home.
std::string hip_default_target();
/// "gfx942:sramecc+:xnack-" -> "gfx942".
std::string hip_target_processor(const std::string& target_id);
/// The full target ids a device of `given` may report, for warming what plan() will look up
/// (it keys with gcnArchName). A processor ("gfx90a") or partial id ("gfx90a:xnack+") of a known
/// target is completed from hip_known_targets(); without an explicit xnack, both xnack- and
/// xnack+ are returned. Anything else (another processor, an unknown feature) is returned as given.
std::vector<std::string> hip_target_ids(const std::string& given);

/// Path of the smla-hiprtc-worker executable: `hint` if given, else next to the running
/// executable, next to the library holding smla (or its ../bin), else the build tree's bin/.
/// Empty when none is found.
std::string hip_worker_path(const std::string& hint = "");

/// Whether this hipRTC compiles for `target`: a tiny kernel is compiled once in a worker
/// subprocess (so an abort cannot take this process down) and the answer is cached. `why`
/// explains a no. Throws nothing.
bool hip_target_known(const std::string& target, std::string* why, const std::string& worker = "");

class HipRtcCompiler : public RtcCompiler {
 public:
  /// `probe_targets`: probe a target in a subprocess before its first in-process compile (off
  /// only inside the worker itself). `worker`: path hint for hip_worker_path().
  explicit HipRtcCompiler(bool probe_targets = true, std::string worker = "");

  std::string family() const override { return "hip"; }
  bool available(std::string* why) const override;
  /// "hip-runtime=<HIP_VERSION>;comgr=<major.minor>;clang=<.comment of a code object>", then
  /// detail::hiprtc_env_options(). Never hiprtcVersion, which is hard-coded in the library.
  std::string identity() const override;
  std::vector<std::string> options(const std::string& target) const override;
  /// Serialized by a process-wide mutex. Throws Status::CompileError carrying the hipRTC log and
  /// the path of the dumped source.
  CompileResult compile(const RenderedSource& src, const std::string& target) const override;

 private:
  std::string base_identity() const;  // everything but the environment; computed once
  bool probe_targets_;
  std::string worker_;
};

/// One source compiled by a worker.
struct HipWorkerResult {
  bool ok = false;
  CompileResult result;  // binary when ok; the log in any case
  std::string error;     // what failed (exit status, signal, the dumped-source path)
  int exit_status = -1;  // the worker's exit status (see hiprtc_worker.cpp); -1 if it died
};

/// Compiles `sources` for `target` in up to `jobs` concurrent smla-hiprtc-worker processes.
/// Results are in the order of `sources`. Throws Status::CompileError only when no worker can
/// be started (none found); per-source failures are reported in the results.
std::vector<HipWorkerResult> hip_compile_in_subprocesses(const std::vector<RenderedSource>& sources,
                                                         const std::string& target, int jobs,
                                                         const std::string& worker = "");

namespace detail {
/// ";HIPRTC_COMPILE_OPTIONS_APPEND=<v>;HIPRTC_LINK_OPTIONS_APPEND=<v>" for those set and
/// non-empty: options hipRTC adds to every compile or link, so part of the compiler identity.
std::string hiprtc_env_options();
/// The worker's request file: target, then the RenderedSource, as length-prefixed records.
void write_request(const std::string& path, const RenderedSource& src, const std::string& target);
bool read_request(const std::string& path, RenderedSource* src, std::string* target);
/// Writes the rendered source (and its headers, under <path>.headers/) for a failed compile.
std::string dump_failed_source(const RenderedSource& src, const std::string& target);
}  // namespace detail

}  // namespace smla::hip
