#pragma once
/// Kernel injection (DeepSpeed inference's `replace_with_kernel_inject`): recognised blocks of a
/// model are swapped for volt's fused inference kernels without editing the model, and swapped
/// back afterwards.
///
/// C++ modules call their children through typed members, which nothing outside can re-point;
/// a torch::nn::Sequential calls its entries through type-erased holders, which can. So the
/// blocks recognised are Sequential entries:
///   - Linear followed by ReLU, GELU (none or tanh) or SiLU -> FusedLinearActivation (the
///     activation's entry becomes an Identity);
///   - TransformerEncoderLayer -> FusedTransformerEncoderLayer (attention through
///     volt::fused_sdpa, feed-forward through FusedLinearActivation).
/// The replacements hold the originals' parameter tensors, so parameter names, state dicts,
/// dtype casts and tensor parallelism's splits are unchanged.
///
///   volt::KernelInjection injected(*model);   // predictions now run the fused kernels
///   ...
///   injected.restore();                       // (or let it go out of scope)

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/transformerlayer.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <string>
#include <vector>

#include "volt/kernels/fused_bias_activation.h"

namespace volt {

/// A Linear and the activation after it as one layer: fused_linear_activation (the product, then
/// bias and activation in one pass). Holds `linear`'s own weight and bias tensors.
class FusedLinearActivationImpl : public torch::nn::Module {
 public:
  FusedLinearActivationImpl(const torch::nn::LinearImpl& linear, Activation activation);
  at::Tensor forward(const at::Tensor& x);
  Activation activation() const { return activation_; }

  at::Tensor weight, bias;

 private:
  Activation activation_;
};
TORCH_MODULE(FusedLinearActivation);

/// libtorch's TransformerEncoderLayer (post-norm, [seq, batch, embed]) for inference: packed q/k/v
/// projection, volt::fused_sdpa, the output projection, and a FusedLinearActivation feed-forward.
/// Holds the original's submodules and tensors; runs the original's forward where the fused path
/// does not apply (masks, autograd recording, training mode with dropout).
class FusedTransformerEncoderLayerImpl : public torch::nn::Module {
 public:
  explicit FusedTransformerEncoderLayerImpl(
      std::shared_ptr<torch::nn::TransformerEncoderLayerImpl> layer);
  at::Tensor forward(const at::Tensor& src, const at::Tensor& src_mask = {},
                     const at::Tensor& src_key_padding_mask = {});

 protected:
  FORWARD_HAS_DEFAULT_ARGS({1, torch::nn::AnyValue(at::Tensor())},
                           {2, torch::nn::AnyValue(at::Tensor())})

 private:
  std::shared_ptr<torch::nn::TransformerEncoderLayerImpl> layer_;
  Activation activation_ = Activation::kRelu;
  bool fusable_activation_ = true;
};
TORCH_MODULE(FusedTransformerEncoderLayer);

/// Swaps the recognised blocks under `root` (see the file comment) for their fused versions for
/// its lifetime; restore() or the destructor puts the original entries back.
class KernelInjection {
 public:
  explicit KernelInjection(torch::nn::Module& root);
  ~KernelInjection();
  KernelInjection(const KernelInjection&) = delete;
  KernelInjection& operator=(const KernelInjection&) = delete;

  /// Paths of the replaced entries with what replaced them, e.g. "blocks.0.mlp.0 (Linear+GELU)".
  const std::vector<std::string>& replaced() const { return replaced_; }
  /// Puts every original entry back (idempotent).
  void restore();

 private:
  struct Swap {
    std::shared_ptr<torch::nn::SequentialImpl> sequential;
    size_t index;
    std::string name;
    torch::nn::AnyModule original;
  };
  std::vector<Swap> swaps_;
  std::vector<std::string> replaced_;
};

}  // namespace volt
