#include "volt/kernels/fused_adamw.h"

#include <torch/optim/serialize.h>
#include <torch/serialize/archive.h>

#include <cmath>
#include <ostream>
#include <unordered_map>

#include "detail/fused_common.h"
#include "detail/fused_cuda.h"
#include "detail/multi_tensor.h"
#include "volt/core/check.h"

namespace volt {
namespace {

constexpr const char* kName = "FusedAdamW";
constexpr const char* kReference = "torch::optim::AdamW (or torch::optim::Adam)";

// State kinds, one flat buffer each per group and dtype.
enum Kind : int { kExpAvg = 0, kExpAvgSq = 1, kMaxExpAvgSq = 2, kNumKinds = 3 };

void validate(const FusedAdamWOptions& o, const std::string& where) {
  VOLT_CHECK(o.lr() >= 0, ConfigError, "[FusedAdamW] ", where, " lr=", o.lr(),
             " must be >= 0; pass a non-negative learning rate.");
  const double b1 = std::get<0>(o.betas()), b2 = std::get<1>(o.betas());
  VOLT_CHECK(b1 >= 0 && b1 < 1, ConfigError, "[FusedAdamW] ", where, " betas[0]=", b1,
             " is outside [0, 1); use a value such as 0.9.");
  VOLT_CHECK(b2 >= 0 && b2 < 1, ConfigError, "[FusedAdamW] ", where, " betas[1]=", b2,
             " is outside [0, 1); use a value such as 0.999.");
  VOLT_CHECK(o.eps() >= 0, ConfigError, "[FusedAdamW] ", where, " eps=", o.eps(),
             " must be >= 0; use a small positive value such as 1e-8.");
  VOLT_CHECK(o.weight_decay() >= 0, ConfigError, "[FusedAdamW] ", where,
             " weight_decay=", o.weight_decay(), " must be >= 0; use 0 to disable it.");
}

FusedAdamWOptions& options_of(torch::optim::OptimizerParamGroup& group, size_t index) {
  return detail::group_options<FusedAdamWOptions>(kName, "FusedAdamWOptions", group, index);
}

}  // namespace

// ---------------------------------------------------------------- options and state

FusedAdamWOptions::FusedAdamWOptions(double lr) : lr_(lr) {}

bool operator==(const FusedAdamWOptions& lhs, const FusedAdamWOptions& rhs) {
  return lhs.lr() == rhs.lr() && lhs.betas() == rhs.betas() && lhs.eps() == rhs.eps() &&
         lhs.weight_decay() == rhs.weight_decay() && lhs.amsgrad() == rhs.amsgrad() &&
         lhs.adam_w_mode() == rhs.adam_w_mode() && lhs.bias_correction() == rhs.bias_correction();
}

void FusedAdamWOptions::serialize(torch::serialize::OutputArchive& archive) const {
  archive.write("lr", c10::IValue(lr()));
  archive.write("betas", c10::IValue(betas()));
  archive.write("eps", c10::IValue(eps()));
  archive.write("weight_decay", c10::IValue(weight_decay()));
  archive.write("amsgrad", c10::IValue(amsgrad()));
  archive.write("adam_w_mode", c10::IValue(adam_w_mode()));
  archive.write("bias_correction", c10::IValue(bias_correction()));
}

void FusedAdamWOptions::serialize(torch::serialize::InputArchive& archive) {
  lr(detail::read_required<double>(archive, kName, "lr"));
  betas(detail::read_required<betas_t>(archive, kName, "betas"));
  eps(detail::read_required<double>(archive, kName, "eps"));
  weight_decay(detail::read_required<double>(archive, kName, "weight_decay"));
  amsgrad(detail::read_required<bool>(archive, kName, "amsgrad"));
  // torch::optim::AdamWOptions writes the fields above only; then the current mode stays.
  c10::IValue v;
  if (archive.try_read("adam_w_mode", v)) adam_w_mode(v.toBool());
  if (archive.try_read("bias_correction", v)) bias_correction(v.toBool());
}

double FusedAdamWOptions::get_lr() const {
  return lr();
}

void FusedAdamWOptions::set_lr(const double lr) {
  this->lr(lr);
}

std::ostream& operator<<(std::ostream& os, const FusedAdamWOptions& o) {
  return os << "FusedAdamWOptions(lr=" << o.lr() << ", betas=(" << std::get<0>(o.betas()) << ", "
            << std::get<1>(o.betas()) << "), eps=" << o.eps()
            << ", weight_decay=" << o.weight_decay() << ", amsgrad=" << std::boolalpha
            << o.amsgrad() << ", adam_w_mode=" << o.adam_w_mode()
            << ", bias_correction=" << o.bias_correction() << std::noboolalpha << ")";
}

bool operator==(const FusedAdamWParamState& lhs, const FusedAdamWParamState& rhs) {
  return lhs.step() == rhs.step() && detail::equal_or_undefined(lhs.exp_avg(), rhs.exp_avg()) &&
         detail::equal_or_undefined(lhs.exp_avg_sq(), rhs.exp_avg_sq()) &&
         detail::equal_or_undefined(lhs.max_exp_avg_sq(), rhs.max_exp_avg_sq());
}

void FusedAdamWParamState::serialize(torch::serialize::OutputArchive& archive) const {
  archive.write("step", c10::IValue(step()));
  detail::write_tensor(archive, "exp_avg", exp_avg());
  detail::write_tensor(archive, "exp_avg_sq", exp_avg_sq());
  detail::write_tensor(archive, "max_exp_avg_sq", max_exp_avg_sq());
}

void FusedAdamWParamState::serialize(torch::serialize::InputArchive& archive) {
  step(detail::read_required<int64_t>(archive, kName, "step"));
  exp_avg(detail::read_tensor(archive, "exp_avg"));
  exp_avg_sq(detail::read_tensor(archive, "exp_avg_sq"));
  max_exp_avg_sq(detail::read_tensor(archive, "max_exp_avg_sq"));
}

// ---------------------------------------------------------------- optimizer

struct FusedAdamW::Impl {
  std::vector<detail::FlatLayout> layouts;  // one per param group
  struct Work {
    size_t group;
    size_t index;
    const FusedAdamWOptions* options;
    FusedAdamWParamState* state;  // null: create it
  };
  std::vector<Work> work;  // reused between steps, like chunks
  std::vector<detail::TensorChunk> chunks;
  // CUDA parameters: libtorch's fused multi-tensor kernels, state in per-parameter tensors.
  std::vector<Work> cuda_work;
  // Per CUDA parameter, its step count as a float32 scalar on the device (what the kernels
  // read) and the host count it was made from: rebuilt when they differ (a checkpoint load).
  std::unordered_map<const c10::TensorImpl*, std::pair<at::Tensor, int64_t>> device_steps;
  detail::DeviceLrs device_lrs;  // each group's lr where the CUDA kernels read it
};

FusedAdamW::FusedAdamW(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                       FusedAdamWOptions defaults)
    : Optimizer(std::move(param_groups), std::make_unique<FusedAdamWOptions>(defaults)),
      impl_(std::make_unique<Impl>()) {
  validate(defaults, "default");
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    validate(options_of(param_groups_[g], g), "param group " + std::to_string(g));
  }
  detail::check_params_unique("FusedAdamW", param_groups_);
}

FusedAdamW::FusedAdamW(std::vector<at::Tensor> params, FusedAdamWOptions defaults)
    : FusedAdamW({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

FusedAdamW::~FusedAdamW() = default;
FusedAdamW::FusedAdamW(FusedAdamW&&) noexcept = default;

at::Tensor FusedAdamW::step(LossClosure closure) {
  at::Tensor loss = detail::run_closure(closure);
  at::NoGradGuard no_grad;
  Impl& s = *impl_;
  s.work.clear();
  s.chunks.clear();
  s.cuda_work.clear();

  detail::sync_layouts("FusedAdamW", s.layouts, param_groups_, kNumKinds);

  // Pass 1 can throw (bad tensors, foreign or mis-sized state) and changes no value, so a
  // failed step leaves parameters, steps and moments as they were.
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const FusedAdamWOptions& o = options_of(param_groups_[g], g);
    // As at construction: a group added since, options changed in place or loaded (betas[0]=1
    // divided the step by a zero bias correction: the group's weights went to inf).
    validate(o, "param group " + std::to_string(g));
    const auto& params = param_groups_[g].params();
    detail::FlatLayout& layout = s.layouts[g];
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& p = params[i];
      const at::Tensor& grad = p.grad();
      if (!grad.defined()) continue;
      detail::check_fusable(kName, kReference, p, grad);
      const bool cuda = p.is_cuda();
      if (cuda) {
        VOLT_CHECK(o.bias_correction(), NotAvailable,
                   "[FusedAdamW] bias_correction=false has no fused CUDA kernel (libtorch's "
                   "always corrects); keep the default, or use the parameters on CPU.");
      }
      FusedAdamWParamState* st = detail::find_state<FusedAdamWParamState>(
          kName, "FusedAdamWParamState", state_, layout.key(i), p);
      if (cuda) {
        if (st != nullptr) {  // fail here, before any parameter changed, not mid-step
          detail::check_state_size(kName, "exp_avg", st->exp_avg(), p);
          detail::check_state_size(kName, "exp_avg_sq", st->exp_avg_sq(), p);
          if (o.amsgrad()) {
            detail::check_state_size(kName, "max_exp_avg_sq", st->max_exp_avg_sq(), p);
          }
        }
        s.cuda_work.push_back(Impl::Work{g, i, &o, st});
        continue;
      }
      if (st != nullptr) {
        // Cheap pointer test; copies only after a load or when the group's params changed.
        detail::bind_state(kName, "exp_avg", st->exp_avg(), layout, i, kExpAvg, p, true);
        detail::bind_state(kName, "exp_avg_sq", st->exp_avg_sq(), layout, i, kExpAvgSq, p, true);
        if (o.amsgrad()) {
          detail::bind_state(kName, "max_exp_avg_sq", st->max_exp_avg_sq(), layout, i, kMaxExpAvgSq,
                             p, true);
        }
      }
      s.work.push_back(Impl::Work{g, i, &o, st});
    }
  }

  // Pass 2: create missing state, advance steps, describe the work as chunks.
  const FusedAdamWOptions* last_options = nullptr;
  int64_t last_step = -1;
  double bias_correction1 = 1, bias_correction2 = 1;
  for (auto& w : s.work) {
    const FusedAdamWOptions& o = *w.options;
    const at::Tensor& p = param_groups_[w.group].params()[w.index];
    detail::FlatLayout& layout = s.layouts[w.group];
    if (w.state == nullptr) {
      auto fresh = std::make_unique<FusedAdamWParamState>();
      w.state = fresh.get();
      detail::bind_state(kName, "exp_avg", w.state->exp_avg(), layout, w.index, kExpAvg, p, true);
      detail::bind_state(kName, "exp_avg_sq", w.state->exp_avg_sq(), layout, w.index, kExpAvgSq, p,
                         true);
      if (o.amsgrad()) {
        detail::bind_state(kName, "max_exp_avg_sq", w.state->max_exp_avg_sq(), layout, w.index,
                           kMaxExpAvgSq, p, true);
      }
      state_[layout.key(w.index)] = std::move(fresh);
    }
    const int64_t step = w.state->step() + 1;
    w.state->step(step);

    const double lr = o.lr(), wd = o.weight_decay(), eps = o.eps();
    const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
    // Same double-precision scalars, in the same order, as torch::optim::AdamW::step. Usually
    // every parameter of a group is at the same step: compute the powers once.
    if (&o != last_options || step != last_step) {
      last_options = &o;
      last_step = step;
      bias_correction1 = o.bias_correction() ? 1 - std::pow(beta1, step) : 1.0;
      bias_correction2 = o.bias_correction() ? 1 - std::pow(beta2, step) : 1.0;
    }
    const detail::AdamDecay decay = wd == 0           ? detail::AdamDecay::kNone
                                    : o.adam_w_mode() ? detail::AdamDecay::kDecoupled
                                                      : detail::AdamDecay::kL2;
    detail::TensorChunk c;
    c.kernel = detail::adam_kernel(p.scalar_type(), o.amsgrad(), decay);
    c.ptr[0] = p.data_ptr();
    c.ptr[1] = p.grad().data_ptr();
    c.ptr[2] = layout.data(w.index, kExpAvg);
    c.ptr[3] = layout.data(w.index, kExpAvgSq);
    c.ptr[4] = o.amsgrad() ? layout.data(w.index, kMaxExpAvgSq) : nullptr;
    const double scalars[9] = {1 - lr * wd, beta1,
                               1 - beta1,   beta2,
                               1 - beta2,   std::sqrt(bias_correction2),
                               eps,         -(lr / bias_correction1),
                               wd};
    std::copy(std::begin(scalars), std::end(scalars), c.scalar);
    detail::append_chunks(s.chunks, c, p.numel(), 5, static_cast<int64_t>(p.element_size()));
  }

  detail::run_chunks(s.chunks);
  // The kernels wrote through raw pointers: bump versions as in-place ops would, so autograd
  // still detects a parameter modified after being saved for backward.
  for (const auto& w : s.work) {
    param_groups_[w.group].params()[w.index].unsafeGetTensorImpl()->bump_version();
  }
  if (!s.cuda_work.empty()) step_cuda();
  return loss;
}

void FusedAdamW::step_cuda() {
  Impl& s = *impl_;
  // Consecutive parameters with the same options go to one set of kernel launches.
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps;
  const FusedAdamWOptions* current = nullptr;
  size_t current_group = 0;
  auto flush = [&] {
    if (current == nullptr || params.empty()) return;
    const FusedAdamWOptions& o = *current;
    const at::Device device = params.front().device();
    const at::Tensor& lr = detail::group_lr(s.device_lrs, current_group, o.lr(), device, kName);
    detail::adam_cuda(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, lr,
                      {std::get<0>(o.betas()), std::get<1>(o.betas()), o.weight_decay(), o.eps(),
                       o.amsgrad(), o.adam_w_mode()});
    for (auto* v : {&params, &grads, &exp_avgs, &exp_avg_sqs, &max_exp_avg_sqs, &steps}) {
      v->clear();
    }
  };
  for (auto& w : s.cuda_work) {
    const FusedAdamWOptions& o = *w.options;
    const at::Tensor& p = param_groups_[w.group].params()[w.index];
    if (w.state == nullptr) {
      auto fresh = std::make_unique<FusedAdamWParamState>();
      w.state = fresh.get();
      state_[s.layouts[w.group].key(w.index)] = std::move(fresh);
    }
    FusedAdamWParamState& st = *w.state;
    st.exp_avg(detail::state_like(kName, "exp_avg", st.exp_avg(), p));
    st.exp_avg_sq(detail::state_like(kName, "exp_avg_sq", st.exp_avg_sq(), p));
    if (o.amsgrad()) {
      st.max_exp_avg_sq(detail::state_like(kName, "max_exp_avg_sq", st.max_exp_avg_sq(), p));
    }
    auto& dev = s.device_steps[p.unsafeGetTensorImpl()];
    if (!dev.first.defined() || dev.second != st.step() || dev.first.device() != p.device()) {
      dev.first = at::full({}, static_cast<double>(st.step()),
                           at::TensorOptions().dtype(at::kFloat).device(p.device()));
    }
    dev.second = st.step() + 1;  // the kernels' own increment, mirrored
    st.step(st.step() + 1);
    if (&o != current || w.group != current_group ||
        (!params.empty() && params.front().device() != p.device())) {
      flush();
      current = &o;
      current_group = w.group;
    }
    params.push_back(p);
    grads.push_back(p.grad());
    exp_avgs.push_back(st.exp_avg());
    exp_avg_sqs.push_back(st.exp_avg_sq());
    if (o.amsgrad()) max_exp_avg_sqs.push_back(st.max_exp_avg_sq());
    steps.push_back(dev.first);
  }
  flush();
}

void FusedAdamW::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<FusedAdamWParamState, FusedAdamWOptions>(archive, *this);
}

void FusedAdamW::load(torch::serialize::InputArchive& archive) {
  torch::optim::serialize<FusedAdamWParamState, FusedAdamWOptions>(archive, *this);
  impl_->device_steps.clear();  // the next CUDA step starts from the loaded counts
}

void FusedAdamW::sync_lrs_to_device() {
  detail::sync_device_lrs(impl_->device_lrs, param_groups_, kName);
}

void FusedAdamW::sync_steps_from_device() {
  Impl& s = *impl_;
  if (s.device_steps.empty()) return;
  detail::sync_layouts("FusedAdamW", s.layouts, param_groups_, kNumKinds);
  std::vector<FusedAdamWParamState*> states;
  std::vector<std::pair<at::Tensor, int64_t>*> steps;
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const auto& params = param_groups_[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      auto d = s.device_steps.find(params[i].unsafeGetTensorImpl());
      if (d == s.device_steps.end() || !d->second.first.defined()) continue;
      auto it = state_.find(s.layouts[g].key(i));
      if (it == state_.end()) continue;
      auto* st = dynamic_cast<FusedAdamWParamState*>(it->second.get());
      if (st == nullptr) continue;
      states.push_back(st);
      steps.push_back(&d->second);
    }
  }
  if (states.empty()) return;
  std::vector<at::Tensor> values;
  for (auto* d : steps) values.push_back(d->first.reshape({1}).to(at::kDouble));
  const at::Tensor host = at::cat(values).cpu();  // one read for all parameters
  const double* v = host.data_ptr<double>();
  for (size_t k = 0; k < states.size(); ++k) {
    const auto step = static_cast<int64_t>(std::llround(v[k]));
    states[k]->step(step);
    steps[k]->second = step;
  }
}

std::unique_ptr<torch::optim::OptimizerParamState> FusedAdamW::make_param_state() const {
  return std::make_unique<FusedAdamWParamState>();
}

}  // namespace volt
