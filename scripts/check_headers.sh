#!/usr/bin/env bash
# Every public header (include/volt/**/*.h) compiles on its own, included twice, with nothing
# before it: what a user's `#include <volt/...>` needs. The build's precompiled header hides a
# missing include inside volt; this does not use it. Run by ctest (public_headers_compile_alone).
#
#   bash scripts/check_headers.sh CXX "INCLUDE_DIRS" ["CXX_FLAGS"]   # dirs ;-separated
#   bash scripts/check_headers.sh --self-test CXX "INCLUDE_DIRS"      # the check catches a bad header
#
# With VOLT_HEADER_LAUNCHER (the build's compiler launcher, cmake/compiler_launcher.sh with its
# arguments) and VOLT_HEADER_WORK (a folder in the build tree), each header's two-line TU is
# written there and compiled to an object through the launcher, so that ccache answers for the
# headers whose inputs did not change (about 280 s of two cores otherwise, the longest test).
# Without them each TU goes from stdin to the compiler with -fsyntax-only.
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
flags=(-std=c++17 -Wall -Wextra -Wno-unused-parameter -I"$inc" "${extra[@]}")
# The compiler's own system folders stay out: -isystem /usr/include breaks <cstdlib>'s include_next.
for d in "${dirs[@]}"; do
  case $d in "" | /usr/include | /usr/local/include) ;; *) flags+=(-isystem "$d") ;; esac
done
read -ra launcher <<< "${VOLT_HEADER_LAUNCHER:-}"
work=${VOLT_HEADER_WORK:-}
if [ ${#launcher[@]} -gt 0 ] && [ -n "$work" ]; then
  [ $self_test -eq 1 ] && work=$inc/work
  mkdir -p "$work"
else
  launcher=() work=""
fi

# One header: "ok   NAME", or "FAIL NAME" and the first errors.
check_one() {
  local h=$1 log status
  log=$(mktemp)
  if [ -n "$work" ]; then
    local src="$work/${h//\//_}.cpp" text
    text=$(printf '#include <%s>\n#include <%s>' "$h" "$h")
    # Rewritten only when it differs: an unchanged file keeps ccache's direct mode.
    [ -f "$src" ] && [ "$(cat "$src")" = "$text" ] || printf '%s\n' "$text" > "$src"
    # From the work folder: the paths ccache sees (relative to its base_dir, the source tree)
    # are then the same in every clone with the same layout.
    (cd "$work" && "${launcher[@]}" "$cxx" "${flags[@]}" -c "${src##*/}" -o "${src##*/}.o") \
      2> "$log"
    status=$?
  else
    printf '#include <%s>\n#include <%s>\n' "$h" "$h" |
      "$cxx" "${flags[@]}" -fsyntax-only -x c++ - 2> "$log"
    status=$?
  fi
  if [ $status -eq 0 ]; then
    echo "ok   $h"
  else
    echo "FAIL $h"
    grep -m5 "error" "$log"
  fi
  rm -f "$log"
}

out=$(mktemp)
parts=$(mktemp -d)
i=0
while read -r h; do
  check_one "$h" > "$parts/$i" &
  i=$((i + 1))
  while [ "$(jobs -pr | wc -l)" -ge "${JOBS:-2}" ]; do wait -n; done
done < <(cd "$inc" && find volt -name '*.h' | sort)
wait
cat "$parts"/* > "$out" 2> /dev/null
rm -rf "$parts"
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
