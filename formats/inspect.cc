#include "formats/inspect.h"

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
#include "format/pickle/unsafe.h"
#include "format/torch/torch_file.h"

namespace ucp::formats {
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
        stack.push_back(p);  // (lstat: a symlink to a folder is not followed)
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

absl::StatusOr<InspectReport> Inspect(const Registry& registry, const std::string& path,
                                      const SourceOptions& options) {
  if (!PathExists(path)) return absl::NotFoundError(absl::StrCat(path, ": no such file or folder"));
  if (!IsDirectory(path)) return InspectFile(path);
  UCP_ASSIGN_OR_RETURN(DetectedFolder detected, DetectFolder(registry, path));
  const std::vector<std::string> unsafe = ScanUnsafeGlobals(detected.folder.dir);
  // Inspecting reads what it reports: files with unsafe globals included.
  SourceOptions read = options;
  read.allow_unsafe_pickles = true;
  UCP_ASSIGN_OR_RETURN(InspectReport report, detected.format->Inspect(detected.folder, read));
  for (const auto& u : unsafe) report.add_unsafe(u);
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
  if (!r.kind_detail().empty()) absl::StrAppend(&out, " (", r.kind_detail(), ")");
  absl::StrAppendFormat(&out, "\n  tag: %s\n  topology: tp=%d pp=%d dp=%d\n  pipeline: %s\n  lp dtype: %s\n",
                        r.tag(), r.topology().tp(), r.topology().pp(), r.topology().dp(),
                        r.pipeline() ? "PipelineModule (layer files)" : "plain module", r.lp_dtype());
  if (!r.ds_version().empty()) absl::StrAppend(&out, "  ds_version: ", r.ds_version(), "\n");
  for (const auto& g : r.group()) {
    if (g.padding_size() == 0) {  // not partitioned over dp in equal shares
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
    if (p.undecided()) absl::StrAppend(&out, " (tp split undecided: saved at tp=1, no rule)");
    absl::StrAppend(&out, "\n");
    for (const auto& f : p.fragment()) {
      if (r.fragment_ranges() && p.group() >= 0) {
        absl::StrAppendFormat(&out, "      %s [%d, +%d)\n", f.file(), f.offset(), f.numel());
      } else {
        absl::StrAppendFormat(&out, "      %s\n", f.file());
      }
    }
  }
  return out;
}

}  // namespace ucp::formats
