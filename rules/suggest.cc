#include "rules/suggest.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "format/torch/tensor.h"
#include "rules/rules.h"
#include "tp/merge.h"

namespace ucp::rules {
namespace {

std::string KindName(MergeKind k) { return MergeKind_Name(k); }

std::string KindList(const std::vector<MergeKind>& kinds) {
  std::vector<std::string> names;
  for (MergeKind k : kinds) names.push_back(KindName(k));
  return absl::StrJoin(names, " or ");
}

// What the shape says about a param whose tp copies differ.
struct Verdict {
  MergeKind kind = MERGE_KIND_UNSPECIFIED;
  std::vector<MergeKind> candidates;
  std::string why;
};

Verdict JudgeDiffering(const std::vector<int64_t>& s, int64_t hidden) {
  Verdict v;
  const std::string h = absl::StrCat("hidden_size ", hidden);
  if (s.empty()) {
    v.candidates = {AVERAGE};
    v.why = "a 0-dim tensor cannot be split: its copies differ, so they drifted apart (AVERAGE, or "
            "--replicated_mismatch)";
    return v;
  }
  if (s.size() == 1) {
    if (hidden <= 0) {
      v.candidates = {COLUMN, AVERAGE};
      v.why = "1-D, so split on dim 0 if partitioned; hidden_size unknown (no args.hidden_size), so drifted "
              "copies of a replicated vector (AVERAGE) cannot be ruled out";
    } else if (s[0] == hidden) {
      v.candidates = {COLUMN, AVERAGE};
      v.why = absl::StrCat("1-D of size ", h,
                           ": a column slice of a [hidden_size * tp] vector, or drifted copies of a replicated "
                           "hidden-sized vector (AVERAGE); the data cannot tell");
    } else {
      v.kind = COLUMN;
      v.why = absl::StrCat("1-D, so split on dim 0 (cat dim 0); its size ", s[0], " is not ", h,
                           ", so not a hidden-sized replicated vector");
    }
    return v;
  }
  if (hidden <= 0) {
    v.candidates = {COLUMN, ROW};
    v.why = "hidden_size unknown (no args.hidden_size): the split dim cannot be told from the shape";
    return v;
  }
  const bool d0 = s[0] == hidden, d1 = s[1] == hidden;
  if (d0 && !d1) {
    v.kind = ROW;
    v.why = absl::StrCat("dim 0 is ", h, " and dim 1 (", s[1], ") is not: dim 0 is whole, split on dim 1 (cat dim 1)");
  } else if (d1 && !d0) {
    v.kind = COLUMN;
    v.why = absl::StrCat("dim 1 is ", h, " and dim 0 (", s[0], ") is not: dim 1 is whole, split on dim 0 (cat dim 0)");
  } else {
    v.candidates = {COLUMN, ROW};
    v.why = d0 ? absl::StrCat("dims 0 and 1 are both ", h, ": the split dim cannot be told from the shape")
               : absl::StrCat("neither dim 0 (", s[0], ") nor dim 1 (", s[1], ") is ", h,
                              ": the split dim cannot be told from the shape");
  }
  return v;
}

struct Family {
  std::string pattern;
  int ndim = -1;
  std::vector<size_t> members;  // indices into facts (undecided only)
};

}  // namespace

std::vector<bool> FamilyCopiesEqual(const std::vector<ParamFacts>& facts) {
  std::map<std::pair<std::string, size_t>, bool> differs;
  std::vector<std::pair<std::string, size_t>> keys(facts.size());
  for (size_t i = 0; i < facts.size(); ++i) {
    keys[i] = {GeneralizedPattern(facts[i].name), facts[i].slice_shape.size()};
    if (facts[i].decided) continue;
    bool& d = differs[keys[i]];
    d = d || (facts[i].tp_equal.has_value() && !*facts[i].tp_equal);
  }
  std::vector<bool> out(facts.size(), false);
  for (size_t i = 0; i < facts.size(); ++i) {
    out[i] = !facts[i].decided && facts[i].tp_equal.value_or(false) && !differs[keys[i]];
  }
  return out;
}

std::vector<FamilySuggestion> SuggestFamilies(const std::vector<ParamFacts>& facts, const SuggestContext& context,
                                              bool include_equal) {
  // Ranks per generalized pattern over every param (decided ones too), and
  // the decided params each pattern would also match.
  std::map<std::string, std::set<size_t>> ranks;
  std::map<std::pair<std::string, size_t>, bool> hits_decided;
  for (const ParamFacts& f : facts) {
    const std::string p = GeneralizedPattern(f.name);
    ranks[p].insert(f.slice_shape.size());
    if (f.decided) hits_decided[{p, f.slice_shape.size()}] = true;
  }
  std::vector<Family> families;
  std::map<std::pair<std::string, size_t>, size_t> index;
  for (size_t i = 0; i < facts.size(); ++i) {
    const ParamFacts& f = facts[i];
    if (f.decided) continue;
    const std::string p = GeneralizedPattern(f.name);
    const std::pair<std::string, size_t> key{p, f.slice_shape.size()};
    auto it = index.find(key);
    if (it == index.end()) {
      it = index.emplace(key, families.size()).first;
      Family fam;
      fam.pattern = p;
      fam.ndim = ranks[p].size() > 1 ? static_cast<int>(f.slice_shape.size()) : -1;
      families.push_back(fam);
    }
    families[it->second].members.push_back(i);
  }

  std::vector<FamilySuggestion> out;
  for (const Family& fam : families) {
    FamilySuggestion s;
    const ParamFacts& first = facts[fam.members[0]];
    s.slice_shape = first.slice_shape;
    for (size_t i : fam.members) s.members.push_back(facts[i].name);
    // The generalized pattern, unless it would also catch a param a rule
    // already settles (then the exact names).
    if (hits_decided.count({fam.pattern, first.slice_shape.size()})) {
      std::vector<std::string> exact;
      for (const std::string& n : s.members) exact.push_back(ExactPattern(n));
      s.rule.set_pattern(exact.size() == 1 ? exact[0] : absl::StrCat("(?:", absl::StrJoin(exact, "|"), ")"));
    } else {
      s.rule.set_pattern(fam.pattern);
    }
    // (ndim 0 means any rank: a 0-dim family's rule goes last, after its
    // siblings' rank-conditioned rules.)
    if (fam.ndim > 0) s.rule.set_ndim(fam.ndim);

    const std::string count =
        absl::StrCat(s.members.size(), s.members.size() == 1 ? " param" : " params", ", e.g. ", s.members[0],
                     ", tp slice ", torch::ShapeString(s.slice_shape));
    int compared = 0, differing = 0;
    const ParamFacts* example = nullptr;
    for (size_t i : fam.members) {
      if (!facts[i].tp_equal.has_value()) continue;
      ++compared;
      if (!*facts[i].tp_equal) {
        ++differing;
        if (example == nullptr) example = &facts[i];
      }
    }
    if (context.tp <= 1 || compared == 0) {
      s.candidates = {REPLICATED, COLUMN, ROW};
      if (s.slice_shape.size() < 2) s.candidates = {REPLICATED, COLUMN};
      s.evidence = absl::StrCat(count, ": cannot decide: saved at tp=", context.tp,
                                ", no tp copies to compare (REPLICATED, or split: save at tp >= 2 to tell)");
      out.push_back(std::move(s));
      continue;
    }
    if (differing == 0) {
      if (!include_equal) continue;
      s.rule.set_kind(REPLICATED);
      s.evidence = absl::StrCat(count, ": tp copies bitwise equal in every state of every param: REPLICATED ",
                                "(already settled by evidence; a partitioned param whose slices are all equal ",
                                "would need its split kind here)");
      out.push_back(std::move(s));
      continue;
    }
    const std::string copies =
        absl::StrCat("tp copies differ (", differing, " of ", compared, "; ", example->name, ": ",
                     example->diff_state, ", max |diff| ", example->max_diff, "), so not REPLICATED");
    // Every member's shape must say the same.
    std::optional<Verdict> verdict;
    bool agree = true;
    std::set<MergeKind> candidates;
    for (size_t i : fam.members) {
      Verdict v = JudgeDiffering(facts[i].slice_shape, context.hidden_size);
      if (v.kind != MERGE_KIND_UNSPECIFIED) candidates.insert(v.kind);
      for (MergeKind k : v.candidates) candidates.insert(k);
      if (!verdict) {
        verdict = v;
      } else if (verdict->kind != v.kind) {
        agree = false;
      }
    }
    if (agree && verdict->kind != MERGE_KIND_UNSPECIFIED) {
      s.rule.set_kind(verdict->kind);
      s.evidence = absl::StrCat(count, ": ", copies, "; ", verdict->why);
    } else {
      s.candidates.assign(candidates.begin(), candidates.end());
      s.evidence = absl::StrCat(count, ": ", copies, "; cannot decide: ",
                                agree ? verdict->why : "its params' shapes point to different split dims");
    }
    out.push_back(std::move(s));
  }
  std::stable_partition(out.begin(), out.end(), [&](const FamilySuggestion& s) {
    return !(s.slice_shape.empty() && ranks[GeneralizedPattern(s.members[0])].size() > 1);
  });
  return out;
}

std::string SuggestionText(const FamilySuggestion& s) {
  std::string text = absl::StrCat("# ", s.evidence, "\n");
  if (!s.decided()) absl::StrAppend(&text, "# FILL IN the kind: ", KindList(s.candidates), "\n");
  std::string pattern;
  for (char c : s.rule.pattern()) {
    if (c == '\\' || c == '"') pattern += '\\';
    pattern += c;
  }
  absl::StrAppend(&text, "rule { pattern: \"", pattern, "\"");
  if (s.rule.ndim() > 0) absl::StrAppend(&text, " ndim: ", s.rule.ndim());
  absl::StrAppend(&text, " kind: ", KindName(s.rule.kind()), " }\n");
  return text;
}

std::string SuggestionsAsRulesText(const std::vector<FamilySuggestion>& suggestions, const std::string& header) {
  std::string text = header;
  int decided = 0;
  for (const auto& s : suggestions) decided += s.decided();
  absl::StrAppend(&text, "# ", suggestions.size(), " rule(s): ", decided, " decided by the evidence each states, ",
                  suggestions.size() - decided,
                  " left MERGE_KIND_UNSPECIFIED where the evidence cannot decide: fill those in (ucp refuses a rule ",
                  "without a kind).\n",
                  "# The evidence cannot see fused sub-params (e.g. [q; k; v] blocks per tp rank, savanna's ",
                  "non-interleaved projections: SUB_PARAMS) nor vocabulary padding (a vocab-parallel embedding or ",
                  "output layer is VOCAB, padding stripped with original_vocab_size; COLUMN keeps the padding).\n\n");
  for (const auto& s : suggestions) absl::StrAppend(&text, SuggestionText(s), "\n");
  return text;
}

}  // namespace ucp::rules
