#include "format/json/json.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "absl/strings/str_cat.h"

namespace ucp::json {

Value Value::Bool(bool b) {
  Value v;
  v.type_ = Type::kBool;
  v.bool_ = b;
  return v;
}
Value Value::Int(int64_t i) {
  Value v;
  v.type_ = Type::kInt;
  v.int_ = i;
  return v;
}
Value Value::Double(double d) {
  Value v;
  v.type_ = Type::kDouble;
  v.double_ = d;
  return v;
}
Value Value::String(std::string s) {
  Value v;
  v.type_ = Type::kString;
  v.string_ = std::move(s);
  return v;
}
Value Value::Array(std::vector<Value> items) {
  Value v;
  v.type_ = Type::kArray;
  v.items_ = std::move(items);
  return v;
}
Value Value::Object() {
  Value v;
  v.type_ = Type::kObject;
  return v;
}

Value& Value::Set(const std::string& key, Value v) {
  for (auto& [k, old] : members_) {
    if (k == key) {
      old = std::move(v);
      return old;
    }
  }
  members_.emplace_back(key, std::move(v));
  return members_.back().second;
}

const Value* Value::Get(std::string_view key) const {
  for (const auto& [k, v] : members_) {
    if (k == key) return &v;
  }
  return nullptr;
}

namespace {

void AppendHex4(std::string* out, unsigned u) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "\\u%04x", u & 0xFFFF);
  out->append(buf);
}

// Decodes one UTF-8 code point at s[i]; invalid bytes come back as U+FFFD.
uint32_t NextCodePoint(std::string_view s, size_t* i) {
  const unsigned char c = static_cast<unsigned char>(s[*i]);
  int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (len == 0 || *i + len > s.size()) {
    ++*i;
    return 0xFFFD;
  }
  uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
  for (int k = 1; k < len; ++k) {
    const unsigned char d = static_cast<unsigned char>(s[*i + k]);
    if ((d >> 6) != 2) {
      ++*i;
      return 0xFFFD;
    }
    cp = (cp << 6) | (d & 0x3F);
  }
  *i += len;
  return cp;
}

// serde_json: escapes '"', '\\' and control characters; the rest raw.
// Python (ensure_ascii): the same, and every non-ASCII code point as \uXXXX
// (UTF-16 surrogate pairs above the BMP).
void AppendQuoted(std::string* out, std::string_view s, bool ensure_ascii) {
  out->push_back('"');
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      if (!ensure_ascii) {
        out->push_back(static_cast<char>(c));
        ++i;
        continue;
      }
      uint32_t cp = NextCodePoint(s, &i);
      if (cp >= 0x10000) {
        cp -= 0x10000;
        AppendHex4(out, 0xD800 + (cp >> 10));
        AppendHex4(out, 0xDC00 + (cp & 0x3FF));
      } else {
        AppendHex4(out, cp);
      }
      continue;
    }
    ++i;
    switch (c) {
      case '"': out->append("\\\""); break;
      case '\\': out->append("\\\\"); break;
      case '\n': out->append("\\n"); break;
      case '\r': out->append("\\r"); break;
      case '\t': out->append("\\t"); break;
      case '\b': out->append("\\b"); break;
      case '\f': out->append("\\f"); break;
      default:
        if (c < 0x20) {
          AppendHex4(out, c);
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

void AppendDouble(std::string* out, double d, bool python) {
  if (std::isnan(d)) {
    out->append("NaN");
  } else if (std::isinf(d)) {
    out->append(d > 0 ? "Infinity" : "-Infinity");
  } else {
    // serde_json would print its own shortest form; ucp never writes floats
    // into safetensors headers, so one (Python's) rendering serves both.
    (void)python;
    out->append(PythonFloatRepr(d));
  }
}

void DumpCompactTo(const Value& v, std::string* out) {
  switch (v.type()) {
    case Value::Type::kNull: out->append("null"); break;
    case Value::Type::kBool: out->append(v.bool_value() ? "true" : "false"); break;
    case Value::Type::kInt: absl::StrAppend(out, v.int_value()); break;
    case Value::Type::kDouble: AppendDouble(out, v.double_value(), false); break;
    case Value::Type::kString: AppendQuoted(out, v.string_value(), false); break;
    case Value::Type::kArray:
      out->push_back('[');
      for (size_t i = 0; i < v.items().size(); ++i) {
        if (i) out->push_back(',');
        DumpCompactTo(v.items()[i], out);
      }
      out->push_back(']');
      break;
    case Value::Type::kObject:
      out->push_back('{');
      for (size_t i = 0; i < v.members().size(); ++i) {
        if (i) out->push_back(',');
        AppendQuoted(out, v.members()[i].first, false);
        out->push_back(':');
        DumpCompactTo(v.members()[i].second, out);
      }
      out->push_back('}');
      break;
  }
}

// Python sorts str keys by code point; for valid UTF-8, byte order is the
// same order.
void DumpPythonTo(const Value& v, int indent, std::string* out) {
  const std::string pad(static_cast<size_t>(indent + 2), ' ');
  switch (v.type()) {
    case Value::Type::kArray:
      if (v.items().empty()) {
        out->append("[]");
        return;
      }
      out->append("[\n");
      for (size_t i = 0; i < v.items().size(); ++i) {
        out->append(pad);
        DumpPythonTo(v.items()[i], indent + 2, out);
        out->append(i + 1 < v.items().size() ? ",\n" : "\n");
      }
      out->append(static_cast<size_t>(indent), ' ');
      out->push_back(']');
      return;
    case Value::Type::kObject: {
      if (v.members().empty()) {
        out->append("{}");
        return;
      }
      std::vector<const std::pair<std::string, Value>*> sorted;
      for (const auto& m : v.members()) sorted.push_back(&m);
      std::sort(sorted.begin(), sorted.end(), [](const auto* a, const auto* b) { return a->first < b->first; });
      out->append("{\n");
      for (size_t i = 0; i < sorted.size(); ++i) {
        out->append(pad);
        AppendQuoted(out, sorted[i]->first, true);
        out->append(": ");
        DumpPythonTo(sorted[i]->second, indent + 2, out);
        out->append(i + 1 < sorted.size() ? ",\n" : "\n");
      }
      out->append(static_cast<size_t>(indent), ' ');
      out->push_back('}');
      return;
    }
    case Value::Type::kString: AppendQuoted(out, v.string_value(), true); return;
    case Value::Type::kDouble: AppendDouble(out, v.double_value(), true); return;
    default: DumpCompactTo(v, out); return;
  }
}

}  // namespace

std::string DumpCompact(const Value& v) {
  std::string out;
  DumpCompactTo(v, &out);
  return out;
}

std::string DumpPython(const Value& v) {
  std::string out;
  DumpPythonTo(v, 0, &out);
  return out;
}

std::string PythonFloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits: %.{p-1}e for p = 1..17.
  char buf[64];
  for (int p = 1; p <= 17; ++p) {
    std::snprintf(buf, sizeof(buf), "%.*e", p - 1, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  // buf: [-]D[.DDD]e[+-]XX
  std::string s(buf);
  const bool neg = s[0] == '-';
  if (neg) s.erase(0, 1);
  const size_t e = s.find('e');
  std::string digits = s.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  const int exp10 = std::atoi(s.c_str() + e + 1);  // value = D.DDD x 10^exp10
  std::string out = neg ? "-" : "";
  // Python's repr: exponent notation when exp10 < -4 or exp10 >= 16.
  if (exp10 < -4 || exp10 >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    out += eb;
    return out;
  }
  if (exp10 < 0) {
    out += "0." + std::string(static_cast<size_t>(-exp10 - 1), '0') + digits;
    return out;
  }
  const size_t int_digits = static_cast<size_t>(exp10) + 1;
  if (digits.size() <= int_digits) {
    out += digits + std::string(int_digits - digits.size(), '0') + ".0";
  } else {
    out += digits.substr(0, int_digits) + "." + digits.substr(int_digits);
  }
  return out;
}

// ---------------------------------------------------------------------------
// Parser.

namespace {

class Parser {
 public:
  Parser(std::string_view text, const ParseOptions& options) : s_(text), options_(options) {}

  absl::StatusOr<Value> Run() {
    Value v;
    if (auto st = ParseValue(0, &v); !st.ok()) return st;
    SkipSpace();
    if (pos_ != s_.size()) return Error("trailing characters after the JSON value");
    return v;
  }

 private:
  absl::Status Error(std::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("JSON: ", std::string(what), " at byte ", pos_));
  }
  void SkipSpace() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  bool Consume(std::string_view word) {
    if (s_.substr(pos_, word.size()) == word) {
      pos_ += word.size();
      return true;
    }
    return false;
  }

  absl::Status ParseValue(int depth, Value* out) {
    if (depth > options_.max_depth) return Error("nesting deeper than the cap");
    SkipSpace();
    if (pos_ >= s_.size()) return Error("unexpected end");
    const char c = s_[pos_];
    if (c == '{') return ParseObject(depth, out);
    if (c == '[') return ParseArray(depth, out);
    if (c == '"') {
      std::string str;
      if (auto st = ParseString(&str); !st.ok()) return st;
      *out = Value::String(std::move(str));
      return absl::OkStatus();
    }
    if (Consume("true")) {
      *out = Value::Bool(true);
      return absl::OkStatus();
    }
    if (Consume("false")) {
      *out = Value::Bool(false);
      return absl::OkStatus();
    }
    if (Consume("null")) {
      *out = Value::Null();
      return absl::OkStatus();
    }
    return ParseNumber(out);
  }

  absl::Status ParseObject(int depth, Value* out) {
    ++pos_;
    *out = Value::Object();
    std::set<std::string> seen;
    SkipSpace();
    if (pos_ < s_.size() && s_[pos_] == '}') {
      ++pos_;
      return absl::OkStatus();
    }
    while (true) {
      SkipSpace();
      if (pos_ >= s_.size() || s_[pos_] != '"') return Error("expected a string key");
      std::string key;
      if (auto st = ParseString(&key); !st.ok()) return st;
      if (!seen.insert(key).second) return Error(absl::StrCat("duplicate key \"", key, "\""));
      SkipSpace();
      if (pos_ >= s_.size() || s_[pos_] != ':') return Error("expected ':'");
      ++pos_;
      Value v;
      if (auto st = ParseValue(depth + 1, &v); !st.ok()) return st;
      out->Set(key, std::move(v));
      SkipSpace();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < s_.size() && s_[pos_] == '}') {
        ++pos_;
        return absl::OkStatus();
      }
      return Error("expected ',' or '}'");
    }
  }

  absl::Status ParseArray(int depth, Value* out) {
    ++pos_;
    *out = Value::Array();
    SkipSpace();
    if (pos_ < s_.size() && s_[pos_] == ']') {
      ++pos_;
      return absl::OkStatus();
    }
    while (true) {
      Value v;
      if (auto st = ParseValue(depth + 1, &v); !st.ok()) return st;
      out->mutable_items().push_back(std::move(v));
      SkipSpace();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < s_.size() && s_[pos_] == ']') {
        ++pos_;
        return absl::OkStatus();
      }
      return Error("expected ',' or ']'");
    }
  }

  static void AppendUtf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }

  absl::Status ParseHex4(uint32_t* out) {
    if (pos_ + 4 > s_.size()) return Error("truncated \\u escape");
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      const char h = s_[pos_ + k];
      v <<= 4;
      if (h >= '0' && h <= '9') {
        v |= static_cast<uint32_t>(h - '0');
      } else if (h >= 'a' && h <= 'f') {
        v |= static_cast<uint32_t>(h - 'a' + 10);
      } else if (h >= 'A' && h <= 'F') {
        v |= static_cast<uint32_t>(h - 'A' + 10);
      } else {
        return Error("bad \\u escape");
      }
    }
    pos_ += 4;
    *out = v;
    return absl::OkStatus();
  }

  absl::Status ParseString(std::string* out) {
    ++pos_;  // opening quote
    while (true) {
      if (pos_ >= s_.size()) return Error("unterminated string");
      const unsigned char c = static_cast<unsigned char>(s_[pos_]);
      if (c == '"') {
        ++pos_;
        return absl::OkStatus();
      }
      if (c < 0x20) return Error("control character in a string");
      if (c != '\\') {
        // Validate UTF-8 as the safetensors reader (serde) does.
        size_t i = pos_;
        const uint32_t cp = NextCodePoint(s_, &i);
        if (cp == 0xFFFD && !(i - pos_ == 3 && s_.substr(pos_, 3) == "\xEF\xBF\xBD")) {
          return Error("invalid UTF-8 in a string");
        }
        out->append(s_.substr(pos_, i - pos_));
        pos_ = i;
        continue;
      }
      ++pos_;
      if (pos_ >= s_.size()) return Error("unterminated escape");
      const char e = s_[pos_++];
      switch (e) {
        case '"': out->push_back('"'); break;
        case '\\': out->push_back('\\'); break;
        case '/': out->push_back('/'); break;
        case 'b': out->push_back('\b'); break;
        case 'f': out->push_back('\f'); break;
        case 'n': out->push_back('\n'); break;
        case 'r': out->push_back('\r'); break;
        case 't': out->push_back('\t'); break;
        case 'u': {
          uint32_t cp;
          if (auto st = ParseHex4(&cp); !st.ok()) return st;
          if (cp >= 0xD800 && cp < 0xDC00) {
            uint32_t lo;
            if (!Consume("\\u")) return Error("unpaired surrogate");
            if (auto st = ParseHex4(&lo); !st.ok()) return st;
            if (lo < 0xDC00 || lo >= 0xE000) return Error("unpaired surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp < 0xE000) {
            return Error("unpaired surrogate");
          }
          AppendUtf8(cp, out);
          break;
        }
        default: return Error("bad escape");
      }
    }
  }

  absl::Status ParseNumber(Value* out) {
    const size_t start = pos_;
    if (pos_ < s_.size() && s_[pos_] == '-') ++pos_;
    auto digits = [&] {
      const size_t b = pos_;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
      return pos_ - b;
    };
    if (digits() == 0) return Error("expected a value");
    bool is_int = true;
    if (pos_ < s_.size() && s_[pos_] == '.') {
      ++pos_;
      is_int = false;
      if (digits() == 0) return Error("bad number");
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      is_int = false;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (digits() == 0) return Error("bad number");
    }
    const std::string text(s_.substr(start, pos_ - start));
    if (is_int) {
      errno = 0;
      char* end = nullptr;
      const long long v = std::strtoll(text.c_str(), &end, 10);
      if (errno == ERANGE) return Error("integer out of range");
      *out = Value::Int(v);
    } else {
      *out = Value::Double(std::strtod(text.c_str(), nullptr));
    }
    return absl::OkStatus();
  }

  std::string_view s_;
  ParseOptions options_;
  size_t pos_ = 0;
};

}  // namespace

absl::StatusOr<Value> Parse(std::string_view text, const ParseOptions& options) {
  if (text.size() > options.max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("JSON: ", text.size(), " bytes, more than the cap of ", options.max_bytes));
  }
  return Parser(text, options).Run();
}

}  // namespace ucp::json
