#include "volt/callbacks/gradient_accumulation_scheduler.h"

#include <algorithm>
#include <iterator>
#include <string>

#include "core/detail/ascii.h"
#include "volt/core/check.h"
#include "volt/core/log.h"
#include "volt/core/loop_state.h"
#include "volt/core/run_context.h"

namespace volt {
namespace {

constexpr const char* kExample =
    "e.g. \"0:8, 4:4, 8:1\" (from epoch 0 accumulate 8 batches, "
    "from epoch 4 four, from epoch 8 none)";

}  // namespace

GradientAccumulationScheduler::GradientAccumulationScheduler(std::map<int64_t, int64_t> scheduling)
    : scheduling_(std::move(scheduling)) {
  VOLT_CHECK(!scheduling_.empty(), ConfigError,
             "[GradientAccumulationScheduler] scheduling is empty; map epochs to accumulation "
             "factors, ",
             kExample, ".");
  for (const auto& [epoch, factor] : scheduling_) {
    VOLT_CHECK(epoch >= 0, ConfigError, "[GradientAccumulationScheduler] epoch ", epoch,
               " is negative; epochs count from 0.");
    VOLT_CHECK(factor >= 1, ConfigError, "[GradientAccumulationScheduler] factor ", factor,
               " for epoch ", epoch,
               " is below 1; pass the batches per optimizer step (1 = "
               "no accumulation).");
  }
  // As Lightning: epochs before the first key accumulate nothing.
  scheduling_.emplace(0, 1);
}

std::map<int64_t, int64_t> GradientAccumulationScheduler::parse_scheduling(
    const std::string& text) {
  std::map<int64_t, int64_t> out;
  size_t i = 0;
  const auto fail = [&](const std::string& what) {
    throw ConfigError("[GradientAccumulationScheduler] scheduling \"" + text + "\": " + what +
                      " at character " + std::to_string(i + 1) +
                      "; write epoch:factor pairs separated by commas, " + kExample + ".");
  };
  const auto skip_space = [&] {
    while (i < text.size() && detail::ascii_space(text[i])) ++i;
  };
  const auto number = [&](const char* what) -> int64_t {
    skip_space();
    const size_t start = i;
    while (i < text.size() && detail::ascii_digit(text[i])) ++i;
    if (i == start) fail(std::string("expected ") + what);
    if (i - start > 12) {
      i = start;
      fail(std::string(what) + " too large");
    }
    return std::stoll(text.substr(start, i - start));
  };
  skip_space();
  if (i == text.size()) fail("no epoch:factor pair");
  for (;;) {
    const size_t at = i;
    const int64_t epoch = number("an epoch (an integer >= 0)");
    skip_space();
    if (i >= text.size() || text[i] != ':') fail("expected ':'");
    ++i;
    const int64_t factor = number("a factor (an integer >= 1)");
    if (!out.emplace(epoch, factor).second) {
      i = at;
      fail("epoch " + std::to_string(epoch) + " appears twice");
    }
    skip_space();
    if (i == text.size()) break;
    if (text[i] != ',') fail("expected ',' or the end");
    ++i;
  }
  return out;
}

bool GradientAccumulationScheduler::going_to_accumulate_grad_batches() const {
  return std::any_of(scheduling_.begin(), scheduling_.end(),
                     [](const auto& kv) { return kv.second > 1; });
}

int64_t GradientAccumulationScheduler::accumulate_grad_batches(int64_t epoch) const {
  auto it = scheduling_.upper_bound(epoch);  // the first key after `epoch`; keys hold 0
  return it == scheduling_.begin() ? 1 : std::prev(it)->second;
}

void GradientAccumulationScheduler::on_train_start(RunContext& run, Module&) {
  VOLT_CHECK(run.state().accumulate_grad_batches == 1, ConfigError,
             "[GradientAccumulationScheduler] the Trainer's accumulate_grad_batches is ",
             run.state().accumulate_grad_batches,
             " and this callback schedules the factor too; remove accumulate_grad_batches "
             "from the Trainer's options or remove the callback.");
  // Every factor now (the run refuses any under manual optimization, and a strategy that fixes
  // the factor refuses a change), so that training fails before it starts, not at the epoch that
  // changes the factor.
  for (const auto& kv : scheduling_) run.check_accumulate_grad_batches(kv.second);
}

void GradientAccumulationScheduler::on_train_epoch_start(RunContext& run, Module&) {
  const int64_t epoch = run.state().epoch;
  const int64_t factor = accumulate_grad_batches(epoch);
  if (factor == run.state().accumulate_grad_batches) return;
  run.set_accumulate_grad_batches(factor);
  if (run.is_global_zero()) {
    log_info("GradientAccumulationScheduler",
             "epoch " + std::to_string(epoch) + ": " + std::to_string(factor) +
                 (factor == 1 ? " batch" : " batches") + " per optimizer step.");
  }
}

}  // namespace volt
