#pragma once
/// volt's one logging facade: every warning and notice volt prints goes through here, in one
/// format ("[volt] warning: [Component] message"), filtered to rank 0 in multi-process runs.

#include <cstdint>
#include <functional>
#include <string>

namespace volt {

enum class LogLevel { kInfo, kWarning, kError };

/// Prints `message` from `component` at `level` to the sink (stderr by default). In a
/// multi-process job only global rank 0 prints info and warnings (Lightning's rank_zero_warn);
/// errors print on every rank, prefixed with the rank. Thread-safe.
void log_message(LogLevel level, const std::string& component, const std::string& message);
inline void log_info(const std::string& component, const std::string& message) {
  log_message(LogLevel::kInfo, component, message);
}
inline void log_warning(const std::string& component, const std::string& message) {
  log_message(LogLevel::kWarning, component, message);
}
inline void log_error(const std::string& component, const std::string& message) {
  log_message(LogLevel::kError, component, message);
}

/// Warns the first time `key` is seen in this process; returns true when it printed (on a rank
/// that does not print warnings it still counts the key as seen and returns false).
bool warn_once(const std::string& key, const std::string& component, const std::string& message);

/// Sets this process's global rank for the rank-zero filter (strategies call it at set-up;
/// until then RANK, LOCAL_RANK or SLURM_PROCID from the launcher decides, else 0).
void set_log_rank(int64_t rank);
int64_t log_rank();

/// Replaces the sink that receives each formatted line (without the newline); an empty function
/// restores stderr. For tests and applications routing volt's output into their own logs.
/// Returns the sink it replaced (empty = stderr), so that a sink can be put back or chained.
using LogSink = std::function<void(LogLevel level, const std::string& line)>;
LogSink set_log_sink(LogSink sink);

}  // namespace volt
