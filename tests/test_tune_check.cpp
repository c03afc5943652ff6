// test_tune_check.cpp: smla-tune's correctness check of a candidate (tools/tune_check.hpp), on the CPU backend.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>

#include "smla/smla.hpp"
#include "tools/tune_check.hpp"

namespace smla::tools {
namespace {

Problem tuned_problem() {
  Problem p;
  p.T = 4096, p.H = 16, p.num_kv = 5120, p.topk = 256, p.has_sink = true;
  p.backend = BackendKind::Cpu;
  return p;
}

// The last slot of `c`'s top-k that holds a row for some token (-1: none).
int last_valid_slot(const TuneCheckCase& c) {
  int last = -1;
  for (int t = 0; t < c.in.T; ++t)
    for (int r = 0; r < c.in.topk_n; ++r)
      if (c.in.topk[size_t(t) * c.in.topk_n + r] >= 0) last = std::max(last, r);
  return last;
}

// At a small T the benchmark top-k fills no slot past 128 + T/4; the second input fills every one, so that a config
// that mishandles the later tiles (or every top-k chunk after the first) cannot pass the check. Before, the check had
// only the first: at the seed's TOPK 512 and T 257, 320 of the 512 slots were never checked.
TEST(TuneCheck, SomeInputReachesEverySlot) {
  TuneChecker checker(tuned_problem(), 130, 7);
  ASSERT_EQ(checker.cases().size(), 2u);
  const TuneCheckCase& bench = checker.cases()[0];
  const TuneCheckCase& every = checker.cases()[1];
  EXPECT_EQ(bench.p.T, 130);
  EXPECT_EQ(every.p.T, 130);
  EXPECT_LT(last_valid_slot(bench), 128 + 130 / 4 + 1) << "the premise: the benchmark top-k leaves the tail empty";
  EXPECT_EQ(last_valid_slot(every), 255);
  std::vector<bool> seen(256, false);
  for (int t = 0; t < every.in.T; ++t)
    for (int r = 0; r < 256; ++r) seen[r] = seen[r] || every.in.topk[size_t(t) * 256 + r] >= 0;
  EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](bool b) { return b; })) << "a slot no token fills";
  // The benchmark input keeps the window's empty slots of the first tokens.
  EXPECT_EQ(bench.in.topk[1], -1);
}

// A plan that runs every launch but `skip` (its phase): what that phase writes is left from the run before.
class SkipsAPhase : public Plan {
 public:
  SkipsAPhase(std::shared_ptr<const Plan> inner, std::string skip) : inner_(std::move(inner)), skip_(std::move(skip)) {}
  const Problem& problem() const override { return inner_->problem(); }
  size_t workspace_bytes() const override { return inner_->workspace_bytes(); }
  void run(const Tensors& t, void* ws, size_t n, void* s) const override {
    for (size_t i = 0; i < inner_->launch_count(); ++i)
      if (inner_->launch_phase(i) != skip_) inner_->run_launch(i, t, ws, n, s);
  }
  std::optional<BadIndex> index_report(const void* ws, void* s) const override { return inner_->index_report(ws, s); }
  const PlanInfo& info() const override { return inner_->info(); }
  size_t launch_count() const override { return inner_->launch_count(); }
  void run_launch(size_t i, const Tensors& t, void* ws, size_t n, void* s) const override {
    inner_->run_launch(i, t, ws, n, s);
  }
  std::string launch_phase(size_t i) const override { return inner_->launch_phase(i); }

 private:
  std::shared_ptr<const Plan> inner_;
  std::string skip_;
};

// Each candidate runs on a poisoned workspace: one that does not write what a later phase reads (here: no delta) fails
// the check, even right after a correct candidate of the same workspace layout. Before, it passed on the correct
// candidate's leftovers.
TEST(TuneCheck, ACandidateLivingOffTheLastOnesWorkspaceFails) {
  Problem p = tuned_problem();
  p.topk = 64;
  TuneChecker checker(p, 40, 11);
  Runtime rt;
  EXPECT_EQ(checker.check([&](const Problem& q) { return rt.plan(q); }), "");
  bool has_delta = false;
  const auto real = rt.plan(checker.cases()[0].p);
  for (size_t i = 0; i < real->launch_count(); ++i) has_delta = has_delta || real->launch_phase(i) == "delta";
  ASSERT_TRUE(has_delta) << "the premise: the CPU plan has a delta launch";
  const std::string bad = checker.check(
      [&](const Problem& q) { return std::make_shared<SkipsAPhase>(rt.plan(q), "delta"); });
  EXPECT_NE(bad.find("benchmark top-k: dq"), std::string::npos) << bad;
  EXPECT_NE(bad.find("every slot: dq"), std::string::npos) << bad;
  // And the real plan passes again after it (nothing of the bad run's workspace is kept either).
  EXPECT_EQ(checker.check([&](const Problem& q) { return rt.plan(q); }), "");
}

}  // namespace
}  // namespace smla::tools
