#pragma once
/// SyncBatchNorm: batch normalization over the whole data-parallel batch, as PyTorch's
/// `torch.nn.SyncBatchNorm` and Lightning's `Trainer(sync_batchnorm=True)`, on a C++ model as it
/// is. With DDP each rank sees only its share of the global batch; a BatchNorm layer then
/// normalizes by the statistics of those few samples, and training differs from one process on
/// the global batch. While a Scope lives, every training-mode forward of the model's
/// BatchNorm1d/2d/3d layers normalizes with the mean and variance of all ranks' inputs (one
/// all-gather of each rank's per-channel mean, squared deviations and count per layer), updates
/// the running statistics with them (the same on every rank), and its backward all-reduces the
/// gradient of those statistics, so the weights equal single-process training on the global
/// batch.
///
/// libtorch has no module to swap in (and a C++ model calls its layers through typed members,
/// so swapping would not reach them): the layers' `batch_norm` calls are recognised at the
/// dispatcher by their running_mean (or, without running statistics, their weight) and computed
/// there. Layers in evaluation mode are left alone (as PyTorch's). Layers of other
/// types that call `torch::batch_norm` themselves are not synchronised (instance_norm, for
/// instance, which runs batch_norm on copies).
///
///   auto sync = volt::SyncBatchNorm(model, group);  // after the model is on its device
///   { volt::SyncBatchNorm::Scope scope(sync); loss = training_step(...); }
///   loss.backward();                                // the statistics' gradients all-reduced
///
/// The Trainer does this for DdpStrategy with `TrainerOptions::sync_batchnorm(true)`.

#include <memory>
#include <string>
#include <vector>

namespace torch {
namespace nn {
class Module;
}  // namespace nn
}  // namespace torch

namespace volt {

class ProcessGroup;

class SyncBatchNorm {
 public:
  /// Finds the BatchNorm1d/2d/3d layers in `root` (which must stay alive and on its device
  /// while this object lives) and synchronises them over `group` (every rank of it constructs
  /// one over the same model). A model without any is warned about once. Throws ConfigError for
  /// a null group.
  SyncBatchNorm(torch::nn::Module& root, std::shared_ptr<ProcessGroup> group);
  ~SyncBatchNorm();
  SyncBatchNorm(const SyncBatchNorm&) = delete;
  SyncBatchNorm& operator=(const SyncBatchNorm&) = delete;

  /// The synchronised layers' paths in the model, e.g. "features.1" ("" for the root itself).
  std::vector<std::string> layers() const;

  /// While a Scope lives on this thread, the layers' training-mode forwards use the group's
  /// statistics (their backward does its all-reduce wherever it runs). Collective: every rank
  /// must run the same layers in the same order inside its scope.
  class Scope {
   public:
    explicit Scope(SyncBatchNorm& sync);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
  };

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace volt
