// dq_wgmma_ring.cuh: dq_impl 5, the sm_90a dq body with 64-row kv tiles (included by dq_wgmma.cuh when DQW_RING is 1).
//
// Why: at 32 kv rows a tile, S and dP are m64n32k16 with Q / dO as the A operand, and every such wgmma reads 3 KB of
// shared memory for 32 K multiply-adds: the SM's 128 bytes a cycle, not the tensor pipe, set their rate (about 24
// cycles against 16 at the tensor peak; perf notes v33). With 64 kv rows, S^T = K Q^T and dP^T = K dO^T are m64n64k16
// (the kv tile as A, Q / dO as B), 4 KB for 64 K multiply-adds: the tensor peak (c56, c57). Two 64-row kv buffers
// (128 KB) do not fit beside Q and dO (128 KB); a ring of five 16 KB slabs does:
//
//   sQ, sDO  as dq_wgmma.cuh                                                        64 KB each
//   ring     5 slabs of 16 KB: [2 column chunks][64 kv rows][64 columns], 128-byte swizzle; a tile's 128 columns
//            slab s (0..3) of tile i sits in slot (4 i + s) % 5, so the fifth slot takes the next tile's first slab
//            while this tile's four are in use
//   sP, sDS  bf16 [64 slots][64 heads] (8 KB each): MN-major A of dQ (sDS); both leave for pm / ds in 16-byte pieces.
//            The fp32 exchange of S and dP between the warpgroups goes through the same bytes (below).
//   sFlag    [2][64] validity of each kv row (tile parity), mbarriers full[5] and empty[5]
//   sLse, sDelta  [64] each: read again at every tile's element stage (in registers for the whole loop, the consumers
//            spilled under NVRTC at setmaxnreg 224)
//
// Per tile of 64 kv rows:
//   warpgroup 0: S^T = K Q^T, warpgroup 1: dP^T = K dO^T (64 rows x 64 heads, fp32, 32 a thread), slab by slab as they
//            land (full[slot]); a warpgroup hands back the slabs its dQ does not read once its S^T / dP^T is done
//   exchange: warpgroup 0 makes P and scale*dS of heads 0-31, warpgroup 1 of heads 32-63; each gives the other the S or
//            dP half it lacks (fp32). A warp's 2 KB of gift lands on exactly the bytes of sP and sDS that the receiving
//            warp (the same rows of the other warpgroup) will itself write P and dS to, so reading the gift and
//            overwriting it need only the warp's own order; a barrier (D) before the gifts keeps them off the last
//            tile's sP / sDS while that tile's dQ or stores still read them
//   both:    dQ[:, 256 w ..] += dS (64 heads x 64 rows) K (64 rows x 256 columns): two m64n128k16 chains, one per slab
//            (slabs 2 w and 2 w + 1), each slab handed back (empty[slot]) as soon as its chain is done
// The producer warpgroup (setmaxnreg as dq_impl 3): warp s fills slab s of every tile (32 16-byte copies a lane, zero
// rows for empty slots), waits for its own copies, fences them for the async proxy and arrives on full[slot]; warp 0
// also writes the tile's row flags.
// Prologue (Q, dO, the fused delta and lse at chunk 0) and epilogue (bf16 dQ or the chunk carry through sQ / sDO) are
// dq_impl 3's.

#if !DQW_PRODUCER || DQW_PERSIST || DQW_INTERM || NUM_WARPS != 12
#error "dq_impl 5 (DQW_RING) is a producer body: DQW_PRODUCER 1, not persistent, no fused interm, 12 warps"
#endif

#define DQR_SLOTS 5
#define DQR_CHUNK (64 * 128)        // one 64-column chunk of 64 kv rows
#define DQR_SLAB (2 * DQR_CHUNK)    // 128 columns
#define DQR_T_BYTES (64 * 128)      // sP or sDS
static_assert(2 * DQW_QBYTES + DQR_SLOTS * DQR_SLAB + 2 * DQR_T_BYTES + 2 * 64 * 4 + 2 * DQR_SLOTS * 8 + 2 * 64 * 4 +
                      1024 ==
                  smla_dq_ring_smem_bytes(),
              "dq_wgmma_ring's shared-memory carve and smla_dq_ring_smem_bytes() disagree");
SMLA_CHECK_SMEM(smla_dq_ring_smem_bytes());

// The slot, and the parity of its use, of slab s of tile i.
__device__ __forceinline__ int dqr_slot(int i, int s) { return (4 * i + s) % DQR_SLOTS; }
__device__ __forceinline__ unsigned dqr_parity(int i, int s) { return ((4 * i + s) / DQR_SLOTS) & 1; }

// Address of 16-byte piece `piece` (0..7) of row `row` of sP or sDS (base: its shared address), 128-byte swizzle.
__device__ __forceinline__ unsigned dqr_pds_addr(unsigned base, int row, int piece) {
  return base + row * 128 + (((piece ^ row) & 7) << 4);
}

// Producer warp s: slab s of every tile of the run. Lane l copies 16-byte piece c = l % 16 of the slab's 256-byte row
// part (columns 128 s + 8 c ..) of rows 2 j + l / 16; the rows' indices come from two registers a lane by shuffle.
__device__ __forceinline__ void dqr_producer_warp(const SmlaParams& p, const int* topk_row, int n_tiles, int s,
                                                  unsigned ring0, int* sFlag, unsigned full0, unsigned empty0) {
  const int lane = threadIdx.x % 32, c = lane & 15, rsub = lane >> 4;
  const int n_slots = smla_chunk_slots(p);
  auto idx = [&](int rr) { return rr < n_slots ? __ldg(topk_row + rr) : -1; };
  int lo = n_tiles > 0 ? idx(lane) : -1, hi = n_tiles > 0 ? idx(32 + lane) : -1;
  for (int i = 0; i < n_tiles; ++i) {
    const int slot = dqr_slot(i, s), use = (4 * i + s) / DQR_SLOTS;
    if (use > 0) smla_mbar_wait(empty0 + 8 * slot, (use - 1) & 1);
    const unsigned slab = ring0 + slot * DQR_SLAB;
    int* flag = sFlag + (i & 1) * 64;
#pragma unroll 8  // (fully unrolled, the 56 registers of the producer spilled)
    for (int j = 0; j < 32; ++j) {
      const int row = 2 * j + rsub;
      const int k = __shfl_sync(0xffffffffu, j < 16 ? lo : hi, row & 31);
      const bool valid = smla_valid_index(k, p.num_kv);
      const unsigned dst = slab + (c >> 3) * DQR_CHUNK + row * 128 + ((((c & 7) ^ row) & 7) << 4);
      smla_cp_async16_zfill(dst, p.kv + (unsigned long long)(valid ? k : 0) * p.kv_s + 128 * s + 8 * c, valid);
      if (s == 0 && c == 0) flag[row] = valid ? 1 : 0;
    }
    smla_cp_async_commit();
    if (i + 1 < n_tiles) lo = idx(64 * (i + 1) + lane), hi = idx(64 * (i + 1) + 32 + lane);
    smla_cp_async_announce<0>(full0 + 8 * slot);
  }
}

extern "C" __global__ void __launch_bounds__(DQW_BLOCK_THREADS, 1) smla_dq(SmlaParams p) {
  extern __shared__ uint4 smem_u4[];
  char* base = smla_align1024(reinterpret_cast<char*>(smem_u4));
  char* sQ = base;
  char* sDO = sQ + DQW_QBYTES;
  char* sRing = sDO + DQW_QBYTES;
  char* sP = sRing + DQR_SLOTS * DQR_SLAB;
  char* sDS = sP + DQR_T_BYTES;
  int* sFlag = reinterpret_cast<int*>(sDS + DQR_T_BYTES);
  const unsigned full0 = smla_smem_addr(sFlag + 2 * 64), empty0 = full0 + 8 * DQR_SLOTS;
  float* sLse = reinterpret_cast<float*>(sFlag + 2 * 64 + 4 * DQR_SLOTS);  // after the ten mbarriers
  float* sDelta = sLse + 64;

  const int t = blockIdx.x, h0 = blockIdx.y * 64;
  const int wg = threadIdx.x / 128, tw = threadIdx.x % 128;
  const int warp = tw / 32, lane = tw % 32;
  const int r_chunk = p.r_chunk;
  const int* topk_row = smla_topk_row(p, t);
  __shared__ int s_last_prod[DQW_PROD_THREADS / 32], s_last_cons[DQW_THREADS / 32];

  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < DQR_SLOTS; ++s) {
      smla_mbar_init(full0 + 8 * s, 32);             // the lanes of the producer warp that filled it
      smla_mbar_init(empty0 + 8 * s, DQW_THREADS);   // every consumer, once it is done with the slab
    }
  }
  __syncthreads();  // the last block-wide barrier: from here on the consumers use dqw_sync()
  if (threadIdx.x >= DQW_THREADS) {
    smla_setmaxnreg_dec<DQW_REGS_PRODUCER>();
    const int tp = threadIdx.x - DQW_THREADS;
    int kvs[4];
    smla_valid_slots_load<DQW_PROD_THREADS>(p, topk_row, tp, kvs);
    smla_valid_slots_reduce<DQW_PROD_THREADS>(p, topk_row, tp, kvs, s_last_prod);
    smla_named_sync<2, DQW_PROD_THREADS>();
    const int n_tiles = (smla_valid_slots_end<DQW_PROD_THREADS / 32>(s_last_prod) + 63) / 64;
    dqr_producer_warp(p, topk_row, n_tiles, tp / 32, smla_smem_addr(sRing), sFlag, full0, empty0);
    return;
  }
  smla_setmaxnreg_inc<DQW_REGS_CONSUMER>();

  // ---- prologue (dq_impl 3's): the chunk's run, Q and dO, the fused delta and lse at chunk 0.
  int kvs[4];
  smla_valid_slots_load<DQW_THREADS>(p, topk_row, threadIdx.x, kvs);
  dqw_load_qdo(p, sQ, sDO, t, h0, threadIdx.x, DQW_THREADS);
  smla_cp_async_commit();
  const bool fuse_delta = p.chunk == 0;
  uint4 ov[DQW_DELTA_HEADS][2];
  if (fuse_delta) {
#pragma unroll
    for (int j = 0; j < DQW_DELTA_HEADS; ++j)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        ov[j][half] = __ldg(reinterpret_cast<const uint4*>(p.o + t * p.o_st + (h0 + dqw_delta_head(j)) * p.o_sh +
                                                            half * 256 + (threadIdx.x % 32) * 8));
  }
  float lse_mine = 0.f;
  if (fuse_delta && threadIdx.x % 32 < DQW_DELTA_HEADS) {
    const int h = h0 + dqw_delta_head(threadIdx.x % 32);
    lse_mine = smla_lse_natural(p.lse[t * p.lse_st + h * p.lse_sh], p.lse_mode, p.sink, h);
  }
  smla_cp_async_wait<0>();
  smla_fence_proxy_async();  // Q and dO, for wgmma
  smla_valid_slots_reduce<DQW_THREADS>(p, topk_row, threadIdx.x, kvs, s_last_cons);
  dqw_sync();
  const int n_tiles = (smla_valid_slots_end<DQW_THREADS / 32>(s_last_cons) + 63) / 64;

  const long long th = (long long)t * HEADS + h0;
  if (fuse_delta) {
    float sums[DQW_DELTA_HEADS];
#pragma unroll
    for (int j = 0; j < DQW_DELTA_HEADS; ++j) sums[j] = dqw_delta_dot(ov[j], sDO, dqw_delta_head(j));
    smla_warp_sums(sums);
    const int jl = threadIdx.x % 32;
    if (jl < DQW_DELTA_HEADS) {
      float sum = sums[0];
#pragma unroll
      for (int j = 1; j < DQW_DELTA_HEADS; ++j) sum = jl == j ? sums[j] : sum;
      const int hh = dqw_delta_head(jl);
      sDelta[hh] = sum;
      sLse[hh] = lse_mine;
      p.delta[th + hh] = sum;
      p.lse_n[th + hh] = lse_mine;
    }
  } else if (threadIdx.x < 64) {
    sDelta[threadIdx.x] = p.delta[th + threadIdx.x];
    sLse[threadIdx.x] = p.lse_n[th + threadIdx.x];
  }
  dqw_sync();
  const float sl2 = p.scale * DQW_LOG2E;

  const unsigned aq = smla_smem_addr(wg == 0 ? sQ : sDO);
  const unsigned ring0 = smla_smem_addr(sRing);
  const unsigned ap = smla_smem_addr(sP), ads = smla_smem_addr(sDS);
  const unsigned long long dbq = smla_wgmma_desc(aq, 16, 1024);
  const unsigned dbq_lo = (unsigned)dbq;
  const unsigned long long dbq_hi = dbq & ~0xFFFFFFFFull;

  float acc[128];
#pragma unroll
  for (int j = 0; j < 128; ++j) acc[j] = 0.f;
  // The two m64n128 chains of dQ: columns 0-127 and 128-255 of this warpgroup's 256 are acc[0..63] and acc[64..127]
  // in m64n256's fragment order, so the epilogue reads acc as dq_impl 3's.
  float(&acc_lo)[64] = *reinterpret_cast<float(*)[64]>(acc);
  float(&acc_hi)[64] = *reinterpret_cast<float(*)[64]>(acc + 64);

  // This thread's piece of the P/dS store: row pr of the tile, 16-byte pieces 2 pc2 and 2 pc2 + 1 (8 heads each).
  const int pr = threadIdx.x / 4, pc2 = threadIdx.x % 4;
  const long long pds_o = ((long long)t * r_chunk + pr) * HEADS + h0 + pc2 * 16;
  // The exchange: piece u (0..3) of lane's gift or take is at index j = 4 lane + u of the receiving warp's 2 KB: sP
  // (lanes 0-15) or sDS (16-31), row 16 warp + lane % 16, piece 4 (receiving warpgroup) + u.
  const int xrow = 16 * warp + (lane & 15);
  const unsigned xbase = (lane < 16 ? ap : ads);

  for (int i = 0; i < n_tiles; ++i) {
    // ---- S^T (warpgroup 0) or dP^T (warpgroup 1): 64 kv rows x 64 heads, K = 512, slab by slab.
    float sd[32];
#pragma unroll
    for (int j = 0; j < 32; ++j) sd[j] = 0.f;
    smla_fence_regs(sd);
    smla_wgmma_fence();
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const int slot = dqr_slot(i, s);
      smla_mbar_wait(full0 + 8 * slot, dqr_parity(i, s));
      const unsigned slab = ring0 + slot * DQR_SLAB;
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
        const int K = 8 * s + kk;  // k-step over the 512 columns
        const unsigned long long da = smla_wgmma_desc(slab + (kk >> 2) * DQR_CHUNK + (kk & 3) * 32, 16, 1024);
        const unsigned long long db = dbq_hi | (dbq_lo + (unsigned)(((K >> 2) * (64 * 128) + (K & 3) * 32) >> 4));
        smla_wgmma_m64n64k16<0, 0>(sd, da, db, K > 0);
      }
    }
    smla_wgmma_commit();
    const int* flag = sFlag + (i & 1) * 64;
    const int fr0 = flag[16 * warp + lane / 4], fr1 = flag[16 * warp + lane / 4 + 8];
    smla_wgmma_wait<0>();
    smla_fence_regs(sd);
    // The slabs this warpgroup's dQ does not read go back now.
#pragma unroll
    for (int s = 0; s < 4; ++s)
      if ((s >> 1) != wg) smla_mbar_arrive(empty0 + 8 * dqr_slot(i, s));

    // ---- exchange. (D) every consumer is done with the last tile's sP and sDS (its dQ chain and stores).
    dqw_sync();
    {
      float g[16];  // warpgroup 0 gives S of heads 32-63 (sd[16..31]), warpgroup 1 dP of heads 0-31 (sd[0..15])
#pragma unroll
      for (int r = 0; r < 16; ++r) g[r] = wg == 0 ? sd[16 + r] : sd[r];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const unsigned a = dqr_pds_addr(xbase, xrow, 4 * (wg ^ 1) + u);
        asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(a), "f"(g[4 * u]), "f"(g[4 * u + 1]),
                     "f"(g[4 * u + 2]), "f"(g[4 * u + 3])
                     : "memory");
      }
    }
    dqw_sync();  // (B) the gifts are in
    float other[16];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const unsigned a = dqr_pds_addr(xbase, xrow, 4 * wg + u);
      asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                   : "=f"(other[4 * u]), "=f"(other[4 * u + 1]), "=f"(other[4 * u + 2]), "=f"(other[4 * u + 3])
                   : "r"(a)
                   : "memory");
    }
    __syncwarp();  // the warp's lanes have read its gift before its stmatrix overwrite it
    {
      // Element v = 4 i + 2 half + e of this warpgroup's half: kv row 16 warp + lane / 4 + 8 half, head 32 wg + 8 i
      // + 2 (lane % 4) + e.
      const bool valid[2] = {fr0 != 0, fr1 != 0};
      // This thread's eight heads: 32 wg + 8 i + 2 (lane % 4) + e (i = 0..3, e = 0..1), lse (natural) and delta.
      float la[8], dl[8];
#pragma unroll
      for (int i4 = 0; i4 < 4; ++i4) {
        const int hh = 32 * wg + 8 * i4 + 2 * (lane % 4);
        const float2 l2 = *reinterpret_cast<const float2*>(sLse + hh), d2 = *reinterpret_cast<const float2*>(sDelta + hh);
        la[2 * i4] = l2.x * DQW_LOG2E, la[2 * i4 + 1] = l2.y * DQW_LOG2E;
        dl[2 * i4] = d2.x, dl[2 * i4 + 1] = d2.y;
      }
      float pe[16], dv[16];
#pragma unroll
      for (int v = 0; v < 16; ++v) {
        const int half = (v >> 1) & 1, he = 2 * (v >> 2) + (v & 1);
        const float s_ = wg == 0 ? sd[v] : other[v];
        pe[v] = smla_ex2_ftz(valid[half] ? fmaf(s_, sl2, -la[he]) : -__int_as_float(0x7f800000));
      }
#pragma unroll
      for (int v = 0; v < 16; ++v) {
        const int half = (v >> 1) & 1, he = 2 * (v >> 2) + (v & 1);
        const float dp_ = wg == 0 ? other[v] : sd[16 + v];
        dv[v] = valid[half] ? pe[v] * (dp_ - dl[he]) * p.scale : 0.f;
      }
      // stmatrix (not transposed: sP / sDS rows are kv rows, as the fragments' rows): two x4 each, blocks m = 2 ii +
      // half of i = 2 x + ii; lane 8 m + jr addresses row 16 warp + 8 half + jr, piece 4 wg + i.
      const int mb = lane >> 3, jr = lane & 7;
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        unsigned wpm[4], wds[4];
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          const int v = 4 * (2 * x + (m >> 1)) + 2 * (m & 1);
          wpm[m] = smla_pack_bf2_rn(pe[v], pe[v + 1]);
          wds[m] = smla_pack_bf2_rn(dv[v], dv[v + 1]);
        }
        const int row = 16 * warp + 8 * (mb & 1) + jr, piece = 4 * wg + 2 * x + (mb >> 1);
        dqw_stmatrix_x4<false>(dqr_pds_addr(ap, row, piece), wpm);
        dqw_stmatrix_x4<false>(dqr_pds_addr(ads, row, piece), wds);
      }
    }
    smla_fence_proxy_async();  // dS, for wgmma
    dqw_sync();  // (C) P and dS are in shared memory

    // ---- dQ[:, 256 wg ..] += dS (64 heads x 64 rows, MN-major in sDS) K (64 rows x 128 columns a slab, MN-major).
    smla_fence_regs(acc);
    smla_wgmma_fence();
#pragma unroll
    for (int sl = 0; sl < 2; ++sl) {
      const unsigned slab = ring0 + dqr_slot(i, 2 * wg + sl) * DQR_SLAB;
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        const unsigned long long da = smla_wgmma_desc(ads + ks * 2048, DQR_T_BYTES, 1024);
        const unsigned long long db = smla_wgmma_desc(slab + ks * 2048, DQR_CHUNK, 1024);
        if (sl == 0)
          smla_wgmma_m64n128k16<1, 1>(acc_lo, da, db, 1);
        else
          smla_wgmma_m64n128k16<1, 1>(acc_hi, da, db, 1);
      }
      smla_wgmma_commit();
    }
    // ---- meanwhile, the tile's P and dS rows to the workspace ((t*r_chunk + rr)*HEADS + h), h fastest.
    if (i * 64 + pr < r_chunk) {
      const long long o = pds_o + (long long)i * (64 * HEADS);
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const int piece = 2 * pc2 + q;
        const unsigned so = pr * 128 + (((piece ^ pr) & 7) << 4);
        *reinterpret_cast<uint4*>(p.pm + o + 8 * q) = *reinterpret_cast<const uint4*>(sP + so);
        *reinterpret_cast<uint4*>(p.ds + o + 8 * q) = *reinterpret_cast<const uint4*>(sDS + so);
      }
    }
    smla_wgmma_wait<1>();
    smla_fence_regs(acc_lo);
    smla_mbar_arrive(empty0 + 8 * dqr_slot(i, 2 * wg));
    smla_wgmma_wait<0>();
    smla_fence_regs(acc);
    smla_mbar_arrive(empty0 + 8 * dqr_slot(i, 2 * wg + 1));
  }

  // ---- epilogue (dq_impl 3's): the chunk carry, then the bf16 dQ or this chunk's fp32 carry through sQ / sDO.
  const int hl_a = warp * 16 + lane / 4, hl_b = hl_a + 8;
  if (p.n_chunks > 1 && p.chunk > 0)
    dqw_each_pair(acc, h0, hl_a, hl_b, wg, lane,
                  [&](int h, int d, float& v0, float& v1) { smla_dq_add_carry<HEADS>(p, t, h, d, v0, v1); });
  dqw_epilogue_staged(p, acc, wg == 0 ? sQ : sDO, t, h0, wg, warp, lane, hl_a, hl_b);
}
