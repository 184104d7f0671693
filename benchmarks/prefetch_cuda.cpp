// On a CUDA GPU: what copying the next batch to the device ahead of the step gains
// (DataLoaderOptions::pin_memory with prefetch_to_device, #14). A model whose step is short next
// to its batch's copy: images of 3 x 128 x 128 floats, batch 256 (48 MiB per batch), two strided
// convolutions, average pooling and a linear layer, fused Adam; 16 batches an epoch. Three loaders,
// rounds interleaved, the same data and seed:
//   pageable  pin_memory(false): each copy waits for the host (pageable memory is staged);
//   pinned    pin_memory(true).prefetch_to_device(false): an asynchronous copy on the compute
//             stream, which queues behind the previous step's kernels;
//   prefetch  pin_memory(true): the copy of batch i+1 on a side stream while step i runs.
// Prints images/s per loader (median of the rounds) and the ratios. Batches cost the host
// nothing, to measure the copy and not the collation: the data set hands out consecutive slices
// of one tensor in host memory (pinned for the pinned loaders), in order.
//
//   build/benchmarks/volt_bench_prefetch_cuda [--rounds R] [--steps N] [--batch B] [--size S]

#include <torch/cuda.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "adam_module.h"
#include "bench_trainer.h"
#include "timing.h"

namespace {

using Clock = std::chrono::steady_clock;

struct ConvNet : torch::nn::Module {
  ConvNet() {
    c1 = register_module("c1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 32, 3).stride(2)));
    c2 = register_module("c2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3).stride(2)));
    fc = register_module("fc", torch::nn::Linear(64, 10));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::relu(c2->forward(torch::relu(c1->forward(x))));
    return fc->forward(torch::adaptive_avg_pool2d(h, {1, 1}).flatten(1));
  }
  torch::nn::Conv2d c1{nullptr}, c2{nullptr};
  torch::nn::Linear fc{nullptr};
};

// Batch i is rows [i*B, (i+1)*B) of x: a view, no copy (x pinned or not is the loader's case).
class Slices : public volt::Dataset {
 public:
  Slices(torch::Tensor x, torch::Tensor y) : x_(std::move(x)), y_(std::move(y)) {}
  int64_t size() const override { return x_.size(0); }
  volt::Example get(int64_t i) const override { return {x_[i], y_[i]}; }
  c10::optional<volt::Batch> get_batch(const std::vector<int64_t>& idx) const override {
    const int64_t first = idx.front(), n = static_cast<int64_t>(idx.size());
    volt::Batch b;
    b.input = x_.narrow(0, first, n);
    b.target = y_.narrow(0, first, n);
    return b;
  }

 private:
  torch::Tensor x_, y_;
};

double images_per_s(const torch::Tensor& x, const torch::Tensor& y, int64_t batch, int64_t steps,
                    bool pin, bool prefetch) {
  torch::manual_seed(0);
  volt_bench::AdamModule<ConvNet> m(std::make_shared<ConvNet>(), /*fused=*/true);
  volt::Trainer t(volt_bench::bench_trainer("cuda", steps).max_epochs(-1));
  auto ds = pin ? std::make_shared<Slices>(x.pin_memory(), y.pin_memory())
                : std::make_shared<Slices>(x, y);
  volt::DataLoader dl(ds,
                      volt::DataLoaderOptions(batch).pin_memory(pin).prefetch_to_device(prefetch));
  torch::cuda::synchronize();
  const auto t0 = Clock::now();
  t.fit(m, dl);
  torch::cuda::synchronize();
  return static_cast<double>(steps * batch) /
         std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  int64_t rounds = 3, steps = 60, batch = 256, size = 128;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const int64_t v = std::atoll(argv[i + 1]);
    if (a == "--rounds")
      rounds = v;
    else if (a == "--steps")
      steps = v;
    else if (a == "--batch")
      batch = v;
    else if (a == "--size")
      size = v;
    else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (!torch::cuda::is_available()) {
    std::printf("volt_bench_prefetch_cuda: no CUDA device; nothing to measure\n");
    return 0;
  }
  torch::manual_seed(0);
  const int64_t n = 16 * batch;  // 16 batches an epoch
  const torch::Tensor x = torch::randn({n, 3, size, size});
  const torch::Tensor y = torch::randint(0, 10, {n});
  images_per_s(x, y, batch, 10, true, true);  // cuDNN, allocator and pinned pool warm-up
  const char* names[] = {"pageable", "pinned", "prefetch"};
  std::vector<std::vector<double>> got(3);
  for (int64_t r = 0; r < rounds; ++r) {
    got[0].push_back(images_per_s(x, y, batch, steps, false, false));
    got[1].push_back(images_per_s(x, y, batch, steps, true, false));
    got[2].push_back(images_per_s(x, y, batch, steps, true, true));
  }
  const double mb = static_cast<double>(batch * 3 * size * size * 4) / (1 << 20);
  std::printf(
      "prefetch_to_device: batch %lld x 3 x %lld x %lld floats (%.1f MiB), %lld steps, "
      "median of %lld rounds\n",
      static_cast<long long>(batch), static_cast<long long>(size), static_cast<long long>(size), mb,
      static_cast<long long>(steps), static_cast<long long>(rounds));
  std::vector<double> med(3);
  for (int i = 0; i < 3; ++i) {
    med[i] = volt_bench::median(got[i]);
    std::printf("  %-9s %10.1f images/s\n", names[i], med[i]);
  }
  std::printf("  prefetch / pinned %.3f, prefetch / pageable %.3f, pinned / pageable %.3f\n",
              med[2] / med[1], med[2] / med[0], med[1] / med[0]);
  return 0;
}
