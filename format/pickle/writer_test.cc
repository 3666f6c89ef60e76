#include "format/pickle/writer.h"

#include <string>

#include "format/pickle/reader.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ucp::pickle {
namespace {

using namespace std::string_literals;
using ::testing::HasSubstr;

std::string Write(const Value& v) {
  absl::StatusOr<std::string> bytes = Pickle(v);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  return bytes.ok() ? *bytes : std::string();
}

// The body between "\x80\x02" and ".".
std::string Body(const Value& v) {
  const std::string bytes = Write(v);
  EXPECT_EQ(bytes.substr(0, 2), "\x80\x02");
  EXPECT_EQ(bytes.back(), '.');
  return bytes.size() >= 3 ? bytes.substr(2, bytes.size() - 3) : std::string();
}

std::string Message(const absl::Status& s) { return std::string(s.message()); }

ValuePtr RoundTrip(const Value& v) {
  absl::StatusOr<ValuePtr> back = Unpickle(Write(v));
  EXPECT_TRUE(back.ok()) << back.status();
  return back.ok() ? *back : Value::None();
}

ValuePtr Object3(ObjectHow how, ValuePtr args, ValuePtr state = nullptr) {
  Object o;
  o.callable = Value::Global("m", "C");
  o.how = how;
  o.args = std::move(args);
  o.state = std::move(state);
  return Value::MakeObject(std::move(o));
}

TEST(WriterScalarTest, IntEncodingsFollowCPython) {
  EXPECT_EQ(Body(*Value::Int(0)), "K\x00"s);
  EXPECT_EQ(Body(*Value::Int(255)), "K\xff");
  EXPECT_EQ(Body(*Value::Int(256)), "M\x00\x01"s);
  EXPECT_EQ(Body(*Value::Int(65536)), "J\x00\x00\x01\x00"s);
  EXPECT_EQ(Body(*Value::Int(-1)), "J\xff\xff\xff\xff");
  EXPECT_EQ(Body(*Value::Int(INT32_MIN)), "J\x00\x00\x00\x80"s);
  EXPECT_EQ(Body(*Value::Int(int64_t{1} << 31)), "\x8a\x05\x00\x00\x00\x80\x00"s);
  EXPECT_EQ(Body(*Value::Int(int64_t{INT32_MIN} - 1)), "\x8a\x05\xff\xff\xff\x7f\xff"s);
  EXPECT_EQ(Body(*Value::Int(INT64_MIN)), "\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80"s);
  const std::string big(300, '\x22');
  EXPECT_EQ(Body(*Value::BigInt(big)), "\x8b\x2c\x01\x00\x00"s + big);
}

TEST(WriterScalarTest, OtherScalars) {
  EXPECT_EQ(Body(*Value::None()), "N");
  EXPECT_EQ(Body(*Value::Bool(true)), "\x88");
  EXPECT_EQ(Body(*Value::Bool(false)), "\x89");
  EXPECT_EQ(Body(*Value::Float(1.5)), "G\x3f\xf8\x00\x00\x00\x00\x00\x00"s);
  EXPECT_EQ(Body(*Value::Float(-0.0)), "G\x80\x00\x00\x00\x00\x00\x00\x00"s);
}

TEST(WriterStringTest, StrIsMemoizedBinUnicode) {
  EXPECT_EQ(Body(*Value::Str("ab")), "X\x02\x00\x00\x00" "abq\x00"s);
  ValuePtr s = Value::Str("key");
  EXPECT_EQ(Body(*Value::List({s, s})), "]q\x00(X\x03\x00\x00\x00keyq\x01h\x01" "e"s);
}

TEST(WriterStringTest, OnlyTheEmptyStrIsSharedByContent) {
  // CPython has a single '' object; other equal strs are shared only when
  // they are the same object (torch's storage keys '0', '1' ... are not).
  const std::string body = Body(*Value::List({Value::Str(""), Value::Str(""), Value::Str("0"), Value::Str("0")}));
  EXPECT_EQ(body, "]q\x00(X\x00\x00\x00\x00q\x01h\x01X\x01\x00\x00\x00" "0q\x02X\x01\x00\x00\x00" "0q\x03" "e"s);
}

TEST(WriterStringTest, LatinTextOfBytesUsesCPythonCharacterSingletons) {
  // b'a' twice as distinct objects: the 'a' text is one singleton in CPython.
  const std::string body = Body(*Value::List({Value::Bytes("a"), Value::Bytes("a")}));
  EXPECT_EQ(body,
            "]q\x00(c_codecs\nencode\nq\x01X\x01\x00\x00\x00" "aq\x02X\x06\x00\x00\x00latin1q\x03\x86q\x04Rq\x05"
            "h\x01h\x02h\x03\x86q\x06Rq\x07" "e"s);
}

TEST(WriterStringTest, InvalidUtf8IsRefused) {
  absl::Status s = Pickle(*Value::Str("\xff")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("is not UTF-8"));
}

TEST(WriterStringTest, BytesGoThroughCodecsEncode) {
  EXPECT_EQ(Body(*Value::Bytes("\xe9z")),
            "c_codecs\nencode\nq\x00X\x03\x00\x00\x00\xc3\xa9zq\x01X\x06\x00\x00\x00latin1q\x02\x86q\x03Rq\x04"s);
  // The second one reuses the global and the interned 'latin1'.
  const std::string two = Body(*Value::List({Value::Bytes("ab"), Value::Bytes("cd")}));
  EXPECT_THAT(two, HasSubstr("X\x02\x00\x00\x00" "cdq\x06h\x03\x86"s));
  EXPECT_EQ(Body(*Value::Bytes("")), "c__builtin__\nbytes\nq\x00)Rq\x01"s);
}

TEST(WriterStringTest, ByteArrayIsBytearrayOfBytes) {
  // What CPython 3.11's save_bytearray writes below protocol 5.
  EXPECT_EQ(Body(*Value::ByteArray("\xff")),
            "c__builtin__\nbytearray\nq\x00" "c_codecs\nencode\nq\x01X\x02\x00\x00\x00\xc3\xbfq\x02"
            "X\x06\x00\x00\x00latin1q\x03\x86q\x04Rq\x05\x85q\x06Rq\x07"s);
  EXPECT_EQ(Body(*Value::ByteArray("")), "c__builtin__\nbytearray\nq\x00)Rq\x01"s);
}

TEST(WriterContainerTest, Tuples) {
  EXPECT_EQ(Body(*Value::Tuple({})), ")");
  EXPECT_EQ(Body(*Value::Tuple({Value::Int(1)})), "K\x01\x85q\x00"s);
  EXPECT_EQ(Body(*Value::Tuple({Value::Int(1), Value::Int(2), Value::Int(3)})), "K\x01K\x02K\x03\x87q\x00"s);
  EXPECT_EQ(Body(*Value::Tuple({Value::Int(1), Value::Int(2), Value::Int(3), Value::Int(4)})),
            "(K\x01K\x02K\x03K\x04tq\x00"s);
}

TEST(WriterContainerTest, ListsBatchLikeCPython) {
  EXPECT_EQ(Body(*Value::List({})), "]q\x00"s);
  EXPECT_EQ(Body(*Value::List({Value::Int(7)})), "]q\x00K\x07" "a"s);
  EXPECT_EQ(Body(*Value::List({Value::Int(7), Value::Int(8)})), "]q\x00(K\x07K\x08" "e"s);
  std::vector<ValuePtr> items(1001, Value::None());
  const std::string body = Body(*Value::List(items));
  EXPECT_EQ(body, "]q\x00("s + std::string(1000, 'N') + "e(Ne");  // C pickler: a last batch of one is MARK..APPENDS
}

TEST(WriterContainerTest, DictsBatchLikeCPython) {
  EXPECT_EQ(Body(*Value::MakeDict()), "}q\x00"s);
  ValuePtr one = Value::MakeDict();
  one->DictSet(Value::Int(1), Value::None());
  EXPECT_EQ(Body(*one), "}q\x00K\x01Ns"s);
  ValuePtr thousand = Value::MakeDict();
  for (int i = 0; i < 1000; ++i) thousand->DictSet(Value::Int(i), Value::None());
  const std::string body = Body(*thousand);
  EXPECT_EQ(body.substr(body.size() - 4), "Nu(u") << "CPython ends n*1000 dicts with an empty MARK SETITEMS";
}

TEST(WriterContainerTest, OrderedDictIsReduceThenSetItemsThenBuild) {
  ValuePtr d = Value::MakeDict(/*ordered_dict=*/true);
  d->DictSet(Value::Int(1), Value::Int(2));
  EXPECT_EQ(Body(*d), "ccollections\nOrderedDict\nq\x00)Rq\x01K\x01K\x02s"s);
  ValuePtr state = Value::MakeDict();
  state->DictSet(Value::Str("_metadata"), Value::None());
  d->set_dict_state(state);
  EXPECT_EQ(Body(*d), "ccollections\nOrderedDict\nq\x00)Rq\x01K\x01K\x02s}q\x02X\x09\x00\x00\x00_metadataq\x03Nsb"s);
  EXPECT_TRUE(DeepEqual(*RoundTrip(*d), *d));
}

TEST(WriterContainerTest, SetsAreReduceOfAList) {
  ValuePtr s = Value::MakeSet();
  s->SetAdd(Value::Int(1));
  EXPECT_EQ(Body(*s), "c__builtin__\nset\nq\x00]q\x01K\x01" "a\x85q\x02Rq\x03"s);
  ValuePtr fs = Value::MakeSet(/*frozen=*/true);
  EXPECT_EQ(Body(*fs), "c__builtin__\nfrozenset\nq\x00]q\x01\x85q\x02Rq\x03"s);
}

TEST(WriterGlobalTest, Python2NamesAndOneMemoEntryPerGlobal) {
  EXPECT_EQ(Body(*Value::Global("builtins", "getattr")), "c__builtin__\ngetattr\nq\x00"s);
  EXPECT_EQ(Body(*Value::Global("copyreg", "_reconstructor")), "ccopy_reg\n_reconstructor\nq\x00"s);
  EXPECT_EQ(Body(*Value::Global("builtins", "range")), "c__builtin__\nxrange\nq\x00"s);
  EXPECT_EQ(Body(*Value::Tuple({Value::Global("torch", "Size"), Value::Global("torch", "Size")})),
            "ctorch\nSize\nq\x00h\x00\x86q\x01"s);
  EXPECT_EQ(Pickle(*Value::Global("a\nb", "c")).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(WriterObjectTest, EachHowIsWrittenWithItsOpcode) {
  EXPECT_EQ(Body(*Object3(ObjectHow::kReduce, Value::Tuple({Value::Int(1)}))), "cm\nC\nq\x00K\x01\x85q\x01Rq\x02"s);
  EXPECT_EQ(Body(*Object3(ObjectHow::kNewObj, Value::Tuple({}), Value::None())), "cm\nC\nq\x00)\x81q\x01Nb"s);
  EXPECT_EQ(Body(*Object3(ObjectHow::kInst, Value::Tuple({}))), "cm\nC\nq\x00)Rq\x01"s);
  Object ex;
  ex.callable = Value::Global("m", "C");
  ex.how = ObjectHow::kNewObjEx;
  ex.args = Value::Tuple({});
  ex.kwargs = Value::MakeDict();
  ValuePtr newobj_ex = Value::MakeObject(ex);
  EXPECT_EQ(Body(*newobj_ex), "ccopy_reg\n__newobj_ex__\nq\x00" "cm\nC\nq\x01)}q\x02\x87q\x03Rq\x04"s);
  EXPECT_TRUE(DeepEqual(*RoundTrip(*newobj_ex), *newobj_ex));
}

TEST(WriterObjectTest, ItemsThenState) {
  ValuePtr o = Object3(ObjectHow::kNewObj, Value::Tuple({}), Value::Int(9));
  o->mutable_object().list_items = {Value::Int(1)};
  o->mutable_object().dict_items = {{Value::Int(2), Value::Int(3)}, {Value::Int(4), Value::Int(5)}};
  EXPECT_EQ(Body(*o), "cm\nC\nq\x00)\x81q\x01K\x01" "a(K\x02K\x03K\x04K\x05uK\x09" "b"s);
  EXPECT_TRUE(DeepEqual(*RoundTrip(*o), *o));
}

TEST(WriterObjectTest, PersistentIdIsNotMemoized) {
  ValuePtr p = Value::PersistentId(Value::Tuple({Value::Str("storage")}));
  EXPECT_EQ(Body(*Value::List({p, p})), "]q\x00(X\x07\x00\x00\x00storageq\x01\x85q\x02Qh\x02Qe"s);
}

TEST(WriterMemoTest, SharedValuesAreFetchedAndStayShared) {
  ValuePtr inner = Value::List({Value::Int(1)});
  ValuePtr outer = Value::Tuple({inner, inner, Value::Tuple({inner})});
  ValuePtr back = RoundTrip(*outer);
  EXPECT_TRUE(DeepEqual(*back, *outer));
  EXPECT_EQ(back->items()[0].get(), back->items()[1].get());
  EXPECT_EQ(back->items()[2]->items()[0].get(), back->items()[0].get());
}

TEST(WriterMemoTest, LongBinPutPastIndex255) {
  std::vector<ValuePtr> strs;
  for (int i = 0; i < 300; ++i) strs.push_back(Value::Str("s" + std::to_string(i)));
  strs.push_back(strs[299]);
  const std::string bytes = Write(*Value::List(strs));
  EXPECT_THAT(bytes, HasSubstr("r\x00\x01\x00\x00"s));  // LONG_BINPUT 256
  EXPECT_THAT(bytes, HasSubstr("j\x2c\x01\x00\x00" "e"s));  // LONG_BINGET 300
  EXPECT_TRUE(DeepEqual(*Unpickle(bytes).value(), *Value::List(strs)));
}

TEST(WriterErrorTest, SelfReferencesAreRefused) {
  ValuePtr list = Value::List({});
  list->mutable_items().push_back(list);
  absl::Status s = Pickle(*list).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("self-referencing structure: a list contains itself"));
  list->mutable_items().clear();  // break the cycle so it is freed

  ValuePtr tuple = Value::Tuple({});
  tuple->mutable_items().push_back(Value::List({tuple}));
  EXPECT_THAT(Message(Pickle(*tuple).status()), HasSubstr("self-referencing structure"));
  tuple->mutable_items().clear();
}

TEST(WriterErrorTest, NestingIsCapped) {
  ValuePtr v = Value::None();
  for (int i = 0; i < 600; ++i) v = Value::List({v});
  absl::Status s = Pickle(*v).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("nesting deeper than max_nesting 512"));
  WriteOptions options;
  options.max_nesting = 700;
  EXPECT_TRUE(Pickle(*v, options).ok());
}

TEST(WriterErrorTest, UnencodableValues) {
  ValuePtr d = Value::MakeDict();
  d->DictSet(Value::List({}), Value::None());
  EXPECT_THAT(Message(Pickle(*d).status()), HasSubstr("unhashable dict key []"));
  ValuePtr s = Value::MakeSet();
  s->SetAdd(Value::Tuple({Value::MakeDict()}));
  EXPECT_THAT(Message(Pickle(*s).status()), HasSubstr("unhashable set item"));
  EXPECT_THAT(Message(Pickle(*Object3(ObjectHow::kReduce, Value::List({}))).status()),
              HasSubstr("args must be a tuple"));
  ValuePtr kw = Object3(ObjectHow::kReduce, Value::Tuple({}));
  kw->mutable_object().kwargs = Value::MakeDict();
  EXPECT_THAT(Message(Pickle(*kw).status()), HasSubstr("kwargs need NEWOBJ_EX"));
  ValuePtr plain = Value::MakeDict();
  plain->set_dict_state(Value::MakeDict());
  EXPECT_THAT(Message(Pickle(*plain).status()), HasSubstr("a plain dict cannot have a state"));
  EXPECT_THAT(Message(Pickle(*Value::List({nullptr})).status()), HasSubstr("null ValuePtr"));
  WriteOptions protocol4;
  protocol4.protocol = 4;
  EXPECT_EQ(Pickle(*Value::None(), protocol4).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(WriterRoundTripTest, EveryKind) {
  ValuePtr d = Value::MakeDict();
  d->DictSet(Value::Str("none"), Value::None());
  d->DictSet(Value::Int(-5), Value::Float(2.5));
  d->DictSet(Value::Tuple({Value::Int(1), Value::Str("x")}), Value::BigInt(std::string(20, '\x7f')));
  d->DictSet(Value::Bytes("\x00\xff"s), Value::ByteArray("ab"));
  d->DictSet(Value::Global("m", "n"), Value::PersistentId(Value::Str("p")));
  ValuePtr od = Value::MakeDict(true);
  od->DictSet(Value::Float(0.5), Value::MakeSet(true));
  d->DictSet(Value::Str("od"), od);
  ValuePtr back = RoundTrip(*d);
  EXPECT_TRUE(DeepEqual(*back, *d)) << back->DebugString(1000);
}

}  // namespace
}  // namespace ucp::pickle
