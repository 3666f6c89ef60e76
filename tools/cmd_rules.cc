// `ucp rules`.
#include <iostream>
#include <string>
#include <vector>

#include "google/protobuf/text_format.h"
#include "rules/presets.h"
#include "tools/cli.h"
#include "tools/commands.h"

namespace ucp::tools {

int RunRules(int argc, char** argv) {
  FlagSet f("rules", "prints the built-in merge-rule presets as MergeRules textproto, a start for a --rules file");
  std::string preset;
  f.String("preset", &preset, "one preset (gpt-neox, megatron-deepspeed, bloom); empty prints all");
  std::vector<std::string> positional;
  if (std::optional<int> done = ParseOrExit(f, argc, argv, &positional)) return *done;
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
