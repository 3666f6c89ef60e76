#include "base/parallel.h"

#include <atomic>
#include <vector>

#include "gtest/gtest.h"

namespace ucp {
namespace {

TEST(ParallelForTest, RunsEveryIndexOnce) {
  std::vector<std::atomic<int>> hits(1000);
  ASSERT_TRUE(ParallelFor(hits.size(), 4, [&](size_t i) {
                hits[i]++;
                return absl::OkStatus();
              }).ok());
  for (const auto& h : hits) EXPECT_EQ(h.load(), 1);
}

TEST(ParallelForTest, ReturnsAnErrorAndStops) {
  std::atomic<int> ran{0};
  absl::Status s = ParallelFor(10000, 2, [&](size_t i) {
    ran++;
    if (i == 5) return absl::DataLossError("five");
    return absl::OkStatus();
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), "five");
  EXPECT_LT(ran.load(), 10000);
}

TEST(ParallelForTest, SingleThreadKeepsOrder) {
  std::vector<size_t> order;
  ASSERT_TRUE(ParallelFor(5, 1, [&](size_t i) {
                order.push_back(i);
                return absl::OkStatus();
              }).ok());
  EXPECT_EQ(order, (std::vector<size_t>{0, 1, 2, 3, 4}));
}

}  // namespace
}  // namespace ucp
