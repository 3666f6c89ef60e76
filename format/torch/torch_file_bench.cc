// Throughput of the torch file layer on one large file (not a test):
//   bazel run -c opt //format/torch:torch_file_bench -- /tmp/bench.pt 1024
// writes a file with one float32 storage of the given MiB streamed from a
// producer, then times: Open with CRC verification (mmap + zip + pickle +
// CRC of every byte), Open without, a pass that reads every byte (sum), and
// rewriting the file from the mapped storage. Page cache state is whatever
// the machine has (the file was just written, so mostly cached); with
// --cold each read is preceded by posix_fadvise(DONTNEED) on the file.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "format/torch/crc32.h"
#include "format/torch/torch_file.h"

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void Evict(const std::string& path, bool cold) {
  if (!cold) return;
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "%s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using ucp::torch::TorchFile;
  using ucp::torch::TorchWriter;
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s PATH MIB [--cold]\n", argv[0]);
    return 2;
  }
  const std::string path = argv[1];
  const int64_t mib = std::atoll(argv[2]);
  const bool cold = argc > 3 && std::string(argv[3]) == "--cold";
  const int64_t numel = mib * (1 << 20) / 4;
  const double gb = numel * 4.0 / 1e9;

  {
    TorchWriter w;
    auto root = w.AddStreamedTensor(ucp::torch::DType::kFloat32, {numel}, numel, 0,
                                    [](uint64_t offset, absl::Span<uint8_t> dst) {
                                      for (size_t i = 0; i < dst.size(); i += 4096) dst[i] = (offset + i) >> 12;
                                      return absl::OkStatus();
                                    });
    double t = Now();
    absl::Status s = w.WriteFile(path, *root);
    if (!s.ok()) return Fail(s);
    double written = Now() - t;
    int fd = ::open(path.c_str(), O_RDONLY);
    ::fdatasync(fd);
    ::close(fd);
    std::printf("write streamed (to page cache)    %6.2f GB/s  (%.2f GB in %.2f s); +fdatasync %.2f GB/s\n",
                gb / written, gb, written, gb / (Now() - t));
  }
  {
    Evict(path, cold);
    double t = Now();
    auto file = TorchFile::Open(path);
    if (!file.ok()) return Fail(file.status());
    std::printf("open + verify CRC                 %6.2f GB/s  (%.2f s)\n", gb / (Now() - t), Now() - t);
  }
  {
    Evict(path, cold);
    ucp::torch::OpenOptions lazy;
    lazy.verify_crc = false;
    double t = Now();
    auto file = TorchFile::Open(path, lazy);
    if (!file.ok()) return Fail(file.status());
    double opened = Now() - t;
    auto tensor = (*file)->GetTensor(*(*file)->root());
    const uint8_t* p = tensor->data();
    uint64_t sum = 0;
    for (size_t i = 0; i < tensor->nbytes(); i += 64) sum += p[i];
    double touched = Now() - t;
    std::printf("open without CRC                  %8.4f s; then touching every page %6.2f GB/s (sum %llu)\n", opened,
                gb / touched, static_cast<unsigned long long>(sum));
    t = Now();
    uint32_t crc = ucp::torch::Crc32(0, p, tensor->nbytes());
    std::printf("CRC-32 of the (now cached) mapping %6.2f GB/s (%08x)\n", gb / (Now() - t), crc);

    const std::string copy = path + ".copy.pt";
    TorchWriter w;
    auto root = w.AddTensor(*tensor);
    t = Now();
    absl::Status s = w.WriteFile(copy, *root);
    if (!s.ok()) return Fail(s);
    double written = Now() - t;
    int fd = ::open(copy.c_str(), O_RDONLY);
    ::fdatasync(fd);
    ::close(fd);
    std::printf("rewrite from mapping (page cache)  %6.2f GB/s  (%.2f s); +fdatasync %.2f GB/s\n", gb / written,
                written, gb / (Now() - t));
    ::unlink(copy.c_str());
  }
  ::unlink(path.c_str());
  return 0;
}
