#include "conformance/synthetic_state.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <set>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "conformance/spec_rules.h"
#include "rules/presets.h"
#include "format/pickle/accessors.h"
#include "format/torch/torch_file.h"
#include "tp/merge.h"

namespace ucp::conformance {
namespace {

using deepspeed::FileValue;
using deepspeed::ParamState;
using deepspeed::TensorRole;
using pickle::Value;
using pickle::ValuePtr;

constexpr int kRngStateBytes = 5056;  // torch's CPU generator state

uint64_t Mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

int64_t Numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t x : s) n *= x;
  return n;
}

absl::StatusOr<TensorRole> ParseRole(const std::string& role) {
  if (role.empty() || role == "trainable") return TensorRole::kTrainable;
  if (role == "frozen") return TensorRole::kFrozen;
  if (role == "buffer") return TensorRole::kBuffer;
  if (role == "tied") return TensorRole::kTied;
  return absl::InvalidArgumentError(absl::StrCat("unknown role '", role, "' (trainable, frozen, buffer, tied)"));
}

// Element values of one state of one param. Every state gets its own stream;
// values are small multiples of powers of two, exact in every float type.
enum class Salt : uint64_t { kFp32 = 1, kExpAvg = 2, kExpAvgSq = 3, kLp = 4 };

float ElementValue(Salt salt, uint64_t h) {
  const int64_t r = static_cast<int64_t>(h % 4001);
  switch (salt) {
    case Salt::kFp32: return static_cast<float>(r - 2000) / 2048.0f;
    case Salt::kExpAvg: return static_cast<float>(r - 2000) / 8192.0f;
    case Salt::kExpAvgSq: return static_cast<float>(r) / 65536.0f;
    case Salt::kLp: return static_cast<float>(r - 2000) / 1024.0f;
  }
  return 0;
}

// The full tensor of one state. With `equal_slices`, values ignore the
// coordinate on the partition dim, so every tp slice is the same.
absl::StatusOr<torch::Tensor> MakeValues(const ModelParam& p, uint64_t seed, Salt salt) {
  const std::vector<int64_t> shape(p.shape().begin(), p.shape().end());
  const int64_t n = Numel(shape);
  const int64_t pdim = p.equal_slices() ? tp::PartitionDim(p.rule()) : -1;
  std::vector<int64_t> strides(shape.size(), 1);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d) strides[d] = strides[d + 1] * shape[d + 1];
  const uint64_t key = Mix64(seed ^ Fnv1a(p.name()) ^ Mix64(static_cast<uint64_t>(salt)));
  std::string bytes(static_cast<size_t>(n) * sizeof(float), '\0');
  for (int64_t i = 0; i < n; ++i) {
    int64_t e = i;
    if (pdim >= 0 && pdim < static_cast<int64_t>(shape.size())) {
      const int64_t coord = (i / strides[pdim]) % shape[pdim];
      e = i - coord * strides[pdim];
    }
    const float v = ElementValue(salt, Mix64(key + static_cast<uint64_t>(e) * 0x9e3779b97f4a7c15ULL));
    std::memcpy(&bytes[static_cast<size_t>(i) * sizeof(float)], &v, sizeof(float));
  }
  return torch::Tensor::FromBytes(torch::DType::kFloat32, shape, std::move(bytes));
}

torch::Tensor ScalarTensor(float v) {
  std::string bytes(sizeof(float), '\0');
  std::memcpy(&bytes[0], &v, sizeof(float));
  return *torch::Tensor::FromBytes(torch::DType::kFloat32, {}, std::move(bytes));
}

torch::Tensor RandomBytesTensor(uint64_t key, int64_t n) {
  std::string bytes(static_cast<size_t>(n), '\0');
  for (int64_t i = 0; i < n; ++i) bytes[i] = static_cast<char>(Mix64(key + i) & 0xff);
  return *torch::Tensor::FromBytes(torch::DType::kUInt8, {n}, std::move(bytes));
}

// Writes a value tree (whose tensors were added to `w`) and reads it back:
// the tree a reader of such a file sees, with its tensors file-backed.
absl::StatusOr<FileValue> Bake(torch::TorchWriter& w, const Value& root, const std::string& stem) {
  UCP_ASSIGN_OR_RETURN(std::string bytes, w.WriteToString(stem, root));
  UCP_ASSIGN_OR_RETURN(std::unique_ptr<torch::TorchFile> f, torch::TorchFile::FromBytes(std::move(bytes), stem));
  std::shared_ptr<const torch::TorchFile> shared(std::move(f));
  return FileValue{shared->root(), shared};
}

ValuePtr StrList(const std::vector<std::string>& items) {
  std::vector<ValuePtr> v;
  for (const auto& s : items) v.push_back(Value::Str(s));
  return Value::List(std::move(v));
}

ValuePtr Betas() { return Value::List({Value::Float(0.9), Value::Float(0.95)}); }

// torch.optim.AdamW (torch 1.13) param_groups as Optimizer.state_dict() packs
// them: group 0 is {'params': ...} filled with the defaults; the others set
// weight_decay 0.0 first. DeepSpeed's ZeRO optimizers hold one flat param per
// group, so 'params' is [g].
ValuePtr ParamGroups(int num_groups, bool torch2) {
  std::vector<ValuePtr> groups;
  for (int g = 0; g < num_groups; ++g) {
    ValuePtr d = Value::MakeDict();
    if (g > 0) d->DictSet(Value::Str("weight_decay"), Value::Float(0.0));
    d->DictSet(Value::Str("lr"), Value::Float(0.001));
    d->DictSet(Value::Str("betas"), Betas());
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

}  // namespace

namespace synthetic {

absl::StatusOr<torch::Tensor> Values(const ModelParam& p, uint64_t seed, const std::string& state) {
  if (state == deepspeed::kFp32State) return MakeValues(p, seed, Salt::kFp32);
  if (state == "exp_avg") return MakeValues(p, seed, Salt::kExpAvg);
  if (state == "exp_avg_sq") return MakeValues(p, seed, Salt::kExpAvgSq);
  if (state == deepspeed::kLpState) return MakeValues(p, seed, Salt::kLp);
  return absl::InvalidArgumentError(absl::StrCat("no synthetic state '", state, "'"));
}

torch::Tensor Scalar(float v) { return ScalarTensor(v); }

absl::StatusOr<deepspeed::FileValue> BakeTree(torch::TorchWriter& w, const pickle::Value& root,
                                              const std::string& stem) {
  return Bake(w, root, stem);
}

pickle::ValuePtr LossScaler(bool fp16, int64_t iterations) {
  return fp16 ? DynamicLossScaler(iterations) : pickle::MakeLossScaler(1.0);
}

pickle::ValuePtr AdamBetas() { return Betas(); }

}  // namespace synthetic

absl::StatusOr<deepspeed::OptimizerKind> ParseOptimizerLayout(const std::string& name) {
  if (name == "zero" || name.empty()) return deepspeed::OptimizerKind::kZero;
  if (name == "bf16") return deepspeed::OptimizerKind::kBf16;
  return absl::InvalidArgumentError(absl::StrCat("unknown optimizer layout '", name, "' (zero, bf16)"));
}

absl::Status ValidateModelSpec(const ModelSpec& spec) {
  auto err = [](absl::string_view what) { return absl::InvalidArgumentError(absl::StrCat("model spec: ", what)); };
  UCP_RETURN_IF_ERROR(torch::ParseDType(spec.lp_dtype().empty() ? "fp32" : spec.lp_dtype()).status());
  if (spec.num_groups() < 1) return err("num_groups must be >= 1");
  std::set<std::string> names;
  std::vector<int> group_size(spec.num_groups(), 0);
  std::set<int> module_layers(spec.module_layers().begin(), spec.module_layers().end());
  if (spec.pipeline()) {
    if (spec.num_layers() < 1) return err("a pipeline model needs num_layers >= 1");
    if (!module_layers.count(spec.num_layers() - 1)) {
      // A trailing function layer leaves no trace in a checkpoint: readers
      // would count one layer fewer and partition stages differently.
      return err(absl::StrCat("the last layer (", spec.num_layers() - 1, ") must be a module"));
    }
    for (int l : module_layers) {
      if (l < 0 || l >= spec.num_layers()) return err(absl::StrCat("module layer ", l, " out of range"));
    }
  }
  for (const ModelParam& p : spec.param()) {
    const std::string& n = p.name();
    if (n.empty() || !names.insert(n).second) return err(absl::StrCat("empty or duplicate name '", n, "'"));
    std::vector<int64_t> shape(p.shape().begin(), p.shape().end());
    if (shape.empty()) return err(absl::StrCat("'", n, "' has no shape (0-dim params are not supported)"));
    for (int64_t d : shape) {
      if (d <= 0) return err(absl::StrCat("'", n, "' has shape ", torch::ShapeString(shape)));
    }
    UCP_ASSIGN_OR_RETURN(TensorRole role, ParseRole(p.role()));
    UCP_RETURN_IF_ERROR(tp::ValidateRule(p.rule(), n));
    const int64_t padded = p.rule().kind() == VOCAB ? shape[0] : 0;
    UCP_RETURN_IF_ERROR(tp::SliceShapeFromFull(p.rule(), shape, 1, padded, n).status());
    if (p.rule().kind() == VOCAB) {
      if (spec.make_vocab_size_divisible_by() <= 0) return err("vocab params need make_vocab_size_divisible_by > 0");
      if (shape[0] != spec.original_vocab_size()) {
        return err(absl::StrCat("vocab param '", n, "' has ", shape[0], " rows, original_vocab_size is ",
                                spec.original_vocab_size()));
      }
    }
    if (role == TensorRole::kTrainable) {
      if (p.group() < 0 || p.group() >= spec.num_groups()) return err(absl::StrCat("'", n, "' has group ", p.group()));
      ++group_size[p.group()];
    } else if (p.group() != -1) {
      return err(absl::StrCat("'", n, "' is not trainable but has group ", p.group()));
    }
    if (spec.pipeline()) {
      std::vector<int> layers = p.tied_layer().empty() ? std::vector<int>{p.layer()}
                                                      : std::vector<int>(p.tied_layer().begin(), p.tied_layer().end());
      if (!p.tied_layer().empty() && (p.tied_layer_size() < 2 || p.tied_key().empty() || p.layer() != p.tied_layer(0))) {
        return err(absl::StrCat("tied param '", n, "' needs a tied_key, >= 2 tied layers and layer = the first"));
      }
      for (int l : layers) {
        if (!module_layers.count(l)) return err(absl::StrCat("'", n, "' is in layer ", l, ", which is not a module"));
      }
      if (p.local_name().empty()) return err(absl::StrCat("'", n, "' has no local name"));
    } else if (p.layer() != -1 || !p.tied_key().empty()) {
      return err(absl::StrCat("'", n, "': a plain module has no layers or tied params"));
    }
  }
  for (int g = 0; g < spec.num_groups(); ++g) {
    if (group_size[g] == 0) return err(absl::StrCat("group ", g, " has no params"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SyntheticModelState>> SyntheticModelState::Make(const ModelSpec& spec, uint64_t seed,
                                                                               int zero_stage,
                                                                               deepspeed::OptimizerKind kind,
                                                                               const SyntheticVersion& version) {
  UCP_ASSIGN_OR_RETURN(deepspeed::DsVersion v, deepspeed::ParseDsVersion(version.ds_version),
                       _.Prepend("synthetic model: "));
  if (v < deepspeed::DsVersion{0, 12, 0} || deepspeed::DsVersion{0, 19, 5} < v) {
    return absl::InvalidArgumentError(
        absl::StrCat("synthetic model: DeepSpeed ", version.ds_version, " (the layouts of 0.12 to 0.19.5 only)"));
  }
  std::unique_ptr<SyntheticModelState> s(new SyntheticModelState());
  s->spec_ = spec;
  s->seed_ = seed;
  s->version_ = version;
  s->info_.zero_stage = zero_stage;
  s->info_.optimizer_kind = kind;
  UCP_RETURN_IF_ERROR(s->Build());
  return s;
}

absl::StatusOr<std::unique_ptr<SyntheticModelState>> SyntheticModelState::FromCase(const GoldenCase& c) {
  UCP_ASSIGN_OR_RETURN(deepspeed::OptimizerKind kind, ParseOptimizerLayout(c.optimizer_layout()));
  SyntheticVersion v;
  if (!c.ds_version().empty()) v.ds_version = c.ds_version();
  v.numpy2 = c.numpy2();
  return Make(c.model(), c.seed(), c.zero_stage() > 0 ? c.zero_stage() : 1, kind, v);
}

int64_t SpecAttentionHeads(const ModelSpec& spec) {
  if (spec.num_attention_heads() > 0) return spec.num_attention_heads();
  int64_t g = 0;
  for (const ModelParam& p : spec.param()) {
    const MergeRule& r = p.rule();
    if (r.kind() == VOCAB) continue;
    const int64_t dim = tp::PartitionDim(r);
    if (dim < 0 || dim >= p.shape_size()) continue;
    if (r.kind() == SUB_PARAMS && r.sub_param_shape().dim_size() > dim) {
      for (int64_t sub : r.sub_param_shape().dim(static_cast<int>(dim)).size()) g = std::gcd(g, sub);
    } else if (r.kind() == SUB_PARAMS && r.num_sub_params() > 0) {
      g = std::gcd(g, p.shape(static_cast<int>(dim)) / r.num_sub_params());
    } else {
      g = std::gcd(g, p.shape(static_cast<int>(dim)));
    }
  }
  return g > 0 ? g : 64;
}

absl::StatusOr<deepspeed::ModelInfo> ModelInfoFromSpec(const ModelSpec& spec, int zero_stage,
                                                       deepspeed::OptimizerKind kind) {
  UCP_RETURN_IF_ERROR(ValidateModelSpec(spec));
  deepspeed::ModelInfo info;
  info.zero_stage = zero_stage;
  info.optimizer_kind = kind;
  UCP_ASSIGN_OR_RETURN(torch::DType lp_dtype, torch::ParseDType(spec.lp_dtype().empty() ? "fp32" : spec.lp_dtype()));
  const bool bf16 = kind == deepspeed::OptimizerKind::kBf16;
  if (bf16 && lp_dtype != torch::DType::kBFloat16) {
    return absl::InvalidArgumentError("the bf16 optimizer (BF16_Optimizer) holds bf16 weights: lp_dtype must be bf16");
  }
  if (!bf16 && lp_dtype == torch::DType::kBFloat16) {
    return absl::InvalidArgumentError("bf16 weights are saved by the bf16 optimizer: optimizer_layout must be bf16");
  }
  if (zero_stage != 1 && zero_stage != 2) {
    return absl::InvalidArgumentError(absl::StrCat("ZeRO stage ", zero_stage, ": expected 1 or 2"));
  }
  if (spec.pipeline() && zero_stage != 1) {
    return absl::InvalidArgumentError("ZeRO stage 2 cannot run under a PipelineModule");
  }
  if (bf16 && zero_stage != 1) return absl::InvalidArgumentError("the bf16 optimizer partitions like stage 1");

  info.num_groups = spec.num_groups();
  info.state_keys = {"exp_avg", "exp_avg_sq"};
  info.scalar_keys = {"step"};
  info.pipeline = spec.pipeline();
  info.num_layers = spec.pipeline() ? spec.num_layers() : 0;
  info.module_layers.assign(spec.module_layers().begin(), spec.module_layers().end());
  std::sort(info.module_layers.begin(), info.module_layers.end());
  info.lp_dtype = lp_dtype;
  info.bf16_file_prefix = bf16;
  info.original_vocab_size = spec.original_vocab_size();
  info.make_vocab_size_divisible_by = spec.make_vocab_size_divisible_by();
  info.partition_method = spec.partition_method();
  info.source_topology = deepspeed::Topology{1, 1, 1};

  // Trainable params in flatten order (group by group, module order within),
  // then frozen params and buffers in module order.
  std::vector<ParamState> trainable, other;
  for (const ModelParam& p : spec.param()) {
    ParamState s;
    s.name = p.name();
    s.full_shape.assign(p.shape().begin(), p.shape().end());
    s.rule = p.rule();
    if (s.rule.pattern().empty()) s.rule.set_pattern(ExactPattern(p.name()));
    if (s.rule.kind() == VOCAB) s.rule.set_original_vocab_size(spec.original_vocab_size());
    s.source = RULE_FILE;
    s.origin = "synthetic model";
    s.group = p.group();
    UCP_ASSIGN_OR_RETURN(s.role, ParseRole(p.role()));
    s.lp_dtype = lp_dtype;
    s.layer = spec.pipeline() ? p.layer() : -1;
    s.local_name = spec.pipeline() ? p.local_name() : p.name();
    s.tied_key = p.tied_key();
    s.tied_layers.assign(p.tied_layer().begin(), p.tied_layer().end());
    (s.trainable() ? trainable : other).push_back(std::move(s));
  }
  std::stable_sort(trainable.begin(), trainable.end(),
                   [](const ParamState& a, const ParamState& b) { return a.group < b.group; });
  info.params = std::move(trainable);
  info.params.insert(info.params.end(), other.begin(), other.end());
  info.Reindex();
  if (spec.pipeline()) {
    for (int l : info.module_layers) {
      for (const ModelParam& p : spec.param()) {
        const bool here = p.tied_layer().empty()
                              ? p.layer() == l
                              : std::find(p.tied_layer().begin(), p.tied_layer().end(), l) != p.tied_layer().end();
        if (here) info.module_order.push_back({l, p.name()});
      }
    }
  } else {
    for (const ModelParam& p : spec.param()) info.module_order.push_back({-1, p.name()});
  }
  return info;
}

absl::Status SyntheticModelState::Build() {
  const ModelSpec& spec = spec_;
  UCP_ASSIGN_OR_RETURN(info_, ModelInfoFromSpec(spec, info_.zero_stage, info_.optimizer_kind));
  const std::string& ds_version = version_.ds_version;
  UCP_ASSIGN_OR_RETURN(const deepspeed::DsVersion version, deepspeed::ParseDsVersion(ds_version));
  const bool torch2 = version >= deepspeed::DsVersion{0, 15, 0};
  const torch::DType lp_dtype = info_.lp_dtype;
  const bool bf16 = info_.optimizer_kind == deepspeed::OptimizerKind::kBf16;

  // Tensors.
  for (const ModelParam& p : spec.param()) {
    auto& t = tensors_[p.name()];
    UCP_ASSIGN_OR_RETURN(TensorRole role, ParseRole(p.role()));
    if (role == TensorRole::kTrainable) {
      UCP_ASSIGN_OR_RETURN(t[deepspeed::kFp32State], MakeValues(p, seed_, Salt::kFp32));
      UCP_ASSIGN_OR_RETURN(t["exp_avg"], MakeValues(p, seed_, Salt::kExpAvg));
      UCP_ASSIGN_OR_RETURN(t["exp_avg_sq"], MakeValues(p, seed_, Salt::kExpAvgSq));
    } else {
      UCP_ASSIGN_OR_RETURN(torch::Tensor v, MakeValues(p, seed_, Salt::kLp));
      UCP_ASSIGN_OR_RETURN(t[deepspeed::kLpState], torch::Cast(v, lp_dtype));
    }
  }

  // Steps: per group, as torch AdamW keeps them (0-dim float32 tensors).
  const int64_t iterations = 1 + static_cast<int64_t>(seed_ % 97);
  {
    torch::TorchWriter w;
    std::vector<ValuePtr> steps;
    for (int g = 0; g < info_.num_groups; ++g) {
      steps_.push_back(static_cast<double>(iterations + g));
      steps.push_back(w.AddTensor(ScalarTensor(static_cast<float>(iterations + g))));
    }
    UCP_ASSIGN_OR_RETURN(steps_value_, Bake(w, *Value::List(steps), "steps"));
  }

  // The optimizer state besides partitions.
  const bool fp16 = lp_dtype == torch::DType::kFloat16;
  const pickle::EnumEncoding encoding = seed_ % 2 == 0 ? pickle::EnumEncoding::kCall : pickle::EnumEncoding::kGetattr;
  {
    // DeepSpeed's group_paddings / partition_count at the synthetic source (dp=1).
    std::vector<ValuePtr> paddings, counts;
    for (int g = 0; g < info_.num_groups; ++g) {
      std::vector<int64_t> numels;
      for (const auto& p : info_.params) {
        if (p.trainable() && p.group == g) numels.push_back(Numel(p.full_shape));
      }
      paddings.push_back(Value::Int(deepspeed::ZeroGroupLayout::Make(numels, 1).padding(0)));
      counts.push_back(Value::Int(1));
    }
    ValuePtr c = Value::MakeDict();
    if (!bf16) {
      c->DictSet(Value::Str("loss_scaler"), fp16 ? DynamicLossScaler(iterations) : pickle::MakeLossScaler(1.0));
      c->DictSet(Value::Str("dynamic_loss_scale"), Value::Bool(fp16));
      c->DictSet(Value::Str("overflow"), Value::Bool(false));
    }
    c->DictSet(Value::Str("clip_grad"), Value::Float(1.0));
    if (!bf16) c->DictSet(Value::Str("zero_stage"), pickle::MakeZeroStage(info_.zero_stage, encoding));
    c->DictSet(Value::Str("group_paddings"), Value::List(paddings));
    c->DictSet(Value::Str("partition_count"), Value::List(counts));
    c->DictSet(Value::Str("ds_version"), Value::Str(ds_version));
    c->DictSet(Value::Str("param_groups"), ParamGroups(info_.num_groups, torch2));
    torch::TorchWriter w;
    UCP_ASSIGN_OR_RETURN(common_, Bake(w, *c, "optimizer_state"));
  }

  // The model states (engine.py:_save_checkpoint's keys), then client state.
  {
    torch::TorchWriter w;
    ValuePtr r = Value::MakeDict();
    std::vector<std::string> buffers;
    for (const auto& p : info_.params) {
      if (p.role == TensorRole::kBuffer) buffers.push_back(p.name);
    }
    std::vector<ValuePtr> shapes;
    for (int g = 0; g < info_.num_groups; ++g) {
      ValuePtr d = Value::MakeDict(/*ordered_dict=*/true);
      for (const auto& p : info_.params) {
        if (p.trainable() && p.group == g) d->DictSet(Value::Str(p.name), pickle::MakeTorchSize(p.full_shape));
      }
      shapes.push_back(d);
    }
    const int64_t micro = 1 + static_cast<int64_t>(seed_ % 3);
    ValuePtr frozen_shapes = Value::None(), frozen_fragments = Value::None();
    if (info_.zero_stage >= 2) {
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
    r->DictSet(Value::Str("global_steps"), Value::Int(iterations));
    r->DictSet(Value::Str("global_samples"), Value::Int(iterations * micro));
    r->DictSet(Value::Str("dp_world_size"), Value::Int(1));
    r->DictSet(Value::Str("mp_world_size"), Value::Int(1));
    if (version >= deepspeed::DsVersion{0, 19, 5}) {
      ValuePtr dims = Value::MakeDict();
      dims->DictSet(Value::Str("pp_degree"), Value::Int(1));
      dims->DictSet(Value::Str("tp_degree"), Value::Int(1));
      r->DictSet(Value::Str("checkpoint_parallel_dimensions"), dims);
    }
    {
      ValuePtr ds = Value::MakeDict();
      if (spec.train_batch_size() > 0) ds->DictSet(Value::Str("train_batch_size"), Value::Int(spec.train_batch_size()));
      ds->DictSet(Value::Str("train_micro_batch_size_per_gpu"), Value::Int(micro));
      ds->DictSet(Value::Str("gradient_accumulation_steps"),
                  Value::Int(spec.train_batch_size() > 0 ? spec.train_batch_size() / micro : 1));
      ds->DictSet(Value::Str("gradient_clipping"), Value::Float(1.0));
      ds->DictSet(Value::Str("steps_per_print"), Value::Int(1));
      ds->DictSet(Value::Str("wall_clock_breakdown"), Value::Bool(false));
      ValuePtr opt = Value::MakeDict(), params = Value::MakeDict();
      opt->DictSet(Value::Str("type"), Value::Str("Adam"));
      params->DictSet(Value::Str("lr"), Value::Float(0.001));
      params->DictSet(Value::Str("betas"), Betas());
      params->DictSet(Value::Str("eps"), Value::Float(1e-08));
      params->DictSet(Value::Str("weight_decay"), Value::Float(0.01));
      opt->DictSet(Value::Str("params"), params);
      ds->DictSet(Value::Str("optimizer"), opt);
      ValuePtr zo = Value::MakeDict();
      zo->DictSet(Value::Str("stage"), Value::Int(info_.zero_stage));
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
        ValuePtr dt = Value::MakeDict();
        dt->DictSet(Value::Str("grad_accum_dtype"), Value::Str("fp32"));
        ds->DictSet(Value::Str("data_types"), dt);
      }
      r->DictSet(Value::Str("ds_config"), ds);
    }
    r->DictSet(Value::Str("ds_version"), Value::Str(ds_version));
    // Client state, as GPT-NeoX / Megatron-DeepSpeed save it.
    r->DictSet(Value::Str("iteration"), Value::Int(iterations));
    {
      ValuePtr a = Value::MakeDict();
      int transformer_layers = 0;
      std::set<int> layers;
      for (const ModelParam& p : spec.param()) {
        if (spec.pipeline() && p.local_name().find("attention") != std::string::npos) layers.insert(p.layer());
      }
      transformer_layers = static_cast<int>(layers.size());
      a->DictSet(Value::Str("num_layers"), Value::Int(transformer_layers));
      a->DictSet(Value::Str("hidden_size"), Value::Int(spec.hidden_size()));
      a->DictSet(Value::Str("num_attention_heads"), Value::Int(SpecAttentionHeads(spec)));
      a->DictSet(Value::Str("seq_length"), Value::Int(16));
      a->DictSet(Value::Str("make_vocab_size_divisible_by"), Value::Int(spec.make_vocab_size_divisible_by()));
      if (spec.swiglu()) a->DictSet(Value::Str("swiglu"), Value::Bool(true));
      if (!spec.partition_method().empty()) {
        a->DictSet(Value::Str("pipe_partition_method"), Value::Str(spec.partition_method()));
      }
      a->DictSet(Value::Str("seed"), Value::Int(static_cast<int64_t>(seed_ % 100000)));
      r->DictSet(Value::Str("args"), a);
    }
    {
      // random.getstate(): (3, 624 words + position, None).
      std::vector<ValuePtr> words;
      for (int i = 0; i < 624; ++i) words.push_back(Value::Int(static_cast<int64_t>(Mix64(seed_ * 7 + i) & 0xffffffff)));
      words.push_back(Value::Int(624));
      r->DictSet(Value::Str("random_rng_state"), Value::Tuple({Value::Int(3), Value::Tuple(words), Value::None()}));
      // numpy.random.get_state(): ('MT19937', uint32[624], pos, has_gauss, cached_gaussian).
      pickle::NumpyArray keys;
      keys.dtype = "<u4";
      keys.shape = {624};
      keys.data.resize(624 * 4);
      for (int i = 0; i < 624; ++i) {
        const uint32_t k = static_cast<uint32_t>(Mix64(seed_ * 11 + i));
        std::memcpy(&keys.data[i * 4], &k, 4);
      }
      UCP_ASSIGN_OR_RETURN(ValuePtr np_keys, pickle::MakeNumpyArray(keys, version_.numpy2));
      r->DictSet(Value::Str("np_rng_state"), Value::Tuple({Value::Str("MT19937"), np_keys, Value::Int(624),
                                                            Value::Int(0), Value::Float(0.0)}));
      r->DictSet(Value::Str("torch_rng_state"), w.AddTensor(RandomBytesTensor(seed_ * 13, kRngStateBytes)));
      ValuePtr tracker = Value::MakeDict();
      tracker->DictSet(Value::Str("model-parallel-rng"), w.AddTensor(RandomBytesTensor(seed_ * 17, kRngStateBytes)));
      r->DictSet(Value::Str("rng_tracker_states"), tracker);
    }
    UCP_ASSIGN_OR_RETURN(ValuePtr uc_info, SpecCheckpointInfo(spec));
    r->DictSet(Value::Str("universal_checkpoint_info"), uc_info);
    UCP_ASSIGN_OR_RETURN(root_, Bake(w, *r, "mp_rank_00_model_states"));
  }
  return absl::OkStatus();
}

absl::StatusOr<torch::Tensor> SyntheticModelState::Tensor(const std::string& name, const std::string& state) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return absl::NotFoundError(absl::StrCat("synthetic model has no param '", name, "'"));
  auto s = it->second.find(state);
  if (s == it->second.end()) {
    return absl::NotFoundError(absl::StrCat("synthetic param '", name, "' has no state '", state,
                                            state == deepspeed::kLpState
                                                ? "' (trainable params' lp weights are the writer's cast of fp32)"
                                                : "'"));
  }
  return s->second;
}

absl::StatusOr<tp::TensorPlan> SyntheticModelState::Full(const ParamState& param, const std::string& state) const {
  UCP_ASSIGN_OR_RETURN(torch::Tensor t, Tensor(param.name, state));
  return tp::TensorPlan::FromTensor(t);
}

absl::StatusOr<FileValue> SyntheticModelState::GroupScalar(int group, const std::string& key) const {
  if (key != "step" || group < 0 || group >= info_.num_groups) return FileValue{};
  return FileValue{steps_value_.value->items()[group], steps_value_.file};
}

absl::StatusOr<FileValue> SyntheticModelState::OptimizerCommon() const { return common_; }

FileValue SyntheticModelState::ModelStatesRoot(int pp, int tp) const { return root_; }

rules::LayerTypeNamer ModelLayerTypeNamer(const deepspeed::ModelInfo& info) {
  std::vector<std::string> names;
  for (const auto& p : info.params) names.push_back(p.name);
  return rules::LayerTypeNamerFor(rules::DetectPreset(names).value_or(""));
}

absl::StatusOr<writers::ZeroWriteResult> SaveZero(const deepspeed::ModelState& state, const std::string& folder,
                                                 const deepspeed::Topology& topology, int num_threads) {
  writers::ZeroWriteOptions o;
  o.target = topology;
  o.num_threads = num_threads;
  o.layer_type_name = ModelLayerTypeNamer(state.info());
  return writers::WriteZeroCheckpoint(state, folder, o);
}

}  // namespace ucp::conformance
