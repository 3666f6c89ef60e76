// The metadata DeepSpeed keeps beside each tensor of a universal checkpoint
// (`zero/<param>/<state>.pt` = {['cat_dim'], ['vocab_tensor'],
// ['param_n_sub_params'], ['sub_param_shape'], 'param'}) and the
// `SubparamShape` objects of universal_checkpoint_info, in both directions side
// by side: a MergeRule becomes that dict (what ds_to_universal.py writes) and
// the dict becomes the MergeRule DeepSpeed's loader applies
// (universal_checkpoint.py:load_hp_checkpoint_state).
//
// Example:
//   ValuePtr d = UniversalParamDict(rule, tensor_value);          // encode
//   UCP_ASSIGN_OR_RETURN(MergeRule r, RuleFromUniversalMetadata(*d, name));  // decode
#ifndef UCP_DEEPSPEED_UNIVERSAL_METADATA_H_
#define UCP_DEEPSPEED_UNIVERSAL_METADATA_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "format/pickle/value.h"
#include "proto/ucp.pb.h"

namespace ucp::deepspeed {

// ---- encode ----

// The dict DeepSpeed stores for one state of one param: metadata keys in
// merge_tp_slices's order, then 'param' (the value `param_value`).
pickle::ValuePtr UniversalParamDict(const MergeRule& rule, pickle::ValuePtr param_value);

// The `SubparamShape` object (deepspeed.checkpoint.universal_checkpoint) for a rule.
pickle::ValuePtr SubparamShapeValue(const MergeRule& rule);

// ---- decode ----

// The fields of a DeepSpeed SubparamShape as pickled: the state dict
// {patterns, shape, partition_dim} of a SubparamShape object, or a plain dict
// of the same fields (SubparamShape(**d)); null when `v` is neither.
const pickle::Value* SubparamShapeFields(const pickle::Value& v);
// Its shape and partition_dim. `what` names it in errors; partition_dim is
// required unless `default_partition_dim` is given (SubparamShape's own
// default is 0).
absl::StatusOr<SubParamShape> ParseSubparamShape(const pickle::Value& v, const std::string& what,
                                                 std::optional<int32_t> default_partition_dim);

// The MergeRule DeepSpeed's loader would apply to a universal param dict:
// `cat_dim` (with `param_n_sub_params` or `vocab_tensor`), `sub_param_shape`,
// or none of them (replicated).
absl::StatusOr<MergeRule> RuleFromUniversalMetadata(const pickle::Value& dict, const std::string& name);

}  // namespace ucp::deepspeed

#endif  // UCP_DEEPSPEED_UNIVERSAL_METADATA_H_
