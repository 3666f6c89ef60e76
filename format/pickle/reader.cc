#include "format/pickle/reader.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/types/span.h"
#include "format/pickle/internal/compat_names.h"
#include "format/pickle/internal/opcodes.h"
#include "format/pickle/internal/text.h"

namespace ucp::pickle {
namespace {

namespace op = internal_opcodes;

constexpr int kHighestProtocol = 5;

// None, True, False and the ints pickles are full of, shared by every tree
// (values are immutable, so sharing them is invisible). All are made at the
// first pickle read: ints up to 65535 (66,560 values, about 10 MB of new
// memory) cost every process that read one about 20 ms on a 2-core VM where
// memory touched the first time is slow, more than making the larger ints a
// checkpoint's pickles hold one by one (`perf stat -r 15` of `ucp export
// --fsync=false` of neox-deep-tp2, warm: 0.236 s elapsed up to 65535, 0.227 s
// with each block of 1024 made at its first use, 0.216 s up to 1023).
class CommonScalars {
 public:
  static constexpr int64_t kMinInt = -1024;
  static constexpr int64_t kMaxInt = 1023;

  static const CommonScalars& Get() {
    static const CommonScalars* const kScalars = new CommonScalars();
    return *kScalars;
  }
  const ValuePtr& none() const { return none_; }
  const ValuePtr& boolean(bool b) const { return b ? true_ : false_; }
  // Requires kMinInt <= i <= kMaxInt.
  const ValuePtr& small_int(int64_t i) const { return ints_[static_cast<size_t>(i - kMinInt)]; }

 private:
  CommonScalars() : none_(Value::None()), true_(Value::Bool(true)), false_(Value::Bool(false)) {
    ints_.reserve(kMaxInt - kMinInt + 1);
    for (int64_t i = kMinInt; i <= kMaxInt; ++i) ints_.push_back(Value::Int(i));
  }
  ValuePtr none_, true_, false_;
  std::vector<ValuePtr> ints_;
};

bool IsBuiltinsModule(std::string_view module) { return module == "builtins" || module == "__builtin__"; }

// The spellings of latin-1 Python's codec registry accepts, normalized
// (lower case, '-' and ' ' as '_').
bool IsLatin1CodecName(std::string_view name) {
  std::string n = absl::AsciiStrToLower(internal_text::AbslView(name));
  std::replace(n.begin(), n.end(), '-', '_');
  std::replace(n.begin(), n.end(), ' ', '_');
  return n == "latin1" || n == "latin_1" || n == "iso8859_1" || n == "iso_8859_1" || n == "l1" ||
         n == "latin" || n == "cp819" || n == "8859" || n == "iso_ir_100" || n == "csisolatin1";
}

std::string_view StripBlanks(std::string_view s) {
  while (!s.empty() && absl::ascii_isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && absl::ascii_isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::string Printable(std::string_view s, size_t max_len = 40) {
  std::string out = absl::CHexEscape(internal_text::AbslView(s.substr(0, max_len)));
  if (s.size() > max_len) out += "...";
  return out;
}

// The memo: dense for the 0, 1, 2, ... keys picklers write, sparse otherwise,
// so that one huge key cannot make it allocate.
class Memo {
 public:
  explicit Memo(size_t max_entries) : max_entries_(max_entries) {}
  size_t count() const { return count_; }
  void Put(uint64_t key, ValuePtr value) {
    if (key >= dense_.size() && key <= 2 * dense_.size() + 1024) {
      dense_.resize(std::min<uint64_t>(std::max<uint64_t>(key + 1, 2 * dense_.size()), max_entries_));
    }
    if (key < dense_.size()) {
      if (dense_[key] == nullptr && (sparse_.empty() || sparse_.erase(key) == 0)) ++count_;
      dense_[key] = std::move(value);
      return;
    }
    if (sparse_.insert_or_assign(key, std::move(value)).second) ++count_;
  }
  const ValuePtr* Find(uint64_t key) const {
    if (key < dense_.size() && dense_[key] != nullptr) return &dense_[key];
    if (sparse_.empty()) return nullptr;
    auto it = sparse_.find(key);
    return it == sparse_.end() ? nullptr : &it->second;
  }
  bool Contains(uint64_t key) const { return Find(key) != nullptr; }

 private:
  size_t max_entries_;
  std::vector<ValuePtr> dense_;
  absl::flat_hash_map<uint64_t, ValuePtr> sparse_;
  size_t count_ = 0;
};

// Little-endian two's complement of at most 8 bytes -> int64.
int64_t SignExtend(std::string_view bytes) {
  if (bytes.empty()) return 0;
  uint64_t u = 0;
  for (size_t i = 0; i < bytes.size(); ++i) u |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[i])) << (8 * i);
  if (bytes.size() < 8 && (static_cast<uint8_t>(bytes.back()) & 0x80)) u |= ~uint64_t{0} << (8 * bytes.size());
  return static_cast<int64_t>(u);
}

// Arbitrary precision decimal -> little-endian two's complement bytes.
std::string DecimalToTwosComplement(std::string_view digits, bool negative) {
  std::vector<uint32_t> magnitude;  // base 2^32, little endian
  size_t i = 0;
  const size_t first_chunk = digits.size() % 9 == 0 ? 9 : digits.size() % 9;
  size_t chunk_len = first_chunk;
  while (i < digits.size()) {
    uint32_t chunk = 0;
    uint64_t scale = 1;
    for (size_t k = 0; k < chunk_len; ++k) {
      chunk = chunk * 10 + static_cast<uint32_t>(digits[i + k] - '0');
      scale *= 10;
    }
    uint64_t carry = chunk;
    for (uint32_t& limb : magnitude) {
      const uint64_t x = static_cast<uint64_t>(limb) * scale + carry;
      limb = static_cast<uint32_t>(x);
      carry = x >> 32;
    }
    if (carry != 0) magnitude.push_back(static_cast<uint32_t>(carry));
    i += chunk_len;
    chunk_len = 9;
  }
  std::string bytes;
  bytes.reserve(magnitude.size() * 4 + 1);
  for (uint32_t limb : magnitude) {
    for (int k = 0; k < 4; ++k) bytes.push_back(static_cast<char>((limb >> (8 * k)) & 0xff));
  }
  bytes.push_back('\0');  // room for the sign bit
  if (negative) {
    bool carry = true;
    for (char& c : bytes) {
      uint8_t b = static_cast<uint8_t>(~static_cast<uint8_t>(c));
      if (carry) {
        ++b;
        carry = b == 0;
      }
      c = static_cast<char>(b);
    }
  }
  return bytes;
}

class Unpickler {
 public:
  Unpickler(std::string_view bytes, const ReadOptions& options)
      : data_(reinterpret_cast<const uint8_t*>(bytes.data())),
        size_(bytes.size()),
        options_(options),
        scalars_(CommonScalars::Get()),
        memo_(options.max_memo_entries) {}

  absl::StatusOr<ValuePtr> Run() {
    while (true) {
      if (pos_ >= size_) {
        in_opcode_ = false;
        op_pos_ = pos_;
        return Invalid("the pickle ended without STOP");
      }
      op_pos_ = pos_;
      opcode_ = data_[pos_++];
      in_opcode_ = true;
      if (opcode_ == op::kStop) return Finish();
      absl::Status status = Step();
      if (!status.ok()) return status;
    }
  }

 private:
  // ---- errors: "pickle: at byte 57 (BINGET): memo key 9 is not defined" ----
  absl::Status Error(absl::StatusCode code, absl::string_view message) const {
    if (!in_opcode_) return absl::Status(code, absl::StrCat("pickle: at byte ", op_pos_, ": ", message));
    const char* name = op::OpcodeName(opcode_);
    return absl::Status(code, absl::StrCat("pickle: at byte ", op_pos_, " (",
                                           name != nullptr ? name : absl::StrFormat("0x%02x", opcode_), "): ",
                                           message));
  }
  absl::Status Invalid(absl::string_view message) const {
    return Error(absl::StatusCode::kInvalidArgument, message);
  }
  absl::Status Exhausted(absl::string_view message) const {
    return Error(absl::StatusCode::kResourceExhausted, message);
  }
  absl::Status Truncated(uint64_t needed) const {
    return Error(absl::StatusCode::kDataLoss,
                 absl::StrCat("truncated: needs ", needed, " bytes but only ", size_ - pos_, " are left"));
  }

  // ---- input ----
  size_t left() const { return size_ - pos_; }
  absl::Status Need(uint64_t n) const { return n <= left() ? absl::OkStatus() : Truncated(n); }
  uint64_t ReadLittleEndian(size_t n) {
    uint64_t x = 0;
    for (size_t i = 0; i < n; ++i) x |= static_cast<uint64_t>(data_[pos_ + i]) << (8 * i);
    pos_ += n;
    return x;
  }
  // Reads a fixed-size little-endian length field.
  absl::Status ReadLength(size_t field_size, uint64_t& length) {
    if (absl::Status s = Need(field_size); !s.ok()) return s;
    length = ReadLittleEndian(field_size);
    return absl::OkStatus();
  }
  // A str/bytes operand of `length` bytes.
  absl::Status ReadOperand(uint64_t length, std::string_view& out) {
    if (length > left()) {
      return Error(absl::StatusCode::kDataLoss,
                   absl::StrCat("operand of ", length, " bytes but only ", left(), " are left"));
    }
    if (length > options_.max_string_length) {
      return Exhausted(absl::StrCat("operand of ", length, " bytes exceeds max_string_length ",
                                    options_.max_string_length));
    }
    out = std::string_view(reinterpret_cast<const char*>(data_ + pos_), length);
    pos_ += length;
    return absl::OkStatus();
  }
  // A protocol 0 text operand: the bytes up to '\n' (consumed, not returned).
  absl::Status ReadLine(std::string_view& line) {
    const void* newline = std::memchr(data_ + pos_, '\n', left());
    if (newline == nullptr) {
      return Error(absl::StatusCode::kDataLoss, "truncated: text operand has no terminating newline");
    }
    const size_t length = static_cast<const uint8_t*>(newline) - (data_ + pos_);
    if (length > options_.max_string_length) {
      return Exhausted(absl::StrCat("text operand of ", length, " bytes exceeds max_string_length ",
                                    options_.max_string_length));
    }
    line = std::string_view(reinterpret_cast<const char*>(data_ + pos_), length);
    pos_ += length + 1;
    return absl::OkStatus();
  }

  // ---- stack ----
  size_t fence() const { return marks_.empty() ? 0 : marks_.back(); }
  size_t available() const { return stack_.size() - fence(); }
  absl::Status Require(size_t n) const {
    if (available() >= n) return absl::OkStatus();
    return Invalid(absl::StrCat("stack underflow: needs ", n, " value", n == 1 ? "" : "s",
                                marks_.empty() ? "" : " above the last MARK", ", has ", available()));
  }
  absl::Status Push(ValuePtr v) {
    if (++values_created_ > options_.max_values) {
      return Exhausted(absl::StrCat("more than max_values ", options_.max_values, " values"));
    }
    if (stack_.size() + marks_.size() >= options_.max_stack_depth) {
      return Exhausted(absl::StrCat("stack deeper than max_stack_depth ", options_.max_stack_depth));
    }
    stack_.push_back(std::move(v));
    return absl::OkStatus();
  }
  ValuePtr Pop() {
    ValuePtr v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  absl::Status PopMark(size_t& mark) {
    if (marks_.empty()) return Invalid("no MARK on the stack");
    mark = marks_.back();
    marks_.pop_back();
    return absl::OkStatus();
  }
  // Pops the values above the last MARK and the MARK.
  absl::Status PopToMark(std::vector<ValuePtr>& items) {
    size_t mark = 0;
    if (absl::Status s = PopMark(mark); !s.ok()) return s;
    items.assign(std::make_move_iterator(stack_.begin() + mark), std::make_move_iterator(stack_.end()));
    stack_.resize(mark);
    return absl::OkStatus();
  }
  // For APPENDS/SETITEMS/ADDITEMS: pops the MARK; `target` is the value just
  // below it, which must sit above the previous MARK.
  absl::Status PopMarkWithTarget(size_t& mark) {
    if (absl::Status s = PopMark(mark); !s.ok()) return s;
    if (mark <= fence()) return Invalid("stack underflow: no value below the MARK to add items to");
    return absl::OkStatus();
  }

  // ---- value construction ----
  ValuePtr IntValue(int64_t i) {
    if (i >= CommonScalars::kMinInt && i <= CommonScalars::kMaxInt) return scalars_.small_int(i);
    return pool_.Int(i);
  }

  // ---- nesting depth and self-references ----
  uint32_t DepthOf(const Value& v) const {
    if (!IsContainer(v.kind())) return 0;
    auto it = depth_.find(&v);
    return it == depth_.end() ? 1 : it->second;
  }
  absl::Status SetDepth(const Value& container, uint32_t depth) {
    if (depth > options_.max_nesting) {
      return Exhausted(absl::StrCat("nesting deeper than max_nesting ", options_.max_nesting));
    }
    if (depth > 1) {
      depth_.insert_or_assign(&container, depth);
    } else if (!depth_.empty()) {
      depth_.erase(&container);  // absent means 1; the address may be a freed container's
    }
    return absl::OkStatus();
  }
  // A container just built from `children` (none of which can contain it).
  absl::Status NoteNewContainer(const Value& container, absl::Span<const ValuePtr> children) {
    uint32_t depth = 0;
    for (const ValuePtr& child : children) {
      if (child != nullptr) depth = std::max(depth, DepthOf(*child));
    }
    return SetDepth(container, depth + 1);
  }
  absl::Status NoteNewObject(const Value& object) {
    uint32_t depth = 0;
    ForEachChild(object, [&](const ValuePtr& child) {
      if (child != nullptr) depth = std::max(depth, DepthOf(*child));
    });
    return SetDepth(object, depth + 1);
  }
  void NoteAliased(const ValuePtr& v) {
    if (IsContainer(v->kind())) aliased_.insert(v.get());
  }
  // Before `items` go into the existing container `target`: refuses a
  // self-reference and updates the target's depth. A container can only end
  // up inside itself if a second reference to it was made by DUP or GET, so
  // the (costly) reachability check runs only for such targets.
  absl::Status BeforeInsert(const Value& target, absl::Span<const ValuePtr> items) {
    const bool aliased = !aliased_.empty() && aliased_.contains(&target);
    uint32_t depth = DepthOf(target);
    for (const ValuePtr& item : items) {
      if (!IsContainer(item->kind())) continue;
      if (aliased) {
        bool reaches = false;
        if (absl::Status s = Reaches(*item, target, reaches); !s.ok()) return s;
        if (reaches) {
          return Invalid(absl::StrCat("self-referencing structure: a ", KindName(target.kind()),
                                      " would contain itself"));
        }
      }
      depth = std::max(depth, DepthOf(*item) + 1);
    }
    if (aliased) depth_may_be_stale_ = true;  // its parents' depths are not updated
    return SetDepth(target, depth);
  }
  // Whether `target` is `from` or reachable from it.
  absl::Status Reaches(const Value& from, const Value& target, bool& reaches) {
    reaches = false;
    absl::flat_hash_set<const Value*> visited;
    std::vector<const Value*> todo = {&from};
    while (!todo.empty()) {
      const Value* v = todo.back();
      todo.pop_back();
      if (v == &target) {
        reaches = true;
        return absl::OkStatus();
      }
      if (!visited.insert(v).second) continue;
      if (++self_reference_visits_ > options_.max_self_reference_visits) {
        return Exhausted(absl::StrCat("self-reference checks visited more than max_self_reference_visits ",
                                      options_.max_self_reference_visits, " values"));
      }
      ForEachChild(*v, [&](const ValuePtr& child) {
        if (child != nullptr && IsContainer(child->kind())) todo.push_back(child.get());
      });
    }
    return absl::OkStatus();
  }
  // The exact nesting depth of the result, when mutations of shared
  // containers may have deepened values whose recorded depth is stale.
  absl::Status CheckNesting(const Value& root) {
    constexpr uint32_t kInProgress = UINT32_MAX;
    absl::flat_hash_map<const Value*, uint32_t> depth;
    std::vector<std::pair<const Value*, bool>> todo = {{&root, false}};
    while (!todo.empty()) {
      auto [v, expanded] = todo.back();
      todo.pop_back();
      if (!expanded) {
        if (!IsContainer(v->kind()) || depth.contains(v)) continue;
        depth[v] = kInProgress;
        todo.push_back({v, true});
        bool cycle = false;
        ForEachChild(*v, [&](const ValuePtr& child) {
          if (child == nullptr || !IsContainer(child->kind())) return;
          auto it = depth.find(child.get());
          if (it == depth.end()) {
            todo.push_back({child.get(), false});
          } else if (it->second == kInProgress) {
            cycle = true;
          }
        });
        if (cycle) return Invalid("self-referencing structure");
        continue;
      }
      uint32_t d = 0;
      ForEachChild(*v, [&](const ValuePtr& child) {
        if (child == nullptr || !IsContainer(child->kind())) return;
        d = std::max(d, depth[child.get()]);
      });
      if (d + 1 > options_.max_nesting) {
        return Exhausted(absl::StrCat("nesting deeper than max_nesting ", options_.max_nesting));
      }
      depth[v] = d + 1;
    }
    return absl::OkStatus();
  }

  absl::Status CheckHashable(const Value& key, std::string_view role) const {
    if (IsHashable(key)) return absl::OkStatus();
    return Invalid(absl::StrCat("unhashable ", KindName(key.kind()), " as ", internal_text::AbslView(role)));
  }

  // ---- the opcodes ----
  absl::StatusOr<ValuePtr> Finish() {
    if (!marks_.empty()) return Invalid(absl::StrCat("STOP with ", marks_.size(), " unclosed MARK"));
    if (stack_.size() != 1) {
      return Invalid(absl::StrCat("STOP with ", stack_.size(), " values on the stack (expected 1)"));
    }
    if (pos_ != size_) {
      in_opcode_ = false;
      op_pos_ = pos_;
      return Invalid(absl::StrCat(size_ - pos_, " bytes after STOP"));
    }
    if (depth_may_be_stale_) {
      in_opcode_ = false;
      if (absl::Status s = CheckNesting(*stack_.back()); !s.ok()) return s;
    }
    return std::move(stack_.back());
  }

  absl::Status Step() {
    switch (opcode_) {
      case op::kProto: {
        if (absl::Status s = Need(1); !s.ok()) return s;
        const int proto = data_[pos_++];
        if (proto > kHighestProtocol) {
          return Error(absl::StatusCode::kUnimplemented, absl::StrCat("unsupported pickle protocol ", proto));
        }
        protocol_ = proto;
        return absl::OkStatus();
      }
      case op::kFrame: {
        uint64_t length;
        if (absl::Status s = ReadLength(8, length); !s.ok()) return s;
        if (length > left()) {
          return Error(absl::StatusCode::kDataLoss,
                       absl::StrCat("frame of ", length, " bytes but only ", left(), " are left"));
        }
        return absl::OkStatus();
      }
      case op::kMark:
        if (stack_.size() + marks_.size() >= options_.max_stack_depth) {
          return Exhausted(absl::StrCat("stack deeper than max_stack_depth ", options_.max_stack_depth));
        }
        marks_.push_back(stack_.size());
        return absl::OkStatus();
      case op::kPop:
        if (available() > 0) {
          stack_.pop_back();
        } else if (!marks_.empty()) {
          marks_.pop_back();  // as CPython: POP with nothing above a MARK drops the MARK
        } else {
          return Require(1);
        }
        return absl::OkStatus();
      case op::kPopMark: {
        size_t mark = 0;
        if (absl::Status s = PopMark(mark); !s.ok()) return s;
        stack_.resize(mark);
        return absl::OkStatus();
      }
      case op::kDup: {
        if (absl::Status s = Require(1); !s.ok()) return s;
        ValuePtr top = stack_.back();
        NoteAliased(top);
        return Push(std::move(top));
      }

      // ---- scalars ----
      case op::kNone: return Push(scalars_.none());
      case op::kNewTrue: return Push(scalars_.boolean(true));
      case op::kNewFalse: return Push(scalars_.boolean(false));
      case op::kBinInt: {
        if (absl::Status s = Need(4); !s.ok()) return s;
        return Push(IntValue(static_cast<int32_t>(ReadLittleEndian(4))));
      }
      case op::kBinInt1:
        if (absl::Status s = Need(1); !s.ok()) return s;
        return Push(IntValue(data_[pos_++]));
      case op::kBinInt2: {
        if (absl::Status s = Need(2); !s.ok()) return s;
        return Push(IntValue(static_cast<int64_t>(ReadLittleEndian(2))));
      }
      case op::kLong1:
      case op::kLong4: {
        uint64_t length;
        if (absl::Status s = ReadLength(opcode_ == op::kLong1 ? 1 : 4, length); !s.ok()) return s;
        if (opcode_ == op::kLong4 && static_cast<int32_t>(length) < 0) {
          return Invalid(absl::StrCat("negative byte count ", static_cast<int32_t>(length)));
        }
        std::string_view bytes;
        if (absl::Status s = ReadOperand(length, bytes); !s.ok()) return s;
        if (bytes.size() <= 8) return Push(IntValue(SignExtend(bytes)));
        return Push(Value::BigInt(std::string(bytes)));
      }
      case op::kBinFloat: {
        if (absl::Status s = Need(8); !s.ok()) return s;
        uint64_t bits = 0;
        for (int i = 0; i < 8; ++i) bits = (bits << 8) | data_[pos_ + i];
        pos_ += 8;
        double d;
        std::memcpy(&d, &bits, sizeof d);
        return Push(pool_.Float(d));
      }
      case op::kInt: return TextInt(/*is_long=*/false);
      case op::kLong: return TextInt(/*is_long=*/true);
      case op::kFloat: return TextFloat();

      // ---- strings ----
      case op::kShortBinString:
      case op::kBinString: {
        uint64_t length;
        if (absl::Status s = ReadLength(opcode_ == op::kShortBinString ? 1 : 4, length); !s.ok()) return s;
        if (opcode_ == op::kBinString && static_cast<int32_t>(length) < 0) {
          return Invalid(absl::StrCat("negative byte count ", static_cast<int32_t>(length)));
        }
        std::string_view bytes;
        if (absl::Status s = ReadOperand(length, bytes); !s.ok()) return s;
        return Push(Value::Str(std::string(bytes)));
      }
      case op::kString: return TextString();
      case op::kShortBinBytes:
      case op::kBinBytes:
      case op::kBinBytes8:
      case op::kByteArray8: {
        uint64_t length;
        const size_t field = opcode_ == op::kShortBinBytes ? 1 : opcode_ == op::kBinBytes ? 4 : 8;
        if (absl::Status s = ReadLength(field, length); !s.ok()) return s;
        std::string_view bytes;
        if (absl::Status s = ReadOperand(length, bytes); !s.ok()) return s;
        return Push(opcode_ == op::kByteArray8 ? Value::ByteArray(std::string(bytes))
                                               : Value::Bytes(std::string(bytes)));
      }
      case op::kShortBinUnicode:
      case op::kBinUnicode:
      case op::kBinUnicode8: {
        uint64_t length;
        const size_t field = opcode_ == op::kShortBinUnicode ? 1 : opcode_ == op::kBinUnicode ? 4 : 8;
        if (absl::Status s = ReadLength(field, length); !s.ok()) return s;
        std::string_view text;
        if (absl::Status s = ReadOperand(length, text); !s.ok()) return s;
        if (!internal_text::IsPickleUtf8(text)) return Invalid(absl::StrCat("invalid UTF-8 in '", Printable(text), "'"));
        return Push(Value::Str(std::string(text)));
      }
      case op::kUnicode: return TextUnicode();

      // ---- containers ----
      case op::kEmptyTuple: return PushNewContainer(Value::Tuple({}));
      case op::kTuple: {
        std::vector<ValuePtr> items;
        if (absl::Status s = PopToMark(items); !s.ok()) return s;
        return PushNewContainer(Value::Tuple(std::move(items)));
      }
      case op::kTuple1:
      case op::kTuple2:
      case op::kTuple3: {
        const size_t n = opcode_ - op::kTuple1 + 1;
        if (absl::Status s = Require(n); !s.ok()) return s;
        std::vector<ValuePtr> items(std::make_move_iterator(stack_.end() - n), std::make_move_iterator(stack_.end()));
        stack_.resize(stack_.size() - n);
        return PushNewContainer(Value::Tuple(std::move(items)));
      }
      case op::kEmptyList: return PushNewContainer(Value::List({}));
      case op::kList: {
        std::vector<ValuePtr> items;
        if (absl::Status s = PopToMark(items); !s.ok()) return s;
        return PushNewContainer(Value::List(std::move(items)));
      }
      case op::kAppend: {
        if (absl::Status s = Require(2); !s.ok()) return s;
        return AddToSequence(stack_.size() - 1);
      }
      case op::kAppends: {
        size_t mark = 0;
        if (absl::Status s = PopMarkWithTarget(mark); !s.ok()) return s;
        return AddToSequence(mark);
      }
      case op::kEmptyDict: return PushNewContainer(Value::MakeDict());
      case op::kDict: {
        std::vector<ValuePtr> items;
        if (absl::Status s = PopToMark(items); !s.ok()) return s;
        if (items.size() % 2 != 0) return Invalid(absl::StrCat("odd number of items (", items.size(), ")"));
        ValuePtr dict = Value::MakeDict();
        if (absl::Status s = NoteNewContainer(*dict, items); !s.ok()) return s;
        for (size_t i = 0; i < items.size(); i += 2) {
          if (absl::Status s = CheckHashable(*items[i], "dict key"); !s.ok()) return s;
          dict->DictSet(std::move(items[i]), std::move(items[i + 1]));
        }
        return Push(std::move(dict));
      }
      case op::kSetItem: {
        if (absl::Status s = Require(3); !s.ok()) return s;
        return AddToMapping(stack_.size() - 2);
      }
      case op::kSetItems: {
        size_t mark = 0;
        if (absl::Status s = PopMarkWithTarget(mark); !s.ok()) return s;
        return AddToMapping(mark);
      }
      case op::kEmptySet: return PushNewContainer(Value::MakeSet());
      case op::kAddItems: {
        size_t mark = 0;
        if (absl::Status s = PopMarkWithTarget(mark); !s.ok()) return s;
        return AddToSet(mark);
      }
      case op::kFrozenSet: {
        std::vector<ValuePtr> items;
        if (absl::Status s = PopToMark(items); !s.ok()) return s;
        ValuePtr set = Value::MakeSet(/*frozen=*/true);
        if (absl::Status s = FillSet(*set, std::move(items)); !s.ok()) return s;
        return Push(std::move(set));
      }

      // ---- globals, calls, state ----
      case op::kGlobal:
      case op::kInst: {
        std::string_view module, name;
        if (absl::Status s = ReadLine(module); !s.ok()) return s;
        if (absl::Status s = ReadLine(name); !s.ok()) return s;
        absl::StatusOr<ValuePtr> global = MakeGlobal(std::string(module), std::string(name));
        if (!global.ok()) return global.status();
        if (opcode_ == op::kGlobal) return Push(*std::move(global));
        std::vector<ValuePtr> args;
        if (absl::Status s = PopToMark(args); !s.ok()) return s;
        return PushObject(*std::move(global), ObjectHow::kInst, Value::Tuple(std::move(args)), nullptr);
      }
      case op::kStackGlobal: {
        if (absl::Status s = Require(2); !s.ok()) return s;
        ValuePtr name = Pop();
        ValuePtr module = Pop();
        if (!module->is(Kind::kStr) || !name->is(Kind::kStr)) {
          return Invalid(absl::StrCat("module and name must be str, found ", KindName(module->kind()), " and ",
                                      KindName(name->kind())));
        }
        absl::StatusOr<ValuePtr> global = MakeGlobal(module->str(), name->str());
        if (!global.ok()) return global.status();
        return Push(*std::move(global));
      }
      case op::kReduce: {
        if (absl::Status s = Require(2); !s.ok()) return s;
        ValuePtr args = Pop();
        ValuePtr callable = Pop();
        if (!args->is(Kind::kTuple)) {
          return Invalid(absl::StrCat("arguments must be a tuple, found ", KindName(args->kind())));
        }
        return Reduce(std::move(callable), std::move(args));
      }
      case op::kNewObj: {
        if (absl::Status s = Require(2); !s.ok()) return s;
        ValuePtr args = Pop();
        ValuePtr cls = Pop();
        if (!args->is(Kind::kTuple)) {
          return Invalid(absl::StrCat("arguments must be a tuple, found ", KindName(args->kind())));
        }
        return PushObject(std::move(cls), ObjectHow::kNewObj, std::move(args), nullptr);
      }
      case op::kNewObjEx: {
        if (absl::Status s = Require(3); !s.ok()) return s;
        ValuePtr kwargs = Pop();
        ValuePtr args = Pop();
        ValuePtr cls = Pop();
        if (!args->is(Kind::kTuple) || !kwargs->is(Kind::kDict)) {
          return Invalid(absl::StrCat("arguments must be a tuple and a dict, found ", KindName(args->kind()),
                                      " and ", KindName(kwargs->kind())));
        }
        return PushObject(std::move(cls), ObjectHow::kNewObjEx, std::move(args), std::move(kwargs));
      }
      case op::kObj: {
        std::vector<ValuePtr> items;
        if (absl::Status s = PopToMark(items); !s.ok()) return s;
        if (items.empty()) return Invalid("no class between MARK and OBJ");
        ValuePtr cls = std::move(items.front());
        items.erase(items.begin());
        return PushObject(std::move(cls), ObjectHow::kInst, Value::Tuple(std::move(items)), nullptr);
      }
      case op::kBuild: return Build();
      case op::kPersId: {
        std::string_view pid;
        if (absl::Status s = ReadLine(pid); !s.ok()) return s;
        for (char c : pid) {
          if (static_cast<uint8_t>(c) >= 0x80) return Invalid("persistent IDs in protocol 0 must be ASCII strings");
        }
        ValuePtr v = Value::PersistentId(Value::Str(std::string(pid)));
        if (absl::Status s = SetDepth(*v, 1); !s.ok()) return s;
        return Push(std::move(v));
      }
      case op::kBinPersId: {
        if (absl::Status s = Require(1); !s.ok()) return s;
        ValuePtr v = Value::PersistentId(Pop());
        if (absl::Status s = NoteNewObject(*v); !s.ok()) return s;
        return Push(std::move(v));
      }

      // ---- memo ----
      case op::kGet:
      case op::kBinGet:
      case op::kLongBinGet: {
        uint64_t key;
        if (opcode_ == op::kGet) {
          if (absl::Status s = TextMemoKey(key); !s.ok()) return s;
        } else if (absl::Status s = ReadLength(opcode_ == op::kBinGet ? 1 : 4, key); !s.ok()) {
          return s;
        }
        const ValuePtr* v = memo_.Find(key);
        if (v == nullptr) return Invalid(absl::StrCat("memo key ", key, " is not defined"));
        NoteAliased(*v);
        return Push(*v);
      }
      case op::kPut:
      case op::kBinPut:
      case op::kLongBinPut:
      case op::kMemoize: {
        uint64_t key;
        if (opcode_ == op::kPut) {
          if (absl::Status s = TextMemoKey(key); !s.ok()) return s;
        } else if (opcode_ == op::kMemoize) {
          key = memo_.count();
        } else if (absl::Status s = ReadLength(opcode_ == op::kBinPut ? 1 : 4, key); !s.ok()) {
          return s;
        }
        if (absl::Status s = Require(1); !s.ok()) return s;
        if (key >= options_.max_memo_entries ||
            (memo_.count() >= options_.max_memo_entries && !memo_.Contains(key))) {
          return Exhausted(absl::StrCat("memo key ", key, " beyond max_memo_entries ", options_.max_memo_entries));
        }
        memo_.Put(key, stack_.back());
        return absl::OkStatus();
      }

      // ---- refused ----
      case op::kExt1:
      case op::kExt2:
      case op::kExt4:
        return Error(absl::StatusCode::kUnimplemented, "the copyreg extension registry is not supported");
      case op::kNextBuffer:
      case op::kReadonlyBuffer:
        return Error(absl::StatusCode::kUnimplemented, "out-of-band buffers are not supported");
      default:
        return Invalid(absl::StrFormat("unknown opcode 0x%02x", opcode_));
    }
  }

  absl::Status PushNewContainer(ValuePtr container) {
    if (absl::Status s = NoteNewContainer(*container, container->items()); !s.ok()) return s;
    return Push(std::move(container));
  }

  absl::Status PushObject(ValuePtr callable, ObjectHow how, ValuePtr args, ValuePtr kwargs) {
    if (options_.globals != nullptr && callable->is(Kind::kGlobal) && callable->module() == "builtins" &&
        callable->name() == "getattr") {
      // getattr(a global class, 'public_name'): an enum member, data. Any
      // other call (a dunder like __globals__, an object built here) can
      // reach code, and is recorded as the unsafe global it is.
      const std::vector<ValuePtr>& a = args->items();
      const bool member = a.size() == 2 && a[0]->is(Kind::kGlobal) && a[1]->is(Kind::kStr) &&
                          !a[1]->str().empty() && a[1]->str()[0] != '_' && kwargs == nullptr;
      if (!member) options_.globals->emplace("builtins", "getattr");
    }
    Object object;
    object.callable = std::move(callable);
    object.how = how;
    object.args = std::move(args);
    object.kwargs = std::move(kwargs);
    ValuePtr v = Value::MakeObject(std::move(object));
    if (absl::Status s = NoteNewObject(*v); !s.ok()) return s;
    return Push(std::move(v));
  }

  absl::StatusOr<ValuePtr> MakeGlobal(std::string module, std::string name) {
    if (!internal_text::IsPickleUtf8(module) || !internal_text::IsPickleUtf8(name)) {
      return Invalid(absl::StrCat("global '", Printable(module), ".", Printable(name), "' is not UTF-8"));
    }
    if (protocol_ < 3) internal_compat::Python2ToPython3(module, name);
    // builtins.getattr is how Python pickles enum members (getattr(Cls,
    // 'member')): it is recorded only when called otherwise (PushObject).
    if (options_.globals != nullptr && !(module == "builtins" && name == "getattr")) {
      options_.globals->emplace(module, name);
    }
    return Value::Global(std::move(module), std::move(name));
  }

  // APPEND / APPENDS: stack_[first..] go into stack_[first - 1].
  absl::Status AddToSequence(size_t first) {
    Value& target = *stack_[first - 1];
    const absl::Span<const ValuePtr> items(stack_.data() + first, stack_.size() - first);
    std::vector<ValuePtr>* dest;
    if (target.is(Kind::kList)) {
      dest = &target.mutable_items();
    } else if (target.is(Kind::kObject)) {
      dest = &target.mutable_object().list_items;
    } else {
      return Invalid(absl::StrCat("cannot append to a ", KindName(target.kind())));
    }
    if (absl::Status s = BeforeInsert(target, items); !s.ok()) return s;
    dest->insert(dest->end(), std::make_move_iterator(stack_.begin() + first), std::make_move_iterator(stack_.end()));
    stack_.resize(first);
    return absl::OkStatus();
  }

  // SETITEM / SETITEMS: key, value pairs from stack_[first..] go into stack_[first - 1].
  absl::Status AddToMapping(size_t first) {
    Value& target = *stack_[first - 1];
    const size_t n = stack_.size() - first;
    if (n % 2 != 0) return Invalid(absl::StrCat("odd number of items (", n, ")"));
    if (!target.is(Kind::kDict) && !target.is(Kind::kObject)) {
      return Invalid(absl::StrCat("cannot set items of a ", KindName(target.kind())));
    }
    for (size_t i = first; i < stack_.size(); i += 2) {
      if (absl::Status s = CheckHashable(*stack_[i], "dict key"); !s.ok()) return s;
    }
    if (absl::Status s = BeforeInsert(target, absl::Span<const ValuePtr>(stack_.data() + first, n)); !s.ok()) {
      return s;
    }
    for (size_t i = first; i < stack_.size(); i += 2) {
      if (target.is(Kind::kDict)) {
        target.DictSet(std::move(stack_[i]), std::move(stack_[i + 1]));
      } else {
        target.mutable_object().dict_items.emplace_back(std::move(stack_[i]), std::move(stack_[i + 1]));
      }
    }
    stack_.resize(first);
    return absl::OkStatus();
  }

  // ADDITEMS: stack_[first..] go into the set stack_[first - 1].
  absl::Status AddToSet(size_t first) {
    Value& target = *stack_[first - 1];
    if (!target.is(Kind::kSet)) return Invalid(absl::StrCat("cannot add items to a ", KindName(target.kind())));
    const absl::Span<const ValuePtr> items(stack_.data() + first, stack_.size() - first);
    for (const ValuePtr& item : items) {
      if (absl::Status s = CheckHashable(*item, "set item"); !s.ok()) return s;
    }
    if (absl::Status s = BeforeInsert(target, items); !s.ok()) return s;
    for (size_t i = first; i < stack_.size(); ++i) target.SetAdd(std::move(stack_[i]));
    stack_.resize(first);
    return absl::OkStatus();
  }

  // A new set (or frozenset) from `items`.
  absl::Status FillSet(Value& set, std::vector<ValuePtr> items) {
    for (const ValuePtr& item : items) {
      if (absl::Status s = CheckHashable(*item, "set item"); !s.ok()) return s;
    }
    if (absl::Status s = NoteNewContainer(set, items); !s.ok()) return s;
    for (ValuePtr& item : items) set.SetAdd(std::move(item));
    return absl::OkStatus();
  }

  absl::Status Build() {
    if (absl::Status s = Require(2); !s.ok()) return s;
    ValuePtr state = Pop();
    Value& target = *stack_.back();
    if (target.is(Kind::kObject)) {
      if (target.object().state != nullptr) return Invalid("the object already has a state (second BUILD)");
    } else if (target.is(Kind::kDict) && target.ordered_dict()) {
      if (target.dict_state() != nullptr) return Invalid("the OrderedDict already has a state (second BUILD)");
    } else {
      return Invalid(absl::StrCat("BUILD on a ", KindName(target.kind()), " (only objects and OrderedDicts have state)"));
    }
    if (absl::Status s = BeforeInsert(target, absl::Span<const ValuePtr>(&state, 1)); !s.ok()) return s;
    if (target.is(Kind::kObject)) {
      target.mutable_object().state = std::move(state);
    } else {
      target.set_dict_state(std::move(state));
    }
    return absl::OkStatus();
  }

  // REDUCE: decodes the data constructors value.h lists, else an Object.
  absl::Status Reduce(ValuePtr callable, ValuePtr args) {
    const std::vector<ValuePtr>& a = args->items();
    if (callable->is(Kind::kGlobal)) {
      const std::string& module = callable->module();
      const std::string& name = callable->name();
      if (module == "collections" && name == "OrderedDict") {
        if (a.empty()) return PushNewContainer(Value::MakeDict(/*ordered_dict=*/true));
        if (a.size() == 1 && (a[0]->is(Kind::kList) || a[0]->is(Kind::kTuple))) {
          // Python 2's OrderedDict.__reduce__: OrderedDict([[key, value], ...]).
          bool all_pairs = true;
          for (const ValuePtr& pair : a[0]->items()) {
            all_pairs = all_pairs && (pair->is(Kind::kList) || pair->is(Kind::kTuple)) && pair->items().size() == 2;
          }
          if (all_pairs) {
            ValuePtr dict = Value::MakeDict(/*ordered_dict=*/true);
            uint32_t depth = 0;
            for (const ValuePtr& pair : a[0]->items()) {
              depth = std::max({depth, DepthOf(*pair->items()[0]), DepthOf(*pair->items()[1])});
            }
            if (absl::Status s = SetDepth(*dict, depth + 1); !s.ok()) return s;
            for (const ValuePtr& pair : a[0]->items()) {
              if (absl::Status s = CheckHashable(*pair->items()[0], "dict key"); !s.ok()) return s;
              dict->DictSet(pair->items()[0], pair->items()[1]);
            }
            return Push(std::move(dict));
          }
        }
      } else if (IsBuiltinsModule(module) && (name == "set" || name == "frozenset")) {
        const bool frozen = name == "frozenset";
        if (a.empty()) return PushNewContainer(Value::MakeSet(frozen));
        if (a.size() == 1 && (a[0]->is(Kind::kList) || a[0]->is(Kind::kTuple) || a[0]->is(Kind::kSet) ||
                              a[0]->is(Kind::kFrozenSet))) {
          ValuePtr set = Value::MakeSet(frozen);
          if (absl::Status s = FillSet(*set, a[0]->items()); !s.ok()) return s;
          return Push(std::move(set));
        }
      } else if (module == "_codecs" && name == "encode") {
        if (a.size() == 2 && a[0]->is(Kind::kStr) && a[1]->is(Kind::kStr) && IsLatin1CodecName(a[1]->str())) {
          absl::StatusOr<std::string> bytes = internal_text::Utf8ToLatin1(a[0]->str());
          if (!bytes.ok()) return Invalid(absl::StrCat("_codecs.encode: ", bytes.status().message()));
          return Push(Value::Bytes(*std::move(bytes)));
        }
      } else if (IsBuiltinsModule(module) && name == "bytes") {
        if (a.empty()) return Push(Value::Bytes(""));
        if (a.size() == 1 && a[0]->is(Kind::kBytes)) return Push(Value::Bytes(a[0]->str()));
      } else if (IsBuiltinsModule(module) && name == "bytearray") {
        if (a.empty()) return Push(Value::ByteArray(""));
        if (a.size() == 1 && (a[0]->is(Kind::kBytes) || a[0]->is(Kind::kByteArray))) {
          return Push(Value::ByteArray(a[0]->str()));
        }
        if (a.size() == 2 && a[0]->is(Kind::kStr) && a[1]->is(Kind::kStr) && IsLatin1CodecName(a[1]->str())) {
          absl::StatusOr<std::string> bytes = internal_text::Utf8ToLatin1(a[0]->str());
          if (!bytes.ok()) return Invalid(absl::StrCat("bytearray: ", bytes.status().message()));
          return Push(Value::ByteArray(*std::move(bytes)));
        }
      } else if (module == "copyreg" && name == "__newobj_ex__") {
        if (a.size() == 3 && a[1]->is(Kind::kTuple) && a[2]->is(Kind::kDict)) {
          return PushObject(a[0], ObjectHow::kNewObjEx, a[1], a[2]);
        }
      }
    }
    return PushObject(std::move(callable), ObjectHow::kReduce, std::move(args), nullptr);
  }

  // ---- protocol 0 text operands ----

  // Decimal integer with optional sign and surrounding blanks, as Python's
  // int() reads INT/LONG/GET/PUT operands.
  absl::StatusOr<ValuePtr> ParseDecimal(std::string_view text) {
    std::string_view t = StripBlanks(text);
    bool negative = false;
    if (!t.empty() && (t[0] == '-' || t[0] == '+')) {
      negative = t[0] == '-';
      t.remove_prefix(1);
    }
    if (t.empty() || !std::all_of(t.begin(), t.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      return Invalid(absl::StrCat("invalid integer literal '", Printable(text), "'"));
    }
    while (t.size() > 1 && t[0] == '0') t.remove_prefix(1);
    if (t.size() > options_.max_int_digits) {
      return Exhausted(absl::StrCat("integer literal of ", t.size(), " digits exceeds max_int_digits ",
                                    options_.max_int_digits));
    }
    if (t.size() <= 18) {
      int64_t x = 0;
      for (char c : t) x = x * 10 + (c - '0');
      return IntValue(negative ? -x : x);
    }
    ValuePtr v = Value::BigInt(DecimalToTwosComplement(t, negative));
    return v->fits_int64() ? IntValue(v->int_value()) : v;
  }

  absl::Status TextInt(bool is_long) {
    std::string_view line;
    if (absl::Status s = ReadLine(line); !s.ok()) return s;
    if (!is_long && (line == "00" || line == "01")) return Push(scalars_.boolean(line == "01"));
    if (is_long && !line.empty() && line.back() == 'L') line.remove_suffix(1);
    absl::StatusOr<ValuePtr> v = ParseDecimal(line);
    if (!v.ok()) return v.status();
    return Push(*std::move(v));
  }

  absl::Status TextMemoKey(uint64_t& key) {
    std::string_view line;
    if (absl::Status s = ReadLine(line); !s.ok()) return s;
    absl::StatusOr<ValuePtr> v = ParseDecimal(line);
    if (!v.ok()) return v.status();
    if (!(*v)->fits_int64() || (*v)->int_value() < 0) {
      return Invalid(absl::StrCat("invalid memo key '", Printable(line), "'"));
    }
    key = static_cast<uint64_t>((*v)->int_value());
    return absl::OkStatus();
  }

  absl::Status TextFloat() {
    std::string_view line;
    if (absl::Status s = ReadLine(line); !s.ok()) return s;
    std::string_view t = StripBlanks(line);
    if (!t.empty() && t[0] == '+') t.remove_prefix(1);
    double d = 0;
    const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), d);
    if (t.empty() || ec != std::errc() || end != t.data() + t.size()) {
      return Invalid(absl::StrCat("could not convert '", Printable(line), "' to float"));
    }
    return Push(pool_.Float(d));
  }

  // STRING: a quoted Python 2 str literal, decoded as codecs.escape_decode does.
  absl::Status TextString() {
    std::string_view line;
    if (absl::Status s = ReadLine(line); !s.ok()) return s;
    if (line.size() < 2 || line.front() != line.back() || (line.front() != '\'' && line.front() != '"')) {
      return Invalid("the STRING opcode argument must be quoted");
    }
    const std::string_view body = line.substr(1, line.size() - 2);
    std::string out;
    out.reserve(body.size());
    for (size_t i = 0; i < body.size(); ++i) {
      const char c = body[i];
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (++i == body.size()) return Invalid("trailing \\ in string");
      const char e = body[i];
      switch (e) {
        case '\n': break;
        case '\\': out.push_back('\\'); break;
        case '\'': out.push_back('\''); break;
        case '"': out.push_back('"'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 't': out.push_back('\t'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 'v': out.push_back('\v'); break;
        case 'a': out.push_back('\a'); break;
        case '0': case '1': case '2': case '3': case '4': case '5': case '6': case '7': {
          int x = e - '0';
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7'; ++k) {
            x = x * 8 + (body[++i] - '0');
          }
          out.push_back(static_cast<char>(x & 0xff));
          break;
        }
        case 'x': {
          int x = 0;
          for (int k = 0; k < 2; ++k) {
            const char h = i + 1 < body.size() ? body[i + 1] : '\0';
            if (!absl::ascii_isxdigit(static_cast<unsigned char>(h))) {
              return Invalid(absl::StrCat("invalid \\x escape at position ", i - 1));
            }
            ++i;
            x = x * 16 + (h <= '9' ? h - '0' : (absl::ascii_tolower(h) - 'a' + 10));
          }
          out.push_back(static_cast<char>(x));
          break;
        }
        default:
          out.push_back('\\');
          out.push_back(e);
          break;
      }
    }
    return Push(Value::Str(std::move(out)));
  }

  // UNICODE: raw-unicode-escape (latin-1 bytes plus \uXXXX and \UXXXXXXXX).
  absl::Status TextUnicode() {
    std::string_view line;
    if (absl::Status s = ReadLine(line); !s.ok()) return s;
    std::string out;
    out.reserve(line.size());
    for (size_t i = 0; i < line.size(); ++i) {
      const uint8_t c = static_cast<uint8_t>(line[i]);
      if (c != '\\' || i + 1 == line.size()) {
        internal_text::AppendUtf8(c, out);
        continue;
      }
      const char e = line[++i];
      const int digits = e == 'u' ? 4 : e == 'U' ? 8 : 0;
      if (digits == 0) {
        out.push_back('\\');
        internal_text::AppendUtf8(static_cast<uint8_t>(e), out);
        continue;
      }
      uint32_t code_point = 0;
      for (int k = 0; k < digits; ++k) {
        const char h = i + 1 < line.size() ? line[i + 1] : '\0';
        if (!absl::ascii_isxdigit(static_cast<unsigned char>(h))) {
          return Invalid(absl::StrCat("truncated \\", std::string(1, e), " escape in UNICODE operand"));
        }
        ++i;
        code_point = code_point * 16 + (h <= '9' ? h - '0' : (absl::ascii_tolower(h) - 'a' + 10));
      }
      if (code_point > 0x10ffff) return Invalid("\\U escape out of range in UNICODE operand");
      internal_text::AppendUtf8(code_point, out);
    }
    return Push(Value::Str(std::move(out)));
  }

  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  const ReadOptions& options_;
  const CommonScalars& scalars_;
  ScalarPool pool_;

  // The opcode being run, for messages.
  size_t op_pos_ = 0;
  uint8_t opcode_ = 0;
  bool in_opcode_ = false;
  int protocol_ = 0;

  std::vector<ValuePtr> stack_;
  std::vector<size_t> marks_;  // stack_.size() at each MARK
  Memo memo_;
  size_t values_created_ = 0;

  // Nesting depth of containers deeper than 1 (absent: 1, or not a container).
  absl::flat_hash_map<const Value*, uint32_t> depth_;
  // Containers a second reference was made to (DUP, GET).
  absl::flat_hash_set<const Value*> aliased_;
  bool depth_may_be_stale_ = false;
  size_t self_reference_visits_ = 0;
};

}  // namespace

absl::StatusOr<ValuePtr> Unpickle(std::string_view bytes, const ReadOptions& options) {
  Unpickler unpickler(bytes, options);
  return unpickler.Run();
}

}  // namespace ucp::pickle
