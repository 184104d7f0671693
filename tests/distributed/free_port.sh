# Sourced by the tests that start launchers (torchrun.sh, mpi_launchers.sh). free_port prints a
# TCP port of 127.0.0.1 the kernel found free just now (python3 comes with the python3-torch that
# scripts/setup.sh installs).
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
