#pragma once
// The module the GPU-side benchmarks train: a classifier net, cross-entropy, `train_loss` logged
// every step, Adam(1e-3) (the optimizer of the side-by-side with Lightning).

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "volt/volt.h"

namespace volt_bench {

template <typename Net>
class AdamModule : public volt::Module {
 public:
  explicit AdamModule(std::shared_ptr<Net> net) : net_(register_module("net", net)) {}
  torch::Tensor training_step(const volt::Batch& b, int64_t) override {
    auto loss = torch::cross_entropy_loss(net_->forward(b.input), b.target);
    log("train_loss", loss);
    return loss;
  }
  std::vector<volt::OptimizerConfig> configure_optimizers() override {
    return {std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(1e-3))};
  }

 private:
  std::shared_ptr<Net> net_;
};

}  // namespace volt_bench
