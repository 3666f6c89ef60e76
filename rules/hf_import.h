// The Hugging Face names of a preset run backwards, for `ucp reshard` of a
// Hugging Face folder (formats/hf): each HF tensor's checkpoint name and
// pipeline layer, from the preset's HfTensorMap.import_name templates
// (rules/presets/*.textproto). The export's mapping (hf_names.h,
// PlanHfNames) stays the one truth: the checkpoint names found here are run
// forwards through it, and each must give back its HF tensor (name, shape,
// rows) or the import is refused.
//
// Only renames are imported: an HF tensor the export builds from part of a
// fused param (HF_SPLIT_QKV, HF_SPLIT_GATE_UP: q/k/v or gate/up rebuilt into
// one) has no import_name yet and is refused, naming it.
//
// Example:
//   UCP_ASSIGN_OR_RETURN(HfImportPlan plan, PlanHfImport(tensors, config, "gpt-neox"));
//   plan.tensors[0].name;  // "0.word_embeddings.weight"
#ifndef UCP_RULES_HF_IMPORT_H_
#define UCP_RULES_HF_IMPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "format/json/json.h"

namespace ucp::rules {

struct HfImportInput {
  std::string name;  // the HF tensor name
  std::vector<int64_t> shape;
};

struct HfImportTensor {
  int input = -1;          // index into the inputs
  std::string name;        // checkpoint name, e.g. "2.attention.dense.weight"
  int layer = -1;          // pipeline layer index (the name's leading number)
  std::string local_name;  // the name after the layer index
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
