// `ucp export`.
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "ops/export.h"
#include "format/torch/torch_file.h"
#include "tools/cli.h"
#include "tools/commands.h"
#include "tools/progress.h"

namespace ucp::tools {

int RunExport(int argc, char** argv) {
  FlagSet f("export",
            "any checkpoint (ZeRO at any tp/pp/dp, or universal) -> plain weights for inference and the Hugging Face "
            "Hub: safetensors or pytorch_model.bin shards (+ index json), zero_to_fp32.py's tensors and names by "
            "default, or Hugging Face transformers names and config.json");
  ops::ExportOptions o;
  ZeroSourceFlags src;
  int threads = 0;
  std::string format = "safetensors", max_shard = "5GB", hf_config;
  f.String("input_folder", &o.input_folder,
           "a ZeRO checkpoint (tag folder, or root with latest) or a universal folder", true);
  f.String("output_folder", &o.output_folder, "the folder to create (written in a staging folder, renamed when complete)",
           true);
  f.String("format", &format, "safetensors (model.safetensors) or torch (pytorch_model.bin, torch.save format)");
  f.String("weights", &o.weights,
           "fp32: the fp32 master weights (what zero_to_fp32.py exports); lp: the module weights in the training "
           "dtype (from a universal checkpoint, which has none: the masters rounded to the lp dtype)");
  f.String("dtype", &o.dtype,
           "source: each tensor as zero_to_fp32.py gives it (trainable params in the weights' dtype, frozen params as "
           "stored, buffers as float32 with --weights=fp32); fp32, bf16, fp16: every floating tensor converted");
  f.String("max_shard_size", &max_shard,
           "largest shard, as huggingface_hub reads it (5GB = 5e9 bytes; KB, MB, GB, TB; or bytes; 0 = one file)");
  f.String("names", &o.names,
           "checkpoint: the checkpoint's names (zero_to_fp32.py's; a PipelineModule's module paths "
           "<layer>.<name> and tied_modules.<key>.<name>); hf: Hugging Face transformers names + config.json "
           "(presets gpt-neox: GPTNeoXForCausalLM, megatron-deepspeed: LlamaForCausalLM)");
  f.String("qkv_layout", &o.hf.qkv_layout,
           "--names=hf, Megatron-DeepSpeed's fused query_key_value rows: grouped (per kv head [nkv, q heads + 2, d], "
           "versions before 676a482c), block ([Q_r; K_r; V_r] per tp rank, 676a482c and later), auto (block when the "
           "args have ds_sequence_parallel_fpdt, else grouped)");
  f.String("hf_config", &hf_config,
           "--names=hf: config.json values, KEY=JSON;KEY=JSON (e.g. rotary_pct=0.25;use_parallel_residual=true); "
           "they win over what the checkpoint says");
  f.Bool("exclude_frozen_parameters", &o.exclude_frozen_parameters, "leave frozen params out (zero_to_fp32.py's flag)");
  f.Int32("num_threads", &threads, "threads writing in parallel (0 = all cores)");
  f.Bool("overwrite", &o.write.overwrite, "replace an existing output folder (only once the new one is complete)");
  std::string progress_flag = "auto";
  RegisterProgressFlag(f, &progress_flag);
  src.Register(f);
  bool allow_unsafe = false;
  RegisterUnsafePickleFlag(f, &allow_unsafe);
  std::vector<std::string> positional;
  if (std::optional<int> done = ParseOrExit(f, argc, argv, &positional)) return *done;
  if (allow_unsafe) torch::SetAllowUnsafePickles(true);
  if (format == "safetensors") {
    o.write.format = writers::ExportFormat::kSafetensors;
  } else if (format == "torch" || format == "pt" || format == "bin") {
    o.write.format = writers::ExportFormat::kTorch;
  } else {
    return Fail(absl::InvalidArgumentError(absl::StrCat("--format must be safetensors or torch, not '", format, "'")));
  }
  auto size = writers::ParseShardSize(max_shard);
  if (!size.ok()) return Fail(size.status());
  o.write.max_shard_size = *size;
  for (absl::string_view item : absl::StrSplit(hf_config, ';', absl::SkipEmpty())) {
    const size_t eq = item.find('=');
    if (eq == absl::string_view::npos || eq == 0) {
      return Fail(absl::InvalidArgumentError(absl::StrCat("--hf_config: expected KEY=JSON, got '", item, "'")));
    }
    o.hf.config.emplace_back(std::string(item.substr(0, eq)), std::string(item.substr(eq + 1)));
  }
  auto state = src.Options(threads, 0);
  if (!state.ok()) return Fail(state.status());
  o.state = *state;
  o.write.num_threads = threads;
  auto mode = ParseProgressMode(progress_flag);
  if (!mode.ok()) return Fail(mode.status());
  ProgressPrinter progress("export", *mode);
  o.write.progress = progress.Callback();
  auto result = ops::Export(o);
  if (!result.ok()) return Fail(result.status());
  for (const auto& n : result->notes) std::cerr << "ucp: note: " << n << "\n";
  std::cout << "wrote " << o.output_folder << ": " << result->stats.params << " tensors"
            << (result->architecture.empty() ? "" : absl::StrCat(" (", result->architecture, ")")) << ", "
            << result->stats.files << " files, " << result->stats.bytes << " bytes\n";
  return 0;
}

}  // namespace ucp::tools
