#include "fuzz/fuzz_checks.h"

#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "format/pickle/reader.h"
#include "format/pickle/writer.h"

namespace ucp::fuzz {

void FailInvariant(const char* file, int line, const char* condition, const std::string& message) {
  std::fprintf(stderr, "%s:%d: fuzz invariant failed: %s: %s\n", file, line, condition, message.c_str());
  std::fflush(stderr);
  std::abort();
}

uint64_t ExpandedSize(const pickle::Value& root, uint64_t cap) {
  constexpr uint64_t kInProgress = UINT64_MAX;
  // Node -> expanded size of its subtree (saturated at cap + 1).
  absl::flat_hash_map<const pickle::Value*, uint64_t> size;
  std::vector<std::pair<const pickle::Value*, bool>> todo = {{&root, false}};
  while (!todo.empty()) {
    auto [v, expanded] = todo.back();
    todo.pop_back();
    if (!expanded) {
      auto [it, inserted] = size.emplace(v, kInProgress);
      if (!inserted) {
        UCP_FUZZ_CHECK(it->second != kInProgress, "the reader returned a cyclic tree at ", v->DebugString(80));
        continue;
      }
      todo.push_back({v, true});
      ForEachChild(*v, [&](const pickle::ValuePtr& child) {
        if (child == nullptr) return;
        auto c = size.find(child.get());
        UCP_FUZZ_CHECK(c == size.end() || c->second != kInProgress, "the reader returned a cyclic tree at ",
                       child->DebugString(80));
        if (c == size.end()) todo.push_back({child.get(), false});
      });
      continue;
    }
    uint64_t total = 1;
    ForEachChild(*v, [&](const pickle::ValuePtr& child) {
      if (child == nullptr) return;
      total += size[child.get()];
      if (total > cap) total = cap + 1;
    });
    size[v] = total;
  }
  return size[&root];
}

namespace {

// UTF-8 as CPython's 'surrogatepass' reads it: shortest forms up to
// U+10FFFF, surrogates included.
bool IsUtf8AllowingSurrogates(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const uint8_t b0 = static_cast<uint8_t>(s[i]);
    size_t len;
    uint32_t code_point, min;
    if (b0 < 0x80) {
      ++i;
      continue;
    } else if ((b0 & 0xe0) == 0xc0) {
      len = 2, min = 0x80, code_point = b0 & 0x1f;
    } else if ((b0 & 0xf0) == 0xe0) {
      len = 3, min = 0x800, code_point = b0 & 0x0f;
    } else if ((b0 & 0xf8) == 0xf0) {
      len = 4, min = 0x10000, code_point = b0 & 0x07;
    } else {
      return false;
    }
    if (s.size() - i < len) return false;
    for (size_t k = 1; k < len; ++k) {
      const uint8_t b = static_cast<uint8_t>(s[i + k]);
      if ((b & 0xc0) != 0x80) return false;
      code_point = (code_point << 6) | (b & 0x3f);
    }
    if (code_point < min || code_point > 0x10ffff) return false;
    i += len;
  }
  return true;
}

}  // namespace

bool HasValueTheWriterRefuses(const pickle::Value& root) {
  absl::flat_hash_set<const pickle::Value*> seen;
  std::vector<const pickle::Value*> todo = {&root};
  while (!todo.empty()) {
    const pickle::Value* v = todo.back();
    todo.pop_back();
    if (!seen.insert(v).second) continue;
    if (v->is(pickle::Kind::kStr) && !IsUtf8AllowingSurrogates(v->str())) return true;
    if (v->is(pickle::Kind::kGlobal) &&
        (v->module().find('\n') != std::string::npos || v->name().find('\n') != std::string::npos)) {
      return true;
    }
    ForEachChild(*v, [&](const pickle::ValuePtr& child) {
      if (child != nullptr) todo.push_back(child.get());
    });
  }
  return false;
}

bool RoundTripsExactly(const pickle::Value& root) {
  absl::flat_hash_set<const pickle::Value*> seen;
  absl::flat_hash_set<std::pair<std::string, std::string>> stable_globals;
  std::vector<const pickle::Value*> todo = {&root};
  while (!todo.empty()) {
    const pickle::Value* v = todo.back();
    todo.pop_back();
    if (!seen.insert(v).second) continue;
    if (v->is(pickle::Kind::kObject) && v->object().how == pickle::ObjectHow::kInst) return false;
    if (v->is(pickle::Kind::kGlobal)) {
      auto name = std::make_pair(v->module(), v->name());
      if (!stable_globals.contains(name)) {
        absl::StatusOr<std::string> bytes = pickle::Pickle(*v);
        if (!bytes.ok()) return false;
        absl::StatusOr<pickle::ValuePtr> back = pickle::Unpickle(*bytes);
        if (!back.ok() || !(*back)->is(pickle::Kind::kGlobal) || (*back)->module() != name.first ||
            (*back)->name() != name.second) {
          return false;
        }
        stable_globals.insert(std::move(name));
      }
    }
    ForEachChild(*v, [&](const pickle::ValuePtr& child) {
      if (child != nullptr) todo.push_back(child.get());
    });
  }
  return true;
}

void CheckErrorStatus(const absl::Status& status, std::initializer_list<absl::StatusCode> codes,
                      const std::string& prefix, const char* what) {
  if (status.ok()) return;
  bool allowed = false;
  for (absl::StatusCode code : codes) allowed = allowed || status.code() == code;
  UCP_FUZZ_CHECK(allowed, what, " failed with an undocumented status code: ", status.ToString());
  UCP_FUZZ_CHECK(absl::StartsWith(status.message(), prefix), what, " error does not start with '", prefix,
                 "': ", status.ToString());
}

}  // namespace ucp::fuzz
