#!/usr/bin/env bash
# Fresh machine -> green tests: installs what is missing, builds everything, runs the suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
cd build
ctest --output-on-failure --timeout 900 -j 2
