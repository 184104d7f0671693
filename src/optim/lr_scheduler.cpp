#include "volt/optim/lr_scheduler.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <ostream>
#include <tuple>

#include "core/detail/archive_values.h"
#include "core/detail/print.h"
#include "volt/core/check.h"
#include "volt/core/log.h"
#include "volt/kernels/fused_adamw.h"
#include "volt/kernels/fused_sgd.h"

// Parity notes. PyTorch computes every lr in fp64 Python floats; the expressions below keep
// PyTorch's operation order (and glibc's cos/pow, which CPython also calls), so the sequences in
// tests/optim/data/lr_scheduler_reference.json are reproduced to the last bit or within a few
// ulp. Where PyTorch's step() uses a chainable (recursive) get_lr(), so do we: it differs from
// the closed form by rounding, and by design when something else changes the lr in between.

namespace volt {
namespace {

constexpr double kPi = 3.14159265358979323846;

std::atomic<uint64_t> next_serial{0};

// One value per param group from `values` (one for all or one per group); ConfigError naming
// `what` otherwise.
std::vector<double> per_group(const char* scheduler, const char* what,
                              const std::vector<double>& values, size_t groups) {
  VOLT_CHECK(values.size() == 1 || values.size() == groups, ConfigError, "[", scheduler, "] got ",
             values.size(), " ", what, " values for ", groups,
             " param groups; pass one per group or a single one for all.");
  return values.size() == 1 ? std::vector<double>(groups, values[0]) : values;
}

// restart_at's argument, one lr per scheduled group; ValueError once the schedule stepped.
std::vector<double> checked_initial_lrs(const std::string& name, int64_t last_epoch,
                                        const std::vector<double>& lrs, size_t groups) {
  VOLT_CHECK(last_epoch == 0, ValueError, "[", name, "] restart_at() after ", last_epoch,
             " step(s); a schedule starts again only before its first step.");
  VOLT_CHECK(lrs.size() == 1 || lrs.size() == groups, ConfigError, "[", name, "] restart_at() got ",
             lrs.size(), " lrs for ", groups,
             " scheduled param groups; pass one per group or a single one for all.");
  for (double lr : lrs) {
    VOLT_CHECK(lr > 0 && std::isfinite(lr), ConfigError, "[", name, "] restart_at(): lr=", lr,
               " must be positive and finite.");
  }
  return lrs.size() == 1 ? std::vector<double>(groups, lrs[0]) : lrs;
}

// The parts of SequentialLR and ChainedScheduler, saved as scheduler_<i> beside their count.
void save_parts(torch::serialize::OutputArchive& archive,
                const std::vector<std::shared_ptr<LRScheduler>>& parts) {
  archive.write("count", c10::IValue(static_cast<int64_t>(parts.size())));
  for (size_t i = 0; i < parts.size(); ++i) {
    torch::serialize::OutputArchive one;
    parts[i]->save(one);
    archive.write("scheduler_" + std::to_string(i), one);
  }
}

// CheckpointError unless the archive holds as many parts as `parts`.
void check_part_count(torch::serialize::InputArchive& archive, const std::string& name,
                      const std::vector<std::shared_ptr<LRScheduler>>& parts) {
  c10::IValue count;
  archive.read("count", count);
  VOLT_CHECK(count.toInt() == static_cast<int64_t>(parts.size()), CheckpointError, "[", name,
             "] checkpoint chains ", count.toInt(), " schedulers but this one chains ",
             parts.size(), "; resume with the same schedulers.");
}

void load_part(torch::serialize::InputArchive& archive, size_t i, LRScheduler& part) {
  torch::serialize::InputArchive one;
  archive.read("scheduler_" + std::to_string(i), one);
  part.load(one);
}

}  // namespace

// ------------------------------------------------------------------------------ LRScheduler

LRScheduler::LRScheduler(torch::optim::Optimizer& optimizer)
    : optimizer_(optimizer), serial_(next_serial++) {
  VOLT_CHECK(!optimizer_.param_groups().empty(), ConfigError,
             "[LRScheduler] the optimizer has no param groups; build the scheduler after the "
             "optimizer has its parameters.");
  for (auto& g : optimizer_.param_groups()) base_lrs_.push_back(g.options().get_lr());
  last_lrs_ = base_lrs_;
}

void LRScheduler::step() {
  advance();
}

void LRScheduler::step(double /*metric*/) {
  step();
}

std::vector<double> LRScheduler::closed_form_lrs(const std::vector<double>& current) {
  return compute_lrs(current);
}

void LRScheduler::initial_step() {
  last_epoch_ = 0;
  write_lrs(compute_lrs(current_lrs()));
}

void LRScheduler::advance() {
  ++last_epoch_;
  try {
    std::vector<double> current = current_lrs();
    if (chains_added_groups_) {
      // PyTorch's chainable get_lr() reads every group, those added since too.
      const auto& groups = optimizer_.param_groups();
      for (size_t i = current.size(); i < groups.size(); ++i) {
        current.push_back(groups[i].options().get_lr());
      }
    }
    write_lrs(compute_lrs(current));
  } catch (...) {
    --last_epoch_;
    throw;
  }
}

std::vector<LRScheduler*> LRScheduler::by_age(
    const std::vector<std::shared_ptr<LRScheduler>>& schedulers) {
  std::vector<LRScheduler*> out;
  for (const auto& s : schedulers) out.push_back(s.get());
  std::sort(out.begin(), out.end(),
            [](const LRScheduler* a, const LRScheduler* b) { return a->serial_ < b->serial_; });
  return out;
}

void LRScheduler::share_initial_lrs(const std::vector<LRScheduler*>& by_age,
                                    std::vector<double>& initial) {
  for (auto* s : by_age) {
    if (s->overrides_initial_lr_) {
      initial = s->base_lrs_;
    } else if (!s->keeps_own_base_lrs_) {
      s->base_lrs_ = initial;
    }
  }
}

void LRScheduler::restart() {
  last_epoch_ = 0;
  write_lrs(closed_form_lrs(current_lrs()));
}

void LRScheduler::restart_at(const std::vector<double>& initial_lrs) {
  const std::vector<double> lrs =
      checked_initial_lrs(name(), last_epoch_, initial_lrs, base_lrs_.size());
  auto& param_groups = optimizer_.param_groups();
  for (size_t i = 0; i < lrs.size() && i < param_groups.size(); ++i) {
    param_groups[i].options().set_lr(lrs[i]);
  }
  if (!overrides_initial_lr_ && !keeps_own_base_lrs_) base_lrs_ = lrs;
  initial_step();
}

std::vector<double> LRScheduler::current_lrs() const {
  // Groups added after the scheduler was built (BackboneFinetuning's) are left out: advance()
  // adds them for the schedulers that scale every group (chains_added_groups_); the others keep
  // the rate their adder gives them, as in PyTorch, whose closed-form, lambda and per-group
  // schedulers zip over base_lrs.
  const auto& groups = optimizer_.param_groups();
  VOLT_CHECK(groups.size() >= base_lrs_.size(), ConfigError, "[", name(), "] the optimizer has ",
             groups.size(), " param groups but had ", base_lrs_.size(),
             " when the scheduler was built; do not remove param groups from a scheduled "
             "optimizer.");
  std::vector<double> out;
  out.reserve(base_lrs_.size());
  for (size_t i = 0; i < base_lrs_.size(); ++i) out.push_back(groups[i].options().get_lr());
  return out;
}

void LRScheduler::write_lrs(const std::vector<double>& lrs) {
  auto& groups = optimizer_.param_groups();
  VOLT_ASSERT(lrs.size() >= base_lrs_.size() && lrs.size() <= groups.size(), "scheduler computed ",
              lrs.size(), " lrs for ", base_lrs_.size(), " scheduled of ", groups.size(),
              " param groups");
  for (size_t i = 0; i < lrs.size(); ++i) groups[i].options().set_lr(lrs[i]);
  last_lrs_ = lrs;
}

void LRScheduler::save(torch::serialize::OutputArchive& archive) const {
  archive.write("scheduler", c10::IValue(name()));
  archive.write("last_epoch", c10::IValue(last_epoch_));
  archive.write("base_lrs", detail::double_list(base_lrs_));
  archive.write("last_lrs", detail::double_list(last_lrs_));
}

void LRScheduler::load(torch::serialize::InputArchive& archive) {
  c10::IValue saved_name, le;
  // Checkpoints from before the PyTorch-parity schedulers hold neither the name nor last_lrs.
  if (archive.try_read("scheduler", saved_name)) {
    VOLT_CHECK(saved_name.toStringRef() == name(), CheckpointError, "[", name(),
               "] the checkpoint holds the state of a ", saved_name.toStringRef(),
               "; resume with the same scheduler.");
  }
  archive.read("last_epoch", le);
  auto base = detail::read_double_list(archive, "base_lrs");
  VOLT_CHECK(base.size() == base_lrs_.size(), CheckpointError, "[", name(), "] checkpoint has ",
             base.size(), " param groups but the optimizer has ", base_lrs_.size(),
             "; resume with the same optimizer setup.");
  c10::IValue last;
  const bool has_last = archive.try_read("last_lrs", last);
  VOLT_CHECK(!has_last || last.toDoubleList().size() >= base.size(), CheckpointError, "[", name(),
             "] checkpoint has ", last.toDoubleList().size(), " last lrs for ", base.size(),
             " param groups; the checkpoint is corrupted.");
  last_epoch_ = le.toInt();
  base_lrs_ = std::move(base);
  if (has_last) {
    // More last lrs than base ones: groups added after the scheduler was built, which it
    // scheduled too. They keep the rate the optimizer's state gave them: their adder may have
    // set it after this scheduler's last step (BackboneFinetuning's per-epoch rate), and
    // PyTorch's load_state_dict writes no lr at all.
    auto l = last.toDoubleList();
    std::vector<double> all(l.begin(), l.end());
    write_lrs(std::vector<double>(all.begin(), all.begin() + base_lrs_.size()));
    last_lrs_ = std::move(all);
  } else {
    write_lrs(closed_form_lrs(current_lrs()));
  }
}

// ----------------------------------------------------------------------------------- StepLR

StepLR::StepLR(torch::optim::Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer), step_size_(step_size), gamma_(gamma) {
  VOLT_CHECK(step_size >= 1, ConfigError, "[StepLR] step_size=", step_size,
             " must be >= 1; pass the number of steps between decays.");
  VOLT_CHECK(gamma > 0 && std::isfinite(gamma), ConfigError, "[StepLR] gamma=", gamma,
             " must be > 0 and finite; it multiplies the lr every step_size steps (e.g. 0.1).");
  chains_added_groups_ = true;  // PyTorch scales every group's current lr
  initial_step();
}

std::vector<double> StepLR::compute_lrs(const std::vector<double>& current) {
  if (last_epoch_ == 0 || last_epoch_ % step_size_ != 0) return current;
  std::vector<double> out;
  for (double lr : current) out.push_back(lr * gamma_);
  return out;
}

std::vector<double> StepLR::closed_form_lrs(const std::vector<double>&) {
  std::vector<double> out;
  for (double b : base_lrs_)
    out.push_back(b * std::pow(gamma_, static_cast<double>(last_epoch_ / step_size_)));
  return out;
}

// ------------------------------------------------------------------------------ MultiStepLR

MultiStepLR::MultiStepLR(torch::optim::Optimizer& optimizer, std::vector<int64_t> milestones,
                         double gamma)
    : LRScheduler(optimizer), milestones_(std::move(milestones)), gamma_(gamma) {
  for (int64_t m : milestones_) {
    VOLT_CHECK(m >= 0, ConfigError, "[MultiStepLR] milestone ", m,
               " is negative; milestones are step counts >= 0.");
  }
  VOLT_CHECK(gamma > 0 && std::isfinite(gamma), ConfigError, "[MultiStepLR] gamma=", gamma,
             " must be > 0 and finite; it multiplies the lr at each milestone (e.g. 0.1).");
  // PyTorch keeps a Counter: order does not matter and a repeated milestone applies gamma^k.
  std::sort(milestones_.begin(), milestones_.end());
  chains_added_groups_ = true;  // PyTorch scales every group's current lr
  initial_step();
}

std::vector<double> MultiStepLR::compute_lrs(const std::vector<double>& current) {
  const auto count = std::count(milestones_.begin(), milestones_.end(), last_epoch_);
  if (count == 0) return current;
  std::vector<double> out;
  for (double lr : current) out.push_back(lr * std::pow(gamma_, static_cast<double>(count)));
  return out;
}

std::vector<double> MultiStepLR::closed_form_lrs(const std::vector<double>&) {
  const auto passed =
      std::upper_bound(milestones_.begin(), milestones_.end(), last_epoch_) - milestones_.begin();
  std::vector<double> out;
  for (double b : base_lrs_) out.push_back(b * std::pow(gamma_, static_cast<double>(passed)));
  return out;
}

// ---------------------------------------------------------------------------- ExponentialLR

ExponentialLR::ExponentialLR(torch::optim::Optimizer& optimizer, double gamma)
    : LRScheduler(optimizer), gamma_(gamma) {
  VOLT_CHECK(gamma > 0 && std::isfinite(gamma), ConfigError, "[ExponentialLR] gamma=", gamma,
             " must be > 0 and finite; it multiplies the lr every step (e.g. 0.95).");
  chains_added_groups_ = true;  // PyTorch scales every group's current lr
  initial_step();
}

std::vector<double> ExponentialLR::compute_lrs(const std::vector<double>& current) {
  if (last_epoch_ == 0) return current;
  std::vector<double> out;
  for (double lr : current) out.push_back(lr * gamma_);
  return out;
}

std::vector<double> ExponentialLR::closed_form_lrs(const std::vector<double>&) {
  std::vector<double> out;
  for (double b : base_lrs_) out.push_back(b * std::pow(gamma_, static_cast<double>(last_epoch_)));
  return out;
}

// ------------------------------------------------------------------------ CosineAnnealingLR

CosineAnnealingLR::CosineAnnealingLR(torch::optim::Optimizer& optimizer, int64_t t_max,
                                     double eta_min)
    : LRScheduler(optimizer), t_max_(t_max), eta_min_(eta_min) {
  VOLT_CHECK(t_max >= 1, ConfigError, "[CosineAnnealingLR] t_max=", t_max,
             " must be >= 1; pass the number of steps from base lr to eta_min.");
  VOLT_CHECK(eta_min >= 0 && std::isfinite(eta_min), ConfigError,
             "[CosineAnnealingLR] eta_min=", eta_min, " must be a finite lr >= 0.");
  chains_added_groups_ = true;  // PyTorch scales every group's current lr
  initial_step();
}

std::vector<double> CosineAnnealingLR::compute_lrs(const std::vector<double>& current) {
  if (last_epoch_ == 0) return current;
  const double t = static_cast<double>(t_max_);
  const double e = static_cast<double>(last_epoch_);
  std::vector<double> out;
  // PyTorch's recursive form: lr_t = (1 + cos(pi t/T)) / (1 + cos(pi (t-1)/T)) * (lr_{t-1} -
  // eta_min) + eta_min, except one step past each minimum (t - 1 - T divisible by 2T) where
  // the ratio is 0/0 and it adds the closed-form increment instead. Python's % is a floor mod.
  const int64_t period = 2 * t_max_;
  const int64_t r = ((last_epoch_ - 1 - t_max_) % period + period) % period;
  for (size_t i = 0; i < current.size(); ++i) {
    if (r == 0) {
      // PyTorch zips base_lrs here: a group added since keeps its lr for this step.
      out.push_back(i < base_lrs_.size()
                        ? current[i] + (base_lrs_[i] - eta_min_) * (1 - std::cos(kPi / t)) / 2
                        : current[i]);
    } else {
      out.push_back((1 + std::cos(kPi * e / t)) / (1 + std::cos(kPi * (e - 1) / t)) *
                        (current[i] - eta_min_) +
                    eta_min_);
    }
  }
  return out;
}

std::vector<double> CosineAnnealingLR::closed_form_lrs(const std::vector<double>&) {
  const double t = static_cast<double>(t_max_);
  const double e = static_cast<double>(last_epoch_);
  std::vector<double> out;
  for (double b : base_lrs_)
    out.push_back(eta_min_ + (b - eta_min_) * (1 + std::cos(kPi * e / t)) / 2);
  return out;
}

// -------------------------------------------------------------- CosineAnnealingWarmRestarts

CosineAnnealingWarmRestarts::CosineAnnealingWarmRestarts(torch::optim::Optimizer& optimizer,
                                                         int64_t t_0, int64_t t_mult,
                                                         double eta_min)
    : LRScheduler(optimizer), t_0_(t_0), t_mult_(t_mult), eta_min_(eta_min) {
  VOLT_CHECK(t_0 >= 1, ConfigError, "[CosineAnnealingWarmRestarts] t_0=", t_0,
             " must be >= 1; pass the number of steps until the first restart.");
  VOLT_CHECK(t_mult >= 1, ConfigError, "[CosineAnnealingWarmRestarts] t_mult=", t_mult,
             " must be >= 1; 1 keeps every cycle t_0 steps long, 2 doubles them.");
  VOLT_CHECK(eta_min >= 0 && std::isfinite(eta_min), ConfigError,
             "[CosineAnnealingWarmRestarts] eta_min=", eta_min, " must be a finite lr >= 0.");
  initial_step();
}

std::vector<double> CosineAnnealingWarmRestarts::compute_lrs(const std::vector<double>&) {
  // PyTorch advances T_cur by one per step and, on reaching T_i, subtracts T_i and multiplies
  // T_i by T_mult. On integers that is exactly this closed form, so restarts need no state.
  int64_t t_cur = last_epoch_, t_i = t_0_;
  if (t_mult_ == 1) {
    t_cur = last_epoch_ % t_0_;
  } else {
    while (t_cur >= t_i) {
      t_cur -= t_i;
      t_i *= t_mult_;
    }
  }
  const double c = std::cos(kPi * static_cast<double>(t_cur) / static_cast<double>(t_i));
  std::vector<double> out;
  for (double b : base_lrs_) out.push_back(eta_min_ + (b - eta_min_) * (1 + c) / 2);
  return out;
}

// --------------------------------------------------------------------------------- LinearLR

std::ostream& operator<<(std::ostream& os, const LinearLROptions& o) {
  return os << "LinearLROptions(start_factor=" << o.start_factor()
            << ", end_factor=" << o.end_factor() << ", total_iters=" << o.total_iters() << ")";
}

LinearLR::LinearLR(torch::optim::Optimizer& optimizer, LinearLROptions options)
    : LRScheduler(optimizer), options_(options) {
  // start_factor 0 passes PyTorch 1.13's check but then divides by zero on the first step.
  VOLT_CHECK(options_.start_factor() > 0 && options_.start_factor() <= 1, ConfigError,
             "[LinearLR] start_factor=", options_.start_factor(),
             " must be in (0, 1]; for a warmup from almost 0 use a small value like 1e-3.");
  VOLT_CHECK(options_.end_factor() >= 0 && options_.end_factor() <= 1, ConfigError,
             "[LinearLR] end_factor=", options_.end_factor(), " must be in [0, 1].");
  VOLT_CHECK(options_.total_iters() >= 1, ConfigError,
             "[LinearLR] total_iters=", options_.total_iters(),
             " must be >= 1; pass the length of the ramp in steps.");
  chains_added_groups_ = true;  // PyTorch scales every group's current lr
  initial_step();
}

std::vector<double> LinearLR::compute_lrs(const std::vector<double>& current) {
  const double s = options_.start_factor(), e = options_.end_factor();
  const int64_t total = options_.total_iters();
  std::vector<double> out;
  if (last_epoch_ == 0) {
    for (double lr : current) out.push_back(lr * s);
    return out;
  }
  if (last_epoch_ > total) return current;
  const double ratio = 1. + (e - s) / (static_cast<double>(total) * s +
                                       static_cast<double>(last_epoch_ - 1) * (e - s));
  for (double lr : current) out.push_back(lr * ratio);
  return out;
}

std::vector<double> LinearLR::closed_form_lrs(const std::vector<double>&) {
  const double s = options_.start_factor(), e = options_.end_factor();
  const int64_t total = options_.total_iters();
  const double done = static_cast<double>(std::min(total, last_epoch_));
  std::vector<double> out;
  for (double b : base_lrs_) out.push_back(b * (s + (e - s) * done / static_cast<double>(total)));
  return out;
}

// ------------------------------------------------------------------- WarmupLR, WarmupDecayLR

WarmupLR::WarmupLR(torch::optim::Optimizer& optimizer, WarmupLROptions options)
    : LRScheduler(optimizer),
      options_(options),
      warmup_steps_(std::max<int64_t>(2, options.warmup_num_steps())) {
  VOLT_CHECK(options_.warmup_min_lr() >= 0 && options_.warmup_max_lr() >= 0 &&
                 std::isfinite(options_.warmup_min_lr()) && std::isfinite(options_.warmup_max_lr()),
             ConfigError, "[WarmupLR] warmup_min_lr=", options_.warmup_min_lr(),
             " and warmup_max_lr=", options_.warmup_max_lr(), " must be finite lrs >= 0.");
  VOLT_CHECK(options_.warmup_num_steps() >= 0, ConfigError,
             "[WarmupLR] warmup_num_steps=", options_.warmup_num_steps(), " must be >= 0.");
  // As DeepSpeed's lr_schedules.py ("Initialize lr in optimizer"): construction writes
  // warmup_min_lr, so the first optimizer step is warm-up's too (volt wrote nothing until
  // session 93, as older DeepSpeed releases: the first step ran at the optimizer's own lr).
  initial_step();
}

double WarmupLR::warmup_gamma(int64_t it) const {
  if (options_.warmup_type() == WarmupType::kLinear) {
    return static_cast<double>(it) / static_cast<double>(warmup_steps_);
  }
  return std::log(static_cast<double>(it + 1)) / std::log(static_cast<double>(warmup_steps_));
}

double WarmupLR::gamma(int64_t it) const {
  return it < warmup_steps_ ? warmup_gamma(it) : 1.0;
}

std::vector<double> WarmupLR::compute_lrs(const std::vector<double>& current) {
  // DeepSpeed's last_batch_iteration is one behind PyTorch's last_epoch.
  const int64_t it = last_epoch_ - 1;
  if (it < 0) return std::vector<double>(current.size(), options_.warmup_min_lr());
  const double g = gamma(it);
  const double lr =
      options_.warmup_min_lr() + (options_.warmup_max_lr() - options_.warmup_min_lr()) * g;
  return std::vector<double>(current.size(), lr);
}

WarmupDecayLR::WarmupDecayLR(torch::optim::Optimizer& optimizer, WarmupLROptions options)
    : WarmupLR(optimizer, options) {
  VOLT_CHECK(options_.total_num_steps() > 0, ConfigError,
             "[WarmupDecayLR] total_num_steps=", options_.total_num_steps(),
             " must be > 0: the step at which the lr reaches 0.");
  if (options_.total_num_steps() < warmup_steps_) {
    log_warning("WarmupDecayLR", "total_num_steps " + std::to_string(options_.total_num_steps()) +
                                     " is less than warmup_num_steps " +
                                     std::to_string(warmup_steps_) + ".");
  }
}

double WarmupDecayLR::gamma(int64_t it) const {
  if (it < warmup_steps_) return warmup_gamma(it);
  const double total = static_cast<double>(options_.total_num_steps());
  return std::max(0.0, (total - static_cast<double>(it)) /
                           std::max(1.0, total - static_cast<double>(warmup_steps_)));
}

// --------------------------------------------------------------------------------- LambdaLR

LambdaLR::LambdaLR(torch::optim::Optimizer& optimizer, std::function<double(int64_t)> factor)
    : LRScheduler(optimizer), factors_(base_lrs_.size(), factor) {
  VOLT_CHECK(static_cast<bool>(factor), ConfigError,
             "[LambdaLR] factor function is empty; pass a function of the step count.");
  initial_step();
}

LambdaLR::LambdaLR(torch::optim::Optimizer& optimizer,
                   std::vector<std::function<double(int64_t)>> factors)
    : LRScheduler(optimizer), factors_(std::move(factors)) {
  VOLT_CHECK(factors_.size() == base_lrs_.size(), ConfigError, "[LambdaLR] got ", factors_.size(),
             " factor functions for ", base_lrs_.size(),
             " param groups; pass one per group or a single one for all.");
  for (size_t i = 0; i < factors_.size(); ++i) {
    VOLT_CHECK(static_cast<bool>(factors_[i]), ConfigError, "[LambdaLR] factor function ", i,
               " is empty; pass a function of the step count.");
  }
  initial_step();
}

std::vector<double> LambdaLR::compute_lrs(const std::vector<double>&) {
  std::vector<double> out;
  for (size_t i = 0; i < base_lrs_.size(); ++i)
    out.push_back(base_lrs_[i] * factors_[i](last_epoch_));
  return out;
}

// ------------------------------------------------------------------------- MultiplicativeLR

MultiplicativeLR::MultiplicativeLR(torch::optim::Optimizer& optimizer,
                                   std::function<double(int64_t)> factor)
    : LRScheduler(optimizer), factors_(base_lrs_.size(), factor) {
  VOLT_CHECK(static_cast<bool>(factor), ConfigError,
             "[MultiplicativeLR] factor function is empty; pass a function of the step count.");
  initial_step();
}

MultiplicativeLR::MultiplicativeLR(torch::optim::Optimizer& optimizer,
                                   std::vector<std::function<double(int64_t)>> factors)
    : LRScheduler(optimizer), factors_(std::move(factors)) {
  VOLT_CHECK(factors_.size() == base_lrs_.size(), ConfigError, "[MultiplicativeLR] got ",
             factors_.size(), " factor functions for ", base_lrs_.size(),
             " param groups; pass one per group, or one function (not in a list) for all.");
  for (size_t i = 0; i < factors_.size(); ++i) {
    VOLT_CHECK(static_cast<bool>(factors_[i]), ConfigError, "[MultiplicativeLR] factor function ",
               i, " is empty; pass a function of the step count.");
  }
  initial_step();
}

std::vector<double> MultiplicativeLR::compute_lrs(const std::vector<double>& current) {
  if (last_epoch_ == 0) return current;
  std::vector<double> out;
  for (size_t i = 0; i < current.size(); ++i) out.push_back(current[i] * factors_[i](last_epoch_));
  return out;
}

// ------------------------------------------------------------------------------- ConstantLR

ConstantLR::ConstantLR(torch::optim::Optimizer& optimizer, double factor, int64_t total_iters)
    : LRScheduler(optimizer), factor_(factor), total_iters_(total_iters) {
  // PyTorch 1.13 takes factor 0 and then divides by it at total_iters.
  VOLT_CHECK(factor > 0 && factor <= 1, ConfigError, "[ConstantLR] factor=", factor,
             " must be in (0, 1]; it multiplies the lr until total_iters (e.g. 0.5).");
  VOLT_CHECK(total_iters >= 0, ConfigError, "[ConstantLR] total_iters=", total_iters,
             " must be >= 0; pass the step at which the lr goes back to its base.");
  chains_added_groups_ = true;  // PyTorch scales every group's current lr
  initial_step();
}

std::vector<double> ConstantLR::compute_lrs(const std::vector<double>& current) {
  std::vector<double> out;
  if (last_epoch_ == 0) {
    for (double lr : current) out.push_back(lr * factor_);
    return out;
  }
  if (last_epoch_ != total_iters_) return current;
  for (double lr : current) out.push_back(lr * (1.0 / factor_));
  return out;
}

std::vector<double> ConstantLR::closed_form_lrs(const std::vector<double>&) {
  const double f = factor_ + (last_epoch_ >= total_iters_ ? 1.0 : 0.0) * (1 - factor_);
  std::vector<double> out;
  for (double b : base_lrs_) out.push_back(b * f);
  return out;
}

// ----------------------------------------------------------------------------- PolynomialLR

PolynomialLR::PolynomialLR(torch::optim::Optimizer& optimizer, int64_t total_iters, double power)
    : LRScheduler(optimizer), total_iters_(total_iters), power_(power) {
  VOLT_CHECK(total_iters >= 1, ConfigError, "[PolynomialLR] total_iters=", total_iters,
             " must be >= 1; pass the number of steps until the lr reaches 0.");
  VOLT_CHECK(power > 0 && std::isfinite(power), ConfigError, "[PolynomialLR] power=", power,
             " must be positive and finite (1 decays linearly).");
  chains_added_groups_ = true;  // PyTorch scales every group's current lr
  initial_step();
}

std::vector<double> PolynomialLR::compute_lrs(const std::vector<double>& current) {
  if (last_epoch_ == 0 || last_epoch_ > total_iters_) return current;
  const double t = static_cast<double>(total_iters_);
  const double e = static_cast<double>(last_epoch_);
  const double decay = std::pow((1.0 - e / t) / (1.0 - (e - 1) / t), power_);
  std::vector<double> out;
  for (double lr : current) out.push_back(lr * decay);
  return out;
}

std::vector<double> PolynomialLR::closed_form_lrs(const std::vector<double>&) {
  const double t = static_cast<double>(total_iters_);
  const double done = static_cast<double>(std::min(total_iters_, last_epoch_));
  std::vector<double> out;
  for (double b : base_lrs_) out.push_back(b * std::pow(1.0 - done / t, power_));
  return out;
}

// ------------------------------------------------------------------------------- OneCycleLR

std::ostream& operator<<(std::ostream& os, const OneCycleLROptions& o) {
  return os << "OneCycleLROptions(max_lr={" << detail::number_list(o.max_lr())
            << "}, total_steps=" << o.total_steps() << ", pct_start=" << o.pct_start()
            << ", anneal_strategy="
            << (o.anneal_strategy() == AnnealStrategy::kCos ? "cos" : "linear")
            << ", cycle_momentum=" << o.cycle_momentum() << ", base_momentum=" << o.base_momentum()
            << ", max_momentum=" << o.max_momentum() << ", div_factor=" << o.div_factor()
            << ", final_div_factor=" << o.final_div_factor() << ", three_phase=" << o.three_phase()
            << ")";
}

namespace {

// The optimizers whose momentum OneCycleLR can cycle, as PyTorch finds them through the
// 'momentum' or 'betas' key of the param group.
bool has_momentum(torch::optim::OptimizerOptions& o) {
  return dynamic_cast<torch::optim::SGDOptions*>(&o) ||
         dynamic_cast<torch::optim::RMSpropOptions*>(&o) ||
         dynamic_cast<torch::optim::AdamOptions*>(&o) ||
         dynamic_cast<torch::optim::AdamWOptions*>(&o) || dynamic_cast<FusedSGDOptions*>(&o) ||
         dynamic_cast<FusedAdamWOptions*>(&o);
}

// OneCycleLR's and CyclicLR's momentum cycling: every value in [0, 1) and an optimizer whose
// groups have a momentum or betas (ConfigErrors naming `scheduler`).
void check_cycled_momenta(const char* scheduler, const std::vector<double>& momenta,
                          torch::optim::Optimizer& optimizer) {
  for (double m : momenta) {
    VOLT_CHECK(m >= 0 && m < 1, ConfigError, "[", scheduler, "] momentum ", m,
               " must be in [0, 1); check base_momentum and max_momentum.");
  }
  for (auto& g : optimizer.param_groups()) {
    VOLT_CHECK(has_momentum(g.options()), ConfigError, "[", scheduler,
               "] cycle_momentum=true needs an optimizer with momentum or betas (SGD, RMSprop, "
               "Adam, AdamW); set cycle_momentum(false) for this optimizer.");
  }
}

// Sets a group's momentum (SGD, RMSprop) or beta1 (Adam, AdamW), as has_momentum found it.
void write_momentum(torch::optim::Optimizer& optimizer, size_t group, double momentum) {
  auto& o = optimizer.param_groups()[group].options();
  if (auto* sgd = dynamic_cast<torch::optim::SGDOptions*>(&o)) {
    sgd->momentum(momentum);
  } else if (auto* rms = dynamic_cast<torch::optim::RMSpropOptions*>(&o)) {
    rms->momentum(momentum);
  } else if (auto* adam = dynamic_cast<torch::optim::AdamOptions*>(&o)) {
    adam->betas(std::make_tuple(momentum, std::get<1>(adam->betas())));
  } else if (auto* adamw = dynamic_cast<torch::optim::AdamWOptions*>(&o)) {
    adamw->betas(std::make_tuple(momentum, std::get<1>(adamw->betas())));
  } else if (auto* fsgd = dynamic_cast<FusedSGDOptions*>(&o)) {
    fsgd->momentum(momentum);
  } else if (auto* fadamw = dynamic_cast<FusedAdamWOptions*>(&o)) {
    fadamw->betas(std::make_tuple(momentum, std::get<1>(fadamw->betas())));
  } else {
    VOLT_ASSERT(false, "momentum cycled on an optimizer checked to have none");
  }
}

}  // namespace

OneCycleLR::OneCycleLR(torch::optim::Optimizer& optimizer, OneCycleLROptions options)
    : LRScheduler(optimizer), options_(std::move(options)) {
  const auto& o = options_;
  const size_t groups = base_lrs_.size();
  max_lrs_ = per_group("OneCycleLR", "max_lr", o.max_lr(), groups);
  for (double m : max_lrs_) {
    VOLT_CHECK(m > 0 && std::isfinite(m), ConfigError, "[OneCycleLR] max_lr=", m,
               " must be a positive finite lr.");
  }
  VOLT_CHECK(o.total_steps() >= 1, ConfigError, "[OneCycleLR] total_steps=", o.total_steps(),
             " must be >= 1; pass the number of scheduler steps in the run.");
  VOLT_CHECK(o.pct_start() >= 0 && o.pct_start() <= 1, ConfigError,
             "[OneCycleLR] pct_start=", o.pct_start(),
             " must be in [0, 1]; it is the fraction of the cycle spent raising the lr.");
  VOLT_CHECK(o.div_factor() > 0, ConfigError, "[OneCycleLR] div_factor=", o.div_factor(),
             " must be > 0; initial_lr = max_lr / div_factor.");
  VOLT_CHECK(o.final_div_factor() > 0, ConfigError,
             "[OneCycleLR] final_div_factor=", o.final_div_factor(),
             " must be > 0; min_lr = initial_lr / final_div_factor.");

  const double total = static_cast<double>(o.total_steps());
  if (o.three_phase()) {
    phases_ = {{o.pct_start() * total - 1, Level::kInitial, Level::kMax, true, false},
               {2 * o.pct_start() * total - 2, Level::kMax, Level::kInitial, false, true},
               {total - 1, Level::kInitial, Level::kMin, true, true}};
  } else {
    phases_ = {{o.pct_start() * total - 1, Level::kInitial, Level::kMax, true, false},
               {total - 1, Level::kMax, Level::kMin, false, true}};
  }
  // A phase that starts where it ends is reached (at step 0 or total_steps) and divides by
  // zero, which PyTorch reports as ZeroDivisionError.
  double start = 0;
  for (size_t i = 0; i < phases_.size(); ++i) {
    VOLT_CHECK(phases_[i].end_step != start, ConfigError, "[OneCycleLR] pct_start=", o.pct_start(),
               " with total_steps=", o.total_steps(), " makes phase ", i + 1,
               " zero steps long (it starts and ends at step ", start,
               "); change pct_start or total_steps.");
    start = phases_[i].end_step;
  }

  if (o.cycle_momentum()) {
    check_cycled_momenta("OneCycleLR", {o.base_momentum(), o.max_momentum()}, optimizer_);
  }

  // PyTorch overwrites param_group['initial_lr'] with max_lr / div_factor, so that is base_lrs.
  overrides_initial_lr_ = true;
  for (size_t i = 0; i < groups; ++i) {
    base_lrs_[i] = max_lrs_[i] / o.div_factor();
    min_lrs_.push_back(base_lrs_[i] / o.final_div_factor());
    if (o.cycle_momentum()) set_momentum(i, o.max_momentum());
  }
  initial_step();
}

double OneCycleLR::lr_of(size_t group, Level level) const {
  switch (level) {
    case Level::kInitial: return base_lrs_[group];
    case Level::kMax: return max_lrs_[group];
    case Level::kMin: break;
  }
  return min_lrs_[group];
}

double OneCycleLR::anneal(double start, double end, double pct) const {
  if (options_.anneal_strategy() == AnnealStrategy::kCos) {
    const double cos_out = std::cos(kPi * pct) + 1;
    return end + (start - end) / 2.0 * cos_out;
  }
  return (end - start) * pct + start;
}

void OneCycleLR::set_momentum(size_t group, double momentum) {
  write_momentum(optimizer_, group, momentum);
}

std::vector<double> OneCycleLR::compute_lrs(const std::vector<double>&) {
  return schedule_at(last_epoch_);
}

std::vector<double> OneCycleLR::schedule_at(int64_t step_num) {
  VOLT_CHECK(step_num <= options_.total_steps(), ConfigError, "[OneCycleLR] step() called ",
             step_num, " times but total_steps=", options_.total_steps(),
             "; set total_steps to the number of scheduler steps in the run (with "
             "Interval::kStep: optimizer steps / frequency).");
  const double mom_max = options_.max_momentum(), mom_base = options_.base_momentum();
  std::vector<double> out;
  for (size_t g = 0; g < base_lrs_.size(); ++g) {
    double start_step = 0;
    for (size_t i = 0; i < phases_.size(); ++i) {
      const Phase& p = phases_[i];
      if (static_cast<double>(step_num) <= p.end_step || i + 1 == phases_.size()) {
        const double pct = (static_cast<double>(step_num) - start_step) / (p.end_step - start_step);
        out.push_back(anneal(lr_of(g, p.start_lr), lr_of(g, p.end_lr), pct));
        if (options_.cycle_momentum()) {
          set_momentum(g, anneal(p.start_at_max_momentum ? mom_max : mom_base,
                                 p.end_at_max_momentum ? mom_max : mom_base, pct));
        }
        break;
      }
      start_step = p.end_step;
    }
  }
  return out;
}

void OneCycleLR::load(torch::serialize::InputArchive& archive) {
  LRScheduler::load(archive);
  // The momentum follows the step count; setting it again also restores it when the optimizer
  // state was not loaded. last_epoch is -1 while this scheduler waits for its milestone in a
  // SequentialLR; the momentum is then still the one its construction set (step 0).
  if (options_.cycle_momentum()) schedule_at(std::max<int64_t>(last_epoch_, 0));
}

// --------------------------------------------------------------------------------- CyclicLR

std::ostream& operator<<(std::ostream& os, const CyclicLROptions& o) {
  const char* modes[] = {"triangular", "triangular2", "exp_range"};
  os << "CyclicLROptions(base_lr={" << detail::number_list(o.base_lr()) << "}, max_lr={"
     << detail::number_list(o.max_lr()) << "}, step_size_up=" << o.step_size_up()
     << ", step_size_down=";
  if (o.step_size_down()) {
    os << *o.step_size_down();
  } else {
    os << "None";
  }
  return os << ", mode=" << modes[static_cast<int>(o.mode())] << ", gamma=" << o.gamma()
            << ", scale_fn=" << (o.scale_fn() ? "custom" : "None") << ", scale_mode="
            << (o.scale_mode() == CyclicScaleMode::kCycle ? "cycle" : "iterations")
            << ", cycle_momentum=" << o.cycle_momentum() << ", base_momentum={"
            << detail::number_list(o.base_momentum()) << "}, max_momentum={"
            << detail::number_list(o.max_momentum()) << "})";
}

CyclicLR::CyclicLR(torch::optim::Optimizer& optimizer, CyclicLROptions options)
    : LRScheduler(optimizer), options_(std::move(options)) {
  const auto& o = options_;
  const size_t groups = base_lrs_.size();
  const auto base = per_group("CyclicLR", "base_lr", o.base_lr(), groups);
  max_lrs_ = per_group("CyclicLR", "max_lr", o.max_lr(), groups);
  for (double lr : base) {
    VOLT_CHECK(lr >= 0 && std::isfinite(lr), ConfigError, "[CyclicLR] base_lr=", lr,
               " must be >= 0 and finite: the lr the cycle starts from (e.g. 0.001).");
  }
  for (double lr : max_lrs_) {
    VOLT_CHECK(lr >= 0 && std::isfinite(lr), ConfigError, "[CyclicLR] max_lr=", lr,
               " must be >= 0 and finite: the lr the cycle rises to (e.g. 0.1).");
  }
  const double up = o.step_size_up();
  const double down = o.step_size_down().value_or(up);
  VOLT_CHECK(up > 0 && std::isfinite(up), ConfigError, "[CyclicLR] step_size_up=", up,
             " must be > 0: the steps from base_lr up to max_lr.");
  VOLT_CHECK(down >= 0 && std::isfinite(down), ConfigError, "[CyclicLR] step_size_down=", down,
             " must be >= 0: the steps back down (unset: step_size_up).");
  VOLT_CHECK(o.mode() != CyclicMode::kExpRange || o.scale_fn() ||
                 (o.gamma() > 0 && std::isfinite(o.gamma())),
             ConfigError, "[CyclicLR] gamma=", o.gamma(),
             " must be positive and finite for mode exp_range (e.g. 0.99994).");
  total_size_ = up + down;
  step_ratio_ = up / total_size_;

  if (o.cycle_momentum()) {
    base_momenta_ = per_group("CyclicLR", "base_momentum", o.base_momentum(), groups);
    max_momenta_ = per_group("CyclicLR", "max_momentum", o.max_momentum(), groups);
    std::vector<double> all = base_momenta_;
    all.insert(all.end(), max_momenta_.begin(), max_momenta_.end());
    check_cycled_momenta("CyclicLR", all, optimizer_);
  }
  // PyTorch sets each group's lr to base_lr and keeps base_lr as base_lrs, whatever
  // param_group['initial_lr'] another scheduler left.
  keeps_own_base_lrs_ = true;
  base_lrs_ = base;
  initial_step();
}

std::vector<double> CyclicLR::schedule_at(int64_t step) {
  const double e = static_cast<double>(step);
  const double cycle = std::floor(1 + e / total_size_);
  const double x = 1. + e / total_size_ - cycle;
  const double scale_factor = x <= step_ratio_ ? x / step_ratio_ : (x - 1) / (step_ratio_ - 1);
  double amplitude = 1.0;
  if (options_.scale_fn()) {
    amplitude = options_.scale_fn()(options_.scale_mode() == CyclicScaleMode::kCycle ? cycle : e);
  } else if (options_.mode() == CyclicMode::kTriangular2) {
    amplitude = 1 / std::pow(2., cycle - 1);
  } else if (options_.mode() == CyclicMode::kExpRange) {
    amplitude = std::pow(options_.gamma(), e);
  }
  std::vector<double> out;
  for (size_t g = 0; g < base_lrs_.size(); ++g) {
    const double base_height = (max_lrs_[g] - base_lrs_[g]) * scale_factor;
    out.push_back(base_lrs_[g] + base_height * amplitude);
  }
  if (options_.cycle_momentum()) {
    for (size_t g = 0; g < base_lrs_.size(); ++g) {
      const double base_height = (max_momenta_[g] - base_momenta_[g]) * scale_factor;
      write_momentum(optimizer_, g, max_momenta_[g] - base_height * amplitude);
    }
  }
  return out;
}

std::vector<double> CyclicLR::compute_lrs(const std::vector<double>&) {
  return schedule_at(last_epoch_);
}

void CyclicLR::load(torch::serialize::InputArchive& archive) {
  LRScheduler::load(archive);
  // As OneCycleLR's: the momentum follows the step count (-1 while waiting in a SequentialLR).
  if (options_.cycle_momentum()) schedule_at(std::max<int64_t>(last_epoch_, 0));
}

// ----------------------------------------------------------------------------- SequentialLR

// PyTorch 1.13's SequentialLR, reproduced as observed:
// - Every scheduler's constructor already stepped once. SequentialLR resets each group's lr to
//   param_group['initial_lr'], moves every scheduler's last_epoch back by one and redoes only
//   the first scheduler's initial step.
// - param_group['initial_lr'] is shared by all schedulers of an optimizer: the first one built
//   sets it to the lr it finds and later ones read it as their base_lrs, except OneCycleLR,
//   which overwrites it with max_lr / div_factor. libtorch's param groups have no such slot,
//   so each volt scheduler keeps its own base_lrs_; here we replay the construction order to
//   give every scheduler the base_lrs PyTorch would have given it.

// ------------------------------------------------------------------------------------ SWALR

namespace {

// torch.optim.swa_utils.SWALR's anneal functions.
double swa_anneal(AnnealStrategy strategy, double t) {
  return strategy == AnnealStrategy::kCos ? (1 - std::cos(kPi * t)) / 2 : t;
}

double clamp01(double t) {
  return std::max(0.0, std::min(1.0, t));
}

}  // namespace

SWALR::SWALR(torch::optim::Optimizer& optimizer, std::vector<double> swa_lrs, int64_t anneal_epochs,
             AnnealStrategy anneal_strategy)
    : LRScheduler(optimizer),
      swa_lrs_(per_group("SWALR", "swa_lr", swa_lrs, base_lrs_.size())),
      anneal_epochs_(anneal_epochs),
      anneal_strategy_(anneal_strategy) {
  for (double lr : swa_lrs_) {
    VOLT_CHECK(std::isfinite(lr) && lr > 0, ConfigError, "[SWALR] swa_lr=", lr,
               " must be a positive finite number, e.g. 0.05.");
  }
  VOLT_CHECK(anneal_epochs_ >= 0, ConfigError, "[SWALR] anneal_epochs=", anneal_epochs_,
             " must be >= 0 (0 switches to swa_lr at once).");
  initial_step();
}

SWALR::SWALR(torch::optim::Optimizer& optimizer, double swa_lr, int64_t anneal_epochs,
             AnnealStrategy anneal_strategy)
    : SWALR(optimizer, std::vector<double>{swa_lr}, anneal_epochs, anneal_strategy) {}

double SWALR::lr_at(double lr0, double swa_lr, int64_t step, int64_t anneal_epochs,
                    AnnealStrategy anneal_strategy) {
  if (anneal_epochs == 0) step = std::max<int64_t>(1, step);
  const double alpha = swa_anneal(
      anneal_strategy, clamp01(static_cast<double>(step) /
                               static_cast<double>(std::max<int64_t>(1, anneal_epochs))));
  return swa_lr * alpha + lr0 * (1 - alpha);
}

std::vector<double> SWALR::compute_lrs(const std::vector<double>& current) {
  // PyTorch's get_lr(): step = _step_count - 1, which is last_epoch for a scheduler built with
  // last_epoch -1; the lr before annealing is recovered from the current one.
  const int64_t steps = last_epoch_ + step_offset_;
  const int64_t step = anneal_epochs_ == 0 ? std::max<int64_t>(1, steps) : steps;
  const double span = static_cast<double>(std::max<int64_t>(1, anneal_epochs_));
  const double prev_alpha =
      swa_anneal(anneal_strategy_, clamp01(static_cast<double>(step - 1) / span));
  const double alpha = swa_anneal(anneal_strategy_, clamp01(static_cast<double>(step) / span));
  std::vector<double> out;
  for (size_t g = 0; g < current.size(); ++g) {
    const double swa = swa_lrs_[g];
    const double prev = prev_alpha == 1 ? swa : (current[g] - prev_alpha * swa) / (1 - prev_alpha);
    out.push_back(swa * alpha + prev * (1 - alpha));
  }
  return out;
}

std::vector<double> SWALR::closed_form_lrs(const std::vector<double>& current) {
  step_offset_ = 1;
  return compute_lrs(current);
}

void SWALR::save(torch::serialize::OutputArchive& archive) const {
  LRScheduler::save(archive);
  archive.write("step_offset", c10::IValue(step_offset_));
}

void SWALR::load(torch::serialize::InputArchive& archive) {
  LRScheduler::load(archive);
  c10::IValue offset;  // absent in checkpoints before session 81: 0
  step_offset_ = archive.try_read("step_offset", offset) ? offset.toInt() : 0;
}

// - At milestone m the next scheduler is stepped with step(0) (epoch argument), which sets its
//   last_epoch to 0 and uses its closed form where PyTorch has one (StepLR, MultiStepLR,
//   ExponentialLR, CosineAnnealingLR, LinearLR), so it starts from its base_lrs, not from the
//   lr the previous scheduler left; and it counts its steps from that milestone.
SequentialLR::SequentialLR(torch::optim::Optimizer& optimizer,
                           std::vector<std::shared_ptr<LRScheduler>> schedulers,
                           std::vector<int64_t> milestones)
    : LRScheduler(optimizer),
      schedulers_(std::move(schedulers)),
      milestones_(std::move(milestones)) {
  VOLT_CHECK(!schedulers_.empty(), ConfigError,
             "[SequentialLR] no schedulers given; pass at least one.");
  for (size_t i = 0; i < schedulers_.size(); ++i) {
    auto& s = schedulers_[i];
    VOLT_CHECK(s != nullptr, ConfigError, "[SequentialLR] scheduler ", i, " is null.");
    VOLT_CHECK(&s->optimizer_ == &optimizer_, ConfigError, "[SequentialLR] scheduler ", i, " (",
               s->name(),
               ") drives a different optimizer; build all schedulers on the "
               "optimizer passed to SequentialLR.");
    VOLT_CHECK(!dynamic_cast<ReduceLROnPlateau*>(s.get()) &&
                   !dynamic_cast<SequentialLR*>(s.get()) &&
                   !dynamic_cast<ChainedScheduler*>(s.get()),
               ConfigError, "[SequentialLR] scheduler ", i, " is a ", s->name(),
               ", which cannot be chained; use step-driven schedulers only.");
    for (size_t j = 0; j < i; ++j) {
      VOLT_CHECK(schedulers_[j] != s, ConfigError, "[SequentialLR] schedulers ", j, " and ", i,
                 " are the same object; build one scheduler per stage.");
    }
  }
  VOLT_CHECK(milestones_.size() + 1 == schedulers_.size(), ConfigError, "[SequentialLR] got ",
             schedulers_.size(), " schedulers and ", milestones_.size(),
             " milestones; pass one milestone fewer than schedulers.");
  for (size_t i = 0; i < milestones_.size(); ++i) {
    const bool ok = milestones_[i] >= 1 && (i == 0 || milestones_[i] > milestones_[i - 1]);
    VOLT_CHECK(ok, ConfigError, "[SequentialLR] milestone ", i, " is ", milestones_[i],
               "; milestones must be strictly increasing and >= 1, the steps at which each next "
               "scheduler takes over.");
  }

  start(by_age(schedulers_).front()->base_lrs_);
}

void SequentialLR::start(std::vector<double> initial) {
  const std::vector<LRScheduler*> by_age = LRScheduler::by_age(schedulers_);
  share_initial_lrs(by_age, initial);
  base_lrs_ = initial;
  write_lrs(initial);
  // Each chained scheduler took its step 0 when it was built; the first one takes it again.
  for (auto& s : schedulers_) s->last_epoch_ = -1;
  schedulers_.front()->advance();
  last_epoch_ = 0;
  last_lrs_ = schedulers_.front()->last_lrs_;
}

void SequentialLR::restart_at(const std::vector<double>& initial_lrs) {
  start(checked_initial_lrs(name(), last_epoch_, initial_lrs, base_lrs_.size()));
}

void SequentialLR::step() {
  ++last_epoch_;
  const size_t idx = static_cast<size_t>(
      std::upper_bound(milestones_.begin(), milestones_.end(), last_epoch_) - milestones_.begin());
  LRScheduler& s = *schedulers_[idx];
  try {
    if (idx > 0 && milestones_[idx - 1] == last_epoch_) {
      s.restart();
    } else {
      s.step();
    }
  } catch (...) {
    --last_epoch_;
    throw;
  }
  last_lrs_ = s.last_lrs_;
}

std::vector<double> SequentialLR::compute_lrs(const std::vector<double>& current) {
  return current;
}

void SequentialLR::save(torch::serialize::OutputArchive& archive) const {
  LRScheduler::save(archive);
  save_parts(archive, schedulers_);
}

void SequentialLR::load(torch::serialize::InputArchive& archive) {
  check_part_count(archive, name(), schedulers_);
  // The scheduler active at the saved step loads after the others: a OneCycleLR sets the
  // momentum as it loads, and one still waiting for its milestone would set its step-0 momentum
  // over the active one's.
  c10::IValue saved_epoch;
  archive.read("last_epoch", saved_epoch);
  const size_t active = static_cast<size_t>(
      std::upper_bound(milestones_.begin(), milestones_.end(), saved_epoch.toInt()) -
      milestones_.begin());
  for (size_t i = 0; i < schedulers_.size(); ++i) {
    if (i != active) load_part(archive, i, *schedulers_[i]);
  }
  load_part(archive, active, *schedulers_[active]);
  // Last, so the optimizer ends up with the lrs of the active scheduler.
  LRScheduler::load(archive);
}

// ------------------------------------------------------------------------- ChainedScheduler

namespace {

torch::optim::Optimizer& chained_optimizer(
    const std::vector<std::shared_ptr<LRScheduler>>& schedulers) {
  VOLT_CHECK(!schedulers.empty(), ConfigError,
             "[ChainedScheduler] no schedulers given; pass at least one.");
  VOLT_CHECK(schedulers[0] != nullptr, ConfigError,
             "[ChainedScheduler] scheduler 0 is null; pass schedulers built on the optimizer.");
  return schedulers[0]->optimizer();
}

}  // namespace

// PyTorch's ChainedScheduler only steps its schedulers; what it inherits is how they were
// built: each took its initial step as it was constructed, with base lrs from the
// param_group['initial_lr'] they share. volt's schedulers take the lr they find, so the chain
// replays those initial steps with PyTorch's base lrs (as SequentialLR does).
ChainedScheduler::ChainedScheduler(std::vector<std::shared_ptr<LRScheduler>> schedulers)
    : LRScheduler(chained_optimizer(schedulers)), schedulers_(std::move(schedulers)) {
  for (size_t i = 0; i < schedulers_.size(); ++i) {
    auto& s = schedulers_[i];
    VOLT_CHECK(s != nullptr, ConfigError, "[ChainedScheduler] scheduler ", i,
               " is null; pass schedulers built on the optimizer.");
    VOLT_CHECK(&s->optimizer_ == &optimizer_, ConfigError, "[ChainedScheduler] scheduler ", i, " (",
               s->name(),
               ") drives a different optimizer than scheduler 0; build all schedulers on one "
               "optimizer.");
    VOLT_CHECK(!dynamic_cast<ReduceLROnPlateau*>(s.get()) &&
                   !dynamic_cast<SequentialLR*>(s.get()) &&
                   !dynamic_cast<ChainedScheduler*>(s.get()),
               ConfigError, "[ChainedScheduler] scheduler ", i, " is a ", s->name(),
               ", which cannot be chained; chain step-driven schedulers (put a sequence's "
               "parts in the chain).");
    VOLT_CHECK(s->last_epoch_ == 0, ConfigError, "[ChainedScheduler] scheduler ", i, " (",
               s->name(), ") has already stepped ", s->last_epoch_,
               " time(s); chain schedulers before their first step.");
    for (size_t j = 0; j < i; ++j) {
      VOLT_CHECK(schedulers_[j] != s, ConfigError, "[ChainedScheduler] schedulers ", j, " and ", i,
                 " are the same object; it would step twice per step.");
    }
  }
  start(by_age(schedulers_).front()->base_lrs_);
}

void ChainedScheduler::start(std::vector<double> initial) {
  const std::vector<LRScheduler*> schedulers = by_age(schedulers_);
  write_lrs(initial);
  // PyTorch's param_group['initial_lr'], set by the first scheduler built: the lr it found (or
  // its own base_lr for a CyclicLR, which writes that into the groups first), replaced by a
  // OneCycleLR's max_lr / div_factor. A CyclicLR built later takes its initial step from it
  // (its own base_lr becomes base_lrs only after), and the others take it as their base_lrs.
  std::vector<double> shared = std::move(initial);
  for (size_t k = 0; k < schedulers.size(); ++k) {
    LRScheduler* s = schedulers[k];
    if (s->overrides_initial_lr_) {
      shared = s->base_lrs_;
      s->initial_step();
    } else if (s->keeps_own_base_lrs_) {
      if (k == 0) shared = s->base_lrs_;
      const std::vector<double> own = s->base_lrs_;
      s->base_lrs_ = shared;
      s->initial_step();
      s->base_lrs_ = own;
    } else {
      s->base_lrs_ = shared;
      s->initial_step();
    }
  }
  base_lrs_ = schedulers.front()->base_lrs_;
  last_epoch_ = 0;
  last_lrs_ = current_lrs();
}

void ChainedScheduler::restart_at(const std::vector<double>& initial_lrs) {
  start(checked_initial_lrs(name(), last_epoch_, initial_lrs, base_lrs_.size()));
}

void ChainedScheduler::step() {
  for (auto& s : schedulers_) s->step();
  ++last_epoch_;
  last_lrs_ = current_lrs();
}

std::vector<double> ChainedScheduler::compute_lrs(const std::vector<double>& current) {
  return current;
}

void ChainedScheduler::save(torch::serialize::OutputArchive& archive) const {
  LRScheduler::save(archive);
  save_parts(archive, schedulers_);
}

void ChainedScheduler::load(torch::serialize::InputArchive& archive) {
  check_part_count(archive, name(), schedulers_);
  for (size_t i = 0; i < schedulers_.size(); ++i) load_part(archive, i, *schedulers_[i]);
  // Last, so the optimizer ends up with the lrs the whole chain wrote.
  LRScheduler::load(archive);
}

// ------------------------------------------------------------------------ ReduceLROnPlateau

std::ostream& operator<<(std::ostream& os, const ReduceLROnPlateauOptions& o) {
  return os << "ReduceLROnPlateauOptions(mode=" << (o.mode() == PlateauMode::kMin ? "min" : "max")
            << ", factor=" << o.factor() << ", patience=" << o.patience()
            << ", threshold=" << o.threshold()
            << ", threshold_mode=" << (o.threshold_mode() == ThresholdMode::kRel ? "rel" : "abs")
            << ", cooldown=" << o.cooldown() << ", min_lr={" << detail::number_list(o.min_lr())
            << "}, eps=" << o.eps() << ")";
}

ReduceLROnPlateau::ReduceLROnPlateau(torch::optim::Optimizer& optimizer,
                                     ReduceLROnPlateauOptions options)
    : LRScheduler(optimizer), options_(std::move(options)) {
  const auto& o = options_;
  VOLT_CHECK(o.factor() >= 0 && o.factor() < 1, ConfigError,
             "[ReduceLROnPlateau] factor=", o.factor(),
             " must be in [0, 1); new_lr = lr * factor (e.g. 0.1).");
  VOLT_CHECK(o.patience() >= 0, ConfigError, "[ReduceLROnPlateau] patience=", o.patience(),
             " must be >= 0.");
  VOLT_CHECK(o.threshold() >= 0, ConfigError, "[ReduceLROnPlateau] threshold=", o.threshold(),
             " must be >= 0.");
  VOLT_CHECK(o.cooldown() >= 0, ConfigError, "[ReduceLROnPlateau] cooldown=", o.cooldown(),
             " must be >= 0.");
  VOLT_CHECK(o.eps() >= 0, ConfigError, "[ReduceLROnPlateau] eps=", o.eps(), " must be >= 0.");
  const size_t groups = base_lrs_.size();
  min_lrs_ = per_group("ReduceLROnPlateau", "min_lr", o.min_lr(), groups);
  for (double m : min_lrs_) {
    VOLT_CHECK(m >= 0, ConfigError, "[ReduceLROnPlateau] min_lr=", m, " must be >= 0.");
  }
  best_ = o.mode() == PlateauMode::kMin ? std::numeric_limits<double>::infinity()
                                        : -std::numeric_limits<double>::infinity();
}

void ReduceLROnPlateau::step() {
  VOLT_CHECK(false, ConfigError,
             "[ReduceLROnPlateau] step() needs the watched metric; set OptimizerConfig::monitor "
             "to a logged metric (e.g. .monitor(\"val_loss\")) or call step(metric).");
}

bool ReduceLROnPlateau::is_better(double a) const {
  const double t = options_.threshold();
  if (options_.mode() == PlateauMode::kMin) {
    return options_.threshold_mode() == ThresholdMode::kRel ? a < best_ * (1. - t) : a < best_ - t;
  }
  return options_.threshold_mode() == ThresholdMode::kRel ? a > best_ * (t + 1.) : a > best_ + t;
}

void ReduceLROnPlateau::step(double metric) {
  std::vector<double> lrs = current_lrs();
  ++last_epoch_;
  if (is_better(metric)) {
    best_ = metric;
    num_bad_epochs_ = 0;
  } else {
    ++num_bad_epochs_;
  }
  if (cooldown_counter_ > 0) {
    --cooldown_counter_;
    num_bad_epochs_ = 0;  // bad steps during cooldown do not count
  }
  if (num_bad_epochs_ > options_.patience()) {
    for (size_t i = 0; i < lrs.size(); ++i) {
      const double reduced = std::max(lrs[i] * options_.factor(), min_lrs_[i]);
      if (lrs[i] - reduced > options_.eps()) lrs[i] = reduced;
    }
    cooldown_counter_ = options_.cooldown();
    num_bad_epochs_ = 0;
  }
  write_lrs(lrs);
}

std::vector<double> ReduceLROnPlateau::compute_lrs(const std::vector<double>& current) {
  return current;
}

void ReduceLROnPlateau::save(torch::serialize::OutputArchive& archive) const {
  LRScheduler::save(archive);
  archive.write("best", c10::IValue(best_));
  archive.write("num_bad_epochs", c10::IValue(num_bad_epochs_));
  archive.write("cooldown_counter", c10::IValue(cooldown_counter_));
}

void ReduceLROnPlateau::load(torch::serialize::InputArchive& archive) {
  LRScheduler::load(archive);
  c10::IValue best, bad, cooldown;
  archive.read("best", best);
  archive.read("num_bad_epochs", bad);
  archive.read("cooldown_counter", cooldown);
  best_ = best.toDouble();
  num_bad_epochs_ = bad.toInt();
  cooldown_counter_ = cooldown.toInt();
}

std::ostream& operator<<(std::ostream& os, const WarmupLROptions& o) {
  return os << "WarmupLROptions(warmup_min_lr=" << o.warmup_min_lr()
            << ", warmup_max_lr=" << o.warmup_max_lr()
            << ", warmup_num_steps=" << o.warmup_num_steps()
            << ", warmup_type=" << (o.warmup_type() == WarmupType::kLog ? "log" : "linear")
            << ", total_num_steps=" << o.total_num_steps() << ")";
}

}  // namespace volt
