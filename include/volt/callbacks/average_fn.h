#pragma once
/// How StochasticWeightAveraging and WeightAveraging fold a new value into their average.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>

namespace volt {

/// averaged <- fn(averaged, current, number of weights averaged so far (>= 1)).
using AverageFn =
    std::function<at::Tensor(const at::Tensor& averaged, const at::Tensor& current, int64_t n)>;

}  // namespace volt
