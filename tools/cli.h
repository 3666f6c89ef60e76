// Helpers shared by the ucp subcommands (tools/cmd_*.cc): error exit,
// flag parsing (the flags of each command: cli/command_flags.h).
#ifndef UCP_TOOLS_CLI_H_
#define UCP_TOOLS_CLI_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/cluster.h"
#include "base/phases.h"
#include "ops/open.h"
#include "cli/command_flags.h"  // ZeroSourceFlags, RegisterProgressFlag
#include "cli/flags.h"
#include "cli/progress.h"

namespace ucp::tools {

// The subcommands' flags and progress display live in cli/ (shared with the
// Python module).
using cli::ConvertFlags;
using cli::ConvertReport;
using cli::ExportFlags;
using cli::ExportReport;
using cli::FlagSet;
using cli::ParseProgressMode;
using cli::ProgressMode;
using cli::ProgressPrinter;
using cli::RegisterFsyncFlag;
using cli::RegisterProgressFlag;
using cli::RegisterUnsafePickleFlag;
using cli::RegisterUpdateLatestFlag;
using cli::ReshardFlags;
using cli::ReshardReport;
using cli::ZeroSourceFlags;

// The MPI job this process is a rank of (`mpirun -np N ucp ...`), or null
// when it runs alone; set by main.
Cluster* JobCluster();
void SetJobCluster(Cluster* cluster);
// Whether this process prints the command's results: it runs alone, or it is
// rank 0 of the job (every rank returns the same status).
bool PrintsResults();

// Prints "ucp: MESSAGE [CODE]" on stderr (rank 0 only in an MPI job) and
// returns 1.
int Fail(const absl::Status& s);

// With --timings, times the command from its construction to Print (its
// own thread and the threads it starts, by phase: base/phases.h) and Print
// writes the table on stderr; without, nothing.
class CommandTimings {
 public:
  CommandTimings(const char* command, bool enabled);
  void Print();

 private:
  std::string command_;
  bool enabled_;
  PhaseTimes times_;
  std::optional<PhaseScope> scope_;
  std::optional<PhaseTimer> root_;
  int64_t start_ns_ = 0;
};

// Parses the flags; an exit code when the command is already done (a bad
// flag: 1, --help: 0), else nullopt.
std::optional<int> ParseOrExit(FlagSet& f, int argc, char** argv, std::vector<std::string>* positional);

}  // namespace ucp::tools

#endif  // UCP_TOOLS_CLI_H_
