#include "deepspeed/universal_metadata.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "format/pickle/accessors.h"

namespace ucp::deepspeed {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

pickle::ValuePtr SubparamShapeValue(const MergeRule& rule) {
  const SubParamShape& s = rule.sub_param_shape();
  std::vector<ValuePtr> dims;
  for (const auto& d : s.dim()) {
    if (d.size_size() == 1) {
      dims.push_back(Value::Int(d.size(0)));
    } else {
      std::vector<ValuePtr> sizes;
      for (int64_t x : d.size()) sizes.push_back(Value::Int(x));
      dims.push_back(Value::Tuple(std::move(sizes)));
    }
  }
  ValuePtr state = Value::MakeDict();
  state->DictSet(Value::Str("patterns"), Value::List({Value::Str(rule.pattern())}));
  // AutoTP's universal_checkpoint_info (format 0.4, the one with shard
  // widths) publishes the shape as a list, which ds_to_universal.py passes on.
  const bool autotp = s.shard_widths_size() > 0;
  state->DictSet(Value::Str("shape"), autotp ? Value::List(std::move(dims)) : Value::Tuple(std::move(dims)));
  state->DictSet(Value::Str("partition_dim"), Value::Int(s.partition_dim()));
  pickle::Object o;
  o.callable = Value::Global("deepspeed.checkpoint.universal_checkpoint", "SubparamShape");
  o.how = pickle::ObjectHow::kNewObj;
  o.args = Value::Tuple({});
  o.state = state;
  return Value::MakeObject(std::move(o));
}

pickle::ValuePtr UniversalParamDict(const MergeRule& rule, pickle::ValuePtr param_value) {
  ValuePtr d = Value::MakeDict();
  switch (rule.kind()) {
    case COLUMN:
      d->DictSet(Value::Str("cat_dim"), Value::Int(0));
      break;
    case ROW:
      d->DictSet(Value::Str("cat_dim"), Value::Int(1));
      break;
    case VOCAB:
      d->DictSet(Value::Str("cat_dim"), Value::Int(0));
      d->DictSet(Value::Str("vocab_tensor"), Value::Bool(true));
      break;
    case SUB_PARAMS:
      if (rule.sub_param_shape().dim_size() > 0) {
        d->DictSet(Value::Str("sub_param_shape"), SubparamShapeValue(rule));
      } else {
        d->DictSet(Value::Str("cat_dim"), Value::Int(rule.cat_dim()));
        d->DictSet(Value::Str("param_n_sub_params"), Value::Int(rule.num_sub_params()));
      }
      break;
    default:  // REPLICATED, AVERAGE: the full tensor alone
      break;
  }
  d->DictSet(Value::Str("param"), std::move(param_value));
  return d;
}

const Value* SubparamShapeFields(const Value& v) {
  const Value* fields = &v;
  if (fields->is(Kind::kObject) && fields->object().state) fields = fields->object().state.get();
  return fields->is(Kind::kDict) ? fields : nullptr;
}

absl::StatusOr<SubParamShape> ParseSubparamShape(const Value& v, const std::string& what,
                                                 std::optional<int32_t> default_partition_dim) {
  const Value* fields = SubparamShapeFields(v);
  if (fields == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": expected a SubparamShape or a dict, found ", v.DebugString(80)));
  }
  SubParamShape out;
  const Value* pd = fields->DictGet("partition_dim");
  if (pd == nullptr && !default_partition_dim) {
    return absl::InvalidArgumentError(absl::StrCat(what, " has no partition_dim"));
  }
  int64_t partition_dim = default_partition_dim.value_or(0);
  if (pd != nullptr) {
    UCP_ASSIGN_OR_RETURN(partition_dim, pickle::AsInt(*pd, absl::StrCat(what, ".partition_dim")));
  }
  out.set_partition_dim(static_cast<int32_t>(partition_dim));
  const Value* shape = fields->DictGet("shape");
  if (shape == nullptr) return absl::InvalidArgumentError(absl::StrCat(what, " has no shape"));
  const std::string shape_what = absl::StrCat(what, ".shape");
  UCP_ASSIGN_OR_RETURN(auto* dims, pickle::AsSequence(*shape, shape_what));
  for (const auto& d : *dims) {
    SubParamShape::Dim* od = out.add_dim();
    auto add_size = [&](const Value& x) -> absl::Status {
      UCP_ASSIGN_OR_RETURN(int64_t size, pickle::AsInt(x, shape_what));
      od->add_size(size);
      return absl::OkStatus();
    };
    // A dim is one size, or a tuple of the sizes of uneven sub-params.
    if (d->is(Kind::kTuple) || d->is(Kind::kList)) {
      for (const auto& x : d->items()) UCP_RETURN_IF_ERROR(add_size(*x));
    } else {
      UCP_RETURN_IF_ERROR(add_size(*d));
    }
  }
  return out;
}

absl::StatusOr<MergeRule> RuleFromUniversalMetadata(const Value& dict, const std::string& name) {
  MergeRule rule;
  rule.set_pattern(name);
  auto err = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("param '", name, "': ", what));
  };
  if (const Value* sps = dict.DictGet("sub_param_shape"); sps != nullptr && !sps->is_none()) {
    rule.set_kind(SUB_PARAMS);
    UCP_ASSIGN_OR_RETURN(*rule.mutable_sub_param_shape(),
                         ParseSubparamShape(*sps, absl::StrCat("param '", name, "': sub_param_shape"), std::nullopt));
    return rule;
  }
  const Value* cat = dict.DictGet("cat_dim");
  if (cat == nullptr || cat->is_none()) {
    rule.set_kind(REPLICATED);
    return rule;
  }
  UCP_ASSIGN_OR_RETURN(int64_t cat_dim, pickle::AsInt(*cat, "cat_dim"));
  int64_t n_sub = 1;
  if (const Value* n = dict.DictGet("param_n_sub_params"); n != nullptr && !n->is_none()) {
    UCP_ASSIGN_OR_RETURN(n_sub, pickle::AsInt(*n, "param_n_sub_params"));
  }
  bool vocab = false;
  if (const Value* v = dict.DictGet("vocab_tensor"); v != nullptr && !v->is_none()) {
    UCP_ASSIGN_OR_RETURN(vocab, pickle::AsBool(*v, "vocab_tensor"));
  }
  if (n_sub > 1) {
    rule.set_kind(SUB_PARAMS);
    rule.set_num_sub_params(static_cast<int32_t>(n_sub));
    rule.set_cat_dim(static_cast<int32_t>(cat_dim));
  } else if (vocab) {
    if (cat_dim != 0) return err(absl::StrCat("vocab_tensor with cat_dim ", cat_dim, " (only 0 is supported)"));
    rule.set_kind(VOCAB);
  } else if (cat_dim == 0) {
    rule.set_kind(COLUMN);
  } else if (cat_dim == 1) {
    rule.set_kind(ROW);
  } else {
    // Any other dim: one "sub-param" concatenated on that dim.
    rule.set_kind(SUB_PARAMS);
    rule.set_num_sub_params(1);
    rule.set_cat_dim(static_cast<int32_t>(cat_dim));
  }
  return rule;
}

}  // namespace ucp::deepspeed
