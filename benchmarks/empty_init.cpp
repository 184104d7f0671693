// Building a model whose weights a checkpoint replaces: with its initializers (torch::nn's
// kaiming_uniform_ and uniform_ on every Linear) against volt::EmptyInit (Lightning's
// init_module(empty_init=True)), and each followed by giving it the weights (copy_ from a held
// state, what a checkpoint load ends with). Sides alternate round by round; medians.
//
//   volt_bench_empty_init [--layers N (default 16)] [--width W (default 2048)]
//                         [--rounds R (default 5)] [--threads T (default: libtorch's)]

#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "timing.h"
#include "volt/nn/empty_init.h"

namespace {

torch::nn::Sequential build(int64_t layers, int64_t width) {
  torch::nn::Sequential net;
  for (int64_t i = 0; i < layers; ++i) net->push_back(torch::nn::Linear(width, width));
  return net;
}

void give_weights(torch::nn::Sequential& net, const std::vector<at::Tensor>& weights) {
  torch::NoGradGuard no_grad;
  const auto params = net->parameters();
  for (size_t i = 0; i < params.size(); ++i) params[i].copy_(weights[i]);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t layers = 16, width = 2048, rounds = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int64_t value = std::atoll(argv[i + 1]);
    if (flag == "--layers") {
      layers = value;
    } else if (flag == "--width") {
      width = value;
    } else if (flag == "--rounds") {
      rounds = value;
    } else if (flag == "--threads") {
      at::set_num_threads(static_cast<int>(value));
    } else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  std::vector<at::Tensor> weights;
  for (const auto& p : build(layers, width)->parameters()) weights.push_back(p.detach().clone());
  const double mib = static_cast<double>(layers * (width * width + width)) * 4.0 / (1 << 20);
  std::printf("%lld Linear(%lld, %lld): %.0f MiB of fp32 parameters, %d threads, %lld rounds\n",
              static_cast<long long>(layers), static_cast<long long>(width),
              static_cast<long long>(width), mib, at::get_num_threads(),
              static_cast<long long>(rounds));
  std::vector<double> init_ms, empty_ms, init_load_ms, empty_load_ms;
  for (int64_t r = 0; r < rounds; ++r) {
    init_ms.push_back(volt_bench::time_ms([&] { build(layers, width); }));
    empty_ms.push_back(volt_bench::time_ms([&] {
      volt::EmptyInit empty;
      build(layers, width);
    }));
    init_load_ms.push_back(volt_bench::time_ms([&] {
      auto net = build(layers, width);
      give_weights(net, weights);
    }));
    empty_load_ms.push_back(volt_bench::time_ms([&] {
      torch::nn::Sequential net{nullptr};
      {
        volt::EmptyInit empty;
        net = build(layers, width);
      }
      give_weights(net, weights);
    }));
  }
  const double a = volt_bench::median(init_ms), b = volt_bench::median(empty_ms);
  const double c = volt_bench::median(init_load_ms), d = volt_bench::median(empty_load_ms);
  std::printf("build:           initializers %9.1f ms   EmptyInit %9.1f ms   %6.1fx\n", a, b,
              a / b);
  std::printf("build + weights: initializers %9.1f ms   EmptyInit %9.1f ms   %6.1fx\n", c, d,
              c / d);
  return 0;
}
