#include "volt/callbacks/host_sync_monitor.h"

#include <ATen/record_function.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <ostream>
#include <tuple>

#include "callbacks/detail/op_placement.h"
#include "core/detail/host_syncs.h"
#include "core/detail/numbers.h"
#include "profiler/detail/op_callback.h"
#include "volt/core/check.h"
#include "volt/core/env.h"
#include "volt/core/log.h"
#include "volt/core/module.h"

namespace volt {
namespace detail {

OpFinding classify_op(std::string_view name, c10::DeviceType model,
                      const std::vector<c10::DeviceType>& inputs, OpNesting nesting) {
  if (nesting.inside_sync) return OpFinding::kNone;
  const auto on_device = [](c10::DeviceType d) { return d != c10::DeviceType::CPU; };
  const bool model_on_device = on_device(model);
  const bool device_input = std::any_of(inputs.begin(), inputs.end(), on_device);
  if (is_host_sync_op(name)) {
    if (!model_on_device || device_input) return OpFinding::kHostSync;
  } else if (model_on_device && name == "aten::copy_" && inputs.size() >= 2 &&
             !on_device(inputs[0]) && on_device(inputs[1])) {
    return OpFinding::kHostSync;  // copy_(host destination, device source)
  }
  if (!model_on_device || nesting.depth > 0 || inputs.empty() || device_input) {
    return OpFinding::kNone;
  }
  // Moving host data to the device (or pinning it for that) is a transfer, not host compute.
  if (name == "aten::to" || name == "aten::_to_copy" || name == "aten::copy_" ||
      name == "aten::pin_memory" || name == "aten::_pin_memory") {
    return OpFinding::kNone;
  }
  return OpFinding::kCpuOp;
}

}  // namespace detail

namespace {

// What the op callbacks see; published through one global pointer (the callbacks carry no user
// data), so one monitor observes at a time.
struct Observed {
  std::atomic<bool> on{false};
  c10::DeviceType model = c10::DeviceType::CPU;
  std::atomic<const char*> phase{"training_step"};
  std::atomic<int64_t> step{0};
  bool log_each = false;
  std::mutex m;                                                                 // guards counts
  std::map<std::tuple<std::string, std::string, std::string>, int64_t> counts;  // op, kind, where
};

std::atomic<Observed*> g_observed{nullptr};

// Per thread: enclosing observed ops, enclosing reported syncs, and volt's named scope.
thread_local int t_depth = 0;
thread_local int t_syncs = 0;
thread_local const char* t_scope = nullptr;

struct OpContext : at::ObserverContext {
  bool function = false, sync = false, scope = false;
  const char* saved_scope = nullptr;
};

void append_devices(const c10::IValue& v, std::vector<c10::DeviceType>& out) {
  if (v.isTensor()) {
    if (v.toTensor().defined()) out.push_back(v.toTensor().device().type());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList().vec()) {
      if (t.defined()) out.push_back(t.device().type());
    }
  }
}

void report(Observed& o, const char* name, detail::OpFinding finding, const char* where) {
  const bool sync = finding == detail::OpFinding::kHostSync;
  const std::string kind = sync ? "host sync" : "CPU op";
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(o.m);
    int64_t& n = o.counts[{name, kind, where}];
    first = n == 0;
    ++n;
  }
  if (!first && !o.log_each) return;
  std::string msg =
      kind + " in " + where + " at global step " + std::to_string(o.step.load()) + ": " + name;
  const std::string source = detail::host_sync_source(name);
  if (!source.empty()) msg += " (" + source + ")";
  if (!sync) {
    msg += " ran on host tensors while the model is on " + c10::DeviceTypeName(o.model, true);
  } else if (o.model == c10::DeviceType::CPU) {
    msg += ": on an accelerator the host would wait for the device here";
  } else {
    msg += ": the host waits for the device here";
  }
  if (!o.log_each) msg += " (first time; all are counted in the table at the end of fit)";
  log_info("HostSyncMonitor", msg);
}

std::unique_ptr<at::ObserverContext> on_op_start(const at::RecordFunction& fn) {
  Observed* o = g_observed.load(std::memory_order_acquire);
  if (o == nullptr || !o->on.load(std::memory_order_relaxed)) return nullptr;
  auto ctx = std::make_unique<OpContext>();
  if (fn.scope() == at::RecordScope::USER_SCOPE) {
    if (std::strcmp(fn.name(), detail::kNonfiniteLossScope) == 0) {
      ctx->scope = true;
      ctx->saved_scope = t_scope;
      t_scope = "non-finite loss check";
    }
    return ctx;
  }
  if (fn.scope() != at::RecordScope::FUNCTION) return nullptr;
  std::vector<c10::DeviceType> inputs;
  if (o->model != c10::DeviceType::CPU) {
    for (const c10::IValue& v : fn.inputs()) append_devices(v, inputs);
  }
  const detail::OpFinding f =
      detail::classify_op(fn.name(), o->model, inputs, {t_depth, t_syncs > 0});
  ctx->function = true;
  ++t_depth;
  if (f == detail::OpFinding::kHostSync) {
    ctx->sync = true;
    ++t_syncs;
  }
  if (f != detail::OpFinding::kNone) {
    report(*o, fn.name(), f, t_scope != nullptr ? t_scope : o->phase.load());
  }
  return ctx;
}

void on_op_end(const at::RecordFunction&, at::ObserverContext* raw) {
  if (raw == nullptr) return;
  auto* ctx = static_cast<OpContext*>(raw);
  if (ctx->function) --t_depth;
  if (ctx->sync) --t_syncs;
  if (ctx->scope) t_scope = ctx->saved_scope;
}

}  // namespace

std::ostream& operator<<(std::ostream& os, const HostSyncMonitorOptions& o) {
  return os << "HostSyncMonitorOptions(log_each=" << o.log_each() << ", row_limit=" << o.row_limit()
            << ")";
}

struct HostSyncMonitor::Impl {
  HostSyncMonitorOptions opts;
  Observed observed;
  std::optional<detail::GlobalOpCallback> ops;
  int64_t steps = 0;
  std::vector<Row> rows;
  std::string table;

  void observe(bool on) {
    observed.on.store(on, std::memory_order_relaxed);
    if (ops) ops->enable(on);
  }

  void stop() {
    if (!ops) return;
    observe(false);
    ops.reset();
    Observed* mine = &observed;
    g_observed.compare_exchange_strong(mine, nullptr);
  }

  void collect() {
    rows.clear();
    {
      std::lock_guard<std::mutex> lock(observed.m);
      for (const auto& kv : observed.counts) {
        rows.push_back(
            {std::get<0>(kv.first), std::get<1>(kv.first), std::get<2>(kv.first), kv.second});
      }
    }
    std::stable_sort(rows.begin(), rows.end(),
                     [](const Row& a, const Row& b) { return a.count > b.count; });
    const std::string model = c10::DeviceTypeName(observed.model, true);
    if (rows.empty()) {
      table = "no host sync and no CPU op in " + std::to_string(steps) +
              " training steps (model on " + model + ")";
      return;
    }
    table = "host syncs and CPU ops in " + std::to_string(steps) + " training steps (model on " +
            model +
            (observed.model == c10::DeviceType::CPU
                 ? "; each sync is a read an accelerator would wait for)"
                 : ")") +
            ", most frequent first:\n";
    const detail::CNumbers c_numbers;  // the table's numbers
    char buf[512];
    std::snprintf(buf, sizeof buf, "  %8s  %8s  %-9s  %-22s  %s", "count", "per step", "kind",
                  "where", "op");
    table += buf;
    const size_t shown = std::min(rows.size(), static_cast<size_t>(opts.row_limit()));
    bool nonfinite = false;
    for (size_t i = 0; i < shown; ++i) {
      const Row& r = rows[i];
      std::snprintf(buf, sizeof buf, "\n  %8lld  %8.2f  %-9s  %-22s  %s",
                    static_cast<long long>(r.count),
                    steps > 0 ? static_cast<double>(r.count) / static_cast<double>(steps) : 0.0,
                    r.kind.c_str(), r.where.c_str(), r.op.c_str());
      table += buf;
      nonfinite = nonfinite || r.where == "non-finite loss check";
    }
    if (shown < rows.size()) {
      table += "\n  ... " + std::to_string(rows.size() - shown) +
               " more rows (row_limit=" + std::to_string(opts.row_limit()) + ")";
    }
    if (nonfinite) {
      table +=
          "\n  the non-finite loss check is volt's own read of the losses, once per logging "
          "interval (log_every_n_steps x accumulate_grad_batches micro-batches) and before "
          "checkpoints; "
          "TrainerOptions::detect_nonfinite_loss(false) (--trainer.detect_nonfinite_loss=false) "
          "removes it";
    }
  }
};

HostSyncMonitor::HostSyncMonitor(HostSyncMonitorOptions options) : impl_(std::make_unique<Impl>()) {
  VOLT_CHECK(options.row_limit() > 0, ConfigError,
             "[HostSyncMonitor] row_limit=", options.row_limit(), " shows no rows; use 1 or more.");
  impl_->opts = options;
  impl_->observed.log_each = options.log_each();
}

HostSyncMonitor::~HostSyncMonitor() {
  impl_->stop();
}

std::shared_ptr<HostSyncMonitor> HostSyncMonitor::from_environment() {
  // env_value checks the value against the table's choices (0, 1, 2).
  const std::string value = env_value(kEnvVar).value_or("0");
  if (value == "0") return nullptr;
  return std::make_shared<HostSyncMonitor>(HostSyncMonitorOptions().log_each(value == "2"));
}

void HostSyncMonitor::on_fit_start(RunContext&, Module& module) {
  Impl& s = *impl_;
  s.stop();  // a previous fit that never reached on_fit_end
  Observed* expected = nullptr;
  VOLT_CHECK(g_observed.compare_exchange_strong(expected, &s.observed), ConfigError,
             "[HostSyncMonitor] another HostSyncMonitor is observing in this process (libtorch's "
             "op callbacks are global); use one at a time.");
  const auto params = module.parameters();
  s.observed.model = params.empty() ? c10::DeviceType::CPU : params.front().device().type();
  {
    std::lock_guard<std::mutex> lock(s.observed.m);
    s.observed.counts.clear();
  }
  s.steps = 0;
  s.rows.clear();
  s.table.clear();
  // Inputs are read (boxed) only when there are devices to compare.
  s.ops.emplace(&on_op_start, &on_op_end, s.observed.model != c10::DeviceType::CPU);
}

void HostSyncMonitor::on_train_batch_start(RunContext& run, Module&, const Batch&, int64_t) {
  Impl& s = *impl_;
  if (!s.ops) return;
  ++s.steps;
  s.observed.step.store(run.state().global_step);
  s.observed.phase.store("training_step");
  s.observe(true);
}

void HostSyncMonitor::on_before_backward(RunContext&, Module&, const at::Tensor&) {
  impl_->observed.phase.store("backward");
}

void HostSyncMonitor::on_before_optimizer_step(RunContext&, Module&, torch::optim::Optimizer&) {
  impl_->observed.phase.store("optimizer_step");
}

void HostSyncMonitor::on_train_batch_end(RunContext&, Module&, const Batch&, int64_t) {
  impl_->observe(false);
}

void HostSyncMonitor::on_train_epoch_end(RunContext&, Module&) {
  Impl& s = *impl_;
  // Still watching: the module skipped the epoch's last batch (no batch end), which took no step.
  if (s.ops && s.observed.on.load(std::memory_order_relaxed)) --s.steps;
  s.observe(false);
}

void HostSyncMonitor::on_fit_end(RunContext&, Module&) {
  Impl& s = *impl_;
  if (!s.ops) return;
  s.stop();
  s.collect();
  log_info("HostSyncMonitor", s.table);
}

void HostSyncMonitor::on_exception(RunContext&, Module&, const std::exception&) {
  impl_->stop();
  impl_->collect();
}

const std::vector<HostSyncMonitor::Row>& HostSyncMonitor::rows() const {
  return impl_->rows;
}
int64_t HostSyncMonitor::steps() const {
  return impl_->steps;
}
const std::string& HostSyncMonitor::table() const {
  return impl_->table;
}

}  // namespace volt
