#include "volt/callbacks/spike_detection.h"

#include <torch/serialize/archive.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <iostream>
#include <limits>
#include <numeric>
#include <utility>

#include "core/detail/archive_values.h"
#include "core/detail/numbers.h"
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

SpikeDetector::SpikeDetector(SpikeDetectionOptions options) : options_(std::move(options)) {
  options_.validate();
}

void SpikeDetector::reset() {
  window_.clear();
  bad_batches_.clear();
  seen_ = 0;
}

double SpikeDetector::running_mean() const {
  if (window_.empty()) return std::numeric_limits<double>::quiet_NaN();
  return std::accumulate(window_.begin(), window_.end(), 0.0) / static_cast<double>(window_.size());
}

std::string SpikeDetector::exclude_batches_file(const std::string& root) const {
  const std::string& p = options_.exclude_batches_path();
  if (p.empty()) return (std::filesystem::path(root) / "skip_batches.json").string();
  const bool json = p.size() >= 5 && p.compare(p.size() - 5, 5, ".json") == 0;
  return json ? p : (std::filesystem::path(p) / "skip_batches.json").string();
}

bool SpikeDetector::is_spike(double loss) const {
  if (!std::isfinite(loss)) return options_.finite_only();
  if (window_.empty()) return false;
  const bool min = options_.mode() == Mode::kMin;
  // No worse than the previous batch's loss (the window's latest): not a spike (Lightning's
  // first test).
  const double last = window_.back();
  if (min ? loss <= last : loss >= last) return false;
  const double mean = running_mean();
  const double worse = min ? loss - mean : mean - loss;  // how far on the bad side of the mean
  if (worse <= 0) return false;
  if (options_.atol() > 0 && worse < options_.atol()) return false;
  if (options_.rtol() > 0 && worse < options_.rtol() * std::abs(mean)) return false;
  return true;
}

void SpikeDetector::judge(const at::Tensor& loss_tensor, const SpikeSite& site) {
  const bool have = loss_tensor.defined();
  VOLT_CHECK(!have || loss_tensor.numel() == 1, ValueError, kTag, " the loss has ",
             loss_tensor.numel(), " values (shape ", loss_tensor.sizes(),
             "); pass the batch's scalar loss (reduce a per-sample loss with mean() first).");
  const double loss = have ? loss_tensor.item<double>() : 0.0;
  const bool judged = have && seen_ >= options_.warmup();
  const bool spike_here = judged && is_spike(loss);
  const double mean = running_mean();
  if (have) ++seen_;
  const bool spike = site.any_rank ? site.any_rank(spike_here) : spike_here;
  if (!spike) {
    if (have && std::isfinite(loss)) {
      window_.push_back(loss);
      while (static_cast<int64_t>(window_.size()) > options_.window()) window_.pop_front();
    }
    return;
  }
  // The spike's batch, and the one before it: that one's update may be what made the weights
  // produce the spike (Lightning leaves out both).
  if (site.batch_idx > 0) bad_batches_.push_back(site.batch_idx - 1);
  bad_batches_.push_back(site.batch_idx);
  const std::string file = exclude_batches_file(site.root);
  std::string written = " written to " + file;
  if (site.writes) {
    try {
      const auto parent = std::filesystem::path(file).parent_path();
      if (!parent.empty()) std::filesystem::create_directories(parent);
      atomic_write_file(file, nlohmann::json(bad_batches_).dump(4) + "\n");
    } catch (const std::exception& e) {
      // The spike is the error to report; a list that could not be written is said in it.
      written = " NOT written to " + file + " (" + e.what() + ")";
    }
  }
  auto msg = detail::c_stream<std::ostringstream>();
  msg << kTag << " training spike in batch " << site.batch_idx << site.position << ": ";
  if (spike_here) {
    msg << "loss " << loss << " against a running mean of " << mean << " over the last "
        << window_.size() << " batches";
  } else {
    msg << "another rank's loss spiked (this rank's: " << loss << ")";
  }
  msg << ". Batches to leave out";
  for (size_t i = 0; i < bad_batches_.size(); ++i) msg << (i == 0 ? " [" : ", ") << bad_batches_[i];
  msg << "]" << (site.writes ? written : " (written by rank 0)")
      << "; resume from a checkpoint written before the spike without those batches, lower "
         "the learning rate, or loosen atol / rtol.";
  throw TrainingSpikeError(msg.str(), site.batch_idx);
}

void SpikeDetector::save_state(torch::serialize::OutputArchive& archive) const {
  archive.write("window", detail::double_list({window_.begin(), window_.end()}));
  archive.write("bad_batches", c10::IValue(c10::List<int64_t>(bad_batches_)));
  archive.write("seen", c10::IValue(seen_));
}

void SpikeDetector::load_state(torch::serialize::InputArchive& archive) {
  const std::vector<double> window = detail::read_double_list(archive, "window");
  c10::IValue bad, seen;
  archive.read("bad_batches", bad);
  archive.read("seen", seen);
  VOLT_CHECK(bad.isIntList() && seen.isInt(), CheckpointError, kTag,
             " the checkpoint's state has values of the wrong types; it is damaged: resume from "
             "another checkpoint.");
  window_.assign(window.begin(), window.end());
  // A checkpoint of a run with a longer window: its latest losses.
  while (static_cast<int64_t>(window_.size()) > options_.window()) window_.pop_front();
  const auto list = bad.toIntList();
  bad_batches_.assign(list.begin(), list.end());
  seen_ = seen.toInt();
}

SpikeDetection::SpikeDetection(SpikeDetectionOptions options) : detector_(std::move(options)) {}

void SpikeDetection::setup(RunContext&, Module&, Stage stage) {
  if (stage != Stage::kFit) return;
  // A new fit judges from scratch; a resumed one gets the checkpoint's state after this.
  detector_.reset();
  loss_ = at::Tensor();
}

void SpikeDetection::on_before_backward(RunContext&, Module&, const at::Tensor& loss) {
  loss_ = loss.detach();
}

void SpikeDetection::on_train_batch_end(RunContext& run, Module&, const Batch&, int64_t batch_idx) {
  // A skipped batch (training_step returned no loss) ran no backward: nothing to judge, but
  // every rank still takes part in the decision so that the ranks' collectives pair up.
  const at::Tensor loss = std::exchange(loss_, at::Tensor());
  SpikeSite site;
  site.batch_idx = batch_idx;
  site.position = " of epoch " + std::to_string(run.state().epoch) + " (global step " +
                  std::to_string(run.state().global_step) + ")";
  site.root = run.log_dir();
  site.writes = run.is_global_zero();
  // One process makes no collective (a one-rank all-reduce per batch would be pure cost).
  if (run.world_size() > 1) {
    site.any_rank = [&run](bool spike_here) {
      return run.reduce_boolean_decision(spike_here, false);
    };
  }
  detector_.judge(loss, site);
}

void SpikeDetection::save_state(torch::serialize::OutputArchive& archive) const {
  detector_.save_state(archive);
}

void SpikeDetection::load_state(torch::serialize::InputArchive& archive) {
  detector_.load_state(archive);
}

}  // namespace volt
