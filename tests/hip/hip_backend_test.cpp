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

// Only hipModuleLoadData refusing the code object makes the cache drop a (shared) entry and recompile. Every error of
// load() counted before (the base class's default): a rank out of GPU memory, or a device over its LDS limit, deleted
// entries every other rank used, and recompiled them to fail the same.
TEST(HipBackend, OnlyARefusedCodeObjectCountsAsARefusedBinary) {
  const std::string load = "hipModuleLoadData(&k->module_, binary.data())";
  auto err = [&](Status st, const std::string& what, const std::string& call) {
    return Error(st, call + " failed: " + what, __FILE__, __LINE__, call);
  };
  const HipBackend b;
  const Backend& be = b;
  for (const char* what : {"hipErrorInvalidImage (invalid kernel image)", "hipErrorNoBinaryForGpu",
                           "hipErrorInvalidKernelFile (x)", "hipErrorSharedObjectInitFailed (x)", "hipError 200",
                           "hipError 209"})
    EXPECT_TRUE(be.is_binary_refusal(err(Status::DriverError, what, load))) << what;
  for (const char* what : {"hipErrorOutOfMemory (out of memory)", "hipErrorInvalidValue", "hipError 2",
                           "hipError 2000", "hipErrorInvalidImageX"})
    EXPECT_FALSE(be.is_binary_refusal(err(Status::DriverError, what, load))) << what;
  EXPECT_FALSE(be.is_binary_refusal(err(Status::DriverError, "hipErrorInvalidImage", "hipSetDevice(device)")));
  EXPECT_FALSE(be.is_binary_refusal(err(Status::DriverError, "hipErrorNotFound", "hipModuleGetFunction(&k->fn_)")));
  EXPECT_FALSE(be.is_binary_refusal(Error(Status::Unsupported, "smla_dq needs 70000 bytes of LDS; device 0 allows "
                                                               "65536", __FILE__, __LINE__, "hipModuleLaunchKernel")));
  EXPECT_FALSE(be.is_binary_refusal(err(Status::Internal, "hipErrorInvalidImage", load)));
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
