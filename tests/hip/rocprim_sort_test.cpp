// rocprim_sort_test.cpp: libsmla_rocprim.so was built by hipcc and loads through dlopen.
#include <gtest/gtest.h>

#include <fstream>
#include <algorithm>
#include <iterator>
#include <vector>

#include "runtime/hip/hip_api.hpp"
#include "runtime/hip/hip_backend.hpp"
#include "runtime/hip/rocprim_sort.hpp"

namespace smla::hip {
namespace {

TEST(RocprimSort, RadixBits) {
  EXPECT_EQ(radix_bits_for(0), 1);
  EXPECT_EQ(radix_bits_for(1), 1);
  EXPECT_EQ(radix_bits_for(2), 2);
  EXPECT_EQ(radix_bits_for(255), 8);
  EXPECT_EQ(radix_bits_for(256), 9);
}

TEST(RocprimSort, LibraryBuiltForEveryProbedTargetAndLoads) {
  const std::string lib = SMLA_ROCPRIM_LIB;
  if (lib.empty()) GTEST_SKIP() << "libsmla_rocprim.so not built here (no hipcc/rocPRIM at configure)";
  std::ifstream f(lib, std::ios::binary);
  ASSERT_TRUE(f) << lib;
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  // The offload bundle names each device target it carries.
  std::string archs = SMLA_ROCPRIM_ARCHS;
  for (size_t p = 0, q; p < archs.size(); p = q + 1) {
    q = archs.find(';', p);
    if (q == std::string::npos) q = archs.size();
    std::string arch = archs.substr(p, q - p);
    EXPECT_NE(bytes.find("amdgcn-amd-amdhsa--" + arch), std::string::npos) << "no " << arch << " code in " << lib;
  }
  std::string why;
  // It links libamdhip64 (hipcc output always does): without the HIP runtime it cannot load.
  if (!Api::get(&why)) GTEST_SKIP() << "built, but the HIP runtime is missing here: " << why;
  const RocprimSort* s = RocprimSort::get(&why, lib);
  ASSERT_NE(s, nullptr) << why;
  EXPECT_EQ(s->path(), lib);
  // It says which processors it has code for: what CMake built it for.
  std::string listed;
  for (const std::string& t : s->targets()) listed += (listed.empty() ? "" : ";") + t;
  EXPECT_EQ(listed, archs);
  for (const std::string& t : s->targets()) EXPECT_TRUE(s->supports(t + ":sramecc+:xnack-", nullptr)) << t;
  for (const char* t : {"gfx90a", "gfx942", "gfx950"}) {
    const bool built = (";" + archs + ";").find(std::string(";") + t + ";") != std::string::npos;
    EXPECT_EQ(s->supports(t, nullptr), built) << t << " in " << archs;
  }
}

// In a fresh process whose HIP runtime (SMLA_LIBHIP: the stand-in libamdhip64.so.6, as PyTorch-ROCm bundles one) is not
// the one libsmla_rocprim.so was linked with (ROCm 5.2's libamdhip64.so.5 here): the sort is refused, naming both,
// instead of a second HIP runtime in the process being handed the first one's streams and memory.
TEST(RocprimSort, ALibraryOfAnotherHipRuntimeIsRefused) {
  const std::string lib = SMLA_ROCPRIM_LIB;
  if (lib.empty()) GTEST_SKIP() << "libsmla_rocprim.so not built here (no hipcc/rocPRIM at configure)";
  // (Nothing here may open the HIP runtime before the death test's process does: it re-runs this body.)
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("SMLA_LIBHIP", SMLA_FAKE_HIP_LIB, 1);
        std::string w;
        const bool opened = Api::get(&w) != nullptr;
        const RocprimSort* s = RocprimSort::get(&w, SMLA_ROCPRIM_LIB);
        std::fprintf(stderr, "opened %d sort %s: %s\n", int(opened), s ? "loaded" : "refused", w.c_str());
        std::_Exit(opened && !s ? 0 : 1);
      },
      ::testing::ExitedWithCode(0),
      "opened 1 sort refused: .*uses the HIP runtime .*libamdhip64.so.5.*, but smla's HIP runtime is " SMLA_FAKE_HIP_LIB
      ": two HIP runtimes in one process");
}

TEST(RocprimSort, ATargetItHasNoCodeForIsRefusedNamingWhatItHasAndHowToRebuild) {
  // Debian's ROCm 5.2 hipcc builds it for gfx90a only: on an MI355X, run() failed with a bare hipError.
  std::string why;
  EXPECT_FALSE(rocprim_supports({"gfx90a"}, "/x/libsmla_rocprim.so", "gfx950:sramecc+:xnack-", &why));
  for (const char* part : {"/x/libsmla_rocprim.so has device code for gfx90a, not for gfx950",
                           "--offload-arch=gfx950", "-DSMLA_HIPCC=", "smla_rocprim target"})
    EXPECT_NE(why.find(part), std::string::npos) << why;
  EXPECT_TRUE(rocprim_supports({"gfx90a", "gfx942"}, "l", "gfx942:sramecc+:xnack-", nullptr));
  EXPECT_TRUE(rocprim_supports({"gfx90a"}, "l", "gfx90a", nullptr));
  EXPECT_FALSE(rocprim_supports({}, "l", "gfx90a", &why));
  EXPECT_NE(why.find("no processor"), std::string::npos) << why;
}

TEST(RocprimSort, SortsPairsStablyOnTheDevice) {
  const std::string lib = SMLA_ROCPRIM_LIB;
  if (lib.empty()) GTEST_SKIP() << "libsmla_rocprim.so not built here (no hipcc/rocPRIM at configure)";
  std::string why;
  HipBackend backend;
  if (!backend.usable(&why)) GTEST_SKIP() << "running the sort needs an AMD GPU: " << why;
  // Written for an AMD GPU; never run here (no GPU on the build machines).
  const RocprimSort* s = RocprimSort::get(&why, lib);
  ASSERT_NE(s, nullptr) << why;
  const Api& api = Api::require();
  const int n = 10007, max_key = 1000;
  std::vector<int> keys(n), vals(n);
  for (int i = 0; i < n; ++i) {
    keys[i] = static_cast<int>((i * 7919u + 13u) % (max_key + 1));
    vals[i] = i;
  }
  const int bits = radix_bits_for(max_key);
  size_t temp = s->temp_bytes(n, 0, bits);
  void *d = nullptr, *t = nullptr;
  const size_t nbytes = sizeof(int) * n;
  SMLA_HIP_CHECK(api, hipMalloc(&d, 4 * nbytes));
  SMLA_HIP_CHECK(api, hipMalloc(&t, temp ? temp : 1));
  int* dk = static_cast<int*>(d);
  SMLA_HIP_CHECK(api, hipMemcpyHtoD(dk, keys.data(), nbytes));
  SMLA_HIP_CHECK(api, hipMemcpyHtoD(dk + n, vals.data(), nbytes));
  s->sort_pairs(t, temp, dk, dk + 2 * n, dk + n, dk + 3 * n, n, 0, bits, nullptr);
  SMLA_HIP_CHECK(api, hipStreamSynchronize(nullptr));
  std::vector<int> out_k(n), out_v(n);
  SMLA_HIP_CHECK(api, hipMemcpyDtoH(out_k.data(), dk + 2 * n, nbytes));
  SMLA_HIP_CHECK(api, hipMemcpyDtoH(out_v.data(), dk + 3 * n, nbytes));
  api.hipFree(d);
  api.hipFree(t);
  std::vector<int> order(n);
  for (int i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return keys[a] < keys[b]; });
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(out_v[i], order[i]) << i;
    ASSERT_EQ(out_k[i], keys[order[i]]) << i;
  }
}

}  // namespace
}  // namespace smla::hip
