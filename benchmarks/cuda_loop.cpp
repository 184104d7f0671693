// On a CUDA GPU: volt's Trainer.fit against a hand-written libtorch loop on the same model,
// data and optimizer (Adam), rounds interleaved. The models and batch sizes are the issue's
// side-by-side with PyTorch Lightning: the Fashion-MNIST MLP 784-256-128-10 at batch 128 and
// the demo CNN at batch 64. cuda_loop.py runs the plain PyTorch loop and Lightning on the same
// machine with the same data. Prints steps/s (median of the rounds).
//
//   build/benchmarks/volt_bench_cuda_loop [--rounds R] [--mlp-steps N] [--cnn-steps N]
//                                         [--only mlp|cnn] [--cudnn-benchmark]
//
// --cudnn-benchmark turns cuDNN autotuning on for every side (volt's TrainerOptions::benchmark,
// the hand loop's global flag; cuda_loop.py's flag does the same for PyTorch and Lightning).
//
// Every side uses torch::optim::Adam / torch.optim.Adam as written, except the rows marked
// "fused": volt::FusedAdamW in Adam mode (libtorch's multi-tensor _fused_adam_ on CUDA) here,
// torch.optim.Adam(fused=True) in cuda_loop.py. Python's default Adam on CUDA is its foreach
// (multi-tensor) implementation; C++'s torch::optim::Adam launches its kernels per parameter.

#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "adam_module.h"
#include "bench_trainer.h"
#include "hand_loop.h"
#include "host_memory.h"
#include "models.h"
#include "timing.h"

namespace {

using volt_bench::median;

using Clock = std::chrono::steady_clock;

struct Data {
  torch::Tensor x, y;  // on the CPU, as a dataset in memory would be
};

template <typename Net>
double run_volt(std::shared_ptr<Net> net, const Data& d, int64_t batch, int64_t steps, bool pin,
                bool cudnn_benchmark, bool fused = false) {
  volt_bench::AdamModule<Net> m(net, fused);
  volt::Trainer t(volt_bench::bench_trainer("cuda", steps).benchmark(cudnn_benchmark));
  auto ds = std::make_shared<volt::TensorDataset>(d.x, d.y);
  volt::DataLoader dl(ds, volt::DataLoaderOptions(batch).shuffle(true).seed(1).pin_memory(pin));
  torch::cuda::synchronize();
  const auto t0 = Clock::now();
  t.fit(m, dl);
  torch::cuda::synchronize();
  return steps / std::chrono::duration<double>(Clock::now() - t0).count();
}

template <typename Net>
double run_hand(std::shared_ptr<Net> net, const Data& d, int64_t batch, int64_t steps,
                bool cudnn_benchmark) {
  at::globalContext().setBenchmarkCuDNN(cudnn_benchmark);
  const torch::Device cuda(torch::kCUDA);
  net->to(cuda);
  torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(1e-3));
  net->train();
  torch::cuda::synchronize();
  const auto t0 = Clock::now();
  volt_bench::for_each_batch(d.x, d.y, batch, steps, cuda,
                             [&](const torch::Tensor& x, const torch::Tensor& y) {
                               opt.zero_grad();
                               auto loss = torch::cross_entropy_loss(net->forward(x), y);
                               loss.backward();
                               opt.step();
                             });
  torch::cuda::synchronize();
  return steps / std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  volt_bench::same_host_malloc_for_every_contender();
  if (!torch::cuda::is_available()) {
    std::printf("no CUDA device: nothing to measure\n");
    return 0;
  }
  int rounds = 3;
  int64_t mlp_steps = 2000, cnn_steps = 1000;
  bool cudnn_benchmark = false;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--cudnn-benchmark") {
      cudnn_benchmark = true;
      continue;
    }
    if (i + 1 >= argc) break;
    if (a == "--only")
      only = argv[++i];
    else if (a == "--rounds")
      rounds = std::stoi(argv[++i]);
    else if (a == "--mlp-steps")
      mlp_steps = std::stoll(argv[++i]);
    else if (a == "--cnn-steps")
      cnn_steps = std::stoll(argv[++i]);
  }
  volt::FashionMnist full(volt::kFashionMnistDefaultRoot, volt::FashionMnist::Split::kTrain);
  Data d{full.inputs().slice(0, 0, 16384).contiguous(),
         full.targets().slice(0, 0, 16384).contiguous()};
  struct Row {
    std::string name;
    int64_t batch, steps;
    bool mlp;
  };
  for (const Row& row :
       {Row{"mlp 784-256-128-10", 128, mlp_steps, true}, Row{"cnn (demo)", 64, cnn_steps, false}}) {
    if (!only.empty() && only != (row.mlp ? "mlp" : "cnn")) continue;
    std::vector<double> v, vp, vf, h;
    auto make_mlp = [] {
      return std::make_shared<volt_examples::MlpNet>(std::vector<int64_t>{256, 128});
    };
    auto make_cnn = [] { return std::make_shared<volt_examples::CnnNet>(); };
    for (int r = -1; r < rounds; ++r) {  // round -1 warms up CUDA, cuBLAS and cuDNN
      torch::manual_seed(r + 1);
      const bool cb = cudnn_benchmark;
      const double a = row.mlp ? run_volt(make_mlp(), d, row.batch, row.steps, false, cb)
                               : run_volt(make_cnn(), d, row.batch, row.steps, false, cb);
      torch::manual_seed(r + 1);
      const double b = row.mlp ? run_volt(make_mlp(), d, row.batch, row.steps, true, cb)
                               : run_volt(make_cnn(), d, row.batch, row.steps, true, cb);
      torch::manual_seed(r + 1);
      const double f = row.mlp ? run_volt(make_mlp(), d, row.batch, row.steps, false, cb, true)
                               : run_volt(make_cnn(), d, row.batch, row.steps, false, cb, true);
      torch::manual_seed(r + 1);
      const double c = row.mlp ? run_hand(make_mlp(), d, row.batch, row.steps, cb)
                               : run_hand(make_cnn(), d, row.batch, row.steps, cb);
      if (r < 0) continue;
      v.push_back(a);
      vp.push_back(b);
      vf.push_back(f);
      h.push_back(c);
    }
    const double mv = median(v), mvp = median(vp), mvf = median(vf), mh = median(h);
    std::printf("\n%s, batch %lld, Adam, %lld steps x %d rounds%s (median steps/s)\n",
                row.name.c_str(), static_cast<long long>(row.batch),
                static_cast<long long>(row.steps), rounds,
                cudnn_benchmark ? ", cuDNN autotuning on" : "");
    std::printf("  volt Trainer.fit             %9.1f   volt/hand = %.3f\n", mv, mv / mh);
    std::printf("  volt Trainer.fit, pinned     %9.1f   volt/hand = %.3f\n", mvp, mvp / mh);
    std::printf("  volt Trainer.fit, fused Adam %9.1f   volt/hand = %.3f\n", mvf, mvf / mh);
    std::printf("  hand libtorch loop           %9.1f\n", mh);
  }
  return 0;
}
