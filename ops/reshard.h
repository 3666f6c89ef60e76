// `ucp reshard`: any checkpoint ucp reads (a universal folder, or a ZeRO,
// ZeRO-3 or native MoE folder read in one pass with no universal checkpoint
// on disk) -> a training checkpoint at a target tp/pp/dp, in the target
// format the registry picks for the model (ops/training_state.h) or the one
// named.
#ifndef UCP_OPS_RESHARD_H_
#define UCP_OPS_RESHARD_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "state/model_state.h"
#include "ops/open.h"
#include "ops/training_state.h"
#include "writers/target_options.h"

namespace ucp::ops {

struct ReshardOptions {
  std::string input_folder;   // universal folder (or root with latest_universal), or ZeRO folder
  // ROOT/TAG; for a Hugging Face Trainer's checkpoint-N given as the input
  // (the folder itself, not its global_stepN), the new checkpoint-N folder:
  // global_stepN/ + latest + the Trainer's files (ops/trainer_folder.h).
  std::string output_folder;
  writers::ZeroWriteOptions write;
  // The target format's registry name (--format), "" = the pick for the
  // model: deepspeed_zero (ZeRO 1/2), deepspeed_zero3 (--zero_stage=3 or a
  // ZeRO-3 source), deepspeed_moe (a native MoE source).
  std::string format;
  // For a ZeRO source: how its tp slices merge.
  SourceOptions zero_source;
  bool verify_checksums = false;  // a universal source's manifest sha256s
  // > 0: plan only, for this many ranks (or the cluster's size), and describe
  // the plan (writers::DescribePlan) instead of writing anything.
  int dry_run_ranks = 0;
  bool dry_run_units = false;  // with every unit's inputs and outputs
  // The ranks of an MPI job sharing the work; null: this process alone.
  Cluster* cluster = nullptr;
};

struct ReshardResult {
  std::string plan;  // the described plan of a dry run
  WrittenCheckpoint write;
  std::string source_kind;  // the source format's kind (formats::SourceFormat::kind)
  state::Topology source;
  std::vector<std::string> notes;  // assumptions about the source (ModelInfo::notes)
  // A Trainer's checkpoint-N: the folder written, and one line per Trainer
  // file saying what was done with it.
  std::string trainer_folder;
  std::vector<std::string> trainer_files;
};

absl::StatusOr<ReshardResult> Reshard(const ReshardOptions& options);

// The flags alone (before anything is read): ranges, an empty output folder.
absl::Status ValidateReshardFlags(const ReshardOptions& options);
// The target against the model: --tp divides the attention heads (and kv
// heads / query groups) the checkpoint's args record; --num_layers is at most
// the source's layers + 1024 trailing layers without tensors.
absl::Status ValidateTargetAgainstModel(const state::ModelState& state, const ReshardOptions& options);

}  // namespace ucp::ops

#endif  // UCP_OPS_RESHARD_H_
