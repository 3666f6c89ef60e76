// TensorPlan: a tensor described as a row-major sequence of runs of elements
// taken from source tensors (or zeros), so that tp merges, tp splits, vocab
// padding and ZeRO flattening can be composed without copying anything until
// the bytes are written out.
//
// The converter builds the full tensor of a param as Cat/Narrow of plans over
// the ZeRO fragments in the optimizer files; the loader builds a tp slice as
// Narrow/Chunk of a plan over the universal file's tensor; the writers then
// stream `CopyFlat` ranges straight into the output files. Sources are
// `torch::Tensor` views (memory-mapped), so a plan holds no tensor data.
//
// Example:
//   TensorPlan a = TensorPlan::FromTensor(slice0), b = TensorPlan::FromTensor(slice1);
//   UCP_ASSIGN_OR_RETURN(TensorPlan full, TensorPlan::Cat({a, b}, /*dim=*/1));
//   std::vector<uint8_t> out(full.nbytes());
//   UCP_RETURN_IF_ERROR(full.CopyFlat(0, full.numel(), out.data()));
#ifndef UCP_TP_TENSOR_PLAN_H_
#define UCP_TP_TENSOR_PLAN_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "format/torch/dtype.h"
#include "format/torch/tensor.h"

namespace ucp::tp {

class TensorPlan {
 public:
  TensorPlan() = default;
  // The whole of `t` (any strides), with its shape.
  static TensorPlan FromTensor(const torch::Tensor& t);
  // The flat concatenation of `pieces` (each taken in its own row-major
  // order), viewed as `shape`. kInvalidArgument unless the numels add up and
  // the dtypes agree.
  static absl::StatusOr<TensorPlan> FromPieces(torch::DType dtype, std::vector<int64_t> shape,
                                               const std::vector<torch::Tensor>& pieces);
  static TensorPlan Zeros(torch::DType dtype, std::vector<int64_t> shape);

  // A source that is opened on first use: a writer can build (and lay out)
  // a file's whole tree from shapes alone and open only the sources of the
  // bytes it writes (a piece of a file, writers/plan.h). `open` is called at
  // most once, by the first read of an element, under a lock; its plan must
  // have the declared dtype and shape (else that read fails, naming `label`).
  // `files`: the input files opening and reading the source touches, for
  // planning (DeferredIn).
  struct DeferredSource {
    torch::DType dtype = torch::DType::kFloat32;
    std::vector<int64_t> shape;
    std::function<absl::StatusOr<TensorPlan>()> open;
    std::string label;               // for errors, e.g. "param 'x' exp_avg"
    std::vector<std::string> files;  // what opening and reading it touches
  };
  static TensorPlan Deferred(DeferredSource source);
  // The deferred sources that elements [start, start + count) read (in
  // order; one entry per run), each with the range of its elements read.
  // Nothing is opened.
  struct DeferredUse {
    const DeferredSource* source;
    int64_t offset;  // first element, in the source's row-major order
    int64_t count;
  };
  std::vector<DeferredUse> DeferredIn(int64_t start, int64_t count) const;

  torch::DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * torch::ItemSize(dtype_); }
  size_t num_runs() const { return runs_.size(); }

  // Same elements, another shape of equal numel (row-major, like a view).
  absl::StatusOr<TensorPlan> Reshape(std::vector<int64_t> shape) const;
  absl::StatusOr<TensorPlan> Narrow(int64_t dim, int64_t start, int64_t length) const;
  // torch.chunk semantics (ceil(size / chunks) per chunk, last may be smaller).
  absl::StatusOr<std::vector<TensorPlan>> Chunk(int64_t chunks, int64_t dim) const;
  // Elements [start, start + count) of the flattening, as a 1-D plan.
  absl::StatusOr<TensorPlan> FlatRange(int64_t start, int64_t count) const;
  // torch.cat: equal dtype, equal sizes except on `dim`.
  static absl::StatusOr<TensorPlan> Cat(const std::vector<TensorPlan>& plans, int64_t dim);
  // Appends rows of zeros on dim 0 up to `rows` (vocab padding); `rows` must be
  // >= shape()[0].
  absl::StatusOr<TensorPlan> PadDim0(int64_t rows) const;

  // Copies elements [start, start + count) of the row-major flattening to
  // `out` (count * itemsize bytes).
  absl::Status CopyFlat(int64_t start, int64_t count, uint8_t* out) const;
  // Elements [start, start + count): a view of the source's memory when they
  // lie in one run of one contiguous source (no copy), else copied into
  // `scratch` (count * itemsize bytes) and returned from there.
  absl::StatusOr<absl::Span<const uint8_t>> ViewFlat(int64_t start, int64_t count, uint8_t* scratch) const;
  // As ViewFlat, for a writer streaming the plan: bytes of a memory-mapped
  // file are read into `scratch` (pread) rather than viewed, since the first
  // touch of a mapping's pages costs several times a read on a VM (see
  // StageSourceRanges); in-memory sources are still viewed.
  absl::StatusOr<absl::Span<const uint8_t>> ReadFlat(int64_t start, int64_t count, uint8_t* scratch) const;
  // The whole plan as a contiguous tensor on an owned storage.
  absl::StatusOr<torch::Tensor> Materialize() const;
  // Bitwise equality of the elements (shapes must match too), streamed in
  // bounded memory.
  static absl::StatusOr<bool> BitwiseEqual(const TensorPlan& a, const TensorPlan& b);
  // True when the plan is exactly one contiguous source tensor viewed whole:
  // then `source_tensor()` can be written without copying (never for a
  // deferred source: asking does not open it).
  bool IsWholeContiguousSource() const;
  const torch::Tensor* source_tensor() const;

 private:
  class Opener;  // a DeferredSource and what opening it gave
  struct Source {
    torch::Tensor tensor;
    std::shared_ptr<Opener> deferred;  // set for a deferred source
  };
  struct Run {
    int source = -1;     // index into sources_, or -1 for zeros
    int64_t offset = 0;  // first element in the source's row-major order
    int64_t length = 0;  // elements
  };
  void AppendRun(const Run& r);
  absl::StatusOr<absl::Span<const uint8_t>> ViewOrRead(int64_t start, int64_t count, uint8_t* scratch,
                                                       bool read_mapped) const;
  // CopyFlat reads its range a window of this many output bytes at a time;
  // source bytes are read into a buffer (staged) in spans of at least
  // kStageMinBytes.
  static constexpr size_t kWindowBytes = size_t{1} << 20;
  static constexpr size_t kStageMinBytes = size_t{64} << 10;
  // Elements [start, start + count) into `out`, which lie in one window;
  // returns how many of them opened (deferred) plans copied.
  absl::StatusOr<int64_t> CopyWindow(int64_t start, int64_t count, uint8_t* out) const;
  // Bytes [lo, hi) of a contiguous source that a window reads; `bytes` holds
  // them when they were staged, else null (read from the source's memory).
  struct StagedSpan {
    int source;
    size_t lo, hi;  // bytes of the source
    size_t used;    // how many of them the runs read
    const uint8_t* bytes;
    bool stage = false;  // worth staging: large, and mostly read
  };
  struct StagedSpans {
    StagedSpans() = default;
    StagedSpans(StagedSpans&& o) noexcept : spans(std::move(o.spans)), depth(o.depth) { o.depth = -1; }
    StagedSpans(const StagedSpans&) = delete;
    StagedSpans& operator=(const StagedSpans&) = delete;
    ~StagedSpans();  // gives the staging buffer back
    absl::InlinedVector<StagedSpan, 8> spans;
    int depth = -1;  // of the staging buffer this thread lent, or -1
  };
  // The spans of the sources that runs first_run... read for elements
  // [start, end): large, dense ones staged, the others faulted in at once
  // (MappedFile::Populate) before they are copied.
  StagedSpans StageSourceRanges(size_t first_run, int64_t start, int64_t end) const;
  void AppendRange(const TensorPlan& from, int64_t start, int64_t count, int source_base);
  void FinishRuns();
  std::vector<int64_t> ComputeStarts() const;

  torch::DType dtype_ = torch::DType::kFloat32;
  std::vector<int64_t> shape_;
  int64_t numel_ = 0;
  std::shared_ptr<const std::vector<Source>> sources_;
  std::vector<Run> runs_;
  std::vector<int64_t> run_starts_;  // flat start of each run
};

// Rows [start, start + length) of each of `groups` equal groups of dim 0,
// concatenated (a Hugging Face tensor fused into a checkpoint param:
// rules::HfTensor).
absl::StatusOr<TensorPlan> GroupRows(const TensorPlan& full, int64_t groups, int64_t start, int64_t length);

}  // namespace ucp::tp

#endif  // UCP_TP_TENSOR_PLAN_H_
