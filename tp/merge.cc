#include "tp/merge.h"

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
// SubParamShape (DeepSpeed: tuple dims are summed).
struct SubShape {
  std::vector<int64_t> full_shape;
  std::vector<int64_t> sub_sizes;
  int64_t partition_dim = 0;
};

absl::StatusOr<SubShape> ResolveSubShape(const SubParamShape& s, absl::string_view name) {
  SubShape out;
  out.partition_dim = s.partition_dim();
  if (out.partition_dim < 0 || out.partition_dim >= s.dim_size()) {
    return Err(name, absl::StrCat("sub_param_shape partition_dim ", out.partition_dim, " outside its ", s.dim_size(),
                                  " dims"));
  }
  for (int i = 0; i < s.dim_size(); ++i) {
    const auto& d = s.dim(i);
    if (d.size_size() == 0) return Err(name, absl::StrCat("sub_param_shape dim ", i, " has no size"));
    int64_t sum = 0;
    for (int64_t x : d.size()) {
      if (x <= 0) return Err(name, absl::StrCat("sub_param_shape dim ", i, " has size ", x));
      sum += x;
    }
    out.full_shape.push_back(sum);
    if (i == out.partition_dim) out.sub_sizes.assign(d.size().begin(), d.size().end());
  }
  return out;
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

absl::StatusOr<std::vector<int64_t>> FullShapeFromSlices(const MergeRule& rule,
                                                         const std::vector<std::vector<int64_t>>& slices,
                                                         absl::string_view name) {
  if (slices.empty()) return Err(name, "no tp slices");
  const int tp = static_cast<int>(slices.size());
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
  for (int t = 0; t < tp; ++t) {
    if (slices[t][dim] != AutoTpWidth(sum, tp, t)) {
      std::vector<std::string> want;
      for (int r = 0; r < tp; ++r) want.push_back(absl::StrCat(AutoTpWidth(sum, tp, r)));
      return UnequalSlices(name, t, torch::ShapeString(slices[t]), torch::ShapeString(slices[0]),
                           absl::StrCat(": uneven slices must follow AutoTP's split of ", sum, " over tp ", tp, " (",
                                        absl::StrJoin(want, ", "), " on dim ", dim, ")"));
    }
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

absl::StatusOr<std::vector<std::vector<int64_t>>> AutoTpSliceShapes(const MergeRule& rule,
                                                                    const std::vector<int64_t>& full, int tp,
                                                                    int64_t padded_rows, absl::string_view name) {
  const bool cat = rule.kind() == COLUMN || rule.kind() == ROW || (rule.kind() == VOCAB && !full.empty() &&
                                                                   padded_rows == full[0]);
  const int64_t dim = PartitionDim(rule);
  if (!cat || dim >= static_cast<int64_t>(full.size())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "param '", name, "': AutoTP's uneven widths apply to column, row and unpadded vocabulary params only, not ",
        DescribeRule(rule), " of ", torch::ShapeString(full)));
  }
  if (AutoTpCutsByHeads(name)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "param '", name, "': dim ", dim, " of ", torch::ShapeString(full), " does not split evenly over tp ", tp,
        ", and AutoTP cuts attention projections in whole key-value heads, whose count ucp does not know: "
        "choose a tp that divides the heads"));
  }
  std::vector<std::vector<int64_t>> out(tp, full);
  for (int r = 0; r < tp; ++r) out[r][dim] = AutoTpWidth(full[dim], tp, r);
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
    UCP_ASSIGN_OR_RETURN(SubShape s, ResolveSubShape(rule.sub_param_shape(), name));
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
    UCP_ASSIGN_OR_RETURN(SubShape s, ResolveSubShape(rule.sub_param_shape(), name));
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
        UCP_ASSIGN_OR_RETURN(SubShape s, ResolveSubShape(rule.sub_param_shape(), name));
        std::vector<int64_t> part_shape = s.full_shape;
        if (part_shape[s.partition_dim] % tp != 0) {
          return Err(name, absl::StrCat("sub_param_shape dim ", s.partition_dim, " is not divisible by tp ", tp));
        }
        part_shape[s.partition_dim] /= tp;
        std::vector<TensorPlan> views;
        for (const TensorPlan& sl : slices) {
          UCP_ASSIGN_OR_RETURN(TensorPlan v, sl.Reshape(part_shape), _.Prepend(absl::StrCat("param '", name, "': ")));
          views.push_back(std::move(v));
        }
        std::vector<TensorPlan> merged;
        int64_t offset = 0;
        for (int64_t sub : s.sub_sizes) {
          if (sub % tp != 0) return Err(name, absl::StrCat("sub-param size ", sub, " is not divisible by tp ", tp));
          const int64_t part = sub / tp;
          std::vector<TensorPlan> pieces;
          for (const TensorPlan& v : views) {
            UCP_ASSIGN_OR_RETURN(TensorPlan p, v.Narrow(s.partition_dim, offset, part));
            pieces.push_back(std::move(p));
          }
          UCP_ASSIGN_OR_RETURN(TensorPlan m, TensorPlan::Cat(pieces, s.partition_dim));
          merged.push_back(std::move(m));
          offset += part;
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

absl::StatusOr<TensorPlan> SplitFull(const MergeRule& rule, const TensorPlan& full, int tp, int rank,
                                     int64_t padded_rows, absl::string_view name, bool autotp_widths) {
  UCP_RETURN_IF_ERROR(ValidateRule(rule, name));
  if (rank < 0 || rank >= tp) return Err(name, absl::StrCat("tp rank ", rank, " outside tp ", tp));
  const int64_t pdim = PartitionDim(rule);
  if (autotp_widths && (rule.kind() == COLUMN || rule.kind() == ROW || rule.kind() == VOCAB) &&
      pdim < full.dim() && full.shape()[pdim] % tp != 0) {
    UCP_ASSIGN_OR_RETURN(auto shapes, AutoTpSliceShapes(rule, full.shape(), tp, padded_rows, name));
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
    case SUB_PARAMS: {
      if (rule.sub_param_shape().dim_size() > 0) {
        UCP_ASSIGN_OR_RETURN(SubShape s, ResolveSubShape(rule.sub_param_shape(), name));
        UCP_ASSIGN_OR_RETURN(TensorPlan view, full.Reshape(s.full_shape),
                             _.Prepend(absl::StrCat("param '", name, "': ")));
        std::vector<TensorPlan> pieces;
        int64_t offset = 0;
        for (int64_t sub : s.sub_sizes) {
          const int64_t part = sub / tp;
          UCP_ASSIGN_OR_RETURN(TensorPlan p, view.Narrow(s.partition_dim, offset + rank * part, part));
          pieces.push_back(std::move(p));
          offset += sub;
        }
        return TensorPlan::Cat(pieces, s.partition_dim);
      }
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
