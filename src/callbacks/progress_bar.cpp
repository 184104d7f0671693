#include "volt/callbacks/progress_bar.h"

#include <unistd.h>

#include <cmath>
#include <string>

#include "core/detail/numbers.h"

namespace volt {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

ProgressBar::ProgressBar(double refresh_s, std::FILE* out) : refresh_s_(refresh_s), out_(out) {
  tty_ = out_ != nullptr && ::isatty(::fileno(out_));
}

void ProgressBar::on_train_epoch_start(RunContext& run, Module& module) {
  train_.start = train_.last_draw = std::chrono::steady_clock::now();
  train_.start_done = run.state().batches_done;
}

void ProgressBar::on_train_batch_end(RunContext& run, Module& module, const Batch& batch,
                                     int64_t batch_idx) {
  if (seconds_since(train_.last_draw) < refresh_s_) return;
  train_.last_draw = std::chrono::steady_clock::now();
  draw(run, run.state().batches_done, false);
}

void ProgressBar::on_train_epoch_end(RunContext& run, Module& module) {
  draw(run, run.state().batches_done, true);
}

void ProgressBar::on_validation_start(RunContext& run, Module& module) {
  eval_start(run.sanity_checking() ? "Sanity Checking" : "Validation");  // Lightning's labels
}
void ProgressBar::on_validation_batch_end(RunContext& run, Module& module, const Batch& batch,
                                          int64_t batch_idx) {
  eval_batch(run, batch_idx + 1);
}
void ProgressBar::on_validation_end(RunContext& run, Module& module) {
  eval_end(run);
}
void ProgressBar::on_test_start(RunContext& run, Module& module) {
  eval_start("Testing");
}
void ProgressBar::on_test_batch_end(RunContext& run, Module& module, const Batch& batch,
                                    int64_t batch_idx) {
  eval_batch(run, batch_idx + 1);
}
void ProgressBar::on_test_end(RunContext& run, Module& module) {
  eval_end(run);
}

void ProgressBar::eval_start(const char* label) {
  eval_label_ = label;
  eval_done_ = 0;
  eval_total_ = 0;
  eval_loader_ = 0;
  eval_loaders_ = 1;
  eval_.start = eval_.last_draw = std::chrono::steady_clock::now();
  eval_.start_done = 0;
}

std::string ProgressBar::eval_head() const {
  // Lightning's "Validation DataLoader 1" when a pass runs several loaders.
  if (eval_loaders_ <= 1) return eval_label_;
  return std::string(eval_label_) + " DataLoader " + std::to_string(eval_loader_);
}

void ProgressBar::eval_batch(RunContext& run, int64_t done) {
  if (!run.is_global_zero()) return;  // one bar per job: rank 0 draws it
  const LoopState& st = run.state();
  if (st.dataloader_idx != eval_loader_) {
    // The next loader of the pass: the last one's line is done, a new one starts.
    eval_line_done(run);
    eval_loader_ = st.dataloader_idx;
    eval_.start = eval_.last_draw = std::chrono::steady_clock::now();
  }
  eval_loaders_ = st.num_dataloaders;
  eval_total_ = st.num_eval_batches;
  eval_done_ = done;
  // Counts and clocks only: an evaluation line reads no metric value, so it never syncs.
  if (!tty_ || seconds_since(eval_.last_draw) < refresh_s_) return;
  eval_.last_draw = std::chrono::steady_clock::now();
  emit(progress(eval_head(), eval_, done, eval_total_), false);
}

void ProgressBar::eval_line_done(RunContext& run) {
  if (out_ == nullptr) return;
  const Stage stage = run.state().stage;
  if (stage == Stage::kValidate || stage == Stage::kTest) {
    // A standalone pass: its final line stays.
    emit(progress(eval_head(), eval_, eval_done_, eval_total_), true);
  } else if (tty_) {
    // Inside fit: clear it; the training line comes back at its next redraw.
    std::fprintf(out_, "\r\033[K");
    std::fflush(out_);
  }
}

void ProgressBar::eval_end(RunContext& run) {
  if (!run.is_global_zero()) return;  // one bar per job: rank 0 draws it
  if (eval_loader_ == 0 && eval_done_ == 0) eval_total_ = run.state().num_eval_batches;
  eval_line_done(run);
}

std::string ProgressBar::progress(const std::string& head, const Line& line, int64_t done,
                                  int64_t total) const {
  const double elapsed = seconds_since(line.start);
  const double rate = elapsed > 0 ? (done - line.start_done) / elapsed : 0.0;
  const double eta = rate > 0 ? (total - done) / rate : 0.0;
  return head + detail::c_format(" %lld/%lld [%.0fs<%.0fs, %.1f it/s]",
                                 static_cast<long long>(done), static_cast<long long>(total),
                                 elapsed, eta, rate);
}

void ProgressBar::emit(const std::string& text, bool final_line) {
  if (out_ == nullptr) return;
  ++redraws_;
  if (tty_) {
    std::fprintf(out_, "\r%s\033[K%s", text.c_str(), final_line ? "\n" : "");
  } else if (final_line) {
    std::fprintf(out_, "%s\n", text.c_str());
  }
  std::fflush(out_);
}

void ProgressBar::draw(RunContext& run, int64_t done, bool final_line) {
  if (!run.is_global_zero()) return;  // one bar per job: rank 0 draws it
  const auto& st = run.state();
  std::string head = "Epoch " + std::to_string(st.epoch);
  if (run.max_epochs() > 0) head += "/" + std::to_string(run.max_epochs() - 1);
  std::string line = progress(head, train_, done, st.num_training_batches);
  // Reading metric values is what may sync a device: it happens only here, throttled.
  for (const auto& kv : run.progress_bar_metrics()) {
    line += detail::c_format(" %s=%.4g", kv.first.c_str(), kv.second);
  }
  emit(line, final_line);
}

}  // namespace volt
