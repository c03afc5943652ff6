// case_runner.cpp: tensors of one problem on the host or a CUDA device.
#include "case_runner.hpp"

#include <xxhash.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

namespace smla::tools {

CaseRunner::CaseRunner(const Problem& p, const ref::Inputs& in, const std::vector<float>* lse) : p_(p) {
  device_ = p.backend == BackendKind::Cuda;
  if (device_) stream_ = std::make_unique<cuda::Stream>();
  const size_t nq = size_t(p.T) * p.H * 512, nkv = size_t(p.num_kv) * 512;
  t_.q = add(in.q.data(), nq * 2);
  t_.kv = add(in.kv.data(), nkv * 2);
  t_.o = add(in.o.data(), nq * 2);
  t_.dout = add(in.dout.data(), nq * 2);
  const std::vector<float>& l = lse ? *lse : in.lse;
  t_.lse = static_cast<const float*>(add(l.data(), l.size() * 4));
  t_.topk = static_cast<const int32_t*>(add(in.topk.data(), in.topk.size() * 4));
  if (p.has_sink) {
    t_.attn_sink = static_cast<const float*>(add(in.sink.data(), size_t(p.H) * 4));
    t_.d_sink = static_cast<float*>(add(nullptr, size_t(p.H) * 4));
  }
  t_.dq = add(nullptr, nq * 2);
  t_.dkv = add(nullptr, nkv * (p.dkv_fp32 ? 4 : 2));
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
    // Poison the workspace too: no phase may rely on it being zero.
    fill32(ws_, ws_bytes_ / 4 * 4, 0x7fa5a5a5u);
  }
  return ws_;
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

void CaseRunner::poison_outputs() {
  const size_t nq = size_t(p_.T) * p_.H * 512, nkv = size_t(p_.num_kv) * 512;
  const uint32_t bf16_pair = uint32_t(ref::kPoisonBf16) * 0x10001u;
  fill32(t_.dq, nq * 2, bf16_pair);
  if (p_.dkv_fp32)
    fill32(t_.dkv, nkv * 4, ref::kPoisonF32);
  else
    fill32(t_.dkv, nkv * 2, bf16_pair);
  if (p_.has_sink) fill32(t_.d_sink, size_t(p_.H) * 4, ref::kPoisonF32);  // fill32 waits for the device
}

template <class T>
std::vector<T> CaseRunner::read(const void* p, size_t count) const {
  std::vector<T> v(count);
  if (device_) {
    sync();
    SMLA_CU(cuda::driver().MemcpyDtoH(v.data(), reinterpret_cast<CUdeviceptr>(p), count * sizeof(T)));
  } else {
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

Outputs CaseRunner::read_outputs() const {
  Outputs o;
  const size_t nq = size_t(p_.T) * p_.H * 512, nkv = size_t(p_.num_kv) * 512;
  o.dq = read<uint16_t>(t_.dq, nq);
  if (p_.dkv_fp32)
    o.dkv_f32 = read<float>(t_.dkv, nkv);
  else
    o.dkv = read<uint16_t>(t_.dkv, nkv);
  if (p_.has_sink) o.d_sink = read<float>(t_.d_sink, size_t(p_.H));
  return o;
}

}  // namespace smla::tools
