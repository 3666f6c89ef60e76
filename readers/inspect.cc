#include "readers/inspect.h"

#include <sys/stat.h>

#include <algorithm>
#include <functional>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/fs.h"
#include "base/status_macros.h"
#include "deepspeed/checkpoint_files.h"
#include "readers/moe_state.h"
#include "readers/universal_checkpoint.h"
#include "readers/zero3_state.h"
#include "readers/zero_checkpoint.h"
#include "format/pickle/unsafe.h"
#include "format/torch/torch_file.h"

namespace ucp::readers {
namespace {

using pickle::Kind;
using pickle::Value;

std::string TensorSummary(const torch::Tensor& t) {
  std::string s = absl::StrCat("tensor ", std::string(torch::DTypeName(t.dtype())), torch::ShapeString(t.sizes()));
  if (!t.is_contiguous()) absl::StrAppend(&s, " stride=", torch::ShapeString(t.strides()));
  if (t.storage_offset() != 0) absl::StrAppend(&s, " offset=", t.storage_offset());
  if (t.storage()->numel() != t.numel()) absl::StrAppend(&s, " storage=", t.storage()->numel());
  if (t.requires_grad()) absl::StrAppend(&s, " requires_grad");
  return s;
}

bool IsUnsafe(const Value& v) { return pickle::IsUnsafeValue(v); }

// The object tree of one file, one node per value, tensors summarized. A
// container or object the pickle shares (memo references) is listed once;
// later occurrences refer to its first path, so the output is linear in the
// file however the pickle nests shared parts.
class TreeWalker {
 public:
  TreeWalker(const torch::TorchFile& f, InspectReport& report) : f_(f), report_(report) {}

  absl::Status Walk(const Value& v, const std::string& path, const std::string& key, int depth) {
    if (depth > 64) return absl::OkStatus();
    InspectReport::Node* node = report_.add_node();
    node->set_path(path.empty() ? "." : path);
    node->set_key(key.empty() ? "<root>" : key);
    node->set_depth(depth);
    if (torch::TorchFile::IsTensor(v)) {
      UCP_ASSIGN_OR_RETURN(torch::Tensor t, f_.GetTensor(v));
      node->set_type("tensor");
      node->set_summary(TensorSummary(t));
      return absl::OkStatus();
    }
    node->set_type(pickle::KindName(v.kind()));
    const bool shareable = v.is(Kind::kDict) || v.is(Kind::kList) || v.is(Kind::kTuple) || v.is(Kind::kObject) ||
                           v.is(Kind::kSet) || v.is(Kind::kFrozenSet);
    if (shareable) {
      auto [it, inserted] = first_path_.emplace(&v, node->path());
      if (!inserted) {
        node->set_summary(absl::StrCat("<the same ", pickle::KindName(v.kind()), " as ", it->second, ">"));
        return absl::OkStatus();
      }
    }
    auto child = [&](const std::string& key) { return path.empty() ? key : absl::StrCat(path, ".", key); };
    switch (v.kind()) {
      case Kind::kDict:
        node->set_summary(absl::StrCat(v.ordered_dict() ? "OrderedDict" : "dict", " of ", v.dict_items().size()));
        for (const auto& [k, val] : v.dict_items()) {
          const std::string key = k->is(Kind::kStr) ? k->str() : k->DebugString(40);
          UCP_RETURN_IF_ERROR(Walk(*val, child(key), key, depth + 1));
        }
        return absl::OkStatus();
      case Kind::kList:
      case Kind::kTuple: {
        node->set_summary(absl::StrCat(pickle::KindName(v.kind()), " of ", v.items().size()));
        // Long lists of scalars (rng states) are summarized, not listed.
        bool scalars = true;
        for (const auto& item : v.items()) scalars &= item->is(Kind::kInt) || item->is(Kind::kFloat);
        if (scalars && v.items().size() > 8) return absl::OkStatus();
        for (size_t i = 0; i < v.items().size(); ++i) {
          UCP_RETURN_IF_ERROR(Walk(*v.items()[i], child(absl::StrCat(i)), absl::StrCat(i), depth + 1));
        }
        return absl::OkStatus();
      }
      default:
        node->set_summary(IsUnsafe(v) ? absl::StrCat("UNSAFE (code execution when torch.load-ed): ", v.DebugString(160))
                                      : v.DebugString(160));
        return absl::OkStatus();
    }
  }

 private:
  const torch::TorchFile& f_;
  InspectReport& report_;
  absl::flat_hash_map<const Value*, std::string> first_path_;
};

absl::StatusOr<InspectReport> InspectFile(const std::string& path) {
  InspectReport report;
  report.set_path(path);
  report.set_kind("file");
  torch::OpenOptions o;
  o.refuse_unsafe_globals = false;  // reported instead
  UCP_ASSIGN_OR_RETURN(auto f, torch::TorchFile::Open(path, o));
  for (const auto& r : f->RecordNames()) report.add_file(r);
  for (const auto& g : f->unsafe_globals()) report.add_unsafe(absl::StrCat(path, ": ", g));
  TreeWalker walker(*f, report);
  UCP_RETURN_IF_ERROR(walker.Walk(*f->root(), "", "", 0));
  return report;
}

absl::StatusOr<InspectReport> InspectZero(const std::string& path) {
  UCP_ASSIGN_OR_RETURN(auto ckpt, ZeroCheckpoint::Open(path));
  InspectReport report;
  report.set_path(ckpt->dir());
  report.set_kind("zero");
  report.set_tag(ckpt->tag());
  *report.mutable_topology() = ckpt->topology().ToProto();
  report.set_zero_stage(ckpt->zero_stage());
  report.set_optimizer_layout(state::OptimizerKindName(ckpt->optimizer_kind()));
  report.set_lp_dtype(std::string(torch::DTypeName(ckpt->lp_dtype())));
  report.set_pipeline(ckpt->pipeline());
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

absl::StatusOr<InspectReport> InspectUniversal(const std::string& path) {
  UCP_ASSIGN_OR_RETURN(auto u, UniversalCheckpoint::Open(path));
  InspectReport report;
  report.set_path(u->dir());
  report.set_kind("universal");
  report.set_tag(u->tag());
  *report.mutable_topology() = u->model_states().topology().ToProto();
  report.set_pipeline(u->model_states().pipeline());
  report.set_lp_dtype(std::string(torch::DTypeName(u->model_states().config_lp_dtype())));
  const Value* ver = u->model_states().file(0, 0).root()->DictGet("ds_version");
  if (ver != nullptr && ver->is(Kind::kStr)) report.set_ds_version(ver->str());
  for (const ZeroParam& p : u->model_states().params()) {
    UCP_ASSIGN_OR_RETURN(UniversalStateFile f, u->ReadState(p.name, "fp32"));
    InspectReport::Param* ip = report.add_param();
    ip->set_name(p.name);
    for (int64_t d : f.param.sizes()) ip->add_shape(d);
    ip->set_dtype(std::string(torch::DTypeName(f.param.dtype())));
    ip->set_group(p.group);
    ip->set_layer(p.layer);
    for (const auto& s : u->StateFiles(p.name)) {
      InspectReport::Fragment* fr = ip->add_fragment();
      fr->set_file(JoinPath(JoinPath(deepspeed::kUniversalZeroDir, p.name), s + ".pt"));
    }
  }
  for (const auto& name : u->module_names()) {
    UCP_ASSIGN_OR_RETURN(UniversalStateFile f, u->ReadModule(name));
    InspectReport::Param* ip = report.add_param();
    ip->set_name(name);
    for (int64_t d : f.param.sizes()) ip->add_shape(d);
    ip->set_dtype(std::string(torch::DTypeName(f.param.dtype())));
    ip->set_group(-1);
    ip->set_frozen(true);
    ip->add_fragment()->set_file(JoinPath(deepspeed::kUniversalModuleDir, name + ".pt"));
  }
  return report;
}

// ZeRO-3 and native MoE folders: from their SlicedState (tp = pp = 1).
absl::StatusOr<InspectReport> InspectSliced(const state::SlicedState& st, const std::string& kind,
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

}  // namespace

std::vector<std::string> ScanUnsafeGlobals(const std::string& folder) {
  std::vector<std::string> out;
  std::vector<std::string> stack = {folder};
  while (!stack.empty()) {
    const std::string dir = stack.back();
    stack.pop_back();
    auto names = ListDirectory(dir);
    if (!names.ok()) continue;
    for (const auto& n : *names) {
      const std::string p = JoinPath(dir, n);
      struct stat st;
      if (lstat(p.c_str(), &st) != 0) continue;
      if (S_ISDIR(st.st_mode)) {
        if (dir == folder && (n == deepspeed::kUniversalZeroDir || n == deepspeed::kUniversalModuleDir)) stack.push_back(p);
        if (dir != folder) stack.push_back(p);
        continue;
      }
      if (!S_ISREG(st.st_mode) || !absl::EndsWith(n, ".pt")) continue;
      torch::OpenOptions o;
      o.verify_crc = false;
      o.refuse_unsafe_globals = false;
      auto f = torch::TorchFile::Open(p, o);
      if (!f.ok()) continue;  // the reader reports damaged files
      for (const auto& g : (*f)->unsafe_globals()) out.push_back(absl::StrCat(p, ": ", g));
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<InspectReport> Inspect(const std::string& path) {
  if (!PathExists(path)) return absl::NotFoundError(absl::StrCat(path, ": no such file or folder"));
  if (!IsDirectory(path)) return InspectFile(path);
  // The folder the files are in (a root's latest names it).
  std::string dir = path;
  const bool universal = LooksLikeUniversalFolder(path);
  const char* latest = universal ? deepspeed::kLatestUniversalFile : deepspeed::kLatestFile;
  if (!IsDirectory(JoinPath(path, deepspeed::kUniversalZeroDir)) && PathExists(JoinPath(path, latest))) {
    bool has_mp = false;
    auto names = ListDirectory(path);
    if (names.ok()) {
      for (const auto& n : *names) {
        auto parsed = deepspeed::ParseCheckpointFileName(n);
        has_mp |= parsed && parsed->type == deepspeed::CheckpointFileName::Type::kMpRank;
      }
    }
    if (!has_mp) {
      UCP_ASSIGN_OR_RETURN(std::string tag, ReadLatestTag(path, latest));
      dir = JoinPath(path, tag);
    }
  }
  const std::vector<std::string> unsafe = ScanUnsafeGlobals(dir);
  // Inspecting reads what it reports: files with unsafe globals included.
  const bool allowed = torch::AllowUnsafePickles();
  if (!unsafe.empty()) torch::SetAllowUnsafePickles(true);
  absl::StatusOr<InspectReport> report = [&]() -> absl::StatusOr<InspectReport> {
    if (universal) return InspectUniversal(path);
    if (IsZero3Folder(path)) {
      UCP_ASSIGN_OR_RETURN(auto z3, Zero3State::Open(path));
      return InspectSliced(*z3, "zero3", z3->ds_version());
    }
    if (IsMoeFolder(path)) {
      UCP_ASSIGN_OR_RETURN(auto moe, MoeState::Open(path));
      return InspectSliced(*moe, "moe", deepspeed::SourceDsVersion(*moe));
    }
    return InspectZero(path);
  }();
  torch::SetAllowUnsafePickles(allowed);
  if (!report.ok()) return report.status();
  for (const auto& u : unsafe) report->add_unsafe(u);
  return report;
}

std::string FormatReport(const InspectReport& r) {
  std::string out;
  for (const auto& u : r.unsafe()) {
    absl::StrAppend(&out, "UNSAFE ", u, " (a code-execution global: torch.load would run it; ucp never does)\n");
  }
  for (const auto& p : r.problem()) absl::StrAppend(&out, "PROBLEM ", p, "\n");
  if (r.kind() == "file") {
    absl::StrAppend(&out, r.path(), ": torch.save archive, ", r.file_size(), " records\n");
    for (const auto& n : r.node()) {
      absl::StrAppend(&out, std::string(2 * n.depth(), ' '), n.key(), ": ", n.summary(), "\n");
    }
    return out;
  }
  absl::StrAppendFormat(&out, "%s\n  kind: %s", r.path(), r.kind());
  if (r.kind() == "zero") {
    absl::StrAppendFormat(&out, " (ZeRO stage %d, %s optimizer layout)", r.zero_stage(),
                          r.optimizer_layout() == "bf16" ? "BF16_Optimizer" : "DeepSpeedZeroOptimizer");
  } else if (r.kind() == "zero3") {
    absl::StrAppend(&out, " (ZeRO stage 3: every param partitioned over dp, fp32_flat_groups per sub-group)");
  } else if (r.kind() == "moe") {
    absl::StrAppendFormat(&out, " (native mixture of experts, ZeRO stage %d; experts under global ids)", r.zero_stage());
  }
  absl::StrAppendFormat(&out, "\n  tag: %s\n  topology: tp=%d pp=%d dp=%d\n  pipeline: %s\n  lp dtype: %s\n",
                        r.tag(), r.topology().tp(), r.topology().pp(), r.topology().dp(),
                        r.pipeline() ? "PipelineModule (layer files)" : "plain module", r.lp_dtype());
  if (!r.ds_version().empty()) absl::StrAppend(&out, "  ds_version: ", r.ds_version(), "\n");
  for (const auto& g : r.group()) {
    if (r.kind() == "zero3" || r.kind() == "moe") {
      absl::StrAppendFormat(&out, "  group %d: %d params, %d elements\n", g.index(), g.num_params(), g.numel());
      continue;
    }
    absl::StrAppendFormat(&out, "  group %d: %d params, %d elements per tp rank, partitions of %d, padding [%s]\n",
                          g.index(), g.num_params(), g.numel(), g.partition_numel(), absl::StrJoin(g.padding(), ", "));
  }
  absl::StrAppendFormat(&out, "  params: %d\n", r.param_size());
  for (const auto& p : r.param()) {
    absl::StrAppendFormat(&out, "    %s %s[%s]", p.name(), p.dtype(), absl::StrJoin(p.shape(), ", "));
    if (p.group() >= 0) {
      absl::StrAppendFormat(&out, " group %d", p.group());
    } else {
      absl::StrAppend(&out, p.frozen() ? " frozen" : " buffer");
    }
    absl::StrAppend(&out, "\n");
    for (const auto& f : p.fragment()) {
      if ((r.kind() == "zero" || r.kind() == "zero3" || r.kind() == "moe") && p.group() >= 0) {
        absl::StrAppendFormat(&out, "      %s [%d, +%d)\n", f.file(), f.offset(), f.numel());
      } else {
        absl::StrAppendFormat(&out, "      %s\n", f.file());
      }
    }
  }
  return out;
}

}  // namespace ucp::readers
