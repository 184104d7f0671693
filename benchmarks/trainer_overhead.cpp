// Trainer.fit vs a hand-written libtorch loop vs the same loop written with volt::Fabric vs the
// same loop in Python (Debian python3-torch, the same libtorch build), interleaved round by
// round so machine noise hits them alike.
//
//   volt_bench_trainer [--rounds R] [--threads T] [--python PATH] [--no-python]
//                      [--only train|gan|eval]
//
// Prints one table per model with median steps/s and the ratios volt/hand and volt/python, a
// GAN (two modules set up in one Fabric, whose backward finds the modules each loss reaches)
// written with Fabric and by hand, then
// Trainer.validate's batches/s under inference_mode (c10::InferenceMode, the default) and without
// it (NoGradGuard), beside a hand-written evaluation loop under each.

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "bench_paths.h"
#include "hand_loop.h"
#include "host_memory.h"
#include "models.h"
#include "timing.h"

namespace {

using volt_bench::median;

using Clock = std::chrono::steady_clock;

// Same data for every contender: the first 16384 Fashion-MNIST training images.
struct Data {
  torch::Tensor x, y;
};

template <typename Net>
class BenchModule : public volt::Module {
 public:
  BenchModule(std::shared_ptr<Net> net, bool fused)
      : net_(register_module("net", net)), fused_(fused) {}
  torch::Tensor training_step(const volt::Batch& b, int64_t) override {
    auto loss = torch::cross_entropy_loss(net_->forward(b.input), b.target);
    log("train_loss", loss);
    return loss;
  }
  void validation_step(const volt::Batch& b, int64_t) override {
    log("val_loss", torch::cross_entropy_loss(net_->forward(b.input), b.target));
  }
  std::vector<volt::OptimizerConfig> configure_optimizers() override {
    // The same update either way: FusedSGD matches torch::optim::SGD bit for bit (tests).
    if (fused_)
      return {std::make_shared<volt::FusedSGD>(parameters(),
                                               volt::FusedSGDOptions(0.01).momentum(0.9))};
    return {std::make_shared<torch::optim::SGD>(parameters(),
                                                torch::optim::SGDOptions(0.01).momentum(0.9))};
  }
  std::shared_ptr<Net> net_;
  bool fused_;
};

template <typename Net>
double run_volt(std::shared_ptr<Net> net, const Data& d, int64_t batch, int64_t steps,
                bool fused = false) {
  BenchModule<Net> m(net, fused);
  // The Trainer scopes its own thread count to fit(): give it the one every contender uses.
  volt::Trainer t(volt::TrainerOptions()
                      .max_steps(steps)
                      .logger(false)
                      .enable_checkpointing(false)
                      .enable_progress_bar(false)
                      .num_sanity_val_steps(0)
                      .num_threads(at::get_num_threads()));
  auto ds = std::make_shared<volt::TensorDataset>(d.x, d.y);
  volt::DataLoader dl(ds, volt::DataLoaderOptions(batch).shuffle(true).seed(1));
  const auto t0 = Clock::now();
  t.fit(m, dl);
  return steps / std::chrono::duration<double>(Clock::now() - t0).count();
}

// The same loop written with volt::Fabric (single_device, 32-true): the Trainer's DataLoader,
// strategy backward and optimizer step, driven by hand.
template <typename Net>
double run_fabric(std::shared_ptr<Net> net, const Data& d, int64_t batch, int64_t steps) {
  auto opt = std::make_shared<torch::optim::SGD>(net->parameters(),
                                                 torch::optim::SGDOptions(0.01).momentum(0.9));
  volt::Fabric fabric(volt::FabricOptions().accelerator("cpu"));
  fabric.setup(net, {opt});
  auto ds = std::make_shared<volt::TensorDataset>(d.x, d.y);
  volt::DataLoader dl = fabric.setup_dataloader(
      volt::DataLoader(ds, volt::DataLoaderOptions(batch).shuffle(true).seed(1)));
  net->train();
  const auto t0 = Clock::now();
  int64_t done = 0;
  for (int64_t epoch = 0; done < steps; ++epoch) {
    volt::BatchStream s = dl.stream(epoch);
    for (volt::Batch b; done < steps && s.next(b); ++done) {
      b = fabric.to_device(b);
      at::Tensor loss;
      {
        auto forward = fabric.forward_context(net);
        loss = torch::cross_entropy_loss(net->forward(b.input), b.target);
      }
      fabric.backward(loss);
      fabric.step(*opt);
      fabric.zero_grad(*opt);
    }
  }
  return steps / std::chrono::duration<double>(Clock::now() - t0).count();
}

template <typename Net>
double run_hand(std::shared_ptr<Net> net, const Data& d, int64_t batch, int64_t steps) {
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  net->train();
  const auto t0 = Clock::now();
  volt_bench::for_each_batch(d.x, d.y, batch, steps, c10::nullopt,
                             [&](const torch::Tensor& x, const torch::Tensor& y) {
                               opt.zero_grad();
                               auto loss = torch::cross_entropy_loss(net->forward(x), y);
                               loss.backward();
                               opt.step();
                             });
  return steps / std::chrono::duration<double>(Clock::now() - t0).count();
}

// Batches/s of Trainer.validate over every batch of `d`, `passes` times.
template <typename Net>
double run_validate(std::shared_ptr<Net> net, const Data& d, int64_t batch, int passes,
                    bool inference_mode) {
  BenchModule<Net> m(net, false);
  volt::Trainer t(volt::TrainerOptions()
                      .logger(false)
                      .enable_checkpointing(false)
                      .enable_progress_bar(false)
                      .enable_model_summary(false)
                      .inference_mode(inference_mode)
                      .num_threads(at::get_num_threads()));
  auto ds = std::make_shared<volt::TensorDataset>(d.x, d.y);
  volt::DataLoader dl(ds, volt::DataLoaderOptions(batch));
  const auto t0 = Clock::now();
  for (int p = 0; p < passes; ++p) t.validate(m, dl);
  return passes * (d.x.size(0) / batch) / std::chrono::duration<double>(Clock::now() - t0).count();
}

// The same evaluation by hand: forward and loss per batch, the mean loss read at the end.
template <typename Net>
double run_hand_eval(std::shared_ptr<Net> net, const Data& d, int64_t batch, int passes,
                     bool inference_mode) {
  net->eval();
  c10::optional<c10::InferenceMode> inference;
  c10::optional<torch::NoGradGuard> no_grad;
  if (inference_mode) {
    inference.emplace();
  } else {
    no_grad.emplace();
  }
  const int64_t n = d.x.size(0) / batch;
  const auto t0 = Clock::now();
  for (int p = 0; p < passes; ++p) {
    auto total = torch::zeros({});
    for (int64_t b = 0; b < n; ++b) {
      auto x = d.x.slice(0, b * batch, (b + 1) * batch);
      auto y = d.y.slice(0, b * batch, (b + 1) * batch);
      total += torch::cross_entropy_loss(net->forward(x), y);
    }
    (void)(total / n).item<float>();
  }
  return passes * n / std::chrono::duration<double>(Clock::now() - t0).count();
}

// A GAN on the images: generator 64-256-784, discriminator 784-256-1, SGD each. The alternating
// loop of two steps per batch, with `backward` and `step` Fabric's (two modules set up, so each
// backward walks the loss's graph for the modules it reaches) or plain libtorch's.
struct Gan {
  torch::nn::Sequential g{torch::nn::Linear(64, 256), torch::nn::ReLU(),
                          torch::nn::Linear(256, 784), torch::nn::Tanh()};
  torch::nn::Sequential d{torch::nn::Linear(784, 256), torch::nn::LeakyReLU(),
                          torch::nn::Linear(256, 1)};
  std::shared_ptr<torch::optim::SGD> opt_g = std::make_shared<torch::optim::SGD>(
      g->parameters(), torch::optim::SGDOptions(0.01).momentum(0.5));
  std::shared_ptr<torch::optim::SGD> opt_d = std::make_shared<torch::optim::SGD>(
      d->parameters(), torch::optim::SGDOptions(0.01).momentum(0.5));
};

double run_gan(const Data& d, int64_t batch, int64_t steps, bool with_fabric) {
  Gan m;
  c10::optional<volt::Fabric> fabric;
  if (with_fabric) {
    fabric.emplace(volt::FabricOptions().accelerator("cpu"));
    fabric->setup(m.g, {m.opt_g});
    fabric->setup(m.d, {m.opt_d});
  }
  const auto backward = [&](const at::Tensor& loss) {
    with_fabric ? fabric->backward(loss) : loss.backward();
  };
  const auto step = [&](torch::optim::Optimizer& o) {
    with_fabric ? void(fabric->step(o)) : void(o.step());
  };
  const auto bce = [](const at::Tensor& logits, double target) {
    return torch::binary_cross_entropy_with_logits(logits, at::full_like(logits, target));
  };
  const auto t0 = Clock::now();
  volt_bench::for_each_batch(
      d.x, d.y, batch, steps, c10::nullopt, [&](const torch::Tensor& x, const torch::Tensor&) {
        const at::Tensor real = x.flatten(1) * 2 - 1;
        const at::Tensor z = torch::randn({real.size(0), 64});
        m.opt_d->zero_grad();
        const at::Tensor fake = m.g->forward(z);
        backward(bce(m.d->forward(real), 1) + bce(m.d->forward(fake.detach()), 0));
        step(*m.opt_d);
        m.opt_g->zero_grad();
        m.opt_d->zero_grad();
        backward(bce(m.d->forward(fake), 1));
        step(*m.opt_g);
      });
  return steps / std::chrono::duration<double>(Clock::now() - t0).count();
}

double run_python(const std::string& python, const std::string& model, int64_t batch, int64_t steps,
                  int threads) {
  const std::string cmd = python + " " + volt_bench::source_dir() + "/python_loop.py --model " +
                          model + " --batch " + std::to_string(batch) + " --steps " +
                          std::to_string(steps) + " --threads " + std::to_string(threads);
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return 0;
  double v = 0;
  char line[256];
  while (fgets(line, sizeof line, p)) std::sscanf(line, "steps_per_s %lf", &v);
  pclose(p);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  volt_bench::same_host_malloc_for_every_contender();
  int rounds = 5, threads = 0;
  std::string python = "/usr/bin/python3";
  bool use_python = true;
  std::string only;  // "train", "gan" or "eval": that part alone
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--rounds" && i + 1 < argc)
      rounds = std::stoi(argv[++i]);
    else if (a == "--threads" && i + 1 < argc)
      threads = std::stoi(argv[++i]);
    else if (a == "--python" && i + 1 < argc)
      python = argv[++i];
    else if (a == "--no-python")
      use_python = false;
    else if (a == "--only" && i + 1 < argc)
      only = argv[++i];
  }
  if (!only.empty() && only != "train" && only != "gan" && only != "eval") {
    std::fprintf(stderr, "[volt_bench_trainer] --only %s is not a part; use train, gan or eval\n",
                 only.c_str());
    return 2;
  }
  const auto runs = [&](const char* part) { return only.empty() || only == part; };
  const int64_t nthreads = volt::configure_threads(threads);
  volt::FashionMnist full(volt::kFashionMnistDefaultRoot, volt::FashionMnist::Split::kTrain);
  Data d{full.inputs().slice(0, 0, 16384).contiguous(),
         full.targets().slice(0, 0, 16384).contiguous()};
  std::printf("threads: torch intra-op %lld (OpenBLAS active: %s), rounds %d\n",
              static_cast<long long>(nthreads), volt::reference_blas_active() ? "no" : "yes",
              rounds);

  struct Row {
    std::string name;
    int64_t batch, steps;
    std::string py;
  };
  for (const Row& row :
       {Row{"mlp 784-128-10", 32, 3000, "mlp"}, Row{"cnn (demo)", 32, 60, "cnn"}}) {
    if (!runs("train")) break;
    std::vector<double> v, f, h, fb, py;
    for (int r = 0; r < rounds; ++r) {
      torch::manual_seed(r);
      if (row.py == "mlp") {
        v.push_back(run_volt(std::make_shared<volt_examples::MlpNet>(std::vector<int64_t>{128}), d,
                             row.batch, row.steps));
        torch::manual_seed(r);
        f.push_back(run_volt(std::make_shared<volt_examples::MlpNet>(std::vector<int64_t>{128}), d,
                             row.batch, row.steps, true));
        torch::manual_seed(r);
        h.push_back(run_hand(std::make_shared<volt_examples::MlpNet>(std::vector<int64_t>{128}), d,
                             row.batch, row.steps));
        torch::manual_seed(r);
        fb.push_back(run_fabric(std::make_shared<volt_examples::MlpNet>(std::vector<int64_t>{128}),
                                d, row.batch, row.steps));
      } else {
        v.push_back(run_volt(std::make_shared<volt_examples::CnnNet>(), d, row.batch, row.steps));
        torch::manual_seed(r);
        f.push_back(
            run_volt(std::make_shared<volt_examples::CnnNet>(), d, row.batch, row.steps, true));
        torch::manual_seed(r);
        h.push_back(run_hand(std::make_shared<volt_examples::CnnNet>(), d, row.batch, row.steps));
        torch::manual_seed(r);
        fb.push_back(
            run_fabric(std::make_shared<volt_examples::CnnNet>(), d, row.batch, row.steps));
      }
      if (use_python)
        py.push_back(run_python(python, row.py, row.batch, row.steps, static_cast<int>(nthreads)));
    }
    const double mv = median(v), mf = median(f), mh = median(h), mfb = median(fb), mp = median(py);
    std::printf("\n%s, batch %lld, %lld steps x %d rounds (median steps/s)\n", row.name.c_str(),
                static_cast<long long>(row.batch), static_cast<long long>(row.steps), rounds);
    std::printf("  volt Trainer.fit      %10.1f\n", mv);
    std::printf("  hand libtorch loop    %10.1f   volt/hand   = %.3f\n", mh, mv / mh);
    std::printf("  volt + FusedSGD       %10.1f   fused/hand  = %.3f\n", mf, mf / mh);
    std::printf("  volt Fabric loop      %10.1f   fabric/hand = %.3f\n", mfb, mfb / mh);
    if (use_python) {
      std::printf("  python torch loop     %10.1f   volt/python = %.3f   fused/python = %.3f\n", mp,
                  mv / mp, mf / mp);
    }
  }

  if (runs("gan")) {
    // Two modules in one Fabric: the graph walk of each backward, against the hand loop.
    const int64_t batch = 64, steps = 600;
    std::vector<double> fb, h;
    for (int r = 0; r < rounds; ++r) {
      // Each goes first in every other round: this VM's speed drifts within a round.
      const bool fabric_first = r % 2 == 1;
      for (const bool with_fabric : {fabric_first, !fabric_first}) {
        torch::manual_seed(r);
        (with_fabric ? fb : h).push_back(run_gan(d, batch, steps, with_fabric));
      }
    }
    std::printf(
        "\ngan g 64-256-784 / d 784-256-1, batch %lld, %lld steps x %d rounds (median "
        "steps/s)\n",
        static_cast<long long>(batch), static_cast<long long>(steps), rounds);
    std::printf("  hand libtorch loop    %10.1f\n", median(h));
    std::printf("  volt Fabric loop      %10.1f   fabric/hand = %.3f\n", median(fb),
                median(fb) / median(h));
  }

  // Evaluation: the Trainer's validate with and without inference mode, and the hand loop.
  for (const Row& row : {Row{"mlp 784-128-10", 32, 4, "mlp"}, Row{"cnn (demo)", 32, 1, "cnn"}}) {
    if (!runs("eval")) break;
    std::vector<double> vi, vn, hi, hn;
    const int passes = static_cast<int>(row.steps);
    for (int r = 0; r < rounds; ++r) {
      torch::manual_seed(r);
      if (row.py == "mlp") {
        auto net = std::make_shared<volt_examples::MlpNet>(std::vector<int64_t>{128});
        vi.push_back(run_validate(net, d, row.batch, passes, true));
        vn.push_back(run_validate(net, d, row.batch, passes, false));
        hi.push_back(run_hand_eval(net, d, row.batch, passes, true));
        hn.push_back(run_hand_eval(net, d, row.batch, passes, false));
      } else {
        auto net = std::make_shared<volt_examples::CnnNet>();
        vi.push_back(run_validate(net, d, row.batch, passes, true));
        vn.push_back(run_validate(net, d, row.batch, passes, false));
        hi.push_back(run_hand_eval(net, d, row.batch, passes, true));
        hn.push_back(run_hand_eval(net, d, row.batch, passes, false));
      }
    }
    const double mvi = median(vi), mvn = median(vn), mhi = median(hi), mhn = median(hn);
    std::printf(
        "\n%s evaluation, batch %lld, %lld batches x %d passes x %d rounds (median "
        "batches/s)\n",
        row.name.c_str(), static_cast<long long>(row.batch),
        static_cast<long long>(d.x.size(0) / row.batch), passes, rounds);
    std::printf("  validate, inference_mode   %10.1f   / no_grad = %.3f   / hand = %.3f\n", mvi,
                mvi / mvn, mvi / mhi);
    std::printf("  validate, no_grad          %10.1f\n", mvn);
    std::printf("  hand loop, InferenceMode   %10.1f   / NoGradGuard = %.3f\n", mhi, mhi / mhn);
    std::printf("  hand loop, NoGradGuard     %10.1f\n", mhn);
  }
  return 0;
}
