#include "tools/cli.h"

#include <iostream>

#include "absl/strings/str_cat.h"

namespace ucp::tools {

namespace {
Cluster* job_cluster = nullptr;
}  // namespace

Cluster* JobCluster() { return job_cluster; }
void SetJobCluster(Cluster* cluster) { job_cluster = cluster; }
bool PrintsResults() { return job_cluster == nullptr || job_cluster->rank() == 0; }

int Fail(const absl::Status& s) {
  if (!PrintsResults()) return 1;
  std::cerr << "ucp: " << s.message() << " [" << absl::StatusCodeToString(s.code()) << "]\n";
  return 1;
}

// Parses the flags; an exit code when the command is already done (a bad
// flag: 1, --help: 0), else nullopt.
std::optional<int> ParseOrExit(FlagSet& f, int argc, char** argv, std::vector<std::string>* positional) {
  auto pos = f.Parse(argc, argv);
  if (!pos.ok()) return Fail(pos.status());
  if (f.help_requested()) {
    std::cout << f.Usage();
    return 0;
  }
  *positional = *std::move(pos);
  return std::nullopt;
}

}  // namespace ucp::tools
