// test_seqpar.cpp: sequence parallelism on CPU-backend ranks (threads + HostReducer), the same
// code path GPU ranks take with NCCL; the host reduction itself; NCCL's loader when it is missing.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "runtime/cuda/cuda_api.hpp"
#include "tests/cuda_required.hpp"
#include "runtime/cuda/device_memory.hpp"
#include "runtime/nccl_api.hpp"
#include "runtime/seqpar.hpp"
#include "tools/case_runner.hpp"

namespace smla {
namespace {

constexpr size_t D = 512;

Runtime& runtime() {
  static Runtime rt;
  return rt;
}

std::vector<double> widen(const std::vector<uint16_t>& bf16) {
  std::vector<double> v(bf16.size());
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t u = uint32_t(bf16[i]) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    v[i] = f;
  }
  return v;
}
std::vector<double> widen(const std::vector<float>& f) { return std::vector<double>(f.begin(), f.end()); }

void expect_bar(const std::string& what, const ref::Compare& c) {
  EXPECT_TRUE(ref::meets_bar(c)) << what << ": rel_err " << c.rel_err << " cosine " << c.cosine << " finite "
                                 << c.finite << " unwritten " << c.unwritten;
}

using tools::same_bits;

// ---- the split and the views

TEST(SeqparSplit, CoversEveryTokenOnceBalanced) {
  for (int64_t T : {1, 2, 7, 64, 67, 1000})
    for (int n : {1, 2, 3, 5}) {
      if (T < n) continue;
      int64_t next = 0, lo = T, hi = 0;
      for (int r = 0; r < n; ++r) {
        const seqpar::TokenRange g = seqpar::split(T, r, n);
        EXPECT_EQ(g.t0, next) << "T=" << T << " n=" << n << " rank " << r;
        next = g.t1;
        lo = std::min(lo, g.size());
        hi = std::max(hi, g.size());
      }
      EXPECT_EQ(next, T);
      EXPECT_LE(hi - lo, 1) << "T=" << T << " n=" << n;
    }
}

TEST(SeqparSplit, RejectsRanksWithoutTokens) {
  try {
    seqpar::split(2, 0, 3);
    FAIL() << "3 ranks over 2 tokens must throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::InvalidArgument);
    EXPECT_NE(e.message().find("at least one token"), std::string::npos) << e.message();
  }
  EXPECT_THROW(seqpar::split(8, 2, 2), Error);
  EXPECT_THROW(seqpar::split(8, -1, 2), Error);
}

TEST(SeqparView, RankProblemAndRowOffsets) {
  Problem whole;
  whole.T = 10, whole.H = 16, whole.num_kv = 30, whole.topk = 32, whole.has_sink = true, whole.r_chunk = 16;
  const seqpar::TokenRange r{3, 7};
  const Problem p = seqpar::rank_problem(whole, r);
  EXPECT_EQ(p.T, 4);
  EXPECT_TRUE(p.dkv_fp32);
  EXPECT_EQ(p.H, whole.H);
  EXPECT_EQ(p.num_kv, whole.num_kv);
  EXPECT_EQ(p.topk, whole.topk);
  EXPECT_EQ(p.r_chunk, whole.r_chunk);
  EXPECT_TRUE(p.has_sink);
  EXPECT_EQ(p.t_chunk, 0);  // the planner's choice stays the planner's
  whole.t_chunk = 6;        // tokens a chunk of the whole: at most the rank's 4
  EXPECT_EQ(seqpar::rank_problem(whole, r).t_chunk, 4);
  EXPECT_EQ(seqpar::rank_problem(whole, seqpar::TokenRange{0, 8}).t_chunk, 6);
  whole.t_chunk = 0;

  // Fake but distinct base addresses: only the arithmetic is checked.
  std::vector<char> arena(1 << 16);
  char* b = arena.data();
  Tensors t;
  t.q = b + 0x100, t.o = b + 0x200, t.dout = b + 0x300, t.dq = b + 0x400, t.kv = b + 0x500, t.dkv = b + 0x600;
  t.lse = reinterpret_cast<const float*>(b + 0x700);
  t.topk = reinterpret_cast<const int32_t*>(b + 0x800);
  t.d_sink = reinterpret_cast<float*>(b + 0x900);
  t.q_stride_t = 20000;  // a strided q: the view must keep the caller's stride
  t.lse_stride_t = 17;
  const Tensors v = seqpar::rank_view(whole, t, r);
  auto bytes = [](const void* x, const void* base) { return static_cast<const char*>(x) - static_cast<const char*>(base); };
  EXPECT_EQ(bytes(v.q, t.q), 3 * 20000 * 2);
  EXPECT_EQ(bytes(v.o, t.o), 3 * 16 * 512 * 2);
  EXPECT_EQ(bytes(v.dout, t.dout), 3 * 16 * 512 * 2);
  EXPECT_EQ(bytes(v.dq, t.dq), 3 * 16 * 512 * 2);
  EXPECT_EQ(bytes(v.lse, t.lse), 3 * 17 * 4);
  EXPECT_EQ(bytes(v.topk, t.topk), 3 * 32 * 4);
  EXPECT_EQ(v.kv, t.kv);
  EXPECT_EQ(v.dkv, t.dkv);
  EXPECT_EQ(v.d_sink, t.d_sink);
  EXPECT_EQ(v.q_stride_t, 20000);
  EXPECT_THROW(seqpar::rank_view(whole, t, {8, 11}), Error);
}

// ---- the host reduction

void run_ranks(int n, const std::function<void(int)>& fn, std::vector<std::string>* errors) {
  errors->assign(size_t(n), "");
  std::vector<std::thread> th;
  for (int r = 0; r < n; ++r)
    th.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        (*errors)[size_t(r)] = e.what();
      }
    });
  for (auto& x : th) x.join();
}

TEST(HostReducer, SumsInRankOrderAndAllRanksAgree) {
  const int n = 3;
  const size_t count = 1001;  // not a multiple of n: uneven slices
  auto group = std::make_shared<seqpar::HostGroup>(n);
  auto value = [](int r, size_t i, int call) -> float {
    if (i == 5) return r == 0 ? 1e8f : r == 1 ? 1.0f : -1e8f;  // order-sensitive: rank order gives 0
    return std::sin(float(i * 7 + r * 13 + call)) * float(1 + r);
  };
  std::vector<std::vector<float>> out(n);
  const int calls = 40;  // reuses the group's barriers many times
  std::vector<std::string> errors;
  run_ranks(n, [&](int r) {
    seqpar::HostReducer red(group, r);
    EXPECT_EQ(red.size(), n);
    std::vector<float> buf(count);
    for (int c = 0; c < calls; ++c) {
      for (size_t i = 0; i < count; ++i) buf[i] = value(r, i, c);
      red.all_reduce_sum(buf.data(), count, nullptr);
    }
    out[size_t(r)] = buf;
  }, &errors);
  for (auto& e : errors) ASSERT_EQ(e, "");
  std::vector<float> want(count);
  for (size_t i = 0; i < count; ++i) {
    float s = value(0, i, calls - 1);
    for (int r = 1; r < n; ++r) s += value(r, i, calls - 1);
    want[i] = s;
  }
  EXPECT_EQ(want[5], 0.0f) << "the order-sensitive element should cancel in rank order";
  for (int r = 0; r < n; ++r) EXPECT_TRUE(same_bits(out[size_t(r)], want)) << "rank " << r;
}

TEST(HostReducer, MismatchedCountsFailOnEveryRankWithoutHanging) {
  auto group = std::make_shared<seqpar::HostGroup>(2);
  std::vector<std::string> errors;
  run_ranks(2, [&](int r) {
    seqpar::HostReducer red(group, r);
    std::vector<float> buf(8, 1.0f);
    red.all_reduce_sum(buf.data(), r == 0 ? 8 : 4, nullptr);
  }, &errors);
  for (int r = 0; r < 2; ++r) EXPECT_NE(errors[size_t(r)].find("different counts"), std::string::npos) << errors[size_t(r)];
}

// One dkv passed whole to every rank: the sum would add the buffer to itself while another rank writes it.
TEST(HostReducer, OverlappingBuffersFailOnEveryRank) {
  auto group = std::make_shared<seqpar::HostGroup>(3);
  std::vector<float> shared(16, 1.0f), own(8, 1.0f);
  std::vector<std::string> errors;
  run_ranks(3, [&](int r) {
    seqpar::HostReducer red(group, r);
    float* buf = r == 0 ? own.data() : r == 1 ? shared.data() : shared.data() + 4;  // ranks 1 and 2 overlap
    red.all_reduce_sum(buf, 8, nullptr);
  }, &errors);
  for (int r = 0; r < 3; ++r)
    EXPECT_NE(errors[size_t(r)].find("ranks 1 and 2 passed overlapping buffers"), std::string::npos)
        << errors[size_t(r)];
  EXPECT_EQ(shared, std::vector<float>(16, 1.0f)) << "written although refused";
}

TEST(HostReducer, AbortReleasesWaitingRanks) {
  auto group = std::make_shared<seqpar::HostGroup>(2);
  std::vector<std::string> errors;
  run_ranks(2, [&](int r) {
    if (r == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let rank 0 wait first
      group->abort("rank 1 failed to plan");
      return;
    }
    seqpar::HostReducer red(group, 0);
    std::vector<float> buf(8, 1.0f);
    red.all_reduce_sum(buf.data(), 8, nullptr);
  }, &errors);
  EXPECT_NE(errors[0].find("rank 1 failed to plan"), std::string::npos) << errors[0];
}

// The first abort's reason is the one every rank reports: the aborts that follow it (other ranks releasing the group
// as they fail in turn) do not replace it.
TEST(HostReducer, TheFirstAbortsReasonStays) {
  auto group = std::make_shared<seqpar::HostGroup>(2);
  group->abort("rank 1: the first failure");
  group->abort("rank 0: aborted after it");
  seqpar::HostReducer red(group, 0);
  std::vector<float> buf(8, 1.0f);
  try {
    red.all_reduce_sum(buf.data(), 8, nullptr);
    ADD_FAILURE() << "an aborted group reduced";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("rank 1: the first failure"), std::string::npos) << e.message();
    EXPECT_EQ(e.message().find("rank 0"), std::string::npos) << e.message();
  }
}

// ---- sequence-parallel backward on CPU ranks

struct Result {
  std::vector<uint16_t> dq, dkv;
  std::vector<float> dkv_f32, d_sink;
};

Problem cpu_problem(int T, int H, int num_kv, int topk, bool sink) {
  Problem p;
  p.T = T, p.H = H, p.num_kv = num_kv, p.topk = topk, p.has_sink = sink;
  p.r_chunk = 32;  // fixed, so every rank chunks its slots as the one-rank run does
  p.backend = BackendKind::Cpu;
  return p;
}

Result one_rank(const Problem& whole, const ref::Inputs& in) {
  auto plan = runtime().plan(whole);
  tools::CaseRunner cr(whole, in);
  void* ws = cr.workspace(plan->workspace_bytes());
  cr.poison_outputs();
  plan->run(cr.tensors(), ws, cr.workspace_size(), cr.stream());
  tools::Outputs o = cr.read_outputs();
  return {o.dq, o.dkv, {}, o.d_sink};
}

// Ranks as threads, each with its own tensors (the whole inputs; its view covers its rows).
// Rank r of n: its plan, the whole problem's tensors (dkv in fp32) viewed as its share, and a workspace.
struct RankRun {
  std::shared_ptr<const Plan> plan;
  std::unique_ptr<tools::CaseRunner> cr;
  Tensors t;
  void* ws = nullptr;
  RankRun(const Problem& whole, const ref::Inputs& in, int r, int n) {
    const seqpar::TokenRange g = seqpar::split(whole.T, r, n);
    plan = runtime().plan(seqpar::rank_problem(whole, g));
    Problem holder = whole;
    holder.dkv_fp32 = true;  // CaseRunner then allocates an fp32 dkv
    cr = std::make_unique<tools::CaseRunner>(holder, in);
    t = seqpar::rank_view(whole, cr->tensors(), g);
    ws = cr->workspace(plan->workspace_bytes());
  }
};

Result seqpar_ranks(const Problem& whole, const ref::Inputs& in, int n) {
  auto group = std::make_shared<seqpar::HostGroup>(n);
  std::vector<tools::Outputs> outs(static_cast<size_t>(n));
  std::vector<std::string> errors;
  run_ranks(n, [&](int r) {
    try {
      RankRun k(whole, in, r, n);
      k.cr->poison_outputs();
      seqpar::HostReducer red(group, r);
      seqpar::backward(*k.plan, k.t, k.ws, k.cr->workspace_size(), k.cr->stream(), red);
      outs[size_t(r)] = k.cr->read_outputs();
    } catch (const std::exception& e) {
      group->abort(e.what());  // the other ranks must not wait for this one
      throw;
    }
  }, &errors);
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[size_t(r)], "") << "rank " << r;
  Result res;
  const size_t row = size_t(whole.H) * D;
  res.dq.assign(size_t(whole.T) * row, 0);
  for (int r = 0; r < n; ++r) {
    if (!errors[size_t(r)].empty()) return res;
    const seqpar::TokenRange g = seqpar::split(whole.T, r, n);
    const auto& dq = outs[size_t(r)].dq;
    std::copy(dq.begin() + g.t0 * row, dq.begin() + g.t1 * row, res.dq.begin() + g.t0 * row);
    // A rank writes only its rows: the rest must still hold the poison.
    size_t foreign_written = 0;
    for (size_t i = 0; i < dq.size(); ++i)
      if ((i < size_t(g.t0) * row || i >= size_t(g.t1) * row) && dq[i] != ref::kPoisonBf16) ++foreign_written;
    EXPECT_EQ(foreign_written, 0u) << "rank " << r << " wrote dq outside its tokens";
    EXPECT_TRUE(same_bits(outs[size_t(r)].dkv_f32, outs[0].dkv_f32)) << "rank " << r << " holds another dkv sum";
    EXPECT_TRUE(same_bits(outs[size_t(r)].d_sink, outs[0].d_sink)) << "rank " << r << " holds another d_sink sum";
  }
  res.dkv_f32 = outs[0].dkv_f32;
  res.d_sink = outs[0].d_sink;
  res.dkv.resize(res.dkv_f32.size());
  seqpar::round_to_bf16(res.dkv_f32.data(), res.dkv.data(), res.dkv.size());
  return res;
}

struct SeqparCase {
  int T, H, num_kv, topk;
  bool sink;
  ref::TopkKind kind;
  int ranks;
};

class SeqparCpu : public ::testing::TestWithParam<SeqparCase> {};

TEST_P(SeqparCpu, SplitEqualsOneRankAndReference) {
  const SeqparCase c = GetParam();
  const Problem whole = cpu_problem(c.T, c.H, c.num_kv, c.topk, c.sink);
  const ref::Inputs in = ref::make_inputs(c.T, c.H, c.num_kv, c.topk, c.sink, 7 + uint64_t(c.ranks), c.kind);
  const Result one = one_rank(whole, in);
  const Result split = seqpar_ranks(whole, in, c.ranks);
  const Result again = seqpar_ranks(whole, in, c.ranks);
  const ref::Grads g = ref::backward(in);
  const size_t nq = size_t(c.T) * c.H * D, nkv = size_t(c.num_kv) * D;

  expect_bar("dq vs one rank", ref::compare(widen(one.dq), split.dq.data(), nq));
  expect_bar("dkv vs one rank", ref::compare(widen(one.dkv), split.dkv.data(), nkv));
  expect_bar("dq vs float64", ref::compare(g.dq, split.dq.data(), nq));
  expect_bar("dkv vs float64", ref::compare(g.dkv, split.dkv.data(), nkv));
  if (c.sink) {
    expect_bar("d_sink vs one rank", ref::compare(widen(one.d_sink), split.d_sink.data(), size_t(c.H)));
    expect_bar("d_sink vs float64", ref::compare(g.d_sink, split.d_sink.data(), size_t(c.H)));
  }
  // A token's dq depends on its own row only, and r_chunk is fixed: same bits as one rank.
  EXPECT_TRUE(split.dq == one.dq) << "dq differs from the one-rank run";
  // Deterministic reduction: a second run gives the same bits.
  EXPECT_TRUE(split.dq == again.dq) << "dq differs between two runs";
  EXPECT_TRUE(same_bits(split.dkv_f32, again.dkv_f32)) << "reduced dkv differs between two runs";
  EXPECT_TRUE(same_bits(split.d_sink, again.d_sink)) << "reduced d_sink differs between two runs";
}

INSTANTIATE_TEST_SUITE_P(
    Ranks, SeqparCpu,
    ::testing::Values(SeqparCase{67, 16, 80, 64, true, ref::TopkKind::Uniform, 2},
                      SeqparCase{67, 16, 80, 64, true, ref::TopkKind::Uniform, 3},
                      SeqparCase{65, 16, 200, 160, true, ref::TopkKind::Benchmark, 3},
                      SeqparCase{48, 32, 64, 32, false, ref::TopkKind::Uniform, 2}),
    [](const ::testing::TestParamInfo<SeqparCase>& i) {
      const SeqparCase& c = i.param;
      return "T" + std::to_string(c.T) + "_H" + std::to_string(c.H) + "_kv" + std::to_string(c.num_kv) + "_k" +
             std::to_string(c.topk) + (c.sink ? "_sink" : "") +
             (c.kind == ref::TopkKind::Benchmark ? "_bench" : "_uniform") + "_ranks" + std::to_string(c.ranks);
    });

TEST(SeqparCpu, TokenChunksInsideTheRanks) {
  // The whole problem's t_chunk applies in every rank (23 tokens a rank: 10 + 10 + 3): dq keeps its bits, dkv and
  // d_sink meet the bar.
  Problem whole = cpu_problem(69, 16, 80, 64, true);
  whole.t_chunk = 10;
  const ref::Inputs in = ref::make_inputs(69, 16, 80, 64, true, 11, ref::TopkKind::Uniform);
  const Result one = one_rank(whole, in);
  const Result split = seqpar_ranks(whole, in, 3);
  const ref::Grads g = ref::backward(in);
  EXPECT_TRUE(split.dq == one.dq) << "dq differs from the one-rank run";
  expect_bar("dkv vs float64", ref::compare(g.dkv, split.dkv.data(), g.dkv.size()));
  expect_bar("d_sink vs float64", ref::compare(g.d_sink, split.d_sink.data(), g.d_sink.size()));
  expect_bar("dq vs float64", ref::compare(g.dq, split.dq.data(), g.dq.size()));
}

TEST(SeqparCpu, OneRankMatchesThePlainRunBitForBit) {
  // One rank: the fp32 dkv rounded once on the host must be exactly the kernel's own bf16 dkv.
  const Problem whole = cpu_problem(33, 16, 40, 32, true);
  const ref::Inputs in = ref::make_inputs(33, 16, 40, 32, true, 3, ref::TopkKind::Uniform);
  const Result one = one_rank(whole, in);
  const Result split = seqpar_ranks(whole, in, 1);
  EXPECT_TRUE(split.dq == one.dq);
  EXPECT_TRUE(split.dkv == one.dkv);
  EXPECT_TRUE(same_bits(split.d_sink, one.d_sink));
  // and against float64: equal bits alone would pass two unwritten outputs
  const ref::Grads g = ref::backward(in);
  expect_bar("dq vs float64", ref::compare(g.dq, split.dq.data(), g.dq.size()));
  expect_bar("dkv vs float64", ref::compare(g.dkv, split.dkv.data(), g.dkv.size()));
  expect_bar("d_sink vs float64", ref::compare(g.d_sink, split.d_sink.data(), g.d_sink.size()));
}

// A rank whose backward fails releases the others by itself: backward() aborts its reducer before rethrowing (the
// caller had to abort the group, or the other ranks waited for ever in their reduction). Also where the failure is
// backward()'s own refusal of its arguments, before any run (those once threw before the abort).
void expect_a_failed_rank_releases_the_other(const char* expected,
                                            const std::function<void(RankRun&, size_t& ws_size)>& spoil) {
  const Problem whole = cpu_problem(33, 16, 40, 32, true);
  const ref::Inputs in = ref::make_inputs(33, 16, 40, 32, true, 5, ref::TopkKind::Uniform);
  auto group = std::make_shared<seqpar::HostGroup>(2);
  std::mutex mu;  // errors are written by the ranks' threads and read here while they run
  std::vector<std::string> errors(2);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      std::string what;
      try {
        RankRun k(whole, in, r, 2);
        seqpar::HostReducer red(group, r);
        size_t ws_size = k.cr->workspace_size();
        if (r == 1) spoil(k, ws_size);
        seqpar::backward(*k.plan, k.t, k.ws, ws_size, k.cr->stream(), red);
        what = "no error";
      } catch (const std::exception& e) {
        what = e.what();  // no abort here: backward() must have done it
      }
      std::lock_guard<std::mutex> lk(mu);
      errors[size_t(r)] = what;
    });
  // A deadline instead of a hang: past it the group is aborted from here, and the test fails.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  bool released = false;
  while (!released && std::chrono::steady_clock::now() <= deadline) {
    {
      std::lock_guard<std::mutex> lk(mu);
      released = !errors[0].empty() && !errors[1].empty();
    }
    if (!released) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!released) group->abort("the test's deadline");
  for (auto& t : ts) t.join();
  EXPECT_TRUE(released) << "rank 0 still waited for the failed rank 1";
  EXPECT_NE(errors[1].find(expected), std::string::npos) << errors[1];
  EXPECT_NE(errors[0].find("rank 1 failed"), std::string::npos) << "rank 0: " << errors[0];
}

TEST(SeqparCpu, AFailedRankReleasesTheOthers) {
  // in its run: a workspace one byte short
  expect_a_failed_rank_releases_the_other("workspace",
                                          [](RankRun& k, size_t& ws_size) { ws_size = k.plan->workspace_bytes() - 1; });
}

TEST(SeqparCpu, ARankRefusedItsArgumentsReleasesTheOthers) {
  // backward()'s own checks: a strided fp32 dkv, and a plan that is not a rank problem's (bf16 dkv)
  expect_a_failed_rank_releases_the_other("dkv_stride", [](RankRun& k, size_t&) { k.t.dkv_stride = 1024; });
  expect_a_failed_rank_releases_the_other("dkv_fp32", [](RankRun& k, size_t&) {
    Problem bf16 = k.plan->problem();
    bf16.dkv_fp32 = false;
    k.plan = runtime().plan(bf16);
  });
}

TEST(SeqparCpu, RejectsAPlanWithBf16Dkv) {
  const Problem whole = cpu_problem(8, 16, 8, 32, false);
  auto plan = runtime().plan(whole);  // not a rank problem: dkv_fp32 is false
  auto group = std::make_shared<seqpar::HostGroup>(1);
  seqpar::HostReducer red(group, 0);
  try {
    seqpar::backward(*plan, Tensors{}, nullptr, 0, nullptr, red);
    FAIL() << "a bf16-dkv plan must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::InvalidArgument);
    EXPECT_NE(e.message().find("dkv_fp32"), std::string::npos) << e.message();
  }
}

// A reducer of device memory beside a CPU plan (and, on a GPU, a HostReducer beside a CUDA plan: the host then summed
// device pointers, a segfault, or managed memory before the kernels had written it) is refused before anything runs.
class DeviceMemoryReducer : public seqpar::Reducer {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  Memory memory() const override { return Memory::Device; }
  int device() const override { return device_; }
  void all_reduce_sum(float*, size_t, void*) override { ++calls; }
  void abort(const std::string&) override { ++aborts; }
  int calls = 0, aborts = 0, device_ = -1;
};

void expect_refused_reducer(const Plan& plan, seqpar::Reducer& red, const std::string& says) {
  try {
    seqpar::backward(plan, Tensors{}, nullptr, 0, nullptr, red);
    ADD_FAILURE() << "a reducer of the other memory was taken";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::InvalidArgument);
    EXPECT_NE(e.message().find(says), std::string::npos) << e.message();
  }
}

TEST(SeqparCpu, RefusesAReducerOfTheOtherMemory) {
  Problem whole = cpu_problem(8, 16, 8, 32, false);
  whole.dkv_fp32 = true;
  auto plan = runtime().plan(whole);
  DeviceMemoryReducer red;
  expect_refused_reducer(*plan, red, "the plan runs on the cpu backend, whose outputs are host memory");
  EXPECT_EQ(red.calls, 0);
}

// The same on a machine without a GPU: a plan that says it runs on CUDA (a stand-in: nothing of it may run).
class CudaPlanStandIn : public Plan {
 public:
  explicit CudaPlanStandIn(int device = 0) {
    p_.dkv_fp32 = true, p_.num_kv = 8, p_.H = 16, p_.device = device, info_.backend = "cuda";
  }
  const Problem& problem() const override { return p_; }
  size_t workspace_bytes() const override { return 0; }
  void run(const Tensors&, void*, size_t, void*) const override { ADD_FAILURE() << "run() reached"; }
  std::optional<BadIndex> index_report(const void*, void*) const override { return std::nullopt; }
  const PlanInfo& info() const override { return info_; }
  size_t launch_count() const override { return 0; }
  void run_launch(size_t, const Tensors&, void*, size_t, void*) const override { ADD_FAILURE() << "run_launch()"; }
  std::string launch_phase(size_t) const override { return ""; }

 private:
  Problem p_;
  PlanInfo info_;
};

// The stand-in whose run() does nothing: what backward() does around it.
class CudaPlanStandInQuiet : public CudaPlanStandIn {
 public:
  void run(const Tensors&, void*, size_t, void*) const override {}
};

TEST(SeqparCpu, RefusesAHostReducerBesideAGpuPlan) {
  const CudaPlanStandIn plan;
  auto group = std::make_shared<seqpar::HostGroup>(1);
  seqpar::HostReducer red(group, 0);
  expect_refused_reducer(plan, red, "the plan runs on the cuda backend, whose outputs are device memory");
}

// A reducer of another GPU than the plan's: its reduction would be queued on that GPU's streams, unordered with the
// plan's kernels. Refused, and the reducer aborted (the other ranks are released).
TEST(SeqparCpu, RefusesAReducerOfAnotherGpu) {
  const CudaPlanStandIn plan;  // device 0
  DeviceMemoryReducer red;
  red.device_ = 1;
  expect_refused_reducer(plan, red, "the reducer sums on device 1 but the plan runs on device 0");
  EXPECT_EQ(red.calls, 0);
  EXPECT_EQ(red.aborts, 1);
  // Device 0 is a device too: its reducer beside a plan on device 1 is refused the same way.
  red.aborts = 0;
  red.device_ = 0;
  expect_refused_reducer(CudaPlanStandIn(1), red, "the reducer sums on device 0 but the plan runs on device 1");
  EXPECT_EQ(red.calls, 0);
  EXPECT_EQ(red.aborts, 1);
  red.device_ = 0;  // a reducer of the plan's own GPU is taken
  red.aborts = 0;
  EXPECT_NO_THROW(seqpar::backward(CudaPlanStandInQuiet(), Tensors{}, nullptr, 0, nullptr, red));
  EXPECT_EQ(red.calls, 1);  // dkv (the stand-in's problem has no sink)
  EXPECT_EQ(red.aborts, 0);
}

TEST(SeqparCuda, RefusesAHostReducerBesideACudaPlan) {
  if (!test::cuda_usable()) GTEST_SKIP() << "no CUDA device: " << test::cuda_why();
  Problem whole = cpu_problem(8, 16, 8, 32, false);
  whole.dkv_fp32 = true, whole.backend = BackendKind::Cuda;
  auto plan = runtime().plan(whole);
  auto group = std::make_shared<seqpar::HostGroup>(1);
  seqpar::HostReducer red(group, 0);
  expect_refused_reducer(*plan, red, "whose outputs are device memory written asynchronously: use an NcclReducer");
}

// ---- NCCL

TEST(Nccl, MissingLibraryIsAClearError) {
  nccl::UniqueId id{};
  try {
    seqpar::NcclReducer red(id, 0, 1, 0, "/nonexistent/dir/libnccl.so.2");
    FAIL() << "a missing NCCL must throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::NoBackend);
    EXPECT_NE(e.message().find("libnccl.so.2"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("SMLA_LIBNCCL"), std::string::npos) << e.message();
  }
  auto missing = nccl::open_library("/nonexistent/dir/libnccl.so.2");
  std::string why;
  EXPECT_FALSE(nccl::available(*missing, &why));
  EXPECT_THROW(nccl::unique_id(*missing), Error);
}

TEST(Nccl, NoCudaDriverIsAClearError) {
  if (cuda::driver().ok) GTEST_SKIP() << "a CUDA driver is present: this checks the no-driver path";
  std::string why;
  if (!nccl::available(*nccl::library(), &why)) GTEST_SKIP() << "NCCL is not installed here: " << why;
  try {
    seqpar::NcclReducer red(nccl::UniqueId{}, 0, 1, 0);
    FAIL() << "NCCL without a CUDA driver must throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::NoBackend);
    EXPECT_NE(e.message().find("CUDA driver"), std::string::npos) << e.message();
  }
}

// NCCL's version codes on both sides of 2.9's change of layout.
TEST(Nccl, VersionCodesReadAsMajorMinorPatch) {
  EXPECT_EQ(nccl::version_text(2804), "2.8.4");
  EXPECT_EQ(nccl::version_text(20900), "2.9.0");
  EXPECT_EQ(nccl::version_text(22803), "2.28.3");
  EXPECT_EQ(nccl::version_text(0), "of an unknown version");
}

// A rank outside [0, nranks) is the caller's mistake, said before anything needs a GPU (the rank == nranks edge too).
TEST(Nccl, ARankOutsideTheGroupIsRefused) {
  std::string why;
  if (!nccl::available(*nccl::library(), &why)) GTEST_SKIP() << "NCCL is not installed here: " << why;
  for (const auto& [rank, nranks] : {std::pair{1, 1}, std::pair{2, 2}, std::pair{-1, 2}, std::pair{0, 0}}) {
    try {
      seqpar::NcclReducer red(nccl::UniqueId{}, rank, nranks, 0);
      ADD_FAILURE() << "rank " << rank << " of " << nranks << " was taken";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::InvalidArgument) << e.message();
      EXPECT_NE(e.message().find("NCCL rank " + std::to_string(rank) + " is not in [0, " + std::to_string(nranks) + ")"),
                std::string::npos)
          << e.message();
    }
  }
}

TEST(Nccl, MulticastIsForcedOff) {
  const char* before = std::getenv("NCCL_NVLS_ENABLE");
  const std::string saved = before ? before : "";
  setenv("NCCL_NVLS_ENABLE", "1", 1);
  nccl::disable_nvlink_multicast();
  ASSERT_NE(std::getenv("NCCL_NVLS_ENABLE"), nullptr);
  EXPECT_STREQ(std::getenv("NCCL_NVLS_ENABLE"), "0");
  unsetenv("NCCL_NVLS_ENABLE");
  nccl::disable_nvlink_multicast();
  ASSERT_NE(std::getenv("NCCL_NVLS_ENABLE"), nullptr);
  EXPECT_STREQ(std::getenv("NCCL_NVLS_ENABLE"), "0");
  if (before) setenv("NCCL_NVLS_ENABLE", saved.c_str(), 1);  // leave it off anyway if it was unset
}

// Destroying a communicator leaves the thread's current context as it found it (NCCL's group end set its device back,
// which on a thread with none made device 0's primary context current).
TEST(Nccl, DestroyingACommunicatorLeavesNoContextCurrent) {
  if (!test::cuda_usable()) GTEST_SKIP() << "no CUDA device: " << test::cuda_why();
  std::string why;
  if (!nccl::available(*nccl::library(), &why)) GTEST_SKIP() << "NCCL is not installed here: " << why;
  std::string problem;
  std::thread([&] {
    try {
      CUcontext cur = nullptr;
      cuda::driver().CtxSetCurrent(nullptr);
      { seqpar::NcclReducer red(nccl::unique_id(*nccl::library()), 0, 1, 0); }
      cuda::driver().CtxGetCurrent(&cur);
      if (cur) problem = "a context is current after the communicator went";
      { seqpar::NcclReducer red(nccl::unique_id(*nccl::library()), 0, 1, 0); red.abort("test"); }
      cuda::driver().CtxGetCurrent(&cur);
      if (cur) problem += "; a context is current after an aborted communicator went";
    } catch (const std::exception& e) {
      problem = e.what();
    }
  }).join();
  EXPECT_EQ(problem, "");
}

// The CUDA ranks' path end to end on one GPU: a one-rank seqpar backward over NCCL equals the plain run (dq bits; the
// fp32 dkv rounded once is the plain run's bf16 dkv; d_sink), and a failed run aborts the communicator.
TEST(SeqparCuda, OneRankOverNcclMatchesThePlainRun) {
  if (!test::cuda_usable()) GTEST_SKIP() << "no CUDA device: " << test::cuda_why();
  std::string why;
  if (!nccl::available(*nccl::library(), &why)) GTEST_SKIP() << "NCCL is not installed here: " << why;
  Problem whole = cpu_problem(65, 64, 200, 160, true);
  whole.backend = BackendKind::Cuda;
  const ref::Inputs in = ref::make_inputs(65, 64, 200, 160, true, 9, ref::TopkKind::Benchmark);
  const Result one = one_rank(whole, in);
  RankRun k(whole, in, 0, 1);
  k.cr->poison_outputs();
  seqpar::NcclReducer red(nccl::unique_id(*nccl::library()), 0, 1, 0);
  seqpar::backward(*k.plan, k.t, k.ws, k.cr->workspace_size(), k.cr->stream(), red);
  const tools::Outputs out = k.cr->read_outputs();
  EXPECT_TRUE(out.dq == one.dq) << "dq differs from the plain run";
  std::vector<uint16_t> dkv(out.dkv_f32.size());
  seqpar::round_to_bf16(out.dkv_f32.data(), dkv.data(), dkv.size());
  EXPECT_TRUE(dkv == one.dkv) << "dkv differs from the plain run";
  EXPECT_TRUE(same_bits(out.d_sink, one.d_sink)) << "d_sink differs from the plain run";
  const ref::Grads g = ref::backward(in);  // equal bits alone would pass two unwritten outputs
  expect_bar("dq vs float64", ref::compare(g.dq, out.dq.data(), g.dq.size()));
  expect_bar("dkv vs float64", ref::compare(g.dkv, dkv.data(), g.dkv.size()));
  expect_bar("d_sink vs float64", ref::compare(g.d_sink, out.d_sink.data(), g.d_sink.size()));
  // A failed run (a workspace one byte short) aborts the communicator: the next reduction says so.
  EXPECT_THROW(seqpar::backward(*k.plan, k.t, k.ws, k.plan->workspace_bytes() - 1, k.cr->stream(), red), Error);
  try {
    red.all_reduce_sum(static_cast<float*>(k.t.dkv), 1, k.cr->stream());
    ADD_FAILURE() << "the communicator was not aborted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("aborted"), std::string::npos) << e.what();
  }
}

TEST(Nccl, OneRankOnOneGpuIsTheIdentity) {
  if (!test::cuda_usable()) GTEST_SKIP() << "no CUDA device: " << test::cuda_why();
  std::string why;
  if (!nccl::available(*nccl::library(), &why)) GTEST_SKIP() << "NCCL is not installed here: " << why;
  seqpar::NcclReducer red(nccl::unique_id(*nccl::library()), 0, 1, 0);  // device 0, as DeviceBuffer takes
  std::vector<float> host(4099);
  for (size_t i = 0; i < host.size(); ++i) host[i] = std::cos(float(i)) * 3.0f;
  cuda::DeviceBuffer buf(host.size() * 4);
  buf.upload(host);
  cuda::Stream s;
  red.all_reduce_sum(static_cast<float*>(buf.get()), host.size(), s.get());
  s.sync();
  EXPECT_TRUE(same_bits(buf.download_vec<float>(host.size()), host));
}

}  // namespace
}  // namespace smla
