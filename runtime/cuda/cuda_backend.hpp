// cuda_backend.hpp: the CUDA backend (driver API over dlopen, NVRTC cubins).
#pragma once
#include <memory>
#include <mutex>
#include <vector>

#include <cuda.h>

#include "../backend.hpp"
#include "cuda_api.hpp"
#include "nvrtc_compiler.hpp"

namespace smla::cuda {

class CudaBackend : public Backend {
 public:
  CudaBackend();
  ~CudaBackend() override;
  std::string name() const override { return "cuda"; }
  bool usable(std::string* why) const override;
  int device_count() const override;
  std::string target(int device) const override;
  /// target/name/SMs: an H100 and an H200 (both sm_90a) keep separate tuned entries.
  std::string device_class(int device) const override;
  const RtcCompiler* compiler() const override { return &compiler_; }
  std::shared_ptr<LoadedKernel> load(const KernelSpec& spec, const std::vector<uint8_t>& binary,
                                     int device) override;
  bool is_binary_refusal(const Error& e) const override { return cuda::is_binary_refusal(e); }
  void check_stream(int device, void* stream) const override;
  void launch(const LoadedKernel& k, const KernelSpec& spec, const SmlaParams& p, void* stream) override;
  /// One cuPointerGetAttributes a pointer: its memory type, device ordinal and whether it is managed.
  PointerInfo pointer_info(const void* ptr, int device) const override;
  size_t max_shared_memory(int device) const override;
  void read_back(void* dst, const void* src, size_t bytes, void* stream) const override;
  std::string foreign_stream(int device, void* stream) const override;
  void* acquire_side_stream(int device, void* main) override;
  void release_side_stream(int device, void* stream, void* main) override;
  /// How many side streams of a device the pool keeps (past it the oldest not in a capture is destroyed: its work
  /// still completes).
  static constexpr size_t kMaxFreeSideStreams = 16;
  /// The side streams of `device` in the pool now (for tests).
  size_t pooled_side_streams(int device);
  /// Modules this process has loaded so far, every backend instance together (for tests).
  static int64_t modules_loaded();
  void stream_wait(int device, void* waiter, void* on) override;

  /// The device's primary context (retained once per device), for a ContextScope: never left
  /// current on the caller's thread.
  CUcontext context(int device) const;

 private:
  /// The device's handle, for queries that need no context (attributes); throws for a device
  /// that does not exist.
  CUdevice device_handle(int device) const;

  NvrtcCompiler compiler_;
  mutable std::mutex mu_;
  mutable std::vector<CUcontext> ctx_;
  // Side streams (highest priority, non-blocking) not handed out, each with the caller's stream it was last joined to
  // (oldest first), and one fork/join event, per device.
  struct Side {
    std::vector<std::pair<CUstream, void*>> free;
    CUevent event = nullptr;
  };
  std::mutex side_mu_;
  std::vector<Side> side_;
};

/// The compile target for a compute capability: sm_90a on Hopper, sm_XY from 8.0 up; throws
/// Unsupported below sm_80.
std::string target_for_cc(int major, int minor);

/// What load() throws for cuModuleLoadData's error `e`, the driver being CUDA `driver_version` (e.g. 12040) and the
/// NVRTC that compiled the image `nvrtc_major`.`nvrtc_minor`: a refused image from a driver older than that NVRTC
/// becomes Unsupported, saying what to change, and no longer a refusal of the binary (is_binary_refusal): a recompile
/// gives the same image, so a shared entry that nodes with a newer driver use is kept. Any other error, as it is.
Error module_load_error(const Error& e, int driver_version, int nvrtc_major, int nvrtc_minor);
/// Whether `target` is one plan() can produce on some NVIDIA GPU (target_for_cc of a compute capability whose shared
/// memory the planner knows: sm_80, sm_86, sm_87, sm_89, sm_90a, sm_100, ...); else false and why (sm_90 is not:
/// plan() compiles sm_90a for Hopper). What warm-up checks before it keys anything for a named target.
bool cuda_target_supported(const std::string& target, std::string* why);

}  // namespace smla::cuda
