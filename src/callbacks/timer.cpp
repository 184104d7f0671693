#include "volt/callbacks/timer.h"

#include <torch/serialize/archive.h>

#include <cmath>

#include "core/detail/duration.h"
#include "core/detail/numbers.h"
#include "core/detail/print.h"
#include "volt/core/check.h"
#include "volt/core/log.h"
#include "volt/core/run_context.h"

namespace volt {

Timer::Timer(TimerOptions options) : options_(options) {
  VOLT_CHECK(!options_.duration_s() || *options_.duration_s() >= 0, ConfigError,
             "[Timer] duration_s=", options_.duration_s().value_or(0),
             " is negative; pass seconds >= 0 (or Timer::parse_duration(\"00:12:00:00\")).");
}

double Timer::parse_duration(const std::string& s) {
  const std::optional<double> seconds = detail::parse_dd_hh_mm_ss(s);
  VOLT_CHECK(seconds.has_value(), ConfigError, "[Timer] duration \"", s,
             "\" is not DD:HH:MM:SS (e.g. \"00:12:00:00\" for 12 hours).");
  return *seconds;
}

double Timer::time_elapsed(Stage stage) const {
  auto it = spans_.find(stage);
  if (it == spans_.end()) return 0.0;
  const Span& s = it->second;
  double live = 0;
  if (s.start) {
    const auto end = s.end ? *s.end : Clock::now();
    live = std::chrono::duration<double>(end - *s.start).count();
  }
  return s.offset + live;
}

c10::optional<double> Timer::time_remaining(Stage stage) const {
  if (!options_.duration_s()) return c10::nullopt;
  return *options_.duration_s() - time_elapsed(stage);
}

c10::optional<std::chrono::steady_clock::time_point> Timer::start_time(Stage stage) const {
  auto it = spans_.find(stage);
  if (it == spans_.end()) return c10::nullopt;
  return it->second.start;
}

c10::optional<std::chrono::steady_clock::time_point> Timer::end_time(Stage stage) const {
  auto it = spans_.find(stage);
  if (it == spans_.end()) return c10::nullopt;
  return it->second.end;
}

void Timer::on_fit_start(RunContext& run, Module&) {
  // A fit resumed with its time already spent trains no further, as Lightning's
  // Timer.on_fit_start check of the time restored (it trained one more epoch, or one more batch,
  // past the limit). A duration of 0 trains nothing, as there.
  check(run);
}

void Timer::on_train_start(RunContext&, Module&) {
  auto& s = spans_[Stage::kFit];
  s.start = Clock::now();
  s.end.reset();
}
void Timer::on_train_end(RunContext&, Module&) {
  spans_[Stage::kFit].end = Clock::now();
}
void Timer::on_validation_start(RunContext&, Module&) {
  spans_[Stage::kValidate] = Span{Clock::now(), c10::nullopt, 0};
}
void Timer::on_validation_end(RunContext&, Module&) {
  spans_[Stage::kValidate].end = Clock::now();
}
void Timer::on_test_start(RunContext&, Module&) {
  spans_[Stage::kTest] = Span{Clock::now(), c10::nullopt, 0};
}
void Timer::on_test_end(RunContext&, Module&) {
  spans_[Stage::kTest].end = Clock::now();
}

void Timer::on_train_batch_end(RunContext& run, Module&, const Batch&, int64_t) {
  if (options_.interval() == Interval::kStep) check(run);
}
void Timer::on_train_epoch_end(RunContext& run, Module&) {
  if (options_.interval() == Interval::kEpoch) check(run);
}

void Timer::check(RunContext& run) {
  if (!options_.duration_s() || *time_remaining() > 0) return;
  if (options_.verbose() && run.is_global_zero()) {
    // Lightning's line, its elapsed time as Python prints a timedelta of whole seconds.
    const auto t = static_cast<int64_t>(time_elapsed(Stage::kFit));
    const int64_t days = t / 86400;
    std::string elapsed = days > 0 ? std::to_string(days) + (days == 1 ? " day, " : " days, ") : "";
    elapsed +=
        detail::c_format("%lld:%02lld:%02lld", static_cast<long long>(t % 86400 / 3600),
                         static_cast<long long>(t % 3600 / 60), static_cast<long long>(t % 60));
    log_info("Timer",
             "Time limit reached. Elapsed time is " + elapsed + ". Signaling Trainer to stop.");
  }
  run.request_stop();
}

void Timer::save_state(torch::serialize::OutputArchive& ar) const {
  ar.write("fit_elapsed", c10::IValue(time_elapsed(Stage::kFit)));
}

void Timer::load_state(torch::serialize::InputArchive& ar) {
  c10::IValue v;
  if (ar.try_read("fit_elapsed", v))
    spans_[Stage::kFit] = Span{c10::nullopt, c10::nullopt, v.toDouble()};
}

std::ostream& operator<<(std::ostream& os, const TimerOptions& o) {
  return os << "TimerOptions(duration_s=" << detail::optional_text(o.duration_s())
            << ", interval=" << (o.interval() == Interval::kStep ? "step" : "epoch")
            << ", verbose=" << o.verbose() << ")";
}

}  // namespace volt
