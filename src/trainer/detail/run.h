#pragma once
// Private: the Trainer's state during a run and the services its loops share. It implements
// RunContext (what modules and callbacks see). The loops live in src/trainer/loops/, the
// checkpoint assembly in src/trainer/checkpoint_state.cpp; each takes a Run&.

#include <ATen/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Optional.h>

#include <chrono>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "trainer/detail/metric_store.h"
#include "trainer/detail/signals.h"
#include "volt/callbacks/callback.h"
#include "volt/core/loop_state.h"
#include "volt/core/module.h"
#include "volt/core/run_context.h"
#include "volt/data/data_loader.h"
#include "volt/loggers/logger.h"
#include "volt/profiler/profiler.h"
#include "volt/strategies/strategy.h"
#include "volt/trainer/plan.h"
#include "volt/trainer/trainer_options.h"

namespace volt {
namespace detail {

class DevicePrefetch;
class OptimizationStep;

using Clock = std::chrono::steady_clock;

/// Which part of the loop is running: decides Module::log's on_step/on_epoch defaults.
/// kTrainEpochEnd: on_train_start and a training epoch's start and end hooks (epoch values only);
/// kEval: a validation/test pass (on_step only inside its batches).
enum class LogScope { kNone, kTrainStep, kTrainEpochEnd, kEval, kDiscard };

class Run : public RunContext {
 public:
  Run();
  ~Run() override;

  TrainerOptions opts;
  RunPlan plan;
  std::vector<std::shared_ptr<Callback>> callbacks;
  std::vector<std::shared_ptr<Logger>> loggers_;
  bool loggers_muted_ = false;  // fast_dev_run dropped the run's loggers
  LoopState st;
  std::string started_from;  // ckpt_path(): the checkpoint this run restored, "" if none
  Module* module = nullptr;
  std::vector<OptimizerConfig> optimizers;
  bool optimizers_ready = false;
  /// One automatic-optimization step; replaceable (e.g. by a captured graph of the step).
  std::unique_ptr<OptimizationStep> step;
  /// While a training epoch copies its next batch ahead (train_epoch's, pinned loaders on CUDA):
  /// batch_to_device takes the copy when it is handed that batch.
  DevicePrefetch* prefetch = nullptr;
  /// While graph_training_step captures the step: log() records here instead of in the metric
  /// stores, and the graphed step re-logs these (static, replay-updated) values after each
  /// replay.
  struct CapturedLog {
    std::string name;
    at::Tensor value;
    LogOptions options;
  };
  std::vector<CapturedLog>* capture_log = nullptr;

  /// The parameters that required a gradient when the strategy took the module (setup_run) or
  /// when check_trainable_parameters last saw them change.
  std::vector<const void*> trainable;
  /// Compares the module's trainable parameters with `trainable`: a change (a callback froze or
  /// unfroze layers) is logged and passed to the strategy (DDP rebuilds its buckets) and to the
  /// step (a graphed step stops replaying). The fit loop calls it when a training epoch starts,
  /// after the epoch-start hooks.
  void check_trainable_parameters();

  /// The (sharded) training loader while fit_loop runs; null elsewhere (forward_training_data).
  DataLoader* fit_train = nullptr;
  /// The DataModule the running entry point was given; null when it was given loaders or uses
  /// the module's own (then `module_data`: its hooks, not a DataModule of the user's, so no
  /// DataModule hooks, state or hyper-parameters).
  DataModule* data = nullptr;
  DataModule* module_data = nullptr;

  // ---------------------------------------------------------------- failure context
  /// What the run is calling (a step, a module hook, a callback's hook, a batch fetch) and the
  /// training and evaluation batches, for the error line a failure in user code or libtorch logs
  /// (failure_context()). Set through Part; a Part left by an exception keeps its mark.
  const char* where = "set-up";
  const Callback* where_callback = nullptr;
  int64_t train_batch = -1;              // the training batch being fetched or run; -1 between
  const char* eval_pass = nullptr;       // "validation", "test", ... while a pass runs
  int64_t eval_batch = -1;               // its batch being fetched or run; -1 outside its batches
  std::vector<int64_t> predict_indices;  // the data set indices of the predict batch being run
  /// Back to "set-up" with no batch: each entry point starts here.
  void reset_failure_context() {
    where = "set-up";
    where_callback = nullptr;
    train_batch = -1;
    eval_pass = nullptr;
    eval_batch = -1;
  }
  /// Marks the part of the run `what` names (a callback's hook also names the callback);
  /// restores the previous mark when left normally, keeps it when an exception leaves.
  class Part {
   public:
    Part(Run& r, const char* what, const Callback* callback = nullptr)
        : r_(r),
          prev_(r.where),
          prev_callback_(r.where_callback),
          uncaught_(std::uncaught_exceptions()) {
      r.where = what;
      r.where_callback = callback;
    }
    ~Part() {
      if (std::uncaught_exceptions() > uncaught_) return;
      r_.where = prev_;
      r_.where_callback = prev_callback_;
    }
    Part(const Part&) = delete;
    Part& operator=(const Part&) = delete;

   private:
    Run& r_;
    const char* prev_;
    const Callback* prev_callback_;
    int uncaught_;
  };
  /// The autograd state of an evaluation or prediction loop: c10::InferenceMode, or only grad
  /// mode off (TrainerOptions::inference_mode).
  class NoAutograd {
   public:
    explicit NoAutograd(bool inference_mode) {
      if (inference_mode) {
        inference_.emplace();
      } else {
        no_grad_.emplace();
      }
    }

   private:
    c10::optional<c10::InferenceMode> inference_;
    c10::optional<at::NoGradGuard> no_grad_;
  };
  /// "fit failed in training_step at epoch 0, batch 3 (global step 3): <type>: <first line>".
  std::string failure_context(Stage stage, const std::exception& e) const;

  MetricStore train_metrics, eval_metrics;
  MetricStore* active_metrics = &train_metrics;
  LogScope scope = LogScope::kNone;
  /// While the batches of one of several evaluation loaders run: its index, which log() adds to
  /// the names (LogOptions::add_dataloader_idx); -1 otherwise.
  int64_t log_dataloader = -1;
  /// The names logged during an evaluation pass's loaders' batches, each with its loader: how a
  /// pass's values are split per loader, and how one name logged from two loaders is caught.
  std::map<std::string, int64_t> eval_key_loader;
  /// Per evaluation loader, its batches run (sanity check aside) in this entry point: the step
  /// of the rows its batches' on_step values go to (Lightning's _seen_batches_per_dataloader).
  std::map<int64_t, int64_t> eval_batches_seen;
  int64_t current_batch_size = 1;
  bool barebones_log_warned = false;  // Module::log under barebones said once per Trainer
  /// Module::log accepts and drops the values (a resumed fit's start hooks run again).
  bool drop_logs = false;
  Metrics epoch_metrics;  // reduced epoch values (host) visible to callbacks
  Metrics logged;         // last values sent to loggers
  Metrics prog_bar_epoch;
  /// Names logged with on_step and on_epoch since the last training epoch's reduction: their
  /// plain name in callback_metrics() is the latest step value ("x_step") until the epoch's mean
  /// ("x_epoch") replaces it, as Lightning's callback metrics hold both names while training.
  std::map<std::string, std::string> plain_from_step;  // "x" -> "x_step"
  /// Forgets every value logged so far (callback, progress-bar and logged metrics): each entry
  /// point starts without the previous one's, as Lightning's Trainer._run resets them.
  void reset_metrics();
  mutable Metrics cb_cache, pb_cache;
  mutable bool cache_dirty = true;
  /// When this fit attempt started training, and when it ended (unset while it runs).
  Clock::time_point fit_start;
  c10::optional<Clock::time_point> fit_end;
  /// Time-based validation (TrainerOptions::val_check_interval_s): when the clock last started
  /// (training's start, each validation's end), and whether the ranks agreed it has run out.
  Clock::time_point last_val_end;
  bool val_time_due = false;
  /// Seconds since last_val_end.
  double since_last_validation() const;
  bool fast_dev = false;
  /// The module does not override validation_step (its default ran in a fit's validation):
  /// the fit drops its validation loaders, as Lightning skips its val loop then.
  bool no_validation_step = false;
  /// Whether a fit's validation pass has run a step on some rank (the ranks agreed on
  /// no_validation_step then).
  bool validation_step_known = false;
  Profiler* prof = nullptr;           // opts.profiler(), or null
  PassThroughProfiler pass_through_;  // profiler() when prof is null
  const std::vector<std::shared_ptr<Logger>> no_loggers_;
  /// With several processes: the run folder rank 0 chose, shared at set-up (other ranks never
  /// create logger folders themselves).
  std::string shared_log_dir_;
  /// SIGINT / SIGTERM while an entry point runs (handle_signals); null outside one.
  const SignalWatch* signals = nullptr;
  /// Seconds fit trained before this attempt, from the checkpoint it resumed (max_time is a
  /// budget for the whole run, as Lightning's Timer keeps it).
  double fit_elapsed_before = 0;
  /// The stop decisions every rank agreed on so far (st.should_stop is this rank's own request
  /// until then).
  bool stop_agreed = false;
  bool time_up = false;
  /// An agreed stop waits for min_epochs / min_steps: said once per fit.
  bool stop_deferral_logged = false;
  /// The epoch fit's validation loaders were last built for under
  /// reload_dataloaders_every_n_epochs (Lightning's _last_val_dl_reload_epoch): -1 before one
  /// counts (the build as fit starts counts only when epoch 0 validates, as Lightning's setup_data
  /// at the sanity check); kValLoadedUnknown when restored from a checkpoint older than session
  /// 110. Checkpointed.
  int64_t val_loaded_epoch = -1;
  static constexpr int64_t kValLoadedUnknown = -2;
  /// reload_dataloaders_every_n_epochs when fit reloads its loaders (from a DataModule), else 0.
  int64_t reload_every = 0;
  /// Whether the ranks agree on Module::skip_rest_of_epoch() at each training batch (several
  /// processes, Module::may_skip_rest_of_epoch on any rank), decided at the fit's first batch;
  /// unset until then.
  c10::optional<bool> agree_on_skip;

  Strategy& strategy() const { return *plan.strategy; }

  // ---------------------------------------------------------------- RunContext
  const LoopState& state() const override { return st; }
  const Metrics& callback_metrics() const override;
  void set_callback_metric(const std::string& name, double value) override;
  const Metrics& progress_bar_metrics() const override;
  void log(const std::string& name, const at::Tensor& value, const LogOptions& o) override;
  using RunContext::save_checkpoint;
  void save_checkpoint(const std::string& path, bool weights_only) override;
  void remove_checkpoint(const std::string& path) override;
  void link_checkpoint(const std::string& target, const std::string& path) override;
  void request_stop() override { st.should_stop = true; }
  std::string ckpt_path() const override { return started_from; }
  std::string log_dir() const override;
  bool is_global_zero() const override { return plan.strategy->is_global_zero(); }
  int64_t global_rank() const override { return plan.strategy->rank(); }
  int64_t world_size() const override { return plan.strategy->world_size(); }
  int64_t data_parallel_size() const override { return plan.strategy->data_shard().world_size; }
  bool reduce_boolean_decision(bool decision, bool all) override {
    return plan.strategy->reduce_boolean_decision(decision, all);
  }
  int64_t max_epochs() const override { return resolved_max_epochs(); }
  int64_t max_steps() const override { return opts.max_steps(); }
  int64_t estimated_stepping_batches() const override;
  at::Tensor all_gather(const at::Tensor& value, bool sync_grads) override;
  int64_t log_every_n_steps() const override { return opts.log_every_n_steps(); }
  std::vector<OptimizerConfig>& optimizer_configs() override { return optimizers; }
  void set_accumulate_grad_batches(int64_t batches) override;
  void check_accumulate_grad_batches(int64_t batches) const override;
  /// The loggers this process writes to: all of them on global rank 0, none elsewhere (one
  /// set of log files per job).
  const std::vector<std::shared_ptr<Logger>>& loggers() const override {
    return is_global_zero() ? loggers_ : no_loggers_;
  }
  /// Loggers that fast_dev_run muted count (Lightning's DummyLogger): a LearningRateMonitor
  /// then logs into nothing instead of failing the smoke test of a config that works.
  bool has_loggers() const override { return !loggers_.empty() || loggers_muted_; }
  Profiler& profiler() override { return prof != nullptr ? *prof : pass_through_; }
  Metrics device_stats() override { return strategy().accelerator().device_stats(); }
  std::string strategy_name() const override { return plan.strategy->name(); }
  void forward_training_data() override;
  const TrainerOptions& trainer_options() const override { return opts; }
  DataModule* data_module() override { return data != nullptr ? data : module_data; }
  const DataLoader* train_dataloader() const override { return fit_train; }
  const std::vector<int64_t>& predict_batch_indices() const override { return predict_indices; }
  void manual_backward(const at::Tensor& loss) override;
  void manual_step(size_t index) override;
  void manual_zero_grad(size_t index) override;
  void manual_count_step(size_t index) override;
  void step_lr_scheduler(LRScheduler& scheduler, c10::optional<double> metric) override;
  at::Tensor clip_gradients(torch::optim::Optimizer& optimizer, c10::optional<double> value,
                            c10::optional<ClipAlgorithm> algorithm) override;
  void zero_grad(torch::optim::Optimizer& optimizer) override;
  Batch batch_to_device(const Batch& batch) const override;
  /// Before on_before_optimizer_step: the loss scaler unscales the optimizer's gradients, so
  /// the hooks see true gradients (Lightning's MixedPrecision unscales "before the
  /// on_before_optimizer_step hook"); the step's own unscale is then a no-op. Not under the
  /// deepspeed strategy, whose step unscales its partitioned gradients.
  void unscale_for_hooks(torch::optim::Optimizer& optimizer);

  // ---------------------------------------------------------------- dispatch
  // Every hook goes through here: one place to time them and to keep Lightning's order: the
  // callbacks in registration order, then the module. (An epoch's end calls module_hook, then
  // reduces the epoch's values, then callback_hook: the callbacks read what the module logged.)
  template <typename MF, typename CF>
  void hook(const char* name, MF&& module_fn, CF&& callback_fn) {
    callback_hook(name, std::forward<CF>(callback_fn));
    module_hook(name, std::forward<MF>(module_fn));
  }
  template <typename MF>
  void module_hook(const char* name, MF&& module_fn) {
    Part part(*this, name);
    if (prof == nullptr) {
      module_fn(*module);
      return;
    }
    timed(std::string("[Module]") + name, [&] { module_fn(*module); });
  }
  template <typename CF>
  void callback_hook(const char* name, CF&& callback_fn) {
    for (auto& c : callbacks) call_callback(name, *c, callback_fn);
  }
  /// One callback's hook `name`, marked and timed as callback_hook does for each.
  template <typename CF>
  void call_callback(const char* name, Callback& c, CF& callback_fn) {
    Part part(*this, name, &c);
    if (prof == nullptr) {
      callback_fn(c);
      return;
    }
    timed("[Callback]" + c.state_key() + "." + name, [&] { callback_fn(c); });
  }
  /// Runs f as profiled action `action` (stop runs on exceptions too: f's error is the one
  /// thrown; a stop that fails after f returned, because f stopped the action itself, throws).
  template <typename F>
  void timed(const std::string& action, F&& f) {
    prof->start(action);
    try {
      f();
    } catch (...) {
      detail::stop_logging_errors(*prof, action);
      throw;
    }
    prof->stop(action);
  }
  /// The next batch of a stream, its fetch time profiled as `action`.
  bool next_batch(BatchStream& stream, Batch& batch, const char* action) {
    Part part(*this, action);
    ProfileScope p(prof, action);
    return stream.next(batch);
  }

  // ---------------------------------------------------------------- setup and limits
  int64_t resolved_max_epochs() const;
  /// The epochs a stop request waits for: min_epochs, or when it is unset 1 with min_steps set
  /// and 0 without (Lightning's _parse_loop_limits).
  int64_t resolved_min_epochs() const;
  /// With max_epochs unset: whether max_steps, max_time or a Timer bounds the fit (no epoch
  /// limit then; 1000 otherwise).
  bool unset_max_epochs_bounded() const;
  int64_t val_limit(const DataLoader& val) const;
  /// The limit val_limit applies and the option it comes from (overfit_batches,
  /// fast_dev_run's count or limit_val_batches).
  std::pair<Limit, const char*> val_limit_option() const;
  /// That limit is no batches: fit asks for no validation loaders (Lightning's setup_data).
  bool validation_off() const { return val_limit_option().first.resolve(1) == 0; }
  /// `limit` of a loader of `available` batches; a fraction that leaves no batch of a non-empty
  /// loader is a ConfigError naming `option` (Lightning's _parse_num_batches).
  static int64_t limit_batches(const Limit& limit, int64_t available, const char* option);
  /// overfit_batches is on (a count or fraction above 0).
  bool overfitting() const;
  /// The training batches per epoch of `train` after fast_dev_run, overfit_batches and
  /// limit_train_batches.
  int64_t train_limit(const DataLoader& train) const;
  void setup_run(Module& m, Stage stage);
  /// The module's configure_callbacks() merged into `callbacks` (Lightning's rules).
  void attach_model_callbacks(Module& m);
  /// The rules every callback list follows (the Trainer's, then with the module's): distinct
  /// state_keys (ConfigError), no ModelCheckpoint under fast_dev_run, checkpoints last.
  void arrange_callbacks();
  /// `data`'s setup(stage), remembered for its teardown (setup_run calls it).
  void setup_data(Stage stage);
  /// The DataModule's, then the module's prepare_data, where Strategy::run_preparation runs it
  /// (not in tuner trials).
  void prepare_data();
  /// `raw` through on_before_batch_transfer, transfer_batch_to_device (default: the strategy's
  /// batch_to_device) and on_after_batch_transfer, each the DataModule's when it overrides it,
  /// else the module's: every loop's batch.
  Batch transfer(Batch raw);
  /// The teardown hooks of the DataModule, the callbacks and the module whose setup ran, in
  /// Lightning's order (once: the flags are reset). With `failed` a hook's exception is logged
  /// instead of thrown.
  void teardown_hooks(Module& m, Stage stage, bool failed);
  bool data_set_up = false;     // `data`'s setup ran (the Trainer's entry points set it)
  size_t callbacks_set_up = 0;  // the callbacks whose setup ran, in order
  bool module_set_up = false;
  /// With several processes, every rank learns rank 0's log_dir() (a collective): at set-up,
  /// and again after a checkpoint restored the loggers' version folder.
  void share_log_dir();
  /// A digest of what every rank must agree on (loop settings, model parameter shapes).
  std::string config_fingerprint() const;
  /// `text` as rank `src` has it, on every rank (a collective; identity for one process).
  std::string broadcast_string(const std::string& text, int64_t src = 0) const;
  void setup_optimizers();
  /// Steps the schedulers of `interval` that are due: those monitoring no metric, or with
  /// `monitored` those that monitor one (ReduceLROnPlateau's kind), which the loop steps after
  /// what they read exists: after the step's validation, after the epoch's metrics are reduced
  /// and its end hooks ran (Lightning's update_plateau_schedulers).
  void step_schedulers(Interval interval, bool monitored = false);
  /// After optimizer `index` stepped under manual optimization: its step-interval scheduler
  /// (one monitoring no metric) when due; the other optimizers' schedulers do not move.
  void step_schedulers_of(size_t index);
  /// Steps `c`'s scheduler when `count` (its optimizer's steps, or epochs) is a multiple of its
  /// frequency, with the monitored metric when it has one.
  void step_scheduler_if_due(OptimizerConfig& c, int64_t count);
  /// The optimizer steps each optimizer took in this fit: the global step under automatic
  /// optimization (one optimizer), each one's own count under manual optimization. A
  /// step-interval scheduler's frequency counts its optimizer's steps.
  std::vector<int64_t> optimizer_step_counts() const;
  /// The step-interval schedulers that monitor a metric, for each optimizer's steps after
  /// `since` (optimizer_step_counts() at the batch's start) up to now, each due step once:
  /// manual optimization may step several times in a batch.
  void step_monitored_schedulers(const std::vector<int64_t>& since);
  /// Manual optimization's per-optimizer step counts (optimizer_step_counts()).
  std::vector<int64_t> manual_steps;
  /// The steps after these counts still owe the monitored schedulers their steps, which the
  /// validation due now takes (empty: none). Checkpointed with val_pending.
  std::vector<int64_t> monitored_steps_since;
  /// `loader` sharded by the strategy's data_shard() when use_distributed_sampler is on, the
  /// job has several processes and the loader is not sharded already; else `loader` itself.
  /// For prediction (`predict`) each sample goes to one rank only (Lightning's
  /// UnrepeatedDistributedSampler) unless the strategy's steps run in lockstep.
  DataLoader shard(const DataLoader& loader, bool predict = false) const;

  // ---------------------------------------------------------------- stopping
  /// Seconds of training in this run, resumed attempts included (0 before any fit).
  double fit_elapsed() const;
  /// Combines this rank's stop requests (a signal; in fit also request_stop() and max_time)
  /// with the other ranks' (Strategy::agree_on_stop, `lagged` as there), sets stop_agreed and
  /// time_up once agreed, and throws Interrupted when a rank received a stop signal.
  void check_stop(bool lagged, bool in_fit);
  /// validate/test/predict's check: at each batch end (`pass_done` false) in one process, once
  /// after the pass (`pass_done` true) with several, since a user's evaluation loaders need not
  /// give every rank as many batches and a vote per batch could leave one rank waiting.
  void check_stop_in_evaluation(bool pass_done);

  // ---------------------------------------------------------------- metrics
  void refresh_cache() const;
  int64_t log_step() const { return std::max<int64_t>(st.global_step - 1, 0); }
  /// Rank 0 sends `m` to the loggers as Lightning's LoggerConnector.log_metrics: a logged "step"
  /// value is the row's step (not a column); otherwise the row is at `at_step` when given (an
  /// evaluation batch's values), else at log_step() with the epoch.
  void send_to_loggers(const Metrics& m, c10::optional<int64_t> at_step = c10::nullopt);
  /// At a training epoch's end: the step values logged in it stay readable (callback_metrics,
  /// the progress bar) but reach no later row (Lightning resets its step results per epoch; a
  /// value logged once was repeated in every later row).
  void end_epoch_step_values();
  /// Sends the module's saved hyper-parameters to the loggers (rank 0's; none elsewhere), as
  /// Lightning's Trainer._run does at the start of every entry point, after the restore (a
  /// resumed logger writes into its restored version folder; logging first would make it open
  /// the next free one). Sent even when empty: a CSV logger still writes hparams.yaml and its
  /// folder, as Lightning's writes them when it saves (TensorBoard's hp_metric needs some).
  void log_hparams();
  /// Writes every logger's buffered rows (Logger::save); a failure is a warning.
  void save_loggers();
  /// Reduces a stage's epoch metrics, makes them visible to monitors and the progress bar and
  /// sends them to the loggers; returns those sent (not the ones logged with logger(false)): an
  /// evaluation entry point's result, as Lightning's metrics["log"].
  Metrics flush_epoch(MetricStore& store);

  /// Runs `body` as entry point `stage`: sets the run up, and on any exception tells callbacks
  /// and loggers, tears down and rethrows. Checkpoints on disk are never touched on failure.
  template <typename F>
  void guarded(Module& m, Stage stage, F&& body);
};

// ---------------------------------------------------------------------- checkpoint_state.cpp
/// Assembles the full checkpoint (weights, optimizers, loop, RNG, callbacks, loggers, ...), or
/// with weights_only the weights, the loop counters, the DataModule's and the module's state.
void write_checkpoint(Run& run, torch::serialize::OutputArchive& root, bool weights_only = false);
/// CheckpointError unless `root` is a checkpoint of the format this volt's Trainer writes.
void check_format(torch::serialize::InputArchive& root, const std::string& path);
/// Restores a checkpoint; `full` = everything (resume), else the weights, the module's
/// on_load_checkpoint and the DataModule's state (validate/test/predict). Returns whether the
/// checkpoint held the running DataModule's state (read into it).
bool restore_checkpoint(Run& run, const std::string& path, bool full);
/// Resolves ckpt_path "last" / "best" through the run's ModelCheckpoint callbacks; other paths
/// are returned unchanged. "last" with no checkpoint on disk returns "" (start fresh, warned).
std::string resolve_ckpt_path(Run& run, const std::string& ckpt_path, Stage stage);
/// The newest last checkpoint of the run's ModelCheckpoints, "" when there is none.
std::string newest_last_checkpoint(Run& run);

// ---------------------------------------------------------------------- loops/
/// loops/fit_loop.cpp: "batch: 64 samples per process x 2 data-parallel processes x 4
/// accumulated batches = 512 samples per optimizer step", logged when fit starts; with
/// `last_batch` (the epoch's last batch on each process) smaller than `per_process`, it adds
/// "; the last batch of each epoch has 10 samples per process".
std::string describe_global_batch(int64_t per_process, int64_t data_parallel, int64_t accumulate,
                                  int64_t last_batch = 0);
/// A DataModule's loaders for `epoch` (reload_dataloaders_every_n_epochs): the training loader
/// and the validation loaders, asked for apart, as Lightning reloads each on its own schedule.
/// Either may be unset: that loader is not rebuilt (fit(module, train) reloads only the
/// module's validation loaders).
struct LoaderReload {
  std::function<DataLoader(int64_t epoch)> train;
  std::function<std::vector<DataLoader>(int64_t epoch)> val;
  explicit operator bool() const { return train || val; }
};
/// loops/fit_loop.cpp: the whole of fit() after set-up. `reload`, when set, is how the loop gets
/// new loaders (fit from a DataModule); without it the given loaders serve every epoch.
void fit_loop(Run& run, DataLoader& train, std::vector<DataLoader>& val,
              const std::string& ckpt_path, const LoaderReload& reload = {});
/// loops/evaluation_loop.cpp: one validation or test pass, over `limits[i]` batches of each
/// loader in turn. Returns each loader's epoch metrics (what was logged during its batches and
/// what the epoch hooks logged); `merged`, when given, gets them all in one map.
std::vector<Metrics> evaluation_loop(Run& run, Stage stage, std::vector<DataLoader>& loaders,
                                     const std::vector<int64_t>& limits, Metrics* merged = nullptr);
/// loops/prediction_loop.cpp: predict_step over `limits[i]` batches of each loader in turn; the
/// outputs per loader.
std::vector<std::vector<at::Tensor>> prediction_loop(Run& run, std::vector<DataLoader>& loaders,
                                                     const std::vector<int64_t>& limits);

}  // namespace detail
}  // namespace volt
