// BackgroundFlusher: makes a job's output durable in steps while the job
// still runs, on a thread of its own.
//
// A durable write ends with a flush of the disk's write cache (on a VM, the
// host writing its cache of the virtual disk to its own disk). Its cost grows
// with the bytes the cache holds: measured on a 2-core VM here, an fdatasync
// after the writeback of 64 MB took 0.03 s, of 512 MB 0.21 s, of 2 GB 0.78 s.
// Made once at the commit, the whole flush is paid after the last byte is
// written; made every `every_bytes` here, it overlaps the job's own work, and
// the commit's sync finds little left.
//
// The thread also starts the writeback of each file reported (sync_file_range
// SYNC_FILE_RANGE_WRITE), which blocks while the device's queue is full: off
// the threads that compute the output, it costs them nothing.
//
// Each flush is an fdatasync(2) of the newest file reported: on ext4 (ordered
// data), xfs and btrfs it writes the file's data, commits the journal and
// flushes the device cache, which makes every write completed before it
// durable too. A hint for speed, not the commit's guarantee (StagingDir::Commit
// still syncs everything), but not a silent one: an fdatasync that fails, or a
// reported file that cannot be opened, is the job's error (Finish), since the
// error it consumed might not be reported to the commit's sync.
//
// Example:
//   BackgroundFlusher flusher(int64_t{256} << 20);
//   ... after each file is written and its writeback started:
//   flusher.Written(path, size);
//   UCP_RETURN_IF_ERROR(flusher.Finish());   // before the commit
#ifndef UCP_BASE_FLUSHER_H_
#define UCP_BASE_FLUSHER_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "absl/status/status.h"

namespace ucp {

class BackgroundFlusher {
 public:
  // every_bytes <= 0: no thread, Written does nothing.
  explicit BackgroundFlusher(int64_t every_bytes);
  BackgroundFlusher(const BackgroundFlusher&) = delete;
  BackgroundFlusher& operator=(const BackgroundFlusher&) = delete;
  ~BackgroundFlusher();  // stops the thread (after its current flush)

  // A file of `bytes` was written whole: its writeback is started, and it
  // counts towards the next flush.
  void Written(const std::string& path, int64_t bytes);
  // Waits for the current writeback or flush (no new one is started: the
  // commit's sync covers what is left) and returns the first error of any
  // flush.
  absl::Status Finish();
  // Flushes done so far (tests, --timings).
  int flushes() const;

 private:
  void Run();
  const int64_t every_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::string, int64_t>> queue_;  // files to write back; guarded by mu_
  bool stop_ = false;       // guarded by mu_
  int flushes_ = 0;         // guarded by mu_
  absl::Status error_;      // guarded by mu_
  std::thread thread_;
};

}  // namespace ucp

#endif  // UCP_BASE_FLUSHER_H_
