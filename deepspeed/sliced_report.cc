#include "deepspeed/sliced_report.h"

#include <vector>

#include "absl/strings/match.h"
#include "base/fs.h"

namespace ucp::deepspeed {

absl::StatusOr<InspectReport> SlicedReport(const state::SlicedState& st, const std::string& kind,
                                           const std::string& ds_version) {
  const state::ModelInfo& info = st.info();
  InspectReport report;
  report.set_path(st.dir());
  report.set_kind(kind);
  report.set_tag(Basename(st.dir()));
  *report.mutable_topology() = info.source_topology.ToProto();
  report.set_zero_stage(info.zero_stage);
  report.set_optimizer_layout(state::OptimizerKindName(info.optimizer_kind));
  report.set_lp_dtype(std::string(torch::DTypeName(info.lp_dtype)));
  report.set_pipeline(false);
  report.set_ds_version(ds_version);
  report.set_fragment_ranges(true);
  for (const std::string& f : st.InputFiles()) report.add_file(Basename(f));
  std::vector<int64_t> numel(info.num_groups, 0);
  std::vector<int> count(info.num_groups, 0);
  for (const auto& p : info.params) {
    InspectReport::Param* ip = report.add_param();
    ip->set_name(p.name);
    for (int64_t d : p.tp_shapes[0]) ip->add_shape(d);
    ip->set_dtype(p.trainable() ? "float32" : std::string(torch::DTypeName(p.lp_dtype)));
    ip->set_group(p.trainable() ? p.group : -1);
    ip->set_frozen(p.role == state::TensorRole::kFrozen);
    ip->set_layer(-1);
    if (p.trainable() && p.group >= 0 && p.group < info.num_groups) {
      int64_t n = 1;
      for (int64_t d : p.tp_shapes[0]) n *= d;
      numel[p.group] += n;
      ++count[p.group];
    }
    for (const state::InputRange& r : st.Inputs(p)) {
      if (p.trainable() && !absl::StartsWith(r.tensor, "fp32_flat_groups") &&
          !absl::StartsWith(r.tensor, "single_partition_of_fp32_groups")) {
        continue;  // the optimizer states sit beside the masters
      }
      InspectReport::Fragment* f = ip->add_fragment();
      f->set_file(Basename(r.path));
      f->set_offset(r.length >= 0 ? r.offset / 4 : 0);
      f->set_numel(r.length >= 0 ? r.length / 4 : 0);
    }
  }
  for (int g = 0; g < info.num_groups; ++g) {
    InspectReport::ParamGroup* pg = report.add_group();
    pg->set_index(g);
    pg->set_numel(numel[g]);
    pg->set_num_params(count[g]);
  }
  return report;
}

}  // namespace ucp::deepspeed
