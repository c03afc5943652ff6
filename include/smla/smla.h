/* smla.h: C API of smla (plain structs and status codes), for embedding from any language.
 *
 *   smla_runtime_t* rt; smla_runtime_create(&rt);
 *   smla_problem_t pb; smla_problem_init(&pb); pb.T = ...;
 *   smla_plan_t* plan; smla_plan_create(rt, &pb, &plan);   (or smla_plan_create_ex, with smla_plan_options_t)
 *   size_t ws; smla_plan_workspace_bytes(plan, &ws);
 *   smla_tensors_t t; smla_tensors_init(&t); t.q = ...;
 *   smla_plan_run(plan, &t, workspace, ws, stream);
 *   smla_plan_destroy(plan); smla_runtime_destroy(rt);
 *
 * C99 or later (or C++): the header's two inline functions are C99's `static inline`.
 *
 * Every call that can fail returns a status; on failure smla_last_error() (thread-local) says why, and a call that
 * succeeds clears it. No C++ exception leaves these functions.
 *
 * Memory: the bf16 tensors (q, kv, o, dout, dq, dkv) start on 16-byte boundaries, the float and int32 ones on 4-byte
 * ones, and the workspace on a 256-byte one (malloc's 16 is not enough on the CPU backend: use aligned_alloc(256,
 * ...); cudaMalloc and hipMalloc give 256). A pointer of the wrong kind of memory for the backend, or misaligned, is
 * refused by name; an output that can be read but not written (a read-only mapping) is not detected and faults.
 * Managed memory (cudaMallocManaged) is taken by the CUDA backend and, as host memory, by the CPU backend. */
#ifndef SMLA_H
#define SMLA_H
#include <stddef.h>
#include <stdint.h>

/* This header's version (the project's, CMakeLists.txt); smla_version() returns the library's: a caller can refuse
   a library older than the header it was built with. */
#define SMLA_VERSION_MAJOR 0
#define SMLA_VERSION_MINOR 1
#define SMLA_VERSION_PATCH 0
#define SMLA_VERSION (SMLA_VERSION_MAJOR * 10000 + SMLA_VERSION_MINOR * 100 + SMLA_VERSION_PATCH)

/* libsmla.so is built with hidden visibility: only what this header (and smla.hpp) declares is exported, so that
   the spdlog, fmt, nlohmann-json and xxHash compiled into it never bind to, or stand in for, a host program's own. */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#define SMLA_H_VISIBILITY_PUSHED
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  SMLA_OK = 0,
  SMLA_INVALID_ARGUMENT = 1,
  SMLA_UNSUPPORTED = 2,
  SMLA_NO_BACKEND = 3,
  SMLA_COMPILE_ERROR = 4,
  SMLA_DRIVER_ERROR = 5,
  SMLA_WORKSPACE_TOO_SMALL = 6,
  SMLA_INTERNAL = 7,
  SMLA_STATUS_INT32 = 0x7fffffff /* not a status: keeps the enum int-sized under -fshort-enums */
} smla_status_t;

/* Each enum has an int32 maximum among its values (not one to use): the structs keep their layout where a caller
   compiles with -fshort-enums. */
typedef enum {
  SMLA_BACKEND_AUTO = 0, SMLA_BACKEND_CPU = 1, SMLA_BACKEND_CUDA = 2, SMLA_BACKEND_HIP = 3,
  SMLA_BACKEND_INT32 = 0x7fffffff
} smla_backend_t;

typedef struct {
  int64_t T, H, num_kv, topk, head_dim; /* head_dim must be 512 */
  int has_sink;                         /* attn_sink given: d_sink produced */
  float scale;                          /* <= 0: 1/sqrt(512); NaN, inf and -inf are refused */
  int64_t r_chunk;                      /* 0: planner's choice (all of topk, or a tuning database's r_chunk
                                           for this problem where the tuning database
                                           (SMLA_TUNING_DB or its default) has one; past
                                           SMLA_INTERM_BUDGET_BYTES the tokens are split:
                                           smla_plan_options_t.t_chunk) */
  int lse_base2;                        /* lse is log2-based (TileLang's example forward) */
  int lse_excludes_sink;                /* lse leaves the sink out (FlashMLA's sparse forward: natural log, sink
                                           out, +inf for a token with no valid slot; its first sparse prefill
                                           forward, before attn_sink, documented base 2: check the release) */
  int check_indices;                    /* record the first out-of-range index */
  int dkv_fp32;                         /* dkv output is fp32, unreduced */
  smla_backend_t backend;
  int device;
} smla_problem_t;

/* Element types, optional: 0 (unspecified) is not checked; others must match what the op needs. */
typedef enum {
  SMLA_DTYPE_UNSPECIFIED = 0, SMLA_DTYPE_BF16 = 1, SMLA_DTYPE_F16 = 2, SMLA_DTYPE_F32 = 3,
  SMLA_DTYPE_I32 = 4, SMLA_DTYPE_I64 = 5, SMLA_DTYPE_F64 = 6, SMLA_DTYPE_INT32 = 0x7fffffff
} smla_dtype_t;

typedef struct {
  const void *q, *kv, *o, *dout; /* bf16 */
  const float* lse;
  const int32_t* topk;
  const float* attn_sink;
  void *dq, *dkv;
  float* d_sink;
  int64_t q_stride_t, q_stride_h, o_stride_t, o_stride_h, do_stride_t, do_stride_h, dq_stride_t, dq_stride_h;
  int64_t kv_stride, dkv_stride, lse_stride_t, lse_stride_h, topk_stride; /* 0: packed */
  smla_dtype_t q_dtype, kv_dtype, o_dtype, dout_dtype, lse_dtype, topk_dtype, attn_sink_dtype, dq_dtype,
      dkv_dtype, d_sink_dtype;
} smla_tensors_t;

typedef struct smla_runtime smla_runtime_t;
typedef struct smla_plan smla_plan_t;

/* What a plan can be asked for beyond smla_problem_t, whose layout stays as it was. Versioned by struct_size: a
   caller built against an older header passes a smaller struct and gets the defaults for what it lacks; a larger
   one than this library knows is accepted only if its unknown tail is zero. smla_plan_options_init sets the size and
   the defaults. */
typedef struct {
  size_t struct_size; /* sizeof(smla_plan_options_t) where the caller was compiled */
  int64_t t_chunk;    /* tokens a chunk: 0 the planner's choice (as few equal chunks as keep the intermediate within
                         SMLA_INTERM_BUDGET_BYTES), else 1..T; smaller chunks, smaller workspace (Problem::t_chunk) */
} smla_plan_options_t;

/* Where a plan's tiles and bodies came from (PlanInfo::config_source in C++): the planner's heuristic, a tuning
   database's entry (SMLA_TUNING_DB), or the caller's TileConfig (C++ only). Part of what decides the output bits
   (README, "Determinism"). 0 is a library older than the field. */
typedef enum {
  SMLA_CONFIG_UNKNOWN = 0, SMLA_CONFIG_HEURISTIC = 1, SMLA_CONFIG_TUNED = 2, SMLA_CONFIG_EXPLICIT = 3,
  SMLA_CONFIG_INT32 = 0x7fffffff
} smla_config_source_t;

/* What the planner chose (PlanInfo in C++), versioned like smla_plan_options_t; smla_plan_info_init sets the size. */
typedef struct {
  size_t struct_size;
  int64_t r_chunk, n_chunks; /* top-k slots a chunk, top-k chunks */
  int64_t t_chunk, t_chunks; /* tokens a chunk, token chunks */
  size_t workspace_bytes;
  int64_t backend;           /* the smla_backend_t the plan runs on (CPU, CUDA or HIP; never AUTO): whether its
                                tensors are host or device memory, where smla_problem_t asked for SMLA_BACKEND_AUTO */
  int64_t compiled;          /* kernels this smla_plan_create compiled (0 where a warmed cache held them all) */
  int64_t loaded_from_disk;  /* kernels it loaded from the disk cache */
  int64_t reused_in_process; /* kernels this runtime had loaded already (by an earlier plan) */
  int64_t config_source;     /* an smla_config_source_t */
} smla_plan_info_t;

void smla_problem_init(smla_problem_t* p);   /* defaults: head_dim 512, natural sink-inclusive lse */
/* The versioned structs' defaults, for struct_size bytes: the caller's sizeof, where the caller was compiled (a struct
   from an older or newer header is written to its own end, no further). For bindings that cannot use the inline
   functions below (Python's ctypes: pass ctypes.sizeof). A size under 8, over 4096, or below this header's sizeof and
   not a multiple of 8 (not the end of a field) writes nothing; one from this sizeof up to 4096 (a newer header's
   struct) is taken whole. */
void smla_plan_options_init_sized(smla_plan_options_t* o, size_t struct_size);
void smla_plan_info_init_sized(smla_plan_info_t* i, size_t struct_size);
static inline void smla_plan_options_init(smla_plan_options_t* o) {
  smla_plan_options_init_sized(o, sizeof(smla_plan_options_t));
}
static inline void smla_plan_info_init(smla_plan_info_t* i) { smla_plan_info_init_sized(i, sizeof(smla_plan_info_t)); }
void smla_tensors_init(smla_tensors_t* t);   /* all null / packed */
smla_status_t smla_runtime_create(smla_runtime_t** out);
/* A plan keeps what it runs on alive: it may be used and destroyed after its runtime is. */
void smla_runtime_destroy(smla_runtime_t* rt);
/* *out is set to NULL first (when out is not null), so a failed create leaves nothing to destroy. */
smla_status_t smla_plan_create(smla_runtime_t* rt, const smla_problem_t* p, smla_plan_t** out);
/* smla_plan_create with options; opt null: the defaults (the same as smla_plan_create). */
smla_status_t smla_plan_create_ex(smla_runtime_t* rt, const smla_problem_t* p, const smla_plan_options_t* opt,
                                  smla_plan_t** out);
void smla_plan_destroy(smla_plan_t* plan);
/* Fills the fields of *info that its struct_size covers. */
smla_status_t smla_plan_info(const smla_plan_t* plan, smla_plan_info_t* info);
/* *bytes is 0 on failure (a null plan). */
smla_status_t smla_plan_workspace_bytes(const smla_plan_t* plan, size_t* bytes);
smla_status_t smla_plan_run(const smla_plan_t* plan, const smla_tensors_t* t, void* workspace,
                            size_t workspace_bytes, void* stream);
/* The first out-of-range top-k index of the last run (a plan made with check_indices), read back from the workspace's
   first 16 bytes (it waits for `stream`): *found 1 and *out filled, or *found 0 when every index was in range. On any failure *found
   is 0 and *out zero (where they are not null). */
typedef struct {
  int64_t count;  /* how many slots were out of range */
  int64_t t, r;   /* the first one's token and slot */
  int64_t value;  /* its index */
} smla_bad_index_t;
smla_status_t smla_plan_index_report(const smla_plan_t* plan, const void* workspace, void* stream,
                                     smla_bad_index_t* out, int* found);
/* The last error message of this thread ("" when none). The text stays valid until the next smla_* call on this
   thread: copy it to keep it. */
const char* smla_last_error(void);
/* SMLA_VERSION of the library linked. */
int smla_version(void);
const char* smla_status_string(smla_status_t s);

#ifdef __cplusplus
}
#endif
#ifdef SMLA_H_VISIBILITY_PUSHED
#pragma GCC visibility pop
#undef SMLA_H_VISIBILITY_PUSHED
#endif
#endif /* SMLA_H */
