#include "volt/callbacks/progress_bar.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <string>

#include "core/detail/live_rows.h"
#include "core/detail/python_repr.h"
#include "volt/core/check.h"
#include "volt/core/log.h"
#include "volt/loggers/logger.h"

namespace volt {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// tqdm's format_interval: "MM:SS", or "H:MM:SS" from an hour on.
std::string interval_text(double seconds) {
  const auto t = static_cast<int64_t>(std::max(0.0, seconds));
  const int64_t h = t / 3600, m = t / 60 % 60, s = t % 60;
  return h > 0 ? fmt::format("{}:{:02d}:{:02d}", h, m, s) : fmt::format("{:02d}:{:02d}", m, s);
}

// tqdm's bar of `width` cells: full blocks, then one of eight partial blocks, then blanks.
std::string bar_text(double fraction, int64_t width) {
  static const char* const kParts[] = {" ", "▏", "▎", "▍", "▌", "▋", "▊", "▉"};
  const auto eighths = static_cast<int64_t>(std::clamp(fraction, 0.0, 1.0) * width * 8);
  const int64_t full = eighths / 8;
  std::string out;
  for (int64_t i = 0; i < full; ++i) out += "█";
  if (full < width) {
    out += kParts[eighths % 8];
    out.append(static_cast<size_t>(width - full - 1), ' ');
  }
  return out;
}

}  // namespace

void ProgressBarOptions::validate() const {
  VOLT_CHECK(refresh_rate_ >= 0, ConfigError, "[ProgressBar] refresh_rate=", refresh_rate_,
             " is negative; pass the batches between redraws (1 = every batch), or 0 to show no "
             "bar.");
  VOLT_CHECK(std::isfinite(refresh_s_) && refresh_s_ >= 0, ConfigError,
             "[ProgressBar] refresh_s=", refresh_s_,
             " must be a finite number of seconds >= 0 (0 = redraw every refresh_rate batches).");
}

std::ostream& operator<<(std::ostream& os, const ProgressBarOptions& o) {
  return os << "ProgressBarOptions(refresh_rate=" << o.refresh_rate()
            << ", refresh_s=" << o.refresh_s() << ", leave=" << o.leave() << ")";
}

ProgressBar::ProgressBar(ProgressBarOptions options, std::FILE* out)
    : options_(options), out_(out) {
  options_.validate();
  tty_ = out_ != nullptr && ::isatty(::fileno(out_));
}

std::string ProgressBar::format_num(double value) {
  // tqdm's format_num: "{:.3g}" with "+0"/"-0" shortened, unless Python's repr is no longer.
  std::string n;
  if (std::isnan(value)) {
    n = "nan";
  } else {
    std::string g = fmt::format("{:.3g}", value);
    for (const char* from : {"+0", "-0"}) {
      for (size_t p = g.find(from); p != std::string::npos; p = g.find(from, p)) g.erase(p + 1, 1);
    }
    const std::string repr = detail::python_repr(value);
    n = g.size() < repr.size() ? g : repr;
  }
  // Lightning's Tqdm.format_num pads a float to five characters so that the bar does not jitter.
  if (n.find('e') == std::string::npos) {
    if (n.find('.') == std::string::npos && n.size() < 5) n += '.';
    if (n.size() < 5) n.append(5 - n.size(), '0');
  }
  return n;
}

bool ProgressBar::draws(RunContext& run) const {
  return is_enabled() && out_ != nullptr && run.is_global_zero();
}

void ProgressBar::reset(Bar& bar, std::string desc, int64_t total, int64_t n) {
  bar.desc = std::move(desc);
  bar.total = total;
  bar.n = bar.start_n = n;
  bar.start = bar.last_draw = Clock::now();
  bar.live = true;
}

bool ProgressBar::due(const Bar& bar, int64_t n) const {
  if (n == bar.total) return true;
  if (n % options_.refresh_rate() != 0) return false;
  return options_.refresh_s() <= 0 || seconds_since(bar.last_draw) >= options_.refresh_s();
}

std::string ProgressBar::render(const Bar& bar, int64_t columns) const {
  // Lightning's BAR_FORMAT: "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining},
  // {rate_noinv_fmt}{postfix}]", l_bar being "{desc}: {percentage:3.0f}%|".
  const double elapsed = seconds_since(bar.start);
  const double rate = elapsed > 0 ? static_cast<double>(bar.n - bar.start_n) / elapsed : 0.0;
  const bool known = bar.total > 0;
  const double fraction = known ? static_cast<double>(bar.n) / static_cast<double>(bar.total) : 0;
  const std::string left =
      bar.desc + ": " + (known ? fmt::format("{:3.0f}%", fraction * 100) : std::string()) + "|";
  std::string right = "| " + std::to_string(bar.n) + "/" +
                      (known ? std::to_string(bar.total) : std::string("?")) + " [" +
                      interval_text(elapsed) + "<" +
                      (rate > 0 && known ? interval_text((bar.total - bar.n) / rate) : "?") + ", " +
                      (rate > 0 ? fmt::format("{:5.2f}", rate) : "?") + "it/s" +
                      (bar.postfix.empty() ? "" : ", " + bar.postfix) + "]";
  // tqdm's width: the bar fills the terminal's columns (dynamic_ncols), else 10 cells.
  const auto text_width = static_cast<int64_t>(left.size() + right.size());
  const int64_t width = columns > 0 ? std::max<int64_t>(1, columns - 1 - text_width) : 10;
  return left + bar_text(fraction, width) + right;
}

void ProgressBar::paint() {
  if (!tty_) return;
  std::vector<std::string> rows;
  const int64_t columns = detail::terminal_columns(out_);
  for (const Bar* bar : {&main_, &below_}) {
    if (bar->live) rows.push_back(render(*bar, columns));
  }
  detail::show_live_rows(out_, rows);
  ++redraws_;
}

void ProgressBar::close(Bar& bar, bool keep) {
  if (!bar.live) return;
  if (!tty_) {
    bar.live = false;
    if (keep) {
      detail::write_line(out_, render(bar, 0));
      ++redraws_;
    }
    return;
  }
  if (keep && &bar == &main_) {
    below_.live = false;
    paint();  // its final counts
    detail::end_live_rows(out_, 1);
    main_.live = false;
    return;
  }
  bar.live = false;
  paint();  // the rows without it
}

std::vector<std::pair<std::string, std::string>> ProgressBar::get_metrics(RunContext& run,
                                                                          Module&) {
  // Lightning's get_standard_metrics: the loggers' version (several loggers' distinct versions
  // joined with "_"; a version that is not a number shows its last 4 characters).
  std::vector<std::pair<std::string, std::string>> items;
  std::string version;
  std::vector<std::string> seen;
  for (const auto& logger : run.loggers()) {
    const std::string v = logger->version_name();
    if (std::find(seen.begin(), seen.end(), v) != seen.end()) continue;
    seen.push_back(v);
    version += (version.empty() ? "" : "_") + v;
  }
  const bool number =
      !version.empty() && version.find_first_not_of("0123456789") == std::string::npos;
  if (!number && version.size() > 4) version = version.substr(version.size() - 4);
  if (!version.empty()) items.emplace_back("v_num", version);
  for (const auto& kv : run.progress_bar_metrics()) {
    if (kv.first == "v_num" && !items.empty() && items.front().first == "v_num") {
      warn_once("ProgressBar.v_num", "ProgressBar",
                "the progress bar already tracks a metric with the name 'v_num' and "
                "log(\"v_num\", ..., prog_bar) overwrites this value; if this is undesired, "
                "change the name or override get_metrics() in the progress bar callback.");
      items.front().second = format_num(kv.second);
      continue;
    }
    items.emplace_back(kv.first, format_num(kv.second));
  }
  return items;
}

std::string ProgressBar::postfix_text(RunContext& run, Module& module) {
  // Reading the prog_bar values is what may sync a device: only when a bar is redrawn.
  std::string out;
  for (const auto& kv : get_metrics(run, module)) {
    out += (out.empty() ? "" : ", ") + kv.first + "=" + kv.second;
  }
  return out;
}

// ----------------------------------------------------------------------------------- training

void ProgressBar::on_sanity_check_start(RunContext& run, Module&) {
  if (!draws(run)) return;
  reset(main_, "Sanity Checking", 0, 0);
  main_.postfix.clear();  // a new bar: no items (a fit after another kept the last fit's)
  main_.live = false;     // shown from its first batch, when its loader's total is known
  eval_ = &main_;
  eval_kept_ = false;
  eval_loader_ = -1;
}

// The hooks that end a bar close whatever is live (a bar disabled while shown is still ended):
// live is set only where draws() held.
void ProgressBar::on_sanity_check_end(RunContext&, Module&) {
  close(main_, false);
  eval_ = nullptr;
}

void ProgressBar::on_train_start(RunContext& run, Module&) {
  if (!draws(run)) return;
  main_.postfix.clear();
}

void ProgressBar::on_train_epoch_start(RunContext& run, Module&) {
  if (!draws(run)) return;
  const LoopState& st = run.state();
  // Lightning's total_train_batches: the steps left bound it when only max_steps bounds the fit.
  int64_t total = st.num_training_batches;
  if (run.max_epochs() == -1 && run.max_steps() > 0) {
    total = std::min(total, run.max_steps() - st.global_step);
  }
  // As tqdm's reset: the items shown stay until the next redraw reads them again.
  reset(main_, "Epoch " + std::to_string(st.epoch), total, st.batches_done);
  paint();
}

void ProgressBar::on_train_batch_end(RunContext& run, Module& module, const Batch&,
                                     int64_t batch_idx) {
  if (!draws(run) || !main_.live) return;
  main_.n = batch_idx + 1;
  // Without a terminal nothing is drawn until the epoch's end: no values are read for it.
  if (!tty_ || !due(main_, main_.n)) return;
  main_.last_draw = Clock::now();
  main_.postfix = postfix_text(run, module);
  paint();
}

void ProgressBar::on_train_epoch_end(RunContext& run, Module& module) {
  if (!draws(run) || !main_.live) return;
  main_.postfix = postfix_text(run, module);
  if (options_.leave()) {
    close(main_, true);
  } else if (tty_) {
    paint();
  } else {
    // A file gets every epoch's line (one bar reset on a terminal would leave only the last).
    detail::write_line(out_, render(main_, 0));
    ++redraws_;
  }
}

void ProgressBar::on_train_end(RunContext&, Module&) {
  // Lightning's training bar stays; without a terminal its epochs' lines are printed already.
  close(main_, tty_);
}

// --------------------------------------------------------------------------------- evaluation

void ProgressBar::eval_start(RunContext& run, const char* desc) {
  if (!draws(run)) return;
  const bool in_fit = run.state().stage == Stage::kFit;
  eval_ = in_fit ? &below_ : &main_;
  eval_kept_ = !in_fit;  // Lightning's leave: a standalone pass's bar stays
  eval_loader_ = -1;
  reset(*eval_, desc, 0, 0);
  eval_->postfix.clear();  // a new bar: no items (after a fit, main_ held the training bar's)
  eval_->live = false;     // shown from its first batch
}

void ProgressBar::eval_batch_start(RunContext& run, const char* desc) {
  if (!draws(run) || eval_ == nullptr) return;
  const LoopState& st = run.state();
  if (st.dataloader_idx == eval_loader_) return;
  // The pass's next loader: Lightning resets the one bar (on a terminal the last loader's line
  // stays); a file gets every loader's final line.
  if (eval_loader_ >= 0 && !tty_ && eval_kept_) close(*eval_, true);
  eval_loader_ = st.dataloader_idx;
  reset(*eval_, std::string(desc) + " DataLoader " + std::to_string(st.dataloader_idx),
        st.num_eval_batches, 0);
  paint();
}

void ProgressBar::eval_batch_end(RunContext& run, int64_t batch_idx) {
  if (!draws(run) || eval_ == nullptr || !eval_->live) return;
  eval_->n = batch_idx + 1;
  // Counts and clocks only: an evaluation bar reads no value, so it never syncs a device.
  if (!tty_ || !due(*eval_, eval_->n)) return;
  eval_->last_draw = Clock::now();
  paint();
}

void ProgressBar::eval_end(RunContext& run, Module& module) {
  if (eval_ == nullptr) return;
  close(*eval_, eval_kept_);
  const bool in_fit = eval_ == &below_;
  eval_ = nullptr;
  eval_loader_ = -1;
  // Lightning refreshes the training bar's items after a validation inside fit.
  if (in_fit && main_.live && tty_ && draws(run)) {
    main_.postfix = postfix_text(run, module);
    paint();
  }
}

void ProgressBar::on_validation_start(RunContext& run, Module&) {
  if (run.sanity_checking()) return;  // the sanity check's bar is set up already
  eval_start(run, "Validation");
}
void ProgressBar::on_validation_batch_start(RunContext& run, Module&, const Batch&, int64_t) {
  eval_batch_start(run, run.sanity_checking() ? "Sanity Checking" : "Validation");
}
void ProgressBar::on_validation_batch_end(RunContext& run, Module&, const Batch&,
                                          int64_t batch_idx) {
  eval_batch_end(run, batch_idx);
}
void ProgressBar::on_validation_end(RunContext& run, Module& module) {
  eval_end(run, module);
}

void ProgressBar::on_test_start(RunContext& run, Module&) {
  eval_start(run, "Testing");
}
void ProgressBar::on_test_batch_start(RunContext& run, Module&, const Batch&, int64_t) {
  eval_batch_start(run, "Testing");
}
void ProgressBar::on_test_batch_end(RunContext& run, Module&, const Batch&, int64_t batch_idx) {
  eval_batch_end(run, batch_idx);
}
void ProgressBar::on_test_end(RunContext& run, Module& module) {
  eval_end(run, module);
}

void ProgressBar::on_predict_start(RunContext& run, Module&) {
  eval_start(run, "Predicting");
}
void ProgressBar::on_predict_batch_start(RunContext& run, Module&, const Batch&, int64_t) {
  eval_batch_start(run, "Predicting");
}
void ProgressBar::on_predict_batch_end(RunContext& run, Module&, const at::Tensor&, const Batch&,
                                       int64_t batch_idx) {
  eval_batch_end(run, batch_idx);
}
void ProgressBar::on_predict_end(RunContext& run, Module& module) {
  eval_end(run, module);
}

void ProgressBar::on_exception(RunContext&, Module&, const std::exception&) {
  // The bars stay as drawn, the cursor under them: the error is not printed onto a bar.
  if (tty_ && (main_.live || below_.live)) detail::end_live_rows(out_, 2);
  main_.live = below_.live = false;
  eval_ = nullptr;
  eval_loader_ = -1;
}

}  // namespace volt
