// cpu_backend.hpp: the CPU backend: each phase as plain C++ (runtime/cpu/), run through the same
// planner, workspace and phase order as the GPU backends. Runs synchronously.
#pragma once
#include "backend.hpp"

namespace smla {

class CpuBackend : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  bool usable(std::string*) const override { return true; }
  int device_count() const override { return 1; }
  std::string target(int) const override { return "cpu"; }
  const RtcCompiler* compiler() const override { return nullptr; }
  std::shared_ptr<LoadedKernel> load(const KernelSpec& spec, const std::vector<uint8_t>& binary,
                                     int device) override;
  void launch(const LoadedKernel& k, const KernelSpec& spec, const SmlaParams& p, void* stream) override;
  PointerInfo pointer_info(const void* ptr, int device) const override;
  size_t max_shared_memory(int) const override { return 0; }
  void read_back(void* dst, const void* src, size_t bytes, void* stream) const override;
};

/// The CPU backend's "kernels": one per phase, entry smla_<phase>.
std::vector<KernelSpec> cpu_phase_kernels(Phase phase, const ShapeInfo& s);

}  // namespace smla
