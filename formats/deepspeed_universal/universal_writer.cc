#include "formats/deepspeed_universal/universal_writer.h"

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "base/flusher.h"
#include "base/fs.h"
#include "base/status_macros.h"
#include "deepspeed/checkpoint_files.h"
#include "deepspeed/engine_defaults.h"
#include "deepspeed/layout_math.h"
#include "deepspeed/manifest.h"
#include "deepspeed/tree_copy.h"
#include "deepspeed/universal_metadata.h"
#include "google/protobuf/text_format.h"
#include "tp/plan_io.h"

namespace ucp::deepspeed_universal {

using writers::Plan;
using writers::Unit;
using writers::UnitResult;
using writers::WriteStats;
using writers::AddVerifyUnit;
using writers::ExecuteVerifyUnit;
using writers::RunPlan;
using writers::AddUnitResults;
using writers::UniversalWriteOptions;
using writers::UniversalRunOptions;

namespace {

using state::ParamState;
using pickle::Value;
using pickle::ValuePtr;

// Rejects names that would escape the output folder or cannot be file names.
absl::Status CheckParamName(const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos || name.size() > 255) {
    return absl::InvalidArgumentError(
        absl::StrCat("param name '", name, "' cannot be a folder name in a universal checkpoint"));
  }
  return absl::OkStatus();
}

// Universal files are listed in the manifest with their digest.
torch::TorchWriteOptions HashedWrites(const UniversalWriteOptions& options) {
  torch::TorchWriteOptions o;
  o.digest = options.digest;
  o.writeback = options.fsync;
  return o;
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

FileDigest Digest(const std::string& rel, int64_t size, const std::string& hex, DigestKind kind) {
  FileDigest d;
  d.set_path(rel);
  d.set_size(size);
  if (kind == DigestKind::kSha256) d.set_sha256(hex);
  if (kind == DigestKind::kXxh3_128) d.set_xxh3_128(hex);
  return d;
}

// A universal checkpoint holds every param whole, in no version's tp layout:
// an AutoTP lm_head that a 0.16.4 - 0.18.9 source held whole on every tp rank
// is recorded with the cut AutoTP makes from 0.19.5 on (ParamState::autotp_cut),
// as a later version's save of the same model records it.
const MergeRule& UniversalRule(const ParamState& p) {
  return p.has_autotp_cut() ? p.autotp_cut : p.rule;
}

state::ModelInfo UniversalInfo(const state::ModelInfo& info) {
  state::ModelInfo out = info;
  for (ParamState& p : out.params) {
    if (!p.has_autotp_cut()) continue;
    p.rule = p.autotp_cut;
    p.autotp_cut = MergeRule();
    p.origin = std::string(absl::StripSuffix(p.origin, state::kAutoTpWholeLmHeadNote));
  }
  return out;
}

class UniversalPlan : public Plan {
 public:
  UniversalPlan(const state::ModelState& state, const UniversalWriteOptions& options)
      : state_(state), info_(state.info()), options_(options) {}

  absl::Status Build() {
    for (const ParamState& p : info_.params) UCP_RETURN_IF_ERROR(CheckParamName(p.name));
    UCP_ASSIGN_OR_RETURN(ds_, deepspeed::FacetOrDefaults(state_, options_.target_ds_version, &owned_facet_));
    if (zero3()) UCP_RETURN_IF_ERROR(CheckZero3Loader());
    states_ = {state::kFp32State};
    states_.insert(states_.end(), info_.state_keys.begin(), info_.state_keys.end());
    for (size_t i = 0; i < info_.params.size(); ++i) {
      const ParamState& p = info_.params[i];
      Unit u;
      u.name = absl::StrCat("param ", p.name);
      if (p.trainable()) {
        const std::string dir = JoinPath(deepspeed::kUniversalZeroDir, p.name);
        if (!info_.scalar_keys.empty() && !zero3()) u.outputs.push_back(JoinPath(dir, "step.pt"));
        for (const std::string& s : states_) u.outputs.push_back(JoinPath(dir, s + ".pt"));
        u.bytes = Numel(p.full_shape) * 4 * static_cast<int64_t>(states_.size());
      } else {
        u.outputs.push_back(JoinPath(deepspeed::kUniversalModuleDir, p.name + ".pt"));
        u.bytes = Numel(p.full_shape) * static_cast<int64_t>(torch::ItemSize(p.lp_dtype));
      }
      for (const auto& r : state_.Inputs(p)) u.inputs.push_back(r);
      kinds_.push_back(kParam);
      index_.push_back(static_cast<int>(i));
      units_.push_back(std::move(u));
      any_module_ |= !p.trainable();
    }
    {
      Unit u;
      u.name = "optimizer state";
      u.outputs.push_back(JoinPath(deepspeed::kUniversalZeroDir, deepspeed::kUniversalOptimizerStateFile));
      u.bytes = 4096;
      kinds_.push_back(kOptimizerState);
      index_.push_back(-1);
      units_.push_back(std::move(u));
    }
    const state::Topology& src = info_.source_topology;
    if (zero3()) {
      // ds_to_universal.py copies every ZeRO-3 model-state file (every dp
      // rank of every tp rank); at tp > 1 with single_mp_rank_file, mp rank
      // 0's of every dp rank as a tp=1 job's (kOneZero3ModelStates).
      const bool one = zero3_tp() && options_.single_mp_rank_file;
      for (int t = 0; t < (one ? 1 : src.tp); ++t) {
        for (int d = 0; d < src.dp; ++d) {
          const std::string from = ds_->DpModelStatesPath(d, t);
          if (from.empty()) {
            return absl::FailedPreconditionError(
                "a ZeRO stage 3 universal checkpoint needs the source's zero_pp_rank_*_model_states.pt files");
          }
          Unit u;
          u.outputs.push_back(deepspeed::Zero3ModelFileName(d, t));
          u.name = absl::StrCat("model states ", u.outputs[0], one ? " (for any tp)" : "");
          u.inputs.push_back({from, "", 0, -1});
          auto size = FileSize(from);
          u.bytes = size.ok() ? *size : 0;
          kinds_.push_back(one ? kOneZero3ModelStates : kModelStates);
          index_.push_back(-1 - (t * src.dp + d));
          units_.push_back(std::move(u));
        }
      }
    }
    // A plain (non-pipeline) module saved at tp > 1: one mp_rank_00 file
    // for a job of any tp (kOneModelStates; see
    // UniversalWriteOptions::single_mp_rank_file).
    const bool single = options_.single_mp_rank_file && PlainModuleAtTpAboveOne(info_);
    if (single) {
      Unit u;
      u.outputs.push_back(deepspeed::MpRankFileName(0));
      u.name = absl::StrCat("model states ", u.outputs[0], " (for any tp)");
      const std::string from = ds_->ModelStatesPath(0, 0);
      if (!from.empty()) u.inputs.push_back({from, "", 0, -1});
      u.bytes = 4096;
      kinds_.push_back(kOneModelStates);
      index_.push_back(0);
      units_.push_back(std::move(u));
    }
    for (int pp = 0; pp < src.pp && !zero3() && !single; ++pp) {
      for (int t = 0; t < src.tp; ++t) {
        Unit u;
        u.outputs.push_back(deepspeed::MpRankFileName(src.mp_rank(pp, t)));
        u.name = absl::StrCat("model states ", u.outputs[0]);
        const std::string from = ds_->ModelStatesPath(pp, t);
        if (!from.empty()) {
          u.inputs.push_back({from, "", 0, -1});
          auto size = FileSize(from);
          u.bytes = size.ok() ? *size : 0;
        }
        kinds_.push_back(kModelStates);
        index_.push_back(pp * src.tp + t);
        units_.push_back(std::move(u));
      }
    }
    if (AddVerifyUnit(state_, &units_)) {
      kinds_.push_back(kVerify);
      index_.push_back(-1);
    }
    return absl::OkStatus();
  }

  absl::Status Prepare(const std::string& staging) const override {
    UCP_RETURN_IF_ERROR(MakeDirs(JoinPath(staging, deepspeed::kUniversalZeroDir)));
    if (any_module_) UCP_RETURN_IF_ERROR(MakeDirs(JoinPath(staging, deepspeed::kUniversalModuleDir)));
    return absl::OkStatus();
  }

  absl::Status Execute(size_t i, const std::string& staging, UnitResult* result) const override {
    switch (kinds_[i]) {
      case kParam:
        return WriteParam(info_.params[index_[i]], staging, result);
      case kOptimizerState: {
        UCP_ASSIGN_OR_RETURN(state::FileValue common, ds_->OptimizerCommon());
        torch::TorchWriter w(HashedWrites(options_));
        UCP_ASSIGN_OR_RETURN(ValuePtr v, deepspeed::CopyTreeForWrite(common, w));
        return WriteFiles(staging, units_[i].outputs, {&w}, {v.get()}, result);
      }
      case kModelStates: {
        const int pp = index_[i] / info_.source_topology.tp, t = index_[i] % info_.source_topology.tp;
        const std::string& rel = units_[i].outputs[0];
        const int z3 = -1 - index_[i];  // a ZeRO-3 file: t * dp + d
        const int dp = info_.source_topology.dp;
        const std::string from =
            index_[i] < 0 ? ds_->DpModelStatesPath(z3 % dp, z3 / dp) : ds_->ModelStatesPath(pp, t);
        if (!from.empty()) {
          // The model-state files, byte for byte.
          std::string sha;
          // With --fsync, written back in steps as it is copied (as every
          // writer does), not left to the commit's sync whole.
          const std::string to = JoinPath(staging, rel);
          std::function<void(int, uint64_t, uint64_t)> written;
          if (options_.fsync) written = [&to](int fd, uint64_t offset, uint64_t len) { StartWriteback(fd, to, offset, len); };
          UCP_RETURN_IF_ERROR(CopyFile(from, to, &sha, options_.digest, written));
          UCP_ASSIGN_OR_RETURN(int64_t size, FileSize(JoinPath(staging, rel)));
          result->files.push_back(Digest(rel, size, sha, options_.digest));
          return absl::OkStatus();
        }
        state::FileValue root = ds_->ModelStatesRoot(pp, t);
        if (!root.value) {
          return absl::FailedPreconditionError(absl::StrCat("no model states for stage ", pp, " tp rank ", t));
        }
        torch::TorchWriter w(HashedWrites(options_));
        UCP_ASSIGN_OR_RETURN(ValuePtr v, deepspeed::CopyTreeForWrite(root, w));
        return WriteFiles(staging, {rel}, {&w}, {v.get()}, result);
      }
      case kOneZero3ModelStates:
        return WriteOneZero3ModelStates(-1 - index_[i], units_[i].outputs[0], staging, result);
      case kOneModelStates: {
        // tp rank 0's file as a tp=1 job's: mp_world_size 1 (checked
        // against the number of files), tp_degree 1 (0.19.5+), and no module
        // tensors: a universal load takes the weights from zero/ (and never
        // loads `module`), ucp from zero/ and ucp_module/; tp slices here
        // would be split again by Megatron's key names for a larger tp.
        state::FileValue root = ds_->ModelStatesRoot(0, 0);
        if (!root.value || !root.value->is(pickle::Kind::kDict)) {
          return absl::FailedPreconditionError("no model states for tp rank 0");
        }
        torch::TorchWriter w(HashedWrites(options_));
        ValuePtr out = Value::MakeDict();
        for (const auto& [k, v] : root.value->dict_items()) {
          const std::string key = k->is(pickle::Kind::kStr) ? k->str() : "";
          if (key == "module" && v->is(pickle::Kind::kDict)) {
            // No tensors; the state dict's attributes (`_metadata`) stay.
            ValuePtr empty = Value::MakeDict(/*ordered_dict=*/true);
            if (const ValuePtr& state = v->dict_state()) {
              UCP_ASSIGN_OR_RETURN(ValuePtr s, deepspeed::CopyTreeForWrite(state::FileValue{state, root.file}, w));
              empty->set_dict_state(s);
            }
            out->DictSet(k, empty);
          } else if (key == "mp_world_size") {
            out->DictSet(k, Value::Int(1));
          } else {
            UCP_ASSIGN_OR_RETURN(ValuePtr c, deepspeed::CopyTreeForWrite(state::FileValue{v, root.file}, w));
            if (key == "checkpoint_parallel_dimensions" && c->is(pickle::Kind::kDict) && c->DictGet("tp_degree")) {
              c->DictSet(Value::Str("tp_degree"), Value::Int(1));
            }
            out->DictSet(k, c);
          }
        }
        return WriteFiles(staging, units_[i].outputs, {&w}, {out.get()}, result);
      }
      case kVerify:
        return ExecuteVerifyUnit(state_, units_[i]);
    }
    return absl::InternalError("unknown unit");
  }

  absl::StatusOr<WriteStats> Finish(const std::vector<UnitResult>& results, const std::string& staging) const override {
    deepspeed::ManifestHeader header;
    header.source_folder = options_.source_folder;
    header.source_kind = "zero";
    Manifest manifest = deepspeed::ToManifest(UniversalInfo(info_), header);
    std::vector<FileDigest> files;
    for (const UnitResult& r : results) files.insert(files.end(), r.files.begin(), r.files.end());
    std::sort(files.begin(), files.end(), [](const FileDigest& a, const FileDigest& b) { return a.path() < b.path(); });
    for (auto& f : files) *manifest.add_file() = f;
    *manifest.mutable_rules() = options_.rules;
    std::string text;
    google::protobuf::TextFormat::PrintToString(manifest, &text);
    UCP_RETURN_IF_ERROR(WriteFileAtomic(JoinPath(staging, deepspeed::kManifestFile), text));
    WriteStats stats;
    AddUnitResults(results, &stats);
    stats.files += 1;
    stats.bytes += static_cast<int64_t>(text.size());
    stats.params = static_cast<int64_t>(info_.params.size());
    return stats;
  }

  std::string latest_file() const override { return deepspeed::kLatestUniversalFile; }
  const state::CheckpointState* source() const override { return &state_; }

 private:
  enum Kind { kParam, kOptimizerState, kModelStates, kOneModelStates, kOneZero3ModelStates, kVerify };

  // A ZeRO stage 3 source: DeepSpeed's stage-3 universal layout.
  bool zero3() const { return info_.zero_stage == 3; }
  // A ZeRO stage 3 source saved at tp > 1 (AutoTP, Megatron-style modules):
  // ds_to_universal.py (0.19.5 and later) merges its states over tp into the
  // stage 1/2 files (a dict with the full tensor and its merge keys, no
  // step.pt) beside the stage-3 model-state files and optimizer_state.pt.
  bool zero3_tp() const { return zero3() && info_.source_topology.tp > 1; }

  // dp rank d's model states of mp rank 0 as a tp=1 job's: mp_world_size 1
  // (checked against the number of files DeepSpeed's loader globs) and
  // checkpoint_parallel_dimensions' tp_degree 1, the rest as saved (`module`
  // holds ZeRO-3's empty placeholders). DeepSpeed's loader then reads it at
  // any tp instead of merging the tp ranks' files by Megatron's key names.
  absl::Status WriteOneZero3ModelStates(int d, const std::string& rel, const std::string& staging,
                                        UnitResult* result) const {
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<torch::TorchFile> opened, torch::TorchFile::Open(ds_->DpModelStatesPath(d, 0)));
    std::shared_ptr<const torch::TorchFile> f(std::move(opened));
    const Value& root = *f->root();
    if (!root.is(pickle::Kind::kDict)) {
      return absl::InvalidArgumentError(absl::StrCat(ds_->DpModelStatesPath(d, 0), ": expected a dict of model states"));
    }
    torch::TorchWriter w(HashedWrites(options_));
    ValuePtr out = Value::MakeDict();
    for (const auto& [k, v] : root.dict_items()) {
      const std::string key = k->is(pickle::Kind::kStr) ? k->str() : "";
      if (key == "mp_world_size") {
        out->DictSet(k, Value::Int(1));
        continue;
      }
      UCP_ASSIGN_OR_RETURN(ValuePtr c, deepspeed::CopyTreeForWrite(state::FileValue{v, f}, w));
      if (key == "checkpoint_parallel_dimensions" && c->is(pickle::Kind::kDict) && c->DictGet("tp_degree")) {
        c->DictSet(Value::Str("tp_degree"), Value::Int(1));
      }
      out->DictSet(k, c);
    }
    return WriteFiles(staging, {rel}, {&w}, {out.get()}, result);
  }

  // Whether the target version's stage-3 universal loader reads what ucp
  // writes (stage3.py load_hp_checkpoint_state_from_checkpoint_dir_stage3).
  absl::Status CheckZero3Loader() const {
    const std::string version = UniversalLoaderVersion(state_, options_);
    auto v = deepspeed::ParseDsVersion(version);
    const int tp = info_.source_topology.tp;
    if (!v.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("ZeRO stage 3 source with ds_version '", version,
                                                     "': pass --target_ds_version (",
                                                     tp > 1 ? "0.19.5 or later" : "0.15.0 or later", ")"));
    }
    if (tp > 1) {
      // ds_to_universal.py (0.19.5 and later) merges such a checkpoint over
      // tp into the stage 1/2 files; only the stage-3 loaders of 0.19.5 and
      // later read those (a dict's 'param'; before, a raw tensor).
      if (*v < deepspeed::DsVersion{0, 19, 5}) {
        return absl::FailedPreconditionError(absl::StrCat(
            "a ZeRO stage 3 checkpoint at tp=", tp, " for DeepSpeed ", version,
            ": the universal folder of a ZeRO-3 checkpoint saved at tp > 1 holds each param merged over tp, which "
            "the stage-3 universal loader reads from DeepSpeed 0.19.5 on (before, it reads one raw tensor per param "
            "and has no tp); pass --target_ds_version=0.19.5 or later, or use `ucp reshard` (--tp=N --zero_stage=1, "
            "2 or 3 at any tp) for that version"));
      }
      return absl::OkStatus();
    }
    if (*v < deepspeed::DsVersion{0, 15, 0}) {
      return absl::FailedPreconditionError(absl::StrCat(
          "DeepSpeed ", version, " has no ZeRO stage 3 universal checkpoint loader (it came in 0.15.0): use "
          "`ucp reshard` to write a ZeRO-3 checkpoint at the new dp instead"));
    }
    // Master edaa72212 (0.19.6) reads the stage-3 layout as 0.19.5 does
    // (_load_universal_checkpoint and load_hp_checkpoint_state unchanged).
    if (deepspeed::DsVersion{0, 19, 6} < *v) {
      return absl::FailedPreconditionError(absl::StrCat(
          "DeepSpeed ", version, ": ucp writes the ZeRO-3 universal layout of 0.15 to 0.19.6 (master edaa72212)"));
    }
    if (*v < deepspeed::DsVersion{0, 18, 0} && info_.num_groups > 1) {
      return absl::FailedPreconditionError(absl::StrCat(
          "DeepSpeed ", version, "'s ZeRO stage 3 universal loader reads one param group (param_shapes[0]) and the "
          "checkpoint has ", info_.num_groups, ": load it with DeepSpeed >= 0.18.0 (--target_ds_version), or use "
          "`ucp reshard` to write a ZeRO-3 checkpoint at the new dp"));
    }
    if (*v < deepspeed::DsVersion{0, 18, 0}) {
      // Before 0.18 the loader copies every param into sub-group 0 and hands
      // optimizer_state.pt's optimizer_state_dict (rank 0's, as DeepSpeed's
      // converter writes it) to torch's load_state_dict, whose group must then
      // list as many params as the loading job's one: a single sub-group.
      // With more, DeepSpeed stops with "loaded state dict contains a
      // parameter group that doesn't match the size of optimizer's group".
      UCP_ASSIGN_OR_RETURN(state::FileValue common, ds_->OptimizerCommon());
      const pickle::Value* osd = common.value->DictGet("optimizer_state_dict");
      const pickle::Value* groups = osd != nullptr ? osd->DictGet("param_groups") : nullptr;
      const pickle::Value* params =
          groups != nullptr && groups->size() > 0 ? groups->items()[0]->DictGet("params") : nullptr;
      if (params != nullptr && params->size() > 1) {
        return absl::FailedPreconditionError(absl::StrCat(
            "DeepSpeed ", version, "'s ZeRO stage 3 universal loader reads one sub-group, and rank 0 of this "
            "checkpoint has ", params->size(), " sub-groups (zero_optimization.sub_group_size smaller than its "
            "partition): load it with DeepSpeed >= 0.18.0 (--target_ds_version), or use `ucp reshard` to write a "
            "ZeRO-3 checkpoint at the new dp (--sub_group_size of the loading job)"));
      }
    }
    return absl::OkStatus();
  }

  // Writes staging/rels[k] from writers[k] and roots[k] (their hashes are
  // computed two at a time: TorchWriter::WriteFiles).
  absl::Status WriteFiles(const std::string& staging, const std::vector<std::string>& rels,
                          const std::vector<torch::TorchWriter*>& writers, const std::vector<const Value*>& roots,
                          UnitResult* result) const {
    std::vector<std::string> paths;
    for (const std::string& rel : rels) paths.push_back(JoinPath(staging, rel));
    UCP_RETURN_IF_ERROR(torch::TorchWriter::WriteFiles(writers, paths, roots));
    for (size_t k = 0; k < rels.size(); ++k) {
      result->files.push_back(
          Digest(rels[k], static_cast<int64_t>(writers[k]->bytes_written()), writers[k]->digest_hex(), options_.digest));
    }
    return absl::OkStatus();
  }

  absl::Status WriteParam(const ParamState& p, const std::string& staging, UnitResult* result) const {
    if (!p.trainable()) {
      UCP_ASSIGN_OR_RETURN(tp::TensorPlan plan, state_.Full(p, state::kLpState));
      torch::TorchWriter w(HashedWrites(options_));
      ValuePtr t = tp::AddPlan(w, plan);
      ValuePtr root = deepspeed::UniversalParamDict(UniversalRule(p), t);
      return WriteFiles(staging, {JoinPath(deepspeed::kUniversalModuleDir, p.name + ".pt")}, {&w}, {root.get()},
                        result);
    }
    const std::string rel_dir = JoinPath(deepspeed::kUniversalZeroDir, p.name);
    UCP_RETURN_IF_ERROR(MakeDirs(JoinPath(staging, rel_dir)));
    // The step, the fp32 master and the optimizer states, written together.
    std::vector<std::unique_ptr<torch::TorchWriter>> owned;
    std::vector<torch::TorchWriter*> writers;
    std::vector<ValuePtr> roots;
    std::vector<std::string> rels;
    auto add_file = [&](std::string rel) -> torch::TorchWriter& {
      owned.push_back(std::make_unique<torch::TorchWriter>(HashedWrites(options_)));
      writers.push_back(owned.back().get());
      rels.push_back(std::move(rel));
      return *owned.back();
    };
    UCP_ASSIGN_OR_RETURN(state::FileValue step, state_.GroupScalar(p.group, "step"));
    if (step.value && !zero3()) {
      torch::TorchWriter& w = add_file(JoinPath(rel_dir, "step.pt"));
      UCP_ASSIGN_OR_RETURN(ValuePtr v, deepspeed::CopyTreeForWrite(step, w));
      roots.push_back(std::move(v));
    }
    for (const std::string& s : states_) {
      UCP_ASSIGN_OR_RETURN(tp::TensorPlan plan, state_.Full(p, s));
      if (plan.shape() != p.full_shape) {
        return absl::InternalError(absl::StrCat("param '", p.name, "' ", s, ": merged shape ",
                                                torch::ShapeString(plan.shape()), " differs from ",
                                                torch::ShapeString(p.full_shape)));
      }
      torch::TorchWriter& w = add_file(JoinPath(rel_dir, s + ".pt"));
      const bool raw = zero3() && !zero3_tp();
      if (raw) {
        // ZeRO-3 at tp 1 (ds_to_universal.py merge_zero3_slices): the raw
        // flat tensor, which the stage-3 loader views as 1-D and partitions.
        UCP_ASSIGN_OR_RETURN(plan, plan.Reshape({plan.numel()}));
      }
      ValuePtr t = tp::AddPlan(w, plan);  // the writer keeps a copy of the plan
      // DeepSpeed's fp32 masters keep requires_grad=True through the merge.
      if (s == state::kFp32State) UCP_RETURN_IF_ERROR(tp::SetRequiresGrad(*t, true));
      roots.push_back(raw ? t : deepspeed::UniversalParamDict(UniversalRule(p), t));
    }
    std::vector<const Value*> root_ptrs;
    for (const ValuePtr& r : roots) root_ptrs.push_back(r.get());
    return WriteFiles(staging, rels, writers, root_ptrs, result);
  }

  const state::ModelState& state_;
  const state::ModelInfo& info_;
  UniversalWriteOptions options_;
  std::unique_ptr<deepspeed::DeepSpeedFacet> owned_facet_;
  const deepspeed::DeepSpeedFacet* ds_ = nullptr;
  std::vector<std::string> states_;
  std::vector<Kind> kinds_;
  std::vector<int> index_;  // param index, or pp * tp + t of a model-states unit
  bool any_module_ = false;
};

}  // namespace

std::string UniversalLoaderVersion(const state::CheckpointState& state, const UniversalWriteOptions& options) {
  return options.target_ds_version.empty() ? deepspeed::SourceDsVersion(state) : options.target_ds_version;
}

bool PlainModuleAtTpAboveOne(const state::ModelInfo& info) {
  return !info.pipeline && info.zero_stage < 3 && info.source_topology.pp == 1 && info.source_topology.tp > 1;
}

absl::StatusOr<std::unique_ptr<Plan>> PlanUniversal(const state::ModelState& state,
                                                    const UniversalWriteOptions& options) {
  auto plan = std::make_unique<UniversalPlan>(state, options);
  UCP_RETURN_IF_ERROR(plan->Build());
  return std::unique_ptr<Plan>(std::move(plan));
}

absl::StatusOr<WriteStats> WriteUniversal(const state::ModelState& state, const std::string& output_folder,
                                          const UniversalWriteOptions& options) {
  UCP_ASSIGN_OR_RETURN(std::unique_ptr<Plan> plan, PlanUniversal(state, options));
  return RunPlan(*plan, output_folder, UniversalRunOptions(options));
}

}  // namespace ucp::deepspeed_universal
