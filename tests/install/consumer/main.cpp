// An out-of-tree program built against the installed volt package.
#include <torch/torch.h>
#include <volt/volt.h>

#include <iostream>

struct Linear1 : volt::Module {
  Linear1() { fc = register_module("fc", torch::nn::Linear(2, 1)); }
  torch::Tensor training_step(const volt::Batch& b, int64_t) override {
    return torch::mse_loss(fc->forward(b.input), b.target);
  }
  std::vector<volt::OptimizerConfig> configure_optimizers() override {
    return {std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1))};
  }
  torch::nn::Linear fc{nullptr};
};

int main() {
  torch::manual_seed(0);
  auto x = torch::randn({64, 2});
  auto y = x.matmul(torch::tensor({{2.0f}, {-1.0f}}));
  Linear1 m;
  volt::Trainer trainer(volt::TrainerOptions()
                            .max_epochs(30)
                            .logger(false)
                            .enable_checkpointing(false)
                            .enable_progress_bar(false));
  trainer.fit(m, volt::DataLoader(std::make_shared<volt::TensorDataset>(x, y),
                                  volt::DataLoaderOptions(16)));
  const double loss = torch::mse_loss(m.fc->forward(x), y).item<double>();
  std::cout << "final mse " << loss << "\n";
  if (loss > 1e-3) return 1;
  std::cout << "consumer ok\n";
  return 0;
}
