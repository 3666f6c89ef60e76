#include "conformance/properties.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <tuple>
#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/fs.h"
#include "base/status_macros.h"
#include "conformance/spec_rules.h"
#include "ops/convert.h"
#include "deepspeed/checkpoint_files.h"
#include "ops/training_state.h"
#include "testing/compare.h"
#include "deepspeed/tree_copy.h"
#include "formats/deepspeed_universal/universal_checkpoint.h"
#include "formats/deepspeed_zero/zero_checkpoint.h"
#include "format/pickle/accessors.h"
#include "format/torch/torch_file.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/message_differencer.h"
#include "ops/reshard.h"
#include "rapidcheck.h"
#include "tp/merge.h"

namespace ucp::conformance {
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

constexpr char kTag[] = "global_step";

absl::Status Violation(Property p, const std::string& what) {
  return absl::InternalError(absl::StrCat("property (", PropertyLetter(p), ") ", PropertyName(p), ": ", what));
}

std::string Joined(const std::vector<std::string>& v, size_t max = 12) {
  std::vector<std::string> head(v.begin(), v.begin() + std::min(v.size(), max));
  std::string out = absl::StrJoin(head, "\n  ");
  if (v.size() > max) absl::StrAppend(&out, "\n  ... (", v.size() - max, " more)");
  return out;
}

// A case's scratch folders, removed when done.
class Scratch {
 public:
  explicit Scratch(std::string dir) : dir_(std::move(dir)) {
    (void)RemoveTree(dir_);
    (void)MakeDirs(dir_);
  }
  ~Scratch() { (void)RemoveTree(dir_); }
  std::string Path(const std::string& rel) const { return JoinPath(dir_, rel); }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
};

// The pieces every property needs: the model, and ucp's operations on it
// with the options a user would give for such a model.
class CaseRunner {
 public:
  static absl::StatusOr<std::unique_ptr<CaseRunner>> Make(const GoldenCase& c, const std::string& dir) {
    std::unique_ptr<CaseRunner> r(new CaseRunner());
    r->case_ = c;
    r->dir_ = dir;
    UCP_ASSIGN_OR_RETURN(r->model_, SyntheticModelState::FromCase(c));
    UCP_ASSIGN_OR_RETURN(r->zero_options_, ZeroSourceOptionsFor(c.model(), dir));
    return r;
  }
  const SyntheticModelState& model() const { return *model_; }
  const GoldenCase& c() const { return case_; }
  std::string TagOf(const std::string& root) const { return JoinPath(root, absl::StrCat(kTag, model_->Step(0))); }

  // save(M, T) into <work>/<root>/<tag>; returns the tag folder. Each step
  // is memoized by its output name, so properties checked on the same case
  // share it (names must say what the folder holds).
  // The DeepSpeed version the source is saved as (V1) and the one the
  // target is written for (V2).
  std::string V1() const { return case_.ds_version().empty() ? "0.14.4" : case_.ds_version(); }
  std::string V2() const { return case_.target_ds_version().empty() ? V1() : case_.target_ds_version(); }

  // `target_version`: --target_ds_version ("" = none, the source's).
  absl::StatusOr<std::string> Save(const std::string& root, const Topology& t, const std::string& target_version = "") {
    if (auto it = done_.find(root); it != done_.end()) return it->second;
    const std::string out = TagOf(JoinPath(dir_, root));
    writers::ZeroWriteOptions o;
    o.target = state::Topology::FromProto(t);
    o.num_threads = 1;
    o.layer_type_name = ModelLayerTypeNamer(model_->info());
    o.target_ds_version = target_version;
    UCP_RETURN_IF_ERROR(ops::WriteTrainingState(*model_, out, o).status());
    return done_[root] = out;
  }
  absl::StatusOr<std::string> Convert(const std::string& zero, const std::string& root,
                                      const std::string& target_version = "") {
    if (auto it = done_.find(root); it != done_.end()) return it->second;
    ops::ConvertOptions o;
    o.input_folder = zero;
    o.output_folder = TagOf(JoinPath(dir_, root)) + "_universal";
    o.state = zero_options_;
    o.write.num_threads = 1;
    o.write.target_ds_version = target_version;
    UCP_RETURN_IF_ERROR(ops::Convert(o).status());
    return done_[root] = o.output_folder;
  }
  absl::StatusOr<std::string> Reshard(const std::string& input, const std::string& root, const Topology& t,
                                      const std::string& target_version = "") {
    if (auto it = done_.find(root); it != done_.end()) return it->second;
    ops::ReshardOptions o;
    o.input_folder = input;
    o.output_folder = TagOf(JoinPath(dir_, root));
    o.write.target = state::Topology::FromProto(t);
    o.write.num_threads = 1;
    o.write.target_ds_version = target_version;
    // Half the cases write their optimizer files in pieces of 4-16 KiB
    // (formats/deepspeed_zero/zero_writer.h piece_bytes), which must not change a byte.
    o.write.piece_bytes = case_.seed() % 2 == 0 ? -1 : int64_t{4096} * static_cast<int64_t>(1 + case_.seed() / 2 % 4);
    o.zero_source = zero_options_;
    UCP_RETURN_IF_ERROR(ops::Reshard(o).status());
    return done_[root] = o.output_folder;
  }
  const ops::SourceOptions& zero_options() const { return zero_options_; }
  // save(M, T2) for V2; convert(save(M, T1)) for V2.
  absl::StatusOr<std::string> SaveT2() { return Save("zero_t2", case_.target(), V2()); }
  absl::StatusOr<std::string> ConvertT1() {
    UCP_ASSIGN_OR_RETURN(std::string zero1, Save("zero_t1", case_.source()));
    return Convert(zero1, "universal_t1", V2());
  }

 private:
  CaseRunner() = default;
  GoldenCase case_;
  std::string dir_;
  std::unique_ptr<SyntheticModelState> model_;
  ops::SourceOptions zero_options_;
  std::map<std::string, std::string> done_;
};

// A dict without some keys (same values), for comparisons that skip them.
ValuePtr Without(const Value& dict, const std::vector<std::string>& keys) {
  ValuePtr out = Value::MakeDict(dict.ordered_dict());
  for (const auto& [k, v] : dict.dict_items()) {
    if (k->is(Kind::kStr) && std::find(keys.begin(), keys.end(), k->str()) != keys.end()) continue;
    out->DictSet(k, v);
  }
  return out;
}

// group_paddings and partition_count describe the source's dp layout, and
// ds_version the DeepSpeed that saved the source.
const std::vector<std::string> kSourceLayoutKeys = {"group_paddings", "partition_count", "ds_version"};

bool SameRule(const MergeRule& got, const MergeRule& want) {
  const MergeKind w = want.kind() == AVERAGE ? REPLICATED : want.kind();  // no metadata for either
  if (got.kind() != w) return false;
  if (w != SUB_PARAMS) return true;
  if (want.sub_param_shape().dim_size() > 0) {
    return google::protobuf::util::MessageDifferencer::Equals(got.sub_param_shape(), want.sub_param_shape());
  }
  return got.num_sub_params() == want.num_sub_params() && got.cat_dim() == want.cat_dim();
}

// The universal checkpoint `dir` holds M's tensors, steps and optimizer state.
// `ds_version`: the source's, which the universal optimizer state keeps.
absl::StatusOr<std::vector<std::string>> UniversalVsModel(const std::string& dir, const SyntheticModelState& m,
                                                          const std::string& ds_version) {
  std::vector<std::string> diffs;
  UCP_ASSIGN_OR_RETURN(auto u, deepspeed_universal::UniversalCheckpoint::Open(dir));
  int trainable = 0, module = 0;
  std::map<std::string, const Manifest::Param*> recorded;
  if (u->manifest()) {
    for (const auto& p : u->manifest()->param()) recorded[p.name()] = &p;
  } else {
    diffs.push_back("no ucp manifest");
  }
  for (const state::ParamState& p : m.info().params) {
    auto rec = recorded.find(p.name);
    if (rec == recorded.end()) {
      diffs.push_back(absl::StrCat(p.name, ": not in the manifest"));
    } else if (rec->second->kind() != p.rule.kind() ||
               std::vector<int64_t>(rec->second->shape().begin(), rec->second->shape().end()) != p.full_shape) {
      diffs.push_back(absl::StrCat(p.name, ": manifest says ", tp::MergeKindName(rec->second->kind()), " ",
                                   torch::ShapeString({rec->second->shape().begin(), rec->second->shape().end()}),
                                   ", the model is ", tp::DescribeRule(p.rule), " ", torch::ShapeString(p.full_shape)));
    }
    if (!p.trainable()) {
      ++module;
      auto f = u->ReadModule(p.name);
      if (!f.ok()) {
        diffs.push_back(absl::StrCat(p.name, ": ", f.status().message()));
        continue;
      }
      UCP_ASSIGN_OR_RETURN(torch::Tensor want, m.Tensor(p.name, state::kLpState));
      if (!f->param.BitwiseEqual(want)) {
        diffs.push_back(absl::StrCat("ucp_module/", p.name, ".pt: ", std::string(torch::DTypeName(f->param.dtype())),
                                     torch::ShapeString(f->param.sizes()), " differs from the model's ",
                                     std::string(torch::DTypeName(want.dtype())), torch::ShapeString(want.sizes())));
      }
      continue;
    }
    ++trainable;
    for (const std::string state : {"fp32", "exp_avg", "exp_avg_sq"}) {
      auto f = u->ReadState(p.name, state);
      if (!f.ok()) {
        diffs.push_back(absl::StrCat(p.name, "/", state, ": ", f.status().message()));
        continue;
      }
      UCP_ASSIGN_OR_RETURN(torch::Tensor want, m.Tensor(p.name, state));
      if (!f->param.BitwiseEqual(want)) {
        std::string detail;
        if (f->param.sizes() == want.sizes()) {
          auto d = torch::MaxAbsDiff(f->param, want);
          if (d.ok()) detail = absl::StrCat(", max |diff| ", *d);
        }
        diffs.push_back(absl::StrCat("zero/", p.name, "/", state, ".pt: ", torch::ShapeString(f->param.sizes()),
                                     " differs from the model's ", torch::ShapeString(want.sizes()), detail));
      }
      if (!SameRule(f->rule, p.rule)) {
        diffs.push_back(absl::StrCat("zero/", p.name, "/", state, ".pt: metadata says ", tp::DescribeRule(f->rule),
                                     ", the model is ", tp::DescribeRule(p.rule)));
      }
    }
    UCP_ASSIGN_OR_RETURN(auto step, u->ReadStep(p.name));
    if (!step) {
      diffs.push_back(absl::StrCat(p.name, ": no step.pt"));
    } else {
      auto t = step->GetTensor(*step->root());
      if (!t.ok() || t->dim() != 0 || t->dtype() != torch::DType::kFloat32 ||
          *reinterpret_cast<const float*>(t->data()) != static_cast<float>(m.Step(p.group))) {
        diffs.push_back(absl::StrCat("zero/", p.name, "/step.pt: expected the 0-dim float32 step ", m.Step(p.group),
                                     " of group ", p.group));
      }
    }
  }
  if (static_cast<int>(u->param_names().size()) != trainable || static_cast<int>(u->module_names().size()) != module) {
    diffs.push_back(absl::StrCat("universal has ", u->param_names().size(), " params and ", u->module_names().size(),
                                 " module tensors, the model ", trainable, " and ", module));
  }
  UCP_ASSIGN_OR_RETURN(state::FileValue common, m.OptimizerCommon());
  const torch::TorchFile& os = u->optimizer_state();
  const Value* version = os.root()->DictGet("ds_version");
  if (version == nullptr || !version->is(Kind::kStr) || version->str() != ds_version) {
    diffs.push_back(absl::StrCat("zero/optimizer_state.pt: ds_version is not the source's '", ds_version, "'"));
  }
  for (const auto& d : testing::CompareTrees(os, *Without(*os.root(), kSourceLayoutKeys), *common.file,
                                               *Without(*common.value, kSourceLayoutKeys))) {
    diffs.push_back(absl::StrCat("zero/optimizer_state.pt: ", d));
  }
  return diffs;
}

// Two universal checkpoints of one model converted from different
// topologies: equal but for their source-specific parts.
absl::StatusOr<std::vector<std::string>> UniversalDiffs(const std::string& a, const std::string& b) {
  std::vector<std::string> ignore = {deepspeed::kManifestFile, "zero/optimizer_state.pt"};
  UCP_ASSIGN_OR_RETURN(std::vector<std::string> fa, testing::ListFilesRecursive(a));
  UCP_ASSIGN_OR_RETURN(std::vector<std::string> fb, testing::ListFilesRecursive(b));
  for (const auto* files : {&fa, &fb}) {
    for (const auto& f : *files) {
      if (absl::StartsWith(f, "mp_rank_")) ignore.push_back(f);
    }
  }
  UCP_ASSIGN_OR_RETURN(std::vector<std::string> diffs, FolderByteDiffs(a, b, ignore));
  // The optimizer state, but for the source's dp layout.
  UCP_ASSIGN_OR_RETURN(auto oa, torch::TorchFile::Open(JoinPath(a, "zero/optimizer_state.pt")));
  UCP_ASSIGN_OR_RETURN(auto ob, torch::TorchFile::Open(JoinPath(b, "zero/optimizer_state.pt")));
  for (const auto& d : testing::CompareTrees(*oa, *Without(*oa->root(), kSourceLayoutKeys), *ob,
                                               *Without(*ob->root(), kSourceLayoutKeys))) {
    diffs.push_back(absl::StrCat("zero/optimizer_state.pt: ", d));
  }
  // The manifests, but for the source folder, topology and mp_rank copies.
  Manifest ma, mb;
  for (auto [dir, m] : {std::make_pair(a, &ma), std::make_pair(b, &mb)}) {
    UCP_ASSIGN_OR_RETURN(std::string text, ReadFileToString(JoinPath(dir, deepspeed::kManifestFile)));
    if (!google::protobuf::TextFormat::ParseFromString(text, m)) {
      return absl::DataLossError(absl::StrCat(dir, ": unreadable manifest"));
    }
    m->clear_source_folder();
    m->clear_source_topology();
    Manifest kept = *m;
    kept.clear_file();
    for (const FileDigest& f : m->file()) {
      if (!absl::StartsWith(f.path(), "mp_rank_") && f.path() != "zero/optimizer_state.pt") *kept.add_file() = f;
    }
    *m = kept;
  }
  std::string report;
  google::protobuf::util::MessageDifferencer differ;
  differ.ReportDifferencesToString(&report);
  if (!differ.Compare(ma, mb)) diffs.push_back(absl::StrCat("ucp_manifest.textproto:\n", report));
  return diffs;
}

// --- the properties ---

absl::Status ConvertIsTopologyFree(CaseRunner& r) {
  const Property p = Property::kConvertIsTopologyFree;
  std::string universal[2];
  const Topology topologies[2] = {r.c().source(), r.c().target()};
  // save(M, T1) as V1, converted for V2 (--target_ds_version); save(M, T2)
  // written for V2, converted as it is: the same universal checkpoint.
  for (int i = 0; i < 2; ++i) {
    UCP_ASSIGN_OR_RETURN(std::string zero, i == 0 ? r.Save("zero_t1", topologies[0]) : r.SaveT2(),
                         _.Prepend(absl::StrCat("save at T", i + 1, ": ")));
    UCP_ASSIGN_OR_RETURN(universal[i], i == 0 ? r.ConvertT1() : r.Convert(zero, "universal_t2"),
                         _.Prepend(absl::StrCat("convert from T", i + 1, ": ")));
    // The model-state files are byte-identical copies of the source's; for
    // a plain module (no layer files) at tp > 1, one file: tp rank 0's with
    // no module tensors and mp_world_size 1.
    UCP_ASSIGN_OR_RETURN(std::vector<std::string> files, ListDirectory(zero));
    const bool plain = std::none_of(files.begin(), files.end(),
                                    [](const std::string& f) { return absl::StartsWith(f, "layer_"); });
    const bool single = plain && topologies[i].tp() > 1;
    for (const auto& f : files) {
      if (!absl::StartsWith(f, "mp_rank_")) continue;
      if (single) {
        if (f != deepspeed::MpRankFileName(0)) {
          if (PathExists(JoinPath(universal[i], f))) return Violation(p, absl::StrCat(f, " is in the universal folder"));
          continue;
        }
        UCP_ASSIGN_OR_RETURN(std::vector<std::string> d,
                             testing::CompareSingleMpRankFile(JoinPath(universal[i], f), JoinPath(zero, f)));
        if (!d.empty()) return Violation(p, absl::StrCat(f, " is not the source's rank 0 file for any tp:\n  ", Joined(d)));
        continue;
      }
      UCP_ASSIGN_OR_RETURN(std::string x, ReadFileToString(JoinPath(zero, f)));
      UCP_ASSIGN_OR_RETURN(std::string y, ReadFileToString(JoinPath(universal[i], f)));
      if (x != y) return Violation(p, absl::StrCat(f, " is not a byte-identical copy of the source's"));
    }
  }
  UCP_ASSIGN_OR_RETURN(std::vector<std::string> diffs, UniversalDiffs(universal[0], universal[1]));
  if (!diffs.empty()) {
    return Violation(p, absl::StrCat("convert(save(M, T1)) and convert(save(M, T2)) differ:\n  ", Joined(diffs)));
  }
  UCP_ASSIGN_OR_RETURN(diffs, UniversalVsModel(universal[0], r.model(), r.V1()));
  if (!diffs.empty()) return Violation(p, absl::StrCat("convert(save(M, T1)) is not M:\n  ", Joined(diffs)));
  return absl::OkStatus();
}

absl::Status ReshardMatchesSave(CaseRunner& r) {
  const Property p = Property::kReshardMatchesSave;
  UCP_ASSIGN_OR_RETURN(std::string universal, r.ConvertT1(), _.Prepend("convert from T1: "));
  UCP_ASSIGN_OR_RETURN(std::string resharded, r.Reshard(universal, "universal_t1_to_t2", r.c().target(), r.V2()),
                       _.Prepend("reshard to T2: "));
  UCP_ASSIGN_OR_RETURN(std::string zero2, r.SaveT2(), _.Prepend("save at T2: "));
  UCP_ASSIGN_OR_RETURN(std::vector<std::string> diffs, FolderByteDiffs(resharded, zero2));
  if (!diffs.empty()) {
    return Violation(p, absl::StrCat("reshard(convert(save(M, T1)), T2) differs from save(M, T2):\n  ", Joined(diffs)));
  }
  UCP_ASSIGN_OR_RETURN(std::string l1, ReadFileToString(JoinPath(Dirname(resharded), deepspeed::kLatestFile)));
  UCP_ASSIGN_OR_RETURN(std::string l2, ReadFileToString(JoinPath(Dirname(zero2), deepspeed::kLatestFile)));
  if (l1 != l2) return Violation(p, absl::StrCat("latest is '", l1, "', save wrote '", l2, "'"));
  return absl::OkStatus();
}

absl::Status DirectReshardMatchesTwoStep(CaseRunner& r) {
  const Property p = Property::kDirectReshardMatchesTwoStep;
  UCP_ASSIGN_OR_RETURN(std::string zero1, r.Save("zero_t1", r.c().source()), _.Prepend("save at T1: "));
  UCP_ASSIGN_OR_RETURN(std::string direct, r.Reshard(zero1, "zero_t1_to_t2", r.c().target(), r.V2()),
                       _.Prepend("reshard the ZeRO folder to T2: "));
  UCP_ASSIGN_OR_RETURN(std::string universal, r.ConvertT1(), _.Prepend("convert from T1: "));
  UCP_ASSIGN_OR_RETURN(std::string two_step, r.Reshard(universal, "universal_t1_to_t2", r.c().target(), r.V2()),
                       _.Prepend("reshard the universal folder to T2: "));
  UCP_ASSIGN_OR_RETURN(std::vector<std::string> diffs, FolderByteDiffs(direct, two_step));
  if (!diffs.empty()) {
    return Violation(p, absl::StrCat("ZeRO -> ZeRO reshard differs from ZeRO -> universal -> ZeRO:\n  ", Joined(diffs)));
  }
  return absl::OkStatus();
}

// Expects `s` to be an error with `code` whose message contains every one of `parts`.
absl::Status ExpectError(Property p, const std::string& what, const absl::Status& s, absl::StatusCode code,
                         const std::vector<std::string>& parts) {
  if (s.ok()) return Violation(p, absl::StrCat(what, ": ucp succeeded"));
  bool all = s.code() == code;
  for (const auto& part : parts) all &= absl::StrContains(s.message(), part);
  if (!all) {
    return Violation(p, absl::StrCat(what, ": expected ", absl::StatusCodeToString(code), " mentioning '",
                                     absl::StrJoin(parts, "', '"), "', got ", s.ToString()));
  }
  return absl::OkStatus();
}

absl::Status ExpectNoOutput(Property p, const std::string& what, const std::string& output) {
  if (PathExists(output)) return Violation(p, absl::StrCat(what, ": a failed run left ", output, " behind"));
  const std::string root = Dirname(output);
  if (IsDirectory(root)) {
    UCP_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(root));
    if (!names.empty()) return Violation(p, absl::StrCat(what, ": a failed run left ", JoinPath(root, names[0])));
  }
  return absl::OkStatus();
}

// Rewrites one optimizer file with element `offset` of a state of group
// `group` (fp32 partition or a base optimizer state) changed by `delta`.
absl::Status NudgeOptimizerElement(const std::string& path, int group, const std::string& state, int64_t offset,
                                   float delta) {
  const std::string tmp = path + ".nudged";
  {
    UCP_ASSIGN_OR_RETURN(auto f, torch::TorchFile::Open(path));
    torch::TorchWriter w;
    UCP_ASSIGN_OR_RETURN(ValuePtr root, deepspeed::CopyTreeForWrite(state::FileValue{f->root(), state::Unowned(f.get())}, w));
    const Value* osd_in = f->root()->DictGet("optimizer_state_dict");
    if (osd_in == nullptr) return absl::InvalidArgumentError(absl::StrCat(path, ": no optimizer_state_dict"));
    const Value* tensor_in = nullptr;
    if (state == "fp32") {
      tensor_in = osd_in->DictGet("single_partition_of_fp32_groups")->items()[group].get();
    } else {
      tensor_in = osd_in->DictGet("base_optimizer_state")->DictGet("state")->DictGet(Value::Int(group))->DictGet(state);
    }
    UCP_ASSIGN_OR_RETURN(torch::Tensor t, f->GetTensor(*tensor_in));
    std::string bytes = t.ContiguousBytes();
    if (t.dtype() != torch::DType::kFloat32 || offset < 0 || (offset + 1) * 4 > static_cast<int64_t>(bytes.size())) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": cannot nudge element ", offset, " of ", state));
    }
    float x;
    std::memcpy(&x, &bytes[offset * 4], 4);
    x += delta;
    std::memcpy(&bytes[offset * 4], &x, 4);
    UCP_ASSIGN_OR_RETURN(torch::Tensor nudged, torch::Tensor::FromBytes(t.dtype(), t.sizes(), std::move(bytes)));
    ValuePtr value = w.AddTensor(nudged);
    ValuePtr osd = root->DictGetPtr("optimizer_state_dict");
    if (state == "fp32") {
      osd->DictGetPtr("single_partition_of_fp32_groups")->mutable_items()[group] = value;
    } else {
      osd->DictGetPtr("base_optimizer_state")->DictGetPtr("state")->DictGetPtr(Value::Int(group))->DictSet(
          Value::Str(state), value);
    }
    UCP_RETURN_IF_ERROR(w.WriteFile(tmp, *root));
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) return absl::InternalError(absl::StrCat("rename ", tmp));
  return absl::OkStatus();
}

absl::Status CorruptionsAreCaught(CaseRunner& r, const std::string& scratch) {
  const Property p = Property::kCorruptionsAreCaught;
  const uint64_t seed = r.c().seed();
  UCP_ASSIGN_OR_RETURN(std::string zero, r.Save("zero_t1", r.c().source()), _.Prepend("save at T1: "));
  UCP_ASSIGN_OR_RETURN(std::vector<std::string> files, ListDirectory(zero));
  // The checkpoint's files (not ucp's output marker, which no reader needs).
  files.erase(std::remove(files.begin(), files.end(), std::string(kUcpOutputMarker)), files.end());
  std::vector<std::string> optim;
  for (const auto& f : files) {
    auto parsed = deepspeed::ParseCheckpointFileName(f);
    if (parsed && parsed->type == deepspeed::CheckpointFileName::Type::kOptim) optim.push_back(f);
  }
  auto damaged_copy = [&](const std::string& name) -> absl::StatusOr<std::string> {
    const std::string dir = JoinPath(JoinPath(scratch, name), Basename(zero));
    UCP_RETURN_IF_ERROR(CopyTree(zero, dir));
    return dir;
  };
  const ops::SourceOptions zero_options = r.zero_options();
  auto convert_to = [&](const std::string& src, const std::string& name) {
    ops::ConvertOptions o;
    o.input_folder = src;
    o.output_folder = JoinPath(JoinPath(scratch, name + "_out"), "universal");
    o.state = zero_options;
    o.write.num_threads = 1;
    return std::make_pair(ops::Convert(o).status(), o.output_folder);
  };

  // A missing optimizer shard.
  {
    UCP_ASSIGN_OR_RETURN(std::string dir, damaged_copy("missing"));
    const std::string victim = JoinPath(dir, optim[seed % optim.size()]);
    if (unlink(victim.c_str()) != 0) return absl::InternalError(absl::StrCat("unlink ", victim));
    auto [s, out] = convert_to(dir, "missing");
    // The only optimizer file gone: nothing says which layout it had.
    const std::vector<std::string> parts =
        optim.size() == 1 ? std::vector<std::string>{dir, "no *zero_pp_rank_*_optim_states.pt files"}
                          : std::vector<std::string>{victim, "missing"};
    UCP_RETURN_IF_ERROR(ExpectError(p, "missing shard", s, absl::StatusCode::kNotFound, parts));
    UCP_RETURN_IF_ERROR(ExpectNoOutput(p, "missing shard", out));
  }
  // A truncated file (any file of the checkpoint).
  {
    UCP_ASSIGN_OR_RETURN(std::string dir, damaged_copy("truncated"));
    const std::string victim = JoinPath(dir, files[(seed / 7) % files.size()]);
    UCP_ASSIGN_OR_RETURN(int64_t size, FileSize(victim));
    const int64_t keep = static_cast<int64_t>((seed / 13) % static_cast<uint64_t>(size));
    if (truncate(victim.c_str(), keep) != 0) return absl::InternalError(absl::StrCat("truncate ", victim));
    auto [s, out] = convert_to(dir, "truncated");
    UCP_RETURN_IF_ERROR(ExpectError(p, absl::StrCat("file truncated to ", keep, " of ", size, " bytes"), s,
                                    absl::StatusCode::kDataLoss, {victim}));
    UCP_RETURN_IF_ERROR(ExpectNoOutput(p, "truncated file", out));
  }
  // A flipped byte in a universal file, caught by the manifest's checksums.
  {
    // Its own conversion: the bytes it flips must not reach the other properties.
    UCP_ASSIGN_OR_RETURN(std::string universal, r.Convert(zero, "universal_t1_to_damage"),
                         _.Prepend("convert from T1: "));
    UCP_ASSIGN_OR_RETURN(std::string text, ReadFileToString(JoinPath(universal, deepspeed::kManifestFile)));
    Manifest m;
    if (!google::protobuf::TextFormat::ParseFromString(text, &m) || m.file_size() == 0) {
      return Violation(p, "the universal checkpoint has no manifest listing its files");
    }
    const FileDigest& d = m.file(static_cast<int>((seed / 3) % m.file_size()));
    const std::string victim = JoinPath(universal, d.path());
    UCP_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(victim));
    const size_t at = static_cast<size_t>((seed / 5) % bytes.size());
    bytes[at] = static_cast<char>(bytes[at] ^ (1 << (seed % 8)));
    UCP_RETURN_IF_ERROR(WriteFileAtomic(victim, bytes));
    const std::string out = JoinPath(JoinPath(scratch, "flipped_out"), "global_step1");
    ops::ReshardOptions o;
    o.input_folder = universal;
    o.output_folder = out;
    o.write.target = state::Topology::FromProto(r.c().target());
    o.write.num_threads = 1;
    o.verify_checksums = true;
    absl::Status s = ops::Reshard(o).status();
    UCP_RETURN_IF_ERROR(ExpectError(p, absl::StrCat("byte ", at, " of ", d.path(), " flipped"), s,
                                    absl::StatusCode::kDataLoss, {victim, "differs from the manifest's"}));
    UCP_RETURN_IF_ERROR(ExpectNoOutput(p, "flipped byte", out));
  }
  // tp copies of a replicated param that disagree.
  if (r.c().source().tp() >= 2) {
    const state::ParamState* victim = nullptr;
    for (const auto& ps : r.model().info().params) {
      if (ps.trainable() && ps.rule.kind() == REPLICATED && ps.tied_layers.empty()) {
        victim = &ps;
        if ((seed / 11) % 2 == 0) break;
      }
    }
    if (victim != nullptr) {
      UCP_ASSIGN_OR_RETURN(std::string dir, damaged_copy("replicated"));
      UCP_ASSIGN_OR_RETURN(auto ckpt, deepspeed_zero::ZeroCheckpoint::Open(dir));
      const deepspeed::ZeroParam* zp = ckpt->FindParam(victim->name);
      if (zp == nullptr) return Violation(p, absl::StrCat(victim->name, " is not in the saved checkpoint"));
      const int stage = zp->stages[0];
      const auto frags = ckpt->Layout(stage, 1, zp->group).FragmentsOfParam(zp->index_in_group[0]);
      if (frags.empty()) return Violation(p, absl::StrCat(victim->name, " has no fragments"));
      const std::string state = std::vector<std::string>{"fp32", "exp_avg", "exp_avg_sq"}[seed % 3];
      const std::string path = ckpt->OptimPath(stage, 1, frags[0].first);
      ckpt.reset();
      UCP_RETURN_IF_ERROR(NudgeOptimizerElement(path, zp->group, state, frags[0].second.partition_offset, 0.5f));
      auto [s, out] = convert_to(dir, "replicated");
      if (state == "fp32") {
        // The nudged element is the first of its fragment, which the check of
        // every optimizer file against its own rank's lp weights samples
        // (formats/deepspeed_zero/zero_checkpoint.h): the file disagrees with itself first.
        UCP_RETURN_IF_ERROR(ExpectError(p, absl::StrCat("tp rank 1's fp32 of ", victim->name, " changed"), s,
                                        absl::StatusCode::kInvalidArgument,
                                        {path, "do not match the lp weights", absl::StrCat("'", victim->name, "'")}));
      } else {
        UCP_RETURN_IF_ERROR(ExpectError(p, absl::StrCat("tp rank 1's ", state, " of ", victim->name, " changed"), s,
                                        absl::StatusCode::kFailedPrecondition,
                                        {"replicated param(s) differ between tp ranks",
                                         absl::StrCat(victim->name, " ("), absl::StrCat("tp copies differ in ", state)}));
      }
      UCP_RETURN_IF_ERROR(ExpectNoOutput(p, "replicated copies", out));
    }
  }
  return absl::OkStatus();
}

// --- (e): save(M, T) against DeepSpeed's formulas (0.12 to 0.19.5), computed here
// independently of layout_math.cc, tp/merge.cc and the writer ---

// Megatron's padded vocabulary (mpu.vocab_size_with_padding).
int64_t OraclePaddedVocab(int64_t vocab, int64_t divisible_by, int tp) {
  const int64_t multiple = std::max<int64_t>(divisible_by, 1) * tp;
  return (vocab + multiple - 1) / multiple * multiple;
}

// The tp slice `rank` of a full tensor as Megatron lays it out and
// universal_checkpoint.py:load_hp_checkpoint_state cuts it.
absl::StatusOr<torch::Tensor> OracleSlice(const ModelParam& p, const torch::Tensor& full, int tp, int rank,
                                          int64_t divisible_by) {
  const MergeRule& r = p.rule();
  auto narrow_even = [&](const torch::Tensor& t, int64_t dim) -> absl::StatusOr<torch::Tensor> {
    const int64_t n = t.sizes()[dim] / tp;
    return t.Narrow(dim, rank * n, n);
  };
  switch (r.kind()) {
    case REPLICATED:
    case AVERAGE:
      return full;
    case COLUMN:
      return narrow_even(full, 0);
    case ROW:
      return narrow_even(full, 1);
    case VOCAB: {
      const int64_t rows = OraclePaddedVocab(full.sizes()[0], divisible_by, tp);
      torch::Tensor padded = full;
      if (rows > full.sizes()[0]) {
        std::vector<int64_t> pad_shape = full.sizes();
        pad_shape[0] = rows - full.sizes()[0];
        UCP_ASSIGN_OR_RETURN(padded, torch::Cat({full, torch::Tensor::Zeros(full.dtype(), pad_shape)}, 0));
      }
      return narrow_even(padded, 0);
    }
    case SUB_PARAMS: {
      std::vector<torch::Tensor> pieces;
      if (r.sub_param_shape().dim_size() > 0) {
        const int64_t dim = r.sub_param_shape().partition_dim();
        int64_t offset = 0;
        for (int64_t sub : r.sub_param_shape().dim(static_cast<int>(dim)).size()) {
          const int64_t part = sub / tp;
          UCP_ASSIGN_OR_RETURN(torch::Tensor piece, full.Narrow(dim, offset + rank * part, part));
          pieces.push_back(piece);
          offset += sub;
        }
        return torch::Cat(pieces, dim);
      }
      const int64_t dim = r.cat_dim();
      const int64_t sub = full.sizes()[dim] / r.num_sub_params();
      for (int c = 0; c < r.num_sub_params(); ++c) {
        UCP_ASSIGN_OR_RETURN(torch::Tensor piece, full.Narrow(dim, c * sub + rank * (sub / tp), sub / tp));
        pieces.push_back(piece);
      }
      return torch::Cat(pieces, dim);
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat(p.name(), ": no merge kind"));
  }
}

absl::StatusOr<torch::Tensor> TensorAt(const torch::TorchFile& f, const Value* v, const std::string& what) {
  if (v == nullptr || !torch::TorchFile::IsTensor(*v)) {
    return absl::InvalidArgumentError(absl::StrCat(f.path(), ": ", what, " is not a tensor"));
  }
  return f.GetTensor(*v);
}

std::vector<std::string> DictKeys(const Value& d) {
  std::vector<std::string> keys;
  for (const auto& [k, v] : d.dict_items()) keys.push_back(k->is(Kind::kStr) ? k->str() : k->DebugString());
  return keys;
}

// Checks one saved checkpoint; appends what differs from DeepSpeed's layout.
// The (major, minor, patch) of a version string, compared here without
// layout_math's DsVersion.
std::tuple<int, int, int> OracleVersion(const std::string& v) {
  int a = 0, b = 0, c = 0;
  (void)sscanf(v.c_str(), "%d.%d.%d", &a, &b, &c);
  return {a, b, c};
}

absl::Status CheckLayout(const CaseRunner& r, const std::string& dir, const Topology& t, const std::string& version,
                         std::vector<std::string>& diffs) {
  const SyntheticModelState& m = r.model();
  const ModelSpec& spec = r.c().model();
  const state::ModelInfo& info = m.info();
  const bool bf16 = info.optimizer_kind == state::OptimizerKind::kBf16;
  // stage_1_and_2.py records every rank's own padding from 0.16.4 on
  // (bf16_optimizer.py: the last rank's in every version); engine.py writes
  // checkpoint_parallel_dimensions from 0.19.5 on.
  const bool per_rank = !bf16 && OracleVersion(version) >= std::make_tuple(0, 16, 4);
  const bool parallel_dims = OracleVersion(version) >= std::make_tuple(0, 19, 5);
  const int64_t divisible_by = spec.make_vocab_size_divisible_by();
  std::map<std::string, const ModelParam*> by_name;
  for (const ModelParam& p : spec.param()) by_name[p.name()] = &p;
  std::map<std::string, int> flatten_index;
  for (size_t i = 0; i < info.params.size(); ++i) flatten_index[info.params[i].name] = static_cast<int>(i);
  auto slice_of = [&](const ModelParam& p, const std::string& state, int rank) -> absl::StatusOr<torch::Tensor> {
    UCP_ASSIGN_OR_RETURN(torch::Tensor full, m.Tensor(p.name(), state));
    return OracleSlice(p, full, t.tp(), rank, divisible_by);
  };
  auto diff = [&](const std::string& file, const std::string& what) {
    if (diffs.size() < 20) diffs.push_back(absl::StrCat(file, ": ", what));
  };
  std::set<std::string> trainable_seen;
  for (int s = 0; s < t.pp(); ++s) {
    std::vector<std::vector<std::string>> group_names(info.num_groups);
    for (int rank = 0; rank < t.tp(); ++rank) {
      const std::string mp_name = deepspeed::MpRankFileName(s * t.tp() + rank);
      UCP_ASSIGN_OR_RETURN(auto mp, torch::TorchFile::Open(JoinPath(dir, mp_name)));
      const Value& root = *mp->root();
      const Value* dp_world = root.DictGet("dp_world_size");
      const Value* mp_world = root.DictGet("mp_world_size");
      if (dp_world == nullptr || dp_world->int_value() != t.dp() || mp_world == nullptr ||
          mp_world->int_value() != t.tp() * t.pp()) {
        diff(mp_name, "dp_world_size / mp_world_size are not dp / tp * pp");
      }
      const Value* ds_version = root.DictGet("ds_version");
      if (ds_version == nullptr || !ds_version->is(Kind::kStr) || ds_version->str() != version) {
        diff(mp_name, absl::StrCat("ds_version is not '", version, "'"));
      }
      {
        const std::vector<std::string> keys = DictKeys(root);
        auto at = std::find(keys.begin(), keys.end(), "checkpoint_parallel_dimensions");
        const Value* dims = root.DictGet("checkpoint_parallel_dimensions");
        if (!parallel_dims && dims != nullptr) diff(mp_name, "has checkpoint_parallel_dimensions (0.19.5 and later only)");
        if (parallel_dims) {
          if (dims == nullptr || at == keys.begin() || *(at - 1) != "mp_world_size" ||
              DictKeys(*dims) != std::vector<std::string>{"pp_degree", "tp_degree"} ||
              dims->DictGet("pp_degree")->int_value() != t.pp() || dims->DictGet("tp_degree")->int_value() != t.tp()) {
            diff(mp_name, absl::StrCat("checkpoint_parallel_dimensions is not {'pp_degree': ", t.pp(),
                                       ", 'tp_degree': ", t.tp(), "} after mp_world_size"));
          }
        }
      }
      // The RNG state's ndarray as the source's numpy pickled it.
      if (const Value* np = root.DictGet("np_rng_state"); np != nullptr && np->is(Kind::kTuple) && np->items().size() > 1) {
        const Value& arr = *np->items()[1];
        const std::string want = r.c().numpy2() ? "numpy._core.multiarray" : "numpy.core.multiarray";
        if (!arr.is(Kind::kObject) || arr.object_module() != want) {
          diff(mp_name, absl::StrCat("np_rng_state's ndarray is not pickled from ", want));
        }
      } else {
        diff(mp_name, "no np_rng_state tuple");
      }
      const Value* shapes = root.DictGet("param_shapes");
      if (shapes == nullptr || !shapes->is(Kind::kList) || static_cast<int>(shapes->items().size()) != info.num_groups) {
        diff(mp_name, absl::StrCat("param_shapes is not a list of ", info.num_groups, " groups"));
        continue;
      }
      for (int g = 0; g < info.num_groups; ++g) {
        const Value& d = *shapes->items()[g];
        std::vector<std::string> names;
        int last = -1;
        for (const auto& [k, v] : d.dict_items()) {
          const std::string name = k->str();
          names.push_back(name);
          auto it = by_name.find(name);
          if (it == by_name.end() || it->second->group() != g) {
            diff(mp_name, absl::StrCat("param_shapes[", g, "] lists '", name, "', not a param of group ", g));
            continue;
          }
          if (flatten_index[name] <= last) diff(mp_name, absl::StrCat("param_shapes[", g, "]: '", name, "' out of order"));
          last = flatten_index[name];
          auto got = pickle::AsTorchSize(*v);
          UCP_ASSIGN_OR_RETURN(torch::Tensor slice, slice_of(*it->second, "fp32", rank));
          if (!got.ok() || *got != slice.sizes()) {
            diff(mp_name, absl::StrCat("param_shapes[", g, "]['", name, "'] is ", v->DebugString(60), ", expected ",
                                       torch::ShapeString(slice.sizes())));
          }
          trainable_seen.insert(name);
        }
        if (rank == 0) {
          group_names[g] = names;
        } else if (names != group_names[g]) {
          diff(mp_name, absl::StrCat("param_shapes[", g, "] names differ from tp rank 0's"));
        }
      }
      // A plain module's state dict: every tensor, module order, tp slices.
      if (!spec.pipeline()) {
        const Value* module = root.DictGet("module");
        if (module == nullptr || !module->is(Kind::kDict)) {
          diff(mp_name, "no module state dict");
        } else {
          std::vector<std::string> want;
          for (const ModelParam& p : spec.param()) want.push_back(p.name());
          if (DictKeys(*module) != want) diff(mp_name, "module keys are not the model's, in module order");
          for (const ModelParam& p : spec.param()) {
            UCP_ASSIGN_OR_RETURN(torch::Tensor got, TensorAt(*mp, module->DictGet(p.name()), p.name()));
            const bool trainable = p.role().empty() || p.role() == "trainable";
            UCP_ASSIGN_OR_RETURN(torch::Tensor slice, slice_of(p, trainable ? "fp32" : "lp", rank));
            UCP_ASSIGN_OR_RETURN(torch::Tensor want_t, trainable ? torch::Cast(slice, info.lp_dtype) : slice);
            if (!got.BitwiseEqual(want_t)) diff(mp_name, absl::StrCat("module['", p.name(), "'] is not its tp slice"));
          }
        }
      }
    }
    // The optimizer files: stage_1_and_2.py / bf16_optimizer.py partitioning.
    for (int rank = 0; rank < t.tp(); ++rank) {
      for (int d = 0; d < t.dp(); ++d) {
        const std::string name = deepspeed::OptimFileName(d, s * t.tp() + rank, info.bf16_file_prefix);
        UCP_ASSIGN_OR_RETURN(auto f, torch::TorchFile::Open(JoinPath(dir, name)));
        const Value& root = *f->root();
        if (DictKeys(root) != std::vector<std::string>{"optimizer_state_dict", "ds_config", "ds_version"}) {
          diff(name, "top-level keys are not optimizer_state_dict, ds_config, ds_version");
        }
        for (const Value* holder : {&root, root.DictGet("optimizer_state_dict")}) {
          const Value* v = holder != nullptr ? holder->DictGet("ds_version") : nullptr;
          if (v == nullptr || !v->is(Kind::kStr) || v->str() != version) {
            diff(name, absl::StrCat("ds_version is not '", version, "'"));
          }
        }
        const Value* osd = root.DictGet("optimizer_state_dict");
        if (osd == nullptr) continue;
        const std::vector<std::string> keys =
            bf16 ? std::vector<std::string>{"clip_grad", "base_optimizer_state", "single_partition_of_fp32_groups",
                                            "group_paddings", "partition_count", "ds_version", "param_slice_mappings"}
                 : std::vector<std::string>{"loss_scaler", "dynamic_loss_scale", "overflow", "clip_grad",
                                            "base_optimizer_state", "single_partition_of_fp32_groups", "zero_stage",
                                            "group_paddings", "partition_count", "ds_version",
                                            "param_slice_mappings"};
        if (DictKeys(*osd) != keys) diff(name, "optimizer_state_dict keys are not DeepSpeed's");
        const Value* paddings = osd->DictGet("group_paddings");
        const Value* counts = osd->DictGet("partition_count");
        const Value* fp32s = osd->DictGet("single_partition_of_fp32_groups");
        const Value* mappings = osd->DictGet("param_slice_mappings");
        const Value* state = osd->DictGet("base_optimizer_state");
        state = state != nullptr ? state->DictGet("state") : nullptr;
        if (paddings == nullptr || counts == nullptr || fp32s == nullptr || mappings == nullptr || state == nullptr) {
          diff(name, "missing partition fields");
          continue;
        }
        for (int g = 0; g < info.num_groups; ++g) {
          // Flatten the group, align to 2 * dp (nccl_start_alignment_factor), cut
          // dp equal partitions; the padding is the last rank's, or (0.16.4+)
          // each rank's own: what of [d * part, (d + 1) * part) lies past numel.
          int64_t numel = 0;
          std::vector<std::pair<const ModelParam*, int64_t>> offsets;
          for (const std::string& pn : group_names[g]) {
            const ModelParam& p = *by_name[pn];
            UCP_ASSIGN_OR_RETURN(torch::Tensor slice, slice_of(p, "fp32", rank));
            offsets.emplace_back(&p, numel);
            numel += slice.numel();
          }
          const int64_t align = 2 * static_cast<int64_t>(t.dp());
          const int64_t padded = (numel + align - 1) / align * align;
          const int64_t part = padded / t.dp();
          const int64_t padding = !per_rank   ? (d == t.dp() - 1 ? padded - numel : 0)
                                  : numel <= d * part ? part
                                  : std::max<int64_t>(0, (d + 1) * part - numel);
          if (paddings->items()[g]->int_value() != padding) {
            diff(name, absl::StrCat("group_paddings[", g, "] is ", paddings->items()[g]->int_value(), ", DeepSpeed's is ",
                                    padding, " (", numel, " elements aligned to ", align, ")"));
          }
          if (counts->items()[g]->int_value() != t.dp()) diff(name, absl::StrCat("partition_count[", g, "] != dp"));
          // ZeRO saves group[:part - padding] (Python slicing), bf16 the whole partition.
          int64_t lean = part - padding;
          if (lean < 0) lean = std::max<int64_t>(0, part + lean);
          UCP_ASSIGN_OR_RETURN(torch::Tensor fp32, TensorAt(*f, fp32s->items()[g].get(), "fp32 partition"));
          if (fp32.numel() != (bf16 ? part : lean)) {
            diff(name, absl::StrCat("fp32 partition of group ", g, " has ", fp32.numel(), " elements, expected ",
                                    bf16 ? part : lean));
          }
          const Value* gs = state->DictGet(Value::Int(g));
          if (gs == nullptr || DictKeys(*gs) != std::vector<std::string>{"step", "exp_avg", "exp_avg_sq"}) {
            diff(name, absl::StrCat("base_optimizer_state.state[", g, "] keys are not step, exp_avg, exp_avg_sq"));
            continue;
          }
          UCP_ASSIGN_OR_RETURN(torch::Tensor step, TensorAt(*f, gs->DictGet("step"), "step"));
          if (step.dim() != 0 || *reinterpret_cast<const float*>(step.data()) != static_cast<float>(m.Step(g))) {
            diff(name, absl::StrCat("step of group ", g, " is not the model's"));
          }
          std::map<std::string, torch::Tensor> flats = {{"fp32", fp32}};
          for (const std::string key : {"exp_avg", "exp_avg_sq"}) {
            UCP_ASSIGN_OR_RETURN(flats[key], TensorAt(*f, gs->DictGet(key), key));
            if (flats[key].numel() != part) {
              diff(name, absl::StrCat(key, " of group ", g, " has ", flats[key].numel(), " elements, expected ", part));
            }
          }
          // deepspeed/utils/mixed_precision_linkage.py:_init_lp_to_hp_mapping.
          const int64_t lo = d * part, hi = lo + part;
          std::vector<std::string> want_names, got_names = DictKeys(*mappings->items()[g]);
          for (const auto& [p, offset] : offsets) {
            UCP_ASSIGN_OR_RETURN(torch::Tensor slice, slice_of(*p, "fp32", rank));
            const int64_t start = std::max(offset, lo), end = std::min(offset + slice.numel(), hi);
            if (!(offset < hi && offset + slice.numel() > lo) || start >= end) continue;
            want_names.push_back(p->name());
            const Value* a = mappings->items()[g]->DictGet(p->name());
            auto addr = a != nullptr ? pickle::AsFragmentAddress(*a) : absl::StatusOr<pickle::FragmentAddress>(
                                                                           absl::NotFoundError("none"));
            if (!addr.ok() || addr->numel != end - start || addr->start != start - lo) {
              diff(name, absl::StrCat("param_slice_mappings[", g, "]['", p->name(), "'] is ",
                                      addr.ok() ? absl::StrCat("fragment_address(numel=", addr->numel, ", start=",
                                                               addr->start, ")")
                                                : "missing",
                                      ", DeepSpeed's is fragment_address(numel=", end - start, ", start=", start - lo,
                                      ")"));
              continue;
            }
            // The fragment's values are the param's tp slice's.
            for (const std::string state_name : {"fp32", "exp_avg", "exp_avg_sq"}) {
              UCP_ASSIGN_OR_RETURN(torch::Tensor sl, slice_of(*p, state_name, rank));
              const std::string want = sl.ContiguousBytes().substr((start - offset) * 4, (end - start) * 4);
              const torch::Tensor& flat = flats[state_name];
              if (flat.numel() < start - lo + (end - start)) continue;  // reported above
              std::string got((end - start) * 4, '\0');
              UCP_RETURN_IF_ERROR(
                  flat.CopyFlatRange(start - lo, end - start, reinterpret_cast<uint8_t*>(&got[0])));
              if (got != want) {
                diff(name, absl::StrCat(state_name, " partition of group ", g, " does not hold '", p->name(),
                                        "' tp slice ", rank, " at [", start - lo, ", ", end - lo, ")"));
              }
            }
          }
          if (got_names != want_names) {
            diff(name, absl::StrCat("param_slice_mappings[", g, "] lists [", absl::StrJoin(got_names, ", "),
                                    "], DeepSpeed's [", absl::StrJoin(want_names, ", "), "]"));
          }
        }
      }
    }
  }
  for (const auto& p : info.params) {
    if (p.trainable() && !trainable_seen.count(p.name)) diff("param_shapes", absl::StrCat("'", p.name, "' is in no stage"));
  }
  // PipelineModule layer files: every module layer, every tp rank, each
  // holding its params' tp slices (lp weights are the fp32 masters cast).
  if (spec.pipeline()) {
    for (int l : spec.module_layers()) {
      std::vector<const ModelParam*> here;
      for (const ModelParam& p : spec.param()) {
        const bool in = p.tied_layer().empty()
                            ? p.layer() == l
                            : std::find(p.tied_layer().begin(), p.tied_layer().end(), l) != p.tied_layer().end();
        if (in) here.push_back(&p);
      }
      for (int rank = 0; rank < t.tp(); ++rank) {
        const std::string name = deepspeed::LayerFileName(l, rank);
        UCP_ASSIGN_OR_RETURN(auto f, torch::TorchFile::Open(JoinPath(dir, name)));
        std::vector<std::string> want;
        for (const ModelParam* p : here) want.push_back(p->local_name());
        if (DictKeys(*f->root()) != want) diff(name, absl::StrCat("keys are not [", absl::StrJoin(want, ", "), "]"));
        for (const ModelParam* p : here) {
          auto got = TensorAt(*f, f->root()->DictGet(p->local_name()), p->local_name());
          if (!got.ok()) continue;
          const bool trainable = p->role().empty() || p->role() == "trainable";
          UCP_ASSIGN_OR_RETURN(torch::Tensor slice, slice_of(*p, trainable ? "fp32" : "lp", rank));
          UCP_ASSIGN_OR_RETURN(torch::Tensor want_t, trainable ? torch::Cast(slice, info.lp_dtype) : slice);
          if (!got->BitwiseEqual(want_t)) {
            diff(name, absl::StrCat("'", p->local_name(), "' is not tp slice ", rank, " of '", p->name(), "'"));
          }
        }
      }
    }
    UCP_ASSIGN_OR_RETURN(std::vector<std::string> files, ListDirectory(dir));
    int layer_files = 0;
    for (const auto& f : files) layer_files += absl::StartsWith(f, "layer_");
    if (layer_files != spec.module_layers_size() * t.tp()) {
      diff(dir, absl::StrCat(layer_files, " layer files, expected one per module layer and tp rank (",
                             spec.module_layers_size() * t.tp(), ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status SaveMatchesDeepSpeedLayout(CaseRunner& r) {
  const Property p = Property::kSaveMatchesDeepSpeedLayout;
  const Topology topologies[2] = {r.c().source(), r.c().target()};
  for (int i = 0; i < 2; ++i) {
    UCP_ASSIGN_OR_RETURN(std::string zero, i == 0 ? r.Save("zero_t1", topologies[0]) : r.SaveT2(),
                         _.Prepend(absl::StrCat("save at T", i + 1, ": ")));
    const std::string version = i == 0 ? r.V1() : r.V2();
    std::vector<std::string> diffs;
    UCP_RETURN_IF_ERROR(CheckLayout(r, zero, topologies[i], version, diffs));
    if (!diffs.empty()) {
      return Violation(p, absl::StrCat("save(M, T", i + 1, ") is not laid out as DeepSpeed ", version,
                                       " lays it out:\n  ", Joined(diffs)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

const char* PropertyLetter(Property p) {
  switch (p) {
    case Property::kConvertIsTopologyFree: return "a";
    case Property::kReshardMatchesSave: return "b";
    case Property::kDirectReshardMatchesTwoStep: return "c";
    case Property::kCorruptionsAreCaught: return "d";
    case Property::kSaveMatchesDeepSpeedLayout: return "e";
  }
  return "?";
}

const char* PropertyName(Property p) {
  switch (p) {
    case Property::kConvertIsTopologyFree: return "convert(save(M, T)) is the same for every T and equals M";
    case Property::kReshardMatchesSave: return "reshard(convert(save(M, T1)), T2) == save(M, T2)";
    case Property::kDirectReshardMatchesTwoStep: return "ZeRO -> ZeRO reshard == the two-step path";
    case Property::kCorruptionsAreCaught: return "corruptions give the right error";
    case Property::kSaveMatchesDeepSpeedLayout: return "save(M, T) is laid out as its DeepSpeed version lays it out";
  }
  return "?";
}

std::vector<Property> AllProperties() {
  return {Property::kConvertIsTopologyFree, Property::kReshardMatchesSave, Property::kDirectReshardMatchesTwoStep,
          Property::kCorruptionsAreCaught, Property::kSaveMatchesDeepSpeedLayout};
}

absl::StatusOr<Property> ParseProperty(const std::string& s) {
  for (Property p : AllProperties()) {
    if (s == PropertyLetter(p)) return p;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown property '", s, "' (a, b, c, d, e)"));
}

absl::Status CheckProperty(Property p, const GoldenCase& c, const std::string& work) {
  return CheckProperties({p}, c, work);
}

absl::Status CheckProperties(const std::vector<Property>& properties, const GoldenCase& c, const std::string& work) {
  Scratch scratch(work);
  UCP_ASSIGN_OR_RETURN(std::unique_ptr<CaseRunner> r, CaseRunner::Make(c, scratch.dir()),
                       _.Prepend("building the synthetic model: "));
  for (Property p : properties) {
    absl::Status s;
    switch (p) {
      case Property::kConvertIsTopologyFree: s = ConvertIsTopologyFree(*r); break;
      case Property::kReshardMatchesSave: s = ReshardMatchesSave(*r); break;
      case Property::kDirectReshardMatchesTwoStep: s = DirectReshardMatchesTwoStep(*r); break;
      case Property::kCorruptionsAreCaught: s = CorruptionsAreCaught(*r, scratch.Path("damaged")); break;
      case Property::kSaveMatchesDeepSpeedLayout: s = SaveMatchesDeepSpeedLayout(*r); break;
    }
    // ucp failing on a valid model is a violation too: say which property hit it.
    if (!s.ok() && !absl::StartsWith(s.message(), "property (")) {
      s = Violation(p, absl::StrCat("ucp failed on a valid checkpoint: ", s.ToString()));
    }
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> FolderByteDiffs(const std::string& a, const std::string& b,
                                                        const std::vector<std::string>& ignore) {
  testing::CompareOptions o;
  o.byte_identical = true;
  o.max_differences = 1000;
  return testing::CompareFolders(a, b, ignore, o);
}

// --- fuzzing ---

std::string DefaultScratchDir(const std::string& name) {
  // Thousands of small checkpoints: memory is several times faster than disk.
  std::string base = "/dev/shm";
  if (!IsDirectory(base) || access(base.c_str(), W_OK) != 0) {
    const char* t = std::getenv("TEST_TMPDIR");
    if (t == nullptr || *t == '\0') t = std::getenv("TMPDIR");
    base = t != nullptr && *t != '\0' ? t : "/tmp";
  }
  return JoinPath(base, absl::StrCat("ucp_", name, "_", getpid()));
}

void FuzzDistribution::Add(const GoldenCase& c) {
  ++cases;
  for (const Topology& t : {c.source(), c.target()}) {
    ++counts["tp"][absl::StrCat(t.tp())];
    ++counts["pp"][absl::StrCat(t.pp())];
    ++counts["dp"][absl::StrCat(t.dp())];
  }
  const ModelSpec& m = c.model();
  ++counts["style"][m.style()];
  ++counts["rules source"][m.rules_source() == kCheckpointInfoSource && m.preset() == "none"
                                ? "checkpoint_info(--preset=none)"
                                : m.rules_source()];
  ++counts["module"][m.pipeline() ? "pipeline" : "plain"];
  {
    const std::string v1 = c.ds_version().empty() ? "0.14.4" : c.ds_version();
    const std::string v2 = c.target_ds_version().empty() ? v1 : c.target_ds_version();
    ++counts["ds_version (T1)"][v1];
    ++counts["ds_version (T2)"][v2];
    auto convention = [&](const std::string& v) {
      if (c.optimizer_layout() == "bf16") return "last(bf16)";
      return OracleVersion(v) >= std::make_tuple(0, 16, 4) ? "per-rank" : "last";
    };
    ++counts["paddings T1->T2"][absl::StrCat(convention(v1), "->", convention(v2))];
    ++counts["numpy"][c.numpy2() ? "2 (numpy._core)" : "1"];
  }
  ++counts["optimizer"][absl::StrCat(c.optimizer_layout(), "/", m.lp_dtype(), "/zero", c.zero_stage())];
  for (const auto& f : CaseFeatures(c)) ++counts["features (cases)"][f];
  for (const ModelParam& p : m.param()) {
    std::string kind = tp::MergeKindName(p.rule().kind());
    if (p.rule().kind() == SUB_PARAMS) kind = p.rule().sub_param_shape().dim_size() > 0 ? "sub_params_gqa" : "sub_params_2";
    ++counts["param kinds (params)"][kind];
  }
  if (m.pipeline()) ++counts["partition method"][m.partition_method().empty() ? "(default)" : m.partition_method()];
  // Property (d) nudges a replicated param's tp copy when T1 has tp copies.
  bool replicated = false;
  for (const ModelParam& p : m.param()) {
    replicated |= p.rule().kind() == REPLICATED && (p.role().empty() || p.role() == "trainable") && p.tied_key().empty();
  }
  ++counts["(d) replicated check"][replicated && c.source().tp() >= 2 ? "applies" : "n/a (tp=1 or none)"];
}

std::string FuzzDistribution::ToString() const {
  std::string out = absl::StrCat("distribution over ", cases, " cases (tp, pp, dp count both topologies of a case):\n");
  for (const auto& [dim, values] : counts) {
    std::vector<std::pair<std::string, int>> v(values.begin(), values.end());
    // Numbers in numeric order.
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) {
      if (a.first.size() != b.first.size() && std::isdigit(a.first[0]) && std::isdigit(b.first[0])) {
        return a.first.size() < b.first.size();
      }
      return a.first < b.first;
    });
    std::vector<std::string> parts;
    for (const auto& [k, n] : v) parts.push_back(absl::StrCat(k, ":", n));
    absl::StrAppendFormat(&out, "  %-20s %s\n", dim, absl::StrJoin(parts, "  "));
  }
  return out;
}

FuzzReport RunFuzz(const FuzzOptions& options) {
  FuzzReport report;
  const std::string work = options.workdir.empty() ? DefaultScratchDir("fuzz") : options.workdir;
  bool failing = false;  // after the first failure RapidCheck only shrinks
  std::string last_failure;
  GoldenCase last_failed_case;
  auto property = [&]() {
    const GoldenCase c = *GenCase(options.gen);
    if (!failing) report.distribution.Add(c);
    absl::Status s = CheckProperties(options.properties, c, JoinPath(work, "case"));
    if (s.ok() && options.case_check) s = options.case_check(c);
    if (!s.ok()) {
      failing = true;
      last_failure = std::string(s.message());
      last_failed_case = c;
      RC_FAIL(std::string(s.message()));
    }
  };
  rc::detail::TestParams params;
  params.seed = options.seed;
  params.maxSuccess = options.cases;
  params.maxSize = options.max_size;
  rc::detail::TestMetadata metadata;
  metadata.id = "ucp_fuzz";
  metadata.description = "ucp conformance properties";
  const rc::detail::TestResult result = rc::detail::checkTestable(property, metadata, params);
  (void)RemoveTree(work);
  if (result.template is<rc::detail::SuccessResult>()) {
    report.passed = true;
    report.cases_passed = result.template get<rc::detail::SuccessResult>().numSuccess;
    return report;
  }
  std::ostringstream os;
  rc::detail::printResultMessage(result, os);
  if (result.template is<rc::detail::FailureResult>()) {
    const auto& f = result.template get<rc::detail::FailureResult>();
    report.cases_passed = f.numSuccess;
    // The last failing run RapidCheck made is the shrunk case.
    report.failure = last_failure;
    std::string text;
    google::protobuf::TextFormat::PrintToString(last_failed_case, &text);
    report.shrunk_case = text;
  } else {
    report.failure = os.str();
  }
  report.replay = absl::StrCat("ucp_conformance fuzz --seed=", options.seed, " --cases=", options.cases,
                               " (or RC_PARAMS=\"seed=", options.seed, "\" for the tests)");
  return report;
}

}  // namespace ucp::conformance
