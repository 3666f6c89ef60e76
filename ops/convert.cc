#include "ops/convert.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "deepspeed/layout_math.h"
#include "format/torch/mapped_file.h"
#include "tp/merge.h"

namespace ucp::ops {

std::string RuleSummary(const deepspeed::ModelInfo& info) {
  std::map<std::pair<std::string, std::string>, int> counts;
  std::map<std::string, int> by_source;
  for (const auto& p : info.params) {
    counts[{tp::MergeKindName(p.rule.kind()), rules::RuleSourceName(p.source)}]++;
    by_source[rules::RuleSourceName(p.source)]++;
  }
  std::string out = absl::StrFormat("%-12s %-20s %s\n", "kind", "source", "params");
  for (const auto& [key, n] : counts) absl::StrAppendFormat(&out, "%-12s %-20s %d\n", key.first, key.second, n);
  std::vector<std::string> parts;
  for (const auto& [s, n] : by_source) parts.push_back(absl::StrCat(n, " from ", s));
  absl::StrAppend(&out, "total: ", info.params.size(), " params (", absl::StrJoin(parts, ", "), ")\n");
  return out;
}

std::string RuleExplanation(const deepspeed::ModelInfo& info) {
  std::string out;
  for (const auto& p : info.params) {
    absl::StrAppendFormat(&out, "%s %s %s [%s] %s: %s\n", p.name, torch::ShapeString(p.full_shape),
                          tp::DescribeRule(p.rule), rules::RuleSourceName(p.source),
                          p.trainable() ? absl::StrCat("group ", p.group) : deepspeed::TensorRoleName(p.role),
                          p.origin);
  }
  return out;
}

namespace {
absl::StatusOr<ConvertResult> ConvertImpl(const ConvertOptions& options);
}  // namespace

absl::StatusOr<ConvertResult> Convert(const ConvertOptions& options) {
  absl::StatusOr<ConvertResult> r = ConvertImpl(options);
  // An input truncated while it was read (zeros instead of its bytes, a
  // failed read) is the error to report, not what it caused.
  if (!r.ok()) UCP_RETURN_IF_ERROR(torch::MappedFile::CheckAllIntact());
  return r;
}

namespace {
absl::StatusOr<ConvertResult> ConvertImpl(const ConvertOptions& options) {
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
  UCP_ASSIGN_OR_RETURN(OpenedSource src, OpenSource(options.input_folder, options.state, /*verify_checksums=*/false,
                                                    /*zero_only=*/true, options.cluster));
  const deepspeed::ModelState* state = src.state.get();
  if (state->info().expert_parallel > 0) {
    // DeepSpeed's universal loaders partition every param over dp; none
    // places experts by expert parallel rank (and ds_to_universal.py 0.19.5
    // fails on these checkpoints).
    return absl::FailedPreconditionError(absl::StrCat(
        src.dir, ": DeepSpeed ", deepspeed::SourceDsVersion(*state),
        " native mixture-of-experts checkpoint (ZeRO stage ", state->info().zero_stage, ", ep=",
        state->info().expert_parallel, "): no DeepSpeed universal loader places native MoE experts by expert "
        "parallel rank (every ep rank would read its local expert ids; 0.19.5's EP slicing is for AutoEP's fused "
        "expert tensors), so ucp does not write one; use `ucp reshard --dp=N [--expert_parallel=E]` to write the ZeRO checkpoint of the "
        "new job directly"));
  }
  ConvertResult result;
  // Rules of a --rules file that settle nothing are likely typos.
  if (!options.state.rules.rules_file.empty()) {
    UCP_ASSIGN_OR_RETURN(MergeRules file_rules, rules::ReadRulesFile(options.state.rules.rules_file));
    UCP_ASSIGN_OR_RETURN(rules::RuleSet set, rules::RuleSet::Compile(file_rules, RULE_FILE, options.state.rules.rules_file));
    std::vector<bool> used(file_rules.rule_size(), false);
    for (const auto& p : state->info().params) {
      const int i = set.MatchIndex(p.name, p.tp_shapes.empty() ? p.full_shape : p.tp_shapes[0]);
      if (i >= 0) used[i] = true;
    }
    std::vector<std::string> unused;
    for (int i = 0; i < file_rules.rule_size(); ++i) {
      if (!used[i]) unused.push_back(absl::StrCat("'", file_rules.rule(i).pattern(), "'"));
    }
    if (!unused.empty()) {
      const std::string msg = absl::StrCat(options.state.rules.rules_file, ": rules matching no param: ",
                                           absl::StrJoin(unused, ", "));
      if (options.strict) return absl::InvalidArgumentError(absl::StrCat(msg, " (--no_strict to accept)"));
      result.warnings.push_back(msg);
    }
  }
  writers::UniversalWriteOptions write = options.write;
  write.source_folder = src.dir;
  write.inputs = {src.dir};
  write.rules = src.effective_rules;
  absl::StatusOr<std::unique_ptr<writers::Plan>> plan = writers::PlanUniversal(*state, write);
  if (options.cluster != nullptr) UCP_RETURN_IF_ERROR(AgreeOnStatus(*options.cluster, plan.status()));
  UCP_RETURN_IF_ERROR(plan.status());
  if (options.dry_run_ranks > 0) {
    result.plan = writers::DescribePlan(**plan, options.cluster ? options.cluster->size() : options.dry_run_ranks,
                                        options.dry_run_units);
    result.summary = RuleSummary(state->info());
    return result;
  }
  writers::RunOptions run = writers::UniversalRunOptions(write);
  UCP_ASSIGN_OR_RETURN(result.stats, options.cluster != nullptr
                                         ? writers::RunPlanOnCluster(**plan, options.output_folder, run, *options.cluster)
                                         : writers::RunPlan(**plan, options.output_folder, run));
  result.summary = RuleSummary(state->info());
  if (!src.preset.empty()) {
    result.summary = absl::StrCat("preset: ", src.preset, src.preset_detected ? " (detected from param names)" : "",
                                  "\n", result.summary);
  }
  result.explain = RuleExplanation(state->info());
  for (const auto& note : state->info().notes) result.warnings.push_back(note);
  for (const auto& note : result.stats.notes) result.warnings.push_back(note);
  const deepspeed::ModelInfo& info = state->info();
  if (writers::PlainModuleAtTpAboveOne(info) && !write.single_mp_rank_file) {
    result.warnings.push_back(absl::StrCat(
        "a plain (non-pipeline) module at tp=", info.source_topology.tp, ": the folder keeps its ",
        info.source_topology.tp, " mp_rank files, which DeepSpeed (0.12 to 0.19.5) universal-loads only at tp >= ",
        info.source_topology.tp, " (for a smaller tp its loader merges them by Megatron's key names and asserts "
        "they exist); for a smaller tp, convert without --single_mp_rank_file=false or `ucp reshard` to the target"));
  }
  if (info.zero_stage == 3) {
    // The files are DeepSpeed's own layout (ds_to_universal.py writes the
    // same); the drift comes from DeepSpeed's stage-3 universal loader, seen
    // in the lab with 0.18.9 and 0.19.5 (lab runs of issue 15).
    const std::string version = writers::UniversalLoaderVersion(*state, write);
    auto v = deepspeed::ParseDsVersion(version);
    if (v.ok() && !(*v < deepspeed::DsVersion{0, 18, 0})) {
      result.warnings.push_back(absl::StrCat(
          "ZeRO stage 3: DeepSpeed ", version, "'s stage-3 universal loader (0.18.0 to 0.19.5) gives every sub-group "
          "of the loading job one shared `step` tensor",
          info.num_groups > 1 ? absl::StrCat(" and all ", info.num_groups,
                                             " param groups group 0's hyper-parameters (lr, weight_decay, ...)")
                              : "",
          ", so a resumed run drifts; `ucp reshard --dp=N --sub_group_size=S` writes a ZeRO-3 checkpoint for the "
          "new topology that keeps every sub-group's step and each group's own hyper-parameters"));
    }
  }
  return result;
}

}  // namespace

}  // namespace ucp::ops
