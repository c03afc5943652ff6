// test_reference.cpp: what makes the float64 reference trustworthy. Its backward must match
// central finite differences of its own forward's loss L = sum(o * dout); its top-k generator
// must have the contract's properties; empty and out-of-range slots must behave as the contract
// says.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <set>

#include "reference/reference.hpp"
#include "runtime/bf16.hpp"

using namespace smla::ref;

namespace {

struct Tiny {
  Dims dm;
  std::vector<double> q, kv, dout, sink;
  std::vector<int32_t> topk;
};

// A tiny problem with every kind of slot: valid, repeated, -1, and out of range both ways.
Tiny make_tiny(bool sink) {
  Tiny p;
  p.dm = {3, 2, 5, 4, sink, 1.0 / std::sqrt(512.0)};
  std::mt19937_64 rng(7);
  std::normal_distribution<double> nd(0.0, 0.5);
  // Larger q spreads the softmax so the gradient is not nearly uniform.
  for (int i = 0; i < 3 * 2 * D; ++i) p.q.push_back(4 * nd(rng));
  for (int i = 0; i < 5 * D; ++i) p.kv.push_back(nd(rng));
  for (int i = 0; i < 3 * 2 * D; ++i) p.dout.push_back(nd(rng));
  p.sink = {nd(rng), nd(rng)};
  p.topk = {0, 3, 3, -1,  // repeat + empty
            4, 1, 7, 2,   // 7 >= num_kv
            2, -3, 0, 4};  // -3 < -1
  return p;
}

double loss(const Tiny& p) {
  std::vector<double> o(3 * 2 * D), lse(6), excl(6);
  forward64(p.dm, p.q.data(), p.kv.data(), p.sink.data(), p.topk.data(), o.data(), lse.data(), excl.data());
  double l = 0;
  for (size_t i = 0; i < o.size(); ++i) l += o[i] * p.dout[i];
  return l;
}

// Relative L2 distance between the analytic gradient and central differences over every element.
double fd_error(Tiny& p, std::vector<double>& x, const std::vector<double>& grad) {
  const double eps = 1e-4;
  double diff2 = 0, ref2 = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    double keep = x[i];
    x[i] = keep + eps;
    double lp = loss(p);
    x[i] = keep - eps;
    double lm = loss(p);
    x[i] = keep;
    double fd = (lp - lm) / (2 * eps);
    diff2 += (fd - grad[i]) * (fd - grad[i]);
    ref2 += fd * fd;
  }
  EXPECT_GT(ref2, 0.0);
  return std::sqrt(diff2 / ref2);
}

}  // namespace

TEST(Reference, BackwardMatchesFiniteDifferences) {
  for (bool sink : {false, true}) {
    SCOPED_TRACE(sink ? "with sink" : "without sink");
    Tiny p = make_tiny(sink);
    std::vector<double> o(3 * 2 * D), lse(6), excl(6);
    forward64(p.dm, p.q.data(), p.kv.data(), p.sink.data(), p.topk.data(), o.data(), lse.data(), excl.data());
    Grads g = backward64(p.dm, p.q.data(), p.kv.data(), p.dout.data(), p.sink.data(), p.topk.data(),
                         lse.data(), nullptr);
    EXPECT_LT(fd_error(p, p.q, g.dq), 1e-6);
    EXPECT_LT(fd_error(p, p.kv, g.dkv), 1e-6);
    // Every kv row is named by some valid slot, so no part of this check is trivially zero.
    if (sink) {
      ASSERT_EQ(g.d_sink.size(), 2u);
      EXPECT_LT(fd_error(p, p.sink, g.d_sink), 1e-6);
    } else {
      EXPECT_TRUE(g.d_sink.empty());
    }
    // delta taken from o (the contract's route) is the same number when o is exact.
    Grads g2 = backward64(p.dm, p.q.data(), p.kv.data(), p.dout.data(), p.sink.data(), p.topk.data(),
                          lse.data(), o.data());
    for (size_t i = 0; i < g.dq.size(); ++i) ASSERT_NEAR(g.dq[i], g2.dq[i], 1e-12);
  }
}

TEST(Reference, BenchmarkTopkProperties) {
  const int T = 300, pool = 70, K = 160;  // 32 pool slots; up to 70 pool rows visible
  auto tk = benchmark_topk(T, T + pool, K, 11);
  ASSERT_EQ(tk.size(), size_t(T) * K);
  bool saw_late_pick = false;
  for (int t = 0; t < T; ++t) {
    const int32_t* row = &tk[size_t(t) * K];
    for (int r = 0; r < 128; ++r) ASSERT_EQ(row[r], t - r >= 0 ? t - r : -1) << t << "," << r;
    int visible = std::min(pool, (t + 1) / 4);
    int expect = std::min(K - 128, visible);
    std::set<int> seen;
    for (int r = 128; r < K; ++r) {
      if (r - 128 >= expect) {
        ASSERT_EQ(row[r], -1) << t << "," << r;
        continue;
      }
      int j = row[r] - T;
      ASSERT_GE(j, 0);
      ASSERT_LT(j, pool);
      ASSERT_LE(4 * (j + 1), t + 1) << "pool row not yet complete";
      ASSERT_TRUE(seen.insert(j).second) << "pool row repeated";
      if (j >= K - 128) saw_late_pick = true;
    }
  }
  EXPECT_TRUE(saw_late_pick) << "pool picks look like a prefix, not a random choice";
  EXPECT_NE(tk, benchmark_topk(T, T + pool, K, 12));
  EXPECT_EQ(tk, benchmark_topk(T, T + pool, K, 11));

  // No pool (num_kv <= T): every pool slot is -1. TOPK <= 128: window only.
  auto none = benchmark_topk(50, 40, 144, 1);
  for (int t = 0; t < 50; ++t)
    for (int r = 128; r < 144; ++r) ASSERT_EQ(none[size_t(t) * 144 + r], -1);
  auto small = benchmark_topk(20, 100, 16, 1);
  for (int t = 0; t < 20; ++t)
    for (int r = 0; r < 16; ++r) ASSERT_EQ(small[size_t(t) * 16 + r], t - r >= 0 ? t - r : -1);
}

TEST(Reference, EmptyRowsGiveZeroAndNoNaN) {
  for (bool sink : {false, true}) {
    Inputs in = make_inputs(6, 4, 20, 16, sink, 3, TopkKind::Uniform);
    make_rows_empty(in, {1, 4});
    Grads g = backward(in);
    for (double v : g.dq) ASSERT_TRUE(std::isfinite(v));
    for (double v : g.dkv) ASSERT_TRUE(std::isfinite(v));
    for (double v : g.d_sink) ASSERT_TRUE(std::isfinite(v));
    for (int t : {1, 4})
      for (int i = 0; i < 4 * D; ++i) ASSERT_EQ(g.dq[size_t(t) * 4 * D + i], 0.0);
    for (int t : {1, 4})
      for (int i = 0; i < 4 * D; ++i) ASSERT_EQ(in.o[size_t(t) * 4 * D + i], 0);
    double norm = 0;
    for (double v : g.dq) norm += v * v;
    EXPECT_GT(norm, 0.0) << "the other tokens must still have gradients";
    if (sink) {
      EXPECT_FLOAT_EQ(in.lse[1 * 4 + 2], in.sink[2]);  // only the sink term is left
      EXPECT_EQ(g.d_sink.size(), 4u);
    } else {
      EXPECT_TRUE(std::isinf(in.lse[1 * 4]) && in.lse[1 * 4] < 0);
    }
  }
}

TEST(Reference, OutOfRangeIndicesAreEmptySlots) {
  Inputs bad = make_inputs(9, 4, 30, 32, true, 5, TopkKind::Uniform);
  inject_out_of_range(bad, 20, 9);
  Inputs good = bad;
  int n_bad = 0;
  for (auto& k : good.topk)
    if (k < -1 || k >= good.num_kv) k = -1, ++n_bad;
  ASSERT_GT(n_bad, 10);
  forward(good);
  EXPECT_EQ(bad.lse, good.lse);
  EXPECT_EQ(bad.o, good.o);
  Grads gb = backward(bad), gg = backward(good);
  EXPECT_EQ(gb.dq, gg.dq);
  EXPECT_EQ(gb.dkv, gg.dkv);
  EXPECT_EQ(gb.d_sink, gg.d_sink);
}

TEST(Reference, CompareAndPoison) {
  std::vector<double> ref = {1, -2, 3, 0.5};
  std::vector<float> got = {1, -2, 3, 0.5f};
  Compare c = compare(ref, got.data(), got.size());
  EXPECT_TRUE(meets_bar(c));
  EXPECT_NEAR(c.rel_err, 0, 1e-12);
  got[1] = -2.2f;  // 0.2 / ||ref|| ~ 5e-2: over the bar
  EXPECT_FALSE(meets_bar(compare(ref, got.data(), got.size())));
  std::vector<uint16_t> b(4);
  poison_bf16(b.data(), 4);
  c = compare(ref, b.data(), 4);
  EXPECT_FALSE(c.finite);
  EXPECT_EQ(c.unwritten, 4u);
  poison_f32(got.data(), 2);
  c = compare(ref, got.data(), got.size());
  EXPECT_EQ(c.unwritten, 2u);
  EXPECT_FALSE(meets_bar(c));
  // Fewer elements than the reference (or more) fail, whatever they hold.
  const std::vector<float> exact = {1, -2, 3, 0.5f};
  EXPECT_FALSE(meets_bar(compare(ref, exact.data(), 3)));
  EXPECT_FALSE(compare(ref, exact.data(), 3).finite);
}

// The contract's bar at its edges: rel_err 1e-2 and cosine 0.9999 pass, just past either fails, as does a non-finite
// or unwritten element however close the rest.
TEST(Reference, TheBarAtItsEdges) {
  auto bar = [](double rel, double cos, bool finite = true, size_t unwritten = 0) {
    Compare c;
    c.rel_err = rel, c.cosine = cos, c.finite = finite, c.unwritten = unwritten;
    return meets_bar(c);
  };
  EXPECT_TRUE(bar(1e-2, 0.9999));
  EXPECT_FALSE(bar(1.01e-2, 1.0));
  EXPECT_FALSE(bar(1.5e-2, 1.0));
  EXPECT_FALSE(bar(0, 0.99989));
  EXPECT_FALSE(bar(0, 0.999));
  EXPECT_FALSE(bar(0, 1.0, false));
  EXPECT_FALSE(bar(0, 1.0, true, 1));
  // Through compare(): an error of 1.5e-2 relative (one element of four off) fails.
  const std::vector<double> ref = {1, 0, 0, 0};
  const std::vector<float> got = {1.015f, 0, 0, 0};
  const Compare c = compare(ref, got.data(), got.size());
  EXPECT_NEAR(c.rel_err, 1.5e-2, 1e-4);
  EXPECT_FALSE(meets_bar(c));
  // A reference that is all zero: anything nonzero, however small, fails (its cosine is 0).
  const std::vector<double> zero(4, 0.0);
  const std::vector<float> small = {0, 1e-3f, 0, 0};
  EXPECT_FALSE(meets_bar(compare(zero, small.data(), small.size())));
  const std::vector<float> none(4, 0.0f);
  EXPECT_TRUE(meets_bar(compare(zero, none.data(), none.size())));
}

TEST(Reference, LseConventionsRoundTrip) {
  Inputs in = make_inputs(17, 4, 40, 32, true, 2, TopkKind::Benchmark);
  auto nat = lse_in_mode(in, false, false);
  auto b2x = lse_in_mode(in, true, true);
  for (size_t i = 0; i < nat.size(); ++i) {
    ASSERT_NEAR(nat[i], in.lse[i], 1e-5 * (1 + std::fabs(in.lse[i])));
    double back = std::log(std::exp(b2x[i] * std::log(2.0)) + std::exp(double(in.sink[i % 4])));
    ASSERT_NEAR(back, in.lse[i], 1e-5 * (1 + std::fabs(in.lse[i])));
  }
}

// runtime/bf16.hpp is the one piece the reference shares with the CPU backend, and every comparison decodes outputs
// with it: its conversions against bit patterns worked out by hand, so that a bug there cannot cancel out.
namespace smla {
namespace {
uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float f32_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
}  // namespace

TEST(Bf16, ConversionsAgainstHandDerivedBits) {
  // Exact values: the top 16 bits.
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(-2.0f), 0xc000);
  EXPECT_EQ(float_to_bf16(0.0f), 0x0000);
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_bf16(f32_of(0x7f800000u)), 0x7f80);  // +inf
  EXPECT_EQ(float_to_bf16(f32_of(0xff800000u)), 0xff80);  // -inf
  // Round to nearest, ties to even: 1 + 2^-8 is halfway between 0x3f80 and 0x3f81, and 0x3f80 is even.
  EXPECT_EQ(float_to_bf16(f32_of(0x3f808000u)), 0x3f80);
  EXPECT_EQ(float_to_bf16(f32_of(0x3f818000u)), 0x3f82);  // halfway above the odd 0x3f81: up to even
  EXPECT_EQ(float_to_bf16(f32_of(0x3f808001u)), 0x3f81);  // just above halfway: up
  EXPECT_EQ(float_to_bf16(f32_of(0x3f807fffu)), 0x3f80);  // just below: down
  EXPECT_EQ(float_to_bf16(f32_of(0x7f7fffffu)), 0x7f80);  // the largest float rounds to inf
  EXPECT_EQ(float_to_bf16(f32_of(0x00000001u)), 0x0000);  // the smallest subnormal to +0
  // NaN stays NaN whatever its payload (rounding the bits would carry some NaNs into inf or the sign).
  for (uint32_t nan : {0x7fc00000u, 0x7f800001u, 0xff80ffffu, 0x7fffffffu}) {
    const uint16_t b = float_to_bf16(f32_of(nan));
    EXPECT_EQ(b & 0x7f80, 0x7f80) << std::hex << nan;
    EXPECT_NE(b & 0x007f, 0) << std::hex << nan;
  }
  // Decoding: the bits back in the top half, exact.
  EXPECT_EQ(f32_bits(bf16_to_float(0x3f80)), 0x3f800000u);
  EXPECT_EQ(f32_bits(bf16_to_float(0xc049)), 0xc0490000u);
  EXPECT_EQ(f32_bits(bf16_to_float(0x8000)), 0x80000000u);
  EXPECT_EQ(f32_bits(bf16_to_float(0x0001)), 0x00010000u);  // a subnormal
  for (uint32_t b = 0; b < 0x10000; ++b) {  // every finite bf16 survives the round trip
    if ((b & 0x7f80) == 0x7f80) continue;
    ASSERT_EQ(float_to_bf16(bf16_to_float(uint16_t(b))), b) << std::hex << b;
  }
}

}  // namespace smla
