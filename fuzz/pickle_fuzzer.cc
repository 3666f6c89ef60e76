// libFuzzer target for the pickle VM (format/pickle/reader.h) and, on what it
// accepts, the protocol 2 writer (writer.h).
//
// For every input:
//   1. Unpickle with the default ReadOptions and with tight ones (small caps
//      on memo, stack, nesting, strings, values, digits and self-reference
//      visits). Each either succeeds or fails with a code reader.h documents
//      and a message that starts with "pickle: at byte ". Caps only refuse:
//      when the tight read succeeds, the default one does too, with a
//      DeepEqual tree.
//   2. On success, the tree is acyclic (the reader refuses self-references)
//      and Pickle(tree) succeeds, unless the tree holds a value the writer
//      refuses by design (fuzz_checks.h: HasValueTheWriterRefuses), which
//      must then be kInvalidArgument. Unpickle of the written bytes succeeds
//      and is DeepEqual to the tree, and pickling the re-read tree gives the
//      same bytes again (the writer is deterministic and the reader keeps
//      the sharing the memo encodes). Where the writer normalizes by design
//      (INST/OBJ written as REDUCE, Python 2 names of globals in protocol 3+
//      streams; fuzz_checks.h: RoundTripsExactly), the second write must be
//      a fixed point instead.
// DeepEqual walks shared nodes once per reference, so it runs only on trees
// whose expanded size is bounded; the byte comparison covers the others.
//
// Built with libFuzzer + ASan/UBSan by tools/fuzz.sh; with gcc and
// fuzz_driver_main.cc (//fuzz:pickle_fuzzer) it replays files, which is how
// //fuzz:pickle_fuzzer_replay_test runs the seeds and the hostile corpus.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "format/pickle/reader.h"
#include "format/pickle/value.h"
#include "format/pickle/writer.h"
#include "fuzz/fuzz_checks.h"

namespace ucp::fuzz {
namespace {

// Trees up to this many nodes (expanded) are compared with DeepEqual.
constexpr uint64_t kMaxDeepEqualNodes = uint64_t{1} << 16;

pickle::ReadOptions TightOptions() {
  pickle::ReadOptions o;
  o.max_memo_entries = 64;
  o.max_stack_depth = 256;
  o.max_nesting = 16;
  o.max_string_length = 256;
  o.max_values = 4096;
  o.max_int_digits = 40;
  o.max_self_reference_visits = 1024;
  return o;
}

void CheckUnpickleStatus(const absl::Status& status, const char* what) {
  CheckErrorStatus(status,
                   {absl::StatusCode::kDataLoss, absl::StatusCode::kInvalidArgument,
                    absl::StatusCode::kResourceExhausted, absl::StatusCode::kUnimplemented},
                   "pickle: at byte ", what);
}

bool SmallEnoughForDeepEqual(const pickle::Value& v) {
  return ExpandedSize(v, kMaxDeepEqualNodes) <= kMaxDeepEqualNodes;
}

void CheckRoundTrip(const pickle::Value& tree) {
  (void)ExpandedSize(tree, 1);  // checks that the tree is acyclic
  absl::StatusOr<std::string> bytes = pickle::Pickle(tree);
  if (!bytes.ok()) {
    UCP_FUZZ_CHECK(bytes.status().code() == absl::StatusCode::kInvalidArgument && HasValueTheWriterRefuses(tree),
                   "Pickle of an unpickled tree failed: ", bytes.status().ToString());
    return;
  }
  absl::StatusOr<pickle::ValuePtr> again = pickle::Unpickle(*bytes);
  UCP_FUZZ_CHECK(again.ok(), "Unpickle of the writer's output failed: ", again.status().ToString());
  absl::StatusOr<std::string> bytes_again = pickle::Pickle(**again);
  UCP_FUZZ_CHECK(bytes_again.ok(), "Pickle of the re-read tree failed: ", bytes_again.status().ToString());
  if (RoundTripsExactly(tree)) {
    if (SmallEnoughForDeepEqual(tree)) {
      UCP_FUZZ_CHECK(pickle::DeepEqual(tree, **again), "round trip changed the tree: ", tree.DebugString(300),
                     " became ", (*again)->DebugString(300));
    }
    UCP_FUZZ_CHECK(*bytes_again == *bytes, "pickling the re-read tree gave different bytes (",
                   bytes_again->size(), " vs ", bytes->size(), ")");
    return;
  }
  // The writer normalized something (INST, a Python 2 name): what it wrote
  // must now be a fixed point.
  absl::StatusOr<pickle::ValuePtr> third = pickle::Unpickle(*bytes_again);
  UCP_FUZZ_CHECK(third.ok(), "Unpickle of the second write failed: ", third.status().ToString());
  absl::StatusOr<std::string> bytes_third = pickle::Pickle(**third);
  UCP_FUZZ_CHECK(bytes_third.ok() && *bytes_third == *bytes_again,
                 "the writer's output is not a fixed point after one normalizing round trip: ",
                 bytes_third.status().ToString());
}

void FuzzOne(std::string_view bytes) {
  const absl::StatusOr<pickle::ValuePtr> loose = pickle::Unpickle(bytes);
  CheckUnpickleStatus(loose.status(), "Unpickle (default options)");
  const absl::StatusOr<pickle::ValuePtr> tight = pickle::Unpickle(bytes, TightOptions());
  CheckUnpickleStatus(tight.status(), "Unpickle (tight options)");

  if (tight.ok()) {
    UCP_FUZZ_CHECK(loose.ok(), "tight caps accepted what the defaults refuse: ", loose.status().ToString());
    if (SmallEnoughForDeepEqual(**tight)) {
      UCP_FUZZ_CHECK(pickle::DeepEqual(**tight, **loose), "the trees read with tight and default caps differ");
    }
  }
  if (loose.ok()) CheckRoundTrip(**loose);
}

}  // namespace
}  // namespace ucp::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ucp::fuzz::FuzzOne(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
