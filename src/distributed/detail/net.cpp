#include "net.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "volt/core/check.h"

namespace volt {
namespace detail {
namespace {

// Closes a socket at scope exit.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// The ports find_free_port holds for this process: port -> the bound socket holding it.
std::mutex& reserved_mutex() {
  static std::mutex m;
  return m;
}
std::map<int, int>& reserved_ports() {
  static std::map<int, int> ports;
  return ports;
}

}  // namespace

int find_free_port() {
  // IPv6 dual-stack when available, like the TCPStore server that will listen on it. The socket
  // stays bound with SO_REUSEADDR and never listens: the kernel gives the port to no other
  // bind(0) and to no outgoing connection's ephemeral end, yet a TCPStore server (which sets
  // SO_REUSEADDR too) can bind and listen on it, here or in another process. Released at once,
  // as before, the port could be taken in the time between the pick and the store's listen by
  // anything on the machine (another job's Gloo connections, say).
  int last_errno = 0;
  for (int family : {AF_INET6, AF_INET}) {
    Fd s{::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0)};
    if (s.fd < 0) {
      last_errno = errno;
      continue;
    }
    const int on = 1, off = 0;
    ::setsockopt(s.fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    sockaddr_storage addr{};
    socklen_t len = 0;
    if (family == AF_INET6) {
      ::setsockopt(s.fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
      auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
      a->sin6_family = AF_INET6;
      a->sin6_addr = in6addr_any;
      len = sizeof(*a);
    } else {
      auto* a = reinterpret_cast<sockaddr_in*>(&addr);
      a->sin_family = AF_INET;
      a->sin_addr.s_addr = htonl(INADDR_ANY);
      len = sizeof(*a);
    }
    if (::bind(s.fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
        ::getsockname(s.fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      last_errno = errno;
      continue;
    }
    const int port = family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                        : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    std::lock_guard<std::mutex> lock(reserved_mutex());
    auto& held = reserved_ports()[port];
    if (held > 0) ::close(held);  // cannot happen while held; keep one socket per port anyway
    held = s.fd;
    s.fd = -1;
    return port;
  }
  VOLT_CHECK(false, DistributedError, "[ProcessGroup] could not find a free TCP port (",
             std::strerror(last_errno), "); set MASTER_PORT to a free port.");
  return 0;
}

bool release_port(int port) {
  std::lock_guard<std::mutex> lock(reserved_mutex());
  auto it = reserved_ports().find(port);
  if (it == reserved_ports().end()) return false;
  ::close(it->second);
  reserved_ports().erase(it);
  return true;
}

std::string local_address_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), "9", &hints, &res);
  VOLT_CHECK(rc == 0, DistributedError, "[ProcessGroup] cannot resolve MASTER_ADDR=", host, " (",
             ::gai_strerror(rc),
             "); set MASTER_ADDR to an address or a name this machine resolves.");
  std::string err = "no address";
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    Fd s{::socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0)};
    if (s.fd < 0 || ::connect(s.fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      err = std::strerror(errno);
      continue;
    }
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (::getsockname(s.fd, reinterpret_cast<sockaddr*>(&local), &len) != 0) {
      err = std::strerror(errno);
      continue;
    }
    char buf[INET6_ADDRSTRLEN] = {0};
    const void* src =
        local.ss_family == AF_INET6
            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr)
            : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr);
    if (::inet_ntop(local.ss_family, src, buf, sizeof(buf)) == nullptr) continue;
    ::freeaddrinfo(res);
    return buf;
  }
  ::freeaddrinfo(res);
  VOLT_CHECK(false, DistributedError,
             "[ProcessGroup] no route from this machine to MASTER_ADDR=", host, " (", err,
             "); check the address and the network, or set GLOO_SOCKET_IFNAME.");
  return {};
}

bool accepts_connections(const std::string& host, int port, std::chrono::milliseconds timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) return false;
  bool accepted = false;
  for (addrinfo* ai = res; ai != nullptr && !accepted; ai = ai->ai_next) {
    Fd s{::socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0)};
    if (s.fd < 0) continue;
    if (::connect(s.fd, ai->ai_addr, ai->ai_addrlen) == 0) {
      accepted = true;
    } else if (errno == EINPROGRESS) {
      pollfd p{s.fd, POLLOUT, 0};
      int error = 0;
      socklen_t len = sizeof(error);
      accepted = ::poll(&p, 1, static_cast<int>(timeout.count())) == 1 &&
                 ::getsockopt(s.fd, SOL_SOCKET, SO_ERROR, &error, &len) == 0 && error == 0;
    }
  }
  ::freeaddrinfo(res);
  return accepted;
}

}  // namespace detail
}  // namespace volt
