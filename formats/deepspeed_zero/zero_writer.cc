#include "formats/deepspeed_zero/zero_writer.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <variant>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/fs.h"
#include "base/parallel.h"
#include "base/status_macros.h"
#include "deepspeed/checkpoint_files.h"
#include "deepspeed/engine_defaults.h"
#include "deepspeed/tree_copy.h"
#include "format/pickle/accessors.h"
#include "tp/merge.h"
#include "tp/plan_io.h"

namespace ucp::deepspeed_zero {

using writers::Plan;
using writers::Unit;
using writers::UnitResult;
using writers::WriteStats;
using writers::InputRange;
using writers::AddVerifyUnit;
using writers::ExecuteVerifyUnit;
using writers::RunPlan;
using writers::AddUnitResults;
using writers::WriteUnitFile;
using writers::WriteUnitPiece;
using writers::FinishUnitPieces;
using writers::ZeroWriteOptions;
using writers::ZeroRunOptions;

namespace {

using state::ModelInfo;
using state::ParamState;
using state::TensorRole;
using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;
using tp::TensorPlan;

int64_t Numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t x : s) n *= x;
  return n;
}

bool ContainsLayer(const ParamState& p, int layer) {
  if (!p.tied_layers.empty()) {
    return std::find(p.tied_layers.begin(), p.tied_layers.end(), layer) != p.tied_layers.end();
  }
  return p.layer == layer;
}

// The layers a param lives in.
std::vector<int> LayersOf(const ParamState& p) {
  if (!p.tied_layers.empty()) return p.tied_layers;
  return {p.layer};
}

}  // namespace

namespace {

// Chooses the DeepSpeed version whose layout is written (the target's, else
// the source's, else 0.14.4; 0.12 to 0.19.6, master edaa72212, whose ZeRO 1/2
// files are 0.19.5's: stage_1_and_2.py's state_dict and engine.py's save are
// unchanged) and its padding convention.
absl::Status ChooseTargetVersion(const ModelInfo& info, const ZeroWriteOptions& options,
                                 const std::string& source_ds_version, TargetLayout* out) {
  const std::string& version = options.target_ds_version.empty() ? source_ds_version : options.target_ds_version;
  deepspeed::DsVersion v{0, 14, 4};
  if (!version.empty()) {
    UCP_ASSIGN_OR_RETURN(v, deepspeed::ParseDsVersion(version),
                         _.Prepend(options.target_ds_version.empty() ? "the source's ds_version: "
                                                                     : "--target_ds_version: "));
  }
  if (v < deepspeed::DsVersion{0, 12, 0} || deepspeed::DsVersion{0, 19, 6} < v) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DeepSpeed ", version, ": ucp writes the ZeRO 1/2 layouts of DeepSpeed 0.12 to 0.19.6 (master edaa72212)",
        options.target_ds_version.empty() ? " (pass --target_ds_version to choose one)" : ""));
  }
  out->ds_version = options.target_ds_version;
  out->version = v;
  out->autotp_cut = v < deepspeed::DsVersion{0, 19, 6} ? tp::AutoTpCut::kChunk : tp::AutoTpCut::kNearEven;
  out->padding_convention = deepspeed::PaddingConventionOf(v, info.optimizer_kind == state::OptimizerKind::kBf16);
  return absl::OkStatus();
}

// The ZeRO stage written (the option's, else the source's), checked against
// what DeepSpeed can run: stage 1 or 2, the bf16 optimizer at stage 1, a
// pipeline at stage 1, and no pipeline stages for a plain module.
absl::StatusOr<int> ChooseZeroStage(const ModelInfo& info, const ZeroWriteOptions& options, int pp) {
  const int zero_stage = options.zero_stage > 0 ? options.zero_stage : info.zero_stage;
  if (zero_stage != 1 && zero_stage != 2) {
    return absl::InvalidArgumentError(absl::StrCat("ZeRO stage ", zero_stage, ": ucp writes stages 1 and 2"));
  }
  if (info.optimizer_kind == state::OptimizerKind::kBf16 && zero_stage != 1) {
    return absl::InvalidArgumentError("the bf16 optimizer (BF16_Optimizer) partitions like ZeRO stage 1 only");
  }
  if (info.pipeline && zero_stage == 2) {
    return absl::InvalidArgumentError("ZeRO stage 2 cannot run under a PipelineModule (DeepSpeed refuses it)");
  }
  if (!info.pipeline && pp > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("pp=", pp, ": the source is a plain nn.Module, not a PipelineModule, so it has no layers to "
                     "split into pipeline stages"));
  }
  return zero_stage;
}

// Whether a param is written in AutoTP's layout where tp does not divide it
// (uneven widths): the source was saved by AutoTP, or the param's rule says
// so (MergeRule.autotp_widths: a rule of a preset DeepSpeed splits with
// AutoTP only, Preset.tp_split_by_autotp, or of a rules file). Megatron-style
// layouts keep refusing such a tp.
bool AutoTpLayout(const ModelInfo& info, const ParamState& p) { return info.autotp || p.rule.autotp_widths(); }

// Each param's tp slice shape at the target tp, and the padded rows of a
// vocabulary param (padded to a multiple of `divisible_by` * tp). Whole
// tensors of a tp=1 source (ZeRO-3, MoE) have no known tp split: refused at
// tp > 1.
absl::Status PlanSliceShapes(const ModelInfo& info, int tp, int64_t divisible_by, TargetLayout* out) {
  if (tp > 1) {
    std::vector<std::string> unknown;
    for (const auto& p : info.params) {
      if (p.origin == state::kTp1WholeOrigin) unknown.push_back(p.name);
    }
    if (!unknown.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "target tp=", tp, ": ", unknown.size(), " param(s) of the tp=1 source have no tp merge rule (e.g. '",
          unknown.front(), "'): give --rules=FILE or --preset to say how each splits"));
    }
  }
  const size_t n = info.params.size();
  out->slice_shapes.resize(n);
  out->padded_rows.assign(n, 0);
  std::vector<std::vector<std::vector<int64_t>>> uneven(n);  // AutoTP's per-rank shapes
  for (size_t i = 0; i < n; ++i) {
    ParamState p = info.params[i];
    if (tp > 1 && p.has_autotp_cut()) {
      // Held whole by the source (AutoTP before 0.19.5): the target's AutoTP
      // cuts it as from 0.19.5 on, or keeps it whole (below) before.
      p.rule = p.autotp_cut;
      out->rules.resize(n);
      out->rules[i] = p.rule;
    }
    if (tp > 1 && AutoTpLayout(info, p) && tp::AutoTpIsLmHead(p.name) &&
        (p.rule.kind() == COLUMN || p.rule.kind() == VOCAB) && !(out->version < deepspeed::DsVersion{0, 16, 4}) &&
        out->version < deepspeed::DsVersion{0, 19, 5}) {
      // AutoTP training (0.16.4 on) before 0.19.5 (0.16.4 - 0.18.9) keeps the lm_head
      // whole on every tp rank (a real 0.18.9 tp 2 save: [vocab, hidden] on
      // both ranks; its loader refuses a cut one).
      out->whole.resize(n, 0);
      out->whole[i] = 1;
      out->slice_shapes[i] = p.full_shape;
      out->padded_rows[i] = p.full_shape.empty() ? 0 : p.full_shape[0];
      continue;
    }
    if (p.rule.kind() == VOCAB && info.autotp && divisible_by <= 0) {
      // AutoTP does not pad the vocabulary (its lm_head is cut in its own widths).
      out->padded_rows[i] = p.full_shape.empty() ? 0 : p.full_shape[0];
    } else if (p.rule.kind() == VOCAB) {
      if (divisible_by <= 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "param '", p.name, "' is a vocabulary tensor of ", p.full_shape.empty() ? 0 : p.full_shape[0],
            " rows whose padding depends on tp: pass --make_vocab_size_divisible_by (Megatron's default is 128)"));
      }
      out->padded_rows[i] = tp::PaddedVocabSize(p.full_shape[0], divisible_by, tp);
    }
    if (tp > 1 && AutoTpLayout(info, p) && tp::AutoTpIsLmHead(p.name) && p.full_shape.size() == 2 &&
        (p.rule.kind() == COLUMN || p.rule.kind() == VOCAB) && p.full_shape[0] % tp != 0 &&
        out->version < deepspeed::DsVersion{0, 19, 6}) {
      // auto_tp.py before 0.19.6 (_create_column_parallel_layer) cuts such an
      // lm_head by columns (LmHeadLinearAllreduce), and 0.19.5 then trains the
      // final norm's tp copies apart (README, "AutoTP checkpoints").
      return absl::FailedPreconditionError(absl::StrCat(
          "target tp=", tp, ": param '", p.name, "' has a vocabulary of ", p.full_shape[0],
          " rows that tp does not divide: DeepSpeed ", out->version.major, ".", out->version.minor, ".",
          out->version.patch,
          "'s AutoTP cuts such an lm_head by columns (LmHeadLinearAllreduce) and trains it wrong (the tp copies "
          "of the final norm drift apart); ucp does not write that layout. Target DeepSpeed master "
          "(--target_ds_version=0.19.6), which cuts the vocabulary rows, or a tp that divides ",
          p.full_shape[0]));
    }
    const MergeRule& rule = p.rule;
    absl::StatusOr<std::vector<int64_t>> shape =
        tp::SliceShapeFromFull(rule, p.full_shape, tp, out->padded_rows[i], p.name);
    if (!shape.ok() && tp > 1 && AutoTpLayout(info, p)) {
      UCP_ASSIGN_OR_RETURN(uneven[i], tp::AutoTpSliceShapes(rule, p.full_shape, tp, out->padded_rows[i], p.name,
                                                                 out->autotp_cut),
                           _.Prepend(absl::StrCat("target tp=", tp, ": ")));
      shape = uneven[i][0];
    }
    UCP_ASSIGN_OR_RETURN(out->slice_shapes[i], std::move(shape), _.Prepend(absl::StrCat("target tp=", tp, ": ")));
  }
  if (std::any_of(uneven.begin(), uneven.end(), [](const auto& u) { return !u.empty(); })) {
    out->rank_slice_shapes.assign(tp, out->slice_shapes);
    for (size_t i = 0; i < n; ++i) {
      for (int t = 0; t < tp && !uneven[i].empty(); ++t) out->rank_slice_shapes[t][i] = uneven[i][t];
    }
  }
  return absl::OkStatus();
}

// The pipeline layers as DeepSpeed's partitioner sees them: each layer's
// trainable numel at the target tp and its type name (the option's, the
// caller's guess from its tensor names, else "Layer", or "function" for a
// layer without tensors). Every param must have a layer.
absl::StatusOr<std::vector<deepspeed::PipelineLayerInfo>> PipelineLayers(const ModelInfo& info,
                                                                         const ZeroWriteOptions& options,
                                                                         const TargetLayout& out) {
  const int num_layers = options.num_layers > 0 ? options.num_layers : info.num_layers;
  int max_layer = -1;
  for (const auto& p : info.params) {
    for (int l : LayersOf(p)) max_layer = std::max(max_layer, l);
  }
  for (int l : info.module_layers) max_layer = std::max(max_layer, l);
  if (num_layers <= max_layer) {
    return absl::InvalidArgumentError(absl::StrCat("--num_layers=", num_layers, " but layer ", max_layer,
                                                   " holds tensors"));
  }
  std::vector<deepspeed::PipelineLayerInfo> layers(num_layers);
  std::vector<std::vector<std::string>> local_names(num_layers);
  for (size_t i = 0; i < info.params.size(); ++i) {
    const ParamState& p = info.params[i];
    if (p.layer < 0 && p.tied_layers.empty()) {
      if (!p.tied_key.empty()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "param '", p.name, "' belongs to tied module '", p.tied_key,
            "' whose pipeline layers the source does not record (a universal checkpoint written by DeepSpeed): "
            "reshard from the ZeRO checkpoint, or convert it with `ucp convert` first"));
      }
      return absl::InvalidArgumentError(
          absl::StrCat("param '", p.name, "' has no pipeline layer index (expected '<layer>.<name>')"));
    }
    for (int l : LayersOf(p)) {
      if (p.trainable()) layers[l].trainable_numel += Numel(out.slice_shapes[i]);
      local_names[l].push_back(p.local_name);
    }
  }
  for (int l = 0; l < num_layers; ++l) {
    layers[l].type_name = writers::LayerTypeName(options, l, local_names[l]);
  }
  return layers;
}

// Splits the layers into pp stages with the partition method (the option's,
// else the source's, else "parameters"); returns each layer's stage.
absl::StatusOr<std::vector<int>> PartitionStages(const ModelInfo& info, const ZeroWriteOptions& options, int pp,
                                                 TargetLayout* out) {
  UCP_ASSIGN_OR_RETURN(std::vector<deepspeed::PipelineLayerInfo> layers, PipelineLayers(info, options, *out));
  out->partition_method = writers::PartitionMethod(options, info.partition_method);
  UCP_ASSIGN_OR_RETURN(out->parts, deepspeed::PartitionLayers(layers, pp, out->partition_method));
  std::vector<int> stage_of_layer(layers.size(), 0);
  for (int s = 0; s < pp; ++s) {
    for (int l = out->parts[s]; l < out->parts[s + 1]; ++l) stage_of_layer[l] = s;
  }
  return stage_of_layer;
}

// Puts each param in the stages holding its layers (stage 0 without a
// pipeline): a trainable one in its optimizer group there, in flatten order,
// any other among the stage's module params. DeepSpeed 0.14.4 drops a param
// group with no params on a stage (engine._configure_optimizer), so that
// stage's files would number their groups differently from the others'; one
// group list per checkpoint cannot say that, and ZeRO cannot flatten an
// empty group either: refused.
absl::Status AssignStageGroups(const ModelInfo& info, const std::vector<int>& stage_of_layer, int pp,
                               TargetLayout* out) {
  auto stages_of = [&](const ParamState& p) {
    std::set<int> s;
    if (!info.pipeline) {
      s.insert(0);
    } else {
      for (int l : LayersOf(p)) s.insert(stage_of_layer[l]);
    }
    return s;
  };
  out->stage_groups.assign(pp, std::vector<std::vector<int>>(info.num_groups));
  out->stage_module_params.assign(pp, {});
  for (size_t i = 0; i < info.params.size(); ++i) {
    const ParamState& p = info.params[i];
    for (int s : stages_of(p)) {
      if (p.trainable()) {
        if (p.group < 0 || p.group >= info.num_groups) {
          return absl::InvalidArgumentError(absl::StrCat("param '", p.name, "' has group ", p.group, " of ",
                                                         info.num_groups));
        }
        out->stage_groups[s][p.group].push_back(static_cast<int>(i));
      } else {
        out->stage_module_params[s].push_back(static_cast<int>(i));
      }
    }
  }
  for (int s = 0; s < pp; ++s) {
    for (int g = 0; g < info.num_groups; ++g) {
      if (out->stage_groups[s][g].empty()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "pipeline stage ", s, " of pp=", pp, " (", out->partition_method.empty() ? "" : out->partition_method,
            " partitioning) holds no params of optimizer group ", g, " of ", info.num_groups,
            ": DeepSpeed would drop that group on this stage only; choose another pp or partition method"));
      }
    }
  }
  return absl::OkStatus();
}

// The partition layout of every stage's groups over the target dp.
// With AutoTP's uneven widths, every tp rank's own (rank_layouts).
void PlanGroupLayouts(const ModelInfo& info, int pp, TargetLayout* out) {
  auto make = [&](const std::vector<std::vector<int64_t>>& shapes) {
    std::vector<std::vector<deepspeed::ZeroGroupLayout>> layouts(pp);
    for (int s = 0; s < pp; ++s) {
      for (int g = 0; g < info.num_groups; ++g) {
        std::vector<int64_t> numels;
        for (int i : out->stage_groups[s][g]) numels.push_back(Numel(shapes[i]));
        layouts[s].push_back(
            deepspeed::ZeroGroupLayout::Make(std::move(numels), out->topo.dp, out->padding_convention));
      }
    }
    return layouts;
  };
  out->layouts = make(out->slice_shapes);
  out->rank_layouts.clear();
  for (const auto& shapes : out->rank_slice_shapes) out->rank_layouts.push_back(make(shapes));
}

// The layer files and their keys in file order: the recorded module order,
// then the tensors it misses (all of them when none is recorded).
absl::Status PlanLayerFiles(const ModelInfo& info, TargetLayout* out) {
  std::vector<int> module_layers = info.module_layers;
  // A tied module's other layers may be functions (a TiedLayerSpec with a
  // forward_fn has no file); the layers of other params are modules.
  for (const auto& p : info.params) {
    if (!p.tied_layers.empty()) continue;
    for (int l : LayersOf(p)) {
      if (std::find(module_layers.begin(), module_layers.end(), l) == module_layers.end()) module_layers.push_back(l);
    }
  }
  std::sort(module_layers.begin(), module_layers.end());
  for (int l : module_layers) {
    std::vector<int> keys;
    if (!info.module_order.empty()) {
      for (const auto& k : info.module_order) {
        if (k.layer != l) continue;
        const int i = info.IndexOf(k.name);
        if (i < 0) return absl::InvalidArgumentError(absl::StrCat("module key '", k.name, "' is not a known tensor"));
        keys.push_back(i);
      }
    }
    // Tensors the recorded order misses (or all of them when none is recorded).
    for (size_t i = 0; i < info.params.size(); ++i) {
      if (ContainsLayer(info.params[i], l) && std::find(keys.begin(), keys.end(), static_cast<int>(i)) == keys.end()) {
        keys.push_back(static_cast<int>(i));
      }
    }
    out->layer_files.emplace_back(l, std::move(keys));
  }
  return absl::OkStatus();
}

}  // namespace

// Plans in phases: the DeepSpeed version and ZeRO stage written, each
// param's slice shape at the target tp, the pipeline stages, the stages'
// optimizer groups and their partition layouts, the layer files.
absl::StatusOr<TargetLayout> PlanTarget(const ModelInfo& info, const ZeroWriteOptions& options,
                                        const std::string& source_ds_version) {
  TargetLayout out;
  out.topo = options.target;
  UCP_RETURN_IF_ERROR(out.topo.Validate());
  UCP_RETURN_IF_ERROR(ChooseTargetVersion(info, options, source_ds_version, &out));
  const int tp = out.topo.tp;
  const int pp = out.topo.pp;
  UCP_ASSIGN_OR_RETURN(out.zero_stage, ChooseZeroStage(info, options, pp));
  const int64_t divisible_by =
      options.make_vocab_size_divisible_by > 0 ? options.make_vocab_size_divisible_by : info.make_vocab_size_divisible_by;
  UCP_RETURN_IF_ERROR(PlanSliceShapes(info, tp, divisible_by, &out));

  // Pipeline stages.
  std::vector<int> stage_of_layer;
  if (info.pipeline) {
    UCP_ASSIGN_OR_RETURN(stage_of_layer, PartitionStages(info, options, pp, &out));
  }
  UCP_RETURN_IF_ERROR(AssignStageGroups(info, stage_of_layer, pp, &out));
  PlanGroupLayouts(info, pp, &out);
  if (info.pipeline) UCP_RETURN_IF_ERROR(PlanLayerFiles(info, &out));
  return out;
}

absl::StatusOr<TensorPlan> TargetSlice(const state::ModelState& state, const TargetLayout& layout,
                                       int param_index, const std::string& state_name, int rank, bool deferred) {
  const ParamState& p = state.info().params[param_index];
  std::optional<TensorPlan> later = deferred ? state.FullDeferred(p, state_name) : std::nullopt;
  UCP_ASSIGN_OR_RETURN(TensorPlan full, later ? *std::move(later) : state.Full(p, state_name));
  if (full.shape() != p.full_shape) {
    return absl::InvalidArgumentError(absl::StrCat("param '", p.name, "' ", state_name, ": full shape ",
                                                   torch::ShapeString(full.shape()), " differs from ",
                                                   torch::ShapeString(p.full_shape)));
  }
  if (layout.Whole(param_index)) return full.Reshape(layout.SliceShape(param_index, rank));
  UCP_ASSIGN_OR_RETURN(TensorPlan slice,
                       tp::SplitFull(layout.RuleOf(param_index, p.rule), full, layout.topo.tp, rank,
                                     layout.padded_rows[param_index], p.name,
                                     /*autotp_widths=*/!layout.rank_slice_shapes.empty(), layout.autotp_cut));
  return slice.Reshape(layout.SliceShape(param_index, rank));
}

bool AllStatesDeferred(const state::ModelState& state, const std::vector<int>& params) {
  const state::ModelInfo& info = state.info();
  for (int i : params) {
    const ParamState& p = info.params[i];
    if (!state.FullDeferred(p, state::kFp32State)) return false;
    for (const std::string& key : info.state_keys) {
      if (!state.FullDeferred(p, key)) return false;
    }
  }
  return true;
}

absl::StatusOr<std::vector<std::vector<writers::InputRange>>> PieceInputsOf(
    torch::TorchWriter& w, const std::string& name, const pickle::Value& root, int pieces,
    const std::vector<std::pair<size_t, TensorPlan>>& records) {
  std::map<size_t, const TensorPlan*> by_storage;
  for (const auto& [storage, plan] : records) by_storage[storage] = &plan;
  UCP_ASSIGN_OR_RETURN(std::vector<std::vector<torch::TorchWriter::StoragePart>> all_parts,
                       w.PieceParts(name, root, pieces));
  std::vector<std::vector<writers::InputRange>> out(pieces);
  for (int k = 0; k < pieces; ++k) {
    std::map<std::string, int64_t> bytes;  // input file -> bytes the piece reads of it
    std::vector<std::string> order;
    for (const auto& part : all_parts[k]) {
      auto it = by_storage.find(part.storage);
      if (it == by_storage.end()) continue;  // copied from the common state: opened by every piece
      const TensorPlan& plan = *it->second;
      const int64_t isz = static_cast<int64_t>(torch::ItemSize(plan.dtype()));
      const int64_t first = static_cast<int64_t>(part.offset) / isz;
      const int64_t last = (static_cast<int64_t>(part.offset + part.length) + isz - 1) / isz;
      for (const TensorPlan::DeferredUse& use : plan.DeferredIn(first, last - first)) {
        for (const std::string& f : use.source->files) {
          auto [b, inserted] = bytes.emplace(f, 0);
          if (inserted) order.push_back(f);
          b->second += use.count * static_cast<int64_t>(torch::ItemSize(use.source->dtype));
        }
      }
    }
    // Whole files (tensor ""), with the bytes read as the length: the
    // rank that reads most of a file checks it (AssignCheckers).
    for (const std::string& f : order) out[k].push_back({f, "", 0, bytes[f]});
  }
  return out;
}

namespace {

// Writes one target checkpoint; each Write* method is one output file.
class Writer {
 public:
  Writer(const state::ModelState& state, const TargetLayout& layout, int threads, bool writeback)
      : state_(state), info_(state.info()), layout_(layout) {
    // A file's storage records are filled in parallel too: a target with a
    // small dp has a few very large optimizer files.
    write_options_.record_threads = threads > 0 ? threads : DefaultThreadCount();
    write_options_.writeback = writeback;
  }

  // `ds`: the source's DeepSpeed engine state (deepspeed/facet.h), or
  // DeepSpeed's defaults for its model.
  absl::Status Init(const deepspeed::DeepSpeedFacet* ds) {
    ds_ = ds;
    UCP_ASSIGN_OR_RETURN(common_, ds_->OptimizerCommon());
    if (!common_.value || !common_.value->is(Kind::kDict)) {
      return absl::InvalidArgumentError("the source's optimizer state is not a dict");
    }
    return absl::OkStatus();
  }

  // The lp tensor of a param on a tp rank.
  absl::StatusOr<ValuePtr> LpTensor(torch::TorchWriter& w, int i, int rank) const {
    const ParamState& p = info_.params[i];
    if (p.trainable()) {
      UCP_ASSIGN_OR_RETURN(TensorPlan fp32, TargetSlice(state_, layout_, i, state::kFp32State, rank));
      return tp::AddPlanAs(w, fp32, p.lp_dtype);
    }
    UCP_ASSIGN_OR_RETURN(TensorPlan lp, TargetSlice(state_, layout_, i, state::kLpState, rank));
    return tp::AddPlan(w, lp);
  }

  absl::Status WriteLayerFile(int layer, const std::vector<int>& keys, int rank, const std::string& dir,
                              UnitResult* result) const {
    torch::TorchWriter w(write_options_);
    ValuePtr sd = Value::MakeDict(/*ordered_dict=*/true);
    for (int i : keys) {
      UCP_ASSIGN_OR_RETURN(ValuePtr t, LpTensor(w, i, rank));
      sd->DictSet(Value::Str(info_.params[i].local_name), t);
    }
    return Finish(w, deepspeed::LayerFileName(layer, rank), *sd, dir, result);
  }

  absl::Status WriteMpRankFile(int stage, int rank, const std::string& dir, UnitResult* result) const {
    torch::TorchWriter w(write_options_);
    state::FileValue src = ds_->ModelStatesRoot(stage, rank);
    if (!src.value || !src.value->is(Kind::kDict)) {
      return absl::FailedPreconditionError(absl::StrCat("no model states for stage ", stage, " tp rank ", rank));
    }
    ValuePtr out = Value::MakeDict();
    // DeepSpeed >= 0.19.5 records the tp / pp degrees of the saving job.
    const bool cpd = layout_.version >= deepspeed::DsVersion{0, 19, 5};
    for (const auto& [k, v] : src.value->dict_items()) {
      const std::string key = k->is(Kind::kStr) ? k->str() : "";
      if (key == "module") {
        UCP_ASSIGN_OR_RETURN(ValuePtr m, ModuleDict(w, rank));
        out->DictSet(k, m);
      } else if (key == "param_shapes") {
        out->DictSet(k, ParamShapes(stage, rank));
      } else if (key == "buffer_names") {
        out->DictSet(k, BufferNames(stage));
      } else if (key == "frozen_param_shapes" || key == "frozen_param_fragments") {
        if (layout_.zero_stage >= 2) {
          UCP_ASSIGN_OR_RETURN(ValuePtr f, FrozenParams(w, stage, rank, key == "frozen_param_fragments"));
          out->DictSet(k, f);
        } else {
          out->DictSet(k, Value::None());
        }
      } else if (key == "shared_params" && layout_.topo.mp_rank(stage, rank) != 0) {
        // engine._get_shared_params records tied aliases on global rank 0
        // only: every other mp_rank file holds an empty dict, whatever file
        // of the source this one was derived from.
        out->DictSet(k, Value::MakeDict());
      } else if (key == "dp_world_size") {
        out->DictSet(k, Value::Int(layout_.topo.dp));
      } else if (key == "checkpoint_parallel_dimensions" && !cpd) {
        // An older target version writes none (and would take it for client state).
        continue;
      } else if (key == "checkpoint_parallel_dimensions" && v->is(Kind::kDict)) {
        // DeepSpeed >= 0.19.5: the degrees of the job that saved (checked
        // against the files when loading); the source's key order.
        UCP_ASSIGN_OR_RETURN(ValuePtr dims, deepspeed::CopyTreeForWrite(state::FileValue{v, src.file}, w));
        if (dims->DictGet("pp_degree")) dims->DictSet(Value::Str("pp_degree"), Value::Int(layout_.topo.pp));
        if (dims->DictGet("tp_degree")) dims->DictSet(Value::Str("tp_degree"), Value::Int(layout_.topo.tp));
        out->DictSet(k, dims);
      } else if (key == "ds_version" && !layout_.ds_version.empty()) {
        out->DictSet(k, Value::Str(layout_.ds_version));
      } else if (key == "mp_world_size") {
        out->DictSet(k, Value::Int(layout_.topo.mp_world_size()));
        if (cpd && src.value->DictGet("checkpoint_parallel_dimensions") == nullptr) {
          // engine.py:_checkpoint_parallel_metadata (0.19.5), right after mp_world_size.
          ValuePtr dims = Value::MakeDict();
          dims->DictSet(Value::Str("pp_degree"), Value::Int(layout_.topo.pp));
          dims->DictSet(Value::Str("tp_degree"), Value::Int(layout_.topo.tp));
          out->DictSet(Value::Str("checkpoint_parallel_dimensions"), dims);
        }
      } else if (key == "ds_config") {
        UCP_ASSIGN_OR_RETURN(ValuePtr c, DsConfig(state::FileValue{v, src.file}, w));
        out->DictSet(k, c);
      } else if (key == "args") {
        UCP_ASSIGN_OR_RETURN(ValuePtr c, deepspeed::CopyTreeForWrite(state::FileValue{v, src.file}, w));
        UCP_RETURN_IF_ERROR(deepspeed::ApplyArgsChanges(*c, layout_.args_changes));
        out->DictSet(k, c);
      } else if (key == "universal_checkpoint_info" && !layout_.whole.empty()) {
        // An AutoTP job before 0.19.5 saves none; the reader takes the lm_head
        // whole by that (rules/resolve.cc).
        continue;
      } else if (key == "universal_checkpoint_info" && v->is(Kind::kDict) &&
                 v->DictGet("sub_param_shard_widths") != nullptr) {
        UCP_ASSIGN_OR_RETURN(ValuePtr c, deepspeed::CopyTreeForWrite(state::FileValue{v, src.file}, w));
        UCP_RETURN_IF_ERROR(ShardWidthsForTarget(c.get()));
        out->DictSet(k, c);
      } else {
        UCP_ASSIGN_OR_RETURN(ValuePtr c, deepspeed::CopyTreeForWrite(state::FileValue{v, src.file}, w));
        out->DictSet(k, c);
      }
    }
    return Finish(w, deepspeed::MpRankFileName(layout_.topo.mp_rank(stage, rank)), *out, dir, result);
  }

  // AutoTP's `sub_param_shard_widths` (format 0.4) as the target's tp holds
  // them: each sub-param in AutoTP's widths (tp::SplitFull), unless tp is the
  // one they were recorded for (then they are kept, as the split keeps them).
  absl::Status ShardWidthsForTarget(Value* uc_info) const {
    ValuePtr all = uc_info->DictGetPtr("sub_param_shard_widths");
    if (all == nullptr || !all->is(Kind::kDict)) return absl::OkStatus();
    const int tp = layout_.topo.tp;
    std::vector<std::pair<ValuePtr, ValuePtr>> updated;
    for (const auto& [pattern, subs] : all->dict_items()) {
      if (!subs->is(Kind::kList) && !subs->is(Kind::kTuple)) continue;
      std::vector<ValuePtr> out;
      for (const auto& sub : subs->items()) {
        if ((!sub->is(Kind::kList) && !sub->is(Kind::kTuple)) || static_cast<int>(sub->items().size()) == tp) {
          out.push_back(sub);
          continue;
        }
        int64_t size = 0;
        for (const auto& x : sub->items()) {
          if (!x->is(Kind::kInt)) {
            return absl::InvalidArgumentError(absl::StrCat("universal_checkpoint_info.sub_param_shard_widths of ",
                                                           pattern->DebugString(80), ": ", sub->DebugString(80),
                                                           " is not a list of widths"));
          }
          size += x->int_value();
        }
        std::vector<ValuePtr> widths;
        for (int r = 0; r < tp; ++r) widths.push_back(Value::Int(tp::AutoTpWidth(size, tp, r)));
        out.push_back(Value::List(std::move(widths)));
      }
      updated.emplace_back(pattern, Value::List(std::move(out)));
    }
    for (auto& [pattern, widths] : updated) all->DictSet(pattern, std::move(widths));
    return absl::OkStatus();
  }

  std::string OptimName(int stage, int rank, int dp_rank) const {
    return deepspeed::OptimFileName(dp_rank, layout_.topo.mp_rank(stage, rank), info_.bf16_file_prefix);
  }

  absl::Status WriteOptimFile(int stage, int rank, int dp_rank, const std::string& dir, UnitResult* result) const {
    torch::TorchWriter w(write_options_);
    UCP_ASSIGN_OR_RETURN(ValuePtr root, OptimRoot(w, stage, rank, dp_rank));
    return Finish(w, OptimName(stage, rank, dp_rank), *root, dir, result);
  }

  // Piece `piece` of `pieces` of the optimizer file (a unit of its own; see
  // ZeroWriteOptions::piece_bytes): every piece builds the file's whole tree
  // (the same in every process: only metadata, no tensor bytes are read)
  // and writes its share of the storage bytes.
  absl::Status WriteOptimPiece(int stage, int rank, int dp_rank, int piece, int pieces, const std::string& dir,
                               UnitResult* result) const {
    torch::TorchWriteOptions o = write_options_;
    o.record_threads = 1;  // the pieces are the parallelism
    torch::TorchWriter w(o);
    UCP_ASSIGN_OR_RETURN(ValuePtr root, OptimRoot(w, stage, rank, dp_rank, /*deferred=*/true));
    return WriteUnitPiece(w, dir, OptimName(stage, rank, dp_rank), *root, piece, pieces, result);
  }

  // After every piece: the rest of the file around them (plan.h
  // FinishUnitPieces); returns its size.
  absl::StatusOr<int64_t> FinishOptimPieces(int stage, int rank, int dp_rank, const std::vector<UnitResult>& results,
                                            const std::string& dir) const {
    torch::TorchWriter w(write_options_);
    UCP_ASSIGN_OR_RETURN(ValuePtr root, OptimRoot(w, stage, rank, dp_rank, /*deferred=*/true));
    return FinishUnitPieces(w, dir, OptimName(stage, rank, dp_rank), *root, results);
  }

  // Which inputs each of the `pieces` pieces of the optimizer file reads
  // (WriteOptimPiece), by laying the file out from shapes alone; nullopt
  // when the source cannot defer its tensors (then a piece opens every
  // input of the file to build its tree, and lists them all).
  absl::StatusOr<std::optional<std::vector<std::vector<InputRange>>>> PieceInputs(int stage, int rank, int dp_rank,
                                                                                  int pieces) const {
    std::vector<int> params;
    for (int g = 0; g < info_.num_groups; ++g) {
      for (const auto& f : layout_.Layout(stage, g, rank).Fragments(dp_rank)) {
        params.push_back(layout_.stage_groups[stage][g][f.param_index]);
      }
    }
    if (!AllStatesDeferred(state_, params)) return std::optional<std::vector<std::vector<InputRange>>>();
    torch::TorchWriter w(write_options_);
    std::vector<std::pair<size_t, TensorPlan>> records;
    UCP_ASSIGN_OR_RETURN(ValuePtr root, OptimRoot(w, stage, rank, dp_rank, /*deferred=*/true, &records));
    UCP_ASSIGN_OR_RETURN(auto out, PieceInputsOf(w, OptimName(stage, rank, dp_rank), *root, pieces, records));
    return std::optional<std::vector<std::vector<InputRange>>>(std::move(out));
  }

  // The optimizer file's tree, its tensors streamed from the source. With
  // `deferred`, the source's tensors are opened when their bytes are read
  // (TargetSlice); `records` (if given) receives each storage of a state or
  // fp32 partition (TorchWriter storage number, plan).
  // Built in phases, in the order the writer must see the tensors and
  // copied values (it numbers storages as they come): each group's state and
  // slice mappings, the fp32 partitions, the optimizer_state_dict around
  // them, then the root.
  absl::StatusOr<ValuePtr> OptimRoot(torch::TorchWriter& w, int stage, int rank, int dp_rank, bool deferred = false,
                                     std::vector<std::pair<size_t, TensorPlan>>* records = nullptr) const {
    OptimGroupLists lists;
    UCP_RETURN_IF_ERROR(AddGroupStates(w, stage, rank, dp_rank, deferred, records, &lists));
    UCP_RETURN_IF_ERROR(AddFp32Partitions(w, stage, rank, dp_rank, deferred, records, &lists));
    UCP_ASSIGN_OR_RETURN(ValuePtr osd, OptimizerStateDict(w, stage, rank, lists));

    ValuePtr root = Value::MakeDict();
    root->DictSet(Value::Str("optimizer_state_dict"), osd);
    state::FileValue src = ds_->ModelStatesRoot(stage, rank);
    ValuePtr config = src.value ? src.value->DictGetPtr("ds_config") : nullptr;
    if (config) {
      UCP_ASSIGN_OR_RETURN(ValuePtr c, DsConfig(state::FileValue{config, src.file}, w));
      root->DictSet(Value::Str("ds_config"), c);
    }
    UCP_ASSIGN_OR_RETURN(ValuePtr version, TargetDsVersion(w, stage, rank));
    root->DictSet(Value::Str("ds_version"), version);
    return root;
  }

 private:
  // The per-group lists of an optimizer_state_dict being built, and the
  // base optimizer's per-group states ({g: {key: value}}).
  struct OptimGroupLists {
    std::vector<ValuePtr> fp32_groups, paddings, counts, mappings;
    ValuePtr group_states = Value::MakeDict();
  };

  // A value of the source's optimizer state (OptimizerCommon), copied for `w`.
  absl::StatusOr<ValuePtr> CopyCommon(torch::TorchWriter& w, const char* key) const {
    ValuePtr v = common_.value->DictGetPtr(key);
    if (!v) return absl::NotFoundError(absl::StrCat("the source's optimizer state has no '", key, "'"));
    return deepspeed::CopyTreeForWrite(state::FileValue{v, common_.file}, w);
  }

  // The ds_version an optimizer file records: the target's, else the
  // source optimizer state's, else the model states'.
  absl::StatusOr<ValuePtr> TargetDsVersion(torch::TorchWriter& w, int stage, int rank) const {
    if (layout_.ds_version.empty() && common_.value->DictGet("ds_version") == nullptr) {
      return SourceVersion(stage, rank);
    }
    if (layout_.ds_version.empty()) return CopyCommon(w, "ds_version");
    return Value::Str(layout_.ds_version);
  }

  // Per group of dp rank `dp_rank`'s partition: its param_slice_mappings
  // entry, padding, partition count, and base optimizer state (the
  // source's scalars, then the per-element states' partitions).
  absl::Status AddGroupStates(torch::TorchWriter& w, int stage, int rank, int dp_rank, bool deferred,
                              std::vector<std::pair<size_t, TensorPlan>>* records, OptimGroupLists* lists) const {
    for (int g = 0; g < info_.num_groups; ++g) {
      const deepspeed::ZeroGroupLayout& gl = layout_.Layout(stage, g, rank);
      const std::vector<deepspeed::ZeroFragment> frags = gl.Fragments(dp_rank);
      ValuePtr mapping = Value::MakeDict(/*ordered_dict=*/true);
      for (const auto& f : frags) {
        mapping->DictSet(Value::Str(info_.params[layout_.stage_groups[stage][g][f.param_index]].name),
                         pickle::MakeFragmentAddress(f.numel, f.partition_offset));
      }
      lists->mappings.push_back(mapping);
      lists->paddings.push_back(Value::Int(gl.padding(dp_rank)));
      lists->counts.push_back(Value::Int(layout_.topo.dp));
      ValuePtr st = Value::MakeDict();
      for (const std::string& key : info_.scalar_keys) {
        UCP_ASSIGN_OR_RETURN(state::FileValue sv, state_.GroupScalar(g, key));
        if (!sv.value) continue;
        UCP_ASSIGN_OR_RETURN(ValuePtr c, deepspeed::CopyTreeForWrite(sv, w));
        st->DictSet(Value::Str(key), c);
      }
      for (const std::string& key : info_.state_keys) {
        UCP_ASSIGN_OR_RETURN(TensorPlan plan, Partition(stage, rank, dp_rank, g, key, deferred));
        if (records != nullptr) records->emplace_back(w.num_storages(), plan);
        st->DictSet(Value::Str(key), tp::AddPlan(w, plan));
      }
      lists->group_states->DictSet(Value::Int(g), st);
    }
    return absl::OkStatus();
  }

  // The fp32 partitions, after every group's optimizer states: the order
  // their records have in the file. Making a plan opens its inputs, and
  // an opened input is read ahead and CRC-checked (on the background
  // thread of ExecuteUnits) in the order inputs were opened: opened in
  // file order, the inputs arrive in the order the file's pieces (and
  // records) are written. The tree, and so the bytes, do not depend on it.
  absl::Status AddFp32Partitions(torch::TorchWriter& w, int stage, int rank, int dp_rank, bool deferred,
                                 std::vector<std::pair<size_t, TensorPlan>>* records, OptimGroupLists* lists) const {
    const bool bf16 = info_.optimizer_kind == state::OptimizerKind::kBf16;
    for (int g = 0; g < info_.num_groups; ++g) {
      const deepspeed::ZeroGroupLayout& gl = layout_.Layout(stage, g, rank);
      const int64_t p_numel = gl.partition_numel();
      const int64_t lean = gl.lean_partition_numel(dp_rank);  // Python's group[:p - padding]
      // fp32 partition: the ZeRO optimizer saves group[:lean] of the padded
      // partition (the file holds the whole storage); bf16 saves it whole.
      UCP_ASSIGN_OR_RETURN(TensorPlan fp32, Partition(stage, rank, dp_rank, g, state::kFp32State, deferred));
      if (records != nullptr) records->emplace_back(w.num_storages(), fp32);
      UCP_ASSIGN_OR_RETURN(ValuePtr fp32_value, tp::AddPlanView(w, fp32, bf16 ? p_numel : lean, /*requires_grad=*/true));
      lists->fp32_groups.push_back(fp32_value);
    }
    return absl::OkStatus();
  }

  // base_optimizer_state: the group states and the source's param_groups,
  // each listing its one flat param.
  absl::StatusOr<ValuePtr> BaseOptimizerState(torch::TorchWriter& w, const ValuePtr& group_states) const {
    ValuePtr base = Value::MakeDict();
    base->DictSet(Value::Str("state"), group_states);
    UCP_ASSIGN_OR_RETURN(ValuePtr param_groups, CopyCommon(w, "param_groups"));
    // A ZeRO 1/2 optimizer has one flat param per group: params = [g] (a
    // ZeRO-3 source lists its sub-groups there).
    if (param_groups->is(Kind::kList) && static_cast<int>(param_groups->items().size()) == info_.num_groups) {
      for (int g = 0; g < info_.num_groups; ++g) {
        const ValuePtr& group = param_groups->items()[g];
        if (group->is(Kind::kDict) && group->DictGet("params") != nullptr) {
          group->DictSet(Value::Str("params"), Value::List({Value::Int(g)}));
        }
      }
    }
    base->DictSet(Value::Str("param_groups"), param_groups);
    return base;
  }

  // optimizer_state_dict in DeepSpeed's key order: the loss scaler (ZeRO
  // only), clip_grad, the base optimizer state and fp32 partitions, the
  // ZeRO stage, paddings, partition counts, ds_version, slice mappings.
  absl::StatusOr<ValuePtr> OptimizerStateDict(torch::TorchWriter& w, int stage, int rank,
                                              const OptimGroupLists& lists) const {
    const bool bf16 = info_.optimizer_kind == state::OptimizerKind::kBf16;
    const Value& common = *common_.value;
    UCP_ASSIGN_OR_RETURN(ValuePtr base, BaseOptimizerState(w, lists.group_states));
    ValuePtr osd = Value::MakeDict();
    auto set_common = [&](const char* key) -> absl::Status {
      UCP_ASSIGN_OR_RETURN(ValuePtr v, CopyCommon(w, key));
      osd->DictSet(Value::Str(key), v);
      return absl::OkStatus();
    };
    if (!bf16) {
      UCP_RETURN_IF_ERROR(set_common("loss_scaler"));
      UCP_RETURN_IF_ERROR(set_common("dynamic_loss_scale"));
      UCP_RETURN_IF_ERROR(set_common("overflow"));
    }
    if (common.DictGet("clip_grad") != nullptr) {
      UCP_RETURN_IF_ERROR(set_common("clip_grad"));
    } else {
      // A ZeRO-3 source keeps no clip_grad: the job's gradient_clipping.
      state::FileValue src = ds_->ModelStatesRoot(stage, rank);
      const Value* c = src.value ? src.value->DictGet("ds_config") : nullptr;
      ValuePtr clip = c && c->is(Kind::kDict) ? c->DictGetPtr("gradient_clipping") : nullptr;
      osd->DictSet(Value::Str("clip_grad"),
                   clip && (clip->is(Kind::kFloat) || clip->is(Kind::kInt)) ? clip : Value::Float(0.0));
    }
    osd->DictSet(Value::Str("base_optimizer_state"), base);
    osd->DictSet(Value::Str("single_partition_of_fp32_groups"), Value::List(lists.fp32_groups));
    if (!bf16) {
      const Value* zs = common.DictGet("zero_stage");
      auto stage_value = zs ? pickle::AsZeroStage(*zs) : absl::StatusOr<int>(-1);
      if (zs != nullptr && stage_value.ok() && *stage_value == layout_.zero_stage) {
        UCP_RETURN_IF_ERROR(set_common("zero_stage"));
      } else {
        // Another stage, pickled as the source's Python pickled its own.
        osd->DictSet(Value::Str("zero_stage"),
                     pickle::MakeZeroStage(layout_.zero_stage,
                                           zs != nullptr ? pickle::ZeroStageEncoding(*zs) : pickle::EnumEncoding::kCall));
      }
    }
    osd->DictSet(Value::Str("group_paddings"), Value::List(lists.paddings));
    osd->DictSet(Value::Str("partition_count"), Value::List(lists.counts));
    UCP_ASSIGN_OR_RETURN(ValuePtr version, TargetDsVersion(w, stage, rank));
    osd->DictSet(Value::Str("ds_version"), version);
    osd->DictSet(Value::Str("param_slice_mappings"), Value::List(lists.mappings));
    return osd;
  }

  // The model states' ds_version (a ZeRO-3 source's optimizer state has none).
  ValuePtr SourceVersion(int stage, int rank) const {
    state::FileValue src = ds_->ModelStatesRoot(stage, rank);
    const Value* v = src.value ? src.value->DictGet("ds_version") : nullptr;
    return v != nullptr && v->is(Kind::kStr) ? Value::Str(v->str()) : Value::Str("0.14.4");
  }

  // The flat partition `dp_rank` of group `g` for one state: the fragments
  // of the params it overlaps, then zeros for the alignment padding.
  absl::StatusOr<TensorPlan> Partition(int stage, int rank, int dp_rank, int g, const std::string& key,
                                       bool deferred = false) const {
    const deepspeed::ZeroGroupLayout& gl = layout_.Layout(stage, g, rank);
    std::vector<TensorPlan> pieces;
    int64_t covered = 0;
    torch::DType dtype = torch::DType::kFloat32;
    for (const auto& f : gl.Fragments(dp_rank)) {
      const int i = layout_.stage_groups[stage][g][f.param_index];
      UCP_ASSIGN_OR_RETURN(TensorPlan slice, TargetSlice(state_, layout_, i, key, rank, deferred));
      UCP_ASSIGN_OR_RETURN(TensorPlan flat, slice.Reshape({slice.numel()}));
      UCP_ASSIGN_OR_RETURN(TensorPlan piece, flat.FlatRange(f.param_offset, f.numel));
      dtype = piece.dtype();
      pieces.push_back(std::move(piece));
      covered += f.numel;
    }
    if (covered < gl.partition_numel()) pieces.push_back(TensorPlan::Zeros(dtype, {gl.partition_numel() - covered}));
    if (pieces.size() == 1) return pieces[0];
    return TensorPlan::Cat(pieces, 0);
  }

  ValuePtr ParamShapes(int stage, int rank) const {
    std::vector<ValuePtr> groups;
    for (int g = 0; g < info_.num_groups; ++g) {
      ValuePtr d = Value::MakeDict(/*ordered_dict=*/true);
      for (int i : layout_.stage_groups[stage][g]) {
        d->DictSet(Value::Str(info_.params[i].name), pickle::MakeTorchSize(layout_.SliceShape(i, rank)));
      }
      groups.push_back(d);
    }
    return Value::List(groups);
  }

  // engine._get_buffer_names: the persistent buffers of this stage's module,
  // in module order; a PipelineModule registers tied_modules before its layers.
  ValuePtr BufferNames(int stage) const {
    std::vector<ValuePtr> names, untied;
    for (int i : layout_.stage_module_params[stage]) {
      const ParamState& p = info_.params[i];
      if (p.role != TensorRole::kBuffer) continue;
      (p.tied_key.empty() ? untied : names).push_back(Value::Str(p.name));
    }
    names.insert(names.end(), untied.begin(), untied.end());
    return Value::List(std::move(names));
  }

  absl::StatusOr<ValuePtr> FrozenParams(torch::TorchWriter& w, int stage, int rank, bool fragments) const {
    ValuePtr d = Value::MakeDict(/*ordered_dict=*/true);
    for (int i : layout_.stage_module_params[stage]) {
      const ParamState& p = info_.params[i];
      if (p.role != TensorRole::kFrozen) continue;
      if (fragments) {
        UCP_ASSIGN_OR_RETURN(ValuePtr t, LpTensor(w, i, rank));
        d->DictSet(Value::Str(p.name), t);
      } else {
        d->DictSet(Value::Str(p.name), pickle::MakeTorchSize(layout_.SliceShape(i, rank)));
      }
    }
    return d;
  }

  // The plain module's state dict on a tp rank (non-pipeline checkpoints).
  absl::StatusOr<ValuePtr> ModuleDict(torch::TorchWriter& w, int rank) const {
    if (info_.pipeline) return Value::None();
    ValuePtr sd = Value::MakeDict(/*ordered_dict=*/true);
    std::vector<int> order;
    for (const auto& k : info_.module_order) {
      const int i = info_.IndexOf(k.name);
      if (i >= 0) order.push_back(i);
    }
    for (size_t i = 0; i < info_.params.size(); ++i) {
      if (std::find(order.begin(), order.end(), static_cast<int>(i)) == order.end()) order.push_back(static_cast<int>(i));
    }
    for (int i : order) {
      UCP_ASSIGN_OR_RETURN(ValuePtr t, LpTensor(w, i, rank));
      sd->DictSet(Value::Str(info_.params[i].name), t);
    }
    // nn.Module.state_dict() leaves the module versions in the OrderedDict's
    // `_metadata` attribute, which load_state_dict passes to each module; it
    // depends on the module tree only, so the source's carries over.
    state::FileValue src = ds_->ModelStatesRoot(0, rank);
    const Value* module = src.value ? src.value->DictGet("module") : nullptr;
    if (module != nullptr && module->is(Kind::kDict) && module->dict_state()) {
      UCP_ASSIGN_OR_RETURN(ValuePtr metadata,
                           deepspeed::CopyTreeForWrite(state::FileValue{module->dict_state(), src.file}, w));
      sd->set_dict_state(std::move(metadata));
    }
    return sd;
  }

  // ds_config with the target's ZeRO stage and, when a global batch size is
  // recorded, gradient accumulation steps that keep it at the new dp.
  absl::StatusOr<ValuePtr> DsConfig(const state::FileValue& src, torch::TorchWriter& w) const {
    UCP_ASSIGN_OR_RETURN(ValuePtr c, deepspeed::CopyTreeForWrite(src, w));
    if (!c->is(Kind::kDict)) return c;
    if (const Value* z = c->DictGet("zero_optimization"); z != nullptr && z->is(Kind::kDict)) {
      ValuePtr zc = c->DictGetPtr("zero_optimization");
      if (zc->DictGet("stage") != nullptr) zc->DictSet(Value::Str("stage"), Value::Int(layout_.zero_stage));
    }
    // An AutoTP job's tp is the topology's (engine.py cuts the model over
    // tensor_parallel.autotp_size ranks): the job that loads this checkpoint.
    if (ValuePtr tpc = c->DictGetPtr("tensor_parallel"); tpc && tpc->is(Kind::kDict) && tpc->DictGet("autotp_size")) {
      tpc->DictSet(Value::Str("autotp_size"), Value::Int(layout_.topo.tp));
    }
    if (ValuePtr ck = c->DictGetPtr("checkpoint"); ck && ck->is(Kind::kDict) && ck->DictGet("load_universal")) {
      ck->DictSet(Value::Str("load_universal"), Value::Bool(false));
    }
    const Value* tbs = c->DictGet("train_batch_size");
    const Value* micro = c->DictGet("train_micro_batch_size_per_gpu");
    if (tbs != nullptr && micro != nullptr && tbs->is(Kind::kInt) && micro->is(Kind::kInt) && micro->int_value() > 0) {
      const int64_t per_step = micro->int_value() * layout_.topo.dp;
      if (tbs->int_value() % per_step == 0) {
        c->DictSet(Value::Str("gradient_accumulation_steps"), Value::Int(tbs->int_value() / per_step));
      }
    }
    return c;
  }

  static absl::Status Finish(torch::TorchWriter& w, const std::string& name, const Value& root,
                             const std::string& dir, UnitResult* result) {
    return WriteUnitFile(w, dir, name, root, result);
  }

  const state::ModelState& state_;
  const ModelInfo& info_;
  const TargetLayout& layout_;
  torch::TorchWriteOptions write_options_;
  const deepspeed::DeepSpeedFacet* ds_ = nullptr;
  state::FileValue common_;
};

class ZeroPlan : public Plan {
 public:
  ZeroPlan(const state::ModelState& state, TargetLayout layout, const ZeroWriteOptions& options)
      : state_(state),
        layout_(std::move(layout)),
        writer_(state, layout_, options.num_threads, options.fsync),
        info_(state.info()),
        piece_bytes_(options.piece_bytes) {}

  absl::Status Build(const std::string& ds_version) {
    UCP_ASSIGN_OR_RETURN(ds_, deepspeed::FacetOrDefaults(state_, ds_version, &owned_facet_));
    UCP_RETURN_IF_ERROR(writer_.Init(ds_));
    // Every output file is one unit of work.
    const state::Topology& t = layout_.topo;
    auto slice_bytes = [&](int i, bool lp) {
      const ParamState& p = info_.params[i];
      return Numel(layout_.slice_shapes[i]) *
             static_cast<int64_t>(torch::ItemSize(lp || !p.trainable() ? p.lp_dtype : torch::DType::kFloat32));
    };
    // What each param's tensors read in the source (every output file that
    // holds a slice of the param reads them).
    // The module files (layer, mp_rank) read only the lp weight, made from
    // the fp32 master weight of a trainable param.
    std::vector<std::vector<InputRange>> inputs(info_.params.size()), lp_inputs(info_.params.size());
    for (size_t i = 0; i < info_.params.size(); ++i) {
      const ParamState& p = info_.params[i];
      inputs[i] = state_.Inputs(p);
      lp_inputs[i] = state_.StateInputs(p, p.trainable() ? state::kFp32State : state::kLpState);
    }
    auto params_inputs = [&](const std::vector<int>& params, bool lp = false) {
      std::vector<InputRange> out;
      std::set<std::tuple<std::string, std::string, int64_t>> seen;
      for (int i : params) {
        for (const InputRange& r : lp ? lp_inputs[i] : inputs[i]) {
          if (seen.insert({r.path, r.tensor, r.offset}).second) out.push_back(r);
        }
      }
      return out;
    };
    for (size_t l = 0; l < layout_.layer_files.size(); ++l) {
      const auto& [layer, keys] = layout_.layer_files[l];
      int64_t bytes = 0;
      for (int i : keys) bytes += slice_bytes(i, true);
      const std::vector<InputRange> in = params_inputs(keys, /*lp=*/true);
      for (int r = 0; r < t.tp; ++r) {
        Add(LayerJob{static_cast<int>(l), r}, deepspeed::LayerFileName(layer, r), bytes, in);
      }
    }
    for (int s = 0; s < t.pp; ++s) {
      int64_t bytes = 4096;
      std::vector<int> module;
      if (!info_.pipeline) {
        for (size_t i = 0; i < info_.params.size(); ++i) {
          bytes += slice_bytes(static_cast<int>(i), true);
          module.push_back(static_cast<int>(i));
        }
      }
      std::vector<InputRange> in = params_inputs(module, /*lp=*/true);
      for (int r = 0; r < t.tp; ++r) {
        std::vector<InputRange> with_source = in;
        const std::string from = ds_->ModelStatesPath(s, r);
        if (!from.empty()) with_source.push_back({from, "", 0, -1});
        Add(MpRankJob{s, r}, deepspeed::MpRankFileName(t.mp_rank(s, r)), bytes, std::move(with_source));
      }
    }
    const int64_t per_element = 4 * (1 + static_cast<int64_t>(info_.state_keys.size()));
    for (int s = 0; s < t.pp; ++s) {
      for (int d = 0; d < t.dp; ++d) {
        for (int r = 0; r < t.tp; ++r) {
          UCP_RETURN_IF_ERROR(AddOptimUnits(s, r, d, per_element, params_inputs));
        }
      }
    }
    if (AddVerifyUnit(state_, &units_)) jobs_.push_back(VerifyJob{});
    return absl::OkStatus();
  }

  // The units of the optimizer file of (stage s, tp rank r, dp rank d).
  template <typename ParamsInputs>
  absl::Status AddOptimUnits(int s, int r, int d, int64_t per_element, const ParamsInputs& params_inputs) {
    const state::Topology& t = layout_.topo;
    int64_t bytes = 0;
    std::vector<int> params;
    for (int g = 0; g < info_.num_groups; ++g) {
      bytes += layout_.Layout(s, g, r).partition_numel() * per_element;
      for (const auto& f : layout_.Layout(s, g, r).Fragments(d)) {
        params.push_back(layout_.stage_groups[s][g][f.param_index]);
      }
    }
    const std::vector<InputRange> in = params_inputs(params);
    // A large file is cut into pieces of about piece_bytes_ (at least
    // two), each a unit (writers::OptimPieces). Each piece lists the inputs
    // of its bytes (PieceInputs lays the file out without opening them),
    // or, from a source that cannot defer its tensors, all of the file's
    // inputs.
    const int pieces = writers::OptimPieces(bytes, piece_bytes_);
    const std::string file = deepspeed::OptimFileName(d, t.mp_rank(s, r), info_.bf16_file_prefix);
    if (pieces == 1) {
      Add(OptimJob{s, r, d}, file, bytes, in);
      return absl::OkStatus();
    }
    split_.push_back(OptimJob{s, r, d});
    UCP_ASSIGN_OR_RETURN(auto piece_inputs, writer_.PieceInputs(s, r, d, pieces));
    for (int k = 0; k < pieces; ++k) {
      Add(OptimPieceJob{{s, r, d}, k, pieces}, file, bytes / pieces, piece_inputs ? (*piece_inputs)[k] : in);
      units_.back().name = absl::StrCat("file ", file, " piece ", k + 1, " of ", pieces);
    }
    return absl::OkStatus();
  }

  absl::Status Prepare(const std::string& staging) const override { return absl::OkStatus(); }

  absl::Status Execute(size_t i, const std::string& staging, UnitResult* result) const override {
    const Job& job = jobs_[i];
    if (const auto* j = std::get_if<LayerJob>(&job)) {
      const auto& [layer, keys] = layout_.layer_files[j->layer_file];
      return writer_.WriteLayerFile(layer, keys, j->tp, staging, result);
    }
    if (const auto* j = std::get_if<MpRankJob>(&job)) return writer_.WriteMpRankFile(j->stage, j->tp, staging, result);
    if (const auto* j = std::get_if<OptimJob>(&job)) {
      return writer_.WriteOptimFile(j->stage, j->tp, j->dp, staging, result);
    }
    if (const auto* j = std::get_if<OptimPieceJob>(&job)) {
      return writer_.WriteOptimPiece(j->file.stage, j->file.tp, j->file.dp, j->piece, j->pieces, staging, result);
    }
    return ExecuteVerifyUnit(state_, units_[i]);  // VerifyJob
  }

  absl::StatusOr<WriteStats> Finish(const std::vector<UnitResult>& results, const std::string& staging) const override {
    WriteStats stats;
    AddUnitResults(results, &stats);
    // The files written in pieces: everything around the pieces' bytes.
    for (const OptimJob& f : split_) {
      UCP_ASSIGN_OR_RETURN(int64_t size, writer_.FinishOptimPieces(f.stage, f.tp, f.dp, results, staging));
      stats.files += 1;
      stats.bytes += size;
    }
    return stats;
  }

  std::string latest_file() const override { return deepspeed::kLatestFile; }
  const state::CheckpointState* source() const override { return &state_; }
  const TargetLayout& layout() const { return layout_; }

 private:
  // What a unit writes: one file, one piece of an optimizer file, or the
  // check of the source's inputs no unit reads (AddVerifyUnit).
  struct LayerJob {
    int layer_file;  // index into layout_.layer_files
    int tp;
  };
  struct MpRankJob {
    int stage, tp;
  };
  struct OptimJob {
    int stage, tp, dp;
  };
  struct OptimPieceJob {
    OptimJob file;
    int piece, pieces;
  };
  struct VerifyJob {};
  using Job = std::variant<LayerJob, MpRankJob, OptimJob, OptimPieceJob, VerifyJob>;
  void Add(Job job, std::string file, int64_t bytes, std::vector<InputRange> inputs) {
    Unit u;
    u.name = absl::StrCat("file ", file);
    u.outputs.push_back(std::move(file));
    u.inputs = std::move(inputs);
    u.bytes = bytes;
    jobs_.push_back(job);
    units_.push_back(std::move(u));
  }

  const state::ModelState& state_;
  std::unique_ptr<deepspeed::DeepSpeedFacet> owned_facet_;
  const deepspeed::DeepSpeedFacet* ds_ = nullptr;
  TargetLayout layout_;
  Writer writer_;
  const ModelInfo& info_;
  const int64_t piece_bytes_;
  std::vector<Job> jobs_;
  std::vector<OptimJob> split_;  // the optimizer files written in pieces, finished by Finish
};

}  // namespace

absl::StatusOr<std::unique_ptr<Plan>> PlanZero(const state::ModelState& state, const ZeroWriteOptions& options,
                                               TargetLayout* layout) {
  const int stage = options.zero_stage > 0 ? options.zero_stage : state.info().zero_stage;
  // The other DeepSpeed training-state targets are formats of their own
  // (formats/deepspeed_zero3, formats/deepspeed_moe); the registry picks.
  if (state.info().expert_parallel > 0 || stage == 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the ZeRO stage 1/2 writer does not write ",
        state.info().expert_parallel > 0 ? "a native mixture-of-experts model" : "ZeRO stage 3",
        " (formats/deepspeed_moe, formats/deepspeed_zero3 do)"));
  }
  const std::string source_version = deepspeed::SourceDsVersion(state);
  // bf16 + ZeRO-1 with fp32 gradient accumulation runs under BF16_Optimizer
  // (engine.py _do_optimizer_sanity_check), whose layout ucp writes only
  // from a BF16_Optimizer source.
  if (stage == 1 && state.info().optimizer_kind == state::OptimizerKind::kZero &&
      state.info().lp_dtype == torch::DType::kBFloat16 && deepspeed::FacetOf(state) != nullptr) {
    state::FileValue root = deepspeed::FacetOf(state)->ModelStatesRoot(0, 0);
    const Value* config = root.value && root.value->is(Kind::kDict) ? root.value->DictGet("ds_config") : nullptr;
    const Value* types = config && config->is(Kind::kDict) ? config->DictGet("data_types") : nullptr;
    const Value* accum = types && types->is(Kind::kDict) ? types->DictGet("grad_accum_dtype") : nullptr;
    if (accum != nullptr && accum->is(Kind::kStr) &&
        (accum->str() == "fp32" || accum->str() == "float32" || accum->str() == "float")) {
      return absl::FailedPreconditionError(
          "target ZeRO stage 1 with bf16 weights and data_types.grad_accum_dtype fp32: DeepSpeed runs that job "
          "with BF16_Optimizer, whose files ucp writes only from a BF16_Optimizer checkpoint; use --zero_stage=2 "
          "(or a job config with bf16 gradient accumulation)");
    }
  }
  UCP_ASSIGN_OR_RETURN(TargetLayout target, PlanTarget(state.info(), options, source_version));
  target.args_changes = deepspeed::TargetArgsChanges(state, target.topo, &target.padded_rows);
  if (layout != nullptr) *layout = target;
  const std::string target_version = target.ds_version;
  auto plan = std::make_unique<ZeroPlan>(state, std::move(target), options);
  UCP_RETURN_IF_ERROR(plan->Build(target_version));
  return std::unique_ptr<Plan>(std::move(plan));
}

absl::StatusOr<ZeroWriteResult> WriteZeroCheckpoint(const state::ModelState& state,
                                                    const std::string& output_folder,
                                                    const ZeroWriteOptions& options) {
  ZeroWriteResult result;
  UCP_ASSIGN_OR_RETURN(std::unique_ptr<Plan> plan, PlanZero(state, options, &result.layout));
  UCP_ASSIGN_OR_RETURN(WriteStats stats, RunPlan(*plan, output_folder, ZeroRunOptions(options)));
  result.files = stats.files;
  result.bytes = stats.bytes;
  return result;
}

}  // namespace ucp::deepspeed_zero
