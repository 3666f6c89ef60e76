// The Cluster of an MPI job (Open MPI). ucp joins MPI only when it was
// launched by mpirun/mpiexec (the launcher's environment variables say so);
// run alone it never touches MPI and works as before.
//
// Open MPI is not linked in: the `ucp` binary runs on machines without it.
// Under a launcher, libmpi.so.40 (the soname of Open MPI 3.0 to 5.x, whose C
// ABI is the same) is loaded with dlopen: $UCP_MPI_LIBRARY if set, else
// wherever the dynamic loader finds it (LD_LIBRARY_PATH, as `module load` and
// mpirun's --prefix set it, then the system's folders). When it cannot be
// loaded, or is not Open MPI's, the error names the library, the loader's
// reason and what to install.
//
// Example (tools/ucp_main.cc):
//   absl::StatusOr<std::unique_ptr<Cluster>> cluster = JoinMpiJobIfLaunched(&argc, &argv);
//   if (!cluster.ok()) ...                           // launched by mpirun, no usable Open MPI
//   ... run the command with cluster->get() ...      // null when alone
//   cluster->reset();                                // MPI_Finalize
#ifndef UCP_EXEC_MPI_CLUSTER_H_
#define UCP_EXEC_MPI_CLUSTER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "base/cluster.h"

namespace ucp::exec {

// True when the environment is that of a process started by an MPI launcher
// (OMPI_COMM_WORLD_SIZE, PMIX_RANK, PMI_RANK, PMI_SIZE).
bool LaunchedByMpi();

// The name of the launcher variable that LaunchedByMpi() found, or "".
std::string MpiLauncherVariable();

// PMIx's datastore of the job's data for this process, unless the user set
// one (PMIX_MCA_gds, from the environment or mpirun -x): "hash", PMIx's
// own, over the shared-memory ones (ds21, ds12) that mpirun offers. The
// ranks' MPI_Init attaching to the shared-memory store cost about 0.03 s
// of every `mpirun -np 2 ucp ...` on one node here (README "Many nodes");
// ucp's ranks look up a few of the job's keys, once, at MPI_Init (the
// shared store pays off for jobs with many ranks per node looking up many).
// Called by JoinMpiJobIfLaunched before MPI starts, while the
// process has one thread (setenv is not safe beside other threads' getenv).
// Returns whether it set the variable.
bool PreferPmixHashDatastore();

// When LaunchedByMpi(): loads Open MPI and returns a Cluster over
// MPI_COMM_WORLD, whose own thread starts MPI (MPI_Init_thread) while the
// caller goes on, makes every MPI call, and calls MPI_Finalize when the
// Cluster is destroyed; FailedPrecondition when Open MPI cannot be loaded
// (a failed MPI_Init_thread is the error of the first collective). Alone:
// null, and MPI is never loaded. Call it before any thread starts
// (PreferPmixHashDatastore).
absl::StatusOr<std::unique_ptr<Cluster>> JoinMpiJobIfLaunched(int* argc, char*** argv);

}  // namespace ucp::exec

#endif  // UCP_EXEC_MPI_CLUSTER_H_
