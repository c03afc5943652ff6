// tune_check.hpp: smla-tune's correctness check of a candidate config, against the float64 reference at a small T.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "smla/smla.hpp"
#include "tests/reference/reference.hpp"
#include "tools/case_runner.hpp"

namespace smla::tools {

/// One input a candidate is checked on.
struct TuneCheckCase {
  std::string name;  ///< "benchmark top-k", "every slot"
  Problem p;
  ref::Inputs in;
  ref::Grads ref;
  std::vector<float> lse;  ///< in p's lse convention
  std::unique_ptr<CaseRunner> runner;
};

/// The problem to tune at T = min(T, check_t), with the same H, topk, sink, lse convention and dkv type, on two
/// inputs, each against its own float64 reference:
/// - the benchmark top-k with num_kv scaled by the T ratio: the window's -1 slots of the first tokens, tokens whose
///   last tiles are empty;
/// - a uniform top-k over at least topk rows, in which every slot holds a row for some tokens: at a small T the benchmark top-k leaves every slot past 128 + T/4 empty
///   (a pool row is visible only from token 4 (j + 1) - 1 on), so a config that mishandles the later tiles or every
///   top-k chunk after the first would pass on it alone.
/// Every run starts on poisoned outputs and a poisoned workspace: a config passes on what it computes, not on what
/// the config checked before it left in the workspace.
class TuneChecker {
 public:
  TuneChecker(const Problem& big, int check_t, uint64_t seed);
  /// "" when every case meets the contract's bar with the plan `make_plan` gives for its problem; else what failed,
  /// naming the case.
  std::string check(const std::function<std::shared_ptr<const Plan>(const Problem&)>& make_plan);
  const std::vector<TuneCheckCase>& cases() const { return cases_; }

 private:
  std::vector<TuneCheckCase> cases_;
};

}  // namespace smla::tools
