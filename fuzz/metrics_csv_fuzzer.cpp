// libFuzzer target: a run folder's metrics.csv, read the two ways volt reads it.
//   - `volt report` (write_run_report): detail/metrics_csv's reader, then the page's plots (axes
//     and ticks over any finite or non-finite values, decimation, smoothing, epoch lines).
//   - CSVLogger's resume (load_state at a step): the rows before that step are kept, then a
//     logged row and a save rewrite the file, which the report's reader must accept again.
// Bad input must end in a DataError; anything else (another exception, a crash, a sanitizer
// report: UBSan aborts on a float-to-integer overflow) is a finding.
//
// Input: byte 0 picks the report's options (max_points 2-33, smoothing 0 or 0.6) and the resume
// step (0-7, or a large one); the rest is the metrics.csv text.

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>

#include "fuzz_common.h"
#include "report/detail/metrics_csv.h"
#include "volt/core/errors.h"
#include "volt/loggers/csv.h"
#include "volt/report/run_report.h"

namespace {

/// One folder per fuzzing process, removed at exit; the run's file is
/// save_dir()/run/version_0/metrics.csv.
const char* save_dir() {
  static char dir[] = "/tmp/volt_fuzz_metrics_XXXXXX";  // static: still there at exit
  static const bool made = [] {
    if (::mkdtemp(dir) == nullptr) volt_fuzz::finding("mkdtemp failed");
    std::filesystem::create_directories(std::string(dir) + "/run/version_0");
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(dir, ignored);
    });
    return true;
  }();
  (void)made;
  return dir;
}

void write_file(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) volt_fuzz::finding("cannot write " + path);
  std::fwrite(text.data(), 1, text.size(), f);
  std::fclose(f);
}

void report(const std::string& run_dir, uint8_t knobs) {
  const auto opts = volt::ReportOptions()
                        .output(std::string(save_dir()) + "/report.html")
                        .max_points(2 + knobs % 32)
                        .smoothing(knobs & 32 ? 0.6 : 0.0);
  try {
    volt::write_run_report(run_dir, opts);
    volt_fuzz::trace("report written");
  } catch (const volt::DataError& e) {
    volt_fuzz::trace(std::string("report refused: ") + e.what());
  }
}

void resume(const std::string& run_dir, uint8_t knobs) {
  const int64_t step = knobs & 64 ? int64_t{1} << 40 : knobs % 8;
  volt::CSVLogger logger(volt::CSVLoggerOptions(save_dir()).name("run").version(0));
  logger.version();  // resolved, as a run's logger is by its first checkpoint
  torch::serialize::OutputArchive out;
  logger.save_state(out);
  std::stringstream bytes;
  out.save_to(bytes);
  torch::serialize::InputArchive in;
  in.load_from(bytes);
  try {
    logger.load_state(in, step);
  } catch (const volt::DataError& e) {
    volt_fuzz::trace(std::string("resume refused: ") + e.what());
    return;
  }
  logger.log_metrics({{"loss", 0.5}, {"a,\"b\"", 1.0}}, step);
  logger.save();
  try {
    volt::detail::read_metrics_csv(run_dir + "/metrics.csv");
  } catch (const volt::DataError& e) {
    volt_fuzz::finding(std::string("a resumed CSVLogger wrote a file the report refuses: ") +
                       e.what());
  }
  volt_fuzz::trace("resumed and rewritten");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t knobs = data[0];
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::string run_dir = std::string(save_dir()) + "/run/version_0";
  try {
    write_file(run_dir + "/metrics.csv", text);
    report(run_dir, knobs);  // reads the file, writes report.html beside the run folder
    resume(run_dir, knobs);
  } catch (const std::exception& e) {
    volt_fuzz::finding(std::string("metrics.csv let a non-DataError escape: ") + e.what());
  }
  return 0;
}
