#pragma once
// Which live TensorParallelEngine holds a parameter split, for the components that keep copies
// of a module's parameters beside it without holding the strategy (the weight-averaging
// callbacks: their averages are shards under tensor parallelism, saved whole and loaded by
// slicing, as the strategy saves the weights themselves).

#include <ATen/core/Tensor.h>

namespace volt {

class TensorParallelEngine;

namespace detail {

/// The engine holding `param` split now (nullptr: whole, or under no engine).
const TensorParallelEngine* engine_splitting(const at::Tensor& param);

}  // namespace detail
}  // namespace volt
