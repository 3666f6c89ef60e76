#include "tools/cli.h"

#include <time.h>

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

namespace {
int64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}
}  // namespace

CommandTimings::CommandTimings(const char* command, bool enabled) : command_(command), enabled_(enabled) {
  if (!enabled_) return;
  start_ns_ = MonotonicNs();
  scope_.emplace(&times_);
  root_.emplace(Phase::kOpen);  // what no nested phase counts: opening, parsing, planning
}

void CommandTimings::Print() {
  if (!enabled_) return;
  root_.reset();
  scope_.reset();
  enabled_ = false;
  std::string title = absl::StrCat("ucp ", command_, " timings");
  if (job_cluster != nullptr) absl::StrAppend(&title, " (rank ", job_cluster->rank(), " of ", job_cluster->size(), ")");
  std::cerr << times_.Report(title, (MonotonicNs() - start_ns_) * 1e-9) << std::flush;
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
