// Inference of a model too big for one rank's memory, two ways under DeepSpeedStrategy: tensor
// parallelism (tensor_parallel: each rank keeps a slice of every layer and computes with it) and
// ZeRO-Inference (stage 3 without an optimizer: each rank keeps its chunks of every weight and
// gathers a layer's weights while it runs; at one rank the chunks can live in an NVMe file).
// Per-rank weight bytes between batches and the median forward time against one process, for a
// wide MLP (two column/row pairs) and the demo TransformerNet (heads, attention output and MLP
// split). Each configuration is one Trainer predict; the strategy launches the ranks (this
// binary re-executed) over Gloo on loopback.
//
//   volt_bench_tensor_parallel [--layout single|tp|zero3|zero3_nvme] [--ranks N]
//                              [--model mlp|transformer] [--batches B]
//   (without --layout: runs single, tp at 2, zero3 at 2 and zero3_nvme at 1 for both models,
//   one child process each, and prints a table)

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "host_memory.h"
#include "models.h"
#include "remove_dir.h"
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
void run(std::shared_ptr<Net> net, torch::Tensor x, const std::string& layout, int64_t ranks,
         volt::TpPlan plan) {
  Timed<Net> model(net);
  auto accelerator = volt::registry().accelerators.create("cpu");
  auto precision = volt::registry().precisions.create("32-true");
  std::shared_ptr<volt::DeepSpeedStrategy> strategy;
  const std::string nvme = std::filesystem::temp_directory_path() / "volt_bench_zero_inference";
  if (layout == "tp") {
    strategy = std::make_shared<volt::DeepSpeedStrategy>(
        volt::DeepSpeedStrategyOptions().zero_optimization(false).tensor_parallel(
            volt::TensorParallelOptions().tp_size(ranks).plan(plan)),
        accelerator, precision, ranks);
  } else if (layout == "zero3" || layout == "zero3_nvme") {
    auto options = volt::DeepSpeedStrategyOptions().stage(3);
    if (layout == "zero3_nvme") {
      std::filesystem::create_directories(nvme);
      options.offload_parameters(true).offload_parameters_device("nvme").nvme_path(nvme);
    }
    strategy = std::make_shared<volt::DeepSpeedStrategy>(options, accelerator, precision, ranks);
  }
  volt::Trainer trainer(volt::TrainerOptions()
                            .accelerator("cpu")
                            .strategy(strategy ? volt::Spec<volt::Strategy>(strategy)
                                               : volt::Spec<volt::Strategy>("single_device"))
                            .devices(ranks)
                            .enable_progress_bar(false)
                            .enable_checkpointing(false)
                            .logger(false));
  int64_t bytes = 0, full = 0;
  for (const auto& p : model.parameters()) full += p.numel() * p.element_size();
  bytes = full;
  // Read before each forward: ZeRO has released the previous batch's gathered weights then.
  model.probe = [&] {
    if (!strategy) return;
    if (strategy->tensor_parallel_engine()) {
      bytes = strategy->tensor_parallel_engine()->parameter_bytes();
    } else if (const volt::ZeroEngine* e = strategy->inference_engine(model)) {
      bytes = e->memory().parameters;  // chunks in memory (none in the NVMe file) + small ones
    }
  };
  auto y = torch::zeros({x.size(0)}, torch::kLong);
  volt::DataLoader loader(std::make_shared<volt::TensorDataset>(x, y), volt::DataLoaderOptions(32));
  trainer.predict(model, loader);
  std::vector<double> ms(model.ms.begin() + 2, model.ms.end());  // two warm-up batches
  std::sort(ms.begin(), ms.end());
  if (trainer.strategy().rank() == 0) {
    std::printf(
        "RESULT model=%s layout=%s ranks=%lld weight_bytes_rank=%lld full_bytes=%lld "
        "median_ms=%.3f batches=%zu\n",
        Net::kName, layout.c_str(), static_cast<long long>(ranks), static_cast<long long>(bytes),
        static_cast<long long>(full), ms[ms.size() / 2], ms.size());
    std::fflush(stdout);
  }
  if (layout == "zero3_nvme" && trainer.strategy().rank() == 0) {
    volt_bench::remove_dir(nvme);
  }
}

}  // namespace

int main(int argc, char** argv) {
  volt_bench::same_host_malloc_for_every_contender();
  std::map<std::string, std::string> a;
  for (int i = 1; i + 1 < argc; i += 2) a[argv[i]] = argv[i + 1];
  const int64_t batches = a.count("--batches") ? std::stoll(a["--batches"]) : 22;
  if (!a.count("--layout")) {
    std::printf(
        "| model | layout | ranks | weight bytes / rank | of whole | median forward ms (batch "
        "32) |\n|---|---|---|---|---|---|\n");
    const std::vector<std::pair<std::string, int>> layouts{
        {"single", 1}, {"tp", 2}, {"zero3", 2}, {"zero3_nvme", 1}};
    for (const char* model : {"mlp", "transformer"}) {
      for (const auto& [layout, ranks] : layouts) {
        const std::string cmd = std::string(argv[0]) + " --layout " + layout + " --ranks " +
                                std::to_string(ranks) + " --model " + model + " --batches " +
                                std::to_string(batches) + " 2>/dev/null | grep RESULT";
        std::FILE* f = popen(cmd.c_str(), "r");
        char line[512];
        while (f && std::fgets(line, sizeof line, f)) {
          char name[64], how[64];
          long long r, b, full;
          double med;
          if (std::sscanf(line,
                          "RESULT model=%63s layout=%63s ranks=%lld weight_bytes_rank=%lld "
                          "full_bytes=%lld median_ms=%lf",
                          name, how, &r, &b, &full, &med) == 6) {
            std::printf("| %s | %s | %lld | %lld | %.3f | %.3f |\n", name, how, r, b,
                        static_cast<double>(b) / static_cast<double>(full), med);
          }
        }
        if (f) pclose(f);
      }
    }
    return 0;
  }
  const std::string layout = a["--layout"];
  const int64_t ranks = a.count("--ranks") ? std::stoll(a["--ranks"]) : 1;
  torch::manual_seed(0);
  if (a["--model"] == "mlp") {
    run(std::make_shared<WideMlp>(), torch::randn({32 * batches, 1024}), layout, ranks,
        volt::parse_tp_plan({"up*=colwise", "down*=rowwise"}));
  } else {
    run(std::make_shared<volt_examples::TransformerNet>(256, 8, 4),
        torch::randn({32 * batches, 1, 28, 28}), layout, ranks,
        volt::parse_tp_plan(
            {"qkv_*=colwise_qkv", "proj_*=rowwise", "fc1_*=colwise", "fc2_*=rowwise"}));
  }
  return 0;
}
