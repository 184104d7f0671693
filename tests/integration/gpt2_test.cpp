// examples/gpt2.h, the model of the GPT-2 benchmark (benchmarks/gpt2.cpp, issue #14): GPT-2
// small's exact parameter count, causality, the tied output projection, and a short bf16-mixed
// fit with FusedAdamW that learns.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "gpt2.h"
#include "tiny.h"

namespace {

using volt_examples::Gpt2Config;
using volt_examples::Gpt2Net;

Gpt2Config tiny_config() {
  Gpt2Config c;
  c.vocab = 97;
  c.context = 32;
  c.layers = 2;
  c.heads = 4;
  c.dim = 32;
  return c;
}

// GPT-2 small has 124,439,808 parameters (the published 124M count: embeddings 50257 x 768 and
// 1024 x 768, 12 blocks of 7,087,872, the final LayerNorm; the output projection is the token
// embedding, counted once).
TEST(Gpt2, SmallHasGpt2sParameterCountWithTheOutputTiedToTheEmbedding) {
  Gpt2Net net;
  int64_t n = 0;
  for (const auto& p : net.parameters()) n += p.numel();
  EXPECT_EQ(n, 124439808);
  EXPECT_EQ(net.parameters().size(), 2u + 12u * 12u + 2u);
}

// A token changes the logits at its own and later positions only.
TEST(Gpt2, LogitsDependOnEarlierTokensOnly) {
  torch::manual_seed(0);
  Gpt2Net net(tiny_config());
  net.eval();
  torch::NoGradGuard no_grad;
  auto idx = torch::randint(97, {2, 12}, torch::kLong);
  auto changed = idx.clone();
  changed.index_put_({torch::indexing::Slice(), 7}, (idx.select(1, 7) + 1) % 97);
  auto a = net.forward(idx), b = net.forward(changed);
  ASSERT_EQ(a.sizes(), (std::vector<int64_t>{2, 12, 97}));
  using torch::indexing::Slice;
  EXPECT_TRUE(torch::equal(a.index({Slice(), Slice(0, 7)}), b.index({Slice(), Slice(0, 7)})));
  for (int64_t t = 7; t < 12; ++t) {
    EXPECT_FALSE(torch::allclose(a.select(1, t), b.select(1, t))) << "position " << t;
  }
}

// The output projection is the embedding: its gradient collects both uses, so it equals the
// gradient of an untied copy's embedding plus that copy's output weight.
TEST(Gpt2, TheTiedEmbeddingGetsTheGradientOfBothUses) {
  torch::manual_seed(0);
  Gpt2Net net(tiny_config());
  auto idx = torch::randint(97, {2, 10}, torch::kLong);
  auto out = torch::randn({2, 10, 97});
  (net.forward(idx) * out).sum().backward();
  const auto tied = net.wte->weight.grad().clone();
  // Untied: the same computation with the output weight a separate leaf.
  net.zero_grad();
  auto w_out = net.wte->weight.detach().clone().requires_grad_(true);
  {
    const int64_t t = idx.size(1);
    auto x = net.wte->forward(idx) + net.wpe->forward(torch::arange(t));
    const int64_t b = 2, hd = 32 / 4;
    const auto heads = [&](const torch::Tensor& u) {
      return u.reshape({b, t, 4, hd}).transpose(1, 2);
    };
    for (size_t i = 0; i < net.c_attn.size(); ++i) {
      auto qkv = net.c_attn[i]->forward(net.ln_1[i]->forward(x)).chunk(3, -1);
      auto a = volt::sdpa_reference(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]),
                                    volt::SdpaOptions().is_causal(true))
                   .output;
      x = x + net.attn_proj[i]->forward(a.transpose(1, 2).reshape({b, t, 32}));
      x = x + net.mlp_proj[i]->forward(
                  torch::gelu(net.c_fc[i]->forward(net.ln_2[i]->forward(x)), "tanh"));
    }
    (torch::linear(net.ln_f->forward(x), w_out) * out).sum().backward();
  }
  const auto untied = net.wte->weight.grad() + w_out.grad();
  EXPECT_TRUE(torch::allclose(tied, untied, 1e-4, 1e-5))
      << (tied - untied).abs().max().item<double>();
  EXPECT_GT(w_out.grad().abs().max().item<double>(), 0.0);
}

// bf16-mixed fit with FusedAdamW on a repeating sequence: the loss falls well below ln(vocab).
// The CPU policy is off, so the GEMMs really compute in bf16 (it keeps them in fp32 where its
// probe finds bf16 slower: every size at one thread on this machine).
TEST(Gpt2, LearnsARepeatingSequenceUnderBf16MixedWithFusedAdamW) {
  auto seq = torch::arange(33, torch::kLong).remainder(11).repeat({64, 1});  // period 11
  auto x = seq.slice(1, 0, 32).contiguous(), y = seq.slice(1, 1, 33).contiguous();
  auto fit = [&](const volt::Spec<volt::Precision>& precision, int64_t epochs) {
    torch::manual_seed(0);
    auto net = std::make_shared<Gpt2Net>(tiny_config());
    volt_examples::Gpt2Module m(net, 3e-3);
    volt_test::TempDir dir;
    volt::Trainer t(volt::TrainerOptions()
                        .accelerator("cpu")
                        .precision(precision)
                        .max_epochs(epochs)
                        .default_root_dir(dir.path)
                        .logger(false)
                        .enable_checkpointing(false)
                        .enable_progress_bar(false)
                        .enable_model_summary(false));
    t.fit(m, volt::DataLoader(std::make_shared<volt::TensorDataset>(x, y),
                              volt::DataLoaderOptions(16).shuffle(true).seed(1)));
    return std::make_pair(t.callback_metrics().at("train_loss"), net->wte->weight.detach().clone());
  };
  const auto bf16 = [] {
    return std::make_shared<volt::MixedPrecision>(
        volt::MixedPrecisionOptions().cpu_policy(false).read_env_lists(false));
  };
  const double loss = fit(bf16(), 30).first;
  EXPECT_LT(loss, 0.5) << "ln(97) = 4.57 at the start";
  // bf16 did compute: one epoch already ends elsewhere than fp32's.
  EXPECT_FALSE(torch::equal(fit(bf16(), 1).second, fit("32-true", 1).second));
}

// The output projection and loss through volt::fused_linear_cross_entropy train the model as
// the composition does: the same losses step by step (float32, to rounding) and the same weights.
TEST(Gpt2, TheFusedOutputLayerAndLossTrainsLikeTheComposition) {
  auto seq = torch::arange(33, torch::kLong).remainder(11).repeat({32, 1});
  auto x = seq.slice(1, 0, 32).contiguous(), y = seq.slice(1, 1, 33).contiguous();
  auto fit = [&](bool fused) {
    torch::manual_seed(0);
    auto net = std::make_shared<Gpt2Net>(tiny_config());
    volt_examples::Gpt2Module m(net, 3e-3, fused);
    auto logger = std::make_shared<volt_test::MemoryLogger>();
    volt::Trainer t(volt::TrainerOptions()
                        .accelerator("cpu")
                        .max_steps(6)
                        .loggers({logger})
                        .log_every_n_steps(1)
                        .enable_checkpointing(false)
                        .enable_progress_bar(false)
                        .enable_model_summary(false));
    t.fit(m, volt::DataLoader(std::make_shared<volt::TensorDataset>(x, y),
                              volt::DataLoaderOptions(8)));
    std::vector<double> losses;
    for (const auto& rec : logger->with("train_loss"))
      losses.push_back(rec.second.at("train_loss"));
    return std::make_pair(losses, net->wte->weight.detach().clone());
  };
  const auto [composed, w_composed] = fit(false);
  const auto [fused, w_fused] = fit(true);
  ASSERT_EQ(composed.size(), 6u);
  ASSERT_EQ(fused.size(), composed.size());
  for (size_t i = 0; i < fused.size(); ++i)
    EXPECT_NEAR(fused[i], composed[i], 1e-4) << "step " << i;
  EXPECT_TRUE(torch::allclose(w_fused, w_composed, 1e-3, 1e-5))
      << (w_fused - w_composed).abs().max().item<double>();
}

}  // namespace
