// consumer.cpp: smla.hpp and smla.h as an embedding C++ program sees them, linked to an installed libsmla.so
// (tests/consumer/CMakeLists.txt). Exit 0 when every check holds, 1 otherwise (each failure printed).
//   - the library's version is the header's;
//   - an smla::Error thrown inside libsmla.so is caught here by its type, with its status and message (its type
//     information must be exported for that);
//   - a plan on the CPU backend runs on random inputs and overwrites every poisoned output element with a finite
//     value, bitwise the same on a second run; with every slot empty, dq and dkv are exactly zero.
#include <smla/smla.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <smla/smla.hpp>
#include <string>
#include <vector>

namespace {
int failures = 0;
void expect(bool ok, const char* what, int line) {
  if (!ok) {
    std::fprintf(stderr, "consumer.cpp:%d: expected %s\n", line, what);
    ++failures;
  }
}
#define EXPECT(c) expect((c), #c, __LINE__)

uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}
float from_bf16(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct Outputs {
  std::vector<uint16_t> dq, dkv;
  std::vector<float> d_sink;
};

Outputs run_once(const smla::Plan& plan, const smla::Problem& p, const std::vector<int32_t>& topk, unsigned seed) {
  const size_t D = 512, T = p.T, H = p.H, N = p.num_kv;
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  auto bf = [&](size_t n, float s) {
    std::vector<uint16_t> v(n);
    for (auto& x : v) x = to_bf16(g(rng) * s);
    return v;
  };
  const auto q = bf(T * H * D, 1.f), kv = bf(N * D, 1.f), o = bf(T * H * D, 0.1f), dout = bf(T * H * D, 0.1f);
  std::vector<float> lse(T * H), sink(H);
  for (auto& x : lse) x = 6.f + g(rng);
  for (auto& x : sink) x = g(rng);
  Outputs out{std::vector<uint16_t>(T * H * D, 0x7FC0), std::vector<uint16_t>(N * D, 0x7FC0),
              std::vector<float>(H, std::nanf(""))};  // poisoned: NaN
  smla::Tensors t;
  t.q = q.data(), t.kv = kv.data(), t.o = o.data(), t.dout = dout.data(), t.lse = lse.data(), t.topk = topk.data();
  t.attn_sink = sink.data(), t.dq = out.dq.data(), t.dkv = out.dkv.data(), t.d_sink = out.d_sink.data();
  std::vector<unsigned char> ws(plan.workspace_bytes() + 256);
  void* w = ws.data() + (256 - reinterpret_cast<uintptr_t>(ws.data()) % 256) % 256;
  plan.run(t, w, plan.workspace_bytes(), nullptr);
  return out;
}

bool all_finite(const Outputs& o) {
  for (auto x : o.dq)
    if (!std::isfinite(from_bf16(x))) return false;
  for (auto x : o.dkv)
    if (!std::isfinite(from_bf16(x))) return false;
  for (auto x : o.d_sink)
    if (!std::isfinite(x)) return false;
  return true;
}
bool all_zero(const std::vector<uint16_t>& v) {
  for (auto x : v)
    if (from_bf16(x) != 0.f) return false;
  return true;
}
}  // namespace

int main() {
  EXPECT(smla_version() == SMLA_VERSION);

  smla::Runtime rt;
  smla::Problem bad;
  bad.T = 8, bad.H = 16, bad.num_kv = 32, bad.topk = 10, bad.backend = smla::BackendKind::Cpu;  // topk % 16 != 0
  bool caught = false;
  try {
    rt.plan(bad);
  } catch (const smla::Error& e) {
    caught = true;
    EXPECT(e.status() == smla::Status::Unsupported);
    EXPECT(e.message().find("topk") != std::string::npos);
  } catch (...) {
    std::fprintf(stderr, "consumer.cpp: plan() threw something other than smla::Error\n");
  }
  EXPECT(caught);

  smla::Problem p;
  p.T = 24, p.H = 16, p.num_kv = 100, p.topk = 32, p.has_sink = true, p.backend = smla::BackendKind::Cpu;
  auto plan = rt.plan(p);
  EXPECT(plan->info().backend == "cpu");
  std::vector<int32_t> topk(p.T * p.topk);
  std::mt19937 rng(7);
  for (auto& x : topk) x = static_cast<int32_t>(rng() % (p.num_kv + 8)) - 8;  // some empty (negative) slots
  const Outputs a = run_once(*plan, p, topk, 11), b = run_once(*plan, p, topk, 11);
  EXPECT(all_finite(a));
  EXPECT(a.dq == b.dq && a.dkv == b.dkv && std::memcmp(a.d_sink.data(), b.d_sink.data(), 4 * p.H) == 0);
  EXPECT(!all_zero(a.dq) && !all_zero(a.dkv));

  std::vector<int32_t> empty(p.T * p.topk, -1);
  const Outputs e = run_once(*plan, p, empty, 12);
  EXPECT(all_finite(e));
  EXPECT(all_zero(e.dq) && all_zero(e.dkv));

  if (failures == 0) std::printf("consumer: all checks passed\n");
  return failures ? 1 : 0;
}
