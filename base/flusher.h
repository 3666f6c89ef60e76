// BackgroundFlusher: makes a job's output durable in steps while the job
// still runs, on threads of its own.
//
// A durable write ends with a flush of the disk's write cache (on a VM, the
// host writing its cache of the virtual disk to its own disk). Its cost grows
// with the bytes the cache holds: measured on a 2-core VM here, an fdatasync
// after the writeback of 64 MB took 0.03 s, of 512 MB 0.21 s, of 2 GB 0.78 s.
// Made once at the commit, the whole flush is paid after the last byte is
// written; made every `every_bytes` here, it overlaps the job's own work, and
// the commit's sync finds little left.
//
// Two threads: one starts the writeback of what the job reports written
// (sync_file_range SYNC_FILE_RANGE_WRITE, which blocks while the device's
// queue is full: off the threads that compute the output, that costs them
// nothing), the other flushes once `every_bytes` more were written back.
// Each flush is an fdatasync(2) of the newest file: on ext4 (ordered data),
// xfs and btrfs it writes that file's data, commits the journal and flushes
// the device cache, which makes every write completed before it durable too.
//
// A hint for speed, not the commit's guarantee (StagingDir::Commit still
// syncs everything), but not a silent one: a flush that fails, or a reported
// file that cannot be opened, is the job's error (Finish), since the error
// the fdatasync consumed might not be reported to the commit's sync again.
//
// Writers report through StartWriteback, which goes to the flusher bound to
// the calling thread (FlusherScope), or straight to sync_file_range.
//
// Example:
//   BackgroundFlusher flusher(int64_t{256} << 20);
//   { FlusherScope bound(&flusher); ... write files, calling StartWriteback ... }
//   flusher.Written(path, size);             // a whole file
//   UCP_RETURN_IF_ERROR(flusher.Finish());   // before the commit
#ifndef UCP_BASE_FLUSHER_H_
#define UCP_BASE_FLUSHER_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"

namespace ucp {

class BackgroundFlusher {
 public:
  // every_bytes <= 0: no threads; Written and WrittenRange do nothing.
  explicit BackgroundFlusher(int64_t every_bytes);
  BackgroundFlusher(const BackgroundFlusher&) = delete;
  BackgroundFlusher& operator=(const BackgroundFlusher&) = delete;
  ~BackgroundFlusher();  // Finish

  // A file of `bytes` was written whole: its writeback is started, and its
  // bytes count towards the next flush (less those reported by WrittenRange
  // while it was written: each byte counts once).
  void Written(const std::string& path, int64_t bytes);
  // Bytes [offset, offset + len) of the open file `fd` (named `path`, for
  // messages) were written: a large file, while it is being written. The
  // descriptor is duplicated.
  void WrittenRange(int fd, const std::string& path, uint64_t offset, uint64_t len);
  // Starts the writeback of every range reported before it (a writeback row
  // of --timings then counts every byte written), waits for the current
  // flush (no new one is started: the commit's sync covers what is left),
  // and returns the first error of any flush.
  absl::Status Finish();
  // Flushes done so far, and bytes whose writeback the thread started (or
  // tried to: a file it could not open counts) (tests).
  int flushes() const;
  int64_t handled_bytes() const;

  // The flusher bound to the calling thread (FlusherScope), or null.
  static BackgroundFlusher* Current();

 private:
  struct Item {
    int fd = -1;       // owned (a dup), or -1: open `path`
    std::string path;
    uint64_t offset = 0, len = 0;  // len 0: the whole file
    int64_t bytes = 0;
  };
  void Push(Item item);
  void RunWriteback();
  void RunFlush();
  const int64_t every_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;     // guarded by mu_
  int flush_fd_ = -1;          // the file to flush next (owned), or -1; guarded by mu_
  std::string flush_path_;     // its name, for messages; guarded by mu_
  bool stop_ = false;          // guarded by mu_
  int flushes_ = 0;            // guarded by mu_
  int64_t handled_ = 0;        // guarded by mu_
  // Bytes reported by WrittenRange per file not yet reported whole (Written).
  std::map<std::string, int64_t> ranged_;  // guarded by mu_
  absl::Status error_;         // guarded by mu_
  std::thread writeback_thread_, flush_thread_;
};

// Binds a flusher (may be null) to the calling thread for its lifetime.
class FlusherScope {
 public:
  explicit FlusherScope(BackgroundFlusher* flusher);
  ~FlusherScope();
  FlusherScope(const FlusherScope&) = delete;
  FlusherScope& operator=(const FlusherScope&) = delete;

 private:
  BackgroundFlusher* previous_;
};

// Starts writing bytes [offset, offset + len) of `fd` back to disk: through
// the calling thread's flusher when one is bound, else sync_file_range here.
// A hint: failures are ignored (the commit's sync reports them).
void StartWriteback(int fd, const std::string& path, uint64_t offset, uint64_t len);

// The mutex a thread holds while it writes (pwrite) into the file at `path`
// (striped by the path's hash): buffered writes to one file take its inode
// lock for writing (ext4, xfs), and threads filling pieces of one file at once
// otherwise spin on that lock in the kernel (measured: 12% of a reshard's
// samples in rwsem_spin_on_owner, 14% of an export's). Taking turns here,
// they sleep instead while the others compute their next piece.
std::mutex& FileWriteTurn(const std::string& path);

}  // namespace ucp

#endif  // UCP_BASE_FLUSHER_H_
