#include "readers/verify.h"

#include <cstring>
#include <map>
#include <memory>
#include <set>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/fs.h"
#include "deepspeed/checkpoint_files.h"
#include "format/torch/mapped_file.h"
#include "format/torch/torch_file.h"
#include "google/protobuf/text_format.h"
#include "readers/inspect.h"
#include "readers/moe_state.h"
#include "readers/universal_checkpoint.h"
#include "readers/zero3_state.h"
#include "readers/zero_checkpoint.h"

namespace ucp::readers {
namespace {

using pickle::Kind;
using pickle::Value;

std::string StatusLine(const absl::Status& s) { return std::string(s.message()); }

// A step value as text: a 0-dim tensor by value, anything else as Python.
std::string StepText(const torch::TorchFile& f, const Value& v) {
  const Value* x = &v;
  if (v.is(Kind::kDict)) {
    const Value* p = v.DictGet("param");
    if (p == nullptr) p = v.DictGet("step");
    if (p != nullptr) x = p;
  }
  if (torch::TorchFile::IsTensor(*x)) {
    auto t = f.GetTensor(*x);
    if (!t.ok() || t->numel() != 1) return x->DebugString(60);
    const std::string b = t->ContiguousBytes();
    if (t->dtype() == torch::DType::kFloat32 && b.size() == 4) {
      float y;
      std::memcpy(&y, b.data(), 4);
      return absl::StrCat(y);
    }
    if (t->dtype() == torch::DType::kInt64 && b.size() == 8) {
      int64_t y;
      std::memcpy(&y, b.data(), 8);
      return absl::StrCat(y);
    }
    return absl::StrCat(std::string(torch::DTypeName(t->dtype())), ":", absl::BytesToHexString(b));
  }
  return x->DebugString(60);
}

void VerifyZero(const std::string& path, VerifyResult& r) {
  r.kind = "zero";
  absl::StatusOr<std::unique_ptr<ZeroCheckpoint>> opened = ZeroCheckpoint::Open(path);
  if (!opened.ok()) {
    r.problems.push_back(StatusLine(opened.status()));
    return;
  }
  const ZeroCheckpoint& c = **opened;
  r.dir = c.dir();
  const deepspeed::Topology& t = c.topology();
  r.files_checked += t.mp_world_size();  // opened and CRC-checked by Open
  for (int s = 0; s < t.pp; ++s) {
    for (int tp = 0; tp < t.tp; ++tp) {
      for (int d = 0; d < t.dp; ++d) {
        ++r.files_checked;
        absl::Status st = c.VerifyFile(c.OptimPath(s, tp, d));
        if (!st.ok()) r.problems.push_back(StatusLine(st));
      }
    }
  }
  for (int layer : c.layer_files()) {
    for (int tp = 0; tp < t.tp; ++tp) {
      ++r.files_checked;
      absl::StatusOr<const torch::TorchFile*> f = c.LayerFile(layer, tp);
      absl::Status st = f.ok() ? (*f)->VerifyAllCrcs() : f.status();
      if (!st.ok()) r.problems.push_back(StatusLine(st));
    }
  }
}

// ZeRO-3 and native MoE folders: Open checks the files' agreement (steps,
// partitions, expert layout); every input file is then parsed with its CRCs.
void VerifySliced(const std::string& path, const char* kind, VerifyResult& r,
                  absl::StatusOr<std::unique_ptr<deepspeed::SlicedState>> opened) {
  r.kind = kind;
  if (!opened.ok()) {
    r.problems.push_back(StatusLine(opened.status()));
    return;
  }
  const deepspeed::SlicedState& s = **opened;
  r.dir = s.dir();
  for (const std::string& f : s.InputFiles()) {
    ++r.files_checked;
    absl::Status st = s.VerifyInput(f);
    if (!st.ok()) r.problems.push_back(StatusLine(st));
  }
}

template <typename State>
absl::StatusOr<std::unique_ptr<deepspeed::SlicedState>> OpenSliced(const std::string& path) {
  absl::StatusOr<std::unique_ptr<State>> s = State::Open(path);
  if (!s.ok()) return s.status();
  return std::unique_ptr<deepspeed::SlicedState>(std::move(*s));
}

void VerifyUniversal(const std::string& path, VerifyResult& r) {
  r.kind = "universal";
  absl::StatusOr<std::unique_ptr<UniversalCheckpoint>> opened = UniversalCheckpoint::Open(path);
  if (!opened.ok()) {
    r.problems.push_back(StatusLine(opened.status()));
    return;
  }
  const UniversalCheckpoint& u = **opened;
  r.dir = u.dir();
  if (u.manifest()) {
    absl::Status st = u.VerifyChecksums();
    if (!st.ok()) r.problems.push_back(StatusLine(st));
  }
  std::map<std::string, std::string> first_step;  // step text -> the first param with it
  for (const std::string& name : u.param_names()) {
    for (const std::string& s : u.StateFiles(name)) {
      ++r.files_checked;
      if (s == "step") {
        absl::StatusOr<std::shared_ptr<const torch::TorchFile>> f = u.ReadStep(name);
        if (!f.ok()) {
          r.problems.push_back(StatusLine(f.status()));
        } else if (*f) {
          first_step.emplace(StepText(**f, *(*f)->root()), name);
        }
        continue;
      }
      absl::StatusOr<UniversalStateFile> f = u.ReadState(name, s);
      if (!f.ok()) r.problems.push_back(StatusLine(f.status()));
    }
  }
  if (first_step.size() > 1) {
    std::string line = absl::StrCat(JoinPath(u.dir(), deepspeed::kUniversalZeroDir),
                                    ": the params' step.pt disagree (files from different saves):");
    for (const auto& [step, name] : first_step) absl::StrAppend(&line, " step ", step, " in ", name, "/step.pt;");
    r.problems.push_back(line);
  }
  for (const std::string& name : u.module_names()) {
    ++r.files_checked;
    absl::StatusOr<UniversalStateFile> f = u.ReadModule(name);
    if (!f.ok()) r.problems.push_back(StatusLine(f.status()));
  }
}

// DeepSpeed's ZeRO-3 universal layout (zero_pp_rank_* model states beside
// zero/: what `ucp convert` writes for a ZeRO-3 source and ucp does not read
// back): the manifest's digests when there is one, every .pt file's CRCs.
void VerifyZero3Universal(const std::string& path, VerifyResult& r) {
  r.kind = "universal (ZeRO-3)";
  const std::string manifest_path = JoinPath(path, deepspeed::kManifestFile);
  if (PathExists(manifest_path)) {
    absl::StatusOr<std::string> text = ReadFileToString(manifest_path);
    Manifest m;
    if (!text.ok()) {
      r.problems.push_back(StatusLine(text.status()));
    } else if (!google::protobuf::TextFormat::ParseFromString(*text, &m)) {
      r.problems.push_back(absl::StrCat(manifest_path, ": not a valid ucp manifest"));
    } else if (absl::Status st = VerifyManifestDigests(path, m); !st.ok()) {
      r.problems.push_back(StatusLine(st));
    }
  }
  std::vector<std::string> todo = {path};
  while (!todo.empty()) {
    const std::string dir = todo.back();
    todo.pop_back();
    absl::StatusOr<std::vector<std::string>> names = ListDirectory(dir);
    if (!names.ok()) {
      r.problems.push_back(StatusLine(names.status()));
      continue;
    }
    for (const std::string& n : *names) {
      const std::string p = JoinPath(dir, n);
      if (IsDirectory(p)) {
        todo.push_back(p);
      } else if (absl::EndsWith(n, ".pt")) {
        ++r.files_checked;
        absl::StatusOr<std::unique_ptr<torch::TorchFile>> f = torch::TorchFile::Open(p);
        absl::Status st = f.ok() ? (*f)->VerifyAllCrcs() : f.status();
        if (!st.ok()) r.problems.push_back(StatusLine(st));
      }
    }
  }
}

}  // namespace

VerifyResult VerifyFolder(const std::string& path) {
  VerifyResult r;
  r.dir = path;
  if (!IsDirectory(path)) {
    r.problems.push_back(absl::StrCat(path, ": not a folder"));
    return r;
  }
  const bool universal = LooksLikeUniversalFolder(path);
  // Unsafe pickles are problems; the rest of the folder is still checked.
  std::string dir = path;
  const char* latest = universal ? deepspeed::kLatestUniversalFile : deepspeed::kLatestFile;
  if (!IsDirectory(JoinPath(path, deepspeed::kUniversalZeroDir)) && PathExists(JoinPath(path, latest)) &&
      !PathExists(JoinPath(path, deepspeed::MpRankFileName(0)))) {
    absl::StatusOr<std::string> tag = ReadLatestTag(path, latest);
    if (!tag.ok()) {
      r.problems.push_back(StatusLine(tag.status()));
      return r;
    }
    dir = JoinPath(path, *tag);
  }
  for (const std::string& u : ScanUnsafeGlobals(dir)) {
    r.problems.push_back(absl::StrCat(u, ": UNSAFE pickle global (code torch.load would run)"));
  }
  const bool allowed = torch::AllowUnsafePickles();
  torch::SetAllowUnsafePickles(true);  // reported above; check the rest too
  if (universal && IsZero3Folder(path)) {
    VerifyZero3Universal(path, r);
  } else if (universal) {
    VerifyUniversal(path, r);
  } else if (IsZero3Folder(path)) {
    VerifySliced(path, "zero3", r, OpenSliced<Zero3State>(path));
  } else if (IsMoeFolder(path)) {
    VerifySliced(path, "moe", r, OpenSliced<MoeState>(path));
  } else {
    VerifyZero(path, r);
  }
  torch::SetAllowUnsafePickles(allowed);
  absl::Status intact = torch::MappedFile::CheckAllIntact();
  if (!intact.ok()) r.problems.push_back(StatusLine(intact));
  return r;
}

}  // namespace ucp::readers
