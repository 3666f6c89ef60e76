// What the native MoE and ZeRO-3 writers (formats/deepspeed_moe/moe_writer.h,
// formats/deepspeed_zero3/zero3_writer.h) build alike for a DeepSpeed
// checkpoint at tp = pp = 1: the DeepSpeed version the target is written
// for, the saving job's ds_config retargeted, engine.py's
// checkpoint_parallel_dimensions, and the inputs an optimizer file may read.
//
// Example:
//   UCP_ASSIGN_OR_RETURN(ValuePtr config, deepspeed::RetargetDsConfig(src, writer, /*stage=*/3, sub_group_size));
#ifndef UCP_DEEPSPEED_ZERO_TARGET_PARTS_H_
#define UCP_DEEPSPEED_ZERO_TARGET_PARTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "format/pickle/value.h"
#include "format/torch/torch_file.h"
#include "state/model_state.h"

namespace ucp::deepspeed {

// The DeepSpeed version a target is written for: `target_ds_version`
// (--target_ds_version) when given, else the source's (SourceDsVersion).
std::string TargetDsVersion(const state::CheckpointState& state, const std::string& target_ds_version);

// A copy of the saving job's ds_config for the target: zero_optimization's
// `stage` (when it has one) set to `stage`, its `sub_group_size` set when
// `sub_group_size` > 0, and checkpoint.load_universal (when present) false:
// the target is a plain checkpoint; with `tp` > 0, an AutoTP job's
// tensor_parallel.autotp_size (when present) set to `tp`.
absl::StatusOr<pickle::ValuePtr> RetargetDsConfig(const state::FileValue& config, torch::TorchWriter& writer, int stage,
                                                  int64_t sub_group_size = 0, int tp = 0);

// engine.py _checkpoint_parallel_metadata (0.19.5+) at tp = pp = 1:
// {'pp_degree': 1, 'tp_degree': 1}.
pickle::ValuePtr SingleRankParallelDimensions();

// Every byte range of the source that some param's states read (each once,
// in param order): the inputs of a unit that may read any of them.
std::vector<state::InputRange> EveryParamInput(const state::CheckpointState& state);

}  // namespace ucp::deepspeed

#endif  // UCP_DEEPSPEED_ZERO_TARGET_PARTS_H_
