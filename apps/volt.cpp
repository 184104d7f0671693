// The `volt` command: LightningCLI for C++, with the Fashion-MNIST demo models registered.
//
//   volt fit --config configs/fashion_mnist_mlp.yaml --trainer.max_epochs=3 --model.lr=3e-4
//   volt print-config --model=CnnClassifier
//   volt fit --help
//   volt report runs/mlp/volt_logs/version_0
//
// Your own binary does the same with your own models: see examples/custom_cli.cpp.

#include <volt/volt.h>

#include "models.h"

int main(int argc, char** argv) {
  volt_examples::register_fashion_mnist(volt::registry());
  return volt::run_cli(argc, argv);
}
