#include "ops/convert.h"

#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/fs.h"
#include "base/leftovers.h"
#include "base/status_macros.h"
#include "deepspeed/facet.h"
#include "deepspeed/layout_math.h"
#include "format/torch/mapped_file.h"
#include "formats/builtin/builtin.h"
#include "formats/format.h"
#include "ops/export.h"
#include "ops/model_folder.h"
#include "ops/trainer_folder.h"
#include "tp/merge.h"

namespace ucp::ops {

namespace {

// The kind a summary shows: an undecided param is kept whole (and written as
// a replicated one), but no rule says it is replicated.
std::string ShownKind(const state::ParamState& p) {
  return p.source == UNDECIDED ? "whole" : tp::MergeKindName(p.rule.kind());
}

}  // namespace

std::string RuleSummary(const state::ModelInfo& info) {
  std::map<std::pair<std::string, std::string>, int> counts;
  std::map<std::string, int> by_source;
  for (const auto& p : info.params) {
    counts[{ShownKind(p), rules::RuleSourceName(p.source)}]++;
    by_source[rules::RuleSourceName(p.source)]++;
  }
  std::string out = absl::StrFormat("%-12s %-20s %s\n", "kind", "source", "params");
  for (const auto& [key, n] : counts) absl::StrAppendFormat(&out, "%-12s %-20s %d\n", key.first, key.second, n);
  std::vector<std::string> parts;
  for (const auto& [s, n] : by_source) parts.push_back(absl::StrCat(n, " from ", s));
  absl::StrAppend(&out, "total: ", info.params.size(), " params (", absl::StrJoin(parts, ", "), ")\n");
  return out;
}

std::string RuleExplanation(const state::ModelInfo& info) {
  std::string out;
  for (const auto& p : info.params) {
    absl::StrAppendFormat(&out, "%s %s %s [%s] %s: %s\n", p.name, torch::ShapeString(p.full_shape),
                          p.source == UNDECIDED ? "kept whole, tp split unknown" : tp::DescribeRule(p.rule),
                          rules::RuleSourceName(p.source),
                          p.trainable() ? absl::StrCat("group ", p.group) : state::TensorRoleName(p.role),
                          p.origin);
  }
  return out;
}

namespace {

// The target `convert` writes: the registry's format of family kUniversal
// named `to` ("" or "universal": DeepSpeed's universal checkpoint).
absl::StatusOr<const formats::TargetFormat*> UniversalTarget(const std::string& to) {
  const std::string name = to.empty() || to == "universal" ? "deepspeed_universal" : to;
  std::vector<std::string> known;
  for (const auto& t : formats::builtin::Formats().targets()) {
    if (t->family() != formats::TargetFamily::kUniversal) continue;
    if (t->name() == name) return t.get();
    known.push_back(t->name() == "deepspeed_universal" ? "universal" : std::string(t->name()));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--to=", to, ": expected one of ", absl::StrJoin(known, ", ")));
}

absl::StatusOr<ConvertResult> ConvertImpl(const ConvertOptions& options, Leftovers* left);

// Rules of a --rules file that settle nothing are likely typos: an error
// under --strict, else a warning.
absl::Status CheckRulesFileUsed(const ConvertOptions& options, const state::ModelInfo& info,
                                std::vector<std::string>* warnings) {
  if (options.state.rules.rules_file.empty()) return absl::OkStatus();
  UCP_ASSIGN_OR_RETURN(MergeRules file_rules, rules::ReadRulesFile(options.state.rules.rules_file));
  UCP_ASSIGN_OR_RETURN(rules::RuleSet set, rules::RuleSet::Compile(file_rules, RULE_FILE, options.state.rules.rules_file));
  std::vector<bool> used(file_rules.rule_size(), false);
  for (const auto& p : info.params) {
    const int i = set.MatchIndex(p.name, p.tp_shapes.empty() ? p.full_shape : p.tp_shapes[0]);
    if (i >= 0) used[i] = true;
  }
  std::vector<std::string> unused;
  for (int i = 0; i < file_rules.rule_size(); ++i) {
    if (!used[i]) unused.push_back(absl::StrCat("'", file_rules.rule(i).pattern(), "'"));
  }
  if (unused.empty()) return absl::OkStatus();
  const std::string msg = absl::StrCat(options.state.rules.rules_file, ": rules matching no param: ",
                                       absl::StrJoin(unused, ", "));
  if (options.strict) return absl::InvalidArgumentError(absl::StrCat(msg, " (--no_strict to accept)"));
  warnings->push_back(msg);
  return absl::OkStatus();
}

// --to=dcp --names=hf: each DCP entry a Hugging Face tensor, rows of one
// param (rules::PlanHfNames, the plan `ucp export --names=hf` writes), whose
// optimizer states are the same rows of the param's. A tensor the model holds
// scaled (GPT-NeoX's gpt_j_residual biases, tp x the stored value) has no
// such optimizer state: refused.
absl::StatusOr<std::vector<writers::UniversalWriteOptions::RenamedTensor>> HfRenamed(
    const state::ModelState& state, const std::string& dir, const ConvertOptions& options,
    std::vector<std::string>* notes) {
  const state::ModelInfo& info = state.info();
  UCP_ASSIGN_OR_RETURN(formats::HfFolder folder, formats::HfFolderOf(dir));
  rules::HfOptions hf = WithCheckpointConfig(options.hf, folder);
  if (hf.preset.empty()) hf.preset = options.state.rules.preset;
  std::vector<int> order;
  for (size_t i = 0; i < info.params.size(); ++i) {
    if (info.params[i].role != state::TensorRole::kTied) order.push_back(static_cast<int>(i));
  }
  UCP_ASSIGN_OR_RETURN(rules::HfNamePlan plan, rules::PlanHfNames(info, order, deepspeed::ArgsOf(state), hf));
  std::vector<writers::UniversalWriteOptions::RenamedTensor> out;
  std::set<int> covered;
  for (const rules::HfTensor& t : plan.tensors) {
    const state::ParamState& p = info.params[static_cast<size_t>(t.param)];
    if (t.scale != 1) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--names=hf: ", plan.architecture, "'s '", t.name, "' is ", t.scale, " x the checkpoint's '", p.name,
          "' (its tp copies are added in the model), so the optimizer state of the Hugging Face tensor is not the "
          "checkpoint's: write the checkpoint's names (--names=checkpoint), or export the weights with `ucp export "
          "--names=hf`"));
    }
    covered.insert(t.param);
    out.push_back({t.name, t.param, t.groups, t.start, t.length, t.shape});
  }
  for (size_t i = 0; i < info.params.size(); ++i) {
    const state::ParamState& p = info.params[i];
    if (p.trainable() && !covered.count(static_cast<int>(i))) {
      notes->push_back(absl::StrCat("--names=hf: trained param '", p.name, "' has no ", plan.architecture,
                                    " counterpart: not written, nor its optimizer state"));
    }
  }
  notes->push_back(absl::StrCat("--names=hf: ", out.size(), " tensors under ", plan.architecture,
                                "'s names (preset ", plan.preset, ")"));
  return out;
}

}  // namespace

std::string UndecidedNote(const state::ModelInfo& info) {
  std::vector<std::string> names;
  for (const auto& p : info.params) {
    if (p.source == UNDECIDED) names.push_back(p.name);
  }
  if (names.empty()) return "";
  return absl::StrCat(
      names.size(), " param(s) of this tp=1 checkpoint (e.g. '", names.front(),
      "') have no known tp split: kept whole and recorded as undecided in the manifest. The universal checkpoint "
      "loads exactly at tp=1, any dp and pp; a DeepSpeed universal load at tp > 1 would split them on dim 0 (its "
      "default), right for column-parallel params only. For tp > 1: `ucp reshard --tp=N` with --rules or --preset "
      "(`ucp rules --suggest` lists them), or convert again with those flags");
}

absl::StatusOr<ConvertResult> Convert(const ConvertOptions& options) {
  Leftovers left;
  return RunCheckingInputs<ConvertResult>(options.cluster, /*dry_run=*/options.dry_run_ranks > 0,
                                         [&] { return ConvertImpl(options, &left); });
}

namespace {
absl::StatusOr<ConvertResult> ConvertImpl(const ConvertOptions& options, Leftovers* left) {
  if (options.output_folder.empty() && options.dry_run_ranks == 0) {
    return absl::InvalidArgumentError("--output_folder is empty");
  }
  if (options.input_folder.empty()) return absl::InvalidArgumentError("--input_folder is empty");
  if (options.state.num_threads < 0 || options.write.num_threads < 0) {
    return absl::InvalidArgumentError("--num_threads: expected >= 0 (0 = all cores)");
  }
  if (options.state.make_vocab_size_divisible_by < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--make_vocab_size_divisible_by=",
                                                   options.state.make_vocab_size_divisible_by, ": expected >= 0"));
  }
  if (options.dry_run_ranks < 0) return absl::InvalidArgumentError("--dry_run: expected >= 0");
  UCP_ASSIGN_OR_RETURN(const formats::TargetFormat* target, UniversalTarget(options.to));
  if (options.names != "checkpoint" && options.names != "hf") {
    return absl::InvalidArgumentError(absl::StrCat("--names must be checkpoint or hf, not '", options.names, "'"));
  }
  if (options.names == "hf" && target->name() != "dcp") {
    return absl::InvalidArgumentError(
        "--names=hf: only with --to=dcp (DeepSpeed's universal checkpoint keeps the checkpoint's names; `ucp "
        "export --names=hf` writes the weights under Hugging Face names)");
  }
  OpenRequest request;
  request.refuse_format = std::string(target->name());
  // A universal checkpoint keeps the params of a tp=1 source whole: params
  // that nothing decides are recorded as undecided, not refused (only a step
  // that splits them over tp > 1 needs their kind).
  SourceOptions source = options.state;
  source.tp1_whole_tensors = true;
  UCP_ASSIGN_OR_RETURN(OpenedSource src, OpenSource(options.input_folder, source, options.cluster, request));
  const state::ModelState* state = src.state.get();
  if (state->info().expert_parallel > 0 && target->name() != "dcp") {
    // A DCP folder holds every expert under its global name, as a model with
    // all experts local names them. DeepSpeed's universal loaders partition every param over dp; none
    // places experts by expert parallel rank (and ds_to_universal.py 0.19.5
    // fails on these checkpoints).
    return absl::FailedPreconditionError(absl::StrCat(
        src.dir, ": DeepSpeed ", deepspeed::SourceDsVersion(*state),
        " native mixture-of-experts checkpoint (ZeRO stage ", state->info().zero_stage, ", ep=",
        state->info().expert_parallel, "): no DeepSpeed universal loader places native MoE experts by expert "
        "parallel rank (every ep rank would read its local expert ids; 0.19.5's EP slicing is for AutoEP's fused "
        "expert tensors), so ucp does not write one; use `ucp reshard --dp=N [--expert_parallel=E]` to write the ZeRO checkpoint of the "
        "new job directly (`--to=dcp` writes a PyTorch Distributed Checkpoint of it)"));
  }
  ConvertResult result;
  UCP_RETURN_IF_ERROR(CheckRulesFileUsed(options, state->info(), &result.warnings));
  writers::UniversalWriteOptions write = options.write;
  write.source_folder = src.dir;
  write.inputs = {src.dir};
  write.rules = src.effective_rules;
  if (options.names == "hf") {
    UCP_ASSIGN_OR_RETURN(write.renamed, HfRenamed(*state, src.dir, options, &result.warnings));
  }
  absl::StatusOr<std::unique_ptr<writers::Plan>> plan = target->PlanUniversal(*state, write);
  if (options.cluster != nullptr) UCP_RETURN_IF_ERROR(AgreeOnStatus(*options.cluster, plan.status()));
  UCP_RETURN_IF_ERROR(plan.status());
  if (options.dry_run_ranks > 0) {
    result.plan = writers::DescribePlan(**plan, options.cluster ? options.cluster->size() : options.dry_run_ranks,
                                        options.dry_run_units);
    result.summary = RuleSummary(state->info());
    return result;
  }
  writers::RunOptions run = writers::UniversalRunOptions(write);
  UCP_ASSIGN_OR_RETURN(std::string trainer_dir, TrainerFolderInput(options.input_folder, src.dir));
  if (!trainer_dir.empty() && target->name() != "deepspeed_universal") {
    return absl::InvalidArgumentError(absl::StrCat(
        options.input_folder, " is a Hugging Face Trainer checkpoint folder, which --to=", options.to,
        " does not write: convert its ", Basename(src.dir), " folder"));
  }
  if (!trainer_dir.empty()) {
    // A Trainer's checkpoint-N: a new checkpoint-N holding the universal
    // folder, latest_universal and the Trainer's files, which the Trainer
    // resumes with "checkpoint": {"load_universal": true} at any topology.
    if (options.cluster != nullptr && options.cluster->size() > 1) {
      return absl::UnimplementedError(absl::StrCat(
          options.input_folder, " is a Hugging Face Trainer checkpoint folder: under mpirun convert its ",
          Basename(src.dir), " folder (the Trainer's files are then not written), or run without mpirun"));
    }
    const std::string tag = Basename(src.dir);
    UCP_ASSIGN_OR_RETURN(result.stats,
                         WriteTrainerFolder(**plan, run, options.output_folder, absl::StrCat(tag, "_universal"),
                                            trainer_dir, {tag, "latest"}, /*world_size=*/0,
                                            source.allow_unsafe_pickles, &result.trainer_files));
    result.trainer_folder = options.output_folder;
  } else {
    // A universal folder gets the model's config.json beside it, as reshard
    // does (ops/model_folder.h).
    std::string model_dir;
    if (target->name() == "deepspeed_universal") {
      UCP_ASSIGN_OR_RETURN(model_dir, ModelFilesSource(std::string(src.format->kind()), src.dir));
    }
    UCP_ASSIGN_OR_RETURN(result.stats,
                         RunPlanWithModelFiles(**plan, options.output_folder, run, options.cluster, model_dir));
  }
  result.summary = RuleSummary(state->info());
  if (!src.preset.empty()) {
    result.summary = absl::StrCat("preset: ", src.preset, src.preset_detected ? " (detected from param names)" : "",
                                  "\n", result.summary);
  }
  result.explain = RuleExplanation(state->info());
  if (std::string note = UndecidedNote(state->info()); !note.empty()) result.warnings.push_back(std::move(note));
  for (const auto& note : state->info().notes) result.warnings.push_back(note);
  for (const auto& note : result.stats.notes) result.warnings.push_back(note);
  for (std::string& note : target->UniversalNotes(*state, write)) result.warnings.push_back(std::move(note));
  for (std::string& note : TpSummedNotes(*state, src.preset, /*target_tp=*/0)) result.warnings.push_back(std::move(note));
  left->Keep(std::move(src.state));
  left->Keep(*std::move(plan));
  return result;
}

}  // namespace

}  // namespace ucp::ops
