// Helpers for the format/pickle tests: a canonical text form of value trees
// that C++ and Python (testdata/pickle_interop.py) compute alike, files and
// temp dirs, running Debian's /usr/bin/python3, and a minimal reader for the
// stored zips torch writes (the real one lives in format/torch).
//
// Example:
//   EXPECT_EQ(CanonicalRepr(*value), python_output.at("case.p2.pkl"));
#ifndef UCP_FORMAT_PICKLE_TEST_UTIL_H_
#define UCP_FORMAT_PICKLE_TEST_UTIL_H_

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "base/fs.h"
#include "format/pickle/value.h"

namespace ucp::pickle::testing {

// The canonical repr documented in testdata/pickle_interop.py: equal for two
// trees iff DeepEqual, except where Python cannot tell the difference: sets
// are unordered, a NEWOBJ_EX object with no kwargs reads as NEWOBJ, an
// OrderedDict with an empty dict_state as one without, and INST objects as
// REDUCE (the writer writes them so).
std::string CanonicalRepr(const Value& v);

std::string Hex(std::string_view bytes);

// An Object: `callable` applied (`how`) to the tuple of `args`, with `state`.
ValuePtr Obj(ValuePtr callable, ObjectHow how, std::vector<ValuePtr> args, ValuePtr state = nullptr);

// Whole files are read with base/fs.h's ReadFileToString and written with
// its WriteFileAtomic.
// A fresh directory under $TEST_TMPDIR (or /tmp).
std::string MakeTempDir(std::string_view prefix);
// Regular files directly in `dir`, sorted.
std::vector<std::string> ListDir(const std::string& dir);

// Runs `/usr/bin/python3 -I <args>` (Debian's Python with torch and numpy,
// not the pyenv one on PATH); stdout on exit status 0, else an error with
// the status. stderr goes to the test log.
absl::StatusOr<std::string> RunPython(const std::vector<std::string>& args);
// Path of testdata/pickle_interop.py in the runfiles.
std::string InteropScript();
// Splits "<name>\t<text>" lines into a map.
std::map<std::string, std::string> ParseTabbedLines(std::string_view output);

// The fixtures folder (`@shared//:fixtures`, deepspeed-0.14.4) in the runfiles.
absl::StatusOr<std::string> FixturesDir();
// Every file under `dir` (recursively) whose name ends with `suffix`, sorted.
std::vector<std::string> FindFiles(const std::string& dir, std::string_view suffix);

// The member of a stored (uncompressed) zip whose name ends with `suffix`.
absl::StatusOr<std::string> ReadStoredZipMember(const std::string& zip_bytes, std::string_view suffix);

}  // namespace ucp::pickle::testing

#endif  // UCP_FORMAT_PICKLE_TEST_UTIL_H_
