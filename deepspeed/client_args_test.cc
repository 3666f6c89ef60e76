#include "deepspeed/client_args.h"

#include <string>
#include <vector>

#include "format/pickle/accessors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ucp::deepspeed {
namespace {

using pickle::Kind;
using pickle::ObjectHow;
using pickle::Value;
using pickle::ValuePtr;

ValuePtr Dict(const std::vector<std::pair<std::string, ValuePtr>>& items) {
  ValuePtr d = Value::MakeDict();
  for (const auto& [k, v] : items) d->DictSet(Value::Str(k), v);
  return d;
}

std::vector<std::string> Keys(const Value& d) {
  std::vector<std::string> out;
  for (const auto& [k, v] : d.dict_items()) out.push_back(k->str());
  return out;
}

int64_t IntAt(const Value& d, const char* key) { return d.DictGet(key)->int_value(); }

// GPT-NeoX's dict (megatron/checkpointing.py save_ds_checkpoint): tp and pp
// follow the target; the vocabulary rows when padding changes with tp.
TEST(ClientArgsTest, NeoxDict) {
  ValuePtr args = Dict({{"num_layers", Value::Int(8)},
                        {"padded_vocab_size", Value::Int(50304)},
                        {"model_parallel_size", Value::Int(2)},
                        {"pipe_parallel_size", Value::Int(1)},
                        {"tokenizer_type", Value::Str("HFTokenizer")}});
  const auto changes = ArgsChangesFor(args.get(), {2, 1, 4, 50304}, {4, 2, 1, 50432});
  ASSERT_EQ(changes.size(), 3u);
  ASSERT_TRUE(ApplyArgsChanges(*args, changes).ok());
  EXPECT_EQ(Keys(*args), (std::vector<std::string>{"num_layers", "padded_vocab_size", "model_parallel_size",
                                                   "pipe_parallel_size", "tokenizer_type"}));
  EXPECT_EQ(IntAt(*args, "model_parallel_size"), 4);
  EXPECT_EQ(IntAt(*args, "pipe_parallel_size"), 2);
  EXPECT_EQ(IntAt(*args, "padded_vocab_size"), 50432);
  EXPECT_EQ(IntAt(*args, "num_layers"), 8);
  EXPECT_EQ(DescribeArgsChanges(changes),
            "the client state 'args' (the training script's record of its topology, which GPT-NeoX and "
            "Megatron-DeepSpeed check on load) set to the target's: model_parallel_size 2 -> 4, "
            "pipe_parallel_size 1 -> 2, padded_vocab_size 50304 -> 50432");
}

// What does not record the source's topology stays: a plain (not pipeline)
// GPT-NeoX model's pipe_parallel_size 0, a vocabulary size that is not the
// source's padded rows, a dp that is not the source's, values that are not ints.
TEST(ClientArgsTest, KeepsWhatIsNotTheSourcesTopology) {
  ValuePtr args = Dict({{"padded_vocab_size", Value::Int(50257)},
                        {"model_parallel_size", Value::Str("2")},
                        {"pipe_parallel_size", Value::Int(0)},
                        {"data_parallel_size", Value::Int(3)}});
  EXPECT_TRUE(ArgsChangesFor(args.get(), {2, 1, 4, 50304}, {1, 1, 8, 50304}).empty());
  EXPECT_TRUE(ArgsChangesFor(nullptr, {2, 1, 4, 0}, {1, 1, 8, 0}).empty());
  EXPECT_TRUE(ArgsChangesFor(Value::Int(3).get(), {2, 1, 4, 0}, {1, 1, 8, 0}).empty());
  // The same topology: nothing to change.
  ValuePtr same = Dict({{"model_parallel_size", Value::Int(2)}, {"pipe_parallel_size", Value::Int(1)}});
  EXPECT_TRUE(ArgsChangesFor(same.get(), {2, 1, 4, 0}, {2, 1, 2, 0}).empty());
}

// Megatron-DeepSpeed's argparse.Namespace (check_checkpoint_args asserts
// tensor_model_parallel_size and pipeline_model_parallel_size), in both
// pickle encodings; world_size and data_parallel_size when they are the
// source's.
TEST(ClientArgsTest, MegatronNamespace) {
  for (bool reconstructor : {false, true}) {
    ValuePtr attrs = Dict({{"tensor_model_parallel_size", Value::Int(2)},
                           {"pipeline_model_parallel_size", Value::Int(2)},
                           {"data_parallel_size", Value::Int(2)},
                           {"world_size", Value::Int(8)},
                           {"padded_vocab_size", Value::Int(256)}});
    pickle::Object o;
    if (reconstructor) {
      o.callable = Value::Global("copyreg", "_reconstructor");
      o.args = Value::Tuple({Value::Global("argparse", "Namespace"), Value::Global("builtins", "object"), Value::None()});
    } else {
      o.callable = Value::Global("argparse", "Namespace");
      o.how = ObjectHow::kNewObj;
      o.args = Value::Tuple({});
    }
    o.state = attrs;
    ValuePtr ns = Value::MakeObject(std::move(o));
    const Value* dict = pickle::AsNamespace(*ns).value();
    const auto changes = ArgsChangesFor(dict, {2, 2, 2, 256}, {1, 1, 4, 128});
    ASSERT_EQ(changes.size(), 5u) << reconstructor;
    ASSERT_TRUE(ApplyArgsChanges(*ns, changes).ok());
    const Value& after = *pickle::AsNamespace(*ns).value();
    EXPECT_EQ(IntAt(after, "tensor_model_parallel_size"), 1);
    EXPECT_EQ(IntAt(after, "pipeline_model_parallel_size"), 1);
    EXPECT_EQ(IntAt(after, "data_parallel_size"), 4);
    EXPECT_EQ(IntAt(after, "world_size"), 4);
    EXPECT_EQ(IntAt(after, "padded_vocab_size"), 128);
  }
}

TEST(ClientArgsTest, ApplyRefusesWhatIsNotArgs) {
  EXPECT_FALSE(ApplyArgsChanges(*Value::Int(1), {{"model_parallel_size", 2, 1}}).ok());
  EXPECT_TRUE(ApplyArgsChanges(*Value::Int(1), {}).ok());
}

}  // namespace
}  // namespace ucp::deepspeed
