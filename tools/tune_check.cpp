// tune_check.cpp: see tune_check.hpp.
#include "tools/tune_check.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace smla::tools {

TuneChecker::TuneChecker(const Problem& big, int check_t, uint64_t seed) {
  Problem p = big;
  p.T = std::min<int64_t>(big.T, check_t);
  p.t_chunk = 0;  // the caller's token chunk (of the real T) may not fit the small T; the planner chooses
  const int64_t scaled = std::max<int64_t>(1, std::llround(double(big.num_kv) * double(p.T) / double(big.T)));
  const struct {
    const char* name;
    int64_t num_kv;
    ref::TopkKind kind;
  } kinds[] = {{"benchmark top-k", scaled, ref::TopkKind::Benchmark},
               {"every slot", std::max<int64_t>(scaled, big.topk), ref::TopkKind::Uniform}};
  for (const auto& k : kinds) {
    TuneCheckCase c;
    c.name = k.name;
    c.p = p;
    c.p.num_kv = k.num_kv;
    c.in = ref::make_inputs(int(c.p.T), int(c.p.H), int(c.p.num_kv), int(c.p.topk), c.p.has_sink,
                            seed + cases_.size(), k.kind);
    c.ref = ref::backward(c.in);
    c.lse = ref::lse_in_mode(c.in, c.p.lse.base2, !c.p.lse.includes_sink);
    c.runner = std::make_unique<CaseRunner>(c.p, c.in, &c.lse);
    cases_.push_back(std::move(c));
  }
}

std::string TuneChecker::check(const std::function<std::shared_ptr<const Plan>(const Problem&)>& make_plan) {
  std::string bad;
  for (TuneCheckCase& c : cases_) {
    const std::shared_ptr<const Plan> plan = make_plan(c.p);
    plan->run(c.runner->tensors(), c.runner->poisoned_for_run(plan->workspace_bytes()), plan->workspace_bytes(),
              c.runner->stream());
    c.runner->sync();
    const Outputs out = c.runner->read_outputs();
    auto one = [&](const char* name, const ref::Compare& r) {
      if (!ref::meets_bar(r)) {
        char b[200];
        std::snprintf(b, sizeof(b), "%s: %s rel_err %.2e cos %.6f%s%s; ", c.name.c_str(), name, r.rel_err, r.cosine,
                      r.finite ? "" : " non-finite", r.unwritten ? " unwritten" : "");
        bad += b;
      }
    };
    const size_t nq = size_t(c.p.T) * c.p.H * 512, nkv = size_t(c.p.num_kv) * 512;
    one("dq", ref::compare(c.ref.dq, out.dq.data(), nq));
    if (c.p.dkv_fp32) one("dkv", ref::compare(c.ref.dkv, out.dkv_f32.data(), nkv));
    else one("dkv", ref::compare(c.ref.dkv, out.dkv.data(), nkv));
    if (c.p.has_sink) one("d_sink", ref::compare(c.ref.d_sink, out.d_sink.data(), size_t(c.p.H)));
  }
  return bad;
}

}  // namespace smla::tools
