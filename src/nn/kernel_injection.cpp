#include "volt/nn/kernel_injection.h"

#include <ATen/ATen.h>
#include <torch/nn/modules/activation.h>

#include "volt/core/check.h"
#include "volt/kernels/fused_sdpa.h"

namespace volt {
namespace {

constexpr const char* kTag = "[KernelInjection]";

// The activation module at `m`, when the fused epilogue computes it exactly as the module does.
c10::optional<Activation> fusable_activation(torch::nn::Module& m) {
  if (dynamic_cast<torch::nn::ReLUImpl*>(&m) != nullptr) return Activation::kRelu;
  if (dynamic_cast<torch::nn::SiLUImpl*>(&m) != nullptr) return Activation::kSilu;
  if (auto* g = dynamic_cast<torch::nn::GELUImpl*>(&m)) {
    if (g->options.approximate() == "none") return Activation::kGelu;
    if (g->options.approximate() == "tanh") return Activation::kGeluTanh;
  }
  return c10::nullopt;
}

const char* activation_label(Activation a) {
  switch (a) {
    case Activation::kRelu: return "ReLU";
    case Activation::kGelu: return "GELU";
    case Activation::kGeluTanh: return "GELU(tanh)";
    case Activation::kSilu: return "SiLU";
    case Activation::kIdentity: break;
  }
  return "Identity";
}

// An encoder layer the fused path reproduces: self-attention with packed q/k/v and no extra
// key/value biases, and a ReLU or GELU feed-forward (not a user callable).
bool fusable_encoder_layer(const torch::nn::TransformerEncoderLayerImpl& layer) {
  const auto& attn = *layer.self_attn;
  return attn._qkv_same_embed_dim && !attn.bias_k.defined() && !attn.bias_v.defined() &&
         !attn.options.add_zero_attn() && layer.options.activation().index() <= 1;
}

}  // namespace

FusedLinearActivationImpl::FusedLinearActivationImpl(const torch::nn::LinearImpl& linear,
                                                     Activation activation)
    : torch::nn::Module("FusedLinearActivation"), activation_(activation) {
  // Their own requires_grad: registering sets the flag on the very tensor, and a frozen Linear
  // came back trainable after restore() (its fused layer also fell back to the reference path).
  weight = register_parameter("weight", linear.weight, linear.weight.requires_grad());
  if (linear.bias.defined()) {
    bias = register_parameter("bias", linear.bias, linear.bias.requires_grad());
  }
}

at::Tensor FusedLinearActivationImpl::forward(const at::Tensor& x) {
  return fused_linear_activation(x, weight, bias, activation_);
}

FusedTransformerEncoderLayerImpl::FusedTransformerEncoderLayerImpl(
    std::shared_ptr<torch::nn::TransformerEncoderLayerImpl> layer)
    : torch::nn::Module("FusedTransformerEncoderLayer"), layer_(std::move(layer)) {
  VOLT_CHECK(layer_ != nullptr && fusable_encoder_layer(*layer_), ValueError, kTag,
             " this TransformerEncoderLayer has separate q/k/v weights, key/value biases or a "
             "callable activation, which the fused layer does not compute; keep the original.");
  activation_ = layer_->options.activation().index() == 0 ? Activation::kRelu : Activation::kGelu;
  // The original's children under their own names: parameter paths stay the same.
  for (const auto& child : layer_->named_children()) register_module(child.key(), child.value());
}

at::Tensor FusedTransformerEncoderLayerImpl::forward(const at::Tensor& src,
                                                     const at::Tensor& src_mask,
                                                     const at::Tensor& src_key_padding_mask) {
  auto& layer = *layer_;
  auto& attn = *layer.self_attn;
  const bool dropout = is_training() && layer.options.dropout() > 0;
  const bool recording = at::GradMode::is_enabled() && attn.in_proj_weight.requires_grad();
  if (src_mask.defined() || src_key_padding_mask.defined() || dropout || recording ||
      src.dim() != 3) {
    return layer.forward(src, src_mask, src_key_padding_mask);
  }
  // [seq, batch, embed] -> packed projection -> [batch, heads, seq, head_dim] each.
  const int64_t seq = src.size(0), batch = src.size(1), embed = src.size(2);
  const int64_t heads = attn.options.num_heads(), hd = embed / heads;
  const at::Tensor qkv = at::linear(src, attn.in_proj_weight, attn.in_proj_bias);
  auto split = [&](int64_t i) {
    return qkv.narrow(-1, i * embed, embed).reshape({seq, batch, heads, hd}).permute({1, 2, 0, 3});
  };
  const at::Tensor a = fused_sdpa(split(0), split(1), split(2)).output;  // [batch, heads, seq, hd]
  const at::Tensor merged = a.permute({2, 0, 1, 3}).reshape({seq, batch, embed});
  const at::Tensor x = layer.norm1(src + attn.out_proj(merged));
  const at::Tensor ff = layer.linear2(
      fused_linear_activation(x, layer.linear1->weight, layer.linear1->bias, activation_));
  return layer.norm2(x + ff);
}

KernelInjection::KernelInjection(torch::nn::Module& root) {
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::SequentialImpl>>> sequentials;
  if (auto* s = dynamic_cast<torch::nn::SequentialImpl*>(&root)) {
    // The root itself: only reachable through shared_from_this when it is owned by a shared_ptr.
    sequentials.emplace_back(
        "", std::dynamic_pointer_cast<torch::nn::SequentialImpl>(s->shared_from_this()));
  }
  for (const auto& item : root.named_modules("", false)) {
    if (auto s = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(item.value())) {
      sequentials.emplace_back(item.key(), s);
    }
  }
  auto path = [](const std::string& prefix, const std::string& name) {
    return prefix.empty() ? name : prefix + "." + name;
  };
  for (auto& [prefix, seq] : sequentials) {
    const auto children = seq->named_children();
    // A Sequential built by push_back names its entries in order; anything else (a child
    // registered by hand) would make names and entries disagree: leave it alone.
    if (children.size() != seq->size()) continue;
    for (size_t i = 0; i < seq->size(); ++i) {
      const std::shared_ptr<torch::nn::Module> entry = seq->ptr(i);
      // An entry standing in for its child (a checkpoint wrapper) is left alone; the entries
      // after it are still looked at (this stopped the whole Sequential).
      if (entry.get() != children[i].value().get()) continue;
      auto replace = [&](size_t at, torch::nn::AnyModule with, std::string label) {
        // The replacement runs in the original's mode (eval: no dropout, the fused path).
        with.ptr()->train(seq->ptr(at)->is_training());
        swaps_.push_back(Swap{seq, at, children[at].key(), seq->begin()[at]});
        seq->begin()[at] = with;
        seq->replace_module(children[at].key(), with.ptr());
        if (!label.empty())
          replaced_.push_back(path(prefix, children[at].key()) + " (" + label + ")");
      };
      if (auto* linear = dynamic_cast<torch::nn::LinearImpl*>(entry.get())) {
        if (i + 1 >= seq->size() || seq->ptr(i + 1).get() != children[i + 1].value().get())
          continue;
        const c10::optional<Activation> act = fusable_activation(*seq->ptr(i + 1));
        if (!act) continue;
        replace(i, torch::nn::AnyModule(FusedLinearActivation(*linear, *act)),
                std::string("Linear+") + activation_label(*act));
        replace(i + 1, torch::nn::AnyModule(torch::nn::Identity()), "");
        ++i;
      } else if (auto layer =
                     std::dynamic_pointer_cast<torch::nn::TransformerEncoderLayerImpl>(entry)) {
        if (!fusable_encoder_layer(*layer)) continue;
        replace(i, torch::nn::AnyModule(FusedTransformerEncoderLayer(layer)),
                "TransformerEncoderLayer");
      }
    }
  }
}

KernelInjection::~KernelInjection() {
  restore();
}

void KernelInjection::restore() {
  // Last swap first: an entry swapped twice ends as it began.
  for (auto it = swaps_.rbegin(); it != swaps_.rend(); ++it) {
    it->sequential->begin()[it->index] = it->original;
    it->sequential->replace_module(it->name, it->original.ptr());
  }
  swaps_.clear();
}

}  // namespace volt
