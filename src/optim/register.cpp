// Registers this folder's built-in names (LightningCLI's --optimizer and --lr_scheduler classes,
// with PyTorch's argument names and defaults); called once from registry()
// (src/trainer/builtins.cpp).
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <limits>
#include <map>
#include <tuple>
#include <variant>

#include "volt/core/check.h"
#include "volt/core/errors.h"
#include "volt/core/registry.h"
#include "volt/kernels/fused_adamw.h"
#include "volt/kernels/fused_sgd.h"
#include "volt/optim/lr_scheduler.h"

namespace volt::detail {
namespace {

using ParamList = std::vector<at::Tensor>;

// torch::optim's constructors refuse these values with a c10::Error; said here as a ConfigError
// naming the argument, before anything is built.
void check(bool ok, const Args& a, const char* key, double value, const char* rule) {
  VOLT_CHECK(ok && !std::isnan(value), ConfigError, "[", a.owner(), "] ", key, "=", value,
             " must be ", rule, " (PyTorch refuses it too); change init_args.", key, ".");
}

void check_non_negative(const Args& a, std::initializer_list<const char*> keys) {
  for (const char* key : keys) check(a.get<double>(key) >= 0, a, key, a.get<double>(key), ">= 0");
}

std::tuple<double, double> betas_of(const Args& a) {
  const auto& b = a.get<std::vector<double>>("betas");
  VOLT_CHECK(b.size() == 2, ConfigError, "[", a.owner(), "] betas holds ", b.size(),
             " values; give two, [beta1, beta2] (e.g. [0.9, 0.999]).");
  check(b[0] >= 0 && b[0] < 1, a, "betas[0]", b[0], "in [0, 1)");
  check(b[1] >= 0 && b[1] < 1, a, "betas[1]", b[1], "in [0, 1)");
  return std::make_tuple(b[0], b[1]);
}

Params adam_params(double weight_decay) {
  return Params()
      .add("lr", 1e-3, "learning rate")
      .add("betas", std::vector<double>{0.9, 0.999},
           "coefficients of the running averages of the gradient and its square")
      .add("eps", 1e-8, "added to the denominator")
      .add("weight_decay", weight_decay, "weight decay")
      .add("amsgrad", false, "the AMSGrad variant (the maximum of the second moments)");
}

void check_sgd(const Args& a) {
  check_non_negative(a, {"lr", "momentum", "weight_decay"});
  check(!a.get<bool>("nesterov") ||
            (a.get<double>("momentum") > 0 && a.get<double>("dampening") == 0),
        a, "nesterov", 1.0, "false unless momentum > 0 and dampening = 0");
}

Params sgd_params() {
  return Params()
      .add("lr", 1e-3, "learning rate")
      .add("momentum", 0.0, "momentum factor")
      .add("dampening", 0.0, "dampening of the momentum")
      .add("weight_decay", 0.0, "weight decay (L2 penalty)")
      .add("nesterov", false, "Nesterov momentum");
}

void register_optimizers(Registry& r) {
  r.optimizers.add(
      "SGD", "stochastic gradient descent (torch.optim.SGD)", sgd_params(),
      [](const Args& a, const ParamList& params) -> std::shared_ptr<torch::optim::Optimizer> {
        check_sgd(a);
        return std::make_shared<torch::optim::SGD>(params,
                                                   torch::optim::SGDOptions(a.get<double>("lr"))
                                                       .momentum(a.get<double>("momentum"))
                                                       .dampening(a.get<double>("dampening"))
                                                       .weight_decay(a.get<double>("weight_decay"))
                                                       .nesterov(a.get<bool>("nesterov")));
      });
  r.optimizers.add(
      "Adam", "Adam (torch.optim.Adam)", adam_params(0.0),
      [](const Args& a, const ParamList& params) -> std::shared_ptr<torch::optim::Optimizer> {
        check_non_negative(a, {"lr", "eps", "weight_decay"});
        return std::make_shared<torch::optim::Adam>(params,
                                                    torch::optim::AdamOptions(a.get<double>("lr"))
                                                        .betas(betas_of(a))
                                                        .eps(a.get<double>("eps"))
                                                        .weight_decay(a.get<double>("weight_decay"))
                                                        .amsgrad(a.get<bool>("amsgrad")));
      });
  r.optimizers.add(
      "AdamW", "Adam with decoupled weight decay (torch.optim.AdamW)", adam_params(1e-2),
      [](const Args& a, const ParamList& params) -> std::shared_ptr<torch::optim::Optimizer> {
        check_non_negative(a, {"lr", "eps", "weight_decay"});
        return std::make_shared<torch::optim::AdamW>(
            params, torch::optim::AdamWOptions(a.get<double>("lr"))
                        .betas(betas_of(a))
                        .eps(a.get<double>("eps"))
                        .weight_decay(a.get<double>("weight_decay"))
                        .amsgrad(a.get<bool>("amsgrad")));
      });
  r.optimizers.add(
      "Adagrad", "Adagrad (torch.optim.Adagrad)",
      Params()
          .add("lr", 1e-2, "learning rate")
          .add("lr_decay", 0.0, "learning rate decay")
          .add("weight_decay", 0.0, "weight decay (L2 penalty)")
          .add("initial_accumulator_value", 0.0, "starting value of the sums of squares")
          .add("eps", 1e-10, "added to the denominator"),
      [](const Args& a, const ParamList& params) -> std::shared_ptr<torch::optim::Optimizer> {
        check_non_negative(a,
                           {"lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps"});
        return std::make_shared<torch::optim::Adagrad>(
            params, torch::optim::AdagradOptions(a.get<double>("lr"))
                        .lr_decay(a.get<double>("lr_decay"))
                        .weight_decay(a.get<double>("weight_decay"))
                        .initial_accumulator_value(a.get<double>("initial_accumulator_value"))
                        .eps(a.get<double>("eps")));
      });
  r.optimizers.add(
      "RMSprop", "RMSprop (torch.optim.RMSprop)",
      Params()
          .add("lr", 1e-2, "learning rate")
          .add("alpha", 0.99, "smoothing constant")
          .add("eps", 1e-8, "added to the denominator")
          .add("weight_decay", 0.0, "weight decay (L2 penalty)")
          .add("momentum", 0.0, "momentum factor")
          .add("centered", false, "normalise by the estimated variance of the gradient"),
      [](const Args& a, const ParamList& params) -> std::shared_ptr<torch::optim::Optimizer> {
        check_non_negative(a, {"lr", "alpha", "eps", "weight_decay", "momentum"});
        return std::make_shared<torch::optim::RMSprop>(
            params, torch::optim::RMSpropOptions(a.get<double>("lr"))
                        .alpha(a.get<double>("alpha"))
                        .eps(a.get<double>("eps"))
                        .weight_decay(a.get<double>("weight_decay"))
                        .momentum(a.get<double>("momentum"))
                        .centered(a.get<bool>("centered")));
      });
  // volt's fused kernels (kernels/): one pass over the parameters per step.
  const FusedAdamWOptions f;
  r.optimizers.add(
      "FusedAdamW", "volt's fused AdamW (Adam with adam_w_mode=false), one pass per step",
      adam_params(f.weight_decay())
          .add("adam_w_mode", f.adam_w_mode(), "decoupled weight decay (false: Adam's L2)")
          .add("bias_correction", f.bias_correction(), "Adam's bias correction"),
      [](const Args& a, const ParamList& params) -> std::shared_ptr<torch::optim::Optimizer> {
        check_non_negative(a, {"lr", "eps", "weight_decay"});
        return std::make_shared<FusedAdamW>(params,
                                            FusedAdamWOptions(a.get<double>("lr"))
                                                .betas(betas_of(a))
                                                .eps(a.get<double>("eps"))
                                                .weight_decay(a.get<double>("weight_decay"))
                                                .amsgrad(a.get<bool>("amsgrad"))
                                                .adam_w_mode(a.get<bool>("adam_w_mode"))
                                                .bias_correction(a.get<bool>("bias_correction")));
      });
  r.optimizers.add(
      "FusedSGD", "volt's fused SGD, one pass per step", sgd_params(),
      [](const Args& a, const ParamList& params) -> std::shared_ptr<torch::optim::Optimizer> {
        check_sgd(a);
        return std::make_shared<FusedSGD>(params, FusedSGDOptions(a.get<double>("lr"))
                                                      .momentum(a.get<double>("momentum"))
                                                      .dampening(a.get<double>("dampening"))
                                                      .weight_decay(a.get<double>("weight_decay"))
                                                      .nesterov(a.get<bool>("nesterov")));
      });
}

using Opt = torch::optim::Optimizer;
using Made = std::shared_ptr<LRScheduler>;

// The choice parameters' values as the schedulers' enums.
template <typename E>
E choose(const Args& a, const char* key, std::initializer_list<std::pair<const char*, E>> values) {
  const std::string& v = a.get<std::string>(key);
  for (const auto& kv : values) {
    if (v == kv.first) return kv.second;
  }
  VOLT_CHECK(false, InternalError, "[", a.owner(), "] ", key, "=\"", v, "\" passed the choices");
  return values.begin()->second;
}

void register_lr_schedulers(Registry& r) {
  r.lr_schedulers.add("StepLR", "multiplies the lr by gamma every step_size steps (torch's StepLR)",
                      Params()
                          .required<int64_t>("step_size", "scheduler steps between decays")
                          .add("gamma", 0.1, "decay factor"),
                      [](const Args& a, Opt& o) -> Made {
                        return std::make_shared<StepLR>(o, a.get<int64_t>("step_size"),
                                                        a.get<double>("gamma"));
                      });
  r.lr_schedulers.add(
      "MultiStepLR", "multiplies the lr by gamma at each milestone (torch's MultiStepLR)",
      Params()
          .required<std::vector<int64_t>>("milestones", "increasing scheduler steps")
          .add("gamma", 0.1, "decay factor"),
      [](const Args& a, Opt& o) -> Made {
        return std::make_shared<MultiStepLR>(o, a.get<std::vector<int64_t>>("milestones"),
                                             a.get<double>("gamma"));
      });
  r.lr_schedulers.add(
      "ExponentialLR", "multiplies the lr by gamma every step (torch's ExponentialLR)",
      Params().required<double>("gamma", "decay factor"), [](const Args& a, Opt& o) -> Made {
        return std::make_shared<ExponentialLR>(o, a.get<double>("gamma"));
      });
  r.lr_schedulers.add("CosineAnnealingLR", "cosine from the lr down to eta_min over T_max steps",
                      Params()
                          .required<int64_t>("T_max", "steps of the half cosine")
                          .add("eta_min", 0.0, "the lowest lr"),
                      [](const Args& a, Opt& o) -> Made {
                        return std::make_shared<CosineAnnealingLR>(o, a.get<int64_t>("T_max"),
                                                                   a.get<double>("eta_min"));
                      });
  r.lr_schedulers.add(
      "CosineAnnealingWarmRestarts", "cosine annealing restarted every T_0 (x T_mult) steps",
      Params()
          .required<int64_t>("T_0", "steps of the first cycle")
          .add("T_mult", int64_t{1}, "factor of each next cycle's length")
          .add("eta_min", 0.0, "the lowest lr"),
      [](const Args& a, Opt& o) -> Made {
        return std::make_shared<CosineAnnealingWarmRestarts>(
            o, a.get<int64_t>("T_0"), a.get<int64_t>("T_mult"), a.get<double>("eta_min"));
      });
  const LinearLROptions lin;
  r.lr_schedulers.add(
      "LinearLR", "scales the lr linearly from start_factor to end_factor over total_iters",
      Params()
          .add("start_factor", lin.start_factor(), "factor at the first step")
          .add("end_factor", lin.end_factor(), "factor from total_iters on")
          .add("total_iters", lin.total_iters(), "steps of the ramp"),
      [](const Args& a, Opt& o) -> Made {
        return std::make_shared<LinearLR>(o, LinearLROptions()
                                                 .start_factor(a.get<double>("start_factor"))
                                                 .end_factor(a.get<double>("end_factor"))
                                                 .total_iters(a.get<int64_t>("total_iters")));
      });
  r.lr_schedulers.add("ConstantLR", "scales the lr by factor for total_iters steps",
                      Params()
                          .add("factor", 1.0 / 3.0, "the scale")
                          .add("total_iters", int64_t{5}, "steps it lasts"),
                      [](const Args& a, Opt& o) -> Made {
                        return std::make_shared<ConstantLR>(o, a.get<double>("factor"),
                                                            a.get<int64_t>("total_iters"));
                      });
  r.lr_schedulers.add("PolynomialLR", "decays the lr polynomially to 0 over total_iters steps",
                      Params()
                          .add("total_iters", int64_t{5}, "steps of the decay")
                          .add("power", 1.0, "the polynomial's power"),
                      [](const Args& a, Opt& o) -> Made {
                        return std::make_shared<PolynomialLR>(o, a.get<int64_t>("total_iters"),
                                                              a.get<double>("power"));
                      });
  r.lr_schedulers.add(
      "OneCycleLR", "the 1cycle policy: up to max_lr and down again over total_steps",
      Params()
          .required<double>("max_lr", "the peak lr")
          .optional<int64_t>("total_steps",
                             "scheduler steps in the cycle (or epochs x steps_per_epoch)")
          .optional<int64_t>("epochs", "with steps_per_epoch, when total_steps is none")
          .optional<int64_t>("steps_per_epoch", "with epochs, when total_steps is none")
          .add("pct_start", 0.3, "fraction of the cycle raising the lr")
          .choice("anneal_strategy", "cos", {"cos", "linear"}, "annealing shape")
          .add("cycle_momentum", true, "cycle the momentum (beta1) inversely")
          .add("base_momentum", 0.85, "momentum at the lr peak")
          .add("max_momentum", 0.95, "momentum at the cycle's ends")
          .add("div_factor", 25.0, "initial lr = max_lr / div_factor")
          .add("final_div_factor", 1e4, "lowest lr = initial lr / final_div_factor")
          .add("three_phase", false, "three phases instead of two"),
      [](const Args& a, Opt& o) -> Made {
        auto total = a.get_optional<int64_t>("total_steps");
        const auto epochs = a.get_optional<int64_t>("epochs");
        const auto per_epoch = a.get_optional<int64_t>("steps_per_epoch");
        if (!total) {
          VOLT_CHECK(epochs && per_epoch, ConfigError, "[", a.owner(),
                     "] needs total_steps, or epochs and steps_per_epoch (as PyTorch); set "
                     "init_args.total_steps.");
          VOLT_CHECK(*epochs >= 1 && *per_epoch >= 1, ConfigError, "[", a.owner(),
                     "] epochs=", *epochs, " and steps_per_epoch=", *per_epoch,
                     " must both be >= 1.");
          VOLT_CHECK(*epochs <= std::numeric_limits<int64_t>::max() / *per_epoch, ConfigError, "[",
                     a.owner(),
                     "] epochs x steps_per_epoch overflows a 64-bit integer; "
                     "give realistic counts.");
          total = *epochs * *per_epoch;
        }
        return std::make_shared<OneCycleLR>(
            o, OneCycleLROptions(a.get<double>("max_lr"), *total)
                   .pct_start(a.get<double>("pct_start"))
                   .anneal_strategy(choose<AnnealStrategy>(
                       a, "anneal_strategy",
                       {{"cos", AnnealStrategy::kCos}, {"linear", AnnealStrategy::kLinear}}))
                   .cycle_momentum(a.get<bool>("cycle_momentum"))
                   .base_momentum(a.get<double>("base_momentum"))
                   .max_momentum(a.get<double>("max_momentum"))
                   .div_factor(a.get<double>("div_factor"))
                   .final_div_factor(a.get<double>("final_div_factor"))
                   .three_phase(a.get<bool>("three_phase")));
      });
  r.lr_schedulers.add(
      "CyclicLR", "cycles the lr between base_lr and max_lr",
      Params()
          .required<double>("base_lr", "the cycle's lower bound and the initial lr")
          .required<double>("max_lr", "the cycle's upper bound")
          .add("step_size_up", 2000.0, "steps from base_lr up to max_lr")
          .optional<double>("step_size_down", "steps back down (none: step_size_up)")
          .choice("mode", "triangular", {"triangular", "triangular2", "exp_range"},
                  "amplitude policy")
          .add("gamma", 1.0, "exp_range's base")
          .choice("scale_mode", "cycle", {"cycle", "iterations"}, "what a scale function gets")
          .add("cycle_momentum", true, "cycle the momentum (beta1) inversely")
          .add("base_momentum", 0.8, "momentum at the lr peak")
          .add("max_momentum", 0.9, "momentum at base_lr"),
      [](const Args& a, Opt& o) -> Made {
        CyclicLROptions c(a.get<double>("base_lr"), a.get<double>("max_lr"));
        c.step_size_up(a.get<double>("step_size_up"))
            .step_size_down(a.get_optional<double>("step_size_down")
                                ? c10::optional<double>(*a.get_optional<double>("step_size_down"))
                                : c10::nullopt)
            .mode(choose<CyclicMode>(a, "mode",
                                     {{"triangular", CyclicMode::kTriangular},
                                      {"triangular2", CyclicMode::kTriangular2},
                                      {"exp_range", CyclicMode::kExpRange}}))
            .gamma(a.get<double>("gamma"))
            .scale_mode(choose<CyclicScaleMode>(
                a, "scale_mode",
                {{"cycle", CyclicScaleMode::kCycle}, {"iterations", CyclicScaleMode::kIterations}}))
            .cycle_momentum(a.get<bool>("cycle_momentum"))
            .base_momentum({a.get<double>("base_momentum")})
            .max_momentum({a.get<double>("max_momentum")});
        return std::make_shared<CyclicLR>(o, c);
      });
  const ReduceLROnPlateauOptions p;
  r.lr_schedulers.add(
      "ReduceLROnPlateau",
      "multiplies the lr by factor when the monitored metric stops improving (Lightning's "
      "lightning.pytorch.cli.ReduceLROnPlateau: the monitor is an argument)",
      Params()
          .required<std::string>("monitor", "the logged metric it watches (e.g. val_loss)")
          .choice("mode", "min", {"min", "max"}, "direction of improvement")
          .add("factor", p.factor(), "new lr = lr x factor")
          .add("patience", p.patience(), "bad steps tolerated before a reduction")
          .add("threshold", p.threshold(), "the least improvement that counts")
          .choice("threshold_mode", "rel", {"rel", "abs"}, "threshold relative or absolute")
          .add("cooldown", p.cooldown(), "steps after a reduction when bad steps do not count")
          .add("min_lr", p.min_lr().front(), "the lowest lr")
          .add("eps", p.eps(), "reductions smaller than this are skipped"),
      [](const Args& a, Opt& o) -> Made {
        return std::make_shared<ReduceLROnPlateau>(
            o, ReduceLROnPlateauOptions()
                   .mode(choose<PlateauMode>(
                       a, "mode", {{"min", PlateauMode::kMin}, {"max", PlateauMode::kMax}}))
                   .factor(a.get<double>("factor"))
                   .patience(a.get<int64_t>("patience"))
                   .threshold(a.get<double>("threshold"))
                   .threshold_mode(choose<ThresholdMode>(
                       a, "threshold_mode",
                       {{"rel", ThresholdMode::kRel}, {"abs", ThresholdMode::kAbs}}))
                   .cooldown(a.get<int64_t>("cooldown"))
                   .min_lr({a.get<double>("min_lr")})
                   .eps(a.get<double>("eps")));
      });
  // DeepSpeed's (deepspeed.runtime.lr_schedules), which volt's DeepSpeed JSON also builds.
  const WarmupLROptions w;
  const auto warmup_params = [&w](bool decay) {
    Params ps;
    ps.add("warmup_min_lr", w.warmup_min_lr(), "lr at the first step")
        .add("warmup_max_lr", w.warmup_max_lr(), "lr at the warm-up's end")
        .add("warmup_num_steps", w.warmup_num_steps(), "steps of the warm-up")
        .choice("warmup_type", "log", {"log", "linear"}, "warm-up curve");
    if (decay) ps.required<int64_t>("total_num_steps", "steps until the lr reaches 0");
    return ps;
  };
  const auto warmup_options = [](const Args& a) {
    return WarmupLROptions()
        .warmup_min_lr(a.get<double>("warmup_min_lr"))
        .warmup_max_lr(a.get<double>("warmup_max_lr"))
        .warmup_num_steps(a.get<int64_t>("warmup_num_steps"))
        .warmup_type(a.get<std::string>("warmup_type") == "linear" ? WarmupType::kLinear
                                                                   : WarmupType::kLog);
  };
  r.lr_schedulers.add("WarmupLR", "DeepSpeed's warm-up from warmup_min_lr to warmup_max_lr",
                      warmup_params(false), [warmup_options](const Args& a, Opt& o) -> Made {
                        return std::make_shared<WarmupLR>(o, warmup_options(a));
                      });
  r.lr_schedulers.add(
      "WarmupDecayLR", "DeepSpeed's warm-up, then a linear decay to 0 at total_num_steps",
      warmup_params(true), [warmup_options](const Args& a, Opt& o) -> Made {
        return std::make_shared<WarmupDecayLR>(
            o, warmup_options(a).total_num_steps(a.get<int64_t>("total_num_steps")));
      });
}

}  // namespace

void register_optimizers_and_schedulers(Registry& r) {
  register_optimizers(r);
  register_lr_schedulers(r);
  // Every float argument finite: PyTorch's classes take inf for most (an lr, a gamma, a decay),
  // and the run then diverges or stalls.
  const auto finite = [](const Args& a) {
    for (const auto& [key, value] : a.values()) {
      if (const auto* d = std::get_if<double>(&value)) {
        VOLT_CHECK(std::isfinite(*d), ConfigError, "[", a.owner(), "] ", key, "=", *d,
                   " must be a finite number; change init_args.", key, ".");
      }
      if (const auto* v = std::get_if<std::vector<double>>(&value)) {
        for (size_t i = 0; i < v->size(); ++i) {
          VOLT_CHECK(std::isfinite((*v)[i]), ConfigError, "[", a.owner(), "] ", key, "[", i,
                     "]=", (*v)[i], " must be a finite number; change init_args.", key, ".");
        }
      }
    }
  };
  for (const auto& [name, e] : std::map(r.optimizers.entries())) {
    r.optimizers.add(e.name, e.help, e.params,
                     [make = e.make, finite](const Args& a, const ParamList& params) {
                       finite(a);
                       return make(a, params);
                     });
  }
  for (const auto& [name, e] : std::map(r.lr_schedulers.entries())) {
    r.lr_schedulers.add(e.name, e.help, e.params, [make = e.make, finite](const Args& a, Opt& o) {
      finite(a);
      return make(a, o);
    });
  }
}

}  // namespace volt::detail
