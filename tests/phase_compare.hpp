// phase_compare.hpp: one region of a workspace (or an output) after a phase, against the CPU backend's phase run on
// the same state: test_phases_gpu (the CUDA kernels) and test_amd_emulated (the AMD kernels, emulated on the host).
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "runtime/bf16.hpp"
#include "tests/reference/reference.hpp"

namespace smla::test {

// Float regions compared at the bar (bf16 or fp32; `bar`: the relative L2 error allowed), integer regions exactly.
// Elements that hold the same bits on both sides (including a phase's untouched poison, or the -inf lse of a token
// with no valid slot and no sink) agree; an element finite on one side only is a failure; the rest are compared at
// the contract's bar.
// `kernel`: the kernel's bytes (the GPU's, the emulated AMD kernel's); `cpu`: the CPU phase's.
inline void compare_region(const char* name, bool is_bf16, bool is_int, const unsigned char* kernel,
                           const unsigned char* cpu, size_t bytes, double bar = 1e-2) {
  if (!bytes) return;
  if (is_int) {
    EXPECT_EQ(std::memcmp(kernel, cpu, bytes), 0) << name << " differs from the CPU phase";
    return;
  }
  const size_t w = is_bf16 ? 2 : 4, n = bytes / w;
  auto value = [&](const unsigned char* base, size_t i) -> double {
    if (is_bf16) {
      uint16_t v;
      std::memcpy(&v, base + 2 * i, 2);
      return bf16_to_float(v);
    }
    float v;
    std::memcpy(&v, base + 4 * i, 4);
    return v;
  };
  std::vector<double> ref, got;
  size_t finite_mismatch = 0;
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(kernel + w * i, cpu + w * i, w) == 0 && !std::isfinite(value(cpu, i))) continue;
    const double r = value(cpu, i), g = value(kernel, i);
    if (std::isfinite(r) != std::isfinite(g)) {
      ++finite_mismatch;
      continue;
    }
    ref.push_back(r);
    got.push_back(g);
  }
  EXPECT_EQ(finite_mismatch, 0u) << name << ": elements finite on one side only";
  std::vector<float> gotf(got.begin(), got.end());
  const ref::Compare c = ref::compare(ref, gotf.data(), gotf.size());
  EXPECT_TRUE(c.finite && c.rel_err <= bar && c.cosine >= 0.9999)
      << name << ": rel_err " << c.rel_err << " cosine " << c.cosine << " finite " << c.finite;
}

}  // namespace smla::test
