// Suggested merge rules for params that no rule file, checkpoint pattern or
// preset settles: what `ucp rules --suggest` writes (an editable --rules
// file) and what a conversion that stops on such params lists.
//
// Suggestions are right or absent:
//   - one rule per family of params, i.e. names that differ only in their
//     layer indices (rules::GeneralizedPattern); a family whose names come
//     in several ranks gets one rule per rank (MergeRule.ndim);
//   - a kind is suggested only where the data decides it, and the rule says
//     which evidence: tp copies that differ (in any member, any state)
//     cannot be REPLICATED; a 1-D tensor can only be split on dim 0; for a
//     tensor of rank >= 2 a tp slice dim equal to the checkpoint's
//     hidden_size (args.hidden_size) is the unsplit one when the other of
//     dims 0 and 1 is not;
//   - where the data cannot decide, the rule's kind is left
//     MERGE_KIND_UNSPECIFIED (a rules file refuses it until it is filled in)
//     and the comment says why and what remains possible.
// Evidence cannot see fused sub-params ([q; k; v] blocks per tp rank) nor
// vocabulary padding: the file's header says so.
//
// Example:
//   std::vector<ParamFacts> facts = ...;  // every param, with its evidence
//   std::vector<FamilySuggestion> s = SuggestFamilies(facts, {tp, hidden_size});
//   std::string text = SuggestionsAsRulesText(s, header);
#ifndef UCP_RULES_SUGGEST_H_
#define UCP_RULES_SUGGEST_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "proto/ucp.pb.h"

namespace ucp::rules {

// What is known about one param.
struct ParamFacts {
  std::string name;
  std::vector<int64_t> slice_shape;  // on tp rank 0
  bool decided = false;              // a rule source (file, checkpoint, preset) settles it
  // Its tp copies: nullopt when not compared (tp == 1, or decided).
  std::optional<bool> tp_equal;
  std::string diff_state;  // the first state whose copies differ
  double max_diff = 0;
};

struct SuggestContext {
  int tp = 1;
  int64_t hidden_size = 0;  // args.hidden_size; 0 = unknown
};

struct FamilySuggestion {
  MergeRule rule;  // pattern (and ndim when needed); kind UNSPECIFIED = undecided
  std::vector<std::string> members;   // the undecided params it covers
  std::vector<int64_t> slice_shape;   // of the first member
  std::vector<MergeKind> candidates;  // what the evidence leaves possible
  std::string evidence;               // in words
  bool decided() const { return rule.kind() != MERGE_KIND_UNSPECIFIED; }
};

// The families of the undecided params of `facts` (in first-member order)
// and what the evidence says about each. Params whose family has tp copies
// bitwise equal in every member are left out (evidence settles them as
// replicated), unless `include_equal`: then they come with kind REPLICATED.
std::vector<FamilySuggestion> SuggestFamilies(const std::vector<ParamFacts>& facts, const SuggestContext& context,
                                              bool include_equal = false);

// Whether tp-equal copies of an undecided param may settle it as replicated:
// false when another undecided param of its family has copies that differ
// (a partitioned param whose slices happen to be equal, e.g. zero-init).
std::vector<bool> FamilyCopiesEqual(const std::vector<ParamFacts>& facts);

// One suggestion as a rules-file line (with its evidence as a comment
// above), e.g. for an error message.
std::string SuggestionText(const FamilySuggestion& s);
// The whole editable --rules file: `header` (comment lines) and the
// suggestions.
std::string SuggestionsAsRulesText(const std::vector<FamilySuggestion>& suggestions, const std::string& header);

}  // namespace ucp::rules

#endif  // UCP_RULES_SUGGEST_H_
