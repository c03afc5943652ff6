// hip_api_test.cpp: which HIP runtime smla opens. Api::get() opens it once per process, so each case
// runs in a process of its own (a death test, re-executed: nothing inherited from this one).
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "runtime/hip/hip_api.hpp"

namespace smla::hip {
namespace {

// In a fresh process: runs `setup`, opens the HIP runtime and prints what it opened, and where hipRTC was bound from
// (or why nothing was opened).
void report_opened(void (*setup)()) {
  setup();
  std::string why;
  const Api* a = Api::get(&why);
  if (a) std::fprintf(stderr, "opened=%s\nhiprtc=%s\n", a->hip_library.c_str(), a->hiprtc_library.c_str());
  else std::fprintf(stderr, "not opened: %s\n", why.c_str());
  std::fflush(stderr);
  std::_Exit(a ? 0 : 1);
}

TEST(HipApi, UsesTheHipRuntimeAlreadyInTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // As PyTorch-ROCm does: its bundled libamdhip64.so.6 is loaded by path before smla is asked. smla opened
  // "libamdhip64.so" first (here ROCm 5.2's): two HIP runtimes in one process.
  EXPECT_EXIT(report_opened([] {
                unsetenv("SMLA_LIBHIP");
                if (!dlopen(SMLA_FAKE_HIP_LIB, RTLD_NOW | RTLD_GLOBAL)) std::_Exit(2);
              }),
              ::testing::ExitedWithCode(0), "opened=" SMLA_FAKE_HIP_LIB "\n");
}

TEST(HipApi, SmlaLibhipNamesTheRuntimeAndIsNotSilentlyReplaced) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(report_opened([] { setenv("SMLA_LIBHIP", SMLA_FAKE_HIP_LIB, 1); }), ::testing::ExitedWithCode(0),
              "opened=" SMLA_FAKE_HIP_LIB "\n");
  EXPECT_EXIT(report_opened([] { setenv("SMLA_LIBHIP", "/nonexistent/libamdhip64.so", 1); }),
              ::testing::ExitedWithCode(1),
              "not opened: SMLA_LIBHIP='/nonexistent/libamdhip64.so' could not be opened .*set it to the path of "
              "libamdhip64.so, or unset it");
}

// hipRTC (a library of its own from ROCm 6) is bound from the one beside the HIP runtime, of the runtime's major
// version (another ROCm's would not match it), and from the runtime itself when that library is not hipRTC (it lacks
// hiprtcCreateProgram; ROCm 5 kept hipRTC inside libamdhip64).
TEST(HipApi, HipRtcIsBoundBesideTheRuntimeOfItsMajorVersion) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(report_opened([] { setenv("SMLA_LIBHIP", SMLA_FAKE_HIP_RTC_DIR "whole/libamdhip64.so.6", 1); }),
              ::testing::ExitedWithCode(0), "hiprtc=" SMLA_FAKE_HIP_RTC_DIR "whole/libhiprtc.so.6\n");
  EXPECT_EXIT(report_opened([] { setenv("SMLA_LIBHIP", SMLA_FAKE_HIP_RTC_DIR "nocreate/libamdhip64.so.6", 1); }),
              ::testing::ExitedWithCode(0), "hiprtc=" SMLA_FAKE_HIP_RTC_DIR "nocreate/libamdhip64.so.6\n");
}

// Opening the runtime (as each hipRTC worker does, and a host that asks only whether smla compiles) calls nothing
// that initializes it: hipRuntimeGetVersion brought up HSA and every GPU (seconds on an 8-GPU node) just to find
// libhiprtc.so.<major> beside it.
TEST(HipApi, OpeningTheRuntimeDoesNotInitializeIt) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(report_opened([] {
                setenv("SMLA_LIBHIP", SMLA_FAKE_HIP_LIB, 1);
                setenv("SMLA_FAKE_HIP_VERSION_EXITS", "1", 1);
              }),
              ::testing::ExitedWithCode(0), "opened=" SMLA_FAKE_HIP_LIB "\n");
}

TEST(HipApi, TheMajorVersionIsReadFromTheLibrarysName) {
  char tmpl[] = "/tmp/smla-hipname-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const std::string real = dir + "/libamdhip64.so.7.0.70000", link = dir + "/libamdhip64.so";
  std::fclose(std::fopen(real.c_str(), "w"));
  ASSERT_EQ(::symlink(real.c_str(), link.c_str()), 0);
  EXPECT_EQ(hip_major_of_library(link), 7) << "through the link";
  EXPECT_EQ(hip_major_of_library(real), 7);
  EXPECT_EQ(hip_major_of_library("/opt/rocm/lib/libamdhip64.so.6"), 6) << "a name that does not exist";
  EXPECT_EQ(hip_major_of_library("/x/libamdhip64.so"), 0);
  EXPECT_EQ(hip_major_of_library("/x/libamdhip64.so.x"), 0);
  EXPECT_EQ(hip_major_of_library("/x/libother.so.7"), 0);
  ::unlink(link.c_str());
  ::unlink(real.c_str());
  ::rmdir(dir.c_str());
}

// HIP_VERSION (major * 10^7 + minor * 10^5 + patch) as messages print it.
TEST(HipApi, TheVersionNumberReadsAsMajorMinorPatch) {
  EXPECT_EQ(hip_version_string(50221153), "5.2.21153");
  EXPECT_EQ(hip_version_string(60342134), "6.3.42134");
  EXPECT_EQ(hip_version_string(70000000), "7.0.0");
  EXPECT_EQ(hip_version_string(71099999), "7.10.99999");
}

}  // namespace
}  // namespace smla::hip
