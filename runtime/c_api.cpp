// c_api.cpp: the C API over the C++ one; exceptions become status codes + smla_last_error().
#include "smla/smla.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <string>

#include "smla/smla.hpp"

#if defined(SMLA_PROJECT_VERSION_MAJOR)
static_assert(SMLA_VERSION_MAJOR == SMLA_PROJECT_VERSION_MAJOR && SMLA_VERSION_MINOR == SMLA_PROJECT_VERSION_MINOR &&
                  SMLA_VERSION_PATCH == SMLA_PROJECT_VERSION_PATCH,
              "smla.h's SMLA_VERSION_* and CMakeLists.txt's project(VERSION) disagree");
#endif

struct smla_runtime {
  smla::Runtime rt;
};
struct smla_plan {
  std::shared_ptr<const smla::Plan> plan;
};

namespace {
// The message smla_last_error() returns: g_last_error's text, or a fixed one where the message could not be made (no
// memory). Nothing here throws: no exception may leave a C function.
thread_local std::string g_last_error;
thread_local const char* g_last_error_text = "";

template <class Make>
void set_error(Make&& make) noexcept {
  try {
    g_last_error = make();
    g_last_error_text = g_last_error.c_str();
  } catch (...) {
    g_last_error_text = "smla: an error occurred, and its message could not be made (out of memory)";
  }
}
void clear_error() noexcept { g_last_error_text = ""; }

// An error in the C API's terms: the messages name the C++ API's fields and calls ("Problem::t_chunk = 51",
// "Tensors::q", "workspace_bytes()"), which a C caller does not have; the C structs' and functions' names instead, and
// scale's C convention. Every C function's error goes through it (guard).
std::string in_c_terms(std::string m) {
  auto replace_all = [&m](const std::string& from, const std::string& to) {
    for (size_t i = m.find(from); i != std::string::npos; i = m.find(from, i + to.size())) m.replace(i, from.size(), to);
  };
  replace_all("Problem::t_chunk", "smla_plan_options_t.t_chunk");
  replace_all("Problem::scale = ", "smla_problem_t.scale = ");
  replace_all("expected a finite positive number", "expected a finite positive number, or <= 0 for the default");
  replace_all("Problem::lse.includes_sink", "smla_problem_t.lse_excludes_sink");
  replace_all("Problem::lse.base2", "smla_problem_t.lse_base2");
  replace_all("Problem::", "smla_problem_t.");
  replace_all("Tensors::", "smla_tensors_t.");
  // C++'s "Tensors::lse dtype" (Tensors::dtypes.lse) is the C struct's own field.
  for (const char* t : {"q", "kv", "o", "dout", "lse", "topk", "attn_sink", "dq", "dkv", "d_sink"})
    replace_all(std::string("smla_tensors_t.") + t + " dtype", std::string("smla_tensors_t.") + t + "_dtype");
  replace_all("index_report()", "smla_plan_index_report()");
  replace_all("workspace_bytes()", "smla_plan_workspace_bytes()");
  replace_all("run(): ", "smla_plan_run(): ");
  return m;
}

template <class F>
smla_status_t guard(F&& f) noexcept {
  try {
    clear_error();
    f();
    return SMLA_OK;
  } catch (const smla::Error& e) {
    set_error([&] { return in_c_terms(e.what()); });
    return static_cast<smla_status_t>(e.status());
  } catch (const std::exception& e) {
    set_error([&] { return std::string("smla: internal error: ") + e.what(); });
    return SMLA_INTERNAL;
  } catch (...) {
    set_error([] { return std::string("smla: internal error: an exception of unknown type"); });
    return SMLA_INTERNAL;
  }
}

smla_status_t null_arg(const char* what) noexcept {
  set_error([&] { return std::string("smla: invalid argument: ") + what + " is null"; });
  return SMLA_INVALID_ARGUMENT;
}

template <class Make>
smla_status_t bad_arg(Make&& why) noexcept {
  set_error([&] { return "smla: invalid argument: " + why(); });
  return SMLA_INVALID_ARGUMENT;
}

// The largest struct_size taken from a caller (the versioned structs are tens of bytes): a garbage size, from a struct
// never initialised, is refused instead of read as that many bytes of the caller's memory.
constexpr size_t kMaxStructSize = 4096;

// A versioned struct from the caller: its struct_size must cover the size field itself; past sizeof(S) (what this
// library knows) every byte must be zero (else a newer caller asks for something this library cannot do).
// On success `into` holds the defaults it came with, overwritten by the part of the caller's struct this library knows.
// Every field of the versioned structs is 8 bytes, so a struct_size inside what this library knows must be a multiple
// of 8: anything else cuts a field in two (and would read or write half of it).
template <class S>
bool struct_size_ok(size_t n) noexcept {
  static_assert(sizeof(S) % 8 == 0, "versioned C structs: 8-byte fields only");
  return n >= sizeof(size_t) && (n >= sizeof(S) || n % 8 == 0) && n <= kMaxStructSize;
}

template <class S>
smla_status_t check_struct_size(size_t n, const char* what) noexcept {
  if (!struct_size_ok<S>(n))
    return bad_arg([&] {
      return std::string(what) + ".struct_size is " + std::to_string(n) +
             (n > kMaxStructSize ? " (more than " + std::to_string(kMaxStructSize) + " bytes: an uninitialised struct?"
                                 : std::string(" (not the end of one of its fields")) +
             ": set it with its _init function)";
    });
  return SMLA_OK;
}

template <class S>
smla_status_t read_versioned(const S* from, S& into, const char* what) noexcept {
  const size_t n = from->struct_size;
  if (const smla_status_t st = check_struct_size<S>(n, what); st != SMLA_OK) return st;
  const unsigned char* b = reinterpret_cast<const unsigned char*>(from);
  for (size_t i = sizeof(S); i < n; ++i)
    if (b[i] != 0)
      return bad_arg([&] {
        return std::string(what) + " has fields this library does not know (struct_size " + std::to_string(n) +
               ", known " + std::to_string(sizeof(S)) + ", byte " + std::to_string(i) + " nonzero)";
      });
  std::memcpy(&into, from, std::min(n, sizeof(S)));
  into.struct_size = sizeof(S);
  return SMLA_OK;
}

// What the _init_sized functions write: `n` bytes of the caller's struct (its sizeof where it was compiled; an older
// or newer header's size alike), zero but for struct_size; nothing for a size that is not a struct's.
template <class S>
void init_sized(S* s, size_t n) noexcept {
  if (!s || !struct_size_ok<S>(n)) return;
  std::memset(static_cast<void*>(s), 0, n);
  s->struct_size = n;  // every default is zero so far: a default that is not goes here, for the fields n covers
}
}  // namespace

// A C enum field as the int a C caller stored in it, whatever its value: in C++ reading an enum without a fixed
// underlying type that holds a value outside its enumerators' range (a backend of 7, a dtype of 42: what the checks
// below exist to refuse) is undefined behaviour, which -fstrict-enums would let the compiler fold the checks away on.
template <class E>
int enum_bits(const E& e) {
  static_assert(sizeof(E) == sizeof(int), "the C enums are int-sized");
  int v;
  std::memcpy(&v, &e, sizeof v);
  return v;
}

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
  *out = nullptr;  // as smla_plan_create_ex: nothing the caller could take for a runtime on failure
  return guard([&] { *out = new smla_runtime(); });
}

void smla_runtime_destroy(smla_runtime_t* rt) { delete rt; }

void smla_plan_options_init_sized(smla_plan_options_t* o, size_t struct_size) { init_sized(o, struct_size); }

void smla_plan_info_init_sized(smla_plan_info_t* i, size_t struct_size) { init_sized(i, struct_size); }

smla_status_t smla_plan_create(smla_runtime_t* rt, const smla_problem_t* p, smla_plan_t** out) {
  return smla_plan_create_ex(rt, p, nullptr, out);
}

smla_status_t smla_plan_create_ex(smla_runtime_t* rt, const smla_problem_t* p, const smla_plan_options_t* opt,
                                  smla_plan_t** out) {
  if (out) *out = nullptr;  // first: nothing the caller could take for a plan on any failure
  if (!rt) return null_arg("runtime");
  if (!p) return null_arg("problem");
  if (!out) return null_arg("out");
  smla_plan_options_t o;
  smla_plan_options_init(&o);
  if (opt) {
    const smla_status_t st = read_versioned(opt, o, "smla_plan_options_t");
    if (st != SMLA_OK) return st;
  }
  return guard([&] {
    smla::Problem q;
    q.T = p->T, q.H = p->H, q.num_kv = p->num_kv, q.topk = p->topk, q.head_dim = p->head_dim;
    q.has_sink = p->has_sink != 0;
    // <= 0: the default; NaN and +-inf go on to be refused by name (-inf is not "a scale <= 0")
    if (!(p->scale <= 0) || std::isinf(p->scale)) q.scale = p->scale;
    q.r_chunk = p->r_chunk;
    q.lse.base2 = p->lse_base2 != 0;
    q.lse.includes_sink = p->lse_excludes_sink == 0;
    q.check_indices = p->check_indices != 0;
    q.dkv_fp32 = p->dkv_fp32 != 0;
    q.backend = static_cast<smla::BackendKind>(enum_bits(p->backend));
    q.device = p->device;
    q.t_chunk = o.t_chunk;
    *out = new smla_plan{rt->rt.plan(q)};
  });
}

void smla_plan_destroy(smla_plan_t* plan) { delete plan; }

smla_status_t smla_plan_info(const smla_plan_t* plan, smla_plan_info_t* info) {
  if (!plan) return null_arg("plan");
  if (!info) return null_arg("info");
  if (const smla_status_t st = check_struct_size<smla_plan_info_t>(info->struct_size, "smla_plan_info_t"); st != SMLA_OK)
    return st;
  return guard([&] {
    const smla::PlanInfo& pi = plan->plan->info();
    smla_plan_info_t i;
    smla_plan_info_init(&i);
    i.r_chunk = pi.r_chunk, i.n_chunks = pi.n_chunks, i.t_chunk = pi.t_chunk, i.t_chunks = pi.t_chunks;
    i.workspace_bytes = plan->plan->workspace_bytes();
    const std::string& be = pi.backend;
    i.backend = be == "cpu" ? SMLA_BACKEND_CPU : be == "cuda" ? SMLA_BACKEND_CUDA : be == "hip" ? SMLA_BACKEND_HIP : -1;
    i.compiled = pi.compiled, i.loaded_from_disk = pi.loaded_from_disk, i.reused_in_process = pi.reused_in_process;
    const std::string& cs = pi.config_source;
    i.config_source = cs == "heuristic" ? SMLA_CONFIG_HEURISTIC
                      : cs == "tuned"   ? SMLA_CONFIG_TUNED
                      : cs == "explicit" ? SMLA_CONFIG_EXPLICIT
                                         : SMLA_CONFIG_UNKNOWN;
    // Only the part the caller's struct has: an older caller's smaller struct is left whole past its end.
    const size_t n = std::min(info->struct_size, sizeof(i));
    std::memcpy(reinterpret_cast<unsigned char*>(info) + sizeof(size_t),
                reinterpret_cast<const unsigned char*>(&i) + sizeof(size_t), n - sizeof(size_t));
  });
}

smla_status_t smla_plan_workspace_bytes(const smla_plan_t* plan, size_t* bytes) {
  if (bytes) *bytes = 0;
  if (!plan) return null_arg("plan");
  if (!bytes) return null_arg("bytes");
  *bytes = plan->plan->workspace_bytes();
  clear_error();  // as every other call that succeeds
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
    auto d = [](const smla_dtype_t& v) { return static_cast<smla::DType>(enum_bits(v)); };
    x.dtypes = {d(t->q_dtype),    d(t->kv_dtype),        d(t->o_dtype),  d(t->dout_dtype), d(t->lse_dtype),
                d(t->topk_dtype), d(t->attn_sink_dtype), d(t->dq_dtype), d(t->dkv_dtype),  d(t->d_sink_dtype)};
    plan->plan->run(x, workspace, workspace_bytes, stream);
  });
}

smla_status_t smla_plan_index_report(const smla_plan_t* plan, const void* workspace, void* stream,
                                     smla_bad_index_t* out, int* found) {
  // Cleared first: on any failure the caller reads "nothing found", not what its variables held.
  if (found) *found = 0;
  if (out) *out = smla_bad_index_t{};
  if (!plan) return null_arg("plan");
  if (!out) return null_arg("out");
  if (!found) return null_arg("found");
  return guard([&] {
    const std::optional<smla::BadIndex> b = plan->plan->index_report(workspace, stream);
    *found = b ? 1 : 0;
    *out = smla_bad_index_t{};
    if (b) out->count = b->count, out->t = b->t, out->r = b->r, out->value = b->value;
  });
}

const char* smla_last_error(void) { return g_last_error_text; }

int smla_version(void) { return SMLA_VERSION; }

const char* smla_status_string(smla_status_t s) { return smla::status_name(static_cast<smla::Status>(enum_bits(s))); }

}  // extern "C"
