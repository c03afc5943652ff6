// phases.hpp: the phases of the backward and how a backend family describes its kernels.
//
// The planner (runtime/planner.cpp) owns the phase order and the chunk loop; a backend family
// (CUDA, HIP) owns, per phase, which kernel(s) to launch and their geometry. The CPU backend runs
// the same steps with plain C++ functions of the same names (runtime/cpu/).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace smla {

enum class Phase { CheckTopk, Delta, Dq, DkvInterm, Csr, Gather, DSink };

const char* phase_name(Phase p);

/// What every phase spec function may read: the problem after validation and the planner's
/// choices. Plain data, compared and hashed by value.
struct ShapeInfo {
  int T = 0, H = 0, num_kv = 0, topk = 0;
  int r_chunk = 0, n_chunks = 1;
  int t_chunk = 0, t_chunks = 1;  // tokens a chunk (the last may be shorter; 0: T), token chunks
  bool has_sink = false;
  bool check_indices = false;
  // csr sort geometry (chosen by the planner)
  int radix_bits = 8;
  int radix_passes = 1;
  /// The csr sort's scratch, the csr_hist region: CUDA's onesweep bins, tile counters and look-back
  /// (cuda_csr_scratch_bytes), rocPRIM's temporary storage on AMD; 0 on the CPU. Set by plan().
  size_t csr_sort_temp_bytes = 0;
  // tile choices for the matrix phases (0 = the backend's default)
  int dq_block_h = 0, dq_block_r = 0;
  int dkv_block_r = 0, dkv_block_d = 0;
  /// dq body: 0 = the backend's default, 1 = mma.sync (sm_80+), 2 = warpgroup MMA (sm_90a only), 3 = 2 with a
  /// producer warpgroup (the CUDA default on sm_90a).
  int dq_impl = 0;
  /// dkv_interm body: 0 = the backend's default, 1 = mma.sync (sm_80+), 2 = warpgroup MMA (sm_90a only), 3 = 2 with
  /// a producer warpgroup and a 64 x 256 tile per consumer warpgroup, 4 = fused into dq (sm_90a, H 64: no dkv_interm
  /// kernel, no P or dS in the workspace).
  int dkv_impl = 0;
  /// The CUDA target has sm_90a's instructions (wgmma); set from the target by whoever plans for it.
  bool sm90a = false;
  /// The CUDA target's shared memory a block may opt in to (cuda_smem_limit); 0: Hopper's 227 KB. The default tiles
  /// are chosen to fit it.
  unsigned smem_limit = 0;
  /// Slots of one chunk (token chunk x top-k chunk): the rows of ds, pm, interm and the csr sort.
  long long chunk_items() const { return static_cast<long long>(t_chunk > 0 ? t_chunk : T) * r_chunk; }
  /// dq writes interm and no dkv_interm runs (dkv_impl 4, an sm_90a plan; the CUDA planner checks the rest).
  bool fused_dkv() const { return dkv_impl == 4 && sm90a; }
  /// Chunks in all, the length of gather's dkv accumulation.
  int all_chunks() const { return n_chunks * t_chunks; }
};

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

/// One kernel launch: which source (kernel_src/<stem>.cu), which entry, the constants injected
/// ahead of the source as `#define NAME VALUE`, and the launch geometry.
struct KernelSpec {
  std::string stem;
  std::string entry;
  std::vector<std::pair<std::string, long long>> defines;
  Dim3 grid, block;
  unsigned smem_bytes = 0;  // dynamic shared memory
  int pass = 0;             // copied into SmlaParams::pass (radix-sort passes of csr)
  /// Registers a thread the compiled kernel must have been given (0: any). Set for the bodies that move registers
  /// between warpgroups with setmaxnreg: their split is sized for this allocation, and under a smaller one the
  /// consumers' increase never completes (the block hangs), so the backend refuses such a binary at load.
  int launch_regs = 0;
  /// A persistent kernel: grid.x counts its blocks of work, which each launched block takes in turn (blockIdx.x,
  /// + gridDim.x, ...); the backend launches min(grid.x, the device's SMs) blocks, one resident an SM.
  bool persistent = false;
  /// A library kernel's scratch (rocPRIM's sort on AMD): the bytes the plan reserved for it in the workspace
  /// (ShapeInfo::csr_sort_temp_bytes), which the launch hands the library as they are, asking it nothing at run().
  size_t scratch_bytes = 0;
};

// ---- helpers for the backend families' spec tables (runtime/cuda, runtime/hip)

inline unsigned ceil_div(long long a, long long b) { return static_cast<unsigned>((a + b - 1) / b); }

/// A launch spec from its parts (a one-dimensional block of `threads`).
inline KernelSpec make_spec(const char* stem, const char* entry, std::vector<std::pair<std::string, long long>> defines,
                            Dim3 grid, unsigned threads, unsigned smem = 0, int pass = 0) {
  KernelSpec k;
  k.stem = stem;
  k.entry = entry;
  k.defines = std::move(defines);
  k.grid = grid;
  k.block.x = threads;
  k.smem_bytes = smem;
  k.pass = pass;
  return k;
}

/// A grid of (x, y), x at least 1 (an empty launch is still a valid launch).
inline Dim3 grid_xy(unsigned x, unsigned y = 1) {
  Dim3 g;
  g.x = x > 1 ? x : 1;
  g.y = y;
  return g;
}

}  // namespace smla
