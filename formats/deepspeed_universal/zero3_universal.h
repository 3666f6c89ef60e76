// DeepSpeed's stage-3 universal layout: what ds_to_universal.py (0.15 to
// 0.19.5) writes for a ZeRO stage 3 source, and `ucp convert` of one
// (deepspeed_universal/universal_writer.h):
//
//   <dir>/zero_pp_rank_D_mp_rank_00_model_states.pt  the source's model states, copied
//                                                    (param_shapes: one dict per sub-group)
//   <dir>/zero/optimizer_state.pt                    rank 0's optimizer_state_dict + param_groups
//   <dir>/zero/<param>/<state>.pt                    the param's full state as a raw 1-D
//                                                    float32 tensor of its numel (no step.pt)
//   <dir>/ucp_manifest.textproto                     ucp's output only: every file's digest
//
// Of a source saved at tp > 1 (0.19.5 and later; universal_writer.h): the
// model states of every mp rank, or of mp rank 0 alone, and each state file
// the stage 1/2 dict whose 'param' is the state merged over tp (at least the
// tp slice param_shapes lists, in every dim).
//
// ucp checks and describes such a folder here (`ucp verify`, `ucp inspect`);
// it reads it as a source through deepspeed_zero3::Zero3State::OpenUniversal.
//
// Example:
//   UCP_ASSIGN_OR_RETURN(auto f, Zero3UniversalFolder::Open(dir, read));
//   formats::VerifyResult r;
//   f->Verify(&r);
#ifndef UCP_FORMATS_DEEPSPEED_UNIVERSAL_ZERO3_UNIVERSAL_H_
#define UCP_FORMATS_DEEPSPEED_UNIVERSAL_ZERO3_UNIVERSAL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "deepspeed/read_options.h"
#include "format/torch/torch_file.h"
#include "formats/format.h"
#include "proto/ucp.pb.h"

namespace ucp::deepspeed_universal {

// Whether the entries of a universal folder (`names`) are the stage-3
// layout's: zero_pp_rank_D_mp_rank_00_model_states.pt beside zero/.
bool IsZero3UniversalLayout(const std::vector<std::string>& names);

class Zero3UniversalFolder {
 public:
  // Opens dp rank 0's model states (the params and their shapes) and
  // zero/optimizer_state.pt (which sub-groups each param group holds), and
  // lists the folder; the rest is read by Verify.
  static absl::StatusOr<std::unique_ptr<Zero3UniversalFolder>> Open(const std::string& dir,
                                                                    const deepspeed::ReadOptions& read);

  // Every file opened with its CRCs: the model states (all dp ranks'
  // agreeing on dp_world_size), zero/optimizer_state.pt, and every param's
  // state files, each a 1-D float32 tensor of the param's numel, every param
  // with the same states; folders of params param_shapes does not list, and
  // the manifest's digests when there is one.
  void Verify(formats::VerifyResult* result) const;
  // What `ucp inspect` shows of it.
  InspectReport Report() const;

 private:
  struct Param {
    std::string name;
    std::vector<int64_t> shape;
    int sub_group = 0;
    int group = -1;  // the param group holding its sub-group
  };
  Zero3UniversalFolder() = default;
  void VerifyParam(const Param& p, const std::vector<std::string>& states, formats::VerifyResult* result) const;

  std::string dir_;
  deepspeed::ReadOptions read_;
  std::vector<std::string> names_;        // entries of dir_
  std::vector<std::string> param_dirs_;   // entries of zero/ that are folders
  std::unique_ptr<torch::TorchFile> model0_;
  std::unique_ptr<torch::TorchFile> optimizer_state_;  // zero/optimizer_state.pt
  std::vector<Param> params_;             // in param_shapes order
  std::string ds_version_;
  int dp_ = 1;
  bool merged_ = false;  // a checkpoint saved at tp > 1: params_' shapes are the merged ones
};

}  // namespace ucp::deepspeed_universal

#endif  // UCP_FORMATS_DEEPSPEED_UNIVERSAL_ZERO3_UNIVERSAL_H_
