#!/usr/bin/env bash
# Step 1 of a GPU run, on a development machine (Debian bookworm, with apt) from anywhere in the
# repository: downloads the Debian packages the GPU machine lacks into .gpu/ (git-ignored) and
# copies the device-side script there. Then carry .gpu/ to the GPU machine and run
# `bash .gpu/device_build.sh` from the project root there (scripts/gpu/README.md).
set -euo pipefail
root=$(git rev-parse --show-toplevel)
here=$(dirname "$(readlink -f "$0")")
cd "$root"
mkdir -p .gpu/debs
cp "$here/device_build.sh" .gpu/
cd .gpu/debs
# yaml-cpp, nlohmann-json, fmt, liburing: volt's own dependencies; GoogleTest and Google
# Benchmark: its tests and benchmarks; zlib headers; the Fashion-MNIST data.
packages="libyaml-cpp-dev libyaml-cpp0.7 nlohmann-json3-dev libfmt-dev libfmt9 liburing-dev
  liburing2 libgtest-dev libgmock-dev libbenchmark-dev libbenchmark1debian zlib1g-dev
  dataset-fashion-mnist"
missing=""
for p in $packages; do
  ls "${p}"_*.deb > /dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
  apt-get update -qq
  # shellcheck disable=SC2086
  apt-get download $missing 2>&1 | grep -v '^W:' || true
fi
for p in $packages; do
  ls "${p}"_*.deb > /dev/null 2>&1 || { echo "prepare: could not download $p" >&2; exit 1; }
done
du -sh "$root/.gpu"
echo "next, on the GPU machine with .gpu/ carried, from the project root: bash .gpu/device_build.sh"
