#include "format/torch/mapped_file.h"

#include <atomic>

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include <mutex>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/phases.h"

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
  std::vector<std::string> damaged;  // closed files that had faulted
};

std::atomic<size_t> consumed_since_release{0};
MappedRegistry& Registry() {
  static MappedRegistry* registry = new MappedRegistry();
  return *registry;
}

size_t PageSize() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

// ---- SIGBUS: a mapped file truncated under us ----
// A fixed table the signal handler can read without locks: [begin, end) of
// every live mapping. begin == 0: free; begin == 1: being filled.
constexpr int kSlots = 1 << 14;
struct Slot {
  std::atomic<uintptr_t> begin{0};
  std::atomic<uintptr_t> end{0};
  std::atomic<int> faulted{0};
};
Slot slots[kSlots];
std::atomic<int> fault_count{0};
struct sigaction previous_sigbus;
std::once_flag sigbus_once;
uintptr_t sigbus_page_size = 4096;

void OnSigbus(int sig, siginfo_t* info, void* context) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(info->si_addr);
  for (int i = 0; i < kSlots; ++i) {
    const uintptr_t b = slots[i].begin.load(std::memory_order_acquire);
    if (b <= 1) continue;
    const uintptr_t e = slots[i].end.load(std::memory_order_acquire);
    if (addr < b || addr >= e) continue;
    // Zeros from the faulting page to the end of the mapping: the reader
    // goes on, and the file is reported as damaged before any commit.
    const uintptr_t page = sigbus_page_size;
    const uintptr_t from = addr / page * page;
    const uintptr_t to = (e + page - 1) / page * page;
    void* p = mmap(reinterpret_cast<void*>(from), to - from, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (p == MAP_FAILED) break;
    slots[i].faulted.store(1, std::memory_order_release);
    fault_count.fetch_add(1, std::memory_order_release);
    return;
  }
  // Not ours: behave as before the handler existed.
  if ((previous_sigbus.sa_flags & SA_SIGINFO) && previous_sigbus.sa_sigaction != nullptr) {
    previous_sigbus.sa_sigaction(sig, info, context);
    return;
  }
  if (previous_sigbus.sa_handler != SIG_DFL && previous_sigbus.sa_handler != SIG_IGN &&
      previous_sigbus.sa_handler != nullptr) {
    previous_sigbus.sa_handler(sig);
    return;
  }
  signal(SIGBUS, SIG_DFL);  // the fault repeats on return and ends the process
}

void InstallSigbusHandler() {
  std::call_once(sigbus_once, [] {
    sigbus_page_size = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    struct sigaction sa;
    std::memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = OnSigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &previous_sigbus);
  });
}

int ClaimSlot(const uint8_t* data, size_t size) {
  for (int i = 0; i < kSlots; ++i) {
    uintptr_t expected = 0;
    if (slots[i].begin.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
      slots[i].faulted.store(0, std::memory_order_relaxed);
      slots[i].end.store(reinterpret_cast<uintptr_t>(data) + size, std::memory_order_release);
      slots[i].begin.store(reinterpret_cast<uintptr_t>(data), std::memory_order_release);
      return i;
    }
  }
  return -1;  // table full: this mapping is not protected
}

}  // namespace

absl::StatusOr<std::shared_ptr<const MappedFile>> MappedFile::Open(const std::string& path) {
  // O_NONBLOCK: a FIFO must not block the open; it is refused below.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return ErrnoError(errno, path, "cannot open");
  std::shared_ptr<MappedFile> file(new MappedFile());
  file->path_ = path;
  file->fd_ = fd;
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError(errno, path, "cannot stat");
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": ", S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISDIR(st.st_mode) ? "a folder" : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device" : "not a regular file",
        ", expected a regular file"));
  }
  {
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags >= 0) (void)::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
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
    InstallSigbusHandler();
    file->slot_ = ClaimSlot(file->data_, file->size_);
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
  if (slot_ >= 0 && slots[slot_].faulted.load(std::memory_order_acquire) != 0) {
    std::lock_guard<std::mutex> lock(Registry().mu);
    Registry().damaged.push_back(path_);
  }
  if (slot_ >= 0) {
    slots[slot_].begin.store(1, std::memory_order_release);  // no longer ours
    slots[slot_].end.store(0, std::memory_order_release);
  }
  if (data_ != nullptr) ::munmap(data_, size_);
  if (slot_ >= 0) slots[slot_].begin.store(0, std::memory_order_release);
  if (fd_ >= 0) ::close(fd_);
}

absl::Status MappedFile::CheckIntact() const {
  if (fd_ < 0) return absl::OkStatus();
  struct stat st;
  const bool faulted = slot_ >= 0 && slots[slot_].faulted.load(std::memory_order_acquire) != 0;
  if (::fstat(fd_, &st) != 0) return ErrnoError(errno, path_, "cannot stat");
  if (faulted || static_cast<uint64_t>(st.st_size) < size_) {
    return absl::DataLossError(absl::StrCat(
        path_, ": the file shrank from ", size_, " to ", st.st_size,
        " bytes while ucp was reading it (rewritten or truncated during the run?); nothing read from it can be "
        "trusted and no output was committed"));
  }
  return absl::OkStatus();
}

absl::Status MappedFile::CheckAllIntact() {
  std::lock_guard<std::mutex> lock(Registry().mu);
  if (!Registry().damaged.empty()) {
    return absl::DataLossError(absl::StrCat(
        Registry().damaged.front(),
        ": the file shrank while ucp was reading it (rewritten or truncated during the run?); nothing read from "
        "it can be trusted and no output was committed"));
  }
  for (const MappedFile* f : Registry().live) {
    absl::Status s = f->CheckIntact();
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

bool MappedFile::AnyFault() { return fault_count.load(std::memory_order_acquire) != 0; }

void MappedFile::ReleaseAll() {
  std::lock_guard<std::mutex> lock(Registry().mu);
  for (const MappedFile* f : Registry().live) f->Release(0, f->size());
}

void MappedFile::NoteBytesConsumed(size_t n) {
  const size_t total = consumed_since_release.fetch_add(n, std::memory_order_relaxed) + n;
  if (total >= kReleaseBudget) {
    consumed_since_release.store(0, std::memory_order_relaxed);
    ReleaseAll();
  }
}


void MappedFile::Populate(const void* p, size_t len) {
#ifndef MADV_POPULATE_READ
  constexpr int MADV_POPULATE_READ = 22;
#endif
  static std::atomic<bool> unsupported{false};
  if (len == 0 || p == nullptr || unsupported.load(std::memory_order_relaxed)) return;
  const uintptr_t page = PageSize();
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p) / page * page;
  const uintptr_t end = reinterpret_cast<uintptr_t>(p) + len;
  if (::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_READ) != 0 && errno == EINVAL) {
    unsupported.store(true, std::memory_order_relaxed);
  }
}

namespace {

// The descriptor of the live mapping holding [p, p + len) and the bytes'
// offset in its file; -1 when no single mapping holds them. The caller holds
// a reference to that mapping, so the descriptor stays open.
int FindMapped(const void* p, size_t len, loff_t* offset) {
  const uint8_t* b = static_cast<const uint8_t*>(p);
  std::lock_guard<std::mutex> lock(Registry().mu);
  for (const MappedFile* f : Registry().live) {
    if (f->data() == nullptr || b < f->data() || b + len > f->data() + f->size()) continue;
    *offset = static_cast<loff_t>(b - f->data());
    return f->fd();
  }
  return -1;
}

}  // namespace

bool MappedFile::Locate(const void* p, size_t len, std::string* path, uint64_t* offset) {
  const uint8_t* b = static_cast<const uint8_t*>(p);
  std::lock_guard<std::mutex> lock(Registry().mu);
  for (const MappedFile* f : Registry().live) {
    if (f->data() == nullptr || b < f->data() || b + len > f->data() + f->size()) continue;
    *path = f->path();
    *offset = static_cast<uint64_t>(b - f->data());
    return true;
  }
  return false;
}

bool MappedFile::ReadMapped(const void* p, size_t len, uint8_t* dst) {
  if (len == 0) return true;
  loff_t off = 0;
  const int fd = FindMapped(p, len, &off);
  if (fd < 0) return false;
  size_t done = 0;
  while (done < len) {
    const ssize_t r = ::pread(fd, dst + done, len - done, off + static_cast<loff_t>(done));
    if (r <= 0) {
      if (r < 0 && errno == EINTR) continue;
      return false;
    }
    done += static_cast<size_t>(r);
  }
  return true;
}

absl::Span<const uint8_t> MappedFile::ReadThrough(absl::Span<const uint8_t> bytes) {
  if (bytes.empty() || bytes.size() > kReadThroughBytes) return bytes;
  thread_local std::unique_ptr<uint8_t[]> buffer;
  if (!buffer) buffer.reset(new uint8_t[kReadThroughBytes]);
  if (!ReadMapped(bytes.data(), bytes.size(), buffer.get())) return bytes;
  return {buffer.get(), bytes.size()};
}

absl::Status MappedFile::PWriteAll(int out_fd, const std::string& path, absl::Span<const uint8_t> bytes,
                                   uint64_t offset) {
  PhaseTimer timer(Phase::kWrite, static_cast<int64_t>(bytes.size()));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w =
        ::pwrite(out_fd, bytes.data() + done, bytes.size() - done, static_cast<off_t>(offset + done));
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, path, "write");
    }
    done += static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

absl::Status MappedFile::WriteAt(int out_fd, const std::string& path, absl::Span<const uint8_t> bytes,
                                 uint64_t offset, absl::Span<const uint8_t> same) {
  if (!same.empty() && same.data() != bytes.data()) return PWriteAll(out_fd, path, same, offset);
  for (size_t at = 0; at < bytes.size(); at += kReadThroughBytes) {
    const absl::Span<const uint8_t> chunk = ReadThrough(bytes.subspan(at, kReadThroughBytes));
    if (absl::Status s = PWriteAll(out_fd, path, chunk, offset + at); !s.ok()) return s;
  }
  return absl::OkStatus();
}

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

void MappedFile::AdviseRandom(uint64_t offset, uint64_t len) const {
  Advise(offset, len, MADV_RANDOM, /*inward=*/false);
}

void MappedFile::AdviseNormal(uint64_t offset, uint64_t len) const {
  Advise(offset, len, MADV_NORMAL, /*inward=*/false);
}

void MappedFile::AdviseWillNeed(uint64_t offset, uint64_t len) const {
  Advise(offset, len, MADV_WILLNEED, /*inward=*/false);
}

void MappedFile::PrefetchRange(uint64_t offset, uint64_t len) const {
  if (fd_ < 0 || offset >= size_ || len == 0) return;
  if (len > size_ - offset) len = size_ - offset;
  (void)::posix_fadvise(fd_, static_cast<off_t>(offset), static_cast<off_t>(len), POSIX_FADV_WILLNEED);
}

int MappedFile::PrefetchMissing(absl::Span<const uint64_t> offsets, uint64_t len) const {
  if (fd_ < 0 || data_ == nullptr || len == 0 || offsets.empty()) return 0;
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  std::vector<uint64_t> sorted;
  sorted.reserve(offsets.size());
  for (uint64_t o : offsets) {
    if (o < size_) sorted.push_back(o);
  }
  std::sort(sorted.begin(), sorted.end());
  // One mincore per cluster of ranges at most kGap apart: the kernel looks
  // up every page of the span it is given, so ranges far apart (samples a
  // few MB from each other in a large file) each get their own call.
  constexpr uint64_t kGap = uint64_t{64} << 10;
  int asked = 0;
  std::vector<unsigned char> resident;
  for (size_t first = 0; first < sorted.size();) {
    size_t last = first;
    uint64_t end = std::min<uint64_t>(size_, sorted[first] + len);
    while (last + 1 < sorted.size() && sorted[last + 1] <= end + kGap) {
      ++last;
      end = std::max<uint64_t>(end, std::min<uint64_t>(size_, sorted[last] + len));
    }
    const uint64_t lo = sorted[first] / page * page;
    resident.assign((end - lo + page - 1) / page, 0);
    const bool known = ::mincore(const_cast<uint8_t*>(data_) + lo, end - lo, resident.data()) == 0;
    for (size_t k = first; k <= last; ++k) {
      const uint64_t o = sorted[k];
      if (k > first && o == sorted[k - 1]) continue;
      const uint64_t range_end = std::min<uint64_t>(size_, o + len);
      bool cached = known;
      for (uint64_t p = o / page * page; cached && p < range_end; p += page) {
        cached = (resident[(p - lo) / page] & 1) != 0;
      }
      if (cached) continue;
      PrefetchRange(o, len);
      ++asked;
    }
    first = last + 1;
  }
  return asked;
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
