#include "tp/plan_io.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace ucp::tp {

namespace {

// Streams a plan's bytes: views of the sources where they are contiguous.
torch::StorageViewer PlanViewer(const TensorPlan& plan) {
  const size_t isz = torch::ItemSize(plan.dtype());
  return [plan, isz](uint64_t offset, size_t len, uint8_t* scratch) -> absl::StatusOr<absl::Span<const uint8_t>> {
    if (offset % isz != 0 || len % isz != 0) {
      return absl::InternalError(
          absl::StrCat("storage chunk [", offset, ", +", len, ") is not aligned to the element size ", isz));
    }
    return plan.ReadFlat(static_cast<int64_t>(offset / isz), static_cast<int64_t>(len / isz), scratch);
  };
}

}  // namespace

pickle::ValuePtr AddPlan(torch::TorchWriter& writer, const TensorPlan& plan) {
  return writer.AddStreamedTensor(plan.dtype(), plan.shape(), plan.numel(), 0, PlanViewer(plan));
}

absl::StatusOr<pickle::ValuePtr> AddPlanAs(torch::TorchWriter& writer, const TensorPlan& plan, torch::DType cast_to) {
  if (cast_to == plan.dtype()) return AddPlan(writer, plan);
  if (!torch::IsFloatingPoint(plan.dtype()) || !torch::IsFloatingPoint(cast_to)) {
    return absl::InvalidArgumentError(absl::StrCat("cannot cast ", std::string(torch::DTypeName(plan.dtype())), " to ",
                                                   std::string(torch::DTypeName(cast_to))));
  }
  const size_t in_isz = torch::ItemSize(plan.dtype());
  const size_t out_isz = torch::ItemSize(cast_to);
  const torch::DType from = plan.dtype();
  return writer.AddStreamedTensor(
      cast_to, plan.shape(), plan.numel(), 0,
      [plan, in_isz, out_isz, from, cast_to](uint64_t offset, absl::Span<uint8_t> dst) -> absl::Status {
        if (offset % out_isz != 0 || dst.size() % out_isz != 0) {
          return absl::InternalError("storage chunk not aligned to the element size");
        }
        const int64_t start = static_cast<int64_t>(offset / out_isz);
        const int64_t count = static_cast<int64_t>(dst.size() / out_isz);
        std::string buf(static_cast<size_t>(count) * in_isz, '\0');
        UCP_RETURN_IF_ERROR(plan.CopyFlat(start, count, reinterpret_cast<uint8_t*>(buf.data())));
        UCP_ASSIGN_OR_RETURN(torch::Tensor src, torch::Tensor::FromBytes(from, {count}, std::move(buf)));
        UCP_ASSIGN_OR_RETURN(torch::Tensor cast, torch::Cast(src, cast_to));
        std::memcpy(dst.data(), cast.data(), dst.size());
        return absl::OkStatus();
      });
}

absl::Status SetRequiresGrad(pickle::Value& v, bool requires_grad) {
  // _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks)
  if (!v.is(pickle::Kind::kObject) || !v.object().args || v.object().args->items().size() < 5) {
    return absl::InvalidArgumentError("not a _rebuild_tensor_v2 value");
  }
  v.mutable_object().args->mutable_items()[4] = pickle::Value::Bool(requires_grad);
  return absl::OkStatus();
}

absl::StatusOr<pickle::ValuePtr> AddPlanView(torch::TorchWriter& writer, const TensorPlan& plan, int64_t view_numel,
                                             bool requires_grad) {
  if (plan.dim() != 1 || view_numel < 0 || view_numel > plan.numel()) {
    return absl::InvalidArgumentError(absl::StrCat("a view of ", view_numel, " elements of a plan of shape ",
                                                   torch::ShapeString(plan.shape())));
  }
  pickle::ValuePtr v = writer.AddStreamedTensor(plan.dtype(), {view_numel}, plan.numel(), 0, PlanViewer(plan));
  UCP_RETURN_IF_ERROR(SetRequiresGrad(*v, requires_grad));
  return v;
}

absl::StatusOr<WrittenFile> WriteTorchFile(torch::TorchWriter& writer, const std::string& path,
                                           const pickle::Value& root) {
  UCP_RETURN_IF_ERROR(writer.WriteFile(path, root));
  WrittenFile out;
  out.size = static_cast<int64_t>(writer.bytes_written());
  out.digest = writer.digest_hex();
  return out;
}

}  // namespace ucp::tp
