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

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace ucp::deepspeed {

// Which dp ranks record the alignment padding in `group_paddings`, and so
// save their fp32 partition (and elastic states) without it.
//   kLastRank: DeepSpeed <= 0.16.3 ZeRO 1/2, and BF16_Optimizer in every
//     version: the last rank records padded_numel - numel (which may exceed
//     its partition for a tiny group; DeepSpeed then slices group[:negative]).
//   kPerRank: DeepSpeed >= 0.16.4 ZeRO 1/2 (stage_1_and_2.py, "Record padding
//     required for alignment"): every rank records the padding inside its own
//     partition, so a rank whose partition is all padding saves 0 elements.
enum class PaddingConvention { kLastRank, kPerRank };
const char* PaddingConventionName(PaddingConvention c);

// A DeepSpeed version string ("0.16.4", "0.19.5+cf443004", "0.14.5.dev0").
struct DsVersion {
  int major = 0, minor = 0, patch = 0;
  bool operator<(const DsVersion& o) const {
    return major != o.major ? major < o.major : minor != o.minor ? minor < o.minor : patch < o.patch;
  }
  bool operator>=(const DsVersion& o) const { return !(*this < o); }
  bool operator==(const DsVersion& o) const { return major == o.major && minor == o.minor && patch == o.patch; }
};
// The leading MAJOR.MINOR[.PATCH] of `s`; an error for anything else.
absl::StatusOr<DsVersion> ParseDsVersion(const std::string& s);
// The padding convention DeepSpeed `version` writes for a ZeRO 1/2 optimizer
// (`bf16_optimizer`: BF16_Optimizer, last rank in every version).
PaddingConvention PaddingConventionOf(const DsVersion& version, bool bf16_optimizer);

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
  static ZeroGroupLayout Make(std::vector<int64_t> numels, int dp,
                              PaddingConvention convention = PaddingConvention::kLastRank);

  int dp() const { return dp_; }
  int64_t numel() const { return numel_; }                // without padding
  int64_t padded_numel() const { return padded_numel_; }
  int64_t partition_numel() const { return padded_numel_ / dp_; }
  int64_t param_start(int param_index) const { return starts_[param_index]; }
  int64_t param_numel(int param_index) const { return numels_[param_index]; }
  int num_params() const { return static_cast<int>(numels_.size()); }
  PaddingConvention convention() const { return convention_; }
  // groups_padding / group_paddings entry of `rank` in the layout's convention.
  int64_t padding(int rank) const { return PaddingAs(rank, convention_); }
  int64_t PaddingAs(int rank, PaddingConvention c) const;
  // Elements of the rank's saved fp32 partition: partition minus padding, as
  // Python's group[:partition - padding] keeps them (a negative stop counts
  // from the end, never below 0).
  int64_t lean_partition_numel(int rank) const { return LeanNumel(padding(rank)); }
  int64_t LeanNumel(int64_t padding) const {
    const int64_t stop = partition_numel() - padding;
    return stop >= 0 ? stop : std::max<int64_t>(0, partition_numel() + stop);
  }
  // Params overlapping [rank * P, (rank + 1) * P), in flatten order, as
  // DeepSpeed's param_slice_mappings lists them. Zero-numel params never
  // appear (DeepSpeed requires fragment_start < fragment_end).
  std::vector<ZeroFragment> Fragments(int rank) const;
  // The same for any window [start, start + size) of the group's flat.
  // DeepSpeed before 0.14.5 (stage_1_and_2.py _link_all_hp_params) linked
  // every group with partition size padded_numel / (the whole dp world) and
  // start (rank in the group's own dp group) * that size: for an expert group
  // (partitioned over dp / ep ranks) with ep > 1, its param_slice_mappings
  // list the params of that window (ExpertMappingWindow), not of the rank's
  // partition.
  std::vector<ZeroFragment> FragmentsOfWindow(int64_t start, int64_t size) const;
  // Fragments of one param over all ranks, in rank order: (rank, fragment).
  std::vector<std::pair<int, ZeroFragment>> FragmentsOfParam(int param_index) const;

 private:
  int dp_ = 1;
  PaddingConvention convention_ = PaddingConvention::kLastRank;
  int64_t numel_ = 0;
  int64_t padded_numel_ = 0;
  std::vector<int64_t> numels_;
  std::vector<int64_t> starts_;
};

// ZeRO-3: ceil(numel / dp), a param's partition on each dp rank.
// DeepSpeed versions whose expert groups' param_slice_mappings cover the
// window of ZeroGroupLayout::FragmentsOfWindow (fixed in 0.14.5).
inline bool ExpertMappingsSizedByWorld(const DsVersion& v) { return v < DsVersion{0, 14, 5}; }
// That window on expert data parallel rank `rank` of a group laid out over
// its own dp group, in a job of `world_dp` data parallel ranks.
inline std::pair<int64_t, int64_t> ExpertMappingWindow(const ZeroGroupLayout& layout, int rank, int world_dp) {
  const int64_t size = layout.padded_numel() / world_dp;
  return {static_cast<int64_t>(rank) * size, size};
}

inline int64_t Zero3PartitionNumel(int64_t numel, int dp) { return (numel + dp - 1) / dp; }
// ZeRO-3: DeepSpeed's sub-groups of one param group (_create_fp16_sub_groups):
// consecutive params whose partition sizes add up to at least
// `sub_group_size` (the last takes the rest); one sub-group when the group is
// not larger. Returns the number of params in each sub-group.
std::vector<int> Zero3SubGroups(const std::vector<int64_t>& numels, int dp, int64_t sub_group_size);

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
