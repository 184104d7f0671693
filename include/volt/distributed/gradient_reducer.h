#pragma once
/// GradientReducer: averages gradients across a ProcessGroup during backward with c10d's Reducer
/// (the engine of PyTorch's DistributedDataParallel): gradient buckets filled in backward order,
/// all-reduce overlapped with backward, gradient_as_bucket_view, static_graph, unused-parameter
/// detection, and no_sync accumulation.

#include <ATen/Tensor.h>
#include <torch/arg.h>

#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "volt/distributed/process_group.h"

namespace volt {

struct GradientReducerOptions {
  /// Gradient bucket size in MiB; each bucket is one all-reduce (the first holds at most 1 MiB,
  /// as in DDP). Default: 25.
  TORCH_ARG(double, bucket_cap_mb) = 25.0;
  /// Make each parameter's .grad a view into its bucket: no copy in or out, one buffer less.
  /// Default: false.
  TORCH_ARG(bool, gradient_as_bucket_view) = false;
  /// Walk the autograd graph from the loss each step to find parameters without a gradient (they
  /// count as zero); needed when the set of used parameters varies. Default: false.
  TORCH_ARG(bool, find_unused_parameters) = false;
  /// The set of used parameters and the gradient order never change: after the first step no
  /// search is needed and a parameter used twice is reduced once. Default: false.
  TORCH_ARG(bool, static_graph) = false;
};

std::ostream& operator<<(std::ostream& os, const GradientReducerOptions& o);

/// Averages the gradients of `parameters` over the ranks of a ProcessGroup.
///
/// Per step: forward on this rank's batch, then `backward(loss)`: gradients come out as the
/// mean over ranks of each rank's gradient. With sync off (no_sync), backward only accumulates
/// this rank's gradients; the next backward with sync on reduces the accumulated sum, so k
/// micro-batches cost one all-reduce. Every rank must construct it with the same parameters in
/// the same order (checked: ConfigError) and call backward the same number of times.
/// Parameters are not broadcast: start from identical weights (ProcessGroup::broadcast_).
class GradientReducer {
 public:
  /// `parameters` may repeat a tensor (tied weights: reduced once) and hold tensors that need no
  /// gradient (skipped); `names` (same length, optional) appear in errors.
  GradientReducer(const std::vector<at::Tensor>& parameters, std::shared_ptr<ProcessGroup> group,
                  GradientReducerOptions options = {}, const std::vector<std::string>& names = {});
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  /// Runs `run_backward` (default: loss.backward()) with the all-reduce armed when sync() is on.
  /// Throws DistributedError naming the failure (and the lost rank when reported) when a peer
  /// dies or hangs; the reducer is then unusable.
  void backward(const at::Tensor& loss, const std::function<void()>& run_backward = {});

  /// Off: backward accumulates locally without communication (DDP's no_sync). Default: on.
  void set_sync(bool sync) { sync_ = sync; }
  bool sync() const { return sync_; }

  /// The distinct parameters reduced, in bucket-assignment order of the caller's list.
  const std::vector<at::Tensor>& parameters() const { return params_; }
  /// The flat bucket tensors the all-reduce works on (with gradient_as_bucket_view each .grad
  /// is a view into one of them).
  std::vector<at::Tensor> bucket_buffers() const;

  const GradientReducerOptions& options() const { return options_; }

 private:
  struct Impl;
  std::shared_ptr<ProcessGroup> group_;
  GradientReducerOptions options_;
  std::vector<at::Tensor> params_;
  bool sync_ = true;
  std::unique_ptr<Impl> impl_;
};

/// RAII no_sync: turns sync off for its lifetime, restoring the previous setting after.
class NoSyncGuard {
 public:
  explicit NoSyncGuard(GradientReducer& reducer) : reducer_(reducer), prev_(reducer.sync()) {
    reducer_.set_sync(false);
  }
  ~NoSyncGuard() { reducer_.set_sync(prev_); }
  NoSyncGuard(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(const NoSyncGuard&) = delete;

 private:
  GradientReducer& reducer_;
  bool prev_;
};

}  // namespace volt
