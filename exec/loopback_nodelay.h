// TCP_NODELAY on this process's loopback TCP connections: the way around a
// 40 ms stall in every MPI job on one node.
//
// Open MPI's ranks talk to their launcher (mpirun, or the node's daemon)
// through PMIx, over a TCP connection to 127.0.0.1 that PMIx leaves with
// Nagle's algorithm on. At MPI_Finalize a rank sends several small messages
// back to back: the first goes out, the next wait for its acknowledgement,
// which the launcher delays (Linux's delayed ACK, 40 ms) because it has
// nothing to send back yet. Measured here (Open MPI 4.1.4, PMIx 4.2.2,
// `strace -f -tt` of `mpirun -np 2 ucp convert`): 38 ms between a rank's
// writes and the launcher's read, with every thread of the job asleep; an
// MPI_Init + MPI_Finalize program under `mpirun -np 2` took 0.11-0.13 s, and
// 0.07-0.08 s once it set TCP_NODELAY on those sockets after MPI_Init.
//
// Only loopback TCP sockets are touched (both ends on this host: the PMIx
// connection; sockets to other hosts are left as they are), and the option
// only changes when small writes go out, never what is sent.
//
// Example (exec/mpi_cluster.cc, right after MPI_Init_thread):
//   SetNoDelayOnLoopbackTcp();
#ifndef UCP_EXEC_LOOPBACK_NODELAY_H_
#define UCP_EXEC_LOOPBACK_NODELAY_H_

namespace ucp::exec {

// Sets TCP_NODELAY on every TCP socket of this process whose peer is a
// loopback address (127.0.0.0/8, ::1, or IPv4-mapped 127.x); returns how many
// it set. Other descriptors, and a missing /proc/self/fd, are left alone.
int SetNoDelayOnLoopbackTcp();

}  // namespace ucp::exec

#endif  // UCP_EXEC_LOOPBACK_NODELAY_H_
