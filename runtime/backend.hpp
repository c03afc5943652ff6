// backend.hpp: what the planner needs from a device backend (cpu, cuda, hip).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "phases.hpp"
#include "smla/smla.hpp"  // smla::Error: declared first there, where it is exported (a bare forward declaration
                          // here made its type information hidden in libsmla.so)
#include "../kernel_src/smla_params.h"

namespace smla {

/// A translation unit ready for a run-time compiler: the constants, then the kernel source.
/// Headers it includes from kernel_src/ travel alongside (name, content), so the compile never
/// reads the disk and the cache key covers every byte.
struct RenderedSource {
  std::string name;  // e.g. "dq.cu"
  std::string text;
  std::vector<std::pair<std::string, std::string>> headers;
};

struct CompileResult {
  std::vector<uint8_t> binary;  // cubin / code object
  std::string log;
  double seconds = 0;
};

/// A run-time compiler for one backend family (NVRTC, hipRTC). Thread safety is the
/// implementation's to state: NVRTC compiles distinct programs on several threads at once.
class RtcCompiler {
 public:
  virtual ~RtcCompiler() = default;
  virtual std::string family() const = 0;  // "cuda" | "hip"
  /// Whether the compiler library could be opened here (no GPU needed); `why` says what failed.
  virtual bool available(std::string* why) const = 0;
  /// Identity of the compiler for cache keys (version of the compiler and of its headers).
  virtual std::string identity() const = 0;
  /// The options used for `target`, sorted, as they go into the cache key.
  virtual std::vector<std::string> options(const std::string& target) const = 0;
  /// Compiles; throws smla::Error carrying the log and the dumped source path on failure.
  virtual CompileResult compile(const RenderedSource& src, const std::string& target) const = 0;
};

/// A kernel loaded for one device, ready to launch. Opaque to the planner.
class LoadedKernel {
 public:
  virtual ~LoadedKernel() = default;
};

/// Unreadable: an address this process cannot read (the CPU backend's answer for device memory when no driver can
/// say so).
enum class PointerKind { Device, Host, Unknown, Unreadable };

/// Where a pointer lives, for argument validation.
struct PointerInfo {
  PointerKind kind = PointerKind::Unknown;
  /// For device memory: the device it was allocated on, when that is not the one asked about; -1 when it is, when the
  /// memory is managed (every device can use it) or when the backend cannot tell.
  int other_device = -1;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;  // "cpu" | "cuda" | "hip"
  /// True when kernels can run here (driver loaded, a device present); `why` explains a no.
  virtual bool usable(std::string* why) const = 0;
  virtual int device_count() const = 0;
  /// Full target id of a device ("sm_90a", "gfx950:sramecc+:xnack-", "cpu").
  virtual std::string target(int device) const = 0;
  /// The class the tuning database keeps a device's measurements under (tuning_device_class): by default its target.
  virtual std::string device_class(int device) const { return target(device); }
  /// The compiler, or null for the CPU backend.
  virtual const RtcCompiler* compiler() const = 0;
  /// Turns a compiled binary into a launchable kernel on `device` (may throw when the driver
  /// refuses the binary: the caller then drops the cache entry and recompiles once).
  virtual std::shared_ptr<LoadedKernel> load(const KernelSpec& spec, const std::vector<uint8_t>& binary,
                                             int device) = 0;
  /// Whether an error thrown by load() is the driver refusing the binary itself (another device, a newer
  /// toolkit, corrupt), which recompiling may cure; anything else (out of memory, a limit) fails plan().
  /// A backend that cannot tell says yes.
  virtual bool is_binary_refusal(const Error& /*e*/) const { return true; }
  /// Launches only: no allocation, no synchronization.
  virtual void launch(const LoadedKernel& k, const KernelSpec& spec, const SmlaParams& p, void* stream) = 0;
  /// Where `ptr` lives, for a plan of `device`: one question a pointer (run() asks it of every tensor; the CUDA
  /// backend asks the driver once).
  virtual PointerInfo pointer_info(const void* ptr, int device) const = 0;
  /// Resource limits for validation of configs.
  virtual size_t max_shared_memory(int device) const = 0;
  /// Fork and join for steps that may run beside the main order (Step::side). A backend that
  /// returns null from acquire_side_stream runs every step in order on the caller's stream.
  /// acquire_side_stream: a stream of `device` that is not part of an open graph capture, the
  /// caller's until release_side_stream, for a run on the caller's stream `main` (a side stream last joined to
  /// another stream may still hold that stream's work: taken for `main`, it would make `main` wait for it).
  /// stream_wait: work enqueued on `waiter` from now on waits for the work enqueued on `on` so far (no host
  /// synchronization).
  virtual void* acquire_side_stream(int /*device*/, void* /*main*/) { return nullptr; }
  virtual void release_side_stream(int /*device*/, void* /*stream*/, void* /*main*/) {}
  virtual void stream_wait(int /*device*/, void* /*waiter*/, void* /*on*/) {}
  /// Asked only after a launch or stream operation of run() failed: why `stream` cannot take work for `device` (it
  /// belongs to another device, or to a context other than the one the plan's kernels are loaded in), or empty when
  /// it can, or when the backend cannot tell. The driver alone reports such a stream as an invalid handle.
  virtual std::string foreign_stream(int /*device*/, void* /*stream*/) const { return {}; }
  /// Asked by run() before anything is queued: throws InvalidArgument for a stream it can tell is not the plan's
  /// without a failure (CUDA: the default stream while another context of the device is current). Default: nothing.
  virtual void check_stream(int /*device*/, void* /*stream*/) const {}
  /// Copies `bytes` from backend memory to the host after the stream's work (synchronizes).
  /// Not for hot paths: index reports and tests only.
  virtual void read_back(void* dst, const void* src, size_t bytes, void* stream) const = 0;
};

/// foreign_stream's answer for a stream of another device (`api`: "CUDA" or "HIP").
inline std::string another_devices_stream(const char* api, int stream_device, int plan_device) {
  return std::string("the stream belongs to ") + api + " device " + std::to_string(stream_device) +
         ", and the plan is for device " + std::to_string(plan_device) +
         " (Problem::device): plan for the stream's device, or pass a stream of the plan's";
}

}  // namespace smla
