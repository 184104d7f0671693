#include "volt/trainer/trainer_options.h"

#include <cmath>
#include <ostream>
#include <sstream>

#include "core/detail/print.h"
#include "volt/core/check.h"
#include "volt/core/loop_state.h"

namespace volt {

TrainerOptions& TrainerOptions::barebones(bool on) {
  barebones_ = on;
  if (on) {
    enable_checkpointing_ = false;
    logger_ = false;
    enable_progress_bar_ = false;
    enable_model_summary_ = false;
    num_sanity_val_steps_ = 0;
    detect_nonfinite_loss_ = false;
  }
  return *this;
}

namespace {

// Lightning's wording: what was passed, and why barebones turns it off.
void check_barebones(bool off, const char* passed, const char* why) {
  VOLT_CHECK(off, ConfigError, "[Trainer] barebones=true with ", passed, ": ", why,
             ", so barebones mode turns it off; drop one of the two.");
}

}  // namespace

void TrainerOptions::validate() const {
  graph_options_.validate();
  if (barebones_) {
    check_barebones(!enable_checkpointing_, "enable_checkpointing=true",
                    "checkpointing can impact raw speed");
    check_barebones(!logger_, "logger=true", "logging can impact raw speed");
    check_barebones(loggers_.empty(), "a logger in loggers", "logging can impact raw speed");
    check_barebones(!enable_progress_bar_, "enable_progress_bar=true",
                    "the progress bar can impact raw speed");
    check_barebones(!enable_model_summary_, "enable_model_summary=true",
                    "the model summary can impact raw speed");
    check_barebones(num_sanity_val_steps_ == 0, "num_sanity_val_steps != 0",
                    "the sanity check can impact raw speed");
    check_barebones(!detect_nonfinite_loss_, "detect_nonfinite_loss=true",
                    "reading the loss to check it can impact raw speed");
    check_barebones(fast_dev_run_ == 0, "fast_dev_run > 0",
                    "a development run is not a measurement");
    check_barebones(!detect_anomaly_, "detect_anomaly=true",
                    "anomaly detection checks every gradient on the host");
    check_barebones(profiler_ == nullptr, "a profiler", "profiling can impact raw speed");
  }
  VOLT_CHECK(!(graph_training_step_ && trace_training_step_), ConfigError,
             "[Trainer] graph_training_step and trace_training_step are both set; a CUDA graph "
             "replays the step's kernels as captured, a trace replaces some of them with fused "
             "CPU loops: choose one (graphs on CUDA, the trace on CPU).");
  VOLT_CHECK(!max_epochs_ || *max_epochs_ >= -1, ConfigError,
             "[Trainer] max_epochs=", max_epochs_.value_or(0),
             " is invalid; pass a number of epochs >= 0, -1 for no limit, or leave it unset.");
  VOLT_CHECK(num_nodes_ >= 1, ConfigError, "[Trainer] num_nodes=", num_nodes_,
             " is invalid; pass the number of nodes (>= 1).");
  VOLT_CHECK(min_epochs_.value_or(0) >= 0, ConfigError,
             "[Trainer] min_epochs=", min_epochs_.value_or(0),
             " is negative; pass 0 or more, or leave it unset.");
  VOLT_CHECK(max_epochs_.value_or(-1) < 0 || min_epochs_.value_or(0) <= *max_epochs_, ConfigError,
             "[Trainer] min_epochs=", min_epochs_.value_or(0),
             " exceeds max_epochs=", max_epochs_.value_or(-1), "; lower min_epochs.");
  VOLT_CHECK(max_steps_ >= -1, ConfigError, "[Trainer] max_steps=", max_steps_,
             " is invalid; pass a step count >= 0, or -1 for no limit.");
  VOLT_CHECK(min_steps_.value_or(0) >= 0, ConfigError,
             "[Trainer] min_steps=", min_steps_.value_or(0),
             " is negative; pass 0 or more, or leave it unset.");
  VOLT_CHECK(max_steps_ < 0 || min_steps_.value_or(0) <= max_steps_, ConfigError,
             "[Trainer] min_steps=", min_steps_.value_or(0), " exceeds max_steps=", max_steps_,
             "; lower min_steps.");
  // 0 as Lightning's "00:00:00:00": the fit trains nothing.
  VOLT_CHECK(!max_time_ || (std::isfinite(*max_time_) && *max_time_ >= 0), ConfigError,
             "[Trainer] max_time=", max_time_ ? *max_time_ : 0.0,
             " seconds is invalid; pass a number of seconds >= 0.");
  limit_train_batches_.validate("limit_train_batches");
  limit_val_batches_.validate("limit_val_batches");
  limit_test_batches_.validate("limit_test_batches");
  limit_predict_batches_.validate("limit_predict_batches");
  overfit_batches_.validate("overfit_batches");
  val_check_interval_.validate("val_check_interval");
  // A fraction of 0.0 validates after every batch (Lightning's max(1, int(batches * 0.0))).
  VOLT_CHECK(val_check_interval_.is_fraction() || val_check_interval_.count() > 0, ConfigError,
             "[Trainer] val_check_interval=", val_check_interval_,
             " batches must be > 0; to skip validation use limit_val_batches=0.");
  VOLT_CHECK(!check_val_every_n_epoch_ || *check_val_every_n_epoch_ >= 1, ConfigError,
             "[Trainer] check_val_every_n_epoch=", *check_val_every_n_epoch_,
             " must be >= 1, or unset (None) to count val_check_interval over the whole fit.");
  const bool by_time = val_check_interval_s_.has_value();
  VOLT_CHECK(!by_time || (std::isfinite(*val_check_interval_s_) && *val_check_interval_s_ >= 0),
             ConfigError, "[Trainer] val_check_interval_s=", val_check_interval_s_.value_or(0),
             " is no duration; give the seconds of training between validations, >= 0.");
  VOLT_CHECK(
      !by_time || (val_check_interval_.is_fraction() && val_check_interval_.fraction() == 1.0),
      ConfigError, "[Trainer] val_check_interval=", val_check_interval_,
      " and val_check_interval_s=", val_check_interval_s_.value_or(0),
      " both say when to validate; keep one (val_check_interval stays 1.0 with "
      "val_check_interval_s).");
  // Lightning's _DataConnector.on_trainer_init.
  VOLT_CHECK(by_time || check_val_every_n_epoch_ || !val_check_interval_.is_fraction(), ConfigError,
             "[Trainer] val_check_interval=", val_check_interval_,
             " is a fraction of an epoch, but check_val_every_n_epoch is unset (None), which "
             "counts the fit's batches over epochs; give val_check_interval as a count of "
             "batches, e.g. 1000, or set check_val_every_n_epoch.");
  VOLT_CHECK(reload_dataloaders_every_n_epochs_ >= 0, ConfigError,
             "[Trainer] reload_dataloaders_every_n_epochs=", reload_dataloaders_every_n_epochs_,
             " must be >= 0 (0 = load the loaders once).");
  VOLT_CHECK(num_sanity_val_steps_ >= -1, ConfigError,
             "[Trainer] num_sanity_val_steps=", num_sanity_val_steps_,
             " is invalid; pass >= 0, or -1 for all batches.");
  VOLT_CHECK(fast_dev_run_ >= 0, ConfigError, "[Trainer] fast_dev_run=", fast_dev_run_,
             " is negative; pass 0 (off) or a number of batches.");
  VOLT_CHECK(accumulate_grad_batches_ >= 1, ConfigError,
             "[Trainer] accumulate_grad_batches=", accumulate_grad_batches_, " must be >= 1.");
  VOLT_CHECK(
      !gradient_clip_val_ || (std::isfinite(*gradient_clip_val_) && *gradient_clip_val_ >= 0),
      ConfigError, "[Trainer] gradient_clip_val=", *gradient_clip_val_,
      " is invalid; pass a finite value >= 0.");
  VOLT_CHECK(log_every_n_steps_ >= 1, ConfigError,
             "[Trainer] log_every_n_steps=", log_every_n_steps_, " must be >= 1.");
  VOLT_CHECK(num_threads_ >= 0, ConfigError, "[Trainer] num_threads=", num_threads_,
             " is negative; pass 0 for volt's default or a thread count.");
  // OpenMP starts every thread asked for: 1e5 hangs the machine, 1e11 aborts in libgomp.
  constexpr int64_t kMaxThreads = 1024;
  VOLT_CHECK(num_threads_ <= kMaxThreads, ConfigError, "[Trainer] num_threads=", num_threads_,
             " is more than ", kMaxThreads,
             " threads; pass at most the CPU cores to use (0: volt's default).");
  VOLT_CHECK(progress_refresh_s_ > 0, ConfigError,
             "[Trainer] progress_refresh_s=", progress_refresh_s_, " must be > 0.");
  VOLT_CHECK(!default_root_dir_.empty(), ConfigError,
             "[Trainer] default_root_dir is empty; pass a folder (e.g. \".\").");
  for (const auto& c : callbacks_) {
    VOLT_CHECK(c != nullptr, ConfigError, "[Trainer] callbacks contains a null pointer.");
  }
  for (const auto& l : loggers_) {
    VOLT_CHECK(l != nullptr, ConfigError, "[Trainer] loggers contains a null pointer.");
  }
}

std::ostream& operator<<(std::ostream& os, const TrainerOptions& o) {
  using detail::optional_text;
  os << "TrainerOptions(accelerator=" << o.accelerator() << ", devices=" << o.devices()
     << ", num_nodes=" << o.num_nodes() << ", strategy=" << o.strategy()
     << ", precision=" << o.precision() << ", max_epochs=" << optional_text(o.max_epochs())
     << ", min_epochs=" << optional_text(o.min_epochs()) << ", max_steps=" << o.max_steps()
     << ", min_steps=" << optional_text(o.min_steps())
     << ", max_time=" << optional_text(o.max_time())
     << ", limit_train_batches=" << o.limit_train_batches()
     << ", limit_val_batches=" << o.limit_val_batches()
     << ", limit_test_batches=" << o.limit_test_batches()
     << ", limit_predict_batches=" << o.limit_predict_batches()
     << ", val_check_interval=" << o.val_check_interval()
     << ", check_val_every_n_epoch=" << detail::optional_text(o.check_val_every_n_epoch())
     << ", val_check_interval_s=" << optional_text(o.val_check_interval_s())
     << ", reload_dataloaders_every_n_epochs=" << o.reload_dataloaders_every_n_epochs()
     << ", return_predictions=" << o.return_predictions()
     << ", num_sanity_val_steps=" << o.num_sanity_val_steps()
     << ", fast_dev_run=" << o.fast_dev_run() << ", overfit_batches=" << o.overfit_batches()
     << ", accumulate_grad_batches=" << o.accumulate_grad_batches()
     << ", gradient_clip_val=" << optional_text(o.gradient_clip_val())
     << ", gradient_clip_algorithm=" << to_string(o.gradient_clip_algorithm())
     << ", log_every_n_steps=" << o.log_every_n_steps()
     << ", enable_progress_bar=" << o.enable_progress_bar()
     << ", enable_checkpointing=" << o.enable_checkpointing()
     << ", enable_model_summary=" << o.enable_model_summary() << ", logger=" << o.logger()
     << ", default_root_dir=" << detail::quoted(o.default_root_dir())
     << ", use_distributed_sampler=" << o.use_distributed_sampler()
     << ", sync_batchnorm=" << o.sync_batchnorm() << ", deterministic=" << o.deterministic()
     << ", benchmark=" << optional_text(o.benchmark()) << ", seed=" << optional_text(o.seed())
     << ", detect_nonfinite_loss=" << o.detect_nonfinite_loss()
     << ", inference_mode=" << o.inference_mode() << ", barebones=" << o.barebones()
     << ", detect_anomaly=" << o.detect_anomaly() << ", handle_signals=" << o.handle_signals()
     << ", graph_training_step=" << o.graph_training_step()
     << ", graph_options=" << o.graph_options()
     << ", trace_training_step=" << o.trace_training_step() << ", num_threads=" << o.num_threads()
     << ", reuse_host_memory=" << o.reuse_host_memory()
     << ", progress_refresh_s=" << o.progress_refresh_s() << ", callbacks=" << o.callbacks().size()
     << ", loggers=" << o.loggers().size() << ", profiler=" << (o.profiler() ? "set" : "none")
     << ", checkpoint_io=" << (o.checkpoint_io() ? "set" : "strategy's") << ")";
  return os;
}

}  // namespace volt
