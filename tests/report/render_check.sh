#!/usr/bin/env bash
# ctest report_renders_in_chromium: trains a tiny model, writes its run report, then renders it
# in headless Chromium and checks the screenshot (exit 77 = skipped: no chromium).
# Usage: render_check.sh <volt_report_run binary> <scripts/check_report.sh>
set -euo pipefail
report_run=$1
check=$2
work=$(mktemp -d /tmp/volt_report_XXXXXX)
trap 'rm -rf "$work"' EXIT
"$report_run" "$work/run" > "$work/run.log" 2>&1 || { cat "$work/run.log"; exit 1; }
# The page has plots with three series (loss, accuracy): all three colours must show.
bash "$check" "$work/run/report.html" "$work/report.png" 1280 2400 --min-series 3
