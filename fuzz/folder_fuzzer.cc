// libFuzzer target over whole DeepSpeed checkpoint folders: the ZeRO readers
// (formats/deepspeed_zero/zero_checkpoint.h with its cross-file checks) and `ucp verify`
// (formats/verify.h) on folders derived from the real DeepSpeed fixtures.
//
// A folder is megabytes of tensors, too much to mutate as one input, so an
// input is a fixture choice plus edits of it, which the harness applies to a
// fresh copy before reading it:
//   byte 0            which fixture (modulo the fixtures found)
//   then edits, each  kind (1 byte), file (1 byte, modulo the files of the
//                     folder, sorted), length (2 bytes LE), payload:
//     kind % 6 == 0   payload replaces the file's data.pkl (the archive is
//                     rebuilt around it with valid CRCs, so pickle mutations
//                     reach the readers past the zip checks)
//     1               payload = offset (4 bytes LE) + bytes written there
//     2               payload = new size (4 bytes LE): truncate (or extend)
//     3               the file is deleted
//     4               payload becomes `latest` at the root
//     5               the file is swapped with file payload[0]
// Seeds (fuzz/seeds/folder, fuzz/make_folder_seeds.py) are each fixture
// unchanged and each kind of file with its own data.pkl put back.
//
// For every input: ZeroCheckpoint::Open of the root (through `latest`); on
// success every param's fp32 and optimizer-state pieces on every rank
// holding it and every module tensor (which opens and checks every optimizer
// and layer file); then VerifyFolder (every file, every CRC, the cross-file
// checks, unsafe pickles). Each must return (no crash, hang or sanitizer
// report), errors with a message, and VerifyFolder must report a problem
// whenever Open failed. (`ucp inspect` of a folder runs the same readers.)
//
// Fixtures: $UCP_FUZZ_FIXTURES (default ../shared/fixtures/deepspeed-0.14.4,
// from the project root). Scratch: $UCP_FUZZ_TMP (default /dev/shm).
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/fs.h"
#include "format/torch/torch_file.h"
#include "format/torch/zip.h"
#include "fuzz/fuzz_checks.h"
#include "ops/inspect.h"
#include "formats/deepspeed_zero/zero_checkpoint.h"

namespace {

using ucp::JoinPath;

struct Fixture {
  std::string base;                // pristine copy: BASE/ck/global_step4/...
  std::vector<std::string> files;  // names in the tag folder, sorted
};

std::vector<Fixture>* fixtures = nullptr;
std::string scratch;

std::string ReadAll(const std::string& path) {
  auto s = ucp::ReadFileToString(path);
  return s.ok() ? *s : std::string();
}

void Init() {
  std::vector<std::string> candidates;
  if (const char* fx = std::getenv("UCP_FUZZ_FIXTURES")) candidates.push_back(fx);
  if (const char* src = std::getenv("TEST_SRCDIR")) {
    candidates.push_back(JoinPath(src, "shared/fixtures/deepspeed-0.14.4"));
  }
  candidates.push_back("external/shared/fixtures/deepspeed-0.14.4");
  candidates.push_back("../shared/fixtures/deepspeed-0.14.4");
  std::string root = candidates.back();
  for (const auto& c : candidates) {
    if (ucp::IsDirectory(c)) {
      root = c;
      break;
    }
  }
  const char* tmp = std::getenv("UCP_FUZZ_TMP");
  if (tmp == nullptr) tmp = std::getenv("TEST_TMPDIR");
  scratch = JoinPath(tmp != nullptr ? tmp : "/dev/shm", absl::StrCat("ucp-folder-fuzz-", getpid()));
  (void)ucp::RemoveTree(scratch);
  std::atexit([] { (void)ucp::RemoveTree(scratch); });  // libFuzzer ends with exit()
  fixtures = new std::vector<Fixture>();
  for (const char* name : {"neox-tp2-pp1-dp2", "neox-tp1-pp2-dp1", "gpt-zero2-nopipe-tp2-dp2",
                           "neox-bf16-tp2-pp1-dp2"}) {
    const std::string src = JoinPath(JoinPath(root, name), "global_step4");
    if (!ucp::IsDirectory(src)) continue;
    Fixture f;
    f.base = JoinPath(scratch, absl::StrCat("base", fixtures->size()));
    const std::string tag = JoinPath(f.base, "ck/global_step4");
    if (!ucp::CopyTree(src, tag).ok()) continue;
    auto names = ucp::ListDirectory(tag);
    if (!names.ok()) continue;
    f.files = *names;
    fixtures->push_back(std::move(f));
  }
  if (fixtures->empty()) {
    fprintf(stderr, "folder_fuzzer: no fixtures under %s (set UCP_FUZZ_FIXTURES)\n", root.c_str());
    abort();
  }
}

uint32_t Le32(const uint8_t* p) { return p[0] | p[1] << 8 | p[2] << 16 | static_cast<uint32_t>(p[3]) << 24; }

// The archive `bytes` with its data.pkl replaced (every other record kept),
// or `bytes` unchanged when it does not parse as an archive.
std::string WithPickle(const std::string& bytes, const std::string& pkl) {
  ucp::torch::ZipReadOptions o;
  o.crc = ucp::torch::ZipReadOptions::Crc::kLazy;
  auto zip = ucp::torch::ZipReader::Open(
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), "f", o);
  if (!zip.ok()) return bytes;
  std::string out;
  ucp::torch::StringSink sink(&out);
  ucp::torch::ZipWriter w(&sink, "f");
  for (const auto& r : zip->records()) {
    auto data = zip->Read(r.name);
    if (!data.ok()) return bytes;
    const bool is_pkl = r.name.size() >= 9 && r.name.compare(r.name.size() - 9, 9, "/data.pkl") == 0;
    absl::Status s = is_pkl ? w.AddRecord(r.name, pkl) : w.AddRecord(r.name, *data);
    if (!s.ok()) return bytes;
  }
  if (!w.Finish().ok()) return bytes;
  return out;
}

void Exercise(const std::string& root) {
  // The readers as convert uses them: every piece of every param, every
  // module tensor (each optimizer and layer file opens and is checked then).
  auto c = ucp::deepspeed_zero::ZeroCheckpoint::Open(root);
  if (c.ok()) {
    const auto& ck = **c;
    const auto& t = ck.topology();
    UCP_FUZZ_CHECK(t.tp >= 1 && t.pp >= 1 && t.dp >= 1, "topology ", t.ToString());
    std::vector<std::string> states = {"fp32"};
    for (const auto& k : ck.state_keys()) states.push_back(k);
    for (const auto& p : ck.params()) {
      for (int s : p.stages) {
        for (int r = 0; r < t.tp; ++r) {
          for (const auto& st : states) (void)ck.SlicePieces(p, s, r, st);
        }
      }
    }
    for (const auto& e : ck.module_entries()) {
      for (int r = 0; r < t.tp; ++r) (void)ck.ModuleTensor(e, r);
    }
  } else {
    UCP_FUZZ_CHECK(!c.status().message().empty(), "an error without a message");
  }
  // ucp verify: every file, every CRC, the cross-file checks; a folder that
  // does not open always has a problem.
  const ucp::formats::VerifyResult v = ucp::ops::Verify(root);
  if (!c.ok()) UCP_FUZZ_CHECK(!v.problems.empty(), "verify found nothing in a folder that does not open: ", c.status().ToString());
  for (const auto& p : v.problems) UCP_FUZZ_CHECK(!p.empty(), "an empty problem line");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (fixtures == nullptr) Init();
  if (size < 1) return 0;
  const Fixture& fx = (*fixtures)[data[0] % fixtures->size()];
  const std::string base_tag = JoinPath(fx.base, "ck/global_step4");
  // The edited files, in memory; the others are hard links to the base.
  std::map<std::string, std::string> edited;
  std::vector<std::string> names = fx.files;
  std::vector<bool> deleted(names.size(), false);
  std::string latest = "global_step4";
  auto content = [&](size_t i) -> std::string& {
    auto it = edited.find(names[i]);
    if (it == edited.end()) it = edited.emplace(names[i], ReadAll(JoinPath(base_tag, names[i]))).first;
    return it->second;
  };
  size_t pos = 1;
  int edits = 0;
  while (pos + 4 <= size && edits < 16) {
    const uint8_t kind = data[pos] % 6;
    const size_t file = data[pos + 1] % names.size();
    const size_t len = std::min<size_t>(data[pos + 2] | data[pos + 3] << 8, size - pos - 4);
    const uint8_t* p = data + pos + 4;
    pos += 4 + len;
    ++edits;
    switch (kind) {
      case 0:
        content(file) = WithPickle(content(file), std::string(reinterpret_cast<const char*>(p), len));
        break;
      case 1:
        if (len >= 4) {
          std::string& c = content(file);
          const size_t at = Le32(p) % (c.size() + 1);
          for (size_t k = 4; k < len && at + k - 4 < c.size(); ++k) c[at + k - 4] = static_cast<char>(p[k]);
        }
        break;
      case 2:
        if (len >= 4) content(file).resize(std::min<size_t>(Le32(p), size_t{4} << 20));
        break;
      case 3:
        deleted[file] = true;
        break;
      case 4:
        latest.assign(reinterpret_cast<const char*>(p), len);
        break;
      case 5:
        if (len >= 1) std::swap(names[file], names[p[0] % names.size()]);
        break;
    }
  }
  // The folder: scratch/w/ck/{latest, global_step4/...}.
  const std::string root = JoinPath(scratch, "w/ck");
  const std::string tag = JoinPath(root, "global_step4");
  (void)ucp::RemoveTree(JoinPath(scratch, "w"));
  UCP_FUZZ_CHECK(ucp::MakeDirs(tag).ok(), "cannot create ", tag);
  UCP_FUZZ_CHECK(ucp::WriteFileAtomic(JoinPath(root, "latest"), latest).ok(), "cannot write latest");
  for (size_t i = 0; i < names.size(); ++i) {
    if (deleted[i]) continue;
    const std::string dst = JoinPath(tag, fx.files[i]);  // names[i]'s bytes under slot i's name
    auto it = edited.find(names[i]);
    if (it != edited.end()) {
      UCP_FUZZ_CHECK(ucp::WriteFileAtomic(dst, it->second).ok(), "cannot write ", dst);
    } else {
      UCP_FUZZ_CHECK(link(JoinPath(base_tag, names[i]).c_str(), dst.c_str()) == 0, "cannot link ", dst);
    }
  }
  Exercise(root);
  return 0;
}
