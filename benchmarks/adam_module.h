#pragma once
// The module the GPU-side benchmarks train: a classifier net, cross-entropy, `train_loss` logged
// every step, Adam(1e-3) (the optimizer of the side-by-side with Lightning): torch::optim's
// by default, volt::FusedAdamW in Adam mode (one multi-tensor step on CUDA) with `fused`.

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "volt/volt.h"

namespace volt_bench {

template <typename Net>
class AdamModule : public volt::Module {
 public:
  explicit AdamModule(std::shared_ptr<Net> net, bool fused = false)
      : net_(register_module("net", net)), fused_(fused) {}
  torch::Tensor training_step(const volt::Batch& b, int64_t) override {
    auto loss = torch::cross_entropy_loss(net_->forward(b.input), b.target);
    log("train_loss", loss);
    return loss;
  }
  std::vector<volt::OptimizerConfig> configure_optimizers() override {
    if (fused_) {
      return {std::make_shared<volt::FusedAdamW>(
          parameters(), volt::FusedAdamWOptions(1e-3).weight_decay(0).adam_w_mode(false))};
    }
    return {std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(1e-3))};
  }

 private:
  std::shared_ptr<Net> net_;
  bool fused_;
};

}  // namespace volt_bench
