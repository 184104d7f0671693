#pragma once
// A Chrome trace of what runs between begin() and end(), through libtorch's kineto profiler:
// GPU kernels, copies and memsets, and the host-side ops too when asked. Only where kineto can
// see a GPU: CUDA builds on libtorch >= 2.1 (available() says so); elsewhere begin() and end()
// do nothing. tools/kernel_table.py sums a trace's GPU time kernel by kernel (or compares two).

#include <volt/core/version.h>

#include <string>

#if defined(VOLT_CUDA) && VOLT_TORCH_AT_LEAST(2, 1)
#define VOLT_BENCH_KINETO 1
#include <torch/csrc/autograd/profiler_kineto.h>

#include <set>
#else
#define VOLT_BENCH_KINETO 0
#endif

namespace volt_bench {

class KinetoTrace {
 public:
  static constexpr bool available() { return VOLT_BENCH_KINETO != 0; }

  /// Prepares the profiler (its set-up stays out of the traced span); `host_ops`: also record
  /// the host side (libtorch ops, their launches), to see where the host waits or spends time.
  explicit KinetoTrace(bool host_ops = false) {
#if VOLT_BENCH_KINETO
    using torch::profiler::impl::ActivityType;
    activities_ = {ActivityType::CUDA};
    if (host_ops) activities_.insert(ActivityType::CPU);
    torch::autograd::profiler::prepareProfiler(config(), activities_);
#else
    (void)host_ops;
#endif
  }
  /// Starts recording (call after a device synchronize, so earlier work stays out).
  void begin() {
#if VOLT_BENCH_KINETO
    torch::autograd::profiler::enableProfiler(config(), activities_);
    on_ = true;
#endif
  }
  /// Stops recording and writes the trace to `path` (call after a device synchronize).
  void end(const std::string& path) {
#if VOLT_BENCH_KINETO
    if (!on_) return;
    on_ = false;
    torch::autograd::profiler::disableProfiler()->save(path);
#else
    (void)path;
#endif
  }

 private:
#if VOLT_BENCH_KINETO
  static torch::profiler::impl::ProfilerConfig config() {
    return torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::KINETO);
  }
  std::set<torch::profiler::impl::ActivityType> activities_;
  bool on_ = false;
#endif
};

}  // namespace volt_bench
