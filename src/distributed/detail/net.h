#pragma once
// Socket helpers for the rendezvous: a free port for local runs, and the local address that
// other nodes can reach (the one the kernel routes towards MASTER_ADDR).

#include <chrono>
#include <string>

namespace volt {
namespace detail {

/// A TCP port that was free on every interface when asked (bind to port 0, then release it).
/// Another process may take it before it is used again, as with Lightning's free-port pick.
int find_free_port();

/// The local IP address the kernel would use to send to `host` (a UDP connect: no packet is
/// sent). Throws DistributedError naming `host` when it cannot be resolved or has no route.
std::string local_address_towards(const std::string& host);

/// Whether something accepts TCP connections on `host`:`port` (a connection opened and closed
/// at once), waiting at most `timeout` for the handshake. Quiet: logs nothing.
bool accepts_connections(const std::string& host, int port, std::chrono::milliseconds timeout);

}  // namespace detail
}  // namespace volt
