// test_driver_fork.cpp: what smla does around opening the CUDA driver, in processes of their own (the driver is
// opened once a process), with the stub driver of tests/stub/libcuda_stub.c as SMLA_LIBCUDA: CI has no driver.
//   - a process that only uses the CPU backend never initialises CUDA (its forked children could not use it);
//   - in a child forked after smla initialised CUDA, the CUDA backend is unusable and says why (fork), plan() on it
//     is refused with that reason, and Auto resolves to the CPU;
//   - a child of a process that initialised CUDA itself (PyTorch, say) is told to use spawn when cuInit fails;
//   - the CUDA backend asks the driver once about each pointer run() checks;
//   - backends() reports a GPU below sm_80 (SMLA_STUB_CC) instead of throwing;
//   - an NCCL communicator (runtime/nccl_api.cpp, over the fake libnccl of tests/stub/fake_nccl.cpp) calls NCCL under
//     its device's primary context, keeps the caller's, releases what it retained, and aborts rather than destroys.
// Each scenario is this executable run again with --scenario NAME; it prints what it found, one item a line.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <utility>

#include "runtime/cpu_backend.hpp"
#include "runtime/cuda/cuda_api.hpp"
#include "runtime/cuda/cuda_backend.hpp"
#include "runtime/nccl_api.hpp"
#include "runtime/seqpar.hpp"
#include "smla/smla.hpp"
#include "tests/e2e_common.hpp"
#include "tests/stub/stub_symbol.hpp"

namespace smla::test {
namespace {

const Case kTiny{16, 16, 40, 64, 0, true, ref::TopkKind::Uniform};

// One of the stub's counters (smla_stub_cuinit_calls, smla_stub_pointer_queries); 0 when the stub is not loaded.
int stub_count(const char* counter) { return stub_counter(SMLA_STUB_LIBCUDA, counter, 0); }

// The stub's device memory (tests/stub/libcuda_stub.c): device `ordinal`'s, managed or not.
const void* stub_device_ptr(int ordinal, bool managed) {
  return reinterpret_cast<const void*>(0xd00000000000ull | (uint64_t(ordinal) << 32) | (managed ? 1ull << 31 : 0));
}

void run_cpu_case() {
  const ref::Inputs in = make_case_inputs(kTiny, 3);
  const Problem p = make_problem(BackendKind::Cpu, kTiny);
  auto plan = Runtime().plan(p);
  tools::CaseRunner cr(p, in);
  run_poisoned(*plan, cr, cr.workspace(plan->workspace_bytes()));
}

// What a forked child finds; printed by the child.
void report_child() {
  const auto& d = cuda::driver();
  std::printf("child ok=%d\nchild why=%s\n", int(d.ok), d.why.c_str());
  Runtime rt;
  try {
    Problem p = make_problem(BackendKind::Cuda, kTiny);
    rt.plan(p);
    std::printf("child plan cuda=accepted\n");
  } catch (const Error& e) {
    std::printf("child plan cuda=%s: %s\n", status_name(e.status()), e.what());
  }
  std::printf("child auto=%s\n", backend_name(rt.resolve(BackendKind::Auto)));
  std::fflush(stdout);
}

int fork_and_report() {
  std::fflush(stdout);
  const pid_t pid = ::fork();
  if (pid == 0) {
    report_child();
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

// ---- NCCL's communicator, over the stub driver (SMLA_STUB_DEVICES=2) and the fake libnccl

// A stub context as the NCCL lines print it: "dev<d>-primary", "dev<d>-other" (smla_stub_context's handles), "none".
std::string ctx_name(const void* ctx) {
  if (!ctx) return "none";
  const auto handle = stub_symbol<void* (*)(int, int)>(SMLA_STUB_LIBCUDA, "smla_stub_context");
  for (int d = 0; handle && d < 2; ++d)
    for (int primary : {0, 1})
      if (ctx == handle(d, primary)) return "dev" + std::to_string(d) + (primary ? "-primary" : "-other");
  return "unknown";
}

std::string current_ctx_name() {
  CUcontext now = reinterpret_cast<CUcontext>(1);
  return cuda::driver().CtxGetCurrent(&now) == CUDA_SUCCESS ? ctx_name(now) : "unreadable";
}

// "<what> calls=N ctx=<context current at the last>": what the fake library `lib` saw of one NCCL call.
void print_nccl_calls(const char* lib, const char* what) {
  const auto calls = stub_symbol<int (*)(const char*, void**)>(lib, "smla_fake_nccl_calls");
  void* ctx = nullptr;
  const int n = calls ? calls(what, &ctx) : -2;
  std::printf("%s calls=%d%s\n", what, n, n > 0 ? (" ctx=" + ctx_name(ctx)).c_str() : "");
}

// The communicator of rank 1 of 2 on device 1, made on a thread whose current context is device 0's other one.
int nccl_scenario(const std::string& name) {
  const char* lib = name == "nccl-abort-old" ? SMLA_FAKE_NCCL_NO_ABORT : SMLA_FAKE_NCCL;
  const auto api = nccl::open_library(lib);
  std::string why;
  if (!nccl::available(*api, &why) || !cuda::driver().ok) {
    std::printf("not usable: %s %s\n", why.c_str(), cuda::driver().why.c_str());
    return 1;
  }
  const auto context = stub_symbol<void* (*)(int, int)>(SMLA_STUB_LIBCUDA, "smla_stub_context");
  if (!context) {
    std::printf("the stub driver is not loaded\n");
    return 1;
  }
  SMLA_CU(cuda::driver().CtxSetCurrent(static_cast<CUcontext>(context(0, 0))));  // the caller's own: device 0's other
  const auto held = [] { return stub_count("smla_stub_primary_contexts_held"); };
  if (name == "nccl-init-fails") {
    try {
      nccl::Communicator c(api, nccl::unique_id(*api), 1, 2, 1);
      std::printf("init accepted\n");
    } catch (const Error& e) {
      std::printf("init threw %s: %s\n", status_name(e.status()), e.message().c_str());
    }
    print_nccl_calls(lib, "init");
    std::printf("at end: primary held=%d current=%s\n", held(), current_ctx_name().c_str());
    return 0;
  }
  if (name == "nccl-rank-refused") {  // a rank whose backward refuses its plan (not a rank_problem's) aborts NCCL
    seqpar::NcclReducer red(nccl::unique_id(*api), 1, 2, 1, lib);
    const auto plan = Runtime().plan(make_problem(BackendKind::Cpu, kTiny));
    try {
      seqpar::backward(*plan, Tensors{}, nullptr, 0, nullptr, red);
      std::printf("backward accepted\n");
    } catch (const Error& e) {
      std::printf("backward threw %s\n", status_name(e.status()));
    }
    print_nccl_calls(lib, "abort");
    return 0;
  }
  {
    nccl::Communicator c(api, nccl::unique_id(*api), 1, 2, 1);
    int rank = -1, nranks = -1, id_ours = -1;
    if (auto args = stub_symbol<void (*)(int*, int*, int*)>(lib, "smla_fake_nccl_init_args")) args(&rank, &nranks, &id_ours);
    std::printf("init rank=%d nranks=%d id ours=%d\n", rank, nranks, id_ours);
    print_nccl_calls(lib, "init");
    std::printf("after init: primary held=%d current=%s\n", held(), current_ctx_name().c_str());
    if (name != "nccl-life") {
      c.abort();
      c.abort();  // a second abort is a no-op
      print_nccl_calls(lib, "abort");
      std::printf("after abort: current=%s\n", current_ctx_name().c_str());
    }
    void* dev1 = const_cast<void*>(stub_device_ptr(1, false));
    auto stream = stub_symbol<void* (*)(int, int)>(SMLA_STUB_LIBCUDA, "smla_stub_stream");
    void* s1 = stream ? stream(1, 1) : nullptr;
    try {
      c.all_reduce_sum(static_cast<float*>(dev1), 1000, s1);
      std::printf("reduce accepted\n");
    } catch (const Error& e) {
      std::printf("reduce threw %s: %s\n", status_name(e.status()), e.message().c_str());
    }
    print_nccl_calls(lib, "reduce");
    const void* send = nullptr;
    void *recv = nullptr, *on = nullptr;
    size_t count = 0;
    int type = -1, op = -1;
    if (auto last = stub_symbol<int (*)(const void**, void**, void**, size_t*, int*, int*)>(
            lib, "smla_fake_nccl_last_reduce")) {
      const int comm_ours = last(&send, &recv, &on, &count, &type, &op);
      if (send) {
        std::printf("reduce in place=%d count=%zu float32=%d sum=%d stream=%d comm ours=%d\n",
                    int(send == dev1 && recv == dev1), count, int(type == 7), int(op == 0), int(on == s1 && s1),
                    comm_ours);
      }
    }
    std::printf("after reduce: current=%s\n", current_ctx_name().c_str());
  }
  print_nccl_calls(lib, "destroy");
  print_nccl_calls(lib, "abort");
  std::printf("at end: primary held=%d current=%s\n", held(), current_ctx_name().c_str());
  return 0;
}

int scenario(const std::string& name) {
  if (name.rfind("nccl-", 0) == 0) return nccl_scenario(name);
  if (name == "cpu-only") {
    run_cpu_case();
    std::printf("cuinit=%d\n", stub_count("smla_stub_cuinit_calls"));
    return 0;
  }
  if (name == "pointer-queries") {  // what run() asks of each tensor, for a plan of device 0
    const cuda::CudaBackend be;
    const int host = 0;
    const std::pair<const char*, const void*> ptrs[] = {{"host", &host},
                                                        {"device0", stub_device_ptr(0, false)},
                                                        {"device1", stub_device_ptr(1, false)},
                                                        {"managed1", stub_device_ptr(1, true)}};
    for (const auto& [what, ptr] : ptrs) {
      const int before = stub_count("smla_stub_pointer_queries");
      const PointerInfo where = be.pointer_info(ptr, 0);
      std::printf("%s kind=%d other=%d queries=%d\n", what, int(where.kind), where.other_device,
                  stub_count("smla_stub_pointer_queries") - before);
    }
    CUcontext now = reinterpret_cast<CUcontext>(1);
    SMLA_CU(cuda::driver().CtxGetCurrent(&now));
    std::printf("none current after=%d\n", int(now == nullptr));
    // The CPU backend, the driver now open: managed memory is host memory to it, plain device memory is not.
    const CpuBackend cpu;
    std::printf("cpu: managed1 device=%d device0 device=%d\n",
                int(cpu.pointer_info(stub_device_ptr(1, true), 0).kind == PointerKind::Device),
                int(cpu.pointer_info(stub_device_ptr(0, false), 0).kind == PointerKind::Device));
    return 0;
  }
  if (name == "foreign-stream") {  // why a stream cannot take device 0's launches (SMLA_STUB_DEVICES=2)
    void* h = dlopen(SMLA_STUB_LIBCUDA, RTLD_NOW);
    auto stream = h ? reinterpret_cast<void* (*)(int, int)>(dlsym(h, "smla_stub_stream")) : nullptr;
    if (!stream || !cuda::driver().ok) {
      std::printf("no stub driver: %s\n", cuda::driver().why.c_str());
      return 1;
    }
    const cuda::CudaBackend be;
    CUcontext callers = nullptr;  // a caller with device 1's primary context current
    CUdevice dev1 = 0;
    SMLA_CU(cuda::driver().DeviceGet(&dev1, 1));
    SMLA_CU(cuda::driver().DevicePrimaryCtxRetain(&callers, dev1));
    SMLA_CU(cuda::driver().CtxSetCurrent(callers));
    const std::pair<const char*, void*> streams[] = {{"null", nullptr},
                                                     {"legacy", CU_STREAM_LEGACY},
                                                     {"device0", stream(0, 1)},
                                                     {"device1", stream(1, 1)},
                                                     {"device0-other-context", stream(0, 0)},
                                                     {"unknown-handle", reinterpret_cast<void*>(0x1230)}};
    for (const auto& [what, s] : streams) std::printf("%s: [%s]\n", what, be.foreign_stream(0, s).c_str());
    CUcontext now = nullptr;
    SMLA_CU(cuda::driver().CtxGetCurrent(&now));
    std::printf("caller's context kept=%d\n", int(now == callers));
    // run()'s check before anything is queued: the default stream with device 0's other context current is refused;
    // with device 1's primary (the caller's above) or device 0's own, or an explicit stream, it is not.
    CUcontext other0 = nullptr;
    SMLA_CU(cuda::driver().StreamGetCtx(static_cast<CUstream>(stream(0, 0)), &other0));
    auto check = [&](const char* what, CUcontext current, void* s) {
      SMLA_CU(cuda::driver().CtxSetCurrent(current));
      std::string r = "ok";
      try {
        be.check_stream(0, s);
      } catch (const Error& e) {
        r = std::string(status_name(e.status())) + ": " + e.message();
      }
      std::printf("check %s: [%s]\n", what, r.c_str());
    };
    check("null, device 1 current", callers, nullptr);
    check("null, device 0's other context", other0, nullptr);
    check("per-thread, device 0's other context", other0, CU_STREAM_PER_THREAD);
    check("explicit, device 0's other context", other0, stream(0, 1));
    check("null, none current", nullptr, nullptr);
    // A thread with no context current: asking about a stream of device 0's other context enters that context and
    // must leave none current again (not smla's, nor the stream's).
    SMLA_CU(cuda::driver().CtxSetCurrent(nullptr));
    const std::string said = be.foreign_stream(0, stream(0, 0));
    CUcontext after = reinterpret_cast<CUcontext>(1);
    SMLA_CU(cuda::driver().CtxGetCurrent(&after));
    std::printf("none current: said=%d, none after=%d\n", int(!said.empty()), int(after == nullptr));
    return 0;
  }
  if (name == "backends") {  // what Runtime::backends() says of the CUDA backend, or what it threw
    try {
      for (const BackendStatus& b : Runtime().backends())
        if (b.name == "cuda") std::printf("cuda usable=%d detail=%s\n", int(b.usable), b.detail.c_str());
    } catch (const Error& e) {
      std::printf("backends threw %s: %s\n", status_name(e.status()), e.what());
    }
    return 0;
  }
  if (name == "fork-after-init") {
    const auto& d = cuda::driver();
    std::printf("parent ok=%d why=%s\n", int(d.ok), d.why.c_str());
    return fork_and_report();
  }
  if (name == "fork-after-plan") {  // a CUDA plan made before the fork, run in the child (real driver only)
    Runtime rt;
    Problem p = make_problem(BackendKind::Cuda, kTiny);
    p.check_indices = true;  // for index_report() in the child
    auto plan = rt.plan(p);
    void* ws = std::aligned_alloc(256, 4096);
    std::fflush(stdout);
    const pid_t pid = ::fork();
    if (pid == 0) {
      try {
        plan->run(Tensors{}, nullptr, 0, nullptr);
        std::printf("child run=accepted\n");
      } catch (const Error& e) {
        std::printf("child run=%s: %s\n", status_name(e.status()), e.what());
      }
      try {  // it read the report back through the driver in the child
        plan->index_report(ws, nullptr);
        std::printf("child index_report=accepted\n");
      } catch (const Error& e) {
        std::printf("child index_report=%s: %s\n", status_name(e.status()), e.what());
      }
      std::fflush(stdout);
      ::_exit(0);
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
  }
  if (name == "cuda-parent" || name == "cuda-parent-real") {  // the parent initialises CUDA itself, smla the child
    void* h = dlopen(name == "cuda-parent" ? SMLA_STUB_LIBCUDA : "libcuda.so.1", RTLD_NOW);
    auto init = h ? reinterpret_cast<int (*)(unsigned)>(dlsym(h, "cuInit")) : nullptr;
    std::printf("parent cuInit=%d\n", init ? init(0) : -1);
    return fork_and_report();
  }
  std::fprintf(stderr, "unknown scenario %s\n", name.c_str());
  return 2;
}

// Runs this executable with --scenario `name` and the stub driver (the real one: `stub` false), `env` ("NAME=value ")
// set for it; its output.
std::string run_scenario(const std::string& name, bool stub = true, const std::string& env = "") {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return "readlink failed";
  self[n] = 0;
  const std::string cmd = env + std::string(stub ? "SMLA_LIBCUDA='" SMLA_STUB_LIBCUDA "' " : "") +
                          "SMLA_LOG_LEVEL=error timeout 60 '" + self + "' --scenario " + name + " 2>&1";
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return "popen failed";
  char buf[512];
  for (size_t k; (k = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, k);
  const int rc = ::pclose(p);
  if (rc != 0) out += "\n(exit status " + std::to_string(rc) + ")";
  return out;
}

bool has(const std::string& out, const std::string& line) { return out.find(line) != std::string::npos; }

TEST(DriverFork, TheCpuBackendAloneNeverInitialisesCuda) {
  const std::string out = run_scenario("cpu-only");
  EXPECT_TRUE(has(out, "cuinit=0\n")) << out;
}

TEST(DriverFork, AChildForkedAfterInitIsToldWhyCudaIsUnusable) {
  const std::string out = run_scenario("fork-after-init");
  ASSERT_TRUE(has(out, "parent ok=1")) << "the stub driver did not open:\n" << out;
  EXPECT_TRUE(has(out, "child ok=0\n")) << out;
  EXPECT_TRUE(has(out, "before it forked this one")) << out;
  EXPECT_TRUE(has(out, "child plan cuda=no backend")) << out;
  EXPECT_TRUE(has(out, "spawn")) << out;
  EXPECT_TRUE(has(out, "child auto=cpu\n")) << out;
}

TEST(DriverFork, AChildOfAProcessThatInitialisedCudaIsToldToSpawn) {
  const std::string out = run_scenario("cuda-parent");
  ASSERT_TRUE(has(out, "parent cuInit=0")) << out;
  EXPECT_TRUE(has(out, "child ok=0\n")) << out;
  EXPECT_TRUE(has(out, "CUDA_ERROR_NOT_INITIALIZED")) << out;
  EXPECT_TRUE(has(out, "start workers with spawn")) << out;
}

// run() checks each tensor's memory type, device and managedness (Plan::run's check_ptr) with one driver query: it
// asked twice for each device pointer (the type, then the ordinal), three times for another device's.
TEST(DriverFork, OnePointerQueryATensor) {
  const std::string out = run_scenario("pointer-queries");
  const auto line = [](const char* what, PointerKind kind, int other, int queries = 1) {
    return std::string(what) + " kind=" + std::to_string(int(kind)) + " other=" + std::to_string(other) +
           " queries=" + std::to_string(queries) + "\n";
  };
  EXPECT_TRUE(has(out, line("host", PointerKind::Host, -1))) << out;
  EXPECT_TRUE(has(out, line("device0", PointerKind::Device, -1))) << out;
  EXPECT_TRUE(has(out, line("device1", PointerKind::Device, 1))) << out;
  EXPECT_TRUE(has(out, line("managed1", PointerKind::Device, -1))) << out;  // managed memory serves every device
  // The CPU backend took managed memory before the driver was open, and refused it as device memory after.
  EXPECT_TRUE(has(out, "cpu: managed1 device=0 device0 device=1\n")) << out;
  EXPECT_TRUE(has(out, "none current after=1\n")) << out;
  // A driver that wants a current context for the query: asked again under device 0's primary context, which is
  // then put back to none.
  const std::string ctx = run_scenario("pointer-queries", true, "SMLA_STUB_DEVICES=2 SMLA_STUB_POINTER_NEEDS_CONTEXT=1 ");
  EXPECT_TRUE(has(ctx, line("host", PointerKind::Host, -1, 2))) << ctx;
  EXPECT_TRUE(has(ctx, line("device0", PointerKind::Device, -1, 2))) << ctx;
  EXPECT_TRUE(has(ctx, line("device1", PointerKind::Device, 1, 2))) << ctx;
  EXPECT_TRUE(has(ctx, "none current after=1\n")) << ctx;
}

// run() names a stream the plan's device cannot use (the driver says only "invalid resource handle"): the backend's
// answer after a failed launch, here against the stub's two devices and their contexts. On the GPU,
// ApiCuda.AStreamOfAnotherContextIsNamedByRun checks run()'s error itself.
TEST(DriverFork, AForeignStreamIsNamed) {
  const std::string out = run_scenario("foreign-stream", true, "SMLA_STUB_DEVICES=2 ");
  EXPECT_TRUE(has(out, "null: []\n")) << out;
  EXPECT_TRUE(has(out, "legacy: []\n")) << out;
  EXPECT_TRUE(has(out, "device0: []\n")) << out;
  EXPECT_TRUE(has(out, "device1: [the stream belongs to CUDA device 1, and the plan is for device 0 (Problem::device)"))
      << out;
  EXPECT_TRUE(has(out, "device0-other-context: [the stream belongs to a context of CUDA device 0 other than its "
                       "primary context"))
      << out;
  EXPECT_TRUE(has(out, "unknown-handle: []\n")) << out;  // left to the driver's own error
  EXPECT_TRUE(has(out, "caller's context kept=1\n")) << out;
  // The default stream with another context of the plan's device current: refused before anything is queued.
  EXPECT_TRUE(has(out, "check null, device 1 current: [ok]\n")) << out;
  EXPECT_TRUE(has(out, "check null, device 0's other context: [invalid argument: run() was given the default stream "
                       "(null, legacy or per-thread) while a context of CUDA device 0 other than its primary context "
                       "is current")) << out;
  EXPECT_TRUE(has(out, "check per-thread, device 0's other context: [invalid argument: run() was given the default "))
      << out;
  EXPECT_TRUE(has(out, "check explicit, device 0's other context: [ok]\n")) << out;
  EXPECT_TRUE(has(out, "check null, none current: [ok]\n")) << out;
  EXPECT_TRUE(has(out, "none current: said=1, none after=1\n")) << out;
}

// A machine whose GPU smla cannot run on (a T4, compute capability 7.5) still gets its answer from backends(), the
// query that says why not: it threw Unsupported from reading device 0's target, so `smla-bench --backends` died there.
TEST(DriverFork, BackendsReportsAGpuBelowSm80InsteadOfThrowing) {
  const std::string ok = run_scenario("backends");
  ASSERT_TRUE(has(ok, "cuda usable=1 detail=1 device(s), target sm_90a")) << "the stub's default device:\n" << ok;
  const std::string out = run_scenario("backends", true, "SMLA_STUB_CC=75 ");
  EXPECT_FALSE(has(out, "backends threw")) << out;
  EXPECT_TRUE(has(out, "cuda usable=1 detail=1 device(s); device 0: compute capability 7.5 is below the supported "
                       "minimum 8.0"))
      << out;
}

// Two drivers backends() must read right: one that reports no device (unusable, saying so), and one before 12.8,
// which has cuEventElapsedTime without cuda.h 13's _v2 (usable: only timing needs that call).
TEST(DriverFork, BackendsOfADriverWithNoDeviceAndOfAnOlderDriver) {
  const std::string none = run_scenario("backends", true, "SMLA_STUB_DEVICES=0 ");
  EXPECT_TRUE(has(none, "cuda usable=0 detail=the CUDA driver reports no device")) << none;
  const std::string old_driver = run_scenario("backends", false, "SMLA_LIBCUDA='" SMLA_STUB_LIBCUDA_OLD "' ");
  EXPECT_TRUE(has(old_driver, "cuda usable=1 detail=1 device(s), target sm_90a")) << old_driver;
}

// Each of `lines` in a scenario's output.
void expect_lines(const std::string& out, std::initializer_list<std::string> lines) {
  for (const std::string& line : lines) EXPECT_TRUE(has(out, line)) << "no line '" << line << "' in:\n" << out;
}

// NCCL's calls over a fake libnccl: init, the reduction and destroy under the communicator's device's primary context,
// the caller's context kept, the retained primary context released at the end. (The reduction's datatype 7 and op 0
// are nccl.h's ncclFloat32 and ncclSum.)
TEST(DriverFork, AnNcclCommunicatorsCallsAndContexts) {
  expect_lines(run_scenario("nccl-life", true, "SMLA_STUB_DEVICES=2 "),
               {"init rank=1 nranks=2 id ours=1\n", "init calls=1 ctx=dev1-primary\n",
                "after init: primary held=1 current=dev0-other\n", "reduce accepted\n",
                "reduce calls=1 ctx=dev1-primary\n",
                "reduce in place=1 count=1000 float32=1 sum=1 stream=1 comm ours=1\n",
                "after reduce: current=dev0-other\n", "destroy calls=1 ctx=dev1-primary\n", "abort calls=0\n",
                "at end: primary held=0 current=dev0-other\n"});
}

// A failed ncclCommInitRank: its error said with NCCL's words, version, library and last error; the primary context
// retained for it released (it was kept for ever), the caller's context current again.
TEST(DriverFork, AFailedNcclInitReleasesItsContext) {
  expect_lines(run_scenario("nccl-init-fails", true, "SMLA_STUB_DEVICES=2 SMLA_FAKE_NCCL_INIT_FAIL=1 "),
               {"init threw driver error: NCCL error 2: fake system error (NCCL 2.21.5 from '" SMLA_FAKE_NCCL
                "') (fake NCCL: no peer joined (SMLA_FAKE_NCCL_INIT_FAIL)); run with NCCL_DEBUG=WARN",
                "init calls=1 ctx=dev1-primary\n", "at end: primary held=0 current=dev0-other\n"});
}

// abort() ends the communicator with ncclCommAbort at once, once; it is never destroyed after (ncclCommDestroy waits
// for the collective the failed rank never finished), later reductions are refused, and the context is released. An
// NCCL without ncclCommAbort (before 2.4) leaves the communicator, and nothing else changes.
TEST(DriverFork, AnAbortedNcclCommunicatorIsAbortedNotDestroyed) {
  for (const std::string which : {"nccl-abort", "nccl-abort-old"}) {
    SCOPED_TRACE(which);
    expect_lines(run_scenario(which, true, "SMLA_STUB_DEVICES=2 "),
                 {which == "nccl-abort-old" ? "abort calls=0\n" : "abort calls=1 ctx=dev1-primary\n",
                  "after abort: current=dev0-other\n",
                  "reduce threw invalid argument: NCCL communicator of rank 1 was aborted (a failed backward)",
                  "reduce calls=0\n", "destroy calls=0\n", "at end: primary held=0 current=dev0-other\n"});
  }
}

// A rank whose backward refuses its arguments aborts its communicator, so that the other ranks are not left waiting
// in their reductions for this one's.
TEST(DriverFork, ARankThatRefusesItsPlanAbortsItsNcclCommunicator) {
  expect_lines(run_scenario("nccl-rank-refused", true, "SMLA_STUB_DEVICES=2 "),
               {"backward threw invalid argument\n", "abort calls=1 ctx=dev1-primary\n"});
}

// The same two forks with the real driver, on a machine that has a GPU: what the stub assumes of it.
TEST(DriverFork, WithTheRealDriver) {
  if (!test::cuda_usable()) GTEST_SKIP() << "no usable CUDA driver here (" << test::cuda_why() << "): not run";
  std::string out = run_scenario("fork-after-init", false);
  ASSERT_TRUE(has(out, "parent ok=1")) << out;
  EXPECT_TRUE(has(out, "child ok=0\n")) << out;
  EXPECT_TRUE(has(out, "child plan cuda=no backend")) << out;
  EXPECT_TRUE(has(out, "child auto=cpu\n")) << out;
  out = run_scenario("fork-after-plan", false);
  EXPECT_TRUE(has(out, "child run=no backend")) << out;  // before any driver call, with the reason
  EXPECT_TRUE(has(out, "child index_report=no backend")) << out;
  EXPECT_TRUE(has(out, "before it forked this one")) << out;
  out = run_scenario("cuda-parent-real", false);
  ASSERT_TRUE(has(out, "parent cuInit=0")) << out;
  EXPECT_TRUE(has(out, "child ok=0\n")) << out;  // whatever the driver answers a child, smla must not call it usable
  std::printf("what the real driver tells a child of a CUDA parent:\n%s\n", out.c_str());
}

}  // namespace
}  // namespace smla::test

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--scenario") return smla::test::scenario(argv[2]);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
