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
//   collections.OrderedDict()      -> Dict with ordered_dict() == true
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

  Kind kind() const { return kind_; }
  bool is(Kind k) const { return kind_ == k; }
  bool is_none() const { return kind_ == Kind::kNone; }

  // ---- scalars (precondition: matching kind) ----
  bool bool_value() const { return int_; }
  // kInt that fits in int64 (check fits_int64()).
  int64_t int_value() const { return int_; }
  bool fits_int64() const { return big_.empty(); }
  // kInt: little-endian two's complement bytes (minimal length), for any value.
  std::string big_int_bytes() const;
  double float_value() const { return float_; }
  // kStr, kBytes, kByteArray.
  const std::string& str() const { return str_; }

  // ---- sequences: kTuple, kList ----
  const std::vector<ValuePtr>& items() const { return items_; }
  std::vector<ValuePtr>& mutable_items() { return items_; }
  size_t size() const;

  // ---- kDict ----
  bool ordered_dict() const { return ordered_dict_; }
  const std::vector<std::pair<ValuePtr, ValuePtr>>& dict_items() const { return dict_; }
  // Python `d[key] = value`: replaces in place if the key exists, else appends.
  void DictSet(ValuePtr key, ValuePtr value);
  const Value* DictGet(const ValuePtr& key) const;
  const Value* DictGet(std::string_view str_key) const;
  ValuePtr DictGetPtr(std::string_view str_key) const;
  ValuePtr DictGetPtr(const ValuePtr& key) const;
  bool DictErase(std::string_view str_key);

  // ---- kSet / kFrozenSet (insertion ordered, unique) ----
  const std::vector<ValuePtr>& set_items() const { return items_; }
  void SetAdd(ValuePtr item);

  // ---- kGlobal ----
  const std::string& module() const { return str_; }
  const std::string& name() const { return name_; }
  bool IsGlobal(std::string_view module, std::string_view name) const;

  // ---- kObject ----
  const Object& object() const { return *object_; }
  Object& mutable_object() { return *object_; }
  // The callable's module/name when it is a global, else empty.
  std::string_view object_module() const;
  std::string_view object_name() const;
  // True for an object whose callable is the global module.name.
  bool IsObjectOf(std::string_view module, std::string_view name) const;

  // ---- kPersistentId ----
  const ValuePtr& pid() const { return pid_; }

  // A short Python-like rendering for messages (truncated past max_len).
  std::string DebugString(size_t max_len = 200) const;

 private:
  explicit Value(Kind kind) : kind_(kind) {}
  void RebuildIndex();

  Kind kind_;
  bool ordered_dict_ = false;
  int64_t int_ = 0;
  std::string big_;  // non-empty only for ints outside int64
  double float_ = 0;
  std::string str_;   // str/bytes payload, or a global's module
  std::string name_;  // a global's name
  std::vector<ValuePtr> items_;
  std::vector<std::pair<ValuePtr, ValuePtr>> dict_;
  // key -> position in dict_ (or items_ for sets); built when size > 8.
  std::unique_ptr<absl::flat_hash_map<ValuePtr, size_t, ValueHash, ValueEq>> index_;
  std::unique_ptr<Object> object_;
  ValuePtr pid_;
};

// Deep structural equality (tensors are objects, so compared structurally).
// Floats compare bitwise-equal-or-both-NaN. Shared references need not match.
bool DeepEqual(const Value& a, const Value& b);

}  // namespace ucp::pickle

#endif  // UCP_FORMAT_PICKLE_VALUE_H_
