#include "conformance/golden.h"

#include <algorithm>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/fs.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "conformance/spec_rules.h"
#include "conformance/synthetic_state.h"
#include "ops/convert.h"
#include "testing/compare.h"
#include "format/torch/torch_file.h"
#include "google/protobuf/text_format.h"
#include "ops/reshard.h"

namespace ucp::conformance {
namespace {

using pickle::Kind;
using pickle::Value;

template <typename M>
absl::StatusOr<M> ReadTextproto(const std::string& path) {
  UCP_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  M m;
  if (!google::protobuf::TextFormat::ParseFromString(text, &m)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a valid ", m.GetTypeName(), " textproto"));
  }
  return m;
}

std::string KeyText(const Value& k) { return k.is(Kind::kStr) ? k.str() : k.DebugString(80); }

// Walks a value tree: tensors become GoldenEntries, everything else a
// canonical text whose sha256 is the file's structure digest.
class Describer {
 public:
  explicit Describer(const torch::TorchFile& f) : f_(f) {}
  std::vector<GoldenEntry> tensors;
  std::string structure;

  void Walk(const Value& v, const std::string& path) {
    if (torch::TorchFile::IsTensor(v)) {
      auto t = f_.GetTensor(v);
      GoldenEntry e;
      e.set_key(path);
      if (!t.ok()) {
        e.set_dtype("unreadable");
      } else {
        for (int64_t d : t->sizes()) e.add_shape(d);
        e.set_dtype(std::string(torch::DTypeName(t->dtype())));
        e.set_sha256(Sha256Hex(t->ContiguousBytes()));
        absl::StrAppend(&structure, "tensor(", e.dtype(), torch::ShapeString(t->sizes()), ")");
      }
      tensors.push_back(std::move(e));
      return;
    }
    switch (v.kind()) {
      case Kind::kDict:
        absl::StrAppend(&structure, v.ordered_dict() ? "OrderedDict{" : "{");
        for (const auto& [k, x] : v.dict_items()) {
          absl::StrAppend(&structure, k->DebugString(200), ": ");
          Walk(*x, path.empty() ? KeyText(*k) : absl::StrCat(path, ".", KeyText(*k)));
          absl::StrAppend(&structure, ", ");
        }
        absl::StrAppend(&structure, "}");
        return;
      case Kind::kList:
      case Kind::kTuple:
      case Kind::kSet:
      case Kind::kFrozenSet:
        absl::StrAppend(&structure, pickle::KindName(v.kind()), "[");
        for (size_t i = 0; i < v.items().size(); ++i) {
          Walk(*v.items()[i], absl::StrCat(path, "[", i, "]"));
          absl::StrAppend(&structure, ", ");
        }
        absl::StrAppend(&structure, "]");
        return;
      case Kind::kObject: {
        const pickle::Object& o = v.object();
        absl::StrAppend(&structure, "object ", o.callable ? o.callable->DebugString(200) : "?", "(");
        if (o.args) Walk(*o.args, path + ".__args__");
        absl::StrAppend(&structure, ")");
        if (o.state) {
          absl::StrAppend(&structure, "state ");
          Walk(*o.state, path + ".__state__");
        }
        return;
      }
      default:
        absl::StrAppend(&structure, v.DebugString(100000));
    }
  }

 private:
  const torch::TorchFile& f_;
};

absl::StatusOr<GoldenFile> DescribeFile(const std::string& path, const std::string& name) {
  UCP_ASSIGN_OR_RETURN(auto f, torch::TorchFile::Open(path));
  GoldenFile g;
  g.set_path(name);
  const Value& root = *f->root();
  if (root.is(Kind::kDict)) {
    for (const auto& [k, v] : root.dict_items()) {
      g.add_key(KeyText(*k));
      const bool container = v->is(Kind::kDict) || v->is(Kind::kList) || v->is(Kind::kTuple) || v->is(Kind::kSet) ||
                             v->is(Kind::kObject);
      if (!container) {
        GoldenEntry* s = g.add_scalar();
        s->set_key(KeyText(*k));
        s->set_value(v->DebugString(200));
      }
    }
  }
  Describer d(*f);
  d.Walk(root, "");
  for (auto& e : d.tensors) *g.add_tensor() = std::move(e);
  g.set_structure_sha256(Sha256Hex(d.structure));
  return g;
}

std::string EntryText(const GoldenEntry& e) {
  return absl::StrCat(e.dtype(), torch::ShapeString({e.shape().begin(), e.shape().end()}), " sha256 ",
                      e.sha256().substr(0, 16));
}

// Differences between two descriptions of one file.
std::vector<std::string> CompareFile(const GoldenFile& want, const GoldenFile& got) {
  std::vector<std::string> d;
  const std::vector<std::string> kw(want.key().begin(), want.key().end()), kg(got.key().begin(), got.key().end());
  if (kw != kg) d.push_back(absl::StrCat("keys [", absl::StrJoin(kg, ", "), "], golden [", absl::StrJoin(kw, ", "), "]"));
  std::map<std::string, const GoldenEntry*> gs;
  for (const auto& s : got.scalar()) gs[s.key()] = &s;
  for (const auto& s : want.scalar()) {
    auto it = gs.find(s.key());
    if (it == gs.end()) {
      d.push_back(absl::StrCat(s.key(), ": missing (golden ", s.value(), ")"));
    } else if (it->second->value() != s.value()) {
      d.push_back(absl::StrCat(s.key(), ": ", it->second->value(), ", golden ", s.value()));
    }
  }
  for (const auto& s : got.scalar()) {
    if (std::none_of(want.scalar().begin(), want.scalar().end(), [&](const GoldenEntry& w) { return w.key() == s.key(); })) {
      d.push_back(absl::StrCat(s.key(), ": ", s.value(), ", not in the golden"));
    }
  }
  std::map<std::string, const GoldenEntry*> gt;
  for (const auto& t : got.tensor()) gt[t.key()] = &t;
  for (const auto& t : want.tensor()) {
    auto it = gt.find(t.key());
    const std::string key = t.key().empty() ? "<root>" : t.key();
    if (it == gt.end()) {
      d.push_back(absl::StrCat(key, ": no tensor (golden ", EntryText(t), ")"));
      continue;
    }
    const GoldenEntry& g = *it->second;
    if (g.dtype() != t.dtype() || !std::equal(g.shape().begin(), g.shape().end(), t.shape().begin(), t.shape().end())) {
      d.push_back(absl::StrCat(key, ": ", g.dtype(), torch::ShapeString({g.shape().begin(), g.shape().end()}),
                               ", golden ", t.dtype(), torch::ShapeString({t.shape().begin(), t.shape().end()})));
    } else if (g.sha256() != t.sha256()) {
      d.push_back(absl::StrCat(key, ": values differ (sha256 ", g.sha256().substr(0, 16), ", golden ",
                               t.sha256().substr(0, 16), ")"));
    }
  }
  for (const auto& t : got.tensor()) {
    if (std::none_of(want.tensor().begin(), want.tensor().end(), [&](const GoldenEntry& w) { return w.key() == t.key(); })) {
      d.push_back(absl::StrCat(t.key(), ": tensor ", EntryText(t), " not in the golden"));
    }
  }
  if (d.empty() && want.structure_sha256() != got.structure_sha256()) {
    d.push_back("structure differs (non-tensor values or nesting)");
  }
  return d;
}

// "universal/zero/2.attention.dense.weight/fp32.pt" -> "2.attention.dense.weight".
std::string ParamOfPath(const std::string& rel) {
  for (const std::string prefix : {"zero/", "ucp_module/"}) {
    if (!absl::StartsWith(rel, prefix)) continue;
    std::string rest = rel.substr(prefix.size());
    if (prefix == "ucp_module/") return absl::EndsWith(rest, ".pt") ? rest.substr(0, rest.size() - 3) : rest;
    const size_t slash = rest.rfind('/');
    if (slash != std::string::npos) return rest.substr(0, slash);
  }
  return "";
}

}  // namespace

absl::StatusOr<GoldenCase> ReadGoldenCase(const std::string& dir) {
  return ReadTextproto<GoldenCase>(JoinPath(dir, kGoldenCaseFile));
}

absl::StatusOr<Golden> ReadGolden(const std::string& dir) { return ReadTextproto<Golden>(JoinPath(dir, kGoldenFile)); }

absl::StatusOr<std::string> WriteGoldenSource(const GoldenCase& c, const std::string& root) {
  UCP_ASSIGN_OR_RETURN(auto m, SyntheticModelState::FromCase(c));
  const std::string out = JoinPath(root, absl::StrCat("global_step", m->Step(0)));
  UCP_RETURN_IF_ERROR(SaveZero(*m, out, state::Topology::FromProto(c.source()), 0).status());
  return out;
}

absl::StatusOr<GoldenRun> RunGoldenCase(const GoldenCase& c, const std::string& work) {
  GoldenRun run;
  UCP_ASSIGN_OR_RETURN(run.source, WriteGoldenSource(c, JoinPath(work, "source")));
  const std::string tag = Basename(run.source);
  UCP_ASSIGN_OR_RETURN(ops::SourceOptions zero_options, ZeroSourceOptionsFor(c.model(), work));
  ops::ConvertOptions co;
  co.input_folder = run.source;
  co.output_folder = JoinPath(JoinPath(work, "universal"), tag + "_universal");
  co.state = zero_options;
  UCP_RETURN_IF_ERROR(ops::Convert(co).status());
  run.universal = co.output_folder;
  ops::ReshardOptions ro;
  ro.input_folder = run.universal;
  ro.output_folder = JoinPath(JoinPath(work, "target"), tag);
  ro.write.target = state::Topology::FromProto(c.target());
  ro.verify_checksums = true;
  UCP_RETURN_IF_ERROR(ops::Reshard(ro).status());
  run.target = ro.output_folder;
  return run;
}

absl::StatusOr<std::vector<GoldenFile>> DescribeFolder(const std::string& dir, const std::string& prefix) {
  UCP_ASSIGN_OR_RETURN(std::vector<std::string> files, testing::ListFilesRecursive(dir));
  std::vector<GoldenFile> out;
  for (const auto& f : files) {
    if (!absl::EndsWith(f, ".pt")) continue;  // the manifest names the run's folders
    UCP_ASSIGN_OR_RETURN(GoldenFile g, DescribeFile(JoinPath(dir, f), prefix.empty() ? f : JoinPath(prefix, f)));
    out.push_back(std::move(g));
  }
  return out;
}

absl::StatusOr<Golden> MakeGolden(const GoldenCase& c, const std::string& work) {
  (void)RemoveTree(work);
  UCP_ASSIGN_OR_RETURN(GoldenRun run, RunGoldenCase(c, work));
  Golden g;
  *g.mutable_case_() = c;
  UCP_ASSIGN_OR_RETURN(std::vector<GoldenFile> u, DescribeFolder(run.universal, "universal"));
  UCP_ASSIGN_OR_RETURN(std::vector<GoldenFile> t, DescribeFolder(run.target, "target"));
  for (auto& f : u) *g.add_file() = std::move(f);
  for (auto& f : t) *g.add_file() = std::move(f);
  (void)RemoveTree(work);
  return g;
}

std::vector<std::string> CompareGoldens(const Golden& want, const Golden& got) {
  std::vector<std::string> diffs;
  std::string a, b;
  google::protobuf::TextFormat::PrintToString(want.case_(), &a);
  google::protobuf::TextFormat::PrintToString(got.case_(), &b);
  if (a != b) diffs.push_back("the golden was made from another case");
  std::map<std::string, const GoldenFile*> got_files;
  for (const auto& f : got.file()) got_files[f.path()] = &f;
  std::set<std::string> want_paths;
  for (const auto& f : want.file()) {
    want_paths.insert(f.path());
    auto it = got_files.find(f.path());
    if (it == got_files.end()) {
      diffs.push_back(absl::StrCat(f.path(), ": not written"));
      continue;
    }
    for (const auto& d : CompareFile(f, *it->second)) diffs.push_back(absl::StrCat(f.path(), ": ", d));
  }
  for (const auto& f : got.file()) {
    if (!want_paths.count(f.path())) diffs.push_back(absl::StrCat(f.path(), ": written, not in the golden"));
  }
  return diffs;
}

absl::StatusOr<std::map<std::string, std::vector<std::string>>> CheckUniversal(const Golden& golden,
                                                                             const std::string& universal) {
  std::string dir = universal;
  // A root holding latest_universal, as DeepSpeed's loader accepts.
  if (!IsDirectory(JoinPath(dir, "zero")) && PathExists(JoinPath(dir, "latest_universal"))) {
    UCP_ASSIGN_OR_RETURN(std::string tag, ReadFileToString(JoinPath(dir, "latest_universal")));
    while (!tag.empty() && (tag.back() == '\n' || tag.back() == ' ')) tag.pop_back();
    dir = JoinPath(dir, tag);
  }
  if (!IsDirectory(JoinPath(dir, "zero"))) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": not a universal checkpoint (no zero/ folder)"));
  }
  UCP_ASSIGN_OR_RETURN(std::vector<GoldenFile> described, DescribeFolder(dir, "universal"));
  std::map<std::string, const GoldenFile*> got;
  for (const auto& f : described) got[f.path()] = &f;
  std::map<std::string, std::vector<std::string>> report;
  std::set<std::string> golden_paths;
  for (const GoldenFile& want : golden.file()) {
    if (!absl::StartsWith(want.path(), "universal/")) continue;
    golden_paths.insert(want.path());
    const std::string rel = want.path().substr(std::string("universal/").size());
    const bool ucp_only = absl::StartsWith(rel, "ucp_module/");
    auto it = got.find(want.path());
    if (it == got.end()) {
      if (!ucp_only) report[ParamOfPath(rel)].push_back(absl::StrCat(rel, ": missing"));
      continue;
    }
    for (const auto& d : CompareFile(want, *it->second)) report[ParamOfPath(rel)].push_back(absl::StrCat(rel, ": ", d));
  }
  for (const auto& f : described) {
    if (golden_paths.count(f.path())) continue;
    const std::string rel = f.path().substr(std::string("universal/").size());
    report[ParamOfPath(rel)].push_back(absl::StrCat(rel, ": not in the golden"));
  }
  return report;
}

absl::Status UpdateGolden(const std::string& dir, const std::string& work) {
  UCP_ASSIGN_OR_RETURN(GoldenCase c, ReadGoldenCase(dir));
  UCP_ASSIGN_OR_RETURN(Golden g, MakeGolden(c, work));
  std::string text;
  google::protobuf::TextFormat::PrintToString(g, &text);
  return WriteFileAtomic(JoinPath(dir, kGoldenFile),
                         absl::StrCat("# proto-file: proto/ucp.proto\n# proto-message: ucp.Golden\n",
                                      "# Generated by `ucp golden update --golden=", dir,
                                      "` from case.textproto; do not edit.\n", text));
}

std::string DeepSpeedSliceAssertion(int64_t full_numel, int64_t slice_numel, int tp_world_size) {
  // universal_checkpoint.py:load_hp_checkpoint_state:
  //   assert full_hp_param.numel() == tp_world_size * tp_slice.numel(), (line continues)
  //       f'Loading {ckpt_file} full param numel {full_hp_param.numel()} != tensor slice numel
  //       {tp_slice.numel()} * tp_world_size {tp_world_size}'
  return absl::StrCat("full param numel ", full_numel, " != tensor slice numel ", slice_numel, " * tp_world_size ",
                      tp_world_size);
}

}  // namespace ucp::conformance
