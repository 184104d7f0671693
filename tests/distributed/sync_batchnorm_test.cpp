// SyncBatchNorm in one process (a group of one rank): the synchronised computation equals
// libtorch's batch_norm (outputs, gradients, running statistics) for every BatchNorm kind and
// option, is used exactly inside a Scope and in training mode, follows tensors the module
// replaced, and refuses what it cannot do. Two real processes against one process on the global
// batch: tests/strategies/ddp_test.cpp (Ddp.SyncBatchnorm...).
#include "volt/distributed/sync_batchnorm.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "distributed/detail/net.h"
#include "error_text.h"
#include "log_capture.h"
#include "requires.h"
#include "tiny.h"
#include "volt/core/errors.h"
#include "volt/distributed/cluster_environment.h"
#include "volt/distributed/process_group.h"
#include "volt/kernels/traced_function.h"
#include "volt/trainer/trainer.h"

namespace {

std::shared_ptr<volt::ProcessGroup> one_rank_group() {
  volt::ClusterEnvironment env;
  env.main_port = volt::detail::find_free_port();
  return std::make_shared<volt::ProcessGroup>(env);
}

// The same layer twice (same initial values): `synced` runs under SyncBatchNorm, `plain` not.
template <typename Holder, typename Options>
struct Pair {
  explicit Pair(const Options& options) : synced(options), plain(options) {
    torch::NoGradGuard no_grad;
    torch::manual_seed(3);
    for (auto& p : synced->parameters()) p.uniform_(0.5, 1.5);
    for (size_t i = 0; i < plain->parameters().size(); ++i) {
      plain->parameters()[i].copy_(synced->parameters()[i]);
    }
  }
  Holder synced, plain;
};

// Three training steps of both layers on the same inputs, then one evaluation forward: outputs,
// input and parameter gradients, running statistics and the step counter agree.
template <typename Holder, typename Options>
void expect_matches_batch_norm(const Options& options, std::vector<int64_t> sizes) {
  SCOPED_TRACE(::testing::Message() << "input " << c10::IntArrayRef(sizes));
  auto group = one_rank_group();
  Pair<Holder, Options> m(options);
  {
    volt::SyncBatchNorm itself(*m.synced, group);  // the root is a BatchNorm layer
    ASSERT_EQ(itself.layers(), std::vector<std::string>{""});
  }
  auto root = torch::nn::Sequential(m.synced);
  volt::SyncBatchNorm sync_root(*root, group);
  ASSERT_EQ(sync_root.layers(), std::vector<std::string>{"0"});
  for (int step = 0; step < 3; ++step) {
    const at::Tensor x = torch::randn(sizes) * 3 + 5;  // a mean far from 0
    const at::Tensor xs = x.clone().requires_grad_(), xp = x.clone().requires_grad_();
    const at::Tensor w = torch::randn(sizes);
    at::Tensor ys;
    {
      volt::SyncBatchNorm::Scope scope(sync_root);
      ys = m.synced->forward(xs);
    }
    ASSERT_NE(ys.grad_fn()->name(), "NativeBatchNormBackward0") << "not synchronised";
    const at::Tensor yp = m.plain->forward(xp);
    EXPECT_TRUE(torch::allclose(ys, yp, 1e-5, 1e-5)) << (ys - yp).abs().max();
    (ys * w).sum().backward();
    (yp * w).sum().backward();
    EXPECT_TRUE(torch::allclose(xs.grad(), xp.grad(), 1e-4, 1e-5))
        << (xs.grad() - xp.grad()).abs().max();
    for (size_t i = 0; i < m.plain->parameters().size(); ++i) {
      const auto& gs = m.synced->parameters()[i].grad();
      const auto& gp = m.plain->parameters()[i].grad();
      EXPECT_TRUE(torch::allclose(gs, gp, 1e-4, 1e-4))
          << "parameter " << i << ": " << (gs - gp).abs().max();
    }
  }
  const auto bs = m.synced->buffers(), bp = m.plain->buffers();
  ASSERT_EQ(bs.size(), bp.size());
  for (size_t i = 0; i < bs.size(); ++i) {
    EXPECT_TRUE(torch::allclose(bs[i].to(at::kDouble), bp[i].to(at::kDouble), 1e-5, 1e-5))
        << "buffer " << i << ": " << bs[i] << " vs " << bp[i];
  }
  // Evaluation uses the running statistics through libtorch's own kernel: untouched by a scope.
  m.synced->eval();
  m.plain->eval();
  const at::Tensor x = torch::randn(sizes);
  const at::Tensor outside = m.synced->forward(x);
  volt::SyncBatchNorm::Scope scope(sync_root);
  const at::Tensor ye = m.synced->forward(x);
  EXPECT_TRUE(torch::equal(ye, outside));
  EXPECT_TRUE(torch::allclose(ye, m.plain->forward(x), 1e-4, 1e-5));
}

TEST(SyncBatchNorm, OneRankEqualsBatchNormOutputsGradientsAndRunningStatistics) {
  VOLT_REQUIRE_GLOO();
  using O = torch::nn::BatchNormOptions;
  expect_matches_batch_norm<torch::nn::BatchNorm1d>(O(4), {6, 4});
  expect_matches_batch_norm<torch::nn::BatchNorm1d>(O(4), {6, 4, 5});
  expect_matches_batch_norm<torch::nn::BatchNorm2d>(O(3), {4, 3, 5, 2});
  expect_matches_batch_norm<torch::nn::BatchNorm3d>(O(2), {2, 2, 3, 2, 4});
  // Cumulative moving average (momentum unset: 1 / batches seen), no affine parameters, no
  // running statistics (found by the weight), another momentum and eps.
  expect_matches_batch_norm<torch::nn::BatchNorm2d>(O(3).momentum(c10::nullopt), {4, 3, 2, 2});
  expect_matches_batch_norm<torch::nn::BatchNorm2d>(O(3).affine(false), {4, 3, 2, 2});
  expect_matches_batch_norm<torch::nn::BatchNorm1d>(O(4).track_running_stats(false), {8, 4});
  expect_matches_batch_norm<torch::nn::BatchNorm1d>(O(4).momentum(0.5).eps(1e-3), {8, 4});
}

// A rank without rows still joins the collective and counts 0 rows: its mean of nothing was
// NaN, which made every rank's running statistics (and outputs) NaN. Here the group has one rank,
// so nothing at all was seen: the running statistics stay as they were, as libtorch's batch_norm
// leaves them for an empty batch, and the next batch is normalised as before.
TEST(SyncBatchNorm, ARankWithoutRowsAddsNothingToTheStatistics) {
  VOLT_REQUIRE_GLOO();
  auto group = one_rank_group();
  Pair<torch::nn::BatchNorm1d, torch::nn::BatchNormOptions> m(torch::nn::BatchNormOptions(4));
  volt::SyncBatchNorm sync(*m.synced, group);
  for (const int64_t rows : {6, 0, 5}) {
    SCOPED_TRACE(rows);
    const at::Tensor x = torch::randn({rows, 4}) * 2 + 3;
    at::Tensor ys;
    {
      volt::SyncBatchNorm::Scope scope(sync);
      ys = m.synced->forward(x);
    }
    const at::Tensor yp = m.plain->forward(x);
    EXPECT_EQ(ys.sizes(), yp.sizes());
    EXPECT_TRUE(torch::allclose(ys, yp, 1e-5, 1e-5));
    EXPECT_TRUE(torch::allclose(m.synced->running_mean, m.plain->running_mean, 1e-6, 1e-6))
        << m.synced->running_mean << m.plain->running_mean;
    EXPECT_TRUE(torch::allclose(m.synced->running_var, m.plain->running_var, 1e-6, 1e-6))
        << m.synced->running_var << m.plain->running_var;
  }
}

TEST(SyncBatchNorm, OnlyInsideAScopeAndFollowsTensorsTheModuleReplaced) {
  VOLT_REQUIRE_GLOO();
  auto group = one_rank_group();
  auto model = torch::nn::Sequential(torch::nn::Linear(3, 4), torch::nn::BatchNorm1d(4));
  volt::SyncBatchNorm sync(*model, group);
  EXPECT_EQ(sync.layers(), std::vector<std::string>{"1"});
  const at::Tensor x = torch::randn({5, 3});
  EXPECT_EQ(model->forward(x).grad_fn()->name(), "NativeBatchNormBackward0") << "outside a scope";
  {
    volt::SyncBatchNorm::Scope scope(sync);
    EXPECT_NE(model->forward(x).grad_fn()->name(), "NativeBatchNormBackward0");
  }
  // New tensors (a dtype conversion, as bf16-true or a device move makes): found again.
  model->to(torch::kDouble);
  {
    volt::SyncBatchNorm::Scope scope(sync);
    const at::Tensor y = model->forward(x.to(torch::kDouble));
    EXPECT_NE(y.grad_fn()->name(), "NativeBatchNormBackward0") << "lost after the conversion";
    EXPECT_EQ(y.scalar_type(), torch::kDouble);
  }
  // Another SyncBatchNorm gone: this one's layers stay registered.
  { volt::SyncBatchNorm other(*model, group); }
  {
    volt::SyncBatchNorm::Scope scope(sync);
    EXPECT_NE(model->forward(x.to(torch::kDouble)).grad_fn()->name(), "NativeBatchNormBackward0");
  }
}

// Under libtorch's tracer a collective is refused (a replay would skip it), so tracing a
// synchronised forward is a ValueError instead of a trace that normalises without the sync.
TEST(SyncBatchNorm, ATraceOfASynchronisedForwardIsRefused) {
  VOLT_REQUIRE_GLOO();
  auto group = one_rank_group();
  auto model = torch::nn::Sequential(torch::nn::Linear(3, 4), torch::nn::BatchNorm1d(4));
  volt::SyncBatchNorm sync(*model, group);
  volt::TracedFunction traced("synced", model.ptr(), [&](const std::vector<at::Tensor>& in) {
    volt::SyncBatchNorm::Scope scope(sync);
    return std::vector<at::Tensor>{model->forward(in[0])};
  });
  const std::string e = volt_test::error_of<volt::ValueError>([&] {
    traced({torch::randn({5, 3})});
  });
  EXPECT_TRUE(volt_test::has(e, "while libtorch's tracer records")) << e;
  EXPECT_EQ(traced.stats().traces, 0);
  // Untraced, the same forward synchronises as before.
  volt::SyncBatchNorm::Scope scope(sync);
  EXPECT_NE(model->forward(torch::randn({5, 3})).grad_fn()->name(), "NativeBatchNormBackward0");
}

TEST(SyncBatchNorm, WarnsAboutWhatItCannotSynchroniseAndRefusesANullGroup) {
  VOLT_REQUIRE_GLOO();
  auto group = one_rank_group();
  auto plain = torch::nn::Sequential(torch::nn::Linear(3, 4));
  auto bare = torch::nn::Sequential(torch::nn::BatchNorm1d(
      torch::nn::BatchNormOptions(4).affine(false).track_running_stats(false)));
  const auto lines = volt_test::capture_logs([&] {
    volt::SyncBatchNorm none(*plain, group);
    EXPECT_TRUE(none.layers().empty());
    volt::SyncBatchNorm unkeyed(*bare, group);
    EXPECT_TRUE(unkeyed.layers().empty());
  });
  std::string text;
  for (const auto& l : lines) text += l + "\n";
  EXPECT_NE(text.find("the model has no BatchNorm1d/2d/3d layer"), std::string::npos) << text;
  EXPECT_NE(text.find("not synchronised (no running statistics and no affine weight to "
                      "recognise them by): 0; give them affine=true"),
            std::string::npos)
      << text;
  try {
    volt::SyncBatchNorm bad(*plain, nullptr);
    FAIL() << "a null group was accepted";
  } catch (const volt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("[SyncBatchNorm] needs a process group"),
              std::string::npos)
        << e.what();
  }
}

TEST(SyncBatchNorm, TheTrainerRefusesItWithDeepSpeedAndSaysItChangesNothingInOneProcess) {
  try {
    volt::Trainer t(volt::TrainerOptions().strategy("deepspeed_stage_2").sync_batchnorm(true));
    FAIL() << "sync_batchnorm with ZeRO was accepted";
  } catch (const volt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("sync_batchnorm is not supported with ZeRO"),
              std::string::npos)
        << e.what();
  }
  volt_test::TempDir dir;
  volt_test::TinyClassifier model;
  const auto lines = volt_test::capture_logs([&] {
    volt::Trainer t(volt_test::quiet(dir.path).max_epochs(1).sync_batchnorm(true));
    t.fit(model, volt_test::loader(volt_test::blobs(32)));
  });
  bool said = false;
  for (const auto& l : lines)
    said = said || l.find("sync_batchnorm changes nothing in one process") != std::string::npos;
  EXPECT_TRUE(said);
}

}  // namespace
