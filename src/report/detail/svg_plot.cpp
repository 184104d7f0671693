#include "svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <ostream>

#include "core/detail/numbers.h"

namespace volt {
namespace detail {

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

// A metric value for tables and legends: 5 significant digits, big values (throughputs) as
// whole numbers with thousands separators, inf/nan spelled out.
std::string format_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+inf" : "-inf";
  if (std::fabs(v) < 1e4 || std::fabs(v) >= 1e15) return c_format("%.5g", v);
  std::string digits = c_format("%.0f", std::fabs(v));
  for (int i = static_cast<int>(digits.size()) - 3; i > 0; i -= 3) digits.insert(i, ",");
  return (v < 0 ? "-" : "") + digits;
}

std::string format_step(double s) {
  return c_format("%.0f", s);
}

namespace {

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

// Tableau 10: distinct for common colour-vision deficiencies and readable on white.
const char* const kPalette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};

constexpr double kW = 560, kH = 270;
constexpr double kLeft = 64, kRight = 14, kTop = 12, kBottom = 40;

}  // namespace

// Ticks for [lo, hi]. `extend` widens the domain to whole ticks (y axes); `min_step` keeps
// integer axes (steps) from getting fractional ticks. Degenerate ranges (one value, one point)
// are widened first so nothing divides by zero.
Axis nice_axis(double lo, double hi, int target, bool extend, double min_step) {
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
std::string format_tick(double v, const Axis& a) {
  const double mag = std::max(std::fabs(a.lo), std::fabs(a.hi));
  const int step_exp = static_cast<int>(std::floor(std::log10(a.step) + 1e-9));
  if (mag >= 1e4) {
    if (v == 0) return "0";
    const char* suffix = mag >= 1e9 ? "G" : mag >= 1e6 ? "M" : "k";
    const double unit = mag >= 1e9 ? 1e9 : mag >= 1e6 ? 1e6 : 1e3;
    const int decimals =
        std::max(0, -static_cast<int>(std::floor(std::log10(a.step / unit) + 1e-9)));
    return c_format("%.*f%s", decimals, v / unit, suffix);
  }
  if (mag < 1e-3 && mag > 0) {
    if (v == 0) return "0";
    const int v_exp = static_cast<int>(std::floor(std::log10(std::fabs(v)) + 1e-9));
    const int digits = std::max(0, std::min(6, v_exp - step_exp));
    return c_format("%.*e", digits, v);
  }
  return c_format("%.*f", std::max(0, -step_exp), v);
}

// Keeps each bucket's minimum and maximum (in step order), so spikes survive thinning; a
// non-finite value in a bucket is kept as a gap.
std::vector<Point> decimate(const std::vector<Point>& pts, int64_t max_points, bool extremes) {
  if (static_cast<int64_t>(pts.size()) <= max_points) return pts;
  const size_t buckets = static_cast<size_t>(max_points / 2);
  std::vector<Point> out;
  for (size_t b = 0; b < buckets; ++b) {
    const size_t lo = b * pts.size() / buckets, hi = (b + 1) * pts.size() / buckets;
    size_t mn = hi, mx = hi, gap = hi;
    for (size_t i = lo; i < hi; ++i) {
      if (!std::isfinite(pts[i].y)) {
        if (gap == hi) gap = i;
        continue;
      }
      if (!extremes) {
        mn = mx = i;  // the last finite value: enough for an already smooth series
        continue;
      }
      if (mn == hi || pts[i].y < pts[mn].y) mn = i;
      if (mx == hi || pts[i].y > pts[mx].y) mx = i;
    }
    std::vector<size_t> keep;  // emitted in step order
    for (size_t i : {mn, mx, gap}) {
      if (i != hi && std::find(keep.begin(), keep.end(), i) == keep.end()) keep.push_back(i);
    }
    std::sort(keep.begin(), keep.end());
    for (size_t i : keep) out.push_back(pts[i]);
  }
  return out;
}

std::vector<Point> smooth(const std::vector<Point>& pts, double weight) {
  std::vector<Point> out = pts;
  if (pts.size() > 100) weight = std::pow(weight, 100.0 / static_cast<double>(pts.size()));
  double ema = 0;
  int64_t n = 0;
  for (auto& p : out) {
    if (!std::isfinite(p.y)) continue;
    ema = ema * weight + (1 - weight) * p.y;
    ++n;
    // Starting the average at 0 biases the first values towards 0; dividing by 1 - w^n undoes it
    // (as TensorBoard and Adam do).
    p.y = ema / (1 - std::pow(weight, static_cast<double>(n)));
  }
  return out;
}

const char* series_colour(size_t k) {
  return kPalette[k % (sizeof kPalette / sizeof kPalette[0])];
}

void write_svg_plot(const PlotSpec& spec, std::ostream& os, std::ostream& json) {
  auto f1 = [](double v) { return c_format("%.1f", v); };
  std::vector<std::vector<Point>> drawn;
  double xlo = std::numeric_limits<double>::infinity(), xhi = -xlo, ylo = xlo, yhi = -xlo;
  for (const Series* s : spec.lines) {
    drawn.push_back(decimate(s->points, spec.max_points));
    for (const auto& p : s->points) {
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
  if (spec.x_lo <= spec.x_hi) {
    xlo = spec.x_lo;
    xhi = spec.x_hi;
  }
  if (!(xlo <= xhi)) xlo = xhi = 0;  // no points at all
  if (xhi - xlo < 1) {               // one step: centre it on a two-step axis
    xlo = std::max(0.0, xlo - 1);
    xhi = xlo + 2;
  } else if (xlo > 0 && xlo <= 0.1 * xhi) {
    xlo = 0;  // runs start at step 0; the first log comes a few steps later
  }
  if (spec.y_from_zero && ylo > 0) ylo = 0;
  const Axis ax = nice_axis(xlo, xhi, 7, false, 1);
  const Axis ay = nice_axis(ylo, yhi, 5, true, 0);
  const double pw = kW - kLeft - kRight, ph = kH - kTop - kBottom;
  auto sx = [&](double x) { return kLeft + (x - ax.lo) / (ax.hi - ax.lo) * pw; };
  auto sy = [&](double y) { return kTop + ph - (y - ay.lo) / (ay.hi - ay.lo) * ph; };

  os << "<svg class=\"plot\" id=\"" << html_escape(spec.id) << "\" viewBox=\"0 0 " << kW << " "
     << kH << "\" role=\"img\" aria-label=\"" << html_escape(spec.label) << "\">\n";
  for (double t : ay.ticks) {
    os << "<line class=\"grid\" x1=\"" << kLeft << "\" x2=\"" << kW - kRight << "\" y1=\""
       << f1(sy(t)) << "\" y2=\"" << f1(sy(t)) << "\"/><text class=\"tick\" x=\"" << kLeft - 6
       << "\" y=\"" << f1(sy(t) + 3.5) << "\" text-anchor=\"end\">" << format_tick(t, ay)
       << "</text>\n";
  }
  for (double t : ax.ticks) {
    os << "<line class=\"grid-x\" x1=\"" << f1(sx(t)) << "\" x2=\"" << f1(sx(t)) << "\" y1=\""
       << kTop << "\" y2=\"" << kTop + ph << "\"/><text class=\"tick\" x=\"" << f1(sx(t))
       << "\" y=\"" << kTop + ph + 15 << "\" text-anchor=\"middle\">" << format_tick(t, ax)
       << "</text>\n";
  }
  // Epoch boundaries: half a step after each epoch's last step (not after the last epoch).
  if (spec.epoch_ends.size() > 1 && spec.epoch_ends.size() <= 40) {
    for (size_t e = 0; e + 1 < spec.epoch_ends.size(); ++e) {
      const double s = spec.epoch_ends[e].first + 0.5;
      if (s <= ax.lo || s >= ax.hi) continue;
      os << "<line class=\"epoch\" x1=\"" << f1(sx(s)) << "\" x2=\"" << f1(sx(s)) << "\" y1=\""
         << kTop << "\" y2=\"" << kTop + ph << "\"><title>end of epoch "
         << format_step(spec.epoch_ends[e].second) << "</title></line>\n";
    }
  }
  os << "<line class=\"axis\" x1=\"" << kLeft << "\" x2=\"" << kW - kRight << "\" y1=\""
     << kTop + ph << "\" y2=\"" << kTop + ph << "\"/><line class=\"axis\" x1=\"" << kLeft
     << "\" x2=\"" << kLeft << "\" y1=\"" << kTop << "\" y2=\"" << kTop + ph << "\"/>\n";
  os << "<text class=\"label\" x=\"" << kLeft + pw / 2 << "\" y=\"" << kH - 6
     << "\" text-anchor=\"middle\">step</text><text class=\"label\" transform=\"translate(13 "
     << kTop + ph / 2 << ") rotate(-90)\" text-anchor=\"middle\">" << html_escape(spec.y_label)
     << "</text>\n";
  if (!any_finite) {
    os << "<text class=\"empty\" x=\"" << kLeft + pw / 2 << "\" y=\"" << kTop + ph / 2
       << "\" text-anchor=\"middle\">no finite values</text>\n";
  }

  json << "{\"id\":\"" << json_escape(spec.id) << "\",\"x\":[" << c_format("%.10g", ax.lo) << ","
       << c_format("%.10g", ax.hi) << "],\"y\":[" << c_format("%.10g", ay.lo) << ","
       << c_format("%.10g", ay.hi) << "],\"box\":[" << kLeft << "," << kTop << "," << pw << ","
       << ph << "],\"series\":[";
  for (size_t k = 0; k < spec.lines.size(); ++k) {
    const std::string& name = spec.lines[k]->name;
    const char* colour = series_colour(k);
    const auto& pts = drawn[k];
    // One path per series; a non-finite value ends a piece. A piece of one point would be
    // invisible as a path, so it becomes a dot; so does every point of a short series (epoch
    // and validation metrics), each with a native tooltip that needs no script.
    std::string d;
    std::vector<bool> dot(pts.size(), pts.size() <= kDotsUpTo);
    for (size_t j = 0; j < pts.size(); ++j) {
      if (!std::isfinite(pts[j].y)) continue;
      const bool starts = j == 0 || !std::isfinite(pts[j - 1].y);
      const bool ends = j + 1 == pts.size() || !std::isfinite(pts[j + 1].y);
      if (starts && ends) dot[j] = true;
      d += (starts ? "M" : "L") + f1(sx(pts[j].x)) + " " + f1(sy(pts[j].y));
    }
    // Noisy step series: the raw values faint, their moving average on top.
    const bool smoothed = spec.smoothing > 0 && spec.lines[k]->points.size() > kSmoothAbove;
    os << "<g class=\"series\" data-name=\"" << html_escape(name) << "\">";
    if (!d.empty()) {
      os << "<path d=\"" << d << "\"" << (smoothed ? " class=\"raw\"" : "")
         << " fill=\"none\" stroke=\"" << colour
         << "\" stroke-width=\"1.8\" stroke-linejoin=\"round\" stroke-linecap=\"round\"/>";
    }
    if (smoothed) {
      std::string ds;
      const auto sm = decimate(smooth(spec.lines[k]->points, spec.smoothing), spec.max_points,
                               /*extremes=*/false);
      for (size_t j = 0; j < sm.size(); ++j) {
        if (!std::isfinite(sm[j].y)) continue;
        ds += (j == 0 || !std::isfinite(sm[j - 1].y) ? "M" : "L") + f1(sx(sm[j].x)) + " " +
              f1(sy(sm[j].y));
      }
      os << "<path class=\"smooth\" d=\"" << ds << "\" fill=\"none\" stroke=\"" << colour
         << "\" stroke-width=\"2\" stroke-linejoin=\"round\" stroke-linecap=\"round\"/>";
    }
    for (size_t j = 0; j < pts.size(); ++j) {
      if (!dot[j] || !std::isfinite(pts[j].y)) continue;
      os << "<circle cx=\"" << f1(sx(pts[j].x)) << "\" cy=\"" << f1(sy(pts[j].y))
         << "\" r=\"3\" fill=\"" << colour << "\"><title>" << html_escape(name) << " = "
         << format_value(pts[j].y) << " at step " << format_step(pts[j].x) << "</title></circle>";
    }
    os << "</g>\n";
    json << (k ? "," : "") << "{\"name\":\"" << json_escape(name) << "\",\"color\":\"" << colour
         << "\",\"p\":[";
    for (size_t j = 0; j < pts.size(); ++j) {
      json << (j ? "," : "") << "[" << c_format("%.0f", pts[j].x) << ","
           << (std::isfinite(pts[j].y) ? c_format("%.6g", pts[j].y) : "null") << "]";
    }
    json << "]}";
  }
  json << "]}";
  // Moved and shown by the hover script.
  os << "<line class=\"cursor\" id=\"" << html_escape(spec.id)
     << "-cursor\" x1=\"0\" x2=\"0\" y1=\"" << kTop << "\" y2=\"" << kTop + ph
     << "\" visibility=\"hidden\"/>\n</svg>\n";
}

}  // namespace detail
}  // namespace volt
