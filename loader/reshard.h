// `ucp reshard`: any checkpoint (a universal folder, or a ZeRO folder read in
// one pass with no universal checkpoint on disk) -> a regular ZeRO checkpoint
// at a target tp/pp/dp (zero_writer.h).
#ifndef UCP_LOADER_RESHARD_H_
#define UCP_LOADER_RESHARD_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "converter/zero_state.h"
#include "deepspeed/model_state.h"
#include "loader/zero_writer.h"

namespace ucp::loader {

struct ReshardOptions {
  std::string input_folder;   // universal folder (or root with latest_universal), or ZeRO folder
  std::string output_folder;  // ROOT/TAG
  ZeroWriteOptions write;
  // For a ZeRO source: how its tp slices merge.
  converter::ZeroStateOptions zero_source;
  bool verify_checksums = false;  // a universal source's manifest sha256s
};

// Opens `path` as a ModelState: universal when it has `zero/` (or a
// `latest_universal` and no `latest`), else ZeRO.
absl::StatusOr<std::unique_ptr<deepspeed::ModelState>> OpenModelState(
    const std::string& path, const converter::ZeroStateOptions& zero_options, bool verify_checksums = false);

struct ReshardResult {
  ZeroWriteResult write;
  std::string source_kind;  // "universal" or "zero"
  deepspeed::Topology source;
  std::vector<std::string> notes;  // assumptions about the source (ModelInfo::notes)
};

absl::StatusOr<ReshardResult> Reshard(const ReshardOptions& options);

}  // namespace ucp::loader

#endif  // UCP_LOADER_RESHARD_H_
