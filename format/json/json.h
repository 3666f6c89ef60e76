// A small JSON value with the two writers and the one reader ucp needs for
// Hugging Face files:
//   - DumpCompact: serde_json's compact form, as the safetensors header is
//     written by the reference implementation (huggingface/safetensors,
//     safetensors/src/tensor.rs: `serde_json::to_string`): no spaces,
//     object keys in insertion order, non-ASCII written raw;
//   - DumpPython: Python's `json.dumps(v, indent=2, sort_keys=True)`, the
//     bytes of `config.json` (transformers' PretrainedConfig.to_json_string)
//     and of the shard index files (`model.safetensors.index.json`):
//     2-space indentation, ", " -> "," + newline, ": " after keys, keys sorted
//     by code point, non-ASCII escaped as \uXXXX (ensure_ascii), floats as
//     Python's repr prints them;
//   - Parse: RFC 8259 with caps (input size, nesting depth), for reading
//     safetensors headers and in tests. Duplicate object keys are an error
//     (as the safetensors reader treats them).
//
// Example:
//   json::Value v = json::Value::Object();
//   v.Set("format", json::Value::String("pt"));
//   std::string header = json::DumpCompact(v);   // {"format":"pt"}
#ifndef UCP_FORMAT_JSON_JSON_H_
#define UCP_FORMAT_JSON_JSON_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace ucp::json {

class Value {
 public:
  enum class Type { kNull, kBool, kInt, kDouble, kString, kArray, kObject };

  Value() = default;
  static Value Null() { return Value(); }
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Double(double d);
  static Value String(std::string s);
  static Value Array(std::vector<Value> items = {});
  static Value Object();

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::kNull; }
  bool bool_value() const { return bool_; }
  int64_t int_value() const { return int_; }
  double double_value() const { return double_; }
  const std::string& string_value() const { return string_; }
  const std::vector<Value>& items() const { return items_; }
  std::vector<Value>& mutable_items() { return items_; }
  // Object members in insertion order.
  const std::vector<std::pair<std::string, Value>>& members() const { return members_; }

  // Object: replaces the value of `key` or appends it.
  Value& Set(const std::string& key, Value v);
  // Object member or nullptr.
  const Value* Get(std::string_view key) const;

 private:
  Type type_ = Type::kNull;
  bool bool_ = false;
  int64_t int_ = 0;
  double double_ = 0;
  std::string string_;
  std::vector<Value> items_;
  std::vector<std::pair<std::string, Value>> members_;
};

std::string DumpCompact(const Value& v);
std::string DumpPython(const Value& v);
// Python's repr(float): the shortest string that reads back as `d`, in
// Python's choice of fixed or exponent notation ("1e-05", "10000.0", "0.25").
std::string PythonFloatRepr(double d);

struct ParseOptions {
  size_t max_bytes = size_t{100} << 20;
  int max_depth = 64;
};
// kInvalidArgument with the byte offset of the first error.
absl::StatusOr<Value> Parse(std::string_view text, const ParseOptions& options = {});

}  // namespace ucp::json

#endif  // UCP_FORMAT_JSON_JSON_H_
