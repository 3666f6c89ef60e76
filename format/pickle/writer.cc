#include "format/pickle/writer.h"

#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "format/pickle/internal/compat_names.h"
#include "format/pickle/internal/opcodes.h"
#include "format/pickle/internal/text.h"

namespace ucp::pickle {
namespace {

namespace op = internal_opcodes;

// CPython's pickler writes APPENDS/SETITEMS in batches of this many items.
constexpr size_t kBatchSize = 1000;

// Writes what CPython 3.11's C pickler (Modules/_pickle.c) writes at
// protocol 2 for the Python object a Value stands for: same opcodes, same
// memo numbering (every str, bytes, non-empty tuple, list, dict, set, global
// and object is memoized when first written and fetched with BINGET after),
// same batching.
class Pickler {
 public:
  explicit Pickler(const WriteOptions& options) : options_(options) {}

  absl::StatusOr<std::string> Run(const Value& root) {
    out_.push_back(static_cast<char>(op::kProto));
    out_.push_back(2);
    if (absl::Status s = Save(root); !s.ok()) return s;
    out_.push_back(static_cast<char>(op::kStop));
    return std::move(out_);
  }

 private:
  absl::Status Invalid(absl::string_view message) const {
    return absl::InvalidArgumentError(absl::StrCat("pickle writer: ", message));
  }

  // ---- raw output ----
  void Op(uint8_t opcode) { out_.push_back(static_cast<char>(opcode)); }
  void LittleEndian(uint64_t x, size_t n) {
    for (size_t i = 0; i < n; ++i) out_.push_back(static_cast<char>((x >> (8 * i)) & 0xff));
  }
  void Text(std::string_view s) { out_.append(s.data(), s.size()); }

  // ---- memo ----
  absl::StatusOr<uint32_t> NextMemoIndex() {
    if (next_memo_ == UINT32_MAX) return Invalid("more than 2^32 - 1 memo entries");
    return next_memo_++;
  }
  void WritePut(uint32_t index) {
    if (index < 256) {
      Op(op::kBinPut);
      LittleEndian(index, 1);
    } else {
      Op(op::kLongBinPut);
      LittleEndian(index, 4);
    }
  }
  void WriteGet(uint32_t index) {
    if (index < 256) {
      Op(op::kBinGet);
      LittleEndian(index, 1);
    } else {
      Op(op::kLongBinGet);
      LittleEndian(index, 4);
    }
  }
  // Memoizes what was just written; `v` (may be null: a temporary CPython
  // builds while pickling, never seen again) is what a later reference to
  // the same Value will fetch.
  absl::Status Memoize(const Value* v) {
    absl::StatusOr<uint32_t> index = NextMemoIndex();
    if (!index.ok()) return index.status();
    if (v != nullptr) memo_.emplace(v, *index);
    WritePut(*index);
    return absl::OkStatus();
  }

  // ---- leaves ----
  void SaveInt(const Value& v) {
    if (v.fits_int64()) {
      const int64_t x = v.int_value();
      if (x >= 0 && x <= 0xff) {
        Op(op::kBinInt1);
        LittleEndian(static_cast<uint64_t>(x), 1);
        return;
      }
      if (x >= 0 && x <= 0xffff) {
        Op(op::kBinInt2);
        LittleEndian(static_cast<uint64_t>(x), 2);
        return;
      }
      if (x >= INT32_MIN && x <= INT32_MAX) {
        Op(op::kBinInt);
        LittleEndian(static_cast<uint32_t>(static_cast<int32_t>(x)), 4);
        return;
      }
    }
    const std::string bytes = v.big_int_bytes();
    if (bytes.size() < 256) {
      Op(op::kLong1);
      LittleEndian(bytes.size(), 1);
    } else {
      Op(op::kLong4);
      LittleEndian(bytes.size(), 4);
    }
    Text(bytes);
  }

  void SaveFloat(double d) {
    uint64_t bits;
    std::memcpy(&bits, &d, sizeof bits);
    Op(op::kBinFloat);
    for (int i = 7; i >= 0; --i) out_.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
  }

  void WriteBinUnicode(std::string_view utf8) {
    Op(op::kBinUnicode);
    LittleEndian(utf8.size(), 4);
    Text(utf8);
  }

  // A str CPython builds while pickling bytes (their latin-1 text, decoded by
  // PyUnicode_DecodeLatin1): '' and 1-character results are CPython's
  // singletons, so they are memoized once per pickle.
  absl::Status SaveTemporaryStr(std::string_view utf8) {
    // Latin-1 text: one character is 1 byte (ASCII) or 2 (U+0080-U+00FF).
    const bool one_character =
        utf8.size() == 1 || (utf8.size() == 2 && (static_cast<uint8_t>(utf8[0]) & 0xfe) == 0xc2);
    const bool singleton = utf8.empty() || one_character;
    const std::string key(utf8);
    if (singleton) {
      if (utf8.empty() && empty_str_.has_value()) {
        WriteGet(*empty_str_);
        return absl::OkStatus();
      }
      auto it = latin1_char_strs_.find(key);
      if (it != latin1_char_strs_.end()) {
        WriteGet(it->second);
        return absl::OkStatus();
      }
    }
    WriteBinUnicode(utf8);
    absl::StatusOr<uint32_t> index = NextMemoIndex();
    if (!index.ok()) return index.status();
    if (utf8.empty()) {
      empty_str_ = *index;
    } else if (singleton) {
      latin1_char_strs_.emplace(key, *index);
    }
    WritePut(*index);
    return absl::OkStatus();
  }

  // A str of the tree, memoized by identity (a file's two memo entries for
  // equal strs stay two, as torch's `str(n)` storage keys need); only '' is
  // shared by content, since CPython has a single empty str.
  absl::Status SaveStr(const Value& v) {
    if (!internal_text::IsPickleUtf8(v.str())) {
      return Invalid(absl::StrCat("str ", v.DebugString(60), " is not UTF-8"));
    }
    if (v.str().empty() && empty_str_.has_value()) {
      memo_.emplace(&v, *empty_str_);
      WriteGet(*empty_str_);
      return absl::OkStatus();
    }
    WriteBinUnicode(v.str());
    absl::StatusOr<uint32_t> index = NextMemoIndex();
    if (!index.ok()) return index.status();
    memo_.emplace(&v, *index);
    if (v.str().empty()) empty_str_ = *index;
    WritePut(*index);
    return absl::OkStatus();
  }

  // GLOBAL with Python 2 names, memoized per name (CPython memoizes the
  // class or function object, which is one per name).
  absl::Status SaveGlobal(std::string module, std::string name, const Value* v) {
    if (module.find('\n') != std::string::npos || name.find('\n') != std::string::npos) {
      return Invalid(absl::StrCat("global name '", module, ".", name, "' contains a newline"));
    }
    internal_compat::Python3ToPython2(module, name);
    auto key = std::make_pair(std::move(module), std::move(name));
    auto it = global_memo_.find(key);
    if (it != global_memo_.end()) {
      if (v != nullptr) memo_.emplace(v, it->second);
      WriteGet(it->second);
      return absl::OkStatus();
    }
    Op(op::kGlobal);
    Text(key.first);
    Text("\n");
    Text(key.second);
    Text("\n");
    absl::StatusOr<uint32_t> index = NextMemoIndex();
    if (!index.ok()) return index.status();
    global_memo_.emplace(std::move(key), *index);
    if (v != nullptr) memo_.emplace(v, *index);
    WritePut(*index);
    return absl::OkStatus();
  }

  // bytes at protocol 2 (CPython's save_bytes): `_codecs.encode(latin1_text,
  // 'latin1')`, or `bytes()` when empty. `v` is null for a bytes object
  // CPython makes on the fly (the argument of bytearray()). b'' is a
  // singleton in CPython, so it is memoized once per pickle.
  absl::Status SaveBytes(const std::string& bytes, const Value* v) {
    if (bytes.empty() && empty_bytes_.has_value()) {
      if (v != nullptr) memo_.emplace(v, *empty_bytes_);
      WriteGet(*empty_bytes_);
      return absl::OkStatus();
    }
    if (bytes.empty()) {
      if (absl::Status s = SaveGlobal("builtins", "bytes", nullptr); !s.ok()) return s;
      Op(op::kEmptyTuple);
    } else {
      if (absl::Status s = SaveGlobal("_codecs", "encode", nullptr); !s.ok()) return s;
      if (absl::Status s = SaveTemporaryStr(internal_text::Latin1ToUtf8(bytes)); !s.ok()) return s;
      if (latin1_name_.has_value()) {  // one interned 'latin1' object in CPython
        WriteGet(*latin1_name_);
      } else {
        WriteBinUnicode("latin1");
        absl::StatusOr<uint32_t> index = NextMemoIndex();
        if (!index.ok()) return index.status();
        latin1_name_ = *index;
        WritePut(*index);
      }
      Op(op::kTuple2);
      if (absl::Status s = Memoize(nullptr); !s.ok()) return s;
    }
    Op(op::kReduce);
    if (bytes.empty()) empty_bytes_ = next_memo_;
    return Memoize(v);
  }

  // bytearray below protocol 5 (CPython's save_bytearray): `bytearray(bytes)`,
  // or `bytearray()` when empty.
  absl::Status SaveByteArray(const Value& v) {
    if (absl::Status s = SaveGlobal("builtins", "bytearray", nullptr); !s.ok()) return s;
    if (v.str().empty()) {
      Op(op::kEmptyTuple);
    } else {
      if (absl::Status s = SaveBytes(v.str(), nullptr); !s.ok()) return s;
      Op(op::kTuple1);
      if (absl::Status s = Memoize(nullptr); !s.ok()) return s;
    }
    Op(op::kReduce);
    return Memoize(&v);
  }

  // ---- batches ----

  // Items of a list (CPython's batch_list_exact): one item is `x APPEND`,
  // more are `MARK x... APPENDS` per 1000.
  absl::Status SaveListItems(const std::vector<ValuePtr>& items) {
    if (items.size() == 1) {
      if (absl::Status s = SaveChild(items[0]); !s.ok()) return s;
      Op(op::kAppend);
      return absl::OkStatus();
    }
    for (size_t start = 0; start < items.size(); start += kBatchSize) {
      Op(op::kMark);
      const size_t end = std::min(items.size(), start + kBatchSize);
      for (size_t i = start; i < end; ++i) {
        if (absl::Status s = SaveChild(items[i]); !s.ok()) return s;
      }
      Op(op::kAppends);
    }
    return absl::OkStatus();
  }

  // Items from an iterator (CPython's batch_list): a batch of one is `x APPEND`.
  absl::Status SaveIteratedItems(const std::vector<ValuePtr>& items) {
    for (size_t start = 0; start < items.size(); start += kBatchSize) {
      const size_t end = std::min(items.size(), start + kBatchSize);
      if (end - start == 1) {
        if (absl::Status s = SaveChild(items[start]); !s.ok()) return s;
        Op(op::kAppend);
        continue;
      }
      Op(op::kMark);
      for (size_t i = start; i < end; ++i) {
        if (absl::Status s = SaveChild(items[i]); !s.ok()) return s;
      }
      Op(op::kAppends);
    }
    return absl::OkStatus();
  }

  absl::Status SavePair(const std::pair<ValuePtr, ValuePtr>& pair) {
    if (pair.first == nullptr || !IsHashable(*pair.first)) {
      return Invalid(absl::StrCat("unhashable dict key ",
                                  pair.first == nullptr ? "null" : pair.first->DebugString(60)));
    }
    if (absl::Status s = SaveChild(pair.first); !s.ok()) return s;
    return SaveChild(pair.second);
  }

  // Items of a dict (CPython's batch_dict_exact): one item is `k v SETITEM`;
  // more are `MARK k v... SETITEMS` per 1000, and a dict of exactly n*1000
  // items ends with an empty `MARK SETITEMS`, as CPython's loop does.
  absl::Status SaveDictItems(const std::vector<std::pair<ValuePtr, ValuePtr>>& items) {
    if (items.empty()) return absl::OkStatus();
    if (items.size() == 1) {
      if (absl::Status s = SavePair(items[0]); !s.ok()) return s;
      Op(op::kSetItem);
      return absl::OkStatus();
    }
    size_t next = 0;
    size_t in_batch;
    do {
      Op(op::kMark);
      in_batch = 0;
      while (next < items.size()) {
        if (absl::Status s = SavePair(items[next++]); !s.ok()) return s;
        if (++in_batch == kBatchSize) break;
      }
      Op(op::kSetItems);
    } while (in_batch == kBatchSize);
    return absl::OkStatus();
  }

  // Items from an iterator (CPython's batch_dict): a batch of one is SETITEM.
  absl::Status SaveIteratedPairs(const std::vector<std::pair<ValuePtr, ValuePtr>>& items) {
    for (size_t start = 0; start < items.size(); start += kBatchSize) {
      const size_t end = std::min(items.size(), start + kBatchSize);
      if (end - start == 1) {
        if (absl::Status s = SavePair(items[start]); !s.ok()) return s;
        Op(op::kSetItem);
        continue;
      }
      Op(op::kMark);
      for (size_t i = start; i < end; ++i) {
        if (absl::Status s = SavePair(items[i]); !s.ok()) return s;
      }
      Op(op::kSetItems);
    }
    return absl::OkStatus();
  }

  // ---- containers ----

  absl::Status SaveTuple(const Value& v) {
    const std::vector<ValuePtr>& items = v.items();
    if (items.empty()) {
      Op(op::kEmptyTuple);  // CPython never memoizes the empty tuple
      return absl::OkStatus();
    }
    if (items.size() > 3) Op(op::kMark);
    for (const ValuePtr& item : items) {
      if (absl::Status s = SaveChild(item); !s.ok()) return s;
    }
    Op(items.size() == 1 ? op::kTuple1 : items.size() == 2 ? op::kTuple2 : items.size() == 3 ? op::kTuple3 : op::kTuple);
    return Memoize(&v);
  }

  absl::Status SaveDict(const Value& v) {
    if (!v.ordered_dict()) {
      if (v.dict_state() != nullptr) return Invalid("a plain dict cannot have a state (only an OrderedDict can)");
      Op(op::kEmptyDict);
      if (absl::Status s = Memoize(&v); !s.ok()) return s;
      return SaveDictItems(v.dict_items());
    }
    if (absl::Status s = SaveGlobal("collections", "OrderedDict", nullptr); !s.ok()) return s;
    Op(op::kEmptyTuple);
    Op(op::kReduce);
    if (absl::Status s = Memoize(&v); !s.ok()) return s;
    if (absl::Status s = SaveIteratedPairs(v.dict_items()); !s.ok()) return s;
    if (v.dict_state() != nullptr) {
      if (absl::Status s = SaveChild(v.dict_state()); !s.ok()) return s;
      Op(op::kBuild);
    }
    return absl::OkStatus();
  }

  // set at protocol 2: `set([items])` (set.__reduce__).
  absl::Status SaveSet(const Value& v) {
    for (const ValuePtr& item : v.set_items()) {
      if (item == nullptr || !IsHashable(*item)) {
        return Invalid(absl::StrCat("unhashable set item ", item == nullptr ? "null" : item->DebugString(60)));
      }
    }
    if (absl::Status s = SaveGlobal("builtins", v.is(Kind::kSet) ? "set" : "frozenset", nullptr); !s.ok()) {
      return s;
    }
    Op(op::kEmptyList);
    if (absl::Status s = Memoize(nullptr); !s.ok()) return s;
    if (!v.set_items().empty()) {
      if (absl::Status s = SaveListItems(v.set_items()); !s.ok()) return s;
    }
    Op(op::kTuple1);
    if (absl::Status s = Memoize(nullptr); !s.ok()) return s;
    Op(op::kReduce);
    return Memoize(&v);
  }

  absl::Status SaveObject(const Value& v) {
    const Object& o = v.object();
    if (o.callable == nullptr) return Invalid("an object without a callable");
    if (o.args == nullptr || !o.args->is(Kind::kTuple)) {
      return Invalid(absl::StrCat("object ", v.DebugString(60), ": args must be a tuple"));
    }
    if (o.kwargs != nullptr && o.how != ObjectHow::kNewObjEx) {
      return Invalid(absl::StrCat("object ", v.DebugString(60), ": kwargs need NEWOBJ_EX"));
    }
    if (o.kwargs != nullptr && !o.kwargs->is(Kind::kDict)) {
      return Invalid(absl::StrCat("object ", v.DebugString(60), ": kwargs must be a dict"));
    }
    switch (o.how) {
      case ObjectHow::kReduce:
      case ObjectHow::kInst:
        if (absl::Status s = SaveChild(o.callable); !s.ok()) return s;
        if (absl::Status s = SaveChild(o.args); !s.ok()) return s;
        Op(op::kReduce);
        break;
      case ObjectHow::kNewObj:
        if (absl::Status s = SaveChild(o.callable); !s.ok()) return s;
        if (absl::Status s = SaveChild(o.args); !s.ok()) return s;
        Op(op::kNewObj);
        break;
      case ObjectHow::kNewObjEx:
        // Protocol 2 has no NEWOBJ_EX: copyreg.__newobj_ex__(cls, args, kwargs).
        if (absl::Status s = SaveGlobal("copyreg", "__newobj_ex__", nullptr); !s.ok()) return s;
        if (absl::Status s = SaveChild(o.callable); !s.ok()) return s;
        if (absl::Status s = SaveChild(o.args); !s.ok()) return s;
        if (o.kwargs != nullptr) {
          if (absl::Status s = SaveChild(o.kwargs); !s.ok()) return s;
        } else {
          Op(op::kEmptyDict);
          if (absl::Status s = Memoize(nullptr); !s.ok()) return s;
        }
        Op(op::kTuple3);
        if (absl::Status s = Memoize(nullptr); !s.ok()) return s;
        Op(op::kReduce);
        break;
    }
    if (absl::Status s = Memoize(&v); !s.ok()) return s;
    if (!o.list_items.empty()) {
      if (absl::Status s = SaveIteratedItems(o.list_items); !s.ok()) return s;
    }
    if (!o.dict_items.empty()) {
      if (absl::Status s = SaveIteratedPairs(o.dict_items); !s.ok()) return s;
    }
    if (o.state != nullptr) {
      if (absl::Status s = SaveChild(o.state); !s.ok()) return s;
      Op(op::kBuild);
    }
    return absl::OkStatus();
  }

  // ---- dispatch ----

  absl::Status SaveChild(const ValuePtr& v) {
    if (v == nullptr) return Invalid("a null ValuePtr in the tree");
    return Save(*v);
  }

  absl::Status Save(const Value& v) {
    switch (v.kind()) {
      case Kind::kNone:
        Op(op::kNone);
        return absl::OkStatus();
      case Kind::kBool:
        Op(v.bool_value() ? op::kNewTrue : op::kNewFalse);
        return absl::OkStatus();
      case Kind::kInt:
        SaveInt(v);
        return absl::OkStatus();
      case Kind::kFloat:
        SaveFloat(v.float_value());
        return absl::OkStatus();
      default:
        break;
    }
    auto memo = memo_.find(&v);
    if (memo != memo_.end()) {
      if (in_progress_.contains(&v)) {
        return Invalid(absl::StrCat("self-referencing structure: a ", KindName(v.kind()), " contains itself"));
      }
      WriteGet(memo->second);
      return absl::OkStatus();
    }
    switch (v.kind()) {
      case Kind::kStr: return SaveStr(v);
      case Kind::kBytes: return SaveBytes(v.str(), &v);
      case Kind::kByteArray: return SaveByteArray(v);
      case Kind::kGlobal: return SaveGlobal(v.module(), v.name(), &v);
      case Kind::kPersistentId: {
        if (v.pid() == nullptr) return Invalid("a persistent id without a pid");
        return Nested(v, [&] {
          if (absl::Status s = SaveChild(v.pid()); !s.ok()) return s;
          Op(op::kBinPersId);
          return absl::OkStatus();
        });
      }
      case Kind::kTuple: return Nested(v, [&] { return SaveTuple(v); });
      case Kind::kList:
        return Nested(v, [&] {
          Op(op::kEmptyList);
          if (absl::Status s = Memoize(&v); !s.ok()) return s;
          if (v.items().empty()) return absl::OkStatus();
          return SaveListItems(v.items());
        });
      case Kind::kDict: return Nested(v, [&] { return SaveDict(v); });
      case Kind::kSet:
      case Kind::kFrozenSet: return Nested(v, [&] { return SaveSet(v); });
      case Kind::kObject: return Nested(v, [&] { return SaveObject(v); });
      default:
        return Invalid(absl::StrCat("cannot pickle a ", KindName(v.kind())));
    }
  }

  // Runs `save` for a container, refusing cycles and excessive nesting.
  template <typename F>
  absl::Status Nested(const Value& v, F&& save) {
    if (depth_ >= options_.max_nesting) {
      return Invalid(absl::StrCat("nesting deeper than max_nesting ", options_.max_nesting));
    }
    if (!in_progress_.insert(&v).second) {
      return Invalid(absl::StrCat("self-referencing structure: a ", KindName(v.kind()), " contains itself"));
    }
    ++depth_;
    absl::Status status = save();
    --depth_;
    in_progress_.erase(&v);
    return status;
  }

  const WriteOptions& options_;
  std::string out_;
  uint32_t next_memo_ = 0;
  absl::flat_hash_map<const Value*, uint32_t> memo_;
  absl::flat_hash_map<std::pair<std::string, std::string>, uint32_t> global_memo_;
  std::optional<uint32_t> empty_str_;  // memo index of ''
  absl::flat_hash_map<std::string, uint32_t> latin1_char_strs_;  // 1-character temporaries -> memo index
  std::optional<uint32_t> empty_bytes_;  // memo index of b''
  std::optional<uint32_t> latin1_name_;
  absl::flat_hash_set<const Value*> in_progress_;
  size_t depth_ = 0;
};

}  // namespace

absl::StatusOr<std::string> Pickle(const Value& root, const WriteOptions& options) {
  if (options.protocol != 2) {
    return absl::InvalidArgumentError(absl::StrCat("pickle writer: only protocol 2 is supported, not ",
                                                   options.protocol));
  }
  Pickler pickler(options);
  return pickler.Run(root);
}

}  // namespace ucp::pickle
