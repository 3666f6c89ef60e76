// ReadAhead (writers/read_ahead.h): what it asks for, in which order, in
// which steps, and how far ahead of the units started, with the kernel's
// posix_fadvise replaced by a recorder.
#include "writers/read_ahead.h"

#include <dirent.h>
#include <sys/stat.h>

#include <chrono>
#include <condition_variable>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "base/fs.h"
#include "gtest/gtest.h"
#include "testing/fixtures.h"
#include "writers/plan.h"

namespace ucp::writers {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

using Request = std::tuple<std::string, int64_t, int64_t>;  // path, offset, length

// Records the requests; waits for a count of them.
class Recorder {
 public:
  ReadAhead::RequestFn Fn() {
    return [this](const std::string& path, int64_t offset, int64_t length) {
      std::lock_guard<std::mutex> lock(mu_);
      requests_.emplace_back(path, offset, length);
      cv_.notify_all();
    };
  }
  // The requests once there are at least n (or after 60 s, whatever came).
  std::vector<Request> WaitFor(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(60), [&] { return requests_.size() >= n; });
    return requests_;
  }
  std::vector<Request> Now() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Request> requests_;
};

Unit UnitReading(std::vector<InputRange> inputs) {
  Unit u;
  u.inputs = std::move(inputs);
  return u;
}

// Extents by tensor name, as a state would tell them.
ReadAhead::ExtentFn ExtentsOf(std::map<std::string, state::FileExtent> extents) {
  return [extents](const InputRange& r) -> std::optional<state::FileExtent> {
    auto it = extents.find(r.tensor);
    if (it == extents.end()) return std::nullopt;
    return it->second;
  };
}

TEST(ReadAheadTest, AsksForEachUnitsExtentsInTheOrderTheUnitsRunInSteps) {
  const std::vector<Unit> units = {UnitReading({{"f", "a", 0, 1}, {"f", "b", 0, 1}}),  //
                                   UnitReading({{"g", "c", 0, 1}}),                    //
                                   UnitReading({{"f", "d", 0, 1}})};
  const std::vector<size_t> order = {2, 0, 1};
  Recorder rec;
  std::vector<Request> got;
  {
    ReadAhead ahead(units, order,
                    ExtentsOf({{"a", {"/f", 100, 20 * kMiB}},
                               {"b", {"/f", 5, 3}},
                               {"c", {"/g", 0, 8 * kMiB}},
                               {"d", {"/f", 40 * kMiB, 1}}}),
                    int64_t{1} << 30, rec.Fn());
    got = rec.WaitFor(6);
  }
  const std::vector<Request> want = {
      {"/f", 40 * kMiB, 1},                               // unit 2 runs first
      {"/f", 100, 8 * kMiB},                              // unit 0: a, in steps of 8 MiB
      {"/f", 100 + 8 * kMiB, 8 * kMiB},                   //
      {"/f", 100 + 16 * kMiB, 4 * kMiB},                  //
      {"/f", 5, 3},                                       // then b
      {"/g", 0, 8 * kMiB},                                // unit 1
  };
  EXPECT_EQ(got, want);
}

TEST(ReadAheadTest, StaysWithinItsBudgetOfTheUnitsNotEnded) {
  std::vector<Unit> units;
  std::map<std::string, state::FileExtent> extents;
  for (int i = 0; i < 5; ++i) {
    const std::string name = "t" + std::to_string(i);
    units.push_back(UnitReading({{"f", name, 0, 1}}));
    extents[name] = {"/f", i * 8 * kMiB, 8 * kMiB};
  }
  const std::vector<size_t> order = {0, 1, 2, 3, 4};
  Recorder rec;
  ReadAhead ahead(units, order, ExtentsOf(extents), 16 * kMiB, rec.Fn());
  // 16 MiB: units 0 and 1, then it waits for a unit to end.
  EXPECT_EQ(rec.WaitFor(2).size(), 2u);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(rec.Now().size(), 2u) << "asked for more than 16 MiB for units not ended";
  ahead.Finished(0);  // unit 0 no longer counts: room for unit 2
  EXPECT_EQ(rec.WaitFor(3).size(), 3u);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(rec.Now().size(), 3u);
  // Unit 3 ended before it was reached (another thread ran it): skipped.
  ahead.Finished(3);
  ahead.Finished(1);
  const std::vector<Request> got = rec.WaitFor(4);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_EQ(rec.Now().size(), 4u);
  const std::vector<int64_t> offsets = {0, 8 * kMiB, 16 * kMiB, 32 * kMiB};
  for (size_t i = 0; i < offsets.size(); ++i) EXPECT_EQ(std::get<1>(got[i]), offsets[i]) << i;
  // Destroyed here with nothing left: it ends (a test that hangs fails).
}

TEST(ReadAheadTest, StopsWhileWaitingForRoom) {
  const std::vector<Unit> units = {UnitReading({{"f", "a", 0, 1}}), UnitReading({{"f", "b", 0, 1}})};
  const std::vector<size_t> order = {0, 1};
  Recorder rec;
  {
    ReadAhead ahead(units, order, ExtentsOf({{"a", {"/f", 0, 8 * kMiB}}, {"b", {"/f", 8 * kMiB, 8 * kMiB}}}),
                    kMiB, rec.Fn());
    EXPECT_EQ(rec.WaitFor(1).size(), 1u);
  }  // no unit ever ends: the destructor must end the wait
  EXPECT_EQ(rec.Now().size(), 1u);
}

TEST(ReadAheadTest, SkipsUnknownExtentsAndReadsWholeFilesToTheirEnd) {
  const std::string dir = ucp::testing::FreshTempDir("read_ahead_whole");
  const std::string path = JoinPath(dir, "whole.pt");
  {
    std::ofstream out(path, std::ios::binary);
    out << std::string(10 * kMiB + 5, 'x');
  }
  const std::vector<Unit> units = {UnitReading({{"f", "unknown", 0, 1}, {path, "", 0, -1}})};
  const std::vector<size_t> order = {0};
  Recorder rec;
  std::vector<Request> got;
  {
    ReadAhead ahead(units, order,
                    [&](const InputRange& r) -> std::optional<state::FileExtent> {
                      if (r.tensor.empty()) return state::FileExtent{r.path, 0, -1};
                      return std::nullopt;
                    },
                    int64_t{1} << 30, rec.Fn());
    got = rec.WaitFor(2);
  }
  const std::vector<Request> want = {{path, 0, 8 * kMiB}, {path, 8 * kMiB, 2 * kMiB + 5}};
  EXPECT_EQ(got, want);
}

TEST(ReadAheadTest, AsksNothingWithoutExtentsOrBudget) {
  const std::vector<Unit> units = {UnitReading({{"f", "a", 0, 1}})};
  const std::vector<size_t> order = {0};
  Recorder rec;
  { ReadAhead none(units, order, nullptr, int64_t{1} << 30, rec.Fn()); }
  { ReadAhead zero(units, order, ExtentsOf({{"a", {"/f", 0, 1}}}), 0, rec.Fn()); }
  EXPECT_TRUE(rec.Now().empty());
  // The same with a budget does ask: the two above were not too quick to see.
  { 
    ReadAhead some(units, order, ExtentsOf({{"a", {"/f", 0, 1}}}), 1, rec.Fn());
    EXPECT_EQ(rec.WaitFor(1).size(), 1u);
  }
}

// The number of descriptors this process has open.
int OpenDescriptors() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  while (readdir(d) != nullptr) ++n;
  closedir(d);
  return n;
}

TEST(ReadAheadTest, KernelRequestsKeepFewDescriptorsOpen) {
  const std::string dir = ucp::testing::FreshTempDir("read_ahead_fds");
  std::vector<std::string> paths;
  for (int i = 0; i < 40; ++i) {
    paths.push_back(JoinPath(dir, "f" + std::to_string(i)));
    std::ofstream(paths.back(), std::ios::binary) << std::string(4096, 'x');
  }
  const int before = OpenDescriptors();
  ASSERT_GT(before, 0);
  {
    ReadAhead::RequestFn request = ReadAhead::KernelRequests();
    for (int round = 0; round < 2; ++round) {
      for (const std::string& p : paths) {
        request(p, 0, 4096);
        EXPECT_LE(OpenDescriptors(), before + static_cast<int>(ReadAhead::kOpenFiles)) << p;
      }
    }
    EXPECT_EQ(OpenDescriptors(), before + static_cast<int>(ReadAhead::kOpenFiles));
    request("/nonexistent/file", 0, 1);  // cannot be opened: ignored
    // A FIFO where a file should be: not opened, not waited on (a hang
    // fails the test).
    const std::string fifo = JoinPath(dir, "fifo");
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    request(fifo, 0, 1);
  }
  EXPECT_EQ(OpenDescriptors(), before) << "descriptors left open";
}

}  // namespace
}  // namespace ucp::writers
