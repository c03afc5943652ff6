// hiprtc_worker_test.cpp: parallel warm-up through smla-hiprtc-worker subprocesses.
#include <gtest/gtest.h>

#include <algorithm>

#include <locale>

#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "hip_test_util.hpp"
#include "runtime/hip/amdgpu_elf.hpp"
#include "runtime/hip/hip_api.hpp"
#include "runtime/hip/hip_subprocess.hpp"
#include "runtime/hip/hiprtc_compiler.hpp"

extern char** environ;

namespace smla::hip {
namespace {

TEST(HipRtcWorker, IsFound) {
  EXPECT_EQ(hip_worker_path(SMLA_HIPRTC_WORKER_PATH), SMLA_HIPRTC_WORKER_PATH);
  EXPECT_EQ(hip_worker_path("/nonexistent/smla-hiprtc-worker"), "");
}

TEST(HipRtcWorker, CompilesManySourcesInParallel) {
  SMLA_REQUIRE_HIPRTC();
  const int n = 5;
  std::vector<RenderedSource> srcs;
  for (int i = 0; i < n; ++i) srcs.push_back(test::mfma_source("smla_worker_k" + std::to_string(i)));
  auto results = hip_compile_in_subprocesses(srcs, "gfx90a", 3, SMLA_HIPRTC_WORKER_PATH);
  ASSERT_EQ(results.size(), srcs.size());
  for (int i = 0; i < n; ++i) {
    SCOPED_TRACE(i);
    ASSERT_TRUE(results[i].ok) << results[i].error;
    ElfInfo elf = read_elf(results[i].result.binary);
    ASSERT_TRUE(elf.valid) << elf.error;
    EXPECT_EQ(elf.machine, kEmAmdgpu);
    // Each result is its own source's object, in input order.
    std::string entry = "smla_worker_k" + std::to_string(i);
    EXPECT_TRUE(test::contains(elf.symbols, entry));
    for (int j = 0; j < n; ++j) {
      if (j == i) continue;
      EXPECT_FALSE(test::contains(elf.symbols, "smla_worker_k" + std::to_string(j)));
    }
  }
  // Same bytes as an in-process compile: the worker is the same compiler, only elsewhere.
  CompileResult here = HipRtcCompiler(true, SMLA_HIPRTC_WORKER_PATH).compile(srcs[0], "gfx90a");
  EXPECT_EQ(here.binary, results[0].result.binary);
}

TEST(HipRtcWorker, ReportsFailuresPerSource) {
  SMLA_REQUIRE_HIPRTC();
  std::vector<RenderedSource> srcs = {
      test::mfma_source("smla_worker_ok"),
      {"smla_worker_bad.hip", "extern \"C\" __global__ void k() { undeclared_thing(); }\n", {}}};
  auto r = hip_compile_in_subprocesses(srcs, "gfx90a", 2, SMLA_HIPRTC_WORKER_PATH);
  EXPECT_TRUE(r[0].ok) << r[0].error;
  EXPECT_FALSE(r[1].ok);
  EXPECT_NE(r[1].error.find("exit status 2"), std::string::npos) << r[1].error;
  EXPECT_NE(r[1].result.log.find("undeclared_thing"), std::string::npos) << r[1].result.log;
  EXPECT_NE(r[1].result.log.find("source dumped to"), std::string::npos) << r[1].result.log;
}

TEST(HipRtcWorker, AWorkerCrashDoesNotTakeThisProcessDown) {
  SMLA_REQUIRE_HIPRTC();
  // gfx908 has no bf16_1k MFMA: ROCm 5.2's hipRTC aborts on it (LLVM "Cannot select"); newer
  // ones report an error. Either way only the worker fails.
  auto r = hip_compile_in_subprocesses({test::mfma_source("smla_worker_gfx908")}, "gfx908", 1,
                                       SMLA_HIPRTC_WORKER_PATH);
  EXPECT_FALSE(r[0].ok);
  EXPECT_FALSE(r[0].error.empty());
  if (r[0].error.find("signal") != std::string::npos) {  // then what it printed is in the error
    EXPECT_NE(r[0].error.find("worker output: "), std::string::npos) << r[0].error;
  }
  std::cout << "[ note ] gfx908 + bf16_1k MFMA: " << r[0].error.substr(0, 200) << "\n";
}

// A worker that cannot open hipRTC where this process can (a HIP runtime only this process holds): its reason is
// named, and plan()'s compile goes on here instead of failing every kernel. A worker that refuses its arguments (of
// another smla version) is named as such, with no source dumped.
TEST(HipRtcWorker, AWorkerWithoutHipRtcFallsBackToThisProcess) {
  SMLA_REQUIRE_HIPRTC();
  TempDir dir("smla-test");
  const std::string no_rtc = test::probe_passing_worker(
      dir.path(), "no-rtc", "eval log=\\${$#}\nprintf 'libamdhip64 not found (fake)' > \"$log\"\nexit 4");
  auto r = hip_compile_in_subprocesses({test::mfma_source("smla_fallback")}, "gfx90a", 1, no_rtc);
  EXPECT_EQ(r[0].exit_status, 4);
  EXPECT_NE(r[0].error.find("libamdhip64 not found (fake)"), std::string::npos) << r[0].error;
  const CompileResult c = HipRtcCompiler(true, no_rtc).compile(test::mfma_source("smla_fallback"), "gfx90a");
  EXPECT_GT(c.binary.size(), 4u);
  const std::string old = test::probe_passing_worker(dir.path(), "old", "echo 'usage: smla-hiprtc-worker ...' >&2\nexit 3");
  try {
    HipRtcCompiler(true, old).compile(test::mfma_source("smla_old"), "gfx90a");
    ADD_FAILURE() << "a worker refusing its arguments compiled";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("another smla version"), std::string::npos) << e.message();
    EXPECT_EQ(e.message().find("source dumped"), std::string::npos) << e.message();
  }
}

// A worker whose hipRTC failed outside the compile (exit 6: creating the program, copying the code out, out of
// memory) fails that compile with what it said, no source dump (the source is not at fault) and no talk of another
// smla version (exit 3's hint).
TEST(HipRtcWorker, AFailureOutsideTheCompileIsNotTheSources) {
  SMLA_REQUIRE_HIPRTC();
  TempDir dir("smla-test");
  const std::string oom = test::probe_passing_worker(
      dir.path(), "oom", "eval log=\\${$#}\nprintf 'hiprtcCreateProgram failed: out of memory (fake)' > \"$log\"\nexit 6");
  try {
    HipRtcCompiler(true, oom).compile(test::mfma_source("smla_oom"), "gfx90a");
    ADD_FAILURE() << "a worker that exited 6 compiled";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::CompileError);
    EXPECT_NE(e.message().find("could not compile smla_oom"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("out of memory (fake)"), std::string::npos) << e.message();
    EXPECT_EQ(e.message().find("source dumped"), std::string::npos) << e.message();
    EXPECT_EQ(e.message().find("another smla version"), std::string::npos) << e.message();
  }
}

// A worker that compiled but could not write its code object (a full or unwritable temporary directory) exits 7, not
// exit 3's "bad usage" (whose message asked whether it was another smla version's); the parent says so, with no
// source dumped (the source is not at fault).
TEST(HipRtcWorker, AResultItCannotWriteIsNamedAsSuch) {
  SMLA_REQUIRE_HIPRTC();
  TempDir dir("smla-test");
  const std::string base = dir.path() + "/x";
  detail::write_request(base + ".req", test::mfma_source("smla_nowrite"), "gfx90a", HipRtcCompiler().options("gfx90a"));
  auto st = run_children({{SMLA_HIPRTC_WORKER_PATH, "--parent", std::to_string(getpid()), base + ".req",
                           dir.path() + "/missing/x.co", base + ".log"}},
                         1, {base + ".out"}, 120);
  ASSERT_TRUE(st[0].exited) << st[0].describe();
  EXPECT_EQ(st[0].code, 7) << test::read_text(base + ".log") << test::read_text(base + ".out");
  EXPECT_NE(test::read_text(base + ".out").find("cannot write " + dir.path() + "/missing/x.co"), std::string::npos)
      << test::read_text(base + ".out");
  const std::string full = test::probe_passing_worker(
      dir.path(), "full", "echo 'smla-hiprtc-worker: compiled, but cannot write /tmp/x.co (fake)' >&2\nexit 7");
  try {
    HipRtcCompiler(true, full).compile(test::mfma_source("smla_full"), "gfx90a");
    ADD_FAILURE() << "a worker that exited 7 compiled";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::CompileError);
    EXPECT_NE(e.message().find("compiled smla_full.hip for gfx90a but could not hand back its result"), std::string::npos)
        << e.message();
    EXPECT_NE(e.message().find("cannot write /tmp/x.co (fake)"), std::string::npos) << e.message();
    EXPECT_EQ(e.message().find("another smla version"), std::string::npos) << e.message();
    EXPECT_EQ(e.message().find("source dumped"), std::string::npos) << e.message();
  }
}

// Workers open the HIP runtime this process uses (one a framework already loaded included), unless the user named one.
TEST(HipRtcWorker, WorkersAreToldWhichHipRuntimeThisProcessUses) {
  SMLA_REQUIRE_HIPRTC();
  const std::string lib = Api::get()->hip_library;
  const char* base[] = {"PATH=/bin", nullptr};
  EXPECT_TRUE(test::contains(worker_environment(base), "SMLA_LIBHIP=" + lib)) << lib;
  const char* user[] = {"SMLA_LIBHIP=/opt/rocm/lib/libamdhip64.so.6", nullptr};
  const std::vector<std::string> env = worker_environment(user);
  EXPECT_EQ(std::count_if(env.begin(), env.end(), [](const std::string& e) { return e.rfind("SMLA_LIBHIP=", 0) == 0; }),
            1);
  EXPECT_TRUE(test::contains(env, "SMLA_LIBHIP=/opt/rocm/lib/libamdhip64.so.6"));
}

TEST(HipRtcWorker, MissingWorkerIsAClearError) {
  try {
    hip_compile_in_subprocesses({test::mfma_source("x")}, "gfx90a", 1, "/nonexistent/smla-hiprtc-worker");
    FAIL() << "no error without a worker";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::CompileError);
    EXPECT_NE(e.message().find("smla-hiprtc-worker"), std::string::npos);
  }
}

TEST(HipRtcWorker, AHungWorkerIsKilledAfterTheTimeout) {
  // A worker that never ends (hipRTC stuck on a file system, a deadlock) hung warm-up and plan() for ever.
  TempDir dir("smla-test");
  const std::string pid_file = dir.path() + "/pid";
  const std::string worker = test::write_script(dir.path(), "smla-hiprtc-worker", "echo $$ > '" + pid_file + "'\nexec sleep 30");
  test::ScopedEnv timeout("SMLA_HIPRTC_TIMEOUT_S", "1");
  const auto t0 = std::chrono::steady_clock::now();
  auto r = hip_compile_in_subprocesses({test::mfma_source("smla_hung")}, "gfx90a", 1, worker);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 15.0) << "the hung worker was waited for";
  EXPECT_GE(s, 0.9);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_FALSE(r[0].ok);
  EXPECT_NE(r[0].error.find("timed out after 1 s"), std::string::npos) << r[0].error;
  // Killed and reaped: its pid names no process any more (not even a zombie).
  const pid_t pid = static_cast<pid_t>(std::atol(test::read_text(pid_file).c_str()));
  ASSERT_GT(pid, 0);
  EXPECT_NE(kill(pid, 0), 0) << "worker " << pid << " still exists";
}

// The compile plan() runs fails the same way, in time (it needs hipRTC here: the compiler opens it first).
TEST(HipRtcWorker, APlanCompileWithAHungWorkerFailsInTime) {
  SMLA_REQUIRE_HIPRTC();
  TempDir dir("smla-test");
  const std::string worker = test::write_script(dir.path(), "smla-hiprtc-worker", "exec sleep 30");
  test::ScopedEnv timeout("SMLA_HIPRTC_TIMEOUT_S", "1");
  detail::forget_probes();
  const auto t0 = std::chrono::steady_clock::now();
  try {
    HipRtcCompiler(true, worker).compile(test::mfma_source("smla_hung"), "gfx90a");
    ADD_FAILURE() << "a hung worker compiled";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("timed out after 1 s"), std::string::npos) << e.message();
  }
  // One time limit, not two: the probe's timeout fails the compile (it then waited for the compile's own as well).
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.8);
  detail::forget_probes();
}

TEST(HipRtcWorker, TimeoutKnobIsReadOrIgnoredWithAWarning) {
  std::string w;
  EXPECT_EQ(detail::parse_timeout_s(nullptr, &w), 600.0);
  EXPECT_EQ(detail::parse_timeout_s("", &w), 600.0);
  EXPECT_TRUE(w.empty()) << w;
  EXPECT_EQ(detail::parse_timeout_s("2.5", &w), 2.5);
  EXPECT_EQ(detail::parse_timeout_s("1200", &w), 1200.0);
  EXPECT_TRUE(w.empty()) << w;
  for (const char* bad : {"abc", "0", "-5", "10s", "inf", "nan", " "}) {
    w.clear();
    EXPECT_EQ(detail::parse_timeout_s(bad, &w), 600.0) << bad;
    EXPECT_NE(w.find(std::string("ignoring SMLA_HIPRTC_TIMEOUT_S='") + bad + "'"), std::string::npos) << w;
  }
  test::ScopedEnv env("SMLA_HIPRTC_TIMEOUT_S", "7");
  EXPECT_EQ(hip_worker_timeout_s(), 7.0);
  // A huge limit is a limit never reached (its poll interval once overflowed an int).
  EXPECT_EQ(detail::parse_timeout_s("1e300", &w), 1e300);
  const std::vector<ChildStatus> st = run_children({{"/bin/sh", "-c", "sleep 0.2; exit 4"}}, 1, {}, 1e300);
  ASSERT_TRUE(st[0].exited) << st[0].describe();
  EXPECT_EQ(st[0].code, 4);
}

// SIGCHLD set to SIG_IGN for one scope, as servers and daemons often do: the kernel then reaps
// every child itself and waitpid fails with ECHILD.
class IgnoreSigchld {
 public:
  IgnoreSigchld() {
    struct sigaction sa {};
    sa.sa_handler = SIG_IGN;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGCHLD, &sa, &old_);
  }
  ~IgnoreSigchld() { sigaction(SIGCHLD, &old_, nullptr); }

 private:
  struct sigaction old_ {};
};

TEST(HipRtcWorker, WorksInAProcessThatIgnoresSigchld) {
  TempDir dir("smla-test");
  IgnoreSigchld ignore;
  // A worker that ended normally was reported as "could not start: waitpid: No child processes".
  const std::string fails = test::write_script(dir.path(), "w-fail",
                                               "for a; do log=$a; done\necho 'fake compile error' > \"$log\"\n"
                                               "[ \"$1\" = --status ] && echo 2 > \"$2\"\nexit 2");
  auto r = hip_compile_in_subprocesses({test::mfma_source("smla_ign")}, "gfx90a", 1, fails);
  EXPECT_FALSE(r[0].ok);
  EXPECT_EQ(r[0].exit_status, 2) << r[0].error;
  EXPECT_NE(r[0].error.find("exit status 2; fake compile error"), std::string::npos) << r[0].error;
  // One that died wrote no status: that is said, and it is not taken for one that could not start.
  const std::string killed = test::write_script(dir.path(), "w-kill", "kill -KILL $$");
  r = hip_compile_in_subprocesses({test::mfma_source("smla_ign")}, "gfx90a", 1, killed);
  EXPECT_FALSE(r[0].ok);
  EXPECT_NE(r[0].error.find("SIGCHLD"), std::string::npos) << r[0].error;
  EXPECT_NE(r[0].error.find("died before finishing"), std::string::npos) << r[0].error;
  EXPECT_EQ(r[0].error.find("could not start"), std::string::npos) << r[0].error;
  EXPECT_EQ(detail::probe_verdict(r[0]), detail::ProbeVerdict::NoVerdict);

  SMLA_REQUIRE_HIPRTC();
  r = hip_compile_in_subprocesses({test::mfma_source("smla_ign")}, "gfx90a", 1, SMLA_HIPRTC_WORKER_PATH);
  ASSERT_TRUE(r[0].ok) << r[0].error;
  EXPECT_TRUE(read_elf(r[0].result.binary).valid);
  detail::forget_probes();  // the probe too runs with SIGCHLD ignored
  CompileResult c = HipRtcCompiler(true, SMLA_HIPRTC_WORKER_PATH).compile(test::mfma_source("smla_ign"), "gfx90a");
  EXPECT_EQ(c.binary, r[0].result.binary);
}

// Whether process `pid` has ended: gone, or a zombie nobody reaped yet (its parent died).
bool process_ended(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(f, stat)) return true;
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && (stat[paren + 2] == 'Z' || stat[paren + 2] == 'X');
}

TEST(HipRtcWorker, DiesWithItsParent) {
  // An interrupted parent left its workers compiling, re-parented to init. Here a process starts the
  // real worker on a request that blocks (a FIFO nobody writes) and exits at once.
  TempDir dir("smla-test");
  const std::string req = dir.path() + "/req";
  ASSERT_EQ(mkfifo(req.c_str(), 0600), 0);
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t middle = fork();
  ASSERT_GE(middle, 0);
  if (middle == 0) {
    const std::string parent = std::to_string(getpid()), co = dir.path() + "/co", log = dir.path() + "/log";
    const char* argv[] = {SMLA_HIPRTC_WORKER_PATH, "--parent", parent.c_str(), req.c_str(), co.c_str(), log.c_str(),
                          nullptr};
    pid_t worker = 0;
    if (posix_spawn(&worker, argv[0], nullptr, nullptr, const_cast<char* const*>(argv), environ) != 0) worker = -1;
    (void)!write(fds[1], &worker, sizeof worker);
    _exit(0);
  }
  close(fds[1]);
  pid_t worker = 0;
  ASSERT_EQ(read(fds[0], &worker, sizeof worker), static_cast<ssize_t>(sizeof worker));
  close(fds[0]);
  int status = 0;
  waitpid(middle, &status, 0);
  ASSERT_GT(worker, 0) << "the worker did not start";
  bool ended = false;
  for (int i = 0; i < 200 && !(ended = process_ended(worker)); ++i) usleep(50000);
  EXPECT_TRUE(ended) << "worker " << worker << " still runs 10 s after its parent died";
  if (!ended) kill(worker, SIGKILL);
}

TEST(HipRtcWorker, ExitsWhenItsParentIsNotTheOneNamed) {
  // The parent may die before the worker arms its death signal: the worker checks it was not re-parented.
  TempDir dir("smla-test");
  const std::string base = dir.path() + "/x";
  detail::write_request(base + ".req", test::mfma_source("smla_orphan"), "gfx90a", HipRtcCompiler().options("gfx90a"));
  auto st = run_children({{SMLA_HIPRTC_WORKER_PATH, "--parent", "1", base + ".req", base + ".co", base + ".log"}}, 1,
                         {base + ".out"}, 60);
  ASSERT_TRUE(st[0].exited) << st[0].describe();
  EXPECT_EQ(st[0].code, 5);
  EXPECT_NE(test::read_text(base + ".out").find("parent 1 is gone"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(base + ".co"));
}

// The worker compiles with the request's options, not its own build's (a source that compiles only under an option
// the request alone carries): a worker of another build stored its own compile under the parent's key.
TEST(HipRtcWorker, TheWorkerCompilesWithTheRequestsOptions) {
  SMLA_REQUIRE_HIPRTC();
  TempDir dir("smla-test");
  RenderedSource src = test::mfma_source("smla_opts_used");
  src.text = "#ifndef SMLA_FROM_REQUEST\n#error not the request's options\n#endif\n" + src.text;
  auto run = [&](const std::string& base, const std::vector<std::string>& opts) {
    detail::write_request(base + ".req", src, "gfx90a", opts);
    return run_children({{SMLA_HIPRTC_WORKER_PATH, "--parent", std::to_string(getpid()), base + ".req", base + ".co",
                          base + ".log"}},
                        1, {base + ".out"}, 120)[0];
  };
  std::vector<std::string> opts = HipRtcCompiler().options("gfx90a");
  const ChildStatus plain = run(dir.path() + "/plain", opts);
  ASSERT_TRUE(plain.exited) << plain.describe();
  EXPECT_EQ(plain.code, 2) << "compiled without the request's define";
  opts.push_back("-DSMLA_FROM_REQUEST=1");
  const ChildStatus with = run(dir.path() + "/with", opts);
  ASSERT_TRUE(with.exited) << with.describe();
  EXPECT_EQ(with.code, 0) << test::read_text(dir.path() + "/with.log") << test::read_text(dir.path() + "/with.out");
  const std::string co = test::read_text(dir.path() + "/with.co");
  EXPECT_TRUE(read_elf(std::vector<uint8_t>(co.begin(), co.end())).valid);
}

TEST(HipRtcWorker, TempDirsNameTheirProcessAndStaleOnesAreRemoved) {
  TempDir root("smla-test");
  const std::string host = detail::host_name();
  // A pid that is certainly gone: a child that exited and was reaped.
  const pid_t dead = fork();
  ASSERT_GE(dead, 0);
  if (dead == 0) _exit(0);
  waitpid(dead, nullptr, 0);
  namespace fs = std::filesystem;
  auto make = [&](const std::string& name, int age_s) {
    const fs::path p = fs::path(root.path()) / name;
    fs::create_directories(p / "sub");
    std::ofstream(p / "sub" / "f") << "x";
    fs::last_write_time(p, fs::file_time_type::clock::now() - std::chrono::seconds(age_s));
    return p;
  };
  const std::string pre = "smla-hiprtc";
  const std::string d = std::to_string(dead);
  const fs::path old_dead = make(pre + "." + host + "." + d + ".AAAAAA", 7200);
  const fs::path new_dead = make(pre + "." + host + "." + d + ".BBBBBB", 10);  // maybe another PID namespace
  const fs::path old_live = make(pre + "." + host + ".1.CCCCCC", 7200);
  const fs::path old_ours = make(pre + "." + host + "." + std::to_string(getpid()) + ".DDDDDD", 7200);
  const fs::path other_host = make(pre + ".elsewhere.example." + d + ".EEEEEE", 7200);
  const fs::path old_style = make(pre + "-FFFFFF", 2 * 86400);
  const fs::path new_style = make(pre + "-GGGGGG", 7200);
  const fs::path unrelated = make("smla-hiprtcX." + host + "." + d + ".HHHHHH", 7200);
  {
    test::ScopedEnv tmp("TMPDIR", root.path().c_str());
    TempDir t(pre);  // the first of its prefix in this directory: cleans
    const std::string name = fs::path(t.path()).filename().string();
    EXPECT_EQ(name.rfind(pre + "." + host + "." + std::to_string(getpid()) + ".", 0), 0u) << name;
    EXPECT_TRUE(fs::is_directory(t.path()));
  }
  EXPECT_FALSE(fs::exists(old_dead));
  EXPECT_FALSE(fs::exists(old_style));
  for (const fs::path& kept : {new_dead, old_live, old_ours, other_host, new_style, unrelated})
    EXPECT_TRUE(fs::exists(kept)) << kept;
  EXPECT_EQ(detail::clean_stale_temp_dirs(root.path(), pre, 5), 1);  // new_dead, past a 5 s age
  EXPECT_FALSE(fs::exists(new_dead));
}

TEST(HipRtcWorker, RequestRoundTrip) {
  RenderedSource s{"a.hip", std::string("x\n0\n\0binary", 12), {{"h.h", "3\n"}, {"e.h", ""}}};
  std::string path = (std::filesystem::temp_directory_path() / "smla-req-test").string();
  const std::vector<std::string> opts = {"--offload-arch=gfx942:sramecc+:xnack-", "-O3", "-std=c++17", ""};
  detail::write_request(path, s, "gfx942:sramecc+:xnack-", opts);
  RenderedSource back;
  std::string target;
  std::vector<std::string> back_opts;
  ASSERT_TRUE(detail::read_request(path, &back, &target, &back_opts));
  EXPECT_EQ(target, "gfx942:sramecc+:xnack-");
  EXPECT_EQ(back_opts, opts);
  EXPECT_EQ(back.name, s.name);
  EXPECT_EQ(back.text, s.text);
  EXPECT_EQ(back.headers, s.headers);
  // A request of the format before (no format record, no options): refused, not compiled with the worker's options.
  std::ofstream(path, std::ios::binary | std::ios::trunc) << "6\ngfx90a5\na.hip1\nx1\n0";
  EXPECT_FALSE(detail::read_request(path, &back, &target, &back_opts));
  std::filesystem::remove(path);
}

// The worker compiles with the options of the parent's key, which its request carries (it used its own build's).
TEST(HipRtcWorker, TheRequestCarriesTheOptionsOfTheKey) {
  TempDir dir("smla-test");
  const std::string copy = dir.path() + "/request-copy";
  const std::string worker =
      test::write_script(dir.path(), "smla-hiprtc-worker", "for a; do case $a in *.req) cp \"$a\" " + copy + ";; esac; done; exit 3");
  (void)hip_compile_in_subprocesses({test::mfma_source("smla_opts")}, "gfx90a", 1, worker);
  RenderedSource back;
  std::string target;
  std::vector<std::string> opts;
  ASSERT_TRUE(detail::read_request(copy, &back, &target, &opts));
  EXPECT_EQ(opts, HipRtcCompiler().options("gfx90a"));
  EXPECT_EQ(target, "gfx90a");
}

// The request's lengths in the C locale whatever the host made global: with grouping ("1,234") a worker in the C
// locale read 1 and refused every source past 999 bytes as "a worker of another smla version".
TEST(HipRtcWorker, TheRequestIgnoresTheHostsLocale) {
  struct Grouping : std::numpunct<char> {
    char do_thousands_sep() const override { return ','; }
    std::string do_grouping() const override { return "\3"; }
  };
  const std::locale was = std::locale::global(std::locale(std::locale::classic(), new Grouping));
  RenderedSource s{"big.hip", std::string(5000, 'x'), {{"h.h", std::string(1234, 'y')}}};
  const std::string path = (std::filesystem::temp_directory_path() / "smla-req-locale-test").string();
  detail::write_request(path, s, "gfx90a", {"-O3"});
  std::locale::global(std::locale::classic());  // the worker's
  RenderedSource back;
  std::string target;
  std::vector<std::string> opts;
  const bool read = detail::read_request(path, &back, &target, &opts);
  std::locale::global(was);
  std::filesystem::remove(path);
  ASSERT_TRUE(read);
  EXPECT_EQ(back.text, s.text);
  EXPECT_EQ(back.headers, s.headers);
}

// A worker holds none of the host's descriptors (a pipe not marked close-on-exec stayed open in every worker for up
// to the compile's time limit: the host's reader saw no end of file).
void expect_no_inherited_descriptors() {
  TempDir dir("smla-test");
  int p[2];
  ASSERT_EQ(::pipe(p), 0);  // without O_CLOEXEC, as a host's may be
  const std::string listing = dir.path() + "/fds";
  const std::string worker = test::write_script(
      dir.path(), "smla-hiprtc-worker", "ls /proc/$$/fd > " + listing + "; exit 3");
  (void)hip_compile_in_subprocesses({test::mfma_source("smla_fds")}, "gfx90a", 1, worker);
  ::close(p[0]);
  ::close(p[1]);
  std::ifstream f(listing);
  ASSERT_TRUE(f.good()) << "the script worker did not run";
  std::vector<int> fds;
  for (int fd; f >> fd;) fds.push_back(fd);
  EXPECT_EQ(std::count(fds.begin(), fds.end(), p[0]), 0) << "the pipe's read end reached the worker";
  EXPECT_EQ(std::count(fds.begin(), fds.end(), p[1]), 0) << "the pipe's write end reached the worker";
}

TEST(HipRtcWorker, AWorkerInheritsNoneOfTheHostsDescriptors) { expect_no_inherited_descriptors(); }

// The same with a C library that has no closefrom action (glibc < 2.34: ROCm's RHEL 8 hosts): the descriptors listed
// in /proc/self/fd are closed one by one instead (they all reached the worker there).
TEST(HipRtcWorker, AWorkerInheritsNoneOfTheHostsDescriptorsWithoutClosefrom) {
  detail::g_close_by_listing = true;
  expect_no_inherited_descriptors();
  detail::g_close_by_listing = false;
}

}  // namespace
}  // namespace smla::hip
