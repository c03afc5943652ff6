// hip_backend.hpp: the HIP backend (AMD GPUs): hipModuleLoadData / hipModuleLaunchKernel.
#pragma once
#include <memory>
#include <string>

#include "../backend.hpp"
#include "smla/smla.hpp"
#include "hiprtc_compiler.hpp"

namespace smla::hip {

class RocprimSort;

/// Whether `e` is hipModuleLoadData refusing a code object (invalid image or kernel file, no code for this processor,
/// invalid source, the object's initialisation failing): what a recompile may mend. Reads SMLA_HIP_CHECK's message.
bool hip_is_binary_refusal(const Error& e);

/// This process was forked from the one that initialised the HIP runtime: the backend is unusable here (usable() says
/// so), and a plan made before the fork refuses to load, launch or read back (Status::NoBackend).
bool hip_forked_after_init();
void require_not_forked(const char* call);

class HipBackend : public Backend {
 public:
  HipBackend();
  std::string name() const override { return "hip"; }
  /// False, with one message, without ROCm or without an AMD GPU. Never throws.
  bool usable(std::string* why) const override;
  int device_count() const override;
  /// gcnArchName, e.g. "gfx950:sramecc+:xnack-".
  std::string target(int device) const override;
  const RtcCompiler* compiler() const override { return &compiler_; }
  std::shared_ptr<LoadedKernel> load(const KernelSpec& spec, const std::vector<uint8_t>& binary,
                                     int device) override;
  /// Passes SmlaParams by value as the kernel's one argument, with `pass` from the spec.
  void launch(const LoadedKernel& k, const KernelSpec& spec, const SmlaParams& p, void* stream) override;
  PointerInfo pointer_info(const void* ptr, int device) const override;
  size_t max_shared_memory(int device) const override;
  /// Synchronizes `stream`, then copies device -> host.
  void read_back(void* dst, const void* src, size_t bytes, void* stream) const override;
  /// With hipStreamGetDevice (ROCm newer than 5.2): a stream of another device is named; without it, nothing.
  std::string foreign_stream(int device, void* stream) const override;
  /// hipModuleLoadData refusing the image itself (hip_is_binary_refusal); out of memory, an LDS limit, a device that
  /// cannot be made current are not the cached binary's fault, and its shared entry is kept.
  bool is_binary_refusal(const Error& e) const override;
  /// The csr sort's temporary bytes for `n` pairs on bits [0, end_bit) as `device` would need them: rocPRIM picks its
  /// configuration by the current device's processor, so this asks with `device` current, as launch() sorts.
  size_t sort_temp_bytes(const RocprimSort& sort, int device, int n, int end_bit) const;

 private:
  struct Probe {
    bool usable = false;
    int devices = 0;
    std::string why;
  };
  static const Probe& probe();  // hipInit + device count, once per process
  HipRtcCompiler compiler_;
};

/// The pointer-kind decision, apart for tests: `memory_type` as reported by a runtime of
/// HIP_VERSION `runtime_version` (the hipMemoryType enum was renumbered in ROCm 6.0).
PointerKind pointer_kind_from(int memory_type, int runtime_version);

}  // namespace smla::hip
