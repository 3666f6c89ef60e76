// Test helpers: where the real DeepSpeed fixtures are (../shared, passed to
// tests as `data = ["@shared//:fixtures"]`), a fresh temporary folder per
// test, and /usr/bin/python3 (Debian's, with python3-torch) for interop.
#ifndef UCP_TESTING_FIXTURES_H_
#define UCP_TESTING_FIXTURES_H_

#include <string>

#include "absl/status/statusor.h"

namespace ucp::testing {

// `rel` under fixtures/deepspeed-0.14.4/, e.g. "neox-tp2-pp1-dp1/global_step4".
std::string FixturePath(const std::string& rel);
// `rel` under fixtures/deepspeed-<version>/ (e.g. "0.19.5", "gpt-zero3-dp2/global_step4").
std::string VersionFixturePath(const std::string& version, const std::string& rel);
// A new empty folder under TEST_TMPDIR named after `name`.
std::string FreshTempDir(const std::string& name);
// Runs a shell command; returns its stdout, or an error with its stderr.
absl::StatusOr<std::string> RunCommand(const std::string& command);
// The interpreter with torch: /usr/bin/python3.
inline constexpr char kPython[] = "/usr/bin/python3";
// A file of this repository, in the test's runfiles (e.g. "testdata/python/ds_stubs.py").
std::string RunfilePath(const std::string& rel);

}  // namespace ucp::testing

#endif  // UCP_TESTING_FIXTURES_H_
