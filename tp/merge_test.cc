#include "tp/merge.h"

#include <cstring>
#include <numeric>

#include "gtest/gtest.h"
#include "rapidcheck.h"
#include "rapidcheck/gtest.h"

namespace ucp::tp {
namespace {

using torch::DType;
using torch::Tensor;

TensorPlan Iota(std::vector<int64_t> shape, int32_t base) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), base);
  std::string bytes(v.size() * 4, '\0');
  std::memcpy(bytes.data(), v.data(), bytes.size());
  return TensorPlan::FromTensor(*Tensor::FromBytes(DType::kInt32, shape, bytes));
}

std::vector<int32_t> Values(const TensorPlan& p) {
  std::vector<int32_t> out(p.numel());
  EXPECT_TRUE(p.CopyFlat(0, p.numel(), reinterpret_cast<uint8_t*>(out.data())).ok());
  return out;
}

MergeRule Rule(MergeKind kind) {
  MergeRule r;
  r.set_kind(kind);
  return r;
}

TEST(MergeTest, ColumnAndRowAsDeepSpeedConcatenates) {
  // tp slices [[0,1],[2,3]] and [[10,11],[12,13]].
  std::vector<TensorPlan> slices = {Iota({2, 2}, 0), Iota({2, 2}, 10)};
  auto col = MergeSlices(Rule(COLUMN), slices, 0, "w");
  ASSERT_TRUE(col.ok());
  EXPECT_EQ(col->shape(), (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(Values(*col), (std::vector<int32_t>{0, 1, 2, 3, 10, 11, 12, 13}));
  auto row = MergeSlices(Rule(ROW), slices, 0, "w");
  ASSERT_TRUE(row.ok());
  EXPECT_EQ(row->shape(), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(Values(*row), (std::vector<int32_t>{0, 1, 10, 11, 2, 3, 12, 13}));
  // A row merge of a 1-D param is an error naming it.
  auto bad = MergeSlices(Rule(ROW), {Iota({4}, 0), Iota({4}, 0)}, 0, "2.input_layernorm.scale");
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("2.input_layernorm.scale"), std::string::npos);
}

TEST(MergeTest, AutoTpWidthsAsDeepSpeedMasterTpShard) {
  // tp_shard.py get_shard_size (grain 1): size // tp, the first size % tp ranks one more.
  EXPECT_EQ(AutoTpWidth(65, 2, 0), 33);
  EXPECT_EQ(AutoTpWidth(65, 2, 1), 32);
  EXPECT_EQ(AutoTpWidth(10, 4, 0), 3);
  EXPECT_EQ(AutoTpWidth(10, 4, 1), 3);
  EXPECT_EQ(AutoTpWidth(10, 4, 2), 2);
  EXPECT_EQ(AutoTpWidth(10, 4, 3), 2);
  EXPECT_EQ(AutoTpWidth(1, 2, 1), 0);
}

TEST(MergeTest, UnevenAutoTpSlicesConcatenate) {
  // A column param of 3 rows at tp 2: rows [0..1] and [2] (2 columns each).
  auto col = MergeSlices(Rule(COLUMN), {Iota({2, 2}, 0), Iota({1, 2}, 10)}, 0, "gate_proj.weight");
  ASSERT_TRUE(col.ok()) << col.status();
  EXPECT_EQ(col->shape(), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(Values(*col), (std::vector<int32_t>{0, 1, 2, 3, 10, 11}));
  // A row param [2, 3] cut into columns 2 + 1.
  auto row = MergeSlices(Rule(ROW), {Iota({2, 2}, 0), Iota({2, 1}, 10)}, 0, "down_proj.weight");
  ASSERT_TRUE(row.ok()) << row.status();
  EXPECT_EQ(row->shape(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(Values(*row), (std::vector<int32_t>{0, 1, 10, 2, 3, 11}));
  auto full = FullShapeFromSlices(Rule(VOCAB), {{33, 32}, {32, 32}}, "lm_head.weight");
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(*full, (std::vector<int64_t>{65, 32}));
}

// DeepSpeed before 0.19.6 trains AutoTP with torch.chunk (layers.py
// _tp_partition): 66 over tp 4 is 17, 17, 17, 15 there (a real 0.19.5 tp 4
// save), 17, 17, 16, 16 on master; both read, each written for its version.
TEST(MergeTest, AutoTpTorchChunkWidthsOfDeepSpeedBefore0196) {
  EXPECT_EQ(AutoTpChunkWidth(66, 4, 0), 17);
  EXPECT_EQ(AutoTpChunkWidth(66, 4, 2), 17);
  EXPECT_EQ(AutoTpChunkWidth(66, 4, 3), 15);
  EXPECT_EQ(AutoTpChunkWidth(65, 2, 1), 32);  // tp 2: the two cuts agree
  EXPECT_EQ(AutoTpChunkWidth(5, 4, 3), 0);    // torch.chunk makes 3 pieces
  auto full = FullShapeFromSlices(Rule(COLUMN), {{17, 48}, {17, 48}, {17, 48}, {15, 48}},
                                  "model.layers.0.mlp.gate_proj.weight");
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ(*full, (std::vector<int64_t>{66, 48}));
  auto master = FullShapeFromSlices(Rule(ROW), {{48, 17}, {48, 17}, {48, 16}, {48, 16}}, "mlp.down_proj.weight");
  ASSERT_TRUE(master.ok()) << master.status();
  EXPECT_EQ(*master, (std::vector<int64_t>{48, 66}));
  // Neither cut: refused, naming both.
  auto neither = FullShapeFromSlices(Rule(COLUMN), {{16, 2}, {17, 2}, {17, 2}, {16, 2}}, "up_proj.weight");
  ASSERT_FALSE(neither.ok());
  EXPECT_NE(neither.status().message().find("(17, 17, 16, 16 on dim 0; DeepSpeed before 0.19.6, torch.chunk's: 17, "
                                            "17, 17, 15)"),
            std::string::npos)
      << neither.status();
  const std::string gate = "model.layers.0.mlp.gate_proj.weight";
  auto chunk = AutoTpSliceShapes(Rule(COLUMN), {66, 2}, 4, 0, gate, AutoTpCut::kChunk);
  ASSERT_TRUE(chunk.ok()) << chunk.status();
  EXPECT_EQ(*chunk, (std::vector<std::vector<int64_t>>{{17, 2}, {17, 2}, {17, 2}, {15, 2}}));
  TensorPlan t = Iota({66, 2}, 0);
  auto last = SplitFull(Rule(COLUMN), t, 4, 3, 0, gate, /*autotp_widths=*/true, AutoTpCut::kChunk);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->shape(), (std::vector<int64_t>{15, 2}));
  EXPECT_EQ(Values(*last)[0], 102);  // row 51
  auto near = SplitFull(Rule(COLUMN), t, 4, 3, 0, gate, /*autotp_widths=*/true);
  ASSERT_TRUE(near.ok());
  EXPECT_EQ(near->shape(), (std::vector<int64_t>{16, 2}));
  // A cut torch.chunk leaves a rank nothing of: refused, naming the param.
  auto empty = AutoTpSliceShapes(Rule(COLUMN), {5, 2}, 4, 0, gate, AutoTpCut::kChunk);
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("gate_proj"), std::string::npos);
}

TEST(MergeTest, UnevenSlicesOutsideAutoTpsSplitAreRefused) {
  // The larger slice last: not AutoTP's split (the first ranks hold more).
  auto last = MergeSlices(Rule(COLUMN), {Iota({1, 2}, 0), Iota({2, 2}, 10)}, 0, "up_proj.weight");
  ASSERT_FALSE(last.ok());
  EXPECT_NE(last.status().message().find("up_proj.weight"), std::string::npos);
  EXPECT_NE(last.status().message().find(
                "AutoTP's split of 3 over tp 2 (2, 1 on dim 0; DeepSpeed before 0.19.6, torch.chunk's: 2, 1)"),
            std::string::npos)
      << last.status();
  // Slices that differ off the partition dim, or of a replicated param.
  EXPECT_FALSE(MergeSlices(Rule(COLUMN), {Iota({2, 2}, 0), Iota({1, 3}, 10)}, 0, "w").ok());
  EXPECT_FALSE(MergeSlices(Rule(REPLICATED), {Iota({2}, 0), Iota({1}, 10)}, 0, "norm").ok());
  EXPECT_FALSE(FullShapeFromSlices(Rule(ROW), {{4, 3}, {4, 1}}, "o_proj.weight").ok());
}

TEST(MergeTest, AutoTpSplitsRoundTrip) {
  // gate_proj [5, 2] over tp 2: rows 3 + 2; SplitFull with autotp_widths cuts
  // the same and merging the slices gives the tensor back.
  TensorPlan full = Iota({5, 2}, 0);
  auto shapes = AutoTpSliceShapes(Rule(COLUMN), {5, 2}, 2, 0, "model.layers.0.mlp.gate_proj.weight");
  ASSERT_TRUE(shapes.ok()) << shapes.status();
  EXPECT_EQ(*shapes, (std::vector<std::vector<int64_t>>{{3, 2}, {2, 2}}));
  std::vector<TensorPlan> slices;
  for (int r = 0; r < 2; ++r) {
    auto s = SplitFull(Rule(COLUMN), full, 2, r, 0, "model.layers.0.mlp.gate_proj.weight", /*autotp_widths=*/true);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->shape(), (*shapes)[r]);
    slices.push_back(*s);
  }
  EXPECT_EQ(Values(slices[1]), (std::vector<int32_t>{6, 7, 8, 9}));
  auto merged = MergeSlices(Rule(COLUMN), slices, 0, "gate_proj");
  ASSERT_TRUE(merged.ok());
  EXPECT_EQ(Values(*merged), Values(full));
  // Without autotp_widths the uneven split stays an error.
  EXPECT_FALSE(SplitFull(Rule(COLUMN), full, 2, 0, 0, "w").ok());
  // Attention projections are cut in whole heads by AutoTP: refused, naming the param.
  auto q = AutoTpSliceShapes(Rule(COLUMN), {5, 2}, 2, 0, "model.layers.0.self_attn.q_proj.weight");
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.status().message().find("q_proj"), std::string::npos);
  // A padded vocabulary is Megatron's, not AutoTP's.
  EXPECT_FALSE(AutoTpSliceShapes(Rule(VOCAB), {5, 2}, 2, 6, "lm_head.weight").ok());
  EXPECT_TRUE(AutoTpSliceShapes(Rule(VOCAB), {5, 2}, 2, 5, "lm_head.weight").ok());
  EXPECT_TRUE(AutoTpIsLmHead("lm_head.weight"));
  EXPECT_TRUE(AutoTpIsLmHead("base_model.model.lm_head.weight"));
  EXPECT_FALSE(AutoTpIsLmHead("model.lm_head_norm.weight"));
}

// AutoTP's fused gate_up_proj (universal format 0.4): sub_param_shape
// ((5, 5), -1) on dim 0 with sub_param_shard_widths [[3, 2], [3, 2]]: tp rank 0
// holds gate rows 0-2 and up rows 5-7, rank 1 gate rows 3-4 and up rows 8-9
// (DeepSpeed layers.py _partition_logical_tensor), written out by hand here.
MergeRule GateUp(std::vector<std::vector<int64_t>> widths) {
  MergeRule r = Rule(SUB_PARAMS);
  SubParamShape* s = r.mutable_sub_param_shape();
  s->set_partition_dim(0);
  s->add_dim()->add_size(5);
  s->mutable_dim(0)->add_size(5);
  s->add_dim()->add_size(-1);
  for (const auto& w : widths) {
    auto* sw = s->add_shard_widths();
    for (int64_t x : w) sw->add_width(x);
  }
  return r;
}

TEST(MergeTest, FusedSubParamsInAutoTpWidths) {
  const std::string name = "model.layers.0.mlp.gate_up_proj.weight";
  TensorPlan full = Iota({10, 2}, 0);  // row k holds 2k, 2k+1
  std::vector<int32_t> rank0 = {0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15};
  std::vector<int32_t> rank1 = {6, 7, 8, 9, 16, 17, 18, 19};
  std::vector<TensorPlan> slices;
  for (int r = 0; r < 2; ++r) {
    auto s = SplitFull(GateUp({}), full, 2, r, 0, name, /*autotp_widths=*/true);
    ASSERT_TRUE(s.ok()) << s.status();
    slices.push_back(*s);
  }
  EXPECT_EQ(slices[0].shape(), (std::vector<int64_t>{6, 2}));
  EXPECT_EQ(Values(slices[0]), rank0);
  EXPECT_EQ(Values(slices[1]), rank1);
  auto shapes = AutoTpSliceShapes(GateUp({}), {10, 2}, 2, 0, name);
  ASSERT_TRUE(shapes.ok()) << shapes.status();
  EXPECT_EQ(*shapes, (std::vector<std::vector<int64_t>>{{6, 2}, {4, 2}}));
  // Merged with the recorded widths (-1 resolved from the elements): the tensor.
  auto fs = FullShapeFromSlices(GateUp({{3, 2}, {3, 2}}), {{6, 2}, {4, 2}}, name);
  ASSERT_TRUE(fs.ok()) << fs.status();
  EXPECT_EQ(*fs, (std::vector<int64_t>{10, 2}));
  auto merged = MergeSlices(GateUp({{3, 2}, {3, 2}}), slices, 0, name);
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(merged->shape(), (std::vector<int64_t>{10, 2}));
  EXPECT_EQ(Values(*merged), Values(full));
  // The same split as a preset's 2 equal sub-params on dim 0.
  MergeRule two = Rule(SUB_PARAMS);
  two.set_num_sub_params(2);
  two.set_cat_dim(0);
  auto s1 = SplitFull(two, full, 2, 1, 0, name, /*autotp_widths=*/true);
  ASSERT_TRUE(s1.ok()) << s1.status();
  EXPECT_EQ(Values(*s1), rank1);
  EXPECT_FALSE(SplitFull(two, full, 2, 1, 0, name).ok());  // uneven without AutoTP widths
  // Refused: no widths for uneven slices, widths that do not match the
  // slices, the wrong number of widths, a -1 the elements cannot fill.
  EXPECT_FALSE(MergeSlices(GateUp({}), slices, 0, name).ok());
  EXPECT_FALSE(MergeSlices(GateUp({{2, 3}, {3, 2}}), slices, 0, name).ok());
  EXPECT_FALSE(MergeSlices(GateUp({{3, 2}}), slices, 0, name).ok());
  EXPECT_FALSE(SplitFull(GateUp({}), Iota({3, 7}, 0), 2, 0, 0, name, true).ok());
  EXPECT_FALSE(SplitFull(GateUp({}), full, 2, 0, 0, name).ok());  // 5 rows over tp 2, no AutoTP widths
  // A fused param AutoTP cuts by heads (qkv_proj): widths recorded for this
  // tp are kept (here [4, 1] of the first sub-param), another uneven tp is refused.
  const std::string qkv = "model.layers.0.self_attn.qkv_proj.weight";
  auto kept = AutoTpSliceShapes(GateUp({{4, 1}, {3, 2}}), {10, 2}, 2, 0, qkv);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(*kept, (std::vector<std::vector<int64_t>>{{7, 2}, {3, 2}}));
  auto q0 = SplitFull(GateUp({{4, 1}, {3, 2}}), full, 2, 0, 0, qkv, /*autotp_widths=*/true);
  ASSERT_TRUE(q0.ok()) << q0.status();
  EXPECT_EQ(Values(*q0), (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12, 13, 14, 15}));
  EXPECT_FALSE(AutoTpSliceShapes(GateUp({{4, 1}, {3, 2}}), {10, 2}, 3, 0, qkv).ok());
  EXPECT_FALSE(SplitFull(GateUp({}), full, 2, 0, 0, qkv, /*autotp_widths=*/true).ok());
}

TEST(MergeTest, ReplicatedKeepsOneCopy) {
  auto full = MergeSlices(Rule(REPLICATED), {Iota({3}, 5), Iota({3}, 5)}, 0, "b");
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(Values(*full), (std::vector<int32_t>{5, 6, 7}));
  auto split = SplitFull(Rule(REPLICATED), *full, 4, 3, 0, "b");
  ASSERT_TRUE(split.ok());
  EXPECT_EQ(Values(*split), (std::vector<int32_t>{5, 6, 7}));
}

TEST(MergeTest, VocabStripsAndRepads) {
  MergeRule r = Rule(VOCAB);
  // 2 tp slices of 4 rows (8 padded rows), original vocab 6.
  auto full = MergeSlices(r, {Iota({4, 1}, 0), Iota({4, 1}, 100)}, 6, "emb");
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(Values(*full), (std::vector<int32_t>{0, 1, 2, 3, 100, 101}));
  EXPECT_EQ(PaddedVocabSize(6, 4, 1), 8);
  EXPECT_EQ(PaddedVocabSize(6, 4, 3), 12);
  EXPECT_EQ(PaddedVocabSize(50257, 128, 8), 51200);
  // tp=3 with 12 padded rows: 4 rows each, the last ones zero.
  auto s2 = SplitFull(r, *full, 3, 1, 12, "emb");
  ASSERT_TRUE(s2.ok());
  EXPECT_EQ(Values(*s2), (std::vector<int32_t>{100, 101, 0, 0}));
  EXPECT_FALSE(SplitFull(r, *full, 3, 0, 4, "emb").ok());  // padding below the vocab
  EXPECT_FALSE(MergeSlices(r, {Iota({2, 1}, 0)}, 3, "emb").ok());  // vocab above the rows
}

TEST(MergeTest, TwoSubParamsInterleaveLikeSwiglu) {
  MergeRule r = Rule(SUB_PARAMS);
  r.set_num_sub_params(2);
  r.set_cat_dim(0);
  // Each tp rank holds [a_t; b_t] (2 rows each).
  auto full = MergeSlices(r, {Iota({4, 1}, 0), Iota({4, 1}, 10)}, 0, "h_to_4h");
  ASSERT_TRUE(full.ok());
  // Full = [a_0; a_1; b_0; b_1].
  EXPECT_EQ(Values(*full), (std::vector<int32_t>{0, 1, 10, 11, 2, 3, 12, 13}));
  auto back = SplitFull(r, *full, 2, 1, 0, "h_to_4h");
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(Values(*back), (std::vector<int32_t>{10, 11, 12, 13}));
}

TEST(MergeTest, UnevenSubParamsLikeGqa) {
  // q of 4 rows, k and v of 2 rows each, hidden 1; tp=2: each rank holds
  // [q_t (2); k_t (1); v_t (1)].
  MergeRule r = Rule(SUB_PARAMS);
  auto* s = r.mutable_sub_param_shape();
  auto* d0 = s->add_dim();
  d0->add_size(4);
  d0->add_size(2);
  d0->add_size(2);
  s->add_dim()->add_size(1);
  s->set_partition_dim(0);
  auto full = MergeSlices(r, {Iota({4, 1}, 0), Iota({4, 1}, 10)}, 0, "qkv");
  ASSERT_TRUE(full.ok()) << full.status();
  // Full = [q_0; q_1; k_0; k_1; v_0; v_1].
  EXPECT_EQ(Values(*full), (std::vector<int32_t>{0, 1, 10, 11, 2, 12, 3, 13}));
  for (int t = 0; t < 2; ++t) {
    auto back = SplitFull(r, *full, 2, t, 0, "qkv");
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(Values(*back), Values(Iota({4, 1}, 10 * t)));
  }
  // tp=4 splits 4/2/2 into 1/0.5: not divisible.
  EXPECT_FALSE(SplitFull(r, *full, 4, 0, 0, "qkv").ok());
}

TEST(MergeTest, ShapesBothWays) {
  EXPECT_EQ(*FullShapeFromSlice(Rule(ROW), {64, 32}, 2, "w"), (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(*FullShapeFromSlice(Rule(REPLICATED), {64}, 2, "w"), (std::vector<int64_t>{64}));
  EXPECT_EQ(*SliceShapeFromFull(Rule(COLUMN), {192, 64}, 4, 0, "w"), (std::vector<int64_t>{48, 64}));
  auto bad = SliceShapeFromFull(Rule(COLUMN), {190, 64}, 4, 0, "2.qkv");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("not divisible by 4"), std::string::npos);
  EXPECT_EQ(*SliceShapeFromFull(Rule(VOCAB), {50257, 8}, 8, 51200, "e"), (std::vector<int64_t>{6400, 8}));
}

TEST(MergeTest, AverageOfEqualCopiesIsExact) {
  // 0.1f * 3 / 3 is not 0.1f in float32 arithmetic; equal copies must stay exact.
  float x = 0.1f;
  std::string b(4, '\0');
  std::memcpy(b.data(), &x, 4);
  TensorPlan p = TensorPlan::FromTensor(*Tensor::FromBytes(DType::kFloat32, {1}, b));
  auto avg = MergeSlices(Rule(AVERAGE), {p, p, p}, 0, "ln");
  ASSERT_TRUE(avg.ok());
  float y = 0;
  ASSERT_TRUE(avg->CopyFlat(0, 1, reinterpret_cast<uint8_t*>(&y)).ok());
  EXPECT_EQ(std::memcmp(&x, &y, 4), 0);
}

// Split then merge gives back the full tensor, for every kind and tp.
RC_GTEST_PROP(MergeProperty, SplitThenMergeIsIdentity, ()) {
  const int tp = *rc::gen::inRange(1, 9);
  const int kind = *rc::gen::inRange(0, 4);
  MergeRule r;
  std::vector<int64_t> shape;
  const int64_t unit = *rc::gen::inRange<int64_t>(1, 4);
  const int64_t other = *rc::gen::inRange<int64_t>(1, 4);
  switch (kind) {
    case 0: r.set_kind(COLUMN); shape = {unit * tp, other}; break;
    case 1: r.set_kind(ROW); shape = {other, unit * tp}; break;
    case 2: r.set_kind(SUB_PARAMS); r.set_num_sub_params(2); r.set_cat_dim(0); shape = {2 * unit * tp, other}; break;
    default: r.set_kind(REPLICATED); shape = {unit, other}; break;
  }
  TensorPlan full = Iota(shape, 7);
  std::vector<TensorPlan> slices;
  for (int t = 0; t < tp; ++t) {
    auto s = SplitFull(r, full, tp, t, 0, "p");
    RC_ASSERT(s.ok());
    slices.push_back(*s);
  }
  auto merged = MergeSlices(r, slices, 0, "p");
  RC_ASSERT(merged.ok());
  RC_ASSERT(merged->shape() == shape);
  RC_ASSERT(Values(*merged) == Values(full));
}

}  // namespace
}  // namespace ucp::tp
