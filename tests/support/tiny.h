#pragma once
// Tiny real models and data for tests: fast enough to train many times per test binary.

#include <torch/torch.h>

#include <volt/volt.h>

#include <unistd.h>
#include <cstdlib>
#include <string>

namespace volt_test {

/// A fresh, empty temporary folder removed at scope exit.
struct TempDir {
  TempDir() {
    char tmpl[] = "/tmp/volt_test_XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::system(("rm -rf '" + path + "'").c_str()); }
  std::string operator/(const std::string& name) const { return path + "/" + name; }
  std::string path;
};

/// 2-class data: label = (sum of features > 0), features ~ N(0, 1), seeded.
inline std::shared_ptr<volt::TensorDataset> blobs(int64_t n = 256, int64_t dim = 8,
                                                  uint64_t seed = 0) {
  auto gen = at::detail::createCPUGenerator(seed);
  auto x = at::randn({n, dim}, gen);
  auto y = (x.sum(1) > 0).to(torch::kLong);
  return std::make_shared<volt::TensorDataset>(x, y);
}

/// A real Logger that keeps what it receives in memory.
class MemoryLogger : public volt::Logger {
 public:
  std::string name() const override { return "memory"; }
  std::string log_dir() override { return "/tmp"; }
  void log_hyperparams(const std::map<std::string, std::string>&) override {}
  void log_metrics(const volt::Metrics& m, int64_t step) override { records.emplace_back(step, m); }
  std::vector<std::pair<int64_t, volt::Metrics>> with(const std::string& key) const {
    std::vector<std::pair<int64_t, volt::Metrics>> out;
    for (const auto& r : records) {
      if (r.second.count(key)) out.push_back(r);
    }
    return out;
  }
  std::vector<std::pair<int64_t, volt::Metrics>> records;
};

inline volt::DataLoader loader(std::shared_ptr<volt::TensorDataset> ds, int64_t bs = 16,
                               bool shuffle = true, int64_t workers = 0) {
  return volt::DataLoader(
      std::move(ds), volt::DataLoaderOptions(bs).shuffle(shuffle).seed(7).num_workers(workers));
}

/// Linear-ReLU-Dropout-Linear classifier; dropout makes resume tests depend on the RNG state.
class TinyClassifier : public volt::Module {
 public:
  explicit TinyClassifier(int64_t dim = 8, double lr = 0.1, bool adam = false)
      : lr_(lr), adam_(adam) {
    fc1 = register_module("fc1", torch::nn::Linear(dim, 16));
    drop = register_module("drop", torch::nn::Dropout(0.2));
    fc2 = register_module("fc2", torch::nn::Linear(16, 2));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return fc2->forward(drop->forward(torch::relu(fc1->forward(x))));
  }
  torch::Tensor training_step(const volt::Batch& b, int64_t) override {
    auto loss = torch::cross_entropy_loss(forward(b.input), b.target);
    log("train_loss", loss, volt::LogOptions().prog_bar(true));
    return loss;
  }
  void validation_step(const volt::Batch& b, int64_t) override {
    auto logits = forward(b.input);
    log("val_loss", torch::cross_entropy_loss(logits, b.target));
    log("val_acc", logits.argmax(1).eq(b.target).to(torch::kFloat).mean());
  }
  void test_step(const volt::Batch& b, int64_t) override {
    log("test_acc", forward(b.input).argmax(1).eq(b.target).to(torch::kFloat).mean());
  }
  torch::Tensor predict_step(const volt::Batch& b, int64_t) override {
    return forward(b.input).argmax(1);
  }
  std::vector<volt::OptimizerConfig> configure_optimizers() override {
    std::shared_ptr<torch::optim::Optimizer> opt;
    if (adam_) {
      opt = std::make_shared<torch::optim::AdamW>(parameters(), torch::optim::AdamWOptions(lr_));
    } else {
      opt = std::make_shared<torch::optim::SGD>(parameters(),
                                                torch::optim::SGDOptions(lr_).momentum(0.9));
    }
    volt::OptimizerConfig cfg(opt);
    if (scheduler_step_size > 0) {
      cfg.scheduler(std::make_shared<volt::StepLR>(*opt, scheduler_step_size, 0.5))
          .interval(scheduler_interval)
          .frequency(scheduler_frequency);
    }
    return {cfg};
  }
  /// Concatenation of all parameters, for bit-exact comparisons.
  torch::Tensor flat_params() {
    std::vector<torch::Tensor> v;
    for (auto& p : parameters()) v.push_back(p.detach().reshape({-1}));
    return torch::cat(v).clone();
  }

  int64_t scheduler_step_size = 0;
  volt::Interval scheduler_interval = volt::Interval::kEpoch;
  int64_t scheduler_frequency = 1;
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::Dropout drop{nullptr};

 private:
  double lr_;
  bool adam_;
};

/// Quiet options for tests: no progress bar, model summary, default logger or checkpoint, a fixed
/// seed, and the CPU (these tests mean CPU semantics; "auto" would pick a GPU where one is
/// present, and a test that means CUDA says so).
inline volt::TrainerOptions quiet(const std::string& root) {
  return volt::TrainerOptions()
      .accelerator("cpu")
      .default_root_dir(root)
      .enable_progress_bar(false)
      .enable_checkpointing(false)
      .enable_model_summary(false)
      .logger(false)
      .num_sanity_val_steps(0)
      .seed(123);
}

}  // namespace volt_test
