#pragma once
// Private: `volt perf --trace FILE`, the trace-scanning tool (issue #11, the reference's
// habana_perf_tool). Reads a Chrome trace written by TorchProfiler or by PyTorch's profiler and
// turns where the step time went into concrete advice. No torch: compiles in about a second.

#include <cstdint>
#include <string>
#include <vector>

namespace volt {
namespace detail {

/// What a scan found. Shares are of the recorded step time (the ProfilerStep#N spans, or the
/// whole trace when it has none).
struct PerfScan {
  int64_t steps = 0;            ///< ProfilerStep spans (0: the trace has none)
  double step_time_us = 0;      ///< total time scanned
  double data_share = 0;        ///< batch fetching (get_*_batch, DataLoader __next__)
  double optimizer_share = 0;   ///< optimizer_step / Optimizer.step regions
  double collective_share = 0;  ///< gloo:/nccl:/c10d ops on the main thread's critical path
  double idle_share = 0;        ///< main-thread time inside steps covered by no event
  double device_time_us = 0;    ///< device-side (kernel / gpu) events; 0 in CPU traces
  int64_t ops = 0;              ///< host ops (cat cpu_op)
  double mean_op_us = 0;        ///< mean self time of the step's host ops (batch fetches excluded)
  int64_t host_syncs = 0;       ///< item() / _local_scalar_dense and friends (outermost)
  int64_t nonfinite_check_syncs = 0;  ///< of those, the Trainer's own non-finite loss check
  std::vector<std::pair<std::string, double>> top_ops;  ///< by self time (µs), top 10
  std::vector<std::string> advice;                      ///< one line each
};

/// The input limits of a trace: traces are far bigger than configs (a PyTorch trace of a few
/// steps holds hundreds of thousands of events): 512 MiB and 40 million JSON nodes.
constexpr size_t kTraceMaxBytes = size_t{512} << 20;
constexpr size_t kTraceMaxNodes = 40000000;

/// Scans trace JSON text (`source` names it in errors). Throws ConfigError for malformed JSON or
/// a text that is not a Chrome trace (no traceEvents), naming the source.
PerfScan scan_trace(const std::string& text, const std::string& source);
/// The scan as the text `volt perf` prints.
std::string format_scan(const PerfScan& scan, const std::string& source);

}  // namespace detail
}  // namespace volt
