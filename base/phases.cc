#include "base/phases.h"

#include <time.h>

#include <cstdio>

namespace ucp {
namespace {

thread_local PhaseTimes* current_times = nullptr;
thread_local PhaseTimer* current_timer = nullptr;

int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

}  // namespace

const char* PhaseName(Phase p) {
  switch (p) {
    case Phase::kOpen: return "open, parse and plan";
    case Phase::kUnits: return "units (waiting for them)";
    case Phase::kMerge: return "read and merge";
    case Phase::kInputCrc: return "input CRC";
    case Phase::kInputReread: return "input re-read (CRC)";
    case Phase::kOutputCrc: return "output CRC";
    case Phase::kDigest: return "digest";
    case Phase::kWrite: return "write";
    case Phase::kWriteback: return "writeback";
    case Phase::kFlush: return "background flush";
    case Phase::kFsync: return "fsync";
    case Phase::kCommit: return "commit";
    case Phase::kRanks: return "waiting for other ranks";
    case Phase::kCount: break;
  }
  return "?";
}

void PhaseTimes::Add(Phase p, int64_t inclusive_ns, int64_t exclusive_ns, int64_t bytes) {
  Slot& s = slots_[static_cast<int>(p)];
  s.calls.fetch_add(1, std::memory_order_relaxed);
  s.inclusive.fetch_add(inclusive_ns, std::memory_order_relaxed);
  s.exclusive.fetch_add(exclusive_ns, std::memory_order_relaxed);
  s.bytes.fetch_add(bytes, std::memory_order_relaxed);
}

std::string PhaseTimes::Report(const std::string& title, double wall_seconds) const {
  double total = 0;
  for (int i = 0; i < static_cast<int>(Phase::kCount); ++i) total += slots_[i].exclusive.load() * 1e-9;
  std::string out;
  char line[256];
  std::snprintf(line, sizeof(line), "%s: %.2f s wall, %.2f thread-seconds in the phases below\n", title.c_str(),
                wall_seconds, total);
  out += line;
  std::snprintf(line, sizeof(line), "  %-26s %8s %11s %11s %6s %9s\n", "phase", "calls", "inclusive s", "exclusive s",
                "share", "MB");
  out += line;
  for (int i = 0; i < static_cast<int>(Phase::kCount); ++i) {
    const Slot& s = slots_[i];
    if (s.calls.load() == 0) continue;
    const double ex = s.exclusive.load() * 1e-9;
    std::snprintf(line, sizeof(line), "  %-26s %8lld %11.3f %11.3f %5.0f%% %9.0f\n", PhaseName(static_cast<Phase>(i)),
                  static_cast<long long>(s.calls.load()), s.inclusive.load() * 1e-9, ex,
                  total > 0 ? 100.0 * ex / total : 0.0, s.bytes.load() / 1e6);
    out += line;
  }
  return out;
}

PhaseTimes* PhaseTimes::Current() { return current_times; }

PhaseScope::PhaseScope(PhaseTimes* times) : previous_(current_times), previous_timer_(current_timer) {
  // Binding the PhaseTimes already bound keeps the timers open on this thread
  // (a thread that runs units itself nests them in its own wait).
  if (times != current_times) current_timer = nullptr;
  current_times = times;
}

PhaseScope::~PhaseScope() {
  current_times = previous_;
  current_timer = static_cast<PhaseTimer*>(previous_timer_);
}

PhaseTimer::PhaseTimer(Phase phase, int64_t bytes) : times_(current_times), phase_(phase), bytes_(bytes) {
  if (times_ == nullptr) return;
  start_ = NowNs();
  parent_ = current_timer;
  current_timer = this;
}

PhaseTimer::~PhaseTimer() {
  if (times_ == nullptr) return;
  const int64_t inclusive = NowNs() - start_;
  times_->Add(phase_, inclusive, inclusive - nested_, bytes_);
  if (parent_ != nullptr) parent_->nested_ += inclusive;
  current_timer = parent_;
}

}  // namespace ucp
