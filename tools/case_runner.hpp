// case_runner.hpp: one problem's tensors on the backend's side (host memory for the CPU
// backend, device memory for CUDA), poisoned outputs, and read-back. Shared by smla-bench and
// the end-to-end tests so both exercise the public API the same way.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/cuda/device_memory.hpp"
#include "smla/smla.hpp"
#include "tests/reference/reference.hpp"

namespace smla::tools {

struct Outputs {
  std::vector<uint16_t> dq, dkv;  // bf16 bits
  std::vector<float> dkv_f32;     // with Problem::dkv_fp32
  std::vector<float> d_sink;
};

/// xxHash64 (16 hex digits) of each output's bytes, by name ("dq", "dkv", "dkv_f32", "d_sink"; only those present):
/// bitwise comparisons of outputs across processes, rounds and builds without keeping the outputs.
std::map<std::string, std::string> output_digests(const Outputs& o);

class CaseRunner {
 public:
  /// `p.backend` must be resolved (not Auto). `lse` overrides in.lse (another convention).
  CaseRunner(const Problem& p, const ref::Inputs& in, const std::vector<float>* lse = nullptr);
  ~CaseRunner();
  bool device() const { return device_; }
  Tensors& tensors() { return t_; }
  /// A workspace of at least `bytes` (reallocated when larger is asked).
  void* workspace(size_t bytes);
  size_t workspace_size() const { return ws_bytes_; }
  /// CUstream for CUDA, null for the CPU.
  void* stream() const;
  void sync() const;
  /// Fills dq, dkv and d_sink with the reference's poison pattern.
  void poison_outputs();
  Outputs read_outputs() const;

 private:
  void* add(const void* src, size_t bytes);
  void fill32(void* p, size_t bytes, uint32_t word);
  template <class T>
  std::vector<T> read(const void* p, size_t count) const;

  Problem p_;
  bool device_ = false;
  Tensors t_;
  struct FreeDeleter {
    void operator()(void* p) const;
  };
  std::vector<std::unique_ptr<void, FreeDeleter>> host_;  // 256-byte aligned, like device memory
  std::vector<cuda::DeviceBuffer> dev_;
  void* ws_ = nullptr;
  size_t ws_bytes_ = 0;
  std::unique_ptr<cuda::Stream> stream_;
};

}  // namespace smla::tools
