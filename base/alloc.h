// KeepFreedMemory: tells glibc's malloc to keep the memory a program frees
// for its next allocations instead of giving it back to the kernel.
//
// ucp's units allocate and free buffers of a few MiB all the time (a record's
// gather buffer, a tensor's chunk, a file's write buffer). With glibc's
// defaults each one above the mmap threshold is a fresh mapping, and freed
// memory at the top of a heap is trimmed: every buffer then costs a page fault
// per 4 KiB and the kernel zeroes it again. On virtual machines that report
// free memory to the host (virtio-balloon free page reporting), each of those
// faults can also be a fault on the host. Measured on a 2.7 GB reshard of a
// real DeepSpeed checkpoint (bench/run_bench.sh --source=...): 41,000 minor
// faults without, 12,000 with.
//
// Buffers up to 32 MiB (the largest threshold glibc accepts) come from the
// arenas, and up to 1 GiB of free memory is kept at the top of a heap. Peak
// RSS is unchanged (the peak is the most ucp held at once); what ucp freed
// stays counted in its RSS until it exits. For programs (the ucp command),
// not for libraries loaded into someone else's process (the Python module
// leaves the interpreter's allocator alone).
#ifndef UCP_BASE_ALLOC_H_
#define UCP_BASE_ALLOC_H_

#include <cstddef>

namespace ucp {

inline constexpr size_t kKeptMmapThreshold = size_t{32} << 20;
inline constexpr size_t kKeptTrimThreshold = size_t{1} << 30;

// Returns false if glibc refused a setting (the defaults then stay).
bool KeepFreedMemory();

}  // namespace ucp

#endif  // UCP_BASE_ALLOC_H_
