// ReadAhead: asks the kernel for the input bytes of the units a job will run
// next, while the current ones run, so that a unit finds its bytes in the
// page cache instead of waiting on each of its reads in turn.
//
// Cold, a unit's reads are a series of 1 MiB preads of slices of large
// input records (tp/tensor_plan.h), each waiting for the disk; between them
// the unit computes and writes, and the disk has nothing to do. Here one
// thread walks the units in the order they run and asks for each one's input
// extents (state::CheckpointState::ExtentOf) with posix_fadvise(WILLNEED),
// in steps of 8 MiB, with at most `budget` bytes asked for units that have
// not ended: the disk is kept busy with large requests, and the page cache
// holds at most `budget` bytes read ahead for units still to come.
// Measured on a checkpoint real DeepSpeed wrote: README "Performance".
//
// A hint: it reads nothing into this process (no RSS), never changes what
// a unit reads or checks, and ignores every failure (a file that cannot be
// opened, an extent the state cannot tell).
//
// Example:
//   ReadAhead ahead(units, order, [&](const InputRange& r) { return state.ExtentOf(r); }, 256 << 20);
//   ParallelFor(order.size(), threads, [&](size_t k) {
//     absl::Status s = Run(order[k]);
//     ahead.Finished(k);
//     return s;
//   });
#ifndef UCP_WRITERS_READ_AHEAD_H_
#define UCP_WRITERS_READ_AHEAD_H_

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "state/model_state.h"

namespace ucp::writers {

struct Unit;  // writers/plan.h

class ReadAhead {
 public:
  // Where an input range's bytes lie (nullopt: unknown, skipped).
  using ExtentFn = std::function<std::optional<state::FileExtent>(const state::InputRange&)>;
  // Asks for bytes [offset, offset + length) of `path` (length > 0, at most
  // kStepBytes). The default (null): KernelRequests(); tests record the
  // calls instead.
  using RequestFn = std::function<void(const std::string& path, int64_t offset, int64_t length)>;
  static constexpr int64_t kStepBytes = int64_t{8} << 20;
  // The default RequestFn: posix_fadvise(POSIX_FADV_WILLNEED) through at
  // most kOpenFiles descriptors kept open (the least recently used closed
  // first, so that a checkpoint of thousands of files never takes the
  // units' own descriptors), closed with the last copy of the function.
  static constexpr size_t kOpenFiles = 16;
  static RequestFn KernelRequests();

  // `order`: the indices of `units` in the order they start. Nothing is
  // asked for when budget <= 0, order is empty or extent is null. The
  // vectors must outlive this object.
  ReadAhead(const std::vector<Unit>& units, const std::vector<size_t>& order, ExtentFn extent, int64_t budget,
            RequestFn request = nullptr);
  // Stops asking (a request under way ends first) and joins the thread.
  ~ReadAhead();
  ReadAhead(const ReadAhead&) = delete;
  ReadAhead& operator=(const ReadAhead&) = delete;

  // The unit at position k of `order` has ended (with or without an
  // error): what was asked for it no longer counts against the budget, and
  // if it was not reached yet, nothing will be asked for it.
  void Finished(size_t k);

 private:
  void Run();
  // Waits until the bytes asked for units not ended leave room for more;
  // false once stopped or when the unit at position p has ended.
  bool WaitForRoom(size_t p);

  const std::vector<Unit>& units_;
  const std::vector<size_t>& order_;
  const ExtentFn extent_;
  const int64_t budget_;
  RequestFn request_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;            // under mu_
  std::vector<int64_t> asked_;   // under mu_: bytes asked for, per position
  std::vector<bool> ended_;      // under mu_: per position
  int64_t outstanding_ = 0;      // under mu_: asked_ of the positions not ended
  std::thread thread_;
};

}  // namespace ucp::writers

#endif  // UCP_WRITERS_READ_AHEAD_H_
