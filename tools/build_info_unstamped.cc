// The build info of the unstamped `ucp` binary, from which tools/elf_abi.py
// computes the minimum glibc that build_info_stamped.cc (generated) records.
#include "tools/build_info.h"

namespace ucp::tools {
const char kMinimumGlibc[] = "unknown";
const char kMinimumGlibcBound[] = "";
}  // namespace ucp::tools
