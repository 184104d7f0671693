#!/usr/bin/env bash
# Configures and builds volt (library, examples, tests, benchmarks) into build/ with Ninja,
# ccache and precompiled headers. Usage: scripts/build.sh [target...]
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
# Let ccache share hits between clones in different folders (CI builds a fresh clone).
export CCACHE_BASEDIR="$PWD"
export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}"
if [ ! -f build/build.ninja ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
fi
cmake --build build --parallel "$jobs" ${1:+--target "$@"}
