#include "ops/convert.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
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

absl::StatusOr<ConvertResult> Convert(const ConvertOptions& options) {
  UCP_ASSIGN_OR_RETURN(OpenedSource src, OpenSource(options.input_folder, options.state, /*verify_checksums=*/false,
                                                    /*zero_only=*/true, options.cluster));
  const deepspeed::ModelState* state = src.state.get();
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
  return result;
}

}  // namespace ucp::ops
