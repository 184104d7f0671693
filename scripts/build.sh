#!/usr/bin/env bash
# Configures and builds volt (library, examples, tests, benchmarks) into build/ with Ninja,
# ccache and precompiled headers.
# Usage: scripts/build.sh [--sanitize=address|thread] [target...]
#   --sanitize=address  ASan+UBSan build in build-asan/ (no benchmarks), see docs/HARDENING.md
#   --sanitize=thread   TSan build in build-tsan/ (no benchmarks)
set -euo pipefail
cd "$(dirname "$0")/.."
sanitize=""
targets=()
for a in "$@"; do
  case "$a" in
    --sanitize=*) sanitize="${a#--sanitize=}" ;;
    *) targets+=("$a") ;;
  esac
done
jobs=$(nproc)
# ccache's settings (hits shared between clones, the PCH checksum) live in
# cmake/compiler_launcher.sh, so every build of this tree gets them, not only this script's.
case "$sanitize" in
  "")
    dir=build
    config=(-DCMAKE_BUILD_TYPE=Release)
    ;;
  address | thread)
    dir=build-asan
    [ "$sanitize" = thread ] && dir=build-tsan
    # -O1 -g1: line numbers in reports at a moderate compile time. gtest_discover_tests runs the
    # test binary while building, so the sanitizer options apply from here on.
    config=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG"
      -DVOLT_SANITIZE="$sanitize" -DVOLT_BUILD_BENCHMARKS=OFF)
    # shellcheck source=sanitizers/env.sh
    source scripts/sanitizers/env.sh "$sanitize"
    ;;
  *)
    echo "scripts/build.sh: --sanitize=$sanitize: use --sanitize=address (ASan+UBSan) or" \
      "--sanitize=thread (TSan)." >&2
    exit 2
    ;;
esac
if [ ! -f "$dir/build.ninja" ]; then
  cmake -S . -B "$dir" -G Ninja "${config[@]}"
fi
cmake --build "$dir" --parallel "$jobs" ${targets[@]+--target "${targets[@]}"}
