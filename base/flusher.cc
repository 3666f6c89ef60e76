#include "base/flusher.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/phases.h"

namespace ucp {

namespace {

thread_local BackgroundFlusher* current_flusher = nullptr;

absl::Status OpenError(const std::string& path) {
  return absl::ErrnoToStatus(
      errno, absl::StrCat(path, ": cannot open to flush (was the output folder changed while ucp wrote it?)"));
}

}  // namespace

void StartWriteback(int fd, const std::string& path, uint64_t offset, uint64_t len) {
  if (fd < 0 || len == 0) return;
  if (BackgroundFlusher* f = BackgroundFlusher::Current()) {
    f->WrittenRange(fd, path, offset, len);
    return;
  }
  PhaseTimer timer(Phase::kWriteback, static_cast<int64_t>(len));
  (void)::sync_file_range(fd, static_cast<off64_t>(offset), static_cast<off64_t>(len), SYNC_FILE_RANGE_WRITE);
}

BackgroundFlusher* BackgroundFlusher::Current() { return current_flusher; }

FlusherScope::FlusherScope(BackgroundFlusher* flusher) : previous_(current_flusher) { current_flusher = flusher; }
FlusherScope::~FlusherScope() { current_flusher = previous_; }

BackgroundFlusher::BackgroundFlusher(int64_t every_bytes) : every_(every_bytes) {
  if (every_ <= 0) return;
  PhaseTimes* const times = PhaseTimes::Current();  // --timings: the creator's table
  writeback_thread_ = std::thread([this, times] {
    PhaseScope bound(times);
    RunWriteback();
  });
  flush_thread_ = std::thread([this, times] {
    PhaseScope bound(times);
    RunFlush();
  });
}

BackgroundFlusher::~BackgroundFlusher() { (void)Finish(); }

void BackgroundFlusher::Push(Item item) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stop_) {
      queue_.push_back(std::move(item));
      item.fd = -1;
    }
  }
  if (item.fd >= 0) ::close(item.fd);
  cv_.notify_all();
}

void BackgroundFlusher::Written(const std::string& path, int64_t bytes) {
  if (every_ <= 0) return;
  Item item;
  item.path = path;
  item.bytes = bytes;
  {
    // A file whose writer reported ranges of it while writing (WrittenRange):
    // its writeback is started again whole (cheap for pages already written
    // back, and it covers any byte not reported), but only the bytes not
    // reported before count towards the next flush.
    std::lock_guard<std::mutex> lock(mu_);
    auto it = ranged_.find(path);
    if (it != ranged_.end()) {
      item.bytes = std::max<int64_t>(0, bytes - it->second);
      ranged_.erase(it);
    }
  }
  Push(std::move(item));
}

void BackgroundFlusher::WrittenRange(int fd, const std::string& path, uint64_t offset, uint64_t len) {
  if (every_ <= 0 || len == 0) return;
  Item item;
  item.path = path;
  item.fd = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (item.fd < 0) return;  // a hint: the commit's sync covers it
  item.offset = offset;
  item.len = len;
  item.bytes = static_cast<int64_t>(len);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stop_) ranged_[path] += static_cast<int64_t>(len);
  }
  Push(std::move(item));
}

void BackgroundFlusher::RunWriteback() {
  int64_t pending = 0;  // bytes written back since the last flush was asked for
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopped, and every reported range was started
    Item item = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    absl::Status s;
    if (item.fd < 0) {
      item.fd = ::open(item.path.c_str(), O_RDONLY | O_CLOEXEC);
      if (item.fd < 0) s = OpenError(item.path);
    }
    if (item.fd >= 0) {
      PhaseTimer timer(Phase::kWriteback, item.bytes);
      (void)::sync_file_range(item.fd, static_cast<off64_t>(item.offset), static_cast<off64_t>(item.len),
                              SYNC_FILE_RANGE_WRITE);
    }
    pending += item.bytes;
    lock.lock();
    handled_ += item.bytes;
    if (error_.ok()) error_ = s;
    if (item.fd >= 0 && pending >= every_ && !stop_) {
      // The newest file written back is the one to flush (any would do: the
      // journal commit's cache flush covers every completed write).
      if (flush_fd_ >= 0) ::close(flush_fd_);
      flush_fd_ = item.fd;
      flush_path_ = item.path;
      item.fd = -1;
      pending = 0;
      cv_.notify_all();
    }
    if (item.fd >= 0) ::close(item.fd);
  }
}

void BackgroundFlusher::RunFlush() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || flush_fd_ >= 0; });
    if (stop_) return;
    const int fd = flush_fd_;
    const std::string path = flush_path_;
    flush_fd_ = -1;
    lock.unlock();
    absl::Status s;
    {
      PhaseTimer timer(Phase::kFlush);
      if (::fdatasync(fd) != 0) {
        s = absl::ErrnoToStatus(
            errno, absl::StrCat(path, ": fdatasync failed: the output may not be on disk"));
      }
    }
    ::close(fd);
    lock.lock();
    ++flushes_;
    if (error_.ok()) error_ = s;
  }
}

absl::Status BackgroundFlusher::Finish() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (writeback_thread_.joinable()) writeback_thread_.join();
  if (flush_thread_.joinable()) flush_thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  for (Item& item : queue_) {
    if (item.fd >= 0) ::close(item.fd);
  }
  queue_.clear();
  ranged_.clear();
  if (flush_fd_ >= 0) ::close(flush_fd_);
  flush_fd_ = -1;
  return error_;
}

int64_t BackgroundFlusher::handled_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return handled_;
}

int BackgroundFlusher::flushes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return flushes_;
}

std::mutex& FileWriteTurn(const std::string& path) {
  static std::mutex* const turns = new std::mutex[64];
  return turns[std::hash<std::string>{}(path) % 64];
}

}  // namespace ucp
