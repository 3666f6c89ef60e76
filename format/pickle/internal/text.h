// Text conversions the pickle format needs: UTF-8 as Python's pickle reads
// and writes it (the 'surrogatepass' error handler, so lone surrogates
// U+D800-U+DFFF pass as 3-byte sequences), and latin-1 <-> UTF-8 for the
// protocol 2 encoding of bytes (`_codecs.encode(str, 'latin1')`).
//
// Example:
//   if (!IsPickleUtf8(s)) return error;
//   std::string text = Latin1ToUtf8(raw_bytes);
//   UCP_ASSIGN_OR_RETURN(std::string raw, Utf8ToLatin1(text));
#ifndef UCP_FORMAT_PICKLE_INTERNAL_TEXT_H_
#define UCP_FORMAT_PICKLE_INTERNAL_TEXT_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ucp::pickle::internal_text {

// Debian's Abseil is built with its own absl::string_view, which does not
// convert from std::string_view: this is the bridge for StrCat & co.
inline absl::string_view AbslView(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// True when `s` is UTF-8 that Python decodes with errors='surrogatepass'.
bool IsPickleUtf8(std::string_view s);

// Appends `code_point` (< 0x110000; surrogates allowed) as UTF-8.
void AppendUtf8(uint32_t code_point, std::string& out);

// Each byte is the code point of one character.
std::string Latin1ToUtf8(std::string_view bytes);

// The inverse: kInvalidArgument when `utf8` is not pickle UTF-8 or holds a
// character >= U+0100.
absl::StatusOr<std::string> Utf8ToLatin1(std::string_view utf8);

}  // namespace ucp::pickle::internal_text

#endif  // UCP_FORMAT_PICKLE_INTERNAL_TEXT_H_
