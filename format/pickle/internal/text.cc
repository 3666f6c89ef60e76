#include "format/pickle/internal/text.h"

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace ucp::pickle::internal_text {
namespace {

// Decodes one UTF-8 sequence at s[i]; returns its length (0 when invalid).
size_t DecodeOne(std::string_view s, size_t i, uint32_t& code_point) {
  const auto byte = [&s](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t b0 = byte(i);
  if (b0 < 0x80) {
    code_point = b0;
    return 1;
  }
  size_t len;
  uint32_t min;
  if ((b0 & 0xe0) == 0xc0) {
    len = 2;
    min = 0x80;
    code_point = b0 & 0x1f;
  } else if ((b0 & 0xf0) == 0xe0) {
    len = 3;
    min = 0x800;
    code_point = b0 & 0x0f;
  } else if ((b0 & 0xf8) == 0xf0) {
    len = 4;
    min = 0x10000;
    code_point = b0 & 0x07;
  } else {
    return 0;
  }
  if (s.size() - i < len) return 0;
  for (size_t k = 1; k < len; ++k) {
    const uint8_t b = byte(i + k);
    if ((b & 0xc0) != 0x80) return 0;
    code_point = (code_point << 6) | (b & 0x3f);
  }
  if (code_point < min || code_point > 0x10ffff) return 0;
  return len;
}

}  // namespace

bool IsPickleUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= s.size()) {
      uint64_t word = 0;
      for (size_t k = 0; k < 8; ++k) word |= static_cast<uint64_t>(static_cast<uint8_t>(s[i + k])) << (8 * k);
      if (word & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= s.size()) break;
    uint32_t code_point;
    const size_t len = DecodeOne(s, i, code_point);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

void AppendUtf8(uint32_t code_point, std::string& out) {
  if (code_point < 0x80) {
    out.push_back(static_cast<char>(code_point));
  } else if (code_point < 0x800) {
    out.push_back(static_cast<char>(0xc0 | (code_point >> 6)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3f)));
  } else if (code_point < 0x10000) {
    out.push_back(static_cast<char>(0xe0 | (code_point >> 12)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3f)));
  } else {
    out.push_back(static_cast<char>(0xf0 | (code_point >> 18)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 12) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3f)));
  }
}

std::string Latin1ToUtf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() + bytes.size() / 4);
  for (char c : bytes) AppendUtf8(static_cast<uint8_t>(c), out);
  return out;
}

absl::StatusOr<std::string> Utf8ToLatin1(std::string_view utf8) {
  std::string out;
  out.reserve(utf8.size());
  size_t i = 0;
  while (i < utf8.size()) {
    uint32_t code_point;
    const size_t len = DecodeOne(utf8, i, code_point);
    if (len == 0) {
      return absl::InvalidArgumentError(absl::StrFormat("invalid UTF-8 at byte %d of a str", i));
    }
    if (code_point > 0xff) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "'latin-1' codec can't encode character U+%04X at position %d", code_point, out.size()));
    }
    out.push_back(static_cast<char>(code_point));
    i += len;
  }
  return out;
}

}  // namespace ucp::pickle::internal_text
