// A read-only memory mapping of a whole file, shared by everything that
// points into it (storages and tensors hold a shared_ptr to it), plus the
// page-cache hints a streaming converter needs and pread-based reads for
// callers that prefer copying into their own buffers.
//
// The mapping is MAP_PRIVATE + PROT_READ: nothing can write through it. An
// empty file has no mapping (data() == nullptr, size() == 0). Only regular
// files are opened (a FIFO or device is refused without blocking).
//
// If another process truncates the file while it is mapped, touching the
// lost pages would raise SIGBUS: a SIGBUS handler (installed by the first
// Open) replaces the pages past the end of a mapped file with zeros and marks
// the file as damaged, so the read goes on and CheckIntact / CheckAllIntact
// report it (kDataLoss, naming the file) before anything is committed. A
// SIGBUS elsewhere still ends the process as it would without the handler.
//
// Example:
//   UCP_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> f, MappedFile::Open(path));
//   f->AdviseSequential(0, f->size());
//   Consume(f->data() + off, len);
//   f->Release(off, len);  // drop those pages from RSS once used
#ifndef UCP_FORMAT_TORCH_MAPPED_FILE_H_
#define UCP_FORMAT_TORCH_MAPPED_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace ucp::torch {

class MappedFile {
 public:
  // kNotFound for a missing file, kFailedPrecondition for a directory or other
  // non-regular file, the errno's code otherwise; messages start with the path.
  static absl::StatusOr<std::shared_ptr<const MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  const uint8_t* data() const { return data_; }
  int fd() const { return fd_; }  // open while this MappedFile lives
  size_t size() const { return size_; }
  absl::Span<const uint8_t> bytes() const { return {data_, size_}; }

  // Page-cache hints over [offset, offset + len) (clamped to the file). They
  // never change what is read; failures are ignored (hints are best effort).
  void AdviseSequential(uint64_t offset, uint64_t len) const;
  // MADV_RANDOM: a fault reads only its own page (no read-around of
  // megabytes), for parsing headers scattered over a file; AdviseNormal
  // restores the default.
  void AdviseRandom(uint64_t offset, uint64_t len) const;
  void AdviseNormal(uint64_t offset, uint64_t len) const;
  void AdviseWillNeed(uint64_t offset, uint64_t len) const;
  // Starts reading [offset, offset + len) of the file into the page cache in
  // the background (posix_fadvise WILLNEED on the file: exactly those pages,
  // unlike a fault in the mapping, which reads megabytes around it), e.g.
  // before a series of small ReadAt calls, so that the disk serves them
  // together. A hint: failures are ignored.
  void PrefetchRange(uint64_t offset, uint64_t len) const;
  // PrefetchRange of [offset, offset + len) for each of `offsets` whose pages
  // are not all in the page cache already (mincore(2) over the mapping, one
  // call per cluster of ranges less than 64 KiB apart): a warm file costs no
  // fadvise per range. Where the kernel does not report the page cache's
  // state (mincore fails, or tells only this process's own pages, as for a
  // file the caller may not write), the ranges are asked for as by
  // PrefetchRange. Returns how many were.
  int PrefetchMissing(absl::Span<const uint64_t> offsets, uint64_t len) const;
  // Drops the pages wholly inside [offset, offset + len) from this process's
  // RSS (MADV_DONTNEED); a later access reads them again from the file.
  void Release(uint64_t offset, uint64_t len) const;

  // Drops every live mapping's pages from RSS (as Release on all of them).
  // Safe while other threads read: read-only private file mappings fault
  // their pages in again from the page cache.
  static void ReleaseAll();
  // Streaming readers report the mapped bytes they have consumed; every
  // kReleaseBudget bytes all mappings are released, which bounds the RSS
  // that memory-mapped sources add, however large the checkpoint.
  static constexpr size_t kReleaseBudget = size_t{256} << 20;
  static void NoteBytesConsumed(size_t n);
  // Maps the pages of [p, p + len) of any mapping of this process in one
  // call (MADV_POPULATE_READ, Linux 5.14; earlier kernels: nothing), before
  // a bulk read of them: one page fault per page costs far more on a VM,
  // and a write(2) straight from a mapping takes its faults on a slow path
  // (measured here: a 961 MB write from a mapping 1.1-5.4 s unpopulated,
  // 0.19-0.22 s populated). A hint: pages that cannot be read (a file
  // truncated under us) are left to fault, as before.
  static void Populate(const void* p, size_t len);

  // When [p, p + len) lies in one live mapping, reads those bytes of the
  // mapped file into `dst` (pread: the kernel copies them from the page cache
  // into a buffer the caller reuses, without faulting in the mapping's pages)
  // and returns true; false when they are not mapped bytes or the read fails
  // or stops short (the caller then reads the mapping).
  static bool ReadMapped(const void* p, size_t len, uint8_t* dst);

  // The bytes of `bytes` in a buffer this thread reuses (ReadMapped) when they
  // are at most kReadThroughBytes of one live mapping; `bytes` itself
  // otherwise (not mapped, larger, or the read failed). Hashing or writing
  // them from there takes no fault per page of the mapping, which costs more
  // than the copy on a VM. The returned span is valid until this thread's
  // next call.
  static constexpr size_t kReadThroughBytes = size_t{1} << 20;
  static absl::Span<const uint8_t> ReadThrough(absl::Span<const uint8_t> bytes);

  // Writes `bytes` at `offset` of `out_fd` by pwrite: from `same` when given
  // (the same bytes already read into memory, e.g. by ReadThrough), else
  // from `bytes` read through in pieces of kReadThroughBytes (mapped bytes
  // are read into this thread's buffer first: no fault per page of the
  // mapping). The write is timed as Phase::kWrite; errors name `path`.
  // copy_file_range (page cache to page cache) was the path before: on a VM
  // here, alternating the two builds on real checkpoints, it was the slower
  // one, e.g. a reshard of 2.7 GB to ZeRO tp 1 took 2.26-2.73 s copied file
  // to file and 2.14-2.60 s written from the buffer.
  static absl::Status WriteAt(int out_fd, const std::string& path, absl::Span<const uint8_t> bytes, uint64_t offset,
                              absl::Span<const uint8_t> same = {});
  // pwrite of every byte of `bytes` at `offset` (retried on EINTR and short
  // writes), timed as Phase::kWrite; errors name `path`.
  static absl::Status PWriteAll(int out_fd, const std::string& path, absl::Span<const uint8_t> bytes,
                                uint64_t offset);

  // True when `path` names a file (same device and inode) that a live
  // MappedFile of this process maps. Writers use it to refuse truncating a
  // file they are reading from (that would turn the mapping's pages into
  // SIGBUS and lose the source).
  static bool IsMappedByThisProcess(const std::string& path);
  // The file (its path as opened) and offset of [p, p + len) when a live
  // mapping of this process holds those bytes; false otherwise.
  static bool Locate(const void* p, size_t len, std::string* path, uint64_t* offset);

  // kDataLoss when the file shrank (or a page of it could not be read) since
  // Open: a read may have seen zeros instead of its bytes.
  absl::Status CheckIntact() const;
  // CheckIntact for every live mapping of the process; cheap when no SIGBUS
  // happened (one fstat per live mapping).
  static absl::Status CheckAllIntact();
  // Whether any SIGBUS in a mapping was absorbed since the process started.
  static bool AnyFault();

  // Copies bytes [offset, offset + dst.size()) with pread (no mapping
  // involved). kOutOfRange past the end of the file, kDataLoss if the file
  // is shorter than at Open, the errno's code on a read error.
  absl::Status ReadAt(uint64_t offset, absl::Span<uint8_t> dst) const;

 private:
  MappedFile() = default;
  void Advise(uint64_t offset, uint64_t len, int advice, bool inward) const;
  std::string path_;
  uint64_t device_ = 0, inode_ = 0;
  int fd_ = -1;
  int slot_ = -1;  // in the SIGBUS handler's table, or -1
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace ucp::torch

#endif  // UCP_FORMAT_TORCH_MAPPED_FILE_H_
