// Progress of a long operation, as the executors report it and the CLI and
// the Python module show it: bytes and units done out of the total, in a
// named phase ("plan", "write", "commit", ...). Reports come from any thread;
// a callback must be thread-safe.
#ifndef UCP_BASE_PROGRESS_H_
#define UCP_BASE_PROGRESS_H_

#include <cstdint>
#include <functional>
#include <string>

namespace ucp {

struct ProgressEvent {
  std::string phase;
  int64_t bytes_done = 0;
  int64_t bytes_total = 0;
  int64_t units_done = 0;
  int64_t units_total = 0;
};

using ProgressFn = std::function<void(const ProgressEvent&)>;

}  // namespace ucp

#endif  // UCP_BASE_PROGRESS_H_
