// test_planner.cpp: validation, chunking, phase order and workspace layout, with no device.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>

#include "runtime/env.hpp"
#include "runtime/planner.hpp"
#include "runtime/workspace.hpp"

namespace smla {
namespace {

Problem seed_problem() {
  Problem p;
  p.T = 4096, p.H = 128, p.num_kv = 5120, p.topk = 512;
  p.has_sink = true;
  return p;
}

// Each invalid field is rejected with a message naming it and what is expected.
void expect_rejected(const Problem& p, const std::string& field, Status st) {
  try {
    validate_problem(p);
    FAIL() << "accepted a problem with a bad " << field;
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), st) << e.what();
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("expected"), std::string::npos) << e.what();
  }
}

TEST(Planner, ValidatesEveryField) {
  EXPECT_NO_THROW(validate_problem(seed_problem()));
  Problem p = seed_problem();
  p.head_dim = 576;
  expect_rejected(p, "head_dim", Status::Unsupported);
  p = seed_problem(), p.H = 48;
  expect_rejected(p, "H", Status::Unsupported);
  p = seed_problem(), p.topk = 100;
  expect_rejected(p, "pad each top-k row with -1 to 112 slots", Status::Unsupported);  // what to do about it
  // Past 8192 the advice would name a length that is refused too (8200 -> 8208), and for the largest int64 its padded
  // length overflowed (UBSan stopped there): the limit is said first.
  for (int64_t topk : {int64_t(8200), int64_t(8208), std::numeric_limits<int64_t>::max()}) {
    p = seed_problem(), p.T = 16, p.topk = topk;
    SCOPED_TRACE(topk);
    expect_rejected(p, "at most 8192", Status::Unsupported);
    try {
      validate_problem(p);
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).find("pad each"), std::string::npos) << e.what();
    }
  }
  // Below 1 is no shape at all: an invalid argument, as T and num_kv are (it was Unsupported, which says "valid but
  // not supported").
  p = seed_problem(), p.topk = 0;
  expect_rejected(p, "topk", Status::InvalidArgument);
  p = seed_problem(), p.H = 0;
  expect_rejected(p, "H", Status::InvalidArgument);
  p = seed_problem(), p.T = 0;
  expect_rejected(p, "T", Status::InvalidArgument);
  p = seed_problem(), p.num_kv = 0;
  expect_rejected(p, "num_kv", Status::InvalidArgument);
  p = seed_problem(), p.r_chunk = 96;  // multiple of 16 but not a divisor of 512
  expect_rejected(p, "r_chunk", Status::InvalidArgument);
  p = seed_problem(), p.r_chunk = 8;
  expect_rejected(p, "r_chunk", Status::InvalidArgument);
  p = seed_problem(), p.t_chunk = p.T + 1;
  expect_rejected(p, "t_chunk", Status::InvalidArgument);
  p = seed_problem(), p.t_chunk = -5;
  expect_rejected(p, "t_chunk", Status::InvalidArgument);
  p = seed_problem(), p.scale = -1.0f;
  expect_rejected(p, "scale", Status::InvalidArgument);
  p = seed_problem(), p.scale = -1e-10f;  // the value as given (it read -0.000000)
  expect_rejected(p, "Problem::scale = -1e-10:", Status::InvalidArgument);
  p = seed_problem(), p.scale = 0.0f;  // C++'s scale is optional, so 0 is a value given, not the default: refused
  expect_rejected(p, "Problem::scale = 0:", Status::InvalidArgument);
  p = seed_problem(), p.scale = std::numeric_limits<float>::quiet_NaN();
  expect_rejected(p, "scale", Status::InvalidArgument);
  p = seed_problem(), p.device = -1;
  expect_rejected(p, "device", Status::InvalidArgument);
  for (int b : {-1, 4}) {  // an smla_backend_t outside the enum, from C: a wrong option, not NoBackend
    p = seed_problem(), p.backend = static_cast<BackendKind>(b);
    expect_rejected(p, "Problem::backend = " + std::to_string(b), Status::InvalidArgument);
  }
  // Positive sizes past the kernels' int32 ids are shapes the library does not take: Unsupported, as README says of
  // every positive value outside its limits (they were InvalidArgument).
  p = seed_problem(), p.T = 1 << 22, p.topk = 1024;
  expect_rejected(p, "T * topk", Status::Unsupported);
  // T past int32 is refused by name before T * topk is formed (2^59 * 32 wrapped to 0 and was accepted).
  for (int64_t T : {(int64_t(1) << 59), (int64_t(1) << 60) + 1, int64_t(1) << 31}) {
    p = seed_problem(), p.T = T, p.topk = 32;
    expect_rejected(p, "Problem::T = " + std::to_string(T), Status::Unsupported);
  }
  p = seed_problem(), p.num_kv = (int64_t(1) << 31) - 1;
  expect_rejected(p, "num_kv", Status::Unsupported);
  for (int64_t d : {0, -512}) {  // no head dimension at all: an invalid argument, as the other sizes below 1
    p = seed_problem(), p.head_dim = d;
    expect_rejected(p, "head_dim", Status::InvalidArgument);
  }
}

// A tiny t_chunk and r_chunk over a large problem made millions of launches (2.6 GB of plan, or bad_alloc): refused
// by name, while the largest default-chunked problems stay well under the cap.
TEST(Planner, ChunkPairsAreCapped) {
  Problem p = seed_problem();
  p.T = 65536, p.topk = 512, p.r_chunk = 16, p.t_chunk = 1;
  validate_problem(p);
  try {
    check_chunk_count(choose_shape(p, size_t(4) << 30));
    ADD_FAILURE() << "65536 x 32 chunk pairs accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("t_chunk 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("r_chunk 16"), std::string::npos) << e.what();
  }
  Runtime rt;
  p.backend = BackendKind::Cpu;
  EXPECT_THROW(rt.plan(p), Error);
  // The largest T at topk 8192 under the default budget, planner's chunks: far under the cap.
  p = seed_problem();
  p.topk = 8192, p.T = (int64_t(1) << 31) / 8192 - 1;
  const ShapeInfo s = choose_shape(p, size_t(4) << 30);
  EXPECT_NO_THROW(check_chunk_count(s)) << s.t_chunks << " x " << s.n_chunks;
  p.t_chunk = 64, p.r_chunk = 16;  // 4096 x 512 pairs
  EXPECT_THROW(check_chunk_count(choose_shape(p, size_t(4) << 30)), Error);
  // The cap itself is allowed, one pair more is not.
  p = seed_problem();
  p.topk = 16, p.r_chunk = 16, p.t_chunk = 1, p.T = kMaxChunkPairs;
  validate_problem(p);
  EXPECT_NO_THROW(check_chunk_count(choose_shape(p, size_t(4) << 30)));
  p.T = kMaxChunkPairs + 1;
  EXPECT_THROW(check_chunk_count(choose_shape(p, size_t(4) << 30)), Error);
}

// An explicit TileConfig is range-checked on every backend (the CPU backend, which has no tiles, accepted any).
TEST(Planner, ExplicitConfigsAreRangeCheckedEverywhere) {
  EXPECT_NO_THROW(validate_config(TileConfig{}));
  auto refused = [](const TileConfig& c, const std::string& field) {
    try {
      validate_config(c);
      ADD_FAILURE() << "accepted TileConfig with a bad " << field;
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::InvalidArgument);
      EXPECT_NE(std::string(e.what()).find("TileConfig::" + field), std::string::npos) << e.what();
    }
  };
  TileConfig c;
  c.dq_impl = TileConfig::kMaxDqImpl + 1;
  refused(c, "dq_impl");
  c = {}, c.dkv_impl = -1;
  refused(c, "dkv_impl");
  c = {}, c.dq_block_h = -5;
  refused(c, "dq_block_h");
  c = {}, c.r_chunk = -16;
  refused(c, "r_chunk");
  Runtime rt;
  Problem p = seed_problem();
  p.T = 8, p.num_kv = 64, p.backend = BackendKind::Cpu;
  c = {}, c.dq_impl = 7;
  EXPECT_THROW(rt.plan(p, c), Error);
  c = {}, c.dq_impl = TileConfig::kMaxDqImpl;
  EXPECT_NO_THROW(rt.plan(p, c));  // in range: the CPU backend has no tiles and ignores it
  // A config's r_chunk that does not divide topk is named as the config's (it was reported as Problem::r_chunk,
  // which the caller left 0).
  for (int64_t rc : {48, 24}) {
    c = {}, c.r_chunk = rc;
    try {
      rt.plan(p, c);
      ADD_FAILURE() << "accepted TileConfig::r_chunk " << rc << " with topk " << p.topk;
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::InvalidArgument);
      EXPECT_NE(std::string(e.what()).find("TileConfig::r_chunk = " + std::to_string(rc)), std::string::npos)
          << e.what();
    }
  }
  c = {}, c.r_chunk = 128;
  EXPECT_EQ(rt.plan(p, c)->info().r_chunk, 128);
}

TEST(Planner, DefaultBudgetSplitsTheTokensNotTheTopk) {
  // The default cap (RuntimeEnv, 4 GiB) keeps the DSv4 shapes up to T x TOPK = 4M in one chunk; past it the planner
  // splits the tokens: 4096,128,5120,1152 in two top-k chunks ran 6.5 ms, in one 5.3 (perf notes v20).
  const size_t budget = RuntimeEnv{}.interm_budget;
  EXPECT_EQ(default_t_chunk(8192, 512, budget), 8192);
  EXPECT_EQ(default_t_chunk(4096, 1024, budget), 4096);
  EXPECT_EQ(default_t_chunk(4096, 1152, budget), 2048);   // 4.5 GiB in one: two token chunks
  EXPECT_EQ(default_t_chunk(16384, 512, budget), 8192);
  EXPECT_EQ(default_t_chunk(4097, 1152, budget), 2049);   // equal chunks, the last one token shorter
  Problem p = seed_problem();
  p.topk = 1152;
  const ShapeInfo s = choose_shape(p, budget);
  EXPECT_EQ(s.r_chunk, 1152);
  EXPECT_EQ(s.n_chunks, 1);
  EXPECT_EQ(s.t_chunk, 2048);
  EXPECT_EQ(s.t_chunks, 2);
  EXPECT_EQ(s.chunk_items(), 2048LL * 1152);
  // The caller's r_chunk is kept; the tokens are split for what remains over the budget.
  p.r_chunk = 576;
  const ShapeInfo r = choose_shape(p, budget);
  EXPECT_EQ(r.n_chunks, 2);
  EXPECT_EQ(r.t_chunks, 1);
  // The caller's t_chunk is kept too, whatever the budget.
  p.r_chunk = 0, p.t_chunk = 1000;
  const ShapeInfo t = choose_shape(p, budget);
  EXPECT_EQ(t.t_chunk, 1000);
  EXPECT_EQ(t.t_chunks, 5);  // 4 x 1000 + 96
  EXPECT_EQ(token_chunk_shape(t, 4).T, 96);
  EXPECT_EQ(token_chunk_shape(t, 0).T, 1000);
}

TEST(Planner, DefaultTokenChunkRespectsTheBudget) {
  const size_t two_gib = size_t(2) << 30;
  EXPECT_EQ(default_t_chunk(4096, 512, two_gib), 4096);  // 2 GiB exactly: one chunk, as the seed
  EXPECT_EQ(default_t_chunk(8192, 512, two_gib), 4096);
  EXPECT_EQ(default_t_chunk(4096, 1152, two_gib), 1366);  // 3 chunks: 1366 + 1366 + 1364
  for (int64_t topk : {64, 160, 512, 640, 1152, 8192}) {
    for (int64_t T : {1, 63, 4096, 16384, 100000}) {
      const int64_t tc = default_t_chunk(T, topk, two_gib);
      ASSERT_GE(tc, 1);
      ASSERT_LE(tc, T);
      EXPECT_LE(double(tc) * topk * 1024, double(two_gib)) << T << " " << topk;
      const int64_t chunks = (T + tc - 1) / tc;
      // the fewest chunks: one fewer, of equal size, would not fit
      if (chunks > 1) EXPECT_GT(double((T + chunks - 2) / (chunks - 1)) * topk * 1024, double(two_gib));
      // equal chunks: the last is shorter by less than the number of chunks
      EXPECT_LT(chunks * tc - T, chunks);
    }
  }
  EXPECT_EQ(default_t_chunk(100, 8192, 1024), 1);  // a budget under one token's interm: one token a chunk
}

TEST(Planner, RadixPassesCoverTheEmptyKey) {
  EXPECT_EQ(radix_passes_for(255, 8), 1);  // keys 0..255 fit in 8 bits
  EXPECT_EQ(radix_passes_for(256, 8), 2);  // key 256 (empty slot) needs a 9th bit
  EXPECT_EQ(radix_passes_for(5120, 8), 2);
  EXPECT_EQ(radix_passes_for(70000, 8), 3);
  EXPECT_EQ(csr_key_bits(5120), 13);
  EXPECT_EQ(radix_bits_for_passes(5120, 2), 7);   // 2 x 7 >= 13 bits; 2 x 6 would not
  EXPECT_EQ(radix_bits_for_passes(255, 1), 8);
  EXPECT_EQ(radix_bits_for_passes(70000, 3), 6);  // 17 bits
}

// The planner's csr geometry: the fewest 8-bit passes, each with the fewest bits that still cover the keys, and
// tiles of 4096 items; the tiles cover T x r_chunk.
TEST(Planner, CsrDigitsAreAsNarrowAsThePassesAllow) {
  for (int64_t num_kv : {200, 256, 5120, 9216, 70000}) {
    Problem p = seed_problem();
    p.num_kv = num_kv;
    const ShapeInfo s = choose_shape(p, size_t(4) << 30);
    EXPECT_EQ(s.radix_passes, radix_passes_for(num_kv, 8)) << num_kv;
    EXPECT_GE(s.radix_passes * s.radix_bits, csr_key_bits(num_kv)) << num_kv;
    EXPECT_LT((s.radix_passes) * (s.radix_bits - 1), csr_key_bits(num_kv)) << num_kv;
    EXPECT_LE(s.radix_bits, 8);
  }
  // Keys of fewer bits still get 5-bit digits (CUB's onesweep needs 32 digits); one pass covers them.
  for (int64_t num_kv : {1, 5, 15, 16, 31}) {
    Problem p = seed_problem();
    p.num_kv = num_kv;
    const ShapeInfo s = choose_shape(p, size_t(4) << 30);
    EXPECT_EQ(s.radix_passes, 1) << num_kv;
    EXPECT_EQ(s.radix_bits, kCsrMinRadixBits) << num_kv;
  }
  EXPECT_EQ(csr_key_bits(5), 3);
}

TEST(Planner, StepOrderFollowsThePipeline) {
  Problem p = seed_problem();
  p.r_chunk = 128;
  p.check_indices = true;
  const ShapeInfo s = choose_shape(p, size_t(2) << 30);
  EXPECT_EQ(s.n_chunks, 4);
  auto one_each = [](Phase ph, const ShapeInfo&) {
    KernelSpec k;
    k.entry = phase_name(ph);
    return std::vector<KernelSpec>{k};
  };
  const auto steps = order_steps(s, one_each);
  std::vector<std::string> names;
  for (const auto& st : steps) names.push_back(st.spec.entry + "/" + std::to_string(st.chunk));
  std::vector<std::string> want{"check_topk/0"};
  for (int c = 0; c < 4; ++c) {
    want.push_back("csr/" + std::to_string(c));
    if (c == 0) want.push_back("delta/0");
    for (const char* ph : {"dq", "dkv_interm", "gather"}) want.push_back(std::string(ph) + "/" + std::to_string(c));
  }
  want.push_back("d_sink/0");
  EXPECT_EQ(names, want);
  // csr may run beside the steps after it; each chunk's gather is where it must have finished.
  for (const auto& st : steps) {
    EXPECT_EQ(st.side, st.phase == Phase::Csr) << st.spec.entry << "/" << st.chunk;
    EXPECT_EQ(st.join, st.phase == Phase::Gather) << st.spec.entry << "/" << st.chunk;
  }

  // A phase of several launches: only the first gather launch joins, every csr launch is a side step.
  auto csr_three = [&](Phase ph, const ShapeInfo& sh) {
    auto v = one_each(ph, sh);
    if (ph == Phase::Csr || ph == Phase::Gather) v.push_back(v.front()), v.push_back(v.front());
    return v;
  };
  int joins = 0, sides = 0;
  for (const auto& st : order_steps(s, csr_three)) joins += st.join, sides += st.side;
  EXPECT_EQ(joins, 4);
  EXPECT_EQ(sides, 12);

  // A family whose dq computes delta itself plans no delta launch.
  auto no_delta = [&](Phase ph, const ShapeInfo& sh) {
    return ph == Phase::Delta ? std::vector<KernelSpec>{} : one_each(ph, sh);
  };
  for (const auto& st : order_steps(s, no_delta)) EXPECT_NE(st.phase, Phase::Delta);

  p.has_sink = false;
  p.check_indices = false;
  const auto no_sink = order_steps(choose_shape(p, size_t(2) << 30), one_each);
  EXPECT_EQ(no_sink.front().phase, Phase::Csr);
  EXPECT_EQ(no_sink.back().phase, Phase::Gather);
}

TEST(Planner, TokenChunksEachRunEveryTopkChunk) {
  Problem p = seed_problem();
  p.T = 2500, p.r_chunk = 256, p.t_chunk = 1000;  // token chunks of 1000, 1000, 500; two top-k chunks
  const ShapeInfo s = choose_shape(p, size_t(4) << 30);
  ASSERT_EQ(s.t_chunks, 3);
  ASSERT_EQ(s.n_chunks, 2);
  std::vector<int> seen_t;  // the T each per-chunk phase was planned with
  auto one_each = [&](Phase ph, const ShapeInfo& sh) {
    if (ph == Phase::Dq) seen_t.push_back(sh.T);
    KernelSpec k;
    k.entry = phase_name(ph);
    return std::vector<KernelSpec>{k};
  };
  const auto steps = order_steps(s, one_each);
  EXPECT_EQ(seen_t, (std::vector<int>{1000, 1000, 1000, 1000, 500, 500}));
  std::vector<std::string> names;
  for (const auto& st : steps)
    names.push_back(st.spec.entry + "/" + std::to_string(st.t_start) + "+" + std::to_string(st.t_count) + "/" +
                    std::to_string(st.chunk));
  std::vector<std::string> want;
  for (int tc = 0; tc < 3; ++tc)
    for (int c = 0; c < 2; ++c) {
      const std::string t = std::to_string(tc * 1000) + "+" + std::to_string(tc < 2 ? 1000 : 500);
      want.push_back("csr/" + t + "/" + std::to_string(c));
      if (tc == 0 && c == 0) want.push_back("delta/0+0/0");  // over every token
      for (const char* ph : {"dq", "dkv_interm", "gather"}) want.push_back(std::string(ph) + "/" + t + "/" + std::to_string(c));
    }
  want.push_back("d_sink/0+0/0");
  EXPECT_EQ(names, want);
  // Where each step's output accumulates: dq's carry runs over the two top-k chunks of its tokens, gather's over all
  // six chunks (the first writes the carry, the last dkv); the others keep their top-k chunk.
  std::vector<std::string> dq_acc, gather_acc;
  for (const auto& st : steps) {
    if (st.t_count) EXPECT_EQ(st.t_index, st.t_start / 1000);
    const std::string a = std::to_string(st.acc_index) + "/" + std::to_string(st.acc_count);
    if (st.phase == Phase::Dq) dq_acc.push_back(a);
    else if (st.phase == Phase::Gather) gather_acc.push_back(a);
    else EXPECT_EQ(a, std::to_string(st.chunk) + "/2") << st.spec.entry;
  }
  EXPECT_EQ(dq_acc, (std::vector<std::string>{"0/2", "1/2", "0/2", "1/2", "0/2", "1/2"}));
  EXPECT_EQ(gather_acc, (std::vector<std::string>{"0/6", "1/6", "2/6", "3/6", "4/6", "5/6"}));
  // One chunk's slots size the chunk regions; dkv_acc is there for the token chunks, dq_acc for the top-k ones.
  const WorkspaceLayout w = layout_workspace(s);
  EXPECT_EQ(w.interm.bytes, size_t(1000) * 256 * 512 * 2);
  EXPECT_EQ(w.csr_vals0.bytes, size_t(1000) * 256 * 4);
  EXPECT_EQ(w.delta.bytes, size_t(2500) * p.H * 4);
  EXPECT_GT(w.dkv_acc.bytes, 0u);
  // dQ's carry is one token chunk's: the chunks run in turn, each done with it before the next (1 GiB more at the
  // seed with t_chunk 64 and r_chunk 256 when it was the whole T's).
  EXPECT_EQ(w.dq_acc.bytes, size_t(1000) * p.H * 512 * 4);
  p.r_chunk = 0;
  const WorkspaceLayout one_topk = layout_workspace(choose_shape(p, size_t(4) << 30));
  EXPECT_EQ(one_topk.dq_acc.bytes, 0u);  // token chunks alone carry no dQ
  EXPECT_GT(one_topk.dkv_acc.bytes, 0u);
}

TEST(Planner, WorkspaceRegionsAreAlignedDisjointAndSized) {
  for (int64_t rc : {512, 128}) {
    Problem p = seed_problem();
    p.r_chunk = rc;
    const ShapeInfo s = choose_shape(p, size_t(2) << 30);
    const WorkspaceLayout w = layout_workspace(s);
    auto regions = w.regions();
    std::sort(regions.begin(), regions.end(), [](const Region* a, const Region* b) { return a->offset < b->offset; });
    for (size_t i = 0; i < regions.size(); ++i) {
      EXPECT_EQ(regions[i]->offset % WorkspaceLayout::kAlign, 0u) << regions[i]->name;
      if (i + 1 < regions.size()) EXPECT_LE(regions[i]->offset + regions[i]->bytes, regions[i + 1]->offset);
      EXPECT_LE(regions[i]->offset + regions[i]->bytes, w.total);
    }
    EXPECT_EQ(w.interm.bytes, size_t(4096) * rc * 512 * 2);
    EXPECT_EQ(w.dq_acc.bytes, rc == 512 ? 0u : size_t(4096) * 128 * 512 * 4);  // only when chunked
    EXPECT_EQ(w.row_ptr.bytes, size_t(5121) * 4);

    // place() points every field at its region.
    SmlaParams prm{};
    char* base = reinterpret_cast<char*>(0x100000);
    w.place(base, prm);
    EXPECT_EQ(reinterpret_cast<char*>(prm.interm), base + w.interm.offset);
    EXPECT_EQ(reinterpret_cast<char*>(prm.row_ptr), base + w.row_ptr.offset);
    EXPECT_EQ(prm.dq_acc == nullptr, rc == 512);
    EXPECT_EQ(w.ds.bytes, size_t(4096) * rc * 128 * 2);
    EXPECT_EQ(w.pm.bytes, w.ds.bytes);
  }
}

// dkv_impl 4 on sm_90a (dq writes interm): no P or dS regions, everything else as before, and the workspace smaller
// by them; the same request on another target (where it is not the fused path) keeps them.
TEST(Planner, FusedDkvLeavesPAndDsOutOfTheWorkspace) {
  Problem p = seed_problem();
  p.H = 64, p.topk = 640;
  ShapeInfo s = choose_shape(p, size_t(4) << 30);
  s.sm90a = true;
  const WorkspaceLayout unfused = layout_workspace(s);
  s.dkv_impl = 4;
  const WorkspaceLayout fused = layout_workspace(s);
  EXPECT_EQ(fused.ds.bytes, 0u);
  EXPECT_EQ(fused.pm.bytes, 0u);
  EXPECT_EQ(unfused.ds.bytes, size_t(4096) * 640 * 64 * 2);
  EXPECT_EQ(fused.interm.bytes, unfused.interm.bytes);
  EXPECT_EQ(fused.total, unfused.total - unfused.ds.bytes - unfused.pm.bytes);
  SmlaParams prm{};
  fused.place(reinterpret_cast<char*>(0x100000), prm);
  EXPECT_EQ(prm.ds, nullptr);
  EXPECT_EQ(prm.pm, nullptr);
  EXPECT_NE(prm.interm, nullptr);
  s.sm90a = false;  // a CPU or AMD plan: dkv_impl is not theirs to fuse
  EXPECT_EQ(layout_workspace(s).ds.bytes, unfused.ds.bytes);
}

}  // namespace
}  // namespace smla
