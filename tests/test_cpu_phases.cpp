// test_cpu_phases.cpp: the CPU phases driven directly in the planner's order, over host
// workspace regions allocated and poisoned here, against the independent float64 reference.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <string>

#include "kernel_src/smla_params.h"
#include "reference/reference.hpp"
#include "runtime/bf16.hpp"
#include "runtime/cpu/cpu_phases.hpp"
#include "tools/case_runner.hpp"

using namespace smla::ref;

// Allocations of the thread that calls a phase (call(), below), counted down while phase_alloc_budget >= 0: at 0 they
// fail with std::bad_alloc. Under ASan, whose operator new is the one that counts, this one is left out.
namespace {
long phase_alloc_budget = -1;
thread_local long alloc_budget = -1;
}  // namespace
#if !defined(__SANITIZE_ADDRESS__)
void* operator new(size_t n) {
  if (alloc_budget == 0) throw std::bad_alloc();
  if (alloc_budget > 0) --alloc_budget;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
#endif

namespace {

struct Options {
  int n_chunks = 1;
  int lse_mode = 0;
  bool check = false;
  bool dkv_f32 = false;
  bool padded = false;  // padded strides everywhere, transposed lse, poisoned padding
  int csr_final = 1;
};

struct Outputs {
  std::vector<uint16_t> dq, dkv;  // packed [T,H,D] / [num_kv,D]
  std::vector<float> dkv_f32, d_sink;
  int32_t report[4] = {0, 0, 0, 0};
  std::string problems;  // csr / workspace / padding findings, empty when all is well
};

// Independent check of one chunk's sort against the top-k as this test reads it.
std::string check_csr(const SmlaParams& p) {
  const int n = p.T * p.r_chunk;
  const int* keys = p.csr_keys[p.csr_final];
  const int* vals = p.csr_vals[p.csr_final];
  std::vector<char> seen(n, 0);
  for (int i = 0; i < n; ++i) {
    int v = vals[i];
    if (v < 0 || v >= n || seen[v]) return "csr values are not a permutation at " + std::to_string(i);
    seen[v] = 1;
    int t = v / p.r_chunk, r = p.r_start + v % p.r_chunk;
    int k = p.topk[t * p.topk_st + r];
    int want = (k >= 0 && k < p.num_kv) ? k : p.num_kv;
    if (keys[i] != want) return "csr key does not match its slot at " + std::to_string(i);
    if (i > 0 && (keys[i - 1] > keys[i] || (keys[i - 1] == keys[i] && vals[i - 1] > vals[i])))
      return "csr not sorted or not stable at " + std::to_string(i);
  }
  for (int j = 0; j <= p.num_kv; ++j) {
    int want = static_cast<int>(std::lower_bound(keys, keys + n, j) - keys);
    if (p.row_ptr[j] != want) return "row_ptr wrong at " + std::to_string(j);
  }
  return "";
}

template <class T>
size_t count_bits(const std::vector<T>& v, T pattern) {
  return static_cast<size_t>(std::count(v.begin(), v.end(), pattern));
}

// Copies a packed [rows, inner] bf16 tensor into a strided buffer whose padding is poisoned.
std::vector<uint16_t> spread(const std::vector<uint16_t>& src, int rows, long long stride, int inner) {
  std::vector<uint16_t> out(static_cast<size_t>(rows) * stride);
  poison_bf16(out.data(), out.size());
  for (int i = 0; i < rows; ++i) std::memcpy(&out[i * stride], &src[size_t(i) * inner], inner * 2);
  return out;
}

void call(const char* entry, const SmlaParams& p) {
  smla::cpu::PhaseFn fn = smla::cpu::cpu_phase_fn(entry);
  ASSERT_NE(fn, nullptr) << entry;
  struct Budget {  // reset however fn leaves
    explicit Budget(long b) { alloc_budget = b; }
    ~Budget() { alloc_budget = -1; }
  } budget(phase_alloc_budget);
  fn(p);
}

Outputs run_phases(const Inputs& in, const std::vector<float>& lse, const Options& o) {
  const int T = in.T, H = in.H, NK = in.num_kv, K = in.topk_n;
  const int RC = K / o.n_chunks;
  EXPECT_EQ(RC * o.n_chunks, K);
  // The padded layout views q/o/dout/dq as [T*H] rows of `hs` elements (D + 32), tokens 64 apart.
  const long long hs = o.padded ? D + 32 : D, ts = o.padded ? H * hs + 64 : H * hs;
  const long long kvs = o.padded ? D + 16 : D, dkvs = o.padded ? D + 8 : D;
  const long long topks = o.padded ? K + 3 : K;
  auto spread_thd = [&](const std::vector<uint16_t>& v) {
    std::vector<uint16_t> out(static_cast<size_t>(T) * ts);
    poison_bf16(out.data(), out.size());
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h) std::memcpy(&out[t * ts + h * hs], &v[(size_t(t) * H + h) * D], D * 2);
    return out;
  };
  std::vector<uint16_t> q = spread_thd(in.q), ov = spread_thd(in.o), dout = spread_thd(in.dout);
  std::vector<uint16_t> kv = spread(in.kv, NK, kvs, D);
  std::vector<int32_t> topk(static_cast<size_t>(T) * topks, 0);  // padding: a valid row, must not be read
  for (int t = 0; t < T; ++t) std::memcpy(&topk[t * topks], &in.topk[size_t(t) * K], K * 4);
  std::vector<float> lse_buf(static_cast<size_t>(T) * H);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) lse_buf[o.padded ? h * T + t : t * H + h] = lse[size_t(t) * H + h];

  std::vector<uint16_t> dq(static_cast<size_t>(T) * ts), dkv(static_cast<size_t>(NK) * dkvs);
  std::vector<float> dkv_f32(static_cast<size_t>(NK) * dkvs), d_sink(H);
  poison_bf16(dq.data(), dq.size());
  poison_bf16(dkv.data(), dkv.size());
  poison_f32(dkv_f32.data(), dkv_f32.size());
  poison_f32(d_sink.data(), d_sink.size());

  // The workspace regions of smla_params.h, each its own poisoned host buffer.
  const size_t th = size_t(T) * H, items = size_t(T) * RC;
  std::vector<float> delta(th), lse_n(th), dq_acc(o.n_chunks > 1 ? th * D : 0),
      dkv_acc(o.n_chunks > 1 ? size_t(NK) * D : 0);
  std::vector<uint16_t> ds(items * H), pm(items * H), interm(items * D);
  std::vector<int32_t> keys0(items), keys1(items), vals0(items), vals1(items), hist(256), row_ptr(NK + 1),
      report(4);
  for (auto* v : {&delta, &lse_n, &dq_acc, &dkv_acc}) poison_f32(v->data(), v->size());
  for (auto* v : {&ds, &pm, &interm}) poison_bf16(v->data(), v->size());
  for (auto* v : {&keys0, &keys1, &vals0, &vals1, &hist, &row_ptr, &report}) poison_i32(v->data(), v->size());

  SmlaParams p{};
  p.q = q.data();
  p.kv = kv.data();
  p.o = ov.data();
  p.dout = dout.data();
  p.lse = lse_buf.data();
  p.topk = topk.data();
  p.sink = in.has_sink ? in.sink.data() : nullptr;
  p.dq = dq.data();
  p.dkv = o.dkv_f32 ? nullptr : dkv.data();
  p.dkv_f32 = o.dkv_f32 ? dkv_f32.data() : nullptr;
  p.d_sink = in.has_sink ? d_sink.data() : nullptr;
  p.q_st = p.o_st = p.do_st = p.dq_st = ts;
  p.q_sh = p.o_sh = p.do_sh = p.dq_sh = hs;
  p.kv_s = kvs;
  p.dkv_s = dkvs;
  p.lse_st = o.padded ? 1 : H;
  p.lse_sh = o.padded ? T : 1;
  p.topk_st = topks;
  p.T = T, p.H = H, p.num_kv = NK, p.topk_n = K;
  p.r_chunk = RC, p.n_chunks = o.n_chunks;
  p.scale = in.scale;
  p.lse_mode = o.lse_mode;
  p.check_indices = o.check;
  p.delta = delta.data(), p.lse_n = lse_n.data();
  p.dq_acc = o.n_chunks > 1 ? dq_acc.data() : nullptr;
  p.dkv_acc = o.n_chunks > 1 ? dkv_acc.data() : nullptr;
  p.ds = ds.data(), p.pm = pm.data(), p.interm = interm.data();
  p.csr_keys[0] = keys0.data(), p.csr_keys[1] = keys1.data();
  p.csr_vals[0] = vals0.data(), p.csr_vals[1] = vals1.data();
  p.csr_hist = hist.data(), p.row_ptr = row_ptr.data(), p.index_report = report.data();
  p.radix_bits = 8;
  p.radix_passes = o.csr_final, p.csr_final = o.csr_final;

  Outputs out;
  if (o.check) call("smla_check_topk", p);
  call("smla_delta", p);
  for (int c = 0; c < o.n_chunks; ++c) {
    p.chunk = c, p.r_start = c * RC;
    call("smla_dq", p);
    call("smla_dkv_interm", p);
    call("smla_csr", p);
    call("smla_gather", p);
    out.problems += check_csr(p);
    if (c == 0 && count_bits(ds, kPoisonBf16) + count_bits(pm, kPoisonBf16) + count_bits(interm, kPoisonBf16))
      out.problems += "ds/pm/interm left unwritten; ";
  }
  if (in.has_sink) call("smla_d_sink", p);

  // Unpack, checking the padding between rows was never written.
  out.dq.resize(th * D);
  for (size_t i = 0; i < th; ++i) std::memcpy(&out.dq[i * D], &dq[(i / H) * ts + (i % H) * hs], D * 2);
  size_t dq_pad = count_bits(dq, kPoisonBf16) - count_bits(out.dq, kPoisonBf16);
  if (dq_pad != dq.size() - th * D) out.problems += "dq padding written; ";
  if (o.dkv_f32) {
    out.dkv_f32.resize(size_t(NK) * D);
    for (int j = 0; j < NK; ++j) std::memcpy(&out.dkv_f32[size_t(j) * D], &dkv_f32[j * dkvs], D * 4);
  } else {
    out.dkv.resize(size_t(NK) * D);
    for (int j = 0; j < NK; ++j) std::memcpy(&out.dkv[size_t(j) * D], &dkv[j * dkvs], D * 2);
    if (count_bits(dkv, kPoisonBf16) - count_bits(out.dkv, kPoisonBf16) != dkv.size() - out.dkv.size())
      out.problems += "dkv padding written; ";
  }
  if (in.has_sink) out.d_sink = d_sink;
  std::memcpy(out.report, report.data(), sizeof(out.report));
  return out;
}

// The outputs against the reference at the contract's bar, nothing unwritten.
void expect_bar(const Inputs& in, const Grads& g, const Outputs& out) {
  EXPECT_EQ(out.problems, "");
  Compare c = compare(g.dq, out.dq.data(), out.dq.size());
  EXPECT_TRUE(meets_bar(c)) << "dq rel " << c.rel_err << " cos " << c.cosine << " unwritten " << c.unwritten;
  if (out.dkv_f32.empty()) {
    c = compare(g.dkv, out.dkv.data(), out.dkv.size());
    // Rows nothing points at must be written as exact zeros.
    for (int j = 0; j < in.num_kv; ++j) {
      bool ref_zero = std::all_of(&g.dkv[size_t(j) * D], &g.dkv[size_t(j + 1) * D], [](double v) { return v == 0; });
      if (ref_zero) {
        for (int d = 0; d < D; ++d) ASSERT_EQ(out.dkv[size_t(j) * D + d], 0) << "dkv row " << j;
      }
    }
  } else {
    c = compare(g.dkv, out.dkv_f32.data(), out.dkv_f32.size());
  }
  EXPECT_TRUE(meets_bar(c)) << "dkv rel " << c.rel_err << " cos " << c.cosine << " unwritten " << c.unwritten;
  if (in.has_sink) {
    c = compare(g.d_sink, out.d_sink.data(), out.d_sink.size());
    EXPECT_TRUE(meets_bar(c)) << "d_sink rel " << c.rel_err << " cos " << c.cosine;
  }
}

bool same_bits(const Outputs& a, const Outputs& b) {
  return a.dq == b.dq && a.dkv == b.dkv && a.d_sink == b.d_sink && smla::tools::same_bits(a.dkv_f32, b.dkv_f32);
}

}  // namespace

TEST(CpuPhases, EntryNames) {
  using namespace smla::cpu;
  EXPECT_EQ(cpu_phase_fn("smla_check_topk"), &check_topk);
  EXPECT_EQ(cpu_phase_fn("smla_delta"), &delta);
  EXPECT_EQ(cpu_phase_fn("smla_dq"), &dq);
  EXPECT_EQ(cpu_phase_fn("smla_dkv_interm"), &dkv_interm);
  EXPECT_EQ(cpu_phase_fn("smla_csr"), &csr);
  EXPECT_EQ(cpu_phase_fn("smla_gather"), &gather);
  EXPECT_EQ(cpu_phase_fn("smla_d_sink"), &d_sink);
  EXPECT_EQ(cpu_phase_fn("smla_nope"), nullptr);
}

// H = 16, TOPK = 64 over ragged T, num_kv below and above T, with and without sink, chunked.
TEST(CpuPhases, SweepSmall) {
  for (int T : {1, 63, 257})
    for (bool pool : {false, true})
      for (bool sink : {false, true}) {
        const int nk = pool ? T + 40 : std::max(1, T / 2);
        // Without a pool the benchmark top-k would be a window only; uniform covers that case.
        Inputs in = make_inputs(T, 16, nk, 64, sink, 100 + T, pool ? TopkKind::Benchmark : TopkKind::Uniform);
        Grads g = backward(in);
        for (int chunks : {1, 2, 4}) {
          SCOPED_TRACE("T=" + std::to_string(T) + " num_kv=" + std::to_string(nk) + " sink=" +
                       std::to_string(sink) + " chunks=" + std::to_string(chunks));
          Options o;
          o.n_chunks = chunks;
          o.csr_final = chunks % 2;  // both ping-pong buffers get used as the result
          expect_bar(in, g, run_phases(in, in.lse, o));
        }
      }
}

// The DSv4-like shape: H = 64, window + pool top-k of 160, all lse conventions, chunked, and a
// second run bitwise identical.
TEST(CpuPhases, H64Topk160AllLseConventions) {
  Inputs in = make_inputs(257, 64, 257 + 128, 160, true, 7, TopkKind::Benchmark);
  Grads g = backward(in);
  Options o;
  o.n_chunks = 4;
  Outputs first = run_phases(in, in.lse, o);
  expect_bar(in, g, first);
  EXPECT_TRUE(same_bits(first, run_phases(in, in.lse, o))) << "second run differs";
  o.n_chunks = 2;
  for (int mode : {SMLA_LSE_BASE2, SMLA_LSE_EXCLUDES_SINK, SMLA_LSE_BASE2 | SMLA_LSE_EXCLUDES_SINK}) {
    SCOPED_TRACE("lse_mode=" + std::to_string(mode));
    o.lse_mode = mode;
    Outputs conv = run_phases(in, lse_in_mode(in, mode & SMLA_LSE_BASE2, mode & SMLA_LSE_EXCLUDES_SINK), o);
    expect_bar(in, g, conv);
    // Same answer as the natural lse, up to the float conversion of lse.
    std::vector<double> first_dq(first.dq.size());
    for (size_t i = 0; i < first_dq.size(); ++i) first_dq[i] = smla::bf16_to_float(first.dq[i]);
    EXPECT_LT(compare(first_dq, conv.dq.data(), conv.dq.size()).rel_err, 2e-3);
  }
}

// The other H / TOPK pairings at T = 63, and no sink with every lse convention: excluding a sink
// that is not there must change nothing, bit for bit.
TEST(CpuPhases, OtherPairingsAndNoSinkConventions) {
  for (auto [H, K] : {std::pair<int, int>{64, 64}, {16, 160}}) {
    Inputs in = make_inputs(63, H, 63 + 30, K, H == 16, 21, TopkKind::Benchmark);
    Grads g = backward(in);
    for (int chunks : {1, 2}) {
      Options o;
      o.n_chunks = chunks;
      expect_bar(in, g, run_phases(in, in.lse, o));
    }
  }
  Inputs in = make_inputs(63, 16, 200, 64, false, 22, TopkKind::Uniform);
  Grads g = backward(in);
  Options o;
  Outputs nat = run_phases(in, in.lse, o);
  expect_bar(in, g, nat);
  o.lse_mode = SMLA_LSE_EXCLUDES_SINK;
  EXPECT_TRUE(same_bits(nat, run_phases(in, in.lse, o)));
  o.lse_mode = SMLA_LSE_BASE2 | SMLA_LSE_EXCLUDES_SINK;
  expect_bar(in, g, run_phases(in, lse_in_mode(in, true, true), o));
}

// Padded strides, transposed lse, fp32 dkv output: same numbers as the packed layout.
TEST(CpuPhases, StridedLayoutsAndFp32Dkv) {
  Inputs in = make_inputs(63, 16, 100, 64, true, 31, TopkKind::Benchmark);
  Grads g = backward(in);
  Options o;
  o.n_chunks = 2;
  Outputs packed = run_phases(in, in.lse, o);
  o.padded = true;
  Outputs padded = run_phases(in, in.lse, o);
  expect_bar(in, g, padded);
  EXPECT_TRUE(same_bits(packed, padded));
  for (bool pad : {false, true}) {
    o.padded = pad;
    o.dkv_f32 = true;
    Outputs f = run_phases(in, in.lse, o);
    expect_bar(in, g, f);
    // bf16 output is the fp32 output rounded once.
    for (size_t i = 0; i < f.dkv_f32.size(); ++i)
      ASSERT_EQ(smla::float_to_bf16(f.dkv_f32[i]), packed.dkv[i]) << i;
  }
}

TEST(CpuPhases, CheckTopkReportsFirstBadIndex) {
  Inputs in = make_inputs(40, 16, 50, 32, false, 41, TopkKind::Uniform);
  Options o;
  o.check = true;
  Outputs clean = run_phases(in, in.lse, o);
  EXPECT_EQ(clean.report[0], 0);  // the uniform top-k has -1s: those are not bad
  EXPECT_EQ(clean.report[1], -1);
  EXPECT_EQ(clean.report[2], -1);
  EXPECT_EQ(clean.report[3], 0);
  in.topk[20 * 32 + 31] = 50;
  in.topk[9 * 32 + 0] = 53;
  in.topk[5 * 32 + 3] = -7;
  in.topk[5 * 32 + 9] = -2;
  forward(in);
  Grads g = backward(in);
  o.n_chunks = 2;
  Outputs bad = run_phases(in, in.lse, o);
  EXPECT_EQ(bad.report[0], 4);
  EXPECT_EQ(bad.report[1], 5);
  EXPECT_EQ(bad.report[2], 3);
  EXPECT_EQ(bad.report[3], -7);
  expect_bar(in, g, bad);  // out-of-range slots are empty slots
}

// A phase that cannot have the memory of its second (or later) thread's state runs that block on the calling thread
// or reports std::bad_alloc: it used to leave parallel_blocks with threads still joinable, and std::terminate ended the
// caller's process (only on machines of three cores or more; 8 threads are asked for here). In a child process, so
// that an abort is seen as one.
TEST(CpuPhases, NoMemoryForAThreadIsAnExceptionNotAnAbort) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "ASan's operator new is the one that counts under ASan (this binary's is left out)";
#else
  const Inputs in = make_inputs(64, 16, 200, 64, true, 91, TopkKind::Uniform);
  Options o;
  const Outputs want = run_phases(in, in.lse, o);
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    smla::cpu::threads_for_tests = 8;
    int caught = 0;
    for (long k = 0; k < 24; ++k) {  // every allocation of the calling thread in turn, thread starts included
      phase_alloc_budget = k;
      try {
        run_phases(in, in.lse, o);
      } catch (const std::bad_alloc&) {
        ++caught;
      }
    }
    phase_alloc_budget = -1;
    const Outputs eight = run_phases(in, in.lse, o);  // 8 threads, nothing failing: the same bits as the default
    ::_exit(caught == 0 ? 3 : eight.dq == want.dq && eight.dkv == want.dkv ? 0 : 4);
  }
  int st = 0;
  ASSERT_EQ(::waitpid(pid, &st, 0), pid);
  ASSERT_TRUE(WIFEXITED(st)) << "the child was killed by signal " << (WIFSIGNALED(st) ? WTERMSIG(st) : 0)
                             << " (std::terminate: a joinable thread destroyed)";
  EXPECT_EQ(WEXITSTATUS(st), 0) << "3: no allocation failed (the budget never bit), 4: 8 threads gave other bits";
#endif
}

TEST(CpuPhases, EmptyTokensAndRepeatedIndices) {
  for (bool sink : {false, true}) {
    Inputs in = make_inputs(63, 16, 90, 64, sink, 51, TopkKind::Uniform);
    inject_repeats(in, 200, 52);
    make_rows_empty(in, {0, 17, 62});
    Grads g = backward(in);
    Options o;
    o.n_chunks = 4;
    Outputs out = run_phases(in, in.lse, o);
    expect_bar(in, g, out);
    for (int t : {0, 17, 62})
      for (int i = 0; i < 16 * D; ++i) ASSERT_EQ(out.dq[size_t(t) * 16 * D + i] & 0x7fff, 0) << t;
  }
}

// A NaN sink under the sink-excluding lse: NaN in that head's dq and d_sink, as the GPU kernels give (the lse
// conversion used to drop the NaN and halve that head's probabilities: finite, wrong numbers), other heads untouched.
TEST(CpuPhases, NanSinkWithSinkExcludedLsePropagates) {
  Inputs in = make_inputs(40, 16, 90, 64, true, 61, TopkKind::Uniform);
  const int nan_head = 2;
  in.sink[nan_head] = std::numeric_limits<float>::quiet_NaN();
  Options o;
  o.lse_mode = SMLA_LSE_EXCLUDES_SINK;
  Outputs out = run_phases(in, lse_in_mode(in, false, true), o);
  // The outputs start as the poison, itself a NaN (a signalling one, which no arithmetic returns): a computed NaN is
  // told from an element never written by its bits.
  uint32_t sink_bits;
  std::memcpy(&sink_bits, &out.d_sink[nan_head], 4);
  for (int h = 0; h < 16; ++h) {
    size_t nonfinite = 0, unwritten = 0;
    for (int t = 0; t < 40; ++t)
      for (int d = 0; d < D; ++d) {
        const uint16_t v = out.dq[(size_t(t) * 16 + h) * D + d];
        nonfinite += !std::isfinite(smla::bf16_to_float(v));
        unwritten += v == kPoisonBf16;
      }
    EXPECT_EQ(unwritten, 0u) << "head " << h;
    if (h == nan_head) {
      EXPECT_EQ(nonfinite, size_t(40) * D) << "head " << h;
      EXPECT_TRUE(std::isnan(out.d_sink[h]));
      EXPECT_NE(sink_bits, kPoisonF32) << "d_sink of the NaN head was not written";
    } else {
      EXPECT_EQ(nonfinite, 0u) << "head " << h;
      EXPECT_TRUE(std::isfinite(out.d_sink[h])) << "head " << h;
    }
  }
  EXPECT_TRUE(std::isnan(lse_in_mode(in, false, false)[nan_head]));  // the reference's conversion agrees
}
