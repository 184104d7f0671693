#!/usr/bin/env bash
# Installs the built volt into a temporary prefix, then configures, builds and runs an
# out-of-tree consumer that uses find_package(volt) and links volt::volt.
set -euo pipefail
build_dir=$1
consumer_src=$2
work=$(mktemp -d /tmp/volt_install_XXXXXX)
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" > "$work/install.log"
cmake -S "$consumer_src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" > "$work/configure.log"
cmake --build "$work/build" > "$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
out=$("$work/build/consumer")
echo "$out"
grep -q "consumer ok" <<< "$out"
