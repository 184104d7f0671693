// Row reductions in FusedElementwise (row_sum, row_max, row_length, first_column) and their
// use by TracedFunction (softmax, log_softmax, layer_norm, sum/mean/amax over the last
// dimension): the compiled row loops against libtorch's own kernels and the composition, their
// gradients against autograd, the per-row outputs' shapes, NaN and ties, empty rows, and the
// partition rules that keep a traced group's shapes what the kernel returns.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <tuple>

#include "error_text.h"
#include "file_text.h"
#include "near.h"
#include "scoped_env.h"
#include "tiny.h"
#include "trace_and_check.h"
#include "volt/kernels/fused_elementwise.h"
#include "volt/kernels/kernel_cache.h"
#include "volt/kernels/traced_function.h"

namespace {

using namespace volt::jit;  // NOLINT: the expression language reads as maths
using volt::FusedElementwise;
using volt::FusedElementwiseOptions;
using volt_test::ScopedEnv;

struct RowReductions : ::testing::Test {
  // The cache writes in the background: let it finish before the folder is removed.
  ~RowReductions() override { volt::KernelCache::global().flush(); }
  volt_test::TempDir dir;
  ScopedEnv env{"VOLT_KERNEL_CACHE_CONFIG", dir.path + ",false,64"};
  // The counters are process-wide: tests compare against their values at the start.
  volt::jit::Stats before = volt::jit::stats();
  int64_t compiles() const { return volt::jit::stats().compiles - before.compiles; }
  int64_t fallbacks() const { return volt::jit::stats().fallbacks - before.fallbacks; }
};

// |a - b| <= atol + rtol |b|.
::testing::AssertionResult close(const at::Tensor& a, const at::Tensor& b, double atol,
                                 double rtol) {
  if (!a.sizes().equals(b.sizes())) {
    return ::testing::AssertionFailure() << "sizes " << a.sizes() << " vs " << b.sizes();
  }
  const auto diff = (a.to(at::kDouble) - b.to(at::kDouble)).abs();
  const double worst = (diff - (atol + rtol * b.to(at::kDouble).abs())).max().item<double>();
  if (worst <= 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max |a - b| = " << diff.max().item<double>();
}

Expr softmax_of(const Expr& x) {
  const Expr e = exp(x - row_max(x));
  return e / row_sum(e);
}

// LayerNorm over the last dimension as libtorch computes it: (x - mean) * rstd * w + b.
struct LayerNormExpr {
  Expr mean, rstd, y;
};
LayerNormExpr layer_norm_of(const Expr& x, const Expr& w, const Expr& b, double eps) {
  const Expr mean = row_sum(x) / row_length();
  const Expr d = x - mean;
  const Expr rstd = Expr(1.0) / sqrt(row_sum(d * d) / row_length() + eps);
  return {mean, rstd, d * rstd * w + b};
}

TEST_F(RowReductions, ASoftmaxAndALayerNormAreOneKernelEachAndMatchLibtorch) {
  torch::manual_seed(0);
  // 300 rows of 1000 with chunks of 7 rows: threads start at row boundaries.
  const auto x = torch::randn({3, 100, 1000}) * 4, w = torch::randn({1000}),
             b = torch::randn({1000});
  const auto opts = FusedElementwiseOptions().require_fused(true).grain_size(7000);
  FusedElementwise softmax("softmax", {softmax_of(input(0))}, opts);
  EXPECT_TRUE(softmax.by_rows());
  const auto got = softmax({x})[0];
  EXPECT_TRUE(close(got, torch::softmax(x, -1), 1e-8, 1e-5));
  EXPECT_TRUE(close(got, softmax.reference({x})[0], 1e-8, 1e-5));

  const auto ln = layer_norm_of(input(0), input(1), input(2), 1e-5);
  FusedElementwise layer_norm("layer_norm", {ln.y, ln.mean, ln.rstd}, opts);
  const auto out = layer_norm({x, w, b});
  EXPECT_TRUE(close(out[0], torch::layer_norm(x, {1000}, w, b, 1e-5), 1e-5, 1e-5));
  // Per-row outputs come back with a last size of 1, as keepdim reductions.
  EXPECT_EQ(out[1].sizes(), (std::vector<int64_t>{3, 100, 1}));
  EXPECT_TRUE(close(out[1], x.mean(-1, true), 1e-6, 1e-5));
  EXPECT_TRUE(close(out[2], torch::rsqrt(x.var(-1, false, true) + 1e-5), 1e-6, 1e-5));
  const auto ref = layer_norm.reference({x, w, b});
  for (size_t o = 0; o < out.size(); ++o) EXPECT_TRUE(close(out[o], ref[o], 1e-5, 1e-5)) << o;
  EXPECT_EQ(compiles(), 2);
  EXPECT_EQ(fallbacks(), 0);
}

TEST_F(RowReductions, SumsAreAtLeastAsAccurateAsLibtorchsOnLongRows) {
  torch::manual_seed(1);
  const auto x = torch::rand({4, 100000}) + 1000;  // large values with small differences
  FusedElementwise sum("long_sum", {row_sum(input(0))},
                       FusedElementwiseOptions().require_fused(true));
  const auto exact = x.to(at::kDouble).sum(-1, true);
  const double ours = (sum({x})[0].to(at::kDouble) - exact).abs().max().item<double>();
  const double torchs = (x.sum(-1, true).to(at::kDouble) - exact).abs().max().item<double>();
  // Accumulated in double: within the float rounding of the result itself.
  EXPECT_LE(ours, exact.abs().max().item<double>() * 6e-8);
  EXPECT_LE(ours, torchs + 1e-9) << "libtorch's error " << torchs;
}

TEST_F(RowReductions, GradientsMatchAutogradThroughLibtorchsOps) {
  torch::manual_seed(2);
  const auto rg = torch::requires_grad();
  auto x = torch::randn({37, 50}, rg), w = torch::randn({50}, rg), b = torch::randn({50}, rg);
  auto c = torch::randn({37, 1}, rg);  // a per-row input (a column)
  const auto opts = FusedElementwiseOptions().require_fused(true).grain_size(100);
  const auto ln = layer_norm_of(input(0), input(1), input(2), 1e-5);
  const Expr xs = input(0) * input(3);
  const Expr log_softmax = (xs - row_max(xs)) - log(row_sum(exp(xs - row_max(xs))));
  FusedElementwise k("row_grads",
                     {ln.y, softmax_of(input(0)) * input(3), log_softmax, ln.mean * input(3),
                      row_sum(input(0) * input(0)) + input(3)},
                     opts);
  const std::vector<at::Tensor> in{x, w, b, c};
  const auto got = k(in);
  ASSERT_EQ(got[0].grad_fn()->name(), "volt::FusedElementwiseBackward");
  EXPECT_EQ(got[3].sizes(), (std::vector<int64_t>{37, 1}));  // reads only per-row values
  EXPECT_EQ(got[4].sizes(), (std::vector<int64_t>{37, 1}));
  // The same with libtorch's own kernels, differentiated by autograd.
  const auto xsv = x * c;
  const std::vector<at::Tensor> want{torch::layer_norm(x, {50}, w, b, 1e-5),
                                     torch::softmax(x, -1) * c, torch::log_softmax(xsv, -1),
                                     x.mean(-1, true) * c, (x * x).sum(-1, true) + c};
  auto loss_of = [](const std::vector<at::Tensor>& outs) {
    torch::manual_seed(3);  // the same weights for both
    at::Tensor loss = torch::zeros({});
    for (const auto& o : outs) loss = loss + (o * torch::randn(o.sizes())).sum();
    return loss;
  };
  for (size_t o = 0; o < got.size(); ++o) EXPECT_TRUE(close(got[o], want[o], 1e-5, 1e-5)) << o;
  const auto g = torch::autograd::grad({loss_of(got)}, {x, w, b, c});
  const auto h = torch::autograd::grad({loss_of(want)}, {x, w, b, c});
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_EQ(g[i].sizes(), in[i].sizes()) << i;
    EXPECT_TRUE(close(g[i], h[i], 1e-4, 1e-4)) << i;
  }
  // Two kernels: the forward's variant that also writes the reductions (what a forward that
  // needs gradients runs; the plain forward is not built, nothing ran it), and the backward's,
  // which reads them.
  EXPECT_EQ(compiles(), 2);
  EXPECT_EQ(fallbacks(), 0);
}

TEST_F(RowReductions, MaximaPropagateNanAndSplitTheGradientBetweenTies) {
  const auto rg = torch::requires_grad();
  auto x = torch::tensor({{1.0f, 3.0f, 3.0f, 2.0f},
                          {NAN, 1.0f, 2.0f, 0.0f},
                          {-INFINITY, -INFINITY, -INFINITY, -INFINITY}},
                         rg);
  FusedElementwise k("maxima", {row_max(input(0)) * 2.0},
                     FusedElementwiseOptions().require_fused(true));
  const auto got = k({x})[0];
  const auto want = x.amax(-1, true) * 2;
  EXPECT_TRUE(torch::equal(got.isnan(), want.isnan()));
  EXPECT_TRUE(torch::equal(got.nan_to_num(7, 8, 9), want.nan_to_num(7, 8, 9)));
  const auto up = torch::tensor({{1.0f}, {1.0f}, {1.0f}});
  const auto g = torch::autograd::grad({got}, {x}, {up})[0];
  const auto h = torch::autograd::grad({want}, {x}, {up})[0];
  // Ties get half each; libtorch's formula gives a NaN row NaN everywhere, and so does ours.
  EXPECT_TRUE(torch::equal(g.isnan(), h.isnan())) << g << h;
  EXPECT_TRUE(torch::equal(g.nan_to_num(7), h.nan_to_num(7))) << g << h;
  EXPECT_EQ(g[0][1].item<float>(), 1.0f);
}

TEST_F(RowReductions, EmptyRowsRunTheCompositionAndZeroDimOutputsAreOneRow) {
  FusedElementwise k("empty_rows", {row_sum(input(0)) + input(0)});
  FusedElementwise strict("empty_rows", {row_sum(input(0)) + input(0)},
                          FusedElementwiseOptions().require_fused(true));
  const auto e = torch::randn({3, 0});
  EXPECT_NE(k.fused_unavailable_reason({e}).find("rows are empty"), std::string::npos);
  EXPECT_EQ(k({e})[0].sizes(), e.sizes());
  const auto msg = volt_test::error_of<volt::NotAvailable>([&] { strict({e}); });
  EXPECT_NE(msg.find("rows are empty"), std::string::npos) << msg;
  // No rows at all: nothing to compute, every output empty.
  EXPECT_EQ(strict({torch::randn({0, 4})})[0].sizes(), (std::vector<int64_t>{0, 4}));
  // A zero-dimensional output is one row of one element.
  const auto s = torch::tensor(2.5f);
  const auto out = strict({s})[0];
  EXPECT_EQ(out.dim(), 0);
  EXPECT_EQ(out.item<float>(), 5.0f);
  FusedElementwise len("len", {input(0) * row_length(), first_column(input(0))},
                       FusedElementwiseOptions().require_fused(true));
  const auto x = torch::ones({2, 3});
  const auto got = len({x});
  EXPECT_TRUE(torch::equal(got[0], torch::full({2, 3}, 3.0f)));
  EXPECT_TRUE(torch::equal(got[1], torch::tensor({{1.0f, 0.0f, 0.0f}, {1.0f, 0.0f, 0.0f}})));
  const auto ref = len.reference({x});
  for (size_t o = 0; o < got.size(); ++o) EXPECT_TRUE(torch::equal(got[o], ref[o])) << o;
}

TEST_F(RowReductions, AReductionOfAPerRowValueSumsItOncePerColumn) {
  // row_sum of a column input is row length × the value, in both paths.
  const auto c = torch::tensor({{1.0f}, {2.0f}}), x = torch::zeros({2, 5});
  FusedElementwise k("sum_of_column", {row_sum(input(1)) + input(0) * 0.0},
                     FusedElementwiseOptions().require_fused(true));
  const auto got = k({x, c})[0];
  EXPECT_TRUE(torch::equal(got, torch::tensor({{5.0f}, {10.0f}}).expand({2, 5}))) << got;
  EXPECT_TRUE(torch::equal(got, k.reference({x, c})[0]));
}

TEST_F(RowReductions, TheSourceHasOnePassPerLevelOfReductions) {
  const auto ln = layer_norm_of(input(0), input(1), input(2), 1e-5);
  FusedElementwise k("src_rows", {ln.y});
  const auto s = k.source({torch::randn({4, 8}), torch::randn({8}), torch::randn({8})});
  // The mean's pass, the variance's pass (it reads the mean), the output's pass: in the row
  // loop, and in the lane loop (short rows), which also transposes the input in and the output
  // out.
  const size_t row_loop = s.find("for (; r < r_end; ++r)");
  ASSERT_NE(row_loop, std::string::npos) << s;
  auto loops = [&](size_t from, size_t to) {
    size_t n = 0;
    for (size_t at = s.find("for (int64_t j", from); at < to;
         at = s.find("for (int64_t j", at + 1)) {
      ++n;
    }
    return n;
  };
  EXPECT_EQ(loops(row_loop, std::string::npos), 3u) << s;
  EXPECT_EQ(loops(0, row_loop), 5u) << s;
  EXPECT_NE(s.find("reduction(+:"), std::string::npos) << s;
  EXPECT_NE(s.find("double a"), std::string::npos) << s;  // sums accumulate in double
}

TEST_F(RowReductions, AValueSeveralPassesNeedIsComputedOnceIfItIsTranscendental) {
  // softmax: exp(x - max) is summed in the second pass and divided in the last; it is stored
  // in a scratch row by the first and read by the second. x - max (cheap) is not stored.
  FusedElementwise k("src_softmax", {softmax_of(input(0))});
  const auto s = k.source({torch::randn({4, 8})});
  size_t exps = 0;
  for (size_t at = s.find("= expf("); at != std::string::npos; at = s.find("= expf(", at + 1)) {
    ++exps;
  }
  EXPECT_EQ(exps, 1u) << s;
  EXPECT_NE(s.find("m0[j] = "), std::string::npos) << s;
  EXPECT_NE(s.find(" = m0[j];"), std::string::npos) << s;
  EXPECT_EQ(s.find("m1"), std::string::npos) << s;
  // Several threads, each with its own scratch row: the results do not depend on the count.
  torch::manual_seed(7);
  const auto x = torch::randn({257, 300});
  FusedElementwise strict("softmax_threads", {softmax_of(input(0))},
                          FusedElementwiseOptions().require_fused(true).grain_size(300));
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const auto one = strict({x})[0];
  at::set_num_threads(std::max(threads, 2));
  const auto many = strict({x})[0];
  at::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(one, many));
  EXPECT_TRUE(close(one, torch::softmax(x, -1), 1e-8, 1e-5));
}

TEST_F(RowReductions, ExpOfArgumentsBelowMinus87IsZeroAsAMaskedSoftmaxNeeds) {
  // A row masked with -inf: glibc's vector expf would take a scalar path per masked element;
  // the kernels clamp, and give 0 where libtorch gives 0 or a number below 1.7e-38.
  const auto x = torch::tensor({-INFINITY, -100.0f, -87.5f, -86.0f, 0.0f, NAN, 3.0f});
  FusedElementwise k("exp_floor", {exp(input(0)), sigmoid(input(0))},
                     FusedElementwiseOptions().require_fused(true));
  const auto got = k({x});
  const auto want = torch::exp(x);
  EXPECT_TRUE(torch::equal(got[0].slice(0, 0, 3), torch::zeros({3})));
  EXPECT_TRUE(close(got[0].slice(0, 3, 5), want.slice(0, 3, 5), 0, 1e-6));
  EXPECT_TRUE(std::isnan(got[0][5].item<float>()));
  EXPECT_TRUE(close(got[0].slice(0, 6), want.slice(0, 6), 0, 1e-6));
  EXPECT_TRUE(close(torch::cat({got[1].slice(0, 0, 5), got[1].slice(0, 6)}),
                    torch::sigmoid(torch::cat({x.slice(0, 0, 5), x.slice(0, 6)})), 1e-30, 1e-6));
  // A softmax over rows with masked positions, one row wholly masked (NaN, as libtorch's).
  auto scores = torch::randn({3, 40});
  scores.index_put_({0, torch::indexing::Slice(0, 20)}, -INFINITY);
  scores[2].fill_(-INFINITY);
  FusedElementwise softmax("masked_softmax", {softmax_of(input(0))},
                           FusedElementwiseOptions().require_fused(true));
  const auto p = softmax({scores})[0], q = torch::softmax(scores, -1);
  EXPECT_TRUE(torch::equal(p.isnan(), q.isnan()));
  EXPECT_TRUE(close(p.nan_to_num(5), q.nan_to_num(5), 1e-8, 1e-5));
  EXPECT_TRUE(torch::equal(p[0].slice(0, 0, 20), torch::zeros({20})));
}

TEST_F(RowReductions, TheBackwardReadsTheForwardsReductionsAndRecomputesThemUnderCreateGraph) {
  torch::manual_seed(8);
  const auto rg = torch::requires_grad();
  auto x = torch::randn({9, 30}, rg), w = torch::randn({30}, rg);
  const auto ln = layer_norm_of(input(0), input(1), input(1) * 0.0, 1e-5);
  const Expr sx = input(0) * 2.0;
  // A softmax whose maximum carries no gradient (detach), as libtorch's formula.
  const Expr e = exp(sx - detach(row_max(sx)));
  FusedElementwise k("stats", {ln.y, e / row_sum(e), detach(input(0)) * input(0)},
                     FusedElementwiseOptions().require_fused(true));
  const auto got = k({x, w});
  const std::vector<at::Tensor> want{torch::layer_norm(x, {30}, w, w * 0.0, 1e-5),
                                     torch::softmax(x * 2.0, -1), x.detach() * x};
  const std::vector<at::Tensor> up{torch::randn({9, 30}), torch::randn({9, 30}),
                                   torch::randn({9, 30})};
  // First order: the backward that reads the saved reductions.
  const auto g = torch::autograd::grad(got, {x, w}, up, /*retain_graph=*/true);
  const auto h = torch::autograd::grad(want, {x, w}, up, /*retain_graph=*/true);
  for (size_t i = 0; i < g.size(); ++i) EXPECT_TRUE(close(g[i], h[i], 1e-4, 1e-4)) << i;
  // Second order: the gradients must be differentiable in x through the reductions too, so
  // under create_graph the backward recomputes them (the saved ones are constants).
  const auto g2 = torch::autograd::grad(got, {x, w}, up, /*retain_graph=*/true,
                                        /*create_graph=*/true);
  const auto h2 = torch::autograd::grad(want, {x, w}, up, true, true);
  const auto v = torch::randn({9, 30});
  const auto gg = torch::autograd::grad({(g2[0] * v).sum()}, {x, w});
  const auto hh = torch::autograd::grad({(h2[0] * v).sum()}, {x, w});
  for (size_t i = 0; i < gg.size(); ++i) EXPECT_TRUE(close(gg[i], hh[i], 1e-3, 1e-3)) << i;
  EXPECT_EQ(fallbacks(), 0);
}

// The bytes of the cache entry whose name starts with `prefix` followed by its hash ("" when
// there is none).
std::string cache_entry(const std::string& dir, const std::string& prefix) {
  volt::KernelCache::global().flush();
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().filename().string().rfind(prefix + "-", 0) != 0) continue;
    return volt_test::file_text(entry.path());
  }
  return "";
}

// A softmax's backward reads its output y, as libtorch's does, and the sum s it saved: the exps
// it divided (e = y * s) are not computed again. Its library then calls no expf at all, where
// the forward's does; the gradient is autograd's through at::softmax, at 1 and 2 threads.
TEST_F(RowReductions, ASoftmaxsBackwardReadsItsOutputAndComputesNoExp) {
  torch::manual_seed(9);
  const auto x = (torch::randn({64, 300}) * 3).requires_grad_();
  const Expr e = exp(input(0) - detach(row_max(input(0))));
  FusedElementwise k("softmax_out", {e / row_sum(e)},
                     FusedElementwiseOptions().require_fused(true).grain_size(3000));
  const auto up = torch::randn({64, 300});
  const auto want = torch::autograd::grad({torch::softmax(x, -1)}, {x}, {up})[0];
  const int threads = at::get_num_threads();
  for (int t : {1, 2}) {
    at::set_num_threads(t);
    const auto g = torch::autograd::grad({k({x})[0]}, {x}, {up})[0];
    EXPECT_TRUE(close(g, want, 1e-6, 1e-5)) << t << " threads";
  }
  at::set_num_threads(threads);
  const std::string forward = cache_entry(dir.path, "softmax_out_fw");
  const std::string backward = cache_entry(dir.path, "softmax_out_bwdso");
  ASSERT_FALSE(forward.empty());
  ASSERT_FALSE(backward.empty()) << "the backward does not read the output";
  EXPECT_NE(forward.find("expf"), std::string::npos);
  EXPECT_EQ(backward.find("expf"), std::string::npos);
  EXPECT_EQ(fallbacks(), 0);
}

// A sub-expression written twice (built by two calls, not one Expr reused) is one node: the
// kernel is the one of the shared expression, and the softmax's backward still reads its output.
TEST_F(RowReductions, ASubExpressionWrittenTwiceIsComputedOnce) {
  const auto shifted = [] { return exp(input(0) - detach(row_max(input(0)))); };
  FusedElementwise twice("softmax_twice", {shifted() / row_sum(shifted())},
                         FusedElementwiseOptions().require_fused(true));
  const Expr e = shifted();
  FusedElementwise once("softmax_twice", {e / row_sum(e)});
  const auto x = torch::randn({8, 50}, torch::requires_grad());
  EXPECT_EQ(twice.source({x}), once.source({x}));
  const auto up = torch::randn({8, 50});
  const auto g = torch::autograd::grad({twice({x})[0]}, {x}, {up})[0];
  const auto want = torch::autograd::grad({torch::softmax(x, -1)}, {x}, {up})[0];
  EXPECT_TRUE(close(g, want, 1e-6, 1e-5));
  EXPECT_FALSE(cache_entry(dir.path, "softmax_twice_bwdso").empty());
}

// An output modified in place after the forward is not what the forward computed: the backward
// then recomputes it from the inputs (as the composition's autograd, which saved no output,
// would), rather than read the modified values or fail.
TEST_F(RowReductions, AnOutputModifiedInPlaceIsRecomputedNotRead) {
  torch::manual_seed(10);
  const auto x = torch::randn({16, 40}, torch::requires_grad());
  const Expr e = exp(input(0) * 0.5 - detach(row_max(input(0) * 0.5)));
  FusedElementwise k("softmax_inplace", {e / row_sum(e)},
                     FusedElementwiseOptions().require_fused(true));
  const auto up = torch::randn({16, 40});
  auto y = k({x})[0];
  y.mul_(3.0);
  const auto g = torch::autograd::grad({y}, {x}, {up})[0];
  auto z = torch::softmax(x * 0.5, -1) * 3.0;
  const auto want = torch::autograd::grad({z}, {x}, {up})[0];
  EXPECT_TRUE(close(g, want, 1e-6, 1e-5));
  // Untouched, the same call reads its output.
  const auto g1 = torch::autograd::grad({k({x})[0]}, {x}, {up})[0];
  EXPECT_TRUE(close(g1 * 3.0, want, 1e-6, 1e-5));
  EXPECT_FALSE(cache_entry(dir.path, "softmax_inplace_bwdso").empty());
}

// An output is read only when that reads no more full-size tensors: sigmoid(x * w)'s backward
// for x alone reads y and the row w instead of x and w; for x and w it needs x anyway (w's
// gradient is x * ...), so it recomputes y from x rather than read both. Both equal autograd's.
TEST_F(RowReductions, AnOutputIsReadOnlyWhenThatReadsNoMoreMemory) {
  torch::manual_seed(11);
  const auto x = torch::randn({32, 24}, torch::requires_grad());
  const auto w = torch::randn({24}, torch::requires_grad());
  const auto up = torch::randn({32, 24});
  FusedElementwise k("sigmoid_out", {sigmoid(input(0) * input(1))},
                     FusedElementwiseOptions().require_fused(true));
  const auto want = torch::autograd::grad({torch::sigmoid(x * w)}, {x, w}, {up});
  const auto gx = torch::autograd::grad({k({x, w.detach()})[0]}, {x}, {up})[0];
  EXPECT_TRUE(close(gx, want[0], 1e-7, 1e-6));
  EXPECT_FALSE(cache_entry(dir.path, "sigmoid_out_bwdo").empty());
  const auto g = torch::autograd::grad({k({x, w})[0]}, {x, w}, {up});
  EXPECT_TRUE(close(g[0], want[0], 1e-7, 1e-6));
  EXPECT_TRUE(close(g[1], want[1], 1e-6, 1e-5));
  EXPECT_FALSE(cache_entry(dir.path, "sigmoid_out_bwdc").empty());
  EXPECT_TRUE(cache_entry(dir.path, "sigmoid_out_bwdoc").empty());
}

TEST_F(RowReductions, GradientsOfPerRowOutputsEnterAtTheFirstColumn) {
  const auto g = gradients({row_sum(input(0))}, 1, {true});
  ASSERT_EQ(g.size(), 1u);
  FusedElementwise k("grad_expr", {g[0]}, FusedElementwiseOptions().require_fused(true));
  // d/dx of a row sum is the row's gradient at every element: the row sum of the gradient at
  // the first column, a per-row value.
  const auto got = k({torch::randn({2, 3}), torch::tensor({{2.0f}, {5.0f}})})[0];
  EXPECT_TRUE(torch::equal(got, torch::tensor({{2.0f}, {5.0f}}))) << got;
  const auto msg = volt_test::error_of<volt::ValueError>([&] {
    gradients({row_sum(input(0))}, 1, {true, false});
  });
  EXPECT_NE(msg.find("one per output"), std::string::npos) << msg;
}

// Random expressions over a full input, a row, a column and a scalar, with reductions nested
// at random: the compiled kernels (forward, the variant that keeps reductions, the backward that
// reads them) against reference() and autograd through it. Values stay in a moderate range
// (exp of -|y|, division by |y| + 1, means rather than sums) so that tolerances mean something.
Expr random_expr(std::mt19937& rng, int depth) {
  std::uniform_int_distribution<int> pick(0, 13);
  if (depth == 0) {
    const int leaf = pick(rng) % 5;
    if (leaf == 4) return Expr(0.25 + 0.5 * (pick(rng) % 4));
    return input(leaf);
  }
  const Expr a = random_expr(rng, depth - 1);
  switch (pick(rng)) {
    case 0: return a + random_expr(rng, depth - 1);
    case 1: return a - random_expr(rng, depth - 1);
    case 2: return a * random_expr(rng, depth - 1);
    case 3: return a / (abs(random_expr(rng, depth - 1)) + 1.0);
    case 4: return exp(-abs(a));
    case 5: return tanh(a);
    case 6: return sigmoid(a);
    case 7: return relu(a) - a * 0.5;
    case 8: return maximum(a, random_expr(rng, depth - 1));
    case 9: return row_sum(a) / row_length();
    case 10: return row_max(a);
    case 11: return a - detach(row_max(a));
    case 12: return sqrt(row_sum(a * a) / row_length() + 1.0);
    default: return a * first_column(random_expr(rng, depth - 1)) + a;
  }
}

// The short-row loops keep their blocks on the stack, within a cap: a kernel with 70 full
// inputs (a row kernel) or 69 row inputs (an elementwise one) would exceed it, so every row
// takes the row-by-row loop, with the same results.
TEST_F(RowReductions, KernelsWithManyInputsRunShortRowsOneAtATime) {
  torch::manual_seed(13);
  Expr sum = input(0);
  for (int64_t i = 1; i < 70; ++i) sum = sum + input(i) * (0.01 * static_cast<double>(i));
  const auto opts = FusedElementwiseOptions().require_fused(true);
  FusedElementwise rows("many_full", {softmax_of(sum)}, opts);
  FusedElementwise elementwise("many_row_inputs", {sum * 0.5}, opts);
  std::vector<at::Tensor> full, by_row{torch::randn({40, 10})};
  for (int64_t i = 0; i < 70; ++i) full.push_back(torch::randn({40, 10}));
  for (int64_t i = 1; i < 70; ++i) by_row.push_back(torch::randn({10}));
  EXPECT_EQ(rows.source(full).find("r_end - r >= 16"), std::string::npos);
  EXPECT_EQ(elementwise.source(by_row).find("short_rows"), std::string::npos);
  EXPECT_TRUE(close(rows(full)[0], rows.reference(full)[0], 1e-6, 1e-5));
  EXPECT_TRUE(torch::equal(elementwise(by_row)[0], elementwise.reference(by_row)[0]));
  // Under the cap (two inputs), both loops are there.
  const std::vector<at::Tensor> two{full[0], full[1]};
  FusedElementwise few("few_full", {softmax_of(input(0) + input(1))}, opts);
  EXPECT_NE(few.source(two).find("r_end - r >= 16"), std::string::npos);
}

// Random expressions over inputs of [rows, cols], [cols], [rows, 1] and []: 13 x 17 runs the
// row loop only; 45 x 17 runs blocks of 16 rows in the lane loop (each thread's rows: a block,
// then the rest in the row loop), with every input form, per-row and summed outputs.
class RandomRowExpressions : public RowReductions,
                             public ::testing::WithParamInterface<std::pair<int64_t, int64_t>> {};

TEST_P(RandomRowExpressions, MatchTheCompositionAndItsGradients) {
  const int64_t rows = GetParam().first, cols = GetParam().second;
  std::mt19937 rng(12345);
  torch::manual_seed(9);
  const auto rg = torch::requires_grad();
  int with_reductions = 0;
  for (int trial = 0; trial < 24; ++trial) {
    std::vector<Expr> outs{random_expr(rng, 4), random_expr(rng, 3)};
    // Every expression reads input 0, so that the full shape is the same for both paths.
    outs[0] = outs[0] + input(0) * 0.5;
    FusedElementwise k("random_" + std::to_string(trial), outs,
                       FusedElementwiseOptions().require_fused(true).grain_size(64));
    with_reductions += k.by_rows() ? 1 : 0;
    const std::vector<at::Tensor> in{torch::randn({rows, cols}, rg), torch::randn({cols}, rg),
                                     torch::randn({rows, 1}, rg), torch::randn({}, rg)};
    const std::vector<at::Tensor> leaves(in.begin(), in.begin() + k.num_inputs());
    const std::vector<at::Tensor> args(in.begin(), in.begin() + k.num_inputs());
    const auto got = k(args), want = k.reference(args);
    ASSERT_EQ(got.size(), want.size());
    std::vector<at::Tensor> up;
    for (size_t o = 0; o < got.size(); ++o) {
      ASSERT_TRUE(close(got[o], want[o], 1e-5, 1e-4)) << "trial " << trial << " output " << o;
      up.push_back(torch::randn(want[o].sizes()));
    }
    const auto g = torch::autograd::grad(got, leaves, up, /*retain_graph=*/false,
                                         /*create_graph=*/false, /*allow_unused=*/true);
    const auto h = torch::autograd::grad(want, leaves, up, false, false, true);
    for (size_t i = 0; i < leaves.size(); ++i) {
      if (!h[i].defined()) continue;
      ASSERT_TRUE(g[i].defined()) << "trial " << trial << " input " << i;
      // Ties in a row maximum split the gradient in both paths; where rounding makes a near tie
      // a tie in one path only, they differ, so ties are unlikely with random normal values.
      EXPECT_TRUE(close(g[i], h[i], 1e-4, 1e-3)) << "trial " << trial << " input " << i;
    }
  }
  EXPECT_GE(with_reductions, 12);  // most trials exercise the row kernels
  EXPECT_EQ(fallbacks(), 0);
}

INSTANTIATE_TEST_SUITE_P(RowReductions, RandomRowExpressions,
                         ::testing::Values(std::make_pair<int64_t, int64_t>(13, 17),
                                           std::make_pair<int64_t, int64_t>(45, 17)));

// Rows of at most 31 values run 16 at a time, one row per vector lane; the rows left over
// (fewer than 16 in a thread's share) and longer rows take the row loop. Both agree with
// libtorch's kernels, forward and backward, on every row count around a block, at one and two
// threads (two threads split the rows mid-block), with NaN, infinite and tied values.
TEST_F(RowReductions, ShortRowsRunOneRowPerVectorLaneAndMatchLibtorch) {
  torch::manual_seed(4);
  const auto rg = torch::requires_grad();
  const auto opts = FusedElementwiseOptions().require_fused(true).grain_size(1);
  const Expr xs = input(0) * 0.5;
  const Expr ld = xs - detach(row_max(xs));
  const auto ln = layer_norm_of(input(0), input(1), input(2), 1e-5);
  FusedElementwise k("short_rows", {softmax_of(input(0)), ld - log(row_sum(exp(ld))), ln.y}, opts);
  EXPECT_NE(k.source({torch::randn({4, 10}), torch::randn({10}), torch::randn({10})})
                .find("cols <= 31 && r_end - r >= 16"),
            std::string::npos);
  const int threads = at::get_num_threads();
  for (int t : {1, 2}) {
    at::set_num_threads(t);
    for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{
             {16, 1}, {15, 10}, {16, 10}, {17, 10}, {40, 10}, {33, 31}, {48, 32}, {21, 7}}) {
      SCOPED_TRACE(std::to_string(t) + " threads, [" + std::to_string(rows) + ", " +
                   std::to_string(cols) + "]");
      auto x = torch::randn({rows, cols}, rg), w = torch::randn({cols}, rg),
           b = torch::randn({cols}, rg);
      const auto got = k({x, w, b});
      const std::vector<at::Tensor> want{torch::softmax(x, -1), torch::log_softmax(x * 0.5, -1),
                                         torch::layer_norm(x, {cols}, w, b, 1e-5)};
      std::vector<at::Tensor> up;
      for (size_t o = 0; o < got.size(); ++o) {
        EXPECT_TRUE(close(got[o], want[o], 1e-5, 1e-5)) << "output " << o;
        up.push_back(torch::randn(want[o].sizes()));
      }
      const auto g = torch::autograd::grad(got, {x, w, b}, up);
      const auto h = torch::autograd::grad(want, {x, w, b}, up);
      for (size_t i = 0; i < g.size(); ++i) {
        EXPECT_TRUE(close(g[i], h[i], 1e-4, 1e-4)) << "gradient " << i;
      }
    }
    // NaN, -inf, +inf and ties among 20 rows of 5: the block's lanes keep them apart.
    auto x = torch::randn({20, 5});
    x[1][2] = NAN;
    x[4].fill_(-INFINITY);
    x[7][0] = INFINITY;
    x[9].fill_(3.0f);
    x[18][4] = NAN;
    FusedElementwise maxima("short_maxima", {row_max(input(0)) * 2.0 + row_sum(input(0))},
                            FusedElementwiseOptions().require_fused(true));
    const auto got = maxima({x})[0];
    const auto want = x.amax(-1, true) * 2 + x.sum(-1, true);
    EXPECT_TRUE(torch::equal(got.isnan(), want.isnan())) << got << want;
    EXPECT_TRUE(close(got.nan_to_num(7, 8, 9), want.nan_to_num(7, 8, 9), 1e-5, 1e-5));
  }
  at::set_num_threads(threads);
  EXPECT_EQ(fallbacks(), 0);
}

// ---- TracedFunction: the reductions libtorch records, fused with their neighbours ----

using volt::TracedFunction;
using volt::TraceOptions;
using volt_test::trace_and_check;
using Tensors = std::vector<at::Tensor>;

bool has(const std::string& text, const std::string& phrase) {
  return text.find(phrase) != std::string::npos;
}

// A pre-norm attention-like block's row work: a residual add into a LayerNorm, a scaled and
// masked softmax, an RMSNorm written as ops (no libtorch kernel for it), a log_softmax.
Tensors row_block(const Tensors& in) {
  const auto &x = in[0], &res = in[1], &w = in[2], &b = in[3], &mask = in[4], &g = in[5];
  const auto h = torch::layer_norm(x + res, {x.size(-1)}, w, b, 1e-5);
  const auto p = torch::softmax(h * 0.125 + mask, -1);
  const auto rms = x * torch::rsqrt(x.pow(2).mean(-1, true) + 1e-6) * g;
  const auto lsm = torch::log_softmax(rms - x.amax(-1, true), -1);
  return {p, rms + h, lsm};
}

TEST_F(RowReductions, TracedLayerNormSoftmaxAndMeansFuseWithTheirNeighbours) {
  torch::manual_seed(4);
  const auto rg = torch::requires_grad();
  const int64_t n = 128;  // softmaxes over shorter rows stay libtorch's (the test below)
  Tensors in{torch::randn({6, 10, n}, rg),
             torch::randn({6, 10, n}, rg),
             torch::randn({n}, rg),
             torch::randn({n}, rg),
             torch::randn({n}),
             torch::randn({n}, rg)};
  in[4] = in[4].masked_fill(in[4] > 1.0, -INFINITY);  // masked positions (a row input)
  TracedFunction f("row_block", row_block);
  {
    // Inference: everything is one chain.
    torch::NoGradGuard no_grad;
    trace_and_check(f, in);
    const std::string text = f.describe(in);
    EXPECT_FALSE(has(text, "\n  aten::layer_norm")) << text;
    EXPECT_FALSE(has(text, "\n  aten::softmax")) << text;
    EXPECT_FALSE(has(text, "\n  aten::mean")) << text;
    EXPECT_FALSE(has(text, "\n  aten::log_softmax")) << text;
    EXPECT_TRUE(has(text, "1 fused chain,")) << text;
    const Tensors got = f(in), want = row_block(in);
    for (size_t o = 0; o < got.size(); ++o) EXPECT_TRUE(close(got[o], want[o], 1e-5, 1e-5)) << o;
  }
  // Training: layer_norm stays libtorch's (its own backward is faster than the fused chain's),
  // the rest fuses, and the gradients match.
  trace_and_check(f, in);
  const std::string text = f.describe(in);
  EXPECT_TRUE(has(text, "\n  aten::layer_norm")) << text;
  EXPECT_FALSE(has(text, "\n  aten::softmax")) << text;
  EXPECT_FALSE(has(text, "\n  aten::mean")) << text;
  EXPECT_FALSE(has(text, "\n  aten::log_softmax")) << text;
  const Tensors got = f(in);
  const Tensors want = row_block(in);
  for (size_t o = 0; o < got.size(); ++o) {
    EXPECT_TRUE(close(got[o], want[o], 1e-5, 1e-5)) << o;
  }
  const auto up =
      Tensors{torch::randn_like(want[0]), torch::randn_like(want[1]), torch::randn_like(want[2])};
  const Tensors leaves{in[0], in[1], in[2], in[3], in[5]};
  const auto gg = torch::autograd::grad(got, leaves, up);
  const auto hh = torch::autograd::grad(want, leaves, up);
  for (size_t i = 0; i < gg.size(); ++i) EXPECT_TRUE(close(gg[i], hh[i], 1e-4, 1e-4)) << i;
  EXPECT_EQ(fallbacks(), 0);
}

// A softmax or log_softmax over rows shorter than 128 stays libtorch's (the row kernel lost to
// it there: 0.40x at 10 columns, 0.85x at 100); the chains around it still fuse, and an RMSNorm
// (no exp) fuses over short rows too. At 128 columns the same function is one chain.
// A softmax is fused over rows where the kernel beats libtorch's: 128 values or more (the row
// loop), or at most 31 that are not a multiple of 8, 16 rows or more (the lane loop). Over
// other rows it stays libtorch's, and its neighbours still fuse.
TEST_F(RowReductions, ASoftmaxOverShortRowsStaysLibtorchsAndItsNeighboursFuse) {
  auto fn = [](const Tensors& in) {
    const auto x = in[0] * 0.5 + 1.0;
    const auto rms = x * torch::rsqrt(x.pow(2).mean(-1, true) + 1e-6);
    return Tensors{torch::log_softmax(x, -1) * 2.0 - 1.0, torch::softmax(x, -1), rms};
  };
  TracedFunction f("short_rows", fn);
  for (const auto& [rows, cols, fused] : std::vector<std::tuple<int64_t, int64_t, bool>>{
           {32, 10, true},
           {16, 31, true},
           {15, 10, false},  // fewer rows than vector lanes
           {32, 16, false},  // libtorch's vectors fill the row
           {32, 32, false},
           {32, 127, false},
           {32, 128, true}}) {
    const Tensors in{torch::randn({rows, cols}, torch::requires_grad())};
    trace_and_check(f, in);
    const std::string text = f.describe(in);
    EXPECT_NE(has(text, "\n  aten::log_softmax"), fused) << rows << " x " << cols << "\n" << text;
    EXPECT_NE(has(text, "\n  aten::softmax"), fused) << rows << " x " << cols << "\n" << text;
    EXPECT_FALSE(has(text, "\n  aten::mean")) << cols << "\n" << text;  // the RMSNorm fused
    const Tensors got = f(in), want = fn(in);
    for (size_t o = 0; o < got.size(); ++o) {
      EXPECT_TRUE(close(got[o], want[o], 1e-6, 1e-5)) << cols << ", output " << o;
    }
    const auto g = torch::autograd::grad({got[0].sum() + got[1].pow(2).sum()}, {in[0]})[0];
    const auto h = torch::autograd::grad({want[0].sum() + want[1].pow(2).sum()}, {in[0]})[0];
    EXPECT_TRUE(close(g, h, 1e-5, 1e-4)) << cols;
  }
}

TEST_F(RowReductions, OtherReductionsRunAsRecorded) {
  // Over another dimension, without keepdim, over all dimensions, with a dtype: not row
  // reductions the kernel makes, so they run through libtorch (and the chains around them
  // still fuse).
  auto fn = [](const Tensors& in) {
    const auto x = in[0] * 2.0 + 1.0;
    return Tensors{x.sum(0, true) * 3.0 + 1.0,
                   x.sum(-1) * 2.0 + 1.0,
                   x.sum() * 2.0,
                   torch::softmax(x, 0) * 2.0 + 1.0,
                   torch::softmax(x, -1, torch::kDouble) * 2.0,
                   x.mean(at::IntArrayRef{0, 1}, true) + 1.0};
  };
  TracedFunction f("other_reductions", fn);
  const Tensors in{torch::randn({5, 7})};
  trace_and_check(f, in);
  const std::string text = f.describe(in);
  for (const char* op : {"aten::sum", "aten::softmax", "aten::mean"}) {
    EXPECT_TRUE(has(text, std::string("\n  ") + op)) << op << "\n" << text;
  }
  const Tensors got = f(in), want = fn(in);
  for (size_t o = 0; o < got.size(); ++o) EXPECT_TRUE(close(got[o], want[o], 1e-6, 1e-6)) << o;
}

TEST_F(RowReductions, APerRowValueUsedOutsideItsChainKeepsItsRecordedShape) {
  // The mean is used inside the chain (x - mean) and returned: [4, 1], as recorded.
  auto fn = [](const Tensors& in) {
    const auto mean = in[0].mean(-1, true);
    const auto d = in[0] - mean;
    return Tensors{d * d * 0.5, mean, (d * d).sum(-1, true) / in[1]};
  };
  TracedFunction f("per_row_out", fn);
  const Tensors in{torch::randn({4, 9}), torch::rand({4, 1}) + 1};
  trace_and_check(f, in);
  const std::string text = f.describe(in);
  EXPECT_TRUE(has(text, "1 fused chain,")) << text;
  const Tensors got = f(in), want = fn(in);
  for (size_t o = 0; o < got.size(); ++o) EXPECT_TRUE(close(got[o], want[o], 1e-6, 1e-5)) << o;
}

TEST_F(RowReductions, AReductionOverRowsOfOneIsNotMergedIntoWiderRows) {
  // c.sum(-1, true) sums rows of length 1 (it is c); in x's chain, whose rows have length 8, the
  // kernel would sum c eight times: it runs as its own step instead.
  auto fn = [](const Tensors& in) {
    const auto s = (in[1] * 2.0).sum(-1, true);
    return Tensors{(in[0] + s) * 3.0};
  };
  TracedFunction f("row_of_one", fn);
  const Tensors in{torch::randn({3, 8}), torch::randn({3, 1})};
  trace_and_check(f, in);
  const Tensors got = f(in), want = fn(in);
  EXPECT_TRUE(close(got[0], want[0], 1e-6, 1e-6)) << f.describe(in);
}

// A module with a LayerNorm and a softmax head, traced and trained: the parameters' gradients
// (LayerNorm's weight and bias summed over rows in the kernel's backward) match eager.
struct NormHead : torch::nn::Module {
  NormHead()
      : fc(register_module("fc", torch::nn::Linear(12, 16))),
        ln(register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({16})))) {}
  at::Tensor forward(const at::Tensor& x) {
    const auto h = ln->forward(torch::gelu(fc->forward(x)));
    return torch::log_softmax(h - h.mean(-1, true), -1);
  }
  torch::nn::Linear fc;
  torch::nn::LayerNorm ln;
};

TEST_F(RowReductions, ATracedModuleWithALayerNormTrainsLikeEager) {
  torch::manual_seed(5);
  auto eager = std::make_shared<NormHead>();
  auto traced = std::make_shared<NormHead>();
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < eager->parameters().size(); ++i) {
      traced->parameters()[i].copy_(eager->parameters()[i]);
    }
    // Not the default weights: the LayerNorm's own must get gradients that matter.
    traced->ln->weight.uniform_(0.5, 1.5);
    eager->ln->weight.copy_(traced->ln->weight);
  }
  TracedFunction f("norm_head", traced,
                   [&](const Tensors& in) { return Tensors{traced->forward(in[0])}; });
  torch::optim::SGD opt_e(eager->parameters(), 0.5), opt_t(traced->parameters(), 0.5);
  const auto x = torch::randn({32, 12});
  const auto target = torch::randint(0, 16, {32});
  for (int step = 0; step < 5; ++step) {
    opt_e.zero_grad();
    opt_t.zero_grad();
    const auto le = torch::nll_loss(eager->forward(x), target);
    const auto lt = torch::nll_loss(f({x})[0], target);
    le.backward();
    lt.backward();
    EXPECT_NEAR(lt.item<double>(), le.item<double>(), 1e-5) << "step " << step;
    opt_e.step();
    opt_t.step();
  }
  for (size_t i = 0; i < eager->parameters().size(); ++i) {
    EXPECT_TRUE(close(traced->parameters()[i], eager->parameters()[i], 1e-5, 1e-5)) << i;
  }
  // Training keeps libtorch's layer_norm and fuses what follows it, but for the log_softmax
  // over 16 classes (rows shorter than 128 stay libtorch's); in eval mode without gradients the
  // layer_norm joins the chain.
  const std::string training = f.describe({x});
  EXPECT_TRUE(has(training, "\n  aten::layer_norm")) << training;
  EXPECT_TRUE(has(training, "fused 'norm_head_g0': 2 ops (mean sub)")) << training;
  EXPECT_TRUE(has(training, "\n  aten::log_softmax")) << training;
  torch::NoGradGuard no_grad;
  traced->eval();
  eager->eval();
  const std::string inference = f.describe({x});
  EXPECT_FALSE(has(inference, "\n  aten::layer_norm")) << inference;
  EXPECT_TRUE(close(f({x})[0], eager->forward(x), 1e-5, 1e-5));
}

}  // namespace
