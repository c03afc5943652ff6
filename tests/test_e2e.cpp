// test_e2e.cpp: the whole backward through the public API against the float64 reference, on the
// CPU backend (always) and the CUDA backend (skipped with a message where no GPU is usable).
// Fresh random inputs every run, outputs (and the workspace) poisoned before each run, every
// element checked written, two runs bitwise identical.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "tests/e2e_common.hpp"

namespace smla::test {
namespace {

// A copy of `c` with one of the options set after construction.
Case with(Case c, void (*set)(Case&)) {
  set(c);
  return c;
}

std::vector<Case> cpu_cases() {
  using K = ref::TopkKind;
  const Case small{40, 16, 90, 64, 0, true, K::Uniform}, chunked{65, 64, 300, 64, 16, true, K::Uniform, true, true};
  return {
      // the caller's options: a scale of its own, strided tensors (with top-k and token chunks), fp32 dkv, sinks of
      // -inf (with a token that has no valid slot), FlashMLA's lse (+inf for that token) and base 2 with them
      with(small, [](Case& c) { c.scale = 0.07f; }),
      with(chunked, [](Case& c) { c.strided = true; }),
      with(chunked, [](Case& c) { c.strided = true, c.t_chunk = 20, c.scale = 0.03f; }),
      // strided at H 16 and 32 too: on a GPU, the bodies without wgmma and the separate delta kernel (H 64 and 128
      // fuse delta into the wgmma dq body), which read o, dout and lse through their strides
      with(small, [](Case& c) { c.strided = true; }),
      with({40, 32, 90, 96, 48, false, K::Uniform, true, false, LseKind::Base2Excl}, [](Case& c) { c.strided = true; }),
      with(small, [](Case& c) { c.dkv_fp32 = true; }),
      with(chunked, [](Case& c) { c.dkv_fp32 = true, c.strided = true; }),
      with(small, [](Case& c) { c.neg_inf_sink = true; }),
      with(small, [](Case& c) { c.neg_inf_sink = true, c.lse = LseKind::Base2Excl; }),
      with(small, [](Case& c) { c.neg_inf_sink = true, c.lse = LseKind::FlashMla; }),  // +inf lse, empty token
      // a sink of +inf: with the sink in the lse (+inf), without it, and beside FlashMLA's +inf of an empty token
      with(small, [](Case& c) { c.pos_inf_sink = true; }),
      with(small, [](Case& c) { c.pos_inf_sink = true, c.lse = LseKind::Base2Excl; }),
      with(small, [](Case& c) { c.pos_inf_sink = c.neg_inf_sink = true, c.lse = LseKind::FlashMla; }),
      // a huge finite sink, in every lse convention (base 2 rounded to fp32 put the lse below it: d_sink NaN)
      with(small, [](Case& c) { c.huge_sink = true, c.lse = LseKind::Base2Incl; }),
      with(small, [](Case& c) { c.huge_sink = true, c.lse = LseKind::Base2Excl; }),
      with(small, [](Case& c) { c.huge_sink = true; }),
      with(small, [](Case& c) { c.huge_sink = true, c.lse = LseKind::FlashMla; }),
      // large logits (std 8 and 32: a softmax near one-hot, lse far from 0), unchunked and with top-k chunks
      with(small, [](Case& c) { c.logit_gain_log2 = 5; }),
      with({257, 16, 400, 160, 80, true, K::Benchmark}, [](Case& c) { c.logit_gain_log2 = 7; }),
      // one kv row (every slot the same row or empty) and the smallest top-k
      {7, 16, 1, 16, 0, true, K::Uniform},
      {5, 64, 1, 16, 0, true, K::Uniform},
      {1, 16, 64, 64, 0, true, K::Benchmark},
      {63, 16, 48, 64, 32, false, K::Uniform},          // num_kv < T, chunked
      {257, 16, 400, 160, 80, true, K::Benchmark},       // chunked, window + pool
      {65, 64, 300, 64, 16, true, K::Uniform, true, true},  // empty rows, repeats, 4 chunks
      {33, 128, 100, 64, 0, true, K::Uniform},
      {40, 32, 90, 96, 48, false, K::Uniform, true, false, LseKind::Base2Excl},
      {40, 16, 90, 64, 0, true, K::Uniform, false, true, LseKind::Base2Excl},
      {70, 16, 200, 160, 0, true, K::Benchmark, false, false, LseKind::Base2Incl},
      {50, 16, 120, 64, 32, true, K::Uniform, false, false, LseKind::Aiter, true},  // out-of-range indices
      // token chunks (the last shorter), alone and with top-k chunks, with empty rows, repeats, out-of-range
      // indices and FlashMLA's lse
      {63, 16, 48, 64, 0, true, K::Uniform, false, false, LseKind::Aiter, false, 20},
      {65, 64, 300, 64, 16, true, K::Uniform, true, true, LseKind::FlashMla, false, 16},
      {50, 16, 120, 64, 32, false, K::Uniform, false, false, LseKind::Aiter, true, 17},
  };
}

std::vector<Case> gpu_cases() {
  using K = ref::TopkKind;
  std::vector<Case> c = cpu_cases();
  const std::vector<Case> more = {
      {257, 128, 1300, 512, 0, true, K::Benchmark},
      {257, 128, 1300, 512, 128, true, K::Benchmark, true, true},
      {63, 64, 600, 640, 0, false, K::Benchmark},
      {63, 64, 600, 640, 160, true, K::Uniform, true, true, LseKind::Base2Excl},
      {257, 16, 1500, 1152, 0, true, K::Benchmark},
      {257, 128, 3000, 1152, 384, true, K::Benchmark},
      {1, 128, 5, 160, 0, true, K::Uniform, false, true},
      {4096, 64, 5120, 512, 0, true, K::Benchmark},
      {4096, 16, 4128, 160, 0, false, K::Benchmark},
      {257, 128, 1300, 512, 0, true, K::Benchmark, false, false, LseKind::Aiter, false, 100},
      {257, 128, 3000, 1152, 384, true, K::Benchmark, true, true, LseKind::FlashMla, false, 64},
      {1000, 64, 5120, 640, 0, true, K::Benchmark, false, false, LseKind::Aiter, true, 333},
      // H 128 at top-k 16: one partial dq tile and one partial dkv tile in each of the two head blocks
      {7, 128, 1, 16, 0, true, K::Uniform},
      {1, 128, 3, 16, 0, true, K::Uniform, true},
      // the wgmma bodies (H 64, 128) with the caller's options
      with({257, 128, 1300, 512, 0, true, K::Benchmark}, [](Case& c) { c.strided = true, c.scale = 0.05f; }),
      with({257, 128, 3000, 1152, 384, true, K::Benchmark}, [](Case& c) { c.strided = true, c.t_chunk = 64; }),
      with({300, 64, 2000, 640, 0, true, K::Benchmark}, [](Case& c) { c.dkv_fp32 = true, c.neg_inf_sink = true; }),
      with({257, 128, 1300, 512, 128, true, K::Uniform}, [](Case& c) { c.dkv_fp32 = true, c.strided = true; }),
      with({257, 128, 1300, 512, 0, true, K::Benchmark}, [](Case& c) { c.logit_gain_log2 = 6; }),
      with({300, 64, 2000, 640, 0, true, K::Benchmark}, [](Case& c) { c.logit_gain_log2 = 7; }),
  };
  c.insert(c.end(), more.begin(), more.end());
  return c;
}

TEST(E2E, CpuBackendMatchesReference) {
  for (const Case& c : cpu_cases()) {
    SCOPED_TRACE(describe(c));
    run_and_check(BackendKind::Cpu, c, 1000 + std::random_device{}() % 1000);
  }
}

TEST(E2E, CudaBackendMatchesReference) {
  if (!cuda_usable()) GTEST_SKIP() << "no usable CUDA device here (" << cuda_why() << "): GPU check not run";
  for (const Case& c : gpu_cases()) {
    SCOPED_TRACE(describe(c));
    run_and_check(BackendKind::Cuda, c, 2000 + std::random_device{}() % 1000);
  }
}

// One plan, one workspace, two different inputs in turn (as every training step): each run against its own float64
// reference. Chunked (top-k chunks and token chunks) and unchunked, window-and-pool top-k.
TEST(E2E, OneWorkspaceServesTwoInputsInTurnOnTheCpu) {
  using K = ref::TopkKind;
  for (const Case& c : {Case{257, 16, 400, 160, 80, true, K::Benchmark},
                        Case{65, 64, 300, 64, 16, true, K::Uniform, true, true, LseKind::Aiter, false, 16}}) {
    SCOPED_TRACE(describe(c));
    two_inputs_one_workspace(BackendKind::Cpu, c, 71, 72);
  }
}

TEST(E2E, OneWorkspaceServesTwoInputsInTurnOnCuda) {
  if (!cuda_usable()) GTEST_SKIP() << "no usable CUDA device here (" << cuda_why() << "): GPU check not run";
  using K = ref::TopkKind;
  for (const Case& c : {Case{257, 128, 1300, 512, 0, true, K::Benchmark},
                        Case{257, 128, 3000, 1152, 384, true, K::Benchmark, false, false, LseKind::Aiter, false, 64},
                        Case{300, 64, 2000, 640, 0, true, K::Benchmark}, Case{4096, 16, 4128, 160, 0, false, K::Benchmark},
                        Case{257, 16, 400, 160, 80, true, K::Benchmark}}) {
    SCOPED_TRACE(describe(c));
    two_inputs_one_workspace(BackendKind::Cuda, c, 73, 74);
  }
}

// A token with no valid slot whose o and dout are NaN (padding filled with garbage) contributes nothing: its dq is 0
// and the NaN reaches neither dkv nor another token, on every dq body (the wgmma bodies that run such a token's tiles
// made its dq NaN: 0 * NaN in dS). No sink: with one, d_sink rightly takes the NaN delta.
const Case kNanEmptyToken = [] {
  Case c{65, 64, 300, 128, 0, false, ref::TopkKind::Uniform};
  c.nan_empty_token = true;
  return c;
}();

TEST(E2E, AnEmptyTokensNanGradientStaysOutOnTheCpu) { run_and_check(BackendKind::Cpu, kNanEmptyToken, 41); }

TEST(E2E, AnEmptyTokensNanGradientStaysOutOnEveryCudaDqBody) {
  if (!cuda_usable()) GTEST_SKIP() << "no usable CUDA device here (" << cuda_why() << "): GPU check not run";
  const bool sm90a = shared_runtime().plan(make_problem(BackendKind::Cuda, kNanEmptyToken))->info().target == "sm_90a";
  for (int impl = 1; impl <= (sm90a ? TileConfig::kMaxDqImpl : 1); ++impl) {
    SCOPED_TRACE("dq_impl " + std::to_string(impl));
    TileConfig cfg;
    cfg.dq_impl = impl;
    run_and_check(BackendKind::Cuda, kNanEmptyToken, 42, &cfg);
  }
}

// dq_impl 4 is dq_impl 3 made persistent (at most one CTA an SM, each taking blocks blockIdx.x, + gridDim.x, ...):
// the same arithmetic in the same order, so the same bits, whether the T * H / 64 blocks of work are fewer than the
// SMs (T = 1: 2 blocks) or many more, in one chunk or several (the carry), with H 64 and 128. Checked against the
// float64 reference too.
TEST(E2E, PersistentDqKeepsTheProducerBodysBits) {
  if (!cuda_usable()) GTEST_SKIP() << "no usable CUDA device here (" << cuda_why() << "): GPU check not run";
  if (shared_runtime().plan(make_problem(BackendKind::Cuda, kNanEmptyToken))->info().target != "sm_90a")
    GTEST_SKIP() << "dq_impl 3 and 4 need sm_90a";
  for (const Case& c : {Case{1, 128, 300, 160, 0, true, ref::TopkKind::Benchmark},
                        Case{300, 64, 900, 160, 0, true, ref::TopkKind::Benchmark},
                        Case{257, 128, 1300, 512, 128, true, ref::TopkKind::Benchmark}}) {
    SCOPED_TRACE(describe(c));
    const ref::Inputs in = make_case_inputs(c, 91);
    const Problem p = make_problem(BackendKind::Cuda, c);
    auto run = [&](int impl) {
      TileConfig cfg;
      cfg.dq_impl = impl;
      return run_case(*shared_runtime().plan(p, cfg), p, c, in);
    };
    const tools::Outputs three = run(3), four = run(4);
    expect_same_bits(three, four);
    check_against_reference(c, in, four);  // every output: equal bits alone would pass two unwritten d_sinks
  }
}

// Bodies only an explicit config reaches, on the edges of their pipelines: dkv_impl 3 past its three A slots (8 and 10
// tiles: the producer's slot reuse and empty waits), dq_impl 2 (no producer) over several chunks and ragged 16-row
// chunks with out-of-range indices.
TEST(E2E, ExplicitBodiesOnTheEdgesOfTheirPipelines) {
  if (!cuda_usable()) GTEST_SKIP() << "no usable CUDA device here (" << cuda_why() << "): GPU check not run";
  if (shared_runtime().plan(make_problem(BackendKind::Cuda, kNanEmptyToken))->info().target != "sm_90a")
    GTEST_SKIP() << "dq_impl 2/3 and dkv_impl 3 need sm_90a";
  using K = ref::TopkKind;
  struct Run {
    Case c;
    int dq_impl, dkv_impl;
  };
  // dkv_impl 3's producer announces tiles 0-2 up front, then each tile one behind its copies, and the last at the end:
  // runs of 1-3 tiles, exactly 4 (its last announce is the only one after tile 3) and more. The benchmark top-k at
  // T 300 gives tokens 1 to 4 tiles (a token's slots end at 128 + (t + 1) / 4; T 257 stopped at 3, and a producer that
  // never announced a fourth tile, which hangs the block, passed every test: perf notes v45); top-k 256 uniform is 4
  // tiles a token.
  for (const Run& r : {Run{Case{63, 64, 600, 640, 0, false, K::Benchmark}, 3, 3},
                       Run{Case{300, 128, 1300, 512, 0, true, K::Benchmark}, 3, 3},
                       Run{Case{40, 128, 300, 256, 0, true, K::Uniform}, 3, 3},
                       Run{Case{257, 128, 1300, 512, 128, true, K::Benchmark}, 2, 0},
                       Run{Case{50, 64, 120, 80, 16, true, K::Uniform, false, false, LseKind::Aiter, true}, 2, 0}}) {
    SCOPED_TRACE(describe(r.c) + " dq_impl " + std::to_string(r.dq_impl) + " dkv_impl " + std::to_string(r.dkv_impl));
    TileConfig cfg;
    cfg.dq_impl = r.dq_impl, cfg.dkv_impl = r.dkv_impl;
    run_and_check(BackendKind::Cuda, r.c, 93, &cfg);
  }
}

// dkv_impl 4 (H 64): the dq body writes interm from the P and dS it holds, in dkv_interm's K order, and no dkv_interm
// kernel runs. dq and d_sink are the same product either way; dkv against the float64 reference, and against
// dkv_impl 3's bits (the same bf16 operands summed in the same order by the same MMA instruction family).
TEST(E2E, FusedDkvKeepsTheIntermKernelsBits) {
  if (!cuda_usable()) GTEST_SKIP() << "no usable CUDA device here (" << cuda_why() << "): GPU check not run";
  if (shared_runtime().plan(make_problem(BackendKind::Cuda, kNanEmptyToken))->info().target != "sm_90a")
    GTEST_SKIP() << "dkv_impl 4 needs sm_90a";
  for (const Case& c : {Case{300, 64, 900, 160, 0, true, ref::TopkKind::Benchmark},
                        Case{257, 64, 1300, 512, 128, true, ref::TopkKind::Benchmark},
                        Case{63, 64, 600, 640, 160, false, ref::TopkKind::Uniform, true, true}}) {
    SCOPED_TRACE(describe(c));
    const ref::Inputs in = make_case_inputs(c, 92);
    const Problem p = make_problem(BackendKind::Cuda, c);
    auto run = [&](int dkv_impl) {
      TileConfig cfg;
      cfg.dq_impl = 3, cfg.dkv_impl = dkv_impl;
      return run_case(*shared_runtime().plan(p, cfg), p, c, in);
    };
    const tools::Outputs unfused = run(3), fused = run(4);
    expect_same_bits(unfused, fused);
    check_against_reference(c, in, fused);  // every output: equal bits alone would pass two unwritten d_sinks
  }
}

// The tiles the planner gives an A100 (sm_80: 163 KB of shared memory), run here on the mma.sync bodies: no sm_8x GPU
// is at hand, this is how they are checked.
TEST(E2E, TheA100TilesOnThisGpu) {
  if (!cuda_usable()) GTEST_SKIP() << "no usable CUDA device here (" << cuda_why() << "): GPU check not run";
  TileConfig a100;
  a100.dq_impl = 1, a100.dkv_impl = 1, a100.dq_block_h = 32, a100.dkv_block_d = 128;
  Case strided{257, 128, 1300, 512, 0, true, ref::TopkKind::Benchmark};
  strided.strided = true;  // the separate delta kernel these bodies need reads o, dout and lse through their strides
  for (const Case& c : {Case{257, 128, 1300, 512, 0, true, ref::TopkKind::Benchmark},
                        Case{63, 64, 600, 640, 160, true, ref::TopkKind::Uniform, true, true}, strided}) {
    SCOPED_TRACE(describe(c));
    run_and_check(BackendKind::Cuda, c, 43, &a100);
  }
}

// Token chunks change only the order of dkv's fp32 sums over tokens: a token's dq (and so delta, lse_n and d_sink)
// is computed from its own rows the same way whatever chunk it is in, so dq and d_sink keep their bits.
void expect_token_chunks_keep_dq_bits(BackendKind b, const Case& unchunked, int t_chunk) {
  const ref::Inputs in = make_case_inputs(unchunked, 77);
  auto run = [&](int tc) {
    Case c = unchunked;
    c.t_chunk = tc;
    const Problem p = make_problem(b, c);
    auto plan = shared_runtime().plan(p);
    EXPECT_EQ(plan->info().t_chunks, tc ? (c.T + tc - 1) / tc : 1);
    return run_case(*plan, p, c, in);
  };
  const tools::Outputs one = run(0), split = run(t_chunk);
  EXPECT_TRUE(one.dq == split.dq) << "dq changed with token chunks";
  EXPECT_TRUE(same_bits(one.d_sink, split.d_sink)) << "d_sink changed with token chunks";
  const ref::Grads g = ref::backward(in);
  expect_bar("dkv without token chunks", ref::compare(g.dkv, one.dkv.data(), g.dkv.size()));
  expect_bar("dkv with token chunks", ref::compare(g.dkv, split.dkv.data(), g.dkv.size()));
  expect_bar("dq", ref::compare(g.dq, split.dq.data(), g.dq.size()));
  // (the bit comparison above would pass on two unwritten, poisoned d_sink: the value is checked too)
  if (unchunked.sink) expect_bar("d_sink", ref::compare(g.d_sink, split.d_sink.data(), size_t(unchunked.H)));
}

TEST(E2E, TokenChunksKeepDqBitsOnTheCpu) {
  expect_token_chunks_keep_dq_bits(BackendKind::Cpu, {70, 64, 300, 64, 0, true, ref::TopkKind::Benchmark}, 16);
}

TEST(E2E, TokenChunksKeepDqBitsOnCuda) {
  if (!cuda_usable()) GTEST_SKIP() << "no usable CUDA device here (" << cuda_why() << "): GPU check not run";
  expect_token_chunks_keep_dq_bits(BackendKind::Cuda, {1000, 128, 3000, 512, 0, true, ref::TopkKind::Benchmark}, 300);
  // One top-k chunk of 160 slots: the planner's persistent dq body (dq_impl 4) on sm_90a, its grid of CTAs over each
  // token chunk's blocks (the last chunk 100 tokens).
  expect_token_chunks_keep_dq_bits(BackendKind::Cuda, {1000, 128, 3000, 160, 0, true, ref::TopkKind::Benchmark}, 300);
}

}  // namespace
}  // namespace smla::test
