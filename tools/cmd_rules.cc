// `ucp rules`: the built-in presets, or (--suggest) suggested rules for the
// params of a checkpoint that no rule source settles.
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/fs.h"
#include "google/protobuf/text_format.h"
#include "ops/open.h"
#include "rules/presets.h"
#include "tools/cli.h"
#include "tools/commands.h"

namespace ucp::tools {

int RunRules(int argc, char** argv) {
  FlagSet f("rules",
            "prints the built-in merge-rule presets as MergeRules textproto, a start for a --rules file; with "
            "--suggest, suggested rules for the params of a checkpoint that nothing settles");
  std::string preset;
  bool suggest = false;
  std::string input_folder, output;
  ZeroSourceFlags src;
  int threads = 0;
  f.Bool("suggest", &suggest,
         "read --input_folder (a ZeRO checkpoint) and write one rule per family of params (layer indices "
         "generalized) that no --rules file, checkpoint pattern or preset settles, each with the evidence it rests "
         "on; a kind the evidence cannot decide is left MERGE_KIND_UNSPECIFIED for you to fill in");
  f.String("input_folder", &input_folder, "with --suggest: the ZeRO checkpoint (a tag folder or a root with `latest`)");
  f.String("output", &output, "with --suggest: write the rules file here (default: stdout)");
  f.Int32("num_threads", &threads, "with --suggest: threads comparing tp copies (0 = all cores)");
  src.Register(f);  // --preset, --rules, ...: what convert would be given
  std::vector<std::string> positional;
  if (std::optional<int> done = ParseOrExit(f, argc, argv, &positional)) return *done;
  preset = src.preset;
  if (suggest) {
    if (input_folder.empty()) return Fail(absl::InvalidArgumentError("--suggest needs --input_folder"));
    auto options = src.Options(threads, 0);
    if (!options.ok()) return Fail(options.status());
    auto report = ops::SuggestRules(input_folder, *options);
    if (!report.ok()) return Fail(report.status());
    if (output.empty()) {
      std::cout << report->text;
    } else {
      absl::Status s = WriteFileAtomic(output, report->text);
      if (!s.ok()) return Fail(s);
      int open = 0;
      for (const auto& r : report->suggestions) open += !r.decided();
      std::cerr << output << ": " << report->suggestions.size() << " rule(s) for "
                << report->undecided_params + report->replicated_by_evidence << " param(s); " << open
                << " need their kind filled in\n";
    }
    return 0;
  }
  if (preset == "none") preset.clear();
  std::vector<std::string> names = preset.empty() ? rules::PresetNames() : std::vector<std::string>{preset};
  for (const auto& name : names) {
    auto rules = rules::PresetRules(name);
    if (!rules.ok()) return Fail(rules.status());
    std::string text;
    google::protobuf::TextFormat::PrintToString(*rules, &text);
    std::cout << "# preset " << name << "\n" << text << "\n";
  }
  return 0;
}

}  // namespace ucp::tools
