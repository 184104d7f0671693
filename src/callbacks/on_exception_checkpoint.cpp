#include "volt/callbacks/on_exception_checkpoint.h"

#include <filesystem>
#include <ostream>

#include "volt/core/check.h"
#include "volt/core/log.h"
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

void OnExceptionCheckpoint::on_exception(RunContext& run, Module&, const std::exception& error) {
  saved_path_.clear();
  // Only fit has training state to keep; validate/test/predict change nothing worth saving.
  if (run.state().stage != Stage::kFit) return;
  const auto* interrupted = dynamic_cast<const Interrupted*>(&error);
  if (interrupted == nullptr && run.world_size() > 1) {
    if (run.is_global_zero()) {
      log_warning("OnExceptionCheckpoint",
                  "no checkpoint written: the run failed on one rank while the others may be "
                  "elsewhere in the loop, and writing one needs every rank. Resume from the "
                  "last checkpoint of ModelCheckpoint.");
    }
    return;
  }
  const std::string path = path_for(run.log_dir());
  run.save_checkpoint(path);
  saved_path_ = path;
  if (run.is_global_zero()) {
    if (interrupted != nullptr) {
      log_info("OnExceptionCheckpoint",
               "saved " + path + "; resume with ckpt_path=" + path +
                   " (--ckpt_path on the command line) to continue exactly where it stopped.");
    } else {
      log_warning("OnExceptionCheckpoint",
                  "saved " + path +
                      " with the state as the failure left it (the step that failed may be half "
                      "done); use it to inspect the failure rather than to resume (ckpt_path="
                      "\"last\" takes it while it is the newest: move it away first).");
    }
  }
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
