// The partition arithmetic DeepSpeed 0.14.4 uses to lay parameters out in
// files: ZeRO stage 1/2 and BF16_Optimizer flat groups, and PipelineModule's
// layer-to-stage partitioning. Pure functions, no I/O.
//
// Mirrors:
//   deepspeed/runtime/zero/stage_1_and_2.py   (flatten aligned to 2*dp, equal
//       contiguous partitions, groups_padding on the last rank only)
//   deepspeed/runtime/bf16_optimizer.py        (same alignment and partitions)
//   deepspeed/utils/mixed_precision_linkage.py:_init_lp_to_hp_mapping and
//   deepspeed/utils/tensor_fragment.py:get_hp_fragment_mapping
//       (which params a rank holds, fragment_address(numel, start))
//   deepspeed/runtime/utils.py:partition_uniform / partition_balanced
//   deepspeed/runtime/pipe/module.py:_partition_layers
//
// Example:
//   ZeroGroupLayout g = ZeroGroupLayout::Make({3072, 6144, 2048}, /*dp=*/2);
//   g.partition_numel();            // 5632
//   g.Fragments(/*rank=*/1);        // params overlapping rank 1's partition
#ifndef UCP_DEEPSPEED_LAYOUT_MATH_H_
#define UCP_DEEPSPEED_LAYOUT_MATH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ucp::deepspeed {

// One param's piece inside one dp rank's flat partition.
struct ZeroFragment {
  int param_index = 0;        // index in the group's flatten order
  int64_t param_offset = 0;   // first element of the piece inside the flattened param
  int64_t partition_offset = 0;  // fragment_address.start: offset in the rank's partition
  int64_t numel = 0;          // fragment_address.numel
};

// ZeroGroupLayout: one optimizer param group flattened over dp ranks.
class ZeroGroupLayout {
 public:
  // `numels`: the params of the group in flatten order (param_shapes order).
  // The flat buffer is padded at the end to a multiple of 2 * dp.
  static ZeroGroupLayout Make(std::vector<int64_t> numels, int dp);

  int dp() const { return dp_; }
  int64_t numel() const { return numel_; }                // without padding
  int64_t padded_numel() const { return padded_numel_; }
  int64_t partition_numel() const { return padded_numel_ / dp_; }
  int64_t param_start(int param_index) const { return starts_[param_index]; }
  int64_t param_numel(int param_index) const { return numels_[param_index]; }
  int num_params() const { return static_cast<int>(numels_.size()); }
  // groups_padding / group_paddings entry of `rank`: non-zero only on the last.
  int64_t padding(int rank) const { return rank == dp_ - 1 ? padded_numel_ - numel_ : 0; }
  // Elements of the rank's partition that hold params (partition minus padding).
  int64_t lean_partition_numel(int rank) const { return partition_numel() - padding(rank); }
  // Params overlapping [rank * P, (rank + 1) * P), in flatten order, as
  // DeepSpeed's param_slice_mappings lists them. Zero-numel params never
  // appear (DeepSpeed requires fragment_start < fragment_end).
  std::vector<ZeroFragment> Fragments(int rank) const;
  // Fragments of one param over all ranks, in rank order: (rank, fragment).
  std::vector<std::pair<int, ZeroFragment>> FragmentsOfParam(int param_index) const;

 private:
  int dp_ = 1;
  int64_t numel_ = 0;
  int64_t padded_numel_ = 0;
  std::vector<int64_t> numels_;
  std::vector<int64_t> starts_;
};

// deepspeed.runtime.utils.partition_uniform: `num_parts + 1` boundaries.
std::vector<int> PartitionUniform(int num_items, int num_parts);
// deepspeed.runtime.utils.partition_balanced (the linear partition DP with its
// exact tie-breaking), weights as float64 like numpy.
std::vector<int> PartitionBalanced(const std::vector<int64_t>& weights, int num_parts);

// The pipeline partition methods of PipelineModule._partition_layers.
struct PipelineLayerInfo {
  int64_t trainable_numel = 0;  // for `parameters`
  std::string type_name;        // class name of the layer, for `type:REGEX`
};
// method: "uniform", "parameters" or "type:REGEX" (case-insensitive regex search
// over type names). Returns pp + 1 boundaries (stage s owns [parts[s], parts[s+1])).
absl::StatusOr<std::vector<int>> PartitionLayers(const std::vector<PipelineLayerInfo>& layers, int pp,
                                                 const std::string& method);

}  // namespace ucp::deepspeed

#endif  // UCP_DEEPSPEED_LAYOUT_MATH_H_
