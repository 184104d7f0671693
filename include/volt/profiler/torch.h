#pragma once
/// TorchProfiler: every libtorch op (RecordFunction callbacks: name, thread, start, duration,
/// optionally input shapes) and every volt region (hooks, loop stages, custom regions) of the
/// scheduled steps, written as a Chrome trace per rank plus a summary table when a run ends.
/// Host (CPU) time only: device-side kernel time on CUDA is not recorded (TODO(#11)).

#include <torch/arg.h>

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "volt/profiler/profiler.h"

namespace volt {

struct TorchProfilerOptions {
  /// Folder for the trace and summary; "" = the run's log folder. Default: "".
  TORCH_ARG(std::string, dirpath);
  /// File name stem: files are <stage>[-<filename>]-rank<R>.pt.trace.json (and .txt for the
  /// summary; see tensorboard); "" prints the summary to stderr instead of writing it.
  /// Default: "".
  TORCH_ARG(std::string, filename);
  /// Record libtorch ops (false: volt's regions only). Default: true.
  TORCH_ARG(bool, record_ops) = true;
  /// Record each op's input shapes (costs boxing the op's arguments). Default: false.
  TORCH_ARG(bool, record_shapes) = false;
  /// Schedule, in steps (calls of the stage's step function: training_step in fit, or its CUDA
  /// graph's replay under graph_training_step; validation_step / test_step / predict_step
  /// otherwise): steps skipped per cycle. Default: 1.
  TORCH_ARG(int64_t, wait) = 1;
  /// Steps recorded and then discarded per cycle (warms the callbacks up). Default: 1.
  TORCH_ARG(int64_t, warmup) = 1;
  /// Steps kept per cycle; 0 records the whole run (no schedule; wait and warmup must be 0).
  /// Default: 3.
  TORCH_ARG(int64_t, active) = 3;
  /// Cycles of wait+warmup+active; 0 repeats until the run ends. Default: 1.
  TORCH_ARG(int64_t, repeat) = 1;
  /// Rows in the summary table (top N by self time). Default: 20.
  TORCH_ARG(int64_t, row_limit) = 20;
  /// Name the trace as torch.profiler.tensorboard_trace_handler does, so TensorBoard's PyTorch
  /// profiler plugin (torch-tb-profiler) lists it as worker <stage>[-<filename>]-rank<R> of the
  /// run that is its folder: <stage>[-<filename>]-rank<R>.<ms since epoch>.pt.trace.json; each
  /// entry point then adds a trace instead of replacing the last. Default: false.
  TORCH_ARG(bool, tensorboard) = false;
};

std::ostream& operator<<(std::ostream& os, const TorchProfilerOptions& o);

/// Only one TorchProfiler records at a time in a process (RecordFunction callbacks are global).
class TorchProfiler : public Profiler {
 public:
  explicit TorchProfiler(TorchProfilerOptions options = {});
  ~TorchProfiler() override;
  void setup(const std::string& stage, int64_t rank, const std::string& log_dir) override;
  /// A volt region (a hook, a loop stage) or a custom region; starting the stage's step
  /// function also advances the schedule.
  void start(const std::string& action) override;
  /// Throws ProfilerError when `action` is not open.
  void stop(const std::string& action) override;
  /// Writes the trace (atomically) and the summary, then resets for the next entry point.
  void describe(const std::string& stage, const std::string& log_dir) override;
  /// Advances the schedule by one step by hand (the Trainer needs no call: see start()).
  void step();

  /// One row of the summary: an op or region name with its totals over the recorded steps.
  struct Row {
    std::string name;
    bool is_op = true;  ///< a libtorch op (else a volt or custom region)
    int64_t calls = 0;
    double self_us = 0;  ///< total time minus time in nested events on the same thread
    double total_us = 0;
  };
  /// Rows of the last describe(), by self time, all of them (the table shows row_limit).
  const std::vector<Row>& last_rows() const;
  /// The last summary table.
  const std::string& last_summary() const;
  /// Path of the last trace written ("" when none was written).
  const std::string& last_trace_path() const;
  /// Path of the last summary file ("" when printed).
  const std::string& last_summary_path() const;
  /// Steps kept in the last trace.
  int64_t last_recorded_steps() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace volt
