#include "ops/export.h"


#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/fs.h"
#include "base/leftovers.h"
#include "base/status_macros.h"
#include "deepspeed/facet.h"
#include "format/torch/mapped_file.h"
#include "format/json/json.h"
#include "format/pickle/accessors.h"
#include "formats/builtin/builtin.h"
#include "formats/format.h"
#include "ops/model_folder.h"

namespace ucp::ops {
namespace {

using state::ParamState;
using state::TensorRole;
using pickle::Kind;
using pickle::Value;
using torch::DType;

// mp_rank_00's shared_params (alias -> owner, insertion order), as
// engine._get_shared_params records tied params (global rank 0 only).
std::vector<std::pair<std::string, std::string>> SharedParams(const state::ModelState& state) {
  std::vector<std::pair<std::string, std::string>> out;
  const deepspeed::DeepSpeedFacet* ds = deepspeed::FacetOf(state);
  if (ds == nullptr) return out;
  const state::FileValue root = ds->ModelStatesRoot(0, 0);
  if (!root.value || !root.value->is(Kind::kDict)) return out;
  const Value* sp = root.value->DictGet("shared_params");
  if (sp == nullptr || !sp->is(Kind::kDict)) return out;
  for (const auto& [k, v] : sp->dict_items()) {
    if (k->is(Kind::kStr) && v->is(Kind::kStr)) out.emplace_back(k->str(), v->str());
  }
  return out;
}

absl::StatusOr<DType> ParseTargetDType(const std::string& s) {
  if (s == "source") return DType::kComplex128;  // sentinel: no conversion requested
  if (s == "fp32" || s == "float32") return DType::kFloat32;
  if (s == "bf16" || s == "bfloat16") return DType::kBFloat16;
  if (s == "fp16" || s == "float16") return DType::kFloat16;
  return absl::InvalidArgumentError(absl::StrCat("--dtype must be source, fp32, bf16 or fp16, not '", s, "'"));
}

// `plan` x `factor`, in float32 (GPT-NeoX's sum of identical tp copies).
absl::StatusOr<tp::TensorPlan> Scale(const tp::TensorPlan& plan, int64_t factor) {
  if (factor == 1) return plan;
  if (plan.dtype() != DType::kFloat32) {
    UCP_ASSIGN_OR_RETURN(torch::Tensor t, plan.Materialize());
    UCP_ASSIGN_OR_RETURN(torch::Tensor f, torch::Cast(t, DType::kFloat32));
    return Scale(tp::TensorPlan::FromTensor(f), factor);
  }
  UCP_ASSIGN_OR_RETURN(torch::Tensor t, plan.Materialize());
  std::string bytes(t.nbytes(), '\0');
  std::memcpy(bytes.data(), t.data(), bytes.size());
  float* f = reinterpret_cast<float*>(bytes.data());
  for (int64_t i = 0; i < t.numel(); ++i) {
    // The sum in tp rank order, as torch adds the copies one by one.
    float s = 0;
    for (int64_t k = 0; k < factor; ++k) s += f[i];
    f[i] = s;
  }
  UCP_ASSIGN_OR_RETURN(torch::Tensor out, torch::Tensor::FromBytes(DType::kFloat32, t.sizes(), std::move(bytes)));
  return tp::TensorPlan::FromTensor(out);
}

class Builder {
 public:
  Builder(const state::ModelState& state, const ExportOptions& options)
      : state_(state), info_(state.info()), options_(options) {}

  absl::StatusOr<ExportContents> Build() {
    if (options_.weights != "fp32" && options_.weights != "lp") {
      return absl::InvalidArgumentError(absl::StrCat("--weights must be fp32 or lp, not '", options_.weights, "'"));
    }
    lp_ = options_.weights == "lp";
    UCP_ASSIGN_OR_RETURN(target_, ParseTargetDType(options_.dtype));
    if (options_.names != "checkpoint" && options_.names != "hf") {
      return absl::InvalidArgumentError(absl::StrCat("--names must be checkpoint or hf, not '", options_.names, "'"));
    }
    // Tied aliases: names of the module state that are another param.
    for (const auto& [alias, owner] : SharedParams(state_)) {
      if (alias == owner || info_.IndexOf(owner) < 0) continue;
      const int a = info_.IndexOf(alias);
      if (a >= 0 && info_.params[a].trainable()) continue;  // an optimizer param is never an alias
      aliases_.emplace_back(alias, owner);
      alias_names_.insert(alias);
    }
    return options_.names == "hf" ? BuildHf() : BuildCheckpointNames();
  }

 private:
  bool Excluded(const ParamState& p) const {
    if (alias_names_.count(p.name)) return true;
    return p.role == TensorRole::kFrozen && options_.exclude_frozen_parameters;
  }

  // The dtype written for `p` (before --dtype).
  DType SourceDType(const ParamState& p) const {
    switch (p.role) {
      case TensorRole::kTrainable: return lp_ ? info_.lp_dtype : DType::kFloat32;
      case TensorRole::kFrozen:
      case TensorRole::kTied: return p.lp_dtype;
      case TensorRole::kBuffer: return lp_ ? p.lp_dtype : DType::kFloat32;
    }
    return DType::kFloat32;
  }

  DType OutDType(const ParamState& p) const {
    const DType src = SourceDType(p);
    if (target_ == DType::kComplex128) return src;
    if (p.role == TensorRole::kBuffer && !torch::IsFloatingPoint(p.lp_dtype)) {
      return lp_ ? p.lp_dtype : src;  // integer buffers keep their dtype under --dtype (float32 only as "source")
    }
    return target_;
  }

  // The full value of `p` for the chosen weights.
  absl::StatusOr<tp::TensorPlan> Value(const ParamState& p) const {
    if (!p.trainable()) return state_.Full(p, state::kLpState);
    if (!lp_) return state_.Full(p, state::kFp32State);
    auto lp = state_.Full(p, state::kLpState);
    if (lp.ok() || lp.status().code() != absl::StatusCode::kNotFound) return lp;
    return state_.Full(p, state::kFp32State);  // cast to the lp dtype by the writer
  }

  writers::ExportTensor Tensor(int index, std::string name) {
    const ParamState& p = info_.params[static_cast<size_t>(index)];
    writers::ExportTensor t;
    t.name = std::move(name);
    t.shape = p.full_shape;
    t.dtype = OutDType(p);
    // What Value reads: the fp32 masters alone, not every state of the
    // param (an lp export may fall back to the masters: all of them).
    t.inputs = !p.trainable() ? state_.StateInputs(p, state::kLpState)
               : lp_          ? state_.Inputs(p)
                              : state_.StateInputs(p, state::kFp32State);
    const Builder* self = this;
    t.source = [self, index]() { return self->Value(self->info_.params[static_cast<size_t>(index)]); };
    return t;
  }

  void NoteLpFromMasters() {
    if (!lp_) return;
    for (const ParamState& p : info_.params) {
      if (!p.trainable()) continue;
      auto lp = state_.Full(p, state::kLpState);
      if (!lp.ok() && lp.status().code() == absl::StatusCode::kNotFound) {
        notes_.push_back(absl::StrCat(
            "--weights=lp: the checkpoint holds no lp weights of trainable params (a universal checkpoint); they are "
            "the fp32 masters rounded to ", std::string(torch::DTypeName(info_.lp_dtype)),
            " (round to nearest even), as DeepSpeed's optimizers derive them"));
      }
      return;
    }
  }

  absl::StatusOr<ExportContents> BuildCheckpointNames() {
    ExportContents out;
    std::vector<int> buffers, frozen, trainable;
    for (size_t i = 0; i < info_.params.size(); ++i) {
      const ParamState& p = info_.params[i];
      if (Excluded(p)) continue;
      (p.role == TensorRole::kBuffer ? buffers : p.role == TensorRole::kFrozen ? frozen : trainable)
          .push_back(static_cast<int>(i));
    }
    std::map<std::string, size_t> position;
    for (const auto* list : {&buffers, &frozen, &trainable}) {
      for (int i : *list) {
        position[info_.params[i].name] = out.tensors.size();
        out.tensors.push_back(Tensor(i, info_.params[i].name));
      }
    }
    for (const auto& [alias, owner] : aliases_) {
      auto it = position.find(owner);
      if (it == position.end()) continue;  // owner not exported: nor its alias (as zero_to_fp32)
      out.tensors[it->second].aliases.push_back(alias);
    }
    NoteLpFromMasters();
    out.notes = notes_;
    return out;
  }

  // Params in module order (layer by layer, each layer file's key order when
  // known), for Hugging Face files, which list weights the way the model
  // declares them.
  std::vector<int> ModuleOrder() const {
    std::map<std::pair<int, std::string>, int> key_rank;
    for (size_t k = 0; k < info_.module_order.size(); ++k) {
      key_rank.emplace(std::make_pair(info_.module_order[k].layer, info_.module_order[k].name), static_cast<int>(k));
    }
    auto rank = [&](const ParamState& p) -> std::pair<int, int> {
      const int layer = p.layer;
      const std::string local = p.local_name.empty() ? p.name : p.local_name;
      auto it = key_rank.find({layer, local});
      if (it == key_rank.end() && layer < 0) it = key_rank.find({-1, p.name});
      return {layer, it == key_rank.end() ? static_cast<int>(key_rank.size()) : it->second};
    };
    std::vector<int> order;
    for (size_t i = 0; i < info_.params.size(); ++i) {
      if (!Excluded(info_.params[i])) order.push_back(static_cast<int>(i));
    }
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return rank(info_.params[a]) < rank(info_.params[b]); });
    return order;
  }

  absl::StatusOr<ExportContents> BuildHf() {
    ExportContents out;
    rules::HfOptions hf = options_.hf;
    if (hf.preset.empty()) hf.preset = options_.state.rules.preset;
    UCP_ASSIGN_OR_RETURN(rules::HfNamePlan plan, rules::PlanHfNames(info_, ModuleOrder(), deepspeed::ArgsOf(state_), hf));
    DType weights_dtype = DType::kFloat32;
    bool have_weights_dtype = false;
    for (const rules::HfTensor& h : plan.tensors) {
      const ParamState& p = info_.params[static_cast<size_t>(h.param)];
      writers::ExportTensor t = Tensor(h.param, h.name);
      t.shape = h.shape;
      const int index = h.param;
      const rules::HfTensor spec = h;
      const Builder* self = this;
      t.source = [self, index, spec]() -> absl::StatusOr<tp::TensorPlan> {
        UCP_ASSIGN_OR_RETURN(tp::TensorPlan full, self->Value(self->info_.params[static_cast<size_t>(index)]));
        UCP_ASSIGN_OR_RETURN(tp::TensorPlan rows, tp::GroupRows(full, spec.groups, spec.start, spec.length));
        return Scale(rows, spec.scale);
      };
      if (p.trainable() && !have_weights_dtype) {
        weights_dtype = t.dtype;
        have_weights_dtype = true;
      }
      out.tensors.push_back(std::move(t));
    }
    if (plan.config_verbatim) {
      out.config_json = options_.hf.checkpoint_config_json;  // the checkpoint's own, byte for byte
    } else {
      plan.config.Set("torch_dtype", json::Value::String(std::string(torch::DTypeName(weights_dtype))));
      out.config_json = json::DumpPython(plan.config) + "\n";
    }
    out.architecture = plan.architecture;
    NoteLpFromMasters();
    out.notes = plan.notes;
    out.notes.insert(out.notes.end(), notes_.begin(), notes_.end());
    if (!plan.dropped.empty()) {
      out.notes.push_back(absl::StrCat(plan.dropped.size(), " tensor(s) with no ", plan.architecture,
                                       " counterpart not exported (", plan.dropped.front(),
                                       plan.dropped.size() > 1 ? ", ..." : "", ")"));
    }
    if (!aliases_.empty()) {
      out.notes.push_back(absl::StrCat(aliases_.size(), " tied alias(es) not exported (Hugging Face ties them from "
                                       "config.json), e.g. '", aliases_[0].first, "' = '", aliases_[0].second, "'"));
    }
    return out;
  }

  const state::ModelState& state_;
  const state::ModelInfo& info_;
  const ExportOptions options_;
  bool lp_ = false;
  DType target_ = DType::kComplex128;
  std::vector<std::pair<std::string, std::string>> aliases_;
  std::set<std::string> alias_names_;
  std::vector<std::string> notes_;
};

}  // namespace

rules::HfOptions WithCheckpointConfig(rules::HfOptions hf, const formats::HfFolder& folder) {
  if (!folder.config_json.empty()) {
    hf.checkpoint_config_json = folder.config_json;
    hf.checkpoint_model_type = folder.model_type;
    hf.checkpoint_architecture = folder.architecture;
  }
  return hf;
}

absl::StatusOr<ExportContents> PlanExportContents(const state::ModelState& state, const ExportOptions& options) {
  // The tensors' sources refer to the builder's copy of the state and
  // options through `state` only.
  auto builder = std::make_shared<Builder>(state, options);
  UCP_ASSIGN_OR_RETURN(ExportContents c, builder->Build());
  for (auto& t : c.tensors) {
    auto src = std::move(t.source);
    t.source = [builder, src]() { return src(); };  // keeps the builder alive
  }
  return c;
}

namespace {

// The weights target named by --format (a registry name).
absl::StatusOr<const formats::TargetFormat*> WeightsTarget(const std::string& name) {
  std::vector<std::string> names;
  for (const auto& t : formats::builtin::Formats().targets()) {
    if (t->family() != formats::TargetFamily::kWeights) continue;
    if (t->name() == name) return t.get();
    names.push_back(std::string(t->name()));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--format must be ", absl::StrJoin(names, " or "), ", not '", name, "'"));
}

absl::StatusOr<ExportResult> ExportImpl(const ExportOptions& options, Leftovers* left);

// The files of a Hugging Face model folder, besides config.json and the
// weights, that from_pretrained (generation_config.json) and
// AutoTokenizer.from_pretrained read (ops/model_folder.h): copied as they
// are when present.
absl::Status AddModelFolderFiles(const std::string& dir, writers::ExportWriteOptions* w,
                                 std::vector<std::string>* notes) {
  std::vector<std::string> copied;
  for (const std::string& name : ModelFolderFileNames()) {
    if (name == "config.json") continue;  // the plan's (PlanExportContents)
    const std::string path = JoinPath(dir, name);
    if (!PathExists(path) || IsDirectory(path)) continue;
    UCP_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(path, int64_t{1} << 30));
    w->extra_files.emplace_back(name, std::move(bytes));
    copied.push_back(name);
  }
  if (!copied.empty()) notes->push_back(absl::StrCat("copied from ", dir, ": ", absl::StrJoin(copied, ", ")));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ExportResult> Export(const ExportOptions& options) {
  Leftovers left;
  return RunCheckingInputs<ExportResult>(/*cluster=*/nullptr, /*dry_run=*/false,
                                         [&] { return ExportImpl(options, &left); });
}

namespace {
absl::StatusOr<ExportResult> ExportImpl(const ExportOptions& options, Leftovers* left) {
  if (options.input_folder.empty() || options.output_folder.empty()) {
    return absl::InvalidArgumentError("export needs an input and an output folder");
  }
  if (options.state.num_threads < 0 || options.write.num_threads < 0) {
    return absl::InvalidArgumentError("--num_threads: expected >= 0 (0 = all cores)");
  }
  UCP_ASSIGN_OR_RETURN(const formats::TargetFormat* target, WeightsTarget(options.format));
  // Plain weights need no tp merge where there is nothing to merge: a
  // source at tp = 1 (ZeRO-3 and native MoE exist at tp = 1 only; MoE
  // experts under their global ids) exports whole tensors, as
  // zero_to_fp32.py does, without rules (a rule still decides VOCAB padding
  // stripping).
  SourceOptions source = options.state;
  source.tp1_whole_tensors = true;
  UCP_ASSIGN_OR_RETURN(OpenedSource src, OpenSource(options.input_folder, source, nullptr));
  const std::string source_dir = src.dir;
  std::unique_ptr<state::ModelState> state = std::move(src.state);
  // --names=hf of a checkpoint inside a Hugging Face model folder (the
  // Trainer's checkpoint-N): its config.json decides the architecture and is
  // written as is, with the other files from_pretrained reads beside it.
  ExportOptions o = options;
  UCP_ASSIGN_OR_RETURN(formats::HfFolder hf_folder, formats::HfFolderOf(source_dir));
  if (o.names == "hf") o.hf = WithCheckpointConfig(o.hf, hf_folder);
  UCP_ASSIGN_OR_RETURN(ExportContents c, PlanExportContents(*state, o));
  writers::ExportWriteOptions w = options.write;
  w.inputs = {source_dir};
  w.read_ahead = state.get();  // lives until RunPlan returns
  if (!hf_folder.dir.empty()) w.inputs.push_back(hf_folder.dir);
  if (!c.config_json.empty()) w.extra_files.emplace_back("config.json", c.config_json);
  if (o.names == "hf" && !hf_folder.dir.empty()) {
    UCP_RETURN_IF_ERROR(AddModelFolderFiles(hf_folder.dir, &w, &c.notes));
  }
  ExportResult r;
  r.notes = state->info().notes;
  r.notes.insert(r.notes.end(), c.notes.begin(), c.notes.end());
  r.architecture = c.architecture;
  UCP_ASSIGN_OR_RETURN(std::unique_ptr<writers::Plan> plan, target->PlanWeights(std::move(c.tensors), w));
  UCP_ASSIGN_OR_RETURN(r.stats, writers::RunPlan(*plan, options.output_folder, writers::WeightsRunOptions(w)));
  r.notes.insert(r.notes.end(), r.stats.notes.begin(), r.stats.notes.end());
  left->Keep(std::move(state));
  left->Keep(std::move(plan));
  return r;
}

}  // namespace

}  // namespace ucp::ops
