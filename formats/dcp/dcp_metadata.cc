#include "formats/dcp/dcp_metadata.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/fs.h"
#include "base/status_macros.h"
#include "format/pickle/accessors.h"
#include "format/pickle/reader.h"
#include "format/pickle/unsafe.h"

namespace ucp::dcp {
namespace {

using pickle::Kind;
using pickle::Value;

constexpr char kMetadataModule[] = "torch.distributed.checkpoint.metadata";
constexpr char kFilesystemModule[] = "torch.distributed.checkpoint.filesystem";
// Largest `.metadata` read (torch's for a 70B model with thousands of
// chunks is a few MB).
constexpr int64_t kMaxMetadataBytes = int64_t{1} << 30;

absl::Status Bad(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

// A dataclass as pickle stores it: cls.__new__(cls) then BUILD(state); the
// state, or null when there was no BUILD (an empty dataclass).
absl::StatusOr<const Value*> DataclassState(const Value& v, const char* module, const char* name,
                                            const std::string& path, const std::string& where) {
  if (!v.IsObjectOf(module, name)) {
    return Bad(path, absl::StrCat(where, ": expected a ", module, ".", name, ", found ", v.DebugString(120)));
  }
  return v.object().state.get();
}

// A field of a dataclass state dict (BUILD with a dict, or with the
// (dict, slots) pair of a class with __slots__).
const Value* Field(const Value* state, const char* key) {
  if (state == nullptr) return nullptr;
  if (state->is(Kind::kTuple) && state->items().size() == 2 && state->items()[0]->is(Kind::kDict)) {
    return state->items()[0]->DictGet(key);
  }
  return state->is(Kind::kDict) ? state->DictGet(key) : nullptr;
}

absl::StatusOr<const Value*> RequiredField(const Value* state, const char* key, const std::string& path,
                                           const std::string& where) {
  const Value* f = Field(state, key);
  if (f == nullptr) return Bad(path, absl::StrCat(where, ": no '", key, "' field"));
  return f;
}

absl::StatusOr<std::vector<int64_t>> Size(const Value& v, const std::string& path, const std::string& what) {
  absl::StatusOr<std::vector<int64_t>> s = pickle::AsTorchSize(v, what);
  if (!s.ok()) return Bad(path, std::string(s.status().message()));
  for (int64_t d : *s) {
    if (d < 0) return Bad(path, absl::StrCat(what, " has a negative size ", d));
  }
  return s;
}

// TensorProperties: torch >= 2.2 pickles the tuple of its __getstate__
// (dtype, layout, requires_grad, memory_format, pin_memory); earlier ones
// the dataclass dict.
absl::StatusOr<torch::DType> PropertiesDType(const Value& v, const std::string& path, const std::string& key) {
  const std::string where = absl::StrCat("entry '", key, "' properties");
  UCP_ASSIGN_OR_RETURN(const Value* state, DataclassState(v, kMetadataModule, "TensorProperties", path, where));
  const Value* dtype = nullptr;
  const Value* layout = nullptr;
  if (state != nullptr && state->is(Kind::kTuple) && !state->items().empty()) {
    dtype = state->items()[0].get();
    if (state->items().size() > 1) layout = state->items()[1].get();
  } else {
    dtype = Field(state, "dtype");
    layout = Field(state, "layout");
  }
  if (dtype == nullptr || !dtype->is(Kind::kGlobal) || dtype->module() != "torch") {
    return Bad(path, absl::StrCat(where, ": no dtype (a torch.<dtype> global), found ",
                                  state != nullptr ? state->DebugString(120) : std::string("nothing")));
  }
  // The layout: _get_layout('torch.strided'), or the torch.strided global.
  if (layout != nullptr && !layout->is_none()) {
    std::string name;
    if (layout->is(Kind::kGlobal)) {
      name = absl::StrCat(layout->module(), ".", layout->name());
    } else if (layout->IsObjectOf("torch.serialization", "_get_layout") && layout->object().args->items().size() == 1 &&
               layout->object().args->items()[0]->is(Kind::kStr)) {
      name = layout->object().args->items()[0]->str();
    }
    if (name != "torch.strided") {
      return absl::UnimplementedError(absl::StrCat(path, ": ", where, ": layout ", layout->DebugString(80),
                                                   " (ucp reads dense tensors, torch.strided)"));
    }
  }
  absl::StatusOr<torch::DType> d = torch::ParseDType(dtype->name());
  if (!d.ok()) return absl::UnimplementedError(absl::StrCat(path, ": ", where, ": dtype torch.", dtype->name(),
                                                            " is not one ucp reads"));
  return *d;
}

std::string Coords(const std::vector<int64_t>& v) { return absl::StrCat("(", absl::StrJoin(v, ", "), ")"); }


// A relative path inside the folder: no absolute path, no '..'.
absl::Status CheckRelative(const std::string& file, const std::string& path) {
  if (file.empty() || file[0] == '/' || file.find('\0') != std::string::npos) {
    return Bad(path, absl::StrCat("storage file '", file, "' is not a path inside the folder"));
  }
  size_t start = 0;
  while (start <= file.size()) {
    size_t slash = file.find('/', start);
    if (slash == std::string::npos) slash = file.size();
    if (file.compare(start, slash - start, "..") == 0 && slash - start == 2) {
      return Bad(path, absl::StrCat("storage file '", file, "' leaves the folder"));
    }
    start = slash + 1;
  }
  return absl::OkStatus();
}

absl::StatusOr<DcpStorage> ParseStorageInfo(const Value& v, const std::string& path, const std::string& key) {
  const std::string where = absl::StrCat("storage of '", key, "'");
  UCP_ASSIGN_OR_RETURN(const Value* state, DataclassState(v, kFilesystemModule, "_StorageInfo", path, where));
  DcpStorage s;
  UCP_ASSIGN_OR_RETURN(const Value* rel, RequiredField(state, "relative_path", path, where));
  UCP_ASSIGN_OR_RETURN(const Value* off, RequiredField(state, "offset", path, where));
  UCP_ASSIGN_OR_RETURN(const Value* len, RequiredField(state, "length", path, where));
  if (!rel->is(Kind::kStr) || !off->is(Kind::kInt) || !len->is(Kind::kInt) || !off->fits_int64() ||
      !len->fits_int64() || off->int_value() < 0 || len->int_value() < 0) {
    return Bad(path, absl::StrCat(where, ": expected relative_path (str), offset and length (ints >= 0), found ",
                                  state->DebugString(160)));
  }
  if (const Value* t = Field(state, "transform_descriptors"); t != nullptr && !t->is_none() && t->size() > 0) {
    return absl::UnimplementedError(absl::StrCat(path, ": ", where, " is stored through transforms ",
                                                 t->DebugString(80),
                                                 " (a DCP stream extension such as compression): ucp reads plain "
                                                 "items (save without extensions)"));
  }
  s.file = rel->str();
  s.offset = off->int_value();
  s.length = len->int_value();
  UCP_RETURN_IF_ERROR(CheckRelative(s.file, path));
  return s;
}

// The key of storage_data: MetadataIndex(fqn, offset) -> "fqn@(offsets)" or
// "fqn" for a bytes entry.
absl::StatusOr<std::string> IndexKey(const Value& v, const std::string& path) {
  UCP_ASSIGN_OR_RETURN(const Value* state, DataclassState(v, kMetadataModule, "MetadataIndex", path, "storage key"));
  UCP_ASSIGN_OR_RETURN(const Value* fqn, RequiredField(state, "fqn", path, "storage key"));
  if (!fqn->is(Kind::kStr)) return Bad(path, absl::StrCat("storage key fqn ", fqn->DebugString(80), " is not a str"));
  const Value* offset = Field(state, "offset");
  if (offset == nullptr || offset->is_none()) return fqn->str();
  UCP_ASSIGN_OR_RETURN(std::vector<int64_t> o, Size(*offset, path, absl::StrCat("storage key of '", fqn->str(), "'")));
  return absl::StrCat(fqn->str(), "@", Coords(o));
}

absl::StatusOr<DcpEntry> ParseEntry(const std::string& key, const Value& v, const std::string& path) {
  DcpEntry e;
  e.key = key;
  if (v.IsObjectOf(kMetadataModule, "BytesStorageMetadata")) return e;
  const std::string where = absl::StrCat("entry '", key, "'");
  UCP_ASSIGN_OR_RETURN(const Value* state, DataclassState(v, kMetadataModule, "TensorStorageMetadata", path, where));
  e.tensor = true;
  UCP_ASSIGN_OR_RETURN(const Value* props, RequiredField(state, "properties", path, where));
  UCP_ASSIGN_OR_RETURN(e.dtype, PropertiesDType(*props, path, key));
  UCP_ASSIGN_OR_RETURN(const Value* size, RequiredField(state, "size", path, where));
  UCP_ASSIGN_OR_RETURN(e.size, Size(*size, path, absl::StrCat(where, " size")));
  UCP_ASSIGN_OR_RETURN(const Value* chunks, RequiredField(state, "chunks", path, where));
  if (!chunks->is(Kind::kList) && !chunks->is(Kind::kTuple)) {
    return Bad(path, absl::StrCat(where, ": chunks is ", chunks->DebugString(80), ", not a list"));
  }
  for (const pickle::ValuePtr& c : chunks->items()) {
    UCP_ASSIGN_OR_RETURN(const Value* cs,
                         DataclassState(*c, kMetadataModule, "ChunkStorageMetadata", path, where + " chunk"));
    DcpChunk chunk;
    UCP_ASSIGN_OR_RETURN(const Value* off, RequiredField(cs, "offsets", path, where + " chunk"));
    UCP_ASSIGN_OR_RETURN(const Value* sz, RequiredField(cs, "sizes", path, where + " chunk"));
    UCP_ASSIGN_OR_RETURN(chunk.offsets, Size(*off, path, where + " chunk offsets"));
    UCP_ASSIGN_OR_RETURN(chunk.sizes, Size(*sz, path, where + " chunk sizes"));
    e.chunks.push_back(std::move(chunk));
  }
  UCP_RETURN_IF_ERROR(CheckTiling(e, path));
  return e;
}

}  // namespace

absl::Status CheckTiling(const DcpEntry& e, const std::string& path) {
  int64_t total = 1;
  for (int64_t d : e.size) total *= d;
  int64_t sum = 0;
  for (const DcpChunk& c : e.chunks) {
    if (c.offsets.size() != e.size.size() || c.sizes.size() != e.size.size()) {
      return Bad(path, absl::StrCat("entry '", e.key, "': a chunk at ", Coords(c.offsets), " of size ",
                                    Coords(c.sizes), " has not the tensor's ", e.size.size(), " dims"));
    }
    int64_t n = 1;
    for (size_t d = 0; d < e.size.size(); ++d) {
      if (c.offsets[d] < 0 || c.offsets[d] > e.size[d] || c.sizes[d] > e.size[d] - c.offsets[d]) {
        return Bad(path, absl::StrCat("entry '", e.key, "': the chunk at ", Coords(c.offsets), " of size ",
                                      Coords(c.sizes), " is not inside the tensor of size ", Coords(e.size)));
      }
      n *= c.sizes[d];
    }
    sum += n;
  }
  // Overlaps: a sweep along dim 0 (chunks in order of their start there),
  // each chunk compared with the chunks whose dim-0 range it starts inside;
  // every pair of chunks that overlaps is among them. Chunks of no elements
  // overlap nothing.
  const size_t dims = e.size.size();
  auto begin0 = [&](const DcpChunk& c) { return dims == 0 ? int64_t{0} : c.offsets[0]; };
  auto end0 = [&](const DcpChunk& c) { return dims == 0 ? int64_t{1} : c.offsets[0] + c.sizes[0]; };
  std::vector<size_t> order;
  for (size_t i = 0; i < e.chunks.size(); ++i) {
    bool empty = false;
    for (int64_t n : e.chunks[i].sizes) empty = empty || n == 0;
    if (!empty) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return begin0(e.chunks[a]) < begin0(e.chunks[b]); });
  std::vector<size_t> active;  // chunks whose dim-0 range reaches the current start
  for (size_t j : order) {
    const DcpChunk& b = e.chunks[j];
    active.erase(std::remove_if(active.begin(), active.end(),
                                [&](size_t i) { return end0(e.chunks[i]) <= begin0(b); }),
                 active.end());
    for (size_t i : active) {
      const DcpChunk& a = e.chunks[i];
      bool overlap = true;
      for (size_t d = 1; d < dims && overlap; ++d) {
        overlap = a.offsets[d] < b.offsets[d] + b.sizes[d] && b.offsets[d] < a.offsets[d] + a.sizes[d];
      }
      if (overlap) {
        return Bad(path, absl::StrCat("entry '", e.key, "': chunks at ", Coords(a.offsets), " and ",
                                      Coords(b.offsets), " overlap"));
      }
    }
    active.push_back(j);
  }
  if (sum != total) {
    return Bad(path, absl::StrCat("entry '", e.key, "': its chunks hold ", sum, " elements, the tensor of size ",
                                  Coords(e.size), " has ", total, " (a chunk is missing)"));
  }
  return absl::OkStatus();
}

const DcpEntry* DcpMetadata::Find(const std::string& key) const {
  auto it = index.find(key);
  return it == index.end() ? nullptr : &entries[it->second];
}

std::vector<std::string> DcpMetadata::Files() const {
  std::set<std::string> files;
  for (const DcpEntry& e : entries) {
    if (!e.tensor) files.insert(e.bytes.file);
    for (const DcpChunk& c : e.chunks) files.insert(c.storage.file);
  }
  return {files.begin(), files.end()};
}

absl::StatusOr<DcpMetadata> ParseMetadata(const pickle::Value& root, const std::string& path) {
  UCP_ASSIGN_OR_RETURN(const Value* state, DataclassState(root, kMetadataModule, "Metadata", path, "the root"));
  UCP_ASSIGN_OR_RETURN(const Value* sdm, RequiredField(state, "state_dict_metadata", path, "Metadata"));
  UCP_ASSIGN_OR_RETURN(const Value* storage, RequiredField(state, "storage_data", path, "Metadata"));
  if (!sdm->is(Kind::kDict) || !storage->is(Kind::kDict)) {
    return Bad(path, "Metadata: state_dict_metadata and storage_data must be dicts");
  }
  std::map<std::string, DcpStorage> where;
  for (const auto& [k, v] : storage->dict_items()) {
    UCP_ASSIGN_OR_RETURN(std::string key, IndexKey(*k, path));
    UCP_ASSIGN_OR_RETURN(DcpStorage s, ParseStorageInfo(*v, path, key));
    if (!where.emplace(key, std::move(s)).second) return Bad(path, absl::StrCat("storage of '", key, "' given twice"));
  }
  DcpMetadata md;
  md.path = path;
  for (const auto& [k, v] : sdm->dict_items()) {
    if (!k->is(Kind::kStr)) return Bad(path, absl::StrCat("state_dict_metadata key ", k->DebugString(80), " is not a str"));
    UCP_ASSIGN_OR_RETURN(DcpEntry e, ParseEntry(k->str(), *v, path));
    if (e.tensor) {
      for (DcpChunk& c : e.chunks) {
        const std::string key = absl::StrCat(e.key, "@", Coords(c.offsets));
        auto it = where.find(key);
        if (it == where.end()) {
          return Bad(path, absl::StrCat("entry '", e.key, "': no storage for its chunk at ", Coords(c.offsets)));
        }
        c.storage = it->second;
      }
    } else {
      auto it = where.find(e.key);
      if (it == where.end()) return Bad(path, absl::StrCat("entry '", e.key, "': no storage for it"));
      e.bytes = it->second;
    }
    md.index.emplace(e.key, static_cast<int>(md.entries.size()));
    md.entries.push_back(std::move(e));
  }
  return md;
}

absl::StatusOr<DcpMetadata> ReadMetadata(const std::string& dir) {
  const std::string path = JoinPath(dir, ".metadata");
  UCP_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(path, kMaxMetadataBytes));
  std::set<std::pair<std::string, std::string>> globals;
  pickle::ReadOptions options;
  options.globals = &globals;
  absl::StatusOr<pickle::ValuePtr> root = pickle::Unpickle(bytes, options);
  if (!root.ok()) {
    return absl::Status(root.status().code(), absl::StrCat(path, ": not a readable pickle: ", root.status().message()));
  }
  std::vector<std::string> unsafe;
  for (const auto& [module, name] : globals) {
    if (pickle::IsUnsafeGlobal(module, name)) unsafe.push_back(absl::StrCat(module, ".", name));
  }
  if (!unsafe.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": UNSAFE pickle: it names ", absl::StrJoin(unsafe, ", "),
        " (code that pickle.load would run); a DCP .metadata names only torch's dataclasses: refused"));
  }
  return ParseMetadata(**root, path);
}

}  // namespace ucp::dcp
