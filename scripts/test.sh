#!/usr/bin/env bash
# Fresh machine -> green tests: installs what is missing, builds everything, runs the suite.
# Usage: scripts/test.sh [--sanitize=address|thread] [ctest arguments...]
#   --sanitize=address  builds build-asan/ (ASan+UBSan) and runs the suite there
#   --sanitize=thread   builds build-tsan/ (TSan) and runs the suite there
# docs/HARDENING.md has the sanitizer options, suppressions and the last results.
set -euo pipefail
cd "$(dirname "$0")/.."
sanitize=""
ctest_args=()
for a in "$@"; do
  case "$a" in
    --sanitize=*) sanitize="${a#--sanitize=}" ;;
    *) ctest_args+=("$a") ;;
  esac
done
bash scripts/setup.sh
dir=build
timeout=900
if [ -n "$sanitize" ]; then
  bash scripts/build.sh --sanitize="$sanitize"
  # shellcheck source=sanitizers/env.sh
  source scripts/sanitizers/env.sh "$sanitize"
  dir=build-asan
  [ "$sanitize" = thread ] && dir=build-tsan
  timeout=3600  # instrumented code runs several times slower
else
  bash scripts/build.sh
fi
cd "$dir"
ctest --output-on-failure --timeout "$timeout" -j 2 ${ctest_args[@]+"${ctest_args[@]}"}
