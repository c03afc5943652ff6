// hiprtc_compiler_test.cpp: hipRTC compiles offline (no GPU) into real AMDGPU code objects.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "hip_test_util.hpp"
#include "runtime/hip/amdgpu_elf.hpp"
#include "runtime/hip/hip_api.hpp"
#include "runtime/hip/hip_subprocess.hpp"
#include "runtime/hip/hiprtc_compiler.hpp"

namespace smla::hip {
namespace {

using test::contains;

HipRtcCompiler make_compiler() { return HipRtcCompiler(true, SMLA_HIPRTC_WORKER_PATH); }

// Disassembles with an llvm-objdump that knows amdgcn; empty when there is none. A tool that is there but fails is a
// test failure, not a check quietly dropped.
std::string disassemble(const std::vector<uint8_t>& bin, const std::string& processor) {
  std::string tool = SMLA_LLVM_OBJDUMP;
  if (tool.empty()) return "";
  std::string path = (std::filesystem::temp_directory_path() / ("smla-test-" + processor + ".co")).string();
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bin.data()), bin.size());
  int status = 0;
  std::string out = test::run_command(tool + " -d --mcpu=" + processor + " " + path + " 2>&1", &status);
  std::filesystem::remove(path);
  EXPECT_EQ(status, 0) << tool << " failed on the " << processor << " code object:\n" << out.substr(0, 2000);
  return status == 0 ? out : "";
}

void expect_real_code_object(const CompileResult& r, const std::string& entry, const std::string& processor) {
  ASSERT_GE(r.binary.size(), 64u);
  EXPECT_EQ(0, std::memcmp(r.binary.data(), "\x7f" "ELF", 4));
  ElfInfo elf = read_elf(r.binary);
  ASSERT_TRUE(elf.valid) << elf.error;
  EXPECT_EQ(elf.machine, kEmAmdgpu);
  EXPECT_TRUE(contains(elf.symbols, entry)) << "no symbol " << entry;
  EXPECT_TRUE(contains(elf.symbols, entry + ".kd")) << "no kernel descriptor for " << entry;
  if (std::string(SMLA_LLVM_OBJDUMP).empty()) {
    // Everything above was checked; the test reports as skipped so that the missing check shows in ctest's summary.
    GTEST_SKIP() << "no llvm-objdump for amdgcn here: MFMA not checked in the disassembly";
  }
  std::string dis = disassemble(r.binary, processor);
  if (!dis.empty()) EXPECT_NE(dis.find("v_mfma_f32_32x32x8bf16_1k"), std::string::npos) << dis.substr(0, 2000);
}

TEST(HipRtcCompiler, OptionsAreSortedAndNameTheTarget) {
  auto o = make_compiler().options("gfx90a");
  EXPECT_TRUE(std::is_sorted(o.begin(), o.end()));
  EXPECT_TRUE(contains(o, "--offload-arch=gfx90a"));
  EXPECT_TRUE(contains(o, "-std=c++17"));
  EXPECT_EQ(make_compiler().family(), "hip");
}

TEST(HipRtcCompiler, TargetIds) {
  auto t = hip_known_targets();
  EXPECT_EQ(hip_default_target(), t.front());
  EXPECT_EQ(hip_target_processor(hip_default_target()), "gfx950");
  EXPECT_EQ(hip_target_processor("gfx90a"), "gfx90a");
}

TEST(HipRtcCompiler, IdentityComesFromRuntimeAndClangNotHiprtcVersion) {
  SMLA_REQUIRE_HIPRTC();
  const Api& api = Api::require();
  std::string id = make_compiler().identity();
  EXPECT_NE(id.find("hip-runtime=" + std::to_string(hip_runtime_version(api))), std::string::npos) << id;
  EXPECT_NE(id.find("comgr="), std::string::npos) << id;
  EXPECT_NE(id.find("clang version"), std::string::npos) << id;
  EXPECT_EQ(id, make_compiler().identity());
  std::cout << "[ note ] identity: " << id << "\n";
}

TEST(HipRtcCompiler, CompilesMfmaKernelForGfx90aOffline) {
  SMLA_REQUIRE_HIPRTC();
  auto src = test::mfma_source("smla_test_mfma");
  CompileResult r = make_compiler().compile(src, "gfx90a");
  expect_real_code_object(r, "smla_test_mfma", "gfx90a");
  // A full target id compiles too, and is distinct code (features are in e_flags).
  CompileResult full = make_compiler().compile(src, "gfx90a:sramecc+:xnack-");
  expect_real_code_object(full, "smla_test_mfma", "gfx90a");
  EXPECT_NE(read_elf(r.binary).flags, read_elf(full.binary).flags);
}

TEST(HipRtcCompiler, CompilesForGfx950WhereThisHipRtcKnowsIt) {
  SMLA_REQUIRE_HIPRTC();
  std::string why;
  const std::string target = hip_default_target();
  const detail::ProbeVerdict v = detail::probe_target(target, &why, SMLA_HIPRTC_WORKER_PATH);
  ASSERT_NE(v, detail::ProbeVerdict::NoVerdict) << why;  // a failed probe is a failure, not a skip
  if (v == detail::ProbeVerdict::Refused) {
    // The process must survive asking for it: a clean CompileError, not a hipRTC abort.
    try {
      make_compiler().compile(test::mfma_source("smla_test_mfma"), target);
      ADD_FAILURE() << "compiling for an unknown target did not fail";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::CompileError);
    }
    GTEST_SKIP() << "gfx950 skipped (only this target): " << why;
  }
  expect_real_code_object(make_compiler().compile(test::mfma_source("smla_test_mfma"), target),
                          "smla_test_mfma", "gfx950");
}

TEST(HipRtcCompiler, RefusesProcessorsTheKernelsAreNotWrittenForBeforeAnyCompile) {
  for (const std::string& t : hip_known_targets()) EXPECT_TRUE(hip_target_supported(t, nullptr)) << t;
  for (const char* t : {"gfx90a", "gfx942", "gfx950", "gfx90a:xnack+"}) EXPECT_TRUE(hip_target_supported(t, nullptr)) << t;
  for (const char* t : {"gfx908:sramecc+:xnack-", "gfx908", "gfx1100", "gfx940", "sm_90a", ""}) {
    std::string why;
    EXPECT_FALSE(hip_target_supported(t, &why)) << t;
    EXPECT_NE(why.find(std::string("'") + hip_target_processor(t) + "'"), std::string::npos) << why;
    for (const char* p : {"gfx90a", "gfx942", "gfx950"}) EXPECT_NE(why.find(p), std::string::npos) << why;
  }
  // gfx908 (MI100) has no bf16_1k MFMA: ROCm 5.2's LLVM aborted the whole process compiling for it
  // (its probe passes). Refused before any worker runs: this one would leave a mark.
  TempDir dir("smla-test");
  const std::string mark = dir.path() + "/ran";
  const std::string worker = test::write_script(dir.path(), "smla-hiprtc-worker", "touch '" + mark + "'\nexit 3");
  try {
    HipRtcCompiler(true, worker).compile(test::mfma_source("smla_test_gfx908"), "gfx908:sramecc+:xnack-");
    ADD_FAILURE() << "compiling for gfx908 was not refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::Unsupported) << e.message();
    EXPECT_NE(e.message().find("gfx908"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("gfx950"), std::string::npos) << e.message();
  }
  EXPECT_FALSE(std::filesystem::exists(mark)) << "a worker ran for an unsupported processor";
}

TEST(HipRtcCompiler, TargetIdSyntaxIsCheckedAndRefusedClearly) {
  for (const char* good : {"gfx90a:xnack+:sramecc-", "gfx942:sramecc+", "gfx950:xnack-", "gfx90a:sramecc+:xnack+"})
    EXPECT_TRUE(hip_target_supported(good, nullptr)) << good;
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"gfx90a:xnack", "the feature 'xnack' needs a + or -"},  // hipRTC took it, and the probe crashed
      {"gfx90a:xnack+:xnack-", "the feature xnack is named twice"},  // was taken as xnack-
      {"gfx90a:sramecc+:xnack-:sramecc+", "the feature sramecc is named twice"},
      {"gfx90a:", "unknown feature ''"},
      {"gfx90a::xnack+", "unknown feature ''"},
      {"gfx90a:foo+", "unknown feature 'foo+'"},
      {"gfx90a:xnack+-", "unknown feature 'xnack+-'"},
      {"gfx90a:xnack=1", "unknown feature 'xnack=1'"},
      {"GFX90A", "'GFX90A' is not an AMD processor name"},
      {"gfx", "'gfx' is not an AMD processor name"},
      {"gfx90a xnack+", "'gfx90a xnack+' is not an AMD processor name"},
  };
  TempDir dir("smla-test");
  const std::string mark = dir.path() + "/ran";
  const std::string worker = test::write_script(dir.path(), "smla-hiprtc-worker", "touch '" + mark + "'\nexit 3");
  for (const auto& [target, what] : bad) {
    std::string why;
    EXPECT_FALSE(hip_target_supported(target, &why)) << target;
    EXPECT_NE(why.find("malformed AMD target id '" + target + "': " + what), std::string::npos) << why;
    // Refused as such before any probe, and by warm-up's expansion left as given for that.
    EXPECT_FALSE(hip_target_known(target, &why, worker)) << target;
    EXPECT_NE(why.find("malformed AMD target id"), std::string::npos) << why;
    EXPECT_EQ(hip_target_ids(target), std::vector<std::string>{target});
  }
  EXPECT_FALSE(std::filesystem::exists(mark)) << "a worker probed a malformed target id";
}

TEST(HipRtcCompiler, TargetKnownThrowsNothingWithoutATemporaryDirectory) {
  detail::forget_probes();
  std::string why;
  bool known = true;
  {
    test::ScopedEnv tmp("TMPDIR", "/nonexistent/smla-tmp");
    EXPECT_NO_THROW(known = hip_target_known("gfx90a", &why, SMLA_HIPRTC_WORKER_PATH));
  }
  EXPECT_FALSE(known);
  EXPECT_NE(why.find("TMPDIR='/nonexistent/smla-tmp'"), std::string::npos) << why;
  EXPECT_NE(why.find("set it to an existing writable directory"), std::string::npos) << why;
  EXPECT_EQ(why.find("cannot compile"), std::string::npos) << "no verdict without a probe: " << why;
  detail::forget_probes();
}

TEST(HipRtcCompiler, CompilesInTheWorkerSoThatACompilerCrashIsAnError) {
  SMLA_REQUIRE_HIPRTC();
  // What plan() calls: the probe passes, then the compile's worker dies as LLVM's abort would kill it.
  TempDir dir("smla-test");
  const std::string worker = test::probe_passing_worker(dir.path(), "smla-hiprtc-worker", "kill -ABRT $$");
  try {
    HipRtcCompiler(true, worker).compile(test::mfma_source("smla_test_crash"), "gfx90a");
    ADD_FAILURE() << "the compile did not go through the worker (it would have died with it)";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::CompileError);
    EXPECT_NE(e.message().find("killed by signal 6"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("smla_test_crash"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("source dumped to "), std::string::npos) << e.message();
  }
}

TEST(HipRtcCompiler, WithoutAWorkerRefusesWhatThisRocmCannotCompileAndCompilesTheRest) {
  SMLA_REQUIRE_HIPRTC();
  HipRtcCompiler here(true, "/nonexistent/smla-hiprtc-worker");
  const ElfInfo elf = read_elf(here.compile(test::mfma_source("smla_test_here"), "gfx90a").binary);
  ASSERT_TRUE(elf.valid) << elf.error;
  EXPECT_TRUE(contains(elf.symbols, "smla_test_here"));
  if (hip_runtime_version(Api::require()) >= 70000000) GTEST_SKIP() << "this ROCm (>= 7.0) compiles for gfx950";
  // ROCm 5.2's hipRTC died in this process on gfx950 (munmap_chunk(): invalid pointer), logging nothing.
  try {
    here.compile(test::mfma_source("smla_test_here"), "gfx950");
    ADD_FAILURE() << "gfx950 compiled with ROCm < 7";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::CompileError);
    EXPECT_NE(e.message().find("gfx950 needs ROCm >= 7.0"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("SMLA_HIPRTC_WORKER"), std::string::npos) << e.message();
  }
}

// Without a worker hipRTC runs in this process: smla must not write the caller's environment there (setenv races every
// other thread's getenv). The old code set AMD_COMGR_CACHE=0 at the first in-process compile or identity probe.
TEST(HipRtcCompiler, AnInProcessCompileLeavesTheEnvironmentAlone) {
  SMLA_REQUIRE_HIPRTC();
  ASSERT_EQ(::unsetenv("AMD_COMGR_CACHE"), 0);
  HipRtcCompiler here(true, "/nonexistent/smla-hiprtc-worker");
  detail::forget_identity();  // its probe compiles here too, without a worker
  EXPECT_NE(here.identity().find("clang="), std::string::npos);
  EXPECT_EQ(std::getenv("AMD_COMGR_CACHE"), nullptr) << "the identity's in-process probe set it";
  const ElfInfo elf = read_elf(here.compile(test::mfma_source("smla_test_env"), "gfx90a").binary);
  EXPECT_TRUE(elf.valid) << elf.error;
  EXPECT_EQ(std::getenv("AMD_COMGR_CACHE"), nullptr) << "the in-process compile set it";
  detail::forget_identity();
}

// A worker that cannot open hipRTC (exit 4: the runtime is reachable only from the parent) gives the probe no verdict,
// and the compile falls back to this process: there the same guard as without a worker must hold (ROCm 5.2's hipRTC
// killed this process on gfx950), not an in-process compile of a target this ROCm is too old for.
TEST(HipRtcCompiler, AWorkerWithoutHipRtcKeepsTheGuardOfNoWorker) {
  SMLA_REQUIRE_HIPRTC();
  if (hip_runtime_version(Api::require()) >= 70000000) GTEST_SKIP() << "this ROCm (>= 7.0) compiles for gfx950";
  TempDir dir("smla-test");
  const std::string no_rtc = test::write_script(dir.path(), "w-no-rtc", "exit 4");
  detail::forget_probes();
  HipRtcCompiler c(true, no_rtc);
  try {
    c.compile(test::mfma_source("smla_test_no_rtc"), "gfx950");
    ADD_FAILURE() << "gfx950 compiled with ROCm < 7";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::CompileError);
    EXPECT_NE(e.message().find("gfx950 needs ROCm >= 7.0"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("could not open hipRTC to probe it"), std::string::npos) << e.message();
  }
  // what this ROCm knows still compiles here
  const ElfInfo elf = read_elf(c.compile(test::mfma_source("smla_test_no_rtc"), "gfx90a").binary);
  EXPECT_TRUE(elf.valid) << elf.error;
  detail::forget_probes();
}

TEST(HipRtcCompiler, CompileErrorCarriesLogAndDumpedSource) {
  SMLA_REQUIRE_HIPRTC();
  RenderedSource bad{"smla_broken.hip", "extern \"C\" __global__ void k() { this is not c++; }\n", {}};
  try {
    make_compiler().compile(bad, "gfx90a");
    FAIL() << "a broken source compiled";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::CompileError);
    EXPECT_EQ(e.call(), "hiprtcCompileProgram");
    EXPECT_NE(e.message().find("error"), std::string::npos) << e.message();  // the log
    auto at = e.message().find("source dumped to ");
    ASSERT_NE(at, std::string::npos) << e.message();
    std::string path = e.message().substr(at + 17, e.message().find('\n', at) - at - 17);
    if (!std::getenv("SMLA_DUMP_DIR"))  // the default: this user's own directory
      EXPECT_NE(path.find("smla-failed-" + std::to_string(::geteuid()) + "/smla_broken-"), std::string::npos) << path;
    EXPECT_EQ(test::read_text(path), bad.text);
  }
}

TEST(HipTargetProbe, OnlyADefiniteRefusalIsAVerdictAgainst) {
  using detail::ProbeVerdict;
  auto verdict = [](int exit_status, int signal, bool timed_out = false) {
    HipWorkerResult r;
    r.exit_status = exit_status;
    r.signal = signal;
    r.timed_out = timed_out;
    return detail::probe_verdict(r);
  };
  EXPECT_EQ(verdict(2, 0), ProbeVerdict::Refused);  // hipRTC's error on a one-line kernel
  for (int sig : {SIGABRT, SIGSEGV, SIGBUS, SIGILL, SIGFPE}) EXPECT_EQ(verdict(-1, sig), ProbeVerdict::Refused) << sig;
  for (int sig : {SIGKILL, SIGTERM, SIGINT, SIGHUP}) EXPECT_EQ(verdict(-1, sig), ProbeVerdict::NoVerdict) << sig;
  EXPECT_EQ(verdict(-1, SIGKILL, true), ProbeVerdict::TimedOut);  // stopped at the time limit: no verdict either
  // 6: hipRTC failed outside the compile (creating the program, out of memory): nothing said of the target
  for (int code : {1, 3, 4, 5, 6, 127}) EXPECT_EQ(verdict(code, 0), ProbeVerdict::NoVerdict) << code;
  EXPECT_EQ(verdict(-1, 0), ProbeVerdict::NoVerdict);  // could not start, status lost
  HipWorkerResult junk;
  junk.ok = true;
  junk.exit_status = 0;
  junk.result.binary = {1, 2, 3};
  EXPECT_EQ(detail::probe_verdict(junk), ProbeVerdict::Refused);
}

TEST(HipTargetProbe, AKilledProbeIsNoVerdictAndTheNextProbeDecides) {
  detail::forget_probes();
  TempDir dir("smla-test");
  const std::string target = "gfx90a:sramecc+:xnack-";
  std::string why;
  // The OOM killer's SIGKILL, a SIGTERM, a timeout: nothing about the target. They were cached
  // for the process's life as "hipRTC cannot compile for gfx90a".
  for (const char* sig : {"KILL", "TERM"}) {
    const std::string w = test::write_script(dir.path(), std::string("w-") + sig, std::string("kill -") + sig + " $$");
    EXPECT_EQ(detail::probe_target(target, &why, w), detail::ProbeVerdict::NoVerdict) << sig;
    EXPECT_NE(why.find("gave no verdict"), std::string::npos) << why;
    EXPECT_EQ(why.find("cannot compile"), std::string::npos) << why;
  }
  SMLA_REQUIRE_HIPRTC();
  EXPECT_TRUE(hip_target_known(target, &why, SMLA_HIPRTC_WORKER_PATH)) << why;
  detail::forget_probes();
}

// The compiler identity's probe: a worker killed on it (the OOM killer, a SIGTERM) is an error of this plan(), not a
// reason to run hipRTC in this process, where a crash ends the host. A worker without hipRTC (exit 4) leaves the probe
// to this process, as compile() does.
TEST(HipRtcCompiler, AKilledIdentityProbeIsAnErrorNotAnInProcessCompile) {
  SMLA_REQUIRE_HIPRTC();
  TempDir dir("smla-test");
  detail::forget_probes();
  detail::forget_identity();
  const std::string killed = test::write_script(dir.path(), "w-kill", "kill -KILL $$");
  auto expect_unknown = [&](const char* when) {
    try {
      const std::string id = HipRtcCompiler(true, killed).identity();
      ADD_FAILURE() << when << ": the identity came from a compile in this process: " << id;
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::CompileError) << when;
      EXPECT_NE(e.message().find("identity (part of every AMD cache key) is unknown"), std::string::npos)
          << when << ": " << e.message();
      EXPECT_NE(e.message().find("gave no verdict"), std::string::npos) << when << ": " << e.message();
    }
  };
  expect_unknown("killed");
  // With SIGCHLD ignored (a daemon's habit) the killed worker's exit status is lost and it wrote no status file: it
  // still ran, and this process still compiles nothing.
  {
    struct sigaction ign {}, old {};
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    ASSERT_EQ(sigaction(SIGCHLD, &ign, &old), 0);
    detail::forget_probes();
    expect_unknown("killed, SIGCHLD ignored");
    sigaction(SIGCHLD, &old, nullptr);
  }
  const std::string no_rtc = test::write_script(dir.path(), "w-no-rtc", "exit 4");
  const std::string id = HipRtcCompiler(true, no_rtc).identity();
  EXPECT_NE(id.find("clang version"), std::string::npos) << id;
  // Computed once: a killed worker now changes nothing.
  EXPECT_EQ(HipRtcCompiler(true, killed).identity(), id);
  detail::forget_probes();
}

TEST(HipTargetProbe, ACrashOnTheProbeIsCachedAndNamesTheRocmOnlyWhereOneIsNeeded) {
  detail::forget_probes();
  TempDir dir("smla-test");
  const std::string aborts = test::write_script(dir.path(), "w-abrt", "echo 'LLVM ERROR: fake' >&2\nkill -ABRT $$");
  std::string why;
  EXPECT_EQ(detail::probe_target("gfx942:sramecc+:xnack-", &why, aborts), detail::ProbeVerdict::Refused);
  EXPECT_NE(why.find("hipRTC cannot compile for gfx942:sramecc+:xnack-"), std::string::npos) << why;
  EXPECT_NE(why.find("killed by signal 6"), std::string::npos) << why;
  EXPECT_NE(why.find("LLVM ERROR: fake"), std::string::npos) << why;
  EXPECT_NE(why.find("gfx942 needs ROCm >= 5.7"), std::string::npos) << why;
  // Cached: no worker runs for it again.
  const std::string mark = dir.path() + "/ran";
  const std::string marks = test::write_script(dir.path(), "w-mark", "touch '" + mark + "'\nexit 3");
  EXPECT_FALSE(hip_target_known("gfx942:sramecc+:xnack-", &why, marks));
  EXPECT_NE(why.find("hipRTC cannot compile"), std::string::npos) << why;
  EXPECT_FALSE(std::filesystem::exists(mark));
  // gfx90a: every ROCm smla loads knows it, so no version is named.
  EXPECT_EQ(detail::probe_target("gfx90a:sramecc-:xnack+", &why, aborts), detail::ProbeVerdict::Refused);
  EXPECT_EQ(why.find("ROCm >="), std::string::npos) << why;
  detail::forget_probes();
}

TEST(AmdgpuElf, RejectsWhatIsNotAnAmdgpuObject) {
  EXPECT_FALSE(read_elf({}).valid);
  std::vector<uint8_t> junk(128, 0x41);
  EXPECT_FALSE(read_elf(junk).valid);
  // A host ELF (this test binary) is an ELF, but not EM_AMDGPU.
  std::ifstream f("/proc/self/exe", std::ios::binary);
  std::vector<uint8_t> self(4096);
  f.read(reinterpret_cast<char*>(self.data()), self.size());
  ElfInfo e = read_elf(self);
  EXPECT_FALSE(e.valid);
  EXPECT_NE(e.error.find("EM_AMDGPU"), std::string::npos) << e.error;
}

}  // namespace
}  // namespace smla::hip
