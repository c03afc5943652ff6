// env.hpp: the runtime's environment knobs, read once into one struct.
// (The disk cache's own knobs live in cache::Settings.)
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace smla {

struct RuntimeEnv {
  std::string kernel_src_dir;       ///< SMLA_KERNEL_SRC_DIR: read kernel sources from here
  /// SMLA_INTERM_BUDGET_BYTES: cap for T*R_CHUNK*512 bf16 that sets the default chunking. 4 GiB: the
  /// seed's unchunked interm up to T*TOPK = 4M (T 8192 at TOPK 512), where chunking measured 15.4 ms
  /// against 10.7 unchunked on the H200 (docs/perf-notes.md, v4).
  size_t interm_budget = size_t(4) << 30;
  // SMLA_LOG_LEVEL (trace|debug|info|warn|error|off, default warn) is read by the logger itself (cache/logger.cpp);
  // a value it cannot use is one of the warnings below.
  bool side_stream = true;          ///< SMLA_SIDE_STREAM=0: run csr in order instead of beside dq
  /// What was set but could not be read (the default kept); each Runtime logs them as warnings (the logger reads
  /// this struct, so it cannot be used while it is being filled).
  std::vector<std::string> warnings;
};

/// Parsed once per process.
const RuntimeEnv& runtime_env();

}  // namespace smla
