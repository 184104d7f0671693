#pragma once
// Private: the Trainer's graceful stop on SIGINT / SIGTERM (TrainerOptions::handle_signals).

namespace volt {
namespace detail {

/// While alive, SIGINT and SIGTERM set a flag the Trainer's loops read at batch boundaries
/// instead of ending the process; a second one (of either) ends it at once with the default
/// action. Only a signal whose disposition is the default (SIG_DFL) is taken over: a program's
/// own handler, an ignored signal (e.g. SIGINT of a background job) and an enclosing watch stay
/// as they are. The destructor restores what it replaced. The handler is async-signal-safe: an
/// atomic exchange, and on rank 0 one write(2) to stderr saying what happens next. Signal
/// dispositions are per process: Trainer entry points running at once in several threads of
/// one process share one flag, and the watch that installed the handler restores the default
/// when its entry point ends, for the others too.
class SignalWatch {
 public:
  explicit SignalWatch(bool enabled);
  ~SignalWatch();
  SignalWatch(const SignalWatch&) = delete;
  SignalWatch& operator=(const SignalWatch&) = delete;

  /// Whether the handler prints its one line (rank 0 only, so a job prints it once).
  void announce(bool on);
  /// The first stop signal received since the outermost watch was installed (0: none, and
  /// always 0 when this watch took over neither signal and none encloses it).
  int received() const;

 private:
  bool installed_[2] = {false, false};
  bool active_ = false;
};

/// "SIGINT", "SIGTERM", or "a signal" for any other.
const char* signal_text(int signal);

}  // namespace detail
}  // namespace volt
