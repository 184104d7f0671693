#pragma once
// Line plots as inline SVG for the run report, and the text helpers the page shares with them.

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include "metrics_csv.h"

namespace volt {
namespace detail {

/// & < > " ' as entities, for text and attribute values.
std::string html_escape(const std::string& s);
/// A JSON string body; "<" is escaped too, so "</script>" never appears in a data block.
std::string json_escape(const std::string& s);
/// 5 significant digits; >= 1e4 as a whole number with thousands separators; NaN, +inf, -inf.
std::string format_value(double v);
/// A step as an integer.
std::string format_step(double step);

/// An axis: its domain and tick values.
struct Axis {
  double lo = 0, hi = 1;      ///< the domain mapped onto the plot, lo < hi
  double step = 1;            ///< tick spacing: 1, 2 or 5 times a power of ten
  std::vector<double> ticks;  ///< tick values inside [lo, hi]
};

/// About `target` ticks over [lo, hi]. `extend` widens the domain to whole ticks (y axes);
/// `min_step` keeps integer axes from getting fractional ticks. A degenerate range (one value)
/// is widened first, so lo < hi always holds.
Axis nice_axis(double lo, double hi, int target, bool extend, double min_step);

/// One tick label in the axis' shared format: "20k" for big ranges, "1.0e-04" for tiny ones,
/// otherwise just enough decimals to tell the ticks apart.
std::string format_tick(double v, const Axis& axis);

/// Thins `points` to max_points (>= 2): each of max_points / 2 buckets keeps its minimum and
/// maximum (`extremes`, so spikes survive) or else its last finite value, plus its first
/// non-finite value as a gap; all in step order.
std::vector<Point> decimate(const std::vector<Point>& points, int64_t max_points,
                            bool extremes = true);

/// TensorBoard's debiased exponential moving average with `weight` in [0, 1) for 100 points; a
/// longer series of n points uses weight^(100 / n), so the average spans the same share of the
/// plot whatever the logging cadence. A non-finite value stays and does not enter the average.
std::vector<Point> smooth(const std::vector<Point>& points, double weight);

/// The colour of the k-th series of a plot (Tableau 10, cycling).
const char* series_colour(size_t k);

/// Series with at most this many points get a dot per point (epoch and validation metrics).
constexpr size_t kDotsUpTo = 60;
/// Series with more points are drawn faint under their moving average (when smoothing > 0).
constexpr size_t kSmoothAbove = kDotsUpTo;

struct PlotSpec {
  std::string id;                    ///< element id, also the hover data's key
  std::string label;                 ///< accessible name of the plot
  std::string y_label;               ///< y axis title
  std::vector<const Series*> lines;  ///< one line each, coloured by position
  /// (last step, epoch) of each epoch; boundaries between epochs are drawn as dashed lines.
  std::vector<std::pair<double, double>> epoch_ends;
  bool y_from_zero = false;  ///< start the y axis at 0 (rates)
  /// Steps on the x axis, shared by a page's plots so they line up; x_lo > x_hi: the data's.
  double x_lo = 1, x_hi = 0;
  /// > 0: a series of more than kSmoothAbove points is drawn faint, its smooth() on top.
  double smoothing = 0;
  int64_t max_points = 2000;
};

/// Writes the <svg> (grid, ticks, axis titles, epoch lines, one path per series with gaps at
/// non-finite values, dots for short series) to `svg`, and the drawn raw points as one JSON object
/// {"id","x","y","box","series":[{"name","color","p":[[step,value|null],...]}]} to `json`.
void write_svg_plot(const PlotSpec& spec, std::ostream& svg, std::ostream& json);

}  // namespace detail
}  // namespace volt
