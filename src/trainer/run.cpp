#include "trainer/detail/run.h"

#include <unistd.h>

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <mutex>
#include <set>
#include <typeinfo>
#include <unordered_set>

#include "core/detail/default_steps.h"
#include "core/detail/numbers.h"
#include "core/detail/print.h"
#include "optim/detail/step_scheduler.h"
#include "strategies/detail/agree.h"
#include "strategies/detail/stacked_gather_of.h"
#include "trainer/detail/batch_hooks.h"
#include "trainer/detail/device_prefetch.h"
#include "trainer/detail/tuner_trial.h"
#include "trainer/loops/optimization_step.h"
#include "volt/accelerators/host_allocator.h"
#include "volt/callbacks/early_stopping.h"
#include "volt/callbacks/gradient_accumulation_scheduler.h"
#include "volt/callbacks/model_checkpoint.h"
#include "volt/callbacks/on_exception_checkpoint.h"
#include "volt/callbacks/timer.h"
#include "volt/core/check.h"
#include "volt/core/env.h"
#include "volt/core/log.h"
#include "volt/data/data_module.h"
#include "volt/optim/lr_scheduler.h"
#include "volt/strategies/deepspeed.h"

namespace volt {
namespace detail {
namespace {

// The parameters that require a gradient, as a set (a callback that wraps submodules may list
// the same tensors in another order).
std::vector<const void*> trainable_of(Module& m) {
  std::vector<const void*> out;
  for (const auto& p : m.parameters(true)) {
    if (p.defined() && p.requires_grad()) out.push_back(p.unsafeGetTensorImpl());
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace

Run::Run() : step(std::make_unique<OptimizationStep>(*this)) {}
Run::~Run() = default;

// ------------------------------------------------------------------------------ RunContext

const Metrics& Run::callback_metrics() const {
  refresh_cache();
  return cb_cache;
}

// Kept with the reduced epoch values: callbacks and plateau schedulers read it until something
// logged under the name replaces it, and a checkpoint holds it as it holds them.
void Run::set_callback_metric(const std::string& name, double value) {
  epoch_metrics[name] = value;
  cache_dirty = true;
}

const Metrics& Run::progress_bar_metrics() const {
  refresh_cache();
  return pb_cache;
}

void Run::refresh_cache() const {
  if (!cache_dirty) return;
  cb_cache = epoch_metrics;
  pb_cache = prog_bar_epoch;
  for (auto& kv : train_metrics.step_values(false, false)) cb_cache[kv.first] = kv.second;
  for (auto& kv : train_metrics.step_values(false, true)) pb_cache[kv.first] = kv.second;
  for (const auto& kv : plain_from_step) {
    const auto it = cb_cache.find(kv.second);
    if (it != cb_cache.end()) cb_cache[kv.first] = it->second;
  }
  cache_dirty = false;
}

void Run::log(const std::string& name, const at::Tensor& value, const LogOptions& o) {
  // Lightning's fx_validator refuses the same places (the end hooks, the mode hooks, set-up,
  // predict; a checkpoint hook takes the scope of the hook that saves).
  VOLT_CHECK(scope != LogScope::kNone, ConfigError, "[Module] log(\"", name, "\") called in ",
             where,
             ", where nothing can be logged; log from training_step, validation_step, "
             "test_step, their batch hooks, on_train_start, on_validation_start / on_test_start "
             "or an on_*_epoch_start / on_*_epoch_end hook; from here a value can go to the "
             "loggers directly (run.loggers()[i]->log_metrics).");
  if (scope == LogScope::kDiscard || drop_logs) return;  // forward_training_data's pass
  if (opts.barebones()) {
    // Lightning's: a warning and nothing logged, so a module that logs still runs barebones.
    if (!barebones_log_warned && is_global_zero()) {
      log_warning("Module", "log(\"" + name +
                                "\") was called, but the Trainer runs with barebones=true, where "
                                "logging is off (it can impact raw speed): nothing is logged.");
    }
    barebones_log_warned = true;
    return;
  }
  VOLT_CHECK(!name.empty(), ValueError,
             "[Module] log() got an empty name; name the metric, e.g. log(\"train_loss\", loss).");
  VOLT_CHECK(!o.add_dataloader_idx() || name.find("/dataloader_idx_") == std::string::npos,
             ConfigError, "[Module] log(\"", name,
             "\") names a dataloader itself, but add_dataloader_idx is on and appends "
             "\"/dataloader_idx_<N>\" with several loaders; drop that part of the name, or pass "
             "LogOptions().add_dataloader_idx(false).");
  VOLT_CHECK(!o.batch_size() || *o.batch_size() >= 0, ValueError, "[Module] log(\"", name,
             "\") got batch_size=", o.batch_size().value_or(0),
             "; give the value's weight in the epoch's mean as a count >= 0.");
  VOLT_CHECK(value.numel() == 1, ValueError, "[Module] log(\"", name, "\") got a tensor of shape ",
             value.sizes(), "; log a scalar (one element), e.g. loss or acc.mean().");
  if (st.stage == Stage::kSanityCheck) return;  // sanity-check values are discarded
  // One of several evaluation loaders: its values are kept apart by name (Lightning's rule).
  std::string key = name;
  if (log_dataloader >= 0) {
    if (o.add_dataloader_idx()) key += "/dataloader_idx_" + std::to_string(log_dataloader);
    const auto seen = eval_key_loader.emplace(key, log_dataloader);
    VOLT_CHECK(seen.second || seen.first->second == log_dataloader, ConfigError, "[Module] log(\"",
               key, "\") with add_dataloader_idx=false from dataloader ", log_dataloader,
               " after dataloader ", seen.first->second,
               " logged it: the loaders' values would mix; give each loader its own name, or "
               "leave add_dataloader_idx on (it appends \"/dataloader_idx_<N>\").");
  }
  const bool in_train_step = scope == LogScope::kTrainStep;
  // A validation/test step or batch hook (not the pass's start and epoch-end hooks): on_step
  // values go to the loggers after each batch (Lightning's fx_validator allows them there).
  const bool in_eval_batch = scope == LogScope::kEval && eval_batch >= 0;
  const bool on_step = o.on_step().value_or(in_train_step);
  const bool on_epoch = o.on_epoch().value_or(!in_train_step);
  VOLT_CHECK(on_step || on_epoch, ConfigError, "[Module] log(\"", name,
             "\") with on_step=false and on_epoch=false logs nothing; enable one of them.");
  VOLT_CHECK(!on_step || in_train_step || in_eval_batch, ConfigError, "[Module] log(\"", name,
             "\", on_step=true) is only possible in training, validation and test steps and "
             "their batch hooks; use on_epoch.");
  if (capture_log != nullptr) {
    capture_log->push_back(CapturedLog{name, value.detach(), o});
    return;
  }
  at::Tensor v = value.detach().reshape({});
  const bool both = on_step && on_epoch;
  const bool sync = o.sync_dist() && strategy().world_size() > 1;
  if (on_step) {
    // Step values are synchronised when logged (every rank logs them at the same point).
    at::Tensor s = sync ? strategy().reduce(v.to(torch::kDouble), o.reduce()) : v;
    active_metrics->add_step(both ? key + "_step" : key, s, o.prog_bar(), o.logger());
    // In training the plain name answers with the step value until the epoch's mean replaces
    // it; an evaluation's plain name is its epoch value only (Lightning keeps evaluation step
    // values out of callback_metrics).
    if (both && in_train_step) plain_from_step[key] = key + "_step";
  }
  if (on_epoch) {
    active_metrics->add_epoch(both ? key + "_epoch" : key, v,
                              o.batch_size().value_or(current_batch_size), o.reduce(), o.prog_bar(),
                              o.logger(), sync);
    const int64_t replicas = strategy().data_shard().world_size;
    if (!o.sync_dist() && replicas > 1) {
      // Lightning's PossibleUserWarning for epoch-level values in a distributed run.
      warn_once("log_without_sync_dist:" + key, "Module",
                "log(\"" + key + "\") at epoch level without sync_dist in a run of " +
                    std::to_string(replicas) +
                    " data-parallel processes: each reduces only its own batches, and the value "
                    "reported (and monitored by callbacks) is rank 0's; pass "
                    "LogOptions().sync_dist(true) for the weighted mean over every process.");
    }
  }
  cache_dirty = true;
}

void Run::save_checkpoint(const std::string& path, bool weights_only) {
  VOLT_CHECK(!weights_only || dynamic_cast<const DeepSpeedStrategy*>(&strategy()) == nullptr,
             ConfigError, "[Trainer] a weights-only checkpoint with ", strategy().name(),
             ": its checkpoints are folders of every rank's shards, consolidated with their "
             "optimizer state; save full checkpoints (save_weights_only=false) and take the "
             "weights with volt::load_weights or `volt zero-to-fp32`.");
  step->before_checkpoint();  // never weights a non-finite loss stepped; current optimizer state
  // Callbacks may change what the module holds while its state is taken (write_checkpoint
  // refuses a run without a module).
  const auto each = [&](const char* hook, void (Callback::*fn)(RunContext&, Module&)) {
    if (module != nullptr) callback_hook(hook, [&](Callback& c) { (c.*fn)(*this, *module); });
  };
  each("on_save_checkpoint", &Callback::on_save_checkpoint);
  // The loggers' rows reach disk before the checkpoint does (send_to_loggers saves them after
  // every row as well). Rank 0's loggers only.
  save_loggers();
  try {
    torch::serialize::OutputArchive root;
    write_checkpoint(*this, root, weights_only);
    strategy().save_checkpoint(root, path);
  } catch (...) {
    each("on_save_checkpoint_end", &Callback::on_save_checkpoint_end);
    throw;
  }
  each("on_save_checkpoint_end", &Callback::on_save_checkpoint_end);
}

void Run::remove_checkpoint(const std::string& path) {
  strategy().remove_checkpoint(path);
}

void Run::link_checkpoint(const std::string& target, const std::string& path) {
  strategy().link_checkpoint(target, path);
}

void Run::share_log_dir() {
  if (strategy().world_size() <= 1) return;
  // Rank 0 picks (and creates) the run folder; the others learn its name. Every entry point
  // broadcasts, even when this process already knows the folder: ranks relaunched by an elastic
  // restart are fresh processes, and every rank must issue the same collectives.
  const std::string before = shared_log_dir_;
  shared_log_dir_.clear();  // rank 0 asks its loggers (again, after a restore)
  shared_log_dir_ = broadcast_string(is_global_zero() ? log_dir() : std::string());
  // A restore moved the loggers back into the resumed run's folder: the one rank 0 created at
  // set-up goes again if nothing was written into it (rmdir removes only an empty folder).
  if (is_global_zero() && !before.empty() && before != shared_log_dir_) ::rmdir(before.c_str());
}

std::string Run::log_dir() const {
  if (!shared_log_dir_.empty()) return shared_log_dir_;
  return loggers_.empty() ? opts.default_root_dir() : loggers_.front()->log_dir();
}

void Run::manual_backward(const at::Tensor& loss) {
  VOLT_CHECK(module && !module->automatic_optimization(), ConfigError,
             "[Module] manual_backward() is for manual optimization; call "
             "set_automatic_optimization(false) in your module's constructor, or just "
             "return the loss from training_step.");
  hook(
      "on_before_backward", [&](Module& m) { m.on_before_backward(loss); },
      [&](Callback& c) { c.on_before_backward(*this, *module, loss); });
  strategy().backward(loss, *module, /*sync_gradients=*/true);
  hook(
      "on_after_backward", [&](Module& m) { m.on_after_backward(); },
      [&](Callback& c) { c.on_after_backward(*this, *module); });
}

void Run::manual_step(size_t index) {
  VOLT_CHECK(index < optimizers.size(), ConfigError, "[Module] optimizer index ", index,
             " out of range: configure_optimizers returned ", optimizers.size(), ".");
  auto& opt = *optimizers[index].optimizer();
  unscale_for_hooks(opt);
  hook(
      "on_before_optimizer_step", [&](Module& m) { m.on_before_optimizer_step(opt); },
      [&](Callback& c) { c.on_before_optimizer_step(*this, *module, opt); });
  if (!strategy().optimizer_step(opt, c10::nullopt, opts.gradient_clip_algorithm())) return;
  ++st.global_step;
  step_schedulers_of(index);
}

void Run::manual_count_step(size_t index) {
  VOLT_CHECK(index < optimizers.size(), ConfigError, "[Module] optimizer index ", index,
             " out of range: configure_optimizers returned ", optimizers.size(), ".");
  ++st.global_step;
  step_schedulers_of(index);
}

at::Tensor Run::clip_gradients(torch::optim::Optimizer& optimizer, c10::optional<double> value,
                               c10::optional<ClipAlgorithm> algorithm) {
  const c10::optional<double> trainer_value = opts.gradient_clip_val();
  if (value) {
    VOLT_CHECK(std::isfinite(*value), ValueError,
               "[Module] clip_gradients(gradient_clip_val=", *value,
               ") is not a finite number; pass a value > 0 to clip, or 0 for none.");
    VOLT_CHECK(!trainer_value || *trainer_value == *value, ConfigError,
               "[Module] clip_gradients(gradient_clip_val=", *value,
               ") while the Trainer has gradient_clip_val=", *trainer_value,
               "; set only one of them: drop the Trainer's option, or call "
               "clip_gradients(optimizer) without a value to use the Trainer's.");
  } else {
    value = trainer_value;
  }
  if (algorithm) {
    VOLT_CHECK(!trainer_value || *algorithm == opts.gradient_clip_algorithm(), ConfigError,
               "[Module] clip_gradients(gradient_clip_algorithm=", to_string(*algorithm),
               ") while the Trainer clips with gradient_clip_algorithm=",
               to_string(opts.gradient_clip_algorithm()),
               "; set only one of them: drop the Trainer's gradient_clip_val, or call "
               "clip_gradients without an algorithm.");
  } else {
    algorithm = opts.gradient_clip_algorithm();
  }
  if (!value || *value <= 0) return {};
  if (!module->automatic_optimization()) {
    // In automatic optimization the step has unscaled the gradients before it asks the module
    // to clip; a manual training_step clips before its own step() does.
    VOLT_CHECK(strategy().name() != "deepspeed", NotAvailable,
               "[Module] clip_gradients under manual optimization with the deepspeed strategy "
               "(its gradients are partitioned and unscaled inside its step); use automatic "
               "optimization with gradient_clip_val, or the JSON's gradient_clipping.");
    strategy().precision().unscale_gradients(optimizer);
  }
  Part part(*this, "clip_gradients");
  return strategy().clip_gradients(optimizer, *value, *algorithm);
}

void Run::unscale_for_hooks(torch::optim::Optimizer& optimizer) {
  if (strategy().name() != "deepspeed") strategy().precision().unscale_gradients(optimizer);
}

void Run::zero_grad(torch::optim::Optimizer& optimizer) {
  strategy().zero_grad(optimizer);
}

void Run::step_lr_scheduler(LRScheduler& scheduler, c10::optional<double> metric) {
  detail::step_scheduler(scheduler, metric);
}

void Run::manual_zero_grad(size_t index) {
  VOLT_CHECK(index < optimizers.size(), ConfigError, "[Module] optimizer index ", index,
             " out of range: configure_optimizers returned ", optimizers.size(), ".");
  strategy().zero_grad(*optimizers[index].optimizer());
}

// ------------------------------------------------------------------------ setup and limits

int64_t Run::resolved_max_epochs() const {
  if (fast_dev) return 1;
  if (opts.max_epochs()) return *opts.max_epochs();  // -1: no limit
  return unset_max_epochs_bounded() ? -1 : 1000;
}

int64_t Run::resolved_min_epochs() const {
  if (opts.min_epochs()) return *opts.min_epochs();
  return opts.min_steps() ? 1 : 0;
}

bool Run::unset_max_epochs_bounded() const {
  // Lightning's _parse_loop_limits: an unset max_epochs is no limit when max_steps, max_time or a
  // Timer callback bounds the fit, else 1000.
  if (opts.max_steps() >= 0 || opts.max_time()) return true;
  for (const auto& c : callbacks) {
    if (dynamic_cast<const Timer*>(c.get()) != nullptr) return true;
  }
  return false;
}

int64_t Run::estimated_stepping_batches() const {
  VOLT_CHECK(fit_train != nullptr, ConfigError,
             "[Trainer] estimated_stepping_batches() is known during fit only (from its training "
             "loader); call it from configure_optimizers or a hook of fit.");
  const int64_t epochs = resolved_max_epochs();
  if (epochs < 0) {
    VOLT_CHECK(opts.max_steps() >= 0, ConfigError,
               "[Trainer] estimated_stepping_batches() has no bound to count: no epoch or step "
               "limit ends this fit (max_epochs=-1, or only time: max_time or a Timer); set "
               "max_epochs or max_steps as well.");
    return opts.max_steps();
  }
  const int64_t batches = train_limit(*fit_train);
  // The Trainer's factor, or a GradientAccumulationScheduler's for each epoch (it refuses to run
  // beside a Trainer factor above 1).
  const GradientAccumulationScheduler* schedule = nullptr;
  for (const auto& c : callbacks) {
    if (auto* s = dynamic_cast<const GradientAccumulationScheduler*>(c.get())) schedule = s;
  }
  const auto steps_in = [&](int64_t epoch) {
    const int64_t accumulate =
        std::max<int64_t>(1, schedule != nullptr ? schedule->accumulate_grad_batches(epoch)
                                                 : opts.accumulate_grad_batches());
    return (batches + accumulate - 1) / accumulate;
  };
  int64_t steps = 0;
  if (schedule == nullptr) {
    steps = steps_in(0) * std::max<int64_t>(epochs, 1);
  } else {
    for (int64_t e = 0; e < std::max<int64_t>(epochs, 1); ++e) steps += steps_in(e);
  }
  return opts.max_steps() >= 0 ? std::min(steps, opts.max_steps()) : steps;
}

at::Tensor Run::all_gather(const at::Tensor& value, bool sync_grads) {
  return detail::stacked_all_gather(strategy(), value, sync_grads);
}

bool Run::overfitting() const {
  const Limit& o = opts.overfit_batches();
  return o.is_fraction() ? o.fraction() > 0 : o.count() > 0;
}

int64_t Run::limit_batches(const Limit& limit, int64_t available, const char* option) {
  VOLT_CHECK(!limit.is_fraction() || limit.fraction() <= 0.0 || available == 0 ||
                 limit.fraction() * static_cast<double>(available) >= 1.0,
             ConfigError, "[Trainer] ", option, "=", limit.fraction(), " of a loader of ",
             available, " batches is less than one batch; raise ", option, " to at least ",
             // Rounded up at the printed precision, so the value shown works (1/3 would print
             // as 0.333333, which is below it).
             std::ceil(1e6 / static_cast<double>(available)) / 1e6, " or pass a batch count.");
  return limit.resolve(available);
}

// fast_dev_run replaces limit_*_batches (Lightning's _init_debugging_flags; overfit_batches
// stays the validation's limit then, as there).
std::pair<Limit, const char*> Run::val_limit_option() const {
  if (overfitting()) return {opts.overfit_batches(), "overfit_batches"};
  if (fast_dev) return {Limit(opts.fast_dev_run()), "fast_dev_run"};
  return {opts.limit_val_batches(), "limit_val_batches"};
}

int64_t Run::val_limit(const DataLoader& val) const {
  const auto [limit, option] = val_limit_option();
  return limit_batches(limit, val.num_batches(), option);
}

int64_t Run::train_limit(const DataLoader& train) const {
  const bool over = overfitting();
  // fast_dev_run bounds the steps (Lightning's max_steps = N); overfit_batches stays the limit.
  if (fast_dev && !over) return std::min(opts.fast_dev_run(), train.num_batches());
  if (fast_dev) {
    return std::min(opts.fast_dev_run(),
                    limit_batches(opts.overfit_batches(), train.num_batches(), "overfit_batches"));
  }
  return limit_batches(over ? opts.overfit_batches() : opts.limit_train_batches(),
                       train.num_batches(), over ? "overfit_batches" : "limit_train_batches");
}

void Run::check_accumulate_grad_batches(int64_t batches) const {
  VOLT_CHECK(batches >= 1, ConfigError, "[Trainer] accumulate_grad_batches=", batches,
             " must be >= 1.");
  VOLT_CHECK(module == nullptr || module->automatic_optimization(), ConfigError,
             "[Trainer] gradient accumulation belongs to automatic optimization; with manual "
             "optimization training_step decides when to step (accumulate there and drop the "
             "GradientAccumulationScheduler).");
  strategy().check_accumulation_change(batches);
}

void Run::set_accumulate_grad_batches(int64_t batches) {
  check_accumulate_grad_batches(batches);
  if (batches == st.accumulate_grad_batches) return;
  VOLT_CHECK(st.accumulated == 0 || train_batch < 0, ValueError,
             "[Trainer] accumulate_grad_batches changed from ", st.accumulate_grad_batches, " to ",
             batches, " at batch ", train_batch, " while ", st.accumulated,
             " batches of the next step are accumulated (scaled by 1/", st.accumulate_grad_batches,
             "); change it when an epoch starts.");
  st.accumulate_grad_batches = batches;
}

void Run::setup_run(Module& m, Stage stage) {
  module = &m;
  st.stage = stage;
  st.status = RunStatus::kRunning;
  no_validation_step = false;  // each entry point's module is seen afresh
  validation_step_known = false;
  m.attach(this);
  // Before the strategy starts threads of its own: glibc changes its thresholds without
  // synchronising with other threads' mallocs. Logged below, once the rank is known.
  if (opts.reuse_host_memory()) reuse_freed_host_memory();
  strategy().set_config_fingerprint(config_fingerprint());
  strategy().set_loop_settings(
      {opts.accumulate_grad_batches(), opts.gradient_clip_val(), stage == Stage::kFit});
  strategy().launch();
  strategy().setup_environment();
  // Once per process, after the strategy set the rank (only rank 0 prints info).
  static std::once_flag allocator_logged;
  std::call_once(allocator_logged, [] { log_info("Trainer", describe(host_allocator())); });
  if (opts.reuse_host_memory()) {
    static std::once_flag reuse_logged;
    std::call_once(reuse_logged, [] { log_info("Trainer", reuse_freed_host_memory().detail); });
  }
  check_environment();  // unknown VOLT_* variables warned once, bad values stop every run
  share_log_dir();
  if (prof != nullptr) prof->setup(to_string(stage), strategy().rank(), log_dir());
  // Before the strategy takes the module: a callback freezing layers here (BaseFinetuning)
  // keeps them out of DDP's gradient buckets, and configure_optimizers sees them frozen.
  callbacks_set_up = 0;
  module_set_up = false;
  attach_model_callbacks(m);
  prepare_data();
  // Lightning's order: the DataModule's setup, the callbacks', the module's.
  if (data != nullptr) setup_data(stage);
  callback_hook("setup", [&](Callback& c) {
    c.setup(*this, m, stage);
    ++callbacks_set_up;
  });
  m.attach(this);  // a tuner callback's trials ran in Trainers of their own, which detach it
  module_hook("setup", [&](Module& mm) { mm.setup(stage); });
  module_set_up = true;
  {
    // Layers built here are made in the precision's dtype (bf16-true: bfloat16, never an fp32
    // copy first), as Lightning calls configure_model inside its precision's init context.
    const auto init = strategy().precision().tensor_init_context();
    module_hook("configure_model", [&](Module& mm) { mm.configure_model(); });
  }
  strategy().setup_module(m);
  trainable = trainable_of(m);
}

namespace {
thread_local int tuner_trials = 0;
}  // namespace

TunerTrialScope::TunerTrialScope() {
  ++tuner_trials;
}
TunerTrialScope::~TunerTrialScope() {
  --tuner_trials;
}
bool TunerTrialScope::active() {
  return tuner_trials > 0;
}

std::shared_ptr<Strategy> run_strategy(RunContext& run) {
  auto* r = dynamic_cast<Run*>(&run);
  VOLT_CHECK(r != nullptr, InternalError,
             "[Trainer] a tuner callback ran outside a Trainer's entry point.");
  return r->plan.strategy;
}

void Run::attach_model_callbacks(Module& m) {
  if (TunerTrialScope::active()) return;
  std::vector<std::shared_ptr<Callback>> own;
  {
    Part part(*this, "configure_callbacks");
    own = m.configure_callbacks();
  }
  if (own.empty()) return;
  std::vector<std::string> replaced;
  for (const auto& c : own) {
    VOLT_CHECK(c != nullptr, ConfigError,
               "[Trainer] configure_callbacks() returned a null callback; return constructed "
               "callbacks only.");
    const std::type_info& type = typeid(*c);
    auto same_type = [&](const std::shared_ptr<Callback>& x) {
      if (x == c || typeid(*x) != type) return false;
      replaced.push_back(c10::demangle(type.name()));
      return true;
    };
    callbacks.erase(std::remove_if(callbacks.begin(), callbacks.end(), same_type), callbacks.end());
    if (std::find(callbacks.begin(), callbacks.end(), c) == callbacks.end()) callbacks.push_back(c);
  }
  arrange_callbacks();
  if (!replaced.empty() && is_global_zero()) {
    std::sort(replaced.begin(), replaced.end());
    replaced.erase(std::unique(replaced.begin(), replaced.end()), replaced.end());
    std::string names;
    for (const auto& n : replaced) names += (names.empty() ? "" : ", ") + n;
    log_info("Trainer", "the module's configure_callbacks() replaces the Trainer's " + names + ".");
  }
}

void Run::arrange_callbacks() {
  std::set<std::string> keys;
  for (const auto& c : callbacks) {
    VOLT_CHECK(keys.insert(c->state_key()).second, ConfigError,
               "[Trainer] two callbacks share state_key \"", c->state_key(),
               "\"; give them distinct options (e.g. monitor); a module's configure_callbacks() "
               "adds to the Trainer's callbacks (one of a type replaces the Trainer's).");
  }
  auto is_checkpoint = [](const std::shared_ptr<Callback>& c) {
    return dynamic_cast<ModelCheckpoint*>(c.get()) != nullptr;
  };
  if (fast_dev) {
    // A smoke test writes no checkpoint, whoever configured the callback, and stops early on
    // nothing (Lightning's EarlyStopping returns under fast_dev_run: a monitor the smoke run
    // does not log is no error there).
    callbacks.erase(std::remove_if(callbacks.begin(), callbacks.end(),
                                   [&](const std::shared_ptr<Callback>& c) {
                                     return is_checkpoint(c) ||
                                            dynamic_cast<EarlyStopping*>(c.get()) != nullptr;
                                   }),
                    callbacks.end());
  }
  // As Lightning: checkpoints last, so that a checkpoint written at a hook holds what the other
  // callbacks did at it (EarlyStopping's count at on_validation_end).
  std::stable_partition(callbacks.begin(), callbacks.end(),
                        [&](const auto& c) { return !is_checkpoint(c); });
}

void Run::setup_data(Stage stage) {
  Part part(*this, "DataModule.setup");
  data->setup(stage);
  data_set_up = true;
}

void Run::prepare_data() {
  if (TunerTrialScope::active()) return;
  // Where it runs (each node's first process, or rank 0) it may draw random numbers; put the
  // generators back so that the run draws the same on every process either way.
  const auto prepare = [&](const char* name, bool per_node, const std::function<void()>& call) {
    Part part(*this, name);
    strategy().run_preparation(name, per_node, [&] {
      const auto rng = strategy().Strategy::rng_states();
      call();
      strategy().Strategy::set_rng_states(rng);
    });
  };
  if (data != nullptr) {
    prepare("DataModule.prepare_data", data->prepare_data_per_node(),
            [&] { data->prepare_data(); });
  }
  prepare("prepare_data", module->prepare_data_per_node(),
          [&] { module_hook("prepare_data", [](Module& m) { m.prepare_data(); }); });
}

namespace {

bool same_tensors(const Batch& a, const Batch& b) {
  if (!a.input.is_same(b.input) || !a.target.is_same(b.target)) return false;
  if (a.extra.size() != b.extra.size()) return false;
  for (const auto& kv : a.extra) {
    auto it = b.extra.find(kv.first);
    if (it == b.extra.end() || !it->second.is_same(kv.second)) return false;
  }
  return true;
}

// One batch hook: the DataModule's when it overrides it, else the module's (see
// run_batch_hooks).
template <typename DF, typename MF>
Batch batch_hook(DataModule* data, Module& module, DefaultSteps::Bit bit, const char* name,
                 const char* data_name, Batch batch, const BatchHookCall& call_data,
                 const BatchHookCall& call_module, DF&& data_fn, MF&& module_fn) {
  if (data != nullptr) {
    DefaultSteps::clear(*data);
    Batch out;
    call_data(data_name, [&] { out = data_fn(*data, batch); });
    if (!DefaultSteps::ran(*data, bit) || !same_tensors(out, batch)) return out;
  }
  Batch out;
  call_module(name, [&] { out = module_fn(module, std::move(batch)); });
  return out;
}

}  // namespace

Batch run_batch_hooks(DataModule* data, Module& module, Batch raw,
                      c10::optional<c10::Device> device, const BatchHookCall& call_data,
                      const BatchHookCall& call_module) {
  Batch batch = batch_hook(
      data, module, DefaultSteps::kBeforeBatchTransfer, "on_before_batch_transfer",
      "DataModule.on_before_batch_transfer", std::move(raw), call_data, call_module,
      [](DataModule& d, Batch b) { return d.on_before_batch_transfer(std::move(b)); },
      [](Module& m, Batch b) { return m.on_before_batch_transfer(std::move(b)); });
  if (device) {
    batch = batch_hook(
        data, module, DefaultSteps::kTransferBatch, "transfer_batch_to_device",
        "DataModule.transfer_batch_to_device", std::move(batch), call_data, call_module,
        [&](DataModule& d, Batch b) { return d.transfer_batch_to_device(std::move(b), *device); },
        [&](Module& m, Batch b) { return m.transfer_batch_to_device(std::move(b), *device); });
  }
  return batch_hook(
      data, module, DefaultSteps::kAfterBatchTransfer, "on_after_batch_transfer",
      "DataModule.on_after_batch_transfer", std::move(batch), call_data, call_module,
      [](DataModule& d, Batch b) { return d.on_after_batch_transfer(std::move(b)); },
      [](Module& m, Batch b) { return m.on_after_batch_transfer(std::move(b)); });
}

Batch Run::transfer(Batch raw) {
  return run_batch_hooks(
      data, *module, std::move(raw), strategy().root_device(),
      [this](const char* name, const std::function<void()>& fn) {
        Part part(*this, name);
        fn();
      },
      [this](const char* name, const std::function<void()>& fn) {
        module_hook(name, [&](Module&) { fn(); });
      });
}

Batch Run::batch_to_device(const Batch& batch) const {
  if (prefetch != nullptr) {
    if (c10::optional<Batch> ahead = prefetch->take(batch)) return std::move(*ahead);
  }
  return strategy().batch_to_device(batch);
}

void Run::teardown_hooks(Module& m, Stage stage, bool failed) {
  const size_t n = std::min(callbacks_set_up, callbacks.size());
  const bool module_too = module_set_up;
  DataModule* data_too = data_set_up ? data : nullptr;
  callbacks_set_up = 0;
  module_set_up = false;
  data_set_up = false;
  // Every hook runs even when an earlier one throws. After a failure their errors are logged;
  // after a successful run the first one fails it (thrown once they all ran).
  std::exception_ptr first;
  auto call = [&](const std::string& who, const std::function<void()>& f) {
    try {
      f();
    } catch (const std::exception& e) {
      if (!failed && !first) {
        first = std::current_exception();
      } else {
        log_warning("Trainer", who + ".teardown failed: " + e.what());
      }
    } catch (...) {
      if (!failed && !first) {
        first = std::current_exception();
      } else {
        log_warning("Trainer", who + ".teardown failed");
      }
    }
  };
  if (data_too != nullptr) {
    call("DataModule", [&] {
      Part part(*this, "DataModule.teardown");
      data_too->teardown(stage);
    });
  }
  auto teardown = [&](Callback& c) { c.teardown(*this, m, stage); };
  for (size_t i = 0; i < n; ++i) {
    Callback& c = *callbacks[i];
    call(c.state_key(), [&] { call_callback("teardown", c, teardown); });
  }
  if (module_too) {
    call("Module", [&] { module_hook("teardown", [&](Module& mm) { mm.teardown(stage); }); });
  }
  if (first) std::rethrow_exception(first);
}

void Run::check_trainable_parameters() {
  std::vector<const void*> now = trainable_of(*module);
  if (now == trainable) return;
  if (is_global_zero()) {
    log_info("Trainer", "the parameters that require a gradient changed (" +
                            std::to_string(trainable.size()) + " -> " + std::to_string(now.size()) +
                            " tensors) at epoch " + std::to_string(st.epoch) + "; " +
                            strategy().name() + " follows the new set.");
  }
  trainable = std::move(now);
  strategy().trainable_parameters_changed(*module);
  if (step) step->trainable_parameters_changed();
}

double Run::fit_elapsed() const {
  if (fit_start == Clock::time_point{}) return fit_elapsed_before;  // no fit yet
  const Clock::time_point end = fit_end ? *fit_end : Clock::now();
  return fit_elapsed_before + std::chrono::duration<double>(end - fit_start).count();
}

void Run::check_stop(bool lagged, bool in_fit) {
  StopRequest local;
  local.signal = signals != nullptr ? signals->received() : 0;
  if (in_fit) {
    local.should_stop = st.should_stop;
    local.time_up = opts.max_time() && fit_elapsed() >= *opts.max_time();
    local.val_due = !fast_dev && opts.val_check_interval_s() &&
                    since_last_validation() >= *opts.val_check_interval_s();
  }
  const StopRequest agreed = strategy().agree_on_stop(local, lagged);
  // Sticky, as should_stop itself: between DdpStrategy's votes the result is empty.
  if (in_fit && agreed.should_stop) {
    st.should_stop = true;  // another rank's request is this one's too
    stop_agreed = true;
  }
  if (in_fit && agreed.time_up) time_up = true;
  if (in_fit && agreed.val_due) val_time_due = true;  // until the validation runs
  if (agreed.signal == 0) return;
  auto where = detail::c_stream<std::ostringstream>();
  if (in_fit) {
    where << "at epoch " << st.epoch << " after " << st.batches_done << " of "
          << st.num_training_batches << " training batches (global step " << st.global_step << ")";
  } else {
    where << "during " << to_string(st.stage);
  }
  std::string next = ".";
  if (in_fit) {
    const bool saves = std::any_of(callbacks.begin(), callbacks.end(), [](const auto& c) {
      return dynamic_cast<const OnExceptionCheckpoint*>(c.get()) != nullptr;
    });
    next = saves ? "; OnExceptionCheckpoint saves this state, and ckpt_path= its file resumes it."
                 : "; to save this state at such a stop, add the OnExceptionCheckpoint callback "
                   "(--trainer.callbacks+=OnExceptionCheckpoint), or resume from the last "
                   "checkpoint.";
  }
  throw Interrupted(
      str_cat("[Trainer] stopped by ", signal_text(agreed.signal), " ", where.str(), next),
      agreed.signal);
}

double Run::since_last_validation() const {
  return std::chrono::duration<double>(Clock::now() - last_val_end).count();
}

void Run::check_stop_in_evaluation(bool pass_done) {
  if (pass_done == (world_size() > 1)) check_stop(/*lagged=*/false, /*in_fit=*/false);
}

std::string Run::config_fingerprint() const {
  // What every rank must agree on: the loop's settings and the model's parameters. Paths
  // (default_root_dir) and display settings may differ between nodes.
  auto s = detail::c_stream<std::ostringstream>();
  s << "max_epochs=" << opts.max_epochs().value_or(-2) << ";max_steps=" << opts.max_steps()
    << ";min_epochs=" << resolved_min_epochs() << ";min_steps=" << opts.min_steps().value_or(0)
    << ";limit_train=" << opts.limit_train_batches() << ";overfit=" << opts.overfit_batches()
    << ";limit_val=" << opts.limit_val_batches() << ";val_check=" << opts.val_check_interval()
    << ";every_n_epoch=" << opts.check_val_every_n_epoch().value_or(0)
    << ";val_check_s=" << opts.val_check_interval_s().value_or(-1)
    << ";accumulate=" << opts.accumulate_grad_batches()
    << ";clip=" << (opts.gradient_clip_val() ? *opts.gradient_clip_val() : -1.0)
    << ";clip_algo=" << static_cast<int>(opts.gradient_clip_algorithm())
    << ";devices=" << plan.devices << ";num_nodes=" << plan.num_nodes
    << ";strategy=" << strategy().name() << ";precision=" << strategy().precision().name()
    << ";sampler=" << opts.use_distributed_sampler() << ";sync_bn=" << opts.sync_batchnorm()
    << ";seed=" << (opts.seed() ? std::to_string(*opts.seed()) : "none")
    << ";stage=" << to_string(st.stage);
  for (const auto& p : module->named_parameters(true)) {
    s << ";" << p.key() << p.value().sizes() << c10::toString(p.value().scalar_type());
  }
  return std::to_string(std::hash<std::string>()(s.str()));
}

std::string Run::broadcast_string(const std::string& text, int64_t src) const {
  return detail::broadcast_string(strategy(), text, src);
}

namespace {

// Whether the config's scheduler steps by a metric (Lightning's reduce_on_plateau, decided by the
// scheduler's type: a monitor named for any other scheduler is ignored, as there).
bool on_plateau(const OptimizerConfig& c) {
  return dynamic_cast<const ReduceLROnPlateau*>(c.scheduler().get()) != nullptr;
}

void check_distinct_parameters(const Module& module,
                               const std::vector<OptimizerConfig>& optimizers) {
  // libtorch's parameters() lists a layer that two modules share (tied weights) once per name,
  // unlike PyTorch's, and torch::optim steps a tensor as often as it is listed: refused, as
  // PyTorch refuses a parameter in two groups and deprecates one listed twice in a group.
  for (size_t i = 0; i < optimizers.size(); ++i) {
    std::unordered_set<const c10::TensorImpl*> seen;
    for (const auto& group : optimizers[i].optimizer()->param_groups()) {
      for (const auto& p : group.params()) {
        if (seen.insert(p.unsafeGetTensorImpl()).second) continue;
        std::string which;  // every name the module has for it
        for (const auto& named : module.named_parameters(true)) {
          if (!named.value().is_same(p)) continue;
          which += (which.empty() ? "the parameter " : " = ") + named.key();
        }
        VOLT_CHECK(false, ConfigError, "[Module] configure_optimizers(): optimizer ", i, " lists ",
                   which.empty() ? "a tensor" : which,
                   " more than once and would step it once per listing (libtorch's "
                   "parameters() lists a layer shared by two modules once per name); give "
                   "each tensor once: volt::distinct_parameters(*this) (volt/nn/parameters.h).");
      }
    }
  }
}

}  // namespace

void Run::setup_optimizers() {
  {
    Part part(*this, "configure_optimizers");
    optimizers = module->make_optimizers();
  }
  for (auto& c : optimizers) {
    VOLT_CHECK(c.optimizer() != nullptr, ConfigError,
               "[Module] configure_optimizers() returned a null optimizer.");
    VOLT_CHECK(c.frequency() >= 1, ConfigError, "[Module] scheduler frequency=", c.frequency(),
               " must be >= 1.");
    // Lightning refuses it in configure_optimizers too, before anything trains.
    VOLT_CHECK(!on_plateau(c) || !c.monitor().empty(), ConfigError,
               "[Module] configure_optimizers() returned a ReduceLROnPlateau scheduler without a "
               "monitor; set OptimizerConfig::monitor to the logged metric it watches (e.g. "
               ".monitor(\"val_loss\")).");
  }
  check_distinct_parameters(*module, optimizers);
  VOLT_CHECK(module->automatic_optimization() || !opts.gradient_clip_val(), ConfigError,
             "[Trainer] gradient_clip_val is applied by automatic optimization only; with "
             "manual optimization call clip_gradients(optimizer, value) in training_step, "
             "between manual_backward and step().");
  // The strategy may add an optimizer the module left to it (a DeepSpeed JSON's).
  strategy().setup_optimizers(*module, optimizers);
  VOLT_CHECK(!optimizers.empty(), ConfigError,
             "[Module] configure_optimizers() returned no optimizer; return at least one.");
  VOLT_CHECK(!module->automatic_optimization() || optimizers.size() == 1, ConfigError,
             "[Module] automatic optimization supports one optimizer but configure_optimizers "
             "returned ",
             optimizers.size(),
             "; call set_automatic_optimization(false) and step them in training_step.");
  optimizers_ready = true;
}

DataLoader Run::shard(const DataLoader& loader, bool predict) const {
  const DataShard s = strategy().data_shard();
  if (!opts.use_distributed_sampler() || s.world_size == 1) return loader;
  return loader.sharded_where_unsharded(s.rank, s.world_size, /*even=*/!predict || s.lockstep);
}

std::vector<int64_t> Run::optimizer_step_counts() const {
  if (module == nullptr || module->automatic_optimization()) return {st.global_step};
  std::vector<int64_t> counts = manual_steps;
  counts.resize(optimizers.size(), 0);
  return counts;
}

void Run::step_monitored_schedulers(const std::vector<int64_t>& since) {
  const std::vector<int64_t> now = optimizer_step_counts();
  for (size_t i = 0; i < optimizers.size() && i < now.size(); ++i) {
    OptimizerConfig& c = optimizers[i];
    if (!c.scheduler() || c.interval() != Interval::kStep || !on_plateau(c)) continue;
    for (int64_t n = (i < since.size() ? since[i] : now[i]) + 1; n <= now[i]; ++n) {
      step_scheduler_if_due(c, n);
    }
  }
}

void Run::step_schedulers_of(size_t index) {
  if (manual_steps.size() <= index) manual_steps.resize(optimizers.size(), 0);
  const int64_t count = ++manual_steps[index];
  OptimizerConfig& c = optimizers[index];
  if (c.scheduler() && c.interval() == Interval::kStep && !on_plateau(c)) {
    step_scheduler_if_due(c, count);
  }
}

void Run::step_schedulers(Interval interval, bool monitored) {
  const std::vector<int64_t> steps = optimizer_step_counts();
  for (size_t i = 0; i < optimizers.size(); ++i) {
    OptimizerConfig& c = optimizers[i];
    if (!c.scheduler() || c.interval() != interval) continue;
    if (on_plateau(c) != monitored) continue;
    step_scheduler_if_due(c, interval == Interval::kStep ? steps.at(i) : st.epoch + 1);
  }
}

void Run::step_scheduler_if_due(OptimizerConfig& c, int64_t count) {
  if (count % c.frequency() != 0) return;
  c10::optional<double> metric;
  if (on_plateau(c)) {
    const auto& m = callback_metrics();
    auto it = m.find(c.monitor());
    if (it == m.end()) {
      const std::string what = detail::str_cat(
          "[Trainer] the ReduceLROnPlateau scheduler monitors \"", c.monitor(),
          "\", which was not logged (available: [", detail::joined_keys(m), "]",
          "); log it, fix OptimizerConfig::monitor, or set OptimizerConfig::strict(false) to "
          "skip such steps");
      VOLT_CHECK(!c.strict(), ConfigError, what, ".");
      log_warning("Trainer", what + "; this step of the scheduler is skipped.");
      return;
    }
    metric = it->second;
  }
  module_hook("lr_scheduler_step", [&](Module& m) { m.lr_scheduler_step(*c.scheduler(), metric); });
}

// --------------------------------------------------------------------------------- metrics

void Run::reset_metrics() {
  train_metrics.clear();
  epoch_metrics.clear();
  prog_bar_epoch.clear();
  logged.clear();
  plain_from_step.clear();
  eval_batches_seen.clear();
  drop_logs = false;  // a start hook that threw left it set
  cache_dirty = true;
}

void Run::end_epoch_step_values() {
  if (!train_metrics.has_step_values()) return;
  refresh_cache();
  epoch_metrics = cb_cache;  // the step values (plain names too) stay readable
  for (auto& kv : train_metrics.step_values(false, true)) prog_bar_epoch[kv.first] = kv.second;
  train_metrics.clear_step();
  plain_from_step.clear();
  cache_dirty = true;
}

void Run::send_to_loggers(const Metrics& m, c10::optional<int64_t> at_step) {
  if (m.empty() || !is_global_zero()) return;
  for (auto& kv : m) logged[kv.first] = kv.second;
  Metrics row = m;
  int64_t step = at_step.value_or(log_step());
  const auto given = row.find("step");
  if (given != row.end()) {
    const double v = given->second;
    if (std::isfinite(v) && v >= 0 && v < 9.0e18) {
      step = static_cast<int64_t>(v);
    } else {
      warn_once("logged-step-not-a-step", "Trainer",
                "a logged \"step\" value (" + std::to_string(v) +
                    ") is no step number; its rows stay at the global step. Log a count >= 0.");
    }
    row.erase(given);
  } else if (!at_step) {
    row.emplace("epoch", static_cast<double>(st.epoch));  // a logged "epoch" value stays
  }
  for (auto& l : loggers()) l->log_metrics(row, step);
  // As Lightning's logger connector, which saves the loggers after every log call: a row is on
  // disk once logged (tail -f metrics.csv, a live TensorBoard; a run killed for good keeps it).
  save_loggers();
}

void Run::log_hparams() {
  if (module == nullptr) return;
  // The module's and the DataModule's, as Lightning's _log_hyperparams merges them; a key both
  // hold with different values is an error there too.
  // Nothing to merge without loggers (Lightning's _log_hyperparams returns first). has_loggers,
  // not loggers(): ranks above 0 hold none, and the error must be every rank's.
  if (!has_loggers()) return;
  std::map<std::string, std::string> hparams = module->hparams();
  // The class the CLI recorded is for checkpoints, not loggers (Lightning's loggers drop it).
  hparams.erase("_class_path");
  if (data != nullptr) {
    std::string differ;
    for (const auto& [key, value] : data->hparams()) {
      const auto it = hparams.find(key);
      if (it != hparams.end() && it->second != value) {
        differ +=
            (differ.empty() ? "\"" : ", \"") + key + "\" (" + it->second + " / " + value + ")";
      }
      hparams[key] = value;
    }
    VOLT_CHECK(differ.empty(), ConfigError,
               "[Trainer] the module's and the DataModule's "
               "hyper-parameters both hold ",
               differ,
               " with different values (module / DataModule); rename one of them so that "
               "hparams.yaml can hold both.");
  }
  for (const auto& l : loggers()) l->log_hyperparams(hparams);
}

void Run::save_loggers() {
  // A failure is reported, not the caller's (a checkpoint, a step).
  for (const auto& l : loggers()) {
    try {
      l->save();
    } catch (const std::exception& failed) {
      // Once per logger: the loggers are saved after every row, so a full disk would say it at
      // every step (the CSV logger fails the run itself once its buffer is full).
      warn_once("save_loggers." + l->name(), "Trainer",
                l->name() + " could not write its buffered rows: " + failed.what());
    }
  }
}

Metrics Run::flush_epoch(MetricStore& store) {
  Metrics pb, lg;
  Metrics reduced = store.reduce_epoch(
      &pb, &lg, [this](const at::Tensor& t, Reduce op) { return strategy().reduce(t, op); });
  for (auto& kv : reduced) {
    epoch_metrics[kv.first] = kv.second;
    // "x_epoch" also answers to "x" so monitors can name the plain key.
    const std::string& k = kv.first;
    if (k.size() > 6 && k.compare(k.size() - 6, 6, "_epoch") == 0) {
      epoch_metrics[k.substr(0, k.size() - 6)] = kv.second;
      plain_from_step.erase(k.substr(0, k.size() - 6));  // the epoch's mean is newer
    }
  }
  for (auto& kv : pb) prog_bar_epoch[kv.first] = kv.second;
  send_to_loggers(lg);
  cache_dirty = true;
  return lg;
}

std::string Run::failure_context(Stage stage, const std::exception& e) const {
  auto out = detail::c_stream<std::ostringstream>();
  out << to_string(stage) << " failed in ";
  if (where_callback != nullptr) out << where_callback->state_key() << ".";
  out << where;
  if (std::strcmp(where, "set-up") != 0) {
    if (eval_pass != nullptr) {
      if (eval_batch >= 0) {
        out << " at " << eval_pass << " batch " << eval_batch;
        if (st.num_dataloaders > 1) out << " of dataloader " << st.dataloader_idx;
      } else {
        out << " in the " << eval_pass << " pass";
      }
      if (stage == Stage::kFit) {
        out << " (epoch " << st.epoch << ", global step " << st.global_step << ")";
      }
    } else if (stage == Stage::kFit) {
      out << " at epoch " << st.epoch;
      if (train_batch >= 0) out << ", batch " << train_batch;
      out << " (global step " << st.global_step << ")";
    }
  }
  out << ": " << exception_summary(e);
  // libtorch's "Inference tensors cannot be saved for backward" and "Inplace update to inference
  // tensor outside InferenceMode" name neither where the tensor came from nor the switch.
  const std::string what = e.what();
  if (opts.inference_mode() && (what.find("Inference tensor") != std::string::npos ||
                                what.find("inference tensor") != std::string::npos)) {
    out << "; a tensor made in validation, test or predict, which run under c10::InferenceMode "
           "(TrainerOptions::inference_mode, default true), reached autograd or an in-place op "
           "after it: clone() it where it is made, or set inference_mode(false) "
           "(--trainer.inference_mode=false)";
  }
  return out.str();
}

}  // namespace detail
}  // namespace volt
