#pragma once
/// ModelCheckpoint: saves checkpoints on a schedule, keeps the best top-k by a monitored metric.

#include <c10/util/Optional.h>
#include <torch/arg.h>
#include <iosfwd>

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "volt/callbacks/callback.h"

namespace volt {

enum class Mode { kMin, kMax };

/// ModelCheckpointOptions::save_last: Lightning's False, True and "link".
enum class SaveLast {
  kNo,    ///< no last.ckpt
  kCopy,  ///< last.ckpt is a checkpoint of its own, written at each save (Lightning's True)
  /// last.ckpt is a symbolic link to the newest checkpoint this callback wrote (Lightning's
  /// "link"): no second write; a real file until this fit has written another one, and always
  /// with save_top_k 0. A save that does not make the top k writes nothing, so the link then
  /// names an older state than the run's (ckpt_path="last" repeats what came after it). The
  /// link is relative, so the folder can move. Where the file system has no links last.ckpt
  /// is a copy of the file, made atomically (Lightning's shutil.copy fallback).
  kLink,
};

struct ModelCheckpointOptions {
  /// Folder for checkpoints; "" = <log_dir>/checkpoints. A leading "~" is the home folder and a
  /// relative path is made absolute when the fit starts, as Lightning. Default: "".
  TORCH_ARG(std::string, dirpath);
  /// File name template: "{epoch}-{step}" style with metric names and optional Python-style
  /// format specs ("{epoch:02d}-{val_loss:.3f}"; epoch and step are integers, metrics floats,
  /// without a spec in Python's repr: val_loss=0.12345679104328156, as Lightning). Each field
  /// renders as name=value (see auto_insert_metric_name); a "/" in the rendered name becomes
  /// "_" (a metric such as "val/loss" creates no folder). A field that is not a logged metric
  /// renders as 0, with a warning once (Lightning substitutes 0 silently). A bad spec is a
  /// ConfigError at construction. Default: "{epoch}-{step}".
  TORCH_ARG(std::string, filename) = "{epoch}-{step}";
  /// Render each field as name=value ("{epoch}" -> "epoch=3"); false renders the value alone,
  /// so "epoch{epoch:02d}" gives "epoch03" (Lightning's auto_insert_metric_name). Default: true.
  TORCH_ARG(bool, auto_insert_metric_name) = true;
  /// Metric that ranks checkpoints; "" keeps the latest. Default: "".
  TORCH_ARG(std::string, monitor);
  /// kMin or kMax for the monitored metric. Default: kMin.
  TORCH_ARG(Mode, mode) = Mode::kMin;
  /// Keep the best k files; -1 keeps all, 0 none (only last.ckpt). Default: 1.
  TORCH_ARG(int64_t, save_top_k) = 1;
  /// Also write last.ckpt at each save (each every_n_train_steps, every_n_epochs or
  /// train_time_interval trigger, whether or not that state made the top k, as Lightning up to
  /// 2.5; 2.6's epoch and validation saves refresh it only with a top-k file), and at the end
  /// of a fit in which nothing was saved (as Lightning 2.6). last-v1.ckpt, ... when a last.ckpt
  /// that is not this run's is in the folder and enable_version_counter is on, as Lightning.
  /// SaveLast::kLink makes it a link to the newest file instead, refreshed only when a file is
  /// written (see SaveLast). Default: kNo.
  TORCH_ARG(SaveLast, save_last) = SaveLast::kNo;

 public:
  /// save_last(true) is SaveLast::kCopy, save_last(false) SaveLast::kNo.
  ModelCheckpointOptions& save_last(bool on) {
    return save_last(on ? SaveLast::kCopy : SaveLast::kNo);
  }
  /// When fit fails with an exception (Ctrl-C and preemption signals included, which end every
  /// rank at the same batch: volt::Interrupted), save a checkpoint named by the filename
  /// template (a version suffix where the name is taken; it does not join the top k), and
  /// last.ckpt with save_last, as Lightning's save_on_exception. With several processes any
  /// other exception leaves the ranks at different points, so nothing is written and a warning
  /// says so (as OnExceptionCheckpoint). Not after a save at the same step, nor before the first
  /// optimizer step (as Lightning). Default: false.
  TORCH_ARG(bool, save_on_exception) = false;
  /// Save every N optimizer steps (at train batch end); 0 = off. With a monitor, a save due
  /// before the monitored metric is logged, or right before a validation whose end writes the
  /// epoch checkpoints (or the epoch's last validation), waits for that point (the validation's
  /// end, or the train epoch's end when save_on_train_epoch_end holds; training's end at the
  /// latest), so it is ranked by a fresh score. Lightning 2.6 defers for a missing metric, and
  /// for a fresh one only at an epoch's last batch where it writes epoch checkpoints after
  /// validation (before a validation mid-epoch its save takes the older score). Not with
  /// every_n_epochs or train_time_interval set (as Lightning). Default: 0.
  TORCH_ARG(int64_t, every_n_train_steps) = 0;
  /// Save every N epochs (at train epoch end or after validation: see save_on_train_epoch_end);
  /// 0 = off. Default: 1 unless every_n_train_steps or train_time_interval is set.
  TORCH_ARG(c10::optional<int64_t>, every_n_epochs);
  /// Where the every_n_epochs checkpoints are written: true at each train epoch's end (after its
  /// validation, the epoch's metrics reduced), false at each validation's end in fit. Unset:
  /// Lightning's rule: after validation when check_val_every_n_epoch != 1, at the epoch's end
  /// when the fit does not validate, else at the epoch's end when val_check_interval is 1.0 (one
  /// validation per epoch) and after each validation when it runs several. Default: unset.
  TORCH_ARG(c10::optional<bool>, save_on_train_epoch_end);
  /// A checkpoint file name that is taken (on disk, or by a kept top-k file that is not the one
  /// this save evicts) gets "-v1", "-v2"... before ".ckpt" instead of overwriting it, as
  /// Lightning. Default: true.
  TORCH_ARG(bool, enable_version_counter) = true;
  /// Save at the first optimizer step after each this many seconds of training (counted from
  /// on_train_start; a save when any rank is due, where Lightning takes rank 0's clock); 0 =
  /// off (Lightning's timedelta(0) saves at every batch). Not with every_n_train_steps or
  /// every_n_epochs set (as Lightning). Default: 0.
  TORCH_ARG(double, train_time_interval) = 0;
  /// Write weights-only checkpoints: the weights, the loop counters, the DataModule's and the
  /// module's own state (validate/test/predict and volt::load_weights read them; a fit cannot
  /// resume from them). Not with DeepSpeedStrategy. Default: false.
  TORCH_ARG(bool, save_weights_only) = false;
  /// Log each ranking decision on rank 0 ("Epoch 3, global step 120: 'val_loss' reached 0.41250
  /// (best 0.41250), saving model to '...' as top 1", or "was not in top 1"), as Lightning.
  /// Default: false.
  TORCH_ARG(bool, verbose) = false;
};

std::ostream& operator<<(std::ostream& os, const ModelCheckpointOptions& o);

/// Lightning's ModelCheckpoint. Files are written atomically; a file is deleted only after its
/// replacement is on disk, so at every instant the best and last checkpoints exist. Each file
/// holds the callback's state as it is after that save (the file among the top k, the best
/// path), so a fit resumed from any of them goes on with the right list; the checkpoint a run
/// started from (RunContext::ckpt_path) is never deleted. Among equal scores the earlier save
/// counts as the better one (Lightning's dict order). No checkpoint is saved before the fit's
/// first optimizer step (Lightning: "no need to save when no steps were taken"), except
/// save_last's at the end of a fit that saved nothing.
class ModelCheckpoint : public Callback {
 public:
  explicit ModelCheckpoint(ModelCheckpointOptions options = ModelCheckpointOptions());
  std::string state_key() const override;

  void on_fit_start(RunContext& run, Module& module) override;
  void on_train_start(RunContext& run, Module& module) override;
  void on_train_batch_end(RunContext& run, Module& module, const Batch& batch,
                          int64_t batch_idx) override;
  void on_train_epoch_end(RunContext& run, Module& module) override;
  void on_validation_end(RunContext& run, Module& module) override;
  void on_train_end(RunContext& run, Module& module) override;
  void on_exception(RunContext& run, Module& module, const std::exception& error) override;
  void save_state(torch::serialize::OutputArchive& archive) const override;
  void load_state(torch::serialize::InputArchive& archive) override;

  const std::string& best_model_path() const { return best_model_path_; }
  c10::optional<double> best_model_score() const;
  const std::string& last_model_path() const { return last_model_path_; }
  const std::map<std::string, double>& best_k_models() const { return best_k_models_; }
  /// The kept file the next better score replaces: the worst of the top k once k files are
  /// kept (with save_top_k -1 once any is), else "", as Lightning's kth_best_model_path.
  std::string kth_best_model_path() const;
  /// kth_best_model_path()'s score; +inf (mode min) or -inf (max) while fewer than k are kept.
  double kth_value() const;
  /// The monitored score of the latest checkpoint that made the top k (NaN saved as the worst
  /// score, +-inf), as Lightning's current_score; none before one did.
  c10::optional<double> current_score() const { return current_score_; }
  /// Writes best_k_models() as YAML ("<path>": score per line) to `path`, atomically;
  /// "" = <dirpath>/best_k_models.yaml, as Lightning's to_yaml. ConfigError when the callback
  /// has no folder yet (before a fit starts, with dirpath unset).
  void to_yaml(const std::string& path = "") const;
  const std::string& dirpath() const { return dirpath_; }
  /// The checkpoint ckpt_path="last" resumes from: this run's last save, else the newest
  /// last*.ckpt in this callback's folder (its dirpath, or `log_dir`/checkpoints); "" if none.
  std::string find_last_checkpoint(const std::string& log_dir) const;
  /// Renders the filename template for the given metrics (without the .ckpt suffix).
  std::string format_filename(const Metrics& metrics, int64_t epoch, int64_t step) const;

 private:
  /// The top-k file (unless `last_only`) and last.ckpt for the current step.
  void save(RunContext& run, bool last_only = false);
  /// A step or time trigger: saves now, or marks the save deferred to the validation's end.
  void save_or_defer(RunContext& run);
  bool saves_on_train_epoch_end(const RunContext& run) const;
  /// `stem`.ckpt, or its first free "-vN" version (the evicted file's name counts as free).
  std::string free_path(RunContext& run, const std::string& stem, const std::string& evicted);
  /// <dirpath>/last.ckpt, or last-vN.ckpt where another run's last.ckpt is (collective).
  std::string last_file(RunContext& run);
  bool better(double a, double b) const;
  /// Deletes a file this callback no longer keeps, unless the run started from it.
  void remove_kept(RunContext& run, const std::string& path) const;
  void keep(const std::string& path, double score);
  void forget(const std::string& path);
  std::string worst_kept() const;
  std::string best_kept() const;
  ModelCheckpointOptions options_;
  std::string dirpath_;
  std::map<std::string, double> best_k_models_;  // path -> score
  std::vector<std::string> saved_order_;         // best_k_models_'s paths, oldest save first
  std::string best_model_path_;
  std::string last_model_path_;
  std::string latest_path_;       // latest top-k file when monitor is empty
  std::string restored_dirpath_;  // the folder of the run a checkpoint restored, until fit start
  bool validated_ = false;        // a validation of this fit has ended
  int64_t last_saved_step_ = -1;
  std::chrono::steady_clock::time_point last_time_check_;  // train_time_interval's clock
  int64_t last_saved_epoch_ = -1;
  bool deferred_ = false;      // a step or time save waits for the next validation (saved state)
  bool saved_in_fit_ = false;  // this fit wrote a checkpoint (on_train_end's save_last)
  std::string last_written_;   // the newest file this fit wrote but last.ckpt (kLink's target)
  c10::optional<double> current_score_;
};

}  // namespace volt
