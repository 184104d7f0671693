// Pipeline parallelism (PipelineStrategy): training steps per second and what each rank holds
// (parameters it trains, AdamW state, peak bytes of live tensors, and a step's own peak above
// what it started with: activations and temporaries) for an MLP of eight
// 1024×1024 layers in a volt::Pipeline, in one process and over 2 stages with 1-8
// micro-batches. Each configuration is one Trainer fit in a child process; the strategy
// launches the ranks (this binary re-executed) over Gloo on loopback.
//
//   volt_bench_pipeline [--stages S --chunks C [--checkpoint MODE]] [--steps N] [--batch B]
//   (without --stages: runs every configuration and prints a table)
//   volt_bench_pipeline --table checkpoint [--steps N] [--batch B]
//   (activation checkpointing: never / except_last / always / interval2 (runs of 2 layers:
//   a Linear and its GELU), one process and 2 stages)
//   volt_bench_pipeline --table batchnorm [--steps N] [--batch B]
//   (a BatchNorm1d after each Linear: `bn` = each micro-batch moves the running statistics,
//   `bn_deferred` = deferred_batch_norm, once per batch; 2 stages, 4 and 8 micro-batches)
//   volt_bench_pipeline --table schedule [--steps N] [--batch B]
//   (the head in the pipeline; `gpipe` = the loss from forward(), `1f1b` = from forward_loss(),
//   the 1F1B schedule; 2 stages, 4 and 8 micro-batches)
//   OPENBLAS_NUM_THREADS=1 volt_bench_pipeline --hand 1 --chunks C [--batch B]
//   (the layers in a hand-written loop, each phase timed; with plain cluster variables, e.g.
//   MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 WORLD_SIZE=2 NODE_RANK=0 LOCAL_RANK=r, one stage)

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "host_memory.h"
#include "volt/accelerators/cpu_memory.h"
#include "volt/nn/pipeline.h"
#include "volt/strategies/pipeline.h"
#include "volt/volt.h"

namespace {

using Clock = std::chrono::steady_clock;

// "never", "always", "except_last", or "intervalN" (activation_checkpoint_interval N); "bn" and
// "bn_deferred" (BatchNorm layers, without checkpointing) with deferred_batch_norm off / on;
// "gpipe" and "1f1b" (the head in the pipeline, the loss from forward() or forward_loss()).
bool schedule_mode(const std::string& mode) {
  return mode == "gpipe" || mode == "1f1b";
}

volt::PipelineOptions options(int64_t chunks, const std::string& checkpoint) {
  auto o = volt::PipelineOptions().chunks(chunks);
  if (schedule_mode(checkpoint)) return o;
  if (checkpoint.rfind("bn", 0) == 0) return o.deferred_batch_norm(checkpoint == "bn_deferred");
  if (checkpoint.rfind("interval", 0) == 0) {
    return o.activation_checkpoint_interval(std::stoll(checkpoint.substr(8)));
  }
  return o.checkpoint(checkpoint);
}

class DeepMlp : public volt::Module {
 public:
  DeepMlp(int64_t chunks, const std::string& checkpoint) : mode_(checkpoint) {
    torch::nn::Sequential layers;
    for (int i = 0; i < 8; ++i) {
      layers->push_back(torch::nn::Linear(1024, 1024));
      if (checkpoint.rfind("bn", 0) == 0) layers->push_back(torch::nn::BatchNorm1d(1024));
      layers->push_back(torch::nn::GELU());
    }
    if (schedule_mode(mode_)) layers->push_back(torch::nn::Linear(1024, 10));
    body = register_module("body", volt::Pipeline(layers, options(chunks, checkpoint)));
    if (!schedule_mode(mode_)) head = register_module("head", torch::nn::Linear(1024, 10));
  }
  torch::Tensor training_step(const volt::Batch& b, int64_t) override {
    if (mode_ == "1f1b") {
      return body->forward_loss(b.input, b.target, [](const at::Tensor& out, const at::Tensor& t) {
        return torch::cross_entropy_loss(out, t);
      });
    }
    const at::Tensor out = body->forward(b.input);
    return torch::cross_entropy_loss(head ? head->forward(out) : out, b.target);
  }
  std::vector<volt::OptimizerConfig> configure_optimizers() override {
    optimizer =
        std::make_shared<torch::optim::AdamW>(parameters(), torch::optim::AdamWOptions(1e-4));
    return {volt::OptimizerConfig(optimizer)};
  }
  volt::Pipeline body{nullptr};
  torch::nn::Linear head{nullptr};  // after the pipeline, but in it under "gpipe" and "1f1b"
  std::shared_ptr<torch::optim::AdamW> optimizer;

 private:
  std::string mode_;
};

// Times the steps after the warm-up ones and reads what this rank holds at the end.
class Probe : public volt::Callback {
 public:
  Probe(DeepMlp& m, int64_t warmup) : m_(m), warmup_(warmup) {}
  std::string state_key() const override { return "Probe"; }
  void on_train_batch_start(volt::RunContext&, volt::Module&, const volt::Batch&,
                            int64_t idx) override {
    if (idx == warmup_) t0 = Clock::now();
    // Each step's own peak above what it started with: activations, gradients, temporaries.
    if (idx >= warmup_) {
      volt::reset_cpu_memory_peaks();
      step_start = volt::cpu_memory_stats().in_use;
    }
  }
  void on_train_batch_end(volt::RunContext& run, volt::Module&, const volt::Batch&,
                          int64_t idx) override {
    t1 = Clock::now();
    steps = idx + 1 - warmup_;
    if (idx >= warmup_) {
      const auto m = volt::cpu_memory_stats();
      peak_bytes = std::max(peak_bytes, m.max_in_use);
      step_bytes = std::max(step_bytes, m.max_in_use - step_start);
    }
    if (state_bytes == 0) {
      for (const auto& kv : m_.optimizer->state()) {
        const auto& s = static_cast<const torch::optim::AdamWParamState&>(*kv.second);
        state_bytes += (s.exp_avg().numel() + s.exp_avg_sq().numel()) * 4;
      }
      rank = run.global_rank();
    }
  }
  void on_train_start(volt::RunContext&, volt::Module&) override {
    for (const auto& p : m_.parameters()) held_bytes += p.numel() * 4;
  }
  // Gradients exist between backward and the optimizer's zero_grad.
  void on_after_backward(volt::RunContext&, volt::Module&) override {
    if (trained_bytes != 0) return;
    for (const auto& p : m_.parameters()) {
      if (p.grad().defined()) trained_bytes += p.numel() * 4;
    }
  }
  Clock::time_point t0, t1;
  int64_t steps = 0, state_bytes = 0, trained_bytes = 0, held_bytes = 0, rank = 0;
  int64_t step_start = 0, step_bytes = 0, peak_bytes = 0;

 private:
  DeepMlp& m_;
  int64_t warmup_;
};

void run(int64_t stages, int64_t chunks, const std::string& checkpoint, int64_t steps,
         int64_t batch) {
  volt::install_counting_cpu_allocator();
  torch::manual_seed(0);
  DeepMlp model(chunks, checkpoint);
  const int64_t warmup = 3;
  auto probe = std::make_shared<Probe>(model, warmup);
  volt::Trainer trainer(volt::TrainerOptions()
                            .accelerator("cpu")
                            .strategy(stages > 1 ? "pipeline" : "single_device")
                            .devices(stages)
                            .max_steps(steps)
                            .callbacks({probe})
                            .enable_progress_bar(false)
                            .enable_checkpointing(false)
                            .enable_model_summary(false)
                            .logger(false)
                            .num_sanity_val_steps(0));
  auto x = torch::randn({batch * steps, 1024});
  auto y = torch::randint(0, 10, {batch * steps});
  trainer.fit(model, volt::DataLoader(std::make_shared<volt::TensorDataset>(x, y),
                                      volt::DataLoaderOptions(batch)));
  const double s = std::chrono::duration<double>(probe->t1 - probe->t0).count();
  std::printf(
      "RESULT stages=%lld chunks=%lld checkpoint=%s rank=%lld steps_per_s=%.3f held_bytes=%lld "
      "trained_bytes=%lld "
      "state_bytes=%lld peak_bytes=%lld step_bytes=%lld\n",
      static_cast<long long>(stages), static_cast<long long>(chunks), checkpoint.c_str(),
      static_cast<long long>(probe->rank), static_cast<double>(probe->steps) / s,
      static_cast<long long>(probe->held_bytes), static_cast<long long>(probe->trained_bytes),
      static_cast<long long>(probe->state_bytes), static_cast<long long>(probe->peak_bytes),
      static_cast<long long>(probe->step_bytes));
  std::fflush(stdout);
}

// The same layers without the Trainer, every phase timed: where a pipelined step's time goes.
// Started with cluster variables (WORLD_SIZE, ...) it is one stage; without them, one process.
void hand_loop(int64_t chunks, int64_t rows, int64_t steps) {
  const char* world = std::getenv("WORLD_SIZE");
  std::shared_ptr<volt::ProcessGroup> group;
  if (world != nullptr) {
    group = std::make_shared<volt::ProcessGroup>(
        volt::detect_cluster_environment(volt::process_env(), std::stoll(world), 1));
  }
  torch::manual_seed(0);
  torch::nn::Sequential layers;
  for (int i = 0; i < 8; ++i) {
    layers->push_back(torch::nn::Linear(1024, 1024));
    layers->push_back(torch::nn::GELU());
  }
  volt::Pipeline pipe(layers, volt::PipelineOptions().chunks(chunks));
  torch::nn::Linear head(1024, 10);
  if (group) pipe->distribute(group);
  std::vector<at::Tensor> params = pipe->parameters();
  for (const auto& p : head->parameters()) params.push_back(p);
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(1e-4));
  const auto x = torch::randn({rows, 1024});
  const auto y = torch::randint(0, 10, {rows});
  double fwd = 0, bwd = 0, step = 0;
  const auto ms = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
  };
  const int64_t warmup = 5;
  for (int64_t i = 0; i < warmup + steps; ++i) {
    const auto t0 = Clock::now();
    auto loss = torch::cross_entropy_loss(head->forward(pipe->forward(x)), y);
    const auto t1 = Clock::now();
    loss.backward();
    const auto t2 = Clock::now();
    opt.step();
    opt.zero_grad();
    const auto t3 = Clock::now();
    if (i >= warmup) {
      fwd += ms(t0, t1);
      bwd += ms(t1, t2);
      step += ms(t2, t3);
    }
  }
  const double n = static_cast<double>(steps);
  std::printf(
      "HAND stages=%lld chunks=%lld rows=%lld rank=%lld forward_ms=%.1f backward_ms=%.1f "
      "optimizer_ms=%.1f total_ms=%.1f\n",
      static_cast<long long>(group ? group->world_size() : 1), static_cast<long long>(chunks),
      static_cast<long long>(rows), static_cast<long long>(group ? group->rank() : 0), fwd / n,
      bwd / n, step / n, (fwd + bwd + step) / n);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  volt_bench::same_host_malloc_for_every_contender();  // the hand loop's too
  std::map<std::string, std::string> a;
  for (int i = 1; i + 1 < argc; i += 2) a[argv[i]] = argv[i + 1];
  const int64_t steps = a.count("--steps") ? std::stoll(a["--steps"]) : 20;
  const int64_t batch = a.count("--batch") ? std::stoll(a["--batch"]) : 128;
  if (a.count("--hand")) {
    hand_loop(std::stoll(a["--chunks"]), batch, steps);
    return 0;
  }
  if (!a.count("--stages")) {
    std::printf(
        "| stages | micro-batches | checkpoint | rank | steps/s | weights held MiB | weights "
        "trained MiB | AdamW state MiB | peak tensor MiB | step peak MiB |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n");
    struct Config {
      int stages, chunks;
      const char* checkpoint;
    };
    std::vector<Config> configs{
        {1, 1, "never"}, {2, 1, "never"}, {2, 2, "never"}, {2, 4, "never"}, {2, 8, "never"}};
    if (a.count("--table") && a["--table"] == "checkpoint") {
      configs = {{1, 1, "never"},       {1, 1, "always"}, {1, 1, "interval2"}, {2, 4, "never"},
                 {2, 4, "except_last"}, {2, 4, "always"}, {2, 4, "interval2"}};
    }
    if (a.count("--table") && a["--table"] == "batchnorm") {
      configs = {{2, 4, "bn"}, {2, 4, "bn_deferred"}, {2, 8, "bn"}, {2, 8, "bn_deferred"}};
    }
    if (a.count("--table") && a["--table"] == "schedule") {
      configs = {{2, 4, "gpipe"}, {2, 4, "1f1b"}, {2, 8, "gpipe"}, {2, 8, "1f1b"}};
    }
    for (const auto& [stages, chunks, checkpoint] : configs) {
      const std::string cmd = std::string(argv[0]) + " --stages " + std::to_string(stages) +
                              " --chunks " + std::to_string(chunks) + " --checkpoint " +
                              checkpoint + " --steps " + std::to_string(steps) + " --batch " +
                              std::to_string(batch) + " 2>/dev/null | grep RESULT";
      std::FILE* f = popen(cmd.c_str(), "r");
      char line[512];
      while (f && std::fgets(line, sizeof line, f)) {
        long long st, ch, rank, held, trained, state, peak, step;
        char mode[32];
        double sps;
        if (std::sscanf(line,
                        "RESULT stages=%lld chunks=%lld checkpoint=%31s rank=%lld steps_per_s=%lf "
                        "held_bytes=%lld trained_bytes=%lld state_bytes=%lld peak_bytes=%lld "
                        "step_bytes=%lld",
                        &st, &ch, mode, &rank, &sps, &held, &trained, &state, &peak, &step) == 10) {
          constexpr double kMiB = 1024.0 * 1024.0;
          std::printf("| %lld | %lld | %s | %lld | %.2f | %.1f | %.1f | %.1f | %.1f | %.1f |\n", st,
                      ch, mode, rank, sps, held / kMiB, trained / kMiB, state / kMiB, peak / kMiB,
                      step / kMiB);
        }
      }
      if (f) pclose(f);
    }
    return 0;
  }
  run(std::stoll(a["--stages"]), std::stoll(a["--chunks"]),
      a.count("--checkpoint") ? a["--checkpoint"] : "never", steps, batch);
  return 0;
}
