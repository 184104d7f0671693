#!/usr/bin/env bash
# Fresh machine -> trained CNN: installs what is missing, builds, trains the demo CNN on
# Fashion-MNIST and prints its test accuracy and where checkpoints and logs are.
# Usage: scripts/demo.sh [--allocator=default|jemalloc|tcmalloc] [volt_fashion_mnist args...]
#   --allocator  host memory allocator (malloc) preloaded with LD_PRELOAD through
#                scripts/with_allocator.sh; default: $VOLT_ALLOCATOR, else the C library's.
#                docs/PERFORMANCE.md compares them on this demo.
set -euo pipefail
cd "$(dirname "$0")/.."
allocator="${VOLT_ALLOCATOR:-default}"
args=()
for a in "$@"; do
  case "$a" in
    --allocator=*) allocator="${a#--allocator=}" ;;
    *) args+=("$a") ;;
  esac
done
bash scripts/setup.sh
bash scripts/build.sh volt_fashion_mnist
exec bash scripts/with_allocator.sh "$allocator" ./build/examples/volt_fashion_mnist --model cnn \
  --out runs/fashion_mnist ${args[@]+"${args[@]}"}
