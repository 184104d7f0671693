#pragma once
// The tolerance of the JIT tests for ops that are not exactly rounded (tanh, exp, erf, ...).

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace volt_test {

/// Within a few ulp of the result or of 1 (GELU's 1 + tanh cancels where tanh is near -1, so one
/// ulp of tanh is an absolute error there): |a - b| <= 1e-6 + 1e-5 |b| everywhere, same sizes.
inline ::testing::AssertionResult near(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes()) {
    return ::testing::AssertionFailure() << "sizes " << a.sizes() << " vs " << b.sizes();
  }
  const auto diff = (a.to(at::kDouble) - b.to(at::kDouble)).abs();
  const auto excess = diff - (1e-6 + 1e-5 * b.to(at::kDouble).abs());
  const double worst = excess.numel() ? excess.max().item<double>() : 0.0;
  if (worst <= 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max |a - b| exceeds 1e-6 + 1e-5 |b| by " << worst
                                       << " (max |a - b| = " << diff.max().item<double>() << ")";
}

}  // namespace volt_test
