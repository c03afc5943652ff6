// output_digests (tools/case_runner.hpp): what src_ab.sh compares to say whether two processes' outputs are bitwise
// equal. One flipped bit must change its own output's digest and no other's.
#include <gtest/gtest.h>

#include "tools/case_runner.hpp"

using smla::tools::Outputs;
using smla::tools::output_digests;

namespace {

Outputs sample() {
  Outputs o;
  o.dq.assign(4096, 0);
  o.dkv.assign(1024, 0);
  o.d_sink.assign(16, 0.f);
  for (size_t i = 0; i < o.dq.size(); ++i) o.dq[i] = static_cast<uint16_t>(i * 2654435761u >> 16);
  for (size_t i = 0; i < o.dkv.size(); ++i) o.dkv[i] = static_cast<uint16_t>(i * 40503u);
  for (size_t i = 0; i < o.d_sink.size(); ++i) o.d_sink[i] = 0.25f * static_cast<float>(i) - 1.f;
  return o;
}

TEST(OutputDigests, EqualOutputsGiveEqualDigestsAndOnlyThosePresent) {
  const auto a = output_digests(sample()), b = output_digests(sample());
  EXPECT_EQ(a, b);
  ASSERT_EQ(a.size(), 3u);  // no dkv_f32: it is empty
  EXPECT_EQ(a.count("dkv_f32"), 0u);
  for (const auto& [name, hex] : a) EXPECT_EQ(hex.size(), 16u) << name;
}

TEST(OutputDigests, OneFlippedBitChangesItsOwnOutputsDigestOnly) {
  const auto base = output_digests(sample());
  Outputs o = sample();
  o.dkv[517] ^= 0x0100;
  const auto flipped = output_digests(o);
  EXPECT_NE(flipped.at("dkv"), base.at("dkv"));
  EXPECT_EQ(flipped.at("dq"), base.at("dq"));
  EXPECT_EQ(flipped.at("d_sink"), base.at("d_sink"));
}

}  // namespace
