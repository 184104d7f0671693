#include "volt/callbacks/spike_detection.h"

#include <torch/serialize/archive.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <iostream>
#include <limits>
#include <numeric>
#include <sstream>

#include "core/detail/archive_values.h"
#include "core/detail/print.h"
#include "volt/core/atomic_file.h"
#include "volt/core/check.h"
#include "volt/core/loop_state.h"
#include "volt/core/run_context.h"

namespace volt {

namespace {

constexpr const char* kTag = "[SpikeDetection]";

bool bad_tolerance(double v) {
  return !std::isfinite(v) || v < 0;
}

}  // namespace

void SpikeDetectionOptions::validate() const {
  VOLT_CHECK(window() >= 1, ConfigError, kTag, " window=", window(),
             " must be >= 1 (the losses the running mean covers).");
  VOLT_CHECK(warmup() >= 0, ConfigError, kTag, " warmup=", warmup(),
             " must be >= 0 (batches before spikes are looked for).");
  VOLT_CHECK(!bad_tolerance(atol()) && !bad_tolerance(rtol()), ConfigError, kTag, " atol=", atol(),
             " and rtol=", rtol(), " must be finite and >= 0 (0 = no bound).");
  VOLT_CHECK(atol() > 0 || rtol() > 0, ConfigError, kTag,
             " atol and rtol are both 0, so every loss above the running mean would be a spike; "
             "set atol (an absolute distance) or rtol (a multiple of the mean) above 0.");
}

std::ostream& operator<<(std::ostream& os, const SpikeDetectionOptions& o) {
  return os << "SpikeDetectionOptions(mode=" << (o.mode() == Mode::kMin ? "min" : "max")
            << ", window=" << o.window() << ", warmup=" << o.warmup() << ", atol=" << o.atol()
            << ", rtol=" << o.rtol()
            << ", exclude_batches_path=" << detail::quoted(o.exclude_batches_path())
            << ", finite_only=" << o.finite_only() << ")";
}

SpikeDetection::SpikeDetection(SpikeDetectionOptions options) : options_(std::move(options)) {
  options_.validate();
}

double SpikeDetection::running_mean() const {
  if (window_.empty()) return std::numeric_limits<double>::quiet_NaN();
  return std::accumulate(window_.begin(), window_.end(), 0.0) / static_cast<double>(window_.size());
}

std::string SpikeDetection::exclude_batches_file(const std::string& root) const {
  const std::string& p = options_.exclude_batches_path();
  if (p.empty()) return (std::filesystem::path(root) / "skip_batches.json").string();
  const bool json = p.size() >= 5 && p.compare(p.size() - 5, 5, ".json") == 0;
  return json ? p : (std::filesystem::path(p) / "skip_batches.json").string();
}

void SpikeDetection::setup(RunContext&, Module&, Stage stage) {
  if (stage != Stage::kFit) return;
  // A new fit judges from scratch; a resumed one gets the checkpoint's state after this.
  window_.clear();
  has_last_ = false;
  last_ = 0.0;
  bad_batches_.clear();
  seen_ = 0;
  loss_ = at::Tensor();
}

void SpikeDetection::on_before_backward(RunContext&, Module&, const at::Tensor& loss) {
  loss_ = loss.detach();
}

bool SpikeDetection::is_spike(double loss) const {
  if (!std::isfinite(loss)) return options_.finite_only();
  if (window_.empty()) return false;
  const bool min = options_.mode() == Mode::kMin;
  // No worse than the previous batch's loss: not a spike (Lightning's first test).
  if (has_last_ && (min ? loss <= last_ : loss >= last_)) return false;
  const double mean = running_mean();
  const double worse = min ? loss - mean : mean - loss;  // how far on the bad side of the mean
  if (worse <= 0) return false;
  if (options_.atol() > 0 && worse < options_.atol()) return false;
  if (options_.rtol() > 0 && worse < options_.rtol() * std::abs(mean)) return false;
  return true;
}

void SpikeDetection::on_train_batch_end(RunContext& run, Module&, const Batch&, int64_t batch_idx) {
  // A skipped batch (training_step returned no loss) ran no backward: nothing to judge, but
  // every rank still takes part in the decision below so that the ranks' collectives pair up.
  const bool have = loss_.defined();
  const double loss = have ? loss_.item<double>() : 0.0;
  loss_ = at::Tensor();
  const bool judged = have && seen_ >= options_.warmup();
  const bool spike_here = judged && is_spike(loss);
  const double mean = running_mean();
  if (have) ++seen_;
  const bool spike =
      run.world_size() > 1 ? run.reduce_boolean_decision(spike_here, false) : spike_here;
  if (!spike) {
    if (have && std::isfinite(loss)) {
      window_.push_back(loss);
      while (static_cast<int64_t>(window_.size()) > options_.window()) window_.pop_front();
      last_ = loss;
      has_last_ = true;
    }
    return;
  }
  // The spike's batch, and the one before it: that one's update may be what made the weights
  // produce the spike (Lightning leaves out both).
  if (batch_idx > 0) bad_batches_.push_back(batch_idx - 1);
  bad_batches_.push_back(batch_idx);
  const std::string file = exclude_batches_file(run.log_dir());
  std::string written = " written to " + file;
  if (run.is_global_zero()) {
    try {
      const auto parent = std::filesystem::path(file).parent_path();
      if (!parent.empty()) std::filesystem::create_directories(parent);
      atomic_write_file(file, nlohmann::json(bad_batches_).dump(4) + "\n");
    } catch (const std::exception& e) {
      // The spike is the error to report; a list that could not be written is said in it.
      written = " NOT written to " + file + " (" + e.what() + ")";
    }
  }
  std::ostringstream msg;
  msg << kTag << " training spike in batch " << batch_idx << " of epoch " << run.state().epoch
      << " (global step " << run.state().global_step << "): ";
  if (spike_here) {
    msg << "loss " << loss << " against a running mean of " << mean << " over the last "
        << window_.size() << " batches";
  } else {
    msg << "another rank's loss spiked (this rank's: " << loss << ")";
  }
  msg << ". Batches to leave out";
  for (size_t i = 0; i < bad_batches_.size(); ++i) msg << (i == 0 ? " [" : ", ") << bad_batches_[i];
  msg << "]" << (run.is_global_zero() ? written : " (written by rank 0)")
      << "; resume from a checkpoint written before the spike without those batches, lower "
         "the learning rate, or loosen atol / rtol.";
  throw TrainingSpikeError(msg.str(), batch_idx);
}

void SpikeDetection::save_state(torch::serialize::OutputArchive& archive) const {
  archive.write("window", detail::double_list({window_.begin(), window_.end()}));
  archive.write("last", has_last_ ? c10::IValue(last_) : c10::IValue());
  archive.write("bad_batches", c10::IValue(c10::List<int64_t>(bad_batches_)));
  archive.write("seen", c10::IValue(seen_));
}

void SpikeDetection::load_state(torch::serialize::InputArchive& archive) {
  const std::vector<double> window = detail::read_double_list(archive, "window");
  c10::IValue last, bad, seen;
  archive.read("last", last);
  archive.read("bad_batches", bad);
  archive.read("seen", seen);
  VOLT_CHECK((last.isNone() || last.isDouble()) && bad.isIntList() && seen.isInt(), CheckpointError,
             kTag,
             " the checkpoint's state has values of the wrong types; it is damaged: resume from "
             "another checkpoint.");
  window_.assign(window.begin(), window.end());
  // A checkpoint of a run with a longer window: its latest losses.
  while (static_cast<int64_t>(window_.size()) > options_.window()) window_.pop_front();
  has_last_ = !last.isNone();
  last_ = has_last_ ? last.toDouble() : 0.0;
  const auto list = bad.toIntList();
  bad_batches_.assign(list.begin(), list.end());
  seen_ = seen.toInt();
}

}  // namespace volt
