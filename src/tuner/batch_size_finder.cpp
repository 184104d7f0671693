// scale_batch_size: trials of a Trainer entry point at changing batch sizes, each in a Trainer
// of its own (as lr_find), classified by whether they ran out of memory.
#include "volt/tuner/batch_size_finder.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>

#include "core/detail/numbers.h"
#include "core/detail/out_of_memory.h"
#include "core/detail/print.h"
#include "data/detail/module_data.h"
#include "data/detail/stage_loaders.h"
#include "trainer/detail/tuner_trial.h"
#include "tuner/detail/trial.h"
#include "volt/accelerators/cpu_memory.h"
#include "volt/core/check.h"
#include "volt/core/log.h"
#include "volt/strategies/strategy.h"
#include "volt/trainer/trainer.h"

namespace volt {
namespace {

constexpr const char* kTag = "[scale_batch_size]";
constexpr const char* kComponent = "scale_batch_size";

std::string mib(int64_t bytes) {
  auto s = detail::c_stream<std::ostringstream>();
  s.precision(3);
  s << static_cast<double>(bytes) / (1 << 20) << " MiB";
  return s.str();
}

// The Trainer logs an error naming the step for every failure that is not volt's. A trial that
// runs out of memory is an answer here, not a failure: its error lines are held back while it
// runs and dropped when it turns out to be one; every other line passes through.
class HoldErrorLines {
 public:
  HoldErrorLines() {
    previous_ = set_log_sink([this](LogLevel level, const std::string& line) {
      if (level == LogLevel::kError) {
        held_.push_back(line);
      } else {
        forward(level, line);
      }
    });
  }
  ~HoldErrorLines() { release(/*keep=*/true); }
  HoldErrorLines(const HoldErrorLines&) = delete;
  HoldErrorLines& operator=(const HoldErrorLines&) = delete;

  void release(bool keep) {
    if (released_) return;
    released_ = true;
    set_log_sink(previous_);
    if (keep) {
      for (const auto& line : held_) forward(LogLevel::kError, line);
    }
  }

 private:
  void forward(LogLevel level, const std::string& line) const {
    if (previous_) {
      previous_(level, line);
    } else {
      std::fprintf(stderr, "%s\n", line.c_str());
      std::fflush(stderr);
    }
  }
  LogSink previous_;
  std::vector<std::string> held_;
  bool released_ = false;
};

// set_cpu_memory_limit for one trial, put back afterwards.
class MemoryLimitScope {
 public:
  explicit MemoryLimitScope(int64_t limit) : previous_(cpu_memory_limit()) {
    set_cpu_memory_limit(limit);
  }
  ~MemoryLimitScope() { set_cpu_memory_limit(previous_); }
  MemoryLimitScope(const MemoryLimitScope&) = delete;
  MemoryLimitScope& operator=(const MemoryLimitScope&) = delete;

 private:
  int64_t previous_;
};

TrainerOptions stage_trial_options(TrainerOptions options, const BatchSizeFinderOptions& f) {
  TrainerOptions o = detail::trial_options(std::move(options));
  switch (f.stage()) {
    case Stage::kFit:
      o.max_steps(f.steps_per_trial()).limit_train_batches(1.0).limit_val_batches(0);
      break;
    case Stage::kValidate: o.limit_val_batches(f.steps_per_trial()); break;
    case Stage::kTest: o.limit_test_batches(f.steps_per_trial()); break;
    case Stage::kPredict: o.limit_predict_batches(f.steps_per_trial()); break;
    default: break;  // refused by validate()
  }
  return o;
}

// The rows of the loader's data set; for a combined loader its largest loader's (a larger batch
// changes none of its batches).
int64_t largest_data_set(const DataLoader& loader) {
  if (!loader.is_combined()) return loader.dataset().size();
  int64_t rows = 0;
  for (const auto& part : loader.parts()) rows = std::max(rows, largest_data_set(part.second));
  return rows;
}

class Search {
 public:
  Search(Module& module, const std::function<DataLoader(int64_t)>& make_loader, DataModule* hooks,
         TrainerOptions options, BatchSizeFinderOptions finder,
         std::shared_ptr<Callback> trial_callback)
      : module_(module),
        make_loader_(make_loader),
        hooks_(hooks),
        options_(stage_trial_options(std::move(options), finder).callbacks({trial_callback})),
        finder_(std::move(finder)) {}

  BatchSizeFinderResult run() {
    {
      Trainer probe(options_);
      VOLT_CHECK(probe.strategy().world_size() == 1, ConfigError, kTag,
                 " the options make a run of ", probe.strategy().world_size(),
                 " processes; the search runs in one process (as Lightning's). Find the size "
                 "with devices=1 and num_nodes=1, then give each process of the real run that "
                 "size.");
    }
    int64_t size = finder_.init_val();
    int64_t cap = largest_data_set(make_loader_(size));
    if (finder_.max_val()) cap = std::min(cap, *finder_.max_val());
    cap = std::max<int64_t>(cap, 1);
    size = std::min(size, cap);
    int64_t low = 0;              // the largest size that fitted
    c10::optional<int64_t> high;  // the smallest size that ran out of memory
    const bool power = finder_.mode() == BatchSizeScaling::kPower;
    // Trials counted against max_trials: every one in power mode, those that fitted in binsearch
    // (Lightning's _run_binsearch_scaling; failures are bounded by the search converging). A
    // binsearch of max_trials 3 where 8 fails and 6 fits stopped at 4 (2, 4, 8); it reaches 6.
    int64_t counted = 0;
    for (;;) {
      const BatchSizeTrial& t = run_trial(size);
      if (power || t.fits) ++counted;
      bool done = false;
      int64_t next = size;
      if (t.fits) {
        low = std::max(low, size);
        if (high && power) {
          done = true;  // twice this size already ran out of memory
        } else {
          next = high ? (low + *high) / 2 : (size > cap / 2 ? cap : size * 2);
        }
      } else {
        high = high ? std::min(*high, size) : size;
        if (power && low > 0) {
          done = true;
        } else {
          next = (low + *high) / 2;
          VOLT_CHECK(next > 0, NotAvailable, kTag, " even a batch of ", size,
                     " runs out of memory (", last_error_,
                     "); the model does not fit: make it smaller, shard it "
                     "(deepspeed_stage_3) or raise max_memory_bytes.");
        }
      }
      // Converged: the cap reached, or nothing left between what fitted and what did not.
      done = done || next == size || next == low;
      std::string line = "batch size " + std::to_string(size) +
                         (t.fits ? " fits" : " ran out of memory (" + last_error_ + ")");
      if (t.fits && t.peak_bytes >= 0) line += ", peak " + mib(t.peak_bytes);
      done = done || counted >= finder_.max_trials();
      if (!done) line += "; trying " + std::to_string(next);
      log_info(kComponent, line + ".");
      if (done) break;
      size = next;
    }
    VOLT_CHECK(low > 0, NotAvailable, kTag, " no batch size fitted in ", finder_.max_trials(),
               " trial(s) (the last: ", last_error_,
               "); start lower (init_val) or allow more "
               "trials (max_trials).");
    result_.batch_size = low;
    std::string why = "the largest that fitted";
    if (!power && finder_.margin() > 0) {
      result_.batch_size = std::max<int64_t>(
          1, static_cast<int64_t>(static_cast<double>(low) * (1.0 - finder_.margin())));
      why += " (" + std::to_string(low) + ") less the margin of " +
             std::to_string(static_cast<int>(std::lround(finder_.margin() * 100))) + "%";
    } else if (low == cap && !high) {
      why += ", capped at " + std::to_string(cap) +
             (finder_.max_val() && cap == *finder_.max_val() ? " (max_val)" : " (the data set)");
    }
    log_info(kComponent, "batch size " + std::to_string(result_.batch_size) + ": " + why +
                             ", after " + std::to_string(result_.trials.size()) + " trial(s).");
    return std::move(result_);
  }

 private:
  const BatchSizeTrial& run_trial(int64_t size) {
    DataLoader loader = make_loader_(size);
    BatchSizeTrial t;
    t.batch_size = size;
    c10::optional<MemoryLimitScope> limit;
    const bool counted = finder_.max_memory_bytes() || counting_cpu_allocator_installed();
    int64_t before = 0;
    if (counted) {
      install_counting_cpu_allocator();
      before = cpu_memory_stats().in_use;
      reset_cpu_memory_peaks();
    }
    if (finder_.max_memory_bytes()) limit.emplace(before + *finder_.max_memory_bytes());
    HoldErrorLines hold;
    try {
      detail::TunerTrialScope trial;  // no configure_callbacks() in a trial
      Trainer trainer(options_);
      detail::run_trial_stage(trainer, module_, finder_.stage(), loader, hooks_);
      t.fits = true;
    } catch (const std::exception& e) {
      if (!detail::is_out_of_memory(e)) throw;  // its error lines pass through
      hold.release(/*keep=*/false);
      last_error_ = detail::first_line(e.what());
    }
    if (counted) t.peak_bytes = std::max<int64_t>(0, cpu_memory_stats().max_in_use - before);
    result_.trials.push_back(t);
    return result_.trials.back();
  }

  Module& module_;
  const std::function<DataLoader(int64_t)>& make_loader_;
  DataModule* hooks_;  // the DataModule whose batch hooks the trials run, or null
  TrainerOptions options_;
  BatchSizeFinderOptions finder_;
  BatchSizeFinderResult result_;
  std::string last_error_;
};

BatchSizeFinderResult search(Module& module, const std::function<DataLoader(int64_t)>& make_loader,
                             DataModule* hooks, TrainerOptions options,
                             BatchSizeFinderOptions finder) {
  finder.validate();
  if (options.fast_dev_run() > 0) {
    log_warning(kComponent, "skipped: fast_dev_run is on (as Lightning).");
    return {};
  }
  detail::ModuleSnapshot snapshot(module, kTag);
  try {
    BatchSizeFinderResult r = Search(module, make_loader, hooks, std::move(options), finder,
                                     snapshot.after_configure_model())
                                  .run();
    snapshot.restore();
    return r;
  } catch (...) {
    snapshot.restore();
    throw;
  }
}

}  // namespace

void BatchSizeFinderOptions::validate() const {
  VOLT_CHECK(steps_per_trial_ >= 1, ConfigError, kTag, " steps_per_trial=", steps_per_trial_,
             " must be >= 1.");
  VOLT_CHECK(init_val_ >= 1, ConfigError, kTag, " init_val=", init_val_,
             " must be >= 1 (the first batch size tried).");
  VOLT_CHECK(max_trials_ >= 1, ConfigError, kTag, " max_trials=", max_trials_, " must be >= 1.");
  VOLT_CHECK(std::isfinite(margin_) && margin_ >= 0 && margin_ < 1, ConfigError, kTag,
             " margin=", margin_, " must be in [0, 1) (a fraction of the size found).");
  VOLT_CHECK(!max_val_ || *max_val_ >= init_val_, ConfigError, kTag,
             " max_val=", max_val_.value_or(0), " is below init_val=", init_val_,
             "; raise max_val or lower init_val.");
  VOLT_CHECK(!max_memory_bytes_ || *max_memory_bytes_ >= 1, ConfigError, kTag,
             " max_memory_bytes=", max_memory_bytes_.value_or(0), " must be >= 1 (or unset).");
  VOLT_CHECK(stage_ == Stage::kFit || stage_ == Stage::kValidate || stage_ == Stage::kTest ||
                 stage_ == Stage::kPredict,
             ConfigError, kTag, " stage=", to_string(stage_),
             " is not an entry point; use kFit, kValidate, kTest or kPredict.");
}

BatchSizeFinderResult scale_batch_size(Module& module,
                                       const std::function<DataLoader(int64_t)>& make_loader,
                                       TrainerOptions options, BatchSizeFinderOptions finder) {
  VOLT_CHECK(static_cast<bool>(make_loader), ConfigError, kTag,
             " make_loader is empty; pass a function that builds the loader at a batch size.");
  return search(module, make_loader, nullptr, std::move(options), std::move(finder));
}

BatchSizeFinderResult scale_batch_size(Module& module, DataModule& data, TrainerOptions options,
                                       BatchSizeFinderOptions finder) {
  const Stage stage = finder.stage();
  detail::prepare_data_once(module, data);
  data.setup(stage);
  BatchSizeFinderResult result;
  try {
    result = detail::scale_data_module(module, data, std::move(options), std::move(finder));
  } catch (...) {
    data.teardown(stage);
    throw;
  }
  data.teardown(stage);
  return result;
}

BatchSizeFinderResult scale_batch_size(Module& module, TrainerOptions options,
                                       BatchSizeFinderOptions finder) {
  detail::ModuleData data(module);
  return scale_batch_size(module, data, std::move(options), std::move(finder));
}

namespace detail {

BatchSizeFinderResult scale_data_module(Module& module, DataModule& data, TrainerOptions options,
                                        BatchSizeFinderOptions finder) {
  const c10::optional<int64_t> original = data.batch_size();
  const bool own = dynamic_cast<const ModuleData*>(&data) != nullptr;
  VOLT_CHECK(original.has_value(), ConfigError, kTag, " the ",
             own ? "module (whose loaders the search uses)" : "DataModule",
             " does not say its batch size; override ", own ? "Module" : "DataModule",
             "::batch_size() and set_batch_size(int64_t) so that the search can size its "
             "loaders.");
  const Stage stage = finder.stage();
  const std::function<DataLoader(int64_t)> make_loader = [&](int64_t size) {
    data.set_batch_size(size);
    if (stage == Stage::kFit) return data.train_dataloader();
    // The first loader, when the DataModule has several (they share the batch size).
    std::vector<DataLoader> l = stage_loaders(data, stage, /*required=*/false);
    VOLT_CHECK(!l.empty(), ConfigError, kTag, " stage ", to_string(stage),
               " needs the DataModule's ", to_string(stage), " loader; override it.");
    return l.front();
  };
  BatchSizeFinderResult result;
  try {
    result = search(module, make_loader, &data, std::move(options), std::move(finder));
  } catch (...) {
    data.set_batch_size(*original);
    throw;
  }
  data.set_batch_size(result.batch_size > 0 ? result.batch_size : *original);
  return result;
}

}  // namespace detail

}  // namespace volt
