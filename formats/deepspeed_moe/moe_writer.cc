#include "formats/deepspeed_moe/moe_writer.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/fs.h"
#include "base/status_macros.h"
#include "deepspeed/checkpoint_files.h"
#include "deepspeed/client_args.h"
#include "deepspeed/engine_defaults.h"
#include "deepspeed/layout_math.h"
#include "deepspeed/tree_copy.h"
#include "deepspeed/zero_target_parts.h"
#include "formats/deepspeed_moe/moe_state.h"
#include "format/pickle/accessors.h"
#include "tp/merge.h"
#include "tp/plan_io.h"

namespace ucp::deepspeed_moe {

using writers::Plan;
using writers::Unit;
using writers::UnitResult;
using writers::WriteStats;
using writers::InputRange;
using writers::AddVerifyUnit;
using writers::ExecuteVerifyUnit;
using writers::AddUnitResults;
using writers::WriteUnitFile;
using writers::WriteUnitPiece;
using writers::FinishUnitPieces;
using writers::ZeroWriteOptions;

namespace {

using state::ModelInfo;
using state::ParamState;
using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;
using tp::TensorPlan;

int64_t Numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t x : s) n *= x;
  return n;
}

// One optimizer group at the target, as one ep rank holds it.
struct TargetGroup {
  bool expert = false;
  // Per ep rank (one entry for a non-expert group): param indices into
  // ModelInfo::params and the names the files give them (local ids).
  std::vector<std::vector<int>> params;
  std::vector<std::vector<std::string>> names;
  deepspeed::ZeroGroupLayout layout;
};

class MoePlan : public Plan {
 public:
  MoePlan(const state::ModelState& state, const ZeroWriteOptions& options)
      : state_(state), info_(state.info()), options_(options) {}

  absl::Status Build() {
    for (size_t l = 0; l < info_.moe_layers.size(); ++l) moe_layer_of_[info_.moe_layers[l].prefix] = static_cast<int>(l);
    UCP_RETURN_IF_ERROR(CheckTarget());
    UCP_RETURN_IF_ERROR(ReadTargetVersion());
    UCP_RETURN_IF_ERROR(PlanSlices());
    UCP_RETURN_IF_ERROR(PlanStages());
    args_changes_ = deepspeed::TargetArgsChanges(state_, options_.target, &padded_rows_);
    if (!args_changes_.empty()) notes_.push_back(deepspeed::DescribeArgsChanges(args_changes_));
    if (common_layout_) UCP_RETURN_IF_ERROR(CheckBuffersTold());
    UCP_ASSIGN_OR_RETURN(common_, ds_->OptimizerCommon());
    if (!common_.value || !common_.value->is(Kind::kDict)) return absl::InvalidArgumentError("no optimizer state");
    UCP_RETURN_IF_ERROR(PlanGroups());
    AddUnits();
    return absl::OkStatus();
  }

  // What the target is, for the command's report.
  void Summarize(writers::TargetSummary* summary) const {
    summary->topo = options_.target;
    summary->zero_stage = stage_;
    summary->partition_method = partition_method_;
    summary->parts = parts_;
    summary->notes = notes_;
  }

  absl::Status Prepare(const std::string& staging) const override { return absl::OkStatus(); }

  absl::Status Execute(size_t i, const std::string& staging, UnitResult* result) const override {
    const Job& job = jobs_[i];
    if (job.kind == JobKind::kVerify) return ExecuteVerifyUnit(state_, units_[i]);
    torch::TorchWriteOptions wo;
    wo.writeback = options_.fsync;
    torch::TorchWriter w(wo);
    ValuePtr root;
    switch (job.kind) {
      case JobKind::kModel: {
        UCP_ASSIGN_OR_RETURN(root, ModelStates(w, job.stage, job.tp));
        break;
      }
      case JobKind::kExpert: {
        UCP_ASSIGN_OR_RETURN(root, ExpertFile(w, job.layer, job.expert));
        break;
      }
      case JobKind::kExpp: {
        // {'optimizer': None}: ZeRO keeps the optimizer in the zero_pp_rank files.
        root = Value::MakeDict();
        root->DictSet(Value::Str("optimizer"), Value::None());
        break;
      }
      case JobKind::kOptim: {
        UCP_ASSIGN_OR_RETURN(root, OptimFile(w, job.stage, job.dp * tp_ + job.tp));
        if (job.pieces > 1) {
          // Piece `job.piece` of the file: the whole tree, its share of the
          // storage bytes; Finish writes what lies around the pieces.
          return WriteUnitPiece(w, staging, units_[i].outputs[0], *root, job.piece, job.pieces, result);
        }
        break;
      }
      case JobKind::kVerify:
        return absl::InternalError("the verify unit writes no file");  // run above
    }
    return WriteUnitFile(w, staging, units_[i].outputs[0], *root, result);
  }

  absl::StatusOr<WriteStats> Finish(const std::vector<UnitResult>& results, const std::string& staging) const override {
    WriteStats stats;
    AddUnitResults(results, &stats);
    // The optimizer files written in pieces: everything around the pieces' bytes.
    for (size_t i : split_) {
      const Job& job = jobs_[i];
      torch::TorchWriteOptions wo;
      wo.writeback = options_.fsync;
      torch::TorchWriter w(wo);
      UCP_ASSIGN_OR_RETURN(ValuePtr root, OptimFile(w, job.stage, job.dp * tp_ + job.tp));
      UCP_ASSIGN_OR_RETURN(int64_t size, FinishUnitPieces(w, staging, units_[i].outputs[0], *root, results));
      stats.files += 1;
      stats.bytes += size;
    }
    return stats;
  }
  std::string latest_file() const override { return deepspeed::kLatestFile; }
  const state::CheckpointState* source() const override { return &state_; }

 private:
  // What a unit writes: the module file of pipeline stage `stage` and tp rank
  // `tp`, an expert's file (global MoE layer index, expert), the optimizer
  // file of stage `stage`, dp rank `dp` and tp rank `tp`, an expert-parallel
  // rank's placeholder optimizer file in stage `stage` (expert = its ep
  // rank), or the check of the inputs no unit reads (AddVerifyUnit).
  enum class JobKind { kModel, kExpert, kExpp, kOptim, kVerify };
  struct Job {
    JobKind kind;
    int layer = -1;
    int expert = -1;
    int dp = -1;
    int tp = 0;
    int stage = 0;
    int piece = 0, pieces = 1;  // kOptim: piece `piece` of `pieces` (pieces > 1), or the whole file
  };

  // The target: pp_ stages of tp_ x dp_ ranks each (a stage's rank r = dp
  // rank x tp + tp rank, its files under mp rank stage x tp + tp rank), ZeRO
  // stage 1 or 2 (stage_), its expert parallelism inside each stage (ep_ >=
  // tp_, edp_ = a stage's ranks / ep_); the source's DeepSpeed facet (ds_).
  absl::Status CheckTarget() {
    const state::Topology& t = options_.target;
    UCP_RETURN_IF_ERROR(t.Validate());
    UCP_ASSIGN_OR_RETURN(ds_, deepspeed::FacetOrDefaults(state_, options_.target_ds_version, &owned_facet_));
    pp_ = t.pp;
    dp_ = t.dp;
    tp_ = t.tp;
    stage_ = options_.zero_stage > 0 ? options_.zero_stage : info_.zero_stage;
    if (stage_ != 1 && stage_ != 2) {
      return absl::InvalidArgumentError(absl::StrCat("mixture-of-experts target: ZeRO stage ", stage_,
                                                     ": ucp writes native MoE checkpoints at stage 1 or 2"));
    }
    UCP_ASSIGN_OR_RETURN(ep_, TargetExpertParallel(info_, options_));
    edp_ = dp_ * tp_ / ep_;
    return absl::OkStatus();
  }

  // Each param's shape on a target tp rank (slice_shapes_): an expert whole
  // (DeepSpeed does not split experts over tp: enable_expert_tensor_parallelism
  // False), any other tensor cut by its rule as the ZeRO writer cuts it (a
  // vocabulary padded to a multiple of make_vocab_size_divisible_by x tp).
  absl::Status PlanSlices() {
    const size_t n = info_.params.size();
    slice_shapes_.resize(n);
    padded_rows_.assign(n, 0);
    std::vector<std::string> unknown;
    for (size_t i = 0; i < n; ++i) {
      const ParamState& p = info_.params[i];
      slice_shapes_[i] = p.full_shape;
      if (tp_ == 1 || IsExpert(p.name)) continue;
      if (p.origin == state::kTp1WholeOrigin || p.source == UNDECIDED) {
        unknown.push_back(p.name);
        continue;
      }
      if (p.rule.kind() == VOCAB) {
        const int64_t by = options_.make_vocab_size_divisible_by > 0 ? options_.make_vocab_size_divisible_by
                                                                     : info_.make_vocab_size_divisible_by;
        if (by <= 0) {
          return absl::FailedPreconditionError(absl::StrCat(
              "param '", p.name, "' is a vocabulary tensor whose padding depends on tp: pass ",
              "--make_vocab_size_divisible_by (Megatron's default is 128)"));
        }
        padded_rows_[i] = tp::PaddedVocabSize(p.full_shape[0], by, tp_);
      }
      UCP_ASSIGN_OR_RETURN(slice_shapes_[i], tp::SliceShapeFromFull(p.rule, p.full_shape, tp_, padded_rows_[i], p.name),
                           _.Prepend(absl::StrCat("target tp=", tp_, ": ")));
    }
    if (unknown.empty()) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "target tp=", tp_, ": ", unknown.size(), " param(s) outside the experts have no tp merge rule (e.g. '",
        unknown.front(), "'): give --rules=FILE or --preset to say how each splits"));
  }

  // Each param's pipeline stage (stage_of_) and each stage's MoE layers
  // (stage_layers_, indices into ModelInfo::moe_layers in model order). At
  // pp 1 everything is stage 0. At pp > 1 every name must start with its
  // PipelineModule layer index ('4.mlp...'), and the layers are split as
  // PipelineModule._partition_layers splits them (the option's method, else
  // the source's, else "parameters"): "parameters" weighs a layer by the
  // trainable numel of the layer as one rank builds it, its tp slices and
  // the experts of one ep rank (MoE builds num_experts / ep local experts).
  // Every stage must hold a MoE layer (DeepSpeed hangs in its first step
  // otherwise: realds/README.md, "Native MoE at pp > 1"). A tied module's
  // params ('tied_modules.<key>.<name>': a TiedLayerSpec, built by every
  // stage holding one of its layers) carry no layer index: they are taken as
  // the tie of GPT-NeoX and Megatron-DeepSpeed, the first layer (0, which
  // must then hold no other tensor) and a last layer after every named one,
  // and written in the stages of those two layers; a source at pp > 1 must
  // hold them in its first and last stages, else they are refused.
  absl::Status PlanStages() {
    const size_t n = info_.params.size();
    stage_of_.assign(n, 0);
    stage_layers_.assign(pp_, {});
    if (pp_ == 1) {
      for (size_t l = 0; l < info_.moe_layers.size(); ++l) stage_layers_[0].push_back(static_cast<int>(l));
      return absl::OkStatus();
    }
    std::vector<int> layer_of(n, -1);
    int max_layer = -1;
    std::vector<int> tied;  // params of tied modules
    for (size_t i = 0; i < n; ++i) {
      const std::string& name = info_.params[i].name;
      if (IsTiedName(name)) {
        tied.push_back(static_cast<int>(i));
        continue;
      }
      const size_t dot = name.find('.');
      int layer = -1;
      if (dot == std::string::npos || !absl::SimpleAtoi(name.substr(0, dot), &layer) || layer < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "mixture-of-experts target ", options_.target.ToString(), ": param '", name,
            "' has no pipeline layer index (expected '<layer>.<name>', the names of a DeepSpeed PipelineModule): ",
            "only a PipelineModule's checkpoint can be cut into pipeline stages"));
      }
      layer_of[i] = layer;
      max_layer = std::max(max_layer, layer);
    }
    const int num_layers = std::max(options_.num_layers, max_layer + 1 + (tied.empty() ? 0 : 1));
    if (!tied.empty()) {
      UCP_RETURN_IF_ERROR(CheckTiedLayers(tied, layer_of));
      tied_layers_ = {0, num_layers - 1};
    }
    const std::vector<deepspeed::PipelineLayerInfo> layers = PipelineLayers(layer_of, num_layers);
    partition_method_ = writers::PartitionMethod(options_, info_.partition_method);
    UCP_ASSIGN_OR_RETURN(parts_, deepspeed::PartitionLayers(layers, pp_, partition_method_));
    stage_of_layer_.assign(num_layers, 0);
    for (int s = 0; s < pp_; ++s) {
      for (int l = parts_[s]; l < parts_[s + 1]; ++l) stage_of_layer_[l] = s;
    }
    for (size_t i = 0; i < n; ++i) {
      if (layer_of[i] >= 0) stage_of_[i] = stage_of_layer_[layer_of[i]];
    }
    if (!tied.empty()) {
      tied_stages_ = {stage_of_layer_[0]};
      if (stage_of_layer_[num_layers - 1] != tied_stages_[0]) tied_stages_.push_back(stage_of_layer_[num_layers - 1]);
      std::set<std::string> modules;  // 'tied_modules.<key>'
      for (int i : tied) {
        const std::string& name = info_.params[i].name;
        modules.insert(name.substr(0, name.find('.', std::strlen("tied_modules."))));
      }
      notes_.push_back(absl::StrCat(
          "tied module(s) ", absl::StrJoin(modules, ", "), " taken as pipeline layers 0 and ", num_layers - 1,
          " (an embedding tied to the output layer, as GPT-NeoX and Megatron-DeepSpeed tie it; a MoE checkpoint ",
          "does not record which layers share a tied module): written in pipeline stage(s) ",
          absl::StrJoin(tied_stages_, " and ")));
    }
    for (size_t l = 0; l < info_.moe_layers.size(); ++l) {
      const std::string& prefix = info_.moe_layers[l].prefix;
      int layer = -1;
      if (!absl::SimpleAtoi(prefix.substr(0, prefix.find('.')), &layer) || layer < 0 || layer >= num_layers) {
        return absl::InvalidArgumentError(
            absl::StrCat("MoE layer '", prefix, "' has no pipeline layer index (expected '<layer>.<name>')"));
      }
      stage_layers_[stage_of_layer_[layer]].push_back(static_cast<int>(l));
    }
    for (int s = 0; s < pp_; ++s) {
      if (!stage_layers_[s].empty()) continue;
      return absl::FailedPreconditionError(absl::StrCat(
          "mixture-of-experts target ", options_.target.ToString(), ": pipeline stage ", s, " (layers ", parts_[s],
          " to ", parts_[s + 1] - 1, ", ", partition_method_, " partitioning) holds none of the ",
          info_.moe_layers.size(), " MoE layers: DeepSpeed hangs in the first step of such a pipeline (its stages' ",
          "per-group collectives differ); choose another pp or --partition_method"));
    }
    return absl::OkStatus();
  }

  // Tied params are taken as layers 0 and last (PlanStages): layer 0 must
  // hold no other tensor, and a pipeline source must hold them in its first
  // and last stages only.
  absl::Status CheckTiedLayers(const std::vector<int>& tied, const std::vector<int>& layer_of) const {
    const std::string& name = info_.params[tied[0]].name;
    for (size_t i = 0; i < layer_of.size(); ++i) {
      if (layer_of[i] != 0) continue;
      return absl::FailedPreconditionError(absl::StrCat(
          "mixture-of-experts target ", options_.target.ToString(), ": the tied module of '", name,
          "' is taken as the first and last pipeline layers' (an embedding tied to the output layer), but layer 0 ",
          "holds '", info_.params[i].name, "': ucp cannot tell which layers share the tied module"));
    }
    const int source_pp = info_.source_topology.pp;
    for (int i : tied) {
      const ParamState& p = info_.params[i];
      if (source_pp <= 1 || p.stages.empty()) continue;
      std::vector<int> want = {0, source_pp - 1};
      if (p.stages == want) continue;
      return absl::FailedPreconditionError(absl::StrCat(
          "mixture-of-experts target ", options_.target.ToString(), ": tied param '", p.name,
          "' is held by source pipeline stages ", absl::StrJoin(p.stages, ", "), " of ", source_pp,
          ", expected the first and last (an embedding tied to the output layer): ucp cannot tell which layers ",
          "share the tied module"));
    }
    return absl::OkStatus();
  }

  // Whether pipeline stage `s` holds the tied modules (pp > 1).
  bool HoldsTied(int s) const { return std::find(tied_stages_.begin(), tied_stages_.end(), s) != tied_stages_.end(); }

  // Whether param `i` is written in pipeline stage `s` (a tied one in those
  // of its layers).
  bool InStage(int i, int s) const {
    if (pp_ > 1 && IsTiedName(info_.params[i].name)) return HoldsTied(s);
    return stage_of_[i] == s;
  }

  // The pipeline layers as PipelineModule._partition_layers weighs them
  // (`layer_of`: each param's layer): the trainable numel of the layer one
  // target rank builds (its tp slices, its ep rank's num_experts / ep local
  // experts) and its type name (the option's, the caller's guess from its
  // tensor names, else "Layer", or "function" for a layer without tensors).
  std::vector<deepspeed::PipelineLayerInfo> PipelineLayers(const std::vector<int>& layer_of, int num_layers) const {
    std::vector<deepspeed::PipelineLayerInfo> layers(num_layers);
    std::vector<std::vector<std::string>> local_names(num_layers);
    for (size_t i = 0; i < info_.params.size(); ++i) {
      const ParamState& p = info_.params[i];
      // a tied module's param: each of its layers builds it
      const std::vector<int> at = layer_of[i] >= 0 ? std::vector<int>{layer_of[i]} : tied_layers_;
      for (int l : at) local_names[l].push_back(p.name.substr(p.name.find('.') + 1));
      if (!p.trainable()) continue;
      int id = 0;
      const int moe = MoeLayerOf(p.name, &id);
      if (moe >= 0 && id >= info_.moe_layers[moe].num_experts / ep_) continue;  // another ep rank's expert
      for (int l : at) layers[l].trainable_numel += Numel(slice_shapes_[i]);
    }
    for (int l = 0; l < num_layers; ++l) layers[l].type_name = writers::LayerTypeName(options_, l, local_names[l]);
    return layers;
  }

  // Param `i`'s `key` state on target tp rank `t`: the whole tensor at tp 1
  // and for an expert, else its tp slice.
  absl::StatusOr<TensorPlan> Slice(int i, const std::string& key, int t) const {
    const ParamState& p = info_.params[i];
    UCP_ASSIGN_OR_RETURN(TensorPlan full, state_.Full(p, key));
    if (tp_ == 1 || IsExpert(p.name)) return full;
    if (full.shape() != p.full_shape) {
      return absl::InvalidArgumentError(absl::StrCat("param '", p.name, "' ", key, ": full shape ",
                                                     torch::ShapeString(full.shape()), " differs from ",
                                                     torch::ShapeString(p.full_shape)));
    }
    UCP_ASSIGN_OR_RETURN(TensorPlan slice, tp::SplitFull(p.rule, full, tp_, t, padded_rows_[i], p.name));
    return slice.Reshape(slice_shapes_[i]);
  }

  // The DeepSpeed version written (version_) and what its files hold: its
  // padding convention, and engine.py _save_moe_checkpoint at each tag: the
  // common checkpoint state from 0.19.3, ds_autoep_layers from 0.19.2, the
  // expert optimizer placeholders up to 0.19.4, checkpoint_parallel_dimensions
  // from 0.19.5; stage_1_and_2.py before 0.14.5 maps a window of the expert
  // groups only.
  absl::Status ReadTargetVersion() {
    version_ = deepspeed::TargetDsVersion(state_, options_.target_ds_version);
    auto v = deepspeed::ParseDsVersion(version_);
    if (!v.ok()) return absl::InvalidArgumentError(absl::StrCat("ds_version '", version_, "': pass --target_ds_version"));
    convention_ = deepspeed::PaddingConventionOf(*v, false);
    parallel_dims_ = *v >= deepspeed::DsVersion{0, 19, 5};
    common_layout_ = *v >= deepspeed::DsVersion{0, 19, 3};
    autoep_key_ = *v >= deepspeed::DsVersion{0, 19, 2};
    expp_files_ = *v < deepspeed::DsVersion{0, 19, 5};
    window_mappings_ = deepspeed::ExpertMappingsSizedByWorld(*v);
    return absl::OkStatus();
  }

  // 0.19.3+ records buffer_names (and frozen params): a source that does
  // not (DeepSpeed before 0.19.3) cannot tell its module tensors outside the
  // optimizer apart, so they must be none.
  absl::Status CheckBuffersTold() const {
    state::FileValue src = ds_->ModelStatesRoot(0, 0);
    if (!src.value || !src.value->is(Kind::kDict) || src.value->DictGet("buffer_names") != nullptr) {
      return absl::OkStatus();
    }
    std::vector<std::string> untold;
    for (const ParamState& p : info_.params) {
      if (!p.trainable()) untold.push_back(p.name);
    }
    if (untold.empty()) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "writing the mixture-of-experts layout of DeepSpeed ", version_, " needs buffer_names, but the source (",
        deepspeed::SourceDsVersion(state_), ", before 0.19.3) does not say whether its module tensors outside ",
        "the optimizer (", absl::StrJoin(untold, ", "), ") are buffers or frozen params: pass a ",
        "--target_ds_version before 0.19.3"));
  }

  // Every group of every stage at the target (groups_[stage]), in the
  // source's group order. DeepSpeed drops a param group with no params on a
  // stage (engine._configure_optimizer), so a stage's files would number its
  // groups apart from the others': refused.
  absl::Status PlanGroups() {
    groups_.assign(pp_, {});
    for (int s = 0; s < pp_; ++s) {
      std::map<std::string, int> layer_of;  // the stage's MoE layer prefix -> index
      for (int l : stage_layers_[s]) layer_of[info_.moe_layers[l].prefix] = l;
      for (int g = 0; g < info_.num_groups; ++g) {
        const bool expert = g < static_cast<int>(info_.expert_groups.size()) && info_.expert_groups[g];
        TargetGroup tg;
        if (expert) {
          UCP_ASSIGN_OR_RETURN(tg, ExpertGroup(g, s, layer_of));
        } else {
          tg = DenseGroup(g, s);
        }
        if (pp_ > 1 && tg.params[0].empty()) {
          return absl::FailedPreconditionError(absl::StrCat(
              "mixture-of-experts target ", options_.target.ToString(), ": pipeline stage ", s, " (",
              partition_method_, " partitioning) holds no params of optimizer group ", g, " of ", info_.num_groups,
              ": DeepSpeed would drop that group on this stage only; choose another pp or --partition_method"));
        }
        groups_[s].push_back(std::move(tg));
      }
    }
    return absl::OkStatus();
  }

  // Group `g` without experts in stage `s`: its trainable params there,
  // partitioned over dp.
  TargetGroup DenseGroup(int g, int s) const {
    TargetGroup tg;
    std::vector<int64_t> numels;
    tg.params.emplace_back();
    tg.names.emplace_back();
    for (size_t i = 0; i < info_.params.size(); ++i) {
      const ParamState& p = info_.params[i];
      if (!p.trainable() || p.group != g || !InStage(static_cast<int>(i), s)) continue;
      tg.params[0].push_back(static_cast<int>(i));
      tg.names[0].push_back(p.name);
      numels.push_back(Numel(slice_shapes_[i]));
    }
    tg.layout = deepspeed::ZeroGroupLayout::Make(std::move(numels), dp_, convention_);
    return tg;
  }

  // Expert group `g` in stage `s` (`layer_of`: the stage's MoE layers): per
  // target ep rank its experts' params (MoE layers, local experts, each
  // expert's params in global expert 0's order) under local ids, partitioned
  // over the expert data parallel ranks.
  absl::StatusOr<TargetGroup> ExpertGroup(int g, int s, const std::map<std::string, int>& layer_of) const {
    TargetGroup tg;
    tg.expert = true;
    // The (layer, suffix) sequence of one expert, from global expert 0.
    std::vector<std::vector<std::string>> suffixes(info_.moe_layers.size());
    int members = 0;
    for (size_t i = 0; i < info_.params.size(); ++i) {
      const ParamState& p = info_.params[i];
      if (!p.trainable() || p.group != g || !InStage(static_cast<int>(i), s)) continue;
      ++members;
      std::string prefix, suffix;
      int id = 0;
      if (!SplitExpertName(p.name, &prefix, &id, &suffix) || !layer_of.count(prefix)) {
        return absl::InvalidArgumentError(absl::StrCat("param '", p.name, "' of expert group ", g,
                                                       " is not an expert of a known MoE layer"));
      }
      if (id == 0) suffixes[layer_of.at(prefix)].push_back(suffix);
    }
    int expected = 0;
    for (size_t l = 0; l < suffixes.size(); ++l) {
      expected += static_cast<int>(suffixes[l].size()) * info_.moe_layers[l].num_experts;
    }
    if (expected != members) {
      return absl::InvalidArgumentError(absl::StrCat("expert group ", g, " holds ", members, " params, expected ",
                                                     expected, " (every expert the same params)"));
    }
    std::vector<int64_t> numels;
    for (int e = 0; e < ep_; ++e) {
      tg.params.emplace_back();
      tg.names.emplace_back();
      std::vector<int64_t> ns;
      for (size_t l = 0; l < suffixes.size(); ++l) {
        const int local = info_.moe_layers[l].num_experts / ep_;
        for (int k = 0; k < local; ++k) {
          for (const std::string& suffix : suffixes[l]) {
            const std::string global = ExpertName(info_.moe_layers[l].prefix, e * local + k, suffix);
            const int i = info_.IndexOf(global);
            if (i < 0) return absl::InvalidArgumentError(absl::StrCat("expert param '", global, "' is missing"));
            tg.params.back().push_back(i);
            tg.names.back().push_back(ExpertName(info_.moe_layers[l].prefix, k, suffix));
            ns.push_back(Numel(info_.params[i].full_shape));
          }
        }
      }
      if (e == 0) numels = ns;
    }
    tg.layout = deepspeed::ZeroGroupLayout::Make(std::move(numels), edp_, convention_);
    return tg;
  }

  // The units, stage by stage (mp rank m = stage x tp + tp rank): every tp
  // rank's model states (written by a stage's ranks r < tp: ep >= tp), every
  // expert file of the stage's MoE layers, numbered from 0 in each stage
  // (by the ranks r < ep: expert E's ep rank e under mp rank stage x tp +
  // e % tp), every optimizer file, the placeholders, the check of the inputs
  // no unit reads.
  void AddUnits() {
    const std::vector<InputRange> all = deepspeed::EveryParamInput(state_);
    // What each file holds, roughly: the bytes AssignUnits splits the units
    // by over ranks (and the plan and the progress report). Module weights at
    // their lp dtype, optimizer partitions as fp32 masters and states;
    // frames and padding left out.
    int64_t dense_lp = 0, dense_opt = 0, expert_opt = 0;
    std::vector<int64_t> expert_lp(info_.moe_layers.size(), 0);  // expert 0's weights, per MoE layer
    const int64_t per_element = 4 * (1 + static_cast<int64_t>(info_.state_keys.size()));
    for (const ParamState& p : info_.params) {
      const int64_t n = Numel(p.full_shape);
      if (IsExpert(p.name)) {
        if (p.trainable()) expert_opt += n * per_element;
        int id = 0;
        const int moe = MoeLayerOf(p.name, &id);
        if (moe >= 0 && id == 0) expert_lp[moe] += n * static_cast<int64_t>(torch::ItemSize(p.lp_dtype));
        continue;
      }
      dense_lp += n * static_cast<int64_t>(torch::ItemSize(p.lp_dtype));
      if (p.trainable()) dense_opt += n * per_element;
    }
    const int64_t model_bytes = std::max<int64_t>(4096, dense_lp / (tp_ * pp_));
    const int64_t optim_bytes = std::max<int64_t>(4096, dense_opt / (tp_ * pp_ * dp_) + expert_opt / (pp_ * dp_));
    auto add = [&](Job job, std::string file, int64_t bytes) {
      Unit u;
      u.name = absl::StrCat("file ", file);
      u.outputs.push_back(std::move(file));
      u.inputs = all;
      u.bytes = bytes;
      jobs_.push_back(job);
      units_.push_back(std::move(u));
    };
    for (int s = 0; s < pp_; ++s) {
      const int mp = s * tp_;
      for (int t = 0; t < tp_; ++t) {
        add(Job{JobKind::kModel, -1, -1, -1, t, s}, deepspeed::MpRankFileName(mp + t), model_bytes);
      }
      for (size_t k = 0; k < stage_layers_[s].size(); ++k) {
        const int l = stage_layers_[s][k];
        const int local = info_.moe_layers[l].num_experts / ep_;
        for (int e = 0; e < info_.moe_layers[l].num_experts; ++e) {
          add(Job{JobKind::kExpert, l, e, -1, 0, s},
              absl::StrCat("layer_", k, "_expert_", e, "_", deepspeed::MpRankFileName(mp + (e / local) % tp_)),
              std::max<int64_t>(4096, expert_lp[l]));
        }
      }
      for (int d = 0; d < dp_; ++d) {
        for (int t = 0; t < tp_; ++t) {
          // A large file in pieces (writers::OptimPieces), each a unit any
          // thread or rank writes in place, as the ZeRO-1/2 and ZeRO-3
          // targets do. Every piece builds the file's tree, so it lists the
          // inputs of the whole file.
          const std::string file = deepspeed::OptimFileName(d, mp + t, info_.bf16_file_prefix);
          const int pieces = writers::OptimPieces(optim_bytes, options_.piece_bytes);
          if (pieces == 1) {
            add(Job{JobKind::kOptim, -1, -1, d, t, s}, file, optim_bytes);
            continue;
          }
          split_.push_back(jobs_.size());
          for (int k = 0; k < pieces; ++k) {
            add(Job{JobKind::kOptim, -1, -1, d, t, s, k, pieces}, file, optim_bytes / pieces);
            units_.back().name = absl::StrCat("file ", file, " piece ", k + 1, " of ", pieces);
          }
        }
      }
      if (expp_files_) {
        // written by the stage's rank e (expert data parallel rank 0) under its mp rank
        for (int e = 0; e < ep_; ++e) {
          add(Job{JobKind::kExpp, -1, e, -1, 0, s},
              absl::StrFormat("expp_rank_%d_mp_rank_%02d_optim_states.pt", e, mp + e % tp_), 1024);
        }
      }
    }
    if (AddVerifyUnit(state_, &units_)) jobs_.push_back(Job{JobKind::kVerify});
  }

  // The module weight of a param on tp rank `t`: trainable ones are their
  // masters cast.
  absl::StatusOr<ValuePtr> Lp(torch::TorchWriter& w, int i, int t) const {
    const ParamState& p = info_.params[i];
    if (p.trainable()) {
      UCP_ASSIGN_OR_RETURN(TensorPlan fp32, Slice(i, state::kFp32State, t));
      return tp::AddPlanAs(w, fp32, p.lp_dtype);
    }
    UCP_ASSIGN_OR_RETURN(TensorPlan lp, Slice(i, state::kLpState, t));
    return tp::AddPlan(w, lp);
  }

  bool IsExpert(const std::string& name) const { return name.find(kExpertInfix) != std::string::npos; }

  // The MoE layer (index into info_.moe_layers) whose expert param `name`
  // is, with the expert's id in `id`; -1 when it is no expert of a known
  // MoE layer.
  int MoeLayerOf(const std::string& name, int* id) const {
    std::string prefix, suffix;
    if (!SplitExpertName(name, &prefix, id, &suffix)) return -1;
    auto it = moe_layer_of_.find(prefix);
    return it == moe_layer_of_.end() ? -1 : it->second;
  }

  absl::StatusOr<ValuePtr> Copy(const ValuePtr& v, const std::shared_ptr<const torch::TorchFile>& file,
                                torch::TorchWriter& w) const {
    return deepspeed::CopyTreeForWrite(state::FileValue{v, file}, w);
  }

  // The saving job's ds_config at the target's ZeRO stage.
  absl::StatusOr<ValuePtr> DsConfig(const state::FileValue& src, torch::TorchWriter& w) const {
    return deepspeed::RetargetDsConfig(src, w, stage_);
  }

  // The model states of stage `stage`'s tp rank `t` DeepSpeed's engine.py
  // _save_moe_checkpoint writes at the target version, in its key order; the
  // source's client state (keys neither layout has) after them.
  absl::StatusOr<ValuePtr> ModelStates(torch::TorchWriter& w, int stage, int t) const {
    state::FileValue src = ds_->ModelStatesRoot(stage, t);
    if (!src.value || !src.value->is(Kind::kDict)) return absl::FailedPreconditionError("no source model states");
    const Value& s = *src.value;
    auto copy = [&](const char* key, ValuePtr absent) -> absl::StatusOr<ValuePtr> {
      ValuePtr v = s.DictGetPtr(key);
      if (!v) return absent;
      return Copy(v, src.file, w);
    };
    ValuePtr out = Value::MakeDict();
    auto set = [&](const char* key, ValuePtr v) { out->DictSet(Value::Str(key), std::move(v)); };
    UCP_ASSIGN_OR_RETURN(ValuePtr module, Module(src, w, stage, t));
    set("module", module);
    if (common_layout_) {
      UCP_ASSIGN_OR_RETURN(ValuePtr buffers, copy("buffer_names", Value::List({})));
      set("buffer_names", buffers);
      set("optimizer", Value::None());
      set("param_shapes", ParamShapes(s, stage));
      set("frozen_param_shapes", stage_ >= 2 ? Value::MakeDict(/*ordered_dict=*/true) : Value::None());
      UCP_ASSIGN_OR_RETURN(ValuePtr shared, copy("shared_params", Value::MakeDict()));
      set("shared_params", shared);
      set("frozen_param_fragments", stage_ >= 2 ? Value::MakeDict(/*ordered_dict=*/true) : Value::None());
    }
    for (const char* key : {"lr_scheduler", "data_sampler", "random_ltd", "sparse_tensor_module_names", "skipped_steps",
                            "global_steps", "global_samples"}) {
      UCP_ASSIGN_OR_RETURN(ValuePtr v, copy(key, Value::None()));
      set(key, v);
    }
    set("dp_world_size", Value::Int(dp_));
    // the grid's model parallel world: every stage and tp rank of a dp rank
    set("mp_world_size", Value::Int(pp_ * tp_));
    if (common_layout_) {
      if (parallel_dims_) {
        // engine.py:_checkpoint_parallel_metadata (0.19.5), after mp_world_size.
        ValuePtr dims = deepspeed::SingleRankParallelDimensions();
        dims->DictSet(Value::Str("pp_degree"), Value::Int(pp_));
        dims->DictSet(Value::Str("tp_degree"), Value::Int(tp_));
        set("checkpoint_parallel_dimensions", dims);
      }
      state::FileValue config = ds_->SavedDsConfig();
      if (!config.value) {
        return absl::FailedPreconditionError(absl::StrCat(
            "writing the mixture-of-experts layout of DeepSpeed ", version_,
            " needs the training's ds_config, which the source's files do not hold"));
      }
      UCP_ASSIGN_OR_RETURN(ValuePtr c, DsConfig(config, w));
      set("ds_config", c);
      set("ds_version", Value::Str(version_));
    }
    UCP_ASSIGN_OR_RETURN(ValuePtr ne, copy("num_experts", Value::None()));
    if (pp_ > 1 || !ne->is(Kind::kList) || ne->items().size() != info_.moe_layers.size()) {
      // The source's model states hold another count (one pipeline stage's
      // MoE layers), or the target is a pipeline: the experts of each of the
      // stage's MoE layers, in order.
      std::vector<ValuePtr> counts;
      for (int l : stage_layers_[stage]) counts.push_back(Value::Int(info_.moe_layers[l].num_experts));
      ne = Value::List(std::move(counts));
    }
    set("num_experts", ne);
    if (autoep_key_) {
      UCP_ASSIGN_OR_RETURN(ValuePtr v, copy("ds_autoep_layers", Value::None()));
      set("ds_autoep_layers", v);
    }
    if (common_layout_ && s.DictGet("universal_checkpoint_info") != nullptr) {
      UCP_ASSIGN_OR_RETURN(ValuePtr v, copy("universal_checkpoint_info", Value::None()));
      set("universal_checkpoint_info", v);
    }
    UCP_RETURN_IF_ERROR(AddClientState(src, w, out.get()));
    return out;
  }

  // The module state dict of stage `stage`'s tp rank `t`: the stage's
  // non-expert tensors' slices in module order (trainable ones their masters
  // cast to the lp dtype), the source's module metadata.
  absl::StatusOr<ValuePtr> Module(const state::FileValue& src, torch::TorchWriter& w, int stage, int t) const {
    ValuePtr sd = Value::MakeDict(/*ordered_dict=*/true);
    for (const auto& mk : info_.module_order) {
      if (IsExpert(mk.name)) continue;
      const int i = info_.IndexOf(mk.name);
      if (i < 0 || !InStage(i, stage)) continue;
      UCP_ASSIGN_OR_RETURN(ValuePtr lp, Lp(w, i, t));
      sd->DictSet(Value::Str(mk.name), lp);
    }
    if (const Value* v = src.value->DictGet("module"); v != nullptr && v->is(Kind::kDict) && v->dict_state()) {
      UCP_ASSIGN_OR_RETURN(ValuePtr md, Copy(v->dict_state(), src.file, w));
      if (md->is(Kind::kDict) && md->DictGet("_metadata") != nullptr) {
        UCP_ASSIGN_OR_RETURN(ValuePtr meta, StageMetadata(w, stage, t));
        md->DictSet(Value::Str("_metadata"), meta);
      }
      sd->set_dict_state(std::move(md));
    }
    return sd;
  }

  // The module's `_metadata` (torch's per-submodule versions) of stage
  // `stage`'s tp rank `t`: every source stage's entries joined in stage order
  // (the first of a repeated key kept), then at pp > 1 the entries of the
  // stage's layers only, and those not under a layer ('', 'tied_modules').
  absl::StatusOr<ValuePtr> StageMetadata(torch::TorchWriter& w, int stage, int t) const {
    ValuePtr out = Value::MakeDict(/*ordered_dict=*/true);
    std::set<std::string> seen;
    for (int from = 0; from < std::max(1, info_.source_topology.pp); ++from) {
      state::FileValue root = ds_->ModelStatesRoot(from, t);
      const Value* module = root.value && root.value->is(Kind::kDict) ? root.value->DictGet("module") : nullptr;
      if (module == nullptr || !module->dict_state() || !module->dict_state()->is(Kind::kDict)) continue;
      const Value* meta = module->dict_state()->DictGet("_metadata");
      if (meta == nullptr || !meta->is(Kind::kDict)) continue;
      for (const auto& [k, v] : meta->dict_items()) {
        if (!k->is(Kind::kStr) || !seen.insert(k->str()).second) continue;
        const std::string& key = k->str();
        int layer = -1;
        if (pp_ > 1 && absl::SimpleAtoi(key.substr(0, key.find('.')), &layer) &&
            (layer < 0 || layer >= static_cast<int>(stage_of_layer_.size()) || stage_of_layer_[layer] != stage)) {
          continue;
        }
        if (pp_ > 1 && IsTiedName(key) && !HoldsTied(stage)) continue;
        UCP_ASSIGN_OR_RETURN(ValuePtr c, Copy(v, root.file, w));
        out->DictSet(k, c);
      }
    }
    return out;
  }

  // param_shapes: per group, ep rank 0's params under local names (every ep
  // rank lists the same local names), their shapes on a tp rank (every tp
  // rank's alike), as the source `s` wrote them (0.19.5 MoE: plain tuples; a
  // source without param_shapes: tuples too).
  ValuePtr ParamShapes(const Value& s, int stage) const {
    bool tuples = true;
    if (const Value* ps = s.DictGet("param_shapes"); ps && ps->is(Kind::kList) && !ps->items().empty()) {
      const Value& g0 = *ps->items()[0];
      tuples = g0.is(Kind::kDict) && !g0.dict_items().empty() && g0.dict_items()[0].second->is(Kind::kTuple);
    }
    std::vector<ValuePtr> gs;
    for (const TargetGroup& tg : groups_[stage]) {
      ValuePtr d = Value::MakeDict(/*ordered_dict=*/true);
      for (size_t j = 0; j < tg.params[0].size(); ++j) {
        const std::vector<int64_t>& shape = slice_shapes_[tg.params[0][j]];
        ValuePtr sh;
        if (tuples) {
          std::vector<ValuePtr> dims;
          for (int64_t x : shape) dims.push_back(Value::Int(x));
          sh = Value::Tuple(std::move(dims));
        } else {
          sh = pickle::MakeTorchSize(shape);
        }
        d->DictSet(Value::Str(tg.names[0][j]), sh);
      }
      gs.push_back(d);
    }
    return Value::List(std::move(gs));
  }

  // The client state: the source's model-state keys neither layout's engine
  // writes, copied into `out` after the engine's.
  absl::Status AddClientState(const state::FileValue& src, torch::TorchWriter& w, Value* out) const {
    static const std::set<std::string> kEngineKeys = {
        "module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes", "shared_params",
        "frozen_param_fragments", "lr_scheduler", "data_sampler", "random_ltd", "sparse_tensor_module_names",
        "skipped_steps", "global_steps", "global_samples", "dp_world_size", "mp_world_size",
        "checkpoint_parallel_dimensions", "ds_config", "ds_version", "num_experts", "ds_autoep_layers",
        "universal_checkpoint_info"};
    for (const auto& [k, v] : src.value->dict_items()) {
      if (k->is(Kind::kStr) && kEngineKeys.count(k->str())) continue;
      UCP_ASSIGN_OR_RETURN(ValuePtr c, Copy(v, src.file, w));
      if (k->is(Kind::kStr) && k->str() == "args") UCP_RETURN_IF_ERROR(deepspeed::ApplyArgsChanges(*c, args_changes_));
      out->DictSet(k, c);
    }
    return absl::OkStatus();
  }

  // layer_L_expert_E: the expert's weights under global names, in module order.
  absl::StatusOr<ValuePtr> ExpertFile(torch::TorchWriter& w, int layer, int expert) const {
    ValuePtr d = Value::MakeDict();
    const std::string head = absl::StrCat(info_.moe_layers[layer].prefix, kExpertInfix, expert, ".");
    for (const auto& mk : info_.module_order) {
      if (mk.name.rfind(head, 0) != 0) continue;
      const int i = info_.IndexOf(mk.name);
      if (i < 0) return absl::InvalidArgumentError(absl::StrCat("expert weight '", mk.name, "' is not a param"));
      UCP_ASSIGN_OR_RETURN(ValuePtr t, Lp(w, i, 0));
      d->DictSet(Value::Str(mk.name), t);
    }
    if (d->dict_items().empty()) {
      return absl::InvalidArgumentError(absl::StrCat("MoE layer ", layer, " expert ", expert, " has no weights"));
    }
    return d;
  }

  // Where global rank `r` holds a group: an expert group as ep rank r % ep,
  // expert data parallel rank r / ep (DeepSpeed's expert groups run over
  // global ranks, across tp); any other group as dp rank r / tp of its tp
  // rank's slices.
  struct Place {
    int e = 0;     // ep rank (index into TargetGroup::params)
    int rank = 0;  // partition index in the group's layout
    int t = 0;     // tp rank whose slices the group holds
  };
  Place PlaceOf(const TargetGroup& tg, int r) const {
    if (tg.expert) return Place{r % ep_, r / ep_, 0};
    return Place{0, r / tp_, r % tp_};
  }

  // Group `g`'s flat partition on global rank `r` for one state.
  absl::StatusOr<TensorPlan> Partition(const TargetGroup& tg, int r, const std::string& key) const {
    const Place at = PlaceOf(tg, r);
    std::vector<TensorPlan> pieces;
    int64_t covered = 0;
    for (const auto& f : tg.layout.Fragments(at.rank)) {
      UCP_ASSIGN_OR_RETURN(TensorPlan full, Slice(tg.params[at.e][f.param_index], key, at.t));
      UCP_ASSIGN_OR_RETURN(TensorPlan flat, full.Reshape({full.numel()}));
      UCP_ASSIGN_OR_RETURN(TensorPlan piece, flat.FlatRange(f.param_offset, f.numel));
      pieces.push_back(std::move(piece));
      covered += f.numel;
    }
    if (covered < tg.layout.partition_numel()) {
      pieces.push_back(TensorPlan::Zeros(torch::DType::kFloat32, {tg.layout.partition_numel() - covered}));
    }
    if (pieces.size() == 1) return pieces[0];
    return TensorPlan::Cat(pieces, 0);
  }

  // What global rank `r`'s optimizer file holds of each group, in the order
  // DeepSpeed writes them.
  struct RankPartitions {
    std::vector<ValuePtr> fp32s, paddings, counts, mappings;  // per group
    ValuePtr states = Value::MakeDict();                      // group -> its states
  };

  // Global rank `r`'s partition of every group: param_slice_mappings (a
  // window of the expert groups for targets before 0.14.5), padding,
  // partition count, fp32 master (without padding), scalars and per-element
  // states.
  absl::Status AddRankPartitions(torch::TorchWriter& w, int stage, int r, RankPartitions* out) const {
    const std::vector<TargetGroup>& groups = groups_[stage];
    for (size_t g = 0; g < groups.size(); ++g) {
      const TargetGroup& tg = groups[g];
      const Place at = PlaceOf(tg, r);
      ValuePtr mapping = Value::MakeDict(/*ordered_dict=*/true);
      std::vector<deepspeed::ZeroFragment> listed = tg.layout.Fragments(at.rank);
      if (tg.expert && window_mappings_ && ep_ > 1) {
        const auto [start, size] = deepspeed::ExpertMappingWindow(tg.layout, at.rank, dp_);
        listed = tg.layout.FragmentsOfWindow(start, size);
      }
      for (const auto& f : listed) {
        mapping->DictSet(Value::Str(tg.names[at.e][f.param_index]),
                         pickle::MakeFragmentAddress(f.numel, f.partition_offset));
      }
      out->mappings.push_back(mapping);
      out->paddings.push_back(Value::Int(tg.layout.padding(at.rank)));
      out->counts.push_back(Value::Int(tg.expert ? edp_ : dp_));
      UCP_ASSIGN_OR_RETURN(TensorPlan fp32, Partition(tg, r, state::kFp32State));
      UCP_ASSIGN_OR_RETURN(ValuePtr fv, tp::AddPlanView(w, fp32, tg.layout.lean_partition_numel(at.rank), true));
      out->fp32s.push_back(fv);
      ValuePtr st = Value::MakeDict();
      for (const std::string& key : info_.scalar_keys) {
        UCP_ASSIGN_OR_RETURN(state::FileValue sv, state_.GroupScalar(static_cast<int>(g), key));
        if (!sv.value) continue;
        UCP_ASSIGN_OR_RETURN(ValuePtr c, deepspeed::CopyTreeForWrite(sv, w));
        st->DictSet(Value::Str(key), c);
      }
      for (const std::string& key : info_.state_keys) {
        UCP_ASSIGN_OR_RETURN(TensorPlan plan, Partition(tg, r, key));
        st->DictSet(Value::Str(key), tp::AddPlan(w, plan));
      }
      out->states->DictSet(Value::Int(static_cast<int64_t>(g)), st);
    }
    return absl::OkStatus();
  }

  // The optimizer file of stage `stage`'s rank `r`
  // (zero_pp_rank_{r / tp}_mp_rank_{stage x tp + r % tp}).
  absl::StatusOr<ValuePtr> OptimFile(torch::TorchWriter& w, int stage, int r) const {
    const std::vector<TargetGroup>& stage_groups = groups_[stage];
    const Value& common = *common_.value;
    auto copy_common = [&](const char* key) -> absl::StatusOr<ValuePtr> {
      ValuePtr v = common.DictGetPtr(key);
      if (!v) return absl::NotFoundError(absl::StrCat("the source's optimizer state has no '", key, "'"));
      return deepspeed::CopyTreeForWrite(state::FileValue{v, common_.file}, w);
    };
    RankPartitions parts;
    UCP_RETURN_IF_ERROR(AddRankPartitions(w, stage, r, &parts));
    UCP_ASSIGN_OR_RETURN(ValuePtr groups, copy_common("param_groups"));
    if (!groups->is(Kind::kList) || groups->items().size() != stage_groups.size()) {
      return absl::InvalidArgumentError("the source's param_groups do not match its groups");
    }
    for (size_t g = 0; g < stage_groups.size(); ++g) {
      if (stage_groups[g].expert && groups->items()[g]->is(Kind::kDict) && groups->items()[g]->DictGet("name")) {
        groups->items()[g]->DictSet(Value::Str("name"), Value::Str(absl::StrCat("ep_size_", ep_)));
      }
    }
    ValuePtr base = Value::MakeDict();
    base->DictSet(Value::Str("state"), parts.states);
    base->DictSet(Value::Str("param_groups"), groups);
    ValuePtr osd = Value::MakeDict();
    for (const char* key : {"loss_scaler", "dynamic_loss_scale", "overflow", "clip_grad"}) {
      UCP_ASSIGN_OR_RETURN(ValuePtr v, copy_common(key));
      osd->DictSet(Value::Str(key), v);
    }
    osd->DictSet(Value::Str("base_optimizer_state"), base);
    osd->DictSet(Value::Str("single_partition_of_fp32_groups"), Value::List(std::move(parts.fp32s)));
    const Value* zs = common.DictGet("zero_stage");
    auto stage_value = zs ? pickle::AsZeroStage(*zs) : absl::StatusOr<int>(-1);
    if (zs != nullptr && stage_value.ok() && *stage_value == stage_) {
      UCP_ASSIGN_OR_RETURN(ValuePtr v, copy_common("zero_stage"));
      osd->DictSet(Value::Str("zero_stage"), v);
    } else {
      osd->DictSet(Value::Str("zero_stage"), pickle::MakeZeroStage(stage_));
    }
    osd->DictSet(Value::Str("group_paddings"), Value::List(std::move(parts.paddings)));
    osd->DictSet(Value::Str("partition_count"), Value::List(std::move(parts.counts)));
    osd->DictSet(Value::Str("ds_version"), Value::Str(version_));
    osd->DictSet(Value::Str("param_slice_mappings"), Value::List(std::move(parts.mappings)));
    ValuePtr root = Value::MakeDict();
    root->DictSet(Value::Str("optimizer_state_dict"), osd);
    if (state::FileValue config = ds_->SavedDsConfig(); config.value) {
      UCP_ASSIGN_OR_RETURN(ValuePtr c, DsConfig(config, w));
      root->DictSet(Value::Str("ds_config"), c);
    }
    root->DictSet(Value::Str("ds_version"), Value::Str(version_));
    return root;
  }

  const state::ModelState& state_;
  const ModelInfo& info_;
  std::map<std::string, int> moe_layer_of_;  // MoE layer prefix -> index into info_.moe_layers
  ZeroWriteOptions options_;
  std::unique_ptr<deepspeed::DeepSpeedFacet> owned_facet_;
  const deepspeed::DeepSpeedFacet* ds_ = nullptr;
  int pp_ = 1, dp_ = 1, tp_ = 1, ep_ = 1, edp_ = 1, stage_ = 2;
  // Per param: its shape on a target tp rank; a vocabulary's padded rows.
  std::vector<std::vector<int64_t>> slice_shapes_;
  std::vector<int64_t> padded_rows_;
  std::string version_;
  deepspeed::PaddingConvention convention_ = deepspeed::PaddingConvention::kLastRank;
  bool parallel_dims_ = false;  // the target writes checkpoint_parallel_dimensions
  bool common_layout_ = true;   // 0.19.3+: model states with param_shapes, buffer_names, ds_config, ...
  bool autoep_key_ = true;      // 0.19.2+: ds_autoep_layers
  bool expp_files_ = false;     // up to 0.19.4: expp_rank_R placeholders
  bool window_mappings_ = false;  // before 0.14.5: expert groups' mappings of a window
  state::FileValue common_;
  std::vector<std::vector<TargetGroup>> groups_;  // per stage
  // Per param its target pipeline stage; per stage its MoE layers (indices
  // into ModelInfo::moe_layers); the partition method used at pp > 1.
  std::vector<int> stage_of_;
  std::vector<int> stage_of_layer_;  // pp > 1: each pipeline layer's stage
  std::vector<int> tied_layers_;     // pp > 1: the layers of the tied modules (0, last)
  std::vector<int> tied_stages_;     // pp > 1: the stages of tied_layers_, ascending
  std::vector<std::string> notes_;   // what the target assumed (TargetSummary::notes)
  std::vector<deepspeed::ArgsChange> args_changes_;  // the client state 'args' at the target
  std::vector<std::vector<int>> stage_layers_;
  std::string partition_method_;
  std::vector<int> parts_;  // pp > 1: the pp + 1 layer boundaries
  std::vector<Job> jobs_;
  std::vector<size_t> split_;  // the first piece's unit of each optimizer file written in pieces
};

}  // namespace

namespace {

// ep < tp: DeepSpeed writes tp rank t's model states on expert data parallel
// rank 0 only (global ranks r < ep), so tp ranks >= ep would have none; its
// own load of such a save fails (realds/README.md, "Native MoE at tp > 1").
absl::Status EpBelowTp(int ep, int tp) {
  return absl::InvalidArgumentError(absl::StrCat(
      "--expert_parallel=", ep, " at tp=", tp, ": expected an expert parallel degree >= tp (found ", ep, " < ", tp,
      "): DeepSpeed writes a tp rank's model states on expert data parallel rank 0 only, so tp ranks >= ep would "
      "have none and DeepSpeed could not load the checkpoint"));
}

}  // namespace

absl::StatusOr<int> TargetExpertParallel(const ModelInfo& info, const ZeroWriteOptions& options) {
  const int tp = options.target.tp;
  const int world = options.target.dp * tp;
  auto fits = [&](int ep) {
    if (ep < 1 || world % ep != 0) return false;
    for (const auto& l : info.moe_layers) {
      if (l.num_experts % ep != 0) return false;
    }
    return true;
  };
  const std::string ranks = tp > 1 ? absl::StrCat("the ", world, " ranks (tp=", tp, " x dp=", options.target.dp, ")")
                                   : absl::StrCat("--dp=", world);
  if (options.expert_parallel > 0) {
    if (!fits(options.expert_parallel)) {
      return absl::InvalidArgumentError(absl::StrCat("--expert_parallel=", options.expert_parallel, " must divide ",
                                                     ranks, " and every MoE layer's expert count"));
    }
    if (options.expert_parallel < tp) return EpBelowTp(options.expert_parallel, tp);
    return options.expert_parallel;
  }
  for (int ep = std::min(info.expert_parallel, world); ep > 1 && ep >= tp; --ep) {
    if (fits(ep)) return ep;
  }
  if (tp == 1) return 1;
  for (int ep = std::max(tp, info.expert_parallel); ep <= world; ++ep) {
    if (fits(ep)) return ep;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "mixture-of-experts target ", options.target.ToString(), ": no expert parallel degree >= tp=", tp,
      " divides ", ranks, " and every MoE layer's expert count"));
}

absl::StatusOr<std::unique_ptr<Plan>> PlanMoe(const state::ModelState& state, const ZeroWriteOptions& options,
                                              writers::TargetSummary* summary) {
  auto plan = std::make_unique<MoePlan>(state, options);
  UCP_RETURN_IF_ERROR(plan->Build());
  if (summary != nullptr) plan->Summarize(summary);
  return std::unique_ptr<Plan>(std::move(plan));
}

}  // namespace ucp::deepspeed_moe
