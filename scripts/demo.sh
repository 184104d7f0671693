#!/usr/bin/env bash
# Fresh machine -> trained CNN: installs what is missing, builds, trains the demo CNN on
# Fashion-MNIST and prints its test accuracy and where checkpoints and logs are.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh volt_fashion_mnist
./build/examples/volt_fashion_mnist --model cnn --out runs/fashion_mnist "$@"
