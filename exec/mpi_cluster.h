// The Cluster of an MPI job (Open MPI from Debian). ucp initializes MPI only
// when it was launched by mpirun/mpiexec (the launcher's environment
// variables say so); run alone it never touches MPI and works as before.
//
// Example (tools/ucp_main.cc):
//   std::unique_ptr<Cluster> cluster = JoinMpiJobIfLaunched(&argc, &argv);  // null when alone
//   ... run the command with cluster.get() ...
//   cluster.reset();  // MPI_Finalize
#ifndef UCP_EXEC_MPI_CLUSTER_H_
#define UCP_EXEC_MPI_CLUSTER_H_

#include <memory>

#include "base/cluster.h"

namespace ucp::exec {

// True when the environment is that of a process started by an MPI launcher
// (OMPI_COMM_WORLD_SIZE, PMIX_RANK, PMI_RANK, PMI_SIZE).
bool LaunchedByMpi();

// MPI_Init_thread and a Cluster over MPI_COMM_WORLD when LaunchedByMpi(),
// else null. Destroying it calls MPI_Finalize.
std::unique_ptr<Cluster> JoinMpiJobIfLaunched(int* argc, char*** argv);

}  // namespace ucp::exec

#endif  // UCP_EXEC_MPI_CLUSTER_H_
