// test_phases_gpu.cpp: each CUDA phase alone. Before every phase the GPU's whole state (workspace
// and outputs) is copied to the host; the CPU backend's phase (itself checked against the float64
// reference in test_cpu_phases) runs on that same state; the regions the phase writes must agree:
// exactly for the integer ones (csr, index report), at the contract's bar for the float ones (fp32 sums: 1e-4).
// Skipped with a message where no CUDA device is usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include <random>

#include "runtime/bf16.hpp"
#include "runtime/plan_impl.hpp"
#include "tests/e2e_common.hpp"
#include "tests/phase_compare.hpp"

namespace smla::test {
namespace {

struct State {
  std::vector<unsigned char> ws;
  std::vector<uint16_t> dq, dkv;
  std::vector<float> d_sink;
};

void check_phases(const Case& c, uint64_t seed) {
  const ref::Inputs in = make_case_inputs(c, seed);
  Problem pg = make_problem(BackendKind::Cuda, c);
  pg.check_indices = true;
  Problem pc = pg;
  pc.backend = BackendKind::Cpu;
  auto gplan = std::dynamic_pointer_cast<const PlanImpl>(shared_runtime().plan(pg));
  auto cplan = std::dynamic_pointer_cast<const PlanImpl>(shared_runtime().plan(pc));
  ASSERT_TRUE(gplan && cplan);
  // The two layouts hold the same regions in the same order; only their sizes may differ where a backend needs
  // scratch the other does not (CUDA's onesweep keeps its look-back in csr_hist). Regions are mapped by position.
  const WorkspaceLayout& L = gplan->layout_;
  const std::vector<const Region*> gr = L.regions(), hr = cplan->layout_.regions();
  ASSERT_EQ(gr.size(), hr.size());
  auto host_of = [&](const Region& r) -> const Region& {
    for (size_t i = 0; i < gr.size(); ++i)
      if (gr[i] == &r) return *hr[i];
    ADD_FAILURE() << "region " << r.name << " is not in the GPU layout";
    return r;
  };
  // With the fused dkv (H 64 on sm_90a: dq writes interm, no dkv_interm launch) the GPU has no P or dS regions; the
  // CPU's dq and dkv_interm then run against each GPU dq launch group, and interm is compared after it.
  const bool fused_dkv = gplan->shape_.fused_dkv();
  for (size_t i = 0; i < gr.size(); ++i) {
    ASSERT_STREQ(gr[i]->name, hr[i]->name);
    const std::string n = gr[i]->name;
    if (fused_dkv && (n == "ds" || n == "pm")) ASSERT_EQ(gr[i]->bytes, 0u) << n;
    else if (n != "csr_hist") ASSERT_EQ(gr[i]->bytes, hr[i]->bytes) << n;
  }
  const std::vector<float> lse = case_lse(c, in);
  tools::CaseRunner g(pg, in, &lse), h(pc, in, &lse);
  void* gws = g.workspace(gplan->workspace_bytes());
  void* hws = h.workspace(cplan->workspace_bytes());
  g.poison_outputs();
  const SmlaParams gbase = gplan->base_params(g.tensors(), gws, g.workspace_size());
  const SmlaParams hbase = cplan->base_params(h.tensors(), hws, h.workspace_size());
  const size_t nq = size_t(c.T) * c.H * 512, nkv = size_t(c.num_kv) * 512, ws = gplan->workspace_bytes();

  auto snapshot = [&]() {
    State s;
    s.ws.resize(ws);
    SMLA_CU(cuda::driver().MemcpyDtoH(s.ws.data(), reinterpret_cast<CUdeviceptr>(gws), ws));
    const tools::Outputs o = g.read_outputs();
    s.dq = o.dq, s.dkv = o.dkv, s.d_sink = o.d_sink;
    return s;
  };
  auto load_host = [&](const State& s) {
    for (size_t i = 0; i < gr.size(); ++i)
      std::memcpy(static_cast<char*>(hws) + hr[i]->offset, s.ws.data() + gr[i]->offset,
                  std::min(gr[i]->bytes, hr[i]->bytes));
    std::memcpy(h.tensors().dq, s.dq.data(), nq * 2);
    std::memcpy(h.tensors().dkv, s.dkv.data(), nkv * 2);
    if (c.sink) std::memcpy(h.tensors().d_sink, s.d_sink.data(), size_t(c.H) * 4);
  };

  // Group the launch lists by (phase, chunk): a CUDA phase may be several launches.
  auto groups = [](const PlanImpl& p) {
    std::vector<std::pair<std::string, std::vector<size_t>>> out;
    for (size_t i = 0; i < p.steps_.size(); ++i) {
      const std::string key = std::string(phase_name(p.steps_[i].phase)) + "/" + std::to_string(p.steps_[i].chunk) +
                              (p.steps_[i].t_count ? " tokens " + std::to_string(p.steps_[i].t_start) : "");
      if (out.empty() || out.back().first != key) out.push_back({key, {}});
      out.back().second.push_back(i);
    }
    return out;
  };
  const auto gg = groups(*gplan), hg = groups(*cplan);
  // The wgmma dq body computes delta itself at top-k chunk 0 of each token chunk (no delta launch on the GPU): the
  // CPU then runs its delta (every token) and dq/0 against each such GPU launch group, and delta/lse_n are compared
  // over that group's tokens.
  const bool gpu_delta = std::any_of(gg.begin(), gg.end(), [](const auto& x) { return x.first.rfind("delta/", 0) == 0; });
  const size_t gpu_dq_groups =
      size_t(std::count_if(gg.begin(), gg.end(), [](const auto& x) { return x.first.rfind("dq/", 0) == 0; }));
  EXPECT_EQ(fused_dkv, c.H == 64 && gplan->info().target == "sm_90a")
      << "the planner fuses dkv into dq exactly where a block holds every head, on sm_90a";
  ASSERT_EQ(gg.size() + (gpu_delta ? 0 : 1) + (fused_dkv ? gpu_dq_groups : 0), hg.size());
  std::vector<size_t> cpu_delta;
  for (size_t i = 0; i < cplan->steps_.size(); ++i)
    if (cplan->steps_[i].phase == Phase::Delta) cpu_delta.push_back(i);
  size_t hk = 0;
  for (size_t k = 0; k < gg.size(); ++k, ++hk) {
    SCOPED_TRACE(gg[k].first);
    const Step& first = gplan->steps_[gg[k].second.front()];
    std::vector<size_t> host_steps;
    if (!gpu_delta && hg[hk].first.rfind("delta/", 0) == 0) {
      ASSERT_EQ(first.phase, Phase::Dq) << gg[k].first;
      ++hk;  // the CPU's delta group: run below, before every first top-k chunk's dq
    }
    const bool fused_delta = !gpu_delta && first.phase == Phase::Dq && first.chunk == 0;
    if (fused_delta) host_steps = cpu_delta;
    ASSERT_EQ(gg[k].first, hg[hk].first);
    host_steps.insert(host_steps.end(), hg[hk].second.begin(), hg[hk].second.end());
    if (fused_dkv && first.phase == Phase::Dq) {
      ++hk;  // the CPU's dkv_interm of the same chunk, after its dq
      ASSERT_EQ(hg[hk].first, "dkv_interm" + gg[k].first.substr(2));
      host_steps.insert(host_steps.end(), hg[hk].second.begin(), hg[hk].second.end());
    }
    const State before = snapshot();
    load_host(before);
    for (size_t i : gg[k].second) gplan->launch_step(i, gbase, g.stream());
    for (size_t i : host_steps) cplan->launch_step(i, hbase, nullptr);
    g.sync();
    State after = snapshot();
    const unsigned char* hw = static_cast<const unsigned char*>(hws);
    const std::string ph = gg[k].first.substr(0, gg[k].first.find('/'));
    // The slots of a token's chunk after its last valid one: their P, dS and interm rows are unspecified (the sm_90a
    // bodies do not run the tiles past it, and nothing reads them: csr gives an empty slot no kv row), so the CPU's
    // rows are taken there. Slots before it, valid or not, are compared. valid_end[t]: 1 + token t's last valid slot.
    // The step's tokens (a token chunk's, or all): chunk rows are indexed by the token within the chunk.
    const int t0 = first.t_start, nt = first.t_count ? first.t_count : c.T;
    const int64_t rc = gbase.r_chunk, r0 = int64_t(first.chunk) * rc;
    std::vector<int64_t> valid_end(size_t(nt), 0);
    for (int t = 0; t < nt; ++t)
      for (int64_t rr = 0; rr < rc && r0 + rr < c.topk; ++rr) {
        const int32_t kv = in.topk[size_t(t0 + t) * c.topk + size_t(r0 + rr)];
        if (kv >= 0 && kv < c.num_kv) valid_end[size_t(t)] = rr + 1;
      }
    auto unspecified_tail = [&](const Region& r, size_t row_bytes) {
      for (int t = 0; t < nt; ++t)
        for (int64_t rr = valid_end[size_t(t)]; rr < rc; ++rr) {
          const size_t off = (size_t(t) * rc + size_t(rr)) * row_bytes;
          ASSERT_LE(off + row_bytes, r.bytes);
          std::memcpy(after.ws.data() + r.offset + off, hw + host_of(r).offset + off, row_bytes);
        }
    };
    if (ph == "dq" && !fused_dkv) unspecified_tail(L.ds, size_t(c.H) * 2), unspecified_tail(L.pm, size_t(c.H) * 2);
    if (ph == "dkv_interm" || (ph == "dq" && fused_dkv)) unspecified_tail(L.interm, 512 * 2);
    auto region = [&](const Region& r, bool bf16, bool integer, double bar = 1e-2) {
      compare_region(r.name, bf16, integer, after.ws.data() + r.offset, hw + host_of(r).offset, r.bytes, bar);
    };
    // delta, lse_n and d_sink are fp32 sums of the same rows on both sides (only their order and the exponential's
    // approximation differ), and the next phases of both take the GPU's: each held far tighter than the outputs'
    // bar, so that an error the bar would let through (1% of every lse) fails here.
    constexpr double kSumBar = 1e-4;
    if (ph == "check_topk") region(L.index_report, false, true);
    if (ph == "delta") region(L.delta, false, false, kSumBar), region(L.lse_n, false, false, kSumBar);
    if (fused_delta)  // this token chunk's rows
      for (const Region* r : {&L.delta, &L.lse_n}) {
        const size_t off = size_t(t0) * c.H * 4, bytes = size_t(nt) * c.H * 4;
        compare_region(r->name, false, false, after.ws.data() + r->offset + off, hw + host_of(*r).offset + off, bytes,
                       kSumBar);
      }
    if (ph == "dq") {
      region(L.ds, true, false), region(L.pm, true, false), region(L.dq_acc, false, false);  // (no ds, pm: fused)
      if (fused_dkv) region(L.interm, true, false);
      compare_region("dq", true, false, reinterpret_cast<const unsigned char*>(after.dq.data()),
                     static_cast<const unsigned char*>(h.tensors().dq), nq * 2);
    }
    if (ph == "dkv_interm") region(L.interm, true, false);
    if (ph == "csr") {
      region(L.row_ptr, false, true);
      // Every backend sorts the empty slots (key num_kv) last, stably: the whole final buffers are compared.
      region(gbase.csr_final ? L.csr_vals1 : L.csr_vals0, false, true);
      region(gbase.csr_final ? L.csr_keys1 : L.csr_keys0, false, true);
    }
    if (ph == "gather") {
      // fp32 sums of the same interm rows on both sides, only in another order: held to the sums' bar too (dq_acc is
      // not: each side makes its own bf16 dS and P inside that phase, whose roundings may differ)
      region(L.dkv_acc, false, false, kSumBar);
      compare_region("dkv", true, false, reinterpret_cast<const unsigned char*>(after.dkv.data()),
                     static_cast<const unsigned char*>(h.tensors().dkv), nkv * 2);
    }
    if (ph == "d_sink")
      compare_region("d_sink", false, false, reinterpret_cast<const unsigned char*>(after.d_sink.data()),
                     reinterpret_cast<const unsigned char*>(h.tensors().d_sink), size_t(c.H) * 4, kSumBar);
  }
}

TEST(PhasesGpu, EachPhaseAloneMatchesTheCheckedCpuPhase) {
  if (!cuda_usable()) GTEST_SKIP() << "no usable CUDA device here (" << cuda_why() << "): per-phase GPU check not run";
  using K = ref::TopkKind;
  const std::vector<Case> cases = {
      {63, 16, 300, 160, 80, true, K::Benchmark, true, true},
      {257, 64, 700, 512, 128, true, K::Benchmark, false, false, LseKind::Base2Excl, true},
      {40, 128, 90, 640, 0, false, K::Uniform, true, true},
      {1, 128, 20, 1152, 384, true, K::Uniform},
      // topk <= 320: the gather splits each row's contributors over four groups
      {300, 64, 1600, 96, 0, true, K::Benchmark, true, true},
      // token chunks (75, 75, 75, 32), with and without top-k chunks
      {257, 64, 700, 512, 128, true, K::Benchmark, true, true, LseKind::Aiter, false, 75},
      {257, 128, 1300, 160, 0, true, K::Benchmark, false, false, LseKind::Base2Excl, true, 75},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(describe(c));
    check_phases(c, 500 + std::random_device{}() % 100);
  }
}

}  // namespace
}  // namespace smla::test
