// reference.hpp: an independent float64 model of the sparse-MLA op (forward and backward),
// input generators (including the benchmark top-k of the contract) and accuracy comparison.
//
// Written straight from the contract's math, not from docs/phases.md's decomposition, and using
// nothing of the runtime except bf16 conversion, so the tests compare two independent routes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace smla::ref {

constexpr int D = 512;

enum class TopkKind {
  Benchmark,  ///< the contract's benchmark top-k (window + visible pool rows)
  Uniform,    ///< uniform random rows of [0, num_kv), about 1 in 8 slots -1, repeats allowed
};

/// One problem's inputs, packed layouts: q/o/dout [T,H,D], kv [num_kv,D], lse [T,H],
/// topk [T,topk_n], sink [H] (empty without a sink).
struct Inputs {
  int T = 0, H = 0, num_kv = 0, topk_n = 0;
  bool has_sink = false;
  float scale = 0;  // the float the runtime is given; used as double here
  std::vector<uint16_t> q, kv, o, dout;  // bf16 bits
  std::vector<float> lse;                // natural log, sink-inclusive (from forward())
  std::vector<int32_t> topk;
  std::vector<float> sink;
  /// Filled by forward(): natural-log lse *without* the sink, in double (-inf for a token with
  /// no valid slot), so tests can build other lse conventions without cancellation.
  std::vector<double> lse_excl;
};

/// q, kv, dout ~ normal(0, 0.5) rounded to bf16; sink ~ normal(0, 0.5); topk from `kind`;
/// then o and lse by forward().
Inputs make_inputs(int T, int H, int num_kv, int topk, bool sink, uint64_t seed, TopkKind kind);

/// The contract's benchmark top-k, [T, topk] row-major. Slots 0..min(topk,128)-1 are the window
/// t, t-1, ... (-1 where negative); so with topk <= 128 there is no pool part. The other slots
/// are distinct pool rows T + j (j < num_kv - T), j visible to t once 4(j+1) <= t+1, drawn at
/// random in random order; -1 fill the rest when fewer are visible (always when num_kv <= T).
std::vector<int32_t> benchmark_topk(int T, int num_kv, int topk, uint64_t seed);

// Top-k edits; each re-runs forward() so o and lse stay consistent with the new top-k.
void make_rows_empty(Inputs& in, const std::vector<int>& rows);
/// Copies `count` random slots' indices into other random slots of the same token.
void inject_repeats(Inputs& in, int count, uint64_t seed);
/// Writes `count` out-of-range values (cycling -7, num_kv, num_kv+3, -2) into random slots.
void inject_out_of_range(Inputs& in, int count, uint64_t seed);

/// Recomputes in.o (bf16), in.lse (float) and in.lse_excl from q, kv, sink, topk in float64.
void forward(Inputs& in);

/// The caller's lse in another convention (e.g. base 2 without the sink, as TileLang's example forward returns it),
/// from in.lse_excl; lse_in_mode(in, false, false) is in.lse up to rounding.
std::vector<float> lse_in_mode(const Inputs& in, bool base2, bool excludes_sink);

/// The lse FlashMLA's sparse forward returns: natural log, sink excluded, and +inf (not -inf) for a token without a
/// valid slot.
std::vector<float> lse_flashmla(const Inputs& in);

struct Grads {
  std::vector<double> dq, dkv, d_sink;  // [T*H*D], [num_kv*D], [H] (empty without a sink)
};

/// The backward in float64 from in.lse (natural, sink-inclusive). delta = <o, dout> from the
/// bf16 o as the contract says; with `exact_delta`, delta = sum_r p*dp instead (the exact
/// derivative of sum(o*dout) when lse is exact). Out-of-range slots are empty.
Grads backward(const Inputs& in, bool exact_delta = false);

// ---- the float64 core on plain double arrays (what finite differences perturb)
struct Dims {
  int T, H, num_kv, topk_n;
  bool has_sink;
  double scale;
};
/// o [T*H*D], lse and lse_excl [T*H] (natural; inclusive is excl with the sink added).
void forward64(const Dims& d, const double* q, const double* kv, const double* sink,
               const int32_t* topk, double* o, double* lse, double* lse_excl);
/// delta_from_o null: exact delta = sum_r p*dp; else delta = <o, dout>.
Grads backward64(const Dims& d, const double* q, const double* kv, const double* dout,
                 const double* sink, const int32_t* topk, const double* lse,
                 const double* delta_from_o);

// ---- comparison against the bar
struct Compare {
  double rel_err = 0;   ///< ||got - ref|| / ||ref|| (||got|| when ref is all zero)
  double cosine = 0;    ///< 1 when both are all zero
  bool finite = true;   ///< no NaN or Inf in got
  size_t unwritten = 0; ///< elements still holding the poison pattern
};
Compare compare(const std::vector<double>& ref, const float* got, size_t n);
Compare compare(const std::vector<double>& ref, const uint16_t* got_bf16, size_t n);
/// The contract's bar: rel_err <= 1e-2, cosine >= 0.9999, finite (and nothing unwritten).
bool meets_bar(const Compare& c);

// Poison: NaN bit patterns no arithmetic produces (computed NaNs are the canonical 0x7fc0...),
// so an element still holding one was never written.
constexpr uint16_t kPoisonBf16 = 0x7fa5;
constexpr uint32_t kPoisonF32 = 0x7fa5a5a5u;
void poison_bf16(uint16_t* p, size_t n);
void poison_f32(float* p, size_t n);
void poison_i32(int32_t* p, size_t n);  // 0x7fa5a5a5 as an int

}  // namespace smla::ref
