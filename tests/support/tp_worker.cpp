// One tensor-parallel inference job for tests/strategies/tensor_parallel_test.cpp. Started as a
// plain process it launches its ranks itself (DeepSpeedStrategy re-executes this binary). Every
// rank writes its predictions (logits of every batch, concatenated) to <out>.rank<R>.pt and
// prints "rank R done param_bytes=P full_bytes=F layers=L injected=K restored=0|1" (K: the
// modules kernel injection replaced).
//
//   volt_tp_worker --root DIR --out PREFIX --devices N --model
//       mlp|transformer|blocks|seqmlp|encoder
//       [--tp N] [--form plan|policy|json|none] [--dtype float32|bfloat16] [--stage
//       predict|validate|fit]
//       [--heads H] [--kernel-inject 0|1] [--timeout S (default 120)] [--shard G/N (reference:
//       shard G of N)]
//   --devices 1 --tp 1 is the single-process reference (single_device strategy).
//   --bad-id K (model blocks): one input id is K (outside the 40-row vocabulary when K < 0 or
//   K >= 40).
// restored: 1 the module left predict whole and unchanged, 2 whole with bfloat16-rounded values.
//
// Exit: 0 done, 1 a volt error (printed on one line), 2 bad usage.

#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <string>

#include "models.h"
#include "tiny.h"
#include "volt/nn/kernel_injection.h"
#include "volt/strategies/deepspeed.h"

namespace {

/// Token ids -> logits through an embedding and two blocks, the shape DeepSpeed's
/// injection_policy is written for ({Block: ("l2")}: l2's outputs are summed).
struct BlockImpl : torch::nn::Module {
  BlockImpl() : torch::nn::Module("Block") {
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({32})));
    l1 = register_module("l1", torch::nn::Linear(32, 64));
    l2 = register_module("l2", torch::nn::Linear(64, 32));
  }
  torch::Tensor forward(torch::Tensor x) {
    return x + l2->forward(torch::gelu(l1->forward(norm->forward(x))));
  }
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear l1{nullptr}, l2{nullptr};
};
TORCH_MODULE(Block);

/// Sequential layers, the form kernel injection recognises: Linear+GELU and Linear+ReLU pairs.
struct SeqMlp : torch::nn::Module {
  static constexpr const char* kName = "SeqMlp";
  SeqMlp() {
    body =
        register_module("body", torch::nn::Sequential(torch::nn::Linear(784, 64), torch::nn::GELU(),
                                                      torch::nn::Linear(64, 48), torch::nn::ReLU(),
                                                      torch::nn::Linear(48, 10)));
  }
  torch::Tensor forward(torch::Tensor x) { return body->forward(x.reshape({x.size(0), -1})); }
  torch::nn::Sequential body{nullptr};
};

/// Image rows as tokens through two libtorch TransformerEncoderLayers held by a Sequential.
struct EncoderNet : torch::nn::Module {
  static constexpr const char* kName = "EncoderNet";
  EncoderNet() {
    embed = register_module("embed", torch::nn::Linear(28, 32));
    auto layer = [] {
      return torch::nn::TransformerEncoderLayer(
          torch::nn::TransformerEncoderLayerOptions(32, 4).dim_feedforward(64).activation(
              torch::kGELU));
    };
    layers = register_module("layers", torch::nn::Sequential(layer(), layer()));
    head = register_module("head", torch::nn::Linear(32, 5));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = embed->forward(x.reshape({x.size(0), 28, 28}).transpose(0, 1));  // [seq, batch, 32]
    return head->forward(layers->forward(x).mean(0));
  }
  torch::nn::Linear embed{nullptr}, head{nullptr};
  torch::nn::Sequential layers{nullptr};
};

struct BlocksNet : torch::nn::Module {
  static constexpr const char* kName = "BlocksNet";
  BlocksNet() {
    embed = register_module("embed", torch::nn::Embedding(40, 32));
    blocks = register_module("blocks", torch::nn::Sequential(Block(), Block()));
    head = register_module("head", torch::nn::Linear(32, 5));
  }
  torch::Tensor forward(torch::Tensor ids) {
    return head->forward(blocks->forward(embed->forward(ids)).mean(1));
  }
  torch::nn::Embedding embed{nullptr};
  torch::nn::Sequential blocks{nullptr};
  torch::nn::Linear head{nullptr};
};

template <typename Net>
class Infer : public volt::Module {
 public:
  explicit Infer(std::shared_ptr<Net> net) : net_(register_module("net", std::move(net))) {}
  torch::Tensor training_step(const volt::Batch& b, int64_t) override {
    return net_->forward(b.input).pow(2).mean();
  }
  void validation_step(const volt::Batch& b, int64_t) override {
    log("val_out", net_->forward(b.input).to(torch::kFloat).pow(2).mean());
  }
  torch::Tensor predict_step(const volt::Batch& b, int64_t) override {
    if (probe) probe();
    return net_->forward(b.input);
  }
  std::function<void()> probe;  // runs at every predict batch (the engine's figures mid-run)
  std::vector<volt::OptimizerConfig> configure_optimizers() override {
    return {volt::OptimizerConfig(
        std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1)))};
  }

 private:
  std::shared_ptr<Net> net_;
};

torch::Tensor flat(torch::nn::Module& m) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : m.parameters()) parts.push_back(p.detach().to(torch::kFloat).reshape(-1));
  return torch::cat(parts);
}

template <typename Net>
int run(std::map<std::string, std::string>& a, std::shared_ptr<Net> net, torch::Tensor inputs,
        volt::TensorParallelOptions tp, std::string json) {
  auto num = [&](const char* k, int64_t def) { return a.count(k) ? std::stoll(a[k]) : def; };
  Infer<Net> model(net);
  const torch::Tensor before = flat(model);
  const int64_t devices = num("--devices", 2);
  auto accelerator = volt::registry().accelerators.create("cpu");
  auto precision = volt::registry().precisions.create("32-true");
  volt::DeepSpeedStrategyOptions o;
  o.zero_optimization(false)
      .tensor_parallel(tp)
      .dtype(a.count("--dtype") ? a["--dtype"] : "float32")
      .replace_with_kernel_inject(num("--kernel-inject", 0) != 0)
      .config(json)
      .timeout_s(static_cast<double>(num("--timeout", 120)));
  std::shared_ptr<volt::DeepSpeedStrategy> strategy;
  const bool one =
      devices == 1 && tp.tp_size() == 1 && json.empty() && !o.replace_with_kernel_inject();
  if (!one) {
    strategy = std::make_shared<volt::DeepSpeedStrategy>(o, accelerator, precision, devices);
  }
  volt::Trainer trainer(volt_test::quiet(a["--root"])
                            .accelerator("cpu")
                            .strategy(one ? volt::Spec<volt::Strategy>("single_device")
                                          : volt::Spec<volt::Strategy>(strategy))
                            .devices(devices)
                            .max_epochs(1));
  auto targets = torch::zeros({inputs.size(0)}, torch::kLong);
  volt::DataLoader loader(std::make_shared<volt::TensorDataset>(inputs, targets),
                          volt::DataLoaderOptions(8));
  if (a.count("--shard")) {  // "g/n": the reference for data-parallel group g of n
    const std::string sh = a["--shard"];
    loader = loader.sharded(std::stoll(sh.substr(0, sh.find('/'))),
                            std::stoll(sh.substr(sh.find('/') + 1)));
  }
  std::filesystem::create_directories(std::filesystem::path(a["--out"]).parent_path());
  if (a.count("--stage") && a["--stage"] == "fit") {
    trainer.fit(model, loader);
    return 0;
  }
  if (a.count("--stage") && a["--stage"] == "validate") {
    const volt::Metrics m = trainer.validate(model, loader);
    std::printf("rank %lld validated val_out=%.17g\n",
                static_cast<long long>(trainer.strategy().rank()), m.at("val_out"));
    std::fflush(stdout);
    return 0;
  }
  int64_t param_bytes = 0, full_bytes = 0, layers = 0, injected = 0;
  model.probe = [&] {
    if (strategy != nullptr && strategy->kernel_injection() != nullptr) {
      injected = static_cast<int64_t>(strategy->kernel_injection()->replaced().size());
    }
    if (strategy == nullptr || strategy->tensor_parallel_engine() == nullptr) return;
    const volt::TensorParallelEngine& e = *strategy->tensor_parallel_engine();
    param_bytes = e.parameter_bytes();
    full_bytes = e.full_parameter_bytes();
    layers = static_cast<int64_t>(e.layers().size());
  };
  auto preds = trainer.predict(model, loader);
  const int64_t rank = trainer.strategy().rank();
  std::vector<torch::Tensor> outs;
  for (auto& p : preds) outs.push_back(p.to(torch::kFloat));
  torch::save(torch::cat(outs), a["--out"] + ".rank" + std::to_string(rank) + ".pt");
  // 1: whole and unchanged; 2: whole, values rounded to bfloat16 (a dtype=bfloat16 run casts the
  // module for the run and back after it).
  const torch::Tensor after = flat(model);
  const int restored = torch::equal(after, before)                                          ? 1
                       : torch::equal(after, before.to(torch::kBFloat16).to(torch::kFloat)) ? 2
                                                                                            : 0;
  std::printf(
      "rank %lld done param_bytes=%lld full_bytes=%lld layers=%lld injected=%lld restored=%d\n",
      static_cast<long long>(rank), static_cast<long long>(param_bytes),
      static_cast<long long>(full_bytes), static_cast<long long>(layers),
      static_cast<long long>(injected), restored);
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> a;
  for (int i = 1; i + 1 < argc; i += 2) a[argv[i]] = argv[i + 1];
  auto num = [&](const char* k, int64_t def) { return a.count(k) ? std::stoll(a[k]) : def; };
  if (!a.count("--root") || !a.count("--out") || !a.count("--model")) {
    std::fprintf(stderr, "usage: volt_tp_worker --root DIR --out PREFIX --model NAME ...\n");
    return 2;
  }
  try {
    const std::string model = a["--model"];
    const std::string form = a.count("--form") ? a["--form"] : "plan";
    volt::TensorParallelOptions tp;
    tp.tp_size(num("--tp", 1)).num_heads(num("--heads", 0));
    std::string json;
    torch::manual_seed(0);  // the same weights in every process
    if (model == "mlp") {
      auto net = std::make_shared<volt_examples::MlpNet>(std::vector<int64_t>{64, 48});
      if (form == "plan") tp.plan(volt::parse_tp_plan({"fc0=colwise", "fc1=rowwise"}));
      if (form == "policy") tp.injection_policy(volt::parse_injection_policy({"net: fc1"}));
      auto x = torch::randn({20, 1, 28, 28});
      if (form == "policy") {
        // "net" (a path) matches the whole MlpNet: out would be split too; keep it whole.
        tp.plan(volt::parse_tp_plan({"out=replicated"}));
      }
      return run(a, net, x, tp, json);
    }
    if (model == "transformer") {
      auto net = std::make_shared<volt_examples::TransformerNet>(64, 4, 2);
      if (form == "plan") {
        tp.plan(volt::parse_tp_plan(
            {"qkv_*=colwise_qkv", "proj_*=rowwise", "fc1_*=colwise", "fc2_*=rowwise"}));
      }
      auto x = torch::randn({20, 1, 28, 28});
      return run(a, net, x, tp, json);
    }
    if (model == "seqmlp") {
      auto net = std::make_shared<SeqMlp>();
      if (form == "plan") tp.plan(volt::parse_tp_plan({"body.0=colwise", "body.2=rowwise"}));
      return run(a, net, torch::randn({20, 1, 28, 28}), tp, json);
    }
    if (model == "encoder") {
      auto net = std::make_shared<EncoderNet>();
      if (form == "plan") tp.plan(volt::parse_tp_plan({"linear1=colwise", "linear2=rowwise"}));
      return run(a, net, torch::randn({20, 1, 28, 28}), tp, json);
    }
    if (model == "blocks") {
      auto net = std::make_shared<BlocksNet>();
      if (form == "plan") {
        tp.plan(volt::parse_tp_plan({"embed=rowwise", "blocks.*.l1=colwise", "l2=rowwise"}));
      } else if (form == "policy") {
        tp.injection_policy(volt::parse_injection_policy({"Block: l2"}));
        tp.plan(volt::parse_tp_plan({"embed=rowwise"}));
      } else if (form == "json") {
        json = "{\"tensor_parallel\": {\"tp_size\": " + std::to_string(num("--tp", 1)) +
               ", \"plan\": {\"embed\": \"rowwise\"}}, \"dtype\": \"torch.float\", "
               "\"injection_policy\": {\"Block\": [\"l2\"]}, \"replace_with_kernel_inject\": "
               "false, \"enable_cuda_graph\": false, \"replace_method\": \"auto\"}";
        tp.tp_size(1);
      }
      auto ids = torch::randint(0, 40, {20, 6}, torch::kLong);
      if (a.count("--bad-id"))
        ids[3][2] = static_cast<int64_t>(std::stoll(a["--bad-id"]));  // outside the vocabulary
      return run(a, net, ids, tp, json);
    }
    std::fprintf(stderr, "volt_tp_worker: unknown --model %s\n", model.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::printf("error: %s\n", e.what());
    std::fflush(stdout);
    return 1;
  }
}
