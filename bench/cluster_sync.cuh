// cluster_sync.cuh: what the cluster microbenchmarks of bench/ (dsmem_async.cu, union_dkv.cu) need beyond
// kernel_src/sm90_sync.cuh: a peer block's shared-memory address, transaction-counted and remote mbarrier arrivals,
// and a wait with cluster-scope acquire (for bytes another block of the cluster wrote).
#pragma once

// The address of `addr` (this block's shared memory) in block `rank` of the cluster.
__device__ __forceinline__ unsigned mapa(unsigned addr, unsigned rank) {
  unsigned r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
// Arrive on this block's `bar` and expect `bytes` more to be completed on it (by bulk copies or st.async).
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
// Arrive on a barrier of another block of the cluster (an address from mapa).
__device__ __forceinline__ void mbar_arrive_remote(unsigned remote_bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(remote_bar) : "memory");
}
// Wait until the phase of parity `parity` of this block's `bar` has completed, acquiring at cluster scope.
__device__ __forceinline__ void mbar_wait_cluster(unsigned bar, unsigned parity) {
  unsigned done;
  do {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
