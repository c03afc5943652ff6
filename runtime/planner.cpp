// planner.cpp: validation, chunking and phase order.
#include "planner.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "check.hpp"

namespace smla {

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::CheckTopk: return "check_topk";
    case Phase::Delta: return "delta";
    case Phase::Dq: return "dq";
    case Phase::DkvInterm: return "dkv_interm";
    case Phase::Csr: return "csr";
    case Phase::Gather: return "gather";
    case Phase::DSink: return "d_sink";
  }
  return "?";
}

namespace {
void bad(const std::string& field, const std::string& got, const std::string& expected,
         Status st = Status::InvalidArgument) {
  throw Error(st, "Problem::" + field + " = " + got + ": expected " + expected, __FILE__, __LINE__);
}
}  // namespace

void validate_problem(const Problem& p) {
  constexpr int64_t kMaxI32 = std::numeric_limits<int32_t>::max();
  if (p.head_dim != 512) bad("head_dim", std::to_string(p.head_dim), "512 (DSv4 sparse MLA)", Status::Unsupported);
  if (p.T < 1) bad("T", std::to_string(p.T), "at least 1");
  if (p.num_kv < 1) bad("num_kv", std::to_string(p.num_kv), "at least 1");
  if (p.num_kv >= kMaxI32) bad("num_kv", std::to_string(p.num_kv), "below 2^31 - 1 (int32 indices)");
  if (!(p.H == 16 || p.H == 32 || p.H == 64 || p.H == 128))
    bad("H", std::to_string(p.H), "one of 16, 32, 64, 128", Status::Unsupported);
  if (p.topk < 16 || p.topk % 16 != 0)
    bad("topk", std::to_string(p.topk), "a positive multiple of 16", Status::Unsupported);
  if (p.topk > 8192) bad("topk", std::to_string(p.topk), "at most 8192", Status::Unsupported);
  if (p.T * p.topk > kMaxI32) bad("T * topk", std::to_string(p.T * p.topk), "below 2^31 (int32 slot ids)");
  if (p.r_chunk != 0) {
    if (p.r_chunk < 16 || p.r_chunk % 16 != 0 || p.topk % p.r_chunk != 0)
      bad("r_chunk", std::to_string(p.r_chunk),
          "0 (planner's choice) or a multiple of 16 that divides topk = " + std::to_string(p.topk));
  }
  if (p.scale && !(std::isfinite(*p.scale) && *p.scale > 0))
    bad("scale", std::to_string(*p.scale), "a finite positive number");
  if (p.lse.includes_sink == false && !p.has_sink) {
    // Without a sink both conventions coincide: accepted.
  }
  if (p.device < 0) bad("device", std::to_string(p.device), "a device index >= 0");
}

int64_t default_r_chunk(int64_t T, int64_t topk, size_t interm_budget_bytes) {
  int64_t best = 16;
  for (int64_t rc = 16; rc <= topk; rc += 16) {
    if (topk % rc) continue;
    const double bytes = double(T) * double(rc) * 512.0 * 2.0;
    if (bytes <= double(interm_budget_bytes)) best = rc;
  }
  return best;
}

int csr_key_bits(int64_t num_kv) {
  int need = 1;
  while ((int64_t(1) << need) <= num_kv) ++need;  // keys go up to num_kv (the empty-slot key)
  return need;
}

int radix_passes_for(int64_t num_kv, int bits) { return (csr_key_bits(num_kv) + bits - 1) / bits; }

int radix_bits_for_passes(int64_t num_kv, int passes) {
  return std::max(kCsrMinRadixBits, (csr_key_bits(num_kv) + passes - 1) / passes);
}

ShapeInfo choose_shape(const Problem& p, size_t interm_budget_bytes) {
  ShapeInfo s;
  s.T = int(p.T);
  s.H = int(p.H);
  s.num_kv = int(p.num_kv);
  s.topk = int(p.topk);
  s.has_sink = p.has_sink;
  s.check_indices = p.check_indices;
  s.r_chunk = int(p.r_chunk ? p.r_chunk : default_r_chunk(p.T, p.topk, interm_budget_bytes));
  s.n_chunks = s.topk / s.r_chunk;
  // As few passes as 8-bit digits need, each with the fewest digits that still cover the keys (13 bits at the
  // seed's num_kv: 2 passes of 7 rather than 8 + 5; fewer digits, a smaller look-back), but never under 5 bits.
  s.radix_passes = radix_passes_for(p.num_kv, 8);
  s.radix_bits = radix_bits_for_passes(p.num_kv, s.radix_passes);
  return s;
}

std::vector<Step> order_steps(const ShapeInfo& s, const KernelsOf& kernels_of) {
  std::vector<Step> steps;
  auto add = [&](Phase ph, int chunk) {
    const size_t first = steps.size();
    for (auto& k : kernels_of(ph, s)) steps.push_back(Step{ph, chunk, std::move(k)});
    for (size_t i = first; i < steps.size(); ++i) steps[i].side = ph == Phase::Csr;
    if (ph == Phase::Gather && first < steps.size()) steps[first].join = true;
  };
  if (s.check_indices) add(Phase::CheckTopk, 0);
  for (int c = 0; c < s.n_chunks; ++c) {
    // csr of chunk c reads the top-k only; its regions are free once gather c - 1 (before it) is done.
    add(Phase::Csr, c);
    if (c == 0) add(Phase::Delta, 0);
    add(Phase::Dq, c);
    add(Phase::DkvInterm, c);
    add(Phase::Gather, c);
  }
  if (s.has_sink) add(Phase::DSink, 0);
  return steps;
}

}  // namespace smla
