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
  // part 0: rank 0 reads 100 bytes, rank 1 300: rank 1 checks it.
  EXPECT_EQ(checkers[1], (std::set<std::string>{k0}));
  // part 1: ranks 0 and 2 read 50 each: the lower rank. The whole file: a tie too.
  EXPECT_EQ(checkers[0], (std::set<std::string>{k1, kw}));
  EXPECT_TRUE(checkers[2].empty());
  // Every record read is checked by exactly one rank.
  std::multiset<std::string> all;
  for (const auto& c : checkers) all.insert(c.begin(), c.end());
  EXPECT_EQ(all, (std::multiset<std::string>{k0, k1, kw}));
}

}  // namespace
}  // namespace ucp::writers
