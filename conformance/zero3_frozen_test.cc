// Frozen params (requires_grad False: LoRA's base model, frozen embeddings)
// in ZeRO-3 checkpoints: what the writer puts in each rank's model states
// (frozen_param_shapes, frozen_param_fragments = the rank's ceil(numel / dp)
// partition, zero padded; module entries empty), checked element by element
// against a synthetic model's tensors; what the reader gives back; reshards
// to ZeRO-3 at another dp and to ZeRO-1/2; hostile inputs (a fragment of the
// wrong size, shapes that disagree between ranks, a missing rank, a missing
// fragment) refused naming the file and the param.
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/fs.h"
#include "conformance/synthetic_state.h"
#include "deepspeed/tree_copy.h"
#include "format/pickle/accessors.h"
#include "formats/deepspeed_zero3/zero3_state.h"
#include "gtest/gtest.h"
#include "ops/reshard.h"
#include "ops/training_state.h"
#include "testing/fixtures.h"
#include "tp/plan_io.h"

namespace ucp::deepspeed_zero3 {
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

int64_t Numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// A plain module: two trainable params in one group, three frozen ones
// (sizes that do not split evenly over dp 3) and a buffer.
ModelSpec Spec(const std::string& lp_dtype) {
  ModelSpec spec;
  spec.set_style("gpt-neox");
  spec.set_pipeline(false);
  spec.set_num_layers(1);
  spec.set_lp_dtype(lp_dtype);
  spec.set_num_groups(1);
  spec.set_rules_source("rules_file");
  struct P {
    const char* name;
    std::vector<int64_t> shape;
    const char* role;
  };
  for (const P& q : std::vector<P>{{"emb.weight", {7, 4}, "frozen"},
                                   {"a.lora_A.weight", {2, 4}, "trainable"},
                                   {"a.base_layer.weight", {5, 4}, "frozen"},
                                   {"a.lora_B.weight", {5, 2}, "trainable"},
                                   {"norm.weight", {5}, "frozen"},
                                   {"pos", {3}, "buffer"}}) {
    ModelParam* p = spec.add_param();
    p->set_name(q.name);
    p->set_local_name(q.name);
    for (int64_t d : q.shape) p->add_shape(d);
    p->mutable_rule()->set_pattern(q.name);
    p->mutable_rule()->set_kind(REPLICATED);
    p->set_group(std::string(q.role) == "trainable" ? 0 : -1);
    p->set_role(q.role);
    p->set_layer(-1);
  }
  return spec;
}

std::unique_ptr<conformance::SyntheticModelState> Model(const std::string& lp_dtype) {
  auto m = conformance::SyntheticModelState::Make(Spec(lp_dtype), /*seed=*/11, /*zero_stage=*/2,
                                                  state::OptimizerKind::kZero, {"0.19.5", false});
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(*m) : nullptr;
}

std::string ModelFile(const std::string& dir, int dp) {
  return JoinPath(dir, absl::StrCat("zero_pp_rank_", dp, "_mp_rank_00_model_states.pt"));
}

// The ZeRO-3 checkpoint of `m` at `dp`.
std::string WriteZero3(const conformance::SyntheticModelState& m, int dp, const std::string& name) {
  const std::string dir = JoinPath(ucp::testing::FreshTempDir(name), "global_step1");
  writers::ZeroWriteOptions o;
  o.target = state::Topology{1, 1, dp};
  o.zero_stage = 3;
  o.num_threads = 1;
  auto w = ops::WriteTrainingState(m, dir, o);
  EXPECT_TRUE(w.ok()) << w.status();
  return dir;
}

// Every rank's file as DeepSpeed lays it out: frozen_param_shapes (module
// order), each fragment the rank's slice of the flat lp tensor, zeros past
// its end; module entries of frozen params empty.
void ExpectDeepSpeedLayout(const conformance::SyntheticModelState& m, const std::string& dir, int dp) {
  const std::vector<std::string> frozen = {"emb.weight", "a.base_layer.weight", "norm.weight"};
  for (int r = 0; r < dp; ++r) {
    auto f = torch::TorchFile::Open(ModelFile(dir, r));
    ASSERT_TRUE(f.ok()) << f.status();
    const Value& root = *(*f)->root();
    const Value* shapes = root.DictGet("frozen_param_shapes");
    const Value* frags = root.DictGet("frozen_param_fragments");
    ASSERT_TRUE(shapes != nullptr && shapes->is(Kind::kDict));
    ASSERT_TRUE(frags != nullptr && frags->is(Kind::kDict));
    ASSERT_EQ(shapes->dict_items().size(), frozen.size());
    ASSERT_EQ(frags->dict_items().size(), frozen.size());
    for (size_t i = 0; i < frozen.size(); ++i) {
      EXPECT_EQ(shapes->dict_items()[i].first->str(), frozen[i]);
      EXPECT_EQ(frags->dict_items()[i].first->str(), frozen[i]);
      auto want = m.Tensor(frozen[i], "lp");
      ASSERT_TRUE(want.ok()) << want.status();
      auto shape = pickle::AsTorchSize(*shapes->dict_items()[i].second, "shape");
      ASSERT_TRUE(shape.ok());
      EXPECT_EQ(*shape, want->sizes());
      const int64_t numel = want->numel();
      const int64_t part = (numel + dp - 1) / dp;
      auto t = (*f)->GetTensor(*frags->dict_items()[i].second);
      ASSERT_TRUE(t.ok()) << t.status();
      ASSERT_EQ(t->sizes(), std::vector<int64_t>{part}) << frozen[i] << " rank " << r;
      ASSERT_EQ(t->dtype(), want->dtype());
      const std::string got = t->ContiguousBytes(), all = want->ContiguousBytes();
      const size_t item = torch::ItemSize(want->dtype());
      const int64_t begin = r * part;
      const int64_t len = std::max<int64_t>(0, std::min(part, numel - begin));
      EXPECT_EQ(got.substr(0, len * item), all.substr(begin * item, len * item)) << frozen[i] << " rank " << r;
      EXPECT_EQ(got.substr(len * item), std::string((part - len) * item, '\0')) << frozen[i] << " rank " << r;
      auto mod = (*f)->GetTensor(*root.DictGet("module")->DictGet(frozen[i]));
      ASSERT_TRUE(mod.ok());
      EXPECT_EQ(mod->numel(), 0);
    }
    // The buffer whole; no frozen param in param_shapes.
    auto pos = (*f)->GetTensor(*root.DictGet("module")->DictGet("pos"));
    ASSERT_TRUE(pos.ok());
    EXPECT_EQ(pos->sizes(), std::vector<int64_t>{3});
    EXPECT_EQ(root.DictGet("param_shapes")->items()[0]->dict_items().size(), 2u);
  }
}

// Every tensor `dir` reads back as equals the model's: frozen params' lp
// weights, trainable params' fp32 masters.
void ExpectReadsBack(const conformance::SyntheticModelState& m, const std::string& dir) {
  auto z = Zero3State::Open(dir);
  ASSERT_TRUE(z.ok()) << z.status();
  for (const auto& p : m.info().params) {
    const state::ParamState* q = (*z)->info().Find(p.name);
    ASSERT_NE(q, nullptr) << p.name;
    EXPECT_EQ(q->role, p.role) << p.name;
    const std::string st = p.trainable() ? "fp32" : "lp";
    auto got = (*z)->Slices(*q, 0, st);
    ASSERT_TRUE(got.ok()) << p.name << ": " << got.status();
    auto t = (*got)[0].Materialize();
    ASSERT_TRUE(t.ok());
    auto want = m.Tensor(p.name, st);
    ASSERT_TRUE(want.ok());
    EXPECT_EQ(t->dtype(), want->dtype()) << p.name;
    EXPECT_EQ(t->sizes(), want->sizes()) << p.name;
    EXPECT_EQ(t->ContiguousBytes(), want->ContiguousBytes()) << p.name;
  }
  // A frozen param has no optimizer state.
  const state::ParamState* emb = (*z)->info().Find("emb.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_FALSE((*z)->Slices(*emb, 0, "exp_avg").ok());
}

TEST(Zero3FrozenTest, WritesDeepSpeedsLayoutAndReadsItBack) {
  for (const std::string dtype : {"fp32", "fp16"}) {
    SCOPED_TRACE(dtype);
    auto m = Model(dtype);
    ASSERT_NE(m, nullptr);
    for (int dp : {1, 2, 3}) {
      SCOPED_TRACE(dp);
      const std::string dir = WriteZero3(*m, dp, absl::StrCat("zero3_frozen_", dtype, dp));
      ExpectDeepSpeedLayout(*m, dir, dp);
      ExpectReadsBack(*m, dir);
    }
  }
}

// ZeRO-3 dp 3 -> ZeRO-3 dp 2 -> ZeRO-2 dp 2 -> ZeRO-1 dp 1 -> ZeRO-2 dp 2 -> ZeRO-3 dp 3.
TEST(Zero3FrozenTest, ReshardsAcrossStagesAndDp) {
  auto m = Model("fp32");
  ASSERT_NE(m, nullptr);
  const std::string root = ucp::testing::FreshTempDir("zero3_frozen_reshard");
  std::string in = WriteZero3(*m, 3, "zero3_frozen_reshard_src");
  struct Hop {
    int dp, stage;
  };
  int n = 0;
  for (const Hop& h : std::vector<Hop>{{2, 3}, {2, 2}, {1, 1}, {2, 2}, {3, 3}}) {
    SCOPED_TRACE(absl::StrCat("ZeRO-", h.stage, " dp ", h.dp));
    ops::ReshardOptions r;
    r.input_folder = in;
    r.output_folder = JoinPath(root, absl::StrCat("hop", n++, "/global_step1"));
    r.write.target = state::Topology{1, 1, h.dp};
    r.write.zero_stage = h.stage;
    r.write.num_threads = 1;
    auto done = ops::Reshard(r);
    ASSERT_TRUE(done.ok()) << done.status();
    if (h.stage == 3) {
      ExpectDeepSpeedLayout(*m, r.output_folder, h.dp);
      ExpectReadsBack(*m, r.output_folder);
    } else {
      // Stage 1/2: frozen params whole in `module`; stage 2 also in
      // frozen_param_fragments (engine.py saves them when gradients are
      // partitioned), stage 1 None.
      auto f = torch::TorchFile::Open(JoinPath(r.output_folder, "mp_rank_00_model_states.pt"));
      ASSERT_TRUE(f.ok()) << f.status();
      const Value& rt = *(*f)->root();
      for (const std::string name : {"emb.weight", "a.base_layer.weight", "norm.weight"}) {
        auto want = m->Tensor(name, "lp");
        ASSERT_TRUE(want.ok());
        auto mod = (*f)->GetTensor(*rt.DictGet("module")->DictGet(name));
        ASSERT_TRUE(mod.ok()) << name;
        EXPECT_EQ(mod->ContiguousBytes(), want->ContiguousBytes()) << name;
        if (h.stage == 2) {
          auto frag = (*f)->GetTensor(*rt.DictGet("frozen_param_fragments")->DictGet(name));
          ASSERT_TRUE(frag.ok()) << name;
          EXPECT_EQ(frag->sizes(), want->sizes());
          EXPECT_EQ(frag->ContiguousBytes(), want->ContiguousBytes()) << name;
        }
      }
      if (h.stage == 1) {
        EXPECT_TRUE(rt.DictGet("frozen_param_shapes")->is_none());
        EXPECT_TRUE(rt.DictGet("frozen_param_fragments")->is_none());
      } else {
        EXPECT_EQ(rt.DictGet("frozen_param_shapes")->dict_items().size(), 3u);
      }
    }
    in = r.output_folder;
  }
}

// Rewrites `path` with `edit` applied to its (copied) root.
void Rewrite(const std::string& path, const std::function<void(Value&, torch::TorchWriter&)>& edit) {
  std::string out;
  {
    auto f = torch::TorchFile::Open(path);
    ASSERT_TRUE(f.ok()) << f.status();
    torch::TorchWriter w;
    std::shared_ptr<const torch::TorchFile> file(std::move(*f));
    auto root = deepspeed::CopyTreeForWrite(state::FileValue{file->root(), file}, w);
    ASSERT_TRUE(root.ok()) << root.status();
    edit(**root, w);
    ASSERT_TRUE(w.WriteFile(path + ".new", **root).ok());
  }
  ASSERT_EQ(std::rename((path + ".new").c_str(), path.c_str()), 0);
}

absl::Status OpenError(const std::string& dir) {
  auto z = Zero3State::Open(dir);
  return z.ok() ? absl::OkStatus() : z.status();
}

TEST(Zero3FrozenTest, RefusesInconsistentFrozenParams) {
  auto m = Model("fp32");
  ASSERT_NE(m, nullptr);
  // A fragment of the wrong size: rank 1 holds 9 elements of emb.weight, not ceil(28 / 3) = 10.
  {
    const std::string dir = WriteZero3(*m, 3, "zero3_frozen_bad_size");
    Rewrite(ModelFile(dir, 1), [](Value& root, torch::TorchWriter& w) {
      root.DictGetPtr("frozen_param_fragments")
          ->DictSet(Value::Str("emb.weight"), tp::AddPlan(w, tp::TensorPlan::Zeros(torch::DType::kFloat32, {9})));
    });
    const absl::Status s = OpenError(dir);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "zero_pp_rank_1_mp_rank_00_model_states.pt")) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "frozen_param_fragments['emb.weight'] is float32[9], expected float32[10]"))
        << s;
  }
  // Shapes that disagree: rank 2 says norm.weight is [6].
  {
    const std::string dir = WriteZero3(*m, 3, "zero3_frozen_bad_shape");
    Rewrite(ModelFile(dir, 2), [](Value& root, torch::TorchWriter&) {
      root.DictGetPtr("frozen_param_shapes")->DictSet(Value::Str("norm.weight"), pickle::MakeTorchSize({6}));
    });
    const absl::Status s = OpenError(dir);
    EXPECT_TRUE(absl::StrContains(s.message(), "zero_pp_rank_2_mp_rank_00_model_states.pt")) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "frozen param 'norm.weight' has shape")) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "says [5]")) << s;
  }
  // A rank's fragment missing.
  {
    const std::string dir = WriteZero3(*m, 2, "zero3_frozen_no_fragment");
    Rewrite(ModelFile(dir, 1), [](Value& root, torch::TorchWriter& w) {
      ValuePtr d = Value::MakeDict(/*ordered_dict=*/true);
      for (const auto& [k, v] : root.DictGet("frozen_param_fragments")->dict_items()) {
        if (k->str() != "a.base_layer.weight") d->DictSet(k, v);
      }
      root.DictSet(Value::Str("frozen_param_fragments"), d);
    });
    const absl::Status s = OpenError(dir);
    EXPECT_TRUE(absl::StrContains(s.message(), "zero_pp_rank_1_mp_rank_00_model_states.pt")) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "no fragment of frozen param 'a.base_layer.weight'")) << s;
  }
  // A missing rank: its model states file gone.
  {
    const std::string dir = WriteZero3(*m, 3, "zero3_frozen_missing_rank");
    ASSERT_EQ(std::remove(ModelFile(dir, 2).c_str()), 0);
    const absl::Status s = OpenError(dir);
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "zero_pp_rank_2_mp_rank_00_model_states.pt: missing")) << s;
  }
  // A frozen param also listed as trained.
  {
    const std::string dir = WriteZero3(*m, 2, "zero3_frozen_twice");
    Rewrite(ModelFile(dir, 0), [](Value& root, torch::TorchWriter&) {
      root.DictGetPtr("frozen_param_shapes")->DictSet(Value::Str("a.lora_A.weight"), pickle::MakeTorchSize({2, 4}));
    });
    const absl::Status s = OpenError(dir);
    EXPECT_TRUE(absl::StrContains(s.message(), "'a.lora_A.weight' is listed both in param_shapes")) << s;
  }
}

}  // namespace
}  // namespace ucp::deepspeed_zero3
