// volt::checkpoint, checkpoint_sequential and wrap_activation_checkpointing: gradients equal an
// ordinary run's bitwise (dropout, autocast, nesting, several outputs), errors, and peak memory.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <memory>
#include <type_traits>

#include "error_text.h"
#include "requires.h"
#include "tiny.h"
#include "training_jobs.h"
#include "volt/accelerators/cpu_memory.h"
#include "volt/core/errors.h"
#include "volt/nn/checkpoint.h"
#include "volt/nn/pipeline.h"
#include "volt/precision/autocast.h"
#include "volt/precision/fp8_linear.h"

namespace {

namespace nn = torch::nn;

// Linear -> GELU -> Dropout -> Linear: the shape of a transformer MLP block. (A Sequential
// cannot hold a Sequential: AnyModule needs a non-template forward.)
struct MlpBlockImpl : nn::Module {
  MlpBlockImpl(int64_t width, double dropout)
      : fc1(register_module("fc1", nn::Linear(width, 4 * width))),
        drop(register_module("drop", nn::Dropout(dropout))),
        fc2(register_module("fc2", nn::Linear(4 * width, width))) {}
  at::Tensor forward(at::Tensor x) { return fc2(drop(torch::gelu(fc1(x)))); }
  nn::Linear fc1;
  nn::Dropout drop;
  nn::Linear fc2;
};
TORCH_MODULE(MlpBlock);

// A deep MLP whose blocks are Sequential entries (so they can be wrapped by name).
struct DeepMlp : nn::Module {
  DeepMlp(int64_t depth, int64_t width, double dropout) {
    torch::manual_seed(0);
    for (int64_t i = 0; i < depth; ++i) blocks->push_back(MlpBlock(width, dropout));
    register_module("blocks", blocks);
    register_module("head", head = nn::Linear(width, 1));
  }
  // Plain forward (goes through the Sequential, so wrapped blocks are checkpointed).
  at::Tensor forward(const at::Tensor& x) { return head(blocks->forward(x)); }
  // Every block checkpointed by hand.
  at::Tensor forward_checkpointed(const at::Tensor& x, const volt::CheckpointOptions& o) {
    at::Tensor h = x;
    for (auto& b : *blocks) h = volt::checkpoint(o, MlpBlock(b.ptr<MlpBlockImpl>()), h);
    return head(h);
  }
  nn::Sequential blocks;
  nn::Linear head{nullptr};
};

struct Grads {
  std::vector<std::pair<std::string, at::Tensor>> params;
  at::Tensor input;
  at::Tensor loss;
};

// Runs `forward` on a fresh copy of x from RNG seed 42, backward, and returns every gradient.
template <typename F>
Grads run(nn::Module& m, const at::Tensor& x_data, bool input_grad, F forward) {
  for (auto& p : m.parameters()) p.mutable_grad() = at::Tensor();
  at::Tensor x = x_data.clone().requires_grad_(input_grad);
  torch::manual_seed(42);
  at::Tensor y = forward(x);
  at::Tensor loss = (y * y).mean();
  loss.backward();
  Grads g;
  for (const auto& kv : m.named_parameters()) {
    EXPECT_TRUE(kv.value().grad().defined()) << kv.key() << " got no gradient";
    g.params.emplace_back(kv.key(), kv.value().grad().clone());
  }
  if (input_grad) g.input = x.grad().clone();
  g.loss = loss.detach();
  return g;
}

void expect_bitwise_equal(const Grads& a, const Grads& b) {
  ASSERT_EQ(a.params.size(), b.params.size());
  EXPECT_TRUE(torch::equal(a.loss, b.loss))
      << a.loss.item<double>() << " vs " << b.loss.item<double>();
  for (size_t i = 0; i < a.params.size(); ++i) {
    ASSERT_TRUE(b.params[i].second.defined()) << b.params[i].first;
    EXPECT_TRUE(torch::equal(a.params[i].second, b.params[i].second))
        << a.params[i].first << " max diff "
        << (a.params[i].second - b.params[i].second).abs().max().item<double>();
  }
  if (a.input.defined()) {
    ASSERT_TRUE(b.input.defined());
    EXPECT_TRUE(torch::equal(a.input, b.input));
  }
}

bool all_equal(const Grads& a, const Grads& b) {
  for (size_t i = 0; i < a.params.size(); ++i) {
    if (!torch::equal(a.params[i].second, b.params[i].second)) return false;
  }
  return true;
}

at::Tensor data(int64_t batch = 16, int64_t width = 8) {
  torch::manual_seed(3);
  return torch::randn({batch, width});
}

TEST(ActivationCheckpoint, DeepMlpWithDropoutGradientsBitwiseEqual) {
  DeepMlp m(6, 8, 0.25);
  const at::Tensor x = data();
  const Grads plain = run(m, x, true, [&](const at::Tensor& t) { return m.forward(t); });
  const Grads ckpt = run(m, x, true, [&](const at::Tensor& t) {
    return m.forward_checkpointed(t, volt::CheckpointOptions());
  });
  expect_bitwise_equal(plain, ckpt);
}

TEST(ActivationCheckpoint, WithoutRngReplayDropoutMasksDiffer) {
  // The check above can fail: without replaying the RNG the recomputed masks are new draws.
  DeepMlp m(3, 8, 0.5);
  const at::Tensor x = data();
  const Grads plain = run(m, x, false, [&](const at::Tensor& t) { return m.forward(t); });
  const Grads no_replay = run(m, x, false, [&](const at::Tensor& t) {
    at::Tensor h = t;
    for (auto& b : *m.blocks) {
      auto block = b.ptr<MlpBlockImpl>();
      h = volt::checkpoint(
          [block](const std::vector<at::Tensor>& in) {
            return std::vector<at::Tensor>{block->forward(in[0])};
          },
          std::vector<at::Tensor>{h}, volt::CheckpointOptions().preserve_rng_state(false))[0];
    }
    return m.head(h);
  });
  EXPECT_TRUE(torch::equal(plain.loss, no_replay.loss));  // forward draws the same masks
  EXPECT_FALSE(all_equal(plain, no_replay));
}

TEST(ActivationCheckpoint, ParametersGetGradientsWhenNoInputRequiresGrad) {
  // The first layer on raw data: PyTorch's reentrant checkpoint loses these gradients.
  nn::Linear first(8, 8), last(8, 2);
  nn::Sequential all(first, last);
  const at::Tensor x = data();
  const Grads plain =
      run(*all, x, false, [&](const at::Tensor& t) { return last(torch::tanh(first(t))); });
  const Grads ckpt = run(*all, x, false, [&](const at::Tensor& t) {
    return last(torch::tanh(volt::checkpoint(first, t)));  // DeepSpeed's checkpoint(self.l1, x)
  });
  expect_bitwise_equal(plain, ckpt);
}

TEST(ActivationCheckpoint, RecomputesInBackwardAndJustCallsFnWithoutGrad) {
  nn::Linear lin(4, 4);
  int calls = 0;
  auto f = [&](const at::Tensor& t) {
    ++calls;
    return torch::relu(lin(t));
  };
  at::Tensor y = volt::checkpoint(f, torch::randn({2, 4}));
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(y.grad_fn()->name().find("CheckpointNode") == std::string::npos)
      << y.grad_fn()->name();
  y.sum().backward();
  EXPECT_EQ(calls, 2);  // recomputed once
  {
    torch::NoGradGuard no_grad;
    at::Tensor z = volt::checkpoint(f, torch::randn({2, 4}));
    EXPECT_EQ(calls, 3);
    EXPECT_EQ(z.grad_fn(), nullptr);
  }
}

TEST(ActivationCheckpoint, NestedCheckpointsBitwiseEqual) {
  DeepMlp m(4, 8, 0.25);
  const at::Tensor x = data();
  const Grads plain = run(m, x, true, [&](const at::Tensor& t) { return m.forward(t); });
  const Grads nested = run(m, x, true, [&](const at::Tensor& t) {
    auto outer = [&](const at::Tensor& h0) {
      at::Tensor h = h0;
      for (auto& b : *m.blocks) h = volt::checkpoint(MlpBlock(b.ptr<MlpBlockImpl>()), h);
      return h;
    };
    return m.head(volt::checkpoint(outer, t));
  });
  expect_bitwise_equal(plain, nested);
}

TEST(ActivationCheckpoint, SeveralInputsAndOutputsOneUnused) {
  nn::Linear a(6, 6), b(6, 6);
  nn::Sequential both(a, b);
  torch::manual_seed(5);
  const at::Tensor x = torch::randn({3, 6}), z_data = torch::randn({3, 6});
  auto body = [&](const at::Tensor& p, const at::Tensor& q) {
    return std::vector<at::Tensor>{torch::tanh(a(p)) * q, torch::sigmoid(b(q)), (p > 0).sum()};
  };
  auto go = [&](bool ckpt) {
    for (auto& p : both->parameters()) p.mutable_grad() = at::Tensor();
    at::Tensor p = x.clone().requires_grad_(true), q = z_data.clone().requires_grad_(true);
    std::vector<at::Tensor> out = ckpt ? volt::checkpoint(body, p, q) : body(p, q);
    EXPECT_EQ(out.size(), 3u);
    EXPECT_EQ(out[2].scalar_type(), at::kLong);
    (out[0].sum() * 2).backward();  // out[1] unused: its grad_output is undefined
    return std::vector<at::Tensor>{
        p.grad().clone(), q.grad().clone(), a->weight.grad().clone(),
        b->weight.grad().defined() ? b->weight.grad().clone() : at::Tensor()};
  };
  const auto plain = go(false), ckpt = go(true);
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(torch::equal(plain[i], ckpt[i])) << i;
  EXPECT_FALSE(plain[3].defined());
  EXPECT_FALSE(ckpt[3].defined());
}

TEST(ActivationCheckpoint, Bf16AutocastReplayedInRecomputation) {
  DeepMlp m(4, 16, 0.1);
  const at::Tensor x = data(16, 16);
  auto in_autocast = [&](auto f) {
    return [&, f](const at::Tensor& t) {
      volt::AutocastGuard bf16(c10::kCPU);
      return f(t).to(at::kFloat);
    };
  };
  const Grads plain =
      run(m, x, true, in_autocast([&](const at::Tensor& t) { return m.forward(t); }));
  const Grads ckpt = run(m, x, true, in_autocast([&](const at::Tensor& t) {
                           return m.forward_checkpointed(t, volt::CheckpointOptions());
                         }));
  expect_bitwise_equal(plain, ckpt);
  // And bf16 really was on: the fp32 run differs.
  const Grads fp32 = run(m, x, true, [&](const at::Tensor& t) { return m.forward(t); });
  EXPECT_FALSE(all_equal(plain, fp32));
}

TEST(ActivationCheckpoint, Fp8LayersCountTheRecomputationAsTheSameForward) {
  // fp8 delayed scaling updates state in forward (amax history, step count, scales). Backward's
  // recomputation must use the first pass's scales and record nothing, or a checkpointed fp8
  // model would train differently from an unchecked one (it once did: every checkpointed layer
  // counted two forwards per step).
  struct Trained {
    std::vector<at::Tensor> state;
  };
  auto train = [](bool ckpt) {
    torch::manual_seed(5);
    volt::Fp8Linear a(16, 16), b(16, 16);
    std::vector<at::Tensor> params = a->parameters();
    for (const auto& p : b->parameters()) params.push_back(p);
    torch::optim::SGD opt(params, torch::optim::SGDOptions(0.1));
    auto block = [&](const at::Tensor& t) { return b(torch::relu(a(t))); };
    for (int step = 0; step < 4; ++step) {
      torch::manual_seed(100 + step);
      const at::Tensor x = torch::randn({8, 16});
      opt.zero_grad();
      const at::Tensor y = ckpt ? volt::checkpoint(block, x) : block(x);
      y.pow(2).mean().backward();
      opt.step();
    }
    Trained t;
    for (auto* m : {a.ptr().get(), b.ptr().get()}) {
      for (const auto& p : m->parameters()) t.state.push_back(p.detach().clone());
      for (const auto& kv : m->named_buffers()) t.state.push_back(kv.value().clone());
    }
    return t;
  };
  const Trained plain = train(false), ckpt = train(true);
  ASSERT_EQ(plain.state.size(), ckpt.state.size());
  for (size_t i = 0; i < plain.state.size(); ++i) {
    EXPECT_TRUE(torch::equal(plain.state[i], ckpt.state[i]))
        << "tensor " << i << " " << plain.state[i].sizes() << " max diff "
        << (plain.state[i].to(at::kDouble) - ckpt.state[i].to(at::kDouble))
               .abs()
               .max()
               .item<double>();
  }
}

TEST(ActivationCheckpoint, CpuCheckpointingOnCpuTensorsIsANoOp) {
  DeepMlp m(3, 8, 0.25);
  const at::Tensor x = data();
  const Grads plain = run(m, x, true, [&](const at::Tensor& t) { return m.forward(t); });
  volt::CheckpointDefaultsGuard defaults(volt::CheckpointOptions().cpu_checkpointing(true));
  EXPECT_TRUE(volt::checkpoint_defaults().cpu_checkpointing());
  const Grads ckpt = run(m, x, true, [&](const at::Tensor& t) {
    return m.forward_checkpointed(t, volt::checkpoint_defaults());
  });
  expect_bitwise_equal(plain, ckpt);
}

TEST(ActivationCheckpoint, DefaultsGuardRestores) {
  EXPECT_FALSE(volt::checkpoint_defaults().cpu_checkpointing());
  {
    volt::CheckpointDefaultsGuard g(
        volt::CheckpointOptions().cpu_checkpointing(true).preserve_rng_state(false));
    EXPECT_TRUE(volt::checkpoint_defaults().cpu_checkpointing());
    EXPECT_FALSE(volt::checkpoint_defaults().preserve_rng_state());
  }
  EXPECT_FALSE(volt::checkpoint_defaults().cpu_checkpointing());
  EXPECT_TRUE(volt::checkpoint_defaults().preserve_rng_state());
  std::ostringstream os;
  os << volt::CheckpointOptions();
  EXPECT_EQ(os.str(), "CheckpointOptions(preserve_rng_state=true, cpu_checkpointing=false)");
}

TEST(ActivationCheckpoint, GradAndBackwardWithInputsAreValueErrorsLeavingNoGradients) {
  // The recomputed backward accumulates into every leaf's .grad: grad() and backward(inputs)
  // would get gradients written where they did not ask and none returned for what they named.
  nn::Linear lin(4, 4);
  const at::Tensor x = torch::randn({2, 4}).requires_grad_(true);
  const at::Tensor y = volt::checkpoint(lin, x).sum();
  EXPECT_NE(volt_test::error_of<volt::ValueError>([&] {
              torch::autograd::grad({y}, {x}, {}, /*retain_graph=*/true);
            }).find("torch::autograd::grad() and backward(inputs) are not supported"),
            std::string::npos);
  EXPECT_NE(volt_test::error_of<volt::ValueError>([&] {
              y.backward({}, /*retain_graph=*/true, false, {x});
            }).find("Call backward() without inputs"),
            std::string::npos);
  EXPECT_FALSE(lin->weight.grad().defined());
  EXPECT_FALSE(x.grad().defined());
  y.backward();  // the supported call still works on the same graph
  EXPECT_TRUE(lin->weight.grad().defined());
  EXPECT_TRUE(x.grad().defined());
}

TEST(ActivationCheckpoint, InputModifiedInPlaceBeforeBackwardIsAnError) {
  nn::Linear lin(4, 4);
  at::Tensor x = torch::randn({2, 4}).requires_grad_(true);
  at::Tensor h = x * 1;
  at::Tensor y = volt::checkpoint(lin, h);
  {
    torch::NoGradGuard g;
    h.add_(1);
  }
  try {
    y.sum().backward();
    FAIL() << "backward through a modified input succeeded";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("inplace operation"), std::string::npos) << e.what();
  }
}

TEST(ActivationCheckpointSequential, GradientsBitwiseEqualForEverySegmentCount) {
  torch::manual_seed(0);
  nn::Sequential seq;
  for (int i = 0; i < 3; ++i) {
    seq->push_back(nn::Linear(8, 8));
    seq->push_back(nn::ReLU());
    seq->push_back(nn::Dropout(0.2));
  }
  const at::Tensor x = data();
  const Grads plain = run(*seq, x, true, [&](const at::Tensor& t) { return seq->forward(t); });
  for (int64_t s = 1; s <= static_cast<int64_t>(seq->size()); ++s) {
    const Grads ckpt = run(
        *seq, x, true, [&](const at::Tensor& t) { return volt::checkpoint_sequential(seq, s, t); });
    SCOPED_TRACE("segments=" + std::to_string(s));
    expect_bitwise_equal(plain, ckpt);
  }
  // The whole Sequential under one checkpoint: volt::checkpoint takes its holder as it is.
  const Grads whole =
      run(*seq, x, true, [&](const at::Tensor& t) { return volt::checkpoint(seq, t); });
  expect_bitwise_equal(plain, whole);
}

// BatchNorm updates its running statistics (and batch count) in forward; the recomputation is
// the same forward again, so a checkpointed Sequential entry or segment moves them once, as an
// ordinary run does. Before session 57 they moved twice per step (momentum applied twice).
TEST(ActivationCheckpointSequential, BatchNormStatisticsMoveOncePerForward) {
  auto model = [] {
    torch::manual_seed(0);
    return nn::Sequential(nn::Linear(8, 8), nn::BatchNorm1d(8), nn::ReLU(), nn::Linear(8, 4),
                          nn::BatchNorm1d(4));
  };
  auto state = [](nn::Sequential& seq) {
    std::vector<at::Tensor> out;
    for (const auto& b : seq->buffers()) out.push_back(b.clone());
    for (const auto& p : seq->parameters()) out.push_back(p.grad().clone());
    return out;
  };
  auto two_steps = [&](nn::Sequential& seq, const std::function<at::Tensor(const at::Tensor&)>& f) {
    torch::manual_seed(1);
    for (int step = 0; step < 2; ++step) f(data()).square().sum().backward();
    return state(seq);
  };
  nn::Sequential plain = model();
  const auto want = two_steps(plain, [&](const at::Tensor& x) { return plain->forward(x); });
  auto expect_same = [&](const std::vector<at::Tensor>& got) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(torch::equal(got[i], want[i])) << "buffer or gradient " << i;
    }
  };
  for (int64_t segments : {2, 5}) {
    SCOPED_TRACE("checkpoint_sequential, segments=" + std::to_string(segments));
    nn::Sequential seq = model();
    expect_same(two_steps(
        seq, [&](const at::Tensor& x) { return volt::checkpoint_sequential(seq, segments, x); }));
  }
  {
    SCOPED_TRACE("wrap_activation_checkpointing");
    nn::Sequential seq = model();
    volt::wrap_activation_checkpointing(*seq, {"1", "4"});
    expect_same(two_steps(seq, [&](const at::Tensor& x) { return seq->forward(x); }));
  }
  {
    SCOPED_TRACE("volt::checkpoint of the Sequential holder");
    nn::Sequential seq = model();
    expect_same(two_steps(seq, [&](const at::Tensor& x) { return volt::checkpoint(seq, x); }));
  }
  {
    // A module holder is known to checkpoint (a lambda's modules are not, as in PyTorch).
    SCOPED_TRACE("volt::checkpoint of each BatchNorm1d holder");
    nn::Sequential seq = model();
    nn::BatchNorm1d bn1(std::dynamic_pointer_cast<nn::BatchNorm1dImpl>(seq->ptr(1)));
    nn::BatchNorm1d bn2(std::dynamic_pointer_cast<nn::BatchNorm1dImpl>(seq->ptr(4)));
    expect_same(two_steps(seq, [&](const at::Tensor& x) {
      at::Tensor h = volt::checkpoint(bn1, seq[0]->as<nn::Linear>()->forward(x));
      return volt::checkpoint(bn2, seq[3]->as<nn::Linear>()->forward(torch::relu(h)));
    }));
  }
  {
    // So is a std::shared_ptr to a module (a module written without TORCH_MODULE).
    SCOPED_TRACE("volt::checkpoint of each std::shared_ptr<BatchNorm1dImpl>");
    nn::Sequential seq = model();
    auto bn1 = std::dynamic_pointer_cast<nn::BatchNorm1dImpl>(seq->ptr(1));
    auto bn2 = std::dynamic_pointer_cast<nn::BatchNorm1dImpl>(seq->ptr(4));
    expect_same(two_steps(seq, [&](const at::Tensor& x) {
      at::Tensor h = volt::checkpoint(bn1, seq[0]->as<nn::Linear>()->forward(x));
      return volt::checkpoint(bn2, seq[3]->as<nn::Linear>()->forward(torch::relu(h)));
    }));
  }
}

TEST(ActivationCheckpointSequential, BadSegmentsIsAConfigError) {
  nn::Sequential seq(nn::Linear(2, 2), nn::ReLU());
  for (int64_t s : {0, -1, 3}) {
    try {
      volt::checkpoint_sequential(seq, s, torch::randn({1, 2}));
      ADD_FAILURE() << "segments=" << s << " accepted";
    } catch (const volt::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("[checkpoint_sequential] segments=" + std::to_string(s)),
                std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("1 <= segments <= 2"), std::string::npos) << e.what();
    }
  }
}

// -------------------------------------------------------------------- wrapping by name

TEST(ActivationCheckpointWrap, NamesUnchangedGradientsEqualAndIdempotent) {
  DeepMlp m(5, 8, 0.25);
  const at::Tensor x = data();
  const Grads plain = run(m, x, true, [&](const at::Tensor& t) { return m.forward(t); });
  std::vector<std::pair<std::string, const void*>> before;
  for (const auto& kv : m.named_parameters()) before.emplace_back(kv.key(), kv.value().data_ptr());
  const auto state_before = m.named_buffers().keys();

  const auto wrapped = volt::wrap_activation_checkpointing(m, {"blocks.*"});
  EXPECT_EQ(wrapped,
            (std::vector<std::string>{"blocks.0", "blocks.1", "blocks.2", "blocks.3", "blocks.4"}));
  std::vector<std::pair<std::string, const void*>> after;
  for (const auto& kv : m.named_parameters()) after.emplace_back(kv.key(), kv.value().data_ptr());
  EXPECT_EQ(before, after);
  EXPECT_EQ(state_before, m.named_buffers().keys());
  EXPECT_EQ(volt::checkpointed_modules(m), wrapped);

  at::Tensor y = m.blocks->forward(x.clone().requires_grad_(true));
  EXPECT_NE(y.grad_fn()->name().find("CheckpointNode"), std::string::npos) << y.grad_fn()->name();
  const Grads ckpt = run(m, x, true, [&](const at::Tensor& t) { return m.forward(t); });
  expect_bitwise_equal(plain, ckpt);

  EXPECT_TRUE(volt::wrap_activation_checkpointing(m, {"blocks.*", "blocks.2"}).empty());
  EXPECT_EQ(volt::checkpointed_modules(m).size(), 5u);
  const Grads again = run(m, x, true, [&](const at::Tensor& t) { return m.forward(t); });
  expect_bitwise_equal(plain, again);
}

struct Counter : nn::Module {
  int calls = 0;
  at::Tensor forward(at::Tensor x) {
    ++calls;
    return x * 2;
  }
};

TEST(ActivationCheckpointWrap, WrappingTwiceRecomputesOnce) {
  auto counter = std::make_shared<Counter>();
  nn::Sequential seq(counter, nn::Linear(3, 3));
  volt::wrap_activation_checkpointing(*seq, {"0"});
  volt::wrap_activation_checkpointing(*seq, {"0", "*"});  // "1" is new, "0" is not rewrapped
  EXPECT_EQ(volt::checkpointed_modules(*seq), (std::vector<std::string>{"0", "1"}));
  seq->forward(torch::ones({2, 3}).requires_grad_(true)).sum().backward();
  EXPECT_EQ(counter->calls, 2);  // forward + one recomputation (a double wrap would make it 3)
}

// x * w, counting its forwards.
struct ScaledCounter : nn::Module {
  ScaledCounter() : w(register_parameter("w", torch::full({3}, 2.0))) {}
  int calls = 0;
  at::Tensor w;
  at::Tensor forward(at::Tensor x) {
    ++calls;
    return x * w;
  }
};

// A frozen entry whose input needs no gradient (fine-tuning's frozen backbone) has nothing to
// recompute: it runs once a step, wrapped or as a checkpoint_sequential segment; the trainable
// entry after it is still recomputed, and the gradients are those of the unwrapped model.
TEST(ActivationCheckpointWrap, AFrozenEntryWithoutAGradientInputRunsOnce) {
  auto frozen = std::make_shared<ScaledCounter>();
  auto trained = std::make_shared<ScaledCounter>();
  nn::Sequential seq(frozen, trained);
  frozen->w.requires_grad_(false);
  const at::Tensor x = torch::arange(6, at::kFloat).reshape({2, 3});
  seq->forward(x).square().sum().backward();
  const at::Tensor want = trained->w.grad().clone();
  trained->w.mutable_grad() = at::Tensor();
  EXPECT_EQ(volt::wrap_activation_checkpointing(*seq, {"*"}), (std::vector<std::string>{"0", "1"}));
  frozen->calls = trained->calls = 0;
  seq->forward(x).square().sum().backward();
  EXPECT_EQ(frozen->calls, 1);
  EXPECT_EQ(trained->calls, 2);
  EXPECT_TRUE(at::equal(trained->w.grad(), want));
  // An input that needs a gradient, or a parameter that trains: recomputed.
  frozen->calls = 0;
  seq->forward(x.clone().requires_grad_(true)).sum().backward();
  EXPECT_EQ(frozen->calls, 2);
  frozen->w.requires_grad_(true);
  frozen->calls = 0;
  seq->forward(x).sum().backward();
  EXPECT_EQ(frozen->calls, 2);
  frozen->w.requires_grad_(false);
  // checkpoint_sequential: the first segment frozen, the last never checkpointed.
  nn::Sequential plain(frozen, trained);
  trained->w.mutable_grad() = at::Tensor();
  frozen->calls = trained->calls = 0;
  volt::checkpoint_sequential(plain, 2, x).square().sum().backward();
  EXPECT_EQ(frozen->calls, 1);
  EXPECT_EQ(trained->calls, 1);
  EXPECT_TRUE(at::equal(trained->w.grad(), want));
  // volt::checkpoint of a module holder: the frozen one runs once, the trained one twice.
  nn::Sequential frozen_alone(frozen), trained_alone(trained);
  trained->w.mutable_grad() = at::Tensor();
  frozen->calls = trained->calls = 0;
  volt::checkpoint(trained_alone, volt::checkpoint(frozen_alone, x)).square().sum().backward();
  EXPECT_EQ(frozen->calls, 1);
  EXPECT_EQ(trained->calls, 2);
  EXPECT_TRUE(at::equal(trained->w.grad(), want));
}

TEST(ActivationCheckpoint, AnEmptyModuleHolderOrANullModulePointerIsAConfigError) {
  const std::string want =
      "[checkpoint] the module is null (an empty holder or a null pointer); construct the module "
      "before checkpointing it.";
  try {
    volt::checkpoint(nn::Linear(nullptr), torch::randn({2, 2}));
    ADD_FAILURE() << "an empty holder was run";
  } catch (const volt::ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), want);
  }
  try {
    volt::checkpoint(std::shared_ptr<nn::LinearImpl>(), torch::randn({2, 2}));
    ADD_FAILURE() << "a null module pointer was run";
  } catch (const volt::ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), want);
  }
}

// Which targets the one- or several-tensor form takes (the others name no candidate).
template <typename Void, typename F, typename... In>
struct Checkpointable : std::false_type {};
template <typename F, typename... In>
struct Checkpointable<
    std::void_t<decltype(volt::checkpoint(std::declval<F>(), std::declval<const In&>()...))>, F,
    In...> : std::true_type {};
static_assert(Checkpointable<void, std::shared_ptr<nn::LinearImpl>, at::Tensor>::value);
static_assert(Checkpointable<void, nn::Linear, at::Tensor>::value);
static_assert(!Checkpointable<void, std::shared_ptr<nn::LinearImpl>, at::Tensor, at::Tensor>::value,
              "Linear's forward takes one tensor");
static_assert(!Checkpointable<void, std::shared_ptr<int>, at::Tensor>::value, "not a module");

// A module's std::shared_ptr with a several-tensor forward: the result and the gradients equal
// the plain call's, and the recomputation runs the forward again.
struct GatedImpl : nn::Module {
  GatedImpl() : fc(register_module("fc", nn::Linear(4, 4))) {}
  at::Tensor forward(const at::Tensor& x, const at::Tensor& gate) {
    ++calls;
    return fc(x) * torch::sigmoid(gate);
  }
  nn::Linear fc;
  int calls = 0;
};

TEST(ActivationCheckpoint, AModulePointerWithSeveralInputsGradientsBitwiseEqual) {
  torch::manual_seed(0);
  auto gated = std::make_shared<GatedImpl>();
  const at::Tensor x = torch::randn({3, 4}, torch::requires_grad());
  const at::Tensor gate = torch::randn({3, 4}, torch::requires_grad());
  gated->forward(x, gate).square().sum().backward();
  std::vector<at::Tensor> want{x.grad().clone(), gate.grad().clone(),
                               gated->fc->weight.grad().clone()};
  x.mutable_grad() = at::Tensor();
  gate.mutable_grad() = at::Tensor();
  gated->zero_grad();
  gated->calls = 0;
  at::Tensor y = volt::checkpoint(gated, x, gate);
  EXPECT_EQ(gated->calls, 1);
  y.square().sum().backward();
  EXPECT_EQ(gated->calls, 2) << "backward recomputes the forward";
  const std::vector<at::Tensor> got{x.grad(), gate.grad(), gated->fc->weight.grad()};
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(torch::equal(got[i], want[i])) << i;
}

// An entry with children of its own (a Sequential cannot hold a Sequential).
struct NormedLinearImpl : nn::Cloneable<NormedLinearImpl> {
  NormedLinearImpl() { reset(); }
  void reset() override {
    fc = register_module("fc", nn::Linear(8, 8));
    norm = register_module("norm", nn::LayerNorm(nn::LayerNormOptions({8})));
  }
  at::Tensor forward(at::Tensor x) { return norm(fc(x)); }
  nn::Linear fc{nullptr};
  nn::LayerNorm norm{nullptr};
};
TORCH_MODULE(NormedLinear);

// clone() of a model with wrapped entries: an independent deep copy with the same parameter
// names and values, still checkpointed, with the same gradients.
TEST(ActivationCheckpointWrap, AWrappedSequentialClonesDeepAndStaysCheckpointed) {
  torch::manual_seed(7);
  nn::Sequential seq(nn::Linear(4, 8), nn::Functional(torch::tanh), NormedLinear(),
                     nn::Linear(8, 2));
  volt::wrap_activation_checkpointing(*seq, {"*"});
  auto copy = std::dynamic_pointer_cast<nn::SequentialImpl>(seq->clone());
  ASSERT_NE(copy, nullptr);
  EXPECT_EQ(volt::checkpointed_modules(*copy), volt::checkpointed_modules(*seq));
  const auto mine = seq->named_parameters(), theirs = copy->named_parameters();
  ASSERT_EQ(mine.keys(), theirs.keys());
  for (const auto& kv : mine) {
    EXPECT_TRUE(torch::equal(kv.value(), theirs[kv.key()])) << kv.key();
    EXPECT_NE(kv.value().data_ptr(), theirs[kv.key()].data_ptr()) << kv.key() << " is shared";
  }
  EXPECT_EQ(seq->named_buffers().keys(), copy->named_buffers().keys());
  const at::Tensor x = torch::randn({5, 4});
  at::Tensor y = copy->forward(x.clone().requires_grad_(true));
  EXPECT_NE(y.grad_fn()->name().find("CheckpointNode"), std::string::npos) << y.grad_fn()->name();
  y.sum().backward();
  seq->forward(x.clone().requires_grad_(true)).sum().backward();
  for (const auto& kv : mine) {
    ASSERT_TRUE(theirs[kv.key()].grad().defined()) << kv.key();
    EXPECT_TRUE(torch::equal(kv.value().grad(), theirs[kv.key()].grad())) << kv.key();
  }
  torch::NoGradGuard no_grad;
  theirs["0.weight"].add_(1.0);
  EXPECT_FALSE(torch::equal(mine["0.weight"], theirs["0.weight"]));
}

// eval() reaches a cloned wrapper's original: in the clone the wrapper is the registered child,
// the original is not, and its Dropout kept dropping after eval() (BatchNorm kept moving).
TEST(ActivationCheckpointWrap, AClonedModelsWrappedEntriesFollowTrainAndEval) {
  torch::manual_seed(8);
  nn::Sequential seq(nn::Linear(4, 8), nn::Dropout(0.5), nn::BatchNorm1d(8), nn::Linear(8, 2));
  volt::wrap_activation_checkpointing(*seq, {"*"});
  auto copy = std::dynamic_pointer_cast<nn::SequentialImpl>(seq->clone());
  ASSERT_NE(copy, nullptr);
  seq->eval();
  copy->eval();
  const at::Tensor x = torch::randn({6, 4});
  EXPECT_TRUE(torch::equal(copy->forward(x), seq->forward(x)));
  EXPECT_TRUE(torch::equal(copy->named_buffers()["2.running_mean"],
                           seq->named_buffers()["2.running_mean"]));
  copy->train();
  const at::Tensor before = copy->named_buffers()["2.running_mean"].clone();
  copy->forward(x);
  EXPECT_FALSE(torch::equal(copy->named_buffers()["2.running_mean"], before));
}

TEST(ActivationCheckpointWrap, GlobSyntax) {
  EXPECT_TRUE(volt::module_path_matches("blocks.*", "blocks.3"));
  EXPECT_FALSE(volt::module_path_matches("blocks.*", "blocks.3.0"));
  EXPECT_TRUE(volt::module_path_matches("blocks.**", "blocks.3.0"));
  EXPECT_TRUE(volt::module_path_matches("encoder.**.mlp", "encoder.layers.3.mlp"));
  EXPECT_TRUE(volt::module_path_matches("encoder.layers.3", "encoder.layers.3"));
  EXPECT_FALSE(volt::module_path_matches("encoder.layers.3", "encoder.layers.30"));
  EXPECT_TRUE(volt::module_path_matches("*.1", "blocks.1"));
  EXPECT_TRUE(volt::module_path_matches("*", "blocks"));
  EXPECT_FALSE(volt::module_path_matches("*", "blocks.1"));
  EXPECT_TRUE(volt::module_path_matches("**", ""));
  EXPECT_TRUE(volt::module_path_matches("blocks.*1*", "blocks.210"));
  EXPECT_TRUE(volt::module_path_matches("***.0", "a.b.0"));  // "**" then "*"
  EXPECT_FALSE(volt::module_path_matches("", "a"));
  EXPECT_FALSE(volt::module_path_matches("blocks.3", "blocks."));
}

TEST(ActivationCheckpointWrap, GlobCostIsBoundedByPatternTimesPath) {
  // The recursive matcher tried every split for each star, exponential in the stars: 36 stars
  // and a letter the path lacks took 0.8 s against a 13-character path, 48 about 25 s (each two
  // more about 1.8 times). Now O(pattern x path).
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(volt::module_path_matches(std::string(24, '*') + "x", "encoder.mlp.3"));
  EXPECT_FALSE(volt::module_path_matches(std::string(48, '*') + "x", "encoder.layers.3.mlp"));
  EXPECT_TRUE(volt::module_path_matches(std::string(48, '*') + "p", "encoder.layers.3.mlp"));
  EXPECT_FALSE(volt::module_path_matches(std::string(1 << 20, 'a'), "encoder.mlp.3"));
  EXPECT_TRUE(volt::module_path_matches(std::string(1 << 20, '*'), "encoder.mlp"));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(secs, 1.0);
}

TEST(ActivationCheckpointWrap, PatternMatchingNothingIsAConfigError) {
  DeepMlp m(2, 4, 0.0);
  try {
    volt::wrap_activation_checkpointing(m, {"blocks.*", "layers.*"});
    FAIL() << "accepted";
  } catch (const volt::ConfigError& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("pattern \"layers.*\" matches no submodule"), std::string::npos) << w;
    EXPECT_NE(w.find("\"blocks.0\""), std::string::npos) << w;  // lists what exists
  }
  EXPECT_TRUE(volt::checkpointed_modules(m).empty());  // nothing wrapped on error
}

TEST(ActivationCheckpointWrap, MatchOutsideASequentialIsAConfigError) {
  DeepMlp m(2, 4, 0.0);
  try {
    volt::wrap_activation_checkpointing(m, {"head"});
    FAIL() << "accepted";
  } catch (const volt::ConfigError& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("not an entry of a torch::nn::Sequential"), std::string::npos) << w;
    EXPECT_NE(w.find("call volt::checkpoint(block, x)"), std::string::npos) << w;
  }
  // A volt::Pipeline's layers: the pipeline's own options checkpoint them.
  struct Piped : nn::Module {
    Piped() { register_module("net", volt::Pipeline(nn::Sequential(nn::Linear(2, 2)))); }
  } piped;
  const std::string w = volt_test::error_of<volt::ConfigError>(
      [&] { volt::wrap_activation_checkpointing(piped, {"net.0"}); });
  EXPECT_NE(
      w.find("\"net.0\" (torch::nn::LinearImpl) is a layer of the volt::Pipeline \"net\", which "
             "checkpoints its stages itself: set PipelineOptions::checkpoint"),
      std::string::npos)
      << w;
  EXPECT_TRUE(volt::checkpointed_modules(piped).empty());
}

struct Scale : nn::Module {
  at::Tensor forward(at::Tensor x, double s) { return x * s; }
};
struct FromDouble : nn::Module {
  at::Tensor forward(double v) { return torch::full({1}, v); }
};
struct ToDouble : nn::Module {
  double forward(at::Tensor x) { return x.sum().item<double>(); }
};

TEST(ActivationCheckpointWrap, NonTensorForwardSignatureIsAConfigError) {
  nn::Sequential two_args(std::make_shared<Scale>(), nn::ReLU());
  EXPECT_TRUE(torch::equal(two_args->forward(torch::ones({2}), 2.0), torch::full({2}, 2.0)));
  try {
    volt::wrap_activation_checkpointing(*two_args, {"0"});
    FAIL() << "accepted";
  } catch (const volt::ConfigError& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("does not take one Tensor"), std::string::npos) << w;
    EXPECT_NE(w.find("expects 2 argument(s)"), std::string::npos) << w;
  }
  nn::Sequential chain(std::make_shared<ToDouble>(), std::make_shared<FromDouble>());
  try {
    volt::wrap_activation_checkpointing(*chain, {"1"});
    FAIL() << "accepted";
  } catch (const volt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("takes double"), std::string::npos) << e.what();
  }
  // A non-Tensor result is only visible when it runs.
  volt::wrap_activation_checkpointing(*chain, {"0"});
  EXPECT_THROW(chain->forward<at::Tensor>(torch::ones({2}).requires_grad_(true)),
               volt::ConfigError);
}

// -------------------------------------------------------------------------- peak memory

TEST(ActivationCheckpointMemory, DeepMlpPeakDropsAsTheModelPredicts) {
  volt::install_counting_cpu_allocator();
  const int64_t depth = 16, width = 64, batch = 256;
  DeepMlp m(depth, width, 0.0);
  const at::Tensor x = torch::randn({batch, width});
  auto peak = [&](bool ckpt) {
    auto step = [&] {
      at::Tensor y = ckpt ? m.forward_checkpointed(x, volt::CheckpointOptions()) : m.forward(x);
      y.sum().backward();
    };
    step();  // gradients exist from here on: both measurements hold them
    const int64_t base = volt::cpu_memory_stats().in_use;
    volt::reset_cpu_memory_peaks();
    step();
    return volt::cpu_memory_stats().max_in_use - base;
  };
  const int64_t plain = peak(false), ckpt = peak(true);
  // One unit = one [batch, width] fp32 activation. Each block saves its input (1 unit), the
  // GELU input and the second Linear's input (4 units each; dropout 0 saves no mask):
  // 9 units per block without checkpointing, 1 with (plus one block's 9 while recomputing).
  const double unit = batch * width * 4.0;
  const double saved_plain = depth * 9 * unit, saved_ckpt = (depth + 9) * unit;
  EXPECT_GE(plain, 0.9 * saved_plain) << "the counter missed activations";
  EXPECT_LT(ckpt, plain - 0.5 * (saved_plain - saved_ckpt))
      << "plain " << plain << " B, checkpointed " << ckpt << " B";
  EXPECT_LT(static_cast<double>(ckpt) / plain, 0.6);
}

// ---------------------------------------------------------------- under DDP and ZeRO-3

// Two ranks trained with their first block (dropout, raw data: no input requires grad) and three
// deep layers checkpointed end with the weights of the same job without checkpointing: the
// gradient hooks of DDP's reducer and of ZeRO-3's partitioned parameters fire inside the nested
// backward, and stage 3 gathers the parameters again for the recomputation.
void expect_job_unchanged_by_checkpointing(const std::vector<std::string>& strategy) {
  volt_test::TempDir dir;
  auto job = [&](const std::string& name, bool ckpt) {
    std::vector<std::string> args{"--root",
                                  dir.path,
                                  "--out",
                                  dir.path + "/" + name,
                                  "--devices",
                                  "2",
                                  "--batch",
                                  "4",
                                  "--epochs",
                                  "1",
                                  "--samples",
                                  "32",
                                  "--dropout",
                                  "1",
                                  "--depth",
                                  "3",
                                  "--checkpoint-activations",
                                  ckpt ? "1" : "0",
                                  "--timeout",
                                  "120"};  // rendezvous on a loaded 2-core machine
    args.insert(args.end(), strategy.begin(), strategy.end());
    const volt_test::Job j = volt_test::run_job(args);
    EXPECT_EQ(j.code, 0) << j.output;
  };
  job("plain", false);
  job("ckpt", true);
  if (::testing::Test::HasFailure()) return;
  for (int r = 0; r < 2; ++r) {
    const std::string rank = ".rank" + std::to_string(r) + ".pt";
    const auto plain = volt_test::load_flat(dir.path + "/plain" + rank);
    const auto ckpt = volt_test::load_flat(dir.path + "/ckpt" + rank);
    EXPECT_TRUE(torch::equal(plain, ckpt))
        << "rank " << r << " max diff " << (plain - ckpt).abs().max().item<double>();
  }
}

TEST(ActivationCheckpointDistributed, DdpTwoRanksEqualWithoutCheckpointing) {
  VOLT_REQUIRE_GLOO();
  expect_job_unchanged_by_checkpointing({});
}

TEST(ActivationCheckpointDistributed, DeepSpeedStage3TwoRanksEqualWithoutCheckpointing) {
  VOLT_REQUIRE_GLOO();
  expect_job_unchanged_by_checkpointing({"--zero", "3"});
}

// Tensor parallelism (ModelParallelStrategy at 2 ranks: fc1 row-parallel on the whole input,
// deep.0 column-parallel, the head row-parallel): the recomputation in backward runs under the
// forward's tensor-parallel scope, so its row-parallel layers sum over the ranks again (before
// session 76 they did not, and the gradients were wrong).
TEST(ActivationCheckpointDistributed, ModelParallelTwoRanksEqualWithoutCheckpointing) {
  VOLT_REQUIRE_GLOO();
  expect_job_unchanged_by_checkpointing({"--tp", "2", "--depth", "1"});
}

TEST(ActivationCheckpointDistributed, Fp8WithDeepSpeedStage3TwoRanksEqualWithoutCheckpointing) {
  VOLT_REQUIRE_GLOO();
  // The three deep 16x16 layers run in fp8 (stateful delayed scaling), partitioned by ZeRO-3.
  expect_job_unchanged_by_checkpointing({"--zero", "3", "--precision", "fp8", "--width", "16"});
}

}  // namespace
