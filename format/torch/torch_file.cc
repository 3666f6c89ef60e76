#include "format/torch/torch_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <iterator>
#include <set>
#include <string>
#include <vector>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/parallel.h"
#include "base/digest.h"
#include "base/flusher.h"
#include "base/phases.h"
#include "base/status_macros.h"
#include "format/pickle/reader.h"
#include "format/pickle/unsafe.h"
#include "format/pickle/writer.h"
#include "format/torch/crc32.h"
#include "format/torch/mapped_file.h"
#include "format/torch/read_coverage.h"
#include "format/torch/zip.h"

namespace ucp::torch {
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

// The pickle record torch writes and the versions torch 1.13 reads
// (caffe2/serialize/inline_container.h: kMinSupportedFileFormatVersion to
// kMaxSupportedFileFormatVersion).
constexpr int64_t kMinFileFormatVersion = 1;
constexpr int64_t kMaxFileFormatVersion = 10;
constexpr char kWrittenVersion[] = "3\n";

bool IsRebuildTensor(const Value& v) { return v.IsObjectOf("torch._utils", "_rebuild_tensor_v2"); }
bool IsRebuildParameter(const Value& v) { return v.IsObjectOf("torch._utils", "_rebuild_parameter"); }
// torch >= 2: a tensor with Python attributes (DeepSpeed's ZeRO-3
// fp32_flat_groups carry `ds_id`) or of a subclass pickles as
// _rebuild_from_type_v2(_rebuild_tensor_v2, torch.Tensor, (args...), {attrs}).
bool IsRebuildFromType(const Value& v) {
  if (!v.IsObjectOf("torch._tensor", "_rebuild_from_type_v2")) return false;
  const Value* args = v.object().args.get();
  if (args == nullptr || !args->is(Kind::kTuple) || args->items().size() != 4) return false;
  const auto& a = args->items();
  return a[0] != nullptr && a[0]->is(Kind::kGlobal) && a[0]->module() == "torch._utils" &&
         a[0]->name() == "_rebuild_tensor_v2" && a[1] != nullptr && a[1]->is(Kind::kGlobal) &&
         ((a[1]->module() == "torch" && a[1]->name() == "Tensor") ||
          (a[1]->module() == "torch.nn.parameter" && a[1]->name() == "Parameter")) &&
         a[2] != nullptr && a[2]->is(Kind::kTuple);
}

// A list/tuple of int64 (or torch.Size of one).
absl::StatusOr<std::vector<int64_t>> IntList(const Value* v, const char* what) {
  if (v != nullptr && v->is(Kind::kObject) && v->IsObjectOf("torch", "Size") && v->object().args != nullptr &&
      v->object().args->items().size() == 1) {
    v = v->object().args->items()[0].get();
  }
  if (v == nullptr || !(v->is(Kind::kTuple) || v->is(Kind::kList))) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not a tuple of ints"));
  }
  std::vector<int64_t> out;
  out.reserve(v->items().size());
  for (const ValuePtr& item : v->items()) {
    if (item == nullptr || !item->is(Kind::kInt) || !item->fits_int64()) {
      return absl::InvalidArgumentError(absl::StrCat(what, " holds a non-int64 entry"));
    }
    out.push_back(item->int_value());
  }
  return out;
}

// torch's basename() in caffe2/serialize/inline_container.cc: the file name
// without folders and without its last extension.
std::string ArchiveStem(const std::string& path) {
  size_t start = 0;
  for (size_t i = 0; i < path.size(); ++i) {
    if (path[i] == '/' || path[i] == '\\') start = i + 1;
  }
  if (start >= path.size()) return "";
  size_t end = path.size();
  for (size_t i = end; i > start; --i) {
    if (path[i - 1] == '.') {
      end = i - 1;
      break;
    }
  }
  return path.substr(start, end - start);
}

}  // namespace

// ---------------------------------------------------------------------------
// TorchFile

namespace internal_torch_file {
// What TorchFile keeps besides the tree (TorchFile::Impl derives from it so
// that the parsing code below can fill it).
struct State {
  std::shared_ptr<const MappedFile> mapped;
  std::shared_ptr<const std::string> owned;  // FromBytes
  uint64_t range_size = 0;                    // OpenRange
  std::optional<ZipReader> zip;
  // One Storage per record key.
  struct StorageEntry {
    std::shared_ptr<const Storage> storage;
    const ZipRecord* record;
  };
  absl::flat_hash_map<std::string, StorageEntry> by_key;
  // Every persistent id node and every rebuild object of the tree.
  absl::flat_hash_map<const Value*, std::shared_ptr<const Storage>> by_pid;
  absl::flat_hash_map<const Value*, Tensor> tensors;
  absl::flat_hash_map<const Storage*, const ZipRecord*> record_by_storage;
};
}  // namespace internal_torch_file

struct TorchFile::Impl : internal_torch_file::State {};

namespace {

// Validates the tree of one file: every persistent id against the archive,
// every tensor view against its storage. Visits each shared node once.
class TreeValidator {
 public:
  TreeValidator(const std::string& name, const std::string& stem, const ZipReader& zip,
                std::shared_ptr<const void> keep_alive, internal_torch_file::State* impl)
      : name_(name), stem_(stem), zip_(zip), keep_alive_(std::move(keep_alive)), impl_(impl) {}

  absl::Status Visit(const ValuePtr& v) {
    if (v == nullptr || !pickle::IsContainer(v->kind())) return absl::OkStatus();
    const Value& value = *v;
    if (!visited_.insert(&value).second) return absl::OkStatus();
    switch (value.kind()) {
      case Kind::kTuple:
      case Kind::kList:
      case Kind::kSet:
      case Kind::kFrozenSet:
        for (const ValuePtr& item : value.items()) UCP_RETURN_IF_ERROR(Visit(item));
        return absl::OkStatus();
      case Kind::kDict:
        for (const auto& [k, item] : value.dict_items()) {
          UCP_RETURN_IF_ERROR(Visit(k));
          UCP_RETURN_IF_ERROR(Visit(item));
        }
        return Visit(value.dict_state());
      case Kind::kPersistentId:
        return VisitPersistentId(value);
      case Kind::kObject: {
        const pickle::Object& o = value.object();
        UCP_RETURN_IF_ERROR(Visit(o.callable));
        UCP_RETURN_IF_ERROR(Visit(o.args));
        UCP_RETURN_IF_ERROR(Visit(o.kwargs));
        UCP_RETURN_IF_ERROR(Visit(o.state));
        for (const ValuePtr& item : o.list_items) UCP_RETURN_IF_ERROR(Visit(item));
        for (const auto& [k, item] : o.dict_items) {
          UCP_RETURN_IF_ERROR(Visit(k));
          UCP_RETURN_IF_ERROR(Visit(item));
        }
        if (IsRebuildTensor(value)) return VisitTensor(value, value.object().args.get());
        if (IsRebuildParameter(value)) return VisitParameter(value);
        if (IsRebuildFromType(value)) return VisitTensor(value, value.object().args->items()[2].get());
        if (value.IsObjectOf("torch._tensor", "_rebuild_from_type_v2")) {
          return Invalid(value, "_rebuild_from_type_v2 of something other than a torch.Tensor or Parameter");
        }
        return absl::OkStatus();
      }
      default:
        return absl::OkStatus();
    }
  }

 private:
  absl::Status Invalid(const Value& where, absl::string_view message) const {
    return absl::InvalidArgumentError(
        absl::StrCat(name_, ": ", message, " in ", where.DebugString(160)));
  }

  // ('storage', torch.<T>Storage, key, location, numel)
  absl::Status VisitPersistentId(const Value& pid_node) {
    const Value* pid = pid_node.pid().get();
    if (pid == nullptr || !pid->is(Kind::kTuple) || pid->items().size() != 5) {
      return Invalid(pid_node, "persistent id is not a 5-tuple ('storage', class, key, location, numel)");
    }
    const auto& f = pid->items();
    for (const ValuePtr& item : f) {
      if (item == nullptr) return Invalid(pid_node, "persistent id has a null field");
    }
    if (!(f[0]->is(Kind::kStr) || f[0]->is(Kind::kBytes)) || f[0]->str() != "storage") {
      return Invalid(pid_node, "persistent id type is not 'storage'");
    }
    if (!f[1]->is(Kind::kGlobal) || f[1]->module() != "torch") {
      return Invalid(pid_node, "persistent id storage class is not a torch global");
    }
    absl::StatusOr<DType> dtype = DTypeFromStorageClass(f[1]->name());
    if (!dtype.ok()) return Invalid(pid_node, dtype.status().message());
    if (!f[2]->is(Kind::kStr)) return Invalid(pid_node, "persistent id key is not a str");
    if (!f[3]->is(Kind::kStr)) return Invalid(pid_node, "persistent id location is not a str");
    if (!f[4]->is(Kind::kInt) || !f[4]->fits_int64() || f[4]->int_value() < 0) {
      return Invalid(pid_node, "persistent id numel is not a non-negative int64");
    }
    const std::string& key = f[2]->str();
    const int64_t numel = f[4]->int_value();
    auto it = impl_->by_key.find(key);
    if (it == impl_->by_key.end()) {
      const std::string record_name = absl::StrCat(stem_, "/data/", key);
      absl::StatusOr<const ZipRecord*> record = zip_.Get(record_name);
      if (!record.ok()) {
        return absl::DataLossError(absl::StrCat(name_, ": storage '", key, "' has no record '", record_name, "'"));
      }
      // torch writes storage.nbytes() and pickles numel = nbytes / itemsize
      // (floor: an untyped storage may hold a partial trailing element, which
      // torch.load then ignores). So the record must hold [numel * itemsize,
      // (numel + 1) * itemsize) bytes.
      const uint64_t item = ItemSize(*dtype);
      const uint64_t size = (*record)->size;
      if (size / item != static_cast<uint64_t>(numel)) {
        return absl::DataLossError(absl::StrCat(name_, ": record '", record_name, "' holds ", size,
                                                " bytes, but its persistent id says ", numel, " ",
                                                DTypeName(*dtype).data(), " elements (", item, " bytes each)"));
      }
      const uint8_t* data = zip_.Data(**record).data();
      it = impl_->by_key
               .emplace(key, internal_torch_file::State::StorageEntry{
                                 Storage::Borrowed(*dtype, data, size, keep_alive_), *record})
               .first;
      impl_->record_by_storage.emplace(it->second.storage.get(), *record);
    } else if (it->second.storage->dtype() != *dtype || it->second.storage->numel() != numel) {
      return absl::InvalidArgumentError(absl::StrCat(
          name_, ": storage '", key, "' is used as ", DTypeName(it->second.storage->dtype()).data(), "[",
          it->second.storage->numel(), "] and as ", DTypeName(*dtype).data(), "[", numel, "]"));
    }
    impl_->by_pid.emplace(&pid_node, it->second.storage);
    return absl::OkStatus();
  }

  // _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata])
  // `args`: the object's own, or the inner tuple of _rebuild_from_type_v2.
  absl::Status VisitTensor(const Value& obj, const Value* args) {
    if (args == nullptr || !args->is(Kind::kTuple) || args->items().size() < 6 || args->items().size() > 7) {
      return Invalid(obj, "_rebuild_tensor_v2 takes 6 or 7 arguments");
    }
    const auto& a = args->items();
    if (a[0] == nullptr || !a[0]->is(Kind::kPersistentId)) {
      return Invalid(obj, "_rebuild_tensor_v2's storage is not a persistent id");
    }
    auto storage = impl_->by_pid.find(a[0].get());
    if (storage == impl_->by_pid.end()) return Invalid(obj, "unvalidated storage");
    if (a[1] == nullptr || !a[1]->is(Kind::kInt) || !a[1]->fits_int64()) {
      return Invalid(obj, "_rebuild_tensor_v2's storage offset is not an int64");
    }
    absl::StatusOr<std::vector<int64_t>> sizes = IntList(a[2].get(), "size");
    if (!sizes.ok()) return Invalid(obj, sizes.status().message());
    absl::StatusOr<std::vector<int64_t>> strides = IntList(a[3].get(), "stride");
    if (!strides.ok()) return Invalid(obj, strides.status().message());
    if (a[4] == nullptr || !a[4]->is(Kind::kBool)) return Invalid(obj, "requires_grad is not a bool");
    absl::StatusOr<Tensor> t = Tensor::Make(storage->second, a[1]->int_value(), *std::move(sizes),
                                            *std::move(strides), a[4]->bool_value());
    if (!t.ok()) {
      return absl::Status(t.status().code(), absl::StrCat(name_, ": ", t.status().message(), " (storage '",
                                                          a[0]->pid()->items()[2]->str(), "')"));
    }
    impl_->tensors.emplace(&obj, *std::move(t));
    return absl::OkStatus();
  }

  // _rebuild_parameter(tensor, requires_grad, hooks)
  absl::Status VisitParameter(const Value& obj) {
    const Value* args = obj.object().args.get();
    if (args == nullptr || !args->is(Kind::kTuple) || args->items().size() != 3) {
      return Invalid(obj, "_rebuild_parameter takes 3 arguments");
    }
    const auto& a = args->items();
    auto inner = a[0] == nullptr ? impl_->tensors.end() : impl_->tensors.find(a[0].get());
    if (inner == impl_->tensors.end()) return Invalid(obj, "_rebuild_parameter's data is not a tensor");
    if (a[1] == nullptr || !a[1]->is(Kind::kBool)) return Invalid(obj, "requires_grad is not a bool");
    Tensor t = inner->second;
    absl::StatusOr<Tensor> p =
        Tensor::Make(t.storage(), t.storage_offset(), t.sizes(), t.strides(), a[1]->bool_value());
    if (!p.ok()) return p.status();
    impl_->tensors.emplace(&obj, *std::move(p));
    return absl::OkStatus();
  }

  const std::string& name_;
  const std::string& stem_;
  const ZipReader& zip_;
  std::shared_ptr<const void> keep_alive_;
  internal_torch_file::State* impl_;
  absl::flat_hash_set<const Value*> visited_;
};

absl::Status Annotate(const absl::Status& s, const std::string& prefix) {
  return absl::Status(s.code(), absl::StrCat(prefix, s.message()));
}

}  // namespace

namespace {

// Shared by Open and FromBytes once the bytes are in place.
absl::Status ParseTorchFile(const std::string& name, absl::Span<const uint8_t> bytes,
                            std::shared_ptr<const void> keep_alive, std::shared_ptr<const MappedFile> mapped,
                            const OpenOptions& options,
                            internal_torch_file::State* impl, std::string* stem, ValuePtr* root,
                            std::vector<std::string>* unsafe) {
  // Parsing touches a few scattered pages (the magic number, the central directory, each
  // record's local header, data.pkl, version): a fault in a mapping with the
  // default advice reads megabytes around it (read_ahead_kb), which for a
  // cold file whose tensors are never read (the lp weights a conversion
  // recomputes from the fp32 masters) is most of the file. MADV_RANDOM while
  // parsing reads just those pages; whatever reads the tensors afterwards
  // gets the normal read-ahead back (RestoreAdvice).
  struct RestoreAdvice {
    const MappedFile* m;
    ~RestoreAdvice() {
      if (m != nullptr) m->AdviseNormal(0, m->size());
    }
  } restore{mapped.get()};
  if (mapped != nullptr) mapped->AdviseRandom(0, mapped->size());
  // torch.save before 1.6 (or with _use_new_zipfile_serialization=False)
  // wrote a bare pickle stream starting with the protocol and a magic number.
  if (bytes.size() >= 2 && !(bytes[0] == 'P' && bytes[1] == 'K')) {
    static constexpr uint8_t kLegacyMagic[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8};
    if (bytes.size() >= sizeof(kLegacyMagic) && std::equal(std::begin(kLegacyMagic), std::end(kLegacyMagic), bytes.begin())) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": a legacy torch.save file (the pre-1.6 format, or _use_new_zipfile_serialization=False); ucp "
                "reads the zip format torch.save writes by default: re-save it with torch.save(torch.load(f), f)"));
    }
    if (bytes[0] == 0x80) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": a bare pickle stream, not a torch.save zip archive (a legacy torch.save file or pickle.dump "
                "output?)"));
    }
  }
  ZipReadOptions zip_options;
  // The CRC check (when asked for) runs right after the directory is parsed,
  // below, with the mapping's normal read-ahead.
  zip_options.crc = ZipReadOptions::Crc::kLazy;
  // A memory-mapped archive gives its pages back as the CRC check reads
  // them (at open, or when a record is checked later), so that checking
  // files never grows RSS by their size.
  if (mapped != nullptr) {
    zip_options.on_verified = [mapped](uint64_t offset, uint64_t len) { mapped->Release(offset, len); };
  }
  zip_options.keep_alive = keep_alive;
  absl::StatusOr<ZipReader> zip = ZipReader::Open(bytes, name, zip_options);
  if (!zip.ok()) return zip.status();
  impl->zip.emplace(*std::move(zip));
  const ZipReader& z = *impl->zip;
  if (options.verify_crc) {
    // Every record read whole, in order: the normal read-ahead helps.
    if (mapped != nullptr) mapped->AdviseNormal(0, mapped->size());
    UCP_RETURN_IF_ERROR(z.VerifyAllCrcs());
    if (mapped != nullptr) mapped->AdviseRandom(0, mapped->size());
  }
  if (z.records().empty()) return absl::DataLossError(absl::StrCat(name, ": archive has no records"));
  // torch takes the folder of the first record as the archive name.
  const std::string& first = z.records()[0].name;
  size_t slash = first.find('/');
  if (slash == std::string::npos) {
    return absl::DataLossError(absl::StrCat(name, ": first record '", first, "' is not in a folder"));
  }
  *stem = first.substr(0, slash);

  // version (or .data/version, as torch >= 1.?? writes for version >= 6)
  const ZipRecord* version = z.Find(absl::StrCat(*stem, "/version"));
  if (version == nullptr) version = z.Find(absl::StrCat(*stem, "/.data/version"));
  if (version == nullptr) return absl::DataLossError(absl::StrCat(name, ": no '", *stem, "/version' record"));
  absl::StatusOr<absl::Span<const uint8_t>> vbytes = z.Read(version->name);
  if (!vbytes.ok()) return vbytes.status();
  int64_t v = 0;
  size_t digits = 0;
  for (uint8_t c : *vbytes) {
    if (c >= '0' && c <= '9' && digits < 18) {
      v = v * 10 + (c - '0');
      ++digits;
    } else if (c == '\n' && digits > 0) {
      break;
    } else {
      digits = 0;
      break;
    }
  }
  if (digits == 0 || v < kMinFileFormatVersion || v > kMaxFileFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": unsupported torch file format version '",
                                                   std::string(vbytes->begin(), vbytes->end()), "'"));
  }
  if (const ZipRecord* order = z.Find(absl::StrCat(*stem, "/byteorder")); order != nullptr) {
    absl::StatusOr<absl::Span<const uint8_t>> b = z.Read(order->name);
    if (!b.ok()) return b.status();
    if (std::string(b->begin(), b->end()) != "little") {
      return absl::UnimplementedError(absl::StrCat(name, ": byte order '", std::string(b->begin(), b->end()),
                                                   "' is not supported (only little-endian)"));
    }
  }

  const std::string pkl_name = absl::StrCat(*stem, "/data.pkl");
  absl::StatusOr<const ZipRecord*> pkl = z.Get(pkl_name);
  if (!pkl.ok()) return absl::DataLossError(absl::StrCat(name, ": no '", pkl_name, "' record"));
  if ((*pkl)->size > options.max_pickle_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(name, ": ", pkl_name, " is ", (*pkl)->size,
                                                     " bytes, more than the limit of ", options.max_pickle_bytes));
  }
  absl::StatusOr<absl::Span<const uint8_t>> pkl_bytes = z.Read(pkl_name);
  if (!pkl_bytes.ok()) return pkl_bytes.status();
  std::set<std::pair<std::string, std::string>> globals;
  pickle::ReadOptions read_options = options.pickle;
  read_options.globals = &globals;
  absl::StatusOr<ValuePtr> tree = pickle::Unpickle(
      std::string_view(reinterpret_cast<const char*>(pkl_bytes->data()), pkl_bytes->size()), read_options);
  if (!tree.ok()) return Annotate(tree.status(), absl::StrCat(name, ": ", pkl_name, ": "));
  for (const auto& [module, gname] : globals) {
    if (pickle::IsUnsafeGlobal(module, gname)) unsafe->push_back(absl::StrCat(module, ".", gname));
  }
  if (!unsafe->empty() && options.refuse_unsafe_globals) {
    return absl::FailedPreconditionError(absl::StrCat(
        name, ": UNSAFE pickle: it names ", absl::StrJoin(*unsafe, ", "),
        " (code that torch.load would run when reading this file). ucp never runs it, but refuses to read or "
        "copy such a checkpoint unless --allow_unsafe_pickle is given"));
  }
  *root = *std::move(tree);
  TreeValidator validator(name, *stem, z, std::move(keep_alive), impl);
  return validator.Visit(*root);
}

}  // namespace

namespace {
thread_local OwedCrcChecks* current_owed_checks = nullptr;
}  // namespace

OwedCrcChecks::OwedCrcChecks() : previous_(current_owed_checks) { current_owed_checks = this; }
OwedCrcChecks::~OwedCrcChecks() { current_owed_checks = previous_; }
OwedCrcChecks* OwedCrcChecks::Current() { return current_owed_checks; }

void OwedCrcChecks::Add(std::function<absl::Status()> check, size_t records) {
  std::lock_guard<std::mutex> lock(mu_);
  checks_.push_back(std::move(check));
  records_ += records;
  checked_ = false;
}

absl::Status OwedCrcChecks::CheckAll() {
  std::vector<std::function<absl::Status()>> checks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    checks = checks_;
    checked_ = true;
  }
  for (const auto& check : checks) UCP_RETURN_IF_ERROR(check());
  return absl::OkStatus();
}

bool OwedCrcChecks::checked() const {
  std::lock_guard<std::mutex> lock(mu_);
  return checked_;
}

size_t OwedCrcChecks::files() const {
  std::lock_guard<std::mutex> lock(mu_);
  return checks_.size();
}

size_t OwedCrcChecks::records() const {
  std::lock_guard<std::mutex> lock(mu_);
  return records_;
}

absl::StatusOr<std::unique_ptr<TorchFile>> TorchFile::Open(const std::string& path, const OpenOptions& options) {
  absl::StatusOr<std::shared_ptr<const MappedFile>> mapped = MappedFile::Open(path);
  if (!mapped.ok()) return mapped.status();
  std::unique_ptr<TorchFile> file(new TorchFile());
  file->path_ = path;
  file->impl_ = std::make_shared<Impl>();
  file->impl_->mapped = *mapped;
  file->mapping_ = *mapped;
  OwedCrcChecks* owed = options.verify_crc && options.defer_crc ? OwedCrcChecks::Current() : nullptr;
  OpenOptions o = options;
  if (owed != nullptr) o.verify_crc = false;
  absl::Status s = ParseTorchFile(path, (*mapped)->bytes(), *mapped, *mapped, o, file->impl_.get(), &file->stem_,
                                  &file->root_, &file->unsafe_globals_);
  // Owed even when the parse failed: a damaged record is the better error.
  if (owed != nullptr && file->impl_->zip.has_value()) {
    owed->Add([impl = file->impl_] { return impl->zip->VerifyAllCrcs(); }, file->impl_->zip->records().size());
  }
  if (!s.ok()) return s;
  return file;
}

absl::StatusOr<std::unique_ptr<TorchFile>> TorchFile::FromBytes(std::string bytes, const std::string& name,
                                                                const OpenOptions& options) {
  std::unique_ptr<TorchFile> file(new TorchFile());
  file->path_ = name;
  file->impl_ = std::make_shared<Impl>();
  auto owned = std::make_shared<const std::string>(std::move(bytes));
  file->impl_->owned = owned;
  file->mapping_ = owned;
  absl::Span<const uint8_t> span(reinterpret_cast<const uint8_t*>(owned->data()), owned->size());
  absl::Status s =
      ParseTorchFile(name, span, owned, /*mapped=*/nullptr, options, file->impl_.get(), &file->stem_, &file->root_,
                     &file->unsafe_globals_);
  if (!s.ok()) return s;
  return file;
}

absl::StatusOr<std::unique_ptr<TorchFile>> TorchFile::OpenRange(std::shared_ptr<const MappedFile> mapped,
                                                                uint64_t offset, uint64_t length,
                                                                const std::string& name, const OpenOptions& options) {
  if (mapped == nullptr) return absl::InvalidArgumentError(absl::StrCat(name, ": no file"));
  if (offset > mapped->size() || length > mapped->size() - offset) {
    return absl::OutOfRangeError(absl::StrCat(name, ": bytes [", offset, ", ", offset + length, ") are not inside ",
                                              mapped->path(), " (", mapped->size(), " bytes)"));
  }
  std::unique_ptr<TorchFile> file(new TorchFile());
  file->path_ = name;
  file->impl_ = std::make_shared<Impl>();
  file->impl_->range_size = length;
  file->mapping_ = mapped;
  absl::Status s = ParseTorchFile(name, mapped->bytes().subspan(offset, length), mapped, /*mapped=*/nullptr, options,
                                  file->impl_.get(), &file->stem_, &file->root_, &file->unsafe_globals_);
  if (!s.ok()) return s;
  return file;
}

size_t TorchFile::file_size() const {
  if (impl_->mapped != nullptr) return impl_->mapped->size();
  if (impl_->owned != nullptr) return impl_->owned->size();
  return impl_->range_size;
}

bool TorchFile::IsTensor(const pickle::Value& v) {
  return IsRebuildTensor(v) || IsRebuildParameter(v) || IsRebuildFromType(v);
}

absl::StatusOr<Tensor> TorchFile::GetTensor(const pickle::Value& v) const {
  auto it = impl_->tensors.find(&v);
  if (it != impl_->tensors.end()) return it->second;
  if (!IsTensor(v)) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": not a tensor: ", v.DebugString(120)));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(path_, ": tensor value does not belong to this file's tree: ", v.DebugString(120)));
}

std::vector<std::string> TorchFile::RecordNames() const {
  std::vector<std::string> names;
  for (const ZipRecord& r : impl_->zip->records()) names.push_back(r.name);
  return names;
}

absl::StatusOr<std::shared_ptr<const Storage>> TorchFile::GetStorage(const pickle::Value& pid) const {
  auto it = impl_->by_pid.find(&pid);
  if (it == impl_->by_pid.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": not a persistent id of this file's tree: ", pid.DebugString(120)));
  }
  return it->second;
}

absl::Status TorchFile::VerifyAllCrcs() const { return impl_->zip->VerifyAllCrcs(); }

absl::Status TorchFile::VerifyStorageCrc(const Storage& storage, bool reading) const {
  auto it = impl_->record_by_storage.find(&storage);
  if (it == impl_->record_by_storage.end()) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": storage does not belong to this file"));
  }
  return impl_->zip->VerifyCrc(*it->second, reading);
}

const std::shared_ptr<const MappedFile>& TorchFile::mapped_file() const { return impl_->mapped; }

std::vector<std::shared_ptr<const Storage>> TorchFile::Storages() const {
  std::vector<std::pair<uint64_t, std::shared_ptr<const Storage>>> v;
  for (const auto& [key, entry] : impl_->by_key) v.push_back({entry.record->header_offset, entry.storage});
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::shared_ptr<const Storage>> out;
  for (auto& [offset, s] : v) out.push_back(std::move(s));
  return out;
}

// ---------------------------------------------------------------------------
// TorchWriter

namespace {

// Passes bytes on to another sink, counting them and, with a hasher, hashing
// them, except while paused: then whoever writes the bytes hashes them (in
// the same order) itself.
class HashingSink : public ZipSink {
 public:
  HashingSink(ZipSink* next, StreamDigest* sha) : next_(next), sha_(sha) {}
  absl::Status Write(absl::Span<const uint8_t> bytes) override {
    if (sha_ != nullptr && !paused_) sha_->Update(bytes.data(), bytes.size());
    count_ += bytes.size();
    return next_->Write(bytes);
  }
  absl::Status Flush() override { return next_->Flush(); }
  absl::Status Skip(uint64_t n) override {
    if (sha_ != nullptr) return absl::FailedPreconditionError("cannot hash bytes written elsewhere");
    count_ += n;
    return next_->Skip(n);
  }
  void set_paused(bool paused) { paused_ = paused; }
  StreamDigest* sha() const { return sha_; }
  uint64_t count() const { return count_; }

 private:
  ZipSink* next_;
  StreamDigest* sha_;
  bool paused_ = false;
  uint64_t count_ = 0;
};

// A buffer that grows as needed and is never zero-filled.
class GrowBuffer {
 public:
  uint8_t* Get(size_t n) {
    if (n > size_) {
      data_.reset(new uint8_t[n]);
      size_ = n;
    }
    return data_.get();
  }

 private:
  std::unique_ptr<uint8_t[]> data_;
  size_t size_ = 0;
};

}  // namespace

struct TorchWriter::Impl {
  TorchWriteOptions options;
  uint64_t last_bytes = 0;
  std::string last_digest;
  struct Entry {
    std::shared_ptr<const Storage> storage;  // or:
    StorageProducer producer;
    StorageViewer viewer;
    DType dtype;
    int64_t numel = 0;
    uint64_t nbytes = 0;
    std::vector<ValuePtr> pid_tuples;  // item 2 (the key) is set at write time
    std::string key;                   // assigned at write time
  };
  std::vector<Entry> entries;
  absl::flat_hash_map<const Storage*, size_t> by_storage;
  absl::flat_hash_map<const Value*, size_t> by_pid;  // kPersistentId node -> entry
  absl::Status deferred_error;                       // from AddStreamedTensor
  // Values shared like the Python objects torch's pickler sees (so memo
  // references, and thus bytes, match torch.save).
  ValuePtr storage_str = Value::Str("storage");
  ValuePtr location_str = Value::Str("cpu");
  ValuePtr rebuild = Value::Global("torch._utils", "_rebuild_tensor_v2");
  ValuePtr placeholder_key = Value::Str("");
  absl::flat_hash_map<int, ValuePtr> storage_classes;

  ValuePtr StorageClass(DType dtype) {
    auto& g = storage_classes[static_cast<int>(dtype)];
    if (g == nullptr) g = Value::Global("torch", std::string(StorageClassName(dtype)));
    return g;
  }

  ValuePtr MakeTensorValue(size_t entry_index, int64_t offset, const std::vector<int64_t>& sizes,
                           const std::vector<int64_t>& strides, bool requires_grad) {
    Entry& e = entries[entry_index];
    ValuePtr pid_tuple = Value::Tuple({storage_str, StorageClass(e.dtype), placeholder_key, location_str,
                                       Value::Int(e.numel)});
    e.pid_tuples.push_back(pid_tuple);
    ValuePtr pid = Value::PersistentId(pid_tuple);
    by_pid.emplace(pid.get(), entry_index);
    std::vector<ValuePtr> size_items, stride_items;
    for (int64_t s : sizes) size_items.push_back(Value::Int(s));
    for (int64_t s : strides) stride_items.push_back(Value::Int(s));
    pickle::Object o;
    o.callable = rebuild;
    o.how = pickle::ObjectHow::kReduce;
    o.args = Value::Tuple({pid, Value::Int(offset), Value::Tuple(std::move(size_items)),
                           Value::Tuple(std::move(stride_items)), Value::Bool(requires_grad),
                           Value::MakeDict(/*ordered_dict=*/true)});
    return Value::MakeObject(std::move(o));
  }

  // Assigns keys "0", "1", ... in order of first appearance of each storage's
  // persistent ids in pickling order (depth first, children in the order the
  // pickler writes them, shared nodes once), as torch's persistent_id does.
  absl::Status AssignKeys(const Value& root, std::vector<size_t>* order) {
    for (Entry& e : entries) e.key.clear();
    absl::flat_hash_set<const Value*> seen;
    std::vector<const Value*> stack = {&root};
    while (!stack.empty()) {
      const Value* v = stack.back();
      stack.pop_back();
      if (v == nullptr || !pickle::IsContainer(v->kind()) || !seen.insert(v).second) continue;
      if (v->is(Kind::kPersistentId)) {
        auto it = by_pid.find(v);
        if (it == by_pid.end()) {
          return absl::InvalidArgumentError(
              absl::StrCat("persistent id not created by this TorchWriter: ", v->DebugString(120)));
        }
        Entry& e = entries[it->second];
        if (e.key.empty()) {
          e.key = absl::StrCat(order->size());
          order->push_back(it->second);
        }
        continue;
      }
      // Push children in reverse so they pop in pickling order.
      std::vector<const Value*> children;
      pickle::ForEachChild(*v, [&](const ValuePtr& child) { children.push_back(child.get()); });
      for (auto c = children.rbegin(); c != children.rend(); ++c) stack.push_back(*c);
    }
    for (size_t index : *order) {
      Entry& e = entries[index];
      ValuePtr key = Value::Str(e.key);
      for (const ValuePtr& t : e.pid_tuples) t->mutable_items()[2] = key;
    }
    return absl::OkStatus();
  }

  // Hands out an entry's bytes in order, in cache-sized pieces (small enough
  // to stay in cache between the CRC, the hash and the write): from its
  // in-memory storage, its viewer (zero-copy where the source is contiguous)
  // or its producer (through `buffer`; every byte handed out is written
  // first). A piece stays valid until the next call.
  class EntryCursor {
   public:
    // Bytes [begin, end) of the entry (all of it by default); `begin` must
    // be a multiple of the element size (producers convert whole elements).
    EntryCursor(const Entry& e, const std::string& name, size_t chunk_bytes, GrowBuffer* buffer, uint64_t begin = 0,
                uint64_t end = UINT64_MAX)
        : e_(e),
          name_(name),
          chunk_bytes_(std::max<size_t>(chunk_bytes, 4096)),
          buffer_(buffer),
          end_(std::min(end, e.nbytes)),
          pos_(begin) {}

    // The next piece; empty once the entry (or the range) is done.
    absl::StatusOr<absl::Span<const uint8_t>> Next() {
      constexpr size_t kPiece = size_t{1} << 19;
      if (within_ == chunk_.size()) {
        if (pos_ >= end_) return absl::Span<const uint8_t>();
        const size_t len = static_cast<size_t>(std::min<uint64_t>(chunk_bytes_, end_ - pos_));
        if (e_.storage != nullptr) {
          chunk_ = absl::MakeConstSpan(e_.storage->data() + pos_, len);
        } else if (e_.viewer) {
          UCP_ASSIGN_OR_RETURN(chunk_, e_.viewer(pos_, len, buffer_->Get(len)));
          if (chunk_.size() != len) {
            return absl::InternalError(
                absl::StrCat(name_, ": a storage viewer returned ", chunk_.size(), " bytes for ", len));
          }
        } else {
          absl::Span<uint8_t> dst(buffer_->Get(len), len);
          UCP_RETURN_IF_ERROR(e_.producer(pos_, dst));
          chunk_ = dst;
        }
        pos_ += len;
        within_ = 0;
      }
      const absl::Span<const uint8_t> piece = chunk_.subspan(within_, std::min(kPiece, chunk_.size() - within_));
      within_ += piece.size();
      return piece;
    }

   private:
    const Entry& e_;
    const std::string& name_;
    const size_t chunk_bytes_;
    GrowBuffer* buffer_;
    const uint64_t end_;
    uint64_t pos_ = 0;  // of the next chunk
    absl::Span<const uint8_t> chunk_;
    size_t within_ = 0;
  };

  // Passes an entry's bytes to `emit` in order, piece by piece.
  absl::Status StreamEntry(const Entry& e, const std::string& name, GrowBuffer& buffer,
                           const std::function<absl::Status(absl::Span<const uint8_t>)>& emit) {
    EntryCursor cursor(e, name, options.chunk_bytes, &buffer);
    while (true) {
      UCP_ASSIGN_OR_RETURN(absl::Span<const uint8_t> piece, cursor.Next());
      if (piece.empty()) return absl::OkStatus();
      UCP_RETURN_IF_ERROR(emit(piece));
    }
  }

  ZipWriterOptions ZipOptions() const {
    ZipWriterOptions zip_options;
    zip_options.zip64_size_threshold = options.zip64_size_threshold;
    zip_options.zip64_offset_threshold = options.zip64_offset_threshold;
    return zip_options;
  }

  // The storage records in writing order and the pickle of `root`.
  struct Prepared {
    std::vector<size_t> order;
    std::string pkl;
  };
  absl::StatusOr<Prepared> Prepare(const std::string& name, const std::string& stem, const Value& root) {
    if (!deferred_error.ok()) return deferred_error;
    if (stem.empty()) return absl::InvalidArgumentError(absl::StrCat(name, ": empty archive name"));
    Prepared p;
    absl::Status s = AssignKeys(root, &p.order);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat(name, ": ", s.message()));
    absl::StatusOr<std::string> pkl = pickle::Pickle(root);
    if (!pkl.ok()) return absl::Status(pkl.status().code(), absl::StrCat(name, ": ", pkl.status().message()));
    p.pkl = *std::move(pkl);
    std::sort(p.order.begin(), p.order.end(), [&](size_t a, size_t b) { return entries[a].key < entries[b].key; });
    return p;
  }

  // One archive written a piece at a time, so several can be written (and
  // hashed) in step: Start(), then Next() until it returns an empty span, then
  // Finish(). Next() writes the next piece of storage bytes to the sink with
  // its hashing paused and returns the piece, which the caller hashes (when
  // the sink has a hasher) before calling Next() again; everything around the
  // storages (data.pkl, headers, descriptors, directory) the sink hashes.
  class ArchiveLane {
   public:
    ArchiveLane(Impl* impl, HashingSink* sink, std::string name, std::string stem, Prepared prepared)
        : impl_(impl),
          sink_(sink),
          name_(std::move(name)),
          stem_(std::move(stem)),
          prepared_(std::move(prepared)),
          zip_(sink, name_, impl->ZipOptions()) {}

    absl::Status Start() { return zip_.AddRecord(absl::StrCat(stem_, "/data.pkl"), prepared_.pkl); }

    absl::StatusOr<absl::Span<const uint8_t>> Next() {
      while (true) {
        if (cursor_.has_value()) {
          UCP_ASSIGN_OR_RETURN(absl::Span<const uint8_t> piece, cursor_->Next());
          if (!piece.empty()) {
            sink_->set_paused(true);
            absl::Status s = zip_.WriteData(piece);
            sink_->set_paused(false);
            if (!s.ok()) return s;
            return piece;
          }
          cursor_.reset();
          UCP_RETURN_IF_ERROR(zip_.EndRecord());
          ++next_record_;
        }
        if (next_record_ == prepared_.order.size()) return absl::Span<const uint8_t>();
        const Entry& e = impl_->entries[prepared_.order[next_record_]];
        UCP_RETURN_IF_ERROR(zip_.BeginRecord(absl::StrCat(stem_, "/data/", e.key), e.nbytes));
        cursor_.emplace(e, name_, impl_->options.chunk_bytes, &buffer_);
      }
    }

    absl::Status Finish() {
      UCP_RETURN_IF_ERROR(zip_.AddRecord(absl::StrCat(stem_, "/version"), kWrittenVersion));
      return zip_.Finish();
    }

   private:
    Impl* impl_;
    HashingSink* sink_;
    std::string name_;
    std::string stem_;
    Prepared prepared_;
    ZipWriter zip_;
    GrowBuffer buffer_;
    size_t next_record_ = 0;
    std::optional<EntryCursor> cursor_;
  };

  // Lays the archive out: the file offset of each storage record's data
  // (records in `order`), with nothing written.
  absl::StatusOr<std::vector<uint64_t>> LayOut(const std::string& name, const std::string& stem,
                                               const std::string& pkl, const std::vector<size_t>& order) {
    std::vector<uint64_t> data_offset(order.size());
    CountingSink counting;
    ZipWriter layout(&counting, name, ZipOptions());
    absl::Status s = layout.AddRecord(absl::StrCat(stem, "/data.pkl"), pkl);
    for (size_t i = 0; i < order.size() && s.ok(); ++i) {
      s = layout.BeginRecord(absl::StrCat(stem, "/data/", entries[order[i]].key), entries[order[i]].nbytes);
      data_offset[i] = layout.bytes_written();
      if (s.ok()) s = layout.SkipData(0);
      if (s.ok()) s = layout.EndRecord();
    }
    if (!s.ok()) return s;
    return data_offset;
  }

  // Everything of the archive but the storage bytes, which `sink` skips
  // (someone else writes them): data.pkl, each storage record's local header
  // and data descriptor (with crc[i]), the version record and the central
  // directory. The same bytes as the sequential path writes around them.
  absl::Status WriteFrame(ZipSink* sink, const std::string& name, const std::string& stem, const std::string& pkl,
                          const std::vector<size_t>& order, const std::vector<uint64_t>& data_offset,
                          const std::vector<uint32_t>& crc) {
    ZipWriter zip(sink, name, ZipOptions());
    absl::Status s = zip.AddRecord(absl::StrCat(stem, "/data.pkl"), pkl);
    for (size_t i = 0; i < order.size() && s.ok(); ++i) {
      s = zip.BeginRecord(absl::StrCat(stem, "/data/", entries[order[i]].key), entries[order[i]].nbytes);
      if (s.ok() && zip.bytes_written() != data_offset[i]) {
        s = absl::InternalError(absl::StrCat(name, ": record layout changed between passes"));
      }
      if (s.ok()) s = zip.SkipData(crc[i]);
      if (s.ok()) s = zip.EndRecord();
    }
    if (s.ok()) s = zip.AddRecord(absl::StrCat(stem, "/version"), kWrittenVersion);
    if (s.ok()) s = zip.Finish();
    return s;
  }

  // Writes bytes [begin, end) of storage record i (entries[order[i]]) at
  // file offset data_offset + begin with pwrite, starting their writeback
  // every kWritebackBytes; returns the CRC-32 of those bytes.
  absl::StatusOr<uint32_t> FillRecord(int fd, const std::string& name, const Entry& e, uint64_t data_offset,
                                      uint64_t begin, uint64_t end) {
    GrowBuffer buffer;
    EntryCursor cursor(e, name, options.chunk_bytes, &buffer, begin, end);
    uint32_t crc = 0;
    uint64_t at = data_offset + begin;
    uint64_t written_back = at;  // the record's bytes before it are on their way to disk
    while (true) {
      UCP_ASSIGN_OR_RETURN(absl::Span<const uint8_t> piece, cursor.Next());
      if (piece.empty()) break;
      // Bytes of a mapped input are hashed from a buffer this thread reuses
      // (MappedFile::ReadThrough) and written from there (WriteAt).
      const absl::Span<const uint8_t> bytes = MappedFile::ReadThrough(piece);
      const uint32_t piece_crc = Crc32(0, bytes.data(), bytes.size());
      crc = Crc32Combine(crc, piece_crc, bytes.size());
      // When `piece` is bytes of an input record checked from what is read
      // (DeferredCrcChecks), this is their check.
      ReadCoverage::NoteRead(piece.data(), piece.size(), piece_crc);
      {
        // Units and record threads filling pieces of one file take turns.
        std::lock_guard<std::mutex> turn(FileWriteTurn(name));
        UCP_RETURN_IF_ERROR(MappedFile::WriteAt(fd, name, piece, at, bytes));
      }
      at += piece.size();
      if (options.writeback && at >= written_back + kWritebackBytes) {
        StartWriteback(fd, name, written_back, at - written_back);
        written_back = at;
      }
    }
    if (options.writeback) StartWriteback(fd, name, written_back, at - written_back);
    return crc;
  }

  // Writes the storage records at their final offsets in parallel (pwrite),
  // then the headers, descriptors and directory around them: the same bytes
  // as the sequential path.
  absl::Status WriteArchiveParallel(int fd, ZipSink* sink, const std::string& name, const std::string& stem,
                                    const std::string& pkl, const std::vector<size_t>& order) {
    UCP_ASSIGN_OR_RETURN(std::vector<uint64_t> data_offset, LayOut(name, stem, pkl, order));
    std::vector<uint32_t> crc(order.size(), 0);
    BackgroundFlusher* const flusher = BackgroundFlusher::Current();
    PhaseTimes* const times = PhaseTimes::Current();
    ReadCoverage* const coverage = ReadCoverage::Current();
    absl::Status s = ParallelFor(order.size(), options.record_threads, [&](size_t i) -> absl::Status {
      FlusherScope flushing(flusher);
      PhaseScope timing(times);
      ReadCoverage::Scope reading(coverage);  // the unit's: its input checks take what these threads read
      UCP_ASSIGN_OR_RETURN(crc[i], FillRecord(fd, name, entries[order[i]], data_offset[i], 0, UINT64_MAX));
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
    return WriteFrame(sink, name, stem, pkl, order, data_offset, crc);
  }

  // Writes one archive to `sink` (whose hasher, if any, sees every byte in
  // order); with `fd`, large records may be filled in parallel.
  absl::Status WriteArchive(HashingSink* sink, const std::string& name, const std::string& stem, const Value& root,
                            int fd = -1) {
    UCP_ASSIGN_OR_RETURN(Prepared prepared, Prepare(name, stem, root));
    size_t large = 0;
    for (size_t index : prepared.order) large += entries[index].nbytes >= (size_t{1} << 20) ? 1 : 0;
    if (fd >= 0 && options.record_threads > 1 && sink->sha() == nullptr && large >= 2) {
      return WriteArchiveParallel(fd, sink, name, stem, prepared.pkl, prepared.order);
    }
    ArchiveLane lane(this, sink, name, stem, std::move(prepared));
    UCP_RETURN_IF_ERROR(lane.Start());
    while (true) {
      UCP_ASSIGN_OR_RETURN(absl::Span<const uint8_t> piece, lane.Next());
      if (piece.empty()) break;
      if (sink->sha() != nullptr) sink->sha()->Update(piece.data(), piece.size());
    }
    return lane.Finish();
  }
};

TorchWriter::TorchWriter() : TorchWriter(TorchWriteOptions()) {}
TorchWriter::TorchWriter(TorchWriteOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->options = options;
}
TorchWriter::~TorchWriter() = default;

pickle::ValuePtr TorchWriter::AddTensor(const Tensor& t) {
  if (!t.defined()) {
    if (impl_->deferred_error.ok()) impl_->deferred_error = absl::InvalidArgumentError("AddTensor: undefined tensor");
    return Value::None();
  }
  const std::shared_ptr<const Storage>& storage = t.storage();
  auto [it, inserted] = impl_->by_storage.emplace(storage.get(), impl_->entries.size());
  if (inserted) {
    Impl::Entry e;
    e.storage = storage;
    e.dtype = storage->dtype();
    e.numel = storage->numel();
    e.nbytes = storage->nbytes();
    impl_->entries.push_back(std::move(e));
  }
  return impl_->MakeTensorValue(it->second, t.storage_offset(), t.sizes(), t.strides(), t.requires_grad());
}

pickle::ValuePtr TorchWriter::AddStreamedTensor(DType dtype, std::vector<int64_t> sizes, int64_t storage_numel,
                                                int64_t offset, StorageViewer viewer) {
  if (viewer == nullptr) return AddStreamedTensor(dtype, std::move(sizes), storage_numel, offset, StorageProducer());
  pickle::ValuePtr v = AddStreamedTensor(
      dtype, std::move(sizes), storage_numel, offset,
      StorageProducer([](uint64_t, absl::Span<uint8_t>) {
        return absl::InternalError("a viewed storage has no producer");
      }));
  impl_->entries.back().viewer = std::move(viewer);
  return v;
}

pickle::ValuePtr TorchWriter::AddStreamedTensor(DType dtype, std::vector<int64_t> sizes, int64_t storage_numel,
                                                int64_t offset, StorageProducer producer) {
  int64_t numel = 1;
  bool ok = storage_numel >= 0 && offset >= 0 && producer != nullptr;
  for (int64_t s : sizes) ok = ok && s >= 0 && !__builtin_mul_overflow(numel, s, &numel);
  int64_t end = 0, nbytes = 0;
  ok = ok && !__builtin_add_overflow(offset, numel, &end) && end <= storage_numel &&
       !__builtin_mul_overflow(storage_numel, static_cast<int64_t>(ItemSize(dtype)), &nbytes);
  if (!ok && impl_->deferred_error.ok()) {
    impl_->deferred_error = absl::InvalidArgumentError(
        absl::StrCat("AddStreamedTensor: a ", ShapeString(sizes), " view at offset ", offset,
                     " does not fit a storage of ", storage_numel, " elements (or no producer)"));
  }
  Impl::Entry e;
  e.producer = std::move(producer);
  e.dtype = dtype;
  e.numel = std::max<int64_t>(storage_numel, 0);
  e.nbytes = ok ? static_cast<uint64_t>(nbytes) : 0;
  impl_->entries.push_back(std::move(e));
  std::vector<int64_t> strides(sizes.size());
  int64_t stride = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= std::max<int64_t>(sizes[i], 1);
  }
  return impl_->MakeTensorValue(impl_->entries.size() - 1, offset, sizes, strides, false);
}


uint64_t TorchWriter::bytes_written() const { return impl_->last_bytes; }
const std::string& TorchWriter::digest_hex() const { return impl_->last_digest; }

namespace {

// A file being written: created (never over a file this process has mapped),
// written through a buffer and, optionally, a hasher; closed by Close(), and
// removed when writing failed or it is destroyed unclosed.
class OutputFile {
 public:
  static absl::StatusOr<std::unique_ptr<OutputFile>> Create(const std::string& path, DigestKind hash,
                                                            bool writeback) {
    // Truncating a file this process has mapped (e.g. the checkpoint the
    // storages come from) would destroy the source and SIGBUS the reader.
    if (MappedFile::IsMappedByThisProcess(path)) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, ": refusing to overwrite a file that is open for reading (memory-mapped)"));
    }
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat(path, ": cannot create"));
    return std::unique_ptr<OutputFile>(new OutputFile(fd, path, hash, writeback));
  }
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  ~OutputFile() {
    if (fd_ >= 0) (void)Close(absl::CancelledError("abandoned"), false);
  }

  HashingSink* sink() { return &hashing_; }
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  uint64_t bytes_written() const { return hashing_.count(); }
  std::string HexDigest() { return hashing_.sha() != nullptr ? sha_.HexDigest() : std::string(); }
  StreamDigest* digest() { return hashing_.sha(); }

  // Ends writing with `status` (what writing the contents returned): syncs
  // if asked, closes, and removes the file unless all went well.
  absl::Status Close(absl::Status status, bool sync) {
    if (status.ok() && sync && ::fdatasync(fd_) != 0) {
      status = absl::ErrnoToStatus(errno, absl::StrCat(path_, ": fdatasync failed"));
    }
    if (::close(fd_) != 0 && status.ok()) status = absl::ErrnoToStatus(errno, absl::StrCat(path_, ": close failed"));
    fd_ = -1;
    if (!status.ok()) ::unlink(path_.c_str());
    return status;
  }

 private:
  OutputFile(int fd, std::string path, DigestKind hash, bool writeback)
      : fd_(fd),
        path_(std::move(path)),
        sink_(fd, path_, size_t{1} << 20, writeback),
        sha_(hash),
        hashing_(&sink_, hash != DigestKind::kNone ? &sha_ : nullptr) {}
  int fd_;
  std::string path_;
  FdSink sink_;
  StreamDigest sha_;
  HashingSink hashing_;
};

}  // namespace

absl::Status TorchWriter::WriteFile(const std::string& path, const pickle::Value& root) {
  UCP_ASSIGN_OR_RETURN(std::unique_ptr<OutputFile> file, OutputFile::Create(path, impl_->options.digest, impl_->options.writeback));
  absl::Status s = impl_->WriteArchive(file->sink(), path, ArchiveStem(path), root, file->fd());
  impl_->last_bytes = file->bytes_written();
  impl_->last_digest = file->HexDigest();
  return file->Close(std::move(s), impl_->options.sync);
}

absl::Status TorchWriter::WriteBackToBack(absl::Span<TorchWriter* const> writers, const std::string& path,
                                          const std::string& stem, absl::Span<const pickle::Value* const> roots,
                                          std::vector<uint64_t>* lengths) {
  if (writers.empty() || writers.size() != roots.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("WriteBackToBack: ", writers.size(), " writers and ", roots.size(), " roots"));
  }
  for (size_t i = 0; i < writers.size(); ++i) {
    if (writers[i] == nullptr || roots[i] == nullptr) {
      return absl::InvalidArgumentError("WriteBackToBack: each archive needs a writer and a root");
    }
  }
  const TorchWriteOptions& options = writers[0]->impl_->options;
  UCP_ASSIGN_OR_RETURN(std::unique_ptr<OutputFile> file,
                       OutputFile::Create(path, DigestKind::kNone, options.writeback));
  absl::Status s;
  uint64_t start = 0;
  for (size_t i = 0; i < writers.size() && s.ok(); ++i) {
    s = writers[i]->impl_->WriteArchive(file->sink(), path, stem, *roots[i]);
    const uint64_t end = file->bytes_written();
    writers[i]->impl_->last_bytes = end - start;
    writers[i]->impl_->last_digest.clear();
    if (s.ok()) lengths->push_back(end - start);
    start = end;
  }
  return file->Close(std::move(s), options.sync);
}

absl::Status TorchWriter::WriteFiles(absl::Span<TorchWriter* const> writers, absl::Span<const std::string> paths,
                                     absl::Span<const pickle::Value* const> roots) {
  if (writers.size() != paths.size() || writers.size() != roots.size()) {
    return absl::InvalidArgumentError(absl::StrCat("WriteFiles: ", writers.size(), " writers, ", paths.size(),
                                                   " paths and ", roots.size(), " roots"));
  }
  absl::flat_hash_set<const TorchWriter*> distinct;
  bool hashed = true;
  for (size_t i = 0; i < writers.size(); ++i) {
    if (writers[i] == nullptr || roots[i] == nullptr || !distinct.insert(writers[i]).second) {
      return absl::InvalidArgumentError("WriteFiles: each file needs its own writer and a root");
    }
    hashed = hashed && writers[i]->impl_->options.digest != DigestKind::kNone;
  }
  std::vector<std::string> written;
  auto remove_written = [&](absl::Status s) {
    for (const std::string& path : written) ::unlink(path.c_str());
    return s;
  };
  if (!hashed || writers.size() < 2) {
    for (size_t i = 0; i < writers.size(); ++i) {
      absl::Status s = writers[i]->WriteFile(paths[i], *roots[i]);
      if (!s.ok()) return remove_written(s);
      written.push_back(paths[i]);
    }
    return absl::OkStatus();
  }

  // Every file hashes: write them a piece at a time in turn, hashing the
  // pieces of two different files at once.
  struct Lane {
    Impl* impl;
    std::unique_ptr<OutputFile> file;
    std::optional<Impl::ArchiveLane> lane;
  };
  std::vector<std::unique_ptr<Lane>> lanes;
  auto fail = [&](absl::Status s) {
    lanes.clear();  // closes and removes the files not finished
    return remove_written(std::move(s));
  };
  std::deque<Lane*> turn;
  for (size_t i = 0; i < writers.size(); ++i) {
    auto l = std::make_unique<Lane>();
    l->impl = writers[i]->impl_.get();
    absl::StatusOr<std::unique_ptr<OutputFile>> file = OutputFile::Create(paths[i], l->impl->options.digest, l->impl->options.writeback);
    if (!file.ok()) return fail(file.status());
    l->file = *std::move(file);
    absl::StatusOr<Impl::Prepared> prepared = l->impl->Prepare(paths[i], ArchiveStem(paths[i]), *roots[i]);
    if (!prepared.ok()) return fail(prepared.status());
    l->lane.emplace(l->impl, l->file->sink(), paths[i], ArchiveStem(paths[i]), *std::move(prepared));
    absl::Status s = l->lane->Start();
    if (!s.ok()) return fail(s);
    turn.push_back(l.get());
    lanes.push_back(std::move(l));
  }
  while (!turn.empty()) {
    Lane* pair[2] = {turn.front(), nullptr};
    turn.pop_front();
    if (!turn.empty()) {
      pair[1] = turn.front();
      turn.pop_front();
    }
    absl::Span<const uint8_t> piece[2];
    for (int k = 0; k < 2 && pair[k] != nullptr; ++k) {
      absl::StatusOr<absl::Span<const uint8_t>> next = pair[k]->lane->Next();
      if (!next.ok()) return fail(next.status());
      piece[k] = *next;
    }
    StreamDigest* sha0 = pair[0]->file->sink()->sha();
    if (pair[1] != nullptr) {
      StreamDigest::UpdatePair(*sha0, piece[0].data(), piece[0].size(), *pair[1]->file->sink()->sha(), piece[1].data(),
                               piece[1].size());
    } else {
      sha0->Update(piece[0].data(), piece[0].size());
    }
    for (int k = 0; k < 2 && pair[k] != nullptr; ++k) {
      Lane* l = pair[k];
      if (!piece[k].empty()) {
        turn.push_back(l);
        continue;
      }
      absl::Status s = l->lane->Finish();
      l->impl->last_bytes = l->file->bytes_written();
      l->impl->last_digest = l->file->HexDigest();
      const std::string path = l->file->path();
      s = l->file->Close(std::move(s), l->impl->options.sync);
      l->file.reset();
      if (!s.ok()) return fail(s);
      written.push_back(path);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> TorchWriter::WriteToString(const std::string& stem, const pickle::Value& root) {
  std::string out;
  StringSink sink(&out);
  HashingSink passthrough(&sink, nullptr);
  absl::Status s = impl_->WriteArchive(&passthrough, stem, stem, root);
  if (!s.ok()) return s;
  return out;
}

namespace {

// A sink writing at explicit offsets of a file (pwrite), so that it can
// skip the storage bytes other writers fill and leave them untouched.
class PwriteSink : public ZipSink {
 public:
  PwriteSink(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  absl::Status Write(absl::Span<const uint8_t> bytes) override {
    UCP_RETURN_IF_ERROR(MappedFile::PWriteAll(fd_, path_, bytes, pos_));
    pos_ += bytes.size();
    return absl::OkStatus();
  }
  absl::Status Skip(uint64_t n) override {
    pos_ += n;
    return absl::OkStatus();
  }
  uint64_t pos() const { return pos_; }

 private:
  int fd_;
  std::string path_;
  uint64_t pos_ = 0;
};

// Opens (creating if needed, never truncating) a file that pieces are
// written into, refusing one this process reads through a mapping.
absl::StatusOr<int> OpenForPieces(const std::string& path) {
  if (MappedFile::IsMappedByThisProcess(path)) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": refusing to overwrite a file that is open for reading (memory-mapped)"));
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat(path, ": cannot open for writing"));
  return fd;
}

absl::Status CloseFile(int fd, const std::string& path, bool sync, absl::Status status) {
  if (status.ok() && sync && ::fdatasync(fd) != 0) {
    status = absl::ErrnoToStatus(errno, absl::StrCat(path, ": fdatasync failed"));
  }
  if (::close(fd) != 0 && status.ok()) status = absl::ErrnoToStatus(errno, absl::StrCat(path, ": close failed"));
  return status;
}

}  // namespace

std::vector<uint64_t> StoragePieceBounds(absl::Span<const uint64_t> record_sizes, int pieces) {
  pieces = std::max(pieces, 1);
  uint64_t total = 0;
  for (uint64_t n : record_sizes) total += n;
  std::vector<uint64_t> bounds(pieces + 1, 0);
  bounds[pieces] = total;
  for (int k = 1; k < pieces; ++k) {
    // An even share, moved down to a multiple of kPieceAlignment within the
    // record it falls in (whole elements of any dtype, whole pages).
    const uint64_t target =
        static_cast<uint64_t>(static_cast<unsigned __int128>(total) * static_cast<unsigned>(k) / static_cast<unsigned>(pieces));
    uint64_t start = 0;
    for (uint64_t n : record_sizes) {
      if (target < start + n) break;
      start += n;
    }
    const uint64_t local = target - start;
    bounds[k] = std::max(bounds[k - 1], start + local - local % kPieceAlignment);
  }
  return bounds;
}

namespace {

// The byte range [lo, hi) of archive record i (offsets within its data)
// that piece k writes, for every piece: the cut of StoragePieceBounds.
struct RecordRange {
  size_t record;  // index in archive order
  uint64_t lo, hi;
};
std::vector<std::vector<RecordRange>> PieceRanges(absl::Span<const uint64_t> record_sizes, int pieces) {
  const std::vector<uint64_t> bounds = StoragePieceBounds(record_sizes, pieces);
  std::vector<std::vector<RecordRange>> out(pieces);
  for (int k = 0; k < pieces; ++k) {
    uint64_t start = 0;  // of record i in the storage bytes
    for (size_t i = 0; i < record_sizes.size(); start += record_sizes[i], ++i) {
      const uint64_t lo = std::max(bounds[k], start), hi = std::min(bounds[k + 1], start + record_sizes[i]);
      if (lo < hi) out[k].push_back({i, lo - start, hi - start});
    }
  }
  return out;
}

}  // namespace

absl::Status TorchWriter::WritePiece(const std::string& path, const pickle::Value& root, int piece, int pieces,
                                     std::vector<RecordPieceCrc>* crcs) {
  Impl& impl = *impl_;
  if (impl.options.digest != DigestKind::kNone) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": a file written in pieces cannot be digested while written"));
  }
  if (pieces < 1 || piece < 0 || piece >= pieces) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": piece ", piece, " of ", pieces));
  }
  UCP_ASSIGN_OR_RETURN(Impl::Prepared prepared, impl.Prepare(path, ArchiveStem(path), root));
  UCP_ASSIGN_OR_RETURN(std::vector<uint64_t> data_offset,
                       impl.LayOut(path, ArchiveStem(path), prepared.pkl, prepared.order));
  std::vector<uint64_t> sizes;
  for (size_t index : prepared.order) sizes.push_back(impl.entries[index].nbytes);
  const std::vector<RecordRange> ranges = PieceRanges(sizes, pieces)[piece];
  UCP_ASSIGN_OR_RETURN(const int fd, OpenForPieces(path));
  absl::Status s;
  for (const RecordRange& r : ranges) {
    absl::StatusOr<uint32_t> crc =
        impl.FillRecord(fd, path, impl.entries[prepared.order[r.record]], data_offset[r.record], r.lo, r.hi);
    if (!crc.ok()) {
      s = crc.status();
      break;
    }
    crcs->push_back({static_cast<uint32_t>(r.record), r.lo, r.hi - r.lo, *crc});
  }
  // On failure the file stays (other pieces share it): whoever owns the
  // folder removes it (a staging folder never committed).
  return CloseFile(fd, path, impl.options.sync, std::move(s));
}

absl::StatusOr<std::vector<std::vector<TorchWriter::StoragePart>>> TorchWriter::PieceParts(
    const std::string& path, const pickle::Value& root, int pieces) {
  Impl& impl = *impl_;
  if (pieces < 1) return absl::InvalidArgumentError(absl::StrCat(path, ": ", pieces, " pieces"));
  UCP_ASSIGN_OR_RETURN(Impl::Prepared prepared, impl.Prepare(path, ArchiveStem(path), root));
  std::vector<uint64_t> sizes;
  for (size_t index : prepared.order) sizes.push_back(impl.entries[index].nbytes);
  std::vector<std::vector<StoragePart>> out(pieces);
  const std::vector<std::vector<RecordRange>> ranges = PieceRanges(sizes, pieces);
  for (int k = 0; k < pieces; ++k) {
    for (const RecordRange& r : ranges[k]) out[k].push_back({prepared.order[r.record], r.lo, r.hi - r.lo});
  }
  return out;
}

size_t TorchWriter::num_storages() const { return impl_->entries.size(); }

absl::StatusOr<uint64_t> TorchWriter::FinishPieces(const std::string& path, const pickle::Value& root,
                                                   absl::Span<const RecordPieceCrc> crcs) {
  Impl& impl = *impl_;
  if (impl.options.digest != DigestKind::kNone) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": a file written in pieces cannot be digested while written"));
  }
  UCP_ASSIGN_OR_RETURN(Impl::Prepared prepared, impl.Prepare(path, ArchiveStem(path), root));
  UCP_ASSIGN_OR_RETURN(std::vector<uint64_t> data_offset,
                       impl.LayOut(path, ArchiveStem(path), prepared.pkl, prepared.order));
  // Each record's CRC from its parts, which must tile it exactly.
  std::vector<std::vector<RecordPieceCrc>> parts(prepared.order.size());
  for (const RecordPieceCrc& c : crcs) {
    if (c.record >= parts.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": a piece of storage record ", c.record, " of ", parts.size()));
    }
    parts[c.record].push_back(c);
  }
  std::vector<uint32_t> crc(parts.size(), 0);
  for (size_t i = 0; i < parts.size(); ++i) {
    std::sort(parts[i].begin(), parts[i].end(),
              [](const RecordPieceCrc& a, const RecordPieceCrc& b) { return a.offset < b.offset; });
    uint64_t covered = 0;
    for (const RecordPieceCrc& c : parts[i]) {
      if (c.offset != covered) break;
      crc[i] = Crc32Combine(crc[i], c.crc32, c.length);
      covered += c.length;
    }
    const uint64_t nbytes = impl.entries[prepared.order[i]].nbytes;
    if (covered != nbytes) {
      return absl::FailedPreconditionError(absl::StrCat(path, ": the pieces written cover ", covered, " of the ",
                                                        nbytes, " bytes of storage record ", i,
                                                        " (contiguously from its start)"));
    }
  }
  UCP_ASSIGN_OR_RETURN(const int fd, OpenForPieces(path));
  PwriteSink sink(fd, path);
  absl::Status s = impl.WriteFrame(&sink, path, ArchiveStem(path), prepared.pkl, prepared.order, data_offset, crc);
  if (s.ok() && ::ftruncate(fd, static_cast<off_t>(sink.pos())) != 0) {
    s = absl::ErrnoToStatus(errno, absl::StrCat(path, ": ftruncate failed"));
  }
  UCP_RETURN_IF_ERROR(CloseFile(fd, path, impl.options.sync, std::move(s)));
  impl.last_bytes = sink.pos();
  impl.last_digest.clear();
  return sink.pos();
}

}  // namespace ucp::torch
