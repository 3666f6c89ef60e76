#include "writers/plan.h"

#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ucp::writers {
namespace {

Unit MakeUnit(std::string name, int64_t bytes, std::vector<InputRange> inputs = {}) {
  Unit u;
  u.name = std::move(name);
  u.bytes = bytes;
  u.inputs = std::move(inputs);
  return u;
}

TEST(PlanTest, AssignUnitsLargestFirstToTheLeastLoaded) {
  std::vector<Unit> units = {MakeUnit("a", 5), MakeUnit("b", 9), MakeUnit("c", 3),
                             MakeUnit("d", 7), MakeUnit("e", 6), MakeUnit("f", 4)};
  const auto a = AssignUnits(units, 2);
  ASSERT_EQ(a.size(), 2u);
  // b(9)->0; d(7)->1; e(6)->1 (7<9); a(5)->0 (9<13); f(4)->1 (13<14); c(3)->0 (14<17).
  EXPECT_EQ(a[0], (std::vector<size_t>{0, 1, 2}));
  EXPECT_EQ(a[1], (std::vector<size_t>{3, 4, 5}));
  // Every unit exactly once, whatever the rank count.
  for (int ranks : {1, 3, 4, 10}) {
    std::multiset<size_t> seen;
    for (const auto& r : AssignUnits(units, ranks)) seen.insert(r.begin(), r.end());
    EXPECT_EQ(seen, (std::multiset<size_t>{0, 1, 2, 3, 4, 5})) << ranks;
  }
}

TEST(PlanTest, FlushesAnEighthOfWhatAProcessWritesWithinBounds) {
  constexpr int64_t kMiB = int64_t{1} << 20;
  // Each rank of a 2-rank job writing 437 MB: 32 MiB (an eighth is less).
  EXPECT_EQ(FlushEveryBytes(218 * 1000 * 1000), 32 * kMiB);
  // One process writing it all: an eighth.
  EXPECT_EQ(FlushEveryBytes(437 * 1000 * 1000), 437 * 1000 * 1000 / 8);
  EXPECT_EQ(FlushEveryBytes(1024 * kMiB), 128 * kMiB);
  // Large jobs flush every 256 MiB, however much they write.
  EXPECT_EQ(FlushEveryBytes(2048 * kMiB), 256 * kMiB);
  EXPECT_EQ(FlushEveryBytes(int64_t{64} << 30), 256 * kMiB);
  // Nothing or little to write: still a positive interval (0 would turn the flusher off).
  EXPECT_EQ(FlushEveryBytes(0), 32 * kMiB);
}

TEST(PlanTest, EachRecordIsCheckedByTheRankReadingMostOfIt) {
  const InputRange part0{"/ckpt/zero_pp_rank_0.pt", "single_partition_of_fp32_groups[0]", 0, 100};
  const InputRange part0_more{"/ckpt/zero_pp_rank_0.pt", "single_partition_of_fp32_groups[0]", 100, 300};
  const InputRange part1{"/ckpt/zero_pp_rank_1.pt", "single_partition_of_fp32_groups[0]", 0, 50};
  const InputRange whole{"/ckpt/mp_rank_00_model_states.pt", "", 0, -1};
  std::vector<Unit> units = {MakeUnit("p0", 10, {part0, part1}), MakeUnit("p1", 10, {part0_more}),
                             MakeUnit("p2", 10, {part1, whole}), MakeUnit("p3", 10, {whole})};
  const std::vector<std::vector<size_t>> assignment = {{0, 3}, {1}, {2}};
  const auto checkers = AssignCheckers(units, assignment);
  ASSERT_EQ(checkers.size(), 3u);
  const std::string k0 = state::InputKey(part0.path, part0.tensor);
  const std::string k1 = state::InputKey(part1.path, part1.tensor);
  const std::string kw = state::InputKey(whole.path, whole.tensor);
  // part 0 (400 bytes read, first): rank 0 reads 100, less than half of rank
  // 1's 300: rank 1 checks it.
  EXPECT_EQ(checkers[1], (std::set<std::string>{k0}));
  // part 1 (100): ranks 0 and 2 read 50 each, neither has checks yet: the
  // lower rank. The whole file (unknown size, 1 per reader): ranks 0 and 2
  // read it, rank 2 has fewer bytes to check.
  EXPECT_EQ(checkers[0], (std::set<std::string>{k1}));
  EXPECT_EQ(checkers[2], (std::set<std::string>{kw}));
  // Every record read is checked by exactly one rank.
  std::multiset<std::string> all;
  for (const auto& c : checkers) all.insert(c.begin(), c.end());
  EXPECT_EQ(all, (std::multiset<std::string>{k0, k1, kw}));
}

TEST(PlanTest, ChecksOfRecordsEveryRankReadsAreSpreadOverTheRanks) {
  // Two files of three flat partitions each (fp32, exp_avg, exp_avg_sq), as a
  // ZeRO-1 checkpoint at tp 2 has; every param's unit reads its slice of all
  // six, and rank 0's units read slightly more of each. Before, rank 0, the
  // top reader of every record, checked all six while rank 1 waited.
  std::vector<InputRange> inputs0, inputs1;
  for (const char* file : {"/ckpt/zero_pp_rank_0_mp_rank_00.pt", "/ckpt/zero_pp_rank_0_mp_rank_01.pt"}) {
    for (const char* record : {"fp32", "exp_avg", "exp_avg_sq"}) {
      inputs0.push_back({file, record, 0, 510});
      inputs1.push_back({file, record, 510, 490});
    }
  }
  std::vector<Unit> units = {MakeUnit("p0", 10, inputs0), MakeUnit("p1", 10, inputs1)};
  const auto checkers = AssignCheckers(units, {{0}, {1}});
  ASSERT_EQ(checkers.size(), 2u);
  EXPECT_EQ(checkers[0].size(), 3u);
  EXPECT_EQ(checkers[1].size(), 3u);
  std::set<std::string> all;
  for (const auto& c : checkers) all.insert(c.begin(), c.end());
  EXPECT_EQ(all.size(), 6u);
  // A record one rank reads almost alone stays with it, however loaded.
  units.push_back(MakeUnit("p2", 10, {{"/ckpt/big.pt", "x", 0, 100000}}));
  units.push_back(MakeUnit("p3", 10, {{"/ckpt/big.pt", "x", 100000, 10}}));
  const auto again = AssignCheckers(units, {{0, 2}, {1, 3}});
  EXPECT_TRUE(again[0].count(state::InputKey("/ckpt/big.pt", "x")));
  EXPECT_EQ(again[0].size() + again[1].size(), 7u);
}

}  // namespace
}  // namespace ucp::writers
