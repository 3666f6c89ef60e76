#include "format/torch/tree_copy.h"

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace ucp::torch {
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

class Copier {
 public:
  Copier(const TorchFile* file, TorchWriter& writer) : file_(file), writer_(writer) {}

  absl::StatusOr<ValuePtr> Copy(const ValuePtr& v, int depth) {
    if (!v) return v;
    if (depth > 1000) return absl::InvalidArgumentError("value tree nested deeper than 1000");
    auto it = memo_.find(v.get());
    if (it != memo_.end()) return it->second;
    ValuePtr out;
    switch (v->kind()) {
      case Kind::kNone:
      case Kind::kBool:
      case Kind::kInt:
      case Kind::kFloat:
      case Kind::kStr:
      case Kind::kBytes:
      case Kind::kByteArray:
      case Kind::kGlobal:
        out = v;  // immutable leaves can be shared as they are
        break;
      case Kind::kTuple:
      case Kind::kList: {
        std::vector<ValuePtr> items;
        for (const auto& item : v->items()) {
          UCP_ASSIGN_OR_RETURN(ValuePtr c, Copy(item, depth + 1));
          items.push_back(std::move(c));
        }
        out = v->is(Kind::kTuple) ? Value::Tuple(std::move(items)) : Value::List(std::move(items));
        break;
      }
      case Kind::kSet:
      case Kind::kFrozenSet: {
        out = Value::MakeSet(v->is(Kind::kFrozenSet));
        for (const auto& item : v->set_items()) {
          UCP_ASSIGN_OR_RETURN(ValuePtr c, Copy(item, depth + 1));
          out->SetAdd(std::move(c));
        }
        break;
      }
      case Kind::kDict: {
        out = Value::MakeDict(v->ordered_dict());
        for (const auto& [k, val] : v->dict_items()) {
          UCP_ASSIGN_OR_RETURN(ValuePtr ck, Copy(k, depth + 1));
          UCP_ASSIGN_OR_RETURN(ValuePtr cv, Copy(val, depth + 1));
          out->DictSet(std::move(ck), std::move(cv));
        }
        if (v->dict_state()) {  // an OrderedDict's attributes (state_dict's _metadata)
          UCP_ASSIGN_OR_RETURN(ValuePtr st, Copy(v->dict_state(), depth + 1));
          out->set_dict_state(std::move(st));
        }
        break;
      }
      case Kind::kObject: {
        // A tensor (a parameter is copied as the object it is, around one).
        if (v->IsObjectOf("torch._utils", "_rebuild_tensor_v2")) {
          if (file_ == nullptr) {
            return absl::InvalidArgumentError("a tensor in a value tree that has no source file");
          }
          UCP_ASSIGN_OR_RETURN(Tensor t, file_->GetTensor(*v));
          out = writer_.AddTensor(t);
          break;
        }
        // A tensor with attributes (_rebuild_from_type_v2): the tensor copied,
        // its type and attributes kept around it.
        if (TorchFile::IsTensor(*v) && v->IsObjectOf("torch._tensor", "_rebuild_from_type_v2")) {
          if (file_ == nullptr) {
            return absl::InvalidArgumentError("a tensor in a value tree that has no source file");
          }
          UCP_ASSIGN_OR_RETURN(Tensor t, file_->GetTensor(*v));
          ValuePtr inner = writer_.AddTensor(t);
          const auto& a = v->object().args->items();
          UCP_ASSIGN_OR_RETURN(ValuePtr func, Copy(a[0], depth + 1));
          UCP_ASSIGN_OR_RETURN(ValuePtr type, Copy(a[1], depth + 1));
          UCP_ASSIGN_OR_RETURN(ValuePtr state, Copy(a[3], depth + 1));
          pickle::Object c;
          UCP_ASSIGN_OR_RETURN(c.callable, Copy(v->object().callable, depth + 1));
          c.args = Value::Tuple({func, type, inner->object().args, state});
          out = Value::MakeObject(std::move(c));
          break;
        }
        const pickle::Object& o = v->object();
        pickle::Object c;
        c.how = o.how;
        UCP_ASSIGN_OR_RETURN(c.callable, Copy(o.callable, depth + 1));
        UCP_ASSIGN_OR_RETURN(c.args, Copy(o.args, depth + 1));
        UCP_ASSIGN_OR_RETURN(c.kwargs, Copy(o.kwargs, depth + 1));
        UCP_ASSIGN_OR_RETURN(c.state, Copy(o.state, depth + 1));
        for (const auto& item : o.list_items) {
          UCP_ASSIGN_OR_RETURN(ValuePtr ci, Copy(item, depth + 1));
          c.list_items.push_back(std::move(ci));
        }
        for (const auto& [k, val] : o.dict_items) {
          UCP_ASSIGN_OR_RETURN(ValuePtr ck, Copy(k, depth + 1));
          UCP_ASSIGN_OR_RETURN(ValuePtr cv, Copy(val, depth + 1));
          c.dict_items.emplace_back(std::move(ck), std::move(cv));
        }
        out = Value::MakeObject(std::move(c));
        break;
      }
      case Kind::kPersistentId:
        return absl::InvalidArgumentError(
            absl::StrCat("a bare storage (persistent id ", v->DebugString(80), ") outside a tensor is not supported"));
    }
    memo_[v.get()] = out;
    return out;
  }

 private:
  const TorchFile* file_;
  TorchWriter& writer_;
  absl::flat_hash_map<const Value*, ValuePtr> memo_;
};

}  // namespace

absl::StatusOr<pickle::ValuePtr> CopyTreeForWrite(const TorchFile* file, const pickle::ValuePtr& root,
                                                  TorchWriter& writer) {
  Copier copier(file, writer);
  return copier.Copy(root, 0);
}

}  // namespace ucp::torch
