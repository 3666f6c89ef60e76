// `ucp export`: plain weights out of any checkpoint ucp reads (a ZeRO folder
// at any tp/pp/dp, or a universal folder), for inference and the Hugging
// Face Hub: what DeepSpeed's utils/zero_to_fp32.py produces, without its
// limits (tp > 1, pipeline layer files, the bf16 optimizer) and streamed
// from the memory-mapped inputs into the output files.
//
// Which tensors, in which order, with which names (--names=checkpoint, the
// default) follows zero_to_fp32.py (deepspeed/utils/zero_to_fp32.py,
// _get_fp32_state_dict_from_zero_checkpoint): the persistent buffers, the
// frozen params, the trainable params in the optimizer's flattening order
// (`param_shapes`: group after group), then tied aliases (`shared_params`,
// alias -> owner, the owner's tensor under a second name). Names are the
// checkpoint's own: a plain module's state-dict names; for a PipelineModule
// its module paths `<layer index>.<name in the layer file>` and
// `tied_modules.<key>.<name>` for tied modules, i.e. what the PipelineModule
// (at pp = 1) would give from state_dict() and take in load_state_dict().
//
// Values: --weights=fp32 (default) exports the fp32 masters of trainable
// params (the merged optimizer partitions, bitwise); --weights=lp the module
// weights (bf16/fp16 in mixed precision), or, for a universal checkpoint that
// has none, the fp32 masters rounded to the lp dtype (round to nearest even,
// which is how DeepSpeed's optimizers derive the lp weights after each step).
// Frozen params and buffers exist only as module weights. Vocab padding is
// stripped when the original vocab size is known (VOCAB rules).
//
// Dtypes: --dtype=source (default) writes what zero_to_fp32.py writes:
// trainable params in the dtype of the chosen weights, frozen params as
// stored, buffers as float32 (its `.float()`, integer buffers included) with
// --weights=fp32 and as stored with --weights=lp. --dtype=fp32|bf16|fp16
// converts every floating tensor (integer buffers keep their dtype).
//
// Differences from zero_to_fp32.py, on purpose: frozen params of ZeRO
// stage 1 checkpoints are exported (zero_to_fp32 loses them, their
// `frozen_param_fragments` being None; --exclude_frozen_parameters drops
// them), and a safetensors file holds a tied alias once (safetensors refuses
// two names on one storage; zero_to_fp32 --safe_serialization fails there):
// its __metadata__ maps alias -> owner.
//
// --names=hf: Hugging Face transformers names and config.json, from the
// preset's data (rules/hf_names.h).
//
// Example:
//   ExportOptions o;
//   o.input_folder = "/ckpt/global_step4";
//   o.output_folder = "/out/hf";
//   UCP_ASSIGN_OR_RETURN(ExportResult r, Export(o));
#ifndef UCP_OPS_EXPORT_H_
#define UCP_OPS_EXPORT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/format.h"
#include "state/model_state.h"
#include "ops/open.h"
#include "rules/hf_names.h"
#include "writers/target_options.h"

namespace ucp::ops {

struct ExportOptions {
  std::string input_folder;   // a ZeRO tag folder (or root with `latest`), or a universal folder
  std::string output_folder;  // created (atomically)
  SourceOptions state;
  std::string weights = "fp32";      // fp32 | lp
  std::string dtype = "source";      // source | fp32 | bf16 | fp16
  std::string names = "checkpoint";  // checkpoint | hf
  rules::HfOptions hf;               // --names=hf (preset "" = state.rules.preset or detected)
  bool exclude_frozen_parameters = false;
  // The weights target (formats/weights): "safetensors" or "torch".
  std::string format = "safetensors";
  writers::ExportWriteOptions write;  // `format` sets write.format
};

struct ExportResult {
  writers::WriteStats stats;
  std::string architecture;  // --names=hf
  std::vector<std::string> notes;
};

// The tensors of an export of `state` and, for --names=hf, config.json's
// contents (else ""). `notes` collects what the user should know.
struct ExportContents {
  std::vector<writers::ExportTensor> tensors;
  std::string config_json;
  std::string architecture;
  std::vector<std::string> notes;
};
absl::StatusOr<ExportContents> PlanExportContents(const state::ModelState& state, const ExportOptions& options);

// `hf` for a checkpoint inside a Hugging Face model folder (`folder`,
// formats::HfFolderOf: a Trainer's checkpoint-N): its config.json, model_type
// and architectures[0], which decide the architecture; `hf` as is when the
// folder has no config.json.
rules::HfOptions WithCheckpointConfig(rules::HfOptions hf, const formats::HfFolder& folder);

// Opens the input, plans, writes.
absl::StatusOr<ExportResult> Export(const ExportOptions& options);

}  // namespace ucp::ops

#endif  // UCP_OPS_EXPORT_H_
