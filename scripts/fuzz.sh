#!/usr/bin/env bash
# Builds and runs volt's libFuzzer targets (fuzz/, docs/HARDENING.md).
# Usage: scripts/fuzz.sh [--time=SECONDS] [--no-build] [--build-dir=DIR] [target...]
#   targets: config envelope safetensors json_configs perf_trace metrics_csv (default: all six)
#   --time=S       seconds per target (default 60)
#   --no-build     use the fuzzers already built in DIR/fuzz (what the ctests do)
#   --build-dir=D  the main build folder (default build/): the fuzzers link its libvolt.a
#   --runs=N       reproducible mode (what the ctests use): a fixed seed, N executions (or
#                  --time, whichever ends first: a slower machine runs a prefix of the same
#                  sequence), the checked-in seeds only, no fork mode. The same inputs every time,
#                  so CI cannot fail on a libtorch crash that only a longer random run reaches.
# Each target starts from the checked-in seeds (fuzz/corpus/<target>) plus what earlier runs in
# DIR/fuzz/corpus/<target> found; new inputs go there, never into the checked-in seeds. A crash,
# sanitizer report, leak, timeout (>10 s) or memory blow-up (>2 GB) is saved as
# DIR/fuzz/findings/<target>-*. Exit status: 0 when no target found anything, 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
seconds=60
build=1
dir=build
targets=()
runs_limit=""
for a in "$@"; do
  case "$a" in
    --time=*) seconds="${a#--time=}" ;;
    --no-build) build=0 ;;
    --runs=*) runs_limit="${a#--runs=}" ;;
    --build-dir=*) dir="${a#--build-dir=}" ;;
    config | envelope | safetensors | json_configs | perf_trace | metrics_csv) targets+=("$a") ;;
    *) echo "scripts/fuzz.sh: unknown argument '$a'; see the usage at the top of the script." >&2
       exit 2 ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=(config envelope safetensors json_configs perf_trace metrics_csv)
if [ "$build" = 1 ]; then
  bash scripts/build.sh volt_fuzzers
fi
bin="$dir/fuzz"
# The leak suppressions of the sanitized suite (libtorch's own leaks; see the file).
export LSAN_OPTIONS="suppressions=$root/scripts/sanitizers/lsan.supp:print_suppressions=0"
status=0
for t in "${targets[@]}"; do
  exe="$bin/fuzz_$t"
  if [ ! -x "$exe" ]; then
    echo "scripts/fuzz.sh: $exe is missing; build it with scripts/fuzz.sh (needs clang and" \
      "libclang-rt-14-dev, which scripts/setup.sh installs)." >&2
    exit 2
  fi
  work="$bin/corpus/$t"
  findings="$bin/findings"
  mkdir -p "$work" "$findings"
  # The fixed-seed runs (the ctests) log apart, so a longer run beside them keeps its own log.
  log="$bin/$t${runs_limit:+.runs}.log"
  echo "[fuzz] $t: ${seconds}s, corpus $work + fuzz/corpus/$t"
  # -rss_limit_mb: a parser must not need more than 2 GB for any input (libFuzzer also counts
  # one malloc above that as a finding). That holds for envelope too since session 24: volt's
  # archive check refuses the string lengths libtorch's unpickler would allocate blindly
  # (docs/HARDENING.md), so an out-of-memory there is a finding like any other.
  mode=()
  if [ -n "$runs_limit" ]; then
    work=$(mktemp -d)
    mode=(-seed=1 -runs="$runs_limit")
  fi
  set +e
  "$exe" ${mode[@]+"${mode[@]}"} -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$findings/$t-" "$work" "$root/fuzz/corpus/$t" \
    >"$log" 2>&1
  rc=$?
  set -e
  [ -z "$runs_limit" ] || rm -rf "$work"
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n1 || true)
  if [ "$rc" -eq 0 ]; then
    echo "[fuzz] $t: ${runs:-?} executions (limit ${seconds}s), ${cov:-cov: ?}, no findings"
  else
    status=1
    echo "[fuzz] $t: FINDING (exit $rc) after ${runs:-?} executions; input saved under" \
      "$findings/, log $log:" >&2
    grep -E "FUZZ FINDING|ERROR: |runtime error|SUMMARY|Test unit written" "$log" | head -n 20 >&2
  fi
done
exit "$status"
