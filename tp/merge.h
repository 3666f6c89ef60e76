// How one parameter's tp slices combine into the full tensor and split again,
// per MergeRule (proto/ucp.proto).
//
// Merging follows deepspeed/checkpoint/ds_to_universal.py:merge_tp_slices
// when the right patterns are given; splitting follows
// deepspeed/checkpoint/universal_checkpoint.py:load_hp_checkpoint_state
// (chunk on cat_dim, sub-params chunked one by one, vocab re-padded with
// zeros), except that a replicated or averaged param is recognized from its
// rule, never from a shape comparison.
//
// Example:
//   UCP_ASSIGN_OR_RETURN(TensorPlan full, MergeSlices(rule, slices, "2.attention.dense.weight"));
//   UCP_ASSIGN_OR_RETURN(TensorPlan s1, SplitFull(rule, full, /*tp=*/4, /*rank=*/1, padded_rows, name));
#ifndef UCP_TP_MERGE_H_
#define UCP_TP_MERGE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/status/statusor.h"
#include "proto/ucp.pb.h"
#include "tp/tensor_plan.h"

namespace ucp::tp {

// "replicated", "average", "column", "row", "vocab", "sub_params".
std::string MergeKindName(MergeKind kind);
absl::StatusOr<MergeKind> ParseMergeKind(absl::string_view name);
// A one-line description of a rule, e.g. "row (cat dim 1)", "sub_params (2 on dim 0)".
std::string DescribeRule(const MergeRule& rule);
// Checks the rule's own parameters (a SUB_PARAMS rule needs num_sub_params or
// a sub_param_shape, ...). `name` is for messages.
absl::Status ValidateRule(const MergeRule& rule, absl::string_view name);

// The dimension the tp slices are concatenated on (0 for COLUMN/VOCAB, 1 for
// ROW, cat_dim / partition_dim for SUB_PARAMS); -1 for REPLICATED/AVERAGE.
int64_t PartitionDim(const MergeRule& rule);

// Full (universal) shape from the shape of one tp slice. VOCAB returns the
// padded shape (rows * tp); strip with `original_vocab_size` separately.
absl::StatusOr<std::vector<int64_t>> FullShapeFromSlice(const MergeRule& rule, const std::vector<int64_t>& slice,
                                                        int tp, absl::string_view name);
// Shape of each tp slice for a full shape. For VOCAB, `padded_rows` is the
// target's padded vocabulary (>= full rows); ignored for other kinds.
absl::StatusOr<std::vector<int64_t>> SliceShapeFromFull(const MergeRule& rule, const std::vector<int64_t>& full,
                                                        int tp, int64_t padded_rows, absl::string_view name);

// DeepSpeed AutoTP's split of a dimension of `size` over `tp` ranks
// (deepspeed/module_inject/tp_shard.py get_shard_size, tp_grain_size 1 as
// training uses it): rank r holds size / tp rows or columns, and the first
// size % tp ranks one more.
int64_t AutoTpWidth(int64_t size, int tp, int rank);
// How a DeepSpeed version's AutoTP training cuts a COLUMN / ROW dim that tp
// does not divide: master (0.19.6) by get_shard_size (AutoTpWidth);
// 0.16.4 - 0.19.5 by torch.chunk (layers.py LinearLayer / LinearAllreduce
// _tp_partition in training mode, and their load_universal alike): every rank
// ceil(size / tp) but the last ones (AutoTpChunkWidth). The two agree at tp 2.
enum class AutoTpCut { kNearEven, kChunk };
// torch.chunk(size, tp)'s piece `rank`: ceil(size / tp), the rest on the last
// piece, 0 past the pieces torch.chunk makes (fewer than tp when the ceiling
// covers size sooner, e.g. 5 over 4: 2, 2, 1).
int64_t AutoTpChunkWidth(int64_t size, int tp, int rank);
// The full shape from every tp rank's slice shape: FullShapeFromSlice when
// they agree; slices of a COLUMN, ROW or VOCAB param that differ on its
// partition dim only, in AutoTP's widths (AutoTpWidth or AutoTpChunkWidth of
// their sum: master's or an earlier version's cut), give their sum there. Other unequal slices: kInvalidArgument naming them.
absl::StatusOr<std::vector<int64_t>> FullShapeFromSlices(const MergeRule& rule,
                                                         const std::vector<std::vector<int64_t>>& slices,
                                                         absl::string_view name);

// Whether AutoTP cuts a param of this name in whole key-value heads rather
// than rows (tp_shard.py get_shard_size: every name but an MLP's, MoE MLP
// layers' and the lm_head / embed_out, when the key-value heads divide it).
bool AutoTpCutsByHeads(absl::string_view name);
// Whether the param belongs to AutoTP's output head (a module named lm_head
// or embed_out).
bool AutoTpIsLmHead(absl::string_view name);
// Each tp rank's slice shape when AutoTP writes a COLUMN, ROW or unpadded
// VOCAB param (padded_rows == full rows) whose partition dim tp does not
// divide: AutoTpWidth per rank. Refused (kFailedPrecondition) for other kinds
// and for params AutoTP cuts by heads (the head count is not known here).
// `cut`: the version's widths of a COLUMN / ROW / VOCAB dim (sub-params:
// AutoTpWidth, master's SubParamLinearLayer). A torch.chunk cut that leaves
// a rank nothing is refused (DeepSpeed fails there).
absl::StatusOr<std::vector<std::vector<int64_t>>> AutoTpSliceShapes(const MergeRule& rule,
                                                                    const std::vector<int64_t>& full, int tp,
                                                                    int64_t padded_rows, absl::string_view name,
                                                                    AutoTpCut cut = AutoTpCut::kNearEven);

// Merges tp slices (in tp rank order) into the full tensor. COLUMN, ROW and
// VOCAB slices may be uneven in AutoTP's widths (FullShapeFromSlices). REPLICATED returns
// slices[0] (callers check that the copies agree); AVERAGE materializes the
// element-wise mean (float types only); VOCAB strips the rows past
// `original_vocab_size` (0 = keep all).
absl::StatusOr<TensorPlan> MergeSlices(const MergeRule& rule, const std::vector<TensorPlan>& slices,
                                       int64_t original_vocab_size, absl::string_view name);
// The slice of tp rank `rank` out of `tp`. For VOCAB the full tensor is first
// padded with zero rows to `padded_rows`.
// With `autotp_widths`, a COLUMN, ROW or unpadded VOCAB dim that tp does not
// divide is cut in AutoTP's widths (AutoTpSliceShapes).
absl::StatusOr<TensorPlan> SplitFull(const MergeRule& rule, const TensorPlan& full, int tp, int rank,
                                     int64_t padded_rows, absl::string_view name, bool autotp_widths = false,
                                     AutoTpCut cut = AutoTpCut::kNearEven);

// Megatron's padded vocabulary: the smallest multiple of
// divisible_by * tp that is >= vocab.
int64_t PaddedVocabSize(int64_t vocab, int64_t divisible_by, int tp);

}  // namespace ucp::tp

#endif  // UCP_TP_MERGE_H_
