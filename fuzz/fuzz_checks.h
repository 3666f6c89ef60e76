// Invariant checks shared by the fuzz targets (pickle_fuzzer.cc,
// torch_file_fuzzer.cc).
//
// A fuzz target must not only survive hostile bytes: what the readers return
// must make sense. A broken invariant is reported by UCP_FUZZ_CHECK, which
// prints what was expected and aborts, so that libFuzzer (or the replay
// driver, fuzz_driver_main.cc) reports the input as a crash.
//
// The value trees a reader returns are DAGs (memo GETs share nodes) and may
// expand exponentially when walked as trees, so the helpers here visit each
// node once and measure the expanded size before anything walks it naively
// (DeepEqual, CanonicalDump).
//
// Example:
//   UCP_FUZZ_CHECK(again.ok(), "re-reading the writer's output: ", again.status().ToString());
//   if (ucp::fuzz::ExpandedSize(*root, 1 << 16) <= 1 << 16) { ... DeepEqual ... }
#ifndef UCP_FUZZ_FUZZ_CHECKS_H_
#define UCP_FUZZ_FUZZ_CHECKS_H_

#include <cstdint>
#include <initializer_list>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "format/pickle/value.h"

namespace ucp::fuzz {

// Prints "<file>:<line>: fuzz invariant failed: <condition>: <message>" to
// stderr and aborts.
[[noreturn]] void FailInvariant(const char* file, int line, const char* condition, const std::string& message);

// UCP_FUZZ_CHECK(condition, message parts...): the parts go to absl::StrCat.
#define UCP_FUZZ_CHECK(condition, ...)                                                              \
  do {                                                                                             \
    if (!(condition)) ::ucp::fuzz::FailInvariant(__FILE__, __LINE__, #condition, absl::StrCat(__VA_ARGS__)); \
  } while (0)

// The number of nodes of `root` walked as a tree (shared nodes counted once
// per reference), saturated at `cap` + 1. Visits each distinct node once.
// Fails the invariant that reader output is acyclic when it finds a cycle.
uint64_t ExpandedSize(const pickle::Value& root, uint64_t cap);

// Whether `root` holds a value the pickle writer refuses by design (with
// kInvalidArgument), although the reader accepts it:
//   - a str that is not UTF-8: reader.h keeps the raw bytes of a Python 2
//     str (BINSTRING, SHORT_BINSTRING, STRING); writer_test's
//     InvalidUtf8IsRefused pins the refusal;
//   - a global whose module or name contains a newline: only STACK_GLOBAL
//     can make one, and protocol 2's GLOBAL is line based.
// Lone surrogates are UTF-8 here, as both sides read them ('surrogatepass').
bool HasValueTheWriterRefuses(const pickle::Value& root);

// Whether a write (writer.h, protocol 2) and a read give back a tree DeepEqual
// to `root`, judged from the parts the writer is documented to normalize:
// false when `root` holds an INST/OBJ object (written as REDUCE, and then
// decoded like one: an INST of collections.OrderedDict comes back as an
// OrderedDict) or a global that protocol 2's name mapping does not give back
// unchanged (a Python 2 name such as `copy_reg` in a protocol 3+ stream,
// which the reader keeps and, at protocol 2, renames; CPython does the same).
// Each distinct global is probed through Pickle and Unpickle.
bool RoundTripsExactly(const pickle::Value& root);

// Fails unless `status` is OK or has one of `codes`, and unless its message
// starts with `prefix` (readers promise to name the input first).
void CheckErrorStatus(const absl::Status& status, std::initializer_list<absl::StatusCode> codes,
                      const std::string& prefix, const char* what);

}  // namespace ucp::fuzz

#endif  // UCP_FUZZ_FUZZ_CHECKS_H_
