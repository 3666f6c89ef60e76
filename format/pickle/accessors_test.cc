#include "format/pickle/accessors.h"

#include <functional>
#include <string>
#include <vector>

#include "format/pickle/reader.h"
#include "format/pickle/test_util.h"
#include "format/pickle/writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ucp::pickle {
namespace {

using namespace std::string_literals;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

ValuePtr RoundTrip(const ValuePtr& v) {
  absl::StatusOr<std::string> bytes = Pickle(*v);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<ValuePtr> back = Unpickle(bytes.ok() ? *bytes : std::string());
  EXPECT_TRUE(back.ok()) << back.status();
  return back.ok() ? *back : Value::None();
}

using testing::Obj;

// ---- generic ----

TEST(GenericAccessorTest, ScalarsAndMessages) {
  EXPECT_EQ(AsInt(*Value::Int(5), "x").value(), 5);
  absl::Status wrong = AsInt(*Value::Str("five"), "optimizer_state_dict.partition_count").status();
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(wrong), "optimizer_state_dict.partition_count: expected int, found str 'five'");
  EXPECT_EQ(AsInt(*Value::BigInt(std::string(9, '\x01')), "x").status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(AsFloat(*Value::Int(2), "x").value(), 2.0);
  EXPECT_EQ(AsFloat(*Value::Float(0.5), "x").value(), 0.5);
  EXPECT_THAT(Message(AsFloat(*Value::None(), "lr").status()), HasSubstr("lr: expected float or int, found None"));
  EXPECT_TRUE(AsBool(*Value::Bool(true), "x").value());
  EXPECT_EQ(AsBool(*Value::Int(1), "x").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AsStr(*Value::Str("s"), "x").value(), "s");
  EXPECT_EQ(AsStr(*Value::Bytes("s"), "x").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GenericAccessorTest, FieldsAndSequences) {
  ValuePtr d = Value::MakeDict(true);
  d->DictSet(Value::Str("a"), Value::Int(1));
  EXPECT_EQ(GetField(*d, "a", "sd").value()->int_value(), 1);
  absl::Status missing = GetField(*d, "b", "sd").status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Message(missing), "sd: no key 'b'");
  EXPECT_EQ(GetField(*Value::List({}), "a", "sd").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(IsOrderedDict(*d));
  EXPECT_FALSE(IsOrderedDict(*Value::MakeDict()));
  EXPECT_EQ(AsSequence(*Value::Tuple({Value::None()}), "t").value()->size(), 1u);
  EXPECT_EQ(AsSequence(*Value::List({}), "t").value()->size(), 0u);
  EXPECT_EQ(AsSequence(*d, "t").status().code(), absl::StatusCode::kInvalidArgument);
  ValuePtr s = Value::MakeSet();
  s->SetAdd(Value::Str("x"));
  EXPECT_EQ(AsSet(*s).value()->size(), 1u);
  EXPECT_EQ(AsSet(*Value::MakeSet(true)).value()->size(), 0u);
  EXPECT_EQ(AsSet(*Value::List({})).status().code(), absl::StatusCode::kInvalidArgument);
}

// ---- torch.Size ----

TEST(TorchSizeTest, BuildReadAndEncoding) {
  ValuePtr size = MakeTorchSize({48, 64});
  EXPECT_THAT(AsTorchSize(*size).value(), ElementsAre(48, 64));
  EXPECT_THAT(AsTorchSize(*RoundTrip(size)).value(), ElementsAre(48, 64));
  // As torch writes it: REDUCE of a tuple holding the dims tuple.
  EXPECT_EQ(Pickle(*size).value(), "\x80\x02" "ctorch\nSize\nq\x00K0K@\x86q\x01\x85q\x02Rq\x03."s);
  EXPECT_THAT(AsTorchSize(*Value::Tuple({Value::Int(3)})).value(), ElementsAre(3));
  EXPECT_THAT(AsTorchSize(*MakeTorchSize({})).value(), ElementsAre());
  EXPECT_THAT(Message(AsTorchSize(*MakeTorchSize({-1}), "param_shapes[0].w").status()),
              HasSubstr("param_shapes[0].w: negative dimension -1"));
  EXPECT_THAT(Message(AsTorchSize(*Value::Str("x")).status()), HasSubstr("torch.Size: expected torch.Size"));
}

// ---- fragment_address ----

TEST(FragmentAddressTest, BuildReadAndEncoding) {
  ValuePtr f = MakeFragmentAddress(5, 7);
  FragmentAddress a = AsFragmentAddress(*RoundTrip(f)).value();
  EXPECT_EQ(a.numel, 5);
  EXPECT_EQ(a.start, 7);
  EXPECT_EQ(Pickle(*f).value(),
            "\x80\x02" "cdeepspeed.utils.tensor_fragment\nfragment_address\nq\x00)\x81q\x01}q\x02(X\x05\x00\x00\x00numelq\x03"
            "K\x05X\x05\x00\x00\x00startq\x04K\x07ub."s);
  ValuePtr no_start = MakeFragmentAddress(1, 2);
  no_start->mutable_object().state->DictErase("start");
  EXPECT_EQ(Message(AsFragmentAddress(*no_start, "mappings[0]['w']").status()), "mappings[0]['w']: no key 'start'");
  ValuePtr no_state = MakeFragmentAddress(1, 2);
  no_state->mutable_object().state = nullptr;
  EXPECT_THAT(Message(AsFragmentAddress(*no_state).status()), HasSubstr("has no state"));
  EXPECT_EQ(AsFragmentAddress(*MakeTorchSize({1})).status().code(), absl::StatusCode::kInvalidArgument);
}

// ---- LossScaler ----

TEST(LossScalerTest, StaticAndDynamic) {
  const ValuePtr scaler = RoundTrip(MakeLossScaler(1.0));  // info.state points into it
  LossScalerInfo info = AsLossScaler(*scaler).value();
  EXPECT_EQ(info.class_name, "LossScaler");
  EXPECT_EQ(info.cur_scale, 1.0);
  EXPECT_FALSE(info.dynamic);
  ASSERT_NE(info.state, nullptr);
  EXPECT_EQ(info.state->dict_items().size(), 2u);

  ValuePtr state = Value::MakeDict();
  state->DictSet(Value::Str("cur_scale"), Value::Int(65536));
  state->DictSet(Value::Str("cur_iter"), Value::Int(3));
  ValuePtr dynamic = Obj(Value::Global("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler"), ObjectHow::kNewObj,
                         {}, state);
  LossScalerInfo d = AsLossScaler(*dynamic).value();
  EXPECT_EQ(d.class_name, "DynamicLossScaler");
  EXPECT_EQ(d.cur_scale, 65536.0);
  EXPECT_TRUE(d.dynamic);

  state->DictSet(Value::Str("cur_scale"), Value::Str("big"));
  EXPECT_EQ(Message(AsLossScaler(*dynamic).status()), "loss_scaler.cur_scale: expected float or int, found str 'big'");
  EXPECT_THAT(Message(AsLossScaler(*MakeFragmentAddress(1, 1)).status()), HasSubstr("loss_scaler: expected"));
}

// ---- ZeroStageEnum ----

TEST(ZeroStageTest, BothEncodingsAndInts) {
  for (int stage = 0; stage <= 3; ++stage) {
    EXPECT_EQ(AsZeroStage(*RoundTrip(MakeZeroStage(stage, EnumEncoding::kCall))).value(), stage);
    EXPECT_EQ(AsZeroStage(*RoundTrip(MakeZeroStage(stage, EnumEncoding::kGetattr))).value(), stage);
  }
  EXPECT_EQ(Pickle(*MakeZeroStage(1, EnumEncoding::kGetattr)).value(),
            "\x80\x02" "c__builtin__\ngetattr\nq\x00" "cdeepspeed.runtime.zero.config\nZeroStageEnum\nq\x01"
            "X\x10\x00\x00\x00optimizer_statesq\x02\x86q\x03Rq\x04."s);
  EXPECT_EQ(Pickle(*MakeZeroStage(2)).value(),
            "\x80\x02" "cdeepspeed.runtime.zero.config\nZeroStageEnum\nq\x00K\x02\x85q\x01Rq\x02."s);
  EXPECT_EQ(ZeroStageEncoding(*RoundTrip(MakeZeroStage(1, EnumEncoding::kGetattr))), EnumEncoding::kGetattr);
  EXPECT_EQ(ZeroStageEncoding(*RoundTrip(MakeZeroStage(3, EnumEncoding::kCall))), EnumEncoding::kCall);
  EXPECT_EQ(ZeroStageEncoding(*Value::Int(2)), EnumEncoding::kCall);
  EXPECT_EQ(AsZeroStage(*Value::Int(2)).value(), 2);
  EXPECT_EQ(Message(AsZeroStage(*MakeZeroStage(7)).status()), "zero_stage: ZeroStageEnum 7 is not a ZeRO stage (0-3)");
  ValuePtr unknown = Obj(Value::Global("builtins", "getattr"), ObjectHow::kReduce,
                         {Value::Global("deepspeed.runtime.zero.config", "ZeroStageEnum"), Value::Str("sharded")});
  EXPECT_THAT(Message(AsZeroStage(*unknown).status()), HasSubstr("has no member 'sharded'"));
  ValuePtr alias = Obj(Value::Global("__builtin__", "getattr"), ObjectHow::kReduce,
                       {Value::Global("deepspeed.runtime.zero.config", "ZeroStageEnum"), Value::Str("max_stage")});
  EXPECT_EQ(AsZeroStage(*alias).value(), 3);
  EXPECT_EQ(ZeroStageName(1).value(), "optimizer_states");
  EXPECT_EQ(ZeroStageName(3).value(), "weights");
  EXPECT_EQ(ZeroStageName(4).status().code(), absl::StatusCode::kInvalidArgument);
}

// ---- argparse.Namespace ----

TEST(NamespaceTest, NewObjReconstructorAndEmpty) {
  ValuePtr attrs = Value::MakeDict();
  attrs->DictSet(Value::Str("lr"), Value::Float(0.1));
  ValuePtr ns = Obj(Value::Global("argparse", "Namespace"), ObjectHow::kNewObj, {}, attrs);
  EXPECT_EQ(AsNamespace(*RoundTrip(ns)).value()->DictGet("lr")->float_value(), 0.1);
  ValuePtr old = Obj(Value::Global("copyreg", "_reconstructor"), ObjectHow::kReduce,
                     {Value::Global("argparse", "Namespace"), Value::Global("builtins", "object"), Value::None()}, attrs);
  EXPECT_EQ(AsNamespace(*old).value(), attrs.get());
  ValuePtr empty = Obj(Value::Global("argparse", "Namespace"), ObjectHow::kNewObj, {});
  EXPECT_TRUE(AsNamespace(*empty).value()->dict_items().empty());
  EXPECT_THAT(Message(AsNamespace(*attrs).status()), HasSubstr("args: expected argparse.Namespace"));
}

// ---- numpy ----

TEST(NumpyTest, BuildReadRoundTrip) {
  NumpyArray array;
  array.dtype = "<u4";
  array.shape = {2, 3};
  array.data = std::string(24, '\x05');
  ValuePtr v = MakeNumpyArray(array).value();
  NumpyArray back = AsNumpyArray(*RoundTrip(v)).value();
  EXPECT_EQ(back.dtype, "<u4");
  EXPECT_THAT(back.shape, ElementsAre(2, 3));
  EXPECT_FALSE(back.fortran_order);
  EXPECT_EQ(back.data, array.data);

  NumpyArray bytes_array;
  bytes_array.dtype = "|u1";
  bytes_array.shape = {3};
  bytes_array.data = "abc";
  bytes_array.fortran_order = true;
  NumpyArray b = AsNumpyArray(*MakeNumpyArray(bytes_array).value()).value();
  EXPECT_EQ(b.dtype, "|u1");
  EXPECT_TRUE(b.fortran_order);
}

TEST(NumpyTest, Errors) {
  NumpyArray bad;
  bad.dtype = "<f8";
  bad.shape = {2};
  bad.data = "1234567";
  EXPECT_THAT(Message(MakeNumpyArray(bad).status()), HasSubstr("7 data bytes for shape (2) of <f8, expected 16"));
  bad.dtype = "<O8";
  EXPECT_THAT(Message(MakeNumpyArray(bad).status()), HasSubstr("unsupported dtype '<O8'"));
  NumpyArray ok;
  ok.dtype = "<i2";
  ok.shape = {1};
  ok.data = "zz";
  ValuePtr v = MakeNumpyArray(ok).value();
  ValuePtr dtype = v->object().state->items()[2];
  dtype->mutable_object().state->mutable_items()[3] = Value::Tuple({Value::Str("a")});
  EXPECT_THAT(Message(AsNumpyArray(*v).status()), HasSubstr("structured dtypes are not supported"));
  EXPECT_THAT(Message(AsNumpyArray(*Value::None(), "rng").status()), HasSubstr("rng: expected a numpy array"));
}

TEST(NumpyTest, FromBufferFormOfProtocol5) {
  ValuePtr dtype = Obj(Value::Global("numpy", "dtype"), ObjectHow::kReduce,
                       {Value::Str("i2"), Value::Bool(false), Value::Bool(true)},
                       Value::Tuple({Value::Int(3), Value::Str("<"), Value::None(), Value::None(), Value::None(),
                                     Value::Int(-1), Value::Int(-1), Value::Int(0)}));
  ValuePtr array = Obj(Value::Global("numpy.core.numeric", "_frombuffer"), ObjectHow::kReduce,
                       {Value::ByteArray("\x00\x00\x01\x00"s), dtype, Value::Tuple({Value::Int(2)}), Value::Str("C")});
  NumpyArray a = AsNumpyArray(*array).value();
  EXPECT_EQ(a.dtype, "<i2");
  EXPECT_THAT(a.shape, ElementsAre(2));
  EXPECT_EQ(a.data, "\x00\x00\x01\x00"s);
}

// ---- on real DeepSpeed 0.14.4 checkpoints ----

class FixtureAccessorTest : public ::testing::Test {
 protected:
  ValuePtr Load(const std::string& relative_path) {
    absl::StatusOr<std::string> dir = testing::FixturesDir();
    EXPECT_TRUE(dir.ok()) << dir.status();
    absl::StatusOr<std::string> zip = ReadFileToString(*dir + "/" + relative_path);
    EXPECT_TRUE(zip.ok()) << zip.status();
    absl::StatusOr<std::string> pkl = testing::ReadStoredZipMember(*zip, "/data.pkl");
    EXPECT_TRUE(pkl.ok()) << pkl.status();
    absl::StatusOr<ValuePtr> root = Unpickle(*pkl);
    EXPECT_TRUE(root.ok()) << root.status();
    return root.ok() ? *root : Value::None();
  }
};

TEST_F(FixtureAccessorTest, ZeroOptimizerState) {
  ValuePtr root = Load("neox-tp2-pp1-dp1/global_step4/zero_pp_rank_0_mp_rank_00_optim_states.pt");
  const Value* osd = GetField(*root, "optimizer_state_dict", "root").value();
  LossScalerInfo scaler = AsLossScaler(*GetField(*osd, "loss_scaler", "osd").value()).value();
  EXPECT_EQ(scaler.class_name, "LossScaler");
  EXPECT_EQ(scaler.cur_scale, 1.0);
  EXPECT_FALSE(scaler.dynamic);
  // Debian's Python 3.11.2 wrote getattr(ZeroStageEnum, 'optimizer_states').
  const Value* stage = GetField(*osd, "zero_stage", "osd").value();
  EXPECT_TRUE(stage->IsObjectOf("builtins", "getattr"));
  EXPECT_EQ(AsZeroStage(*stage).value(), 1);
  const auto* mappings = AsSequence(*GetField(*osd, "param_slice_mappings", "osd").value(), "m").value();
  ASSERT_FALSE(mappings->empty());
  ASSERT_TRUE(IsOrderedDict(*(*mappings)[0]));
  int64_t expected_start = 0;
  for (const auto& [name, fragment] : (*mappings)[0]->dict_items()) {
    FragmentAddress a = AsFragmentAddress(*fragment, name->str()).value();
    EXPECT_EQ(a.start, expected_start) << name->str();  // fragments tile the partition
    expected_start += a.numel;
  }
  EXPECT_GT(expected_start, 0);
  EXPECT_EQ(AsInt(*GetField(*osd, "partition_count", "osd").value(), "pc").status().code(),
            absl::StatusCode::kInvalidArgument);  // a list [1, 1], one per group
}

TEST_F(FixtureAccessorTest, ModelStates) {
  ValuePtr root = Load("neox-tp2-pp1-dp1/global_step4/mp_rank_00_model_states.pt");
  const auto* shapes = AsSequence(*GetField(*root, "param_shapes", "root").value(), "param_shapes").value();
  ASSERT_FALSE(shapes->empty());
  const Value* first = (*shapes)[0]->DictGet("0.word_embeddings.weight");
  ASSERT_NE(first, nullptr);
  EXPECT_THAT(AsTorchSize(*first).value(), ElementsAre(48, 64));
  EXPECT_TRUE(AsSet(*GetField(*root, "sparse_tensor_module_names", "root").value()).value()->empty());
  EXPECT_EQ(AsInt(*GetField(*root, "mp_world_size", "root").value(), "mp").value(), 2);
  // The numpy RNG state: ('MT19937', uint32[624], pos, has_gauss, cached_gaussian).
  const auto* rng = AsSequence(*GetField(*root, "np_rng_state", "root").value(), "np_rng_state").value();
  ASSERT_EQ(rng->size(), 5u);
  EXPECT_EQ((*rng)[0]->str(), "MT19937");
  NumpyArray key = AsNumpyArray(*(*rng)[1], "np_rng_state[1]").value();
  EXPECT_EQ(key.dtype, "<u4");
  EXPECT_THAT(key.shape, ElementsAre(624));
  EXPECT_EQ(key.data.size(), 624u * 4);
  // It is re-encoded byte for byte as numpy wrote it.
  NumpyArray same = AsNumpyArray(*MakeNumpyArray(key).value()).value();
  EXPECT_EQ(same.data, key.data);
}

// ---- on real DeepSpeed 0.19.5 checkpoints (Python 3.13, numpy 2) ----

// Every object of `v`'s tree that `pred` selects.
void Collect(const ValuePtr& v, const std::function<bool(const Value&)>& pred, std::vector<const Value*>* out,
             int depth = 0) {
  if (v == nullptr || depth > 64) return;
  if (pred(*v)) out->push_back(v.get());
  switch (v->kind()) {
    case Kind::kTuple:
    case Kind::kList:
      for (const auto& item : v->items()) Collect(item, pred, out, depth + 1);
      break;
    case Kind::kDict:
      for (const auto& [k, item] : v->dict_items()) Collect(item, pred, out, depth + 1);
      break;
    case Kind::kObject:
      Collect(v->object().args, pred, out, depth + 1);
      Collect(v->object().state, pred, out, depth + 1);
      break;
    default:
      break;
  }
}

TEST_F(FixtureAccessorTest, Version0195ZeroStageAndNumpy2) {
  // ZeroStageEnum pickled by Python 3.13: GLOBAL ZeroStageEnum, BININT1, TUPLE1, REDUCE.
  ValuePtr optim = Load("../deepspeed-0.19.5/gpt-zero1-padding-dp2/global_step4/zero_pp_rank_0_mp_rank_00_optim_states.pt");
  const Value* osd = GetField(*optim, "optimizer_state_dict", "root").value();
  const Value* stage = GetField(*osd, "zero_stage", "osd").value();
  EXPECT_TRUE(stage->IsObjectOf("deepspeed.runtime.zero.config", "ZeroStageEnum"));
  EXPECT_EQ(AsZeroStage(*stage).value(), 1);
  ValuePtr z3 = Load("../deepspeed-0.19.5/gpt-zero3-dp2/global_step4/zero_pp_rank_0_mp_rank_00_optim_states.pt");
  EXPECT_EQ(AsZeroStage(*GetField(*GetField(*z3, "optimizer_state_dict", "root").value(), "zero_stage", "osd").value())
                .value(),
            3);
  // numpy 2 spells numpy.core as numpy._core in the rng states.
  ValuePtr model = Load("../deepspeed-0.19.5/neox-tp2-pp1-dp1/global_step4/mp_rank_00_model_states.pt");
  std::vector<const Value*> arrays;
  Collect(model, [](const Value& v) { return v.IsObjectOf("numpy._core.multiarray", "_reconstruct"); }, &arrays);
  ASSERT_FALSE(arrays.empty());
  for (const Value* a : arrays) {
    absl::StatusOr<NumpyArray> arr = AsNumpyArray(*a);
    ASSERT_TRUE(arr.ok()) << arr.status();
    EXPECT_FALSE(arr->data.empty());
  }
}

}  // namespace
}  // namespace ucp::pickle
