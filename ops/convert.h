// `ucp convert`: a DeepSpeed ZeRO checkpoint folder -> a universal checkpoint,
// the drop-in replacement of deepspeed/checkpoint/ds_to_universal.py that
// decides every param's tp merge from rules, patterns, presets or evidence
// (rules/) instead of concatenating unknown params on dim 0.
#ifndef UCP_OPS_CONVERT_H_
#define UCP_OPS_CONVERT_H_

#include <string>

#include "absl/status/statusor.h"
#include "state/model_state.h"
#include "ops/open.h"
#include "rules/hf_names.h"
#include "writers/target_options.h"

namespace ucp::ops {

struct ConvertOptions {
  std::string input_folder;   // a tag folder, or a root with `latest`
  // The universal folder to create; for a Hugging Face Trainer's
  // checkpoint-N given as the input (the folder itself), the new
  // checkpoint-N: <tag>_universal/ + latest_universal + the Trainer's files.
  std::string output_folder;
  // The target (a registered format of family kUniversal): "" or
  // "universal" for DeepSpeed's universal checkpoint, "dcp" for PyTorch
  // Distributed Checkpoint (formats/dcp).
  std::string to;
  // --to=dcp: the entries' names, "checkpoint" (the checkpoint's own) or
  // "hf" (Hugging Face transformers names, as `ucp export --names=hf`
  // writes the weights; every optimizer state split and named alike).
  std::string names = "checkpoint";
  rules::HfOptions hf;  // --names=hf (preset "" = state.rules.preset or detected)
  SourceOptions state;
  writers::UniversalWriteOptions write;
  // Unused patterns of a --rules file are an error (ds_to_universal's strict
  // mode checks its patterns likewise); --no_strict turns that off.
  bool strict = true;
  // > 0: plan only, for this many ranks (or the cluster's size), and describe
  // the plan (writers::DescribePlan) instead of writing anything.
  int dry_run_ranks = 0;
  bool dry_run_units = false;  // with every unit's inputs and outputs
  // The ranks of an MPI job sharing the work (OpenSource, RunPlanOnCluster);
  // null: this process alone.
  Cluster* cluster = nullptr;
};

struct ConvertResult {
  std::string plan;  // the described plan of a dry run
  writers::WriteStats stats;
  std::string summary;   // how many params got each kind from each source
  std::string explain;   // one line per param: name, shape, kind, source, why
  std::vector<std::string> warnings;
  // A Trainer's checkpoint-N given as the input (ops/trainer_folder.h): the
  // folder written, and one line per Trainer file saying what was done.
  std::string trainer_folder;
  std::vector<std::string> trainer_files;
};

absl::StatusOr<ConvertResult> Convert(const ConvertOptions& options);

// The summary and per-param table of a model state's rules.
std::string RuleSummary(const state::ModelInfo& info);
std::string RuleExplanation(const state::ModelInfo& info);
// The note a conversion prints for params of a tp=1 source that nothing
// decides (RuleSource UNDECIDED), "" when there are none.
std::string UndecidedNote(const state::ModelInfo& info);

}  // namespace ucp::ops

#endif  // UCP_OPS_CONVERT_H_
