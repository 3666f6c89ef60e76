// `ucp convert`: a DeepSpeed ZeRO checkpoint folder -> a universal checkpoint,
// the drop-in replacement of deepspeed/checkpoint/ds_to_universal.py that
// decides every param's tp merge from rules, patterns, presets or evidence
// (rules.h) instead of concatenating unknown params on dim 0.
#ifndef UCP_CONVERTER_CONVERT_H_
#define UCP_CONVERTER_CONVERT_H_

#include <string>

#include "absl/status/statusor.h"
#include "converter/universal_writer.h"
#include "converter/zero_state.h"

namespace ucp::converter {

struct ConvertOptions {
  std::string input_folder;   // a tag folder, or a root with `latest`
  std::string output_folder;  // the universal folder to create
  ZeroStateOptions state;
  UniversalWriteOptions write;
  // Unused patterns of a --rules file are an error (ds_to_universal's strict
  // mode checks its patterns likewise); --no_strict turns that off.
  bool strict = true;
};

struct ConvertResult {
  WriteStats stats;
  std::string summary;   // how many params got each kind from each source
  std::string explain;   // one line per param: name, shape, kind, source, why
  std::vector<std::string> warnings;
};

absl::StatusOr<ConvertResult> Convert(const ConvertOptions& options);

// The summary and per-param table of a model state's rules.
std::string RuleSummary(const deepspeed::ModelInfo& info);
std::string RuleExplanation(const deepspeed::ModelInfo& info);

}  // namespace ucp::converter

#endif  // UCP_CONVERTER_CONVERT_H_
