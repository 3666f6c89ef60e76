// Where a command's time goes, by phase (`--timings`; bench/run_bench.sh
// prints it per operation): open and plan, the units' reading and merging,
// input CRC checks, output CRC, digest, write, writeback, fsync, commit, and
// (MPI jobs) the waits for the other ranks.
//
// A PhaseTimes is bound to a thread by a PhaseScope (the command binds it on
// its own thread; ExecuteUnits and the deferred CRC checks bind the creator's
// on the threads they start), and a PhaseTimer adds the time of its scope to
// the bound PhaseTimes: inclusive (the scope's wall time) and exclusive
// (minus the PhaseTimers nested inside it on the same thread), so that the
// exclusive times of one thread add up to its whole time. Unbound (no
// --timings), a PhaseTimer costs one thread-local load.
#ifndef UCP_BASE_PHASES_H_
#define UCP_BASE_PHASES_H_

#include <atomic>
#include <cstdint>
#include <string>

namespace ucp {

enum class Phase {
  kOpen,       // opening the source, parsing its files, resolving rules, planning
  kUnits,      // the units' run (ExecuteUnits, on the calling thread: waiting for them)
  kMerge,      // a unit: reading its inputs, merging, encoding (what no nested phase counts)
  kInputCrc,   // the CRC-32 of input bytes read anyway (copied or written), for their record's check
  kInputReread,  // reading input bytes again only to check their record's CRC-32 (what no unit read)
  kOutputCrc,  // computing the CRC-32 of output records (zip)
  kDigest,     // the output files' digests (manifest)
  kWrite,      // write / pwrite system calls
  kWriteback,  // starting the writeback of written files (sync_file_range)
  kFlush,      // flushing written output to disk while the units run (BackgroundFlusher)
  kFsync,      // fsync of the output before the commit
  kCommit,     // completing the output (its manifest, written and fsynced), renaming it into place
  kRanks,      // waiting for the other ranks of an MPI job (broadcast, gather)
  kCount
};

const char* PhaseName(Phase p);

class PhaseTimes {
 public:
  PhaseTimes() = default;
  PhaseTimes(const PhaseTimes&) = delete;
  PhaseTimes& operator=(const PhaseTimes&) = delete;

  void Add(Phase p, int64_t inclusive_ns, int64_t exclusive_ns, int64_t bytes);
  int64_t calls(Phase p) const { return slot(p).calls.load(); }
  int64_t inclusive_ns(Phase p) const { return slot(p).inclusive.load(); }
  int64_t exclusive_ns(Phase p) const { return slot(p).exclusive.load(); }
  int64_t bytes(Phase p) const { return slot(p).bytes.load(); }

  // A table: per phase its calls, seconds (inclusive, summed over threads),
  // exclusive thread-seconds, share of all exclusive time, and MB.
  std::string Report(const std::string& title, double wall_seconds) const;

  // The PhaseTimes bound to the calling thread, or null.
  static PhaseTimes* Current();

 private:
  struct Slot {
    std::atomic<int64_t> calls{0}, inclusive{0}, exclusive{0}, bytes{0};
  };
  const Slot& slot(Phase p) const { return slots_[static_cast<int>(p)]; }
  Slot slots_[static_cast<int>(Phase::kCount)];
};

// Binds `times` (may be null: unbinds) to the calling thread for its lifetime.
class PhaseScope {
 public:
  explicit PhaseScope(PhaseTimes* times);
  ~PhaseScope();
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  PhaseTimes* previous_;
  void* previous_timer_;
};

// Times its scope under `phase` into the calling thread's PhaseTimes.
class PhaseTimer {
 public:
  explicit PhaseTimer(Phase phase, int64_t bytes = 0);
  ~PhaseTimer();
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;
  // The bytes to count, when known only at the end (e.g. an attempt that may
  // hand its bytes to another timed path).
  void set_bytes(int64_t bytes) { bytes_ = bytes; }

 private:
  PhaseTimes* times_;
  Phase phase_;
  int64_t bytes_ = 0;
  int64_t start_ = 0;
  int64_t nested_ = 0;  // inclusive time of the timers nested in this one
  PhaseTimer* parent_ = nullptr;
};

}  // namespace ucp

#endif  // UCP_BASE_PHASES_H_
