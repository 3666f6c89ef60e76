// A main() for the fuzz targets where libFuzzer is absent (gcc, the normal
// Bazel build): runs LLVMFuzzerTestOneInput once on each file named on the
// command line, and on every regular file under each folder named there
// (recursively, in sorted order). A broken invariant aborts, as it would
// under libFuzzer, so replaying a corpus is a regression test.
//
// Exits 0 after running at least one input, 1 when a path cannot be read or
// nothing was run (so a test whose corpus went missing fails).
//
// Example:
//   bazel-bin/fuzz/pickle_fuzzer fuzz/seeds/pickle crash-1234
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream buffer;
  buffer << in.rdbuf();
  *out = buffer.str();
  return !in.bad();
}

// `path` itself, or the regular files under it (sorted).
bool ListInputs(const std::string& path, std::vector<std::string>* inputs) {
  std::error_code error;
  if (!std::filesystem::is_directory(path, error)) {
    inputs->push_back(path);
    return true;
  }
  std::vector<std::string> files;
  for (std::filesystem::recursive_directory_iterator it(
           path, std::filesystem::directory_options::follow_directory_symlink, error), end;
       !error && it != end; it.increment(error)) {
    if (it->is_regular_file(error)) files.push_back(it->path().string());
  }
  if (error) {
    std::fprintf(stderr, "fuzz driver: cannot list %s: %s\n", path.c_str(), error.message().c_str());
    return false;
  }
  std::sort(files.begin(), files.end());
  inputs->insert(inputs->end(), files.begin(), files.end());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> inputs;
  for (int i = 1; i < argc; ++i) {
    if (!ListInputs(argv[i], &inputs)) return 1;
  }
  size_t ran = 0;
  for (const std::string& path : inputs) {
    std::string bytes;
    if (!ReadFile(path, &bytes)) {
      std::fprintf(stderr, "fuzz driver: cannot read %s\n", path.c_str());
      return 1;
    }
    std::fprintf(stderr, "fuzz driver: %s (%zu bytes)\n", path.c_str(), bytes.size());
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    ++ran;
  }
  std::fprintf(stderr, "fuzz driver: ran %zu inputs\n", ran);
  return ran > 0 ? 0 : 1;
}
