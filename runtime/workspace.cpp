// workspace.cpp: named, aligned regions of the workspace.
#include "workspace.hpp"

#include <algorithm>
#include <cstdint>

namespace smla {

std::vector<const Region*> WorkspaceLayout::regions() const {
  return {&index_report, &delta, &lse_n, &dq_acc, &ds, &pm, &interm, &csr_keys0, &csr_keys1,
          &csr_vals0, &csr_vals1, &csr_hist, &row_ptr, &dkv_acc};
}

WorkspaceLayout layout_workspace(const ShapeInfo& s) {
  WorkspaceLayout w;
  size_t cursor = 0;
  auto put = [&](Region& r, size_t bytes) {
    r.offset = cursor;
    r.bytes = bytes;
    cursor += (bytes + WorkspaceLayout::kAlign - 1) / WorkspaceLayout::kAlign * WorkspaceLayout::kAlign;
  };
  const size_t T = s.T, H = s.H, KV = s.num_kv, D = SMLA_D;
  const size_t items = static_cast<size_t>(s.chunk_items());  // one chunk's slots
  // The index report first: index_report() is given a workspace but not its size, so the report is where any
  // workspace holds it (at the end, a smaller buffer than the plan's, another plan's, was read past its end).
  put(w.index_report, 4 * sizeof(int));
  put(w.delta, T * H * sizeof(float));
  put(w.lse_n, T * H * sizeof(float));
  // dQ's carry across top-k chunks, for one token chunk: the token chunks run one after another on one stream (dq never
  // leaves it) and a chunk's carry is dead after its last top-k chunk, so the next token chunk reuses the rows.
  const size_t carry_tokens = s.t_chunk > 0 ? static_cast<size_t>(s.t_chunk) : T;
  put(w.dq_acc, s.n_chunks > 1 ? carry_tokens * H * D * sizeof(float) : 0);
  // P and dS reach memory only for dkv_interm: with dkv_impl 4 on sm_90a the dq body writes interm itself.
  const size_t pds_items = s.fused_dkv() ? 0 : items;
  put(w.ds, pds_items * H * sizeof(smla_bf16));
  put(w.pm, pds_items * H * sizeof(smla_bf16));
  put(w.interm, items * D * sizeof(smla_bf16));
  put(w.csr_keys0, items * sizeof(int));
  put(w.csr_keys1, items * sizeof(int));
  put(w.csr_vals0, items * sizeof(int));
  put(w.csr_vals1, items * sizeof(int));
  put(w.csr_hist, s.csr_sort_temp_bytes);  // the backend's sort scratch (none on the CPU)
  put(w.row_ptr, (KV + 1) * sizeof(int));
  put(w.dkv_acc, s.all_chunks() > 1 ? KV * D * sizeof(float) : 0);
  w.total = cursor;
  return w;
}

void WorkspaceLayout::place(void* base, SmlaParams& p) const {
  auto at = [&](const Region& r) -> void* {
    return r.bytes ? static_cast<void*>(static_cast<char*>(base) + r.offset) : nullptr;
  };
  p.delta = static_cast<float*>(at(delta));
  p.lse_n = static_cast<float*>(at(lse_n));
  p.dq_acc = static_cast<float*>(at(dq_acc));
  p.ds = static_cast<smla_bf16*>(at(ds));
  p.pm = static_cast<smla_bf16*>(at(pm));
  p.interm = static_cast<smla_bf16*>(at(interm));
  p.csr_keys[0] = static_cast<int*>(at(csr_keys0));
  p.csr_keys[1] = static_cast<int*>(at(csr_keys1));
  p.csr_vals[0] = static_cast<int*>(at(csr_vals0));
  p.csr_vals[1] = static_cast<int*>(at(csr_vals1));
  p.csr_hist = static_cast<int*>(at(csr_hist));
  p.row_ptr = static_cast<int*>(at(row_ptr));
  p.dkv_acc = static_cast<float*>(at(dkv_acc));
  p.index_report = static_cast<int*>(at(index_report));
}

}  // namespace smla
