// The value model of a pickle stream: what `pickle.load` would build, as data.
//
// A `Value` is an immutable-after-construction tree node (shared with
// `std::shared_ptr` so that memo references and shared sub-objects stay
// shared, as in Python). Nothing from a pickle is ever executed: a global is a
// `Global{module, name}` and a call to it (REDUCE, NEWOBJ, NEWOBJ_EX, BUILD,
// OBJ, INST) is an `Object` holding the callable, its arguments and its state.
//
// A few globals are pure data constructors and are decoded to the value they
// build, because protocol 2 has no other way to write that value:
//   collections.OrderedDict()      -> Dict with ordered_dict() == true (a BUILD
//                                     after its items, e.g. a torch state dict's
//                                     `_metadata`, is kept as dict_state())
//   __builtin__.set([...]) / builtins.set, frozenset  -> Set / FrozenSet
//   _codecs.encode(str, 'latin1')  -> Bytes
//   __builtin__.bytes() / bytearray(...)  -> Bytes / ByteArray
// The writer (writer.h) encodes them back the same way Python does.
//
// Example:
//   ValuePtr d = Value::MakeDict();
//   d->DictSet(Value::Str("lr"), Value::Float(1e-3));
//   const Value* lr = d->DictGet("lr");
//   double x = lr->float_value();
#ifndef UCP_FORMAT_PICKLE_VALUE_H_
#define UCP_FORMAT_PICKLE_VALUE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace ucp::pickle {

class Value;
using ValuePtr = std::shared_ptr<Value>;

// Value::Kind: the Python type a value stands for.
enum class Kind {
  kNone,
  kBool,
  kInt,         // any precision: int64 when it fits, else big_int bytes
  kFloat,
  kStr,         // UTF-8
  kBytes,
  kByteArray,
  kTuple,
  kList,
  kDict,        // insertion ordered; ordered_dict() marks collections.OrderedDict
  kSet,
  kFrozenSet,
  kGlobal,      // a reference to module.name (class or function), never resolved
  kObject,      // the result of calling/constructing a global, as data
  kPersistentId,  // BINPERSID / PERSID: the pid value, for the layer above
};

const char* KindName(Kind kind);

// Object::How: the opcode that built the object.
enum class ObjectHow {
  kReduce,    // callable(*args)            REDUCE
  kNewObj,    // cls.__new__(cls, *args)     NEWOBJ
  kNewObjEx,  // cls.__new__(cls, *args, **kwargs)  NEWOBJ_EX
  kInst,      // protocol 0/1 INST / OBJ
};

// The payload of a kObject value.
struct Object {
  ValuePtr callable;  // usually a kGlobal
  ObjectHow how = ObjectHow::kReduce;
  ValuePtr args;      // a kTuple (empty tuple when none)
  ValuePtr kwargs;    // a kDict for kNewObjEx, else null
  ValuePtr state;     // the BUILD argument, or null when there was no BUILD
  // Items added by APPEND(S) / SETITEM(S) onto a non-container object
  // (e.g. a list or dict subclass reduced with listitems/dictitems).
  std::vector<ValuePtr> list_items;
  std::vector<std::pair<ValuePtr, ValuePtr>> dict_items;
};

// Hash and equality over values with Python semantics for hashable kinds
// (None, bool, int, float, str, bytes, tuple of hashables, frozenset, global).
// 1 == 1.0 == True as in Python. Unhashable kinds compare by identity.
struct ValueHash {
  size_t operator()(const ValuePtr& v) const;
};
struct ValueEq {
  bool operator()(const ValuePtr& a, const ValuePtr& b) const;
};

class Value {
  // Passkey that keeps construction to the factories below while letting them
  // use std::make_shared (one allocation per value).
  class ConstructionKey {
    friend class Value;
    friend class ScalarPool;
    ConstructionKey() = default;
  };

 public:
  // ---- construction ----
  static ValuePtr None();
  static ValuePtr Bool(bool b);
  static ValuePtr Int(int64_t i);
  // Arbitrary precision: little-endian two's complement bytes, as LONG1/LONG4
  // store them. Normalized to int64 when the value fits.
  static ValuePtr BigInt(std::string le_twos_complement);
  static ValuePtr Float(double d);
  static ValuePtr Str(std::string s);
  static ValuePtr Bytes(std::string b);
  static ValuePtr ByteArray(std::string b);
  static ValuePtr Tuple(std::vector<ValuePtr> items);
  static ValuePtr List(std::vector<ValuePtr> items);
  static ValuePtr MakeDict(bool ordered_dict = false);
  static ValuePtr MakeSet(bool frozen = false);
  static ValuePtr Global(std::string module, std::string name);
  static ValuePtr MakeObject(Object object);
  static ValuePtr PersistentId(ValuePtr pid);

  // Use the factories above; public only so that std::make_shared can call it.
  Value(Kind kind, ConstructionKey) : kind_(kind) {}
  // Releases arbitrarily deep trees without deep recursion.
  ~Value();
  Value(const Value&) = delete;
  Value& operator=(const Value&) = delete;

  Kind kind() const { return kind_; }
  bool is(Kind k) const { return kind_ == k; }
  bool is_none() const { return kind_ == Kind::kNone; }

  // ---- scalars (precondition: matching kind) ----
  bool bool_value() const { return kind_ != Kind::kFloat && int_ != 0; }
  // kInt that fits in int64 (check fits_int64()).
  int64_t int_value() const { return kind_ == Kind::kFloat ? 0 : int_; }
  bool fits_int64() const { return !(kind_ == Kind::kInt && payload_ != nullptr); }
  // kInt: little-endian two's complement bytes (minimal length), for any value.
  std::string big_int_bytes() const;
  double float_value() const { return kind_ == Kind::kFloat ? float_ : 0.0; }
  // kStr, kBytes, kByteArray.
  const std::string& str() const { return payload_ != nullptr ? payload_->str : EmptyString(); }

  // ---- sequences: kTuple, kList ----
  const std::vector<ValuePtr>& items() const { return payload_ != nullptr ? payload_->items : EmptyItems(); }
  std::vector<ValuePtr>& mutable_items() { return MutablePayload().items; }
  size_t size() const;

  // ---- kDict ----
  bool ordered_dict() const { return ordered_dict_; }
  const std::vector<std::pair<ValuePtr, ValuePtr>>& dict_items() const {
    return payload_ != nullptr ? payload_->dict : EmptyDictItems();
  }
  // Python `d[key] = value`: replaces in place if the key exists, else appends.
  void DictSet(ValuePtr key, ValuePtr value);
  const Value* DictGet(const ValuePtr& key) const;
  const Value* DictGet(std::string_view str_key) const;
  ValuePtr DictGetPtr(std::string_view str_key) const;
  ValuePtr DictGetPtr(const ValuePtr& key) const;
  bool DictErase(std::string_view str_key);
  // The instance attributes of an OrderedDict (the BUILD state pickled after
  // its items, e.g. the `_metadata` of a torch `state_dict()`), or null.
  const ValuePtr& dict_state() const { return payload_ != nullptr && payload_->extra ? payload_->extra->dict_state : NullValuePtr(); }
  void set_dict_state(ValuePtr state) { MutableExtra().dict_state = std::move(state); }

  // ---- kSet / kFrozenSet (insertion ordered, unique) ----
  const std::vector<ValuePtr>& set_items() const { return items(); }
  void SetAdd(ValuePtr item);

  // ---- kGlobal ----
  const std::string& module() const { return str(); }
  const std::string& name() const { return payload_ != nullptr && payload_->extra ? payload_->extra->name : EmptyString(); }
  bool IsGlobal(std::string_view module, std::string_view name) const;

  // ---- kObject ----
  const Object& object() const { return *payload_->extra->object; }
  Object& mutable_object() { return *payload_->extra->object; }
  // The callable's module/name when it is a global, else empty.
  std::string_view object_module() const;
  std::string_view object_name() const;
  // True for an object whose callable is the global module.name.
  bool IsObjectOf(std::string_view module, std::string_view name) const;

  // ---- kPersistentId ----
  const ValuePtr& pid() const { return payload_ != nullptr && payload_->extra ? payload_->extra->pid : NullValuePtr(); }

  // A short Python-like rendering for messages (truncated past max_len).
  // Visits at most a few thousand values however the tree shares its parts
  // (a DAG of shared tuples is exponential as a tree): past that, "...".
  std::string DebugString(size_t max_len = 200) const;

 private:
  friend class ScalarPool;
  std::string DebugStringBudget(size_t max_len, int64_t* budget) const;
  using Index = absl::flat_hash_map<ValuePtr, size_t, ValueHash, ValueEq>;
  // Parts only globals, objects, persistent ids and large dicts/sets need.
  struct Extra {
    std::string name;  // a global's name
    // key -> position in dict (or items for sets); built when size > 8.
    std::unique_ptr<Index> index;
    std::unique_ptr<Object> object;
    ValuePtr pid;
    ValuePtr dict_state;
  };
  // Everything but the scalar: absent for None, bool, float and int64 ints,
  // so that those stay one small allocation each.
  struct Payload {
    std::string str;  // str/bytes payload, a global's module, or big int bytes
    std::vector<ValuePtr> items;
    std::vector<std::pair<ValuePtr, ValuePtr>> dict;
    std::unique_ptr<Extra> extra;
  };

  static ValuePtr Make(Kind kind);
  static const std::string& EmptyString();
  static const std::vector<ValuePtr>& EmptyItems();
  static const std::vector<std::pair<ValuePtr, ValuePtr>>& EmptyDictItems();
  static const ValuePtr& NullValuePtr();
  Payload& MutablePayload();
  Extra& MutableExtra();
  void RebuildIndex();
  bool HasChildren() const;
  void MoveOutNestedChildren(std::vector<ValuePtr>& out);

  Kind kind_;
  bool ordered_dict_ = false;
  union {
    int64_t int_ = 0;  // kBool, kInt (the low 64 bits of a big int)
    double float_;     // kFloat
  };
  std::unique_ptr<Payload> payload_;
};

// ScalarPool: makes immutable scalar values (int, float) in blocks that share
// one allocation and one reference count, for readers that create millions
// of them. A block is freed when no value from it is referenced any more.
// Not thread-safe; the values it returns are ordinary ValuePtrs.
class ScalarPool {
 public:
  ScalarPool() = default;
  ScalarPool(const ScalarPool&) = delete;
  ScalarPool& operator=(const ScalarPool&) = delete;
  ValuePtr Int(int64_t i);
  ValuePtr Float(double d);

 private:
  struct Block;
  Value* Next(Kind kind);
  std::shared_ptr<Block> block_;
  size_t used_ = 0;
};

// Deep structural equality (tensors are objects, so compared structurally).
// Floats compare bitwise-equal-or-both-NaN. Shared references need not match.
bool DeepEqual(const Value& a, const Value& b);

// Python's hashability: whether `v` may be a dict key or a set item (not a
// list, dict, set or bytearray, nor a tuple holding one or a null item).
bool IsHashable(const Value& v);

// Whether values of `kind` hold references to other values (the kinds
// ForEachChild has children for, and that can be shared or form cycles).
inline bool IsContainer(Kind kind) {
  switch (kind) {
    case Kind::kTuple:
    case Kind::kList:
    case Kind::kDict:
    case Kind::kSet:
    case Kind::kFrozenSet:
    case Kind::kObject:
    case Kind::kPersistentId:
      return true;
    default:
      return false;
  }
}

// Calls f(const ValuePtr&) for every reference `v` holds (some may
// be null), in the order the pickle writer visits them.
template <typename F>
void ForEachChild(const Value& v, F&& f) {
  switch (v.kind()) {
    case Kind::kTuple:
    case Kind::kList:
    case Kind::kSet:
    case Kind::kFrozenSet:
      for (const ValuePtr& item : v.items()) f(item);
      break;
    case Kind::kDict:
      for (const auto& [key, value] : v.dict_items()) {
        f(key);
        f(value);
      }
      f(v.dict_state());
      break;
    case Kind::kObject: {
      const Object& o = v.object();
      f(o.callable);
      f(o.args);
      f(o.kwargs);
      for (const ValuePtr& item : o.list_items) f(item);
      for (const auto& [key, value] : o.dict_items) {
        f(key);
        f(value);
      }
      f(o.state);
      break;
    }
    case Kind::kPersistentId:
      f(v.pid());
      break;
    default:
      break;
  }
}

}  // namespace ucp::pickle

#endif  // UCP_FORMAT_PICKLE_VALUE_H_
