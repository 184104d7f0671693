#include "volt/profiler/simple.h"

#include <algorithm>
#include <filesystem>

#include "core/detail/ascii.h"
#include "core/detail/numbers.h"
#include "core/detail/print.h"
#include "profiler/detail/report_file.h"
#include "volt/core/check.h"
#include "volt/core/log.h"
#include "volt/io/checkpoint_io.h"

namespace volt {

SimpleProfiler::SimpleProfiler(SimpleProfilerOptions options) : options_(std::move(options)) {
  VOLT_CHECK(options_.filename().find('/') == std::string::npos, ConfigError,
             "[SimpleProfiler] filename \"", options_.filename(),
             "\" contains a '/'; put folders in dirpath.");
}

void SimpleProfiler::start(const std::string& action) {
  const auto now = Clock::now();
  if (!started_) {
    first_start_ = now;
    started_ = true;
  }
  open_[action].push_back(now);
}

void SimpleProfiler::stop(const std::string& action) {
  const auto now = Clock::now();
  auto it = open_.find(action);
  VOLT_CHECK(it != open_.end() && !it->second.empty(), ProfilerError, "[SimpleProfiler] stop(\"",
             action, "\") without a matching start(\"", action,
             "\"); call start before stop, or use the scoped profile(\"", action, "\").");
  const double s = std::chrono::duration<double>(now - it->second.back()).count();
  it->second.pop_back();
  Stats& st = stats_[action];
  ++st.calls;
  st.total_s += s;
  st.max_s = std::max(st.max_s, s);
}

std::string SimpleProfiler::summary(const std::string& stage) const {
  const detail::CNumbers c_numbers;  // the table's numbers
  const double run_s =
      started_ ? std::chrono::duration<double>(Clock::now() - first_start_).count() : 0.0;
  std::vector<std::pair<std::string, Stats>> rows(stats_.begin(), stats_.end());
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.total_s > b.second.total_s; });
  size_t w = 6;
  for (const auto& r : rows) w = std::max(w, r.first.size());
  auto os = detail::c_stream<std::ostringstream>();
  std::vector<char> buf(w + 128);  // a row is the name's width and 75 characters
  os << detail::ascii_upper(stage)
     << " Profiler Report (wall time; actions nest, so shares add up to more than 100%)\n";
  std::snprintf(buf.data(), buf.size(), "%-*s | %14s | %10s | %12s | %12s | %8s\n",
                static_cast<int>(w), "Action", "Mean (s)", "Calls", "Max (s)", "Total (s)",
                "Share");
  os << buf.data() << std::string(w + 75, '-') << "\n";
  std::snprintf(buf.data(), buf.size(), "%-*s | %14s | %10s | %12s | %12.5f | %7.1f%%\n",
                static_cast<int>(w), "Total", "-", "-", "-", run_s, 100.0);
  os << buf.data();
  for (const auto& r : rows) {
    const Stats& s = r.second;
    std::snprintf(buf.data(), buf.size(), "%-*s | %14.7f | %10lld | %12.7f | %12.5f | %7.1f%%\n",
                  static_cast<int>(w), r.first.c_str(), s.total_s / s.calls,
                  static_cast<long long>(s.calls), s.max_s, s.total_s,
                  run_s > 0 ? 100.0 * s.total_s / run_s : 0.0);
    os << buf.data();
  }
  return os.str();
}

void SimpleProfiler::setup(const std::string& /*stage*/, int64_t rank,
                           const std::string& /*log_dir*/) {
  rank_ = rank;
}

void SimpleProfiler::describe(const std::string& stage, const std::string& log_dir) {
  const std::string text = summary(stage);
  last_path_.clear();
  if (!open_.empty()) {
    log_warning("SimpleProfiler",
                "regions started but never stopped: " +
                    detail::joined(open_, [](const auto& kv) { return detail::quoted(kv.first); }) +
                    "; their time is not in the report. Call stop() for each start(), or use "
                    "profile(\"name\").");
  }
  try {
    if (options_.filename().empty()) {
      // As Lightning's rank-zero report: one table on the job's terminal, not one per rank.
      if (rank_ == 0) std::fprintf(stderr, "%s", text.c_str());
    } else {
      // Each rank its own file (the ranks share the log folder; Lightning adds the rank too).
      const std::string dir = options_.dirpath().empty() ? log_dir : options_.dirpath();
      std::filesystem::create_directories(dir);
      last_path_ = dir + "/" + stage + "-" + options_.filename() +
                   (rank_ > 0 ? "-rank" + std::to_string(rank_) : "") + ".txt";
      detail::append_report(last_path_, text, "[SimpleProfiler]");
    }
  } catch (const std::exception& e) {
    // A report that cannot be written must not fail the run it describes.
    warn_once("SimpleProfiler.describe", "SimpleProfiler",
              std::string("could not write the report: ") + e.what());
    last_path_.clear();
  }
  stats_.clear();
  open_.clear();
  started_ = false;
}

std::ostream& operator<<(std::ostream& os, const SimpleProfilerOptions& o) {
  return os << "SimpleProfilerOptions(dirpath=" << detail::quoted(o.dirpath())
            << ", filename=" << detail::quoted(o.filename()) << ")";
}

}  // namespace volt
