// What the `ucp` binary knows about itself, printed by `ucp --version`: its
// version and the minimum glibc its symbol versions need, computed from the
// linked binary by tools/elf_abi.py and stamped into the final link
// (tools/BUILD: ucp_unstamped -> build_info_stamped.cc -> ucp).
//
// Example:
//   std::cout << "ucp " << ucp::tools::kUcpVersion << ", glibc >= " << ucp::tools::kMinimumGlibc;
#ifndef UCP_TOOLS_BUILD_INFO_H_
#define UCP_TOOLS_BUILD_INFO_H_

namespace ucp::tools {

// The release, as the wheels' (tools/version.bzl).
extern const char kUcpVersion[];
// e.g. "2.17"; "unknown" in the unstamped binary the stamp is computed from.
extern const char kMinimumGlibc[];
// The symbols that need kMinimumGlibc, comma-separated.
extern const char kMinimumGlibcBound[];

}  // namespace ucp::tools

#endif  // UCP_TOOLS_BUILD_INFO_H_
