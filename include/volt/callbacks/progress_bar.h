#pragma once
/// ProgressBar: Lightning's TQDMProgressBar in C++. Rank 0 draws one bar per running stage,
/// "Epoch 3:  30%|███       | 12/40 [00:03<00:07,  4.00it/s, v_num=0, train_loss=0.123]",
/// in place on a terminal; volt's log lines printed meanwhile go above the bars when the bars are
/// on stderr (volt's log stream, the default).

#include <torch/arg.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include "volt/callbacks/callback.h"

namespace volt {

struct ProgressBarOptions {
  /// Redraw a bar every this many batches and at its last batch (Lightning's refresh_rate); 0
  /// shows no bar. Default: 1.
  TORCH_ARG(int64_t, refresh_rate) = 1;
  /// ... and at most once per this many seconds (volt's: a training redraw reads the prog_bar
  /// values, a device sync on CUDA); 0 = every refresh_rate batches. A bar's last batch is
  /// always drawn. Default: 0.5 (the Trainer's own bar takes TrainerOptions::progress_refresh_s).
  TORCH_ARG(double, refresh_s) = 0.5;
  /// Keep each epoch's finished training bar on screen (Lightning's leave); false: one training
  /// bar, reset at each epoch. Default: false.
  TORCH_ARG(bool, leave) = false;

 public:
  /// ConfigError when refresh_rate < 0 or refresh_s is negative or not finite.
  void validate() const;
};
std::ostream& operator<<(std::ostream& os, const ProgressBarOptions& o);

/// The bars, as Lightning's: "Sanity Checking DataLoader 0", "Epoch N" (total: the epoch's
/// batches, or the steps left under max_steps without max_epochs), "Validation DataLoader i"
/// (inside fit on the row below the training bar, cleared after), "Testing DataLoader i",
/// "Predicting DataLoader i". The training bar shows get_metrics() after its counts.
///
/// On a terminal the bars are redrawn in place, cut to the terminal's width. Written to a file or
/// pipe (no terminal) it prints finished bars only, one line each: every training epoch's and
/// each loader's of a standalone validate/test/predict (no carriage returns in a log file).
/// Writes to stderr unless told otherwise (Lightning's tqdm writes to stdout; volt leaves stdout
/// to the program).
class ProgressBar : public Callback {
 public:
  explicit ProgressBar(ProgressBarOptions options = {}, std::FILE* out = stderr);
  std::string state_key() const override { return "ProgressBar"; }

  void on_sanity_check_start(RunContext& run, Module& module) override;
  void on_sanity_check_end(RunContext& run, Module& module) override;
  void on_train_start(RunContext& run, Module& module) override;
  void on_train_epoch_start(RunContext& run, Module& module) override;
  void on_train_batch_end(RunContext& run, Module& module, const Batch& batch,
                          int64_t batch_idx) override;
  void on_train_epoch_end(RunContext& run, Module& module) override;
  void on_train_end(RunContext& run, Module& module) override;
  void on_validation_start(RunContext& run, Module& module) override;
  void on_validation_batch_start(RunContext& run, Module& module, const Batch& batch,
                                 int64_t batch_idx) override;
  void on_validation_batch_end(RunContext& run, Module& module, const Batch& batch,
                               int64_t batch_idx) override;
  void on_validation_end(RunContext& run, Module& module) override;
  void on_test_start(RunContext& run, Module& module) override;
  void on_test_batch_start(RunContext& run, Module& module, const Batch& batch,
                           int64_t batch_idx) override;
  void on_test_batch_end(RunContext& run, Module& module, const Batch& batch,
                         int64_t batch_idx) override;
  void on_test_end(RunContext& run, Module& module) override;
  void on_predict_start(RunContext& run, Module& module) override;
  void on_predict_batch_start(RunContext& run, Module& module, const Batch& batch,
                              int64_t batch_idx) override;
  void on_predict_batch_end(RunContext& run, Module& module, const at::Tensor& prediction,
                            const Batch& batch, int64_t batch_idx) override;
  void on_predict_end(RunContext& run, Module& module) override;
  /// A failed run leaves its bars as they were drawn and the cursor on a new line, so that the
  /// error is not printed onto a bar.
  void on_exception(RunContext& run, Module& module, const std::exception& error) override;

  /// The items after the training bar's counts, as Lightning's get_metrics: "v_num" (the
  /// loggers' version) first, then the prog_bar values (sorted by name), each as text. Override
  /// to show other items; it runs only when the bar is redrawn.
  virtual std::vector<std::pair<std::string, std::string>> get_metrics(RunContext& run,
                                                                       Module& module);
  /// Lightning's Tqdm.format_num: three significant digits, padded to five characters unless in
  /// exponent form: 1.0 -> "1.000", 0.1234 -> "0.123", 12345.0 -> "12345.0", 1e-5 -> "1e-5".
  static std::string format_num(double value);

  /// Lightning's enable()/disable(): a disabled bar draws nothing until enabled again.
  void enable() { enabled_ = true; }
  void disable() { enabled_ = false; }
  bool is_enabled() const { return enabled_ && options_.refresh_rate() > 0; }
  const ProgressBarOptions& options() const { return options_; }
  /// Rows drawn so far (for tests of the throttle).
  int64_t redraws() const { return redraws_; }

 private:
  using Clock = std::chrono::steady_clock;
  /// One bar: its description, counts and clock, and the items it shows.
  struct Bar {
    std::string desc;
    int64_t n = 0;
    int64_t total = 0;
    int64_t start_n = 0;  ///< n when the clock started (a resumed epoch's first batch)
    Clock::time_point start, last_draw;
    std::string postfix;  ///< "v_num=0, loss=0.123", kept over resets as tqdm's
    bool live = false;    ///< shown (or, without a terminal, due to be printed)
  };
  bool draws(RunContext& run) const;
  void reset(Bar& bar, std::string desc, int64_t total, int64_t n);
  /// Whether a bar at batch `n` is due for a redraw (refresh_rate, refresh_s; its last batch).
  bool due(const Bar& bar, int64_t n) const;
  std::string render(const Bar& bar, int64_t columns) const;
  /// Redraws the terminal's rows: the training (or sanity/standalone) bar, then the one below.
  void paint();
  /// A bar is done: kept (a terminal row that stays, or a line in a file) or cleared.
  void close(Bar& bar, bool keep);
  std::string postfix_text(RunContext& run, Module& module);
  void eval_start(RunContext& run, const char* desc);
  void eval_batch_start(RunContext& run, const char* desc);
  void eval_batch_end(RunContext& run, int64_t batch_idx);
  void eval_end(RunContext& run, Module& module);

  ProgressBarOptions options_;
  std::FILE* out_;
  bool tty_ = false;
  bool enabled_ = true;
  Bar main_;             ///< training, the sanity check's, or a standalone validate/test/predict's
  Bar below_;            ///< validation inside fit
  Bar* eval_ = nullptr;  ///< the bar of the evaluation running
  bool eval_kept_ = false;  ///< a standalone pass: each loader's final line stays
  int64_t eval_loader_ = -1;
  int64_t redraws_ = 0;
};

}  // namespace volt
