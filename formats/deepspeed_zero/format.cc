#include "formats/deepspeed_zero/format.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/fs.h"
#include "base/status_macros.h"
#include "deepspeed/checkpoint_files.h"
#include "deepspeed/read_options.h"
#include "formats/deepspeed_source.h"
#include "formats/deepspeed_zero/zero_checkpoint.h"
#include "formats/deepspeed_zero/zero_state.h"
#include "formats/deepspeed_zero/zero_writer.h"

namespace ucp::deepspeed_zero {
namespace {

using deepspeed::ZeroParam;
using pickle::Kind;
using pickle::Value;

ZeroReadOptions ZeroReadOf(const formats::SourceOptions& options) {
  ZeroReadOptions o;
  o.make_vocab_size_divisible_by = options.make_vocab_size_divisible_by;
  o.tied_layers = options.tied_layers;
  return o;
}

JobDescription::ModuleEntry EncodeModuleEntry(const ModuleEntry& e) {
  JobDescription::ModuleEntry m;
  m.set_name(e.name);
  m.set_local_name(e.local_name);
  m.set_layer(e.layer);
  m.set_role(state::TensorRoleName(e.role));
  m.set_tied_key(e.tied_key);
  m.set_dtype(std::string(torch::DTypeName(e.dtype)));
  for (const auto& shape : e.tp_shapes) {
    auto* t = m.add_tp_shape();
    for (int64_t d : shape) t->add_dim(d);
  }
  return m;
}

absl::StatusOr<ModuleEntry> DecodeModuleEntry(const JobDescription::ModuleEntry& m) {
  ModuleEntry e;
  e.name = m.name();
  e.local_name = m.local_name();
  e.layer = m.layer();
  e.role = m.role() == "trainable" ? state::TensorRole::kTrainable
           : m.role() == "buffer"  ? state::TensorRole::kBuffer
           : m.role() == "tied"    ? state::TensorRole::kTied
                                   : state::TensorRole::kFrozen;
  e.tied_key = m.tied_key();
  UCP_ASSIGN_OR_RETURN(e.dtype, torch::ParseDType(m.dtype()));
  for (const auto& t : m.tp_shape()) e.tp_shapes.emplace_back(t.dim().begin(), t.dim().end());
  return e;
}

absl::StatusOr<InspectReport> InspectZero(const std::string& path, const deepspeed::ReadOptions& read) {
  UCP_ASSIGN_OR_RETURN(auto ckpt, ZeroCheckpoint::Open(path, read));
  InspectReport report;
  report.set_path(ckpt->dir());
  report.set_kind("zero");
  report.set_tag(ckpt->tag());
  *report.mutable_topology() = ckpt->topology().ToProto();
  report.set_zero_stage(ckpt->zero_stage());
  report.set_optimizer_layout(state::OptimizerKindName(ckpt->optimizer_kind()));
  report.set_lp_dtype(std::string(torch::DTypeName(ckpt->lp_dtype())));
  report.set_pipeline(ckpt->pipeline());
  report.set_kind_detail(absl::StrFormat(
      "ZeRO stage %d, %s optimizer layout", ckpt->zero_stage(),
      ckpt->optimizer_kind() == state::OptimizerKind::kBf16 ? "BF16_Optimizer" : "DeepSpeedZeroOptimizer"));
  report.set_fragment_ranges(true);
  for (const auto& f : ckpt->files()) report.add_file(f);
  // Every optimizer file's structure and its agreement with the others
  // (steps, versions, fp32 masters against the lp weights); not its CRCs.
  for (int s = 0; s < ckpt->topology().pp; ++s) {
    for (int r = 0; r < ckpt->topology().tp; ++r) {
      for (int d = 0; d < ckpt->topology().dp; ++d) {
        auto f = ckpt->Optim(s, r, d);
        if (!f.ok()) report.add_problem(std::string(f.status().message()));
      }
    }
  }
  const Value* ver = ckpt->MpRankFile(0, 0).root()->DictGet("ds_version");
  if (ver != nullptr && ver->is(Kind::kStr)) report.set_ds_version(ver->str());
  const state::Topology& t = ckpt->topology();
  for (int g = 0; g < ckpt->num_groups(); ++g) {
    const deepspeed::ZeroGroupLayout& layout = ckpt->Layout(0, 0, g);
    InspectReport::ParamGroup* pg = report.add_group();
    pg->set_index(g);
    pg->set_numel(layout.numel());
    int n = 0;
    for (int s = 0; s < t.pp; ++s) n += static_cast<int>(ckpt->StageGroup(s, g).size());
    pg->set_num_params(n);
    for (int d = 0; d < t.dp; ++d) pg->add_padding(layout.padding(d));
    pg->set_partition_numel(layout.partition_numel());
  }
  for (const ZeroParam& p : ckpt->params()) {
    InspectReport::Param* ip = report.add_param();
    ip->set_name(p.name);
    for (int64_t d : p.tp_shapes[0]) ip->add_shape(d);
    ip->set_dtype("float32");
    ip->set_group(p.group);
    ip->set_layer(p.layer);
    for (size_t si = 0; si < p.stages.size(); ++si) {
      const int s = p.stages[si];
      for (int r = 0; r < t.tp; ++r) {
        for (const auto& [d, frag] : ckpt->Layout(s, r, p.group).FragmentsOfParam(p.index_in_group[si])) {
          InspectReport::Fragment* f = ip->add_fragment();
          f->set_file(Basename(ckpt->OptimPath(s, r, d)));
          f->set_tp_rank(r);
          f->set_pp_rank(s);
          f->set_dp_rank(d);
          f->set_offset(frag.partition_offset);
          f->set_numel(frag.numel);
        }
      }
    }
  }
  for (const ModuleEntry& e : ckpt->module_entries()) {
    if (e.role == state::TensorRole::kTrainable) continue;
    InspectReport::Param* ip = report.add_param();
    ip->set_name(e.name);
    for (int64_t d : e.tp_shapes[0]) ip->add_shape(d);
    ip->set_dtype(std::string(torch::DTypeName(e.dtype)));
    ip->set_group(-1);
    ip->set_frozen(e.role == state::TensorRole::kFrozen);
    ip->set_layer(e.layer);
    for (int r = 0; r < t.tp; ++r) {
      InspectReport::Fragment* f = ip->add_fragment();
      f->set_file(e.layer >= 0 ? deepspeed::LayerFileName(e.layer, r) : deepspeed::MpRankFileName(r));
      f->set_tp_rank(r);
      f->set_numel(1);
      for (int64_t d : e.tp_shapes[r]) f->set_numel(f->numel() * d);
    }
  }
  return report;
}

void VerifyZero(const std::string& path, const deepspeed::ReadOptions& read, formats::VerifyResult& r) {
  absl::StatusOr<std::unique_ptr<ZeroCheckpoint>> opened = ZeroCheckpoint::Open(path, read);
  if (!opened.ok()) {
    r.problems.push_back(std::string(opened.status().message()));
    return;
  }
  const ZeroCheckpoint& c = **opened;
  r.dir = c.dir();
  const state::Topology& t = c.topology();
  r.files_checked += t.mp_world_size();  // opened and CRC-checked by Open
  for (int s = 0; s < t.pp; ++s) {
    for (int tp = 0; tp < t.tp; ++tp) {
      for (int d = 0; d < t.dp; ++d) {
        ++r.files_checked;
        absl::Status st = c.VerifyFile(c.OptimPath(s, tp, d));
        if (!st.ok()) r.problems.push_back(std::string(st.message()));
      }
    }
  }
  for (int layer : c.layer_files()) {
    for (int tp = 0; tp < t.tp; ++tp) {
      ++r.files_checked;
      absl::StatusOr<const torch::TorchFile*> f = c.LayerFile(layer, tp);
      absl::Status st = f.ok() ? (*f)->VerifyAllCrcs() : f.status();
      if (!st.ok()) r.problems.push_back(std::string(st.message()));
    }
  }
}


class ZeroSource : public formats::SourceFormat {
 public:
  absl::string_view name() const override { return kName; }
  absl::string_view kind() const override { return kKind; }
  absl::string_view summary() const override {
    return "a DeepSpeed ZeRO stage 1/2 checkpoint (mp_rank_XX_model_states.pt, *zero_pp_rank_D_mp_rank_XX_optim_states.pt)";
  }
  absl::string_view latest_file() const override { return deepspeed::kLatestFile; }

  bool Detect(const formats::CheckpointFolder& folder) const override {
    for (const std::string& n : folder.names) {
      auto parsed = deepspeed::ParseCheckpointFileName(n);
      if (parsed && parsed->type == deepspeed::CheckpointFileName::Type::kMpRank) return true;
    }
    return false;
  }

  absl::StatusOr<formats::OpenedSource> Open(const formats::CheckpointFolder& folder,
                                             const formats::SourceOptions& options,
                                             JobDescription* description) const override {
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<ZeroCheckpoint> ckpt, ZeroCheckpoint::Open(folder.dir, formats::DeepSpeedReadOptions(options)));
    std::shared_ptr<const ZeroCheckpoint> shared(std::move(ckpt));
    if (description != nullptr) {
      description->set_has_module_entries(true);
      for (const auto& e : shared->module_entries()) *description->add_module_entry() = EncodeModuleEntry(e);
    }
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<ZeroSlicedState> sliced, ZeroSlicedState::Make(shared, ZeroReadOf(options)));
    return formats::ResolveSliced(this, std::move(sliced), options.resolve());
  }

  absl::StatusOr<formats::OpenedSource> Reopen(const formats::CheckpointFolder& folder,
                                               const formats::SourceOptions& options,
                                               const JobDescription& description) const override {
    std::vector<ModuleEntry> entries;
    for (const auto& m : description.module_entry()) {
      UCP_ASSIGN_OR_RETURN(ModuleEntry e, DecodeModuleEntry(m));
      entries.push_back(std::move(e));
    }
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<ZeroCheckpoint> ckpt,
                         ZeroCheckpoint::Open(folder.dir, std::move(entries), formats::DeepSpeedReadOptions(options)));
    std::shared_ptr<const ZeroCheckpoint> shared(std::move(ckpt));
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<ZeroSlicedState> sliced, ZeroSlicedState::Make(shared, ZeroReadOf(options)));
    UCP_ASSIGN_OR_RETURN(state::ModelInfo decided, formats::DecidedModel(description));
    return formats::ResolveSliced(this, std::move(sliced), options.resolve(), &decided);
  }

  absl::StatusOr<formats::SlicedSource> OpenSliced(const formats::CheckpointFolder& folder,
                                                   const formats::SourceOptions& options) const override {
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<ZeroCheckpoint> ckpt, ZeroCheckpoint::Open(folder.dir, formats::DeepSpeedReadOptions(options)));
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<ZeroSlicedState> sliced,
                         ZeroSlicedState::Make(std::move(ckpt), ZeroReadOf(options)));
    return formats::SlicedSource{std::move(sliced), options.resolve()};
  }

  absl::StatusOr<InspectReport> Inspect(const formats::CheckpointFolder& folder,
                                        const formats::SourceOptions& options) const override {
    return InspectZero(folder.dir, formats::DeepSpeedReadOptions(options));
  }

  void Verify(const formats::CheckpointFolder& folder, const formats::SourceOptions& options,
              formats::VerifyResult* result) const override {
    VerifyZero(folder.dir, formats::DeepSpeedReadOptions(options), *result);
  }
};

class ZeroTarget : public formats::TargetFormat {
 public:
  absl::string_view name() const override { return kName; }
  absl::string_view summary() const override { return "a DeepSpeed ZeRO stage 1/2 checkpoint at any tp/pp/dp"; }
  formats::TargetFamily family() const override { return formats::TargetFamily::kTrainingState; }
  bool PicksFor(const state::ModelInfo& info, const writers::ZeroWriteOptions& options) const override {
    const int stage = options.zero_stage > 0 ? options.zero_stage : info.zero_stage;
    return stage == 1 || stage == 2;
  }
  absl::StatusOr<std::unique_ptr<writers::Plan>> PlanTrainingState(const state::ModelState& state,
                                                                   const writers::ZeroWriteOptions& options,
                                                                   writers::TargetSummary* summary) const override {
    TargetLayout layout;
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<writers::Plan> plan, PlanZero(state, options, &layout));
    if (summary != nullptr) {
      summary->topo = layout.topo;
      summary->zero_stage = layout.zero_stage;
      summary->partition_method = layout.partition_method;
      summary->parts = layout.parts;
      if (!layout.args_changes.empty()) summary->notes.push_back(deepspeed::DescribeArgsChanges(layout.args_changes));
    }
    return plan;
  }
};

}  // namespace

void Register(formats::Registry& registry) {
  registry.AddSource(std::make_unique<ZeroSource>());
  registry.AddTarget(std::make_unique<ZeroTarget>());
}

}  // namespace ucp::deepspeed_zero
