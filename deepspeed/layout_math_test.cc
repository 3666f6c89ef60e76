#include "deepspeed/layout_math.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ucp::deepspeed {
namespace {

using ::testing::ElementsAre;

TEST(ZeroGroupLayoutTest, PadsToMultipleOfTwiceDp) {
  // 10 elements over dp=4: alignment 8 -> 16, partitions of 4, padding 6 on the last rank.
  ZeroGroupLayout g = ZeroGroupLayout::Make({3, 7}, 4);
  EXPECT_EQ(g.numel(), 10);
  EXPECT_EQ(g.padded_numel(), 16);
  EXPECT_EQ(g.partition_numel(), 4);
  EXPECT_EQ(g.padding(0), 0);
  EXPECT_EQ(g.padding(2), 0);
  EXPECT_EQ(g.padding(3), 6);
  // The last partition is all padding and then some: DeepSpeed saves
  // group[:4 - 6], i.e. group[:-2], which keeps 2 elements.
  EXPECT_EQ(g.lean_partition_numel(3), 2);
  EXPECT_EQ(g.convention(), PaddingConvention::kLastRank);
}

TEST(ZeroGroupLayoutTest, PerRankPaddingSince0164) {
  // Same group in DeepSpeed >= 0.16.4: ranks 0, 1 hold [0, 8), rank 2 holds
  // elements 8, 9 and 2 padding, rank 3 only padding.
  ZeroGroupLayout g = ZeroGroupLayout::Make({3, 7}, 4, PaddingConvention::kPerRank);
  EXPECT_EQ(g.padding(0), 0);
  EXPECT_EQ(g.padding(1), 0);
  EXPECT_EQ(g.padding(2), 2);
  EXPECT_EQ(g.padding(3), 4);
  EXPECT_EQ(g.lean_partition_numel(2), 2);
  EXPECT_EQ(g.lean_partition_numel(3), 0);
  EXPECT_EQ(g.PaddingAs(3, PaddingConvention::kLastRank), 6);
}

TEST(ZeroGroupLayoutTest, PerRankPaddingOfTheFixture) {
  // deepspeed-0.19.5/gpt-zero1-padding-dp2, group 2 (one element) on dp2:
  // group_paddings [.., 1] on rank 0 and [.., 2] on rank 1 (0 elements saved).
  ZeroGroupLayout g = ZeroGroupLayout::Make({1}, 2, PaddingConvention::kPerRank);
  EXPECT_EQ(g.partition_numel(), 2);
  EXPECT_EQ(g.padding(0), 1);
  EXPECT_EQ(g.padding(1), 2);
  EXPECT_EQ(g.lean_partition_numel(0), 1);
  EXPECT_EQ(g.lean_partition_numel(1), 0);
  // Before 0.16.4 only the last rank recorded padding, 3, and saved
  // group[:-1], i.e. 1 element.
  EXPECT_EQ(g.PaddingAs(0, PaddingConvention::kLastRank), 0);
  EXPECT_EQ(g.PaddingAs(1, PaddingConvention::kLastRank), 3);
  EXPECT_EQ(g.LeanNumel(3), 1);
  // At dp1 both conventions agree: [0, 0, 1].
  ZeroGroupLayout one = ZeroGroupLayout::Make({1}, 1, PaddingConvention::kPerRank);
  EXPECT_EQ(one.padding(0), 1);
  EXPECT_EQ(one.PaddingAs(0, PaddingConvention::kLastRank), 1);
}

TEST(DsVersionTest, ParsesAndPicksTheConvention) {
  auto v = ParseDsVersion("0.19.5");
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE((*v == DsVersion{0, 19, 5}));
  auto dev = ParseDsVersion("0.14.5+cf443004");
  ASSERT_TRUE(dev.ok());
  EXPECT_TRUE((*dev == DsVersion{0, 14, 5}));
  EXPECT_FALSE(ParseDsVersion("ucp").ok());
  EXPECT_FALSE(ParseDsVersion("").ok());
  EXPECT_EQ(PaddingConventionOf(DsVersion{0, 16, 3}, false), PaddingConvention::kLastRank);
  EXPECT_EQ(PaddingConventionOf(DsVersion{0, 16, 4}, false), PaddingConvention::kPerRank);
  EXPECT_EQ(PaddingConventionOf(DsVersion{0, 19, 5}, false), PaddingConvention::kPerRank);
  // BF16_Optimizer keeps the last-rank convention.
  EXPECT_EQ(PaddingConventionOf(DsVersion{0, 19, 5}, true), PaddingConvention::kLastRank);
}

TEST(ZeroGroupLayoutTest, NoPaddingWhenAligned) {
  ZeroGroupLayout g = ZeroGroupLayout::Make({64, 64}, 2);
  EXPECT_EQ(g.padded_numel(), 128);
  EXPECT_EQ(g.padding(1), 0);
  EXPECT_EQ(g.partition_numel(), 64);
}

TEST(ZeroGroupLayoutTest, ParamStraddlingTwoRanks) {
  // The fixture neox-tp2-pp1-dp2, group 1 (norms and biases) on one tp rank:
  // per layer 64 + 96 + 64 + 64 + 128 + 64 = 480, layers 2..9, then the final norm.
  std::vector<int64_t> numels;
  for (int layer = 0; layer < 8; ++layer) {
    for (int64_t n : {64, 96, 64, 64, 128, 64}) numels.push_back(n);
  }
  numels.push_back(64);
  ZeroGroupLayout g = ZeroGroupLayout::Make(numels, 2);
  EXPECT_EQ(g.numel(), 3904);
  EXPECT_EQ(g.partition_numel(), 1952);
  // Layer 6's input_layernorm (param 24) starts at 4 * 480 = 1920: 32 elements on
  // each rank.
  std::vector<ZeroFragment> r0 = g.Fragments(0);
  ASSERT_EQ(r0.size(), 25u);
  EXPECT_EQ(r0.back().param_index, 24);
  EXPECT_EQ(r0.back().partition_offset, 1920);
  EXPECT_EQ(r0.back().param_offset, 0);
  EXPECT_EQ(r0.back().numel, 32);
  std::vector<ZeroFragment> r1 = g.Fragments(1);
  ASSERT_EQ(r1.size(), 25u);
  EXPECT_EQ(r1.front().param_index, 24);
  EXPECT_EQ(r1.front().partition_offset, 0);
  EXPECT_EQ(r1.front().param_offset, 32);
  EXPECT_EQ(r1.front().numel, 32);
  // Then 6.attention.query_key_value.bias at start 32 on rank 1 (as in the fixture).
  EXPECT_EQ(r1[1].param_index, 25);
  EXPECT_EQ(r1[1].partition_offset, 32);
  EXPECT_EQ(r1[1].numel, 96);

  auto frags = g.FragmentsOfParam(24);
  ASSERT_EQ(frags.size(), 2u);
  EXPECT_EQ(frags[0].first, 0);
  EXPECT_EQ(frags[1].first, 1);
  EXPECT_EQ(frags[1].second.param_offset, 32);
}

TEST(ZeroGroupLayoutTest, FragmentsOfParamAgreesWithFragments) {
  ZeroGroupLayout g = ZeroGroupLayout::Make({5, 1, 17, 3, 0, 9, 2}, 3);
  for (int p = 0; p < g.num_params(); ++p) {
    int64_t covered = 0;
    for (const auto& [rank, f] : g.FragmentsOfParam(p)) {
      bool found = false;
      for (const ZeroFragment& x : g.Fragments(rank)) {
        if (x.param_index == p) {
          EXPECT_EQ(x.partition_offset, f.partition_offset);
          EXPECT_EQ(x.param_offset, f.param_offset);
          EXPECT_EQ(x.numel, f.numel);
          found = true;
        }
      }
      EXPECT_TRUE(found) << "param " << p << " rank " << rank;
      covered += f.numel;
    }
    EXPECT_EQ(covered, g.param_numel(p));
  }
}

TEST(ZeroGroupLayoutTest, ZeroNumelParamHasNoFragment) {
  ZeroGroupLayout g = ZeroGroupLayout::Make({4, 0, 4}, 1);
  std::vector<ZeroFragment> f = g.Fragments(0);
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0].param_index, 0);
  EXPECT_EQ(f[1].param_index, 2);
  EXPECT_EQ(f[1].partition_offset, 4);
}

TEST(PartitionTest, Uniform) {
  EXPECT_THAT(PartitionUniform(13, 2), ElementsAre(0, 7, 13));
  EXPECT_THAT(PartitionUniform(10, 4), ElementsAre(0, 3, 6, 8, 10));
  EXPECT_THAT(PartitionUniform(2, 4), ElementsAre(0, 1, 2, 2, 2));
  EXPECT_THAT(PartitionUniform(4, 4), ElementsAre(0, 1, 2, 3, 4));
}

TEST(PartitionTest, BalancedByHand) {
  // Two parts of [1, 1, 1, 1]: cost 0 for the split at 2.
  EXPECT_THAT(PartitionBalanced({1, 1, 1, 1}, 2), ElementsAre(0, 2, 4));
  // [5, 1, 1, 1, 1, 1]: {5} | {1 x 5} has cost 0.
  EXPECT_THAT(PartitionBalanced({5, 1, 1, 1, 1, 1}, 2), ElementsAre(0, 1, 6));
  // Ties go to the larger k (DeepSpeed compares with >=): [0, 4, 0, 4] in two
  // parts: splits at 2 and 3 both give {4} | {4}; k = 3 wins for i = 4.
  EXPECT_THAT(PartitionBalanced({0, 4, 0, 4}, 2), ElementsAre(0, 3, 4));
  // Fewer items than parts falls back to uniform.
  EXPECT_THAT(PartitionBalanced({7}, 3), ElementsAre(0, 1, 1, 1));
}

TEST(PartitionTest, FixtureModelByParameters) {
  // The fixture model: embedding 96x64, a parameter-less block, 8 transformer
  // layers of 4*64*64*3 ... per tp=1 layer: qkv 192*64 + 192, dense 64*64 + 64,
  // h_to_4h 256*64 + 256, 4h_to_h 64*256 + 64, two norms 64 + 64.
  const int64_t layer = 192 * 64 + 192 + 64 * 64 + 64 + 256 * 64 + 256 + 64 * 256 + 64 + 64 + 64;
  std::vector<PipelineLayerInfo> layers;
  layers.push_back({96 * 64, "EmbeddingPipe"});
  layers.push_back({0, "Block"});
  for (int i = 0; i < 8; ++i) layers.push_back({layer, "ParallelTransformerLayerPipe"});
  layers.push_back({0, "function"});
  layers.push_back({64, "NormPipe"});
  layers.push_back({96 * 64, "ParallelLinearPipe"});
  auto parts = PartitionLayers(layers, 2, "parameters");
  ASSERT_TRUE(parts.ok());
  // What DeepSpeed printed for neox-tp1-pp2-dp1: stage 0 = layers 0..5, stage 1 = 6..12.
  EXPECT_THAT(*parts, ElementsAre(0, 6, 13));
  auto by_type = PartitionLayers(layers, 2, "type:transformer");
  ASSERT_TRUE(by_type.ok());
  EXPECT_THAT(*by_type, ElementsAre(0, 6, 13));
  EXPECT_FALSE(PartitionLayers(layers, 2, "profile").ok());
  EXPECT_FALSE(PartitionLayers(layers, 2, "type:(").ok());
}

}  // namespace
}  // namespace ucp::deepspeed
