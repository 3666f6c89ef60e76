// What touching memory the process has not touched before costs on this
// machine, against touching it again: on a VM whose guest hands freed pages
// back to the host (virtio-balloon free page reporting), every page a process
// touches first makes the host back it again, so a process's footprint costs
// it time in proportion to its size, whatever it does with it.
//
//   first_touch [MB] [ROUNDS]     (default 256 MB, 3 rounds)
//
// Each round maps MB of anonymous memory, writes it once (first touch: page
// faults, zeroing, and on such a VM the host's work), writes it again (second
// touch: memory speed), then maps MB more with MADV_HUGEPAGE (one fault per
// 2 MiB where transparent huge pages are on) and MAP_POPULATE (faulted in by
// the kernel at once), and prints the rates. It also prints whether the guest
// reports free pages to the host and how much it has reported.
#include <sys/mman.h>
#include <time.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

namespace {

double Now() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// Seconds to map `n` bytes with `flags`, apply `advice` (0: none), and
// write every byte once; `again` (when not null) gets the seconds of a
// second write of the same bytes.
double Touch(size_t n, int flags, int advice, double* again) {
  const double start = Now();
  void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | flags, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("first_touch: mmap");
    std::exit(1);
  }
  if (advice != 0) madvise(p, n, advice);
  std::memset(p, 1, n);
  const double first = Now() - start;
  if (again != nullptr) {
    const double t = Now();
    std::memset(p, 2, n);
    *again = Now() - t;
  }
  munmap(p, n);
  return first;
}

std::string ReadLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!std::getline(in, line)) return "";
  return line;
}

}  // namespace

int main(int argc, char** argv) {
  const long mb = argc > 1 ? std::atol(argv[1]) : 256;
  const long rounds = argc > 2 ? std::atol(argv[2]) : 3;
  if (mb <= 0 || rounds <= 0) {
    std::fprintf(stderr, "usage: first_touch [MB > 0] [ROUNDS > 0]\n");
    return 2;
  }
  const size_t n = static_cast<size_t>(mb) << 20;
  const std::string reported = ReadLine("/sys/module/page_reporting/parameters/reported_kib");
  std::printf("free page reporting to the host: %s\n",
              reported.empty() ? "not in this kernel" : ("on, " + reported + " KiB reported so far").c_str());
  std::printf("transparent huge pages: %s\n", ReadLine("/sys/kernel/mm/transparent_hugepage/enabled").c_str());
  auto rate = [&](double s) { return static_cast<double>(n) / s / 1e9; };
  for (long r = 1; r <= rounds; ++r) {
    double again = 0;
    const double first = Touch(n, 0, 0, &again);
    const double huge = Touch(n, 0, MADV_HUGEPAGE, nullptr);
    const double populate = Touch(n, MAP_POPULATE, 0, nullptr);
    std::printf("round %ld, %ld MB: first touch %.3f s (%.2f GB/s), second %.3f s (%.2f GB/s, %.0fx); "
                "first touch with MADV_HUGEPAGE %.3f s (%.2f GB/s), with MAP_POPULATE %.3f s (%.2f GB/s)\n",
                r, mb, first, rate(first), again, rate(again), first / again, huge, rate(huge), populate,
                rate(populate));
  }
  return 0;
}
