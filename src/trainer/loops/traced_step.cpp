// TrainerOptions::trace_training_step: training_step recorded by a TracedFunction and replayed
// with its elementwise float32 CPU chains fused.
//
// The step installs a call in the strategy (Strategy::set_training_step_call) for the length of
// each step, so a strategy's own per-step work (DDP's buffer broadcast) still runs eagerly and
// only the module's part (the precision's forward context, the input conversion and
// module.training_step: Strategy::module_training_step) is traced. The batch's tensors are the
// trace's inputs, the module's parameters and buffers its captured inputs. What training_step
// logs while traced is collected (Run::capture_log) and returned as extra outputs of the trace,
// so each replay logs the values it computed; the names and options are kept per signature
// beside the trace (one LRU of the same size, touched in the same order, so both keep the same
// signatures). Backward, clipping, the optimizer and the loop's counters are the eager ones.
// Whatever cannot be traced runs eagerly for the rest of the fit, logged once with the reason.
//
// A trace is the first step of its signature; a step that decides something from batch_idx,
// the epoch or any host value would be replayed with the traced step's decisions. So the step
// after each new trace, the first step of every later epoch and the 16th, 32nd, 64th, ... traced
// step are checked: training_step runs under the tracer again (its results used as an eager
// step's), and other ops, constants or logged names than the trace's turn the step eager with
// the first difference, and how many replays since the last check it may have spoiled.
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>

#include <list>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/detail/batch_tensors.h"
#include "core/detail/numbers.h"
#include "trainer/detail/run.h"
#include "trainer/loops/optimization_step.h"
#include "volt/core/check.h"
#include "volt/core/log.h"
#include "volt/kernels/traced_function.h"
#include "volt/strategies/deepspeed.h"

namespace volt {
namespace detail {
namespace {

constexpr int64_t kMaxTraces = 8;
// Batch layouts (which tensors a batch holds: a combined loader in max_size mode loses a part
// when that loader runs out) traced before the step runs eagerly.
constexpr size_t kMaxLayouts = 4;

std::vector<at::Tensor> tensors_of(const Batch& b) {
  std::vector<at::Tensor> out;
  if (b.input.defined()) out.push_back(b.input);
  if (b.target.defined()) out.push_back(b.target);
  for (const auto& kv : b.extra) {
    if (kv.second.defined()) out.push_back(kv.second);
  }
  return out;
}

// The batch of `like`'s layout made of `t` (tensors_of's order).
Batch batch_from(const std::vector<at::Tensor>& t, const Batch& like) {
  Batch b;
  size_t i = 0;
  if (like.input.defined()) b.input = t.at(i++);
  if (like.target.defined()) b.target = t.at(i++);
  for (const auto& kv : like.extra)
    b.extra[kv.first] = kv.second.defined() ? t.at(i++) : at::Tensor();
  return b;
}

std::string message_of(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

struct LogSpec {
  std::string name;
  LogOptions options;
};

class TracedOptimizationStep : public OptimizationStep {
 public:
  explicit TracedOptimizationStep(Run& run) : OptimizationStep(run) {}

  bool run(const Batch& batch, int64_t batch_idx, int64_t num_batches) override {
    if (!eager_ && !reasons_checked_) {
      reasons_checked_ = true;
      if (std::string why = static_reason(); !why.empty()) go_eager(why);
    }
    if (eager_) return OptimizationStep::run(batch, batch_idx, num_batches);
    // A step that branches on the epoch shows it at an epoch's start, where the fit loop
    // rechecks every trace made with the module (TracedFunction::recheck_module), this one
    // included; one that branches on the step count shows it some step: check the traces at
    // the 16th, 32nd, 64th, ... traced step too (a change is seen within twice the steps it
    // took to appear, at log2 cost; not sooner, since each check runs a step unfused).
    ++steps_;
    if (steps_ >= 16 && (steps_ & (steps_ - 1)) == 0) {
      for (const auto& kv : layouts_) kv.second.fn->recheck();
    }
    epoch_ = run_.module->current_epoch();
    Strategy& s = run_.strategy();
    s.set_training_step_call(
        [this](Module& m, const Batch& b, int64_t i) { return call(m, b, i); });
    struct Restore {
      Strategy& s;
      ~Restore() { s.set_training_step_call(nullptr); }
    } restore{s};
    return OptimizationStep::run(batch, batch_idx, num_batches);
  }

 private:
  // Why this run's training_step cannot be traced at all, or "".
  std::string static_reason() const {
    Run& r = run_;
    if (!r.module->automatic_optimization()) {
      return "manual optimization (training_step steps the optimizers itself; trace the "
             "module's forward with volt::TracedFunction instead)";
    }
    if (dynamic_cast<const DeepSpeedStrategy*>(&r.strategy()) != nullptr) {
      return "a DeepSpeed strategy (ZeRO gathers and frees the parameters around the forward)";
    }
    if (r.opts.sync_batchnorm()) {
      return "sync_batchnorm (its statistics are all-reduced outside libtorch's ops)";
    }
    for (const auto& p : r.module->parameters()) {
      if (!p.device().is_cpu()) {
        return "the module's parameters are on " + p.device().str() +
               " (the trace fuses CPU float32 ops; on CUDA use graph_training_step)";
      }
    }
    return "";
  }

  void go_eager(const std::string& why) {
    if (eager_) return;
    eager_ = true;
    log_warning("Trainer", "trace_training_step: running training_step eagerly: " + why);
  }

  // The strategy's call of the module's step while this step runs.
  at::Tensor call(Module& m, const Batch& b, int64_t batch_idx) {
    Strategy& s = run_.strategy();
    if (eager_) return s.module_training_step(m, b, batch_idx);
    const std::string layout = batch_layout(b);
    auto found = layouts_.find(layout);
    if (found == layouts_.end()) {
      if (layouts_.size() >= kMaxLayouts) {
        std::string seen;
        for (const auto& kv : layouts_) seen += (seen.empty() ? "(" : ", (") + kv.first + ")";
        go_eager("the batches came in more than " + std::to_string(kMaxLayouts) +
                 " layouts (which tensors they hold): " + seen + " and now (" + layout + ")");
        return s.module_training_step(m, b, batch_idx);
      }
      // A trace rebuilds the batch in its layout (batch_from), so each layout has a function
      // of its own, with its traces per signature.
      found = layouts_.emplace(layout, Layout{}).first;
      found->second.fn = std::make_unique<TracedFunction>(
          "training_step", *run_.module,
          [this](const std::vector<at::Tensor>& in) { return record(in); },
          TraceOptions().max_traces(kMaxTraces));
    }
    layout_ = &found->second;
    TracedFunction& traced = *layout_->fn;
    const std::vector<at::Tensor> in = tensors_of(b);
    batch_ = &b;
    batch_idx_ = batch_idx;
    recorded_ = false;
    std::vector<at::Tensor> out;
    // (Marks are kept across layouts: the key names both.)
    const std::string key = "(" + layout + ") " + traced.signature(in);
    const TracedFunction::Stats before = traced.stats();
    try {
      out = traced(in);
    } catch (const std::exception& e) {
      if (!recorded_) throw;  // a replay failed: not a tracing matter
      // The eager step must draw the random numbers (dropout's masks) the failed call drew.
      at::Generator cpu = at::detail::getDefaultCPUGenerator();
      cpu.set_state(rng_before_record_);
      go_eager(message_of(e) + where(key, batch_idx, traced.stats().checks > before.checks));
      return s.module_training_step(m, b, batch_idx);
    }
    const TracedFunction::Stats after = traced.stats();
    const bool checked = after.checks > before.checks;  // and its ops matched the trace's
    if (checked) {
      // What it logged must match too, since a replay logs under the traced call's names.
      if (std::string why = other_logs(key); !why.empty()) {
        for (size_t i = 0; i < pending_.size(); ++i)
          run_.log(pending_[i].name, out[i + 1], pending_[i].options);
        go_eager(why + where(key, batch_idx, true));
        return out[0];
      }
    }
    if (checked || after.traces > before.traces) {
      marks_[key] =
          Mark{"epoch " + std::to_string(epoch_) + ", batch_idx " + std::to_string(batch_idx)};
    } else {
      ++marks_[key].replays;
    }
    const std::vector<LogSpec>& logs = logs_for(key);
    VOLT_ASSERT(out.size() == logs.size() + 1, "the trace of training_step returned ", out.size(),
                " tensors for ", logs.size(), " logged values");
    for (size_t i = 0; i < logs.size(); ++i) run_.log(logs[i].name, out[i + 1], logs[i].options);
    // Signatures that keep changing (sequences of varying length) trace nearly every step:
    // slower than eager, so stop once as many traces were dropped as are kept.
    if (recorded_) {
      const TracedFunction::Stats st = traced.stats();
      if (st.evictions >= kMaxTraces) {
        go_eager("the batch's signature changed " + std::to_string(st.traces) +
                 " times, more than the " + std::to_string(kMaxTraces) +
                 " traces kept (e.g. batches of varying length), so the step was traced again "
                 "and again; pad the batches to a few fixed shapes to trace them");
      }
    }
    return out[0];
  }

  // The TracedFunction's function: training_step on the traced batch, returning the loss and
  // the values it logged.
  std::vector<at::Tensor> record(const std::vector<at::Tensor>& in) {
    recorded_ = true;
    // Only a trace or a check runs this, before training_step draws anything; a replay does not,
    // so the steps that replay copy no generator state. (get_state is no dispatched op: the
    // tracer does not record it.)
    rng_before_record_ = at::detail::getDefaultCPUGenerator().get_state();
    const Batch b = batch_from(in, *batch_);
    std::vector<Run::CapturedLog> logs;
    struct Capture {
      Run& r;
      explicit Capture(Run& run, std::vector<Run::CapturedLog>* to) : r(run) { r.capture_log = to; }
      ~Capture() { r.capture_log = nullptr; }
    } capture(run_, &logs);
    const at::Tensor loss = run_.strategy().module_training_step(*run_.module, b, batch_idx_);
    VOLT_CHECK(loss.defined(), NotAvailable,
               "training_step returned no loss for a batch (a skipped batch); a trace replays a "
               "step that always returns one");
    std::vector<at::Tensor> out{loss};
    pending_.clear();
    for (auto& l : logs) {
      out.push_back(l.value);
      pending_.push_back(LogSpec{l.name, l.options});
    }
    return out;
  }

  // Where a failed trace or check happened, and for a check the replays it may have spoiled.
  std::string where(const std::string& key, int64_t batch_idx, bool check) const {
    std::string s =
        " (at epoch " + std::to_string(epoch_) + ", batch_idx " + std::to_string(batch_idx);
    auto it = marks_.find(key);
    if (check && it != marks_.end() && it->second.replays > 0) {
      s += "; the " + std::to_string(it->second.replays) +
           " steps of this batch signature since its last check (" + it->second.at +
           ") replayed the trace and may have repeated its choices";
    }
    return s + ")";
  }

  // Why a checked call's logged values (pending_) differ from those kept for `key`, or "".
  std::string other_logs(const std::string& key) const {
    const auto& logs = layout_->logs;
    auto it = logs.find(key);
    if (it == logs.end()) return "";  // dropped with its trace; a new trace keeps these
    const std::vector<LogSpec>& kept = it->second.first;
    std::string was, now;
    for (const auto& l : kept) was += (was.empty() ? "" : ", ") + l.name;
    for (const auto& l : pending_) now += (now.empty() ? "" : ", ") + l.name;
    auto text = [](const LogOptions& o) {
      auto os = detail::c_stream<std::ostringstream>();
      os << o;
      return os.str();
    };
    bool same = kept.size() == pending_.size();
    for (size_t i = 0; same && i < kept.size(); ++i) {
      same = kept[i].name == pending_[i].name && text(kept[i].options) == text(pending_[i].options);
    }
    if (same) return "";
    return "training_step logged other names or options on a later call than when it was traced (" +
           was + " at the trace; " + now +
           " now), and a replay logs under the traced call's; log the same names with the same "
           "options on every step";
  }

  // The log specs of signature `key`: the ones just recorded when this call traced.
  // (Kept per layout, as its function keeps its traces: the same capacity, the same order.)
  const std::vector<LogSpec>& logs_for(const std::string& key) {
    auto& logs = layout_->logs;
    auto& recent = layout_->recent;
    auto it = logs.find(key);
    if (recorded_) {
      if (it != logs.end()) {
        recent.erase(it->second.second);
        logs.erase(it);
      }
      recent.push_front(key);
      it = logs.emplace(key, std::make_pair(std::move(pending_), recent.begin())).first;
      while (static_cast<int64_t>(logs.size()) > kMaxTraces) {
        logs.erase(recent.back());
        recent.pop_back();
      }
      return it->second.first;
    }
    VOLT_ASSERT(it != logs.end(), "no logged names kept for the trace ", key);
    recent.splice(recent.begin(), recent, it->second.second);
    return it->second.first;
  }

  // One batch layout's traced step and the names its traces logged (per signature, most
  // recently used first).
  struct Layout {
    std::unique_ptr<TracedFunction> fn;
    std::list<std::string> recent;
    std::map<std::string, std::pair<std::vector<LogSpec>, std::list<std::string>::iterator>> logs;
  };
  std::map<std::string, Layout> layouts_;
  Layout* layout_ = nullptr;  // the layout of the call in flight
  bool eager_ = false;
  bool reasons_checked_ = false;
  int64_t epoch_ = -1;  // the epoch of the last step, for the messages
  int64_t steps_ = 0;   // traced steps, to recheck the traces at powers of two
  // Per signature: where it was last traced or checked, and the replays since.
  struct Mark {
    std::string at;
    int64_t replays = 0;
  };
  std::map<std::string, Mark> marks_;
  // The traced call in flight.
  const Batch* batch_ = nullptr;
  int64_t batch_idx_ = 0;
  bool recorded_ = false;
  at::Tensor rng_before_record_;  // the CPU generator's state when this call began recording
  std::vector<LogSpec> pending_;
};

}  // namespace

std::unique_ptr<OptimizationStep> make_traced_step(Run& run) {
  return std::make_unique<TracedOptimizationStep>(run);
}

}  // namespace detail
}  // namespace volt
