// The files of a Hugging Face model folder that say which model a checkpoint
// is (config.json) and what from_pretrained / AutoTokenizer read beside it
// (generation_config.json, tokenizer files, ...), kept beside a DeepSpeed
// checkpoint's tags as a Trainer's checkpoint-N keeps them (formats::HfFolderOf
// finds them there): `ucp reshard` of a Hugging Face folder writes them
// beside `latest`, and a reshard or convert of a checkpoint that has them
// beside its tags carries them to the output's root. `ucp export
// --names=hf` (and convert --to=dcp --names=hf) then takes the model from
// that config.json (rules::HfOptions::checkpoint_config_json) instead of the
// Megatron args such a checkpoint does not have: the import writes no args,
// since Megatron-DeepSpeed checks the args it finds against its own.
//
// Each file is copied byte for byte (atomically) after the checkpoint is
// committed, like `latest`; a file of the same name already in the output's
// root with other bytes stops the command before anything is written.
//
// Example:
//   UCP_ASSIGN_OR_RETURN(std::string from, ModelFilesSource("hf", "/models/llama"));
//   UCP_ASSIGN_OR_RETURN(auto stats, RunPlanWithModelFiles(plan, "/ds/run1/global_step0", run, nullptr, from));
#ifndef UCP_OPS_MODEL_FOLDER_H_
#define UCP_OPS_MODEL_FOLDER_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/cluster.h"
#include "writers/plan.h"

namespace ucp::ops {

// config.json first, then the files from_pretrained and AutoTokenizer read
// beside it.
const std::vector<std::string>& ModelFolderFileNames();

// The folder whose model files go with a command's output, for a source of
// kind `source_kind` opened at `source_dir`: the folder itself for a Hugging
// Face folder ("hf"); else the folder holding the checkpoint when it has a
// config.json (a JSON object) and is not a Trainer's checkpoint-N (whose
// files the Trainer-folder outputs carry, ops/trainer_folder.h); else "".
absl::StatusOr<std::string> ModelFilesSource(const std::string& source_kind, const std::string& source_dir);

// The folder a checkpoint folder's `latest` file goes to (its parent).
std::string OutputRoot(const std::string& output_folder);

// A model file of `from_dir` that `out_root` already holds with other bytes
// is an error naming both; "" from_dir checks nothing.
absl::Status CheckModelFilesTarget(const std::string& from_dir, const std::string& out_root);

// Copies the model files `from_dir` has into `out_root` (identical ones are
// left alone); a note lists them.
absl::Status CopyModelFiles(const std::string& from_dir, const std::string& out_root, std::vector<std::string>* notes);

// writers::RunPlan, or RunPlanOnCluster with a cluster, with the model files
// of `model_dir` ("" = none) beside the output: checked before anything is
// written, copied (by rank 0) once the checkpoint is committed; the copy's
// note joins the stats' notes.
absl::StatusOr<writers::WriteStats> RunPlanWithModelFiles(const writers::Plan& plan, const std::string& output_folder,
                                                          const writers::RunOptions& run, Cluster* cluster,
                                                          const std::string& model_dir);

}  // namespace ucp::ops

#endif  // UCP_OPS_MODEL_FOLDER_H_
