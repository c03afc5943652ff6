// seqpar.hpp: sequence-parallel backward. The tokens of a batch are split across ranks; each rank
// runs the backward on its tokens against the full kv with dkv left unreduced in fp32
// (Problem::dkv_fp32), then the ranks sum dkv and d_sink (both sums over tokens) through a
// Reducer, and dkv is rounded to bf16 once, after the sum. dq needs no reduction: a rank's dq is
// its own rows.
//
//   auto r = seqpar::split(whole.T, rank, nranks);
//   auto plan = rt.plan(seqpar::rank_problem(whole, r));
//   seqpar::backward(*plan, seqpar::rank_view(whole, tensors, r), ws, ws_size, stream, reducer);
//   seqpar::round_to_bf16(dkv_f32, dkv_bf16, num_kv * 512);      // on the host
//
// The same code runs CPU-backend ranks (threads, HostReducer: what CI tests) and GPU ranks
// (one process per GPU, NcclReducer).
#pragma once
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "nccl_api.hpp"
#include "smla/smla.hpp"

namespace smla::seqpar {

/// Tokens [t0, t1) of the whole batch.
struct TokenRange {
  int64_t t0 = 0, t1 = 0;
  int64_t size() const { return t1 - t0; }
};

/// Rank `rank`'s share of T tokens: contiguous, the first T % nranks ranks get one more token.
/// Throws InvalidArgument when a rank would get no token (T < nranks).
TokenRange split(int64_t T, int rank, int nranks);

/// The rank's problem: T = r.size(), dkv_fp32 = true, everything else as in `whole`.
Problem rank_problem(const Problem& whole, TokenRange r);

/// Views of the whole batch's tensors for one rank: q, o, dout, lse, topk and dq start at row
/// t0 (strides kept); kv, attn_sink, dkv and d_sink are passed as given. `t.dkv` must then
/// be an fp32 [num_kv, 512] buffer, and dkv and d_sink the rank's own (every rank sums into
/// them before the reduction; HostReducer refuses ranks whose buffers overlap). Pointer
/// arithmetic only: works for host and device memory. A rank plan's index_report() counts
/// tokens from the rank's t0 (add r.t0 for the batch's token).
Tensors rank_view(const Problem& whole, const Tensors& t, TokenRange r);

/// Sums an fp32 buffer across ranks, in place: every rank ends with the same bits, and the same
/// inputs give the same bits on every call (a fixed reduction order).
class Reducer {
 public:
  /// Where the buffers a reducer sums must live: Host (it reads them on the calling thread at once: the CPU backend's
  /// synchronous runs), Device (a GPU backend's), Any (a reducer of the caller's that does not say).
  enum class Memory { Any, Host, Device };
  virtual ~Reducer() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// backward() refuses a plan whose backend does not match (a HostReducer over a CUDA plan's dkv dereferenced
  /// device memory on the host, or read managed memory before the kernels had written it).
  virtual Memory memory() const { return Memory::Any; }
  /// The GPU whose memory and streams it sums on (NcclReducer: its communicator's), or -1 for none in particular.
  /// backward() refuses a GPU plan of another device: the reduction would be ordered on another device's stream.
  virtual int device() const { return -1; }
  /// Every rank calls it with the same `count`, in the same order of calls. `buf` is memory the
  /// rank's backend uses (host for HostReducer, device for NcclReducer); `stream` orders it
  /// after the backward (ignored by HostReducer, whose CPU ranks are synchronous).
  virtual void all_reduce_sum(float* buf, size_t count, void* stream) = 0;
  /// This rank failed (backward() calls it before rethrowing): release what waits on it. HostReducer aborts its group
  /// (the other ranks throw); NcclReducer aborts its communicator, so that this rank can unwind without waiting for a
  /// collective it will never finish; the other ranks' NCCL collectives must be aborted by the application.
  virtual void abort(const std::string& /*why*/) {}
};

/// The meeting point of the ranks of one host that share memory (threads of one process).
/// Sums in rank order: out[i] = ((buf_0[i] + buf_1[i]) + buf_2[i]) + ... in fp32.
class HostGroup {
 public:
  explicit HostGroup(int nranks);
  int size() const { return n_; }
  /// Breaks the group for good: ranks waiting in, or later entering, a reduction throw
  /// smla::Error carrying `why`. A rank that fails calls this so the others do not wait forever.
  void abort(const std::string& why);

 private:
  friend class HostReducer;
  void reduce(int rank, float* buf, size_t count);
  // Waits until all ranks arrive; the last one runs `last` first (under the lock).
  template <class Fn>
  void barrier(std::unique_lock<std::mutex>& lk, Fn last);

  const int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
  std::string why_;
  std::vector<float*> bufs_;
  std::vector<size_t> counts_;
  std::vector<float> sum_;
};

class HostReducer : public Reducer {
 public:
  HostReducer(std::shared_ptr<HostGroup> group, int rank);
  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  Memory memory() const override { return Memory::Host; }
  void all_reduce_sum(float* buf, size_t count, void* stream) override;
  void abort(const std::string& why) override;

 private:
  std::shared_ptr<HostGroup> group_;
  int rank_;
};

/// One rank of an NCCL job (one GPU). NVLink multicast is forced off before the communicator
/// exists. NCCL's ring/tree sums are fixed for a given communicator size, message size and
/// topology, so reruns give the same bits and all ranks hold the same result.
class NcclReducer : public Reducer {
 public:
  /// Throws smla::Error (NoBackend, naming libnccl.so.2) when NCCL cannot be opened; `library`
  /// empty means $SMLA_LIBNCCL or libnccl.so.2. Blocks until all `nranks` ranks have joined.
  NcclReducer(const nccl::UniqueId& id, int rank, int nranks, int device, const std::string& library = "");
  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }
  Memory memory() const override { return Memory::Device; }
  int device() const override;
  void all_reduce_sum(float* device_buf, size_t count, void* stream) override;
  void abort(const std::string& why) override;

 private:
  std::unique_ptr<nccl::Communicator> comm_;
};

/// One rank's share: runs `plan` (a rank_problem plan) on the rank's tensors, then sums the fp32
/// dkv partials ([num_kv, 512], packed) and, with a sink, the d_sink partials ([H]) across ranks,
/// in place. Launches only (plus what the reducer does): read the results after the stream.
/// Any failure, the refusal of its arguments included, aborts `reducer` before it is thrown, so that the other ranks
/// are not left waiting for this one.
void backward(const Plan& plan, const Tensors& t, void* workspace, size_t workspace_size, void* stream,
              Reducer& reducer);

/// The single bf16 rounding of the reduced dkv (round to nearest even, as the kernels round).
void round_to_bf16(const float* src, uint16_t* dst, size_t n);

}  // namespace smla::seqpar
