#include "volt/callbacks/on_exception_checkpoint.h"

#include <filesystem>
#include <ostream>

#include "callbacks/detail/exception_checkpoint.h"
#include "volt/core/check.h"
#include "volt/core/run_context.h"

namespace volt {

namespace fs = std::filesystem;

OnExceptionCheckpoint::OnExceptionCheckpoint(OnExceptionCheckpointOptions options)
    : options_(std::move(options)) {
  VOLT_CHECK(!options_.filename().empty() && options_.filename().find('/') == std::string::npos &&
                 options_.filename() != "." && options_.filename() != "..",
             ConfigError, "[OnExceptionCheckpoint] filename=\"", options_.filename(),
             "\" is not a file name; give a plain name such as \"on_exception\" (the folder "
             "goes in dirpath).");
}

void OnExceptionCheckpoint::setup(RunContext&, Module&, Stage) {
  failed_ = false;
}

void OnExceptionCheckpoint::on_exception(RunContext& run, Module&, const std::exception& error) {
  failed_ = true;
  saved_path_.clear();
  if (!detail::may_checkpoint_after(run, error, "OnExceptionCheckpoint")) return;
  const std::string path = path_for(run.log_dir());
  run.save_checkpoint(path);
  saved_path_ = path;
  detail::report_exception_checkpoint(run, error, path, "", "OnExceptionCheckpoint");
}

void OnExceptionCheckpoint::teardown(RunContext& run, Module&, Stage) {
  // Lightning's teardown removes the file after an entry point that ended well (its teardown
  // hooks run only then; volt's run after a failure too, which keeps the file). Its run resumed
  // from the file and finished, so a later ckpt_path="last" must not take it back to where the
  // interruption left it. Every entry point's, as Lightning's (test the file's weights with
  // another copy of it, or without this callback, to keep it for the fit that resumes from it).
  if (failed_) return;
  const std::string path = path_for(run.log_dir());
  std::error_code ec;
  if (fs::exists(fs::symlink_status(path, ec))) run.remove_checkpoint(path);
}

std::string OnExceptionCheckpoint::path_for(const std::string& log_dir) const {
  const fs::path dir =
      options_.dirpath().empty() ? fs::path(log_dir) / "checkpoints" : fs::path(options_.dirpath());
  return (dir / (options_.filename() + ".ckpt")).string();
}

std::ostream& operator<<(std::ostream& os, const OnExceptionCheckpointOptions& o) {
  return os << "OnExceptionCheckpointOptions(dirpath=\"" << o.dirpath() << "\", filename=\""
            << o.filename() << "\")";
}

}  // namespace volt
