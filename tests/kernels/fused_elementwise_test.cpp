// FusedElementwise: compiled loops against the libtorch composition (bit for bit where the ops
// are exactly rounded, a few ulp for the transcendental ones), the three cache levels (memory,
// the KernelCache folder, the compiler), a bad cache entry, a missing compiler, and every
// fallback and error path. Each test runs in its own process (gtest_discover_tests), so each
// gets a fresh KernelCache::global() on the folder its VOLT_KERNEL_CACHE_CONFIG names.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "error_text.h"
#include "file_text.h"
#include "log_capture.h"
#include "near.h"
#include "processes.h"
#include "scoped_env.h"
#include "tiny.h"
#include "volt/kernels/fused_elementwise.h"
#include "volt/kernels/kernel_cache.h"

namespace {

using namespace volt::jit;  // NOLINT: the expression language reads as maths
using volt::FusedElementwise;
using volt::FusedElementwiseOptions;

using volt_test::ScopedEnv;

// A private cache folder for the test's process.
struct CacheFixture : ::testing::Test {
  volt_test::TempDir dir;
  ScopedEnv env{"VOLT_KERNEL_CACHE_CONFIG", dir.path + ",false,64"};
};

bool contains(const std::vector<std::string>& lines, const std::string& text) {
  for (const auto& l : lines) {
    if (l.find(text) != std::string::npos) return true;
  }
  return false;
}

Expr gelu_tanh(const Expr& y) {
  return 0.5 * y * (1.0 + tanh(0.7978845608028654 * (y + 0.044715 * y * y * y)));
}

using volt_test::near;

// |a - b| <= atol + rtol |b|, for gradients: sums over broadcast dimensions add rounding.
::testing::AssertionResult near_tol(const at::Tensor& a, const at::Tensor& b, double atol,
                                    double rtol) {
  const auto diff = (a.to(at::kDouble) - b.to(at::kDouble)).abs();
  const double worst = (diff - (atol + rtol * b.to(at::kDouble).abs())).max().item<double>();
  if (worst <= 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max |a - b| = " << diff.max().item<double>();
}

using CompiledElementwise = CacheFixture;

TEST_F(CompiledElementwise, ExactlyRoundedOpsGiveLibtorchsBits) {
  torch::manual_seed(0);
  // Full, row, one-element, and a second full input; rows of 1000 with chunks of 777 elements,
  // so that chunks start in the middle of rows.
  const auto x = torch::randn({300, 1000}), bias = torch::randn({1000}), s = torch::randn({1}),
             r = torch::randn({300, 1000});
  Expr a = input(0), b = input(1), c = input(2), d = input(3);
  Expr y = a + b;
  Expr z = maximum(y * c, -d) - minimum(abs(a), 0.25) + relu(y - d) * 3.0;
  // a * d + b rounds twice in libtorch: a fused multiply-add would change the last bit.
  FusedElementwise k("exact_chain", {z, y, a * d + b},
                     FusedElementwiseOptions().require_fused(true).grain_size(777));
  const auto got = k({x, bias, s, r});
  const auto want = k.reference({x, bias, s, r});
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].sizes(), x.sizes());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(torch::equal(got[i], want[i])) << i;
  EXPECT_EQ(k.num_inputs(), 4);
  EXPECT_EQ(volt::jit::stats().compiles, 1);  // one kernel computes both outputs
}

// A layer norm's epilogue: per-row mean and scale (columns), per-feature weight and bias (rows).
TEST_F(CompiledElementwise, ColumnsAndRowsTogetherAsInALayerNormEpilogue) {
  torch::manual_seed(6);
  const auto rg = torch::requires_grad();
  auto x = torch::randn({3, 37, 50}, rg), w = torch::randn({50}, rg), b = torch::randn({50}, rg);
  auto mean = torch::randn({3, 37, 1}, rg), rstd = torch::rand({37, 1}, rg);  // leading 1 left out
  FusedElementwise k("ln_epilogue", {(input(0) - input(1)) * input(2) * input(3) + input(4)},
                     FusedElementwiseOptions().require_fused(true).grain_size(333));
  const std::vector<at::Tensor> in{x, mean, rstd, w, b};
  const auto got = k(in)[0], want = k.reference(in)[0];
  EXPECT_TRUE(torch::equal(got, want));
  const auto up = torch::randn({3, 37, 50});
  const auto g = torch::autograd::grad({got}, {x, mean, rstd, w, b}, {up});
  const auto h = torch::autograd::grad({want}, {x, mean, rstd, w, b}, {up});
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_EQ(g[i].sizes(), in[i].sizes()) << i;
    EXPECT_TRUE(near_tol(g[i], h[i], 1e-4, 1e-5)) << i;
  }
}

TEST_F(CompiledElementwise, TranscendentalOpsMatchLibtorchWithinAFewUlp) {
  torch::manual_seed(1);
  const auto x = torch::randn({64, 333}) * 3, bias = torch::randn({1, 333});
  Expr a = input(0), b = input(1);
  Expr y = a + b;
  FusedElementwise k("transcendental",
                     {gelu_tanh(y), sigmoid(y), exp(y * 0.1), log(abs(y) + 1.0), sqrt(abs(y)),
                      erf(y), y / (abs(b) + 0.5)},
                     FusedElementwiseOptions().require_fused(true));
  const auto got = k({x, bias});
  const auto want = k.reference({x, bias});
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(near(got[i], want[i])) << "output " << i;
  }
}

TEST_F(CompiledElementwise, NanPropagatesAsInLibtorch) {
  const auto x = torch::tensor({1.0f, NAN, -2.0f, NAN}),
             y = torch::tensor({NAN, 3.0f, -1.0f, 0.0f});
  FusedElementwise k("nans",
                     {maximum(input(0), input(1)), minimum(input(0), input(1)), relu(input(0))},
                     FusedElementwiseOptions().require_fused(true));
  const auto got = k({x, y});
  const auto want = k.reference({x, y});
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(torch::equal(got[i].isnan(), want[i].isnan())) << i;
    EXPECT_TRUE(torch::equal(got[i].nan_to_num(7), want[i].nan_to_num(7))) << i;
  }
}

TEST_F(CompiledElementwise, KernelsComeFromMemoryThenDiskThenTheCompiler) {
  const auto x = torch::randn({100, 10}), b = torch::randn({10});
  auto make = [] { return FusedElementwise("levels", {gelu_tanh(input(0) + input(1))}); };
  const auto want = make().reference({x, b})[0];

  EXPECT_TRUE(torch::equal(make()({x, b})[0], make()({x, b})[0]));
  auto s = volt::jit::stats();
  EXPECT_EQ(s.compiles, 1);
  EXPECT_EQ(s.memory_hits, 1);  // the second object found the loaded kernel
  EXPECT_EQ(s.disk_hits, 0);

  volt::KernelCache::global().flush();
  const auto entries = volt::KernelCache::global().entries();
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].key.rfind("levels-", 0), 0u) << entries[0].key;

  volt::jit::forget_loaded_kernels();  // as a new process would start
  EXPECT_TRUE(near(make()({x, b})[0], want));
  s = volt::jit::stats();
  EXPECT_EQ(s.compiles, 1);
  EXPECT_EQ(s.disk_hits, 1);

  // Other input forms are another kernel: a one-element bias.
  make()({x, torch::randn({1})});
  EXPECT_EQ(volt::jit::stats().compiles, 2);
}

TEST_F(CompiledElementwise, ABadCacheEntryIsReplacedByACompile) {
  const auto x = torch::randn({50});
  auto make = [] { return FusedElementwise("bad_entry", {input(0) * 2.0 + 1.0}); };
  make()({x});
  auto& cache = volt::KernelCache::global();
  cache.flush();
  ASSERT_EQ(cache.entries().size(), 1u);
  const std::string path = dir / cache.entries()[0].key;
  std::ofstream(path, std::ios::trunc) << "not a shared library";
  volt::jit::forget_loaded_kernels();
  std::vector<at::Tensor> got;
  auto lines = volt_test::capture_logs([&] {
    got = make()({x});
    cache.flush();
  });
  EXPECT_TRUE(torch::equal(got[0], x * 2 + 1));
  EXPECT_TRUE(contains(lines, "cannot be used")) << (lines.empty() ? "" : lines[0]);
  EXPECT_EQ(volt::jit::stats().compiles, 2);
  EXPECT_EQ(volt::jit::stats().disk_hits, 0);
  volt::jit::forget_loaded_kernels();
  make()({x});  // the recompiled entry replaced the bad one
  EXPECT_EQ(volt::jit::stats().disk_hits, 1);
}

TEST_F(CompiledElementwise, WithoutADiskCacheEveryProcessCompiles) {
  const auto x = torch::randn({50});
  FusedElementwise k("no_disk", {exp(input(0))}, FusedElementwiseOptions().use_disk_cache(false));
  k({x});
  volt::KernelCache::global().flush();
  EXPECT_TRUE(volt::KernelCache::global().entries().empty());
  EXPECT_EQ(volt::jit::stats().compiles, 1);
}

TEST_F(CompiledElementwise, ThreadsAskingForANewKernelAtOnceGetOneCompile) {
  const auto x = torch::randn({1000});
  FusedElementwise k("racing", {tanh(input(0)) * input(0)});
  const auto want = k.reference({x})[0];
  std::vector<std::thread> threads;
  std::vector<at::Tensor> got(4);
  for (int t = 0; t < 4; ++t) threads.emplace_back([&, t] { got[t] = k({x})[0]; });
  for (auto& t : threads) t.join();
  for (const auto& g : got) EXPECT_TRUE(near(g, want));
  EXPECT_EQ(volt::jit::stats().compiles, 1);
}

TEST_F(CompiledElementwise, EmptyAndZeroDimInputs) {
  FusedElementwise k("shapes", {input(0) + input(1)});
  EXPECT_EQ(k({torch::randn({0, 5}), torch::randn({5})})[0].sizes(), (std::vector<int64_t>{0, 5}));
  const auto a = torch::tensor(2.0f), b = torch::tensor(3.5f);
  const auto out = k({a, b})[0];
  EXPECT_EQ(out.dim(), 0);
  EXPECT_EQ(out.item<float>(), 5.5f);
}

TEST_F(CompiledElementwise, AMissingCompilerRunsTheCompositionOrRefuses) {
  ScopedEnv cc("VOLT_JIT_CC", "/nonexistent/cc");
  const auto x = torch::randn({20});
  FusedElementwise k("no_cc", {sigmoid(input(0))});
  std::vector<at::Tensor> got;
  auto lines = volt_test::capture_logs([&] { got = k({x}); });
  EXPECT_TRUE(torch::equal(got[0], torch::sigmoid(x)));
  EXPECT_TRUE(contains(lines, "no usable C compiler")) << (lines.empty() ? "" : lines[0]);
  EXPECT_EQ(volt::jit::stats().fallbacks, 1);
  // The failure is remembered for this form: the next call falls back at once, with the reason.
  EXPECT_TRUE(torch::equal(k({x})[0], torch::sigmoid(x)));
  EXPECT_EQ(volt::jit::stats().fallbacks, 2);
  EXPECT_EQ(volt::jit::stats().compiles, 0);
  EXPECT_NE(k.fused_unavailable_reason({x}).find("no usable C compiler"), std::string::npos);
  FusedElementwise strict("no_cc", {sigmoid(input(0))},
                          FusedElementwiseOptions().require_fused(true));
  const auto msg = volt_test::error_of<volt::NotAvailable>([&] { strict({x}); });
  EXPECT_NE(msg.find("VOLT_JIT_CC"), std::string::npos) << msg;
}

TEST_F(CompiledElementwise, InputsTheLoopDoesNotTakeRunTheComposition) {
  FusedElementwise k("fallbacks", {input(0) * input(1) + 1.0});
  FusedElementwise strict("fallbacks", {input(0) * input(1) + 1.0},
                          FusedElementwiseOptions().require_fused(true));
  const auto x = torch::randn({4, 6});
  struct Case {
    std::vector<at::Tensor> inputs;
    std::string phrase;
  };
  const std::vector<Case> cases = {
      {{x.to(torch::kDouble), x.to(torch::kDouble)},
       "is Double (the compiled loop is float32-only)"},
      {{x, torch::randn({4, 1, 6})}, "broadcasts to [4, 4, 6] in a way the loop does not read"},
  };
  for (const auto& c : cases) {
    EXPECT_NE(k.fused_unavailable_reason(c.inputs).find(c.phrase), std::string::npos) << c.phrase;
    const auto got = k(c.inputs)[0];
    EXPECT_TRUE(torch::allclose(got, k.reference(c.inputs)[0])) << c.phrase;
    const auto msg = volt_test::error_of<volt::NotAvailable>([&] { strict(c.inputs); });
    EXPECT_NE(msg.find(c.phrase), std::string::npos) << msg;
  }
  // A fallback is still differentiable (the composition is).
  auto w = torch::randn({4, 1, 6}, torch::requires_grad());
  k({x, w})[0].sum().backward();
  EXPECT_TRUE(torch::allclose(w.grad(), x.sum(0).expand({4, 1, 6})));
  EXPECT_EQ(volt::jit::stats().fallbacks, 3);
}

TEST_F(CompiledElementwise, GradientsMatchAutogradThroughTheComposition) {
  torch::manual_seed(2);
  const auto rg = torch::requires_grad();
  auto x = torch::randn({40, 30}, rg), b = torch::randn({30}, rg), s = torch::randn({1}, rg);
  const auto r = torch::randn({40, 30});  // needs no gradient
  Expr a = input(0), bb = input(1), c = input(2), d = input(3);
  Expr y = a + bb;
  FusedElementwise k(
      "grads",
      {gelu_tanh(y) * c + d, maximum(y, d) - minimum(a, c) + abs(y), sigmoid(y) / (exp(c) + 1.0),
       log(abs(y) + 1.0) * sqrt(abs(d) + 0.1), erf(y) - relu(a * c), where_greater(a, d, y, c * d)},
      FusedElementwiseOptions().require_fused(true));
  const std::vector<at::Tensor> in{x, b, s, r};
  const auto got = k(in), want = k.reference(in);
  ASSERT_EQ(got[0].grad_fn()->name(), "volt::FusedElementwiseBackward");
  auto loss_of = [](const std::vector<at::Tensor>& outs) {
    torch::manual_seed(3);  // the same weights for both
    at::Tensor loss = torch::zeros({});
    for (const auto& o : outs) loss = loss + (o * torch::randn(o.sizes())).sum();
    return loss;
  };
  const auto g = torch::autograd::grad({loss_of(got)}, {x, b, s});
  const auto h = torch::autograd::grad({loss_of(want)}, {x, b, s});
  for (size_t o = 0; o < got.size(); ++o) EXPECT_TRUE(near(got[o], want[o])) << o;
  EXPECT_TRUE(near_tol(g[0], h[0], 1e-5, 1e-5));
  EXPECT_TRUE(near_tol(g[1], h[1], 1e-4, 1e-5));  // sums over 40 rows
  EXPECT_TRUE(near_tol(g[2], h[2], 1e-3, 1e-5));  // a sum over 1200 elements
  EXPECT_EQ(volt::jit::stats().compiles, 2);      // the forward and the backward loop
  EXPECT_EQ(volt::jit::stats().fallbacks, 0);
}

TEST_F(CompiledElementwise, ASingleUseChainOfExactOpsGivesAutogradsBits) {
  torch::manual_seed(4);
  const auto rg = torch::requires_grad();
  auto x = torch::randn({50, 20}, rg), b = torch::randn({20}, rg), c = torch::randn({50, 20}, rg);
  FusedElementwise k("exact_grads", {relu(input(0) * input(1) - input(2)) * 0.5},
                     FusedElementwiseOptions().require_fused(true));
  const auto up = torch::randn({50, 20});
  const auto g = torch::autograd::grad({k({x, b, c})[0]}, {x, b, c}, {up});
  const auto h = torch::autograd::grad({k.reference({x, b, c})[0]}, {x, b, c}, {up});
  EXPECT_TRUE(torch::equal(g[0], h[0]));
  EXPECT_TRUE(torch::equal(g[2], h[2]));
  // The row input's gradient is summed over the rows in the kernel, in double: its per-element
  // terms are autograd's bits, their sum the double sum of those terms rounded once (libtorch
  // sums in float), so it equals that double sum to the last bit or so.
  auto wide = b.detach().expand({50, 20}).clone().requires_grad_();
  const auto terms = torch::autograd::grad({k.reference({x, wide, c})[0]}, {wide}, {up})[0];
  const auto exact = terms.to(torch::kDouble).sum(0);
  EXPECT_LE(
      ((g[1].to(torch::kDouble) - exact).abs() / exact.abs().clamp_min(1e-30)).max().item<double>(),
      1.2e-7);
  EXPECT_TRUE(near(g[1], h[1]));
}

// A row input (a bias, a LayerNorm weight) gets its gradient summed over the rows inside the
// backward kernel (one row of doubles per thread), not written at the full shape and summed by
// libtorch: same values as autograd through the composition, at 1 and 2 threads, the input's own
// shape ([D] and [1, D]), and still differentiable under create_graph (recomputed there at the
// full shape).
TEST_F(CompiledElementwise, ARowInputsGradientIsSummedOverTheRowsInTheKernel) {
  torch::manual_seed(6);
  const auto rg = torch::requires_grad();
  auto x = torch::randn({64, 33}, rg), w = torch::randn({1, 33}, rg), b = torch::randn({33}, rg);
  FusedElementwise k("row_grads", {tanh(input(0) * input(1) + input(2)) * input(0)},
                     FusedElementwiseOptions().require_fused(true).grain_size(256));
  const auto up = torch::randn({64, 33});
  const auto h = torch::autograd::grad({k.reference({x, w, b})[0]}, {x, w, b}, {up});
  const int threads = at::get_num_threads();
  for (int t : {1, 2}) {
    at::set_num_threads(t);
    const auto g = torch::autograd::grad({k({x, w, b})[0]}, {x, w, b}, {up});
    EXPECT_TRUE(g[1].sizes().equals({1, 33}));
    EXPECT_TRUE(g[2].sizes().equals({33}));
    for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(near(g[i], h[i])) << "input " << i << ", " << t;
  }
  at::set_num_threads(threads);
  EXPECT_EQ(volt::jit::stats().compiles, 2);  // the forward and its backward
  // That backward is the summing variant (its cache entry's name ends in "_bwdc").
  bool summing = false;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path)) {
    summing = summing || entry.path().filename().string().rfind("row_grads_bwdc-", 0) == 0;
  }
  EXPECT_TRUE(summing);
  // Second order through the row input: the create_graph backward is another kernel.
  auto second = [&](const at::Tensor& out) {
    const auto gb = torch::autograd::grad({out.mul(up).sum()}, {b}, {}, true, true)[0];
    return torch::autograd::grad({gb.pow(2).sum()}, {x})[0];
  };
  EXPECT_TRUE(near_tol(second(k({x, w, b})[0]), second(k.reference({x, w, b})[0]), 1e-5, 1e-5));
}

// Rows of at most 31 values run 16 whole rows at a time as one stretch (the row input repeated,
// the column input spread over the block, summed gradients folded at the end); chunks that
// start mid-row, the rows before a block and after the last one take the row-by-row loop.
// Every row count around a block, at 1 and 2 threads and chunks of 7 elements, gives the
// composition's values and gradients, bit for bit where the ops are exactly rounded.
TEST_F(CompiledElementwise, ShortRowsRunSixteenRowsAtATime) {
  torch::manual_seed(12);
  const auto rg = torch::requires_grad();
  const Expr y = input(0) * input(2) + input(1);
  FusedElementwise exact("short_exact", {y * input(3) - input(0)},
                         FusedElementwiseOptions().require_fused(true).grain_size(7));
  FusedElementwise smooth("short_gelu", {gelu_tanh(y) * input(3)},
                          FusedElementwiseOptions().require_fused(true).grain_size(7));
  EXPECT_NE(
      exact
          .source({torch::randn({2, 3}), torch::randn({3}), torch::randn({2, 1}), torch::randn({})})
          .find("short_rows && i % cols == 0"),
      std::string::npos);
  const int threads = at::get_num_threads();
  for (int t : {1, 2}) {
    at::set_num_threads(t);
    for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{
             {16, 1}, {15, 10}, {16, 10}, {17, 10}, {53, 10}, {40, 31}, {40, 32}, {3, 7}}) {
      SCOPED_TRACE(std::to_string(t) + " threads, [" + std::to_string(rows) + ", " +
                   std::to_string(cols) + "]");
      auto x = torch::randn({rows, cols}, rg), b = torch::randn({cols}, rg),
           c = torch::randn({rows, 1}, rg), s = torch::randn({}, rg);
      const std::vector<at::Tensor> in{x, b, c, s};
      EXPECT_TRUE(torch::equal(exact(in)[0], exact.reference(in)[0]));
      const auto got = smooth(in)[0], want = smooth.reference(in)[0];
      EXPECT_TRUE(near_tol(got, want, 1e-6, 1e-5));
      const auto up = torch::randn({rows, cols});
      const auto g = torch::autograd::grad({got}, in, {up});
      const auto h = torch::autograd::grad({want}, in, {up});
      for (size_t i = 0; i < g.size(); ++i) {
        EXPECT_EQ(g[i].sizes(), in[i].sizes()) << i;
        EXPECT_TRUE(near_tol(g[i], h[i], 1e-4, 1e-4)) << "gradient " << i;
      }
    }
  }
  at::set_num_threads(threads);
}

// Inputs whose gradients are one expression share one output of the backward kernel, and an
// output gradient passed through unchanged (the residual's in ... + residual) is handed on
// itself, as libtorch's AddBackward does: the same tensors, not copies, and the values autograd
// computes through the composition.
TEST_F(CompiledElementwise, EqualGradientsAreOneTensorAndAPassedThroughGradientIsNotCopied) {
  torch::manual_seed(12);
  const auto rg = torch::requires_grad();
  auto x = torch::randn({40, 30}, rg), y = torch::randn({40, 30}, rg),
       res = torch::randn({40, 30}, rg);
  FusedElementwise k("shared_grads", {tanh(input(0) + input(1)) + input(2)},
                     FusedElementwiseOptions().require_fused(true));
  const auto up = torch::randn({40, 30});
  const auto g = torch::autograd::grad({k({x, y, res})[0]}, {x, y, res}, {up});
  const auto h = torch::autograd::grad({k.reference({x, y, res})[0]}, {x, y, res}, {up});
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(near(g[i], h[i])) << i;
  EXPECT_EQ(g[0].data_ptr(), g[1].data_ptr());  // one output of the kernel for x and y
  EXPECT_EQ(g[2].data_ptr(), up.data_ptr());    // the output gradient itself
  // Only passed-through gradients: no backward kernel at all.
  FusedElementwise sum("pass_through", {input(0) + input(1)},
                       FusedElementwiseOptions().require_fused(true));
  const int64_t compiles = volt::jit::stats().compiles;
  const auto p = torch::autograd::grad({sum({x, res})[0]}, {x, res}, {up});
  EXPECT_EQ(volt::jit::stats().compiles, compiles + 1);  // the forward only
  EXPECT_EQ(p[0].data_ptr(), up.data_ptr());
  EXPECT_EQ(p[1].data_ptr(), up.data_ptr());
  // Under create_graph the shared gradient stays differentiable.
  const auto g2 = torch::autograd::grad({k({x, y, res})[0]}, {x}, {up}, true, true)[0];
  const auto h2 = torch::autograd::grad({k.reference({x, y, res})[0]}, {x}, {up}, true, true)[0];
  const auto gg = torch::autograd::grad({g2.pow(2).sum()}, {y})[0];
  const auto hh = torch::autograd::grad({h2.pow(2).sum()}, {y})[0];
  EXPECT_TRUE(near_tol(gg, hh, 1e-5, 1e-4));
}

TEST_F(CompiledElementwise, SecondOrderGradientsGoThroughAFusedBackwardToo) {
  torch::manual_seed(5);
  auto x = torch::randn({64}, torch::requires_grad());
  FusedElementwise k("second_order", {tanh(input(0)) * input(0)},
                     FusedElementwiseOptions().require_fused(true));
  auto second = [&](const at::Tensor& out) {
    const auto g = torch::autograd::grad({out.sum()}, {x}, {}, true, /*create_graph=*/true)[0];
    return std::make_pair(g, torch::autograd::grad({g.sum()}, {x})[0]);
  };
  const auto [g1, gg1] = second(k({x})[0]);
  const auto [g2, gg2] = second(k.reference({x})[0]);
  EXPECT_TRUE(near(g1, g2));
  EXPECT_TRUE(near_tol(gg1, gg2, 1e-5, 1e-5));
  EXPECT_EQ(volt::jit::stats().compiles, 3);  // forward, backward, backward of the backward
}

TEST_F(CompiledElementwise, TheBackwardOutlivesTheKernelObject) {
  auto x = torch::randn({10}, torch::requires_grad());
  at::Tensor out;
  {
    FusedElementwise k("short_lived", {input(0) * input(0) * 3.0});
    out = k({x})[0];
  }
  out.sum().backward();
  EXPECT_TRUE(near(x.grad(), 6 * x.detach()));
}

TEST_F(CompiledElementwise, ChangingASavedInputInPlaceIsCaughtByAutograd) {
  auto w = torch::randn({10}, torch::requires_grad());
  auto x = torch::randn({10});
  FusedElementwise k("saved", {input(0) * exp(input(1))});
  auto out = k({w, x})[0];
  x.add_(1);  // the backward would read the new values
  EXPECT_THROW(out.sum().backward(), c10::Error);
}

TEST_F(CompiledElementwise, BadExpressionsAndInputsAreTypedErrors) {
  using volt_test::error_of;
  EXPECT_NE(error_of<volt::ValueError>([] {
              FusedElementwise("bad name!", {input(0)});
            }).find("is not 1-64 letters"),
            std::string::npos);
  EXPECT_NE(error_of<volt::ValueError>([] { FusedElementwise("none", {}); }).find("no outputs"),
            std::string::npos);
  EXPECT_NE(error_of<volt::ValueError>([] { input(-1); }).find("is negative"), std::string::npos);
  EXPECT_NE(error_of<volt::ConfigError>([] {
              FusedElementwise("g", {input(0)}, FusedElementwiseOptions().grain_size(0));
            }).find("grain_size=0"),
            std::string::npos);
  FusedElementwise k("two", {input(0) + input(1)});
  EXPECT_NE(error_of<volt::ValueError>([&] {
              k({torch::randn({3})});
            }).find("takes 2 inputs (input(0) .. input(1)), got 1"),
            std::string::npos);
  EXPECT_NE(error_of<volt::ValueError>([&] {
              k({torch::randn({3}), torch::randn({4})});
            }).find("does not broadcast"),
            std::string::npos);
  EXPECT_NE(error_of<volt::ValueError>([&] {
              k({torch::randn({3}), at::Tensor()});
            }).find("undefined tensor"),
            std::string::npos);
  EXPECT_NE(error_of<volt::ValueError>([&] { k.reference({torch::randn({3})}); }).find("got 1"),
            std::string::npos);
}

TEST_F(CompiledElementwise, DeepExpressionsNeitherOverflowTheStackNorGrowWithoutBound) {
  // 200000 nodes: building, refusing and freeing them must not recurse per node.
  {
    Expr e = input(0);
    for (int i = 0; i < 200000; ++i) e = e * 1.0001;
    const auto msg = volt_test::error_of<volt::ValueError>([&] { FusedElementwise("deep", {e}); });
    EXPECT_NE(msg.find("more than the 65536 one generated loop takes"), std::string::npos) << msg;
  }
  // Under the limit, the composition evaluates a long chain without recursing either.
  Expr e = input(0);
  for (int i = 0; i < 30000; ++i) e = e + 1.0;
  FusedElementwise k("long_chain", {e});
  EXPECT_TRUE(torch::equal(k.reference({torch::zeros({3})})[0], torch::full({3}, 30000.0f)));
}

// volt_jit_worker sits beside this test binary.
std::string jit_worker() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  std::string self(buf, n > 0 ? static_cast<size_t>(n) : 0);
  return self.substr(0, self.find_last_of('/')) + "/volt_jit_worker";
}

TEST_F(CompiledElementwise, AnotherProcessLoadsTheKernelFromTheFolderInsteadOfCompiling) {
  volt_test::Process first(jit_worker(), {"kernel", "shared_gelu"});
  ASSERT_EQ(first.exit_code(std::chrono::seconds(120)), 0) << first.output();
  EXPECT_NE(first.output().find("compiles=1 disk_hits=0"), std::string::npos) << first.output();
  volt_test::Process second(jit_worker(), {"kernel", "shared_gelu"});
  ASSERT_EQ(second.exit_code(std::chrono::seconds(120)), 0) << second.output();
  EXPECT_NE(second.output().find("compiles=0 disk_hits=1"), std::string::npos) << second.output();
}

// Hardened machines mount /tmp noexec, and dlopen cannot map code from such a folder. With both
// the compiler's folder (TMPDIR) and the kernel cache on a noexec tmpfs, mounted in a private
// mount namespace (root and unshare; skipped otherwise), a kernel still runs compiled, and a
// second process loads it from the cache folder instead of compiling it again.
TEST_F(CompiledElementwise, KernelsRunCompiledFromFoldersMountedNoexec) {
  if (::geteuid() != 0) {
    GTEST_SKIP() << "needs root to mount a noexec tmpfs in a private mount namespace";
  }
  if (::access("/usr/bin/unshare", X_OK) != 0) GTEST_SKIP() << "needs /usr/bin/unshare";
  volt_test::TempDir dir;
  const std::string d = "'" + dir.path + "'";
  const std::string worker = "'" + jit_worker() + "' kernel noexec_gelu";
  // The mount must really be noexec: read from /proc/self/mounts (no findmnt needed).
  const std::string script = "mount -t tmpfs -o noexec,size=64m volt-noexec " + d +
                             " || exit 77\n" + "awk -v d=" + d +
                             " '$2 == d && $4 ~ /(^|,)noexec(,|$)/ {ok = 1} END {exit !ok}' "
                             "/proc/self/mounts || exit 3\n" +
                             "export TMPDIR=" + d + " VOLT_KERNEL_CACHE_CONFIG='" + dir.path +
                             "/kernels,false,64'\n" + worker + " && " + worker + "\n";
  volt_test::Process p("/usr/bin/unshare",
                       {"--mount", "--propagation", "private", "sh", "-c", script});
  const int rc = p.exit_code(std::chrono::seconds(120));
  if (rc == 77 || (rc == 1 && p.output().find("unshare:") != std::string::npos)) {
    GTEST_SKIP() << "cannot mount a noexec tmpfs here: " << p.output();
  }
  ASSERT_EQ(rc, 0) << p.output();
  EXPECT_NE(p.output().find("kernels load through memory files"), std::string::npos) << p.output();
  EXPECT_NE(p.output().find("compiles=1 disk_hits=0 memory_hits=0 fallbacks=0"), std::string::npos)
      << p.output();
  EXPECT_NE(p.output().find("compiles=0 disk_hits=1 memory_hits=0 fallbacks=0"), std::string::npos)
      << p.output();
}

// Processes writing into one folder over its cap at once, as the ranks of a job do: the folder
// ends under the cap and within one entry of it, and every entry left is whole.
TEST_F(CompiledElementwise, ProcessesSharingAKernelFolderKeepItCoherent) {
  volt_test::TempDir folder;
  constexpr int kOld = 300, kProcesses = 4;
  constexpr int64_t kEntry = 5 * 1024;
  auto content = [](const std::string& key) {
    std::string b(kEntry, '\0');
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<char>(key[i % key.size()] + i % 7);
    return b;
  };
  for (int i = 0; i < kOld; ++i) {
    const std::string key = "old" + std::to_string(i) + ".so";
    std::ofstream(folder / key, std::ios::binary) << content(key);
    struct timespec t[2] = {{0, UTIME_OMIT}, {1000000 + i, 0}};  // long ago, old0 oldest
    ASSERT_EQ(::utimensat(AT_FDCWD, (folder / key).c_str(), t, 0), 0);
  }
  std::vector<std::unique_ptr<volt_test::Process>> procs;
  for (int p = 0; p < kProcesses; ++p) {
    procs.push_back(std::make_unique<volt_test::Process>(
        jit_worker(),
        std::vector<std::string>{"store", folder.path, "new" + std::to_string(p) + ".so",
                                 std::to_string(kEntry)}));
  }
  for (auto& p : procs) ASSERT_EQ(p->exit_code(std::chrono::seconds(120)), 0) << p->output();
  volt::KernelCache view(volt::KernelCacheOptions(folder.path).size_mb(1));
  int64_t total = 0;
  for (const auto& e : view.entries()) {
    total += e.bytes;
    EXPECT_EQ(volt_test::file_text(folder / e.key), content(e.key)) << e.key;
  }
  const int64_t limit = (int64_t{1} << 20) * 99 / 100;
  EXPECT_LE(total, limit);
  EXPECT_GT(total, limit - kEntry);
}

TEST_F(CompiledElementwise, OutputsNeverAliasInputs) {
  const auto x = torch::randn({5});
  FusedElementwise k("identity", {input(0), Expr(2.0)});
  for (const auto& out : {k({x}), k.reference({x})}) {
    EXPECT_TRUE(torch::equal(out[0], x));
    EXPECT_NE(out[0].data_ptr(), x.data_ptr());
    EXPECT_TRUE(torch::equal(out[1], torch::full({5}, 2.0f)));
  }
}

TEST_F(CompiledElementwise, TheSourceIsOneLoopWithoutTheKeyLine) {
  FusedElementwise k("src", {input(0) * input(1) + input(2)});
  const auto s = k.source({torch::randn({2, 3}), torch::randn({3}), torch::randn({1})});
  EXPECT_NE(s.find("in[1] + col"), std::string::npos) << s;                 // the row input
  EXPECT_NE(s.find("const float v2 = in[2][0];"), std::string::npos) << s;  // hoisted scalar
  EXPECT_EQ(s.find("volt_jit_key"), std::string::npos);
}

}  // namespace
