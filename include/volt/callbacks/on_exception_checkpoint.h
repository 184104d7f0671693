#pragma once
/// OnExceptionCheckpoint: Lightning's callback of that name. When fit ends with an exception it
/// saves a checkpoint, so a run stopped by Ctrl-C or a preemption signal (volt::Interrupted)
/// resumes exactly where it stopped.

#include <torch/arg.h>

#include <iosfwd>
#include <string>

#include "volt/callbacks/callback.h"

namespace volt {

struct OnExceptionCheckpointOptions {
  /// Folder of the checkpoint; "" = the run's checkpoint folder, <log_dir>/checkpoints.
  /// Default: "".
  TORCH_ARG(std::string, dirpath) = "";
  /// File name without the ".ckpt" suffix. Default: "on_exception".
  TORCH_ARG(std::string, filename) = "on_exception";
};

std::ostream& operator<<(std::ostream& os, const OnExceptionCheckpointOptions& o);

/// Saves <dirpath>/<filename>.ckpt in on_exception during fit (atomically, over the file a
/// previous run left). When the error is volt::Interrupted every rank stopped at the same batch
/// boundary, so the checkpoint holds a consistent mid-epoch state and resuming from it is
/// bit-identical to an uninterrupted run. Any other error leaves the state as the failure found
/// it (Lightning saves it anyway, and so does this in one process, with a warning); with several
/// processes the other ranks are not at the same point, and a checkpoint (a collective) would
/// wait for them, so it is not written and a warning says so.
///
/// An entry point (fit, validate, test, predict) that ends without an error removes the file
/// (Lightning's teardown): a run resumed from it that then finished leaves no stale file for a
/// later ckpt_path="last" to go back to.
class OnExceptionCheckpoint : public Callback {
 public:
  explicit OnExceptionCheckpoint(OnExceptionCheckpointOptions options = {});
  std::string state_key() const override { return "OnExceptionCheckpoint"; }
  void setup(RunContext& run, Module& module, Stage stage) override;
  void on_exception(RunContext& run, Module& module, const std::exception& error) override;
  void teardown(RunContext& run, Module& module, Stage stage) override;
  /// Where the last on_exception saved ("" if it did not).
  const std::string& saved_path() const { return saved_path_; }
  /// The file on_exception writes for a run logging into `log_dir`. ckpt_path="last" takes it
  /// when it is newer than ModelCheckpoint's last checkpoint (Lightning's _parse_ckpt_path).
  std::string path_for(const std::string& log_dir) const;

 private:
  OnExceptionCheckpointOptions options_;
  std::string saved_path_;
  bool failed_ = false;  // this entry point's on_exception ran
};

}  // namespace volt
