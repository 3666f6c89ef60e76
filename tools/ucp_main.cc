// ucp: universal checkpoints for DeepSpeed that survive any change of
// parallelism. Subcommands are thin wrappers over the libraries:
//
//   ucp inspect PATH            what a checkpoint folder or .pt file holds
//   ucp convert ...             ZeRO checkpoint -> universal checkpoint
//   ucp reshard ...             any checkpoint -> ZeRO checkpoint at tp/pp/dp
//   ucp rules [--preset=NAME]   the built-in merge-rule presets, as textproto
//   ucp demo                    the built-in end-to-end example
//   ucp fuzz / ucp golden       the conformance suite's tools
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "ops/convert.h"
#include "rules/presets.h"
#include "rules/rules.h"
#include "readers/inspect.h"
#include "google/protobuf/text_format.h"
#include "ops/reshard.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "tools/progress.h"
#include "tp/merge.h"

namespace ucp::tools {
namespace {

absl::Status ParseMismatch(const std::string& s, rules::ReplicatedMismatch* out) {
  if (s == "error") *out = rules::ReplicatedMismatch::kError;
  else if (s == "average") *out = rules::ReplicatedMismatch::kAverage;
  else if (s == "first") *out = rules::ReplicatedMismatch::kFirst;
  else return absl::InvalidArgumentError(absl::StrCat("--replicated_mismatch=", s, ": expected error, average or first"));
  return absl::OkStatus();
}

// Flags shared by convert and reshard for reading a ZeRO checkpoint.
struct ZeroSourceFlags {
  std::string rules, preset, mismatch = "error", default_kind, tied_layers;
  int64_t original_vocab_size = 0;

  void Register(FlagSet& f) {
    f.String("rules", &rules,
             "a MergeRules textproto (rule { pattern: \"REGEX\" kind: ROW }, ...): how the tp slices of matching "
             "params merge; first match wins and these rules take precedence over every other source");
    f.String("preset", &preset,
             "built-in rules: gpt-neox, megatron-deepspeed, bloom; \"\" detects one from the param names, \"none\" "
             "disables presets (see `ucp rules`)");
    f.String("replicated_mismatch", &mismatch,
             "what to do when the tp copies of a replicated param differ: error, average (keep their mean), first "
             "(keep tp rank 0)");
    f.String("default_kind", &default_kind,
             "merge kind for params nothing else decides (replicated, column, row, ...); empty = stop with a list of "
             "them");
    f.String("tied_layers", &tied_layers,
             "pipeline layers using each tied module, as KEY:L1,L2;... (e.g. embed:0,12). Layers with files are "
             "read from the checkpoint; a tied layer without a file (a TiedLayerSpec with forward_fn, like "
             "Megatron-DeepSpeed's and GPT-NeoX's output head) is otherwise assumed to be the last layer");
    f.Int("original_vocab_size", &original_vocab_size,
          "unpadded vocabulary size, to strip vocab padding from vocabulary-parallel params (0 = from the "
          "checkpoint's universal_checkpoint_info, else the padding is kept)");
  }
  absl::StatusOr<ops::SourceOptions> Options(int threads, int64_t divisible_by) const {
    ops::SourceOptions o;
    o.rules.rules_file = rules;
    o.rules.preset = preset;
    o.rules.original_vocab_size = original_vocab_size;
    if (!default_kind.empty()) {
      auto k = tp::ParseMergeKind(default_kind);
      if (!k.ok()) return k.status();
      o.rules.default_kind = *k;
    }
    absl::Status s = ParseMismatch(mismatch, &o.replicated_mismatch);
    if (!s.ok()) return s;
    for (absl::string_view item : absl::StrSplit(tied_layers, ';', absl::SkipEmpty())) {
      std::pair<std::string, std::string> kv = absl::StrSplit(item, ':');
      std::vector<int> layers;
      for (absl::string_view l : absl::StrSplit(kv.second, ',', absl::SkipEmpty())) {
        int v = 0;
        if (!absl::SimpleAtoi(l, &v)) {
          return absl::InvalidArgumentError(absl::StrCat("--tied_layers: expected KEY:L1,L2, got '", item, "'"));
        }
        layers.push_back(v);
      }
      if (kv.first.empty() || layers.empty()) {
        return absl::InvalidArgumentError(absl::StrCat("--tied_layers: expected KEY:L1,L2, got '", item, "'"));
      }
      o.tied_layers[kv.first] = layers;
    }
    o.num_threads = threads;
    o.make_vocab_size_divisible_by = divisible_by;
    return o;
  }
};

void RegisterProgressFlag(FlagSet& f, std::string* mode) {
  f.String("progress", mode,
           "auto (a live line on a terminal, else one line per phase), always, never, or json (JSON lines for CI "
           "logs)");
}

int Fail(const absl::Status& s) {
  std::cerr << "ucp: " << s.message() << " [" << absl::StatusCodeToString(s.code()) << "]\n";
  return 1;
}

// Parses the flags; an exit code when the command is already done (a bad
// flag: 1, --help: 0), else nullopt.
std::optional<int> ParseOrExit(FlagSet& f, int argc, char** argv, std::vector<std::string>* positional) {
  auto pos = f.Parse(argc, argv);
  if (!pos.ok()) return Fail(pos.status());
  if (f.help_requested()) {
    std::cout << f.Usage();
    return 0;
  }
  *positional = *std::move(pos);
  return std::nullopt;
}

int RunInspect(int argc, char** argv) {
  FlagSet f("inspect", "what a checkpoint folder (ZeRO or universal) or a single .pt file holds. Usage: ucp inspect PATH");
  std::string format = "text";
  f.String("format", &format, "text or textproto (an InspectReport message, proto/ucp.proto)");
  std::vector<std::string> positional;
  if (std::optional<int> done = ParseOrExit(f, argc, argv, &positional)) return *done;
  if (positional.size() != 1) {
    return Fail(absl::InvalidArgumentError("usage: ucp inspect PATH [--format=text|textproto]"));
  }
  auto report = readers::Inspect(positional[0]);
  if (!report.ok()) return Fail(report.status());
  if (format == "textproto") {
    std::string text;
    google::protobuf::TextFormat::PrintToString(*report, &text);
    std::cout << text;
  } else if (format == "text") {
    std::cout << readers::FormatReport(*report);
  } else {
    return Fail(absl::InvalidArgumentError(absl::StrCat("--format=", format, ": expected text or textproto")));
  }
  return 0;
}

int RunConvert(int argc, char** argv) {
  FlagSet f("convert",
            "DeepSpeed ZeRO checkpoint -> universal checkpoint (a drop-in for deepspeed/checkpoint/ds_to_universal.py "
            "that merges every param's tp slices by an explicit rule)");
  ops::ConvertOptions o;
  ZeroSourceFlags src;
  bool explain = false, keep = false;
  int threads = 0, extract_workers = 0;
  int64_t divisible_by = 0;
  f.String("input_folder", &o.input_folder, "the ZeRO checkpoint: a tag folder (global_stepN) or a root with `latest`",
           true);
  f.String("output_folder", &o.output_folder,
           "the universal checkpoint folder to create (e.g. ROOT/global_stepN_universal); ROOT/latest_universal is "
           "written last",
           true);
  src.Register(f);
  f.Bool("explain", &explain, "print every param's merge kind, the source of that rule and why");
  std::string progress_flag = "auto";
  RegisterProgressFlag(f, &progress_flag);
  f.Int32("num_threads", &threads, "threads converting params in parallel (0 = all cores)");
  f.Bool("overwrite", &o.write.overwrite, "replace an existing output folder (only once the new one is complete)");
  f.Int("make_vocab_size_divisible_by", &divisible_by,
        "recorded in the manifest for later resharding (0 = from the checkpoint's args)");
  f.Int32("num_extract_workers", &extract_workers, "ds_to_universal.py compatibility: used as --num_threads when that is not set");
  f.Ignored("num_merge_workers", true, "ds_to_universal.py compatibility: accepted, ucp has a single pass");
  f.Bool("keep_temp_folder", &keep,
         "ds_to_universal.py compatibility: ucp writes no temporary fragment files; with this flag a failed run "
         "keeps its staging folder for inspection");
  f.NegatedBool("no_strict", &o.strict,
                "accept --rules patterns that match no param (by default they are an error, as ds_to_universal.py's "
                "strict mode treats unused patterns)");
  f.Ignored("inject_missing_state", false,
            "ds_to_universal.py compatibility: ucp never requires universal_checkpoint_info, nothing to inject");
  std::vector<std::string> positional;
  if (std::optional<int> done = ParseOrExit(f, argc, argv, &positional)) return *done;
  if (threads == 0 && extract_workers > 0) threads = extract_workers;
  auto state = src.Options(threads, divisible_by);
  if (!state.ok()) return Fail(state.status());
  o.state = *state;
  o.write.num_threads = threads;
  o.write.keep_temp_folder = keep;
  auto mode = ParseProgressMode(progress_flag);
  if (!mode.ok()) return Fail(mode.status());
  ProgressPrinter progress("convert", *mode);
  o.write.progress = progress.Callback();
  auto result = ops::Convert(o);
  if (!result.ok()) return Fail(result.status());
  for (const auto& w : result->warnings) std::cerr << "ucp: note: " << w << "\n";
  if (explain) std::cout << result->explain << "\n";
  std::cout << result->summary;
  std::cout << "wrote " << o.output_folder << ": " << result->stats.params << " params, " << result->stats.files
            << " files, " << result->stats.bytes << " bytes\n";
  return 0;
}

int RunReshard(int argc, char** argv) {
  FlagSet f("reshard",
            "any checkpoint (universal, or ZeRO read in one pass) -> a regular DeepSpeed ZeRO checkpoint at a target "
            "tp/pp/dp that any DeepSpeed version loads with a plain load_checkpoint");
  ops::ReshardOptions o;
  ZeroSourceFlags src;
  int threads = 0;
  std::string layer_types;
  f.String("input_folder", &o.input_folder,
           "a universal folder (or a root with latest_universal) or a ZeRO folder (tag folder or root with latest)",
           true);
  f.String("output_folder", &o.output_folder, "ROOT/TAG of the checkpoint to write; ROOT/latest is written last",
           true);
  f.Int32("tp", &o.write.target.tp, "target tensor-parallel degree");
  f.Int32("pp", &o.write.target.pp, "target pipeline-parallel degree");
  f.Int32("dp", &o.write.target.dp, "target data-parallel degree");
  f.Int32("zero_stage", &o.write.zero_stage, "ZeRO stage of the output, 1 or 2 (0 = the source's)");
  f.String("partition_method", &o.write.partition_method,
           "pipeline stage partitioning, as PipelineModule's partition_method: parameters, uniform or type:REGEX "
           "(\"\" = the one recorded in the checkpoint's args, else parameters)");
  f.Int("make_vocab_size_divisible_by", &o.write.make_vocab_size_divisible_by,
        "vocabulary padding multiple per tp rank, as Megatron's flag (0 = from the checkpoint's args or manifest)");
  f.Int32("num_layers", &o.write.num_layers,
          "number of PipelineModule layer specs (0 = up to the last layer holding tensors)");
  f.String("layer_types", &layer_types,
           "class names of layers for type:REGEX partitioning, as INDEX:NAME,... (default: guessed from param names)");
  f.Int32("num_threads", &threads, "threads writing files in parallel (0 = all cores)");
  f.Bool("overwrite", &o.write.overwrite, "replace an existing output folder (only once the new one is complete)");
  f.Bool("verify_checksums", &o.verify_checksums, "check a ucp universal source against its manifest's sha256s first");
  std::string progress_flag = "auto";
  RegisterProgressFlag(f, &progress_flag);
  src.Register(f);
  std::vector<std::string> positional;
  if (std::optional<int> done = ParseOrExit(f, argc, argv, &positional)) return *done;
  for (absl::string_view item : absl::StrSplit(layer_types, ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(item, ':');
    int idx = 0;
    if (!absl::SimpleAtoi(kv.first, &idx) || kv.second.empty()) {
      return Fail(absl::InvalidArgumentError(absl::StrCat("--layer_types: expected INDEX:NAME, got '", item, "'")));
    }
    o.write.layer_types[idx] = kv.second;
  }
  auto zs = src.Options(threads, o.write.make_vocab_size_divisible_by);
  if (!zs.ok()) return Fail(zs.status());
  o.zero_source = *zs;
  o.write.num_threads = threads;
  auto mode = ParseProgressMode(progress_flag);
  if (!mode.ok()) return Fail(mode.status());
  ProgressPrinter progress("reshard", *mode);
  o.write.progress = progress.Callback();
  auto result = ops::Reshard(o);
  if (!result.ok()) return Fail(result.status());
  for (const auto& n : result->notes) std::cerr << "ucp: note: " << n << "\n";
  std::cout << "resharded " << result->source_kind << " checkpoint " << o.input_folder << " ("
            << result->source.ToString() << ") -> " << o.output_folder << " (" << o.write.target.ToString()
            << ", ZeRO stage " << result->write.layout.zero_stage << "): " << result->write.files << " files, "
            << result->write.bytes << " bytes\n";
  if (!result->write.layout.parts.empty() && o.write.target.pp > 1) {
    std::cout << "pipeline stages (" << result->write.layout.partition_method << "):";
    for (int s = 0; s < o.write.target.pp; ++s) {
      std::cout << " [" << result->write.layout.parts[s] << ", " << result->write.layout.parts[s + 1] << ")";
    }
    std::cout << "\n";
  }
  return 0;
}

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

constexpr char kUsage[] = R"(ucp: universal checkpoints for DeepSpeed that survive any change of parallelism

usage: ucp <command> [flags]   (ucp <command> --help explains each flag)

commands:
  inspect PATH   what a checkpoint folder (ZeRO or universal) or a .pt file holds
  convert        ZeRO checkpoint -> universal checkpoint (drop-in for ds_to_universal.py)
  reshard        any checkpoint -> regular ZeRO checkpoint at a new tp/pp/dp
  rules          print the built-in merge-rule presets
  demo           the built-in example: generate a GPT-NeoX-style tp=2 ZeRO-1 checkpoint,
                 convert it, reshard it to tp=1, verify it bitwise
  fuzz           run the conformance properties on random models and topologies
  golden         check (or update) a golden description of a universal checkpoint
)";

}  // namespace
}  // namespace ucp::tools

int main(int argc, char** argv) {
  using namespace ucp::tools;
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h" ||
      std::string(argv[1]) == "help") {
    std::cout << kUsage;
    return argc < 2 ? 1 : 0;
  }
  const std::string cmd = argv[1];
  if (cmd == "inspect") return RunInspect(argc - 1, argv + 1);
  if (cmd == "convert") return RunConvert(argc - 1, argv + 1);
  if (cmd == "reshard") return RunReshard(argc - 1, argv + 1);
  if (cmd == "rules") return RunRules(argc - 1, argv + 1);
  for (const Command& c : ExtraCommands()) {
    if (cmd == c.name) return c.run(argc - 1, argv + 1);
  }
  std::cerr << "ucp: unknown command '" << cmd << "'\n" << kUsage;
  return 1;
}
