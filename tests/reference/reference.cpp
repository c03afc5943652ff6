// reference.cpp: float64 forward/backward of sparse MLA from the contract's math, input
// generators and comparison. Threads split tokens; every thread owns its tokens' outputs and a
// private dkv buffer, summed in thread order afterwards.
#include "reference.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <thread>

#include "../../runtime/bf16.hpp"

namespace smla::ref {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Threads for `tokens` tokens of `per_token` slot-heads each; tiny problems (finite differences
// call forward thousands of times) run inline, where a thread costs more than the work.
int thread_count(int tokens, long long per_token) {
  if (static_cast<long long>(tokens) * per_token < 4096) return 1;
  int hw = static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, std::min({hw > 0 ? hw : 2, 16, tokens}));
}

// Runs fn(thread_index, begin, end) over [0, n) split into contiguous blocks, one per thread.
template <class Fn>
void parallel_blocks(size_t n, int nt, Fn fn) {
  if (nt == 1) {
    fn(0, size_t{0}, n);
    return;
  }
  std::vector<std::thread> th;
  for (int i = 0; i < nt; ++i) th.emplace_back([=, &fn] { fn(i, n * i / nt, n * (i + 1) / nt); });
  for (auto& t : th) t.join();
}

// Threads for element-wise work over n blocks of `grain` values each (conversions, generation): inline
// under a million values, else up to 16 and at most one a block.
int values_thread_count(size_t n, size_t grain) {
  if (n * grain < (size_t{1} << 20)) return 1;
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  return static_cast<int>(std::min<size_t>({static_cast<size_t>(hw > 0 ? hw : 2), 16, n}));
}

// splitmix64's finalizer: decorrelates the seeds of neighbouring chunks.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// n bf16 values ~ normal(0, 0.5): chunk c of kChunk values from its own generator seeded by (seed,
// stream, c), so the values depend on the seed only, not on how many threads made them.
std::vector<uint16_t> normal_bf16(size_t n, uint64_t seed, uint64_t stream) {
  constexpr size_t kChunk = size_t{1} << 16;
  std::vector<uint16_t> v(n);
  const size_t chunks = (n + kChunk - 1) / kChunk;
  parallel_blocks(chunks, values_thread_count(chunks, kChunk), [&](int, size_t cb, size_t ce) {
    for (size_t c = cb; c < ce; ++c) {
      std::mt19937_64 rng(mix64(seed ^ mix64(stream * 0x9e3779b97f4a7c15ull + c)));
      std::normal_distribution<double> nd(0.0, 0.5);
      for (size_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i)
        v[i] = smla::float_to_bf16(static_cast<float>(nd(rng)));
    }
  });
  return v;
}

// Four partial sums break the add latency chain; the order is fixed.
double dot(const double* a, const double* b) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (int d = 0; d < D; d += 4) {
    s0 += a[d] * b[d];
    s1 += a[d + 1] * b[d + 1];
    s2 += a[d + 2] * b[d + 2];
    s3 += a[d + 3] * b[d + 3];
  }
  return (s0 + s1) + (s2 + s3);
}

double logaddexp(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::nan("");  // std::max would drop a NaN second argument
  double m = std::max(a, b);
  if (std::isinf(m)) return m;  // both -inf stays -inf, +inf with +inf stays +inf (not NaN), as the backends
  return m + std::log1p(std::exp(std::min(a, b) - m));
}

bool valid(int32_t k, int num_kv) { return k >= 0 && k < num_kv; }

std::vector<double> to_f64(const std::vector<uint16_t>& v) {
  std::vector<double> out(v.size());
  parallel_blocks(v.size(), values_thread_count(v.size(), 1), [&](int, size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) out[i] = smla::bf16_to_float(v[i]);
  });
  return out;
}

Dims dims_of(const Inputs& in) {
  return {in.T, in.H, in.num_kv, in.topk_n, in.has_sink, static_cast<double>(in.scale)};
}

}  // namespace

void forward64(const Dims& dm, const double* q, const double* kv, const double* sink,
               const int32_t* topk, double* o, double* lse, double* lse_excl) {
  const int H = dm.H, K = dm.topk_n;
  parallel_blocks(dm.T, thread_count(dm.T, static_cast<long long>(H) * K), [&](int, int tb, int te) {
    std::vector<double> s(K);
    for (int t = tb; t < te; ++t) {
      const int32_t* row = topk + static_cast<size_t>(t) * K;
      for (int h = 0; h < H; ++h) {
        const double* qh = q + (static_cast<size_t>(t) * H + h) * D;
        double m = kNegInf;
        for (int r = 0; r < K; ++r) {
          s[r] = valid(row[r], dm.num_kv) ? dm.scale * dot(qh, kv + static_cast<size_t>(row[r]) * D) : kNegInf;
          m = std::max(m, s[r]);
        }
        double excl = kNegInf;
        if (m != kNegInf) {
          double sum = 0;
          for (int r = 0; r < K; ++r)
            if (s[r] != kNegInf) sum += std::exp(s[r] - m);
          excl = m + std::log(sum);
        }
        double incl = dm.has_sink ? logaddexp(excl, sink[h]) : excl;
        size_t th = static_cast<size_t>(t) * H + h;
        lse[th] = incl;
        lse_excl[th] = excl;
        double* oh = o + th * D;
        std::fill(oh, oh + D, 0.0);
        for (int r = 0; r < K; ++r) {
          if (s[r] == kNegInf) continue;
          double p = std::exp(s[r] - incl);
          const double* kr = kv + static_cast<size_t>(row[r]) * D;
          for (int d = 0; d < D; ++d) oh[d] += p * kr[d];
        }
      }
    }
  });
}

Grads backward64(const Dims& dm, const double* q, const double* kv, const double* dout,
                 const double* sink, const int32_t* topk, const double* lse,
                 const double* delta_from_o) {
  const int H = dm.H, K = dm.topk_n;
  const size_t kvn = static_cast<size_t>(dm.num_kv) * D;
  Grads g;
  g.dq.assign(static_cast<size_t>(dm.T) * H * D, 0.0);
  g.dkv.assign(kvn, 0.0);
  std::vector<double> delta(static_cast<size_t>(dm.T) * H, 0.0);
  const int nt = thread_count(dm.T, static_cast<long long>(H) * K);
  std::vector<std::vector<double>> dkv_part(nt);
  parallel_blocks(dm.T, nt, [&](int ti, int tb, int te) {
    std::vector<double>& dkv = dkv_part[ti];
    dkv.assign(kvn, 0.0);
    std::vector<double> p(K), dp(K);
    for (int t = tb; t < te; ++t) {
      const int32_t* row = topk + static_cast<size_t>(t) * K;
      for (int h = 0; h < H; ++h) {
        size_t th = static_cast<size_t>(t) * H + h;
        const double* qh = q + th * D;
        const double* doh = dout + th * D;
        double pdp = 0;
        for (int r = 0; r < K; ++r) {
          p[r] = dp[r] = 0;
          if (!valid(row[r], dm.num_kv)) continue;
          const double* kr = kv + static_cast<size_t>(row[r]) * D;
          p[r] = std::exp(dm.scale * dot(qh, kr) - lse[th]);
          dp[r] = dot(doh, kr);
          pdp += p[r] * dp[r];
        }
        double dl = delta_from_o ? dot(delta_from_o + th * D, doh) : pdp;
        delta[th] = dl;
        double* dqh = g.dq.data() + th * D;
        for (int r = 0; r < K; ++r) {
          if (!valid(row[r], dm.num_kv)) continue;
          double ds = p[r] * (dp[r] - dl);
          const double* kr = kv + static_cast<size_t>(row[r]) * D;
          double* dk = dkv.data() + static_cast<size_t>(row[r]) * D;
          double a = dm.scale * ds, b = p[r];
          for (int d = 0; d < D; ++d) {
            dqh[d] += a * kr[d];
            dk[d] += a * qh[d] + b * doh[d];
          }
        }
      }
    }
  });
  for (int i = 0; i < nt; ++i)
    for (size_t e = 0; e < kvn; ++e) g.dkv[e] += dkv_part[i][e];
  if (dm.has_sink) {
    g.d_sink.assign(H, 0.0);
    for (int h = 0; h < H; ++h) {
      double acc = 0;
      // The sink's probability exp(sink - lse) is 0 when the sink is -inf, also where lse is -inf (no valid slot),
      // and 1 when it is +inf (lse +inf too: the sink takes the whole row, o is 0).
      for (int t = 0; t < dm.T && sink[h] != kNegInf; ++t) {
        size_t th = static_cast<size_t>(t) * H + h;
        acc += (sink[h] == -kNegInf ? 1.0 : std::exp(sink[h] - lse[th])) * delta[th];
      }
      g.d_sink[h] = 0.0 - acc;
    }
  }
  return g;
}

void forward(Inputs& in) {
  const Dims dm = dims_of(in);
  std::vector<double> q = to_f64(in.q), kv = to_f64(in.kv);
  std::vector<double> sink(in.sink.begin(), in.sink.end());
  size_t th = static_cast<size_t>(in.T) * in.H;
  std::vector<double> o(th * D), lse(th);
  in.lse_excl.assign(th, 0.0);
  forward64(dm, q.data(), kv.data(), sink.data(), in.topk.data(), o.data(), lse.data(),
            in.lse_excl.data());
  in.o.resize(th * D);
  parallel_blocks(o.size(), values_thread_count(o.size(), 1), [&](int, size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) in.o[i] = smla::float_to_bf16(static_cast<float>(o[i]));
  });
  in.lse.resize(th);
  for (size_t i = 0; i < th; ++i) in.lse[i] = static_cast<float>(lse[i]);
}

Grads backward(const Inputs& in, bool exact_delta) {
  std::vector<double> q = to_f64(in.q), kv = to_f64(in.kv), dout = to_f64(in.dout);
  std::vector<double> sink(in.sink.begin(), in.sink.end());
  std::vector<double> lse(in.lse.begin(), in.lse.end());
  std::vector<double> o;
  if (!exact_delta) o = to_f64(in.o);
  return backward64(dims_of(in), q.data(), kv.data(), dout.data(), sink.data(), in.topk.data(),
                    lse.data(), exact_delta ? nullptr : o.data());
}

std::vector<float> lse_in_mode(const Inputs& in, bool base2, bool excludes_sink) {
  std::vector<float> out(in.lse_excl.size());
  for (size_t i = 0; i < out.size(); ++i) {
    double l = in.lse_excl[i];
    if (in.has_sink && !excludes_sink) l = logaddexp(l, in.sink[i % in.H]);
    if (base2) l /= std::log(2.0);
    out[i] = static_cast<float>(l);
  }
  return out;
}

std::vector<float> lse_flashmla(const Inputs& in) {
  std::vector<float> out = lse_in_mode(in, false, true);
  for (float& l : out)
    if (l == -std::numeric_limits<float>::infinity()) l = std::numeric_limits<float>::infinity();
  return out;
}

std::vector<int32_t> benchmark_topk(int T, int num_kv, int topk, uint64_t seed) {
  constexpr int kWindow = 128, kRatio = 4;
  std::mt19937_64 rng(seed);
  const int window = std::min(topk, kWindow);
  const int pool = std::max(0, num_kv - T);
  std::vector<int32_t> out(static_cast<size_t>(T) * topk, -1);
  std::vector<int32_t> cand;
  for (int t = 0; t < T; ++t) {
    int32_t* row = out.data() + static_cast<size_t>(t) * topk;
    for (int r = 0; r < window; ++r) row[r] = t - r >= 0 ? t - r : -1;
    const int slots = topk - window;
    const int visible = std::min(pool, (t + 1) / kRatio);  // j visible once 4(j+1) <= t+1
    cand.resize(visible);
    std::iota(cand.begin(), cand.end(), T);
    const int take = std::min(slots, visible);
    for (int i = 0; i < take; ++i) {  // partial Fisher-Yates: distinct, random order
      int pick = i + static_cast<int>(rng() % static_cast<uint64_t>(visible - i));
      std::swap(cand[i], cand[pick]);
      row[window + i] = cand[i];
    }
  }
  return out;
}

Inputs make_inputs(int T, int H, int num_kv, int topk, bool sink, uint64_t seed, TopkKind kind) {
  Inputs in;
  in.T = T;
  in.H = H;
  in.num_kv = num_kv;
  in.topk_n = topk;
  in.has_sink = sink;
  in.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  // q, kv, dout from independent chunked streams (normal_bf16: generated on every core, the
  // same values for a seed whatever the thread count); the sink and a uniform top-k from rng.
  const size_t thd = static_cast<size_t>(T) * H * D;
  in.q = normal_bf16(thd, seed, 1);
  in.kv = normal_bf16(static_cast<size_t>(num_kv) * D, seed, 2);
  in.dout = normal_bf16(thd, seed, 3);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, 0.5);
  if (sink) {
    in.sink.resize(H);
    for (auto& x : in.sink) x = static_cast<float>(nd(rng));
  }
  if (kind == TopkKind::Benchmark) {
    in.topk = benchmark_topk(T, num_kv, topk, seed ^ 0x9e3779b97f4a7c15ull);
  } else {
    in.topk.resize(static_cast<size_t>(T) * topk);
    for (auto& k : in.topk)
      k = rng() % 8 == 0 ? -1 : static_cast<int32_t>(rng() % static_cast<uint64_t>(num_kv));
  }
  forward(in);
  return in;
}

void make_rows_empty(Inputs& in, const std::vector<int>& rows) {
  for (int t : rows) std::fill_n(in.topk.begin() + static_cast<size_t>(t) * in.topk_n, in.topk_n, -1);
  forward(in);
}

void inject_repeats(Inputs& in, int count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (int i = 0; i < count; ++i) {
    size_t t = rng() % static_cast<uint64_t>(in.T);
    int32_t* row = in.topk.data() + t * in.topk_n;
    row[rng() % in.topk_n] = row[rng() % in.topk_n];
  }
  forward(in);
}

void inject_out_of_range(Inputs& in, int count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int32_t bad[4] = {-7, in.num_kv, in.num_kv + 3, -2};
  for (int i = 0; i < count; ++i) in.topk[rng() % in.topk.size()] = bad[i % 4];
  forward(in);
}

namespace {
template <class Get>
Compare compare_impl(const std::vector<double>& ref, size_t n, Get get) {
  Compare c;
  double diff2 = 0, ref2 = 0, got2 = 0, cross = 0;
  for (size_t i = 0; i < n; ++i) {
    bool poisoned = false;
    double g = get(i, &poisoned);
    if (poisoned) ++c.unwritten;
    if (!std::isfinite(g)) {
      c.finite = false;
      continue;
    }
    double r = i < ref.size() ? ref[i] : 0.0;
    diff2 += (g - r) * (g - r);
    ref2 += r * r;
    got2 += g * g;
    cross += g * r;
  }
  if (n != ref.size()) c.finite = false;  // a size mismatch must not pass
  c.rel_err = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(got2);
  if (ref2 == 0 && got2 == 0) c.cosine = 1;
  else if (ref2 == 0 || got2 == 0) c.cosine = 0;
  else c.cosine = cross / std::sqrt(ref2 * got2);
  return c;
}
}  // namespace

Compare compare(const std::vector<double>& ref, const float* got, size_t n) {
  return compare_impl(ref, n, [&](size_t i, bool* poisoned) {
    uint32_t u;
    std::memcpy(&u, got + i, 4);
    *poisoned = u == kPoisonF32;
    return static_cast<double>(got[i]);
  });
}

Compare compare(const std::vector<double>& ref, const uint16_t* got_bf16, size_t n) {
  return compare_impl(ref, n, [&](size_t i, bool* poisoned) {
    *poisoned = got_bf16[i] == kPoisonBf16;
    return static_cast<double>(smla::bf16_to_float(got_bf16[i]));
  });
}

bool meets_bar(const Compare& c) {
  return c.finite && c.unwritten == 0 && c.rel_err <= 1e-2 && c.cosine >= 0.9999;
}

void poison_bf16(uint16_t* p, size_t n) { std::fill(p, p + n, kPoisonBf16); }
void poison_f32(float* p, size_t n) {
  float f;
  std::memcpy(&f, &kPoisonF32, 4);
  std::fill(p, p + n, f);
}
void poison_i32(int32_t* p, size_t n) { std::fill(p, p + n, static_cast<int32_t>(kPoisonF32)); }

}  // namespace smla::ref
