#include "format/torch/mapped_file.h"

#include <atomic>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <mutex>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace ucp::torch {
namespace {

absl::Status ErrnoError(int err, const std::string& path, const char* what) {
  return absl::ErrnoToStatus(err, absl::StrCat(path, ": ", what));
}

// (device, inode) -> number of live mappings, for IsMappedByThisProcess.
struct MappedRegistry {
  std::mutex mu;
  absl::flat_hash_map<std::pair<uint64_t, uint64_t>, int> count;
  absl::flat_hash_set<const MappedFile*> live;
};

std::atomic<size_t> consumed_since_release{0};
std::atomic<size_t> release_budget{size_t{256} << 20};
MappedRegistry& Registry() {
  static MappedRegistry* registry = new MappedRegistry();
  return *registry;
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
  file->device_ = static_cast<uint64_t>(st.st_dev);
  file->inode_ = static_cast<uint64_t>(st.st_ino);
  {
    std::lock_guard<std::mutex> lock(Registry().mu);
    ++Registry().count[{file->device_, file->inode_}];
    Registry().live.insert(file.get());
  }
  if (file->size_ > 0) {
    void* p = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) return ErrnoError(errno, path, "cannot mmap");
    file->data_ = static_cast<uint8_t*>(p);
  }
  return std::shared_ptr<const MappedFile>(std::move(file));
}

MappedFile::~MappedFile() {
  if (fd_ >= 0 && (device_ != 0 || inode_ != 0)) {
    std::lock_guard<std::mutex> lock(Registry().mu);
    auto it = Registry().count.find({device_, inode_});
    if (it != Registry().count.end() && --it->second == 0) Registry().count.erase(it);
    Registry().live.erase(this);
  }
  if (data_ != nullptr) ::munmap(data_, size_);
  if (fd_ >= 0) ::close(fd_);
}

void MappedFile::ReleaseAll() {
  std::lock_guard<std::mutex> lock(Registry().mu);
  for (const MappedFile* f : Registry().live) f->Release(0, f->size());
}

void MappedFile::NoteBytesConsumed(size_t n) {
  const size_t budget = release_budget.load(std::memory_order_relaxed);
  if (budget == 0) return;
  const size_t total = consumed_since_release.fetch_add(n, std::memory_order_relaxed) + n;
  if (total >= budget) {
    consumed_since_release.store(0, std::memory_order_relaxed);
    ReleaseAll();
  }
}

void MappedFile::SetReleaseBudget(size_t budget) { release_budget = budget; }

bool MappedFile::IsMappedByThisProcess(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return false;
  std::lock_guard<std::mutex> lock(Registry().mu);
  return Registry().count.contains({static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)});
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
