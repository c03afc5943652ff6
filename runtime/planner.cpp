// planner.cpp: validation, chunking and phase order.
#include "planner.hpp"

#include <cctype>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include <fmt/format.h>

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
// file and line: the check that failed, not this helper.
[[noreturn]] void bad(const std::string& field, const std::string& got, const std::string& expected,
                      Status st = Status::InvalidArgument, const char* file = __builtin_FILE(),
                      int line = __builtin_LINE()) {
  throw Error(st, "Problem::" + field + " = " + got + ": expected " + expected, file, line);
}
}  // namespace

void validate_problem(const Problem& p) {
  constexpr int64_t kMaxI32 = std::numeric_limits<int32_t>::max();
  // A size below 1 is not a shape at all (InvalidArgument); a positive one past what the kernels take (their int32
  // ids, their head counts and top-k lengths, D 512) is Unsupported (README).
  if (p.head_dim < 1) bad("head_dim", std::to_string(p.head_dim), "512 (DSv4 sparse MLA)");
  if (p.head_dim != 512) bad("head_dim", std::to_string(p.head_dim), "512 (DSv4 sparse MLA)", Status::Unsupported);
  if (p.T < 1) bad("T", std::to_string(p.T), "at least 1");
  if (p.T > kMaxI32) bad("T", std::to_string(p.T), "below 2^31 (int32 token ids)", Status::Unsupported);
  if (p.num_kv < 1) bad("num_kv", std::to_string(p.num_kv), "at least 1");
  if (p.num_kv >= kMaxI32)
    bad("num_kv", std::to_string(p.num_kv), "below 2^31 - 1 (int32 indices)", Status::Unsupported);
  if (p.H < 1) bad("H", std::to_string(p.H), "at least 1 (one of 16, 32, 64, 128)");
  else if (!(p.H == 16 || p.H == 32 || p.H == 64 || p.H == 128))
    bad("H", std::to_string(p.H), "one of 16, 32, 64, 128", Status::Unsupported);
  if (p.topk < 1) bad("topk", std::to_string(p.topk), "at least 1 (a positive multiple of 16)");
  // Before the multiple-of-16 advice: that names a padded length, which must itself be accepted (and p.topk + 15 must
  // not overflow).
  if (p.topk > 8192) bad("topk", std::to_string(p.topk), "at most 8192", Status::Unsupported);
  if (p.topk < 16 || p.topk % 16 != 0)
    bad("topk", std::to_string(p.topk),
        "a positive multiple of 16" +
            (p.topk > 0 ? " (pad each top-k row with -1 to " + std::to_string((p.topk + 15) / 16 * 16) +
                              " slots: empty slots add nothing, the result is the same)"
                        : std::string()),
        Status::Unsupported);
  if (p.T * p.topk > kMaxI32)
    bad("T * topk", std::to_string(p.T * p.topk), "below 2^31 (int32 slot ids)", Status::Unsupported);
  if (p.r_chunk != 0 && !r_chunk_ok(p.r_chunk, p.topk))
    bad("r_chunk", std::to_string(p.r_chunk), "0 (planner's choice) or " + r_chunk_expected(p.topk));
  if (p.t_chunk != 0 && (p.t_chunk < 1 || p.t_chunk > p.T))
    bad("t_chunk", std::to_string(p.t_chunk), "0 (planner's choice) or 1..T = " + std::to_string(p.T));
  if (p.scale && !(std::isfinite(*p.scale) && *p.scale > 0))
    bad("scale", fmt::format("{}", *p.scale), "a finite positive number");  // (%f wrote -1e-10 as -0.000000)
  if (p.lse.includes_sink == false && !p.has_sink) {
    // Without a sink both conventions coincide: accepted.
  }
  if (p.device < 0) bad("device", std::to_string(p.device), "a device index >= 0");
  // A C caller's smla_backend_t is any int: one outside the enum is a wrong option, not a missing backend.
  if (p.backend < BackendKind::Auto || p.backend > BackendKind::Hip)
    bad("backend", std::to_string(static_cast<int>(p.backend)), "0 (auto), 1 (cpu), 2 (cuda) or 3 (hip)");
}

bool r_chunk_ok(int64_t r_chunk, int64_t topk) { return r_chunk >= 16 && r_chunk % 16 == 0 && topk % r_chunk == 0; }

std::string r_chunk_expected(int64_t topk) { return "a multiple of 16 that divides topk = " + std::to_string(topk); }

void validate_config(const TileConfig& c) {
  auto bad_cfg = [](const char* field, int64_t got, const std::string& expected, const char* file = __builtin_FILE(),
                    int line = __builtin_LINE()) {
    throw Error(Status::InvalidArgument,
                std::string("TileConfig::") + field + " = " + std::to_string(got) + ": expected " + expected, file,
                line);
  };
  if (c.dq_impl < 0 || c.dq_impl > TileConfig::kMaxDqImpl)
    bad_cfg("dq_impl", c.dq_impl, "0 (the planner's choice) .. " + std::to_string(TileConfig::kMaxDqImpl));
  if (c.dkv_impl < 0 || c.dkv_impl > TileConfig::kMaxDkvImpl)
    bad_cfg("dkv_impl", c.dkv_impl, "0 (the planner's choice) .. " + std::to_string(TileConfig::kMaxDkvImpl));
  const std::pair<const char*, int64_t> sizes[] = {{"dq_block_h", c.dq_block_h},   {"dq_block_r", c.dq_block_r},
                                                   {"dkv_block_r", c.dkv_block_r}, {"dkv_block_d", c.dkv_block_d},
                                                   {"r_chunk", c.r_chunk}};
  for (const auto& f : sizes)
    if (f.second < 0) bad_cfg(f.first, f.second, "0 (the planner's choice) or a positive size");
}

void check_chunk_count(const ShapeInfo& s) {
  const int64_t pairs = int64_t(s.t_chunks) * s.n_chunks;
  if (pairs > kMaxChunkPairs)
    SMLA_THROW(Status::InvalidArgument,
               std::to_string(s.t_chunks) + " token chunks (t_chunk " + std::to_string(s.t_chunk) + ") x " +
                   std::to_string(s.n_chunks) + " top-k chunks (r_chunk " + std::to_string(s.r_chunk) + ") = " +
                   std::to_string(pairs) + " chunk pairs, ~4 launches each: expected at most " +
                   std::to_string(kMaxChunkPairs) +
                   " (a larger Problem::t_chunk or r_chunk, or SMLA_INTERM_BUDGET_BYTES if the planner chose t_chunk)");
}

int64_t default_t_chunk(int64_t T, int64_t r_chunk, size_t interm_budget_bytes) {
  const double per_token = double(r_chunk) * 512.0 * 2.0;
  const int64_t fit = std::max<int64_t>(1, int64_t(double(interm_budget_bytes) / per_token));
  if (fit >= T) return T;
  const int64_t chunks = (T + fit - 1) / fit;
  return (T + chunks - 1) / chunks;  // equal chunks (the last may be shorter by less than one a chunk)
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

std::optional<CudaTargetName> parse_cuda_target(const std::string& target) {
  if (target.rfind("sm_", 0) != 0) return std::nullopt;
  size_t end = 3;
  while (end < target.size() && std::isdigit(static_cast<unsigned char>(target[end]))) ++end;
  const size_t digits = end - 3;
  if (digits < 2 || digits > 3 || target[3] == '0') return std::nullopt;
  const std::string rest = target.substr(end);
  if (!rest.empty() && rest != "a" && rest != "f") return std::nullopt;
  return CudaTargetName{std::stoi(target.substr(3, digits)), rest.empty() ? '\0' : rest[0]};
}

unsigned cuda_smem_limit(const std::string& target) {
  const std::optional<CudaTargetName> name = parse_cuda_target(target);
  if (!name) return 0;
  constexpr unsigned kb = 1024;
  switch (name->cc) {
    case 80: case 87: return 163 * kb;
    case 86: case 89: case 120: case 121: return 99 * kb;
    case 90: case 100: case 101: case 103: case 110: return 227 * kb;
    default: return 0;
  }
}

ShapeInfo choose_shape(const Problem& p, size_t interm_budget_bytes) {
  ShapeInfo s;
  s.T = int(p.T);
  s.H = int(p.H);
  s.num_kv = int(p.num_kv);
  s.topk = int(p.topk);
  s.has_sink = p.has_sink;
  s.check_indices = p.check_indices;
  // Over the interm budget the planner splits the tokens, never the top-k: a further top-k chunk re-reads Q and dO
  // and carries dQ in fp32 through memory (dq 2.9 -> 3.8 ms at 4096,128,5120,1152 in two, perf notes v20), a
  // further token chunk carries only dkv (num_kv x 512 fp32).
  s.r_chunk = int(p.r_chunk ? p.r_chunk : p.topk);
  s.n_chunks = s.topk / s.r_chunk;
  s.t_chunk = int(p.t_chunk ? p.t_chunk : default_t_chunk(p.T, s.r_chunk, interm_budget_bytes));
  s.t_chunks = int((p.T + s.t_chunk - 1) / s.t_chunk);
  // As few passes as 8-bit digits need, each with the fewest digits that still cover the keys (13 bits at the
  // seed's num_kv: 2 passes of 7 rather than 8 + 5; fewer digits, a smaller look-back), but never under 5 bits.
  s.radix_passes = radix_passes_for(p.num_kv, 8);
  s.radix_bits = radix_bits_for_passes(p.num_kv, s.radix_passes);
  return s;
}

ShapeInfo token_chunk_shape(const ShapeInfo& s, int tc) {
  ShapeInfo c = s;
  c.T = std::min(s.t_chunk, s.T - tc * s.t_chunk);
  c.t_chunk = c.T;
  c.t_chunks = 1;
  return c;
}

std::vector<Step> order_steps(const ShapeInfo& s, const KernelsOf& kernels_of) {
  std::vector<Step> steps;
  // A step of token chunk `tc` (-1: every token, as check_topk, delta and d_sink run) and top-k chunk `chunk`.
  auto add = [&](Phase ph, int tc, int chunk) {
    const size_t first = steps.size();
    const ShapeInfo cs = tc < 0 ? s : token_chunk_shape(s, tc);
    for (auto& k : kernels_of(ph, cs)) {
      Step st{ph, chunk, std::move(k)};
      if (tc >= 0) st.t_index = tc, st.t_start = tc * s.t_chunk, st.t_count = cs.T;
      st.acc_index = chunk, st.acc_count = s.n_chunks;
      if (ph == Phase::Gather) st.acc_index = st.t_index * s.n_chunks + chunk, st.acc_count = s.all_chunks();
      steps.push_back(std::move(st));
    }
    for (size_t i = first; i < steps.size(); ++i) steps[i].side = ph == Phase::Csr;
    if (ph == Phase::Gather && first < steps.size()) steps[first].join = true;
  };
  if (s.check_indices) add(Phase::CheckTopk, -1, 0);
  for (int tc = 0; tc < s.t_chunks; ++tc)
    for (int c = 0; c < s.n_chunks; ++c) {
      // csr of a chunk reads the top-k only; its regions are free once the gather before it is done.
      add(Phase::Csr, tc, c);
      if (tc == 0 && c == 0) add(Phase::Delta, -1, 0);
      add(Phase::Dq, tc, c);
      add(Phase::DkvInterm, tc, c);
      add(Phase::Gather, tc, c);
    }
  if (s.has_sink) add(Phase::DSink, -1, 0);
  return steps;
}

}  // namespace smla
