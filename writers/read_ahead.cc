#include "writers/read_ahead.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <list>
#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "base/fs.h"
#include "writers/plan.h"

namespace ucp::writers {
namespace {

// ReadAhead::KernelRequests (any descriptor of a file reads into the same
// page cache).
class Fadvise {
 public:
  void operator()(const std::string& path, int64_t offset, int64_t length) {
    Files& f = *files_;
    auto it = std::find_if(f.open.begin(), f.open.end(), [&](const Fd& d) { return d.path == path; });
    if (it == f.open.end()) {
      if (f.open.size() >= ReadAhead::kOpenFiles) f.open.pop_front();
      // A regular file only, opened without blocking (base/fs.h): a FIFO
      // where an input should be must not block this thread in open() (the
      // job would wait for it forever at its end); the units refuse it.
      absl::StatusOr<int> fd = OpenRegularFile(path);
      f.open.emplace_back(path, fd.ok() ? *fd : -1);
    } else {
      f.open.splice(f.open.end(), f.open, it);  // most recently used last
    }
    const int fd = f.open.back().fd;
    if (fd < 0) return;
    (void)::posix_fadvise(fd, static_cast<off_t>(offset), static_cast<off_t>(length), POSIX_FADV_WILLNEED);
  }

 private:
  struct Fd {
    Fd(std::string p, int f) : path(std::move(p)), fd(f) {}
    Fd(const Fd&) = delete;
    Fd& operator=(const Fd&) = delete;
    ~Fd() {
      if (fd >= 0) ::close(fd);
    }
    std::string path;
    int fd;
  };
  struct Files {
    std::list<Fd> open;
  };
  // Shared by the copies std::function makes; closed with the last one.
  std::shared_ptr<Files> files_ = std::make_shared<Files>();
};

// The size of `path`, or -1.
int64_t SizeOf(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return -1;
  return static_cast<int64_t>(st.st_size);
}

}  // namespace

ReadAhead::RequestFn ReadAhead::KernelRequests() { return Fadvise(); }

ReadAhead::ReadAhead(const std::vector<Unit>& units, const std::vector<size_t>& order, ExtentFn extent,
                     int64_t budget, RequestFn request)
    : units_(units), order_(order), extent_(std::move(extent)), budget_(budget), request_(std::move(request)),
      asked_(order.size(), 0), ended_(order.size(), false) {
  if (!request_) request_ = KernelRequests();
  if (extent_ && budget_ > 0 && !order_.empty()) thread_ = std::thread([this] { Run(); });
}

ReadAhead::~ReadAhead() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void ReadAhead::Finished(size_t k) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (k >= ended_.size() || ended_[k]) return;
    ended_[k] = true;
    outstanding_ -= asked_[k];
  }
  cv_.notify_all();
}

bool ReadAhead::WaitForRoom(size_t p) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return stop_ || ended_[p] || outstanding_ < budget_; });
  return !stop_ && !ended_[p];
}

void ReadAhead::Run() {
  for (size_t p = 0; p < order_.size(); ++p) {
    for (const state::InputRange& r : units_[order_[p]].inputs) {
      const std::optional<state::FileExtent> e = extent_(r);
      if (!e || e->offset < 0) continue;
      int64_t end = e->offset + e->length;
      if (e->length < 0) end = SizeOf(e->path);
      for (int64_t at = e->offset; at < end; at += kStepBytes) {
        if (!WaitForRoom(p)) {
          std::lock_guard<std::mutex> lock(mu_);
          if (stop_) return;
          break;  // the unit ended: on to the next one
        }
        const int64_t len = std::min(kStepBytes, end - at);
        request_(e->path, at, len);
        std::lock_guard<std::mutex> lock(mu_);
        if (ended_[p]) break;  // it ended during the request: not outstanding
        asked_[p] += len;
        outstanding_ += len;
      }
    }
  }
}

}  // namespace ucp::writers
