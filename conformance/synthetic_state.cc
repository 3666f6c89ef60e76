#include "conformance/synthetic_state.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "conformance/spec_rules.h"
#include "deepspeed/engine_defaults.h"
#include "deepspeed/layout_math.h"
#include "ops/training_state.h"
#include "rules/presets.h"
#include "format/pickle/accessors.h"
#include "format/torch/torch_file.h"
#include "tp/merge.h"

namespace ucp::conformance {
namespace {

using state::FileValue;
using state::ParamState;
using state::TensorRole;
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

}  // namespace

namespace synthetic {

absl::StatusOr<torch::Tensor> Values(const ModelParam& p, uint64_t seed, const std::string& state) {
  if (state == state::kFp32State) return MakeValues(p, seed, Salt::kFp32);
  if (state == "exp_avg") return MakeValues(p, seed, Salt::kExpAvg);
  if (state == "exp_avg_sq") return MakeValues(p, seed, Salt::kExpAvgSq);
  if (state == state::kLpState) return MakeValues(p, seed, Salt::kLp);
  return absl::InvalidArgumentError(absl::StrCat("no synthetic state '", state, "'"));
}

torch::Tensor Scalar(float v) { return ScalarTensor(v); }

absl::StatusOr<state::FileValue> BakeTree(torch::TorchWriter& w, const pickle::Value& root,
                                              const std::string& stem) {
  return deepspeed::BakeTree(w, root, stem);
}

pickle::ValuePtr LossScaler(bool fp16, int64_t iterations) { return deepspeed::DefaultLossScaler(fp16, iterations); }

pickle::ValuePtr AdamBetas() { return deepspeed::AdamBetas(); }

}  // namespace synthetic

absl::StatusOr<state::OptimizerKind> ParseOptimizerLayout(const std::string& name) {
  if (name == "zero" || name.empty()) return state::OptimizerKind::kZero;
  if (name == "bf16") return state::OptimizerKind::kBf16;
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
      // AutoTP pads no vocabulary (its lm_head is cut in AutoTP's widths).
      if (spec.make_vocab_size_divisible_by() <= 0 && !spec.autotp()) {
        return err("vocab params need make_vocab_size_divisible_by > 0");
      }
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
    } else if (role == TensorRole::kTied) {
      // A tied alias of a plain module: another name of an earlier param.
      const ModelParam* owner = nullptr;
      for (const ModelParam& q : spec.param()) {
        if (q.name() == p.tied_key()) owner = &q;
        if (&q == &p) break;
      }
      if (owner == nullptr || owner->role() == "tied" || owner->role() == "buffer" ||
          std::vector<int64_t>(owner->shape().begin(), owner->shape().end()) != shape || p.layer() != -1) {
        return err(absl::StrCat("tied alias '", n, "' needs tied_key = an earlier param or frozen param of its shape"));
      }
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
                                                                               state::OptimizerKind kind,
                                                                               const SyntheticVersion& version) {
  UCP_ASSIGN_OR_RETURN(deepspeed::DsVersion v, deepspeed::ParseDsVersion(version.ds_version),
                       _.Prepend("synthetic model: "));
  // 0.19.6 is master edaa72212, whose ZeRO 1/2 files are 0.19.5's (its
  // AutoTP metadata differs: AutoTpCheckpointInfo).
  if (v < deepspeed::DsVersion{0, 12, 0} || deepspeed::DsVersion{0, 19, 6} < v) {
    return absl::InvalidArgumentError(
        absl::StrCat("synthetic model: DeepSpeed ", version.ds_version, " (the layouts of 0.12 to 0.19.6 only)"));
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
  UCP_ASSIGN_OR_RETURN(state::OptimizerKind kind, ParseOptimizerLayout(c.optimizer_layout()));
  SyntheticVersion v;
  if (!c.ds_version().empty()) v.ds_version = c.ds_version();
  v.numpy2 = c.numpy2();
  v.zero_stage_call = SourceZeroStage(c) == 0;
  return Make(c.model(), c.seed(), ModelZeroStage(c), kind, v);
}

int SourceZeroStage(const GoldenCase& c) {
  if (c.has_source_zero_stage()) return c.source_zero_stage();
  return c.zero_stage() > 0 ? c.zero_stage() : 1;
}

int TargetZeroStage(const GoldenCase& c) {
  return c.has_target_zero_stage() ? c.target_zero_stage() : SourceZeroStage(c);
}

int ModelZeroStage(const GoldenCase& c) {
  const int s = SourceZeroStage(c);
  if (s == 1 || s == 2) return c.optimizer_layout() == "bf16" ? 1 : s;
  return c.optimizer_layout() == "bf16" ? 1 : 2;
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

absl::StatusOr<state::ModelInfo> ModelInfoFromSpec(const ModelSpec& spec, int zero_stage,
                                                       state::OptimizerKind kind) {
  UCP_RETURN_IF_ERROR(ValidateModelSpec(spec));
  state::ModelInfo info;
  info.zero_stage = zero_stage;
  info.optimizer_kind = kind;
  UCP_ASSIGN_OR_RETURN(torch::DType lp_dtype, torch::ParseDType(spec.lp_dtype().empty() ? "fp32" : spec.lp_dtype()));
  const bool bf16 = kind == state::OptimizerKind::kBf16;
  if (bf16 && lp_dtype != torch::DType::kBFloat16) {
    return absl::InvalidArgumentError("the bf16 optimizer (BF16_Optimizer) holds bf16 weights: lp_dtype must be bf16");
  }
  // bf16 weights under DeepSpeed's ZeRO optimizer: stage 2 (and the ZeRO-3
  // saves made from this model); at stage 1 DeepSpeed may pick BF16_Optimizer.
  if (!bf16 && lp_dtype == torch::DType::kBFloat16 && zero_stage != 2) {
    return absl::InvalidArgumentError(
        "bf16 weights at ZeRO stage 1 are saved by the bf16 optimizer: optimizer_layout must be bf16 (or stage 2)");
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
  // engine.py _get_zero_ckpt_prefix: bf16_ for every bf16 job, whatever the optimizer.
  info.bf16_file_prefix = lp_dtype == torch::DType::kBFloat16;
  info.original_vocab_size = spec.original_vocab_size();
  info.make_vocab_size_divisible_by = spec.make_vocab_size_divisible_by();
  info.partition_method = spec.partition_method();
  info.autotp = spec.autotp();
  info.source_topology = state::Topology{1, 1, 1};

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
    if (s.role == TensorRole::kTied) {
      s.alias_of = p.tied_key();
    } else {
      s.tied_key = p.tied_key();
    }
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
  UCP_RETURN_IF_ERROR(deepspeed::ParseDsVersion(ds_version).status());
  const torch::DType lp_dtype = info_.lp_dtype;

  // Tensors.
  for (const ModelParam& p : spec.param()) {
    auto& t = tensors_[p.name()];
    UCP_ASSIGN_OR_RETURN(TensorRole role, ParseRole(p.role()));
    if (role == TensorRole::kTrainable) {
      UCP_ASSIGN_OR_RETURN(t[state::kFp32State], MakeValues(p, seed_, Salt::kFp32));
      UCP_ASSIGN_OR_RETURN(t["exp_avg"], MakeValues(p, seed_, Salt::kExpAvg));
      UCP_ASSIGN_OR_RETURN(t["exp_avg_sq"], MakeValues(p, seed_, Salt::kExpAvgSq));
    } else if (role != TensorRole::kTied) {
      UCP_ASSIGN_OR_RETURN(torch::Tensor v, MakeValues(p, seed_, Salt::kLp));
      UCP_ASSIGN_OR_RETURN(t[state::kLpState], torch::Cast(v, lp_dtype));
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
    UCP_ASSIGN_OR_RETURN(steps_value_, deepspeed::BakeTree(w, *Value::List(steps), "steps"));
  }

  // The optimizer state besides partitions, and the model states
  // (engine.py:_save_checkpoint's keys), as DeepSpeed's defaults for the
  // model (deepspeed/engine_defaults.h), then the client state.
  deepspeed::EngineDefaults d;
  d.ds_version = ds_version;
  d.global_steps = iterations;
  d.micro_batch = 1 + static_cast<int64_t>(seed_ % 3);
  d.train_batch_size = spec.train_batch_size();
  d.zero_stage_encoding = seed_ % 2 == 0 || version_.zero_stage_call ? pickle::EnumEncoding::kCall
                                                                      : pickle::EnumEncoding::kGetattr;
  d.client_state = [this](torch::TorchWriter& w, Value& r) { return AddClientState(w, r); };
  UCP_ASSIGN_OR_RETURN(common_, deepspeed::DefaultOptimizerCommon(info_, d));
  UCP_ASSIGN_OR_RETURN(root_, deepspeed::DefaultModelStatesRoot(info_, d));
  return absl::OkStatus();
}

// The client state of a GPT-NeoX / Megatron-DeepSpeed job: iteration, args,
// rng states, universal_checkpoint_info.
absl::Status SyntheticModelState::AddClientState(torch::TorchWriter& w, Value& root) const {
  const ModelSpec& spec = spec_;
  const int64_t iterations = 1 + static_cast<int64_t>(seed_ % 97);
  Value* r = &root;
  // Tied aliases of a plain module (engine._get_shared_params: alias -> owner).
  {
    ValuePtr shared = Value::MakeDict();
    for (const ModelParam& p : spec.param()) {
      if (p.role() == "tied") shared->DictSet(Value::Str(p.name()), Value::Str(p.tied_key()));
    }
    r->DictSet(Value::Str("shared_params"), shared);
  }
  // AutoTP training: the job's ds_config says so, and engine.py's
  // _save_checkpoint puts AutoTP's universal_checkpoint_info after the
  // engine's keys (before any client state).
  if (spec.autotp()) {
    ValuePtr config = r->DictGetPtr("ds_config");
    if (config == nullptr || !config->is(pickle::Kind::kDict)) {
      return absl::InternalError("synthetic model: no ds_config dict");
    }
    ValuePtr tp = Value::MakeDict();
    tp->DictSet(Value::Str("autotp_size"), Value::Int(std::max(1, spec.autotp_size())));
    config->DictSet(Value::Str("tensor_parallel"), tp);
    UCP_ASSIGN_OR_RETURN(ValuePtr uc, AutoTpCheckpointInfo(spec, version_.ds_version, spec.autotp_size()));
    if (uc != nullptr) r->DictSet(Value::Str("universal_checkpoint_info"), uc);
  }
  // The Hugging Face Trainer saves no client state (engine.save_checkpoint
  // without client_state).
  if (absl::StartsWith(spec.style(), "hf-")) return absl::OkStatus();
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
  return absl::OkStatus();
}

absl::StatusOr<torch::Tensor> SyntheticModelState::Tensor(const std::string& name, const std::string& state) const {
  if (const state::ParamState* p = info_.Find(name); p != nullptr && p->role == TensorRole::kTied) {
    if (state != state::kLpState) {
      return absl::NotFoundError(absl::StrCat("synthetic tied alias '", name, "' has only its owner's lp weight"));
    }
    const state::ParamState* owner = info_.Find(p->alias_of);
    if (owner == nullptr) return absl::NotFoundError(absl::StrCat("tied alias '", name, "': no owner"));
    if (!owner->trainable()) return Tensor(owner->name, state);
    UCP_ASSIGN_OR_RETURN(torch::Tensor fp32, Tensor(owner->name, state::kFp32State));
    return torch::Cast(fp32, info_.lp_dtype);
  }
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return absl::NotFoundError(absl::StrCat("synthetic model has no param '", name, "'"));
  auto s = it->second.find(state);
  if (s == it->second.end()) {
    return absl::NotFoundError(absl::StrCat("synthetic param '", name, "' has no state '", state,
                                            state == state::kLpState
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

rules::LayerTypeNamer ModelLayerTypeNamer(const state::ModelInfo& info) {
  std::vector<std::string> names;
  for (const auto& p : info.params) names.push_back(p.name);
  return rules::LayerTypeNamerFor(rules::DetectPreset(names).value_or(""));
}

absl::StatusOr<ops::WrittenCheckpoint> SaveZero(const state::ModelState& state, const std::string& folder,
                                                 const state::Topology& topology, int num_threads) {
  writers::ZeroWriteOptions o;
  o.target = topology;
  o.num_threads = num_threads;
  o.layer_type_name = ModelLayerTypeNamer(state.info());
  return ops::WriteTrainingState(state, folder, o);
}

}  // namespace ucp::conformance
