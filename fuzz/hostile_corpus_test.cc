// Runs every file of testdata/hostile/ through the reader its `.expect` names
// and checks the exact absl::StatusCode and a message substring (the format
// is described in testdata/hostile/make_hostile.py). Pickle-only cases go to
// ucp::pickle::Unpickle; archive cases to TorchFile::Open and
// TorchFile::FromBytes, which must agree. A file without an expectation, or
// an expectation without its file, fails the test, so the corpus cannot
// silently grow untested.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "format/pickle/reader.h"
#include "format/pickle/value.h"
#include "format/torch/torch_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ucp {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kCorpus[] = "testdata/hostile";
constexpr char kExpectSuffix[] = ".expect";
// The corpus has 39 cases; fewer means files went missing from the runfiles.
constexpr size_t kMinCases = 39;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// One parsed `.expect` file.
struct Expectation {
  std::string reader;  // "pickle" or "torch_file"
  absl::StatusCode code = absl::StatusCode::kUnknown;
  std::string message;
  std::string root_object;  // "module.name"
  bool check_get_tensor = false;
  absl::StatusCode get_tensor_code = absl::StatusCode::kUnknown;
  std::string get_tensor_message;
  std::string must_not_exist;
};

absl::StatusOr<absl::StatusCode> ParseCode(const std::string& name) {
  for (int c = 0; c <= 16; ++c) {
    const auto code = static_cast<absl::StatusCode>(c);
    if (absl::StatusCodeToString(code) == name) return code;
  }
  return absl::InvalidArgumentError("unknown status code " + name);
}

absl::StatusOr<Expectation> ParseExpectation(const std::string& text) {
  Expectation e;
  std::set<std::string> seen;
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    const std::string line(absl::StripAsciiWhitespace(raw));
    if (line.empty() || line[0] == '#') continue;
    const size_t colon = line.find(": ");
    if (colon == std::string::npos) return absl::InvalidArgumentError("no 'key: value' in line: " + line);
    const std::string key = line.substr(0, colon);
    const std::string value = line.substr(colon + 2);
    if (!seen.insert(key).second) return absl::InvalidArgumentError("duplicate key " + key);
    if (key == "reader") {
      if (value != "pickle" && value != "torch_file") return absl::InvalidArgumentError("unknown reader " + value);
      e.reader = value;
    } else if (key == "code") {
      absl::StatusOr<absl::StatusCode> code = ParseCode(value);
      if (!code.ok()) return code.status();
      e.code = *code;
    } else if (key == "message") {
      e.message = value;
    } else if (key == "root_object") {
      e.root_object = value;
    } else if (key == "get_tensor_code") {
      absl::StatusOr<absl::StatusCode> code = ParseCode(value);
      if (!code.ok()) return code.status();
      e.check_get_tensor = true;
      e.get_tensor_code = *code;
    } else if (key == "get_tensor_message") {
      e.get_tensor_message = value;
    } else if (key == "must_not_exist") {
      e.must_not_exist = value;
    } else {
      return absl::InvalidArgumentError("unknown key " + key);
    }
  }
  if (e.reader.empty() || !seen.count("code")) return absl::InvalidArgumentError("needs reader and code");
  if (e.code == absl::StatusCode::kOk) {
    if (!e.message.empty()) return absl::InvalidArgumentError("a message for an OK case");
    if (e.root_object.empty()) return absl::InvalidArgumentError("an OK case must say what its root is");
  } else if (e.message.empty()) {
    return absl::InvalidArgumentError("a failing case needs a message substring");
  }
  if (e.check_get_tensor && e.reader != "torch_file") {
    return absl::InvalidArgumentError("get_tensor_code needs reader: torch_file");
  }
  return e;
}

// The corpus: case file -> its expectation file. Fails the test for a case
// without an expectation or the reverse.
std::map<std::string, std::string> ListCases() {
  std::set<std::string> files;
  for (const fs::directory_entry& entry : fs::directory_iterator(kCorpus)) {
    if (entry.is_regular_file()) files.insert(entry.path().filename().string());
  }
  std::map<std::string, std::string> cases;
  for (const std::string& f : files) {
    if (absl::EndsWith(f, kExpectSuffix)) {
      const std::string data(absl::StripSuffix(f, kExpectSuffix));
      EXPECT_TRUE(files.count(data)) << f << " has no case file " << data;
      continue;
    }
    if (!files.count(f + kExpectSuffix)) {
      ADD_FAILURE() << "testdata/hostile/" << f << " has no expectation (" << f << kExpectSuffix
                    << "); add it to make_hostile.py";
      continue;
    }
    cases[std::string(kCorpus) + "/" + f] = std::string(kCorpus) + "/" + f + kExpectSuffix;
  }
  return cases;
}

void ExpectRootObject(const pickle::Value& root, const std::string& module_dot_name) {
  const size_t dot = module_dot_name.rfind('.');
  ASSERT_NE(dot, std::string::npos) << module_dot_name;
  ASSERT_TRUE(root.is(pickle::Kind::kObject)) << "root is a " << pickle::KindName(root.kind());
  EXPECT_TRUE(root.IsObjectOf(module_dot_name.substr(0, dot), module_dot_name.substr(dot + 1)))
      << root.DebugString();
  EXPECT_FALSE(torch::TorchFile::IsTensor(root));
}

void ExpectStatus(const absl::Status& status, const Expectation& e, const std::string& what) {
  std::cout << what << ": " << status << "\n";  // the log shows what each reader said
  EXPECT_EQ(status.code(), e.code) << what << ": " << status;
  if (!e.message.empty()) {
    EXPECT_THAT(std::string(status.message()), HasSubstr(e.message)) << what;
  }
}

void RunPickleCase(const std::string& path, const Expectation& e) {
  const std::string bytes = ReadFile(path);
  absl::StatusOr<pickle::ValuePtr> root = pickle::Unpickle(bytes);
  ExpectStatus(root.status(), e, "Unpickle");
  if (!root.ok()) {
    EXPECT_THAT(std::string(root.status().message()), StartsWith("pickle: at byte "));
    return;
  }
  ExpectRootObject(**root, e.root_object);
}

void RunTorchFileCase(const std::string& path, const Expectation& e) {
  absl::StatusOr<std::unique_ptr<torch::TorchFile>> opened = torch::TorchFile::Open(path);
  ExpectStatus(opened.status(), e, "TorchFile::Open");
  absl::StatusOr<std::unique_ptr<torch::TorchFile>> from_bytes = torch::TorchFile::FromBytes(ReadFile(path), path);
  ExpectStatus(from_bytes.status(), e, "TorchFile::FromBytes");
  EXPECT_EQ(opened.status(), from_bytes.status()) << "Open and FromBytes disagree";
  if (!opened.ok()) {
    EXPECT_THAT(std::string(opened.status().message()), StartsWith(path)) << "messages start with the path";
    return;
  }
  const pickle::Value& root = *(*opened)->root();
  ExpectRootObject(root, e.root_object);
  if (e.check_get_tensor) {
    absl::StatusOr<torch::Tensor> t = (*opened)->GetTensor(root);
    EXPECT_EQ(t.status().code(), e.get_tensor_code) << t.status();
    EXPECT_THAT(std::string(t.status().message()), HasSubstr(e.get_tensor_message));
  }
}

TEST(HostileCorpusTest, EveryFileFailsAsExpected) {
  const std::map<std::string, std::string> cases = ListCases();
  EXPECT_GE(cases.size(), kMinCases);
  for (const auto& [path, expect_path] : cases) {
    SCOPED_TRACE(path);
    absl::StatusOr<Expectation> e = ParseExpectation(ReadFile(expect_path));
    ASSERT_TRUE(e.ok()) << expect_path << ": " << e.status();
    std::error_code ignored;
    if (!e->must_not_exist.empty()) fs::remove(e->must_not_exist, ignored);
    if (e->reader == "pickle") {
      RunPickleCase(path, *e);
    } else {
      RunTorchFileCase(path, *e);
    }
    if (!e->must_not_exist.empty()) {
      EXPECT_FALSE(fs::exists(e->must_not_exist)) << "reading " << path << " ran its payload";
    }
  }
}

TEST(HostileCorpusTest, ExpectationsAreStrict) {
  // The parser refuses what would make a case vacuous.
  EXPECT_FALSE(ParseExpectation("reader: pickle\ncode: DATA_LOSS\n").ok());            // no message
  EXPECT_FALSE(ParseExpectation("reader: pickle\ncode: OK\n").ok());                   // OK without a root
  EXPECT_FALSE(ParseExpectation("reader: zip\ncode: DATA_LOSS\nmessage: x\n").ok());   // unknown reader
  EXPECT_FALSE(ParseExpectation("reader: pickle\ncode: DATALOSS\nmessage: x\n").ok()); // unknown code
  EXPECT_FALSE(ParseExpectation("reader: pickle\ncode: DATA_LOSS\nmesage: x\n").ok()); // unknown key
  absl::StatusOr<Expectation> e = ParseExpectation("# c\nreader: pickle\ncode: DATA_LOSS\nmessage: a: b\n");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->code, absl::StatusCode::kDataLoss);
  EXPECT_EQ(e->message, "a: b");
}

}  // namespace
}  // namespace ucp
