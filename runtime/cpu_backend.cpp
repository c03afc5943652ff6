// cpu_backend.cpp: runs the phases of runtime/cpu/ through the planner's steps.
#include "cpu_backend.hpp"

#include <cstring>

#include "check.hpp"
#include "cpu/cpu_phases.hpp"
#include "cuda/cuda_api.hpp"

namespace smla {

namespace {
struct CpuKernel : LoadedKernel {
  cpu::PhaseFn fn = nullptr;
};
}  // namespace

std::vector<KernelSpec> cpu_phase_kernels(Phase phase, const ShapeInfo&) {
  KernelSpec k;
  k.stem = phase_name(phase);
  k.entry = std::string("smla_") + phase_name(phase);
  return {k};
}

std::shared_ptr<LoadedKernel> CpuBackend::load(const KernelSpec& spec, const std::vector<uint8_t>&, int) {
  auto k = std::make_shared<CpuKernel>();
  k->fn = cpu::cpu_phase_fn(spec.entry);
  SMLA_REQUIRE(k->fn, Status::Internal, "the CPU backend has no phase " + spec.entry);
  return k;
}

void CpuBackend::launch(const LoadedKernel& k, const KernelSpec&, const SmlaParams& p, void*) {
  static_cast<const CpuKernel&>(k).fn(p);
}

PointerKind CpuBackend::pointer_kind(const void* ptr) const {
  // Device memory handed to the CPU backend would crash it: ask the driver when there is one.
  if (cuda::driver().ok && ptr) {
    unsigned int type = 0;
    if (cuda::driver().PointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                           reinterpret_cast<CUdeviceptr>(ptr)) == CUDA_SUCCESS &&
        type == CU_MEMORYTYPE_DEVICE)
      return PointerKind::Device;
  }
  return PointerKind::Host;
}

void CpuBackend::read_back(void* dst, const void* src, size_t bytes, void*) const { std::memcpy(dst, src, bytes); }

}  // namespace smla
