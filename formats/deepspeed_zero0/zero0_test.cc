// Tests of the ZeRO stage 0 format on checkpoints written here in DeepSpeed's
// stage 0 layouts (fp32: the torch optimizer's state_dict; bf16:
// FP16_UnfusedOptimizer's): detection, the param order reconstruction and
// its evidence, hostile inputs, and the round trip ZeRO-0 -> ZeRO-1 (dp 2)
// -> ZeRO-0 and -> universal, which must give back every tensor bitwise.
#include <cstring>
#include <map>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "base/fs.h"
#include "format/pickle/value.h"
#include "format/torch/tensor.h"
#include "format/torch/torch_file.h"
#include "formats/deepspeed_universal/format.h"
#include "formats/deepspeed_zero/format.h"
#include "formats/deepspeed_zero/zero_checkpoint.h"
#include "formats/deepspeed_zero/zero_state.h"
#include "formats/deepspeed_zero0/format.h"
#include "formats/deepspeed_zero0/zero0_state.h"
#include "formats/format.h"
#include "gtest/gtest.h"
#include "writers/plan.h"
#include "writers/target_options.h"
#include "testing/damage.h"
#include "testing/fixtures.h"
#include "tp/tensor_plan.h"

namespace ucp::deepspeed_zero0 {
namespace {

using pickle::Value;
using pickle::ValuePtr;
using torch::DType;
using torch::Tensor;

struct Param {
  std::string name;
  std::vector<int64_t> shape;
};

// A model: module params in module order, and the optimizer's groups as
// module indices in optimizer order (params of no group are frozen).
struct Model {
  std::vector<Param> module;
  std::vector<std::vector<int>> groups;
  std::vector<double> weight_decay;
  DType lp = DType::kFloat32;
};

Tensor Values(const std::vector<int64_t>& shape, float seed) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::string bytes(n * 4, '\0');
  for (int64_t i = 0; i < n; ++i) {
    float v = seed + 0.001f * static_cast<float>(i) + 0.0001234f * static_cast<float>(i * i % 7);
    std::memcpy(&bytes[i * 4], &v, 4);
  }
  return *Tensor::FromBytes(DType::kFloat32, shape, bytes);
}

// A Llama-like model: embed, per layer q (64x64... small), norms, head.
Model Llama(DType lp) {
  Model m;
  m.lp = lp;
  m.module = {{"model.embed_tokens.weight", {16, 8}}};
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    m.module.push_back({p + "self_attn.q_proj.weight", {8, 8}});
    m.module.push_back({p + "self_attn.o_proj.weight", {8, 8}});
    m.module.push_back({p + "mlp.up_proj.weight", {12, 8}});
    m.module.push_back({p + "mlp.down_proj.weight", {8, 12}});
    m.module.push_back({p + "input_layernorm.weight", {8}});
  }
  m.module.push_back({"model.norm.weight", {8}});
  m.module.push_back({"lm_head.weight", {16, 8}});
  // Hugging Face Trainer groups: 2-D weights decay, norms do not.
  m.groups.resize(2);
  for (int i = 0; i < static_cast<int>(m.module.size()); ++i) m.groups[m.module[i].shape.size() == 2 ? 0 : 1].push_back(i);
  m.weight_decay = {0.01, 0.0};
  return m;
}

// Writes `m` as DeepSpeed saves it at stage 0 into dir/mp_rank_00_model_states.pt.
// `mutate` may change the optimizer dict before it is written.
// `file`, `mp_world_size`: a tp rank's file of a tp > 1 model (its own
// tensors: `m`'s shapes, values shifted by `shift`); `args`: the training's.
void WriteZero0(const Model& m, const std::string& dir,
                const std::function<void(Value& optimizer, torch::TorchWriter& w)>& mutate = nullptr,
                const std::string& file = "mp_rank_00_model_states.pt", int mp_world_size = 1,
                ValuePtr args = nullptr, float shift = 0.0f) {
  ASSERT_TRUE(MakeDirs(dir).ok());
  torch::TorchWriter w;
  std::vector<Tensor> master(m.module.size());
  for (size_t i = 0; i < m.module.size(); ++i) master[i] = Values(m.module[i].shape, shift + 0.5f + static_cast<float>(i));
  ValuePtr module = Value::MakeDict(true);
  for (size_t i = 0; i < m.module.size(); ++i) {
    Tensor t = m.lp == DType::kFloat32 ? master[i] : *torch::Cast(master[i], m.lp);
    module->DictSet(Value::Str(m.module[i].name), w.AddTensor(t));
  }
  ValuePtr state = Value::MakeDict();
  std::vector<ValuePtr> groups, fp32_groups;
  int index = 0;
  for (size_t g = 0; g < m.groups.size(); ++g) {
    std::vector<ValuePtr> params, masters;
    for (int i : m.groups[g]) {
      ValuePtr s = Value::MakeDict();
      s->DictSet(Value::Str("step"), w.AddTensor(*Tensor::FromBytes(DType::kFloat32, {}, std::string("\0\0\x40\x40", 4))));
      s->DictSet(Value::Str("exp_avg"), w.AddTensor(Values(m.module[i].shape, shift + 100.0f + i)));
      s->DictSet(Value::Str("exp_avg_sq"), w.AddTensor(Values(m.module[i].shape, shift + 200.0f + i)));
      state->DictSet(Value::Int(index), s);
      params.push_back(Value::Int(index++));
      masters.push_back(w.AddTensor(master[i]));
    }
    ValuePtr group = Value::MakeDict();
    group->DictSet(Value::Str("lr"), Value::Float(0.001));
    group->DictSet(Value::Str("betas"), Value::Tuple({Value::Float(0.9), Value::Float(0.999)}));
    group->DictSet(Value::Str("eps"), Value::Float(1e-8));
    group->DictSet(Value::Str("weight_decay"), Value::Float(m.weight_decay[g]));
    group->DictSet(Value::Str("amsgrad"), Value::Bool(false));
    group->DictSet(Value::Str("params"), Value::List(params));
    groups.push_back(group);
    fp32_groups.push_back(Value::List(masters));
  }
  ValuePtr osd = Value::MakeDict();
  osd->DictSet(Value::Str("state"), state);
  osd->DictSet(Value::Str("param_groups"), Value::List(groups));
  ValuePtr optimizer = osd;
  if (m.lp != DType::kFloat32) {
    optimizer = Value::MakeDict();
    optimizer->DictSet(Value::Str("dynamic_loss_scale"), Value::Bool(false));
    optimizer->DictSet(Value::Str("cur_scale"), Value::Float(1.0));
    optimizer->DictSet(Value::Str("cur_iter"), Value::Int(3));
    optimizer->DictSet(Value::Str("optimizer_state_dict"), osd);
    optimizer->DictSet(Value::Str("fp32_groups"), Value::List(fp32_groups));
  }
  if (mutate) mutate(*optimizer, w);
  ValuePtr config = Value::MakeDict();
  config->DictSet(Value::Str("train_micro_batch_size_per_gpu"), Value::Int(2));
  config->DictSet(Value::Str("gradient_clipping"), Value::Float(1.0));
  ValuePtr zero = Value::MakeDict();
  zero->DictSet(Value::Str("stage"), Value::Int(0));
  config->DictSet(Value::Str("zero_optimization"), zero);
  ValuePtr dims = Value::MakeDict();
  dims->DictSet(Value::Str("pp_degree"), Value::Int(1));
  dims->DictSet(Value::Str("tp_degree"), Value::Int(mp_world_size));
  ValuePtr sched = Value::MakeDict();
  sched->DictSet(Value::Str("last_batch_iteration"), Value::Int(2));
  ValuePtr root = Value::MakeDict();
  root->DictSet(Value::Str("module"), module);
  root->DictSet(Value::Str("buffer_names"), Value::List({}));
  root->DictSet(Value::Str("optimizer"), optimizer);
  for (const char* k : {"param_shapes", "frozen_param_shapes", "shared_params", "frozen_param_fragments"}) {
    root->DictSet(Value::Str(k), Value::None());
  }
  root->DictSet(Value::Str("lr_scheduler"), sched);
  root->DictSet(Value::Str("data_sampler"), Value::None());
  root->DictSet(Value::Str("random_ltd"), Value::None());
  root->DictSet(Value::Str("sparse_tensor_module_names"), Value::MakeSet());
  root->DictSet(Value::Str("skipped_steps"), Value::Int(0));
  root->DictSet(Value::Str("global_steps"), Value::Int(3));
  root->DictSet(Value::Str("global_samples"), Value::Int(12));
  root->DictSet(Value::Str("dp_world_size"), Value::Int(2));
  root->DictSet(Value::Str("mp_world_size"), Value::Int(mp_world_size));
  root->DictSet(Value::Str("checkpoint_parallel_dimensions"), dims);
  root->DictSet(Value::Str("ds_config"), config);
  root->DictSet(Value::Str("ds_version"), Value::Str("0.19.5"));
  if (args) root->DictSet(Value::Str("args"), args);
  ASSERT_TRUE(w.WriteFile(JoinPath(dir, file), *root).ok());
}

// The formats these tests use, in the built-in order.
const formats::Registry& Formats() {
  static const formats::Registry* r = [] {
    auto* r = new formats::Registry();
    deepspeed_universal::Register(*r);
    Register(*r);
    deepspeed_zero::Register(*r);
    return r;
  }();
  return *r;
}

absl::StatusOr<std::unique_ptr<Zero0State>> OpenDir(const std::string& dir, const std::string& order = "") {
  Zero0Options o;
  o.order = order;
  return Zero0State::Open(dir, o);
}

// Every tensor of every param of `a` equals `b`'s, by name.
void ExpectSameState(const state::SlicedState& a, const state::SlicedState& b) {
  ASSERT_EQ(a.info().params.size(), b.info().params.size());
  for (const auto& p : a.info().params) {
    const state::ParamState* q = b.info().Find(p.name);
    ASSERT_NE(q, nullptr) << p.name;
    EXPECT_EQ(p.role, q->role) << p.name;
    EXPECT_EQ(p.group, q->group) << p.name;
    std::vector<std::string> states = {state::kLpState};
    if (p.trainable()) states = {state::kLpState, state::kFp32State, "exp_avg", "exp_avg_sq"};
    for (const std::string& s : states) {
      auto x = a.Slices(p, 0, s);
      auto y = b.Slices(*q, 0, s);
      ASSERT_TRUE(x.ok() && y.ok()) << p.name << " " << s;
      auto eq = tp::TensorPlan::BitwiseEqual((*x)[0], (*y)[0]);
      ASSERT_TRUE(eq.ok());
      EXPECT_TRUE(*eq) << p.name << " " << s;
    }
  }
}

TEST(Zero0Test, Fp32LlamaIsDetectedAndOrderedByShapes) {
  const std::string dir = JoinPath(testing::FreshTempDir("z0_fp32"), "global_step3");
  WriteZero0(Llama(DType::kFloat32), dir);
  auto detected = formats::DetectFolder(Formats(), dir);
  ASSERT_TRUE(detected.ok()) << detected.status();
  EXPECT_EQ(detected->format->name(), kName);
  auto z = OpenDir(dir);
  ASSERT_TRUE(z.ok()) << z.status();
  const state::ModelInfo& info = (*z)->info();
  ASSERT_EQ(info.params.size(), 13u);
  EXPECT_EQ(info.params[0].name, "model.embed_tokens.weight");
  EXPECT_EQ(info.params[9].name, "lm_head.weight");
  EXPECT_EQ(info.params[10].name, "model.layers.0.input_layernorm.weight");
  EXPECT_EQ(info.params[10].group, 1);
  EXPECT_EQ(info.scalar_keys, std::vector<std::string>{"step"});
  EXPECT_TRUE(absl::StrContains((*z)->evidence(), "shapes"));
  // exp_avg of the norm of layer 1 (module index 10, seed 110).
  auto s = (*z)->Slices(*info.Find("model.layers.1.input_layernorm.weight"), 0, "exp_avg");
  ASSERT_TRUE(s.ok());
  auto eq = tp::TensorPlan::BitwiseEqual((*s)[0], tp::TensorPlan::FromTensor(Values({8}, 110.0f)));
  ASSERT_TRUE(eq.ok());
  EXPECT_TRUE(*eq);
}

// The training's make_vocab_size_divisible_by (Megatron's args), or the
// command's, is recorded as the ZeRO-1/2 reader records it.
TEST(Zero0Test, RecordsTheVocabularyPaddingOfTheArgsOrTheOption) {
  const std::string dir = JoinPath(testing::FreshTempDir("z0_args"), "global_step3");
  ValuePtr args = Value::MakeDict();
  args->DictSet(Value::Str("make_vocab_size_divisible_by"), Value::Int(8));
  WriteZero0(Llama(DType::kFloat32), dir, nullptr, "mp_rank_00_model_states.pt", 1, args);
  auto z = OpenDir(dir);
  ASSERT_TRUE(z.ok()) << z.status();
  EXPECT_EQ((*z)->info().make_vocab_size_divisible_by, 8);
  Zero0Options o;
  o.make_vocab_size_divisible_by = 16;
  auto z16 = Zero0State::Open(dir, o);
  ASSERT_TRUE(z16.ok()) << z16.status();
  EXPECT_EQ((*z16)->info().make_vocab_size_divisible_by, 16);
}

// tp = 2: one file per tp rank, each with its own optimizer state_dict; the
// state holds both ranks' slices side by side, and the ranks must agree.
TEST(Zero0Test, TpRanksAreReadSideBySide) {
  const std::string dir = JoinPath(testing::FreshTempDir("z0_tp2"), "global_step3");
  const Model m = Llama(DType::kFloat32);
  WriteZero0(m, dir, nullptr, "mp_rank_00_model_states.pt", 2);
  WriteZero0(m, dir, nullptr, "mp_rank_01_model_states.pt", 2, nullptr, 1000.0f);
  auto z = OpenDir(dir);
  ASSERT_TRUE(z.ok()) << z.status();
  const state::ModelInfo& info = (*z)->info();
  EXPECT_EQ(info.source_topology.tp, 2);
  const state::ParamState* q = info.Find("model.layers.0.self_attn.q_proj.weight");
  ASSERT_NE(q, nullptr);
  ASSERT_EQ(q->tp_shapes.size(), 2u);
  auto s = (*z)->Slices(*q, 0, "exp_avg");
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->size(), 2u);
  auto eq = tp::TensorPlan::BitwiseEqual((*s)[1], tp::TensorPlan::FromTensor(Values({8, 8}, 1101.0f)));
  ASSERT_TRUE(eq.ok());
  EXPECT_TRUE(*eq);
  EXPECT_EQ((*z)->InputFiles().size(), 2u);
  // A rank whose optimizer holds other params is refused, naming its file.
  Model other = m;
  other.groups[1].pop_back();
  const std::string bad_dir = JoinPath(testing::FreshTempDir("z0_tp2_bad"), "global_step3");
  WriteZero0(m, bad_dir, nullptr, "mp_rank_00_model_states.pt", 2);
  WriteZero0(other, bad_dir, nullptr, "mp_rank_01_model_states.pt", 2);
  auto bad = OpenDir(bad_dir);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "mp_rank_01_model_states.pt")) << bad.status();
}

TEST(Zero0Test, FrozenParamsAreTheModuleParamsOfNoGroup) {
  Model m = Llama(DType::kFloat32);
  m.groups[0].erase(m.groups[0].begin());  // embed_tokens frozen
  const std::string dir = JoinPath(testing::FreshTempDir("z0_frozen"), "global_step3");
  WriteZero0(m, dir);
  auto z = OpenDir(dir);
  ASSERT_TRUE(z.ok()) << z.status();
  const state::ParamState* e = (*z)->info().Find("model.embed_tokens.weight");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->role, state::TensorRole::kFrozen);
  EXPECT_EQ((*z)->info().params[0].name, "model.layers.0.self_attn.q_proj.weight");
}

// Two same-shaped weights of which only one trains: shapes cannot tell.
Model OneOfTwoTrains(DType lp) {
  Model m;
  m.lp = lp;
  m.module = {{"a.weight", {4, 4}}, {"b.weight", {4, 4}}, {"c.bias", {4}}};
  m.groups = {{1}, {2}};
  m.weight_decay = {0.01, 0.0};
  return m;
}

TEST(Zero0Test, AmbiguousFp32OrderIsRefusedNamingTheParamsAndTheFlag) {
  const std::string dir = JoinPath(testing::FreshTempDir("z0_ambiguous"), "global_step3");
  WriteZero0(OneOfTwoTrains(DType::kFloat32), dir);
  auto z = OpenDir(dir);
  ASSERT_FALSE(z.ok());
  EXPECT_EQ(z.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string msg(z.status().message());
  EXPECT_TRUE(absl::StrContains(msg, "mp_rank_00_model_states.pt")) << msg;
  EXPECT_TRUE(absl::StrContains(msg, "'a.weight' or 'b.weight'") || absl::StrContains(msg, "'b.weight' or 'a.weight'"))
      << msg;
  EXPECT_TRUE(absl::StrContains(msg, "zero0_order=hf_trainer")) << msg;
}

TEST(Zero0Test, Bf16MastersSettleWhatShapesCannot) {
  const std::string dir = JoinPath(testing::FreshTempDir("z0_bf16"), "global_step3");
  WriteZero0(OneOfTwoTrains(DType::kBFloat16), dir);
  auto z = OpenDir(dir);
  ASSERT_TRUE(z.ok()) << z.status();
  EXPECT_EQ((*z)->info().params[0].name, "b.weight");
  EXPECT_EQ((*z)->info().Find("a.weight")->role, state::TensorRole::kFrozen);
  EXPECT_EQ((*z)->info().lp_dtype, DType::kBFloat16);
  EXPECT_TRUE(absl::StrContains((*z)->evidence(), "cast")) << (*z)->evidence();
}

TEST(Zero0Test, HfTrainerRuleSettlesDecayGroups) {
  // Two [4] params: a bias (no decay) and a 1-D weight the client decays.
  Model m;
  m.module = {{"x.weight", {4}}, {"x.bias", {4}}};
  m.groups = {{0}, {1}};
  m.weight_decay = {0.01, 0.0};
  const std::string dir = JoinPath(testing::FreshTempDir("z0_hf"), "global_step3");
  WriteZero0(m, dir);
  auto plain = OpenDir(dir);
  ASSERT_FALSE(plain.ok());
  auto z = OpenDir(dir, kOrderHfTrainer);
  ASSERT_TRUE(z.ok()) << z.status();
  EXPECT_EQ((*z)->info().Find("x.weight")->group, 0);
  EXPECT_EQ((*z)->info().Find("x.bias")->group, 1);
  EXPECT_TRUE(absl::StrContains((*z)->evidence(), "Hugging Face")) << (*z)->evidence();
}

TEST(Zero0Test, HfTrainerRuleKnowsGpt2sLayerNormNames) {
  // GPT-2's LayerNorms are named ln_1 / ln_2 / ln_f: the Trainer leaves
  // them undecayed by their type (nn.LayerNorm), which names must stand for;
  // beside them a 1-D weight it decays (LayerScale).
  Model m;
  m.module = {{"transformer.h.0.ln_1.weight", {4}},
              {"transformer.h.0.layer_scale.lambda1", {4}},
              {"transformer.h.0.ln_2.weight", {4}},
              {"transformer.ln_f.weight", {4}}};
  m.groups = {{1}, {0, 2, 3}};
  m.weight_decay = {0.01, 0.0};
  const std::string dir = JoinPath(testing::FreshTempDir("z0_hf_gpt2"), "global_step3");
  WriteZero0(m, dir);
  ASSERT_FALSE(OpenDir(dir).ok());
  auto z = OpenDir(dir, kOrderHfTrainer);
  ASSERT_TRUE(z.ok()) << z.status();
  EXPECT_EQ((*z)->info().Find("transformer.h.0.layer_scale.lambda1")->group, 0);
  EXPECT_EQ((*z)->info().Find("transformer.h.0.ln_1.weight")->group, 1);
  EXPECT_EQ((*z)->info().Find("transformer.h.0.ln_2.weight")->group, 1);
  EXPECT_EQ((*z)->info().Find("transformer.ln_f.weight")->group, 1);
}

TEST(Zero0Test, HostileOptimizerStatesAreRefusedNamingTheFile) {
  const Model m = Llama(DType::kFloat32);
  struct Case {
    const char* name;
    std::function<void(Value&, torch::TorchWriter&)> mutate;
    const char* expect;
  };
  std::vector<Case> cases = {
      {"extra",
       [](Value& o, torch::TorchWriter& w) {
         ValuePtr s = Value::MakeDict();
         s->DictSet(Value::Str("exp_avg"), w.AddTensor(Values({8}, 1.0f)));
         const_cast<Value*>(o.DictGet("state"))->DictSet(Value::Int(99), s);
       },
       "belongs to no param group"},
      {"shape",
       [](Value& o, torch::TorchWriter& w) {
         Value* s = const_cast<Value*>(o.DictGet("state")->DictGet(Value::Int(0)));
         s->DictSet(Value::Str("exp_avg_sq"), w.AddTensor(Values({16, 4}, 1.0f)));
       },
       "exp_avg_sq"},
      {"unfit",
       [](Value& o, torch::TorchWriter& w) {
         Value* s = const_cast<Value*>(o.DictGet("state")->DictGet(Value::Int(1)));
         s->DictSet(Value::Str("exp_avg"), w.AddTensor(Values({5, 5}, 1.0f)));
         s->DictSet(Value::Str("exp_avg_sq"), w.AddTensor(Values({5, 5}, 1.0f)));
       },
       "do not fit"},
  };
  for (const Case& c : cases) {
    const std::string dir = JoinPath(testing::FreshTempDir(std::string("z0_hostile_") + c.name), "global_step3");
    WriteZero0(m, dir, c.mutate);
    auto z = OpenDir(dir);
    ASSERT_FALSE(z.ok()) << c.name;
    const std::string msg(z.status().message());
    EXPECT_TRUE(absl::StrContains(msg, "mp_rank_00_model_states.pt")) << c.name << ": " << msg;
    EXPECT_TRUE(absl::StrContains(msg, c.expect)) << c.name << ": " << msg;
  }
}

TEST(Zero0Test, AParamWithoutStateIsRefused) {
  const std::string dir = JoinPath(testing::FreshTempDir("z0_nostate"), "global_step3");
  WriteZero0(Llama(DType::kFloat32), dir, [](Value& o, torch::TorchWriter&) {
    Value* st = const_cast<Value*>(o.DictGet("state"));
    ValuePtr copy = Value::MakeDict();
    for (const auto& [k, v] : st->dict_items()) {
      if (k->int_value() != 3) copy->DictSet(k, v);
    }
    o.DictSet(Value::Str("state"), copy);
  });
  auto z = OpenDir(dir);
  ASSERT_FALSE(z.ok());
  EXPECT_TRUE(absl::StrContains(z.status().message(), "optimizer param 3")) << z.status();
  EXPECT_TRUE(absl::StrContains(z.status().message(), "mp_rank_00_model_states.pt")) << z.status();
}

TEST(Zero0Test, AZeroCheckpointWithoutOptimizerFilesIsNotStageZero) {
  const std::string dir = JoinPath(testing::FreshTempDir("z0_zero1"), "global_step3");
  ASSERT_TRUE(MakeDirs(dir).ok());
  torch::TorchWriter w;
  ValuePtr root = Value::MakeDict();
  root->DictSet(Value::Str("module"), Value::MakeDict(true));
  root->DictSet(Value::Str("optimizer"), Value::None());
  root->DictSet(Value::Str("param_shapes"), Value::List({Value::MakeDict(true)}));
  ASSERT_TRUE(w.WriteFile(JoinPath(dir, "mp_rank_00_model_states.pt"), *root).ok());
  const formats::SourceFormat* f = Formats().FindSource(kName);
  ASSERT_NE(f, nullptr);
  formats::CheckpointFolder folder;
  folder.dir = dir;
  folder.names = {"mp_rank_00_model_states.pt"};
  EXPECT_FALSE(f->Detect(folder));
  folder.names.push_back("zero_pp_rank_0_mp_rank_00_optim_states.pt");
  EXPECT_FALSE(f->Detect(folder));
}

// Opens `dir` with the format that detects it.
absl::StatusOr<formats::OpenedSource> OpenAny(const std::string& dir) {
  auto detected = formats::DetectFolder(Formats(), dir);
  if (!detected.ok()) return detected.status();
  return detected->format->Open(detected->folder, formats::SourceOptions(), nullptr);
}

// A truncated model-states file with nothing beside it: the error names that
// file and says it is damaged (not that optimizer files are missing).
TEST(Zero0Test, ATruncatedModelStatesFileIsNamed) {
  const std::string dir = JoinPath(testing::FreshTempDir("z0_truncated"), "global_step3");
  WriteZero0(Llama(DType::kFloat32), dir);
  const std::string path = JoinPath(dir, "mp_rank_00_model_states.pt");
  for (int64_t keep : {0, 100}) {
    ASSERT_EQ(truncate(path.c_str(), keep), 0);
    const absl::Status s = OpenAny(dir).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_NE(std::string(s.message()).find(path), std::string::npos) << s;
  }
}

// Writes the universal checkpoint of `opened` into `out`.
absl::Status WriteUniversal(const formats::OpenedSource& opened, const std::string& out) {
  writers::UniversalWriteOptions uo;
  auto plan = Formats().FindTarget("deepspeed_universal")->PlanUniversal(*opened.state, uo);
  if (!plan.ok()) return plan.status();
  return writers::RunPlan(**plan, out, writers::RunOptions()).status();
}

// A ZeRO-0 model-states file holds the whole checkpoint (the module and the
// optimizer). Opened under a command's torch::OwedCrcChecks, its records are
// checked beside the units instead of read whole before them; a damaged one
// still stops the write with the file and the record named, and nothing is
// committed. Opened with no command owing the checks (inspect, verify), the
// file is refused at open.
TEST(Zero0Test, ADamagedRecordIsCheckedBesideTheUnits) {
  const std::string base = testing::FreshTempDir("z0_owed");
  const std::string dir = JoinPath(base, "global_step3");
  WriteZero0(Llama(DType::kFloat32), dir);
  const std::string path = JoinPath(dir, "mp_rank_00_model_states.pt");
  ASSERT_TRUE(testing::FlipByteInTensor(path, [](const Value& root) -> const Value* {
                const Value* o = root.DictGet("optimizer");
                const Value* state = o == nullptr ? nullptr : o->DictGet("state");
                const Value* first = state == nullptr ? nullptr : state->DictGet(Value::Int(0));
                return first == nullptr ? nullptr : first->DictGet("exp_avg");
              }).ok());
  const absl::Status eager = OpenAny(dir).status();
  EXPECT_EQ(eager.code(), absl::StatusCode::kDataLoss) << eager;
  EXPECT_TRUE(absl::StartsWith(eager.message(), path + ": record '")) << eager;

  const std::string out = JoinPath(base, "out/global_step3_universal");
  torch::OwedCrcChecks owed;
  auto opened = OpenAny(dir);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(owed.files(), 1u);
  EXPECT_FALSE(owed.checked());
  const absl::Status written = WriteUniversal(*opened, out);
  EXPECT_EQ(written.code(), absl::StatusCode::kDataLoss) << written;
  EXPECT_TRUE(absl::StartsWith(written.message(), path + ": record '")) << written;
  EXPECT_TRUE(absl::StrContains(written.message(), "CRC-32 mismatch")) << written;
  EXPECT_TRUE(owed.checked());
  EXPECT_FALSE(PathExists(out));
}

// Writes `src` with training-state target `target` at dp into `out`.
absl::Status WriteTraining(const std::string& src, const std::string& target, int dp, int zero_stage,
                           const std::string& out) {
  auto opened = OpenAny(src);
  if (!opened.ok()) return opened.status();
  writers::ZeroWriteOptions o;
  o.target.dp = dp;
  o.zero_stage = zero_stage;
  auto plan = Formats().FindTarget(target)->PlanTrainingState(*opened->state, o, nullptr);
  if (!plan.ok()) return plan.status();
  return writers::RunPlan(**plan, out, writers::ZeroRunOptions(o)).status();
}

void RoundTrip(DType lp, const std::string& name) {
  const std::string base = testing::FreshTempDir(name);
  const std::string src = JoinPath(base, "z0/global_step3");
  Model m = Llama(lp);
  m.groups[0].erase(m.groups[0].begin());  // a frozen embedding too
  WriteZero0(m, src);
  // ZeRO-0 -> ZeRO-1 at dp 2 -> ZeRO-0 at dp 3.
  const std::string z1 = JoinPath(base, "z1/global_step3"), back = JoinPath(base, "back/global_step3");
  ASSERT_TRUE(WriteTraining(src, "deepspeed_zero", 2, 1, z1).ok());
  auto z1_source = OpenAny(z1);
  ASSERT_TRUE(z1_source.ok()) << z1_source.status();
  EXPECT_EQ(z1_source->format->name(), "deepspeed_zero");
  ASSERT_TRUE(WriteTraining(z1, kName, 3, 0, back).ok());
  auto a = OpenDir(src);
  auto b = OpenDir(back);
  ASSERT_TRUE(a.ok() && b.ok()) << (a.ok() ? b.status() : a.status());
  ExpectSameState(**a, **b);
  EXPECT_EQ((*b)->info().source_topology.dp, 3);
  // ZeRO-0 -> universal -> ZeRO-0.
  const std::string uni = JoinPath(base, "uni/global_step3_universal"), uback = JoinPath(base, "uback/global_step3");
  {
    auto opened = OpenAny(src);
    ASSERT_TRUE(opened.ok()) << opened.status();
    const absl::Status written = WriteUniversal(*opened, uni);
    ASSERT_TRUE(written.ok()) << written;
  }
  auto u = WriteTraining(uni, kName, 1, 0, uback);
  ASSERT_TRUE(u.ok()) << u;
  auto d = OpenDir(uback);
  ASSERT_TRUE(d.ok()) << d.status();
  ExpectSameState(**a, **d);
}

TEST(Zero0Test, Fp32RoundTripsThroughZero1AndUniversalBitwise) { RoundTrip(DType::kFloat32, "z0_rt_fp32"); }
TEST(Zero0Test, Bf16RoundTripsThroughZero1AndUniversalBitwise) { RoundTrip(DType::kBFloat16, "z0_rt_bf16"); }

// A Hugging Face model saved at tp 1 whose intermediate size (13) tp 2 does
// not divide is written at tp 2 in AutoTP's widths (7 + 6 rows of up_proj,
// columns of down_proj): its names are hf-llama's, a preset DeepSpeed splits
// with AutoTP only (Preset.tp_split_by_autotp, carried by each rule as
// MergeRule.autotp_widths). Without that property the write is refused as a
// Megatron-style layout (dim 0 of size 13 is not divisible by 2).
TEST(Zero0Test, UnevenIntermediateOfAnHfPresetIsWrittenInAutoTpWidths) {
  const std::string base = testing::FreshTempDir("z0_autotp_widths");
  const std::string src = JoinPath(base, "z0/global_step3"), out = JoinPath(base, "tp2/global_step3");
  Model m = Llama(DType::kFloat32);
  for (Param& p : m.module) {
    if (absl::EndsWith(p.name, "mlp.up_proj.weight")) p.shape = {13, 8};
    if (absl::EndsWith(p.name, "mlp.down_proj.weight")) p.shape = {8, 13};
  }
  WriteZero0(m, src);
  auto opened = OpenAny(src);
  ASSERT_TRUE(opened.ok()) << opened.status();
  writers::ZeroWriteOptions o;
  o.target.tp = 2;
  o.zero_stage = 1;
  auto plan = Formats().FindTarget("deepspeed_zero")->PlanTrainingState(*opened->state, o, nullptr);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(writers::RunPlan(**plan, out, writers::ZeroRunOptions(o)).ok());
  auto ckpt = deepspeed_zero::ZeroCheckpoint::Open(out);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  auto back = deepspeed_zero::ZeroSlicedState::Make(std::move(*ckpt), deepspeed_zero::ZeroReadOptions());
  ASSERT_TRUE(back.ok()) << back.status();
  const state::ParamState* up = (*back)->info().Find("model.layers.0.mlp.up_proj.weight");
  const state::ParamState* down = (*back)->info().Find("model.layers.1.mlp.down_proj.weight");
  ASSERT_TRUE(up != nullptr && down != nullptr);
  auto up_slices = (*back)->Slices(*up, 0, state::kFp32State);
  auto down_slices = (*back)->Slices(*down, 0, state::kFp32State);
  ASSERT_TRUE(up_slices.ok() && down_slices.ok());
  ASSERT_EQ(up_slices->size(), 2u);
  EXPECT_EQ((*up_slices)[0].shape(), (std::vector<int64_t>{7, 8}));
  EXPECT_EQ((*up_slices)[1].shape(), (std::vector<int64_t>{6, 8}));
  EXPECT_EQ((*down_slices)[0].shape(), (std::vector<int64_t>{8, 7}));
  EXPECT_EQ((*down_slices)[1].shape(), (std::vector<int64_t>{8, 6}));
  // Merged back, every tensor is the tp 1 source's.
  auto a = OpenDir(src);
  ASSERT_TRUE(a.ok()) << a.status();
  for (const std::string& s : {std::string(state::kFp32State), std::string("exp_avg")}) {
    auto whole = (*a)->Slices(*(*a)->info().Find(up->name), 0, s);
    auto parts = (*back)->Slices(*up, 0, s);
    ASSERT_TRUE(whole.ok() && parts.ok());
    auto merged = tp::TensorPlan::Cat(*parts, 0);
    ASSERT_TRUE(merged.ok());
    auto eq = tp::TensorPlan::BitwiseEqual((*whole)[0], *merged);
    ASSERT_TRUE(eq.ok());
    EXPECT_TRUE(*eq) << s;
  }
}

}  // namespace
}  // namespace ucp::deepspeed_zero0
