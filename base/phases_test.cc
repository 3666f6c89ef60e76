#include "base/phases.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace ucp {
namespace {

TEST(PhasesTest, UnboundTimersRecordNothing) {
  PhaseTimes times;
  { PhaseTimer t(Phase::kWrite, 100); }
  EXPECT_EQ(times.calls(Phase::kWrite), 0);
  EXPECT_EQ(PhaseTimes::Current(), nullptr);
}

TEST(PhasesTest, NestedTimersSplitTheOuterTime) {
  PhaseTimes times;
  {
    PhaseScope scope(&times);
    EXPECT_EQ(PhaseTimes::Current(), &times);
    PhaseTimer outer(Phase::kMerge);
    for (int i = 0; i < 3; ++i) {
      PhaseTimer inner(Phase::kWrite, 10);
      PhaseTimer innermost(Phase::kDigest, 5);
    }
  }
  EXPECT_EQ(PhaseTimes::Current(), nullptr);
  EXPECT_EQ(times.calls(Phase::kMerge), 1);
  EXPECT_EQ(times.calls(Phase::kWrite), 3);
  EXPECT_EQ(times.calls(Phase::kDigest), 3);
  EXPECT_EQ(times.bytes(Phase::kWrite), 30);
  EXPECT_EQ(times.bytes(Phase::kDigest), 15);
  // Exclusive times add up to the outermost inclusive time, exactly.
  EXPECT_EQ(times.exclusive_ns(Phase::kMerge) + times.exclusive_ns(Phase::kWrite) +
                times.exclusive_ns(Phase::kDigest),
            times.inclusive_ns(Phase::kMerge));
  EXPECT_EQ(times.exclusive_ns(Phase::kWrite) + times.inclusive_ns(Phase::kDigest), times.inclusive_ns(Phase::kWrite));
  EXPECT_EQ(times.exclusive_ns(Phase::kDigest), times.inclusive_ns(Phase::kDigest));
}

TEST(PhasesTest, RebindingTheSameTimesKeepsTheOpenTimer) {
  PhaseTimes times;
  {
    PhaseScope scope(&times);
    PhaseTimer wait(Phase::kUnits);
    {
      PhaseScope again(&times);  // a thread that runs units itself
      PhaseTimer unit(Phase::kMerge);
    }
  }
  EXPECT_EQ(times.exclusive_ns(Phase::kUnits) + times.inclusive_ns(Phase::kMerge), times.inclusive_ns(Phase::kUnits));
}

TEST(PhasesTest, ThreadsAddToOneTimesAndTheReportNamesThePhases) {
  PhaseTimes times;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      PhaseScope scope(&times);
      for (int i = 0; i < 100; ++i) PhaseTimer w(Phase::kWrite, 1000000);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(times.calls(Phase::kWrite), 400);
  EXPECT_EQ(times.bytes(Phase::kWrite), 400000000);
  const std::string report = times.Report("convert", 1.5);
  EXPECT_NE(report.find("convert: 1.50 s wall"), std::string::npos) << report;
  EXPECT_NE(report.find("write"), std::string::npos) << report;
  EXPECT_NE(report.find("400"), std::string::npos) << report;
  EXPECT_EQ(report.find("fsync"), std::string::npos) << report;  // phases never entered are left out
}

}  // namespace
}  // namespace ucp
