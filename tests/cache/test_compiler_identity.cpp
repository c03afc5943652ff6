// The compilers' contributions to the cache key: NVRTC's identity tells patch releases apart,
// hipRTC's follows the environment variables that change its code, and hipRTC workers run
// without comgr's own cache. No GPU; parts that need NVRTC or hipRTC skip without them.
#include <gtest/gtest.h>

#include <algorithm>
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <climits>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "runtime/cuda/cuda_api.hpp"
#include "runtime/cuda/nvrtc_compiler.hpp"
#ifdef SMLA_TEST_HIP
#include "runtime/hip/hip_api.hpp"
#include "runtime/hip/hip_subprocess.hpp"
#include "runtime/hip/hiprtc_compiler.hpp"
#endif

namespace smla {
namespace {

long long bytes_of(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<long long>(st.st_size) : -1;
}

TEST(NvrtcIdentity, NamesTheSizesOfTheLoadedLibraryAndItsBuiltins) {
  const cuda::Nvrtc& n = cuda::nvrtc();
  if (!n.ok) GTEST_SKIP() << "no NVRTC here: " << n.why;
  Dl_info info{};
  ASSERT_NE(::dladdr(reinterpret_cast<const void*>(n.Version), &info), 0);
  char real[PATH_MAX];
  ASSERT_NE(::realpath(info.dli_fname, real), nullptr) << info.dli_fname;
  int maj = 0, min = 0;
  n.Version(&maj, &min);
  std::string dir(real);
  dir = dir.substr(0, dir.rfind('/') + 1);
  const long long lib = bytes_of(real);
  const long long builtins = bytes_of(dir + "libnvrtc-builtins.so." + std::to_string(maj) + "." + std::to_string(min));
  ASSERT_GT(lib, 0);
  const std::string id = cuda::NvrtcCompiler().identity();
  EXPECT_NE(id.find("nvrtc-" + std::to_string(maj) + "." + std::to_string(min) + ";"), std::string::npos) << id;
  EXPECT_NE(id.find(";libnvrtc-bytes=" + std::to_string(lib) + ";"), std::string::npos) << id;
  EXPECT_NE(id.find(";builtins-bytes=" + std::to_string(builtins)), std::string::npos) << id;
  EXPECT_GT(builtins, 0) << "libnvrtc-builtins not found beside " << real << ": " << id;
  std::cout << "[ note ] identity: " << id << "\n";
}

// The stamp of another library (libc, via a symbol of it): its size, and no builtins beside it.
TEST(NvrtcIdentity, StampOfAnyLibraryIsItsFileSize) {
  const void* sym = reinterpret_cast<const void*>(&::getenv);
  Dl_info info{};
  ASSERT_NE(::dladdr(sym, &info), 0);
  char real[PATH_MAX];
  ASSERT_NE(::realpath(info.dli_fname, real), nullptr);
  EXPECT_EQ(cuda::nvrtc_build_stamp(sym, 99, 7),
            "libnvrtc-bytes=" + std::to_string(bytes_of(real)) + ";builtins-bytes=-1");
  EXPECT_EQ(cuda::nvrtc_build_stamp(nullptr, 13, 0), "libnvrtc-bytes=?");
}

struct EnvVar {
  std::string name;
  EnvVar(const char* n, const char* v) : name(n) { ::setenv(n, v, 1); }
  ~EnvVar() { ::unsetenv(name.c_str()); }
};

// Where NVRTC is looked for: the loader's search first, then under $CUDA_HOME, $CUDA_PATH and /usr/local/cuda (a
// toolkit outside the loader's path, as a module system leaves it); $SMLA_LIBNVRTC alone when set. A root set but
// empty is not a root ("/lib64/libnvrtc.so" was tried).
TEST(NvrtcLibrary, IsLookedForUnderTheToolkitRoots) {
  const char* vars[] = {"SMLA_LIBNVRTC", "CUDA_HOME", "CUDA_PATH"};
  std::vector<std::pair<std::string, std::string>> saved;
  for (const char* v : vars)
    if (const char* old = std::getenv(v)) saved.emplace_back(v, old);
  for (const char* v : vars) ::unsetenv(v);
  const std::vector<std::string> loader{"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};
  auto with = [&](std::vector<std::string> tail) {
    std::vector<std::string> all = loader;
    all.insert(all.end(), tail.begin(), tail.end());
    return all;
  };
  EXPECT_EQ(cuda::nvrtc_candidates(), with({"/usr/local/cuda/lib64/libnvrtc.so"}));
  ::setenv("CUDA_HOME", "/opt/cuda-a", 1);
  ::setenv("CUDA_PATH", "/opt/cuda-b", 1);
  EXPECT_EQ(cuda::nvrtc_candidates(), with({"/opt/cuda-a/lib64/libnvrtc.so", "/opt/cuda-b/lib64/libnvrtc.so",
                                            "/usr/local/cuda/lib64/libnvrtc.so"}));
  ::setenv("CUDA_HOME", "", 1);
  EXPECT_EQ(cuda::nvrtc_candidates(), with({"/opt/cuda-b/lib64/libnvrtc.so", "/usr/local/cuda/lib64/libnvrtc.so"}));
  ::setenv("SMLA_LIBNVRTC", "/somewhere/libnvrtc.so.13", 1);
  EXPECT_EQ(cuda::nvrtc_candidates(), std::vector<std::string>{"/somewhere/libnvrtc.so.13"});
  for (const char* v : vars) ::unsetenv(v);
  for (const auto& [name, value] : saved) ::setenv(name.c_str(), value.c_str(), 1);
}

// The builtins NVRTC loads are found by the loader, LD_LIBRARY_PATH first: a build there is the one stamped, not the
// file beside libnvrtc (another builtins build changed what compiled while the key stayed).
TEST(NvrtcIdentity, TheBuiltinsStampedAreTheOnesTheLoaderFinds) {
  char tmpl[] = "/tmp/smla-builtins-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  std::ofstream(dir + "/libnvrtc-builtins.so.99.7") << std::string(1234, 'x');
  const char* old = std::getenv("LD_LIBRARY_PATH");
  const std::string saved = old ? old : "";
  ::setenv("LD_LIBRARY_PATH", ("/nonexistent:" + dir).c_str(), 1);
  const std::string stamp = cuda::nvrtc_build_stamp(reinterpret_cast<const void*>(&::getenv), 99, 7);
  if (old) ::setenv("LD_LIBRARY_PATH", saved.c_str(), 1);
  else ::unsetenv("LD_LIBRARY_PATH");
  EXPECT_NE(stamp.find(";builtins-bytes=1234"), std::string::npos) << stamp;
  std::filesystem::remove_all(dir);
}

// A compiler's CUDA headers are found when it is made: its identity (the cache key) names the headers its compiles use,
// whatever SMLA_CUDA_INCLUDE says later. Before, the identity was worked out once a process, at its first use, while
// each compile looked the directory up again: a key could name one toolkit's headers over a binary of another's.
TEST(NvrtcIdentity, NamesTheHeadersItsCompilesUse) {
  if (!cuda::nvrtc().ok) GTEST_SKIP() << "no NVRTC here: " << cuda::nvrtc().why;
  ::unsetenv("SMLA_CUDA_INCLUDE");
  const cuda::NvrtcCompiler made_before;
  std::string why;
  if (!made_before.available(&why)) GTEST_SKIP() << why;
  const std::string cccl_h = "/cccl/cuda/std/__cccl/version.h";  // in the identity, and compiled by the probe
  const std::string real_version = cuda::read_define(made_before.include_dir() + cccl_h, "CCCL_VERSION");
  ASSERT_FALSE(real_version.empty()) << made_before.include_dir();

  // Other headers: a CCCL of another version that stops any compile that includes it (cuda.h marks the directory).
  char tmpl[] = "/tmp/smla-include-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string fake = tmpl;
  std::ofstream(fake + "/cuda.h") << "#define CUDA_VERSION 99990\n";
  std::filesystem::create_directories(fake + "/cccl/cuda/std/__cccl");
  std::ofstream(fake + cccl_h) << "#define CCCL_VERSION 9999999\n#error the fake CCCL was compiled against\n";
  const RenderedSource probe{
      "smla_include_probe.cu",
      "#include <cuda/std/__cccl/version.h>\nextern \"C\" __global__ void k(int* p) { *p = CCCL_VERSION; }\n", {}};
  {
    EnvVar include("SMLA_CUDA_INCLUDE", fake.c_str());
    const std::string id = made_before.identity();  // its first call comes after the change
    EXPECT_NE(id.find(";cccl-" + real_version + ";"), std::string::npos) << id;
    EXPECT_EQ(id.find("9999999"), std::string::npos) << id;
    EXPECT_NO_THROW(made_before.compile(probe, "sm_80")) << "compiled against other headers than its identity names";

    const cuda::NvrtcCompiler made_after;  // the fake headers, in its identity and its compiles alike
    EXPECT_EQ(made_after.include_dir(), fake);
    EXPECT_NE(made_after.identity().find(";cuda-99990;cccl-9999999;"), std::string::npos) << made_after.identity();
    try {
      made_after.compile(probe, "sm_80");
      ADD_FAILURE() << "compiled without the headers its identity names";
    } catch (const Error& e) {
      EXPECT_NE(e.message().find("the fake CCCL was compiled against"), std::string::npos) << e.message();
    }
  }
  std::filesystem::remove_all(fake);
}

// CUDA 12 keeps CUB and libcu++ at the top of its include directory, not under cccl/: the CCCL version is read where
// the compile's -I order finds it (it was read from cccl/ only, so on CUDA 12 it was empty and a CCCL upgrade kept
// every key). CUB older than CCCL 2.3 has only CUB_VERSION.
TEST(CompilerIdentity, TheCcclVersionIsReadWhereTheCompileFindsIt) {
  char tmpl[] = "/tmp/smla-include-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string root = tmpl;
  auto tree = [&](const std::string& name, const std::string& sub, const std::string& file, const std::string& def) {
    const std::string inc = root + "/" + name;
    std::filesystem::create_directories(inc + sub + file.substr(0, file.rfind('/')));
    std::ofstream(inc + "/cuda.h") << "#define CUDA_VERSION 12080\n";
    std::ofstream(inc + sub + file) << def << "\n";
    return cuda::NvrtcCompiler(inc).identity();
  };
  const std::string v12a = tree("a", "", "/cuda/std/__cccl/version.h", "#define CCCL_VERSION 3000001");
  const std::string v12b = tree("b", "", "/cuda/std/__cccl/version.h", "#define CCCL_VERSION 3000002");
  EXPECT_NE(v12a.find(";cccl-3000001;"), std::string::npos) << v12a;
  EXPECT_NE(v12a, v12b) << "a CCCL upgrade on CUDA 12's layout kept the identity";
  const std::string v13 = tree("c", "/cccl", "/cuda/std/__cccl/version.h", "#define CCCL_VERSION 3000003");
  EXPECT_NE(v13.find(";cccl-3000003;"), std::string::npos) << v13;
  const std::string old_cub = tree("d", "", "/cub/version.cuh", "#define CUB_VERSION 200200");
  EXPECT_NE(old_cub.find(";cccl-cub-200200;"), std::string::npos) << old_cub;
  const std::string none = tree("e", "", "/other.h", "#define NOTHING 1");
  EXPECT_NE(none.find(";cccl-?;"), std::string::npos) << none;
  std::filesystem::remove_all(root);
}

// The headers a compile opens are keyed by their content, not only by the versions they define: a header edited in
// place, or a CCCL development snapshot under an unchanged CCCL_VERSION, kept the identity (and every key), so the
// cache served binaries built against the old text.
TEST(CompilerIdentity, TheHeadersACompileOpensAreKeyedByTheirContent) {
  namespace fs = std::filesystem;
  char tmpl[] = "/tmp/smla-include-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string root = tmpl, inc = root + "/a";
  auto write = [](const std::string& path, const std::string& text) {
    fs::create_directories(fs::path(path).parent_path());
    std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  };
  write(inc + "/cuda.h", "#define CUDA_VERSION 13000\n");
  write(inc + "/cccl/cuda/std/__cccl/version.h", "#define CCCL_VERSION 3000001\n");
  write(inc + "/cccl/cub/agent/sort.cuh", "int sort_a;\n");
  write(inc + "/cuda_bf16.h", "struct bf16_a;\n");
  write(inc + "/cublas_v2.h", "int cublas_a;\n");  // headers our compiles never open
  write(inc + "/cudaEGL.h", "int egl_a;\n");
  const std::string id0 = cuda::NvrtcCompiler(inc).identity(), d0 = cuda::cuda_headers_digest(inc);
  ASSERT_EQ(d0.size(), 32u) << d0;
  EXPECT_NE(id0.find(";cccl-3000001;headers-" + d0 + ";"), std::string::npos) << id0;
  EXPECT_EQ(cuda::cuda_headers_digest(inc), d0) << "the same headers read twice";

  // One toolkit at two places: one digest (a cache warmed on one machine is found on another).
  fs::copy(inc, root + "/b", fs::copy_options::recursive);
  EXPECT_EQ(cuda::cuda_headers_digest(root + "/b"), d0);

  // Edited in place, same size, same versions: a new digest and a new identity.
  write(inc + "/cccl/cub/agent/sort.cuh", "int sort_b;\n");
  const std::string d1 = cuda::cuda_headers_digest(inc);
  EXPECT_NE(d1, d0) << "a CCCL header edited in place kept the digest";
  EXPECT_NE(cuda::NvrtcCompiler(inc).identity(), id0) << "a CCCL header edited in place kept the identity";
  write(inc + "/cuda_bf16.h", "struct bf16_b;\n");
  const std::string d2 = cuda::cuda_headers_digest(inc);
  EXPECT_NE(d2, d1) << "cuda_bf16.h edited in place kept the digest";
  write(inc + "/cccl/cub/agent/new.cuh", "\n");
  const std::string d3 = cuda::cuda_headers_digest(inc);
  EXPECT_NE(d3, d2) << "a header added under cccl/ kept the digest";
  // The same bytes under another name are another tree.
  fs::rename(inc + "/cccl/cub/agent/new.cuh", inc + "/cccl/cub/agent/new2.cuh");
  EXPECT_NE(cuda::cuda_headers_digest(inc), d3) << "a header renamed kept the digest";
  fs::rename(inc + "/cccl/cub/agent/new2.cuh", inc + "/cccl/cub/agent/new.cuh");
  EXPECT_EQ(cuda::cuda_headers_digest(inc), d3);
  // Outside what a compile opens: no new digest, so no recompiles for it.
  // Which of those a machine has depends on its packages: a cache warmed where they differ is still found.
  write(inc + "/cublas_v2.h", "int cublas_b;\n");
  write(inc + "/cudaEGL.h", "int egl_b;\n");
  write(inc + "/cuda_gl_interop.h", "\n");
  write(inc + "/nv/target", "int shadowed;\n");  // CUDA 13 has a top-level nv/ too; cccl/nv is found first
  EXPECT_EQ(cuda::cuda_headers_digest(inc), d3) << "a header no compile opens changed the digest";

  // CUDA 12's layout: CCCL at the top of the include directory.
  const std::string v12 = root + "/c";
  write(v12 + "/cuda.h", "#define CUDA_VERSION 12080\n");
  write(v12 + "/cub/block/block_scan.cuh", "int scan_a;\n");
  write(v12 + "/cuda/std/__cccl/version.h", "#define CCCL_VERSION 2080000\n");
  const std::string e0 = cuda::cuda_headers_digest(v12);
  write(v12 + "/cub/block/block_scan.cuh", "int scan_b;\n");
  EXPECT_NE(cuda::cuda_headers_digest(v12), e0) << "CUB edited in place on CUDA 12's layout kept the digest";
  // A directory link into its own parent ends (no endless walk), and the digest is still worked out.
  fs::create_directory_symlink("..", v12 + "/cub/block/loop");
  EXPECT_EQ(cuda::cuda_headers_digest(v12).size(), 32u);
  // No include directory: nothing read, not the working directory's cub/ (a relative path).
  const fs::path cwd = fs::current_path();
  fs::current_path(v12);
  EXPECT_EQ(cuda::cuda_headers_digest(""), "?");
  fs::current_path(cwd);
  fs::remove_all(root);
}

#ifdef SMLA_TEST_HIP

TEST(HipRtcIdentity, EnvironmentOptionsAreInTheKeyFields) {
  ::unsetenv("HIPRTC_COMPILE_OPTIONS_APPEND");
  ::unsetenv("HIPRTC_LINK_OPTIONS_APPEND");
  EXPECT_EQ(hip::detail::hiprtc_env_options(), "");
  {
    EnvVar empty("HIPRTC_COMPILE_OPTIONS_APPEND", "");
    EXPECT_EQ(hip::detail::hiprtc_env_options(), "") << "empty is unset";
  }
  EnvVar c("HIPRTC_COMPILE_OPTIONS_APPEND", "-mcumode");
  EXPECT_EQ(hip::detail::hiprtc_env_options(), ";HIPRTC_COMPILE_OPTIONS_APPEND=-mcumode");
  EnvVar l("HIPRTC_LINK_OPTIONS_APPEND", "-O1");
  EXPECT_EQ(hip::detail::hiprtc_env_options(),
            ";HIPRTC_COMPILE_OPTIONS_APPEND=-mcumode;HIPRTC_LINK_OPTIONS_APPEND=-O1");
}

TEST(HipRtcIdentity, IdentityChangesWithTheEnvironment) {
  std::string why;
  if (!hip::Api::get(&why)) GTEST_SKIP() << "no hipRTC here: " << why;
  ::unsetenv("HIPRTC_COMPILE_OPTIONS_APPEND");
  ::unsetenv("HIPRTC_LINK_OPTIONS_APPEND");
  hip::HipRtcCompiler rtc(true, SMLA_HIPRTC_WORKER_PATH);
  const std::string plain = rtc.identity();
  std::string with;
  {
    EnvVar c("HIPRTC_COMPILE_OPTIONS_APPEND", "-mcumode");
    with = rtc.identity();
  }
  EXPECT_NE(plain, with);
  EXPECT_EQ(with, plain + ";HIPRTC_COMPILE_OPTIONS_APPEND=-mcumode");
  EXPECT_EQ(rtc.identity(), plain) << "unset again: the old key";
}

TEST(HipWorkerEnvironment, ComgrCacheOffUnlessTheUserSetIt) {
  // Without the SMLA_LIBHIP the environment also gets where a HIP runtime is loaded (hiprtc_worker_test checks it).
  auto env = [](const char* const* e) {
    std::vector<std::string> v = hip::worker_environment(e);
    v.erase(std::remove_if(v.begin(), v.end(), [](const std::string& s) { return s.rfind("SMLA_LIBHIP=", 0) == 0; }),
            v.end());
    return v;
  };
  const char* none[] = {"PATH=/bin", nullptr};
  EXPECT_EQ(env(none), (std::vector<std::string>{"PATH=/bin", "AMD_COMGR_CACHE=0"}));
  const char* mine[] = {"AMD_COMGR_CACHE=1", "PATH=/bin", nullptr};
  EXPECT_EQ(env(mine), (std::vector<std::string>{"AMD_COMGR_CACHE=1", "PATH=/bin"}));
  const char* empty[] = {"AMD_COMGR_CACHE=", nullptr};
  EXPECT_EQ(env(empty), (std::vector<std::string>{"AMD_COMGR_CACHE="}));
}

// What a child started by run_children (as every hipRTC worker is) actually sees.
TEST(HipWorkerEnvironment, ChildrenRunWithComgrCacheOff) {
  ::unsetenv("AMD_COMGR_CACHE");
  hip::TempDir dir("smla-env-test");
  const std::string out = dir.path() + "/env.txt";
  auto st = hip::run_children({{"/bin/sh", "-c", "echo \"cache=[$AMD_COMGR_CACHE]\""}}, 1, {out});
  ASSERT_TRUE(st[0].exited && st[0].code == 0) << st[0].describe();
  std::ifstream in(out);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "cache=[0]\n");
  EXPECT_EQ(std::getenv("AMD_COMGR_CACHE"), nullptr) << "our own environment is untouched";
}
#endif

}  // namespace
}  // namespace smla
