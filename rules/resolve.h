// Deciding every param's tp merge and turning a SlicedState (a checkpoint as
// its tp ranks hold it) into a ModelState (full tensors), lazily.
//
// ResolveRules decides each param's MergeRule from the sources of rules.h in
// order, then checks, before anything is written, what the rules assume of
// the data:
//   - a REPLICATED param's tp copies are bitwise equal in fp32 and every
//     optimizer state (else an error naming the param and the largest
//     difference, unless ReplicatedMismatch says otherwise);
//   - a param tied across pipeline stages is bitwise equal in every stage;
//   - params no source decides are settled by evidence (tp copies equal, in
//     every param of the family: rules/suggest.h) or listed, all at once,
//     in one error with one suggested rule per family (rules/suggest.h).
// The resulting state's `Full(param, state)` is a TensorPlan over the
// source's slices (merge_tp_slices of ds_to_universal.py, without temp files).
//
// ReinterpretDeepSpeedUniversal does the same for a universal checkpoint that
// DeepSpeed's ds_to_universal.py wrote without patterns: a tensor it
// concatenated on dim 0 by default is read back as the source's tp slices and
// re-merged by the rule a rule source (or the evidence of bitwise equal
// copies) gives.
//
// Example:
//   UCP_ASSIGN_OR_RETURN(auto sliced, deepspeed_zero::ZeroSlicedState::Make(ckpt, {}));
//   UCP_ASSIGN_OR_RETURN(auto state, ResolveRules(std::move(sliced), ResolveOptions()));
//   UCP_ASSIGN_OR_RETURN(tp::TensorPlan full, state->Full(state->info().params[0], "fp32"));
#ifndef UCP_RULES_RESOLVE_H_
#define UCP_RULES_RESOLVE_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "state/model_state.h"
#include "rules/rules.h"
#include "rules/suggest.h"

namespace ucp::rules {

enum class ReplicatedMismatch { kError, kAverage, kFirst };

struct ResolveOptions {
  RuleResolver::Options rules;
  ReplicatedMismatch replicated_mismatch = ReplicatedMismatch::kError;
  int num_threads = 0;  // evidence is gathered in parallel; 0 = all cores
  // Sources that only exist at tp=1 (ZeRO-3, native MoE): a param no rule
  // covers is a whole tensor with no known tp split (state::kTp1WholeOrigin), not an
  // error; no data is read to decide it. Writers refuse to split such a
  // param over tp > 1.
  bool tp1_whole_tensors = false;
  // The training's args when the source has none of its own (no DeepSpeed
  // facet): a Hugging Face import's (rules/hf_import.h HfImportPlan::args),
  // for the preset's argument-conditional rules. Not owned; null = none.
  const pickle::Value* args = nullptr;
};


// A SlicedState with every param's rule decided.
class ResolvedState : public state::ModelState {
 public:
  const state::ModelInfo& info() const override { return info_; }
  absl::StatusOr<tp::TensorPlan> Full(const state::ParamState& param, const std::string& state) const override;
  // Full, opened on its first read, when the source holds the param's state
  // whole in one file (SlicedState::WholeStateFile).
  std::optional<tp::TensorPlan> FullDeferred(const state::ParamState& param, const std::string& state) const override;
  absl::StatusOr<state::FileValue> GroupScalar(int group, const std::string& key) const override {
    return source_->GroupScalar(group, key);
  }
  std::vector<state::InputRange> Inputs(const state::ParamState& param) const override {
    return source_->Inputs(param);
  }
  std::vector<state::InputRange> StateInputs(const state::ParamState& param, const std::string& state) const override {
    return source_->StateInputs(param, state);
  }
  std::vector<std::string> InputFiles() const override { return source_->InputFiles(); }
  std::optional<state::FileExtent> ExtentOf(const state::InputRange& range) const override {
    return source_->ExtentOf(range);
  }
  absl::Status VerifyInput(const std::string& path) const override { return source_->VerifyInput(path); }
  void SetCheckedInputs(std::shared_ptr<const std::set<std::string>> keys) const override {
    source_->SetCheckedInputs(std::move(keys));
  }
  const state::Facet* GetFacet(state::FacetKey key) const override { return source_->GetFacet(key); }

  const state::SlicedState& source() const { return *source_; }
  const RuleResolver& resolver() const { return resolver_; }

 private:
  friend absl::StatusOr<std::unique_ptr<ResolvedState>> ResolveRules(std::shared_ptr<const state::SlicedState>,
                                                                     const ResolveOptions&,
                                                                     const state::ModelInfo*);
  ResolvedState() = default;
  absl::Status Resolve(const ResolveOptions& options);
  absl::Status TakeDecisions(const state::ModelInfo& decided);

  std::shared_ptr<const state::SlicedState> source_;
  RuleResolver resolver_;
  state::ModelInfo info_;
};

// With `decided` (another process's result for the same source: an MPI
// job's rank 0), every param takes its rule, source, origin and full shape
// from it: nothing is read for evidence.
absl::StatusOr<std::unique_ptr<ResolvedState>> ResolveRules(std::shared_ptr<const state::SlicedState> source,
                                                            const ResolveOptions& options,
                                                            const state::ModelInfo* decided = nullptr);

// The suggested rules for the params of `source` that the rule sources
// leave open (rules/suggest.h): what `ucp rules --suggest` writes.
struct SuggestReport {
  std::vector<FamilySuggestion> suggestions;
  int undecided_params = 0;        // no rule and no evidence settles them
  int replicated_by_evidence = 0;  // settled as replicated by equal tp copies
  std::string text;                // the editable --rules file
};
absl::StatusOr<SuggestReport> SuggestRules(std::shared_ptr<const state::SlicedState> source,
                                           const ResolveOptions& options);

// A universal checkpoint written by DeepSpeed (rules from its files'
// metadata) with the params it concatenated on dim 0 by default re-merged
// where a rule source or the evidence knows better. `uc_info` is the model
// states' universal_checkpoint_info; `dir` the universal folder (for messages).
absl::StatusOr<std::unique_ptr<state::ModelState>> ReinterpretDeepSpeedUniversal(
    std::unique_ptr<state::ModelState> universal, const pickle::Value& uc_info,
    const RuleResolver::Options& options, const std::string& dir, const state::ModelInfo* decided = nullptr);

// For a target that splits params over tp > 1: the params of `state` kept
// whole with no known tp split (RuleSource UNDECIDED: a tp=1 source's, or a
// universal checkpoint converted from one) take the rule that `options`
// (--rules, --preset, --default_kind) gives them, as if the whole tensor were
// the one tp slice of a tp=1 checkpoint. While any stays undecided: an error
// naming them, with one rule per family to fill in (rules/suggest.h). A param
// no tp rank splits (ParamState::tp_whole: a MoE expert) stays whole and
// undecided. A state with no undecided param is returned as it is.
absl::StatusOr<std::unique_ptr<state::ModelState>> DecideUndecided(std::unique_ptr<state::ModelState> state,
                                                                   const RuleResolver::Options& options,
                                                                   const std::string& dir, int target_tp);

}  // namespace ucp::rules

#endif  // UCP_RULES_RESOLVE_H_
