#pragma once
/// LR schedulers that reproduce torch.optim.lr_scheduler (PyTorch 1.13) on libtorch optimizers:
/// StepLR, MultiStepLR, ExponentialLR, CosineAnnealingLR, CosineAnnealingWarmRestarts, LinearLR,
/// ConstantLR, PolynomialLR, LambdaLR, MultiplicativeLR, OneCycleLR, CyclicLR, SWALR,
/// SequentialLR, ChainedScheduler and ReduceLROnPlateau; DeepSpeed's WarmupLR and WarmupDecayLR.
///
///   std::vector<std::shared_ptr<volt::LRScheduler>> parts = {
///       std::make_shared<volt::LinearLR>(*opt, volt::LinearLROptions().start_factor(0.1)),
///       std::make_shared<volt::CosineAnnealingLR>(*opt, /*t_max=*/95)};
///   auto sched = std::make_shared<volt::SequentialLR>(*opt, parts, std::vector<int64_t>{5});
///
/// Each scheduler produces, step by step, the lrs its PyTorch namesake produces (checked against
/// sequences from tools/lr_scheduler_reference.py, in fp64).

#include <c10/util/Optional.h>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

namespace volt {

class ChainedScheduler;
class SequentialLR;

/// A scheduler owns a step counter (`last_epoch`, PyTorch's name) and writes lrs into its
/// optimizer's param groups. As in PyTorch, constructing a scheduler performs its initial step
/// (last_epoch 0) and each step() advances one interval; state round-trips through archives.
class LRScheduler {
 public:
  explicit LRScheduler(torch::optim::Optimizer& optimizer);
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;
  virtual ~LRScheduler() = default;
  /// Advances one interval and writes the new lrs.
  virtual void step();
  /// Metric-driven step for schedulers that watch one (ReduceLROnPlateau); the others ignore
  /// the metric and step().
  virtual void step(double metric);
  /// Starts the schedule again from `initial_lrs` (one per scheduled param group, or one for
  /// all), as if the optimizer had been built with these rates and this scheduler then: the
  /// groups take them, base_lrs become them (not where the scheduler sets its own, as
  /// OneCycleLR from max_lr) and the initial step runs again. Only before the first step():
  /// ValueError after one; ConfigError for a rate that is not positive and finite or a count
  /// that matches neither. The LearningRateFinder callback puts its suggestion into a run's
  /// optimizer with it.
  virtual void restart_at(const std::vector<double>& initial_lrs);
  /// The lrs written by the last step (by the constructor before any step).
  const std::vector<double>& last_lrs() const { return last_lrs_; }
  /// Each group's initial lr (PyTorch's base_lrs / param_group['initial_lr']).
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  /// Steps taken since construction.
  int64_t last_epoch() const { return last_epoch_; }
  torch::optim::Optimizer& optimizer() const { return optimizer_; }
  virtual std::string name() const = 0;
  /// Writes last_epoch, base and last lrs, and the scheduler's own counters.
  virtual void save(torch::serialize::OutputArchive& archive) const;
  /// Restores what save() wrote and writes the restored lrs into the optimizer.
  virtual void load(torch::serialize::InputArchive& archive);

 protected:
  /// The lrs for `last_epoch_` (already advanced) given the lrs now in the param groups:
  /// PyTorch's chainable get_lr(). May also set other values the schedule drives (OneCycleLR's
  /// momentum).
  virtual std::vector<double> compute_lrs(const std::vector<double>& current) = 0;
  /// The lrs for `last_epoch_` from base_lrs alone (PyTorch's _get_closed_form_lr), used when
  /// SequentialLR restarts this scheduler at a milestone. Default: compute_lrs(current).
  virtual std::vector<double> closed_form_lrs(const std::vector<double>& current);
  /// PyTorch's _initial_step(): sets last_epoch 0 and writes compute_lrs(). Every concrete
  /// scheduler's constructor calls it last.
  void initial_step();
  /// ++last_epoch_ and writes compute_lrs(); leaves the scheduler unchanged if that throws.
  void advance();
  /// The lrs now in the scheduled param groups (those the optimizer had when this was built).
  std::vector<double> current_lrs() const;
  /// Writes `lrs` into the first lrs.size() param groups (the scheduled ones, and with
  /// chains_added_groups_ those added since) and into last_lrs_.
  void write_lrs(const std::vector<double>& lrs);

  torch::optim::Optimizer& optimizer_;
  std::vector<double> base_lrs_;
  std::vector<double> last_lrs_;
  int64_t last_epoch_ = 0;
  /// True for schedulers that, like PyTorch's OneCycleLR, overwrite param_group['initial_lr']
  /// (base_lrs_) instead of taking the lr they find.
  bool overrides_initial_lr_ = false;
  /// True for schedulers that, like PyTorch's CyclicLR, keep base lrs of their own (their
  /// base_lr) without touching param_group['initial_lr'], which the others share.
  bool keeps_own_base_lrs_ = false;
  /// True for schedulers whose PyTorch get_lr() scales every param group's current lr (StepLR,
  /// MultiStepLR, ExponentialLR, CosineAnnealingLR, LinearLR, ConstantLR, PolynomialLR): a group
  /// added after they were built (BaseFinetuning's) is scheduled too, and step() hands
  /// compute_lrs every group's lr. The others zip over base_lrs or per-group settings in
  /// PyTorch and leave such a group's lr as its adder set it.
  bool chains_added_groups_ = false;

 private:
  friend class ChainedScheduler;
  friend class SequentialLR;
  /// PyTorch's step(0) as SequentialLR calls it at a milestone: last_epoch 0, closed form.
  void restart();
  /// `schedulers` in construction order.
  static std::vector<LRScheduler*> by_age(
      const std::vector<std::shared_ptr<LRScheduler>>& schedulers);
  /// Gives schedulers built on one optimizer (oldest first) the base lrs PyTorch gives them
  /// through the param_group['initial_lr'] they share: `initial`, the lr the oldest found,
  /// until a scheduler that overrides it (OneCycleLR), whose value `initial` then becomes.
  static void share_initial_lrs(const std::vector<LRScheduler*>& by_age,
                                std::vector<double>& initial);
  /// Construction order, which SequentialLR needs to rebuild PyTorch's shared initial_lr.
  uint64_t serial_;
};

/// lr = base_lr * gamma^(floor(last_epoch / step_size)), as torch.optim.lr_scheduler.StepLR.
class StepLR : public LRScheduler {
 public:
  StepLR(torch::optim::Optimizer& optimizer, int64_t step_size, double gamma = 0.1);
  std::string name() const override { return "StepLR"; }

 protected:
  std::vector<double> compute_lrs(const std::vector<double>& current) override;
  std::vector<double> closed_form_lrs(const std::vector<double>& current) override;

 private:
  int64_t step_size_;
  double gamma_;
};

/// lr = base_lr * gamma^(number of milestones <= last_epoch); a milestone listed k times
/// multiplies by gamma^k. As torch.optim.lr_scheduler.MultiStepLR.
class MultiStepLR : public LRScheduler {
 public:
  MultiStepLR(torch::optim::Optimizer& optimizer, std::vector<int64_t> milestones,
              double gamma = 0.1);
  std::string name() const override { return "MultiStepLR"; }

 protected:
  std::vector<double> compute_lrs(const std::vector<double>& current) override;
  std::vector<double> closed_form_lrs(const std::vector<double>& current) override;

 private:
  std::vector<int64_t> milestones_;  // sorted
  double gamma_;
};

/// lr = base_lr * gamma^last_epoch, as torch.optim.lr_scheduler.ExponentialLR.
class ExponentialLR : public LRScheduler {
 public:
  ExponentialLR(torch::optim::Optimizer& optimizer, double gamma);
  std::string name() const override { return "ExponentialLR"; }

 protected:
  std::vector<double> compute_lrs(const std::vector<double>& current) override;
  std::vector<double> closed_form_lrs(const std::vector<double>& current) override;

 private:
  double gamma_;
};

/// Cosine annealing from base_lr to eta_min over t_max steps, as
/// torch.optim.lr_scheduler.CosineAnnealingLR: PyTorch's recursive form, so past t_max the lr
/// climbs back up (period 2 * t_max) and external lr changes compose as in PyTorch.
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(torch::optim::Optimizer& optimizer, int64_t t_max, double eta_min = 0.0);
  std::string name() const override { return "CosineAnnealingLR"; }

 protected:
  std::vector<double> compute_lrs(const std::vector<double>& current) override;
  std::vector<double> closed_form_lrs(const std::vector<double>& current) override;

 private:
  int64_t t_max_;
  double eta_min_;
};

/// SGDR: cosine annealing restarted every t_i steps, t_0 first and t_i *= t_mult after each
/// restart, as torch.optim.lr_scheduler.CosineAnnealingWarmRestarts stepped without an epoch.
class CosineAnnealingWarmRestarts : public LRScheduler {
 public:
  CosineAnnealingWarmRestarts(torch::optim::Optimizer& optimizer, int64_t t_0, int64_t t_mult = 1,
                              double eta_min = 0.0);
  std::string name() const override { return "CosineAnnealingWarmRestarts"; }

 protected:
  std::vector<double> compute_lrs(const std::vector<double>& current) override;

 private:
  int64_t t_0_;
  int64_t t_mult_;
  double eta_min_;
};

/// Options for LinearLR.
struct LinearLROptions {
  /// Factor applied to base_lr at step 0, in (0, 1]. Default: 1/3.
  TORCH_ARG(double, start_factor) = 1.0 / 3.0;
  /// Factor reached at step total_iters and kept after, in [0, 1]. Default: 1.
  TORCH_ARG(double, end_factor) = 1.0;
  /// Steps from start_factor to end_factor, >= 1. Default: 5.
  TORCH_ARG(int64_t, total_iters) = 5;
};

std::ostream& operator<<(std::ostream& os, const LinearLROptions& o);

/// lr = base_lr * factor, the factor moving linearly from start_factor to end_factor over
/// total_iters steps (a warmup when start < end), as torch.optim.lr_scheduler.LinearLR.
class LinearLR : public LRScheduler {
 public:
  explicit LinearLR(torch::optim::Optimizer& optimizer, LinearLROptions options = {});
  std::string name() const override { return "LinearLR"; }
  const LinearLROptions& options() const { return options_; }

 protected:
  std::vector<double> compute_lrs(const std::vector<double>& current) override;
  std::vector<double> closed_form_lrs(const std::vector<double>& current) override;

 private:
  LinearLROptions options_;
};

/// lr = base_lr * factor(last_epoch), as torch.optim.lr_scheduler.LambdaLR; one function for
/// every group or one per group. The functions themselves are not saved.
class LambdaLR : public LRScheduler {
 public:
  LambdaLR(torch::optim::Optimizer& optimizer, std::function<double(int64_t)> factor);
  LambdaLR(torch::optim::Optimizer& optimizer, std::vector<std::function<double(int64_t)>> factors);
  std::string name() const override { return "LambdaLR"; }

 protected:
  std::vector<double> compute_lrs(const std::vector<double>& current) override;

 private:
  std::vector<std::function<double(int64_t)>> factors_;
};

/// lr = previous lr * factor(last_epoch) at every step after the first (construction leaves the
/// lr as it is), as torch.optim.lr_scheduler.MultiplicativeLR; one function for every group or
/// one per group. The functions themselves are not saved.
class MultiplicativeLR : public LRScheduler {
 public:
  MultiplicativeLR(torch::optim::Optimizer& optimizer, std::function<double(int64_t)> factor);
  MultiplicativeLR(torch::optim::Optimizer& optimizer,
                   std::vector<std::function<double(int64_t)>> factors);
  std::string name() const override { return "MultiplicativeLR"; }

 protected:
  std::vector<double> compute_lrs(const std::vector<double>& current) override;

 private:
  std::vector<std::function<double(int64_t)>> factors_;
};

/// lr = base_lr * factor until step total_iters, base_lr from then on, as
/// torch.optim.lr_scheduler.ConstantLR (chainable: it divides by factor at total_iters).
class ConstantLR : public LRScheduler {
 public:
  /// factor in (0, 1] (PyTorch takes 0 and then divides by it); total_iters >= 0.
  explicit ConstantLR(torch::optim::Optimizer& optimizer, double factor = 1.0 / 3.0,
                      int64_t total_iters = 5);
  std::string name() const override { return "ConstantLR"; }

 protected:
  std::vector<double> compute_lrs(const std::vector<double>& current) override;
  std::vector<double> closed_form_lrs(const std::vector<double>& current) override;

 private:
  double factor_;
  int64_t total_iters_;
};

/// lr = base_lr * (1 - min(last_epoch, total_iters) / total_iters)^power: a polynomial decay to
/// 0 at total_iters, as torch.optim.lr_scheduler.PolynomialLR (PyTorch 1.13).
class PolynomialLR : public LRScheduler {
 public:
  /// total_iters >= 1; power > 0 and finite.
  explicit PolynomialLR(torch::optim::Optimizer& optimizer, int64_t total_iters = 5,
                        double power = 1.0);
  std::string name() const override { return "PolynomialLR"; }

 protected:
  std::vector<double> compute_lrs(const std::vector<double>& current) override;
  std::vector<double> closed_form_lrs(const std::vector<double>& current) override;

 private:
  int64_t total_iters_;
  double power_;
};

/// DeepSpeed's warmup: "log" raises the lr like log(step + 1) / log(warmup_num_steps),
/// "linear" like step / warmup_num_steps.
enum class WarmupType { kLog, kLinear };

struct WarmupLROptions {
  /// lr at the start of the warmup. Default: 0.
  TORCH_ARG(double, warmup_min_lr) = 0.0;
  /// lr at its end. Default: 0.001.
  TORCH_ARG(double, warmup_max_lr) = 0.001;
  /// Steps from min to max (DeepSpeed uses at least 2). Default: 1000.
  TORCH_ARG(int64_t, warmup_num_steps) = 1000;
  /// Default: WarmupType::kLog (DeepSpeed's default).
  TORCH_ARG(WarmupType, warmup_type) = WarmupType::kLog;
  /// WarmupDecayLR only: the step at which the lr has decayed linearly to 0. Default: 0 (unset).
  TORCH_ARG(int64_t, total_num_steps) = 0;
};

std::ostream& operator<<(std::ostream& os, const WarmupLROptions& o);

/// DeepSpeed's WarmupLR (deepspeed.runtime.lr_schedules), stepped after each optimizer step:
/// after step k the lr is min + (max - min) * gamma(k - 1), gamma rising to 1 over
/// warmup_num_steps and staying there. Constructing it sets the lr to warmup_min_lr, as
/// DeepSpeed's does, so the first optimizer step runs at it.
class WarmupLR : public LRScheduler {
 public:
  explicit WarmupLR(torch::optim::Optimizer& optimizer, WarmupLROptions options = {});
  std::string name() const override { return "WarmupLR"; }
  const WarmupLROptions& options() const { return options_; }

 protected:
  std::vector<double> compute_lrs(const std::vector<double>& current) override;
  /// The factor between min and max lr for DeepSpeed's last_batch_iteration `it` (>= 0).
  virtual double gamma(int64_t it) const;
  double warmup_gamma(int64_t it) const;
  WarmupLROptions options_;
  int64_t warmup_steps_;
};

/// DeepSpeed's WarmupDecayLR: WarmupLR, then a linear decay to 0 at total_num_steps.
class WarmupDecayLR : public WarmupLR {
 public:
  WarmupDecayLR(torch::optim::Optimizer& optimizer, WarmupLROptions options);
  std::string name() const override { return "WarmupDecayLR"; }

 protected:
  double gamma(int64_t it) const override;
};

/// How OneCycleLR moves between the ends of a phase.
enum class AnnealStrategy { kCos, kLinear };

/// Options for OneCycleLR; max_lr and total_steps are required.
struct OneCycleLROptions {
  /// The same peak lr for every param group.
  OneCycleLROptions(double max_lr, int64_t total_steps)
      : max_lr_({max_lr}), total_steps_(total_steps) {}
  /// One peak lr per param group.
  OneCycleLROptions(std::vector<double> max_lr, int64_t total_steps)
      : max_lr_(std::move(max_lr)), total_steps_(total_steps) {}
  /// Peak lr: one value for all groups or one per group.
  TORCH_ARG(std::vector<double>, max_lr);
  /// Steps in the cycle; step() may be called at most this many times.
  TORCH_ARG(int64_t, total_steps);
  /// Fraction of the cycle spent raising the lr, in [0, 1]. Default: 0.3.
  TORCH_ARG(double, pct_start) = 0.3;
  /// Cosine or linear annealing. Default: AnnealStrategy::kCos.
  TORCH_ARG(AnnealStrategy, anneal_strategy) = AnnealStrategy::kCos;
  /// Cycle momentum (SGD, RMSprop) or beta1 (Adam, AdamW) inversely to the lr. Default: true.
  TORCH_ARG(bool, cycle_momentum) = true;
  /// Momentum at the lr peak, in [0, 1). Default: 0.85.
  TORCH_ARG(double, base_momentum) = 0.85;
  /// Momentum at the start and end of the cycle, in [0, 1). Default: 0.95.
  TORCH_ARG(double, max_momentum) = 0.95;
  /// initial_lr = max_lr / div_factor, > 0. Default: 25.
  TORCH_ARG(double, div_factor) = 25.0;
  /// min_lr = initial_lr / final_div_factor, > 0. Default: 1e4.
  TORCH_ARG(double, final_div_factor) = 1e4;
  /// Three phases (up, back down to initial_lr, down to min_lr) instead of two. Default: false.
  TORCH_ARG(bool, three_phase) = false;
};

std::ostream& operator<<(std::ostream& os, const OneCycleLROptions& o);

/// The 1cycle policy (Smith & Topin, arXiv:1708.07120), as torch.optim.lr_scheduler.OneCycleLR
/// with total_steps: from max_lr / div_factor up to max_lr in pct_start of the cycle, then down
/// to the minimum lr. With cycle_momentum it also drives SGD/RMSprop momentum or Adam/AdamW
/// beta1 between max_momentum and base_momentum; base/max momentum are one value for all
/// groups (PyTorch also takes per-group lists). Like PyTorch, base_lrs become
/// max_lr / div_factor and step number total_steps (one past the last phase end) is allowed.
class OneCycleLR : public LRScheduler {
 public:
  OneCycleLR(torch::optim::Optimizer& optimizer, OneCycleLROptions options);
  std::string name() const override { return "OneCycleLR"; }
  const OneCycleLROptions& options() const { return options_; }
  void load(torch::serialize::InputArchive& archive) override;

 protected:
  std::vector<double> compute_lrs(const std::vector<double>& current) override;

 private:
  enum class Level { kInitial, kMax, kMin };
  struct Phase {
    double end_step;
    Level start_lr, end_lr;
    bool start_at_max_momentum, end_at_max_momentum;  // else at base_momentum
  };
  double lr_of(size_t group, Level level) const;
  /// The lrs at `step_num`; sets the momentum when cycle_momentum (PyTorch's get_lr()).
  std::vector<double> schedule_at(int64_t step_num);
  double anneal(double start, double end, double pct) const;
  void set_momentum(size_t group, double momentum);
  OneCycleLROptions options_;
  std::vector<Phase> phases_;
  std::vector<double> max_lrs_, min_lrs_;
};

/// CyclicLR's built-in amplitude policies (Smith, arXiv:1506.01186): "triangular" keeps it,
/// "triangular2" halves it every cycle, "exp_range" scales it by gamma^step.
enum class CyclicMode { kTriangular, kTriangular2, kExpRange };
/// What a custom CyclicLR scale function is called with: the cycle number (from 1) or the step.
enum class CyclicScaleMode { kCycle, kIterations };

/// Options for CyclicLR; base_lr and max_lr are required.
struct CyclicLROptions {
  /// The same bounds for every param group.
  CyclicLROptions(double base_lr, double max_lr) : base_lr_({base_lr}), max_lr_({max_lr}) {}
  /// One pair of bounds per param group.
  CyclicLROptions(std::vector<double> base_lr, std::vector<double> max_lr)
      : base_lr_(std::move(base_lr)), max_lr_(std::move(max_lr)) {}
  /// Lower bound of the cycle and the initial lr: one value for all groups or one per group.
  TORCH_ARG(std::vector<double>, base_lr);
  /// Upper bound of the cycle (reached only as the amplitude allows): one or one per group.
  TORCH_ARG(std::vector<double>, max_lr);
  /// Steps from base_lr up to max_lr, > 0. Default: 2000.
  TORCH_ARG(double, step_size_up) = 2000;
  /// Steps back down, >= 0. Default: unset (step_size_up).
  TORCH_ARG(c10::optional<double>, step_size_down) = c10::nullopt;
  /// Amplitude policy when no scale_fn is given. Default: CyclicMode::kTriangular.
  TORCH_ARG(CyclicMode, mode) = CyclicMode::kTriangular;
  /// exp_range's base, > 0. Default: 1.
  TORCH_ARG(double, gamma) = 1.0;
  /// A custom amplitude scale in [0, 1] that replaces `mode`; not saved in checkpoints.
  TORCH_ARG(std::function<double(double)>, scale_fn);
  /// What scale_fn is called with. Default: CyclicScaleMode::kCycle.
  TORCH_ARG(CyclicScaleMode, scale_mode) = CyclicScaleMode::kCycle;
  /// Cycle momentum (SGD, RMSprop) or beta1 (Adam, AdamW) inversely to the lr. Default: true.
  TORCH_ARG(bool, cycle_momentum) = true;
  /// Momentum at the lr peak, one value or one per group, in [0, 1). Default: {0.8}.
  TORCH_ARG(std::vector<double>, base_momentum) = {0.8};
  /// Momentum at base_lr, one value or one per group, in [0, 1). Default: {0.9}.
  TORCH_ARG(std::vector<double>, max_momentum) = {0.9};
};

std::ostream& operator<<(std::ostream& os, const CyclicLROptions& o);

/// Cyclical learning rates (Smith, arXiv:1506.01186), as torch.optim.lr_scheduler.CyclicLR,
/// stepped after every batch: the lr goes from base_lr up to max_lr over step_size_up steps and
/// back over step_size_down, the amplitude scaled by the mode or scale_fn. Construction sets the
/// lr to base_lr; base_lrs are base_lr whatever lr the groups had. With cycle_momentum it moves
/// momentum (beta1 for Adam/AdamW, as PyTorch 2.x; PyTorch 1.13 refuses them) from max_momentum
/// down to base_momentum and back.
class CyclicLR : public LRScheduler {
 public:
  CyclicLR(torch::optim::Optimizer& optimizer, CyclicLROptions options);
  std::string name() const override { return "CyclicLR"; }
  const CyclicLROptions& options() const { return options_; }
  void load(torch::serialize::InputArchive& archive) override;

 protected:
  std::vector<double> compute_lrs(const std::vector<double>& current) override;

 private:
  /// The lrs at `step`; sets the momentum when cycle_momentum (PyTorch's get_lr()).
  std::vector<double> schedule_at(int64_t step);
  CyclicLROptions options_;
  std::vector<double> max_lrs_, base_momenta_, max_momenta_;
  double total_size_, step_ratio_;
};

/// Anneals each group's lr to a fixed SWA lr over `anneal_epochs` steps and then holds it, as
/// torch.optim.swa_utils.SWALR (PyTorch 1.13): step k writes swa_lr * a + lr0 * (1 - a) with
/// a = anneal(min(k / anneal_epochs, 1)), cos(t) = (1 - cos(pi t)) / 2 or linear(t) = t, lr0 the
/// lr the group had when the scheduler was built (anneal_epochs 0: swa_lr at once). Chainable as
/// PyTorch's: it recovers lr0 from the current lr. StochasticWeightAveraging drives the same
/// schedule through `lr_at`.
class SWALR : public LRScheduler {
 public:
  /// One swa_lr per param group, or one value for all of them. ConfigError when a value is not
  /// positive and finite, the count differs from the optimizer's groups, or anneal_epochs < 0.
  SWALR(torch::optim::Optimizer& optimizer, std::vector<double> swa_lrs, int64_t anneal_epochs = 10,
        AnnealStrategy anneal_strategy = AnnealStrategy::kCos);
  SWALR(torch::optim::Optimizer& optimizer, double swa_lr, int64_t anneal_epochs = 10,
        AnnealStrategy anneal_strategy = AnnealStrategy::kCos);
  std::string name() const override { return "SWALR"; }
  const std::vector<double>& swa_lrs() const { return swa_lrs_; }
  /// The schedule in closed form: the lr `step` steps after a group at `lr0` started annealing
  /// to `swa_lr`.
  static double lr_at(double lr0, double swa_lr, int64_t step, int64_t anneal_epochs,
                      AnnealStrategy anneal_strategy);
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 protected:
  std::vector<double> compute_lrs(const std::vector<double>& current) override;
  /// At a SequentialLR milestone: one step into the annealing (see step_offset_).
  std::vector<double> closed_form_lrs(const std::vector<double>& current) override;

 private:
  std::vector<double> swa_lrs_;
  int64_t anneal_epochs_;
  AnnealStrategy anneal_strategy_;
  /// PyTorch's SWALR counts its steps by _step_count, not last_epoch: behind a SequentialLR
  /// milestone (whose step(0) resets last_epoch but not _step_count, which this scheduler's own
  /// construction advanced) it runs one step ahead of last_epoch.
  int64_t step_offset_ = 0;
};

/// Chains schedulers: schedulers[i] drives the lr from milestones[i-1] on, as
/// torch.optim.lr_scheduler.SequentialLR in PyTorch 1.13, quirks included: at a milestone the
/// next scheduler restarts from its closed form at step 0 (PyTorch's step(0)), and all of them
/// share the initial lr of the first one built (OneCycleLR overwrites it, as in PyTorch). The
/// schedulers must be built on `optimizer` and from then on be stepped only through this one.
class SequentialLR : public LRScheduler {
 public:
  SequentialLR(torch::optim::Optimizer& optimizer,
               std::vector<std::shared_ptr<LRScheduler>> schedulers,
               std::vector<int64_t> milestones);
  std::string name() const override { return "SequentialLR"; }
  using LRScheduler::step;
  void step() override;
  /// Starts again as if built on an optimizer at `initial_lrs`: the chained schedulers take
  /// them as their initial lrs (as at construction) and the first one starts.
  void restart_at(const std::vector<double>& initial_lrs) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 protected:
  /// Unused: step() delegates to the active scheduler. Returns `current`.
  std::vector<double> compute_lrs(const std::vector<double>& current) override;

 private:
  /// The end of construction, shared with restart_at: the chained schedulers share `initial`
  /// as their initial lrs (OneCycleLR overwrites it for those built after it) and the first
  /// one takes its step 0.
  void start(std::vector<double> initial);
  std::vector<std::shared_ptr<LRScheduler>> schedulers_;
  std::vector<int64_t> milestones_;
};

/// Steps every scheduler in turn at each step, so their factors compose, as
/// torch.optim.lr_scheduler.ChainedScheduler: ConstantLR(0.1, 2) chained with ExponentialLR(0.9)
/// gives 0.09, 0.081, 0.729, ... from lr 1. The schedulers, built on one optimizer in the order
/// given (each took its initial step as it was built), are from then on stepped only through
/// this one; a ReduceLROnPlateau cannot be chained (it needs a metric).
class ChainedScheduler : public LRScheduler {
 public:
  explicit ChainedScheduler(std::vector<std::shared_ptr<LRScheduler>> schedulers);
  std::string name() const override { return "ChainedScheduler"; }
  using LRScheduler::step;
  void step() override;
  /// Starts again as if the optimizer had been built at `initial_lrs` and the schedulers then.
  void restart_at(const std::vector<double>& initial_lrs) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 protected:
  /// Unused: step() steps the chained schedulers. Returns `current`.
  std::vector<double> compute_lrs(const std::vector<double>& current) override;

 private:
  /// Construction's end, shared with restart_at: the groups take `initial` and the chained
  /// schedulers take their initial steps again, oldest first, with PyTorch's base lrs.
  void start(std::vector<double> initial);
  std::vector<std::shared_ptr<LRScheduler>> schedulers_;
};

/// Whether a smaller (kMin, e.g. a loss) or larger (kMax, e.g. an accuracy) metric is better.
enum class PlateauMode { kMin, kMax };
/// Whether ReduceLROnPlateau's threshold is relative to the best metric or absolute.
enum class ThresholdMode { kRel, kAbs };

/// Options for ReduceLROnPlateau.
struct ReduceLROnPlateauOptions {
  /// Direction of improvement. Default: PlateauMode::kMin.
  TORCH_ARG(PlateauMode, mode) = PlateauMode::kMin;
  /// new_lr = lr * factor, in [0, 1). Default: 0.1.
  TORCH_ARG(double, factor) = 0.1;
  /// Bad steps tolerated before reducing, >= 0. Default: 10.
  TORCH_ARG(int64_t, patience) = 10;
  /// Minimal improvement that counts, >= 0. Default: 1e-4.
  TORCH_ARG(double, threshold) = 1e-4;
  /// Relative (best * (1 -/+ threshold)) or absolute (best -/+ threshold). Default: kRel.
  TORCH_ARG(ThresholdMode, threshold_mode) = ThresholdMode::kRel;
  /// Steps after a reduction during which bad steps are not counted, >= 0. Default: 0.
  TORCH_ARG(int64_t, cooldown) = 0;
  /// Lower bound of the lr: one value for all groups or one per group, >= 0. Default: {0}.
  TORCH_ARG(std::vector<double>, min_lr) = {0.0};
  /// Reductions smaller than eps are skipped, >= 0. Default: 1e-8.
  TORCH_ARG(double, eps) = 1e-8;
};

std::ostream& operator<<(std::ostream& os, const ReduceLROnPlateauOptions& o);

/// Multiplies the lr by factor once a metric has not improved for more than `patience` steps,
/// as torch.optim.lr_scheduler.ReduceLROnPlateau. Needs a metric: configure it with
/// OptimizerConfig::monitor; step() without one throws ConfigError. Construction leaves the
/// lrs as they are.
class ReduceLROnPlateau : public LRScheduler {
 public:
  explicit ReduceLROnPlateau(torch::optim::Optimizer& optimizer,
                             ReduceLROnPlateauOptions options = {});
  std::string name() const override { return "ReduceLROnPlateau"; }
  const ReduceLROnPlateauOptions& options() const { return options_; }
  /// Throws ConfigError: this scheduler needs a metric.
  void step() override;
  void step(double metric) override;
  /// Best metric so far (+inf / -inf before the first step in min / max mode).
  double best() const { return best_; }
  int64_t num_bad_epochs() const { return num_bad_epochs_; }
  int64_t cooldown_counter() const { return cooldown_counter_; }
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 protected:
  /// The lrs only change on a reduction in step(metric); returns `current`.
  std::vector<double> compute_lrs(const std::vector<double>& current) override;

 private:
  bool is_better(double a) const;
  ReduceLROnPlateauOptions options_;
  std::vector<double> min_lrs_;
  double best_;
  int64_t num_bad_epochs_ = 0;
  int64_t cooldown_counter_ = 0;
};

}  // namespace volt
