#!/usr/bin/env python3
# kernel_mutants.py: the kernels' mutation audit (perf notes v44). Each mutant is a copy of kernel_src/ with one
# small edit (exact-string replacements, each required to match once), written to OUT/<name>/; the GPU tests then run
# with SMLA_KERNEL_SRC_DIR pointing at it (bench/kernel_mutants.sh). A mutant that every GPU test passes "survives":
# a kernel bug the tests would not see, or an edit that changes nothing observable (say which in the notes).
# Usage: bench/kernel_mutants.py OUT [NAME ...]   (from the repository root; no NAME: every mutant)
# Check here that each compiles: SMLA_KERNEL_SRC_DIR=OUT/NAME build/bin/smla-warmup --arch sm_90a --out DIR --shape ...
import os, shutil, sys

SRC = 'kernel_src'
M = {
 'dq-ntiles-floor': [('dq_wgmma.cuh', 'const int n_tiles = (smla_valid_slots_end<DQW_PROD_THREADS / 32>(s_last) + BLOCK_R - 1) / BLOCK_R;',
                      'const int n_tiles = smla_valid_slots_end<DQW_PROD_THREADS / 32>(s_last) / BLOCK_R;'),
                     ('dq_wgmma.cuh', 'const int n_tiles = (smla_valid_slots_end<DQW_THREADS / 32>(s_last_cons) + BLOCK_R - 1) / BLOCK_R;',
                      'const int n_tiles = smla_valid_slots_end<DQW_THREADS / 32>(s_last_cons) / BLOCK_R;')],
 'dq-empty-slot-p': [('dq_wgmma.cuh', 'pe[r] = smla_ex2_ftz(valid[2 * (r >> 2) + (r & 1)] ? fmaf(s_, sl2, -(half ? lb : la))\n                                                               : -__int_as_float(0x7f800000));',
                      'pe[r] = smla_ex2_ftz(fmaf(s_, sl2, -(half ? lb : la)));')],
 'dq-delta-rows': [('dq_wgmma.cuh', 'pe[r] * (dp_ - (half ? dlb : dla)) * p.scale', 'pe[r] * (dp_ - (half ? dla : dlb)) * p.scale')],
 'dq-pds-edge': [('dq_wgmma.cuh', 'if (tile * BLOCK_R + pds_rl < r_chunk) {', 'if (tile * BLOCK_R + pds_rl <= r_chunk) {')],
 'dq-carry-chunk1': [('dq_wgmma.cuh', 'if (p.n_chunks > 1 && p.chunk > 0)\n      dqw_each_pair', 'if (p.n_chunks > 1 && p.chunk > 1)\n      dqw_each_pair')],
 'dq-store-stride': [('dq_wgmma.cuh', '''        *reinterpret_cast<uint4*>(dst + r * p.dq_sh) =
            *reinterpret_cast<const uint4*>(stage + r * 512 + ((lane ^ (r & 7)) << 4));''',
                      '''        *reinterpret_cast<uint4*>(dst + r * SMLA_D) =
            *reinterpret_cast<const uint4*>(stage + r * 512 + ((lane ^ (r & 7)) << 4));''')],
 'slots-tail-skip': [('common.cuh', 'for (int rr = 4 * THREADS + tid; rr < n; rr += THREADS)', 'for (int rr = 5 * THREADS + tid; rr < n; rr += THREADS)')],
 'lse-excl-abs': [('common.cuh', 'l = m + log1pf(expf(-fabsf(l - sk)));', 'l = m + log1pf(expf(-(l - sk)));')],
 'lse-excl-nan': [('common.cuh', 'if (l != l || sk != sk) l += sk;\n    else if', 'if (false) l += sk;\n    else if')],
 'gather-seg-floor': [('gather.cu', 'const int seg = (row_end - row_beg + GATHER_GROUPS - 1) / GATHER_GROUPS;', 'const int seg = (row_end - row_beg) / GATHER_GROUPS;')],
 'gather-f32-stride': [('gather.cu', 'p.dkv_f32 + j * p.dkv_s + d', 'p.dkv_f32 + j * SMLA_D + d')],
 'gather-carry-chunk1': [('gather.cu', 'if (p.chunk > 0) {\n      const float4 c = *carry;', 'if (p.chunk > 1) {\n      const float4 c = *carry;')],
 'dsink-no-clamp': [('d_sink.cu', '    if (x > 0.f) x = 0.f;\n', '')],
 'dsink-neg-inf': [('d_sink.cu', 'for (int t = no_sink ? p.T : threadIdx.x;', 'for (int t = threadIdx.x;')],
 'topk-check-eq': [('check_topk.cu', 'if (k < -1 || k >= p.num_kv) {', 'if (k < -1 || k > p.num_kv) {')],
 'topk-check-first': [('check_topk.cu', 'atomicMin(&p.index_report[1], first);', 'atomicMax(&p.index_report[1], first);')],
 'dkvw-store-edge': [('dkv_wgmma.cuh', '    if (8 * it < rows)\n      *reinterpret_cast<uint4*>(dst + 8 * it * SMLA_D)', '    if (8 * it <= rows)\n      *reinterpret_cast<uint4*>(dst + 8 * it * SMLA_D)')],
 'dq80-empty-slot-p': [('dq.cu', 'pv[e] = valid ? pe : 0.f;', 'pv[e] = pe;')],
 'dkv80-store-edge': [('dkv_interm.cu', 'if (rr >= r_chunk) continue;', 'if (rr > r_chunk) continue;')],
 'delta-lse-stride': [('delta.cu', 'p.lse[t * p.lse_st + h * p.lse_sh]', 'p.lse[t * p.lse_st + h]')],
 'delta-o-stride': [('delta.cu', 'const smla_bf16* o = p.o + t * p.o_st + h * p.o_sh;', 'const smla_bf16* o = p.o + t * p.o_st + h * SMLA_D;')],
 'dqw-fused-lse-stride': [('dq_wgmma.cuh', 'lse_mine = smla_lse_natural(p.lse[t * p.lse_st + h * p.lse_sh]', 'lse_mine = smla_lse_natural(p.lse[t * p.lse_st + h]')],
 'rowptr-gt': [('csr_rowptr.cuh', 'if (keys[mid] < j) lo = mid + 1;', 'if (keys[mid] <= j) lo = mid + 1;')],
 'dq4-ntiles-floor': [('dq_wgmma.cuh', 'const int n_tiles = min((smla_valid_slots_end<DQW_PROD_THREADS / 32>(s_last[it & 1]) + BLOCK_R - 1) / BLOCK_R,',
                       'const int n_tiles = min(smla_valid_slots_end<DQW_PROD_THREADS / 32>(s_last[it & 1]) / BLOCK_R,')],
 'dqw-interm-pair-end': [('dq_wgmma.cuh', 'const bool pair_end = (tile & 1) || tile == n_tiles - 1;', 'const bool pair_end = (tile & 1);')],
 # ---- round 2 (prepared in v44, not yet run on a GPU)
 'dsink-neg-zero': [('d_sink.cu', 'p.d_sink[h] = (float)(0.0 - total);', 'p.d_sink[h] = (float)(-total);')],
 'dsink-last-warp': [('d_sink.cu', 'for (int w = 0; w < NUM_THREADS / 32; ++w) total += warp_sums[w];', 'for (int w = 0; w < NUM_THREADS / 32 - 1; ++w) total += warp_sums[w];')],
 'gather-group-sum': [('gather.cu', 'for (int k = 0; k < GATHER_GROUPS - 1; ++k) {', 'for (int k = 0; k < GATHER_GROUPS - 2; ++k) {')],
 'gather-stale-idx': [('gather.cu', 'idx[u] = i + UNROLL + u < end ? __ldg(vals + i + UNROLL + u) : 0;', 'idx[u] = i + UNROLL + u < end ? __ldg(vals + i + u) : 0;')],
 'csr-scratch-zero': [('csr.cu', 'if (i < scratch) p.csr_hist[i] = 0;', 'if (i < scratch - CSR_DIGITS) p.csr_hist[i] = 0;')],
 'rowptr-last': [('csr_rowptr.cuh', 'for (long long j = first; j <= num_kv; j += step) {', 'for (long long j = first; j < num_kv; j += step) {')],
 'csr-key-stride': [('csr.cu', 'const int k = p.topk[t * p.topk_st + p.r_start + rr];', 'const int k = p.topk[t * p.topk_n + p.r_start + rr];')],
 'topk-scan-stride': [('check_topk.cu', 'const int k = p.topk[t * p.topk_st + r];', 'const int k = p.topk[t * p.topk_n + r];')],
 'topk-final-stride': [('check_topk.cu', 'p.index_report[3] = p.topk[t * p.topk_st + r];', 'p.index_report[3] = p.topk[t * p.topk_n + r];')],
 'delta-row-edge': [('delta.cu', 'if (row >= (long long)p.T * p.H) return;', 'if (row > (long long)p.T * p.H) return;')],
 'carry-store-last': [('common.cuh', 'if (p.n_chunks > 1 && p.chunk != p.n_chunks - 1) {\n    *reinterpret_cast<float2*>(p.dq_acc',
                       'if (p.n_chunks > 2 && p.chunk != p.n_chunks - 1) {\n    *reinterpret_cast<float2*>(p.dq_acc')],
 'dq80-pds-edge': [('dq.cu', 'if (rr < r_chunk) {', 'if (rr <= r_chunk) {')],
 'dkw3-last-announce': [('dkv_wgmma.cuh', 'if (n_tiles > 3) smla_cp_async_announce<0>(full0 + 8 * ((n_tiles - 1) % 3));', 'if (n_tiles > 4) smla_cp_async_announce<0>(full0 + 8 * ((n_tiles - 1) % 3));')],
 'dqw-chunk-out': [('dq_wgmma.cuh', '    if (p.chunk == p.n_chunks - 1) {\n      // The bf16 dQ half', '    if (p.chunk >= p.n_chunks - 2) {\n      // The bf16 dQ half')],
 # ---- round 3 (v45): the HIP sources, run here by test_amd_emulated (bench/kernel_mutants_emulated.sh), not on a GPU
 'hip-dq-valid': [('dq.hip', 'pv[v] = valid ? pe : 0.f;', 'pv[v] = pe;')],
 'hip-dq-rr-edge': [('dq.hip', 'const int k = (rr < p.r_chunk && p.r_start + rr < p.topk_n) ? topk_row[rr] : -1;',
                     'const int k = (rr <= p.r_chunk && p.r_start + rr < p.topk_n) ? topk_row[rr] : -1;')],
 'hip-dq-store-edge': [('dq.hip', '    if (rr < r_chunk) {\n      const long long o', '    if (rr <= r_chunk) {\n      const long long o')],
 'hip-dq-carry': [('dq.hip', 'if (p.n_chunks > 1 && p.chunk > 0) {', 'if (p.n_chunks > 1 && p.chunk > 1) {')],
 'hip-dq-sync': [('dq.hip', '    }\n    __syncthreads();\n\n    // ---- dQ', '    }\n\n    // ---- dQ')],
 'hip-dq-delta': [('dq.hip', 'dl[v] = p.delta[th + v];', 'dl[v] = p.delta[th];')],
 'hip-dq-dqsh': [('dq.hip', 'p.dq[t * p.dq_st + h * p.dq_sh + d]', 'p.dq[t * p.dq_st + h * SMLA_D + d]')],
 'hip-dq-kvb': [('dq.hip', 'const smla_bf16* kvb = sKV + (ks * AMD_K + kg) * DQ_ROW + wn * DQ_DW + c16;',
                 'const smla_bf16* kvb = sKV + (ks * AMD_K) * DQ_ROW + wn * DQ_DW + c16;')],
 'hip-dkv-store-edge': [('dkv_interm.hip', 'if (rr >= r_chunk) continue;', 'if (rr > r_chunk) continue;')],
 'hip-dkv-do-sh': [('dkv_interm.hip', '(k - HEADS) * p.do_sh', '(k - HEADS) * SMLA_D')],
 'hip-dkv-in-edge': [('dkv_interm.hip', 'in[mi] = rr < r_chunk;', 'in[mi] = rr <= r_chunk;')],  # equivalent (v45)
 'hip-dkv-row-stride': [('dkv_interm.hip', 'row0 += BLOCK_R)', 'row0 += BLOCK_R / 2)')],  # equivalent (v45)
 'hip-dkv-hi-half': [('dkv_interm.hip', 'sBt[(c * 8 + 2 * e + 1) * DK_BROW + k] = (smla_bf16)(w[e] >> 16);',
                      'sBt[(c * 8 + 2 * e + 1) * DK_BROW + k] = (smla_bf16)(w[e] & 0xffffu);')],
 'hip-dkv-sync': [('dkv_interm.hip', '  }\n  __syncthreads();\n\n  for (int row0', '  }\n\n  for (int row0')],
 'hip-dkv-pm-half': [('dkv_interm.hip', 'const smla_bf16* src = k < HEADS ? p.ds + k : p.pm + (k - HEADS);',
                      'const smla_bf16* src = k < HEADS ? p.ds + k : p.pm + k;')],
 'hip-csr-key-stride': [('csr.hip', 'const int k = p.topk[t * p.topk_st + p.r_start + rr];',
                         'const int k = p.topk[t * p.topk_n + p.r_start + rr];')],
}
out = sys.argv[1]
names = sys.argv[2:] or list(M)
unknown = [n for n in names if n not in M]
if unknown: sys.exit('unknown mutant(s): ' + ' '.join(unknown))
os.makedirs(out, exist_ok=True)
for name in names:
    reps = M[name]
    d = os.path.join(out, name)
    if os.path.exists(d): shutil.rmtree(d)
    shutil.copytree(SRC, d)
    for f, old, new in reps:
        p = os.path.join(d, f)
        s = open(p).read()
        assert s.count(old) == 1, (name, f, s.count(old))
        open(p, 'w').write(s.replace(old, new))
print(len(names), 'mutant(s) in', out)
