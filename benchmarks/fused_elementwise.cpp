// FusedElementwise against the same chain of libtorch ops (its reference()) and against the
// shortest libtorch spelling (at::gelu's own fused tanh kernel), on bias + GELU(tanh) + residual
// (forward, and forward + backward) and on a chain of exactly rounded ops; then what a kernel
// costs the first time a process needs it: compiled, loaded from the KernelCache folder, or
// already loaded. Each repetition times the variants back to back (interleaved, so drift hits
// all alike); medians. Markdown. Then the same chain written as libtorch ops and fused by
// TracedFunction (alone, with its backward, and inside a module with two Linear layers), and
// a Trainer fit with trace_training_step against the same fit run eagerly. Then row
// reductions: a scaled, masked softmax, a residual LayerNorm and an RMSNorm written as ops,
// each against libtorch's kernels (forward, and forward + backward), by hand and traced, and a
// scaled log_softmax over short rows (10-100 columns).
//
//   build/benchmarks/volt_bench_fused_elementwise [repetitions] [intra-op threads]

#include <stdlib.h>
#include <torch/torch.h>
#include <volt/kernels/fused_elementwise.h>
#include <volt/kernels/kernel_cache.h>
#include <volt/kernels/traced_function.h>
#include <volt/volt.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench_trainer.h"
#include "remove_dir.h"
#include "timing.h"

namespace {

using namespace volt::jit;  // NOLINT: the expression language reads as maths
using volt_bench::median;
using volt_bench::time_ms;

Expr gelu_tanh(const Expr& y) {
  return 0.5 * y * (1.0 + tanh(0.7978845608028654 * (y + 0.044715 * y * y * y)));
}

// The same chain written with libtorch ops, as a user's forward would: what TracedFunction
// records and fuses.
at::Tensor gelu_tanh_ops(const at::Tensor& y) {
  return 0.5 * y * (1.0 + torch::tanh(0.7978845608028654 * (y + 0.044715 * y * y * y)));
}

using Tensors = std::vector<at::Tensor>;

Tensors bias_gelu_res_ops(const Tensors& in) {
  return {gelu_tanh_ops(in[0] + in[1]) + in[2]};
}

// Linear -> GELU(tanh) as ops -> Linear, gated residual with a learned scale.
struct Block : torch::nn::Module {
  explicit Block(int64_t d) {
    fc1 = register_module("fc1", torch::nn::Linear(d, d));
    fc2 = register_module("fc2", torch::nn::Linear(d, d));
    scale = register_parameter("scale", torch::full({d}, 0.5));
  }
  at::Tensor forward(const at::Tensor& x) {
    return x + scale * torch::sigmoid(fc2->forward(gelu_tanh_ops(fc1->forward(x))));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  at::Tensor scale;
};

// A Trainer module whose step is elementwise-heavy: Linear(256 -> 1024), GELU(tanh) and a
// SiLU gate written as ops at [batch, 1024], Linear(1024 -> 10), cross-entropy; SGD.
class GeluMlp : public volt::Module {
 public:
  GeluMlp() {
    fc1 = register_module("fc1", torch::nn::Linear(256, 1024));
    gate = register_parameter("gate", torch::full({1024}, 0.5));
    head = register_module("head", torch::nn::Linear(1024, 10));
  }
  at::Tensor training_step(const volt::Batch& b, int64_t) override {
    const auto h = fc1->forward(b.input);
    const auto g = gelu_tanh_ops(h) * torch::sigmoid(gate * h) + 0.1 * h;
    return torch::cross_entropy_loss(head->forward(g), b.target);
  }
  std::vector<volt::OptimizerConfig> configure_optimizers() override {
    return {volt::OptimizerConfig(std::make_shared<torch::optim::SGD>(
        parameters(), torch::optim::SGDOptions(0.01).momentum(0.9)))};
  }
  torch::nn::Linear fc1{nullptr}, head{nullptr};
  at::Tensor gate;
};

struct Variant {
  std::string name;
  std::function<void()> run;
};

void compare(const std::string& title, int reps, const std::vector<Variant>& variants) {
  std::vector<std::vector<double>> ms(variants.size());
  // Warm-up: the compile, and for a TracedFunction the trace and the call that checks it.
  for (int w = 0; w < 2; ++w) {
    for (const auto& v : variants) v.run();
  }
  for (int r = 0; r < reps; ++r) {
    for (size_t i = 0; i < variants.size(); ++i) ms[i].push_back(time_ms(variants[i].run));
  }
  std::printf("\n**%s**\n\n| variant | median ms | vs. op-by-op |\n|---|---:|---:|\n",
              title.c_str());
  const double base = median(ms[0]);
  for (size_t i = 0; i < variants.size(); ++i) {
    std::printf("| %s | %.3f | %.2fx |\n", variants[i].name.c_str(), median(ms[i]),
                base / median(ms[i]));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 30;
  if (argc > 2) at::set_num_threads(std::atoi(argv[2]));
  // A private cache folder: the figures must not depend on what the user's cache holds.
  char tmpl[] = "/tmp/volt_bench_jit_XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  ::setenv("VOLT_KERNEL_CACHE_CONFIG", (dir + ",false,256").c_str(), 1);
  torch::manual_seed(0);
  std::printf("threads: %d\n", at::get_num_threads());

  Expr x = input(0), b = input(1), r = input(2);
  volt::FusedElementwise bias_gelu_res("bench_bias_gelu_res", {gelu_tanh(x + b) + r},
                                       volt::FusedElementwiseOptions().require_fused(true));
  for (int64_t rows : {64, 4096}) {
    const auto xt = torch::randn({rows, 1024}), bt = torch::randn({1024}),
               rt = torch::randn({rows, 1024});
    const std::vector<at::Tensor> in{xt, bt, rt};
    compare("bias + GELU(tanh) + residual, [" + std::to_string(rows) + ", 1024] float32", reps,
            {{"op by op (reference(), 12 ops)", [&] { bias_gelu_res.reference(in); }},
             {"at::gelu(x + b, \"tanh\") + r (3 ops)",
              [&] { at::add(at::gelu(at::add(xt, bt), "tanh"), rt); }},
             {"FusedElementwise (1 loop)", [&] { bias_gelu_res(in); }}});
  }
  // Short rows (a classifier head's width): rows of at most 31 values run 16 rows at a time.
  for (int64_t cols : {10, 20, 32}) {
    const auto rg = torch::requires_grad();
    const auto xt = torch::randn({4096, cols}, rg), bt = torch::randn({cols}, rg),
               rt = torch::randn({4096, cols}, rg), up = torch::randn({4096, cols});
    const std::vector<at::Tensor> in{xt, bt, rt};
    auto train = [&](const at::Tensor& out) { torch::autograd::grad({out}, {xt, bt, rt}, {up}); };
    compare("forward + backward of bias + GELU(tanh) + residual, [4096, " + std::to_string(cols) +
                "] float32",
            reps,
            {{"op by op (reference() + autograd)", [&] { train(bias_gelu_res.reference(in)[0]); }},
             {"at::gelu(x + b, \"tanh\") + r + autograd",
              [&] { train(at::add(at::gelu(at::add(xt, bt), "tanh"), rt)); }},
             {"FusedElementwise (fused backward)", [&] { train(bias_gelu_res(in)[0]); }}});
  }
  {
    // Training: forward and backward. Autograd's backward of the op-by-op chain is ~20 more
    // ops; the fused backward is one more loop (recomputing the forward values) plus the sum
    // of the bias gradient over rows.
    const auto rg = torch::requires_grad();
    const auto xt = torch::randn({4096, 1024}, rg), bt = torch::randn({1024}, rg),
               rt = torch::randn({4096, 1024}, rg), up = torch::randn({4096, 1024});
    const std::vector<at::Tensor> in{xt, bt, rt};
    auto train = [&](const at::Tensor& out) { torch::autograd::grad({out}, {xt, bt, rt}, {up}); };
    compare("forward + backward of bias + GELU(tanh) + residual, [4096, 1024] float32", reps,
            {{"op by op (reference() + autograd)", [&] { train(bias_gelu_res.reference(in)[0]); }},
             {"at::gelu(x + b, \"tanh\") + r + autograd",
              [&] { train(at::add(at::gelu(at::add(xt, bt), "tanh"), rt)); }},
             {"FusedElementwise (fused backward)", [&] { train(bias_gelu_res(in)[0]); }}});
  }
  {
    // A layer norm's epilogue, after libtorch computed the per-row statistics: columns (mean,
    // rstd) and rows (weight, bias) in one loop.
    volt::FusedElementwise ln("bench_ln_epilogue",
                              {(input(0) - input(1)) * input(2) * input(3) + input(4)},
                              volt::FusedElementwiseOptions().require_fused(true));
    const auto xt = torch::randn({4096, 1024}), mean = xt.mean(1, true),
               rstd = xt.var(1, false, true).add(1e-5).rsqrt(), wt = torch::randn({1024}),
               bt = torch::randn({1024});
    const std::vector<at::Tensor> in{xt, mean, rstd, wt, bt};
    compare("layer-norm epilogue (x - mean) * rstd * w + b, [4096, 1024] float32 (bit-identical)",
            reps,
            {{"op by op (reference(), 4 ops)", [&] { ln.reference(in); }},
             {"FusedElementwise (1 loop)", [&] { ln(in); }}});
  }
  {
    Expr a = input(0), c = input(1), d = input(2);
    volt::FusedElementwise chain("bench_chain", {maximum(a * c + d, 0.0) * 0.5 - minimum(a, d) * c},
                                 volt::FusedElementwiseOptions().require_fused(true));
    const auto at_ = torch::randn({4096, 1024}), ct = torch::randn({4096, 1024}),
               dt = torch::randn({4096, 1024});
    const std::vector<at::Tensor> in{at_, ct, dt};
    compare("max(a*c + d, 0)*0.5 - min(a, d)*c, [4096, 1024] float32 (bit-identical)", reps,
            {{"op by op (reference(), 7 ops)", [&] { chain.reference(in); }},
             {"FusedElementwise (1 loop)", [&] { chain(in); }}});
  }

  {
    // TracedFunction: the chain written as libtorch ops, recorded and fused, against the same
    // ops run eagerly, the recorded graph run op by op (what the interpreter costs), and the
    // chain written by hand as one FusedElementwise.
    volt::TracedFunction traced("bench_traced", bias_gelu_res_ops);
    volt::TracedFunction unfused("bench_traced_ref", bias_gelu_res_ops,
                                 volt::TraceOptions().fuse(false));
    for (int64_t rows : {64, 4096}) {
      const Tensors in{torch::randn({rows, 1024}), torch::randn({1024}),
                       torch::randn({rows, 1024})};
      compare("traced: bias + GELU(tanh) + residual as libtorch ops, [" + std::to_string(rows) +
                  ", 1024] float32",
              reps,
              {{"eager ops (11 ops)", [&] { bias_gelu_res_ops(in); }},
               {"TracedFunction, fuse(false) (the recorded ops)", [&] { unfused(in); }},
               {"TracedFunction (1 fused chain)", [&] { traced(in); }},
               {"FusedElementwise written by hand", [&] { bias_gelu_res(in); }}});
    }
    const auto rg = torch::requires_grad();
    const Tensors in{torch::randn({4096, 1024}, rg), torch::randn({1024}, rg),
                     torch::randn({4096, 1024}, rg)};
    const auto up = torch::randn({4096, 1024});
    auto train = [&](const at::Tensor& out) { torch::autograd::grad({out}, in, {up}); };
    compare("traced: forward + backward of bias + GELU(tanh) + residual as ops, [4096, 1024]", reps,
            {{"eager ops + autograd", [&] { train(bias_gelu_res_ops(in)[0]); }},
             {"TracedFunction (fused backward)", [&] { train(traced(in)[0]); }},
             {"FusedElementwise written by hand", [&] { train(bias_gelu_res(in)[0]); }}});

    // A module: two matmuls (libtorch's, unchanged) around the chains TracedFunction fuses.
    auto block = std::make_shared<Block>(1024);
    volt::TracedFunction traced_block(
        "bench_block", block, [&](const Tensors& x) { return Tensors{block->forward(x[0])}; });
    const auto x = torch::randn({512, 1024}, rg);
    const auto gy = torch::randn({512, 1024});
    auto step = [&](const at::Tensor& y) {
      block->zero_grad();
      y.backward(gy);
    };
    compare(
        "traced module: Linear(1024) -> GELU(tanh) as ops -> Linear(1024), gated residual, "
        "[512, 1024], forward + backward",
        reps,
        {{"eager module", [&] { step(block->forward(x)); }},
         {"TracedFunction of the module", [&] { step(traced_block({x})[0]); }}});
  }

  {
    // Row reductions (row_sum / row_max): whole rows in one kernel, the row kept in cache
    // between its passes. libtorch has fast kernels for softmax and layer_norm themselves; the
    // gain is in fusing their neighbours (the scale and mask, the residual add) and in chains
    // libtorch has no kernel for (an RMSNorm written as ops: 5 passes over memory eagerly).
    const int64_t rows = 4096, cols = 1024;
    const auto opts = volt::FusedElementwiseOptions().require_fused(true);
    const Expr sx = input(0) * 0.125 + input(1);
    const Expr se = exp(sx - detach(row_max(sx)));
    volt::FusedElementwise softmax("bench_masked_softmax", {se / row_sum(se)}, opts);
    auto softmax_ops = [](const Tensors& in) {
      return Tensors{torch::softmax(in[0] * 0.125 + in[1], -1)};
    };
    volt::TracedFunction softmax_traced("bench_masked_softmax_t", softmax_ops);
    volt::FusedElementwise plain_softmax("bench_softmax",
                                         {exp(input(0) - detach(row_max(input(0)))) /
                                          row_sum(exp(input(0) - detach(row_max(input(0)))))},
                                         opts);
    const Expr ld = input(0) - detach(row_max(input(0)));
    volt::FusedElementwise plain_log_softmax("bench_log_softmax", {ld - log(row_sum(exp(ld)))},
                                             opts);
    const auto rg = torch::requires_grad();
    for (bool backward : {false, true}) {
      const Tensors sin{torch::randn({rows, cols}, rg),
                        torch::randn({cols}).masked_fill(torch::rand({cols}) > 0.8, -INFINITY)};
      const Tensors leaf{sin[0]};
      const auto up = torch::randn({rows, cols});
      c10::AutoGradMode grad_mode(backward);
      auto run = [&](const Tensors& out) {
        if (backward) torch::autograd::grad(out, leaf, {up});
      };
      const std::string what = backward ? ", forward + backward" : ", forward";
      compare("softmax(x, -1), [4096, 1024] float32" + what, reps,
              {{"at::softmax", [&] { run({torch::softmax(sin[0], -1)}); }},
               {"FusedElementwise written by hand", [&] { run(plain_softmax(leaf)); }}});
      compare("log_softmax(x, -1), [4096, 1024] float32" + what, reps,
              {{"at::log_softmax", [&] { run({torch::log_softmax(sin[0], -1)}); }},
               {"FusedElementwise written by hand", [&] { run(plain_log_softmax(leaf)); }}});
      compare("softmax(x * 0.125 + mask, -1), [4096, 1024] float32 (mask a row)" + what, reps,
              {{"eager ops (mul, add, softmax)", [&] { run(softmax_ops(sin)); }},
               {"TracedFunction (1 fused chain)", [&] { run(softmax_traced(sin)); }},
               {"FusedElementwise written by hand", [&] { run(softmax(sin)); }}});
    }

    const Expr h = input(0) + input(1);
    const Expr d = h - row_sum(h) / row_length();
    const Expr y =
        d * (Expr(1.0) / sqrt(row_sum(d * d) / row_length() + 1e-5)) * input(2) + input(3);
    volt::FusedElementwise res_ln("bench_residual_layer_norm", {y}, opts);
    auto res_ln_ops = [](const Tensors& in) {
      return Tensors{torch::layer_norm(in[0] + in[1], {in[0].size(-1)}, in[2], in[3], 1e-5)};
    };
    volt::TracedFunction res_ln_traced("bench_residual_layer_norm_t", res_ln_ops);
    const Expr r = input(0);
    volt::FusedElementwise rms(
        "bench_rms_norm", {r * (Expr(1.0) / sqrt(row_sum(r * r) / row_length() + 1e-6)) * input(1)},
        opts);
    auto rms_ops = [](const Tensors& in) {
      return Tensors{in[0] * torch::rsqrt(in[0].pow(2).mean(-1, true) + 1e-6) * in[1]};
    };
    volt::TracedFunction rms_traced("bench_rms_norm_t", rms_ops);
    for (bool backward : {false, true}) {
      const Tensors lin{torch::randn({rows, cols}, rg), torch::randn({rows, cols}, rg),
                        torch::randn({cols}, rg), torch::randn({cols}, rg)};
      const Tensors rin{lin[0], lin[2]};
      const auto up = torch::randn({rows, cols});
      c10::AutoGradMode grad_mode(backward);
      auto run = [&](const Tensors& out, const Tensors& leaves) {
        if (backward) torch::autograd::grad(out, leaves, {up});
      };
      const std::string what = backward ? ", forward + backward" : ", forward";
      compare("layer_norm(x + residual, w, b), [4096, 1024] float32" + what, reps,
              {{"eager ops (add, layer_norm)", [&] { run(res_ln_ops(lin), lin); }},
               {backward ? "TracedFunction (layer_norm kept: gradients)"
                         : "TracedFunction (1 fused chain)",
                [&] { run(res_ln_traced(lin), lin); }},
               {"FusedElementwise written by hand", [&] { run(res_ln(lin), lin); }}});
      compare("RMSNorm as ops x * rsqrt(mean(x^2, -1) + eps) * g, [4096, 1024] float32" + what,
              reps,
              {{"eager ops (pow, mean, add, rsqrt, mul, mul)", [&] { run(rms_ops(rin), rin); }},
               {"TracedFunction (1 fused chain)", [&] { run(rms_traced(rin), rin); }},
               {"FusedElementwise written by hand", [&] { run(rms(rin), rin); }}});
    }

    // Short rows: a temperature-scaled log_softmax over class logits. Rows of at most 31 values
    // run 16 rows at a time, one per vector lane; longer ones row by row.
    const Expr ls = input(0) * 0.5;
    const Expr lsd = ls - detach(row_max(ls));
    volt::FusedElementwise short_ls("bench_scaled_log_softmax", {lsd - log(row_sum(exp(lsd)))},
                                    opts);
    auto short_ls_ops = [](const Tensors& in) {
      return Tensors{torch::log_softmax(in[0] * 0.5, -1)};
    };
    volt::TracedFunction short_ls_traced("bench_scaled_log_softmax_t", short_ls_ops);
    for (int64_t c : {10, 16, 20, 32, 48, 64, 100}) {
      for (bool backward : {false, true}) {
        const Tensors in{torch::randn({rows, c}, rg)};
        const auto up = torch::randn({rows, c});
        c10::AutoGradMode grad_mode(backward);
        auto run = [&](const Tensors& out) {
          if (backward) torch::autograd::grad(out, in, {up});
        };
        compare("log_softmax(x * 0.5, -1), [4096, " + std::to_string(c) + "] float32" +
                    (backward ? ", forward + backward" : ", forward"),
                reps,
                {{"eager ops (mul, log_softmax)", [&] { run(short_ls_ops(in)); }},
                 {"TracedFunction", [&] { run(short_ls_traced(in)); }},
                 {"FusedElementwise written by hand", [&] { run(short_ls(in)); }}});
      }
    }
  }

  {
    // The Trainer tracing the whole training_step (TrainerOptions::trace_training_step): fits
    // of 8 steps, batch 2048, the trace (and the kernels' loading) inside the first step of
    // each fit.
    const int64_t batch = 2048, steps = 8;
    auto data = std::make_shared<volt::TensorDataset>(torch::randn({batch * steps, 256}),
                                                      torch::randint(10, {batch * steps}));
    const volt::DataLoader loader(data, volt::DataLoaderOptions(batch));
    auto fit = [&](bool traced) {
      GeluMlp net;
      volt::Trainer trainer(volt_bench::bench_trainer("cpu", steps)
                                .trace_training_step(traced)
                                .num_threads(at::get_num_threads()));
      trainer.fit(net, loader);
    };
    volt::set_log_sink([](volt::LogLevel, const std::string&) {});  // no trace lines per fit
    compare(
        "Trainer.fit, training_step traced (trace_training_step): Linear(256->1024), "
        "GELU(tanh) and a SiLU gate as ops, Linear(1024->10); 8 steps of batch 2048",
        std::max(3, reps / 5),
        {{"eager training_step", [&] { fit(false); }},
         {"trace_training_step(true)", [&] { fit(true); }}});
    volt::set_log_sink(nullptr);
  }

  // The first call of a kernel a process has not loaded. Distinct names are distinct kernels,
  // so each compile and each load is real (dlopen would hand back a library already loaded).
  const auto small = torch::randn({16});
  const int n = std::max(3, reps / 5);
  std::vector<double> compile_ms, disk_ms, memory_ms;
  for (int i = 0; i < n; ++i) {
    volt::FusedElementwise k("bench_first_call_" + std::to_string(i), {gelu_tanh(input(0))});
    compile_ms.push_back(time_ms([&] { k({small}); }));
  }
  volt::KernelCache::global().flush();
  volt::jit::forget_loaded_kernels();
  for (int i = 0; i < n; ++i) {
    volt::FusedElementwise k("bench_first_call_" + std::to_string(i), {gelu_tanh(input(0))});
    disk_ms.push_back(time_ms([&] { k({small}); }));
  }
  for (int i = 0; i < n; ++i) {
    volt::FusedElementwise k("bench_first_call_" + std::to_string(i), {gelu_tanh(input(0))});
    memory_ms.push_back(time_ms([&] { k({small}); }));
  }
  const auto s = volt::jit::stats();
  std::printf(
      "\n**First call of a kernel (%d kernels; compiles %lld, disk hits %lld, memory hits "
      "%lld)**\n\n| where the kernel came from | median ms |\n|---|---:|\n",
      n, static_cast<long long>(s.compiles), static_cast<long long>(s.disk_hits),
      static_cast<long long>(s.memory_hits));
  std::printf(
      "| compiled (cc) | %.2f |\n| KernelCache folder (dlopen) | %.3f |\n"
      "| loaded already | %.4f |\n",
      median(compile_ms), median(disk_ms), median(memory_ms));
  volt_bench::remove_dir(dir);
  return 0;
}
