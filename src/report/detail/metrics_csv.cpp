#include "metrics_csv.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>

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

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && detail::ascii_space(s[b])) ++b;
  while (e > b && detail::ascii_space(s[e - 1])) --e;
  return s.substr(b, e - b);
}

bool is_blank(const CsvRecord& r) {
  return r.cells.size() == 1 && trim(r.cells[0]).empty();
}

bool parse_number(const std::string& text, double* out) {
  const std::string s = trim(text);
  if (s.empty()) return false;
  char* end = nullptr;
  *out = c_strtod(s.c_str(), &end);
  return end == s.c_str() + s.size();
}

}  // namespace

MetricsTable read_metrics_csv(const std::string& path) {
  std::string text = read_text(path);
  int64_t unfinished_line = 0;
  const size_t last_newline = text.rfind('\n');
  if (last_newline != std::string::npos && last_newline + 1 < text.size()) {
    unfinished_line = std::count(text.begin(), text.end(), '\n') + 1;
    text.resize(last_newline + 1);
  }
  const std::vector<CsvRecord> records = parse_csv(text, "[report] " + path);
  size_t r = 0;
  while (r < records.size() && is_blank(records[r])) ++r;
  VOLT_CHECK(r < records.size(), DataError, "[report] ", path,
             ":1: no header line (the file is empty); expected 'step,<metric>,...' as "
             "CSVLogger writes it.");
  // The names as CSVLogger wrote them (not trimmed: " loss" and "loss" are two metrics).
  const std::vector<std::string>& header = records[r].cells;
  metrics_header(records[r], "[report] " + path);

  MetricsTable run;
  run.path = path;
  run.unfinished_line = unfinished_line;
  std::vector<Series> columns(header.size());
  for (++r; r < records.size(); ++r) {
    if (is_blank(records[r])) continue;
    const auto& cells = records[r].cells;
    const int64_t lineno = records[r].line;
    VOLT_CHECK(cells.size() == header.size(), DataError, "[report] ", path, ":", lineno,
               ": ragged row with ", cells.size(), " cells but the header has ", header.size(),
               " columns; the file was cut off or edited, repair or delete that line.");
    double step = 0;
    VOLT_CHECK(parse_number(cells[0], &step) && std::isfinite(step) && step == std::floor(step),
               DataError, "[report] ", path, ":", lineno, ": step '", cells[0],
               "' is not an integer; repair or delete that line.");
    for (size_t c = 1; c < cells.size(); ++c) {
      if (trim(cells[c]).empty()) continue;  // not logged in this row
      double v = 0;
      VOLT_CHECK(parse_number(cells[c], &v), DataError, "[report] ", path, ":", lineno, ": cell '",
                 cells[c], "' in column '", header[c],
                 "' is not a number; repair or delete that line.");
      columns[c].points.push_back({step, v});
    }
    run.max_step = std::max(run.max_step, step);
    ++run.rows;
  }
  for (size_t c = 1; c < header.size(); ++c) {
    auto& pts = columns[c].points;
    // Rows are written in step order; a stable sort only guards hand-merged files.
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
