#include "volt/strategies/strategy.h"

#include <torch/torch.h>

#include "volt/core/check.h"
#include "volt/core/module.h"
#include "volt/io/state.h"

namespace volt {

Strategy::Strategy(std::shared_ptr<Accelerator> accelerator, std::shared_ptr<Precision> precision,
                   std::shared_ptr<CheckpointIO> checkpoint_io)
    : accelerator_(std::move(accelerator)),
      precision_(std::move(precision)),
      checkpoint_io_(checkpoint_io ? std::move(checkpoint_io)
                                   : std::make_shared<TorchCheckpointIO>()) {
  VOLT_CHECK(accelerator_ != nullptr, ConfigError, "[Strategy] accelerator is null.");
  VOLT_CHECK(precision_ != nullptr, ConfigError, "[Strategy] precision is null.");
}

void Strategy::setup_module(Module& module) {
  accelerator_->setup_device(root_device());
  module.to(root_device());
  precision_->convert_module(module);
}

Batch Strategy::batch_to_device(const Batch& batch) const {
  const auto dev = root_device();
  if (batch.input.defined() && batch.input.device() == dev) {
    bool all_here = !batch.target.defined() || batch.target.device() == dev;
    for (const auto& kv : batch.extra) all_here = all_here && kv.second.device() == dev;
    if (all_here) return batch;  // CPU training: no copy at all
  }
  return batch.to(dev, /*non_blocking=*/true);
}

void Strategy::backward(const at::Tensor& loss) { precision_->backward(loss); }

bool Strategy::optimizer_step(torch::optim::Optimizer& optimizer,
                              c10::optional<double> clip_value, ClipAlgorithm algorithm) {
  precision_->unscale_gradients(optimizer);
  if (clip_value && *clip_value > 0) precision_->clip_gradients(optimizer, *clip_value, algorithm);
  return precision_->optimizer_step(optimizer);
}

void Strategy::save_model_state(const Module& module, torch::serialize::OutputArchive& ar) const {
  save_module_state(module, ar);
}

void Strategy::load_model_state(Module& module, torch::serialize::InputArchive& ar) const {
  load_module_state(module, ar, /*strict=*/true);
}

void Strategy::save_optimizer_state(const torch::optim::Optimizer& optimizer, const Module& module,
                                    torch::serialize::OutputArchive& ar) const {
  volt::save_optimizer_state(optimizer, module, ar);
}

void Strategy::load_optimizer_state(torch::optim::Optimizer& optimizer, const Module& module,
                                    torch::serialize::InputArchive& ar) const {
  volt::load_optimizer_state(optimizer, module, ar);
}

void Strategy::save_checkpoint(torch::serialize::OutputArchive& archive, const std::string& path) {
  if (is_global_zero()) checkpoint_io_->save(archive, path);
}

torch::serialize::InputArchive Strategy::load_checkpoint(const std::string& path) {
  return checkpoint_io_->load(path);
}

void Strategy::remove_checkpoint(const std::string& path) {
  if (is_global_zero()) checkpoint_io_->remove(path);
}

SingleDeviceStrategy::SingleDeviceStrategy(c10::Device device,
                                           std::shared_ptr<Accelerator> accelerator,
                                           std::shared_ptr<Precision> precision,
                                           std::shared_ptr<CheckpointIO> checkpoint_io)
    : Strategy(std::move(accelerator), std::move(precision), std::move(checkpoint_io)),
      device_(device) {}

}  // namespace volt
