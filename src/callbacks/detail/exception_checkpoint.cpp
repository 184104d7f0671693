#include "callbacks/detail/exception_checkpoint.h"

#include "volt/core/errors.h"
#include "volt/core/log.h"
#include "volt/core/run_context.h"

namespace volt {
namespace detail {

bool may_checkpoint_after(RunContext& run, const std::exception& error,
                          const std::string& component) {
  if (run.state().stage != Stage::kFit) return false;
  if (dynamic_cast<const Interrupted*>(&error) != nullptr || run.world_size() <= 1) return true;
  if (run.is_global_zero()) {
    log_warning(component,
                "no checkpoint written: the run failed on one rank while the others may be "
                "elsewhere in the loop, and writing one needs every rank. Resume from the "
                "last checkpoint of ModelCheckpoint.");
  }
  return false;
}

void report_exception_checkpoint(RunContext& run, const std::exception& error,
                                 const std::string& path, const std::string& last,
                                 const std::string& component) {
  if (!run.is_global_zero()) return;
  if (dynamic_cast<const Interrupted*>(&error) != nullptr) {
    log_info(component, "saved " + path + "; resume with ckpt_path=" + path +
                            " (--ckpt_path on the command line) to continue exactly where it "
                            "stopped.");
  } else {
    log_warning(component,
                "saved " + path + " after the fit failed (" + error.what() +
                    "), with the state as the failure left it (the step that failed may be "
                    "half done); use it to inspect the failure rather than to resume " +
                    (last.empty() ? std::string("(ckpt_path=\"last\" takes it while it is the "
                                                "newest: move it away first).")
                                  : "(" + last +
                                        " holds it too, and ckpt_path=\"last\" takes "
                                        "that: move both away first)."));
  }
}

}  // namespace detail
}  // namespace volt
