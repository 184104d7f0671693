// FlopCounter and measure_flops against torch.utils.flop_counter's formulas worked by hand:
// matrix products, convolutions (plain and transposed) and their backward, nesting, threads and
// the meta device.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <thread>

#include <volt/profiler/flops.h>

#include "volt/core/errors.h"

namespace {

TEST(FlopCounter, CountsATwoLayerMlpForwardAndBackwardByTorchsFormulas) {
  torch::manual_seed(0);
  torch::nn::Linear fc1(32, 16), fc2(16, 4);
  const auto x = torch::randn({8, 32});  // data: no gradient of its own
  volt::FlopCounter counter;
  fc2(torch::relu(fc1(x))).sum().backward();
  // Forward: addmm 2*8*32*16 + 2*8*16*4. Backward: fc2's input and weight gradients
  // (2*8*4*16 each) and fc1's weight gradient only (2*8*16*32; x needs none), all aten::mm.
  const auto counts = counter.flop_counts();
  EXPECT_EQ(counts.at("aten::addmm"), 8192 + 1024);
  EXPECT_EQ(counts.at("aten::mm"), 1024 + 1024 + 8192);
  EXPECT_EQ(counts.size(), 2u);
  EXPECT_EQ(counter.total_flops(), 9216 + 10240);
}

TEST(FlopCounter, CountsBatchedProducts) {
  const auto a = torch::randn({3, 4, 5}), b = torch::randn({3, 5, 6});
  const auto c = torch::randn({3, 4, 6});
  volt::FlopCounter counter;
  at::bmm(a, b);
  at::baddbmm(c, a, b);
  at::matmul(a, b);                                    // reaches aten::bmm
  at::mm(torch::randn({2, 7}), torch::randn({7, 3}));  // 2*2*3*7
  const auto counts = counter.flop_counts();
  EXPECT_EQ(counts.at("aten::bmm"), 2 * 720);  // 2*3*4*6*5 each
  EXPECT_EQ(counts.at("aten::baddbmm"), 720);
  EXPECT_EQ(counts.at("aten::mm"), 84);
}

TEST(FlopCounter, CountsAConvolutionOnceAndItsBackwardsTwoProducts) {
  torch::manual_seed(0);
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(3, 4, 3).padding(1));
  const auto x = torch::randn({2, 3, 8, 8}).requires_grad_(true);
  // 2 * 64 output points * 9 filter points * batch 2 * 4 out * 3 in channels.
  const int64_t forward = 2 * 64 * 9 * 2 * 4 * 3;
  {
    volt::FlopCounter counter;
    conv(x).sum().backward();
    const auto counts = counter.flop_counts();
    // aten::convolution counts; what it runs inside (aten::_convolution, the CPU kernel) not.
    EXPECT_EQ(counts.at("aten::convolution"), forward);
    // The input's gradient (a transposed convolution over the input's points) and the
    // weight's (a convolution of the input by the output's gradient) cost as much each.
    EXPECT_EQ(counts.at("aten::convolution_backward"), 2 * forward);
    EXPECT_EQ(counter.total_flops(), 3 * forward);
  }
  {
    volt::FlopCounter counter;  // the data needs no gradient: the weight's product alone
    conv(x.detach()).sum().backward();
    EXPECT_EQ(counter.flop_counts().at("aten::convolution_backward"), forward);
  }
  {
    // Transposed: every input point (5x5) convolves the 3x3 filter, weight (4 in, 3 out).
    torch::nn::ConvTranspose2d up(torch::nn::ConvTranspose2dOptions(4, 3, 3));
    volt::FlopCounter counter;
    torch::NoGradGuard no_grad;
    EXPECT_EQ(up(torch::randn({2, 4, 5, 5})).sizes(), (at::IntArrayRef{2, 3, 7, 7}));
    EXPECT_EQ(counter.total_flops(), 2 * 25 * 9 * 2 * 4 * 3);
  }
}

TEST(FlopCounter, CountsOnlyItsThreadAndOnlyWhileItLives) {
  const auto a = torch::randn({4, 4});
  int64_t total = 0;
  {
    volt::FlopCounter counter;
    std::thread([&] { at::mm(a, a); }).join();  // another thread's op
    EXPECT_EQ(counter.total_flops(), 0);
    at::mm(a, a);
    total = counter.total_flops();
    try {
      volt::FlopCounter second;
      FAIL() << "expected ValueError";
    } catch (const volt::ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("another FlopCounter is counting"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(total, 2 * 4 * 4 * 4);
  at::mm(a, a);             // no counter
  volt::FlopCounter after;  // the first one's end freed the slot and its callback
  at::mm(a, a);
  EXPECT_EQ(after.total_flops(), 2 * 4 * 4 * 4);
}

TEST(MeasureFlops, IsThreeTimesTheForwardForALinearLayerWhoseInputNeedsAGradient) {
  torch::manual_seed(0);
  torch::nn::Linear fc(64, 32);
  const auto x = torch::randn({16, 64}).requires_grad_(true);
  const int64_t forward = volt::measure_flops([&] { return fc(x); });
  EXPECT_EQ(forward, 2 * 16 * 64 * 32);
  const int64_t both =
      volt::measure_flops([&] { return fc(x); }, [](const at::Tensor& y) { return y.sum(); });
  EXPECT_EQ(both, 3 * forward);
}

TEST(MeasureFlops, CountsMetaTensorsWithoutComputing) {
  // A layer's weights made on the meta device (libtorch 1.13's Module::to cannot move
  // parameters there): shapes only, no memory, no arithmetic.
  const auto meta = torch::device(torch::kMeta);
  const auto w = torch::empty({512, 1024}, meta), b = torch::empty({512}, meta);
  const auto x = torch::empty({256, 1024}, meta);
  const int64_t flops = volt::measure_flops([&] { return at::linear(x, w, b); });
  EXPECT_EQ(flops, int64_t{2} * 256 * 1024 * 512);
}

TEST(MeasureFlops, RefusesAnEmptyForwardAndALossWithoutGradient) {
  try {
    volt::measure_flops(nullptr);
    FAIL() << "expected ValueError";
  } catch (const volt::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("forward_fn is empty"), std::string::npos) << e.what();
  }
  torch::nn::Linear fc(4, 2);
  try {
    volt::measure_flops(
        [&] {
          return fc(torch::randn({3, 4}));
        },
        [](const at::Tensor& y) { return y.detach().sum(); });
    FAIL() << "expected ValueError";
  } catch (const volt::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("does not require grad"), std::string::npos) << e.what();
  }
}

}  // namespace
