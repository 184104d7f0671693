#pragma once
/// The environment variables volt reads, in one table (the reference's "runtime flags"): what
/// each does and which values it takes. `volt env` prints the table with this process's values;
/// every run warns once about VOLT_* variables that are not in it, naming the closest one, since
/// a typo (VOLT_LOG_HOST_SYNC=1) would otherwise do nothing, silently.

#include <optional>
#include <string>
#include <vector>

namespace volt {

/// Who sets a variable, which is also how `volt env` groups them.
enum class EnvGroup {
  kVolt,       ///< volt's own settings (VOLT_*)
  kReference,  ///< names kept from the reference's flows (op lists, fp8 quantization)
  kCluster,    ///< rendezvous and cluster variables (torchrun, Slurm, Open MPI)
  kSystem,     ///< standard variables volt honours (threads, cache folders, Gloo)
  kLauncher,   ///< set by volt's own launcher for its workers; never set by hand
  kTesting,    ///< fault injection for volt's tests
};
const char* to_string(EnvGroup g);

struct EnvVar {
  std::string name;
  EnvGroup group;
  /// The values it takes, as the user would write them: "0 | 1 | 2", "PATH", "HOST".
  std::string values;
  /// What it does, one line.
  std::string meaning;
  /// When non-empty, the only values accepted (an empty value counts as unset).
  std::vector<std::string> choices;
};

/// Every variable volt reads, grouped as EnvGroup lists them.
const std::vector<EnvVar>& env_vars();

/// The table entry for `name`, or nullptr.
const EnvVar* find_env_var(const std::string& name);

/// The value of `name`; nullopt when it is unset or empty. `name` must be in env_vars() (an
/// InternalError otherwise: every variable volt reads is listed). A value outside the entry's
/// choices is a ConfigError naming the variable, the value and the choices.
std::optional<std::string> env_value(const std::string& name);

/// One warning for each VOLT_* variable in this process's environment that env_vars() does
/// not list, naming the closest listed name when one is near. Empty when all are known.
std::vector<std::string> unknown_env_warnings();

/// Checks the environment once per process: logs unknown_env_warnings() and, as info, the
/// user-set variables of the kVolt and kReference groups; throws ConfigError for a listed
/// variable whose value is not one of its choices. The Trainer calls it at set-up.
void check_environment();

}  // namespace volt
