// cpu_phases.hpp: the CPU backend's phases, one plain C++ function per phase, each doing exactly
// what docs/phases.md defines over the same SmlaParams (host pointers, same layouts, same
// workspace). Deterministic: each output element is produced by one thread in a fixed order.
#pragma once
#include <string>

#include "../../kernel_src/smla_params.h"

namespace smla::cpu {

void check_topk(const SmlaParams& p);
void delta(const SmlaParams& p);
void dq(const SmlaParams& p);
void dkv_interm(const SmlaParams& p);
/// The whole sort happens in every call (any pass): idempotent, so the planner may call it once
/// per chunk or once per radix pass. Leaves csr_hist untouched.
void csr(const SmlaParams& p);
void gather(const SmlaParams& p);
void d_sink(const SmlaParams& p);

/// Threads a phase uses: 0 (the default) min(cores, 16, its blocks); a test sets more, to reach the paths of a
/// machine with more cores than its own.
extern int threads_for_tests;

using PhaseFn = void (*)(const SmlaParams&);
/// The phase for a kernel entry name ("smla_dq", ...); null for an unknown name.
PhaseFn cpu_phase_fn(const std::string& entry_name);

}  // namespace smla::cpu
