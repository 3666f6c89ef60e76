// Hugging Face names and config.json for `ucp export --names=hf`, from the
// presets' data (Preset.hf: HfArchitecture messages in
// rules/presets/*.textproto): which architecture represents a checkpoint
// (conditions on its param names and args, each refusal with its reason),
// each checkpoint tensor's HF name(s), how fused tensors split (query/key/
// value rows, swiglu gate/up rows), and each config.json field's source
// (tensor shapes, args, defaults).
//
// Fused layouts (see the export notes): Megatron-DeepSpeed's
// `query_key_value` rows are grouped per kv head, [nkv, g + 2, d] (g query
// heads, then k, then v; tp-invariant), in versions before 676a482c, and
// [Q_r; K_r; V_r] blocks per tp rank from then on (the training's args then
// have `ds_sequence_parallel_fpdt`): `qkv_layout` auto picks by that marker.
// Swiglu `dense_h_to_4h` is [gate; up] once merged as two sub-params, or
// [gate_r; up_r] per tp rank when merged by plain concatenation.
//
// Example:
//   HfOptions o;
//   o.preset = "megatron-deepspeed";
//   UCP_ASSIGN_OR_RETURN(HfNamePlan plan, PlanHfNames(state.info(), order, args, o));
#ifndef UCP_RULES_HF_NAMES_H_
#define UCP_RULES_HF_NAMES_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "state/model_state.h"
#include "format/json/json.h"
#include "format/pickle/value.h"
#include "proto/ucp.pb.h"

namespace ucp::rules {

// One HF tensor: rows of a checkpoint param. The param's full tensor,
// viewed as `groups` equal groups of rows (dim 0), contributes rows
// [start, start + length) of each group, concatenated; `groups` = 1 and
// `length` = all rows for a plain rename.
struct HfTensor {
  std::string name;
  int param = -1;  // index into ModelInfo::params
  int64_t groups = 1, start = 0, length = 0;
  // The value is this many times the param (the sum of its identical tp
  // copies); 1 = as is.
  int64_t scale = 1;
  std::vector<int64_t> shape;
};

struct HfNamePlan {
  std::string preset;
  std::string architecture;
  std::vector<HfTensor> tensors;
  json::Value config;  // without torch_dtype, which the caller knows
  std::vector<std::string> dropped;  // checkpoint names with no HF counterpart, by design
  std::vector<std::string> notes;
  // `config` is the checkpoint's own config.json (HfOptions), to be written
  // byte for byte (HfArchitecture.config_architectures).
  bool config_verbatim = false;
};

struct HfOptions {
  std::string preset;                // "" = detect from the param names
  std::string qkv_layout = "auto";   // auto, grouped, block
  // config.json values given by the user: key -> JSON literal (`--hf_config`).
  std::vector<std::pair<std::string, std::string>> config;
  // The checkpoint's own config.json (a Trainer's checkpoint-N holds one;
  // formats::HfFolderOf): its contents ("" = none), model_type and
  // architectures[0].
  std::string checkpoint_config_json;
  std::string checkpoint_model_type;
  std::string checkpoint_architecture;
};

// `order`: indices into info.params to export, in output order (tied
// aliases excluded). `args`: the checkpoint's args as a dict (or null).
absl::StatusOr<HfNamePlan> PlanHfNames(const state::ModelInfo& info, const std::vector<int>& order,
                                       const pickle::Value* args, const HfOptions& options);

// The params that every tp rank holds a copy of and adds up before the
// all-reduce, so that the model uses tp x the stored value: those a tensor
// entry of the preset's Hugging Face mapping marks sum_tp_if, where the
// config flag it names is true from the checkpoint's args (or its default).
// Independent of whether the rest of the model has a Hugging Face
// equivalent. Each as (param name, where the flag came from). `preset`: the
// model's preset, as the caller resolved it (named by the user or detected);
// "" is no preset, and then there are none.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> TpSummedParams(const state::ModelInfo& info,
                                                                                const pickle::Value* args,
                                                                                const std::string& preset);

}  // namespace ucp::rules

#endif  // UCP_RULES_HF_NAMES_H_
