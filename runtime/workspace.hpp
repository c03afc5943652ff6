// workspace.hpp: the one typed layout of the workspace. The same function sizes it (plan) and
// places it (run), so the two can never drift.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "phases.hpp"
#include "../kernel_src/smla_params.h"

namespace smla {

struct Region {
  const char* name;
  size_t offset = 0;
  size_t bytes = 0;
};

struct WorkspaceLayout {
  static constexpr size_t kAlign = 256;
  Region delta{"delta"}, lse_n{"lse_n"}, dq_acc{"dq_acc"}, ds{"ds"}, pm{"pm"}, interm{"interm"};
  Region csr_keys0{"csr_keys0"}, csr_keys1{"csr_keys1"}, csr_vals0{"csr_vals0"}, csr_vals1{"csr_vals1"};
  Region csr_hist{"csr_hist"}, row_ptr{"row_ptr"}, dkv_acc{"dkv_acc"}, index_report{"index_report"};
  size_t total = 0;

  std::vector<const Region*> regions() const;
  /// Points the workspace fields of `p` into `base` (null regions stay null).
  void place(void* base, SmlaParams& p) const;
};

WorkspaceLayout layout_workspace(const ShapeInfo& s);

}  // namespace smla
