// HostSyncMonitor: real training runs whose module reads the host at known places (an item()
// per training step, a gradient norm after backward, a nonzero before the optimizer step, a
// tensor as a condition) counted exactly, per part of the step; a clean run reporting none;
// volt's own non-finite loss check told apart; VOLT_LOG_HOST_SYNCS; and the decision for a model
// on an accelerator, which this CPU-only machine can test only as a function.

#include "volt/callbacks/host_sync_monitor.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "build_paths.h"
#include "callbacks/detail/op_placement.h"
#include "log_capture.h"
#include "processes.h"
#include "tiny.h"

namespace {

using volt::HostSyncMonitor;
using volt::HostSyncMonitorOptions;

/// TinyClassifier that reads the host where a test asks it to.
class Reader : public volt_test::TinyClassifier {
 public:
  bool item_in_step = false, norm_after_backward = false, nonzero_before_step = false,
       condition_in_step = false, item_in_validation = false;
  torch::Tensor training_step(const volt::Batch& b, int64_t i) override {
    auto loss = TinyClassifier::training_step(b, i);
    if (item_in_step) last_loss = loss.item<double>();
    if (condition_in_step) positive += at::is_nonzero(loss > 0) ? 1 : 0;
    return loss;
  }
  void validation_step(const volt::Batch& b, int64_t i) override {
    TinyClassifier::validation_step(b, i);
    if (item_in_validation) last_loss = forward(b.input).sum().item<double>();
  }
  void on_after_backward() override {
    if (norm_after_backward) last_norm = fc1->weight.grad().norm().item<double>();
  }
  void on_before_optimizer_step(torch::optim::Optimizer&) override {
    if (nonzero_before_step) nonzero_rows = fc2->weight.grad().nonzero().size(0);
  }
  int64_t skip_at = -1;  // skip_rest_of_epoch() at this batch
  void on_train_batch_start(const volt::Batch&, int64_t i) override {
    if (i == skip_at) skip_rest_of_epoch();
  }
  double last_loss = 0, last_norm = 0;
  int64_t nonzero_rows = 0, positive = 0;
};

int64_t count_of(const HostSyncMonitor& m, const std::string& op, const std::string& where) {
  for (const auto& r : m.rows()) {
    if (r.op == op && r.where == where) return r.count;
  }
  return 0;
}

/// Fits `model` for 5 optimizer steps (batches of 16 from 80 blobs, then a validation pass),
/// logging every 2 steps.
std::vector<std::string> fit(Reader& model, std::shared_ptr<HostSyncMonitor> monitor,
                             bool nonfinite_check) {
  volt_test::TempDir dir;
  volt::Trainer trainer(volt_test::quiet(dir.path)
                            .max_epochs(1)
                            .log_every_n_steps(2)
                            .detect_nonfinite_loss(nonfinite_check)
                            .callbacks({monitor}));
  return volt_test::capture_logs([&] {
    trainer.fit(model, volt_test::loader(volt_test::blobs(80)),
                volt_test::loader(volt_test::blobs(32), 16, false));
  });
}

TEST(HostSyncMonitor, ACleanRunReportsNone) {
  Reader model;
  model.item_in_validation = true;  // validation is not a training step
  auto monitor = std::make_shared<HostSyncMonitor>();
  const auto lines = fit(model, monitor, /*nonfinite_check=*/false);
  EXPECT_EQ(monitor->steps(), 5);
  EXPECT_TRUE(monitor->rows().empty()) << monitor->table();
  EXPECT_EQ(monitor->table(), "no host sync and no CPU op in 5 training steps (model on cpu)");
  bool logged = false;
  for (const auto& l : lines)
    logged |= l.find("[HostSyncMonitor] no host sync") != std::string::npos;
  EXPECT_TRUE(logged);
}

// A batch the module skips (skip_rest_of_epoch) is no training step: watching starts at its
// batch start and, with no batch end, pauses at the epoch's end (what runs in between, the
// epoch's metric reduction among it, counts as its training_step: docs/OBSERVABILITY.md).
TEST(HostSyncMonitor, ASkippedBatchIsNotCountedAsAStep) {
  Reader model;
  model.skip_at = 3;
  auto monitor = std::make_shared<HostSyncMonitor>();
  fit(model, monitor, /*nonfinite_check=*/false);
  EXPECT_EQ(monitor->steps(), 3);
  EXPECT_NE(monitor->table().find("in 3 training steps"), std::string::npos) << monitor->table();
}

TEST(HostSyncMonitor, EachHostReadIsCountedExactlyWhereItHappens) {
  Reader model;
  model.item_in_step = model.norm_after_backward = model.nonzero_before_step = true;
  model.condition_in_step = model.item_in_validation = true;
  auto monitor = std::make_shared<HostSyncMonitor>();
  const auto lines = fit(model, monitor, /*nonfinite_check=*/false);
  ASSERT_EQ(monitor->steps(), 5);
  EXPECT_EQ(count_of(*monitor, "aten::_local_scalar_dense", "training_step"), 5)
      << monitor->table();
  // is_nonzero reads through item() -> _local_scalar_dense: one sync, counted once, as itself.
  EXPECT_EQ(count_of(*monitor, "aten::is_nonzero", "training_step"), 5) << monitor->table();
  EXPECT_EQ(count_of(*monitor, "aten::_local_scalar_dense", "backward"), 5) << monitor->table();
  EXPECT_EQ(count_of(*monitor, "aten::nonzero", "optimizer_step"), 5) << monitor->table();
  ASSERT_EQ(monitor->rows().size(), 4u) << monitor->table();
  for (const auto& r : monitor->rows()) EXPECT_EQ(r.kind, "host sync");
  EXPECT_NE(monitor->table().find("host syncs and CPU ops in 5 training steps (model on cpu; each "
                                  "sync is a read an accelerator would wait for)"),
            std::string::npos)
      << monitor->table();
  EXPECT_NE(monitor->table().find("      1.00  host sync  training_step           "
                                  "aten::_local_scalar_dense"),
            std::string::npos)
      << monitor->table();
  // The first of each (op, part of the step) is logged as it happens; the table at the end.
  int first = 0;
  for (const auto& l : lines) {
    first += l.find("[HostSyncMonitor] host sync in ") != std::string::npos;
  }
  EXPECT_EQ(first, 4);
  EXPECT_NE(lines.back().find("[HostSyncMonitor] host syncs and CPU ops in 5 training steps"),
            std::string::npos)
      << lines.back();
}

// The Trainer's own check records each loss on the device and reads the flag only at the
// logging cadence: in 5 steps logged every 2, on steps 2 and 4 (the fifth at the epoch's end,
// after the last batch).
TEST(HostSyncMonitor, VoltsOwnNonfiniteLossCheckIsReportedApartAndReadsAtTheLoggingCadence) {
  Reader model;
  model.item_in_step = true;
  auto monitor = std::make_shared<HostSyncMonitor>(HostSyncMonitorOptions().log_each(true));
  const auto lines = fit(model, monitor, /*nonfinite_check=*/true);
  EXPECT_EQ(count_of(*monitor, "aten::_local_scalar_dense", "training_step"), 5);
  EXPECT_EQ(count_of(*monitor, "aten::_local_scalar_dense", "non-finite loss check"), 2);
  EXPECT_EQ(monitor->rows().size(), 2u) << monitor->table();
  EXPECT_NE(monitor->table().find("TrainerOptions::detect_nonfinite_loss(false)"),
            std::string::npos)
      << monitor->table();
  // log_each: every one of the 7 is logged as it happens.
  int each = 0;
  for (const auto& l : lines)
    each += l.find("[HostSyncMonitor] host sync in ") != std::string::npos;
  EXPECT_EQ(each, 7);
}

TEST(HostSyncMonitor, TheEnvironmentVariableAddsOneToEveryTrainer) {
  const auto fit_with_env = [](const char* value) {
    ::setenv(HostSyncMonitor::kEnvVar, value, 1);
    Reader model;
    model.item_in_step = true;
    volt_test::TempDir dir;
    std::vector<std::string> lines;
    try {
      volt::Trainer trainer(volt_test::quiet(dir.path).max_steps(3).detect_nonfinite_loss(false));
      lines = volt_test::capture_logs(
          [&] { trainer.fit(model, volt_test::loader(volt_test::blobs(64)), c10::nullopt); });
    } catch (...) {
      ::unsetenv(HostSyncMonitor::kEnvVar);
      throw;
    }
    ::unsetenv(HostSyncMonitor::kEnvVar);
    int first = 0, tables = 0;
    for (const auto& l : lines) {
      first += l.find("[HostSyncMonitor] host sync in training_step") != std::string::npos;
      tables += l.find("[HostSyncMonitor] host syncs and CPU ops in 3 training steps") !=
                std::string::npos;
    }
    return std::make_pair(first, tables);
  };
  EXPECT_EQ(fit_with_env("1"), std::make_pair(1, 1));
  EXPECT_EQ(fit_with_env("2"), std::make_pair(3, 1));
  EXPECT_EQ(fit_with_env("0"), std::make_pair(0, 0));
  try {
    fit_with_env("yes");
    ADD_FAILURE() << "VOLT_LOG_HOST_SYNCS=yes was accepted";
  } catch (const volt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "[env] VOLT_LOG_HOST_SYNCS=\"yes\" is not one of 0, 1, 2; VOLT_LOG_HOST_SYNCS "
                  "means: log host syncs and CPU ops inside training steps"),
              std::string::npos)
        << e.what();
  }
}

TEST(HostSyncMonitor, ABadEnvironmentValueMakesTheCliExitTwo) {
  volt_test::TempDir dir;
  volt_test::Process p(volt_test::cli_binary(),
                       {"fit", "--model=MlpClassifier", "--data=FashionMNIST",
                        "--trainer.max_steps=1", "--trainer.default_root_dir=" + dir.path},
                       {{HostSyncMonitor::kEnvVar, "on"}});
  EXPECT_EQ(p.exit_code(std::chrono::seconds(60)), 2) << p.output();
  EXPECT_NE(p.output().find("[env] VOLT_LOG_HOST_SYNCS=\"on\" is not one of 0, 1, 2"),
            std::string::npos)
      << p.output();
}

/// Starts a second monitor while the first one observes.
class StartsAnother : public volt::Callback {
 public:
  std::string state_key() const override { return "StartsAnother"; }
  void on_train_start(volt::RunContext& run, volt::Module& module) override {
    HostSyncMonitor other;
    other.on_fit_start(run, module);
  }
};

TEST(HostSyncMonitor, BadOptionsAndASecondMonitorAreConfigErrors) {
  try {
    HostSyncMonitor m(HostSyncMonitorOptions().row_limit(0));
    ADD_FAILURE() << "row_limit=0 was accepted";
  } catch (const volt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("[HostSyncMonitor] row_limit=0 shows no rows"),
              std::string::npos)
        << e.what();
  }
  volt_test::TempDir dir;
  Reader model;
  auto monitor = std::make_shared<HostSyncMonitor>();
  volt::Trainer trainer(volt_test::quiet(dir.path).max_steps(2).callbacks(
      {monitor, std::make_shared<StartsAnother>()}));
  try {
    trainer.fit(model, volt_test::loader(volt_test::blobs(64)), c10::nullopt);
    ADD_FAILURE() << "a second monitor started";
  } catch (const volt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("another HostSyncMonitor is observing in this process"),
              std::string::npos)
        << e.what();
  }
  // The failed run released the op callback: a new run observes again.
  Reader again;
  again.item_in_step = true;
  auto fresh = std::make_shared<HostSyncMonitor>();
  fit(again, fresh, /*nonfinite_check=*/false);
  EXPECT_EQ(count_of(*fresh, "aten::_local_scalar_dense", "training_step"), 5);
  EXPECT_FALSE(at::hasGlobalCallbacks());
}

// The decision on an accelerator, on the device types of real tensors (no GPU here to run it).
TEST(OpPlacement, ClassifiesSyncsCopiesAndHostOpsByDevice) {
  using volt::detail::classify_op;
  using volt::detail::OpFinding;
  const c10::DeviceType cpu = torch::zeros({2}).device().type();
  const c10::DeviceType cuda = c10::DeviceType::CUDA;
  const volt::detail::OpNesting top{0, false}, nested{1, false}, in_sync{1, true};
  // Model on the CPU: every sync op is the read an accelerator would wait for; nothing else.
  EXPECT_EQ(classify_op("aten::_local_scalar_dense", cpu, {}, top), OpFinding::kHostSync);
  EXPECT_EQ(classify_op("aten::nonzero", cpu, {}, nested), OpFinding::kHostSync);
  EXPECT_EQ(classify_op("aten::_local_scalar_dense", cpu, {}, in_sync), OpFinding::kNone);
  EXPECT_EQ(classify_op("aten::digamma", cpu, {}, top), OpFinding::kNone);
  // Model on CUDA: a sync op on a device tensor syncs; on host tensors it is a CPU op.
  EXPECT_EQ(classify_op("aten::_local_scalar_dense", cuda, {cuda}, nested), OpFinding::kHostSync);
  EXPECT_EQ(classify_op("aten::equal", cuda, {cuda, cuda}, top), OpFinding::kHostSync);
  EXPECT_EQ(classify_op("aten::is_nonzero", cuda, {cuda}, in_sync), OpFinding::kNone);
  EXPECT_EQ(classify_op("aten::nonzero", cuda, {cpu}, top), OpFinding::kCpuOp);
  EXPECT_EQ(classify_op("aten::nonzero", cuda, {cpu}, nested), OpFinding::kNone);
  // Copies: device -> host syncs at any depth; host -> device and host -> host do not.
  EXPECT_EQ(classify_op("aten::copy_", cuda, {cpu, cuda}, {2, false}), OpFinding::kHostSync);
  EXPECT_EQ(classify_op("aten::copy_", cuda, {cuda, cpu}, nested), OpFinding::kNone);
  EXPECT_EQ(classify_op("aten::copy_", cuda, {cpu, cpu}, top), OpFinding::kNone);
  EXPECT_EQ(classify_op("aten::to", cuda, {cpu}, top), OpFinding::kNone);
  // The reference's fallback: an outermost op whose tensor inputs are all on the host.
  EXPECT_EQ(classify_op("aten::digamma", cuda, {cpu}, top), OpFinding::kCpuOp);
  EXPECT_EQ(classify_op("aten::add", cuda, {cpu, cpu}, top), OpFinding::kCpuOp);
  EXPECT_EQ(classify_op("aten::add", cuda, {cpu, cuda}, top), OpFinding::kNone);
  EXPECT_EQ(classify_op("aten::digamma", cuda, {cpu}, nested), OpFinding::kNone);
  EXPECT_EQ(classify_op("aten::digamma", cuda, {cuda}, top), OpFinding::kNone);
  EXPECT_EQ(classify_op("aten::empty", cuda, {}, top), OpFinding::kNone);  // no tensor input
}

}  // namespace
