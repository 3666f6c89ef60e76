#include "cli/command_flags.h"

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/digest.h"
#include "base/fs.h"
#include "base/status_macros.h"
#include "format/torch/torch_file.h"
#include "format/torch/zip.h"
#include "tp/merge.h"

namespace ucp::cli {
namespace {

// --hf_config=KEY=JSON;KEY=JSON into `hf`.
absl::Status ParseHfConfig(const std::string& flag, rules::HfOptions* hf) {
  for (absl::string_view item : absl::StrSplit(flag, ';', absl::SkipEmpty())) {
    const size_t eq = item.find('=');
    if (eq == absl::string_view::npos || eq == 0) {
      return absl::InvalidArgumentError(absl::StrCat("--hf_config: expected KEY=JSON, got '", item, "'"));
    }
    hf->config.emplace_back(std::string(item.substr(0, eq)), std::string(item.substr(eq + 1)));
  }
  return absl::OkStatus();
}

absl::Status ParseMismatch(const std::string& s, rules::ReplicatedMismatch* out) {
  if (s == "error") *out = rules::ReplicatedMismatch::kError;
  else if (s == "average") *out = rules::ReplicatedMismatch::kAverage;
  else if (s == "first") *out = rules::ReplicatedMismatch::kFirst;
  else return absl::InvalidArgumentError(absl::StrCat("--replicated_mismatch=", s, ": expected error, average or first"));
  return absl::OkStatus();
}

}  // namespace

void RegisterProgressFlag(FlagSet& f, std::string* mode) {
  f.String("progress", mode,
           "auto (a live line on a terminal, else one line per phase), always, never, or json (JSON lines for CI "
           "logs)");
}

void RegisterUnsafePickleFlag(FlagSet& f, bool* allow) {
  f.Bool("allow_unsafe_pickle", allow,
         "read and copy a checkpoint whose pickles name code-execution globals (os.system, builtins.eval, ...; "
         "`ucp inspect` marks them UNSAFE). ucp never runs them, but torch.load of the output would");
}

void RegisterUpdateLatestFlag(FlagSet& f, bool* update) {
  f.Bool("update_latest", update,
         "when the output is written beside the input (same root folder), repoint that root's existing latest file "
         "to the output; by default it is left alone, so the root still loads the input checkpoint");
}

void RegisterFsyncFlag(FlagSet& f, bool* fsync) {
  f.Bool("fsync", fsync,
         "fsync every output file and folder before the output is renamed into place (default), so that a crash "
         "never leaves a committed but unwritten checkpoint. --fsync=false skips it (and the early writeback): "
         "faster, like cp -r, but NOT crash-safe: after a power loss the committed output may hold zeros or "
         "missing files");
}

void ZeroSourceFlags::Register(FlagSet& f) {
  f.String("rules", &rules,
           "a MergeRules textproto (rule { pattern: \"REGEX\" kind: ROW }, ...): how the tp slices of matching "
           "params merge; first match wins and these rules take precedence over every other source");
  f.String("preset", &preset,
           "built-in rules: gpt-neox, megatron-deepspeed, bloom, savanna; \"\" detects one from the param names, \"none\" "
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
  f.String("source_option", &source_options, kSourceOptionHelp);
  f.Int("original_vocab_size", &original_vocab_size,
        "unpadded vocabulary size, to strip vocab padding from vocabulary-parallel params (0 = from the "
        "checkpoint's universal_checkpoint_info, else the padding is kept)");
}

const char kSourceOptionHelp[] =
    "options of the source's format as KEY=VALUE,...: zero0_order=hf_trainer (a ZeRO stage 0 source whose "
    "optimizer order the files leave ambiguous: groups as the Hugging Face Trainer builds them)";

absl::Status ParseSourceOptions(absl::string_view text, std::map<std::string, std::string>* out) {
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    if (kv.first.empty() || kv.second.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--source_option: expected KEY=VALUE, got '", item, "'"));
    }
    (*out)[kv.first] = kv.second;
  }
  return absl::OkStatus();
}

absl::StatusOr<ops::SourceOptions> ZeroSourceFlags::Options(int threads, int64_t divisible_by) const {
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
  UCP_RETURN_IF_ERROR(ParseSourceOptions(source_options, &o.format_options));
  o.num_threads = threads;
  o.make_vocab_size_divisible_by = divisible_by;
  return o;
}

// ---- shared by convert, reshard, export ----

void CommandFlags::RegisterThreadsFlag(FlagSet& f, const std::string& help) { f.Int32("num_threads", &threads_, help); }

void CommandFlags::RegisterReadWriteFlags(FlagSet& f) {
  RegisterUnsafePickleFlag(f, &allow_unsafe_pickle);
  RegisterFsyncFlag(f, &fsync);
  f.Bool("timings", &timings,
         "print on stderr where the time went, by phase (open and plan, read and merge, input CRC, output CRC, "
         "digest, write, writeback, fsync, commit), in seconds summed over the threads; each MPI rank prints its own");
}

void CommandFlags::RegisterSharedFlags(FlagSet& f) {
  RegisterProgressFlag(f, &progress);
  src.Register(f);
  RegisterReadWriteFlags(f);
}

absl::StatusOr<ops::SourceOptions> CommandFlags::SourceOptions(int threads, int64_t divisible_by) const {
  auto o = src.Options(threads, divisible_by);
  if (!o.ok()) return o.status();
  o->allow_unsafe_pickles = allow_unsafe_pickle;
  return o;
}

// ---- convert ----

void ConvertFlags::Register(FlagSet& f) {
  ops::ConvertOptions& o = options;
  f.String("input_folder", &o.input_folder, "the ZeRO checkpoint: a tag folder (global_stepN) or a root with `latest`",
           true);
  f.String("output_folder", &o.output_folder,
           "the universal checkpoint folder to create (e.g. ROOT/global_stepN_universal); ROOT/latest_universal is "
           "written last",
           true);
  src.Register(f);
  f.String("to", &o.to,
           "what to write: universal (DeepSpeed's universal checkpoint, the default) or dcp (PyTorch Distributed "
           "Checkpoint: model and Adam state as an FSDP2 model's get_model_state_dict / get_optimizer_state_dict "
           "give them, for torch.distributed.checkpoint.load at any world size)");
  f.String("names", &o.names,
           "--to=dcp: the entries' names: checkpoint (the checkpoint's own) or hf (Hugging Face transformers names, "
           "as `ucp export --names=hf` gives the weights: fused tensors split, each optimizer state alike)");
  f.String("qkv_layout", &o.hf.qkv_layout,
           "--names=hf: Megatron-DeepSpeed's fused query_key_value rows (grouped, block, auto), as for ucp export");
  f.String("hf_config", &hf_config_, "--names=hf: config.json values KEY=JSON;KEY=JSON, as for ucp export");
  f.Bool("explain", &explain, "print every param's merge kind, the source of that rule and why");
  RegisterProgressFlag(f, &progress);
  RegisterThreadsFlag(f, "threads converting params in parallel (0 = all cores)");
  f.String("target_ds_version", &o.write.target_ds_version,
           "the DeepSpeed version that will load the output (\"\" = the checkpoint's ds_version); a ZeRO-3 "
           "checkpoint is refused for versions whose stage-3 universal loader cannot read it");
  f.Bool("overwrite", &o.write.overwrite, "replace an existing output folder (only once the new one is complete)");
  f.String("digest", &digest_,
           "the digest of every file in the manifest: xxh3 (XXH3-128: catches corruption, not tampering; fast) or "
           "sha256");
  f.Bool("single_mp_rank_file", &o.write.single_mp_rank_file,
         "for a plain (non-pipeline) module saved at tp > 1: write one mp_rank_00_model_states.pt (tp rank 0's, "
         "mp_world_size 1, no module tensors) instead of every tp rank's, so that DeepSpeed can universal-load the "
         "folder at a smaller tp too (its loader merges several mp_rank files only for Megatron's key names); "
         "the other tp ranks' client state (rng states) is not kept. =false: copy every tp rank's file, as "
         "ds_to_universal.py does (DeepSpeed then loads the folder only at the source's tp or larger). A ZeRO-3 "
         "checkpoint saved at tp > 1 likewise: mp rank 0's zero_pp_rank_D_mp_rank_00_model_states.pt of every dp "
         "rank as a tp=1 job's (loads at ZeRO-3 tp 1, and at tp > 1 for AutoTP), or =false every mp rank's "
         "(loads at the source's tp only)");
  f.Int32("dry_run", &o.dry_run_ranks,
          "write nothing; print the plan split over this many ranks (under mpirun: the job's ranks): units, bytes "
          "and input files per rank");
  f.Bool("dry_run_units", &o.dry_run_units, "with --dry_run: every unit with its outputs and the inputs it reads");
  f.Int("make_vocab_size_divisible_by", &divisible_by_,
        "recorded in the manifest for later resharding (0 = from the checkpoint's args)");
  f.Int32("num_extract_workers", &extract_workers_,
          "ds_to_universal.py compatibility: used as --num_threads when that is not set");
  f.Ignored("num_merge_workers", true, "ds_to_universal.py compatibility: accepted, ucp has a single pass");
  f.Bool("keep_temp_folder", &keep_,
         "ds_to_universal.py compatibility: ucp writes no temporary fragment files; with this flag a failed run "
         "keeps its staging folder for inspection");
  f.NegatedBool("no_strict", &o.strict,
                "accept --rules patterns that match no param (by default they are an error, as ds_to_universal.py's "
                "strict mode treats unused patterns)");
  f.Ignored("inject_missing_state", false,
            "ds_to_universal.py compatibility: ucp never requires universal_checkpoint_info, nothing to inject");
  RegisterReadWriteFlags(f);
  RegisterUpdateLatestFlag(f, &o.write.update_latest);
}

absl::Status ConvertFlags::Finish() {
  ops::ConvertOptions& o = options;
  int threads = threads_;
  if (threads == 0 && extract_workers_ > 0) threads = extract_workers_;
  auto state = SourceOptions(threads, divisible_by_);
  if (!state.ok()) return state.status();
  o.state = *state;
  FinishWrite(threads, o.write);
  o.write.keep_temp_folder = keep_;
  auto digest_kind = ParseDigestKind(digest_);
  if (!digest_kind.ok() || *digest_kind == DigestKind::kNone) {
    return absl::InvalidArgumentError(absl::StrCat("--digest=", digest_, ": expected xxh3 or sha256"));
  }
  o.write.digest = *digest_kind;
  UCP_RETURN_IF_ERROR(ParseHfConfig(hf_config_, &o.hf));
  return absl::OkStatus();
}

std::string ConvertReport(const ConvertFlags& flags, const ops::ConvertResult& result) {
  std::string out;
  if (flags.explain) absl::StrAppend(&out, result.explain, "\n");
  absl::StrAppend(&out, result.summary);
  absl::StrAppend(&out, "wrote ", flags.options.output_folder, ": ", result.stats.params, " params, ",
                  result.stats.files, " files, ", result.stats.bytes, " bytes\n");
  return out;
}

// ---- reshard ----

void ReshardFlags::Register(FlagSet& f) {
  ops::ReshardOptions& o = options;
  f.String("input_folder", &o.input_folder,
           "a universal folder (or a root with latest_universal) or a ZeRO folder (tag folder or root with latest)",
           true);
  f.String("output_folder", &o.output_folder, "ROOT/TAG of the checkpoint to write; ROOT/latest is written last",
           true);
  f.Int32("tp", &o.write.target.tp, "target tensor-parallel degree");
  f.Int32("pp", &o.write.target.pp, "target pipeline-parallel degree");
  f.Int32("dp", &o.write.target.dp, "target data-parallel degree");
  f.Int32("zero_stage", &o.write.zero_stage, "ZeRO stage of the output, 1, 2 or 3 (0 = the source's)");
  f.String("format", &o.format,
           "the target format's registry name, e.g. deepspeed_zero0 (DeepSpeed without ZeRO); \"\" = the one for the "
           "source and --zero_stage");
  f.Int("sub_group_size", &o.write.sub_group_size,
        "ZeRO-3 output: the target job's zero_optimization.sub_group_size (0 = the source's, else 1e9)");
  f.Int32("expert_parallel", &o.write.expert_parallel,
          "mixture-of-experts output: expert parallel degree, >= --tp (0 = the source's if it divides --tp x --dp, "
          "else the largest below it that divides --tp x --dp and every layer's expert count, else the smallest "
          "from --tp up)");
  f.String("target_ds_version", &o.write.target_ds_version,
           "the DeepSpeed version (0.12 to 0.19.6, master) whose layout to write: group_paddings per rank from 0.16.4 "
           "(\"\" = the source's ds_version)");
  f.String("partition_method", &o.write.partition_method,
           "pipeline stage partitioning, as PipelineModule's partition_method: parameters, uniform or type:REGEX "
           "(\"\" = the one recorded in the checkpoint's args, else parameters)");
  f.Int("make_vocab_size_divisible_by", &o.write.make_vocab_size_divisible_by,
        "vocabulary padding multiple per tp rank, as Megatron's flag (0 = from the checkpoint's args or manifest)");
  f.Int32("num_layers", &o.write.num_layers,
          "number of PipelineModule layer specs (0 = up to the last layer holding tensors)");
  f.String("layer_types", &layer_types_,
           "class names of layers for type:REGEX partitioning, as INDEX:NAME,... (default: guessed from param names)");
  RegisterThreadsFlag(f, "threads writing files in parallel (0 = all cores)");
  f.Int("piece_bytes", &o.write.piece_bytes,
        "an optimizer file of more than twice this size is written in pieces of about this size by several threads "
        "or ranks at once (0 = 128 MiB, -1 = never); the output's bytes do not depend on it");
  f.Bool("overwrite", &o.write.overwrite, "replace an existing output folder (only once the new one is complete)");
  f.Int32("dry_run", &o.dry_run_ranks,
          "write nothing; print the plan split over this many ranks (under mpirun: the job's ranks): units, bytes "
          "and input files per rank");
  f.Bool("dry_run_units", &o.dry_run_units, "with --dry_run: every unit with its outputs and the inputs it reads");
  f.Bool("verify_checksums", &o.verify_checksums, "check a ucp universal source against its manifest's sha256s first");
  RegisterSharedFlags(f);
  RegisterUpdateLatestFlag(f, &o.write.update_latest);
}

absl::Status ReshardFlags::Finish() {
  ops::ReshardOptions& o = options;
  for (absl::string_view item : absl::StrSplit(layer_types_, ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(item, ':');
    int idx = 0;
    if (!absl::SimpleAtoi(kv.first, &idx) || kv.second.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--layer_types: expected INDEX:NAME, got '", item, "'"));
    }
    o.write.layer_types[idx] = kv.second;
  }
  auto zs = SourceOptions(threads_, o.write.make_vocab_size_divisible_by);
  if (!zs.ok()) return zs.status();
  o.zero_source = *zs;
  FinishWrite(threads_, o.write);
  return absl::OkStatus();
}

std::string ReshardReport(const ReshardFlags& flags, const ops::ReshardResult& result) {
  const ops::ReshardOptions& o = flags.options;
  std::string out = absl::StrCat("resharded ", result.source_kind, " checkpoint ", o.input_folder, " (",
                                 result.source.ToString(), ") -> ", o.output_folder, " (", o.write.target.ToString(),
                                 ", ZeRO stage ", result.write.layout.zero_stage, "): ", result.write.files,
                                 " files, ", result.write.bytes, " bytes\n");
  if (!result.write.layout.parts.empty() && o.write.target.pp > 1) {
    absl::StrAppend(&out, "pipeline stages (", result.write.layout.partition_method, "):");
    for (int s = 0; s < o.write.target.pp; ++s) {
      absl::StrAppend(&out, " [", result.write.layout.parts[s], ", ", result.write.layout.parts[s + 1], ")");
    }
    absl::StrAppend(&out, "\n");
  }
  return out;
}

// ---- export ----

void ExportFlags::Register(FlagSet& f) {
  ops::ExportOptions& o = options;
  f.String("input_folder", &o.input_folder,
           "a ZeRO checkpoint (tag folder, or root with latest) or a universal folder", true);
  f.String("output_folder", &o.output_folder,
           "the folder to create (written in a staging folder, renamed when complete)", true);
  f.String("format", &format_, "safetensors (model.safetensors) or torch (pytorch_model.bin, torch.save format)");
  f.String("weights", &o.weights,
           "fp32: the fp32 master weights (what zero_to_fp32.py exports); lp: the module weights in the training "
           "dtype (from a universal checkpoint, which has none: the masters rounded to the lp dtype)");
  f.String("dtype", &o.dtype,
           "source: each tensor as zero_to_fp32.py gives it (trainable params in the weights' dtype, frozen params as "
           "stored, buffers as float32 with --weights=fp32); fp32, bf16, fp16: every floating tensor converted");
  f.String("max_shard_size", &max_shard_,
           "largest shard, as huggingface_hub reads it (5GB = 5e9 bytes; KB, MB, GB, TB; or bytes; 0 = one file)");
  f.String("names", &o.names,
           "checkpoint: the checkpoint's names (zero_to_fp32.py's; a PipelineModule's module paths "
           "<layer>.<name> and tied_modules.<key>.<name>); hf: Hugging Face transformers names + config.json "
           "(presets gpt-neox: GPTNeoXForCausalLM, megatron-deepspeed: LlamaForCausalLM)");
  f.String("qkv_layout", &o.hf.qkv_layout,
           "--names=hf, Megatron-DeepSpeed's fused query_key_value rows: grouped (per kv head [nkv, q heads + 2, d], "
           "versions before 676a482c), block ([Q_r; K_r; V_r] per tp rank, 676a482c and later), auto (block when the "
           "args have ds_sequence_parallel_fpdt, else grouped)");
  f.String("hf_config", &hf_config_,
           "--names=hf: config.json values, KEY=JSON;KEY=JSON (e.g. rotary_pct=0.25;use_parallel_residual=true); "
           "they win over what the checkpoint says");
  f.Bool("exclude_frozen_parameters", &o.exclude_frozen_parameters, "leave frozen params out (zero_to_fp32.py's flag)");
  RegisterThreadsFlag(f, "threads writing in parallel (0 = all cores)");
  f.Bool("overwrite", &o.write.overwrite, "replace an existing output folder (only once the new one is complete)");
  RegisterSharedFlags(f);
}

absl::Status ExportFlags::Finish() {
  ops::ExportOptions& o = options;
  if (format_ == "safetensors") {
    o.format = "safetensors";
  } else if (format_ == "torch" || format_ == "pt" || format_ == "bin") {
    o.format = "torch";
  } else {
    return absl::InvalidArgumentError(absl::StrCat("--format must be safetensors or torch, not '", format_, "'"));
  }
  auto size = writers::ParseShardSize(max_shard_);
  if (!size.ok()) return size.status();
  o.write.max_shard_size = *size;
  UCP_RETURN_IF_ERROR(ParseHfConfig(hf_config_, &o.hf));
  auto state = SourceOptions(threads_, 0);
  if (!state.ok()) return state.status();
  o.state = *state;
  FinishWrite(threads_, o.write);
  return absl::OkStatus();
}

std::string ExportReport(const ExportFlags& flags, const ops::ExportResult& result) {
  return absl::StrCat("wrote ", flags.options.output_folder, ": ", result.stats.params, " tensors",
                      result.architecture.empty() ? "" : absl::StrCat(" (", result.architecture, ")"), ", ",
                      result.stats.files, " files, ", result.stats.bytes, " bytes\n");
}

}  // namespace ucp::cli
