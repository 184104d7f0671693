#include "volt/callbacks/throughput_monitor.h"

#include <ostream>

#include "core/detail/log_cadence.h"
#include "volt/core/check.h"
#include "volt/core/run_context.h"
#include "volt/loggers/logger.h"
#include "volt/profiler/throughput.h"

namespace volt {

// Lightning's RunningStage values, the keys' first part.
const char* ThroughputMonitor::loop_key(Loop loop) {
  switch (loop) {
    case Loop::kTrain: return "train";
    case Loop::kFitValidation:
    case Loop::kValidate: return "validate";
    case Loop::kTest: return "test";
    case Loop::kPredict: return "predict";
  }
  return "unknown";
}

namespace {

void require_logger(const RunContext& run) {
  VOLT_CHECK(run.has_loggers(), ConfigError,
             "[ThroughputMonitor] the Trainer has no logger, so the throughput would go "
             "nowhere; add a logger (TrainerOptions::logger(true) or loggers({...})) or drop the "
             "callback.");
}

int64_t checked(const char* what, int64_t n, int64_t least) {
  VOLT_CHECK(n >= least, ValueError, "[ThroughputMonitor] ", what, " returned ", n,
             "; return the number of ",
             least > 0 ? "samples in the batch (1 or more)" : "items in the batch (0 or more)",
             ", read from sizes.");
  return n;
}

// The monitor's options as one window's.
ThroughputOptions throughput_options(const ThroughputMonitorOptions& o, int64_t world_size) {
  return ThroughputOptions()
      .available_flops(o.available_flops())
      .world_size(world_size)
      .window_size(o.window_size())
      .separator(o.separator())
      .using_sparse_model(o.using_sparse_model())
      .sparse_cuda_acceleration_factor(o.sparse_cuda_acceleration_factor());
}

}  // namespace

// One loop's window, clock and totals (rank 0 only).
struct ThroughputMonitor::StageClock {
  std::unique_ptr<Throughput> throughput;  // a new window at every start
  Clock::time_point t0;                    // the start, moved on past a fit's validation
  double last_time = -1;                   // seconds at the last update
  int64_t batches = 0, samples = 0, lengths = 0;
  int64_t unrecorded = 0;   // batches since the last update (a clock that did not advance)
  int64_t run_batches = 0;  // evaluation: this run's batches, the logging gate
  int64_t iterations = 0;   // evaluation: the loop's batches over its runs, the rows' step
};

std::ostream& operator<<(std::ostream& os, const ThroughputMonitorOptions& o) {
  os << "ThroughputMonitorOptions(batch_size_fn=" << (o.batch_size_fn() ? "custom" : "Batch::size")
     << ", length_fn=" << (o.length_fn() ? "custom" : "none")
     << ", flops_per_batch=" << o.flops_per_batch()
     << ", eval_flops_per_batch=" << o.eval_flops_per_batch() << ", available_flops=";
  if (o.available_flops()) {
    os << *o.available_flops();
  } else {
    os << "none";
  }
  os << ", window_size=" << o.window_size() << ", separator=\"" << o.separator()
     << "\", using_sparse_model=";
  if (o.using_sparse_model()) {
    os << (*o.using_sparse_model() ? "true" : "false");
  } else {
    os << "none";
  }
  return os << ", sparse_cuda_acceleration_factor=" << o.sparse_cuda_acceleration_factor() << ")";
}

ThroughputMonitor::ThroughputMonitor(ThroughputMonitorOptions options)
    : options_(std::move(options)) {
  VOLT_CHECK(options_.flops_per_batch() >= 0 && options_.eval_flops_per_batch() >= 0, ValueError,
             "[ThroughputMonitor] flops_per_batch and eval_flops_per_batch must be >= 0 (0: no "
             "FLOPs figures); measure one batch with volt::measure_flops.");
  // Refuse a bad window, peak or sparsity factor now rather than when a stage starts (and
  // give Lightning's dense-MFU warning once, here).
  (void)Throughput(throughput_options(options_, 1));
}

ThroughputMonitor::StageClock& ThroughputMonitor::start(RunContext& run, Loop loop, bool fresh) {
  auto& clock = clocks_[loop];
  if (!clock || fresh) clock = std::make_shared<StageClock>();
  // Every start opens a new window and clock (Lightning's setup makes a new Throughput for each
  // Trainer call, a fit resets it for each validation run); the totals go on over repeated
  // Trainer::validate / test / predict calls, as Lightning's.
  clock->throughput =
      std::make_unique<Throughput>(throughput_options(options_, run.data_parallel_size()));
  clock->t0 = Clock::now();
  clock->last_time = -1;
  clock->unrecorded = 0;
  clock->run_batches = 0;
  return *clock;
}

bool ThroughputMonitor::update(RunContext& run, Loop loop, const Batch& batch) {
  const auto it = clocks_.find(loop);
  if (it == clocks_.end() || !run.is_global_zero()) return false;
  StageClock& c = *it->second;
  ++c.batches;
  ++c.unrecorded;
  c.samples +=
      checked("batch_size_fn",
              options_.batch_size_fn() ? options_.batch_size_fn()(batch) : batch.size(), 1);
  if (options_.length_fn()) c.lengths += checked("length_fn", options_.length_fn()(batch), 0);
  const double time = std::chrono::duration<double>(Clock::now() - c.t0).count();
  // A clock that did not advance since the last update: the batch joins the next update.
  if (time <= c.last_time) return true;
  const int64_t per_batch =
      loop == Loop::kTrain ? options_.flops_per_batch() : options_.eval_flops_per_batch();
  c.throughput->update(
      time, c.batches, c.samples,
      options_.length_fn() ? c10::optional<int64_t>(c.lengths) : c10::nullopt,
      per_batch > 0 ? c10::optional<int64_t>(per_batch * c.unrecorded) : c10::nullopt);
  c.last_time = time;
  c.unrecorded = 0;
  return true;
}

void ThroughputMonitor::log(RunContext& run, Loop loop, int64_t step) {
  const StageClock& c = *clocks_.at(loop);
  Metrics row;
  const std::string prefix = std::string(loop_key(loop)) + options_.separator();
  for (const auto& [key, value] : c.throughput->compute()) row[prefix + key] = value;
  if (row.empty()) return;
  for (const auto& l : run.loggers()) l->log_metrics(row, step);
  last_ = std::move(row);
}

void ThroughputMonitor::on_train_start(RunContext& run, Module&) {
  require_logger(run);
  last_global_step_ = run.state().global_step;  // a resumed run starts mid-way
  if (!run.is_global_zero()) return;
  start(run, Loop::kTrain, /*fresh=*/true);
  clocks_.erase(Loop::kFitValidation);  // a new fit numbers its validation batches from 0
}

void ThroughputMonitor::on_train_batch_end(RunContext& run, Module&, const Batch& batch, int64_t) {
  const bool counted = update(run, Loop::kTrain, batch);
  // The Trainer sends step metrics when a batch's optimizer steps take global_step past a
  // multiple of log_every_n_steps (several steps a batch under manual optimization), under the
  // step index global_step - 1; log alongside them. Under gradient accumulation the batches
  // without an optimizer step only add to the window.
  const int64_t step = run.state().global_step;
  const int64_t before = last_global_step_;
  if (step == before) return;
  last_global_step_ = step;
  if (!counted || !detail::passes_log_step(before, step, run.log_every_n_steps())) return;
  log(run, Loop::kTrain, step - 1);
}

// The sanity check is not measured (Lightning's monitor skips it too). A fit's validation is
// left out of the training clock: counted in, it would sink the training throughput at every
// validation check.
void ThroughputMonitor::on_validation_start(RunContext& run, Module&) {
  if (run.sanity_checking()) return;
  const bool in_fit = run.state().stage == Stage::kFit;
  if (!in_fit) require_logger(run);  // a fit checked when training started
  if (!run.is_global_zero()) return;
  validation_start_ = Clock::now();
  // A fit's validation runs start their totals anew (Lightning resets them while fitting).
  start(run, in_fit ? Loop::kFitValidation : Loop::kValidate, /*fresh=*/false);
  if (in_fit) {
    StageClock& c = *clocks_.at(Loop::kFitValidation);
    c.batches = c.samples = c.lengths = 0;
  }
}

void ThroughputMonitor::evaluation_batch_end(RunContext& run, Loop loop, const Batch& batch) {
  if (run.sanity_checking() || !update(run, loop, batch)) return;
  StageClock& c = *clocks_.at(loop);
  ++c.iterations;
  // Lightning's gate for an evaluation loop: the batches of the current run.
  if (++c.run_batches % run.log_every_n_steps() == 0) log(run, loop, c.iterations);
}

void ThroughputMonitor::on_validation_batch_end(RunContext& run, Module&, const Batch& batch,
                                                int64_t) {
  evaluation_batch_end(
      run, run.state().stage == Stage::kFit ? Loop::kFitValidation : Loop::kValidate, batch);
}

void ThroughputMonitor::on_validation_end(RunContext& run, Module&) {
  if (run.sanity_checking() || run.state().stage != Stage::kFit || !run.is_global_zero()) return;
  const auto train = clocks_.find(Loop::kTrain);
  if (train != clocks_.end()) train->second->t0 += Clock::now() - validation_start_;
}

void ThroughputMonitor::on_test_start(RunContext& run, Module&) {
  require_logger(run);
  if (run.is_global_zero()) start(run, Loop::kTest, /*fresh=*/false);
}

void ThroughputMonitor::on_test_batch_end(RunContext& run, Module&, const Batch& batch, int64_t) {
  evaluation_batch_end(run, Loop::kTest, batch);
}

void ThroughputMonitor::on_predict_start(RunContext& run, Module&) {
  require_logger(run);
  if (run.is_global_zero()) start(run, Loop::kPredict, /*fresh=*/false);
}

void ThroughputMonitor::on_predict_batch_end(RunContext& run, Module&, const at::Tensor&,
                                             const Batch& batch, int64_t) {
  evaluation_batch_end(run, Loop::kPredict, batch);
}

}  // namespace volt
