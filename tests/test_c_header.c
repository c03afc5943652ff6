/* test_c_header.c: smla.h as a C program sees it (compiled as C99, linked against libsmla): the init functions, the
 * versioned option and info structs, and a plan with token chunks on the CPU backend; a bad t_chunk is refused with
 * a message; enum fields outside their enumerators. Exit status 0 when every check holds, 1 otherwise (each failure printed). */
#include <stdio.h>
#include <string.h>

#include "smla/smla.h"

static int failures = 0;
#define EXPECT(cond)                                                             \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "%s:%d: expected %s (last error: %s)\n", __FILE__, __LINE__, \
              #cond, smla_last_error());                                         \
      ++failures;                                                                \
    }                                                                            \
  } while (0)

int main(void) {
  smla_runtime_t* rt = NULL;
  smla_problem_t pb;
  smla_plan_options_t opt;
  smla_plan_info_t info;
  smla_plan_t* plan = NULL;
  size_t ws = 0;

  EXPECT(smla_runtime_create(&rt) == SMLA_OK);
  smla_problem_init(&pb);
  EXPECT(pb.head_dim == 512);
  pb.T = 50, pb.H = 16, pb.num_kv = 120, pb.topk = 64, pb.backend = SMLA_BACKEND_CPU;
  smla_plan_options_init(&opt);
  EXPECT(opt.struct_size == sizeof(smla_plan_options_t) && opt.t_chunk == 0);
  opt.t_chunk = 20;
  EXPECT(smla_plan_create_ex(rt, &pb, &opt, &plan) == SMLA_OK);
  if (plan) {
    smla_plan_info_init(&info);
    EXPECT(smla_plan_info(plan, &info) == SMLA_OK);
    EXPECT(info.t_chunk == 20 && info.t_chunks == 3 && info.r_chunk == 64 && info.n_chunks == 1);
    EXPECT(info.backend == SMLA_BACKEND_CPU);
    EXPECT(info.compiled == 0 && info.loaded_from_disk == 0); /* the CPU backend compiles nothing */
    EXPECT(info.config_source == SMLA_CONFIG_HEURISTIC);
    EXPECT(smla_plan_workspace_bytes(plan, &ws) == SMLA_OK && ws == info.workspace_bytes && ws > 0);
    smla_plan_destroy(plan);
    plan = NULL;
  }
  /* SMLA_BACKEND_AUTO: the plan says which backend it took (host or device tensors), never AUTO */
  pb.backend = SMLA_BACKEND_AUTO;
  EXPECT(smla_plan_create_ex(rt, &pb, &opt, &plan) == SMLA_OK);
  if (plan) {
    smla_plan_info_init(&info);
    EXPECT(smla_plan_info(plan, &info) == SMLA_OK);
    EXPECT(info.backend == SMLA_BACKEND_CPU || info.backend == SMLA_BACKEND_CUDA || info.backend == SMLA_BACKEND_HIP);
    smla_plan_destroy(plan);
    plan = NULL;
  }
  pb.backend = SMLA_BACKEND_CPU;
  opt.t_chunk = 51;
  EXPECT(smla_plan_create_ex(rt, &pb, &opt, &plan) == SMLA_INVALID_ARGUMENT && plan == NULL);
  EXPECT(strstr(smla_last_error(), "t_chunk") != NULL);
  EXPECT(strstr(smla_last_error(), "smla_plan_options_t.t_chunk") != NULL); /* the C struct's name, not C++'s */
  EXPECT(strstr(smla_last_error(), "Problem::") == NULL);
  EXPECT(strstr(smla_last_error(), "smla: invalid argument: smla:") == NULL); /* said once */
  /* A C enum holds any int: one outside the enumerators is refused by name (read without undefined behaviour on the
   * C++ side, which the sanitizer build checks), and a status string is given for any value. */
  opt.t_chunk = 0;
  pb.backend = (smla_backend_t)7;
  EXPECT(smla_plan_create_ex(rt, &pb, &opt, &plan) == SMLA_INVALID_ARGUMENT && plan == NULL);
  EXPECT(strstr(smla_last_error(), "backend") != NULL);
  pb.backend = (smla_backend_t)-1;
  EXPECT(smla_plan_create_ex(rt, &pb, &opt, &plan) == SMLA_INVALID_ARGUMENT && plan == NULL);
  EXPECT(smla_status_string((smla_status_t)99) != NULL && smla_status_string(SMLA_OK) != NULL);
  smla_runtime_destroy(rt);
  if (failures == 0) printf("smla.h as C: all checks passed\n");
  return failures ? 1 : 0;
}
