// The formats built into ucp: the registry list. Adding a format to ucp is
// one line here (its package's Register) and one dependency in this
// package's BUILD (docs/FORMATS.md).
//
// Example:
//   const formats::Registry& r = builtin::Formats();
//   UCP_ASSIGN_OR_RETURN(formats::DetectedFolder d, formats::DetectFolder(r, path));
#ifndef UCP_FORMATS_BUILTIN_BUILTIN_H_
#define UCP_FORMATS_BUILTIN_BUILTIN_H_

#include "formats/format.h"

namespace ucp::formats::builtin {

// Built once, on first use; immutable afterwards (safe from any thread).
const Registry& Formats();

}  // namespace ucp::formats::builtin

#endif  // UCP_FORMATS_BUILTIN_BUILTIN_H_
