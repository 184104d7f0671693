#include "volt/precision/grad_scaler.h"

#include <torch/torch.h>

#include <cmath>
#include <ostream>

#include "volt/core/check.h"

namespace volt {

std::ostream& operator<<(std::ostream& os, const GradScalerOptions& o) {
  return os << "GradScalerOptions(init_scale=" << o.init_scale()
            << ", growth_factor=" << o.growth_factor() << ", backoff_factor=" << o.backoff_factor()
            << ", growth_interval=" << o.growth_interval() << ")";
}

GradScaler::GradScaler(GradScalerOptions options)
    : options_(std::move(options)), scale_(options_.init_scale()) {
  VOLT_CHECK(std::isfinite(options_.init_scale()) && options_.init_scale() > 0, ConfigError,
             "[GradScaler] init_scale=", options_.init_scale(), " must be finite and > 0.");
  VOLT_CHECK(options_.growth_factor() > 1.0, ConfigError,
             "[GradScaler] growth_factor=", options_.growth_factor(), " must be > 1 (e.g. 2).");
  VOLT_CHECK(options_.backoff_factor() > 0.0 && options_.backoff_factor() < 1.0, ConfigError,
             "[GradScaler] backoff_factor=", options_.backoff_factor(),
             " must be in (0, 1) (e.g. 0.5).");
  VOLT_CHECK(options_.growth_interval() > 0, ConfigError,
             "[GradScaler] growth_interval=", options_.growth_interval(),
             " must be > 0 (e.g. 2000).");
}

at::Tensor GradScaler::scale(const at::Tensor& loss) const {
  return loss * scale_;
}

void GradScaler::unscale(torch::optim::Optimizer& optimizer) {
  if (unscaled_) return;
  // Multiply by the reciprocal in fp32 (as torch's _amp_foreach_non_finite_check_and_unscale_);
  // the finiteness flags stay tensors until one host read at the end.
  const double inv = 1.0 / scale_;
  std::vector<at::Tensor> finite;
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      auto g = p.mutable_grad();
      if (!g.defined()) continue;
      g.mul_(inv);
      finite.push_back(at::isfinite(g).all());
    }
  }
  found_inf_ = !finite.empty() && !at::stack(finite).all().item<bool>();
  unscaled_ = true;
}

void GradScaler::agree_on_found_inf(const std::function<bool(bool)>& any_rank) {
  VOLT_CHECK(unscaled_, InternalError,
             "[GradScaler] agree_on_found_inf before unscale(); unscale the gradients first.");
  found_inf_ = any_rank(found_inf_);
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  unscale(optimizer);
  const bool stepped = !found_inf_;
  if (stepped) {
    optimizer.step();
    if (++growth_tracker_ >= options_.growth_interval()) {
      // Growing past fp32's range would turn every later loss into inf; stay finite.
      const double grown = scale_ * options_.growth_factor();
      if (std::isfinite(static_cast<float>(grown))) scale_ = grown;
      growth_tracker_ = 0;
    }
  } else {
    scale_ *= options_.backoff_factor();
    growth_tracker_ = 0;
    ++skipped_;
  }
  unscaled_ = false;
  found_inf_ = false;
  return stepped;
}

void GradScaler::save_state(torch::serialize::OutputArchive& archive) const {
  archive.write("scale", torch::tensor(scale_, torch::kFloat64));
  archive.write("growth_tracker", torch::tensor(growth_tracker_, torch::kInt64));
  archive.write("skipped_steps", torch::tensor(skipped_, torch::kInt64));
}

void GradScaler::load_state(torch::serialize::InputArchive& archive) {
  at::Tensor s, g, k;
  VOLT_CHECK(archive.try_read("scale", s) && archive.try_read("growth_tracker", g) &&
                 archive.try_read("skipped_steps", k),
             CheckpointError,
             "[GradScaler] the checkpoint has no loss-scaler state (scale, growth_tracker, "
             "skipped_steps); it was written without loss scaling; resume with the precision "
             "it was trained with.");
  scale_ = s.item<double>();
  growth_tracker_ = g.item<int64_t>();
  skipped_ = k.item<int64_t>();
  VOLT_CHECK(std::isfinite(scale_) && scale_ > 0, CheckpointError,
             "[GradScaler] the checkpoint's loss scale is ", scale_,
             "; it must be finite and > 0 (a corrupt checkpoint?).");
  unscaled_ = false;
  found_inf_ = false;
}

}  // namespace volt
