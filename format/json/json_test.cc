#include "format/json/json.h"

#include <string>

#include "gtest/gtest.h"

namespace ucp::json {
namespace {

// Expected strings are what CPython 3.11 prints (repr / json.dumps), typed
// in by hand.
TEST(PythonFloatReprTest, MatchesPythonRepr) {
  EXPECT_EQ(PythonFloatRepr(1e-05), "1e-05");
  EXPECT_EQ(PythonFloatRepr(10000.0), "10000.0");
  EXPECT_EQ(PythonFloatRepr(0.25), "0.25");
  EXPECT_EQ(PythonFloatRepr(1e16), "1e+16");
  EXPECT_EQ(PythonFloatRepr(1e15), "1000000000000000.0");
  EXPECT_EQ(PythonFloatRepr(123456789.125), "123456789.125");
  EXPECT_EQ(PythonFloatRepr(0.0001), "0.0001");
  EXPECT_EQ(PythonFloatRepr(2.5e-05), "2.5e-05");
  EXPECT_EQ(PythonFloatRepr(1.0 / 3), "0.3333333333333333");
  EXPECT_EQ(PythonFloatRepr(-0.0), "-0.0");
  EXPECT_EQ(PythonFloatRepr(5e-324), "5e-324");
  EXPECT_EQ(PythonFloatRepr(1.7976931348623157e308), "1.7976931348623157e+308");
  EXPECT_EQ(PythonFloatRepr(0.02), "0.02");
}

TEST(DumpPythonTest, IndentTwoSortKeysEnsureAscii) {
  Value inner = Value::Object();
  inner.Set("z", Value::Double(2.0));
  inner.Set("a", Value::Null());
  Value v = Value::Object();
  v.Set("b", Value::Array({Value::Int(1), inner}));
  v.Set("a", Value::String("\xC3\xA9\n\"\\\xF0\x9F\x98\x80"));
  v.Set("c", Value::Array());
  v.Set("d", Value::Object());
  EXPECT_EQ(DumpPython(v),
            "{\n"
            "  \"a\": \"\\u00e9\\n\\\"\\\\\\ud83d\\ude00\",\n"
            "  \"b\": [\n"
            "    1,\n"
            "    {\n"
            "      \"a\": null,\n"
            "      \"z\": 2.0\n"
            "    }\n"
            "  ],\n"
            "  \"c\": [],\n"
            "  \"d\": {}\n"
            "}");
}

TEST(DumpCompactTest, InsertionOrderRawUtf8) {
  Value v = Value::Object();
  v.Set("__metadata__", Value::Object()).Set("format", Value::String("pt"));
  Value t = Value::Object();
  t.Set("dtype", Value::String("F32"));
  t.Set("shape", Value::Array({Value::Int(2), Value::Int(3)}));
  v.Set("w\xC3\xA9\x01", t);
  EXPECT_EQ(DumpCompact(v), "{\"__metadata__\":{\"format\":\"pt\"},\"w\xC3\xA9\\u0001\":{\"dtype\":\"F32\",\"shape\":[2,3]}}");
}

TEST(ParseTest, RoundTripsAndRejects) {
  auto v = Parse(R"( {"a": [1, -2, 3.5e1, true, false, null], "b": "x\u00e9\ud83d\ude00\n"} )");
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_EQ(v->type(), Value::Type::kObject);
  const Value* a = v->Get("a");
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->items().size(), 6u);
  EXPECT_EQ(a->items()[1].int_value(), -2);
  EXPECT_EQ(a->items()[2].double_value(), 35.0);
  EXPECT_EQ(v->Get("b")->string_value(), "x\xC3\xA9\xF0\x9F\x98\x80\n");
  EXPECT_FALSE(Parse(R"({"a":1,"a":2})").ok());  // duplicate key
  EXPECT_FALSE(Parse("[1,]").ok());
  EXPECT_FALSE(Parse("{\"a\":1} x").ok());
  EXPECT_FALSE(Parse("\"\xFF\"").ok());  // invalid UTF-8
  EXPECT_FALSE(Parse("99999999999999999999").ok());
  EXPECT_FALSE(Parse(std::string(100, '[') + std::string(100, ']')).ok());  // depth cap
  ParseOptions small;
  small.max_bytes = 4;
  EXPECT_FALSE(Parse("[1, 2]", small).ok());
}

}  // namespace
}  // namespace ucp::json
