#include "volt/callbacks/progress_bar.h"

#include <unistd.h>

#include <cmath>
#include <string>

namespace volt {

ProgressBar::ProgressBar(double refresh_s, std::FILE* out) : refresh_s_(refresh_s), out_(out) {
  tty_ = out_ != nullptr && ::isatty(::fileno(out_));
}

void ProgressBar::on_train_epoch_start(RunContext& run, Module& module) {
  epoch_start_ = last_draw_ = std::chrono::steady_clock::now();
  start_batch_ = run.state().batches_done;
}

void ProgressBar::on_train_batch_end(RunContext& run, Module& module, const Batch& batch,
                                     int64_t batch_idx) {
  const auto now = std::chrono::steady_clock::now();
  if (std::chrono::duration<double>(now - last_draw_).count() < refresh_s_) return;
  last_draw_ = now;
  draw(run, run.state().batches_done, false);
}

void ProgressBar::on_train_epoch_end(RunContext& run, Module& module) {
  draw(run, run.state().batches_done, true);
}

void ProgressBar::draw(RunContext& run, int64_t done, bool final_line) {
  if (out_ == nullptr) return;
  ++redraws_;
  const auto& st = run.state();
  const int64_t total = st.num_training_batches;
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_start_).count();
  const double rate = elapsed > 0 ? (done - start_batch_) / elapsed : 0.0;
  const double eta = rate > 0 ? (total - done) / rate : 0.0;
  std::string line = "Epoch " + std::to_string(st.epoch);
  if (run.max_epochs() > 0) line += "/" + std::to_string(run.max_epochs() - 1);
  char buf[160];
  std::snprintf(buf, sizeof buf, " %lld/%lld [%.0fs<%.0fs, %.1f it/s]",
                static_cast<long long>(done), static_cast<long long>(total), elapsed, eta, rate);
  line += buf;
  // Reading metric values is what may sync a device: it happens only here, throttled.
  for (const auto& kv : run.progress_bar_metrics()) {
    std::snprintf(buf, sizeof buf, " %s=%.4g", kv.first.c_str(), kv.second);
    line += buf;
  }
  if (tty_) {
    std::fprintf(out_, "\r%s\033[K%s", line.c_str(), final_line ? "\n" : "");
  } else if (final_line) {
    std::fprintf(out_, "%s\n", line.c_str());
  }
  std::fflush(out_);
}

}  // namespace volt
