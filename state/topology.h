// Topology: the tensor (tp), pipeline (pp) and data (dp) parallel degrees of
// a checkpoint, and the model-parallel rank numbering DeepSpeed and Megatron
// use (and name files by): mp_rank = pp_rank * tp + tp_rank (mp_world_size =
// pp * tp).
#ifndef UCP_STATE_TOPOLOGY_H_
#define UCP_STATE_TOPOLOGY_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "proto/ucp.pb.h"

namespace ucp::state {

struct Topology {
  int tp = 1;
  int pp = 1;
  int dp = 1;

  int mp_world_size() const { return tp * pp; }
  int mp_rank(int pp_rank, int tp_rank) const { return pp_rank * tp + tp_rank; }
  std::string ToString() const { return absl::StrCat("tp=", tp, " pp=", pp, " dp=", dp); }
  bool operator==(const Topology& o) const { return tp == o.tp && pp == o.pp && dp == o.dp; }
  bool operator!=(const Topology& o) const { return !(*this == o); }

  ucp::Topology ToProto() const {
    ucp::Topology t;
    t.set_tp(tp);
    t.set_pp(pp);
    t.set_dp(dp);
    return t;
  }
  static Topology FromProto(const ucp::Topology& t) { return Topology{t.tp(), t.pp(), t.dp()}; }
  absl::Status Validate() const {
    if (tp < 1 || pp < 1 || dp < 1) {
      return absl::InvalidArgumentError(absl::StrCat("topology ", ToString(), ": every degree must be >= 1"));
    }
    return absl::OkStatus();
  }
};

}  // namespace ucp::state

#endif  // UCP_STATE_TOPOLOGY_H_
