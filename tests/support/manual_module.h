#pragma once
// A TinyClassifier that steps its optimizer itself (manual optimization), for the tests of what
// works with it and what refuses it.

#include "tiny.h"

namespace volt_test {

class ManualTinyClassifier : public TinyClassifier {
 public:
  ManualTinyClassifier() { set_automatic_optimization(false); }
  torch::Tensor training_step(const volt::Batch& b, int64_t) override {
    auto opt = optimizers().at(0);
    opt.zero_grad();
    manual_backward(torch::cross_entropy_loss(forward(b.input), b.target));
    opt.step();
    return {};
  }
};

}  // namespace volt_test
