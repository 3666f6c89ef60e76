// Reading and writing `torch.save` files (the zip container, see zip.h).
//
// Layout (torch >= 1.6, as ../shared/docs/FORMAT.md describes): a stored
// (uncompressed) zip whose members are `<stem>/data.pkl` (pickle protocol 2),
// `<stem>/data/<key>` (raw little-endian storage bytes) and `<stem>/version`;
// newer torch adds `<stem>/byteorder` and `<stem>/.data/serialization_id`.
// A tensor is `torch._utils._rebuild_tensor_v2(storage, offset, size, stride,
// requires_grad, backward_hooks)` whose storage is a BINPERSID of
// `('storage', torch.<T>Storage, key, location, numel)`.
//
// TorchFile::Open memory-maps the file and validates everything up front:
// the archive, the pickle, every persistent id (known storage class, a record
// of numel * itemsize bytes, or up to itemsize - 1 more: torch writes the
// whole untyped storage and pickles numel = nbytes / itemsize, so a storage
// whose byte size is not a multiple of its element size leaves a partial
// element that torch.load ignores; the Storage keeps those bytes so that a
// rewrite reproduces the file) and every tensor view (inside its storage,
// checked arithmetic). Tensors are then zero-copy views into the mapping.
//
// TorchWriter builds a file the way torch 1.13 writes one (record order,
// 64-byte aligned data, data descriptors, zip64 when needed), with storages
// deduplicated by identity so views keep sharing, and storage bytes streamed
// from a producer so a writer never holds a whole large tensor.
//
// Example:
//   UCP_ASSIGN_OR_RETURN(auto file, TorchFile::Open(path));
//   const pickle::Value* sd = file->root()->DictGet("optimizer_state_dict");
//   UCP_ASSIGN_OR_RETURN(Tensor t, file->GetTensor(*some_value));
//
//   TorchWriter w;
//   auto d = pickle::Value::MakeDict();
//   d->DictSet(pickle::Value::Str("param"), w.AddTensor(tensor));
//   UCP_RETURN_IF_ERROR(w.WriteFile("/tmp/x/fp32.pt", *d));
#ifndef UCP_FORMAT_TORCH_TORCH_FILE_H_
#define UCP_FORMAT_TORCH_TORCH_FILE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "base/digest.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "format/pickle/reader.h"
#include "format/pickle/value.h"
#include "format/torch/tensor.h"

namespace ucp::torch {

class MappedFile;

struct OpenOptions {
  pickle::ReadOptions pickle;
  // Largest data.pkl accepted.
  size_t max_pickle_bytes = size_t{1} << 31;
  // Verify the CRC-32 of every record in Open (reads all storage bytes once,
  // ~10 GB/s when cached). When false only data.pkl and version are
  // verified; call VerifyAllCrcs() (or rely on later reads) for the rest.
  bool verify_crc = true;
  // With verify_crc: when this thread has an OwedCrcChecks (a command that
  // checks before it commits), leave the records' checks to it instead of
  // making them in Open (data.pkl and version are still checked here).
  // Without one, Open checks them as verify_crc says: nothing goes unchecked.
  bool defer_crc = false;
  // Refuse (kFailedPrecondition) a file whose pickle names a code-execution
  // global (pickle/unsafe.h). `ucp inspect` turns it off to report such
  // files instead; --allow_unsafe_pickle turns it off for a command's
  // source (its readers' options, e.g. deepspeed/read_options.h).
  bool refuse_unsafe_globals = true;
};

// The CRC checks that files opened on this thread while it lives (with
// OpenOptions::defer_crc) left undone, which its owner promises to make
// before anything read from those files is committed. A command that writes
// makes them beside its units (writers::ExecuteUnits: the records of 1 MiB
// or more on DeferredCrcChecks' thread, while the units read and write),
// instead of reading a model-states file whole at open, before any unit
// starts; and after a failure, so that a damaged input is the error reported
// rather than what it caused.
//
// Example (ops::RunCheckingInputs, around convert, reshard and export):
//   OwedCrcChecks owed;                          // bound to this thread
//   absl::StatusOr<R> r = OpenPlanAndRun(...);   // opens with defer_crc; writers::
//                                                // ExecuteUnits queues owed.CheckAll()
//   if (!r.ok()) UCP_RETURN_IF_ERROR(owed.CheckAll());  // the damage, not what it caused
class OwedCrcChecks {
 public:
  OwedCrcChecks();
  ~OwedCrcChecks();  // the previous one bound again
  OwedCrcChecks(const OwedCrcChecks&) = delete;
  OwedCrcChecks& operator=(const OwedCrcChecks&) = delete;

  // The checks of this thread's files, or null.
  static OwedCrcChecks* Current();
  // Checks every record not yet checked of every file owing them; under a
  // DeferredCrcChecks scope a record of kDeferMinBytes or more is queued
  // there instead (its Wait reports it). The first error. The files stay
  // mapped while this lives.
  absl::Status CheckAll();
  // Whether CheckAll was called since the last file was added (a dry run
  // that ran no units has not).
  bool checked() const;
  // How many files owe their checks, and their records in all (what a
  // --dry_run plan reports).
  size_t files() const;
  size_t records() const;
  // Whether rank `rank` of a job makes the checks (the other ranks opened
  // the same files): rank 0, which also opened the source first and commits.
  // ops::RunCheckingInputs, writers::RunPlanOnCluster and writers::DescribePlan
  // ask here, so that they agree.
  static bool MadeByRank(int rank) { return rank == 0; }

 private:
  friend class TorchFile;
  void Add(std::function<absl::Status()> check, size_t records);
  mutable std::mutex mu_;
  std::vector<std::function<absl::Status()>> checks_;  // guarded by mu_
  size_t records_ = 0;                                 // guarded by mu_
  bool checked_ = true;                                // guarded by mu_
  OwedCrcChecks* previous_;
};

class TorchFile {
 public:
  // kNotFound for a missing file; kDataLoss / kInvalidArgument for a damaged
  // one. Every message starts with the path.
  static absl::StatusOr<std::unique_ptr<TorchFile>> Open(const std::string& path, const OpenOptions& options = {});
  // The same from bytes in memory (tests, fuzzing); `name` is used in messages.
  static absl::StatusOr<std::unique_ptr<TorchFile>> FromBytes(std::string bytes, const std::string& name,
                                                              const OpenOptions& options = {});
  // An archive stored at bytes [offset, offset + length) of a mapped file
  // (PyTorch Distributed Checkpoint keeps one torch.save archive per item,
  // back to back in a `.distcp` file; every zip offset is relative to the
  // item's start). kOutOfRange when the range is not inside the file.
  // `name` is used in messages; mapped_file() is null (offsets in the
  // mapping are not the archive's).
  static absl::StatusOr<std::unique_ptr<TorchFile>> OpenRange(std::shared_ptr<const MappedFile> file, uint64_t offset,
                                                              uint64_t length, const std::string& name,
                                                              const OpenOptions& options = {});

  const std::string& path() const { return path_; }
  // The archive's record prefix (`<stem>`).
  const std::string& stem() const { return stem_; }
  const pickle::ValuePtr& root() const { return root_; }
  size_t file_size() const;

  // True for a `_rebuild_tensor_v2` (or `_rebuild_parameter` wrapping one) object.
  static bool IsTensor(const pickle::Value& v);
  // The tensor a rebuild object stands for (kInvalidArgument if `v` is not one).
  absl::StatusOr<Tensor> GetTensor(const pickle::Value& v) const;
  // The storage a kPersistentId node of this file's tree refers to
  // (kInvalidArgument for any other value).
  absl::StatusOr<std::shared_ptr<const Storage>> GetStorage(const pickle::Value& pid) const;
  // The record names in archive order (for inspect and tests).
  std::vector<std::string> RecordNames() const;

  // Verifies every record's CRC-32 (each at most once per TorchFile).
  absl::Status VerifyAllCrcs() const;
  // Verifies the CRC-32 of the record behind one storage of this file (for
  // OpenOptions::verify_crc = false: check each storage when it is used).
  // kInvalidArgument for a storage of another file, kDataLoss on mismatch.
  // `reading`: the caller goes on to read most of the storage's bytes
  // (ZipReader::VerifyCrc: under a DeferredCrcChecks scope, checked from the
  // bytes read).
  absl::Status VerifyStorageCrc(const Storage& storage, bool reading = false) const;
  // The mapping behind Open (null for FromBytes), e.g. to Release() pages
  // of storages already consumed.
  const std::shared_ptr<const MappedFile>& mapped_file() const;
  // Storages in record order, each once (shared by the tensors viewing it).
  std::vector<std::shared_ptr<const Storage>> Storages() const;
  // The code-execution globals (pickle/unsafe.h) the pickle names, as
  // "module.name", sorted.
  const std::vector<std::string>& unsafe_globals() const { return unsafe_globals_; }

 private:
  TorchFile() = default;
  std::string path_;
  std::string stem_;
  pickle::ValuePtr root_;
  std::shared_ptr<const void> mapping_;
  std::vector<std::string> unsafe_globals_;
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

// Fills `dst` with the storage bytes [offset, offset + dst.size()); called
// with increasing, adjacent ranges that together cover the whole storage.
using StorageProducer = std::function<absl::Status(uint64_t offset, absl::Span<uint8_t> dst)>;
// The zero-copy form: returns the storage bytes [offset, offset + len),
// either as a view of memory that stays valid until the next call (e.g. a
// memory-mapped source), or after filling `scratch` (len bytes) and returning
// it. Called like a StorageProducer.
using StorageViewer =
    std::function<absl::StatusOr<absl::Span<const uint8_t>>(uint64_t offset, size_t len, uint8_t* scratch)>;

struct TorchWriteOptions {
  // Bytes per WriteData call when streaming storages (also the producer
  // buffer size).
  size_t chunk_bytes = size_t{1} << 20;
  // fdatasync the file before closing it.
  bool sync = false;
  // Start writing the file's bytes back to disk while writing it (every
  // kWritebackBytes, zip.h StartWriteback), so that the fsync before the
  // output's commit has little left to wait for. Off for outputs that are
  // not fsynced (--fsync=false).
  bool writeback = true;
  // See ZipWriterOptions; lower only in tests.
  uint64_t zip64_size_threshold = 0xFFFFFFFF;
  uint64_t zip64_offset_threshold = 0xFFFFFFFF;
  // Digest the file's bytes while writing them (see TorchWriter::digest_hex),
  // so a manifest never needs to read an output back.
  DigestKind digest = DigestKind::kNone;
  // Threads filling the storage records of one file at once (each at its own
  // offset, with pwrite); 1 writes them in order. Not with a digest, which
  // needs the bytes in order.
  int record_threads = 1;
};

// One archive written in pieces, by several threads or processes at once
// (formats/deepspeed_zero/zero_writer.cc cuts a large optimizer file this way so that it
// is not written by one thread of one rank). Everyone builds the same tree
// in a TorchWriter of its own. The archive's storage bytes (the data of its
// storage records, concatenated in record order) are cut into `pieces`
// ranges that depend on the tree and `pieces` only (StoragePieceBounds);
// WritePiece fills one range in place, at the final file offsets (pwrite
// into a file it creates if needed and never truncates), and reports the
// CRC-32 of each record part it wrote; once every piece is written, one
// FinishPieces writes everything else around them (data.pkl, local headers,
// data descriptors with each record's CRC combined from its parts by
// Crc32Combine, the version record, the central directory) and trims the
// file to its size. The file then holds exactly the bytes WriteFile writes.
struct RecordPieceCrc {
  uint32_t record = 0;  // the storage record's index in archive order
  uint64_t offset = 0;  // of the part within the record's data
  uint64_t length = 0;
  uint32_t crc32 = 0;   // of the part's bytes alone (Crc32 from 0)
};
// Piece boundaries sit at multiples of this within the record they fall in.
inline constexpr uint64_t kPieceAlignment = 4096;
// The `pieces` + 1 boundaries of the pieces in the concatenated storage
// bytes of records of `record_sizes`: even shares, each moved down to a
// multiple of kPieceAlignment from the start of its record (a piece may be
// empty). bounds[0] = 0, bounds[pieces] = the total.
std::vector<uint64_t> StoragePieceBounds(absl::Span<const uint64_t> record_sizes, int pieces);

class TorchWriter {
 public:
  TorchWriter();
  explicit TorchWriter(TorchWriteOptions options);
  ~TorchWriter();
  TorchWriter(const TorchWriter&) = delete;
  TorchWriter& operator=(const TorchWriter&) = delete;

  // The pickle value for `t` (a `_rebuild_tensor_v2` object). Tensors that
  // share a Storage object share one record, which holds the whole storage
  // (as torch writes `flat[:n]` views). Location is always 'cpu'.
  pickle::ValuePtr AddTensor(const Tensor& t);
  // A tensor of `sizes` (contiguous) over a new storage of `storage_numel`
  // elements whose bytes come from `producer` at write time. The tensor views
  // elements [offset, offset + numel(sizes)) of that storage.
  pickle::ValuePtr AddStreamedTensor(DType dtype, std::vector<int64_t> sizes, int64_t storage_numel,
                                     int64_t offset, StorageProducer producer);
  // The same with a viewer: bytes that already sit in memory are written
  // from there, without a copy into the writer's buffer.
  pickle::ValuePtr AddStreamedTensor(DType dtype, std::vector<int64_t> sizes, int64_t storage_numel,
                                     int64_t offset, StorageViewer viewer);

  // Writes the archive to `path` (record stem = file name without its last
  // extension, as torch's PyTorchStreamWriter names it). On failure the
  // partial file is removed. Record keys are assigned here, in order of first
  // appearance in the pickle, and records are written in torch's order:
  // data.pkl, data/<key> sorted as strings ("0", "1", "10", "2", ...), version.
  // kInvalidArgument when `root` holds a persistent id this writer did not
  // make, or AddStreamedTensor got inconsistent sizes; kFailedPrecondition
  // when `path` is a file this process has memory-mapped (a TorchFile being
  // read: overwriting it in place would destroy the source). A producer's
  // error is returned as is.
  absl::Status WriteFile(const std::string& path, const pickle::Value& root);
  // Writes writers[i]'s archive to paths[i] (with roots[i]) for every i, each
  // file as WriteFile would. When every writer digests, the files' storage
  // bytes are written a piece at a time in turn and two files' pieces are
  // hashed together (StreamDigest::UpdatePair: for SHA-256 nearly twice as
  // fast as one file after another). Each writer's bytes_written() and
  // digest_hex() then
  // describe its file. On failure no file of the call is left.
  static absl::Status WriteFiles(absl::Span<TorchWriter* const> writers, absl::Span<const std::string> paths,
                                 absl::Span<const pickle::Value* const> roots);
  // Writes the archives of writers[i] (with roots[i]) back to back into one
  // new file at `path`, each as torch.save writes one to a stream: records
  // named `stem`/..., every zip offset relative to the archive's own start.
  // That is a torch.distributed.checkpoint `.distcp` file: FileSystemWriter
  // appends one torch.save stream per item. `lengths` receives each
  // archive's size, in order. Writeback and sync are writers[0]'s options;
  // nothing is digested. On failure the file is removed.
  static absl::Status WriteBackToBack(absl::Span<TorchWriter* const> writers, const std::string& path,
                                      const std::string& stem, absl::Span<const pickle::Value* const> roots,
                                      std::vector<uint64_t>* lengths);
  // Piece `piece` of `pieces` of the archive of `root` at `path` (see
  // RecordPieceCrc), appending the CRC-32 of each record part written to
  // `crcs`. kInvalidArgument with a digest (the bytes are not written in
  // order). On failure the file is left for the caller to remove (other
  // pieces share it): write pieces into a folder that is removed unless
  // every piece and the finish succeed.
  absl::Status WritePiece(const std::string& path, const pickle::Value& root, int piece, int pieces,
                          std::vector<RecordPieceCrc>* crcs);
  // What WritePiece(path, root, k, pieces) would write for every piece k,
  // without writing or reading anything: the part of each storage it
  // covers, by storage (numbered in the order AddTensor / AddStreamedTensor
  // made them; see num_storages), in archive order.
  struct StoragePart {
    size_t storage = 0;
    uint64_t offset = 0;  // bytes, within the storage
    uint64_t length = 0;
  };
  absl::StatusOr<std::vector<std::vector<StoragePart>>> PieceParts(const std::string& path, const pickle::Value& root,
                                                                   int pieces);
  // Storages made so far (the next AddStreamedTensor makes storage number
  // num_storages()).
  size_t num_storages() const;
  // After every piece: the rest of the archive, from the parts' CRCs of
  // every piece (kFailedPrecondition unless they cover every storage record
  // exactly). Returns the file's size.
  absl::StatusOr<uint64_t> FinishPieces(const std::string& path, const pickle::Value& root,
                                        absl::Span<const RecordPieceCrc> crcs);
  // The same into memory (tests).
  absl::StatusOr<std::string> WriteToString(const std::string& stem, const pickle::Value& root);

  // After a successful WriteFile: the file's size, and its digest (hex) of
  // the kind TorchWriteOptions::digest says (empty for none).
  uint64_t bytes_written() const;
  const std::string& digest_hex() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ucp::torch

#endif  // UCP_FORMAT_TORCH_TORCH_FILE_H_
