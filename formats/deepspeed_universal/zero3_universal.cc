#include "formats/deepspeed_universal/zero3_universal.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/fs.h"
#include "base/status_macros.h"
#include "deepspeed/checkpoint_files.h"
#include "format/pickle/accessors.h"
#include "formats/deepspeed_universal/universal_checkpoint.h"
#include "google/protobuf/text_format.h"

namespace ucp::deepspeed_universal {
namespace {

using pickle::Kind;
using pickle::Value;

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string Message(const absl::Status& s) { return std::string(s.message()); }

}  // namespace

bool IsZero3UniversalLayout(const std::vector<std::string>& names) {
  for (const std::string& n : names) {
    auto parsed = deepspeed::ParseCheckpointFileName(n);
    if (parsed && parsed->type == deepspeed::CheckpointFileName::Type::kZero3Model) return true;
  }
  return false;
}

absl::StatusOr<std::unique_ptr<Zero3UniversalFolder>> Zero3UniversalFolder::Open(const std::string& dir,
                                                                                 const deepspeed::ReadOptions& read) {
  std::unique_ptr<Zero3UniversalFolder> f(new Zero3UniversalFolder());
  f->dir_ = dir;
  f->read_ = read;
  UCP_ASSIGN_OR_RETURN(f->names_, ListDirectory(dir));
  const std::string zero = JoinPath(dir, deepspeed::kUniversalZeroDir);
  UCP_ASSIGN_OR_RETURN(std::vector<std::string> entries, ListDirectory(zero));
  for (const std::string& e : entries) {
    if (IsDirectory(JoinPath(zero, e))) f->param_dirs_.push_back(e);
  }
  const std::string first = JoinPath(dir, deepspeed::Zero3ModelFileName(0, 0));
  UCP_ASSIGN_OR_RETURN(f->model0_, torch::TorchFile::Open(first, read.Files()));
  const Value& root = *f->model0_->root();
  if (!root.is(Kind::kDict)) return absl::InvalidArgumentError(absl::StrCat(first, ": expected a dict of model states"));
  if (const Value* v = root.DictGet("ds_version"); v != nullptr && v->is(Kind::kStr)) f->ds_version_ = v->str();
  UCP_ASSIGN_OR_RETURN(const Value* dp, pickle::GetField(root, "dp_world_size", "model states"),
                       _.Prepend(first + ": "));
  UCP_ASSIGN_OR_RETURN(int64_t dp_value, pickle::AsInt(*dp, "dp_world_size"), _.Prepend(first + ": "));
  if (dp_value < 1) return absl::InvalidArgumentError(absl::StrCat(first, ": dp_world_size < 1"));
  f->dp_ = static_cast<int>(dp_value);
  UCP_ASSIGN_OR_RETURN(const Value* shapes, pickle::GetField(root, "param_shapes", "model states"),
                       _.Prepend(first + ": "));
  UCP_ASSIGN_OR_RETURN(const std::vector<pickle::ValuePtr>* groups, pickle::AsSequence(*shapes, "param_shapes"),
                       _.Prepend(first + ": "));
  for (size_t g = 0; g < groups->size(); ++g) {
    const Value& d = *(*groups)[g];
    if (!d.is(Kind::kDict)) {
      return absl::InvalidArgumentError(absl::StrCat(first, ": param_shapes[", g, "] is not a dict"));
    }
    for (const auto& [k, v] : d.dict_items()) {
      if (!k->is(Kind::kStr)) return absl::InvalidArgumentError(absl::StrCat(first, ": a param name is not a string"));
      Param p;
      p.name = k->str();
      p.sub_group = static_cast<int>(g);
      UCP_ASSIGN_OR_RETURN(p.shape, pickle::AsTorchSize(*v, absl::StrCat("param_shapes[", g, "]['", p.name, "']")),
                           _.Prepend(first + ": "));
      f->params_.push_back(std::move(p));
    }
  }
  // The param groups' sub-groups: param_groups[g]['params'] (the universal
  // file's own param_groups, else its optimizer_state_dict's).
  const std::string osd_path = JoinPath(zero, deepspeed::kUniversalOptimizerStateFile);
  UCP_ASSIGN_OR_RETURN(f->optimizer_state_, torch::TorchFile::Open(osd_path, read.Files()));
  const Value& os = *f->optimizer_state_->root();
  const Value* pg = os.is(Kind::kDict) ? os.DictGet("param_groups") : nullptr;
  if (pg == nullptr && os.is(Kind::kDict)) {
    const Value* osd = os.DictGet("optimizer_state_dict");
    if (osd != nullptr && osd->is(Kind::kDict)) pg = osd->DictGet("param_groups");
  }
  if (pg == nullptr || !pg->is(Kind::kList)) {
    return absl::InvalidArgumentError(absl::StrCat(osd_path, ": no param_groups list"));
  }
  std::map<int64_t, int> group_of;
  for (size_t g = 0; g < pg->items().size(); ++g) {
    const Value& group = *pg->items()[g];
    const Value* ids = group.is(Kind::kDict) ? group.DictGet("params") : nullptr;
    if (ids == nullptr || !(ids->is(Kind::kList) || ids->is(Kind::kTuple))) {
      return absl::InvalidArgumentError(absl::StrCat(osd_path, ": param_groups[", g, "] has no 'params' list"));
    }
    for (const auto& id : ids->items()) {
      if (id->is(Kind::kInt)) group_of[id->int_value()] = static_cast<int>(g);
    }
  }
  // A source saved at tp > 1: each param's shape is its merged fp32.pt's.
  if (!f->params_.empty()) {
    auto first_state = torch::TorchFile::Open(
        JoinPath(JoinPath(zero, f->params_[0].name), "fp32.pt"), read.Files());
    f->merged_ = first_state.ok() && (*first_state)->root()->is(Kind::kDict);
  }
  for (Param& p : f->params_) {
    if (!f->merged_) break;
    const std::string path = JoinPath(JoinPath(zero, p.name), "fp32.pt");
    UCP_ASSIGN_OR_RETURN(std::unique_ptr<torch::TorchFile> state, torch::TorchFile::Open(path, read.Files()));
    const Value* t = state->root()->is(Kind::kDict) ? state->root()->DictGet("param") : nullptr;
    if (t == nullptr || !torch::TorchFile::IsTensor(*t)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": expected a dict with a 'param' tensor (param '", p.name,
                                                     "' of a checkpoint saved at tp > 1)"));
    }
    UCP_ASSIGN_OR_RETURN(torch::Tensor full, state->GetTensor(*t));
    p.shape = full.sizes();
  }
  for (Param& p : f->params_) {
    auto it = group_of.find(p.sub_group);
    if (it == group_of.end()) {
      return absl::InvalidArgumentError(absl::StrCat(osd_path, ": no param group lists sub-group ", p.sub_group,
                                                     " (of param '", p.name, "')"));
    }
    p.group = it->second;
  }
  return f;
}

void Zero3UniversalFolder::VerifyParam(const Param& p, const std::vector<std::string>& states,
                                       formats::VerifyResult* result) const {
  const std::string folder = JoinPath(JoinPath(dir_, deepspeed::kUniversalZeroDir), p.name);
  for (const std::string& s : states) {
    const std::string path = JoinPath(folder, s + ".pt");
    ++result->files_checked;
    absl::StatusOr<std::unique_ptr<torch::TorchFile>> f = torch::TorchFile::Open(path, read_.Files());
    if (!f.ok()) {
      result->problems.push_back(Message(f.status()));
      continue;
    }
    const Value& root = *(*f)->root();
    // A ZeRO-3 checkpoint saved at tp > 1 (ds_to_universal.py 0.19.5 on,
    // `ucp convert`): the stage 1/2 dict, 'param' the state merged over tp,
    // so at least the tp slice param_shapes lists in every dim.
    const Value* merged = root.is(Kind::kDict) ? root.DictGet("param") : nullptr;
    if (merged != nullptr && torch::TorchFile::IsTensor(*merged)) {
      absl::StatusOr<torch::Tensor> t = (*f)->GetTensor(*merged);
      if (!t.ok()) {
        result->problems.push_back(Message(t.status()));
        continue;
      }
      bool covers = t->dtype() == torch::DType::kFloat32 && t->dim() == static_cast<int64_t>(p.shape.size());
      for (size_t k = 0; covers && k < p.shape.size(); ++k) covers = t->sizes()[k] >= p.shape[k];
      if (!covers) {
        result->problems.push_back(absl::StrCat(path, ": 'param' is a ", std::string(torch::DTypeName(t->dtype())),
                                                torch::ShapeString(t->sizes()), " tensor, expected float32 of at least ",
                                                torch::ShapeString(p.shape), " (param '", p.name,
                                                "': its tp slice in param_shapes, merged over tp)"));
      }
      continue;
    }
    if (!torch::TorchFile::IsTensor(root)) {
      result->problems.push_back(absl::StrCat(path, ": expected a tensor (the stage-3 universal layout) or a dict "
                                              "with 'param' (a checkpoint saved at tp > 1), found ",
                                              root.DebugString(60)));
      continue;
    }
    absl::StatusOr<torch::Tensor> t = (*f)->GetTensor(root);
    if (!t.ok()) {
      result->problems.push_back(Message(t.status()));
      continue;
    }
    if (t->dtype() != torch::DType::kFloat32 || t->dim() != 1 || t->numel() != Numel(p.shape)) {
      result->problems.push_back(absl::StrCat(path, ": a ", std::string(torch::DTypeName(t->dtype())),
                                              torch::ShapeString(t->sizes()),
                                              " tensor, expected float32[", Numel(p.shape), "] (param '", p.name,
                                              "' of shape ", torch::ShapeString(p.shape), " in param_shapes)"));
    }
  }
}

void Zero3UniversalFolder::Verify(formats::VerifyResult* result) const {
  // The model states of every dp rank: CRCs (model0_ was checked at Open)
  // and the same dp_world_size.
  ++result->files_checked;
  for (int d = 1; d < dp_; ++d) {
    const std::string path = JoinPath(dir_, deepspeed::Zero3ModelFileName(d, 0));
    ++result->files_checked;
    absl::StatusOr<std::unique_ptr<torch::TorchFile>> f = torch::TorchFile::Open(path, read_.Files());
    if (!f.ok()) {
      result->problems.push_back(Message(f.status()));
      continue;
    }
    const Value* dw = (*f)->root()->is(Kind::kDict) ? (*f)->root()->DictGet("dp_world_size") : nullptr;
    if (dw == nullptr || !dw->is(Kind::kInt) || dw->int_value() != dp_) {
      result->problems.push_back(absl::StrCat(path, ": dp_world_size is ", dw ? dw->DebugString() : "missing",
                                              ", expected ", dp_, " as in ", deepspeed::Zero3ModelFileName(0, 0)));
    }
  }
  ++result->files_checked;  // zero/optimizer_state.pt, checked at Open
  // Every param's folder holds the states the first one holds.
  std::vector<std::string> states;
  std::set<std::string> listed;
  for (const Param& p : params_) {
    listed.insert(p.name);
    const std::string folder = JoinPath(JoinPath(dir_, deepspeed::kUniversalZeroDir), p.name);
    absl::StatusOr<std::vector<std::string>> files = ListDirectory(folder);
    if (!files.ok()) {
      result->problems.push_back(absl::StrCat(folder, ": missing (param '", p.name, "' is in the param_shapes of ",
                                              deepspeed::Zero3ModelFileName(0, 0), ")"));
      continue;
    }
    std::vector<std::string> have;
    for (const std::string& n : *files) {
      if (absl::EndsWith(n, ".pt")) have.push_back(n.substr(0, n.size() - 3));
    }
    std::sort(have.begin(), have.end());
    if (states.empty()) states = have;
    if (have != states || std::find(have.begin(), have.end(), "fp32") == have.end()) {
      result->problems.push_back(absl::StrCat(folder, ": holds [", absl::StrJoin(have, ", "), "], expected [",
                                              absl::StrJoin(states, ", "), "] with fp32"));
    }
    VerifyParam(p, have, result);
  }
  for (const std::string& d : param_dirs_) {
    if (!listed.count(d)) {
      result->problems.push_back(absl::StrCat(JoinPath(JoinPath(dir_, deepspeed::kUniversalZeroDir), d),
                                              ": no param '", d, "' in the param_shapes of ",
                                              deepspeed::Zero3ModelFileName(0, 0)));
    }
  }
  // ucp's output: every file against the manifest.
  const std::string manifest_path = JoinPath(dir_, deepspeed::kManifestFile);
  if (PathExists(manifest_path)) {
    absl::StatusOr<std::string> text = ReadFileToString(manifest_path);
    Manifest m;
    if (!text.ok()) {
      result->problems.push_back(Message(text.status()));
    } else if (!google::protobuf::TextFormat::ParseFromString(*text, &m)) {
      result->problems.push_back(absl::StrCat(manifest_path, ": not a valid ucp manifest"));
    } else if (absl::Status s = VerifyManifestDigests(dir_, m); !s.ok()) {
      result->problems.push_back(Message(s));
    }
  }
}

InspectReport Zero3UniversalFolder::Report() const {
  InspectReport report;
  report.set_path(dir_);
  report.set_kind("universal");
  report.set_kind_detail(merged_ ? "DeepSpeed's stage-3 universal layout of a checkpoint saved at tp > 1: each param "
                                   "merged over tp in a dict, rank 0's optimizer state"
                                 : "DeepSpeed's stage-3 universal layout: raw flat tensors per param, rank 0's "
                                   "optimizer state");
  report.set_tag(Basename(dir_));
  *report.mutable_topology() = state::Topology{1, 1, dp_}.ToProto();
  report.set_zero_stage(3);
  report.set_pipeline(false);
  report.set_ds_version(ds_version_);
  for (const std::string& n : names_) {
    if (n != deepspeed::kUniversalZeroDir) report.add_file(n);
  }
  for (const Param& p : params_) {
    InspectReport::Param* ip = report.add_param();
    ip->set_name(p.name);
    for (int64_t d : p.shape) ip->add_shape(d);
    ip->set_dtype("float32");
    ip->set_group(p.group);
    ip->set_layer(-1);
    ip->add_fragment()->set_file(JoinPath(JoinPath(deepspeed::kUniversalZeroDir, p.name), "fp32.pt"));
  }
  return report;
}

}  // namespace ucp::deepspeed_universal
