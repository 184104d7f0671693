#pragma once
/// SimpleProfiler: wall time per action (calls, mean, total, share of the run), as Lightning's
/// SimpleProfiler; the report is printed (by global rank 0) or written to
/// <dirpath>/<stage>-<filename>.txt (global rank R > 0: <stage>-<filename>-rank<R>.txt).

#include <torch/arg.h>
#include <iosfwd>

#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "volt/profiler/profiler.h"

namespace volt {

struct SimpleProfilerOptions {
  /// Folder for the report file; "" = the run's log folder. Default: "".
  TORCH_ARG(std::string, dirpath);
  /// Report file name stem; "" prints the report to stderr instead (global rank 0 only; with
  /// a name each rank writes its own file). Default: "".
  TORCH_ARG(std::string, filename);
};

std::ostream& operator<<(std::ostream& os, const SimpleProfilerOptions& o);

class SimpleProfiler : public Profiler {
 public:
  explicit SimpleProfiler(SimpleProfilerOptions options = {});
  void setup(const std::string& stage, int64_t rank, const std::string& log_dir) override;
  void start(const std::string& action) override;
  void stop(const std::string& action) override;
  void describe(const std::string& stage, const std::string& log_dir) override;

  struct Stats {
    int64_t calls = 0;
    double total_s = 0;
    double max_s = 0;
  };
  /// Per-action totals since the last describe().
  const std::map<std::string, Stats>& stats() const { return stats_; }
  /// The report table of the current totals.
  std::string summary(const std::string& stage) const;
  /// Path of the last report file ("" when printed).
  const std::string& last_report_path() const { return last_path_; }

 private:
  using Clock = std::chrono::steady_clock;
  SimpleProfilerOptions options_;
  std::map<std::string, Stats> stats_;
  std::map<std::string, std::vector<Clock::time_point>> open_;
  Clock::time_point first_start_{};
  bool started_ = false;
  int64_t rank_ = 0;  // global rank, from setup()
  std::string last_path_;
};

}  // namespace volt
