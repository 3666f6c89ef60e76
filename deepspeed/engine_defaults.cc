#include "deepspeed/engine_defaults.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "base/regex.h"
#include "base/status_macros.h"
#include "deepspeed/layout_math.h"
#include "tp/plan_io.h"
#include "tp/tensor_plan.h"

namespace ucp::deepspeed {
namespace {

using pickle::Value;
using pickle::ValuePtr;
using state::FileValue;
using state::TensorRole;

int64_t Numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t x : s) n *= x;
  return n;
}

ValuePtr StrList(const std::vector<std::string>& items) {
  std::vector<ValuePtr> v;
  for (const auto& s : items) v.push_back(Value::Str(s));
  return Value::List(std::move(v));
}

// deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler as DeepSpeed 0.14.4's
// fp16 config builds it (initial_scale_power 16, hysteresis 2): attributes in
// the order LossScalerBase.__init__ and DynamicLossScaler.__init__ set them.
ValuePtr DynamicLossScaler(int64_t iterations) {
  ValuePtr s = Value::MakeDict();
  s->DictSet(Value::Str("cur_scale"), Value::Float(65536.0));
  s->DictSet(Value::Str("dynamic"), Value::Bool(true));
  s->DictSet(Value::Str("cur_iter"), Value::Int(iterations));
  s->DictSet(Value::Str("last_overflow_iter"), Value::Int(-1));
  s->DictSet(Value::Str("scale_factor"), Value::Float(2.0));
  s->DictSet(Value::Str("scale_window"), Value::Int(1000));
  s->DictSet(Value::Str("min_scale"), Value::Int(1));
  s->DictSet(Value::Str("delayed_shift"), Value::Int(2));
  s->DictSet(Value::Str("cur_hysteresis"), Value::Int(2));
  s->DictSet(Value::Str("consecutive_hysteresis"), Value::Bool(false));
  s->DictSet(Value::Str("raise_error_at_min_scale"), Value::Bool(true));
  s->DictSet(Value::Str("dtype"), Value::Global("torch", "float16"));
  pickle::Object o;
  o.callable = Value::Global("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler");
  o.how = pickle::ObjectHow::kNewObj;
  o.args = Value::Tuple({});
  o.state = s;
  return Value::MakeObject(std::move(o));
}

// The ds_config of a job of `info`'s model: batch sizes, Adam, the ZeRO
// section, fp16 / bf16 as the model's lp dtype says.
ValuePtr DefaultDsConfig(const state::ModelInfo& info, const EngineDefaults& d) {
  const bool fp16 = info.lp_dtype == torch::DType::kFloat16;
  // bf16 weights: a bf16 job (bf16.enabled), whichever optimizer it ran;
  // BF16_Optimizer's also keeps its gradients in fp32 (data_types), which is
  // what makes DeepSpeed pick it at stage 0 and 1.
  const bool bf16 = info.lp_dtype == torch::DType::kBFloat16;
  const bool bf16_optimizer = info.optimizer_kind == state::OptimizerKind::kBf16;
  ValuePtr ds = Value::MakeDict();
  if (d.train_batch_size > 0) ds->DictSet(Value::Str("train_batch_size"), Value::Int(d.train_batch_size));
  ds->DictSet(Value::Str("train_micro_batch_size_per_gpu"), Value::Int(d.micro_batch));
  ds->DictSet(Value::Str("gradient_accumulation_steps"),
              Value::Int(d.train_batch_size > 0 ? d.train_batch_size / d.micro_batch : 1));
  ds->DictSet(Value::Str("gradient_clipping"), Value::Float(1.0));
  ds->DictSet(Value::Str("steps_per_print"), Value::Int(1));
  ds->DictSet(Value::Str("wall_clock_breakdown"), Value::Bool(false));
  ValuePtr opt = Value::MakeDict(), params = Value::MakeDict();
  opt->DictSet(Value::Str("type"), Value::Str("Adam"));
  params->DictSet(Value::Str("lr"), Value::Float(0.001));
  params->DictSet(Value::Str("betas"), AdamBetas());
  params->DictSet(Value::Str("eps"), Value::Float(1e-08));
  params->DictSet(Value::Str("weight_decay"), Value::Float(0.01));
  opt->DictSet(Value::Str("params"), params);
  ds->DictSet(Value::Str("optimizer"), opt);
  ValuePtr zo = Value::MakeDict();
  zo->DictSet(Value::Str("stage"), Value::Int(info.zero_stage));
  zo->DictSet(Value::Str("allgather_partitions"), Value::Bool(true));
  zo->DictSet(Value::Str("reduce_scatter"), Value::Bool(true));
  zo->DictSet(Value::Str("overlap_comm"), Value::Bool(false));
  zo->DictSet(Value::Str("contiguous_gradients"), Value::Bool(true));
  zo->DictSet(Value::Str("allgather_bucket_size"), Value::Float(5e8));
  zo->DictSet(Value::Str("reduce_bucket_size"), Value::Float(5e8));
  ds->DictSet(Value::Str("zero_optimization"), zo);
  ValuePtr ck = Value::MakeDict();
  ck->DictSet(Value::Str("load_universal"), Value::Bool(false));
  ds->DictSet(Value::Str("checkpoint"), ck);
  if (fp16) {
    ValuePtr f = Value::MakeDict();
    f->DictSet(Value::Str("enabled"), Value::Bool(true));
    f->DictSet(Value::Str("loss_scale"), Value::Int(0));
    f->DictSet(Value::Str("initial_scale_power"), Value::Int(16));
    f->DictSet(Value::Str("hysteresis"), Value::Int(2));
    ds->DictSet(Value::Str("fp16"), f);
  }
  if (bf16) {
    ValuePtr b = Value::MakeDict();
    b->DictSet(Value::Str("enabled"), Value::Bool(true));
    ds->DictSet(Value::Str("bf16"), b);
  }
  if (bf16_optimizer) {
    ValuePtr dt = Value::MakeDict();
    dt->DictSet(Value::Str("grad_accum_dtype"), Value::Str("fp32"));
    ds->DictSet(Value::Str("data_types"), dt);
  }
  return ds;
}

class DefaultFacet : public DeepSpeedFacet {
 public:
  DefaultFacet(FileValue common, FileValue root) : common_(std::move(common)), root_(std::move(root)) {}
  absl::StatusOr<FileValue> OptimizerCommon() const override { return common_; }
  FileValue ModelStatesRoot(int pp, int tp) const override { return root_; }
  std::string ModelStatesPath(int pp, int tp) const override { return ""; }

 private:
  FileValue common_;
  FileValue root_;
};

}  // namespace

ValuePtr DeclaredMergePatterns(const state::ModelInfo& info) {
  std::vector<std::string> replicated, average, two_sub, vocab, row;
  int64_t vocab_size = 0;
  for (const auto& p : info.params) {
    if (p.role == TensorRole::kBuffer || p.role == TensorRole::kTied) continue;
    const MergeRule& r = p.rule;
    if (r.ndim() != 0 || r.dim_size_size() != 0 || r.autotp_widths()) return nullptr;
    const std::string pattern = EscapeRegex(p.name) + "$";  // re.match: this name alone
    switch (r.kind()) {
      case REPLICATED: replicated.push_back(pattern); break;
      case AVERAGE: average.push_back(pattern); break;
      case COLUMN: break;  // DeepSpeed's default: cat on dim 0
      case ROW: row.push_back(pattern); break;
      case VOCAB:
        if (r.original_vocab_size() <= 0 || (vocab_size != 0 && vocab_size != r.original_vocab_size())) return nullptr;
        vocab_size = r.original_vocab_size();
        vocab.push_back(pattern);
        break;
      case SUB_PARAMS:
        if (r.has_sub_param_shape() || r.num_sub_params() != 2 || r.cat_dim() != 0) return nullptr;
        two_sub.push_back(pattern);
        break;
      default: return nullptr;  // undecided: nothing is declared
    }
  }
  ValuePtr uc = Value::MakeDict();
  uc->DictSet(Value::Str("tp_replicated_parameter_patterns"), StrList(replicated));
  uc->DictSet(Value::Str("parameter_to_average_patterns"), StrList(average));
  uc->DictSet(Value::Str("parameter_with_row_parallelism_patterns"), StrList(row));
  uc->DictSet(Value::Str("vocabulary_parameter_patterns"), StrList(vocab));
  uc->DictSet(Value::Str("parameter_with_2_sub_params_cat_dim_0"), StrList(two_sub));
  if (vocab_size > 0) uc->DictSet(Value::Str("original_vocab_size"), Value::Int(vocab_size));
  return uc;
}

ValuePtr AdamBetas() { return Value::List({Value::Float(0.9), Value::Float(0.95)}); }

// torch.optim.AdamW (torch 1.13) param_groups as Optimizer.state_dict() packs
// them: group 0 is {'params': ...} filled with the defaults; the others set
// weight_decay 0.0 first. DeepSpeed's ZeRO optimizers hold one flat param per
// group, so 'params' is [g].
ValuePtr AdamParamGroups(int num_groups, bool torch2) {
  std::vector<ValuePtr> groups;
  for (int g = 0; g < num_groups; ++g) {
    ValuePtr d = Value::MakeDict();
    if (g > 0) d->DictSet(Value::Str("weight_decay"), Value::Float(0.0));
    d->DictSet(Value::Str("lr"), Value::Float(0.001));
    d->DictSet(Value::Str("betas"), AdamBetas());
    d->DictSet(Value::Str("eps"), Value::Float(1e-08));
    if (g == 0) d->DictSet(Value::Str("weight_decay"), Value::Float(0.01));
    d->DictSet(Value::Str("amsgrad"), Value::Bool(false));
    d->DictSet(Value::Str("foreach"), Value::None());
    d->DictSet(Value::Str("maximize"), Value::Bool(false));
    d->DictSet(Value::Str("capturable"), Value::Bool(false));
    if (torch2) {
      d->DictSet(Value::Str("differentiable"), Value::Bool(false));
      d->DictSet(Value::Str("fused"), Value::None());
    }
    d->DictSet(Value::Str("params"), Value::List({Value::Int(g)}));
    groups.push_back(d);
  }
  return Value::List(std::move(groups));
}

ValuePtr DefaultLossScaler(bool fp16, int64_t iterations) {
  return fp16 ? DynamicLossScaler(iterations) : pickle::MakeLossScaler(1.0);
}

absl::StatusOr<FileValue> BakeTree(torch::TorchWriter& w, const Value& root, const std::string& stem) {
  UCP_ASSIGN_OR_RETURN(std::string bytes, w.WriteToString(stem, root));
  UCP_ASSIGN_OR_RETURN(std::unique_ptr<torch::TorchFile> f, torch::TorchFile::FromBytes(std::move(bytes), stem));
  std::shared_ptr<const torch::TorchFile> shared(std::move(f));
  return FileValue{shared->root(), shared};
}

absl::StatusOr<FileValue> FreshAdamStep() {
  torch::TorchWriter w;
  ValuePtr root = Value::MakeDict();
  root->DictSet(Value::Str("step"), tp::AddPlan(w, tp::TensorPlan::Zeros(torch::DType::kFloat32, {})));
  UCP_ASSIGN_OR_RETURN(FileValue baked, BakeTree(w, *root, "step"));
  return FileValue{baked.value->DictGetPtr("step"), baked.file};
}

absl::StatusOr<FileValue> DefaultOptimizerCommon(const state::ModelInfo& info, const EngineDefaults& d) {
  UCP_ASSIGN_OR_RETURN(const DsVersion version, ParseDsVersion(d.ds_version));
  const bool torch2 = version >= DsVersion{0, 15, 0};
  const bool fp16 = info.lp_dtype == torch::DType::kFloat16;
  const bool bf16 = info.optimizer_kind == state::OptimizerKind::kBf16;
  // group_paddings / partition_count at dp=1.
  std::vector<ValuePtr> paddings, counts;
  for (int g = 0; g < info.num_groups; ++g) {
    std::vector<int64_t> numels;
    for (const auto& p : info.params) {
      if (p.trainable() && p.group == g) numels.push_back(Numel(p.full_shape));
    }
    paddings.push_back(Value::Int(ZeroGroupLayout::Make(numels, 1).padding(0)));
    counts.push_back(Value::Int(1));
  }
  ValuePtr c = Value::MakeDict();
  if (!bf16) {
    c->DictSet(Value::Str("loss_scaler"), DefaultLossScaler(fp16, d.global_steps));
    c->DictSet(Value::Str("dynamic_loss_scale"), Value::Bool(fp16));
    c->DictSet(Value::Str("overflow"), Value::Bool(false));
  }
  c->DictSet(Value::Str("clip_grad"), Value::Float(1.0));
  if (!bf16) c->DictSet(Value::Str("zero_stage"), pickle::MakeZeroStage(info.zero_stage, d.zero_stage_encoding));
  c->DictSet(Value::Str("group_paddings"), Value::List(paddings));
  c->DictSet(Value::Str("partition_count"), Value::List(counts));
  c->DictSet(Value::Str("ds_version"), Value::Str(d.ds_version));
  c->DictSet(Value::Str("param_groups"), AdamParamGroups(info.num_groups, torch2));
  torch::TorchWriter w;
  return BakeTree(w, *c, "optimizer_state");
}

absl::StatusOr<FileValue> DefaultModelStatesRoot(const state::ModelInfo& info, const EngineDefaults& d) {
  UCP_ASSIGN_OR_RETURN(const DsVersion version, ParseDsVersion(d.ds_version));
  torch::TorchWriter w;
  ValuePtr r = Value::MakeDict();
  std::vector<std::string> buffers;
  for (const auto& p : info.params) {
    if (p.role == TensorRole::kBuffer) buffers.push_back(p.name);
  }
  std::vector<ValuePtr> shapes;
  for (int g = 0; g < info.num_groups; ++g) {
    ValuePtr shape_dict = Value::MakeDict(/*ordered_dict=*/true);
    for (const auto& p : info.params) {
      if (p.trainable() && p.group == g) shape_dict->DictSet(Value::Str(p.name), pickle::MakeTorchSize(p.full_shape));
    }
    shapes.push_back(shape_dict);
  }
  ValuePtr frozen_shapes = Value::None(), frozen_fragments = Value::None();
  if (info.zero_stage >= 2) {
    frozen_shapes = Value::MakeDict(/*ordered_dict=*/true);
    frozen_fragments = Value::MakeDict(/*ordered_dict=*/true);
  }
  r->DictSet(Value::Str("module"), Value::None());
  r->DictSet(Value::Str("buffer_names"), StrList(buffers));
  r->DictSet(Value::Str("optimizer"), Value::None());
  r->DictSet(Value::Str("param_shapes"), Value::List(shapes));
  r->DictSet(Value::Str("frozen_param_shapes"), frozen_shapes);
  r->DictSet(Value::Str("shared_params"), Value::MakeDict());
  r->DictSet(Value::Str("frozen_param_fragments"), frozen_fragments);
  r->DictSet(Value::Str("lr_scheduler"), Value::None());
  r->DictSet(Value::Str("data_sampler"), Value::None());
  r->DictSet(Value::Str("random_ltd"), Value::None());
  r->DictSet(Value::Str("sparse_tensor_module_names"), Value::MakeSet());
  r->DictSet(Value::Str("skipped_steps"), Value::Int(0));
  r->DictSet(Value::Str("global_steps"), Value::Int(d.global_steps));
  r->DictSet(Value::Str("global_samples"), Value::Int(d.global_steps * d.micro_batch));
  r->DictSet(Value::Str("dp_world_size"), Value::Int(1));
  r->DictSet(Value::Str("mp_world_size"), Value::Int(1));
  if (version >= DsVersion{0, 19, 5}) {
    ValuePtr dims = Value::MakeDict();
    dims->DictSet(Value::Str("pp_degree"), Value::Int(1));
    dims->DictSet(Value::Str("tp_degree"), Value::Int(1));
    r->DictSet(Value::Str("checkpoint_parallel_dimensions"), dims);
  }
  r->DictSet(Value::Str("ds_config"), DefaultDsConfig(info, d));
  r->DictSet(Value::Str("ds_version"), Value::Str(d.ds_version));
  if (d.declare_merge_patterns) {
    if (ValuePtr uc = DeclaredMergePatterns(info)) r->DictSet(Value::Str("universal_checkpoint_info"), uc);
  }
  if (d.client_state) UCP_RETURN_IF_ERROR(d.client_state(w, *r));
  return BakeTree(w, *r, "mp_rank_00_model_states");
}

absl::StatusOr<std::unique_ptr<DeepSpeedFacet>> MakeDefaultFacet(const state::ModelInfo& info,
                                                                 const EngineDefaults& d) {
  UCP_ASSIGN_OR_RETURN(FileValue common, DefaultOptimizerCommon(info, d));
  UCP_ASSIGN_OR_RETURN(FileValue root, DefaultModelStatesRoot(info, d));
  return std::make_unique<DefaultFacet>(std::move(common), std::move(root));
}

absl::StatusOr<const DeepSpeedFacet*> FacetOrDefaults(const state::CheckpointState& state,
                                                      const std::string& ds_version,
                                                      std::unique_ptr<DeepSpeedFacet>* owned) {
  if (const DeepSpeedFacet* ds = FacetOf(state)) return ds;
  EngineDefaults d;
  if (!ds_version.empty()) d.ds_version = ds_version;
  d.declare_merge_patterns = true;
  UCP_ASSIGN_OR_RETURN(*owned, MakeDefaultFacet(state.info(), d),
                       _.Prepend("DeepSpeed's defaults for a source without DeepSpeed's engine state: "));
  return owned->get();
}

}  // namespace ucp::deepspeed
