#include "format/pickle/reader.h"
#include "format/pickle/writer.h"

#include <cmath>
#include <cstdio>
#include <random>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ucp::pickle {
namespace {

using namespace std::string_literals;
using ::testing::HasSubstr;

// Unpickles a stream that must parse.
ValuePtr Read(const std::string& bytes, const ReadOptions& options = {}) {
  absl::StatusOr<ValuePtr> v = Unpickle(bytes, options);
  EXPECT_TRUE(v.ok()) << v.status();
  return v.ok() ? *v : Value::Str("<error>");
}

absl::Status ReadStatus(const std::string& bytes, const ReadOptions& options = {}) {
  return Unpickle(bytes, options).status();
}

std::string Message(const absl::Status& s) { return std::string(s.message()); }

// "\x80\x02" + body + "."
std::string P2(const std::string& body) { return "\x80\x02"s + body + "."; }

std::string Le32(uint32_t x) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[i] = static_cast<char>((x >> (8 * i)) & 0xff);
  return s;
}
std::string Le64(uint64_t x) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((x >> (8 * i)) & 0xff);
  return s;
}

// ---- framing, PROTO, STOP ----

TEST(ReaderFramingTest, AcceptsEveryProtocolUpToFive) {
  for (int proto = 0; proto <= 5; ++proto) {
    ValuePtr v = Read("\x80"s + static_cast<char>(proto) + "N.");
    EXPECT_TRUE(v->is_none()) << proto;
  }
  EXPECT_TRUE(Read("N.")->is_none());  // protocol 0 has no PROTO
}

TEST(ReaderFramingTest, RejectsProtocolSix) {
  absl::Status s = ReadStatus("\x80\x06N.");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(Message(s), "pickle: at byte 0 (PROTO): unsupported pickle protocol 6");
}

TEST(ReaderFramingTest, FrameIsSkippedWhenInBounds) {
  EXPECT_EQ(Read("\x80\x04\x95"s + Le64(2) + "K\x07.")->int_value(), 7);
}

TEST(ReaderFramingTest, FramePastTheEndIsDataLoss) {
  absl::Status s = ReadStatus("\x80\x04\x95"s + Le64(100) + "K\x07.");
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(Message(s), HasSubstr("at byte 2 (FRAME): frame of 100 bytes but only 3 are left"));
}

TEST(ReaderFramingTest, MissingStopIsInvalid) {
  absl::Status s = ReadStatus("\x80\x02K\x01"s);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(s), "pickle: at byte 4: the pickle ended without STOP");
  EXPECT_EQ(ReadStatus("").code(), absl::StatusCode::kInvalidArgument);
}

TEST(ReaderFramingTest, StopNeedsExactlyOneValueAndNoMark) {
  EXPECT_THAT(Message(ReadStatus(P2("K\x01K\x02"))), HasSubstr("STOP with 2 values on the stack"));
  EXPECT_THAT(Message(ReadStatus(P2(""))), HasSubstr("STOP with 0 values on the stack"));
  EXPECT_THAT(Message(ReadStatus(P2("(K\x01"))), HasSubstr("STOP with 1 unclosed MARK"));
}

TEST(ReaderFramingTest, BytesAfterStopAreInvalid) {
  absl::Status s = ReadStatus("\x80\x02N.junk"s);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(s), "pickle: at byte 4: 4 bytes after STOP");
}

TEST(ReaderFramingTest, UnknownOpcode) {
  absl::Status s = ReadStatus("\x80\x02\xff."s);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(s), "pickle: at byte 2 (0xff): unknown opcode 0xff");
}

TEST(ReaderFramingTest, ExtensionRegistryAndOutOfBandBuffersAreUnimplemented) {
  for (const std::string& op : {"\x82\x01"s, "\x83\x01\x00"s, "\x84\x01\x00\x00\x00"s}) {
    absl::Status s = ReadStatus(P2(op));
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
    EXPECT_THAT(Message(s), HasSubstr("extension registry"));
  }
  absl::Status s = ReadStatus("\x80\x05\x97\x98."s);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(Message(s), "pickle: at byte 2 (NEXT_BUFFER): out-of-band buffers are not supported");
}

// ---- ints ----

TEST(ReaderIntTest, BinaryInts) {
  EXPECT_EQ(Read(P2("K\xff"))->int_value(), 255);
  EXPECT_EQ(Read(P2("M\x01\x02"))->int_value(), 0x0201);
  EXPECT_EQ(Read(P2("J\xfe\xff\xff\xff"))->int_value(), -2);
  EXPECT_EQ(Read(P2("J\x00\x00\x00\x80"s))->int_value(), INT32_MIN);
}

// Ints on both sides of the range the reader shares one value for, and each
// int of it read twice in one tree: equal values, whether shared or not.
TEST(ReaderIntTest, IntsAroundTheSharedRangeReadBack) {
  for (int64_t i : {-1025, -1024, -1, 0, 1, 1023, 1024, 1025, 65535, 65536, 1000000}) {
    const std::string one = "J"s + Le32(static_cast<uint32_t>(static_cast<int32_t>(i)));
    ValuePtr pair = Read(P2(one + one + "\x86"));
    ASSERT_TRUE(pair->is(Kind::kTuple)) << i;
    ASSERT_EQ(pair->items().size(), 2u) << i;
    EXPECT_EQ(pair->items()[0]->int_value(), i);
    EXPECT_EQ(pair->items()[1]->int_value(), i);
  }
}

TEST(ReaderIntTest, Long1AndLong4) {
  EXPECT_EQ(Read(P2("\x8a\x00"s))->int_value(), 0);
  EXPECT_EQ(Read(P2("\x8a\x01\xff"))->int_value(), -1);
  EXPECT_EQ(Read(P2("\x8a\x02\x00\x80"s))->int_value(), -32768);
  EXPECT_EQ(Read(P2("\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80"s))->int_value(), INT64_MIN);
  ValuePtr big = Read(P2("\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00"s));  // 2**63
  EXPECT_FALSE(big->fits_int64());
  EXPECT_EQ(big->big_int_bytes(), "\x00\x00\x00\x00\x00\x00\x00\x80\x00"s);
  const std::string bytes(300, '\x11');
  ValuePtr long4 = Read(P2("\x8b"s + Le32(300) + bytes));
  EXPECT_EQ(long4->big_int_bytes(), bytes);
}

TEST(ReaderIntTest, Long4NegativeCountIsInvalid) {
  absl::Status s = ReadStatus(P2("\x8b\xff\xff\xff\xff"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(s), "pickle: at byte 2 (LONG4): negative byte count -1");
}

TEST(ReaderIntTest, TextInt) {
  EXPECT_EQ(Read("I42\n.")->int_value(), 42);
  EXPECT_EQ(Read("I-7\n.")->int_value(), -7);
  EXPECT_EQ(Read("I007\n.")->int_value(), 7);
  ValuePtr t = Read("I01\n.");
  ASSERT_TRUE(t->is(Kind::kBool));
  EXPECT_TRUE(t->bool_value());
  ValuePtr f = Read("I00\n.");
  ASSERT_TRUE(f->is(Kind::kBool));
  EXPECT_FALSE(f->bool_value());
  ValuePtr big = Read("I-18446744073709551616\n.");  // -2**64
  EXPECT_EQ(big->big_int_bytes(), "\x00\x00\x00\x00\x00\x00\x00\x00\xff"s);
}

TEST(ReaderIntTest, TextLong) {
  EXPECT_EQ(Read("L123L\n.")->int_value(), 123);
  EXPECT_EQ(Read("L-5\n.")->int_value(), -5);
  ValuePtr big = Read("L340282366920938463463374607431768211456L\n.");  // 2**128
  EXPECT_EQ(big->big_int_bytes(), std::string(16, '\0') + "\x01"s);
  EXPECT_EQ(Read("L9223372036854775807L\n.")->int_value(), INT64_MAX);
  EXPECT_EQ(Read("L-9223372036854775808L\n.")->int_value(), INT64_MIN);
}

TEST(ReaderIntTest, TextIntErrors) {
  absl::Status s = ReadStatus("I12x\n.");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(s), "pickle: at byte 0 (INT): invalid integer literal '12x'");
  ReadOptions options;
  options.max_int_digits = 10;
  absl::Status cap = ReadStatus("L12345678901\n.", options);
  EXPECT_EQ(cap.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(cap), HasSubstr("11 digits exceeds max_int_digits 10"));
}

TEST(ReaderIntTest, TruncatedOperandIsDataLoss) {
  absl::Status s = ReadStatus("\x80\x02J\x01\x02"s);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(Message(s), "pickle: at byte 2 (BININT): truncated: needs 4 bytes but only 2 are left");
  absl::Status line = ReadStatus("I12");
  EXPECT_EQ(line.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(Message(line), HasSubstr("(INT): truncated: text operand has no terminating newline"));
}

// ---- floats ----

TEST(ReaderFloatTest, BinFloatIsBigEndian) {
  EXPECT_EQ(Read(P2("G\x3f\xf8\x00\x00\x00\x00\x00\x00"s))->float_value(), 1.5);
  EXPECT_TRUE(std::signbit(Read(P2("G\x80\x00\x00\x00\x00\x00\x00\x00"s))->float_value()));
}

TEST(ReaderFloatTest, TextFloat) {
  EXPECT_EQ(Read("F1.5\n.")->float_value(), 1.5);
  EXPECT_EQ(Read("F1e+100\n.")->float_value(), 1e100);
  EXPECT_EQ(Read("F0.1\n.")->float_value(), 0.1);
  EXPECT_TRUE(std::isnan(Read("Fnan\n.")->float_value()));
  EXPECT_EQ(Read("F-inf\n.")->float_value(), -INFINITY);
  absl::Status s = ReadStatus("F1.5x\n.");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(s), "pickle: at byte 0 (FLOAT): could not convert '1.5x' to float");
}

// ---- str, bytes ----

TEST(ReaderStringTest, BinaryUnicode) {
  EXPECT_EQ(Read(P2("X"s + Le32(3) + "abc"))->str(), "abc");
  EXPECT_EQ(Read("\x80\x04\x8c\x02\xc3\xa9."s)->str(), "\xc3\xa9");
  EXPECT_EQ(Read("\x80\x04\x8d"s + Le64(1) + "z.")->str(), "z");
  EXPECT_EQ(Read(P2("X"s + Le32(3) + "\xed\xa0\x80"))->str(), "\xed\xa0\x80");  // a lone surrogate
}

TEST(ReaderStringTest, InvalidUtf8IsInvalid) {
  absl::Status s = ReadStatus(P2("X"s + Le32(2) + "\xc3("));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("(BINUNICODE): invalid UTF-8"));
}

TEST(ReaderStringTest, LengthPastTheEndIsDataLoss) {
  absl::Status s = ReadStatus(P2("X"s + Le32(10) + "abc"));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(Message(s), "pickle: at byte 2 (BINUNICODE): operand of 10 bytes but only 4 are left");
  absl::Status huge = ReadStatus("\x80\x04\x8e"s + Le64(uint64_t{1} << 62) + "ab.");
  EXPECT_EQ(huge.code(), absl::StatusCode::kDataLoss);
}

TEST(ReaderStringTest, MaxStringLength) {
  ReadOptions options;
  options.max_string_length = 2;
  absl::Status s = ReadStatus(P2("X"s + Le32(3) + "abc"), options);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(s), HasSubstr("operand of 3 bytes exceeds max_string_length 2"));
}

TEST(ReaderStringTest, TextUnicodeIsRawUnicodeEscape) {
  EXPECT_EQ(Read("Vh\xe9\\u65e5\\U0001f600\\x\n.")->str(), "h\xc3\xa9\xe6\x97\xa5\xf0\x9f\x98\x80\\x");
  EXPECT_EQ(Read("V\\u005c\\u000a\n.")->str(), "\\\n");
  absl::Status s = ReadStatus("V\\u12\n.");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("(UNICODE): truncated \\u escape"));
}

TEST(ReaderStringTest, TextStringIsEscapeDecodedRawBytes) {
  EXPECT_EQ(Read("S'a\\'b\\n\\x41\\101\\\\'\n.")->str(), "a'b\nAA\\");
  EXPECT_EQ(Read("S\"q\"\n.")->str(), "q");
  EXPECT_EQ(Read("S'\\xff'\n.")->str(), "\xff");  // not UTF-8: raw bytes, as the brief asks
  absl::Status s = ReadStatus("Sabc\n.");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(s), "pickle: at byte 0 (STRING): the STRING opcode argument must be quoted");
}

TEST(ReaderStringTest, BinStringsHoldRawBytes) {
  ValuePtr v = Read(P2("U\x02\xff\x00"s));
  EXPECT_TRUE(v->is(Kind::kStr));
  EXPECT_EQ(v->str(), "\xff\x00"s);
  EXPECT_EQ(Read(P2("T"s + Le32(2) + "hi"))->str(), "hi");
  EXPECT_EQ(ReadStatus(P2("T\xff\xff\xff\xff")).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ReaderStringTest, BytesAndByteArray) {
  ValuePtr b = Read("\x80\x03" "C\x02\x00\x01."s);
  EXPECT_TRUE(b->is(Kind::kBytes));
  EXPECT_EQ(b->str(), "\x00\x01"s);
  EXPECT_EQ(Read("\x80\x03" "B"s + Le32(1) + "z.")->str(), "z");
  EXPECT_EQ(Read("\x80\x04\x8e"s + Le64(2) + "yz.")->str(), "yz");
  ValuePtr ba = Read("\x80\x05\x96"s + Le64(2) + "\xff\x01.");
  EXPECT_TRUE(ba->is(Kind::kByteArray));
  EXPECT_EQ(ba->str(), "\xff\x01");
}

TEST(ReaderScalarTest, NoneTrueFalse) {
  EXPECT_TRUE(Read(P2("N"))->is_none());
  EXPECT_TRUE(Read(P2("\x88"))->bool_value());
  EXPECT_FALSE(Read(P2("\x89"))->bool_value());
  EXPECT_TRUE(Read(P2("\x89"))->is(Kind::kBool));
}

// ---- containers ----

TEST(ReaderContainerTest, Tuples) {
  EXPECT_TRUE(Read(P2(")"))->is(Kind::kTuple));
  EXPECT_EQ(Read(P2(")"))->items().size(), 0u);
  ValuePtr t3 = Read(P2("K\x01K\x02K\x03\x87"));
  ASSERT_EQ(t3->items().size(), 3u);
  EXPECT_EQ(t3->items()[2]->int_value(), 3);
  EXPECT_EQ(Read(P2("K\x01\x85"))->items().size(), 1u);
  EXPECT_EQ(Read(P2("K\x01K\x02\x86"))->items().size(), 2u);
  EXPECT_EQ(Read(P2("(K\x01K\x02K\x03K\x04t"))->items().size(), 4u);
}

TEST(ReaderContainerTest, StackUnderflow) {
  absl::Status s = ReadStatus(P2("K\x01\x86"));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(s), "pickle: at byte 4 (TUPLE2): stack underflow: needs 2 values, has 1");
  absl::Status above_mark = ReadStatus(P2("K\x01(K\x02\x86"));
  EXPECT_THAT(Message(above_mark), HasSubstr("needs 2 values above the last MARK, has 1"));
  EXPECT_THAT(Message(ReadStatus(P2("t"))), HasSubstr("(TUPLE): no MARK on the stack"));
}

TEST(ReaderContainerTest, Lists) {
  ValuePtr l = Read(P2("]K\x01" "a(K\x02K\x03" "e"));
  ASSERT_TRUE(l->is(Kind::kList));
  ASSERT_EQ(l->items().size(), 3u);
  EXPECT_EQ(l->items()[2]->int_value(), 3);
  EXPECT_EQ(Read("(I1\nI2\nl.")->items().size(), 2u);
  absl::Status s = ReadStatus(P2(")K\x01" "a"));
  EXPECT_EQ(Message(s), "pickle: at byte 5 (APPEND): cannot append to a tuple");
  EXPECT_THAT(Message(ReadStatus(P2("(K\x01" "e"))), HasSubstr("(APPENDS): stack underflow"));
}

TEST(ReaderContainerTest, Dicts) {
  ValuePtr dict = Read(P2("}(X\x01\x00\x00\x00" "aK\x01X\x01\x00\x00\x00" "bK\x02uX\x01\x00\x00\x00" "cK\x03s"s));
  ASSERT_TRUE(dict->is(Kind::kDict));
  EXPECT_FALSE(dict->ordered_dict());
  ASSERT_EQ(dict->dict_items().size(), 3u);
  EXPECT_EQ(dict->DictGet("b")->int_value(), 2);
  EXPECT_EQ(Read("(S'k'\nI1\nd.")->DictGet("k")->int_value(), 1);
}

TEST(ReaderContainerTest, DictKeysMergeAsInPython) {
  // {1: 'a', 1.0: 'b', True: 'c'} is {1: 'c'} in Python.
  ValuePtr d = Read(P2("}(K\x01X\x01\x00\x00\x00" "aG\x3f\xf0\x00\x00\x00\x00\x00\x00X\x01\x00\x00\x00" "b\x88X\x01\x00\x00\x00" "cu"s));
  ASSERT_EQ(d->dict_items().size(), 1u);
  EXPECT_TRUE(d->dict_items()[0].first->is(Kind::kInt));
  EXPECT_EQ(d->dict_items()[0].second->str(), "c");
}

TEST(ReaderContainerTest, DictErrors) {
  absl::Status odd = ReadStatus(P2("}(K\x01u"));
  EXPECT_EQ(Message(odd), "pickle: at byte 6 (SETITEMS): odd number of items (1)");
  absl::Status unhashable = ReadStatus(P2("}]K\x01s"));
  EXPECT_EQ(unhashable.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(unhashable), "pickle: at byte 6 (SETITEM): unhashable list as dict key");
  EXPECT_THAT(Message(ReadStatus(P2("(]\x85K\x01" "d"))), HasSubstr("unhashable tuple as dict key"));
  EXPECT_THAT(Message(ReadStatus(P2("]K\x01K\x02s"))), HasSubstr("cannot set items of a list"));
  EXPECT_THAT(Message(ReadStatus(P2("(K\x01" "d"))), HasSubstr("(DICT): odd number of items (1)"));
}

TEST(ReaderContainerTest, SetsAndFrozenSets) {
  ValuePtr s = Read("\x80\x04\x8f(K\x01K\x02K\x01\x90."s);
  ASSERT_TRUE(s->is(Kind::kSet));
  EXPECT_EQ(s->set_items().size(), 2u);
  ValuePtr fs = Read("\x80\x04(K\x03\x91."s);
  ASSERT_TRUE(fs->is(Kind::kFrozenSet));
  EXPECT_EQ(fs->set_items().size(), 1u);
  EXPECT_THAT(Message(ReadStatus("\x80\x04](K\x01\x90."s)), HasSubstr("(ADDITEMS): cannot add items to a list"));
  EXPECT_THAT(Message(ReadStatus("\x80\x04\x8f(]\x90."s)), HasSubstr("unhashable list as set item"));
}

// ---- stack manipulation ----

TEST(ReaderStackTest, PopPopMarkDup) {
  EXPECT_EQ(Read(P2("K\x01K\x02" "0"))->int_value(), 1);
  EXPECT_EQ(Read(P2("K\x01(K\x02K\x03" "1"))->int_value(), 1);
  ValuePtr dup = Read(P2("]2\x86"));
  EXPECT_EQ(dup->items()[0].get(), dup->items()[1].get());
  // POP with nothing above the last MARK drops the MARK, as CPython does.
  EXPECT_EQ(Read(P2("K\x05(0"))->int_value(), 5);
  EXPECT_THAT(Message(ReadStatus(P2("0"))), HasSubstr("(POP): stack underflow"));
  EXPECT_THAT(Message(ReadStatus(P2("2"))), HasSubstr("(DUP): stack underflow"));
}

// ---- memo ----

TEST(ReaderMemoTest, PutGetVariantsShareTheValue) {
  ValuePtr bin = Read(P2("]q\x05h\x05\x86"));
  EXPECT_EQ(bin->items()[0].get(), bin->items()[1].get());
  ValuePtr lng = Read(P2("]r\x00\x01\x00\x00j\x00\x01\x00\x00\x86"s));
  EXPECT_EQ(lng->items()[0].get(), lng->items()[1].get());
  ValuePtr text = Read("((lp12\ng12\nt.");
  EXPECT_EQ(text->items()[0].get(), text->items()[1].get());
  ValuePtr memoize = Read("\x80\x04(]\x94]\x94" "1h\x00h\x01h\x01\x87."s);  // MEMOIZE counts entries
  EXPECT_EQ(memoize->items()[1].get(), memoize->items()[2].get());
  EXPECT_NE(memoize->items()[0].get(), memoize->items()[2].get());
}

TEST(ReaderMemoTest, UndefinedKeyMessage) {
  const std::string body = "\x80\x02]q\x00h\x09."s;
  absl::Status s = ReadStatus(body);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(s), "pickle: at byte 5 (BINGET): memo key 9 is not defined");
}

TEST(ReaderMemoTest, SparseKeysAndCaps) {
  ValuePtr v = Read(P2("Nr\xff\xff\xff\x00" "0j\xff\xff\xff\x00"s));  // key 2**24 - 1
  EXPECT_TRUE(v->is_none());
  ReadOptions options;
  options.max_memo_entries = 100;
  absl::Status s = ReadStatus(P2("Nq\x64"), options);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Message(s), "pickle: at byte 3 (BINPUT): memo key 100 beyond max_memo_entries 100");
  EXPECT_EQ(Message(ReadStatus("Np-1\n.")), "pickle: at byte 1 (PUT): invalid memo key '-1'");
  EXPECT_THAT(Message(ReadStatus(P2("q\x00N"s))), HasSubstr("(BINPUT): stack underflow"));
}

// ---- globals and objects ----

TEST(ReaderGlobalTest, Protocol2BuiltinNamesArePython3Names) {
  ValuePtr g = Read(P2("c__builtin__\ngetattr\n"));
  EXPECT_TRUE(g->IsGlobal("builtins", "getattr"));
  EXPECT_TRUE(Read(P2("ccopy_reg\n_reconstructor\n"))->IsGlobal("copyreg", "_reconstructor"));
  EXPECT_TRUE(Read(P2("c__builtin__\nxrange\n"))->IsGlobal("builtins", "range"));
  // Protocol 3+ streams are written by Python 3: names are taken as they are.
  EXPECT_TRUE(Read("\x80\x03" "c__builtin__\nset\n."s)->IsGlobal("__builtin__", "set"));
}

TEST(ReaderGlobalTest, StackGlobal) {
  ValuePtr g = Read("\x80\x04\x8c\x05torch\x8c\x04Size\x93."s);
  EXPECT_TRUE(g->IsGlobal("torch", "Size"));
  absl::Status s = ReadStatus("\x80\x04K\x01\x8c\x01x\x93."s);
  EXPECT_EQ(Message(s), "pickle: at byte 7 (STACK_GLOBAL): module and name must be str, found int and str");
}

TEST(ReaderObjectTest, ReduceNewObjNewObjExInstObj) {
  ValuePtr r = Read(P2("cm\nf\nK\x01\x85R"));
  ASSERT_TRUE(r->is(Kind::kObject));
  EXPECT_EQ(r->object().how, ObjectHow::kReduce);
  EXPECT_TRUE(r->IsObjectOf("m", "f"));
  EXPECT_EQ(r->object().args->items()[0]->int_value(), 1);

  ValuePtr n = Read(P2("cm\nC\n)\x81"));
  EXPECT_EQ(n->object().how, ObjectHow::kNewObj);
  EXPECT_TRUE(n->object().args->items().empty());

  ValuePtr ex = Read("\x80\x04\x8c\x01m\x8c\x01" "C\x93K\x01\x85}(\x8c\x01kK\x02u\x92."s);
  EXPECT_EQ(ex->object().how, ObjectHow::kNewObjEx);
  EXPECT_EQ(ex->object().kwargs->DictGet("k")->int_value(), 2);

  ValuePtr inst = Read("(I1\nimod\nCls\n.");
  EXPECT_EQ(inst->object().how, ObjectHow::kInst);
  EXPECT_TRUE(inst->IsObjectOf("mod", "Cls"));
  EXPECT_EQ(inst->object().args->items().size(), 1u);

  ValuePtr obj = Read(P2("(cm\nC\nK\x01K\x02o"));
  EXPECT_EQ(obj->object().how, ObjectHow::kInst);
  EXPECT_EQ(obj->object().args->items().size(), 2u);
  EXPECT_THAT(Message(ReadStatus(P2("(o"))), HasSubstr("(OBJ): no class between MARK and OBJ"));
}

TEST(ReaderObjectTest, OperandTypes) {
  EXPECT_EQ(Message(ReadStatus(P2("cm\nf\nK\x01R"))),
            "pickle: at byte 9 (REDUCE): arguments must be a tuple, found int");
  EXPECT_THAT(Message(ReadStatus(P2("cm\nf\nK\x01\x81"))), HasSubstr("(NEWOBJ): arguments must be a tuple"));
  EXPECT_THAT(Message(ReadStatus(P2("cm\nf\n)]\x92"))),
              HasSubstr("(NEWOBJ_EX): arguments must be a tuple and a dict, found tuple and list"));
}

TEST(ReaderObjectTest, BuildSetsStateOnce) {
  ValuePtr o = Read(P2("cm\nC\n)\x81}X\x01\x00\x00\x00" "aK\x01sb"s));
  ASSERT_NE(o->object().state, nullptr);
  EXPECT_EQ(o->object().state->DictGet("a")->int_value(), 1);
  absl::Status twice = ReadStatus(P2("cm\nC\n)\x81NbNb"));
  EXPECT_EQ(twice.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(twice), "pickle: at byte 12 (BUILD): the object already has a state (second BUILD)");
  EXPECT_EQ(Message(ReadStatus(P2("]Nb"))),
            "pickle: at byte 4 (BUILD): BUILD on a list (only objects and OrderedDicts have state)");
  EXPECT_THAT(Message(ReadStatus(P2("}Nb"))), HasSubstr("BUILD on a dict"));
}

TEST(ReaderObjectTest, BuildOnOrderedDictKeepsItsAttributes) {
  // torch state dicts: OrderedDict() + SETITEMS + BUILD {'_metadata': ...}
  ValuePtr d = Read(P2("ccollections\nOrderedDict\n)R(K\x01K\x02u}X\x09\x00\x00\x00_metadataNsb"s));
  ASSERT_TRUE(d->is(Kind::kDict));
  EXPECT_TRUE(d->ordered_dict());
  EXPECT_EQ(d->dict_items().size(), 1u);
  ASSERT_NE(d->dict_state(), nullptr);
  EXPECT_TRUE(d->dict_state()->DictGet("_metadata")->is_none());
  EXPECT_THAT(Message(ReadStatus(P2("ccollections\nOrderedDict\n)RNbNb"))),
              HasSubstr("the OrderedDict already has a state"));
}

TEST(ReaderObjectTest, ItemsOntoObjectsGoToListAndDictItems) {
  ValuePtr o = Read(P2("cm\nC\n)\x81(K\x01K\x02" "eK\x03" "a(K\x04K\x05uK\x06K\x07s"));
  ASSERT_EQ(o->object().list_items.size(), 3u);
  EXPECT_EQ(o->object().list_items[2]->int_value(), 3);
  ASSERT_EQ(o->object().dict_items.size(), 2u);
  EXPECT_EQ(o->object().dict_items[1].first->int_value(), 6);
}

TEST(ReaderObjectTest, PersistentIds) {
  ValuePtr p = Read(P2("(X\x07\x00\x00\x00storageK\x01tQ"s));
  ASSERT_TRUE(p->is(Kind::kPersistentId));
  EXPECT_EQ(p->pid()->items()[0]->str(), "storage");
  ValuePtr text = Read("Pkey_0\n.");
  EXPECT_EQ(text->pid()->str(), "key_0");
  EXPECT_EQ(Message(ReadStatus("Pk\xe9\n.")),
            "pickle: at byte 0 (PERSID): persistent IDs in protocol 0 must be ASCII strings");
}

// ---- data constructors (value.h) ----

TEST(ReaderDataConstructorTest, OrderedDict) {
  ValuePtr d = Read(P2("ccollections\nOrderedDict\n)R(X\x01\x00\x00\x00" "bK\x01X\x01\x00\x00\x00" "aK\x02u"s));
  ASSERT_TRUE(d->is(Kind::kDict));
  EXPECT_TRUE(d->ordered_dict());
  EXPECT_EQ(d->dict_items()[0].first->str(), "b");
  // Python 2's encoding: OrderedDict([[key, value], ...]).
  ValuePtr py2 = Read(P2("ccollections\nOrderedDict\n](K\x01K\x02la\x85R"));
  EXPECT_TRUE(py2->ordered_dict());
  EXPECT_EQ(py2->DictGet(Value::Int(1))->int_value(), 2);
}

TEST(ReaderDataConstructorTest, SetsFromReduce) {
  ValuePtr s = Read(P2("c__builtin__\nset\n](K\x01K\x02" "e\x85R"));
  ASSERT_TRUE(s->is(Kind::kSet));
  EXPECT_EQ(s->set_items().size(), 2u);
  EXPECT_TRUE(Read("\x80\x03" "cbuiltins\nfrozenset\n)R."s)->is(Kind::kFrozenSet));
}

TEST(ReaderDataConstructorTest, CodecsEncodeIsBytes) {
  ValuePtr b = Read(P2("c_codecs\nencode\nX\x03\x00\x00\x00\xc3\xa9" "AX\x06\x00\x00\x00latin1\x86R"s));
  ASSERT_TRUE(b->is(Kind::kBytes));
  EXPECT_EQ(b->str(), "\xe9" "A");
  absl::Status wide = ReadStatus(P2("c_codecs\nencode\nX\x02\x00\x00\x00\xc4\x80X\x06\x00\x00\x00latin1\x86R"s));
  EXPECT_EQ(wide.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(wide), HasSubstr("(REDUCE): _codecs.encode: 'latin-1' codec can't encode character U+0100"));
  ValuePtr utf8 = Read(P2("c_codecs\nencode\nX\x01\x00\x00\x00xX\x05\x00\x00\x00utf-8\x86R"s));
  EXPECT_TRUE(utf8->is(Kind::kObject));  // not a latin-1 encode: kept as data
}

TEST(ReaderDataConstructorTest, BytesAndByteArrayConstructors) {
  EXPECT_TRUE(Read(P2("c__builtin__\nbytes\n)R"))->is(Kind::kBytes));
  ValuePtr ba = Read(P2("c__builtin__\nbytearray\nX\x02\x00\x00\x00\xc3\xbfX\x07\x00\x00\x00latin-1\x86R"s));
  ASSERT_TRUE(ba->is(Kind::kByteArray));
  EXPECT_EQ(ba->str(), "\xff");
  ValuePtr from_bytes = Read("\x80\x03" "cbuiltins\nbytearray\nC\x01z\x85R."s);
  EXPECT_EQ(from_bytes->str(), "z");
  EXPECT_TRUE(from_bytes->is(Kind::kByteArray));
}

TEST(ReaderDataConstructorTest, NewObjExWrittenAtProtocol2) {
  ValuePtr o = Read(P2("ccopy_reg\n__newobj_ex__\ncm\nC\n)}\x87R"));
  ASSERT_TRUE(o->is(Kind::kObject));
  EXPECT_EQ(o->object().how, ObjectHow::kNewObjEx);
  EXPECT_TRUE(o->IsObjectOf("m", "C"));
}

// ---- self-references and nesting ----

TEST(ReaderSafetyTest, SelfReferencesAreRejected) {
  for (const std::string& body : {
           "]2a"s,                       // EMPTY_LIST DUP APPEND
           "]q\x00h\x00" "a"s,           // via the memo
           "]q\x00]h\x00" "aa"s,         // L=[]; X=[L]; L.append(X)
           "}q\x00K\x01h\x00s"s,         // d[1] = d
           "cm\nC\n)\x81q\x00]h\x00" "ab"s,  // o.__setstate__([o])
       }) {
    absl::Status s = ReadStatus(P2(body));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(Message(s), HasSubstr("self-referencing structure")) << s;
  }
}

TEST(ReaderSafetyTest, SharedButAcyclicIsFine) {
  ValuePtr v = Read(P2("(]q\x00" "1]h\x00" "ah\x00\x86"s));  // ([L], L)
  EXPECT_EQ(v->items()[0]->items()[0].get(), v->items()[1].get());
}

TEST(ReaderSafetyTest, DeepNestingIsCapped) {
  std::string body;
  for (int i = 0; i < 100000; ++i) body += "]";
  for (int i = 0; i < 99999; ++i) body += "a";
  absl::Status s = ReadStatus(P2(body));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(s), HasSubstr("nesting deeper than max_nesting 512"));
  ReadOptions unlimited;
  unlimited.max_nesting = 1000000;
  ValuePtr deep = Read(P2(body), unlimited);  // destroyed without deep recursion
  EXPECT_TRUE(deep->is(Kind::kList));
}

TEST(ReaderSafetyTest, NestingBuiltThroughSharedContainersIsCapped) {
  // Lists L0..Ln are memoized first, then linked L0 <- L1 <- ... through GETs:
  // each APPEND alone adds one level, the chain is n deep.
  const int n = 600;
  std::string body = "(";
  for (int i = 0; i < n; ++i) body += "]r" + Le32(i);
  body += "1";
  for (int i = 0; i < n - 1; ++i) body += "j" + Le32(i) + "j" + Le32(i + 1) + "a0";
  body += "j" + Le32(0);
  absl::Status s = ReadStatus(P2(body));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(Message(s), HasSubstr("nesting deeper than max_nesting 512"));
  ReadOptions options;
  options.max_nesting = 1000;
  EXPECT_TRUE(Read(P2(body), options)->is(Kind::kList));
}

TEST(ReaderSafetyTest, StackValueAndVisitCaps) {
  ReadOptions options;
  options.max_stack_depth = 10;
  EXPECT_EQ(ReadStatus(P2(std::string(20, '(')), options).code(), absl::StatusCode::kResourceExhausted);
  ReadOptions values;
  values.max_values = 5;
  absl::Status s = ReadStatus(P2("N222222"), values);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Message(s), HasSubstr("more than max_values 5 values"));
  ReadOptions visits;
  visits.max_self_reference_visits = 3;
  // A shared list gets a nested list appended: the check visits it.
  absl::Status v = ReadStatus(P2("]q\x00h\x00]]]]aaaa0h\x00"s), visits);
  EXPECT_EQ(v.code(), absl::StatusCode::kResourceExhausted) << v;
}

// Hostile input: every truncation and thousands of byte mutations of a rich
// pickle must give a value or an error, never a crash (also run under ASan).
TEST(ReaderRobustnessTest, TruncatedAndMutatedPicklesNeverCrash) {
  // A torch-like state dict: OrderedDict + _metadata, a tensor with a
  // persistent id, shared globals and strs, a set, bytes, a big int.
  ValuePtr storage = Value::PersistentId(Value::Tuple(
      {Value::Str("storage"), Value::Global("torch", "FloatStorage"), Value::Str("0"), Value::Str("cpu"), Value::Int(4)}));
  Object tensor;
  tensor.callable = Value::Global("torch._utils", "_rebuild_tensor_v2");
  tensor.args = Value::Tuple({storage, Value::Int(0), Value::Tuple({Value::Int(2), Value::Int(2)}),
                              Value::Tuple({Value::Int(2), Value::Int(1)}), Value::Bool(false), Value::MakeDict(true)});
  ValuePtr set = Value::MakeSet();
  set->SetAdd(Value::BigInt("\x00\x00\x00\x00\x00\x00\x00\x80\x00"s));
  set->SetAdd(Value::Float(1.0));
  ValuePtr sd = Value::MakeDict(true);
  sd->DictSet(Value::Str("w"), Value::MakeObject(tensor));
  sd->DictSet(Value::Str("s"), set);
  sd->DictSet(Value::Str("z"), Value::Bytes("\xff"));
  sd->DictSet(Value::Str("l"), Value::List({Value::None(), Value::Str("w"), Value::Tuple({})}));
  ValuePtr metadata = Value::MakeDict();
  metadata->DictSet(Value::Str("_metadata"), Value::None());
  sd->set_dict_state(metadata);
  const std::string good = Pickle(*sd).value();
  ASSERT_TRUE(Unpickle(good).ok()) << Unpickle(good).status();
  for (size_t n = 0; n < good.size(); ++n) {
    absl::StatusOr<ValuePtr> v = Unpickle(good.substr(0, n));
    EXPECT_FALSE(v.ok()) << n;
  }
  std::mt19937 rng(1234);
  const std::string_view opcodes = "()]}eutsqhR.0123\x85\x86\x87";  // bytes that restructure the stack
  int parsed = 0;
  for (int round = 0; round < 20000; ++round) {
    std::string bad = good;
    for (int k = 1 + static_cast<int>(rng() % 3); k > 0; --k) {
      bad[rng() % bad.size()] = static_cast<char>(rng() % 3 == 0 ? opcodes[rng() % opcodes.size()] : rng());
    }
    parsed += Unpickle(bad).ok();
  }
  std::printf("%d of 20000 mutated pickles still parsed\n", parsed);
}

// A 100 MB pickle of ints (what a big int list is) parses in about a second.
// A long list of ints parses whole (its speed is measured by
// bench/pickle_reader_bench, not here: a test asserts no duration).
TEST(ReaderTest, SixteenMegabytesOfInts) {
  std::string bytes = "\x80\x02]";
  bytes.reserve(17 << 20);
  int64_t x = 1;
  while (bytes.size() < (16 << 20)) {
    bytes += "(";
    for (int i = 0; i < 1000; ++i) {
      x = (x * 1103515245 + 12345) & 0x7fffffff;
      bytes += "J" + Le32(static_cast<uint32_t>(x));
    }
    bytes += "e";
  }
  bytes += ".";
  absl::StatusOr<ValuePtr> v = Unpickle(bytes);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ((*v)->items().size(), (bytes.size() - 4) / 5002 * 1000);
}

}  // namespace
}  // namespace ucp::pickle
