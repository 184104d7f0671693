// TrainerOptions::graph_training_step: the automatic-optimization step replayed from CUDA graphs.
//
// After graph_options().warmup_iters() eager steps on a side stream (lazy state such as
// optimizer moments is created outside any graph), the first step of each batch signature is
// captured: the batch is copied into static tensors, gradients are reset (the graph's backward
// allocates them in its pool), and training_step, backward and Strategy::optimizer_step are
// recorded. Capture records and runs nothing, so the step is then replayed. Every later step
// with that signature copies its batch into the static tensors and replays. What the loop does
// around the step happens eagerly after each replay, on the graph's static outputs: the values
// training_step logged (recorded at capture) are logged again, on_before_zero_grad runs (on the
// replay's gradients), the non-finite check records the static loss, the global step and the
// step-interval schedulers advance. The hooks inside the step (on_before_backward,
// on_after_backward, on_before_optimizer_step) run while it is captured only. A module overriding
// backward, optimizer_step or configure_gradient_clipping runs eagerly (a replay would repeat
// the override's decisions at capture).
//
// volt's fused optimizers read the learning rate from a device scalar written before each
// capture and replay; torch::optim::SGD bakes it into the graph as a constant, so there a changed
// learning rate drops the graphs (they are captured again), and a scheduler that changes it more
// than kMaxLrRecaptures times turns the graphs off. fp32 and bf16 precisions are captured (the
// forward's autocast region lies inside the capture); loss scaling and fp8 are not. Anything that
// cannot be captured makes this step eager for the rest of the fit, logged once with the reason.
#include <torch/optim/sgd.h>

#include <c10/util/Exception.h>

#include <map>
#include <string>
#include <typeinfo>
#include <vector>

#include "core/detail/batch_tensors.h"
#include "core/detail/default_steps.h"
#include "core/detail/numbers.h"
#include "trainer/detail/run.h"
#include "trainer/loops/optimization_step.h"
#include "volt/core/check.h"
#include "volt/core/log.h"
#include "volt/graphs/cuda_graph.h"
#include "volt/graphs/graph_cache.h"
#include "volt/kernels/fused_adamw.h"
#include "volt/kernels/fused_sgd.h"
#include "volt/precision/mixed.h"

namespace volt {
namespace detail {
namespace {

constexpr int kMaxLrRecaptures = 3;

struct GraphedStep {
  explicit GraphedStep(const std::string& name) : graph(name) {}
  CudaGraph graph;
  Batch batch;                         // the static batch the graph reads
  at::Tensor loss;                     // the static loss it writes
  std::vector<Run::CapturedLog> logs;  // what training_step logged, static values
  std::vector<double> lrs;             // the learning rates baked in (torch::optim::SGD)
};

// Why precision `p` cannot be captured, or "". fp32 and bf16 weights have nothing to hide;
// bf16 autocast neither: its cast cache is filled and cleared inside the captured forward (the
// AutocastGuard region is the forward itself), so every replay casts the weights it updated.
// A loss scaler reads found_inf on the host to skip a step; fp8 keeps its scaling state on the
// host.
std::string precision_reason(const Precision& p) {
  const std::string name = p.name();
  if (name == "32-true" || name == "bf16-true") return "";
  if (name == "bf16-mixed" || name == "16-mixed") {
    const auto* mixed = dynamic_cast<const MixedPrecision*>(&p);
    if (mixed != nullptr && mixed->scaler() == nullptr) return "";
    return "precision \"" + name +
           "\" with loss scaling (the scaler reads found_inf on the host to skip a step); use "
           "bf16-mixed without loss scaling";
  }
  return "precision \"" + name + "\" (graphed: 32-true, bf16-true, bf16-mixed)";
}

// Writes the optimizer's learning rates where its captured kernels read them, when it reads
// them from the device (volt's fused optimizers); false for one that bakes them into the graph.
bool sync_device_lrs(torch::optim::Optimizer& opt) {
  if (auto* adam = dynamic_cast<FusedAdamW*>(&opt)) {
    adam->sync_lrs_to_device();
    return true;
  }
  if (auto* sgd = dynamic_cast<FusedSGD*>(&opt)) {
    sgd->sync_lrs_to_device();
    return true;
  }
  return false;
}

std::vector<double> learning_rates(torch::optim::Optimizer& opt) {
  std::vector<double> out;
  for (auto& g : opt.param_groups()) out.push_back(g.options().get_lr());
  return out;
}

class GraphedOptimizationStep : public OptimizationStep {
 public:
  explicit GraphedOptimizationStep(Run& run)
      : OptimizationStep(run),
        warmup_left_(run.opts.graph_options().warmup_iters()),
        cache_(run.opts.graph_options().max_graphs(), "graph_training_step") {}

  bool run(const Batch& batch, int64_t batch_idx, int64_t num_batches) override {
    Run& r = run_;
    if (eager_) return OptimizationStep::run(batch, batch_idx, num_batches);
    if (changed_) {
      return eager(
          "the parameters that require a gradient changed during fit (the captured graphs "
          "hold the old set)",
          batch, batch_idx, num_batches);
    }
    // Checked per batch: a GradientAccumulationScheduler may raise it at any epoch.
    if (r.st.accumulate_grad_batches > 1) {
      return eager("accumulate_grad_batches > 1", batch, batch_idx, num_batches);
    }
    if (!checked_) {
      checked_ = true;
      const std::string why = static_reason();
      if (!why.empty()) return eager(why, batch, batch_idx, num_batches);
    }
    for (const at::Tensor& t : batch_tensors(batch)) {
      if (t.defined() && !t.is_cuda()) {
        auto os = detail::c_stream<std::ostringstream>();
        os << "a batch tensor is on " << t.device() << "; graphs replay CUDA tensors";
        return eager(os.str(), batch, batch_idx, num_batches);
      }
    }
    if (warmup_left_ > 0) {
      --warmup_left_;
      bool stepped = false;
      DefaultSteps::clear(*r.module);
      run_on_side_stream([&] { stepped = OptimizationStep::run(batch, batch_idx, num_batches); });
      // An override is known from a warm-up step that stepped: going eager now spares its host
      // side a capture that would be thrown away (a warm-up counter would count it).
      if (stepped && overridden_.empty()) overridden_ = DefaultSteps::overridden(*r.module);
      return stepped;
    }
    if (!overridden_.empty())
      return eager(override_reason(overridden_), batch, batch_idx, num_batches);
    auto& opt = *r.optimizers.front().optimizer();
    const std::vector<double> lrs = learning_rates(opt);
    // The layout too: two batches whose tensors agree in shape may name their extras
    // differently (a combined loader's parts), and a replay copies each extra by name.
    const GraphKey key(batch_tensors(batch), /*training=*/true, /*grad_mode=*/true,
                       batch_layout(batch));
    // volt's fused optimizers read the lr from the device (written just above, before the
    // capture or replay); only torch::optim::SGD bakes it into the graph, so a change there
    // means capturing again.
    const bool lr_on_device = sync_device_lrs(opt);
    if (const GraphedStep* g = cache_.peek(key); !lr_on_device && g != nullptr && g->lrs != lrs) {
      if (++lr_recaptures_ > kMaxLrRecaptures) {
        return eager("the learning rate changed " + std::to_string(lr_recaptures_) +
                         " times (a graph holds it as a constant); use a scheduler that "
                         "changes it less often, e.g. per epoch",
                     batch, batch_idx, num_batches);
      }
      log_info("Trainer", "graph_training_step: the learning rate changed; capturing again.");
      cache_.clear();
    }
    GraphedStep* step = nullptr;
    try {
      step = &cache_.get(key, [&] { return capture(key, batch, batch_idx); });
    } catch (const Error& e) {
      return eager(e.what(), batch, batch_idx, num_batches);
    } catch (const c10::Error& e) {
      return eager(e.what_without_backtrace(), batch, batch_idx, num_batches);
    }
    replay(*step, batch, batch_idx);
    return true;
  }

  void before_checkpoint() override {
    check_losses();
    sync_optimizer();
  }

  void finish() override { sync_optimizer(); }
  // The captured backward and optimizer step hold the old set of gradients.
  void trainable_parameters_changed() override {
    if (!eager_) changed_ = true;
  }

 private:
  // Why this run's step cannot be graphed at all, or "".
  std::string static_reason() const {
    Run& r = run_;
    if (!CudaGraph::available()) return CudaGraph::unavailable_reason();
    if (!r.module->automatic_optimization()) {
      return "manual optimization: capture the step in training_step with volt::CudaGraph "
             "(examples/graphed_training.cpp)";
    }
    if (r.opts.detect_anomaly()) {
      return "detect_anomaly (autograd checks every gradient for NaN on the host)";
    }
    if (r.optimizers.size() != 1) return "more than one optimizer";
    if (r.strategy().world_size() > 1) return "several processes (a distributed strategy)";
    if (std::string why = precision_reason(r.strategy().precision()); !why.empty()) return why;
    for (const auto& p : r.module->parameters()) {
      if (!p.is_cuda()) {
        auto os = detail::c_stream<std::ostringstream>();
        os << "the module's parameters are on " << p.device();
        return os.str();
      }
    }
    torch::optim::Optimizer& opt = *r.optimizers.front().optimizer();
    if (dynamic_cast<torch::optim::SGD*>(&opt) == nullptr &&
        dynamic_cast<FusedSGD*>(&opt) == nullptr && dynamic_cast<FusedAdamW*>(&opt) == nullptr) {
      return std::string("the optimizer (") + typeid(opt).name() +
             ") keeps state a graph cannot advance (e.g. its step count on the host); use "
             "volt::FusedAdamW, volt::FusedSGD or torch::optim::SGD";
    }
    return "";
  }

  bool eager(const std::string& why, const Batch& batch, int64_t batch_idx, int64_t num_batches) {
    if (!eager_) {
      eager_ = true;
      log_warning("Trainer", "graph_training_step: running the training step eagerly: " + why);
      // Replays leave each parameter's gradient defined (in a graph's pool); an eager step
      // would accumulate into it.
      Run& r = run_;
      if (!r.optimizers.empty()) r.strategy().zero_grad(*r.optimizers.front().optimizer());
    }
    return OptimizationStep::run(batch, batch_idx, num_batches);
  }

  std::unique_ptr<GraphedStep> capture(const GraphKey& key, const Batch& batch, int64_t batch_idx) {
    Run& r = run_;
    auto& opt = *r.optimizers.front().optimizer();
    auto g = std::make_unique<GraphedStep>("graph_training_step " + key.str());
    {
      at::NoGradGuard no_grad;
      g->batch.input = batch.input.defined() ? batch.input.clone() : at::Tensor();
      g->batch.target = batch.target.defined() ? batch.target.clone() : at::Tensor();
      for (const auto& kv : batch.extra) {
        g->batch.extra[kv.first] = kv.second.defined() ? kv.second.clone() : at::Tensor();
      }
    }
    // Gradients undefined: the captured backward allocates them in the graph's pool and
    // assigns (not accumulates), as after each eager step's zero_grad.
    r.strategy().zero_grad(opt);
    // A failed capture ran the host side of the optimizer (FusedAdamW counts steps on the
    // host): put those counts back.
    std::map<const void*, int64_t> adam_steps;
    for (auto& kv : opt.state()) {
      if (auto* s = dynamic_cast<FusedAdamWParamState*>(kv.second.get())) {
        adam_steps[kv.second.get()] = s->step();
      }
    }
    r.capture_log = &g->logs;
    capturing_ = true;
    auto restore = [&] {
      r.capture_log = nullptr;
      capturing_ = false;
    };
    try {
      g->graph.capture([&] {
        r.scope = LogScope::kTrainStep;
        r.current_batch_size = batch.size();
        const at::Tensor loss = forward(g->batch, batch_idx);
        VOLT_CHECK(loss.defined(), NotAvailable,
                   "training_step returned no loss for a batch (a skipped batch); a graph "
                   "replays a step that always steps");
        DefaultSteps::clear(*r.module);
        backward(loss, /*sync_gradients=*/true);
        const bool stepped = take_step(batch_idx);
        // A replay repeats what an override did while captured, not what it would decide at
        // each step (a learning-rate warm-up in optimizer_step would stay where it was).
        const std::string overridden = DefaultSteps::overridden(*r.module);
        VOLT_CHECK(overridden.empty(), NotAvailable, override_reason(overridden));
        VOLT_CHECK(stepped, NotAvailable, "the precision skipped the captured step");
        g->loss = loss.detach();
      });
    } catch (...) {
      restore();
      for (auto& kv : opt.state()) {
        auto it = adam_steps.find(kv.second.get());
        if (it != adam_steps.end()) {
          static_cast<FusedAdamWParamState*>(kv.second.get())->step(it->second);
        }
      }
      throw;
    }
    restore();
    g->lrs = learning_rates(opt);
    log_info("Trainer", "graph_training_step: captured the step for " + key.str() +
                            " (replayed for every batch of this signature).");
    return g;
  }

  void replay(GraphedStep& g, const Batch& batch, int64_t batch_idx) {
    Run& r = run_;
    {
      Run::Part part(r, "graph_replay");
      ProfileScope p(r.prof, "graph_replay");
      at::NoGradGuard no_grad;
      auto put = [](at::Tensor& dst, const at::Tensor& src) {
        if (dst.defined() && dst.data_ptr() != src.data_ptr()) dst.copy_(src);
      };
      put(g.batch.input, batch.input);
      put(g.batch.target, batch.target);
      for (auto& kv : g.batch.extra) put(kv.second, batch.extra.at(kv.first));
      g.graph.replay();
    }
    r.scope = LogScope::kTrainStep;
    r.current_batch_size = batch.size();
    // A copy each: epoch metrics keep every step's tensor until the epoch ends, and the static
    // one is overwritten by the next replay.
    for (const Run::CapturedLog& l : g.logs) r.log(l.name, l.value.clone(), l.options);
    // After the step and outside the graph, as in an eager step: the hook sees this replay's
    // gradients and stepped parameters (the graph needs no zero_grad: its backward assigns).
    before_zero_grad(*r.optimizers.front().optimizer());
    if (r.opts.detect_nonfinite_loss()) {
      nonfinite_.set_every(r.opts.log_every_n_steps());
      nonfinite_.record(g.loss, {r.st.global_step, r.st.epoch, batch_idx});
    }
    r.st.accumulated = 0;
    ++r.st.global_step;
    r.step_schedulers(Interval::kStep);
  }

  void sync_optimizer() {
    Run& r = run_;
    if (r.optimizers.empty()) return;
    if (auto* adam = dynamic_cast<FusedAdamW*>(r.optimizers.front().optimizer().get())) {
      adam->sync_steps_from_device();
    }
  }

  static std::string override_reason(const std::string& overridden) {
    return "the module overrides " + overridden +
           " (a graph replays what it did when captured, not what it decides at each step)";
  }

  bool eager_ = false;
  bool checked_ = false;
  std::string overridden_;  // the step hooks a warm-up step saw overridden
  bool changed_ = false;    // trainable_parameters_changed() before the next step
  int64_t warmup_left_;
  int lr_recaptures_ = 0;
  GraphCache<GraphedStep> cache_;
};

}  // namespace

std::unique_ptr<OptimizationStep> make_graphed_step(Run& run) {
  return std::make_unique<GraphedOptimizationStep>(run);
}

}  // namespace detail
}  // namespace volt
