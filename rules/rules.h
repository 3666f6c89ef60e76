// Deciding, per parameter, how its tp slices merge.
//
// Sources, in order; within a source the first matching rule wins:
//   1. RULE_FILE        --rules=FILE (a MergeRules textproto)
//   2. CHECKPOINT_INFO  the checkpoint's `universal_checkpoint_info` patterns,
//                       in DeepSpeed's precedence (replicated, average,
//                       2 sub-params, sub-param shapes, vocab, row)
//   3. PRESET           --preset, or the preset detected from the names
//                       (presets.h: rules/presets/*.textproto), with the
//                       rules the checkpoint's args switch on
//   4. CHECKPOINT_INFO  when the checkpoint declares DeepSpeed's pattern lists
//                       (even empty ones), DeepSpeed's default for an
//                       unmatched name (cat on dim 0), as
//                       ds_to_universal.py:merge_tp_slices does
//   5. EVIDENCE         tp copies bitwise equal in fp32, exp_avg and
//                       exp_avg_sq -> replicated (for checkpoints that declare
//                       nothing, e.g. GPT-NeoX's {}), unless a param of the
//                       same family (rules/suggest.h) has copies that differ
// A param no source settles is ambiguous: the conversion stops with their
// count and one suggested rule per family (rules/suggest.h).
//
// Patterns use Python `re.match` semantics (anchored at the start only), as
// DeepSpeed applies them. A rule may also require the param's rank and the
// size of a dim it does not split (MergeRule.ndim, dim_size), tested on the
// tp slice's shape (equal to the full tensor's there), so that one list can
// tell apart params whose names clash.
#ifndef UCP_RULES_RULES_H_
#define UCP_RULES_RULES_H_

#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/status/statusor.h"
#include "format/pickle/value.h"
#include "proto/ucp.pb.h"

namespace ucp::rules {

// A MergeRules list with compiled patterns.
class RuleSet {
 public:
  static absl::StatusOr<RuleSet> Compile(const MergeRules& rules, RuleSource source, std::string origin_label);
  // The first rule whose pattern matches `name` at its start and whose shape
  // conditions (MergeRule.ndim, dim_size) `shape` meets, or null. `shape` may
  // be a tp slice's or the full tensor's: the conditions hold for both alike.
  const MergeRule* Match(absl::string_view name, const std::vector<int64_t>& shape) const;
  // Index of the matching rule, -1 if none.
  int MatchIndex(absl::string_view name, const std::vector<int64_t>& shape) const;
  // The same on the name alone, shape conditions ignored (preset detection:
  // which rules a name could use).
  int MatchNameIndex(absl::string_view name) const;
  const MergeRule* MatchName(absl::string_view name) const;
  const MergeRules& rules() const { return rules_; }
  RuleSource source() const { return source_; }
  const std::string& label() const { return label_; }
  bool empty() const { return rules_.rule_size() == 0; }

 private:
  MergeRules rules_;
  RuleSource source_ = RULE_SOURCE_UNSPECIFIED;
  std::string label_;
  std::vector<std::shared_ptr<const std::regex>> compiled_;
  std::vector<std::string> literals_;  // RequiredLiteral of each pattern: names without it are not searched
};

// Text every match of the ECMAScript `pattern` contains, or "" when none is
// certain: its longest run of literal characters outside groups, classes
// and quantified atoms, in a pattern with no alternation outside groups
// (".*\\.attention\\.dense\\.(weight|bias)$" -> ".attention.dense.").
// RuleSet looks for it before running the pattern: std::regex backtracks
// through every ".*" prefix (preset detection runs 126 patterns on every
// name of a checkpoint).
std::string RequiredLiteral(absl::string_view pattern);

// Whether `shape` meets a rule's shape conditions (ndim, dim_size).
bool ShapeConditionsHold(const MergeRule& rule, const std::vector<int64_t>& shape);
// "ndim 3, dim 1 = 16" (empty without conditions), for messages.
std::string DescribeShapeConditions(const MergeRule& rule);

// The pattern that matches `name` and every name that differs from it only
// in its layer indices (whole dotted components of digits become \d+):
// "sequential.3.mlp.w1.weight" -> "sequential\.\d+\.mlp\.w1\.weight$".
std::string GeneralizedPattern(const std::string& name);
// The pattern that matches exactly `name` (Python re.match semantics).
std::string ExactPattern(const std::string& name);

// Reads a MergeRules textproto (kInvalidArgument with the parser's message).
absl::StatusOr<MergeRules> ReadRulesFile(const std::string& path);
absl::StatusOr<MergeRules> ParseRulesText(const std::string& text, const std::string& name);

// DeepSpeed's universal_checkpoint_info patterns as rules, in the precedence
// of merge_tp_slices. `has_patterns` tells whether the dict declares any
// pattern list (an empty list counts: it declares no param of that kind).
struct CheckpointInfoRules {
  MergeRules rules;
  bool has_patterns = false;
  std::vector<std::string> pipeline_replicated;  // tied params, informational
};
absl::StatusOr<CheckpointInfoRules> RulesFromCheckpointInfo(const pickle::Value& uc_info);

// The decision for one param.
struct RuleDecision {
  std::optional<MergeRule> rule;  // unset: needs evidence or is ambiguous
  RuleSource source = RULE_SOURCE_UNSPECIFIED;
  std::string origin;
};

// The resolver: sources 1-3 (and 5 as a fallback), evidence supplied by the caller.
class RuleResolver {
 public:
  struct Options {
    std::string rules_file;  // --rules
    std::string preset;      // --preset ("" = detect, kNoPreset = no preset)
    // Used when nothing else decides (--default_kind); UNSPECIFIED = error.
    MergeKind default_kind = MERGE_KIND_UNSPECIFIED;
    int64_t original_vocab_size = 0;  // 0 = from the checkpoint info if any
    // The `model_type` of the checkpoint's config.json (a Hugging Face
    // Trainer's checkpoint-N folder holds one), "" = none: preset detection
    // takes it into account (DetectPreset).
    std::string hf_model_type;
  };
  // `uc_info`: the checkpoint's universal_checkpoint_info; `names`: every
  // param (for preset detection); `args`: the training's args (a dict), for
  // the preset's argument-conditional rules.
  static absl::StatusOr<RuleResolver> Make(const Options& options, const pickle::Value& uc_info,
                                           const std::vector<std::string>& names,
                                           const pickle::Value* args = nullptr);

  // Sources 1-3 only, for a param of shape `shape` (a tp slice's or the full
  // tensor's; rules may test its rank and unsplit dims).
  RuleDecision Decide(absl::string_view name, const std::vector<int64_t>& shape) const;
  // What decides a param that sources 1-3 left open (sources 4, 5 and
  // --default_kind), given whether its tp copies are bitwise equal (nullopt
  // when tp == 1: no evidence).
  RuleDecision DecideWithoutRules(absl::string_view name, std::optional<bool> copies_equal) const;

  // kFailedPrecondition when `name` matches one of AutoTP's
  // autotp_unsupported_parameter_patterns (universal format 0.4: params
  // DeepSpeed's converter must not merge), naming the pattern and its reason.
  absl::Status CheckSupported(absl::string_view name) const;

  const std::string& preset() const { return preset_; }
  bool preset_detected() const { return preset_detected_; }
  int64_t original_vocab_size() const { return original_vocab_size_; }
  const std::vector<std::string>& pipeline_replicated() const { return pipeline_replicated_; }
  // The rules in effect, for the manifest.
  MergeRules EffectiveRules() const;

 private:
  std::vector<RuleSet> sets_;
  RuleSet unsupported_;                          // autotp_unsupported_parameter_patterns
  std::vector<std::string> unsupported_reasons_;  // per rule of unsupported_
  int preset_set_ = -1;            // index of the preset's set in sets_
  RuleSet overrides_;              // the preset's rules the args switched on
  std::vector<std::string> override_notes_;
  bool checkpoint_has_patterns_ = false;
  MergeKind default_kind_ = MERGE_KIND_UNSPECIFIED;
  std::string preset_;
  bool preset_detected_ = false;
  int64_t original_vocab_size_ = 0;
  std::vector<std::string> pipeline_replicated_;
};

std::string RuleSourceName(RuleSource source);

// How the tp slices of modules DeepSpeed itself adds to any model merge (the
// router of a native MoE layer, deepspeed.moe.layer.MoE's
// deepspeed_moe.gate.wg): after the preset's rules (source PRESET, labelled
// kDeepSpeedModulesLabel) when some param is such a module. A tp=1 MoE
// checkpoint then reshards to tp > 1 with no rules file for its router.
inline constexpr char kDeepSpeedModulesLabel[] = "DeepSpeed's own modules";
const MergeRules& DeepSpeedModuleRules();

}  // namespace ucp::rules

#endif  // UCP_RULES_RULES_H_
