#include "volt/callbacks/prediction_writer.h"

#include <c10/util/Type.h>
#include <torch/torch.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <ostream>
#include <system_error>
#include <typeinfo>

#include "callbacks/detail/prediction_tensors.h"
#include "volt/core/check.h"
#include "volt/core/errors.h"
#include "volt/core/log.h"
#include "volt/io/safetensors.h"

namespace volt {
namespace fs = std::filesystem;

namespace {

constexpr const char* kWriter = "[SafetensorsPredictionWriter] ";

at::Tensor index_tensor(const std::vector<int64_t>& indices) {
  return torch::tensor(indices, torch::kInt64);
}

// The file names of loader `dataloader_idx` of a pass over `loaders`: with several, prefixed.
std::string prefix(const RunContext& run, int64_t dataloader_idx) {
  if (run.state().num_dataloaders <= 1) return "";
  return "dataloader" + std::to_string(dataloader_idx) + "_";
}

std::string rank_file(const std::string& dir, const std::string& stem, int64_t rank) {
  return (fs::path(dir) / (stem + "_rank" + std::to_string(rank) + ".safetensors")).string();
}

// Rank 0's merge of the ranks' epoch files into one in data set order, each index once (the
// distributed sampler pads a shard with indices from the data set's start, and ranks that all
// predicted the same data repeat every index). Returns false, leaving the rank files, when a
// file holds per-batch tensors or the ranks' rows do not concatenate.
bool merge_rank_files(const std::string& dir, const std::string& stem, int64_t world_size) {
  std::vector<at::Tensor> preds, indices;
  for (int64_t r = 0; r < world_size; ++r) {
    const std::string path = rank_file(dir, stem, r);
    VOLT_CHECK(fs::exists(path), CheckpointError, kWriter, "rank ", r, " wrote '", path,
               "' but global rank 0 does not see it; with several nodes output_dir must be a "
               "folder every node shares, or use write_interval=batch.");
    SafetensorsFile f = load_safetensors(path);
    auto idx = f.tensors.find("indices");
    if (idx == f.tensors.end()) return false;  // per-batch tensors
    auto p = f.tensors.find("predictions");
    if (p == f.tensors.end()) {
      if (idx->second.numel() != 0) return false;
      continue;  // a rank without batches
    }
    if (!preds.empty() && (p->second.scalar_type() != preds.front().scalar_type() ||
                           p->second.sizes().slice(1) != preds.front().sizes().slice(1))) {
      return false;
    }
    preds.push_back(p->second);
    indices.push_back(idx->second);
  }
  std::map<std::string, at::Tensor> out;
  if (preds.empty()) {
    out["indices"] = torch::empty({0}, torch::kInt64);
  } else {
    at::Tensor all = torch::cat(indices, 0);
    // A stable sort keeps the lowest rank's row of a repeated index first.
    auto sorted = all.sort(/*stable=*/true, /*dim=*/0, /*descending=*/false);
    at::Tensor keys = std::get<0>(sorted), order = std::get<1>(sorted);
    at::Tensor keep = torch::ones({keys.size(0)}, torch::kBool);
    if (keys.size(0) > 1) keep.slice(0, 1).copy_(keys.slice(0, 1) != keys.slice(0, 0, -1));
    out["indices"] = keys.masked_select(keep);
    out["predictions"] = torch::cat(preds, 0).index_select(0, order.masked_select(keep));
  }
  save_safetensors(out, (fs::path(dir) / (stem + ".safetensors")).string());
  for (int64_t r = 0; r < world_size; ++r) {
    std::error_code ec;
    fs::remove(rank_file(dir, stem, r), ec);  // the merged file holds them; a leftover is harmless
  }
  return true;
}

// Runs `step` on this rank and agrees with the others on whether it worked everywhere: a
// failure here is rethrown, one elsewhere becomes a CheckpointError saying `elsewhere`.
void agree(RunContext& run, const std::string& elsewhere, const std::function<void()>& step) {
  std::exception_ptr error;
  try {
    step();
  } catch (...) {
    error = std::current_exception();
  }
  if (run.reduce_boolean_decision(error == nullptr, /*all=*/true)) return;
  if (error) std::rethrow_exception(error);
  VOLT_CHECK(false, CheckpointError, kWriter, elsewhere, "; its error says why.");
}

}  // namespace

const char* to_string(WriteInterval interval) {
  switch (interval) {
    case WriteInterval::kBatch: return "batch";
    case WriteInterval::kEpoch: return "epoch";
    case WriteInterval::kBatchAndEpoch: return "batch_and_epoch";
  }
  return "?";
}

WriteInterval parse_write_interval(const std::string& name) {
  if (name == "batch") return WriteInterval::kBatch;
  if (name == "epoch") return WriteInterval::kEpoch;
  if (name == "batch_and_epoch") return WriteInterval::kBatchAndEpoch;
  VOLT_CHECK(false, ConfigError, "[PredictionWriter] write_interval '", name,
             "' is not one of batch, epoch, batch_and_epoch.");
  return WriteInterval::kBatch;
}

// ---------------------------------------------------------------- PredictionWriter

PredictionWriter::PredictionWriter(WriteInterval write_interval) : interval_(write_interval) {}

std::string PredictionWriter::state_key() const {
  // The class's name, as Lightning's default state_key, so two writers of different classes
  // never share a key.
  return c10::demangle(typeid(*this).name()) + "{write_interval=" + to_string(interval_) + "}";
}

void PredictionWriter::write_on_batch_end(RunContext&, Module&, const at::Tensor&,
                                          const std::vector<int64_t>&, const Batch&, int64_t,
                                          int64_t) {
  VOLT_CHECK(false, ConfigError, "[PredictionWriter] write_interval=", to_string(interval_),
             " calls write_on_batch_end after every batch; override it in your "
             "PredictionWriter, or use write_interval epoch.");
}

void PredictionWriter::write_on_epoch_end(RunContext&, Module&, const std::vector<at::Tensor>&,
                                          const std::vector<std::vector<int64_t>>&, int64_t) {
  VOLT_CHECK(false, ConfigError, "[PredictionWriter] write_interval=", to_string(interval_),
             " calls write_on_epoch_end when the pass ends; override it in your "
             "PredictionWriter, or use write_interval batch.");
}

void PredictionWriter::on_predict_epoch_start(RunContext&, Module&) {
  predictions_.clear();
  indices_.clear();
}

void PredictionWriter::on_predict_batch_end(RunContext& run, Module& module,
                                            const at::Tensor& prediction, const Batch& batch,
                                            int64_t batch_idx) {
  const int64_t loader = run.state().dataloader_idx;
  if (interval_ != WriteInterval::kEpoch) {
    write_on_batch_end(run, module, prediction, run.predict_batch_indices(), batch, batch_idx,
                       loader);
  }
  if (interval_ != WriteInterval::kBatch) {
    const size_t d = static_cast<size_t>(loader);
    if (predictions_.size() <= d) {
      predictions_.resize(d + 1);
      indices_.resize(d + 1);
    }
    // On the host, as Lightning keeps an epoch writer's predictions: a whole data set's would
    // otherwise hold the device's memory until the epoch's end.
    predictions_[d].push_back(prediction.defined() ? prediction.cpu() : prediction);
    indices_[d].push_back(run.predict_batch_indices());
  }
}

void PredictionWriter::on_predict_epoch_end(RunContext& run, Module& module) {
  if (interval_ == WriteInterval::kBatch) return;
  auto predictions = std::move(predictions_);
  auto indices = std::move(indices_);
  predictions_.clear();
  indices_.clear();
  // Every loader is written, one without batches too, as Lightning's writer gets every loader's
  // list (a pass where no loader has a batch runs no hook at all).
  const size_t loaders =
      std::max(predictions.size(), static_cast<size_t>(run.state().num_dataloaders));
  predictions.resize(loaders);
  indices.resize(loaders);
  for (size_t d = 0; d < loaders; ++d) {
    write_on_epoch_end(run, module, predictions[d], indices[d], static_cast<int64_t>(d));
    predictions[d].clear();  // written: its memory goes before the next loader's write
  }
}

// ---------------------------------------------------------------- SafetensorsPredictionWriter

std::ostream& operator<<(std::ostream& os, const SafetensorsPredictionWriterOptions& o) {
  return os << "SafetensorsPredictionWriterOptions(output_dir=\"" << o.output_dir()
            << "\", write_interval=" << to_string(o.write_interval()) << ")";
}

SafetensorsPredictionWriter::SafetensorsPredictionWriter(SafetensorsPredictionWriterOptions options)
    : PredictionWriter(options.write_interval()), options_(std::move(options)) {}

std::string SafetensorsPredictionWriter::state_key() const {
  return "SafetensorsPredictionWriter{output_dir=" + options_.output_dir() +
         ", write_interval=" + to_string(options_.write_interval()) + "}";
}

void SafetensorsPredictionWriter::on_predict_start(RunContext& run, Module&) {
  dir_ = options_.output_dir().empty() ? (fs::path(run.log_dir()) / "predictions").string()
                                       : options_.output_dir();
  std::error_code ec;
  fs::create_directories(dir_, ec);
  VOLT_CHECK(!ec && fs::is_directory(dir_), ConfigError, kWriter, "cannot create output_dir '",
             dir_, "' (", ec ? ec.message() : "a file of that name exists",
             "); choose a folder it may write.");
}

void SafetensorsPredictionWriter::write_on_batch_end(RunContext& run, Module&,
                                                     const at::Tensor& prediction,
                                                     const std::vector<int64_t>& batch_indices,
                                                     const Batch&, int64_t batch_idx,
                                                     int64_t dataloader_idx) {
  std::string name = prefix(run, dataloader_idx) + detail::numbered("batch_", batch_idx);
  if (run.world_size() > 1) name += "_rank" + std::to_string(run.global_rank());
  std::map<std::string, at::Tensor> tensors{{"indices", index_tensor(batch_indices)}};
  if (prediction.defined()) tensors["predictions"] = prediction;
  save_safetensors(tensors, (fs::path(dir_) / (name + ".safetensors")).string());
}

void SafetensorsPredictionWriter::write_on_epoch_end(
    RunContext& run, Module&, const std::vector<at::Tensor>& predictions,
    const std::vector<std::vector<int64_t>>& batch_indices, int64_t dataloader_idx) {
  const std::map<std::string, at::Tensor> tensors =
      detail::prediction_tensors(predictions, &batch_indices);
  const std::string stem = prefix(run, dataloader_idx) + "predictions";
  if (run.world_size() == 1) {
    save_safetensors(tensors, (fs::path(dir_) / (stem + ".safetensors")).string());
    return;
  }
  // Every rank writes its file; all learn whether every rank could (a failure on one rank must
  // not leave the others waiting), then rank 0 merges and all learn whether that worked.
  bool merged = false;
  agree(run, "another rank could not write its predictions file to '" + dir_ + "'",
        [&] { save_safetensors(tensors, rank_file(dir_, stem, run.global_rank())); });
  agree(run, "global rank 0 could not merge the ranks' files in '" + dir_ + "'", [&] {
    if (run.is_global_zero()) merged = merge_rank_files(dir_, stem, run.world_size());
  });
  if (run.is_global_zero()) {
    log_info("SafetensorsPredictionWriter",
             merged ? "predictions of " + std::to_string(run.world_size()) + " ranks merged into " +
                          dir_ + "/" + stem + ".safetensors"
                    : "predictions are not rows of their batches (or differ in dtype or shape "
                      "between ranks): each rank's are in " +
                          dir_ + "/" + stem + "_rank<R>.safetensors");
  }
}

}  // namespace volt
