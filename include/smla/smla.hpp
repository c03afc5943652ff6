// smla.hpp: C++ API of smla, the DeepSeek-V4 sparse-MLA attention backward runtime.
//
//   smla::Runtime rt;                              // one per process; thread-safe
//   auto plan = rt.plan(problem);                  // validate, choose, compile or load, lay out
//   size_t ws = plan->workspace_bytes();
//   plan->run(tensors, workspace, ws, stream);     // launches only; CUDA-graph capturable
//
// The op and its math: see docs/ and the project's contract (dq, dkv, d_sink of sparse MLA).
#pragma once
#if __cplusplus < 201703L
#error "smla.hpp needs C++17 (-std=c++17); from C or an older C++, use the C API (smla.h)"
#endif
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

// Exported from libsmla.so (built with hidden visibility, see smla.h); the rest of the library stays private to it.
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#define SMLA_HPP_VISIBILITY_PUSHED
#endif

// The C++ API passes std::string and std::vector across the library's boundary, so a caller must use the standard
// library ABI libsmla.so was built with. Those types' layout does not appear in the exported names (Runtime's
// constructor takes a RuntimeOptions), so a mismatch would link and then corrupt memory. Instead each translation unit
// that includes this header refers to a symbol naming its own ABI, and libsmla.so defines only its own: a mismatch is
// an undefined reference to smla_abi_<this caller's ABI> at link time. (The C API, smla.h, has no such constraint.)
#if defined(_LIBCPP_VERSION)
#define SMLA_ABI_SYMBOL smla_abi_libcxx
#elif defined(_GLIBCXX_USE_CXX11_ABI) && !_GLIBCXX_USE_CXX11_ABI
#define SMLA_ABI_SYMBOL smla_abi_libstdcxx_old_string
#else
#define SMLA_ABI_SYMBOL smla_abi_libstdcxx_cxx11_string
#endif
extern "C" const int SMLA_ABI_SYMBOL;
namespace smla::detail {
[[maybe_unused]] __attribute__((used)) static const int* const abi_check = &SMLA_ABI_SYMBOL;
}  // namespace smla::detail

namespace smla {

/// Status codes shared with the C API (smla.h).
enum class Status : int {
  Ok = 0,
  InvalidArgument = 1,   ///< a shape, dtype, pointer, stride or option is wrong
  Unsupported = 2,       ///< valid but not supported (e.g. an H with no kernel)
  NoBackend = 3,         ///< no usable backend for the request
  CompileError = 4,      ///< the run-time compiler failed (log attached)
  DriverError = 5,       ///< a driver/runtime call failed
  WorkspaceTooSmall = 6, ///< the workspace passed to run() is smaller than workspace_bytes()
  Internal = 7,
};

const char* status_name(Status s);

/// The one error type: a status, where it was raised, the failing call if any, and a message a
/// user can act on.
/// Copying one never throws (as the standard exceptions): the message and the call are shared, not copied, so a
/// catch by value or std::exception_ptr cannot end in std::terminate for want of memory.
class Error : public std::runtime_error {
 public:
  Error(Status status, std::string message, const char* file = "", int line = 0, std::string call = "");
  Status status() const noexcept { return status_; }
  const std::string& message() const noexcept { return parts_->message; }
  const char* file() const noexcept { return file_; }
  int line() const noexcept { return line_; }
  const std::string& call() const noexcept { return parts_->call; }

 private:
  struct Parts {
    std::string message, call;
  };
  Status status_;
  std::shared_ptr<const Parts> parts_;
  const char* file_;
  int line_;
};

enum class BackendKind : int { Auto = 0, Cpu = 1, Cuda = 2, Hip = 3 };
const char* backend_name(BackendKind b);

/// How the caller's `lse` was computed. aiter's forward: natural log, sink included (the
/// default). FlashMLA's sparse forward: natural log, sink excluded (`includes_sink = false`), +inf for a token
/// with no valid slot (taken as it is); its first sparse prefill forward (before attn_sink) documented base 2
/// (`base2 = true` too): check the release. TileLang's example forward: base 2, sink excluded.
struct LseConvention {
  bool base2 = false;
  bool includes_sink = true;
};

/// The problem: shapes and options. Tensors come later, at run().
struct Problem {
  int64_t T = 0;        ///< query tokens of the whole packed batch (>= 1; T * topk below 2^31)
  int64_t H = 0;        ///< heads: 16, 32, 64 or 128
  int64_t num_kv = 0;   ///< rows of kv (>= 1, below 2^31 - 1)
  int64_t topk = 0;     ///< slots per token (a multiple of 16, at most 8192)
  int64_t head_dim = 512;  ///< must be 512
  bool has_sink = false;   ///< attn_sink given (then d_sink is produced)
  std::optional<float> scale;        ///< default 1/sqrt(512)
  int64_t r_chunk = 0;     ///< top-k slots a chunk: 0 = the planner's choice (all of them, or the tuning database's
                           ///< r_chunk for this problem where it has one: smla-tune); else a multiple of 16
                           ///< that divides topk. Each further top-k chunk carries dQ in fp32 (~1 ms at 4096 x 128)
  int64_t t_chunk = 0;     ///< tokens a chunk: 0 = the planner's choice (as few equal token chunks as keep the
                           ///< t_chunk x r_chunk x 512 bf16 intermediate within SMLA_INTERM_BUDGET_BYTES, 4 GiB);
                           ///< else 1..T. Token chunks carry only dkv (num_kv x 512 fp32) from one to the next
  LseConvention lse;
  /// Check every index and record the first out-of-range one (see Plan::index_report).
  /// Out-of-range indices are always treated as empty slots; this only reports them.
  bool check_indices = false;
  /// Write dkv in fp32 (Tensors::dkv then points at num_kv x 512 floats) instead of bf16: a sequence-parallel
  /// rank's part, summed over the ranks before any rounding.
  bool dkv_fp32 = false;
  BackendKind backend = BackendKind::Auto;
  int device = 0;
};

/// Element types, for callers that hold typed tensors (frameworks): run() checks each given one
/// against what the op needs and names the argument when it differs. Unspecified: not checked.
enum class DType : int { Unspecified = 0, BF16 = 1, F16 = 2, F32 = 3, I32 = 4, I64 = 5, F64 = 6 };
const char* dtype_name(DType d);

struct TensorDTypes {
  DType q = DType::Unspecified, kv = DType::Unspecified, o = DType::Unspecified, dout = DType::Unspecified;
  DType lse = DType::Unspecified, topk = DType::Unspecified, attn_sink = DType::Unspecified;
  DType dq = DType::Unspecified, dkv = DType::Unspecified, d_sink = DType::Unspecified;
};

/// Device (or, for the CPU backend, host) pointers plus strides in elements. The last dimension
/// (D = 512) must be contiguous. A stride of 0 means "packed" (the contiguous default).
struct Tensors {
  const void* q = nullptr;     ///< bf16 [T, H, 512]
  const void* kv = nullptr;    ///< bf16 [num_kv, 512]
  const void* o = nullptr;     ///< bf16 [T, H, 512]
  const void* dout = nullptr;  ///< bf16 [T, H, 512]
  const float* lse = nullptr;  ///< fp32 [T, H]
  const int32_t* topk = nullptr;  ///< int32 [T, TOPK]; -1 = empty slot
  const float* attn_sink = nullptr;  ///< fp32 [H], only with Problem::has_sink
  void* dq = nullptr;          ///< bf16 [T, H, 512] output
  void* dkv = nullptr;         ///< bf16 [num_kv, 512] output (fp32 when Problem::dkv_fp32)
  float* d_sink = nullptr;     ///< fp32 [H] output, only with Problem::has_sink
  int64_t q_stride_t = 0, q_stride_h = 0;
  int64_t o_stride_t = 0, o_stride_h = 0;
  int64_t do_stride_t = 0, do_stride_h = 0;
  int64_t dq_stride_t = 0, dq_stride_h = 0;
  int64_t kv_stride = 0, dkv_stride = 0;
  int64_t lse_stride_t = 0, lse_stride_h = 0;
  int64_t topk_stride = 0;
  TensorDTypes dtypes;  ///< optional: the caller's element types, checked by run()
};

/// The first out-of-range index found by an opt-in check.
struct BadIndex {
  int64_t count = 0;  ///< how many slots were out of range
  int64_t t = -1, r = -1;
  int32_t value = 0;
};

/// Per-phase description for logs and `smla-bench --breakdown`.
struct PlanInfo {
  std::string backend;
  std::string target;
  std::string device_class;  ///< what the tuning database keys this device by: target/name/SMs ("sm_90a/NVIDIA H200/132sm")
  int64_t r_chunk = 0, n_chunks = 0;  ///< top-k slots a chunk, top-k chunks (within each token chunk)
  int64_t t_chunk = 0, t_chunks = 0;  ///< tokens a chunk, token chunks
  std::vector<std::string> kernels;  ///< entry names, in launch order
  std::string config_source;         ///< "heuristic", "tuned" (the tuning database) or "explicit" (a TileConfig given)
  int compiled = 0;                  ///< kernels compiled by this plan() call
  int loaded_from_disk = 0;
  int reused_in_process = 0;
};

class Plan {
 public:
  virtual ~Plan() = default;
  virtual const Problem& problem() const = 0;
  /// Bytes of device workspace run() needs (256-byte aligned start required).
  virtual size_t workspace_bytes() const = 0;
  /// Launches the backward on `stream` (a cudaStream_t / hipStream_t, or null for the default
  /// stream; ignored by the CPU backend, which runs synchronously). On CUDA the default stream is refused while a
  /// context of the device other than its primary one is current (that context's stream is not smla's). Validates the tensors
  /// (throws smla::Error naming the argument, before anything is launched). No device allocation,
  /// no compilation, no host synchronization. The CPU backend allocates only its threads' scratch rows
  /// (up to max(R_CHUNK + 3, 2 H + 1) x 512 floats a thread, at most 16 threads a phase, started and joined
  /// within each phase); running out of host memory for them, or for a thread, is an smla::Error (Internal)
  /// or a block run on the calling thread, never an abort.
  virtual void run(const Tensors& t, void* workspace, size_t workspace_size, void* stream) const = 0;
  /// Reads the index report left in `workspace` by the last run with check_indices
  /// (synchronizes the stream: not for use inside a graph capture). The report is the workspace's first 16 bytes, so
  /// only those are read, whatever buffer is passed: on a workspace no run of this plan has written, what it returns
  /// means nothing.
  virtual std::optional<BadIndex> index_report(const void* workspace, void* stream) const = 0;
  virtual const PlanInfo& info() const = 0;
  /// The ordered launch list, for per-phase timing: launch_count() launches (info().kernels names them);
  /// run_launch(i) validates the tensors as run() does and runs launch i alone on `stream` (no side stream);
  /// launch_phase(i) is its phase ("dq", ...). An i past the list throws InvalidArgument.
  /// Launch i reads what launches 0..i-1 left in the workspace (csr's row offsets, interm rows, ...): run them first,
  /// in order, with the same tensors and workspace. Nothing checks that; launch i on a workspace they did not fill
  /// reads garbage offsets (a fault, or memory outside the tensors).
  virtual size_t launch_count() const = 0;
  virtual void run_launch(size_t i, const Tensors& t, void* workspace, size_t workspace_size,
                          void* stream) const = 0;
  virtual std::string launch_phase(size_t i) const = 0;
};

/// Tile choices of the matrix phases, for autotuning (0 = the planner's default for that field).
struct TileConfig {
  int dq_block_h = 0, dq_block_r = 0;
  int dkv_block_r = 0, dkv_block_d = 0;
  int64_t r_chunk = 0;  ///< overrides Problem::r_chunk when nonzero
  /// dq body on CUDA: 0 = the planner's choice, 1 = mma.sync (any sm_80+), 2 = warpgroup MMA (sm_90a, H % 64 == 0),
  /// 3 = warpgroup MMA with a producer warpgroup issuing the kv copies (same constraints as 2; the planner's choice
  /// on sm_90a where the top-k has several chunks or more than 256 slots, and at H 64 with the fused dkv_impl 4),
  /// 4 = 3 made persistent (one block an SM takes the (token, 64 heads) blocks in turn, the next block's Q and dO
  /// copied while this one finishes, its empty tiles skipped as 3 does; same constraints; the planner's choice on
  /// sm_90a at H 128 where the top-k is one chunk of 256 slots or fewer: measured 7% faster end to end than 3 at
  /// TOPK 160 and 6% at 256 on the H200, even or slower from 320 up, outputs bitwise 3's (perf notes v28)).
  int dq_impl = 0;
  /// dkv_interm body on CUDA: 0 = the planner's choice, 1 = mma.sync (any sm_80+), 2 = warpgroup MMA
  /// (sm_90a, H % 32 == 0, its one tile dkv 64 x 256), 3 = warpgroup MMA with a producer warpgroup issuing the copies
  /// and one 64 x 256 tile per consumer warpgroup (same constraints as 2), 4 = fused into dq: the dq body
  /// writes each slot's interm row from the P and dS it holds in shared memory, and no dkv_interm kernel runs
  /// (sm_90a, H == 64, where one dq block holds every head of its token, with dq_impl 3; P and dS never reach memory,
  /// and the workspace is smaller by them). The planner's choice at H 64 on sm_90a unless the caller names another dq
  /// or dkv body or a dkv tile: faster end to end by 8.5% on the H200 and 15% on an H100 at 4096,64,5120,640, 13-14% on
  /// both at 4096,64,5120,160 (perf notes v29, v30); outputs bitwise dkv_impl 3's.
  int dkv_impl = 0;
  /// The largest dq_impl and dkv_impl (the bodies above): what the planner, the tuning database and the tools accept.
  static constexpr int kMaxDqImpl = 4, kMaxDkvImpl = 4;
  bool operator==(const TileConfig& o) const {
    return dq_block_h == o.dq_block_h && dq_block_r == o.dq_block_r && dkv_block_r == o.dkv_block_r &&
           dkv_block_d == o.dkv_block_d && r_chunk == o.r_chunk && dq_impl == o.dq_impl && dkv_impl == o.dkv_impl;
  }
};

struct RuntimeOptions {
  /// Directory of kernel sources to use instead of the embedded ones (development).
  std::string kernel_src_dir;
};

struct BackendStatus {
  std::string name;
  bool usable = false;
  bool can_compile = false;
  std::string detail;  ///< why not, or the devices found
};

class Runtime {
 public:
  explicit Runtime(RuntimeOptions opts = {});
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  /// Validates the problem, chooses a config and the chunking, compiles or loads the kernels,
  /// lays out the workspace and fixes the phase order. Throws smla::Error. A plan keeps what it
  /// runs on (backend, loaded kernels) alive: it stays usable after this Runtime is destroyed.
  /// Thread-safe; two calls that need one kernel at once compile and load it once. On CUDA a call that loads a kernel
  /// not yet loaded by this Runtime waits, in the driver's module load, for the work already queued in the device's
  /// context, on every stream (measured: a stream held by a host function held cuModuleLoadData, perf notes v37):
  /// make the plans before queuing work that waits on the host, e.g. at start-up; a plan() that loads nothing waits
  /// for nothing.
  std::shared_ptr<const Plan> plan(const Problem& p);
  /// The same with explicit tile choices (what smla-tune tries); validated like the heuristic ones.
  std::shared_ptr<const Plan> plan(const Problem& p, const TileConfig& cfg);
  /// Which backends this process can use, and why not.
  std::vector<BackendStatus> backends() const;
  /// The backend `Auto` resolves to here.
  BackendKind resolve(BackendKind b) const;
  /// Counters for tests: kernels compiled, loaded from disk, reused in process.
  struct Counters {
    int64_t compiled = 0, disk_hits = 0, memory_hits = 0;
  };
  Counters counters() const;

  struct Impl;

 private:
  std::shared_ptr<const Plan> plan_with(const Problem& p, const TileConfig* cfg);
  std::shared_ptr<Impl> impl_;  // shared with the plans: a plan keeps its backend and kernels alive
};

}  // namespace smla

#ifdef SMLA_HPP_VISIBILITY_PUSHED
#pragma GCC visibility pop
#undef SMLA_HPP_VISIBILITY_PUSHED
#endif
