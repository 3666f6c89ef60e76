#include "ops/open.h"

#include "base/fs.h"
#include "base/status_macros.h"
#include "deepspeed/checkpoint_files.h"
#include "readers/universal_checkpoint.h"
#include "readers/universal_state.h"

namespace ucp::ops {

readers::ZeroReadOptions SourceOptions::read() const {
  readers::ZeroReadOptions o;
  o.make_vocab_size_divisible_by = make_vocab_size_divisible_by;
  o.tied_layers = tied_layers;
  return o;
}

rules::ResolveOptions SourceOptions::resolve() const {
  rules::ResolveOptions o;
  o.rules = rules;
  o.replicated_mismatch = replicated_mismatch;
  o.num_threads = num_threads;
  return o;
}

bool IsUniversalFolder(const std::string& path) {
  return IsDirectory(JoinPath(path, deepspeed::kUniversalZeroDir)) ||
         (PathExists(JoinPath(path, deepspeed::kLatestUniversalFile)) &&
          !PathExists(JoinPath(path, deepspeed::kLatestFile)));
}

absl::StatusOr<std::unique_ptr<rules::ResolvedState>> OpenZeroState(const std::string& path,
                                                                    const SourceOptions& options) {
  UCP_ASSIGN_OR_RETURN(std::unique_ptr<readers::ZeroCheckpoint> ckpt, readers::ZeroCheckpoint::Open(path));
  UCP_ASSIGN_OR_RETURN(std::unique_ptr<readers::ZeroSlicedState> sliced,
                       readers::ZeroSlicedState::Make(std::move(ckpt), options.read()));
  return rules::ResolveRules(std::move(sliced), options.resolve());
}

absl::StatusOr<std::unique_ptr<deepspeed::ModelState>> OpenModelState(const std::string& path,
                                                                      const SourceOptions& options,
                                                                      bool verify_checksums) {
  if (IsUniversalFolder(path)) {
    readers::UniversalCheckpoint::Options o;
    o.verify_checksums = verify_checksums;
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<readers::UniversalCheckpoint> u, readers::UniversalCheckpoint::Open(path, o));
    std::shared_ptr<const readers::UniversalCheckpoint> shared(std::move(u));
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<readers::UniversalModelState> state,
                         readers::UniversalModelState::Make(shared));
    if (state->layout_recorded()) return std::unique_ptr<deepspeed::ModelState>(std::move(state));
    return rules::ReinterpretDeepSpeedUniversal(std::move(state), shared->model_states().universal_checkpoint_info(),
                                                options.rules, shared->dir());
  }
  UCP_ASSIGN_OR_RETURN(std::unique_ptr<rules::ResolvedState> state, OpenZeroState(path, options));
  return std::unique_ptr<deepspeed::ModelState>(std::move(state));
}

}  // namespace ucp::ops
