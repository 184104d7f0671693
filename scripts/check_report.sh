#!/usr/bin/env bash
# Renders a volt run report in headless Chromium and checks the screenshot: right size, mostly
# drawn (not a blank page) and in several colours (the plots rendered).
# Usage: scripts/check_report.sh REPORT.html OUT.png [WIDTH HEIGHT [check_png.py options]]
#        (default 1280 2400; e.g. --min-series 3 when the page has plots with 3 or more series)
# Exits 77 (ctest's "skipped") when chromium is not installed: scripts/setup.sh installs it.
# Example: build/tests/volt_report_run /tmp/r && scripts/check_report.sh /tmp/r/report.html r.png
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 REPORT.html OUT.png [WIDTH HEIGHT]" >&2
  exit 2
fi
[ -f "$1" ] || { echo "[check_report] no such file: $1" >&2; exit 1; }
html=$(realpath "$1")
url=$(python3 -c 'import pathlib, sys; print(pathlib.Path(sys.argv[1]).as_uri())' "$html")
png=$2
width=${3:-1280}
height=${4:-2400}
shift $(( $# < 4 ? $# : 4 ))  # what is left goes to check_png.py
# VOLT_CHROMIUM picks another Chromium-based browser binary.
chrome=${VOLT_CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}
if [ -z "$chrome" ] || [ ! -x "$chrome" ]; then
  echo "[check_report] SKIPPED: no chromium${chrome:+ at $chrome}; install it (apt-get install" \
    "--no-install-recommends chromium, or scripts/setup.sh) or set VOLT_CHROMIUM"
  exit 77
fi
profile=$(mktemp -d /tmp/volt_chromium_XXXXXX)
trap 'rm -rf "$profile"' EXIT
rm -f "$png"
# --no-sandbox: Chromium refuses to run as root otherwise. A throw-away profile keeps parallel
# runs apart. No network is reachable or needed: the page is self-contained.
flags=(--headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage --hide-scrollbars
       --no-first-run --no-default-browser-check --user-data-dir="$profile"
       --enable-logging=stderr --v=0)
timeout 120 "$chrome" "${flags[@]}" --window-size="$width,$height" \
  --screenshot="$(realpath -m "$png")" "$url" > "$profile/chromium.log" 2>&1 || true
if [ ! -s "$png" ]; then
  echo "[check_report] chromium wrote no screenshot; its log:" >&2
  cat "$profile/chromium.log" >&2
  exit 1
fi
# Script errors reach the log as console messages.
if grep -q "Uncaught" "$profile/chromium.log"; then
  echo "[check_report] the page's script failed:" >&2
  grep "Uncaught" "$profile/chromium.log" >&2
  exit 1
fi
# The hover script marks <body> when it has set up every plot.
if grep -q 'id="volt-data"' "$html"; then
  timeout 120 "$chrome" "${flags[@]}" --dump-dom "$url" > "$profile/dom.html" 2> /dev/null || true
  if ! grep -q 'data-hover="ready"' "$profile/dom.html"; then
    echo "[check_report] the hover script did not finish (no data-hover=\"ready\" on <body>)" >&2
    exit 1
  fi
fi
python3 "$(dirname "$0")/../tools/check_png.py" "$png" --width "$width" --height "$height" "$@"
