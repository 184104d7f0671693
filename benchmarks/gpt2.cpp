// GPT-2 training throughput (issue #14): volt's Trainer.fit with bf16-mixed and FusedAdamW
// against a hand-written libtorch loop doing the same (autocast bf16, the same optimizer, the
// same model: examples/gpt2.h), rounds interleaved, plus volt's fit with the output layer and
// loss through volt::fused_linear_cross_entropy (no [tokens, vocab] logits); benchmarks/gpt2.py
// runs the same model as a plain PyTorch loop and under PyTorch Lightning. Tokens per second over
// the steps after the warm-up ones (CUDA synchronized at both ends), median of the rounds;
// synthetic token ids, so no data loading is measured beyond the loader's batching and the copy to
// the device.
//
//   volt_bench_gpt2 [--accelerator cuda|cpu] [--layers L] [--dim D] [--heads H] [--vocab V]
//                   [--seq T] [--batch B] [--steps S] [--warmup W] [--rounds R]
//                   [--trace FILE]
//
// --trace FILE (CUDA builds on torch >= 2.1): after the timed rounds, one more hand loop whose
// last 3 steps run under libtorch's kineto profiler (GPU activity only), saved as a Chrome
// trace; `benchmarks/gpt2.py --trace` writes the same for the Python loop, and
// tools/kernel_table.py compares the two kernel by kernel.
//
// Defaults on CUDA: GPT-2 small (124M parameters), batch 16 x 1024 tokens, 30 steps of which 10
// warm up, 2 rounds. Without CUDA the defaults shrink to a 2-layer model of width 64 (a smoke
// run: the CPU figures mean nothing for the goal).

#include <torch/cuda.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench_trainer.h"
#include "gpt2.h"
#include "host_memory.h"
#include "kineto_trace.h"
#include "timing.h"

namespace {

using Clock = std::chrono::steady_clock;

void sync(const torch::Device& d) {
  if (d.is_cuda()) torch::cuda::synchronize();
}

// Times the steps after the first `warmup` ones: on_train_batch_end of batch warmup-1 starts the
// clock, on_train_end stops it (both after a device synchronize).
class SteadyClock : public volt::Callback {
 public:
  SteadyClock(torch::Device device, int64_t warmup) : device_(device), warmup_(warmup) {}
  std::string state_key() const override { return "SteadyClock"; }
  void on_train_batch_end(volt::RunContext&, volt::Module&, const volt::Batch&,
                          int64_t batch_idx) override {
    if (batch_idx + 1 == warmup_) {
      sync(device_);
      t0_ = Clock::now();
    }
  }
  void on_train_end(volt::RunContext&, volt::Module&) override {
    sync(device_);
    seconds = std::chrono::duration<double>(Clock::now() - t0_).count();
  }
  double seconds = 0;

 private:
  torch::Device device_;
  int64_t warmup_;
  Clock::time_point t0_;
};

struct Setup {
  volt_examples::Gpt2Config cfg;
  int64_t seq = 1024, batch = 16, steps = 30, warmup = 10;
  torch::Device device{torch::kCUDA};
};

// Token ids [steps * batch, seq + 1]; input = [:, :-1], target = [:, 1:].
std::pair<torch::Tensor, torch::Tensor> tokens(const Setup& s) {
  torch::manual_seed(0);
  auto ids = torch::randint(s.cfg.vocab, {s.steps * s.batch, s.seq + 1}, torch::kLong);
  return {ids.slice(1, 0, s.seq).contiguous(), ids.slice(1, 1, s.seq + 1).contiguous()};
}

double run_volt(const Setup& s, const torch::Tensor& x, const torch::Tensor& y, double* loss,
                bool fused_loss = false, int64_t pad_classes_to = 0) {
  torch::manual_seed(1);
  volt_examples::Gpt2Module m(std::make_shared<volt_examples::Gpt2Net>(s.cfg), 6e-4, fused_loss,
                              volt::LinearCrossEntropyOptions().pad_classes_to(pad_classes_to));
  auto clock = std::make_shared<SteadyClock>(s.device, s.warmup);
  volt::Trainer t(volt_bench::bench_trainer(s.device.is_cuda() ? "cuda" : "cpu", s.steps)
                      .precision("bf16-mixed")
                      .callbacks({clock}));
  volt::DataLoader dl(std::make_shared<volt::TensorDataset>(x, y),
                      volt::DataLoaderOptions(s.batch).pin_memory(s.device.is_cuda()));
  t.fit(m, dl);
  *loss = t.callback_metrics().count("train_loss") ? t.callback_metrics().at("train_loss") : 0.0;
  return static_cast<double>((s.steps - s.warmup) * s.batch * s.seq) / clock->seconds;
}

// The hand loop; `warm` runs after the first `warmup` steps (synchronized), before the rest.
double run_hand(const Setup& s, const torch::Tensor& x, const torch::Tensor& y, double* loss,
                const std::function<void()>& warm = {}) {
  torch::manual_seed(1);
  auto net = std::make_shared<volt_examples::Gpt2Net>(s.cfg);
  net->to(s.device);
  net->train();
  volt::FusedAdamW opt(
      net->parameters(),
      volt::FusedAdamWOptions(6e-4).betas(std::make_tuple(0.9, 0.95)).weight_decay(0.1));
  Clock::time_point t0;
  torch::Tensor last;
  for (int64_t i = 0; i < s.steps; ++i) {
    auto xb = x.slice(0, i * s.batch, (i + 1) * s.batch).to(s.device, /*non_blocking=*/true);
    auto yb = y.slice(0, i * s.batch, (i + 1) * s.batch).to(s.device, /*non_blocking=*/true);
    opt.zero_grad();
    torch::Tensor l;
    {
      volt::AutocastGuard bf16(s.device.type(), torch::kBFloat16);
      auto logits = net->forward(xb);
      l = torch::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}).to(torch::kFloat),
                                    yb.reshape({-1}));
    }
    l.backward();
    opt.step();
    last = l.detach();
    if (i + 1 == s.warmup) {
      sync(s.device);
      if (warm) warm();
      t0 = Clock::now();
    }
  }
  sync(s.device);
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  *loss = last.item<double>();
  return static_cast<double>((s.steps - s.warmup) * s.batch * s.seq) / secs;
}

// The hand loop again, its last 3 steps under kineto (GPU kernels, copies and sets), saved to
// `path` as a Chrome trace.
void trace_hand(Setup s, const torch::Tensor& x, const torch::Tensor& y, const std::string& path) {
  if (!volt_bench::KinetoTrace::available()) {
    std::printf("  --trace %s: needs a CUDA build on torch >= 2.1 (kineto)\n", path.c_str());
    return;
  }
  volt_bench::KinetoTrace trace;
  s.warmup = s.steps - 3;
  double loss = 0;
  run_hand(s, x, y, &loss, [&] { trace.begin(); });
  trace.end(path);
  std::printf("  trace of the hand loop's last 3 steps: %s\n", path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  volt_bench::same_host_malloc_for_every_contender();
  Setup s;
  std::string accel = torch::cuda::is_available() ? "cuda" : "cpu";
  int rounds = 2;
  std::string trace;
  std::vector<std::pair<std::string, int64_t*>> ints = {
      {"--layers", &s.cfg.layers}, {"--dim", &s.cfg.dim},  {"--heads", &s.cfg.heads},
      {"--vocab", &s.cfg.vocab},   {"--seq", &s.seq},      {"--batch", &s.batch},
      {"--steps", &s.steps},       {"--warmup", &s.warmup}};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--accelerator") {
      accel = argv[i + 1];
    } else if (a == "--rounds") {
      rounds = std::stoi(argv[i + 1]);
    } else if (a == "--trace") {
      trace = argv[i + 1];
    }
  }
  if (accel == "cpu") {  // a smoke run unless the flags say otherwise
    s.cfg = {512, 64, 2, 4, 64};
    s.seq = 64;
    s.batch = 4;
    s.steps = 8;
    s.warmup = 3;
    s.device = torch::Device(torch::kCPU);
  } else if (!torch::cuda::is_available()) {
    std::printf("no CUDA device: run with --accelerator cpu for a smoke run\n");
    return 0;
  }
  for (int i = 1; i + 1 < argc; i += 2) {
    for (auto& [flag, dst] : ints) {
      if (flag == argv[i]) *dst = std::stoll(argv[i + 1]);
    }
  }
  s.cfg.context = std::max(s.cfg.context, s.seq);
  if (s.warmup >= s.steps) s.warmup = s.steps / 2;
  const auto [x, y] = tokens(s);
  const int64_t params = [&] {
    int64_t n = 0;
    for (const auto& p : volt_examples::Gpt2Net(s.cfg).parameters()) n += p.numel();
    return n;
  }();
  std::printf("GPT-2 %lld layers, dim %lld, %lld heads, vocab %lld (%.1fM parameters) on %s\n",
              static_cast<long long>(s.cfg.layers), static_cast<long long>(s.cfg.dim),
              static_cast<long long>(s.cfg.heads), static_cast<long long>(s.cfg.vocab),
              params / 1e6, accel.c_str());
  std::printf(
      "batch %lld x %lld tokens, bf16-mixed, FusedAdamW; %lld steps, the first %lld "
      "warm up; %d rounds\n",
      static_cast<long long>(s.batch), static_cast<long long>(s.seq),
      static_cast<long long>(s.steps), static_cast<long long>(s.warmup), rounds);
  std::vector<double> v, vf, vu, h;
  double lv = 0, lf = 0, lu = 0, lh = 0;
  for (int r = -1; r < rounds; ++r) {  // round -1 warms up the device, cuBLAS and the allocator
    const double a = run_volt(s, x, y, &lv);
    const double f = run_volt(s, x, y, &lf, /*fused_loss=*/true);
    const double u = run_volt(s, x, y, &lu, /*fused_loss=*/true, /*pad_classes_to=*/1);
    const double b = run_hand(s, x, y, &lh);
    if (r < 0) continue;
    v.push_back(a);
    vf.push_back(f);
    vu.push_back(u);
    h.push_back(b);
  }
  const double mv = volt_bench::median(v), mf = volt_bench::median(vf);
  const double mu = volt_bench::median(vu), mh = volt_bench::median(h);
  std::printf("  volt Trainer.fit      %12.0f tokens/s   volt/hand = %.3f   last loss %.4f\n", mv,
              mv / mh, lv);
  std::printf(
      "  volt fit, fused loss  %12.0f tokens/s   volt/hand = %.3f   last loss %.4f\n"
      "    (output layer + cross-entropy through volt::fused_linear_cross_entropy; on CUDA the\n"
      "    vocabulary padded to a multiple of 64 inside it)\n",
      mf, mf / mh, lf);
  std::printf("  fused loss, unpadded  %12.0f tokens/s   volt/hand = %.3f   last loss %.4f\n", mu,
              mu / mh, lu);
  std::printf("  hand libtorch loop    %12.0f tokens/s                      last loss %.4f\n", mh,
              lh);
  if (!trace.empty()) trace_hand(s, x, y, trace);
  return 0;
}
