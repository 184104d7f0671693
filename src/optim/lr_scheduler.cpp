#include "volt/optim/lr_scheduler.h"

#include <cmath>

#include "volt/core/check.h"

namespace volt {

LRScheduler::LRScheduler(torch::optim::Optimizer& optimizer) : optimizer_(optimizer) {
  for (auto& g : optimizer_.param_groups()) base_lrs_.push_back(g.options().get_lr());
}

void LRScheduler::step() {
  ++last_epoch_;
  apply();
}

void LRScheduler::apply() {
  auto& groups = optimizer_.param_groups();
  for (size_t i = 0; i < groups.size(); ++i) groups[i].options().set_lr(lr_at(i, last_epoch_));
}

std::vector<double> LRScheduler::last_lrs() const {
  std::vector<double> out;
  for (size_t i = 0; i < base_lrs_.size(); ++i) out.push_back(lr_at(i, last_epoch_));
  return out;
}

void LRScheduler::save(torch::serialize::OutputArchive& archive) const {
  archive.write("last_epoch", c10::IValue(last_epoch_));
  archive.write("base_lrs", c10::IValue(c10::List<double>(base_lrs_)));
}

void LRScheduler::load(torch::serialize::InputArchive& archive) {
  c10::IValue le, bl;
  archive.read("last_epoch", le);
  archive.read("base_lrs", bl);
  auto lrs = bl.toDoubleList();
  VOLT_CHECK(lrs.size() == base_lrs_.size(), CheckpointError, "[", name(),
             "] checkpoint has ", lrs.size(), " param groups but the optimizer has ",
             base_lrs_.size(), "; resume with the same optimizer setup.");
  last_epoch_ = le.toInt();
  base_lrs_.assign(lrs.begin(), lrs.end());
  apply();
}

StepLR::StepLR(torch::optim::Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer), step_size_(step_size), gamma_(gamma) {
  VOLT_CHECK(step_size >= 1, ConfigError, "[StepLR] step_size=", step_size, " must be >= 1.");
}

double StepLR::lr_at(size_t group, int64_t last_epoch) const {
  return base_lrs_[group] * std::pow(gamma_, static_cast<double>(last_epoch / step_size_));
}

LambdaLR::LambdaLR(torch::optim::Optimizer& optimizer, std::function<double(int64_t)> factor)
    : LRScheduler(optimizer), factor_(std::move(factor)) {
  VOLT_CHECK(static_cast<bool>(factor_), ConfigError, "[LambdaLR] factor function is empty.");
}

double LambdaLR::lr_at(size_t group, int64_t last_epoch) const {
  return base_lrs_[group] * factor_(last_epoch);
}

}  // namespace volt
