// Test helpers over the torch file layer: running testdata/canonical_dump.py.
#ifndef UCP_FORMAT_TORCH_TORCH_TEST_UTIL_H_
#define UCP_FORMAT_TORCH_TORCH_TEST_UTIL_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "format/pickle/value.h"
#include "format/torch/torch_file.h"

namespace ucp::torch::testing {

// canonical_dump.py over `files` in one Python run: path -> dump text (or
// "!error ..." for files torch.load rejected).
absl::StatusOr<std::map<std::string, std::string>> PythonDumps(const std::vector<std::string>& files);

}  // namespace ucp::torch::testing

#endif  // UCP_FORMAT_TORCH_TORCH_TEST_UTIL_H_
