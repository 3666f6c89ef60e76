#include "base/parallel.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

namespace ucp {

int DefaultThreadCount() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

absl::Status ParallelFor(size_t n, int num_threads, const std::function<absl::Status(size_t)>& fn) {
  if (n == 0) return absl::OkStatus();
  size_t threads = num_threads <= 0 ? static_cast<size_t>(DefaultThreadCount()) : static_cast<size_t>(num_threads);
  threads = std::min(threads, n);
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  size_t error_index = n;
  absl::Status error;
  auto worker = [&]() {
    while (!failed.load(std::memory_order_relaxed)) {
      const size_t i = next.fetch_add(1);
      if (i >= n) return;
      absl::Status s = fn(i);
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (i < error_index) {
          error_index = i;
          error = std::move(s);
        }
        failed.store(true);
      }
    }
  };
  if (threads == 1) {
    worker();
  } else {
    std::vector<std::thread> pool;
    pool.reserve(threads);
    for (size_t t = 0; t < threads; ++t) pool.emplace_back(worker);
    for (auto& t : pool) t.join();
  }
  return error;
}

}  // namespace ucp
