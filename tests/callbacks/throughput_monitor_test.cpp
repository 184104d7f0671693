// ThroughputMonitor: Lightning's keys at the Trainer's cadence, window, totals, items, FLOPs,
// every stage, validation left out of training time.
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

constexpr const char* kSamples = volt::ThroughputMonitor::kDeviceSamplesPerSec;
constexpr const char* kBatches = volt::ThroughputMonitor::kDeviceBatchesPerSec;

// A window of 2: rates from a stage's second batch on (the default 100 needs longer fits).
volt::ThroughputMonitorOptions small_window() {
  return volt::ThroughputMonitorOptions().window_size(2);
}

TEST(ThroughputMonitor, LogsLightningsKeysAtTheTrainersStepsIntoTheCsv) {
  volt_test::TempDir dir;
  volt_test::TinyClassifier model;
  auto mem = std::make_shared<MemoryLogger>();
  auto csv = std::make_shared<volt::CSVLogger>(volt::CSVLoggerOptions(dir.path).version(0));
  auto monitor = std::make_shared<volt::ThroughputMonitor>(small_window());
  volt::Trainer trainer(volt_test::quiet(dir.path)
                            .max_epochs(2)
                            .log_every_n_steps(3)
                            .loggers({mem, csv})
                            .callbacks({monitor}));
  trainer.fit(model, volt_test::loader(volt_test::blobs(128)));  // 8 steps per epoch
  const auto rows = mem->with("train/time");
  // Same steps as the Trainer's own per-step metrics: global_step 3, 6, ... logged as step - 1.
  EXPECT_EQ(steps_of(rows), (std::vector<int64_t>{2, 5, 8, 11, 14}));
  EXPECT_EQ(steps_of(rows), steps_of(mem->with("train_loss")));
  double last_time = 0;
  for (const auto& [step, m] : rows) {
    // Running totals: every batch so far, 16 samples each.
    EXPECT_EQ(m.at("train/batches"), step + 1) << "step " << step;
    EXPECT_EQ(m.at("train/samples"), 16 * (step + 1)) << "step " << step;
    EXPECT_GT(m.at("train/time"), last_time) << "step " << step;
    last_time = m.at("train/time");
    const double samples = m.at(kSamples), batches = m.at(kBatches);
    EXPECT_TRUE(std::isfinite(samples) && samples > 0) << "step " << step << ": " << samples;
    EXPECT_LT(samples, 1e9) << "step " << step;  // a tiny MLP, but not faster than 1 ns/sample
    EXPECT_NEAR(samples / batches, 16.0, 1e-9) << "step " << step;  // batch size 16
    // One process: no job-wide figures, no items or FLOPs without length_fn / flops_per_batch.
    EXPECT_EQ(m.size(), 5u) << "step " << step;
  }
  EXPECT_EQ(monitor->last_logged(), rows.back().second);

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

TEST(ThroughputMonitor, RatesWaitForAFullWindowOfBatches) {
  volt_test::TempDir dir;
  volt_test::TinyClassifier model;
  auto mem = std::make_shared<MemoryLogger>();
  volt::Trainer trainer(
      volt_test::quiet(dir.path).max_epochs(1).log_every_n_steps(1).loggers({mem}).callbacks(
          {std::make_shared<volt::ThroughputMonitor>(
              volt::ThroughputMonitorOptions().window_size(4))}));
  trainer.fit(model, volt_test::loader(volt_test::blobs(128)));  // 8 batches
  EXPECT_EQ(steps_of(mem->with("train/batches")), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  // The first rate needs 4 batch ends, so the first batch's start-up is never in it.
  EXPECT_EQ(steps_of(mem->with(kSamples)), (std::vector<int64_t>{3, 4, 5, 6, 7}));
}

TEST(ThroughputMonitor, CountsEveryAccumulatedBatchAndUsesBatchSizeAndLengthFns) {
  volt_test::TempDir dir;
  volt_test::TinyClassifier model;
  auto mem = std::make_shared<MemoryLogger>();
  // Samples per batch from a size (here: pretend each row holds 10 samples), and items (e.g.
  // tokens: 8 a sample, the row's features).
  auto monitor = std::make_shared<volt::ThroughputMonitor>(
      small_window()
          .batch_size_fn([](const volt::Batch& b) { return 10 * b.input.size(0); })
          .length_fn([](const volt::Batch& b) { return 10 * b.input.numel(); }));
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
    EXPECT_EQ(m.at("train/batches"), 2 * (step + 1)) << "step " << step;
    EXPECT_EQ(m.at("train/samples"), 320 * (step + 1)) << "step " << step;
    EXPECT_EQ(m.at("train/lengths"), 2560 * (step + 1)) << "step " << step;
    EXPECT_GT(m.at(kBatches), 0) << "step " << step;
    EXPECT_NEAR(m.at(kSamples) / m.at(kBatches), 160.0, 1e-9) << "step " << step;
    EXPECT_NEAR(m.at("train/device/items_per_sec") / m.at(kBatches), 1280.0, 1e-9)
        << "step " << step;
  }
}

TEST(ThroughputMonitor, GivesFlopsAndMfuFromTheFlopsOfABatch) {
  volt_test::TempDir dir;
  volt_test::TinyClassifier model;
  auto mem = std::make_shared<MemoryLogger>();
  // One training batch of 16: forward and backward of the two layers (the data needs no
  // gradient), counted as Lightning's measure_flops would.
  const auto x = torch::randn({16, 8});
  const int64_t flops = volt::measure_flops([&] { return model.forward(x); },
                                            [](const at::Tensor& y) { return y.sum(); });
  EXPECT_EQ(flops, 2 * 16 * 8 * 16 + 2 * 16 * 16 * 2 + 2 * (2 * 16 * 16 * 2) + 2 * 16 * 8 * 16);
  model.zero_grad();
  volt::Trainer trainer(
      volt_test::quiet(dir.path).max_epochs(1).log_every_n_steps(2).loggers({mem}).callbacks(
          {std::make_shared<volt::ThroughputMonitor>(
              small_window().flops_per_batch(flops).available_flops(1e9).using_sparse_model(
                  false))}));
  trainer.fit(model, volt_test::loader(volt_test::blobs(128)));
  const auto rows = mem->with("train/device/flops_per_sec");
  ASSERT_EQ(steps_of(rows), (std::vector<int64_t>{1, 3, 5, 7}));
  for (const auto& [step, m] : rows) {
    // A window of 2 holds one batch's FLOPs over the time of one batch.
    EXPECT_NEAR(m.at("train/device/flops_per_sec") / m.at(kBatches), flops, 1e-6 * flops);
    EXPECT_DOUBLE_EQ(m.at("train/device/mfu"), m.at("train/device/flops_per_sec") / 1e9);
  }
}

TEST(ThroughputMonitor, MeasuresValidationTestingAndPredictionUnderTheirOwnKeys) {
  volt_test::TempDir dir;
  volt_test::TinyClassifier model;
  auto mem = std::make_shared<MemoryLogger>();
  auto monitor = std::make_shared<volt::ThroughputMonitor>(
      volt::ThroughputMonitorOptions().window_size(3).eval_flops_per_batch(5));
  volt::Trainer trainer(volt_test::quiet(dir.path)
                            .max_epochs(2)
                            .log_every_n_steps(2)
                            .num_sanity_val_steps(2)
                            .loggers({mem})
                            .callbacks({monitor}));
  const auto val = volt_test::loader(volt_test::blobs(64, 8, 1));  // 4 batches
  trainer.fit(model, volt_test::loader(volt_test::blobs(128)), val);
  // Rows after every 2nd batch of a run, under the fit's validation batch count (Lightning's
  // iteration number); each validation run starts its window and totals anew (the window of 3
  // is full at a run's 3rd batch); the sanity check is not measured.
  const auto v = mem->with("validate/batches");
  ASSERT_EQ(steps_of(v), (std::vector<int64_t>{2, 4, 6, 8}));
  const std::vector<double> batches{2, 4, 2, 4};
  const std::vector<bool> rates{false, true, false, true};
  for (size_t i = 0; i < v.size(); ++i) {
    const auto& m = v[i].second;
    EXPECT_EQ(m.at("validate/batches"), batches[i]) << i;
    EXPECT_EQ(m.at("validate/samples"), 16 * batches[i]) << i;
    EXPECT_EQ(m.count("validate/device/samples_per_sec"), rates[i] ? 1u : 0u) << i;
    EXPECT_EQ(m.count("validate/device/flops_per_sec"), rates[i] ? 1u : 0u) << i;
  }
  EXPECT_GT(v[3].second.at("validate/device/samples_per_sec"), 0);
  EXPECT_EQ(mem->with("train/device/flops_per_sec").size(), 0u);  // flops_per_batch 0

  // Trainer::validate is a loop of its own: its batches are numbered from 1 again.
  mem->records.clear();
  trainer.validate(model, val);
  EXPECT_EQ(steps_of(mem->with("validate/batches")), (std::vector<int64_t>{2, 4}));

  // Two test calls: each opens a new window (no rates at the second call's 2nd batch), the
  // totals go on.
  trainer.test(model, val);
  trainer.test(model, val);
  const auto t = mem->with("test/batches");
  ASSERT_EQ(steps_of(t), (std::vector<int64_t>{2, 4, 6, 8}));
  EXPECT_EQ(t[2].second.at("test/batches"), 6);
  EXPECT_EQ(t[2].second.count("test/device/batches_per_sec"), 0u);
  EXPECT_EQ(t[3].second.at("test/batches"), 8);
  EXPECT_EQ(t[3].second.at("test/samples"), 128);
  EXPECT_GT(t[3].second.at("test/device/batches_per_sec"), 0);

  trainer.predict(model, val);
  EXPECT_EQ(steps_of(mem->with("predict/samples")), (std::vector<int64_t>{2, 4}));
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
  EXPECT_EQ(steps_of(mem->with("train/time")), trainer_steps);
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
          {clock, std::make_shared<volt::ThroughputMonitor>(small_window())}));
  // Validation (64k samples and the clock's 300 ms) takes far longer than one training batch
  // of 16; the clock's hooks run before the monitor's, so the sleep is inside validation.
  trainer.fit(model, volt_test::loader(volt_test::blobs(128)),
              volt_test::loader(volt_test::blobs(65536, 8, 1), 4096, false));
  ASSERT_EQ(clock->seconds.size(), 2u);
  // Step 8 is the first of epoch 1: the training time between it and step 7 spans epoch 0's
  // validation. Were validation counted, it could not be shorter than it.
  const auto rows = mem->with("train/time");
  ASSERT_EQ(rows.size(), 16u);
  ASSERT_EQ(rows[8].first, 8);
  const double between = rows[8].second.at("train/time") - rows[7].second.at("train/time");
  EXPECT_LT(between, clock->seconds[0])
      << "between " << between << " s, validation " << clock->seconds[0] << " s";
  EXPECT_NEAR(1.0 / rows[8].second.at(kBatches), between, 1e-9);  // a window of one batch
}

TEST(ThroughputMonitor, NeedsALogger) {
  volt_test::TempDir dir;
  volt_test::TinyClassifier model;
  volt::Trainer trainer(volt_test::quiet(dir.path).max_epochs(1).callbacks(
      {std::make_shared<volt::ThroughputMonitor>()}));
  for (int call = 0; call < 2; ++call) {
    try {
      if (call == 0) {
        trainer.fit(model, volt_test::loader(volt_test::blobs(32)));
      } else {
        trainer.test(model, volt_test::loader(volt_test::blobs(32)));
      }
      FAIL() << "expected ConfigError";
    } catch (const volt::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("has no logger"), std::string::npos) << e.what();
    }
  }
}

TEST(ThroughputMonitor, RejectsABadBatchSizeLengthOrOption) {
  const auto fit_error = [](volt::ThroughputMonitorOptions o) -> std::string {
    volt_test::TempDir dir;
    volt_test::TinyClassifier model;
    volt::Trainer trainer(volt_test::quiet(dir.path)
                              .max_epochs(1)
                              .loggers({std::make_shared<MemoryLogger>()})
                              .callbacks({std::make_shared<volt::ThroughputMonitor>(o)}));
    try {
      trainer.fit(model, volt_test::loader(volt_test::blobs(32)));
    } catch (const volt::ValueError& e) {
      return e.what();
    }
    return "no ValueError";
  };
  EXPECT_NE(fit_error(volt::ThroughputMonitorOptions().batch_size_fn([](const volt::Batch&) {
              return -1;
            })).find("batch_size_fn returned -1"),
            std::string::npos);
  EXPECT_NE(fit_error(volt::ThroughputMonitorOptions().batch_size_fn([](const volt::Batch&) {
              return 0;
            })).find("batch_size_fn returned 0; return the number of samples"),
            std::string::npos);
  EXPECT_NE(fit_error(volt::ThroughputMonitorOptions().length_fn([](const volt::Batch&) {
              return 1;
            })).find("lengths (1) are fewer than samples (16)"),
            std::string::npos);
  const auto option_error = [](volt::ThroughputMonitorOptions o) -> std::string {
    try {
      volt::ThroughputMonitor monitor(o);
    } catch (const volt::ValueError& e) {
      return e.what();
    }
    return "no ValueError";
  };
  EXPECT_NE(option_error(volt::ThroughputMonitorOptions().window_size(1)).find("window_size is 1"),
            std::string::npos);
  EXPECT_NE(option_error(volt::ThroughputMonitorOptions().flops_per_batch(-5)).find("must be >= 0"),
            std::string::npos);
}

TEST(ThroughputMonitor, OptionsPrint) {
  std::ostringstream os;
  os << volt::ThroughputMonitorOptions();
  EXPECT_EQ(os.str(),
            "ThroughputMonitorOptions(batch_size_fn=Batch::size, length_fn=none, "
            "flops_per_batch=0, eval_flops_per_batch=0, available_flops=none, window_size=100, "
            "separator=\"/\", using_sparse_model=none, sparse_cuda_acceleration_factor=2)");
}

}  // namespace
