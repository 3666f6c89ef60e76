// The Hugging Face Trainer's `checkpoint-N/` folder around a DeepSpeed
// checkpoint, for `ucp reshard` and `ucp convert` given such a folder: which
// of its files a job at another topology needs as they are, which depend on
// the number of processes and how they are rewritten, and what is left out
// (FINDINGS of transformers 5.12's trainer.py, `_load_rng_state`,
// `_load_from_checkpoint`, integrations/deepspeed.py deepspeed_load_checkpoint):
//
//   global_stepN/, latest          written by the reshard / convert itself
//   rng_state_<i>.pth              one per process (a 1-process run reads
//                                  rng_state.pth): process i < new world size
//                                  gets the source's file of process i
//                                  (rng_state.pth for 1 process; the source's
//                                  rng_state.pth or rng_state_0.pth for process
//                                  0); processes the source had none for get
//                                  none (the Trainer logs and goes on). For a
//                                  universal checkpoint (any number of
//                                  processes): every file as it is, plus
//                                  rng_state.pth or rng_state_0.pth (process
//                                  0's) when the source has only the other
//   trainer_state.json             copied: global_step, max_steps, total_flos do
//                                  not depend on dp; `epoch` (global_step /
//                                  steps per epoch) is the old dp's, and the
//                                  Trainer recomputes epochs from global_step
//   training_args.bin              copied: a pickled TrainingArguments whose
//                                  distributed_state records the old process
//                                  count; the Trainer never reads it back
//   scheduler.pt, config.json, generation_config.json, model.safetensors,
//   zero_to_fp32.py, tokenizer files, ...   copied (dp-independent)
//   other global_step*/ folders, latest_universal, other folders: left out
//
// Pickled files are never executed; one naming a code-execution global is
// refused unless allow_unsafe_pickles (as every checkpoint file).
//
// Example:
//   std::vector<std::string> summary;
//   UCP_RETURN_IF_ERROR(WriteTrainerFiles(src, "global_step3", {"global_step3"}, 1, false, out, &summary));
#ifndef UCP_OPS_TRAINER_FOLDER_H_
#define UCP_OPS_TRAINER_FOLDER_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "writers/plan.h"

namespace ucp::ops {

// The Trainer's checkpoint-N folder when `input` (a command's input path)
// names it, resolved through its `latest` to `source_dir`; else "". Given
// the tag folder itself, commands write only the DeepSpeed checkpoint.
absl::StatusOr<std::string> TrainerFolderInput(const std::string& input, const std::string& source_dir);

// A new checkpoint-N at `output_folder`, in a staging folder renamed into
// place when complete: `plan` run into OUTPUT/`inner_name` (with its latest
// file in OUTPUT), then the Trainer's files of `trainer_dir`
// (WriteTrainerFiles). The output may not be or overlap `trainer_dir`.
absl::StatusOr<writers::WriteStats> WriteTrainerFolder(const writers::Plan& plan, const writers::RunOptions& run,
                                                       const std::string& output_folder, const std::string& inner_name,
                                                       const std::string& trainer_dir,
                                                       const std::vector<std::string>& skip, int world_size,
                                                       bool allow_unsafe_pickles, std::vector<std::string>* summary);

// Writes into `out_dir` the Trainer's files of `source_dir` (a checkpoint-N)
// for a job of `world_size` processes (0 = any, for a universal checkpoint:
// every rng_state file as it is, and process 0's as both rng_state.pth and
// rng_state_0.pth). `skip`: entries of source_dir the
// caller writes itself or leaves out on purpose (the tag folder, `latest`).
// `summary` gets one line per file: what was done and why.
absl::Status WriteTrainerFiles(const std::string& source_dir, const std::vector<std::string>& skip, int world_size,
                               bool allow_unsafe_pickles, const std::string& out_dir,
                               std::vector<std::string>* summary);

}  // namespace ucp::ops

#endif  // UCP_OPS_TRAINER_FOLDER_H_
