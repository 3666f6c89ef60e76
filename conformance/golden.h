// Goldens: a case (GoldenCase: a synthetic model, source and target
// topologies, seed) and a description of every file ucp writes for it
// (Golden: per file its top-level keys, every tensor's shape, dtype and
// sha256, its top-level scalars and a digest of its whole structure), kept
// as textprotos under testdata/golden/<name>/ (case.textproto,
// golden.textproto). No checkpoint is stored: the case regenerates them.
//
//   source/   save(M, source)                       a DeepSpeed ZeRO checkpoint
//   universal/ convert(source)                      ucp's universal checkpoint
//   target/   reshard(universal, target)            the ZeRO checkpoint at the target
//
// The golden is also the yardstick for other converters: CheckUniversal
// compares any universal folder (e.g. one written by a patched DeepSpeed
// ds_to_universal.py from WriteGoldenSource's checkpoint) with the golden's
// universal/ part and reports every param that differs.
//
// Example:
//   UCP_ASSIGN_OR_RETURN(GoldenCase c, ReadGoldenCase("testdata/golden/neox_zero1_mp2_to_mp1"));
//   UCP_ASSIGN_OR_RETURN(Golden g, MakeGolden(c, "/tmp/work"));
//   std::vector<std::string> diffs = CompareGoldens(want, g);
#ifndef UCP_CONFORMANCE_GOLDEN_H_
#define UCP_CONFORMANCE_GOLDEN_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/ucp.pb.h"

namespace ucp::conformance {

inline constexpr char kGoldenCaseFile[] = "case.textproto";
inline constexpr char kGoldenFile[] = "golden.textproto";

absl::StatusOr<GoldenCase> ReadGoldenCase(const std::string& dir);
absl::StatusOr<Golden> ReadGolden(const std::string& dir);

// The folders a golden case's run wrote.
struct GoldenRun {
  std::string source;     // <work>/source/<tag>
  std::string universal;  // <work>/universal/<tag>_universal
  std::string target;     // <work>/target/<tag>
};
// Writes only the source checkpoint (what DeepSpeed's ds_to_universal.py
// would be given) into `root`/<tag>; returns the tag folder.
absl::StatusOr<std::string> WriteGoldenSource(const GoldenCase& c, const std::string& root);
// Runs the case: save at the source topology, convert, reshard to the target.
absl::StatusOr<GoldenRun> RunGoldenCase(const GoldenCase& c, const std::string& work);

// Descriptions of every .pt file under `dir`, paths prefixed with `prefix`/.
absl::StatusOr<std::vector<GoldenFile>> DescribeFolder(const std::string& dir, const std::string& prefix);
// Runs the case and describes its universal and target folders.
absl::StatusOr<Golden> MakeGolden(const GoldenCase& c, const std::string& work);

// Every difference between two goldens (files, keys, tensors, scalars, structure).
std::vector<std::string> CompareGoldens(const Golden& want, const Golden& got);

// A universal folder against the golden's universal/ part: differences
// grouped by param ("" for files that belong to no param: optimizer state,
// model states). Files only ucp writes (ucp_module/, the manifest) are
// not required.
absl::StatusOr<std::map<std::string, std::vector<std::string>>> CheckUniversal(const Golden& golden,
                                                                             const std::string& universal);

// Regenerates `dir`/golden.textproto from `dir`/case.textproto.
absl::Status UpdateGolden(const std::string& dir, const std::string& work);

// The assertion DeepSpeed 0.14.4's universal_checkpoint.py:load_hp_checkpoint_state
// makes when a universal param does not fit the tp slice it loads into.
std::string DeepSpeedSliceAssertion(int64_t full_numel, int64_t slice_numel, int tp_world_size);

}  // namespace ucp::conformance

#endif  // UCP_CONFORMANCE_GOLDEN_H_
