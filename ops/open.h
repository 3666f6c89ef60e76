// Opening any checkpoint a command reads: the folder resolved and its
// format detected by the registry (formats/builtin/builtin.h,
// formats/format.h), which opens it as a ModelState with every tp merge
// decided (rules/ for what the files leave open).
//
// Example:
//   UCP_ASSIGN_OR_RETURN(auto state, OpenModelState("/ckpt/global_step4", SourceOptions()));
#ifndef UCP_OPS_OPEN_H_
#define UCP_OPS_OPEN_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "base/cluster.h"
#include "base/status_macros.h"
#include "format/torch/mapped_file.h"
#include "format/torch/torch_file.h"
#include "formats/format.h"
#include "rules/resolve.h"
#include "state/model_state.h"

namespace ucp::ops {

// How a source checkpoint is read and how its tp merges are decided.
using SourceOptions = formats::SourceOptions;
// A source opened for a command, with what the command reports of it.
using OpenedSource = formats::OpenedSource;

// Whether `path` (a folder, or a root whose latest file names one) is a
// universal checkpoint.
bool IsUniversalFolder(const std::string& path);

// The source's state as the format reads it, with every rule decided (a
// format whose tp merges are open: SourceFormat::OpenSliced).
absl::StatusOr<std::unique_ptr<rules::ResolvedState>> OpenResolvedState(const std::string& path,
                                                                        const SourceOptions& options);

// The suggested rules (rules/suggest.h) for the params of a source that no
// rule source settles: `ucp rules --suggest`.
absl::StatusOr<rules::SuggestReport> SuggestRules(const std::string& path, const SourceOptions& options);

// Any checkpoint folder. `verify_checksums`: check a ucp universal folder's
// files against its manifest first.
absl::StatusOr<std::unique_ptr<state::ModelState>> OpenModelState(const std::string& path,
                                                                  const SourceOptions& options,
                                                                  bool verify_checksums = false);

// Which sources a command refuses before reading them.
struct OpenRequest {
  // `ucp convert`: a folder of the format its target writes (the target's
  // registry name; "" = none refused).
  std::string refuse_format;
};

// OpenModelState for a command. With a cluster of several ranks (an MPI
// job), rank 0 opens the source and resolves every rule, then describes it
// (a JobDescription) to the other ranks, which open it from the description
// (SourceFormat::Reopen): no other rank reads the source's metadata (layer
// files, the folders of a universal checkpoint) or repeats the decisions and
// their evidence. Every rank returns the same status.
absl::StatusOr<OpenedSource> OpenSource(const std::string& path, const SourceOptions& options, Cluster* cluster,
                                        const OpenRequest& request = OpenRequest());

// Runs `op`, a command that opens its source and writes through
// writers::ExecuteUnits, with a torch::OwedCrcChecks bound to this thread:
// the records the open leaves unchecked (the model-states files' tensors)
// are checked beside the units instead of before them. After a failure, an
// input truncated while it was read or a damaged record is the error
// returned, not what it caused. `cluster`: the job's, or null for one
// process; its rank 0 makes the checks a run's units made on no rank (the
// other ranks leave them to it). `dry_run`: no units run (a --dry_run, which
// makes the checks itself, on every rank).
template <typename R>
absl::StatusOr<R> RunCheckingInputs(const Cluster* cluster, bool dry_run,
                                    const std::function<absl::StatusOr<R>()>& op) {
  torch::OwedCrcChecks owed;
  absl::StatusOr<R> r = op();
  if (!r.ok()) {
    UCP_RETURN_IF_ERROR(torch::MappedFile::CheckAllIntact());
    UCP_RETURN_IF_ERROR(owed.CheckAll());
    return r;
  }
  const bool lead = cluster == nullptr || torch::OwedCrcChecks::MadeByRank(cluster->rank()) || dry_run;
  if (lead && !owed.checked()) UCP_RETURN_IF_ERROR(owed.CheckAll());
  return r;
}

// Notes for a checkpoint written for another tp than it was saved at
// (`target_tp`; 0 = any, a universal checkpoint): params the model's preset
// says every tp rank adds up before the all-reduce (GPT-NeoX's
// gpt_j_residual: the row-parallel biases) are stored once per rank, the
// model using tp x that; ucp writes the stored value unchanged (as
// DeepSpeed's converter does), so the model's value changes with tp. Empty
// when the preset knows of no such param or the flag is off. `preset`: the
// one the rules use; "" or rules::kNoPreset (--preset=none) detects the
// model's family from the names, since the note is about the model.
std::vector<std::string> TpSummedNotes(const state::ModelState& state, const std::string& preset, int target_tp);

}  // namespace ucp::ops

#endif  // UCP_OPS_OPEN_H_
