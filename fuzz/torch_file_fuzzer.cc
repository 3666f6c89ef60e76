// libFuzzer target for the torch.save reader (format/torch/torch_file.h: the
// zip container, data.pkl, persistent ids, storages and tensor views) and,
// on what it accepts, TorchWriter.
//
// Input: a whole archive when it starts with a zip local header ("PK\3\4");
// anything else is taken as data.pkl and wrapped in an archive that also
// holds storages archive/data/0..3 (16, 0, 7 and 64 bytes), so that pickle
// mutations get past the zip layer and its CRCs and reach the persistent id
// and view validation. The seed corpus has both kinds (fuzz/seeds/torch_file).
//
// For every input:
//   1. TorchFile::FromBytes with eager CRC checks and with lazy ones. Each
//      succeeds or fails with a code torch_file.h / zip.h / tensor.h document
//      and a message that starts with the file name. Eager success implies
//      lazy success; lazy success with eager failure means a CRC mismatch
//      that VerifyAllCrcs then reports.
//   2. On success, every tensor of the tree (each node once) is fetched with
//      GetTensor; its view is checked against a reference computed here
//      (last element inside the storage, row-major bytes of small views
//      gathered element by element and compared with ContiguousBytes and
//      CopyFlatRange; first and last elements of large views). Every storage
//      is the bytes of its record: same size, the CRC-32 the central
//      directory stores, and VerifyStorageCrc agrees. Non-tensor objects are
//      refused by GetTensor.
//   3. The tree is copied with its tensors re-added through a TorchWriter
//      (shared storages stay shared), written, and read back: the tensors
//      come back bitwise equal with the same views, and, when the tree is
//      small enough to render and the pickle writer does not normalize it
//      (fuzz_checks.h: RoundTripsExactly), CanonicalDump of both files is
//      identical. The writer may refuse only what it refuses by design
//      (fuzz_checks.h: HasValueTheWriterRefuses).
// (Storages pickled outside a tensor cannot be re-added; they become None and
// such trees skip the dump comparison.)
//
// Built with libFuzzer + ASan/UBSan by tools/fuzz.sh; with gcc and
// fuzz_driver_main.cc (//fuzz:torch_file_fuzzer) it replays files.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "format/pickle/value.h"
#include "format/torch/crc32.h"
#include "format/torch/dtype.h"
#include "format/torch/dump.h"
#include "format/torch/tensor.h"
#include "format/torch/torch_file.h"
#include "format/torch/zip.h"
#include "fuzz/fuzz_checks.h"

namespace ucp::fuzz {
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

constexpr char kName[] = "fuzz.pt";
constexpr char kRewrittenName[] = "rewritten.pt";
// Views up to this many bytes are copied whole; larger ones (stride-0 views
// can address 2^60 bytes of a 1-byte storage) only at both ends.
constexpr uint64_t kMaxCopyBytes = uint64_t{1} << 20;
// Views up to this many elements are also gathered element by element here.
constexpr int64_t kMaxReferenceElements = 4096;
// CanonicalDump renders the expanded tree and hashes every view it meets, so
// it runs only on trees and views this small.
constexpr uint64_t kMaxDumpNodes = 2048;
constexpr uint64_t kMaxDumpViewBytes = uint64_t{16} << 10;

bool IsArchive(std::string_view bytes) { return bytes.size() >= 4 && bytes.substr(0, 4) == "PK\x03\x04"; }

// data.pkl mode: `pkl` in an archive with a few storages to refer to.
std::string WrapPickle(std::string_view pkl) {
  std::string out;
  torch::StringSink sink(&out);
  torch::ZipWriter w(&sink, "wrap");
  absl::Status s = w.AddRecord("archive/data.pkl", pkl);
  if (s.ok()) s = w.AddRecord("archive/data/0", std::string(16, '\x3f'));
  if (s.ok()) s = w.AddRecord("archive/data/1", std::string_view());
  if (s.ok()) s = w.AddRecord("archive/data/2", std::string(7, '\x01'));
  if (s.ok()) s = w.AddRecord("archive/data/3", std::string(64, '\x02'));
  if (s.ok()) s = w.AddRecord("archive/version", "3\n");
  if (s.ok()) s = w.Finish();
  UCP_FUZZ_CHECK(s.ok(), "ZipWriter failed on a fixed layout: ", s.ToString());
  return out;
}

torch::OpenOptions Options(bool verify_crc) {
  torch::OpenOptions o;
  o.pickle.max_values = size_t{1} << 20;
  o.pickle.max_memo_entries = size_t{1} << 16;
  o.verify_crc = verify_crc;
  // Past the unsafe-global refusal (checked separately in FuzzOne), so that
  // such trees still reach the tensor and writer checks.
  o.refuse_unsafe_globals = false;
  return o;
}

void CheckOpenStatus(const absl::Status& status, const char* what) {
  CheckErrorStatus(status,
                   {absl::StatusCode::kDataLoss, absl::StatusCode::kInvalidArgument,
                    absl::StatusCode::kResourceExhausted, absl::StatusCode::kUnimplemented,
                    absl::StatusCode::kOutOfRange},
                   kName, what);
}

// The nodes of a tree in pickling order (depth first, each node once).
struct TreeNodes {
  std::vector<const Value*> tensors;  // TorchFile::IsTensor objects
  std::vector<const Value*> pids;     // persistent ids
  std::vector<const Value*> objects;  // other objects
};

TreeNodes CollectNodes(const Value& root) {
  TreeNodes out;
  absl::flat_hash_set<const Value*> seen;
  std::vector<const Value*> todo = {&root};
  while (!todo.empty()) {
    const Value* v = todo.back();
    todo.pop_back();
    if (!seen.insert(v).second) continue;
    if (v->is(Kind::kObject)) {
      if (torch::TorchFile::IsTensor(*v)) {
        out.tensors.push_back(v);
      } else {
        out.objects.push_back(v);
      }
    } else if (v->is(Kind::kPersistentId)) {
      out.pids.push_back(v);
    }
    std::vector<const Value*> children;
    ForEachChild(*v, [&](const ValuePtr& child) {
      if (child != nullptr) children.push_back(child.get());
    });
    for (auto c = children.rbegin(); c != children.rend(); ++c) todo.push_back(*c);
  }
  return out;
}

// The storage element index of row-major element `i` of `t`.
int64_t ElementIndex(const torch::Tensor& t, int64_t i) {
  int64_t index = t.storage_offset();
  for (size_t d = t.sizes().size(); d-- > 0;) {
    const int64_t size = t.sizes()[d];
    index += (i % size) * t.strides()[d];
    i /= size;
  }
  return index;
}

void CheckTensor(const torch::Tensor& t, const Value& where) {
  const int64_t numel = t.numel();
  const int64_t item = static_cast<int64_t>(torch::ItemSize(t.dtype()));
  const uint64_t storage_bytes = t.storage()->nbytes();
  UCP_FUZZ_CHECK(numel >= 0 && t.storage_offset() >= 0, "bad view accepted: ", where.DebugString(200));
  // Every addressed element lies in the storage (recomputed in 128 bits).
  if (numel > 0) {
    __int128 last = t.storage_offset();
    for (size_t d = 0; d < t.sizes().size(); ++d) {
      UCP_FUZZ_CHECK(t.strides()[d] >= 0, "negative stride accepted: ", where.DebugString(200));
      last += static_cast<__int128>(t.sizes()[d] - 1) * t.strides()[d];
    }
    UCP_FUZZ_CHECK((last + 1) * item <= static_cast<__int128>(storage_bytes),
                   "a view reaching past its storage was accepted: ", where.DebugString(200));
  }
  const __int128 nbytes = static_cast<__int128>(numel) * item;
  UCP_FUZZ_CHECK(nbytes <= INT64_MAX, "numel x itemsize overflows: ", where.DebugString(200));
  if (static_cast<uint64_t>(nbytes) <= kMaxCopyBytes) {
    const std::string bytes = t.ContiguousBytes();
    UCP_FUZZ_CHECK(bytes.size() == static_cast<uint64_t>(nbytes), "ContiguousBytes size");
    std::string flat(bytes.size(), '\0');
    absl::Status s = t.CopyFlatRange(0, numel, reinterpret_cast<uint8_t*>(flat.data()));
    UCP_FUZZ_CHECK(s.ok() && flat == bytes, "CopyFlatRange(0, numel) disagrees with ContiguousBytes: ",
                   s.ToString());
    if (numel <= kMaxReferenceElements) {
      std::string reference;
      reference.reserve(bytes.size());
      for (int64_t i = 0; i < numel; ++i) {
        const uint8_t* p = t.storage()->data() + ElementIndex(t, i) * item;
        reference.append(reinterpret_cast<const char*>(p), static_cast<size_t>(item));
      }
      UCP_FUZZ_CHECK(reference == bytes, "ContiguousBytes differs from an element-wise gather: ",
                     where.DebugString(200));
    }
  } else {
    const int64_t k = std::min<int64_t>(numel, 256);
    std::string ends(static_cast<size_t>(k * item), '\0');
    absl::Status s = t.CopyFlatRange(0, k, reinterpret_cast<uint8_t*>(ends.data()));
    UCP_FUZZ_CHECK(s.ok(), "CopyFlatRange of the first elements: ", s.ToString());
    s = t.CopyFlatRange(numel - k, k, reinterpret_cast<uint8_t*>(ends.data()));
    UCP_FUZZ_CHECK(s.ok(), "CopyFlatRange of the last elements: ", s.ToString());
  }
  uint8_t one[16];
  UCP_FUZZ_CHECK(!t.CopyFlatRange(numel, 1, one).ok(), "CopyFlatRange past the end succeeded");
}

// Checks the storage of each persistent id against the archive's record.
void CheckStorages(const torch::TorchFile& file, const TreeNodes& nodes, absl::Span<const uint8_t> archive) {
  absl::StatusOr<torch::ZipReader> zip =
      torch::ZipReader::Open(archive, "check", {torch::ZipReadOptions::Crc::kLazy});
  UCP_FUZZ_CHECK(zip.ok(), "the zip of an accepted file does not open: ", zip.status().ToString());
  for (const Value* pid : nodes.pids) {
    absl::StatusOr<std::shared_ptr<const torch::Storage>> storage = file.GetStorage(*pid);
    UCP_FUZZ_CHECK(storage.ok(), "GetStorage of a validated persistent id: ", storage.status().ToString());
    const std::string& key = pid->pid()->items()[2]->str();
    const torch::ZipRecord* record = zip->Find(absl::StrCat(file.stem(), "/data/", key));
    UCP_FUZZ_CHECK(record != nullptr, "storage '", key, "' has no record");
    const torch::Storage& s = **storage;
    UCP_FUZZ_CHECK(s.nbytes() == record->size, "storage '", key, "' holds ", s.nbytes(), " bytes, its record ",
                   record->size);
    UCP_FUZZ_CHECK(torch::Crc32(0, s.data(), s.nbytes()) == record->crc32, "storage '", key,
                   "' bytes do not have its record's CRC-32");
    const absl::Status verified = file.VerifyStorageCrc(s);
    UCP_FUZZ_CHECK(verified.ok(), "VerifyStorageCrc: ", verified.ToString());
  }
}

// Copies a tree, re-adding every _rebuild_tensor_v2 through a TorchWriter.
class Rewriter {
 public:
  Rewriter(const torch::TorchFile& file, torch::TorchWriter& writer) : file_(file), writer_(writer) {}

  ValuePtr Copy(const ValuePtr& v) {
    if (v == nullptr) return nullptr;
    if (!pickle::IsContainer(v->kind())) return v;  // immutable leaves can be shared with the original
    auto it = copies_.find(v.get());
    if (it != copies_.end()) return it->second;
    ValuePtr copy = CopyContainer(*v);
    copies_.emplace(v.get(), copy);
    return copy;
  }
  // True once a persistent id outside a tensor was replaced by None.
  bool dropped_storage() const { return dropped_storage_; }

 private:
  ValuePtr CopyContainer(const Value& v) {
    switch (v.kind()) {
      case Kind::kTuple:
      case Kind::kList: {
        std::vector<ValuePtr> items;
        for (const ValuePtr& item : v.items()) items.push_back(Copy(item));
        return v.is(Kind::kTuple) ? Value::Tuple(std::move(items)) : Value::List(std::move(items));
      }
      case Kind::kDict: {
        ValuePtr d = Value::MakeDict(v.ordered_dict());
        for (const auto& [key, item] : v.dict_items()) d->DictSet(Copy(key), Copy(item));
        if (v.dict_state() != nullptr) d->set_dict_state(Copy(v.dict_state()));
        return d;
      }
      case Kind::kSet:
      case Kind::kFrozenSet: {
        ValuePtr s = Value::MakeSet(v.is(Kind::kFrozenSet));
        for (const ValuePtr& item : v.set_items()) s->SetAdd(Copy(item));
        return s;
      }
      case Kind::kObject: {
        if (v.IsObjectOf("torch._utils", "_rebuild_tensor_v2")) {
          absl::StatusOr<torch::Tensor> t = file_.GetTensor(v);
          UCP_FUZZ_CHECK(t.ok(), "GetTensor: ", t.status().ToString());
          return writer_.AddTensor(*t);
        }
        const pickle::Object& o = v.object();
        pickle::Object copy;
        copy.callable = Copy(o.callable);
        copy.how = o.how;
        copy.args = Copy(o.args);
        copy.kwargs = Copy(o.kwargs);
        copy.state = Copy(o.state);
        for (const ValuePtr& item : o.list_items) copy.list_items.push_back(Copy(item));
        for (const auto& [key, item] : o.dict_items) copy.dict_items.emplace_back(Copy(key), Copy(item));
        return Value::MakeObject(std::move(copy));
      }
      default:
        // A storage pickled by itself (or a tensor's persistent id reached
        // through another reference): TorchWriter only writes tensors.
        dropped_storage_ = true;
        return Value::None();
    }
  }

  const torch::TorchFile& file_;
  torch::TorchWriter& writer_;
  absl::flat_hash_map<const Value*, ValuePtr> copies_;
  bool dropped_storage_ = false;
};

// Rewrites `file` through TorchWriter and checks what comes back.
void CheckRewrite(const torch::TorchFile& file, const TreeNodes& nodes, bool dump_comparable) {
  torch::TorchWriter writer;
  Rewriter rewriter(file, writer);
  const ValuePtr root = rewriter.Copy(file.root());
  absl::StatusOr<std::string> written = writer.WriteToString("archive", *root);
  if (!written.ok()) {
    UCP_FUZZ_CHECK(written.status().code() == absl::StatusCode::kInvalidArgument && HasValueTheWriterRefuses(*root),
                   "TorchWriter refused a tree TorchFile read: ", written.status().ToString());
    return;
  }
  absl::StatusOr<std::unique_ptr<torch::TorchFile>> again =
      torch::TorchFile::FromBytes(*std::move(written), kRewrittenName, Options(/*verify_crc=*/true));
  UCP_FUZZ_CHECK(again.ok(), "TorchFile refused what TorchWriter wrote: ", again.status().ToString());
  const TreeNodes again_nodes = CollectNodes(*(*again)->root());
  UCP_FUZZ_CHECK(again_nodes.tensors.size() == nodes.tensors.size(), "the rewritten file has ",
                 again_nodes.tensors.size(), " tensors, the original ", nodes.tensors.size());
  absl::flat_hash_map<const torch::Storage*, const torch::Storage*> storage_map, storage_map_back;
  for (size_t i = 0; i < nodes.tensors.size(); ++i) {
    absl::StatusOr<torch::Tensor> a = file.GetTensor(*nodes.tensors[i]);
    absl::StatusOr<torch::Tensor> b = (*again)->GetTensor(*again_nodes.tensors[i]);
    UCP_FUZZ_CHECK(a.ok() && b.ok(), "GetTensor after rewriting: ", a.status().ToString(), " / ",
                   b.status().ToString());
    UCP_FUZZ_CHECK(a->dtype() == b->dtype() && a->sizes() == b->sizes() && a->strides() == b->strides() &&
                       a->storage_offset() == b->storage_offset() && a->requires_grad() == b->requires_grad(),
                   "tensor ", i, " changed its view when rewritten: ", nodes.tensors[i]->DebugString(200));
    const torch::Storage& sa = *a->storage();
    const torch::Storage& sb = *b->storage();
    UCP_FUZZ_CHECK(sa.nbytes() == sb.nbytes() && std::memcmp(sa.data(), sb.data(), sa.nbytes()) == 0,
                   "tensor ", i, "'s storage bytes changed when rewritten");
    // Storage sharing survives: the storages correspond one to one.
    auto [fwd, fwd_new] = storage_map.emplace(&sa, &sb);
    auto [back, back_new] = storage_map_back.emplace(&sb, &sa);
    UCP_FUZZ_CHECK(fwd->second == &sb && back->second == &sa, "storage sharing changed when rewritten (tensor ",
                   i, ")");
  }
  if (!dump_comparable || rewriter.dropped_storage()) return;
  absl::StatusOr<std::string> dump_a = torch::CanonicalDump(file);
  absl::StatusOr<std::string> dump_b = torch::CanonicalDump(**again);
  UCP_FUZZ_CHECK(dump_a.ok() && dump_b.ok(), "CanonicalDump failed: ", dump_a.status().ToString(), " / ",
                 dump_b.status().ToString());
  UCP_FUZZ_CHECK(*dump_a == *dump_b, "the rewritten file dumps differently:\n", *dump_a, "---\n", *dump_b);
}

void FuzzOne(std::string_view input) {
  const std::string bytes = IsArchive(input) ? std::string(input) : WrapPickle(input);

  absl::StatusOr<std::unique_ptr<torch::TorchFile>> eager =
      torch::TorchFile::FromBytes(bytes, kName, Options(/*verify_crc=*/true));
  CheckOpenStatus(eager.status(), "TorchFile::FromBytes (eager CRCs)");
  absl::StatusOr<std::unique_ptr<torch::TorchFile>> lazy =
      torch::TorchFile::FromBytes(bytes, kName, Options(/*verify_crc=*/false));
  CheckOpenStatus(lazy.status(), "TorchFile::FromBytes (lazy CRCs)");
  if (eager.ok()) {
    UCP_FUZZ_CHECK(lazy.ok(), "lazy CRC checks refused what eager ones accept: ", lazy.status().ToString());
  } else if (lazy.ok()) {
    UCP_FUZZ_CHECK(eager.status().code() == absl::StatusCode::kDataLoss &&
                       absl::StrContains(eager.status().message(), "CRC-32 mismatch"),
                   "only eager CRC checks refused the file, but not for a CRC: ", eager.status().ToString());
    const absl::Status all = (*lazy)->VerifyAllCrcs();
    UCP_FUZZ_CHECK(all.code() == absl::StatusCode::kDataLoss, "VerifyAllCrcs missed the mismatch: ",
                   all.ToString());
  }
  if (!eager.ok()) return;
  // With the default policy, a file is refused exactly when its pickle names
  // a code-execution global, and the refusal names it.
  {
    torch::OpenOptions strict = Options(/*verify_crc=*/true);
    strict.refuse_unsafe_globals = true;
    absl::StatusOr<std::unique_ptr<torch::TorchFile>> checked = torch::TorchFile::FromBytes(bytes, kName, strict);
    const auto& unsafe = (*eager)->unsafe_globals();
    UCP_FUZZ_CHECK(checked.ok() == unsafe.empty(), "unsafe globals [", absl::StrJoin(unsafe, ", "),
                   "] but the default open gave ", checked.status().ToString());
    if (!checked.ok()) {
      UCP_FUZZ_CHECK(checked.status().code() == absl::StatusCode::kFailedPrecondition &&
                         absl::StrContains(checked.status().message(), "UNSAFE pickle: it names " + unsafe[0]),
                     "unexpected refusal: ", checked.status().ToString());
    }
  }
  const torch::TorchFile& file = **eager;

  const TreeNodes nodes = CollectNodes(*file.root());
  uint64_t largest_view = 0;
  for (const Value* v : nodes.tensors) {
    absl::StatusOr<torch::Tensor> t = file.GetTensor(*v);
    UCP_FUZZ_CHECK(t.ok(), "GetTensor of a validated tensor: ", t.status().ToString());
    CheckTensor(*t, *v);
    largest_view = std::max<uint64_t>(largest_view, t->nbytes());
  }
  for (size_t i = 0; i < nodes.objects.size() && i < 8; ++i) {
    absl::StatusOr<torch::Tensor> t = file.GetTensor(*nodes.objects[i]);
    UCP_FUZZ_CHECK(t.status().code() == absl::StatusCode::kInvalidArgument,
                   "GetTensor accepted a non-tensor object: ", nodes.objects[i]->DebugString(200));
  }
  CheckStorages(file, nodes, absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));

  const bool dump_comparable = largest_view <= kMaxDumpViewBytes &&
                               ExpandedSize(*file.root(), kMaxDumpNodes) <= kMaxDumpNodes &&
                               RoundTripsExactly(*file.root());
  CheckRewrite(file, nodes, dump_comparable);
}

}  // namespace
}  // namespace ucp::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ucp::fuzz::FuzzOne(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
