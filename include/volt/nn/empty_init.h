#pragma once
/// EmptyInit: build a model without running its initializers (Lightning's
/// `init_module(empty_init=True)`), for a model whose weights a checkpoint is about to replace.

namespace volt {

/// While a guard lives, on the thread that made it, the in-place initializers that write into a
/// parameter do nothing: `uniform_`, `normal_`, `fill_`, `zero_` and the rest of the random
/// family (`bernoulli_`, `random_`, `exponential_`, `geometric_`, `log_normal_`, `cauchy_`)
/// when their tensor requires a gradient, which is what torch::nn's element-wise initializers
/// (`kaiming_uniform_`, `xavier_normal_`, `ones_`, `zeros_`, ...) come down to. `orthogonal_`,
/// `eye_` and `dirac_` compute their values and `copy_` them in, so they still run. A parameter so
/// built holds whatever its memory held (libtorch's `empty`): load the weights before reading
/// it. Everything else runs as usual: buffers (BatchNorm's running statistics), tensors a
/// constructor makes (`torch::zeros`, `torch::randn`), and `copy_` into a parameter. No random
/// numbers are drawn for skipped initializers, so the generators' state is as before them. A
/// large model is built in the time its allocation takes (docs/PERFORMANCE.md "empty_init").
/// Nestable; other threads are not affected.
///
///   std::shared_ptr<Net> model;
///   {
///     volt::EmptyInit empty;            // or: auto init = trainer.init_module(true);
///     model = std::make_shared<Net>();  // its parameters' initializers do not run
///   }
///   volt::load_weights(*model, "last.ckpt");
class EmptyInit {
 public:
  EmptyInit();
  ~EmptyInit();
  EmptyInit(const EmptyInit&) = delete;
  EmptyInit& operator=(const EmptyInit&) = delete;

  /// Whether a guard is alive on this thread.
  static bool active();
};

}  // namespace volt
