// The README's example, compiled so that it stays true.
#include <torch/torch.h>
#include <volt/volt.h>

struct Net : volt::Module {
  Net() { fc = register_module("fc", torch::nn::Linear(784, 10)); }
  torch::Tensor training_step(const volt::Batch& b, int64_t) override {
    auto loss = torch::cross_entropy_loss(fc->forward(b.input.flatten(1)), b.target);
    log("train_loss", loss, volt::LogOptions().prog_bar(true));
    return loss;
  }
  void validation_step(const volt::Batch& b, int64_t) override {
    auto acc = fc->forward(b.input.flatten(1)).argmax(1).eq(b.target).to(torch::kFloat).mean();
    log("val_acc", acc);
  }
  std::vector<volt::OptimizerConfig> configure_optimizers() override {
    auto opt = std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(1e-3));
    return {volt::OptimizerConfig(opt).scheduler(std::make_shared<volt::StepLR>(*opt, 2, 0.5))};
  }
  torch::nn::Linear fc{nullptr};
};

int main() {
  volt::seed_everything(42);  // before building the model: libtorch seeds randomly at start-up
  auto train = std::make_shared<volt::FashionMnist>(volt::kFashionMnistDefaultRoot,
                                                    volt::FashionMnist::Split::kTrain);
  auto test = std::make_shared<volt::FashionMnist>(volt::kFashionMnistDefaultRoot,
                                                   volt::FashionMnist::Split::kTest);
  Net net;
  auto ckpt = std::make_shared<volt::ModelCheckpoint>(
      volt::ModelCheckpointOptions().monitor("val_acc").mode(volt::Mode::kMax).save_last(true));
  volt::Trainer trainer(volt::TrainerOptions().max_epochs(3).callbacks({ckpt}));
  trainer.fit(net, volt::DataLoader(train, volt::DataLoaderOptions(64).shuffle(true)),
              volt::DataLoader(test, volt::DataLoaderOptions(512)));
  // Later, or after a crash: trainer.fit(net, ..., ckpt->last_model_path()) resumes exactly.
}
