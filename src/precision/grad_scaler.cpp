#include "volt/precision/grad_scaler.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <ostream>

#include "volt/core/check.h"

namespace volt {

std::ostream& operator<<(std::ostream& os, const GradScalerOptions& o) {
  return os << "GradScalerOptions(init_scale=" << o.init_scale()
            << ", growth_factor=" << o.growth_factor() << ", backoff_factor=" << o.backoff_factor()
            << ", growth_interval=" << o.growth_interval() << ", dynamic=" << o.dynamic()
            << ", hysteresis=" << o.hysteresis()
            << ", consecutive_hysteresis=" << o.consecutive_hysteresis()
            << ", min_scale=" << o.min_scale() << ", error_at_min_scale=" << o.error_at_min_scale()
            << ")";
}

GradScaler::GradScaler(GradScalerOptions options)
    : options_(std::move(options)),
      scale_(options_.init_scale()),
      hysteresis_left_(options_.hysteresis()) {
  VOLT_CHECK(std::isfinite(options_.init_scale()) && options_.init_scale() > 0, ConfigError,
             "[GradScaler] init_scale=", options_.init_scale(), " must be finite and > 0.");
  VOLT_CHECK(options_.hysteresis() >= 1, ConfigError,
             "[GradScaler] hysteresis=", options_.hysteresis(),
             " must be >= 1 (the number of inf/NaN steps that back the scale off; 1: each one).");
  VOLT_CHECK(std::isfinite(options_.min_scale()) && options_.min_scale() >= 0 &&
                 options_.min_scale() <= options_.init_scale(),
             ConfigError, "[GradScaler] min_scale=", options_.min_scale(),
             " must be in [0, init_scale=", options_.init_scale(), "] (0: no floor).");
  VOLT_CHECK(!options_.error_at_min_scale() || options_.min_scale() > 0, ConfigError,
             "[GradScaler] error_at_min_scale needs a floor; set min_scale > 0 (e.g. 1).");
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
  ++backwards_;
  scaled_with_ = scale_;
  return loss * scale_;
}

void GradScaler::unscale(torch::optim::Optimizer& optimizer) {
  auto done = unscaled_.find(&optimizer);
  if (done != unscaled_.end()) {
    VOLT_CHECK(done->second.backwards == backwards_, ValueError,
               "[GradScaler] an optimizer's gradients were unscaled (clip_gradients, or the "
               "precision's unscale) and another backward ran before its step: that backward "
               "added gradients scaled by ",
               scale_,
               " to unscaled ones. Unscale (clip) once per optimizer step, after the last "
               "backward before the step (torch's GradScaler refuses this too); an accumulation "
               "clips at its last micro-batch only.");
    last_unscaled_ = &optimizer;
    return;
  }
  // Multiply by the reciprocal in fp32 (as torch's _amp_foreach_non_finite_check_and_unscale_);
  // the finiteness flags stay tensors until one host read at the end.
  const double inv = 1.0 / scaled_with_.value_or(scale_);
  std::vector<at::Tensor> finite;
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      auto g = p.mutable_grad();
      if (!g.defined()) continue;
      if (g.is_sparse()) {
        // As torch's _unscale_grads_: the values of a sparse gradient (isfinite has no sparse
        // kernel: an Embedding(sparse=true) made the step throw), coalesced first in fp16,
        // where summing duplicate indices may overflow.
        if (g.scalar_type() == at::kHalf) g = p.mutable_grad() = g.coalesce();
        g = g._values();
      }
      g.mul_(inv);
      finite.push_back(at::isfinite(g).all());
    }
  }
  Unscaled u;
  u.found_inf = !finite.empty() && !at::stack(finite).all().item<bool>();
  u.backwards = backwards_;
  unscaled_[&optimizer] = u;
  last_unscaled_ = &optimizer;
}

void GradScaler::agree_on_found_inf(const std::function<bool(bool)>& any_rank) {
  auto it = unscaled_.find(last_unscaled_);
  VOLT_CHECK(it != unscaled_.end(), InternalError,
             "[GradScaler] agree_on_found_inf before unscale(); unscale the gradients first.");
  it->second.found_inf = any_rank(it->second.found_inf);
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  // Unscaled already (clipped): its finding stands, as torch's step() uses the recorded one
  // (a backward since may have been another optimizer's: a GAN's second loss).
  if (unscaled_.count(&optimizer) == 0) unscale(optimizer);
  auto it = unscaled_.find(&optimizer);
  const bool stepped = !it->second.found_inf;
  unscaled_.erase(it);
  if (last_unscaled_ == &optimizer) last_unscaled_ = nullptr;
  if (stepped) {
    optimizer.step();
    if (!options_.dynamic()) return true;
    if (options_.consecutive_hysteresis()) hysteresis_left_ = options_.hysteresis();
    if (++growth_tracker_ >= options_.growth_interval()) {
      // Growing past fp32's range would turn every later loss into inf; stay finite.
      const double grown = scale_ * options_.growth_factor();
      if (std::isfinite(static_cast<float>(grown))) scale_ = grown;
      growth_tracker_ = 0;
      hysteresis_left_ = options_.hysteresis();
    }
    return true;
  }
  // DeepSpeed's DynamicLossScaler.update_scale: while hysteresis is left an inf/NaN step only
  // skips; then the scale backs off, down to the floor, and at the floor the run stops if asked.
  growth_tracker_ = 0;
  if (options_.dynamic()) {
    if (hysteresis_left_ > 1) {
      --hysteresis_left_;
    } else {
      VOLT_CHECK(!(options_.error_at_min_scale() && scale_ <= options_.min_scale()), ValueError,
                 "[GradScaler] the gradients hold inf/NaN with the loss scale at its floor "
                 "(min_scale=",
                 options_.min_scale(), ", ", skipped_,
                 " steps skipped so far): the run is diverging; lower the learning rate, clip "
                 "the gradients, train in bf16-mixed, or lower min_scale.");
      scale_ = std::max(scale_ * options_.backoff_factor(), options_.min_scale());
    }
  }
  ++skipped_;
  return false;
}

void GradScaler::save_state(torch::serialize::OutputArchive& archive) const {
  archive.write("scale", torch::tensor(scale_, torch::kFloat64));
  archive.write("growth_tracker", torch::tensor(growth_tracker_, torch::kInt64));
  archive.write("skipped_steps", torch::tensor(skipped_, torch::kInt64));
  archive.write("hysteresis_left", torch::tensor(hysteresis_left_, torch::kInt64));
}

void GradScaler::load_state(torch::serialize::InputArchive& archive) {
  at::Tensor s, g, k;
  VOLT_CHECK(archive.try_read("scale", s) && archive.try_read("growth_tracker", g) &&
                 archive.try_read("skipped_steps", k),
             CheckpointError,
             "[GradScaler] the checkpoint has no loss-scaler state (scale, growth_tracker, "
             "skipped_steps); it was written without loss scaling; resume with the precision "
             "it was trained with.");
  // Each entry one number (a corrupt or foreign checkpoint fails here, not in item()), all
  // checked before any is assigned: a refused checkpoint leaves the scaler as it was.
  const auto one = [](const at::Tensor& t, const char* name) {
    VOLT_CHECK(t.defined() && t.numel() == 1, CheckpointError, "[GradScaler] the checkpoint's ",
               name, " holds ", t.defined() ? t.numel() : 0,
               " values, not one (a corrupt checkpoint?); resume from another checkpoint.");
  };
  one(s, "scale");
  one(g, "growth_tracker");
  one(k, "skipped_steps");
  const double scale = s.item<double>();
  const int64_t growth_tracker = g.item<int64_t>();
  const int64_t skipped = k.item<int64_t>();
  // Checkpoints from before hysteresis existed: none pending.
  at::Tensor h;
  int64_t hysteresis_left = options_.hysteresis();
  if (archive.try_read("hysteresis_left", h)) {
    one(h, "hysteresis_left");
    hysteresis_left = h.item<int64_t>();
  }
  VOLT_CHECK(hysteresis_left >= 1 && hysteresis_left <= options_.hysteresis(), CheckpointError,
             "[GradScaler] the checkpoint's hysteresis_left=", hysteresis_left,
             " is outside [1, hysteresis=", options_.hysteresis(),
             "]; resume with the loss-scaling settings it was trained with.");
  VOLT_CHECK(std::isfinite(scale) && scale > 0, CheckpointError,
             "[GradScaler] the checkpoint's loss scale is ", scale,
             "; it must be finite and > 0 (a corrupt checkpoint?).");
  VOLT_CHECK(growth_tracker >= 0 && skipped >= 0, CheckpointError,
             "[GradScaler] the checkpoint's growth_tracker=", growth_tracker,
             " and skipped_steps=", skipped,
             " must be >= 0 (a corrupt checkpoint?); resume from another checkpoint.");
  scale_ = scale;
  growth_tracker_ = growth_tracker;
  skipped_ = skipped;
  hysteresis_left_ = hysteresis_left;
  unscaled_.clear();
  last_unscaled_ = nullptr;
  scaled_with_.reset();
}

}  // namespace volt
