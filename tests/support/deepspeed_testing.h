#pragma once
// DeepSpeedStrategy construction for option tests (tests/strategies/deepspeed*_test.cpp): a
// strategy of 2 devices on the CPU accelerator with 32-true precision, and the check that some
// options are refused with a typed error naming the problem.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "volt/strategies/deepspeed.h"
#include "volt/volt.h"

namespace volt_test {

inline std::shared_ptr<volt::DeepSpeedStrategy> make_deepspeed(
    const volt::DeepSpeedStrategyOptions& o) {
  return std::make_shared<volt::DeepSpeedStrategy>(o, std::make_shared<volt::CpuAccelerator>(),
                                                   volt::registry().precisions.create("32-true"),
                                                   2);
}

template <typename E>
void expect_deepspeed_error(const volt::DeepSpeedStrategyOptions& o, const std::string& phrase) {
  try {
    make_deepspeed(o);
    FAIL() << "no error for " << phrase;
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(phrase), std::string::npos) << e.what();
  }
}

}  // namespace volt_test
