#include "deepspeed/zero_target_parts.h"

#include <set>
#include <tuple>

#include "base/status_macros.h"
#include "deepspeed/facet.h"
#include "deepspeed/tree_copy.h"

namespace ucp::deepspeed {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

std::string TargetDsVersion(const state::CheckpointState& state, const std::string& target_ds_version) {
  return target_ds_version.empty() ? SourceDsVersion(state) : target_ds_version;
}

absl::StatusOr<ValuePtr> RetargetDsConfig(const state::FileValue& config, torch::TorchWriter& writer, int stage,
                                          int64_t sub_group_size, int tp) {
  UCP_ASSIGN_OR_RETURN(ValuePtr c, CopyTreeForWrite(config, writer));
  if (!c->is(Kind::kDict)) return c;
  if (ValuePtr z = c->DictGetPtr("zero_optimization"); z && z->is(Kind::kDict)) {
    if (z->DictGet("stage")) z->DictSet(Value::Str("stage"), Value::Int(stage));
    if (sub_group_size > 0) z->DictSet(Value::Str("sub_group_size"), Value::Int(sub_group_size));
  }
  if (ValuePtr ck = c->DictGetPtr("checkpoint"); ck && ck->is(Kind::kDict) && ck->DictGet("load_universal")) {
    ck->DictSet(Value::Str("load_universal"), Value::Bool(false));
  }
  if (ValuePtr t = c->DictGetPtr("tensor_parallel"); tp > 0 && t && t->is(Kind::kDict) && t->DictGet("autotp_size")) {
    t->DictSet(Value::Str("autotp_size"), Value::Int(tp));
  }
  return c;
}

ValuePtr SingleRankParallelDimensions() {
  ValuePtr dims = Value::MakeDict();
  dims->DictSet(Value::Str("pp_degree"), Value::Int(1));
  dims->DictSet(Value::Str("tp_degree"), Value::Int(1));
  return dims;
}

std::vector<state::InputRange> EveryParamInput(const state::CheckpointState& state) {
  std::vector<state::InputRange> all;
  std::set<std::tuple<std::string, std::string, int64_t>> seen;
  for (const state::ParamState& p : state.info().params) {
    for (const state::InputRange& r : state.Inputs(p)) {
      if (seen.insert({r.path, r.tensor, r.offset}).second) all.push_back(r);
    }
  }
  return all;
}

}  // namespace ucp::deepspeed
