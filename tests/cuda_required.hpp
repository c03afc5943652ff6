// cuda_required.hpp: whether a CUDA test runs here, for every test binary with CUDA cases.
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "runtime/cuda/cuda_api.hpp"

namespace smla::test {

/// Whether CUDA runs here. With SMLA_TEST_REQUIRE_CUDA=1 (the GPU machine's scripts set it) "no" is also a failure:
/// a regression in opening the driver would otherwise skip every CUDA test and read as a green run.
inline bool cuda_usable() {
  if (cuda::driver().ok) return true;
  const char* req = std::getenv("SMLA_TEST_REQUIRE_CUDA");
  if (req && std::string(req) == "1") ADD_FAILURE() << "SMLA_TEST_REQUIRE_CUDA=1 but CUDA is not usable: " << cuda::driver().why;
  return false;
}
inline std::string cuda_why() { return cuda::driver().why; }

}  // namespace smla::test
