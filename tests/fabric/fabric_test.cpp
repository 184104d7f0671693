// volt::Fabric: a hand-written loop through the Trainer's strategy and precision. In one process
// it equals the Trainer's fit bit for bit (and a plain libtorch loop); over real processes
// (tests/support/fabric_worker.cpp) two DDP ranks equal one process on the global batch, the
// launch re-runs the binary as the other rank, save/load resumes bit for bit, and a killed rank
// fails the other instead of hanging it.
#include "volt/fabric/fabric.h"

#include <ATen/autocast_mode.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "build_paths.h"
#include "error_text.h"
#include "manual_module.h"
#include "processes.h"
#include "requires.h"
#include "tiny.h"
#include "training_jobs.h"
#include "volt/accelerators/cpu_memory.h"
#include "volt/core/registry.h"
#include "volt/nn/empty_init.h"
#include "volt/nn/pipeline.h"
#include "volt/optim/lr_scheduler.h"
#include "volt/precision/grad_scaler.h"
#include "volt/precision/mixed.h"
#include "volt/strategies/deepspeed.h"
#include "volt/trainer/checkpoint.h"
#include "volt/trainer/trainer.h"

namespace {

using volt_test::error_of;
using volt_test::Job;
using volt_test::load_flat;
using volt_test::run_job;
using volt_test::TinyClassifier;

volt::FabricOptions cpu() {
  return volt::FabricOptions().accelerator("cpu");
}

// Two classifiers with the same initial weights.
std::pair<std::shared_ptr<TinyClassifier>, std::shared_ptr<TinyClassifier>> twins() {
  torch::manual_seed(11);
  auto a = std::make_shared<TinyClassifier>();
  auto b = std::make_shared<TinyClassifier>();
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < a->parameters().size(); ++i) {
    b->parameters()[i].copy_(a->parameters()[i]);
  }
  return {a, b};
}

// The Trainer's fit of `m` for `epochs` epochs on `loader`.
void fit_with_trainer(TinyClassifier& m, const volt::DataLoader& loader, int64_t epochs,
                      const std::string& precision, int64_t accum = 1, double clip = 0) {
  volt_test::TempDir dir;
  auto opts = volt_test::quiet(dir.path).max_epochs(epochs).precision(precision);
  opts.accumulate_grad_batches(accum);
  if (clip > 0) opts.gradient_clip_val(clip);
  volt::Trainer(opts).fit(m, loader);
}

// TinyClassifier's training_step without its log() (which needs a Trainer's run).
at::Tensor loss_of(TinyClassifier& m, const volt::Batch& b) {
  return torch::cross_entropy_loss(m.forward(b.input), b.target);
}

// The same fit written with Fabric: the module's own training_step (its log() reaches the
// Fabric's loggers), SGD from its configure_optimizers, the same seed the Trainer's options set.
void fit_with_fabric(const std::shared_ptr<TinyClassifier>& m, const volt::DataLoader& loader,
                     int64_t epochs, const std::string& precision, int64_t accum = 1,
                     double clip = 0, std::vector<std::shared_ptr<volt::Logger>> loggers = {}) {
  volt::seed_everything(123);  // volt_test::quiet's seed
  volt::Fabric fabric(cpu().precision(precision).loggers(std::move(loggers)));
  auto opt = m->configure_optimizers()[0].optimizer();
  fabric.setup(m, {opt});
  volt::DataLoader train = fabric.setup_dataloader(loader);
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    volt::BatchStream s = train.stream(epoch);
    int64_t i = 0;
    for (volt::Batch b; s.next(b); ++i) {
      at::Tensor loss;
      {
        auto forward = fabric.forward_context(m);  // the precision's context, as the Trainer's
        loss = m->training_step(fabric.to_device(b), i) / accum;
      }
      fabric.backward(loss);
      if ((i + 1) % accum != 0 && i + 1 != train.num_batches()) continue;
      if (clip > 0) fabric.clip_gradients(*opt, clip);
      fabric.step(*opt);
      fabric.zero_grad(*opt);
    }
  }
}

/// The names of the files in `folder`, sorted.
std::vector<std::string> files_in(const std::string& folder) {
  std::vector<std::string> files;
  for (const auto& f : std::filesystem::directory_iterator(folder)) {
    files.push_back(f.path().filename().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

TEST(Fabric, ALoopEqualsTheTrainersFitBitForBit) {
  auto loader = volt_test::loader(volt_test::blobs(96), 16);
  for (const std::string precision : {"32-true", "bf16-mixed", "bf16-true", "64-true", "fp8"}) {
    auto [a, b] = twins();
    fit_with_trainer(*a, loader, 2, precision);
    fit_with_fabric(b, loader, 2, precision);
    EXPECT_TRUE(at::equal(a->flat_params(), b->flat_params())) << precision;
    // Training changed the weights (the comparison is not between two untouched models).
    auto [c, unused] = twins();
    EXPECT_FALSE(at::equal(a->flat_params(), c->flat_params())) << precision;
  }
}

// forward_context holds the precision's forward context (the fits above cannot show it: CPU
// autocast keeps GEMMs below its measured size in fp32, so their bf16-mixed fits are fp32's).
// With one process the strategy adds nothing: the forward gets what autocast() gives.
TEST(Fabric, ForwardContextHoldsThePrecisionsContext) {
  for (const std::string precision : {"32-true", "bf16-mixed"}) {
    volt::Fabric fabric(cpu().precision(precision));
    auto net = torch::nn::Linear(64, 64);
    fabric.setup(net);
    const at::Tensor x = at::randn({32, 64});
    at::Tensor inside, plain;
    {
      auto forward = fabric.forward_context(net);
      EXPECT_EQ(at::autocast::is_cpu_enabled(), precision == "bf16-mixed") << precision;
      inside = net->forward(x);
    }
    EXPECT_FALSE(at::autocast::is_cpu_enabled()) << precision;
    {
      auto autocast = fabric.autocast();
      plain = net->forward(x);
    }
    EXPECT_TRUE(at::equal(inside, plain)) << precision;
  }
}

// A volt::Module set up by Fabric logs, counts its steps and answers its rank queries through
// the Fabric (Lightning's LightningModule under Fabric).
TEST(Fabric, AVoltModulesLogReachesTheFabricsLoggers) {
  auto loader = volt_test::loader(volt_test::blobs(64), 16);  // 4 batches an epoch
  auto logger = std::make_shared<volt_test::MemoryLogger>();
  auto [m, unused] = twins();
  fit_with_fabric(m, loader, 2, "32-true", /*accum=*/2, /*clip=*/0, {logger});
  // training_step logs train_loss once per call: 8 calls, at the steps taken before each (two
  // micro-batches a step).
  ASSERT_EQ(logger->records.size(), 8u);
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(logger->records[i].first, static_cast<int64_t>(i / 2)) << i;
    EXPECT_EQ(logger->records[i].second.count("train_loss"), 1u) << i;
  }
  // The Fabric is gone: the module is no longer attached to it.
  EXPECT_EQ(m->run(), nullptr);

  volt::Fabric fabric(cpu().loggers({logger}));
  auto opt = m->configure_optimizers()[0].optimizer();
  fabric.setup(m, {opt});
  ASSERT_NE(m->run(), nullptr);
  volt::Batch b;
  volt::BatchStream s = loader.stream(0);
  ASSERT_TRUE(s.next(b));
  const at::Tensor loss = m->training_step(b, 0);
  EXPECT_DOUBLE_EQ(m->run()->callback_metrics().at("train_loss"), loss.item<double>());
  EXPECT_DOUBLE_EQ(m->run()->progress_bar_metrics().at("train_loss"), loss.item<double>());
  fabric.backward(loss);
  fabric.step(*opt);
  EXPECT_EQ(m->global_step(), 1);
  EXPECT_EQ(m->current_epoch(), 0);
  EXPECT_TRUE(m->run()->is_global_zero());
  EXPECT_EQ(m->run()->world_size(), 1);
  EXPECT_TRUE(at::equal(m->all_gather(at::ones({2})), at::ones({1, 2})));
  m->log("hidden", 1.5, volt::LogOptions().logger(false));  // metrics only
  EXPECT_EQ(logger->records.back().second.count("hidden"), 0u);
  EXPECT_DOUBLE_EQ(m->run()->callback_metrics().at("hidden"), 1.5);
  // What only the Trainer's loop has says so.
  EXPECT_NE(error_of<volt::ConfigError>([&] {
              m->estimated_stepping_batches();
            }).find("[Fabric] estimated_stepping_batches() belongs to the Trainer's loop"),
            std::string::npos);
  EXPECT_NE(error_of<volt::ConfigError>([&] { m->run()->request_stop(); }).find("fabric.save"),
            std::string::npos);
  EXPECT_NE(error_of<volt::ValueError>([&] { m->log("v", at::ones({3})); }).find("one element"),
            std::string::npos);
}

// Manual optimization: the module's training_step steps its optimizer itself; under Fabric its
// optimizers() and manual_backward() go through the Fabric, as the Trainer's run does.
TEST(Fabric, AManualOptimizationModuleTrainsAsUnderTheTrainer) {
  auto make = [] {
    torch::manual_seed(11);
    return std::make_shared<volt_test::ManualTinyClassifier>();
  };
  auto loader = volt_test::loader(volt_test::blobs(96), 16);
  auto a = make();
  {
    volt_test::TempDir dir;
    volt::Trainer(volt_test::quiet(dir.path).max_epochs(2)).fit(*a, loader);
  }
  auto b = make();
  volt::seed_everything(123);
  volt::Fabric fabric(cpu());
  fabric.setup(b, {b->configure_optimizers()[0].optimizer()});
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    int64_t i = 0;
    for (volt::Batch& batch : fabric.setup_dataloader(loader).stream(epoch)) {
      b->training_step(fabric.to_device(batch), i++);
    }
  }
  EXPECT_TRUE(at::equal(a->flat_params(), b->flat_params()));
  EXPECT_FALSE(at::equal(a->flat_params(), make()->flat_params()));  // it trained
  EXPECT_EQ(b->global_step(), 12);  // 6 batches an epoch, one step each
}

TEST(Fabric, AccumulationAndClippingEqualTheTrainers) {
  auto loader = volt_test::loader(volt_test::blobs(112), 16);  // 7 batches: a short last group
  auto [a, b] = twins();
  fit_with_trainer(*a, loader, 2, "32-true", /*accum=*/3, /*clip=*/0.05);
  fit_with_fabric(b, loader, 2, "32-true", 3, 0.05);
  EXPECT_TRUE(at::equal(a->flat_params(), b->flat_params()));
}

// A plain torch::nn::Module (not a volt::Module): Fabric's loop is the plain libtorch loop.
TEST(Fabric, APlainModuleTrainsAsAHandWrittenLoop) {
  auto make = [] {
    torch::manual_seed(5);
    return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::ReLU(),
                                 torch::nn::Linear(16, 2));
  };
  auto loader = volt_test::loader(volt_test::blobs(64), 16);
  auto by_hand = make();
  torch::optim::SGD hand_opt(by_hand->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  auto with_fabric = make();
  auto opt = std::make_shared<torch::optim::SGD>(with_fabric->parameters(),
                                                 torch::optim::SGDOptions(0.1).momentum(0.9));
  volt::Fabric fabric(cpu());
  fabric.setup(with_fabric, {opt});
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    volt::BatchStream s1 = loader.stream(epoch);
    for (volt::Batch b; s1.next(b);) {
      torch::cross_entropy_loss(by_hand->forward(b.input), b.target).backward();
      hand_opt.step();
      hand_opt.zero_grad();
    }
    volt::BatchStream s2 = fabric.setup_dataloader(loader).stream(epoch);
    for (volt::Batch b; s2.next(b);) {
      fabric.backward(torch::cross_entropy_loss(with_fabric->forward(b.input), b.target));
      EXPECT_TRUE(fabric.step(*opt));
      fabric.zero_grad(*opt);
    }
  }
  const auto pa = by_hand->parameters(), pb = with_fabric->parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(at::equal(pa[i], pb[i])) << i;
  // The held module names its tensors as the program's module does (no prefix).
  volt_test::TempDir dir;
  volt::FabricState state;
  state.module("model", *with_fabric);
  fabric.save(dir / "f.ckpt", state);
  auto plain = make();
  volt::load_weights(*plain, dir / "f.ckpt");  // strict: every name must match
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(at::equal(plain->parameters()[i], pb[i]));
}

// bf16-true converts the module the program holds (its own tensors, through the held module).
TEST(Fabric, BF16TrueConvertsTheProgramsModule) {
  auto net = torch::nn::Linear(4, 2);
  auto opt = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1));
  volt::Fabric fabric(cpu().precision("bf16-true"));
  fabric.setup(net, {opt});
  EXPECT_EQ(net->weight.scalar_type(), at::kBFloat16);
  EXPECT_EQ(opt->param_groups()[0].params()[0].scalar_type(), at::kBFloat16);
}

// init_module() builds a bf16-true model in bfloat16 from the start: the only tensor memory the
// build allocates is the bf16 parameters' (built in fp32 and converted, the peak is about three
// times that); under the mixed precisions the weights stay fp32. The default dtype comes back.
TEST(Fabric, InitModuleBuildsInTheDtypeThePrecisionTrains) {
  volt::install_counting_cpu_allocator();
  constexpr int64_t kIn = 512, kOut = 256, kBf16Bytes = 2 * (kIn * kOut + kOut);
  auto build = [&](volt::Fabric& fabric, bool inside) {
    torch::manual_seed(3);
    volt::reset_cpu_memory_peaks();
    const int64_t before = volt::cpu_memory_stats().in_use;
    torch::nn::Linear net{nullptr};
    {
      auto init = inside ? fabric.init_module() : nullptr;
      net = torch::nn::Linear(kIn, kOut);
    }
    fabric.setup(net);
    return std::make_pair(net, volt::cpu_memory_stats().max_in_use - before);
  };
  volt::Fabric bf16_true(cpu().precision("bf16-true")), converted(cpu().precision("bf16-true"));
  const auto [inside, inside_peak] = build(bf16_true, true);
  const auto [outside, outside_peak] = build(converted, false);
  EXPECT_EQ(at::get_default_dtype(), caffe2::TypeMeta::Make<float>());
  EXPECT_EQ(inside->weight.scalar_type(), at::kBFloat16);
  EXPECT_EQ(inside->bias.scalar_type(), at::kBFloat16);
  EXPECT_EQ(outside->weight.scalar_type(), at::kBFloat16);
  EXPECT_EQ(inside_peak, kBf16Bytes);
  // Built in fp32 then converted one by one: the fp32 parameters and the weight's bf16 copy.
  EXPECT_EQ(outside_peak, 4 * (kIn * kOut + kOut) + 2 * kIn * kOut);
  // The model trains: a step through the Fabric moves its bf16 weights.
  volt::Fabric trains(cpu().precision("bf16-true"));
  torch::nn::Linear net{nullptr};
  {
    auto init = trains.init_module();
    net = torch::nn::Linear(4, 2);
  }
  auto sgd = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1));
  trains.setup(net, {sgd});
  const at::Tensor before = net->weight.detach().clone();
  {
    auto tensors = trains.init_tensor();
    const at::Tensor x = at::ones({3, 4});
    EXPECT_EQ(x.scalar_type(), at::kBFloat16);
    at::Tensor loss;
    {
      auto forward = trains.forward_context(net);
      loss = net->forward(x).pow(2).mean();
    }
    trains.backward(loss);
  }
  EXPECT_TRUE(trains.step(*sgd));
  EXPECT_FALSE(at::equal(before, net->weight.detach()));
  EXPECT_EQ(net->weight.scalar_type(), at::kBFloat16);
  // Weights that stay fp32: nothing changes.
  for (const std::string precision : {"32-true", "bf16-mixed", "fp8"}) {
    volt::Fabric fabric(cpu().precision(precision));
    auto init = fabric.init_module();
    EXPECT_EQ(init, nullptr) << precision;
    EXPECT_EQ(torch::nn::Linear(2, 2)->weight.scalar_type(), at::kFloat) << precision;
  }
  // An exception inside restores the default dtype too.
  EXPECT_THROW(
      {
        auto init = bf16_true.init_module();
        throw std::runtime_error("model constructor failed");
      },
      std::runtime_error);
  EXPECT_EQ(at::empty({1}).scalar_type(), at::kFloat);
}

// init_module(true) (Lightning's empty_init=True): no initializer runs on the parameters (the
// generator draws nothing for them) and fabric.load gives the model its weights; with bf16-true
// the parameters are bfloat16 as well.
TEST(Fabric, InitModuleWithEmptyInitLeavesTheWeightsToTheCheckpoint) {
  volt_test::TempDir dir;
  torch::manual_seed(11);
  auto ref = std::make_shared<TinyClassifier>();
  {
    volt::Fabric fabric(cpu().precision("bf16-true"));
    fabric.setup(ref);
    volt::FabricState state;
    fabric.save(dir / "ref.ckpt", state.module("model", *ref));
  }
  volt::Fabric fabric(cpu().precision("bf16-true"));
  torch::manual_seed(5);
  const at::Tensor fresh = torch::rand({8});
  torch::manual_seed(5);
  std::shared_ptr<TinyClassifier> empty;
  {
    auto init = fabric.init_module(/*empty_init=*/true);
    ASSERT_NE(init, nullptr);
    EXPECT_TRUE(volt::EmptyInit::active());
    empty = std::make_shared<TinyClassifier>();
  }
  EXPECT_FALSE(volt::EmptyInit::active());
  EXPECT_TRUE(torch::equal(torch::rand({8}), fresh)) << "an initializer ran";
  EXPECT_EQ(empty->fc1->weight.scalar_type(), at::kBFloat16);
  EXPECT_EQ(at::empty({1}).scalar_type(), at::kFloat);
  fabric.setup(empty);
  volt::FabricState state;
  fabric.load(dir / "ref.ckpt", state.module("model", *empty));
  EXPECT_TRUE(torch::equal(empty->flat_params(), ref->flat_params()));
  // Under 32-true the guard alone (the precision has no context of its own).
  volt::Fabric fp32(cpu());
  auto init = fp32.init_module(true);
  EXPECT_NE(init, nullptr);
  EXPECT_TRUE(volt::EmptyInit::active());
}

// Under a strategy that splits one module (`fabric`'s): `net` set up with SGD, a second module is
// a ConfigError saying `why`, and a step (forward in the module's context, backward, norm
// clipping) moves the weights.
void expect_one_module_that_trains(volt::Fabric& fabric, torch::nn::Sequential net,
                                   const std::string& why) {
  auto opt = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1));
  fabric.setup(net, {opt});
  EXPECT_NE(error_of<volt::ConfigError>([&] { fabric.setup(torch::nn::Linear(4, 2)); }).find(why),
            std::string::npos);
  at::Tensor loss;
  {
    auto forward = fabric.forward_context(net);
    loss = net->forward(at::ones({4, 4})).pow(2).mean();
  }
  fabric.backward(loss);
  fabric.clip_gradients(*opt, 1.0);
  const at::Tensor before = net->parameters()[0].detach().clone();
  EXPECT_TRUE(fabric.step(*opt));
  EXPECT_FALSE(at::equal(before, net->parameters()[0].detach()));
}

// The pipeline strategy under Fabric splits one module holding one volt::Pipeline: a module
// without one is the strategy's ConfigError, a second module Fabric's. In one process the
// pipeline is one stage and the loop trains.
TEST(Fabric, PipelineTakesOneModuleHoldingOnePipeline) {
  VOLT_REQUIRE_GLOO();
  {
    volt::Fabric fabric(cpu().strategy("pipeline"));
    EXPECT_NE(error_of<volt::ConfigError>([&] {
                fabric.setup(torch::nn::Linear(4, 2));
              }).find("holds 0 volt::Pipeline layers"),
              std::string::npos);
  }
  volt::Fabric fabric(cpu().strategy("pipeline"));
  expect_one_module_that_trains(
      fabric,
      torch::nn::Sequential(
          volt::Pipeline(torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::Tanh(),
                                               torch::nn::Linear(8, 2)),
                         volt::PipelineOptions().chunks(2))),
      "the pipeline strategy splits one module's pipeline");
}

// A volt::Module is used as it is: its backward hook runs.
class CountingBackward : public TinyClassifier {
 public:
  void backward(const at::Tensor& loss) override {
    ++calls;
    loss.backward();
  }
  int calls = 0;
};

TEST(Fabric, AVoltModulesBackwardHookRuns) {
  auto m = std::make_shared<CountingBackward>();
  auto opt = m->configure_optimizers()[0].optimizer();
  volt::Fabric fabric(cpu());
  fabric.setup(m, {opt});
  volt::Batch b;
  volt::BatchStream s = volt_test::loader(volt_test::blobs(32), 16).stream(0);
  ASSERT_TRUE(s.next(b));
  fabric.backward(loss_of(*m, b));
  EXPECT_EQ(m->calls, 1);
  EXPECT_TRUE(m->fc1->weight.grad().defined());
}

// A generator and a discriminator, each with its own optimizer (SGD with momentum).
struct Gan {
  torch::nn::Sequential g{torch::nn::Linear(4, 16), torch::nn::Tanh(), torch::nn::Linear(16, 8)};
  torch::nn::Sequential d{torch::nn::Linear(8, 16), torch::nn::Tanh(), torch::nn::Linear(16, 1)};
  std::shared_ptr<torch::optim::SGD> opt_g = std::make_shared<torch::optim::SGD>(
      g->parameters(), torch::optim::SGDOptions(0.05).momentum(0.5));
  std::shared_ptr<torch::optim::SGD> opt_d = std::make_shared<torch::optim::SGD>(
      d->parameters(), torch::optim::SGDOptions(0.05).momentum(0.5));
  at::Tensor flat() const {
    std::vector<at::Tensor> all;
    for (const auto& p : g->parameters()) all.push_back(p.detach().reshape({-1}));
    for (const auto& p : d->parameters()) all.push_back(p.detach().reshape({-1}));
    return at::cat(all);
  }
};

// How gan_loop trains: plain libtorch by default, or through a Fabric (through()).
struct GanCalls {
  std::function<void(const at::Tensor&)> backward = [](const at::Tensor& loss) { loss.backward(); };
  std::function<void(torch::optim::Optimizer&)> step = [](torch::optim::Optimizer& o) { o.step(); };
  std::function<void(torch::optim::Optimizer&)> zero_grad = [](torch::optim::Optimizer& o) {
    o.zero_grad();
  };
  // Held around each module's forwards.
  std::function<std::shared_ptr<void>(torch::nn::Module&)> context = [](torch::nn::Module&) {
    return std::shared_ptr<void>();
  };
};

GanCalls through(volt::Fabric& fabric) {
  GanCalls c;
  c.backward = [&fabric](const at::Tensor& loss) { fabric.backward(loss); };
  c.step = [&fabric](torch::optim::Optimizer& o) { fabric.step(o); };
  c.zero_grad = [&fabric](torch::optim::Optimizer& o) { fabric.zero_grad(o); };
  c.context = [&fabric](torch::nn::Module& m) { return fabric.forward_context(m); };
  return c;
}

// The alternating GAN loop: the discriminator's loss over a detached fake, then the generator's
// through the discriminator.
void gan_loop(Gan& m, int64_t steps, const GanCalls& calls = {}) {
  const auto bce = [](const at::Tensor& logits, double target) {
    return torch::binary_cross_entropy_with_logits(logits, at::full_like(logits, target));
  };
  auto loader = volt_test::loader(volt_test::blobs(64, 8), 16);
  int64_t i = 0;
  for (volt::Batch& b : loader.stream(0)) {
    if (i++ == steps) break;
    const at::Tensor z = at::sin(b.input.narrow(1, 0, 4) * 3);
    calls.zero_grad(*m.opt_d);
    at::Tensor fake, loss_d, loss_g;
    {
      auto context = calls.context(*m.g);
      fake = m.g->forward(z);
    }
    {
      auto context = calls.context(*m.d);
      loss_d = bce(m.d->forward(b.input), 1) + bce(m.d->forward(fake.detach()), 0);
    }
    calls.backward(loss_d);
    calls.step(*m.opt_d);
    calls.zero_grad(*m.opt_g);
    calls.zero_grad(*m.opt_d);
    {
      auto context = calls.context(*m.d);
      loss_g = bce(m.d->forward(fake), 1);
    }
    calls.backward(loss_g);
    calls.step(*m.opt_g);
  }
}

TEST(Fabric, SeveralModulesTrainAsAHandWrittenLoop) {
  torch::manual_seed(5);
  Gan plain;
  torch::manual_seed(5);
  Gan with_fabric;
  gan_loop(plain, 4);
  volt::Fabric fabric(cpu());
  fabric.setup(with_fabric.g, {with_fabric.opt_g});
  fabric.setup(with_fabric.d, {with_fabric.opt_d});
  gan_loop(with_fabric, 4, through(fabric));
  EXPECT_TRUE(at::equal(plain.flat(), with_fabric.flat()));
}

// Under ZeRO each module keeps its own engines, and a backward arms only those of the modules
// its loss reaches: with ignore_unused_parameters off, an engine armed for the discriminator's
// loss (over a detached fake) would find the generator's parameters without a gradient and
// throw. Stages 2 and 3 in one process train as the hand-written loop.
TEST(Fabric, ZeroTrainsSeveralModulesAsAHandWrittenLoop) {
  VOLT_REQUIRE_GLOO();
  torch::manual_seed(5);
  Gan plain;
  gan_loop(plain, 4);
  for (const std::string stage : {"deepspeed_stage_2", "deepspeed_stage_3"}) {
    torch::manual_seed(5);
    Gan zero;
    volt::Fabric fabric(
        cpu().strategy(volt::named<volt::Strategy>(stage, {{"ignore_unused_parameters", false}})));
    fabric.setup(zero.g, {zero.opt_g});
    fabric.setup(zero.d, {zero.opt_d});
    gan_loop(zero, 4, through(fabric));
    EXPECT_TRUE(at::allclose(plain.flat(), zero.flat(), 0, 1e-6))
        << stage << ": " << (plain.flat() - zero.flat()).abs().max().item<double>();
  }
}

// Stage 3 with the optimizer state and the parameter chunks swapped to NVMe files: each module's
// engine and swapper has its own files in the run's folder (numbered across modules), and the
// folder is gone when the Fabric is destroyed.
TEST(Fabric, ZeroNvmeOffloadGivesEachModuleItsOwnSwapFiles) {
  VOLT_REQUIRE_GLOO();
  torch::manual_seed(5);
  Gan plain;
  gan_loop(plain, 4);
  volt_test::TempDir nvme;
  torch::manual_seed(5);
  Gan zero;
  {
    volt::Fabric fabric(cpu().strategy(volt::named<volt::Strategy>(
        "deepspeed_stage_3_offload_nvme",
        {{"nvme_path", nvme.path}, {"param_persistence_threshold", int64_t{0}}})));
    fabric.setup(zero.g, {zero.opt_g});
    fabric.setup(zero.d, {zero.opt_d});
    gan_loop(zero, 4, through(fabric));
    const auto& ds = dynamic_cast<const volt::DeepSpeedStrategy&>(fabric.strategy());
    EXPECT_EQ(files_in(ds.nvme_folder()),
              (std::vector<std::string>{"optimizer0.swp", "optimizer1.swp", "owner.lock",
                                        "parameters0.swp", "parameters1.swp"}));
  }
  EXPECT_TRUE(std::filesystem::is_empty(nvme.path));
  EXPECT_TRUE(at::allclose(plain.flat(), zero.flat(), 0, 1e-6))
      << (plain.flat() - zero.flat()).abs().max().item<double>();
}

// A setup() that fails part-way leaves the module alive for the strategy's teardown: DeepSpeed's
// inference dtype casts a plain module to bfloat16 in setup_module, then refuses the optimizer
// (NotAvailable); the Fabric's teardown casts it back. Before session 99 the held copy of the
// plain module was freed when setup() threw, and the teardown called into freed memory.
TEST(Fabric, ASetupThatFailsPartWayKeepsTheModuleForTheTeardown) {
  VOLT_REQUIRE_GLOO();
  torch::manual_seed(5);
  auto lin = std::make_shared<torch::nn::LinearImpl>(4, 2);
  auto sgd = std::make_shared<torch::optim::SGD>(lin->parameters(), 0.1);
  {
    volt::Fabric fabric(cpu().strategy(
        volt::named<volt::Strategy>("deepspeed", {{"dtype", std::string("bfloat16")}})));
    EXPECT_THROW(fabric.setup(lin, {sgd}), volt::NotAvailable);
    EXPECT_EQ(lin->weight.scalar_type(), torch::kBFloat16);  // cast for the run
  }
  EXPECT_EQ(lin->weight.scalar_type(), torch::kFloat);  // and back at the teardown
}

// Loading a checkpoint replaces the optimizer's state, as torch's load_state_dict does: one
// saved before any step, loaded after two steps, leaves no momentum, so two more steps equal the
// first two. Under ZeRO the loaded shard kept the moments of the steps taken since (a chunk
// without state in the checkpoint was skipped), and the second pair stepped with them.
TEST(Fabric, LoadingAnUnsteppedCheckpointClearsTheOptimizersState) {
  VOLT_REQUIRE_GLOO();
  for (const std::string strategy : {"auto", "deepspeed_stage_1", "deepspeed_stage_2"}) {
    SCOPED_TRACE(strategy);
    torch::manual_seed(5);
    Gan ref;
    volt::Fabric plain(cpu());
    plain.setup(ref.g, {ref.opt_g});
    plain.setup(ref.d, {ref.opt_d});
    gan_loop(ref, 2, through(plain));

    torch::manual_seed(5);
    Gan m;
    volt_test::TempDir dir;
    volt::Fabric fabric(cpu().strategy(strategy));
    fabric.setup(m.g, {m.opt_g});
    fabric.setup(m.d, {m.opt_d});
    volt::FabricState state;
    state.module("g", *m.g)
        .module("d", *m.d)
        .optimizer("opt_g", *m.opt_g)
        .optimizer("opt_d", *m.opt_d);
    fabric.save(dir / "start.ckpt", state);
    gan_loop(m, 2, through(fabric));
    fabric.load(dir / "start.ckpt", state);
    gan_loop(m, 2, through(fabric));
    EXPECT_TRUE(at::allclose(m.flat(), ref.flat(), 0, 1e-6))
        << (m.flat() - ref.flat()).abs().max().item<double>();
  }
}

// A module set up without optimizers is only evaluated: stage 3 partitions its weights alone
// (ZeRO-Inference; at one rank into NVMe files, the first swap file of the run), a distillation
// loop trains the student as the hand-written loop does, and the teacher leaves whole and
// unchanged.
TEST(Fabric, ZeroPartitionsAModuleSetUpWithoutOptimizersForInference) {
  VOLT_REQUIRE_GLOO();
  const auto make = [] {
    torch::manual_seed(9);
    torch::nn::Sequential teacher(torch::nn::Linear(8, 32), torch::nn::Tanh(),
                                  torch::nn::Linear(32, 4));
    torch::nn::Sequential student(torch::nn::Linear(8, 4));
    return std::make_pair(teacher, student);
  };
  const auto flat = [](const torch::nn::Module& m) {
    std::vector<at::Tensor> all;
    for (const auto& p : m.parameters()) all.push_back(p.detach().reshape({-1}));
    return at::cat(all);
  };
  const auto distill = [](torch::nn::Sequential& teacher, torch::nn::Sequential& student,
                          torch::optim::Optimizer& opt, volt::Fabric* fabric) {
    auto loader = volt_test::loader(volt_test::blobs(64, 8), 16);
    for (volt::Batch& b : loader.stream(0)) {
      at::Tensor target, loss;
      {
        auto context = fabric ? fabric->forward_context(teacher) : nullptr;
        torch::NoGradGuard no_grad;
        target = teacher->forward(b.input);
      }
      {
        auto context = fabric ? fabric->forward_context(student) : nullptr;
        loss = torch::mse_loss(student->forward(b.input), target);
      }
      if (fabric) {
        fabric->backward(loss);
        fabric->step(opt);
        fabric->zero_grad(opt);
      } else {
        loss.backward();
        opt.step();
        opt.zero_grad();
      }
    }
  };
  auto [plain_teacher, plain_student] = make();
  torch::optim::SGD plain_opt(plain_student->parameters(), torch::optim::SGDOptions(0.1));
  distill(plain_teacher, plain_student, plain_opt, nullptr);

  auto [teacher, student] = make();
  const at::Tensor teacher_before = flat(*teacher);
  auto opt =
      std::make_shared<torch::optim::SGD>(student->parameters(), torch::optim::SGDOptions(0.1));
  volt_test::TempDir nvme;
  {
    volt::Fabric fabric(cpu().strategy(volt::named<volt::Strategy>(
        "deepspeed_stage_3_offload_nvme",
        {{"nvme_path", nvme.path}, {"param_persistence_threshold", int64_t{0}}})));
    fabric.setup(teacher);
    fabric.setup(student, {opt});
    EXPECT_EQ(teacher[0]->as<torch::nn::Linear>()->weight.storage().nbytes(), 0u);
    distill(teacher, student, *opt, &fabric);
    EXPECT_EQ(teacher[0]->as<torch::nn::Linear>()->weight.storage().nbytes(), 0u);
    const auto& ds = dynamic_cast<const volt::DeepSpeedStrategy&>(fabric.strategy());
    EXPECT_EQ(files_in(ds.nvme_folder()),
              (std::vector<std::string>{"optimizer1.swp", "owner.lock", "parameters0.swp",
                                        "parameters1.swp"}));
  }
  EXPECT_TRUE(torch::equal(flat(*teacher), teacher_before));
  EXPECT_TRUE(at::allclose(flat(*student), flat(*plain_student), 0, 1e-6))
      << (flat(*student) - flat(*plain_student)).abs().max().item<double>();
}

// bf16-mixed under ZeRO (master weights): each set-up module trains in bf16 against fp32
// masters, and each is fp32 again, with its masters' values, when the Fabric is destroyed.
TEST(Fabric, ZeroBf16MixedCastsEachModuleAndGivesEachItsMastersBack) {
  VOLT_REQUIRE_GLOO();
  torch::manual_seed(5);
  Gan m;
  {
    volt::Fabric fabric(cpu().strategy("deepspeed_stage_2").precision("bf16-mixed"));
    fabric.setup(m.g, {m.opt_g});
    fabric.setup(m.d, {m.opt_d});
    EXPECT_EQ(m.g->parameters()[0].scalar_type(), at::kBFloat16);
    EXPECT_EQ(m.d->parameters()[0].scalar_type(), at::kBFloat16);
    // A generator step through the discriminator, both modules stepping (the batch converted
    // by to_device, as the modules' dtype needs).
    for (int step = 0; step < 3; ++step) {
      volt::Batch b;
      b.input = at::randn({16, 4});
      b = fabric.to_device(b);
      at::Tensor loss;
      {
        auto forward_g = fabric.forward_context(m.g);
        auto forward_d = fabric.forward_context(m.d);
        loss = m.d->forward(m.g->forward(b.input)).pow(2).mean();
      }
      fabric.zero_grad(*m.opt_g);
      fabric.zero_grad(*m.opt_d);
      fabric.backward(loss);
      EXPECT_TRUE(fabric.step(*m.opt_g));
      EXPECT_TRUE(fabric.step(*m.opt_d));
    }
  }
  for (const auto& p : m.g->parameters()) EXPECT_EQ(p.scalar_type(), at::kFloat);
  for (const auto& p : m.d->parameters()) EXPECT_EQ(p.scalar_type(), at::kFloat);
  // The masters, not their bf16 roundings: some value is not a bf16 number.
  const at::Tensor w = m.d->parameters()[0].detach();
  EXPECT_FALSE(at::equal(w, w.to(at::kBFloat16).to(at::kFloat)));
}

// With several modules, backward finds the ones the loss reaches; the first of them (in setup
// order) gives the backward hook.
TEST(Fabric, BackwardRunsTheHookOfTheFirstModuleTheLossReaches) {
  auto a = std::make_shared<CountingBackward>();
  auto b = std::make_shared<CountingBackward>();
  volt::Fabric fabric(cpu());
  fabric.setup(a, {a->configure_optimizers()[0].optimizer()});
  fabric.setup(b, {b->configure_optimizers()[0].optimizer()});
  volt::Batch batch;
  volt::BatchStream s = volt_test::loader(volt_test::blobs(32), 16).stream(0);
  ASSERT_TRUE(s.next(batch));
  fabric.backward(loss_of(*b, batch));
  EXPECT_EQ(a->calls, 0);
  EXPECT_EQ(b->calls, 1);
  EXPECT_FALSE(a->fc1->weight.grad().defined());
  fabric.backward(loss_of(*a, batch) + loss_of(*b, batch));
  EXPECT_EQ(a->calls, 1);
  EXPECT_EQ(b->calls, 1);
  EXPECT_TRUE(a->fc1->weight.grad().defined());
  // A loss over neither module still backpropagates (into its own leaf).
  const at::Tensor leaf = at::ones({2}).requires_grad_();
  fabric.backward(leaf.sum() * 3);
  EXPECT_TRUE(at::equal(leaf.grad(), at::full({2}, 3.0)));
  EXPECT_EQ(a->calls + b->calls, 2);
}

TEST(Fabric, SeveralModulesSaveAndLoad) {
  volt_test::TempDir dir;
  auto [g, g_again] = twins();
  auto [d, d_again] = twins();
  {
    torch::NoGradGuard no_grad;  // the discriminator starts elsewhere than the generator
    for (auto& p : d->parameters()) p.mul_(0.5);
    for (auto& p : d_again->parameters()) p.mul_(0.5);
  }
  auto opt_g = g->configure_optimizers()[0].optimizer();
  auto opt_d = d->configure_optimizers()[0].optimizer();
  auto loader = volt_test::loader(volt_test::blobs(64), 16);
  const auto train = [&](volt::Fabric& fabric, TinyClassifier& gm, TinyClassifier& dm,
                         torch::optim::Optimizer& og, torch::optim::Optimizer& od, int64_t epoch) {
    for (volt::Batch& b : loader.stream(epoch)) {
      fabric.backward(loss_of(gm, b) + loss_of(dm, b) * 0.5);
      fabric.step(og);
      fabric.step(od);
      fabric.zero_grad(og);
      fabric.zero_grad(od);
    }
  };
  {
    volt::Fabric fabric(cpu());
    fabric.setup(g, {opt_g});
    fabric.setup(d, {opt_d});
    train(fabric, *g, *d, *opt_g, *opt_d, 0);
    at::Tensor rng = at::detail::getDefaultCPUGenerator().get_state();  // dropout's stream
    volt::FabricState state;
    state.module("g", *g).module("d", *d).optimizer("opt_g", *opt_g).optimizer("opt_d", *opt_d);
    fabric.save(dir / "gan.ckpt", state.tensor("rng", rng));
    train(fabric, *g, *d, *opt_g, *opt_d, 1);
  }
  // The first module of the state is where load_weights (a Trainer checkpoint's) looks.
  auto weights_only = std::make_shared<TinyClassifier>();
  volt::load_weights(*weights_only, dir / "gan.ckpt");
  volt::Fabric fabric(cpu());
  auto og = g_again->configure_optimizers()[0].optimizer();
  auto od = d_again->configure_optimizers()[0].optimizer();
  fabric.setup(g_again, {og});
  fabric.setup(d_again, {od});
  at::Tensor rng;
  volt::FabricState state;
  state.module("g", *g_again).module("d", *d_again).optimizer("opt_g", *og).optimizer("opt_d", *od);
  fabric.load(dir / "gan.ckpt", state.tensor("rng", rng));
  at::Generator cpu_gen = at::detail::getDefaultCPUGenerator();
  cpu_gen.set_state(rng);
  EXPECT_TRUE(at::equal(weights_only->flat_params(), g_again->flat_params()));
  EXPECT_FALSE(at::equal(g_again->flat_params(), d_again->flat_params()));
  train(fabric, *g_again, *d_again, *og, *od, 1);
  // Both modules' weights and both optimizers' momentum came back.
  EXPECT_TRUE(at::equal(g->flat_params(), g_again->flat_params()));
  EXPECT_TRUE(at::equal(d->flat_params(), d_again->flat_params()));
  volt::FabricState renamed;
  renamed.module("g", *g_again).module("critic", *d_again);
  const std::string e =
      error_of<volt::CheckpointError>([&] { fabric.load(dir / "gan.ckpt", renamed); });
  EXPECT_NE(e.find("has no module 'critic'"), std::string::npos) << e;
}

TEST(Fabric, SaveAndLoadResumeBitForBit) {
  volt_test::TempDir dir;
  auto loader = volt_test::loader(volt_test::blobs(96), 16);
  // Uninterrupted: 2 epochs. Interrupted: 1 epoch, saved, then a new Fabric and module load it.
  auto [full, first] = twins();
  fit_with_fabric(full, loader, 2, "32-true");
  auto run_epoch = [&](volt::Fabric& fabric, TinyClassifier& m, torch::optim::Optimizer& opt,
                       int64_t epoch) {
    volt::BatchStream s = loader.stream(epoch);
    for (volt::Batch b; s.next(b);) {
      fabric.backward(loss_of(m, b));
      fabric.step(opt);
      fabric.zero_grad(opt);
    }
  };
  at::Tensor rng;
  {
    volt::seed_everything(123);
    volt::Fabric fabric(cpu());
    auto opt = first->configure_optimizers()[0].optimizer();
    fabric.setup(first, {opt});
    run_epoch(fabric, *first, *opt, 0);
    rng = at::detail::getDefaultCPUGenerator().get_state();
    volt::FabricState state;
    state.module("model", *first)
        .optimizer("opt", *opt)
        .value("epoch", int64_t{1})
        .tensor("rng", rng);
    fabric.save(dir / "mid.ckpt", state);
  }
  torch::manual_seed(99);  // the resumed process starts elsewhere
  auto resumed = std::make_shared<TinyClassifier>();
  volt::Fabric fabric(cpu());
  auto opt = resumed->configure_optimizers()[0].optimizer();
  fabric.setup(resumed, {opt});
  at::Tensor restored_rng = at::zeros_like(rng);
  volt::FabricState state;
  state.module("model", *resumed)
      .optimizer("opt", *opt)
      .value("epoch", int64_t{0})
      .tensor("rng", restored_rng);
  fabric.load(dir / "mid.ckpt", state);
  EXPECT_EQ(state.value("epoch").toInt(), 1);
  ASSERT_TRUE(at::equal(restored_rng, rng));
  at::Generator cpu_gen = at::detail::getDefaultCPUGenerator();  // a handle: const accessor
  cpu_gen.set_state(restored_rng);
  run_epoch(fabric, *resumed, *opt, 1);
  // Momentum buffers travelled too: without them the second epoch would step differently.
  EXPECT_TRUE(at::equal(full->flat_params(), resumed->flat_params()));
}

TEST(Fabric, LoadIsStrictAndLeavesTheStateWhenEntriesAreMissing) {
  volt_test::TempDir dir;
  auto m = std::make_shared<TinyClassifier>();
  auto opt = m->configure_optimizers()[0].optimizer();
  volt::Fabric fabric(cpu());
  fabric.setup(m, {opt});
  volt::FabricState saved;
  saved.module("model", *m).value("step", int64_t{7});
  fabric.save(dir / "a.ckpt", saved);
  const at::Tensor before = m->flat_params();
  {
    torch::NoGradGuard no_grad;
    for (auto& p : m->parameters()) p.add_(1.0);
  }
  const at::Tensor changed = m->flat_params();
  volt::FabricState wants;
  wants.module("model", *m).optimizer("opt", *opt).value("step", int64_t{0}).value("best", 0.5);
  const std::string e =
      error_of<volt::CheckpointError>([&] { fabric.load(dir / "a.ckpt", wants); });
  EXPECT_NE(e.find("optimizer 'opt', value 'best'"), std::string::npos) << e;
  EXPECT_NE(e.find("strict=false"), std::string::npos) << e;
  EXPECT_TRUE(at::equal(m->flat_params(), changed));  // nothing was loaded
  EXPECT_EQ(wants.value("step").toInt(), 0);
  fabric.load(dir / "a.ckpt", wants, /*strict=*/false);
  EXPECT_TRUE(at::equal(m->flat_params(), before));
  EXPECT_EQ(wants.value("step").toInt(), 7);
  EXPECT_DOUBLE_EQ(wants.value("best").toDouble(), 0.5);  // absent from the file: kept
}

// A state entry named as a word TorchScript reserves (in, class, None, ...) saved without a
// complaint before session 99, and libtorch could never read the file back ("expected ident"):
// refused when named. A name merely containing one is fine.
TEST(Fabric, AStateEntryNamedAsAReservedWordIsRefusedWhenNamed) {
  volt::FabricState state;
  at::Tensor t = torch::ones({2});
  for (const char* word : {"in", "class", "None", "if"}) {
    EXPECT_NE(error_of<volt::ConfigError>([&] {
                state.value(word, int64_t{1});
              }).find("is a word TorchScript reserves"),
              std::string::npos)
        << word;
  }
  EXPECT_NE(error_of<volt::ConfigError>([&] {
              state.tensor("for", t);
            }).find("state entry name 'for' is a word TorchScript reserves"),
            std::string::npos);
  volt_test::TempDir dir;
  auto m = std::make_shared<TinyClassifier>();
  volt::Fabric fabric(cpu());
  fabric.setup(m);
  volt::FabricState ok;
  ok.module("class_model", *m).value("in_", int64_t{3});
  fabric.save(dir / "a.ckpt", ok);
  volt::FabricState back;
  back.module("class_model", *m).value("in_", int64_t{0});
  fabric.load(dir / "a.ckpt", back);
  EXPECT_EQ(back.value("in_").toInt(), 3);
}

// strict also covers a module's weights (Lightning's load_state_dict(strict=strict)): a module
// with a parameter the file lacks is refused by default and takes the rest with strict=false.
TEST(Fabric, LoadStrictFalseLoadsTheWeightsThatMatch) {
  struct WithExtra : TinyClassifier {
    WithExtra() { extra = register_parameter("extra", torch::full({2}, 3.0f)); }
    torch::Tensor extra;
  };
  volt_test::TempDir dir;
  auto m = std::make_shared<TinyClassifier>();
  volt::Fabric fabric(cpu());
  fabric.setup(m);
  volt::FabricState saved;
  saved.module("model", *m);
  fabric.save(dir / "a.ckpt", saved);
  auto wider = std::make_shared<WithExtra>();
  fabric.setup(wider);
  const at::Tensor before = wider->flat_params();
  volt::FabricState wants;
  wants.module("model", *wider);
  const std::string e =
      error_of<volt::CheckpointError>([&] { fabric.load(dir / "a.ckpt", wants); });
  EXPECT_NE(e.find("missing 'extra'"), std::string::npos) << e;
  EXPECT_TRUE(at::equal(wider->flat_params(), before));
  fabric.load(dir / "a.ckpt", wants, /*strict=*/false);
  EXPECT_TRUE(at::equal(wider->fc1->weight, m->fc1->weight));
  EXPECT_TRUE(at::equal(wider->extra, torch::full({2}, 3.0f)));
}

TEST(Fabric, AFabricCheckpointIsReadByTheTrainerButNotResumed) {
  volt_test::TempDir dir;
  auto [m, other] = twins();
  auto opt = m->configure_optimizers()[0].optimizer();
  volt::Fabric fabric(cpu());
  fabric.setup(m, {opt});
  volt::FabricState state;
  state.module("model", *m).optimizer("opt", *opt);
  fabric.save(dir / "f.ckpt", state);
  auto loader = volt_test::loader(volt_test::blobs(32), 16);
  // validate with ckpt_path reads the weights: the same metrics as the saved module's own.
  const auto own = volt::Trainer(volt_test::quiet(dir / "v1")).validate(*m, loader);
  const auto read =
      volt::Trainer(volt_test::quiet(dir / "v2")).validate(*other, loader, dir / "f.ckpt");
  EXPECT_DOUBLE_EQ(own.at("val_loss"), read.at("val_loss"));
  const std::string e = error_of<volt::CheckpointError>([&] {
    volt::Trainer(volt_test::quiet(dir / "fit").max_epochs(1))
        .fit(*other, loader, c10::nullopt, dir / "f.ckpt");
  });
  EXPECT_NE(e.find("weights only"), std::string::npos) << e;
}

TEST(Fabric, ATrainerCheckpointIsNotAFabricOne) {
  volt_test::TempDir dir;
  auto m = std::make_shared<TinyClassifier>();
  volt::Trainer trainer(volt_test::quiet(dir.path).max_epochs(1));
  trainer.fit(*m, volt_test::loader(volt_test::blobs(32), 16));
  trainer.save_checkpoint(dir / "t.ckpt");
  auto opt = m->configure_optimizers()[0].optimizer();
  volt::Fabric fabric(cpu());
  fabric.setup(m, {opt});
  volt::FabricState state;
  state.module("model", *m);
  const std::string e =
      error_of<volt::CheckpointError>([&] { fabric.load(dir / "t.ckpt", state); });
  EXPECT_NE(e.find("not written by Fabric::save"), std::string::npos) << e;
  EXPECT_NE(e.find("load_weights"), std::string::npos) << e;
  const std::string missing =
      error_of<volt::CheckpointError>([&] { fabric.load(dir / "none.ckpt", state); });
  EXPECT_NE(missing.find("none.ckpt"), std::string::npos) << missing;
}

TEST(Fabric, LoggersGetWhatTheLoopLogs) {
  auto logger = std::make_shared<volt_test::MemoryLogger>();
  volt::Fabric fabric(cpu().loggers({logger}));
  fabric.log("loss", 0.25, 3);
  fabric.log_dict({{"a", 1.0}, {"b", 2.0}}, 4);
  ASSERT_EQ(logger->records.size(), 2u);
  EXPECT_EQ(logger->records[0].first, 3);
  EXPECT_DOUBLE_EQ(logger->records[0].second.at("loss"), 0.25);
  EXPECT_DOUBLE_EQ(logger->records[1].second.at("b"), 2.0);
}

// Lightning's state saves any object with a state_dict (an LR scheduler); volt's FabricState had
// no place for one, and a resumed loss-scaled run started its scale again from init_scale.
TEST(Fabric, SchedulersAndTheLossScaleResumeWithTheState) {
  volt_test::TempDir dir;
  auto loader = volt_test::loader(volt_test::blobs(48), 16);  // 3 batches
  const auto scaled = [] {
    return std::make_shared<volt::MixedPrecision>(
        volt::MixedPrecisionOptions().loss_scaling(true).scaler(
            volt::GradScalerOptions().init_scale(256.0).growth_interval(2)));
  };
  auto [m, again] = twins();
  auto first = scaled();
  std::vector<double> lrs;
  {
    volt::Fabric fabric(cpu().precision(first));
    auto opt = m->configure_optimizers()[0].optimizer();
    fabric.setup(m, {opt});
    volt::StepLR sched(*opt, 1, 0.5);
    for (volt::Batch& b : loader.stream(0)) {
      fabric.backward(loss_of(*m, b));
      fabric.step(*opt);
      fabric.zero_grad(*opt);
      sched.step();
    }
    EXPECT_DOUBLE_EQ(first->scaler()->current_scale(), 512.0);  // grown once in 3 steps
    volt::FabricState state;
    state.module("model", *m).optimizer("opt", *opt).scheduler("sched", sched);
    fabric.save(dir / "s.ckpt", state);
    sched.step();
    lrs = sched.last_lrs();
  }
  auto second = scaled();
  volt::Fabric resumed(cpu().precision(second));
  auto opt = again->configure_optimizers()[0].optimizer();
  resumed.setup(again, {opt});
  volt::StepLR sched(*opt, 1, 0.5);
  volt::FabricState state;
  state.module("model", *again).optimizer("opt", *opt).scheduler("sched", sched);
  resumed.load(dir / "s.ckpt", state);
  EXPECT_DOUBLE_EQ(second->scaler()->current_scale(), 512.0);
  sched.step();
  EXPECT_EQ(sched.last_lrs(), lrs);
  // Weights alone leave this run's scale; a scheduler the file lacks is missing.
  auto third = scaled();
  volt::Fabric other(cpu().precision(third));
  auto [student, unused] = twins();
  other.setup(student);
  volt::FabricState weights;
  weights.module("model", *student);
  other.load(dir / "s.ckpt", weights);
  EXPECT_DOUBLE_EQ(third->scaler()->current_scale(), 256.0);
  volt::StepLR stray(*opt, 1, 0.5);
  volt::FabricState lacking;
  lacking.module("model", *again).scheduler("warmup", stray);
  EXPECT_NE(error_of<volt::CheckpointError>([&] {
              resumed.load(dir / "s.ckpt", lacking);
            }).find("has no scheduler 'warmup'"),
            std::string::npos);
  // A scheduler of another type is refused before anything is loaded: the module keeps its
  // weights (they were loaded first, and the scheduler's own check failed after).
  auto fresh = std::make_shared<TinyClassifier>();
  auto fresh_opt = fresh->configure_optimizers()[0].optimizer();
  other.setup(fresh, {fresh_opt});
  const at::Tensor before = fresh->flat_params();
  ASSERT_FALSE(at::equal(before, again->flat_params()));
  volt::ExponentialLR exponential(*fresh_opt, 0.9);
  volt::FabricState mismatched;
  mismatched.module("model", *fresh).scheduler("sched", exponential);
  const std::string e =
      error_of<volt::CheckpointError>([&] { other.load(dir / "s.ckpt", mismatched); });
  EXPECT_NE(e.find("[Fabric] '" + dir / "s.ckpt" +
                   "' holds scheduler 'sched' of type StepLR, not ExponentialLR; load it into "
                   "a scheduler of that type (nothing was loaded)."),
            std::string::npos)
      << e;
  EXPECT_TRUE(at::equal(fresh->flat_params(), before));
  // So are an optimizer, and a scheduler, over another number of param groups (the file's have
  // one, these two).
  auto split = std::make_shared<TinyClassifier>();
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(split->fc1->parameters());
  groups.emplace_back(split->fc2->parameters());
  auto two = std::make_shared<torch::optim::SGD>(groups, torch::optim::SGDOptions(0.1));
  other.setup(split, {two});
  const at::Tensor split_before = split->flat_params();
  volt::StepLR over_two(*two, 1, 0.5);
  volt::FabricState grouped, scheduled;
  grouped.module("model", *split).optimizer("opt", *two);
  scheduled.module("model", *split).scheduler("sched", over_two);
  EXPECT_NE(error_of<volt::CheckpointError>([&] { other.load(dir / "s.ckpt", grouped); })
                .find("holds optimizer 'opt' with 1 param groups, not 2; load it into an "
                      "optimizer built the same way (nothing was loaded)."),
            std::string::npos);
  EXPECT_NE(error_of<volt::CheckpointError>([&] {
              other.load(dir / "s.ckpt", scheduled);
            }).find("holds scheduler 'sched' over 1 param groups, not 2"),
            std::string::npos);
  EXPECT_TRUE(at::equal(split->flat_params(), split_before));
}

// A chained scheduler whose part is of another type is found before anything is loaded (its own
// load found it after the modules and optimizers were loaded, and after its first part had
// loaded): the weights, the optimizer's lr and the scheduler's schedule stay as they were.
TEST(Fabric, AChainedSchedulerThatDoesNotLoadLeavesEverythingAsItWas) {
  volt_test::TempDir dir;
  auto loader = volt_test::loader(volt_test::blobs(48), 16);  // 3 batches
  auto [m, fresh] = twins();
  const auto chain = [](torch::optim::Optimizer& o, bool exponential_tail) {
    std::shared_ptr<volt::LRScheduler> tail;
    if (exponential_tail) {
      tail = std::make_shared<volt::ExponentialLR>(o, 0.9);
    } else {
      tail = std::make_shared<volt::ConstantLR>(o, 0.5, 2);
    }
    auto head = std::make_shared<volt::StepLR>(o, 1, 0.5);
    return std::make_shared<volt::SequentialLR>(
        o, std::vector<std::shared_ptr<volt::LRScheduler>>{head, tail}, std::vector<int64_t>{2});
  };
  {
    volt::Fabric fabric(cpu());
    auto opt = m->configure_optimizers()[0].optimizer();
    fabric.setup(m, {opt});
    auto sched = chain(*opt, /*exponential_tail=*/true);
    for (volt::Batch& b : loader.stream(0)) {
      fabric.backward(loss_of(*m, b));
      fabric.step(*opt);
      fabric.zero_grad(*opt);
      sched->step();
    }
    volt::FabricState state;
    state.module("model", *m).optimizer("opt", *opt).scheduler("sched", *sched);
    fabric.save(dir / "s.ckpt", state);
  }
  volt::Fabric other(cpu());
  auto opt = fresh->configure_optimizers()[0].optimizer();
  other.setup(fresh, {opt});
  auto sched = chain(*opt, /*exponential_tail=*/false);  // same type outside, another part
  sched->step();
  const at::Tensor before = fresh->flat_params();
  ASSERT_FALSE(at::equal(before, m->flat_params()));
  const double lr = opt->param_groups()[0].options().get_lr();
  const std::vector<double> last = sched->last_lrs();
  const int64_t epoch = sched->last_epoch();
  volt::FabricState state;
  state.module("model", *fresh).optimizer("opt", *opt).scheduler("sched", *sched);
  const std::string e = error_of<volt::CheckpointError>([&] { other.load(dir / "s.ckpt", state); });
  EXPECT_NE(e.find("[Fabric] '" + dir / "s.ckpt" +
                   "' holds a state of scheduler 'sched' that does not load into it: "),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("ExponentialLR"), std::string::npos) << e;
  EXPECT_NE(e.find("(nothing was loaded)."), std::string::npos) << e;
  EXPECT_TRUE(at::equal(fresh->flat_params(), before));
  EXPECT_DOUBLE_EQ(opt->param_groups()[0].options().get_lr(), lr);
  EXPECT_EQ(sched->last_lrs(), last);
  EXPECT_EQ(sched->last_epoch(), epoch);
  // The schedule goes on as a twin's that was never offered the file.
  auto twin_model = std::make_shared<TinyClassifier>();
  auto twin_opt = twin_model->configure_optimizers()[0].optimizer();
  auto twin = chain(*twin_opt, /*exponential_tail=*/false);
  twin->step();
  for (int i = 0; i < 3; ++i) {
    sched->step();
    twin->step();
    EXPECT_EQ(sched->last_lrs(), twin->last_lrs()) << "step " << i;
  }
}

// log()'s default step is the steps taken through step(), carried by save/load.
TEST(Fabric, LogStepsDefaultToTheStepsTakenAcrossASaveAndLoad) {
  volt_test::TempDir dir;
  auto loader = volt_test::loader(volt_test::blobs(48), 16);  // 3 batches
  auto logger = std::make_shared<volt_test::MemoryLogger>();
  auto [m, again] = twins();
  {
    volt::Fabric fabric(cpu().loggers({logger}));
    auto opt = m->configure_optimizers()[0].optimizer();
    fabric.setup(m, {opt});
    for (volt::Batch& b : loader.stream(0)) {
      fabric.backward(loss_of(*m, b));
      fabric.step(*opt);
      fabric.zero_grad(*opt);
    }
    fabric.log("x", 1.0);
    fabric.log("t", at::scalar_tensor(2.5));
    fabric.log("given", 1.0, 7);
    EXPECT_NE(
        error_of<volt::ValueError>([&] { fabric.log("v", at::ones({2})); }).find("one element"),
        std::string::npos);
    volt::FabricState state;
    state.module("model", *m).optimizer("opt", *opt);
    fabric.save(dir / "s.ckpt", state);
  }
  ASSERT_EQ(logger->records.size(), 3u);
  EXPECT_EQ(logger->records[0].first, 3);
  EXPECT_EQ(logger->records[1].first, 3);
  EXPECT_DOUBLE_EQ(logger->records[1].second.at("t"), 2.5);
  EXPECT_EQ(logger->records[2].first, 7);
  volt::Fabric resumed(cpu().loggers({logger}));
  auto opt = again->configure_optimizers()[0].optimizer();
  resumed.setup(again, {opt});
  volt::FabricState state;
  state.module("model", *again).optimizer("opt", *opt);
  resumed.load(dir / "s.ckpt", state);
  resumed.log("y", 1.0);
  EXPECT_EQ(logger->records.back().first, 3);
  EXPECT_EQ(again->global_step(), 3);
  // Weights alone (a teacher, a pretrained model) leave the run's count as it is: before
  // session 99 a student 1 step in took the file's 3.
  auto [student, teacher] = twins();
  volt::Fabric distilling(cpu().loggers({logger}));
  auto student_opt = student->configure_optimizers()[0].optimizer();
  distilling.setup(student, {student_opt});
  distilling.setup(teacher);
  for (volt::Batch& b : loader.stream(0)) {
    distilling.backward(loss_of(*student, b));
    distilling.step(*student_opt);
    break;
  }
  volt::FabricState weights;
  weights.module("model", *teacher);
  distilling.load(dir / "s.ckpt", weights);
  EXPECT_EQ(student->global_step(), 1);
  distilling.log("z", 1.0);
  EXPECT_EQ(logger->records.back().first, 1);
}

// A program that caught an error and gives up marks the run failed: the Fabric's teardown then
// tells the loggers so (before session 99 the strategy's flag was overwritten and the loggers
// heard "finished"; the teardown also ran the checkpoint flush, a collective under DDP).
TEST(Fabric, ARunTheProgramMarkedFailedEndsFailed) {
  struct Ends : volt_test::MemoryLogger {
    void finalize(volt::RunStatus status) override { ended.push_back(status); }
    std::vector<volt::RunStatus> ended;
  };
  auto failed = std::make_shared<Ends>(), finished = std::make_shared<Ends>();
  {
    volt::Fabric fabric(cpu().loggers({failed}));
    fabric.launch();
    fabric.strategy().set_run_failed(true);
  }
  {
    volt::Fabric fabric(cpu().loggers({finished}));
    fabric.launch();
  }
  EXPECT_EQ(failed->ended, (std::vector<volt::RunStatus>{volt::RunStatus::kFailed}));
  EXPECT_EQ(finished->ended, (std::vector<volt::RunStatus>{volt::RunStatus::kFinished}));
}

TEST(Fabric, CollectivesInOneProcessAreTheValue) {
  volt::Fabric fabric(cpu());
  const at::Tensor t = at::arange(3, at::kFloat);
  EXPECT_EQ(fabric.world_size(), 1);
  EXPECT_TRUE(fabric.is_global_zero());
  EXPECT_TRUE(at::equal(fabric.all_reduce(t), t));
  EXPECT_TRUE(at::equal(fabric.all_gather(t), t.unsqueeze(0)));
  EXPECT_TRUE(at::equal(fabric.broadcast(t), t));
  fabric.barrier();
  EXPECT_NE(error_of<volt::ValueError>([&] { fabric.broadcast(t, 1); }).find("ranks are 0..0"),
            std::string::npos);
  EXPECT_NE(error_of<volt::ValueError>([&] {
              fabric.all_reduce(at::Tensor());
            }).find("[Fabric] all_reduce() got an undefined tensor; pass a tensor on every rank."),
            std::string::npos);
  EXPECT_NE(error_of<volt::ValueError>([&] {
              fabric.all_gather(at::Tensor());
            }).find("all_gather() got an undefined tensor"),
            std::string::npos);
  EXPECT_NE(error_of<volt::ValueError>([&] {
              fabric.broadcast(at::Tensor());
            }).find("broadcast() got an undefined tensor"),
            std::string::npos);
  // What several processes refuse, one refuses too (an integer mean was the value here and a
  // ValueError at two processes).
  EXPECT_NE(error_of<volt::ValueError>([&] {
              fabric.all_reduce(at::arange(3), volt::Reduce::kMean);
            }).find("[Fabric] all_reduce with kMean needs a floating tensor, got Long"),
            std::string::npos);
  EXPECT_NE(error_of<volt::ValueError>([&] {
              fabric.all_reduce(at::ones({2}, at::kComplexFloat), volt::Reduce::kMax);
            }).find("takes kSum or kMean (complex numbers have no order)"),
            std::string::npos);
  EXPECT_NE(error_of<volt::ValueError>([&] {
              fabric.all_gather(at::eye(2).to_sparse());
            }).find("[Fabric] all_gather takes dense tensors"),
            std::string::npos);
}

// Two hook interfaces of a program's own, and callbacks with one, both, or neither.
struct EpochHooks : virtual volt::FabricCallback {
  virtual void on_epoch_end(int64_t epoch, double loss) = 0;
};
struct SaveHooks : virtual volt::FabricCallback {
  virtual int on_save(const std::string& path) const = 0;
};
struct Recorder : EpochHooks, SaveHooks {
  explicit Recorder(std::string name, std::vector<std::string>* out)
      : name(std::move(name)), out(out) {}
  void on_epoch_end(int64_t epoch, double loss) override {
    out->push_back(name + " epoch " + std::to_string(epoch) + " " + std::to_string(loss));
  }
  int on_save(const std::string& path) const override {
    out->push_back(name + " save " + path);
    return 1;
  }
  std::string name;
  std::vector<std::string>* out;
};
struct EpochOnly : EpochHooks {
  explicit EpochOnly(std::vector<std::string>* out) : out(out) {}
  void on_epoch_end(int64_t epoch, double) override {
    out->push_back("epoch-only " + std::to_string(epoch));
  }
  std::vector<std::string>* out;
};
struct Unrelated : volt::FabricCallback {};

TEST(Fabric, CallReachesTheCallbacksThatHaveTheHookInOrder) {
  std::vector<std::string> out;
  volt::Fabric fabric(
      cpu().callbacks({std::make_shared<Recorder>("a", &out), std::make_shared<Unrelated>(),
                       std::make_shared<EpochOnly>(&out), std::make_shared<Recorder>("b", &out)}));
  fabric.call(&EpochHooks::on_epoch_end, int64_t{3}, 0.5);
  fabric.call(&SaveHooks::on_save, std::string("x.ckpt"));  // a const hook; its result dropped
  EXPECT_EQ(out,
            (std::vector<std::string>{"a epoch 3 0.500000", "epoch-only 3", "b epoch 3 0.500000",
                                      "a save x.ckpt", "b save x.ckpt"}));
  volt::Fabric none(cpu());
  none.call(&EpochHooks::on_epoch_end, int64_t{0}, 0.0);  // no callbacks: nothing to reach
  EXPECT_NE(error_of<volt::ConfigError>([] {
              volt::Fabric(cpu().callbacks({nullptr}));
            }).find("callback 0 is null"),
            std::string::npos);
}

// Under ZeRO, clipping is the DeepSpeed config's.
TEST(Fabric, ZeroClipsInsideItsStep) {
  VOLT_REQUIRE_GLOO();
  volt::Fabric fabric(cpu().strategy("deepspeed_stage_2"));
  auto a = torch::nn::Linear(4, 4);
  auto opt = std::make_shared<torch::optim::SGD>(a->parameters(), torch::optim::SGDOptions(0.1));
  fabric.setup(a, {opt});
  at::Tensor loss;
  {
    auto forward = fabric.forward_context(a);
    loss = a->forward(at::ones({3, 4})).pow(2).mean();
  }
  fabric.backward(loss);
  EXPECT_NE(error_of<volt::ConfigError>([&] {
              fabric.clip_gradients(*opt, 1.0);
            }).find("set \"gradient_clipping\" in the DeepSpeed config"),
            std::string::npos);
  const at::Tensor before = a->weight.detach().clone();
  EXPECT_TRUE(fabric.step(*opt));
  EXPECT_FALSE(at::equal(before, a->weight.detach()));
}

TEST(Fabric, RankZeroFirstInOneProcessRunsTheBlock) {
  volt::Fabric fabric(cpu());
  int ran = 0;
  {
    auto first = fabric.rank_zero_first();
    ++ran;
  }
  {
    auto first = fabric.rank_zero_first(/*local=*/true);
    ++ran;
  }
  EXPECT_EQ(ran, 2);
}

TEST(Fabric, BadCallsAreTypedErrors) {
  EXPECT_NE(error_of<volt::ConfigError>([] { volt::Fabric(cpu().strategy("nope")); }).find("nope"),
            std::string::npos);
  EXPECT_NE(error_of<volt::ConfigError>([] {
              volt::Fabric(cpu().precision("nope"));
            }).find("[Fabric] unknown precision \"nope\""),
            std::string::npos);
  volt::Fabric fabric(cpu());
  auto m = std::make_shared<TinyClassifier>();
  auto opt = m->configure_optimizers()[0].optimizer();
  const at::Tensor loss = m->fc1->weight.sum();
  EXPECT_NE(error_of<volt::ConfigError>([&] { fabric.backward(loss); }).find("before setup()"),
            std::string::npos);
  EXPECT_NE(error_of<volt::ConfigError>([&] { fabric.step(*opt); }).find("before setup()"),
            std::string::npos);
  EXPECT_NE(error_of<volt::ConfigError>([&] { fabric.zero_grad(*opt); }).find("before setup()"),
            std::string::npos);
  auto stranger = torch::nn::Linear(2, 2);
  auto foreign =
      std::make_shared<torch::optim::SGD>(stranger->parameters(), torch::optim::SGDOptions(0.1));
  EXPECT_NE(error_of<volt::ConfigError>([&] {
              fabric.setup(m, {foreign});
            }).find("not one of the module's"),
            std::string::npos);
  EXPECT_NE(error_of<volt::ConfigError>([&] { fabric.setup(nullptr); }).find("null module"),
            std::string::npos);
  fabric.setup(m, {opt});
  EXPECT_NE(error_of<volt::ConfigError>([&] { fabric.setup(m, {opt}); }).find("set up already"),
            std::string::npos);
  auto sharing = std::make_shared<torch::nn::Module>();
  sharing->register_module("fc", m->fc1);
  EXPECT_NE(error_of<volt::ConfigError>([&] { fabric.setup(sharing); }).find("sharing a parameter"),
            std::string::npos);
  EXPECT_NE(error_of<volt::ConfigError>([&] { fabric.step(*foreign); }).find("did not take"),
            std::string::npos);
  EXPECT_NE(error_of<volt::ConfigError>([&] {
              fabric.zero_grad(*foreign);
            }).find("zero_grad() got an optimizer that setup() did not take"),
            std::string::npos);
  EXPECT_NE(error_of<volt::ConfigError>([&] {
              auto c = fabric.forward_context(stranger);
            }).find("forward_context() got a module that setup() did not take"),
            std::string::npos);
  EXPECT_NE(error_of<volt::ConfigError>([&] {
              auto c = fabric.forward_context(std::shared_ptr<torch::nn::Module>());
            }).find("null module"),
            std::string::npos);
  EXPECT_NE(error_of<volt::ConfigError>([&] {
              auto g = fabric.no_backward_sync(stranger);
            }).find("no_backward_sync() got a module that setup() did not take"),
            std::string::npos);
  EXPECT_NE(error_of<volt::ConfigError>([&] {
              fabric.backward(m->fc1->weight.sum(), stranger);
            }).find("backward() got a module that setup() did not take"),
            std::string::npos);
  EXPECT_NE(error_of<volt::ConfigError>([&] {
              fabric.backward(m->fc1->weight.sum(), m, std::shared_ptr<torch::nn::Module>());
            }).find("backward() got a null module"),
            std::string::npos);
  EXPECT_FALSE(m->fc1->weight.grad().defined()) << "no backward ran";
  EXPECT_NE(error_of<volt::ConfigError>([&] { fabric.clip_gradients(*opt, 0); }).find("> 0"),
            std::string::npos);
  EXPECT_NE(
      error_of<volt::ValueError>([&] { fabric.backward(m->fc1->weight * 2); }).find("one element"),
      std::string::npos);
  volt::FabricState state;
  EXPECT_NE(error_of<volt::ConfigError>([&] { state.value("a/b", 1); }).find("without '/'"),
            std::string::npos);
  state.value("x", 1);
  EXPECT_NE(error_of<volt::ConfigError>([&] { state.value("x", 2); }).find("already"),
            std::string::npos);
  EXPECT_NE(error_of<volt::ConfigError>([&] {
              state.value("t", c10::IValue(at::ones({1})));
            }).find("tensor()"),
            std::string::npos);
  EXPECT_NE(error_of<volt::ValueError>([&] { state.value("y"); }).find("no value named 'y'"),
            std::string::npos);
  volt_test::TempDir dir;
  volt::FabricState other;
  other.module("model", *stranger);
  EXPECT_NE(error_of<volt::ConfigError>([&] {
              fabric.save(dir / "x.ckpt", other);
            }).find("not one setup() took"),
            std::string::npos);
  EXPECT_NE(error_of<volt::ConfigError>([&] {
              other.module("again", *stranger);
            }).find("has this module already"),
            std::string::npos);
}

// The model_parallel strategy under Fabric splits one module: a second module is Fabric's
// ConfigError. In one process the tensor-parallel group is one rank and the loop trains.
TEST(Fabric, ModelParallelTakesOneModule) {
  VOLT_REQUIRE_GLOO();
  volt::Fabric fabric(cpu().strategy(volt::named<volt::Strategy>(
      "model_parallel", {{"tp_plan", std::vector<std::string>{"0=colwise", "2=rowwise"}}})));
  expect_one_module_that_trains(
      fabric,
      torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::Tanh(), torch::nn::Linear(8, 2)),
      "the model_parallel strategy splits one module's layers");
}

// ------------------------------------------------------------------ real processes

std::string out_of(const std::string& root, int rank) {
  return root + "/w.rank" + std::to_string(rank) + ".pt";
}

// One process on the global batch (16 rows a step; a pipeline's ranks read 8 rows each, the
// same ones: `rows` 8).
at::Tensor reference(const std::string& root, const std::vector<std::string>& extra = {},
                     const std::string& rows = "16") {
  std::vector<std::string> args{"--out", root + "/ref/w", "--batch", rows};
  args.insert(args.end(), extra.begin(), extra.end());
  const Job j = run_job(volt_test::fabric_worker(), args);
  EXPECT_EQ(j.code, 0) << j.output;
  return load_flat(root + "/ref/w.rank0.pt");
}

// Ranks started as one job with rank variables (as torchrun would), batch 8 each.
// Each started rank's exit code and output, in rank order (at most 120 s each).
std::vector<Job> jobs_of(std::vector<std::unique_ptr<volt_test::Process>>& ranks) {
  std::vector<Job> jobs;
  for (auto& p : ranks) {
    Job j;
    j.code = p->exit_code(std::chrono::seconds(120));
    j.output = p->output();
    jobs.push_back(j);
  }
  return jobs;
}

std::vector<Job> run_ranks(const std::string& root, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args{"--out", root + "/w", "--batch", "8", "--devices", "2"};
  args.insert(args.end(), extra.begin(), extra.end());
  auto ranks = volt_test::start_local_ranks(volt_test::fabric_worker(), args, 2);
  return jobs_of(ranks);
}

// Two ranks run with `flags` under `root`: both succeed and end with the same weights, within
// 5e-6 of one process on the global batch (`ref`). Returns rank 0's output.
std::string expect_ranks_equal_one_process(const std::string& root,
                                           const std::vector<std::string>& flags,
                                           const at::Tensor& ref, const std::string& label) {
  const auto jobs = run_ranks(root, flags);
  for (const auto& j : jobs) EXPECT_EQ(j.code, 0) << label << ": " << j.output;
  if (jobs[0].code != 0 || jobs[1].code != 0) return jobs[0].output;
  const at::Tensor r0 = load_flat(out_of(root, 0)), r1 = load_flat(out_of(root, 1));
  EXPECT_TRUE(at::equal(r0, r1)) << label;
  EXPECT_TRUE(at::allclose(r0, ref, 0, 5e-6))
      << label << ": " << (r0 - ref).abs().max().item<double>();
  return jobs[0].output;
}

TEST(FabricDdp, TwoRanksEqualOneProcessOnTheGlobalBatch) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  const auto jobs = run_ranks(dir.path, {"--clip", "0.5"});
  for (const auto& j : jobs) ASSERT_EQ(j.code, 0) << j.output;
  EXPECT_NE(jobs[0].output.find("rank 0 world 2"), std::string::npos) << jobs[0].output;
  EXPECT_NE(jobs[0].output.find("gathered 0,1"), std::string::npos) << jobs[0].output;
  const at::Tensor r0 = load_flat(out_of(dir.path, 0)), r1 = load_flat(out_of(dir.path, 1));
  // Each rank built its model from its own seed: setup() gave both rank 0's weights, and the
  // averaged gradients kept them equal.
  EXPECT_TRUE(at::equal(r0, r1));
  const at::Tensor ref = reference(dir.path, {"--clip", "0.5"});
  EXPECT_TRUE(at::allclose(r0, ref, 0, 2e-6)) << (r0 - ref).abs().max().item<double>();
}

// A generator and a discriminator set up one after the other on two ranks: each keeps its own
// gradient buckets, the discriminator's loss (over a detached fake) syncs it alone, the
// generator's syncs both; the ranks stay equal and equal one process on the global batch.
TEST(FabricDdp, SeveralModulesOnTwoRanksEqualOneProcessOnTheGlobalBatch) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  const at::Tensor ref = reference(dir.path, {"--gan", "1"});
  // static_graph: each module's reducer must see the same parameters reached in every backward
  // it takes part in, so a module a loss does not reach must not be armed.
  for (const std::string static_graph : {"0", "1"}) {
    const std::string out = expect_ranks_equal_one_process(
        dir / ("static" + static_graph), {"--gan", "1", "--static-graph", static_graph}, ref,
        "static_graph " + static_graph);
    EXPECT_NE(out.find("gan d grads differ=0"), std::string::npos) << out;
  }
}

// A discriminator loss that reaches the generator on rank 1 only (a data-dependent branch): each
// rank armed the reducers of the modules its own graph reached, so rank 1's generator all-reduce
// paired with rank 0's next one (another module's, or the timeout). The ranks now agree on the
// modules, rank 0 joining with zeros, and stay equal; under ZeRO every rank refuses it at once.
TEST(FabricDdp, ALossReachingAModuleOnOneRankOnlyArmsItOnEveryRank) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  for (const std::string static_graph : {"0", "1"}) {
    const auto jobs = run_ranks(dir / ("branch" + static_graph), {"--gan", "1", "--gan-branch", "1",
                                                                  "--static-graph", static_graph});
    for (const auto& j : jobs) ASSERT_EQ(j.code, 0) << j.output;
    EXPECT_TRUE(at::equal(load_flat(out_of(dir / ("branch" + static_graph), 0)),
                          load_flat(out_of(dir / ("branch" + static_graph), 1))));
  }
  // A parameter of that module no rank's forward used keeps no gradient (as DDP leaves a
  // globally unused one), so the optimizer skips it; the average gave it zeros before.
  const auto spare = run_ranks(
      dir / "spare", {"--gan", "1", "--gan-branch", "1", "--gan-spare", "1", "--find-unused", "1"});
  for (size_t r = 0; r < spare.size(); ++r) {
    ASSERT_EQ(spare[r].code, 0) << spare[r].output;
    EXPECT_NE(spare[r].output.find("rank " + std::to_string(r) + " spare grad defined=0"),
              std::string::npos)
        << spare[r].output;
  }
  const auto jobs = run_ranks(
      dir / "zero", {"--gan", "1", "--gan-branch", "1", "--strategy", "deepspeed_stage_2"});
  for (const auto& j : jobs) {
    EXPECT_EQ(j.code, 1) << j.output;
    EXPECT_NE(j.output.find("backward() reached set-up module 0 ("), std::string::npos) << j.output;
    EXPECT_NE(j.output.find("on 1 of 2 ranks (a data-dependent branch of the loss)"),
              std::string::npos)
        << j.output;
  }
}

// A generator run wholly inside volt::checkpoint: its parameters join the generator loss's graph
// only when backward recomputes, so Fabric cannot find it there. Unnamed, its gradients would
// stay each rank's own: an error after that backward, on every rank. Named in backward(loss, g),
// it syncs, and the run equals one process (recomputation is bitwise on the CPU).
TEST(FabricDdp, AModuleRunWhollyInsideACheckpointIsNamedInBackward) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  const auto unnamed = run_ranks(dir / "unnamed", {"--gan", "1", "--checkpoint-g", "1"});
  for (const auto& j : unnamed) {
    EXPECT_EQ(j.code, 1) << j.output;
    EXPECT_NE(j.output.find("[Fabric] backward() gave gradients to set-up module 0 ("),
              std::string::npos)
        << j.output;
    EXPECT_NE(j.output.find("on some rank, which the loss's graph does not show (did it run "
                            "wholly inside volt::checkpoint?): they were not averaged over the "
                            "ranks. Name it: fabric.backward(loss, module)."),
              std::string::npos)
        << j.output;
  }
  // Rank 0 alone gave the generator such gradients (rank 1's loss reached none of it): every
  // rank fails at the same backward. Rank 0 failed alone, rank 1 going on to its next collective.
  const auto one = run_ranks(dir / "one", {"--gan", "1", "--checkpoint-g", "3"});
  for (const auto& j : one) {
    EXPECT_EQ(j.code, 1) << j.output;
    EXPECT_NE(j.output.find("[Fabric] backward() gave gradients to set-up module 0 ("),
              std::string::npos)
        << j.output;
  }
  const at::Tensor ref = reference(dir.path, {"--gan", "1"});
  expect_ranks_equal_one_process(dir / "named", {"--gan", "1", "--checkpoint-g", "2"}, ref,
                                 "generator named in backward");
}

// Lightning's broadcast(obj, src) ignores the other ranks' obj: here the source's shape and
// dtype come with its value, so the others may pass any placeholder or none.
TEST(FabricDdp, BroadcastTakesTheSourcesShapeAndDtype) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  const auto jobs = run_ranks(dir.path, {"--check-broadcast", "1"});
  for (size_t r = 0; r < jobs.size(); ++r) {
    const std::string& out = jobs[r].output;
    EXPECT_EQ(jobs[r].code, 0) << out;
    const std::string me = "rank " + std::to_string(r) + " ";
    for (const std::string& line :
         {me + "other sizes=[2, 3] dtype=Float sum=15",
          me + "undefined sizes=[2, 3] dtype=Float sum=15",
          me + "error: [Fabric] broadcast from rank 0: its value is undefined; rank 0 must pass a "
               "defined dense tensor",
          me + "bool sizes=[2, 2] dtype=Bool sum=2"}) {
      EXPECT_NE(out.find(line), std::string::npos) << "'" << line << "' in\n" << out;
    }
  }
}

TEST(FabricDdp, NoBackwardSyncLeavesTheGradientsLocalUntilTheLastMicroBatch) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  const auto jobs = run_ranks(dir.path, {"--accum", "2", "--batch", "4", "--check-no-sync", "1"});
  for (const auto& j : jobs) ASSERT_EQ(j.code, 0) << j.output;
  EXPECT_NE(jobs[0].output.find("no_sync grads differ=1 synced grads differ=0"), std::string::npos)
      << jobs[0].output;
  const at::Tensor ref = reference(dir.path, {"--accum", "2", "--batch", "8"});
  const at::Tensor r0 = load_flat(out_of(dir.path, 0));
  EXPECT_TRUE(at::allclose(r0, ref, 0, 2e-6)) << (r0 - ref).abs().max().item<double>();
}

// Two ranks run with `flags`; both succeed and rank 0 prints `line`.
void expect_rank_zero_prints(const std::vector<std::string>& flags, const std::string& line) {
  volt_test::TempDir dir;
  const auto jobs = run_ranks(dir.path, flags);
  for (const auto& j : jobs) ASSERT_EQ(j.code, 0) << j.output;
  EXPECT_NE(jobs[0].output.find(line), std::string::npos) << jobs[0].output;
}

TEST(FabricDdp, NoBackwardSyncOfOneModuleLeavesTheOthersSynced) {
  VOLT_REQUIRE_GLOO();
  // The generator's loss reaches both modules; only the generator skipped its all-reduce.
  expect_rank_zero_prints({"--gan", "1", "--check-module-no-sync", "1"},
                          "module no_sync g differ=1 d differ=0");
}

// Lightning's DDP broadcasts rank 0's buffers before each forward; Fabric's forward_context
// does. Each rank's BatchNorm updates its running statistics from its own shard, so they differ
// after a step, and agree again inside the next forward's context.
TEST(FabricDdp, ForwardContextBroadcastsRankZerosBuffers) {
  VOLT_REQUIRE_GLOO();
  expect_rank_zero_prints({"--batchnorm", "1", "--check-buffers", "1"},
                          "buffers differ before=1 inside=0");
}

TEST(FabricDdp, SyncBatchNormOnTwoRanksEqualsOneProcessOnTheGlobalBatch) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  const at::Tensor ref = reference(dir.path, {"--batchnorm", "1"});
  // Weights, running statistics and count: the same on both ranks, and one process's.
  expect_ranks_equal_one_process(dir / "synced", {"--batchnorm", "1", "--sync-bn", "1"}, ref,
                                 "sync_batchnorm");
  // Without it each rank normalizes by its own half batch: far from one process.
  const std::string local = dir / "local";
  const auto plain = run_ranks(local, {"--batchnorm", "1"});
  for (const auto& j : plain) ASSERT_EQ(j.code, 0) << j.output;
  const at::Tensor p0 = load_flat(out_of(local, 0));
  EXPECT_GT((p0 - ref).abs().max().item<double>(), 1e-3);
}

TEST(FabricDdp, SyncBatchNormRefusesAForwardOutsideForwardContext) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  const auto jobs =
      run_ranks(dir / "never", {"--batchnorm", "1", "--sync-bn", "1", "--outside", "1"});
  for (const auto& j : jobs) {
    EXPECT_EQ(j.code, 1) << j.output;
    EXPECT_NE(j.output.find("outside fabric.forward_context(module) while sync_batchnorm is on"),
              std::string::npos)
        << j.output;
  }
  // The first step inside the context, the second outside: its BatchNorm layer (the
  // Sequential's child "1") normalized by each rank's half batch, which backward finds in the
  // loss's graph.
  const auto later =
      run_ranks(dir / "later", {"--batchnorm", "1", "--sync-bn", "1", "--outside-from", "1"});
  for (const auto& j : later) {
    EXPECT_EQ(j.code, 1) << j.output;
    EXPECT_NE(j.output.find("[Fabric] backward() through BatchNorm layer '1' of a set-up module "
                            "whose training forward ran outside fabric.forward_context(module)"),
              std::string::npos)
        << j.output;
  }
}

TEST(FabricDdp, LaunchRunsTheBinaryAgainAsTheOtherRank) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  const Job j =
      run_job(volt_test::fabric_worker(), {"--out", dir / "w", "--batch", "8", "--devices", "2"});
  ASSERT_EQ(j.code, 0) << j.output;
  EXPECT_NE(j.output.find("rank 0 done"), std::string::npos) << j.output;
  const at::Tensor r0 = load_flat(out_of(dir.path, 0)), r1 = load_flat(out_of(dir.path, 1));
  EXPECT_TRUE(at::equal(r0, r1));
  const at::Tensor ref = reference(dir.path);
  EXPECT_TRUE(at::allclose(r0, ref, 0, 2e-6)) << (r0 - ref).abs().max().item<double>();
}

TEST(FabricDdp, SavedMidRunAJobResumesBitForBit) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  const auto full =
      run_ranks(dir / "full", {"--steps", "10", "--save-at", "5", "--save", dir / "mid.ckpt"});
  for (const auto& j : full) ASSERT_EQ(j.code, 0) << j.output;
  const auto resumed = run_ranks(dir / "resumed", {"--steps", "10", "--resume", dir / "mid.ckpt"});
  for (const auto& j : resumed) ASSERT_EQ(j.code, 0) << j.output;
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(
        at::equal(load_flat(out_of(dir / "full", r)), load_flat(out_of(dir / "resumed", r))))
        << r;
  }
  // The mean of the last losses travelled as a tensor entry: both runs print the same.
  const auto line = [](const std::string& out) { return out.substr(out.find("rank 0 done")); };
  EXPECT_EQ(line(full[0].output), line(resumed[0].output));
}

// For each (stage, precision) of `cases`, two-rank jobs of the worker with `model` flags under
// ZeRO: one saved at step 5 of 10 and one resumed from that folder by a new job end with the same
// weights, bit for bit, on both ranks.
void expect_zero_resume_bit_for_bit(const std::vector<std::string>& model,
                                    const std::vector<std::pair<std::string, std::string>>& cases) {
  volt_test::TempDir dir;
  for (const auto& [stage, precision] : cases) {
    const std::string root = dir / ("stage" + stage + precision), mid = root + "/mid.ckpt";
    auto with = [&](const std::vector<std::string>& more) {
      std::vector<std::string> all = model;
      all.insert(all.end(), {"--strategy", "deepspeed_stage_" + stage, "--steps", "10",
                             "--precision", precision});
      all.insert(all.end(), more.begin(), more.end());
      return all;
    };
    const auto full = run_ranks(root + "/full", with({"--save-at", "5", "--save", mid}));
    for (const auto& j : full) ASSERT_EQ(j.code, 0) << j.output;
    const auto resumed = run_ranks(root + "/resumed", with({"--resume", mid}));
    for (const auto& j : resumed) ASSERT_EQ(j.code, 0) << j.output;
    for (int r = 0; r < 2; ++r) {
      EXPECT_TRUE(
          at::equal(load_flat(out_of(root + "/full", r)), load_flat(out_of(root + "/resumed", r))))
          << stage << " " << precision << " rank " << r;
    }
  }
}

// ZeRO under Fabric: the program's loop with stage 1, 2 and 3 (every parameter partitioned, the
// forward inside forward_context gathering them) trains as one process on the global batch.
TEST(FabricDdp, ZeroStagesOnTwoRanksEqualOneProcessOnTheGlobalBatch) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  const at::Tensor ref = reference(dir.path);
  // Each rank builds its model from its own seed; setup gives both rank 0's weights.
  for (const std::string stage : {"1", "2", "3"}) {
    expect_ranks_equal_one_process(
        dir / ("stage" + stage), {"--strategy", "deepspeed_stage_" + stage}, ref, "stage " + stage);
  }
}

// A ZeRO checkpoint (each rank's shard of the weights and the optimizer state; under
// bf16-mixed, bf16 weights and their fp32 masters) saved mid-run and loaded by a new job ends as
// the uninterrupted run, on both ranks.
TEST(FabricDdp, ZeroSavedMidRunResumesBitForBit) {
  VOLT_REQUIRE_GLOO();
  expect_zero_resume_bit_for_bit({}, {{"2", "32-true"}, {"3", "32-true"}, {"3", "bf16-mixed"}});
}

// Several modules under ZeRO (Lightning Fabric's setup per model with DeepSpeed): the GAN
// loop's generator and discriminator each with its own engines, every parameter partitioned at
// stage 3 (each module's forwards inside its forward_context), train on two ranks as one process
// on the global batch.
TEST(FabricDdp, SeveralModulesUnderZeroEqualOneProcessOnTheGlobalBatch) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  const at::Tensor ref = reference(dir.path, {"--gan", "1"});
  for (const std::string stage : {"1", "2", "3"}) {
    expect_ranks_equal_one_process(dir / ("stage" + stage),
                                   {"--gan", "1", "--strategy", "deepspeed_stage_" + stage}, ref,
                                   "stage " + stage);
  }
}

// Their checkpoint (both modules' weights and both optimizers' states, each rank's shards; under
// bf16-mixed each module's fp32 masters) saved mid-run and loaded by a new job ends as the
// uninterrupted run on both ranks.
TEST(FabricDdp, SeveralModulesUnderZeroResumeBitForBit) {
  VOLT_REQUIRE_GLOO();
  expect_zero_resume_bit_for_bit({"--gan", "1"}, {{"2", "32-true"}, {"3", "bf16-mixed"}});
}

// A Fabric ZeRO folder loads at another world size (DeepSpeedStrategy's load consolidates the
// shards of every module and optimizer the state holds, wherever it keeps them): in one process
// under plain DDP the loaded weights are the two-rank job's bit for bit (under bf16-mixed its
// fp32 master weights, not their bf16 roundings), and training on from them ends within 5e-6 of
// the two-rank job's uninterrupted run (the optimizers' momentum came back whole).
TEST(FabricDdp, ZeroFoldersLoadAtAnotherWorldSize) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  struct Case {
    std::vector<std::string> model;
    std::string stage, precision;
  };
  const std::vector<Case> cases{
      {{}, "3", "32-true"}, {{"--gan", "1"}, "3", "bf16-mixed"}, {{"--gan", "1"}, "2", "32-true"}};
  for (const auto& c : cases) {
    const std::string label = (c.model.empty() ? "one module" : "gan") + std::string(" stage ") +
                              c.stage + " " + c.precision;
    const std::string root = dir / (std::to_string(c.model.size()) + c.stage + c.precision);
    auto flags = [&](std::vector<std::string> more) {
      more.insert(more.begin(), c.model.begin(), c.model.end());
      return more;
    };
    const std::vector<std::string> zero{"--strategy", "deepspeed_stage_" + c.stage, "--precision",
                                        c.precision};
    // Two ranks: saved at step 5 (and stopped there), and run on to step 10.
    auto two = flags(zero);
    two.insert(two.end(), {"--steps", "5", "--save-at", "5", "--save", root + "/mid.ckpt"});
    for (const auto& j : run_ranks(root + "/at5", two)) ASSERT_EQ(j.code, 0) << label << j.output;
    auto on = flags(zero);
    on.insert(on.end(), {"--steps", "10"});
    for (const auto& j : run_ranks(root + "/at10", on)) ASSERT_EQ(j.code, 0) << label << j.output;
    // One process, plain DDP in fp32: loaded (nothing more to run), and run on to step 10.
    const at::Tensor loaded =
        reference(root + "/loaded", flags({"--steps", "5", "--resume", root + "/mid.ckpt"}));
    EXPECT_TRUE(at::equal(loaded, load_flat(out_of(root + "/at5", 0)))) << label;
    const at::Tensor resumed =
        reference(root + "/resumed", flags({"--steps", "10", "--resume", root + "/mid.ckpt"}));
    const at::Tensor full = load_flat(out_of(root + "/at10", 0));
    if (c.precision == "32-true") {
      EXPECT_TRUE(at::allclose(resumed, full, 0, 5e-6))
          << label << ": " << (resumed - full).abs().max().item<double>();
    }
  }
}

// The pipeline strategy under Fabric: the program's loop over a net whose layers are a
// volt::Pipeline, one stage per rank (both ranks read the same batches). Both ranks end with the
// whole model (Fabric's teardown gathers it), equal to one process running the same layers
// whole: bit for bit with one micro-batch, within 1e-6 with two and norm clipping across the
// stages (its norm sums each stage's squares). A run saved mid-way and resumed by a new job ends
// bit for bit as the uninterrupted one.
TEST(FabricPipeline, TwoStagesEqualOneProcessAndResumeBitForBit) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  for (const std::string chunks : {"1", "2"}) {
    const std::string root = dir / ("chunks" + chunks);
    std::vector<std::string> flags{"--chunks", chunks};
    if (chunks == "2") flags.insert(flags.end(), {"--clip", "0.5"});
    std::vector<std::string> one{"--pipeline", "1"};
    one.insert(one.end(), flags.begin(), flags.end());
    const at::Tensor ref = reference(root, one, "8");
    flags.insert(flags.begin(), {"--strategy", "pipeline"});
    const auto jobs = run_ranks(root, flags);
    for (const auto& j : jobs) ASSERT_EQ(j.code, 0) << j.output;
    EXPECT_NE(jobs[0].output.find("rank 0 runs stage 0 of 2"), std::string::npos) << jobs[0].output;
    const at::Tensor r0 = load_flat(out_of(root, 0)), r1 = load_flat(out_of(root, 1));
    EXPECT_TRUE(at::equal(r0, r1)) << chunks;
    if (chunks == "1") {
      EXPECT_TRUE(at::equal(r0, ref)) << (r0 - ref).abs().max().item<double>();
    } else {
      EXPECT_TRUE(at::allclose(r0, ref, 0, 1e-6)) << (r0 - ref).abs().max().item<double>();
      const at::Tensor unclipped = load_flat(out_of(dir / "chunks1", 0));
      EXPECT_GT((r0 - unclipped).abs().max().item<double>(), 1e-4);  // clipping did act
    }
  }
  const std::vector<std::string> pipe{"--strategy", "pipeline", "--chunks", "2", "--steps", "10"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), pipe.begin(), pipe.end());
    return more;
  };
  const auto full = run_ranks(dir / "full", with({"--save-at", "5", "--save", dir / "mid.ckpt"}));
  for (const auto& j : full) ASSERT_EQ(j.code, 0) << j.output;
  const auto resumed = run_ranks(dir / "resumed", with({"--resume", dir / "mid.ckpt"}));
  for (const auto& j : resumed) ASSERT_EQ(j.code, 0) << j.output;
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(
        at::equal(load_flat(out_of(dir / "full", r)), load_flat(out_of(dir / "resumed", r))))
        << r;
  }
}

// The loss through the Pipeline's forward_loss (the 1F1B schedule) in a Fabric loop with
// accumulation over 2 batches (the schedule's gradients scaled by 1/2 at the backward), equal to
// one process running the layers whole: bit for bit with one micro-batch, within 1e-6 with 3 and
// norm clipping.
TEST(FabricPipeline, TheOneFOneBScheduleEqualsOneProcess) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  for (const std::string chunks : {"1", "3"}) {
    SCOPED_TRACE("chunks " + chunks);
    const std::string root = dir / ("chunks" + chunks);
    std::vector<std::string> flags{"--chunks", chunks, "--schedule", "1f1b", "--accum", "2"};
    if (chunks == "3") flags.insert(flags.end(), {"--clip", "0.5"});
    const at::Tensor ref = reference(root, volt_test::cat({"--pipeline", "1"}, flags), "8");
    const auto jobs = run_ranks(root, volt_test::cat({"--strategy", "pipeline"}, flags));
    for (const auto& j : jobs) ASSERT_EQ(j.code, 0) << j.output;
    const at::Tensor r0 = load_flat(out_of(root, 0)), r1 = load_flat(out_of(root, 1));
    EXPECT_TRUE(at::equal(r0, r1));
    if (chunks == "1") {
      EXPECT_TRUE(at::equal(r0, ref)) << (r0 - ref).abs().max().item<double>();
    } else {
      EXPECT_TRUE(at::allclose(r0, ref, 0, 1e-6)) << (r0 - ref).abs().max().item<double>();
    }
  }
}

// The model_parallel strategy under Fabric: the program's loop over an MLP whose first Linear is
// split by its outputs and the last by its inputs across 2 ranks (both read the same batches).
// Both ranks end with the whole model (Fabric's teardown joins it), within 1e-6 of one process on
// the same batches, with accumulation over 2 batches and norm clipping across the shards; a run
// saved mid-way (whole weights and optimizer state) and resumed by a new job ends bit for bit as
// the uninterrupted one.
TEST(FabricModelParallel, TwoRanksEqualOneProcessAndResumeBitForBit) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  const std::vector<std::string> flags{"--clip", "0.5", "--accum", "2"};
  const at::Tensor ref = reference(dir.path, flags, "8");
  const auto jobs = run_ranks(dir.path, volt_test::cat({"--strategy", "model_parallel"}, flags));
  for (const auto& j : jobs) ASSERT_EQ(j.code, 0) << j.output;
  EXPECT_NE(jobs[0].output.find("1 data-parallel x 2 tensor-parallel processes"), std::string::npos)
      << jobs[0].output;
  EXPECT_NE(jobs[0].output.find("2 layers split 2 ways"), std::string::npos) << jobs[0].output;
  const at::Tensor r0 = load_flat(out_of(dir.path, 0)), r1 = load_flat(out_of(dir.path, 1));
  EXPECT_TRUE(at::equal(r0, r1));
  EXPECT_TRUE(at::allclose(r0, ref, 0, 1e-6)) << (r0 - ref).abs().max().item<double>();

  const std::vector<std::string> mp{"--strategy", "model_parallel", "--steps", "10"};
  const auto full =
      run_ranks(dir / "full", volt_test::cat(mp, {"--save-at", "5", "--save", dir / "mid.ckpt"}));
  for (const auto& j : full) ASSERT_EQ(j.code, 0) << j.output;
  const auto resumed =
      run_ranks(dir / "resumed", volt_test::cat(mp, {"--resume", dir / "mid.ckpt"}));
  for (const auto& j : resumed) ASSERT_EQ(j.code, 0) << j.output;
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(
        at::equal(load_flat(out_of(dir / "full", r)), load_flat(out_of(dir / "resumed", r))))
        << r;
  }
  // The checkpoint is the single-process format: one process resumes it and ends within 1e-6.
  const Job one = run_job(volt_test::fabric_worker(),
                          volt_test::cat({"--out", dir / "one/w", "--batch", "8", "--steps", "10"},
                                         {"--resume", dir / "mid.ckpt"}));
  ASSERT_EQ(one.code, 0) << one.output;
  const at::Tensor whole = load_flat(dir / "one/w.rank0.pt");
  const at::Tensor split = load_flat(out_of(dir / "full", 0));
  EXPECT_TRUE(at::allclose(whole, split, 0, 1e-6)) << (whole - split).abs().max().item<double>();
}

// A rank whose loop throws fails the job within seconds under every strategy: its Fabric,
// destroyed on the exception's way out, runs nothing collective in its teardown (the pipeline's
// and ZeRO's gathers would meet the other rank's step, or wait for it until the timeout: the
// pipeline job took the 20 s timeout before session 65), and the other rank fails naming it.
TEST(FabricDdp, ARankThrowingFailsTheOtherInsteadOfHangingIt) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  for (const std::string strategy : {"ddp", "deepspeed_stage_3", "pipeline", "model_parallel"}) {
    const auto start = std::chrono::steady_clock::now();
    const Job j =
        run_job(volt_test::fabric_worker(),
                {"--out", dir / strategy, "--batch", "8", "--devices", "2", "--throw-rank", "1",
                 "--throw-step", "3", "--timeout", "20", "--strategy", strategy},
                std::chrono::seconds(90));
    EXPECT_EQ(j.code, 1) << strategy << ": " << j.output;
    EXPECT_NE(j.output.find("rank 1 could not read step 3"), std::string::npos) << j.output;
    EXPECT_NE(j.output.find("rank 1 (local rank 1"), std::string::npos) << j.output;
    EXPECT_EQ(j.output.find("timed out"), std::string::npos) << strategy << ": " << j.output;
    if (strategy == "deepspeed_stage_3") {
      EXPECT_NE(j.output.find("the run failed, so nothing is gathered"), std::string::npos)
          << j.output;
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10)) << strategy;
  }
}

// A volt::Module's log(sync_dist) under Fabric: every rank keeps the mean of the ranks' values.
TEST(FabricDdp, AVoltModulesSyncDistLogIsTheRanksMean) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  const auto jobs = run_ranks(dir.path, {"--volt-module", "1"});
  std::vector<double> logged, local;
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(jobs[r].code, 0) << jobs[r].output;
    const std::string key = "rank " + std::to_string(r) + " logged loss=";
    const size_t at = jobs[r].output.find(key);
    ASSERT_NE(at, std::string::npos) << jobs[r].output;
    double x = 0, y = 0;
    ASSERT_EQ(std::sscanf(jobs[r].output.c_str() + at + key.size(), "%lf local=%lf", &x, &y), 2);
    logged.push_back(x);
    local.push_back(y);
  }
  EXPECT_EQ(logged[0], logged[1]);
  EXPECT_NE(local[0], local[1]);  // each rank's own batch: the reduction mattered
  EXPECT_NEAR(logged[0], (local[0] + local[1]) / 2, 1e-6);
}

TEST(FabricDdp, RankZeroFirstRunsRankZerosBlockBeforeTheOthers) {
  VOLT_REQUIRE_GLOO();
  for (const std::string local : {"0", "1"}) {
    volt_test::TempDir dir;
    // Rank 0 writes a file late in its block; the other rank looks for it in its own.
    const auto jobs =
        run_ranks(dir.path, {"--rank-zero-first", dir / "prepared", "--local", local});
    for (const auto& j : jobs) ASSERT_EQ(j.code, 0) << j.output;
    EXPECT_NE(jobs[1].output.find("rank 1 found the file: 1"), std::string::npos)
        << "local " << local << ": " << jobs[1].output;
  }
}

// Fabric::print prints once per machine, on local rank 0 (Lightning's): two ranks on one node
// print one line; two single-process nodes (NODE_RANK 0 and 1 over loopback) print one each.
TEST(FabricDdp, PrintPrintsOnTheFirstProcessOfEachNode) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  const auto one_node = run_ranks(dir.path, {"--print-on-every-rank", "1"});
  for (const auto& j : one_node) ASSERT_EQ(j.code, 0) << j.output;
  EXPECT_NE(one_node[0].output.find("printed by rank 0"), std::string::npos) << one_node[0].output;
  EXPECT_EQ(one_node[1].output.find("printed by rank"), std::string::npos) << one_node[1].output;

  const int port = volt::detail::find_free_port();
  auto ranks = volt_test::start_ranks(volt_test::fabric_worker(),
                                      {"--out", dir / "nodes/w", "--batch", "8", "--devices", "1",
                                       "--num-nodes", "2", "--print-on-every-rank", "1"},
                                      2, [&](int r) {
                                        auto env = volt_test::plain_rank_env(0, 2, port);
                                        env["NODE_RANK"] = std::to_string(r);
                                        return env;
                                      });
  const auto nodes = jobs_of(ranks);
  for (int r = 0; r < 2; ++r) {
    const std::string& out = nodes[r].output;
    ASSERT_EQ(nodes[r].code, 0) << out;
    EXPECT_NE(out.find("rank " + std::to_string(r) + " world 2"), std::string::npos) << out;
    EXPECT_NE(out.find("printed by rank " + std::to_string(r)), std::string::npos) << out;
  }
}

TEST(FabricDdp, RankZeroFailingFirstFailsTheOthersInsteadOfHangingThem) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  const auto start = std::chrono::steady_clock::now();
  const auto jobs = run_ranks(dir.path, {"--rank-zero-first", dir / "prepared", "--local", "0",
                                         "--first-fails", "1", "--timeout", "60"});
  EXPECT_EQ(jobs[0].code, 1) << jobs[0].output;
  EXPECT_NE(jobs[0].output.find("could not prepare"), std::string::npos) << jobs[0].output;
  EXPECT_EQ(jobs[1].code, 1) << jobs[1].output;
  EXPECT_EQ(jobs[1].output.find("found the file"), std::string::npos) << jobs[1].output;
  // Well inside the process group's 60 s timeout: rank 0's end is noticed.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(40));
}

TEST(FabricDdp, AKilledRankFailsTheOtherInsteadOfHangingIt) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  // ZeRO stage 3 too: the survivor is inside a gather or a reduce-scatter when its peer dies;
  // the pipeline, whose survivor waits for an activation or a gradient, and model_parallel, whose
  // survivor is inside a layer's all-reduce.
  for (const std::string strategy : {"ddp", "deepspeed_stage_3", "pipeline", "model_parallel"}) {
    const auto start = std::chrono::steady_clock::now();
    const Job j = run_job(volt_test::fabric_worker(),
                          {"--out", dir / strategy, "--batch", "8", "--devices", "2", "--die-rank",
                           "1", "--die-step", "3", "--timeout", "20", "--strategy", strategy},
                          std::chrono::seconds(90));
    EXPECT_EQ(j.code, 1) << strategy << ": " << j.output;
    EXPECT_NE(j.output.find("rank 1 (local rank 1"), std::string::npos) << j.output;
    EXPECT_EQ(j.output.find("rank 0 done"), std::string::npos) << j.output;
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60)) << strategy;
  }
}

}  // namespace
