// The run report deliberately includes no torch header: it only reads text files and writes
// text, so it compiles in about a second (CMakeLists.txt skips the torch PCH for it).
#include "volt/report/run_report.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <limits>
#include <ostream>
#include <sstream>
#include <vector>

#include "../loggers/detail/log_dir.h"
#include "volt/core/check.h"

namespace volt {

std::ostream& operator<<(std::ostream& os, const ReportOptions& o) {
  return os << "ReportOptions(output=\"" << o.output() << "\", title=\"" << o.title()
            << "\", max_points=" << o.max_points() << ", interactive=" << std::boolalpha
            << o.interactive() << std::noboolalpha << ")";
}

namespace {

// ------------------------------------------------------------------ files

bool is_file(const std::string& path) {
  struct stat sb;
  return ::stat(path.c_str(), &sb) == 0 && S_ISREG(sb.st_mode);
}

bool is_dir(const std::string& path) {
  struct stat sb;
  return ::stat(path.c_str(), &sb) == 0 && S_ISDIR(sb.st_mode);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  VOLT_CHECK(in.good(), DataError, "[report] cannot read '", path, "' (", std::strerror(errno),
             "); check the file's permissions.");
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

std::string strip_trailing_slashes(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

std::string base_name(const std::string& path) {
  const std::string p = strip_trailing_slashes(path);
  const auto slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

std::string parent_dir(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// Temp file in the same folder, fsync, rename: a reader (or a browser refreshing the page)
// never sees a half-written report.
void write_atomically(const std::string& path, const std::string& data) {
  detail::make_dirs(parent_dir(path), "report");
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  VOLT_CHECK(f != nullptr, ConfigError, "[report] cannot create '", tmp, "' (",
             std::strerror(errno), "); pass a writable output path (ReportOptions::output).");
  const bool ok = std::fwrite(data.data(), 1, data.size(), f) == data.size() &&
                  std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  const int err = errno;
  std::fclose(f);
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = ok ? errno : err;
    ::unlink(tmp.c_str());
    VOLT_CHECK(false, ConfigError, "[report] writing '", path, "' failed (", std::strerror(e),
               "); check free disk space and that the folder is writable.");
  }
}

// ------------------------------------------------------------------ metrics.csv

struct Point {
  double x, y;
};

struct Series {
  std::string name;
  std::vector<Point> points;  // sorted by step
};

struct RunData {
  std::string metrics_path;
  std::vector<Series> series;  // header order, without "epoch"
  std::vector<Point> epochs;   // (step, epoch) from the "epoch" column
  int64_t rows = 0;
  double max_step = -1;
};

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

// One CSV line as CSVLogger writes it: cells split at commas, a cell may be quoted ("" inside
// quotes is one quote). Quoted newlines are not supported (CSVLogger never writes them in rows).
std::vector<std::string> split_csv(const std::string& line, const std::string& path,
                                   int64_t lineno) {
  std::vector<std::string> cells;
  std::string cell;
  size_t i = 0;
  for (;;) {
    cell.clear();
    if (i < line.size() && line[i] == '"') {
      ++i;
      bool closed = false;
      while (i < line.size()) {
        if (line[i] == '"') {
          if (i + 1 < line.size() && line[i + 1] == '"') {
            cell += '"';
            i += 2;
            continue;
          }
          closed = true;
          ++i;
          break;
        }
        cell += line[i++];
      }
      VOLT_CHECK(closed, DataError, "[report] ", path, ":", lineno,
                 ": a quoted cell is not closed; repair or delete that line.");
      VOLT_CHECK(i == line.size() || line[i] == ',', DataError, "[report] ", path, ":", lineno,
                 ": text after a closing quote; repair or delete that line.");
    } else {
      while (i < line.size() && line[i] != ',') cell += line[i++];
    }
    cells.push_back(cell);
    if (i >= line.size()) break;
    ++i;  // the comma
  }
  return cells;
}

bool parse_number(const std::string& text, double* out) {
  const std::string s = trim(text);
  if (s.empty()) return false;
  char* end = nullptr;
  *out = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size();
}

RunData read_metrics(const std::string& path) {
  const std::string text = read_text(path);
  std::istringstream in(text);
  std::string line;
  int64_t lineno = 0;
  std::vector<std::string> header;
  while (header.empty() && std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!trim(line).empty()) header = split_csv(line, path, lineno);
  }
  VOLT_CHECK(!header.empty(), DataError, "[report] ", path,
             ":1: no header line (the file is empty); expected 'step,<metric>,...' as "
             "CSVLogger writes it.");
  VOLT_CHECK(trim(header[0]) == "step", DataError, "[report] ", path, ":", lineno,
             ": the header starts with '", header[0],
             "', not 'step'; pass a metrics.csv written by CSVLogger.");
  for (size_t c = 1; c < header.size(); ++c) {
    header[c] = trim(header[c]);
    VOLT_CHECK(!header[c].empty(), DataError, "[report] ", path, ":", lineno, ": column ", c + 1,
               " of the header has no name; repair the header line.");
    for (size_t d = 1; d < c; ++d) {
      VOLT_CHECK(header[d] != header[c], DataError, "[report] ", path, ":", lineno, ": column '",
                 header[c], "' appears twice in the header; repair the header.");
    }
  }

  RunData run;
  run.metrics_path = path;
  std::vector<Series> columns(header.size());
  while (std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (trim(line).empty()) continue;
    const auto cells = split_csv(line, path, lineno);
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

// ------------------------------------------------------------------ the run folder

struct Source {
  std::string dir;   // folder holding metrics.csv
  std::string note;  // why a version_N sub-folder was chosen (empty when run_dir itself)
};

Source find_source(const std::string& run_dir) {
  const std::string dir = strip_trailing_slashes(run_dir);
  VOLT_CHECK(is_dir(dir), DataError, "[report] run folder '", run_dir,
             "' does not exist; pass a CSVLogger run folder (save_dir/name/version_N).");
  if (is_file(dir + "/metrics.csv")) return {dir, ""};
  int64_t best = -1;
  int64_t count = 0;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name.rfind("version_", 0) != 0 || name.size() == 8 ||
          name.find_first_not_of("0123456789", 8) != std::string::npos) {
        continue;
      }
      if (!is_file(dir + "/" + name + "/metrics.csv")) continue;
      ++count;
      best = std::max<int64_t>(best, std::stoll(name.substr(8)));
    }
    ::closedir(d);
  }
  VOLT_CHECK(best >= 0, DataError, "[report] no metrics.csv in '", run_dir,
             "' nor in any version_N sub-folder of it; pass the folder a CSVLogger wrote "
             "(save_dir/name/version_N) or its parent.");
  const std::string v = "version_" + std::to_string(best);
  Source s{dir + "/" + v, ""};
  s.note = "'" + run_dir + "' has no metrics.csv; showing " + v + ", the newest of " +
           std::to_string(count) + (count == 1 ? " run" : " runs") + " in it.";
  return s;
}

// ------------------------------------------------------------------ formatting

std::string html_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '<') {
      out += "\\u003c";  // never "</script>" inside the data block
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

// A metric value for tables and legends: 5 significant digits, big values (throughputs) as
// whole numbers with thousands separators, inf/nan spelled out.
std::string fmt_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+inf" : "-inf";
  if (std::fabs(v) < 1e4 || std::fabs(v) >= 1e15) return fmt("%.5g", v);
  std::string digits = fmt("%.0f", std::fabs(v));
  for (int i = static_cast<int>(digits.size()) - 3; i > 0; i -= 3) digits.insert(i, ",");
  return (v < 0 ? "-" : "") + digits;
}

std::string fmt_step(double s) { return fmt("%.0f", s); }

// ------------------------------------------------------------------ axes

struct Axis {
  double lo, hi;              // data domain mapped onto the plot
  std::vector<double> ticks;  // tick values inside [lo, hi]
  double step;                // tick spacing
};

// Heckbert's "nice numbers" (Graphics Gems, 1990): 1, 2, 5 times a power of ten.
double nice_number(double x, bool round) {
  const double e = std::floor(std::log10(x));
  const double f = x / std::pow(10.0, e);
  double n;
  if (round) {
    n = f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10;
  } else {
    n = f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10;
  }
  return n * std::pow(10.0, e);
}

// Ticks for [lo, hi]. `extend` widens the domain to whole ticks (y axes); `min_step` keeps
// integer axes (steps) from getting fractional ticks. Degenerate ranges (one value, one point)
// are widened first so nothing divides by zero.
Axis make_axis(double lo, double hi, int target, bool extend, double min_step) {
  if (!(hi - lo > 1e-12 * std::max(std::fabs(lo), std::fabs(hi)))) {
    const double pad = lo == 0 ? 1.0 : std::fabs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
  Axis a;
  const double range = nice_number(hi - lo, false);
  a.step = std::max(nice_number(range / std::max(target - 1, 1), true), min_step);
  const double first = std::ceil(lo / a.step - 1e-9) * a.step;
  if (extend) {
    a.lo = std::floor(lo / a.step + 1e-9) * a.step;
    a.hi = std::ceil(hi / a.step - 1e-9) * a.step;
  } else {
    a.lo = lo;
    a.hi = hi;
  }
  for (double t = extend ? a.lo : first; t <= a.hi + a.step * 1e-9; t += a.step) {
    a.ticks.push_back(std::fabs(t) < a.step * 1e-9 ? 0.0 : t);
    if (a.ticks.size() > 50) break;  // only reachable through rounding trouble
  }
  return a;
}

// Tick labels share one format per axis: SI suffixes for big numbers (throughput), scientific
// for small ones (learning rates), otherwise just enough decimals to tell ticks apart.
std::string fmt_tick(double v, const Axis& a) {
  const double mag = std::max(std::fabs(a.lo), std::fabs(a.hi));
  const int step_exp = static_cast<int>(std::floor(std::log10(a.step) + 1e-9));
  if (mag >= 1e4) {
    if (v == 0) return "0";
    const char* suffix = mag >= 1e9 ? "G" : mag >= 1e6 ? "M" : "k";
    const double unit = mag >= 1e9 ? 1e9 : mag >= 1e6 ? 1e6 : 1e3;
    const int decimals =
        std::max(0, -static_cast<int>(std::floor(std::log10(a.step / unit) + 1e-9)));
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f%s", decimals, v / unit, suffix);
    return buf;
  }
  if (mag < 1e-3 && mag > 0) {
    if (v == 0) return "0";
    const int v_exp = static_cast<int>(std::floor(std::log10(std::fabs(v)) + 1e-9));
    const int digits = std::max(0, std::min(6, v_exp - step_exp));
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*e", digits, v);
    return buf;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", std::max(0, -step_exp), v);
  return buf;
}

// ------------------------------------------------------------------ grouping

enum class Group { kLoss, kAccuracy, kLearningRate, kThroughput, kOther };
constexpr Group kGroups[] = {Group::kLoss, Group::kAccuracy, Group::kLearningRate,
                             Group::kThroughput, Group::kOther};

const char* group_title(Group g) {
  switch (g) {
    case Group::kLoss: return "Loss";
    case Group::kAccuracy: return "Accuracy";
    case Group::kLearningRate: return "Learning rate";
    case Group::kThroughput: return "Throughput";
    case Group::kOther: return "Other metrics";
  }
  return "";
}

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }
bool starts_with(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }
bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

Group group_of(const std::string& name) {
  std::string n = name;
  for (char& c : n) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // LearningRateMonitor names: "lr-<Optimizer>[/pg<i>][-momentum|-weight_decay]".
  if (n == "lr" || starts_with(n, "lr-") || starts_with(n, "lr_") || starts_with(n, "lr/") ||
      contains(n, "learning_rate")) {
    // Momentum and weight decay live on other scales than the rate itself.
    return ends_with(n, "-momentum") || ends_with(n, "-weight_decay") ? Group::kOther
                                                                      : Group::kLearningRate;
  }
  if (contains(n, "per_sec") || contains(n, "throughput")) return Group::kThroughput;
  if (contains(n, "loss")) return Group::kLoss;
  if (contains(n, "acc")) return Group::kAccuracy;
  return Group::kOther;
}

// "train_loss_step" and "train_loss_epoch" are one metric seen at two cadences.
std::string base_metric(const std::string& name) {
  for (const char* suffix : {"_step", "_epoch"}) {
    if (ends_with(name, suffix) && name.size() > std::strlen(suffix)) {
      return name.substr(0, name.size() - std::strlen(suffix));
    }
  }
  return name;
}

// Which extreme is "best": losses go down, accuracies up; other metrics have no direction.
int best_direction(Group g) { return g == Group::kLoss ? -1 : g == Group::kAccuracy ? 1 : 0; }

struct Stats {
  int64_t points = 0, non_finite = 0;
  bool has_finite = false;
  Point last{0, 0}, min{0, 0}, max{0, 0};
};

Stats stats_of(const Series& s) {
  Stats st;
  st.points = static_cast<int64_t>(s.points.size());
  for (const auto& p : s.points) {
    if (!std::isfinite(p.y)) {
      ++st.non_finite;
      continue;
    }
    if (!st.has_finite || p.y < st.min.y) st.min = p;
    if (!st.has_finite || p.y > st.max.y) st.max = p;
    st.last = p;
    st.has_finite = true;
  }
  return st;
}

// Keeps each bucket's minimum and maximum (in step order), so spikes survive thinning; a
// non-finite value in a bucket is kept as a gap.
std::vector<Point> decimate(const std::vector<Point>& pts, int64_t max_points) {
  if (static_cast<int64_t>(pts.size()) <= max_points) return pts;
  const size_t buckets = static_cast<size_t>(max_points / 2);
  std::vector<Point> out;
  for (size_t b = 0; b < buckets; ++b) {
    const size_t lo = b * pts.size() / buckets, hi = (b + 1) * pts.size() / buckets;
    const Point* mn = nullptr;
    const Point* mx = nullptr;
    const Point* gap = nullptr;
    for (size_t i = lo; i < hi; ++i) {
      const Point& p = pts[i];
      if (!std::isfinite(p.y)) {
        gap = &p;
      } else {
        if (!mn || p.y < mn->y) mn = &p;
        if (!mx || p.y > mx->y) mx = &p;
      }
    }
    if (mn && mx) {
      if (mn == mx) {
        out.push_back(*mn);
      } else {
        out.push_back(mn->x <= mx->x ? *mn : *mx);
        out.push_back(mn->x <= mx->x ? *mx : *mn);
      }
    }
    if (gap) out.push_back(*gap);
  }
  return out;
}

// Tableau 10: distinct for common colour-vision deficiencies and readable on white.
const char* const kPalette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};

struct Plot {
  Group group;
  std::string subtitle;        // base metric name when a group has one plot per metric
  std::vector<size_t> series;  // indices into RunData::series
};

std::vector<Plot> make_plots(const RunData& run) {
  std::vector<Plot> plots;
  for (Group g : kGroups) {
    // Losses, accuracies and learning rates share a scale: one plot each. Throughputs and other
    // metrics may differ by orders of magnitude: one plot per metric (its _step/_epoch together).
    const bool shared = g == Group::kLoss || g == Group::kAccuracy || g == Group::kLearningRate;
    std::vector<Plot> mine;
    for (size_t i = 0; i < run.series.size(); ++i) {
      if (group_of(run.series[i].name) != g) continue;
      const std::string base = shared ? "" : base_metric(run.series[i].name);
      auto it =
          std::find_if(mine.begin(), mine.end(), [&](const Plot& p) { return p.subtitle == base; });
      if (it == mine.end()) {
        mine.push_back({g, base, {}});
        it = mine.end() - 1;
      }
      it->series.push_back(i);
    }
    if (g == Group::kThroughput) {  // samples/s is the headline, batches/s the detail
      std::stable_sort(mine.begin(), mine.end(), [](const Plot& a, const Plot& b) {
        return contains(a.subtitle, "samples") && !contains(b.subtitle, "samples");
      });
    }
    plots.insert(plots.end(), mine.begin(), mine.end());
  }
  return plots;
}

// ------------------------------------------------------------------ SVG

std::string axis_label(const Plot& plot) {
  switch (plot.group) {
    case Group::kLoss: return "loss";
    case Group::kAccuracy: return "accuracy";
    case Group::kLearningRate: return "learning rate";
    case Group::kThroughput:
      if (contains(plot.subtitle, "samples")) return "samples / s";
      if (contains(plot.subtitle, "batches")) return "batches / s";
      return "per second";
    case Group::kOther: break;
  }
  return "value";
}

constexpr double kW = 560, kH = 270;
constexpr double kLeft = 64, kRight = 14, kTop = 12, kBottom = 40;

// Steps where an epoch's rows were logged last: the epoch boundaries drawn as faint lines.
std::vector<std::pair<double, double>> epoch_ends(const RunData& run) {
  std::vector<std::pair<double, double>> ends;  // (step, epoch)
  for (const auto& p : run.epochs) {
    if (!ends.empty() && ends.back().second == p.y) {
      ends.back().first = std::max(ends.back().first, p.x);
    } else {
      ends.push_back({p.x, p.y});
    }
  }
  return ends;
}

void write_plot(std::ostream& os, const RunData& run, const Plot& plot, size_t plot_id,
                const ReportOptions& options, std::ostream& data_js) {
  std::vector<std::vector<Point>> drawn;
  double xlo = std::numeric_limits<double>::infinity(), xhi = -xlo, ylo = xlo, yhi = -xlo;
  for (size_t i : plot.series) {
    drawn.push_back(decimate(run.series[i].points, options.max_points()));
    for (const auto& p : run.series[i].points) {
      xlo = std::min(xlo, p.x);
      xhi = std::max(xhi, p.x);
      if (std::isfinite(p.y)) {
        ylo = std::min(ylo, p.y);
        yhi = std::max(yhi, p.y);
      }
    }
  }
  const bool any_finite = ylo <= yhi;
  if (!any_finite) ylo = yhi = 0;
  if (xhi - xlo < 1) {  // one step: centre it on a two-step axis
    xlo = std::max(0.0, xlo - 1);
    xhi = xlo + 2;
  } else if (xlo > 0 && xlo <= 0.1 * xhi) {
    xlo = 0;  // runs start at step 0; the first log comes a few steps later
  }
  const Axis ax = make_axis(xlo, xhi, 7, false, 1);
  // Throughput reads as a fraction of the best: start it at zero.
  if (plot.group == Group::kThroughput && ylo > 0) ylo = 0;
  const Axis ay = make_axis(ylo, yhi, 5, true, 0);
  const double pw = kW - kLeft - kRight, ph = kH - kTop - kBottom;
  auto sx = [&](double x) { return kLeft + (x - ax.lo) / (ax.hi - ax.lo) * pw; };
  auto sy = [&](double y) { return kTop + ph - (y - ay.lo) / (ay.hi - ay.lo) * ph; };

  os << "<svg class=\"plot\" id=\"plot" << plot_id << "\" viewBox=\"0 0 " << kW << " " << kH
     << "\" role=\"img\" aria-label=\"" << html_escape(group_title(plot.group))
     << (plot.subtitle.empty() ? "" : " " + html_escape(plot.subtitle)) << " by step\">\n";
  // Grid and tick labels.
  for (double t : ay.ticks) {
    const double y = sy(t);
    os << "<line class=\"grid\" x1=\"" << kLeft << "\" x2=\"" << kW - kRight << "\" y1=\""
       << fmt("%.1f", y) << "\" y2=\"" << fmt("%.1f", y) << "\"/>"
       << "<text class=\"tick\" x=\"" << kLeft - 6 << "\" y=\"" << fmt("%.1f", y + 3.5)
       << "\" text-anchor=\"end\">" << fmt_tick(t, ay) << "</text>\n";
  }
  for (double t : ax.ticks) {
    const double x = sx(t);
    os << "<line class=\"grid-x\" x1=\"" << fmt("%.1f", x) << "\" x2=\"" << fmt("%.1f", x)
       << "\" y1=\"" << kTop << "\" y2=\"" << kTop + ph << "\"/>"
       << "<text class=\"tick\" x=\"" << fmt("%.1f", x) << "\" y=\"" << kTop + ph + 15
       << "\" text-anchor=\"middle\">" << fmt_tick(t, ax) << "</text>\n";
  }
  // Epoch boundaries (all but the last, which is the end of the plot anyway).
  const auto ends = epoch_ends(run);
  if (ends.size() > 1 && ends.size() <= 40) {
    for (size_t e = 0; e + 1 < ends.size(); ++e) {
      const double s = ends[e].first + 0.5;
      if (s <= ax.lo || s >= ax.hi) continue;
      os << "<line class=\"epoch\" x1=\"" << fmt("%.1f", sx(s)) << "\" x2=\"" << fmt("%.1f", sx(s))
         << "\" y1=\"" << kTop << "\" y2=\"" << kTop + ph << "\"><title>end of epoch "
         << fmt_step(ends[e].second) << "</title></line>\n";
    }
  }
  os << "<line class=\"axis\" x1=\"" << kLeft << "\" x2=\"" << kW - kRight << "\" y1=\""
     << kTop + ph << "\" y2=\"" << kTop + ph << "\"/>"
     << "<line class=\"axis\" x1=\"" << kLeft << "\" x2=\"" << kLeft << "\" y1=\"" << kTop
     << "\" y2=\"" << kTop + ph << "\"/>\n";
  os << "<text class=\"label\" x=\"" << kLeft + pw / 2 << "\" y=\"" << kH - 6
     << "\" text-anchor=\"middle\">step</text>"
     << "<text class=\"label\" transform=\"translate(13 " << kTop + ph / 2
     << ") rotate(-90)\" text-anchor=\"middle\">" << axis_label(plot) << "</text>\n";
  if (!any_finite) {
    os << "<text class=\"empty\" x=\"" << kLeft + pw / 2 << "\" y=\"" << kTop + ph / 2
       << "\" text-anchor=\"middle\">no finite values</text>\n";
  }

  // One path per series; a non-finite value breaks the line. Short series (epoch metrics,
  // validation) also get markers with a native tooltip, which needs no script.
  data_js << (plot_id ? ",\n" : "") << "{\"id\":\"plot" << plot_id << "\",\"x\":["
          << fmt("%.10g", ax.lo) << "," << fmt("%.10g", ax.hi) << "],\"y\":[" << fmt("%.10g", ay.lo)
          << "," << fmt("%.10g", ay.hi) << "],\"box\":[" << kLeft << "," << kTop << "," << pw << ","
          << ph << "],\"series\":[";
  for (size_t k = 0; k < plot.series.size(); ++k) {
    const Series& s = run.series[plot.series[k]];
    const char* colour = kPalette[k % (sizeof kPalette / sizeof kPalette[0])];
    const auto& pts = drawn[k];
    std::string d;
    std::vector<Point> lonely;  // one-point segments, drawn as dots
    bool open = false;
    size_t seg_len = 0;
    Point seg_first{0, 0};
    for (const auto& p : pts) {
      if (!std::isfinite(p.y)) {
        if (open && seg_len == 1) lonely.push_back(seg_first);
        open = false;
        continue;
      }
      d += (open ? "L" : "M") + fmt("%.1f", sx(p.x)) + " " + fmt("%.1f", sy(p.y));
      if (!open) {
        seg_first = p;
        seg_len = 0;
      }
      open = true;
      ++seg_len;
    }
    if (open && seg_len == 1) lonely.push_back(seg_first);
    os << "<g class=\"series\" data-name=\"" << html_escape(s.name) << "\">";
    if (!d.empty()) {
      os << "<path d=\"" << d << "\" fill=\"none\" stroke=\"" << colour
         << "\" stroke-width=\"1.8\" stroke-linejoin=\"round\" stroke-linecap=\"round\"/>";
    }
    const bool markers = pts.size() <= 60;
    for (const auto& p : pts) {
      const bool single = std::any_of(lonely.begin(), lonely.end(),
                                      [&](const Point& q) { return q.x == p.x && q.y == p.y; });
      if (!std::isfinite(p.y) || !(markers || single)) continue;
      os << "<circle cx=\"" << fmt("%.1f", sx(p.x)) << "\" cy=\"" << fmt("%.1f", sy(p.y))
         << "\" r=\"3\" fill=\"" << colour << "\"><title>" << html_escape(s.name) << " = "
         << fmt_value(p.y) << " at step " << fmt_step(p.x) << "</title></circle>";
    }
    os << "</g>\n";
    data_js << (k ? "," : "") << "{\"name\":\"" << json_escape(s.name) << "\",\"color\":\""
            << colour << "\",\"p\":[";
    for (size_t j = 0; j < pts.size(); ++j) {
      data_js << (j ? "," : "") << "[" << fmt("%.0f", pts[j].x) << ","
              << (std::isfinite(pts[j].y) ? fmt("%.6g", pts[j].y) : std::string("null")) << "]";
    }
    data_js << "]}";
  }
  data_js << "]}";
  os << "<line class=\"cursor\" id=\"plot" << plot_id << "-cursor\" x1=\"0\" x2=\"0\" y1=\"" << kTop
     << "\" y2=\"" << kTop + ph << "\" visibility=\"hidden\"/>\n";
  os << "</svg>\n";
}

// ------------------------------------------------------------------ page

const char* const kStyle = R"CSS(
:root{--bg:#f4f5f7;--card:#fff;--ink:#1f2933;--muted:#6b7280;--line:#e3e6ea;--accent:#4e79a7}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--ink);
 font:14px/1.5 -apple-system,BlinkMacSystemFont,"Segoe UI",Roboto,"Helvetica Neue",Arial,
 "Noto Sans","Liberation Sans","DejaVu Sans",sans-serif}
header{background:#fff;border-bottom:1px solid var(--line);padding:22px 32px 18px}
header h1{margin:0;font-size:22px;font-weight:650;letter-spacing:-.01em}
header .sub{color:var(--muted);margin-top:4px;font-size:13px;word-break:break-all}
header .brand{float:right;color:var(--muted);font-size:12px;text-transform:uppercase;
 letter-spacing:.08em;font-weight:600}
main{max-width:1280px;margin:0 auto;padding:20px 32px 40px}
.note{background:#fff8e6;border:1px solid #f3d999;color:#7a5b00;border-radius:8px;
 padding:10px 14px;margin-bottom:16px}
.tiles{display:grid;grid-template-columns:repeat(auto-fit,minmax(160px,1fr));gap:12px;
 margin-bottom:20px}
.tile{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:12px 16px}
.tile .k{color:var(--muted);font-size:12px;text-transform:uppercase;letter-spacing:.05em}
.tile .v{font-size:24px;font-weight:600;font-variant-numeric:tabular-nums;margin-top:2px}
.tile .d{color:var(--muted);font-size:12px;white-space:nowrap;overflow:hidden;
 text-overflow:ellipsis}
h2{font-size:13px;text-transform:uppercase;letter-spacing:.07em;color:var(--muted);
 margin:26px 0 10px;font-weight:650}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(520px,1fr));gap:16px}
.card{background:var(--card);border:1px solid var(--line);border-radius:10px;
 padding:14px 16px 10px;box-shadow:0 1px 2px rgba(16,24,40,.04);position:relative;min-width:0}
.card h3{margin:0 0 6px;font-size:15px;font-weight:600}
.card h3 small{color:var(--muted);font-weight:500;margin-left:6px;font-size:13px}
.legend{display:flex;flex-wrap:wrap;gap:4px 16px;margin:0 0 4px;font-size:12.5px}
.legend span{display:inline-flex;align-items:center;gap:6px;white-space:nowrap}
.legend i{display:inline-block;width:14px;height:3px;border-radius:2px}
.legend b{font-weight:500;color:var(--muted);font-variant-numeric:tabular-nums}
svg.plot{display:block;width:100%;height:auto;overflow:visible}
svg .grid{stroke:#eceef1;stroke-width:1}
svg .grid-x{stroke:#f3f4f6;stroke-width:1}
svg .axis{stroke:#9aa3ad;stroke-width:1}
svg .epoch{stroke:#c5cbd3;stroke-width:1;stroke-dasharray:3 3}
svg .cursor{stroke:#6b7280;stroke-width:1;stroke-dasharray:2 2}
svg text{font-family:inherit;fill:#6b7280}
svg .tick{font-size:10.5px;font-variant-numeric:tabular-nums}
svg .label{font-size:11px;fill:#4b5563}
svg .empty{font-size:13px;fill:#9aa3ad}
svg circle{stroke:#fff;stroke-width:1}
table{width:100%;border-collapse:collapse;font-size:13px}
th{text-align:left;color:var(--muted);font-weight:600;font-size:12px;text-transform:uppercase;
 letter-spacing:.04em;border-bottom:1px solid var(--line);padding:8px 10px}
td{padding:7px 10px;border-bottom:1px solid #f0f1f3;font-variant-numeric:tabular-nums}
td.n,th.n{text-align:right}
td .at{color:var(--muted);font-size:12px}
tr:last-child td{border-bottom:0}
td.name{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,"DejaVu Sans Mono",monospace;
 font-size:12.5px}
.dot{display:inline-block;width:8px;height:8px;border-radius:50%;margin-right:8px}
.warn{color:#b42318}
pre{margin:0;background:#f8f9fb;border:1px solid var(--line);border-radius:8px;padding:12px 14px;
 overflow:auto;max-height:520px;font:12.5px/1.45 ui-monospace,SFMono-Regular,Menlo,Consolas,
 "DejaVu Sans Mono",monospace;white-space:pre}
.muted{color:var(--muted)}
.two{display:grid;grid-template-columns:repeat(auto-fit,minmax(420px,1fr));gap:16px}
.tip{position:absolute;pointer-events:none;background:rgba(255,255,255,.97);
 border:1px solid var(--line);border-radius:8px;box-shadow:0 4px 14px rgba(16,24,40,.12);
 padding:6px 9px;font-size:12px;display:none;z-index:2;white-space:nowrap}
.tip .s{color:var(--muted)}
.tip>.s{margin-bottom:2px}
footer{color:var(--muted);font-size:12px;text-align:center;padding:8px 0 28px}
@media print{body{background:#fff}.card,.tile{box-shadow:none}}
)CSS";

// Hover read-out: a cursor line at the nearest logged step and each series' value there (or at
// its own nearest step, shown, for sparse series such as validation metrics).
// Only progressive enhancement: the SVG above is complete without it.
const char* const kScript = R"JS(
(function(){
var plots=JSON.parse(document.getElementById('volt-data').textContent);
function nearest(p,x){var lo=0,hi=p.length-1;if(hi<0)return null;
 while(hi-lo>1){var m=(lo+hi)>>1;if(p[m][0]<x)lo=m;else hi=m;}
 return Math.abs(p[lo][0]-x)<=Math.abs(p[hi][0]-x)?p[lo]:p[hi];}
function fmt(v){if(v===null)return 'non-finite';var a=Math.abs(v);
 return (a!==0&&(a<1e-3||a>=1e6))?v.toExponential(3):(+v.toPrecision(5)).toString();}
plots.forEach(function(d){
 var svg=document.getElementById(d.id),cur=document.getElementById(d.id+'-cursor');
 var card=svg.parentNode,tip=document.createElement('div');tip.className='tip';
 card.appendChild(tip);
 svg.addEventListener('mousemove',function(ev){
  var pt=svg.createSVGPoint();pt.x=ev.clientX;pt.y=ev.clientY;
  var q=pt.matrixTransform(svg.getScreenCTM().inverse());
  var b=d.box;if(q.x<b[0]||q.x>b[0]+b[2]){tip.style.display='none';
   cur.setAttribute('visibility','hidden');return;}
  var x=d.x[0]+(q.x-b[0])/b[2]*(d.x[1]-d.x[0]),best=null;
  d.series.forEach(function(s){var n=nearest(s.p,x);
   if(n&&(best===null||Math.abs(n[0]-x)<Math.abs(best-x)))best=n[0];});
  if(best===null)return;
  var rows=d.series.map(function(s){var n=nearest(s.p,best);if(!n)return '';
   return '<div><span class="dot" style="background:'+s.color+'"></span>'+
    s.name.replace(/&/g,'&amp;').replace(/</g,'&lt;')+': <b>'+fmt(n[1])+'</b>'+
    (n[0]!==best?' <span class="s">@'+n[0]+'</span>':'')+'</div>';}).join('');
  var cx=b[0]+(best-d.x[0])/(d.x[1]-d.x[0])*b[2];
  cur.setAttribute('x1',cx);cur.setAttribute('x2',cx);cur.setAttribute('visibility','visible');
  tip.innerHTML='<div class="s">step '+best+'</div>'+rows;tip.style.display='block';
  var r=card.getBoundingClientRect(),left=ev.clientX-r.left+14;
  if(left+tip.offsetWidth>r.width)left=ev.clientX-r.left-tip.offsetWidth-14;
  tip.style.left=left+'px';tip.style.top=(ev.clientY-r.top+12)+'px';});
 svg.addEventListener('mouseleave',function(){tip.style.display='none';
  cur.setAttribute('visibility','hidden');});
});
document.body.setAttribute('data-hover','ready');
})();
)JS";

std::string default_title(const std::string& run_dir) {
  // "volt_logs/version_3" says more than "version_3".
  std::string dir = strip_trailing_slashes(run_dir);
  if (dir == "." || dir == "..") {
    char buf[4096];
    if (::realpath(dir.c_str(), buf) != nullptr) dir = buf;
  }
  const std::string name = base_name(dir);
  if (starts_with(name, "version_")) {
    const std::string parent = base_name(parent_dir(dir));
    if (!parent.empty() && parent != "." && parent != "/") return parent + "/" + name;
  }
  return name;
}

std::string now_text() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::localtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M", &tm);
  return buf;
}

void write_tile(std::ostream& os, const std::string& key, const std::string& value,
                const std::string& detail) {
  os << "<div class=\"tile\"><div class=\"k\">" << html_escape(key) << "</div><div class=\"v\">"
     << html_escape(value) << "</div><div class=\"d\" title=\"" << html_escape(detail) << "\">"
     << html_escape(detail) << "</div></div>\n";
}

// The series a headline tile shows: samples/s among throughputs, validation metrics first, then
// epoch means.
const Series* headline(const RunData& run, Group g) {
  const Series* pick = nullptr;
  int score = -1;
  for (const auto& s : run.series) {
    if (group_of(s.name) != g) continue;
    const int sc = (contains(s.name, "samples") ? 4 : 0) + (starts_with(s.name, "val") ? 2 : 0) +
                   (ends_with(s.name, "_epoch") ? 1 : 0);
    if (sc > score) {
      pick = &s;
      score = sc;
    }
  }
  return pick;
}

std::string text_file_or_empty(const std::string& path) {
  return is_file(path) ? read_text(path) : std::string();
}

std::string render(const RunData& run, const Source& src, const std::string& run_dir,
                   const ReportOptions& options) {
  const std::string title = options.title().empty() ? default_title(run_dir) : options.title();
  const std::string config = text_file_or_empty(src.dir + "/config.yaml");
  const std::string hparams = text_file_or_empty(src.dir + "/hparams.yaml");
  const auto plots = make_plots(run);

  std::ostringstream os;
  os << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
     << "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
     << "<title>" << html_escape(title) << " · volt report</title>\n<style>" << kStyle
     << "</style>\n</head>\n<body>\n<header><span class=\"brand\">volt run report</span><h1>"
     << html_escape(title) << "</h1><div class=\"sub\">" << html_escape(run.metrics_path)
     << " · generated " << now_text() << "</div></header>\n<main>\n";
  if (!src.note.empty()) os << "<div class=\"note\">" << html_escape(src.note) << "</div>\n";

  // Headline numbers.
  os << "<div class=\"tiles\">\n";
  write_tile(os, "Steps", run.max_step >= 0 ? fmt_step(run.max_step + 1) : "0",
             run.max_step >= 0 ? "last logged step " + fmt_step(run.max_step) : "nothing logged");
  if (!run.epochs.empty()) {
    double last_epoch = 0;
    for (const auto& p : run.epochs) last_epoch = std::max(last_epoch, p.y);
    write_tile(os, "Epochs", fmt_step(last_epoch + 1), "from the epoch column");
  }
  write_tile(os, "Metrics", std::to_string(run.series.size()),
             std::to_string(run.rows) + " rows in metrics.csv");
  for (Group g : {Group::kLoss, Group::kAccuracy, Group::kThroughput}) {
    const Series* s = headline(run, g);
    if (!s) continue;
    const Stats st = stats_of(*s);
    if (!st.has_finite) continue;
    if (g == Group::kThroughput) {
      // The median: the first window holds the warm-up, and windows with a checkpoint or log
      // flush dip.
      std::vector<double> v;
      for (const auto& p : s->points) {
        if (std::isfinite(p.y)) v.push_back(p.y);
      }
      std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
      write_tile(os, contains(s->name, "samples") ? "Samples / s" : "Throughput",
                 fmt_value(v[v.size() / 2]), "median of " + std::to_string(v.size()) + " windows");
    } else {
      const Point best = g == Group::kLoss ? st.min : st.max;
      write_tile(os, "Best " + s->name, fmt_value(best.y),
                 "step " + fmt_step(best.x) + " · last " + fmt("%.4g", st.last.y));
    }
  }
  os << "</div>\n";

  // Plots: one grid, in group order, so two plots sit side by side on a laptop screen.
  std::ostringstream data_js;
  os << "<h2>Metrics</h2>\n";
  if (run.series.empty()) {
    os << "<div class=\"card\"><p class=\"muted\">metrics.csv has no metric values yet.</p>"
       << "</div>\n";
  } else {
    os << "<div class=\"grid\">\n";
  }
  size_t id = 0;
  for (const auto& plot : plots) {
    os << "<section class=\"card\" data-group=\"" << group_title(plot.group) << "\"><h3>"
       << group_title(plot.group);
    if (!plot.subtitle.empty()) {
      os << "<small>" << html_escape(plot.subtitle) << "</small>";
    } else if (plot.series.size() > 1) {
      os << "<small>" << plot.series.size() << " series</small>";
    }
    os << "</h3>\n<div class=\"legend\">";
    for (size_t k = 0; k < plot.series.size(); ++k) {
      const Series& s = run.series[plot.series[k]];
      const Stats st = stats_of(s);
      os << "<span title=\"last value, at step " << fmt_step(st.last.x)
         << "\"><i style=\"background:" << kPalette[k % 10] << "\"></i>" << html_escape(s.name)
         << " <b>" << (st.has_finite ? fmt_value(st.last.y) : std::string("–")) << "</b>";
      if (st.non_finite) os << " <em class=\"warn\">" << st.non_finite << " non-finite</em>";
      os << "</span>";
    }
    os << "</div>\n";
    write_plot(os, run, plot, id++, options, data_js);
    os << "</section>\n";
  }
  if (!run.series.empty()) os << "</div>\n";

  // Summary table.
  if (!run.series.empty()) {
    os << "<h2>Summary</h2>\n<div class=\"card\"><table>\n<tr><th>Metric</th><th>Group</th>"
       << "<th class=\"n\">Points</th><th class=\"n\">Last</th><th class=\"n\">Best</th>"
       << "<th class=\"n\">Min</th><th class=\"n\">Max</th></tr>\n";
    std::vector<const Series*> rows;  // in plot order: grouped, then as logged
    for (const auto& plot : plots) {
      for (size_t i : plot.series) rows.push_back(&run.series[i]);
    }
    for (const Series* sp : rows) {
      const Series& s = *sp;
      const Group g = group_of(s.name);
      const Stats st = stats_of(s);
      auto at = [](const Point& p) {
        return fmt_value(p.y) + " <span class=\"at\">@" + fmt_step(p.x) + "</span>";
      };
      os << "<tr><td class=\"name\">" << html_escape(s.name) << "</td><td>" << group_title(g)
         << "</td><td class=\"n\">" << st.points;
      if (st.non_finite) os << " <span class=\"warn\">(" << st.non_finite << " non-finite)</span>";
      os << "</td>";
      if (st.has_finite) {
        const int dir = best_direction(g);
        os << "<td class=\"n\">" << at(st.last) << "</td><td class=\"n\">"
           << (dir == 0 ? std::string("<span class=\"muted\">–</span>")
                        : at(dir < 0 ? st.min : st.max))
           << "</td><td class=\"n\">" << at(st.min) << "</td><td class=\"n\">" << at(st.max)
           << "</td>";
      } else {
        os << "<td class=\"n warn\" colspan=\"4\">no finite values</td>";
      }
      os << "</tr>\n";
    }
    os << "</table></div>\n";
  }

  // Configuration, verbatim.
  os << "<h2>Configuration</h2>\n<div class=\"two\">\n<section class=\"card\"><h3>config.yaml"
     << "</h3>\n";
  if (config.empty()) {
    os << "<p class=\"muted\">No config.yaml in this run folder (the volt CLI writes one).</p>";
  } else {
    os << "<pre>" << html_escape(config) << "</pre>";
  }
  os << "</section>\n<section class=\"card\"><h3>hparams.yaml</h3>\n";
  const std::string hp = trim(hparams);
  if (hp.empty() || hp == "{}") {
    os << "<p class=\"muted\">No hyperparameters were logged.</p>";
  } else {
    os << "<pre>" << html_escape(hparams) << "</pre>";
  }
  os << "</section>\n</div>\n</main>\n<footer>volt";
#ifdef VOLT_VERSION_STRING
  os << " " << VOLT_VERSION_STRING;
#endif
  os << " · self-contained page: no network needed to view it</footer>\n";
  if (options.interactive() && !plots.empty()) {
    os << "<script type=\"application/json\" id=\"volt-data\">[" << data_js.str()
       << "]</script>\n<script>" << kScript << "</script>\n";
  }
  os << "</body>\n</html>\n";
  return os.str();
}

}  // namespace

std::string write_run_report(const std::string& run_dir, const ReportOptions& options) {
  VOLT_CHECK(!run_dir.empty(), ConfigError,
             "[report] the run folder is empty; pass a CSVLogger run folder "
             "(save_dir/name/version_N).");
  VOLT_CHECK(options.max_points() >= 2, ConfigError, "[report] max_points=", options.max_points(),
             " is too small; pass at least 2 (default 2000).");
  const Source src = find_source(run_dir);
  const RunData run = read_metrics(src.dir + "/metrics.csv");
  const std::string out = options.output().empty()
                              ? strip_trailing_slashes(run_dir) + "/report.html"
                              : options.output();
  write_atomically(out, render(run, src, run_dir, options));
  return out;
}

}  // namespace volt
