#include "format/torch/dump.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/sha256.h"
#include "format/pickle/accessors.h"

namespace ucp::torch {
namespace {

using pickle::Kind;
using pickle::ObjectHow;
using pickle::Value;
using pickle::ValuePtr;

constexpr size_t kMaxInlineBytes = 64;
constexpr size_t kMaxLines = 50'000'000;

std::string Str(std::string_view s) { return std::string(s.data(), s.size()); }

// Decimal of a little-endian two's complement integer.
std::string BigIntDecimal(const std::string& le) {
  if (le.empty()) return "0";
  std::vector<uint8_t> mag(le.begin(), le.end());
  const bool negative = (mag.back() & 0x80) != 0;
  if (negative) {  // magnitude = ~x + 1
    unsigned carry = 1;
    for (uint8_t& b : mag) {
      unsigned v = static_cast<uint8_t>(~b) + carry;
      b = static_cast<uint8_t>(v);
      carry = v >> 8;
    }
  }
  std::vector<uint8_t> be(mag.rbegin(), mag.rend());  // big-endian for division
  std::string digits;
  auto is_zero = [&] { return std::all_of(be.begin(), be.end(), [](uint8_t b) { return b == 0; }); };
  if (is_zero()) return "0";
  while (!is_zero()) {
    unsigned rem = 0;
    for (uint8_t& b : be) {
      unsigned cur = (rem << 8) | b;
      b = static_cast<uint8_t>(cur / 10);
      rem = cur % 10;
    }
    digits.push_back(static_cast<char>('0' + rem));
  }
  if (negative) digits.push_back('-');
  std::reverse(digits.begin(), digits.end());
  return digits;
}

std::string IntString(const Value& v) {
  return v.fits_int64() ? absl::StrCat(v.int_value()) : BigIntDecimal(v.big_int_bytes());
}

std::string ShapeList(const std::vector<int64_t>& v) { return absl::StrCat("[", absl::StrJoin(v, ", "), "]"); }

std::string GlobalName(const Value& g) { return absl::StrCat(g.module(), ".", g.name()); }

// One-line rendering of a (hashable) value, for dict keys and set order.
std::string KeyRepr(const Value& v) {
  switch (v.kind()) {
    case Kind::kNone: return "None";
    case Kind::kBool: return v.bool_value() ? "True" : "False";
    case Kind::kInt: return IntString(v);
    case Kind::kFloat: return PythonFloatRepr(v.float_value());
    case Kind::kStr: return QuoteBytes(v.str());
    case Kind::kBytes: return "b" + QuoteBytes(v.str());
    case Kind::kTuple: {
      std::vector<std::string> parts;
      for (const ValuePtr& item : v.items()) parts.push_back(item ? KeyRepr(*item) : "?");
      return absl::StrCat("(", absl::StrJoin(parts, ", "), parts.size() == 1 ? ",)" : ")");
    }
    case Kind::kFrozenSet: {
      std::vector<std::string> parts;
      for (const ValuePtr& item : v.set_items()) parts.push_back(item ? KeyRepr(*item) : "?");
      std::sort(parts.begin(), parts.end());
      return absl::StrCat("frozenset({", absl::StrJoin(parts, ", "), "})");
    }
    case Kind::kGlobal: return GlobalName(v);
    case Kind::kObject: {
      std::string_view m = v.object_module(), n = v.object_name();
      return absl::StrCat("<object ", Str(m), ".", Str(n), ">");
    }
    default: return absl::StrCat("<", pickle::KindName(v.kind()), ">");
  }
}

const char* HowName(ObjectHow how) {
  switch (how) {
    case ObjectHow::kReduce: return "reduce";
    case ObjectHow::kNewObj: return "newobj";
    case ObjectHow::kNewObjEx: return "newobj_ex";
    case ObjectHow::kInst: return "inst";
  }
  return "?";
}

// A numpy dtype's `.str` from its pickled form: numpy.dtype(name, False,
// True) + BUILD (version, byteorder, ...). Empty when not recognizable.
std::string NumpyDTypeStr(const Value& v) {
  const pickle::Object& o = v.object();
  if (o.args == nullptr || !o.args->is(Kind::kTuple) || o.args->items().empty() || !o.args->items()[0] ||
      !o.args->items()[0]->is(Kind::kStr) || o.state == nullptr || !o.state->is(Kind::kTuple) ||
      o.state->items().size() < 2 || !o.state->items()[1] || !o.state->items()[1]->is(Kind::kStr)) {
    return "";
  }
  std::string order = o.state->items()[1]->str();
  if (order == "=") order = "<";
  return order + o.args->items()[0]->str();
}

class Dumper {
 public:
  explicit Dumper(const TorchFile* file) : file_(file) {}

  absl::Status Node(const std::string& path, const Value& v) {
    if (++lines_ > kMaxLines) {
      return absl::ResourceExhaustedError(absl::StrCat("dump exceeds ", kMaxLines, " lines"));
    }
    switch (v.kind()) {
      case Kind::kNone: return Line(path, "none");
      case Kind::kBool: return Line(path, v.bool_value() ? "bool True" : "bool False");
      case Kind::kInt: return Line(path, "int " + IntString(v));
      case Kind::kFloat: return Line(path, "float " + PythonFloatRepr(v.float_value()));
      case Kind::kStr: return Line(path, "str " + QuoteBytes(v.str()));
      case Kind::kBytes:
      case Kind::kByteArray: {
        const std::string& b = v.str();
        return Line(path, absl::StrCat(v.is(Kind::kBytes) ? "bytes" : "bytearray", " len=", b.size(), " ",
                                       b.size() <= kMaxInlineBytes ? QuoteBytes(b) : "sha256=" + Sha256Hex(b)));
      }
      case Kind::kTuple:
      case Kind::kList: {
        absl::Status s = Line(path, absl::StrCat(v.is(Kind::kTuple) ? "tuple" : "list", " len=", v.items().size()));
        for (size_t i = 0; i < v.items().size() && s.ok(); ++i) s = Child(absl::StrCat(path, "[", i, "]"), v.items()[i]);
        return s;
      }
      case Kind::kDict: {
        absl::Status s =
            Line(path, absl::StrCat(v.ordered_dict() ? "OrderedDict" : "dict", " len=", v.dict_items().size()));
        for (const auto& [k, item] : v.dict_items()) {
          if (!s.ok()) break;
          s = Child(absl::StrCat(path, "[", k ? KeyRepr(*k) : "?", "]"), item);
        }
        const ValuePtr& state = v.dict_state();
        if (s.ok() && state != nullptr && !(state->is(Kind::kDict) && state->dict_items().empty())) {
          s = Child(path + ".__dict__", state);
        }
        return s;
      }
      case Kind::kSet:
      case Kind::kFrozenSet: {
        absl::Status s = Line(path, absl::StrCat(v.is(Kind::kSet) ? "set" : "frozenset", " len=", v.set_items().size()));
        std::vector<std::pair<std::string, const ValuePtr*>> sorted;
        for (const ValuePtr& item : v.set_items()) sorted.push_back({item ? KeyRepr(*item) : "?", &item});
        std::stable_sort(sorted.begin(), sorted.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
        for (size_t i = 0; i < sorted.size() && s.ok(); ++i) s = Child(absl::StrCat(path, "{", i, "}"), *sorted[i].second);
        return s;
      }
      case Kind::kGlobal: return Line(path, "global " + GlobalName(v));
      case Kind::kPersistentId: return PersistentId(path, v);
      case Kind::kObject: return Object(path, v);
    }
    return Line(path, "?");
  }

  std::string Take() { return std::move(out_); }

 private:
  absl::Status Line(const std::string& path, const std::string& text) {
    absl::StrAppend(&out_, path, " ", text, "\n");
    return absl::OkStatus();
  }

  absl::Status Child(const std::string& path, const ValuePtr& v) {
    if (v == nullptr) return Line(path, "null");
    return Node(path, *v);
  }

  int StorageId(const Storage* s) {
    auto [it, inserted] = storage_ids_.emplace(s, static_cast<int>(storage_ids_.size()));
    return it->second;
  }

  static std::string ViewSha256(const Tensor& t) {
    Sha256 h;
    if (t.is_contiguous()) {
      h.Update(t.data(), t.nbytes());
      return h.HexDigest();
    }
    const int64_t item = static_cast<int64_t>(ItemSize(t.dtype()));
    const int64_t chunk = std::max<int64_t>(1, (int64_t{4} << 20) / item);
    std::string buf;
    for (int64_t pos = 0; pos < t.numel(); pos += chunk) {
      const int64_t c = std::min(chunk, t.numel() - pos);
      buf.resize(static_cast<size_t>(c * item));
      (void)t.CopyFlatRange(pos, c, reinterpret_cast<uint8_t*>(buf.data()));
      h.Update(buf);
    }
    return h.HexDigest();
  }

  absl::Status PersistentId(const std::string& path, const Value& v) {
    if (file_ != nullptr) {
      absl::StatusOr<std::shared_ptr<const Storage>> s = file_->GetStorage(v);
      if (!s.ok()) return s.status();
      const Storage& st = **s;
      Sha256 h;
      h.Update(st.data(), static_cast<size_t>(st.numel()) * ItemSize(st.dtype()));
      return Line(path, absl::StrCat("storage dtype=", Str(DTypeName(st.dtype())), " storage=#", StorageId(&st),
                                     " storage_numel=", st.numel(), " sha256=", h.HexDigest()));
    }
    absl::Status s = Line(path, "persistent_id");
    if (s.ok()) s = Child(path + ".pid", v.pid());
    return s;
  }

  absl::Status Object(const std::string& path, const Value& v) {
    const pickle::Object& o = v.object();
    if (file_ != nullptr && TorchFile::IsTensor(v)) {
      absl::StatusOr<Tensor> t = file_->GetTensor(v);
      if (!t.ok()) return t.status();
      return Line(path, absl::StrCat(v.IsObjectOf("torch._utils", "_rebuild_parameter") ? "parameter" : "tensor",
                                     " dtype=", Str(DTypeName(t->dtype())), " shape=", ShapeList(t->sizes()),
                                     " stride=", ShapeList(t->strides()), " offset=", t->storage_offset(),
                                     " requires_grad=", t->requires_grad() ? "True" : "False",
                                     " storage=#", StorageId(t->storage().get()),
                                     " storage_numel=", t->storage()->numel(), " sha256=", ViewSha256(*t)));
    }
    if (v.IsObjectOf("torch", "Size") && o.how == ObjectHow::kReduce && o.state == nullptr && o.args &&
        o.args->is(Kind::kTuple) && o.args->items().size() == 1 && o.args->items()[0] &&
        o.args->items()[0]->is(Kind::kTuple)) {
      std::vector<std::string> dims;
      bool ints = true;
      for (const ValuePtr& d : o.args->items()[0]->items()) {
        ints = ints && d && d->is(Kind::kInt);
        if (ints) dims.push_back(IntString(*d));
      }
      if (ints) return Line(path, absl::StrCat("torch.Size [", absl::StrJoin(dims, ", "), "]"));
    }
    if (v.IsObjectOf("numpy.core.multiarray", "_reconstruct") || v.IsObjectOf("numpy._core.multiarray", "_reconstruct")) {
      absl::StatusOr<pickle::NumpyArray> a = pickle::AsNumpyArray(v);
      if (a.ok()) {
        return Line(path, absl::StrCat("ndarray dtype=", a->dtype, " shape=", ShapeList(a->shape),
                                       " fortran=", a->fortran_order ? "True" : "False", " sha256=", Sha256Hex(a->data)));
      }
    }
    if (v.IsObjectOf("numpy", "dtype")) {
      std::string s = NumpyDTypeStr(v);
      if (!s.empty()) return Line(path, "numpy.dtype " + s);
    }
    absl::Status s;
    if (o.callable != nullptr && o.callable->is(Kind::kGlobal)) {
      s = Line(path, absl::StrCat("object ", GlobalName(*o.callable), " how=", HowName(o.how)));
    } else {
      s = Line(path, absl::StrCat("object how=", HowName(o.how)));
      if (s.ok()) s = Child(path + ".callable", o.callable);
    }
    if (s.ok()) s = Child(path + ".args", o.args);
    if (s.ok() && o.how == ObjectHow::kNewObjEx && o.kwargs != nullptr &&
        !(o.kwargs->is(Kind::kDict) && o.kwargs->dict_items().empty())) {
      s = Child(path + ".kwargs", o.kwargs);
    }
    if (s.ok() && o.state != nullptr) s = Child(path + ".state", o.state);
    if (s.ok() && !o.list_items.empty()) {
      s = Line(path + ".listitems", absl::StrCat("list len=", o.list_items.size()));
      for (size_t i = 0; i < o.list_items.size() && s.ok(); ++i) {
        s = Child(absl::StrCat(path, ".listitems[", i, "]"), o.list_items[i]);
      }
    }
    if (s.ok() && !o.dict_items.empty()) {
      s = Line(path + ".dictitems", absl::StrCat("dict len=", o.dict_items.size()));
      for (const auto& [k, item] : o.dict_items) {
        if (!s.ok()) break;
        s = Child(absl::StrCat(path, ".dictitems[", k ? KeyRepr(*k) : "?", "]"), item);
      }
    }
    return s;
  }

  const TorchFile* file_;
  std::string out_;
  size_t lines_ = 0;
  absl::flat_hash_map<const Storage*, int> storage_ids_;
};

}  // namespace

std::string QuoteBytes(std::string_view bytes) {
  std::string out = "\"";
  for (unsigned char c : bytes) {
    if (c >= 0x20 && c < 0x7F && c != '"' && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      absl::StrAppend(&out, absl::StrFormat("\\x%02x", c));
    }
  }
  out.push_back('"');
  return out;
}

std::string PythonFloatRepr(double d) {
  if (std::isnan(d)) {
    uint64_t bits;
    std::memcpy(&bits, &d, 8);
    return absl::StrFormat("nan:0x%016x", bits);
  }
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // shortest round trip: [-]D[.DDD]e[+-]XX
  std::string sign;
  size_t pos = 0;
  if (sci[0] == '-') {
    sign = "-";
    pos = 1;
  }
  const size_t e_pos = sci.find('e');
  std::string digits;
  for (size_t i = pos; i < e_pos; ++i) {
    if (sci[i] != '.') digits.push_back(sci[i]);
  }
  const int exp = std::stoi(sci.substr(e_pos + 1));
  const int ndigits = static_cast<int>(digits.size());
  if (exp < -4 || exp >= 16) {
    std::string mant = digits.substr(0, 1);
    if (ndigits > 1) mant += "." + digits.substr(1);
    return absl::StrFormat("%s%se%c%02d", sign, mant, exp < 0 ? '-' : '+', std::abs(exp));
  }
  const int decpt = exp + 1;
  if (decpt <= 0) return sign + "0." + std::string(-decpt, '0') + digits;
  if (decpt >= ndigits) return sign + digits + std::string(decpt - ndigits, '0') + ".0";
  return sign + digits.substr(0, decpt) + "." + digits.substr(decpt);
}

absl::StatusOr<std::string> CanonicalDumpValue(const pickle::Value& root, const TorchFile* file) {
  Dumper dumper(file);
  absl::Status s = dumper.Node("$", root);
  if (!s.ok()) return s;
  return dumper.Take();
}

absl::StatusOr<std::string> CanonicalDump(const TorchFile& file) {
  if (file.root() == nullptr) return absl::InvalidArgumentError(file.path() + ": no tree");
  return CanonicalDumpValue(*file.root(), &file);
}

}  // namespace ucp::torch
