#include "conformance/layout_diff.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/fs.h"
#include "format/pickle/accessors.h"
#include "format/pickle/value.h"
#include "format/torch/torch_file.h"
#include "testing/compare.h"

namespace ucp::conformance {
namespace {

using pickle::Kind;
using pickle::Value;

// Top-level keys whose values depend on the job, not on the layout.
const std::set<std::string> kJobKeys = {"ds_config",     "args",         "random_rng_state", "np_rng_state",
                                        "torch_rng_state", "rng_tracker_states", "iteration", "global_steps",
                                        "global_samples", "universal_checkpoint_info"};

// Compares two value trees by layout: kinds, dict keys in order, sequence
// lengths, scalars; tensors by dtype, shape, storage size, offset and
// requires_grad (not by values). ZeroStageEnum by stage, whatever its encoding.
class LayoutComparer {
 public:
  LayoutComparer(const torch::TorchFile& a, const torch::TorchFile& b, bool module_storage)
      : a_(a), b_(b), module_storage_(module_storage) {}
  std::vector<std::string> diffs;

  void Compare(const Value& x, const Value& y, const std::string& path, int depth) {
    if (diffs.size() > 20) return;
    if (depth == 1 && kJobKeys.count(path)) return;
    const bool tx = torch::TorchFile::IsTensor(x), ty = torch::TorchFile::IsTensor(y);
    if (tx || ty) {
      if (tx != ty) return Add(path, "tensor vs non-tensor");
      auto a = a_.GetTensor(x);
      auto b = b_.GetTensor(y);
      if (!a.ok() || !b.ok()) return Add(path, "unreadable tensor");
      const bool storage = module_storage_ || path.rfind("module.", 0) != 0;
      if (a->dtype() != b->dtype() || a->sizes() != b->sizes() ||
          (storage && (a->storage()->numel() != b->storage()->numel() || a->storage_offset() != b->storage_offset())) ||
          a->requires_grad() != b->requires_grad()) {
        Add(path, absl::StrCat("tensor ", std::string(torch::DTypeName(a->dtype())), torch::ShapeString(a->sizes()), " storage ",
                               a->storage()->numel(), "+", a->storage_offset(), " rg ", a->requires_grad(), " vs ",
                               std::string(torch::DTypeName(b->dtype())), torch::ShapeString(b->sizes()), " storage ",
                               b->storage()->numel(), "+", b->storage_offset(), " rg ", b->requires_grad()));
      }
      return;
    }
    if (x.IsObjectOf("deepspeed.runtime.zero.config", "ZeroStageEnum") ||
        y.IsObjectOf("deepspeed.runtime.zero.config", "ZeroStageEnum") || x.is(Kind::kObject) && x.object_name() == "getattr") {
      auto sa = pickle::AsZeroStage(x), sb = pickle::AsZeroStage(y);
      if (!sa.ok() || !sb.ok() || *sa != *sb) Add(path, "zero_stage differs");
      return;
    }
    if (x.kind() != y.kind()) return Add(path, absl::StrCat(pickle::KindName(x.kind()), " vs ", pickle::KindName(y.kind())));
    switch (x.kind()) {
      case Kind::kDict: {
        std::vector<std::string> kx, ky;
        for (const auto& [k, v] : x.dict_items()) kx.push_back(k->DebugString());
        for (const auto& [k, v] : y.dict_items()) ky.push_back(k->DebugString());
        if (kx != ky || x.ordered_dict() != y.ordered_dict()) {
          return Add(path, absl::StrCat(x.ordered_dict() ? "OrderedDict" : "dict", " keys [", absl::StrJoin(kx, ", "),
                                        "] vs ", y.ordered_dict() ? "OrderedDict" : "dict", " [",
                                        absl::StrJoin(ky, ", "), "]"));
        }
        for (size_t i = 0; i < x.dict_items().size(); ++i) {
          const std::string key = x.dict_items()[i].first->is(Kind::kStr) ? x.dict_items()[i].first->str()
                                                                           : x.dict_items()[i].first->DebugString();
          Compare(*x.dict_items()[i].second, *y.dict_items()[i].second, path.empty() ? key : path + "." + key,
                  depth + 1);
        }
        return;
      }
      case Kind::kList:
      case Kind::kTuple:
      case Kind::kSet:
        if (x.items().size() != y.items().size()) {
          return Add(path, absl::StrCat(x.items().size(), " items vs ", y.items().size()));
        }
        for (size_t i = 0; i < x.items().size(); ++i) {
          Compare(*x.items()[i], *y.items()[i], absl::StrCat(path, "[", i, "]"), depth + 1);
        }
        return;
      case Kind::kObject:
        if (x.object_module() != y.object_module() || x.object_name() != y.object_name()) {
          return Add(path, absl::StrCat("object ", std::string(x.object_name()), " vs ", std::string(y.object_name())));
        }
        if (x.object().state && y.object().state) Compare(*x.object().state, *y.object().state, path + ".__state__", depth + 1);
        if (x.object().args && y.object().args) Compare(*x.object().args, *y.object().args, path + ".__args__", depth + 1);
        return;
      default:
        if (!pickle::DeepEqual(x, y)) Add(path, absl::StrCat(x.DebugString(), " vs ", y.DebugString()));
        return;
    }
  }

 private:
  void Add(const std::string& path, const std::string& what) { diffs.push_back(absl::StrCat(path, ": ", what)); }
  const torch::TorchFile& a_;
  const torch::TorchFile& b_;
  bool module_storage_ = true;
};

}  // namespace

std::vector<std::string> LayoutDiffs(const std::string& ours, const std::string& theirs, bool module_storage) {
  std::vector<std::string> diffs;
  auto fa = testing::ListFilesRecursive(ours);
  auto fb = testing::ListFilesRecursive(theirs);
  if (!fa.ok() || !fb.ok()) return {"cannot list"};
  if (*fa != *fb) return {absl::StrCat("files [", absl::StrJoin(*fa, ", "), "] vs [", absl::StrJoin(*fb, ", "), "]")};
  for (const auto& f : *fa) {
    auto a = torch::TorchFile::Open(JoinPath(ours, f));
    auto b = torch::TorchFile::Open(JoinPath(theirs, f));
    if (!a.ok() || !b.ok()) {
      diffs.push_back(absl::StrCat(f, ": cannot open"));
      continue;
    }
    LayoutComparer c(**a, **b, module_storage);
    c.Compare(*(*a)->root(), *(*b)->root(), "", 0);
    for (const auto& d : c.diffs) diffs.push_back(absl::StrCat(f, ": ", d));
  }
  return diffs;
}

}  // namespace ucp::conformance
