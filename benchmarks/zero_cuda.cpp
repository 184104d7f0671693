// DeepSpeedStrategy on one GPU (issue #12's GPU part): ZeRO stages 1 to 3 at world size 1 over
// NCCL, and ZeRO-Offload (the optimizer and its state in pinned host memory, stepped on the
// CPU), against the single-device fit and DDP, in fp32 and bf16-mixed. For each: the step time
// (milliseconds, after a warm-up) and what the GPU holds, two ways: the caching allocator's
// peak of allocated bytes over the timed steps, and the engine's exact bytes by kind
// (DeepSpeedStrategy::memory: parameters, gradients, optimizer state, master weights), with
// where the state and masters live.
//
// At world size 1 the partitions are whole, so stages 1 to 3 save no memory here; what they
// show is the cost of their machinery on one device (since session 31 stage 3 keeps whole
// parameters at one rank unless they are offloaded, so it runs like stage 2 here). Offload is what
// frees GPU memory at one GPU: the Adam state and masters leave it (offload_optimizer), and the
// parameter chunks too (deepspeed_stage_3_offload: the GPU holds only the modules gathered at the
// moment).
//
//   volt_bench_zero_cuda [--width H] [--depth D] [--batch B] [--steps S] [--warmup W]
//                        [--threads T]

#include <torch/cuda.h>
#include <torch/torch.h>

#ifdef VOLT_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <volt/kernels/fused_adamw.h>
#include <volt/strategies/deepspeed.h>
#include <volt/volt.h>

#include "bench_trainer.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Config {
  int64_t width = 4096, depth = 4, batch = 256, steps = 20, warmup = 5;
};

class Mlp : public volt::Module {
 public:
  Mlp(const Config& c, bool fused) : fused_(fused) {
    torch::manual_seed(0);
    int64_t in = 1024;
    for (int64_t i = 0; i < c.depth; ++i) {
      layers->push_back(torch::nn::Linear(in, c.width));
      in = c.width;
    }
    head = register_module("head", torch::nn::Linear(in, 16));
    register_module("layers", layers);
  }
  torch::Tensor training_step(const volt::Batch& b, int64_t) override {
    at::Tensor h = b.input;
    for (const auto& l : *layers) h = torch::relu(l->as<torch::nn::Linear>()->forward(h));
    return torch::cross_entropy_loss(head->forward(h), b.target);
  }
  std::vector<volt::OptimizerConfig> configure_optimizers() override {
    if (fused_)
      return {std::make_shared<volt::FusedAdamW>(parameters(), volt::FusedAdamWOptions())};
    return {std::make_shared<torch::optim::AdamW>(parameters(), torch::optim::AdamWOptions())};
  }
  torch::nn::ModuleList layers;
  torch::nn::Linear head{nullptr};

 private:
  bool fused_;
};

// Times the steps after the warm-up (synchronized at both ends) and takes the memory figures.
class Probe : public volt::Callback {
 public:
  Probe(int64_t warmup, int64_t last) : warmup_(warmup), last_(last) {}
  std::string state_key() const override { return "probe"; }
  void on_train_batch_end(volt::RunContext&, volt::Module&, const volt::Batch&,
                          int64_t batch_idx) override {
    if (batch_idx + 1 == warmup_) {
      torch::cuda::synchronize();
#ifdef VOLT_CUDA
      c10::cuda::CUDACachingAllocator::resetPeakStats(0);
#endif
      start_ = Clock::now();
    } else if (batch_idx == last_) {
      torch::cuda::synchronize();
      ms = std::chrono::duration<double, std::milli>(Clock::now() - start_).count() /
           static_cast<double>(last_ + 1 - warmup_);
#ifdef VOLT_CUDA
      peak_bytes = c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].peak;
#endif
    }
  }
  void on_before_optimizer_step(volt::RunContext&, volt::Module&,
                                torch::optim::Optimizer& optimizer) override {
    if (++seen_ != last_ + 1 || trainer == nullptr) return;
    if (auto* ds = dynamic_cast<volt::DeepSpeedStrategy*>(&trainer->strategy())) {
      if (ds->engine(optimizer) != nullptr) {
        memory = ds->memory(optimizer);
        have_memory = true;
        const auto& c = ds->engine(optimizer)->chunks().front();
        masters_where = !c.master.defined()    ? "-"
                        : c.master.is_cuda()   ? "cuda"
                        : c.master.is_pinned() ? "pinned host"
                                               : "host";
      }
    }
  }
  volt::Trainer* trainer = nullptr;
  double ms = 0.0;
  int64_t peak_bytes = -1;
  volt::ZeroMemory memory;
  bool have_memory = false;
  std::string masters_where = "-";

 private:
  int64_t warmup_, last_, seen_ = 0;
  Clock::time_point start_;
};

volt::Spec<volt::Strategy> with(const std::string& name,
                                const std::map<std::string, volt::ParamValue>& set) {
  return volt::named<volt::Strategy>(name, set);
}

double mib(int64_t bytes) {
  return static_cast<double>(bytes) / (1024.0 * 1024.0);
}

void run(const Config& c, const std::string& label, const volt::Spec<volt::Strategy>& strategy,
         const std::string& precision, bool fused) {
  const int64_t steps = c.warmup + c.steps;
  auto data = std::make_shared<volt::TensorDataset>(torch::randn({steps * c.batch, 1024}),
                                                    torch::randint(0, 16, {steps * c.batch}));
  auto probe = std::make_shared<Probe>(c.warmup, steps - 1);
  try {
    Mlp net(c, fused);
    volt::Trainer trainer(volt_bench::bench_trainer("cuda", steps)
                              .devices(1)
                              .precision(precision)
                              .strategy(strategy)
                              .callbacks({probe}));
    probe->trainer = &trainer;
    trainer.fit(net, volt::DataLoader(data, volt::DataLoaderOptions(c.batch)));
  } catch (const std::exception& e) {
    std::printf("%-28s %-10s %-10s failed: %s\n", label.c_str(), precision.c_str(),
                fused ? "fused" : "adamw", e.what());
    return;
  }
  std::printf("%-28s %-10s %-10s %9.2f %10.1f", label.c_str(), precision.c_str(),
              fused ? "fused" : "adamw", probe->ms,
              probe->peak_bytes < 0 ? -1.0 : mib(probe->peak_bytes));
  if (probe->have_memory) {
    const auto& m = probe->memory;
    std::printf(" %9.1f %9.1f %9.1f %9.1f  %s", mib(m.parameters), mib(m.gradients),
                mib(m.optimizer_state), mib(m.master_weights), probe->masters_where.c_str());
  }
  std::printf("\n");
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  int threads = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const int64_t v = std::atoll(argv[i + 1]);
    if (a == "--width")
      c.width = v;
    else if (a == "--depth")
      c.depth = v;
    else if (a == "--batch")
      c.batch = v;
    else if (a == "--steps")
      c.steps = v;
    else if (a == "--warmup")
      c.warmup = v;
    else if (a == "--threads")
      threads = static_cast<int>(v);
    else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (!torch::cuda::is_available()) {
    std::printf("volt_bench_zero_cuda: no CUDA device; nothing to measure.\n");
    return 0;
  }
  if (threads > 0) torch::set_num_threads(threads);
  const int64_t psi =
      1024 * c.width + (c.depth - 1) * c.width * c.width + c.width * 16 + c.depth * c.width + 16;
  std::printf(
      "MLP 1024 -> %lld x %lld -> 16: %.1f M parameters (%.1f MiB in fp32), batch %lld, "
      "%lld timed steps after %lld, %d CPU threads\n",
      static_cast<long long>(c.depth), static_cast<long long>(c.width), psi / 1e6, mib(4 * psi),
      static_cast<long long>(c.batch), static_cast<long long>(c.steps),
      static_cast<long long>(c.warmup), torch::get_num_threads());
  std::printf("%-28s %-10s %-10s %9s %10s %9s %9s %9s %9s  %s\n", "strategy", "precision",
              "optimizer", "ms/step", "peak MiB", "params", "grads", "state", "masters",
              "masters in");
  const std::map<std::string, volt::ParamValue> none;
  const std::map<std::string, volt::ParamValue> all_partitioned{
      {"param_persistence_threshold", int64_t{0}}};
  for (const std::string precision : {"32-true", "bf16-mixed"}) {
    run(c, "single device", "auto", precision, false);
    run(c, "ddp", "ddp", precision, false);
    run(c, "deepspeed_stage_1", with("deepspeed_stage_1", none), precision, false);
    run(c, "deepspeed_stage_2", with("deepspeed_stage_2", none), precision, false);
    run(c, "deepspeed_stage_3", with("deepspeed_stage_3", all_partitioned), precision, false);
    run(c, "deepspeed_stage_2_offload", with("deepspeed_stage_2_offload", none), precision, false);
    run(c, "deepspeed_stage_2_offload", with("deepspeed_stage_2_offload", none), precision, true);
    auto s3 = all_partitioned;
    s3["offload_optimizer"] = true;
    run(c, "stage_3 + offload_optimizer", with("deepspeed_stage_3", s3), precision, true);
    run(c, "deepspeed_stage_3_offload", with("deepspeed_stage_3_offload", all_partitioned),
        precision, true);
  }
  return 0;
}
