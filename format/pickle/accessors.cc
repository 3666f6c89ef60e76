#include "format/pickle/accessors.h"

#include <array>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "format/pickle/internal/text.h"

namespace ucp::pickle {
namespace {

using internal_text::AbslView;

constexpr char kTorch[] = "torch";
constexpr char kLossScalerModule[] = "deepspeed.runtime.fp16.loss_scaler";
constexpr char kZeroConfigModule[] = "deepspeed.runtime.zero.config";
constexpr char kTensorFragmentModule[] = "deepspeed.utils.tensor_fragment";

// "str 'abc'", "object torch.Size(((2, 3),))", ... for messages.
std::string Describe(const Value& v) { return absl::StrCat(KindName(v.kind()), " ", v.DebugString(80)); }

absl::Status Mismatch(std::string_view what, std::string_view expected, const Value& found) {
  return absl::InvalidArgumentError(absl::StrCat(AbslView(what), ": expected ", AbslView(expected), ", found ", Describe(found)));
}

bool IsBuiltins(std::string_view module) { return module == "builtins" || module == "__builtin__"; }

// The attribute dict an object was BUILT with.
absl::StatusOr<const Value*> ObjectStateDict(const Value& v, std::string_view what, std::string_view class_name) {
  const ValuePtr& state = v.object().state;
  if (state == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(AbslView(what), ": ", AbslView(class_name), " has no state (no BUILD)"));
  }
  if (!state->is(Kind::kDict)) return Mismatch(absl::StrCat(AbslView(what), " state"), "an attribute dict", *state);
  return state.get();
}

absl::StatusOr<int64_t> IntField(const Value& dict, std::string_view key, std::string_view what) {
  const std::string field_what = absl::StrCat(AbslView(what), ".", AbslView(key));
  absl::StatusOr<const Value*> field = GetField(dict, key, what);
  if (!field.ok()) return field.status();
  return AsInt(**field, field_what);
}

constexpr std::array<const char*, 4> kZeroStageNames = {"disabled", "optimizer_states", "gradients", "weights"};

absl::StatusOr<int> CheckZeroStage(int64_t stage, std::string_view what) {
  if (stage < 0 || stage > 3) {
    return absl::InvalidArgumentError(absl::StrCat(AbslView(what), ": ZeroStageEnum ", stage, " is not a ZeRO stage (0-3)"));
  }
  return static_cast<int>(stage);
}

// ---- numpy ----

struct DtypeInfo {
  std::string str;  // "<u4"
  int64_t itemsize = 0;
};

// A dtype's size from its pickled name: 'u4' -> 4, 'c16' -> 16, 'U5' -> 20.
absl::StatusOr<int64_t> ItemSizeFromName(std::string_view name, std::string_view what) {
  if (name.size() < 2) return absl::InvalidArgumentError(absl::StrCat(AbslView(what), ": unsupported dtype '", AbslView(name), "'"));
  const char kind = name[0];
  int64_t n = 0;
  if (std::string_view("biufcSVUMm").find(kind) == std::string_view::npos || !absl::SimpleAtoi(AbslView(name.substr(1)), &n) ||
      n <= 0 || n > (int64_t{1} << 40)) {
    return absl::InvalidArgumentError(absl::StrCat(AbslView(what), ": unsupported dtype '", AbslView(name), "'"));
  }
  return kind == 'U' ? n * 4 : n;
}

// numpy.dtype(name, False, True) + BUILD (version, endian, subdescr, names,
// fields, elsize, alignment, flags[, metadata]).
absl::StatusOr<DtypeInfo> AsNumpyDtype(const Value& v, std::string_view what) {
  const std::string dtype_what = absl::StrCat(AbslView(what), " dtype");
  if (!v.IsObjectOf("numpy", "dtype")) return Mismatch(dtype_what, "numpy.dtype(...)", v);
  const std::vector<ValuePtr>& args = v.object().args->items();
  if (args.empty() || !args[0]->is(Kind::kStr)) return Mismatch(dtype_what, "numpy.dtype(name, ...)", v);
  const std::string& name = args[0]->str();
  char endian = '|';
  const ValuePtr& state = v.object().state;
  if (state != nullptr) {
    if (!state->is(Kind::kTuple) || state->items().size() < 8 || !state->items()[1]->is(Kind::kStr) ||
        state->items()[1]->str().size() != 1) {
      return Mismatch(absl::StrCat(dtype_what, " state"), "(version, endian, subdescr, names, fields, ...)", *state);
    }
    const auto& s = state->items();
    if (!s[2]->is_none() || !s[3]->is_none() || !s[4]->is_none()) {
      return absl::InvalidArgumentError(absl::StrCat(dtype_what, ": structured dtypes are not supported"));
    }
    endian = s[1]->str()[0];
    if (endian == '=') endian = '<';
    if (endian != '<' && endian != '>' && endian != '|') {
      return absl::InvalidArgumentError(absl::StrCat(dtype_what, ": unknown byte order '", s[1]->str(), "'"));
    }
  }
  absl::StatusOr<int64_t> itemsize = ItemSizeFromName(name, dtype_what);
  if (!itemsize.ok()) return itemsize.status();
  return DtypeInfo{absl::StrCat(std::string(1, endian), AbslView(name)), *itemsize};
}

absl::StatusOr<std::vector<int64_t>> AsShape(const Value& v, std::string_view what) {
  if (!v.is(Kind::kTuple) && !v.is(Kind::kList)) return Mismatch(what, "a shape tuple", v);
  std::vector<int64_t> shape;
  for (const ValuePtr& d : v.items()) {
    absl::StatusOr<int64_t> n = AsInt(*d, what);
    if (!n.ok()) return n.status();
    if (*n < 0) return absl::InvalidArgumentError(absl::StrCat(AbslView(what), ": negative dimension ", *n));
    shape.push_back(*n);
  }
  return shape;
}

absl::Status CheckDataSize(const NumpyArray& array, int64_t itemsize, std::string_view what) {
  int64_t expected = itemsize;
  for (int64_t d : array.shape) {
    if (d != 0 && expected > INT64_MAX / d) {
      return absl::InvalidArgumentError(absl::StrCat(AbslView(what), ": shape (", absl::StrJoin(array.shape, ", "),
                                                     ") overflows"));
    }
    expected *= d;
  }
  if (static_cast<int64_t>(array.data.size()) != expected) {
    return absl::InvalidArgumentError(absl::StrCat(AbslView(what), ": ", array.data.size(), " data bytes for shape (",
                                                   absl::StrJoin(array.shape, ", "), ") of ", array.dtype,
                                                   ", expected ", expected));
  }
  return absl::OkStatus();
}

}  // namespace

// ---- generic ----

absl::StatusOr<int64_t> AsInt(const Value& v, std::string_view what) {
  if (!v.is(Kind::kInt)) return Mismatch(what, "int", v);
  if (!v.fits_int64()) {
    return absl::OutOfRangeError(absl::StrCat(AbslView(what), ": ", v.DebugString(), " does not fit in 64 bits"));
  }
  return v.int_value();
}

absl::StatusOr<double> AsFloat(const Value& v, std::string_view what) {
  if (v.is(Kind::kFloat)) return v.float_value();
  if (v.is(Kind::kInt)) {
    if (!v.fits_int64()) {
      return absl::OutOfRangeError(absl::StrCat(AbslView(what), ": ", v.DebugString(), " does not fit in 64 bits"));
    }
    return static_cast<double>(v.int_value());
  }
  return Mismatch(what, "float or int", v);
}

absl::StatusOr<bool> AsBool(const Value& v, std::string_view what) {
  if (!v.is(Kind::kBool)) return Mismatch(what, "bool", v);
  return v.bool_value();
}

absl::StatusOr<std::string> AsStr(const Value& v, std::string_view what) {
  if (!v.is(Kind::kStr)) return Mismatch(what, "str", v);
  return v.str();
}

absl::StatusOr<const Value*> GetField(const Value& dict, std::string_view key, std::string_view what) {
  if (!dict.is(Kind::kDict)) return Mismatch(what, "dict", dict);
  const Value* field = dict.DictGet(key);
  if (field == nullptr) return absl::NotFoundError(absl::StrCat(AbslView(what), ": no key '", AbslView(key), "'"));
  return field;
}

absl::StatusOr<const std::vector<ValuePtr>*> AsSequence(const Value& v, std::string_view what) {
  if (!v.is(Kind::kTuple) && !v.is(Kind::kList)) return Mismatch(what, "tuple or list", v);
  return &v.items();
}

bool IsOrderedDict(const Value& v) { return v.is(Kind::kDict) && v.ordered_dict(); }

// ---- torch.Size ----

absl::StatusOr<std::vector<int64_t>> AsTorchSize(const Value& v, std::string_view what) {
  if (v.is(Kind::kTuple) || v.is(Kind::kList)) return AsShape(v, what);
  if (!v.IsObjectOf(kTorch, "Size")) return Mismatch(what, "torch.Size", v);
  const Object& o = v.object();
  if (o.how != ObjectHow::kReduce || o.args->items().size() != 1) {
    return Mismatch(what, "torch.Size((d0, d1, ...))", v);
  }
  return AsShape(*o.args->items()[0], what);
}

ValuePtr MakeTorchSize(const std::vector<int64_t>& dims) {
  std::vector<ValuePtr> items;
  items.reserve(dims.size());
  for (int64_t d : dims) items.push_back(Value::Int(d));
  Object o;
  o.callable = Value::Global(kTorch, "Size");
  o.how = ObjectHow::kReduce;
  o.args = Value::Tuple({Value::Tuple(std::move(items))});
  return Value::MakeObject(std::move(o));
}

// ---- fragment_address ----

absl::StatusOr<FragmentAddress> AsFragmentAddress(const Value& v, std::string_view what) {
  if (!v.IsObjectOf(kTensorFragmentModule, "fragment_address")) {
    return Mismatch(what, "deepspeed.utils.tensor_fragment.fragment_address", v);
  }
  const Object& o = v.object();
  FragmentAddress address;
  if (o.state == nullptr && o.args->items().size() == 2) {  // fragment_address(numel, start)
    absl::StatusOr<int64_t> numel = AsInt(*o.args->items()[0], absl::StrCat(AbslView(what), ".numel"));
    if (!numel.ok()) return numel.status();
    absl::StatusOr<int64_t> start = AsInt(*o.args->items()[1], absl::StrCat(AbslView(what), ".start"));
    if (!start.ok()) return start.status();
    address.numel = *numel;
    address.start = *start;
  } else {
    absl::StatusOr<const Value*> state = ObjectStateDict(v, what, "fragment_address");
    if (!state.ok()) return state.status();
    absl::StatusOr<int64_t> numel = IntField(**state, "numel", what);
    if (!numel.ok()) return numel.status();
    absl::StatusOr<int64_t> start = IntField(**state, "start", what);
    if (!start.ok()) return start.status();
    address.numel = *numel;
    address.start = *start;
  }
  if (address.numel < 0 || address.start < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(AbslView(what), ": negative numel ", address.numel, " or start ", address.start));
  }
  return address;
}

ValuePtr MakeFragmentAddress(int64_t numel, int64_t start) {
  ValuePtr state = Value::MakeDict();
  state->DictSet(Value::Str("numel"), Value::Int(numel));
  state->DictSet(Value::Str("start"), Value::Int(start));
  Object o;
  o.callable = Value::Global(kTensorFragmentModule, "fragment_address");
  o.how = ObjectHow::kNewObj;
  o.args = Value::Tuple({});
  o.state = std::move(state);
  return Value::MakeObject(std::move(o));
}

// ---- LossScaler ----

absl::StatusOr<LossScalerInfo> AsLossScaler(const Value& v, std::string_view what) {
  const bool is_static = v.IsObjectOf(kLossScalerModule, "LossScaler");
  if (!is_static && !v.IsObjectOf(kLossScalerModule, "DynamicLossScaler")) {
    return Mismatch(what, "deepspeed.runtime.fp16.loss_scaler.LossScaler or DynamicLossScaler", v);
  }
  LossScalerInfo info;
  info.class_name = std::string(v.object_name());
  absl::StatusOr<const Value*> state = ObjectStateDict(v, what, info.class_name);
  if (!state.ok()) return state.status();
  info.state = *state;
  absl::StatusOr<const Value*> cur_scale = GetField(**state, "cur_scale", what);
  if (!cur_scale.ok()) return cur_scale.status();
  absl::StatusOr<double> scale = AsFloat(**cur_scale, absl::StrCat(AbslView(what), ".cur_scale"));
  if (!scale.ok()) return scale.status();
  info.cur_scale = *scale;
  info.dynamic = !is_static;
  if (const Value* dynamic = (*state)->DictGet("dynamic"); dynamic != nullptr) {
    absl::StatusOr<bool> b = AsBool(*dynamic, absl::StrCat(AbslView(what), ".dynamic"));
    if (!b.ok()) return b.status();
    info.dynamic = *b;
  }
  return info;
}

ValuePtr MakeLossScaler(double cur_scale) {
  ValuePtr state = Value::MakeDict();
  state->DictSet(Value::Str("cur_scale"), Value::Float(cur_scale));
  state->DictSet(Value::Str("dynamic"), Value::Bool(false));
  Object o;
  o.callable = Value::Global(kLossScalerModule, "LossScaler");
  o.how = ObjectHow::kNewObj;
  o.args = Value::Tuple({});
  o.state = std::move(state);
  return Value::MakeObject(std::move(o));
}

// ---- ZeroStageEnum ----

absl::StatusOr<int> AsZeroStage(const Value& v, std::string_view what) {
  if (v.is(Kind::kInt)) {
    absl::StatusOr<int64_t> stage = AsInt(v, what);
    if (!stage.ok()) return stage.status();
    return CheckZeroStage(*stage, what);
  }
  if (v.IsObjectOf(kZeroConfigModule, "ZeroStageEnum")) {  // ZeroStageEnum(1)
    const auto& args = v.object().args->items();
    if (v.object().how != ObjectHow::kReduce || args.size() != 1) {
      return Mismatch(what, "ZeroStageEnum(stage)", v);
    }
    absl::StatusOr<int64_t> stage = AsInt(*args[0], what);
    if (!stage.ok()) return stage.status();
    return CheckZeroStage(*stage, what);
  }
  if (v.is(Kind::kObject) && IsBuiltins(v.object_module()) && v.object_name() == "getattr") {
    const auto& args = v.object().args->items();  // getattr(ZeroStageEnum, 'optimizer_states')
    if (args.size() == 2 && args[0]->IsGlobal(kZeroConfigModule, "ZeroStageEnum") && args[1]->is(Kind::kStr)) {
      const std::string& name = args[1]->str();
      for (size_t i = 0; i < kZeroStageNames.size(); ++i) {
        if (name == kZeroStageNames[i]) return static_cast<int>(i);
      }
      if (name == "max_stage") return 3;  // an alias of `weights`
      return absl::InvalidArgumentError(absl::StrCat(AbslView(what), ": ZeroStageEnum has no member '", AbslView(name), "'"));
    }
  }
  return Mismatch(what, "deepspeed.runtime.zero.config.ZeroStageEnum", v);
}

EnumEncoding ZeroStageEncoding(const Value& v) {
  return v.is(Kind::kObject) && v.object_name() == "getattr" ? EnumEncoding::kGetattr : EnumEncoding::kCall;
}

ValuePtr MakeZeroStage(int stage, EnumEncoding encoding) {
  Object o;
  o.how = ObjectHow::kReduce;
  if (encoding == EnumEncoding::kGetattr && stage >= 0 && stage <= 3) {
    o.callable = Value::Global("builtins", "getattr");
    o.args = Value::Tuple({Value::Global(kZeroConfigModule, "ZeroStageEnum"), Value::Str(kZeroStageNames[stage])});
  } else {
    o.callable = Value::Global(kZeroConfigModule, "ZeroStageEnum");
    o.args = Value::Tuple({Value::Int(stage)});
  }
  return Value::MakeObject(std::move(o));
}

absl::StatusOr<std::string> ZeroStageName(int stage) {
  absl::StatusOr<int> checked = CheckZeroStage(stage, "ZeroStageName");
  if (!checked.ok()) return checked.status();
  return std::string(kZeroStageNames[stage]);
}

// ---- argparse.Namespace ----

absl::StatusOr<const Value*> AsNamespace(const Value& v, std::string_view what) {
  bool is_namespace = v.IsObjectOf("argparse", "Namespace");
  if (!is_namespace && v.IsObjectOf("copyreg", "_reconstructor")) {  // protocol 0/1
    const auto& args = v.object().args->items();
    is_namespace = !args.empty() && args[0]->IsGlobal("argparse", "Namespace");
  }
  if (!is_namespace) return Mismatch(what, "argparse.Namespace", v);
  if (v.object().state == nullptr) {
    static const ValuePtr* const kNoAttributes = new ValuePtr(Value::MakeDict());
    return kNoAttributes->get();
  }
  return ObjectStateDict(v, what, "Namespace");
}

// ---- numpy ----

absl::StatusOr<NumpyArray> AsNumpyArray(const Value& v, std::string_view what) {
  NumpyArray array;
  const bool reconstruct = v.IsObjectOf("numpy.core.multiarray", "_reconstruct") ||
                           v.IsObjectOf("numpy._core.multiarray", "_reconstruct");
  const bool frombuffer =
      v.IsObjectOf("numpy.core.numeric", "_frombuffer") || v.IsObjectOf("numpy._core.numeric", "_frombuffer");
  const Value* dtype_value = nullptr;
  const Value* data = nullptr;
  if (reconstruct) {
    // _reconstruct(ndarray, (0,), b'b') + BUILD ([version,] shape, dtype, is_fortran, data)
    const ValuePtr& state = v.object().state;
    if (state == nullptr) return absl::InvalidArgumentError(absl::StrCat(AbslView(what), ": ndarray has no state (no BUILD)"));
    if (!state->is(Kind::kTuple) || (state->items().size() != 5 && state->items().size() != 4)) {
      return Mismatch(absl::StrCat(AbslView(what), " state"), "(version, shape, dtype, is_fortran, data)", *state);
    }
    const auto& s = state->items();
    const size_t base = s.size() == 5 ? 1 : 0;
    absl::StatusOr<std::vector<int64_t>> shape = AsShape(*s[base], absl::StrCat(AbslView(what), " shape"));
    if (!shape.ok()) return shape.status();
    array.shape = *std::move(shape);
    dtype_value = s[base + 1].get();
    absl::StatusOr<bool> fortran = AsBool(*s[base + 2], absl::StrCat(AbslView(what), " is_fortran"));
    if (!fortran.ok()) return fortran.status();
    array.fortran_order = *fortran;
    data = s[base + 3].get();
  } else if (frombuffer) {
    // _frombuffer(buffer, dtype, shape, order)
    const auto& args = v.object().args->items();
    if (args.size() != 4) return Mismatch(what, "_frombuffer(buffer, dtype, shape, order)", v);
    data = args[0].get();
    dtype_value = args[1].get();
    absl::StatusOr<std::vector<int64_t>> shape = AsShape(*args[2], absl::StrCat(AbslView(what), " shape"));
    if (!shape.ok()) return shape.status();
    array.shape = *std::move(shape);
    absl::StatusOr<std::string> order = AsStr(*args[3], absl::StrCat(AbslView(what), " order"));
    if (!order.ok()) return order.status();
    array.fortran_order = *order == "F";
  } else {
    return Mismatch(what, "a numpy array (numpy.core.multiarray._reconstruct)", v);
  }
  absl::StatusOr<DtypeInfo> dtype = AsNumpyDtype(*dtype_value, what);
  if (!dtype.ok()) return dtype.status();
  array.dtype = dtype->str;
  if (!data->is(Kind::kBytes) && !data->is(Kind::kByteArray) && !data->is(Kind::kStr)) {
    return Mismatch(absl::StrCat(AbslView(what), " data"), "bytes (object arrays are not supported)", *data);
  }
  array.data = data->str();
  if (absl::Status s = CheckDataSize(array, dtype->itemsize, what); !s.ok()) return s;
  return array;
}

absl::StatusOr<ValuePtr> MakeNumpyArray(const NumpyArray& array, bool numpy2) {
  constexpr std::string_view kWhat = "MakeNumpyArray";
  if (array.dtype.size() < 3 || std::string_view("<>|=").find(array.dtype[0]) == std::string_view::npos ||
      std::string_view("biufcSV").find(array.dtype[1]) == std::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(AbslView(kWhat), ": unsupported dtype '", array.dtype, "'"));
  }
  const std::string name = array.dtype.substr(1);
  absl::StatusOr<int64_t> itemsize = ItemSizeFromName(name, kWhat);
  if (!itemsize.ok()) return itemsize.status();
  for (int64_t d : array.shape) {
    if (d < 0) return absl::InvalidArgumentError(absl::StrCat(AbslView(kWhat), ": negative dimension ", d));
  }
  if (absl::Status s = CheckDataSize(array, *itemsize, kWhat); !s.ok()) return s;

  const bool flexible = name[0] == 'S' || name[0] == 'V';
  const char endian = *itemsize == 1 || flexible ? '|' : array.dtype[0] == '=' ? '<' : array.dtype[0];
  Object dtype;
  dtype.callable = Value::Global("numpy", "dtype");
  dtype.how = ObjectHow::kReduce;
  dtype.args = Value::Tuple({Value::Str(name), Value::Bool(false), Value::Bool(true)});
  dtype.state = Value::Tuple({Value::Int(3), Value::Str(std::string(1, endian)), Value::None(), Value::None(),
                              Value::None(), Value::Int(flexible ? *itemsize : -1), Value::Int(flexible ? 1 : -1),
                              Value::Int(0)});

  std::vector<ValuePtr> shape;
  for (int64_t d : array.shape) shape.push_back(Value::Int(d));
  Object ndarray;
  ndarray.callable = Value::Global(numpy2 ? "numpy._core.multiarray" : "numpy.core.multiarray", "_reconstruct");
  ndarray.how = ObjectHow::kReduce;
  ndarray.args = Value::Tuple({Value::Global("numpy", "ndarray"), Value::Tuple({Value::Int(0)}), Value::Bytes("b")});
  ndarray.state = Value::Tuple({Value::Int(1), Value::Tuple(std::move(shape)), Value::MakeObject(std::move(dtype)),
                                Value::Bool(array.fortran_order), Value::Bytes(array.data)});
  return Value::MakeObject(std::move(ndarray));
}

// ---- set ----

absl::StatusOr<const std::vector<ValuePtr>*> AsSet(const Value& v, std::string_view what) {
  if (!v.is(Kind::kSet) && !v.is(Kind::kFrozenSet)) return Mismatch(what, "set or frozenset", v);
  return &v.set_items();
}

}  // namespace ucp::pickle
