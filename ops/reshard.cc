#include "ops/reshard.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/fs.h"
#include "base/leftovers.h"
#include "base/status_macros.h"
#include "ops/model_folder.h"
#include "ops/trainer_folder.h"
#include "ops/training_state.h"
#include "deepspeed/facet.h"
#include "format/torch/mapped_file.h"
#include "format/pickle/accessors.h"
#include "rules/presets.h"

namespace ucp::ops {

absl::Status ValidateReshardFlags(const ReshardOptions& o) {
  auto bad = [](const std::string& what) { return absl::InvalidArgumentError(what); };
  if (o.output_folder.empty()) return bad("--output_folder is empty");
  if (o.input_folder.empty()) return bad("--input_folder is empty");
  if (o.write.target.tp < 1 || o.write.target.pp < 1 || o.write.target.dp < 1) {
    return bad(absl::StrCat("--tp, --pp and --dp must be >= 1, got tp=", o.write.target.tp, " pp=", o.write.target.pp,
                            " dp=", o.write.target.dp));
  }
  if (o.write.zero_stage < 0 || o.write.zero_stage > 3) {
    return bad(absl::StrCat("--zero_stage=", o.write.zero_stage, ": expected 1, 2 or 3 (0 = the source's)"));
  }
  if (o.write.make_vocab_size_divisible_by < 0) {
    return bad(absl::StrCat("--make_vocab_size_divisible_by=", o.write.make_vocab_size_divisible_by,
                            ": expected >= 1 (0 = from the checkpoint)"));
  }
  if (o.write.num_layers < 0) return bad(absl::StrCat("--num_layers=", o.write.num_layers, ": expected >= 0"));
  if (o.write.num_threads < 0 || o.zero_source.num_threads < 0) {
    return bad(absl::StrCat("--num_threads=", std::min(o.write.num_threads, o.zero_source.num_threads),
                            ": expected >= 0 (0 = all cores)"));
  }
  if (o.dry_run_ranks < 0) return bad(absl::StrCat("--dry_run=", o.dry_run_ranks, ": expected >= 0"));
  return absl::OkStatus();
}

absl::Status ValidateTargetAgainstModel(const state::ModelState& state, const ReshardOptions& o) {
  const int tp = o.write.target.tp;
  // Attention heads split over tp ranks (Megatron, GPT-NeoX): a tp that does
  // not divide them gives a checkpoint no training can load. The counts: the
  // checkpoint's args, then those the source knows otherwise (a Hugging Face
  // folder's config.json).
  std::vector<state::ModelInfo::TpDivisor> divisors;
  if (const pickle::Value* args = deepspeed::ArgsOf(state)) {
    for (const char* key : {"num_attention_heads", "num_heads", "n_head", "num_key_value_heads", "num_query_groups"}) {
      const pickle::Value* v = args->DictGet(key);
      // A single head cannot be split either: heads = 1 at tp > 1 is refused.
      if (v == nullptr || !v->is(pickle::Kind::kInt) || !v->fits_int64() || v->int_value() < 1) continue;
      if (std::string(key) == "num_query_groups") {
        const pickle::Value* gqa = args->DictGet("group_query_attention");
        if (gqa == nullptr || !gqa->bool_value()) continue;
      }
      divisors.push_back({key, v->int_value(), "from the checkpoint's args"});
    }
  }
  divisors.insert(divisors.end(), state.info().tp_divisors.begin(), state.info().tp_divisors.end());
  for (const state::ModelInfo::TpDivisor& d : divisors) {
    if (d.count % tp != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tp=", tp, " does not divide the model's ", d.name, " = ", d.count, " (", d.from, ")",
          d.count == 1 ? ": a single attention head cannot be split over tensor-parallel ranks" : ""));
    }
  }
  // Layer specs: at least the layers that hold tensors, at most a bounded
  // number of trailing layers without any.
  const state::ModelInfo& info = state.info();
  if (o.write.num_layers > 0 && info.pipeline) {
    constexpr int kMaxExtraLayers = 1024;
    const int64_t most = static_cast<int64_t>(info.num_layers) + kMaxExtraLayers;
    if (o.write.num_layers > most) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--num_layers=", o.write.num_layers, ": the checkpoint's layers end at ", info.num_layers,
          "; at most ", kMaxExtraLayers, " trailing layers without tensors are accepted (", most, ")"));
    }
  }
  if (o.write.num_layers > 0 && !info.pipeline) {
    return absl::InvalidArgumentError(
        absl::StrCat("--num_layers=", o.write.num_layers, ": the source is not a pipeline (PipelineModule) checkpoint"));
  }
  return absl::OkStatus();
}

namespace {
absl::StatusOr<ReshardResult> ReshardImpl(const ReshardOptions& options, Leftovers* left);

}  // namespace

absl::StatusOr<ReshardResult> Reshard(const ReshardOptions& options) {
  Leftovers left;
  return RunCheckingInputs<ReshardResult>(options.cluster, /*dry_run=*/options.dry_run_ranks > 0,
                                         [&] { return ReshardImpl(options, &left); });
}

namespace {
absl::StatusOr<ReshardResult> ReshardImpl(const ReshardOptions& options, Leftovers* left) {
  UCP_RETURN_IF_ERROR(ValidateReshardFlags(options));
  // A reshard to tp=1 splits nothing: a tp=1 source needs no merge rules.
  SourceOptions source = options.zero_source;
  if (options.write.target.tp == 1) source.tp1_whole_tensors = true;
  source.verify_checksums = source.verify_checksums || options.verify_checksums;
  UCP_ASSIGN_OR_RETURN(OpenedSource src, OpenSource(options.input_folder, source, options.cluster));
  if (options.write.target.tp > 1) {
    // Whole tensors of a tp=1 source that nothing decided: the rules given
    // now say how they split, or the reshard stops here.
    UCP_ASSIGN_OR_RETURN(src.state, rules::DecideUndecided(std::move(src.state), options.zero_source.rules,
                                                           src.dir, options.write.target.tp));
  }
  const state::ModelState* state = src.state.get();
  UCP_RETURN_IF_ERROR(ValidateTargetAgainstModel(*state, options));
  ReshardResult result;
  result.source_kind = std::string(src.format->kind());
  result.source = state->info().source_topology;
  result.notes = state->info().notes;
  // The model's family for the notes and the layer class names below: the
  // preset named, else detected from the names once ("" when none matches).
  // --preset=none only keeps a preset's merge rules out: the notes and class
  // names describe the model whatever decides its merges.
  std::string preset = options.zero_source.rules.preset;
  if (preset.empty() || preset == rules::kNoPreset) {
    std::vector<std::string> names;
    for (const auto& p : state->info().params) names.push_back(p.name);
    preset = rules::DetectPreset(names).value_or("");
  }
  for (std::string& n : TpSummedNotes(*state, preset, options.write.target.tp)) {
    result.notes.push_back(std::move(n));
  }
  writers::ZeroWriteOptions write = options.write;
  write.inputs = {src.dir};
  // The class names the model's preset gives its pipeline layers.
  if (!write.layer_type_name) write.layer_type_name = rules::LayerTypeNamerFor(preset);
  // The target format: the one named, else the registry's pick for the
  // model (ZeRO 1/2, ZeRO-3, native MoE).
  absl::StatusOr<TrainingStatePlan> planned = PlanTrainingState(*state, write, options.format);
  if (options.cluster != nullptr) UCP_RETURN_IF_ERROR(AgreeOnStatus(*options.cluster, planned.status()));
  UCP_RETURN_IF_ERROR(planned.status());
  result.write.layout = planned->layout;
  result.notes.insert(result.notes.end(), planned->layout.notes.begin(), planned->layout.notes.end());
  writers::Plan& plan = *planned->plan;
  if (options.dry_run_ranks > 0) {
    result.plan = writers::DescribePlan(plan, options.cluster ? options.cluster->size() : options.dry_run_ranks,
                                        options.dry_run_units);
    return result;
  }
  const writers::RunOptions& run = planned->run;
  UCP_ASSIGN_OR_RETURN(std::string trainer_dir, TrainerFolderInput(options.input_folder, src.dir));
  if (!trainer_dir.empty()) {
    if (options.cluster != nullptr && options.cluster->size() > 1) {
      return absl::UnimplementedError(absl::StrCat(
          options.input_folder, " is a Hugging Face Trainer checkpoint folder: under mpirun reshard its ",
          Basename(src.dir), " folder (the Trainer's files are then not written), or run without mpirun"));
    }
    const state::Topology& t = options.write.target;
    const std::string tag = Basename(src.dir);
    UCP_ASSIGN_OR_RETURN(writers::WriteStats stats,
                         WriteTrainerFolder(plan, run, options.output_folder, tag, trainer_dir, {tag, "latest"},
                                            t.tp * t.pp * t.dp, source.allow_unsafe_pickles, &result.trainer_files));
    result.trainer_folder = options.output_folder;
    result.notes.insert(result.notes.end(), stats.notes.begin(), stats.notes.end());
    result.write.files = stats.files;
    result.write.bytes = stats.bytes;
    left->Keep(std::move(src.state));
    left->Keep(std::move(planned->plan));
    return result;
  }
  // The model's config.json (and what from_pretrained reads beside it) goes
  // beside the new tags: from the Hugging Face folder imported, or from
  // beside the source's tags (ops/model_folder.h).
  UCP_ASSIGN_OR_RETURN(std::string model_dir, ModelFilesSource(result.source_kind, src.dir));
  UCP_ASSIGN_OR_RETURN(writers::WriteStats stats,
                       RunPlanWithModelFiles(plan, options.output_folder, run, options.cluster, model_dir));
  result.notes.insert(result.notes.end(), stats.notes.begin(), stats.notes.end());
  result.write.files = stats.files;
  result.write.bytes = stats.bytes;
  left->Keep(std::move(src.state));
  left->Keep(std::move(planned->plan));
  return result;
}

}  // namespace

}  // namespace ucp::ops
