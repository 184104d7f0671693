#include "volt/kernels/fused_sgd.h"

#include <torch/optim/serialize.h>
#include <torch/serialize/archive.h>

#include <ostream>

#include "detail/fused_common.h"
#include "detail/fused_cuda.h"
#include "detail/multi_tensor.h"
#include "volt/core/check.h"

namespace volt {
namespace {

constexpr const char* kName = "FusedSGD";
constexpr const char* kReference = "torch::optim::SGD";
constexpr int kMomentumBuffer = 0;  // the only state kind

void validate(const FusedSGDOptions& o, const std::string& where) {
  VOLT_CHECK(o.lr() >= 0, ConfigError, "[FusedSGD] ", where, " lr=", o.lr(),
             " must be >= 0; pass a non-negative learning rate.");
  VOLT_CHECK(o.momentum() >= 0, ConfigError, "[FusedSGD] ", where, " momentum=", o.momentum(),
             " must be >= 0; use 0 to disable momentum.");
  VOLT_CHECK(o.weight_decay() >= 0, ConfigError, "[FusedSGD] ", where,
             " weight_decay=", o.weight_decay(), " must be >= 0; use 0 to disable it.");
  VOLT_CHECK(!o.nesterov() || (o.momentum() > 0 && o.dampening() == 0), ConfigError, "[FusedSGD] ",
             where,
             " nesterov=true needs momentum > 0 and dampening == 0 (got "
             "momentum=",
             o.momentum(), ", dampening=", o.dampening(),
             "); set a momentum and zero dampening, or nesterov(false).");
}

FusedSGDOptions& options_of(torch::optim::OptimizerParamGroup& group, size_t index) {
  return detail::group_options<FusedSGDOptions>(kName, "FusedSGDOptions", group, index);
}

}  // namespace

// ---------------------------------------------------------------- options and state

FusedSGDOptions::FusedSGDOptions(double lr) : lr_(lr) {}

bool operator==(const FusedSGDOptions& lhs, const FusedSGDOptions& rhs) {
  return lhs.lr() == rhs.lr() && lhs.momentum() == rhs.momentum() &&
         lhs.dampening() == rhs.dampening() && lhs.weight_decay() == rhs.weight_decay() &&
         lhs.nesterov() == rhs.nesterov();
}

void FusedSGDOptions::serialize(torch::serialize::OutputArchive& archive) const {
  archive.write("lr", c10::IValue(lr()));
  archive.write("momentum", c10::IValue(momentum()));
  archive.write("dampening", c10::IValue(dampening()));
  archive.write("weight_decay", c10::IValue(weight_decay()));
  archive.write("nesterov", c10::IValue(nesterov()));
}

void FusedSGDOptions::serialize(torch::serialize::InputArchive& archive) {
  lr(detail::read_required<double>(archive, kName, "lr"));
  momentum(detail::read_required<double>(archive, kName, "momentum"));
  dampening(detail::read_required<double>(archive, kName, "dampening"));
  weight_decay(detail::read_required<double>(archive, kName, "weight_decay"));
  nesterov(detail::read_required<bool>(archive, kName, "nesterov"));
}

double FusedSGDOptions::get_lr() const {
  return lr();
}

void FusedSGDOptions::set_lr(const double lr) {
  this->lr(lr);
}

std::ostream& operator<<(std::ostream& os, const FusedSGDOptions& o) {
  return os << "FusedSGDOptions(lr=" << o.lr() << ", momentum=" << o.momentum()
            << ", dampening=" << o.dampening() << ", weight_decay=" << o.weight_decay()
            << ", nesterov=" << std::boolalpha << o.nesterov() << std::noboolalpha << ")";
}

bool operator==(const FusedSGDParamState& lhs, const FusedSGDParamState& rhs) {
  return detail::equal_or_undefined(lhs.momentum_buffer(), rhs.momentum_buffer());
}

void FusedSGDParamState::serialize(torch::serialize::OutputArchive& archive) const {
  detail::write_tensor(archive, "momentum_buffer", momentum_buffer());
}

void FusedSGDParamState::serialize(torch::serialize::InputArchive& archive) {
  momentum_buffer(detail::read_tensor(archive, "momentum_buffer"));
}

// ---------------------------------------------------------------- optimizer

struct FusedSGD::Impl {
  std::vector<detail::FlatLayout> layouts;  // one per param group
  struct Work {
    size_t group;
    size_t index;
    const FusedSGDOptions* options;
    FusedSGDParamState* state;  // null: no momentum, or create it (first step)
    bool has_buffer;            // momentum buffer holds a value (not the first step)
  };
  std::vector<Work> work;  // reused between steps, like chunks
  std::vector<detail::TensorChunk> chunks;
  std::vector<Work> cuda_work;   // CUDA parameters: libtorch's fused multi-tensor kernels
  detail::DeviceLrs device_lrs;  // each group's lr where the CUDA kernels read it
};

FusedSGD::FusedSGD(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                   FusedSGDOptions defaults)
    : Optimizer(std::move(param_groups), std::make_unique<FusedSGDOptions>(defaults)),
      impl_(std::make_unique<Impl>()) {
  validate(defaults, "default");
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    validate(options_of(param_groups_[g], g), "param group " + std::to_string(g));
  }
  detail::check_params_unique("FusedSGD", param_groups_);
}

FusedSGD::FusedSGD(std::vector<at::Tensor> params, FusedSGDOptions defaults)
    : FusedSGD({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

FusedSGD::~FusedSGD() = default;
FusedSGD::FusedSGD(FusedSGD&&) noexcept = default;

at::Tensor FusedSGD::step(LossClosure closure) {
  at::Tensor loss = detail::run_closure(closure);
  at::NoGradGuard no_grad;
  Impl& s = *impl_;
  s.work.clear();
  s.chunks.clear();
  s.cuda_work.clear();

  detail::sync_layouts("FusedSGD", s.layouts, param_groups_, 1);

  // Pass 1 can throw and changes no value, so a failed step leaves everything as it was.
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const FusedSGDOptions& o = options_of(param_groups_[g], g);
    validate(o, "param group " + std::to_string(g));  // also a group added or changed since
    const auto& params = param_groups_[g].params();
    detail::FlatLayout& layout = s.layouts[g];
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& p = params[i];
      const at::Tensor& grad = p.grad();
      if (!grad.defined()) continue;
      detail::check_fusable(kName, kReference, p, grad);
      const bool cuda = p.is_cuda();
      Impl::Work w{g, i, &o, nullptr, false};
      if (o.momentum() != 0) {
        w.state = detail::find_state<FusedSGDParamState>(kName, "FusedSGDParamState", state_,
                                                         layout.key(i), p);
        if (w.state != nullptr) {
          w.has_buffer = w.state->momentum_buffer().defined();
          if (cuda) {
            detail::check_state_size(kName, "momentum_buffer", w.state->momentum_buffer(), p);
          } else {
            detail::bind_state(kName, "momentum_buffer", w.state->momentum_buffer(), layout, i,
                               kMomentumBuffer, p, false);
          }
        }
      }
      (cuda ? s.cuda_work : s.work).push_back(w);
    }
  }

  // Pass 2: create missing state and describe the work as chunks.
  for (auto& w : s.work) {
    const FusedSGDOptions& o = *w.options;
    const at::Tensor& p = param_groups_[w.group].params()[w.index];
    detail::FlatLayout& layout = s.layouts[w.group];
    detail::SgdMomentum momentum = detail::SgdMomentum::kNone;
    if (o.momentum() != 0) {
      if (w.state == nullptr) {
        auto fresh = std::make_unique<FusedSGDParamState>();
        w.state = fresh.get();
        // No zeroing: the first step writes buf = d_p, as libtorch's clone does.
        detail::bind_state(kName, "momentum_buffer", w.state->momentum_buffer(), layout, w.index,
                           kMomentumBuffer, p, false);
        state_[layout.key(w.index)] = std::move(fresh);
      }
      momentum = w.has_buffer ? detail::SgdMomentum::kSteady : detail::SgdMomentum::kFirst;
    }
    detail::TensorChunk c;
    c.kernel = detail::sgd_kernel(p.scalar_type(), o.weight_decay() != 0, momentum, o.nesterov());
    c.ptr[0] = p.data_ptr();
    c.ptr[1] = p.grad().data_ptr();
    c.ptr[2] =
        momentum != detail::SgdMomentum::kNone ? layout.data(w.index, kMomentumBuffer) : nullptr;
    c.scalar[0] = o.weight_decay();
    c.scalar[1] = o.momentum();
    c.scalar[2] = 1 - o.dampening();
    c.scalar[3] = -1 * o.lr();
    detail::append_chunks(s.chunks, c, p.numel(), 3, static_cast<int64_t>(p.element_size()));
  }

  detail::run_chunks(s.chunks);
  // The kernels wrote through raw pointers: bump versions as in-place ops would.
  for (const auto& w : s.work) {
    param_groups_[w.group].params()[w.index].unsafeGetTensorImpl()->bump_version();
  }
  if (!s.cuda_work.empty()) step_cuda();
  return loss;
}

void FusedSGD::step_cuda() {
  Impl& s = *impl_;
  // Consecutive parameters with the same options and first-step flag share their launches.
  std::vector<at::Tensor> params, grads, buffers;
  const FusedSGDOptions* current = nullptr;
  size_t current_group = 0;
  bool current_first = false;
  auto flush = [&] {
    if (current == nullptr || params.empty()) return;
    const FusedSGDOptions& o = *current;
    const at::Device device = params.front().device();
    const at::Tensor& lr = detail::group_lr(s.device_lrs, current_group, o.lr(), device, kName);
    detail::sgd_cuda(params, grads, buffers, o.weight_decay(), o.momentum(), lr, o.dampening(),
                     o.nesterov(), current_first);
    params.clear();
    grads.clear();
    buffers.clear();
  };
  for (auto& w : s.cuda_work) {
    const FusedSGDOptions& o = *w.options;
    const at::Tensor& p = param_groups_[w.group].params()[w.index];
    bool first = false;
    if (o.momentum() != 0) {
      if (w.state == nullptr) {
        auto fresh = std::make_unique<FusedSGDParamState>();
        w.state = fresh.get();
        state_[s.layouts[w.group].key(w.index)] = std::move(fresh);
      }
      first = !w.has_buffer;
      // The first step writes buf = d_p (no zeroing needed, but the tensor must exist).
      at::Tensor& b = w.state->momentum_buffer();
      b = first ? at::empty_like(p, at::MemoryFormat::Contiguous)
                : detail::state_like(kName, "momentum_buffer", b, p);
    }
    if (&o != current || first != current_first || w.group != current_group ||
        (!params.empty() && params.front().device() != p.device())) {
      flush();
      current = &o;
      current_group = w.group;
      current_first = first;
    }
    params.push_back(p);
    grads.push_back(p.grad());
    if (o.momentum() != 0) buffers.push_back(w.state->momentum_buffer());
  }
  flush();
}

void FusedSGD::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<FusedSGDParamState, FusedSGDOptions>(archive, *this);
}

void FusedSGD::load(torch::serialize::InputArchive& archive) {
  torch::optim::serialize<FusedSGDParamState, FusedSGDOptions>(archive, *this);
}

void FusedSGD::sync_lrs_to_device() {
  detail::sync_device_lrs(impl_->device_lrs, param_groups_, kName);
}

std::unique_ptr<torch::optim::OptimizerParamState> FusedSGD::make_param_state() const {
  return std::make_unique<FusedSGDParamState>();
}

}  // namespace volt
