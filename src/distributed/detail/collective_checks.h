#pragma once
// What a collective's operand and reduction must be, checked before anything is sent: by
// ProcessGroup for every collective, and by Fabric before its one-process shortcut, so that one
// process refuses what several would (an integer kMean worked at one process only).

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include "volt/core/check.h"
#include "volt/core/types.h"

namespace volt {
namespace detail {

/// A defined, dense, non-quantized tensor (a ValueError up front, not a backend error that would
/// leave the group broken). `tag` is the component ("[ProcessGroup]"), `where` what follows the
/// operand's description (" at index 2").
inline void check_collective_operand(const at::Tensor& t, const char* tag, const char* op,
                                     const char* where = "") {
  VOLT_CHECK(t.defined(), ValueError, tag, " ", op, " got an undefined tensor", where,
             "; pass a tensor (at::empty for a receive buffer).");
  VOLT_CHECK(t.layout() == at::kStrided && !at::isQIntType(t.scalar_type()), ValueError, tag, " ",
             op, " takes dense tensors, got a ", t.layout(), " ", t.scalar_type(), " one", where,
             "; convert it first (to_dense(), dequantize()).");
}

/// Reducing `op` over `dtype` means something: no mean of integers, no order of complex numbers.
inline void check_reduction(c10::ScalarType dtype, Reduce op, const char* tag, const char* name) {
  VOLT_CHECK(op != Reduce::kMean || at::isFloatingType(dtype) || at::isComplexType(dtype),
             ValueError, tag, " ", name, " with kMean needs a floating tensor, got ", dtype,
             "; convert it first or use kSum.");
  VOLT_CHECK(!at::isComplexType(dtype) || op == Reduce::kSum || op == Reduce::kMean, ValueError,
             tag, " ", name, " of a ", dtype,
             " tensor takes kSum or kMean (complex numbers have no order); reduce its real and "
             "imaginary parts (at::view_as_real) yourself for anything else.");
}

}  // namespace detail
}  // namespace volt
