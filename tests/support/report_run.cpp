// Trains the tiny classifier for a few epochs with a CSVLogger, LearningRateMonitor and
// ThroughputMonitor, then writes the run report. Input of the Chromium render check
// (tests/report/render_check.sh) and of docs/images/report.png.
//
//   volt_report_run OUT_DIR    -> OUT_DIR/logs/tiny/version_0/..., OUT_DIR/report.html

#include <cstdio>
#include <fstream>
#include <string>

#include "tiny.h"

namespace {

// The tiny classifier with per-step and per-epoch training metrics and a one-cycle schedule,
// so the report has every kind of plot.
class ReportModel : public volt_test::TinyClassifier {
 public:
  explicit ReportModel(int64_t total_steps) : TinyClassifier(8, 0.05), total_steps_(total_steps) {
    save_hyperparameters({{"model", "TinyClassifier"}, {"hidden", "16"}, {"max_lr", "0.05"}});
  }
  torch::Tensor training_step(const volt::Batch& b, int64_t) override {
    auto logits = forward(b.input);
    auto loss = torch::cross_entropy_loss(logits, b.target);
    log("train_loss", loss, volt::LogOptions().on_step(true).on_epoch(true).prog_bar(true));
    log("train_acc", logits.argmax(1).eq(b.target).to(torch::kFloat).mean(),
        volt::LogOptions().on_step(true).on_epoch(true));
    return loss;
  }
  std::vector<volt::OptimizerConfig> configure_optimizers() override {
    auto opt =
        std::make_shared<torch::optim::AdamW>(parameters(), torch::optim::AdamWOptions(0.05));
    return {volt::OptimizerConfig(opt)
                .scheduler(std::make_shared<volt::OneCycleLR>(
                    *opt, volt::OneCycleLROptions(0.05, total_steps_)))
                .interval(volt::Interval::kStep)};
  }

 private:
  int64_t total_steps_;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  const std::string out = argv[1];
  const int64_t epochs = 6, n = 1024, batch = 32;
  volt::seed_everything(0);
  ReportModel model(epochs * n / batch);
  auto csv = std::make_shared<volt::CSVLogger>(
      volt::CSVLoggerOptions(out + "/logs").name("tiny").version(0));
  volt::Trainer trainer(
      volt_test::quiet(out).max_epochs(epochs).log_every_n_steps(2).loggers({csv}).callbacks(
          {std::make_shared<volt::LearningRateMonitor>(),
           std::make_shared<volt::ThroughputMonitor>()}));
  trainer.fit(model, volt_test::loader(volt_test::blobs(n), batch),
              volt_test::loader(volt_test::blobs(256, 8, 1), 64, false));
  // What the volt CLI writes next to the logs: its resolved config, shown verbatim.
  std::ofstream(csv->log_dir() + "/config.yaml")
      << "# resolved by volt_report_run\n"
      << "trainer:\n  max_epochs: " << epochs << "\n  log_every_n_steps: 2\n"
      << "  callbacks: [LearningRateMonitor, ThroughputMonitor]\n"
      << "model:\n  name: TinyClassifier   # Linear(8, 16) -> ReLU -> Dropout -> Linear(16, 2)\n"
      << "optimizer:\n  name: AdamW\n  scheduler: OneCycleLR(max_lr=0.05, total_steps="
      << epochs * n / batch << ")\n"
      << "data:\n  train: blobs(n=" << n << ", dim=8)\n  val: blobs(n=256, dim=8)\n"
      << "  batch_size: " << batch << "\n";
  const std::string path = volt::write_run_report(
      csv->log_dir(), volt::ReportOptions().output(out + "/report.html").title("tiny classifier"));
  std::printf("%s\n", path.c_str());
  return 0;
}
