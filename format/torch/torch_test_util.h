// Test helpers over the torch file layer: running testdata/canonical_dump.py,
// rewriting a file through an edit of its tree.
#ifndef UCP_FORMAT_TORCH_TORCH_TEST_UTIL_H_
#define UCP_FORMAT_TORCH_TORCH_TEST_UTIL_H_

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "format/pickle/value.h"
#include "format/torch/torch_file.h"

namespace ucp::torch::testing {

// canonical_dump.py over `files` in one Python run: path -> dump text (or
// "!error ..." for files torch.load rejected).
absl::StatusOr<std::map<std::string, std::string>> PythonDumps(const std::vector<std::string>& files);

// Rewrites the torch file `path` in place (through path + ".new" and a
// rename) with its tree after `edit`: for tests that damage or vary a copy of
// a checkpoint.
absl::Status RewriteTorchFile(const std::string& path, const std::function<void(pickle::Value&)>& edit);

}  // namespace ucp::torch::testing

#endif  // UCP_FORMAT_TORCH_TORCH_TEST_UTIL_H_
