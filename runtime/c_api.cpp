// c_api.cpp: the C API over the C++ one; exceptions become status codes + smla_last_error().
#include "smla/smla.h"

#include <memory>
#include <string>

#include "smla/smla.hpp"

struct smla_runtime {
  smla::Runtime rt;
};
struct smla_plan {
  std::shared_ptr<const smla::Plan> plan;
};

namespace {
thread_local std::string g_last_error;

template <class F>
smla_status_t guard(F&& f) {
  try {
    g_last_error.clear();
    f();
    return SMLA_OK;
  } catch (const smla::Error& e) {
    g_last_error = e.what();
    return static_cast<smla_status_t>(e.status());
  } catch (const std::exception& e) {
    g_last_error = std::string("smla: internal error: ") + e.what();
    return SMLA_INTERNAL;
  }
}

smla_status_t null_arg(const char* what) {
  g_last_error = std::string("smla: invalid argument: ") + what + " is null";
  return SMLA_INVALID_ARGUMENT;
}
}  // namespace

extern "C" {

void smla_problem_init(smla_problem_t* p) {
  if (!p) return;
  *p = smla_problem_t{};
  p->head_dim = 512;
}

void smla_tensors_init(smla_tensors_t* t) {
  if (t) *t = smla_tensors_t{};
}

smla_status_t smla_runtime_create(smla_runtime_t** out) {
  if (!out) return null_arg("out");
  return guard([&] { *out = new smla_runtime(); });
}

void smla_runtime_destroy(smla_runtime_t* rt) { delete rt; }

smla_status_t smla_plan_create(smla_runtime_t* rt, const smla_problem_t* p, smla_plan_t** out) {
  if (!rt) return null_arg("runtime");
  if (!p) return null_arg("problem");
  if (!out) return null_arg("out");
  return guard([&] {
    smla::Problem q;
    q.T = p->T, q.H = p->H, q.num_kv = p->num_kv, q.topk = p->topk, q.head_dim = p->head_dim;
    q.has_sink = p->has_sink != 0;
    if (p->scale > 0) q.scale = p->scale;
    q.r_chunk = p->r_chunk;
    q.lse.base2 = p->lse_base2 != 0;
    q.lse.includes_sink = p->lse_excludes_sink == 0;
    q.check_indices = p->check_indices != 0;
    q.dkv_fp32 = p->dkv_fp32 != 0;
    q.backend = static_cast<smla::BackendKind>(p->backend);
    q.device = p->device;
    auto plan = rt->rt.plan(q);
    *out = new smla_plan{std::move(plan)};
  });
}

void smla_plan_destroy(smla_plan_t* plan) { delete plan; }

smla_status_t smla_plan_workspace_bytes(const smla_plan_t* plan, size_t* bytes) {
  if (!plan) return null_arg("plan");
  if (!bytes) return null_arg("bytes");
  *bytes = plan->plan->workspace_bytes();
  return SMLA_OK;
}

smla_status_t smla_plan_run(const smla_plan_t* plan, const smla_tensors_t* t, void* workspace,
                            size_t workspace_bytes, void* stream) {
  if (!plan) return null_arg("plan");
  if (!t) return null_arg("tensors");
  return guard([&] {
    smla::Tensors x;
    x.q = t->q, x.kv = t->kv, x.o = t->o, x.dout = t->dout, x.lse = t->lse, x.topk = t->topk;
    x.attn_sink = t->attn_sink, x.dq = t->dq, x.dkv = t->dkv, x.d_sink = t->d_sink;
    x.q_stride_t = t->q_stride_t, x.q_stride_h = t->q_stride_h, x.o_stride_t = t->o_stride_t;
    x.o_stride_h = t->o_stride_h, x.do_stride_t = t->do_stride_t, x.do_stride_h = t->do_stride_h;
    x.dq_stride_t = t->dq_stride_t, x.dq_stride_h = t->dq_stride_h, x.kv_stride = t->kv_stride;
    x.dkv_stride = t->dkv_stride, x.lse_stride_t = t->lse_stride_t, x.lse_stride_h = t->lse_stride_h;
    x.topk_stride = t->topk_stride;
    auto d = [](smla_dtype_t v) { return static_cast<smla::DType>(v); };
    x.dtypes = {d(t->q_dtype),    d(t->kv_dtype),        d(t->o_dtype),  d(t->dout_dtype), d(t->lse_dtype),
                d(t->topk_dtype), d(t->attn_sink_dtype), d(t->dq_dtype), d(t->dkv_dtype),  d(t->d_sink_dtype)};
    plan->plan->run(x, workspace, workspace_bytes, stream);
  });
}

const char* smla_last_error(void) { return g_last_error.c_str(); }

const char* smla_status_string(smla_status_t s) { return smla::status_name(static_cast<smla::Status>(s)); }

}  // extern "C"
