#include "base/alloc.h"

#include <malloc.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace ucp {
namespace {

// One test per process matters here: glibc's thresholds are process-wide and
// move as memory is freed. This binary has no other test.
TEST(KeepFreedMemoryTest, BuffersComeFromTheHeapAndFreedMemoryStays) {
  // Before: glibc's defaults, a 16 MiB buffer is its own mapping.
  const size_t before_mmapped = mallinfo2().hblkhd;
  void* first = std::malloc(size_t{16} << 20);
  ASSERT_NE(first, nullptr);
  EXPECT_GE(mallinfo2().hblkhd, before_mmapped + (size_t{16} << 20)) << "expected glibc's default mmap threshold";
  std::free(first);

  ASSERT_TRUE(KeepFreedMemory());

  // A buffer under the new threshold comes from the heap, not a mapping.
  const size_t mmapped = mallinfo2().hblkhd;
  void* buffer = std::malloc(size_t{24} << 20);
  ASSERT_NE(buffer, nullptr);
  std::memset(buffer, 1, size_t{24} << 20);
  EXPECT_EQ(mallinfo2().hblkhd, mmapped);

  // Freed, it stays in the heap (the default would trim all but 128 KiB):
  // the next buffer reuses those pages.
  std::free(buffer);
  const struct mallinfo2 after = mallinfo2();
  EXPECT_GE(after.fordblks, size_t{24} << 20);
  EXPECT_GE(after.keepcost, size_t{16} << 20);
}

}  // namespace
}  // namespace ucp
