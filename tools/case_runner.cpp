// case_runner.cpp: tensors of one problem on the host or a CUDA device.
#include "case_runner.hpp"

#include <xxhash.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

namespace smla::tools {

CaseRunner::CaseRunner(const Problem& p, const ref::Inputs& in, const std::vector<float>* lse, Layout layout)
    : p_(p), layout_(layout) {
  device_ = p.backend == BackendKind::Cuda;
  // Buffers and stream on the plan's device: the thread's context is left there for the runner's later copies (one
  // already current on that device, the caller's own, is kept).
  if (device_) cuda::ensure_context_on(p.device), stream_ = std::make_unique<cuda::Stream>();
  const int64_t T = p.T, H = p.H, K = p.num_kv, D = 512;
  const bool st = layout == Layout::Strided;
  // Strided: each tensor its own layout (strides in elements, multiples of 8 for bf16 rows as the API asks).
  const Shape3 q_s = st ? Shape3{T, H, D, D + 8, T * (D + 8) + 16, 2} : Shape3{T, H, D, H * D, D, 2};  // head-major
  const Shape3 o_s = st ? Shape3{T, H, D, H * (D + 16) + 32, D + 16, 2} : q_s;                      // padded rows
  const Shape3 do_s = st ? Shape3{T, H, D, D, T * D, 2} : q_s;                                     // head-major
  dq_shape_ = st ? Shape3{T, H, D, D + 24, T * (D + 24) + 8, 2} : q_s;                             // head-major
  const Shape3 kv_s{K, 1, D, st ? D + 40 : D, 0, 2};
  dkv_shape_ = Shape3{K, 1, D, st ? D + (p.dkv_fp32 ? 4 : 8) : D, 0, size_t(p.dkv_fp32 ? 4 : 2)};
  const Shape3 lse_s = st ? Shape3{T, H, 1, 1, T + 3, 4} : Shape3{T, H, 1, H, 1, 4};  // transposed: [H][T + 3]
  const Shape3 topk_s{T, 1, p.topk, st ? p.topk + 5 : p.topk, 0, 4};
  if (st) {
    t_.q_stride_t = q_s.st, t_.q_stride_h = q_s.sh, t_.o_stride_t = o_s.st, t_.o_stride_h = o_s.sh;
    t_.do_stride_t = do_s.st, t_.do_stride_h = do_s.sh, t_.dq_stride_t = dq_shape_.st, t_.dq_stride_h = dq_shape_.sh;
    t_.kv_stride = kv_s.st, t_.dkv_stride = dkv_shape_.st, t_.lse_stride_t = lse_s.st, t_.lse_stride_h = lse_s.sh;
    t_.topk_stride = topk_s.st;
  }
  // Input gaps hold values that would show if read: NaN for the floats, an in-range index for the top-k.
  const uint16_t nan_bf16 = 0x7fc1;
  const float nan_f32 = std::nanf("");
  const int32_t index0 = 0;
  t_.q = add_laid_out(in.q.data(), q_s, &nan_bf16);
  t_.kv = add_laid_out(in.kv.data(), kv_s, &nan_bf16);
  t_.o = add_laid_out(in.o.data(), o_s, &nan_bf16);
  t_.dout = add_laid_out(in.dout.data(), do_s, &nan_bf16);
  const std::vector<float>& l = lse ? *lse : in.lse;
  t_.lse = static_cast<const float*>(add_laid_out(l.data(), lse_s, &nan_f32));
  t_.topk = static_cast<const int32_t*>(add_laid_out(in.topk.data(), topk_s, &index0));
  if (p.has_sink) {
    t_.attn_sink = static_cast<const float*>(add(in.sink.data(), size_t(p.H) * 4));
    t_.d_sink = static_cast<float*>(add(nullptr, size_t(p.H) * 4));
  }
  t_.dq = add(nullptr, dq_shape_.span() * dq_shape_.elem);
  t_.dkv = add(nullptr, dkv_shape_.span() * dkv_shape_.elem);
}

void* CaseRunner::add_laid_out(const void* src, const Shape3& s, const void* gap) {
  if (s.packed()) return add(src, s.span() * s.elem);  // as is
  std::vector<char> buf(s.span() * s.elem);
  for (size_t i = 0; i < s.span(); ++i) std::memcpy(&buf[i * s.elem], gap, s.elem);
  for (int64_t t = 0; t < s.n_t; ++t)
    for (int64_t h = 0; h < s.n_h; ++h)
      std::memcpy(&buf[size_t(t * s.st + h * s.sh) * s.elem],
                  static_cast<const char*>(src) + size_t((t * s.n_h + h) * s.row) * s.elem, size_t(s.row) * s.elem);
  return add(buf.data(), buf.size());
}

CaseRunner::~CaseRunner() = default;

void CaseRunner::FreeDeleter::operator()(void* p) const { std::free(p); }

void* CaseRunner::add(const void* src, size_t bytes) {
  if (device_) {
    dev_.emplace_back(bytes);
    if (src) dev_.back().upload(src, bytes);
    return dev_.back().get();
  }
  const size_t rounded = (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
  host_.emplace_back(std::aligned_alloc(256, rounded));
  if (!host_.back()) throw std::bad_alloc();
  if (src) std::memcpy(host_.back().get(), src, bytes);
  return host_.back().get();
}

void* CaseRunner::workspace(size_t bytes) {
  if (bytes > ws_bytes_ || !ws_) {
    ws_ = add(nullptr, std::max<size_t>(bytes, 256));
    ws_bytes_ = std::max<size_t>(bytes, 256);
    poison_workspace();  // no phase may rely on it being zero
  }
  return ws_;
}

void* CaseRunner::poisoned_for_run(size_t bytes) {
  void* ws = workspace(bytes);
  poison_workspace();
  poison_outputs();
  return ws;
}

void CaseRunner::poison_workspace() {
  if (ws_) fill32(ws_, ws_bytes_ / 4 * 4, 0x7fa5a5a5u);  // a NaN pattern in fp32, garbage in bf16 and int32
}

void* CaseRunner::stream() const { return stream_ ? static_cast<void*>(stream_->get()) : nullptr; }

void CaseRunner::sync() const {
  if (stream_) stream_->sync();
}

void CaseRunner::fill32(void* p, size_t bytes, uint32_t word) {
  if (device_) {
    SMLA_CU(cuda::driver().MemsetD32(reinterpret_cast<CUdeviceptr>(p), word, bytes / 4));
    // The memset runs on the legacy stream and may still be running on return; the run that follows
    // is on a non-blocking stream (and its side stream), which would not wait for it.
    SMLA_CU(cuda::driver().CtxSynchronize());
  } else {
    for (size_t i = 0; i < bytes / 4; ++i) std::memcpy(static_cast<char*>(p) + 4 * i, &word, 4);
  }
}

void CaseRunner::poison(void* p, const Shape3& s, uint32_t word) {
  // Whole 32-bit words: every span here has an even number of bf16 elements (strides and rows multiples of 8).
  fill32(p, s.span() * s.elem / 4 * 4, word);
}

void CaseRunner::poison_outputs() {
  const uint32_t bf16_pair = uint32_t(ref::kPoisonBf16) * 0x10001u;
  poison(t_.dq, dq_shape_, bf16_pair);
  poison(t_.dkv, dkv_shape_, p_.dkv_fp32 ? ref::kPoisonF32 : bf16_pair);
  if (p_.has_sink) fill32(t_.d_sink, size_t(p_.H) * 4, ref::kPoisonF32);  // fill32 waits for the device
}

template <class T>
std::vector<T> CaseRunner::read(const void* p, size_t count) const {
  std::vector<T> v(count);
  if (device_) {
    sync();
    SMLA_CU(cuda::driver().MemcpyDtoH(v.data(), reinterpret_cast<CUdeviceptr>(p), count * sizeof(T)));
  } else if (count) {
    std::memcpy(v.data(), p, count * sizeof(T));
  }
  return v;
}

std::map<std::string, std::string> output_digests(const Outputs& o) {
  std::map<std::string, std::string> d;
  auto put = [&](const char* name, const void* data, size_t bytes) {
    if (!bytes) return;
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(XXH64(data, bytes, 0)));
    d[name] = hex;
  };
  put("dq", o.dq.data(), o.dq.size() * sizeof(o.dq[0]));
  put("dkv", o.dkv.data(), o.dkv.size() * sizeof(o.dkv[0]));
  put("dkv_f32", o.dkv_f32.data(), o.dkv_f32.size() * sizeof(o.dkv_f32[0]));
  put("d_sink", o.d_sink.data(), o.d_sink.size() * sizeof(o.d_sink[0]));
  return d;
}

template <class T>
std::vector<T> CaseRunner::read_laid_out(const void* p, const Shape3& s, T poison, size_t* stray) const {
  std::vector<T> all = read<T>(p, s.span());
  if (s.packed()) return all;
  std::vector<T> out(size_t(s.n_t * s.n_h * s.row));
  std::vector<char> inside(all.size(), 0);
  for (int64_t t = 0; t < s.n_t; ++t)
    for (int64_t h = 0; h < s.n_h; ++h) {
      const size_t at = size_t(t * s.st + h * s.sh);
      std::memcpy(&out[size_t((t * s.n_h + h) * s.row)], &all[at], size_t(s.row) * sizeof(T));
      std::memset(&inside[at], 1, size_t(s.row));
    }
  for (size_t i = 0; i < all.size(); ++i)
    if (!inside[i] && std::memcmp(&all[i], &poison, sizeof(T)) != 0) ++*stray;
  return out;
}

Outputs CaseRunner::read_outputs() const {
  Outputs o;
  o.dq = read_laid_out<uint16_t>(t_.dq, dq_shape_, ref::kPoisonBf16, &o.stray_writes);
  if (p_.dkv_fp32) {
    float poison;
    std::memcpy(&poison, &ref::kPoisonF32, 4);
    o.dkv_f32 = read_laid_out<float>(t_.dkv, dkv_shape_, poison, &o.stray_writes);
  } else {
    o.dkv = read_laid_out<uint16_t>(t_.dkv, dkv_shape_, ref::kPoisonBf16, &o.stray_writes);
  }
  if (p_.has_sink) o.d_sink = read<float>(t_.d_sink, size_t(p_.H));
  return o;
}

}  // namespace smla::tools
