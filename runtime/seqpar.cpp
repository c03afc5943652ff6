// seqpar.cpp: token split, per-rank views, the host reduction and the rank's backward.
#include "seqpar.hpp"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "bf16.hpp"
#include "check.hpp"

namespace smla::seqpar {

namespace {
constexpr int64_t D = 512;

template <class T>
T* offset_rows(T* p, int64_t rows, int64_t stride_elems, size_t elem_bytes) {
  if (!p) return p;
  using Byte = std::conditional_t<std::is_const_v<T>, const char, char>;
  int64_t bytes = 0;  // (a stride past any memory overflowed here; the rank's run() then names such strides)
  SMLA_REQUIRE(!__builtin_mul_overflow(rows, stride_elems, &bytes) &&
                   !__builtin_mul_overflow(bytes, int64_t(elem_bytes), &bytes),
               Status::InvalidArgument, "a token stride of " + std::to_string(stride_elems) + " elements: row " +
                                            std::to_string(rows) + " lies past any memory");
  return reinterpret_cast<T*>(reinterpret_cast<Byte*>(p) + bytes);
}
}  // namespace

TokenRange split(int64_t T, int rank, int nranks) {
  SMLA_REQUIRE(nranks >= 1 && rank >= 0 && rank < nranks, Status::InvalidArgument,
               "rank " + std::to_string(rank) + " is not in [0, " + std::to_string(nranks) + ")");
  SMLA_REQUIRE(T >= nranks, Status::InvalidArgument,
               "T = " + std::to_string(T) + " tokens cannot be split over " + std::to_string(nranks) +
                   " ranks: every rank needs at least one token (use fewer ranks)");
  const int64_t base = T / nranks, extra = T % nranks;
  TokenRange r;
  r.t0 = rank * base + std::min<int64_t>(rank, extra);
  r.t1 = r.t0 + base + (rank < extra ? 1 : 0);
  return r;
}

Problem rank_problem(const Problem& whole, TokenRange r) {
  SMLA_REQUIRE(r.t0 >= 0 && r.t1 <= whole.T && r.size() >= 1, Status::InvalidArgument,
               "token range [" + std::to_string(r.t0) + ", " + std::to_string(r.t1) + ") is not a non-empty part of [0, " +
                   std::to_string(whole.T) + ")");
  Problem p = whole;
  p.T = r.size();
  p.t_chunk = std::min(p.t_chunk, p.T);  // the whole problem's token chunk, at most the rank's tokens
  p.dkv_fp32 = true;  // partial sums stay fp32 until every rank's share is in
  return p;
}

Tensors rank_view(const Problem& whole, const Tensors& t, TokenRange r) {
  rank_problem(whole, r);  // validates the range
  const int64_t H = whole.H;
  auto or_packed = [](int64_t s, int64_t packed) { return s ? s : packed; };
  Tensors v = t;
  const int64_t t0 = r.t0;
  v.q = offset_rows(t.q, t0, or_packed(t.q_stride_t, H * D), 2);
  v.o = offset_rows(t.o, t0, or_packed(t.o_stride_t, H * D), 2);
  v.dout = offset_rows(t.dout, t0, or_packed(t.do_stride_t, H * D), 2);
  v.dq = offset_rows(t.dq, t0, or_packed(t.dq_stride_t, H * D), 2);
  v.lse = offset_rows(t.lse, t0, or_packed(t.lse_stride_t, H), 4);
  v.topk = offset_rows(t.topk, t0, or_packed(t.topk_stride, whole.topk), 4);
  return v;
}

// ---- HostGroup

HostGroup::HostGroup(int nranks) : n_(nranks), bufs_(size_t(std::max(nranks, 1))), counts_(bufs_.size()) {
  SMLA_REQUIRE(nranks >= 1, Status::InvalidArgument, "a host group needs at least one rank");
}

void HostGroup::abort(const std::string& why) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!aborted_) why_ = why;
  aborted_ = true;
  cv_.notify_all();
}

template <class Fn>
void HostGroup::barrier(std::unique_lock<std::mutex>& lk, Fn last) {
  auto fail = [&] { SMLA_THROW(Status::Internal, "sequence-parallel host group aborted: " + why_); };
  if (aborted_) fail();
  const uint64_t gen = generation_;
  if (++arrived_ == n_) {
    arrived_ = 0;
    last();
    ++generation_;
    cv_.notify_all();
  } else {
    cv_.wait(lk, [&] { return generation_ != gen || aborted_; });
  }
  if (aborted_) fail();
}

void HostGroup::reduce(int rank, float* buf, size_t count) {
  std::unique_lock<std::mutex> lk(mu_);
  bufs_[size_t(rank)] = buf;
  counts_[size_t(rank)] = count;
  barrier(lk, [&] {
    // One buffer shared by two ranks (a dkv tensor passed whole to every rank) would be summed with itself and
    // written while another rank reads it.
    for (int a = 0; a < n_ && !aborted_; ++a)
      for (int b = a + 1; b < n_ && !aborted_; ++b) {
        const uintptr_t pa = reinterpret_cast<uintptr_t>(bufs_[size_t(a)]),
                        pb = reinterpret_cast<uintptr_t>(bufs_[size_t(b)]);
        const size_t na = counts_[size_t(a)] * sizeof(float), nb = counts_[size_t(b)] * sizeof(float);
        if (na && nb && pa < pb + nb && pb < pa + na) {
          aborted_ = true;
          why_ = "ranks " + std::to_string(a) + " and " + std::to_string(b) +
                 " passed overlapping buffers to all_reduce_sum: each rank needs outputs (dkv, d_sink) of its own";
        }
      }
    if (aborted_) return;
    for (int r = 1; r < n_; ++r)
      if (counts_[size_t(r)] != counts_[0]) {
        // Every rank must stop, not only this one: break the group (all waiters see it).
        aborted_ = true;
        why_ = "ranks passed different counts to all_reduce_sum (rank 0: " + std::to_string(counts_[0]) + ", rank " +
               std::to_string(r) + ": " + std::to_string(counts_[size_t(r)]) + ")";
        return;
      }
    sum_.resize(count);
  });
  lk.unlock();
  // Each rank sums its slice of the elements; every element adds the ranks in rank order, so
  // the result does not depend on how the slices fall.
  const size_t per = (count + size_t(n_) - 1) / size_t(n_);
  const size_t lo = std::min(count, per * size_t(rank)), hi = std::min(count, lo + per);
  for (size_t i = lo; i < hi; ++i) {
    float s = bufs_[0][i];
    for (int r = 1; r < n_; ++r) s += bufs_[size_t(r)][i];
    sum_[i] = s;
  }
  lk.lock();
  barrier(lk, [] {});
  lk.unlock();
  if (count) std::memcpy(buf, sum_.data(), count * sizeof(float));
  lk.lock();
  barrier(lk, [] {});  // nobody reuses sum_ or bufs_ before everyone has copied
}

HostReducer::HostReducer(std::shared_ptr<HostGroup> group, int rank) : group_(std::move(group)), rank_(rank) {
  SMLA_REQUIRE(group_ && rank >= 0 && rank < group_->size(), Status::InvalidArgument,
               "HostReducer rank " + std::to_string(rank) + " is not in its group");
}

void HostReducer::all_reduce_sum(float* buf, size_t count, void* /*stream*/) { group_->reduce(rank_, buf, count); }

void HostReducer::abort(const std::string& why) { group_->abort("rank " + std::to_string(rank_) + " failed: " + why); }

// ---- NcclReducer

NcclReducer::NcclReducer(const nccl::UniqueId& id, int rank, int nranks, int device, const std::string& library) {
  auto api = library.empty() ? nccl::library() : nccl::open_library(library);
  comm_ = std::make_unique<nccl::Communicator>(std::move(api), id, rank, nranks, device);
}

void NcclReducer::all_reduce_sum(float* device_buf, size_t count, void* stream) {
  comm_->all_reduce_sum(device_buf, count, stream);
}

void NcclReducer::abort(const std::string& /*why*/) { comm_->abort(); }

int NcclReducer::device() const { return comm_->device(); }

// ---- the rank's backward

void backward(const Plan& plan, const Tensors& t, void* workspace, size_t workspace_size, void* stream,
              Reducer& reducer) {
  const Problem& p = plan.problem();
  try {  // the refusals too: a rank that throws before its reductions must release the others
    SMLA_REQUIRE(p.dkv_fp32, Status::InvalidArgument,
                 "seqpar::backward needs a plan of seqpar::rank_problem(...) (Problem::dkv_fp32 = true): the dkv "
                 "partials must stay fp32 until they are summed");
    SMLA_REQUIRE(t.dkv_stride == 0 || t.dkv_stride == D, Status::InvalidArgument,
                 "seqpar::backward reduces dkv as one packed buffer: dkv_stride must be 0 or 512, not " +
                     std::to_string(t.dkv_stride));
    const bool host_plan = plan.info().backend == "cpu";
    if (reducer.memory() != Reducer::Memory::Any && (reducer.memory() == Reducer::Memory::Host) != host_plan)
      SMLA_THROW(Status::InvalidArgument,
                 std::string("seqpar::backward: the reducer sums ") +
                     (host_plan ? "device memory (as NcclReducer does)" : "host memory at once (as HostReducer does)") +
                     " but the plan runs on the " + plan.info().backend + " backend" +
                     (host_plan ? ", whose outputs are host memory: use a HostReducer"
                                : ", whose outputs are device memory written asynchronously: use an NcclReducer"));
    const int rdev = reducer.device();
    if (rdev >= 0 && !host_plan && rdev != p.device)
      SMLA_THROW(Status::InvalidArgument, "seqpar::backward: the reducer sums on device " + std::to_string(rdev) +
                                              " but the plan runs on device " + std::to_string(p.device));
    plan.run(t, workspace, workspace_size, stream);
    reducer.all_reduce_sum(static_cast<float*>(t.dkv), size_t(p.num_kv) * D, stream);
    if (p.has_sink) reducer.all_reduce_sum(t.d_sink, size_t(p.H), stream);
  } catch (const std::exception& e) {
    reducer.abort(e.what());  // the other ranks must not wait for this one's reductions for ever
    throw;
  }
}

void round_to_bf16(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = float_to_bf16(src[i]);
}

}  // namespace smla::seqpar
