#pragma once
// What the documentation's C++ fragments refer to without declaring it (the model, its loaders,
// the tensors of an example), so that tests/docs/generate_doc_snippets.cpp can compile every
// ```cpp block of README.md and docs/*.md against volt's real API. Nothing here is run but the
// whole programs (`<!-- doc-test: program -->`), which declare everything they use.

#include <torch/script.h>  // torch::jit::load (README: a trained model outside volt)
#include <torch/torch.h>
#include <volt/volt.h>

#include <functional>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

namespace volt_doc {

/// The model of the fragments (`model`, `*net`): one Linear.
struct Net : volt::Module {
  Net() { fc = register_module("fc", torch::nn::Linear(4, 2)); }
  at::Tensor forward(const at::Tensor& x) { return fc->forward(x); }
  at::Tensor training_step(const volt::Batch& b, int64_t) override {
    return torch::cross_entropy_loss(forward(b.input), b.target);
  }
  std::vector<volt::OptimizerConfig> configure_optimizers() override {
    return {std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1))};
  }
  torch::nn::Linear fc{nullptr};
};

/// The custom CLI's registered model and data (README "The `volt` command line").
struct MyModel : Net {
  MyModel(int64_t width, double lr) {}
};
struct MyData : volt::DataModule {};

/// The names fragments use, with their types. Each `body` fragment is compiled (and linked) as a
/// member function of a class derived from Scope, each `member` fragment inside such a class;
/// none is constructed.
struct Scope : volt::Module {
  // Models: `model` (a reference, as in a function that was handed one), `net` and the graph
  // examples' `a`, `b`, `head` (shared pointers, as torch::nn modules are held).
  Net& model;
  std::shared_ptr<Net> net, a, b, head;
  volt::TensorFunction fwd_a, fwd_b, fwd_head;
  bool use_a = true;
  // Data.
  volt::DataLoader train_loader, val_loader, data;
  std::vector<std::pair<at::Tensor, at::Tensor>> batches;
  // The README's DDP example defines these two; later fragments reuse them.
  std::shared_ptr<volt::CpuAccelerator> cpu;
  std::shared_ptr<volt::Fp32Precision> fp32;
  // Tensors and layers of forward functions and graph examples.
  at::Tensor x, q, k, v, l1_out, first_x, first_y, sample_x, bias, residual;
  torch::nn::Linear l2{nullptr}, linear{nullptr};
  torch::nn::Sequential blocks{nullptr};
  torch::optim::SGD& optimizer;
};

/// A whole program of the documentation, run by the doc_programs test.
struct Program {
  std::string where;    // "README.md:65": the file and line of its fence
  std::string creates;  // a path it must have created in its working folder ("" = none)
  std::function<int()> run;
};
/// Generated: every `program` block.
std::vector<Program> programs();
/// Generated: how many blocks were compiled.
int compiled_blocks();

inline int call_main(int (*main)()) {
  return main();
}
inline int call_main(int (*main)(int, char**)) {
  static char name[] = "doc_program";
  char* argv[] = {name, nullptr};
  return main(1, argv);
}

}  // namespace volt_doc
