// e2e_common.hpp: shared pieces of the end-to-end tests: a case, running it through the public
// API on one backend, and checking it against the float64 reference.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>

#include "runtime/bf16.hpp"
#include "runtime/cuda/cuda_api.hpp"
#include "tests/cuda_required.hpp"
#include "tools/case_runner.hpp"

namespace smla::test {

// How the caller's lse is given: aiter (natural, sink included), FlashMLA's sparse forward (natural, sink
// excluded, +inf for a token with no valid slot), base 2 without the sink (TileLang's example forward), base 2 with.
enum class LseKind { Aiter, FlashMla, Base2Excl, Base2Incl };

struct Case {
  int T, H, num_kv, topk, r_chunk;
  bool sink;
  ref::TopkKind kind;
  bool empty_rows = false, repeats = false;
  LseKind lse = LseKind::Aiter;
  bool out_of_range = false;
  int t_chunk = 0;  // tokens a chunk (0: the planner's choice)
  // Set after construction (not positional):
  float scale = 0;               // Problem::scale (0: the default 1/sqrt(512))
  bool strided = false;          // tools::Layout::Strided: every stride set, gaps checked untouched
  bool dkv_fp32 = false;         // Problem::dkv_fp32
  bool neg_inf_sink = false;     // two heads' sink -inf (FlashMLA allows it), with an empty token
  bool pos_inf_sink = false;     // head 0's sink +inf (FlashMLA allows it): that head's o 0, its d_sink 0
  bool huge_sink = false;        // head 0's sink 1.475e20, finite: that head's o 0, its d_sink 0 (an fp32 lse, base 2
                                 // above all, lands below the sink once rounded)
  bool nan_empty_token = false;  // token T/3 without a valid slot, its o and dout NaN (padding with garbage)
  int logit_gain_log2 = 0;       // q times 2^k (exact in bf16), o and lse recomputed: logits of std 0.25 * 2^k, a
                                 // softmax near one-hot and lse far from 0 (the others' logits are all small)
};

inline std::string describe(const Case& c) {
  std::ostringstream s;
  s << "T=" << c.T << " H=" << c.H << " num_kv=" << c.num_kv << " topk=" << c.topk << " r_chunk=" << c.r_chunk
    << (c.sink ? " sink" : " no-sink") << (c.kind == ref::TopkKind::Benchmark ? " bench-topk" : " uniform-topk")
    << (c.empty_rows ? " empty-rows" : "") << (c.repeats ? " repeats" : "")
    << (c.lse == LseKind::FlashMla    ? " lse=flashmla"
        : c.lse == LseKind::Base2Excl ? " lse=base2-excl"
        : c.lse == LseKind::Base2Incl ? " lse=base2-incl"
                                      : "")
    << (c.out_of_range ? " out-of-range" : "") << (c.t_chunk ? " t_chunk=" + std::to_string(c.t_chunk) : "")
    << (c.scale ? " scale=" + std::to_string(c.scale) : "") << (c.strided ? " strided" : "")
    << (c.dkv_fp32 ? " dkv-fp32" : "") << (c.neg_inf_sink ? " -inf-sink" : "")
    << (c.pos_inf_sink ? " +inf-sink" : "") << (c.huge_sink ? " huge-sink" : "")
    << (c.nan_empty_token ? " nan-empty-token" : "")
    << (c.logit_gain_log2 ? " q*2^" + std::to_string(c.logit_gain_log2) : "");
  return s.str();
}


/// One process-wide runtime, as a framework would hold it.
inline Runtime& shared_runtime() {
  static Runtime rt;
  return rt;
}

inline ref::Inputs make_case_inputs(const Case& c, uint64_t seed) {
  ref::Inputs in = ref::make_inputs(c.T, c.H, c.num_kv, c.topk, c.sink, seed, c.kind);
  if (c.logit_gain_log2) {
    const float gain = std::ldexp(1.0f, c.logit_gain_log2);
    for (uint16_t& b : in.q) b = float_to_bf16(bf16_to_float(b) * gain);
    ref::forward(in);  // o and lse of the larger logits (the options below recompute them again as they need)
  }
  if (c.empty_rows) {
    std::vector<int> rows{0};
    if (c.T > 2) rows.push_back(c.T / 2);
    ref::make_rows_empty(in, rows);
  }
  if (c.repeats) ref::inject_repeats(in, std::max(4, c.T / 4), seed + 1);
  if (c.out_of_range) ref::inject_out_of_range(in, std::max(3, c.T / 8), seed + 2);
  if (c.nan_empty_token) {  // after make_rows_empty's recomputation of o and lse: the NaN stays
    const int t = c.T / 3;
    ref::make_rows_empty(in, {t});
    const size_t row = size_t(c.H) * 512;
    std::fill_n(in.o.begin() + t * row, row, uint16_t(0x7fc0));
    std::fill_n(in.dout.begin() + t * row, row, uint16_t(0x7fc0));
  }
  if (c.scale || c.neg_inf_sink || c.pos_inf_sink || c.huge_sink) {
    if (c.scale) in.scale = c.scale;
    if (c.pos_inf_sink && c.sink) in.sink[0] = std::numeric_limits<float>::infinity();
    if (c.huge_sink && c.sink) in.sink[0] = 1.47500171e20f;
    if (c.neg_inf_sink && c.sink) {
      in.sink[1] = in.sink[size_t(c.H) - 1] = -std::numeric_limits<float>::infinity();
      ref::make_rows_empty(in, {c.T - 1});  // the last token: no slot (o and lse recomputed, as below)
    } else {
      ref::forward(in);  // o and lse for the new scale
    }
  }
  return in;
}

inline Problem make_problem(BackendKind b, const Case& c) {
  Problem p;
  p.T = c.T, p.H = c.H, p.num_kv = c.num_kv, p.topk = c.topk, p.r_chunk = c.r_chunk, p.t_chunk = c.t_chunk;
  p.has_sink = c.sink;
  p.backend = b;
  if (c.scale) p.scale = c.scale;
  p.dkv_fp32 = c.dkv_fp32;
  if (c.lse == LseKind::FlashMla) p.lse = {false, false};
  if (c.lse == LseKind::Base2Excl) p.lse = {true, false};
  if (c.lse == LseKind::Base2Incl) p.lse = {true, true};
  return p;
}

inline std::vector<float> case_lse(const Case& c, const ref::Inputs& in) {
  if (c.lse == LseKind::FlashMla) return ref::lse_flashmla(in);
  if (c.lse == LseKind::Base2Excl) return ref::lse_in_mode(in, true, true);
  if (c.lse == LseKind::Base2Incl) return ref::lse_in_mode(in, true, false);
  return in.lse;
}

inline void expect_bar(const char* name, const ref::Compare& cmp) {
  EXPECT_TRUE(ref::meets_bar(cmp)) << name << ": rel_err " << cmp.rel_err << " cosine " << cmp.cosine
                                   << " finite " << cmp.finite << " unwritten " << cmp.unwritten;
}

using tools::same_bits;

inline void expect_same_bits(const tools::Outputs& a, const tools::Outputs& b) {
  EXPECT_TRUE(a.dq == b.dq) << "dq differs between two runs";
  EXPECT_TRUE(a.dkv == b.dkv) << "dkv differs between two runs";
  EXPECT_TRUE(same_bits(a.dkv_f32, b.dkv_f32)) << "dkv (fp32) differs between two runs";
  EXPECT_TRUE(same_bits(a.d_sink, b.d_sink)) << "d_sink differs between two runs";
}

/// One run of `plan` on `cr`'s tensors with its outputs poisoned first; the outputs read back.
inline tools::Outputs run_poisoned(const Plan& plan, tools::CaseRunner& cr, void* ws) {
  cr.poison_outputs();
  plan.run(cr.tensors(), ws, cr.workspace_size(), cr.stream());
  return cr.read_outputs();
}

/// One poisoned run of `plan` (planned for p, case c) on c's inputs, with c's lse, in a workspace of the plan's size.
inline tools::Outputs run_case(const Plan& plan, const Problem& p, const Case& c, const ref::Inputs& in) {
  const std::vector<float> lse = case_lse(c, in);
  tools::CaseRunner cr(p, in, &lse);
  return run_poisoned(plan, cr, cr.workspace(plan.workspace_bytes()));
}

/// Checks one run's outputs for case c on inputs `in` against the float64 reference: the contract's bar on each
/// tensor, and token by token (dq), row by row (dkv) and head by head (d_sink), where one wrong token, row or head of
/// thousands hides under a whole tensor's bar; exact zeros where the contract says 0; nothing written between rows.
inline void check_against_reference(const Case& c, const ref::Inputs& in, const tools::Outputs& first) {
  const ref::Grads g = ref::backward(in);
  const size_t nq = size_t(c.T) * c.H * 512, nkv = size_t(c.num_kv) * 512;
  expect_bar("dq", ref::compare(g.dq, first.dq.data(), nq));
  // Token by token too: one wrong token of 257 x 128 heads moves the whole tensor's relative error by ~5e-3 only. A
  // token with no valid slot has dq 0 exactly. (A token with one valid slot and no sink has dq 0 in float64 too, but
  // not exactly in fp32: its P is 1, and dP and delta are the same sum in two orders. No relative error for it.)
  // A token's error is judged against its own size or a tenth of a typical token's (the tokens' RMS), whichever is
  // larger: where a softmax is one-hot to within fp32 (large logits: token 0 between its one slot and the sink, 1 - P
  // near 1e-6), dS = P (dP - delta) is the remainder of a cancellation, the token's dq that much smaller than its
  // terms, and fp32's rounding of delta alone is ~1e-1 of it (c70 on CUDA: 8.5e-2 at token 0 of 257,16,400,160 with
  // q x 2^7, seed 2773, a token 3.4e-5 of a typical one's size in float64; no kernel changed). A wrong token of a
  // typical size still fails by far.
  const size_t row = size_t(c.H) * 512;
  double token_ss = 0;
  for (size_t i = 0; i < size_t(c.T) * row; ++i) token_ss += g.dq[i] * g.dq[i];
  const double typical = std::sqrt(token_ss / std::max(1, c.T));
  for (int t = 0; t < c.T; ++t) {
    const double* rr = &g.dq[size_t(t) * row];
    const uint16_t* out = &first.dq[size_t(t) * row];
    const int32_t* slots = &in.topk[size_t(t) * in.topk_n];
    if (std::none_of(slots, slots + in.topk_n, [&](int32_t k) { return k >= 0 && k < c.num_kv; })) {
      ASSERT_TRUE(std::all_of(out, out + row, [](uint16_t b) { return (b & 0x7fff) == 0; }))
          << "dq of token " << t << " (no valid slot) is not 0";
      continue;
    }
    if (std::all_of(rr, rr + row, [](double v) { return v == 0; })) continue;
    const ref::Compare tc = ref::compare(std::vector<double>(rr, rr + row), out, row);
    double own = 0;
    for (size_t i = 0; i < row; ++i) own += rr[i] * rr[i];
    own = std::sqrt(own);
    const double judged = tc.rel_err * own / std::max(own, 0.1 * typical);
    ASSERT_TRUE(tc.finite && tc.unwritten == 0 && judged <= 5e-2)
        << "dq of token " << t << ": rel_err " << tc.rel_err << " (" << judged << " against max(its size, a tenth "
        << "of a typical token's)) finite " << tc.finite << " unwritten " << tc.unwritten;
  }
  if (c.dkv_fp32) {
    ASSERT_EQ(first.dkv_f32.size(), nkv);
    expect_bar("dkv (fp32)", ref::compare(g.dkv, first.dkv_f32.data(), nkv));
  } else {
    expect_bar("dkv", ref::compare(g.dkv, first.dkv.data(), nkv));
  }
  // Row by row: one kv row wrong by half at num_kv 5120 moves the whole tensor's error by ~7e-3 only. The contract's
  // rows no slot points at are 0 (exactly, not merely small).
  for (int j = 0; j < c.num_kv; ++j) {
    const std::vector<double> rr(g.dkv.begin() + ptrdiff_t(j) * 512, g.dkv.begin() + ptrdiff_t(j + 1) * 512);
    if (std::all_of(rr.begin(), rr.end(), [](double v) { return v == 0; })) {
      for (size_t d = size_t(j) * 512; d < size_t(j + 1) * 512; ++d) {
        const bool zero = c.dkv_fp32 ? first.dkv_f32[d] == 0.f : (first.dkv[d] & 0x7fff) == 0;
        ASSERT_TRUE(zero) << "dkv row " << j << " (no slot points at it) is not 0 at column " << d % 512;
      }
      continue;
    }
    const ref::Compare rc = c.dkv_fp32 ? ref::compare(rr, first.dkv_f32.data() + size_t(j) * 512, 512)
                                       : ref::compare(rr, first.dkv.data() + size_t(j) * 512, 512);
    ASSERT_TRUE(rc.finite && rc.unwritten == 0 && rc.rel_err <= 5e-2)
        << "dkv row " << j << ": rel_err " << rc.rel_err << " finite " << rc.finite << " unwritten "
        << rc.unwritten;
  }
  if (c.sink) {
    expect_bar("d_sink", ref::compare(g.d_sink, first.d_sink.data(), size_t(c.H)));
    // A sink of -inf has no term at all: its d_sink is +0 exactly on every backend (0.0 - 0, never -0).
    for (int h = 0; h < c.H; ++h)
      if (in.sink[size_t(h)] == -std::numeric_limits<float>::infinity()) {
        uint32_t bits = 1;
        std::memcpy(&bits, &first.d_sink[size_t(h)], sizeof bits);
        EXPECT_EQ(bits, 0u) << "d_sink of head " << h << " (a sink of -inf) is not +0";
      }
    // Head by head, against the largest head's size (a head's own sum may cancel to near 0).
    double largest = 0;
    for (double v : g.d_sink) largest = std::max(largest, std::fabs(v));
    for (int h = 0; h < c.H; ++h)
      EXPECT_LE(std::fabs(double(first.d_sink[size_t(h)]) - g.d_sink[size_t(h)]), 1e-2 * largest)
          << "d_sink of head " << h << ": " << first.d_sink[size_t(h)] << " against " << g.d_sink[size_t(h)];
  }
  EXPECT_EQ(first.stray_writes, 0u) << "elements between the outputs' rows were written";
}

/// Plans (with `cfg` when given) and runs `c` twice on backend `b` (outputs poisoned before each run, the workspace
/// too before the second), checks the first against the float64 reference and both against each other bit for bit.
inline void run_and_check(BackendKind b, const Case& c, uint64_t seed, const TileConfig* cfg = nullptr) {
  SCOPED_TRACE("seed " + std::to_string(seed));  // the inputs of a failure, reproducible
  const ref::Inputs in = make_case_inputs(c, seed);
  const Problem p = make_problem(b, c);
  auto plan = cfg ? shared_runtime().plan(p, *cfg) : shared_runtime().plan(p);
  const std::vector<float> lse = case_lse(c, in);
  tools::CaseRunner cr(p, in, &lse, c.strided ? tools::Layout::Strided : tools::Layout::Packed);
  void* ws = cr.workspace(plan->workspace_bytes());
  const tools::Outputs first = run_poisoned(*plan, cr, ws);
  cr.poison_workspace();  // the second run may not rely on what the first left there
  const tools::Outputs second = run_poisoned(*plan, cr, ws);
  check_against_reference(c, in, first);
  expect_same_bits(first, second);
}

/// One plan and one workspace, two runs on different inputs (another seed: another top-k), each checked against its
/// own float64 reference: what a training loop does at every step. A run that kept state of the last one in the
/// workspace (a csr or row table reused) passed every test that ran the same inputs twice.
inline void two_inputs_one_workspace(BackendKind b, const Case& c, uint64_t seed_a, uint64_t seed_b) {
  const Problem p = make_problem(b, c);
  auto plan = shared_runtime().plan(p);
  const ref::Inputs a = make_case_inputs(c, seed_a), bb = make_case_inputs(c, seed_b);
  ASSERT_NE(a.topk, bb.topk) << "the two seeds gave one top-k";
  const std::vector<float> lse_a = case_lse(c, a), lse_b = case_lse(c, bb);
  tools::CaseRunner ra(p, a, &lse_a), rb(p, bb, &lse_b);
  void* ws = ra.workspace(plan->workspace_bytes());
  {
    SCOPED_TRACE("first inputs, seed " + std::to_string(seed_a));
    check_against_reference(c, a, run_poisoned(*plan, ra, ws));
  }
  SCOPED_TRACE("second inputs in the first's workspace, seed " + std::to_string(seed_b));
  rb.poison_outputs();
  plan->run(rb.tensors(), ws, ra.workspace_size(), rb.stream());  // (read_outputs waits for rb's stream)
  check_against_reference(c, bb, rb.read_outputs());
}

}  // namespace smla::test
