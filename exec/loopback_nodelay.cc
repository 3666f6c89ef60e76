#include "exec/loopback_nodelay.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cstdlib>
#include <cstring>
#include <vector>

namespace ucp::exec {
namespace {

bool IsLoopback(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(a);
    return (ntohl(in.sin_addr.s_addr) >> 24) == 127;
  }
  if (a.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(a);
    if (IN6_IS_ADDR_LOOPBACK(&in6.sin6_addr)) return true;
    return IN6_IS_ADDR_V4MAPPED(&in6.sin6_addr) && in6.sin6_addr.s6_addr[12] == 127;
  }
  return false;
}

// A TCP stream socket connected to a loopback address.
bool IsLoopbackTcp(int fd) {
  int type = 0;
  socklen_t len = sizeof(type);
  if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM) return false;
  sockaddr_storage peer;
  std::memset(&peer, 0, sizeof(peer));
  len = sizeof(peer);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0) return false;
  return IsLoopback(peer);
}

}  // namespace

int SetNoDelayOnLoopbackTcp() {
  // The descriptors first, then the sockets: no call on a descriptor while
  // the folder listing it is open. One that closes (or is reused for a file)
  // in between fails the socket checks and is skipped.
  std::vector<int> fds;
  if (DIR* dir = opendir("/proc/self/fd")) {
    const int own = dirfd(dir);
    while (const dirent* e = readdir(dir)) {
      char* end = nullptr;
      const long fd = std::strtol(e->d_name, &end, 10);
      if (end != e->d_name && *end == '\0' && fd >= 0 && fd != own) fds.push_back(static_cast<int>(fd));
    }
    closedir(dir);
  }
  int set = 0;
  for (int fd : fds) {
    if (!IsLoopbackTcp(fd)) continue;
    const int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) == 0) ++set;
  }
  return set;
}

}  // namespace ucp::exec
