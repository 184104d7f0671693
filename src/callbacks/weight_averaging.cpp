#include "volt/callbacks/weight_averaging.h"

#include <torch/serialize/archive.h>

#include <map>
#include <ostream>

#include "callbacks/detail/averaged_tensors.h"
#include "volt/core/check.h"
#include "volt/core/log.h"
#include "volt/core/module.h"
#include "volt/core/run_context.h"

namespace volt {
namespace {

constexpr const char* kTag = "[WeightAveraging]";

void print_device(std::ostream& os, const c10::optional<c10::Device>& d) {
  if (d) {
    os << *d;
  } else {
    os << "module's";
  }
}

void print_optional(std::ostream& os, const c10::optional<int64_t>& v) {
  if (v) {
    os << *v;
  } else {
    os << "none";
  }
}

}  // namespace

struct WeightAveraging::State {
  detail::AveragedTensors average;
  /// Fit is running (the average exists only then; validate() alone uses the module as it is).
  bool in_fit = false;
  /// The module holds the average and `average` the training weights (for validation, or while
  /// a checkpoint is written).
  bool swapped = false;
  bool swapped_for_save = false;
  /// What load_state read, for on_fit_start (restore_checkpoint runs first).
  bool loaded = false;
  int64_t loaded_count = 0;
  std::map<std::string, at::Tensor> loaded_current;  // training weights (state_dict: average)
  std::map<std::string, at::Tensor> loaded_average;  // written outside fit (state_dict: average)
};

std::ostream& operator<<(std::ostream& os, const WeightAveragingOptions& o) {
  os << "WeightAveragingOptions(device=";
  print_device(os, o.device());
  return os << ", use_buffers=" << o.use_buffers()
            << ", avg_fn=" << (o.avg_fn() ? "custom" : "mean") << ")";
}

std::ostream& operator<<(std::ostream& os, const EMAWeightAveragingOptions& o) {
  os << "EMAWeightAveragingOptions(decay=" << o.decay()
     << ", update_every_n_steps=" << o.update_every_n_steps() << ", update_starting_at_step=";
  print_optional(os, o.update_starting_at_step());
  os << ", update_starting_at_epoch=";
  print_optional(os, o.update_starting_at_epoch());
  os << ", device=";
  print_device(os, o.device());
  return os << ", use_buffers=" << o.use_buffers() << ")";
}

WeightAveraging::WeightAveraging(WeightAveragingOptions options)
    : options_(std::move(options)), state_(std::make_unique<State>()) {}

WeightAveraging::~WeightAveraging() = default;

bool WeightAveraging::should_update(c10::optional<int64_t> step_idx, c10::optional<int64_t>) const {
  return step_idx.has_value();
}

int64_t WeightAveraging::n_averaged() const {
  return state_->average.count();
}

void WeightAveraging::on_fit_start(RunContext& run, Module& module) {
  State& s = *state_;
  detail::refuse_sharded_weights(run, kTag);
  s.average.bind(module, options_.use_buffers(), options_.device());
  s.swapped = s.swapped_for_save = false;
  if (s.loaded && !s.loaded_current.empty()) {
    // The module was restored with the average (the checkpoint's state): the average takes it
    // back and the module the training weights.
    s.average.adopt(s.loaded_current, s.loaded_count, kTag);
    s.average.swap();
  } else if (s.loaded) {
    s.average.adopt(s.loaded_average, s.loaded_count, kTag);
  } else {
    latest_update_step_ = 0;
    latest_update_epoch_ = -1;
  }
  s.loaded = false;
  s.loaded_current.clear();
  s.loaded_average.clear();
  s.in_fit = true;
}

void WeightAveraging::catch_up(RunContext& run) {
  if (!state_->in_fit) return;
  const LoopState& st = run.state();
  // global_step counts optimizer steps: 1 after the first, whose 0-based index is 0.
  if (st.global_step > latest_update_step_ && should_update(st.global_step - 1, c10::nullopt)) {
    state_->average.update(options_.avg_fn());
    latest_update_step_ = st.global_step;
  }
  if (st.epoch_finished && st.epoch > latest_update_epoch_ &&
      should_update(c10::nullopt, st.epoch)) {
    state_->average.update(options_.avg_fn());
    latest_update_epoch_ = st.epoch;
  }
}

void WeightAveraging::on_train_batch_end(RunContext& run, Module&, const Batch&, int64_t) {
  catch_up(run);
}

void WeightAveraging::on_train_epoch_end(RunContext& run, Module&) {
  catch_up(run);
  // An epoch that max_steps or a stop ended early ends here too (not "finished", so catch_up
  // leaves its update out): Lightning's on_train_epoch_end updates it, and so does this.
  const LoopState& st = run.state();
  if (state_->in_fit && st.epoch > latest_update_epoch_ && should_update(c10::nullopt, st.epoch)) {
    state_->average.update(options_.avg_fn());
    latest_update_epoch_ = st.epoch;
  }
}

void WeightAveraging::on_validation_epoch_start(RunContext& run, Module&) {
  if (run.sanity_checking()) return;  // before training: nothing is due, nothing to swap in
  State& s = *state_;
  catch_up(run);
  if (s.in_fit && s.average.count() > 0 && !s.swapped) {
    s.average.swap();
    s.swapped = true;
  }
}

void WeightAveraging::on_validation_epoch_end(RunContext&, Module&) {
  if (!state_->swapped_for_save) swap_back();
}

void WeightAveraging::on_save_checkpoint(RunContext& run, Module&) {
  State& s = *state_;
  // An update due for the latest step or epoch goes in first, whichever callback saves.
  if (!s.swapped) catch_up(run);
  if (s.in_fit && s.average.count() > 0 && !s.swapped) {
    s.average.swap();
    s.swapped = s.swapped_for_save = true;
  }
}

void WeightAveraging::on_save_checkpoint_end(RunContext&, Module&) {
  if (state_->swapped_for_save) swap_back();
}

void WeightAveraging::swap_back() {
  State& s = *state_;
  if (!s.swapped) return;
  s.average.swap();
  s.swapped = s.swapped_for_save = false;
}

void WeightAveraging::on_train_end(RunContext& run, Module&) {
  State& s = *state_;
  swap_back();
  catch_up(run);
  s.in_fit = false;
  if (s.average.count() == 0) {
    if (run.is_global_zero()) {
      log_info(state_key(), "no weights were averaged during fit, so the module keeps its own.");
    }
    return;
  }
  s.average.copy_to_module();
  if (run.is_global_zero()) {
    log_info(state_key(), "the module now holds the average of " +
                              std::to_string(s.average.count()) + " updates.");
  }
}

void WeightAveraging::on_exception(RunContext&, Module&, const std::exception&) {
  swap_back();
  state_->in_fit = false;
}

void WeightAveraging::save_state(torch::serialize::OutputArchive& archive) const {
  const State& s = *state_;
  archive.write("n_averaged", c10::IValue(s.average.count()));
  archive.write("latest_update_step", c10::IValue(latest_update_step_));
  archive.write("latest_update_epoch", c10::IValue(latest_update_epoch_));
  // While swapped the module's state in this checkpoint is the average and `average` holds the
  // training weights; otherwise (after fit, or before the first update) the average itself.
  torch::serialize::OutputArchive tensors;
  s.average.save(tensors);
  archive.write(s.swapped ? "current" : "average", tensors);
}

void WeightAveraging::load_state(torch::serialize::InputArchive& archive) {
  State& s = *state_;
  c10::IValue n, step, epoch;
  archive.read("n_averaged", n);
  archive.read("latest_update_step", step);
  archive.read("latest_update_epoch", epoch);
  s.loaded_count = n.toInt();
  latest_update_step_ = step.toInt();
  latest_update_epoch_ = epoch.toInt();
  torch::serialize::InputArchive tensors;
  s.loaded_current.clear();
  s.loaded_average.clear();
  if (archive.try_read("current", tensors)) {
    s.loaded_current = detail::AveragedTensors::read(tensors);
  } else if (archive.try_read("average", tensors)) {
    s.loaded_average = detail::AveragedTensors::read(tensors);
  }
  VOLT_CHECK(s.loaded_count == 0 || !s.loaded_current.empty() || !s.loaded_average.empty(),
             CheckpointError, kTag, " the checkpoint counts ", s.loaded_count,
             " averaged updates but holds no weights; it is damaged.");
  s.loaded = true;
}

// ------------------------------------------------------------------------ EMAWeightAveraging

namespace {

AverageFn ema_fn(double decay) {
  // torch.optim.swa_utils.get_ema_avg_fn: decay * ema + (1 - decay) * current.
  return [decay](const at::Tensor& ema, const at::Tensor& current, int64_t) {
    return decay * ema + (1 - decay) * current;
  };
}

}  // namespace

EMAWeightAveraging::EMAWeightAveraging(EMAWeightAveragingOptions options)
    : WeightAveraging(WeightAveragingOptions()
                          .device(options.device())
                          .use_buffers(options.use_buffers())
                          .avg_fn(ema_fn(options.decay()))),
      ema_(std::move(options)) {
  VOLT_CHECK(ema_.decay() >= 0 && ema_.decay() <= 1, ConfigError,
             "[EMAWeightAveraging] decay=", ema_.decay(), " must be in [0, 1], e.g. 0.999.");
  VOLT_CHECK(ema_.update_every_n_steps() >= 0, ConfigError,
             "[EMAWeightAveraging] update_every_n_steps=", ema_.update_every_n_steps(),
             " must be >= 0 (0: never by step).");
  VOLT_CHECK(ema_.update_starting_at_step().value_or(0) >= 0 &&
                 ema_.update_starting_at_epoch().value_or(0) >= 0,
             ConfigError,
             "[EMAWeightAveraging] update_starting_at_step and update_starting_at_epoch are "
             "0-based indices; give values >= 0.");
}

bool EMAWeightAveraging::should_update(c10::optional<int64_t> step_idx,
                                       c10::optional<int64_t> epoch_idx) const {
  if (step_idx) {
    const bool started =
        !ema_.update_starting_at_step() || *step_idx >= *ema_.update_starting_at_step();
    const bool due =
        ema_.update_every_n_steps() > 0 && *step_idx % ema_.update_every_n_steps() == 0;
    if (started && due) return true;
  }
  return epoch_idx && ema_.update_starting_at_epoch() &&
         *epoch_idx >= *ema_.update_starting_at_epoch();
}

}  // namespace volt
