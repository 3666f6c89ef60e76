#include "base/once_slot.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace ucp {
namespace {

TEST(OnceSlotTest, MakesOnceAndGivesTheSameValue) {
  OnceSlot<int> slot;
  EXPECT_EQ(slot.made(), nullptr);
  int calls = 0;
  auto make = [&]() -> absl::StatusOr<std::unique_ptr<int>> {
    ++calls;
    return std::make_unique<int>(42);
  };
  absl::StatusOr<int*> a = slot.Get(make);
  absl::StatusOr<int*> b = slot.Get(make);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(**a, 42);
  EXPECT_EQ(*a, *b);
  EXPECT_EQ(slot.made(), *a);
  EXPECT_EQ(calls, 1);
}

TEST(OnceSlotTest, AnErrorIsEveryLaterAnswerAndNotRetried) {
  OnceSlot<int> slot;
  int calls = 0;
  auto fail = [&]() -> absl::StatusOr<std::unique_ptr<int>> {
    ++calls;
    return absl::DataLossError("f.pt: damaged");
  };
  auto succeed = [&]() -> absl::StatusOr<std::unique_ptr<int>> {
    ++calls;
    return std::make_unique<int>(1);
  };
  EXPECT_EQ(slot.Get(fail).status(), absl::DataLossError("f.pt: damaged"));
  EXPECT_EQ(slot.Get(succeed).status(), absl::DataLossError("f.pt: damaged"));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(slot.made(), nullptr);
}

TEST(OnceSlotTest, ThreadsAskingAtOnceShareOneMaking) {
  OnceSlot<int> slot;
  std::atomic<int> calls{0};
  std::vector<int*> got(8, nullptr);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < got.size(); ++i) {
    threads.emplace_back([&, i] {
      absl::StatusOr<int*> v = slot.Get([&]() -> absl::StatusOr<std::unique_ptr<int>> {
        calls.fetch_add(1);
        std::this_thread::yield();
        return std::make_unique<int>(7);
      });
      if (v.ok()) got[i] = *v;
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(calls.load(), 1);
  for (int* p : got) {
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(p, got[0]);
    EXPECT_EQ(*p, 7);
  }
}

}  // namespace
}  // namespace ucp
