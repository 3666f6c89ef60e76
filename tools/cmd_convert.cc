// `ucp convert`.
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/digest.h"
#include "ops/convert.h"
#include "tools/progress.h"
#include "format/torch/torch_file.h"
#include "tools/cli.h"
#include "tools/commands.h"

namespace ucp::tools {

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
  f.String("target_ds_version", &o.write.target_ds_version,
           "the DeepSpeed version that will load the output (\"\" = the checkpoint's ds_version); a ZeRO-3 "
           "checkpoint is refused for versions whose stage-3 universal loader cannot read it");
  f.Bool("overwrite", &o.write.overwrite, "replace an existing output folder (only once the new one is complete)");
  std::string digest = "xxh3";
  f.String("digest", &digest,
           "the digest of every file in the manifest: xxh3 (XXH3-128: catches corruption, not tampering; fast) or "
           "sha256");
  f.Int32("dry_run", &o.dry_run_ranks,
          "write nothing; print the plan split over this many ranks (under mpirun: the job's ranks): units, bytes "
          "and input files per rank");
  f.Bool("dry_run_units", &o.dry_run_units, "with --dry_run: every unit with its outputs and the inputs it reads");
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
  bool allow_unsafe = false;
  RegisterUnsafePickleFlag(f, &allow_unsafe);
  RegisterUpdateLatestFlag(f, &o.write.update_latest);
  std::vector<std::string> positional;
  if (std::optional<int> done = ParseOrExit(f, argc, argv, &positional)) return *done;
  if (allow_unsafe) torch::SetAllowUnsafePickles(true);
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
  auto digest_kind = ParseDigestKind(digest);
  if (!digest_kind.ok() || *digest_kind == DigestKind::kNone) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("--digest=", digest, ": expected xxh3 or sha256")));
  }
  o.write.digest = *digest_kind;
  o.cluster = JobCluster();
  auto result = ops::Convert(o);
  if (!result.ok()) return Fail(result.status());
  if (!PrintsResults()) return 0;
  if (o.dry_run_ranks > 0) {
    std::cout << result->plan;
    return 0;
  }
  for (const auto& w : result->warnings) std::cerr << "ucp: note: " << w << "\n";
  if (explain) std::cout << result->explain << "\n";
  std::cout << result->summary;
  std::cout << "wrote " << o.output_folder << ": " << result->stats.params << " params, " << result->stats.files
            << " files, " << result->stats.bytes << " bytes\n";
  return 0;
}

}  // namespace ucp::tools
