// The synthetic AutoTP layout (synthetic_state.h with spec.autotp, and
// spec_rules.h AutoTpCheckpointInfo) against what real DeepSpeed wrote.
//
// The expected values below were printed (Python repr) from the model-states
// files of real AutoTP runs, not computed by ucp: realds family `autotp`
// (realds/worker/families/autotp.py) in the sid root (torch 2.14,
// transformers 5.12), tp 2, dp 1, ZeRO-1, fp32, one decoder layer, hidden 32,
// 4 heads (q/k/v/o 32 x 32), on DeepSpeed master edaa72212 (0.19.6: Llama
// with vocab and intermediate 65; Phi-3 with `--arch phi3`, its
// partition_config cutting only gate_up_proj and down_proj, intermediate 65),
// 0.19.5 (Llama, vocab 64, intermediate 65) and 0.18.9 (the same):
//   sd = torch.load(".../mp_rank_0R_model_states.pt"); print(list(sd)),
//   sd["ds_config"]["tensor_parallel"], sd.get("universal_checkpoint_info"),
//   {k: tuple(v.shape) for k, v in sd["module"].items()}
// (the job also saved the realds client state `iteration`, which a Hugging
// Face Trainer-style synthetic job does not).
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/fs.h"
#include "conformance/spec_rules.h"
#include "conformance/synthetic_state.h"
#include "format/torch/torch_file.h"
#include "gtest/gtest.h"
#include "testing/fixtures.h"

namespace ucp::conformance {
namespace {

using pickle::Value;

MergeRule R(MergeKind kind) {
  MergeRule r;
  r.set_kind(kind);
  r.set_autotp_widths(true);
  return r;
}

// The real runs' Llama (phi3 = false) or Phi-3, in transformers' module order.
ModelSpec RealRunModel(bool phi3, int64_t vocab, int64_t inter, bool vocab_rows) {
  ModelSpec spec;
  spec.set_style("hf-llama");
  spec.set_preset("hf-llama");
  spec.set_rules_source(kNoFlagsSource);
  spec.set_lp_dtype("fp32");
  spec.set_autotp(true);
  spec.set_autotp_size(2);
  spec.set_original_vocab_size(vocab);
  spec.set_make_vocab_size_divisible_by(0);
  spec.set_hidden_size(32);
  spec.set_num_groups(1);
  auto add = [&](const std::string& name, std::vector<int64_t> shape, MergeRule rule) {
    ModelParam* p = spec.add_param();
    p->set_name(name);
    p->set_local_name(name);
    p->set_layer(-1);
    for (int64_t x : shape) p->add_shape(x);
    *p->mutable_rule() = rule;
    p->set_role("trainable");
    p->set_group(0);
  };
  const std::string l = "model.layers.0.";
  add("model.embed_tokens.weight", {vocab, 32}, R(REPLICATED));
  if (phi3) {
    add(l + "self_attn.o_proj.weight", {32, 32}, R(REPLICATED));
    add(l + "self_attn.qkv_proj.weight", {96, 32}, R(REPLICATED));
    MergeRule fused = R(SUB_PARAMS);
    SubParamShape* s = fused.mutable_sub_param_shape();
    s->set_partition_dim(0);
    s->add_dim()->add_size(inter);
    s->mutable_dim(0)->add_size(inter);
    s->add_dim()->add_size(-1);
    add(l + "mlp.gate_up_proj.weight", {2 * inter, 32}, fused);
  } else {
    for (const char* p : {"q_proj", "k_proj", "v_proj"}) add(l + "self_attn." + p + ".weight", {32, 32}, R(COLUMN));
    add(l + "self_attn.o_proj.weight", {32, 32}, R(ROW));
    add(l + "mlp.gate_proj.weight", {inter, 32}, R(COLUMN));
    add(l + "mlp.up_proj.weight", {inter, 32}, R(COLUMN));
  }
  add(l + "mlp.down_proj.weight", {32, inter}, R(ROW));
  add(l + "input_layernorm.weight", {32}, R(REPLICATED));
  add(l + "post_attention_layernorm.weight", {32}, R(REPLICATED));
  add("model.norm.weight", {32}, R(REPLICATED));
  add("lm_head.weight", {vocab, 32}, R(phi3 || !vocab_rows ? REPLICATED : VOCAB));
  return spec;
}

std::string Info(const ModelSpec& spec, const std::string& version) {
  auto uc = AutoTpCheckpointInfo(spec, version, 2);
  if (!uc.ok()) return uc.status().ToString();
  return *uc == nullptr ? "None" : PyRepr(**uc);
}

TEST(AutoTpLayoutTest, CheckpointInfoIsWhatEachVersionWrote) {
  EXPECT_EQ(Info(RealRunModel(false, 65, 65, true), "0.19.6"),
            "{'universal_checkpoint_version': 0.4, 'parameter_with_row_parallelism_patterns': "
            "['^model\\\\.layers\\\\.0\\\\.mlp\\\\.down_proj\\\\.weight$', "
            "'^model\\\\.layers\\\\.0\\\\.self_attn\\\\.o_proj\\\\.weight$'], 'tp_replicated_parameter_patterns': "
            "['^model\\\\.embed_tokens\\\\.weight$', '^model\\\\.layers\\\\.0\\\\.input_layernorm\\\\.weight$', "
            "'^model\\\\.layers\\\\.0\\\\.post_attention_layernorm\\\\.weight$', '^model\\\\.norm\\\\.weight$'], "
            "'vocabulary_parameter_patterns': ['^lm_head\\\\.weight$'], 'parameter_with_sub_params': [], "
            "'autotp_unsupported_parameter_patterns': {}, 'original_vocab_size': 65}");
  EXPECT_EQ(Info(RealRunModel(true, 65, 65, false), "0.19.6"),
            "{'universal_checkpoint_version': 0.4, 'parameter_with_row_parallelism_patterns': "
            "['^model\\\\.layers\\\\.0\\\\.mlp\\\\.down_proj\\\\.weight$'], 'tp_replicated_parameter_patterns': "
            "['^lm_head\\\\.weight$', '^model\\\\.embed_tokens\\\\.weight$', "
            "'^model\\\\.layers\\\\.0\\\\.input_layernorm\\\\.weight$', "
            "'^model\\\\.layers\\\\.0\\\\.post_attention_layernorm\\\\.weight$', "
            "'^model\\\\.layers\\\\.0\\\\.self_attn\\\\.o_proj\\\\.weight$', "
            "'^model\\\\.layers\\\\.0\\\\.self_attn\\\\.qkv_proj\\\\.weight$', '^model\\\\.norm\\\\.weight$'], "
            "'vocabulary_parameter_patterns': [], 'parameter_with_sub_params': [{'patterns': "
            "['^model\\\\.layers\\\\.0\\\\.mlp\\\\.gate_up_proj\\\\.weight$'], 'shape': [(65, 65), -1], "
            "'partition_dim': 0}], 'autotp_unsupported_parameter_patterns': {}, 'sub_param_shard_widths': "
            "{'^model\\\\.layers\\\\.0\\\\.mlp\\\\.gate_up_proj\\\\.weight$': [[33, 32], [33, 32]]}}");
  EXPECT_EQ(Info(RealRunModel(false, 64, 65, true), "0.19.5"),
            "{'universal_checkpoint_version': 0.3, 'parameter_with_row_parallelism_patterns': "
            "['^model\\\\.layers\\\\.0\\\\.mlp\\\\.down_proj\\\\.weight$', "
            "'^model\\\\.layers\\\\.0\\\\.self_attn\\\\.o_proj\\\\.weight$'], 'tp_replicated_parameter_patterns': "
            "['^model\\\\.embed_tokens\\\\.weight$', '^model\\\\.layers\\\\.0\\\\.input_layernorm\\\\.weight$', "
            "'^model\\\\.layers\\\\.0\\\\.post_attention_layernorm\\\\.weight$', '^model\\\\.norm\\\\.weight$'], "
            "'vocabulary_parameter_patterns': ['^lm_head\\\\.weight$'], 'parameter_with_sub_params': [], "
            "'original_vocab_size': 64}");
  EXPECT_EQ(Info(RealRunModel(false, 64, 65, false), "0.18.9"), "None");
}

// save(M, T) of the real runs' models at tp 2: the model states' keys, the
// job's tensor_parallel, AutoTP's metadata, and every module tensor's shape
// on each tp rank, as the real runs saved them.
TEST(AutoTpLayoutTest, SaveAtTp2IsLaidOutAsTheRealRuns) {
  struct Run {
    const char* what;
    ModelSpec spec;
    std::string version;
    std::vector<std::string> shapes;  // per tp rank: "name (rows, cols)", module order
  };
  const std::string l = "model.layers.0.";
  const std::vector<Run> runs = {
      {"master Llama, vocab and intermediate 65", RealRunModel(false, 65, 65, true), "0.19.6",
       {"{'model.embed_tokens.weight': (65, 32), 'model.layers.0.self_attn.q_proj.weight': (16, 32), "
        "'model.layers.0.self_attn.k_proj.weight': (16, 32), 'model.layers.0.self_attn.v_proj.weight': (16, 32), "
        "'model.layers.0.self_attn.o_proj.weight': (32, 16), 'model.layers.0.mlp.gate_proj.weight': (33, 32), "
        "'model.layers.0.mlp.up_proj.weight': (33, 32), 'model.layers.0.mlp.down_proj.weight': (32, 33), "
        "'model.layers.0.input_layernorm.weight': (32,), 'model.layers.0.post_attention_layernorm.weight': (32,), "
        "'model.norm.weight': (32,), 'lm_head.weight': (33, 32)}",
        "{'model.embed_tokens.weight': (65, 32), 'model.layers.0.self_attn.q_proj.weight': (16, 32), "
        "'model.layers.0.self_attn.k_proj.weight': (16, 32), 'model.layers.0.self_attn.v_proj.weight': (16, 32), "
        "'model.layers.0.self_attn.o_proj.weight': (32, 16), 'model.layers.0.mlp.gate_proj.weight': (32, 32), "
        "'model.layers.0.mlp.up_proj.weight': (32, 32), 'model.layers.0.mlp.down_proj.weight': (32, 32), "
        "'model.layers.0.input_layernorm.weight': (32,), 'model.layers.0.post_attention_layernorm.weight': (32,), "
        "'model.norm.weight': (32,), 'lm_head.weight': (32, 32)}"}},
      {"master Phi-3, intermediate 65", RealRunModel(true, 65, 65, false), "0.19.6",
       {"{'model.embed_tokens.weight': (65, 32), 'model.layers.0.self_attn.o_proj.weight': (32, 32), "
        "'model.layers.0.self_attn.qkv_proj.weight': (96, 32), 'model.layers.0.mlp.gate_up_proj.weight': (66, 32), "
        "'model.layers.0.mlp.down_proj.weight': (32, 33), 'model.layers.0.input_layernorm.weight': (32,), "
        "'model.layers.0.post_attention_layernorm.weight': (32,), 'model.norm.weight': (32,), "
        "'lm_head.weight': (65, 32)}",
        "{'model.embed_tokens.weight': (65, 32), 'model.layers.0.self_attn.o_proj.weight': (32, 32), "
        "'model.layers.0.self_attn.qkv_proj.weight': (96, 32), 'model.layers.0.mlp.gate_up_proj.weight': (64, 32), "
        "'model.layers.0.mlp.down_proj.weight': (32, 32), 'model.layers.0.input_layernorm.weight': (32,), "
        "'model.layers.0.post_attention_layernorm.weight': (32,), 'model.norm.weight': (32,), "
        "'lm_head.weight': (65, 32)}"}},
      {"0.18.9 Llama, vocab 64, intermediate 65 (lm_head whole)", RealRunModel(false, 64, 65, false), "0.18.9",
       {"{'model.embed_tokens.weight': (64, 32), 'model.layers.0.self_attn.q_proj.weight': (16, 32), "
        "'model.layers.0.self_attn.k_proj.weight': (16, 32), 'model.layers.0.self_attn.v_proj.weight': (16, 32), "
        "'model.layers.0.self_attn.o_proj.weight': (32, 16), 'model.layers.0.mlp.gate_proj.weight': (33, 32), "
        "'model.layers.0.mlp.up_proj.weight': (33, 32), 'model.layers.0.mlp.down_proj.weight': (32, 33), "
        "'model.layers.0.input_layernorm.weight': (32,), 'model.layers.0.post_attention_layernorm.weight': (32,), "
        "'model.norm.weight': (32,), 'lm_head.weight': (64, 32)}",
        "{'model.embed_tokens.weight': (64, 32), 'model.layers.0.self_attn.q_proj.weight': (16, 32), "
        "'model.layers.0.self_attn.k_proj.weight': (16, 32), 'model.layers.0.self_attn.v_proj.weight': (16, 32), "
        "'model.layers.0.self_attn.o_proj.weight': (32, 16), 'model.layers.0.mlp.gate_proj.weight': (32, 32), "
        "'model.layers.0.mlp.up_proj.weight': (32, 32), 'model.layers.0.mlp.down_proj.weight': (32, 32), "
        "'model.layers.0.input_layernorm.weight': (32,), 'model.layers.0.post_attention_layernorm.weight': (32,), "
        "'model.norm.weight': (32,), 'lm_head.weight': (64, 32)}"}},
  };
  // 0.19.5 / master: ..., 'ds_config', 'ds_version', 'universal_checkpoint_info' (then the client state);
  // 0.18.9: no checkpoint_parallel_dimensions, no universal_checkpoint_info.
  const std::string keys_0195 =
      "['module', 'buffer_names', 'optimizer', 'param_shapes', 'frozen_param_shapes', 'shared_params', "
      "'frozen_param_fragments', 'lr_scheduler', 'data_sampler', 'random_ltd', 'sparse_tensor_module_names', "
      "'skipped_steps', 'global_steps', 'global_samples', 'dp_world_size', 'mp_world_size', "
      "'checkpoint_parallel_dimensions', 'ds_config', 'ds_version', 'universal_checkpoint_info']";
  const std::string keys_0189 =
      "['module', 'buffer_names', 'optimizer', 'param_shapes', 'frozen_param_shapes', 'shared_params', "
      "'frozen_param_fragments', 'lr_scheduler', 'data_sampler', 'random_ltd', 'sparse_tensor_module_names', "
      "'skipped_steps', 'global_steps', 'global_samples', 'dp_world_size', 'mp_world_size', 'ds_config', "
      "'ds_version']";
  for (const Run& run : runs) {
    SCOPED_TRACE(run.what);
    SyntheticVersion v;
    v.ds_version = run.version;
    auto m = SyntheticModelState::Make(run.spec, /*seed=*/3, /*zero_stage=*/1, state::OptimizerKind::kZero, v);
    ASSERT_TRUE(m.ok()) << m.status();
    const std::string dir = JoinPath(ucp::testing::FreshTempDir("autotp_layout"), "global_step3");
    ASSERT_TRUE(SaveZero(**m, dir, state::Topology{2, 1, 1}).ok());
    for (int rank = 0; rank < 2; ++rank) {
      auto f = torch::TorchFile::Open(JoinPath(dir, absl::StrCat("mp_rank_0", rank, "_model_states.pt")));
      ASSERT_TRUE(f.ok()) << f.status();
      const Value& root = *(*f)->root();
      std::vector<pickle::ValuePtr> keys;
      for (const auto& [k, x] : root.dict_items()) keys.push_back(k);
      EXPECT_EQ(PyRepr(*Value::List(keys)), run.version == "0.18.9" ? keys_0189 : keys_0195);
      EXPECT_EQ(PyRepr(*root.DictGet("ds_config")->DictGet("tensor_parallel")), "{'autotp_size': 2}");
      const Value* uc = root.DictGet("universal_checkpoint_info");
      EXPECT_EQ(uc == nullptr ? "None" : PyRepr(*uc), Info(run.spec, run.version));
      std::vector<std::string> shapes;
      for (const auto& [k, x] : root.DictGet("module")->dict_items()) {
        auto t = (*f)->GetTensor(*x);
        ASSERT_TRUE(t.ok()) << t.status();
        std::vector<pickle::ValuePtr> dims;
        for (int64_t d : t->sizes()) dims.push_back(Value::Int(d));
        shapes.push_back(absl::StrCat(PyRepr(*k), ": ", PyRepr(*Value::Tuple(dims))));
      }
      EXPECT_EQ(absl::StrCat("{", absl::StrJoin(shapes, ", "), "}"), run.shapes[rank]) << "tp rank " << rank;
    }
  }
}

}  // namespace
}  // namespace ucp::conformance
