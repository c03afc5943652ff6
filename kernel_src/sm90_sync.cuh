// sm90_sync.cuh: mbarriers, named barriers and register reallocation (sm_90a), for the kernels that split a block
// into producer and consumer warpgroups (dq_wgmma.cuh's DQW_PRODUCER, dkv_wgmma.cuh's DKW_PRODUCER).
#pragma once

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "sm90_sync.cuh needs sm_90a"
#endif

// An mbarrier at shared address `bar` that completes a phase after `count` arrivals.
__device__ __forceinline__ void smla_mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
// Arrive (release semantics at CTA scope: this thread's earlier shared-memory writes are visible to whoever
// waits for the phase this arrival completes).
__device__ __forceinline__ void smla_mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// Wait (acquire) until the phase of parity `parity` has completed.
__device__ __forceinline__ void smla_mbar_wait(unsigned bar, unsigned parity) {
  unsigned done;
  do {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
// A producer thread's hand-over of its copies: wait until at most N of its cp.async groups are pending, make its
// copies and shared-memory stores visible to the async proxy (wgmma reads through it), then arrive on `bar`.
// Needs common.cuh (cp.async) and wgmma.cuh (the proxy fence) included first.
template <int N>
__device__ __forceinline__ void smla_cp_async_announce(unsigned bar) {
  smla_cp_async_wait<N>();
  smla_fence_proxy_async();
  smla_mbar_arrive(bar);
}
// Named barrier ID (1..15; 0 is __syncthreads') among THREADS threads.
template <int ID, int THREADS>
__device__ __forceinline__ void smla_named_sync() {
  static_assert(ID > 0 && ID < 16 && THREADS % 32 == 0, "smla_named_sync: barrier 1..15, whole warps");
  asm volatile("bar.sync %0, %1;" ::"n"(ID), "n"(THREADS) : "memory");
}
// Register reallocation between warpgroups (every warp of the warpgroup executes it). It moves registers inside the
// block's pool, which is what the block was given at launch (ptxas gives a kernel with setmaxnreg the most that
// __launch_bounds__(threads, 1) allows: 65536 / threads, down to a multiple of 8; the host checks the count at load,
// KernelSpec::launch_regs). The increase is retried until the decreases have released enough: a split that the pool
// cannot cover hangs the block instead of failing (a dq candidate at 232 / 48 with 384 threads did on the H200).
// smla_launch_regs (common.cuh) is that allocation.
// Whether `consumer_wgs` warpgroups at `consumer_regs` and one producer warpgroup at `producer_regs` fit the pool.
constexpr bool smla_setmaxnreg_fits(int consumer_wgs, int consumer_regs, int producer_regs) {
  return consumer_wgs * consumer_regs + producer_regs <= (consumer_wgs + 1) * smla_launch_regs(128 * (consumer_wgs + 1));
}
template <int N>
__device__ __forceinline__ void smla_setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void smla_setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N));
}
