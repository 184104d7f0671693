#pragma once
/// volt's exception hierarchy: every error volt raises derives from volt::Error.

#include <stdexcept>
#include <string>

namespace volt {

/// Base of all volt exceptions; what() reads "[Component] what is wrong; how to fix it".
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

/// A bad or conflicting option value.
class ConfigError : public Error {
 public:
  using Error::Error;
};

/// A bad value, shape or dtype passed at run time (data, tensors, losses).
class ValueError : public Error {
 public:
  using Error::Error;
};

/// Hardware or a build feature that is not present (e.g. CUDA in a CPU-only libtorch).
class NotAvailable : public Error {
 public:
  using Error::Error;
};

/// A checkpoint that is missing, truncated, corrupted or does not match the model.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

/// A data file that is missing or malformed.
class DataError : public Error {
 public:
  using Error::Error;
};

/// A collective or rendezvous that failed at run time: a lost peer, a timeout, an unreachable
/// address.
class DistributedError : public Error {
 public:
  using Error::Error;
};

/// A run stopped because the process was asked to (SIGINT, e.g. Ctrl-C, or SIGTERM, e.g. a
/// scheduler's preemption notice) while TrainerOptions::handle_signals was on. Every rank of the
/// job stopped at the same batch, callbacks ran on_exception (OnExceptionCheckpoint saves there)
/// and the loggers were finalized as interrupted. Programs usually end with 128 + signal(), as a
/// shell expects of a process stopped by that signal (the volt CLI does).
class Interrupted : public Error {
 public:
  Interrupted(const std::string& msg, int signal) : Error(msg), signal_(signal) {}
  /// The signal that asked for the stop (SIGINT = 2, SIGTERM = 15).
  int signal() const { return signal_; }

 private:
  int signal_;
};

/// A profiler region used out of order: stop() of a region that is not open.
class ProfilerError : public Error {
 public:
  using Error::Error;
};

/// A volt bug: an invariant that should hold did not.
class InternalError : public Error {
 public:
  using Error::Error;
};

}  // namespace volt
