// Whether this machine's disk serves reads while a cache flush is in flight:
// what a job that reads cold inputs while it makes its output durable (ucp's
// background flushes, base/flusher.h) pays beside one that reads first and
// flushes once at the end (`cp -r` then `sync`, the benchmark's baseline).
//
//   flush_stall FILE SCRATCH_FOLDER [WRITE_MB] [RUNS]     (default 768 MB, 5 runs)
//
// FILE is read, never written (a large file of a checkpoint: the larger, the
// clearer the figures). Each run evicts FILE from the page cache
// (posix_fadvise DONTNEED: no root needed; on a VM its host may still hold
// it, as it does for the benchmark's cold runs), writes WRITE_MB into a new
// file in SCRATCH_FOLDER (to the page cache), then reads FILE from start to
// end in 8 MiB reads while another thread does one of:
//
//   nothing     the written bytes stay dirty in the page cache
//   writeback   sync_file_range(WAIT_BEFORE | WRITE | WAIT_AFTER) of the
//               scratch file: its bytes go to the disk, no cache flush
//   fdatasync   its bytes go to the disk and the disk's cache is flushed
//
// The three alternate, run after run, and the scratch file is removed after
// each. Prints per mode the median read time, its rate, the longest wait for
// one 8 MiB read and how long the other thread's call took, then each mode's
// read time over that of `nothing`. A disk that stops serving reads while it
// flushes shows it as a longest wait about as long as the fdatasync.
#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr size_t kChunk = size_t{8} << 20;

double Now() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "flush_stall: %s: %s\n", what.c_str(), std::strerror(errno));
  std::exit(1);
}

enum class Beside { kNothing, kWriteback, kFdatasync };
const char* const kNames[] = {"nothing", "writeback", "fdatasync"};

struct Run {
  double read_s = 0;     // reading FILE, start to end
  double longest_s = 0;  // the longest single 8 MiB read
  double other_s = 0;    // the other thread's call (0 for nothing)
};

// Writes `mb` MiB of non-zero bytes into a new file: returns its descriptor.
int WriteScratch(const std::string& path, long mb, const std::vector<char>& buf) {
  const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0) Die(path);
  for (long i = 0; i < mb; i += static_cast<long>(kChunk >> 20)) {
    size_t done = 0;
    while (done < kChunk) {
      const ssize_t w = ::write(fd, buf.data() + done, kChunk - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) Die(path + ": write");
      done += static_cast<size_t>(w);
    }
  }
  return fd;
}

Run OneRun(const std::string& file, const std::string& scratch, long mb, Beside beside, std::vector<char>* buf) {
  const int in = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) Die(file);
  if (const int rc = ::posix_fadvise(in, 0, 0, POSIX_FADV_DONTNEED); rc != 0) {
    errno = rc;  // posix_fadvise returns the error instead of setting errno
    Die(file + ": posix_fadvise");
  }
  const int out = WriteScratch(scratch, mb, *buf);
  Run run;
  double other_start = 0, other_end = 0;
  std::thread other;
  const double start = Now();
  if (beside != Beside::kNothing) {
    other = std::thread([&] {
      other_start = Now();
      if (beside == Beside::kWriteback) {
        (void)::sync_file_range(out, 0, 0,
                                SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
      } else if (::fdatasync(out) != 0) {
        Die(scratch + ": fdatasync");
      }
      other_end = Now();
    });
  }
  off_t offset = 0;
  while (true) {
    const double t = Now();
    const ssize_t r = ::pread(in, buf->data(), kChunk, offset);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) Die(file + ": read");
    if (r == 0) break;
    run.longest_s = std::max(run.longest_s, Now() - t);
    offset += r;
  }
  run.read_s = Now() - start;
  if (other.joinable()) other.join();
  run.other_s = other_end - other_start;
  ::close(in);
  ::close(out);
  if (::unlink(scratch.c_str()) != 0) Die(scratch + ": unlink");
  return run;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || argc > 5) {
    std::fprintf(stderr, "usage: flush_stall FILE SCRATCH_FOLDER [WRITE_MB] [RUNS]\n");
    return 2;
  }
  const std::string file = argv[1];
  const std::string scratch = std::string(argv[2]) + "/flush_stall.scratch";
  const long mb = argc > 3 ? std::atol(argv[3]) : 768;
  const int runs = argc > 4 ? std::atoi(argv[4]) : 5;
  if (mb <= 0 || runs <= 0) {
    std::fprintf(stderr, "flush_stall: WRITE_MB and RUNS must be positive\n");
    return 2;
  }
  struct stat st;
  if (::stat(file.c_str(), &st) != 0) Die(file);
  if (::access(scratch.c_str(), F_OK) == 0) {
    std::fprintf(stderr, "flush_stall: %s exists: not overwriting it\n", scratch.c_str());
    return 1;
  }
  std::vector<char> buf(kChunk);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<char>(i * 2654435761u >> 24) | 1;
  std::printf("flush_stall: cold read of %s (%.0f MB, evicted before each run) while %ld MB written to %s\n",
              file.c_str(), static_cast<double>(st.st_size) / 1e6, mb, argv[2]);
  std::printf("  are left dirty (nothing), written back (writeback) or written back and flushed (fdatasync); %d "
              "runs each, alternating\n",
              runs);
  std::vector<Run> results[3];
  for (int r = 0; r < runs; ++r) {
    for (int m = 0; m < 3; ++m) {
      const int mode = r % 2 == 0 ? m : 2 - m;  // neither end of the order always first
      results[mode].push_back(OneRun(file, scratch, mb, static_cast<Beside>(mode), &buf));
    }
  }
  double alone = 0;
  for (int m = 0; m < 3; ++m) {
    std::vector<double> read, longest, other;
    for (const Run& run : results[m]) {
      read.push_back(run.read_s);
      longest.push_back(run.longest_s);
      other.push_back(run.other_s);
    }
    const double median = Median(read);
    if (m == 0) alone = median;
    std::printf("  read beside %-10s median %.3f s (%.2f GB/s), longest 8 MiB read (median) %.3f s", kNames[m],
                median, static_cast<double>(st.st_size) / median / 1e9, Median(longest));
    if (m > 0) std::printf(", %s took (median) %.3f s", kNames[m], Median(other));
    std::printf("\n");
  }
  for (int m = 1; m < 3; ++m) {
    std::vector<double> read;
    for (const Run& run : results[m]) read.push_back(run.read_s);
    std::printf("  read beside %s / beside nothing: %.0f%%\n", kNames[m], 100 * Median(read) / alone);
  }
  return 0;
}
