#include "base/parallel.h"

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

namespace ucp {

int DefaultThreadCount() {
  // The cores this process may run on (a launcher may bind it to a few).
  int n = 0;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) n = CPU_COUNT(&set);
  if (n <= 0) n = static_cast<int>(std::thread::hardware_concurrency());
  if (n <= 0) n = 1;
  // Ranks of one MPI job on this node that are not bound share its cores:
  // each takes its part, so that R ranks run R * (cores / R) threads.
  const int online = static_cast<int>(std::thread::hardware_concurrency());
  if (n >= online) {
    for (const char* var : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_LOCAL_SIZE"}) {
      if (const char* v = std::getenv(var)) {
        const int local = std::atoi(v);
        if (local > 1) n = std::max(1, n / local);
        break;
      }
    }
  }
  return n;
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
