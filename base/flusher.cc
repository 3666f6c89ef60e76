#include "base/flusher.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/phases.h"

namespace ucp {

namespace {

absl::Status FlushFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat(path, ": cannot open to flush (was the output folder changed "
                                                         "while ucp wrote it?)"));
  }
  absl::Status s;
  if (::fdatasync(fd) != 0) {
    s = absl::ErrnoToStatus(errno, absl::StrCat(path, ": fdatasync failed: the output may not be on disk"));
  }
  ::close(fd);
  return s;
}

// A hint: a file that cannot be opened here is reported by the flush.
void StartFileWriteback(const std::string& path) {
  PhaseTimer timer(Phase::kWriteback);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE);
  ::close(fd);
}

}  // namespace

BackgroundFlusher::BackgroundFlusher(int64_t every_bytes) : every_(every_bytes) {
  if (every_ > 0) {
    thread_ = std::thread([this, times = PhaseTimes::Current()] {
      PhaseScope bound(times);  // --timings: the creator's table
      Run();
    });
  }
}

BackgroundFlusher::~BackgroundFlusher() { (void)Finish(); }

void BackgroundFlusher::Written(const std::string& path, int64_t bytes) {
  if (every_ <= 0) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    queue_.emplace_back(path, bytes);
  }
  cv_.notify_one();
}

void BackgroundFlusher::Run() {
  int64_t pending = 0;  // bytes written back since the last flush
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    const auto [path, bytes] = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    StartFileWriteback(path);
    pending += bytes;
    absl::Status s;
    const bool flush = pending >= every_;
    if (flush) {
      PhaseTimer timer(Phase::kFlush);
      s = FlushFile(path);
      pending = 0;
    }
    lock.lock();
    if (flush) ++flushes_;
    if (error_.ok()) error_ = s;
  }
}

absl::Status BackgroundFlusher::Finish() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

int BackgroundFlusher::flushes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return flushes_;
}

}  // namespace ucp
