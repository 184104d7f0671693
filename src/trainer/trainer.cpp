#include "volt/trainer/trainer.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <set>

#include "detail/metric_store.h"
#include "volt/callbacks/callback.h"
#include "volt/callbacks/model_checkpoint.h"
#include "volt/callbacks/progress_bar.h"
#include "volt/core/check.h"
#include "volt/profiler/profiler.h"
#include "volt/io/state.h"
#include "volt/loggers/csv.h"
#include "volt/loggers/logger.h"
#include "volt/strategies/strategy.h"
#include "volt/trainer/plan.h"

namespace volt {
namespace {

constexpr int64_t kCheckpointFormat = 1;
using Clock = std::chrono::steady_clock;

// A handle to the default CPU generator (Generator is a refcounted handle; the accessor
// returns a const reference).
at::Generator cpu_generator() { return at::detail::getDefaultCPUGenerator(); }

// Which part of the loop is running: decides Module::log's on_step/on_epoch defaults.
enum class LogScope { kNone, kTrainStep, kTrainEpochEnd, kEval };

}  // namespace

struct Trainer::Impl : public RunContext {
  TrainerOptions opts;
  RunPlan plan;
  std::vector<std::shared_ptr<Callback>> callbacks;
  std::vector<std::shared_ptr<Logger>> loggers_;
  LoopState st;
  Module* module = nullptr;
  std::vector<OptimizerConfig> optimizers;
  bool optimizers_ready = false;

  detail::MetricStore train_metrics, eval_metrics;
  detail::MetricStore* active_metrics = &train_metrics;
  LogScope scope = LogScope::kNone;
  int64_t current_batch_size = 1;
  Metrics epoch_metrics;  // reduced epoch values (host) visible to callbacks
  Metrics logged;         // last values sent to loggers
  Metrics prog_bar_epoch;
  mutable Metrics cb_cache, pb_cache;
  mutable bool cache_dirty = true;
  Clock::time_point fit_start;
  bool fast_dev = false;
  Profiler* prof = nullptr;  // opts.profiler(), or null

  // ---------------------------------------------------------------- RunContext
  const LoopState& state() const override { return st; }

  const Metrics& callback_metrics() const override {
    refresh_cache();
    return cb_cache;
  }
  const Metrics& progress_bar_metrics() const override {
    refresh_cache();
    return pb_cache;
  }

  void refresh_cache() const {
    if (!cache_dirty) return;
    cb_cache = epoch_metrics;
    pb_cache = prog_bar_epoch;
    for (auto& kv : train_metrics.step_values(false, false)) cb_cache[kv.first] = kv.second;
    for (auto& kv : train_metrics.step_values(false, true)) pb_cache[kv.first] = kv.second;
    cache_dirty = false;
  }

  void log(const std::string& name, const at::Tensor& value, const LogOptions& o) override {
    VOLT_CHECK(scope != LogScope::kNone, ConfigError, "[Module] log(\"", name,
               "\") called outside a step or epoch-end hook; log from training_step, "
               "validation_step, test_step or an on_*_epoch_end hook.");
    VOLT_CHECK(value.numel() == 1, ValueError, "[Module] log(\"", name, "\") got a tensor of shape ",
               value.sizes(), "; log a scalar (one element), e.g. loss or acc.mean().");
    if (st.stage == Stage::kSanityCheck) return;  // sanity-check values are discarded
    const bool in_train_step = scope == LogScope::kTrainStep;
    const bool on_step = o.on_step().value_or(in_train_step);
    const bool on_epoch = o.on_epoch().value_or(!in_train_step);
    VOLT_CHECK(on_step || on_epoch, ConfigError, "[Module] log(\"", name,
               "\") with on_step=false and on_epoch=false logs nothing; enable one of them.");
    VOLT_CHECK(!on_step || in_train_step, ConfigError, "[Module] log(\"", name,
               "\", on_step=true) is only possible inside training_step; use on_epoch.");
    at::Tensor v = value.detach().reshape({});
    const bool both = on_step && on_epoch;
    if (on_step) active_metrics->add_step(both ? name + "_step" : name, v, o.prog_bar(), o.logger());
    if (on_epoch) {
      active_metrics->add_epoch(both ? name + "_epoch" : name, v, current_batch_size, o.reduce(),
                                o.prog_bar(), o.logger());
    }
    cache_dirty = true;
  }

  void save_checkpoint(const std::string& path) override;
  void request_stop() override { st.should_stop = true; }
  std::string log_dir() const override {
    return loggers_.empty() ? opts.default_root_dir() : loggers_.front()->log_dir();
  }
  bool is_global_zero() const override { return plan.strategy->is_global_zero(); }
  int64_t max_epochs() const override { return resolved_max_epochs(); }
  int64_t max_steps() const override { return opts.max_steps(); }
  int64_t log_every_n_steps() const override { return opts.log_every_n_steps(); }
  std::vector<OptimizerConfig>& optimizer_configs() override { return optimizers; }
  const std::vector<std::shared_ptr<Logger>>& loggers() const override { return loggers_; }

  void manual_backward(const at::Tensor& loss) override {
    VOLT_CHECK(module && !module->automatic_optimization(), ConfigError,
               "[Module] manual_backward() is for manual optimization; call "
               "set_automatic_optimization(false) in your module's constructor, or just "
               "return the loss from training_step.");
    hook("on_before_backward", [&](Module& m) { m.on_before_backward(loss); },
         [&](Callback& c) { c.on_before_backward(*this, *module, loss); });
    plan.strategy->backward(loss);
    hook("on_after_backward", [&](Module& m) { m.on_after_backward(); },
         [&](Callback& c) { c.on_after_backward(*this, *module); });
  }

  void manual_step(size_t index) override {
    VOLT_CHECK(index < optimizers.size(), ConfigError, "[Module] optimizer index ", index,
               " out of range: configure_optimizers returned ", optimizers.size(), ".");
    auto& opt = *optimizers[index].optimizer();
    hook("on_before_optimizer_step", [&](Module& m) { m.on_before_optimizer_step(opt); },
         [&](Callback& c) { c.on_before_optimizer_step(*this, *module, opt); });
    plan.strategy->optimizer_step(opt, c10::nullopt, opts.gradient_clip_algorithm());
    ++st.global_step;
    step_schedulers(Interval::kStep);
  }

  // ---------------------------------------------------------------- dispatch
  // Every hook goes through here: one place to time them (profiler, ROADMAP) and to keep the
  // order fixed: the module's hook first, then callbacks in registration order.
  template <typename MF, typename CF>
  void hook(const char* name, MF&& module_fn, CF&& callback_fn) {
    if (prof == nullptr) {
      module_fn(*module);
      for (auto& c : callbacks) callback_fn(*c);
      return;
    }
    timed(std::string("[Module]") + name, [&] { module_fn(*module); });
    callback_hook(name, std::forward<CF>(callback_fn));
  }
  template <typename CF>
  void callback_hook(const char* name, CF&& callback_fn) {
    if (prof == nullptr) {
      for (auto& c : callbacks) callback_fn(*c);
      return;
    }
    for (auto& c : callbacks) {
      timed("[Callback]" + c->state_key() + "." + name, [&] { callback_fn(*c); });
    }
  }
  /// Runs f as profiled action `action` (stop runs on exceptions too).
  template <typename F>
  void timed(const std::string& action, F&& f) {
    struct Stop {
      Profiler* p;
      const std::string& a;
      ~Stop() { p->stop(a); }
    };
    prof->start(action);
    Stop stop{prof, action};
    f();
  }
  /// The next batch of a stream, its fetch time profiled as `action`.
  bool next_batch(BatchStream& stream, Batch& batch, const char* action) {
    ProfileScope p(prof, action);
    return stream.next(batch);
  }

  int64_t resolved_max_epochs() const {
    if (fast_dev) return 1;
    if (opts.max_epochs() >= 0) return opts.max_epochs();
    return opts.max_steps() >= 0 ? -1 : 1000;  // Lightning's default when nothing is set
  }

  // ---------------------------------------------------------------- setup
  void setup_run(Module& m, Stage stage) {
    module = &m;
    st.stage = stage;
    st.status = RunStatus::kRunning;
    m.attach(this);
    plan.strategy->setup_environment();
    plan.strategy->setup_module(m);
  }

  void setup_optimizers() {
    optimizers = module->configure_optimizers();
    VOLT_CHECK(!optimizers.empty(), ConfigError,
               "[Module] configure_optimizers() returned no optimizer; return at least one.");
    for (auto& c : optimizers) {
      VOLT_CHECK(c.optimizer() != nullptr, ConfigError,
                 "[Module] configure_optimizers() returned a null optimizer.");
      VOLT_CHECK(c.frequency() >= 1, ConfigError, "[Module] scheduler frequency=", c.frequency(),
                 " must be >= 1.");
    }
    VOLT_CHECK(!module->automatic_optimization() || optimizers.size() == 1, ConfigError,
               "[Module] automatic optimization supports one optimizer but configure_optimizers "
               "returned ", optimizers.size(),
               "; call set_automatic_optimization(false) and step them in training_step.");
    VOLT_CHECK(module->automatic_optimization() || !opts.gradient_clip_val(), ConfigError,
               "[Trainer] gradient_clip_val is applied by automatic optimization only; with "
               "manual optimization clip in training_step instead.");
    optimizers_ready = true;
  }

  void step_schedulers(Interval interval) {
    for (auto& c : optimizers) {
      if (!c.scheduler() || c.interval() != interval) continue;
      const int64_t count = interval == Interval::kStep ? st.global_step : st.epoch + 1;
      if (count % c.frequency() != 0) continue;
      if (!c.monitor().empty()) {
        const auto& m = callback_metrics();
        auto it = m.find(c.monitor());
        VOLT_CHECK(it != m.end(), ConfigError, "[Trainer] scheduler monitors \"", c.monitor(),
                   "\" which was not logged; log it or fix OptimizerConfig::monitor.");
        c.scheduler()->step(it->second);
      } else {
        c.scheduler()->step();
      }
    }
  }

  // ---------------------------------------------------------------- logging
  int64_t log_step() const { return std::max<int64_t>(st.global_step - 1, 0); }

  void send_to_loggers(const Metrics& m) {
    if (m.empty() || !is_global_zero()) return;
    for (auto& kv : m) logged[kv.first] = kv.second;
    for (auto& l : loggers_) l->log_metrics(m, log_step());
  }

  /// Reduces a stage's epoch metrics, makes them visible to monitors and the progress bar and
  /// sends them to the loggers; returns them.
  Metrics flush_epoch(detail::MetricStore& store, bool add_epoch_number) {
    Metrics pb, lg;
    Metrics reduced = store.reduce_epoch(&pb, &lg);
    for (auto& kv : reduced) {
      epoch_metrics[kv.first] = kv.second;
      // "x_epoch" also answers to "x" so monitors can name the plain key.
      const std::string& k = kv.first;
      if (k.size() > 6 && k.compare(k.size() - 6, 6, "_epoch") == 0) {
        epoch_metrics[k.substr(0, k.size() - 6)] = kv.second;
      }
    }
    for (auto& kv : pb) prog_bar_epoch[kv.first] = kv.second;
    if (add_epoch_number && !lg.empty()) lg["epoch"] = static_cast<double>(st.epoch);
    send_to_loggers(lg);
    cache_dirty = true;
    return reduced;
  }

  // ---------------------------------------------------------------- checkpoints
  void write_checkpoint(torch::serialize::OutputArchive& root);
  void restore_checkpoint(const std::string& path, bool full);

  // ---------------------------------------------------------------- loops
  void fit(DataLoader& train, c10::optional<DataLoader>& val, const std::string& ckpt);
  void train_epoch(DataLoader& train, c10::optional<DataLoader>& val);
  bool train_batch(const Batch& batch, int64_t idx, int64_t n);
  Metrics evaluate(Stage stage, DataLoader& loader, int64_t limit);
  bool is_val_boundary(int64_t idx, int64_t n, const c10::optional<DataLoader>& val) const;
  bool stop_now() const;
  int64_t val_limit(const DataLoader& val) const {
    const int64_t n = opts.limit_val_batches().resolve(val.num_batches());
    return fast_dev ? std::min(n, opts.fast_dev_run()) : n;
  }
  Metrics run_eval(Module& module, Stage stage, DataLoader& loader, const std::string& ckpt);

  template <typename F>
  void guarded(Module& m, Stage stage, F&& body);
};

// ================================================================== checkpoints

void Trainer::Impl::write_checkpoint(torch::serialize::OutputArchive& root) {
  VOLT_CHECK(module != nullptr && optimizers_ready, ConfigError,
             "[Trainer] save_checkpoint() needs a module set up by fit(); call it during or "
             "after fit().");
  auto& strategy = *plan.strategy;
  root.write("volt_format", c10::IValue(kCheckpointFormat));
  torch::serialize::OutputArchive model_ar;
  strategy.save_model_state(*module, model_ar);
  root.write("state_dict", model_ar);

  torch::serialize::OutputArchive opts_ar;
  opts_ar.write("count", c10::IValue(static_cast<int64_t>(optimizers.size())));
  for (size_t i = 0; i < optimizers.size(); ++i) {
    torch::serialize::OutputArchive one;
    strategy.save_optimizer_state(*optimizers[i].optimizer(), *module, one);
    opts_ar.write("optimizer_" + std::to_string(i), one);
    if (optimizers[i].scheduler()) {
      torch::serialize::OutputArchive sched;
      optimizers[i].scheduler()->save(sched);
      opts_ar.write("scheduler_" + std::to_string(i), sched);
    }
  }
  root.write("optimizers", opts_ar);

  torch::serialize::OutputArchive loop;
  loop.write("epoch", c10::IValue(st.epoch));
  loop.write("global_step", c10::IValue(st.global_step));
  loop.write("batches_done", c10::IValue(st.batches_done));
  loop.write("total_batches_done", c10::IValue(st.total_batches_done));
  loop.write("accumulated", c10::IValue(st.accumulated));
  loop.write("epoch_finished", c10::IValue(st.epoch_finished));
  loop.write("val_pending", c10::IValue(st.val_pending));
  root.write("loop", loop);

  torch::serialize::OutputArchive rng;
  rng.write("torch_cpu", at::detail::getDefaultCPUGenerator().get_state());
  root.write("rng", rng);

  // Mid-accumulation: the partial gradient sum is part of the exact state.
  torch::serialize::OutputArchive grads;
  if (st.accumulated > 0) {
    for (const auto& p : module->named_parameters(true)) {
      if (p.value().grad().defined()) grads.write(p.key(), p.value().grad());
    }
  }
  root.write("grads", grads);

  torch::serialize::OutputArchive metrics;
  train_metrics.save(metrics);
  root.write("train_epoch_metrics", metrics);

  torch::serialize::OutputArchive cbs;
  for (auto& c : callbacks) {
    torch::serialize::OutputArchive one;
    c->save_state(one);
    cbs.write(c->state_key(), one);
  }
  root.write("callbacks", cbs);

  torch::serialize::OutputArchive lgs;
  for (size_t i = 0; i < loggers_.size(); ++i) {
    torch::serialize::OutputArchive one;
    loggers_[i]->save_state(one);
    lgs.write(std::to_string(i) + "_" + loggers_[i]->name(), one);
  }
  root.write("loggers", lgs);

  torch::serialize::OutputArchive prec;
  strategy.precision().save_state(prec);
  root.write("precision", prec);

  torch::serialize::OutputArchive user;
  module->on_save_checkpoint(user);
  root.write("module", user);
}

void Trainer::Impl::save_checkpoint(const std::string& path) {
  torch::serialize::OutputArchive root;
  write_checkpoint(root);
  plan.strategy->save_checkpoint(root, path);
}

void Trainer::Impl::restore_checkpoint(const std::string& path, bool full) {
  auto& strategy = *plan.strategy;
  torch::serialize::InputArchive root = strategy.load_checkpoint(path);
  c10::IValue fmt;
  VOLT_CHECK(root.try_read("volt_format", fmt) && fmt.isInt(), CheckpointError, "[Checkpoint] '",
             path, "' has no volt_format entry; it was not written by volt's Trainer.");
  VOLT_CHECK(fmt.toInt() == kCheckpointFormat, CheckpointError, "[Checkpoint] '", path,
             "' has trainer format ", fmt.toInt(), "; this volt reads format ", kCheckpointFormat,
             ".");
  torch::serialize::InputArchive model_ar;
  root.read("state_dict", model_ar);
  try {
    strategy.load_model_state(*module, model_ar);
  } catch (const CheckpointError& e) {
    throw CheckpointError(std::string(e.what()) + " (checkpoint: '" + path + "')");
  }
  if (!full) return;

  torch::serialize::InputArchive opts_ar;
  root.read("optimizers", opts_ar);
  c10::IValue count;
  opts_ar.read("count", count);
  VOLT_CHECK(count.toInt() == static_cast<int64_t>(optimizers.size()), CheckpointError,
             "[Checkpoint] '", path, "' holds ", count.toInt(),
             " optimizers but configure_optimizers returned ", optimizers.size(),
             "; resume with the same module setup.");
  for (size_t i = 0; i < optimizers.size(); ++i) {
    torch::serialize::InputArchive one;
    opts_ar.read("optimizer_" + std::to_string(i), one);
    strategy.load_optimizer_state(*optimizers[i].optimizer(), *module, one);
    torch::serialize::InputArchive sched;
    const bool has = opts_ar.try_read("scheduler_" + std::to_string(i), sched);
    VOLT_CHECK(has == static_cast<bool>(optimizers[i].scheduler()), CheckpointError,
               "[Checkpoint] '", path, "': optimizer ", i, (has ? " had" : " had no"),
               " LR scheduler when saved but now ", (has ? "has none" : "has one"),
               "; resume with the same configure_optimizers.");
    if (has) optimizers[i].scheduler()->load(sched);
  }

  torch::serialize::InputArchive loop;
  root.read("loop", loop);
  auto read_int = [&](const char* k) {
    c10::IValue v;
    loop.read(k, v);
    return v.toInt();
  };
  auto read_bool = [&](const char* k) {
    c10::IValue v;
    loop.read(k, v);
    return v.toBool();
  };
  st.epoch = read_int("epoch");
  st.global_step = read_int("global_step");
  st.batches_done = read_int("batches_done");
  st.total_batches_done = read_int("total_batches_done");
  st.accumulated = read_int("accumulated");
  st.epoch_finished = read_bool("epoch_finished");
  st.val_pending = read_bool("val_pending");

  torch::serialize::InputArchive rng;
  root.read("rng", rng);
  at::Tensor gen_state;
  rng.read("torch_cpu", gen_state);
  cpu_generator().set_state(gen_state);

  torch::serialize::InputArchive grads;
  root.read("grads", grads);
  if (st.accumulated > 0) {
    for (auto& p : module->named_parameters(true)) {
      at::Tensor g;
      if (grads.try_read(p.key(), g)) p.value().mutable_grad() = g.to(p.value().device());
    }
  }

  torch::serialize::InputArchive metrics;
  root.read("train_epoch_metrics", metrics);
  train_metrics.load(metrics);

  torch::serialize::InputArchive cbs;
  root.read("callbacks", cbs);
  for (auto& c : callbacks) {
    torch::serialize::InputArchive one;
    if (cbs.try_read(c->state_key(), one)) c->load_state(one);
  }
  torch::serialize::InputArchive lgs;
  root.read("loggers", lgs);
  for (size_t i = 0; i < loggers_.size(); ++i) {
    torch::serialize::InputArchive one;
    if (lgs.try_read(std::to_string(i) + "_" + loggers_[i]->name(), one)) {
      loggers_[i]->load_state(one, st.global_step);
    }
  }
  torch::serialize::InputArchive prec;
  root.read("precision", prec);
  strategy.precision().load_state(prec);
  torch::serialize::InputArchive user;
  root.read("module", user);
  module->on_load_checkpoint(user);
}

// ================================================================== loops

template <typename F>
void Trainer::Impl::guarded(Module& m, Stage stage, F&& body) {
  try {
    setup_run(m, stage);
    body();
    st.status = RunStatus::kFinished;
  } catch (const std::exception& e) {
    st.status = RunStatus::kFailed;
    // The run ends cleanly: callbacks and loggers are told, files are flushed, then the error
    // propagates. Checkpoints are never touched here: the last one on disk stays valid.
    for (auto& c : callbacks) {
      try {
        c->on_exception(*this, m, e);
      } catch (...) {
      }
    }
    for (auto& l : loggers_) {
      try {
        l->finalize(RunStatus::kFailed);
      } catch (...) {
      }
    }
    scope = LogScope::kNone;
    m.attach(nullptr);
    try {
      plan.strategy->teardown();
    } catch (...) {
    }
    if (prof != nullptr) prof->describe(to_string(stage), log_dir());
    throw;
  }
  if (prof != nullptr) prof->describe(to_string(stage), log_dir());
  for (auto& l : loggers_) l->finalize(RunStatus::kFinished);
  scope = LogScope::kNone;
  m.attach(nullptr);
  plan.strategy->teardown();
}

bool Trainer::Impl::is_val_boundary(int64_t idx, int64_t n,
                                    const c10::optional<DataLoader>& val) const {
  if (!val || val_limit(*val) == 0) return false;
  if ((st.epoch + 1) % opts.check_val_every_n_epoch() != 0) return false;
  const Limit& vci = opts.val_check_interval();
  int64_t every = vci.is_fraction()
                      ? std::max<int64_t>(1, static_cast<int64_t>(std::floor(n * vci.fraction())))
                      : vci.count();
  return (idx + 1) % every == 0 || (vci.is_fraction() && vci.fraction() == 1.0 && idx + 1 == n);
}

bool Trainer::Impl::stop_now() const {
  if (opts.max_steps() >= 0 && st.global_step >= opts.max_steps()) return true;
  if (opts.max_time()) {
    const double elapsed = std::chrono::duration<double>(Clock::now() - fit_start).count();
    if (elapsed >= *opts.max_time()) return true;
  }
  return st.should_stop && st.epoch + 1 >= opts.min_epochs();
}

bool Trainer::Impl::train_batch(const Batch& batch, int64_t idx, int64_t n) {
  Module& m = *module;
  scope = LogScope::kTrainStep;
  current_batch_size = batch.size();
  at::Tensor loss;
  {
    auto ctx = plan.strategy->precision().forward_context();
    ProfileScope p(prof, "training_step");
    loss = m.training_step(batch, idx);
  }
  if (!m.automatic_optimization()) return false;
  const int64_t accum = opts.accumulate_grad_batches();
  if (loss.defined()) {
    VOLT_CHECK(loss.numel() == 1, ValueError, "[Trainer] training_step returned a tensor of shape ",
               loss.sizes(), " at step ", st.global_step, "; return a scalar loss.");
    VOLT_CHECK(loss.requires_grad(), ValueError, "[Trainer] the loss returned by training_step at "
               "step ", st.global_step, " does not require grad; compute it from the module's "
               "parameters (and not under NoGradGuard).");
    if (opts.detect_nonfinite_loss()) {
      const double v = loss.item<double>();
      VOLT_CHECK(std::isfinite(v), ValueError, "[Trainer] the training loss is ", v,
                 " at global step ", st.global_step, " (epoch ", st.epoch, ", batch ", idx,
                 "); lower the learning rate, enable gradient clipping, check the data, or set "
                 "detect_nonfinite_loss(false) to continue anyway.");
    }
    at::Tensor scaled = accum > 1 ? loss / static_cast<double>(accum) : loss;
    hook("on_before_backward", [&](Module& mm) { mm.on_before_backward(loss); },
         [&](Callback& c) { c.on_before_backward(*this, m, loss); });
    {
      ProfileScope p(prof, "backward");
      plan.strategy->backward(scaled);
    }
    hook("on_after_backward", [&](Module& mm) { mm.on_after_backward(); },
         [&](Callback& c) { c.on_after_backward(*this, m); });
    ++st.accumulated;
  }
  const bool step_now = st.accumulated > 0 && (st.accumulated >= accum || idx + 1 == n);
  if (!step_now) return false;
  auto& opt = *optimizers.front().optimizer();
  hook("on_before_optimizer_step", [&](Module& mm) { mm.on_before_optimizer_step(opt); },
       [&](Callback& c) { c.on_before_optimizer_step(*this, m, opt); });
  {
    ProfileScope p(prof, "optimizer_step");
    plan.strategy->optimizer_step(opt, opts.gradient_clip_val(), opts.gradient_clip_algorithm());
    zero_grad(opt);
  }
  st.accumulated = 0;
  ++st.global_step;
  step_schedulers(Interval::kStep);
  return true;
}

void Trainer::Impl::train_epoch(DataLoader& train, c10::optional<DataLoader>& val) {
  Module& m = *module;
  const int64_t n =
      fast_dev ? std::min(opts.fast_dev_run(), train.num_batches())
               : opts.limit_train_batches().resolve(train.num_batches());
  st.num_training_batches = n;
  m.train();
  hook("on_train_epoch_start", [&](Module& mm) { mm.on_train_epoch_start(); },
       [&](Callback& c) { c.on_train_epoch_start(*this, m); });
  if (st.val_pending) {  // resumed from a checkpoint written just before a due validation
    evaluate(Stage::kValidate, *val, val_limit(*val));
    st.val_pending = false;
    m.train();
  }
  if (st.batches_done < n) {
    BatchStream stream = train.stream(st.epoch, st.batches_done, n - st.batches_done);
    Batch raw;
    while (next_batch(stream, raw, "get_train_batch")) {
      const int64_t idx = st.batches_done;
      Batch batch = plan.strategy->batch_to_device(raw);
      scope = LogScope::kTrainStep;
      hook("on_train_batch_start", [&](Module& mm) { mm.on_train_batch_start(batch, idx); },
           [&](Callback& c) { c.on_train_batch_start(*this, m, batch, idx); });
      const bool stepped = train_batch(batch, idx, n);
      ++st.batches_done;
      ++st.total_batches_done;
      const bool validate_now = is_val_boundary(idx, n, val);
      st.val_pending = validate_now;
      cache_dirty = true;
      hook("on_train_batch_end", [&](Module& mm) { mm.on_train_batch_end(batch, idx); },
           [&](Callback& c) { c.on_train_batch_end(*this, m, batch, idx); });
      if (stepped && st.global_step % opts.log_every_n_steps() == 0) {
        send_to_loggers(train_metrics.step_values(true, false));
      }
      if (validate_now) {
        evaluate(Stage::kValidate, *val, val_limit(*val));
        st.val_pending = false;
        m.train();
      }
      if (stop_now()) break;
    }
  }
  scope = LogScope::kTrainEpochEnd;
  step_schedulers(Interval::kEpoch);
  st.epoch_finished = true;
  m.on_train_epoch_end();
  flush_epoch(train_metrics, true);
  callback_hook("on_train_epoch_end",
                [&](Callback& c) { c.on_train_epoch_end(*this, m); });
  for (auto& l : loggers_) l->save();
  scope = LogScope::kNone;
}

Metrics Trainer::Impl::evaluate(Stage stage, DataLoader& loader, int64_t limit) {
  Module& m = *module;
  const bool sanity = st.stage == Stage::kSanityCheck;
  const bool is_test = stage == Stage::kTest;
  torch::NoGradGuard no_grad;
  m.eval();
  detail::MetricStore* saved_store = active_metrics;
  const LogScope saved_scope = scope;
  const int64_t saved_bs = current_batch_size;
  active_metrics = &eval_metrics;
  eval_metrics.clear();
  if (!sanity) {
    if (is_test) {
      callback_hook("on_test_start", [&](Callback& c) { c.on_test_start(*this, m); });
      m.on_test_epoch_start();
    } else {
      hook("on_validation_start", [&](Module& mm) { mm.on_validation_start(); },
           [&](Callback& c) { c.on_validation_start(*this, m); });
      hook("on_validation_epoch_start", [&](Module& mm) { mm.on_validation_epoch_start(); },
           [&](Callback& c) { c.on_validation_epoch_start(*this, m); });
    }
  }
  scope = LogScope::kEval;
  st.num_eval_batches = limit;
  BatchStream stream = loader.stream(0, 0, limit);
  Batch raw;
  int64_t idx = 0;
  while (next_batch(stream, raw, is_test ? "get_test_batch" : "get_validation_batch")) {
    Batch batch = plan.strategy->batch_to_device(raw);
    current_batch_size = batch.size();
    {
      auto ctx = plan.strategy->precision().forward_context();
      ProfileScope p(prof, is_test ? "test_step" : "validation_step");
      if (is_test) {
        m.test_step(batch, idx);
      } else {
        m.validation_step(batch, idx);
      }
    }
    if (!sanity) {
      if (is_test) {
        callback_hook("on_test_batch_end",
                      [&](Callback& c) { c.on_test_batch_end(*this, m, batch, idx); });
      } else {
        callback_hook("on_validation_batch_end",
                      [&](Callback& c) { c.on_validation_batch_end(*this, m, batch, idx); });
      }
    }
    ++idx;
  }
  Metrics result;
  if (!sanity) {
    if (is_test) {
      m.on_test_epoch_end();
    } else {
      m.on_validation_epoch_end();
    }
    result = flush_epoch(eval_metrics, true);
    if (is_test) {
      callback_hook("on_test_end", [&](Callback& c) { c.on_test_end(*this, m); });
    } else {
      callback_hook("on_validation_epoch_end",
                    [&](Callback& c) { c.on_validation_epoch_end(*this, m); });
      hook("on_validation_end", [&](Module& mm) { mm.on_validation_end(); },
           [&](Callback& c) { c.on_validation_end(*this, m); });
    }
  }
  eval_metrics.clear();
  active_metrics = saved_store;
  scope = saved_scope;
  current_batch_size = saved_bs;
  return result;
}

void Trainer::Impl::fit(DataLoader& train, c10::optional<DataLoader>& val,
                        const std::string& ckpt) {
  Module& m = *module;
  setup_optimizers();
  st.epoch = 0;
  st.global_step = 0;
  st.batches_done = 0;
  st.total_batches_done = 0;
  st.accumulated = 0;
  st.epoch_finished = false;
  st.val_pending = false;
  st.should_stop = false;
  train_metrics.clear();
  epoch_metrics.clear();
  prog_bar_epoch.clear();
  cache_dirty = true;
  fit_start = Clock::now();
  if (is_global_zero()) {
    for (auto& l : loggers_) l->log_hyperparams(m.hparams());
  }
  if (!ckpt.empty()) restore_checkpoint(ckpt, /*full=*/true);

  hook("on_fit_start", [&](Module& mm) { mm.on_fit_start(); },
       [&](Callback& c) { c.on_fit_start(*this, m); });

  // Sanity check: a few validation batches before training. It restores the RNG state after,
  // so enabling it never changes the training trajectory.
  const int64_t sanity_steps = fast_dev ? 0 : opts.num_sanity_val_steps();
  if (val && sanity_steps != 0 && val_limit(*val) > 0) {
    const auto rng = at::detail::getDefaultCPUGenerator().get_state();
    const Stage saved = st.stage;
    st.stage = Stage::kSanityCheck;
    callback_hook("on_sanity_check_start", [&](Callback& c) { c.on_sanity_check_start(*this, m); });
    const int64_t limit = val_limit(*val);
    evaluate(Stage::kValidate, *val, sanity_steps < 0 ? limit : std::min(limit, sanity_steps));
    callback_hook("on_sanity_check_end", [&](Callback& c) { c.on_sanity_check_end(*this, m); });
    st.stage = saved;
    cpu_generator().set_state(rng);
    m.train();
  }

  hook("on_train_start", [&](Module& mm) { mm.on_train_start(); },
       [&](Callback& c) { c.on_train_start(*this, m); });
  const int64_t max_epochs = resolved_max_epochs();
  for (;;) {
    if (st.epoch_finished) {
      if (stop_now() || (max_epochs >= 0 && st.epoch + 1 >= max_epochs)) break;
      ++st.epoch;
      st.batches_done = 0;
      st.epoch_finished = false;
    }
    if (max_epochs >= 0 && st.epoch >= max_epochs) break;
    if (opts.max_steps() >= 0 && st.global_step >= opts.max_steps()) break;
    train_epoch(train, val);
  }
  hook("on_train_end", [&](Module& mm) { mm.on_train_end(); },
       [&](Callback& c) { c.on_train_end(*this, m); });
  hook("on_fit_end", [&](Module& mm) { mm.on_fit_end(); },
       [&](Callback& c) { c.on_fit_end(*this, m); });
}

// ================================================================== Trainer

namespace {
bool reference_blas_warned = false;
}

Trainer::Trainer(TrainerOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  options.validate();
  s.opts = std::move(options);
  s.fast_dev = s.opts.fast_dev_run() > 0;
  if (s.opts.seed()) seed_everything(*s.opts.seed());
  if (s.opts.deterministic()) at::globalContext().setDeterministicAlgorithms(true, false);
  configure_threads(s.opts.num_threads());
  if (!reference_blas_warned && reference_blas_active()) {
    reference_blas_warned = true;
    std::fprintf(stderr,
                 "[volt] warning: libtorch is using the reference BLAS (about 20x slower); "
                 "install libopenblas0-pthread (scripts/setup.sh does).\n");
  }
  s.plan = resolve_plan(s.opts.accelerator(), s.opts.devices(), s.opts.strategy(),
                        s.opts.precision());
  s.callbacks = s.opts.callbacks();
  s.prof = s.opts.profiler().get();
  s.loggers_ = s.opts.loggers();
  if (s.fast_dev) {
    s.loggers_.clear();  // fast_dev_run is a smoke test: no files are written
  } else if (s.loggers_.empty() && s.opts.logger()) {
    s.loggers_.push_back(std::make_shared<CSVLogger>(CSVLoggerOptions(s.opts.default_root_dir())));
  }
  bool has_ckpt = false, has_bar = false;
  std::set<std::string> keys;
  for (auto& c : s.callbacks) {
    has_ckpt = has_ckpt || dynamic_cast<ModelCheckpoint*>(c.get()) != nullptr;
    has_bar = has_bar || dynamic_cast<ProgressBar*>(c.get()) != nullptr;
    VOLT_CHECK(keys.insert(c->state_key()).second, ConfigError, "[Trainer] two callbacks share "
               "state_key \"", c->state_key(), "\"; give them distinct options (e.g. monitor).");
  }
  if (s.fast_dev) {
    s.callbacks.erase(std::remove_if(s.callbacks.begin(), s.callbacks.end(),
                                     [](const std::shared_ptr<Callback>& c) {
                                       return dynamic_cast<ModelCheckpoint*>(c.get()) != nullptr;
                                     }),
                      s.callbacks.end());
  } else if (!has_ckpt && s.opts.enable_checkpointing()) {
    s.callbacks.push_back(std::make_shared<ModelCheckpoint>());
  }
  if (!has_bar && s.opts.enable_progress_bar()) {
    s.callbacks.push_back(std::make_shared<ProgressBar>(s.opts.progress_refresh_s()));
  }
}

Trainer::~Trainer() = default;

void Trainer::fit(Module& module, DataModule& data, const std::string& ckpt_path) {
  impl_->guarded(module, Stage::kFit, [&] {
    data.setup(Stage::kFit);
    DataLoader train = data.train_dataloader();
    c10::optional<DataLoader> val = data.val_dataloader();
    impl_->fit(train, val, ckpt_path);
    data.teardown(Stage::kFit);
  });
}

void Trainer::fit(Module& module, DataLoader train, c10::optional<DataLoader> val,
                  const std::string& ckpt_path) {
  impl_->guarded(module, Stage::kFit, [&] { impl_->fit(train, val, ckpt_path); });
}

Metrics Trainer::Impl::run_eval(Module& module, Stage stage, DataLoader& loader,
                                const std::string& ckpt_path) {
  Metrics out;
  guarded(module, stage, [&] {
    if (!ckpt_path.empty()) restore_checkpoint(ckpt_path, /*full=*/false);
    const Limit& lim = stage == Stage::kTest ? opts.limit_test_batches()
                                             : opts.limit_val_batches();
    int64_t n = lim.resolve(loader.num_batches());
    if (fast_dev) n = std::min(n, opts.fast_dev_run());
    out = evaluate(stage, loader, n);
  });
  return out;
}

Metrics Trainer::validate(Module& module, DataLoader val, const std::string& ckpt_path) {
  return impl_->run_eval(module, Stage::kValidate, val, ckpt_path);
}

Metrics Trainer::validate(Module& module, DataModule& data, const std::string& ckpt_path) {
  data.setup(Stage::kValidate);
  auto loader = data.val_dataloader();
  VOLT_CHECK(loader.has_value(), ConfigError,
             "[Trainer] validate() needs DataModule::val_dataloader(); override it.");
  return validate(module, *loader, ckpt_path);
}

Metrics Trainer::test(Module& module, DataLoader test, const std::string& ckpt_path) {
  return impl_->run_eval(module, Stage::kTest, test, ckpt_path);
}

Metrics Trainer::test(Module& module, DataModule& data, const std::string& ckpt_path) {
  data.setup(Stage::kTest);
  auto loader = data.test_dataloader();
  VOLT_CHECK(loader.has_value(), ConfigError,
             "[Trainer] test() needs DataModule::test_dataloader(); override it.");
  return test(module, *loader, ckpt_path);
}

std::vector<at::Tensor> Trainer::predict(Module& module, DataLoader data,
                                         const std::string& ckpt_path) {
  Impl& s = *impl_;
  std::vector<at::Tensor> out;
  s.guarded(module, Stage::kPredict, [&] {
    if (!ckpt_path.empty()) s.restore_checkpoint(ckpt_path, /*full=*/false);
    int64_t n = s.opts.limit_predict_batches().resolve(data.num_batches());
    if (s.fast_dev) n = std::min(n, s.opts.fast_dev_run());
    torch::NoGradGuard no_grad;
    module.eval();
    s.callback_hook("on_predict_start", [&](Callback& c) { c.on_predict_start(s, module); });
    BatchStream stream = data.stream(0, 0, n);
    Batch raw;
    int64_t idx = 0;
    while (s.next_batch(stream, raw, "get_predict_batch")) {
      Batch batch = s.plan.strategy->batch_to_device(raw);
      auto ctx = s.plan.strategy->precision().forward_context();
      ProfileScope p(s.prof, "predict_step");
      out.push_back(module.predict_step(batch, idx++));
    }
    s.callback_hook("on_predict_end", [&](Callback& c) { c.on_predict_end(s, module); });
  });
  return out;
}

std::vector<at::Tensor> Trainer::predict(Module& module, DataModule& data,
                                         const std::string& ckpt_path) {
  data.setup(Stage::kPredict);
  auto loader = data.predict_dataloader();
  VOLT_CHECK(loader.has_value(), ConfigError,
             "[Trainer] predict() needs DataModule::predict_dataloader(); override it.");
  return predict(module, *loader, ckpt_path);
}

void Trainer::save_checkpoint(const std::string& path) { impl_->save_checkpoint(path); }
const LoopState& Trainer::state() const { return impl_->st; }
const Metrics& Trainer::callback_metrics() const { return impl_->callback_metrics(); }
const Metrics& Trainer::logged_metrics() const { return impl_->logged; }
const TrainerOptions& Trainer::options() const { return impl_->opts; }
Strategy& Trainer::strategy() const { return *impl_->plan.strategy; }
const std::vector<std::shared_ptr<Callback>>& Trainer::callbacks() const {
  return impl_->callbacks;
}
const std::vector<std::shared_ptr<Logger>>& Trainer::loggers() const { return impl_->loggers_; }
std::string Trainer::log_dir() const { return impl_->log_dir(); }

uint64_t seed_everything(uint64_t seed) {
  torch::manual_seed(seed);
  return seed;
}

}  // namespace volt
