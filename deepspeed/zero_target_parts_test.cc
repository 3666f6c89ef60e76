// Tests of what the MoE and ZeRO-3 writers share (zero_target_parts.h) and
// of the once-per-rank optimizer files of their readers (flat_optim_file.h).
#include "deepspeed/zero_target_parts.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "deepspeed/flat_optim_file.h"
#include "gtest/gtest.h"

namespace ucp::deepspeed {
namespace {

using pickle::Value;
using pickle::ValuePtr;

// {'zero_optimization': {'stage': 1, 'sub_group_size': 5}, 'checkpoint': {'load_universal': True}, 'lr': 0.1}
ValuePtr SavedConfig() {
  ValuePtr z = Value::MakeDict();
  z->DictSet(Value::Str("stage"), Value::Int(1));
  z->DictSet(Value::Str("sub_group_size"), Value::Int(5));
  ValuePtr ck = Value::MakeDict();
  ck->DictSet(Value::Str("load_universal"), Value::Bool(true));
  ValuePtr c = Value::MakeDict();
  c->DictSet(Value::Str("zero_optimization"), z);
  c->DictSet(Value::Str("checkpoint"), ck);
  c->DictSet(Value::Str("lr"), Value::Float(0.1));
  return c;
}

TEST(RetargetDsConfigTest, SetsStageAndSubGroupSizeAndPlainLoadOnACopy) {
  const ValuePtr saved = SavedConfig();
  torch::TorchWriter w;
  auto c = RetargetDsConfig(state::FileValue{saved, nullptr}, w, /*stage=*/3, /*sub_group_size=*/1000);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->DictGet("zero_optimization")->DictGet("stage")->int_value(), 3);
  EXPECT_EQ((*c)->DictGet("zero_optimization")->DictGet("sub_group_size")->int_value(), 1000);
  EXPECT_FALSE((*c)->DictGet("checkpoint")->DictGet("load_universal")->bool_value());
  EXPECT_EQ((*c)->DictGet("lr")->float_value(), 0.1);
  // The source's tree is untouched.
  EXPECT_EQ(saved->DictGet("zero_optimization")->DictGet("stage")->int_value(), 1);
  EXPECT_TRUE(saved->DictGet("checkpoint")->DictGet("load_universal")->bool_value());
}

TEST(RetargetDsConfigTest, KeepsSubGroupSizeWithoutOneAndAddsNoStage) {
  ValuePtr saved = SavedConfig();
  ValuePtr z = Value::MakeDict();
  z->DictSet(Value::Str("sub_group_size"), Value::Int(5));
  saved->DictSet(Value::Str("zero_optimization"), z);
  torch::TorchWriter w;
  auto c = RetargetDsConfig(state::FileValue{saved, nullptr}, w, /*stage=*/2);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->DictGet("zero_optimization")->DictGet("stage"), nullptr);
  EXPECT_EQ((*c)->DictGet("zero_optimization")->DictGet("sub_group_size")->int_value(), 5);
}

// An AutoTP job's tensor_parallel.autotp_size becomes the target's tp (the
// job that loads it); a config without one gets none.
TEST(RetargetDsConfigTest, SetsAnAutoTpJobsSizeToTheTargetTp) {
  ValuePtr saved = SavedConfig();
  ValuePtr t = Value::MakeDict();
  t->DictSet(Value::Str("autotp_size"), Value::Int(2));
  saved->DictSet(Value::Str("tensor_parallel"), t);
  torch::TorchWriter w;
  auto c = RetargetDsConfig(state::FileValue{saved, nullptr}, w, /*stage=*/3, /*sub_group_size=*/0, /*tp=*/3);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->DictGet("tensor_parallel")->DictGet("autotp_size")->int_value(), 3);
  EXPECT_EQ(saved->DictGet("tensor_parallel")->DictGet("autotp_size")->int_value(), 2);
  auto plain = RetargetDsConfig(state::FileValue{SavedConfig(), nullptr}, w, /*stage=*/3, 0, /*tp=*/3);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ((*plain)->DictGet("tensor_parallel"), nullptr);
}

TEST(SingleRankParallelDimensionsTest, PpThenTpDegreeOne) {
  const ValuePtr dims = SingleRankParallelDimensions();
  ASSERT_EQ(dims->dict_items().size(), 2u);
  EXPECT_EQ(dims->dict_items()[0].first->str(), "pp_degree");
  EXPECT_EQ(dims->dict_items()[1].first->str(), "tp_degree");
  EXPECT_EQ(dims->DictGet("pp_degree")->int_value(), 1);
  EXPECT_EQ(dims->DictGet("tp_degree")->int_value(), 1);
}

TEST(LazyOptimFilesTest, ParsesEachRankOnceAcrossThreadsAndKeepsErrors) {
  LazyOptimFiles files;
  files.Reset(2);
  EXPECT_TRUE(files.Has(1));
  EXPECT_FALSE(files.Has(2));
  EXPECT_FALSE(files.Has(-1));
  EXPECT_EQ(files.Parsed(0), nullptr);
  std::atomic<int> parses{0};
  auto parse = [&](int dp) -> absl::StatusOr<std::unique_ptr<FlatOptimFile>> {
    ++parses;
    if (dp == 1) return absl::DataLossError("rank 1 is damaged");
    return std::make_unique<FlatOptimFile>();
  };
  std::vector<std::thread> threads;
  std::vector<const FlatOptimFile*> got(4, nullptr);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      auto f = files.Get(0, parse);
      if (f.ok()) got[i] = *f;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(parses.load(), 1);
  ASSERT_NE(got[0], nullptr);
  for (const FlatOptimFile* f : got) EXPECT_EQ(f, got[0]);
  EXPECT_EQ(files.Parsed(0), got[0]);
  for (int i = 0; i < 2; ++i) {
    auto f = files.Get(1, parse);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().message(), "rank 1 is damaged");
  }
  EXPECT_EQ(parses.load(), 2);
  EXPECT_EQ(files.Parsed(1), nullptr);
}

}  // namespace
}  // namespace ucp::deepspeed
