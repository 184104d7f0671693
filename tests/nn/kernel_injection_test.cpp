// KernelInjection: recognised Sequential entries (Linear + activation, TransformerEncoderLayer)
// swap to the fused inference modules and back; outputs against the untouched model (fused
// epilogue: 1e-5; encoder layers through fused_sdpa: 1e-4), parameter names and tensors
// unchanged, the originals back after restore(), unrecognised shapes left alone.

#include <torch/torch.h>

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "volt/nn/checkpoint.h"
#include "volt/nn/kernel_injection.h"

namespace {

namespace nn = torch::nn;

// A model whose MLP is a Sequential inside a typed member, and a typed Linear + GELU outside any
// Sequential (which injection cannot reach and must leave alone).
struct Net : nn::Module {
  Net() {
    stem = register_module("stem", nn::Linear(12, 16));
    mlp = register_module(
        "mlp", nn::Sequential(nn::Linear(16, 32), nn::GELU(), nn::Linear(32, 32), nn::ReLU(),
                              nn::Linear(32, 24), nn::SiLU(), nn::Linear(24, 8), nn::Tanh()));
  }
  at::Tensor forward(const at::Tensor& x) { return mlp->forward(torch::gelu(stem->forward(x))); }
  nn::Linear stem{nullptr};
  nn::Sequential mlp{nullptr};
};

std::vector<std::string> names(nn::Module& m) {
  std::vector<std::string> out;
  for (const auto& p : m.named_parameters()) out.push_back(p.key());
  return out;
}

TEST(KernelInjection, LinearActivationPairsRunFusedAndComeBack) {
  torch::manual_seed(0);
  auto net = std::make_shared<Net>();
  net->eval();
  const at::Tensor x = torch::randn({6, 12});
  torch::NoGradGuard no_grad;
  const at::Tensor want = net->forward(x);
  const auto before_names = names(*net);
  const auto before_params = net->parameters();
  std::vector<const nn::Module*> before_entries;
  for (size_t i = 0; i < net->mlp->size(); ++i) before_entries.push_back(net->mlp->ptr(i).get());
  {
    volt::KernelInjection injected(*net);
    EXPECT_EQ(injected.replaced(),
              (std::vector<std::string>{"mlp.0 (Linear+GELU)", "mlp.2 (Linear+ReLU)",
                                        "mlp.4 (Linear+SiLU)"}));
    EXPECT_NE(net->mlp->ptr(0)->as<volt::FusedLinearActivationImpl>(), nullptr);
    EXPECT_NE(net->mlp->ptr(1)->as<nn::IdentityImpl>(), nullptr);
    EXPECT_NE(net->mlp->ptr(6)->as<nn::LinearImpl>(), nullptr);  // before Tanh: not fusable
    // Same parameter names, the very same tensors.
    EXPECT_EQ(names(*net), before_names);
    const auto during = net->parameters();
    ASSERT_EQ(during.size(), before_params.size());
    for (size_t i = 0; i < during.size(); ++i) EXPECT_TRUE(during[i].is_same(before_params[i]));
    const at::Tensor got = net->forward(x);
    EXPECT_TRUE(torch::allclose(got, want, 1e-5, 1e-5)) << (got - want).abs().max().item<double>();
  }
  for (size_t i = 0; i < net->mlp->size(); ++i) {
    EXPECT_EQ(net->mlp->ptr(i).get(), before_entries[i]) << "entry " << i;
    EXPECT_EQ(net->mlp->named_children()[i].value().get(), before_entries[i]) << "child " << i;
  }
  EXPECT_TRUE(torch::equal(net->forward(x), want));
}

TEST(KernelInjection, EncoderLayersRunFusedAttentionAndFallBackForMasks) {
  torch::manual_seed(1);
  for (auto act : {nn::TransformerEncoderLayerOptions(32, 4).activation(torch::kReLU),
                   nn::TransformerEncoderLayerOptions(32, 4).activation(torch::kGELU)}) {
    auto seq = nn::Sequential(nn::TransformerEncoderLayer(act.dim_feedforward(64)),
                              nn::TransformerEncoderLayer(act.dim_feedforward(64)));
    seq->eval();
    const at::Tensor x = torch::randn({10, 3, 32});  // [seq, batch, embed]
    torch::NoGradGuard no_grad;
    const at::Tensor want = seq->forward(x);
    const auto before_names = names(*seq);
    volt::KernelInjection injected(*seq.ptr());
    EXPECT_EQ(injected.replaced(), (std::vector<std::string>{"0 (TransformerEncoderLayer)",
                                                             "1 (TransformerEncoderLayer)"}));
    EXPECT_EQ(names(*seq), before_names);
    const at::Tensor got = seq->forward(x);
    EXPECT_TRUE(torch::allclose(got, want, 1e-4, 1e-4)) << (got - want).abs().max().item<double>();
    // A mask is the original layer's job: bitwise its output.
    auto fused = seq->ptr<volt::FusedTransformerEncoderLayerImpl>(0);
    auto original = std::dynamic_pointer_cast<nn::TransformerEncoderLayerImpl>(
        seq->named_children()[0].value());
    ASSERT_EQ(original, nullptr) << "the Sequential's child should be the fused layer now";
    const at::Tensor mask =
        torch::zeros({10, 10}).masked_fill(torch::ones({10, 10}).triu(1).to(torch::kBool), -1e9);
    injected.restore();
    const at::Tensor masked_want = seq->ptr<nn::TransformerEncoderLayerImpl>(0)->forward(x, mask);
    EXPECT_TRUE(torch::equal(fused->forward(x, mask), masked_want));
    EXPECT_TRUE(torch::equal(seq->forward(x), want));
  }
}

TEST(KernelInjection, TrainingRunsTheOriginalComputationWithItsGradients) {
  torch::manual_seed(2);
  auto seq = nn::Sequential(nn::Linear(8, 16), nn::GELU(), nn::Linear(16, 4));
  const at::Tensor x = torch::randn({5, 8});
  seq->forward(x).pow(2).sum().backward();
  std::vector<at::Tensor> want;
  for (const auto& p : seq->parameters()) want.push_back(p.grad().clone());
  seq->zero_grad();
  volt::KernelInjection injected(*seq.ptr());
  ASSERT_EQ(injected.replaced().size(), 1u);
  // Autograd recording: the fused layer runs the reference composition, so backward works and
  // gives the same gradients.
  seq->forward(x).pow(2).sum().backward();
  const auto params = seq->parameters();
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(torch::equal(params[i].grad(), want[i]));
}

// A frozen Linear stays frozen while fused and after restore(): registering its weight in the
// fused layer set requires_grad on the very tensor, so a model frozen for inference came back
// trainable (and, with grad mode on, the fused layer fell back to the recorded reference path).
TEST(KernelInjection, AFrozenLinearStaysFrozenFusedAndAfterwards) {
  auto seq = nn::Sequential(nn::Linear(4, 6), nn::ReLU(), nn::Linear(6, 2));
  auto first = seq->ptr(0)->as<nn::LinearImpl>();
  first->weight.requires_grad_(false);
  first->bias.requires_grad_(false);
  {
    volt::KernelInjection injected(*seq.ptr());
    ASSERT_EQ(injected.replaced(), (std::vector<std::string>{"0 (Linear+ReLU)"}));
    EXPECT_FALSE(first->weight.requires_grad());
    EXPECT_FALSE(first->bias.requires_grad());
    for (const auto& p : seq->named_parameters()) {
      EXPECT_EQ(p.value().requires_grad(), p.key().rfind("0.", 0) != 0) << p.key();
    }
  }
  EXPECT_FALSE(first->weight.requires_grad());
  EXPECT_FALSE(first->bias.requires_grad());
}

// An entry standing in for its registered child (a checkpoint wrapper) is skipped, and the pairs
// after it are still fused (the scan used to stop at it).
TEST(KernelInjection, PairsAfterACheckpointWrappedEntryAreStillFused) {
  auto seq = nn::Sequential(nn::Linear(4, 6), nn::Tanh(), nn::Linear(6, 6), nn::ReLU());
  ASSERT_EQ(volt::wrap_activation_checkpointing(*seq.ptr(), std::vector<std::string>{"1"}),
            (std::vector<std::string>{"1"}));
  volt::KernelInjection injected(*seq.ptr());
  EXPECT_EQ(injected.replaced(), (std::vector<std::string>{"2 (Linear+ReLU)"}));
}

TEST(KernelInjection, NothingRecognisedLeavesTheModelAlone) {
  auto seq = nn::Sequential(nn::Linear(4, 4), nn::Tanh(), nn::Linear(4, 4));
  Net typed;  // its stem + gelu are typed members: unreachable, untouched
  volt::KernelInjection a(*seq.ptr());
  EXPECT_TRUE(a.replaced().empty());
  auto only_linear = nn::Sequential(nn::Linear(4, 4));
  volt::KernelInjection b(*only_linear.ptr());
  EXPECT_TRUE(b.replaced().empty());
  volt::KernelInjection c(typed);
  EXPECT_EQ(c.replaced().size(), 3u);  // its Sequential's pairs only
  EXPECT_NE(typed.stem.get(), nullptr);
  EXPECT_EQ(typed.named_children()[0].value().get(), typed.stem.get());
}

}  // namespace
