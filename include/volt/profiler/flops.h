#pragma once
/// FLOP counting: Lightning's measure_flops and torch's FlopCounterMode, over libtorch's op
/// observer (at::RecordFunction) instead of a Python dispatch mode.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

namespace volt {

/// Counts the floating-point operations of the matrix products and convolutions that run on
/// the thread that made it (and in the autograd backward passes it starts) while it lives,
/// with torch's FlopCounterMode formulas: aten::mm and aten::addmm 2·m·n·k, aten::bmm and
/// aten::baddbmm 2·b·m·n·k, aten::convolution / aten::_convolution 2·batch·c_out·c_in·(output
/// points)·(filter points) (input points for a transposed one), aten::convolution_backward its
/// two products. Bias additions, element-wise ops and ops torch does not count count nothing.
/// An op reached inside a counted one (the matrix product a convolution runs) is not counted
/// again, as FlopCounterMode sees only the outermost. Tensors on any device, meta included,
/// count by their shapes. volt's own fused kernels (volt/kernels) count nothing.
///
/// One counter at a time in a process; destroy it on the thread that made it.
class FlopCounter {
 public:
  FlopCounter();
  ~FlopCounter();
  FlopCounter(const FlopCounter&) = delete;
  FlopCounter& operator=(const FlopCounter&) = delete;

  /// FLOPs counted so far.
  int64_t total_flops() const;
  /// FLOPs by op ("aten::mm"), only ops that counted some.
  std::map<std::string, int64_t> flop_counts() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The FLOPs of `forward_fn()` and, given `loss_fn`, of `loss_fn(forward_fn()).backward()` too
/// (Lightning's measure_flops): set ThroughputMonitorOptions::flops_per_batch from it. A model
/// on the meta device counts without computing (Lightning's advice), where its ops have meta
/// kernels.
int64_t measure_flops(const std::function<at::Tensor()>& forward_fn,
                      const std::function<at::Tensor(const at::Tensor&)>& loss_fn = nullptr);

}  // namespace volt
