#include "format/torch/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <thread>

#include <cstring>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "format/torch/test_util.h"
#include "gtest/gtest.h"

namespace ucp::torch {
namespace {

using testing::TempPath;

void WriteFile(const std::string& path, const std::string& content) {
  ASSERT_TRUE(WriteFileAtomic(path, content).ok()) << path;
}

// d01: a FIFO where a checkpoint file is expected is refused at once (an
// open(2) for reading would wait for a writer forever).
TEST(MappedFileTest, FifoIsRefusedWithoutBlocking) {
  const std::string path = TempPath("fifo.pt");
  ::unlink(path.c_str());
  ASSERT_EQ(::mkfifo(path.c_str(), 0644), 0);
  auto opened = std::async(std::launch::async, [&] { return MappedFile::Open(path).status(); });
  ASSERT_EQ(opened.wait_for(std::chrono::seconds(10)), std::future_status::ready) << "open blocked on a FIFO";
  const absl::Status s = opened.get();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(s.message(), path + ": a FIFO, expected a regular file");
}

// d02: a file truncated while mapped (DeepSpeed re-saving the same tag) reads
// as zeros past its new end instead of killing the process with SIGBUS, and
// is reported as damaged.
TEST(MappedFileTest, FileTruncatedWhileMappedIsAnErrorNotSigbus) {
  const std::string path = TempPath("shrinks.bin");
  const size_t size = size_t{1} << 20;
  WriteFile(path, std::string(size, '\x5a'));
  auto file = MappedFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE((*file)->CheckIntact().ok());
  EXPECT_TRUE(MappedFile::CheckAllIntact().ok());
  ASSERT_EQ(::truncate(path.c_str(), 0), 0);
  (*file)->Release(0, size);  // drop the cached pages so that they fault again
  const volatile uint8_t* p = (*file)->data();
  uint64_t sum = 0;
  for (size_t i = 0; i < size; i += 4096) sum += p[i];  // SIGBUS before the handler
  EXPECT_EQ(sum, 0u);
  EXPECT_TRUE(MappedFile::AnyFault());
  const absl::Status s = (*file)->CheckIntact();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_EQ(s.message().rfind(path + ": the file shrank from 1048576 to 0 bytes", 0), 0u) << s;
  EXPECT_EQ(MappedFile::CheckAllIntact().code(), absl::StatusCode::kDataLoss);
  file->reset();
  // Closed, it is still remembered as damaged.
  EXPECT_EQ(MappedFile::CheckAllIntact().code(), absl::StatusCode::kDataLoss);
}

TEST(MappedFileTest, MapsContentAndReadsAt) {
  std::string content;
  for (int i = 0; i < 20000; ++i) content.push_back(static_cast<char>(i * 13));
  std::string path = TempPath("mapped.bin");
  WriteFile(path, content);
  auto file = MappedFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const MappedFile& f = **file;
  ASSERT_EQ(f.size(), content.size());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(f.data()), f.size()), content);
  EXPECT_EQ(f.path(), path);

  std::vector<uint8_t> buf(100);
  ASSERT_TRUE(f.ReadAt(5000, absl::MakeSpan(buf)).ok());
  EXPECT_EQ(std::string(buf.begin(), buf.end()), content.substr(5000, 100));
  ASSERT_TRUE(f.ReadAt(content.size() - 100, absl::MakeSpan(buf)).ok());
  EXPECT_EQ(f.ReadAt(content.size() - 99, absl::MakeSpan(buf)).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(f.ReadAt(~uint64_t{0}, absl::MakeSpan(buf)).code(), absl::StatusCode::kOutOfRange);

  // Hints never change content, including after pages are dropped.
  f.AdviseSequential(0, f.size());
  f.AdviseWillNeed(100, 1 << 30);
  f.Release(0, f.size());
  f.Release(12345, 1);
  f.Release(f.size() + 10, 10);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(f.data()), f.size()), content);
}

// Pages of `path`'s [offset, offset + len) in the page cache (mincore of a
// mapping of its own, never touched).
int CachedPages(const std::string& path, uint64_t offset, uint64_t len) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  void* p = ::mmap(nullptr, offset + len, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return -1;
  const long page = ::sysconf(_SC_PAGESIZE);
  std::vector<unsigned char> v((offset + len + page - 1) / page);
  int n = -1;
  if (::mincore(p, offset + len, v.data()) == 0) {
    n = 0;
    for (uint64_t i = offset / page; i < v.size(); ++i) n += v[i] & 1;
  }
  ::munmap(p, offset + len);
  return n;
}

TEST(MappedFileTest, PrefetchMissingAsksOnlyForRangesNotCached) {
  const long page = ::sysconf(_SC_PAGESIZE);
  const std::string content(64 * page, 'p');
  const std::string path = TempPath("prefetch_missing.bin");
  WriteFile(path, content);
  auto file = MappedFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const MappedFile& f = **file;
  // Every page read (cached): nothing is asked for, whatever the offsets
  // (one far from the others, a duplicate, one past the end).
  std::vector<uint8_t> all(content.size());
  ASSERT_TRUE(f.ReadAt(0, absl::MakeSpan(all)).ok());
  const std::vector<uint64_t> offsets = {0, uint64_t(3 * page + 10), uint64_t(3 * page + 10), uint64_t(40 * page),
                                         uint64_t(64 * page - 4), uint64_t(64 * page + 100)};
  EXPECT_EQ(f.PrefetchMissing(offsets, 4), 0);
  // Dropped from the page cache (clean, and never mapped by a touch): each
  // distinct range in the file is asked for, and read into the cache.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::fdatasync(fd), 0);
  ASSERT_EQ(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
  ::close(fd);
  ASSERT_EQ(CachedPages(path, 0, content.size()), 0) << "the kernel kept the pages: the test needs them dropped";
  EXPECT_EQ(f.PrefetchMissing(offsets, 4), 4);
  for (int i = 0; i < 500 && CachedPages(path, 40 * page, 4) == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(CachedPages(path, 40 * page, 4), 1);
  EXPECT_EQ(CachedPages(path, 20 * page, page), 0);  // no sample there: not read
}

TEST(MappedFileTest, KnowsWhichFilesAreMapped) {
  std::string path = TempPath("registry.bin");
  WriteFile(path, "abc");
  EXPECT_FALSE(MappedFile::IsMappedByThisProcess(path));
  {
    auto a = MappedFile::Open(path);
    auto b = MappedFile::Open(path);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_TRUE(MappedFile::IsMappedByThisProcess(path));
    ::symlink(path.c_str(), TempPath("registry.link").c_str());
    EXPECT_TRUE(MappedFile::IsMappedByThisProcess(TempPath("registry.link")));  // same inode
    a->reset();
    EXPECT_TRUE(MappedFile::IsMappedByThisProcess(path));
  }
  EXPECT_FALSE(MappedFile::IsMappedByThisProcess(path));
  EXPECT_FALSE(MappedFile::IsMappedByThisProcess(TempPath("no-such-file")));
}

TEST(MappedFileTest, EmptyFile) {
  std::string path = TempPath("empty.bin");
  WriteFile(path, "");
  auto file = MappedFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->size(), 0u);
  EXPECT_EQ((*file)->data(), nullptr);
  EXPECT_TRUE((*file)->ReadAt(0, {}).ok());
  (*file)->Release(0, 100);
}

TEST(MappedFileTest, ErrorsNameThePath) {
  auto missing = MappedFile::Open(TempPath("does-not-exist.pt"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("does-not-exist.pt"), std::string::npos);
  auto dir = MappedFile::Open(TempPath(""));
  EXPECT_EQ(dir.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(MappedFileTest, MappingOutlivesCallerReferenceOnly) {
  std::string path = TempPath("keep.bin");
  WriteFile(path, "hello");
  std::shared_ptr<const MappedFile> keep;
  {
    auto file = MappedFile::Open(path);
    ASSERT_TRUE(file.ok());
    keep = *file;
  }
  ::unlink(path.c_str());  // the mapping stays valid after unlink
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(keep->data()), keep->size()), "hello");
}


TEST(MappedFileRssTest, ReleaseAllGivesBackTouchedPages) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp != nullptr ? tmp : "/tmp") + "/rss_probe.bin";
  {
    std::string data(64 << 20, '\x5a');
    FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fwrite(data.data(), 1, data.size(), f), data.size());
    std::fclose(f);
  }
  auto mapped = MappedFile::Open(path);
  ASSERT_TRUE(mapped.ok());
  const int64_t before = testing::RssKiB();
  uint64_t sum = 0;
  for (size_t i = 0; i < (*mapped)->size(); i += 4096) sum += (*mapped)->data()[i];
  EXPECT_EQ(sum, uint64_t{0x5a} * ((64 << 20) / 4096));
  const int64_t touched = testing::RssKiB();
  EXPECT_GT(touched - before, 48 * 1024) << "touching 64 MiB should add to RSS";
  MappedFile::ReleaseAll();
  const int64_t released = testing::RssKiB();
  EXPECT_LT(released - before, 8 * 1024) << "before " << before << " touched " << touched << " released " << released;
  // The data is still there.
  EXPECT_EQ((*mapped)->data()[12345], 0x5a);
  // The budget does the same on its own.
  for (size_t i = 0; i < (*mapped)->size(); i += 4096) sum += (*mapped)->data()[i];
  MappedFile::NoteBytesConsumed(MappedFile::kReleaseBudget);
  EXPECT_LT(testing::RssKiB() - before, 8 * 1024);
}

// Populate maps the pages of a range without touching them one by one: the
// RSS grows by the range, not by the rest of the file, and the bytes are the
// file's.
TEST(MappedFileRssTest, PopulateMapsExactlyTheRange) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp != nullptr ? tmp : "/tmp") + "/populate_probe.bin";
  {
    std::string data(64 << 20, '\x3c');
    FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fwrite(data.data(), 1, data.size(), f), data.size());
    std::fclose(f);
  }
  auto mapped = MappedFile::Open(path);
  ASSERT_TRUE(mapped.ok());
  MappedFile::ReleaseAll();
  const int64_t before = testing::RssKiB();
  MappedFile::Populate((*mapped)->data() + (8 << 20), 32 << 20);
  const int64_t populated = testing::RssKiB();
  EXPECT_GT(populated - before, 28 * 1024) << "populating 32 MiB should add them to RSS";
  EXPECT_LT(populated - before, 44 * 1024) << "only the range is populated";
  EXPECT_EQ((*mapped)->data()[(8 << 20) + 4321], 0x3c);
  // Nothing to do, or not a mapping: no effect, no crash.
  MappedFile::Populate(nullptr, 4096);
  MappedFile::Populate((*mapped)->data(), 0);
  MappedFile::ReleaseAll();
}

// WriteAt and ReadMapped take the bytes from the mapped file itself:
// exactly [p, p + len) of it, at the asked offset of the output (WriteAt in
// pieces of kReadThroughBytes through this thread's buffer); ReadMapped
// leaves bytes no single mapping holds to the caller (false).
TEST(MappedFileCopyTest, WritesAndReadsExactlyTheMappedRange) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp != nullptr ? tmp : "/tmp");
  std::string content(3 << 20, '\0');
  for (size_t i = 0; i < content.size(); ++i) content[i] = static_cast<char>((i * 131 + i / 4099) & 0xff);
  WriteFile(dir + "/copy_source.bin", content);
  auto mapped = MappedFile::Open(dir + "/copy_source.bin");
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  const uint8_t* data = (*mapped)->data();

  const std::string out = dir + "/copy_out.bin";
  const int fd = ::open(out.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0);
  const size_t from = 12345, len = (2 << 20) + 777, at = 1001;
  ASSERT_TRUE(MappedFile::WriteAt(fd, out, absl::MakeConstSpan(data + from, len), at).ok());
  std::string got(at + len, '\0');
  ASSERT_EQ(::pread(fd, got.data(), got.size(), 0), static_cast<ssize_t>(got.size()));
  EXPECT_EQ(got.substr(0, at), std::string(at, '\0'));
  EXPECT_TRUE(got.substr(at) == content.substr(from, len)) << "the write is not the mapped range";

  std::vector<uint8_t> buf(len);
  ASSERT_TRUE(MappedFile::ReadMapped(data + from, len, buf.data()));
  EXPECT_EQ(std::memcmp(buf.data(), content.data() + from, len), 0);

  // Past the mapping's end, or memory no mapping holds: ReadMapped false;
  // WriteAt writes heap bytes as they are, and `same` (the bytes already
  // read) instead of `bytes` when given.
  EXPECT_FALSE(MappedFile::ReadMapped(data + content.size() - 10, 20, buf.data()));
  std::vector<uint8_t> heap(64, 7);
  EXPECT_FALSE(MappedFile::ReadMapped(heap.data(), heap.size(), buf.data()));
  ASSERT_TRUE(MappedFile::WriteAt(fd, out, heap, 0).ok());
  std::vector<uint8_t> other(64, 9);
  ASSERT_TRUE(MappedFile::WriteAt(fd, out, absl::MakeConstSpan(data, 64), 64, other).ok());
  std::string head(128, '\0');
  ASSERT_EQ(::pread(fd, head.data(), head.size(), 0), 128);
  EXPECT_EQ(head, std::string(64, '\7') + std::string(64, '\t'));
  struct stat st;
  ASSERT_EQ(::fstat(fd, &st), 0);
  EXPECT_EQ(static_cast<size_t>(st.st_size), at + len);
  ::close(fd);
}

}  // namespace
}  // namespace ucp::torch
