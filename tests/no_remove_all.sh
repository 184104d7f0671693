#!/usr/bin/env bash
# Fails when C++ code of the repository calls std::filesystem::remove_all: the torch 2.x wheels'
# libtorch.so exports its own copy of it, calls bind to that copy, and it crashes (seen on the
# H200 machine twice: volt's checkpoint cleanup in session 18, the doc_programs runner in session
# 48). Use volt::detail::remove_tree (src/core/detail/remove_tree.h), or rm -rf in tests.
# Usage: no_remove_all.sh <repository root>
set -uo pipefail
root=${1:?usage: no_remove_all.sh <repository root>}
hits=$(grep -rnE 'remove_all[[:space:]]*\(' --include='*.cpp' --include='*.h' \
  "$root/src" "$root/include" "$root/tests" "$root/benchmarks" "$root/examples" "$root/tools" |
  grep -vE '^[^:]+:[0-9]+:[[:space:]]*//')
if [ -n "$hits" ]; then
  echo "std::filesystem::remove_all called (use volt::detail::remove_tree or rm -rf):"
  echo "$hits"
  exit 1
fi
echo "no calls of remove_all"
