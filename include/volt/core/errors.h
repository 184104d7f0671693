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
