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
// overlapping; pieces that join end to end are merged as they come. They may
// also come from several processes (ranks that split the units): each takes
// its ranges (TakeReads), one joins them all (CheckPooledReads) and reads
// the rest from the file.
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
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace ucp::torch {

// The CRC-32 of bytes [offset, offset + length) of a record.
struct ReadPiece {
  uint64_t offset;
  uint64_t length;
  uint32_t crc;
};

// What one process read of one record, for another to join.
struct RecordReads {
  std::string archive;  // as messages name it (a file, or a torch file inside one)
  std::string record;   // the zip record
  std::string path;     // the file holding it
  uint64_t file_offset = 0;  // of its first byte in `path`
  uint64_t size = 0;
  uint32_t stored_crc = 0;
  std::vector<ReadPiece> pieces;
};

// Joins the ranges several processes read of each record (the same record:
// the same path and offset), reads what none of them read from the file, on
// up to `threads` threads, and compares with the stored CRC-32: OK, or
// kDataLoss "ARCHIVE: record 'NAME': CRC-32 mismatch (stored S, computed C)"
// for the first record that differs (every record is checked).
absl::Status CheckPooledReads(const std::vector<RecordReads>& reads, int threads);

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
  // until CheckAll returns; records must not overlap). `archive`, `record`
  // and `stored_crc` describe it for TakeReads.
  void Track(absl::Span<const uint8_t> bytes, GapCrc gap_crc, Verdict verdict, std::string archive = "",
             std::string record = "", uint32_t stored_crc = 0);

  // Hands over what was read of every tracked record whose bytes are those
  // of a mapped file (MappedFile::Locate), for CheckPooledReads, and
  // forgets them; the others are checked here (CheckAll), and `*checked`
  // is that check's result. No NoteRead may run meanwhile.
  std::vector<RecordReads> TakeReads(int threads, absl::Status* checked);

  // Checks every tracked record (on up to `threads` threads (0: all cores)) and forgets
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
