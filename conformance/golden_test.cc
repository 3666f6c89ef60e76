// The golden case testdata/golden/neox_zero1_mp2_to_mp1: ucp's output still
// matches it file for file, it reproduces DeepSpeed's tp 2 -> 1 failure, and
// the golden check finds every param a pattern-less DeepSpeed merge gets wrong.
// The savanna case testdata/golden/savanna_zero1_mp2_to_mp1 (StripedHyena 2):
// its files match the golden, every tensor matches the model's own values
// cut by savanna's split dims (a table written here from savanna's code), and
// it converts with no flags under both of savanna's naming schemes.
#include "conformance/golden.h"

#include <cstring>
#include <set>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/fs.h"
#include "base/status_macros.h"
#include "deepspeed/checkpoint_files.h"
#include "format/torch/torch_file.h"
#include "rules/presets.h"
#include "conformance/synthetic_state.h"
#include "ops/convert.h"
#include "ops/open.h"
#include "formats/deepspeed_zero/zero_state.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/fixtures.h"
#include "tp/merge.h"

namespace ucp::conformance {
namespace {

using ::testing::IsEmpty;
using ucp::testing::FreshTempDir;
using ucp::testing::RunfilePath;

const char kCase[] = "testdata/golden/neox_zero1_mp2_to_mp1";

const GoldenEntry* TensorOf(const Golden& g, const std::string& path) {
  for (const auto& f : g.file()) {
    if (f.path() == path && f.tensor_size() > 0) return &f.tensor(0);
  }
  return nullptr;
}

TEST(GoldenTest, CaseIsTheBugReportsSetting) {
  auto c = ReadGoldenCase(RunfilePath(kCase));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model().style(), "gpt-neox");
  EXPECT_EQ(c->model().hidden_size(), 768);
  EXPECT_EQ(c->zero_stage(), 1);
  EXPECT_EQ(c->source().tp(), 2);
  EXPECT_EQ(c->target().tp(), 1);
  EXPECT_NE(c->model().rules_source(), "checkpoint_info");  // GPT-NeoX stores no patterns
  bool found = false;
  for (const auto& p : c->model().param()) {
    if (p.name() == "9.input_layernorm.scale") {
      found = true;
      EXPECT_EQ(std::vector<int64_t>(p.shape().begin(), p.shape().end()), std::vector<int64_t>{768});
      EXPECT_EQ(p.rule().kind(), REPLICATED);
    }
  }
  EXPECT_TRUE(found);
}

TEST(GoldenTest, RegeneratesIdentically) {
  auto c = ReadGoldenCase(RunfilePath(kCase));
  ASSERT_TRUE(c.ok()) << c.status();
  auto want = ReadGolden(RunfilePath(kCase));
  ASSERT_TRUE(want.ok()) << want.status();
  auto got = MakeGolden(*c, FreshTempDir("golden_regenerate"));
  ASSERT_TRUE(got.ok()) << got.status();
  const std::vector<std::string> diffs = CompareGoldens(*want, *got);
  EXPECT_THAT(diffs, IsEmpty()) << diffs.size() << " differences (run `ucp golden update --golden=" << kCase
                                << "` only if the change is intended):\n"
                                << absl::StrJoin(diffs, "\n");
  // The golden describes both outputs, and ucp's universal param is the tp=1 shape.
  const GoldenEntry* scale = TensorOf(*want, "universal/zero/9.input_layernorm.scale/fp32.pt");
  ASSERT_NE(scale, nullptr);
  EXPECT_EQ(std::vector<int64_t>(scale->shape().begin(), scale->shape().end()), std::vector<int64_t>{768});
  EXPECT_NE(TensorOf(*want, "target/layer_09-model_00-model_states.pt"), nullptr);
  EXPECT_EQ(TensorOf(*want, "target/layer_09-model_01-model_states.pt"), nullptr);  // tp=1
}

TEST(GoldenTest, CompareGoldensSeesAChange) {
  auto want = ReadGolden(RunfilePath(kCase));
  ASSERT_TRUE(want.ok()) << want.status();
  Golden changed = *want;
  changed.mutable_file(3)->mutable_tensor(0)->set_sha256("0000");
  changed.mutable_file(5)->add_key("extra");
  EXPECT_EQ(CompareGoldens(*want, changed).size(), 2u);
}

// DeepSpeed's ds_to_universal.py without patterns concatenates every param on
// dim 0; its tp=1 loader then asserts on the replicated layer norm.
TEST(GoldenTest, PatternlessMergeReproducesDeepSpeedsAssertion) {
  auto c = ReadGoldenCase(RunfilePath(kCase));
  ASSERT_TRUE(c.ok()) << c.status();
  auto source = WriteGoldenSource(*c, FreshTempDir("golden_assertion"));
  ASSERT_TRUE(source.ok()) << source.status();
  const std::string source_folder = *source;
  ops::SourceOptions options;
  options.rules.preset = "none";
  options.rules.default_kind = COLUMN;
  auto state = ops::OpenResolvedState(source_folder, options);
  ASSERT_TRUE(state.ok()) << state.status();
  const std::string name = "9.input_layernorm.scale";
  const state::ParamState* p = (*state)->info().Find(name);
  ASSERT_NE(p, nullptr);
  auto slices = (*state)->source().Slices(*p, 0, "fp32");
  ASSERT_TRUE(slices.ok()) << slices.status();
  ASSERT_EQ(slices->size(), 2u);
  MergeRule cat0;
  cat0.set_kind(COLUMN);
  auto merged = tp::MergeSlices(cat0, *slices, 0, name);  // merge_tp_slices: torch.cat(slices, dim=0)
  ASSERT_TRUE(merged.ok()) << merged.status();
  // The tp=1 model's slice of the param: the whole [768] layer norm.
  auto m = SyntheticModelState::FromCase(*c);
  ASSERT_TRUE(m.ok());
  const int64_t slice_numel = (*m)->info().Find(name)->full_shape[0];
  const int tp_world_size = c->target().tp();
  ASSERT_NE(merged->numel(), slice_numel * tp_world_size);  // the assertion fires
  EXPECT_EQ(DeepSpeedSliceAssertion(merged->numel(), slice_numel, tp_world_size),
            "full param numel 1536 != tensor slice numel 768 * tp_world_size 1");
  // ucp's universal param fits: 768 == 768 * 1.
  auto golden = ReadGolden(RunfilePath(kCase));
  ASSERT_TRUE(golden.ok());
  const GoldenEntry* ours = TensorOf(*golden, "universal/zero/" + name + "/fp32.pt");
  ASSERT_NE(ours, nullptr);
  EXPECT_EQ(ours->shape(0), slice_numel * tp_world_size);
}

// A universal folder made the way DeepSpeed makes it without patterns (every
// param cat on dim 0, vocab padding kept): the check names exactly the
// replicated, row-parallel and vocabulary params, and nothing else.
TEST(GoldenTest, CheckUniversalReportsEveryParamDeepSpeedGetsWrong) {
  auto c = ReadGoldenCase(RunfilePath(kCase));
  ASSERT_TRUE(c.ok()) << c.status();
  auto golden = ReadGolden(RunfilePath(kCase));
  ASSERT_TRUE(golden.ok()) << golden.status();
  const std::string work = FreshTempDir("golden_check");
  auto source = WriteGoldenSource(*c, JoinPath(work, "source"));
  ASSERT_TRUE(source.ok()) << source.status();
  ASSERT_TRUE(WriteFileAtomic(JoinPath(work, "cat0.textproto"), "rule { pattern: \".*\" kind: COLUMN }").ok());
  ops::ConvertOptions o;
  o.input_folder = *source;
  o.output_folder = JoinPath(work, "deepspeed_like");
  o.state.rules.rules_file = JoinPath(work, "cat0.textproto");
  ASSERT_TRUE(ops::Convert(o).ok());
  auto report = CheckUniversal(*golden, o.output_folder);
  ASSERT_TRUE(report.ok()) << report.status();
  std::set<std::string> wrong;
  for (const auto& [param, diffs] : *report) wrong.insert(param);
  std::set<std::string> expected = {"0.word_embeddings.weight", "12.final_linear.weight", "11.norm.scale"};
  for (int l = 2; l <= 9; ++l) {
    for (const char* local : {"input_layernorm.scale", "post_attention_layernorm.scale", "attention.dense.bias",
                              "mlp.dense_4h_to_h.bias", "attention.dense.weight", "mlp.dense_4h_to_h.weight"}) {
      expected.insert(absl::StrCat(l, ".", local));
    }
  }
  EXPECT_EQ(wrong, expected);
  ASSERT_TRUE(report->count("9.input_layernorm.scale"));
  EXPECT_THAT(absl::StrJoin(report->at("9.input_layernorm.scale"), "\n"),
              ::testing::HasSubstr("fp32.pt: param: float32[1536], golden float32[768]"));
  // ucp's own output passes.
  auto run = RunGoldenCase(*c, JoinPath(work, "ucp"));
  ASSERT_TRUE(run.ok()) << run.status();
  auto clean = CheckUniversal(*golden, run->universal);
  ASSERT_TRUE(clean.ok()) << clean.status();
  EXPECT_TRUE(clean->empty()) << clean->begin()->first << ": " << absl::StrJoin(clean->begin()->second, "; ");
}


// ---- the savanna (StripedHyena 2 / Evo 2) golden case ----

namespace savanna {

const char kCase[] = "testdata/golden/savanna_zero1_mp2_to_mp1";

// How savanna splits each tensor over tp, read off its code independently
// of rules/presets/savanna.textproto (model/block.py, model/operators/hyena/,
// mpu/layers.py): the local name's suffix, its rank, the dim its tp slices
// are cut on (-1: every rank holds it whole).
struct Truth {
  const char* suffix;
  int ndim;
  int split_dim;
};
const Truth kTruth[] = {
    {"layernorm.scale", 1, -1},                       // ParallelBlock norms (RMSNorm)
    {"norm.scale", 1, -1},                            // NormPipe
    {"mixer.dense.bias", 1, -1},                      // RowParallelLinear bias: whole
    {"rotary_emb.inv_freq", 1, -1},                   // one head's frequencies
    {"filter.t", 3, -1},                              // implicit_modal positions [1, 1, L]
    {"mixer.dense.weight", 2, 1},                     // RowParallelLinear: input dim
    {"mlp.w3.weight", 2, 1},                          // ParallelGLU w3: parallel_mode row
    {"filter.inner_cls.C", 4, 1},                     // [1, G/tp, order/2, 2]
    {"filter.dt", 2, 1},                              // implicit_real_modal [order, G/tp]
    {"filter.p", 3, 1},                               // implicit_real_modal [order, G/tp, k]
    {"filter.R", 3, 1},
    {"filter.p", 2, 0},                               // implicit_modal [G/tp, order]
    {"filter.R", 2, 0},
    {"filter.gamma", 2, 0},
    {"word_embeddings.weight", 2, 0},                 // VocabParallelEmbedding rows
    {"mixer.dense_projection.weight", 2, 0},          // ColumnParallelLinear
    {"hyena_proj_conv.short_conv_weight", 3, 0},      // d_model = 3h/tp channels
    {"mixer.mixer.short_conv.short_conv_weight", 3, 0},  // G/tp groups
    {"mixer.mixer.conv_bias", 1, 0},                  // width_per_tp_group
    {"filter.h", 2, 0},                               // explicit_single_decay [G/tp, L]
    {"filter.decay", 2, 0},                           // each rank's rows of the global decays
    {"filter.residues_norm.weight", 1, 0},            // LayerNorm(G/tp)
    {"filter.residues_norm.bias", 1, 0},
    {"filter.inner_cls.log_dt", 1, 0},                // [G/tp]
    {"filter.inner_cls.inv_A_real", 2, 0},
    {"filter.inner_cls.A_imag", 2, 0},
    {"filter.inner_cls.B", 3, 0},
    {"mlp.w1.weight", 2, 0},                          // parallel_mode column
    {"mlp.w2.weight", 2, 0},
};

// The split dim savanna gives `name` of rank `ndim`; -2 when the table does not know it.
int SplitDim(const std::string& name, int ndim) {
  for (const Truth& t : kTruth) {
    if (absl::EndsWith(name, t.suffix) && t.ndim == ndim) return t.split_dim;
  }
  return -2;
}

std::vector<float> Floats(const torch::Tensor& t) {
  const std::string b = t.ContiguousBytes();
  std::vector<float> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), v.size() * 4);
  return v;
}

// Tp slice `rank` of a row-major tensor cut on `dim` into `tp` equal parts,
// after zero rows pad dim 0 to `rows` (vocab): plain index arithmetic.
std::vector<float> Slice(const std::vector<float>& full, std::vector<int64_t> shape, int dim, int tp, int rank,
                         int64_t rows = 0) {
  std::vector<float> data = full;
  if (rows > shape[0]) {
    data.resize(static_cast<size_t>(rows * (full.size() / shape[0])), 0.0f);
    shape[0] = rows;
  }
  if (dim < 0) return data;
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < dim; ++d) outer *= shape[d];
  for (size_t d = dim + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t part = shape[dim] / tp;
  std::vector<float> out;
  for (int64_t o = 0; o < outer; ++o) {
    const int64_t base = (o * shape[dim] + rank * part) * inner;
    out.insert(out.end(), data.begin() + base, data.begin() + base + part * inner);
  }
  return out;
}

absl::StatusOr<std::vector<float>> TensorIn(const std::string& path, const std::string& key) {
  UCP_ASSIGN_OR_RETURN(auto f, torch::TorchFile::Open(path));
  const pickle::Value* v = f->root()->DictGet(key);
  if (v == nullptr) return absl::NotFoundError(absl::StrCat(path, ": no key ", key));
  UCP_ASSIGN_OR_RETURN(torch::Tensor t, f->GetTensor(*v));
  return Floats(t);
}

std::vector<int64_t> ShapeOf(const ModelParam& p) { return std::vector<int64_t>(p.shape().begin(), p.shape().end()); }

// A source that no preset needs a flag for: savanna's pp=1 names
// ("sequential.<layer>.<path>" as PipelineModule.to_sequential() gives), the
// output layer untied (final_linear, ParallelLinearPipe).
ModelSpec SequentialSpec(const ModelSpec& pipe) {
  ModelSpec s = pipe;
  s.clear_param();
  s.clear_module_layers();
  s.set_num_layers(0);
  s.set_pipeline(false);
  s.set_partition_method("");
  for (ModelParam p : pipe.param()) {
    const int layer = p.tied_key().empty() ? p.layer() : 0;
    p.set_name(absl::StrCat("sequential.", layer, ".", p.local_name()));
    p.set_local_name(p.name());
    p.set_layer(-1);
    p.clear_tied_key();
    p.clear_tied_layer();
    *s.add_param() = p;
    if (absl::EndsWith(p.name(), "norm.scale") && !absl::StrContains(p.name(), "layernorm")) {
      ModelParam head = pipe.param(0);  // the embedding, untied
      head.set_name("sequential.10.final_linear.weight");
      head.set_local_name(head.name());
      head.set_layer(-1);
      head.clear_tied_key();
      head.clear_tied_layer();
      *s.add_param() = head;
    }
  }
  return s;
}

}  // namespace savanna

TEST(GoldenTest, SavannaCaseIsSavannasModel) {
  auto c = ReadGoldenCase(RunfilePath(savanna::kCase));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model().style(), "savanna");
  EXPECT_EQ(c->source().tp(), 2);
  EXPECT_EQ(c->target().tp(), 1);
  EXPECT_EQ(c->model().rules_source(), "detect");  // no rule flags
  std::set<int> ranks;
  std::vector<std::string> names;
  for (const auto& p : c->model().param()) {
    names.push_back(p.name());
    ranks.insert(p.shape_size());
    // Every tensor is split as savanna splits it.
    const int dim = savanna::SplitDim(p.name(), p.shape_size());
    ASSERT_NE(dim, -2) << p.name() << " is not in the table of savanna's tensors";
    EXPECT_EQ(tp::PartitionDim(p.rule()), dim) << p.name();
  }
  EXPECT_EQ(ranks, (std::set<int>{1, 2, 3, 4}));
  EXPECT_EQ(rules::DetectPreset(names), "savanna");
  std::vector<std::string> sequential_names;
  const ModelSpec sequential = savanna::SequentialSpec(c->model());
  for (const auto& p : sequential.param()) sequential_names.push_back(p.name());
  EXPECT_EQ(rules::DetectPreset(sequential_names), "savanna");
}

TEST(GoldenTest, SavannaRegeneratesIdentically) {
  auto c = ReadGoldenCase(RunfilePath(savanna::kCase));
  ASSERT_TRUE(c.ok()) << c.status();
  auto want = ReadGolden(RunfilePath(savanna::kCase));
  ASSERT_TRUE(want.ok()) << want.status();
  auto got = MakeGolden(*c, FreshTempDir("golden_savanna_regenerate"));
  ASSERT_TRUE(got.ok()) << got.status();
  const std::vector<std::string> diffs = CompareGoldens(*want, *got);
  EXPECT_THAT(diffs, IsEmpty()) << diffs.size() << " differences (run `ucp golden update --golden="
                                << savanna::kCase << "` only if the change is intended):\n"
                                << absl::StrJoin(diffs, "\n");
}

// Every tensor of the case's run, against values known by construction: the
// model's own tensors (conformance/synthetic_state.h, from the seed), cut by
// the index arithmetic above with savanna's split dims from the table, not by
// ucp's rules or merge code.
TEST(GoldenTest, SavannaRunHoldsTheModelsTensors) {
  auto c = ReadGoldenCase(RunfilePath(savanna::kCase));
  ASSERT_TRUE(c.ok()) << c.status();
  auto m = SyntheticModelState::FromCase(*c);
  ASSERT_TRUE(m.ok()) << m.status();
  auto run = RunGoldenCase(*c, FreshTempDir("golden_savanna_values"));
  ASSERT_TRUE(run.ok()) << run.status();
  const int tp = c->source().tp();
  const int64_t padded = ((50 + 8 * tp - 1) / (8 * tp)) * (8 * tp);  // Megatron's vocab padding at tp=2: 64
  const int64_t padded1 = 56;                                        // at tp=1
  int checked = 0;
  for (const ModelParam& p : c->model().param()) {
    const bool trainable = p.role() == "trainable";
    const int dim = savanna::SplitDim(p.name(), p.shape_size());
    auto full = (*m)->Tensor(p.name(), trainable ? "fp32" : "lp");
    ASSERT_TRUE(full.ok()) << full.status();
    const std::vector<float> values = savanna::Floats(*full);
    const bool vocab = absl::StrContains(p.name(), "word_embeddings");
    const std::vector<int> layers =
        p.tied_layer().empty() ? std::vector<int>{p.layer()} : std::vector<int>(p.tied_layer().begin(), p.tied_layer().end());
    // The source: every tp rank's layer file holds its slice.
    for (int l : layers) {
      for (int r = 0; r < tp; ++r) {
        auto got = savanna::TensorIn(JoinPath(run->source, deepspeed::LayerFileName(l, r)), p.local_name());
        ASSERT_TRUE(got.ok()) << got.status();
        EXPECT_EQ(*got, savanna::Slice(values, savanna::ShapeOf(p), dim, tp, r, vocab ? padded : 0))
            << p.name() << " tp rank " << r << " layer " << l;
      }
    }
    // The universal checkpoint: the whole tensor (vocab padding stripped), in every state.
    if (trainable) {
      for (const std::string state : {"fp32", "exp_avg", "exp_avg_sq"}) {
        const std::string path = JoinPath(run->universal, absl::StrCat("zero/", p.name(), "/", state, ".pt"));
        auto got = savanna::TensorIn(path, "param");
        ASSERT_TRUE(got.ok()) << got.status();
        auto want = (*m)->Tensor(p.name(), state);
        ASSERT_TRUE(want.ok());
        EXPECT_EQ(*got, savanna::Floats(*want)) << path;
        // What DeepSpeed's loader cuts it on.
        auto f = torch::TorchFile::Open(path);
        ASSERT_TRUE(f.ok());
        const pickle::Value* cat = (*f)->root()->DictGet("cat_dim");
        if (dim < 0) {
          EXPECT_EQ(cat, nullptr) << path;
        } else {
          ASSERT_NE(cat, nullptr) << path;
          EXPECT_EQ(cat->int_value(), dim) << path;
        }
      }
    } else {
      auto got = savanna::TensorIn(JoinPath(run->universal, absl::StrCat("ucp_module/", p.name(), ".pt")), "param");
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(*got, values) << p.name();
    }
    // The target at tp=1: the whole tensor in every layer file holding it.
    for (int l : layers) {
      auto got = savanna::TensorIn(JoinPath(run->target, deepspeed::LayerFileName(l, 0)), p.local_name());
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(*got, savanna::Slice(values, savanna::ShapeOf(p), -1, 1, 0, vocab ? padded1 : 0)) << p.name();
    }
    ++checked;
  }
  EXPECT_EQ(checked, 89);
}

// `ucp convert` with no flags at all, on the case's source (PipelineModule
// names) and on the same model with pp=1 names: the preset is detected and
// settles every param; the vocab's padding is kept (savanna's args record
// only the padded size), every other tensor is the model's.
TEST(GoldenTest, SavannaConvertsWithNoFlags) {
  auto c = ReadGoldenCase(RunfilePath(savanna::kCase));
  ASSERT_TRUE(c.ok()) << c.status();
  GoldenCase sequential = *c;
  *sequential.mutable_model() = savanna::SequentialSpec(c->model());
  sequential.mutable_source()->set_pp(1);
  ASSERT_TRUE(ValidateModelSpec(sequential.model()).ok()) << ValidateModelSpec(sequential.model());
  const std::string work = FreshTempDir("golden_savanna_noflags");
  int n = 0;
  for (const GoldenCase& k : {*c, sequential}) {
    SCOPED_TRACE(k.model().pipeline() ? "pipeline names" : "sequential names");
    auto m = SyntheticModelState::FromCase(k);
    ASSERT_TRUE(m.ok()) << m.status();
    const std::string src = JoinPath(work, absl::StrCat("src", n, "/global_step1"));
    ASSERT_TRUE(SaveZero(**m, src, state::Topology::FromProto(k.source())).ok());
    ops::ConvertOptions o;  // no rule flags, no vocab size
    o.input_folder = src;
    o.output_folder = JoinPath(work, absl::StrCat("out", n++, "/universal"));
    auto r = ops::Convert(o);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_THAT(r->summary, ::testing::HasSubstr("preset: savanna (detected from param names)"));
    for (const ModelParam& p : k.model().param()) {
      if (p.role() != "trainable") continue;
      auto got = savanna::TensorIn(JoinPath(o.output_folder, absl::StrCat("zero/", p.name(), "/fp32.pt")), "param");
      ASSERT_TRUE(got.ok()) << got.status();
      auto want = (*m)->Tensor(p.name(), "fp32");
      ASSERT_TRUE(want.ok());
      std::vector<float> w = savanna::Floats(*want);
      if (absl::StrContains(p.name(), "word_embeddings") || absl::StrContains(p.name(), "final_linear")) {
        w.resize(64 * p.shape(1), 0.0f);  // padded to 64 rows at tp=2, padding kept
      }
      EXPECT_EQ(*got, w) << p.name();
    }
  }
}

}  // namespace
}  // namespace ucp::conformance
