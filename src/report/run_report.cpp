// The run report deliberately includes no torch header: it only reads text files and writes
// text, so each of its files compiles in about a second (CMakeLists.txt skips the torch PCH).
// detail/metrics_csv reads metrics.csv, detail/svg_plot draws the plots, this file groups the
// metrics and lays out the page.
#include "volt/report/run_report.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <ostream>
#include <unordered_map>
#include <vector>

#include "core/detail/ascii.h"
#include "core/detail/numbers.h"
#include "core/detail/version_folder.h"
#include "detail/metrics_csv.h"
#include "detail/svg_plot.h"
#include "loggers/detail/log_dir.h"
#include "volt/core/atomic_file.h"
#include "volt/core/check.h"

namespace volt {

std::ostream& operator<<(std::ostream& os, const ReportOptions& o) {
  return os << "ReportOptions(output=\"" << o.output() << "\", title=\"" << o.title()
            << "\", max_points=" << o.max_points() << ", smoothing=" << o.smoothing()
            << ", interactive=" << std::boolalpha << o.interactive() << std::noboolalpha << ")";
}

namespace {

using detail::c_format;
using detail::format_step;
using detail::format_value;
using detail::html_escape;
using detail::MetricsTable;
using detail::PlotSpec;
using detail::Point;
using detail::read_text;
using detail::Series;
using detail::series_colour;

// ------------------------------------------------------------------ files

bool is_file(const std::string& path) {
  struct stat sb;
  return ::stat(path.c_str(), &sb) == 0 && S_ISREG(sb.st_mode);
}

bool is_dir(const std::string& path) {
  struct stat sb;
  return ::stat(path.c_str(), &sb) == 0 && S_ISDIR(sb.st_mode);
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

// atomic_write_file: a reader (or a browser refreshing the page) never sees a half-written
// report, and a report writer killed mid-write leaves nothing behind that the next write keeps.
void write_atomically(const std::string& path, const std::string& data) {
  detail::make_dirs(parent_dir(path), "report");
  try {
    atomic_write_file(path, data);
  } catch (const CheckpointError& e) {
    VOLT_CHECK(false, ConfigError, "[report] writing '", path, "' failed: ", e.what(),
               " Pass a writable output path (ReportOptions::output).");
  }
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
      const auto n = detail::version_folder_number(name);
      if (!n || !is_file(dir + "/" + name + "/metrics.csv")) continue;
      ++count;
      best = std::max<int64_t>(best, *n);
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

// ------------------------------------------------------------------ grouping

enum class Group { kLoss, kAccuracy, kLearningRate, kThroughput, kMemory, kOther };
constexpr Group kGroups[] = {Group::kLoss,       Group::kAccuracy, Group::kLearningRate,
                             Group::kThroughput, Group::kMemory,   Group::kOther};

const char* group_title(Group g) {
  switch (g) {
    case Group::kLoss: return "Loss";
    case Group::kAccuracy: return "Accuracy";
    case Group::kLearningRate: return "Learning rate";
    case Group::kThroughput: return "Throughput";
    case Group::kMemory: return "Memory";
    case Group::kOther: return "Other metrics";
  }
  return "";
}

bool contains(const std::string& s, const char* part) {
  return s.find(part) != std::string::npos;
}
bool starts_with(const std::string& s, const char* p) {
  return s.rfind(p, 0) == 0;
}
bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

Group group_of(const std::string& name) {
  const std::string n = detail::ascii_lower(name);
  // LearningRateMonitor names: "lr-<Optimizer>[/pg<i>][-momentum|-weight_decay]".
  if (n == "lr" || starts_with(n, "lr-") || starts_with(n, "lr_") || starts_with(n, "lr/") ||
      contains(n, "learning_rate")) {
    // Momentum and weight decay live on other scales than the rate itself.
    return ends_with(n, "-momentum") || ends_with(n, "-weight_decay") ? Group::kOther
                                                                      : Group::kLearningRate;
  }
  if (contains(n, "per_sec") || contains(n, "throughput")) return Group::kThroughput;
  // DeviceStatsMonitor's byte gauges share one plot; its counts and Limit stay in "Other".
  if (starts_with(n, "device_stats/") &&
      (ends_with(n, "/inuse") || ends_with(n, "/maxinuse") || ends_with(n, "/host_rss_bytes"))) {
    return Group::kMemory;
  }
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
int best_direction(Group g) {
  return g == Group::kLoss ? -1 : g == Group::kAccuracy ? 1 : 0;
}

struct Stats {
  int64_t points = 0, non_finite = 0;
  bool has_finite = false;
  Point last{0, 0};            // the last point, finite or not: a run that ends in NaN says so
  Point min{0, 0}, max{0, 0};  // of the finite points
};

Stats stats_of(const Series& s) {
  Stats st;
  st.points = static_cast<int64_t>(s.points.size());
  for (const auto& p : s.points) {
    st.last = p;
    if (!std::isfinite(p.y)) {
      ++st.non_finite;
      continue;
    }
    if (!st.has_finite || p.y < st.min.y) st.min = p;
    if (!st.has_finite || p.y > st.max.y) st.max = p;
    st.has_finite = true;
  }
  return st;
}

struct Plot {
  Group group;
  std::string subtitle;        // base metric name when a group has one plot per metric
  std::vector<size_t> series;  // indices into MetricsTable::series
};

std::vector<Plot> make_plots(const MetricsTable& run) {
  std::vector<Plot> plots;
  for (Group g : kGroups) {
    // Losses, accuracies and learning rates share a scale: one plot each. Throughputs and other
    // metrics may differ by orders of magnitude: one plot per metric (its _step/_epoch together).
    const bool shared = g == Group::kLoss || g == Group::kAccuracy || g == Group::kLearningRate ||
                        g == Group::kMemory;
    std::vector<Plot> mine;
    std::unordered_map<std::string, size_t> plot_of;  // subtitle -> index in mine
    for (size_t i = 0; i < run.series.size(); ++i) {
      if (group_of(run.series[i].name) != g) continue;
      const std::string base = shared ? "" : base_metric(run.series[i].name);
      const auto [at, added] = plot_of.emplace(base, mine.size());
      if (added) mine.push_back({g, base, {}});
      mine[at->second].series.push_back(i);
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

std::string axis_label(const Plot& plot) {
  switch (plot.group) {
    case Group::kLoss: return "loss";
    case Group::kAccuracy: return "accuracy";
    case Group::kLearningRate: return "learning rate";
    case Group::kThroughput:
      if (contains(plot.subtitle, "samples")) return "samples / s";
      if (contains(plot.subtitle, "batches")) return "batches / s";
      return "per second";
    case Group::kMemory: return "bytes";
    case Group::kOther: break;
  }
  return "value";
}

// (last step, epoch) of each epoch in the epoch column, for the plots' epoch lines.
std::vector<std::pair<double, double>> epoch_ends(const MetricsTable& run) {
  std::vector<std::pair<double, double>> ends;
  for (const auto& p : run.epochs) {
    if (!ends.empty() && ends.back().second == p.y) {
      ends.back().first = std::max(ends.back().first, p.x);
    } else {
      ends.push_back({p.x, p.y});
    }
  }
  return ends;
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
.tiles{display:grid;grid-template-columns:repeat(auto-fit,minmax(150px,1fr));gap:12px;
 margin-bottom:20px}
.tile{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:12px 16px}
.tile .k{color:var(--muted);font-size:12px;text-transform:uppercase;letter-spacing:.05em}
.tile .v{font-size:22px;font-weight:600;font-variant-numeric:tabular-nums;margin-top:2px}
.tile .d{color:var(--muted);font-size:12px;white-space:nowrap;overflow:hidden;
 text-overflow:ellipsis}
h2{font-size:13px;text-transform:uppercase;letter-spacing:.07em;color:var(--muted);
 margin:26px 0 10px;font-weight:650}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(min(460px,100%),1fr));gap:16px}
.card{background:var(--card);border:1px solid var(--line);border-radius:10px;
 padding:14px 16px 10px;box-shadow:0 1px 2px rgba(16,24,40,.04);position:relative;min-width:0}
.card h3{margin:0 0 6px;font-size:15px;font-weight:600}
.card h3 small{color:var(--muted);font-weight:500;margin-left:6px;font-size:13px}
.legend{display:flex;flex-wrap:wrap;gap:4px 16px;margin:0 0 4px;font-size:12.5px}
.legend span{display:inline-flex;align-items:center;gap:6px;white-space:nowrap}
.legend i{display:inline-block;width:14px;height:3px;border-radius:2px}
.legend b{font-weight:500;color:var(--muted);font-variant-numeric:tabular-nums}
.legend .hint{color:var(--muted);font-size:11.5px;margin-left:auto}
svg.plot{display:block;width:100%;height:auto;overflow:visible}
svg .grid{stroke:#eceef1;stroke-width:1}
svg .grid-x{stroke:#f3f4f6;stroke-width:1}
svg .axis{stroke:#9aa3ad;stroke-width:1}
svg .epoch{stroke:#c5cbd3;stroke-width:1;stroke-dasharray:3 3}
svg .cursor{stroke:#6b7280;stroke-width:1;stroke-dasharray:2 2}
svg text{font-family:inherit;fill:#6b7280}
svg .tick{font-size:11px;font-variant-numeric:tabular-nums}
svg .label{font-size:11px;fill:#4b5563}
svg .empty{font-size:13px;fill:#9aa3ad}
svg circle{stroke:#fff;stroke-width:1}
svg path.raw{stroke-opacity:.28;stroke-width:1.2}
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
 "DejaVu Sans Mono",monospace;white-space:pre-wrap;overflow-wrap:anywhere}
.muted{color:var(--muted)}
.two{display:grid;grid-template-columns:repeat(auto-fit,minmax(min(420px,100%),1fr));gap:16px}
.tip{position:absolute;pointer-events:none;background:rgba(255,255,255,.97);
 border:1px solid var(--line);border-radius:8px;box-shadow:0 4px 14px rgba(16,24,40,.12);
 padding:6px 9px;font-size:12px;display:none;z-index:2;white-space:nowrap}
.tip .s{color:var(--muted)}
.tip>.s{margin-bottom:2px}
footer{color:var(--muted);font-size:12px;text-align:center;padding:8px 0 28px}
@media (max-width:700px){header{padding:16px}main{padding:14px 12px 30px}}
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
function format_number(v){if(v===null)return 'non-finite';var a=Math.abs(v);
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
    s.name.replace(/&/g,'&amp;').replace(/</g,'&lt;')+': <b>'+format_number(n[1])+'</b>'+
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

// The series a headline tile shows: training's samples/s among throughputs; otherwise
// validation metrics first, then epoch means.
const Series* headline(const MetricsTable& run, Group g) {
  const Series* pick = nullptr;
  int score = -1;
  for (const auto& s : run.series) {
    if (group_of(s.name) != g) continue;
    // Throughput: training's over evaluation's, the job's over one device's (ThroughputMonitor's
    // "train/samples_per_sec" with several processes, else "train/device/samples_per_sec").
    const int sc =
        g == Group::kThroughput
            ? (contains(s.name, "samples") ? 4 : 0) + (starts_with(s.name, "train") ? 2 : 0) +
                  (contains(s.name, "device") ? 0 : 1)
            : (contains(s.name, "samples") ? 4 : 0) + (starts_with(s.name, "val") ? 2 : 0) +
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

std::string render(const MetricsTable& run, const Source& src, const std::string& run_dir,
                   const ReportOptions& options) {
  const std::string title = options.title().empty() ? default_title(run_dir) : options.title();
  const std::string config = text_file_or_empty(src.dir + "/config.yaml");
  const std::string hparams = text_file_or_empty(src.dir + "/hparams.yaml");
  const auto plots = make_plots(run);

  auto os = detail::c_stream<std::ostringstream>();
  os << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
     << "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
     << "<title>" << html_escape(title) << " · volt report</title>\n<style>" << kStyle
     << "</style>\n</head>\n<body>\n<header><span class=\"brand\">volt run report</span><h1>"
     << html_escape(title) << "</h1><div class=\"sub\">" << html_escape(run.path) << " · generated "
     << now_text() << "</div></header>\n<main>\n";
  if (!src.note.empty()) os << "<div class=\"note\">" << html_escape(src.note) << "</div>\n";

  // Headline numbers.
  os << "<div class=\"tiles\">\n";
  write_tile(
      os, "Steps", run.max_step >= 0 ? format_step(run.max_step + 1) : "0",
      run.max_step >= 0 ? "last logged step " + format_step(run.max_step) : "nothing logged");
  if (!run.epochs.empty()) {
    double last_epoch = 0;
    for (const auto& p : run.epochs) last_epoch = std::max(last_epoch, p.y);
    write_tile(os, "Epochs", format_step(last_epoch + 1), "from the epoch column");
  }
  write_tile(os, "Metrics", std::to_string(run.series.size()),
             std::to_string(run.rows) + " rows in metrics.csv" +
                 (run.unfinished_line
                      ? "; line " + std::to_string(run.unfinished_line) + " left out, unfinished"
                      : ""));
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
                 format_value(v[v.size() / 2]),
                 "median of " + std::to_string(v.size()) + " windows");
    } else {
      const Point best = g == Group::kLoss ? st.min : st.max;
      write_tile(os, "Best " + s->name, format_value(best.y),
                 "step " + format_step(best.x) + " · last " + format_value(st.last.y));
    }
  }
  os << "</div>\n";

  // Plots: one grid, in group order, so two plots sit side by side on a laptop screen.
  auto data_js = detail::c_stream<std::ostringstream>();
  os << "<h2>Metrics</h2>\n";
  if (run.series.empty()) {
    os << "<div class=\"card\"><p class=\"muted\">metrics.csv has no metric values yet.</p>"
       << "</div>\n";
  } else {
    os << "<div class=\"grid\">\n";
  }
  const auto ends = epoch_ends(run);
  double x_lo = run.max_step;  // every plot spans the run's steps, so they line up
  for (const auto& sr : run.series) x_lo = std::min(x_lo, sr.points.front().x);
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
      os << "<span title=\"last value, at step " << format_step(st.last.x)
         << "\"><i style=\"background:" << series_colour(k) << "\"></i>" << html_escape(s.name)
         << " <b>" << (st.has_finite ? format_value(st.last.y) : std::string("–")) << "</b>";
      if (st.non_finite) os << " <em class=\"warn\">" << st.non_finite << " non-finite</em>";
      os << "</span>";
    }
    const bool smoothed = options.smoothing() > 0 && plot.group != Group::kLearningRate &&
                          std::any_of(plot.series.begin(), plot.series.end(), [&](size_t i) {
                            return run.series[i].points.size() > detail::kSmoothAbove;
                          });
    if (smoothed) {
      os << "<span class=\"hint\">faint: raw · solid: moving average ("
         << c_format("%g", options.smoothing()) << ")</span>";
    }
    os << "</div>\n";
    PlotSpec spec;
    spec.id = "plot" + std::to_string(id);
    spec.label = std::string(group_title(plot.group)) +
                 (plot.subtitle.empty() ? "" : " " + plot.subtitle) + " by step";
    spec.y_label = axis_label(plot);
    for (size_t i : plot.series) spec.lines.push_back(&run.series[i]);
    spec.epoch_ends = ends;
    spec.y_from_zero = plot.group == Group::kThroughput;  // reads as a fraction of the best
    spec.max_points = options.max_points();
    spec.x_lo = x_lo;
    spec.x_hi = run.max_step;
    spec.smoothing = plot.group == Group::kLearningRate ? 0 : options.smoothing();
    data_js << (id++ ? ",\n" : "");
    detail::write_svg_plot(spec, os, data_js);
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
        return format_value(p.y) + " <span class=\"at\">@" + format_step(p.x) + "</span>";
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
  if (hparams.find_first_not_of(" \t\r\n{}") == std::string::npos) {  // empty or "{}"
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
  VOLT_CHECK(options.smoothing() >= 0 && options.smoothing() < 1, ConfigError,
             "[report] smoothing=", options.smoothing(),
             " is outside [0, 1); pass 0 (raw values only) to 0.99 (default 0.6).");
  const Source src = find_source(run_dir);
  const MetricsTable run = detail::read_metrics_csv(src.dir + "/metrics.csv");
  const std::string out = options.output().empty()
                              ? strip_trailing_slashes(run_dir) + "/report.html"
                              : options.output();
  write_atomically(out, render(run, src, run_dir, options));
  return out;
}

}  // namespace volt
