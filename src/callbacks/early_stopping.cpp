#include "volt/callbacks/early_stopping.h"

#include <ATen/ops/full.h>
#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "core/detail/log_every_rank.h"
#include "core/detail/numbers.h"
#include "core/detail/print.h"
#include "core/detail/python_repr.h"
#include "volt/core/check.h"
#include "volt/core/log.h"
#include "volt/core/run_context.h"

namespace volt {

EarlyStopping::EarlyStopping(EarlyStoppingOptions options) : options_(std::move(options)) {
  VOLT_CHECK(!options_.monitor().empty(), ConfigError,
             "[EarlyStopping] monitor is empty; name a logged metric such as \"val_loss\".");
  VOLT_CHECK(options_.patience() >= 0, ConfigError,
             "[EarlyStopping] patience=", options_.patience(), " is negative.");
  VOLT_CHECK(std::isfinite(options_.min_delta()), ConfigError,
             "[EarlyStopping] min_delta=", options_.min_delta(), " is not finite.");
  // A nan threshold would never compare true: the stop it asks for could never happen.
  for (const auto& [name, value] : {std::pair<const char*, c10::optional<double>>{
                                        "stopping_threshold", options_.stopping_threshold()},
                                    {"divergence_threshold", options_.divergence_threshold()}}) {
    VOLT_CHECK(!value || !std::isnan(*value), ConfigError, "[EarlyStopping] ", name,
               "=nan can never be crossed; give a number or leave it unset.");
  }
  // Compared against best - |min_delta| in min mode (best + |min_delta| in max). Lightning signs
  // min_delta as given (min_delta *= -1 in min mode), so its negative min_delta loosens the test;
  // volt takes the magnitude, a negative min_delta meaning what the positive one does.
  options_.min_delta(std::abs(options_.min_delta()) * (options_.mode() == Mode::kMin ? -1 : 1));
  best_score_ = options_.mode() == Mode::kMin ? std::numeric_limits<double>::infinity()
                                              : -std::numeric_limits<double>::infinity();
}

std::string EarlyStopping::state_key() const {
  return "EarlyStopping{monitor=" + options_.monitor() +
         ",mode=" + (options_.mode() == Mode::kMin ? "min" : "max") + "}";
}

void EarlyStopping::on_validation_end(RunContext& run, Module& module) {
  // Trainer::validate() neither counts towards patience nor stops anything.
  if (run.state().stage != Stage::kFit) return;
  if (!checks_on_train_epoch_end(run)) check(run);
}

void EarlyStopping::on_train_epoch_end(RunContext& run, Module& module) {
  if (checks_on_train_epoch_end(run)) check(run);
}

// Lightning's EarlyStopping.setup: unset, at the epoch's end when it validates once per epoch
// at its end (the epoch's metrics then reduced, the validation's current), else after each
// validation; and at the epoch's end in a fit without validation whatever the schedule says
// (Lightning would then never check).
bool EarlyStopping::checks_on_train_epoch_end(const RunContext& run) const {
  if (options_.check_on_train_epoch_end()) return *options_.check_on_train_epoch_end();
  const LoopState& st = run.state();
  return st.num_val_batches == 0 || (st.val_check_at_epoch_end && st.val_every_epoch);
}

void EarlyStopping::check(RunContext& run) {
  const Metrics& m = run.callback_metrics();
  auto it = m.find(options_.monitor());
  if (it == m.end()) {
    VOLT_CHECK(!options_.strict(), ConfigError, "[EarlyStopping] monitored metric \"",
               options_.monitor(), "\" was not logged; available: [", detail::joined_keys(m),
               "]. Log it or set strict(false).");
    // Lightning's RuntimeWarning under verbose (which Python shows once).
    if (options_.verbose() && run.is_global_zero()) {
      warn_once("EarlyStopping.missing." + options_.monitor(), "EarlyStopping",
                "monitored metric \"" + options_.monitor() +
                    "\" is not available, so it does not stop the run (strict is false); "
                    "logged: [" +
                    detail::joined_keys(m) + "].");
    }
    return;
  }
  const double current = it->second;
  const bool min_mode = options_.mode() == Mode::kMin;
  auto improves = [&](double a, double b) { return min_mode ? a < b : a > b; };
  auto why = detail::c_stream<std::ostringstream>();
  auto improved = detail::c_stream<std::ostringstream>();
  bool stop = false;
  EarlyStoppingReason reason = EarlyStoppingReason::kNotStopped;
  if (options_.check_finite() && !std::isfinite(current)) {
    stop = true;
    reason = EarlyStoppingReason::kNonFiniteMetric;
    why << "Monitored metric " << options_.monitor() << " = " << current
        << " is not finite. Previous best value was " << fmt::format("{:.3f}", best_score_) << ".";
  } else if (options_.stopping_threshold() && improves(current, *options_.stopping_threshold())) {
    stop = true;
    reason = EarlyStoppingReason::kStoppingThreshold;
    why << "Stopping threshold reached: " << options_.monitor() << " = " << current
        << (min_mode ? " < " : " > ") << detail::python_repr(*options_.stopping_threshold()) << ".";
  } else if (options_.divergence_threshold() &&
             improves(*options_.divergence_threshold(), current)) {
    stop = true;
    reason = EarlyStoppingReason::kDivergenceThreshold;
    // Lightning prints its mode's sign here (val_loss = 100 < 10 in min mode); volt the one
    // that holds.
    why << "Divergence threshold reached: " << options_.monitor() << " = " << current
        << (min_mode ? " > " : " < ") << detail::python_repr(*options_.divergence_threshold())
        << ".";
  } else if (improves(current - options_.min_delta(), best_score_)) {
    // Lightning's _improvement_message.
    improved << "Metric " << options_.monitor() << " improved"
             << (std::isfinite(best_score_)
                     ? " by " + fmt::format("{:.3f}", std::abs(best_score_ - current)) +
                           " >= min_delta = " + detail::python_repr(std::abs(options_.min_delta()))
                     : std::string())
             << ". New best score: " << fmt::format("{:.3f}", current);
    best_score_ = current;
    wait_count_ = 0;
  } else {
    ++wait_count_;
    if (wait_count_ >= options_.patience()) {
      stop = true;
      reason = EarlyStoppingReason::kPatienceExhausted;
      why << "Monitored metric " << options_.monitor() << " did not improve in the last "
          << wait_count_ << " records. Best score: " << fmt::format("{:.3f}", best_score_) << ".";
    }
  }
  // This rank's own finding, before the ranks agree (as Lightning's _log_info), in its words.
  const std::string said = stop ? why.str() + " Signaling Trainer to stop." : improved.str();
  if (options_.verbose() && !said.empty()) {
    const int64_t rank = run.world_size() > 1 ? run.global_rank() : -1;
    // Lightning's _log_info prints on every rank unless log_rank_zero_only (volt's log_info
    // would drop the other ranks' lines).
    if (rank < 0 || !options_.log_rank_zero_only() || rank == 0) {
      detail::log_on_every_rank(LogLevel::kInfo, "EarlyStopping",
                                (rank >= 0 ? "[rank: " + std::to_string(rank) + "] " : "") + said);
    }
  }
  // Every rank stops together: one rank's reason is enough (Lightning's all=False).
  const bool any_stop = run.reduce_boolean_decision(stop, /*all=*/false);
  if (any_stop && !stop) why << "Another rank's " << options_.monitor() << " met the stop rule.";
  stop = any_stop;
  if (stop) {
    if (run.world_size() > 1) {
      // Every rank takes the reason of the first rank that stopped by its own check (every
      // rank is here: the decision above is the same everywhere).
      const at::Tensor reasons = run.all_gather(
          at::full({1}, static_cast<int64_t>(reason), at::kLong), /*sync_grads=*/false);
      const at::Tensor stopped = reasons.reshape({-1}).cpu();
      for (int64_t r = 0; r < stopped.numel(); ++r) {
        const int64_t code = stopped[r].item<int64_t>();
        if (code != 0) {
          reason = static_cast<EarlyStoppingReason>(code);
          break;
        }
      }
    }
    stopped_epoch_ = run.state().epoch;
    stop_reason_ = why.str();
    stopping_reason_ = reason;
    run.request_stop();
  }
}

void EarlyStopping::save_state(torch::serialize::OutputArchive& ar) const {
  ar.write("wait_count", c10::IValue(wait_count_));
  ar.write("best_score", c10::IValue(best_score_));
  ar.write("stopped_epoch", c10::IValue(stopped_epoch_));
  ar.write("patience", c10::IValue(options_.patience()));
  ar.write("stopping_reason", c10::IValue(static_cast<int64_t>(stopping_reason_)));
  ar.write("stopping_reason_message", c10::IValue(stop_reason_));
}

// The saved patience is not read back: a resumed run keeps the patience it is given (Lightning
// takes the checkpoint's, so a patience changed for the resume was ignored there).
void EarlyStopping::load_state(torch::serialize::InputArchive& ar) {
  c10::IValue w, b, s;
  ar.read("wait_count", w);
  ar.read("best_score", b);
  ar.read("stopped_epoch", s);
  wait_count_ = w.toInt();
  best_score_ = b.toDouble();
  stopped_epoch_ = std::max<int64_t>(0, s.toInt());  // -1 (not stopped) before session 105
  // Absent before session 103: not stopped.
  c10::IValue reason, message;
  const int64_t code =
      ar.try_read("stopping_reason", reason) && reason.isInt() ? reason.toInt() : 0;
  stopping_reason_ =
      code >= 0 && code <= static_cast<int64_t>(EarlyStoppingReason::kNonFiniteMetric)
          ? static_cast<EarlyStoppingReason>(code)
          : EarlyStoppingReason::kNotStopped;
  stop_reason_ = ar.try_read("stopping_reason_message", message) && message.isString()
                     ? message.toStringRef()
                     : std::string();
}

std::ostream& operator<<(std::ostream& os, const EarlyStoppingOptions& o) {
  return os << "EarlyStoppingOptions(monitor=" << detail::quoted(o.monitor())
            << ", min_delta=" << o.min_delta() << ", patience=" << o.patience()
            << ", mode=" << (o.mode() == Mode::kMin ? "min" : "max")
            << ", check_finite=" << o.check_finite()
            << ", stopping_threshold=" << detail::optional_text(o.stopping_threshold())
            << ", divergence_threshold=" << detail::optional_text(o.divergence_threshold())
            << ", strict=" << o.strict() << ", check_on_train_epoch_end="
            << (o.check_on_train_epoch_end() ? (*o.check_on_train_epoch_end() ? "1" : "0") : "none")
            << ", verbose=" << o.verbose() << ", log_rank_zero_only=" << o.log_rank_zero_only()
            << ")";
}

}  // namespace volt
