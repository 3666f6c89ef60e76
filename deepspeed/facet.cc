#include "deepspeed/facet.h"

#include "format/pickle/accessors.h"

namespace ucp::deepspeed {
namespace {

using pickle::Kind;
using pickle::Value;

const Value& EmptyDict() {
  static const pickle::ValuePtr* empty = new pickle::ValuePtr(Value::MakeDict());
  return **empty;
}

}  // namespace

state::FacetKey DeepSpeedFacet::Key() {
  static const char key = 0;
  return &key;
}

state::FileValue DeepSpeedFacet::SavedDsConfig() const {
  const state::FileValue root = ModelStatesRoot(0, 0);
  if (!root.value || !root.value->is(Kind::kDict)) return state::FileValue{};
  return state::FileValue{root.value->DictGetPtr("ds_config"), root.file};
}

const pickle::Value& DeepSpeedFacet::checkpoint_info() const {
  const state::FileValue root = ModelStatesRoot(0, 0);
  if (!root.value || !root.value->is(Kind::kDict)) return EmptyDict();
  const Value* info = root.value->DictGet("universal_checkpoint_info");
  return info != nullptr && info->is(Kind::kDict) ? *info : EmptyDict();
}

const pickle::Value* DeepSpeedFacet::args() const {
  const state::FileValue root = ModelStatesRoot(0, 0);
  if (!root.value || !root.value->is(Kind::kDict)) return nullptr;
  const Value* a = root.value->DictGet("args");
  if (a == nullptr) return nullptr;
  if (a->is(Kind::kDict)) return a;
  if (auto ns = pickle::AsNamespace(*a, "args"); ns.ok()) return *ns;
  return nullptr;
}

const pickle::Value& CheckpointInfoOf(const state::CheckpointState& state) {
  const DeepSpeedFacet* ds = FacetOf(state);
  return ds != nullptr ? ds->checkpoint_info() : EmptyDict();
}

const pickle::Value* ArgsOf(const state::CheckpointState& state) {
  const DeepSpeedFacet* ds = FacetOf(state);
  return ds != nullptr ? ds->args() : nullptr;
}

std::string SourceDsVersion(const state::CheckpointState& state) {
  const DeepSpeedFacet* ds = FacetOf(state);
  if (ds == nullptr) return "";
  auto common = ds->OptimizerCommon();
  if (common.ok() && common->value && common->value->is(Kind::kDict)) {
    const Value* v = common->value->DictGet("ds_version");
    if (v != nullptr && v->is(Kind::kStr)) return v->str();
  }
  state::FileValue root = ds->ModelStatesRoot(0, 0);
  if (root.value && root.value->is(Kind::kDict)) {
    const Value* v = root.value->DictGet("ds_version");
    if (v != nullptr && v->is(Kind::kStr)) return v->str();
  }
  return "";
}

}  // namespace ucp::deepspeed
