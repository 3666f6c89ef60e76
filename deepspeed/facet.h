// DeepSpeedFacet: what a DeepSpeed checkpoint carries besides its tensors
// and their layout, which DeepSpeed's writers pass through into what they
// write so that the target job resumes where the source stopped:
//   - the engine's model-state dicts (`mp_rank_XX_model_states.pt`, or
//     ZeRO-3's `zero_pp_rank_D_mp_rank_00_model_states.pt`): lr scheduler,
//     data sampler, step counters, ds_config, ds_version, and the client
//     state (iteration, args, rng states, universal_checkpoint_info);
//   - the optimizer state that is not sharded (what the universal
//     `zero/optimizer_state.pt` holds: loss scaler, clip_grad, ...,
//     param_groups).
// A state offers it as a state::Facet (state/model_state.h): the DeepSpeed
// source formats do; a source of another family (Hugging Face, PyTorch DCP,
// a model built in memory) offers none, and DeepSpeed's writers then use
// DeepSpeed's defaults for its model (deepspeed/engine_defaults.h,
// FacetOrDefaults).
//
// Example:
//   if (const DeepSpeedFacet* ds = FacetOf(state)) {
//     state::FileValue root = ds->ModelStatesRoot(0, 0);
//   }
#ifndef UCP_DEEPSPEED_FACET_H_
#define UCP_DEEPSPEED_FACET_H_

#include <string>

#include "absl/status/statusor.h"
#include "format/pickle/value.h"
#include "state/model_state.h"

namespace ucp::deepspeed {

class DeepSpeedFacet : public state::Facet {
 public:
  static state::FacetKey Key();

  // The optimizer state that is not sharded: what the universal
  // `zero/optimizer_state.pt` holds (loss_scaler, clip_grad, ..., param_groups).
  virtual absl::StatusOr<state::FileValue> OptimizerCommon() const = 0;
  // The model-state dict (an mp_rank_*_model_states.pt root) of source
  // stage `pp` and tp rank `tp` (each clamped to the source's degrees): its
  // client state is carried into written checkpoints.
  virtual state::FileValue ModelStatesRoot(int pp, int tp) const = 0;
  // The path of that mp_rank file, for byte-identical copies ("" when the
  // state has no such file: writers then serialize ModelStatesRoot()).
  virtual std::string ModelStatesPath(int pp, int tp) const = 0;
  // ZeRO-3 sources: the model-state file of dp rank `dp` and tp rank `tp`
  // (zero_pp_rank_D_mp_rank_TT_model_states.pt); "" for other sources.
  virtual std::string DpModelStatesPath(int dp, int tp) const { return ""; }
  // The training's DeepSpeed config as the source saved it (`ds_config`):
  // its model states' by default (ModelStatesRoot(0, 0)); value null when
  // absent. Native MoE checkpoints before DeepSpeed 0.19.3 keep it in the
  // optimizer files only.
  virtual state::FileValue SavedDsConfig() const;
  // The model states' `universal_checkpoint_info` (an empty dict when
  // absent): the merge patterns Megatron-DeepSpeed records (rules/rules.h).
  virtual const pickle::Value& checkpoint_info() const;
  // The training's `args` (a dict, or an argparse.Namespace's attributes),
  // or null.
  virtual const pickle::Value* args() const;
};

// The DeepSpeed facet of `state`, or null when it has none.
inline const DeepSpeedFacet* FacetOf(const state::CheckpointState& state) {
  return state::FacetOf<DeepSpeedFacet>(state);
}

// For a state class that is its own DeepSpeed facet: its GetFacet answer.
inline const state::Facet* OfferFacet(const DeepSpeedFacet* self, state::FacetKey key) {
  return key == DeepSpeedFacet::Key() ? self : nullptr;
}

// The `universal_checkpoint_info` of a state: its facet's, else an empty dict.
const pickle::Value& CheckpointInfoOf(const state::CheckpointState& state);
// The training's args of a state (DeepSpeedFacet::args), or null.
const pickle::Value* ArgsOf(const state::CheckpointState& state);

// The DeepSpeed version that wrote a source: its optimizer state's
// `ds_version`, else its model states' (ZeRO-3 keeps it there); "" if none
// (a source without a DeepSpeed facet).
std::string SourceDsVersion(const state::CheckpointState& state);

}  // namespace ucp::deepspeed

#endif  // UCP_DEEPSPEED_FACET_H_
