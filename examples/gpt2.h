#pragma once
// GPT-2 (Radford et al. 2019) as a libtorch module, for the #14 side by side with Lightning
// (benchmarks/gpt2.cpp, benchmarks/gpt2.py, which builds the same model in Python): token and
// position embeddings, pre-norm blocks (causal self-attention through volt::fused_sdpa, a 4x GELU
// MLP), a final LayerNorm, and the output projection tied to the token embedding. Gpt2Config()
// is GPT-2 small, 124,439,808 parameters. Initialisation as GPT-2's: weights N(0, 0.02), the
// residual projections N(0, 0.02 / sqrt(2 * layers)), biases 0.

#include <torch/torch.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <volt/volt.h>

namespace volt_examples {

struct Gpt2Config {
  int64_t vocab = 50257;
  int64_t context = 1024;  // the longest sequence (position embeddings)
  int64_t layers = 12;
  int64_t heads = 12;
  int64_t dim = 768;
};

/// Token ids [B, T] (int64, T <= context) -> logits [B, T, vocab].
struct Gpt2Net : torch::nn::Module {
  static constexpr const char* kName = "Gpt2Net";
  explicit Gpt2Net(Gpt2Config c = {}) : cfg(c) {
    TORCH_CHECK(c.dim % c.heads == 0, "[Gpt2Net] dim ", c.dim, " is not a multiple of heads ",
                c.heads);
    using torch::nn::Embedding, torch::nn::LayerNorm, torch::nn::LayerNormOptions,
        torch::nn::Linear;
    wte = register_module("wte", Embedding(c.vocab, c.dim));
    wpe = register_module("wpe", Embedding(c.context, c.dim));
    for (int64_t i = 0; i < c.layers; ++i) {
      const std::string n = "h" + std::to_string(i) + "_";
      ln_1.push_back(register_module(n + "ln_1", LayerNorm(LayerNormOptions({c.dim}))));
      c_attn.push_back(register_module(n + "c_attn", Linear(c.dim, 3 * c.dim)));
      attn_proj.push_back(register_module(n + "attn_proj", Linear(c.dim, c.dim)));
      ln_2.push_back(register_module(n + "ln_2", LayerNorm(LayerNormOptions({c.dim}))));
      c_fc.push_back(register_module(n + "c_fc", Linear(c.dim, 4 * c.dim)));
      mlp_proj.push_back(register_module(n + "mlp_proj", Linear(4 * c.dim, c.dim)));
    }
    ln_f = register_module("ln_f", LayerNorm(LayerNormOptions({c.dim})));
    torch::NoGradGuard no_grad;
    const double resid_std = 0.02 / std::sqrt(2.0 * static_cast<double>(c.layers));
    for (auto& p : named_parameters()) {
      const std::string& name = p.key();
      const bool bias = name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0;
      if (name.find("ln_") != std::string::npos) continue;  // LayerNorms keep 1 and 0
      if (bias) {
        p.value().zero_();
      } else {
        const bool resid = name.find("_proj.") != std::string::npos;
        p.value().normal_(0.0, resid ? resid_std : 0.02);
      }
    }
  }

  /// The logits [B, T, vocab]: hidden(idx) through the output projection.
  torch::Tensor forward(const torch::Tensor& idx) {
    // The output projection is the token embedding (tied, as GPT-2): one parameter for both.
    return torch::linear(hidden(idx), wte->weight);
  }

  /// The last hidden states [B, T, dim] (after the final LayerNorm), before the output
  /// projection: what volt::fused_linear_cross_entropy takes with wte->weight.
  torch::Tensor hidden(const torch::Tensor& idx) {
    const int64_t b = idx.size(0), t = idx.size(1), hd = cfg.dim / cfg.heads;
    TORCH_CHECK(t <= cfg.context, "[Gpt2Net] sequence of ", t, " tokens; the context is ",
                cfg.context);
    auto pos = torch::arange(t, idx.options());
    auto x = wte->forward(idx) + wpe->forward(pos);
    const auto heads = [&](const torch::Tensor& u) {
      return u.reshape({b, t, cfg.heads, hd}).transpose(1, 2);
    };
    for (size_t i = 0; i < c_attn.size(); ++i) {
      auto qkv = linear(c_attn[i], ln_1[i]->forward(x)).chunk(3, -1);
      auto a = volt::fused_sdpa(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]),
                                volt::SdpaOptions().is_causal(true))
                   .output;
      x = x + linear(attn_proj[i], a.transpose(1, 2).reshape({b, t, cfg.dim}));
      x = x + linear(mlp_proj[i], torch::gelu(linear(c_fc[i], ln_2[i]->forward(x)), "tanh"));
    }
    return ln_f->forward(x);
  }

  /// The layer `m` applied through aten::linear, as Python's nn.Linear applies it: for a
  /// contiguous 3-D input one GEMM with the bias added in it (addmm). The C++ frontend's
  /// torch::nn::Linear::forward (torch::nn::functional::linear, libtorch 1.13 and 2.11 alike)
  /// runs matmul and then a separate bias add on any input that is not 2-D: one more pass over
  /// every activation, forward and backward.
  static torch::Tensor linear(const torch::nn::Linear& m, const torch::Tensor& x) {
    return torch::linear(x, m->weight, m->bias);
  }

  Gpt2Config cfg;
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  std::vector<torch::nn::LayerNorm> ln_1, ln_2;
  std::vector<torch::nn::Linear> c_attn, attn_proj, c_fc, mlp_proj;
  torch::nn::LayerNorm ln_f{nullptr};
};

/// Next-token language modelling on a Gpt2Net: batches hold token ids as input and the same
/// sequence shifted by one as target; cross-entropy over the vocabulary; AdamW (lr 6e-4 by
/// default, betas 0.9/0.95, weight decay 0.1, as GPT-2 reproductions train it) through
/// volt::FusedAdamW. `fused_loss`: the output projection and the loss through
/// volt::fused_linear_cross_entropy (no [tokens, vocab] logits) instead of the composition,
/// with `loss_options` (e.g. pad_classes_to(1) to keep the vocabulary unpadded on CUDA).
class Gpt2Module : public volt::Module {
 public:
  explicit Gpt2Module(std::shared_ptr<Gpt2Net> net, double lr = 6e-4, bool fused_loss = false,
                      volt::LinearCrossEntropyOptions loss_options = {})
      : net_(register_module("net", std::move(net))),
        lr_(lr),
        fused_loss_(fused_loss),
        loss_options_(loss_options) {}
  torch::Tensor training_step(const volt::Batch& b, int64_t) override {
    torch::Tensor loss;
    if (fused_loss_) {
      const auto h = net_->hidden(b.input);
      loss = volt::fused_linear_cross_entropy(h.reshape({-1, h.size(-1)}), net_->wte->weight, {},
                                              b.target.reshape({-1}), loss_options_);
    } else {
      auto logits = net_->forward(b.input);
      loss = torch::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}).to(torch::kFloat),
                                       b.target.reshape({-1}));
    }
    log("train_loss", loss);
    return loss;
  }
  std::vector<volt::OptimizerConfig> configure_optimizers() override {
    return {std::make_shared<volt::FusedAdamW>(
        parameters(),
        volt::FusedAdamWOptions(lr_).betas(std::make_tuple(0.9, 0.95)).weight_decay(0.1))};
  }
  Gpt2Net& net() { return *net_; }

 private:
  std::shared_ptr<Gpt2Net> net_;
  double lr_;
  bool fused_loss_;
  volt::LinearCrossEntropyOptions loss_options_;
};

}  // namespace volt_examples
