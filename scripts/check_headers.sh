#!/usr/bin/env bash
# Every public header (include/volt/**/*.h) compiles on its own, included twice, with nothing
# before it: what a user's `#include <volt/...>` needs. The build's precompiled header hides a
# missing include inside volt; this does not use it. Run by ctest (public_headers_compile_alone).
#
#   bash scripts/check_headers.sh CXX "INCLUDE_DIRS" ["CXX_FLAGS"]   # dirs ;-separated
#   bash scripts/check_headers.sh --self-test CXX "INCLUDE_DIRS"      # the check catches a bad header
set -u
self_test=0
if [ "${1:-}" = "--self-test" ]; then
  self_test=1
  shift
fi
cxx=${1:?compiler}
IFS=';' read -ra dirs <<< "${2:-}"
read -ra extra <<< "${3:-}"
root=$(cd "$(dirname "$0")/.." && pwd)
inc=$root/include
if [ $self_test -eq 1 ]; then
  inc=$(mktemp -d)
  trap 'rm -rf "$inc"' EXIT
  mkdir -p "$inc/volt"
  printf '#pragma once\nstruct Fine { int x; };\n' > "$inc/volt/fine.h"
  printf '#pragma once\ninline std::vector<int> v() { return {}; }\n' > "$inc/volt/bad.h"
  printf 'struct Twice {};\n' > "$inc/volt/unguarded.h"
fi
flags=(-std=c++17 -fsyntax-only -Wall -Wextra -Wno-unused-parameter -I"$inc" "${extra[@]}")
# The compiler's own system folders stay out: -isystem /usr/include breaks <cstdlib>'s include_next.
for d in "${dirs[@]}"; do
  case $d in "" | /usr/include | /usr/local/include) ;; *) flags+=(-isystem "$d") ;; esac
done
out=$(mktemp)
(cd "$inc" && find volt -name '*.h' | sort) | xargs -P "${JOBS:-2}" -I{} sh -c '
  cxx=$1; shift
  if printf "#include <%s>\n#include <%s>\n" "{}" "{}" | "$cxx" "$@" -x c++ - 2> /tmp/hdr.$$.log
  then echo "ok   {}"
  else echo "FAIL {}"; grep -m5 "error" /tmp/hdr.$$.log
  fi
  rm -f /tmp/hdr.$$.log' sh "$cxx" "${flags[@]}" > "$out"
fails=$(grep -c '^FAIL' "$out")
total=$(grep -c '^ok\|^FAIL' "$out")
if [ $self_test -eq 1 ]; then
  # fine.h passes; bad.h (no <vector>) and unguarded.h (defined twice) must fail.
  if grep -q '^ok   volt/fine.h' "$out" && grep -q '^FAIL volt/bad.h' "$out" &&
    grep -q '^FAIL volt/unguarded.h' "$out"; then
    echo "[check_headers] self-test passed"
    rm -f "$out"
    exit 0
  fi
  echo "[check_headers] self-test FAILED: the check did not tell good and bad headers apart"
  cat "$out"
  rm -f "$out"
  exit 1
fi
grep -v '^ok' "$out"
echo "[check_headers] $((total - fails)) of $total public headers compile alone"
rm -f "$out"
[ "$fails" -eq 0 ] && [ "$total" -gt 0 ]
