// The fit loop: epochs of training batches with validation checks, stop conditions and resume.
#include <torch/torch.h>

#include <cmath>
#include <cstring>

#include "core/detail/default_steps.h"
#include "core/detail/log_cadence.h"
#include "core/detail/numbers.h"
#include "strategies/detail/agree.h"
#include "trainer/detail/device_prefetch.h"
#include "trainer/detail/run.h"
#include "trainer/loops/optimization_step.h"
#include "volt/core/check.h"
#include "volt/core/log.h"
#include "volt/data/data_module.h"
#include "volt/kernels/traced_function.h"

namespace volt {
namespace detail {
namespace {

// The batches each validation loader runs in a pass, and whether a pass runs any.
std::vector<int64_t> val_limits(const Run& r, const std::vector<DataLoader>& val) {
  std::vector<int64_t> limits;
  for (const auto& v : val) limits.push_back(r.val_limit(v));
  return limits;
}
bool validates(const Run& r, const std::vector<DataLoader>& val) {
  if (r.no_validation_step) return false;
  for (const auto& v : val) {
    if (r.val_limit(v) > 0) return true;
  }
  return false;
}

// Whether fit may validate: its validation loaders have batches, or they are rebuilt before a
// validation (reload_dataloaders_every_n_epochs) and may have some then, as Lightning asks its
// DataModule again before it decides (validate_due skips a pass without batches).
bool may_validate(const Run& r, const std::vector<DataLoader>& val) {
  if (validates(r, val)) return true;
  return r.reload_every > 0 && !r.no_validation_step && !r.validation_off();
}

// Whether this epoch validates at all (check_val_every_n_epoch), as Lightning's
// _should_check_val_epoch.
bool is_val_epoch(const Run& r, const std::vector<DataLoader>& val) {
  if (!may_validate(r, val)) return false;
  const c10::optional<int64_t> every = r.opts.check_val_every_n_epoch();
  return r.fast_dev || !every || (r.st.epoch + 1) % *every == 0;
}

bool is_val_boundary(const Run& r, int64_t idx, int64_t n, const std::vector<DataLoader>& val) {
  if (!is_val_epoch(r, val)) return false;
  if (r.fast_dev) return idx + 1 == n;  // Lightning's fast_dev_run sets val_check_interval=1.0
  // Time-based: once the interval has run out (Lightning's _should_check_val_fx, no validation
  // at an epoch's end otherwise). One process reads its clock; several act on what their last
  // stop vote agreed (Run::check_stop), so that all validate at the same batch.
  if (const auto seconds = r.opts.val_check_interval_s()) {
    return r.val_time_due || (r.world_size() == 1 && r.since_last_validation() >= *seconds);
  }
  const Limit& vci = r.opts.val_check_interval();
  // check_val_every_n_epoch unset: every N batches of the fit, across epochs (Lightning's
  // total_batch_idx; the count is checkpointed, so a resume keeps the rhythm).
  if (!r.opts.check_val_every_n_epoch()) return r.st.total_batches_done % vci.count() == 0;
  int64_t every = vci.is_fraction()
                      ? std::max<int64_t>(1, static_cast<int64_t>(std::floor(n * vci.fraction())))
                      : vci.count();
  return (idx + 1) % every == 0 || (vci.is_fraction() && vci.fraction() == 1.0 && idx + 1 == n);
}

// max_time or an agreed stop request, once min_epochs / min_steps are met (Lightning's
// trainer.should_stop with _FitLoop._can_stop_early; its max_time is a Timer's stop request, and
// "the min_* requirement always has precedence"); not max_steps. Decides on what every rank
// agreed (Run::check_stop): a rank's own clock or request_stop() alone would let ranks leave the
// loop at different batches, and the one that goes on would wait in its next gradient all-reduce
// for peers that are gone.
bool stop_requested(Run& r) {
  if (!r.time_up && !r.stop_agreed) return false;
  // As Lightning (_FitLoop._can_stop_early): a stop request waits until min_epochs epochs have
  // ended and min_steps steps are taken. Mid-epoch the current epoch does not count yet (it
  // did: a stop could come partway through the last required epoch).
  // An unset min_epochs is 1 beside min_steps, as Lightning's _parse_loop_limits.
  const int64_t epochs_done = r.st.epoch + (r.st.epoch_finished ? 1 : 0);
  const int64_t min_epochs = r.resolved_min_epochs();
  const int64_t min_steps = r.opts.min_steps().value_or(0);
  if (epochs_done >= min_epochs && r.st.global_step >= min_steps) return true;
  if (!r.stop_deferral_logged && r.is_global_zero()) {
    log_info("Trainer", std::string(r.time_up ? "max_time is reached" : "asked to stop") +
                            ", but min_epochs=" + std::to_string(min_epochs) +
                            (r.opts.min_epochs() ? "" : " (implied by min_steps)") +
                            " / min_steps=" + std::to_string(min_steps) +
                            " are not met yet (epoch " + std::to_string(r.st.epoch) +
                            ", global step " + std::to_string(r.st.global_step) +
                            "); training continues until they are.");
  }
  r.stop_deferral_logged = true;
  return false;
}

// A requested stop (a signal, the hooks' requests) checked before a stretch of training, with
// max_time counting the time restored only: max_time is checked after batches and at epoch ends
// (Lightning's Timer), so a max_time of microseconds still trains its first batch, and at the
// fit's start Lightning's Timer checks at on_fit_start before it counts. The clock is put back
// also when the check throws (a signal): OnExceptionCheckpoint saves the time trained, which
// would read as the time restored alone.
void check_stop_on_restored_clock(Run& r) {
  const auto fit_end = r.fit_end;
  if (!fit_end) r.fit_end = r.fit_start;
  try {
    r.check_stop(/*lagged=*/false, /*in_fit=*/true);
  } catch (...) {
    r.fit_end = fit_end;
    throw;
  }
  r.fit_end = fit_end;
}

// A requested stop, or max_steps reached.
bool stop_now(Run& r) {
  if (r.opts.max_steps() >= 0 && r.st.global_step >= r.opts.max_steps()) return true;
  return stop_requested(r);
}

void validate_now(Run& r, std::vector<DataLoader>& val) {
  // Not inside an accumulation window, as Lightning (_should_accumulate): an override that sets
  // the gradients to none (Lightning's default does) would drop a part-accumulated step's sums.
  if (r.st.accumulated == 0) {
    r.module_hook("on_validation_model_zero_grad",
                  [](Module& m) { m.on_validation_model_zero_grad(); });
  }
  // Ends in training mode again, the due validation marked as run (val_pending).
  evaluation_loop(r, Stage::kValidate, val, val_limits(r, val));
  // Time-based validation counts from here (Lightning's _last_val_time at each run's end).
  r.last_val_end = Clock::now();
  r.val_time_due = false;
}

// overfit_batches trains and validates on the same batches every epoch: the fit's loaders
// without their shuffling (as Lightning's _resolve_overfit_batches, which warns when it turns it
// off). `which` is "training" or "validation".
DataLoader unshuffled_for_overfitting(const Run& r, const DataLoader& loader, const char* which) {
  if (!loader.options().shuffle()) return loader;
  if (r.is_global_zero()) {
    log_warning("Trainer", std::string("overfit_batches: the ") + which +
                               " DataLoader shuffles; turning its shuffling off so that every "
                               "epoch uses the same batches.");
  }
  return loader.with_shuffle(false);
}

// Before anything runs, as Lightning's data set-up: a loader without batches trains nothing
// (warned), and an int val_check_interval above the epoch's batches would never validate.
void check_loaders(const Run& r, const DataLoader& train, const std::vector<DataLoader>& val) {
  if (train.num_batches() == 0) {
    log_warning("Trainer",
                "the training DataLoader has no batches (its dataset is empty on this process), "
                "so fit trains nothing; check the dataset (and, with several processes, that it "
                "has at least one sample per process).");
    return;
  }
  const int64_t n = r.train_limit(train);
  const Limit& vci = r.opts.val_check_interval();
  VOLT_CHECK(r.fast_dev || n == 0 || !may_validate(r, val) || vci.is_fraction() ||
                 !r.opts.check_val_every_n_epoch() || vci.count() <= n,
             ConfigError, "[Trainer] val_check_interval=", vci.count(), " is more than the ", n,
             " training batches of an epoch, so validation would never run; use a count <= ", n,
             ", a fraction such as 0.5, or limit_val_batches=0 to turn validation off.");
}

// This epoch's training batches, the same on every rank: each step averages gradients over all
// of them, so a rank with fewer (a loader the program sharded unevenly, or not at all, with
// use_distributed_sampler off) would leave the others waiting in their next all-reduce for the
// collective timeout. One small all-reduce per epoch finds it first, on every rank (Lightning
// checks nothing and hangs there).
int64_t agreed_train_limit(Run& r, const DataLoader& train) {
  const int64_t n = r.train_limit(train);
  const std::pair<int64_t, int64_t> range = min_max_over_ranks(r.strategy(), n);
  const int64_t lo = range.first, hi = range.second;
  VOLT_CHECK(lo == hi, ConfigError,
             "[Trainer] the ranks have different numbers of training "
             "batches in epoch ",
             r.st.epoch, " (from ", lo, " to ", hi, "; rank ", r.strategy().rank(), " has ", n,
             "): every rank must take as many steps, each "
             "averaging gradients over all of them. Let the Trainer shard the loader "
             "(use_distributed_sampler, padded shards), shard it with "
             "DataLoader::sharded(rank, world_size) (even shards), or set limit_train_batches to ",
             lo, ".");
  return n;
}

// Whether on_train_batch_start asked to skip the rest of the epoch (Module::skip_rest_of_epoch,
// Lightning's -1), on every rank: ranks that went on without the one that skipped would wait in
// its next gradient all-reduce (Lightning's hang there). A module that sets
// may_skip_rest_of_epoch has the ranks take any rank's request at each batch (one blocking
// all-reduce); whether they do is agreed at the fit's first batch, so that every rank runs the
// same collectives even if the setting differs between them.
bool skips_rest_of_epoch(Run& r, bool skip) {
  if (r.world_size() == 1) return skip;
  if (!r.agree_on_skip) {
    r.agree_on_skip = r.reduce_boolean_decision(r.module->may_skip_rest_of_epoch(), /*all=*/false);
  }
  if (*r.agree_on_skip) return r.reduce_boolean_decision(skip, /*all=*/false);
  VOLT_CHECK(!skip, ValueError, "[Trainer] skip_rest_of_epoch() was called at epoch ", r.st.epoch,
             " batch ", r.st.batches_done, " on rank ", r.global_rank(), " of ", r.world_size(),
             " without set_may_skip_rest_of_epoch(true), so the other ranks would wait for this "
             "one in their next all-reduce; call set_may_skip_rest_of_epoch(true) in the module's "
             "constructor or setup() (the ranks then agree on a skip at each batch).");
  return false;
}

// What a due validation owes when its loaders have no batches (rebuilt empty for it): none runs,
// as Lightning's evaluation loop skips such a pass, but it counts as done and the step's
// schedulers that monitor a metric step, as after it.
void skip_due_validation(Run& r) {
  r.st.val_pending = false;
  if (!r.monitored_steps_since.empty()) {
    r.step_monitored_schedulers(std::exchange(r.monitored_steps_since, {}));
  }
}

// A validation fit is due to run, on the loaders rebuilt for it when their reload is due
// (`reload_val_if_due`, reload_dataloaders_every_n_epochs).
// Returns whether a pass ran.
bool validate_due(Run& r, std::vector<DataLoader>& val,
                  const std::function<void()>& reload_val_if_due) {
  reload_val_if_due();
  if (!validates(r, val)) {
    skip_due_validation(r);
    return false;
  }
  validate_now(r, val);
  return true;
}

// `reload_val_if_due` runs before each validation: the validation loaders' reload
// (reload_dataloaders_every_n_epochs).
void train_epoch(Run& r, DataLoader& train, std::vector<DataLoader>& val, bool first,
                 const std::function<void()>& reload_val_if_due) {
  Module& m = *r.module;
  LoopState& st = r.st;
  // The module's own traced functions (a traced forward) are checked again at their next call:
  // one whose ops depend on the epoch fails there instead of replaying the last epoch's.
  if (!first) TracedFunction::recheck_module(m);
  const int64_t n = r.train_limit(train);
  st.num_training_batches = n;
  m.train();  // as Lightning 1.x; the epoch-start hooks may put submodules in eval mode again
  // The epoch-start hooks log into this epoch's values (Lightning allows on_epoch there), with
  // the weight of one sample. A mid-epoch resume runs them again: the epoch's values restored
  // from the checkpoint hold what they logged, so this time it is dropped.
  r.scope = LogScope::kTrainEpochEnd;
  r.current_batch_size = 1;
  r.drop_logs = st.batches_done > 0;
  r.hook(
      "on_train_epoch_start", [&](Module& mm) { mm.on_train_epoch_start(); },
      [&](Callback& c) { c.on_train_epoch_start(r, m); });
  r.drop_logs = false;
  // A hook may have frozen or unfrozen layers (BaseFinetuning); DDP rebuilds its buckets.
  r.check_trainable_parameters();
  // A stop the epoch-start hooks ask for trains no batch of the epoch (Lightning's epoch loop
  // checks `done` before its first batch); the epoch-end hooks still run. Not max_time.
  check_stop_on_restored_clock(r);
  bool stopped = stop_now(r);
  // Resumed from a checkpoint written just before a due validation: run it first, also when the
  // epoch-start hooks (which a mid-epoch resume runs again) ask to stop, as the uninterrupted fit
  // validated before any such request (it skipped it, and a ModelCheckpoint or EarlyStopping
  // monitoring it never saw those weights).
  // A stop it asks for (EarlyStopping) ends the fit here, as after the same validation in an
  // uninterrupted fit; the resumed fit trained one more batch. Resumed without the validation
  // data it was due on, none runs.
  if (st.val_pending && validate_due(r, val, reload_val_if_due)) {
    r.check_stop(/*lagged=*/false, /*in_fit=*/true);
    stopped = stopped || stop_now(r);
  }
  bool skipped = false;  // Module::skip_rest_of_epoch()
  if (!stopped && st.batches_done < n) {
    BatchStream stream = train.stream(st.epoch, st.batches_done, n - st.batches_done);
    // Pinned batches on a CUDA run: batch i+1 is fetched as soon as step i is enqueued and
    // copied to the device on a side stream while step i runs (trainer/detail/device_prefetch.h).
    c10::optional<DevicePrefetch> ahead;
    const c10::Device device = r.strategy().root_device();
    if (device.is_cuda() && train.options().pin_memory() && train.options().prefetch_to_device()) {
      ahead.emplace(device, [&r](const Batch& b) { return r.strategy().batch_to_device(b); });
    }
    struct ForgetPrefetch {
      Run& r;
      ~ForgetPrefetch() { r.prefetch = nullptr; }
    } forget_prefetch{r};
    r.prefetch = ahead ? &*ahead : nullptr;
    Batch raw;
    bool fetched = false;  // raw holds the next batch already, its copy in flight
    for (r.train_batch = st.batches_done; fetched || r.next_batch(stream, raw, "get_train_batch");
         r.train_batch = st.batches_done) {
      fetched = false;
      const int64_t idx = st.batches_done;
      Batch batch = r.transfer(std::move(raw));
      r.scope = LogScope::kTrainStep;
      bool skip = false;
      r.hook(
          "on_train_batch_start",
          [&](Module& mm) {
            skip =
                DefaultSteps::train_batch_start(mm, [&] { mm.on_train_batch_start(batch, idx); });
          },
          [&](Callback& c) { c.on_train_batch_start(r, m, batch, idx); });
      if (skips_rest_of_epoch(r, skip)) {
        // Fetched and handed to the hooks, not trained (Lightning counts it processed).
        ++st.batches_done;
        ++st.total_batches_done;
        skipped = true;
        break;
      }
      const int64_t step_before = st.global_step;
      const std::vector<int64_t> steps_before = r.optimizer_step_counts();
      r.step->run(batch, idx, n);
      if (r.prefetch != nullptr && idx + 1 < n) {
        r.train_batch = idx + 1;  // a failed fetch names the batch it fetched
        fetched = r.next_batch(stream, raw, "get_train_batch");
        if (fetched) r.prefetch->copy_ahead(raw);
        r.train_batch = idx;
      }
      ++st.batches_done;
      ++st.total_batches_done;
      const bool validate = is_val_boundary(r, idx, n, val);
      st.val_pending = validate;
      // The schedulers that monitor a metric step after the validation of this step when one is
      // due (the evaluation loop steps them once its metrics are reduced, before its end hooks),
      // else now, before the batch-end hooks: a checkpoint written by either holds the step.
      if (st.global_step != step_before) {
        if (validate) {
          r.monitored_steps_since = steps_before;
        } else {
          r.step_monitored_schedulers(steps_before);
        }
      }
      r.cache_dirty = true;
      r.hook(
          "on_train_batch_end", [&](Module& mm) { mm.on_train_batch_end(batch, idx); },
          [&](Callback& c) { c.on_train_batch_end(r, m, batch, idx); });
      // Per-step values reach the loggers when the step count passes a multiple of
      // log_every_n_steps: one step per batch under automatic optimization, any number under
      // manual optimization (whose batches `stepped` never reports; they reached no logger).
      if (detail::passes_log_step(step_before, st.global_step, r.opts.log_every_n_steps())) {
        r.send_to_loggers(r.train_metrics.step_values(true, false));
      }
      if (validate) validate_due(r, val, reload_val_if_due);
      // Signals, request_stop() and max_time, agreed over the ranks. Lagged (the exchange runs
      // while the next batch computes) except after a validation, whose request (EarlyStopping)
      // stops this batch as in one process.
      r.check_stop(/*lagged=*/!validate, /*in_fit=*/true);
      if (stop_now(r)) {
        // A requested stop (max_time, request_stop(), a callback) validates the weights it
        // leaves with when this epoch validates, as Lightning's _should_check_val_fx: else
        // ModelCheckpoint and EarlyStopping would rank them by an older validation's score.
        // Reaching max_steps does not (nor in Lightning). On what the ranks agreed, so every
        // rank runs the pass.
        if (!validate && stop_requested(r) && is_val_epoch(r, val)) {
          validate_due(r, val, reload_val_if_due);
        }
        break;
      }
    }
    r.train_batch = -1;
  }
  r.step->check_losses();  // before the epoch-end hooks, which may write checkpoints
  r.scope = LogScope::kTrainEpochEnd;
  // A skipped rest of the epoch ends it as its last batch would (Lightning's is_last_batch),
  // without the validation due there. A part-accumulated step is dropped through the zero-grad
  // hooks, as Lightning zeroes its gradients at the next window's first batch (they would have
  // joined that window here).
  if (skipped && st.accumulated > 0) {
    for (auto& c : r.optimizers) {
      torch::optim::Optimizer& opt = *c.optimizer();
      r.hook(
          "on_before_zero_grad", [&](Module& mm) { mm.on_before_zero_grad(opt); },
          [&](Callback& cb) { cb.on_before_zero_grad(r, m, opt); });
      r.module_hook("optimizer_zero_grad", [&](Module& mm) {
        mm.optimizer_zero_grad(st.epoch, st.batches_done - 1, opt);
      });
    }
    st.accumulated = 0;
  }
  // An epoch left before its last batch because max_steps was reached stays unfinished: a fit
  // resumed from it with a larger max_steps trains its remaining batches, as the fit given that
  // max_steps from the start (Lightning restarts an iteration-based fit inside its epoch); it
  // went on with the next epoch, skipping them. The end hooks run all the same (ModelCheckpoint
  // saves there), as in Lightning; the epoch's schedulers step only after its last batch
  // (Lightning's _num_ready_batches_reached), whatever ended it.
  const bool all_batches = skipped || st.batches_done >= n;
  if (all_batches) r.step_schedulers(Interval::kEpoch);
  st.epoch_finished = all_batches || r.opts.max_steps() < 0 || st.global_step < r.opts.max_steps();
  // The module's hook runs before the epoch metrics are reduced (it may log), the callbacks'
  // after (ModelCheckpoint and EarlyStopping read the reduced values).
  r.module_hook("on_train_epoch_end", [&](Module& mm) { mm.on_train_epoch_end(); });
  r.flush_epoch(r.train_metrics);
  // Those that monitor a metric read the epoch's reduced ones (its validation's, what the
  // module's end hook logged), before the callbacks' hooks, so that a checkpoint written there
  // holds the step (Lightning steps them after those hooks: its checkpoint misses the step).
  if (all_batches) r.step_schedulers(Interval::kEpoch, /*monitored=*/true);
  r.callback_hook("on_train_epoch_end", [&](Callback& c) { c.on_train_epoch_end(r, m); });
  // What the callbacks logged there belongs to this epoch too (Lightning reduces it with the
  // epoch's values); it waited for the next epoch's reduction, averaged with that epoch's, and
  // the last epoch's never reached the loggers.
  r.flush_epoch(r.train_metrics);
  r.end_epoch_step_values();
  for (auto& l : r.loggers()) l->save();
  r.scope = LogScope::kNone;
}

/// Validation batches before training. It restores the RNG state afterwards, so enabling it
/// never changes the training trajectory.
void sanity_check(Run& r, std::vector<DataLoader>& val) {
  const int64_t sanity_steps = r.fast_dev ? 0 : r.opts.num_sanity_val_steps();
  if (sanity_steps == 0 || !validates(r, val)) return;
  // Lightning skips it when its loops restart: a resume inside an epoch (a checkpoint written
  // at a batch end or in a validation, before the epoch-end hooks; Lightning's epoch progress
  // counts the epoch processed before on_train_epoch_end, as volt's epoch_finished), or any
  // resume under max_steps.
  if (!r.started_from.empty() && (!r.st.epoch_finished || r.opts.max_steps() >= 0)) return;
  // num_sanity_val_steps batches of each loader, as Lightning.
  std::vector<int64_t> limits = val_limits(r, val);
  if (sanity_steps > 0) {
    for (auto& l : limits) l = std::min(l, sanity_steps);
  }
  Module& m = *r.module;
  const auto rng = r.strategy().rng_states();
  const Stage saved = r.st.stage;
  r.st.stage = Stage::kSanityCheck;
  r.callback_hook("on_sanity_check_start", [&](Callback& c) { c.on_sanity_check_start(r, m); });
  evaluation_loop(r, Stage::kValidate, val, limits);
  r.callback_hook("on_sanity_check_end", [&](Callback& c) { c.on_sanity_check_end(r, m); });
  r.st.stage = saved;
  r.strategy().set_rng_states(rng);
}

}  // namespace

void Run::forward_training_data() {
  // From a hook (the running Part is named on_*), never from inside a step or from itself.
  VOLT_CHECK(
      fit_train != nullptr && std::strncmp(where, "on_", 3) == 0 && scope != LogScope::kDiscard,
      ValueError,
      "[Trainer] forward_training_data() runs only inside fit, from a hook "
      "(on_train_batch_end, on_train_epoch_start/end, on_train_end, ...), not from a step; "
      "call it from one of those.");
  Module& m = *module;
  VOLT_CHECK(m.automatic_optimization(), ConfigError,
             "[Trainer] forward_training_data() under manual optimization would run the "
             "optimizer steps of training_step; use automatic optimization for this module.");
  DataLoader& train = *fit_train;
  const int64_t n = train_limit(train);
  // Every submodule's mode comes back after the pass (a BatchNorm kept in eval mode stays so).
  // Not save_training_modes(): this may run inside an evaluation pass, which holds those.
  struct Restore {
    Run& r;
    Module& m;
    LogScope scope;
    std::vector<bool> modes;
    ~Restore() {
      r.scope = scope;
      m.set_training_modes(modes);
    }
  } restore{*this, m, scope, m.training_modes()};
  m.train();
  scope = LogScope::kDiscard;
  {
    torch::NoGradGuard no_grad;
    BatchStream stream = train.stream(st.epoch, 0, n);
    Batch raw;
    for (int64_t idx = 0; next_batch(stream, raw, "get_train_batch"); ++idx) {
      const Batch batch = transfer(std::move(raw));
      Part part(*this, "training_step");
      strategy().training_step(m, batch, idx);
    }
    // Each rank saw its own batches: every rank takes rank 0's statistics, so the ranks agree.
    if (world_size() > 1) {
      for (auto& b : m.named_buffers(true)) b.value().copy_(strategy().broadcast(b.value(), 0));
    }
  }
}

std::string describe_global_batch(int64_t per_process, int64_t data_parallel, int64_t accumulate,
                                  int64_t last_batch) {
  // The reference's batch-size guidance: what converges is the global batch, which grows with
  // every process added unless the per-device batch shrinks.
  auto s = detail::c_stream<std::ostringstream>();
  s << "batch: " << per_process << " samples per process";
  if (data_parallel > 1) s << " x " << data_parallel << " data-parallel processes";
  if (accumulate > 1) s << " x " << accumulate << " accumulated batches";
  if (data_parallel > 1 || accumulate > 1) {
    s << " = " << per_process * data_parallel * accumulate << " samples";
  }
  s << " per optimizer step";
  // A ragged last batch gives its steps (and, with accumulation, its optimizer step) fewer
  // samples: say so rather than let the line above claim every step.
  if (last_batch > 0 && last_batch < per_process) {
    s << "; the last batch of each epoch has " << last_batch << " sample"
      << (last_batch == 1 ? "" : "s") << " per process";
  }
  return s.str();
}

void fit_loop(Run& r, DataLoader& train_loader, std::vector<DataLoader>& val_loaders,
              const std::string& ckpt_path, const LoaderReload& reload) {
  Module& m = *r.module;
  if (!r.fast_dev && !r.opts.max_epochs() && !r.unset_max_epochs_bounded() && r.is_global_zero()) {
    log_warning("Trainer",
                "max_epochs was not set; training for at most 1000 epochs (Lightning's default). "
                "Set max_epochs, or max_epochs=-1 to train without an epoch limit.");
  }
  DataLoader train = train_loader;
  std::vector<DataLoader> val;
  // The loaders as the loop runs them: sharded over the ranks, unshuffled when overfitting.
  const auto prepare_train = [&](const DataLoader& t) {
    train = r.shard(r.overfitting() ? unshuffled_for_overfitting(r, t, "training") : t);
  };
  const auto prepare_val = [&](const std::vector<DataLoader>& v) {
    val.clear();
    for (const auto& l : v) {
      if (r.no_validation_step) break;  // nothing to validate with (evaluation_loop)
      val.push_back(r.shard(r.overfitting() ? unshuffled_for_overfitting(r, l, "validation") : l));
    }
    r.st.num_val_batches = 0;
    for (int64_t n : val_limits(r, val)) r.st.num_val_batches += n;
  };
  const auto prepare = [&](const DataLoader& t, const std::vector<DataLoader>& v) {
    prepare_train(t);
    prepare_val(v);
    check_loaders(r, train, val);
  };
  // fast_dev_run validates once at the epoch's end, as Lightning (is_val_boundary).
  const Limit& every = r.opts.val_check_interval();
  r.st.val_check_at_epoch_end = r.fast_dev || (!r.opts.val_check_interval_s() &&
                                               every.is_fraction() && every.fraction() == 1.0);
  r.st.val_every_epoch = r.fast_dev || r.opts.check_val_every_n_epoch() == int64_t{1};
  prepare(train_loader, val_loaders);
  // reload_dataloaders_every_n_epochs: a new training loader from the DataModule at epochs 0, N,
  // 2N..., new validation loaders at a validation N or more epochs after their last build
  // (Lightning's _should_reload_val_dl; before session 110 they came with the training loader).
  r.reload_every = reload ? r.opts.reload_dataloaders_every_n_epochs() : 0;
  const int64_t reload_every = r.reload_every;
  int64_t loaded_epoch = 0;
  const auto reload_for = [&](int64_t epoch) {
    if (reload.train) {
      prepare_train(reload.train(epoch));
      check_loaders(r, train, val);
    }
    loaded_epoch = epoch;
  };
  // check_loaders' verdicts do not depend on the validation loaders' batches while they reload
  // (may_validate).
  const auto reload_val_for = [&](int64_t epoch) {
    if (reload.val && !r.validation_off()) prepare_val(reload.val(epoch));
  };
  const auto reload_val_if_due = [&] {
    if (reload_every == 0) return;
    if (r.val_loaded_epoch >= 0 && r.st.epoch - r.val_loaded_epoch < reload_every) return;
    reload_val_for(r.st.epoch);
    r.val_loaded_epoch = r.st.epoch;
  };
  r.fit_train = &train;
  struct ForgetLoader {
    Run& r;
    ~ForgetLoader() { r.fit_train = nullptr; }
  } forget{r};
  r.setup_optimizers();
  if (r.opts.graph_training_step()) r.step = make_graphed_step(r);
  if (r.opts.trace_training_step()) r.step = make_traced_step(r);
  if (r.overfitting() && r.is_global_zero()) {
    auto s = detail::c_stream<std::ostringstream>();
    s << "overfit_batches=" << r.opts.overfit_batches() << ": every epoch trains on the same "
      << r.train_limit(train) << " batch(es)";
    if (!val.empty()) {
      s << " and validates on " << r.val_limit(val.front());
      if (val.size() > 1) s << " of each of the " << val.size() << " validation loaders";
    }
    s << " (in place of limit_train_batches and limit_val_batches).";
    log_info("Trainer", s.str());
  }
  log_info("Trainer",
           describe_global_batch(train.options().batch_size(), r.strategy().data_shard().world_size,
                                 r.opts.accumulate_grad_batches(), train.last_batch_size()));
  r.st.epoch = 0;
  r.st.global_step = 0;
  r.st.batches_done = 0;
  r.st.total_batches_done = 0;
  r.st.accumulated = 0;
  r.st.epoch_finished = false;
  r.st.val_pending = false;
  r.monitored_steps_since.clear();
  r.manual_steps.clear();
  r.st.should_stop = false;
  r.stop_agreed = false;
  r.stop_deferral_logged = false;
  r.agree_on_skip.reset();
  // The loaders built as fit starts count as a build at epoch 0 only when that epoch validates,
  // as Lightning's setup_data counts its build for the sanity check.
  const c10::optional<int64_t> val_every = r.opts.check_val_every_n_epoch();
  r.val_loaded_epoch = r.fast_dev || !val_every || *val_every == 1 ? 0 : -1;
  r.time_up = false;
  r.st.accumulate_grad_batches = r.opts.accumulate_grad_batches();
  r.fit_elapsed_before = 0;
  r.step->reset_checks();
  r.reset_metrics();
  r.fit_start = Clock::now();
  r.fit_end.reset();
  // A process of a restarted attempt resumes where the job's last checkpoint is; rank 0's choice
  // counts (another node's process may not have found it, or found a stale one), and without
  // one the attempt starts where fit() was asked to.
  std::string restart = r.strategy().restart_checkpoint();
  if (restart == "last") {
    restart = newest_last_checkpoint(r);
    if (restart.empty() && r.is_global_zero()) {
      log_warning("Trainer",
                  "this is a restarted attempt of the job (torchrun restarted its workers) but no "
                  "last checkpoint was found, so it starts where fit() was asked to; give "
                  "ModelCheckpoint a dirpath and save_last(true) (a restarted process logs into "
                  "a new version folder) so that restarted attempts resume.");
    }
  }
  restart = r.broadcast_string(restart);
  const std::string ckpt =
      !restart.empty() ? restart : resolve_ckpt_path(r, ckpt_path, Stage::kFit);
  const bool data_restored = !ckpt.empty() && restore_checkpoint(r, ckpt, /*full=*/true);
  r.started_from = ckpt;
  // A resumed fit asks for the loaders the uninterrupted fit would be using, so that the resume
  // stays exact: the training loader of the last multiple of N at or before the epoch it
  // resumes at (the next epoch when the checkpoint was written at an epoch's end), the
  // validation loaders of their last build (checkpointed). Lightning counts N from the resumed
  // epoch instead.
  if (reload_every > 0) {
    const int64_t first_epoch = r.st.epoch + (r.st.epoch_finished ? 1 : 0);
    const int64_t due = first_epoch - first_epoch % reload_every;
    if (due != loaded_epoch || data_restored) reload_for(due);
    // A checkpoint older than session 110: the validation loaders came with the training one.
    if (r.val_loaded_epoch == Run::kValLoadedUnknown) r.val_loaded_epoch = due;
    if (r.val_loaded_epoch > 0 || data_restored) {
      reload_val_for(std::max<int64_t>(r.val_loaded_epoch, 0));
    }
  } else if (data_restored && reload) {
    // The DataModule's restored state is what its loaders are built from (Lightning restores
    // it before asking for them).
    reload_for(loaded_epoch);
    reload_val_for(loaded_epoch);
  }
  // The loop zeroes gradients after each step, not before: whatever the parameters hold now (an
  // elastic restart's failed attempt died inside a backward; a program's own backward before
  // fit) must not reach the first step. Gradients of a restored accumulation stay.
  if (r.st.accumulated == 0) {
    for (auto& c : r.optimizers) r.strategy().zero_grad(*c.optimizer());
  }
  r.log_hparams();

  DataModule* data = r.data_module();  // the user's, or the module's own loaders
  const c10::optional<int64_t> batch_size = data != nullptr ? data->batch_size() : c10::nullopt;
  r.hook(
      "on_fit_start", [&](Module& mm) { mm.on_fit_start(); },
      [&](Callback& c) { c.on_fit_start(r, m); });
  // A tuner callback may have run trials in Trainers of its own, which detach the module.
  m.attach(&r);
  // A BatchSizeFinder changed the DataModule's batch size: the fit runs on loaders of that
  // size, as Lightning resets its loaders after the search.
  if (reload && data != nullptr && data->batch_size() != batch_size) {
    reload_for(loaded_epoch);
    reload_val_for(std::max<int64_t>(r.val_loaded_epoch, 0));
    log_info("Trainer", describe_global_batch(
                            train.options().batch_size(), r.strategy().data_shard().world_size,
                            r.st.accumulate_grad_batches, train.last_batch_size()));
  }
  sanity_check(r, val);

  // max_time counts training from here, as Lightning's Timer (which starts in on_train_start):
  // the set-up, the restore, on_fit_start (a tuner callback's trials) and the sanity check are
  // not part of it. So does val_check_interval_s (Lightning's setup_data, after the check).
  r.fit_start = Clock::now();
  r.last_val_end = r.fit_start;
  r.val_time_due = false;
  const int64_t max_epochs = r.resolved_max_epochs();
  // Lightning's FitLoop.skip: a fit with nothing to train (a resume of a finished fit, its
  // max_time spent, no training batches) runs no train start or end hooks; the fit's do run.
  check_stop_on_restored_clock(r);
  bool no_batches = agreed_train_limit(r, train) == 0;
  const bool nothing_to_train =
      no_batches || (r.opts.max_steps() >= 0 && r.st.global_step >= r.opts.max_steps()) ||
      (max_epochs >= 0 && r.st.epoch + (r.st.epoch_finished ? 1 : 0) >= max_epochs) ||
      stop_requested(r);
  if (!nothing_to_train) {
    // What on_train_start logs joins the first epoch's values (Lightning allows on_epoch there);
    // a resumed fit drops it (the uninterrupted fit logged it into its first epoch only).
    r.scope = LogScope::kTrainEpochEnd;
    r.current_batch_size = 1;
    r.drop_logs = r.st.total_batches_done > 0;
    r.hook(
        "on_train_start", [&](Module& mm) { mm.on_train_start(); },
        [&](Callback& c) { c.on_train_start(r, m); });
    r.drop_logs = false;
    r.scope = LogScope::kNone;
  }
  // The first epoch's loader was counted and agreed just above; an epoch after it, or a reload,
  // is counted again.
  bool counted = true;
  for (bool first = true; !nothing_to_train; first = false, counted = false) {
    // The epoch-end hooks' requests; at the start, those of on_train_start (a Timer restored
    // with its time spent).
    if (first || r.st.epoch_finished) {
      if (first) {
        check_stop_on_restored_clock(r);
      } else {
        r.check_stop(/*lagged=*/false, /*in_fit=*/true);
      }
      if (stop_now(r)) break;
    }
    if (r.st.epoch_finished) {
      if (max_epochs >= 0 && r.st.epoch + 1 >= max_epochs) break;
      ++r.st.epoch;
      r.st.batches_done = 0;
      r.st.epoch_finished = false;
      counted = false;
    }
    if (max_epochs >= 0 && r.st.epoch >= max_epochs) break;
    if (r.opts.max_steps() >= 0 && r.st.global_step >= r.opts.max_steps()) break;
    if (reload_every > 0 && r.st.epoch % reload_every == 0 && r.st.epoch != loaded_epoch) {
      reload_for(r.st.epoch);
      counted = false;
    }
    // Lightning's FitLoop.done: an epoch without batches steps nothing, so under max_steps
    // alone (max_epochs -1, as the tuners' trials) the loop would never end.
    if (!counted && agreed_train_limit(r, train) == 0) {
      no_batches = true;
      break;
    }
    train_epoch(r, train, val, first, reload_val_if_due);
  }
  r.step->finish();
  // Why the loop ended, as Lightning's "`Trainer.fit` stopped: ..." line.
  if (r.is_global_zero()) {
    std::string why;
    if (no_batches) {
      why = "no training batches";
    } else if (r.opts.max_steps() >= 0 && r.st.global_step >= r.opts.max_steps()) {
      why = "max_steps=" + std::to_string(r.opts.max_steps()) + " reached";
    } else if (r.time_up) {
      why = "max_time reached";
    } else if (r.stop_agreed) {
      why = "a callback or the module asked to stop";
    } else if (max_epochs >= 0) {
      why = "max_epochs=" + std::to_string(max_epochs) + " reached";
    }
    if (!why.empty()) {
      log_info("Trainer", "fit stopped: " + why + " (epoch " + std::to_string(r.st.epoch) +
                              ", global step " + std::to_string(r.st.global_step) + ").");
    }
  }
  r.fit_end = Clock::now();  // a checkpoint saved after fit counts the training time only
  if (!nothing_to_train) {
    r.hook(
        "on_train_end", [&](Module& mm) { mm.on_train_end(); },
        [&](Callback& c) { c.on_train_end(r, m); });
  }
  r.hook(
      "on_fit_end", [&](Module& mm) { mm.on_fit_end(); }, [&](Callback& c) { c.on_fit_end(r, m); });
}

}  // namespace detail
}  // namespace volt
