#include "loader/reshard.h"

#include "base/fs.h"
#include "base/status_macros.h"
#include "deepspeed/checkpoint_files.h"
#include "deepspeed/universal_checkpoint.h"
#include "loader/universal_state.h"

namespace ucp::loader {
namespace {

bool IsUniversal(const std::string& path) {
  return IsDirectory(JoinPath(path, deepspeed::kUniversalZeroDir)) ||
         (PathExists(JoinPath(path, deepspeed::kLatestUniversalFile)) &&
          !PathExists(JoinPath(path, deepspeed::kLatestFile)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<deepspeed::ModelState>> OpenModelState(
    const std::string& path, const converter::ZeroStateOptions& zero_options, bool verify_checksums) {
  if (IsUniversal(path)) {
    deepspeed::UniversalCheckpoint::Options o;
    o.verify_checksums = verify_checksums;
    UCP_ASSIGN_OR_RETURN(auto u, deepspeed::UniversalCheckpoint::Open(path, o));
    std::shared_ptr<const deepspeed::UniversalCheckpoint> shared(std::move(u));
    UniversalModelState::Options uo;
    uo.rules = zero_options.rules;
    UCP_ASSIGN_OR_RETURN(auto state, UniversalModelState::Make(shared, uo));
    return std::unique_ptr<deepspeed::ModelState>(std::move(state));
  }
  UCP_ASSIGN_OR_RETURN(auto z, deepspeed::ZeroCheckpoint::Open(path));
  std::shared_ptr<const deepspeed::ZeroCheckpoint> shared(std::move(z));
  UCP_ASSIGN_OR_RETURN(auto state, converter::ZeroModelState::Make(shared, zero_options));
  return std::unique_ptr<deepspeed::ModelState>(std::move(state));
}

absl::StatusOr<ReshardResult> Reshard(const ReshardOptions& options) {
  UCP_ASSIGN_OR_RETURN(std::unique_ptr<deepspeed::ModelState> state,
                       OpenModelState(options.input_folder, options.zero_source, options.verify_checksums));
  ReshardResult result;
  result.source_kind = IsUniversal(options.input_folder) ? "universal" : "zero";
  result.source = state->info().source_topology;
  result.notes = state->info().notes;
  UCP_ASSIGN_OR_RETURN(result.write, WriteZeroCheckpoint(*state, options.output_folder, options.write));
  return result;
}

}  // namespace ucp::loader
