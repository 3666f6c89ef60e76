// ucp: universal checkpoints for DeepSpeed that survive any change of
// parallelism. Subcommands (tools/cmd_*.cc, listed in tools/commands.cc) are
// thin wrappers over the libraries: flags in, one library call, a status out.
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "base/alloc.h"
#include "base/fs.h"
#include "base/leftovers.h"
#include "exec/mpi_cluster.h"
#include "tools/build_info.h"
#include "tools/cli.h"
#include "tools/commands.h"

namespace {

void PrintUsage(std::ostream& out) {
  out << "ucp: universal checkpoints for DeepSpeed that survive any change of parallelism\n\n"
         "usage: ucp <command> [flags]   (ucp <command> --help explains each flag)\n"
         "       ucp --version            the release and the minimum glibc this binary needs\n\ncommands:\n";
  for (const auto& c : ucp::tools::Commands()) {
    std::string line = std::string("  ") + c.name;
    line.resize(std::max<size_t>(line.size() + 1, 12), ' ');
    out << line << c.summary << "\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h" ||
      std::string(argv[1]) == "help") {
    PrintUsage(std::cout);
    return argc < 2 ? 1 : 0;
  }
  if (std::string(argv[1]) == "--version" || std::string(argv[1]) == "version") {
    std::cout << "ucp " << ucp::tools::kUcpVersion << "\n"
              << "minimum glibc: " << ucp::tools::kMinimumGlibc << " (needed by "
              << ucp::tools::kMinimumGlibcBound << ")\n";
    return 0;
  }
  // Buffers of a few MiB come and go in every unit: reuse their pages
  // (base/alloc.h; about 3x fewer page faults on a real reshard).
  ucp::KeepFreedMemory();
  // A command's checkpoint structures, once its output is committed, are
  // freed by the process's exit, not one by one (base/leftovers.h).
  ucp::LeaveLeftoversToExit();
  // Ctrl-C, kill, a closed terminal: no staging folder left behind. Before
  // any thread starts, so that every thread blocks these signals.
  ucp::InstallStagingCleanupOnSignals();
  // Launched by mpirun: the ranks share the work (see README, "Many nodes").
  absl::StatusOr<std::unique_ptr<ucp::Cluster>> joined = ucp::exec::JoinMpiJobIfLaunched(&argc, &argv);
  if (!joined.ok()) {
    std::cerr << "ucp: " << joined.status().message() << "\n";
    return 1;
  }
  std::unique_ptr<ucp::Cluster> cluster = *std::move(joined);
  ucp::tools::SetJobCluster(cluster.get());
  const std::string cmd = argv[1];
  for (const auto& c : ucp::tools::Commands()) {
    if (cmd == c.name) {
      const int rc = c.run(argc - 1, argv + 1);
      ucp::tools::SetJobCluster(nullptr);
      return rc;
    }
  }
  std::cerr << "ucp: unknown command '" << cmd << "'\n";
  PrintUsage(std::cerr);
  return 1;
}
