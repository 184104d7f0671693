// Tensor-parallel inference (DeepSpeedStrategy tensor_parallel): per-rank weight bytes and
// predict latency against one process, for a wide MLP (two column/row pairs) and the demo
// TransformerNet (heads, attention output and MLP split). Each configuration is one Trainer
// predict; the strategy launches the ranks (this binary re-executed) over Gloo on loopback.
//
//   volt_bench_tensor_parallel [--tp N] [--model mlp|transformer] [--batches B]
//   (without --tp: runs tp = 1, 2 for both models, one child process each, and prints a table)

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "host_memory.h"
#include "models.h"
#include "volt/strategies/deepspeed.h"

namespace {

struct WideMlp : torch::nn::Module {
  static constexpr const char* kName = "WideMlp";
  WideMlp() {
    up1 = register_module("up1", torch::nn::Linear(1024, 4096));
    down1 = register_module("down1", torch::nn::Linear(4096, 1024));
    up2 = register_module("up2", torch::nn::Linear(1024, 4096));
    down2 = register_module("down2", torch::nn::Linear(4096, 1024));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = x + down1->forward(torch::gelu(up1->forward(x)));
    return x + down2->forward(torch::gelu(up2->forward(x)));
  }
  torch::nn::Linear up1{nullptr}, down1{nullptr}, up2{nullptr}, down2{nullptr};
};

template <typename Net>
class Timed : public volt::Module {
 public:
  explicit Timed(std::shared_ptr<Net> net) : net_(register_module("net", std::move(net))) {}
  torch::Tensor training_step(const volt::Batch& b, int64_t) override { return {}; }
  std::vector<volt::OptimizerConfig> configure_optimizers() override { return {}; }
  torch::Tensor predict_step(const volt::Batch& b, int64_t) override {
    if (probe) probe();
    const auto t0 = std::chrono::steady_clock::now();
    auto y = net_->forward(b.input);
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    return y.sum().reshape({1});
  }
  std::vector<double> ms;
  std::function<void()> probe;

 private:
  std::shared_ptr<Net> net_;
};

template <typename Net>
void run(std::shared_ptr<Net> net, torch::Tensor x, int64_t tp, volt::TpPlan plan) {
  Timed<Net> model(net);
  auto accelerator = volt::registry().accelerators.create("cpu");
  auto precision = volt::registry().precisions.create("32-true");
  std::shared_ptr<volt::DeepSpeedStrategy> strategy;
  if (tp > 1) {
    strategy = std::make_shared<volt::DeepSpeedStrategy>(
        volt::DeepSpeedStrategyOptions().zero_optimization(false).tensor_parallel(
            volt::TensorParallelOptions().tp_size(tp).plan(plan)),
        accelerator, precision, tp);
  }
  volt::Trainer trainer(volt::TrainerOptions()
                            .accelerator("cpu")
                            .strategy(tp > 1 ? volt::Spec<volt::Strategy>(strategy)
                                             : volt::Spec<volt::Strategy>("single_device"))
                            .devices(tp)
                            .enable_progress_bar(false)
                            .enable_checkpointing(false)
                            .logger(false));
  int64_t bytes = 0, full = 0;
  for (const auto& p : model.parameters()) full += p.numel() * p.element_size();
  bytes = full;
  model.probe = [&] {
    if (strategy && strategy->tensor_parallel_engine()) {
      bytes = strategy->tensor_parallel_engine()->parameter_bytes();
    }
  };
  auto y = torch::zeros({x.size(0)}, torch::kLong);
  volt::DataLoader loader(std::make_shared<volt::TensorDataset>(x, y), volt::DataLoaderOptions(32));
  trainer.predict(model, loader);
  std::vector<double> ms(model.ms.begin() + 2, model.ms.end());  // two warm-up batches
  std::sort(ms.begin(), ms.end());
  if (trainer.strategy().rank() == 0) {
    std::printf(
        "RESULT model=%s tp=%lld weight_bytes_rank=%lld full_bytes=%lld median_ms=%.3f "
        "batches=%zu\n",
        Net::kName, static_cast<long long>(tp), static_cast<long long>(bytes),
        static_cast<long long>(full), ms[ms.size() / 2], ms.size());
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  volt_bench::same_host_malloc_for_every_contender();
  std::map<std::string, std::string> a;
  for (int i = 1; i + 1 < argc; i += 2) a[argv[i]] = argv[i + 1];
  const int64_t batches = a.count("--batches") ? std::stoll(a["--batches"]) : 22;
  if (!a.count("--tp")) {
    std::printf(
        "| model | tp | weight bytes / rank | of whole | median forward ms (batch 32) |\n"
        "|---|---|---|---|---|\n");
    for (const char* model : {"mlp", "transformer"}) {
      for (int tp : {1, 2}) {
        const std::string cmd = std::string(argv[0]) + " --tp " + std::to_string(tp) + " --model " +
                                model + " --batches " + std::to_string(batches) +
                                " 2>/dev/null | grep RESULT";
        std::FILE* f = popen(cmd.c_str(), "r");
        char line[512];
        while (f && std::fgets(line, sizeof line, f)) {
          char name[64];
          long long t, b, full;
          double med;
          if (std::sscanf(line,
                          "RESULT model=%63s tp=%lld weight_bytes_rank=%lld full_bytes=%lld "
                          "median_ms=%lf",
                          name, &t, &b, &full, &med) == 5) {
            std::printf("| %s | %lld | %lld | %.3f | %.3f |\n", name, t, b,
                        static_cast<double>(b) / static_cast<double>(full), med);
          }
        }
        if (f) pclose(f);
      }
    }
    return 0;
  }
  const int64_t tp = std::stoll(a["--tp"]);
  torch::manual_seed(0);
  if (a["--model"] == "mlp") {
    run(std::make_shared<WideMlp>(), torch::randn({32 * batches, 1024}), tp,
        volt::parse_tp_plan({"up*=colwise", "down*=rowwise"}));
  } else {
    run(std::make_shared<volt_examples::TransformerNet>(256, 8, 4),
        torch::randn({32 * batches, 1, 28, 28}), tp,
        volt::parse_tp_plan(
            {"qkv_*=colwise_qkv", "proj_*=rowwise", "fc1_*=colwise", "fc2_*=rowwise"}));
  }
  return 0;
}
