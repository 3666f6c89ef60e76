#include "tp/merge.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"

namespace ucp::tp {
namespace {

absl::Status Err(absl::string_view name, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("param '", name, "': ", what));
}

// The sub-param sizes on the partition dim and the full partition shape of a
// SubParamShape (DeepSpeed: tuple dims are summed), and the widths each tp
// rank of the checkpoint holds of each sub-param (format 0.4; empty: even).
struct SubShape {
  std::vector<int64_t> full_shape;
  std::vector<int64_t> sub_sizes;
  int64_t partition_dim = 0;
  std::vector<std::vector<int64_t>> shard_widths;
};

int64_t Numel(const std::vector<int64_t>& s);

// `numel`: the tensor's elements, which resolve a -1 dim (DeepSpeed's
// _resolve_logical_shape); -1 when not known (the -1 is then kept).
absl::StatusOr<SubShape> ResolveSubShape(const SubParamShape& s, absl::string_view name, int64_t numel = -1) {
  SubShape out;
  out.partition_dim = s.partition_dim();
  if (out.partition_dim < 0 || out.partition_dim >= s.dim_size()) {
    return Err(name, absl::StrCat("sub_param_shape partition_dim ", out.partition_dim, " outside its ", s.dim_size(),
                                  " dims"));
  }
  int placeholder = -1;
  int64_t known = 1;
  for (int i = 0; i < s.dim_size(); ++i) {
    const auto& d = s.dim(i);
    if (d.size_size() == 0) return Err(name, absl::StrCat("sub_param_shape dim ", i, " has no size"));
    if (d.size_size() == 1 && d.size(0) == -1 && i != out.partition_dim && placeholder < 0) {
      placeholder = i;
      out.full_shape.push_back(-1);
      continue;
    }
    int64_t sum = 0;
    for (int64_t x : d.size()) {
      if (x <= 0) return Err(name, absl::StrCat("sub_param_shape dim ", i, " has size ", x));
      sum += x;
    }
    out.full_shape.push_back(sum);
    known *= sum;
    if (i == out.partition_dim) out.sub_sizes.assign(d.size().begin(), d.size().end());
  }
  if (placeholder >= 0 && numel >= 0) {
    if (known <= 0 || numel % known != 0) {
      return Err(name, absl::StrCat("sub_param_shape dim ", placeholder, " is -1 and the other dims (",
                                    known, " elements) do not divide the tensor's ", numel));
    }
    out.full_shape[placeholder] = numel / known;
  }
  for (const auto& w : s.shard_widths()) out.shard_widths.emplace_back(w.width().begin(), w.width().end());
  if (!out.shard_widths.empty()) {
    if (out.shard_widths.size() != out.sub_sizes.size()) {
      return Err(name, absl::StrCat("sub_param_shard_widths has ", out.shard_widths.size(), " entries for ",
                                    out.sub_sizes.size(), " sub-params"));
    }
    for (size_t k = 0; k < out.sub_sizes.size(); ++k) {
      int64_t sum = 0;
      for (int64_t w : out.shard_widths[k]) sum += w < 0 ? out.sub_sizes[k] + 1 : w;
      if (sum != out.sub_sizes[k] || out.shard_widths[k].size() != out.shard_widths[0].size()) {
        return Err(name, absl::StrCat("sub_param_shard_widths [", absl::StrJoin(out.shard_widths[k], ", "),
                                      "] of sub-param ", k, " do not split its ", out.sub_sizes[k], " rows over ",
                                      out.shard_widths[0].size(), " tp ranks"));
      }
    }
  }
  return out;
}

// Each sub-param's width on each of `tp` ranks: the checkpoint's recorded
// widths when it has them for this tp, else an even split (AutoTP's widths
// with `autotp`; without, a sub-param tp does not divide is an error).
absl::StatusOr<std::vector<std::vector<int64_t>>> SubParamWidths(const SubShape& s, int tp, bool autotp,
                                                                 absl::string_view name) {
  if (!s.shard_widths.empty() && static_cast<int>(s.shard_widths[0].size()) == tp) return s.shard_widths;
  std::vector<std::vector<int64_t>> out;
  for (int64_t sub : s.sub_sizes) {
    if (sub % tp != 0 && !autotp) {
      return Err(name, absl::StrCat("sub-param size ", sub, " is not divisible by tp ", tp));
    }
    std::vector<int64_t> w;
    for (int r = 0; r < tp; ++r) w.push_back(AutoTpWidth(sub, tp, r));
    out.push_back(std::move(w));
  }
  return out;
}

// A SUB_PARAMS rule of `num_sub_params` equal chunks on `cat_dim` as the
// sub_param_shape that says the same of a tensor of shape `full`, so that
// AutoTP's uneven widths apply to it too (Phi-3's gate_up_proj from a preset).
MergeRule AsSubParamShape(const MergeRule& rule, const std::vector<int64_t>& full) {
  if (rule.kind() != SUB_PARAMS || rule.sub_param_shape().dim_size() > 0 || rule.num_sub_params() < 1 ||
      rule.cat_dim() < 0 || rule.cat_dim() >= static_cast<int64_t>(full.size()) ||
      full[rule.cat_dim()] % rule.num_sub_params() != 0) {
    return rule;
  }
  MergeRule out = rule;
  SubParamShape* s = out.mutable_sub_param_shape();
  s->set_partition_dim(rule.cat_dim());
  for (size_t d = 0; d < full.size(); ++d) {
    SubParamShape::Dim* dim = s->add_dim();
    if (static_cast<int64_t>(d) != rule.cat_dim()) {
      dim->add_size(full[d]);
      continue;
    }
    for (int k = 0; k < rule.num_sub_params(); ++k) dim->add_size(full[d] / rule.num_sub_params());
  }
  return out;
}

// A tp rank's shape of a sub-param tensor: the full (resolved) shape with its
// own widths summed on the partition dim.
std::vector<int64_t> SubParamRankShape(const SubShape& s, const std::vector<std::vector<int64_t>>& widths, int rank) {
  std::vector<int64_t> shape = s.full_shape;
  int64_t w = 0;
  for (const auto& per_rank : widths) w += per_rank[rank];
  shape[s.partition_dim] = w;
  return shape;
}

int64_t Numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t x : s) n *= x;
  return n;
}

// The message for tp slices that neither agree nor follow AutoTP's uneven split.
absl::Status UnequalSlices(absl::string_view name, size_t t, const std::string& got, const std::string& first,
                           absl::string_view why) {
  return Err(name, absl::StrCat("tp slice ", t, " is ", got, ", tp slice 0 is ", first, why));
}

}  // namespace

int64_t AutoTpWidth(int64_t size, int tp, int rank) { return size / tp + (rank < size % tp ? 1 : 0); }

int64_t AutoTpChunkWidth(int64_t size, int tp, int rank) {
  const int64_t c = (size + tp - 1) / tp;
  return std::clamp<int64_t>(size - rank * c, 0, c);
}

namespace {

// Whether every slice's width on `dim` is `width(sum, tp, t)`.
bool WidthsFollow(const std::vector<std::vector<int64_t>>& slices, int64_t dim, int64_t sum,
                  int64_t (*width)(int64_t, int, int)) {
  const int tp = static_cast<int>(slices.size());
  for (int t = 0; t < tp; ++t) {
    if (slices[t][dim] != width(sum, tp, t)) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::vector<int64_t>> FullShapeFromSlices(const MergeRule& rule,
                                                         const std::vector<std::vector<int64_t>>& slices,
                                                         absl::string_view name) {
  if (slices.empty()) return Err(name, "no tp slices");
  const int tp = static_cast<int>(slices.size());
  if (rule.kind() == SUB_PARAMS && rule.sub_param_shape().dim_size() > 0) {
    // Each rank holds its widths of every sub-param (merge_tp_slices of 0.4).
    int64_t total = 0;
    for (const auto& sl : slices) total += Numel(sl);
    UCP_ASSIGN_OR_RETURN(SubShape s, ResolveSubShape(rule.sub_param_shape(), name, total));
    if (Numel(s.full_shape) != total) {
      return Err(name, absl::StrCat("tp slices of ", total, " elements in all do not fill sub_param_shape ",
                                    torch::ShapeString(s.full_shape)));
    }
    UCP_ASSIGN_OR_RETURN(auto widths, SubParamWidths(s, tp, /*autotp=*/false, name));
    for (int t = 0; t < tp; ++t) {
      const std::vector<int64_t> want = SubParamRankShape(s, widths, t);
      if (Numel(slices[t]) != Numel(want)) {
        return Err(name, absl::StrCat("tp slice ", t, " is ", torch::ShapeString(slices[t]), ", its sub-param widths",
                                      s.shard_widths.empty() ? " (even: the checkpoint records none)" : "",
                                      " make it ", torch::ShapeString(want)));
      }
    }
    return s.full_shape;
  }
  bool equal = true;
  for (const auto& s : slices) equal = equal && s == slices[0];
  if (equal) return FullShapeFromSlice(rule, slices[0], tp, name);
  const bool cat = rule.kind() == COLUMN || rule.kind() == ROW || rule.kind() == VOCAB;
  const int64_t dim = PartitionDim(rule);
  int64_t sum = 0;
  for (size_t t = 0; t < slices.size(); ++t) {
    bool same_elsewhere = cat && slices[t].size() == slices[0].size() && dim < static_cast<int64_t>(slices[t].size());
    for (size_t d = 0; same_elsewhere && d < slices[t].size(); ++d) {
      same_elsewhere = static_cast<int64_t>(d) == dim || slices[t][d] == slices[0][d];
    }
    if (!same_elsewhere) {
      return UnequalSlices(name, t, torch::ShapeString(slices[t]), torch::ShapeString(slices[0]),
                           cat ? absl::StrCat(" (a ", MergeKindName(rule.kind()), " param's slices may differ on dim ",
                                              dim, " only)")
                               : absl::StrCat(" (", MergeKindName(rule.kind()), " slices must agree)"));
    }
    sum += slices[t][dim];
  }
  if (!WidthsFollow(slices, dim, sum, AutoTpWidth) && !WidthsFollow(slices, dim, sum, AutoTpChunkWidth)) {
    std::vector<std::string> want, chunk;
    size_t t = 0;
    for (int r = tp - 1; r >= 0; --r) {
      if (slices[r][dim] != AutoTpWidth(sum, tp, r)) t = r;
    }
    for (int r = 0; r < tp; ++r) {
      want.push_back(absl::StrCat(AutoTpWidth(sum, tp, r)));
      chunk.push_back(absl::StrCat(AutoTpChunkWidth(sum, tp, r)));
    }
    return UnequalSlices(name, t, torch::ShapeString(slices[t]), torch::ShapeString(slices[0]),
                         absl::StrCat(": uneven slices must follow AutoTP's split of ", sum, " over tp ", tp, " (",
                                      absl::StrJoin(want, ", "), " on dim ", dim,
                                      "; DeepSpeed before 0.19.6, torch.chunk's: ", absl::StrJoin(chunk, ", "), ")"));
  }
  std::vector<int64_t> full = slices[0];
  full[dim] = sum;
  return full;
}

bool AutoTpIsLmHead(absl::string_view name) {
  for (absl::string_view head : {"lm_head", "embed_out"}) {
    if (name == head || absl::StartsWith(name, absl::StrCat(head, ".")) ||
        absl::StrContains(name, absl::StrCat(".", head, "."))) {
      return true;
    }
  }
  return false;
}

bool AutoTpCutsByHeads(absl::string_view name) {
  for (absl::string_view mlp : {"mlp", "gate_proj", "up_proj", "down_proj", "w1", "w2", "w3"}) {
    if (absl::StrContains(name, mlp)) return false;
  }
  return !AutoTpIsLmHead(name);
}

absl::StatusOr<std::vector<std::vector<int64_t>>> AutoTpSliceShapes(const MergeRule& given,
                                                                    const std::vector<int64_t>& full, int tp,
                                                                    int64_t padded_rows, absl::string_view name,
                                                                    AutoTpCut cut) {
  const MergeRule rule = AsSubParamShape(given, full);
  const bool sub = rule.kind() == SUB_PARAMS && rule.sub_param_shape().dim_size() > 0;
  const bool cat = sub || rule.kind() == COLUMN || rule.kind() == ROW ||
                   (rule.kind() == VOCAB && !full.empty() && padded_rows == full[0]);
  const int64_t dim = PartitionDim(rule);
  if (!cat || dim >= static_cast<int64_t>(full.size())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "param '", name, "': AutoTP's uneven widths apply to column, row and unpadded vocabulary params only, not ",
        DescribeRule(rule), " of ", torch::ShapeString(full)));
  }
  if (sub) {
    // Widths the checkpoint recorded for this tp are kept (whatever cut them).
    UCP_ASSIGN_OR_RETURN(SubShape s, ResolveSubShape(rule.sub_param_shape(), name, Numel(full)));
    if (!s.shard_widths.empty() && static_cast<int>(s.shard_widths[0].size()) == tp) {
      std::vector<std::vector<int64_t>> out(tp);
      for (int r = 0; r < tp; ++r) out[r] = SubParamRankShape(s, s.shard_widths, r);
      return out;
    }
  }
  if (AutoTpCutsByHeads(name)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "param '", name, "': dim ", dim, " of ", torch::ShapeString(full), " does not split evenly over tp ", tp,
        ", and AutoTP cuts attention projections in whole key-value heads, whose count ucp does not know: "
        "choose a tp that divides the heads"));
  }
  std::vector<std::vector<int64_t>> out(tp, full);
  if (sub) {  // every sub-param in AutoTP's widths (layers.py _subparam_shard_widths)
    UCP_ASSIGN_OR_RETURN(SubShape s, ResolveSubShape(rule.sub_param_shape(), name, Numel(full)));
    UCP_ASSIGN_OR_RETURN(auto widths, SubParamWidths(s, tp, /*autotp=*/true, name));
    for (int r = 0; r < tp; ++r) out[r] = SubParamRankShape(s, widths, r);
    return out;
  }
  for (int r = 0; r < tp; ++r) {
    out[r][dim] = cut == AutoTpCut::kChunk ? AutoTpChunkWidth(full[dim], tp, r) : AutoTpWidth(full[dim], tp, r);
  }
  if (out[tp - 1][dim] <= 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "param '", name, "': DeepSpeed before 0.19.6 cuts dim ", dim, " of ", torch::ShapeString(full),
        " with torch.chunk, which leaves tp rank ", tp - 1, " of ", tp, " nothing (its AutoTP fails there): choose "
        "another tp or DeepSpeed master (--target_ds_version=0.19.6)"));
  }
  return out;
}

std::string MergeKindName(MergeKind kind) {
  switch (kind) {
    case REPLICATED: return "replicated";
    case AVERAGE: return "average";
    case COLUMN: return "column";
    case ROW: return "row";
    case VOCAB: return "vocab";
    case SUB_PARAMS: return "sub_params";
    default: return "unspecified";
  }
}

absl::StatusOr<MergeKind> ParseMergeKind(absl::string_view name) {
  const std::string n = absl::AsciiStrToLower(name);
  if (n == "replicated") return REPLICATED;
  if (n == "average") return AVERAGE;
  if (n == "column") return COLUMN;
  if (n == "row") return ROW;
  if (n == "vocab") return VOCAB;
  if (n == "sub_params") return SUB_PARAMS;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown merge kind '", name, "' (replicated, average, column, row, vocab, sub_params)"));
}

std::string DescribeRule(const MergeRule& rule) {
  switch (rule.kind()) {
    case REPLICATED: return "replicated";
    case AVERAGE: return "average";
    case COLUMN: return "column (cat dim 0)";
    case ROW: return "row (cat dim 1)";
    case VOCAB:
      return rule.original_vocab_size() > 0 ? absl::StrCat("vocab (cat dim 0, ", rule.original_vocab_size(), " rows)")
                                            : "vocab (cat dim 0)";
    case SUB_PARAMS: {
      if (rule.sub_param_shape().dim_size() > 0) {
        std::vector<std::string> dims;
        for (const auto& d : rule.sub_param_shape().dim()) {
          dims.push_back(d.size_size() == 1 ? absl::StrCat(d.size(0)) : absl::StrCat("(", absl::StrJoin(d.size(), ","), ")"));
        }
        return absl::StrCat("sub_params (shape [", absl::StrJoin(dims, ", "), "], partition dim ",
                            rule.sub_param_shape().partition_dim(), ")");
      }
      return absl::StrCat("sub_params (", rule.num_sub_params(), " on dim ", rule.cat_dim(), ")");
    }
    default: return "unspecified";
  }
}

absl::Status ValidateRule(const MergeRule& rule, absl::string_view name) {
  switch (rule.kind()) {
    case REPLICATED:
    case AVERAGE:
    case COLUMN:
    case ROW:
    case VOCAB: return absl::OkStatus();
    case SUB_PARAMS:
      if (rule.sub_param_shape().dim_size() > 0) return ResolveSubShape(rule.sub_param_shape(), name).status();
      if (rule.num_sub_params() < 1) return Err(name, "sub_params rule needs num_sub_params >= 1 or a sub_param_shape");
      if (rule.cat_dim() < 0) return Err(name, absl::StrCat("sub_params rule has cat_dim ", rule.cat_dim()));
      return absl::OkStatus();
    default: return Err(name, "merge rule has no kind");
  }
}

int64_t PartitionDim(const MergeRule& rule) {
  switch (rule.kind()) {
    case COLUMN:
    case VOCAB: return 0;
    case ROW: return 1;
    case SUB_PARAMS:
      return rule.sub_param_shape().dim_size() > 0 ? rule.sub_param_shape().partition_dim() : rule.cat_dim();
    default: return -1;
  }
}

absl::StatusOr<std::vector<int64_t>> FullShapeFromSlice(const MergeRule& rule, const std::vector<int64_t>& slice,
                                                        int tp, absl::string_view name) {
  UCP_RETURN_IF_ERROR(ValidateRule(rule, name));
  if (rule.kind() == REPLICATED || rule.kind() == AVERAGE) return slice;
  if (rule.kind() == SUB_PARAMS && rule.sub_param_shape().dim_size() > 0) {
    UCP_ASSIGN_OR_RETURN(SubShape s, ResolveSubShape(rule.sub_param_shape(), name, Numel(slice) * tp));
    if (Numel(slice) * tp != Numel(s.full_shape)) {
      return Err(name, absl::StrCat("tp slice ", torch::ShapeString(slice), " x tp ", tp,
                                    " does not fill sub_param_shape ", torch::ShapeString(s.full_shape)));
    }
    return s.full_shape;
  }
  const int64_t dim = PartitionDim(rule);
  if (dim >= static_cast<int64_t>(slice.size())) {
    return Err(name, absl::StrCat(MergeKindName(rule.kind()), " merge on dim ", dim, " needs a tensor with more than ",
                                  dim, " dims, the tp slice is ", torch::ShapeString(slice)));
  }
  std::vector<int64_t> full = slice;
  full[dim] *= tp;
  return full;
}

absl::StatusOr<std::vector<int64_t>> SliceShapeFromFull(const MergeRule& rule, const std::vector<int64_t>& full,
                                                        int tp, int64_t padded_rows, absl::string_view name) {
  UCP_RETURN_IF_ERROR(ValidateRule(rule, name));
  if (rule.kind() == REPLICATED || rule.kind() == AVERAGE) return full;
  if (rule.kind() == SUB_PARAMS && rule.sub_param_shape().dim_size() > 0) {
    UCP_ASSIGN_OR_RETURN(SubShape s, ResolveSubShape(rule.sub_param_shape(), name, Numel(full)));
    if (Numel(full) != Numel(s.full_shape)) {
      return Err(name, absl::StrCat("full shape ", torch::ShapeString(full), " does not match sub_param_shape ",
                                    torch::ShapeString(s.full_shape)));
    }
    std::vector<int64_t> out = s.full_shape;
    for (int64_t sub : s.sub_sizes) {
      if (sub % tp != 0) {
        return Err(name, absl::StrCat("sub-param size ", sub, " is not divisible by tp ", tp));
      }
    }
    out[s.partition_dim] /= tp;
    return out;
  }
  const int64_t dim = PartitionDim(rule);
  if (dim >= static_cast<int64_t>(full.size())) {
    return Err(name, absl::StrCat(MergeKindName(rule.kind()), " split on dim ", dim, " of ", torch::ShapeString(full)));
  }
  std::vector<int64_t> out = full;
  int64_t size = full[dim];
  if (rule.kind() == VOCAB) {
    if (padded_rows < full[0]) {
      return Err(name, absl::StrCat("padded vocabulary ", padded_rows, " is smaller than the ", full[0], " rows"));
    }
    size = padded_rows;
  }
  int64_t unit = tp;
  if (rule.kind() == SUB_PARAMS) unit = static_cast<int64_t>(tp) * rule.num_sub_params();
  if (size % unit != 0) {
    return Err(name, absl::StrCat("dim ", dim, " of size ", size, " (shape ", torch::ShapeString(full),
                                  ") is not divisible by ", unit, rule.kind() == SUB_PARAMS ? " (sub-params x tp)" : " (tp)"));
  }
  out[dim] = size / tp;
  return out;
}

absl::StatusOr<TensorPlan> MergeSlices(const MergeRule& rule, const std::vector<TensorPlan>& slices,
                                       int64_t original_vocab_size, absl::string_view name) {
  UCP_RETURN_IF_ERROR(ValidateRule(rule, name));
  if (slices.empty()) return Err(name, "no tp slices to merge");
  std::vector<std::vector<int64_t>> shapes;
  for (size_t t = 0; t < slices.size(); ++t) {
    if (slices[t].dtype() != slices[0].dtype()) {
      return Err(name, absl::StrCat("tp slice ", t, " is ", std::string(torch::DTypeName(slices[t].dtype())),
                                    torch::ShapeString(slices[t].shape()), ", tp slice 0 is ",
                                    std::string(torch::DTypeName(slices[0].dtype())), torch::ShapeString(slices[0].shape())));
    }
    shapes.push_back(slices[t].shape());
  }
  // Equal slices, or AutoTP's uneven ones of a COLUMN / ROW / VOCAB param.
  UCP_RETURN_IF_ERROR(FullShapeFromSlices(rule, shapes, name).status());
  const int tp = static_cast<int>(slices.size());
  switch (rule.kind()) {
    case REPLICATED: return slices[0];
    case AVERAGE: {
      // Copies that agree bit for bit average to themselves; return them
      // exactly rather than (x + x + x) / 3 rounded.
      bool all_equal = true;
      for (size_t t = 1; t < slices.size() && all_equal; ++t) {
        UCP_ASSIGN_OR_RETURN(all_equal, TensorPlan::BitwiseEqual(slices[0], slices[t]));
      }
      if (all_equal) return slices[0];
      std::vector<torch::Tensor> tensors;
      for (const TensorPlan& s : slices) {
        UCP_ASSIGN_OR_RETURN(torch::Tensor t, s.Materialize());
        tensors.push_back(std::move(t));
      }
      UCP_ASSIGN_OR_RETURN(torch::Tensor avg, torch::Average(tensors), _.Prepend(absl::StrCat("param '", name, "': ")));
      return TensorPlan::FromTensor(avg);
    }
    case COLUMN:
    case ROW:
    case VOCAB: {
      const int64_t dim = PartitionDim(rule);
      if (dim >= slices[0].dim()) {
        return Err(name, absl::StrCat(MergeKindName(rule.kind()), " merge on dim ", dim, " of tp slices ",
                                      torch::ShapeString(slices[0].shape())));
      }
      UCP_ASSIGN_OR_RETURN(TensorPlan full, TensorPlan::Cat(slices, dim));
      if (rule.kind() == VOCAB) {
        const int64_t v = rule.original_vocab_size() > 0 ? rule.original_vocab_size() : original_vocab_size;
        if (v > 0) {
          if (v > full.shape()[0]) {
            return Err(name, absl::StrCat("original vocab size ", v, " exceeds the ", full.shape()[0],
                                          " merged rows"));
          }
          UCP_ASSIGN_OR_RETURN(full, full.Narrow(0, 0, v));
        }
      }
      return full;
    }
    case SUB_PARAMS: {
      if (rule.sub_param_shape().dim_size() > 0) {
        // ds_to_universal.py merge_tp_slices (0.4): each rank's slice viewed
        // in its own widths, then every sub-param's pieces in rank order.
        int64_t total = 0;
        for (const TensorPlan& sl : slices) total += Numel(sl.shape());
        UCP_ASSIGN_OR_RETURN(SubShape s, ResolveSubShape(rule.sub_param_shape(), name, total));
        UCP_ASSIGN_OR_RETURN(auto widths, SubParamWidths(s, tp, /*autotp=*/false, name));
        std::vector<TensorPlan> views;
        for (int t = 0; t < tp; ++t) {
          UCP_ASSIGN_OR_RETURN(TensorPlan v, slices[t].Reshape(SubParamRankShape(s, widths, t)),
                               _.Prepend(absl::StrCat("param '", name, "': ")));
          views.push_back(std::move(v));
        }
        std::vector<TensorPlan> merged;
        std::vector<int64_t> offsets(tp, 0);
        for (const auto& per_rank : widths) {
          std::vector<TensorPlan> pieces;
          for (int t = 0; t < tp; ++t) {
            UCP_ASSIGN_OR_RETURN(TensorPlan p, views[t].Narrow(s.partition_dim, offsets[t], per_rank[t]));
            pieces.push_back(std::move(p));
            offsets[t] += per_rank[t];
          }
          UCP_ASSIGN_OR_RETURN(TensorPlan m, TensorPlan::Cat(pieces, s.partition_dim));
          merged.push_back(std::move(m));
        }
        return TensorPlan::Cat(merged, s.partition_dim);
      }
      const int64_t dim = rule.cat_dim();
      const int64_t n = rule.num_sub_params();
      if (dim >= slices[0].dim() || slices[0].shape()[dim] % n != 0) {
        return Err(name, absl::StrCat("cannot cut tp slices ", torch::ShapeString(slices[0].shape()), " into ", n,
                                      " sub-params on dim ", dim));
      }
      std::vector<std::vector<TensorPlan>> chunked;
      for (const TensorPlan& sl : slices) {
        UCP_ASSIGN_OR_RETURN(std::vector<TensorPlan> c, sl.Chunk(n, dim));
        chunked.push_back(std::move(c));
      }
      std::vector<TensorPlan> merged;
      for (int64_t c = 0; c < n; ++c) {
        std::vector<TensorPlan> pieces;
        for (auto& ch : chunked) pieces.push_back(ch[c]);
        UCP_ASSIGN_OR_RETURN(TensorPlan m, TensorPlan::Cat(pieces, dim));
        merged.push_back(std::move(m));
      }
      return TensorPlan::Cat(merged, dim);
    }
    default: return Err(name, "merge rule has no kind");
  }
}

absl::StatusOr<TensorPlan> SplitFull(const MergeRule& given, const TensorPlan& full, int tp, int rank,
                                     int64_t padded_rows, absl::string_view name, bool autotp_widths,
                                     AutoTpCut cut) {
  const MergeRule rule = autotp_widths ? AsSubParamShape(given, full.shape()) : given;
  UCP_RETURN_IF_ERROR(ValidateRule(rule, name));
  if (rank < 0 || rank >= tp) return Err(name, absl::StrCat("tp rank ", rank, " outside tp ", tp));
  const int64_t pdim = PartitionDim(rule);
  const bool sub_shape = rule.kind() == SUB_PARAMS && rule.sub_param_shape().dim_size() > 0;
  if (sub_shape) {
    // universal_checkpoint.py _narrow_sub_params: this rank's piece of every
    // sub-param, in AutoTP's widths where tp does not divide one (`autotp_widths`).
    UCP_ASSIGN_OR_RETURN(SubShape s, ResolveSubShape(rule.sub_param_shape(), name, Numel(full.shape())));
    const bool recorded = !s.shard_widths.empty() && static_cast<int>(s.shard_widths[0].size()) == tp;
    if (autotp_widths && !recorded && AutoTpCutsByHeads(name)) {
      for (int64_t sub : s.sub_sizes) {
        if (sub % tp != 0) return AutoTpSliceShapes(rule, full.shape(), tp, padded_rows, name).status();
      }
    }
    UCP_ASSIGN_OR_RETURN(auto widths, SubParamWidths(s, tp, autotp_widths, name));
    UCP_ASSIGN_OR_RETURN(TensorPlan view, full.Reshape(s.full_shape), _.Prepend(absl::StrCat("param '", name, "': ")));
    std::vector<TensorPlan> pieces;
    int64_t offset = 0;
    for (size_t k = 0; k < widths.size(); ++k) {
      int64_t start = offset;
      for (int r = 0; r < rank; ++r) start += widths[k][r];
      UCP_ASSIGN_OR_RETURN(TensorPlan p, view.Narrow(s.partition_dim, start, widths[k][rank]));
      pieces.push_back(std::move(p));
      offset += s.sub_sizes[k];
    }
    return TensorPlan::Cat(pieces, s.partition_dim);
  }
  if (autotp_widths && (rule.kind() == COLUMN || rule.kind() == ROW || rule.kind() == VOCAB) &&
      pdim < full.dim() && full.shape()[pdim] % tp != 0) {
    UCP_ASSIGN_OR_RETURN(auto shapes, AutoTpSliceShapes(rule, full.shape(), tp, padded_rows, name, cut));
    int64_t start = 0;
    for (int r = 0; r < rank; ++r) start += shapes[r][pdim];
    return full.Narrow(pdim, start, shapes[rank][pdim]);
  }
  UCP_ASSIGN_OR_RETURN(std::vector<int64_t> slice_shape,
                       SliceShapeFromFull(rule, full.shape(), tp, padded_rows, name));
  switch (rule.kind()) {
    case REPLICATED:
    case AVERAGE: return full;
    case COLUMN:
    case ROW: {
      const int64_t dim = PartitionDim(rule);
      return full.Narrow(dim, rank * slice_shape[dim], slice_shape[dim]);
    }
    case VOCAB: {
      UCP_ASSIGN_OR_RETURN(TensorPlan padded, full.PadDim0(padded_rows));
      return padded.Narrow(0, rank * slice_shape[0], slice_shape[0]);
    }
    case SUB_PARAMS: {  // a sub_param_shape returned above
      const int64_t dim = rule.cat_dim();
      const int64_t n = rule.num_sub_params();
      const int64_t sub = full.shape()[dim] / n;
      const int64_t part = sub / tp;
      std::vector<TensorPlan> pieces;
      for (int64_t c = 0; c < n; ++c) {
        UCP_ASSIGN_OR_RETURN(TensorPlan p, full.Narrow(dim, c * sub + rank * part, part));
        pieces.push_back(std::move(p));
      }
      return TensorPlan::Cat(pieces, dim);
    }
    default: return Err(name, "merge rule has no kind");
  }
}

int64_t PaddedVocabSize(int64_t vocab, int64_t divisible_by, int tp) {
  const int64_t multiple = (divisible_by > 0 ? divisible_by : 1) * (tp > 0 ? tp : 1);
  return (vocab + multiple - 1) / multiple * multiple;
}

}  // namespace ucp::tp
