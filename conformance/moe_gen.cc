#include "conformance/moe_gen.h"

#include <algorithm>
#include <numeric>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "conformance/synthetic_state.h"
#include "deepspeed/layout_math.h"
#include "format/pickle/accessors.h"
#include "ops/training_state.h"
#include "tp/tensor_plan.h"

namespace ucp::conformance {
namespace {

using state::FileValue;
using state::ParamState;
using pickle::Value;
using pickle::ValuePtr;

constexpr char kExpertInfix[] = ".deepspeed_moe.experts.deepspeed_experts.";

int64_t Numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t x : s) n *= x;
  return n;
}

// One tensor of the module, in module order.
struct MoeParam {
  std::string name;
  std::vector<int64_t> shape;
  bool expert = false;
  int layer = -1, expert_id = -1;  // MoE layer index and global expert id (experts)
  std::string suffix;              // fc.weight, ... (experts)
};

std::vector<MoeParam> ModuleParams(const MoeCase& c) {
  const int64_t h = c.hidden, f = c.ffn;
  std::vector<MoeParam> out;
  auto add = [&](std::string name, std::vector<int64_t> shape) { out.push_back({std::move(name), std::move(shape)}); };
  add("wte.weight", {c.vocab, h});
  add("wpe.weight", {c.positions, h});
  int moe_layer = 0;
  for (size_t i = 0; i < c.experts.size(); ++i) {
    const std::string b = absl::StrCat("h.", i, ".");
    add(b + "ln_1.weight", {h});
    add(b + "ln_1.bias", {h});
    add(b + "attn_qkv.weight", {3 * h, h});
    add(b + "attn_qkv.bias", {3 * h});
    add(b + "attn_proj.weight", {h, h});
    add(b + "attn_proj.bias", {h});
    add(b + "ln_2.weight", {h});
    add(b + "ln_2.bias", {h});
    if (c.experts[i] == 0) {
      add(b + "mlp_fc.weight", {f, h});
      add(b + "mlp_fc.bias", {f});
      add(b + "mlp_proj.weight", {h, f});
      add(b + "mlp_proj.bias", {h});
      continue;
    }
    add(b + "moe.deepspeed_moe.gate.wg.weight", {c.experts[i], h});
    for (int e = 0; e < c.experts[i]; ++e) {
      for (const auto& [suffix, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
               {"fc.weight", {f, h}}, {"fc.bias", {f}}, {"proj.weight", {h, f}}, {"proj.bias", {h}}}) {
        MoeParam p{absl::StrCat(b, "moe", kExpertInfix, e, ".", suffix), shape, true, moe_layer, e, suffix};
        out.push_back(std::move(p));
      }
    }
    ++moe_layer;
  }
  add("ln_f.weight", {h});
  add("ln_f.bias", {h});
  add("lm_head.weight", {c.vocab, h});
  return out;
}

// split_params_into_different_moe_groups_for_optimizer: the base groups,
// then one expert group per base group.
int GroupOf(const MoeCase& c, const MoeParam& p) {
  const int base = c.base_groups == 2 && p.shape.size() < 2 ? 1 : 0;
  return p.expert ? c.base_groups + base : base;
}

std::vector<int> Divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i) {
    if (n % i == 0) d.push_back(i);
  }
  return d;
}

// torch.optim.AdamW's defaults as Optimizer.state_dict() packs a group
// after the keys the caller gave (torch 2: differentiable, fused).
void AdamDefaults(const ValuePtr& d, bool with_weight_decay) {
  d->DictSet(Value::Str("lr"), Value::Float(0.001));
  d->DictSet(Value::Str("betas"), synthetic::AdamBetas());
  d->DictSet(Value::Str("eps"), Value::Float(1e-08));
  if (with_weight_decay) d->DictSet(Value::Str("weight_decay"), Value::Float(0.01));
  d->DictSet(Value::Str("amsgrad"), Value::Bool(false));
  d->DictSet(Value::Str("foreach"), Value::None());
  d->DictSet(Value::Str("maximize"), Value::Bool(false));
  d->DictSet(Value::Str("capturable"), Value::Bool(false));
  d->DictSet(Value::Str("differentiable"), Value::Bool(false));
  d->DictSet(Value::Str("fused"), Value::None());
}

}  // namespace

std::string MoeCase::ToString() const {
  return absl::StrCat("MoeCase{seed=", seed, " hidden=", hidden, " ffn=", ffn, " vocab=", vocab,
                      " positions=", positions, " experts=[", absl::StrJoin(experts, ","), "] base_groups=",
                      base_groups, " zero", zero_stage, " ", lp_dtype, " dp1=", dp1, " ep1=", ep1, " dp2=", dp2,
                      " ep2=", ep2, " ds_version=", ds_version, " target_ds_version=", target_ds_version, "}");
}

const std::vector<std::string>& MoeDsVersionsDrawn() {
  // Both sides of each MoE layout change (engine.py _save_moe_checkpoint,
  // stage_1_and_2.py): expert mappings of a window before 0.14.5, per-rank
  // paddings from 0.16.4, ds_autoep_layers from 0.19.2, the common checkpoint
  // state from 0.19.3, no expert optimizer placeholders from 0.19.5; and the
  // last release of each minor line.
  static const std::vector<std::string> kVersions = {"0.12.6", "0.13.5", "0.14.4", "0.14.5", "0.15.4", "0.16.3",
                                                     "0.16.4", "0.17.6", "0.18.9", "0.19.2", "0.19.3", "0.19.4",
                                                     "0.19.5"};
  return kVersions;
}

rc::Gen<MoeCase> GenMoeCase() {
  return rc::gen::exec([]() {
    MoeCase c;
    c.seed = *rc::gen::inRange<uint64_t>(0, uint64_t{1} << 40);
    const int blocks = *rc::gen::inRange(1, 4);
    c.experts.clear();
    for (int i = 0; i < blocks; ++i) c.experts.push_back(*rc::gen::element(0, 1, 2, 2, 4, 4, 8));
    if (std::all_of(c.experts.begin(), c.experts.end(), [](int e) { return e == 0; })) c.experts.back() = 2;
    c.hidden = 2 * *rc::gen::inRange(1, 5);
    c.ffn = *rc::gen::inRange(1, 9);
    c.vocab = *rc::gen::inRange(3, 13);
    c.positions = *rc::gen::inRange(2, 6);
    c.base_groups = *rc::gen::element(1, 2);
    c.zero_stage = *rc::gen::element(1, 2);
    c.lp_dtype = *rc::gen::element<std::string>("fp32", "fp16");
    int g = 0;
    for (int e : c.experts) g = std::gcd(g, e);
    // ep divides every layer's expert count, dp is a multiple of ep (<= 8).
    c.ep1 = *rc::gen::elementOf(Divisors(std::min(g, 8)));
    c.dp1 = c.ep1 * *rc::gen::inRange(1, 8 / c.ep1 + 1);
    c.ep2 = *rc::gen::elementOf(Divisors(std::min(g, 8)));
    c.dp2 = c.ep2 * *rc::gen::inRange(1, 8 / c.ep2 + 1);
    c.no_decay_weight_decay = *rc::gen::element(0.0, 0.01);
    c.ds_version = *rc::gen::elementOf(MoeDsVersionsDrawn());
    c.target_ds_version = *rc::gen::elementOf(MoeDsVersionsDrawn());
    return c;
  });
}

std::vector<std::string> MoeCaseFeatures(const MoeCase& c) {
  std::set<std::string> f;
  int layers = 0;
  for (int e : c.experts) {
    if (e > 0) {
      ++layers;
      f.insert(absl::StrCat("experts=", e));
    } else {
      f.insert("dense_block");
    }
  }
  f.insert(absl::StrCat("moe_layers=", layers));
  if (c.ep1 != c.ep2) f.insert("ep_change");
  if (c.dp1 / c.ep1 > 1 || c.dp2 / c.ep2 > 1) f.insert("expert_dp>1");
  if (c.ep1 == c.dp1 && c.dp1 > 1) f.insert("expert_dp=1_at_dp>1");
  if (c.ds_version != c.target_ds_version) f.insert("ds_version_change");
  // Expert groups whose padding spans dp partitions (per-rank paddings differ from last-rank).
  auto spans = [&](int dp, int ep) {
    std::vector<int> layer_experts;
    for (int e : c.experts) {
      if (e > 0) layer_experts.push_back(e);
    }
    // Each group's numel on one ep rank (its local experts).
    std::map<int, int64_t> numel;
    for (const MoeParam& p : ModuleParams(c)) {
      if (p.expert && p.expert_id >= layer_experts[p.layer] / ep) continue;
      numel[GroupOf(c, p)] += Numel(p.shape);
    }
    for (const auto& [grp, n] : numel) {
      const bool expert = grp >= c.base_groups;
      const int parts = expert ? dp / ep : dp;
      const auto layout = deepspeed::ZeroGroupLayout::Make({n}, parts);
      if (layout.padded_numel() - layout.numel() > layout.partition_numel()) return true;
    }
    return false;
  };
  if (spans(c.dp1, c.ep1) || spans(c.dp2, c.ep2)) f.insert("padding_spans_ranks");
  return std::vector<std::string>(f.begin(), f.end());
}

absl::StatusOr<std::unique_ptr<SyntheticMoeState>> SyntheticMoeState::Make(const MoeCase& c) {
  std::unique_ptr<SyntheticMoeState> s(new SyntheticMoeState());
  s->case_ = c;
  UCP_RETURN_IF_ERROR(s->Build());
  return s;
}

absl::Status SyntheticMoeState::Build() {
  const MoeCase& c = case_;
  UCP_ASSIGN_OR_RETURN(const deepspeed::DsVersion version, deepspeed::ParseDsVersion(c.ds_version));
  UCP_ASSIGN_OR_RETURN(const torch::DType lp, torch::ParseDType(c.lp_dtype));
  if (lp != torch::DType::kFloat32 && lp != torch::DType::kFloat16) {
    return absl::InvalidArgumentError(absl::StrCat("MoE case: lp dtype ", c.lp_dtype, " (fp32 or fp16)"));
  }
  if (c.zero_stage != 1 && c.zero_stage != 2) return absl::InvalidArgumentError("MoE case: ZeRO stage 1 or 2");
  for (const auto& [dp, ep] : {std::make_pair(c.dp1, c.ep1), std::make_pair(c.dp2, c.ep2)}) {
    if (dp < 1 || ep < 1 || dp % ep != 0) return absl::InvalidArgumentError(absl::StrCat("MoE case: dp ", dp, " ep ", ep));
    for (int e : c.experts) {
      if (e % ep != 0) return absl::InvalidArgumentError(absl::StrCat("MoE case: ", e, " experts, ep ", ep));
    }
  }
  const std::vector<MoeParam> module = ModuleParams(c);
  const int num_groups = 2 * c.base_groups;

  // Tensors and the model info.
  info_.zero_stage = c.zero_stage;
  info_.optimizer_kind = state::OptimizerKind::kZero;
  info_.lp_dtype = lp;
  info_.num_groups = num_groups;
  info_.state_keys = {"exp_avg", "exp_avg_sq"};
  info_.scalar_keys = {"step"};
  info_.source_topology = state::Topology{1, 1, c.dp1};
  info_.expert_parallel = c.ep1;
  for (size_t i = 0; i < c.experts.size(); ++i) {
    if (c.experts[i] > 0) info_.moe_layers.push_back({absl::StrCat("h.", i, ".moe"), c.experts[i]});
  }
  for (int g = 0; g < num_groups; ++g) info_.expert_groups.push_back(g >= c.base_groups);
  std::vector<ParamState> params;
  for (const MoeParam& mp : module) {
    ModelParam p;
    p.set_name(mp.name);
    for (int64_t x : mp.shape) p.add_shape(x);
    p.mutable_rule()->set_kind(REPLICATED);
    auto& t = tensors_[mp.name];
    for (const std::string state : {"fp32", "exp_avg", "exp_avg_sq"}) {
      UCP_ASSIGN_OR_RETURN(t[state], synthetic::Values(p, c.seed, state));
    }
    ParamState s;
    s.name = mp.name;
    s.local_name = mp.name;
    s.full_shape = mp.shape;
    s.rule.set_kind(REPLICATED);
    s.rule.set_pattern(mp.name);
    s.source = RULE_FILE;
    s.origin = "synthetic MoE model";
    s.group = GroupOf(c, mp);
    s.role = state::TensorRole::kTrainable;
    s.lp_dtype = lp;
    params.push_back(std::move(s));
    info_.module_order.push_back({-1, mp.name});
  }
  std::stable_sort(params.begin(), params.end(), [](const ParamState& a, const ParamState& b) { return a.group < b.group; });
  info_.params = std::move(params);
  info_.Reindex();

  // Steps: one 0-dim float32 tensor per group.
  const int64_t iterations = 1 + static_cast<int64_t>(c.seed % 97);
  {
    torch::TorchWriter w;
    std::vector<ValuePtr> steps;
    for (int g = 0; g < num_groups; ++g) {
      steps_.push_back(static_cast<double>(iterations + g));
      steps.push_back(w.AddTensor(synthetic::Scalar(static_cast<float>(iterations + g))));
    }
    UCP_ASSIGN_OR_RETURN(steps_value_, synthetic::BakeTree(w, *Value::List(steps), "steps"));
  }

  // The optimizer state besides partitions (stage_1_and_2.py state_dict).
  const bool fp16 = lp == torch::DType::kFloat16;
  const auto encoding = c.seed % 2 == 0 ? pickle::EnumEncoding::kCall : pickle::EnumEncoding::kGetattr;
  {
    ValuePtr d = Value::MakeDict();
    d->DictSet(Value::Str("loss_scaler"), synthetic::LossScaler(fp16, iterations));
    d->DictSet(Value::Str("dynamic_loss_scale"), Value::Bool(fp16));
    d->DictSet(Value::Str("overflow"), Value::Bool(false));
    d->DictSet(Value::Str("clip_grad"), Value::Float(1.0));
    d->DictSet(Value::Str("zero_stage"), pickle::MakeZeroStage(c.zero_stage, encoding));
    std::vector<ValuePtr> paddings, counts, groups;
    for (int g = 0; g < num_groups; ++g) {
      paddings.push_back(Value::Int(0));  // the writer computes its own
      counts.push_back(Value::Int(g >= c.base_groups ? c.dp1 / c.ep1 : c.dp1));
      // DeepSpeed's groups: {'params', 'name'[, 'weight_decay']} from the
      // training script, the expert copies with 'name': 'ep_size_<ep>', 'moe': True.
      ValuePtr pg = Value::MakeDict();
      const bool expert = g >= c.base_groups;
      const bool no_decay = c.base_groups == 2 && g % 2 == 1;
      // The expert copy keeps the base group's keys (its 'name' replaced),
      // then 'moe'; the optimizer's defaults follow.
      if (no_decay) {
        pg->DictSet(Value::Str("weight_decay"), Value::Float(c.no_decay_weight_decay));
        pg->DictSet(Value::Str("name"), Value::Str(expert ? absl::StrCat("ep_size_", c.ep1) : "no_decay"));
        if (expert) pg->DictSet(Value::Str("moe"), Value::Bool(true));
        AdamDefaults(pg, false);
      } else if (expert) {
        pg->DictSet(Value::Str("name"), Value::Str(absl::StrCat("ep_size_", c.ep1)));
        pg->DictSet(Value::Str("moe"), Value::Bool(true));
        AdamDefaults(pg, true);
      } else {
        pg->DictSet(Value::Str("name"), Value::Str(c.base_groups == 2 ? "decay" : "params"));
        AdamDefaults(pg, true);
      }
      pg->DictSet(Value::Str("params"), Value::List({Value::Int(g)}));
      groups.push_back(pg);
    }
    d->DictSet(Value::Str("group_paddings"), Value::List(paddings));
    d->DictSet(Value::Str("partition_count"), Value::List(counts));
    d->DictSet(Value::Str("ds_version"), Value::Str(c.ds_version));
    d->DictSet(Value::Str("param_groups"), Value::List(groups));
    torch::TorchWriter w;
    UCP_ASSIGN_OR_RETURN(common_, synthetic::BakeTree(w, *d, "optimizer_state"));
  }

  // The model states of dp rank 0 (engine.py _save_moe_checkpoint).
  {
    ValuePtr r = Value::MakeDict();
    std::vector<ValuePtr> num_experts;
    for (const auto& l : info_.moe_layers) num_experts.push_back(Value::Int(l.num_experts));
    const int64_t micro = 1 + static_cast<int64_t>(c.seed % 3);
    ValuePtr ds = Value::MakeDict();
    ds->DictSet(Value::Str("train_micro_batch_size_per_gpu"), Value::Int(micro));
    ds->DictSet(Value::Str("gradient_accumulation_steps"), Value::Int(1));
    ds->DictSet(Value::Str("gradient_clipping"), Value::Int(1));
    ds->DictSet(Value::Str("steps_per_print"), Value::Int(100));
    {
      ValuePtr opt = Value::MakeDict(), params = Value::MakeDict();
      opt->DictSet(Value::Str("type"), Value::Str("Adam"));
      params->DictSet(Value::Str("lr"), Value::Float(0.001));
      params->DictSet(Value::Str("betas"), synthetic::AdamBetas());
      params->DictSet(Value::Str("eps"), Value::Float(1e-08));
      params->DictSet(Value::Str("weight_decay"), Value::Float(0.01));
      params->DictSet(Value::Str("torch_adam"), Value::Bool(true));
      opt->DictSet(Value::Str("params"), params);
      ds->DictSet(Value::Str("optimizer"), opt);
      ValuePtr zo = Value::MakeDict();
      zo->DictSet(Value::Str("stage"), Value::Int(c.zero_stage));
      zo->DictSet(Value::Str("overlap_comm"), Value::Bool(false));
      zo->DictSet(Value::Str("contiguous_gradients"), Value::Bool(true));
      zo->DictSet(Value::Str("reduce_bucket_size"), Value::Float(5e8));
      zo->DictSet(Value::Str("allgather_bucket_size"), Value::Float(5e8));
      ds->DictSet(Value::Str("zero_optimization"), zo);
      if (fp16) {
        ValuePtr f = Value::MakeDict();
        f->DictSet(Value::Str("enabled"), Value::Bool(true));
        f->DictSet(Value::Str("loss_scale"), Value::Int(0));
        f->DictSet(Value::Str("initial_scale_power"), Value::Int(16));
        f->DictSet(Value::Str("hysteresis"), Value::Int(2));
        ds->DictSet(Value::Str("fp16"), f);
      }
      ValuePtr ck = Value::MakeDict();
      ck->DictSet(Value::Str("load_universal"), Value::Bool(false));
      ds->DictSet(Value::Str("checkpoint"), ck);
    }
    // dp rank 0's param_shapes: plain tuples, expert groups under local ids.
    std::vector<ValuePtr> shapes;
    for (int g = 0; g < num_groups; ++g) {
      ValuePtr d = Value::MakeDict(/*ordered_dict=*/true);
      for (const MoeParam& p : module) {
        if (GroupOf(c, p) != g) continue;
        std::string name = p.name;
        if (p.expert) {
          if (p.expert_id >= info_.moe_layers[p.layer].num_experts / c.ep1) continue;
        }
        std::vector<ValuePtr> dims;
        for (int64_t x : p.shape) dims.push_back(Value::Int(x));
        d->DictSet(Value::Str(name), Value::Tuple(std::move(dims)));
      }
      shapes.push_back(d);
    }
    const bool legacy = version < deepspeed::DsVersion{0, 19, 3};
    r->DictSet(Value::Str("module"), Value::MakeDict(/*ordered_dict=*/true));
    if (!legacy) {
      r->DictSet(Value::Str("buffer_names"), Value::List({}));
      r->DictSet(Value::Str("optimizer"), Value::None());
      r->DictSet(Value::Str("param_shapes"), Value::List(shapes));
      r->DictSet(Value::Str("frozen_param_shapes"),
                 c.zero_stage >= 2 ? Value::MakeDict(/*ordered_dict=*/true) : Value::None());
      r->DictSet(Value::Str("shared_params"), Value::MakeDict());
      r->DictSet(Value::Str("frozen_param_fragments"),
                 c.zero_stage >= 2 ? Value::MakeDict(/*ordered_dict=*/true) : Value::None());
    }
    r->DictSet(Value::Str("lr_scheduler"), Value::None());
    r->DictSet(Value::Str("data_sampler"), Value::None());
    r->DictSet(Value::Str("random_ltd"), Value::None());
    r->DictSet(Value::Str("sparse_tensor_module_names"), Value::MakeSet());
    r->DictSet(Value::Str("skipped_steps"), Value::Int(0));
    r->DictSet(Value::Str("global_steps"), Value::Int(iterations));
    r->DictSet(Value::Str("global_samples"), Value::Int(iterations * micro * c.dp1));
    r->DictSet(Value::Str("dp_world_size"), Value::Int(c.dp1));
    r->DictSet(Value::Str("mp_world_size"), Value::Int(1));
    if (!legacy && version >= deepspeed::DsVersion{0, 19, 5}) {
      ValuePtr dims = Value::MakeDict();
      dims->DictSet(Value::Str("pp_degree"), Value::Int(1));
      dims->DictSet(Value::Str("tp_degree"), Value::Int(1));
      r->DictSet(Value::Str("checkpoint_parallel_dimensions"), dims);
    }
    {
      torch::TorchWriter w;
      UCP_ASSIGN_OR_RETURN(ds_config_, synthetic::BakeTree(w, *ds, "ds_config"));
    }
    if (!legacy) {
      r->DictSet(Value::Str("ds_config"), ds);
      r->DictSet(Value::Str("ds_version"), Value::Str(c.ds_version));
    }
    r->DictSet(Value::Str("num_experts"), Value::List(num_experts));
    if (version >= deepspeed::DsVersion{0, 19, 2}) r->DictSet(Value::Str("ds_autoep_layers"), Value::None());
    r->DictSet(Value::Str("iteration"), Value::Int(iterations));
    torch::TorchWriter w;
    UCP_ASSIGN_OR_RETURN(root_, synthetic::BakeTree(w, *r, "mp_rank_00_model_states"));
  }
  return absl::OkStatus();
}

absl::StatusOr<torch::Tensor> SyntheticMoeState::Tensor(const std::string& name, const std::string& state) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return absl::NotFoundError(absl::StrCat("synthetic MoE model has no param '", name, "'"));
  auto s = it->second.find(state);
  if (s == it->second.end()) {
    return absl::NotFoundError(absl::StrCat("synthetic MoE param '", name, "' has no state '", state, "'"));
  }
  return s->second;
}

absl::StatusOr<tp::TensorPlan> SyntheticMoeState::Full(const ParamState& param, const std::string& state) const {
  UCP_ASSIGN_OR_RETURN(torch::Tensor t, Tensor(param.name, state));
  return tp::TensorPlan::FromTensor(t);
}

absl::StatusOr<FileValue> SyntheticMoeState::GroupScalar(int group, const std::string& key) const {
  if (key != "step" || group < 0 || group >= info_.num_groups) return FileValue{};
  return FileValue{steps_value_.value->items()[group], steps_value_.file};
}

absl::StatusOr<ops::WrittenCheckpoint> SaveMoe(const SyntheticMoeState& m, const std::string& folder, int dp, int ep,
                                                const std::string& target_version) {
  writers::ZeroWriteOptions o;
  o.target = state::Topology{1, 1, dp};
  o.expert_parallel = ep;
  o.target_ds_version = target_version;
  o.num_threads = 1;
  return ops::WriteTrainingState(m, folder, o);
}

}  // namespace ucp::conformance
