#include "volt/callbacks/activation_checkpointing.h"

#include "core/detail/numbers.h"
#include "core/detail/print.h"
#include "volt/core/check.h"
#include "volt/core/log.h"
#include "volt/core/module.h"
#include "volt/nn/checkpoint.h"

namespace volt {

ActivationCheckpointing::ActivationCheckpointing(ActivationCheckpointingOptions options)
    : options_(std::move(options)) {
  VOLT_CHECK(!options_.modules().empty(), ConfigError,
             "[ActivationCheckpointing] modules is empty; list the module paths or globs to "
             "checkpoint, e.g. [\"blocks.*\"].");
}

void ActivationCheckpointing::on_fit_start(RunContext& run, Module& module) {
  std::vector<std::string> wrapped;
  if (options_.cpu_checkpointing()) {
    wrapped = wrap_activation_checkpointing(module, options_.modules(),
                                            CheckpointOptions()
                                                .cpu_checkpointing(*options_.cpu_checkpointing())
                                                .preserve_rng_state(options_.preserve_rng_state()));
  } else if (!options_.preserve_rng_state()) {
    // cpu_checkpointing unset: the defaults as the strategy set them for this run (its
    // setup_environment ran before on_fit_start).
    wrapped = wrap_activation_checkpointing(
        module, options_.modules(),
        CheckpointOptions()
            .cpu_checkpointing(checkpoint_defaults().cpu_checkpointing())
            .preserve_rng_state(false));
  } else {
    wrapped = wrap_activation_checkpointing(module, options_.modules());
  }
  if (!wrapped.empty()) {
    auto os = detail::c_stream<std::ostringstream>();
    os << "checkpointing " << wrapped.size() << " module(s):";
    for (const auto& p : wrapped) os << " " << p;
    log_info("ActivationCheckpointing", os.str());
  }
}

std::ostream& operator<<(std::ostream& os, const ActivationCheckpointingOptions& o) {
  return os << "ActivationCheckpointingOptions(modules=" << detail::quoted_list(o.modules())
            << ", cpu_checkpointing=" << detail::optional_text(o.cpu_checkpointing())
            << ", preserve_rng_state=" << o.preserve_rng_state() << ")";
}

}  // namespace volt
