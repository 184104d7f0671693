#pragma once
// Socket helpers for the rendezvous: a free port for local runs, and the local address that
// other nodes can reach (the one the kernel routes towards MASTER_ADDR).

#include <chrono>
#include <string>

namespace volt {
namespace detail {

/// A TCP port free on every interface, held for this process until release_port(port) or exit:
/// a bound socket (SO_REUSEADDR, never listening) keeps the kernel from giving it to any other
/// bind(0) or outgoing connection, while a TCPStore server, here or in a child, can still listen
/// on it. (Lightning's pick binds port 0 and closes at once; the port is then anyone's until the
/// store listens.)
int find_free_port();

/// Ends find_free_port's hold on `port` (the rendezvous store listens there now, or it is no
/// longer wanted). Returns whether this process held it.
bool release_port(int port);

/// The local IP address the kernel would use to send to `host` (a UDP connect: no packet is
/// sent). Throws DistributedError naming `host` when it cannot be resolved or has no route.
std::string local_address_towards(const std::string& host);

/// Whether something accepts TCP connections on `host`:`port` (a connection opened and closed
/// at once), waiting at most `timeout` for the handshake. Quiet: logs nothing.
bool accepts_connections(const std::string& host, int port, std::chrono::milliseconds timeout);

}  // namespace detail
}  // namespace volt
