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
#include "base/cluster.h"
#include "state/model_state.h"
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
  // A tp=1 source's params no rule covers are whole tensors (e.g. for a
  // reshard to tp=1, which splits nothing): rules::ResolveOptions.
  bool tp1_whole_tensors = false;

  readers::ZeroReadOptions read() const;
  rules::ResolveOptions resolve() const;
};

// Universal when `path` has `zero/` (or a `latest_universal` and no `latest`).
bool IsUniversalFolder(const std::string& path);

// A ZeRO folder with every rule decided.
absl::StatusOr<std::unique_ptr<rules::ResolvedState>> OpenZeroState(const std::string& path,
                                                                    const SourceOptions& options);

// The suggested rules (rules/suggest.h) for the params of a ZeRO folder that
// no rule source settles: `ucp rules --suggest`.
absl::StatusOr<rules::SuggestReport> SuggestZeroRules(const std::string& path, const SourceOptions& options);

// Any checkpoint folder. `verify_checksums`: check a ucp universal folder's
// files against its manifest first.
absl::StatusOr<std::unique_ptr<state::ModelState>> OpenModelState(const std::string& path,
                                                                      const SourceOptions& options,
                                                                      bool verify_checksums = false);

// A source opened for a command, with what the command reports of it.
struct OpenedSource {
  std::unique_ptr<state::ModelState> state;
  std::string kind;  // "zero" or "universal"
  std::string dir;   // the checkpoint folder (a tag folder)
  MergeRules effective_rules;  // the rules in effect (ZeRO sources), for the manifest
  std::string preset;
  bool preset_detected = false;
};

// OpenModelState for a command. With a cluster of several ranks (an MPI
// job), rank 0 opens the source and resolves every rule, then describes it
// (a JobDescription) to the other ranks, which open it from the description:
// no other rank reads the source's metadata (layer files, the folders of a
// universal checkpoint) or repeats the decisions and their evidence. Every
// rank returns the same status. `zero_only`: refuse a universal source.
absl::StatusOr<OpenedSource> OpenSource(const std::string& path, const SourceOptions& options, bool verify_checksums,
                                        bool zero_only, Cluster* cluster);

}  // namespace ucp::ops

#endif  // UCP_OPS_OPEN_H_
