// nvrtc_options.hpp: the NVRTC options every kernel is compiled with (sorted; include paths are added by the caller).
// Header-only so that kernel_src/check_compile.sh's generator compiles with exactly the runtime's options.
#pragma once
#include <algorithm>
#include <string>
#include <vector>

namespace smla::cuda {

inline std::vector<std::string> nvrtc_base_options(const std::string& target) {
  std::vector<std::string> o{"--gpu-architecture=" + target, "-std=c++17", "-default-device", "-DSMLA_NVRTC=1",
                             "--device-int128"};
  std::sort(o.begin(), o.end());
  return o;
}

}  // namespace smla::cuda
