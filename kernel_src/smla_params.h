// smla_params.h: the one argument block every phase takes, on every backend.
//
// Shared verbatim by the host (C++17), the CPU backend, NVRTC (CUDA) and hipRTC (HIP) sources,
// so it must stay plain C: no includes, fixed-width types spelled with builtin types only.
// Every kernel entry point is `extern "C" __global__ void smla_<phase>(SmlaParams p)`.
//
// Tensor layouts (strides in elements; the last dim, D = 512, is always contiguous):
//   q, o, dout, dq : [T, H, D]   element (t, h, d) at t*X_st + h*X_sh + d
//   kv, dkv        : [num_kv, D] element (j, d)    at j*kv_s + d   (dkv: j*dkv_s + d)
//   lse            : [T, H]      element (t, h)    at t*lse_st + h*lse_sh
//   topk           : [T, TOPK]   element (t, r)    at t*topk_st + r
//   sink, d_sink   : [H] contiguous
//
// Workspace regions (all contiguous, planner-owned; see runtime/workspace.hpp). Rows of a chunk
// are indexed by the slot *within the chunk*, rr = r - r_start, 0 <= rr < r_chunk. T is the step's:
// a token chunk's steps see its tokens as 0..T-1, with the per-token pointers moved to its first
// (runtime/plan.cpp, PlanImpl::step_params):
//   delta   f32  [T*H]                 (t*H + h)               rowsum(O*dO)
//   lse_n   f32  [T*H]                 (t*H + h)               natural-log, sink-inclusive lse
//   dq_acc  f32  [T*H*D]               ((t*H + h)*D + d)       only when n_chunks > 1, else null
//   ds      bf16 [T*r_chunk*H]         ((t*r_chunk + rr)*H + h)  scale * dS of this chunk
//   pm      bf16 [T*r_chunk*H]         ((t*r_chunk + rr)*H + h)  P of this chunk
//   interm  bf16 [T*r_chunk*D]         ((t*r_chunk + rr)*D + d)  sum_h scale*dS*Q + P*dO
//   csr_keys[2], csr_vals[2] i32 [T*r_chunk] radix sort ping-pong; key = kv row (num_kv for an
//           empty or out-of-range slot), value = t*r_chunk + rr. After the sort, the sorted values
//           are in csr_vals[csr_final]; the sort is stable, so equal keys keep slot order.
//   csr_hist  i32                      the csr sort's scratch (CUDA: bins, tile counters, look-back, csr.cu;
//                                      AMD: rocPRIM's temporary storage)
//   row_ptr   i32 [num_kv + 1]         row j's contributors are sorted[row_ptr[j] .. row_ptr[j+1])
//   dkv_acc f32  [num_kv*D]            fp32 dkv accumulated over chunks
//   index_report i32 [4]               {count of bad indices, t, r, value} of the first bad one
//
// Out-of-range indices (k < -1 or k >= num_kv) are treated as empty slots everywhere.
#ifndef SMLA_PARAMS_H
#define SMLA_PARAMS_H

typedef unsigned short smla_bf16;  // raw bfloat16 bits

#define SMLA_D 512

// lse_mode bits: how the caller's lse was computed (folded in by the delta phase).
#define SMLA_LSE_BASE2 1         // lse is log2-based (TileLang's example forward); natural otherwise
#define SMLA_LSE_EXCLUDES_SINK 2 // lse leaves the sink out (FlashMLA's and TileLang's); included otherwise (aiter's)

struct SmlaParams {
  // ---- caller tensors
  const smla_bf16* q;
  const smla_bf16* kv;
  const smla_bf16* o;
  const smla_bf16* dout;
  const float* lse;
  const int* topk;
  const float* sink;  // null without attn_sink
  smla_bf16* dq;
  smla_bf16* dkv;      // bf16 output (null when dkv_f32 is the output)
  float* dkv_f32;      // optional unreduced fp32 dkv output (sequence parallel); null otherwise
  float* d_sink;       // null without attn_sink
  long long q_st, q_sh, o_st, o_sh, do_st, do_sh, dq_st, dq_sh;
  long long kv_s, dkv_s, lse_st, lse_sh, topk_st;

  // ---- problem
  int T, H, num_kv, topk_n;
  int r_start, r_chunk;  // this step's chunk of the top-k: slots [r_start, r_start + r_chunk)
  int n_chunks, chunk;   // this step's place (0-based) among the steps its output accumulates over, and their
                         // number: dq the top-k chunks of its tokens, gather every token x top-k chunk
  float scale;
  int lse_mode;          // SMLA_LSE_* bits
  int check_indices;     // nonzero: record the first out-of-range index in index_report
  int pass;              // radix-sort pass of a csr step (0-based)

  // ---- workspace
  float* delta;
  float* lse_n;
  float* dq_acc;
  smla_bf16* ds;
  smla_bf16* pm;
  smla_bf16* interm;
  int* csr_keys[2];
  int* csr_vals[2];
  int* csr_hist;
  int* row_ptr;
  float* dkv_acc;
  int* index_report;
  int radix_bits, radix_passes, csr_final;
};

#endif  // SMLA_PARAMS_H
