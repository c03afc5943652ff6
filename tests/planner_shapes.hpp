// planner_shapes.hpp: the shapes the planner serves, for the offline compile tests of every
// backend family: every supported H and the DSv4 top-k values, over T and num_kv wide enough to
// reach every default chunking and radix geometry, with a sink and the index check.
#pragma once
#include <vector>

#include "runtime/env.hpp"
#include "runtime/planner.hpp"

namespace smla::test {

inline std::vector<ShapeInfo> planner_shapes() {
  std::vector<ShapeInfo> out;
  for (int64_t H : {16, 32, 64, 128})
    for (int64_t topk : {64, 160, 512, 640, 1024, 1152})
      for (int64_t T : {1, 4096, 8192, 16384, 32768})
        for (int64_t num_kv : {200, 5120, 70000}) {
          Problem p;
          p.T = T, p.H = H, p.topk = topk, p.num_kv = num_kv, p.has_sink = true, p.check_indices = true;
          out.push_back(choose_shape(p, runtime_env().interm_budget));
        }
  return out;
}

}  // namespace smla::test
