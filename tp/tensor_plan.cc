#include "tp/tensor_plan.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "format/torch/mapped_file.h"
#include "format/torch/read_coverage.h"

namespace ucp::tp {
namespace {

int64_t Product(const std::vector<int64_t>& v, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end; ++i) p *= v[i];
  return p;
}

absl::Status CheckDim(const std::vector<int64_t>& shape, int64_t dim, const char* op) {
  if (dim < 0 || dim >= static_cast<int64_t>(shape.size())) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": dim ", dim, " out of range for shape ",
                                                   torch::ShapeString(shape)));
  }
  return absl::OkStatus();
}

}  // namespace

class TensorPlan::Opener {
 public:
  explicit Opener(DeferredSource source) : source_(std::move(source)) {}
  const DeferredSource& source() const { return source_; }

  // The plan `open` gave (opened by the first caller), or its error.
  absl::StatusOr<const TensorPlan*> Get() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!opened_) {
      opened_ = true;
      absl::StatusOr<TensorPlan> p =
          source_.open ? source_.open() : absl::StatusOr<TensorPlan>(absl::InternalError("no open function"));
      if (!p.ok()) {
        status_ = p.status();
      } else if (p->dtype() != source_.dtype || p->shape() != source_.shape) {
        status_ = absl::InvalidArgumentError(absl::StrCat(
            source_.label, ": opened as ", std::string(torch::DTypeName(p->dtype())), " ",
            torch::ShapeString(p->shape()), ", planned as ", std::string(torch::DTypeName(source_.dtype)), " ",
            torch::ShapeString(source_.shape)));
      } else {
        plan_ = *std::move(p);
      }
    }
    if (!status_.ok()) return status_;
    return &*plan_;
  }

 private:
  const DeferredSource source_;
  std::mutex mu_;
  bool opened_ = false;            // guarded by mu_
  absl::Status status_;            // guarded by mu_
  std::optional<TensorPlan> plan_;  // guarded by mu_; immutable once set
};

TensorPlan TensorPlan::Deferred(DeferredSource source) {
  TensorPlan p;
  p.dtype_ = source.dtype;
  p.shape_ = source.shape;
  p.numel_ = Product(p.shape_, 0, p.shape_.size());
  Source s;
  s.deferred = std::make_shared<Opener>(std::move(source));
  p.sources_ = std::make_shared<const std::vector<Source>>(std::vector<Source>{std::move(s)});
  if (p.numel_ > 0) p.runs_.push_back(Run{0, 0, p.numel_});
  p.FinishRuns();
  return p;
}

std::vector<TensorPlan::DeferredUse> TensorPlan::DeferredIn(int64_t start, int64_t count) const {
  std::vector<DeferredUse> out;
  start = std::max<int64_t>(start, 0);
  const int64_t end = std::min(start + std::max<int64_t>(count, 0), numel_);
  if (start >= end) return out;
  auto it = std::upper_bound(run_starts_.begin(), run_starts_.end(), start);
  size_t i = static_cast<size_t>(it - run_starts_.begin()) - 1;
  for (int64_t pos = start; pos < end && i < runs_.size(); ++i) {
    const Run& r = runs_[i];
    const int64_t within = pos - run_starts_[i];
    const int64_t take = std::min(r.length - within, end - pos);
    if (r.source >= 0 && (*sources_)[r.source].deferred) {
      out.push_back({&(*sources_)[r.source].deferred->source(), r.offset + within, take});
    }
    pos += take;
  }
  return out;
}

TensorPlan TensorPlan::FromTensor(const torch::Tensor& t) {
  TensorPlan p;
  p.dtype_ = t.dtype();
  p.shape_ = t.sizes();
  p.numel_ = t.numel();
  p.sources_ = std::make_shared<const std::vector<Source>>(std::vector<Source>{Source{t, nullptr}});
  if (p.numel_ > 0) p.runs_.push_back(Run{0, 0, p.numel_});
  p.FinishRuns();
  return p;
}

absl::StatusOr<TensorPlan> TensorPlan::FromPieces(torch::DType dtype, std::vector<int64_t> shape,
                                                  const std::vector<torch::Tensor>& pieces) {
  TensorPlan p;
  p.dtype_ = dtype;
  p.numel_ = Product(shape, 0, shape.size());
  p.shape_ = std::move(shape);
  int64_t total = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (pieces[i].dtype() != dtype) {
      return absl::InvalidArgumentError(absl::StrCat("piece ", i, " has dtype ", std::string(torch::DTypeName(pieces[i].dtype())),
                                                     ", expected ", std::string(torch::DTypeName(dtype))));
    }
    total += pieces[i].numel();
  }
  if (total != p.numel_) {
    return absl::InvalidArgumentError(absl::StrCat("pieces hold ", total, " elements, shape ",
                                                   torch::ShapeString(p.shape_), " needs ", p.numel_));
  }
  auto sources = std::make_shared<std::vector<Source>>();
  for (const torch::Tensor& t : pieces) sources->push_back(Source{t, nullptr});
  p.sources_ = std::move(sources);
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (pieces[i].numel() > 0) p.AppendRun(Run{static_cast<int>(i), 0, pieces[i].numel()});
  }
  p.FinishRuns();
  return p;
}

TensorPlan TensorPlan::Zeros(torch::DType dtype, std::vector<int64_t> shape) {
  TensorPlan p;
  p.dtype_ = dtype;
  p.numel_ = Product(shape, 0, shape.size());
  p.shape_ = std::move(shape);
  p.sources_ = std::make_shared<const std::vector<Source>>();
  if (p.numel_ > 0) p.runs_.push_back(Run{-1, 0, p.numel_});
  p.FinishRuns();
  return p;
}

void TensorPlan::AppendRun(const Run& r) {
  if (r.length == 0) return;
  if (!runs_.empty()) {
    Run& last = runs_.back();
    if (last.source == r.source && (r.source == -1 || last.offset + last.length == r.offset)) {
      last.length += r.length;
      return;
    }
  }
  runs_.push_back(r);
}

void TensorPlan::FinishRuns() { run_starts_ = ComputeStarts(); }

std::vector<int64_t> TensorPlan::ComputeStarts() const {
  std::vector<int64_t> starts;
  starts.reserve(runs_.size());
  int64_t s = 0;
  for (const Run& r : runs_) {
    starts.push_back(s);
    s += r.length;
  }
  return starts;
}

void TensorPlan::AppendRange(const TensorPlan& from, int64_t start, int64_t count, int source_base) {
  if (count <= 0) return;
  auto it = std::upper_bound(from.run_starts_.begin(), from.run_starts_.end(), start);
  size_t i = static_cast<size_t>(it - from.run_starts_.begin()) - 1;
  int64_t pos = start;
  const int64_t end = start + count;
  while (pos < end && i < from.runs_.size()) {
    const Run& r = from.runs_[i];
    const int64_t run_start = from.run_starts_[i];
    const int64_t within = pos - run_start;
    const int64_t take = std::min(r.length - within, end - pos);
    Run out;
    out.source = r.source < 0 ? -1 : r.source + source_base;
    out.offset = r.source < 0 ? 0 : r.offset + within;
    out.length = take;
    AppendRun(out);
    pos += take;
    ++i;
  }
}

absl::StatusOr<TensorPlan> TensorPlan::Reshape(std::vector<int64_t> shape) const {
  int64_t n = 1;
  int infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (infer >= 0) return absl::InvalidArgumentError("reshape: more than one -1");
      infer = static_cast<int>(i);
    } else if (shape[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("reshape: negative size in ", torch::ShapeString(shape)));
    } else {
      n *= shape[i];
    }
  }
  if (infer >= 0) {
    if (n == 0 || numel_ % n != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("reshape: cannot view ", torch::ShapeString(shape_), " as ", torch::ShapeString(shape)));
    }
    shape[infer] = numel_ / n;
    n = numel_;
  }
  if (n != numel_) {
    return absl::InvalidArgumentError(
        absl::StrCat("reshape: cannot view ", torch::ShapeString(shape_), " as ", torch::ShapeString(shape)));
  }
  TensorPlan p = *this;
  p.shape_ = std::move(shape);
  return p;
}

absl::StatusOr<TensorPlan> TensorPlan::Narrow(int64_t dim, int64_t start, int64_t length) const {
  UCP_RETURN_IF_ERROR(CheckDim(shape_, dim, "narrow"));
  if (start < 0 || length < 0 || start + length > shape_[dim]) {
    return absl::OutOfRangeError(absl::StrCat("narrow: [", start, ", ", start + length, ") outside dim ", dim,
                                              " of ", torch::ShapeString(shape_)));
  }
  TensorPlan p;
  p.dtype_ = dtype_;
  p.sources_ = sources_;
  p.shape_ = shape_;
  p.shape_[dim] = length;
  p.numel_ = Product(p.shape_, 0, p.shape_.size());
  const int64_t outer = Product(shape_, 0, dim);
  const int64_t block = Product(shape_, dim + 1, shape_.size());
  for (int64_t o = 0; o < outer; ++o) {
    p.AppendRange(*this, (o * shape_[dim] + start) * block, length * block, 0);
  }
  p.FinishRuns();
  return p;
}

absl::StatusOr<std::vector<TensorPlan>> TensorPlan::Chunk(int64_t chunks, int64_t dim) const {
  UCP_RETURN_IF_ERROR(CheckDim(shape_, dim, "chunk"));
  if (chunks <= 0) return absl::InvalidArgumentError(absl::StrCat("chunk: chunks must be > 0, got ", chunks));
  const int64_t size = shape_[dim];
  const int64_t step = (size + chunks - 1) / chunks;
  std::vector<TensorPlan> out;
  if (step == 0) {
    out.push_back(*this);
    return out;
  }
  for (int64_t start = 0; start < size; start += step) {
    UCP_ASSIGN_OR_RETURN(TensorPlan c, Narrow(dim, start, std::min(step, size - start)));
    out.push_back(std::move(c));
  }
  return out;
}

absl::StatusOr<TensorPlan> TensorPlan::FlatRange(int64_t start, int64_t count) const {
  if (start < 0 || count < 0 || start + count > numel_) {
    return absl::OutOfRangeError(absl::StrCat("flat range [", start, ", ", start + count, ") outside ", numel_,
                                              " elements"));
  }
  TensorPlan p;
  p.dtype_ = dtype_;
  p.sources_ = sources_;
  p.shape_ = {count};
  p.numel_ = count;
  p.AppendRange(*this, start, count, 0);
  p.FinishRuns();
  return p;
}

absl::StatusOr<TensorPlan> TensorPlan::Cat(const std::vector<TensorPlan>& plans, int64_t dim) {
  if (plans.empty()) return absl::InvalidArgumentError("cat: no tensors");
  const TensorPlan& first = plans[0];
  UCP_RETURN_IF_ERROR(CheckDim(first.shape_, dim, "cat"));
  std::vector<int64_t> shape = first.shape_;
  shape[dim] = 0;
  for (size_t i = 0; i < plans.size(); ++i) {
    const TensorPlan& p = plans[i];
    if (p.dtype_ != first.dtype_) {
      return absl::InvalidArgumentError(absl::StrCat("cat: tensor ", i, " has dtype ", std::string(torch::DTypeName(p.dtype_)),
                                                     ", tensor 0 has ", std::string(torch::DTypeName(first.dtype_))));
    }
    if (p.shape_.size() != first.shape_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("cat: tensor ", i, " has shape ", torch::ShapeString(p.shape_),
                                                     ", tensor 0 has ", torch::ShapeString(first.shape_)));
    }
    for (size_t d = 0; d < p.shape_.size(); ++d) {
      if (static_cast<int64_t>(d) != dim && p.shape_[d] != first.shape_[d]) {
        return absl::InvalidArgumentError(absl::StrCat("cat on dim ", dim, ": tensor ", i, " has shape ",
                                                       torch::ShapeString(p.shape_), ", tensor 0 has ",
                                                       torch::ShapeString(first.shape_)));
      }
    }
    shape[dim] += p.shape_[dim];
  }
  TensorPlan out;
  out.dtype_ = first.dtype_;
  out.shape_ = shape;
  out.numel_ = Product(shape, 0, shape.size());
  // Merge the source lists, sharing them when plans share one.
  auto sources = std::make_shared<std::vector<Source>>();
  std::unordered_map<const void*, int> base_of;
  std::vector<int> bases(plans.size());
  for (size_t i = 0; i < plans.size(); ++i) {
    const void* key = plans[i].sources_.get();
    auto it = base_of.find(key);
    if (it != base_of.end()) {
      bases[i] = it->second;
      continue;
    }
    bases[i] = static_cast<int>(sources->size());
    base_of[key] = bases[i];
    if (plans[i].sources_) sources->insert(sources->end(), plans[i].sources_->begin(), plans[i].sources_->end());
  }
  out.sources_ = sources;
  const int64_t outer = Product(shape, 0, dim);
  const int64_t block = Product(shape, dim + 1, shape.size());
  for (int64_t o = 0; o < outer; ++o) {
    for (size_t i = 0; i < plans.size(); ++i) {
      const int64_t n = plans[i].shape_[dim] * block;
      out.AppendRange(plans[i], o * n, n, bases[i]);
    }
  }
  out.FinishRuns();
  return out;
}

absl::StatusOr<TensorPlan> TensorPlan::PadDim0(int64_t rows) const {
  if (shape_.empty()) return absl::InvalidArgumentError("pad: a 0-dim tensor has no rows");
  if (rows < shape_[0]) {
    return absl::InvalidArgumentError(absl::StrCat("pad: ", rows, " rows is fewer than the ", shape_[0], " of ",
                                                   torch::ShapeString(shape_)));
  }
  if (rows == shape_[0]) return *this;
  std::vector<int64_t> pad_shape = shape_;
  pad_shape[0] = rows - shape_[0];
  return Cat({*this, Zeros(dtype_, pad_shape)}, 0);
}

absl::Status TensorPlan::CopyFlat(int64_t start, int64_t count, uint8_t* out) const {
  if (start < 0 || count < 0 || start + count > numel_) {
    return absl::OutOfRangeError(absl::StrCat("copy: [", start, ", ", start + count, ") outside ", numel_,
                                              " elements"));
  }
  if (count == 0) return absl::OkStatus();
  const size_t isz = torch::ItemSize(dtype_);
  // A window of output at a time, so that what it stages stays small.
  const int64_t window = std::max<int64_t>(1, static_cast<int64_t>(kWindowBytes / isz));
  int64_t deferred = 0;  // elements copied by opened plans (which count them)
  for (int64_t at = start; at < start + count; at += window) {
    UCP_ASSIGN_OR_RETURN(int64_t d, CopyWindow(at, std::min(window, start + count - at),
                                                 out + static_cast<size_t>(at - start) * isz));
    deferred += d;
  }
  // Bound the RSS that memory-mapped sources add (pages are given back every
  // few hundred MiB; see MappedFile::NoteBytesConsumed).
  torch::MappedFile::NoteBytesConsumed(static_cast<size_t>(count - deferred) * isz);
  return absl::OkStatus();
}

namespace {

// Buffers for staged source bytes, one per nesting depth of CopyWindow on
// this thread (a deferred source's plan copies inside its parent's window).
struct StageBuffers {
  std::vector<std::vector<uint8_t>> by_depth;
  int depth = 0;
};
thread_local StageBuffers stage_buffers;

// Reads n bytes of a mapped source at `from` into `dst` (pread; see
// StageSourceRanges) and gives the input check their CRC-32 as read; false
// when they are not bytes of a live mapping or the read failed.
bool ReadMappedNoted(const uint8_t* from, size_t n, uint8_t* dst) {
  if (!torch::MappedFile::ReadMapped(from, n, dst)) return false;
  torch::ReadCoverage::NoteCopy(from, dst, n);
  return true;
}

}  // namespace

absl::StatusOr<int64_t> TensorPlan::CopyWindow(int64_t start, int64_t count, uint8_t* out) const {
  const size_t isz = torch::ItemSize(dtype_);
  auto it = std::upper_bound(run_starts_.begin(), run_starts_.end(), start);
  size_t i = static_cast<size_t>(it - run_starts_.begin()) - 1;
  const int64_t end = start + count;
  // One run of a mapped source: read its bytes straight into `out`.
  if (const Run& r = runs_[i]; r.source >= 0 && start + count <= run_starts_[i] + r.length) {
    const Source& s = (*sources_)[r.source];
    if (!s.deferred && s.tensor.is_contiguous()) {
      const uint8_t* from = s.tensor.data() + static_cast<size_t>(r.offset + start - run_starts_[i]) * isz;
      const size_t n = static_cast<size_t>(count) * isz;
      if (n >= kStageMinBytes && ReadMappedNoted(from, n, out)) return 0;
    }
  }
  const StagedSpans staged = StageSourceRanges(i, start, end);
  int64_t pos = start;
  int64_t deferred = 0;
  while (pos < end) {
    const Run& r = runs_[i];
    const int64_t within = pos - run_starts_[i];
    const int64_t take = std::min(r.length - within, end - pos);
    uint8_t* dst = out + static_cast<size_t>(pos - start) * isz;
    if (r.source < 0) {
      std::memset(dst, 0, static_cast<size_t>(take) * isz);
    } else if (const Source& s = (*sources_)[r.source]; s.deferred) {
      UCP_ASSIGN_OR_RETURN(const TensorPlan* opened, s.deferred->Get());
      UCP_RETURN_IF_ERROR(opened->CopyFlat(r.offset + within, take, dst));
      deferred += take;
    } else {
      const torch::Tensor& src = s.tensor;
      if (src.is_contiguous()) {
        const size_t at = static_cast<size_t>(r.offset + within) * isz;
        const uint8_t* from = src.data() + at;
        const uint8_t* copy_from = from;
        for (const StagedSpan& x : staged.spans) {
          if (x.source == r.source && x.bytes != nullptr) copy_from = x.bytes + (at - x.lo);
        }
        std::memcpy(dst, copy_from, static_cast<size_t>(take) * isz);
        // The check of an input record read whole (DeferredCrcChecks)
        // takes the CRC-32 of these bytes, as copied, rather than reading
        // them once more.
        torch::ReadCoverage::NoteCopy(from, dst, static_cast<size_t>(take) * isz);
      } else {
        UCP_RETURN_IF_ERROR(src.CopyFlatRange(r.offset + within, take, dst));
      }
    }
    pos += take;
    ++i;
  }
  return deferred;
}

TensorPlan::StagedSpans::~StagedSpans() {
  if (depth >= 0) --stage_buffers.depth;
}

TensorPlan::StagedSpans TensorPlan::StageSourceRanges(size_t first_run, int64_t start, int64_t end) const {
  // Per contiguous source, the span of its bytes that runs first_run... read
  // for [start, end), and how many of them they read: a handful of sources,
  // each read in one span.
  StagedSpans out;
  const size_t isz = torch::ItemSize(dtype_);
  for (size_t i = first_run; i < runs_.size() && run_starts_[i] < end; ++i) {
    const Run& r = runs_[i];
    if (r.source < 0) continue;
    const Source& s = (*sources_)[r.source];
    if (s.deferred || !s.tensor.is_contiguous()) continue;
    const size_t lo = static_cast<size_t>(r.offset + std::max<int64_t>(start - run_starts_[i], 0)) * isz;
    const size_t hi = static_cast<size_t>(r.offset + std::min(r.length, end - run_starts_[i])) * isz;
    auto it = std::find_if(out.spans.begin(), out.spans.end(), [&](const StagedSpan& x) { return x.source == r.source; });
    if (it == out.spans.end()) {
      out.spans.push_back({r.source, lo, hi, hi - lo, nullptr});
    } else {
      it->lo = std::min(it->lo, lo);
      it->hi = std::max(it->hi, hi);
      it->used += hi - lo;
    }
  }
  // Spans of many bytes, most of them read, are read from the file into a
  // buffer (pread: the kernel copies them from the page cache, reading ahead
  // when they are not there) and copied from there; the first touch of a
  // mapping's pages costs several times that on a VM (measured here: 2 GB/s
  // reading a populated mapping of cached pages, 6.6 GB/s pread into a 1 MiB
  // buffer). The others are faulted in at once (MappedFile::Populate).
  size_t stage_bytes = 0;
  for (StagedSpan& x : out.spans) {
    const size_t n = x.hi - x.lo;
    x.stage = n >= kStageMinBytes && x.used * 2 >= n;
    if (x.stage) stage_bytes += n;
  }
  std::vector<uint8_t>* buffer = nullptr;
  if (stage_bytes > 0) {
    out.depth = stage_buffers.depth++;
    if (stage_buffers.by_depth.size() <= static_cast<size_t>(out.depth)) stage_buffers.by_depth.resize(out.depth + 1);
    buffer = &stage_buffers.by_depth[static_cast<size_t>(out.depth)];
    if (buffer->size() < stage_bytes) buffer->resize(stage_bytes);
  }
  size_t filled = 0;
  for (StagedSpan& x : out.spans) {
    const uint8_t* base = (*sources_)[x.source].tensor.data();
    const size_t n = x.hi - x.lo;
    if (x.stage && torch::MappedFile::ReadMapped(base + x.lo, n, buffer->data() + filled)) {
      x.bytes = buffer->data() + filled;
      filled += n;
    } else {
      torch::MappedFile::Populate(base + x.lo, n);
    }
  }
  return out;
}

absl::StatusOr<absl::Span<const uint8_t>> TensorPlan::ViewFlat(int64_t start, int64_t count, uint8_t* scratch) const {
  return ViewOrRead(start, count, scratch, /*read_mapped=*/false);
}

absl::StatusOr<absl::Span<const uint8_t>> TensorPlan::ReadFlat(int64_t start, int64_t count, uint8_t* scratch) const {
  return ViewOrRead(start, count, scratch, /*read_mapped=*/true);
}

absl::StatusOr<absl::Span<const uint8_t>> TensorPlan::ViewOrRead(int64_t start, int64_t count, uint8_t* scratch,
                                                                 bool read_mapped) const {
  const size_t isz = torch::ItemSize(dtype_);
  if (count > 0 && start >= 0 && start + count <= numel_) {
    auto it = std::upper_bound(run_starts_.begin(), run_starts_.end(), start);
    const size_t i = static_cast<size_t>(it - run_starts_.begin()) - 1;
    const Run& r = runs_[i];
    const int64_t within = start - run_starts_[i];
    if (r.source >= 0 && within + count <= r.length) {
      const Source& s = (*sources_)[r.source];
      if (s.deferred) {
        UCP_ASSIGN_OR_RETURN(const TensorPlan* opened, s.deferred->Get());
        return opened->ViewOrRead(r.offset + within, count, scratch, read_mapped);
      }
      const torch::Tensor& src = s.tensor;
      if (src.is_contiguous()) {
        const uint8_t* from = src.data() + static_cast<size_t>(r.offset + within) * isz;
        const size_t n = static_cast<size_t>(count) * isz;
        if (read_mapped && ReadMappedNoted(from, n, scratch)) return absl::MakeConstSpan(scratch, n);
        torch::MappedFile::NoteBytesConsumed(n);
        torch::MappedFile::Populate(from, n);
        return absl::MakeConstSpan(from, n);
      }
    }
  }
  UCP_RETURN_IF_ERROR(CopyFlat(start, count, scratch));
  return absl::MakeConstSpan(scratch, static_cast<size_t>(count) * isz);
}

absl::StatusOr<torch::Tensor> TensorPlan::Materialize() const {
  std::string bytes(nbytes(), '\0');
  UCP_RETURN_IF_ERROR(CopyFlat(0, numel_, reinterpret_cast<uint8_t*>(bytes.data())));
  return torch::Tensor::FromBytes(dtype_, shape_, std::move(bytes));
}

absl::StatusOr<bool> TensorPlan::BitwiseEqual(const TensorPlan& a, const TensorPlan& b) {
  if (a.dtype_ != b.dtype_ || a.shape_ != b.shape_) return false;
  const size_t isz = torch::ItemSize(a.dtype_);
  const int64_t chunk = std::max<int64_t>(1, (int64_t{4} << 20) / static_cast<int64_t>(isz));
  std::vector<uint8_t> x(static_cast<size_t>(std::min(chunk, a.numel_)) * isz);
  std::vector<uint8_t> y(x.size());
  for (int64_t s = 0; s < a.numel_; s += chunk) {
    const int64_t n = std::min(chunk, a.numel_ - s);
    UCP_RETURN_IF_ERROR(a.CopyFlat(s, n, x.data()));
    UCP_RETURN_IF_ERROR(b.CopyFlat(s, n, y.data()));
    if (std::memcmp(x.data(), y.data(), static_cast<size_t>(n) * isz) != 0) return false;
  }
  return true;
}

bool TensorPlan::IsWholeContiguousSource() const {
  if (runs_.size() != 1 || runs_[0].source < 0 || runs_[0].offset != 0) return false;
  const Source& s = (*sources_)[runs_[0].source];
  if (s.deferred) return false;
  const torch::Tensor& src = s.tensor;
  return src.is_contiguous() && src.numel() == numel_ && src.sizes() == shape_;
}

const torch::Tensor* TensorPlan::source_tensor() const {
  if (!IsWholeContiguousSource()) return nullptr;
  return &(*sources_)[runs_[0].source].tensor;
}

// Rows [start, start + length) of each of `groups` equal groups of dim 0.
absl::StatusOr<TensorPlan> GroupRows(const TensorPlan& full, int64_t groups, int64_t start, int64_t length) {
  if (full.dim() == 0) return absl::InvalidArgumentError("a scalar has no rows");
  const int64_t rows = full.shape()[0];
  if (groups == 1 && start == 0 && length == rows) return full;
  if (groups <= 0 || rows % groups != 0 || start < 0 || start + length > rows / groups) {
    return absl::InvalidArgumentError(absl::StrCat("rows [", start, ", +", length, ") of ", groups, " groups of a ",
                                                   torch::ShapeString(full.shape()), " tensor"));
  }
  std::vector<int64_t> grouped = {groups, rows / groups};
  grouped.insert(grouped.end(), full.shape().begin() + 1, full.shape().end());
  UCP_ASSIGN_OR_RETURN(TensorPlan g, full.Reshape(grouped));
  UCP_ASSIGN_OR_RETURN(TensorPlan n, g.Narrow(1, start, length));
  std::vector<int64_t> out = {groups * length};
  out.insert(out.end(), full.shape().begin() + 1, full.shape().end());
  return n.Reshape(out);
}

}  // namespace ucp::tp
