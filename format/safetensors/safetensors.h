// The safetensors format (huggingface/safetensors), written exactly as
// `safetensors.torch.save_file` writes it and read with the checks its
// reader applies (safetensors/src/tensor.rs: `Metadata::validate`):
//
//   [0, 8)        N, u64 little-endian: the header's length, padding included
//   [8, 8 + N)    the header: a compact JSON object (serde_json), first the
//                 optional "__metadata__" (a string -> string map), then one
//                 entry per tensor, {"dtype":"F32","shape":[2,3],
//                 "data_offsets":[begin,end]}, in data order; padded with
//                 spaces to a multiple of 8 so the data starts 8-aligned
//   [8 + N, EOF)  the tensors' bytes, C order, little-endian, no gaps
//
// Data order (since safetensors 0.3.0): dtype descending in the format's
// dtype enum (F64 > F32 > BF16 > F16 > ... > BOOL, so every tensor is
// aligned to its element size), ties by name ascending (byte-wise).
// Offsets are relative to the data buffer; the entries must tile it exactly.
//
// Layout() computes the whole header before any data exists (what lets a
// writer create a file at its final size and fill its tensors from several
// threads); SafetensorsFile reads a file zero-copy from a memory mapping.
//
// Example:
//   UCP_ASSIGN_OR_RETURN(FileLayout l, Layout({{"w", DType::kFloat32, {2, 3}}}, {{"format", "pt"}}));
//   UCP_RETURN_IF_ERROR(CreateFile(path, l));
//   UCP_RETURN_IF_ERROR(WriteTensor(path, l, 0, viewer));
//   UCP_ASSIGN_OR_RETURN(auto f, SafetensorsFile::Open(path));
//   UCP_ASSIGN_OR_RETURN(torch::Tensor w, f->GetTensor("w"));
#ifndef UCP_FORMAT_SAFETENSORS_SAFETENSORS_H_
#define UCP_FORMAT_SAFETENSORS_SAFETENSORS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "format/torch/dtype.h"
#include "format/torch/mapped_file.h"
#include "format/torch/tensor.h"

namespace ucp::safetensors {

// The reference reader's cap on N.
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;
inline constexpr size_t kMaxDims = 64;

// "F32", "BF16", ... (kUnimplemented for a dtype safetensors lacks, e.g. complex128).
absl::StatusOr<std::string> DTypeString(torch::DType dtype);
absl::StatusOr<torch::DType> DTypeFromString(absl::string_view s);

struct TensorSpec {
  std::string name;
  torch::DType dtype = torch::DType::kFloat32;
  std::vector<int64_t> shape;
};

struct PlacedTensor {
  TensorSpec spec;
  uint64_t begin = 0;  // data_offsets, relative to the data buffer
  uint64_t end = 0;
};

struct FileLayout {
  std::string header;                // the first 8 + N bytes of the file
  std::vector<PlacedTensor> tensors;  // in data order
  uint64_t file_size = 0;
  uint64_t data_start() const { return header.size(); }
  // Index into `tensors` of `name`, or -1.
  int Find(absl::string_view name) const;
};

// The layout of a file holding `tensors` (any order) and `metadata` (written
// in the given order; safetensors' own writer emits a hash map's order, so
// only a single key, like {"format": "pt"}, is reproducible byte for byte).
// kInvalidArgument for duplicate or reserved names ("__metadata__"),
// negative dims, too many dims, sizes that overflow, or a header over the cap.
absl::StatusOr<FileLayout> Layout(std::vector<TensorSpec> tensors,
                                  const std::vector<std::pair<std::string, std::string>>& metadata);

// Returns bytes [offset, offset + len) of one tensor's data, either as a view
// of memory valid until the next call (e.g. a memory-mapped source) or after
// filling `scratch` (len bytes); called with adjacent ranges in order.
using TensorBytes =
    std::function<absl::StatusOr<absl::Span<const uint8_t>>(uint64_t offset, size_t len, uint8_t* scratch)>;

// Creates `path` with the header written and the file extended to its full
// size (the tensor bytes still zero).
absl::Status CreateFile(const std::string& path, const FileLayout& layout);
// Writes tensor `index` of `layout` into `path` (made by CreateFile) at its
// offset with pwrite, `chunk_bytes` at a time; safe from several threads for
// different tensors. With `writeback`, the writeback of what it wrote is
// started (sync_file_range SYNC_FILE_RANGE_WRITE) every kWritebackBytes and
// at the end, so that the disk works while the rest is produced and the
// fsync before the commit finds little left to write.
absl::Status WriteTensor(const std::string& path, const FileLayout& layout, size_t index, const TensorBytes& bytes,
                         size_t chunk_bytes = size_t{4} << 20, bool writeback = false);
inline constexpr uint64_t kWritebackBytes = uint64_t{32} << 20;

// A safetensors file opened read-only: every check of the reference reader
// (header length and cap, UTF-8 JSON object without duplicate keys, known
// dtypes, offsets tiling the buffer exactly, numel * itemsize equal to each
// entry's extent, checked arithmetic) is done in Open.
class SafetensorsFile {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> FromBytes(std::string bytes, const std::string& name);

  const std::string& path() const { return path_; }
  uint64_t header_size() const { return header_size_; }  // N
  // Tensors in data order.
  const std::vector<PlacedTensor>& tensors() const { return tensors_; }
  // Header entry order (names), as written.
  const std::vector<std::string>& header_order() const { return header_order_; }
  const std::vector<std::pair<std::string, std::string>>& metadata() const { return metadata_; }
  bool has_metadata() const { return has_metadata_; }
  // A zero-copy view of a tensor (kNotFound for an unknown name).
  absl::StatusOr<torch::Tensor> GetTensor(absl::string_view name) const;

 private:
  SafetensorsFile() = default;
  absl::Status Parse(absl::Span<const uint8_t> bytes);
  std::string path_;
  std::shared_ptr<const void> keep_alive_;
  const uint8_t* data_ = nullptr;  // start of the data buffer
  uint64_t header_size_ = 0;
  std::vector<PlacedTensor> tensors_;
  std::vector<std::string> header_order_;
  std::vector<std::pair<std::string, std::string>> metadata_;
  bool has_metadata_ = false;
};

}  // namespace ucp::safetensors

#endif  // UCP_FORMAT_SAFETENSORS_SAFETENSORS_H_
