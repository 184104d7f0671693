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
//
// Training (ModelParallelStrategy beside one process and DDP): steps per second at the same
// global batch of 32, and what each rank holds (parameter bytes, AdamW state bytes, the peak of
// live tensor bytes during a step on volt's counting allocator: parameters, gradients, state,
// activations; the data set is made first and not counted), one Trainer fit per row.
//
//   volt_bench_tensor_parallel --table train [--steps N]
//   volt_bench_tensor_parallel --train single|ddp|model_parallel --ranks N --model mlp|transformer
//                              [--steps N]
//
// Saving a checkpoint under ModelParallelStrategy at 2 ranks (WideMlp and AdamW after 2 steps):
// a folder of each rank's shards (save_distributed_checkpoint, the default) against one file
// gathered on rank 0: rank 0's save time (the Trainer's save_checkpoint, barriers included; 5
// saves, the median), the tensor bytes the save allocates above what rank 0 held before it (the
// counting allocator's peak), and the bytes rank 0 writes.
//
//   volt_bench_tensor_parallel --table save
//   volt_bench_tensor_parallel --save folder|file --dir DIR

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "bench_trainer.h"
#include "host_memory.h"
#include "models.h"
#include "remove_dir.h"
#include "volt/accelerators/cpu_memory.h"
#include "volt/strategies/deepspeed.h"
#include "volt/strategies/model_parallel.h"

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

// The lines a child run of this binary (`args`) prints, its stderr dropped.
std::vector<std::string> child_lines(const char* self, const std::string& args) {
  const std::string cmd = std::string(self) + " " + args + " 2>/dev/null | grep RESULT";
  std::vector<std::string> out;
  std::FILE* f = popen(cmd.c_str(), "r");
  char line[512];
  while (f && std::fgets(line, sizeof line, f)) out.emplace_back(line);
  if (f) pclose(f);
  return out;
}

// ---------------------------------------------------------------------------- training

// The net trained with AdamW: WideMlp regresses a random target (MSE), TransformerNet classifies.
template <typename Net>
class Trained : public volt::Module {
 public:
  explicit Trained(std::shared_ptr<Net> net) : net_(register_module("net", std::move(net))) {}
  torch::Tensor training_step(const volt::Batch& b, int64_t) override {
    const auto y = net_->forward(b.input);
    return b.target.dim() > 1 ? torch::mse_loss(y, b.target)
                              : torch::cross_entropy_loss(y, b.target);
  }
  std::vector<volt::OptimizerConfig> configure_optimizers() override {
    optimizer =
        std::make_shared<torch::optim::AdamW>(parameters(), torch::optim::AdamWOptions(1e-4));
    return {volt::OptimizerConfig(optimizer)};
  }
  std::shared_ptr<torch::optim::AdamW> optimizer;

 private:
  std::shared_ptr<Net> net_;
};

// Times the steps after the warm-up ones; reads what this rank holds.
template <typename Net>
class TrainProbe : public volt::Callback {
 public:
  TrainProbe(Trained<Net>& m, int64_t warmup) : m_(m), warmup_(warmup) {}
  std::string state_key() const override { return "TrainProbe"; }
  void on_train_start(volt::RunContext& run, volt::Module&) override {
    for (const auto& p : m_.parameters()) held_bytes += p.numel() * p.element_size();
    rank = run.global_rank();
  }
  void on_train_batch_start(volt::RunContext&, volt::Module&, const volt::Batch&,
                            int64_t idx) override {
    if (idx == warmup_) t0 = std::chrono::steady_clock::now();
    if (idx >= warmup_) volt::reset_cpu_memory_peaks();
  }
  void on_train_batch_end(volt::RunContext&, volt::Module&, const volt::Batch&,
                          int64_t idx) override {
    t1 = std::chrono::steady_clock::now();
    steps = idx + 1 - warmup_;
    if (idx >= warmup_) peak_bytes = std::max(peak_bytes, volt::cpu_memory_stats().max_in_use);
    if (state_bytes == 0) {
      for (const auto& kv : m_.optimizer->state()) {
        const auto& st = static_cast<const torch::optim::AdamWParamState&>(*kv.second);
        state_bytes += (st.exp_avg().numel() + st.exp_avg_sq().numel()) * 4;
      }
    }
  }
  std::chrono::steady_clock::time_point t0, t1;
  int64_t steps = 0, held_bytes = 0, state_bytes = 0, peak_bytes = 0, rank = 0;

 private:
  Trained<Net>& m_;
  int64_t warmup_;
};

template <typename Net>
void train(std::shared_ptr<Net> net, torch::Tensor x, torch::Tensor y, const std::string& layout,
           int64_t ranks, int64_t steps, volt::TpPlan plan) {
  Trained<Net> model(net);
  const int64_t warmup = 3, global_batch = 32;
  auto probe = std::make_shared<TrainProbe<Net>>(model, warmup);
  auto accelerator = volt::registry().accelerators.create("cpu");
  auto precision = volt::registry().precisions.create("32-true");
  volt::Spec<volt::Strategy> strategy("single_device");
  int64_t batch = global_batch;
  if (layout == "model_parallel") {
    strategy = volt::Spec<volt::Strategy>(std::make_shared<volt::ModelParallelStrategy>(
        volt::ModelParallelStrategyOptions().tensor_parallel_size(ranks).plan(plan), accelerator,
        precision, ranks));
  } else if (layout == "ddp") {
    strategy = volt::Spec<volt::Strategy>("ddp");
    batch = global_batch / ranks;  // each rank its shard of the global batch
  }
  volt::Trainer trainer(volt_bench::bench_trainer("cpu", warmup + steps)
                            .strategy(strategy)
                            .devices(ranks)
                            .callbacks({probe}));
  trainer.fit(model, volt::DataLoader(std::make_shared<volt::TensorDataset>(x, y),
                                      volt::DataLoaderOptions(batch)));
  if (probe->rank != 0) return;
  const double s = std::chrono::duration<double>(probe->t1 - probe->t0).count();
  std::printf(
      "RESULT model=%s layout=%s ranks=%lld steps_per_s=%.3f held_bytes=%lld state_bytes=%lld "
      "peak_bytes=%lld\n",
      Net::kName, layout.c_str(), static_cast<long long>(ranks),
      static_cast<double>(probe->steps) / s, static_cast<long long>(probe->held_bytes),
      static_cast<long long>(probe->state_bytes), static_cast<long long>(probe->peak_bytes));
  std::fflush(stdout);
}

// After the last training step: 5 saves, timed, with the allocation peak above the bytes held.
class SaveProbe : public volt::Callback {
 public:
  SaveProbe(std::string path, int64_t at) : path_(std::move(path)), at_(at) {}
  std::string state_key() const override { return "SaveProbe"; }
  void on_train_batch_end(volt::RunContext& run, volt::Module&, const volt::Batch&,
                          int64_t idx) override {
    if (idx + 1 != at_) return;
    rank = run.global_rank();
    for (int i = 0; i < 5; ++i) {
      const int64_t before = volt::cpu_memory_stats().in_use;
      volt::reset_cpu_memory_peaks();
      const auto t0 = std::chrono::steady_clock::now();
      run.save_checkpoint(path_);
      seconds.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      extra_bytes = std::max(extra_bytes, volt::cpu_memory_stats().max_in_use - before);
    }
  }
  std::vector<double> seconds;
  int64_t extra_bytes = 0, rank = 0;

 private:
  std::string path_;
  int64_t at_;
};

// Bytes of the regular files at `path` (a file, or a folder's files) that rank 0 wrote: a folder's
// shard of tensor-parallel rank 0 and its metadata.
int64_t rank0_bytes(const std::string& path) {
  namespace fs = std::filesystem;
  if (fs::is_regular_file(path)) return static_cast<int64_t>(fs::file_size(path));
  int64_t total = 0;
  for (const auto& e : fs::directory_iterator(path)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("tp_rank_0_", 0) == 0 || name == "model_parallel_checkpoint.txt") {
      total += static_cast<int64_t>(e.file_size());
    }
  }
  return total;
}

void save(const std::string& how, const std::string& dir, const torch::Tensor& x,
          const torch::Tensor& y) {
  Trained<WideMlp> model(std::make_shared<WideMlp>());
  auto probe = std::make_shared<SaveProbe>(dir + "/" + how + ".ckpt", 2);
  auto accelerator = volt::registry().accelerators.create("cpu");
  auto precision = volt::registry().precisions.create("32-true");
  auto strategy = std::make_shared<volt::ModelParallelStrategy>(
      volt::ModelParallelStrategyOptions()
          .tensor_parallel_size(2)
          .plan(volt::parse_tp_plan({"*up*=colwise", "*down*=rowwise"}))
          .save_distributed_checkpoint(how == "folder"),
      accelerator, precision, 2);
  volt::Trainer trainer(volt_bench::bench_trainer("cpu", 2)
                            .strategy(volt::Spec<volt::Strategy>(strategy))
                            .devices(2)
                            .callbacks({probe}));
  trainer.fit(model, volt::DataLoader(std::make_shared<volt::TensorDataset>(x, y),
                                      volt::DataLoaderOptions(32)));
  if (probe->rank != 0) return;
  std::sort(probe->seconds.begin(), probe->seconds.end());
  const int64_t written = rank0_bytes(dir + "/" + how + ".ckpt");
  volt_bench::remove_dir(dir);
  std::printf("RESULT how=%s median_s=%.4f extra_bytes=%lld written_bytes=%lld\n", how.c_str(),
              probe->seconds[probe->seconds.size() / 2], static_cast<long long>(probe->extra_bytes),
              static_cast<long long>(written));
  std::fflush(stdout);
}

volt::TpPlan mlp_plan() {
  return volt::parse_tp_plan({"*up*=colwise", "*down*=rowwise"});
}
volt::TpPlan transformer_plan() {
  return volt::parse_tp_plan(
      {"*qkv_*=colwise_qkv", "*proj_*=rowwise", "*fc1_*=colwise", "*fc2_*=rowwise"});
}

void train_table(const char* self, int64_t steps) {
  std::printf(
      "| model | layout | ranks | steps/s (global batch 32) | parameter bytes / rank | AdamW "
      "state bytes / rank | peak live bytes / rank |\n|---|---|---|---|---|---|---|\n");
  const std::vector<std::pair<std::string, int>> layouts{
      {"single", 1}, {"ddp", 2}, {"model_parallel", 2}};
  for (const char* model : {"mlp", "transformer"}) {
    for (const auto& [layout, ranks] : layouts) {
      for (const auto& line :
           child_lines(self, "--train " + layout + " --ranks " + std::to_string(ranks) +
                                 " --model " + model + " --steps " + std::to_string(steps))) {
        char name[64], how[64];
        long long r, held, state, peak;
        double sps;
        if (std::sscanf(line.c_str(),
                        "RESULT model=%63s layout=%63s ranks=%lld steps_per_s=%lf held_bytes=%lld "
                        "state_bytes=%lld peak_bytes=%lld",
                        name, how, &r, &sps, &held, &state, &peak) == 7) {
          std::printf("| %s | %s | %lld | %.2f | %lld | %lld | %lld |\n", name, how, r, sps, held,
                      state, peak);
        }
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  volt_bench::same_host_malloc_for_every_contender();
  std::map<std::string, std::string> a;
  for (int i = 1; i + 1 < argc; i += 2) a[argv[i]] = argv[i + 1];
  const int64_t batches = a.count("--batches") ? std::stoll(a["--batches"]) : 22;
  const int64_t steps = a.count("--steps") ? std::stoll(a["--steps"]) : 20;
  if (a.count("--table") && a["--table"] == "train") {
    train_table(argv[0], steps);
    return 0;
  }
  if (a.count("--table") && a["--table"] == "save") {
    std::printf(
        "| checkpoint | rank 0's save, median s | tensor bytes the save allocates on rank 0 | "
        "bytes rank 0 writes |\n|---|---|---|---|\n");
    for (const char* how : {"folder", "file"}) {
      const std::string dir = "/tmp/volt_bench_tp_save_" + std::to_string(::getpid());
      for (const auto& line :
           child_lines(argv[0], std::string("--save ") + how + " --dir " + dir)) {
        char name[64];
        double med;
        long long extra, written;
        if (std::sscanf(line.c_str(),
                        "RESULT how=%63s median_s=%lf extra_bytes=%lld written_bytes=%lld", name,
                        &med, &extra, &written) == 4) {
          std::printf("| %s | %.3f | %lld | %lld |\n", name, med, extra, written);
        }
      }
    }
    return 0;
  }
  if (a.count("--save")) {
    torch::manual_seed(0);
    const auto x = torch::randn({64, 1024}), y = torch::randn({64, 1024});
    volt::install_counting_cpu_allocator();
    save(a["--save"], a["--dir"], x, y);
    return 0;
  }
  if (a.count("--train")) {
    const int64_t ranks = a.count("--ranks") ? std::stoll(a["--ranks"]) : 1;
    const int64_t rows = 32 * (steps + 3);
    torch::manual_seed(0);
    const bool mlp = a["--model"] == "mlp";
    const auto x = mlp ? torch::randn({rows, 1024}) : torch::randn({rows, 1, 28, 28});
    const auto y = mlp ? torch::randn({rows, 1024}) : torch::randint(0, 10, {rows});
    // After the data, before the model: its parameters count in the peak, the data set not.
    volt::install_counting_cpu_allocator();
    if (mlp) {
      train(std::make_shared<WideMlp>(), x, y, a["--train"], ranks, steps, mlp_plan());
    } else {
      train(std::make_shared<volt_examples::TransformerNet>(256, 8, 4), x, y, a["--train"], ranks,
            steps, transformer_plan());
    }
    return 0;
  }
  if (!a.count("--layout")) {
    std::printf(
        "| model | layout | ranks | weight bytes / rank | of whole | median forward ms (batch "
        "32) |\n|---|---|---|---|---|---|\n");
    const std::vector<std::pair<std::string, int>> layouts{
        {"single", 1}, {"tp", 2}, {"zero3", 2}, {"zero3_nvme", 1}};
    for (const char* model : {"mlp", "transformer"}) {
      for (const auto& [layout, ranks] : layouts) {
        for (const auto& line : child_lines(
                 argv[0], "--layout " + layout + " --ranks " + std::to_string(ranks) + " --model " +
                              model + " --batches " + std::to_string(batches))) {
          char name[64], how[64];
          long long r, b, full;
          double med;
          if (std::sscanf(line.c_str(),
                          "RESULT model=%63s layout=%63s ranks=%lld weight_bytes_rank=%lld "
                          "full_bytes=%lld median_ms=%lf",
                          name, how, &r, &b, &full, &med) == 6) {
            std::printf("| %s | %s | %lld | %lld | %.3f | %.3f |\n", name, how, r, b,
                        static_cast<double>(b) / static_cast<double>(full), med);
          }
        }
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
