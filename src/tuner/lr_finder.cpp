// lr_find: a short fit under a callback that sets the learning rate before each optimizer step
// and records the smoothed loss after it (Lightning's _LRCallback and _ExponentialLR/_LinearLR).
#include "volt/tuner/lr_finder.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/detail/numbers.h"
#include "data/detail/module_data.h"
#include "trainer/detail/tuner_trial.h"
#include "tuner/detail/trial.h"
#include "volt/callbacks/callback.h"
#include "volt/core/check.h"
#include "volt/core/log.h"
#include "volt/core/module.h"
#include "volt/core/optimizer_config.h"
#include "volt/core/run_context.h"
#include "volt/strategies/strategy.h"
#include "volt/trainer/trainer.h"

namespace volt {
namespace {

constexpr const char* kTag = "[lr_find]";

// The rate of optimizer step k (0-based) of n, as Lightning's schedulers: the first step runs at
// min_lr, step k >= 1 at the point (k + 1) / n of the way, so the last one runs at max_lr.
double scheduled_lr(const LrFinderOptions& o, int64_t k) {
  if (k == 0) return o.min_lr();
  const double r = static_cast<double>(k + 1) / static_cast<double>(o.num_training());
  if (o.mode() == LrFinderMode::kLinear) return o.min_lr() + r * (o.max_lr() - o.min_lr());
  return o.min_lr() * std::pow(o.max_lr() / o.min_lr(), r);
}

class LrFinderCallback : public Callback {
 public:
  explicit LrFinderCallback(LrFinderOptions o) : o_(std::move(o)) {}
  std::string state_key() const override { return "LrFinder"; }

  void on_train_start(RunContext& run, Module& module) override {
    // Automatic optimization has exactly one optimizer (the Module checks it).
    VOLT_CHECK(module.automatic_optimization(), ConfigError, kTag,
               " the module uses manual optimization; the range test sets the rate of the steps "
               "the Trainer takes. Run it on a module with automatic optimization.");
    // The test sets the rate itself: the module's scheduler would fight it.
    run.optimizer_configs().front().scheduler(nullptr);
  }

  void on_train_batch_start(RunContext& run, Module&, const Batch&, int64_t) override {
    // A stop requested over several processes lands a few batches later: those batches stay at
    // the last rate (max_lr) and record nothing.
    const int64_t k =
        std::min<int64_t>(static_cast<int64_t>(result.lrs.size()), o_.num_training() - 1);
    const double lr = scheduled_lr(o_, k);
    for (auto& g : run.optimizer_configs().front().optimizer()->param_groups()) {
      g.options().set_lr(lr);
    }
    if (run.state().accumulated == 0) {  // the first micro-batch of a step
      loss_sum_ = 0;
      micro_batches_ = 0;
    }
  }

  void on_before_backward(RunContext&, Module&, const at::Tensor& loss) override {
    loss_sum_ += loss.detach().item<double>();
    ++micro_batches_;
  }

  void on_train_batch_end(RunContext& run, Module&, const Batch&, int64_t) override {
    // A point per optimizer step the Trainer took or the loss scaler skipped (an inf loss, which
    // a range test reaches on purpose: Lightning counts that step and records the loss). A
    // skipped step does not advance global_step, so the test counts its points itself; it
    // waited for global_step before and, under loss scaling, never ended.
    if (micro_batches_ == 0 || run.state().accumulated != 0) return;  // mid-window or no loss
    if (static_cast<int64_t>(result.lrs.size()) >= o_.num_training()) return;  // stop under way
    const int64_t steps = static_cast<int64_t>(result.lrs.size()) + 1;
    result.lrs.push_back(
        run.optimizer_configs().front().optimizer()->param_groups()[0].options().get_lr());
    // The loss of the step (mean of its micro-batches), smoothed and bias-corrected as Lightning
    // (its step count runs one ahead: the correction uses global_step + 1). Over several
    // processes (DDP) it is the mean of the ranks' losses, the loss of the global batch, so
    // every rank records the same values (Lightning records rank 0's own loss and broadcasts
    // its result).
    double loss = loss_sum_ / static_cast<double>(micro_batches_);
    if (run.world_size() > 1) {
      const at::Tensor all = run.all_gather(torch::tensor({loss}, torch::kDouble), false);
      loss = all.sum().item<double>() / static_cast<double>(run.world_size());
    }
    avg_loss_ = kBeta * avg_loss_ + (1 - kBeta) * loss;
    const double smoothed = avg_loss_ / (1 - std::pow(kBeta, static_cast<double>(steps + 1)));
    if (o_.early_stop_threshold() && steps > 1 && smoothed > *o_.early_stop_threshold() * best_) {
      run.request_stop();
      stopped_early = true;
    }
    if (smoothed < best_ || steps == 1) best_ = smoothed;
    result.losses.push_back(smoothed);
    micro_batches_ = 0;
    if (steps >= o_.num_training()) run.request_stop();  // max_steps, when steps were skipped
  }

  LrFinderResult result;
  bool stopped_early = false;

 private:
  static constexpr double kBeta = 0.98;
  LrFinderOptions o_;
  double loss_sum_ = 0;
  int64_t micro_batches_ = 0;
  double avg_loss_ = 0;
  double best_ = 0;
};

std::string format_lr(double lr) {
  auto s = detail::c_stream<std::ostringstream>();
  s << lr;
  return s.str();
}

}  // namespace

void LrFinderOptions::validate() const {
  VOLT_CHECK(std::isfinite(min_lr_) && min_lr_ > 0, ConfigError, kTag, " min_lr=", min_lr_,
             " must be a positive number.");
  VOLT_CHECK(std::isfinite(max_lr_) && max_lr_ > min_lr_, ConfigError, kTag, " max_lr=", max_lr_,
             " must be above min_lr=", min_lr_, ".");
  VOLT_CHECK(num_training_ >= 2, ConfigError, kTag, " num_training=", num_training_,
             " must be at least 2 (steps between min_lr and max_lr; Lightning's default is "
             "100).");
  VOLT_CHECK(!early_stop_threshold_ ||
                 (std::isfinite(*early_stop_threshold_) && *early_stop_threshold_ > 0),
             ConfigError, kTag, " early_stop_threshold=", *early_stop_threshold_,
             " must be a positive factor (4 stops once the loss is 4x the best), or unset.");
}

namespace {

constexpr const char* kNoSuggestion =
    "no suggestion: fewer than two loss points after the skipped ones; raise num_training or "
    "give the loader more batches";

// suggestion_index without its warning (lr_find's own summary line says it instead, so a
// caller who asks again is warned once).
c10::optional<int64_t> steepest_descent(const LrFinderResult& r, int64_t skip_begin,
                                        int64_t skip_end) {
  VOLT_CHECK(skip_begin >= 0 && skip_end >= 0, ConfigError, kTag, " skip_begin=", skip_begin,
             " and skip_end=", skip_end, " must be >= 0.");
  const auto& lrs = r.lrs;
  const auto& losses = r.losses;
  // The points kept: inside the skips, with a finite loss.
  std::vector<int64_t> idx;
  const int64_t n = static_cast<int64_t>(std::min(lrs.size(), losses.size()));
  for (int64_t i = skip_begin; i < n - skip_end; ++i) {
    if (std::isfinite(losses[i])) idx.push_back(i);
  }
  const size_t m = idx.size();
  if (m < 2) return c10::nullopt;
  const bool log_axis = r.mode == LrFinderMode::kExponential;
  const auto x = [&](size_t j) { return log_axis ? std::log10(lrs[idx[j]]) : lrs[idx[j]]; };
  const auto f = [&](size_t j) { return losses[idx[j]]; };
  // torch.gradient(f, spacing=[x]): one-sided first differences at the ends, the second-order
  // formula for uneven spacing inside.
  double best = std::numeric_limits<double>::infinity();
  size_t arg = 0;
  for (size_t j = 0; j < m; ++j) {
    double g;
    if (j == 0) {
      g = (f(1) - f(0)) / (x(1) - x(0));
    } else if (j == m - 1) {
      g = (f(m - 1) - f(m - 2)) / (x(m - 1) - x(m - 2));
    } else {
      const double h0 = x(j) - x(j - 1), h1 = x(j + 1) - x(j);
      g = (h0 * h0 * f(j + 1) - h1 * h1 * f(j - 1) + (h1 * h1 - h0 * h0) * f(j)) /
          (h0 * h1 * (h0 + h1));
    }
    if (g < best) {  // the first minimum, as argmin
      best = g;
      arg = j;
    }
  }
  return idx[arg];
}

}  // namespace

c10::optional<int64_t> LrFinderResult::suggestion_index(int64_t skip_begin,
                                                        int64_t skip_end) const {
  const auto i = steepest_descent(*this, skip_begin, skip_end);
  if (!i) log_warning("lr_find", std::string(kNoSuggestion) + ".");
  return i;
}

c10::optional<double> LrFinderResult::suggestion(int64_t skip_begin, int64_t skip_end) const {
  const auto i = suggestion_index(skip_begin, skip_end);
  if (!i) return c10::nullopt;
  return lrs[*i];
}

namespace {

// `in_run`: the trial of a LearningRateFinder, whose options may hold a strategy over the run's
// processes (run_trial_options); lr_find itself runs one process on one device.
template <typename Fit>
LrFinderResult run_range_test(Module& module, TrainerOptions options, LrFinderOptions finder,
                              bool in_run, Fit&& fit) {
  finder.validate();
  if (options.fast_dev_run() > 0) {
    log_warning("lr_find", "skipped: fast_dev_run is on (as Lightning).");
    return {};
  }
  auto callback = std::make_shared<LrFinderCallback>(finder);
  callback->result.mode = finder.mode();
  options = detail::trial_options(std::move(options));
  detail::ModuleSnapshot snapshot(module, kTag);
  // Eager steps: the callback reads each step's loss in on_before_backward, which a replayed
  // CUDA graph does not run.
  options.max_steps(finder.num_training())
      .limit_val_batches(0)
      .graph_training_step(false)
      .callbacks({callback, snapshot.after_configure_model()});
  try {
    detail::TunerTrialScope trial;  // no configure_callbacks() in a trial
    Trainer trainer(options);
    // A Trainer of its own would launch (and at its end wait for) processes of its own, which
    // run the rest of the program meanwhile.
    VOLT_CHECK(in_run || trainer.strategy().name() == "single_device", ConfigError, kTag,
               " the options make a run with strategy \"", trainer.strategy().name(),
               "\"; lr_find runs one process on one device. Over several processes add "
               "LearningRateFinder to the run's callbacks (its trials run on the run's processes, "
               "as Lightning's lr_find under DDP), or find the rate with devices=1 first.");
    fit(trainer);
  } catch (...) {
    snapshot.restore();
    throw;
  }
  snapshot.restore();
  LrFinderResult result = std::move(callback->result);
  std::string line = std::to_string(result.lrs.size()) + " steps from " +
                     format_lr(finder.min_lr()) + " to " +
                     format_lr(result.lrs.empty() ? finder.min_lr() : result.lrs.back());
  if (callback->stopped_early) line += " (stopped early: the loss diverged)";
  if (const auto i = steepest_descent(result, 10, 1)) {
    line += "; suggested learning rate " + format_lr(result.lrs[*i]);
  } else {
    line += std::string("; ") + kNoSuggestion;
  }
  log_info("lr_find", line + ".");
  return result;
}

}  // namespace

LrFinderResult lr_find(Module& module, DataLoader train, TrainerOptions options,
                       LrFinderOptions finder) {
  return run_range_test(module, std::move(options), std::move(finder), /*in_run=*/false,
                        [&](Trainer& t) { t.fit(module, train); });
}

LrFinderResult lr_find(Module& module, DataModule& data, TrainerOptions options,
                       LrFinderOptions finder) {
  detail::prepare_data_once(module, data);
  return run_range_test(module, std::move(options), std::move(finder), /*in_run=*/false,
                        [&](Trainer& t) { t.fit(module, data); });
}

LrFinderResult lr_find(Module& module, TrainerOptions options, LrFinderOptions finder) {
  detail::ModuleData data(module);
  detail::prepare_data_once(module, data);  // the module's own, as with a DataModule
  return run_range_test(module, std::move(options), std::move(finder), /*in_run=*/false,
                        [&](Trainer& t) { t.fit(module); });
}

namespace detail {

LrFinderResult lr_find_in_run(Module& module, DataLoader train, DataModule* hooks,
                              TrainerOptions options, LrFinderOptions finder) {
  return run_range_test(
      module, std::move(options), std::move(finder), /*in_run=*/true,
      [&](Trainer& t) { detail::run_trial_stage(t, module, Stage::kFit, train, hooks); });
}

}  // namespace detail

}  // namespace volt
