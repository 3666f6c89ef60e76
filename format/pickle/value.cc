#include "format/pickle/value.h"

#include <cmath>
#include <cstring>
#include <new>

#include "absl/hash/hash.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ucp::pickle {
namespace {

constexpr size_t kIndexThreshold = 8;

// Normalizes little-endian two's complement bytes to minimal length.
std::string TrimTwosComplement(std::string b) {
  while (b.size() > 1) {
    const uint8_t last = static_cast<uint8_t>(b.back());
    const uint8_t prev = static_cast<uint8_t>(b[b.size() - 2]);
    if ((last == 0x00 && (prev & 0x80) == 0) || (last == 0xff && (prev & 0x80) != 0)) {
      b.pop_back();
    } else {
      break;
    }
  }
  return b;
}

bool IsNumeric(const Value& v) {
  return v.is(Kind::kBool) || v.is(Kind::kInt) || v.is(Kind::kFloat);
}

// Python's numeric equality across bool/int/float for values that fit.
bool NumericEq(const Value& a, const Value& b) {
  if (a.is(Kind::kFloat) || b.is(Kind::kFloat)) {
    if ((a.is(Kind::kInt) && !a.fits_int64()) || (b.is(Kind::kInt) && !b.fits_int64())) return false;
    const double x = a.is(Kind::kFloat) ? a.float_value() : static_cast<double>(a.int_value());
    const double y = b.is(Kind::kFloat) ? b.float_value() : static_cast<double>(b.int_value());
    return x == y;
  }
  if (!a.fits_int64() || !b.fits_int64()) return a.big_int_bytes() == b.big_int_bytes();
  return a.int_value() == b.int_value();
}

}  // namespace

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kNone: return "None";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kStr: return "str";
    case Kind::kBytes: return "bytes";
    case Kind::kByteArray: return "bytearray";
    case Kind::kTuple: return "tuple";
    case Kind::kList: return "list";
    case Kind::kDict: return "dict";
    case Kind::kSet: return "set";
    case Kind::kFrozenSet: return "frozenset";
    case Kind::kGlobal: return "global";
    case Kind::kObject: return "object";
    case Kind::kPersistentId: return "persistent_id";
  }
  return "?";
}

size_t ValueHash::operator()(const ValuePtr& p) const {
  const Value& v = *p;
  switch (v.kind()) {
    case Kind::kNone: return 0x9e3779b9;
    case Kind::kBool:
    case Kind::kInt:
      if (!v.fits_int64()) return absl::HashOf(v.big_int_bytes());
      return absl::HashOf(static_cast<double>(v.int_value()));
    case Kind::kFloat: {
      const double d = v.float_value();
      if (std::isnan(d)) return 0x7ff8;
      return absl::HashOf(d == 0 ? 0.0 : d);
    }
    case Kind::kStr: return absl::HashOf(1, v.str());
    case Kind::kBytes: return absl::HashOf(2, v.str());
    case Kind::kTuple: {
      size_t h = 0x345678;
      for (const auto& item : v.items()) h = h * 1000003 ^ (*this)(item);
      return h;
    }
    case Kind::kFrozenSet: {
      size_t h = 0x5a5a;
      for (const auto& item : v.set_items()) h ^= (*this)(item) * 0x9e3779b97f4a7c15ULL;
      return h;
    }
    case Kind::kGlobal: return absl::HashOf(3, v.module(), v.name());
    default: return std::hash<const void*>()(p.get());
  }
}

bool ValueEq::operator()(const ValuePtr& pa, const ValuePtr& pb) const {
  if (pa.get() == pb.get()) return true;
  const Value& a = *pa;
  const Value& b = *pb;
  if (IsNumeric(a) && IsNumeric(b)) return NumericEq(a, b);
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::kNone: return true;
    case Kind::kStr:
    case Kind::kBytes: return a.str() == b.str();
    case Kind::kTuple: {
      if (a.items().size() != b.items().size()) return false;
      for (size_t i = 0; i < a.items().size(); ++i) {
        if (!(*this)(a.items()[i], b.items()[i])) return false;
      }
      return true;
    }
    case Kind::kFrozenSet: {
      if (a.set_items().size() != b.set_items().size()) return false;
      for (const auto& x : a.set_items()) {
        bool found = false;
        for (const auto& y : b.set_items()) {
          if ((*this)(x, y)) { found = true; break; }
        }
        if (!found) return false;
      }
      return true;
    }
    case Kind::kGlobal: return a.module() == b.module() && a.name() == b.name();
    default: return false;  // unhashable kinds: identity only
  }
}

ValuePtr Value::Make(Kind kind) { return std::make_shared<Value>(kind, ConstructionKey()); }

const std::string& Value::EmptyString() {
  static const std::string* const kEmpty = new std::string();
  return *kEmpty;
}
const std::vector<ValuePtr>& Value::EmptyItems() {
  static const std::vector<ValuePtr>* const kEmpty = new std::vector<ValuePtr>();
  return *kEmpty;
}
const std::vector<std::pair<ValuePtr, ValuePtr>>& Value::EmptyDictItems() {
  static const std::vector<std::pair<ValuePtr, ValuePtr>>* const kEmpty =
      new std::vector<std::pair<ValuePtr, ValuePtr>>();
  return *kEmpty;
}
const ValuePtr& Value::NullValuePtr() {
  static const ValuePtr* const kNull = new ValuePtr();
  return *kNull;
}

Value::Payload& Value::MutablePayload() {
  if (payload_ == nullptr) payload_ = std::make_unique<Payload>();
  return *payload_;
}

Value::Extra& Value::MutableExtra() {
  Payload& payload = MutablePayload();
  if (payload.extra == nullptr) payload.extra = std::make_unique<Extra>();
  return *payload.extra;
}

bool Value::HasChildren() const {
  if (payload_ == nullptr) return false;
  if (!payload_->items.empty() || !payload_->dict.empty()) return true;
  const Extra* extra = payload_->extra.get();
  return extra != nullptr && (extra->object != nullptr || extra->pid != nullptr || extra->dict_state != nullptr);
}

void Value::MoveOutNestedChildren(std::vector<ValuePtr>& out) {
  auto take = [&out](ValuePtr& child) {
    if (child != nullptr && child->HasChildren()) out.push_back(std::move(child));
  };
  if (payload_->extra != nullptr) payload_->extra->index.reset();
  for (ValuePtr& item : payload_->items) take(item);
  for (auto& [key, value] : payload_->dict) {
    take(key);
    take(value);
  }
  if (Extra* extra = payload_->extra.get()) {
    take(extra->pid);
    take(extra->dict_state);
    if (Object* object = extra->object.get()) {
      take(object->callable);
      take(object->args);
      take(object->kwargs);
      take(object->state);
      for (ValuePtr& item : object->list_items) take(item);
      for (auto& [key, value] : object->dict_items) {
        take(key);
        take(value);
      }
    }
  }
}

namespace {
// Containers whose destruction was deferred by an enclosing ~Value (see below).
thread_local std::vector<ValuePtr>* t_deferred_releases = nullptr;
}  // namespace

// Destroying a chain of a million nested lists through shared_ptr would
// recurse a million frames deep. Instead the outermost ~Value on the thread
// collects nested containers into a work list and releases them one by one;
// nested ~Value calls only append to that list.
Value::~Value() {
  if (!HasChildren()) return;
  if (t_deferred_releases != nullptr) {
    MoveOutNestedChildren(*t_deferred_releases);
    return;
  }
  std::vector<ValuePtr> pending;
  MoveOutNestedChildren(pending);
  if (pending.empty()) return;
  payload_.reset();
  t_deferred_releases = &pending;
  while (!pending.empty()) {
    ValuePtr next = std::move(pending.back());
    pending.pop_back();
    next.reset();
  }
  t_deferred_releases = nullptr;
}

ValuePtr Value::None() { return Make(Kind::kNone); }
ValuePtr Value::Bool(bool b) {
  ValuePtr v = Make(Kind::kBool);
  v->int_ = b ? 1 : 0;
  return v;
}
ValuePtr Value::Int(int64_t i) {
  ValuePtr v = Make(Kind::kInt);
  v->int_ = i;
  return v;
}
ValuePtr Value::BigInt(std::string le) {
  if (le.empty()) return Int(0);
  le = TrimTwosComplement(std::move(le));
  if (le.size() <= 8) {
    uint64_t u = 0;
    for (size_t i = 0; i < le.size(); ++i) u |= static_cast<uint64_t>(static_cast<uint8_t>(le[i])) << (8 * i);
    if (le.size() < 8 && (static_cast<uint8_t>(le.back()) & 0x80)) {
      for (size_t i = le.size(); i < 8; ++i) u |= 0xffULL << (8 * i);
    }
    return Int(static_cast<int64_t>(u));
  }
  ValuePtr v = Make(Kind::kInt);
  // int_ keeps the low 64 bits for convenience; fits_int64() is false.
  uint64_t u = 0;
  for (size_t i = 0; i < 8; ++i) u |= static_cast<uint64_t>(static_cast<uint8_t>(le[i])) << (8 * i);
  v->int_ = static_cast<int64_t>(u);
  v->MutablePayload().str = std::move(le);
  return v;
}
ValuePtr Value::Float(double d) {
  ValuePtr v = Make(Kind::kFloat);
  v->float_ = d;
  return v;
}
ValuePtr Value::Str(std::string s) {
  ValuePtr v = Make(Kind::kStr);
  v->MutablePayload().str = std::move(s);
  return v;
}
ValuePtr Value::Bytes(std::string b) {
  ValuePtr v = Make(Kind::kBytes);
  v->MutablePayload().str = std::move(b);
  return v;
}
ValuePtr Value::ByteArray(std::string b) {
  ValuePtr v = Make(Kind::kByteArray);
  v->MutablePayload().str = std::move(b);
  return v;
}
ValuePtr Value::Tuple(std::vector<ValuePtr> items) {
  ValuePtr v = Make(Kind::kTuple);
  v->MutablePayload().items = std::move(items);
  return v;
}
ValuePtr Value::List(std::vector<ValuePtr> items) {
  ValuePtr v = Make(Kind::kList);
  v->MutablePayload().items = std::move(items);
  return v;
}
ValuePtr Value::MakeDict(bool ordered_dict) {
  ValuePtr v = Make(Kind::kDict);
  v->ordered_dict_ = ordered_dict;
  v->MutablePayload();
  return v;
}
ValuePtr Value::MakeSet(bool frozen) {
  ValuePtr v = Make(frozen ? Kind::kFrozenSet : Kind::kSet);
  v->MutablePayload();
  return v;
}
ValuePtr Value::Global(std::string module, std::string name) {
  ValuePtr v = Make(Kind::kGlobal);
  v->MutablePayload().str = std::move(module);
  v->MutableExtra().name = std::move(name);
  return v;
}
ValuePtr Value::MakeObject(Object object) {
  ValuePtr v = Make(Kind::kObject);
  if (!object.args) object.args = Tuple({});
  v->MutableExtra().object = std::make_unique<Object>(std::move(object));
  return v;
}
ValuePtr Value::PersistentId(ValuePtr pid) {
  ValuePtr v = Make(Kind::kPersistentId);
  v->MutableExtra().pid = std::move(pid);
  return v;
}

std::string Value::big_int_bytes() const {
  if (kind_ == Kind::kInt && payload_ != nullptr) return payload_->str;
  if (int_ == 0) return std::string();  // Python encodes 0 as LONG1 with 0 bytes
  std::string b(8, '\0');
  const uint64_t u = static_cast<uint64_t>(int_);
  for (size_t i = 0; i < 8; ++i) b[i] = static_cast<char>((u >> (8 * i)) & 0xff);
  return TrimTwosComplement(std::move(b));
}

size_t Value::size() const {
  switch (kind_) {
    case Kind::kDict: return dict_items().size();
    case Kind::kStr:
    case Kind::kBytes:
    case Kind::kByteArray: return str().size();
    default: return items().size();
  }
}

void Value::RebuildIndex() {
  Extra& extra = MutableExtra();
  extra.index = std::make_unique<Index>();
  if (kind_ == Kind::kDict) {
    const auto& dict = payload_->dict;
    for (size_t i = 0; i < dict.size(); ++i) extra.index->emplace(dict[i].first, i);
  } else {
    const auto& items = payload_->items;
    for (size_t i = 0; i < items.size(); ++i) extra.index->emplace(items[i], i);
  }
}

void Value::DictSet(ValuePtr key, ValuePtr value) {
  Payload& payload = MutablePayload();
  auto& dict = payload.dict;
  Index* index = payload.extra != nullptr ? payload.extra->index.get() : nullptr;
  if (index != nullptr) {
    auto it = index->find(key);
    if (it != index->end()) {
      dict[it->second].second = std::move(value);
      return;
    }
    index->emplace(key, dict.size());
    dict.emplace_back(std::move(key), std::move(value));
    return;
  }
  ValueEq eq;
  for (auto& entry : dict) {
    if (eq(entry.first, key)) {
      entry.second = std::move(value);
      return;
    }
  }
  dict.emplace_back(std::move(key), std::move(value));
  if (dict.size() > kIndexThreshold) RebuildIndex();
}

ValuePtr Value::DictGetPtr(const ValuePtr& key) const {
  const auto& dict = dict_items();
  const Index* index = payload_ != nullptr && payload_->extra != nullptr ? payload_->extra->index.get() : nullptr;
  if (index != nullptr) {
    auto it = index->find(key);
    return it == index->end() ? nullptr : dict[it->second].second;
  }
  ValueEq eq;
  for (const auto& entry : dict) {
    if (eq(entry.first, key)) return entry.second;
  }
  return nullptr;
}

const Value* Value::DictGet(const ValuePtr& key) const { return DictGetPtr(key).get(); }

ValuePtr Value::DictGetPtr(std::string_view str_key) const {
  if (payload_ != nullptr && payload_->extra != nullptr && payload_->extra->index != nullptr) {
    return DictGetPtr(Str(std::string(str_key)));
  }
  for (const auto& entry : dict_items()) {
    if (entry.first->is(Kind::kStr) && entry.first->str() == str_key) return entry.second;
  }
  return nullptr;
}

const Value* Value::DictGet(std::string_view str_key) const { return DictGetPtr(str_key).get(); }

bool Value::DictErase(std::string_view str_key) {
  if (payload_ == nullptr) return false;
  auto& dict = payload_->dict;
  for (size_t i = 0; i < dict.size(); ++i) {
    if (dict[i].first->is(Kind::kStr) && dict[i].first->str() == str_key) {
      dict.erase(dict.begin() + i);
      if (payload_->extra != nullptr && payload_->extra->index != nullptr) RebuildIndex();
      return true;
    }
  }
  return false;
}

void Value::SetAdd(ValuePtr item) {
  Payload& payload = MutablePayload();
  auto& items = payload.items;
  Index* index = payload.extra != nullptr ? payload.extra->index.get() : nullptr;
  if (index != nullptr) {
    if (index->contains(item)) return;
    index->emplace(item, items.size());
    items.push_back(std::move(item));
    return;
  }
  ValueEq eq;
  for (const auto& x : items) {
    if (eq(x, item)) return;
  }
  items.push_back(std::move(item));
  if (items.size() > kIndexThreshold) RebuildIndex();
}

// ---- ScalarPool ----

struct ScalarPool::Block {
  static constexpr size_t kValues = 2048;
  // User-provided, so that std::make_shared<Block>() leaves `storage`
  // uninitialized: value-initializing it zeroed 2048 values (and faulted
  // in their pages) for every pickle parsed, a few ints each in a small
  // file (a layer file: 8% of opening a checkpoint of 148 of them).
  Block() {}
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;
  ~Block() {
    for (size_t i = 0; i < constructed; ++i) at(i)->~Value();
  }
  Value* at(size_t i) { return reinterpret_cast<Value*>(storage) + i; }
  alignas(Value) unsigned char storage[kValues * sizeof(Value)];
  size_t constructed = 0;
};

Value* ScalarPool::Next(Kind kind) {
  if (block_ == nullptr || used_ == Block::kValues) {
    block_ = std::make_shared<Block>();
    used_ = 0;
  }
  Value* v = new (block_->at(used_)) Value(kind, Value::ConstructionKey());
  ++used_;
  block_->constructed = used_;
  return v;
}

ValuePtr ScalarPool::Int(int64_t i) {
  Value* v = Next(Kind::kInt);
  v->int_ = i;
  return ValuePtr(block_, v);
}

ValuePtr ScalarPool::Float(double d) {
  Value* v = Next(Kind::kFloat);
  v->float_ = d;
  return ValuePtr(block_, v);
}

bool Value::IsGlobal(std::string_view module, std::string_view name) const {
  return kind_ == Kind::kGlobal && this->module() == module && this->name() == name;
}

std::string_view Value::object_module() const {
  if (kind_ != Kind::kObject || !object().callable || !object().callable->is(Kind::kGlobal)) return {};
  return object().callable->module();
}
std::string_view Value::object_name() const {
  if (kind_ != Kind::kObject || !object().callable || !object().callable->is(Kind::kGlobal)) return {};
  return object().callable->name();
}
bool Value::IsObjectOf(std::string_view module, std::string_view name) const {
  return kind_ == Kind::kObject && object_module() == module && object_name() == name;
}

std::string Value::DebugString(size_t max_len) const {
  int64_t budget = 4096;
  return DebugStringBudget(max_len, &budget);
}

std::string Value::DebugStringBudget(size_t max_len, int64_t* budget) const {
  if (--*budget < 0) return "...";
  std::string out;
  switch (kind_) {
    case Kind::kNone: out = "None"; break;
    case Kind::kBool: out = int_ ? "True" : "False"; break;
    case Kind::kInt:
      out = fits_int64() ? absl::StrCat(int_) : absl::StrCat("<int of ", payload_->str.size(), " bytes>");
      break;
    case Kind::kFloat: out = absl::StrCat(float_); break;
    case Kind::kStr: out = absl::StrCat("'", absl::CHexEscape(str().substr(0, max_len)), "'"); break;
    case Kind::kBytes: out = absl::StrCat("b'", absl::CHexEscape(str().substr(0, max_len)), "'"); break;
    case Kind::kByteArray:
      out = absl::StrCat("bytearray(b'", absl::CHexEscape(str().substr(0, max_len)), "')");
      break;
    case Kind::kTuple:
    case Kind::kList:
    case Kind::kSet:
    case Kind::kFrozenSet: {
      std::vector<std::string> parts;
      for (const auto& item : items()) {
        parts.push_back(item->DebugStringBudget(max_len, budget));
        if (parts.size() > 8) {
          parts.push_back("...");
          break;
        }
      }
      const char* open = kind_ == Kind::kTuple ? "(" : kind_ == Kind::kList ? "[" : "{";
      const char* close = kind_ == Kind::kTuple ? ")" : kind_ == Kind::kList ? "]" : "}";
      out = absl::StrCat(kind_ == Kind::kFrozenSet ? "frozenset(" : "", open, absl::StrJoin(parts, ", "),
                         close, kind_ == Kind::kFrozenSet ? ")" : "");
      break;
    }
    case Kind::kDict: {
      std::vector<std::string> parts;
      for (const auto& [k, v] : dict_items()) {
        parts.push_back(absl::StrCat(k->DebugStringBudget(max_len, budget), ": ", v->DebugStringBudget(max_len, budget)));
        if (parts.size() > 8) {
          parts.push_back("...");
          break;
        }
      }
      out = absl::StrCat(ordered_dict_ ? "OrderedDict(" : "", "{", absl::StrJoin(parts, ", "), "}",
                         ordered_dict_ ? ")" : "");
      if (dict_state()) absl::StrAppend(&out, ".__setstate__(", dict_state()->DebugStringBudget(max_len, budget), ")");
      break;
    }
    case Kind::kGlobal: out = absl::StrCat(module(), ".", name()); break;
    case Kind::kObject: {
      const Object& o = object();
      out = absl::StrCat(o.callable ? o.callable->DebugStringBudget(max_len, budget) : "?",
                         o.args ? o.args->DebugStringBudget(max_len, budget) : "()");
      if (o.state) absl::StrAppend(&out, ".__setstate__(", o.state->DebugStringBudget(max_len, budget), ")");
      break;
    }
    case Kind::kPersistentId:
      out = absl::StrCat("persistent_id(", pid() ? pid()->DebugStringBudget(max_len, budget) : "?", ")");
      break;
  }
  if (out.size() > max_len) out = out.substr(0, max_len) + "...";
  return out;
}

namespace {

bool DeepEqualImpl(const Value& a, const Value& b, int depth) {
  if (&a == &b) return true;
  if (depth > 10000) return false;
  if (a.kind() != b.kind()) return false;
  auto eq_ptr = [depth](const ValuePtr& x, const ValuePtr& y) {
    if (!x || !y) return !x && !y;
    return DeepEqualImpl(*x, *y, depth + 1);
  };
  switch (a.kind()) {
    case Kind::kNone: return true;
    case Kind::kBool:
    case Kind::kInt: return a.big_int_bytes() == b.big_int_bytes();
    case Kind::kFloat: {
      const double x = a.float_value();
      const double y = b.float_value();
      if (std::isnan(x) && std::isnan(y)) return true;
      return std::memcmp(&x, &y, sizeof(double)) == 0;
    }
    case Kind::kStr:
    case Kind::kBytes:
    case Kind::kByteArray: return a.str() == b.str();
    case Kind::kTuple:
    case Kind::kList:
    case Kind::kSet:
    case Kind::kFrozenSet: {
      if (a.items().size() != b.items().size()) return false;
      for (size_t i = 0; i < a.items().size(); ++i) {
        if (!eq_ptr(a.items()[i], b.items()[i])) return false;
      }
      return true;
    }
    case Kind::kDict: {
      if (a.ordered_dict() != b.ordered_dict()) return false;
      if (!eq_ptr(a.dict_state(), b.dict_state())) return false;
      if (a.dict_items().size() != b.dict_items().size()) return false;
      for (size_t i = 0; i < a.dict_items().size(); ++i) {
        if (!eq_ptr(a.dict_items()[i].first, b.dict_items()[i].first)) return false;
        if (!eq_ptr(a.dict_items()[i].second, b.dict_items()[i].second)) return false;
      }
      return true;
    }
    case Kind::kGlobal: return a.module() == b.module() && a.name() == b.name();
    case Kind::kObject: {
      const Object& x = a.object();
      const Object& y = b.object();
      if (x.how != y.how) return false;
      if (!eq_ptr(x.callable, y.callable) || !eq_ptr(x.args, y.args) || !eq_ptr(x.kwargs, y.kwargs) ||
          !eq_ptr(x.state, y.state)) {
        return false;
      }
      if (x.list_items.size() != y.list_items.size() || x.dict_items.size() != y.dict_items.size()) return false;
      for (size_t i = 0; i < x.list_items.size(); ++i) {
        if (!eq_ptr(x.list_items[i], y.list_items[i])) return false;
      }
      for (size_t i = 0; i < x.dict_items.size(); ++i) {
        if (!eq_ptr(x.dict_items[i].first, y.dict_items[i].first) ||
            !eq_ptr(x.dict_items[i].second, y.dict_items[i].second)) {
          return false;
        }
      }
      return true;
    }
    case Kind::kPersistentId: return eq_ptr(a.pid(), b.pid());
  }
  return false;
}

}  // namespace

bool DeepEqual(const Value& a, const Value& b) { return DeepEqualImpl(a, b, 0); }

bool IsHashable(const Value& v) {
  switch (v.kind()) {
    case Kind::kList:
    case Kind::kDict:
    case Kind::kSet:
    case Kind::kByteArray:
      return false;
    case Kind::kTuple:
      for (const ValuePtr& item : v.items()) {
        if (item == nullptr || !IsHashable(*item)) return false;
      }
      return true;
    default:
      return true;
  }
}

}  // namespace ucp::pickle
