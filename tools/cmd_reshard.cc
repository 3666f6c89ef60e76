// `ucp reshard`.
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "ops/reshard.h"
#include "tools/progress.h"
#include "format/torch/torch_file.h"
#include "tools/cli.h"
#include "tools/commands.h"

namespace ucp::tools {

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
  f.Int32("zero_stage", &o.write.zero_stage, "ZeRO stage of the output, 1, 2 or 3 (0 = the source's)");
  f.Int("sub_group_size", &o.write.sub_group_size,
        "ZeRO-3 output: the target job's zero_optimization.sub_group_size (0 = the source's, else 1e9)");
  f.Int32("expert_parallel", &o.write.expert_parallel,
          "mixture-of-experts output: expert parallel degree (0 = the source's if it divides --dp, else the largest "
          "that divides --dp and every layer's expert count)");
  f.String("target_ds_version", &o.write.target_ds_version,
           "the DeepSpeed version (0.12 to 0.19.5) whose layout to write: group_paddings per rank from 0.16.4 "
           "(\"\" = the source's ds_version)");
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
  f.Int32("dry_run", &o.dry_run_ranks,
          "write nothing; print the plan split over this many ranks (under mpirun: the job's ranks): units, bytes "
          "and input files per rank");
  f.Bool("dry_run_units", &o.dry_run_units, "with --dry_run: every unit with its outputs and the inputs it reads");
  f.Bool("verify_checksums", &o.verify_checksums, "check a ucp universal source against its manifest's sha256s first");
  std::string progress_flag = "auto";
  RegisterProgressFlag(f, &progress_flag);
  src.Register(f);
  bool allow_unsafe = false;
  RegisterUnsafePickleFlag(f, &allow_unsafe);
  RegisterUpdateLatestFlag(f, &o.write.update_latest);
  std::vector<std::string> positional;
  if (std::optional<int> done = ParseOrExit(f, argc, argv, &positional)) return *done;
  if (allow_unsafe) torch::SetAllowUnsafePickles(true);
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
  o.cluster = JobCluster();
  auto result = ops::Reshard(o);
  if (!result.ok()) return Fail(result.status());
  if (!PrintsResults()) return 0;
  if (o.dry_run_ranks > 0) {
    std::cout << result->plan;
    return 0;
  }
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

}  // namespace ucp::tools
