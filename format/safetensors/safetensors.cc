#include "format/safetensors/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <set>

#include "absl/strings/str_cat.h"
#include "base/flusher.h"
#include "format/json/json.h"
#include "format/torch/read_coverage.h"

namespace ucp::safetensors {
namespace {

using torch::DType;

struct DTypeName {
  DType dtype;
  const char* name;
  int rank;  // position in safetensors' Dtype enum (only the order matters)
};
// safetensors' enum, ascending: BOOL, F4, F6_E2M3, F6_E3M2, U8, I8, F8_E5M2,
// F8_E4M3, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ, I16, U16, F16, BF16, I32, U32,
// F32, C64, F64, I64, U64 (ranks below are those positions).
constexpr DTypeName kDTypes[] = {
    {DType::kBool, "BOOL", 0},      {DType::kUInt8, "U8", 4},     {DType::kInt8, "I8", 5},
    {DType::kInt16, "I16", 11},     {DType::kFloat16, "F16", 13}, {DType::kBFloat16, "BF16", 14},
    {DType::kInt32, "I32", 15},     {DType::kFloat32, "F32", 17}, {DType::kComplex64, "C64", 18},
    {DType::kFloat64, "F64", 19},   {DType::kInt64, "I64", 20},
};

int Rank(DType d) {
  for (const auto& e : kDTypes) {
    if (e.dtype == d) return e.rank;
  }
  return -1;
}

// numel * itemsize with overflow checks; false on overflow or a negative dim.
bool CheckedBytes(const std::vector<int64_t>& shape, DType dtype, uint64_t* out) {
  unsigned __int128 n = torch::ItemSize(dtype);
  for (int64_t d : shape) {
    if (d < 0) return false;
    n *= static_cast<uint64_t>(d);
    if (n > (static_cast<unsigned __int128>(1) << 62)) return false;
  }
  *out = static_cast<uint64_t>(n);
  return true;
}

std::string ShapeStr(const std::vector<int64_t>& s) { return torch::ShapeString(s); }

}  // namespace

absl::StatusOr<std::string> DTypeString(DType dtype) {
  for (const auto& e : kDTypes) {
    if (e.dtype == dtype) return std::string(e.name);
  }
  return absl::UnimplementedError(
      absl::StrCat("safetensors has no dtype for ", std::string(torch::DTypeName(dtype))));
}

absl::StatusOr<DType> DTypeFromString(absl::string_view s) {
  for (const auto& e : kDTypes) {
    if (s == e.name) return e.dtype;
  }
  return absl::UnimplementedError(absl::StrCat("safetensors dtype \"", std::string(s), "\" is not supported by ucp"));
}

int FileLayout::Find(absl::string_view name) const {
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].spec.name == name) return static_cast<int>(i);
  }
  return -1;
}

absl::StatusOr<FileLayout> Layout(std::vector<TensorSpec> tensors,
                                  const std::vector<std::pair<std::string, std::string>>& metadata) {
  std::set<std::string> names;
  for (const TensorSpec& t : tensors) {
    if (t.name == "__metadata__") {
      return absl::InvalidArgumentError("a tensor cannot be named \"__metadata__\" in a safetensors file");
    }
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", t.name, "\" appears twice"));
    }
    if (Rank(t.dtype) < 0) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", t.name, "\": safetensors has no dtype for ",
                                                     std::string(torch::DTypeName(t.dtype))));
    }
    if (t.shape.size() > kMaxDims) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", t.name, "\" has ", t.shape.size(), " dims"));
    }
  }
  std::stable_sort(tensors.begin(), tensors.end(), [](const TensorSpec& a, const TensorSpec& b) {
    const int ra = Rank(a.dtype), rb = Rank(b.dtype);
    if (ra != rb) return ra > rb;
    return a.name < b.name;
  });
  FileLayout out;
  json::Value header = json::Value::Object();
  if (!metadata.empty()) {
    json::Value m = json::Value::Object();
    for (const auto& [k, v] : metadata) m.Set(k, json::Value::String(v));
    header.Set("__metadata__", std::move(m));
  }
  uint64_t offset = 0;
  for (TensorSpec& t : tensors) {
    uint64_t nbytes = 0;
    if (!CheckedBytes(t.shape, t.dtype, &nbytes) || offset + nbytes < offset) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", t.name, "\": shape ", ShapeStr(t.shape), " is negative or too large"));
    }
    json::Value e = json::Value::Object();
    e.Set("dtype", json::Value::String(*DTypeString(t.dtype)));
    json::Value shape = json::Value::Array();
    for (int64_t d : t.shape) shape.mutable_items().push_back(json::Value::Int(d));
    e.Set("shape", std::move(shape));
    e.Set("data_offsets", json::Value::Array({json::Value::Int(static_cast<int64_t>(offset)),
                                              json::Value::Int(static_cast<int64_t>(offset + nbytes))}));
    header.Set(t.name, std::move(e));
    out.tensors.push_back({std::move(t), offset, offset + nbytes});
    offset += nbytes;
  }
  std::string text = json::DumpCompact(header);
  text.append((8 - text.size() % 8) % 8, ' ');
  if (text.size() > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors header of ", text.size(), " bytes exceeds the readers' cap of ", kMaxHeaderBytes));
  }
  const uint64_t n = text.size();
  out.header.resize(8);
  for (int k = 0; k < 8; ++k) out.header[k] = static_cast<char>((n >> (8 * k)) & 0xFF);
  out.header += text;
  out.file_size = out.header.size() + offset;
  return out;
}

namespace {

absl::Status Errno(const std::string& path, const char* what) {
  const int e = errno;
  return absl::Status(absl::ErrnoToStatusCode(e), absl::StrCat(path, ": ", what, ": ", std::strerror(e)));
}

}  // namespace

absl::Status CreateFile(const std::string& path, const FileLayout& layout) {
  if (torch::MappedFile::IsMappedByThisProcess(path)) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": is being read; refusing to overwrite it"));
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno(path, "open");
  absl::Status st = torch::MappedFile::PWriteAll(
      fd, path, {reinterpret_cast<const uint8_t*>(layout.header.data()), layout.header.size()}, 0);
  if (st.ok() && ::ftruncate(fd, static_cast<off_t>(layout.file_size)) != 0) st = Errno(path, "ftruncate");
  if (::close(fd) != 0 && st.ok()) st = Errno(path, "close");
  return st;
}

absl::Status WriteTensor(const std::string& path, const FileLayout& layout, size_t index, const TensorBytes& bytes,
                         size_t chunk_bytes, bool writeback) {
  if (index >= layout.tensors.size()) return absl::OutOfRangeError(absl::StrCat("no tensor ", index));
  const PlacedTensor& t = layout.tensors[index];
  const size_t isz = torch::ItemSize(t.spec.dtype);
  chunk_bytes = std::max(isz, chunk_bytes / isz * isz);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return Errno(path, "open");
  // Scratch for producers that gather (a tp merge): left uninitialized, the
  // producer fills what it returns.
  const size_t buf_size = static_cast<size_t>(std::min<uint64_t>(chunk_bytes, t.end - t.begin));
  std::unique_ptr<uint8_t[]> buf(new uint8_t[std::max<size_t>(1, buf_size)]);
  absl::Status st;
  const uint64_t base = layout.data_start() + t.begin;
  uint64_t written_back = 0;  // bytes of the tensor whose writeback was started
  for (uint64_t off = 0; st.ok() && off < t.end - t.begin; off += buf_size) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buf_size, t.end - t.begin - off));
    auto view = bytes(off, n, buf.get());
    if (!view.ok()) {
      st = view.status();
    } else if (view->size() != n) {
      st = absl::InternalError(absl::StrCat("a producer returned ", view->size(), " bytes for ", n));
    } else {
      // Threads writing tensors of one file take turns (see FileWriteTurn)
      // while their producers run in parallel.
      // The bytes of an input record checked from what is read
      // (torch::DeferredCrcChecks): their CRC-32 is its check.
      torch::ReadCoverage::NoteCopy(view->data(), view->data(), n);
      std::lock_guard<std::mutex> turn(FileWriteTurn(path));
      st = torch::MappedFile::WriteAt(fd, path, *view, base + off);
      if (st.ok() && writeback && off + n >= written_back + kWritebackBytes) {
        StartWriteback(fd, path, base + written_back, off + n - written_back);
        written_back = off + n;
      }
    }
  }
  if (st.ok() && writeback && written_back < t.end - t.begin) {
    StartWriteback(fd, path, base + written_back, t.end - t.begin - written_back);
  }
  if (::close(fd) != 0 && st.ok()) st = Errno(path, "close");
  if (!st.ok()) return absl::Status(st.code(), absl::StrCat(path, ": tensor \"", t.spec.name, "\": ", st.message()));
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Reading.

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  auto mapped = torch::MappedFile::Open(path);
  if (!mapped.ok()) return mapped.status();
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->keep_alive_ = *mapped;
  absl::Status st = f->Parse((*mapped)->bytes());
  if (!st.ok()) return absl::Status(st.code(), absl::StrCat(path, ": ", st.message()));
  return f;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::FromBytes(std::string bytes, const std::string& name) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = name;
  auto owned = std::make_shared<std::string>(std::move(bytes));
  f->keep_alive_ = owned;
  absl::Status st =
      f->Parse(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(owned->data()), owned->size()));
  if (!st.ok()) return absl::Status(st.code(), absl::StrCat(name, ": ", st.message()));
  return f;
}

absl::Status SafetensorsFile::Parse(absl::Span<const uint8_t> bytes) {
  if (bytes.size() < 8) return absl::DataLossError(absl::StrCat("file of ", bytes.size(), " bytes has no header"));
  uint64_t n = 0;
  for (int k = 0; k < 8; ++k) n |= static_cast<uint64_t>(bytes[k]) << (8 * k);
  if (n > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat("header length ", n, " exceeds the cap of ", kMaxHeaderBytes));
  }
  if (n > bytes.size() - 8) {
    return absl::DataLossError(absl::StrCat("header length ", n, " runs past the end of the file (",
                                            bytes.size(), " bytes)"));
  }
  header_size_ = n;
  const absl::string_view text(reinterpret_cast<const char*>(bytes.data() + 8), n);
  if (text.empty() || text[0] != '{') return absl::InvalidArgumentError("header does not start with '{'");
  // The reference reader parses the whole N bytes; trailing spaces are JSON
  // whitespace.
  auto root = json::Parse(std::string_view(text.data(), text.size()));
  if (!root.ok()) return absl::InvalidArgumentError(absl::StrCat("header: ", root.status().message()));
  if (root->type() != json::Value::Type::kObject) return absl::InvalidArgumentError("header is not a JSON object");
  const uint64_t buffer = bytes.size() - 8 - n;
  data_ = bytes.data() + 8 + n;
  for (const auto& [key, v] : root->members()) {
    if (key == "__metadata__") {
      if (v.type() != json::Value::Type::kObject) return absl::InvalidArgumentError("__metadata__ is not an object");
      has_metadata_ = true;
      for (const auto& [mk, mv] : v.members()) {
        if (mv.type() != json::Value::Type::kString) {
          return absl::InvalidArgumentError(absl::StrCat("__metadata__[\"", mk, "\"] is not a string"));
        }
        metadata_.emplace_back(mk, mv.string_value());
      }
      continue;
    }
    auto bad = [&](const std::string& what) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", key, "\": ", what));
    };
    if (v.type() != json::Value::Type::kObject) return bad("entry is not an object");
    const json::Value* dt = v.Get("dtype");
    const json::Value* shape = v.Get("shape");
    const json::Value* offs = v.Get("data_offsets");
    if (!dt || dt->type() != json::Value::Type::kString) return bad("no dtype string");
    if (!shape || shape->type() != json::Value::Type::kArray) return bad("no shape list");
    if (!offs || offs->type() != json::Value::Type::kArray || offs->items().size() != 2) {
      return bad("data_offsets is not a pair");
    }
    if (v.members().size() != 3) return bad("unexpected fields besides dtype, shape, data_offsets");
    PlacedTensor t;
    t.spec.name = key;
    auto dtype = DTypeFromString(dt->string_value());
    if (!dtype.ok()) return bad(std::string(dtype.status().message()));
    t.spec.dtype = *dtype;
    if (shape->items().size() > kMaxDims) return bad("too many dims");
    for (const json::Value& d : shape->items()) {
      if (d.type() != json::Value::Type::kInt || d.int_value() < 0) return bad("shape has a non-integer or negative dim");
      t.spec.shape.push_back(d.int_value());
    }
    for (const json::Value& o : offs->items()) {
      if (o.type() != json::Value::Type::kInt || o.int_value() < 0) return bad("data_offsets are not non-negative ints");
    }
    t.begin = static_cast<uint64_t>(offs->items()[0].int_value());
    t.end = static_cast<uint64_t>(offs->items()[1].int_value());
    uint64_t nbytes = 0;
    if (!CheckedBytes(t.spec.shape, t.spec.dtype, &nbytes)) return bad("shape overflows");
    if (t.end < t.begin || t.end - t.begin != nbytes) {
      return bad(absl::StrCat("data_offsets [", t.begin, ", ", t.end, ") hold ", t.end - t.begin, " bytes, shape ",
                              ShapeStr(t.spec.shape), " needs ", nbytes));
    }
    header_order_.push_back(key);
    tensors_.push_back(std::move(t));
  }
  std::stable_sort(tensors_.begin(), tensors_.end(),
                   [](const PlacedTensor& a, const PlacedTensor& b) { return a.begin < b.begin || (a.begin == b.begin && a.end < b.end); });
  uint64_t at = 0;
  for (const PlacedTensor& t : tensors_) {
    if (t.begin != at) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", t.spec.name, "\" starts at ", t.begin,
                                                     ", expected ", at, " (the entries must tile the buffer)"));
    }
    at = t.end;
  }
  if (at != buffer) {
    return absl::DataLossError(absl::StrCat("tensors cover ", at, " bytes of a ", buffer, "-byte data buffer"));
  }
  return absl::OkStatus();
}

absl::StatusOr<torch::Tensor> SafetensorsFile::GetTensor(absl::string_view name) const {
  for (const PlacedTensor& t : tensors_) {
    if (t.spec.name != name) continue;
    auto storage = torch::Storage::Borrowed(t.spec.dtype, data_ + t.begin, t.end - t.begin, keep_alive_);
    std::vector<int64_t> strides(t.spec.shape.size());
    int64_t s = 1;
    for (size_t k = t.spec.shape.size(); k-- > 0;) {
      strides[k] = s;
      s *= t.spec.shape[k];
    }
    return torch::Tensor::Make(storage, 0, t.spec.shape, strides);
  }
  return absl::NotFoundError(absl::StrCat(path_, ": no tensor \"", std::string(name), "\""));
}

}  // namespace ucp::safetensors
