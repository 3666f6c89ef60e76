// Helpers shared by the format/torch tests: temp paths, running /usr/bin/python3 (Debian's, with torch 1.13 + numpy) on a script
// from testdata/.
#ifndef UCP_FORMAT_TORCH_TEST_UTIL_H_
#define UCP_FORMAT_TORCH_TEST_UTIL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/fs.h"

namespace ucp::torch::testing {

// $TEST_TMPDIR/<name> (or /tmp/<name>), parent folders created.
std::string TempPath(const std::string& name);
// Whole files are read with base/fs.h's ReadFileToString and written with
// its WriteFileAtomic.
using ::ucp::ReadFileToString;

// The runfiles path of a data file of this package, e.g.
// "testdata/canonical_dump.py" -> "format/torch/testdata/canonical_dump.py".
std::string PackageDataPath(const std::string& relative);
// external/shared/fixtures/deepspeed-0.14.4
std::string FixturesRoot();
// Every *.pt under `root`, sorted.
std::vector<std::string> FindTorchFiles(const std::string& root);

// Runs `/usr/bin/python3 <script> <args...>`; kInternal with the captured
// stderr tail when it exits non-zero. Returns stdout.
absl::StatusOr<std::string> RunPython(const std::string& script, const std::vector<std::string>& args);

// This process's resident set size in KiB (VmRSS), -1 if unknown.
int64_t RssKiB();
// The first differing line of two texts with a few lines of context, for
// test failure messages ("" when equal).
std::string DiffExcerpt(const std::string& expected, const std::string& actual, int context = 3);

}  // namespace ucp::torch::testing

#endif  // UCP_FORMAT_TORCH_TEST_UTIL_H_
