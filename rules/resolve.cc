#include "rules/resolve.h"

#include <algorithm>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/parallel.h"
#include "base/status_macros.h"
#include "deepspeed/facet.h"
#include "deepspeed/layout_math.h"
#include "rules/suggest.h"
#include "tp/merge.h"

namespace ucp::rules {
namespace {

using state::ParamState;
using pickle::Kind;
using pickle::Value;
using tp::TensorPlan;

// Evidence for one param: are the tp copies (and pipeline copies) equal?
struct Evidence {
  bool tp_equal = true;
  double tp_max_diff = 0;
  std::string tp_diff_state;
  bool stages_equal = true;
  std::string stage_diff_state;
};

// Takes each param's decision from `decided`; the params must be the same.
absl::Status ApplyDecisions(const state::ModelInfo& decided, const std::string& dir, state::ModelInfo* info) {
  if (decided.params.size() != info->params.size()) {
    return absl::FailedPreconditionError(absl::StrCat(dir, ": ", info->params.size(), " params here, ",
                                                      decided.params.size(), " in the job's description"));
  }
  for (size_t i = 0; i < info->params.size(); ++i) {
    ParamState& p = info->params[i];
    const ParamState& d = decided.params[i];
    if (d.name != p.name) {
      return absl::FailedPreconditionError(absl::StrCat(dir, ": param ", i, " is '", p.name, "' here, '", d.name,
                                                        "' in the job's description"));
    }
    p.rule = d.rule;
    p.source = d.source;
    p.origin = d.origin;
    p.full_shape = d.full_shape;
    p.autotp_cut = d.autotp_cut;
  }
  info->original_vocab_size = decided.original_vocab_size;
  return absl::OkStatus();
}

// Every param's decision by rule sources 1-3, the evidence of its tp copies
// (and pipeline copies) where needed, and the facts the suggestions use.
struct Gathered {
  std::vector<RuleDecision> decisions;
  std::vector<Evidence> evidence;
  std::vector<ParamFacts> facts;
  // ParamState::autotp_cut of each param (kind unspecified for most).
  std::vector<MergeRule> autotp_cut;
};

// Whether an AutoTP source holds its lm_head whole on every tp rank: saved
// with no universal_checkpoint_info (AutoTP training before 0.19.5: 0.16.4 to
// 0.18.9) by a DeepSpeed before 0.19.5 (or of no recorded version). A
// checkpoint ucp wrote for 0.19.5 on from such a source holds none either,
// but its lm_head cut by vocabulary rows and its ds_version the target's.
bool AutoTpLmHeadWhole(const state::SlicedState& src) {
  const Value& uc = deepspeed::CheckpointInfoOf(src);
  if (uc.is(Kind::kDict) && uc.DictGet("universal_checkpoint_version") != nullptr) return false;
  absl::StatusOr<deepspeed::DsVersion> v = deepspeed::ParseDsVersion(deepspeed::SourceDsVersion(src));
  return !v.ok() || *v < deepspeed::DsVersion{0, 19, 5};
}

SuggestContext ContextOf(const state::SlicedState& src, int tp) {
  SuggestContext c;
  c.tp = tp;
  if (const Value* a = deepspeed::ArgsOf(src); a != nullptr && a->is(Kind::kDict)) {
    if (const Value* h = a->DictGet("hidden_size"); h != nullptr && h->is(Kind::kInt) && h->fits_int64()) {
      c.hidden_size = h->int_value();
    }
  }
  return c;
}

// `tp1_whole_tensors`: a tp=1 source whose params are whole tensors needs no
// evidence (ResolveOptions::tp1_whole_tensors).
absl::StatusOr<Gathered> Gather(const state::SlicedState& src, const state::ModelInfo& info,
                                const RuleResolver& resolver, int num_threads, bool tp1_whole_tensors) {
  const int tp_degree = info.source_topology.tp;
  Gathered g;
  std::vector<RuleDecision>& decisions = g.decisions;
  decisions.resize(info.params.size());
  std::vector<char> needs_data(info.params.size(), 0);
  // AutoTP training before 0.19.5 (no universal_checkpoint_info: 0.16.4 to
  // 0.18.9) leaves the lm_head whole on every tp rank (replace_module.py
  // set_lm_head returns in training mode; a real 0.18.9 tp 2 checkpoint holds
  // lm_head [vocab, hidden] on both ranks): a preset's column split of it
  // would double its rows. It is replicated there (its copies checked equal).
  const bool whole_lm_head = info.autotp && AutoTpLmHeadWhole(src);
  g.autotp_cut.resize(info.params.size());
  for (size_t i = 0; i < info.params.size(); ++i) {
    if (absl::Status s = resolver.CheckSupported(info.params[i].name); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(src.dir(), ": ", s.message()));
    }
    decisions[i] = resolver.Decide(info.params[i].name, info.params[i].tp_shapes[0]);
    if (info.autotp && decisions[i].rule && decisions[i].source == PRESET &&
        tp::AutoTpIsLmHead(info.params[i].name) && decisions[i].rule->kind() == COLUMN) {
      // AutoTP (0.19.5 on) declares its lm_head a vocabulary param
      // (universal_checkpoint_info vocabulary_parameter_patterns; it pads none):
      // a checkpoint that records none reads as one that does.
      decisions[i].rule->set_kind(VOCAB);
      decisions[i].origin += " (a vocabulary param, as AutoTP declares it)";
    }
    if (whole_lm_head && decisions[i].rule && decisions[i].source == PRESET &&
        tp::AutoTpIsLmHead(info.params[i].name) &&
        (decisions[i].rule->kind() == COLUMN || decisions[i].rule->kind() == VOCAB)) {
      g.autotp_cut[i] = *decisions[i].rule;
      MergeRule r = *decisions[i].rule;
      r.set_kind(REPLICATED);
      r.clear_original_vocab_size();
      decisions[i].rule = r;
      decisions[i].origin += state::kAutoTpWholeLmHeadNote;
    }
    const bool replicated = decisions[i].rule && (decisions[i].rule->kind() == REPLICATED);
    const bool multi_stage = info.params[i].trainable() && info.params[i].stages.size() > 1;
    needs_data[i] = !decisions[i].rule || (replicated && tp_degree > 1) || multi_stage;
    if (((tp1_whole_tensors && tp_degree == 1) || info.params[i].tp_whole) && !multi_stage) needs_data[i] = false;
  }

  // Evidence, in parallel over the params that need it.
  std::vector<Evidence>& evidence = g.evidence;
  evidence.resize(info.params.size());
  std::vector<size_t> todo;
  for (size_t i = 0; i < info.params.size(); ++i) {
    if (needs_data[i]) todo.push_back(i);
  }
  UCP_RETURN_IF_ERROR(ParallelFor(todo.size(), num_threads, [&](size_t k) -> absl::Status {
    const size_t i = todo[k];
    const ParamState& p = info.params[i];
    std::vector<std::string> states;
    if (p.trainable()) {
      states.push_back(state::kFp32State);
      for (const auto& key : info.state_keys) states.push_back(key);
    } else {
      states.push_back(state::kLpState);
    }
    Evidence& ev = evidence[i];
    const int first_stage = p.stages.empty() ? 0 : p.stages[0];
    for (const std::string& state : states) {
      UCP_ASSIGN_OR_RETURN(std::vector<TensorPlan> slices, src.Slices(p, first_stage, state));
      for (size_t t = 1; t < slices.size(); ++t) {
        UCP_ASSIGN_OR_RETURN(bool eq, TensorPlan::BitwiseEqual(slices[0], slices[t]));
        if (!eq) {
          if (ev.tp_equal) ev.tp_diff_state = state;
          ev.tp_equal = false;
          if (slices[0].shape() == slices[t].shape() && torch::IsFloatingPoint(slices[0].dtype())) {
            UCP_ASSIGN_OR_RETURN(torch::Tensor a, slices[0].Materialize());
            UCP_ASSIGN_OR_RETURN(torch::Tensor b, slices[t].Materialize());
            UCP_ASSIGN_OR_RETURN(double d, torch::MaxAbsDiff(a, b));
            ev.tp_max_diff = std::max(ev.tp_max_diff, d);
          }
        }
      }
      if (p.trainable()) {
        for (size_t si = 1; si < p.stages.size(); ++si) {
          UCP_ASSIGN_OR_RETURN(std::vector<TensorPlan> other, src.Slices(p, p.stages[si], state));
          for (size_t t = 0; t < slices.size(); ++t) {
            UCP_ASSIGN_OR_RETURN(bool eq, TensorPlan::BitwiseEqual(slices[t], other[t]));
            if (!eq && ev.stages_equal) {
              ev.stages_equal = false;
              ev.stage_diff_state = absl::StrCat(state, " (tp rank ", t, ", stages ", p.stages[0], " and ",
                                                 p.stages[si], ")");
            }
          }
        }
      }
    }
    return absl::OkStatus();
  }));

  g.facts.resize(info.params.size());
  for (size_t i = 0; i < info.params.size(); ++i) {
    ParamFacts& f = g.facts[i];
    f.name = info.params[i].name;
    f.slice_shape = info.params[i].tp_shapes[0];
    f.decided = decisions[i].rule.has_value();
    if (!f.decided && tp_degree > 1 && !info.params[i].tp_whole) {
      f.tp_equal = evidence[i].tp_equal;
      f.diff_state = evidence[i].tp_diff_state;
      f.max_diff = evidence[i].tp_max_diff;
    }
  }
  return g;
}


}  // namespace

absl::StatusOr<std::unique_ptr<ResolvedState>> ResolveRules(std::shared_ptr<const state::SlicedState> source,
                                                            const ResolveOptions& options,
                                                            const state::ModelInfo* decided) {
  std::unique_ptr<ResolvedState> s(new ResolvedState());
  s->source_ = std::move(source);
  if (decided != nullptr) {
    UCP_RETURN_IF_ERROR(s->TakeDecisions(*decided));
  } else {
    UCP_RETURN_IF_ERROR(s->Resolve(options));
  }
  return s;
}

absl::Status ResolvedState::TakeDecisions(const state::ModelInfo& decided) {
  info_ = source_->info();
  UCP_RETURN_IF_ERROR(ApplyDecisions(decided, source_->dir(), &info_));
  info_.Reindex();
  return absl::OkStatus();
}

namespace {

// What deciding the params found wrong, reported all at once.
struct Problems {
  std::vector<std::string> ambiguous, mismatched, tied_mismatch;
  std::vector<bool> is_ambiguous;
};

// A param of a tp=1 source that nothing decides: kept whole, undecided.
RuleDecision Undecided(const std::string& name) {
  MergeRule rule;
  rule.set_pattern(name);
  rule.set_kind(REPLICATED);
  RuleDecision d;
  d.rule = rule;
  d.source = UNDECIDED;
  d.origin = state::kTp1WholeOrigin;
  return d;
}

// One param's decision: the rule sources' (in `d`), else the fallbacks
// (checkpoint patterns' default, equal tp copies, --default_kind), else, for
// a tp=1 source whose whole tensors a step may keep, undecided; a replicated
// param's differing tp copies as --replicated_mismatch says. Records what
// stays wrong in `problems`; returns false when the param is left open.
bool DecideParam(const ParamState& p, RuleDecision d, const Evidence& ev, bool family_equal, int tp_degree,
                 const ResolveOptions& options, const RuleResolver& resolver, size_t i, Problems* problems,
                 RuleDecision* out) {
  if (!ev.stages_equal) {
    problems->tied_mismatch.push_back(
        absl::StrCat("'", p.name, "' differs between pipeline stages in ", ev.stage_diff_state));
  }
  if (!d.rule) {
    d = resolver.DecideWithoutRules(p.name, tp_degree > 1 ? std::optional<bool>(family_equal) : std::nullopt);
    if (d.rule && d.source == EVIDENCE && !ev.tp_equal) d.rule.reset();  // never: family_equal implies tp_equal
    if (!d.rule && (options.tp1_whole_tensors || p.tp_whole) && tp_degree == 1) d = Undecided(p.name);
    if (!d.rule) {
      problems->is_ambiguous[i] = true;
      problems->ambiguous.push_back(p.name);
      return false;
    }
  } else if (d.rule->kind() == REPLICATED && tp_degree > 1 && !ev.tp_equal) {
    switch (options.replicated_mismatch) {
      case ReplicatedMismatch::kError:
        problems->mismatched.push_back(absl::StrCat("  ", p.name, " (", d.origin, "): tp copies differ in ",
                                                    ev.tp_diff_state, ", largest |difference| ", ev.tp_max_diff));
        break;
      case ReplicatedMismatch::kAverage:
        d.rule->set_kind(AVERAGE);
        absl::StrAppend(&d.origin, "; tp copies differ (max |diff| ", ev.tp_max_diff,
                        "): averaged (--replicated_mismatch=average)");
        break;
      case ReplicatedMismatch::kFirst:
        absl::StrAppend(&d.origin, "; tp copies differ (max |diff| ", ev.tp_max_diff,
                        "): tp rank 0 kept (--replicated_mismatch=first)");
        break;
    }
  }
  *out = std::move(d);
  return true;
}

// A tied alias (another name of a trainable param) is the same tensor: its
// owner's rule, whatever its own name would match.
absl::Status TieAliases(const std::string& dir, const std::vector<bool>& is_ambiguous, state::ModelInfo* info) {
  for (ParamState& p : info->params) {
    if (p.role != state::TensorRole::kTied || p.alias_of.empty()) continue;
    const int owner = info->IndexOf(p.alias_of);
    if (owner < 0 || is_ambiguous[static_cast<size_t>(owner)]) continue;
    const ParamState& o = info->params[static_cast<size_t>(owner)];
    if (o.tp_shapes != p.tp_shapes) {
      return absl::FailedPreconditionError(absl::StrCat(dir, ": '", p.name, "' is listed in shared_params as '",
                                                        o.name, "' but their tp slices differ in shape"));
    }
    p.rule = o.rule;
    p.source = o.source;
    p.origin = absl::StrCat("tied to '", o.name, "' (shared_params): ", o.origin);
  }
  return absl::OkStatus();
}

// The error for params no rule source, fallback or evidence settles, with
// one suggested rule per family.
absl::Status AmbiguousError(const state::SlicedState& src, const Gathered& g, const Problems& problems,
                            const RuleResolver& resolver, int tp_degree) {
  // Only the ambiguous params are undecided for the suggestions.
  std::vector<ParamFacts> facts = g.facts;
  for (size_t i = 0; i < facts.size(); ++i) facts[i].decided = !problems.is_ambiguous[i];
  const std::vector<FamilySuggestion> suggestions = SuggestFamilies(facts, ContextOf(src, tp_degree));
  std::string listed;
  for (const FamilySuggestion& f : suggestions) absl::StrAppend(&listed, "\n", SuggestionText(f));
  const std::string families =
      absl::StrCat(suggestions.size(), " famil", suggestions.size() == 1 ? "y" : "ies");
  const std::string preset = resolver.preset().empty() ? "" : absl::StrCat(" (", resolver.preset(), ")");
  const std::string settle = absl::StrCat(
      "Settle them with --rules=FILE (a MergeRules textproto; `ucp rules --suggest --input_folder=", src.dir(),
      "` writes these suggestions as one to edit), --preset, or --default_kind");
  if (tp_degree == 1) {
    // Only a step that splits the params over tp > 1 needs their kind.
    return absl::FailedPreconditionError(absl::StrCat(
        src.dir(), ": the target splits params over tp > 1, but ", problems.ambiguous.size(), " param(s) in ",
        families, " have no known tp split: saved at tp=1, and no rule file, checkpoint pattern or preset", preset,
        " says how they split. ", settle, ". The undecided families:\n", listed));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      src.dir(), ": cannot tell how to merge the tp slices of ", problems.ambiguous.size(), " param(s) in ", families,
      "; no rule file, checkpoint pattern or preset", preset, " covers them. ", settle, ":\n", listed));
}

// Every param's full (merged) shape, the vocabulary padding stripped.
absl::Status SetFullShapes(const std::string& dir, int tp_degree, state::ModelInfo* info) {
  for (ParamState& p : info->params) {
    const int tp = p.tp_whole ? 1 : tp_degree;
    UCP_ASSIGN_OR_RETURN(p.full_shape, p.tp_shapes.size() == static_cast<size_t>(tp)
                                           ? tp::FullShapeFromSlices(p.rule, p.tp_shapes, p.name)
                                           : tp::FullShapeFromSlice(p.rule, p.tp_shapes[0], tp, p.name),
                         _.Prepend(absl::StrCat(dir, ": ")));
    if (p.rule.kind() == VOCAB && p.rule.original_vocab_size() > 0) {
      if (p.rule.original_vocab_size() > p.full_shape[0]) {
        return absl::InvalidArgumentError(absl::StrCat(dir, ": param '", p.name, "': original vocab size ",
                                                       p.rule.original_vocab_size(), " exceeds its ",
                                                       p.full_shape[0], " rows"));
      }
      p.full_shape[0] = p.rule.original_vocab_size();
    }
  }
  return absl::OkStatus();
}

// The source's args (its DeepSpeed facet's), else the options'.
const pickle::Value* ArgsOf(const state::SlicedState& src, const ResolveOptions& options) {
  const pickle::Value* args = deepspeed::ArgsOf(src);
  return args != nullptr ? args : options.args;
}

}  // namespace

absl::Status ResolvedState::Resolve(const ResolveOptions& options) {
  const state::SlicedState& src = *source_;
  info_ = src.info();
  info_.Reindex();
  const int tp_degree = info_.source_topology.tp;

  std::vector<std::string> names;
  for (const auto& p : info_.params) names.push_back(p.name);
  UCP_ASSIGN_OR_RETURN(resolver_, RuleResolver::Make(options.rules, deepspeed::CheckpointInfoOf(src), names, ArgsOf(src, options)));
  info_.original_vocab_size = resolver_.original_vocab_size();
  UCP_ASSIGN_OR_RETURN(Gathered g, Gather(src, info_, resolver_, options.num_threads, options.tp1_whole_tensors));
  // Equal tp copies settle a param as replicated only if no param of its
  // family (same name but for layer indices, same rank) has copies that
  // differ: those are partitioned, and so is a sibling whose slices happen
  // to be equal (zero-initialized, untouched by training).
  const std::vector<bool> family_equal = FamilyCopiesEqual(g.facts);

  Problems problems;
  problems.is_ambiguous.assign(info_.params.size(), false);
  for (size_t i = 0; i < info_.params.size(); ++i) {
    ParamState& p = info_.params[i];
    // A tied alias takes its owner's rule (TieAliases).
    if (p.role == state::TensorRole::kTied && info_.IndexOf(p.alias_of) >= 0) continue;
    RuleDecision d;
    // A whole tensor of a tp > 1 source is decided as a tp=1 source's.
    if (!DecideParam(p, g.decisions[i], g.evidence[i], family_equal[i], p.tp_whole ? 1 : tp_degree, options,
                     resolver_, i, &problems, &d)) {
      continue;
    }
    p.rule = *d.rule;
    p.source = d.source;
    p.origin = d.origin;
    p.autotp_cut = g.autotp_cut[i];
  }
  UCP_RETURN_IF_ERROR(TieAliases(src.dir(), problems.is_ambiguous, &info_));
  if (!problems.tied_mismatch.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(src.dir(), ": params tied across pipeline stages are not equal:\n  ",
                     absl::StrJoin(problems.tied_mismatch, "\n  ")));
  }
  if (!problems.mismatched.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        src.dir(), ": ", problems.mismatched.size(), " replicated param(s) differ between tp ranks (use ",
        "--replicated_mismatch=average or =first to accept):\n", absl::StrJoin(problems.mismatched, "\n")));
  }
  if (!problems.ambiguous.empty()) return AmbiguousError(src, g, problems, resolver_, tp_degree);
  return SetFullShapes(src.dir(), tp_degree, &info_);
}

absl::StatusOr<SuggestReport> SuggestRules(std::shared_ptr<const state::SlicedState> source,
                                           const ResolveOptions& options) {
  const state::SlicedState& src = *source;
  state::ModelInfo info = src.info();
  info.Reindex();
  const int tp_degree = info.source_topology.tp;
  std::vector<std::string> names;
  for (const auto& p : info.params) names.push_back(p.name);
  UCP_ASSIGN_OR_RETURN(RuleResolver resolver,
                       RuleResolver::Make(options.rules, deepspeed::CheckpointInfoOf(src), names, ArgsOf(src, options)));
  UCP_ASSIGN_OR_RETURN(Gathered g, Gather(src, info, resolver, options.num_threads, options.tp1_whole_tensors));
  // What convert would leave open: no rule, and not settled by the fallbacks
  // (DeepSpeed's default for declared patterns, --default_kind); equal
  // copies are listed too (as REPLICATED) when their family's differ.
  const std::vector<bool> family_equal = FamilyCopiesEqual(g.facts);
  std::vector<ParamFacts> facts = g.facts;
  int undecided = 0, by_evidence = 0;
  for (size_t i = 0; i < facts.size(); ++i) {
    // A whole tensor of a tp > 1 source (a MoE expert) is read as it is: no rule to suggest.
    if (info.params[i].tp_whole) facts[i].decided = true;
    if (facts[i].decided) continue;
    RuleDecision d = resolver.DecideWithoutRules(
        info.params[i].name, tp_degree > 1 ? std::optional<bool>(family_equal[i]) : std::nullopt);
    if (d.rule && d.source != EVIDENCE) {
      facts[i].decided = true;
    } else {
      ++undecided;
      by_evidence += d.rule.has_value();
    }
  }
  SuggestReport r;
  const SuggestContext context = ContextOf(src, tp_degree);
  r.suggestions = SuggestFamilies(facts, context, /*include_equal=*/true);
  r.undecided_params = undecided - by_evidence;
  r.replicated_by_evidence = by_evidence;
  std::string preset = resolver.preset().empty() ? "none" : resolver.preset();
  if (resolver.preset_detected()) absl::StrAppend(&preset, " (detected from the names)");
  const std::string header = absl::StrCat(
      "# proto-file: proto/ucp.proto\n# proto-message: ucp.MergeRules\n",
      "# Merge rules suggested by `ucp rules --suggest` for ", src.dir(), "\n",
      "# (tp=", tp_degree, ", hidden_size ",
      context.hidden_size > 0 ? absl::StrCat(context.hidden_size) : std::string("unknown"), ", preset ", preset,
      "): ", undecided, " param(s) no rule file, checkpoint pattern or preset settles, ", by_evidence,
      " of them replicated by the evidence of equal tp copies (listed so the file is complete).\n",
      "# Use: ucp convert --input_folder=", src.dir(), " --rules=THIS_FILE ...\n");
  r.text = SuggestionsAsRulesText(r.suggestions, header);
  return r;
}

absl::StatusOr<TensorPlan> ResolvedState::Full(const ParamState& param, const std::string& state) const {
  const int i = info_.IndexOf(param.name);
  if (i < 0) return absl::NotFoundError(absl::StrCat("no param '", param.name, "'"));
  const ParamState& p = info_.params[i];
  const int stage = p.trainable() && !p.stages.empty() ? p.stages[0] : 0;
  UCP_ASSIGN_OR_RETURN(std::vector<TensorPlan> slices, source_->Slices(source_->info().params[i], stage, state));
  return tp::MergeSlices(p.rule, slices, info_.original_vocab_size, param.name);
}

namespace {

// `model`'s Full(param, state) as a plan opened on its first read: of
// `dtype` and the param's full shape, reading `files` (label: the first),
// so that the merge, its checks and errors are Full's, only later.
TensorPlan DeferredFull(const state::ModelState& model, const ParamState& param, const std::string& state,
                        torch::DType dtype, std::vector<std::string> files) {
  TensorPlan::DeferredSource s;
  s.dtype = dtype;
  s.shape = param.full_shape;
  if (!files.empty()) s.label = files[0];
  s.files = std::move(files);
  s.open = [&model, param, state]() { return model.Full(param, state); };
  return TensorPlan::Deferred(std::move(s));
}

}  // namespace

std::optional<TensorPlan> ResolvedState::FullDeferred(const ParamState& param, const std::string& state) const {
  const int i = info_.IndexOf(param.name);
  if (i < 0) return std::nullopt;
  std::optional<state::SlicedState::WholeFile> file = source_->WholeStateFile(source_->info().params[i], state);
  if (!file) return std::nullopt;
  return DeferredFull(*this, info_.params[i], state, file->dtype, {file->path});
}

namespace {

// Rules equal but for their pattern, shape conditions, comment and vocab
// size: they merge alike.
bool SameRule(MergeRule a, MergeRule b) {
  for (MergeRule* r : {&a, &b}) {
    r->clear_pattern();
    r->clear_comment();
    r->clear_ndim();
    r->clear_dim_size();
    r->clear_original_vocab_size();
    r->clear_autotp_widths();  // how a later write cuts uneven sizes, not how the stored tensor merged
  }
  return a.SerializeAsString() == b.SerializeAsString();
}

// A state that takes another's tensors and changes some params' rules (and
// full shapes): ModelInfo is its own, everything else forwards to `base_`,
// asked with the base's own ParamState of the same index.
class RuleOverlayState : public state::ModelState {
 public:
  explicit RuleOverlayState(std::unique_ptr<state::ModelState> base)
      : base_(std::move(base)), info_(base_->info()) {}

  const state::ModelInfo& info() const override { return info_; }
  absl::StatusOr<state::FileValue> GroupScalar(int group, const std::string& key) const override {
    return base_->GroupScalar(group, key);
  }
  std::vector<state::InputRange> Inputs(const ParamState& param) const override {
    return base_->Inputs(BaseParam(param));
  }
  std::vector<state::InputRange> StateInputs(const ParamState& param, const std::string& state) const override {
    return base_->StateInputs(BaseParam(param), state);
  }
  std::vector<std::string> InputFiles() const override { return base_->InputFiles(); }
  std::optional<state::FileExtent> ExtentOf(const state::InputRange& range) const override {
    return base_->ExtentOf(range);
  }
  absl::Status VerifyInput(const std::string& path) const override { return base_->VerifyInput(path); }
  void SetCheckedInputs(std::shared_ptr<const std::set<std::string>> keys) const override {
    base_->SetCheckedInputs(std::move(keys));
  }
  const state::Facet* GetFacet(state::FacetKey key) const override { return base_->GetFacet(key); }

 protected:
  // FullDeferred of a param this state merges anew (its Full, deferred:
  // DeferredFull) when the base's tensor is deferred: its dtype and the
  // files it touches; nullopt otherwise.
  std::optional<TensorPlan> MergedDeferred(const ParamState& param, const std::string& state) const {
    std::optional<TensorPlan> base = base_->FullDeferred(BaseParam(param), state);
    if (!base) return std::nullopt;
    std::vector<std::string> files;
    for (const TensorPlan::DeferredUse& use : base->DeferredIn(0, base->numel())) {
      for (const std::string& f : use.source->files) {
        if (std::find(files.begin(), files.end(), f) == files.end()) files.push_back(f);
      }
    }
    return DeferredFull(*this, param, state, base->dtype(), std::move(files));
  }

  // The base's ParamState of `param` (by name), or `param` when it has none.
  const ParamState& BaseParam(const ParamState& param) const {
    const int i = info_.IndexOf(param.name);
    return i < 0 ? param : base_->info().params[i];
  }

  std::unique_ptr<state::ModelState> base_;
  state::ModelInfo info_;
};

// A universal checkpoint DeepSpeed wrote, with some params re-merged.
class ReinterpretedState : public RuleOverlayState {
 public:
  explicit ReinterpretedState(std::unique_ptr<state::ModelState> base) : RuleOverlayState(std::move(base)) {
    stored_rule_.assign(info_.params.size(), std::nullopt);
  }

  absl::Status Reinterpret(const pickle::Value& uc_info, const RuleResolver::Options& options,
                           const std::string& dir);
  absl::Status TakeDecisions(const state::ModelInfo& decided, const std::string& dir) {
    UCP_RETURN_IF_ERROR(ApplyDecisions(decided, dir, &info_));
    for (size_t i = 0; i < info_.params.size(); ++i) {
      const MergeRule& stored = base_->info().params[i].rule;
      if (!SameRule(info_.params[i].rule, stored)) stored_rule_[i] = stored;
    }
    info_.Reindex();
    return absl::OkStatus();
  }

  absl::StatusOr<TensorPlan> Full(const ParamState& param, const std::string& state) const override {
    const int i = info_.IndexOf(param.name);
    if (i < 0 || !stored_rule_[i]) return base_->Full(BaseParam(param), state);
    // DeepSpeed's concatenation of the source's tp slices, re-merged.
    const int tp_src = info_.source_topology.tp;
    UCP_ASSIGN_OR_RETURN(TensorPlan stored, base_->Full(BaseParam(param), state));
    std::vector<TensorPlan> slices;
    for (int t = 0; t < tp_src; ++t) {
      UCP_ASSIGN_OR_RETURN(TensorPlan s, tp::SplitFull(*stored_rule_[i], stored, tp_src, t, 0, param.name));
      slices.push_back(std::move(s));
    }
    return tp::MergeSlices(info_.params[i].rule, slices, info_.original_vocab_size, param.name);
  }
  std::optional<TensorPlan> FullDeferred(const ParamState& param, const std::string& state) const override {
    const int i = info_.IndexOf(param.name);
    if (i < 0 || !stored_rule_[i]) return base_->FullDeferred(BaseParam(param), state);
    return MergedDeferred(param, state);  // re-merged: Full opens the stored tensor
  }

 private:
  // Per param: the rule its stored tensor was merged with, when it differs
  // from the rule it is re-merged by (DeepSpeed's pattern-less cat on dim 0).
  std::vector<std::optional<MergeRule>> stored_rule_;
};

absl::Status ReinterpretedState::Reinterpret(const pickle::Value& uc_info, const RuleResolver::Options& options,
                                             const std::string& dir) {
  const int tp_src = info_.source_topology.tp;
  std::vector<std::string> names;
  for (const auto& p : info_.params) names.push_back(p.name);
  UCP_ASSIGN_OR_RETURN(RuleResolver resolver, RuleResolver::Make(options, uc_info, names));
  if (resolver.original_vocab_size() > 0 && info_.original_vocab_size == 0) {
    info_.original_vocab_size = resolver.original_vocab_size();
  }
  std::vector<std::string> states = {state::kFp32State};
  states.insert(states.end(), info_.state_keys.begin(), info_.state_keys.end());
  for (size_t i = 0; i < info_.params.size(); ++i) {
    ParamState& p = info_.params[i];
    // Only DeepSpeed's default for names no pattern matched is suspect.
    if (!p.trainable() || p.rule.kind() != COLUMN) continue;
    const MergeRule stored = p.rule;
    // The tp slice's shape (DeepSpeed concatenated the slices on dim 0).
    auto slice_shape = tp::SliceShapeFromFull(stored, p.full_shape, tp_src, 0, p.name);
    RuleDecision d = resolver.Decide(p.name, slice_shape.ok() ? *slice_shape : p.full_shape);
    if (!d.rule && tp_src > 1) {
      // Evidence: tp equal copies concatenated on dim 0 are a replicated param.
      bool equal = true;
      for (const std::string& state : states) {
        UCP_ASSIGN_OR_RETURN(TensorPlan plan, base_->Full(base_->info().params[i], state));
        auto first = tp::SplitFull(stored, plan, tp_src, 0, 0, p.name);
        if (!first.ok()) {
          equal = false;
          break;
        }
        for (int t = 1; t < tp_src && equal; ++t) {
          UCP_ASSIGN_OR_RETURN(TensorPlan other, tp::SplitFull(stored, plan, tp_src, t, 0, p.name));
          UCP_ASSIGN_OR_RETURN(equal, TensorPlan::BitwiseEqual(*first, other));
        }
        if (!equal) break;
      }
      if (equal) {
        MergeRule r;
        r.set_pattern(p.name);
        r.set_kind(REPLICATED);
        d.rule = r;
        d.source = EVIDENCE;
        d.origin = absl::StrCat("DeepSpeed stored ", tp_src, " bitwise equal tp copies concatenated on dim 0");
      }
    }
    if (d.rule && d.rule->kind() == REPLICATED && d.source != EVIDENCE && tp_src > 1) {
      // A rule says replicated: the tp copies DeepSpeed concatenated must agree.
      for (const std::string& state : states) {
        const std::string path = absl::StrCat(dir, "/zero/", p.name, "/", state, ".pt");
        UCP_ASSIGN_OR_RETURN(TensorPlan plan, base_->Full(base_->info().params[i], state));
        UCP_ASSIGN_OR_RETURN(TensorPlan first, tp::SplitFull(stored, plan, tp_src, 0, 0, p.name),
                             _.Prepend(absl::StrCat(path, ": ")));
        for (int t = 1; t < tp_src; ++t) {
          UCP_ASSIGN_OR_RETURN(TensorPlan other, tp::SplitFull(stored, plan, tp_src, t, 0, p.name));
          UCP_ASSIGN_OR_RETURN(bool equal, TensorPlan::BitwiseEqual(first, other));
          if (!equal) {
            return absl::FailedPreconditionError(absl::StrCat(
                path, ": param '", p.name, "' is replicated (", d.origin, ") but the ", tp_src,
                " tp copies DeepSpeed concatenated on dim 0 differ in ", state));
          }
        }
      }
    }
    if (!d.rule || SameRule(*d.rule, stored)) {
      if (d.rule) {
        p.source = d.source;
        p.origin = d.origin;
        p.rule.set_autotp_widths(d.rule->autotp_widths());
      }
      continue;
    }
    UCP_ASSIGN_OR_RETURN(std::vector<int64_t> slice, tp::SliceShapeFromFull(stored, p.full_shape, tp_src, 0, p.name),
                         _.Prepend(absl::StrCat(dir, ": ")));
    UCP_ASSIGN_OR_RETURN(std::vector<int64_t> full, tp::FullShapeFromSlice(*d.rule, slice, tp_src, p.name),
                         _.Prepend(absl::StrCat(dir, ": ")));
    if (d.rule->kind() == VOCAB) {
      const int64_t v = d.rule->original_vocab_size() > 0 ? d.rule->original_vocab_size() : info_.original_vocab_size;
      if (v > 0 && v <= full[0]) full[0] = v;
      d.rule->set_original_vocab_size(v > 0 ? v : full[0]);
    }
    stored_rule_[i] = stored;
    p.rule = *d.rule;
    p.full_shape = full;
    p.source = d.source;
    p.origin = absl::StrCat(d.origin, "; re-merged from DeepSpeed's ", tp::DescribeRule(stored), " of the tp=", tp_src,
                            " slices");
  }
  info_.Reindex();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<state::ModelState>> ReinterpretDeepSpeedUniversal(
    std::unique_ptr<state::ModelState> universal, const pickle::Value& uc_info,
    const RuleResolver::Options& options, const std::string& dir, const state::ModelInfo* decided) {
  auto s = std::make_unique<ReinterpretedState>(std::move(universal));
  if (decided != nullptr) {
    UCP_RETURN_IF_ERROR(s->TakeDecisions(*decided, dir));
  } else {
    UCP_RETURN_IF_ERROR(s->Reinterpret(uc_info, options, dir));
  }
  return std::unique_ptr<state::ModelState>(std::move(s));
}

namespace {

// A state whose undecided params took a rule (DecideUndecided): their whole
// tensor is read as the one tp slice of a tp=1 checkpoint and merged by it.
class WholeDecidedState : public RuleOverlayState {
 public:
  explicit WholeDecidedState(std::unique_ptr<state::ModelState> base)
      : RuleOverlayState(std::move(base)), decided_(info_.params.size(), false) {}

  absl::Status Decide(const RuleResolver::Options& options, const std::string& dir, int target_tp);

  absl::StatusOr<TensorPlan> Full(const ParamState& param, const std::string& state) const override {
    const int i = info_.IndexOf(param.name);
    if (i < 0 || !decided_[i]) return base_->Full(BaseParam(param), state);
    UCP_ASSIGN_OR_RETURN(TensorPlan whole, base_->Full(BaseParam(param), state));
    std::vector<TensorPlan> one;
    one.push_back(std::move(whole));
    return tp::MergeSlices(info_.params[i].rule, one, info_.original_vocab_size, param.name);
  }
  std::optional<TensorPlan> FullDeferred(const ParamState& param, const std::string& state) const override {
    const int i = info_.IndexOf(param.name);
    if (i < 0 || !decided_[i]) return base_->FullDeferred(BaseParam(param), state);
    return MergedDeferred(param, state);  // merged by its new rule: Full opens it
  }

 private:
  std::vector<bool> decided_;
};

absl::Status WholeDecidedState::Decide(const RuleResolver::Options& options, const std::string& dir,
                                       int target_tp) {
  std::vector<std::string> names;
  for (const auto& p : info_.params) names.push_back(p.name);
  UCP_ASSIGN_OR_RETURN(RuleResolver resolver, RuleResolver::Make(options, *Value::None(), names));
  if (info_.original_vocab_size == 0) info_.original_vocab_size = resolver.original_vocab_size();
  std::vector<ParamFacts> facts;
  std::vector<std::string> open;
  for (size_t i = 0; i < info_.params.size(); ++i) {
    ParamState& p = info_.params[i];
    ParamFacts f;
    f.name = p.name;
    f.slice_shape = p.full_shape;
    // A whole tensor no tp rank splits (a MoE expert, ParamState::tp_whole)
    // stays whole at any tp: nothing to decide.
    f.decided = p.source != UNDECIDED || p.tp_whole;
    if (!f.decided) {
      RuleDecision d = resolver.Decide(p.name, p.full_shape);
      if (!d.rule) d = resolver.DecideWithoutRules(p.name, std::nullopt);
      if (!d.rule) {
        open.push_back(p.name);
      } else {
        UCP_ASSIGN_OR_RETURN(std::vector<int64_t> full, tp::FullShapeFromSlice(*d.rule, p.full_shape, 1, p.name),
                             _.Prepend(absl::StrCat(dir, ": ")));
        if (d.rule->kind() == VOCAB) {
          const int64_t v =
              d.rule->original_vocab_size() > 0 ? d.rule->original_vocab_size() : info_.original_vocab_size;
          if (v > full[0]) {
            return absl::InvalidArgumentError(absl::StrCat(dir, ": param '", p.name, "': original vocab size ", v,
                                                           " exceeds its ", full[0], " rows"));
          }
          if (v > 0) full[0] = v;
        }
        p.rule = *d.rule;
        p.full_shape = full;
        p.source = d.source;
        p.origin = absl::StrCat(d.origin, " (a whole tensor of the tp=1 source)");
        decided_[i] = true;
        f.decided = true;
      }
    }
    facts.push_back(std::move(f));
  }
  info_.Reindex();
  if (open.empty()) return absl::OkStatus();
  const std::vector<FamilySuggestion> suggestions = SuggestFamilies(facts, SuggestContext());
  std::string listed;
  for (const FamilySuggestion& f : suggestions) absl::StrAppend(&listed, "\n", SuggestionText(f));
  return absl::FailedPreconditionError(absl::StrCat(
      dir, ": target tp=", target_tp, " splits params over tp ranks, but ", open.size(), " param(s) in ",
      suggestions.size(), " famil", suggestions.size() == 1 ? "y" : "ies",
      " have no known tp split (e.g. '", open.front(), "'): the checkpoint was saved at tp=1 and nothing it holds "
      "says how they split. Settle them with --rules=FILE (a MergeRules textproto: the rules below, filled in), "
      "--preset, or --default_kind. The undecided families:\n", listed));
}

}  // namespace

absl::StatusOr<std::unique_ptr<state::ModelState>> DecideUndecided(std::unique_ptr<state::ModelState> state,
                                                                   const RuleResolver::Options& options,
                                                                   const std::string& dir, int target_tp) {
  bool any = false;
  for (const auto& p : state->info().params) any |= p.source == UNDECIDED && !p.tp_whole;
  if (!any) return state;
  auto s = std::make_unique<WholeDecidedState>(std::move(state));
  UCP_RETURN_IF_ERROR(s->Decide(options, dir, target_tp));
  return std::unique_ptr<state::ModelState>(std::move(s));
}

}  // namespace ucp::rules
