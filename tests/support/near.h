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

/// For results summed from larger terms that cancel (erf(x) / exp(-|y|) + ... can be 20 where the
/// sum is 0.1): a few ulp of the largest result, |a - b| <= 1e-6 + 1e-5 max|b|, same sizes. An op
/// computed wrongly still misses by far more (GELU's tanh form against its exact one: 5e-4).
inline ::testing::AssertionResult near_in_scale(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes()) {
    return ::testing::AssertionFailure() << "sizes " << a.sizes() << " vs " << b.sizes();
  }
  const auto bd = b.to(at::kDouble);
  const double scale = bd.numel() ? bd.abs().max().item<double>() : 0.0;
  const double diff = a.numel() ? (a.to(at::kDouble) - bd).abs().max().item<double>() : 0.0;
  if (diff <= 1e-6 + 1e-5 * scale) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "max |a - b| = " << diff << " exceeds 1e-6 + 1e-5 * " << scale << " (the largest |b|)";
}

}  // namespace volt_test
