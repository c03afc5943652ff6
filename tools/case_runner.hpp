// case_runner.hpp: one problem's tensors on the backend's side (host memory for the CPU
// backend, device memory for CUDA), poisoned outputs, and read-back. Shared by smla-bench and
// the end-to-end tests so both exercise the public API the same way.
#pragma once
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/cuda/device_memory.hpp"
#include "smla/smla.hpp"
#include "tests/reference/reference.hpp"

namespace smla::tools {

/// Whether two vectors hold the same bytes (floats as bits: -0 and NaN payloads count). Empty ones are equal without
/// a memcmp of their (possibly null) data, which is undefined behaviour even for zero bytes.
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

struct Outputs {
  std::vector<uint16_t> dq, dkv;  // bf16 bits
  std::vector<float> dkv_f32;     // with Problem::dkv_fp32
  std::vector<float> d_sink;
  /// Layout::Strided: elements in the gaps between dq's and dkv's rows that no longer hold the poison (a write
  /// outside the tensor as its strides describe it). 0 for packed tensors, which have no gaps.
  size_t stray_writes = 0;
};

/// How CaseRunner lays out the tensors: packed, or with every stride the API has set to something else (padded
/// rows, head-major q/o/dout/dq, a transposed lse, padded top-k rows), each tensor differently, so that a kernel
/// that mixes up two strides or assumes packing reads or writes the wrong elements.
enum class Layout { Packed, Strided };

/// xxHash64 (16 hex digits) of each output's bytes, by name ("dq", "dkv", "dkv_f32", "d_sink"; only those present):
/// bitwise comparisons of outputs across processes, rounds and builds without keeping the outputs.
std::map<std::string, std::string> output_digests(const Outputs& o);

class CaseRunner {
 public:
  /// `p.backend` must be resolved (not Auto). `lse` overrides in.lse (another convention).
  CaseRunner(const Problem& p, const ref::Inputs& in, const std::vector<float>* lse = nullptr,
             Layout layout = Layout::Packed);
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
  /// Fills the workspace (as workspace() made it) with a poison pattern again: no run may rely on what the last one
  /// left there.
  void poison_workspace();
  /// A workspace of at least `bytes` and the outputs, both poisoned: what a run whose outputs are read starts on.
  void* poisoned_for_run(size_t bytes);
  Outputs read_outputs() const;
  /// Bytes of the dq and dkv allocations (their whole spans under the layout's strides, gaps included) and of d_sink
  /// (0 without a sink): what a copy of the outputs' state takes.
  size_t dq_bytes() const { return dq_shape_.span() * dq_shape_.elem; }
  size_t dkv_bytes() const { return dkv_shape_.span() * dkv_shape_.elem; }
  size_t d_sink_bytes() const { return p_.has_sink ? size_t(p_.H) * 4 : 0; }

 private:
  void* add(const void* src, size_t bytes);
  void fill32(void* p, size_t bytes, uint32_t word);
  template <class T>
  std::vector<T> read(const void* p, size_t count) const;

  /// A [n_t][n_h][row] tensor of `elem`-byte elements at element strides st, sh.
  struct Shape3 {
    int64_t n_t, n_h, row, st, sh;
    size_t elem;
    size_t span() const { return size_t((n_t - 1) * st + (n_h - 1) * sh + row); }  // elements from the first
    bool packed() const { return (n_h == 1 || sh == row) && st == n_h * row; }
  };
  /// The packed `src` ([n_t][n_h][row]) laid out as `s` (gaps filled with `gap`, one elem-sized pattern).
  void* add_laid_out(const void* src, const Shape3& s, const void* gap);
  /// Poisons all of `s`'s span (its gaps too).
  void poison(void* p, const Shape3& s, uint32_t word);
  /// The packed elements of `s` at `p`; counts the gap elements that differ from `poison` into *stray.
  template <class T>
  std::vector<T> read_laid_out(const void* p, const Shape3& s, T poison, size_t* stray) const;

  Problem p_;
  Layout layout_ = Layout::Packed;
  Shape3 dq_shape_{}, dkv_shape_{};
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
