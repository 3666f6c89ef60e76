// The Hugging Face names of a preset run backwards, for `ucp reshard` of a
// Hugging Face folder (formats/hf): each HF tensor's checkpoint name and
// pipeline layer, from the preset's HfTensorMap.import_name templates
// (rules/presets/*.textproto). The export's mapping (hf_names.h,
// PlanHfNames) stays the one truth: the checkpoint names found here are run
// forwards through it, and each must give back its HF tensor (name, shape,
// rows) or the import is refused.
//
// An entry imports config.json's architectures[0] when it is the entry's
// `architecture` or one of its `config_architectures` (megatron-deepspeed's
// Llama entry: LlamaForCausalLM and MistralForCausalLM). Its
// `import_require` conditions refuse config.json values the preset's
// trainer cannot represent, naming the key, its value and why (e.g. a
// Mistral sliding_window below max_position_embeddings); an architecture a
// preset lists in `import_refused` is refused with that preset's reason.
//
// Tied embeddings (config.json tie_word_embeddings true: save_pretrained
// leaves the output layer out) are imported where the preset names a tied
// module (see HfImportTensor::tied_key); a preset without one refuses them.
//
// Fused params (HF_SPLIT_QKV, HF_SPLIT_GATE_UP with an import_name: q/k/v or
// gate/up rebuilt into one, e.g. Megatron-DeepSpeed's query_key_value and
// swiglu dense_h_to_4h) are assembled from their HF parts by the export's
// own rows of each part run in reverse: the export views the fused tensor as
// `groups` equal groups of rows and takes rows [start, start + length) of
// each group for a part (HfImportPart); the parts must tile every group
// exactly. A fused entry without an import_name is refused, naming the
// tensors.
//
// Example:
//   UCP_ASSIGN_OR_RETURN(HfImportPlan plan, PlanHfImport(tensors, config, "gpt-neox"));
//   plan.tensors[0].name;  // "0.word_embeddings.weight"
#ifndef UCP_RULES_HF_IMPORT_H_
#define UCP_RULES_HF_IMPORT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "format/json/json.h"
#include "format/pickle/value.h"

namespace ucp::rules {

struct HfImportInput {
  std::string name;  // the HF tensor name
  std::vector<int64_t> shape;
};

// One HF tensor's rows in a fused checkpoint tensor: the fused tensor is
// `groups` groups of rows; this part is rows [start, start + length) of each
// group (rows [g * length, (g + 1) * length) of the HF tensor for group g).
struct HfImportPart {
  int input = -1;  // index into the inputs
  int64_t groups = 1, start = 0, length = 0;
};

struct HfImportTensor {
  int input = -1;          // index into the inputs (the first part's, for a fused tensor)
  std::vector<int64_t> shape;  // the checkpoint tensor's (the fused shape for a fused one)
  // A fused tensor's parts, ordered by start; empty for a rename.
  std::vector<HfImportPart> parts;
  std::string name;        // checkpoint name, e.g. "2.attention.dense.weight"
  int layer = -1;          // pipeline layer index (the name's leading number; a tied module's first layer)
  std::string local_name;  // the name after the layer index (after "tied_modules.<key>.")
  // A tied module (import_name "tied_modules.<key>.<local> @L1,L2,..." with
  // layer templates: the TiedLayerSpec's layers, e.g. Megatron-DeepSpeed's
  // embedding at 0 and its tied LM head at {layers+4}); taken only when
  // config.json's tie_word_embeddings is true, and the untied entries then
  // are not.
  std::string tied_key;
  std::vector<int> tied_layers;
};

struct HfImportPlan {
  std::string preset, architecture;
  // In checkpoint order: by pipeline layer, then by the preset's entries,
  // then in input order.
  std::vector<HfImportTensor> tensors;
  int num_layers = 0;              // pipeline layer specs (the last index + 1)
  std::vector<int> module_layers;  // the layers holding tensors, ascending
  std::string partition_method;
  std::vector<std::string> dropped;  // HF tensors the preset drops by design (rotary inv_freq, ...)
  // What the export requires of the checkpoint's args for this architecture
  // (HfCondition.arg without absent_ok: e.g. megatron-deepspeed's swiglu),
  // which the imported checkpoint is: a dict (True, or the condition's
  // `equals` as a str). The preset's argument-conditional rules apply with
  // them (fused gate/up as 2 sub-params: ResolveOptions::args).
  pickle::ValuePtr args;
  std::vector<std::string> notes;
};

// `config`: the folder's config.json (its architectures[0] must be the
// preset's architecture; its values are what the forward check's config
// reads). `preset`: a preset with Hugging Face names; "" = the one preset
// that imports config.json's architecture (a note says so), else an error
// listing the presets that import.
absl::StatusOr<HfImportPlan> PlanHfImport(const std::vector<HfImportInput>& tensors, const json::Value& config,
                                          const std::string& preset);

}  // namespace ucp::rules

#endif  // UCP_RULES_HF_IMPORT_H_
