// hip_backend_test.cpp: the HIP backend on a machine without an AMD GPU (CI, this host).
#include <gtest/gtest.h>

#include "runtime/hip/hip_backend.hpp"

namespace smla::hip {
namespace {

TEST(HipBackend, NotUsableWithoutAnAmdGpuAndSaysWhy) {
  HipBackend b;
  std::string why;
  if (b.usable(&why)) GTEST_SKIP() << "an AMD GPU is present: this test is for machines without one";
  EXPECT_EQ(b.name(), "hip");
  EXPECT_NE(why.find("HIP backend unusable"), std::string::npos) << why;
  EXPECT_EQ(why.find('\n'), std::string::npos) << "one line: " << why;
  std::cout << "[ note ] " << why << "\n";
  EXPECT_EQ(b.device_count(), 0);
  int local = 0;
  EXPECT_EQ(b.pointer_info(&local, 0).kind, PointerKind::Unknown);
  ASSERT_NE(b.compiler(), nullptr);
  EXPECT_EQ(b.compiler()->family(), "hip");
  // Device queries fail with smla::Error, never a crash.
  EXPECT_THROW(b.target(0), Error);
  EXPECT_THROW(b.max_shared_memory(0), Error);
  // Asking twice gives the same answer (probed once).
  std::string again;
  EXPECT_FALSE(b.usable(&again));
  EXPECT_EQ(why, again);
}

TEST(HipBackend, PointerKindFollowsTheRuntimesEnum) {
  // ROCm 5 (Host 0, Device 1) vs ROCm 6 (Unregistered 0, Host 1, Device 2, Managed 3).
  EXPECT_EQ(pointer_kind_from(1, 50221153), PointerKind::Device);
  EXPECT_EQ(pointer_kind_from(0, 50221153), PointerKind::Host);
  EXPECT_EQ(pointer_kind_from(1, 60300000), PointerKind::Host);
  EXPECT_EQ(pointer_kind_from(2, 60300000), PointerKind::Device);
  EXPECT_EQ(pointer_kind_from(3, 70000000), PointerKind::Device);
  EXPECT_EQ(pointer_kind_from(0, 70000000), PointerKind::Host);
}

}  // namespace
}  // namespace smla::hip
