// amd_mfma.h: the AMD-only layer of the matrix phases (dq.hip, dkv_interm.hip).
//
// Part 1 (host and device): LDS layouts as constexpr functions, so runtime/hip/kernels_hip.cpp
// sizes the launch with the formula the kernel carves its LDS with.
// Part 2 (HIP device code only): one MFMA shape, a 16 x 16 fp32 tile += A(16 x K) * B(K x 16)
// per 64-lane wavefront, with its fragment loads. K = 16 (v_mfma_f32_16x16x16bf16_1k: gfx90a,
// gfx942, gfx950); on gfx950 K = 32 (v_mfma_f32_16x16x32_bf16, twice the work per instruction).
//
// Fragments, for lane l, g = l / 16 (the lane's k group), c = l % 16:
//   A: row c, k = g*KPL .. g*KPL+KPL-1      B: column c, the same k      (KPL = K / 4)
//   accumulator element v: row 4*g + v, column c.
// The hardware's order of k inside an instruction does not matter here: A and B are always
// loaded with the same k mapping, so each product pairs A[i][k] with B[k][j] whatever it is.
#ifndef SMLA_AMD_MFMA_H
#define SMLA_AMD_MFMA_H

#include "portable.h"

// LDS rows of bf16 are padded by 8 elements (16 bytes): keeps 16-byte alignment of every row
// and moves consecutive rows to different banks.
#define SMLA_AMD_PAD 8

// ---- dq: the chunk's kv tile [BLOCK_R][D+pad], dS of the tile [BLOCK_H][BLOCK_R+pad] (bf16),
// one validity flag per kv row.
SMLA_HD constexpr unsigned smla_amd_dq_kv_bytes(int block_r) { return 2u * block_r * (512 + SMLA_AMD_PAD); }
SMLA_HD constexpr unsigned smla_amd_dq_ds_bytes(int block_h, int block_r) {
  return 2u * block_h * (block_r + SMLA_AMD_PAD);
}
SMLA_HD constexpr unsigned smla_amd_dq_lds_bytes(int block_h, int block_r) {
  return smla_amd_dq_kv_bytes(block_r) + smla_amd_dq_ds_bytes(block_h, block_r) + 4u * block_r;
}

// ---- dkv_interm: B = [q ; dout] of this block's columns, transposed: [BLOCK_D][2H+pad].
SMLA_HD constexpr unsigned smla_amd_dkv_lds_bytes(int h, int block_d) { return 2u * block_d * (2 * h + SMLA_AMD_PAD); }

#if defined(SMLA_HIP)

#define AMD_WAVE 64

#if defined(__gfx950__) && !defined(SMLA_AMD_NO_K32)
#define AMD_KPL 8
typedef __bf16 amd_frag __attribute__((ext_vector_type(8)));
#else
#define AMD_KPL 4
typedef short amd_frag __attribute__((ext_vector_type(4)));
#endif
#define AMD_K (4 * AMD_KPL)
typedef short amd_raw __attribute__((ext_vector_type(AMD_KPL)));  // the same bits, as integers
typedef float amd_acc __attribute__((ext_vector_type(4)));

__device__ __forceinline__ amd_acc amd_mfma(amd_frag a, amd_frag b, amd_acc c) {
#if AMD_KPL == 8
  return __builtin_amdgcn_mfma_f32_16x16x32_bf16(a, b, c, 0, 0, 0);
#else
  return __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(a, b, c, 0, 0, 0);
#endif
}

__device__ __forceinline__ amd_acc amd_zero_acc() {
  amd_acc z = {0.f, 0.f, 0.f, 0.f};
  return z;
}

__device__ __forceinline__ amd_frag amd_zero_frag() {
  amd_raw z = {};
  return __builtin_bit_cast(amd_frag, z);
}

// KPL consecutive bf16 (k contiguous in memory), one 8- or 16-byte load: `p` must be aligned.
__device__ __forceinline__ amd_frag amd_load_frag(const smla_bf16* p) {
  return __builtin_bit_cast(amd_frag, *reinterpret_cast<const amd_raw*>(p));
}

// KPL bf16 `stride` elements apart (k runs across rows of a row-major [k][n] tile).
__device__ __forceinline__ amd_frag amd_load_frag_strided(const smla_bf16* p, int stride) {
  amd_raw r;
#pragma unroll
  for (int e = 0; e < AMD_KPL; ++e) r[e] = (short)p[e * stride];
  return __builtin_bit_cast(amd_frag, r);
}

#endif  // SMLA_HIP
#endif  // SMLA_AMD_MFMA_H
