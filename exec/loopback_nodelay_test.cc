#include "exec/loopback_nodelay.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gtest/gtest.h"

namespace ucp::exec {
namespace {

int NoDelay(int fd) {
  int v = -1;
  socklen_t len = sizeof(v);
  EXPECT_EQ(getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &v, &len), 0) << "fd " << fd;
  return v;
}

TEST(LoopbackNoDelay, SetsItOnBothEndsOfALoopbackConnectionOnly) {
  // A listener on 127.0.0.1, a client connected to it and the accepted end.
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(listener, 1), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int client = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(client, 0);
  ASSERT_EQ(connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const int accepted = accept(listener, nullptr, nullptr);
  ASSERT_GE(accepted, 0);
  // Not to be touched: a TCP socket with no peer, a connected UDP socket, a
  // Unix socket pair.
  const int unconnected = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(unconnected, 0);
  const int udp = socket(AF_INET, SOCK_DGRAM, 0);
  ASSERT_GE(udp, 0);
  ASSERT_EQ(connect(udp, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  int pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);

  ASSERT_EQ(NoDelay(client), 0);
  ASSERT_EQ(NoDelay(accepted), 0);
  EXPECT_EQ(SetNoDelayOnLoopbackTcp(), 2);
  EXPECT_EQ(NoDelay(client), 1);
  EXPECT_EQ(NoDelay(accepted), 1);
  EXPECT_EQ(NoDelay(listener), 0);
  EXPECT_EQ(NoDelay(unconnected), 0);

  for (int fd : {listener, client, accepted, unconnected, udp, pair[0], pair[1]}) close(fd);
  EXPECT_EQ(SetNoDelayOnLoopbackTcp(), 0);
}

}  // namespace
}  // namespace ucp::exec
