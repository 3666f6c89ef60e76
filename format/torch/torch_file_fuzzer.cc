// libFuzzer target: TorchFile::FromBytes (zip, pickle, persistent ids,
// views) and CanonicalDump on arbitrary bytes must return a status, never
// crash. Not built by Bazel (it needs -fsanitize=fuzzer); by hand:
//   SRCS="format/torch/{zip,crc32,tensor,dtype,mapped_file,torch_file,dump}.cc
//         base/sha256.cc format/pickle/*.cc format/pickle/internal/*.cc"  (no tests)
//   clang++ -std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined -I. $SRCS \
//       format/torch/torch_file_fuzzer.cc -labsl_... -o /tmp/torch_file_fuzzer
//   /tmp/torch_file_fuzzer -max_len=65536 corpus/  (seed: small fixture .pt files)
#include <cstddef>
#include <cstdint>
#include <string>

#include "format/torch/dump.h"
#include "format/torch/torch_file.h"
#include "format/torch/zip.h"

// With -DUCP_FUZZ_PICKLE the input is data.pkl of an archive that also holds
// storages data/0..3 (16, 0, 7 and 64 bytes), so that mutations get past the
// CRC check and exercise the persistent id and tensor view validation.
#ifdef UCP_FUZZ_PICKLE
static std::string Wrap(const uint8_t* data, size_t size) {
  std::string out;
  ucp::torch::StringSink sink(&out);
  ucp::torch::ZipWriter w(&sink, "fuzz");
  (void)w.AddRecord("a/data.pkl", std::string_view(reinterpret_cast<const char*>(data), size));
  (void)w.AddRecord("a/data/0", std::string(16, '\x3f'));
  (void)w.AddRecord("a/data/1", "");
  (void)w.AddRecord("a/data/2", std::string(7, '\x01'));
  (void)w.AddRecord("a/data/3", std::string(64, '\x02'));
  (void)w.AddRecord("a/version", "3\n");
  (void)w.Finish();
  return out;
}
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
#ifdef UCP_FUZZ_PICKLE
  std::string bytes = Wrap(data, size);
  data = reinterpret_cast<const uint8_t*>(bytes.data());
  size = bytes.size();
#endif
  ucp::torch::OpenOptions options;
  options.pickle.max_values = 1 << 20;
  options.pickle.max_memo_entries = 1 << 16;
  auto file = ucp::torch::TorchFile::FromBytes(std::string(reinterpret_cast<const char*>(data), size), "fuzz.pt",
                                               options);
  if (file.ok()) (void)ucp::torch::CanonicalDump(**file);
  return 0;
}
