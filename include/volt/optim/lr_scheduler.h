#pragma once
/// LR schedulers that set each param group's lr of a libtorch optimizer in closed form.

#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace volt {

/// A scheduler owns a step counter (`last_epoch`, PyTorch's name) and writes lrs into its
/// optimizer's param groups. step() advances one interval; state round-trips through archives.
class LRScheduler {
 public:
  explicit LRScheduler(torch::optim::Optimizer& optimizer);
  virtual ~LRScheduler() = default;
  /// Advances one interval and writes the new lrs.
  void step();
  /// Optional metric for schedulers that watch one (ReduceLROnPlateau); others ignore it.
  virtual void step(double metric) { step(); }
  /// The lrs written by the last step (the base lrs before any step).
  std::vector<double> last_lrs() const;
  int64_t last_epoch() const { return last_epoch_; }
  virtual std::string name() const = 0;
  virtual void save(torch::serialize::OutputArchive& archive) const;
  virtual void load(torch::serialize::InputArchive& archive);

 protected:
  /// The lr of param group `group` after `last_epoch` steps.
  virtual double lr_at(size_t group, int64_t last_epoch) const = 0;
  torch::optim::Optimizer& optimizer_;
  std::vector<double> base_lrs_;
  int64_t last_epoch_ = 0;

 private:
  void apply();
};

/// lr = base_lr * gamma^(floor(last_epoch / step_size)), as torch.optim.lr_scheduler.StepLR.
class StepLR : public LRScheduler {
 public:
  StepLR(torch::optim::Optimizer& optimizer, int64_t step_size, double gamma = 0.1);
  std::string name() const override { return "StepLR"; }

 protected:
  double lr_at(size_t group, int64_t last_epoch) const override;

 private:
  int64_t step_size_;
  double gamma_;
};

/// lr = base_lr * factor(last_epoch), as torch.optim.lr_scheduler.LambdaLR.
class LambdaLR : public LRScheduler {
 public:
  LambdaLR(torch::optim::Optimizer& optimizer, std::function<double(int64_t)> factor);
  std::string name() const override { return "LambdaLR"; }

 protected:
  double lr_at(size_t group, int64_t last_epoch) const override;

 private:
  std::function<double(int64_t)> factor_;
};

}  // namespace volt
