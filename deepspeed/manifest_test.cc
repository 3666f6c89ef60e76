#include "deepspeed/manifest.h"

#include "google/protobuf/text_format.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace ucp::deepspeed {

using state::ModelInfo;
using state::OptimizerKind;
using state::ParamState;
using state::TensorRole;
using state::Topology;

namespace {

ParamState Param(const std::string& name, std::vector<int64_t> shape, MergeKind kind, TensorRole role, int group) {
  ParamState p;
  p.name = name;
  p.full_shape = std::move(shape);
  p.rule.set_pattern(name);
  p.rule.set_kind(kind);
  p.source = PRESET;
  p.origin = "preset gpt-neox: '" + name + "'";
  p.role = role;
  p.group = group;
  p.layer = 2;
  p.local_name = name.substr(2);
  p.lp_dtype = torch::DType::kBFloat16;
  return p;
}

// A model whose every recorded field differs from its default.
ModelInfo RichInfo() {
  ModelInfo info;
  info.params.push_back(Param("2.attention.dense.weight", {8, 8}, ROW, TensorRole::kTrainable, 0));
  ParamState qkv = Param("2.attention.query_key_value.weight", {12, 8}, SUB_PARAMS, TensorRole::kTrainable, 0);
  qkv.rule.mutable_sub_param_shape()->set_partition_dim(0);
  qkv.rule.mutable_sub_param_shape()->add_dim()->add_size(8);
  qkv.rule.mutable_sub_param_shape()->mutable_dim(0)->add_size(2);
  qkv.rule.mutable_sub_param_shape()->mutable_dim(0)->add_size(2);
  qkv.rule.mutable_sub_param_shape()->add_dim()->add_size(8);
  info.params.push_back(qkv);
  info.params.push_back(Param("2.input_layernorm.scale", {8}, AVERAGE, TensorRole::kTrainable, 1));
  ParamState tied = Param("tied_modules.embed.word_embeddings.weight", {50, 8}, VOCAB, TensorRole::kTrainable, 0);
  tied.tied_key = "embed";
  tied.tied_layers = {0, 5};
  tied.layer = 0;
  tied.local_name = "word_embeddings.weight";
  info.params.push_back(tied);
  info.params.push_back(Param("2.rotary_emb.inv_freq", {4}, REPLICATED, TensorRole::kBuffer, -1));
  info.params.push_back(Param("2.frozen.weight", {3, 3}, COLUMN, TensorRole::kFrozen, -1));
  info.num_groups = 2;
  info.state_keys = {"exp_avg", "exp_avg_sq"};
  info.scalar_keys = {"step"};
  info.pipeline = true;
  info.num_layers = 6;
  info.module_layers = {0, 2, 4};
  info.module_order = {{0, "tied_modules.embed.word_embeddings.weight"}, {2, "2.attention.dense.weight"}};
  info.lp_dtype = torch::DType::kBFloat16;
  info.optimizer_kind = OptimizerKind::kBf16;
  info.zero_stage = 1;
  info.bf16_file_prefix = true;
  info.original_vocab_size = 50;
  info.make_vocab_size_divisible_by = 128;
  info.partition_method = "type:transformer";
  info.source_topology = Topology{2, 3, 4};
  info.Reindex();
  return info;
}

TEST(ManifestTest, ModelInfoRoundTrips) {
  const ModelInfo info = RichInfo();
  const Manifest m = ToManifest(info, {"/ckpt/global_step4", "zero"});
  EXPECT_EQ(m.ucp_version(), kUcpVersion);
  EXPECT_EQ(m.source_folder(), "/ckpt/global_step4");
  auto back = FromManifest(m);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->params.size(), info.params.size());
  for (size_t i = 0; i < info.params.size(); ++i) {
    const ParamState& a = info.params[i];
    const ParamState& b = back->params[i];
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.full_shape, b.full_shape);
    EXPECT_EQ(a.rule.kind(), b.rule.kind()) << a.name;
    EXPECT_EQ(a.rule.SerializeAsString(), b.rule.SerializeAsString()) << a.name;
    EXPECT_EQ(a.source, b.source);
    EXPECT_EQ(a.origin, b.origin);
    EXPECT_EQ(a.group, b.group);
    EXPECT_EQ(a.role, b.role) << a.name;
    EXPECT_EQ(a.layer, b.layer);
    EXPECT_EQ(a.local_name, b.local_name);
    EXPECT_EQ(a.tied_key, b.tied_key);
    EXPECT_EQ(a.tied_layers, b.tied_layers);
    EXPECT_EQ(a.lp_dtype, b.lp_dtype);
  }
  EXPECT_EQ(back->num_groups, info.num_groups);
  EXPECT_EQ(back->state_keys, info.state_keys);
  EXPECT_EQ(back->scalar_keys, info.scalar_keys);
  EXPECT_EQ(back->pipeline, info.pipeline);
  EXPECT_EQ(back->num_layers, info.num_layers);
  EXPECT_EQ(back->module_layers, info.module_layers);
  ASSERT_EQ(back->module_order.size(), info.module_order.size());
  for (size_t i = 0; i < info.module_order.size(); ++i) {
    EXPECT_EQ(back->module_order[i].layer, info.module_order[i].layer);
    EXPECT_EQ(back->module_order[i].name, info.module_order[i].name);
  }
  EXPECT_EQ(back->lp_dtype, info.lp_dtype);
  EXPECT_EQ(back->optimizer_kind, info.optimizer_kind);
  EXPECT_EQ(back->zero_stage, info.zero_stage);
  EXPECT_EQ(back->bf16_file_prefix, info.bf16_file_prefix);
  EXPECT_EQ(back->original_vocab_size, info.original_vocab_size);
  EXPECT_EQ(back->make_vocab_size_divisible_by, info.make_vocab_size_divisible_by);
  EXPECT_EQ(back->partition_method, info.partition_method);
  EXPECT_EQ(back->source_topology, info.source_topology);
  EXPECT_EQ(back->Find("2.rotary_emb.inv_freq")->role, TensorRole::kBuffer);
}

TEST(ManifestTest, ManifestRoundTripsThroughModelInfo) {
  const Manifest m = ToManifest(RichInfo(), {"src", "zero"});
  auto info = FromManifest(m);
  ASSERT_TRUE(info.ok()) << info.status();
  const Manifest again = ToManifest(*info, {"src", "zero"});
  std::string diff;
  google::protobuf::util::MessageDifferencer d;
  d.ReportDifferencesToString(&diff);
  EXPECT_TRUE(d.Compare(m, again)) << diff;
}

TEST(ManifestTest, BadDtypeNamesTheParam) {
  Manifest m = ToManifest(RichInfo(), {"src", "zero"});
  m.mutable_param(2)->set_lp_dtype("float7");
  auto info = FromManifest(m);
  ASSERT_FALSE(info.ok());
  EXPECT_NE(info.status().message().find("2.input_layernorm.scale"), std::string::npos) << info.status();
}

// Manifests written before roles were recorded say only `frozen`.
TEST(ManifestTest, RoleFromFrozenFlagWhenUnrecorded) {
  Manifest::Param mp;
  mp.set_name("x");
  mp.set_frozen(true);
  auto p = DecodeParam(mp);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->role, TensorRole::kFrozen);
  mp.set_frozen(false);
  p = DecodeParam(mp);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->role, TensorRole::kTrainable);
}

}  // namespace
}  // namespace ucp::deepspeed
