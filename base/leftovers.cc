#include "base/leftovers.h"

#include <atomic>
#include <mutex>

namespace ucp {
namespace {

std::atomic<bool> left_to_exit{false};

// Never destroyed: what it holds stays reachable until the process ends.
struct Kept {
  std::mutex mu;
  std::vector<std::shared_ptr<void>> objects;
};
Kept& KeptUntilExit() {
  static Kept* kept = new Kept();
  return *kept;
}

}  // namespace

void LeaveLeftoversToExit() { left_to_exit.store(true, std::memory_order_relaxed); }
bool LeftoversLeftToExit() { return left_to_exit.load(std::memory_order_relaxed); }

Leftovers::~Leftovers() {
  if (LeftoversLeftToExit()) {
    Kept& k = KeptUntilExit();
    std::lock_guard<std::mutex> lock(k.mu);
    for (auto& p : kept_) k.objects.push_back(std::move(p));
    return;
  }
  while (!kept_.empty()) kept_.pop_back();
}

}  // namespace ucp
