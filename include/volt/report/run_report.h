#pragma once
/// write_run_report: turns a CSVLogger run folder into one self-contained HTML page (inline CSS
/// and SVG plots, no network needed to view it) with the metrics, a summary, config and hparams.

#include <torch/arg.h>

#include <cstdint>
#include <iosfwd>
#include <string>

namespace volt {

struct ReportOptions {
  /// File to write; empty means "<run_dir>/report.html", in the folder passed to
  /// write_run_report (also when its metrics.csv was found in a version_N sub-folder).
  /// Default: "".
  TORCH_ARG(std::string, output) = "";
  /// Page title; empty means the run folder's name. Default: "".
  TORCH_ARG(std::string, title) = "";
  /// Most points drawn per series; longer series keep each bucket's min and max. Default: 2000.
  TORCH_ARG(int64_t, max_points) = 2000;
  /// Weight of the moving average drawn over noisy series (more than 60 points; learning rates
  /// excepted), like TensorBoard's smoothing slider, in [0, 1); 0 draws only the raw values.
  /// Default: 0.6.
  TORCH_ARG(double, smoothing) = 0.6;
  /// Add a small inline script for hover read-outs (the page is complete without it).
  /// Default: true.
  TORCH_ARG(bool, interactive) = true;
};

std::ostream& operator<<(std::ostream& os, const ReportOptions& o);

/// Reads `run_dir`/metrics.csv (or, when it has none, that of its highest version_N sub-folder),
/// hparams.yaml and config.yaml if present, writes the HTML page atomically and returns its path.
/// Throws DataError for a missing or malformed metrics.csv (naming file and line) and
/// ConfigError for bad options or an unwritable output.
std::string write_run_report(const std::string& run_dir, const ReportOptions& options = {});

}  // namespace volt
