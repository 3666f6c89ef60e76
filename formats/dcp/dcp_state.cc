#include "formats/dcp/dcp_state.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/fs.h"
#include "base/status_macros.h"
#include "deepspeed/engine_defaults.h"
#include "format/pickle/writer.h"

namespace ucp::dcp {
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;
using tp::TensorPlan;

constexpr char kStatePart[] = "state.";
constexpr char kGroupsPart[] = "param_groups.";

std::string Shape(torch::DType dtype, const std::vector<int64_t>& size) {
  return absl::StrCat(std::string(torch::DTypeName(dtype)), "[", absl::StrJoin(size, ", "), "]");
}

// The position of `part` in `key` as a whole component ("a.state.x": 2), or npos.
size_t ComponentAt(const std::string& key, const char* part) {
  for (size_t i = key.find(part); i != std::string::npos; i = key.find(part, i + 1)) {
    if (i == 0 || key[i - 1] == '.') return i;
  }
  return std::string::npos;
}

// The chunks of one box of the tensor, tiled by cuts no chunk crosses
// (along the first dim that has some), recursively: torch's shardings
// (Shard(d) on any mesh, FSDP2's uneven dim-0 pieces, 2-D meshes) all tile so.
struct Box {
  std::vector<int64_t> start, size;
};

absl::StatusOr<TensorPlan> Tile(const DcpEntry& e, const std::vector<const DcpChunk*>& chunks,
                                const std::vector<TensorPlan>& plans, const std::vector<int>& in, const Box& box) {
  int64_t numel = 1;
  for (int64_t s : box.size) numel *= s;
  if (numel == 0) return TensorPlan::Zeros(e.dtype, box.size);
  if (in.size() == 1 && chunks[in[0]]->offsets == box.start && chunks[in[0]]->sizes == box.size) return plans[in[0]];
  for (size_t d = 0; d < box.size.size(); ++d) {
    std::set<int64_t> cuts;
    for (int i : in) {
      const int64_t s = chunks[i]->offsets[d];
      if (s > box.start[d] && s < box.start[d] + box.size[d]) cuts.insert(s);
    }
    for (auto it = cuts.begin(); it != cuts.end();) {
      bool crossed = false;
      for (int i : in) {
        crossed |= chunks[i]->offsets[d] < *it && chunks[i]->offsets[d] + chunks[i]->sizes[d] > *it;
      }
      it = crossed ? cuts.erase(it) : std::next(it);
    }
    if (cuts.empty()) continue;
    std::vector<int64_t> bounds = {box.start[d]};
    bounds.insert(bounds.end(), cuts.begin(), cuts.end());
    bounds.push_back(box.start[d] + box.size[d]);
    std::vector<TensorPlan> parts;
    for (size_t b = 0; b + 1 < bounds.size(); ++b) {
      Box sub = box;
      sub.start[d] = bounds[b];
      sub.size[d] = bounds[b + 1] - bounds[b];
      std::vector<int> sub_in;
      for (int i : in) {
        if (chunks[i]->offsets[d] >= bounds[b] && chunks[i]->offsets[d] < bounds[b + 1]) sub_in.push_back(i);
      }
      UCP_ASSIGN_OR_RETURN(TensorPlan p, Tile(e, chunks, plans, sub_in, sub));
      parts.push_back(std::move(p));
    }
    return TensorPlan::Cat(parts, static_cast<int64_t>(d));
  }
  return absl::UnimplementedError(absl::StrCat("entry '", e.key, "': its ", in.size(),
                                               " chunks do not split the tensor by straight cuts (ucp assembles the "
                                               "layouts of torch's shardings)"));
}

bool IsScalarEntry(const DcpEntry& e) { return !e.tensor || e.size.empty(); }

// A model tensor of a plain (tp = pp = 1) module: `group` -1 outside the optimizer.
state::ParamState ParamOf(const std::string& fqn, const DcpEntry& e, state::TensorRole role, int group) {
  state::ParamState p;
  p.name = fqn;
  p.local_name = fqn;
  p.group = group;
  p.role = role;
  p.lp_dtype = e.dtype;
  p.tp_shapes = {e.size};
  p.stages = {0};
  return p;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DcpState>> DcpState::Open(const std::string& dir, const DcpReadOptions& options) {
  std::unique_ptr<DcpState> s(new DcpState());
  s->dir_ = dir;
  s->options_ = options;
  UCP_RETURN_IF_ERROR(s->Load());
  return s;
}

absl::Status DcpState::Load() {
  UCP_ASSIGN_OR_RETURN(metadata_, ReadMetadata(dir_));
  for (const std::string& f : metadata_.Files()) UCP_RETURN_IF_ERROR(File(f).status());
  std::vector<std::string> fqns;
  UCP_RETURN_IF_ERROR(FindPrefixes(&fqns));
  UCP_RETURN_IF_ERROR(ReadGroups(fqns));
  UCP_RETURN_IF_ERROR(BuildInfo(fqns));
  UCP_RETURN_IF_ERROR(CheckScalars());
  return BuildFacet();
}

// P: the prefix of the param_groups entries; the states' fqns; M: the
// prefix that makes every one of them a model key.
absl::Status DcpState::FindPrefixes(std::vector<std::string>* fqns) {
  const std::string& path = metadata_.path;
  std::set<std::string> prefixes;
  for (const DcpEntry& e : metadata_.entries) {
    if (e.tensor) continue;
    const size_t i = ComponentAt(e.key, kGroupsPart);
    if (i != std::string::npos) prefixes.insert(e.key.substr(0, i));
  }
  if (prefixes.empty()) return FindWeights(fqns);
  if (prefixes.size() > 1) {
    return absl::UnimplementedError(absl::StrCat(path, ": the param groups of several optimizers (prefixes '",
                                                 absl::StrJoin(prefixes, "', '"), "'): ucp reads one"));
  }
  optim_prefix_ = *prefixes.begin();
  const std::string state_prefix = optim_prefix_ + kStatePart;
  for (const DcpEntry& e : metadata_.entries) {
    if (!absl::StartsWith(e.key, state_prefix)) continue;
    const std::string rest = e.key.substr(state_prefix.size());
    const size_t dot = rest.rfind('.');
    if (dot == std::string::npos || dot == 0) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": optimizer entry '", e.key, "' is not <fqn>.<state>"));
    }
    const std::string fqn = rest.substr(0, dot);
    auto [it, added] = params_.try_emplace(fqn);
    if (added) fqns->push_back(fqn);
    it->second.states[rest.substr(dot + 1)] = e.key;
  }
  if (fqns->empty()) {
    return absl::UnimplementedError(absl::StrCat(path, ": param groups under '", optim_prefix_,
                                                 "' but no optimizer state ('", state_prefix,
                                                 "<fqn>.exp_avg', ...): the optimizer never stepped"));
  }
  // M: try the prefixes that make the first fqn a model key.
  const std::string& f0 = fqns->front();
  std::vector<std::string> candidates = {"model."};
  for (const DcpEntry& e : metadata_.entries) {
    if (!e.tensor || (!optim_prefix_.empty() && absl::StartsWith(e.key, optim_prefix_))) continue;
    if (absl::EndsWith(e.key, f0) &&
        (e.key.size() == f0.size() || e.key[e.key.size() - f0.size() - 1] == '.')) {
      candidates.push_back(e.key.substr(0, e.key.size() - f0.size()));
    }
  }
  for (const std::string& m : candidates) {
    bool all = true;
    for (const std::string& f : *fqns) {
      const DcpEntry* e = metadata_.Find(m + f);
      all = all && e != nullptr && e->tensor && !absl::StartsWith(m + f, state_prefix);
    }
    if (all) {
      model_prefix_ = m;
      for (auto& [f, p] : params_) p.model_key = m + f;
      layout_ = absl::StrCat("model entries '", m, "<fqn>', optimizer '", optim_prefix_, "'");
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(path, ": the optimizer state names param '", f0,
                                                 "', which is no model entry ('model.", f0, "', '", f0,
                                                 "' or another prefix of it)"));
}

// A weights-only DCP: every tensor entry a param, M = "model." when every
// entry is under it (dcp.save({"model": sd})), else "" (dcp.save(sd)).
absl::Status DcpState::FindWeights(std::vector<std::string>* fqns) {
  weights_only_ = true;
  bool all_model = true, any = false;
  for (const DcpEntry& e : metadata_.entries) {
    if (!e.tensor) continue;
    any = true;
    all_model = all_model && absl::StartsWith(e.key, "model.") && e.key.size() > 6;
  }
  if (!any) {
    return absl::InvalidArgumentError(
        absl::StrCat(metadata_.path, ": no tensor entry and no optimizer state: nothing to read"));
  }
  model_prefix_ = all_model ? "model." : "";
  for (const DcpEntry& e : metadata_.entries) {
    if (!e.tensor) continue;
    const std::string fqn = e.key.substr(model_prefix_.size());
    params_[fqn].model_key = e.key;
    fqns->push_back(fqn);
  }
  layout_ = absl::StrCat("model entries '", model_prefix_, "<fqn>', no optimizer state (weights only)");
  return absl::OkStatus();
}

absl::Status DcpState::ReadGroups(const std::vector<std::string>& fqns) {
  const std::string& path = metadata_.path;
  if (weights_only_) {  // one group of every param, DeepSpeed's default hyper-parameters (BuildFacet)
    groups_ = {fqns};
    hyper_ = {Value::MakeDict()};
    return absl::OkStatus();
  }
  const std::string gp = optim_prefix_ + kGroupsPart;
  // The hyper-parameters under `prefix` (<prefix><hp>, hp without a dot).
  auto hyper_under = [&](const std::string& prefix) -> absl::StatusOr<ValuePtr> {
    ValuePtr d = Value::MakeDict();
    for (const DcpEntry& e : metadata_.entries) {
      if (e.tensor || !absl::StartsWith(e.key, prefix)) continue;
      const std::string hp = e.key.substr(prefix.size());
      if (hp.empty() || hp.find('.') != std::string::npos || hp == "params") continue;
      UCP_ASSIGN_OR_RETURN(state::FileValue v, BytesValue(e));
      d->DictSet(Value::Str(hp), v.value);
    }
    return d;
  };
  std::set<std::string> grouped;
  if (metadata_.Find(gp + "0.params") != nullptr) {
    layout_ += " (param groups nested: torch's default)";
    for (int g = 0;; ++g) {
      const DcpEntry* list = metadata_.Find(absl::StrCat(gp, g, ".params"));
      if (list == nullptr) break;
      UCP_ASSIGN_OR_RETURN(state::FileValue names, BytesValue(*list));
      if (!names.value->is(Kind::kList) && !names.value->is(Kind::kTuple)) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": '", list->key, "' is ",
                                                       names.value->DebugString(80), ", not a list of param names"));
      }
      std::vector<std::string> members;
      for (const ValuePtr& n : names.value->items()) {
        if (!n->is(Kind::kStr)) {
          return absl::InvalidArgumentError(absl::StrCat(path, ": '", list->key, "' lists ", n->DebugString(40),
                                                         ", not a param name"));
        }
        // A param the optimizer holds but never stepped (frozen: no
        // gradient, so no state): not trainable here.
        if (params_.count(n->str()) == 0) {
          info_.notes.push_back(absl::StrCat("param '", n->str(), "' is in param group ", g,
                                             " but has no optimizer state: read as a frozen param"));
          continue;
        }
        if (!grouped.insert(n->str()).second) {
          return absl::InvalidArgumentError(absl::StrCat(path, ": param '", n->str(), "' is in two param groups"));
        }
        members.push_back(n->str());
      }
      UCP_ASSIGN_OR_RETURN(ValuePtr hp, hyper_under(absl::StrCat(gp, g, ".")));
      if (members.empty()) continue;  // a group of frozen params only
      groups_.push_back(std::move(members));
      hyper_.push_back(std::move(hp));
    }
  } else {
    layout_ += " (param groups flattened per param: flatten_optimizer_state_dict)";
    std::map<std::string, int> by_values;
    for (const std::string& f : fqns) {
      UCP_ASSIGN_OR_RETURN(ValuePtr hp, hyper_under(absl::StrCat(gp, f, ".")));
      if (hp->dict_items().empty()) continue;
      UCP_ASSIGN_OR_RETURN(std::string key, pickle::Pickle(*hp));
      auto [it, added] = by_values.emplace(key, static_cast<int>(groups_.size()));
      if (added) {
        groups_.emplace_back();
        hyper_.push_back(hp);
      }
      groups_[it->second].push_back(f);
      grouped.insert(f);
    }
  }
  for (const std::string& f : fqns) {
    if (grouped.count(f) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": param '", f, "' has optimizer state but is in no param group of '", gp, "*'"));
    }
  }
  return absl::OkStatus();
}

// A weights-only DCP: the one floating dtype of every weight (DeepSpeed
// keeps one for a model's weights).
absl::StatusOr<torch::DType> DcpState::WeightsDtype(const std::vector<std::string>& fqns) {
  const std::string& path = metadata_.path;
  const DcpEntry* first = nullptr;
  for (const std::string& f : fqns) {
    const DcpEntry& m = *metadata_.Find(params_[f].model_key);
    if (m.dtype != torch::DType::kFloat32 && m.dtype != torch::DType::kBFloat16 && m.dtype != torch::DType::kFloat16) {
      return absl::UnimplementedError(absl::StrCat(path, ": '", m.key, "' is ", Shape(m.dtype, m.size),
                                                   ": a weights-only DCP is read as trainable weights, every "
                                                   "one floating point (float32, bfloat16 or float16)"));
    }
    if (first == nullptr) first = &m;
    if (m.dtype != first->dtype) {
      return absl::UnimplementedError(absl::StrCat(path, ": weights of two dtypes ('", first->key, "' is ",
                                                   Shape(first->dtype, first->size), ", '", m.key, "' ",
                                                   Shape(m.dtype, m.size),
                                                   "); DeepSpeed keeps one dtype for a model's weights"));
    }
  }
  return first != nullptr ? first->dtype : torch::DType::kFloat32;
}

absl::Status DcpState::BuildInfo(const std::vector<std::string>& fqns) {
  const std::string& path = metadata_.path;
  // Which state names are per-element and which per group (step).
  std::set<std::string> names;
  for (const auto& [f, p] : params_) {
    for (const auto& [n, k] : p.states) names.insert(n);
  }
  for (const std::string& n : names) {
    bool per_element = true, scalar = true;
    for (const auto& [f, p] : params_) {
      auto it = p.states.find(n);
      if (it == p.states.end()) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": param '", f, "' has no optimizer state '", n,
                                                       "', which other params have"));
      }
      const DcpEntry& s = *metadata_.Find(it->second);
      const DcpEntry& m = *metadata_.Find(p.model_key);
      per_element = per_element && s.tensor && s.size == m.size;
      scalar = scalar && IsScalarEntry(s);
    }
    if (per_element && (!scalar || n != "step")) {
      state_keys_.push_back(n);
    } else if (scalar) {
      scalar_keys_.push_back(n);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(path, ": optimizer state '", n,
                                                     "' is neither the size of each param nor one value per param"));
    }
  }
  if (weights_only_) {  // the fresh state
    state_keys_ = {"exp_avg", "exp_avg_sq"};
    scalar_keys_ = {"step"};
  }
  // "exp_avg" before "exp_avg_sq" and the like: torch's order, then the rest.
  std::stable_sort(state_keys_.begin(), state_keys_.end(), [](const std::string& a, const std::string& b) {
    auto rank = [](const std::string& s) { return s == "exp_avg" ? 0 : s == "exp_avg_sq" ? 1 : 2; };
    return rank(a) < rank(b);
  });
  info_.num_groups = static_cast<int>(groups_.size());
  info_.state_keys = state_keys_;
  info_.scalar_keys = scalar_keys_;
  info_.pipeline = false;
  info_.zero_stage = 1;
  info_.optimizer_kind = state::OptimizerKind::kZero;
  info_.lp_dtype = torch::DType::kFloat32;
  if (weights_only_) {
    UCP_ASSIGN_OR_RETURN(info_.lp_dtype, WeightsDtype(fqns));
  }
  int ranks = 1;
  for (const std::string& f : metadata_.Files()) {
    int r = 0;
    if (absl::StartsWith(f, "__") && f.find('_', 2) != std::string::npos &&
        absl::SimpleAtoi(f.substr(2, f.find('_', 2) - 2), &r)) {
      ranks = std::max(ranks, r + 1);
    }
  }
  info_.source_topology = state::Topology{1, 1, ranks};
  std::set<std::string> trainable;
  for (int g = 0; g < info_.num_groups; ++g) {
    for (const std::string& f : groups_[g]) {
      const DcpEntry& m = *metadata_.Find(params_[f].model_key);
      if (m.dtype != info_.lp_dtype) {
        return absl::UnimplementedError(absl::StrCat(
            path, ": trainable param '", f, "' is ", Shape(m.dtype, m.size),
            ": ucp reads DCP training states whose trainable params are float32 (their own fp32 masters)"));
      }
      info_.params.push_back(ParamOf(f, m, state::TensorRole::kTrainable, g));
      trainable.insert(f);
    }
  }
  const size_t num_trainable = info_.params.size();
  for (const DcpEntry& e : metadata_.entries) {
    if (!e.tensor || !absl::StartsWith(e.key, model_prefix_) ||
        (!optim_prefix_.empty() && absl::StartsWith(e.key, optim_prefix_))) {
      continue;
    }
    const std::string f = e.key.substr(model_prefix_.size());
    info_.module_order.push_back({-1, f});
    if (trainable.count(f)) continue;
    state::ParamState p = ParamOf(f, e, state::TensorRole::kFrozen, -1);
    // A tied name (lm_head.weight of tied embeddings): FSDP2's model state
    // dict holds both names, the optimizer one; their values are the same.
    std::optional<TensorPlan> a;  // assembled once, for the first candidate
    for (size_t t = 0; t < num_trainable; ++t) {
      const state::ParamState& o = info_.params[t];
      if (o.tp_shapes[0] != e.size || o.lp_dtype != e.dtype) continue;
      if (!a) {
        UCP_ASSIGN_OR_RETURN(a, Assemble(e));
      }
      UCP_ASSIGN_OR_RETURN(TensorPlan b, Assemble(*metadata_.Find(params_[o.name].model_key)));
      UCP_ASSIGN_OR_RETURN(bool same, TensorPlan::BitwiseEqual(*a, b));
      if (same) {
        p.role = state::TensorRole::kTied;
        p.alias_of = o.name;
        info_.notes.push_back(absl::StrCat("DCP source: '", f, "' is no optimizer param and equals '", o.name,
                                           "' bitwise: read as a tied name of it"));
        break;
      }
    }
    info_.params.push_back(std::move(p));
  }
  if (weights_only_) {
    info_.notes.push_back(absl::StrCat(
        "DCP source: no optimizer state (weights only); written fresh (fp32 masters = the ",
        std::string(torch::DTypeName(info_.lp_dtype)),
        " weights, exp_avg and exp_avg_sq 0, step 0, DeepSpeed's default param group): load it in DeepSpeed with "
        "load_checkpoint(..., load_module_only=True) so that the job's own optimizer starts from the weights; "
        "FSDP2 loads a DCP written from it as a fresh AdamW"));
  }
  info_.notes.push_back(absl::StrCat(
      "DCP source: a DeepSpeed target records clip_grad ", options_.clip_grad,
      " (DCP keeps no gradient clipping; DeepSpeed's ZeRO optimizers restore clip_grad from the checkpoint over "
      "their config's gradient_clipping: set it with --source_option=", kClipGradOption, "=X)"));
  info_.notes.push_back(absl::StrCat("DCP source: ", layout_, "; ", num_trainable, " trainable params in ",
                                     info_.num_groups, " groups, ", info_.params.size() - num_trainable,
                                     " other model tensors (frozen or tied)"));
  info_.Reindex();
  return absl::OkStatus();
}

// Every group's scalars (step) agree: DeepSpeed keeps one per group. Keeps
// group 0's step (global_steps of the facet) in `group0_step_`.
absl::Status DcpState::CheckScalars() {
  if (weights_only_) {
    group0_step_ = 0;
    UCP_ASSIGN_OR_RETURN(fresh_step_, deepspeed::FreshAdamStep());
    return absl::OkStatus();
  }
  for (int g = 0; g < info_.num_groups; ++g) {
    for (const std::string& key : scalar_keys_) {
      std::string first_bytes;
      for (size_t j = 0; j < groups_[g].size(); ++j) {
        const DcpEntry& e = *metadata_.Find(params_[groups_[g][j]].states[key]);
        std::string bytes;
        std::optional<int64_t> number;  // the value as a step count
        if (e.tensor) {
          UCP_ASSIGN_OR_RETURN(TensorPlan t, Assemble(e));
          UCP_ASSIGN_OR_RETURN(torch::Tensor m, t.Materialize());
          bytes = absl::StrCat(std::string(torch::DTypeName(m.dtype())), ":", m.ContiguousBytes());
          if (m.dtype() == torch::DType::kFloat32 && m.numel() == 1) {
            float v = 0;
            std::memcpy(&v, m.data(), sizeof v);
            number = static_cast<int64_t>(v);
          } else if (m.dtype() == torch::DType::kInt64 && m.numel() == 1) {
            int64_t v = 0;
            std::memcpy(&v, m.data(), sizeof v);
            number = v;
          }
        } else {
          UCP_ASSIGN_OR_RETURN(state::FileValue v, BytesValue(e));
          UCP_ASSIGN_OR_RETURN(bytes, pickle::Pickle(*v.value));
          if (v.value->is(Kind::kInt)) number = v.value->int_value();
          if (v.value->is(Kind::kFloat)) number = static_cast<int64_t>(v.value->float_value());
        }
        if (j == 0) {
          first_bytes = bytes;
          if (g == 0 && key == "step") group0_step_ = number;
        } else if (bytes != first_bytes) {
          return absl::UnimplementedError(absl::StrCat(
              metadata_.path, ": the params of param group ", g, " have different '", key, "' ('", groups_[g][0],
              "' and '", groups_[g][j], "'): a param skipped steps; DeepSpeed keeps one per group"));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status DcpState::BuildFacet() {
  deepspeed::EngineDefaults d;
  // global_steps: the optimizer's step count (a 0-d tensor or a number), as
  // CheckScalars read it.
  if (group0_step_.has_value()) d.global_steps = *group0_step_;
  UCP_ASSIGN_OR_RETURN(state::FileValue defaults, deepspeed::DefaultOptimizerCommon(info_, d));
  ValuePtr c = Value::MakeDict();
  for (const auto& [k, v] : defaults.value->dict_items()) c->DictSet(k, v);
  std::vector<ValuePtr> groups;
  for (int g = 0; g < info_.num_groups && !weights_only_; ++g) {
    ValuePtr group = Value::MakeDict();
    for (const auto& [k, v] : hyper_[g]->dict_items()) group->DictSet(k, v);
    group->DictSet(Value::Str("params"), Value::List({Value::Int(g)}));
    groups.push_back(group);
  }
  if (!weights_only_) c->DictSet(Value::Str("param_groups"), Value::List(std::move(groups)));
  c->DictSet(Value::Str("clip_grad"), Value::Float(options_.clip_grad));
  common_ = state::FileValue{c, defaults.file};
  UCP_ASSIGN_OR_RETURN(state::FileValue root, deepspeed::DefaultModelStatesRoot(info_, d));
  ValuePtr shared = Value::MakeDict();
  for (const state::ParamState& p : info_.params) {
    if (p.role == state::TensorRole::kTied) shared->DictSet(Value::Str(p.name), Value::Str(p.alias_of));
  }
  ValuePtr r = Value::MakeDict();
  for (const auto& [k, v] : root.value->dict_items()) {
    r->DictSet(k, k->is(Kind::kStr) && k->str() == "shared_params" ? shared : v);
  }
  root_ = state::FileValue{r, root.file};
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const torch::MappedFile>> DcpState::File(const std::string& file) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = files_.find(file);
  if (it != files_.end()) return it->second;
  absl::StatusOr<std::shared_ptr<const torch::MappedFile>> m = torch::MappedFile::Open(JoinPath(dir_, file));
  if (!m.ok()) {
    return absl::Status(m.status().code(), absl::StrCat(metadata_.path, " names item file '", file,
                                                        "', which cannot be read: ", m.status().message()));
  }
  files_.emplace(file, *m);
  return *m;
}

absl::StatusOr<std::shared_ptr<const torch::TorchFile>> DcpState::OpenItem(const DcpStorage& storage,
                                                                         const std::string& key) const {
  UCP_ASSIGN_OR_RETURN(std::shared_ptr<const torch::MappedFile> file, File(storage.file));
  torch::OpenOptions o;
  o.refuse_unsafe_globals = !options_.allow_unsafe_pickles;
  o.verify_crc = true;
  UCP_ASSIGN_OR_RETURN(std::unique_ptr<torch::TorchFile> f,
                       torch::TorchFile::OpenRange(file, storage.offset, storage.length,
                                                   absl::StrCat(JoinPath(dir_, storage.file), " item at byte ",
                                                                storage.offset, " ('", key, "')"),
                                                   o));
  return std::shared_ptr<const torch::TorchFile>(std::move(f));
}

absl::StatusOr<TensorPlan> DcpState::Assemble(const DcpEntry& e) const {
  if (!e.tensor) return absl::InvalidArgumentError(absl::StrCat("entry '", e.key, "' is not a tensor"));
  std::vector<const DcpChunk*> chunks;
  std::vector<TensorPlan> plans;
  std::vector<int> in;
  for (const DcpChunk& c : e.chunks) {
    int64_t n = 1;
    for (int64_t s : c.sizes) n *= s;
    if (n == 0) continue;  // a rank that holds nothing of it
    UCP_ASSIGN_OR_RETURN(std::shared_ptr<const torch::TorchFile> f, OpenItem(c.storage, e.key));
    if (!torch::TorchFile::IsTensor(*f->root())) {
      return absl::InvalidArgumentError(absl::StrCat(f->path(), ": not a tensor but ", f->root()->DebugString(80)));
    }
    UCP_ASSIGN_OR_RETURN(torch::Tensor t, f->GetTensor(*f->root()));
    if (t.dtype() != e.dtype || t.sizes() != c.sizes) {
      return absl::InvalidArgumentError(absl::StrCat(f->path(), ": a ", Shape(t.dtype(), t.sizes()),
                                                     " tensor; .metadata says its chunk at (",
                                                     absl::StrJoin(c.offsets, ", "), ") is ",
                                                     Shape(e.dtype, c.sizes)));
    }
    in.push_back(static_cast<int>(chunks.size()));
    chunks.push_back(&c);
    plans.push_back(TensorPlan::FromTensor(t));
  }
  return Tile(e, chunks, plans, in, Box{std::vector<int64_t>(e.size.size(), 0), e.size});
}

absl::StatusOr<state::FileValue> DcpState::BytesValue(const DcpEntry& e) const {
  if (e.tensor) return absl::InvalidArgumentError(absl::StrCat("entry '", e.key, "' is a tensor"));
  UCP_ASSIGN_OR_RETURN(std::shared_ptr<const torch::TorchFile> f, OpenItem(e.bytes, e.key));
  return state::FileValue{f->root(), f};
}

const DcpEntry& DcpState::EntryOf(const state::ParamState& param, const std::string& state) const {
  auto it = params_.find(param.name);
  if (state == state::kLpState || state == state::kFp32State || it == params_.end()) {
    const DcpEntry* e = metadata_.Find(model_prefix_ + param.name);
    return *e;
  }
  return *metadata_.Find(it->second.states.at(state));
}

// The weights (lp) of every param; fp32 masters and optimizer states of the
// trainable ones that hold them (a param never stepped has none).
bool DcpState::HasState(const state::ParamState& p, const std::string& state) const {
  if (state == state::kLpState) return true;
  if (!p.trainable()) return false;
  return state == state::kFp32State || FreshState(state) || params_.at(p.name).states.count(state) != 0;
}

bool DcpState::FreshState(const std::string& state) const {
  return weights_only_ && std::find(state_keys_.begin(), state_keys_.end(), state) != state_keys_.end();
}

absl::StatusOr<std::vector<TensorPlan>> DcpState::Slices(const state::ParamState& param, int stage,
                                                        const std::string& state) const {
  const int i = info_.IndexOf(param.name);
  if (i < 0) return absl::NotFoundError(absl::StrCat("no param '", param.name, "'"));
  const state::ParamState& p = info_.params[i];
  if (!HasState(p, state)) {
    return absl::NotFoundError(absl::StrCat("param '", param.name, "' (", state::TensorRoleName(p.role),
                                            ") has no state '", state, "' in ", metadata_.path));
  }
  if (FreshState(state)) return std::vector<TensorPlan>{TensorPlan::Zeros(torch::DType::kFloat32, p.tp_shapes[0])};
  UCP_ASSIGN_OR_RETURN(TensorPlan t, Assemble(EntryOf(p, state)));
  if (state == state::kFp32State && t.dtype() != torch::DType::kFloat32) {  // weights only: bf16/fp16 weights
    UCP_ASSIGN_OR_RETURN(torch::Tensor m, t.Materialize());
    UCP_ASSIGN_OR_RETURN(torch::Tensor f, torch::Cast(m, torch::DType::kFloat32));
    return std::vector<TensorPlan>{TensorPlan::FromTensor(f)};
  }
  return std::vector<TensorPlan>{std::move(t)};
}

absl::StatusOr<state::FileValue> DcpState::GroupScalar(int group, const std::string& key) const {
  if (group < 0 || group >= info_.num_groups) return state::FileValue{nullptr, nullptr};
  if (weights_only_) return key == "step" ? fresh_step_ : state::FileValue{nullptr, nullptr};
  const Param& p = params_.at(groups_[group][0]);
  auto it = p.states.find(key);
  if (it == p.states.end()) return state::FileValue{nullptr, nullptr};
  const DcpEntry& e = *metadata_.Find(it->second);
  if (!e.tensor) return BytesValue(e);
  // A 0-d tensor: its one chunk's item.
  for (const DcpChunk& c : e.chunks) {
    UCP_ASSIGN_OR_RETURN(std::shared_ptr<const torch::TorchFile> f, OpenItem(c.storage, e.key));
    return state::FileValue{f->root(), f};
  }
  return absl::InvalidArgumentError(absl::StrCat(metadata_.path, ": '", e.key, "' has no chunk"));
}

std::vector<state::InputRange> DcpState::StateInputs(const state::ParamState& param, const std::string& state) const {
  std::vector<state::InputRange> out;
  if (info_.IndexOf(param.name) < 0) return out;
  const state::ParamState& p = info_.params[info_.IndexOf(param.name)];
  if (!HasState(p, state) || FreshState(state)) return out;
  std::set<std::string> files;
  for (const DcpChunk& c : EntryOf(p, state).chunks) files.insert(JoinPath(dir_, c.storage.file));
  for (const std::string& f : files) out.push_back(state::InputRange{f, "", 0, -1});
  return out;
}

std::vector<state::InputRange> DcpState::Inputs(const state::ParamState& param) const {
  std::vector<state::InputRange> out = StateInputs(param, state::kLpState);
  if (param.trainable()) {
    for (const std::string& s : state_keys_) {
      for (state::InputRange& r : StateInputs(param, s)) out.push_back(std::move(r));
    }
  }
  std::sort(out.begin(), out.end(), [](const state::InputRange& a, const state::InputRange& b) { return a.path < b.path; });
  out.erase(std::unique(out.begin(), out.end(),
                        [](const state::InputRange& a, const state::InputRange& b) { return a.path == b.path; }),
            out.end());
  return out;
}

std::vector<std::string> DcpState::InputFiles() const {
  std::vector<std::string> out = {metadata_.path};
  for (const std::string& f : metadata_.Files()) out.push_back(JoinPath(dir_, f));
  return out;
}

absl::Status DcpState::VerifyInput(const std::string& path) const {
  if (path == metadata_.path) return ReadMetadata(dir_).status();
  for (const DcpEntry& e : metadata_.entries) {
    if (!e.tensor) {
      if (JoinPath(dir_, e.bytes.file) == path) UCP_RETURN_IF_ERROR(OpenItem(e.bytes, e.key).status());
      continue;
    }
    bool here = false;
    for (const DcpChunk& c : e.chunks) here = here || JoinPath(dir_, c.storage.file) == path;
    if (here) UCP_RETURN_IF_ERROR(Assemble(e).status());
  }
  return absl::OkStatus();
}

}  // namespace ucp::dcp
