#pragma once
// The running average of a module's tensors that StochasticWeightAveraging and WeightAveraging
// keep: which tensors, the average beside them, and the moves between the two.

#include <ATen/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/Optional.h>
#include <torch/serialize/archive.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace volt {

class Module;
class PipelineImpl;
class RunContext;

namespace detail {

/// ConfigError (messages start with `tag`) under the deepspeed strategy: ZeRO shards the weights
/// and keeps its own fp32 masters, so an average of the module's tensors would be incomplete or
/// overwritten (Lightning refuses it too).
void refuse_sharded_weights(const RunContext& run, const char* tag);

class AveragedTensors {
 public:
  using Fn = std::function<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t)>;

  /// Follows `module`'s parameters, and with `buffers` its buffers too (those that are not
  /// floating point, e.g. BatchNorm's step count, are copied rather than averaged), each tensor
  /// once under its first name (a shared layer or tied weight has several). The average is kept
  /// on `device` (nullopt: beside each tensor). Forgets any previous average.
  void bind(Module& module, bool buffers, c10::optional<c10::Device> device);
  /// Adds the module's values: a copy the first time, then `fn(average, current, n)` or the
  /// equal-weight mean average + (current - average) / (n + 1).
  void update(const Fn& fn);
  /// Weights averaged so far.
  int64_t count() const { return count_; }
  /// The module's tensors take the average's values.
  void copy_to_module();
  /// The module's tensors and the average trade values (twice restores both). By copies, not by
  /// swapping storages: a parameter may alias a flat buffer (a fused optimizer's, a reducer's
  /// bucket view) that must keep seeing it.
  void swap();
  const std::vector<std::string>& names() const { return names_; }
  const std::vector<at::Tensor>& average() const { return average_; }
  /// Writes the average by name under `archive` (nothing before the first update). A
  /// distributed volt::Pipeline's entries come from the stages that train them, and the
  /// averages of tensor-parallel shards are joined whole (collective: every rank saves), so the
  /// archive holds the whole model's average in the single-process shapes.
  void save(torch::serialize::OutputArchive& archive) const;
  /// Reads what save() wrote, for adopt() once the module is bound.
  static std::map<std::string, at::Tensor> read(torch::serialize::InputArchive& archive);
  /// Takes `saved` (by name) as the average of `count` values; CheckpointError (tagged `tag`)
  /// unless it holds exactly the bound tensors with their shapes (a pipeline's freed weights:
  /// the shapes they had; their average stays freed too; a tensor-parallel shard: its whole
  /// shape, of which it takes its part).
  void adopt(const std::map<std::string, at::Tensor>& saved, int64_t count, const char* tag);

 private:
  std::vector<std::string> names_;
  std::vector<std::string>
      aliases_;                     // further names of followed tensors (old checkpoints hold them)
  std::vector<at::Tensor> module_;  // the module's own tensors (handles)
  std::vector<at::Tensor> average_;  // empty until the first update
  // The distributed pipelines in the module: each rank averages only its stage's weights.
  std::vector<std::shared_ptr<const PipelineImpl>> pipelines_;
  c10::optional<c10::Device> device_;
  int64_t count_ = 0;
};

}  // namespace detail
}  // namespace volt
