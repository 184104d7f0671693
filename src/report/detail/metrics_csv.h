#pragma once
// Reading a CSVLogger metrics.csv for the run report: one series per metric column.

#include <cstdint>
#include <string>
#include <vector>

namespace volt {
namespace detail {

struct Point {
  double x, y;  // step, value (may be NaN or +-inf: the file can hold them)
};

struct Series {
  std::string name;
  std::vector<Point> points;  // sorted by step
};

struct MetricsTable {
  std::string path;
  std::vector<Series> series;   // header order, without "epoch"; columns with no value dropped
  std::vector<Point> epochs;    // (step, epoch) from the "epoch" column
  int64_t rows = 0;             // data rows
  double max_step = -1;         // -1 when there are no rows
  int64_t unfinished_line = 0;  // the last line, left out: no newline yet (0: none)
};

/// Parses `path` (header "step,<metric>,..." as volt's CSVLogger writes it, or with "step"
/// among the sorted names as Lightning's does; empty cell = not logged in that row). Throws
/// DataError "[report] <path>:<line>: ..." for a missing header, ragged rows, non-numeric cells.
/// A last line without its newline after the header is left out (`unfinished_line`):
/// CSVLogger ends every row with one, so it is a row still being written (a live or killed
/// run), and a number cut short there would parse as another number.
MetricsTable read_metrics_csv(const std::string& path);

/// The whole file; DataError when it cannot be read.
std::string read_text(const std::string& path);

}  // namespace detail
}  // namespace volt
