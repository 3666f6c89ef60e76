#include "format/torch/dump.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "format/pickle/value.h"
#include "format/torch/test_util.h"
#include "gtest/gtest.h"

namespace ucp::torch {
namespace {

using pickle::Value;

TEST(DumpTest, FloatReprKnownValues) {
  EXPECT_EQ(PythonFloatRepr(1.0), "1.0");
  EXPECT_EQ(PythonFloatRepr(-0.0), "-0.0");
  EXPECT_EQ(PythonFloatRepr(0.1), "0.1");
  EXPECT_EQ(PythonFloatRepr(1e-05), "1e-05");
  EXPECT_EQ(PythonFloatRepr(0.0001), "0.0001");
  EXPECT_EQ(PythonFloatRepr(1e16), "1e+16");
  EXPECT_EQ(PythonFloatRepr(1e15), "1000000000000000.0");
  EXPECT_EQ(PythonFloatRepr(1.5e300), "1.5e+300");
  EXPECT_EQ(PythonFloatRepr(5e-324), "5e-324");
  EXPECT_EQ(PythonFloatRepr(123456789.125), "123456789.125");
  EXPECT_EQ(PythonFloatRepr(std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(PythonFloatRepr(-std::numeric_limits<double>::infinity()), "-inf");
  EXPECT_EQ(PythonFloatRepr(std::nan("")), "nan:0x7ff8000000000000");
}

TEST(DumpTest, QuoteBytes) {
  EXPECT_EQ(QuoteBytes("ab"), "\"ab\"");
  EXPECT_EQ(QuoteBytes(std::string("a\"\\\n\x00\xff", 6)), "\"a\\x22\\x5c\\x0a\\x00\\xff\"");
}

// repr() of random doubles (random bits, short decimals, powers of ten at
// the fixed/exponent boundaries) equals Python's.
TEST(DumpTest, FloatReprMatchesPython) {
  std::mt19937_64 rng(17);
  std::vector<double> values;
  for (int i = 0; i < 20000; ++i) {
    uint64_t bits = rng();
    double d;
    std::memcpy(&d, &bits, 8);
    if (!std::isnan(d)) values.push_back(d);
  }
  for (int i = 0; i < 5000; ++i) values.push_back(static_cast<double>(rng() % 100000) / std::pow(10.0, rng() % 12));
  for (int e = -330; e <= 310; ++e) values.push_back(std::pow(10.0, e));
  for (int e = -6; e <= 18; ++e) values.push_back(1.2345 * std::pow(10.0, e));
  std::string input;
  for (double d : values) {
    uint64_t bits;
    std::memcpy(&bits, &d, 8);
    absl::StrAppend(&input, bits, "\n");
  }
  const std::string in_path = testing::TempPath("repr/in.txt");
  ASSERT_TRUE(WriteFileAtomic(in_path, input).ok());
  auto out = testing::RunPython(
      "-c", {"import struct,sys\n"
             "for line in open(sys.argv[1]):\n"
             "    print(repr(struct.unpack('<d', struct.pack('<Q', int(line)))[0]))\n",
             in_path});
  ASSERT_TRUE(out.ok()) << out.status();
  std::vector<std::string> expected = absl::StrSplit(*out, '\n', absl::SkipEmpty());
  ASSERT_EQ(expected.size(), values.size());
  int mismatches = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    if (PythonFloatRepr(values[i]) != expected[i] && ++mismatches < 10) {
      ADD_FAILURE() << "python " << expected[i] << " ours " << PythonFloatRepr(values[i]);
    }
  }
}

TEST(DumpTest, ValueTreeWithoutFile) {
  auto d = Value::MakeDict(true);
  d->DictSet(Value::Str("x"), Value::List({Value::Int(1), Value::BigInt(std::string("\x00\x00\x00\x00\x00\x00\x00\x00\x80", 9))}));
  auto set = Value::MakeSet();
  set->SetAdd(Value::Str("b"));
  set->SetAdd(Value::Str("a"));
  d->DictSet(Value::Int(7), set);
  auto dump = CanonicalDumpValue(*d, nullptr);
  ASSERT_TRUE(dump.ok());
  EXPECT_EQ(*dump,
            "$ OrderedDict len=2\n"
            "$[\"x\"] list len=2\n"
            "$[\"x\"][0] int 1\n"
            "$[\"x\"][1] int -2361183241434822606848\n"
            "$[7] set len=2\n"
            "$[7]{0} str \"a\"\n"
            "$[7]{1} str \"b\"\n");
}

}  // namespace
}  // namespace ucp::torch
