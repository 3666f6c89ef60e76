// A tied alias of a plain module (Hugging Face's tie_word_embeddings:
// lm_head.weight another name of the embedding) through a universal
// checkpoint: the universal reader gives it its owner (from shared_params,
// which the manifest does not record), so that a reshard from the universal
// folder to ZeRO-0 writes the module's tied names as one tensor, byte for
// byte what a save at ZeRO-0 writes (before: two tensors, the file differed).
#include <string>

#include "base/fs.h"
#include "conformance/properties.h"
#include "conformance/synthetic_state.h"
#include "gtest/gtest.h"
#include "ops/convert.h"
#include "ops/reshard.h"
#include "ops/training_state.h"
#include "testing/fixtures.h"

namespace ucp::conformance {
namespace {

ModelSpec TiedSpec() {
  ModelSpec spec;
  spec.set_style("hf-llama");
  spec.set_pipeline(false);
  spec.set_lp_dtype("fp32");
  spec.set_num_groups(1);
  spec.set_rules_source("no_flags");
  struct P {
    const char* name;
    std::vector<int64_t> shape;
    const char* role;
  };
  for (const P& q : std::vector<P>{{"model.embed_tokens.weight", {5, 2}, "trainable"},
                                   {"model.layers.0.self_attn.q_proj.weight", {2, 2}, "trainable"},
                                   {"model.norm.weight", {2}, "trainable"},
                                   {"lm_head.weight", {5, 2}, "tied"}}) {
    ModelParam* p = spec.add_param();
    p->set_name(q.name);
    p->set_local_name(q.name);
    for (int64_t d : q.shape) p->add_shape(d);
    p->mutable_rule()->set_kind(REPLICATED);
    p->set_role(q.role);
    p->set_group(std::string(q.role) == "trainable" ? 0 : -1);
    if (std::string(q.role) == "tied") p->set_tied_key("model.embed_tokens.weight");
    p->set_layer(-1);
  }
  return spec;
}

TEST(TiedAliasTest, UniversalToZero0KeepsTheTie) {
  auto m = SyntheticModelState::Make(TiedSpec(), /*seed=*/5, /*zero_stage=*/1, state::OptimizerKind::kZero,
                                     {"0.19.5", false});
  ASSERT_TRUE(m.ok()) << m.status();
  const std::string root = testing::FreshTempDir("tied_alias");
  writers::ZeroWriteOptions o;
  o.target = state::Topology{1, 1, 2};
  o.num_threads = 1;
  const std::string zero1 = JoinPath(root, "z1/global_step1");
  ASSERT_TRUE(ops::WriteTrainingState(**m, zero1, o).ok());
  ops::ConvertOptions c;
  c.input_folder = zero1;
  c.output_folder = JoinPath(root, "u/global_step1_universal");
  c.write.num_threads = 1;
  c.state.num_threads = 1;
  ASSERT_TRUE(ops::Convert(c).ok());
  ops::ReshardOptions r;
  r.input_folder = c.output_folder;
  r.output_folder = JoinPath(root, "r/global_step1");
  r.write.target = state::Topology{1, 1, 1};
  r.write.num_threads = 1;
  r.format = "deepspeed_zero0";
  auto resharded = ops::Reshard(r);
  ASSERT_TRUE(resharded.ok()) << resharded.status();
  writers::ZeroWriteOptions z0 = o;
  z0.target = state::Topology{1, 1, 1};
  const std::string saved = JoinPath(root, "s/global_step1");
  ASSERT_TRUE(ops::WriteTrainingState(**m, saved, z0, "deepspeed_zero0").ok());
  auto diffs = FolderByteDiffs(r.output_folder, saved);
  ASSERT_TRUE(diffs.ok()) << diffs.status();
  EXPECT_TRUE(diffs->empty()) << (diffs->empty() ? "" : (*diffs)[0]);
}

}  // namespace
}  // namespace ucp::conformance
