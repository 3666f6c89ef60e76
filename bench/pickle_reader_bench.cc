// The pickle reader's speed on a large protocol-2 stream: a list of 100 MB of
// 4-byte ints (BININT, the bulk of an RNG state or of a long list of ints in
// a checkpoint), parsed `--runs` times, seconds and MB/s printed. Speeds are
// measured here, never asserted in a test (reader_test checks the result).
//
//   bazel run -c opt //bench:pickle_reader_bench -- --mb=100 --runs=3
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

#include "format/pickle/reader.h"

namespace {

std::string Le32(uint32_t x) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[i] = static_cast<char>((x >> (8 * i)) & 0xff);
  return s;
}

// "\x80\x02]" then batches of 1000 BININTs appended with APPENDS, then STOP.
std::string ManyInts(int64_t megabytes) {
  std::string bytes = "\x80\x02]";
  const size_t target = static_cast<size_t>(megabytes) << 20;
  bytes.reserve(target + (1 << 20));
  int64_t x = 1;
  while (bytes.size() < target) {
    bytes += "(";
    for (int i = 0; i < 1000; ++i) {
      x = (x * 1103515245 + 12345) & 0x7fffffff;
      bytes += "J" + Le32(static_cast<uint32_t>(x));
    }
    bytes += "e";
  }
  bytes += ".";
  return bytes;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t mb = 100;
  int runs = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--mb=", 0) == 0) mb = std::stoll(a.substr(5));
    else if (a.rfind("--runs=", 0) == 0) runs = std::stoi(a.substr(7));
    else {
      std::fprintf(stderr, "usage: pickle_reader_bench [--mb=100] [--runs=3]\n");
      return 1;
    }
  }
  const std::string bytes = ManyInts(mb);
  for (int r = 0; r < runs; ++r) {
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<ucp::pickle::ValuePtr> v = ucp::pickle::Unpickle(bytes);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!v.ok()) {
      std::fprintf(stderr, "pickle_reader_bench: %s\n", std::string(v.status().message()).c_str());
      return 1;
    }
    std::printf("run %d: %zu MB, %zu ints in %.2f s (%.0f MB/s)\n", r + 1, bytes.size() >> 20, (*v)->items().size(),
                seconds, bytes.size() / seconds / 1e6);
  }
  return 0;
}
