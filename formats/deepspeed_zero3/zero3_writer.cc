#include "formats/deepspeed_zero3/zero3_writer.h"

#include <algorithm>
#include <map>
#include <optional>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "base/fs.h"
#include "base/status_macros.h"
#include "deepspeed/checkpoint_files.h"
#include "deepspeed/client_args.h"
#include "deepspeed/engine_defaults.h"
#include "deepspeed/layout_math.h"
#include "deepspeed/tree_copy.h"
#include "deepspeed/zero_target_parts.h"
#include "formats/deepspeed_zero/zero_writer.h"
#include "format/pickle/accessors.h"
#include "tp/merge.h"
#include "tp/plan_io.h"

namespace ucp::deepspeed_zero3 {

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

using deepspeed::Zero3PartitionNumel;
using deepspeed::Zero3SubGroups;

struct SubGroup {
  int group = 0;
  std::vector<int> params;  // indices into ModelInfo::params
  int64_t flat_numel = 0;   // per rank
};

class Zero3Plan : public Plan {
 public:
  Zero3Plan(const state::ModelState& state, const ZeroWriteOptions& options)
      : state_(state), info_(state.info()), options_(options), dp_(options.target.dp), tp_(options.target.tp) {}

  absl::Status Build() {
    UCP_RETURN_IF_ERROR(CheckTarget());
    UCP_RETURN_IF_ERROR(CheckSourceFits());
    UCP_RETURN_IF_ERROR(PlanTpSlices());
    // The vocabulary is not padded here (CheckSourceFits): its rows stay.
    args_changes_ = deepspeed::TargetArgsChanges(state_, options_.target, nullptr);
    UCP_RETURN_IF_ERROR(ReadSourceOptimizer());
    ChooseSubGroupSize();
    NumberParams();
    UCP_RETURN_IF_ERROR(CutSubGroups());
    return AddUnits();
  }

  absl::Status Prepare(const std::string& staging) const override { return absl::OkStatus(); }

  absl::Status Execute(size_t i, const std::string& staging, UnitResult* result) const override {
    const Job& job = jobs_[i];
    if (job.dp < 0) return ExecuteVerifyUnit(state_, units_[i]);
    const int t = job.tp;
    torch::TorchWriter w(WriteOptions());
    ValuePtr root;
    if (job.pieces > 1) {
      // Piece `job.piece` of the optimizer file: the file's whole tree (only
      // metadata; the source's tensors opened as the piece's bytes are read),
      // its share of the storage bytes.
      UCP_ASSIGN_OR_RETURN(root, OptimRoot(w, job.dp, t, /*deferred=*/true));
      return WriteUnitPiece(w, staging, units_[i].outputs[0], *root, job.piece, job.pieces, result);
    }
    if (job.optim) {
      UCP_ASSIGN_OR_RETURN(root, OptimRoot(w, job.dp, t));
    } else {
      UCP_ASSIGN_OR_RETURN(root, ModelStatesRoot(w, job.dp, t));
    }
    return WriteUnitFile(w, staging, units_[i].outputs[0], *root, result);
  }

  absl::StatusOr<WriteStats> Finish(const std::vector<UnitResult>& results, const std::string& staging) const override {
    WriteStats stats;
    AddUnitResults(results, &stats);
    // The optimizer files written in pieces: everything around the pieces' bytes.
    for (const Job& f : split_) {
      torch::TorchWriter w(WriteOptions());
      UCP_ASSIGN_OR_RETURN(ValuePtr root, OptimRoot(w, f.dp, f.tp, /*deferred=*/true));
      UCP_ASSIGN_OR_RETURN(int64_t size,
                           FinishUnitPieces(w, staging, deepspeed::OptimFileName(f.dp, f.tp, info_.bf16_file_prefix),
                                            *root, results));
      stats.files += 1;
      stats.bytes += size;
    }
    return stats;
  }

  std::string latest_file() const override { return deepspeed::kLatestFile; }
  const state::CheckpointState* source() const override { return &state_; }

  // What the target is, for the command's report.
  void Summarize(writers::TargetSummary* summary) const {
    summary->topo = options_.target;
    summary->zero_stage = 3;
    if (!args_changes_.empty()) summary->notes.push_back(deepspeed::DescribeArgsChanges(args_changes_));
  }

 private:
  // What a unit writes: a model states file, an optimizer file, a piece
  // of an optimizer file (pieces > 1), or the check of the source's inputs
  // no unit reads (dp = -1; AddVerifyUnit).
  struct Job {
    bool optim = false;
    int dp = 0;
    int tp = 0;
    int piece = 0, pieces = 1;
  };

  // One thread a unit: the units (files, pieces of a large file) are the
  // parallelism.
  torch::TorchWriteOptions WriteOptions() const {
    torch::TorchWriteOptions wo;
    wo.record_threads = 1;
    wo.writeback = options_.fsync;
    return wo;
  }

  // The target: pp = 1 (each tp rank's files a ZeRO-3 checkpoint of its tp
  // slices); the source's DeepSpeed facet (ds_); whether
  // the target version's model states record the degrees (0.19.5 on).
  absl::Status CheckTarget() {
    UCP_RETURN_IF_ERROR(options_.target.Validate());
    UCP_ASSIGN_OR_RETURN(ds_, deepspeed::FacetOrDefaults(state_, options_.target_ds_version, &owned_facet_));
    {
      auto v = deepspeed::ParseDsVersion(deepspeed::TargetDsVersion(state_, options_.target_ds_version));
      parallel_dims_ = v.ok() && *v >= deepspeed::DsVersion{0, 19, 5};
    }
    if (options_.target.pp != 1) {
      return absl::InvalidArgumentError(absl::StrCat("ZeRO stage 3 target ", options_.target.ToString(),
                                                     ": DeepSpeed runs no pipeline under ZeRO-3 (pp=1)"));
    }
    return absl::OkStatus();
  }

  // What ZeRO-3's layout cannot hold: a PipelineModule, BF16_Optimizer
  // state, Megatron's padded vocabulary rows.
  absl::Status CheckSourceFits() const {
    if (info_.pipeline) {
      return absl::InvalidArgumentError(
          "ZeRO stage 3 target: the source is a PipelineModule, which DeepSpeed does not run under ZeRO-3");
    }
    if (info_.optimizer_kind == state::OptimizerKind::kBf16) {
      return absl::InvalidArgumentError(
          "ZeRO stage 3 target: the source's BF16_Optimizer state has no ZeRO-3 counterpart in DeepSpeed's layout");
    }
    // Megatron pads the vocabulary per tp rank; at tp=1 a model whose rows
    // are not a multiple of make_vocab_size_divisible_by has padded rows in
    // its embedding, which ucp does not add for ZeRO-3. AutoTP pads nothing
    // (as the ZeRO-1/2 writer's PlanSliceShapes takes it).
    for (const ParamState& p : info_.params) {
      if (p.rule.kind() != VOCAB || p.full_shape.empty()) continue;
      const int64_t divisible_by = options_.make_vocab_size_divisible_by > 0 ? options_.make_vocab_size_divisible_by
                                                                             : info_.make_vocab_size_divisible_by;
      if (info_.autotp && divisible_by <= 0) continue;
      if (divisible_by <= 0 || tp::PaddedVocabSize(p.full_shape[0], divisible_by, tp_) != p.full_shape[0]) {
        return absl::UnimplementedError(absl::StrCat(
            "ZeRO stage 3 target: vocabulary param '", p.name, "' (", p.full_shape[0],
            " rows) would need Megatron's vocab padding, which ucp does not write for ZeRO-3"));
      }
    }
    return absl::OkStatus();
  }

  // At tp > 1 each param's tp slices as the ZeRO-1/2 writer cuts them
  // (layout_: the rule's split, Megatron's or AutoTP's widths).
  absl::Status PlanTpSlices() {
    if (tp_ == 1) return absl::OkStatus();
    ZeroWriteOptions o = options_;
    o.zero_stage = 1;  // only the slices are taken from it
    UCP_ASSIGN_OR_RETURN(layout_, deepspeed_zero::PlanTarget(info_, o, deepspeed::TargetDsVersion(state_, "")));
    return absl::OkStatus();
  }

  // Param `i`'s shape on tp rank `t` (its full shape at tp 1).
  const std::vector<int64_t>& Shape(int i, int t) const {
    return tp_ == 1 ? info_.params[i].full_shape : layout_.SliceShape(i, t);
  }

  // Param `i`'s state `key` on tp rank `t`, checked against its shape. With
  // `deferred`, over the state's FullDeferred when it has one (nothing is
  // opened until the bytes are read).
  absl::StatusOr<TensorPlan> Slice(int i, const std::string& key, int t, bool deferred = false) const {
    const ParamState& p = info_.params[i];
    if (tp_ > 1) return deepspeed_zero::TargetSlice(state_, layout_, i, key, t, deferred);
    std::optional<TensorPlan> later = deferred ? state_.FullDeferred(p, key) : std::nullopt;
    UCP_ASSIGN_OR_RETURN(TensorPlan full, later ? *std::move(later) : state_.Full(p, key));
    if (full.shape() != p.full_shape) {
      return absl::InvalidArgumentError(absl::StrCat("param '", p.name, "' ", key, ": full shape ",
                                                     torch::ShapeString(full.shape()), " differs from ",
                                                     torch::ShapeString(p.full_shape)));
    }
    return full;
  }

  // The source's optimizer state (common_): a dict with one param group per
  // group of the model.
  absl::Status ReadSourceOptimizer() {
    UCP_ASSIGN_OR_RETURN(common_, ds_->OptimizerCommon());
    if (!common_.value || !common_.value->is(Kind::kDict)) {
      return absl::InvalidArgumentError("the source's optimizer state is not a dict");
    }
    const Value* groups = common_.value->DictGet("param_groups");
    if (groups == nullptr || !groups->is(Kind::kList) ||
        static_cast<int>(groups->items().size()) != info_.num_groups) {
      return absl::InvalidArgumentError(absl::StrCat("the source's optimizer state has ",
                                                     groups ? groups->DebugString(40) : "no", " param_groups, expected ",
                                                     info_.num_groups));
    }
    return absl::OkStatus();
  }

  // sub_group_size_: the flag, the source's config, DeepSpeed's default.
  void ChooseSubGroupSize() {
    sub_group_size_ = options_.sub_group_size;
    if (sub_group_size_ > 0) return;
    sub_group_size_ = 1000000000;
    state::FileValue root = ds_->ModelStatesRoot(0, 0);
    const Value* c = root.value && root.value->is(Kind::kDict) ? root.value->DictGet("ds_config") : nullptr;
    const Value* z = c && c->is(Kind::kDict) ? c->DictGet("zero_optimization") : nullptr;
    const Value* sg = z && z->is(Kind::kDict) ? z->DictGet("sub_group_size") : nullptr;
    if (sg != nullptr && sg->is(Kind::kInt)) sub_group_size_ = sg->int_value();
    if (sg != nullptr && sg->is(Kind::kFloat)) sub_group_size_ = static_cast<int64_t>(sg->float_value());
  }

  // ds_id_: DeepSpeed numbers the module's params (module.parameters():
  // trainable and frozen, a tied param once) in module order, then any the
  // module order does not list.
  void NumberParams() {
    auto numbered = [](const ParamState& p) {
      return p.role == state::TensorRole::kTrainable || p.role == state::TensorRole::kFrozen;
    };
    int next_id = 0;
    for (const auto& k : info_.module_order) {
      const ParamState* p = info_.Find(k.name);
      if (p != nullptr && numbered(*p) && !ds_id_.count(k.name)) ds_id_[k.name] = next_id++;
    }
    for (const ParamState& p : info_.params) {
      if (numbered(p) && !ds_id_.count(p.name)) ds_id_[p.name] = next_id++;
    }
    // Frozen params in module order (engine._get_zero_frozen_param_attributes
    // walks module.parameters()).
    std::vector<std::pair<int, int>> frozen;
    for (size_t i = 0; i < info_.params.size(); ++i) {
      if (info_.params[i].role == state::TensorRole::kFrozen) {
        frozen.emplace_back(ds_id_.at(info_.params[i].name), static_cast<int>(i));
      }
    }
    std::sort(frozen.begin(), frozen.end());
    for (const auto& [id, i] : frozen) frozen_.push_back(i);
  }

  // Sub-groups of every group at the target dp (sub_groups_), cut by
  // sub_group_size_ over the partition sizes (Zero3SubGroups).
  // Each tp rank's (of its slice sizes: AutoTP's uneven widths may cut them
  // otherwise than rank 0's).
  absl::Status CutSubGroups() {
    sub_groups_.resize(static_cast<size_t>(tp_));
    for (int t = 0; t < tp_; ++t) {
      for (int g = 0; g < info_.num_groups; ++g) {
        std::vector<int> members;
        std::vector<int64_t> numels;
        for (size_t i = 0; i < info_.params.size(); ++i) {
          if (info_.params[i].trainable() && info_.params[i].group == g) {
            members.push_back(static_cast<int>(i));
            numels.push_back(Numel(Shape(static_cast<int>(i), t)));
          }
        }
        if (members.empty()) {
          return absl::FailedPreconditionError(absl::StrCat("param group ", g, " holds no params"));
        }
        size_t k = 0;
        for (int count : Zero3SubGroups(numels, dp_, sub_group_size_)) {
          SubGroup sg;
          sg.group = g;
          for (int c = 0; c < count; ++c, ++k) {
            sg.params.push_back(members[k]);
            sg.flat_numel += Zero3PartitionNumel(numels[k], dp_);
          }
          sub_groups_[t].push_back(std::move(sg));
        }
      }
    }
    return absl::OkStatus();
  }

  // The units: per dp rank, its model-state file and its optimizer file;
  // the check of the inputs no unit reads.
  absl::Status AddUnits() {
    const std::vector<InputRange> all_inputs = deepspeed::EveryParamInput(state_);
    const int64_t per_element = 4 * (1 + static_cast<int64_t>(info_.state_keys.size()));
    for (int t = 0; t < tp_; ++t) {
      int64_t flat_total = 0;
      for (const auto& sg : sub_groups_[t]) flat_total += sg.flat_numel;
      for (int d = 0; d < dp_; ++d) {
        const std::string model = deepspeed::Zero3ModelFileName(d, t);
        int64_t bytes = 4096;
        std::vector<InputRange> in;
        const std::string from = ds_->ModelStatesPath(0, t);
        if (!from.empty()) in.push_back({from, "", 0, -1});
        for (int i : frozen_) {
          for (const InputRange& r : state_.Inputs(info_.params[i])) in.push_back(r);
          bytes += Zero3PartitionNumel(Numel(Shape(i, t)), dp_) *
                   static_cast<int64_t>(torch::ItemSize(info_.params[i].lp_dtype));
        }
        AddUnit({false, d, t}, model, absl::StrCat("file ", model), bytes, std::move(in));
        UCP_RETURN_IF_ERROR(AddOptimUnits(d, t, flat_total * per_element, all_inputs));
      }
    }
    if (AddVerifyUnit(state_, &units_)) jobs_.push_back({false, -1});
    return absl::OkStatus();
  }

  // The units of the optimizer file of dp rank `d`, tp rank `t` (`bytes`
  // large): one, or a large file's pieces (writers::OptimPieces), each a unit
  // that lists the inputs of its bytes (PieceInputs), or, from a source that
  // cannot defer its tensors, all of the file's inputs.
  absl::Status AddOptimUnits(int d, int t, int64_t bytes, const std::vector<InputRange>& all_inputs) {
    const std::string file = deepspeed::OptimFileName(d, t, info_.bf16_file_prefix);
    const int pieces = writers::OptimPieces(bytes, options_.piece_bytes);
    if (pieces == 1) {
      AddUnit({true, d, t}, file, absl::StrCat("file ", file), bytes, all_inputs);
      return absl::OkStatus();
    }
    split_.push_back({true, d, t});
    UCP_ASSIGN_OR_RETURN(auto piece_inputs, PieceInputs(d, t, pieces));
    for (int k = 0; k < pieces; ++k) {
      AddUnit({true, d, t, k, pieces}, file, absl::StrCat("file ", file, " piece ", k + 1, " of ", pieces),
              bytes / pieces, piece_inputs ? (*piece_inputs)[k] : all_inputs);
    }
    return absl::OkStatus();
  }

  void AddUnit(Job job, const std::string& file, std::string name, int64_t bytes, std::vector<InputRange> inputs) {
    Unit u;
    u.outputs.push_back(file);
    u.name = std::move(name);
    u.bytes = bytes;
    u.inputs = std::move(inputs);
    jobs_.push_back(job);
    units_.push_back(std::move(u));
  }

  // Which inputs each of the `pieces` pieces of the optimizer file of dp
  // rank `d`, tp rank `t` reads, by laying the file out from shapes alone;
  // nullopt when the source cannot defer every tensor of it (building the
  // tree would open, and CRC-check outside any unit, its inputs while
  // planning).
  absl::StatusOr<std::optional<std::vector<std::vector<InputRange>>>> PieceInputs(int d, int t, int pieces) const {
    using Lists = std::vector<std::vector<InputRange>>;
    std::vector<int> params;
    for (const SubGroup& sg : sub_groups_[t]) params.insert(params.end(), sg.params.begin(), sg.params.end());
    if (!deepspeed_zero::AllStatesDeferred(state_, params)) return std::optional<Lists>();
    torch::TorchWriter w(WriteOptions());
    std::vector<std::pair<size_t, TensorPlan>> records;
    UCP_ASSIGN_OR_RETURN(ValuePtr root, OptimRoot(w, d, t, /*deferred=*/true, &records));
    UCP_ASSIGN_OR_RETURN(Lists out, deepspeed_zero::PieceInputsOf(
                                        w, deepspeed::OptimFileName(d, t, info_.bf16_file_prefix), *root, pieces, records));
    return std::optional<Lists>(std::move(out));
  }

  absl::StatusOr<ValuePtr> CopyCommon(torch::TorchWriter& w, const char* key) const {
    ValuePtr v = common_.value->DictGetPtr(key);
    if (!v) return ValuePtr();
    return deepspeed::CopyTreeForWrite(state::FileValue{v, common_.file}, w);
  }

  // ds_config with stage 3 (and the sub_group_size given).
  absl::StatusOr<ValuePtr> DsConfig(const state::FileValue& src, torch::TorchWriter& w) const {
    return deepspeed::RetargetDsConfig(src, w, /*stage=*/3, options_.sub_group_size, tp_);
  }

  absl::StatusOr<ValuePtr> ModelStatesRoot(torch::TorchWriter& w, int dp, int t) const {
    state::FileValue src = ds_->ModelStatesRoot(0, t);
    if (!src.value || !src.value->is(Kind::kDict)) {
      return absl::FailedPreconditionError("the source has no model states to carry over");
    }
    ValuePtr out = Value::MakeDict();
    for (const auto& [k, v] : src.value->dict_items()) {
      const std::string key = k->is(Kind::kStr) ? k->str() : "";
      if (key == "module") {
        UCP_ASSIGN_OR_RETURN(ValuePtr m, Module(w, t));
        out->DictSet(k, m);
      } else if (key == "param_shapes") {
        std::vector<ValuePtr> groups;
        for (const SubGroup& sg : sub_groups_[t]) {
          ValuePtr d = Value::MakeDict(/*ordered_dict=*/true);
          for (int i : sg.params) {
            d->DictSet(Value::Str(info_.params[i].name), pickle::MakeTorchSize(Shape(i, t)));
          }
          groups.push_back(d);
        }
        out->DictSet(k, Value::List(std::move(groups)));
      } else if (key == "frozen_param_shapes") {
        out->DictSet(k, FrozenShapes(t));
      } else if (key == "frozen_param_fragments") {
        UCP_ASSIGN_OR_RETURN(ValuePtr f, FrozenFragments(w, dp, t));
        out->DictSet(k, f);
      } else if (key == "shared_params" && dp != 0) {
        // engine._get_shared_params runs on global rank 0 only: every other
        // rank's file holds an empty dict.
        out->DictSet(k, Value::MakeDict());
      } else if (key == "buffer_names") {
        std::vector<ValuePtr> names;
        for (const ParamState& p : info_.params) {
          if (p.role == state::TensorRole::kBuffer) names.push_back(Value::Str(p.name));
        }
        out->DictSet(k, Value::List(std::move(names)));
      } else if (key == "dp_world_size") {
        out->DictSet(k, Value::Int(dp_));
      } else if (key == "mp_world_size") {
        out->DictSet(k, Value::Int(tp_));
        if (parallel_dims_ && src.value->DictGet("checkpoint_parallel_dimensions") == nullptr) {
          ValuePtr dims = deepspeed::SingleRankParallelDimensions();
          dims->DictSet(Value::Str("tp_degree"), Value::Int(tp_));
          out->DictSet(Value::Str("checkpoint_parallel_dimensions"), dims);
        }
      } else if (key == "checkpoint_parallel_dimensions" && !parallel_dims_) {
        continue;  // a target before 0.19.5 records none
      } else if (key == "checkpoint_parallel_dimensions" && v->is(Kind::kDict)) {
        UCP_ASSIGN_OR_RETURN(ValuePtr dims, deepspeed::CopyTreeForWrite(state::FileValue{v, src.file}, w));
        if (dims->DictGet("pp_degree")) dims->DictSet(Value::Str("pp_degree"), Value::Int(1));
        if (dims->DictGet("tp_degree")) dims->DictSet(Value::Str("tp_degree"), Value::Int(tp_));
        out->DictSet(k, dims);
      } else if (key == "ds_config") {
        UCP_ASSIGN_OR_RETURN(ValuePtr c, DsConfig(state::FileValue{v, src.file}, w));
        out->DictSet(k, c);
      } else if (key == "ds_version" && !options_.target_ds_version.empty()) {
        out->DictSet(k, Value::Str(options_.target_ds_version));
      } else {
        UCP_ASSIGN_OR_RETURN(ValuePtr c, deepspeed::CopyTreeForWrite(state::FileValue{v, src.file}, w));
        if (key == "args") UCP_RETURN_IF_ERROR(deepspeed::ApplyArgsChanges(*c, args_changes_));
        out->DictSet(k, c);
      }
    }
    // A source that records no frozen params' keys (but has frozen params).
    if (!frozen_.empty() && out->DictGet("frozen_param_shapes") == nullptr) {
      out->DictSet(Value::Str("frozen_param_shapes"), FrozenShapes(t));
      UCP_ASSIGN_OR_RETURN(ValuePtr f, FrozenFragments(w, dp, t));
      out->DictSet(Value::Str("frozen_param_fragments"), f);
    }
    return out;
  }

  // frozen_param_shapes: name -> (tp rank t's) shape, in module order.
  ValuePtr FrozenShapes(int t) const {
    ValuePtr d = Value::MakeDict(/*ordered_dict=*/true);
    for (int i : frozen_) d->DictSet(Value::Str(info_.params[i].name), pickle::MakeTorchSize(Shape(i, t)));
    return d;
  }

  // frozen_param_fragments of dp rank `dp`: each frozen param's ZeRO-3
  // partition (its `ds_tensor`: elements [dp * part, (dp + 1) * part) of the
  // flattened lp weight, part = ceil(numel / dp), zeros past the end), 1-D,
  // in its lp dtype.
  absl::StatusOr<ValuePtr> FrozenFragments(torch::TorchWriter& w, int dp, int t) const {
    ValuePtr d = Value::MakeDict(/*ordered_dict=*/true);
    for (int i : frozen_) {
      const ParamState& p = info_.params[i];
      const int64_t numel = Numel(Shape(i, t));
      const int64_t part = Zero3PartitionNumel(numel, dp_);
      const int64_t begin = static_cast<int64_t>(dp) * part;
      const int64_t len = std::max<int64_t>(0, std::min(part, numel - begin));
      std::vector<TensorPlan> pieces;
      if (len > 0) {
        UCP_ASSIGN_OR_RETURN(TensorPlan full, Slice(i, state::kLpState, t));
        UCP_ASSIGN_OR_RETURN(TensorPlan flat, full.Reshape({numel}));
        UCP_ASSIGN_OR_RETURN(TensorPlan piece, flat.FlatRange(begin, len));
        pieces.push_back(std::move(piece));
      }
      if (len < part) pieces.push_back(TensorPlan::Zeros(p.lp_dtype, {part - len}));
      TensorPlan plan = pieces.empty() ? TensorPlan::Zeros(p.lp_dtype, {0})
                                       : pieces.size() == 1 ? pieces[0] : TensorPlan();
      if (pieces.size() > 1) {
        UCP_ASSIGN_OR_RETURN(plan, TensorPlan::Cat(pieces, 0));
      }
      d->DictSet(Value::Str(p.name), tp::AddPlan(w, plan));
    }
    return d;
  }

  // The module state dict: params as empty tensors, buffers whole.
  absl::StatusOr<ValuePtr> Module(torch::TorchWriter& w, int t) const {
    ValuePtr sd = Value::MakeDict(/*ordered_dict=*/true);
    const std::vector<int> order = info_.ModuleOrderIndices();
    for (int i : order) {
      const ParamState& p = info_.params[i];
      if (p.role != state::TensorRole::kBuffer) {  // trainable, frozen, tied: partitioned
        sd->DictSet(Value::Str(p.name), tp::AddPlan(w, TensorPlan::Zeros(p.lp_dtype, {0})));
      } else {
        UCP_ASSIGN_OR_RETURN(TensorPlan lp, state_.Full(p, state::kLpState));
        sd->DictSet(Value::Str(p.name), tp::AddPlan(w, lp));
      }
    }
    state::FileValue src = ds_->ModelStatesRoot(0, t);
    const Value* module = src.value ? src.value->DictGet("module") : nullptr;
    if (module != nullptr && module->is(Kind::kDict) && module->dict_state()) {
      UCP_ASSIGN_OR_RETURN(ValuePtr metadata,
                           deepspeed::CopyTreeForWrite(state::FileValue{module->dict_state(), src.file}, w));
      sd->set_dict_state(std::move(metadata));
    }
    return sd;
  }

  // Sub-group `s`'s flat partition on dp rank `dp` for one state.
  absl::StatusOr<TensorPlan> Flat(int s, int dp, const std::string& key, int t, bool deferred = false) const {
    std::vector<TensorPlan> pieces;
    for (int i : sub_groups_[t][s].params) {
      const ParamState& p = info_.params[i];
      const int64_t numel = Numel(Shape(i, t));
      const int64_t part = Zero3PartitionNumel(numel, dp_);
      const int64_t begin = static_cast<int64_t>(dp) * part;
      const int64_t len = std::max<int64_t>(0, std::min(part, numel - begin));
      if (len > 0) {
        UCP_ASSIGN_OR_RETURN(TensorPlan full, Slice(i, key, t, deferred));
        UCP_ASSIGN_OR_RETURN(TensorPlan flat, full.Reshape({numel}));
        UCP_ASSIGN_OR_RETURN(TensorPlan piece, flat.FlatRange(begin, len));
        if (piece.dtype() != torch::DType::kFloat32) {
          return absl::InvalidArgumentError(absl::StrCat("param '", p.name, "' ", key, " is ",
                                                         std::string(torch::DTypeName(piece.dtype())), ", expected float32"));
        }
        pieces.push_back(std::move(piece));
      }
      if (len < part) pieces.push_back(TensorPlan::Zeros(torch::DType::kFloat32, {part - len}));
    }
    if (pieces.empty()) return TensorPlan::Zeros(torch::DType::kFloat32, {0});
    if (pieces.size() == 1) return pieces[0];
    return TensorPlan::Cat(pieces, 0);
  }

  // A scalar state of group `g` as a value of its own (never shared).
  absl::StatusOr<ValuePtr> OwnScalar(torch::TorchWriter& w, int g, const std::string& key) const {
    UCP_ASSIGN_OR_RETURN(state::FileValue v, state_.GroupScalar(g, key));
    if (!v.value) return ValuePtr();
    if (torch::TorchFile::IsTensor(*v.value) && v.file != nullptr) {
      UCP_ASSIGN_OR_RETURN(torch::Tensor t, v.file->GetTensor(*v.value));
      return tp::AddPlan(w, TensorPlan::FromTensor(t));  // a new storage per call
    }
    return deepspeed::CopyTreeForWrite(v, w);
  }

  // The optimizer file of dp rank `dp`, tp rank `t`. With `deferred`, the
  // source's tensors are opened when their bytes are read (Slice);
  // `records` (if given) receives each storage of a state or fp32 partition
  // (TorchWriter storage number, plan).
  absl::StatusOr<ValuePtr> OptimRoot(torch::TorchWriter& w, int dp, int t, bool deferred = false,
                                     std::vector<std::pair<size_t, TensorPlan>>* records = nullptr) const {
    ValuePtr osd = Value::MakeDict();
    // Pickled as the source's Python pickled its own stage.
    const Value* source_stage = common_.value ? common_.value->DictGet("zero_stage") : nullptr;
    osd->DictSet(Value::Str("zero_stage"),
                 pickle::MakeZeroStage(3, source_stage != nullptr ? pickle::ZeroStageEncoding(*source_stage)
                                                                  : pickle::EnumEncoding::kCall));
    UCP_ASSIGN_OR_RETURN(ValuePtr loss_scaler, CopyCommon(w, "loss_scaler"));
    osd->DictSet(Value::Str("loss_scaler"), loss_scaler ? loss_scaler : pickle::MakeLossScaler(1.0));
    UCP_ASSIGN_OR_RETURN(ValuePtr dynamic, CopyCommon(w, "dynamic_loss_scale"));
    osd->DictSet(Value::Str("dynamic_loss_scale"), dynamic ? dynamic : Value::Bool(false));
    UCP_ASSIGN_OR_RETURN(ValuePtr overflow, CopyCommon(w, "overflow"));
    osd->DictSet(Value::Str("overflow"), overflow ? overflow : Value::Bool(false));
    osd->DictSet(Value::Str("partition_count"), Value::Int(dp_));
    // The torch optimizer's state dict: one state per sub-group.
    ValuePtr states = Value::MakeDict();
    std::vector<ValuePtr> flats;
    ValuePtr from_type = Value::Global("torch._tensor", "_rebuild_from_type_v2");
    ValuePtr rebuild = Value::Global("torch._utils", "_rebuild_tensor_v2");
    ValuePtr tensor_type = Value::Global("torch", "Tensor");
    const std::vector<SubGroup>& sub_groups = sub_groups_[t];
    for (size_t s = 0; s < sub_groups.size(); ++s) {
      const SubGroup& sg = sub_groups[s];
      ValuePtr st = Value::MakeDict();
      for (const std::string& key : info_.scalar_keys) {
        UCP_ASSIGN_OR_RETURN(ValuePtr v, OwnScalar(w, sg.group, key));
        if (v) st->DictSet(Value::Str(key), v);
      }
      for (const std::string& key : info_.state_keys) {
        UCP_ASSIGN_OR_RETURN(TensorPlan plan, Flat(static_cast<int>(s), dp, key, t, deferred));
        if (records != nullptr) records->emplace_back(w.num_storages(), plan);
        st->DictSet(Value::Str(key), tp::AddPlan(w, plan));
      }
      states->DictSet(Value::Int(static_cast<int64_t>(s)), st);
      // fp32_flat_groups[s]: requires_grad, and DeepSpeed's `ds_id`
      // "<first param's id>_<last param's id>" as a tensor attribute.
      UCP_ASSIGN_OR_RETURN(TensorPlan fp32, Flat(static_cast<int>(s), dp, state::kFp32State, t, deferred));
      if (records != nullptr) records->emplace_back(w.num_storages(), fp32);
      ValuePtr t = tp::AddPlan(w, fp32);
      UCP_RETURN_IF_ERROR(tp::SetRequiresGrad(*t, true));
      ValuePtr attrs = Value::MakeDict();
      attrs->DictSet(Value::Str("ds_id"), Value::Str(absl::StrCat(ds_id_.at(info_.params[sg.params.front()].name), "_",
                                                                  ds_id_.at(info_.params[sg.params.back()].name))));
      pickle::Object o;
      o.callable = from_type;
      o.args = Value::Tuple({rebuild, tensor_type, t->object().args, attrs});
      flats.push_back(Value::MakeObject(std::move(o)));
    }
    UCP_ASSIGN_OR_RETURN(ValuePtr groups, CopyCommon(w, "param_groups"));
    for (int g = 0; g < info_.num_groups; ++g) {
      std::vector<ValuePtr> ids;
      for (size_t s = 0; s < sub_groups.size(); ++s) {
        if (sub_groups[s].group == g) ids.push_back(Value::Int(static_cast<int64_t>(s)));
      }
      ValuePtr group = groups->items()[g];
      if (!group->is(Kind::kDict)) return absl::InvalidArgumentError(absl::StrCat("param_groups[", g, "] is not a dict"));
      group->DictSet(Value::Str("params"), Value::List(std::move(ids)));
    }
    ValuePtr inner = Value::MakeDict();
    inner->DictSet(Value::Str("state"), states);
    inner->DictSet(Value::Str("param_groups"), groups);
    osd->DictSet(Value::Str("optimizer_state_dict"), inner);
    osd->DictSet(Value::Str("fp32_flat_groups"), Value::List(std::move(flats)));

    ValuePtr root = Value::MakeDict();
    root->DictSet(Value::Str("optimizer_state_dict"), osd);
    state::FileValue src = ds_->ModelStatesRoot(0, t);
    ValuePtr config = src.value ? src.value->DictGetPtr("ds_config") : nullptr;
    if (config) {
      UCP_ASSIGN_OR_RETURN(ValuePtr c, DsConfig(state::FileValue{config, src.file}, w));
      root->DictSet(Value::Str("ds_config"), c);
    }
    ValuePtr version;
    if (!options_.target_ds_version.empty()) {
      version = Value::Str(options_.target_ds_version);
    } else if (const Value* v = src.value ? src.value->DictGet("ds_version") : nullptr; v && v->is(Kind::kStr)) {
      version = Value::Str(v->str());
    } else {
      UCP_ASSIGN_OR_RETURN(version, CopyCommon(w, "ds_version"));
    }
    if (!version) return absl::FailedPreconditionError("the source records no ds_version: pass --target_ds_version");
    root->DictSet(Value::Str("ds_version"), version);
    return root;
  }

  const state::ModelState& state_;
  const ModelInfo& info_;
  ZeroWriteOptions options_;
  std::unique_ptr<deepspeed::DeepSpeedFacet> owned_facet_;
  const deepspeed::DeepSpeedFacet* ds_ = nullptr;
  const int dp_, tp_;
  deepspeed_zero::TargetLayout layout_;  // tp > 1: the slices (PlanTpSlices)
  int64_t sub_group_size_ = 0;
  bool parallel_dims_ = false;  // the target writes checkpoint_parallel_dimensions
  state::FileValue common_;
  std::map<std::string, int> ds_id_;
  std::vector<int> frozen_;  // frozen params (ModelInfo::params indices), module order
  std::vector<std::vector<SubGroup>> sub_groups_;  // per tp rank
  std::vector<Job> jobs_;
  std::vector<Job> split_;  // the optimizer files written in pieces, finished by Finish
  std::vector<deepspeed::ArgsChange> args_changes_;  // the client state 'args' at the target
};

}  // namespace

absl::StatusOr<std::unique_ptr<Plan>> PlanZero3(const state::ModelState& state, const ZeroWriteOptions& options,
                                                writers::TargetSummary* summary) {
  auto plan = std::make_unique<Zero3Plan>(state, options);
  UCP_RETURN_IF_ERROR(plan->Build());
  if (summary != nullptr) plan->Summarize(summary);
  return std::unique_ptr<Plan>(std::move(plan));
}

}  // namespace ucp::deepspeed_zero3
