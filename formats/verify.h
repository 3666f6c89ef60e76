// `ucp verify FOLDER`: a checkpoint folder checked end to end, every problem
// reported rather than the first one only. The folder is resolved and its
// format detected by the registry (formats/format.h); the format checks its
// files (SourceFormat::Verify: CRCs, digests, structure, cross-file
// agreement); this driver adds what every format shares: pickles naming
// code-execution globals (UNSAFE, reported, and the rest still checked) and
// files that shrank while read.
//
// Example:
//   VerifyResult r = VerifyFolder(builtin::Formats(), "/ckpt/global_step4");
//   for (const std::string& p : r.problems) std::cout << "PROBLEM " << p << "\n";
#ifndef UCP_FORMATS_VERIFY_H_
#define UCP_FORMATS_VERIFY_H_

#include <string>

#include "formats/format.h"

namespace ucp::formats {

VerifyResult VerifyFolder(const Registry& registry, const std::string& path,
                          const SourceOptions& options = SourceOptions());

}  // namespace ucp::formats

#endif  // UCP_FORMATS_VERIFY_H_
