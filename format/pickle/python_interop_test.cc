// Interop with real CPython (Debian's /usr/bin/python3 3.11, numpy, torch):
// (a) what Python pickles at protocols 0-5 (testdata/pickle_interop.py
//     `cases`) reads into the expected tree, and protocol 2 pickles are
//     re-pickled byte for byte;
// (b) what the writer produces loads in Python (pickle, numpy, torch.load)
//     as the original.
#include <cstring>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "format/pickle/accessors.h"
#include "format/pickle/reader.h"
#include "format/pickle/test_util.h"
#include "format/pickle/writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ucp::pickle {
namespace {

using namespace std::string_literals;
using testing::CanonicalRepr;
using testing::Obj;

ValuePtr G(const std::string& module, const std::string& name) { return Value::Global(module, name); }

ValuePtr StrDict(std::vector<std::pair<std::string, ValuePtr>> items, bool ordered = false) {
  ValuePtr d = Value::MakeDict(ordered);
  for (auto& [k, v] : items) d->DictSet(Value::Str(k), std::move(v));
  return d;
}

ValuePtr Reconstructed(const std::string& cls, ValuePtr state) {
  return Obj(G("copyreg", "_reconstructor"), ObjectHow::kReduce, {G("__main__", cls), G("builtins", "object"), Value::None()},
             std::move(state));
}

class PythonInteropTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(testing::MakeTempDir("pickle_cases"));
    absl::StatusOr<std::string> out = testing::RunPython({testing::InteropScript(), "cases", *dir_});
    ASSERT_TRUE(out.ok()) << out.status();
    expected_ = new std::map<std::string, std::string>(testing::ParseTabbedLines(*out));
  }
  static void TearDownTestSuite() {
    delete dir_;
    delete expected_;
  }

  static std::string Bytes(const std::string& case_name, int protocol) {
    absl::StatusOr<std::string> bytes = ReadFileToString(absl::StrCat(*dir_, "/", case_name, ".p", protocol, ".pkl"));
    EXPECT_TRUE(bytes.ok()) << bytes.status();
    return bytes.ok() ? *bytes : std::string();
  }
  static ValuePtr Load(const std::string& case_name, int protocol) {
    absl::StatusOr<ValuePtr> v = Unpickle(Bytes(case_name, protocol));
    EXPECT_TRUE(v.ok()) << case_name << " protocol " << protocol << ": " << v.status();
    return v.ok() ? *v : Value::Str("<unreadable>");
  }

  static std::string* dir_;
  static std::map<std::string, std::string>* expected_;  // data case -> canonical repr
};
std::string* PythonInteropTest::dir_ = nullptr;
std::map<std::string, std::string>* PythonInteropTest::expected_ = nullptr;

TEST_F(PythonInteropTest, DataCasesReadAsPythonBuiltThemAtEveryProtocol) {
  ASSERT_GE(expected_->size(), 15u);
  for (const auto& [name, canonical] : *expected_) {
    for (int protocol = 0; protocol <= 5; ++protocol) {
      SCOPED_TRACE(absl::StrCat(name, " protocol ", protocol));
      ValuePtr v = Load(name, protocol);
      EXPECT_EQ(CanonicalRepr(*v), canonical);
      absl::StatusOr<std::string> again = Pickle(*v);
      ASSERT_TRUE(again.ok()) << again.status();
      absl::StatusOr<ValuePtr> back = Unpickle(*again);
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_TRUE(DeepEqual(**back, *v));
    }
  }
}

TEST_F(PythonInteropTest, SharedReferencesStayShared) {
  for (int protocol = 0; protocol <= 5; ++protocol) {
    ValuePtr v = Load("shared", protocol);
    ASSERT_EQ(v->items().size(), 3u);
    EXPECT_EQ(v->items()[0].get(), v->items()[1].get()) << protocol;
    EXPECT_EQ(v->items()[2]->DictGet("k"), v->items()[0].get()) << protocol;
  }
}

TEST_F(PythonInteropTest, ObjectsReadAsTheOpcodesBuiltThem) {
  const ValuePtr plain_state = StrDict({{"a", Value::Int(1)}, {"b", Value::Str("x")}});
  const ValuePtr args_state = StrDict({{"x", Value::Int(7)}, {"y", Value::Str("eight")}});
  const ValuePtr kwargs_state = StrDict({{"z", Value::Int(3)}});
  ValuePtr reduced = Obj(G("__main__", "Reduced"), ObjectHow::kReduce, {Value::Int(1), Value::Int(2)},
                         StrDict({{"s", Value::Int(3)}}));
  reduced->mutable_object().list_items = {Value::Int(10), Value::Int(11)};
  reduced->mutable_object().dict_items = {{Value::Str("k"), Value::Str("v")}};
  const ValuePtr enum_class = G("deepspeed.runtime.zero.config", "ZeroStageEnum");

  for (int protocol = 0; protocol <= 5; ++protocol) {
    SCOPED_TRACE(absl::StrCat("protocol ", protocol));
    const bool old = protocol < 2;
    auto expect = [&](const std::string& name, const ValuePtr& expected) {
      ValuePtr v = Load(name, protocol);
      EXPECT_TRUE(DeepEqual(*v, *expected)) << name << "\n  read:     " << CanonicalRepr(*v)
                                            << "\n  expected: " << CanonicalRepr(*expected);
    };
    expect("plain_object", old ? Reconstructed("Plain", plain_state)
                               : Obj(G("__main__", "Plain"), ObjectHow::kNewObj, {}, plain_state));
    expect("newobj_args", old ? Reconstructed("WithArgs", args_state)
                              : Obj(G("__main__", "WithArgs"), ObjectHow::kNewObj,
                                    {Value::Int(7), Value::Str("eight")}, args_state));
    if (old) {
      expect("newobj_kwargs", Reconstructed("WithKwargs", kwargs_state));
    } else if (protocol >= 4) {
      ValuePtr ex = Obj(G("__main__", "WithKwargs"), ObjectHow::kNewObjEx, {Value::Int(1)}, kwargs_state);
      ex->mutable_object().kwargs = StrDict({{"k", Value::Int(2)}});
      expect("newobj_kwargs", ex);
    } else {
      // Protocols 2-3: partial(WithKwargs.__new__, WithKwargs, 1, k=2)() + BUILD.
      ValuePtr v = Load("newobj_kwargs", protocol);
      ASSERT_TRUE(v->is(Kind::kObject));
      EXPECT_TRUE(v->object().callable->IsObjectOf("functools", "partial"));
      EXPECT_TRUE(DeepEqual(*v->object().state, *kwargs_state));
    }
    expect("reduce_items_state", reduced);
    ValuePtr by_name = Load("enum_getattr", protocol);
    EXPECT_TRUE(DeepEqual(*by_name, *Obj(G("builtins", "getattr"), ObjectHow::kReduce,
                                         {enum_class, Value::Str("optimizer_states")})))
        << CanonicalRepr(*by_name);
    EXPECT_EQ(AsZeroStage(*by_name).value(), 1);
    ValuePtr by_value = Load("enum_call", protocol);
    EXPECT_TRUE(DeepEqual(*by_value, *Obj(enum_class, ObjectHow::kReduce, {Value::Int(2)})));
    EXPECT_EQ(AsZeroStage(*by_value).value(), 2);
    auto storage = [&](const std::string& key) {
      return Value::PersistentId(protocol == 0 ? Value::Str("storage_" + key)
                                               : Value::Tuple({Value::Str("storage"), Value::Str(key), Value::Int(4)}));
    };
    expect("persistent", Value::List({storage("0"), storage("1"), Value::Int(5)}));
  }
}

TEST_F(PythonInteropTest, OutOfBandBuffersAreRefused) {
  absl::StatusOr<std::string> bytes = ReadFileToString(*dir_ + "/out_of_band.p5.pkl");
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(Unpickle(*bytes).status().code(), absl::StatusCode::kUnimplemented);
}

// The stretch goal: the writer is CPython's protocol 2 pickler for these trees.
TEST_F(PythonInteropTest, Protocol2PicklesAreReproducedByteForByte) {
  int compared = 0;
  for (const std::string& file : testing::ListDir(*dir_)) {
    if (file.size() < 7 || file.compare(file.size() - 7, 7, ".p2.pkl") != 0) continue;
    SCOPED_TRACE(file);
    absl::StatusOr<std::string> bytes = ReadFileToString(*dir_ + "/" + file);
    ASSERT_TRUE(bytes.ok());
    absl::StatusOr<ValuePtr> v = Unpickle(*bytes);
    ASSERT_TRUE(v.ok()) << v.status();
    absl::StatusOr<std::string> again = Pickle(**v);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(testing::Hex(*again), testing::Hex(*bytes));
    ++compared;
  }
  EXPECT_GE(compared, 20);
}

TEST_F(PythonInteropTest, PythonLoadsWhatTheWriterWrites) {
  const std::string out = testing::MakeTempDir("pickle_written");
  std::map<std::string, std::string> expected;
  // Python's objects, read (at protocols 0 and 4) and written back.
  for (const auto& [name, canonical] : *expected_) {
    for (int protocol : {0, 4}) {
      const std::string file = absl::StrCat(name, ".p", protocol, ".pkl");
      absl::StatusOr<std::string> bytes = Pickle(*Load(name, protocol));
      ASSERT_TRUE(bytes.ok()) << bytes.status();
      ASSERT_TRUE(WriteFileAtomic(out + "/" + file, *bytes).ok());
      expected[file] = canonical;
    }
  }
  // Trees built here: objects of classes Python does not have, every how.
  ValuePtr ex = Obj(G("ucptest", "C"), ObjectHow::kNewObjEx, {Value::Int(1)}, Value::Str("state"));
  ex->mutable_object().kwargs = StrDict({{"k", Value::Float(2.5)}});
  ValuePtr with_items = Obj(G("ucptest.sub", "D"), ObjectHow::kReduce, {Value::Str("arg")});
  with_items->mutable_object().list_items = {Value::Int(1), Value::None()};
  with_items->mutable_object().dict_items = {{Value::Int(2), Value::Bytes("b")}};
  ValuePtr od = StrDict({{"w", Value::Int(1)}}, /*ordered=*/true);
  od->set_dict_state(StrDict({{"_metadata", StrDict({{"", StrDict({{"version", Value::Int(1)}})}}, true)}}));
  const std::map<std::string, ValuePtr> built = {
      {"built_newobj_ex.pkl", ex},
      {"built_items.pkl", with_items},
      {"built_ordered_dict_state.pkl", od},
      {"built_enums.pkl", Value::List({MakeZeroStage(1, EnumEncoding::kGetattr), MakeZeroStage(2)})},
      {"built_deepspeed.pkl", Value::Tuple({MakeLossScaler(4.0), MakeFragmentAddress(6, 2), MakeTorchSize({3, 4}),
                                            Value::PersistentId(Value::Str("p"))})},
  };
  for (const auto& [file, tree] : built) {
    absl::StatusOr<std::string> bytes = Pickle(*tree);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    ASSERT_TRUE(WriteFileAtomic(out + "/" + file, *bytes).ok());
    expected[file] = CanonicalRepr(*tree);
  }
  absl::StatusOr<std::string> python = testing::RunPython({testing::InteropScript(), "canon", out});
  ASSERT_TRUE(python.ok()) << python.status();
  const std::map<std::string, std::string> loaded = testing::ParseTabbedLines(*python);
  ASSERT_EQ(loaded.size(), expected.size());
  for (const auto& [file, canonical] : expected) {
    EXPECT_EQ(loaded.at(file), canonical) << file;
  }
}

TEST(PythonNumpyTest, NumpyLoadsTheArraysMakeNumpyArrayBuilds) {
  const std::string out = testing::MakeTempDir("pickle_numpy");
  struct Case {
    std::string dtype;
    std::vector<int64_t> shape;
    bool fortran;
    std::string data;
  };
  const std::vector<Case> cases = {
      {"<u4", {2, 2}, false, "\x01\x00\x00\x00\x02\x00\x00\x00\x03\x00\x00\x00\xff\xff\xff\xff"s},
      {"<f8", {1}, false, "\x00\x00\x00\x00\x00\x00\xf8\x3f"s},
      {"|u1", {3}, false, "abc"},
      {"|b1", {2}, false, "\x01\x00"s},
      {"<i2", {2}, false, "\x01\x00\xfe\xff"s},
      {"<i8", {0}, false, ""},
      {"<f4", {2, 3}, true, std::string(24, '\x00')},
      {"|S3", {2}, false, "abcdef"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    NumpyArray a;
    a.dtype = cases[i].dtype;
    a.shape = cases[i].shape;
    a.fortran_order = cases[i].fortran;
    a.data = cases[i].data;
    absl::StatusOr<ValuePtr> v = MakeNumpyArray(a);
    ASSERT_TRUE(v.ok()) << v.status();
    ASSERT_TRUE(WriteFileAtomic(absl::StrCat(out, "/array", i, ".pkl"), Pickle(**v).value()).ok());
  }
  absl::StatusOr<std::string> python = testing::RunPython({testing::InteropScript(), "numpy", out});
  ASSERT_TRUE(python.ok()) << python.status();
  const std::map<std::string, std::string> loaded = testing::ParseTabbedLines(*python);
  ASSERT_EQ(loaded.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    std::string shape;
    for (size_t d = 0; d < cases[i].shape.size(); ++d) absl::StrAppend(&shape, d ? "," : "", cases[i].shape[d]);
    const std::string expected = absl::StrCat(cases[i].dtype, "\t", shape, "\t", cases[i].fortran ? 1 : 0, "\t",
                                              testing::Hex(cases[i].data));
    EXPECT_EQ(loaded.at(absl::StrCat("array", i, ".pkl")), expected) << i;
  }
}

// numpy turns a non-native byte order into the native one when it unpickles
// (as it does with its own pickles): the values must survive.
TEST(PythonNumpyTest, BigEndianArraysKeepTheirValues) {
  const std::string out = testing::MakeTempDir("pickle_numpy_be");
  NumpyArray a;
  a.dtype = ">i2";
  a.shape = {2};
  a.data = "\x00\x01\xff\xfe"s;  // 1, -2
  ASSERT_TRUE(WriteFileAtomic(out + "/be.pkl", Pickle(*MakeNumpyArray(a).value()).value()).ok());
  absl::StatusOr<std::string> python = testing::RunPython({testing::InteropScript(), "numpy", out});
  ASSERT_TRUE(python.ok()) << python.status();
  EXPECT_EQ(testing::ParseTabbedLines(*python)["be.pkl"], "<i2\t2\t0\t0100feff");
}

ValuePtr FloatTensor(const std::string& key, int64_t numel, std::vector<int64_t> size, std::vector<int64_t> stride) {
  auto ints = [](const std::vector<int64_t>& xs) {
    std::vector<ValuePtr> items;
    for (int64_t x : xs) items.push_back(Value::Int(x));
    return Value::Tuple(std::move(items));
  };
  ValuePtr storage = Value::PersistentId(Value::Tuple(
      {Value::Str("storage"), G("torch", "FloatStorage"), Value::Str(key), Value::Str("cpu"), Value::Int(numel)}));
  return Obj(G("torch._utils", "_rebuild_tensor_v2"), ObjectHow::kReduce,
             {storage, Value::Int(0), ints(size), ints(stride), Value::Bool(false), Value::MakeDict(true)});
}

TEST(PythonTorchTest, TorchLoadsWhatTheWriterWrites) {
  const std::string out = testing::MakeTempDir("pickle_torch");
  ValuePtr state_dict = Value::MakeDict(true);
  state_dict->DictSet(Value::Str("w"), FloatTensor("0", 4, {2, 2}, {2, 1}));
  state_dict->DictSet(Value::Str("b"), FloatTensor("1", 2, {2}, {1}));
  state_dict->set_dict_state(StrDict({{"_metadata", StrDict({{"", StrDict({{"version", Value::Int(1)}})}}, true)}}));
  ValuePtr names = Value::MakeSet();
  names->SetAdd(Value::Str("a"));
  NumpyArray rng;
  rng.dtype = "<u4";
  rng.shape = {3};
  rng.data = "\x01\x00\x00\x00\x02\x00\x00\x00\x03\x00\x00\x00"s;
  ValuePtr root = StrDict({{"state_dict", state_dict},
                           {"shape", MakeTorchSize({2, 2})},
                           {"names", names},
                           {"blob", Value::Bytes("\x00\xff"s)},
                           {"stage", MakeZeroStage(1, EnumEncoding::kGetattr)},
                           {"stage2", MakeZeroStage(2)},
                           {"rng", MakeNumpyArray(rng).value()},
                           {"scaler", MakeLossScaler(1.0)}});
  ASSERT_TRUE(WriteFileAtomic(out + "/ckpt.pkl", Pickle(*root).value()).ok());
  const float w[4] = {1, 2, 3, 4};
  const float b[2] = {0.5, -0.5};
  ASSERT_TRUE(WriteFileAtomic(out + "/ckpt.storage.0", std::string(reinterpret_cast<const char*>(w), 16)).ok());
  ASSERT_TRUE(WriteFileAtomic(out + "/ckpt.storage.1", std::string(reinterpret_cast<const char*>(b), 8)).ok());
  absl::StatusOr<std::string> python = testing::RunPython({testing::InteropScript(), "torch", out});
  ASSERT_TRUE(python.ok()) << python.status();
  const std::string expected = absl::StrCat(
      "{'state_dict':O{'w':tensor(torch.float32,[2, 2],[1.0, 2.0, 3.0, 4.0]),'b':tensor(torch.float32,[2],[0.5, -0.5])}"
      "~{'_metadata':O{'':{'version':1}}},",
      "'shape':Size[2, 2],'names':S{'a'},'blob':b'\\x00\\xff',",
      "'stage':<ZeroStageEnum.optimizer_states: 1>,'stage2':<ZeroStageEnum.gradients: 2>,",
      "'rng':ndarray(<u4,[3],[1, 2, 3]),'scaler':", CanonicalRepr(*MakeLossScaler(1.0)), "}");
  EXPECT_EQ(testing::ParseTabbedLines(*python)["ckpt.pkl"], expected);
}

}  // namespace
}  // namespace ucp::pickle
