// How the converter learns a synthetic model's merge rules: the three ways a
// real user tells ucp (conformance/model_gen.h draws one per model).
//
//   rules_source "rules_file"       SpecMergeRules(spec) written as a MergeRules
//                                   textproto and passed as --rules
//   rules_source "checkpoint_info"  SpecCheckpointInfo(spec): DeepSpeed's
//                                   universal_checkpoint_info patterns, stored in
//                                   the model states as Megatron-DeepSpeed does
//                                   (column-parallel params have no pattern:
//                                   DeepSpeed's default, cat on dim 0)
//                                   (with spec.preset "none": --preset=none)
//   rules_source "preset"           --preset=<spec.preset> --original_vocab_size
//   rules_source "detect"           no rule flags: the preset is detected from the
//                                   names (only --original_vocab_size, which no
//                                   name can tell)
//   rules_source "no_flags"         nothing at all: a tp=1 source (Hugging Face
//                                   names, model_gen.h), converted as a user
//                                   would first try it
//
// ZeroSourceOptionsFor(spec, dir) is what a user would pass to `ucp convert`
// or `ucp reshard` for a checkpoint of that model.
//
// Example:
//   UCP_ASSIGN_OR_RETURN(ops::SourceOptions o, ZeroSourceOptionsFor(spec, case_dir));
//   ops::ConvertOptions c;  c.state = o;  ...
#ifndef UCP_CONFORMANCE_SPEC_RULES_H_
#define UCP_CONFORMANCE_SPEC_RULES_H_

#include <string>

#include "absl/status/statusor.h"
#include "ops/open.h"
#include "format/pickle/value.h"
#include "proto/ucp.pb.h"

namespace ucp::conformance {

inline constexpr char kRulesFileSource[] = "rules_file";
inline constexpr char kCheckpointInfoSource[] = "checkpoint_info";
inline constexpr char kPresetSource[] = "preset";
inline constexpr char kDetectSource[] = "detect";
inline constexpr char kNoFlagsSource[] = "no_flags";

// The regex that matches exactly `name` (Python re.match semantics).
std::string ExactPattern(const std::string& name);

// One rule per tensor of the model, exact names, original vocab size set.
MergeRules SpecMergeRules(const ModelSpec& spec);

// The `universal_checkpoint_info` dict of the model states: DeepSpeed's
// pattern lists when the spec's rules source is "checkpoint_info" (names
// generalized over layer numbers where that stays exact), else {}.
// kInvalidArgument for a rule DeepSpeed's patterns cannot express (sub-params
// other than 2 on dim 0 without a sub-param shape).
absl::StatusOr<pickle::ValuePtr> SpecCheckpointInfo(const ModelSpec& spec);

// AutoTP's `universal_checkpoint_info` as DeepSpeed `version` records it
// for an AutoTP model (spec.autotp) saved at `tp` (module_inject/layers.py
// collect_autotp_universal_checkpoint_info, re-derived here from the true
// splits, not from ucp's rules; checked against real checkpoints of 0.18.9,
// 0.19.5 and master, realds family autotp):
//   - before 0.19.5: none at all (null);
//   - 0.19.5: universal_checkpoint_version 0.3, the sorted exact patterns
//     (`^name$`, dots escaped) of row-parallel weights, of params AutoTP left
//     whole (replicated), of vocabulary params (the lm_head cut by rows;
//     then original_vocab_size), parameter_with_sub_params [];
//   - 0.19.6 (master): 0.4, the same lists, parameter_with_sub_params of
//     fused params ({patterns, shape [(sizes...), -1], partition_dim}),
//     autotp_unsupported_parameter_patterns {}, sub_param_shard_widths (each
//     sub-param's AutoTP widths at `tp`) when there are fused params, then
//     original_vocab_size.
absl::StatusOr<pickle::ValuePtr> AutoTpCheckpointInfo(const ModelSpec& spec, const std::string& version, int tp);

// Python's repr() of a value tree of dicts, lists, tuples, strings, ints,
// floats, bools and None (what `print(torch.load(f)[key])` shows), in full:
// for comparing metadata with what a real DeepSpeed run printed.
std::string PyRepr(const pickle::Value& v);

// The ZeroStateOptions a user would give for a checkpoint of `spec`; for a
// rules file, the file is written to `dir`/rules.textproto.
absl::StatusOr<ops::SourceOptions> ZeroSourceOptionsFor(const ModelSpec& spec, const std::string& dir);

}  // namespace ucp::conformance

#endif  // UCP_CONFORMANCE_SPEC_RULES_H_
