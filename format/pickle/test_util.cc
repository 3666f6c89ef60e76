#include "format/pickle/test_util.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace ucp::pickle::testing {
namespace {

const char* HowName(const Object& o) {
  switch (o.how) {
    case ObjectHow::kReduce:
    case ObjectHow::kInst:
      return "reduce";
    case ObjectHow::kNewObj:
      return "newobj";
    case ObjectHow::kNewObjEx:
      return o.kwargs != nullptr && !o.kwargs->dict_items().empty() ? "newobj_ex" : "newobj";
  }
  return "?";
}

std::string CanonicalOrNull(const ValuePtr& v) { return v == nullptr ? "null" : CanonicalRepr(*v); }

std::string Pairs(const std::vector<std::pair<ValuePtr, ValuePtr>>& pairs) {
  std::vector<std::string> parts;
  for (const auto& [k, v] : pairs) parts.push_back(absl::StrCat(CanonicalOrNull(k), ":", CanonicalOrNull(v)));
  return absl::StrJoin(parts, ",");
}

std::string Items(const std::vector<ValuePtr>& items, bool sorted) {
  std::vector<std::string> parts;
  for (const ValuePtr& item : items) parts.push_back(CanonicalOrNull(item));
  if (sorted) std::sort(parts.begin(), parts.end());
  return absl::StrJoin(parts, ",");
}

uint32_t Le32(const std::string& b, size_t at) {
  uint32_t x = 0;
  for (int i = 0; i < 4; ++i) x |= static_cast<uint32_t>(static_cast<uint8_t>(b[at + i])) << (8 * i);
  return x;
}
uint16_t Le16(const std::string& b, size_t at) {
  return static_cast<uint16_t>(static_cast<uint8_t>(b[at]) | (static_cast<uint8_t>(b[at + 1]) << 8));
}
uint64_t Le64(const std::string& b, size_t at) {
  return static_cast<uint64_t>(Le32(b, at)) | (static_cast<uint64_t>(Le32(b, at + 4)) << 32);
}

bool IsDir(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

std::string Hex(std::string_view bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) {
    out.push_back(kDigits[static_cast<uint8_t>(c) >> 4]);
    out.push_back(kDigits[static_cast<uint8_t>(c) & 15]);
  }
  return out;
}

std::string CanonicalRepr(const Value& v) {
  switch (v.kind()) {
    case Kind::kNone: return "N";
    case Kind::kBool: return v.bool_value() ? "T" : "F";
    case Kind::kInt: return "i" + Hex(v.big_int_bytes());
    case Kind::kFloat: {
      const double d = v.float_value();
      if (std::isnan(d)) return "fnan";
      std::string bits(8, '\0');
      std::memcpy(bits.data(), &d, 8);
      return "f" + Hex(bits);
    }
    case Kind::kStr: return "s" + Hex(v.str());
    case Kind::kBytes: return "b" + Hex(v.str());
    case Kind::kByteArray: return "B" + Hex(v.str());
    case Kind::kTuple: return "(" + Items(v.items(), false) + ")";
    case Kind::kList: return "[" + Items(v.items(), false) + "]";
    case Kind::kDict: {
      std::string out = absl::StrCat(v.ordered_dict() ? "O{" : "{", Pairs(v.dict_items()), "}");
      // An empty attribute dict leaves no trace in Python (vars() is empty).
      const ValuePtr& state = v.dict_state();
      if (state != nullptr && !(state->is(Kind::kDict) && state->dict_items().empty())) {
        absl::StrAppend(&out, "~", CanonicalRepr(*state));
      }
      return out;
    }
    case Kind::kSet: return "S{" + Items(v.set_items(), true) + "}";
    case Kind::kFrozenSet: return "Z{" + Items(v.set_items(), true) + "}";
    case Kind::kGlobal: return absl::StrCat("G", v.module(), ":", v.name());
    case Kind::kObject: {
      const Object& o = v.object();
      const std::string how = HowName(o);
      return absl::StrCat("@", how, "(", CanonicalOrNull(o.callable), ";", CanonicalOrNull(o.args), ";",
                          how == "newobj_ex" ? CanonicalRepr(*o.kwargs) : "-", ";",
                          o.state == nullptr ? "-" : CanonicalRepr(*o.state), ";[", Items(o.list_items, false),
                          "];{", Pairs(o.dict_items), "})");
    }
    case Kind::kPersistentId: return "P(" + CanonicalOrNull(v.pid()) + ")";
  }
  return "?";
}

ValuePtr Obj(ValuePtr callable, ObjectHow how, std::vector<ValuePtr> args, ValuePtr state) {
  Object o;
  o.callable = std::move(callable);
  o.how = how;
  o.args = Value::Tuple(std::move(args));
  o.state = std::move(state);
  return Value::MakeObject(std::move(o));
}

std::string MakeTempDir(std::string_view prefix) {
  const char* base = getenv("TEST_TMPDIR");
  std::string pattern = absl::StrCat(base != nullptr ? base : "/tmp", "/", std::string(prefix), "XXXXXX");
  char* made = mkdtemp(pattern.data());
  return made != nullptr ? std::string(made) : std::string();
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != ".." && !IsDir(dir + "/" + name)) names.push_back(name);
    }
    closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

absl::StatusOr<std::string> RunPython(const std::vector<std::string>& args) {
  std::string command = "/usr/bin/python3 -I";
  for (const std::string& arg : args) absl::StrAppend(&command, " '", arg, "'");
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return absl::InternalError(absl::StrCat("cannot run ", command));
  std::string output;
  char buffer[1 << 16];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) output.append(buffer, n);
  const int status = pclose(pipe);
  if (status != 0) {
    return absl::InternalError(absl::StrCat(command, " exited with status ", WEXITSTATUS(status), "; stdout: ",
                                            output.substr(0, 2000)));
  }
  return output;
}

std::string InteropScript() { return "format/pickle/testdata/pickle_interop.py"; }

std::map<std::string, std::string> ParseTabbedLines(std::string_view output) {
  std::map<std::string, std::string> lines;
  for (absl::string_view line : absl::StrSplit(absl::string_view(output.data(), output.size()), '\n')) {
    const size_t tab = line.find('\t');
    if (tab == absl::string_view::npos) continue;
    lines[std::string(line.substr(0, tab))] = std::string(line.substr(tab + 1));
  }
  return lines;
}

absl::StatusOr<std::string> FixturesDir() {
  std::vector<std::string> candidates = {"external/shared/fixtures/deepspeed-0.14.4"};
  if (const char* srcdir = getenv("TEST_SRCDIR")) {
    candidates.push_back(absl::StrCat(srcdir, "/ucp/external/shared/fixtures/deepspeed-0.14.4"));
    candidates.push_back(absl::StrCat(srcdir, "/shared/fixtures/deepspeed-0.14.4"));
  }
  for (const std::string& c : candidates) {
    if (IsDir(c)) return c;
  }
  return absl::NotFoundError("fixtures not found in the runfiles (data = [\"@shared//:fixtures\"])");
}

std::vector<std::string> FindFiles(const std::string& dir, std::string_view suffix) {
  std::vector<std::string> found;
  std::vector<std::string> todo = {dir};
  while (!todo.empty()) {
    const std::string d = todo.back();
    todo.pop_back();
    DIR* handle = opendir(d.c_str());
    if (handle == nullptr) continue;
    while (dirent* e = readdir(handle)) {
      const std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      const std::string path = d + "/" + name;
      if (IsDir(path)) {
        todo.push_back(path);
      } else if (name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
        found.push_back(path);
      }
    }
    closedir(handle);
  }
  std::sort(found.begin(), found.end());
  return found;
}

absl::StatusOr<std::string> ReadStoredZipMember(const std::string& zip, std::string_view suffix) {
  // End of central directory: signature 0x06054b50 in the last 64 KiB + 22 bytes.
  if (zip.size() < 22) return absl::DataLossError("too short for a zip");
  const size_t lowest = zip.size() > 65535 + 22 ? zip.size() - 65535 - 22 : 0;
  size_t eocd = std::string::npos;
  for (size_t i = zip.size() - 22 + 1; i-- > lowest;) {
    if (Le32(zip, i) == 0x06054b50) {
      eocd = i;
      break;
    }
  }
  if (eocd == std::string::npos) return absl::DataLossError("no end of central directory");
  uint64_t entries = Le16(zip, eocd + 10);
  uint64_t offset = Le32(zip, eocd + 16);
  if (offset == 0xffffffff || entries == 0xffff) {  // zip64: a locator just before the EOCD
    if (eocd < 20 || Le32(zip, eocd - 20) != 0x07064b50) return absl::DataLossError("no zip64 locator");
    const uint64_t record = Le64(zip, eocd - 20 + 8);
    if (record + 56 > zip.size() || Le32(zip, record) != 0x06064b50) return absl::DataLossError("bad zip64 EOCD");
    entries = Le64(zip, record + 32);
    offset = Le64(zip, record + 48);
  }
  for (uint64_t e = 0; e < entries; ++e) {
    if (offset + 46 > zip.size() || Le32(zip, offset) != 0x02014b50) {
      return absl::DataLossError("bad central directory entry");
    }
    const uint16_t method = Le16(zip, offset + 10);
    uint64_t compressed = Le32(zip, offset + 20);
    uint64_t size = Le32(zip, offset + 24);
    const uint16_t name_len = Le16(zip, offset + 28);
    const uint16_t extra_len = Le16(zip, offset + 30);
    const uint16_t comment_len = Le16(zip, offset + 32);
    uint64_t local = Le32(zip, offset + 42);
    if (offset + 46 + name_len + extra_len > zip.size()) return absl::DataLossError("bad central directory entry");
    const std::string name = zip.substr(offset + 46, name_len);
    // The zip64 extra field (id 1) holds, in order, the fields that are 0xffffffff.
    const size_t extra_end = offset + 46 + name_len + extra_len;
    for (size_t x = offset + 46 + name_len; x + 4 <= extra_end;) {
      const uint16_t id = Le16(zip, x);
      const uint16_t len = Le16(zip, x + 2);
      if (id == 1) {
        size_t at = x + 4;
        if (size == 0xffffffff) size = Le64(zip, at), at += 8;
        if (compressed == 0xffffffff) compressed = Le64(zip, at), at += 8;
        if (local == 0xffffffff) local = Le64(zip, at);
      }
      x += 4 + len;
    }
    if (name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      if (method != 0 || compressed != size) return absl::UnimplementedError(absl::StrCat(name, " is compressed"));
      if (local + 30 > zip.size() || Le32(zip, local) != 0x04034b50) return absl::DataLossError("bad local header");
      const uint64_t data = local + 30 + Le16(zip, local + 26) + Le16(zip, local + 28);
      if (data + size > zip.size()) return absl::DataLossError(absl::StrCat(name, " extends past the end"));
      return zip.substr(data, size);
    }
    offset = extra_end + comment_len;
  }
  return absl::NotFoundError(absl::StrCat("no member ending with ", std::string(suffix)));
}

}  // namespace ucp::pickle::testing
