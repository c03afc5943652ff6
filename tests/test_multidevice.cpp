// test_multidevice.cpp: several runtimes, plans, streams and devices used at once give the bits
// one plan gives alone. CPU-backend cases run everywhere; GPU cases skip without a CUDA device
// (and the per-device / NCCL cases without two).
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <thread>

#include "runtime/cuda/cuda_api.hpp"
#include "tests/cuda_required.hpp"
#include "runtime/nccl_api.hpp"
#include "runtime/seqpar.hpp"
#include "tools/case_runner.hpp"

namespace smla {
namespace fs = std::filesystem;
namespace {

constexpr size_t D = 512;

bool same(const tools::Outputs& a, const tools::Outputs& b) {
  return a.dq == b.dq && a.dkv == b.dkv && tools::same_bits(a.dkv_f32, b.dkv_f32) &&
         tools::same_bits(a.d_sink, b.d_sink);
}

void expect_reference(const Problem& p, const ref::Inputs& in, const tools::Outputs& o) {
  const ref::Grads g = ref::backward(in);
  const auto dq = ref::compare(g.dq, o.dq.data(), size_t(p.T) * p.H * D);
  const auto dkv = ref::compare(g.dkv, o.dkv.data(), size_t(p.num_kv) * D);
  EXPECT_TRUE(ref::meets_bar(dq)) << "dq rel_err " << dq.rel_err << " cosine " << dq.cosine;
  EXPECT_TRUE(ref::meets_bar(dkv)) << "dkv rel_err " << dkv.rel_err << " cosine " << dkv.cosine;
  if (p.has_sink) {
    const auto ds = ref::compare(g.d_sink, o.d_sink.data(), size_t(p.H));
    EXPECT_TRUE(ref::meets_bar(ds)) << "d_sink rel_err " << ds.rel_err << " cosine " << ds.cosine;
  }
}

// Runs fn(i) for i in [0, n) on n threads at once; returns each thread's error ("" if none).
std::vector<std::string> on_threads(int n, const std::function<void(int)>& fn) {
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> th;
  for (int i = 0; i < n; ++i)
    th.emplace_back([&, i] {
      try {
        fn(i);
      } catch (const std::exception& e) {
        errors[size_t(i)] = e.what();
      }
    });
  for (auto& t : th) t.join();
  return errors;
}

tools::Outputs run_once(const Plan& plan, tools::CaseRunner& cr) {
  void* ws = cr.workspace(plan.workspace_bytes());
  cr.poison_outputs();
  plan.run(cr.tensors(), ws, cr.workspace_size(), cr.stream());
  return cr.read_outputs();
}

Problem problem(BackendKind b, int T, int H, int num_kv, int topk) {
  Problem p;
  p.T = T, p.H = H, p.num_kv = num_kv, p.topk = topk, p.has_sink = true, p.backend = b;
  return p;
}

// ---- CPU backend: runs in CI

TEST(MultiRuntimeCpu, TwoRuntimesTwoThreadsSameBits) {
  const Problem p = problem(BackendKind::Cpu, 57, 16, 90, 64);
  const ref::Inputs in = ref::make_inputs(57, 16, 90, 64, true, 11, ref::TopkKind::Uniform);
  Runtime a, b;
  Runtime* rts[2] = {&a, &b};
  const int iters = 3;
  std::vector<std::vector<tools::Outputs>> outs(2);
  const auto errors = on_threads(2, [&](int i) {
    auto plan = rts[i]->plan(p);  // both plan at the same time too
    tools::CaseRunner cr(p, in);
    for (int k = 0; k < iters; ++k) outs[size_t(i)].push_back(run_once(*plan, cr));
  });
  for (int i = 0; i < 2; ++i) ASSERT_EQ(errors[size_t(i)], "") << "thread " << i;
  for (int i = 0; i < 2; ++i)
    for (int k = 0; k < iters; ++k) EXPECT_TRUE(same(outs[size_t(i)][size_t(k)], outs[0][0])) << "thread " << i << " run " << k;
  expect_reference(p, in, outs[0][0]);
}

TEST(MultiRuntimeCpu, TwoProblemsOnOneRuntimeAtOnceMatchRunningAlone) {
  Runtime rt;
  const Problem ps[2] = {problem(BackendKind::Cpu, 40, 16, 70, 32), problem(BackendKind::Cpu, 33, 32, 50, 48)};
  std::vector<ref::Inputs> ins;
  for (int i = 0; i < 2; ++i)
    ins.push_back(ref::make_inputs(int(ps[i].T), int(ps[i].H), int(ps[i].num_kv), int(ps[i].topk), true, 20 + i,
                                   ref::TopkKind::Uniform));
  std::vector<tools::Outputs> together(2), alone(2);
  const auto errors = on_threads(2, [&](int i) {
    tools::CaseRunner cr(ps[i], ins[size_t(i)]);
    together[size_t(i)] = run_once(*rt.plan(ps[i]), cr);
  });
  for (int i = 0; i < 2; ++i) ASSERT_EQ(errors[size_t(i)], "") << "thread " << i;
  for (int i = 0; i < 2; ++i) {
    Runtime fresh;
    tools::CaseRunner cr(ps[i], ins[size_t(i)]);
    alone[size_t(i)] = run_once(*fresh.plan(ps[i]), cr);
    EXPECT_TRUE(same(together[size_t(i)], alone[size_t(i)])) << "problem " << i;
    expect_reference(ps[i], ins[size_t(i)], alone[size_t(i)]);
  }
}

// ---- CUDA: skipped without a device

int cuda_devices() {
  if (!test::cuda_usable()) return 0;
  int n = 0;
  return cuda::driver().DeviceGetCount(&n) == CUDA_SUCCESS ? n : 0;
}

// Makes `device`'s primary context current on this thread (CaseRunner allocates in it).
class UseDevice {
 public:
  explicit UseDevice(int device) {
    SMLA_CU(cuda::driver().DeviceGet(&dev_, device));
    SMLA_CU(cuda::driver().DevicePrimaryCtxRetain(&ctx_, dev_));
    SMLA_CU(cuda::driver().CtxSetCurrent(ctx_));
  }
  ~UseDevice() { cuda::driver().DevicePrimaryCtxRelease(dev_); }

 private:
  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
};

TEST(MultiRuntimeCuda, TwoRuntimesTwoStreamsOneDeviceSameBits) {
  if (!test::cuda_usable()) GTEST_SKIP() << "no CUDA device: " << test::cuda_why();
  const Problem p = problem(BackendKind::Cuda, 300, 64, 700, 256);
  const ref::Inputs in = ref::make_inputs(300, 64, 700, 256, true, 5, ref::TopkKind::Benchmark);
  Runtime a, b;
  Runtime* rts[2] = {&a, &b};
  std::vector<tools::Outputs> outs(2);
  const auto errors = on_threads(2, [&](int i) {
    UseDevice use(0);
    auto plan = rts[i]->plan(p);
    tools::CaseRunner cr(p, in);  // its own stream
    outs[size_t(i)] = run_once(*plan, cr);
  });
  for (int i = 0; i < 2; ++i) ASSERT_EQ(errors[size_t(i)], "") << "thread " << i;
  EXPECT_TRUE(same(outs[0], outs[1])) << "two runtimes on two streams of one device differ";
  expect_reference(p, in, outs[0]);
}

TEST(MultiRuntimeCuda, APlanPerDevice) {
  const int n = cuda_devices();
  if (n < 2) GTEST_SKIP() << "needs two CUDA devices, found " << n;
  Runtime rt;  // one runtime, modules loaded per device
  const ref::Inputs in = ref::make_inputs(300, 64, 700, 256, true, 6, ref::TopkKind::Benchmark);
  std::vector<tools::Outputs> outs(2);
  const auto errors = on_threads(2, [&](int d) {
    UseDevice use(d);
    Problem p = problem(BackendKind::Cuda, 300, 64, 700, 256);
    p.device = d;
    auto plan = rt.plan(p);
    tools::CaseRunner cr(p, in);
    outs[size_t(d)] = run_once(*plan, cr);
  });
  for (int d = 0; d < 2; ++d) ASSERT_EQ(errors[size_t(d)], "") << "device " << d;
  EXPECT_TRUE(same(outs[0], outs[1])) << "devices 0 and 1 differ (same GPU model expected)";
  expect_reference(problem(BackendKind::Cuda, 300, 64, 700, 256), in, outs[0]);
}

TEST(MultiRuntimeCuda, SeqparOverNcclOnTwoDevices) {
  const int n = cuda_devices();
  if (n < 2) GTEST_SKIP() << "needs two CUDA devices, found " << n;
  std::string why;
  if (!nccl::available(*nccl::library(), &why)) GTEST_SKIP() << "NCCL is not installed here: " << why;
  const Problem whole = problem(BackendKind::Cuda, 301, 64, 700, 256);
  const ref::Inputs in = ref::make_inputs(301, 64, 700, 256, true, 8, ref::TopkKind::Benchmark);
  Runtime rt;
  // One process, a thread per rank; the id would cross a pipe between processes.
  const nccl::UniqueId id = nccl::unique_id(*nccl::library());
  std::vector<std::vector<tools::Outputs>> outs(2);
  const auto errors = on_threads(2, [&](int r) {
    UseDevice use(r);
    const seqpar::TokenRange g = seqpar::split(whole.T, r, 2);
    Problem rp = seqpar::rank_problem(whole, g);
    rp.device = r;
    auto plan = rt.plan(rp);
    Problem holder = whole;
    holder.dkv_fp32 = true, holder.device = r;
    tools::CaseRunner cr(holder, in);
    seqpar::NcclReducer red(id, r, 2, r);
    const Tensors t = seqpar::rank_view(whole, cr.tensors(), g);
    void* ws = cr.workspace(plan->workspace_bytes());
    for (int k = 0; k < 2; ++k) {
      cr.poison_outputs();
      seqpar::backward(*plan, t, ws, cr.workspace_size(), cr.stream(), red);
      outs[size_t(r)].push_back(cr.read_outputs());
    }
  });
  for (int r = 0; r < 2; ++r) ASSERT_EQ(errors[size_t(r)], "") << "rank " << r;
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(same(outs[size_t(r)][1], outs[size_t(r)][0])) << "rank " << r << ": reruns differ";
  // dq rows differ by design (each rank writes its own); the sums must match bit for bit.
  EXPECT_TRUE(tools::same_bits(outs[0][0].dkv_f32, outs[1][0].dkv_f32)) << "ranks hold different dkv sums";
  EXPECT_TRUE(tools::same_bits(outs[0][0].d_sink, outs[1][0].d_sink)) << "ranks hold different d_sink sums";

  tools::Outputs merged;
  const size_t row = size_t(whole.H) * D;
  merged.dq = outs[0][0].dq;
  const seqpar::TokenRange g1 = seqpar::split(whole.T, 1, 2);
  std::copy(outs[1][0].dq.begin() + g1.t0 * row, outs[1][0].dq.end(), merged.dq.begin() + g1.t0 * row);
  merged.dkv.resize(outs[0][0].dkv_f32.size());
  seqpar::round_to_bf16(outs[0][0].dkv_f32.data(), merged.dkv.data(), merged.dkv.size());
  merged.d_sink = outs[0][0].d_sink;
  expect_reference(whole, in, merged);

  // The one-GPU result, at the contract's bar (bits are not asserted: each rank plans its own T, whose config may differ).
  UseDevice use(0);
  tools::CaseRunner cr(whole, in);
  const tools::Outputs one = run_once(*rt.plan(whole), cr);
  auto widen = [](const std::vector<uint16_t>& v) {
    std::vector<double> d(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      const uint32_t u = uint32_t(v[i]) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      d[i] = f;
    }
    return d;
  };
  const auto cdq = ref::compare(widen(one.dq), merged.dq.data(), merged.dq.size());
  const auto cdkv = ref::compare(widen(one.dkv), merged.dkv.data(), merged.dkv.size());
  const auto cds = ref::compare(std::vector<double>(one.d_sink.begin(), one.d_sink.end()), merged.d_sink.data(),
                                merged.d_sink.size());
  EXPECT_TRUE(ref::meets_bar(cdq)) << "dq vs one GPU: rel_err " << cdq.rel_err;
  EXPECT_TRUE(ref::meets_bar(cdkv)) << "dkv vs one GPU: rel_err " << cdkv.rel_err;
  EXPECT_TRUE(ref::meets_bar(cds)) << "d_sink vs one GPU: rel_err " << cds.rel_err;
}

CUcontext current_context() {
  CUcontext c = nullptr;
  SMLA_CU(cuda::driver().CtxGetCurrent(&c));
  return c;
}

// A thread with device 0 current (a PyTorch thread) plans and runs for device 1: device 0 stays current throughout,
// and device 0's memory handed to the device-1 plan is refused by name before anything launches.
TEST(MultiRuntimeCuda, APlanForAnotherDeviceKeepsTheCallersContextAndRefusesItsMemory) {
  const int n = cuda_devices();
  if (n < 2) GTEST_SKIP() << "needs two CUDA devices, found " << n;
  const ref::Inputs in = ref::make_inputs(300, 64, 700, 256, true, 9, ref::TopkKind::Benchmark);
  Problem p = problem(BackendKind::Cuda, 300, 64, 700, 256);
  p.device = 1;
  UseDevice use0(0);
  const CUcontext ctx0 = current_context();
  Runtime rt;
  auto plan = rt.plan(p);
  EXPECT_EQ(current_context(), ctx0) << "plan() for device 1 changed the current context";

  tools::CaseRunner on0(p, in);  // device 0's memory (the current context's)
  void* ws0 = on0.workspace(plan->workspace_bytes());
  try {
    plan->run(on0.tensors(), ws0, on0.workspace_size(), on0.stream());
    ADD_FAILURE() << "a plan for device 1 accepted device 0's memory";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::InvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find("Tensors::q: expected memory on device 1 (got device 0)"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(current_context(), ctx0);

  tools::Outputs out;
  {
    UseDevice use1(1);  // CaseRunner allocates in the current context: device 1's
    const CUcontext ctx1 = current_context();
    tools::CaseRunner on1(p, in);
    void* ws1 = on1.workspace(plan->workspace_bytes());
    on1.poison_outputs();
    SMLA_CU(cuda::driver().CtxSetCurrent(ctx0));
    plan->run(on1.tensors(), ws1, on1.workspace_size(), on1.stream());
    EXPECT_EQ(current_context(), ctx0) << "run() for device 1 left device 1's context current";
    SMLA_CU(cuda::driver().CtxSetCurrent(ctx1));
    out = on1.read_outputs();
  }
  SMLA_CU(cuda::driver().CtxSetCurrent(ctx0));  // on0 frees in its own context
  expect_reference(p, in, out);
}

// The sequence-parallel tool on CUDA, one process a rank: each rank's tensors on its own GPU. They were all on device
// 0 (the runner took device 0's context; the reducer's is current only inside its calls), and rank 1's plan, for
// device 1, refused them.
TEST(MultiDeviceCuda, TheSeqparToolRunsEachRankOnItsGpu) {
  const int n = cuda_devices();
  if (n < 2) GTEST_SKIP() << "needs two CUDA devices, found " << n;
  std::string why;
  if (!nccl::available(*nccl::library(), &why)) GTEST_SKIP() << "NCCL is not installed here: " << why;
  const std::string exe = (fs::read_symlink("/proc/self/exe").parent_path() / "smla-seqpar").string();
  std::string out;
  FILE* f = ::popen((exe + " --backend cuda --ranks 2 --check --shape 301,64,700,256 2>&1").c_str(), "r");
  ASSERT_NE(f, nullptr);
  char buf[4096];
  for (size_t k; (k = std::fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, k);
  const int st = ::pclose(f);
  ASSERT_TRUE(WIFEXITED(st)) << out;
  EXPECT_EQ(WEXITSTATUS(st), 0) << out;
}

}  // namespace
}  // namespace smla
