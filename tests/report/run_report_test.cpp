// write_run_report: a real run's report (groups, names, config, self-contained), odd values,
// version_N fallback, decimation, and every error path.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <fstream>
#include <regex>
#include <sstream>

#include "file_text.h"
#include "report/detail/svg_plot.h"
#include "tiny.h"

namespace {

using volt_test::file_text;

void spit(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

void mkdir_p(const std::string& path) {
  ASSERT_EQ(std::system(("mkdir -p '" + path + "'").c_str()), 0);
}

size_t count(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
  return n;
}

// Every plot card of a group (<section class="card" data-group="..."> ... </section>).
std::string cards(const std::string& html, const std::string& group) {
  const std::string head = "<section class=\"card\" data-group=\"" + group + "\">";
  std::string out;
  for (auto b = html.find(head); b != std::string::npos; b = html.find(head, b + 1)) {
    out += html.substr(b, html.find("</section>", b) - b);
  }
  return out;
}

// The page from heading <h2>name</h2> to the next heading.
std::string section(const std::string& html, const std::string& name) {
  const std::string head = "<h2>" + name + "</h2>";
  const auto b = html.find(head);
  if (b == std::string::npos) return "";
  const auto e = html.find("<h2>", b + head.size());
  return html.substr(b, e == std::string::npos ? std::string::npos : e - b);
}

// The path data of one series' line (empty when it has none).
std::string path_of(const std::string& html, const std::string& series) {
  const std::string key = "data-name=\"" + series + "\"><path d=\"";
  const auto b = html.find(key);
  if (b == std::string::npos) return "";
  return html.substr(b + key.size(), html.find('"', b + key.size()) - b - key.size());
}

// Expects `fn` to throw exactly `E` with `phrase` in its message.
template <typename E, typename Fn>
void expect_error(Fn fn, const std::string& phrase) {
  try {
    fn();
    ADD_FAILURE() << "expected an exception containing \"" << phrase << "\"";
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(phrase), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).rfind("[report] ", 0), 0u) << e.what();
  }
}

TEST(RunReportPlot, NiceTicksCoverTheDataAndDegenerateRangesWiden) {
  using volt::detail::nice_axis;
  auto y = nice_axis(0.013, 0.82, 5, /*extend=*/true, 0);  // a loss
  EXPECT_DOUBLE_EQ(y.step, 0.2);
  EXPECT_DOUBLE_EQ(y.lo, 0.0);
  EXPECT_DOUBLE_EQ(y.hi, 1.0);
  ASSERT_EQ(y.ticks.size(), 6u);
  EXPECT_NEAR(y.ticks[3], 0.6, 1e-12);
  auto x = nice_axis(1, 191, 7, /*extend=*/false, 1);  // steps: the domain stays the data's
  EXPECT_DOUBLE_EQ(x.lo, 1);
  EXPECT_DOUBLE_EQ(x.hi, 191);
  EXPECT_EQ(x.ticks, (std::vector<double>{50, 100, 150}));
  EXPECT_DOUBLE_EQ(nice_axis(0, 3, 7, false, 1).step, 1);  // never fractional steps
  for (double v : {0.0, 0.5, -2.0, 1e-9, 123456.0}) {      // one value: no zero-width axis
    auto a = nice_axis(v, v, 5, true, 0);
    EXPECT_LT(a.lo, v) << v;
    EXPECT_GT(a.hi, v) << v;
    EXPECT_GE(a.ticks.size(), 2u) << v;
  }
}

TEST(RunReportPlot, TickLabelsReadWellAtEveryScale) {
  using volt::detail::format_tick;
  using volt::detail::nice_axis;
  auto rate = nice_axis(0, 123000, 5, true, 0);  // samples/s
  EXPECT_EQ(format_tick(0, rate), "0");
  EXPECT_EQ(format_tick(rate.ticks[1], rate), "50k");
  auto lr = nice_axis(0, 4.2e-4, 5, true, 0);
  EXPECT_EQ(format_tick(lr.ticks[1], lr), "1e-04");
  auto loss = nice_axis(0.2, 0.95, 5, true, 0);
  EXPECT_EQ(format_tick(loss.ticks[1], loss), "0.4");
  auto steps = nice_axis(0, 2000, 7, false, 1);
  EXPECT_EQ(format_tick(500, steps), "500");
  EXPECT_EQ(volt::detail::format_value(121850.4), "121,850");
  EXPECT_EQ(volt::detail::format_value(0.0123456), "0.012346");
  EXPECT_EQ(volt::detail::format_value(-std::numeric_limits<double>::infinity()), "-inf");
}

TEST(RunReportPlot, DecimationKeepsExtremesInStepOrder) {
  std::vector<volt::detail::Point> pts;
  for (int i = 0; i < 1000; ++i) pts.push_back({double(i), i == 777 ? -5.0 : std::sin(i * 0.1)});
  pts[500].y = std::nan("");
  const auto out = volt::detail::decimate(pts, 100);
  EXPECT_LE(out.size(), 101u);  // 50 buckets x (min, max) + one gap
  EXPECT_TRUE(std::is_sorted(out.begin(), out.end(),
                             [](const auto& a, const auto& b) { return a.x < b.x; }));
  EXPECT_TRUE(std::any_of(out.begin(), out.end(), [](const auto& p) { return p.y == -5.0; }));
  EXPECT_TRUE(std::any_of(out.begin(), out.end(), [](const auto& p) { return std::isnan(p.y); }));
  EXPECT_EQ(volt::detail::decimate(pts, 2000).size(), pts.size());  // short enough: untouched
}

TEST(RunReport, RealRunHasAPlotPerGroupTheConfigAndNoNetworkResources) {
  volt_test::TempDir dir;
  volt_test::TinyClassifier model;
  model.scheduler_step_size = 3;
  model.scheduler_interval = volt::Interval::kStep;
  auto csv = std::make_shared<volt::CSVLogger>(volt::CSVLoggerOptions(dir.path).name("tiny"));
  volt::Trainer trainer(
      volt_test::quiet(dir.path).max_epochs(3).log_every_n_steps(2).loggers({csv}).callbacks(
          {std::make_shared<volt::LearningRateMonitor>(),
           std::make_shared<volt::ThroughputMonitor>(
               volt::ThroughputMonitorOptions().window_size(3))}));
  trainer.fit(model, volt_test::loader(volt_test::blobs(128)),
              volt_test::loader(volt_test::blobs(64, 8, 1)));
  spit(csv->log_dir() + "/config.yaml",
       "trainer:\n  max_epochs: 3  # <script>alert(1)</script> & \"quotes\"\n");

  const std::string path = volt::write_run_report(csv->log_dir());
  EXPECT_EQ(path, csv->log_dir() + "/report.html");
  const std::string html = file_text(path);
  ASSERT_FALSE(html.empty());
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("<title>tiny/version_0 · volt report</title>"), std::string::npos);

  // One section per group, each with a plot and its metrics.
  const std::vector<std::pair<std::string, std::vector<std::string>>> groups = {
      {"Loss", {"train_loss", "val_loss"}},
      {"Accuracy", {"val_acc"}},
      {"Learning rate", {"lr-SGD"}},
      {"Throughput",
       {"train/device/samples_per_sec", "train/device/batches_per_sec",
        "validate/device/samples_per_sec", "validate/device/batches_per_sec"}}};
  for (const auto& [group, names] : groups) {
    const std::string s = cards(html, group);
    ASSERT_FALSE(s.empty()) << "no plot for " << group;
    EXPECT_GE(count(s, "<svg"), 1u) << group;
    for (const auto& n : names) {
      EXPECT_NE(s.find("data-name=\"" + n + "\""), std::string::npos) << group << ": " << n;
    }
  }
  EXPECT_EQ(count(cards(html, "Throughput"), "<svg"), 4u);  // samples and batches: own scales
  // ThroughputMonitor's running totals are no rates: they go to "Other metrics", alone.
  const std::string other = cards(html, "Other metrics");
  for (const char* n : {"train/time", "train/batches", "train/samples", "validate/time",
                        "validate/batches", "validate/samples"}) {
    EXPECT_NE(other.find(std::string("data-name=\"") + n + "\""), std::string::npos) << n;
  }
  EXPECT_EQ(count(other, "data-name=\""), 6u);
  // The loss line has one point per logged step: 24 steps / log_every_n_steps 2.
  EXPECT_EQ(count(path_of(html, "train_loss"), "L"), 11u);

  // Summary: steps, epochs and every metric.
  const std::string summary = section(html, "Summary");
  for (const char* n :
       {"train_loss", "val_loss", "val_acc", "lr-SGD", "train/device/samples_per_sec"}) {
    EXPECT_NE(summary.find(std::string("<td class=\"name\">") + n + "</td>"), std::string::npos)
        << n;
  }
  EXPECT_NE(html.find("<div class=\"k\">Steps</div><div class=\"v\">24</div>"), std::string::npos);
  EXPECT_NE(html.find("<div class=\"k\">Epochs</div><div class=\"v\">3</div>"), std::string::npos);

  // Config verbatim but escaped; hparams.yaml is "{}".
  EXPECT_NE(html.find("max_epochs: 3  # &lt;script&gt;alert(1)&lt;/script&gt; &amp; "
                      "&quot;quotes&quot;"),
            std::string::npos);
  EXPECT_EQ(html.find("<script>alert"), std::string::npos);
  EXPECT_NE(html.find("No hyperparameters were logged."), std::string::npos);

  // Self-contained: no URL anywhere (an SVG xmlns attribute would be harmless, so it is
  // ignored), no external stylesheet, script, image, font or import.
  const std::string no_ns = std::regex_replace(html, std::regex("xmlns(:\\w+)?=\"[^\"]*\""), "");
  EXPECT_EQ(no_ns.find("http://"), std::string::npos);
  EXPECT_EQ(no_ns.find("https://"), std::string::npos);
  EXPECT_EQ(no_ns.find("//cdn"), std::string::npos);
  for (const char* bad : {" src=", "<link", "@import", "url(", "<img", "<iframe"}) {
    EXPECT_EQ(html.find(bad), std::string::npos) << bad;
  }
  // Written atomically: no temp file left behind.
  DIR* d = ::opendir(csv->log_dir().c_str());
  ASSERT_NE(d, nullptr);
  while (dirent* e = ::readdir(d)) {
    EXPECT_EQ(std::string(e->d_name).find(".tmp"), std::string::npos) << e->d_name;
  }
  ::closedir(d);
}

TEST(RunReport, PlotsDeviceStatsMemoryWhenTheColumnsExist) {
  volt_test::TempDir dir;
  volt_test::TinyClassifier model;
  auto csv = std::make_shared<volt::CSVLogger>(volt::CSVLoggerOptions(dir.path).name("mem"));
  volt::Trainer trainer(
      volt_test::quiet(dir.path).max_epochs(2).log_every_n_steps(2).loggers({csv}).callbacks(
          {std::make_shared<volt::DeviceStatsMonitor>(
              volt::DeviceStatsMonitorOptions().host_stats(true))}));
  trainer.fit(model, volt_test::loader(volt_test::blobs(128)));
  const std::string html = file_text(volt::write_run_report(csv->log_dir()));
  // The byte gauges share one "Memory" plot; counts and the limit go to "Other metrics".
  const std::string mem = cards(html, "Memory");
  ASSERT_FALSE(mem.empty()) << "no Memory plot";
  EXPECT_EQ(count(mem, "<svg"), 1u);
  for (const char* n :
       {"device_stats/InUse", "device_stats/MaxInUse", "device_stats/host_rss_bytes"}) {
    EXPECT_NE(mem.find(std::string("data-name=\"") + n + "\""), std::string::npos) << n;
  }
  EXPECT_EQ(mem.find("device_stats/NumAllocs"), std::string::npos);
  EXPECT_NE(cards(html, "Other metrics").find("device_stats/NumAllocs"), std::string::npos);
}

TEST(RunReport, DrawsNonFiniteAndSinglePointSeriesWithoutBrokenCoordinates) {
  volt_test::TempDir dir;
  spit(dir / "metrics.csv",
       "step,train_loss,val_acc,lr,weird,epoch\n"
       "0,1.5,,0.1,7,\n"
       "1,1.4,,0.1,7,\n"
       "2,nan,,0.1,7,\n"
       "3,1.2,,0.1,7,\n"
       "4,1.1,,0.1,7,0\n"
       "5,-inf,0.75,0.1,7,\n"
       "6,1.0,,0.1,inf,\n");
  spit(dir / "hparams.yaml", "lr: 0.1\nmodel: <tiny>\n");
  const std::string html =
      file_text(volt::write_run_report(dir.path, volt::ReportOptions().title("odd values")));
  EXPECT_NE(html.find("<h1>odd values</h1>"), std::string::npos);
  // Every coordinate is a plain number: NaN/inf break the line instead of reaching the SVG.
  const std::regex bad_number("(nan|inf)", std::regex::icase);
  for (const char* s : {"train_loss", "lr", "weird"}) {
    const std::string d = path_of(html, s);
    EXPECT_FALSE(d.empty()) << s;
    EXPECT_FALSE(std::regex_search(d, bad_number)) << s << ": " << d;
  }
  // 1.5 1.4 | 1.2 1.1 | 1.0: two gaps, so three pieces.
  EXPECT_EQ(count(path_of(html, "train_loss"), "M"), 3u);
  EXPECT_EQ(count(path_of(html, "train_loss"), "L"), 2u);
  const std::regex coords("(cx|cy|x1|x2|y1|y2|x|y)=\"([^\"]*)\"");
  for (auto it = std::sregex_iterator(html.begin(), html.end(), coords);
       it != std::sregex_iterator(); ++it) {
    EXPECT_FALSE(std::regex_search((*it)[2].str(), bad_number)) << (*it)[0];
  }
  // A single value (val_acc) is a dot with a tooltip; a constant series still gets an axis.
  EXPECT_NE(html.find("<title>val_acc = 0.75 at step 5</title>"), std::string::npos);
  EXPECT_NE(html.find("2 non-finite"), std::string::npos);
  EXPECT_NE(html.find("data-name=\"weird\""), std::string::npos);
  // "Last" is the last value even when it is not finite (weird ends at +inf): the last finite
  // one (7) hid a run that ended diverged.
  EXPECT_NE(html.find("weird <b>+inf</b>"), std::string::npos);
  EXPECT_NE(html.find("<td class=\"n\">+inf <span class=\"at\">@6</span>"), std::string::npos);
  EXPECT_NE(html.find("model: &lt;tiny&gt;"), std::string::npos);
  EXPECT_NE(html.find("No config.yaml"), std::string::npos);
}

TEST(RunReport, ThinsLongSeriesButKeepsSpikes) {
  volt_test::TempDir dir;
  std::ostringstream csv;
  csv << "step,train_loss\n";
  for (int s = 0; s < 20000; ++s) csv << s << "," << (s == 12345 ? 100.0 : 1.0 / (1 + s)) << "\n";
  spit(dir / "metrics.csv", csv.str());
  const std::string html = file_text(
      volt::write_run_report(dir.path, volt::ReportOptions().max_points(400).interactive(false)));
  const std::string d = path_of(html, "train_loss");
  EXPECT_LE(count(d, "L") + 1, 400u);
  EXPECT_GE(count(d, "L") + 1, 200u);
  EXPECT_LT(html.size(), 100000u);
  // The spike survives thinning: the path reaches the top of the axis (100 maps to y = 12).
  EXPECT_NE(d.find(" 12.0"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);  // interactive(false)
  // A noisy series gets its moving average on top; smoothing(0) draws the raw values only.
  EXPECT_NE(html.find("class=\"raw\""), std::string::npos);
  EXPECT_NE(html.find("<path class=\"smooth\""), std::string::npos);
  const std::string raw_only =
      file_text(volt::write_run_report(dir.path, volt::ReportOptions().smoothing(0)));
  EXPECT_EQ(raw_only.find("class=\"smooth\""), std::string::npos);
  EXPECT_EQ(raw_only.find("moving average"), std::string::npos);
}

TEST(RunReportPlot, SmoothingIsADebiasedMovingAverageThatSkipsGaps) {
  std::vector<volt::detail::Point> pts = {{0, 2}, {1, 4}, {2, std::nan("")}, {3, 4}};
  const auto s = volt::detail::smooth(pts, 0.5);
  EXPECT_DOUBLE_EQ(s[0].y, 2);                     // debiased: the first value is itself
  EXPECT_DOUBLE_EQ(s[1].y, (0.5 * 1 + 2) / 0.75);  // ema 0.5*(0.5*2)+0.5*4 = 2.5, / (1-0.25)
  EXPECT_TRUE(std::isnan(s[2].y));
  EXPECT_NEAR(s[3].y, (0.5 * 2.5 + 2) / 0.875, 1e-12);
  EXPECT_EQ(s[3].x, 3);
  // 1000 points smooth with weight^(100/1000): the same share of the plot as 100 points.
  std::vector<volt::detail::Point> step(1000, {0, 0});
  for (int i = 0; i < 1000; ++i) step[i] = {double(i), i < 500 ? 0.0 : 1.0};
  const auto t = volt::detail::smooth(step, 0.6);
  const double w = std::pow(0.6, 0.1);
  EXPECT_NEAR(t[501].y, 1 - w * w, 1e-9);  // two steps into the jump (the debiasing is ~1 here)
}

TEST(RunReport, UsesTheNewestVersionFolderAndSaysSo) {
  volt_test::TempDir dir;
  const std::string root = dir / "volt_logs";
  for (const char* v : {"version_0", "version_2", "version_10", "version_11", "version_x",
                        "version_99999999999999999999"}) {
    mkdir_p(root + "/" + v);
  }
  spit(root + "/version_0/metrics.csv", "step,old_metric\n0,1\n");
  spit(root + "/version_2/metrics.csv", "step,old_metric\n0,2\n");
  spit(root + "/version_10/metrics.csv", "step,train_loss\n0,1\n1,0.5\n");
  spit(root + "/version_x/metrics.csv", "step,not_a_version\n0,1\n");
  // Past int64: not a version (std::out_of_range escaped before session 22).
  spit(root + "/version_99999999999999999999/metrics.csv", "step,huge\n0,1\n");
  // version_11 has no metrics.csv (a run that died before logging): skipped.
  const std::string path = volt::write_run_report(root + "/");
  EXPECT_EQ(path, root + "/report.html");
  const std::string html = file_text(path);
  EXPECT_NE(html.find("has no metrics.csv; showing version_10, the newest of 3 runs"),
            std::string::npos);
  EXPECT_NE(html.find("data-name=\"train_loss\""), std::string::npos);
  EXPECT_EQ(html.find("old_metric"), std::string::npos);
  EXPECT_NE(html.find("<h1>volt_logs</h1>"), std::string::npos);

  // An explicit output path; its folder is created.
  const std::string out = dir / "reports/run.html";
  EXPECT_EQ(volt::write_run_report(root, volt::ReportOptions().output(out)), out);
  EXPECT_NE(file_text(out).find("train_loss"), std::string::npos);
}

TEST(RunReport, HeaderOnlyFileGivesAnEmptyButValidPage) {
  volt_test::TempDir dir;
  spit(dir / "metrics.csv", "step\n");
  const std::string html = file_text(volt::write_run_report(dir.path));
  EXPECT_NE(html.find("has no metric values yet"), std::string::npos);
  EXPECT_EQ(html.find("<svg"), std::string::npos);
  EXPECT_NE(html.find("</html>"), std::string::npos);
}

TEST(RunReport, AnUnfinishedLastLineOfALiveRunIsLeftOutAndSaid) {
  // A run killed (or still running) while CSVLogger wrote a row: the row has no newline yet.
  // Cut inside its cells it is ragged ("2,0.") and would fail the page; cut inside a number it
  // would parse as another value. Either way it is left out and the page says so.
  volt_test::TempDir dir;
  for (const std::string tail : {"2,0.", "2,0.25,0.7"}) {
    SCOPED_TRACE(tail);
    spit(dir / "metrics.csv", "step,loss,acc\n0,0.5,0.1\n1,0.4,0.2\n" + tail);
    const std::string html = file_text(volt::write_run_report(dir.path));
    EXPECT_NE(html.find("2 rows in metrics.csv; line 4 left out, unfinished"), std::string::npos);
    EXPECT_NE(html.find("last logged step 1"), std::string::npos);
  }
  // Complete rows keep every value: no note.
  spit(dir / "metrics.csv", "step,loss\n0,0.5\n1,0.4\n");
  const std::string html = file_text(volt::write_run_report(dir.path));
  EXPECT_NE(html.find("2 rows in metrics.csv<"), std::string::npos);
}

TEST(RunReport, MissingRunFolderOrMetrics) {
  volt_test::TempDir dir;
  expect_error<volt::DataError>([&] { volt::write_run_report(dir / "nope"); }, "does not exist");
  mkdir_p(dir / "version_3");  // a version folder without metrics.csv does not count
  expect_error<volt::DataError>([&] { volt::write_run_report(dir.path); },
                                "no metrics.csv in '" + dir.path + "' nor in any version_N");
  expect_error<volt::ConfigError>([&] { volt::write_run_report(""); }, "run folder is empty");
}

TEST(RunReport, MalformedCsvNamesFileAndLine) {
  volt_test::TempDir dir;
  const std::string file = dir / "metrics.csv";
  auto fails = [&](const std::string& text, const std::string& phrase) {
    SCOPED_TRACE(text);
    spit(file, text);
    expect_error<volt::DataError>([&] { volt::write_run_report(dir.path); }, phrase);
  };
  fails("step,a,b\n0,1,2\n1,1\n", file + ":3: ragged row with 2 cells but the header has 3");
  fails("step,a,b\n0,1,2,3\n", file + ":2: ragged row with 4 cells");
  fails("step,a\n0,0.5\n1,abc\n", file + ":3: cell 'abc' in column 'a' is not a number");
  fails("step,a\n0,1.5x\n", file + ":2: cell '1.5x' in column 'a' is not a number");
  fails("step,a\nfirst,1\n", file + ":2: step 'first' is not an integer");
  fails("step,a\n1.5,1\n", file + ":2: step '1.5' is not an integer");
  fails("", file + ":1: no header line");
  fails("\n\n", file + ":1: no header line");
  fails("epoch,a\n0,1\n", file + ":1: the header 'epoch,...' has no 'step' column");
  fails("step,a, step\n0,1,2\n", file + ":1: columns 1 and 3 are both 'step'");
  fails("step,a,a\n0,1,2\n", file + ":1: column 'a' appears twice");
  fails("step,a,\n0,1,2\n", file + ":1: column 3 of the header has no name");
  fails("step,\"a,b\n0,1\n", file + ":1: a quoted cell is not closed");
  fails("step,\"a\"b\n0,1\n", file + ":1: text after a closing quote");
  // A quoted header cell (CSVLogger quotes names with commas) and CRLF line ends are fine.
  spit(file, "step,\"loss, smoothed\",\"say \"\"hi\"\"\"\r\n0,1,2\r\n");
  const std::string html = file_text(volt::write_run_report(dir.path));
  EXPECT_NE(html.find("data-name=\"loss, smoothed\""), std::string::npos);
  EXPECT_NE(html.find("data-name=\"say &quot;hi&quot;\""), std::string::npos);
}

// A metrics.csv from Lightning 2.6's CSVLogger, byte for byte as its _ExperimentWriter writes
// one (csv.DictWriter: every name sorted, "step" among them, CRLF, Python's float repr, training
// and validation rows apart). Until session 106 the report refused it: its first column is not
// "step".
TEST(RunReport, ReadsAMetricsCsvLightningWrote) {
  volt_test::TempDir dir;
  mkdir_p(dir / "lightning_logs/version_0");
  spit(dir / "lightning_logs/version_0/metrics.csv",
       "epoch,step,train_loss,val_acc,val_loss\r\n"
       "0,49,2.1234567165374756,,\r\n"
       "0,99,1.5,,\r\n"
       "0,99,,0.75,0.6931471824645996\r\n"
       "1,149,1.0,,\r\n"
       "1,199,0.5,,\r\n"
       "1,199,,0.875,0.25\r\n");
  spit(dir / "lightning_logs/version_0/hparams.yaml", "lr: 0.1\n");
  const std::string html = file_text(volt::write_run_report(dir / "lightning_logs"));
  const std::string loss = cards(html, "Loss");
  EXPECT_NE(loss.find("data-name=\"train_loss\""), std::string::npos);
  EXPECT_NE(loss.find("data-name=\"val_loss\""), std::string::npos);
  EXPECT_NE(cards(html, "Accuracy").find("data-name=\"val_acc\""), std::string::npos);
  // "epoch" and "step" are the axes, not metrics; each series has its own points.
  EXPECT_EQ(html.find("data-name=\"epoch\""), std::string::npos);
  EXPECT_EQ(html.find("data-name=\"step\""), std::string::npos);
  EXPECT_EQ(count(path_of(html, "train_loss"), "L"), 3u);
  EXPECT_EQ(count(path_of(html, "val_loss"), "L"), 1u);
  EXPECT_NE(html.find("6 rows in metrics.csv<"), std::string::npos);
  EXPECT_NE(html.find("last logged step 199"), std::string::npos);
  EXPECT_NE(html.find("<div class=\"k\">Epochs</div><div class=\"v\">2</div>"), std::string::npos);
  EXPECT_NE(html.find("lr: 0.1"), std::string::npos);
}

// Names are read as CSVLogger wrote them: " loss" and "loss" are two metrics. Until session 90
// the report trimmed header names, so it refused the logger's own file ("column 'loss' appears
// twice").
TEST(RunReport, MetricNamesWithSpacesAreTheLoggersOwn) {
  volt_test::TempDir dir;
  volt::CSVLogger csv(volt::CSVLoggerOptions(dir.path).name("run"));
  csv.log_metrics({{"loss", 1.0}, {" loss", 2.0}}, 0);
  csv.log_metrics({{"loss", 0.5}, {" loss", 1.5}}, 1);
  csv.save();
  const std::string html = file_text(volt::write_run_report(csv.log_dir()));
  EXPECT_NE(html.find("data-name=\"loss\""), std::string::npos);
  EXPECT_NE(html.find("data-name=\" loss\""), std::string::npos);
}

TEST(RunReport, BadOptionsAndUnwritableOutput) {
  volt_test::TempDir dir;
  spit(dir / "metrics.csv", "step,a\n0,1\n");
  expect_error<volt::ConfigError>(
      [&] { volt::write_run_report(dir.path, volt::ReportOptions().max_points(1)); },
      "max_points=1 is too small");
  // A regular file where the output folder should be.
  spit(dir / "blocker", "x");
  expect_error<volt::ConfigError>(
      [&] {
        volt::write_run_report(dir.path, volt::ReportOptions().output(dir / "blocker/r.html"));
      },
      "cannot create");
  std::ostringstream os;
  os << volt::ReportOptions().title("t");
  EXPECT_EQ(os.str(),
            "ReportOptions(output=\"\", title=\"t\", max_points=2000, smoothing=0.6, "
            "interactive=true)");
  expect_error<volt::ConfigError>(
      [&] { volt::write_run_report(dir.path, volt::ReportOptions().smoothing(1.0)); },
      "smoothing=1 is outside [0, 1)");
}

}  // namespace
