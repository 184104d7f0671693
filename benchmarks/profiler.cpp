// What observing a run costs: training steps of the demo CNN (batch 64, Adam, Trainer.fit) with
// no profiler, SimpleProfiler, TorchProfiler (volt regions only; regions + every libtorch op;
// + input shapes; scheduled but outside its active steps) and with volt's counting CPU allocator
// installed (DeviceStatsMonitor's source), side by side in one run. Every repetition runs each
// variant once, back to back (interleaved, so machine drift hits all alike); the table shows
// medians of the per-step time measured inside the loop (from the 3rd step to the end of
// training, so the trace written at the end of the run is not in it; its size is shown).
// A second table times one allocation + free of a 4 KiB tensor with each CPU allocator.
//
//   build/benchmarks/volt_bench_profiler [--reps N] [--steps N] [--threads N]

#include <c10/core/CPUAllocator.h>
#include <torch/torch.h>
#include <volt/volt.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "host_memory.h"
#include "models.h"
#include "remove_dir.h"
#include "timing.h"

namespace {

using volt_bench::median;

using Clock = std::chrono::steady_clock;

/// Wall time per training step from the 3rd step to the end of training.
class StepTimer : public volt::Callback {
 public:
  std::string state_key() const override { return "StepTimer"; }
  void on_train_batch_start(volt::RunContext& run, volt::Module&, const volt::Batch&,
                            int64_t) override {
    if (run.state().global_step == 2) {
      t0_ = Clock::now();
      first_ = 2;
    }
  }
  void on_train_end(volt::RunContext& run, volt::Module&) override {
    ms_per_step = std::chrono::duration<double, std::milli>(Clock::now() - t0_).count() /
                  static_cast<double>(run.state().global_step - first_);
  }
  double ms_per_step = 0;

 private:
  Clock::time_point t0_;
  int64_t first_ = 0;
};

struct Variant {
  std::string name;
  std::function<std::shared_ptr<volt::Profiler>()> profiler;
  bool counting_allocator = false;
  std::vector<double> ms;
  std::string trace;  // path of the last trace, if any
};

}  // namespace

int main(int argc, char** argv) {
  volt_bench::same_host_malloc_for_every_contender();
  int reps = 5, threads = 0;
  int64_t steps = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--steps")) steps = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
  }
  if (threads > 0) at::set_num_threads(threads);
  const std::string dir = "/tmp/volt_bench_profiler";
  volt_bench::remove_dir(dir);

  // The default allocator first, then volt's counting one (installed once per process); the
  // benchmark switches between the two (same priority), which volt itself never does.
  c10::Allocator* plain = c10::GetCPUAllocator();
  volt::install_counting_cpu_allocator();
  c10::Allocator* counting = c10::GetCPUAllocator();
  c10::SetCPUAllocator(plain, 1);

  torch::manual_seed(0);
  const int64_t batch = 64;
  auto x = torch::randn({batch * (steps + 1), 1, 28, 28});
  auto y = torch::randint(0, 10, {batch * (steps + 1)});
  auto data = std::make_shared<volt::TensorDataset>(x, y);

  using volt::TorchProfilerOptions;
  std::vector<Variant> variants = {
      {"no profiler", [] { return nullptr; }},
      {"SimpleProfiler", [] { return std::make_shared<volt::SimpleProfiler>(); }},
      {"TorchProfiler, volt regions only",
       [&] {
         return std::make_shared<volt::TorchProfiler>(TorchProfilerOptions()
                                                          .dirpath(dir)
                                                          .filename("regions")
                                                          .record_ops(false)
                                                          .wait(0)
                                                          .warmup(0)
                                                          .active(0));
       }},
      {"TorchProfiler, regions + ops",
       [&] {
         return std::make_shared<volt::TorchProfiler>(
             TorchProfilerOptions().dirpath(dir).filename("ops").wait(0).warmup(0).active(0));
       }},
      {"TorchProfiler, regions + ops + shapes",
       [&] {
         return std::make_shared<volt::TorchProfiler>(TorchProfilerOptions()
                                                          .dirpath(dir)
                                                          .filename("shapes")
                                                          .record_shapes(true)
                                                          .wait(0)
                                                          .warmup(0)
                                                          .active(0));
       }},
      {"TorchProfiler, waiting (outside active steps)",
       [&] {
         return std::make_shared<volt::TorchProfiler>(
             TorchProfilerOptions().dirpath(dir).filename("idle").wait(1000000).warmup(0).active(
                 1));
       }},
      {"counting CPU allocator", [] { return nullptr; }, true},
  };

  auto run_one = [&](Variant& v) {
    torch::manual_seed(1);
    volt_examples::Classifier<volt_examples::CnnNet> model(
        std::make_shared<volt_examples::CnnNet>());
    auto timer = std::make_shared<StepTimer>();
    auto prof = v.profiler();
    volt::Trainer trainer(volt::TrainerOptions()
                              .max_steps(steps)
                              .default_root_dir(dir)
                              .logger(false)
                              .enable_checkpointing(false)
                              .enable_progress_bar(false)
                              .num_sanity_val_steps(0)
                              .num_threads(at::get_num_threads())
                              .callbacks({timer})
                              .profiler(prof));
    if (v.counting_allocator) c10::SetCPUAllocator(counting, 1);
    trainer.fit(model, volt::DataLoader(data, volt::DataLoaderOptions(batch)));
    if (v.counting_allocator) c10::SetCPUAllocator(plain, 1);
    v.ms.push_back(timer->ms_per_step);
    if (auto* tp = dynamic_cast<volt::TorchProfiler*>(prof.get())) v.trace = tp->last_trace_path();
  };
  // SimpleProfiler prints its report to stderr: keep the table readable.
  std::fflush(stderr);
  for (auto& v : variants) run_one(v);  // warm-up round
  for (auto& v : variants) v.ms.clear();
  for (int r = 0; r < reps; ++r) {
    for (auto& v : variants) run_one(v);
  }

  const double base = median(variants.front().ms);
  std::printf(
      "### Demo CNN training step (batch %lld, Adam), %d threads, median of %d x %lld steps\n\n",
      static_cast<long long>(batch), at::get_num_threads(), reps,
      static_cast<long long>(steps - 2));
  std::printf(
      "| variant | ms / step (median) | min - max | overhead (median) | trace size |\n"
      "|---|---:|---:|---:|---:|\n");
  for (auto& v : variants) {
    const double m = median(v.ms);
    std::string size = "-";
    if (!v.trace.empty() && std::filesystem::exists(v.trace)) {
      size = std::to_string(std::filesystem::file_size(v.trace) / 1024) + " KiB";
    }
    std::printf("| %s | %.2f | %.2f - %.2f | %+.1f%% | %s |\n", v.name.c_str(), m,
                *std::min_element(v.ms.begin(), v.ms.end()),
                *std::max_element(v.ms.begin(), v.ms.end()), 100.0 * (m / base - 1.0),
                size.c_str());
  }

  // Allocation + free of one 4 KiB tensor, each allocator, interleaved.
  constexpr int kAllocs = 200000;
  std::vector<double> t_plain, t_count;
  auto time_allocs = [&](c10::Allocator* a) {
    c10::SetCPUAllocator(a, 1);
    const auto t0 = Clock::now();
    for (int i = 0; i < kAllocs; ++i) {
      auto t = torch::empty({1024}, torch::kFloat);
    }
    const double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / kAllocs;
    c10::SetCPUAllocator(plain, 1);
    return ns;
  };
  time_allocs(plain);
  time_allocs(counting);
  for (int r = 0; r < 2 * reps + 1; ++r) {
    t_plain.push_back(time_allocs(plain));
    t_count.push_back(time_allocs(counting));
  }
  std::printf("\n### torch::empty({1024}) + free, median of %d x %d\n\n", 2 * reps + 1, kAllocs);
  std::printf("| allocator | ns per allocation + free |\n|---|---:|\n");
  std::printf("| libtorch default | %.1f |\n| volt counting | %.1f |\n", median(t_plain),
              median(t_count));

  // Per-op cost of the RecordFunction callback: one tiny op (1-element add) repeated, with no
  // profiler, TorchProfiler recording, and TorchProfiler outside its active steps (callback
  // disabled). The trace written afterwards is not timed.
  constexpr int kOps = 100000;
  auto a = torch::ones({1}), b = torch::ones({1});
  auto time_ops = [&](const char* mode) {
    std::unique_ptr<volt::TorchProfiler> p;
    if (std::strcmp(mode, "none") != 0) {
      const bool rec = std::strcmp(mode, "recording") == 0;
      p = std::make_unique<volt::TorchProfiler>(TorchProfilerOptions()
                                                    .dirpath(dir)
                                                    .filename("tiny")
                                                    .wait(rec ? 0 : 1000000)
                                                    .warmup(0)
                                                    .active(rec ? 0 : 1));
      p->setup("fit", 0, dir);
    }
    const auto t0 = Clock::now();
    for (int i = 0; i < kOps; ++i) a.add_(b);
    const double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / kOps;
    if (p) p->describe("fit", dir);
    return ns;
  };
  std::vector<double> t_none, t_rec, t_wait;
  for (int r = 0; r < 2 * reps + 1; ++r) {
    t_none.push_back(time_ops("none"));
    t_rec.push_back(time_ops("recording"));
    t_wait.push_back(time_ops("waiting"));
  }
  std::printf("\n### One tiny op (add_ of 1 element), median of %d x %d\n\n", 2 * reps + 1, kOps);
  std::printf("| TorchProfiler | ns per op | added ns per op |\n|---|---:|---:|\n");
  std::printf("| none | %.1f | - |\n", median(t_none));
  std::printf("| recording | %.1f | %.1f |\n", median(t_rec), median(t_rec) - median(t_none));
  std::printf("| waiting (callback disabled) | %.1f | %.1f |\n", median(t_wait),
              median(t_wait) - median(t_none));
  return 0;
}
