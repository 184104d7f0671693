#include "metrics_csv.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "core/detail/ascii.h"
#include "core/detail/numbers.h"
#include "loggers/detail/csv_format.h"
#include "volt/core/check.h"

namespace volt {
namespace detail {

std::string read_text(const std::string& path) {
  auto in = detail::c_stream<std::ifstream>(path, std::ios::binary);
  VOLT_CHECK(in.good(), DataError, "[report] cannot read '", path, "' (", std::strerror(errno),
             "); check the file's permissions.");
  auto os = detail::c_stream<std::ostringstream>();
  os << in.rdbuf();
  return os.str();
}

namespace {

bool is_blank(const CsvRecord& r) {
  return r.cells.size() == 1 && ascii_trim(r.cells[0]).empty();
}

bool parse_number(const std::string& text, double* out) {
  const std::string s(ascii_trim(text));
  if (s.empty()) return false;
  char* end = nullptr;
  *out = c_strtod(s.c_str(), &end);
  return end == s.c_str() + s.size();
}

}  // namespace

MetricsTable read_metrics_csv(const std::string& path) {
  // Read one record at a time: the memory is the table's values, not the file's text and cells
  // (a metrics.csv is as long as its run).
  auto in = detail::c_stream<std::ifstream>(path, std::ios::binary);
  VOLT_CHECK(in.is_open(), DataError, "[report] cannot read '", path, "' (", std::strerror(errno),
             "); check the file's permissions.");
  CsvReader reader(in, "[report] " + path);
  CsvRecord rec;
  bool found = false;
  while ((found = reader.next(rec)) && is_blank(rec)) {
  }
  VOLT_CHECK(found, DataError, "[report] ", path,
             ":1: no header line (the file is empty); expected 'step,<metric>,...' as "
             "CSVLogger writes it.");
  // The names as CSVLogger wrote them (not trimmed: " loss" and "loss" are two metrics); the
  // step's column is the first in volt's files, anywhere in Lightning's (sorted by name).
  const MetricsHeader h = metrics_header(rec, "[report] " + path);
  const std::vector<std::string>& header = h.names;

  MetricsTable run;
  run.path = path;
  std::vector<Series> columns(header.size());
  while (reader.next(rec)) {
    if (!rec.complete) {
      // A last line without its newline: CSVLogger ends every row with one, so it is a row still
      // being written (a live or killed run); a number cut short there would parse as another.
      run.unfinished_line = rec.line;
      break;
    }
    if (is_blank(rec)) continue;
    const auto& cells = rec.cells;
    const int64_t lineno = rec.line;
    VOLT_CHECK(cells.size() == header.size(), DataError, "[report] ", path, ":", lineno,
               ": ragged row with ", cells.size(), " cells but the header has ", header.size(),
               " columns; the file was cut off or edited, repair or delete that line.");
    double step = 0;
    const std::string& step_cell = cells[h.step];
    VOLT_CHECK(parse_number(step_cell, &step) && std::isfinite(step) && step == std::floor(step),
               DataError, "[report] ", path, ":", lineno, ": step '", step_cell,
               "' is not an integer; repair or delete that line.");
    for (size_t c = 0; c < cells.size(); ++c) {
      if (c == h.step || ascii_trim(cells[c]).empty()) continue;  // not logged in this row
      double v = 0;
      VOLT_CHECK(parse_number(cells[c], &v), DataError, "[report] ", path, ":", lineno, ": cell '",
                 cells[c], "' in column '", header[c],
                 "' is not a number; repair or delete that line.");
      columns[c].points.push_back({step, v});
    }
    run.max_step = std::max(run.max_step, step);
    ++run.rows;
  }
  for (size_t c = 0; c < header.size(); ++c) {
    if (c == h.step) continue;
    auto& pts = columns[c].points;
    // Rows are mostly in step order (a validate() after a fit, or Lightning's validation rows,
    // start their own count): a stable sort orders each series.
    std::stable_sort(pts.begin(), pts.end(),
                     [](const Point& a, const Point& b) { return a.x < b.x; });
    if (header[c] == "epoch") {
      run.epochs = std::move(pts);
    } else if (!pts.empty()) {
      columns[c].name = header[c];
      run.series.push_back(std::move(columns[c]));
    }
  }
  return run;
}

}  // namespace detail
}  // namespace volt
