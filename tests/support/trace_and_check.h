#pragma once
// The first call of a TracedFunction for a signature traces its function and the second runs it
// again to check the trace (TraceOptions::check_calls, 1 by default); both run the function
// itself, so a test that means to compare a replay calls this first.

#include <gtest/gtest.h>

#include <vector>

#include "volt/kernels/traced_function.h"

namespace volt_test {

inline void trace_and_check(const volt::TracedFunction& f, const std::vector<at::Tensor>& in) {
  const int64_t checks = f.stats().checks;
  f(in);
  f(in);
  ASSERT_EQ(f.stats().checks, checks + 1) << "the second call did not check the trace";
}

}  // namespace volt_test
