// What lets objects compiled against Debian 12's glibc 2.36 headers (ours, and
// the static archives of libstdc++, Abseil, protobuf) link against an older
// glibc (the oldest Debian root's, see third_party/portable.bzl), so that the
// portable `ucp` binary and the wheels' extension modules run on any glibc from
// the version `ucp --version` prints on. Linked into those artifacts only.
//
// - __libc_single_threaded (glibc 2.32): libstdc++'s headers read it to skip
//   atomic reference counting while a process has one thread. Ours is always 0
//   ("there may be other threads"): always atomic, correct with or without
//   threads, and never read from glibc's own copy.
// - arc4random (glibc 2.36): std::random_device's default source in libstdc++ 12
//   (README: what bounds the minimum glibc): here from the getrandom system call.
// - log2 (GLIBC_2.29 since glibc 2.29 dropped its SVID error handling): the
//   version every glibc has, GLIBC_2.2.5, through -Wl,--wrap=log2 (Abseil's
//   sampling rate); the two differ only in how errors are reported, never in a
//   result.
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#define UCP_HIDDEN __attribute__((visibility("hidden")))

UCP_HIDDEN char __libc_single_threaded = 0;

UCP_HIDDEN uint32_t arc4random(void) {
  uint32_t value;
  size_t got = 0;
  while (got < sizeof value) {
    long n = syscall(SYS_getrandom, (char*)&value + got, sizeof value - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      abort();  // no getrandom (Linux < 3.17): glibc's own arc4random aborts too
    }
    got += (size_t)n;
  }
  return value;
}

double ucp_log2_glibc_2_2_5(double);
__asm__(".symver ucp_log2_glibc_2_2_5, log2@GLIBC_2.2.5");

UCP_HIDDEN double __wrap_log2(double x) { return ucp_log2_glibc_2_2_5(x); }
