#include "distributed/detail/net.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "volt/core/errors.h"

namespace {

TEST(Net, FreePortCanBeBound) {
  const int port = volt::detail::find_free_port();
  ASSERT_GT(port, 0);
  ASSERT_LT(port, 65536);
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ::close(fd);
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
