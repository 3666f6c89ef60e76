// Python `re` patterns built from literal text (DeepSpeed's
// universal_checkpoint_info lists, ucp's rules files): every character but
// ASCII letters, digits and '_' escaped, which both Python's `re` and
// std::regex (ECMAScript) read as the character itself.
//
// Example:
//   EscapeRegex("a.b[0]")  // "a\\.b\\[0\\]"
#ifndef UCP_BASE_REGEX_H_
#define UCP_BASE_REGEX_H_

#include <string>

#include "absl/strings/ascii.h"

namespace ucp {

inline std::string EscapeRegex(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_') out += '\\';
    out += c;
  }
  return out;
}

}  // namespace ucp

#endif  // UCP_BASE_REGEX_H_
