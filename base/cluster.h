// Cluster: the processes that run one ucp job together (the ranks of an MPI
// job; exec/mpi_cluster.h), as the executors need them: who am I, how many
// are we, send bytes from one rank to all, collect bytes from all at one.
// Every call is collective: all ranks make it, in the same order.
//
// Example:
//   std::string plan_bytes = cluster.rank() == 0 ? Serialize(plan) : "";
//   UCP_RETURN_IF_ERROR(cluster.Broadcast(&plan_bytes, /*root=*/0));
#ifndef UCP_BASE_CLUSTER_H_
#define UCP_BASE_CLUSTER_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ucp {

class Cluster {
 public:
  virtual ~Cluster() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // `*bytes` of `root` replaces every other rank's.
  virtual absl::Status Broadcast(std::string* bytes, int root) = 0;
  // At `root`: every rank's `mine`, by rank; elsewhere: empty.
  virtual absl::StatusOr<std::vector<std::string>> Gather(const std::string& mine, int root) = 0;
  // Ends the job at once with `code` on every rank (a rank that cannot take
  // part in the collectives any more).
  virtual void Abort(int code) = 0;
};

// Every rank's `mine` in, one status out, the same on every rank: OK when all
// are OK, else the lowest failing rank's error, its message prefixed with
// "rank N: " (unless it is rank 0's own). Collective.
absl::Status AgreeOnStatus(Cluster& cluster, const absl::Status& mine);

}  // namespace ucp

#endif  // UCP_BASE_CLUSTER_H_
