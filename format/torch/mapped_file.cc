#include "format/torch/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ucp::torch {
namespace {

absl::Status ErrnoError(int err, const std::string& path, const char* what) {
  return absl::ErrnoToStatus(err, absl::StrCat(path, ": ", what));
}

size_t PageSize() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const MappedFile>> MappedFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, path, "cannot open");
  std::shared_ptr<MappedFile> file(new MappedFile());
  file->path_ = path;
  file->fd_ = fd;
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError(errno, path, "cannot stat");
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": not a regular file"));
  }
  if (st.st_size < 0 || static_cast<uint64_t>(st.st_size) > SIZE_MAX) {
    return absl::OutOfRangeError(absl::StrCat(path, ": file too large to map"));
  }
  file->size_ = static_cast<size_t>(st.st_size);
  if (file->size_ > 0) {
    void* p = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) return ErrnoError(errno, path, "cannot mmap");
    file->data_ = static_cast<uint8_t*>(p);
  }
  return std::shared_ptr<const MappedFile>(std::move(file));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(data_, size_);
  if (fd_ >= 0) ::close(fd_);
}

void MappedFile::Advise(uint64_t offset, uint64_t len, int advice, bool inward) const {
  if (data_ == nullptr || offset >= size_) return;
  if (len > size_ - offset) len = size_ - offset;
  const uint64_t page = PageSize();
  uint64_t begin = offset, end = offset + len;
  if (inward) {
    begin = (begin + page - 1) / page * page;
    // The last partial page of the file counts as whole: nothing follows it.
    if (end != size_) end = end / page * page;
  } else {
    begin = begin / page * page;
  }
  if (end <= begin) return;
  (void)::madvise(data_ + begin, end - begin, advice);
}

void MappedFile::AdviseSequential(uint64_t offset, uint64_t len) const {
  Advise(offset, len, MADV_SEQUENTIAL, /*inward=*/false);
}

void MappedFile::AdviseWillNeed(uint64_t offset, uint64_t len) const {
  Advise(offset, len, MADV_WILLNEED, /*inward=*/false);
}

void MappedFile::Release(uint64_t offset, uint64_t len) const {
  Advise(offset, len, MADV_DONTNEED, /*inward=*/true);
}

absl::Status MappedFile::ReadAt(uint64_t offset, absl::Span<uint8_t> dst) const {
  if (offset > size_ || dst.size() > size_ - offset) {
    return absl::OutOfRangeError(absl::StrCat(path_, ": read of ", dst.size(), " bytes at offset ", offset,
                                              " is past the end of the file (", size_, " bytes)"));
  }
  size_t done = 0;
  while (done < dst.size()) {
    ssize_t n = ::pread(fd_, dst.data() + done, dst.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, path_, "read failed");
    }
    if (n == 0) {
      return absl::DataLossError(absl::StrCat(path_, ": file shrank while open: end of file at offset ",
                                              offset + done, ", expected ", size_, " bytes"));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace ucp::torch
