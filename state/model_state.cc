#include "state/model_state.h"

namespace ucp::state {

const char* OptimizerKindName(OptimizerKind kind) { return kind == OptimizerKind::kBf16 ? "bf16" : "zero"; }

const char* TensorRoleName(TensorRole role) {
  switch (role) {
    case TensorRole::kTrainable: return "trainable";
    case TensorRole::kFrozen: return "frozen";
    case TensorRole::kBuffer: return "buffer";
    case TensorRole::kTied: return "tied";
  }
  return "?";
}


void ModelInfo::Reindex() {
  index_.clear();
  for (size_t i = 0; i < params.size(); ++i) index_.emplace(params[i].name, static_cast<int>(i));
}

int ModelInfo::IndexOf(const std::string& name) const {
  if (index_.size() == params.size()) {
    auto it = index_.find(name);
    return it == index_.end() ? -1 : it->second;
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

std::vector<int> ModelInfo::ModuleOrderIndices() const {
  std::vector<int> order;
  std::vector<bool> listed(params.size(), false);
  for (const auto& k : module_order) {
    const int i = IndexOf(k.name);
    if (i >= 0 && !listed[i]) {
      listed[i] = true;
      order.push_back(i);
    }
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (!listed[i]) order.push_back(static_cast<int>(i));
  }
  return order;
}

const ParamState* ModelInfo::Find(const std::string& name) const {
  const int i = IndexOf(name);
  return i < 0 ? nullptr : &params[i];
}

}  // namespace ucp::state
