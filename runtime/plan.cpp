// plan.cpp: Plan::run: validate the tensors, point the params at them and the workspace, launch.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

#include "check.hpp"
#include "env.hpp"
#include "plan_impl.hpp"

namespace smla {

namespace {

// `what` names the argument ("Tensors::q", "run(): workspace"); file and line are the caller's check.
[[noreturn]] void arg_error(const std::string& what, const std::string& expected, Status st = Status::InvalidArgument,
                            const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  throw Error(st, what + ": expected " + expected, file, line);
}

[[noreturn]] void tensor_error(const std::string& name, const std::string& expected,
                               const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  arg_error("Tensors::" + name, expected, Status::InvalidArgument, file, line);
}

// `name`: the argument as the caller knows it ("Tensors::q", "run(): workspace"); `device`: the plan's. run() calls
// this for every tensor: nothing is built (no string, no allocation) unless the check fails.
void check_ptr(const Backend& be, int device, const void* ptr, const char* name, size_t align, bool required = true,
               const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  if (!ptr) {
    if (required) arg_error(name, "a non-null pointer", Status::InvalidArgument, file, line);
    return;
  }
  if (reinterpret_cast<uintptr_t>(ptr) % align)
    arg_error(name,
              std::to_string(align) + "-byte alignment (got " +
                  std::to_string(reinterpret_cast<uintptr_t>(ptr) % align) + " bytes off)",
              Status::InvalidArgument, file, line);
  const PointerInfo where = be.pointer_info(ptr, device);
  const PointerKind k = where.kind;
  const bool cpu = be.name() == "cpu";
  if (cpu && k == PointerKind::Device)
    arg_error(name, "host memory for the cpu backend (got a device pointer)", Status::InvalidArgument, file, line);
  if (cpu && k == PointerKind::Unreadable)  // the phases would fault reading it
    arg_error(name, "host memory readable by this process for the cpu backend (device memory?)",
              Status::InvalidArgument, file, line);
  if (!cpu && k == PointerKind::Host)
    arg_error(name, "device memory for the " + be.name() +
                        " backend (got memory the runtime does not know as device memory: a host pointer, or an "
                        "allocation already freed)", Status::InvalidArgument,
              file, line);
  if (!cpu && k == PointerKind::Device && where.other_device >= 0)
    arg_error(name,
              "memory on device " + std::to_string(device) + " (got device " + std::to_string(where.other_device) +
                  ")",
              Status::InvalidArgument, file, line);
}

int64_t stride_or(int64_t given, int64_t packed, const char* name, int64_t multiple, int64_t at_least,
                  const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  const int64_t s = given ? given : packed;
  if (s < at_least || s % multiple)
    tensor_error(name, "0 (packed) or a stride >= " + std::to_string(at_least) + " that is a multiple of " +
                           std::to_string(multiple) + " elements (got " + std::to_string(given) + ")",
                 file, line);
  return s;
}

void check_dtype(DType given, DType expected, const char* name, const char* file = __builtin_FILE(),
                 int line = __builtin_LINE()) {
  if (given != DType::Unspecified && given != expected)
    tensor_error(std::string(name) + " dtype", std::string(dtype_name(expected)) + " (got " + dtype_name(given) + ")",
                 file, line);
}

// The bytes [lo, hi) of a tensor of n_t x n_h rows of `row` elements at strides st, sh (elements).
struct Span {
  const char* name;
  uintptr_t lo = 0, hi = 0;
};

// Strides may say anything: a span of more than 2^57 bytes (no process's addresses span that much: x86-64's
// five-level paging gives 2^56, AArch64 2^52; a stride of 2^60 elements overflowed int64 here, undefined behaviour,
// and the overlap checks then ran on a wrapped interval; one of 2^59 was blamed as an overlap with the workspace) is
// refused by name, as a stride. The bound is on the span, not on where it ends: a pointer may carry a tag in its top
// byte (AArch64 MTE and HWASan, x86 LAM).
constexpr __int128 kMaxSpanBytes = __int128(1) << 57;

Span span_of(const char* name, const void* ptr, int64_t n_t, int64_t st, int64_t n_h, int64_t sh, int64_t row,
             size_t elem) {
  Span s{name, reinterpret_cast<uintptr_t>(ptr), reinterpret_cast<uintptr_t>(ptr)};
  if (!ptr) return s;
  const __int128 bytes = (__int128(n_t - 1) * st + __int128(n_h - 1) * sh + row) * __int128(elem);
  if (bytes > kMaxSpanBytes || __int128(s.lo) + bytes > __int128(UINTPTR_MAX))
    arg_error(name, "strides whose rows fit in memory (they span more than 2^57 bytes)", Status::InvalidArgument);
  s.hi = s.lo + static_cast<uintptr_t>(bytes);
  return s;
}

std::string hex(uintptr_t v) {
  char b[32];
  std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
  return b;
}

// An output's rows must not overlap one another (different threads write them at once): with the dimensions of
// more than one row sorted by stride, each stride at least the extent of the ones inside it. Sufficient for
// disjoint rows; it refuses only interleavings no framework makes.
void check_rows_disjoint(const char* name, int64_t n_t, int64_t st, const char* st_name, int64_t n_h, int64_t sh,
                         const char* sh_name, int64_t row) {
  struct Dim {
    int64_t n, s;
    const char* name;
  };
  Dim dims[2];  // the dimensions of more than one row, in stride order
  int nd = 0;
  if (n_t > 1) dims[nd++] = {n_t, st, st_name};
  if (n_h > 1) dims[nd++] = {n_h, sh, sh_name};
  if (nd == 2 && dims[1].s < dims[0].s) std::swap(dims[0], dims[1]);
  if (nd == 2 && dims[0].s == dims[1].s)  // neither is inside the other: both named (the order would blame one)
    tensor_error(st_name, std::string("a stride other than ") + sh_name + "'s (both are " + std::to_string(st) +
                              "): the " + name + " rows of different tokens and heads overlap, and they are written "
                              "at the same time");
  __int128 extent = row;  // (128 bits: a huge stride times the count overflowed int64; span_of refuses such strides)
  for (int i = 0; i < nd; ++i) {
    const Dim& d = dims[i];
    if (d.s < extent)
      tensor_error(d.name, "a stride >= " + std::to_string(int64_t(extent)) + " elements: at " + std::to_string(d.s) +
                               " the " + name + " rows of different " + (d.name == st_name ? "tokens" : "heads") +
                               " overlap, and they are written at the same time");
    extent += __int128(d.n - 1) * d.s;
  }
}

// No output (the workspace is one) may share a byte with an input or another output: the phases read their inputs after
// other phases wrote outputs, and the outputs are written by many threads at once. Judged by address ranges (first
// to last byte): two views interleaved in one buffer (q and dq as the halves of each row) are refused as well, though
// they share no byte.
template <size_t NO, size_t NI>
void check_no_overlap(const std::array<Span, NO>& outputs, const std::array<Span, NI>& others) {
  auto clash = [](const Span& a, const Span& b) { return a.lo < b.hi && b.lo < a.hi; };
  for (size_t i = 0; i < NO; ++i) {
    const Span& a = outputs[i];
    if (a.lo == a.hi) continue;
    auto check = [&](const Span& b) {
      if (b.lo != b.hi && clash(a, b))
        arg_error(a.name, std::string("memory that does not overlap ") + b.name + " (" + a.name + " spans [" +
                              hex(a.lo) + ", " + hex(a.hi) + "), " + b.name + " [" + hex(b.lo) + ", " + hex(b.hi) +
                              "))");
    };
    for (size_t j = i + 1; j < NO; ++j) check(outputs[j]);
    for (const Span& b : others) check(b);
  }
}

}  // namespace

const char* dtype_name(DType d) {
  switch (d) {
    case DType::Unspecified: return "unspecified";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    case DType::F32: return "f32";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::F64: return "f64";
  }
  return "unknown";
}

void PlanImpl::require_usable_backend() const {
  // A plan made before a fork(), used in the child: say why CUDA cannot run there before any driver call fails.
  std::string gone;
  if (!backend_->usable(&gone))
    SMLA_THROW(Status::NoBackend,
               "the " + backend_->name() + " backend this plan was made for is not usable now: " + gone);
}

SmlaParams PlanImpl::base_params(const Tensors& t, void* workspace, size_t workspace_size) const {
  const Backend& be = *backend_;
  const Problem& p = problem_;
  require_usable_backend();
  const int64_t H = p.H, D = 512;
  const TensorDTypes& dt = t.dtypes;
  check_dtype(dt.q, DType::BF16, "q");
  check_dtype(dt.kv, DType::BF16, "kv");
  check_dtype(dt.o, DType::BF16, "o");
  check_dtype(dt.dout, DType::BF16, "dout");
  check_dtype(dt.lse, DType::F32, "lse");
  check_dtype(dt.topk, DType::I32, "topk");
  check_dtype(dt.attn_sink, DType::F32, "attn_sink");
  check_dtype(dt.dq, DType::BF16, "dq");
  check_dtype(dt.dkv, p.dkv_fp32 ? DType::F32 : DType::BF16, "dkv");
  check_dtype(dt.d_sink, DType::F32, "d_sink");
  // bf16 rows are read 16 bytes at a time: 16-byte aligned bases, strides a multiple of 8.
  const int dev = p.device;
  check_ptr(be, dev, t.q, "Tensors::q", 16);
  check_ptr(be, dev, t.kv, "Tensors::kv", 16);
  check_ptr(be, dev, t.o, "Tensors::o", 16);
  check_ptr(be, dev, t.dout, "Tensors::dout", 16);
  check_ptr(be, dev, t.lse, "Tensors::lse", 4);
  check_ptr(be, dev, t.topk, "Tensors::topk", 4);
  check_ptr(be, dev, t.dq, "Tensors::dq", 16);
  check_ptr(be, dev, t.dkv, "Tensors::dkv", 16);
  if (p.has_sink) {
    check_ptr(be, dev, t.attn_sink, "Tensors::attn_sink", 4);
    check_ptr(be, dev, t.d_sink, "Tensors::d_sink", 4);
  } else if (t.attn_sink || t.d_sink) {
    tensor_error(t.attn_sink ? "attn_sink" : "d_sink", "null, since Problem::has_sink is false");
  }
  if (layout_.total) {
    if (!workspace)
      arg_error("run(): workspace", "a non-null pointer to " + std::to_string(layout_.total) + " bytes");
    if (workspace_size < layout_.total)
      throw Error(Status::WorkspaceTooSmall,
                  "workspace of " + std::to_string(workspace_size) + " bytes is smaller than workspace_bytes() = " +
                      std::to_string(layout_.total),
                  __FILE__, __LINE__);
    check_ptr(be, dev, workspace, "run(): workspace", WorkspaceLayout::kAlign);
  }

  SmlaParams s{};
  s.q = static_cast<const smla_bf16*>(t.q);
  s.kv = static_cast<const smla_bf16*>(t.kv);
  s.o = static_cast<const smla_bf16*>(t.o);
  s.dout = static_cast<const smla_bf16*>(t.dout);
  s.lse = t.lse;
  s.topk = t.topk;
  s.sink = p.has_sink ? t.attn_sink : nullptr;
  s.dq = static_cast<smla_bf16*>(t.dq);
  s.dkv = p.dkv_fp32 ? nullptr : static_cast<smla_bf16*>(t.dkv);
  s.dkv_f32 = p.dkv_fp32 ? static_cast<float*>(t.dkv) : nullptr;
  s.d_sink = p.has_sink ? t.d_sink : nullptr;
  s.q_sh = stride_or(t.q_stride_h, D, "q_stride_h", 8, D);
  s.q_st = stride_or(t.q_stride_t, H * D, "q_stride_t", 8, 0);
  s.o_sh = stride_or(t.o_stride_h, D, "o_stride_h", 8, D);
  s.o_st = stride_or(t.o_stride_t, H * D, "o_stride_t", 8, 0);
  s.do_sh = stride_or(t.do_stride_h, D, "do_stride_h", 8, D);
  s.do_st = stride_or(t.do_stride_t, H * D, "do_stride_t", 8, 0);
  s.dq_sh = stride_or(t.dq_stride_h, D, "dq_stride_h", 8, D);
  s.dq_st = stride_or(t.dq_stride_t, H * D, "dq_stride_t", 8, 0);
  s.kv_s = stride_or(t.kv_stride, D, "kv_stride", 8, D);
  s.dkv_s = stride_or(t.dkv_stride, D, "dkv_stride", p.dkv_fp32 ? 4 : 8, D);
  s.lse_sh = stride_or(t.lse_stride_h, 1, "lse_stride_h", 1, 1);
  s.lse_st = stride_or(t.lse_stride_t, H, "lse_stride_t", 1, 0);
  s.topk_st = stride_or(t.topk_stride, p.topk, "topk_stride", 1, p.topk);
  {
    const int64_t T = p.T, K = p.num_kv;
    const size_t dkv_elem = p.dkv_fp32 ? 4 : 2;
    const std::array<Span, 4> outputs{span_of("Tensors::dq", t.dq, T, s.dq_st, H, s.dq_sh, D, 2),
                                    span_of("Tensors::dkv", t.dkv, K, s.dkv_s, 1, 0, D, dkv_elem),
                                    span_of("Tensors::d_sink", p.has_sink ? t.d_sink : nullptr, 1, 0, 1, 0, H, 4),
                                    span_of("run(): workspace", layout_.total ? workspace : nullptr, 1, 0, 1, 0,
                                            int64_t(layout_.total), 1)};
    const std::array<Span, 7> inputs{
        span_of("Tensors::q", t.q, T, s.q_st, H, s.q_sh, D, 2),
        span_of("Tensors::kv", t.kv, K, s.kv_s, 1, 0, D, 2),
        span_of("Tensors::o", t.o, T, s.o_st, H, s.o_sh, D, 2),
        span_of("Tensors::dout", t.dout, T, s.do_st, H, s.do_sh, D, 2),
        span_of("Tensors::lse", t.lse, T, s.lse_st, H, s.lse_sh, 1, 4),
        span_of("Tensors::topk", t.topk, T, s.topk_st, 1, 0, p.topk, 4),
        span_of("Tensors::attn_sink", p.has_sink ? t.attn_sink : nullptr, 1, 0, 1, 0, H, 4)};
    // After span_of, which refuses strides whose rows span past 2^57 bytes: the extents named here then fit int64.
    check_rows_disjoint("dq", p.T, s.dq_st, "dq_stride_t", H, s.dq_sh, "dq_stride_h", D);
    check_no_overlap(outputs, inputs);
  }

  s.T = shape_.T;
  s.H = shape_.H;
  s.num_kv = shape_.num_kv;
  s.topk_n = shape_.topk;
  s.r_chunk = shape_.r_chunk;
  s.n_chunks = shape_.n_chunks;
  s.scale = p.scale ? *p.scale : float(1.0 / std::sqrt(512.0));
  s.lse_mode = (p.lse.base2 ? SMLA_LSE_BASE2 : 0) | (p.lse.includes_sink ? 0 : SMLA_LSE_EXCLUDES_SINK);
  s.check_indices = p.check_indices ? 1 : 0;
  s.radix_bits = shape_.radix_bits;
  s.radix_passes = shape_.radix_passes;
  s.csr_final = shape_.radix_passes % 2;
  layout_.place(workspace, s);
  return s;
}

SmlaParams PlanImpl::step_params(size_t i, const SmlaParams& base) const {
  const Step& st = steps_[i];
  SmlaParams p = base;
  p.chunk = st.acc_index;
  p.n_chunks = st.acc_count;
  p.r_start = st.chunk * shape_.r_chunk;
  p.pass = st.spec.pass;
  if (st.t_count) {
    // A token chunk: its tokens are the kernels' 0..t_count-1. The per-token tensors and workspace rows start at
    // t_start; ds, pm, interm, csr and dq_acc hold one chunk and dkv is over every token, so they stay.
    const long long t0 = st.t_start, H = shape_.H;
    p.T = st.t_count;
    p.q += t0 * p.q_st;
    p.o += t0 * p.o_st;
    p.dout += t0 * p.do_st;
    p.dq += t0 * p.dq_st;
    p.lse += t0 * p.lse_st;
    p.topk += t0 * p.topk_st;
    p.delta += t0 * H;
    p.lse_n += t0 * H;
  }
  return p;
}

// The driver's error alone does not say which of the plan's launches failed: name it.
void PlanImpl::launch_step(size_t i, const SmlaParams& base, void* stream) const {
  const KernelSpec& k = steps_[i].spec;
  try {
    backend_->launch(*kernels_[i], k, step_params(i, base), stream);
  } catch (const Error& e) {
    auto dim = [](const Dim3& d) {
      return "(" + std::to_string(d.x) + ", " + std::to_string(d.y) + ", " + std::to_string(d.z) + ")";
    };
    const bool async = backend_->name() != "cpu";  // a GPU launch also returns errors of earlier work
    throw Error(e.status(),
                "launch " + std::to_string(i) + " of " + std::to_string(steps_.size()) + " (phase " +
                    phase_name(steps_[i].phase) + ", " + k.entry + ", grid " + dim(k.grid) + ", block " +
                    dim(k.block) + "): " + e.message() +
                    (async ? " (an earlier asynchronous error of the stream may be reported here)" : ""),
                e.file(), e.line(), e.call());
  }
}

// A driver error of run() with a stream the plan's device cannot use: the driver says only "invalid resource handle";
// name the stream instead (the backend is asked after the failure, never on the way in).
template <class Launches>
void PlanImpl::naming_a_foreign_stream(void* stream, Launches&& launches) const {
  try {
    launches();
  } catch (const Error& e) {
    if (e.status() != Status::DriverError) throw;
    const std::string why = backend_->foreign_stream(problem_.device, stream);
    if (why.empty()) throw;
    throw Error(Status::InvalidArgument, "run(): " + why + " (" + e.message() + ")", e.file(), e.line(), e.call());
  }
}

void PlanImpl::run(const Tensors& t, void* workspace, size_t workspace_size, void* stream) const {
  backend_->check_stream(problem_.device, stream);
  const SmlaParams base = base_params(t, workspace, workspace_size);
  naming_a_foreign_stream(stream, [&] { run_steps(base, stream); });
}

void PlanImpl::run_steps(const SmlaParams& base, void* stream) const {
  Backend& be = *backend_;
  const int dev = problem_.device;
  // Side steps (csr) go to a side stream forked from `stream` and are joined back before the step
  // that reads them; without a side stream (CPU, HIP, SMLA_SIDE_STREAM=0) everything runs in order.
  // A launch that throws while forked still joins the side stream back (best effort): otherwise a
  // capture cannot end (unjoined fork) and `stream` does not wait for csr still writing the workspace.
  struct Side {
    Backend& be;
    int dev;
    void* s;
    void* main;
    bool forked = false;
    ~Side() {
      if (forked) {
        try {
          be.stream_wait(dev, main, s);
        } catch (...) {  // a destructor must not throw; the launch's error is the one to report
        }
      }
      try {
        be.release_side_stream(dev, s, main);  // (a pool's push_back: bad_alloc here would end in std::terminate)
      } catch (...) {  // the stream stays out of the pool: one stream leaked, nothing else
      }
    }
  } side{be, dev, runtime_env().side_stream ? be.acquire_side_stream(dev, stream) : nullptr, stream};
  for (size_t i = 0; i < steps_.size(); ++i) {
    const Step& st = steps_[i];
    if (st.side && side.s) {
      if (!side.forked) be.stream_wait(dev, side.s, stream);
      side.forked = true;
      launch_step(i, base, side.s);
      continue;
    }
    if (st.join && side.forked) {
      be.stream_wait(dev, stream, side.s);
      side.forked = false;
    }
    launch_step(i, base, stream);
  }
  if (side.forked) be.stream_wait(dev, stream, side.s);  // nothing of this run is left outside `stream`
  side.forked = false;
}

void PlanImpl::run_launch(size_t i, const Tensors& t, void* workspace, size_t workspace_size, void* stream) const {
  SMLA_REQUIRE(i < steps_.size(), Status::InvalidArgument,
               "launch index " + std::to_string(i) + " out of range (" + std::to_string(steps_.size()) + ")");
  backend_->check_stream(problem_.device, stream);
  const SmlaParams base = base_params(t, workspace, workspace_size);
  naming_a_foreign_stream(stream, [&] { launch_step(i, base, stream); });
}

std::string PlanImpl::launch_phase(size_t i) const {
  SMLA_REQUIRE(i < steps_.size(), Status::InvalidArgument, "launch index out of range");
  return phase_name(steps_[i].phase);
}

std::optional<BadIndex> PlanImpl::index_report(const void* workspace, void* stream) const {
  SMLA_REQUIRE(problem_.check_indices, Status::InvalidArgument,
               "index_report() needs a plan made with Problem::check_indices = true");
  require_usable_backend();  // as run()
  SMLA_REQUIRE(workspace, Status::InvalidArgument, "index_report(): workspace is null");
  // As run() checks it: the backend's memory, aligned (a misaligned one read another place as the report).
  check_ptr(*backend_, problem_.device, workspace, "index_report(): workspace", WorkspaceLayout::kAlign);
  int rep[4] = {0, 0, 0, 0};
  backend_->read_back(rep, static_cast<const char*>(workspace) + layout_.index_report.offset, sizeof(rep), stream);
  if (rep[0] == 0) return std::nullopt;
  return BadIndex{rep[0], rep[1], rep[2], rep[3]};
}

}  // namespace smla
