// `ucp inspect`.
#include <iostream>
#include <string>
#include <vector>

#include "google/protobuf/text_format.h"
#include "ops/inspect.h"
#include "tools/cli.h"
#include "tools/commands.h"

namespace ucp::tools {

int RunInspect(int argc, char** argv) {
  FlagSet f("inspect", "what a checkpoint folder (ZeRO or universal) or a single .pt file holds. Usage: ucp inspect PATH");
  std::string format = "text";
  f.String("format", &format, "text or textproto (an InspectReport message, proto/ucp.proto)");
  std::string source_options;
  f.String("source_option", &source_options, cli::kSourceOptionHelp);
  std::vector<std::string> positional;
  if (std::optional<int> done = ParseOrExit(f, argc, argv, &positional)) return *done;
  if (positional.size() != 1) {
    return Fail(absl::InvalidArgumentError("usage: ucp inspect PATH [--format=text|textproto]"));
  }
  formats::SourceOptions options;
  if (absl::Status s = cli::ParseSourceOptions(source_options, &options.format_options); !s.ok()) return Fail(s);
  auto report = ops::Inspect(positional[0], options);
  if (!report.ok()) return Fail(report.status());
  if (format == "textproto") {
    std::string text;
    google::protobuf::TextFormat::PrintToString(*report, &text);
    std::cout << text;
  } else if (format == "text") {
    std::cout << formats::FormatReport(*report);
  } else {
    return Fail(absl::InvalidArgumentError(absl::StrCat("--format=", format, ": expected text or textproto")));
  }
  // Problems found (files that disagree) make the exit status say so.
  return report->problem_size() > 0 ? 1 : 0;
}

}  // namespace ucp::tools
