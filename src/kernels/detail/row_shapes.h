#pragma once
// The shape rules of FusedElementwise's row kernels, in one place: FusedElementwise applies them
// to the tensors it gets, TracedFunction to the shapes a trace recorded, and the two must agree
// on which values come back with a last size of 1.

#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <vector>

namespace volt {
namespace detail {

/// Row kernels run rows of at most this many values kLanes at a time, one row per vector lane
/// (generate_row_body); longer rows one at a time, vectorised along the row. TracedFunction
/// reads it to know which loop a softmax over its rows would get.
constexpr int64_t kLaneCols = 31;
constexpr int64_t kLanes = 16;

/// The shape of a per-row value: `shape` with a last size of 1 (unchanged without dimensions).
inline std::vector<int64_t> row_shape(std::vector<int64_t> shape) {
  if (!shape.empty()) shape.back() = 1;
  return shape;
}

/// Whether a tensor of `sizes` is the same along the row (the last dimension) wherever it is
/// broadcast: no dimensions, or a last size of 1.
inline bool per_row_sizes(c10::IntArrayRef sizes) {
  return sizes.empty() || sizes.back() == 1;
}

}  // namespace detail
}  // namespace volt
