// stats.hpp: the one median of the timings (smla-bench's rounds and runs, smla-tune's candidates, the cuBLAS GEMM
// rate). For an even count it is the mean of the two middle values: v[n / 2] alone is the upper one, of two rounds the
// slower (perf notes v26).
#pragma once
#include <algorithm>
#include <vector>

namespace smla {

/// The median of `v` (0 when empty).
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace smla
