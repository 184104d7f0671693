#include "distributed/detail/net.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cerrno>
#include <chrono>
#include <set>
#include <vector>

#include "volt/core/errors.h"

namespace {

// Binds a plain socket (no SO_REUSEADDR) to loopback:port; returns 0 or the errno.
int plain_bind(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  const int rc = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 ? 0 : errno;
  ::close(fd);
  return rc;
}

// The free port is held from the pick until released: nothing else on the machine can bind it
// and no later pick returns it, yet the rendezvous store listens on it; released, it is free.
// (Picked and closed at once, another job's connections could take it before the store
// listened: rank 0 then failed with "MASTER_PORT=... is already in use".)
TEST(Net, AFreePortIsHeldUntilReleasedAndTheStoreCanListenOnIt) {
  const int port = volt::detail::find_free_port();
  ASSERT_GT(port, 0);
  ASSERT_LT(port, 65536);
  EXPECT_EQ(plain_bind(port), EADDRINUSE);
  std::set<int> others;
  for (int i = 0; i < 64; ++i) others.insert(volt::detail::find_free_port());
  EXPECT_EQ(others.count(port), 0u) << "a held port was picked again";
  EXPECT_EQ(others.size(), 64u);
  {
    c10d::TCPStoreOptions so;
    so.port = static_cast<std::uint16_t>(port);
    so.isServer = true;
    so.waitWorkers = false;
    so.timeout = std::chrono::seconds(10);
    c10d::TCPStore server("127.0.0.1", so);
    so.isServer = false;
    c10d::TCPStore client("127.0.0.1", so);
    client.set("k", std::vector<uint8_t>{7});
    EXPECT_EQ(server.get("k"), std::vector<uint8_t>{7});
    EXPECT_TRUE(volt::detail::release_port(port));
    EXPECT_FALSE(volt::detail::release_port(port)) << "released twice";
    EXPECT_EQ(plain_bind(port), EADDRINUSE) << "the store listens there";
  }
  for (int other : others) EXPECT_TRUE(volt::detail::release_port(other));
  EXPECT_EQ(plain_bind(port), 0) << "released and the store gone, the port is free";
}

TEST(Net, LocalAddressTowardsLoopbackIsLoopback) {
  EXPECT_EQ(volt::detail::local_address_towards("127.0.0.1"), "127.0.0.1");
  EXPECT_EQ(volt::detail::local_address_towards("localhost").rfind("127.", 0) == 0 ||
                volt::detail::local_address_towards("localhost") == "::1",
            true);
}

TEST(Net, UnresolvableMasterAddrIsNamed) {
  try {
    volt::detail::local_address_towards("no-such-host.invalid");
    FAIL() << "no error";
  } catch (const volt::DistributedError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot resolve MASTER_ADDR=no-such-host.invalid"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
