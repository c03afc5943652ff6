// test_kernel_key.cpp: the cache key of a kernel covers its translation unit and nothing else:
// entries of one source share a binary; T never enters the key (a new T must not recompile).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "runtime/cuda/kernels_cuda.hpp"
#include "runtime/cuda/nvrtc_compiler.hpp"
#include "runtime/env.hpp"
#include "runtime/kernel_key.hpp"
#include "runtime/planner.hpp"

namespace smla {
namespace {

// The distinct kernels a plan of this T and H compiles (T also changes the chunking).
std::set<std::string> digests_for(int64_t T, int64_t H) {
  Problem p;
  p.T = T, p.H = H, p.num_kv = 5120, p.topk = 512, p.has_sink = true;
  const ShapeInfo s = choose_shape(p, runtime_env().interm_budget);
  KernelSources src;
  cuda::NvrtcCompiler nvrtc;
  std::set<std::string> out;
  // A key that ignored its inputs would make equal sets everywhere: one digest for each distinct translation unit
  // (source and defines; entries of one unit share it, KernelKey.EntriesOfOneSourceShareABinary), no fewer.
  std::set<std::pair<std::string, std::vector<std::pair<std::string, long long>>>> units;
  for (const Step& st : order_steps(s, cuda_phase_kernels)) {
    out.insert(cache::make_key(kernel_key_fields(st.spec, src, nvrtc, "sm_90a", nullptr)).digest);
    units.insert({st.spec.stem, st.spec.defines});
  }
  EXPECT_EQ(out.size(), units.size()) << "T " << T << " H " << H;
  EXPECT_GE(out.size(), 5u);  // delta or dq, dkv, csr, gather, d_sink at least
  return out;
}

// Only #include directives attach a header (and enter the key): one named in a comment made a source tree's render fail
// ("not in the source directory"), or put a real header's bytes in the key of kernels that do not include it.
TEST(KernelSources, CommentedIncludesAreNotIncludes) {
  EXPECT_EQ(without_comments("a // b\nc /* d\ne */ f \"//g\" '/' /*"), "a  \nc  \n f \"//g\" '/'  ");
  // An escaped quote does not end a literal: the "/*" after it is text, not a comment hiding the next line.
  EXPECT_EQ(without_comments("s = \"\\\" /* \";\n#include \"x.h\" // y"), "s = \"\\\" /* \";\n#include \"x.h\"  ");
  char tmpl[] = "/tmp/smla-src-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  auto put = [&](const std::string& name, const std::string& text) { std::ofstream(dir + "/" + name) << text; };
  put("real.cuh", "int real_one;\n");
  put("delta.cu",
      "// once: #include \"old_helpers.cuh\"\n"
      "/* #include \"gone.cuh\"\n   #include \"also_gone.cuh\" */\n"
      "const char* s = \"#include \\\"in_a_string.cuh\\\"\";\n"
      "const char* t = \"\\\" /* \";\n"
      "  #  include \"real.cuh\"\n");
  const KernelSpec spec = make_spec("delta", "smla_delta", {}, grid_xy(1), 32);
  const RenderedSource r = KernelSources(dir).render(spec, "cuda");
  ASSERT_EQ(r.headers.size(), 1u);
  EXPECT_EQ(r.headers[0].first, "real.cuh");
  put("delta.cu", "#include \"missing.cuh\"\n");  // a directive still must be there
  EXPECT_THROW(KernelSources(dir).render(spec, "cuda"), Error);
  std::filesystem::remove_all(dir);
}

TEST(KernelKey, EntriesOfOneSourceShareABinary) {
  Problem p;
  p.T = 4096, p.H = 128, p.num_kv = 5120, p.topk = 512;
  const ShapeInfo s = choose_shape(p, runtime_env().interm_budget);
  const auto csr = cuda_phase_kernels(Phase::Csr, s);
  ASSERT_GT(csr.size(), 1u);
  KernelSources src;
  cuda::NvrtcCompiler nvrtc;
  const auto first = cache::make_key(kernel_key_fields(csr.front(), src, nvrtc, "sm_90a", nullptr)).digest;
  for (const auto& k : csr) {
    EXPECT_EQ(cache::make_key(kernel_key_fields(k, src, nvrtc, "sm_90a", nullptr)).digest, first) << k.entry;
  }
}

// The in-process kernel map keys a kernel by its defines' names and values: two kernels of one stem that differ in one
// define's value only (csr's radix digit width, which follows num_kv) are two kernels, not one loaded for both.
TEST(KernelKey, EachDefineValueIsItsOwnKernel) {
  KernelSpec a;
  a.stem = "csr", a.entry = "smla_csr_count", a.defines = {{"CSR_RADIX_BITS", 5}, {"UNROLL", 4}};
  KernelSpec b = a;
  b.defines[0].second = 6;
  EXPECT_NE(defines_id(a), defines_id(b));
  EXPECT_NE(defines_tag(a), defines_tag(b));
  // The planner's own pair: csr at two pool sizes.
  Problem p;
  p.T = 4096, p.H = 128, p.num_kv = 5120, p.topk = 512;
  const auto small = cuda_phase_kernels(Phase::Csr, choose_shape(p, runtime_env().interm_budget));
  p.num_kv = 70000;
  const auto large = cuda_phase_kernels(Phase::Csr, choose_shape(p, runtime_env().interm_budget));
  ASSERT_FALSE(small.empty());
  ASSERT_FALSE(large.empty());
  ASSERT_NE(small.front().defines, large.front().defines) << "the premise: csr's defines follow num_kv";
  EXPECT_NE(defines_id(small.front()), defines_id(large.front()));
}

TEST(KernelKey, ANewTDoesNotChangeAnyKernel) {
  EXPECT_EQ(digests_for(4096, 128), digests_for(12288, 128));
  EXPECT_EQ(digests_for(1, 128), digests_for(777, 128));
  EXPECT_NE(digests_for(4096, 128), digests_for(4096, 64));  // H is compiled in
}

TEST(KernelKey, TargetAndOptionsAreInTheKey) {
  Problem p;
  p.T = 64, p.H = 64, p.num_kv = 100, p.topk = 64;
  const ShapeInfo s = choose_shape(p, runtime_env().interm_budget);
  const KernelSpec dq = cuda_phase_kernels(Phase::Dq, s).front();
  KernelSources src;
  cuda::NvrtcCompiler nvrtc;
  const auto a = cache::make_key(kernel_key_fields(dq, src, nvrtc, "sm_90a", nullptr));
  const auto b = cache::make_key(kernel_key_fields(dq, src, nvrtc, "sm_80", nullptr));
  EXPECT_NE(a.digest, b.digest);
  EXPECT_NE(a.entry_name().find("dq"), std::string::npos) << a.entry_name();  // readable tag first

  // The options: the fields carry the compiler's options for the target, and a change of one changes the key (with
  // the target held: above, the target alone would have told the two apart).
  const cache::KeyFields f = kernel_key_fields(dq, src, nvrtc, "sm_90a", nullptr);
  EXPECT_FALSE(f.options.empty());
  EXPECT_EQ(f.options, nvrtc.options("sm_90a"));
  EXPECT_EQ(f.compiler_id, nvrtc.identity());
  cache::KeyFields g = f;
  g.options.push_back("-DSMLA_SOMETHING_ELSE=1");
  EXPECT_NE(cache::make_key(f).digest, cache::make_key(g).digest);
}

}  // namespace
}  // namespace smla
