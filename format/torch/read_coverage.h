// ReadCoverage: checks the CRC-32 of an input record from the bytes the
// units read of it, instead of reading the record once more for the check.
//
// A conversion reads most of a large input record (a flat optimizer
// partition) anyway, and often computes the CRC-32 of what it read (the zip
// writer does, for its output records). A record that is Track()ed gets the
// CRC of every range read of it (NoteRead, NoteCopy: a lookup by address,
// nothing when the bytes belong to no tracked record); Check() then reads
// only the ranges nobody read, joins the pieces' CRCs in order
// (Crc32Combine) and compares with the stored CRC. The bytes checked are the
// bytes used: a piece's CRC is of the bytes as the unit read or copied them.
//
// The ranges of one record may come from several threads, in any order and
// overlapping; pieces that join end to end are merged as they come.
//
// Example:
//   ReadCoverage coverage;
//   coverage.Track(record_bytes, [](uint32_t crc, uint64_t gap_bytes) {...});
//   { ReadCoverage::Scope scope(&coverage); ... units read and write ... }
//   UCP_RETURN_IF_ERROR(coverage.CheckAll(threads));
#ifndef UCP_FORMAT_TORCH_READ_COVERAGE_H_
#define UCP_FORMAT_TORCH_READ_COVERAGE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <shared_mutex>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace ucp::torch {

class ReadCoverage {
 public:
  // Given the CRC-32 of the whole record (pieces read and gaps joined),
  // says whether it is the stored one (and marks the record checked).
  using Verdict = std::function<absl::Status(uint32_t crc)>;
  // Reads `bytes` (a gap: bytes of the record nobody read) and returns
  // their CRC-32; given the record's offset of the gap.
  using GapCrc = std::function<uint32_t(absl::Span<const uint8_t> bytes, uint64_t offset)>;

  ReadCoverage();
  ~ReadCoverage();
  ReadCoverage(const ReadCoverage&) = delete;
  ReadCoverage& operator=(const ReadCoverage&) = delete;

  // Tracks the record whose bytes are `bytes` (memory that stays mapped
  // until CheckAll returns; records must not overlap).
  void Track(absl::Span<const uint8_t> bytes, GapCrc gap_crc, Verdict verdict);

  // Checks every tracked record (on up to `threads` threads) and forgets
  // them: the first error, or OK. No NoteRead may run meanwhile.
  absl::Status CheckAll(int threads);

  // Bytes covered by pieces and bytes read as gaps, over the records
  // checked so far (for tests and --timings).
  uint64_t covered_bytes() const { return covered_; }
  uint64_t gap_bytes() const { return gaps_; }

  // `n` bytes at `p` were read, and their CRC-32 is `crc`: a piece of a
  // tracked record if they lie within one (of the calling thread's
  // coverage, Scope), else nothing.
  static void NoteRead(const uint8_t* p, size_t n, uint32_t crc);
  // `n` bytes at `src` were copied to `copy`: the CRC-32 of the copy (only
  // when `src` lies within a tracked record) is a piece of that record.
  static void NoteCopy(const uint8_t* src, const uint8_t* copy, size_t n);
  // Whether the calling thread's coverage tracks the record holding [p, p+n).
  static bool Tracks(const uint8_t* p, size_t n);

  static ReadCoverage* Current();
  class Scope {
   public:
    explicit Scope(ReadCoverage* coverage);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    ReadCoverage* previous_;
  };

 private:
  struct Record;
  Record* Find(const uint8_t* p, size_t n) const;

  mutable std::shared_mutex mu_;
  std::map<const uint8_t*, std::unique_ptr<Record>> records_;  // by first byte; guarded by mu_
  uint64_t covered_ = 0;
  uint64_t gaps_ = 0;
};

}  // namespace ucp::torch

#endif  // UCP_FORMAT_TORCH_READ_COVERAGE_H_
