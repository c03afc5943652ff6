// test_cublas_api.cpp: the cuBLAS loader behind smla-bench --breakdown's dense GEMM rate.
// Runs without a GPU: a missing library is a clear reason, a present one resolves every symbol,
// and the GEMM without a driver reports why instead of crashing. On a GPU with cuBLAS, the GEMM
// runs and its rate is checked for sense.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>

#include "runtime/cuda/cublas_api.hpp"
#include "runtime/cuda/cuda_api.hpp"
#include "tests/cuda_required.hpp"

#if __has_include(<cublas_api.h>)
#include <cublas_api.h>
#define SMLA_HAVE_CUBLAS_HEADER 1
#endif

namespace smla {
namespace {

constexpr const char* kToolkitCublas = "/usr/local/cuda/lib64/libcublas.so.13";

bool file_exists(const char* p) {
  struct stat st;
  return stat(p, &st) == 0;
}

/// Sets an environment variable for one scope and restores what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_, old_.c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

TEST(CublasApi, HandDeclaredValuesMatchTheHeader) {
#ifdef SMLA_HAVE_CUBLAS_HEADER
  // The library builds without cuBLAS headers; where the toolkit has them, they must agree.
  EXPECT_EQ(cuda::Cublas::kStatusSuccess, int(CUBLAS_STATUS_SUCCESS));
  EXPECT_EQ(cuda::Cublas::kOpN, int(CUBLAS_OP_N));
  EXPECT_EQ(cuda::Cublas::kBf16, int(CUDA_R_16BF));
  EXPECT_EQ(cuda::Cublas::kCompute32F, int(CUBLAS_COMPUTE_32F));
  EXPECT_EQ(cuda::Cublas::kGemmDefault, int(CUBLAS_GEMM_DEFAULT));
  static_assert(sizeof(cublasStatus_t) == sizeof(int) && sizeof(cublasComputeType_t) == sizeof(int) &&
                    sizeof(cudaDataType) == sizeof(int) && sizeof(cublasGemmAlgo_t) == sizeof(int),
                "cuBLAS enums cross the ABI as int");
#else
  GTEST_SKIP() << "cublas_api.h is not installed here: the hand-declared values were not compared";
#endif
}

TEST(CublasApi, EnvironmentPathComesFirstAndAlone) {
  {
    ScopedEnv env("SMLA_CUBLAS_LIBRARY", "/some/dir/libcublas.so.13");
    const auto names = cuda::cublas_candidates();
    ASSERT_EQ(names.size(), 1u);
    EXPECT_EQ(names[0], "/some/dir/libcublas.so.13");
  }
  ScopedEnv env("SMLA_CUBLAS_LIBRARY", "");  // empty counts as unset
  const auto names = cuda::cublas_candidates();
  ASSERT_EQ(names.size(), 3u);
  EXPECT_EQ(names[0], "libcublas.so.13");
  EXPECT_EQ(names[1], "libcublas.so.12");
  EXPECT_EQ(names[2], "libcublas.so");
}

TEST(CublasApi, MissingLibraryNamesThePath) {
  const std::string missing = "/nonexistent/dir/libcublas.so.13";
  ScopedEnv env("SMLA_CUBLAS_LIBRARY", missing.c_str());
  const auto api = cuda::open_cublas(cuda::cublas_candidates());
  ASSERT_NE(api, nullptr);
  EXPECT_FALSE(api->ok);
  EXPECT_EQ(api->GemmEx, nullptr);
  EXPECT_NE(api->why.find(missing), std::string::npos) << api->why;
  EXPECT_NE(api->why.find("SMLA_CUBLAS_LIBRARY"), std::string::npos) << api->why;
}

TEST(CublasApi, NotALibraryIsAClearReason) {
  // A file that exists but is no shared object: dlopen's own complaint must come with its name.
  const char* not_a_library = "/etc/hostname";
  if (!file_exists(not_a_library)) GTEST_SKIP() << not_a_library << " is absent here";
  const auto api = cuda::open_cublas({not_a_library});
  EXPECT_FALSE(api->ok);
  EXPECT_NE(api->why.find(not_a_library), std::string::npos) << api->why;
}

TEST(CublasApi, ToolkitLibraryResolvesEverySymbol) {
  if (!file_exists(kToolkitCublas)) GTEST_SKIP() << kToolkitCublas << " is absent here: the loader was not exercised";
  const auto api = cuda::open_cublas({kToolkitCublas});
  ASSERT_TRUE(api->ok) << api->why;
  EXPECT_TRUE(api->why.empty()) << api->why;
  EXPECT_EQ(api->path, kToolkitCublas);
  EXPECT_NE(api->Create, nullptr);
  EXPECT_NE(api->Destroy, nullptr);
  EXPECT_NE(api->SetStream, nullptr);
  EXPECT_NE(api->GemmEx, nullptr);
  EXPECT_NE(api->StatusString, nullptr);
  ASSERT_NE(api->StatusName, nullptr);  // optional for the loader, present in cuBLAS 12 and 13
  // The status values declared by hand must be what the library means by them.
  EXPECT_STREQ(api->StatusName(cuda::Cublas::kStatusSuccess), "CUBLAS_STATUS_SUCCESS");
  EXPECT_STRNE(api->StatusName(1), "CUBLAS_STATUS_SUCCESS");
}

TEST(CublasApi, LaterCandidatesAreTriedAfterAMissingOne) {
  if (!file_exists(kToolkitCublas)) GTEST_SKIP() << kToolkitCublas << " is absent here: the loader was not exercised";
  const auto api = cuda::open_cublas({"/nonexistent/dir/libcublas.so.13", kToolkitCublas});
  ASSERT_TRUE(api->ok) << api->why;
  EXPECT_EQ(api->path, kToolkitCublas);
}

TEST(CublasApi, BadSizeIsAReasonNotACrash) {
  std::string why;
  EXPECT_FALSE(cuda::dense_gemm_rate(0, nullptr, &why).has_value());
  EXPECT_NE(why.find("n >= 1"), std::string::npos) << why;
}

TEST(CublasApi, GemmWithoutADriverIsNotMeasured) {
  if (cuda::driver().ok) GTEST_SKIP() << "a CUDA driver is present: this checks the no-driver path";
  std::string why;
  const auto tflops = cuda::dense_gemm_tflops(256, nullptr, &why);
  EXPECT_FALSE(tflops.has_value());
  ASSERT_FALSE(why.empty());
  // Either cuBLAS itself is missing here, or it loaded and the driver is what is missing.
  if (cuda::cublas()->ok)
    EXPECT_NE(why.find("CUDA driver"), std::string::npos) << why;
  else
    EXPECT_EQ(why, cuda::cublas()->why);
}

TEST(CublasApi, GemmRunsOnAGpu) {
  if (!test::cuda_usable()) GTEST_SKIP() << "no usable CUDA device here (" << test::cuda_why() << "): GEMM not run";
  if (!cuda::cublas()->ok) GTEST_SKIP() << "cuBLAS is not available here: " << cuda::cublas()->why;
  std::string why;
  // 1000 is not a multiple of any tile: the checked elements sit in a full and a ragged tile alike.
  for (int n : {1000, 4096}) {
    const auto r = cuda::dense_gemm_rate(n, nullptr, &why, 5);
    ASSERT_TRUE(r.has_value()) << why;
    EXPECT_EQ(r->n, n);
    EXPECT_EQ(r->repeats, 5);
    EXPECT_GT(r->ms, 0.0);
    // (the two reported figures agree: the rate is the n^3 GEMM's 2 n^3 FLOPs over the time; the bounds below are
    // what checks the time itself)
    EXPECT_NEAR(r->tflops, 2.0 * double(n) * n * n / (r->ms * 1e-3) / 1e12, 1e-9 * r->tflops);
    // Far above what no tensor cores would give, far below any GPU's peak: a rate that is off
    // by a unit (us vs ms) or a GEMM that did not run fails.
    if (n == 4096) {
      EXPECT_GT(r->tflops, 20.0);
      EXPECT_LT(r->tflops, 5000.0);
    }
  }
}

}  // namespace
}  // namespace smla
