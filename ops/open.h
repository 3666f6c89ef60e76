// Opening any checkpoint folder as a ModelState: the reader for its kind
// (readers/), then the rules (rules/) for what the files leave open.
//
//   ZeRO folder      -> readers::ZeroSlicedState -> rules::ResolveRules
//   universal folder -> readers::UniversalModelState
//                       (-> rules::ReinterpretDeepSpeedUniversal when DeepSpeed wrote it)
//
// Example:
//   UCP_ASSIGN_OR_RETURN(auto state, OpenModelState("/ckpt/global_step4", SourceOptions()));
#ifndef UCP_OPS_OPEN_H_
#define UCP_OPS_OPEN_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "deepspeed/model_state.h"
#include "readers/zero_checkpoint.h"
#include "readers/zero_state.h"
#include "rules/resolve.h"
#include "rules/rules.h"

namespace ucp::ops {

// How a source checkpoint is read and how its tp merges are decided.
struct SourceOptions {
  rules::RuleResolver::Options rules;
  rules::ReplicatedMismatch replicated_mismatch = rules::ReplicatedMismatch::kError;
  int num_threads = 0;  // 0 = all cores
  int64_t make_vocab_size_divisible_by = 0;  // 0 = from the checkpoint's args
  // Pipeline layers that use each tied module (readers::ZeroReadOptions).
  std::map<std::string, std::vector<int>> tied_layers;

  readers::ZeroReadOptions read() const;
  rules::ResolveOptions resolve() const;
};

// Universal when `path` has `zero/` (or a `latest_universal` and no `latest`).
bool IsUniversalFolder(const std::string& path);

// A ZeRO folder with every rule decided.
absl::StatusOr<std::unique_ptr<rules::ResolvedState>> OpenZeroState(const std::string& path,
                                                                    const SourceOptions& options);

// Any checkpoint folder. `verify_checksums`: check a ucp universal folder's
// files against its manifest first.
absl::StatusOr<std::unique_ptr<deepspeed::ModelState>> OpenModelState(const std::string& path,
                                                                      const SourceOptions& options,
                                                                      bool verify_checksums = false);

}  // namespace ucp::ops

#endif  // UCP_OPS_OPEN_H_
