// nvrtc_compiler.hpp: NVRTC behind smla::RtcCompiler.
#pragma once
#include <mutex>
#include <string>
#include <vector>

#include "../backend.hpp"

namespace smla::cuda {

/// The CUDA headers (cuda.h, CCCL's CUB) are found once, when the compiler is made: identity() names the ones every
/// compile() uses, so a cache key never holds a binary built against other headers than it says. Setting
/// SMLA_CUDA_INCLUDE (or CUDA_HOME, CUDA_PATH) later reaches the compilers made after it (a new Runtime), not this one.
class NvrtcCompiler : public RtcCompiler {
 public:
  /// The headers of cuda_include_dir() as the environment says now.
  NvrtcCompiler();
  /// These headers (empty: none; available() then says so).
  explicit NvrtcCompiler(std::string include_dir);

  std::string family() const override { return "cuda"; }
  bool available(std::string* why) const override;
  /// "nvrtc-13.0;cuda-13000;cccl-3000001;headers-<32 hex>;libnvrtc-bytes=N;builtins-bytes=M": the compiler (with its
  /// build, see nvrtc_build_stamp) and the headers it compiles against (include_dir(): versions, and the content of
  /// those a compile can open, see cuda_headers_digest).
  /// Worked out at its first call, once a compiler (the headers are read then).
  std::string identity() const override;
  std::vector<std::string> options(const std::string& target) const override;
  CompileResult compile(const RenderedSource& src, const std::string& target) const override;

  /// Appended to options() for compile() only: NOT in the cache key, so never set on a compiler
  /// whose results are cached. Tests use it for ptxas's report (--ptxas-options=-v).
  std::vector<std::string> extra_options;

  /// The CUDA include directory this compiler compiles against; empty when none was found.
  const std::string& include_dir() const { return include_dir_; }

 private:
  std::string include_dir_;
  mutable std::once_flag identity_once_;  // identity() reads cuda.h: once per compiler, not once per kernel key
  mutable std::string identity_;
};

/// "libnvrtc-bytes=N;builtins-bytes=M": byte sizes of the real file of the library holding
/// `nvrtc_symbol` (found with dladdr, symlinks resolved) and of libnvrtc-builtins.so.MAJOR.MINOR
/// beside it; -1 for a file not found. Tells patch releases apart, which nvrtcVersion does not.
std::string nvrtc_build_stamp(const void* nvrtc_symbol, int major, int minor);

/// XXH3-128 (hex) over the relative path, size and content of every header a compile against the CUDA include
/// directory `inc` can open: everything under cccl/ (and CUDA 12's cub/, thrust/, cuda/, nv/), and cuda.h,
/// cuda_runtime_api.h and the number formats' headers (cuda_fp16.h, cuda_bf16.h, ...) at its top. A header edited in
/// place, or a CCCL snapshot under an unchanged version, changes it; a header no compile opens does not.
std::string cuda_headers_digest(const std::string& inc);

/// Reads `#define NAME <value>` from a header file; empty when absent.
std::string read_define(const std::string& path, const std::string& name);

}  // namespace smla::cuda
