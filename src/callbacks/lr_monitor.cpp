#include "volt/callbacks/lr_monitor.h"

#include <cxxabi.h>
#include <torch/torch.h>

#include <cstdlib>
#include <map>

#include "core/detail/print.h"
#include "volt/core/check.h"
#include "volt/core/log.h"
#include "volt/core/run_context.h"
#include "volt/kernels/fused_adamw.h"
#include "volt/kernels/fused_sgd.h"
#include "volt/loggers/logger.h"

namespace volt {
namespace {

// "torch::optim::AdamW" -> "AdamW".
std::string short_type_name(const torch::optim::Optimizer& opt) {
  int status = 0;
  char* raw = abi::__cxa_demangle(typeid(opt).name(), nullptr, nullptr, &status);
  std::string name = status == 0 && raw ? raw : typeid(opt).name();
  std::free(raw);
  const auto colon = name.rfind("::");
  return colon == std::string::npos ? name : name.substr(colon + 2);
}

c10::optional<double> momentum_of(const torch::optim::OptimizerOptions& o) {
  using namespace torch::optim;
  if (auto* s = dynamic_cast<const SGDOptions*>(&o)) return s->momentum();
  if (auto* r = dynamic_cast<const RMSpropOptions*>(&o)) return r->momentum();
  if (auto* a = dynamic_cast<const AdamOptions*>(&o)) return std::get<0>(a->betas());
  if (auto* w = dynamic_cast<const AdamWOptions*>(&o)) return std::get<0>(w->betas());
  if (auto* fs = dynamic_cast<const FusedSGDOptions*>(&o)) return fs->momentum();
  if (auto* fa = dynamic_cast<const FusedAdamWOptions*>(&o)) return std::get<0>(fa->betas());
  return c10::nullopt;
}

c10::optional<double> weight_decay_of(const torch::optim::OptimizerOptions& o) {
  using namespace torch::optim;
  if (auto* s = dynamic_cast<const SGDOptions*>(&o)) return s->weight_decay();
  if (auto* r = dynamic_cast<const RMSpropOptions*>(&o)) return r->weight_decay();
  if (auto* a = dynamic_cast<const AdamOptions*>(&o)) return a->weight_decay();
  if (auto* w = dynamic_cast<const AdamWOptions*>(&o)) return w->weight_decay();
  if (auto* g = dynamic_cast<const AdagradOptions*>(&o)) return g->weight_decay();
  if (auto* fs = dynamic_cast<const FusedSGDOptions*>(&o)) return fs->weight_decay();
  if (auto* fa = dynamic_cast<const FusedAdamWOptions*>(&o)) return fa->weight_decay();
  return c10::nullopt;
}

}  // namespace

LearningRateMonitor::LearningRateMonitor(LearningRateMonitorOptions options) : options_(options) {}

void LearningRateMonitor::on_train_start(RunContext& run, Module&) {
  VOLT_CHECK(run.has_loggers(), ConfigError,
             "[LearningRateMonitor] the Trainer has no logger, so the learning rates would go "
             "nowhere; add a logger (TrainerOptions::logger(true) or loggers({...})) or drop the "
             "callback.");
  const auto& configs = run.optimizer_configs();
  if (options_.log_momentum() && run.is_global_zero()) {
    for (const auto& c : configs) {
      const auto& groups = c.optimizer()->param_groups();
      if (!groups.empty() && !momentum_of(groups[0].options())) {
        log_warning("LearningRateMonitor",
                    "log_momentum is set, but some optimizers do not have momentum (" +
                        short_type_name(*c.optimizer()) +
                        "); their momentum is logged as 0 (as Lightning).");
        break;
      }
    }
  }
  // Lightning's order: the optimizers with a scheduler first (in their configs' order), then
  // the others, each type counted across both ("lr-SGD", "lr-SGD-1", ...). A named config keeps
  // its name and is not counted (Lightning's _check_duplicates_and_update_name), but takes the
  // "-<k>" of the optimizers of its type named before it.
  names_.assign(configs.size(), std::string());
  std::map<std::string, int> seen;
  for (const bool scheduled : {true, false}) {
    for (size_t i = 0; i < configs.size(); ++i) {
      if ((configs[i].scheduler() != nullptr) != scheduled) continue;
      const std::string type = short_type_name(*configs[i].optimizer());
      const bool named = !configs[i].name().empty();
      const int count = named ? seen[type] : ++seen[type];
      names_[i] = options_.log_key_prefix() + (named ? configs[i].name() : "lr-" + type) +
                  (count > 1 ? "-" + std::to_string(count - 1) : "");
    }
  }
  last_step_logged_ = -1;
}

void LearningRateMonitor::on_train_batch_start(RunContext& run, Module&, const Batch&, int64_t) {
  const int64_t step = run.state().global_step;
  const int64_t every = run.log_every_n_steps();
  // The Trainer's per-step cadence: a log each time the step count passes a multiple of
  // log_every_n_steps (at the first batch of the step that reaches it: (step + 1) % every == 0
  // for one step per batch, once under accumulation). Under manual optimization a batch may
  // take several steps: with two per batch and an even log_every_n_steps, step + 1 was never a
  // multiple and nothing was logged. last_step_logged_ holds the multiple last logged (from the
  // step the fit started at, so a resumed fit keeps the cadence).
  if (last_step_logged_ < 0) last_step_logged_ = step / every;
  const int64_t reached = (step + 1) / every;
  if (reached <= last_step_logged_) return;
  last_step_logged_ = reached;
  log(run, /*epoch_boundary=*/false);
}

void LearningRateMonitor::on_train_epoch_start(RunContext& run, Module&) {
  log(run, /*epoch_boundary=*/true);
}

void LearningRateMonitor::log(RunContext& run, bool epoch_boundary) {
  Metrics stats;
  auto& configs = run.optimizer_configs();
  for (size_t i = 0; i < configs.size() && i < names_.size(); ++i) {
    // kAuto: an optimizer with a scheduler at its scheduler's interval, one without at both
    // (each log-cadence step and each epoch start), as Lightning's _extract_stats.
    bool logs = true;
    switch (options_.logging_interval()) {
      case LoggingInterval::kAuto:
        if (configs[i].scheduler()) {
          logs = (configs[i].interval() == Interval::kEpoch) == epoch_boundary;
        }
        break;
      case LoggingInterval::kStep: logs = !epoch_boundary; break;
      case LoggingInterval::kEpoch: logs = epoch_boundary; break;
    }
    if (!logs) continue;
    const auto& groups = configs[i].optimizer()->param_groups();
    for (size_t g = 0; g < groups.size(); ++g) {
      const std::string name =
          names_[i] + (groups.size() > 1 ? "/pg" + std::to_string(g + 1) : std::string());
      const auto& o = groups[g].options();
      stats[name] = o.get_lr();
      if (options_.log_momentum()) stats[name + "-momentum"] = momentum_of(o).value_or(0.0);
      if (options_.log_weight_decay()) {
        if (auto w = weight_decay_of(o)) stats[name + "-weight_decay"] = *w;
      }
    }
  }
  if (stats.empty()) return;
  for (const auto& l : run.loggers()) l->log_metrics(stats, run.state().global_step);
  for (const auto& kv : stats) {
    last_[kv.first] = kv.second;
    run.set_callback_metric(kv.first, kv.second);  // as Lightning's callback_metrics.update
  }
}

std::ostream& operator<<(std::ostream& os, const LearningRateMonitorOptions& o) {
  const LoggingInterval i = o.logging_interval();
  return os << "LearningRateMonitorOptions(logging_interval="
            << (i == LoggingInterval::kAuto   ? "auto"
                : i == LoggingInterval::kStep ? "step"
                                              : "epoch")
            << ", log_momentum=" << o.log_momentum()
            << ", log_weight_decay=" << o.log_weight_decay()
            << ", log_key_prefix=" << detail::quoted(o.log_key_prefix()) << ")";
}

}  // namespace volt
