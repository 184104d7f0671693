#include "volt/callbacks/stochastic_weight_averaging.h"

#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>
#include <torch/utils.h>

#include <cmath>
#include <map>
#include <ostream>
#include <unordered_set>

#include "callbacks/detail/averaged_tensors.h"
#include "callbacks/detail/batch_norm.h"
#include "core/detail/archive_values.h"
#include "core/detail/numbers.h"
#include "core/detail/print.h"
#include "volt/core/check.h"
#include "volt/core/log.h"
#include "volt/core/module.h"
#include "volt/core/run_context.h"

namespace volt {
namespace {

constexpr const char* kTag = "[StochasticWeightAveraging]";

const char* strategy_text(AnnealStrategy s) {
  return s == AnnealStrategy::kCos ? "cos" : "linear";
}

// The module's scheduler while SWA sets the learning rate: it neither steps nor writes lrs, and
// checkpoints still hold its own state under its own name, so a resumed fit (whose
// configure_optimizers builds that scheduler again) loads it as usual.
class HeldScheduler : public LRScheduler {
 public:
  explicit HeldScheduler(std::shared_ptr<LRScheduler> held)
      : LRScheduler(held->optimizer()), held_(std::move(held)) {}
  void step() override {}
  void step(double) override {}
  std::string name() const override { return held_->name(); }
  void save(torch::serialize::OutputArchive& archive) const override { held_->save(archive); }
  void load(torch::serialize::InputArchive& archive) override { held_->load(archive); }
  const std::shared_ptr<LRScheduler>& held() const { return held_; }

 protected:
  std::vector<double> compute_lrs(const std::vector<double>& current) override { return current; }

 private:
  std::shared_ptr<LRScheduler> held_;
};

// A BatchNorm layer with running statistics, seen through what update_bn needs.
struct BatchNormLayer {
  torch::nn::BatchNormOptions* options;
  at::Tensor running_mean, running_var, num_batches_tracked;
};

std::vector<BatchNormLayer> batch_norm_layers(Module& module) {
  std::vector<BatchNormLayer> out;
  // Each layer once: a layer registered twice would have its momentum saved again after the
  // pass cleared it, and end with none.
  std::unordered_set<const torch::nn::BatchNormOptions*> seen;
  const auto add = [&](torch::nn::Module& m) {
    const detail::BatchNormView bn = detail::batch_norm_of(m);
    if (bn && bn.options->track_running_stats() && bn.running_mean->defined() &&
        seen.insert(bn.options).second) {
      out.push_back({bn.options, *bn.running_mean, *bn.running_var, *bn.num_batches_tracked});
    }
  };
  add(module);  // not through modules(true): that needs the module held by a shared_ptr
  for (const auto& m : module.modules(/*include_self=*/false)) add(*m);
  return out;
}

std::vector<double> group_lrs(const torch::optim::Optimizer& optimizer) {
  std::vector<double> out;
  for (const auto& g : optimizer.param_groups()) out.push_back(g.options().get_lr());
  return out;
}

}  // namespace

struct StochasticWeightAveraging::State {
  detail::AveragedTensors average;  // of the module's parameters
  /// Each group's lr when the first SWA epoch began (empty before).
  std::vector<double> lr0;
  /// lr0 came from a checkpoint (not from this fit's optimizer).
  bool lr0_from_checkpoint = false;
  /// swa_lrs as given: one for every group or one per group when SWA starts.
  std::vector<double> swa_lrs;
  /// The wrapper standing in the optimizer config for the module's scheduler (null if none).
  std::shared_ptr<HeldScheduler> held;
  /// The run the wrapper belongs to (to give the scheduler back).
  RunContext* held_run = nullptr;
  bool batch_norm = false;
  /// load_state ran since the last fit started: on_fit_start adopts what it read.
  bool loaded = false;
  int64_t loaded_count = 0;
  std::map<std::string, at::Tensor> loaded_average;
};

std::ostream& operator<<(std::ostream& os, const StochasticWeightAveragingOptions& o) {
  os << "StochasticWeightAveragingOptions(swa_lrs={" << detail::number_list(o.swa_lrs())
     << "}, swa_epoch_start=" << o.swa_epoch_start()
     << ", annealing_epochs=" << o.annealing_epochs()
     << ", annealing_strategy=" << strategy_text(o.annealing_strategy())
     << ", avg_fn=" << (o.avg_fn() ? "custom" : "mean") << ", device=";
  if (o.device()) {
    os << *o.device();
  } else {
    os << "module's";
  }
  return os << ")";
}

StochasticWeightAveraging::StochasticWeightAveraging(StochasticWeightAveragingOptions options)
    : options_(std::move(options)), state_(std::make_unique<State>()) {
  VOLT_CHECK(!options_.swa_lrs().empty(), ConfigError, kTag,
             " swa_lrs is empty; give the SWA learning rate, one value for every param group "
             "(e.g. {0.05}) or one per group.");
  for (double lr : options_.swa_lrs()) {
    VOLT_CHECK(std::isfinite(lr) && lr > 0, ConfigError, kTag, " swa_lrs holds ", lr,
               "; every SWA learning rate must be a positive finite number, e.g. 0.05.");
  }
  const Limit& start = options_.swa_epoch_start();
  if (start.is_fraction()) {
    VOLT_CHECK(start.fraction() >= 0 && start.fraction() <= 1, ConfigError, kTag,
               " swa_epoch_start=", start.fraction(),
               " is a fraction outside [0, 1]; give a fraction of max_epochs such as 0.8, or "
               "an epoch number >= 1.");
  } else {
    VOLT_CHECK(start.count() >= 1, ConfigError, kTag, " swa_epoch_start=", start.count(),
               " must be an epoch number >= 1 (the first epoch is 1), or a fraction of "
               "max_epochs such as 0.8.");
  }
  VOLT_CHECK(options_.annealing_epochs() >= 0, ConfigError, kTag,
             " annealing_epochs=", options_.annealing_epochs(),
             " must be >= 0 (0 switches to swa_lrs at once).");
}

StochasticWeightAveraging::~StochasticWeightAveraging() = default;

void StochasticWeightAveraging::on_fit_start(RunContext& run, Module& module) {
  State& s = *state_;
  const bool loaded = s.loaded;
  s.loaded = false;
  detail::refuse_sharded_weights(run, kTag);
  auto& configs = run.optimizer_configs();
  VOLT_CHECK(configs.size() == 1, ConfigError, kTag,
             " works with one optimizer, but "
             "configure_optimizers returned ",
             configs.size(), "; return one optimizer.");
  // -1: no last epoch (max_steps, max_time or a Timer ends the fit). As Lightning's, SWA then
  // averages from swa_epoch_start until training ends, which a fraction of "no last epoch"
  // cannot name.
  const int64_t max_epochs = run.max_epochs();
  const Limit& start = options_.swa_epoch_start();
  VOLT_CHECK(max_epochs >= 1 || !start.is_fraction(), ConfigError, kTag,
             " swa_epoch_start as a fraction (", start,
             ") is not supported when max_epochs=", max_epochs,
             "; provide swa_epoch_start as an integer (the first SWA epoch) or set "
             "TrainerOptions::max_epochs.");
  swa_start_ =
      start.is_fraction()
          ? std::max<int64_t>(
                static_cast<int64_t>(static_cast<double>(max_epochs) * start.fraction()) - 1, 0)
          : start.count() - 1;
  VOLT_CHECK(max_epochs < 1 || swa_start_ < max_epochs, ConfigError, kTag,
             " swa_epoch_start=", start, " is past the last of max_epochs=", max_epochs,
             " epochs, so nothing would be averaged; start at an epoch <= ", max_epochs, ".");
  const size_t groups = configs.front().optimizer()->param_groups().size();
  // One value is for every group the optimizer has when SWA starts and a list for that many
  // groups (as Lightning, which expands it there): BackboneFinetuning may add one before.
  s.swa_lrs = options_.swa_lrs();
  VOLT_CHECK(s.swa_lrs.size() == 1 || s.swa_lrs.size() >= groups, ConfigError, kTag, " got ",
             s.swa_lrs.size(), " swa_lrs for an optimizer with ", groups,
             " param groups; give one value for every group or one per group.");
  s.batch_norm = !batch_norm_layers(module).empty();
  VOLT_CHECK(!s.batch_norm || module.automatic_optimization(), ConfigError, kTag,
             " recomputes BatchNorm statistics with a pass of training_step, which under manual "
             "optimization would step the optimizers; use automatic optimization.");

  s.average.bind(module, /*buffers=*/false, options_.device());
  if (loaded) {
    s.average.adopt(s.loaded_average, s.loaded_count, kTag);
  } else {
    latest_update_epoch_ = -1;
    finished_epoch_ = -1;
    s.lr0.clear();
  }
  s.loaded_average.clear();
  if (run.is_global_zero()) {
    auto msg = detail::c_stream<std::ostringstream>();
    msg << "averaging the weights at the end of epochs " << swa_start_ << ".."
        << (max_epochs >= 1 ? std::to_string(max_epochs - 1) : std::string("the end of training"))
        << " (0-based); from epoch " << swa_start_ << " the learning rate anneals to {"
        << detail::number_list(s.swa_lrs) << "} over " << options_.annealing_epochs()
        << " epoch(s) (" << strategy_text(options_.annealing_strategy()) << ")";
    if (configs.front().scheduler()) {
      msg << " in place of the module's " << configs.front().scheduler()->name();
    }
    if (s.batch_norm) msg << "; BatchNorm statistics are recomputed for the average at the end";
    log_info("StochasticWeightAveraging", msg.str() + ".");
  }
}

void StochasticWeightAveraging::on_train_epoch_start(RunContext& run, Module& module) {
  const int64_t epoch = run.state().epoch;
  // The weights now are those at the end of the previous epoch. Averaging them here rather than
  // in that epoch's end hooks keeps checkpoints exact whatever order callbacks run in: a
  // checkpoint written at the end of an epoch resumes into this hook.
  if (epoch - 1 >= swa_start_ && latest_update_epoch_ < epoch - 1) {
    update_average(epoch - 1);
  }
  if (epoch >= swa_start_) apply_schedule(run, epoch);
}

void StochasticWeightAveraging::on_train_batch_end(RunContext& run, Module& module, const Batch&,
                                                   int64_t batch_idx) {
  // The last batch of the last epoch: finish before that epoch's validation and checkpoints
  // (with max_epochs -1 there is none: on_train_end finishes).
  const LoopState& st = run.state();
  if (run.max_epochs() >= 1 && st.epoch == run.max_epochs() - 1 &&
      batch_idx == st.num_training_batches - 1 && finished_epoch_ < st.epoch) {
    finish(run, module);
  }
}

void StochasticWeightAveraging::on_train_end(RunContext& run, Module& module) {
  // A fit that stopped before its last batch (EarlyStopping, max_steps, max_time).
  const LoopState& st = run.state();
  if (finished_epoch_ < st.epoch) finish(run, module);
}

void StochasticWeightAveraging::finish(RunContext& run, Module& module) {
  State& s = *state_;
  const int64_t epoch = run.state().epoch;
  finished_epoch_ = epoch;
  if (epoch >= swa_start_ && latest_update_epoch_ < epoch) update_average(epoch);
  if (s.average.count() == 0) {
    if (run.is_global_zero()) {
      log_info("StochasticWeightAveraging", "fit ended before the first SWA epoch (" +
                                                std::to_string(swa_start_) +
                                                "), so the weights are left as trained.");
    }
    return;
  }
  s.average.copy_to_module();
  std::string bn_note;
  if (s.batch_norm) {
    std::vector<BatchNormLayer> layers = batch_norm_layers(module);
    std::vector<c10::optional<double>> momenta;
    {
      torch::NoGradGuard no_grad;
      for (auto& l : layers) {
        l.running_mean.zero_();
        l.running_var.fill_(1);
        if (l.num_batches_tracked.defined()) l.num_batches_tracked.zero_();
        momenta.push_back(l.options->momentum());
        l.options->momentum(c10::nullopt);  // a cumulative average over the pass
      }
    }
    try {
      run.forward_training_data();
    } catch (...) {
      for (size_t i = 0; i < layers.size(); ++i) layers[i].options->momentum(momenta[i]);
      throw;
    }
    for (size_t i = 0; i < layers.size(); ++i) layers[i].options->momentum(momenta[i]);
    bn_note = "; the running statistics of " + std::to_string(layers.size()) +
              " BatchNorm layer(s) were recomputed over the training data";
  }
  if (run.is_global_zero()) {
    log_info("StochasticWeightAveraging",
             "the module now holds the average of the weights at the end of " +
                 std::to_string(s.average.count()) + " epoch(s) (" + std::to_string(swa_start_) +
                 ".." + std::to_string(latest_update_epoch_) + ")" + bn_note + ".");
  }
}

void StochasticWeightAveraging::on_fit_end(RunContext& run, Module&) {
  release_scheduler(run);
}

void StochasticWeightAveraging::on_exception(RunContext& run, Module&, const std::exception&) {
  release_scheduler(run);
}

void StochasticWeightAveraging::update_average(int64_t epoch) {
  state_->average.update(options_.avg_fn());
  latest_update_epoch_ = epoch;
}

void StochasticWeightAveraging::apply_schedule(RunContext& run, int64_t epoch) {
  State& s = *state_;
  OptimizerConfig& config = run.optimizer_configs().front();
  torch::optim::Optimizer& optimizer = *config.optimizer();
  if (config.scheduler() && s.held == nullptr) {
    s.held = std::make_shared<HeldScheduler>(config.scheduler());
    s.held_run = &run;
    config.scheduler(s.held);
  }
  if (s.lr0.empty()) {
    s.lr0 = group_lrs(optimizer);
    s.lr0_from_checkpoint = false;
  }
  VOLT_CHECK(!s.lr0_from_checkpoint || s.lr0.size() == optimizer.param_groups().size(),
             CheckpointError, kTag, " the checkpoint holds learning rates for ", s.lr0.size(),
             " param groups but the optimizer has ", optimizer.param_groups().size(),
             "; resume with the same optimizer setup.");
  // A group added once SWA runs (BackboneFinetuning unfreezing after swa_epoch_start) has no
  // rate to anneal from (Lightning fails there too, with a KeyError).
  VOLT_CHECK(s.lr0.size() == optimizer.param_groups().size(), ConfigError, kTag,
             " the optimizer had ", s.lr0.size(), " param groups when SWA started and has ",
             optimizer.param_groups().size(),
             " now; a param group added after swa_epoch_start cannot be annealed: add it before "
             "(e.g. BackboneFinetuning's unfreeze_backbone_at_epoch before swa_epoch_start).");
  const std::vector<double> swa_lrs =
      s.swa_lrs.size() == 1 ? std::vector<double>(s.lr0.size(), s.swa_lrs.front()) : s.swa_lrs;
  VOLT_CHECK(swa_lrs.size() == s.lr0.size(), ConfigError, kTag, " got ", s.swa_lrs.size(),
             " swa_lrs for the ", s.lr0.size(),
             " param groups the optimizer has when SWA starts (epoch ", swa_start_,
             "); give one value for every group or one per group.");
  for (size_t g = 0; g < s.lr0.size(); ++g) {
    optimizer.param_groups()[g].options().set_lr(
        SWALR::lr_at(s.lr0[g], swa_lrs[g], epoch - swa_start_, options_.annealing_epochs(),
                     options_.annealing_strategy()));
  }
}

void StochasticWeightAveraging::release_scheduler(RunContext& run) {
  State& s = *state_;
  if (s.held == nullptr) return;
  if (s.held_run == &run) {
    for (auto& config : run.optimizer_configs()) {
      if (config.scheduler() == s.held) config.scheduler(s.held->held());
    }
  }
  s.held.reset();
  s.held_run = nullptr;
}

std::vector<std::pair<std::string, at::Tensor>> StochasticWeightAveraging::averaged_parameters()
    const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  const auto& a = state_->average;
  for (size_t i = 0; i < a.average().size(); ++i) out.emplace_back(a.names()[i], a.average()[i]);
  return out;
}

int64_t StochasticWeightAveraging::n_averaged() const {
  return state_->average.count();
}

void StochasticWeightAveraging::save_state(torch::serialize::OutputArchive& archive) const {
  const State& s = *state_;
  archive.write("n_averaged", c10::IValue(s.average.count()));
  archive.write("latest_update_epoch", c10::IValue(latest_update_epoch_));
  archive.write("finished_epoch", c10::IValue(finished_epoch_));
  archive.write("lr0", detail::double_list(s.lr0));
  torch::serialize::OutputArchive avg;
  s.average.save(avg);
  archive.write("averaged", avg);
}

void StochasticWeightAveraging::load_state(torch::serialize::InputArchive& archive) {
  State& s = *state_;
  c10::IValue n, latest, finished, lr0;
  archive.read("n_averaged", n);
  archive.read("latest_update_epoch", latest);
  archive.read("finished_epoch", finished);
  archive.read("lr0", lr0);
  s.loaded_count = n.toInt();
  latest_update_epoch_ = latest.toInt();
  finished_epoch_ = finished.toInt();
  const auto lrs = lr0.toDoubleList();
  s.lr0.assign(lrs.begin(), lrs.end());
  s.lr0_from_checkpoint = !s.lr0.empty();
  torch::serialize::InputArchive avg;
  archive.read("averaged", avg);
  s.loaded_average = detail::AveragedTensors::read(avg);
  VOLT_CHECK(s.loaded_count == 0 || !s.loaded_average.empty(), CheckpointError, kTag,
             " the checkpoint counts ", s.loaded_count,
             " averaged epochs but holds no average; it is damaged.");
  s.loaded = true;
}

}  // namespace volt
