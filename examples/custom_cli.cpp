// Your own `volt`-style command line: register your modules by name, call volt::run_cli.
//
//   volt_custom_cli fit --model.width=32 --data.noise=0.1 --trainer.max_epochs=5
//   volt_custom_cli print-config > run.yaml && volt_custom_cli fit --config run.yaml
//   volt_custom_cli fit --help
//
// Everything else (trainer options, callbacks, loggers, accelerators, YAML, overrides, errors
// with exit code 2) comes from volt.

#include <torch/torch.h>

#include <volt/volt.h>

namespace {

/// y = sin(3x) + noise; 4096 training and 512 validation points.
class SineData : public volt::DataModule {
 public:
  SineData(double noise, int64_t batch_size) : noise_(noise), batch_size_(batch_size) {}
  void setup(volt::Stage) override {
    if (train_) return;
    auto make = [&](int64_t n, uint64_t seed) {
      auto gen = at::detail::createCPUGenerator(seed);
      auto x = at::rand({n, 1}, gen) * 4 - 2;
      auto y = torch::sin(3 * x) + noise_ * at::randn({n, 1}, gen);
      return std::make_shared<volt::TensorDataset>(x, y);
    };
    train_ = make(4096, 1);
    val_ = make(512, 2);
  }
  volt::DataLoader train_dataloader() override {
    return volt::DataLoader(train_, volt::DataLoaderOptions(batch_size_).shuffle(true));
  }
  c10::optional<volt::DataLoader> val_dataloader() override {
    return volt::DataLoader(val_, volt::DataLoaderOptions(512));
  }

 private:
  double noise_;
  int64_t batch_size_;
  std::shared_ptr<volt::TensorDataset> train_, val_;
};

/// A two-layer tanh MLP fitting the sine.
class SineRegressor : public volt::Module {
 public:
  SineRegressor(int64_t width, double lr) : lr_(lr) {
    net_ =
        register_module("net", torch::nn::Sequential(torch::nn::Linear(1, width), torch::nn::Tanh(),
                                                     torch::nn::Linear(width, 1)));
  }
  torch::Tensor training_step(const volt::Batch& b, int64_t) override {
    auto loss = torch::mse_loss(net_->forward(b.input), b.target);
    log("train_loss", loss, volt::LogOptions().prog_bar(true));
    return loss;
  }
  void validation_step(const volt::Batch& b, int64_t) override {
    log("val_loss", torch::mse_loss(net_->forward(b.input), b.target),
        volt::LogOptions().prog_bar(true).sync_dist(true));
  }
  std::vector<volt::OptimizerConfig> configure_optimizers() override {
    return {volt::OptimizerConfig(
        std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(lr_)))};
  }

 private:
  torch::nn::Sequential net_{nullptr};
  double lr_;
};

}  // namespace

int main(int argc, char** argv) {
  auto& r = volt::registry();
  r.models.add("SineRegressor", "tanh MLP fitting y = sin(3x)",
               volt::Params().add("width", int64_t{64}, "hidden units").add("lr", 1e-2, "Adam lr"),
               [](const volt::Args& a) {
                 return std::make_shared<SineRegressor>(a.get<int64_t>("width"),
                                                        a.get<double>("lr"));
               });
  r.data_modules.add("SineData", "noisy samples of sin(3x) on [-2, 2]",
                     volt::Params()
                         .add("noise", 0.05, "Gaussian noise std")
                         .add("batch_size", int64_t{64}, "training batch size"),
                     [](const volt::Args& a) {
                       return std::make_shared<SineData>(a.get<double>("noise"),
                                                         a.get<int64_t>("batch_size"));
                     });
  // One model and one data module are registered, so the config need not name them.
  return volt::run_cli(argc, argv);
}
