// Pipeline parallelism: the partition, the Pipeline layer against its Sequential (in this process
// and over 2-4 real processes), and PipelineStrategy fits against one process, resumed at other
// stage counts, with loss scaling, clipping, accumulation and a dead stage.
#include "volt/nn/pipeline.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <regex>
#include <set>
#include <tuple>

#include "build_paths.h"
#include "counted_dropout.h"
#include "distributed/detail/net.h"
#include "error_text.h"
#include "processes.h"
#include "requires.h"
#include "tiny.h"
#include "training_jobs.h"
#include "volt/distributed/process_group.h"
#include "volt/strategies/pipeline.h"

namespace {

using volt::ConfigError;
using volt_test::error_of;

// ---------------------------------------------------------------- partition

TEST(PartitionLayers, UniformGivesTheFirstStagesOneLayerMore) {
  EXPECT_EQ(volt::partition_layers({1, 1, 1, 1, 1, 1, 1}, 3, {}, "uniform"),
            (std::vector<int64_t>{0, 3, 5, 7}));
  EXPECT_EQ(volt::partition_layers({5, 5}, 2, {}, "uniform"), (std::vector<int64_t>{0, 1, 2}));
}

TEST(PartitionLayers, ParametersMakesTheLargestStageAsSmallAsItCanBe) {
  // Alone, 400 and 408 each need a stage: the smallest possible largest stage is 468 (400+68).
  EXPECT_EQ(volt::partition_layers({144, 0, 408, 0, 400, 0, 68}, 3, {}, "parameters"),
            (std::vector<int64_t>{0, 1, 3, 7}));
  // One heavy layer first: the rest share the second stage.
  EXPECT_EQ(volt::partition_layers({100, 10, 10, 10}, 2, {}, "parameters"),
            (std::vector<int64_t>{0, 1, 4}));
  EXPECT_EQ(volt::partition_layers({1, 2, 3, 4, 5, 6}, 3, {}, "parameters"),
            (std::vector<int64_t>{0, 3, 5, 6}));
  // Every stage gets a layer even when weights are zero.
  EXPECT_EQ(volt::partition_layers({0, 0, 0}, 3, {}, "parameters"),
            (std::vector<int64_t>{0, 1, 2, 3}));
}

TEST(PartitionLayers, BalanceIsTakenAsGiven) {
  EXPECT_EQ(volt::partition_layers({9, 9, 9, 9}, 2, {3, 1}, "ignored"),
            (std::vector<int64_t>{0, 3, 4}));
}

TEST(PartitionLayers, BadPartitionsAreConfigErrorsSayingWhatToChange) {
  auto err = [](std::vector<int64_t> w, int64_t stages, std::vector<int64_t> balance,
                std::string method) {
    return error_of<ConfigError>([&] { volt::partition_layers(w, stages, balance, method); });
  };
  EXPECT_NE(err({1, 1}, 3, {}, "uniform").find("3 stages but only 2 layers"), std::string::npos);
  EXPECT_NE(err({1, 1, 1}, 2, {1}, "uniform").find("balance has 1 entries for 2 stages"),
            std::string::npos);
  EXPECT_NE(
      err({1, 1, 1}, 2, {1, 1}, "uniform").find("balance sums to 2 layers but the pipeline has 3"),
      std::string::npos);
  EXPECT_NE(err({1, 1, 1}, 2, {3, 0}, "uniform").find("every stage needs at least one layer"),
            std::string::npos);
  EXPECT_NE(err({1, 1, 1}, 2, {}, "type:Linear").find("unknown partition_method 'type:Linear'"),
            std::string::npos);
  EXPECT_NE(err({1}, 0, {}, "uniform").find("at least one stage"), std::string::npos);
}

// ---------------------------------------------------------------- the layer in one process

torch::nn::Sequential small_layers() {
  return torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::ReLU(), torch::nn::Linear(8, 3));
}

TEST(Pipeline, UndistributedItIsItsSequentialWithTheSameNames) {
  torch::manual_seed(0);
  auto seq = small_layers();
  torch::manual_seed(0);
  volt::Pipeline pipe(small_layers(), volt::PipelineOptions().chunks(4));
  const auto want = seq->named_parameters(true);
  const auto got = pipe->named_parameters(true);
  ASSERT_EQ(got.keys(), want.keys());  // "0.weight", ...: checkpoints move between the two
  const auto x = torch::randn({6, 4});
  EXPECT_TRUE(torch::equal(pipe->forward(x), seq->forward(x)));
  EXPECT_FALSE(pipe->distributed());
  EXPECT_EQ(pipe->num_stages(), 1);
  EXPECT_EQ(pipe->stage_layers(0), (std::pair<int64_t, int64_t>{0, 3}));
  EXPECT_EQ(pipe->stage_parameters(0).size(), 4u);
  EXPECT_TRUE(pipe->foreign_parameters().empty());
  std::ostringstream os;
  pipe->pretty_print(os);
  EXPECT_EQ(os.str(), "volt::Pipeline(layers=3, chunks=4)");
}

TEST(Pipeline, BadConstructionIsAConfigError) {
  EXPECT_NE(error_of<ConfigError>([] {
              volt::Pipeline(torch::nn::Sequential());
            }).find("at least one layer"),
            std::string::npos);
  EXPECT_NE(error_of<ConfigError>([] {
              volt::Pipeline(small_layers(), volt::PipelineOptions().chunks(0));
            }).find("chunks must be at least 1"),
            std::string::npos);
}

// The activation-checkpoint nodes in `y`'s graph (volt::checkpoint's autograd function).
int64_t checkpoint_nodes(const at::Tensor& y) {
  int64_t count = 0;
  std::vector<torch::autograd::Node*> todo{y.grad_fn().get()};
  std::set<torch::autograd::Node*> seen;
  while (!todo.empty()) {
    torch::autograd::Node* node = todo.back();
    todo.pop_back();
    if (node == nullptr || !seen.insert(node).second) continue;
    count += node->name().find("CheckpointNode") != std::string::npos;
    for (const auto& edge : node->next_edges()) todo.push_back(edge.function.get());
  }
  return count;
}

TEST(Pipeline, UndistributedCheckpointingRecomputesInBackwardAndGivesTheSameGradients) {
  // One process: the whole batch is the one (last) micro-batch, so "always" checkpoints it and
  // "except_last" does not; an interval checkpoints runs of that many layers. Gradients and
  // BatchNorm's running statistics are the un-checkpointed ones bit for bit.
  int64_t recomputed = 0;
  auto layers = [&recomputed] {
    return torch::nn::Sequential(torch::nn::Linear(4, 8), volt_test::counted_dropout(recomputed),
                                 torch::nn::BatchNorm1d(8), torch::nn::Linear(8, 3),
                                 volt_test::counted_dropout(recomputed));
  };
  const auto x = torch::randn({6, 4});
  auto run = [&](volt::PipelineOptions options) {
    torch::manual_seed(0);
    volt::Pipeline pipe(layers(), options);
    torch::manual_seed(1);
    recomputed = 0;
    const at::Tensor y = pipe->forward(x);
    const int64_t nodes = checkpoint_nodes(y);
    y.square().sum().backward();
    std::vector<at::Tensor> grads;  // and the buffers, which the recomputation leaves alone
    for (const auto& p : pipe->parameters()) grads.push_back(p.grad());
    for (const auto& b : pipe->buffers()) grads.push_back(b.clone());
    return std::make_tuple(recomputed, nodes, grads);
  };
  const auto plain = run(volt::PipelineOptions());
  EXPECT_EQ(std::get<0>(plain), 0);
  EXPECT_EQ(std::get<1>(plain), 0);
  struct Case {
    volt::PipelineOptions options;
    int64_t recomputed;  // counted layers (1 and 4) recomputed
    int64_t nodes;       // checkpointed runs
  };
  for (const Case& c : std::vector<Case>{
           {volt::PipelineOptions().checkpoint("always"), 2, 1},
           {volt::PipelineOptions().checkpoint("except_last"), 0, 0},
           {volt::PipelineOptions().activation_checkpoint_interval(2), 2, 3},  // 0-1, 2-3, 4
           {volt::PipelineOptions().activation_checkpoint_interval(4), 2, 2},  // 0-3, 4
           {volt::PipelineOptions().checkpoint("always").activation_checkpoint_interval(2), 2, 1},
       }) {
    SCOPED_TRACE(::testing::PrintToString(c.options));
    const auto [recomputes, nodes, grads] = run(c.options);
    EXPECT_EQ(recomputes, c.recomputed);
    EXPECT_EQ(nodes, c.nodes);
    const auto& want = std::get<2>(plain);
    ASSERT_EQ(grads.size(), want.size());
    for (size_t i = 0; i < grads.size(); ++i) {
      EXPECT_TRUE(torch::equal(grads[i], want[i])) << "gradient or buffer " << i;
    }
  }
  {
    torch::NoGradGuard no_grad;  // nothing to recompute for
    volt::Pipeline pipe(layers(), volt::PipelineOptions().checkpoint("always"));
    recomputed = 0;
    pipe->forward(x);
    EXPECT_EQ(recomputed, 0);
  }
  std::ostringstream os;
  volt::Pipeline(
      layers(), volt::PipelineOptions().checkpoint("except_last").activation_checkpoint_interval(2))
      ->pretty_print(os);
  EXPECT_EQ(os.str(),
            "volt::Pipeline(layers=5, chunks=1, checkpoint=except_last, "
            "activation_checkpoint_interval=2)");
}

TEST(Pipeline, DeferredBatchNormUndistributedIsTheSequential) {
  // One process runs the whole batch as one micro-batch: BatchNorm moves its statistics itself.
  auto model = [] {
    return torch::nn::Sequential(torch::nn::Linear(4, 6), torch::nn::BatchNorm1d(6),
                                 torch::nn::Linear(6, 2));
  };
  torch::manual_seed(2);
  torch::nn::Sequential reference = model();
  torch::manual_seed(2);
  volt::Pipeline pipe(model(), volt::PipelineOptions().chunks(3).deferred_batch_norm(true));
  const at::Tensor x = torch::randn({9, 4});
  EXPECT_TRUE(at::equal(pipe->forward(x), reference->forward(x)));
  auto want = reference->named_buffers(true);
  for (const auto& b : pipe->named_buffers(true)) {
    EXPECT_TRUE(at::equal(b.value(), want[b.key()])) << b.key();
  }
  EXPECT_EQ(pipe->named_buffers(true)["1.num_batches_tracked"].item<int64_t>(), 1);
}

/// A layer calling its own BatchNorm (as a residual block does).
struct NormedBlockImpl : torch::nn::Module {
  NormedBlockImpl() {
    linear = register_module("linear", torch::nn::Linear(6, 6));
    norm = register_module("norm", torch::nn::BatchNorm1d(6));
  }
  at::Tensor forward(const at::Tensor& x) { return norm->forward(linear->forward(x)); }
  torch::nn::Linear linear{nullptr};
  torch::nn::BatchNorm1d norm{nullptr};
};
TORCH_MODULE(NormedBlock);

TEST(Pipeline, DeferredBatchNormRefusesABatchNormInsideAnEntry) {
  // The entry's own code calls it: the pipeline cannot normalise it without moving its
  // statistics, so it says so instead of leaving it per micro-batch.
  auto nested = [] {
    return torch::nn::Sequential(torch::nn::Linear(4, 6), NormedBlock(), torch::nn::Linear(6, 2));
  };
  const std::string what = volt_test::error_of<volt::ConfigError>(
      [&] { volt::Pipeline(nested(), volt::PipelineOptions().deferred_batch_norm(true)); });
  EXPECT_NE(what.find("[Pipeline] deferred_batch_norm"), std::string::npos) << what;
  EXPECT_NE(what.find("'1.norm'"), std::string::npos) << what;
  EXPECT_NE(what.find("leave deferred_batch_norm off"), std::string::npos) << what;
  volt::Pipeline pipe(nested());  // off: fine
  EXPECT_EQ(volt_test::error_of<volt::ConfigError>([&] { pipe->set_deferred_batch_norm(true); }),
            what);
  EXPECT_FALSE(pipe->options().deferred_batch_norm());
  // BatchNorm entries of its own are reached.
  volt::Pipeline flat(torch::nn::Sequential(torch::nn::Linear(4, 6), torch::nn::BatchNorm1d(6)));
  flat->set_deferred_batch_norm(true);
  EXPECT_TRUE(flat->options().deferred_batch_norm());
}

TEST(Pipeline, BadCheckpointOptionsAreConfigErrors) {
  EXPECT_NE(
      error_of<ConfigError>(
          [] { volt::Pipeline(small_layers(), volt::PipelineOptions().checkpoint("sometimes")); })
          .find("[Pipeline] checkpoint='sometimes' is not a checkpointing mode; use \"never\", "
                "\"always\" or \"except_last\""),
      std::string::npos);
  EXPECT_NE(error_of<ConfigError>([] {
              volt::Pipeline(small_layers(),
                             volt::PipelineOptions().activation_checkpoint_interval(-1));
            }).find("activation_checkpoint_interval must be >= 0"),
            std::string::npos);
  volt::Pipeline pipe(small_layers());
  EXPECT_NE(error_of<ConfigError>([&] { pipe->set_checkpoint("Always"); }).find("'Always'"),
            std::string::npos);
  EXPECT_EQ(pipe->options().checkpoint(), "never");  // unchanged by the refused value
}

TEST(Pipeline, UndistributedForwardLossIsTheLossOfForward) {
  torch::manual_seed(0);
  volt::Pipeline pipe(
      torch::nn::Sequential(torch::nn::Linear(4, 6), torch::nn::Tanh(), torch::nn::Linear(6, 3)),
      volt::PipelineOptions().chunks(2));
  const at::Tensor x = torch::randn({5, 4}), target = torch::randn({5, 3});
  auto mse = [](const at::Tensor& out, const at::Tensor& t) { return torch::mse_loss(out, t); };
  at::Tensor output;
  const at::Tensor loss = pipe->forward_loss(x, target, mse, &output);
  EXPECT_TRUE(torch::equal(loss, torch::mse_loss(pipe->forward(x), target)));
  EXPECT_TRUE(torch::equal(output, pipe->forward(x)));
  EXPECT_FALSE(output.requires_grad());
  loss.backward();
  const at::Tensor weight = pipe->named_parameters()["0.weight"];
  const at::Tensor grad = weight.grad().clone();
  pipe->zero_grad();
  torch::mse_loss(pipe->forward(x), target).backward();
  EXPECT_TRUE(torch::equal(grad, weight.grad()));
  // Bad loss functions: none, or one giving more than one element.
  EXPECT_NE(error_of<volt::ValueError>([&] {
              pipe->forward_loss(x, target, nullptr);
            }).find("[Pipeline] forward_loss got no loss function"),
            std::string::npos);
  EXPECT_NE(error_of<volt::ValueError>([&] {
              pipe->forward_loss(x, target, [](const at::Tensor& out, const at::Tensor& t) {
                return torch::mse_loss(out, t, at::Reduction::None);
              });
            })
                .find("[Pipeline] the loss function gave [5, 3]; it must give one element: reduce "
                      "the loss (a mean over rows)."),
            std::string::npos);
}

// ---------------------------------------------------------------- the layer over processes

// Starts `world` ranks of the worker's layer mode with `extra`; each must exit 0 and print
// "rank R <what> ok stage=R" followed by `tail(R)`.
void expect_layer_ranks_ok(
    int world, const std::vector<std::string>& extra, const std::string& what,
    const std::function<std::string(int)>& tail = [](int) { return ""; }) {
  auto ranks = volt_test::start_local_ranks(volt_test::pipeline_worker(),
                                            volt_test::cat({"layer"}, extra), world);
  for (int r = 0; r < world; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(ranks[r]->exit_code(std::chrono::seconds(60)), 0) << ranks[r]->output();
    EXPECT_NE(ranks[r]->output().find("rank " + std::to_string(r) + " " + what +
                                      " ok stage=" + std::to_string(r) + tail(r)),
              std::string::npos)
        << ranks[r]->output();
  }
}

// Starts `world` ranks of the worker's layer check; each must print its "layer ok" line.
void expect_layer_ok(int world, std::vector<std::string> extra,
                     const std::vector<std::string>& stage_layers) {
  VOLT_REQUIRE_GLOO();
  expect_layer_ranks_ok(world, extra, "layer", [&](int r) { return " layers=" + stage_layers[r]; });
}

// The worker's model: Linear(8,16) Tanh Linear(16,24) ReLU Linear(24,16) Tanh Linear(16,4).
TEST(PipelineLayer, TwoStagesGiveTheSequentialsOutputAndGradientsBitForBit) {
  expect_layer_ok(2, {"--chunks", "1"}, {"0-2", "3-6"});
}

TEST(PipelineLayer, TwoStagesWithMicroBatchesMatchTheSequential) {
  expect_layer_ok(2, {"--chunks", "3"}, {"0-2", "3-6"});
}

TEST(PipelineLayer, ThreeStagesByParameterCount) {
  expect_layer_ok(3, {"--chunks", "4"}, {"0-0", "1-2", "3-6"});
}

TEST(PipelineLayer, FourStagesByBalanceWithMoreChunksThanStages) {
  expect_layer_ok(4, {"--chunks", "5", "--balance", "1,3,2,1"}, {"0-0", "1-3", "4-5", "6-6"});
}

TEST(PipelineLayer, UniformPartition) {
  expect_layer_ok(3, {"--method", "uniform"}, {"0-2", "3-4", "5-6"});
}

TEST(PipelineLayer, AStageRunningOtherCodeIsADistributedErrorNotAHang) {
  VOLT_REQUIRE_GLOO();
  auto ranks =
      volt_test::start_local_ranks(volt_test::pipeline_worker(), {"layer", "--bad-header", "1"}, 2);
  EXPECT_EQ(ranks[0]->exit_code(std::chrono::seconds(60)), 0) << ranks[0]->output();
  EXPECT_EQ(ranks[1]->exit_code(std::chrono::seconds(60)), 1) << ranks[1]->output();
  EXPECT_NE(ranks[1]->output().find("[Pipeline] rank 1 got a malformed activation header from "
                                    "rank 0; every rank must run the same model and code."),
            std::string::npos)
      << ranks[1]->output();
}

TEST(PipelineLayer, AnActivationOfTooManyDimensionsFailsEveryStageAtOnce) {
  VOLT_REQUIRE_GLOO();
  for (const char* where : {"between", "last"}) {
    SCOPED_TRACE(where);
    const auto start = std::chrono::steady_clock::now();
    auto ranks = volt_test::start_local_ranks(volt_test::pipeline_worker(),
                                              {"layer", "--deep-output", where}, 2);
    const std::string stage = std::string(where) == "last" ? "1" : "0";
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(ranks[r]->exit_code(std::chrono::seconds(60)), 1) << ranks[r]->output();
      EXPECT_NE(ranks[r]->output().find("[Pipeline] stage " + stage +
                                        "'s output has 9 dimensions; at most 8 travel between "
                                        "stages: flatten it in the layer that makes it."),
                std::string::npos)
          << ranks[r]->output();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20))
        << "well before the 30 s timeout";
  }
}

// Before: a 0-dim output made at::cat throw a c10::Error on the last rank alone (the others
// waited for the timeout), and a batch-in-dim-1 output was joined along its other dim.
TEST(PipelineLayer, AnOutputWithoutItsBatchRowsFailsEveryRankWhenMicroBatchesAreJoined) {
  VOLT_REQUIRE_GLOO();
  for (const char* kind : {"reduced", "transposed"}) {
    SCOPED_TRACE(kind);
    const auto start = std::chrono::steady_clock::now();
    auto ranks = volt_test::start_local_ranks(
        volt_test::pipeline_worker(), {"layer", "--no-batch-rows", kind, "--chunks", "2"}, 2);
    const std::string has =
        std::string(kind) == "reduced" ? "no dimensions" : "3 rows (dim 0) of 2 dimensions";
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(ranks[r]->exit_code(std::chrono::seconds(60)), 1) << ranks[r]->output();
      EXPECT_NE(ranks[r]->output().find("[Pipeline] stage 1's output for a micro-batch of 2 rows "
                                        "has " +
                                        has +
                                        "; with chunks > 1 the micro-batches' outputs are "
                                        "joined along dim 0"),
                std::string::npos)
          << ranks[r]->output();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20))
        << "well before the 30 s timeout";
    // One micro-batch is the output as it is (nothing to join), as the Sequential's.
    auto one = volt_test::start_local_ranks(volt_test::pipeline_worker(),
                                            {"layer", "--no-batch-rows", kind, "--chunks", "1"}, 2);
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(one[r]->exit_code(std::chrono::seconds(60)), 0) << one[r]->output();
      EXPECT_NE(one[r]->output().find("rank " + std::to_string(r) + " no batch rows passed"),
                std::string::npos)
          << one[r]->output();
    }
  }
}

TEST(PipelineLayer, GradThroughAPipelineIsAValueErrorOnEveryRankNotAHang) {
  // Each stage's backward accumulates into .grad: torch::autograd::grad() would write gradients
  // it was not asked for. Every rank refuses before any transfer, well within the timeout.
  VOLT_REQUIRE_GLOO();
  const auto start = std::chrono::steady_clock::now();
  auto ranks =
      volt_test::start_local_ranks(volt_test::pipeline_worker(), {"layer", "--grad-call", "1"}, 2);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ranks[r]->exit_code(std::chrono::seconds(60)), 0) << ranks[r]->output();
    EXPECT_NE(ranks[r]->output().find("[Pipeline] a backward through a pipeline computes "
                                      "gradients for every leaf; torch::autograd::grad() and "
                                      "backward(inputs) are not supported"),
              std::string::npos)
        << ranks[r]->output();
    EXPECT_NE(ranks[r]->output().find("rank " + std::to_string(r) + " grad-call ok"),
              std::string::npos)
        << ranks[r]->output();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20))
      << "well before the 30 s timeout";
}

TEST(PipelineLayer, CheckpointedMicroBatchesRecomputeInBackwardAndGiveTheSameGradients) {
  // The worker compares against the same pipeline without checkpointing (dropout in every
  // stage) and counts each stage's recomputations (it fails when they are not what the mode
  // says: once per checkpointed micro-batch).
  VOLT_REQUIRE_GLOO();
  struct Case {
    int world;
    std::vector<std::string> args;
  };
  for (const Case& c : std::vector<Case>{
           {2, {"--checkpoint", "always", "--chunks", "3"}},
           // 9 rows at 4 chunks are 4 micro-batches (3 2 2 2, torch.distributed.pipelining's
           // tensor_split; `chunk` cut 3 of 3 rows, and the worker counted 3 recomputations).
           {2, {"--checkpoint", "always", "--chunks", "4"}},
           {3, {"--checkpoint", "except_last", "--chunks", "3"}},
           {2, {"--interval", "2", "--chunks", "2"}},
           {2, {"--checkpoint", "except_last", "--interval", "1", "--chunks", "2"}},
           {2, {"--checkpoint", "never", "--chunks", "2"}},
       }) {
    SCOPED_TRACE(::testing::PrintToString(c.args));
    expect_layer_ranks_ok(c.world, c.args, "checkpoint");
  }
}

TEST(PipelineLayer, DeferredBatchNormMovesTheStatisticsOncePerBatchAsTheWholeBatchWould) {
  // Outputs and gradients as without it, bit for bit; the running statistics as one BatchNorm
  // over each whole batch, counting batches (not micro-batches); also when the stages'
  // micro-batches are checkpointed (the recomputation adds nothing).
  VOLT_REQUIRE_GLOO();
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"--chunks", "3"},
           {"--chunks", "1"},
           {"--chunks", "2", "--checkpoint", "always"},
           {"--chunks", "5", "--checkpoint", "except_last"},
       }) {
    SCOPED_TRACE(::testing::PrintToString(args));
    expect_layer_ranks_ok(2, volt_test::cat({"--deferred", "1"}, args), "deferred");
  }
}

TEST(PipelineLayer, WeightsTiedAcrossStagesAreHeldAndTrainedByEachStageThatUsesThem) {
  // 2 stages: both hold the shared layer. 3 stages: the middle one does not, and takes no part
  // in summing its gradient (the other two sum it in a group of their own).
  VOLT_REQUIRE_GLOO();
  for (const auto& [world, chunks] :
       std::vector<std::pair<int, const char*>>{{2, "1"}, {2, "3"}, {3, "1"}, {3, "2"}}) {
    SCOPED_TRACE(std::to_string(world) + " stages, chunks " + chunks);
    expect_layer_ranks_ok(world, {"--tied", "1", "--chunks", chunks}, "tied");
  }
}

// ---------------------------------------------------------------- the 1F1B schedule

TEST(PipelineSchedule, OneFOneBGivesGPipesLossAndGradients) {
  // The worker runs forward_loss beside forward() on the same layers and batches (the second
  // accumulating, each loss's backward seeded with 0.5): it fails on any difference in the loss,
  // the gradients, the input's gradient, the random state after the pipeline or BatchNorm's
  // statistics (bit for bit at one micro-batch), on gradients changed before the backward, when
  // a second backward is not refused, and when a checkpointed stage recomputes its dropout
  // layers another number of times than its checkpointed micro-batches (except_last: none on the
  // last stage, whose backwards follow their forwards).
  VOLT_REQUIRE_GLOO();
  struct Case {
    int world;
    std::vector<std::string> args;
  };
  for (const Case& c : std::vector<Case>{
           {2, {"--chunks", "1"}},
           {2, {"--chunks", "4"}},
           {3, {"--chunks", "5"}},
           {3, {"--chunks", "2"}},  // fewer micro-batches than the first stage's warm-up
           {4, {"--chunks", "6"}},
           {2, {"--chunks", "1", "--model", "dropout"}},
           {3, {"--chunks", "4", "--model", "dropout", "--checkpoint", "except_last"}},
           {2, {"--chunks", "3", "--model", "dropout", "--checkpoint", "except_last"}},
           {2, {"--chunks", "3", "--model", "dropout", "--checkpoint", "always"}},
           {2, {"--chunks", "3", "--model", "tied"}},
           {3, {"--chunks", "3", "--model", "tied"}},  // the middle stage does not hold it
           {2, {"--chunks", "3", "--model", "norm"}},
       }) {
    SCOPED_TRACE(std::to_string(c.world) + " stages " + ::testing::PrintToString(c.args));
    expect_layer_ranks_ok(c.world, volt_test::cat({"--schedule", "1f1b"}, c.args), "1f1b");
  }
}

// Integer activations between the stages (bucket ids into an Embedding): stage 1's input takes
// no gradient (it was refused: only floating tensors can require one), nothing flows back, and
// GPipe and 1F1B equal one process (check_integer_between in pipeline_worker.cpp).
TEST(PipelineSchedule, IntegerActivationsCrossTheStagesWithoutAGradient) {
  VOLT_REQUIRE_GLOO();
  for (const char* chunks : {"1", "3"}) {
    SCOPED_TRACE(std::string("chunks ") + chunks);
    expect_layer_ranks_ok(2, {"--integer-between", "1", "--chunks", chunks}, "integer");
  }
}

TEST(PipelineSchedule, OneFOneBHoldsFewerMicroBatchesThanGPipe) {
  // Two stages of 8 Linear(256, 256) + Tanh, 8 micro-batches of 64 rows: GPipe holds every
  // micro-batch's activations until the backward; under 1F1B stage 0 holds at most 2 and the
  // last stage 1.
  VOLT_REQUIRE_GLOO();
  auto ranks = volt_test::start_local_ranks(volt_test::pipeline_worker(),
                                            {"layer", "--schedule-memory", "1"}, 2);
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_EQ(ranks[r]->exit_code(std::chrono::seconds(60)), 0) << ranks[r]->output();
    std::smatch m;
    const std::string out = ranks[r]->output();
    ASSERT_TRUE(std::regex_search(
        out, m, std::regex("rank " + std::to_string(r) + " memory gpipe=([0-9]+) 1f1b=([0-9]+)")))
        << out;
    const double gpipe = std::stod(m[1]), ofob = std::stod(m[2]);
    // One [64, 256] fp32 activation is 64 KiB, and a stage saves at least one per Linear: 4 MiB
    // of 8 micro-batches under GPipe, beside 2.1 MiB of gradients in both schedules. Measured
    // (session 67): 7.3 and 3.6 MB on stage 0, 8.3 and 3.2 MB on stage 1.
    EXPECT_GT(gpipe, 4 * 1048576) << "the counter missed activations";
    EXPECT_LT(ofob / gpipe, 0.6) << "gpipe " << gpipe << " B, 1f1b " << ofob << " B";
  }
}

TEST(PipelineSchedule, ALossFunctionWithItsOwnParametersOrTooFewTargetRowsFailsEveryStage) {
  VOLT_REQUIRE_GLOO();
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases{
      {"param",
       {"[Pipeline] the loss function uses a tensor that needs a gradient and is not the last "
        "stage's (",
        "); it runs on the last stage only, so the other ranks would never train it: move that "
        "layer into the pipeline, or compute the loss from forward()."}},
      {"rows",
       {"[Pipeline] the target has 4 rows, fewer than the pipeline's output of 6 so far; "
        "forward_loss needs one target row per output row (dim 0)."}}};
  for (const auto& [bad, message] : cases) {
    SCOPED_TRACE(bad);
    const auto start = std::chrono::steady_clock::now();
    auto ranks = volt_test::start_local_ranks(
        volt_test::pipeline_worker(), {"layer", "--schedule", "1f1b", "--bad-loss", bad}, 2);
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(ranks[r]->exit_code(std::chrono::seconds(60)), 1) << ranks[r]->output();
    }
    for (const auto& part : message) {
      EXPECT_NE(ranks[1]->output().find(part), std::string::npos) << ranks[1]->output();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20))
        << "well before the 30 s timeout";
  }
}

TEST(ProcessGroupPointToPoint, APeerThatIsNotAnotherRankIsAValueError) {
  VOLT_REQUIRE_GLOO();
  volt::ClusterEnvironment env;
  env.main_port = volt::detail::find_free_port();
  volt::ProcessGroup group(env);
  at::Tensor t = torch::zeros({2});
  EXPECT_NE(error_of<volt::ValueError>([&] {
              group.send(t, 0);
            }).find("send from rank 0 to rank 0: the destination must be another rank of the 1"),
            std::string::npos);
  EXPECT_NE(error_of<volt::ValueError>([&] {
              group.recv_(t, 3);
            }).find("recv on rank 0 from rank 3: the source must be another rank of the 1"),
            std::string::npos);
}

// ---------------------------------------------------------------- Trainer fits

using volt_test::Job;

Job run_fit(const std::string& root, const std::string& out, std::vector<std::string> extra) {
  return volt_test::run_job(volt_test::pipeline_worker(),
                            volt_test::cat({"fit", "--root", root, "--out", out}, extra),
                            std::chrono::seconds(120));
}

torch::Tensor load(const std::string& path) {
  return volt_test::load_flat(path);
}

int64_t steps_of(const std::string& out, int rank) {
  std::smatch m;
  const std::regex re("rank " + std::to_string(rank) + " done step=([0-9]+) stage=([0-9-]+)");
  if (!std::regex_search(out, m, re)) return -1;
  return std::stoll(m[1]);
}

// Every rank of `prefix` (a job of `world` ranks) ends with `want`: bit for bit (tol 0) or
// within tol.
void expect_every_rank(const std::string& prefix, int world, const torch::Tensor& want,
                       double tol) {
  for (int r = 0; r < world; ++r) {
    SCOPED_TRACE(prefix + " rank " + std::to_string(r));
    const torch::Tensor got = load(prefix + ".rank" + std::to_string(r) + ".pt");
    ASSERT_EQ(got.sizes(), want.sizes());
    if (tol == 0) {
      EXPECT_TRUE(torch::equal(got, want))
          << "max diff " << (got - want).abs().max().item<double>();
    } else {
      EXPECT_LE((got - want).abs().max().item<double>(), tol);
    }
  }
}

class PipelineFit : public ::testing::Test {
 protected:
  void SetUp() override { VOLT_REQUIRE_GLOO(); }
  // A fit that must succeed on every rank.
  Job fit(const std::string& name, std::vector<std::string> extra) {
    Job j = run_fit(dir / name, dir / ("out/" + name), std::move(extra));
    EXPECT_EQ(j.code, 0) << j.output;
    return j;
  }
  torch::Tensor weights(const std::string& name, int rank = 0) {
    return load(dir / ("out/" + name + ".rank" + std::to_string(rank) + ".pt"));
  }
  std::string prefix(const std::string& name) { return dir / ("out/" + name); }
  volt_test::TempDir dir;
};

// sync_batchnorm over 2 replicas of a 2-stage pipeline with a BatchNorm in each stage: each
// normalises over both replicas' batches (each stage's replicas synchronise), so every rank trains
// as one process on the global batch; without it each replica normalises its own half (the
// control: the comparison can fail). deferred_batch_norm keeps statistics of its own: refused
// with it. (One replica has nothing to synchronise: SyncBatchnormIsRefused.)
TEST_F(PipelineFit, SyncBatchnormOverReplicasTrainsAsOneProcessOnTheGlobalBatch) {
  fit("one", {"--devices", "1", "--batch", "32", "--batchnorm", "1"});
  const std::vector<std::string> grid{"--devices",   "4", "--stages",  "2",  "--batch", "16",
                                      "--batchnorm", "1", "--balance", "4,4"};
  const Job j = fit("grid", volt_test::cat(grid, {"--sync-bn", "1"}));
  EXPECT_NE(j.output.find("sync_batchnorm: 2 BatchNorm layers normalise over 2 data-parallel "
                          "replicas' batches"),
            std::string::npos)
      << j.output;
  expect_every_rank(prefix("grid"), 4, weights("one"), 2e-6);
  fit("local", grid);
  EXPECT_FALSE(torch::allclose(weights("local"), weights("one"), 1e-3, 1e-4))
      << "per-replica BatchNorm matched the global batch: the comparison above could not fail";
  // Without sync_batchnorm the replicas still end with one model: each stage's replicas take
  // replica 0's running statistics after every step, as DDP's broadcast_buffers (before session
  // 99 ranks 0-1 and 2-3 ended with their own statistics).
  const torch::Tensor stats = load(prefix("local") + ".buffers.rank0.pt");
  for (int r = 1; r < 4; ++r) {
    EXPECT_TRUE(
        torch::equal(load(prefix("local") + ".buffers.rank" + std::to_string(r) + ".pt"), stats))
        << "rank " << r;
    EXPECT_TRUE(torch::equal(weights("local", r), weights("local"))) << "rank " << r;
  }
  const Job deferred = run_fit(dir / "deferred", dir / "out/deferred",
                               volt_test::cat(grid, {"--sync-bn", "1", "--deferred", "1"}));
  EXPECT_EQ(deferred.code, 1) << deferred.output;
  EXPECT_NE(deferred.output.find("sync_batchnorm and deferred_batch_norm together are not "
                                 "supported"),
            std::string::npos)
      << deferred.output;
}

TEST_F(PipelineFit, TwoStagesTrainAsOneProcessBitForBitAndEveryRankEndsWithTheWholeModel) {
  fit("one", {"--devices", "1", "--predict", "1"});
  const Job two = fit("two", {"--devices", "2", "--predict", "1"});
  EXPECT_EQ(steps_of(two.output, 0), 12);
  EXPECT_NE(two.output.find("rank 1 done step=12 stage=1"), std::string::npos) << two.output;
  EXPECT_NE(two.output.find("[PipelineStrategy] rank 0 runs stage 0 of 2: layers 0-1, 1 "
                            "micro-batches"),
            std::string::npos)
      << two.output;
  expect_every_rank(prefix("two"), 2, weights("one"), 0);
  // Every rank trained the layer before the pipeline itself (stage 0's input gradient reaches
  // every rank), not only stage 0 with the others given its weights at the end.
  expect_every_rank(prefix("two.pre"), 2, load(prefix("one.pre.rank0.pt")), 0);
  // A predict after the fit runs through the pipeline again: every rank gets every logit.
  expect_every_rank(prefix("two.pred"), 2, load(prefix("one.pred.rank0.pt")), 0);
  // And leaves every rank the whole model: the stages it released are gathered back (before,
  // a run without a backward put zeros there: rank 0's stage-1 layers, rank 1's stage-0 ones).
  expect_every_rank(prefix("two.after_predict"), 2, weights("one"), 0);
}

// float64 (64-true): the activations travel as float64 (the stage header carries the dtype), the
// stages' weights, gradients and optimizer state are float64, and the whole model gathered at the
// end is what one process trains: bit for bit with one micro-batch, to float64's round-off with
// two (fp32's micro-batches match to ~1e-6).
TEST_F(PipelineFit, Float64TrainsAsOneProcess) {
  fit("one", {"--devices", "1", "--precision", "64-true"});
  ASSERT_EQ(weights("one").scalar_type(), torch::kDouble);
  fit("two", {"--devices", "2", "--precision", "64-true"});
  expect_every_rank(prefix("two"), 2, weights("one"), 0);
  fit("chunks", {"--devices", "2", "--precision", "64-true", "--chunks", "2"});
  expect_every_rank(prefix("chunks"), 2, weights("one"), 1e-12);
}

// A fit that runs inside a catch block of the program's (a retry after an error it handled)
// ended as a failed one before session 65: the teardown took the caught exception for the fit's
// and gathered nothing, so rank 0 kept stage 1's weights freed. The Trainer now says whether
// its run failed.
TEST_F(PipelineFit, AFitInsideTheProgramsCatchBlockStillEndsWithTheWholeModel) {
  fit("one", {"--devices", "1"});
  fit("caught", {"--devices", "2", "--inside-catch", "1"});
  expect_every_rank(prefix("caught"), 2, weights("one"), 0);
}

TEST_F(PipelineFit, ThreeStagesWithMicroBatchesClippingAndAccumulationMatchOneProcess) {
  const std::vector<std::string> common{"--optimizer", "adamw", "--clip", "0.05", "--accum", "2"};
  std::vector<std::string> one{"--devices", "1"}, three{"--devices", "3", "--chunks", "4"};
  one.insert(one.end(), common.begin(), common.end());
  three.insert(three.end(), common.begin(), common.end());
  fit("one", one);
  const Job j = fit("three", three);
  EXPECT_EQ(steps_of(j.output, 2), 6);
  // Micro-batches sum the gradient in another order, and the cross-stage norm is summed in
  // double: round-off only.
  expect_every_rank(prefix("three"), 3, weights("one"), 1e-6);
}

TEST_F(PipelineFit, TheOneFOneBScheduleTrainsAsOneProcess) {
  // The module's training_step computes its loss with forward_loss. Two stages, one micro-batch,
  // dropout in the stages: one process's draws and sums, bit for bit. Three stages, 4
  // micro-batches, AdamW, clipping, accumulation (the loss's gradient 1/2, not the schedule's 1)
  // and dynamic loss scaling: round-off only.
  fit("one", {"--devices", "1", "--schedule", "1f1b", "--dropout", "1"});
  fit("two", {"--devices", "2", "--schedule", "1f1b", "--dropout", "1"});
  expect_every_rank(prefix("two"), 2, weights("one"), 0);
  const std::vector<std::string> common{"--schedule", "1f1b", "--optimizer", "adamw",
                                        "--clip",     "0.05", "--accum",     "2",
                                        "--scaling",  "1"};
  fit("one_accum", volt_test::cat({"--devices", "1"}, common));
  const Job j = fit("three", volt_test::cat({"--devices", "3", "--chunks", "4"}, common));
  EXPECT_EQ(steps_of(j.output, 2), 6);
  expect_every_rank(prefix("three"), 3, weights("one_accum"), 1e-6);
}

TEST_F(PipelineFit, EachRankHoldsOnlyItsStagesWeightsUnlessToldToKeepThemAll) {
  // The model's 2,306 parameter elements: 144 before the pipeline (kept everywhere), 2,128 in
  // it (stage 0 of 2: 544, stage 1: 1,584), 34 after it.
  const Job released = fit("released", {"--devices", "2"});
  EXPECT_NE(released.output.find("rank 0 done step=12 stage=0 states=6 held=722"),
            std::string::npos)
      << released.output;
  EXPECT_NE(released.output.find("rank 1 done step=12 stage=1 states=8 held=1762"),
            std::string::npos)
      << released.output;
  const Job kept = fit("kept", {"--devices", "2", "--release", "0"});
  EXPECT_NE(kept.output.find("rank 1 done step=12 stage=1 states=8 held=2306"), std::string::npos)
      << kept.output;
  // Either way the same training, and every rank whole after fit.
  expect_every_rank(prefix("released"), 2, weights("kept"), 0);
  expect_every_rank(prefix("kept"), 2, weights("kept"), 0);
}

// A checkpoint is written by rank 0, which alone gathers the other stages' weights (sent to it
// stage by stage): rank 1 saves with less memory than stage 0's weights (2,176 bytes), which it
// allocated whole before (every rank gathered the whole model for each checkpoint).
TEST_F(PipelineFit, OnlyTheWritingRankGathersTheOtherStagesWeightsForACheckpoint) {
  const Job j = fit("peak", {"--devices", "2", "--save-peak", "1"});
  std::vector<int64_t> peak(2, -1), others(2, -1), largest(2, -1), biggest_other(2, -1);
  for (int r = 0; r < 2; ++r) {
    std::smatch m;
    const std::regex re("rank " + std::to_string(r) +
                        " save peak=([0-9]+) others=([0-9]+) largest=([0-9]+) "
                        "biggest_other=([0-9]+)");
    ASSERT_TRUE(std::regex_search(j.output, m, re)) << j.output;
    peak[r] = std::stoll(m[1]);
    others[r] = std::stoll(m[2]);
    largest[r] = std::stoll(m[3]);
    biggest_other[r] = std::stoll(m[4]);
  }
  EXPECT_EQ(others[0], 1584 * 4);
  EXPECT_EQ(others[1], 544 * 4);
  // Rank 0 allocates the other stage's tensors whole to write them. Its peak in use is about
  // their bytes (6,344 of 6,336) but no proof: a tensor another thread frees meanwhile (a
  // finished send's activations, 1,024 bytes, under a loaded CI) lowers it; its largest single
  // allocation is not lowered by frees.
  EXPECT_GE(largest[0], biggest_other[0]) << "rank 0 holds the whole model to write it";
  EXPECT_LT(peak[1], others[1]) << j.output;
  EXPECT_LT(largest[1], biggest_other[1]) << j.output;
  // (That the file holds the whole trained model: ACheckpointResumesAtTwoThreeOrOneStagesBitForBit
  // resumes such checkpoints at one stage.)
}

TEST_F(PipelineFit, TheStrategysChunksOverrideTheModels) {
  const Job j = fit("two", {"--devices", "2", "--chunks", "1", "--strategy-chunks", "3"});
  EXPECT_NE(j.output.find("3 micro-batches"), std::string::npos) << j.output;
  EXPECT_EQ(j.output.find("deferred BatchNorm"), std::string::npos) << j.output;
  // The strategy's deferred_batch_norm reaches the pipeline (whose layers have no BatchNorm, so
  // training is unchanged).
  const Job deferred = fit(
      "deferred", {"--devices", "2", "--chunks", "1", "--strategy-chunks", "3", "--deferred", "1"});
  EXPECT_NE(deferred.output.find("3 micro-batches, deferred BatchNorm"), std::string::npos)
      << deferred.output;
  expect_every_rank(prefix("deferred"), 2, weights("two"), 0);
}

TEST_F(PipelineFit, WithLossScalingEveryStageSkipsTheStepOneStageFoundInfIn) {
  // The inf gradient is in the last stage's layer only; stage 0 sees finite gradients and must
  // skip the step too, or the stages would no longer make one model.
  fit("one", {"--devices", "1", "--scaling", "1", "--inf-call", "3"});
  const Job j = fit("two", {"--devices", "2", "--scaling", "1", "--inf-call", "3"});
  EXPECT_EQ(steps_of(j.output, 0), 11);  // 12 batches, one step skipped
  EXPECT_EQ(steps_of(j.output, 1), 11);
  expect_every_rank(prefix("two"), 2, weights("one"), 0);
}

TEST_F(PipelineFit, ACheckpointResumesAtTwoThreeOrOneStagesBitForBit) {
  const std::vector<std::string> common{"--optimizer", "adamw", "--accum", "2"};
  auto with = [&](std::vector<std::string> v) {
    v.insert(v.end(), common.begin(), common.end());
    return v;
  };
  fit("whole", with({"--devices", "2", "--ckpt-every-step", "1"}));
  const std::string ckpt = dir / "whole/ckpt/step=3.ckpt";
  ASSERT_TRUE(std::filesystem::exists(ckpt));
  // The checkpoint holds the whole model and every stage's optimizer state.
  const Job two = fit("two", with({"--devices", "2", "--resume", ckpt}));
  const Job three = fit("three", with({"--devices", "3", "--resume", ckpt}));
  const Job one = fit("one", with({"--devices", "1", "--resume", ckpt}));
  // Optimizer state (10 parameters in all) only for the pipeline layers a rank trains, plus the
  // layers before and after the pipeline (2 parameters each; every rank trains them).
  EXPECT_NE(one.output.find("rank 0 done step=6 stage=0 states=10"), std::string::npos);
  EXPECT_NE(two.output.find("rank 0 done step=6 stage=0 states=6"), std::string::npos);
  EXPECT_NE(two.output.find("rank 1 done step=6 stage=1 states=8"), std::string::npos)
      << two.output;
  EXPECT_NE(three.output.find("rank 0 done step=6 stage=0 states=6"), std::string::npos);
  EXPECT_NE(three.output.find("rank 1 done step=6 stage=1 states=6"), std::string::npos);
  EXPECT_NE(three.output.find("rank 2 done step=6 stage=2 states=6"), std::string::npos)
      << three.output;
  const torch::Tensor want = weights("whole");
  expect_every_rank(prefix("two"), 2, want, 0);
  expect_every_rank(prefix("three"), 3, want, 0);
  expect_every_rank(prefix("one"), 1, want, 0);
}

TEST_F(PipelineFit, ResumesMidAccumulationWithEachStagesPartialGradients) {
  const std::vector<std::string> common{"--optimizer", "adamw", "--accum", "4", "--chunks", "3"};
  auto with = [&](std::vector<std::string> v) {
    v.insert(v.end(), common.begin(), common.end());
    return v;
  };
  fit("whole", with({"--devices", "2", "--save-at", "0,2"}));  // 3 of 4 micro-steps summed
  const std::string ckpt = dir / "whole/save_at.ckpt";
  const Job two = fit("two", with({"--devices", "2", "--resume", ckpt}));
  fit("one", with({"--devices", "1", "--resume", ckpt}));
  expect_every_rank(prefix("two"), 2, weights("whole"), 0);
  // The partial sums of stage 0's layers were not given to stage 1 (its optimizer would keep
  // state for them).
  EXPECT_NE(two.output.find("rank 1 done step=4 stage=1 states=8"), std::string::npos)
      << two.output;
  expect_every_rank(prefix("one"), 1, weights("whole"), 1e-6);  // one chunk instead of three
}

// Three stages' partial sums resumed at two: a rank's own entry held other layers' sums under
// the old layout (rank 1 then trains layers stage 2 had summed, and read zeros for them: 0.05
// off); at another layout every rank reads the owning stage's sums.
TEST_F(PipelineFit, AMidAccumulationCheckpointOfThreeStagesResumesAtTwoBitForBit) {
  const std::vector<std::string> common{"--optimizer", "adamw", "--accum", "4", "--chunks", "3"};
  fit("whole", volt_test::cat({"--devices", "3", "--save-at", "0,2"}, common));
  fit("two", volt_test::cat({"--devices", "2", "--resume", dir / "whole/save_at.ckpt"}, common));
  expect_every_rank(prefix("two"), 2, weights("whole"), 0);
}

TEST_F(PipelineFit, FusedAdamWResumesBitForBit) {
  const std::vector<std::string> common{"--optimizer", "fused_adamw", "--chunks", "2"};
  auto with = [&](std::vector<std::string> v) {
    v.insert(v.end(), common.begin(), common.end());
    return v;
  };
  fit("whole", with({"--devices", "2", "--ckpt-every-step", "1"}));
  fit("two", with({"--devices", "2", "--resume", dir / "whole/ckpt/step=5.ckpt"}));
  expect_every_rank(prefix("two"), 2, weights("whole"), 0);
}

TEST_F(PipelineFit, TwoReplicasOfATwoStagePipelineTrainAsOneProcessOnTheGlobalBatch) {
  // 4 processes: ranks 0-1 and 2-3 are pipelines, each reading half of every global batch of
  // 32; the replicas of a stage average their gradients.
  fit("one", {"--devices", "1", "--batch", "32", "--optimizer", "adamw", "--clip", "0.05"});
  const Job j = fit("grid", {"--devices", "4", "--stages", "2", "--batch", "16", "--optimizer",
                             "adamw", "--clip", "0.05", "--chunks", "2"});
  EXPECT_NE(j.output.find("2 replicas of a 2-stage pipeline"), std::string::npos) << j.output;
  for (int r = 0; r < 4; ++r) {
    EXPECT_NE(
        j.output.find("rank " + std::to_string(r) + " done step=6 stage=" + std::to_string(r % 2)),
        std::string::npos)
        << j.output;
  }
  // Replica means sum the batch in another order: round-off only.
  expect_every_rank(prefix("grid"), 4, weights("one"), 2e-6);
  // Under 1F1B the replicas average what the loss's backward gave (the schedule's gradients).
  const std::vector<std::string> ofob{"--optimizer", "adamw",      "--clip",
                                      "0.05",        "--schedule", "1f1b"};
  fit("one_1f1b", volt_test::cat({"--devices", "1", "--batch", "32"}, ofob));
  fit("grid_1f1b",
      volt_test::cat({"--devices", "4", "--stages", "2", "--batch", "16", "--chunks", "2"}, ofob));
  expect_every_rank(prefix("grid_1f1b"), 4, weights("one_1f1b"), 2e-6);
}

// A layer only the second replica uses (as a data-dependent branch would skip it on the
// first): the replicas agree on which gradients exist and average the first's as zeros, as
// DDP's unused parameters (before, they all-reduced different lists: a mismatched collective);
// every rank ends with the same weights.
TEST_F(PipelineFit, ReplicasAverageAGradientOnlySomeOfThemHave) {
  const Job j = fit("side", {"--devices", "4", "--stages", "2", "--batch", "16", "--side-from", "2",
                             "--epochs", "1"});
  ASSERT_EQ(j.code, 0) << j.output;
  for (int r = 1; r < 4; ++r) {
    EXPECT_TRUE(torch::equal(weights("side", r), weights("side", 0))) << "rank " << r;
  }
}

TEST_F(PipelineFit, AReplicatedPipelineResumesMidAccumulationBitForBitAndInOneProcess) {
  // 3 batches per replica and epoch, one optimizer step per 3: the checkpoint after batch 1 holds
  // two batches' partial sums, different on each replica.
  const std::vector<std::string> grid{"--devices", "4",  "--stages", "2",
                                      "--batch",   "16", "--accum",  "3"};
  auto with = [&](std::vector<std::string> base, std::vector<std::string> more) {
    base.insert(base.end(), more.begin(), more.end());
    return base;
  };
  fit("whole", with(grid, {"--save-at", "0,1"}));
  const std::string ckpt = dir / "whole/save_at.ckpt";
  fit("again", with(grid, {"--resume", ckpt}));
  // One process on the global batch reads the replicas' mean.
  fit("one", {"--devices", "1", "--batch", "32", "--accum", "3", "--resume", ckpt});
  expect_every_rank(prefix("again"), 4, weights("whole"), 0);
  expect_every_rank(prefix("one"), 1, weights("whole"), 2e-6);
  // The same 4 ranks as one 4-stage pipeline on the global batch read the replicas' mean too
  // (each rank's own entry held another stage's layers under the 2x2 layout: 6e-3 off).
  fit("four_stages",
      {"--devices", "4", "--stages", "4", "--batch", "32", "--accum", "3", "--resume", ckpt});
  expect_every_rank(prefix("four_stages"), 4, weights("whole"), 2e-6);
}

TEST_F(PipelineFit, DropoutDrawsAsOneProcessAndEveryRankAgreesAfterThePipeline) {
  // Dropout in stage 0's layers, in stage 1's and after the pipeline: the random state travels
  // with the micro-batch, so at one micro-batch every draw is one process's.
  fit("one", {"--devices", "1", "--dropout", "1", "--predict", "1"});
  fit("two", {"--devices", "2", "--dropout", "1", "--predict", "1"});
  fit("three", {"--devices", "3", "--dropout", "1"});
  expect_every_rank(prefix("two"), 2, weights("one"), 0);
  expect_every_rank(prefix("two.outside"), 2, load(prefix("one.outside.rank0.pt")), 0);
  expect_every_rank(prefix("two.pred"), 2, load(prefix("one.pred.rank0.pt")), 0);
  expect_every_rank(prefix("three"), 3, weights("one"), 0);
  // With micro-batches the masks are cut otherwise than one process's, but every rank still
  // trains the layers before and after the pipeline alike, and a resume is exact.
  fit("chunked", {"--devices", "2", "--dropout", "1", "--chunks", "3", "--ckpt-every-step", "1"});
  expect_every_rank(prefix("chunked.outside"), 2, load(prefix("chunked.outside.rank0.pt")), 0);
  fit("resumed", {"--devices", "2", "--dropout", "1", "--chunks", "3", "--resume",
                  dir / "chunked/ckpt/step=4.ckpt"});
  expect_every_rank(prefix("resumed"), 2, weights("chunked"), 0);
}

TEST_F(PipelineFit, ActivationCheckpointingTrainsBitForBitAsWithout) {
  // Dropout in both stages, micro-batches, AdamW: each recomputation replays the forward's random
  // state, so checkpointed fits train exactly as the plain one (the layer test counts the
  // recomputations; here the strategy's option reaches the pipeline and training is unchanged).
  const std::vector<std::string> common{"--devices", "2", "--dropout",   "1",
                                        "--chunks",  "3", "--optimizer", "adamw"};
  fit("plain", common);
  const Job always = fit("always", volt_test::cat(common, {"--checkpoint", "always"}));
  EXPECT_NE(always.output.find("3 micro-batches, checkpoint always"), std::string::npos)
      << always.output;
  expect_every_rank(prefix("always"), 2, weights("plain"), 0);
  expect_every_rank(prefix("always.outside"), 2, load(prefix("plain.outside.rank0.pt")), 0);
  // The model's interval with the strategy's except_last.
  const Job mixed =
      fit("mixed", volt_test::cat(common, {"--checkpoint", "except_last", "--interval", "2"}));
  EXPECT_NE(mixed.output.find("micro-batches, checkpoint except_last, checkpointed every 2 "
                              "layers"),
            std::string::npos)
      << mixed.output;
  expect_every_rank(prefix("mixed"), 2, weights("plain"), 0);
  // One process: the model's own option.
  fit("one", {"--devices", "1", "--dropout", "1"});
  fit("one_checkpointed", {"--devices", "1", "--dropout", "1", "--model-checkpoint", "always"});
  expect_every_rank(prefix("one_checkpointed"), 1, weights("one"), 0);
}

TEST_F(PipelineFit, AnEmaAverageIsCheckpointedWholeAndResumesAtAnyStageCountBitForBit) {
  // Each rank averages only its stage's weights; the checkpoint gathers them, so it holds the
  // whole model's average and its training weights, as one process's does.
  fit("one", {"--devices", "1", "--ema", "1"});
  fit("whole", {"--devices", "2", "--ema", "1", "--ckpt-every-step", "1"});
  expect_every_rank(prefix("whole"), 2, weights("one"), 0);
  const std::string ckpt = dir / "whole/ckpt/step=3.ckpt";
  fit("two", {"--devices", "2", "--ema", "1", "--resume", ckpt});
  fit("three", {"--devices", "3", "--ema", "1", "--resume", ckpt});
  fit("back", {"--devices", "1", "--ema", "1", "--resume", ckpt});
  expect_every_rank(prefix("two"), 2, weights("one"), 0);
  expect_every_rank(prefix("three"), 3, weights("one"), 0);
  expect_every_rank(prefix("back"), 1, weights("one"), 0);
  // With every weight kept on every rank the others' copies are stale (they do not train
  // there): the checkpoint still takes each stage's average from its own rank.
  fit("kept", {"--devices", "2", "--ema", "1", "--release", "0", "--ckpt-every-step", "1"});
  fit("kept_back", {"--devices", "1", "--ema", "1", "--resume", dir / "kept/ckpt/step=3.ckpt"});
  expect_every_rank(prefix("kept_back"), 1, weights("one"), 0);
}

TEST_F(PipelineFit, AnSwaAverageResumesAtAnyStageCountBitForBit) {
  // 3 epochs of 6 steps, averaging from the first epoch's end: step 9's checkpoint holds one
  // average and the annealed learning rate.
  const std::vector<std::string> swa{"--swa", "1", "--epochs", "3"};
  auto with = [&](std::vector<std::string> v) { return volt_test::cat(v, swa); };
  fit("one", with({"--devices", "1"}));
  fit("whole", with({"--devices", "2", "--ckpt-every-step", "1"}));
  expect_every_rank(prefix("whole"), 2, weights("one"), 0);
  const std::string ckpt = dir / "whole/ckpt/step=9.ckpt";
  fit("two", with({"--devices", "2", "--resume", ckpt}));
  fit("back", with({"--devices", "1", "--resume", ckpt}));
  expect_every_rank(prefix("two"), 2, weights("one"), 0);
  expect_every_rank(prefix("back"), 1, weights("one"), 0);
}

TEST_F(PipelineFit, TiedWeightsAcrossStagesTrainAsOneProcessAndResumeAnywhere) {
  // The pipeline's Linear(32, 32) is layers 3 and 5: one use in each stage. Each stage holds it,
  // the backward sums the two stages' parts of its gradient, both step it alike.
  const std::vector<std::string> tied{"--tied", "1", "--balance", "4,4"};
  auto with = [&](std::vector<std::string> v) { return volt_test::cat(v, tied); };
  fit("one", {"--devices", "1", "--tied", "1"});
  const Job two = fit("two", with({"--devices", "2"}));
  // Stage 1's optimizer state covers the shared layer too (4 parameters of the pipeline: the
  // shared and the last Linear; plus 2 before and 2 after it).
  EXPECT_NE(two.output.find("rank 1 done step=12 stage=1 states=8"), std::string::npos)
      << two.output;
  EXPECT_NE(two.output.find("rank 0 done step=12 stage=0 states=8"), std::string::npos)
      << two.output;
  expect_every_rank(prefix("two"), 2, weights("one"), 0);
  // AdamW, norm clipping (the shared gradient counted once) and accumulation (each backward's
  // parts summed in turn: round-off), checkpoints resumed at two stages and in one process.
  const std::vector<std::string> more{"--optimizer", "adamw", "--clip", "0.05", "--accum", "2"};
  auto with_more = [&](std::vector<std::string> v) { return volt_test::cat(v, more); };
  fit("one_more", with_more({"--devices", "1", "--tied", "1"}));
  fit("whole", with_more(with({"--devices", "2", "--ckpt-every-step", "1", "--save-at", "1,2"})));
  expect_every_rank(prefix("whole"), 2, weights("one_more"), 1e-6);
  const std::string step3 = dir / "whole/ckpt/step=3.ckpt";
  const std::string mid = dir / "whole/save_at.ckpt";  // 1 of 2 micro-steps summed
  fit("again", with_more(with({"--devices", "2", "--resume", step3})));
  fit("mid", with_more(with({"--devices", "2", "--resume", mid})));
  fit("back", with_more({"--devices", "1", "--tied", "1", "--resume", step3}));
  fit("mid_back", with_more({"--devices", "1", "--tied", "1", "--resume", mid}));
  expect_every_rank(prefix("again"), 2, weights("whole"), 0);
  expect_every_rank(prefix("mid"), 2, weights("whole"), 0);
  expect_every_rank(prefix("back"), 1, weights("whole"), 1e-6);
  expect_every_rank(prefix("mid_back"), 1, weights("whole"), 1e-6);
}

TEST_F(PipelineFit, TiedWeightsAreSummedOnlyByTheStagesHoldingThemInEveryReplica) {
  // Balance 3,2,3: the shared Linear(32, 32) (layers 3 and 5) is in stages 1 and 2, not 0, so
  // stages 1 and 2 sum its gradient in a group of their own. With 2 replicas of that pipeline (6
  // processes) each replica makes such a group from its own pipeline's group: same tag, same
  // stage numbers (before session 57 such groups of sibling groups shared their store keys).
  fit("one", {"--devices", "1", "--tied", "1"});
  const Job three = fit("three", {"--devices", "3", "--tied", "1", "--balance", "3,2,3"});
  expect_every_rank(prefix("three"), 3, weights("one"), 0);
  fit("one_global", {"--devices", "1", "--tied", "1", "--batch", "32"});
  const Job grid = fit("grid", {"--devices", "6", "--stages", "3", "--tied", "1", "--balance",
                                "3,2,3", "--batch", "16"});
  EXPECT_NE(grid.output.find("2 replicas of a 3-stage pipeline"), std::string::npos) << grid.output;
  expect_every_rank(prefix("grid"), 6, weights("one_global"), 2e-6);
}

TEST(PipelineStrategy, AWeightSharedWithALayerOutsideThePipelineIsAConfigError) {
  VOLT_REQUIRE_GLOO();
  struct Net : volt::Module {
    Net() {
      pre = register_module("pre", torch::nn::Linear(8, 8));
      net = register_module("net", volt::Pipeline(torch::nn::Sequential(torch::nn::Tanh(), pre)));
      head = register_module("head", torch::nn::Linear(8, 2));
    }
    at::Tensor training_step(const volt::Batch& b, int64_t) override {
      return torch::cross_entropy_loss(head->forward(net->forward(pre->forward(b.input))),
                                       b.target);
    }
    std::vector<volt::OptimizerConfig> configure_optimizers() override {
      return {volt::OptimizerConfig(
          std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1)))};
    }
    torch::nn::Linear pre{nullptr}, head{nullptr};
    volt::Pipeline net{nullptr};
  } model;
  volt_test::TempDir dir;
  volt::Trainer t(volt_test::quiet(dir.path).strategy("pipeline").devices(1).max_epochs(1));
  const std::string e =
      error_of<ConfigError>([&] { t.fit(model, volt_test::loader(volt_test::blobs(32))); });
  EXPECT_NE(e.find("[PipelineStrategy] pre.weight is the pipeline's net.1.weight (a weight "
                   "shared between the pipeline and the layers outside it)"),
            std::string::npos)
      << e;
}

TEST(PipelineLayer, ABufferSharedAcrossStagesIsAConfigError) {
  VOLT_REQUIRE_GLOO();
  auto ranks =
      volt_test::start_local_ranks(volt_test::pipeline_worker(), {"layer", "--tied", "buffer"}, 2);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ranks[r]->exit_code(std::chrono::seconds(60)), 1) << ranks[r]->output();
    EXPECT_NE(ranks[r]->output().find("[Pipeline] layers 1.running_mean (stage 0) and "
                                      "3.running_mean (stage 1) share one buffer"),
              std::string::npos)
        << ranks[r]->output();
  }
}

TEST(PipelineStrategy, StagesThatDoNotDivideTheWorldAreAConfigError) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  volt_test::TinyClassifier model;
  volt::Trainer t(volt_test::quiet(dir.path)
                      .strategy(volt::named<volt::Strategy>("pipeline", {{"stages", int64_t{2}}}))
                      .devices(1)
                      .max_epochs(1));
  const std::string e =
      error_of<ConfigError>([&] { t.fit(model, volt_test::loader(volt_test::blobs(32))); });
  EXPECT_NE(e.find("[PipelineStrategy] stages=2 does not divide the 1 processes"),
            std::string::npos)
      << e;
}

TEST_F(PipelineFit, ATracedStepRunsEagerlyWithTheReasonAndTrainsTheSame) {
  // The tracer cannot hold transfers between stages: trace_training_step falls back, once logged.
  fit("one", {"--devices", "1"});
  const Job j = fit("two", {"--devices", "2", "--trace", "1"});
  EXPECT_NE(j.output.find("trace_training_step: running training_step eagerly: [ProcessGroup] "
                          "send while libtorch's tracer records"),
            std::string::npos)
      << j.output;
  expect_every_rank(prefix("two"), 2, weights("one"), 0);
}

TEST_F(PipelineFit, ADeadStageFailsTheOthersAtOnceNamingIt) {
  const auto start = std::chrono::steady_clock::now();
  const Job j =
      run_fit(dir / "d", dir / "out/d",
              {"--devices", "2", "--die-rank", "1", "--die-batch", "2", "--timeout", "60"});
  EXPECT_NE(j.code, 0) << j.output;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30))
      << "well before the 60 s timeout";
  EXPECT_NE(j.output.find("failed on rank 0 of 2"), std::string::npos) << j.output;
  EXPECT_NE(j.output.find("rank 1 (local rank 1"), std::string::npos) << j.output;
  EXPECT_NE(j.output.find("killed by signal 9"), std::string::npos) << j.output;
}

// A stage whose training_step throws (its process exits with the error): the other learns at
// once, told which rank was lost and how, not at the timeout.
TEST_F(PipelineFit, AStageThatThrowsFailsTheOthersAtOnceNamingIt) {
  for (const char* rank : {"0", "1"}) {
    const auto start = std::chrono::steady_clock::now();
    const std::string name = std::string("t") + rank;
    const Job j =
        run_fit(dir / name, dir / ("out/" + name),
                {"--devices", "2", "--throw-rank", rank, "--throw-batch", "2", "--timeout", "60"});
    EXPECT_NE(j.code, 0) << j.output;
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30))
        << "well before the 60 s timeout";
    EXPECT_NE(j.output.find(std::string("[PipeNet] rank ") + rank + " fails at batch 2"),
              std::string::npos)
        << j.output;
    // The other rank's error names the lost one (rank 0 held the store: it is unreachable).
    const std::string lost =
        std::string(rank) == "1" ? "lost: rank 1 (local rank 1" : "so rank 0 was probably lost";
    EXPECT_NE(j.output.find(lost), std::string::npos) << j.output;
  }
}

// ---------------------------------------------------------------- strategy errors (one process)

TEST(PipelineStrategy, AModuleWithoutAPipelineIsAConfigError) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  volt_test::TinyClassifier model;
  volt::Trainer t(volt_test::quiet(dir.path).strategy("pipeline").devices(1).max_epochs(1));
  const std::string e =
      error_of<ConfigError>([&] { t.fit(model, volt_test::loader(volt_test::blobs(32))); });
  EXPECT_NE(e.find("[PipelineStrategy] the module holds 0 volt::Pipeline layers"),
            std::string::npos)
      << e;
}

TEST(PipelineStrategy, SyncBatchnormIsRefused) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  volt_test::TinyClassifier model;
  volt::Trainer t(volt_test::quiet(dir.path)
                      .strategy("pipeline")
                      .devices(1)
                      .max_epochs(1)
                      .sync_batchnorm(true));
  const std::string e =
      error_of<ConfigError>([&] { t.fit(model, volt_test::loader(volt_test::blobs(32))); });
  EXPECT_NE(e.find("sync_batchnorm has nothing to synchronise"), std::string::npos) << e;
}

TEST(PipelineStrategy, Fp8PrecisionIsRefused) {
  VOLT_REQUIRE_GLOO();
  volt_test::TempDir dir;
  volt_test::TinyClassifier model;
  volt::Trainer t(
      volt_test::quiet(dir.path).strategy("pipeline").devices(1).max_epochs(1).precision("fp8"));
  const std::string e =
      error_of<ConfigError>([&] { t.fit(model, volt_test::loader(volt_test::blobs(32))); });
  EXPECT_NE(e.find("fp8 precision is not supported"), std::string::npos) << e;
}

TEST(PipelineStrategy, NegativeChunksOrStagesAreConfigErrors) {
  for (const char* key : {"chunks", "stages"}) {
    const std::string e = error_of<ConfigError>([&] {
      volt::Trainer(volt_test::quiet("/tmp").strategy(
          volt::named<volt::Strategy>("pipeline", {{key, int64_t{-1}}})));
    });
    EXPECT_NE(e.find(std::string("[PipelineStrategy] ") + key + "=-1 must be >= 0"),
              std::string::npos)
        << e;
  }
}

TEST(PipelineStrategy, BadCheckpointOptionsAreConfigErrors) {
  std::string e = error_of<ConfigError>([&] {
    volt::Trainer(volt_test::quiet("/tmp").strategy(
        volt::named<volt::Strategy>("pipeline", {{"checkpoint", std::string("sometimes")}})));
  });
  EXPECT_NE(e.find("[PipelineStrategy] checkpoint='sometimes' is not a checkpointing mode; use "
                   "never, always or except_last"),
            std::string::npos)
      << e;
  e = error_of<ConfigError>([&] {
    volt::Trainer(volt_test::quiet("/tmp").strategy(volt::named<volt::Strategy>(
        "pipeline", {{"activation_checkpoint_interval", int64_t{-2}}})));
  });
  EXPECT_NE(e.find("[PipelineStrategy] activation_checkpoint_interval=-2 must be >= 0"),
            std::string::npos)
      << e;
}

}  // namespace
