// TracedFunction: recorded graphs with their elementwise chains fused, against the same function
// run eagerly (bit for bit where the fused ops are exactly rounded, a few ulp otherwise), with
// gradients; the partition's rules (shapes, chains around other ops, in-place and random ops in
// their order); signatures, retraces and eviction; the unfused reference; and the error paths.
// Each test runs in its own process with a private KernelCache folder.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/autocast_mode.h>

#include <set>
#include <thread>

#include "error_text.h"
#include "near.h"
#include "scoped_env.h"
#include "tiny.h"
#include "trace_and_check.h"
#include "volt/kernels/fused_bias_activation.h"
#include "volt/kernels/fused_elementwise.h"
#include "volt/kernels/kernel_cache.h"
#include "volt/kernels/traced_function.h"

namespace {

using volt::TracedFunction;
using volt::TraceOptions;
using Tensors = std::vector<at::Tensor>;

struct Traced : ::testing::Test {
  // The cache writes in the background: let it finish before the folder is removed.
  ~Traced() override { volt::KernelCache::global().flush(); }
  volt_test::TempDir dir;
  volt_test::ScopedEnv env{"VOLT_KERNEL_CACHE_CONFIG", dir.path + ",false,64"};
};

bool has(const std::string& text, const std::string& phrase) {
  return text.find(phrase) != std::string::npos;
}

using volt_test::near;

using volt_test::trace_and_check;

// Traces fn through `f` and checks the trace, replays it, and compares each output of the replay
// with fn's own, bit for bit.
void expect_replay_equals_eager(const TracedFunction& f, const TracedFunction::Fn& fn,
                                const Tensors& in) {
  trace_and_check(f, in);
  const int64_t hits = f.stats().hits;
  const Tensors got = f(in);
  ASSERT_EQ(f.stats().hits, hits + 1) << "not a replay";
  const Tensors want = fn(in);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].sizes(), want[i].sizes()) << "output " << i;
    EXPECT_TRUE(torch::equal(got[i], want[i])) << "output " << i;
  }
}

// Only exactly rounded ops (+ - * with alpha 1, max, relu): the fused loop gives libtorch's bits.
Tensors exact_chain(const Tensors& in) {
  const auto& a = in[0];
  const auto& b = in[1];
  const auto& c = in[2];
  auto y = a * b + c;
  auto r = torch::relu(y);
  auto z = r - 0.5 * a;
  return {torch::maximum(z, c) * 3.0};
}

TEST_F(Traced, AChainOfExactOpsIsOneFusedLoopWithLibtorchsBits) {
  TracedFunction f("exact", exact_chain);
  const Tensors in = {torch::randn({64, 33}), torch::randn({64, 33}), torch::randn({33})};
  const at::Tensor eager = exact_chain(in)[0];
  EXPECT_TRUE(torch::equal(f(in)[0], eager));  // the tracing call runs the function itself
  EXPECT_TRUE(torch::equal(f(in)[0], eager));  // so does the call that checks the trace
  const auto before = volt::jit::stats();
  EXPECT_TRUE(torch::equal(f(in)[0], eager));  // replayed: one compiled loop
  EXPECT_TRUE(torch::equal(f(in)[0], eager));
  EXPECT_EQ(volt::jit::stats().fallbacks, before.fallbacks);
  const std::string text = f.describe(in);
  EXPECT_TRUE(has(text, "7 ops, 7 of them in 1 fused chain")) << text;
  EXPECT_TRUE(has(text,
                  "fused 'exact_g0': 7 ops (mul add relu mul sub maximum mul), 3 inputs, "
                  "1 outputs"))
      << text;
  const auto s = f.stats();
  EXPECT_EQ(s.traces, 1);
  EXPECT_EQ(s.checks, 1);
  EXPECT_EQ(s.hits, 2);  // the two replays (describe's lookup is not a call)
  EXPECT_EQ(s.kept, 1);
}

// Linear -> GELU(tanh) written as ops -> Linear, plus a residual scaled by a learned vector.
struct Block : torch::nn::Module {
  Block() {
    fc1 = register_module("fc1", torch::nn::Linear(16, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 16));
    scale = register_parameter("scale", torch::full({16}, 0.5));
  }
  at::Tensor forward(const at::Tensor& x) {
    auto h = fc1->forward(x);
    h = 0.5 * h * (1.0 + torch::tanh(0.7978845608028654 * (h + 0.044715 * h * h * h)));
    return x + scale * torch::sigmoid(fc2->forward(h));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  at::Tensor scale;
};

TEST_F(Traced, AModulesForwardAndGradientsMatchEagerAndSeeParameterUpdates) {
  torch::manual_seed(0);
  auto block = std::make_shared<Block>();
  TracedFunction f("block", block,
                   [&](const Tensors& in) { return Tensors{block->forward(in[0])}; });
  const auto x = torch::randn({8, 16});
  f({x});  // the trace
  EXPECT_TRUE(has(f.describe({x}), "2 fused chains")) << f.describe({x});

  // x with requires_grad is another signature: traced at step 0, checked at step 1, replayed.
  torch::optim::SGD opt(block->parameters(), 0.1);
  for (int step = 0; step < 4; ++step) {
    const auto xs = x.clone().requires_grad_(true);
    opt.zero_grad();
    const auto eager = block->forward(xs);
    (eager * eager).sum().backward();
    Tensors eager_grads{xs.grad().clone()};
    for (const auto& p : block->parameters()) eager_grads.push_back(p.grad().clone());

    const auto xt = x.clone().requires_grad_(true);
    opt.zero_grad();
    const auto traced = f({xt})[0];
    ASSERT_TRUE(near(traced, eager)) << "step " << step;
    (traced * traced).sum().backward();
    ASSERT_TRUE(near(xt.grad(), eager_grads[0]));
    size_t i = 1;
    for (const auto& p : block->parameters()) {
      ASSERT_TRUE(near(p.grad(), eager_grads[i++])) << "step " << step << " parameter " << i - 1;
    }
    opt.step();  // in place: the next replay reads the updated parameters
  }
  // x without and then with requires_grad: two signatures.
  EXPECT_EQ(f.stats().traces, 2);
  EXPECT_EQ(f.stats().hits, 2);
}

TEST_F(Traced, AChainAroundAnotherOpIsSplitSoNothingRunsBeforeItsInputs) {
  // v joins u's chain; r cannot (its input m needs u's chain first): r runs after the chain.
  auto fn = [](const Tensors& in) {
    auto u = in[0] * 2.0;
    auto m = torch::mm(u, in[1]);
    auto v = u + 1.0;
    auto r = m * v;
    return Tensors{r, v};
  };
  TracedFunction f("around", fn);
  const Tensors in = {torch::randn({12, 12}), torch::randn({12, 12})};
  expect_replay_equals_eager(f, fn, in);
  const std::string text = f.describe(in);
  EXPECT_TRUE(has(text, "4 ops, 2 of them in 1 fused chain")) << text;
  EXPECT_TRUE(has(text, "(mul add), 1 inputs, 2 outputs")) << text;
}

TEST_F(Traced, OpsOfAnotherShapeStartTheirOwnChain) {
  // bias * 2 has the bias's shape, x + it the batch's: separate chains, each the right shape.
  auto fn = [](const Tensors& in) {
    auto b = in[1] * 2.0 + 1.0;
    return Tensors{torch::relu(in[0] + b) * 3.0, b};
  };
  TracedFunction f("shapes", fn);
  const Tensors in = {torch::randn({5, 7}), torch::randn({7})};
  expect_replay_equals_eager(f, fn, in);
  EXPECT_TRUE(has(f.describe(in), "2 fused chains")) << f.describe(in);
}

TEST_F(Traced, InPlaceAndRandomOpsRunInTheirRecordedOrder) {
  auto fn = [](const Tensors& in) {
    auto t = in[0] * 2.0;
    auto s = t + 1.0;
    t.mul_(3.0);  // s was computed before this write, u after it
    auto u = t * s + 1.0;
    // A write through a view: the trace still names the viewed tensor `a`, so only the order
    // of the steps keeps `c` (after the write) from being computed with `b` (before it).
    auto a = in[0] * 0.5;
    auto b = a + 2.0;
    a.view({-1}).add_(1.0);
    auto c = a * 4.0 + b;
    auto d1 = torch::dropout(u * 0.5 + 0.25, 0.5, /*train=*/true);
    auto d2 = torch::dropout(d1 * 3.0 - 1.0, 0.3, /*train=*/true);
    return Tensors{d2, s, c};
  };
  TracedFunction f("ordered", fn);
  const Tensors in = {torch::randn({40, 30})};
  trace_and_check(f, in);
  torch::manual_seed(7);
  const Tensors want = fn(in);
  torch::manual_seed(7);
  const Tensors got = f(in);
  EXPECT_TRUE(near(got[0], want[0]));
  EXPECT_TRUE(torch::equal(got[0] == 0, want[0] == 0));  // the same dropout masks
  EXPECT_TRUE(torch::equal(got[1], want[1]));
  EXPECT_TRUE(torch::equal(got[2], want[2]));
  EXPECT_TRUE(has(f.describe(in), "fused chains")) << f.describe(in);
}

TEST_F(Traced, ListsAndUnpackedListsRunAsRecorded) {
  // cat takes a list of tensors, chunk returns one (the trace unpacks it), view a list of ints.
  auto fn = [](const Tensors& in) {
    auto parts = torch::chunk(in[0] * 2.0 + 1.0, 2, 1);
    auto joined = torch::cat({parts[1], torch::relu(parts[0]) * 3.0}, 0);
    return Tensors{joined.view({-1, 3}) - 1.0, parts[0]};
  };
  TracedFunction f("lists", fn);
  const Tensors in = {torch::randn({4, 6})};
  expect_replay_equals_eager(f, fn, in);
  const std::string text = f.describe(in);
  EXPECT_TRUE(has(text, "prim::ListUnpack")) << text;
  EXPECT_TRUE(has(text, "prim::ListConstruct")) << text;
}

TEST_F(Traced, EachSignatureHasItsTraceAndTheLeastRecentlyUsedIsDropped) {
  TracedFunction f("sig", exact_chain, TraceOptions().max_traces(2));
  auto inputs = [](int64_t n) {
    return Tensors{torch::randn({n, 4}), torch::randn({n, 4}), torch::randn({4})};
  };
  const auto a = inputs(3);
  const auto b = inputs(5);
  const auto c = inputs(9);
  for (const auto& in : {a, b, a, c, a, b}) {
    EXPECT_TRUE(torch::equal(f(in)[0], exact_chain(in)[0]));
  }
  // a, b traced; a checked; c traced and b dropped; a hit; b traced again and c dropped.
  const auto s = f.stats();
  EXPECT_EQ(s.traces, 4);
  EXPECT_EQ(s.checks, 1);
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.evictions, 2);
  EXPECT_EQ(s.kept, 2);
  // A different dtype is another signature too, and runs unfused (float32 only).
  const Tensors d = {a[0].to(at::kDouble), a[1].to(at::kDouble), a[2].to(at::kDouble)};
  trace_and_check(f, d);
  EXPECT_TRUE(torch::equal(f(d)[0], exact_chain(d)[0]));
  EXPECT_TRUE(has(f.describe(d), "0 of them in 0 fused chains")) << f.describe(d);
}

TEST_F(Traced, TheModulesTrainingModeIsPartOfTheSignature) {
  auto net =
      std::make_shared<torch::nn::Sequential>(torch::nn::Linear(6, 6), torch::nn::Dropout(0.5));
  auto module = net->ptr();
  TracedFunction f("mode", module, [&](const Tensors& in) {
    return Tensors{torch::relu((*net)->forward(in[0]) * 2.0 + 1.0)};
  });
  const auto x = torch::randn({50, 6});
  module->eval();
  trace_and_check(f, {x});
  const auto eval_out = f({x})[0];
  EXPECT_TRUE(near(eval_out, torch::relu((*net)->forward(x) * 2.0 + 1.0)));
  module->train();
  const auto train_out = f({x})[0];
  EXPECT_GT((train_out == 1.0).sum().item<int64_t>(), 0);  // dropped entries: relu(0 * 2 + 1)
  EXPECT_EQ(f.stats().traces, 2);
  module->eval();
  EXPECT_TRUE(near(f({x})[0], eval_out));
  EXPECT_EQ(f.stats().traces, 2);
}

TEST_F(Traced, AutocastsStateIsPartOfTheSignature) {
  auto fn = [](const Tensors& in) { return Tensors{torch::mm(in[0], in[1]) * 2.0 + 1.0}; };
  TracedFunction f("autocast", fn);
  const Tensors in = {torch::randn({8, 8}), torch::randn({8, 8})};
  trace_and_check(f, in);
  EXPECT_TRUE(torch::equal(f(in)[0], fn(in)[0]));
  {
    at::autocast::set_cpu_enabled(true);
    at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
    const at::Tensor want = fn(in)[0];
    trace_and_check(f, in);
    const at::Tensor got = f(in)[0];
    at::autocast::clear_cache();
    at::autocast::set_cpu_enabled(false);
    EXPECT_EQ(got.scalar_type(), want.scalar_type());
    EXPECT_EQ(want.scalar_type(), at::kBFloat16);
    EXPECT_TRUE(torch::equal(got, want));
  }
  EXPECT_EQ(f(in)[0].scalar_type(), at::kFloat);
  EXPECT_EQ(f.stats().traces, 2);
}

TEST_F(Traced, TheReferenceRunsTheRecordedOpsUnfused) {
  TracedFunction f("reference", exact_chain, TraceOptions().fuse(false));
  const Tensors in = {torch::randn({6, 5}), torch::randn({6, 5}), torch::randn({5})};
  trace_and_check(f, in);
  EXPECT_TRUE(torch::equal(f(in)[0], exact_chain(in)[0]));
  EXPECT_TRUE(has(f.describe(in), "7 ops, 0 of them in 0 fused chains, 7 steps")) << f.describe(in);
  // min_fused_ops 1 fuses a lone op; a high one fuses nothing.
  TracedFunction one(
      "single", [](const Tensors& in) { return Tensors{torch::tanh(in[0])}; },
      TraceOptions().min_fused_ops(1));
  EXPECT_TRUE(has(one.describe({in[0]}), "1 of them in 1 fused chain")) << one.describe({in[0]});
  EXPECT_TRUE(near(one({in[0]})[0], torch::tanh(in[0])));
  TracedFunction none("long", exact_chain, TraceOptions().min_fused_ops(8));
  EXPECT_TRUE(has(none.describe(in), "0 of them in 0 fused chains")) << none.describe(in);
}

TEST_F(Traced, TheFusedOpsTranslateAsLibtorchComputesThem) {
  auto fn = [](const Tensors& in) {
    const auto& x = in[0];
    const auto& y = in[1];
    Tensors out;
    out.push_back(torch::gelu(x * 1.0, "none") + torch::gelu(x * 1.0, "tanh"));
    out.push_back(torch::silu(x + 0.0) - torch::leaky_relu(x * 1.0, 0.1));
    out.push_back(torch::clamp(x * 2.0, -1.0, 1.5) +
                  torch::clamp_min(x, 0.2) * torch::clamp_max(y, 0.3));
    out.push_back(torch::pow(x.abs() + 1.0, 2) + torch::pow(y.abs() + 1.0, 3) +
                  torch::pow(x.abs() + 0.5, 0.5) + torch::pow(y.abs() + 0.5, -1));
    out.push_back(torch::rsqrt(x.abs() + 1.0) * torch::reciprocal(y.abs() + 1.0) +
                  torch::square(x - y) + torch::erf(x) / torch::exp(-y.abs()));
    out.push_back(torch::rsub(x, y, 2.0) + torch::sub(x, 1.5, 0.5) + torch::add(y, x, 3.0) -
                  torch::log(y.abs() + 1.0) + torch::minimum(x, y).neg() + torch::sigmoid(x));
    return out;
  };
  TracedFunction f(
      "ops", fn, TraceOptions().fused_options(volt::FusedElementwiseOptions().require_fused(true)));
  torch::manual_seed(5);
  const Tensors in = {torch::randn({32, 17}), torch::randn({32, 17})};
  trace_and_check(f, in);
  const Tensors got = f(in);
  const Tensors want = fn(in);
  // The terms of each output cancel: an ulp of a term of 20 can be 40 ulp of a sum of 0.1 (CI
  // drew such inputs, session 83, before the seed), so the tolerance follows the largest value.
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(volt_test::near_in_scale(got[i], want[i])) << "output " << i;
  }
  const std::string text = f.describe(in);
  EXPECT_FALSE(has(text, "\n  aten::")) << text;  // every op fused, one chain per output
  EXPECT_TRUE(has(text, "in 6 fused chains")) << text;
}

TEST_F(Traced, BadFunctionsAndOptionsAreTypedErrors) {
  using volt_test::error_of;
  EXPECT_TRUE(has(error_of<volt::ValueError>([] { TracedFunction("bad name", exact_chain); }),
                  "is not a name"));
  EXPECT_TRUE(
      has(error_of<volt::ValueError>([] { TracedFunction(std::string(57, 'a'), exact_chain); }),
          "1-56 letters"));
  EXPECT_TRUE(has(error_of<volt::ValueError>([] { TracedFunction("f", TracedFunction::Fn()); }),
                  "empty function"));
  EXPECT_TRUE(has(error_of<volt::ConfigError>(
                      [] { TracedFunction("f", exact_chain, TraceOptions().min_fused_ops(0)); }),
                  "min_fused_ops must be >= 1"));
  EXPECT_TRUE(has(error_of<volt::ConfigError>(
                      [] { TracedFunction("f", exact_chain, TraceOptions().max_traces(0)); }),
                  "max_traces must be >= 1"));
  EXPECT_TRUE(has(error_of<volt::ConfigError>(
                      [] { TracedFunction("f", exact_chain, TraceOptions().check_calls(-1)); }),
                  "check_calls must be >= 0"));

  // A tensor that needs a gradient read from outside the inputs.
  const auto w = torch::randn({4}).requires_grad_(true);
  TracedFunction captures("captures", [&](const Tensors& in) { return Tensors{in[0] * w}; });
  const std::string e = error_of<volt::ValueError>([&] { captures({torch::randn({4})}); });
  EXPECT_TRUE(has(e, "could not be traced")) << e;
  EXPECT_TRUE(has(e, "as an input")) << e;
  EXPECT_EQ(captures.stats().traces, 0);

  TracedFunction nothing("nothing", [](const Tensors&) { return Tensors{}; });
  EXPECT_TRUE(has(error_of<volt::ValueError>([&] { nothing({torch::randn({2})}); }),
                  "returned no tensors"));
  TracedFunction undefined("undefined", [](const Tensors&) { return Tensors{at::Tensor()}; });
  EXPECT_TRUE(has(error_of<volt::ValueError>([&] { undefined({torch::randn({2})}); }),
                  "returned an undefined tensor"));
  TracedFunction ok("ok", exact_chain);
  EXPECT_TRUE(has(error_of<volt::ValueError>([&] {
                    ok({torch::randn({2}), at::Tensor(), torch::randn({2})});
                  }),
                  "undefined tensor as an input"));

  // A value read on the host while traced: the trace would keep it (and the branch) fixed.
  TracedFunction reads("reads", [](const Tensors& in) {
    return Tensors{in[0].sum().item<double>() > 0 ? in[0] * 2 : in[0] * 3};
  });
  const std::string r = error_of<volt::ValueError>([&] { reads({torch::ones({3})}); });
  EXPECT_TRUE(has(r, "read a tensor's value on the host while traced")) << r;
  EXPECT_TRUE(has(r, "item(), float() or bool() of a tensor")) << r;
  TracedFunction condition("condition", [](const Tensors& in) {
    return Tensors{in[0].sum().gt(0).is_nonzero() ? in[0] : -in[0]};
  });
  EXPECT_TRUE(has(error_of<volt::ValueError>([&] { condition({torch::ones({3})}); }),
                  "aten::is_nonzero: a tensor used as a condition"));
  EXPECT_EQ(reads.stats().traces + condition.stats().traces, 0);

  std::ostringstream os;
  os << TraceOptions().max_traces(3);
  EXPECT_TRUE(has(os.str(), "TraceOptions(min_fused_ops=2, max_traces=3, check_calls=1, fuse=true"))
      << os.str();
}

}  // namespace

namespace {

// A result written through a data pointer into a tensor from an `empty` op is invisible to the
// tracer: a replay would return whatever memory the replayed `empty` got. Refused; filling such
// a tensor with a recorded op (through a view too) is fine.
TEST_F(Traced, MemoryFilledOutsideLibtorchsOpsIsRefusedAndRecordedWritesAreNot) {
  using volt_test::error_of;
  auto pointer_copy = [](const Tensors& in) {
    at::Tensor out = at::empty_like(in[0]);
    const at::Tensor src = (in[0] * 2).contiguous();
    std::copy(src.data_ptr<float>(), src.data_ptr<float>() + src.numel(), out.data_ptr<float>());
    return Tensors{out + 1};
  };
  TracedFunction hidden("hidden", pointer_copy);
  const std::string e = error_of<volt::ValueError>([&] { hidden({torch::randn({4, 4})}); });
  EXPECT_TRUE(has(e, "reads a tensor made by aten::empty_like that no recorded op wrote")) << e;
  EXPECT_EQ(hidden.stats().traces, 0);

  auto recorded = [](const Tensors& in) {
    at::Tensor out = at::empty({8, 4});
    out.narrow(0, 0, 4).copy_(in[0] * 2);  // written through views, by recorded ops
    out.narrow(0, 4, 4).fill_(1);
    at::Tensor acc = at::empty_like(in[0]);
    at::mul_out(acc, in[0], in[0]);              // an out= op writes it
    const at::Tensor shape = at::empty({4, 4});  // only its sizes are read
    const at::Tensor z = at::zeros_like(shape) + in[0].view_as(shape);
    return Tensors{out.sum(0) + acc.sum(0) + z.sum(0)};
  };
  TracedFunction visible("visible", recorded);
  const Tensors in = {torch::randn({4, 4})};
  trace_and_check(visible, in);
  EXPECT_TRUE(torch::allclose(visible(in)[0], recorded(in)[0]));
}

// volt's fused kernels run their reference compositions while traced, so the trace holds their
// computation (and fuses its elementwise part); their own loops run when called eagerly.
TEST_F(Traced, VoltsFusedKernelsAreTracedThroughTheirReferences) {
  volt::FusedElementwise kernel("inner", {volt::jit::tanh(volt::jit::input(0) * 2.0)});
  auto fn = [&](const Tensors& in) {
    return Tensors{kernel({in[0]})[0] + 1.0,
                   volt::fused_linear_activation(in[0], in[1], in[2], volt::Activation::kSilu)};
  };
  TracedFunction f("outer", fn);
  const Tensors in = {torch::randn({16, 8}), torch::randn({8, 8}), torch::randn({8})};
  trace_and_check(f, in);
  const Tensors got = f(in);
  const Tensors want = fn(in);
  EXPECT_TRUE(near(got[0], want[0])) << (got[0] - want[0]).abs().max();
  EXPECT_TRUE(near(got[1], want[1])) << (got[1] - want[1]).abs().max();
  const std::string text = f.describe(in);
  EXPECT_TRUE(has(text, "aten::tanh")) << text;  // the reference's ops were recorded
  EXPECT_TRUE(has(text, "fused 'outer_g")) << text;
}

// A function whose ops depend on something besides its inputs: the call after the trace runs it
// under the tracer again, and a difference is a ValueError naming it, the trace dropped (the
// next call traces again). Random ops and inputs changed in place are no difference.
TEST_F(Traced, ACallThatRunsOtherOpsThanItsTraceIsAnErrorNamingTheDifference) {
  using volt_test::error_of;
  const Tensors in = {torch::randn({4, 6})};
  int calls = 0;
  TracedFunction branch("branch", [&](const Tensors& x) {
    return Tensors{++calls % 2 == 1 ? x[0] * 2.0 : x[0] + 1.0};  // a branch on a counter
  });
  EXPECT_TRUE(torch::equal(branch(in)[0], in[0] * 2.0));
  std::string e = error_of<volt::ValueError>([&] { branch(in); });
  EXPECT_TRUE(has(e,
                  "[TracedFunction] 'branch' ran other ops on a later call with the same "
                  "input signature than when it was traced: op 1 of this call is "
                  "`aten::add(input 0, 1, 1)` where the trace has `aten::mul(input 0, 2)`"))
      << e;
  EXPECT_TRUE(has(e, "a counter, a step or batch index")) << e;
  EXPECT_EQ(branch.stats().checks, 1);
  EXPECT_EQ(branch.stats().kept, 0);
  EXPECT_TRUE(torch::equal(branch(in)[0], in[0] * 2.0));  // traced again
  EXPECT_EQ(branch.stats().traces, 2);
  error_of<volt::ValueError>([&] { branch(in); });
  EXPECT_EQ(branch.stats().hits, 0);  // never replayed

  // A number computed on the host: the same op with another constant.
  TracedFunction scaled("scaled",
                        [&](const Tensors& x) { return Tensors{x[0] * (0.5 * ++calls)}; });
  calls = 0;
  scaled(in);
  e = error_of<volt::ValueError>([&] { scaled(in); });
  EXPECT_TRUE(has(e, "op 1 of this call is `aten::mul(input 0, 1)")) << e;
  EXPECT_TRUE(has(e, "where the trace has `aten::mul(input 0, 0.5)")) << e;

  // More ops than the trace.
  TracedFunction longer("longer", [&](const Tensors& x) {
    auto y = x[0] * 2.0;
    if (++calls > 1) y = y.exp();
    return Tensors{y};
  });
  calls = 0;
  longer(in);
  e = error_of<volt::ValueError>([&] { longer(in); });
  EXPECT_TRUE(has(e, "after 1 equal ops, this call ran `aten::exp(op 1)")) << e;
  EXPECT_TRUE(has(e, "where the trace has `return (op 1)`")) << e;

  // A tensor read from outside the inputs, replaced by one with other values: the trace would
  // keep reading the old one. Changed in place, or replaced by equal values (NaN too), it is
  // the same.
  at::Tensor scale = torch::full({6}, 2.0);
  TracedFunction member("member", [&](const Tensors& x) { return Tensors{x[0] * scale}; });
  member(in);
  scale = torch::full({6}, 3.0);
  e = error_of<volt::ValueError>([&] { member(in); });
  EXPECT_TRUE(has(e,
                  "constant tensor 1 (Float[6], a tensor the function read that is not an "
                  "input) holds other values than at the trace"))
      << e;
  member(in);  // traced again with the new tensor
  scale.mul_(2.0);
  EXPECT_TRUE(torch::equal(member(in)[0], in[0] * 6.0));  // checked: the same tensor
  EXPECT_TRUE(torch::equal(member(in)[0], in[0] * 6.0));  // replayed
  EXPECT_EQ(member.stats().traces, 2);
  at::Tensor nan = torch::full({6}, NAN);
  TracedFunction nans("nans", [&](const Tensors& x) { return Tensors{x[0] + nan}; });
  nans(in);
  nan = torch::full({6}, NAN);
  EXPECT_TRUE(nans(in)[0].isnan().all().item<bool>());
  EXPECT_EQ(nans.stats().checks, 1);
  EXPECT_EQ(nans.stats().kept, 1);

  // Random ops draw other numbers, not other ops: no difference.
  TracedFunction dropout("dropout", [](const Tensors& x) {
    return Tensors{torch::dropout(x[0] * 2.0 + 1.0, 0.5, /*train=*/true)};
  });
  for (int i = 0; i < 3; ++i) dropout(in);
  EXPECT_EQ(dropout.stats().checks, 1);
  EXPECT_EQ(dropout.stats().hits, 1);

  // A host read that starts after the trace: the checked call's own error, the trace dropped.
  TracedFunction reads("reads_later", [&](const Tensors& x) {
    return Tensors{++calls > 1 && x[0].sum().item<double>() > 1e9 ? x[0] : x[0] * 2.0};
  });
  calls = 0;
  reads(in);
  e = error_of<volt::ValueError>([&] { reads(in); });
  EXPECT_TRUE(has(e, "read a tensor's value on the host while traced")) << e;
  EXPECT_EQ(reads.stats().kept, 0);
}

// How many calls are checked: check_calls after each trace, and the next one after recheck().
// A difference that first shows on an unchecked call is replayed unseen.
TEST_F(Traced, CheckCallsAndRecheckChooseTheCheckedCalls) {
  using volt_test::error_of;
  const Tensors in = {torch::randn({3, 5})};
  int step = 0;  // the caller's step: the function changes at step 4
  auto later = [&](const Tensors& x) { return Tensors{step >= 4 ? x[0] * 3.0 : x[0] * 2.0}; };
  TracedFunction f("later", later);
  for (step = 0; step < 6; ++step) EXPECT_TRUE(torch::equal(f(in)[0], in[0] * 2.0)) << step;
  EXPECT_EQ(f.stats().checks, 1);  // step 1; steps 4 and 5 replayed the stale trace
  EXPECT_EQ(f.stats().hits, 4);
  f.recheck();
  const std::string e = error_of<volt::ValueError>([&] { f(in); });
  EXPECT_TRUE(has(e, "`aten::mul(input 0, 3)")) << e;
  EXPECT_EQ(f.stats().checks, 2);

  TracedFunction none("unchecked", later, TraceOptions().check_calls(0));
  for (step = 0; step < 6; ++step) EXPECT_TRUE(torch::equal(none(in)[0], in[0] * 2.0)) << step;
  EXPECT_EQ(none.stats().checks, 0);
  EXPECT_EQ(none.stats().hits, 5);

  TracedFunction three("three", later, TraceOptions().check_calls(3));
  for (step = 0; step < 4; ++step) three(in);
  EXPECT_EQ(three.stats().checks, 3);
  EXPECT_EQ(three.stats().hits, 0);
  three.recheck();
  EXPECT_TRUE(has(error_of<volt::ValueError>([&] { three(in); }), "`aten::mul(input 0, 3)"));
}

TEST_F(Traced, TheSignatureIsTheTracesKey) {
  TracedFunction f("sig", exact_chain);
  const Tensors a = {torch::randn({3, 4}), torch::randn({3, 4}), torch::randn({4})};
  const Tensors b = {torch::randn({3, 4}), torch::randn({3, 4}), torch::randn({4})};
  const Tensors c = {torch::randn({5, 4}), torch::randn({5, 4}), torch::randn({4})};
  EXPECT_EQ(f.signature(a), f.signature(b));
  EXPECT_NE(f.signature(a), f.signature(c));
  EXPECT_TRUE(has(f.signature(c), "Float[5, 4]")) << f.signature(c);
  const std::string with_grad = f.signature(a);
  {
    at::NoGradGuard no_grad;
    EXPECT_NE(f.signature(a), with_grad);  // grad mode is part of it
  }
}

// TinyClassifier's layers with GELU(tanh) written as ops, run eagerly or through its own
// TracedFunction member (the module traces itself).
class GeluClassifier : public volt_test::TinyClassifier {
 public:
  explicit GeluClassifier(bool traced)
      : traced_(traced), forward_("gelu_classifier", *this, [this](const Tensors& in) {
          return Tensors{body(in[0])};
        }) {}
  at::Tensor body(const at::Tensor& x) {
    auto h = fc1->forward(x);
    h = 0.5 * h * (1.0 + torch::tanh(0.7978845608028654 * (h + 0.044715 * h * h * h)));
    return fc2->forward(drop->forward(h));
  }
  at::Tensor training_step(const volt::Batch& b, int64_t) override {
    const auto logits = traced_ ? forward_({b.input})[0] : body(b.input);
    return torch::cross_entropy_loss(logits, b.target);
  }
  const TracedFunction& traced() const { return forward_; }

 private:
  bool traced_;
  TracedFunction forward_;
};

TEST_F(Traced, AModuleTrainedByTheTrainerThroughItsTraceMatchesEagerTraining) {
  auto train = [&](bool traced) {
    GeluClassifier model(traced);
    torch::manual_seed(3);
    for (auto& p : model.parameters()) p.data().uniform_(-0.5, 0.5);
    volt::Trainer trainer(volt_test::quiet(dir.path).max_epochs(2));
    trainer.fit(model, volt_test::loader(volt_test::blobs(128)));
    if (traced) {
      // Batches of 16, and dropout on in training: one signature, traced once, checked on the
      // next call and again at the second epoch's start (the Trainer's recheck_module).
      EXPECT_EQ(model.traced().stats().traces, 1);
      EXPECT_EQ(model.traced().stats().checks, 2);
      EXPECT_EQ(model.traced().stats().hits, 13);
    }
    return model.flat_params();
  };
  const auto eager = train(false);
  const auto traced = train(true);
  // The same dropout masks and the same ops but GELU's tanh (a few ulp) over 16 SGD steps.
  EXPECT_LT((eager - traced).abs().max().item<double>(), 1e-4);
}

// The reference's "Dynamic Ops" example (HPU graphs with mark_step around `tmp[torch.where(tmp <
// 0)]`) on the CPU tracer. A data-dependent libtorch op (nonzero, then index_select) is recorded
// like any other and replays with the size the data gives, so one trace holds it; an op that
// reads a value on the host (masked_select's CPU kernel in libtorch 1.13 reads its count with
// item()) cannot be traced, so the regions before and after it are traced apart and it runs
// eagerly between them (the tail gets a trace per row count). Both equal eager, gradients too.
struct DynamicOps : Traced {
  DynamicOps() {
    both->register_module("head", head);
    both->register_module("tail", tail);
  }
  Tensors head_fn(const Tensors& in) const { return Tensors{head->forward(in[0]) * 2.0 + 1.0}; }
  Tensors tail_fn(const Tensors& in) const {
    return Tensors{torch::relu(tail->forward(in[0]) * 3.0 + 0.5)};
  }
  void zero_grads() const {
    for (auto& p : both->parameters()) p.mutable_grad() = at::Tensor();
  }
  // Runs `run` and its eager twin on 12 batches: outputs equal, gradients within a few ulp.
  void expect_equals_eager(const std::function<Tensors(const Tensors&)>& run,
                           const std::function<Tensors(const Tensors&)>& eager,
                           std::set<int64_t>& sizes) const {
    for (int step = 0; step < 12; ++step) {
      const auto x = torch::randn({32, 8});
      zero_grads();
      const auto want = eager({x})[0];
      want.square().sum().backward();
      Tensors want_grads;
      for (const auto& p : both->parameters()) want_grads.push_back(p.grad().clone());
      zero_grads();
      const auto got = run({x})[0];
      sizes.insert(got.size(0));
      ASSERT_TRUE(got.sizes() == want.sizes() && torch::equal(got, want)) << "step " << step;
      got.square().sum().backward();
      size_t i = 0;
      for (const auto& p : both->parameters()) {
        ASSERT_TRUE(near(p.grad(), want_grads[i++])) << "step " << step << " parameter " << i - 1;
      }
    }
  }
  // Seeded before the layers are made: libtorch seeds its default CPU generator from
  // std::random_device at process start, so layers made before a manual_seed differ run to run.
  struct Seed {
    Seed() { torch::manual_seed(0); }
  } seed;
  std::shared_ptr<torch::nn::LinearImpl> head = std::make_shared<torch::nn::LinearImpl>(8, 16);
  std::shared_ptr<torch::nn::LinearImpl> tail = std::make_shared<torch::nn::LinearImpl>(16, 4);
  std::shared_ptr<torch::nn::Module> both = std::make_shared<torch::nn::Module>();
};

TEST_F(DynamicOps, ADataDependentLibtorchOpReplaysWithTheSizeTheDataGives) {
  // The rows whose head output sums to more than 16 (a linear function of the row above its
  // mean, about half of them): how many depends on the batch.
  const auto whole = [&](const Tensors& in) {
    const auto y = head_fn(in)[0];
    const auto rows = torch::nonzero(y.sum(1) > 16).squeeze(1);
    return tail_fn({y.index_select(0, rows)});
  };
  TracedFunction f("rows", both, whole);
  std::set<int64_t> sizes;
  expect_equals_eager([&](const Tensors& in) { return f(in); }, whole, sizes);
  EXPECT_GT(sizes.size(), 1u);
  EXPECT_EQ(f.stats().traces, 1);  // then checked once and replayed 10 times
  EXPECT_EQ(f.stats().hits, 10);
}

// A submodule put in eval (a BatchNorm of a trained model) or a model whose parameters are
// frozen: the key held only the root's mode and the count of captured tensors, so the trace of
// batch_norm(training=true) went on replaying (batch statistics, running statistics still moved).
TEST_F(Traced, ASubmodulesModeAndTheParametersGradStateAreInTheSignature) {
  torch::manual_seed(4);
  auto net = std::make_shared<torch::nn::Module>();
  auto lin = net->register_module("lin", torch::nn::Linear(6, 5));
  auto bn = net->register_module("bn", torch::nn::BatchNorm1d(5));
  const auto fn = [&](const Tensors& in) {
    return Tensors{torch::relu(bn->forward(lin->forward(in[0])) * 2.0)};
  };
  TracedFunction f("bn_mode", net, fn);
  const auto x = torch::randn({8, 6});
  const std::string training = f.signature({x});
  trace_and_check(f, {x});
  f({x});
  bn->eval();
  EXPECT_NE(f.signature({x}), training);
  const auto mean = bn->running_mean.clone();
  const auto got = f({x})[0];
  EXPECT_TRUE(torch::equal(bn->running_mean, mean));  // eval: the running statistics stay
  EXPECT_TRUE(near(got, fn({x})[0]));
  bn->train();
  EXPECT_EQ(f.signature({x}), training);
  for (auto& p : net->parameters()) p.requires_grad_(false);
  EXPECT_NE(f.signature({x}), training);
}

// A mean over the last dimension after columns picked by the data: the replay divided the row's
// sum by the traced row's length (4 here), not the replayed one's.
TEST_F(Traced, AMeanDividesByTheRowLengthTheReplayFinds) {
  const auto fn = [](const Tensors& in) {
    const auto cols = torch::nonzero(in[1]).squeeze(1);
    const auto z = in[0].index_select(1, cols);
    return Tensors{(z * 2.0).mean(-1, true) + 1.0};
  };
  TracedFunction f("mean_cols", fn);
  torch::manual_seed(3);
  const auto x = torch::randn({5, 8});
  const auto four = torch::tensor({1, 0, 1, 0, 1, 0, 1, 0}, torch::kBool);
  const auto six = torch::tensor({1, 1, 1, 0, 1, 1, 0, 1}, torch::kBool);
  trace_and_check(f, {x, four});
  const int64_t hits = f.stats().hits;
  const Tensors got = f({x, six});
  ASSERT_EQ(f.stats().hits, hits + 1) << "not a replay";
  EXPECT_TRUE(near(got[0], fn({x, six})[0])) << got[0] << fn({x, six})[0];
}

// clamp's gradient at a bound is the whole gradient (torch's clamp_backward: min <= x <= max);
// the fused chain lowered clamp to maximum/minimum, whose gradient is split between tied
// operands: x = [0, 1, .5, 2] got [1, 1, 2, 0] for [2, 2, 2, 0].
TEST_F(Traced, ClampPassesTheWholeGradientAtItsBounds) {
  const auto fn = [](const Tensors& in) {
    return Tensors{torch::clamp(in[0] * 1.0, 0.0, 1.0) * 2.0 + torch::clamp_min(in[0] * 1.0, 0.0) +
                   torch::clamp_max(in[0] * 1.0, 1.0)};
  };
  TracedFunction f(
      "clamp_grad", fn,
      TraceOptions().fused_options(volt::FusedElementwiseOptions().require_fused(true)));
  const auto x = torch::tensor({0.0f, 1.0f, 0.5f, 2.0f});
  for (int call = 0; call < 3; ++call) {  // trace, check, replay
    const auto xs = x.clone().requires_grad_(true);
    f({xs})[0].sum().backward();
    const auto xe = x.clone().requires_grad_(true);
    fn({xe})[0].sum().backward();
    EXPECT_TRUE(torch::equal(xs.grad(), xe.grad())) << "call " << call << xs.grad() << xe.grad();
  }
  EXPECT_GE(f.stats().hits, 1);
  EXPECT_TRUE(torch::equal(f({x})[0], fn({x})[0]));
}

TEST_F(DynamicOps, AnOpThatReadsTheHostRunsEagerlyBetweenTracedRegions) {
  // The same rows as above, picked with a mask.
  const auto dynamic = [](const at::Tensor& y) {
    return y.masked_select((y.sum(1, true) > 16).expand_as(y)).view({-1, y.size(1)});
  };
  const auto whole = [&](const Tensors& in) { return tail_fn({dynamic(head_fn(in)[0])}); };
  TracedFunction all_in_one("all_in_one", both, whole);
  const std::string refused = volt_test::error_of<volt::ValueError>([&] {
    all_in_one({torch::randn({32, 8})});
  });
  EXPECT_TRUE(has(refused, "read a tensor's value on the host while traced")) << refused;

  TracedFunction first("head", head, [&](const Tensors& in) { return head_fn(in); });
  TracedFunction second("tail", tail, [&](const Tensors& in) { return tail_fn(in); });
  std::set<int64_t> sizes;
  expect_equals_eager([&](const Tensors& in) { return second({dynamic(first(in)[0])}); }, whole,
                      sizes);
  EXPECT_GT(sizes.size(), 1u);
  EXPECT_EQ(first.stats().traces, 1);
  EXPECT_EQ(first.stats().hits, 10);
  const auto tail_stats = second.stats();  // a trace per size (evicted beyond 8)
  EXPECT_GE(tail_stats.traces, static_cast<int64_t>(std::min<size_t>(sizes.size(), 8)));
  EXPECT_EQ(tail_stats.traces + tail_stats.checks + tail_stats.hits, 12);
}

/// A traced forward that scales its logits by a number that changes with the epoch: a host
/// value baked into the trace, which replays the first epoch's after it.
class EpochScaled : public volt_test::TinyClassifier {
 public:
  EpochScaled()
      : forward_("epoch_scaled", *this, [this](const Tensors& in) {
          return Tensors{forward(in[0]) * (1.0 + 0.5 * epoch_)};
        }) {}
  void on_train_epoch_start() override { epoch_ = current_epoch(); }
  at::Tensor training_step(const volt::Batch& b, int64_t) override {
    return torch::cross_entropy_loss(forward_({b.input})[0], b.target);
  }
  const TracedFunction& traced() const { return forward_; }

 private:
  int64_t epoch_ = 0;
  TracedFunction forward_;
};

TEST_F(Traced, TheTrainerChecksAModulesTracesAtEachEpochsStart) {
  EpochScaled model;
  volt::Trainer trainer(volt_test::quiet(dir.path).max_epochs(2));
  const std::string what = volt_test::error_of<volt::ValueError>(
      [&] { trainer.fit(model, volt_test::loader(volt_test::blobs(64))); });
  EXPECT_TRUE(has(what, "'epoch_scaled' ran other ops on a later call")) << what;
  EXPECT_TRUE(has(what, "1.5")) << what;  // the new factor, where the trace has 1
  // Epoch 0's 4 steps (traced, checked, 2 replays); epoch 1's first step was the check.
  EXPECT_EQ(trainer.state().global_step, 4);
  EXPECT_EQ(model.traced().stats().checks, 2);
  EXPECT_EQ(model.traced().stats().hits, 2);

  // recheck_module reaches functions made with the module or a submodule, not others.
  auto outer = std::make_shared<torch::nn::Module>();
  auto inner = outer->register_module("inner", std::make_shared<torch::nn::LinearImpl>(4, 4));
  TracedFunction of_inner("of_inner", inner,
                          [&](const Tensors& in) { return Tensors{inner->forward(in[0]) * 2.0}; });
  TracedFunction of_none("of_none", [&](const Tensors& in) { return Tensors{in[0] * 2.0}; });
  const auto x = torch::randn({2, 4});
  for (const TracedFunction* f : {&of_inner, &of_none}) trace_and_check(*f, {x});
  TracedFunction::recheck_module(*outer);
  of_inner({x});
  of_none({x});
  EXPECT_EQ(of_inner.stats().checks, 2);
  EXPECT_EQ(of_none.stats().checks, 1);
  EXPECT_EQ(of_none.stats().hits, 1);
}

TEST_F(Traced, ThreadsReplayingOneTraceAtOnceGetTheirOwnResults) {
  TracedFunction f("threads", exact_chain);
  std::vector<Tensors> in(4);
  for (auto& i : in) i = {torch::randn({256, 64}), torch::randn({256, 64}), torch::randn({64})};
  trace_and_check(f, in[0]);
  std::vector<std::thread> threads;
  std::vector<int> ok(in.size(), 0);
  for (size_t t = 0; t < in.size(); ++t) {
    threads.emplace_back([&, t] {
      bool all = true;
      for (int r = 0; r < 20; ++r) all = all && torch::equal(f(in[t])[0], exact_chain(in[t])[0]);
      ok[t] = all ? 1 : 0;
    });
  }
  for (auto& th : threads) th.join();
  for (size_t t = 0; t < in.size(); ++t) EXPECT_EQ(ok[t], 1) << "thread " << t;
  EXPECT_EQ(f.stats().traces, 1);
}

}  // namespace
