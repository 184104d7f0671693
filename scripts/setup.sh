#!/usr/bin/env bash
# Installs, only when missing, every Debian package volt's build, tests, demo and benchmarks need.
# Idempotent: a second run installs nothing and takes about a second.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config
  libtorch-dev libgloo-dev libopenblas0-pthread
  libjemalloc2 libtcmalloc-minimal4  # host allocators (scripts/with_allocator.sh, docs/PERFORMANCE.md)
  zlib1g-dev libyaml-cpp-dev nlohmann-json3-dev libfmt-dev liburing-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  dataset-fashion-mnist
  python3-torch
  chromium  # headless: checks that `volt report` pages render (ctest report_renders_in_chromium)
  locales  # de_DE and tr_TR locale sources: volt under a program's locale (ctest GermanLocale.*, TurkishLocale.*)
  iproute2  # `ip netns`: two network namespaces as two nodes (ctest multi_node_netns)
  mpich openmpi-bin  # real MPI launchers starting volt's ranks (ctest mpi_launchers)
  clang libclang-rt-14-dev  # libFuzzer + sanitizer runtimes: fuzz/ targets (ctests fuzz_*)
  clang-format  # the source's format (ctest source_is_clang_formatted, scripts/check_format.sh)
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "[setup] installing: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "[setup] all packages present"
fi

# libtorch must pick up OpenBLAS (pthread flavour), not the reference BLAS: ~20x slower otherwise.
blas=$(readlink -f "$(update-alternatives --query libblas.so.3-x86_64-linux-gnu 2>/dev/null \
  | awk '/^Value:/{print $2}')" 2>/dev/null || true)
case "$blas" in
  *openblas-pthread*) ;;
  *)
    alt=$(update-alternatives --list libblas.so.3-x86_64-linux-gnu 2>/dev/null | grep openblas-pthread | head -n1 || true)
    if [ -n "$alt" ]; then
      echo "[setup] selecting OpenBLAS (pthread) as libblas.so.3"
      update-alternatives --set libblas.so.3-x86_64-linux-gnu "$alt" >/dev/null
      alt=$(update-alternatives --list liblapack.so.3-x86_64-linux-gnu 2>/dev/null | grep openblas-pthread | head -n1 || true)
      [ -z "$alt" ] || update-alternatives --set liblapack.so.3-x86_64-linux-gnu "$alt" >/dev/null
    fi
    ;;
esac
