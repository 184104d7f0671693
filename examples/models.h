#pragma once
// The demo models for Fashion-MNIST, shared by the example, the benchmarks and the tests.

#include <torch/torch.h>

#include <charconv>
#include <cmath>
#include <string>
#include <utility>

#include <volt/volt.h>

namespace volt_examples {

/// Images [N,1,28,28] -> logits [N,10]. With `pipeline_chunks` > 0 the layers are one
/// volt::Pipeline (`body`: Flatten, Linear, ReLU, ..., Linear) that the "pipeline" strategy splits
/// into stages, each batch cut into that many micro-batches; `pipeline_schedule` "1f1b" computes
/// the training loss with Pipeline::forward_loss (the 1F1B schedule) instead of GPipe's.
struct MlpNet : torch::nn::Module {
  static constexpr const char* kName = "MlpNet";
  explicit MlpNet(std::vector<int64_t> hidden = {128}, int64_t pipeline_chunks = 0,
                  std::string pipeline_schedule = "gpipe")
      : schedule(std::move(pipeline_schedule)) {
    int64_t in = 784;
    torch::nn::Sequential seq{torch::nn::Flatten()};
    for (size_t i = 0; i < hidden.size(); ++i) {
      torch::nn::Linear fc(in, hidden[i]);
      if (pipeline_chunks > 0) {
        seq->push_back(fc);
        seq->push_back(torch::nn::ReLU());
      } else {
        layers.push_back(register_module("fc" + std::to_string(i), fc));
      }
      in = hidden[i];
    }
    if (pipeline_chunks > 0) {
      seq->push_back(torch::nn::Linear(in, 10));
      body = register_module("body",
                             volt::Pipeline(seq, volt::PipelineOptions().chunks(pipeline_chunks)));
    } else {
      out = register_module("out", torch::nn::Linear(in, 10));
    }
  }
  // Sizes from ops (flatten, -1), not x.size(0): a trace keeps a C++ integer as a constant, so
  // an exported model (volt export) would only take the batch size it was traced with.
  torch::Tensor forward(torch::Tensor x) {
    if (body) return body->forward(x);
    x = x.flatten(1);
    for (auto& l : layers) x = torch::relu(l->forward(x));
    return out->forward(x);
  }
  torch::Tensor training_loss(const torch::Tensor& x, const torch::Tensor& target) {
    if (body && schedule == "1f1b") {
      return body->forward_loss(x, target, [](const torch::Tensor& y, const torch::Tensor& t) {
        return torch::cross_entropy_loss(y, t);
      });
    }
    return torch::cross_entropy_loss(forward(x), target);
  }
  std::string schedule;
  std::vector<torch::nn::Linear> layers;
  torch::nn::Linear out{nullptr};
  volt::Pipeline body{nullptr};
};

/// Two conv blocks (conv-bn-relu-pool) and a small classifier head.
struct CnnNet : torch::nn::Module {
  static constexpr const char* kName = "CnnNet";
  CnnNet() {
    conv1 =
        register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, 3).padding(1)));
    bn1 = register_module("bn1", torch::nn::BatchNorm2d(32));
    conv2 =
        register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3).padding(1)));
    bn2 = register_module("bn2", torch::nn::BatchNorm2d(64));
    fc1 = register_module("fc1", torch::nn::Linear(64 * 7 * 7, 128));
    drop = register_module("drop", torch::nn::Dropout(0.25));
    fc2 = register_module("fc2", torch::nn::Linear(128, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(bn1->forward(conv1->forward(x))), 2);
    x = torch::max_pool2d(torch::relu(bn2->forward(conv2->forward(x))), 2);
    x = drop->forward(torch::relu(fc1->forward(x.flatten(1))));
    return fc2->forward(x);
  }
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::Dropout drop{nullptr};
};

/// A small pre-norm transformer reading the 28 image rows as 28 tokens; its attention runs
/// through volt::fused_sdpa (or, with fused=false, through the plain composition).
struct TransformerNet : torch::nn::Module {
  static constexpr const char* kName = "TransformerNet";
  explicit TransformerNet(int64_t dim = 64, int64_t heads = 4, int64_t layers = 2,
                          bool fused = true, double attn_dropout = 0.0)
      : dim_(dim), heads_(heads), fused_(fused), attn_dropout_(attn_dropout) {
    embed = register_module("embed", torch::nn::Linear(28, dim));
    pos = register_parameter("pos", torch::randn({1, 28, dim}) * 0.02);
    for (int64_t i = 0; i < layers; ++i) {
      const std::string n = std::to_string(i);
      ln1.push_back(
          register_module("ln1_" + n, torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim}))));
      qkv.push_back(register_module("qkv_" + n, torch::nn::Linear(dim, 3 * dim)));
      proj.push_back(register_module("proj_" + n, torch::nn::Linear(dim, dim)));
      ln2.push_back(
          register_module("ln2_" + n, torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim}))));
      fc1.push_back(register_module("fc1_" + n, torch::nn::Linear(dim, 4 * dim)));
      fc2.push_back(register_module("fc2_" + n, torch::nn::Linear(4 * dim, dim)));
    }
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})));
    head = register_module("head", torch::nn::Linear(dim, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    const int64_t hd = dim_ / heads_;
    x = embed->forward(x.reshape({-1, 28, 28})) + pos;  // [B, T=28, dim]
    for (size_t i = 0; i < qkv.size(); ++i) {
      auto parts = qkv[i]->forward(ln1[i]->forward(x)).chunk(3, -1);
      // Heads from the tensor (-1), not heads_: under tensor parallelism a rank holds some of them.
      auto split = [&](const torch::Tensor& t) {
        return t.reshape({-1, 28, t.size(-1) / hd, hd}).transpose(1, 2);
      };
      auto opts = volt::SdpaOptions().dropout_p(is_training() ? attn_dropout_ : 0.0);
      // Under tensor parallelism a rank holds some of the heads: their dropout masks are its own
      // (outside a tensor-parallel forward the guard does nothing).
      c10::optional<volt::SplitRegionRng> split_rng;
      if (opts.dropout_p() > 0) split_rng.emplace();
      auto a = fused_
                   ? volt::fused_sdpa(split(parts[0]), split(parts[1]), split(parts[2]), opts)
                   : volt::sdpa_reference(split(parts[0]), split(parts[1]), split(parts[2]), opts);
      x = x + proj[i]->forward(a.output.transpose(1, 2).flatten(2));
      x = x + fc2[i]->forward(torch::gelu(fc1[i]->forward(ln2[i]->forward(x))));
    }
    return head->forward(norm->forward(x).mean(1));
  }
  int64_t dim_, heads_;
  bool fused_;
  double attn_dropout_;
  torch::nn::Linear embed{nullptr}, head{nullptr};
  torch::Tensor pos;
  std::vector<torch::nn::LayerNorm> ln1, ln2;
  std::vector<torch::nn::Linear> qkv, proj, fc1, fc2;
  torch::nn::LayerNorm norm{nullptr};
};

/// The cross-entropy a network's training step minimises (MlpNet's may run a pipeline schedule).
template <typename Net>
torch::Tensor training_loss(Net& net, const volt::Batch& b) {
  return torch::cross_entropy_loss(net.forward(b.input), b.target);
}
inline torch::Tensor training_loss(MlpNet& net, const volt::Batch& b) {
  return net.training_loss(b.input, b.target);
}

/// A volt::Module wrapping either network: cross-entropy, accuracy, Adam.
template <typename Net>
class Classifier : public volt::Module {
 public:
  explicit Classifier(std::shared_ptr<Net> net, double lr = 1e-3, int64_t step_size = 0)
      : net_(register_module("net", std::move(net))), lr_(lr), step_size_(step_size) {
    // The shortest text that reads back as lr (std::to_string would print 1e-7 as 0.000000).
    char text[32];
    const auto end = std::to_chars(text, text + sizeof text, lr).ptr;
    save_hyperparameters({{"lr", std::string(text, end)}, {"net", Net::kName}});
  }
  torch::Tensor forward(const torch::Tensor& x) { return net_->forward(x); }

  torch::Tensor training_step(const volt::Batch& b, int64_t) override {
    auto loss = training_loss(*net_, b);
    log("train_loss", loss, volt::LogOptions().prog_bar(true));
    return loss;
  }
  void validation_step(const volt::Batch& b, int64_t) override { eval_step(b, "val"); }
  void test_step(const volt::Batch& b, int64_t) override { eval_step(b, "test"); }
  torch::Tensor predict_step(const volt::Batch& b, int64_t) override {
    return net_->forward(b.input).argmax(1);
  }
  std::vector<volt::OptimizerConfig> configure_optimizers() override {
    auto opt = std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(lr_));
    volt::OptimizerConfig cfg(opt);
    if (step_size_ > 0) cfg.scheduler(std::make_shared<volt::StepLR>(*opt, step_size_, 0.5));
    return {cfg};
  }

 private:
  void eval_step(const volt::Batch& b, const std::string& prefix) {
    auto logits = net_->forward(b.input);
    // sync_dist: with several processes, the value over the whole set (each process evaluates
    // its shard), as the single-process run reports it.
    log(prefix + "_loss", torch::cross_entropy_loss(logits, b.target),
        volt::LogOptions().prog_bar(true).sync_dist(true));
    log(prefix + "_acc", logits.argmax(1).eq(b.target).to(torch::kFloat).mean(),
        volt::LogOptions().prog_bar(true).sync_dist(true));
  }
  std::shared_ptr<Net> net_;
  double lr_;
  int64_t step_size_;
};

/// Fashion-MNIST as a DataModule: 55k train / 5k validation split of the training files.
/// `pin_memory`: batches in page-locked memory on a CUDA machine, the training ones copied to
/// the GPU ahead of their step (DataLoaderOptions::prefetch_to_device).
class FashionMnistData : public volt::DataModule {
 public:
  FashionMnistData(std::string root, int64_t batch_size, int64_t num_workers = 0, uint64_t seed = 0,
                   bool pin_memory = false)
      : root_(std::move(root)),
        batch_size_(batch_size),
        workers_(num_workers),
        seed_(seed),
        pin_(pin_memory) {}
  void setup(volt::Stage stage) override {
    if (!train_) {
      volt::FashionMnist full(root_, volt::FashionMnist::Split::kTrain);
      const int64_t n_val = 5000, n = full.size();
      train_ = std::make_shared<volt::TensorDataset>(full.inputs().slice(0, 0, n - n_val),
                                                     full.targets().slice(0, 0, n - n_val));
      val_ = std::make_shared<volt::TensorDataset>(full.inputs().slice(0, n - n_val),
                                                   full.targets().slice(0, n - n_val));
    }
    if (!test_ && (stage == volt::Stage::kTest || stage == volt::Stage::kPredict)) {
      test_ = std::make_shared<volt::FashionMnist>(root_, volt::FashionMnist::Split::kTest);
    }
  }
  volt::DataLoader train_dataloader() override {
    return volt::DataLoader(train_, volt::DataLoaderOptions(batch_size_)
                                        .shuffle(true)
                                        .seed(seed_)
                                        .num_workers(workers_)
                                        .pin_memory(pin_));
  }
  c10::optional<volt::DataLoader> val_dataloader() override {
    return volt::DataLoader(val_, volt::DataLoaderOptions(512).pin_memory(pin_));
  }
  c10::optional<volt::DataLoader> test_dataloader() override {
    return volt::DataLoader(test_, volt::DataLoaderOptions(512).pin_memory(pin_));
  }
  c10::optional<volt::DataLoader> predict_dataloader() override { return test_dataloader(); }
  /// The training batch size, which volt::scale_batch_size can tune.
  c10::optional<int64_t> batch_size() const override { return batch_size_; }
  void set_batch_size(int64_t batch_size) override { batch_size_ = batch_size; }

 private:
  std::string root_;
  int64_t batch_size_, workers_;
  uint64_t seed_;
  bool pin_;
  std::shared_ptr<volt::TensorDataset> train_, val_, test_;
};

/// Registers the models above and the Fashion-MNIST data module under CLI names:
/// MlpClassifier, CnnClassifier, TransformerClassifier and FashionMNIST.
inline void register_fashion_mnist(volt::Registry& r) {
  const auto common = [](volt::Params p, int64_t step_size) {
    return p.add("lr", 1e-3, "Adam learning rate")
        .add("step_size", step_size, "halve the lr every N epochs (StepLR); 0 = constant");
  };
  // Checked here, so that a bad value is a config error (exit 2) before anything runs, not a
  // libtorch error from Adam's constructor or Linear's init at setup.
  const auto check_common = [](const volt::Args& a, const char* model) {
    const double lr = a.get<double>("lr");
    VOLT_CHECK(std::isfinite(lr) && lr > 0, volt::ConfigError, "[", model, "] lr=", lr,
               " must be a positive number; e.g. --model.lr=0.001.");
    VOLT_CHECK(a.get<int64_t>("step_size") >= 0, volt::ConfigError, "[", model,
               "] step_size=", a.get<int64_t>("step_size"),
               " is negative; pass 0 (constant lr) or a number of epochs.");
  };
  r.models.add(
      "MlpClassifier", "Fashion-MNIST MLP (784 -> hidden... -> 10)",
      common(volt::Params()
                 .add("hidden", std::vector<int64_t>{256, 128}, "hidden layer widths")
                 .add("pipeline_chunks", int64_t{0},
                      "layers in one volt::Pipeline for --trainer.strategy=pipeline, with this "
                      "many micro-batches per batch (0: plain layers)")
                 .add("pipeline_schedule", std::string("gpipe"),
                      "with pipeline_chunks: gpipe (every micro-batch's forward, then the "
                      "backwards) or 1f1b (the loss in the pipeline, each micro-batch's backward "
                      "as soon as it can run: fewer activations held)"),
             4),
      [check_common](const volt::Args& a) -> std::shared_ptr<volt::Module> {
        check_common(a, "MlpClassifier");
        const auto hidden = a.get<std::vector<int64_t>>("hidden");
        VOLT_CHECK(hidden.size() <= 1024, volt::ConfigError, "[MlpClassifier] hidden lists ",
                   hidden.size(), " layers; a demo MLP takes at most 1024.");
        for (int64_t width : hidden) {
          VOLT_CHECK(width > 0 && width <= (int64_t{1} << 20), volt::ConfigError,
                     "[MlpClassifier] hidden has a width of ", width,
                     "; every hidden layer needs 1 to 1048576 units, e.g. "
                     "--model.hidden=[256,128].");
        }
        const int64_t chunks = a.get<int64_t>("pipeline_chunks");
        VOLT_CHECK(chunks >= 0 && chunks <= 65536, volt::ConfigError,
                   "[MlpClassifier] pipeline_chunks=", chunks,
                   " must be 0 (plain layers) or a number of micro-batches up to 65536, e.g. 4.");
        const auto schedule = a.get<std::string>("pipeline_schedule");
        VOLT_CHECK(schedule == "gpipe" || schedule == "1f1b", volt::ConfigError,
                   "[MlpClassifier] pipeline_schedule='", schedule,
                   "' is not a schedule; use gpipe or 1f1b.");
        VOLT_CHECK(schedule == "gpipe" || chunks > 0, volt::ConfigError,
                   "[MlpClassifier] pipeline_schedule=1f1b needs the layers in a pipeline; set "
                   "--model.pipeline_chunks to a number of micro-batches, e.g. 4.");
        return std::make_shared<Classifier<MlpNet>>(
            std::make_shared<MlpNet>(hidden, chunks, schedule), a.get<double>("lr"),
            a.get<int64_t>("step_size"));
      });
  r.models.add("CnnClassifier", "Fashion-MNIST CNN (two conv-bn-relu-pool blocks)",
               common(volt::Params(), 2),
               [check_common](const volt::Args& a) -> std::shared_ptr<volt::Module> {
                 check_common(a, "CnnClassifier");
                 return std::make_shared<Classifier<CnnNet>>(
                     std::make_shared<CnnNet>(), a.get<double>("lr"), a.get<int64_t>("step_size"));
               });
  r.models.add(
      "TransformerClassifier", "Fashion-MNIST transformer over image rows (volt::fused_sdpa)",
      common(volt::Params()
                 .add("dim", int64_t{64}, "model width")
                 .add("heads", int64_t{4}, "attention heads (dim must divide by it)")
                 .add("layers", int64_t{2}, "transformer blocks")
                 .add("fused", true, "attention through fused_sdpa (false: the reference)")
                 .add("attn_dropout", 0.0, "attention dropout probability"),
             2),
      [check_common](const volt::Args& a) -> std::shared_ptr<volt::Module> {
        check_common(a, "TransformerClassifier");
        const int64_t dim = a.get<int64_t>("dim"), heads = a.get<int64_t>("heads");
        VOLT_CHECK(dim > 0 && dim <= 65536, volt::ConfigError, "[TransformerClassifier] dim=", dim,
                   " must be in [1, 65536], e.g. 64.");
        VOLT_CHECK(heads > 0 && dim % heads == 0, volt::ConfigError,
                   "[TransformerClassifier] dim=", dim, " is not divisible by heads=", heads,
                   "; pick heads that divide dim.");
        const int64_t layers = a.get<int64_t>("layers");
        VOLT_CHECK(layers >= 1 && layers <= 1024, volt::ConfigError,
                   "[TransformerClassifier] layers=", layers,
                   layers < 1 ? " builds no transformer block; pass 1 or more."
                              : " is more than 1024 transformer blocks; pass fewer.");
        const double p = a.get<double>("attn_dropout");
        VOLT_CHECK(p >= 0 && p < 1, volt::ConfigError, "[TransformerClassifier] attn_dropout=", p,
                   " is outside [0, 1); pass e.g. 0.1, or 0 for none.");
        return std::make_shared<Classifier<TransformerNet>>(
            std::make_shared<TransformerNet>(dim, heads, layers, a.get<bool>("fused"),
                                             a.get<double>("attn_dropout")),
            a.get<double>("lr"), a.get<int64_t>("step_size"));
      });
  r.data_modules.add(
      "FashionMNIST", "Fashion-MNIST IDX files: 55k train / 5k val / 10k test",
      volt::Params()
          .add("root", std::string(volt::kFashionMnistDefaultRoot),
               "folder with the IDX(.gz) files")
          .add("batch_size", int64_t{64}, "training batch size")
          .add("num_workers", int64_t{1}, "loader worker threads")
          .add("seed", int64_t{42}, "shuffle seed")
          .add("pin_memory", false,
               "page-locked batches on a CUDA machine, each training batch copied "
               "to the GPU during the step before it (no-op on CPU)"),
      [](const volt::Args& a) -> std::shared_ptr<volt::DataModule> {
        VOLT_CHECK(a.get<int64_t>("batch_size") > 0, volt::ConfigError,
                   "[FashionMNIST] batch_size=", a.get<int64_t>("batch_size"),
                   " must be positive.");
        return std::make_shared<FashionMnistData>(
            a.get<std::string>("root"), a.get<int64_t>("batch_size"), a.get<int64_t>("num_workers"),
            static_cast<uint64_t>(a.get<int64_t>("seed")), a.get<bool>("pin_memory"));
      });
}

}  // namespace volt_examples
