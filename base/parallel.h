// ParallelFor: runs `fn(i)` for i in [0, n) on up to `num_threads` threads
// (0 = all cores), each index exactly once, in index order per thread. The
// first failing status (lowest index among failures seen) is returned; once
// one fails, indices not yet started are skipped.
//
// Example:
//   UCP_RETURN_IF_ERROR(ParallelFor(params.size(), threads, [&](size_t i) {
//     return ConvertParam(params[i]);
//   }));
#ifndef UCP_BASE_PARALLEL_H_
#define UCP_BASE_PARALLEL_H_

#include <cstddef>
#include <functional>

#include "absl/status/status.h"

namespace ucp {

int DefaultThreadCount();
absl::Status ParallelFor(size_t n, int num_threads, const std::function<absl::Status(size_t)>& fn);

}  // namespace ucp

#endif  // UCP_BASE_PARALLEL_H_
