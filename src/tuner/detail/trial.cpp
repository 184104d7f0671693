#include "tuner/detail/trial.h"

#include <torch/cuda.h>
#include <torch/torch.h>

#include <sstream>
#include <utility>

#include "core/detail/default_steps.h"
#include "core/detail/numbers.h"
#include "trainer/detail/tuner_trial.h"
#include "volt/callbacks/callback.h"
#include "volt/core/check.h"
#include "volt/core/module.h"
#include "volt/core/run_context.h"
#include "volt/data/data_module.h"
#include "volt/precision/precision.h"
#include "volt/strategies/ddp.h"

namespace volt {
namespace detail {
namespace {

// The default generators a trial may draw from: the CPU's and each visible GPU's (a trial moves
// a module on the CPU to the run's GPU, where dropout draws from that device's generator).
std::vector<c10::Device> generator_devices() {
  std::vector<c10::Device> out{c10::Device(c10::kCPU)};
  const int64_t gpus = static_cast<int64_t>(torch::cuda::device_count());
  for (int64_t i = 0; i < gpus; ++i) {
    out.emplace_back(c10::kCUDA, static_cast<c10::DeviceIndex>(i));
  }
  return out;
}

}  // namespace

TrainerOptions trial_options(TrainerOptions o) {
  o.max_epochs(-1)
      .min_epochs(c10::nullopt)
      .min_steps(c10::nullopt)
      .max_time(c10::nullopt)
      .overfit_batches(0.0)
      .num_sanity_val_steps(0)
      .enable_checkpointing(false)
      .enable_progress_bar(false)
      .enable_model_summary(false)
      .logger(false)
      .loggers({})
      .callbacks({})
      .profiler(nullptr)
      .checkpoint_io(nullptr)
      // A rate range test drives the loss to inf on purpose (Lightning records it and stops),
      // and a batch-size trial is judged on memory, not on its loss.
      .detect_nonfinite_loss(false);
  return o;
}

TrialData::TrialData(DataModule& hooks, DataLoader loader, Stage stage)
    : hooks_(hooks), loader_(std::move(loader)), stage_(stage) {}

c10::optional<DataLoader> TrialData::at(Stage stage) {
  if (stage != stage_) return c10::nullopt;
  return loader_;
}
DataLoader TrialData::train_dataloader() {
  return loader_;
}
c10::optional<DataLoader> TrialData::val_dataloader() {
  return at(Stage::kValidate);
}
c10::optional<DataLoader> TrialData::test_dataloader() {
  return at(Stage::kTest);
}
c10::optional<DataLoader> TrialData::predict_dataloader() {
  return at(Stage::kPredict);
}
// Each forwarder passes on the run's DataModule's "my default ran" mark, by which the Trainer
// then runs the Module's hook (which moves the batch to the device): without it a DataModule
// that overrides nothing left the trials' batches untransferred.
Batch TrialData::forward_hook(DefaultSteps::Bit bit, const std::function<Batch()>& call) {
  DefaultSteps::clear(hooks_);
  Batch out = call();
  if (DefaultSteps::ran(hooks_, bit)) DefaultSteps::mark(*this, bit);
  return out;
}
Batch TrialData::on_before_batch_transfer(Batch batch) {
  return forward_hook(DefaultSteps::kBeforeBatchTransfer,
                      [&] { return hooks_.on_before_batch_transfer(std::move(batch)); });
}
Batch TrialData::transfer_batch_to_device(Batch batch, c10::Device device) {
  return forward_hook(DefaultSteps::kTransferBatch,
                      [&] { return hooks_.transfer_batch_to_device(std::move(batch), device); });
}
Batch TrialData::on_after_batch_transfer(Batch batch) {
  return forward_hook(DefaultSteps::kAfterBatchTransfer,
                      [&] { return hooks_.on_after_batch_transfer(std::move(batch)); });
}

void run_trial_stage(Trainer& trainer, Module& module, Stage stage, const DataLoader& loader,
                     DataModule* hooks) {
  if (hooks == nullptr) {
    switch (stage) {
      case Stage::kFit: trainer.fit(module, loader); return;
      case Stage::kValidate: trainer.validate(module, loader); return;
      case Stage::kTest: trainer.test(module, loader); return;
      default: trainer.predict(module, loader); return;
    }
  }
  TrialData data(*hooks, loader, stage);
  switch (stage) {
    case Stage::kFit: trainer.fit(module, data); return;
    case Stage::kValidate: trainer.validate(module, data); return;
    case Stage::kTest: trainer.test(module, data); return;
    default: trainer.predict(module, data); return;
  }
}

void prepare_data_once(Module& module, DataModule& data) {
  const auto rng = get_rng_states(generator_devices());
  data.prepare_data();
  module.prepare_data();
  set_rng_states(rng);
}

ModuleSnapshot::ModuleSnapshot(Module& m, std::string tag)
    : module_(m), tag_(std::move(tag)), rng_(get_rng_states(generator_devices())) {
  torch::NoGradGuard no_grad;
  for (const auto& p : m.parameters()) params_.push_back(p.detach().clone());
  for (const auto& b : m.buffers()) buffers_.push_back(b.detach().clone());
}

namespace {

// Takes a snapshot again once the trial's configure_model has run (see after_configure_model).
class RetakeAfterConfigureModel : public Callback {
 public:
  explicit RetakeAfterConfigureModel(std::function<void()> retake) : retake_(std::move(retake)) {}
  std::string state_key() const override { return "RetakeAfterConfigureModel"; }
  void on_fit_start(RunContext&, Module&) override { retake_(); }
  void on_validation_start(RunContext&, Module&) override { retake_(); }
  void on_test_start(RunContext&, Module&) override { retake_(); }
  void on_predict_start(RunContext&, Module&) override { retake_(); }

 private:
  std::function<void()> retake_;
};

}  // namespace

std::shared_ptr<Callback> ModuleSnapshot::after_configure_model() {
  return std::make_shared<RetakeAfterConfigureModel>([this] {
    auto params = module_.parameters();
    auto buffers = module_.buffers();
    if (params.size() == params_.size() && buffers.size() == buffers_.size()) return;
    // On the host: copies on the trial's device would take memory from every trial (the batch
    // size search would settle lower); restore() moves them back.
    torch::NoGradGuard no_grad;
    params_.clear();
    buffers_.clear();
    const auto host = [](const at::Tensor& t) {
      return t.detach().to(at::kCPU, t.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
    };
    for (const auto& p : params) params_.push_back(host(p));
    for (const auto& b : buffers) buffers_.push_back(host(b));
  });
}

void ModuleSnapshot::restore() {
  torch::NoGradGuard no_grad;
  auto params = module_.parameters();
  auto buffers = module_.buffers();
  VOLT_CHECK(params.size() == params_.size() && buffers.size() == buffers_.size(), InternalError,
             tag_, " the module's parameters changed during the trial runs.");
  // A trial's precision may have converted the tensors in place (bf16-true, 64-true): they get
  // their own dtype back, on the device they are on now (KeepDevice moves the module back).
  auto put_back = [](at::Tensor& t, const at::Tensor& saved) {
    if (t.scalar_type() == saved.scalar_type()) {
      t.copy_(saved);
    } else {
      t.set_data(saved.to(t.device(), saved.scalar_type(), /*non_blocking=*/false, /*copy=*/true));
    }
  };
  for (size_t i = 0; i < params.size(); ++i) {
    put_back(params[i], params_[i]);
    params[i].mutable_grad() = at::Tensor();
  }
  for (size_t i = 0; i < buffers.size(); ++i) put_back(buffers[i], buffers_[i]);
  set_rng_states(rng_);
}

void check_trial_strategy(RunContext& run, const std::string& tag, bool ddp) {
  const int64_t n = run.world_size();
  const std::string name = run.strategy_name();
  VOLT_CHECK(name == "single_device" || (ddp && name == "ddp"), ConfigError, tag,
             " the run uses strategy \"", name, "\" (", n, n == 1 ? " process" : " processes",
             "); the search runs its trials in Trainers of its own and supports strategy ",
             ddp ? "single_device or ddp"
                 : "single_device (one process on one device, as Lightning's batch size finder)",
             ". Find the value with devices=1 and strategy single_device, then give the real run "
             "that value.");
}

TrainerOptions run_trial_options(RunContext& run) {
  TrainerOptions options = run.trainer_options();
  if (run.strategy_name() != "ddp") return options;
  const auto* ddp = dynamic_cast<const DdpStrategy*>(run_strategy(run).get());
  VOLT_CHECK(ddp != nullptr, InternalError, "[tuner] a run named \"ddp\" without a DdpStrategy.");
  options.strategy(
      DdpStrategy::sharing_processes_of(*ddp, make_precision(options.precision(), "tuner")));
  return options;
}

void keeping_run_precision(RunContext& run, const std::function<void()>& trials) {
  const Spec<Precision>& given = run.trainer_options().precision();
  const std::shared_ptr<Strategy> strategy = run_strategy(run);
  Precision& precision = strategy->precision();
  if (!given.is_object() || given.object().get() != &precision) {
    trials();  // the trials made a precision of their own
    return;
  }
  auto saved = detail::c_stream<std::stringstream>();
  {
    torch::serialize::OutputArchive out;
    precision.save_state(out);
    out.save_to(saved);
  }
  trials();
  precision.setup(strategy->root_device());
  torch::serialize::InputArchive in;
  in.load_from(saved);
  precision.load_state(in);
}

KeepDevice::KeepDevice(Module& module) : module_(module) {
  for (const auto& p : module_.parameters()) {
    device_ = p.device();
    break;
  }
}

KeepDevice::~KeepDevice() {
  if (!device_) return;
  for (const auto& p : module_.parameters()) {
    if (p.device() != *device_) {
      try {
        module_.to(*device_);
      } catch (...) {  // a destructor does not throw; the next step names the device mismatch
      }
    }
    break;
  }
}

}  // namespace detail
}  // namespace volt
