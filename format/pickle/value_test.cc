#include "format/pickle/value.h"

#include <cmath>
#include <string>

#include "gtest/gtest.h"

namespace ucp::pickle {
namespace {

using namespace std::string_literals;

TEST(ValueTest, ScalarAccessorsOfOtherKindsAreEmpty) {
  ValuePtr i = Value::Int(7);
  EXPECT_TRUE(i->items().empty());
  EXPECT_TRUE(i->dict_items().empty());
  EXPECT_EQ(i->str(), "");
  EXPECT_EQ(i->name(), "");
  EXPECT_EQ(i->pid(), nullptr);
  EXPECT_EQ(i->dict_state(), nullptr);
  EXPECT_EQ(i->DictGet("x"), nullptr);
  EXPECT_EQ(Value::Float(2.5)->int_value(), 0);
  EXPECT_EQ(Value::Int(3)->float_value(), 0.0);
  EXPECT_TRUE(Value::Float(2.5)->fits_int64());
}

TEST(ValueTest, BigIntsNormalizeAndKeepTheirBytes) {
  EXPECT_TRUE(Value::BigInt("\xff\xff"s)->fits_int64());
  EXPECT_EQ(Value::BigInt("\xff\xff"s)->int_value(), -1);
  ValuePtr big = Value::BigInt("\x01\x02\x03\x04\x05\x06\x07\x08\x09\x00"s);
  EXPECT_FALSE(big->fits_int64());
  EXPECT_EQ(big->big_int_bytes(), "\x01\x02\x03\x04\x05\x06\x07\x08\x09"s);
  EXPECT_EQ(big->int_value(), 0x0807060504030201);
  EXPECT_EQ(Value::Int(0)->big_int_bytes(), "");
  EXPECT_EQ(Value::Int(-129)->big_int_bytes(), "\x7f\xff"s);
}

TEST(ValueTest, MillionDeepTreesAreReleasedWithoutDeepRecursion) {
  ValuePtr v = Value::None();
  for (int i = 0; i < 1000000; ++i) {
    switch (i % 4) {
      case 0: v = Value::List({v}); break;
      case 1: v = Value::Tuple({Value::Int(i), v}); break;
      case 2: {
        ValuePtr d = Value::MakeDict(i % 8 == 2);
        d->DictSet(Value::Str("k"), v);
        v = d;
        break;
      }
      default: {
        Object o;
        o.callable = Value::Global("m", "C");
        o.state = v;
        v = Value::MakeObject(std::move(o));
        break;
      }
    }
  }
  v.reset();  // a recursive release would need ~1M stack frames
  SUCCEED();
}

TEST(ValueTest, SharedChildrenSurviveTheirParent) {
  ValuePtr shared = Value::List({Value::Str("x")});
  {
    ValuePtr parent = Value::List({Value::List({shared}), shared});
  }
  ASSERT_EQ(shared->items().size(), 1u);
  EXPECT_EQ(shared->items()[0]->str(), "x");
}

TEST(ValueTest, ScalarPoolValuesOutliveThePool) {
  std::vector<ValuePtr> values;
  {
    ScalarPool pool;
    for (int i = 0; i < 5000; ++i) values.push_back(i % 2 ? pool.Int(i) : pool.Float(i + 0.5));
  }
  for (int i = 0; i < 5000; ++i) {
    if (i % 2) {
      ASSERT_TRUE(values[i]->is(Kind::kInt));
      EXPECT_EQ(values[i]->int_value(), i);
    } else {
      ASSERT_TRUE(values[i]->is(Kind::kFloat));
      EXPECT_EQ(values[i]->float_value(), i + 0.5);
    }
  }
  EXPECT_GT(values[1].use_count(), 1) << "values of one block share a reference count";
}

TEST(ValueTest, DictStateTakesPartInDeepEqualAndDebugString) {
  ValuePtr a = Value::MakeDict(true);
  ValuePtr b = Value::MakeDict(true);
  EXPECT_TRUE(DeepEqual(*a, *b));
  ValuePtr state = Value::MakeDict();
  state->DictSet(Value::Str("_metadata"), Value::None());
  a->set_dict_state(state);
  EXPECT_FALSE(DeepEqual(*a, *b));
  EXPECT_EQ(a->DebugString(), "OrderedDict({}).__setstate__({'_metadata': None})");
  b->set_dict_state(state);
  EXPECT_TRUE(DeepEqual(*a, *b));
}

TEST(ValueTest, LargeDictsAndSetsUseTheirIndex) {
  ValuePtr d = Value::MakeDict();
  ValuePtr s = Value::MakeSet();
  for (int i = 0; i < 100; ++i) {
    d->DictSet(Value::Int(i), Value::Int(i * 2));
    s->SetAdd(Value::Float(i));
  }
  d->DictSet(Value::Float(5.0), Value::Str("five"));  // 5 == 5.0: replaced in place
  s->SetAdd(Value::Bool(true));                      // True == 1.0: already there
  EXPECT_EQ(d->dict_items().size(), 100u);
  EXPECT_EQ(d->DictGet(Value::Int(5))->str(), "five");
  EXPECT_EQ(s->set_items().size(), 100u);
  EXPECT_TRUE(d->DictErase("absent") == false);
}

}  // namespace
}  // namespace ucp::pickle

namespace ucp::pickle {
namespace {

// d04: a DAG of shared tuples (each level holding the previous one twice) is
// 2^60 values as a tree; DebugString stays short and quick.
TEST(ValueTest, DebugStringOfASharedDagIsBounded) {
  ValuePtr v = Value::Tuple({});
  for (int i = 0; i < 60; ++i) v = Value::Tuple({v, v});
  const std::string s = v->DebugString(200);
  EXPECT_LE(s.size(), 203u);
  EXPECT_EQ(s.substr(0, 4), "((((");
}

}  // namespace
}  // namespace ucp::pickle
