#include "volt/profiler/throughput.h"

#include <cmath>
#include <limits>
#include <ostream>

#include "volt/core/check.h"
#include "volt/core/log.h"

namespace volt {

std::ostream& operator<<(std::ostream& os, const ThroughputOptions& o) {
  os << "ThroughputOptions(available_flops=";
  if (o.available_flops()) {
    os << *o.available_flops();
  } else {
    os << "none";
  }
  os << ", world_size=" << o.world_size() << ", window_size=" << o.window_size() << ", separator=\""
     << o.separator() << "\", using_sparse_model=";
  if (o.using_sparse_model()) {
    os << (*o.using_sparse_model() ? "true" : "false");
  } else {
    os << "none";
  }
  return os << ", sparse_cuda_acceleration_factor=" << o.sparse_cuda_acceleration_factor() << ")";
}

Throughput::Throughput(ThroughputOptions options) : options_(std::move(options)) {
  VOLT_CHECK(options_.window_size() >= 2, ValueError, "[Throughput] window_size is ",
             options_.window_size(),
             "; a rate needs a first and a last point: use 2 or more (default 100).");
  VOLT_CHECK(options_.world_size() >= 1, ValueError, "[Throughput] world_size is ",
             options_.world_size(), "; pass the number of data-parallel devices (1 or more).");
  VOLT_CHECK(options_.sparse_cuda_acceleration_factor() >= 1.0 &&
                 std::isfinite(options_.sparse_cuda_acceleration_factor()),
             ValueError, "[Throughput] sparse_cuda_acceleration_factor is ",
             options_.sparse_cuda_acceleration_factor(),
             "; sparsity cannot lower the peak FLOPs and no peak is infinite: use a finite 1.0 or "
             "more (default 2.0).");
  if (options_.available_flops()) {
    VOLT_CHECK(*options_.available_flops() > 0 && std::isfinite(*options_.available_flops()),
               ValueError, "[Throughput] available_flops is ", *options_.available_flops(),
               "; pass the device's peak FLOPs per second (finite, > 0), or leave it unset for no "
               "MFU.");
    peak_flops_ = *options_.available_flops();
    if (!options_.using_sparse_model()) {
      warn_once("Throughput.dense", "Throughput",
                "MFU assumes dense model FLOPs (no sparsity acceleration); set "
                "using_sparse_model(true) for MFU to use sparse FLOPs.");
    } else if (*options_.using_sparse_model()) {
      peak_flops_ *= options_.sparse_cuda_acceleration_factor();
    }
  }
}

namespace {

template <typename T>
void check_rising(const std::deque<T>& window, T value, const char* name) {
  VOLT_CHECK(window.empty() || value > window.back(), ValueError, "[Throughput] ", name,
             " must increase with every update (last ", window.empty() ? T{} : window.back(),
             ", now ", value,
             "); pass running totals since the loop started, not per-batch values.");
}

}  // namespace

template <typename T>
void Throughput::push(std::deque<T>& window, T value) {
  window.push_back(value);
  if (static_cast<int64_t>(window.size()) > options_.window_size()) window.pop_front();
}

void Throughput::update(double time, int64_t batches, int64_t samples,
                        c10::optional<int64_t> lengths, c10::optional<int64_t> flops) {
  VOLT_CHECK(samples >= batches, ValueError, "[Throughput] samples (", samples,
             ") are fewer than batches (", batches,
             "); each batch holds at least one sample: pass the totals in that order.");
  if (lengths) {
    VOLT_CHECK(*lengths >= samples, ValueError, "[Throughput] lengths (", *lengths,
               ") are fewer than samples (", samples,
               "); each sample holds at least one item: pass the total items so far.");
  }
  VOLT_CHECK(lengths.has_value() == !lengths_.empty() || time_.empty(), ValueError,
             "[Throughput] lengths were passed in ",
             lengths ? "this update but not before" : "earlier updates but not this one",
             "; pass them in every update or in none (reset() starts over).");
  VOLT_CHECK(!flops || (*flops >= 0 &&
                        *flops <= std::numeric_limits<int64_t>::max() / options_.world_size()),
             ValueError, "[Throughput] flops is ", flops.value_or(0),
             "; pass the FLOPs this device ran since the previous update (>= 0, and times the "
             "world size within int64).");
  // Every check before any change, so that a refused update leaves the windows as they were.
  check_rising(time_, time, "time");
  check_rising(batches_, batches, "batches");
  check_rising(samples_, samples, "samples");
  if (lengths) check_rising(lengths_, *lengths, "lengths");
  push(time_, time);
  push(batches_, batches);
  push(samples_, samples);
  if (lengths) push(lengths_, *lengths);
  if (flops) push(flops_, *flops * options_.world_size());  // the job's, as Lightning's
}

Metrics Throughput::compute() const {
  Metrics m;
  if (time_.empty()) return m;
  const std::string device = "device" + options_.separator();
  const bool job = options_.world_size() > 1;
  const double world = static_cast<double>(options_.world_size());
  m["time"] = time_.back();
  m["batches"] = static_cast<double>(batches_.back());
  m["samples"] = static_cast<double>(samples_.back());
  if (!lengths_.empty()) m["lengths"] = static_cast<double>(lengths_.back());
  const auto full = [&](size_t n) { return static_cast<int64_t>(n) == options_.window_size(); };
  const double elapsed = time_.back() - time_.front();
  if (full(time_.size())) {
    const double batches = static_cast<double>(batches_.back() - batches_.front()) / elapsed;
    const double samples = static_cast<double>(samples_.back() - samples_.front()) / elapsed;
    m[device + "batches_per_sec"] = batches;
    m[device + "samples_per_sec"] = samples;
    if (job) {
      m["batches_per_sec"] = batches * world;
      m["samples_per_sec"] = samples * world;
    }
    if (full(lengths_.size())) {
      const double items = static_cast<double>(lengths_.back() - lengths_.front()) / elapsed;
      m[device + "items_per_sec"] = items;
      if (job) m["items_per_sec"] = items * world;
    }
  }
  if (full(flops_.size())) {
    // The first update's FLOPs ran before the window's first time point.
    double flops = 0;  // summed as doubles: a window of large counts passes int64
    for (auto it = flops_.begin() + 1; it != flops_.end(); ++it) flops += static_cast<double>(*it);
    const double per_sec = flops / elapsed;
    const double device_per_sec = per_sec / world;
    if (job) m["flops_per_sec"] = per_sec;
    m[device + "flops_per_sec"] = device_per_sec;
    if (peak_flops_ > 0) m[device + "mfu"] = device_per_sec / peak_flops_;
  }
  return m;
}

void Throughput::reset() {
  time_.clear();
  batches_.clear();
  samples_.clear();
  lengths_.clear();
  flops_.clear();
}

}  // namespace volt
