// ThroughputMonitor: logged at the Trainer's cadence, positive rates, batch size from sizes.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "tiny.h"

namespace {

using volt_test::MemoryLogger;

std::vector<int64_t> steps_of(const std::vector<std::pair<int64_t, volt::Metrics>>& rows) {
  std::vector<int64_t> s;
  for (const auto& r : rows) s.push_back(r.first);
  return s;
}

constexpr const char* kSamples = volt::ThroughputMonitor::kSamplesPerSec;
constexpr const char* kBatches = volt::ThroughputMonitor::kBatchesPerSec;

TEST(ThroughputMonitor, LogsPositiveRatesAtTheTrainersStepsIntoTheCsv) {
  volt_test::TempDir dir;
  volt_test::TinyClassifier model;
  auto mem = std::make_shared<MemoryLogger>();
  auto csv = std::make_shared<volt::CSVLogger>(volt::CSVLoggerOptions(dir.path).version(0));
  auto monitor = std::make_shared<volt::ThroughputMonitor>();
  volt::Trainer trainer(volt_test::quiet(dir.path)
                            .max_epochs(2)
                            .log_every_n_steps(3)
                            .loggers({mem, csv})
                            .callbacks({monitor}));
  trainer.fit(model, volt_test::loader(volt_test::blobs(128)),  // 8 steps per epoch
              volt_test::loader(volt_test::blobs(64, 8, 1)));
  const auto rows = mem->with(kSamples);
  // Same steps as the Trainer's own per-step metrics: global_step 3, 6, ... logged as step - 1.
  EXPECT_EQ(steps_of(rows), (std::vector<int64_t>{2, 5, 8, 11, 14}));
  EXPECT_EQ(steps_of(rows), steps_of(mem->with("train_loss")));
  for (const auto& [step, m] : rows) {
    const double samples = m.at(kSamples), batches = m.at(kBatches);
    EXPECT_TRUE(std::isfinite(samples) && samples > 0) << "step " << step << ": " << samples;
    EXPECT_LT(samples, 1e9) << "step " << step;  // a tiny MLP, but not faster than 1 ns/sample
    EXPECT_NEAR(samples / batches, 16.0, 1e-9) << "step " << step;  // batch size 16
  }
  EXPECT_DOUBLE_EQ(monitor->last_logged().at(kSamples), rows.back().second.at(kSamples));

  // The column reaches metrics.csv with a value exactly on those rows.
  std::ifstream in(csv->metrics_path());
  std::string header;
  std::getline(in, header);
  std::vector<std::string> cols;
  std::stringstream hs(header);
  for (std::string c; std::getline(hs, c, ',');) cols.push_back(c);
  const auto col = std::find(cols.begin(), cols.end(), kSamples) - cols.begin();
  ASSERT_LT(col, static_cast<long>(cols.size())) << header;
  std::set<int64_t> csv_steps;
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> cells;
    std::stringstream ls(line);
    for (std::string c; std::getline(ls, c, ',');) cells.push_back(c);
    if (static_cast<long>(cells.size()) > col && !cells[col].empty()) {
      EXPECT_GT(std::stod(cells[col]), 0) << line;
      csv_steps.insert(std::stoll(cells[0]));
    }
  }
  EXPECT_EQ(csv_steps, (std::set<int64_t>{2, 5, 8, 11, 14}));
}

TEST(ThroughputMonitor, CountsEveryAccumulatedBatchAndUsesBatchSizeFn) {
  volt_test::TempDir dir;
  volt_test::TinyClassifier model;
  auto mem = std::make_shared<MemoryLogger>();
  // Samples per batch from a size (here: pretend each row holds 10 samples, e.g. tokens).
  auto monitor =
      std::make_shared<volt::ThroughputMonitor>(volt::ThroughputMonitorOptions().batch_size_fn(
          [](const volt::Batch& b) { return 10 * b.input.size(0); }));
  volt::Trainer trainer(volt_test::quiet(dir.path)
                            .max_epochs(1)
                            .log_every_n_steps(1)
                            .accumulate_grad_batches(2)
                            .loggers({mem})
                            .callbacks({monitor}));
  trainer.fit(model, volt_test::loader(volt_test::blobs(128)));  // 8 batches = 4 steps
  const auto rows = mem->with(kBatches);
  EXPECT_EQ(steps_of(rows), (std::vector<int64_t>{0, 1, 2, 3}));
  for (const auto& [step, m] : rows) {
    EXPECT_GT(m.at(kBatches), 0) << "step " << step;
    EXPECT_NEAR(m.at(kSamples) / m.at(kBatches), 160.0, 1e-9) << "step " << step;
  }
}

// Manual optimization stepping twice a batch (a GAN's two optimizers step once each): global_step
// moves by 2, and the Trainer logs after the batches that pass a multiple of log_every_n_steps
// (steps 4, 6, 10, 12, 16 for 3). Both monitors log with it; they waited for a step that is a
// multiple itself (6, 12), missing half the Trainer's rows.
class TwoStepsABatch : public volt_test::TinyClassifier {
 public:
  TwoStepsABatch() { set_automatic_optimization(false); }
  torch::Tensor training_step(const volt::Batch& b, int64_t) override {
    auto opt = optimizers().at(0);
    for (int i = 0; i < 2; ++i) {
      opt.zero_grad();
      const auto loss = torch::cross_entropy_loss(forward(b.input), b.target);
      manual_backward(loss);
      opt.step();
      log("train_loss", loss);
    }
    return {};
  }
};

TEST(ThroughputMonitor, LogsWithTheTrainerWhenABatchTakesSeveralSteps) {
  volt_test::TempDir dir;
  TwoStepsABatch model;
  auto mem = std::make_shared<MemoryLogger>();
  auto monitor = std::make_shared<volt::ThroughputMonitor>();
  auto stats = std::make_shared<volt::DeviceStatsMonitor>();
  volt::Trainer trainer(
      volt_test::quiet(dir.path).max_epochs(1).log_every_n_steps(3).loggers({mem}).callbacks(
          {monitor, stats}));
  trainer.fit(model, volt_test::loader(volt_test::blobs(128)));  // 8 batches = 16 steps
  const std::vector<int64_t> trainer_steps{3, 5, 9, 11, 15};
  ASSERT_EQ(steps_of(mem->with("train_loss")), trainer_steps);
  EXPECT_EQ(steps_of(mem->with(kSamples)), trainer_steps);
  EXPECT_EQ(steps_of(mem->with(std::string(volt::DeviceStatsMonitor::kPrefix) + "InUse")),
            trainer_steps);
}

// Records how long each validation run takes, as a user's callback would, and makes each last
// at least 300 ms (a sleep at its end): far longer than a training batch of 16 even on a loaded
// machine (without it, a run with 16 tests in parallel measured a 12 ms validation against a
// 24 ms batch window).
class ValidationClock : public volt::Callback {
 public:
  std::string state_key() const override { return "ValidationClock"; }
  void on_validation_start(volt::RunContext&, volt::Module&) override {
    start_ = std::chrono::steady_clock::now();
  }
  void on_validation_end(volt::RunContext&, volt::Module&) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
  }
  std::vector<double> seconds;

 private:
  std::chrono::steady_clock::time_point start_;
};

TEST(ThroughputMonitor, LeavesValidationTimeOutOfTheWindow) {
  volt_test::TempDir dir;
  volt_test::TinyClassifier model;
  auto mem = std::make_shared<MemoryLogger>();
  auto clock = std::make_shared<ValidationClock>();
  volt::Trainer trainer(
      volt_test::quiet(dir.path).max_epochs(2).log_every_n_steps(1).loggers({mem}).callbacks(
          {clock, std::make_shared<volt::ThroughputMonitor>()}));
  // Validation (64k samples and the clock's 300 ms) takes far longer than one training batch
  // of 16; the clock's hooks run before the monitor's, so the sleep is inside validation.
  trainer.fit(model, volt_test::loader(volt_test::blobs(128)),
              volt_test::loader(volt_test::blobs(65536, 8, 1), 4096, false));
  ASSERT_EQ(clock->seconds.size(), 2u);
  // Step 8 is the first of epoch 1: its window (one batch) spans epoch 0's validation. Were
  // validation counted, the window could not be shorter than it.
  const auto rows = mem->with(kBatches);
  ASSERT_EQ(rows.size(), 16u);
  ASSERT_EQ(rows[8].first, 8);
  const double window_s = 1.0 / rows[8].second.at(kBatches);
  EXPECT_LT(window_s, clock->seconds[0])
      << "window " << window_s << " s, validation " << clock->seconds[0] << " s";
}

TEST(ThroughputMonitor, NeedsALogger) {
  volt_test::TempDir dir;
  volt_test::TinyClassifier model;
  volt::Trainer trainer(volt_test::quiet(dir.path).max_epochs(1).callbacks(
      {std::make_shared<volt::ThroughputMonitor>()}));
  try {
    trainer.fit(model, volt_test::loader(volt_test::blobs(32)));
    FAIL() << "expected ConfigError";
  } catch (const volt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("has no logger"), std::string::npos) << e.what();
  }
}

TEST(ThroughputMonitor, RejectsANegativeBatchSize) {
  volt_test::TempDir dir;
  volt_test::TinyClassifier model;
  auto monitor = std::make_shared<volt::ThroughputMonitor>(
      volt::ThroughputMonitorOptions().batch_size_fn([](const volt::Batch&) { return -1; }));
  volt::Trainer trainer(volt_test::quiet(dir.path)
                            .max_epochs(1)
                            .loggers({std::make_shared<MemoryLogger>()})
                            .callbacks({monitor}));
  try {
    trainer.fit(model, volt_test::loader(volt_test::blobs(32)));
    FAIL() << "expected ValueError";
  } catch (const volt::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("batch_size_fn returned -1"), std::string::npos)
        << e.what();
  }
}

TEST(ThroughputMonitor, OptionsPrint) {
  std::ostringstream os;
  os << volt::ThroughputMonitorOptions();
  EXPECT_EQ(os.str(), "ThroughputMonitorOptions(batch_size_fn=Batch::size)");
}

}  // namespace
