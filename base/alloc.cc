#include "base/alloc.h"

#include <malloc.h>

namespace ucp {

bool KeepFreedMemory() {
  // Setting either one also turns off glibc's dynamic threshold, which would
  // otherwise move them as buffers come and go.
  const bool mmap_ok = ::mallopt(M_MMAP_THRESHOLD, static_cast<int>(kKeptMmapThreshold)) == 1;
  const bool trim_ok = ::mallopt(M_TRIM_THRESHOLD, static_cast<int>(kKeptTrimThreshold)) == 1;
  return mmap_ok && trim_ok;
}

}  // namespace ucp
