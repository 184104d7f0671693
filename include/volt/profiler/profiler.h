#pragma once
/// Profiler: times named actions (every hook and loop stage goes through the Trainer's one
/// dispatch point, which calls start/stop around it) and reports when a run ends.

#include <cstdint>
#include <string>
#include <utility>

#include "volt/core/errors.h"

namespace volt {

class ProfileRegion;

class Profiler {
 public:
  virtual ~Profiler() = default;
  /// Called once per fit/validate/test/predict after the processes are set up and before the
  /// first hook: the entry point ("fit", ...), this process's global rank and the run's log
  /// folder. Default: nothing.
  virtual void setup(const std::string& stage, int64_t rank, const std::string& log_dir) {}
  /// Begins timing `action`; actions may nest, and a name may be open more than once.
  virtual void start(const std::string& action) = 0;
  /// Ends the innermost open timing of `action`. A stop without a matching start throws
  /// ProfilerError in profilers that check (TorchProfiler, SimpleProfiler).
  virtual void stop(const std::string& action) = 0;
  /// Called once when fit/validate/test/predict ends (`stage` is "fit", ...), with the run's
  /// log folder: write or print the report here. Never throws.
  virtual void describe(const std::string& stage, const std::string& log_dir) {}
  /// A custom region: start(name) now, stop(name) when the returned guard goes out of scope.
  /// Example, inside a Module: `auto r = profiler().profile("augment");`
  ProfileRegion profile(std::string name);
};

/// A scoped start/stop pair on a profiler (see Profiler::profile); movable, not copyable.
class ProfileRegion {
 public:
  ProfileRegion(Profiler* profiler, std::string name)
      : profiler_(profiler), name_(std::move(name)) {
    if (profiler_ != nullptr) profiler_->start(name_);
  }
  ProfileRegion(ProfileRegion&& o) noexcept : profiler_(o.profiler_), name_(std::move(o.name_)) {
    o.profiler_ = nullptr;
  }
  ProfileRegion(const ProfileRegion&) = delete;
  ProfileRegion& operator=(const ProfileRegion&) = delete;
  ProfileRegion& operator=(ProfileRegion&&) = delete;
  /// Stops the region; an error from stop() (the region was already stopped by hand) is
  /// logged, never thrown from the destructor.
  ~ProfileRegion();

 private:
  Profiler* profiler_;
  std::string name_;
};

inline ProfileRegion Profiler::profile(std::string name) {
  return ProfileRegion(this, std::move(name));
}

/// A profiler that records nothing: what Module::profiler() hands out when the Trainer has none,
/// so user regions cost a virtual call and need no null check.
class PassThroughProfiler : public Profiler {
 public:
  void start(const std::string&) override {}
  void stop(const std::string&) override {}
};

namespace detail {
/// profiler.stop(action), an error logged instead of thrown: for destructors, which must not
/// throw (a user's own stop of a Trainer action would otherwise end the process).
void stop_logging_errors(Profiler& profiler, const std::string& action) noexcept;
}  // namespace detail

/// Times one action when a profiler is set; free (one branch) when it is not.
class ProfileScope {
 public:
  ProfileScope(Profiler* profiler, const char* action) : profiler_(profiler), action_(action) {
    if (profiler_ != nullptr) profiler_->start(action_);
  }
  ~ProfileScope() {
    if (profiler_ != nullptr) detail::stop_logging_errors(*profiler_, action_);
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  Profiler* profiler_;
  const char* action_;
};

}  // namespace volt
