// One pipeline-parallel job for tests/strategies/pipeline_test.cpp.
//
//   volt_pipeline_worker layer [--chunks C] [--balance A,B,...] [--method parameters|uniform]
//       One rank of the volt::Pipeline layer alone, started by the test with plain cluster
//       variables. Every rank builds the same model twice (seeded): a plain Sequential (the
//       reference, run in this process) and a distributed Pipeline, runs a batch through both,
//       backward, an SGD step and gather(), and checks: the output on every rank, this stage's
//       gradients (other stages' stay undefined), the input's gradient on every rank, the whole
//       model after gather(), a no-grad forward, a layer before the pipeline fed its own output
//       (net(tanh(net(pre(x))))), bit for bit with one chunk, else within 1e-6, the summary
//       of the pipeline with the other stages' weights freed, and random draws in the stages
//       (check_random).
//       Prints "rank R layer ok stage=S layers=F-L chunks=C". --bad-header 1: rank 0 sends stage
//       1 a malformed header instead (stage 1 must fail with a DistributedError). --deep-output
//       between|last: a model whose stage 0 output (between), or also the pipeline's output
//       (last), has 9 dimensions: every rank must fail with the same ValueError.
//       --no-batch-rows reduced|transposed [--chunks C]: a pipeline whose output is 0-dim or
//       has its batch in dim 1: with C > 1 every rank fails with the same ValueError; with
//       C = 1 prints "rank R no batch rows passed". --tied 1: a
//       model whose first and last layer are one Linear, held by both stages (check_tied);
//       prints "rank R tied ok stage=S". --tied buffer: one BatchNorm in both stages: every
//       rank fails with a ConfigError. --checkpoint never|always|except_last and/or
//       --interval N: activation checkpointing against the same pipeline without it
//       (check_checkpointed); prints "rank R checkpoint ok stage=S recomputed=N".
//       --deferred 1 [--checkpoint MODE]: deferred_batch_norm against the pipeline without it
//       and a one-process reference (check_deferred); prints "rank R deferred ok stage=S".
//       --schedule 1f1b [--model plain|dropout|tied|norm] [--checkpoint MODE]: forward_loss's
//       1F1B schedule against forward()'s GPipe (check_one_f_one_b); prints "rank R 1f1b ok
//       stage=S". --bad-loss param|rows: forward_loss with a loss function holding a parameter,
//       or a target with too few rows (the last stage fails, and so do the others).
//       --grad-call 1: torch::autograd::grad through the pipeline is a ValueError on every
//       rank, then a plain backward works; prints the error and "rank R grad-call ok".
//       --schedule-memory 1: peak bytes of a step under each schedule (check_schedule_memory);
//       prints "rank R memory gpipe=G 1f1b=O". --integer-between 1: bucket ids between the two
//       stages, under both schedules (check_integer_between); prints "rank R integer ok stage=S".
//
//   volt_pipeline_worker fit --root DIR --out PREFIX [--devices N] [--chunks C]
//       [--balance A,B,...] [--epochs E] [--max-steps S] [--optimizer sgd|adamw|fused_adamw]
//       [--clip NORM] [--accum K] [--dropout 0|1] [--ckpt-every-step 0|1] [--save-at E,B]
//       [--predict 0|1] [--resume CKPT]
//       [--die-rank R --die-batch B] [--throw-rank R --throw-batch B] [--timeout S] [--scaling 0|1]
//       [--inf-call K] [--save-peak 1]
//       [--strategy-chunks C] [--trace 0|1] [--inside-catch 1] [--precision NAME]
//       A Trainer fit of a module whose
//       middle layers are a volt::Pipeline, with a layer before and after it (inside a catch
//       block of the program's with --inside-catch); --devices 1 is the single-process
//       reference (single_device). Started as a plain process it launches its ranks itself. Every
//       rank writes its flat parameters after fit to <out>.rank<R>.pt and prints "rank R done
//       step=S stage=T states=N" (N: parameters with optimizer state on this rank), its buffers
//       (running statistics) to <out>.buffers.rank<R>.pt when it has any, and the
//       layer before the pipeline as it trained it (before the strategy's teardown gathers the
//       model) to <out>.pre.rank<R>.pt, with the layer after it to <out>.outside.rank<R>.pt.
//       --ckpt-every-step: a ModelCheckpoint keeping every step's checkpoint in <root>/ckpt.
//       --predict 1: then a predict of the validation data; every rank writes its logits to
//       <out>.pred.rank<R>.pt and its flat parameters after it to <out>.after_predict.rank<R>.pt.
//       --save-at E,B: a checkpoint <root>/save_at.ckpt after batch B of epoch E (mid-way
//       through an accumulation with --accum).
//       --save-peak 1: after the second batch a weights-only checkpoint <root>/peak.ckpt; prints
//       "rank R save peak=P others=O largest=L biggest_other=B" (L: its largest allocation while
//       saving, B: the largest tensor of another stage; P: the most counted CPU bytes it took, O:
//       the bytes of the other stages' weights).
//       --scaling: bf16-mixed with dynamic loss scaling. --inf-call K: the K-th training_step's
//       backward gives the pipeline's last layer (the last stage's) an inf gradient.
//       --die-rank/--die-batch: that rank SIGKILLs itself at that training batch;
//       --throw-rank/--throw-batch: its training_step throws a ValueError there.
//       --dropout 1: dropout in both stages' layers (at 2 stages) and after the pipeline.
//       --tied 1: the pipeline's Linear(32, 32) used again two layers later (with --balance 4,4
//       one use in each stage).
//       --ema 1: an EMAWeightAveraging callback (decay 0.8, every step); --swa 1: a
//       StochasticWeightAveraging callback (from the first epoch, annealing over one). The
//       weights written after fit are then the average.
//       --checkpoint MODE: the strategy's activation checkpointing (never|always|except_last);
//       --model-checkpoint MODE and --interval N: the model's PipelineOptions::checkpoint and
//       activation_checkpoint_interval. --deferred 1: the strategy's deferred_batch_norm.
//       --stages S: pipelines of S stages, devices / S replicas of it (each reading its shard of
//       the data, batch B per process, default 16).
//       --schedule 1f1b: the training loss through Pipeline::forward_loss (the 1F1B schedule),
//       the head's layers (and its dropout) the pipeline's last layers instead of after it.
//       --batchnorm 1: a BatchNorm1d after the pipeline's first Linear and one after its
//       Linear(32, 32)'s Tanh (8 layers: --balance 4,4 puts one in each of 2 stages).
//       --sync-bn 1: TrainerOptions::sync_batchnorm.
//       --side-from R: a Linear(16, 16) after the pipeline that only ranks >= R use.
//
// Exit: 0 done, 1 a volt error or failed check (printed on one line), 2 bad usage.

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <unordered_set>
#include <vector>

#include "counted_dropout.h"
#include "save_at.h"
#include "tiny.h"
#include "volt/accelerators/cpu_memory.h"
#include "volt/nn/parameters.h"
#include "volt/nn/pipeline.h"
#include "volt/strategies/pipeline.h"

namespace {

void say(const std::string& line) {
  std::string s = line + "\n";
  [[maybe_unused]] auto n = ::write(1, s.data(), s.size());
}

[[noreturn]] void fail(const std::string& what) {
  say("CHECK FAILED: " + what);
  std::_Exit(1);
}

std::vector<int64_t> parse_list(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::stoll(item));
  return out;
}

void check_same(const at::Tensor& got, const at::Tensor& want, bool exact,
                const std::string& what) {
  if (!got.defined() || !want.defined()) fail(what + ": undefined tensor");
  if (!got.sizes().equals(want.sizes())) fail(what + ": shapes differ");
  if (exact) {
    if (!at::equal(got, want)) fail(what + ": not bit for bit");
  } else if (!at::allclose(got, want, 1e-6, 1e-6)) {
    fail(what + ": differs by " + std::to_string((got - want).abs().max().item<double>()));
  }
}

torch::nn::Sequential layer_model() {
  return torch::nn::Sequential(
      torch::nn::Linear(8, 16), torch::nn::Tanh(), torch::nn::Linear(16, 24), torch::nn::ReLU(),
      torch::nn::Linear(24, 16), torch::nn::Tanh(), torch::nn::Linear(16, 4));
}

/// Stage 0 (balance 2,2) ends with a 9-dimensional output, stage 1 (and the pipeline) with a
/// 2-dimensional one; with `last_too`, stage 0's is 2-dimensional and the pipeline's has 9.
torch::nn::Sequential deep_output_model(bool last_too) {
  const torch::nn::UnflattenOptions nine(1, {1, 1, 1, 1, 1, 1, 1, 16});
  if (last_too) {
    return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::Tanh(),
                                 torch::nn::Linear(16, 16), torch::nn::Unflatten(nine));
  }
  return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::Unflatten(nine),
                               torch::nn::Flatten(), torch::nn::Linear(16, 4));
}

/// Integers between the stages (balance 2,3): stage 0 turns its features into bucket ids, stage
/// 1 embeds them. No gradient crosses back (stage 0's Linear gets none, as in one process), and
/// both schedules give the one-process output, loss and stage 1's gradients bit for bit.
/// Prints "rank R integer ok stage=S".
int check_integer_between(const std::shared_ptr<volt::ProcessGroup>& group, int64_t chunks) {
  const auto model = [] {
    torch::manual_seed(5);
    return torch::nn::Sequential(
        torch::nn::Linear(8, 8), torch::nn::Functional([](const at::Tensor& h) {
          return (torch::sigmoid(h) * 8).floor().clamp(0, 7).to(at::kLong);
        }),
        torch::nn::Embedding(8, 4), torch::nn::Flatten(), torch::nn::Linear(32, 2));
  };
  const auto mse = [](const at::Tensor& out, const at::Tensor& t) {
    return (out - t).pow(2).mean();
  };
  torch::manual_seed(6);
  const at::Tensor x = torch::randn({6, 8}), target = torch::randn({6, 2});
  auto reference = model();
  const at::Tensor want = reference->forward(x);
  const at::Tensor want_loss = mse(want, target);
  want_loss.backward();
  const auto ref_params = reference->named_parameters(true);
  for (const bool one_f_one_b : {false, true}) {
    const std::string what = one_f_one_b ? "1f1b: " : "gpipe: ";
    volt::Pipeline pipe(model(), volt::PipelineOptions().balance({2, 3}).chunks(chunks));
    pipe->distribute(group);
    at::Tensor out, loss;
    if (one_f_one_b) {
      loss = pipe->forward_loss(x, target, mse, &out);
    } else {
      out = pipe->forward(x);
      loss = mse(out, target);
    }
    loss.backward();
    check_same(out, want, chunks == 1, what + "output");
    check_same(loss, want_loss, chunks == 1, what + "loss");
    for (const auto& p : pipe->named_parameters(true)) {
      const bool later = p.key().rfind("0.", 0) != 0;  // layer 0 is stage 0's Linear
      if (!later) {
        if (p.value().grad().defined()) fail(what + "a gradient crossed the integers: " + p.key());
      } else if (pipe->stage() == 1) {
        check_same(p.value().grad(), ref_params[p.key()].grad(), chunks == 1,
                   what + "gradient of " + p.key());
      }
    }
  }
  say("rank " + std::to_string(group->rank()) +
      " integer ok stage=" + std::to_string(group->rank()));
  return 0;
}

/// This stage's parameters have the reference's gradients; the other stages' have none.
void check_stage_gradients(const volt::PipelineImpl& pipe, const torch::nn::Module& reference,
                           bool exact, const std::string& what) {
  const int64_t stage = pipe.stage();
  const auto [first, last] = pipe.stage_layers(stage);
  auto ref_params = reference.named_parameters(true);
  int64_t owned = 0;
  for (const auto& p : pipe.named_parameters(true)) {
    const int64_t layer = std::stoll(p.key().substr(0, p.key().find('.')));
    if (layer >= first && layer < last) {
      check_same(p.value().grad(), ref_params[p.key()].grad(), exact,
                 what + "gradient of " + p.key());
      ++owned;
    } else if (p.value().grad().defined()) {
      fail(what + "stage " + std::to_string(stage) + " has a gradient for another stage's " +
           p.key());
    }
  }
  if (static_cast<int64_t>(pipe.stage_parameters(stage).size()) != owned) {
    fail("stage_parameters does not match the stage's layers");
  }
}

/// Random draws through the stages: one layer per stage appends 4 uniform draws to each row.
/// With one micro-batch the output and the generator state after it are one process's; with
/// one row per micro-batch stage 0's draws for micro-batch i + 1 are not stage 1's for i (they
/// would be if stage 0 went on from the state it sent); every rank leaves in one state.
void check_random(const std::shared_ptr<volt::ProcessGroup>& group, int64_t chunks) {
  const int64_t stages = group->world_size();
  torch::nn::Sequential layers;
  for (int64_t s = 0; s < stages; ++s) {
    layers->push_back(torch::nn::Functional([](const at::Tensor& x) {
      return torch::cat({x, torch::rand({x.size(0), 4})}, 1);
    }));
  }
  volt::Pipeline pipe(
      layers, volt::PipelineOptions().chunks(chunks).balance(std::vector<int64_t>(stages, 1)));
  pipe->distribute(group);
  const at::Tensor x = torch::zeros({chunks, 1});
  torch::manual_seed(5);
  const at::Tensor out = pipe->forward(x);
  const at::Tensor after = torch::rand({8});
  for (const auto& other : group->all_gather(after)) {
    if (!at::equal(other, after)) fail("the ranks leave the pipeline in different random states");
  }
  if (chunks == 1) {
    torch::manual_seed(5);
    check_same(out, layers->forward(x), true, "random draws");
    check_same(after, torch::rand({8}), true, "random state after the pipeline");
    return;
  }
  for (int64_t i = 0; i + 1 < chunks; ++i) {
    if (at::equal(out[i + 1].slice(0, 1, 5), out[i].slice(0, 5, 9))) {
      fail("stage 0's draws for micro-batch " + std::to_string(i + 1) + " repeat stage 1's for " +
           std::to_string(i));
    }
  }
}

/// A layer before the pipeline and the pipeline fed its own output, net(tanh(net(pre(x)))): the
/// outer call's input gradient reaches the inner call's backward on every rank, and every rank's
/// `pre` gets the reference's gradient.
void check_chained(const std::shared_ptr<volt::ProcessGroup>& group, int64_t chunks, bool exact,
                   const at::Tensor& x) {
  auto square = [] {
    return torch::nn::Sequential(torch::nn::Linear(6, 6), torch::nn::Tanh(),
                                 torch::nn::Linear(6, 6), torch::nn::Tanh(),
                                 torch::nn::Linear(6, 6));
  };
  torch::manual_seed(3);
  torch::nn::Linear pre_ref(8, 6);
  auto net_ref = square();
  torch::manual_seed(3);
  torch::nn::Linear pre(8, 6);
  volt::Pipeline net(square(), volt::PipelineOptions().chunks(chunks));
  net->distribute(group);
  const at::Tensor target = torch::randn({x.size(0), 6});
  const at::Tensor y_ref = net_ref->forward(torch::tanh(net_ref->forward(pre_ref->forward(x))));
  const at::Tensor y = net->forward(torch::tanh(net->forward(pre->forward(x))));
  torch::mse_loss(y_ref, target).backward();
  torch::mse_loss(y, target).backward();
  check_same(y.detach(), y_ref.detach(), exact, "chained output");
  check_same(pre->weight.grad(), pre_ref->weight.grad(), exact, "chained: gradient of pre");
  check_stage_gradients(*net, *net_ref, exact, "chained: ");
}

/// One Linear at both ends (stage 0's first layer and the last stage's): both stages hold and
/// train it; with 3 ranks the middle stage does not hold it and takes no part in its sum. Two
/// forward/backward passes (the second accumulating) and an SGD step give the Sequential's output,
/// tied gradient (the sum of both uses) and weights on both ranks, bit for bit with one micro-batch
/// after the first pass; freeing the other stage's weights keeps it.
int check_tied(const std::shared_ptr<volt::ProcessGroup>& group, int64_t chunks) {
  auto model = [] {
    torch::nn::Linear shared(8, 8);
    return std::make_pair(shared,
                          torch::nn::Sequential(shared, torch::nn::Tanh(), torch::nn::Linear(8, 8),
                                                torch::nn::Tanh(), shared));
  };
  torch::manual_seed(3);
  auto [shared_ref, reference] = model();
  torch::manual_seed(3);
  auto [shared, layers] = model();
  // Two stages: both hold it. Three: the middle stage (layers 2-3) does not, and takes no part.
  const bool three = group->world_size() == 3;
  volt::Pipeline pipe(
      layers, volt::PipelineOptions().chunks(chunks).balance(three ? std::vector<int64_t>{2, 2, 1}
                                                                   : std::vector<int64_t>{2, 3}));
  pipe->distribute(group);
  const int64_t stage = pipe->stage();
  const std::vector<std::pair<int64_t, int64_t>> runs =
      three ? std::vector<std::pair<int64_t, int64_t>>{{0, 2}, {2, 4}, {4, 5}}
            : std::vector<std::pair<int64_t, int64_t>>{{0, 2}, {2, 5}};
  if (pipe->stage_layers(stage) != runs.at(stage)) fail("tied: unexpected partition");
  const bool holds = !(three && stage == 1);
  pipe->release_other_stages();
  if (holds && shared->weight.numel() != 64) {
    fail("tied: release_other_stages freed the shared weight");
  }
  if (!holds && shared->weight.numel() != 0) fail("tied: a stage without it kept the weight");
  for (const auto& p : pipe->foreign_parameters()) {
    if (holds && p.is_same(shared->weight))
      fail("tied: the shared weight is listed as another stage's");
  }
  torch::optim::SGD opt_ref(volt::distinct_parameters(*reference), torch::optim::SGDOptions(0.1));
  torch::optim::SGD opt(volt::distinct_parameters(*pipe), torch::optim::SGDOptions(0.1));
  const bool exact = chunks == 1;
  for (int pass = 0; pass < 2; ++pass) {
    const at::Tensor x = torch::randn({6, 8});
    const at::Tensor target = torch::randn({6, 8});
    const at::Tensor y_ref = reference->forward(x);
    const at::Tensor y = pipe->forward(x);
    torch::mse_loss(y_ref, target).backward();
    torch::mse_loss(y, target).backward();
    const std::string what = "tied pass " + std::to_string(pass) + ": ";
    check_same(y.detach(), y_ref.detach(), exact, what + "output");
    if (!holds) {
      if (shared->weight.grad().defined()) fail(what + "a stage without it got its gradient");
      continue;
    }
    // The second pass adds to the first's sum in another order: round-off only.
    check_same(shared->weight.grad(), shared_ref->weight.grad(), exact && pass == 0,
               what + "gradient of the shared weight");
    check_same(shared->bias.grad(), shared_ref->bias.grad(), exact && pass == 0,
               what + "gradient of the shared bias");
  }
  opt_ref.step();
  opt.step();
  // Every holder stepped it alike (a stage without it sends the reference's instead).
  const auto all =
      group->all_gather((holds ? shared->weight : shared_ref->weight).detach().contiguous());
  if (!at::equal(all[0], all.back())) fail("tied: the stages stepped the shared weight apart");
  if (holds) {
    check_same(shared->weight.detach(), shared_ref->weight.detach(), false, "tied: stepped weight");
  }
  say("rank " + std::to_string(group->rank()) + " tied ok stage=" + std::to_string(stage));
  return 0;
}

/// Activation checkpointing: a pipeline checkpointing as `options` say against the same
/// pipeline without it (the reference), both drawing dropout masks and with a BatchNorm: the
/// output, the input's gradient, this stage's gradients and the running statistics bit for bit
/// (the recomputation replays the forward's random state and leaves the statistics as they
/// were), and each dropout layer of the stage recomputed exactly as often as the mode
/// says (once per checkpointed micro-batch).
int check_checkpointed(const std::shared_ptr<volt::ProcessGroup>& group,
                       volt::PipelineOptions options) {
  int64_t recomputed = 0;
  auto model = [&recomputed] {
    auto drop = [&recomputed] { return volt_test::counted_dropout(recomputed); };
    return torch::nn::Sequential(torch::nn::Linear(8, 16), drop(), torch::nn::BatchNorm1d(16),
                                 torch::nn::Linear(16, 16), drop(), torch::nn::Tanh(),
                                 torch::nn::Linear(16, 4), drop());
  };
  const int64_t chunks = options.chunks();
  torch::manual_seed(4);
  volt::Pipeline plain(model(), volt::PipelineOptions().chunks(chunks));
  torch::manual_seed(4);
  volt::Pipeline checkpointed(model(), options);
  plain->distribute(group);
  checkpointed->distribute(group);
  const at::Tensor x = torch::randn({9, 8});
  const at::Tensor target = torch::randn({9, 4});
  std::vector<at::Tensor> outs, input_grads;
  for (volt::Pipeline* pipe : {&plain, &checkpointed}) {
    const at::Tensor xi = x.clone().requires_grad_(true);
    torch::manual_seed(6);
    const at::Tensor y = (*pipe)->forward(xi);
    if (recomputed != 0) fail("checkpoint: recomputed in forward");
    torch::mse_loss(y, target).backward();
    outs.push_back(y.detach());
    input_grads.push_back(xi.grad());
  }
  check_same(outs[1], outs[0], true, "checkpointed output");
  check_same(input_grads[1], input_grads[0], true, "checkpointed input gradient");
  const int64_t stage = checkpointed->stage();
  auto plain_params = plain->named_parameters(true);
  for (const auto& p : checkpointed->stage_parameters(stage)) {
    for (const auto& q : checkpointed->named_parameters(true)) {
      if (q.value().is_same(p)) {
        check_same(p.grad(), plain_params[q.key()].grad(), true,
                   "checkpointed gradient of " + q.key());
      }
    }
  }
  // The recomputation leaves BatchNorm's running statistics as the forward left them.
  auto plain_buffers = plain->named_buffers(true);
  for (const auto& b : checkpointed->named_buffers(true)) {
    check_same(b.value(), plain_buffers[b.key()], true, "checkpointed buffer " + b.key());
  }
  const auto [first, last] = checkpointed->stage_layers(stage);
  int64_t drops = 0;  // dropout layers in this stage: every third layer, from layer 1
  for (int64_t i = first; i < last; ++i) drops += i % 3 == 1;
  int64_t runs = 0;  // micro-batches whose run through the stage was checkpointed
  if (options.checkpoint() == "always" || options.activation_checkpoint_interval() > 0) {
    runs = chunks;
  } else if (options.checkpoint() == "except_last") {
    runs = chunks - 1;
  }
  if (recomputed != drops * runs) {
    fail("checkpoint: stage " + std::to_string(stage) + " recomputed its dropout layers " +
         std::to_string(recomputed) + " times, not " + std::to_string(drops * runs));
  }
  say("rank " + std::to_string(group->rank()) + " checkpoint ok stage=" + std::to_string(stage) +
      " recomputed=" + std::to_string(recomputed));
  return 0;
}

/// deferred_batch_norm's reference: the layers run micro-batch by micro-batch in one process
/// (each BatchNorm normalising each micro-batch by its own statistics, as the pipeline's do), and
/// each BatchNorm's running statistics moved once by its own forward over the whole batch of its
/// inputs: one BatchNorm seeing the whole batch.
at::Tensor deferred_reference(torch::nn::Sequential& seq, const at::Tensor& x, int64_t chunks) {
  std::vector<at::Tensor> pieces = x.tensor_split(std::min(chunks, x.size(0)), 0);
  for (size_t i = 0; i < seq->size(); ++i) {
    torch::nn::AnyModule& layer = *(seq->begin() + static_cast<int64_t>(i));
    const auto& module = seq->ptr(i);
    const auto bn1 = std::dynamic_pointer_cast<torch::nn::BatchNorm1dImpl>(module);
    const auto bn2 = std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(module);
    if (bn1 || bn2) {
      torch::NoGradGuard no_grad;
      layer.forward(at::cat(pieces, 0));  // the whole batch moves the statistics, once
      const auto params = module->named_parameters(false);
      const double eps = bn1 ? bn1->options.eps() : bn2->options.eps();
      for (auto& piece : pieces) {
        piece =
            at::batch_norm(piece, params["weight"], params["bias"], {}, {}, true, 0.0, eps, false);
      }
    } else {
      for (auto& piece : pieces) piece = layer.forward(piece);
    }
  }
  return at::cat(pieces, 0);
}

/// deferred_batch_norm over 2 stages (balance 3,5: a BatchNorm1d in stage 0, a BatchNorm2d with
/// a cumulative average, momentum none, in stage 1), checkpointed as `checkpoint` says: against
/// the same pipeline without it, the output, input gradient and this stage's gradients bit for
/// bit (each micro-batch is normalised as before); after two batches, each of the stage's
/// BatchNorm's running statistics as deferred_reference's (within 1e-6), counting 2 batches,
/// where the pipeline without it counted 2 x chunks; then an eval forward through every stage
/// gives the reference's output.
int check_deferred(const std::shared_ptr<volt::ProcessGroup>& group, int64_t chunks,
                   const std::string& checkpoint) {
  auto model = [] {
    return torch::nn::Sequential(
        torch::nn::Linear(8, 16), torch::nn::BatchNorm1d(16), torch::nn::Tanh(),
        torch::nn::Linear(16, 32), torch::nn::Unflatten(torch::nn::UnflattenOptions(1, {2, 4, 4})),
        torch::nn::BatchNorm2d(torch::nn::BatchNorm2dOptions(2).momentum(c10::nullopt)),
        torch::nn::Flatten(), torch::nn::Linear(32, 4));
  };
  const volt::PipelineOptions options =
      volt::PipelineOptions().chunks(chunks).balance({3, 5}).checkpoint(checkpoint);
  torch::manual_seed(5);
  volt::Pipeline plain(model(), options);
  torch::manual_seed(5);
  volt::Pipeline deferred(model(), volt::PipelineOptions(options).deferred_batch_norm(true));
  torch::manual_seed(5);
  torch::nn::Sequential reference = model();
  plain->distribute(group);
  deferred->distribute(group);
  const int64_t stage = deferred->stage();
  const std::string what = "deferred (stage " + std::to_string(stage) + "): ";
  torch::manual_seed(6);
  for (int pass = 0; pass < 2; ++pass) {
    const at::Tensor x = torch::randn({10, 8}) * (pass + 1) + pass;
    const at::Tensor target = torch::randn({10, 4});
    std::vector<at::Tensor> outs, input_grads;
    for (volt::Pipeline* pipe : {&plain, &deferred}) {
      const at::Tensor xi = x.clone().requires_grad_(true);
      const at::Tensor y = (*pipe)->forward(xi);
      torch::mse_loss(y, target).backward();
      outs.push_back(y.detach());
      input_grads.push_back(xi.grad());
    }
    check_same(outs[1], outs[0], true, what + "output");
    check_same(input_grads[1], input_grads[0], true, what + "input gradient");
    auto plain_params = plain->named_parameters(true);
    for (const auto& p : deferred->named_parameters(true)) {
      if (!p.value().grad().defined()) continue;
      check_same(p.value().grad(), plain_params[p.key()].grad(), true,
                 what + "gradient of " + p.key());
    }
    deferred_reference(reference, x, chunks);
  }
  const auto [first, last] = deferred->stage_layers(stage);
  auto want = reference->named_buffers(true);
  auto moved_per_micro_batch = plain->named_buffers(true);
  int64_t checked = 0;
  for (const auto& b : deferred->named_buffers(true)) {
    const int64_t layer = std::stoll(b.key().substr(0, b.key().find('.')));
    if (layer < first || layer >= last) continue;
    if (b.key().find("num_batches_tracked") != std::string::npos) {
      if (b.value().item<int64_t>() != 2 ||
          moved_per_micro_batch[b.key()].item<int64_t>() != 2 * chunks) {
        fail(what + b.key() + " is " + std::to_string(b.value().item<int64_t>()) +
             " (without deferral " +
             std::to_string(moved_per_micro_batch[b.key()].item<int64_t>()) + "), not 2");
      }
    } else {
      check_same(b.value(), want[b.key()], false, what + b.key());
    }
    ++checked;
  }
  if (checked != 3) fail(what + "checked " + std::to_string(checked) + " buffers, not 3");
  deferred->eval();
  reference->eval();
  const at::Tensor x = torch::randn({10, 8});
  check_same(deferred->forward(x).detach(), reference->forward(x).detach(), false,
             what + "eval output");
  say("rank " + std::to_string(group->rank()) + " deferred ok stage=" + std::to_string(stage));
  return 0;
}

/// The layers check_one_f_one_b runs: "plain" (layer_model), "dropout" (counted dropout layers
/// at 2, 5 and 9, the last stage's among them, each recomputation counted in `recomputed`),
/// "tied" (one Linear at both ends: stages 0 and 1 of 2, or 0 and 2 of 3) or "norm" (BatchNorm
/// in both stages, deferred_batch_norm on).
std::pair<torch::nn::Sequential, volt::PipelineOptions> schedule_model(const std::string& kind,
                                                                       int64_t stages,
                                                                       int64_t& recomputed) {
  namespace nn = torch::nn;
  if (kind == "dropout") {
    auto drop = [&recomputed] { return volt_test::counted_dropout(recomputed); };
    return {nn::Sequential(nn::Linear(8, 16), nn::Tanh(), drop(), nn::Linear(16, 24), nn::ReLU(),
                           drop(), nn::Linear(24, 16), nn::Tanh(), nn::Linear(16, 4), drop()),
            {}};
  }
  if (kind == "tied") {
    nn::Linear shared(8, 8);
    return {nn::Sequential(shared, nn::Tanh(), nn::Linear(8, 8), nn::Tanh(), shared),
            volt::PipelineOptions().balance(stages == 3 ? std::vector<int64_t>{2, 2, 1}
                                                        : std::vector<int64_t>{2, 3})};
  }
  if (kind == "norm") {
    return {nn::Sequential(nn::Linear(8, 16), nn::BatchNorm1d(16), nn::Tanh(), nn::Linear(16, 24),
                           nn::ReLU(), nn::Linear(24, 16), nn::BatchNorm1d(16), nn::Tanh(),
                           nn::Linear(16, 4)),
            volt::PipelineOptions().deferred_batch_norm(true)};
  }
  if (kind != "plain") fail("unknown --model " + kind);
  return {layer_model(), {}};
}

/// forward_loss (the 1F1B schedule) against forward() (GPipe) on the same layers, both fed the
/// same two batches (the second accumulating), each loss scaled by 0.5 before its backward (a
/// gradient the schedule cannot know in advance): the loss on every rank, every parameter's
/// gradient (this stage's, a tied one on each stage holding it; none elsewhere), the input's
/// gradient on every rank, the random state after the pipeline, BatchNorm's running statistics,
/// bit for bit with one micro-batch, else within 1e-6 (the micro-batches' gradients sum in
/// another order); the output asked for, bit for bit. Also: until its backward, forward_loss
/// leaves the gradients as they were; a checkpointed stage recomputes its dropout layers once per
/// checkpointed micro-batch; a second backward is a ValueError; without gradients it is
/// forward's loss. Prints "rank R 1f1b ok stage=S".
int check_one_f_one_b(const std::shared_ptr<volt::ProcessGroup>& group, int64_t chunks,
                      std::map<std::string, std::string>& a) {
  const std::string kind = a.count("--model") ? a["--model"] : "plain";
  const std::string checkpoint = a.count("--checkpoint") ? a["--checkpoint"] : "never";
  int64_t recomputed = 0;  // by the dropout layers of either pipeline
  auto make = [&] {
    torch::manual_seed(0);
    auto [layers, options] = schedule_model(kind, group->world_size(), recomputed);
    options.chunks(chunks).checkpoint(checkpoint);
    volt::Pipeline pipe(layers, options);
    pipe->distribute(group);
    return pipe;
  };
  auto mse = [](const at::Tensor& out, const at::Tensor& t) { return torch::mse_loss(out, t); };
  if (a.count("--bad-loss")) {
    // The last stage fails (exit 1, printed); the others with it, none at the timeout.
    volt::Pipeline pipe = make();
    const at::Tensor x = torch::randn({6, 8});
    if (a["--bad-loss"] == "param") {
      torch::nn::Linear extra(4, 4);
      pipe->forward_loss(x, torch::randn({6, 4}), [&](const at::Tensor& out, const at::Tensor& t) {
        return mse(extra->forward(out), t);
      });
    } else {
      pipe->forward_loss(x, torch::randn({4, 4}), mse);
    }
    say("rank " + std::to_string(group->rank()) + " bad loss passed");
    return 0;
  }
  volt::Pipeline gpipe = make(), ofob = make();
  const int64_t stage = ofob->stage();
  const bool exact = chunks == 1;
  const int64_t width = kind == "tied" ? 8 : 4;
  auto grads_of = [](volt::PipelineImpl& p) {
    std::vector<at::Tensor> out;
    for (const auto& t : p.parameters(true)) {
      out.push_back(t.grad().defined() ? t.grad().clone() : at::Tensor());
    }
    return out;
  };
  torch::manual_seed(1);
  for (int step = 0; step < 2; ++step) {
    const std::string what = "1f1b step " + std::to_string(step) + ": ";
    const at::Tensor x = torch::randn({10, 8});
    const at::Tensor target = torch::randn({10, width});
    const at::Tensor xg = x.clone().requires_grad_(true), xo = x.clone().requires_grad_(true);
    torch::manual_seed(10 + step);
    const at::Tensor yg = gpipe->forward(xg);
    const at::Tensor lg = mse(yg, target);
    const at::Tensor after_g = torch::rand({4});
    torch::manual_seed(10 + step);
    const std::vector<at::Tensor> before = grads_of(*ofob);
    const int64_t recomputed_before = recomputed;
    at::Tensor yo;  // the second step asks for the output too
    const at::Tensor lo = ofob->forward_loss(xo, target, mse, step == 1 ? &yo : nullptr);
    if (step == 0 && yo.defined()) fail(what + "an output nobody asked for");
    if (step == 1) {
      check_same(yo, yg.detach(), true, what + "output");
      if (yo.requires_grad()) fail(what + "the output has a graph");
    }
    const at::Tensor after_o = torch::rand({4});
    if (kind == "dropout") {
      // Each checkpointed micro-batch recomputes the stage's dropout layers once, inside the
      // schedule; except_last spares the last micro-batch, and every one on the last stage.
      const auto [first, last] = ofob->stage_layers(stage);
      int64_t drops = 0;
      for (int64_t l = first; l < last; ++l) drops += l == 2 || l == 5 || l == 9;
      const bool last_stage = stage == group->world_size() - 1;
      const int64_t runs = checkpoint == "always"                       ? chunks
                           : checkpoint == "except_last" && !last_stage ? chunks - 1
                                                                        : 0;
      if (recomputed - recomputed_before != drops * runs) {
        fail(what + "stage " + std::to_string(stage) + " recomputed its dropout layers " +
             std::to_string(recomputed - recomputed_before) + " times, not " +
             std::to_string(drops * runs));
      }
    }
    check_same(lo.detach(), lg.detach(), exact, what + "loss");
    check_same(after_o, after_g, true, what + "random state after the pipeline");
    if (!lo.requires_grad()) fail(what + "the loss needs no gradient");
    const std::vector<at::Tensor> waiting = grads_of(*ofob);
    for (size_t k = 0; k < before.size(); ++k) {
      if (before[k].defined() != waiting[k].defined() ||
          (before[k].defined() && !at::equal(before[k], waiting[k]))) {
        fail(what + "forward_loss changed a gradient before its backward");
      }
    }
    (lg * 0.5).backward();
    (lo * 0.5).backward();
    check_same(xo.grad(), xg.grad(), exact, what + "input gradient");
    auto want = gpipe->named_parameters(true);
    for (const auto& p : ofob->named_parameters(true)) {
      const at::Tensor& w = want[p.key()].grad();
      if (p.value().grad().defined() != w.defined()) {
        fail(what + "gradient of " + p.key() + (w.defined() ? " missing" : " not expected"));
      }
      // With micro-batches the schedules sum their gradients in other orders: round-off. With
      // one, the seed 0.5 scales every gradient exactly, as the schedule's scaling does.
      if (w.defined()) check_same(p.value().grad(), w, exact, what + p.key());
    }
    if (step == 1) {
      bool refused = false;
      try {
        lo.backward();
      } catch (const volt::ValueError& e) {
        refused = std::string(e.what()).find(
                      "a second backward through the same "
                      "forward_loss") != std::string::npos;
      }
      if (!refused) fail("a second backward through forward_loss was not a ValueError");
    }
  }
  auto want_buffers = gpipe->named_buffers(true);
  for (const auto& b : ofob->named_buffers(true)) {
    check_same(b.value(), want_buffers[b.key()], true, "1f1b buffer " + b.key());
  }
  {
    at::NoGradGuard no_grad;
    const at::Tensor x = torch::randn({6, 8}), target = torch::randn({6, width});
    torch::manual_seed(20);
    const at::Tensor lo = ofob->forward_loss(x, target, mse);
    torch::manual_seed(20);
    check_same(lo, mse(gpipe->forward(x), target), true, "1f1b no-grad loss");
  }
  say("rank " + std::to_string(group->rank()) + " 1f1b ok stage=" + std::to_string(stage));
  return 0;
}

/// Peak tensor bytes of a training step through two stages of 8 Linear(256, 256) + Tanh each, a
/// batch of 512 rows in 8 micro-batches, with forward() (GPipe: every micro-batch's activations
/// held until the backward) and with forward_loss() (1F1B: stage s holds at most 2 - s). Prints
/// "rank R memory gpipe=G 1f1b=O" (bytes above what the step starts with, gradients unset).
int check_schedule_memory(const std::shared_ptr<volt::ProcessGroup>& group) {
  volt::install_counting_cpu_allocator();
  torch::nn::Sequential layers;
  for (int i = 0; i < 16; ++i) {
    layers->push_back(torch::nn::Linear(256, 256));
    layers->push_back(torch::nn::Tanh());
  }
  torch::manual_seed(0);
  volt::Pipeline pipe(layers, volt::PipelineOptions().chunks(8));
  pipe->distribute(group);
  pipe->release_other_stages();
  const at::Tensor x = torch::randn({512, 256}), target = torch::randn({512, 256});
  auto mse = [](const at::Tensor& out, const at::Tensor& t) { return torch::mse_loss(out, t); };
  auto peak = [&](bool one_f_one_b) {
    for (auto& p : pipe->parameters()) p.mutable_grad() = at::Tensor();
    group->barrier();
    const int64_t base = volt::cpu_memory_stats().in_use;
    volt::reset_cpu_memory_peaks();
    const at::Tensor loss =
        one_f_one_b ? pipe->forward_loss(x, target, mse) : mse(pipe->forward(x), target);
    loss.backward();
    return volt::cpu_memory_stats().max_in_use - base;
  };
  peak(false);  // warm-up
  const int64_t gpipe = peak(false), ofob = peak(true);
  say("rank " + std::to_string(group->rank()) + " memory gpipe=" + std::to_string(gpipe) +
      " 1f1b=" + std::to_string(ofob));
  return 0;
}

int run_layer(std::map<std::string, std::string>& a) {
  const int64_t chunks = a.count("--chunks") ? std::stoll(a["--chunks"]) : 1;
  const char* world = std::getenv("WORLD_SIZE");
  auto env = volt::detect_cluster_environment(volt::process_env(),
                                              world != nullptr ? std::stoll(world) : 1, 1);
  auto group = std::make_shared<volt::ProcessGroup>(
      env, volt::ProcessGroupOptions().timeout(std::chrono::seconds(30)));
  torch::manual_seed(0);
  auto reference = layer_model();
  if (a.count("--deep-output")) {
    // A 9-dimensional activation between stages or out of the pipeline: every rank fails with
    // the sender's ValueError (exit 1, printed), none waits for the timeout.
    volt::Pipeline deep(deep_output_model(a["--deep-output"] == "last"),
                        volt::PipelineOptions().balance({2, 2}));
    deep->distribute(group);
    deep->forward(torch::randn({4, 8}));
    say("rank " + std::to_string(group->rank()) + " deep output passed");
    return 0;
  }
  if (a.count("--no-batch-rows")) {
    // The micro-batches' outputs are joined along dim 0: a reduced output (0-dim) or one with
    // the batch in dim 1 cannot be; every rank fails with the last stage's ValueError.
    const bool reduced = a["--no-batch-rows"] == "reduced";
    torch::nn::Functional last = reduced
                                     ? torch::nn::Functional([](at::Tensor t) { return t.sum(); })
                                     : torch::nn::Functional([](at::Tensor t) { return t.t(); });
    volt::Pipeline odd(torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::Tanh(),
                                             torch::nn::Linear(16, 3), last),
                       volt::PipelineOptions().balance({2, 2}).chunks(chunks));
    odd->distribute(group);
    odd->forward(torch::randn({4, 8}));
    say("rank " + std::to_string(group->rank()) + " no batch rows passed");
    return 0;
  }
  if (a.count("--tied") && a["--tied"] == "buffer") {
    // One BatchNorm in both stages: its running statistics would be updated by each apart.
    // Every rank fails with the same ConfigError before any transfer (exit 1, printed).
    torch::nn::BatchNorm1d norm(8);
    volt::Pipeline shared(
        torch::nn::Sequential(torch::nn::Linear(8, 8), norm, torch::nn::Linear(8, 8), norm),
        volt::PipelineOptions().balance({2, 2}));
    group->barrier();  // every rank connected before one fails (as after the strategy's setup)
    shared->distribute(group);
    say("rank " + std::to_string(group->rank()) + " shared buffer passed");
    return 0;
  }
  if (a.count("--integer-between")) return check_integer_between(group, chunks);
  if (a.count("--schedule-memory")) return check_schedule_memory(group);
  if (a.count("--schedule")) return check_one_f_one_b(group, chunks, a);
  if (a.count("--tied")) return check_tied(group, chunks);
  if (a.count("--deferred")) {
    return check_deferred(group, chunks, a.count("--checkpoint") ? a["--checkpoint"] : "never");
  }
  if (a.count("--checkpoint") || a.count("--interval")) {
    return check_checkpointed(group,
                              volt::PipelineOptions()
                                  .chunks(chunks)
                                  .checkpoint(a.count("--checkpoint") ? a["--checkpoint"] : "never")
                                  .activation_checkpoint_interval(
                                      a.count("--interval") ? std::stoll(a["--interval"]) : 0));
  }
  torch::manual_seed(0);
  volt::PipelineOptions options;
  options.chunks(chunks);
  if (a.count("--balance")) options.balance(parse_list(a["--balance"]));
  if (a.count("--method")) options.partition_method(a["--method"]);
  volt::Pipeline pipe(layer_model(), options);
  pipe->distribute(group);
  const int64_t stage = pipe->stage();
  if (a.count("--bad-header") && group->rank() == 0) {
    // Stage 0 runs other code: what stage 1 receives first is no activation header.
    group->send(at::full({14}, 99, at::kLong), 1);  // a header's size
    say("rank 0 sent a bad header");
    return 0;
  }
  if (a.count("--grad-call")) {
    // torch::autograd::grad through the pipeline: every rank fails with the same ValueError
    // before any transfer (none waits for the timeout), leaving no gradient; then a plain
    // backward through a new forward works.
    const at::Tensor x = torch::randn({4, 8}).requires_grad_(true);
    const at::Tensor loss = pipe->forward(x).sum();
    try {
      torch::autograd::grad({loss}, {x});
      say("rank " + std::to_string(group->rank()) + " grad() passed");
      return 1;
    } catch (const volt::ValueError& e) {
      say(e.what());
    }
    for (const auto& p : pipe->parameters()) {
      if (p.grad().defined()) fail("a gradient was written by the refused grad()");
    }
    pipe->forward(x).sum().backward();
    if (!x.grad().defined()) fail("no input gradient after the plain backward");
    say("rank " + std::to_string(group->rank()) + " grad-call ok");
    return 0;
  }
  const bool exact = chunks == 1;

  torch::manual_seed(1);
  const at::Tensor x = torch::randn({10, 8});
  const at::Tensor target = torch::randn({10, 4});
  const at::Tensor x_ref = x.clone().requires_grad_(true);
  const at::Tensor x_pipe = x.clone().requires_grad_(true);
  const at::Tensor out_ref = reference->forward(x_ref);
  torch::mse_loss(out_ref, target).backward();
  const at::Tensor out = pipe->forward(x_pipe);
  torch::mse_loss(out, target).backward();
  check_same(out.detach(), out_ref.detach(), exact, "output");
  // Every rank's input gets stage 0's input gradient (so layers before the pipeline train alike).
  check_same(x_pipe.grad(), x_ref.grad(), exact, "input gradient");
  check_stage_gradients(*pipe, *reference, exact, "");
  const auto [first, last] = pipe->stage_layers(stage);
  auto ref_params = reference->named_parameters(true);
  auto pipe_params = pipe->named_parameters(true);
  // Each stage steps its own parameters; gather() makes every rank's model whole.
  torch::optim::SGD(reference->parameters(), 0.1).step();
  torch::optim::SGD(pipe->parameters(), 0.1).step();
  pipe->gather();
  for (const auto& p : pipe_params) {
    check_same(p.value().detach(), ref_params[p.key()].detach(), exact, "gathered " + p.key());
  }
  // Freed, the other stages' weights are empty on this rank; gathered, whole again.
  pipe->release_other_stages();
  for (const auto& p : pipe->foreign_parameters()) {
    if (p.numel() != 0) fail("release_other_stages kept another stage's weight");
  }
  for (const auto& p : pipe->stage_parameters(stage)) {
    if (p.numel() == 0) fail("release_other_stages freed this stage's weight");
  }
  // A summary (ModelSummary's table) counts the freed weights with the shapes they had.
  const volt::ModelSummaryTable summary = volt::summarize(*pipe, -1);
  const volt::ModelSummaryTable whole = volt::summarize(*reference, -1);
  if (summary.total_params != whole.total_params ||
      summary.total_param_bytes != whole.total_param_bytes) {
    fail("the summary of a released pipeline counts " + std::to_string(summary.total_params) +
         " parameters, not " + std::to_string(whole.total_params));
  }
  for (size_t i = 0; i < whole.rows.size(); ++i) {
    if (summary.rows.at(i).params != whole.rows[i].params)
      fail("summary row " + whole.rows[i].name);
  }
  {
    torch::NoGradGuard no_grad;
    check_same(pipe->forward(x), reference->forward(x), exact, "released no-grad output");
  }
  pipe->gather();
  for (const auto& p : pipe_params) {
    check_same(p.value().detach(), ref_params[p.key()].detach(), exact, "regathered " + p.key());
  }
  {
    torch::NoGradGuard no_grad;
    check_same(pipe->forward(x), reference->forward(x), exact, "no-grad output");
  }
  {
    c10::InferenceMode inference;
    check_same(pipe->forward(x), reference->forward(x), exact, "inference-mode output");
  }
  check_chained(group, chunks, exact, x);
  check_random(group, chunks);
  say("rank " + std::to_string(group->rank()) + " layer ok stage=" + std::to_string(stage) +
      " layers=" + std::to_string(first) + "-" + std::to_string(last - 1) +
      " chunks=" + std::to_string(chunks));
  return 0;
}

/// A layer before the pipeline, the pipeline, a layer after it (every rank trains both alike).
class PipeNet : public volt::Module {
 public:
  PipeNet(volt::PipelineOptions options, std::string optimizer, bool dropout, bool tied = false,
          bool one_f_one_b = false, bool batchnorm = false)
      : optimizer_(std::move(optimizer)), one_f_one_b_(one_f_one_b) {
    pre = register_module("pre", torch::nn::Linear(8, 16));
    torch::nn::Sequential layers(torch::nn::Tanh(), torch::nn::Linear(16, 32));
    if (batchnorm) layers->push_back(torch::nn::BatchNorm1d(32));
    layers->push_back(torch::nn::ReLU());
    if (dropout) layers->push_back(torch::nn::Dropout(0.2));
    torch::nn::Linear square(32, 32);
    layers->push_back(square);
    layers->push_back(torch::nn::Tanh());
    if (batchnorm) layers->push_back(torch::nn::BatchNorm1d(32));
    if (tied) {  // the same layer again: layers 3 and 5, one in each stage at balance 4,4
      layers->push_back(square);
      layers->push_back(torch::nn::Tanh());
    }
    if (dropout) layers->push_back(torch::nn::Dropout(0.3));
    layers->push_back(torch::nn::Linear(32, 16));
    if (one_f_one_b) {
      // forward_loss computes the loss in the last stage: the head's layers belong to it.
      if (dropout) layers->push_back(torch::nn::Dropout(0.25));
      layers->push_back(torch::nn::Linear(16, 2));
    }
    net = register_module("net", volt::Pipeline(layers, options));
    if (!one_f_one_b) {
      head = register_module("head", torch::nn::Linear(16, 2));
      if (dropout) drop = register_module("drop", torch::nn::Dropout(0.25));
    }
    // The pipeline's last layer (the last stage's) can be given an inf gradient.
    auto last = net->layers()->ptr(net->layers()->size() - 1);
    last->named_parameters()["weight"].register_hook([this](const at::Tensor& g) {
      return poison_ ? g * std::numeric_limits<float>::infinity() : g;
    });
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor y = net->forward(pre->forward(x));
    if (one_f_one_b_) return y;
    // --side-from R: ranks from R on (a later replica) add a layer the others never use, as a
    // data-dependent branch would.
    if (side && rank_ >= side_from) y = y + side->forward(y);
    return head->forward(drop ? drop->forward(y) : y);
  }
  void add_side(int64_t from_rank) {
    side_from = from_rank;
    side = register_module("side", torch::nn::Linear(16, 16));
  }
  at::Tensor training_step(const volt::Batch& b, int64_t batch_idx) override {
    if (die_batch >= 0 && batch_idx == die_batch && rank_ == die_rank) ::raise(SIGKILL);
    VOLT_CHECK(!(throw_batch >= 0 && batch_idx == throw_batch && rank_ == throw_rank),
               volt::ValueError, "[PipeNet] rank ", rank_, " fails at batch ", batch_idx, ".");
    poison_ = calls_++ == inf_call;
    const at::Tensor loss =
        one_f_one_b_ ? net->forward_loss(pre->forward(b.input), b.target,
                                         [](const at::Tensor& out, const at::Tensor& target) {
                                           return torch::cross_entropy_loss(out, target);
                                         })
                     : torch::cross_entropy_loss(forward(b.input), b.target);
    log("train_loss", loss);
    return loss;
  }
  void validation_step(const volt::Batch& b, int64_t) override {
    log("val_loss", torch::cross_entropy_loss(forward(b.input), b.target));
  }
  at::Tensor predict_step(const volt::Batch& b, int64_t) override { return forward(b.input); }
  std::vector<volt::OptimizerConfig> configure_optimizers() override {
    std::shared_ptr<torch::optim::Optimizer> opt;
    const std::vector<at::Tensor> params = volt::distinct_parameters(*this);
    if (optimizer_ == "adamw") {
      opt = std::make_shared<torch::optim::AdamW>(params, torch::optim::AdamWOptions(0.01));
    } else if (optimizer_ == "fused_adamw") {
      opt = std::make_shared<volt::FusedAdamW>(params, volt::FusedAdamWOptions(0.01));
    } else {
      opt =
          std::make_shared<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1).momentum(0.9));
    }
    optimizer = opt;
    return {volt::OptimizerConfig(opt)};
  }
  at::Tensor flat() {
    std::vector<at::Tensor> v;
    for (auto& p : volt::distinct_parameters(*this)) v.push_back(p.detach().reshape({-1}));
    return torch::cat(v).clone();
  }
  void set_rank(int64_t r) { rank_ = r; }

  torch::nn::Linear pre{nullptr}, head{nullptr}, side{nullptr};
  int64_t side_from = 0;
  torch::nn::Dropout drop{nullptr};  // after the pipeline (--dropout)
  volt::Pipeline net{nullptr};
  int64_t die_rank = -1, die_batch = -1;
  int64_t throw_rank = -1, throw_batch = -1;
  int64_t inf_call = -1;  // the training_step call whose backward gets an inf gradient
  std::shared_ptr<torch::optim::Optimizer> optimizer;

 private:
  std::string optimizer_;
  bool one_f_one_b_ = false;  // the training loss through forward_loss (the 1F1B schedule)
  int64_t rank_ = 0;
  int64_t calls_ = 0;
  bool poison_ = false;
};

/// Tells the module its rank once the strategy knows it.
class RankProbe : public volt::Callback {
 public:
  explicit RankProbe(PipeNet& net) : net_(net) {}
  std::string state_key() const override { return "RankProbe"; }
  void on_fit_start(volt::RunContext& run, volt::Module&) override {
    net_.set_rank(run.global_rank());
  }
  void on_train_start(volt::RunContext&, volt::Module&) override {
    stage = net_.net->stage();
    for (const auto& p : net_.parameters()) held += p.numel();
  }
  void on_train_end(volt::RunContext&, volt::Module&) override {
    pre = torch::cat({net_.pre->weight.detach().reshape({-1}), net_.pre->bias.detach()});
    outside =
        net_.head
            ? torch::cat({pre, net_.head->weight.detach().reshape({-1}), net_.head->bias.detach()})
            : pre;
  }
  // --save-peak: after the second batch, a weights-only checkpoint to this path, printing
  // "rank R save peak=P others=O": the peak of counted CPU bytes while it was saved, and the
  // bytes of the other stages' weights (which this rank does not hold).
  void on_train_batch_end(volt::RunContext& run, volt::Module&, const volt::Batch&,
                          int64_t batch_idx) override {
    if (peak_path.empty() || peak_taken || batch_idx != 1) return;
    peak_taken = true;
    const volt::PipelineImpl& pipe = *net_.net;
    std::unordered_set<const c10::TensorImpl*> counted;
    for (const auto& t : pipe.stage_state(pipe.stage())) counted.insert(t.unsafeGetTensorImpl());
    int64_t others = 0, biggest_other = 0;
    for (int64_t s = 0; s < pipe.num_stages(); ++s) {
      for (const auto& t : pipe.stage_state(s)) {
        if (!counted.insert(t.unsafeGetTensorImpl()).second) continue;
        int64_t n = 1;
        for (int64_t d : pipe.whole_shape(t)) n *= d;
        others += n * static_cast<int64_t>(t.element_size());
        biggest_other = std::max(biggest_other, n * static_cast<int64_t>(t.element_size()));
      }
    }
    const int64_t base = volt::cpu_memory_stats().in_use;
    volt::reset_cpu_memory_peaks();
    run.save_checkpoint(peak_path, /*weights_only=*/true);
    const volt::CpuMemoryStats after = volt::cpu_memory_stats();
    const int64_t peak = after.max_in_use - base;
    say("rank " + std::to_string(run.global_rank()) + " save peak=" + std::to_string(peak) +
        " others=" + std::to_string(others) + " largest=" + std::to_string(after.max_alloc_size) +
        " biggest_other=" + std::to_string(biggest_other));
  }
  std::string peak_path;
  bool peak_taken = false;
  int64_t stage = -1;
  int64_t held = 0;    // parameter elements this rank holds while it trains
  at::Tensor pre;      // the layer before the pipeline as this rank trained it (before teardown)
  at::Tensor outside;  // the layers before and after it

 private:
  PipeNet& net_;
};

int run_fit(std::map<std::string, std::string>& a) {
  auto num = [&](const std::string& k, int64_t d) { return a.count(k) ? std::stoll(a[k]) : d; };
  const int64_t devices = num("--devices", 2);
  volt::PipelineOptions options;
  options.chunks(num("--chunks", 1));
  if (a.count("--model-checkpoint")) options.checkpoint(a["--model-checkpoint"]);
  options.activation_checkpoint_interval(num("--interval", 0));
  if (a.count("--balance")) options.balance(parse_list(a["--balance"]));
  torch::manual_seed(0);
  PipeNet model(options, a.count("--optimizer") ? a["--optimizer"] : "sgd",
                num("--dropout", 0) != 0, num("--tied", 0) != 0,
                a.count("--schedule") != 0 && a["--schedule"] == "1f1b",
                num("--batchnorm", 0) != 0);
  if (a.count("--side-from")) model.add_side(num("--side-from", 0));
  model.die_rank = num("--die-rank", -1);
  model.die_batch = num("--die-batch", -1);
  model.throw_rank = num("--throw-rank", -1);
  model.throw_batch = num("--throw-batch", -1);
  model.inf_call = num("--inf-call", -1);
  auto probe = std::make_shared<RankProbe>(model);
  if (num("--save-peak", 0) != 0) {
    volt::install_counting_cpu_allocator();
    probe->peak_path = a["--root"] + "/peak.ckpt";
  }
  std::vector<std::shared_ptr<volt::Callback>> callbacks{probe};
  if (num("--ckpt-every-step", 0) != 0) {
    callbacks.push_back(std::make_shared<volt::ModelCheckpoint>(volt::ModelCheckpointOptions()
                                                                    .dirpath(a["--root"] + "/ckpt")
                                                                    .filename("{step}")
                                                                    .every_n_train_steps(1)
                                                                    .save_top_k(-1)));
  }
  if (num("--ema", 0) != 0) {
    callbacks.push_back(std::make_shared<volt::EMAWeightAveraging>(
        volt::EMAWeightAveragingOptions().decay(0.8).update_every_n_steps(1)));
  }
  if (num("--swa", 0) != 0) {
    callbacks.push_back(std::make_shared<volt::StochasticWeightAveraging>(
        volt::StochasticWeightAveragingOptions({0.05}).swa_epoch_start(1).annealing_epochs(1)));
  }
  if (a.count("--save-at")) {
    const auto at = parse_list(a["--save-at"]);
    callbacks.push_back(
        std::make_shared<volt_test::SaveAt>(at.at(0), at.at(1), a["--root"] + "/save_at.ckpt"));
  }
  volt::Spec<volt::Strategy> strategy("single_device");
  if (devices > 1) {
    strategy = volt::named<volt::Strategy>(
        "pipeline", {{"timeout_s", static_cast<double>(num("--timeout", 60))},
                     {"chunks", num("--strategy-chunks", 0)},
                     {"checkpoint", a.count("--checkpoint") ? a["--checkpoint"] : std::string()},
                     {"deferred_batch_norm", num("--deferred", 0) != 0},
                     {"stages", num("--stages", 0)},
                     {"release_other_stages", num("--release", 1) != 0}});
  }
  volt::TrainerOptions o = volt_test::quiet(a["--root"])
                               .strategy(strategy)
                               .devices(devices)
                               .max_epochs(num("--epochs", 2))
                               .max_steps(num("--max-steps", -1))
                               .accumulate_grad_batches(num("--accum", 1))
                               .callbacks(callbacks);
  if (a.count("--clip")) o.gradient_clip_val(std::stod(a["--clip"]));
  if (num("--trace", 0) != 0) o.trace_training_step(true);
  if (num("--sync-bn", 0) != 0) o.sync_batchnorm(true);
  if (num("--scaling", 0) != 0) {
    // The GEMMs in fp32 whatever this CPU's bf16 probe measured (cpu_policy off, the matmul
    // family listed): what the probe decides on a CPU where bf16 is slower, so that the tests
    // compare stage splits to fp32 round-off on every machine (on a CPU with fast bf16 the
    // probe would lower them, and micro-batches round differently in bf16).
    o.precision(std::make_shared<volt::MixedPrecision>(
        volt::MixedPrecisionOptions()
            .linear_min_macs(std::numeric_limits<int64_t>::max())
            .loss_scaling(true)
            .scaler(volt::GradScalerOptions().init_scale(256.0).growth_interval(100))));
  }
  if (a.count("--precision")) o.precision(volt::Spec<volt::Precision>(a["--precision"]));
  volt::Trainer trainer(o);
  auto data = volt_test::blobs(96, 8, 3);
  auto val = volt_test::blobs(32, 8, 4);
  auto fit = [&] {
    trainer.fit(
        model,
        volt::DataLoader(data, volt::DataLoaderOptions(num("--batch", 16)).shuffle(true).seed(11)),
        volt::DataLoader(val, volt::DataLoaderOptions(16)),
        a.count("--resume") ? a["--resume"] : "");
  };
  if (num("--inside-catch", 0) != 0) {
    // A program retrying after an error it handled: the fit runs inside its catch block, where
    // std::current_exception() is that error's, not the fit's.
    try {
      throw std::runtime_error("an earlier error the program handled");
    } catch (const std::exception&) {
      fit();
    }
  } else {
    fit();
  }
  const int64_t rank = trainer.strategy().rank();
  std::filesystem::create_directories(std::filesystem::path(a["--out"]).parent_path());
  torch::save(model.flat(), a["--out"] + ".rank" + std::to_string(rank) + ".pt");
  std::vector<at::Tensor> buffers;
  for (const auto& b : model.buffers(true)) {
    if (b.defined()) buffers.push_back(b.detach().to(at::kDouble).reshape({-1}));
  }
  if (!buffers.empty()) {
    torch::save(torch::cat(buffers), a["--out"] + ".buffers.rank" + std::to_string(rank) + ".pt");
  }
  if (probe->pre.defined()) {
    torch::save(probe->pre, a["--out"] + ".pre.rank" + std::to_string(rank) + ".pt");
    torch::save(probe->outside, a["--out"] + ".outside.rank" + std::to_string(rank) + ".pt");
  }
  if (num("--predict", 0) != 0) {
    // A predict after the fit: through the pipeline again (set up anew), every rank's logits.
    auto predictions = trainer.predict(model, volt::DataLoader(val, volt::DataLoaderOptions(16)));
    torch::save(torch::cat(predictions), a["--out"] + ".pred.rank" + std::to_string(rank) + ".pt");
    // The model as the predict left it (the other stages' weights were released there too).
    torch::save(model.flat(), a["--out"] + ".after_predict.rank" + std::to_string(rank) + ".pt");
  }
  say("rank " + std::to_string(rank) + " done step=" + std::to_string(trainer.state().global_step) +
      " stage=" + std::to_string(probe->stage) + " states=" +
      std::to_string(model.optimizer->state().size()) + " held=" + std::to_string(probe->held));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: volt_pipeline_worker layer|fit [--key value]...\n");
    return 2;
  }
  const std::string mode = argv[1];
  std::map<std::string, std::string> a;
  for (int i = 2; i + 1 < argc; i += 2) a[argv[i]] = argv[i + 1];
  try {
    if (mode == "layer") return run_layer(a);
    if (mode == "fit") return run_fit(a);
  } catch (const std::exception& e) {
    std::string what = e.what();
    for (auto& c : what) {
      if (c == '\n') c = ' ';
    }
    say(std::string("error: ") + what);
    return 1;
  }
  std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 2;
}
