// cpu_backend.cpp: runs the phases of runtime/cpu/ through the planner's steps.
#include "cpu_backend.hpp"

#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "check.hpp"
#include "cpu/cpu_phases.hpp"
#include "cuda/cuda_api.hpp"

namespace smla {

namespace {
struct CpuKernel : LoadedKernel {
  cpu::PhaseFn fn = nullptr;
};

// Whether this process can read the byte at `p`, asked of the kernel (process_vm_readv on our own
// pid reports EFAULT where a load would fault). CUDA reserves its unified address range as
// PROT_NONE mappings, so device memory shows up here when no driver can be asked. A kernel or
// seccomp policy that refuses the call cannot tell: readable.
bool readable_here(const void* p) {
  char byte;
  iovec local{&byte, 1};
  iovec remote{const_cast<void*>(p), 1};
  const ssize_t n = process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
  return n == 1 || (n < 0 && errno != EFAULT);
}
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

void CpuBackend::launch(const LoadedKernel& k, const KernelSpec& spec, const SmlaParams& p, void*) {
  // The phases allocate host scratch rows for their threads (up to max(R_CHUNK + 3, 2 H + 1) x 512 floats a thread):
  // running out is reported as smla::Error, the one error type of run(), not as std::bad_alloc.
  try {
    static_cast<const CpuKernel&>(k).fn(p);
  } catch (const std::bad_alloc&) {
    SMLA_THROW(Status::Internal, "the CPU backend's " + spec.entry +
                                     " phase ran out of host memory for its scratch rows (std::bad_alloc)");
  }
}

PointerInfo CpuBackend::pointer_info(const void* ptr, int) const {
  // Device memory handed to the CPU backend would crash it: ask the driver when smla has opened it (opening it here
  // would initialise CUDA in a CPU-only process, whose forked children could then not use CUDA); device memory the
  // driver was not asked about is not readable from the host, which readable_here finds.
  // Managed memory, which the driver also types as device memory, is the host's to read as well: taken as host memory
  // (it was refused once smla had opened the driver, taken before; the same run passed or failed by what ran first).
  const cuda::Driver* d = cuda::driver_if_opened();
  if (d && d->ok && ptr) {
    const auto p = reinterpret_cast<CUdeviceptr>(ptr);
    unsigned int type = 0;
    int managed = 0;
    if (d->PointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p) == CUDA_SUCCESS &&
        type == CU_MEMORYTYPE_DEVICE &&
        !(d->PointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, p) == CUDA_SUCCESS && managed))
      return {PointerKind::Device};
  }
  if (ptr && !readable_here(ptr)) return {PointerKind::Unreadable};  // e.g. no usable driver (a symbol missing)
  return {PointerKind::Host};
}

void CpuBackend::read_back(void* dst, const void* src, size_t bytes, void*) const { std::memcpy(dst, src, bytes); }

}  // namespace smla
