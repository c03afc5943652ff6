// cpu_phases.cpp: the phases of docs/phases.md in plain C++ on host pointers.
//
// Work is split over tokens (or kv rows for gather) into contiguous blocks, one per thread; every
// output element is written by exactly one thread and its sums run in a fixed order, so results
// do not depend on the thread count and two runs are bitwise identical.
#include "cpu_phases.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "../bf16.hpp"
#include "../threads.hpp"

namespace smla::cpu {

int threads_for_tests = 0;
namespace {

constexpr int D = SMLA_D;

// The blocks are fixed by n and the thread count, so a block that could not get a thread of its own (on_threads)
// runs on the calling thread with the same bounds: same results, only slower. An exception in any block is rethrown
// here once every thread has been joined.
template <class Fn>
void parallel_blocks(int n, Fn fn) {
  int hw = static_cast<int>(std::thread::hardware_concurrency());
  int nt = std::max(1, std::min({threads_for_tests > 0 ? threads_for_tests : hw > 0 ? hw : 2, 16, n}));
  if (nt == 1) {
    fn(0, n);
    return;
  }
  std::vector<std::exception_ptr> err(nt);
  on_threads(nt, [&](int i) {
    try {
      fn(static_cast<int>(static_cast<long long>(n) * i / nt), static_cast<int>(static_cast<long long>(n) * (i + 1) / nt));
    } catch (...) {
      err[i] = std::current_exception();
    }
  });
  for (auto& e : err)
    if (e) std::rethrow_exception(e);
}

// Eight fixed lanes keep the sum fast and its order independent of anything but D.
float dot(const float* a, const float* b) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int d = 0; d < D; d += 8)
    for (int l = 0; l < 8; ++l) s[l] += a[d + l] * b[d + l];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

void load_row(const smla_bf16* src, float* dst) {
  for (int d = 0; d < D; ++d) dst[d] = bf16_to_float(src[d]);
}

// The kv row of slot r of token t, or -1 for an empty one (negative, >= num_kv, or past topk_n).
int slot_row(const SmlaParams& p, int t, int r) {
  if (r >= p.topk_n) return -1;
  int k = p.topk[static_cast<long long>(t) * p.topk_st + r];
  return (k >= 0 && k < p.num_kv) ? k : -1;
}

// NaN in, NaN out (std::max and std::min would drop a NaN second argument), as the GPU kernels do.
float logaddexp(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<float>::quiet_NaN();
  float m = std::max(a, b);
  if (std::isinf(m)) return m;  // both -inf stays -inf; +inf with +inf stays +inf, not NaN
  return m + std::log1p(std::exp(std::min(a, b) - m));
}

// The chunk carry shared by dq and gather: writes `part` (+ the carry) to the output on the last
// chunk, or into the fp32 accumulator before it.
template <class Out>
void carry(const SmlaParams& p, const float* part, float* acc, Out out) {
  if (p.n_chunks == 1) {
    for (int d = 0; d < D; ++d) out(d, part[d]);
  } else if (p.chunk == 0) {
    std::memcpy(acc, part, sizeof(float) * D);
  } else if (p.chunk < p.n_chunks - 1) {
    for (int d = 0; d < D; ++d) acc[d] += part[d];
  } else {
    for (int d = 0; d < D; ++d) out(d, acc[d] + part[d]);
  }
}

}  // namespace

void check_topk(const SmlaParams& p) {
  int count = 0, ft = -1, fr = -1, fv = 0;
  for (int t = 0; t < p.T; ++t)
    for (int r = 0; r < p.topk_n; ++r) {
      int k = p.topk[static_cast<long long>(t) * p.topk_st + r];
      if (k >= -1 && k < p.num_kv) continue;
      if (count++ == 0) ft = t, fr = r, fv = k;
    }
  p.index_report[0] = count;
  p.index_report[1] = ft;
  p.index_report[2] = fr;
  p.index_report[3] = fv;
}

void delta(const SmlaParams& p) {
  const float ln2 = 0.693147180559945309f;
  parallel_blocks(p.T, [&](int tb, int te) {
    std::vector<float> of(D), dof(D);
    for (int t = tb; t < te; ++t)
      for (int h = 0; h < p.H; ++h) {
        load_row(p.o + t * p.o_st + h * p.o_sh, of.data());
        load_row(p.dout + t * p.do_st + h * p.do_sh, dof.data());
        long long th = static_cast<long long>(t) * p.H + h;
        p.delta[th] = dot(of.data(), dof.data());
        float l = p.lse[t * p.lse_st + h * p.lse_sh];
        if (p.lse_mode & SMLA_LSE_BASE2) l *= ln2;
        if ((p.lse_mode & SMLA_LSE_EXCLUDES_SINK) && p.sink) l = logaddexp(l, p.sink[h]);
        p.lse_n[th] = l;
      }
  });
}

void dq(const SmlaParams& p) {
  const int RC = p.r_chunk;
  parallel_blocks(p.T, [&](int tb, int te) {
    std::vector<float> kvf(static_cast<size_t>(RC) * D), qf(D), dof(D), acc(D);
    std::vector<int> rows(RC);
    for (int t = tb; t < te; ++t) {
      for (int rr = 0; rr < RC; ++rr) {  // the chunk's kv rows once per token, as fp32
        rows[rr] = slot_row(p, t, p.r_start + rr);
        if (rows[rr] >= 0) load_row(p.kv + rows[rr] * p.kv_s, &kvf[static_cast<size_t>(rr) * D]);
      }
      for (int h = 0; h < p.H; ++h) {
        load_row(p.q + t * p.q_st + h * p.q_sh, qf.data());
        load_row(p.dout + t * p.do_st + h * p.do_sh, dof.data());
        const long long th = static_cast<long long>(t) * p.H + h;
        const float ln = p.lse_n[th], dl = p.delta[th];
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int rr = 0; rr < RC; ++rr) {
          const long long w = (static_cast<long long>(t) * RC + rr) * p.H + h;
          if (rows[rr] < 0) {
            p.pm[w] = p.ds[w] = 0;
            continue;
          }
          const float* kr = &kvf[static_cast<size_t>(rr) * D];
          float pv = std::exp(p.scale * dot(qf.data(), kr) - ln);
          float ds = pv * (dot(dof.data(), kr) - dl);
          p.pm[w] = float_to_bf16(pv);
          p.ds[w] = float_to_bf16(p.scale * ds);
          for (int d = 0; d < D; ++d) acc[d] += ds * kr[d];
        }
        for (int d = 0; d < D; ++d) acc[d] *= p.scale;
        smla_bf16* out = p.dq + t * p.dq_st + h * p.dq_sh;
        carry(p, acc.data(), p.dq_acc ? p.dq_acc + th * D : nullptr,
              [&](int d, float v) { out[d] = float_to_bf16(v); });
      }
    }
  });
}

void dkv_interm(const SmlaParams& p) {
  const int RC = p.r_chunk, H = p.H;
  parallel_blocks(p.T, [&](int tb, int te) {
    std::vector<float> qf(static_cast<size_t>(H) * D), dof(static_cast<size_t>(H) * D), acc(D);
    for (int t = tb; t < te; ++t) {
      bool loaded = false;
      for (int rr = 0; rr < RC; ++rr) {
        smla_bf16* out = p.interm + (static_cast<long long>(t) * RC + rr) * D;
        if (slot_row(p, t, p.r_start + rr) < 0) {
          std::fill(out, out + D, smla_bf16(0));
          continue;
        }
        if (!loaded) {  // this token's q and dout, once, only if some slot needs them
          for (int h = 0; h < H; ++h) {
            load_row(p.q + t * p.q_st + h * p.q_sh, &qf[static_cast<size_t>(h) * D]);
            load_row(p.dout + t * p.do_st + h * p.do_sh, &dof[static_cast<size_t>(h) * D]);
          }
          loaded = true;
        }
        std::fill(acc.begin(), acc.end(), 0.0f);
        const long long w = (static_cast<long long>(t) * RC + rr) * H;
        for (int h = 0; h < H; ++h) {
          const float a = bf16_to_float(p.ds[w + h]), b = bf16_to_float(p.pm[w + h]);
          const float* qh = &qf[static_cast<size_t>(h) * D];
          const float* dh = &dof[static_cast<size_t>(h) * D];
          for (int d = 0; d < D; ++d) acc[d] += a * qh[d] + b * dh[d];
        }
        for (int d = 0; d < D; ++d) out[d] = float_to_bf16(acc[d]);
      }
    }
  });
}

// A stable counting sort by kv row straight into the workspace's CSR arrays (empty slots, key num_kv, last): row_ptr
// holds the counts, then the starts, then (after the scatter advanced each) the ends, shifted back into the starts.
// It needs no memory of its own (a T x R_CHUNK array of pairs and std::stable_sort's buffer before).
void csr(const SmlaParams& p) {
  const int RC = p.r_chunk;
  int* keys = p.csr_keys[p.csr_final];
  int* vals = p.csr_vals[p.csr_final];
  int* row_ptr = p.row_ptr;  // num_kv + 1 entries: row_ptr[j] = first position with key >= j
  auto key = [&](int t, int rr) {
    const int k = slot_row(p, t, p.r_start + rr);
    return k >= 0 ? k : p.num_kv;
  };
  std::fill(row_ptr, row_ptr + p.num_kv + 1, 0);
  for (int t = 0; t < p.T; ++t)
    for (int rr = 0; rr < RC; ++rr) ++row_ptr[key(t, rr)];
  int run = 0;
  for (int j = 0; j <= p.num_kv; ++j) {
    const int c = row_ptr[j];
    row_ptr[j] = run;
    run += c;
  }
  for (int t = 0; t < p.T; ++t)
    for (int rr = 0; rr < RC; ++rr) {
      const int k = key(t, rr), pos = row_ptr[k]++;
      keys[pos] = k;
      vals[pos] = t * RC + rr;
    }
  for (int j = p.num_kv; j > 0; --j) row_ptr[j] = row_ptr[j - 1];  // row_ptr[j - 1] ended where key j starts
  row_ptr[0] = 0;
}

void gather(const SmlaParams& p) {
  const int* vals = p.csr_vals[p.csr_final];
  parallel_blocks(p.num_kv, [&](int jb, int je) {
    std::vector<float> part(D);
    for (int j = jb; j < je; ++j) {
      std::fill(part.begin(), part.end(), 0.0f);
      for (int i = p.row_ptr[j]; i < p.row_ptr[j + 1]; ++i) {
        const smla_bf16* row = p.interm + static_cast<long long>(vals[i]) * D;
        for (int d = 0; d < D; ++d) part[d] += bf16_to_float(row[d]);
      }
      float* acc = p.dkv_acc ? p.dkv_acc + static_cast<long long>(j) * D : nullptr;
      if (p.dkv_f32) {
        float* out = p.dkv_f32 + j * p.dkv_s;
        carry(p, part.data(), acc, [&](int d, float v) { out[d] = v; });
      } else {
        smla_bf16* out = p.dkv + j * p.dkv_s;
        carry(p, part.data(), acc, [&](int d, float v) { out[d] = float_to_bf16(v); });
      }
    }
  });
}

void d_sink(const SmlaParams& p) {
  if (!p.sink || !p.d_sink) return;
  for (int h = 0; h < p.H; ++h) {
    double acc = 0;  // wider than fp32: T terms of mixed sign
    // A sink of -inf (FlashMLA allows it) has probability 0 in every row: no term, not exp(-inf - -inf) = NaN in a
    // token with no valid slot (its lse is -inf too).
    if (p.sink[h] == -std::numeric_limits<float>::infinity()) {
      p.d_sink[h] = 0.f;
      continue;
    }
    // A sink of +inf takes every row whole (probability 1; lse_n is +inf too, and exp(inf - inf) would be NaN).
    const bool whole = p.sink[h] == std::numeric_limits<float>::infinity();
    for (int t = 0; t < p.T; ++t) {
      long long th = static_cast<long long>(t) * p.H + h;
      // At most 1, as the kernel (an fp32 lse can land below a huge sink; exp overflowed, times delta 0: NaN)
      double x = static_cast<double>(p.sink[h]) - p.lse_n[th];
      if (x > 0) x = 0;
      acc += (whole ? 1.0 : std::exp(x)) * p.delta[th];
    }
    p.d_sink[h] = static_cast<float>(0.0 - acc);  // +0 for no terms, as the kernel
  }
}

PhaseFn cpu_phase_fn(const std::string& entry_name) {
  static const std::pair<const char*, PhaseFn> table[] = {
      {"smla_check_topk", check_topk}, {"smla_delta", delta},   {"smla_dq", dq},
      {"smla_dkv_interm", dkv_interm}, {"smla_csr", csr},       {"smla_gather", gather},
      {"smla_d_sink", d_sink},
  };
  for (const auto& e : table)
    if (entry_name == e.first) return e.second;
  return nullptr;
}

}  // namespace smla::cpu
