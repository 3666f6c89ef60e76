// The zip container of torch.save files: a reader over bytes in memory (a
// mapping) and a streaming writer that reproduces, byte for byte, what torch
// 1.13's PyTorchStreamWriter (miniz 2.0.8 with MZ_ZIP_FLAG_WRITE_ZIP64)
// writes for the same records.
//
// Layout torch writes (and ZipWriter reproduces), per record, in order:
//   local header   PK\3\4, version needed 0, flags 0x0808 (data descriptor +
//                  UTF-8; 0x0800 for an empty record), method 0 (stored),
//                  DOS time/date 0 (shown as 1980-00-00), CRC and sizes 0;
//                  extra fields: zip64 (0x0001) when the size or the header
//                  offset is >= 0xFFFFFFFF (uncompressed size, compressed
//                  size left 0 as miniz does, header offset: each only when
//                  needed), then `FB` + LE16 n + n bytes 'Z' so that the data
//                  starts at a multiple of 64
//   data           stored bytes
//   descriptor     PK\7\8, CRC, compressed and uncompressed size (32-bit, or
//                  64-bit when the local header has a zip64 field); none for
//                  an empty record
// then the central directory (version made by 0, no `FB` field, a zip64
// field only where needed), and always a zip64 end-of-central-directory
// record (made by 0x031E, needed 0x002D) + locator + the classic record.
//
// ZipReader accepts any stored (method 0) zip, validates the structure up
// front and verifies CRCs eagerly or per record on demand. Errors:
//   kDataLoss         truncation, a bad signature, inconsistent sizes or
//                     offsets, overlapping records, a CRC mismatch
//   kInvalidArgument  a duplicate record name, compression, encryption,
//                     multi-disk archives
//   kNotFound         Get()/Read() of a record that is not there
//   kResourceExhausted more records than ZipReadOptions::max_records
// Messages start with the archive name and name the record.
//
// Example:
//   UCP_ASSIGN_OR_RETURN(ZipReader zip, ZipReader::Open(file->bytes(), path));
//   UCP_ASSIGN_OR_RETURN(absl::Span<const uint8_t> pkl, zip.Read("archive/data.pkl"));
//
//   FdSink sink(fd, path);
//   ZipWriter w(&sink, path);
//   UCP_RETURN_IF_ERROR(w.BeginRecord("archive/data/0", nbytes));
//   ... UCP_RETURN_IF_ERROR(w.WriteData(chunk)); ...
//   UCP_RETURN_IF_ERROR(w.EndRecord());
//   UCP_RETURN_IF_ERROR(w.Finish());
#ifndef UCP_FORMAT_TORCH_ZIP_H_
#define UCP_FORMAT_TORCH_ZIP_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "format/torch/read_coverage.h"

namespace ucp::torch {

// ZipRecord: one member, as the central directory (checked against the local
// header) describes it.
struct ZipRecord {
  std::string name;
  uint64_t header_offset = 0;  // local header
  uint64_t data_offset = 0;    // first stored byte
  uint64_t size = 0;           // stored == uncompressed size
  uint32_t crc32 = 0;
  uint16_t flags = 0;
};

struct ZipReadOptions {
  // kOnOpen verifies every record's CRC in Open (reads all data once);
  // kLazy verifies only when VerifyCrc/Read is called for that record.
  enum class Crc { kOnOpen, kLazy };
  Crc crc = Crc::kOnOpen;
  // Most records accepted (bounds memory on hostile central directories).
  size_t max_records = size_t{1} << 22;
  // Called after each verified piece of a record, with its archive offset and
  // length (e.g. to give memory-mapped pages back as verification streams).
  std::function<void(uint64_t offset, uint64_t len)> on_verified;
  // Keeps the archive's bytes alive (e.g. its mapping): with it, a CRC check
  // may run after the reader is gone (DeferredCrcChecks).
  std::shared_ptr<const void> keep_alive;
};

// DeferredCrcChecks: lets the CRC checks of large records run on a
// background thread while the thread that asked goes on, so that a
// conversion reads and writes at once instead of reading every input record
// whole before its first write.
//
// While a thread holds a Scope, ZipReader::VerifyCrc of a record of
// kDeferMinBytes or more (of a reader opened with a keep_alive) queues the
// check and returns OK at once: the caller reads the bytes before they are
// known to be right. Wait() returns when every queued check has run: the
// first mismatch (kDataLoss, the message VerifyCrc gives) or OK. Whoever
// defers must call Wait() and act on nothing read under the scope (commit
// nothing) until it returns OK. Small records (data.pkl, version) are
// always checked at once, before they are parsed.
//
// A record the caller goes on to read (VerifyCrc's `reading`) is not queued
// but tracked (ReadCoverage): the readers report the CRC-32 of the ranges
// they read (the zip writer computes it for its own records anyway), and
// Wait() reads only what nobody read, on up to `wait_threads` threads. The
// record is read once instead of twice: once by the units, not also by the
// check.
//
// Example:
//   DeferredCrcChecks checks;
//   { DeferredCrcChecks::Scope scope(&checks); ... read and write ... }
//   UCP_RETURN_IF_ERROR(checks.Wait());  // before committing anything
class DeferredCrcChecks {
 public:
  static constexpr uint64_t kDeferMinBytes = uint64_t{1} << 20;
  explicit DeferredCrcChecks(int wait_threads = 1);
  ~DeferredCrcChecks();  // waits for the queued checks
  DeferredCrcChecks(const DeferredCrcChecks&) = delete;
  DeferredCrcChecks& operator=(const DeferredCrcChecks&) = delete;

  // Every queued check run, and every tracked record checked. Call it once
  // no thread reads under the scope any more.
  absl::Status Wait();
  // Queues a check (run in queue order on one background thread).
  void Add(std::function<absl::Status()> check);
  // The records checked from the bytes read (VerifyCrc's `reading`).
  ReadCoverage& coverage();

  // Several processes split the units (ranks): each reads part of each
  // record. With PoolReads, every record a unit reads is tracked (PoolsReads
  // tells the readers to ask for it), and Wait() checks none of those in a
  // mapped file: it hands over what was read of them (TakePooledReads) for
  // one process to join with the others' (CheckPooledReads) before anything
  // is committed.
  void PoolReads();
  static bool PoolsReads();  // of the calling thread's checks
  std::vector<RecordReads> TakePooledReads();
  // The checks of the calling thread, or null.
  static DeferredCrcChecks* Current();

  class Scope {
   public:
    explicit Scope(DeferredCrcChecks* checks);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    DeferredCrcChecks* previous_;
    ReadCoverage::Scope coverage_;
  };

 private:
  struct State;
  std::shared_ptr<State> state_;
};

class ZipReader {
 public:
  // `archive` must outlive the reader; `name` is used in messages.
  static absl::StatusOr<ZipReader> Open(absl::Span<const uint8_t> archive, std::string name,
                                        const ZipReadOptions& options = {});
  ZipReader(ZipReader&&) = default;
  ZipReader& operator=(ZipReader&&) = default;

  const std::string& name() const { return name_; }
  // Central directory order.
  const std::vector<ZipRecord>& records() const { return records_; }
  // nullptr when absent.
  const ZipRecord* Find(std::string_view record_name) const;
  // kNotFound when absent.
  absl::StatusOr<const ZipRecord*> Get(std::string_view record_name) const;
  // The stored bytes of a record (no CRC check).
  absl::Span<const uint8_t> Data(const ZipRecord& record) const {
    return archive_.subspan(record.data_offset, record.size);
  }
  // The stored bytes of a named record, CRC-verified (once) in lazy mode.
  absl::StatusOr<absl::Span<const uint8_t>> Read(std::string_view record_name) const;
  // kDataLoss on a mismatch. Remembers success, so a record is hashed once.
  // `reading`: the caller goes on to read most of the record's bytes; under
  // a DeferredCrcChecks scope the check is then made from the bytes read
  // (DeferredCrcChecks: fused checks) rather than queued.
  absl::Status VerifyCrc(const ZipRecord& record, bool reading = false) const;
  absl::Status VerifyAllCrcs() const;
  // Where the central directory starts (records lie before it).
  uint64_t central_directory_offset() const { return cd_offset_; }

 private:
  ZipReader() = default;
  absl::Status Parse(const ZipReadOptions& options);
  size_t IndexOf(const ZipRecord& record) const { return static_cast<size_t>(&record - records_.data()); }

  absl::Span<const uint8_t> archive_;
  std::string name_;
  std::vector<ZipRecord> records_;
  absl::flat_hash_map<std::string, size_t> by_name_;
  uint64_t cd_offset_ = 0;
  // Per record: 0 unchecked, 1 once its CRC matched, 2 while a deferred
  // check is queued (DeferredCrcChecks), 3 when that check failed. Shared so
  // that the reader stays movable and a deferred check can record its result.
  std::shared_ptr<std::atomic<uint8_t>[]> crc_ok_;
  std::function<void(uint64_t, uint64_t)> on_verified_;
  std::shared_ptr<const void> keep_alive_;
};

// ZipSink: where a ZipWriter's bytes go, in order.
class ZipSink {
 public:
  virtual ~ZipSink() = default;
  virtual absl::Status Write(absl::Span<const uint8_t> bytes) = 0;
  // Pushes buffered bytes to the destination.
  virtual absl::Status Flush() { return absl::OkStatus(); }
  // Moves past `n` bytes that someone else writes (positional sinks only).
  virtual absl::Status Skip(uint64_t n) {
    return absl::UnimplementedError("this zip sink cannot skip over data written elsewhere");
  }
};

// CountingSink: counts bytes and writes nothing (to lay an archive out).
class CountingSink : public ZipSink {
 public:
  absl::Status Write(absl::Span<const uint8_t> bytes) override {
    count_ += bytes.size();
    return absl::OkStatus();
  }
  absl::Status Skip(uint64_t n) override {
    count_ += n;
    return absl::OkStatus();
  }
  uint64_t count() const { return count_; }

 private:
  uint64_t count_ = 0;
};

// FdSink: writes to a file descriptor it does not own, coalescing small
// writes in a buffer; writes of a quarter of the buffer or more go straight
// through (after what is buffered).
// Every kWritebackBytes written to a file, FdSink starts writing them back to
// disk (StartWriteback), so that a large file is on its way to disk while it
// is being written rather than all of it dirty in the page cache when the
// fsync before the commit comes.
class FdSink : public ZipSink {
 public:
  // `writeback`: start the writeback every kWritebackBytes (StartWriteback).
  FdSink(int fd, std::string path_for_messages, size_t buffer_size = size_t{1} << 20, bool writeback = true);
  absl::Status Write(absl::Span<const uint8_t> bytes) override;
  absl::Status Flush() override;
  // Seeks forward over bytes written with pwrite at their own offsets.
  absl::Status Skip(uint64_t n) override;

 private:
  absl::Status WriteAll(const uint8_t* p, size_t n);
  int fd_;
  std::string path_;
  // Allocated at the first buffered write, never zeroed (a file written in
  // large pieces only, the common case for tensor data, needs none).
  std::unique_ptr<uint8_t[]> buffer_;
  size_t capacity_;
  size_t used_ = 0;
  uint64_t pos_ = 0;          // file offset of the next byte
  uint64_t written_back_ = 0; // bytes before it whose writeback was started
  bool writeback_ = true;
};

inline constexpr uint64_t kWritebackBytes = uint64_t{32} << 20;
// Writers start the writeback of every kWritebackBytes they write
// (ucp::StartWriteback, base/flusher.h: through the unit's background
// flusher) only when their output is fsynced (TorchWriteOptions::writeback,
// FdSink's `writeback`): without --fsync the bytes may stay in the page
// cache, as cp's do.

// StringSink: appends to a string (tests, small archives).
class StringSink : public ZipSink {
 public:
  explicit StringSink(std::string* out) : out_(out) {}
  absl::Status Write(absl::Span<const uint8_t> bytes) override {
    out_->append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    return absl::OkStatus();
  }

 private:
  std::string* out_;
};

struct ZipWriterOptions {
  // Record sizes (resp. header and central directory offsets) at or above
  // these get zip64 fields and 0xFFFFFFFF in the 32-bit fields. miniz's
  // value; lower them only to test the zip64 paths with small archives
  // (miniz, hence torch.load, rejects saturated offsets in archives smaller
  // than 4 GiB, so only the size threshold keeps files torch-loadable).
  uint64_t zip64_size_threshold = 0xFFFFFFFF;
  uint64_t zip64_offset_threshold = 0xFFFFFFFF;
};

class ZipWriter {
 public:
  // `sink` must outlive the writer; `name` is used in messages.
  ZipWriter(ZipSink* sink, std::string name, ZipWriterOptions options = {});

  // Starts a record of exactly `size` bytes (torch decides alignment padding
  // and zip64 fields from the size, so it must be known up front).
  // kInvalidArgument for a duplicate or invalid name, kFailedPrecondition
  // when a record is open or the archive is finished.
  absl::Status BeginRecord(std::string_view record_name, uint64_t size);
  // Appends to the open record; CRC computed on the fly.
  absl::Status WriteData(absl::Span<const uint8_t> chunk);
  // The whole data of the open record was written straight to the
  // destination at its place (see bytes_written() after BeginRecord); here is
  // its CRC-32. The sink skips over it.
  absl::Status SkipData(uint32_t crc);
  // kFailedPrecondition unless exactly `size` bytes were written.
  absl::Status EndRecord();
  // BeginRecord + WriteData + EndRecord.
  absl::Status AddRecord(std::string_view record_name, absl::Span<const uint8_t> data);
  absl::Status AddRecord(std::string_view record_name, std::string_view data) {
    return AddRecord(record_name, absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(data.data()), data.size()));
  }
  // Writes the central directory and end records, then flushes the sink.
  absl::Status Finish();

  uint64_t bytes_written() const { return offset_; }

 private:
  struct Entry {
    std::string name;
    uint64_t header_offset;
    uint64_t size;
    uint32_t crc32;
  };
  absl::Status Emit(absl::Span<const uint8_t> bytes);
  absl::Status Fail(absl::Status status);
  bool Zip64Size(uint64_t v) const { return v >= options_.zip64_size_threshold; }
  bool Zip64Offset(uint64_t v) const { return v >= options_.zip64_offset_threshold; }

  ZipSink* sink_;
  std::string name_;
  ZipWriterOptions options_;
  absl::Status status_;  // first failure, sticky
  uint64_t offset_ = 0;
  std::vector<Entry> entries_;
  absl::flat_hash_set<std::string> names_;
  bool in_record_ = false;
  bool finished_ = false;
  uint64_t record_written_ = 0;
  uint32_t record_crc_ = 0;
};

}  // namespace ucp::torch

#endif  // UCP_FORMAT_TORCH_ZIP_H_
