#pragma once
/// Profiler: times named actions (every hook and loop stage goes through the Trainer's one
/// dispatch point, which calls start/stop around it) and reports when a run ends.

#include <string>

namespace volt {

class Profiler {
 public:
  virtual ~Profiler() = default;
  /// Begins timing `action`; actions may nest but one action name is never re-entered.
  virtual void start(const std::string& action) = 0;
  /// Ends the innermost timing of `action`.
  virtual void stop(const std::string& action) = 0;
  /// Called once when fit/validate/test/predict ends (`stage` is "fit", ...), with the run's
  /// log folder: write or print the report here. Never throws.
  virtual void describe(const std::string& stage, const std::string& log_dir) {}
};

/// Times one action when a profiler is set; free (one branch) when it is not.
class ProfileScope {
 public:
  ProfileScope(Profiler* profiler, const char* action) : profiler_(profiler), action_(action) {
    if (profiler_ != nullptr) profiler_->start(action_);
  }
  ~ProfileScope() {
    if (profiler_ != nullptr) profiler_->stop(action_);
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  Profiler* profiler_;
  const char* action_;
};

}  // namespace volt
