#pragma once
// Private: accumulates values passed to Module::log without reading them until someone asks.

#include <ATen/Tensor.h>
#include <torch/serialize/archive.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "volt/core/loop_state.h"
#include "volt/core/run_context.h"

namespace volt {
namespace detail {

// Values are kept as detached tensors: per-step logging costs no device sync; values are
// read (item()) only when loggers flush, the progress bar redraws or a callback reads metrics.
class MetricStore {
 public:
  struct EpochEntry {
    // The running reduction of the values logged so far, a float64 tensor on their device:
    // kMean the weighted sum (Lightning's _ResultMetric keeps the same), kSum the sum, kMax /
    // kMin the extreme. No per-step tensor is kept: an epoch of a million steps holds what one
    // step holds.
    at::Tensor acc;
    double weight = 0;  // kMean: the total weight (batch sizes)
    int64_t count = 0;  // values logged
    Reduce reduce = Reduce::kMean;
    bool prog_bar = false;
    bool logger = true;
    bool sync_dist = false;
  };
  struct StepEntry {
    at::Tensor value;
    bool prog_bar = false;
    bool logger = true;
  };

  void add_step(const std::string& key, const at::Tensor& v, bool prog_bar, bool logger);
  // Folds `v` into the key's running reduction; ConfigError when the key was logged with
  // another reduce in this epoch (Lightning keeps a value per hook and name, and refuses other
  // arguments within one hook; volt keeps one per name, so mixing reductions is refused).
  void add_epoch(const std::string& key, const at::Tensor& v, int64_t weight, Reduce reduce,
                 bool prog_bar, bool logger, bool sync_dist = false);
  /// Reduces a tensor across processes (element-wise, kSum / kMax / kMin); identity for one.
  using CrossRankReduce = std::function<at::Tensor(const at::Tensor&, Reduce)>;
  // Reduces the epoch entries (weighted mean / sum / max / min) and clears them. Entries logged
  // with sync_dist are reduced over all ranks too (a weighted mean over every rank's values), in
  // key order, so every rank must have logged the same sync_dist keys.
  Metrics reduce_epoch(Metrics* prog_bar, Metrics* for_logger,
                       const CrossRankReduce& across_ranks = nullptr);
  // Host values of the latest step entries (logger=true ones when `for_logger`).
  Metrics step_values(bool only_logger, bool only_prog_bar) const;
  void clear_step() { step_.clear(); }
  void clear() {
    step_.clear();
    epoch_.clear();
  }
  bool has_step_values() const { return !step_.empty(); }
  // Writes the epoch entries. With `across_ranks` (a collective: every rank saves, as every
  // rank writes a checkpoint's state), a sync_dist entry is written as the reduction of every
  // rank's values so far, one value: only rank 0's file is kept, and a resumed epoch reduced its
  // values with every rank's (rank 0's counted once per rank, the others' not at all).
  void save(torch::serialize::OutputArchive& ar,
            const CrossRankReduce& across_ranks = nullptr) const;
  // Reads them back; without `sync_dist_entries` (every rank but 0) the sync_dist entries are
  // left out, rank 0's holding them for every rank.
  void load(torch::serialize::InputArchive& ar, bool sync_dist_entries = true);

 private:
  std::map<std::string, StepEntry> step_;
  std::map<std::string, EpochEntry> epoch_;
};

}  // namespace detail
}  // namespace volt
