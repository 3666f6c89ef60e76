#include "base/flusher.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "base/fs.h"
#include "gtest/gtest.h"

namespace ucp {
namespace {

std::string TestFile(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = JoinPath(dir != nullptr ? dir : "/tmp", name);
  EXPECT_TRUE(WriteFileAtomic(path, std::string(1024, 'x')).ok());
  return path;
}

// Waits (up to a minute: machines here are shared) for `n` flushes.
bool WaitForFlushes(const BackgroundFlusher& f, int n) {
  for (int i = 0; i < 6000 && f.flushes() < n; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return f.flushes() >= n;
}

TEST(BackgroundFlusherTest, FlushesOnceEnoughBytesAreWritten) {
  BackgroundFlusher flusher(2048);
  flusher.Written(TestFile("a"), 1024);
  flusher.Written(TestFile("b"), 1024);
  ASSERT_TRUE(WaitForFlushes(flusher, 1));
  EXPECT_TRUE(flusher.Finish().ok());
  EXPECT_EQ(flusher.flushes(), 1);
}

TEST(BackgroundFlusherTest, NoFlushBelowTheThreshold) {
  BackgroundFlusher flusher(4096);
  flusher.Written(TestFile("c"), 1024);
  flusher.Written(TestFile("d"), 1024);
  EXPECT_TRUE(flusher.Finish().ok());
  EXPECT_EQ(flusher.flushes(), 0);
}

TEST(BackgroundFlusherTest, DisabledDoesNothing) {
  BackgroundFlusher flusher(0);
  flusher.Written("/nonexistent/ucp-flusher-test", int64_t{1} << 40);
  EXPECT_TRUE(flusher.Finish().ok());
  EXPECT_EQ(flusher.flushes(), 0);
}

TEST(BackgroundFlusherTest, AFileThatCannotBeOpenedIsTheJobsErrorNamingIt) {
  BackgroundFlusher flusher(100);
  flusher.Written("/nonexistent/ucp-flusher-test", 1000);
  for (int i = 0; i < 6000 && flusher.handled_bytes() < 1000; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(flusher.handled_bytes(), 1000);
  absl::Status s = flusher.Finish();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_NE(s.message().find("/nonexistent/ucp-flusher-test"), std::string::npos) << s;
  // Reported again, not consumed.
  EXPECT_EQ(flusher.Finish().code(), absl::StatusCode::kNotFound);
}

// Finish starts the writeback of every range reported before it (measured
// before: under load the writeback thread had not reached the last ones, which
// were dropped, and an export's --timings writeback row said 1 MB of its 2).
TEST(BackgroundFlusherTest, EveryRangeReportedBeforeFinishIsStarted) {
  const std::string path = TestFile("all");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  BackgroundFlusher flusher(int64_t{1} << 40);
  for (int i = 0; i < 2000; ++i) flusher.WrittenRange(fd, path, 0, 1024);
  EXPECT_TRUE(flusher.Finish().ok());
  EXPECT_EQ(flusher.handled_bytes(), 2000 * 1024);
  EXPECT_EQ(flusher.flushes(), 0);
  ::close(fd);
}

// A file reported in ranges while written, then whole when its unit ends
// (ExecuteUnits), counts each byte once: before, its bytes counted twice and
// a job asked for about twice the flushes it needed.
TEST(BackgroundFlusherTest, AFileReportedInRangesThenWholeCountsOnce) {
  const std::string path = TestFile("ranged");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  BackgroundFlusher flusher(int64_t{1} << 40);
  flusher.WrittenRange(fd, path, 0, 3000);
  flusher.WrittenRange(fd, path, 3000, 1000);
  flusher.Written(path, 4096);  // 96 bytes more than the ranges
  flusher.Written(TestFile("other"), 500);
  EXPECT_TRUE(flusher.Finish().ok());
  EXPECT_EQ(flusher.handled_bytes(), 4096 + 500);
  ::close(fd);
}

TEST(BackgroundFlusherTest, NothingIsTakenAfterFinish) {
  BackgroundFlusher flusher(100);
  EXPECT_TRUE(flusher.Finish().ok());
  flusher.Written("/nonexistent/ucp-flusher-test", 1000);
  EXPECT_TRUE(flusher.Finish().ok());
  EXPECT_EQ(flusher.flushes(), 0);
}

TEST(BackgroundFlusherTest, RangesOfOpenFilesCountAndFlush) {
  const std::string path = TestFile("e");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  BackgroundFlusher flusher(1000);
  {
    FlusherScope bound(&flusher);
    EXPECT_EQ(BackgroundFlusher::Current(), &flusher);
    StartWriteback(fd, path, 0, 512);
    StartWriteback(fd, path, 512, 512);
  }
  EXPECT_EQ(BackgroundFlusher::Current(), nullptr);
  ::close(fd);  // the flusher holds its own descriptor
  ASSERT_TRUE(WaitForFlushes(flusher, 1));
  EXPECT_TRUE(flusher.Finish().ok());
}

TEST(BackgroundFlusherTest, UnboundWritebackNeedsNoFlusher) {
  const std::string path = TestFile("f");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  BackgroundFlusher flusher(1);
  StartWriteback(fd, path, 0, 1024);  // not bound: straight to sync_file_range
  ::close(fd);
  EXPECT_TRUE(flusher.Finish().ok());
  EXPECT_EQ(flusher.flushes(), 0);
}

}  // namespace
}  // namespace ucp
