#include "volt/distributed/gradient_reducer.h"
#include "requires.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>

#include "build_paths.h"
#include "distributed/detail/net.h"
#include "processes.h"
#include "volt/core/errors.h"

namespace {

using std::chrono::milliseconds;
using volt_test::Process;

const std::string kWorker = volt_test::dist_worker();
constexpr milliseconds kWait{120000};

std::shared_ptr<volt::ProcessGroup> world_of_one() {
  volt::ClusterEnvironment env;
  env.main_port = volt::detail::find_free_port();
  return std::make_shared<volt::ProcessGroup>(env);
}

// Every reducer check of the worker (tests/support/dist_worker.cpp, run_reducer): gradients are
// the mean of the ranks' gradients with and without bucket views, one or many buckets, across
// the bucket rebuild; .grad aliases bucket storage iff gradient_as_bucket_view; no_sync keeps
// gradients local and the next synced backward reduces their sum; tied weights; unused
// parameters; static_graph; 5 SGD steps equal single-process training on the whole batch.
void expect_reducer_ok(const std::string& out, int world) {
  for (const char* line : {"reducer default ok", "reducer bucket views ok",
                           "reducer small buckets ok", "reducer small buckets with views ok",
                           "reducer no_sync ok", "reducer no_sync (bucket views) ok",
                           "reducer tied ok", "reducer find_unused ok", "reducer static_graph ok",
                           "reducer matches single process", "reducer model mismatch detected"}) {
    for (int r = 0; r < world; ++r) {
      const std::string want = "rank " + std::to_string(r) + ": " + line;
      EXPECT_NE(out.find(want), std::string::npos) << want << "\n" << out;
    }
  }
}

TEST(GradientReducer, TwoRanksAverageGradients) {
  VOLT_REQUIRE_GLOO();
  auto ranks = volt_test::start_local_ranks(kWorker, {"reducer", "--devices", "2"}, 2);
  std::string all;
  for (auto& p : ranks) {
    EXPECT_EQ(p->exit_code(kWait), 0) << p->output();
    all += p->output();
  }
  expect_reducer_ok(all, 2);
}

TEST(GradientReducer, ThreeLaunchedRanksAverageGradients) {
  VOLT_REQUIRE_GLOO();
  Process parent(kWorker, {"reducer", "--devices", "3"});
  EXPECT_EQ(parent.exit_code(kWait), 0) << parent.output();
  expect_reducer_ok(parent.output(), 3);
}

TEST(GradientReducer, WorldOfOneKeepsLocalGradients) {
  VOLT_REQUIRE_GLOO();
  auto pg = world_of_one();
  torch::manual_seed(0);
  torch::nn::Linear fc(4, 3);
  volt::GradientReducer red(fc->parameters(), pg,
                            volt::GradientReducerOptions().gradient_as_bucket_view(true));
  auto x = torch::randn({5, 4});
  auto expected = torch::autograd::grad({fc->forward(x).sum()}, fc->parameters());
  red.backward(fc->forward(x).sum());
  EXPECT_TRUE(fc->weight.grad().allclose(expected[0]));
  EXPECT_TRUE(fc->bias.grad().allclose(expected[1]));
  // The custom backward path (e.g. Precision::backward with a scaled loss).
  bool called = false;
  red.backward(fc->forward(x).sum(), [&] {
    called = true;
    (fc->forward(x).sum() * 0).backward();
  });
  EXPECT_TRUE(called);
}

TEST(GradientReducer, RejectsBadOptionsAndParameters) {
  VOLT_REQUIRE_GLOO();
  auto pg = world_of_one();
  torch::nn::Linear fc(4, 3);
  try {
    volt::GradientReducer red(fc->parameters(), pg,
                              volt::GradientReducerOptions().bucket_cap_mb(0));
    FAIL() << "no error";
  } catch (const volt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("bucket_cap_mb=0 must be > 0 and at most 1048576"),
              std::string::npos);
  }
  try {
    volt::GradientReducer red({torch::zeros({3})}, pg);
    FAIL() << "no error";
  } catch (const volt::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("no parameter requires a gradient"), std::string::npos);
  }
  EXPECT_THROW(volt::GradientReducer(fc->parameters(), nullptr), volt::ValueError);
  EXPECT_THROW(volt::GradientReducer(fc->parameters(), pg, {}, {"only one name"}),
               volt::ValueError);
}

}  // namespace
