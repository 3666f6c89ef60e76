#include "format/torch/torch_test_util.h"

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "format/torch/test_util.h"

namespace ucp::torch::testing {
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

class TreeCopier {
 public:
  TreeCopier(const TorchFile& file, TorchWriter& writer) : file_(file), writer_(writer) {}

  absl::StatusOr<ValuePtr> Copy(const ValuePtr& v) {
    if (v == nullptr) return v;
    auto it = memo_.find(v.get());
    if (it != memo_.end()) return it->second;
    absl::StatusOr<ValuePtr> out = CopyNew(v);
    if (out.ok()) memo_.emplace(v.get(), *out);
    return out;
  }

 private:
  absl::StatusOr<std::vector<ValuePtr>> CopyAll(const std::vector<ValuePtr>& items) {
    std::vector<ValuePtr> out;
    for (const ValuePtr& item : items) {
      absl::StatusOr<ValuePtr> c = Copy(item);
      if (!c.ok()) return c.status();
      out.push_back(*std::move(c));
    }
    return out;
  }

  absl::StatusOr<ValuePtr> CopyNew(const ValuePtr& v) {
    switch (v->kind()) {
      case Kind::kTuple:
      case Kind::kList: {
        absl::StatusOr<std::vector<ValuePtr>> items = CopyAll(v->items());
        if (!items.ok()) return items.status();
        return v->is(Kind::kTuple) ? Value::Tuple(*std::move(items)) : Value::List(*std::move(items));
      }
      case Kind::kSet:
      case Kind::kFrozenSet: {
        ValuePtr s = Value::MakeSet(v->is(Kind::kFrozenSet));
        for (const ValuePtr& item : v->set_items()) {
          absl::StatusOr<ValuePtr> c = Copy(item);
          if (!c.ok()) return c.status();
          s->SetAdd(*std::move(c));
        }
        return s;
      }
      case Kind::kDict: {
        ValuePtr d = Value::MakeDict(v->ordered_dict());
        for (const auto& [k, item] : v->dict_items()) {
          absl::StatusOr<ValuePtr> ck = Copy(k);
          absl::StatusOr<ValuePtr> ci = Copy(item);
          if (!ck.ok()) return ck.status();
          if (!ci.ok()) return ci.status();
          d->DictSet(*std::move(ck), *std::move(ci));
        }
        if (v->dict_state() != nullptr) {
          absl::StatusOr<ValuePtr> st = Copy(v->dict_state());
          if (!st.ok()) return st.status();
          d->set_dict_state(*std::move(st));
        }
        return d;
      }
      case Kind::kObject: {
        if (v->IsObjectOf("torch._utils", "_rebuild_tensor_v2")) {
          absl::StatusOr<Tensor> t = file_.GetTensor(*v);
          if (!t.ok()) return t.status();
          return writer_.AddTensor(*t);
        }
        const pickle::Object& o = v->object();
        pickle::Object c;
        c.how = o.how;
        for (auto [dst, src] : {std::pair{&c.callable, &o.callable}, {&c.args, &o.args}, {&c.kwargs, &o.kwargs},
                                {&c.state, &o.state}}) {
          absl::StatusOr<ValuePtr> x = Copy(*src);
          if (!x.ok()) return x.status();
          *dst = *std::move(x);
        }
        absl::StatusOr<std::vector<ValuePtr>> items = CopyAll(o.list_items);
        if (!items.ok()) return items.status();
        c.list_items = *std::move(items);
        for (const auto& [k, item] : o.dict_items) {
          absl::StatusOr<ValuePtr> ck = Copy(k);
          absl::StatusOr<ValuePtr> ci = Copy(item);
          if (!ck.ok()) return ck.status();
          if (!ci.ok()) return ci.status();
          c.dict_items.push_back({*std::move(ck), *std::move(ci)});
        }
        return Value::MakeObject(std::move(c));
      }
      case Kind::kPersistentId:
        return absl::UnimplementedError("bare storages are not copied");
      default:
        return v;  // immutable scalars, strings, globals
    }
  }

  const TorchFile& file_;
  TorchWriter& writer_;
  absl::flat_hash_map<const Value*, ValuePtr> memo_;
};

}  // namespace

absl::StatusOr<pickle::ValuePtr> CopyTreeForWrite(const TorchFile& file, const pickle::ValuePtr& root,
                                                  TorchWriter& writer) {
  TreeCopier copier(file, writer);
  return copier.Copy(root);
}

absl::StatusOr<std::map<std::string, std::string>> PythonDumps(const std::vector<std::string>& files) {
  static int run = 0;
  const std::string list = TempPath(absl::StrCat("python_dumps/list", run, ".txt"));
  const std::string out = TempPath(absl::StrCat("python_dumps/out", run, ".txt"));
  ++run;
  absl::Status s = WriteStringToFile(list, absl::StrJoin(files, "\n") + "\n");
  if (!s.ok()) return s;
  absl::StatusOr<std::string> ran = RunPython(PackageDataPath("testdata/canonical_dump.py"), {out, "@" + list});
  if (!ran.ok()) return ran.status();
  absl::StatusOr<std::string> text = ReadFileToString(out);
  if (!text.ok()) return text.status();
  std::map<std::string, std::string> dumps;
  std::string* current = nullptr;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    if (absl::ConsumePrefix(&line, "=== ")) {
      current = &dumps[std::string(line)];
      continue;
    }
    if (current != nullptr && !line.empty()) absl::StrAppend(current, line, "\n");
  }
  return dumps;
}

}  // namespace ucp::torch::testing
