// nvrtc_options.hpp: the NVRTC options every kernel is compiled with (sorted; include paths are added by the caller).
// Header-only so that kernel_src/check_compile.sh's generator compiles with exactly the runtime's options.
#pragma once
#include <algorithm>
#include <string>
#include <vector>

namespace smla::cuda {

inline std::vector<std::string> nvrtc_base_options(const std::string& target) {
  // --no-source-include: NVRTC looks for a quoted include beside the source first, which for a source without a
  // directory is the process's working directory: a header missing from SMLA_KERNEL_SRC_DIR was read from there,
  // from bytes the cache key never saw. Every header smla compiles with is attached to the program.
  std::vector<std::string> o{"--gpu-architecture=" + target, "-std=c++17", "-default-device", "-DSMLA_NVRTC=1",
                             "--device-int128", "--no-source-include"};
  std::sort(o.begin(), o.end());
  return o;
}

}  // namespace smla::cuda
