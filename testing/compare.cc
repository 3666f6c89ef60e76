#include "testing/compare.h"

#include <algorithm>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/fs.h"
#include "base/status_macros.h"

namespace ucp::testing {
namespace {

using pickle::Kind;
using pickle::Value;

class Comparer {
 public:
  Comparer(const torch::TorchFile& a, const torch::TorchFile& b, const CompareOptions& o) : a_(a), b_(b), o_(o) {}

  void Compare(const Value& x, const Value& y, const std::string& path) {
    if (diffs.size() >= o_.max_differences) return;
    const bool tx = torch::TorchFile::IsTensor(x), ty = torch::TorchFile::IsTensor(y);
    if (tx || ty) {
      if (tx != ty) return Add(path, absl::StrCat("tensor vs ", tx ? y.DebugString(60) : x.DebugString(60)));
      auto ta = a_.GetTensor(x);
      auto tb = b_.GetTensor(y);
      if (!ta.ok() || !tb.ok()) return Add(path, "unreadable tensor");
      if (ta->dtype() != tb->dtype()) {
        return Add(path, absl::StrCat("dtype ", std::string(torch::DTypeName(ta->dtype())), " vs ", std::string(torch::DTypeName(tb->dtype()))));
      }
      if (ta->sizes() != tb->sizes()) {
        return Add(path, absl::StrCat("shape ", torch::ShapeString(ta->sizes()), " vs ",
                                      torch::ShapeString(tb->sizes())));
      }
      if (o_.compare_requires_grad && ta->requires_grad() != tb->requires_grad()) {
        return Add(path, "requires_grad differs");
      }
      if (!ta->BitwiseEqual(*tb)) {
        std::string detail = "tensor bytes differ";
        if (torch::IsFloatingPoint(ta->dtype())) {
          auto d = torch::MaxAbsDiff(*ta, *tb);
          if (d.ok()) absl::StrAppend(&detail, " (max |diff| ", *d, ")");
        }
        return Add(path, detail);
      }
      return;
    }
    if (x.kind() != y.kind()) {
      return Add(path, absl::StrCat(pickle::KindName(x.kind()), " vs ", pickle::KindName(y.kind())));
    }
    switch (x.kind()) {
      case Kind::kDict: {
        if (x.ordered_dict() != y.ordered_dict()) Add(path, "OrderedDict vs dict");
        if ((x.dict_state() == nullptr) != (y.dict_state() == nullptr)) {
          Add(path, "dict attributes (e.g. _metadata) present in one only");
        } else if (x.dict_state() != nullptr) {
          Compare(*x.dict_state(), *y.dict_state(), Child(path, "<attributes>"));
        }
        std::vector<std::string> kx, ky;
        for (const auto& [k, v] : x.dict_items()) kx.push_back(k->DebugString(80));
        for (const auto& [k, v] : y.dict_items()) ky.push_back(k->DebugString(80));
        if (kx != ky) {
          for (const auto& k : kx) {
            if (std::find(ky.begin(), ky.end(), k) == ky.end()) Add(path, absl::StrCat("key ", k, " only in the first"));
          }
          for (const auto& k : ky) {
            if (std::find(kx.begin(), kx.end(), k) == kx.end()) Add(path, absl::StrCat("key ", k, " only in the second"));
          }
          std::vector<std::string> sx = kx, sy = ky;
          std::sort(sx.begin(), sx.end());
          std::sort(sy.begin(), sy.end());
          if (sx == sy && !o_.ignore_key_order) Add(path, "keys in a different order");
        }
        for (const auto& [k, v] : x.dict_items()) {
          const Value* w = y.DictGet(k);
          if (w == nullptr) continue;
          Compare(*v, *w, Child(path, k->is(Kind::kStr) ? k->str() : k->DebugString(40)));
        }
        return;
      }
      case Kind::kList:
      case Kind::kTuple:
      case Kind::kSet:
      case Kind::kFrozenSet: {
        if (x.items().size() != y.items().size()) {
          return Add(path, absl::StrCat("length ", x.items().size(), " vs ", y.items().size()));
        }
        for (size_t i = 0; i < x.items().size(); ++i) Compare(*x.items()[i], *y.items()[i], Child(path, absl::StrCat(i)));
        return;
      }
      case Kind::kObject: {
        const auto& ox = x.object();
        const auto& oy = y.object();
        if (!ox.callable || !oy.callable || !pickle::DeepEqual(*ox.callable, *oy.callable)) {
          return Add(path, absl::StrCat(x.DebugString(80), " vs ", y.DebugString(80)));
        }
        if (ox.args && oy.args) Compare(*ox.args, *oy.args, Child(path, "<args>"));
        if ((ox.state == nullptr) != (oy.state == nullptr)) return Add(path, "object state present in one only");
        if (ox.state) Compare(*ox.state, *oy.state, Child(path, "<state>"));
        return;
      }
      default:
        if (!pickle::DeepEqual(x, y)) Add(path, absl::StrCat(x.DebugString(80), " vs ", y.DebugString(80)));
        return;
    }
  }

  std::vector<std::string> diffs;

 private:
  static std::string Child(const std::string& path, const std::string& key) {
    return path.empty() ? key : absl::StrCat(path, ".", key);
  }
  void Add(const std::string& path, const std::string& what) {
    if (diffs.size() < o_.max_differences) diffs.push_back(absl::StrCat(path.empty() ? "<root>" : path, ": ", what));
  }
  const torch::TorchFile& a_;
  const torch::TorchFile& b_;
  const CompareOptions& o_;
};

absl::Status ListInto(const std::string& root, const std::string& rel, std::vector<std::string>& out) {
  UCP_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(JoinPath(root, rel)));
  for (const auto& n : names) {
    if (rel.empty() && n == kUcpOutputMarker) continue;  // what --overwrite recognizes, not content
    const std::string r = rel.empty() ? n : JoinPath(rel, n);
    if (IsDirectory(JoinPath(root, r))) {
      UCP_RETURN_IF_ERROR(ListInto(root, r, out));
    } else {
      out.push_back(r);
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<std::string> CompareTrees(const torch::TorchFile& a, const Value& va, const torch::TorchFile& b,
                                      const Value& vb, const CompareOptions& options) {
  Comparer c(a, b, options);
  c.Compare(va, vb, "");
  return c.diffs;
}

absl::StatusOr<std::vector<std::string>> CompareFiles(const std::string& a, const std::string& b,
                                                      const CompareOptions& options) {
  UCP_ASSIGN_OR_RETURN(auto fa, torch::TorchFile::Open(a));
  UCP_ASSIGN_OR_RETURN(auto fb, torch::TorchFile::Open(b));
  return CompareTrees(*fa, *fa->root(), *fb, *fb->root(), options);
}

absl::StatusOr<std::vector<std::string>> CompareSingleMpRankFile(const std::string& single,
                                                                 const std::string& source_rank0) {
  CompareOptions o;
  o.max_differences = std::numeric_limits<size_t>::max();
  UCP_ASSIGN_OR_RETURN(std::vector<std::string> all, CompareFiles(single, source_rank0, o));
  std::vector<std::string> out;
  for (const std::string& d : all) {
    const bool module_tensor = absl::StartsWith(d, "module: key '") && absl::EndsWith(d, "' only in the second");
    const bool degree = absl::StartsWith(d, "mp_world_size: 1 vs ") ||
                        absl::StartsWith(d, "checkpoint_parallel_dimensions.tp_degree: 1 vs ");
    if (!module_tensor && !degree) out.push_back(d);
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> ListFilesRecursive(const std::string& dir) {
  std::vector<std::string> out;
  UCP_RETURN_IF_ERROR(ListInto(dir, "", out));
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<std::vector<std::string>> CompareFolders(const std::string& a, const std::string& b,
                                                        const std::vector<std::string>& ignore,
                                                        const CompareOptions& options) {
  UCP_ASSIGN_OR_RETURN(std::vector<std::string> fa, ListFilesRecursive(a));
  UCP_ASSIGN_OR_RETURN(std::vector<std::string> fb, ListFilesRecursive(b));
  auto skip = [&](const std::string& f) { return std::find(ignore.begin(), ignore.end(), f) != ignore.end(); };
  std::vector<std::string> diffs;
  for (const auto& f : fa) {
    if (!skip(f) && !std::binary_search(fb.begin(), fb.end(), f)) diffs.push_back(absl::StrCat(f, ": only in ", a));
  }
  for (const auto& f : fb) {
    if (!skip(f) && !std::binary_search(fa.begin(), fa.end(), f)) diffs.push_back(absl::StrCat(f, ": only in ", b));
  }
  for (const auto& f : fa) {
    if (skip(f) || !std::binary_search(fb.begin(), fb.end(), f)) continue;
    if (diffs.size() >= options.max_differences) break;
    if (options.byte_identical || !absl::EndsWith(f, ".pt")) {
      UCP_ASSIGN_OR_RETURN(std::string x, ReadFileToString(JoinPath(a, f)));
      UCP_ASSIGN_OR_RETURN(std::string y, ReadFileToString(JoinPath(b, f)));
      if (x == y) continue;
      std::vector<std::string> why;
      if (absl::EndsWith(f, ".pt")) {
        auto d = CompareFiles(JoinPath(a, f), JoinPath(b, f), options);
        if (d.ok()) why = *d;
      }
      diffs.push_back(absl::StrCat(f, ": bytes differ (", x.size(), " vs ", y.size(), " bytes)",
                                   why.empty() ? "" : absl::StrCat("; ", absl::StrJoin(why, "; "))));
    } else {
      UCP_ASSIGN_OR_RETURN(std::vector<std::string> d, CompareFiles(JoinPath(a, f), JoinPath(b, f), options));
      for (const auto& x : d) diffs.push_back(absl::StrCat(f, ": ", x));
    }
  }
  return diffs;
}

}  // namespace ucp::testing
