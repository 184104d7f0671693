// The evaluation loop: one validation or test pass (also the sanity check before training).
#include <torch/torch.h>

#include <utility>

#include "core/detail/default_steps.h"
#include "trainer/detail/run.h"
#include "volt/core/check.h"
#include "volt/core/log.h"

namespace volt {
namespace detail {

std::vector<Metrics> evaluation_loop(Run& r, Stage stage, std::vector<DataLoader>& loaders,
                                     const std::vector<int64_t>& limits, Metrics* merged) {
  Module& m = *r.module;
  const bool sanity = r.st.stage == Stage::kSanityCheck;
  const bool is_test = stage == Stage::kTest;
  const Run::NoAutograd no_autograd(r.opts.inference_mode());
  // Where the values logged go is restored however the pass ends: after an error caught outside
  // (an elastic restart's next attempt on this Run, a fit after a failed validate()), training
  // logs must not land in the evaluation's store under a loader's name. (The pass, batch and
  // loader stay after an error: the failure's message names them; each entry point resets them.)
  struct Restore {
    Run& r;
    MetricStore* store;
    LogScope scope;
    int64_t batch_size;
    ~Restore() {
      r.active_metrics = store;
      r.scope = scope;
      r.current_batch_size = batch_size;
      r.log_dataloader = -1;
    }
  } restore{r, r.active_metrics, r.scope, r.current_batch_size};
  r.active_metrics = &r.eval_metrics;
  r.eval_metrics.clear();
  r.eval_pass = sanity ? "sanity-check validation" : is_test ? "test" : "validation";
  r.eval_batch = -1;
  r.eval_key_loader.clear();
  r.st.num_dataloaders = static_cast<int64_t>(loaders.size());
  r.st.dataloader_idx = 0;
  r.st.num_eval_batches = limits.empty() ? 0 : limits.front();
  // Lightning's order, the sanity check's pass included (its logged values are dropped).
  m.save_training_modes();
  // The start hooks log into this pass's epoch values, as Lightning allows (inside fit the scope
  // was still the training step's: the value went to the evaluation store's step values, which
  // nothing reads, and was lost; in validate() it was refused).
  const auto start_hooks_scope = [&] { r.scope = LogScope::kEval; };
  // Nothing is logged in the mode hooks and the end hooks (Lightning's fx_validator refuses
  // them; volt dropped the values).
  r.scope = LogScope::kNone;
  if (is_test) {
    r.module_hook("on_test_model_eval", [&](Module& mm) { mm.on_test_model_eval(); });
    start_hooks_scope();
    r.hook(
        "on_test_start", [&](Module& mm) { mm.on_test_start(); },
        [&](Callback& c) { c.on_test_start(r, m); });
    r.hook(
        "on_test_epoch_start", [&](Module& mm) { mm.on_test_epoch_start(); },
        [&](Callback& c) { c.on_test_epoch_start(r, m); });
  } else {
    r.module_hook("on_validation_model_eval", [&](Module& mm) { mm.on_validation_model_eval(); });
    start_hooks_scope();
    r.hook(
        "on_validation_start", [&](Module& mm) { mm.on_validation_start(); },
        [&](Callback& c) { c.on_validation_start(r, m); });
    r.hook(
        "on_validation_epoch_start", [&](Module& mm) { mm.on_validation_epoch_start(); },
        [&](Callback& c) { c.on_validation_epoch_start(r, m); });
  }
  r.scope = LogScope::kEval;
  // A stop signal ends validate()/test() (Run::check_stop_in_evaluation); inside fit the
  // training loop acts on it.
  const bool entry_point = r.st.stage == stage;
  // Whether the module overrides the step, seen at the first one (C++ cannot ask): its default
  // marks that it ran (Lightning asks is_overridden before the loop).
  const auto step_bit = is_test ? DefaultSteps::kTestStep : DefaultSteps::kValidationStep;
  bool step_checked = false;
  // Several loaders run one after the other (Lightning's sequential mode), each from batch 0.
  for (size_t d = 0; d < loaders.size() && !(r.no_validation_step && !is_test); ++d) {
    r.st.dataloader_idx = static_cast<int64_t>(d);
    r.st.num_eval_batches = limits[d];
    r.log_dataloader = loaders.size() > 1 ? static_cast<int64_t>(d) : -1;
    // The epoch's order, as Lightning sets the evaluation sampler's epoch: a shuffled loader
    // (or a limited one's subset) was the same every epoch.
    BatchStream stream = loaders[d].stream(r.st.epoch, 0, limits[d]);
    Batch raw;
    int64_t idx = 0;
    for (r.eval_batch = 0;
         r.next_batch(stream, raw, is_test ? "get_test_batch" : "get_validation_batch");
         r.eval_batch = idx) {
      Batch batch = r.transfer(std::move(raw));
      r.current_batch_size = batch.size();
      if (is_test) {
        r.hook(
            "on_test_batch_start", [&](Module& mm) { mm.on_test_batch_start(batch, idx); },
            [&](Callback& c) { c.on_test_batch_start(r, m, batch, idx); });
      } else {
        r.hook(
            "on_validation_batch_start",
            [&](Module& mm) { mm.on_validation_batch_start(batch, idx); },
            [&](Callback& c) { c.on_validation_batch_start(r, m, batch, idx); });
      }
      {
        Run::Part part(r, is_test ? "test_step" : "validation_step");
        ProfileScope p(r.prof, is_test ? "test_step" : "validation_step");
        if (!step_checked) DefaultSteps::clear(m);
        if (is_test) {
          r.strategy().test_step(m, batch, idx);
        } else {
          r.strategy().validation_step(m, batch, idx);
        }
      }
      if (!step_checked) {
        step_checked = true;
        if (DefaultSteps::ran(m, step_bit)) {
          const char* step = is_test ? "test_step" : "validation_step";
          VOLT_CHECK(!entry_point, ConfigError, "[Trainer] ", is_test ? "test()" : "validate()",
                     " needs the module's ", step,
                     ", which it does not override (the default does nothing); override ", step,
                     "(batch, batch_idx) and log what to measure there.");
          // Inside fit (Lightning: "You passed in a val_dataloader but have no validation_step.
          // Skipping val loop."): the fit drops its validation loaders after this pass.
          r.no_validation_step = true;
          break;
        }
      }
      if (is_test) {
        r.hook(
            "on_test_batch_end", [&](Module& mm) { mm.on_test_batch_end(batch, idx); },
            [&](Callback& c) { c.on_test_batch_end(r, m, batch, idx); });
      } else {
        r.hook(
            "on_validation_batch_end", [&](Module& mm) { mm.on_validation_batch_end(batch, idx); },
            [&](Callback& c) { c.on_validation_batch_end(r, m, batch, idx); });
      }
      // The batch's on_step values reach the loggers now, without an epoch column; they are not
      // kept for the next batch. validate()/test() number the rows by the loader's batches run
      // (Lightning's update_eval_step_metrics); a fit's validation puts them at the fit's step:
      // Lightning's count of validation batches over the fit would put them among the training
      // steps, where a resumed logger drops the rows from the checkpoint's step on.
      if (r.eval_metrics.has_step_values()) {
        if (!sanity && r.is_global_zero()) {
          const int64_t seen = r.eval_batches_seen[static_cast<int64_t>(d)];
          r.send_to_loggers(r.eval_metrics.step_values(true, false),
                            r.st.stage == Stage::kFit ? r.log_step() : seen);
        }
        r.eval_metrics.clear_step();
      }
      if (!sanity) ++r.eval_batches_seen[static_cast<int64_t>(d)];
      ++idx;
      if (entry_point) r.check_stop_in_evaluation(/*pass_done=*/false);
    }
  }
  r.log_dataloader = -1;
  r.eval_batch = -1;
  // In a fit every rank drops validation together, until a pass has run a step somewhere: a rank
  // without a validation batch cannot tell (a collective at the same point on every rank,
  // before the pass's end hooks and reductions).
  if (!entry_point && !is_test && !r.validation_step_known) {
    const bool any_missing = r.reduce_boolean_decision(r.no_validation_step, /*all=*/false);
    r.validation_step_known = r.reduce_boolean_decision(step_checked, /*all=*/false);
    r.no_validation_step = any_missing;
    if (any_missing) {
      if (r.is_global_zero()) {
        log_warning("Trainer",
                    "validation loaders were given but the module does not override "
                    "validation_step; skipping validation for this fit (override "
                    "validation_step to validate).");
      }
      r.st.num_val_batches = 0;  // callbacks check at epoch ends, as without validation
    }
  }
  if (entry_point) r.check_stop_in_evaluation(/*pass_done=*/true);
  Metrics result;
  // The module's epoch-end hook may log: it runs before the reduction, the callbacks after (they
  // read the reduced values). The sanity check's values are dropped, not reduced.
  if (is_test) {
    r.module_hook("on_test_epoch_end", [&](Module& mm) { mm.on_test_epoch_end(); });
  } else {
    r.module_hook("on_validation_epoch_end", [&](Module& mm) { mm.on_validation_epoch_end(); });
  }
  if (!sanity) result = r.flush_epoch(r.eval_metrics);
  // The pass has run: a checkpoint written from here on (ModelCheckpoint's at
  // on_validation_end) records it as done, so a resumed fit does not run it again (its
  // callbacks would count it twice).
  if (r.st.stage == Stage::kFit && !is_test) r.st.val_pending = false;
  // The fit's step whose validation this is: its schedulers that monitor a metric step now, on
  // the reduced values (Lightning's update_plateau_schedulers), before the end hooks' checkpoint.
  if (!sanity && r.st.stage == Stage::kFit && !is_test && !r.monitored_steps_since.empty()) {
    const std::vector<int64_t> since = std::exchange(r.monitored_steps_since, {});
    r.step_monitored_schedulers(since);
  }
  // What the callbacks log in their epoch-end hook is the pass's too (Lightning reduces it with
  // the pass's values, before on_validation_end / on_test_end): ModelCheckpoint and
  // EarlyStopping can monitor it, and it reaches the loggers and the entry point's result. It
  // was dropped with the pass's store.
  const auto flush_callbacks_values = [&] {
    if (sanity) return;
    for (auto& kv : r.flush_epoch(r.eval_metrics)) result[kv.first] = kv.second;
  };
  if (is_test) {
    r.callback_hook("on_test_epoch_end", [&](Callback& c) { c.on_test_epoch_end(r, m); });
    flush_callbacks_values();
    r.scope = LogScope::kNone;
    r.hook(
        "on_test_end", [&](Module& mm) { mm.on_test_end(); },
        [&](Callback& c) { c.on_test_end(r, m); });
    r.module_hook("on_test_model_train", [&](Module& mm) { mm.on_test_model_train(); });
  } else {
    r.callback_hook("on_validation_epoch_end",
                    [&](Callback& c) { c.on_validation_epoch_end(r, m); });
    flush_callbacks_values();
    r.scope = LogScope::kNone;
    r.hook(
        "on_validation_end", [&](Module& mm) { mm.on_validation_end(); },
        [&](Callback& c) { c.on_validation_end(r, m); });
    r.module_hook("on_validation_model_train", [&](Module& mm) { mm.on_validation_model_train(); });
  }
  r.eval_metrics.clear();
  r.eval_pass = nullptr;
  r.st.dataloader_idx = 0;
  // Each loader's values: those logged during its batches, and those of the epoch hooks (which
  // belong to no loader), as Lightning's list of one dict per loader.
  std::vector<Metrics> per_loader(loaders.size());
  for (const auto& kv : result) {
    const auto it = r.eval_key_loader.find(kv.first);
    if (it != r.eval_key_loader.end()) {
      per_loader[static_cast<size_t>(it->second)].insert(kv);
    } else {
      for (auto& m : per_loader) m.insert(kv);
    }
  }
  r.eval_key_loader.clear();
  if (merged != nullptr) *merged = std::move(result);
  return per_loader;
}

}  // namespace detail
}  // namespace volt
