// Native DeepSpeed mixture-of-experts models (deepspeed.moe.layer.MoE with
// expert parallelism, ZeRO 1/2, tp = pp = 1) for the conformance suite: a
// random case, the model's full training state, and save(M, T) through the
// MoE writer (formats/deepspeed_moe/moe_writer.h), as conformance/synthetic_state.h does for
// dense models.
//
// A case (MoeCase) is a GPT-style nn.Module (wte, wpe, blocks h.<i> of
// ln_1 / attn_qkv / attn_proj / ln_2 and a dense MLP or an MoE layer, ln_f,
// lm_head) whose MoE layers have their own expert count (1, 2, 4 or 8
// experts: gate h.<i>.moe.deepspeed_moe.gate.wg.weight, experts
// h.<i>.moe.deepspeed_moe.experts.deepspeed_experts.<e>.{fc,proj}.{weight,bias}),
// the optimizer groups DeepSpeed's split_params_into_different_moe_groups_for_optimizer
// makes (decay / no_decay, or one group, then their expert groups named
// 'ep_size_<ep>' with 'moe': True), ZeRO stage 1 or 2, fp32 or fp16, and two
// topologies: dp and expert parallel degree ep (ep divides dp and every
// layer's expert count; dp / ep is the expert data parallel size over which
// the expert groups are partitioned).
//
// The files are laid out as DeepSpeed 0.12 to 0.19.5 save them, each
// version its own way (engine.py _save_moe_checkpoint, stage_1_and_2.py):
// from 0.19.3 the common checkpoint state with param_shapes as plain tuples,
// num_experts, ds_autoep_layers (checkpoint_parallel_dimensions in 0.19.5);
// before 0.19.3 model states of module, lr_scheduler, ..., dp/mp_world_size,
// num_experts only (0.19.2: + ds_autoep_layers), the ds_config in the
// optimizer files only; expp_rank_R placeholder files up to 0.19.4;
// per-rank group_paddings from 0.16.4; before 0.14.5 at ep > 1 the expert
// groups' param_slice_mappings of a window of the whole dp world's
// partition size.
//
// Example:
//   const MoeCase c = *GenMoeCase();
//   UCP_ASSIGN_OR_RETURN(auto m, SyntheticMoeState::Make(c));
//   UCP_RETURN_IF_ERROR(SaveMoe(*m, "/tmp/moe/global_step3", c.dp1, c.ep1, "").status());
#ifndef UCP_CONFORMANCE_MOE_GEN_H_
#define UCP_CONFORMANCE_MOE_GEN_H_

#include <cstdint>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "deepspeed/facet.h"
#include "state/model_state.h"
#include "format/torch/tensor.h"
#include "rapidcheck.h"
#include "ops/training_state.h"
#include "writers/target_options.h"

namespace ucp::conformance {

struct MoeCase {
  uint64_t seed = 1;
  int64_t hidden = 4, ffn = 4, vocab = 8, positions = 4;
  // Per transformer block: 0 = a dense MLP, else its MoE layer's expert count.
  std::vector<int> experts = {2};
  int base_groups = 2;  // 2: decay / no_decay (+ 2 expert groups); 1: one (+ 1)
  double no_decay_weight_decay = 0.0;  // the no_decay groups' (decay: 0.01)
  int zero_stage = 2;
  std::string lp_dtype = "fp32";  // fp32, fp16
  int dp1 = 2, ep1 = 2;           // saved at
  int dp2 = 1, ep2 = 1;           // resharded to
  std::string ds_version = "0.19.5";         // the source's
  std::string target_ds_version = "0.19.5";  // --target_ds_version of the reshard

  std::string ToString() const;
};

// The versions a MoeCase is drawn with (the MoE layout ucp reads).
const std::vector<std::string>& MoeDsVersionsDrawn();
rc::Gen<MoeCase> GenMoeCase();
// "ep1=2", "experts=4,1", "edp2=..." and other labels for the distribution.
std::vector<std::string> MoeCaseFeatures(const MoeCase& c);

class SyntheticMoeState : public state::ModelState, public deepspeed::DeepSpeedFacet {
 public:
  static absl::StatusOr<std::unique_ptr<SyntheticMoeState>> Make(const MoeCase& c);

  const state::ModelInfo& info() const override { return info_; }
  absl::StatusOr<tp::TensorPlan> Full(const state::ParamState& param, const std::string& state) const override;
  absl::StatusOr<state::FileValue> GroupScalar(int group, const std::string& key) const override;
  const state::Facet* GetFacet(state::FacetKey key) const override { return deepspeed::OfferFacet(this, key); }
  absl::StatusOr<state::FileValue> OptimizerCommon() const override { return common_; }
  state::FileValue ModelStatesRoot(int pp, int tp) const override { return root_; }
  std::string ModelStatesPath(int pp, int tp) const override { return ""; }
  // The training's config: in the model states from 0.19.3, in the
  // optimizer files only before (what the writer copies there).
  state::FileValue SavedDsConfig() const override { return ds_config_; }

  const MoeCase& moe_case() const { return case_; }
  // The full tensor of a param ("fp32", "exp_avg", "exp_avg_sq"), by its
  // global name; kNotFound otherwise.
  absl::StatusOr<torch::Tensor> Tensor(const std::string& name, const std::string& state) const;
  double Step(int group) const { return steps_[group]; }
  // Group index -> whether it holds experts.
  bool ExpertGroup(int g) const { return info_.expert_groups[g]; }

 private:
  SyntheticMoeState() = default;
  absl::Status Build();

  MoeCase case_;
  state::ModelInfo info_;
  std::map<std::string, std::map<std::string, torch::Tensor>> tensors_;
  std::vector<double> steps_;
  state::FileValue steps_value_;
  state::FileValue common_;
  state::FileValue root_;
  state::FileValue ds_config_;
};

// save(M, T): the MoE writer at dp / ep for `target_version` ("" = the
// source's), into `folder` (ROOT/TAG; ROOT/latest too).
absl::StatusOr<ops::WrittenCheckpoint> SaveMoe(const SyntheticMoeState& m, const std::string& folder, int dp, int ep,
                                                const std::string& target_version);

}  // namespace ucp::conformance

namespace ucp::conformance {
// How RapidCheck prints a case.
inline void showValue(const MoeCase& c, std::ostream& os) { os << c.ToString(); }
}  // namespace ucp::conformance

#endif  // UCP_CONFORMANCE_MOE_GEN_H_
