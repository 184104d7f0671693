#include "volt/distributed/sync_batchnorm.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/torch.h>

#include <algorithm>

#include "core/detail/print.h"
#include "distributed/detail/intercept.h"
#include "volt/core/check.h"
#include "volt/core/log.h"
#include "volt/distributed/process_group.h"

namespace volt {
namespace {

constexpr const char* kTag = "[SyncBatchNorm]";

// A synchronised layer, found by the storage of its running_mean (or weight).
struct Layer {
  ProcessGroup* group;
  const void* owner;                // the SyncBatchNorm that registered it
  const torch::nn::Module* module;  // the layer (kept alive by its SyncBatchNorm)
};

detail::StorageMap<Layer>& layers_by_storage() {
  static auto* map = new detail::StorageMap<Layer>();  // outlives every tensor it names
  return *map;
}

// Every rank's `x` stacked in rank order ([world, ...]), differentiable: each rank's slice feeds
// every rank's output, so its gradient is the sum over ranks of that slice's output gradient
// (one all-reduce of the stacked gradient).
struct AllGather : torch::autograd::Function<AllGather> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            ProcessGroup* group) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    return at::stack(group->all_gather(x.contiguous()));
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* group = reinterpret_cast<ProcessGroup*>(ctx->saved_data["group"].toInt());
    const at::Tensor summed = group->all_reduce(grads[0].contiguous(), Reduce::kSum);
    return {summed.select(0, group->rank()), at::Tensor()};
  }
};

// batch_norm in training mode with the statistics of every rank's input. Each rank's per-channel
// mean and sum of squared deviations (two passes over its own input) and its count are gathered
// in one collective and combined exactly (Chan et al.'s parallel variance: no cancellation when
// the mean is large against the spread), as PyTorch's SyncBatchNorm gathers each rank's mean and
// invstd; backward is one all-reduce. Computed in fp32 (fp64 for fp64 input) and returned in the
// input's dtype; running statistics updated as batch_norm does (the unbiased variance),
// identically on every rank.
at::Tensor synced_batch_norm(ProcessGroup& group, const at::Tensor& input, const at::Tensor& weight,
                             const at::Tensor& bias, const at::Tensor& running_mean,
                             const at::Tensor& running_var, double momentum, double eps) {
  VOLT_CHECK(input.dim() >= 2, ValueError, kTag, " expects an input (N, C, ...), got sizes ",
             input.sizes(), ".");
  const int64_t channels = input.size(1);
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);
  std::vector<int64_t> shape(input.dim(), 1);
  shape[1] = channels;
  const at::Tensor x = input.scalar_type() == at::kDouble ? input : input.to(at::kFloat);
  const double local_count = static_cast<double>(input.numel() / std::max<int64_t>(channels, 1));
  // A rank with no rows (uneven data) contributes a count of 0 and a mean of 0, not NaN (the
  // mean of nothing), which made every rank's mean, output and running statistics NaN; it still
  // joins the collective (PyTorch's SyncBatchNorm does the same).
  const at::Tensor local_mean = local_count > 0 ? x.mean(dims) : at::zeros({channels}, x.options());
  const at::Tensor local_m2 = (x - local_mean.view(shape)).square().sum(dims);
  const at::Tensor all = AllGather::apply(
      at::cat({local_mean, local_m2, at::full({1}, local_count, x.options())}), &group);
  const at::Tensor counts = all.select(1, 2 * channels).detach().unsqueeze(1);  // [world, 1]
  const at::Tensor means = all.narrow(1, 0, channels);
  const at::Tensor count = counts.sum();
  const at::Tensor mean = (means * counts).sum(0) / count.clamp_min(1);
  const at::Tensor m2 =
      all.narrow(1, channels, channels).sum(0) + ((means - mean).square() * counts).sum(0);
  at::Tensor y = (x - mean.view(shape)) * (m2 / count + eps).rsqrt().view(shape);
  if (weight.defined()) y = y * weight.view(shape);
  if (bias.defined()) y = y + bias.view(shape);
  {
    torch::NoGradGuard no_grad;
    // No rows on any rank leave the running statistics as they were (batch_norm's rule for an
    // empty batch); tensor ops, no host read of the count.
    if (running_mean.defined()) {
      const at::Tensor moved = running_mean.mul(1.0 - momentum)
                                   .add_(mean.detach().to(running_mean.scalar_type()), momentum);
      running_mean.copy_(at::where(count > 0, moved, running_mean));
    }
    if (running_var.defined()) {
      const at::Tensor unbiased = m2.detach() / (count - 1);
      const at::Tensor moved =
          running_var.mul(1.0 - momentum).add_(unbiased.to(running_var.scalar_type()), momentum);
      running_var.copy_(at::where(count > 0, moved, running_var));
    }
  }
  return y.to(input.scalar_type());
}

// aten::batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps,
// cudnn_enabled): what BatchNorm{1,2,3}d's forward calls.
bool sync_batchnorm_interceptor(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                                torch::jit::Stack* stack) {
  const auto& map = layers_by_storage();
  if (map.empty()) return false;
  const c10::OperatorName& name = op.operator_name();
  constexpr size_t n = 9;
  if (name.name != "aten::batch_norm" || !name.overload_name.empty() ||
      op.schema().arguments().size() != n) {
    return false;
  }
  if (!torch::jit::peek(*stack, 5, n).toBool()) return false;  // evaluation: running statistics
  auto tensor_at = [&](size_t i) {
    const c10::IValue& v = torch::jit::peek(*stack, i, n);
    return v.isTensor() ? v.toTensor() : at::Tensor();
  };
  const at::Tensor weight = tensor_at(1), running_mean = tensor_at(3);
  c10::optional<Layer> layer;
  if (running_mean.defined()) layer = map.find(running_mean);
  if (!layer && weight.defined()) layer = map.find(weight);
  // A layer in evaluation mode without running statistics normalises by its own batch, as
  // PyTorch's SyncBatchNorm does outside training.
  if (!layer || !layer->module->is_training()) return false;
  c10::impl::ExcludeDispatchKeyGuard no_intercept(detail::kInterceptKey);
  at::Tensor out = synced_batch_norm(
      *layer->group, tensor_at(0), weight, tensor_at(2), running_mean, tensor_at(4),
      torch::jit::peek(*stack, 6, n).toDouble(), torch::jit::peek(*stack, 7, n).toDouble());
  torch::jit::drop(*stack, n);
  torch::jit::push(*stack, std::move(out));
  return true;
}

}  // namespace

struct SyncBatchNorm::Impl {
  struct Entry {
    std::string path;
    std::shared_ptr<torch::nn::Module> module;  // keeps the tensors below alive
    at::Tensor* running_mean;
    at::Tensor* weight;
  };
  std::shared_ptr<ProcessGroup> group;
  std::vector<Entry> entries;

  template <typename BatchNorm>
  bool take(const std::string& path, const std::shared_ptr<torch::nn::Module>& m,
            std::vector<std::string>& unkeyed) {
    auto bn = std::dynamic_pointer_cast<BatchNorm>(m);
    if (!bn) return false;
    if (!bn->running_mean.defined() && !bn->weight.defined()) {
      unkeyed.push_back(path);
    } else {
      entries.push_back(Entry{path, m, &bn->running_mean, &bn->weight});
    }
    return true;
  }

  static const at::Tensor& key_tensor(const Entry& e) {
    return e.running_mean->defined() ? *e.running_mean : *e.weight;
  }

  // Forgets the layers `owner` registered.
  static void drop(const void* owner) {
    layers_by_storage().erase_if([owner](const Layer& l) { return l.owner == owner; });
  }

  // Registers the layers under their current storages: a module moved, converted or loaded into
  // new tensors since the last scope is found again, and so is one that another SyncBatchNorm
  // over the same model took over and dropped.
  void refresh(const void* owner) {
    bool changed = false;
    for (const auto& e : entries) {
      const c10::optional<Layer> now = layers_by_storage().find(key_tensor(e));
      changed = changed || !now || now->owner != owner;
    }
    if (!changed) return;
    drop(owner);
    for (const auto& e : entries) {
      layers_by_storage().set(detail::storage_of(key_tensor(e)),
                              Layer{group.get(), owner, e.module.get()});
    }
  }
};

SyncBatchNorm::SyncBatchNorm(torch::nn::Module& root, std::shared_ptr<ProcessGroup> group)
    : impl_(std::make_unique<Impl>()) {
  VOLT_CHECK(group != nullptr, ConfigError, kTag,
             " needs a process group; pass the data-parallel group (DdpStrategy's).");
  impl_->group = std::move(group);
  std::vector<std::string> unkeyed;
  auto take = [&](const std::string& path, const std::shared_ptr<torch::nn::Module>& m) {
    impl_->take<torch::nn::BatchNorm1dImpl>(path, m, unkeyed) ||
        impl_->take<torch::nn::BatchNorm2dImpl>(path, m, unkeyed) ||
        impl_->take<torch::nn::BatchNorm3dImpl>(path, m, unkeyed);
  };
  // The root may live on the stack (a user's Module usually does): held without ownership.
  take("", std::shared_ptr<torch::nn::Module>(std::shared_ptr<void>(), &root));
  for (const auto& item : root.named_modules("", /*include_self=*/false)) {
    take(item.key(), item.value());
  }
  if (!unkeyed.empty()) {
    const std::string names =
        detail::joined(unkeyed, [](const std::string& path) -> const std::string& { return path; });
    log_warning("SyncBatchNorm",
                "not synchronised (no running statistics and no affine weight to recognise them "
                "by): " +
                    names + "; give them affine=true or track_running_stats=true.");
  }
  if (impl_->entries.empty() && unkeyed.empty()) {
    log_warning("SyncBatchNorm",
                "the model has no BatchNorm1d/2d/3d layer; sync_batchnorm changes nothing.");
  }
  if (!impl_->entries.empty()) detail::add_interceptor(&sync_batchnorm_interceptor);
  impl_->refresh(this);
}

SyncBatchNorm::~SyncBatchNorm() {
  Impl::drop(this);
}

std::vector<std::string> SyncBatchNorm::layers() const {
  std::vector<std::string> out;
  for (const auto& e : impl_->entries) out.push_back(e.path);
  return out;
}

struct SyncBatchNorm::Scope::Impl {
  c10::impl::IncludeDispatchKeyGuard include{detail::kInterceptKey};
};

SyncBatchNorm::Scope::Scope(SyncBatchNorm& sync) {
  if (sync.impl_->entries.empty()) return;  // nothing to see: no dispatcher detour
  sync.impl_->refresh(&sync);
  impl_ = std::make_unique<Impl>();
}

SyncBatchNorm::Scope::~Scope() = default;

}  // namespace volt
