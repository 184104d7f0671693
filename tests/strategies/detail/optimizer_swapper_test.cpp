// OptimizerSwapper (ZeRO-Infinity's optimizer-state swapping): stepping sub-group by sub-group
// with the state in a file gives bitwise the weights and state of plain in-memory steps, for
// every optimizer DeepSpeedStrategy tests with, and between steps no state bytes stay in memory.
// step_by_sub_groups (the same sub-group steps with the state in memory) likewise.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "strategies/detail/optimizer_swapper.h"
#include "strategies/detail/sub_groups.h"
#include "tiny.h"
#include "volt/core/errors.h"
#include "volt/kernels/fused_adamw.h"
#include "volt/kernels/fused_sgd.h"

namespace {

using volt::detail::AioOptions;
using volt::detail::OptimizerSwapper;

std::vector<at::Tensor> make_params() {
  torch::manual_seed(3);
  return {torch::randn({7, 5}).requires_grad_(), torch::randn({3}).requires_grad_(),
          torch::randn({40}).requires_grad_(), torch::randn({2, 2}).requires_grad_()};
}

std::shared_ptr<torch::optim::Optimizer> make_opt(const std::string& kind,
                                                  const std::vector<at::Tensor>& p) {
  if (kind == "adam") {
    return std::make_shared<torch::optim::Adam>(p,
                                                torch::optim::AdamOptions(0.01).weight_decay(0.01));
  }
  if (kind == "adamw")
    return std::make_shared<torch::optim::AdamW>(p, torch::optim::AdamWOptions(0.01));
  if (kind == "sgd") {
    return std::make_shared<torch::optim::SGD>(p, torch::optim::SGDOptions(0.1).momentum(0.9));
  }
  if (kind == "fused_sgd") {
    return std::make_shared<volt::FusedSGD>(p, volt::FusedSGDOptions(0.1).momentum(0.9));
  }
  return std::make_shared<volt::FusedAdamW>(p, volt::FusedAdamWOptions(0.01));
}

void set_grads(const std::vector<at::Tensor>& ps, int step) {
  for (size_t i = 0; i < ps.size(); ++i) {
    torch::manual_seed(100 * step + static_cast<int>(i));
    ps[i].mutable_grad() = torch::randn_like(ps[i]);
  }
}

// Bytes the Adam-family state tensors hold in memory now.
int64_t adam_state_bytes(torch::optim::Optimizer& o) {
  int64_t n = 0;
  for (const auto& kv : o.state()) {
    if (auto* s = dynamic_cast<torch::optim::AdamParamState*>(kv.second.get())) {
      n += s->exp_avg().storage().nbytes() + s->exp_avg_sq().storage().nbytes();
    }
  }
  return n;
}

TEST(OptimizerSwapper, SwappedStepsEqualInMemoryStepsBitwise) {
  volt_test::TempDir dir;
  for (const std::string kind : {"adam", "adamw", "sgd", "fused_sgd", "fused_adamw"}) {
    for (int64_t sub_group : {1, 40, 1000}) {
      for (bool uring : {true, false}) {
        auto a = make_params(), b = make_params();
        auto ref = make_opt(kind, a), opt = make_opt(kind, b);
        OptimizerSwapper swapper(*opt, dir / "opt.swp",
                                 AioOptions().use_uring(uring).block_size(64), sub_group);
        for (int step = 0; step < 4; ++step) {
          set_grads(a, step);
          set_grads(b, step);
          ref->step();
          EXPECT_TRUE(swapper.step([&] {
            opt->step();
            return true;
          }));
          // Between steps: the file holds the state, memory none of it.
          EXPECT_GT(swapper.file_bytes(), 0) << kind;
          if (kind == "adam") {
            EXPECT_EQ(adam_state_bytes(*opt), 0);
            EXPECT_EQ(swapper.file_bytes(), 2 * 4 * (35 + 3 + 40 + 4));
          }
        }
        if (sub_group == 1) EXPECT_EQ(swapper.sub_groups(), 4);
        for (size_t i = 0; i < a.size(); ++i) {
          EXPECT_TRUE(torch::equal(a[i], b[i]))
              << kind << " sub_group " << sub_group << " param " << i;
        }
        // Swapped in, the state equals the in-memory optimizer's.
        swapper.swap_in_all();
        EXPECT_EQ(swapper.file_bytes(), 0);
        if (kind == "adam") {
          EXPECT_EQ(adam_state_bytes(*opt), 2 * 4 * (35 + 3 + 40 + 4));
          for (size_t i = 0; i < a.size(); ++i) {
            auto key = volt::detail::state_key_for(a[i]), key2 = volt::detail::state_key_for(b[i]);
            auto& ra = static_cast<torch::optim::AdamParamState&>(*ref->state().at(key));
            auto& rb = static_cast<torch::optim::AdamParamState&>(*opt->state().at(key2));
            EXPECT_TRUE(torch::equal(ra.exp_avg(), rb.exp_avg()));
            EXPECT_TRUE(torch::equal(ra.exp_avg_sq(), rb.exp_avg_sq()));
            EXPECT_EQ(ra.step(), rb.step());
          }
        }
        // One more step after swapping in all (resident state is written out after it).
        set_grads(a, 9);
        set_grads(b, 9);
        ref->step();
        swapper.step([&] {
          opt->step();
          return true;
        });
        for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << kind;
      }
    }
  }
}

// A write the swap file refuses (io_uring's EAGAIN, injected at the second submission): the
// state tensors emptied before it are put back, so the state stays whole in memory. They were
// left empty with no record saying they were in the file: the moments were lost, and the next
// checkpoint saved them with no elements.
TEST(OptimizerSwapper, ARefusedWriteKeepsTheStateInMemory) {
  volt_test::TempDir dir;
  auto a = make_params(), b = make_params();
  auto ref = make_opt("adam", a), opt = make_opt("adam", b);
  ::setenv("VOLT_TEST_AIO_SUBMIT_FAILS", "2", 1);
  std::unique_ptr<OptimizerSwapper> swapper;
  try {
    swapper = std::make_unique<OptimizerSwapper>(
        *opt, dir / "opt.swp", AioOptions().use_uring(true).block_size(1 << 20), 1000);
  } catch (const volt::NotAvailable& e) {
    ::unsetenv("VOLT_TEST_AIO_SUBMIT_FAILS");
    GTEST_SKIP() << e.what();
  }
  ::unsetenv("VOLT_TEST_AIO_SUBMIT_FAILS");
  set_grads(a, 0);
  set_grads(b, 0);
  ref->step();
  EXPECT_THROW(swapper->step([&] {
    opt->step();
    return true;
  }),
               volt::DataError);
  swapper->swap_in_all();
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::equal(a[i], b[i])) << "param " << i;
    auto& ra = static_cast<torch::optim::AdamParamState&>(
        *ref->state().at(volt::detail::state_key_for(a[i])));
    auto& rb = static_cast<torch::optim::AdamParamState&>(
        *opt->state().at(volt::detail::state_key_for(b[i])));
    ASSERT_EQ(rb.exp_avg().numel(), b[i].numel()) << "param " << i;
    EXPECT_TRUE(torch::equal(ra.exp_avg(), rb.exp_avg())) << "param " << i;
    EXPECT_TRUE(torch::equal(ra.exp_avg_sq(), rb.exp_avg_sq())) << "param " << i;
  }
  // And the swapping goes on: the next step writes everything out.
  set_grads(a, 1);
  set_grads(b, 1);
  ref->step();
  EXPECT_TRUE(swapper->step([&] {
    opt->step();
    return true;
  }));
  EXPECT_EQ(adam_state_bytes(*opt), 0);
  swapper->swap_in_all();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "param " << i;
}

TEST(OptimizerSwapper, SwappedParametersStepInTheSameSubGroupsEveryStep) {
  // ZeRO's fp32 masters swap with their state (swap_parameters). Between steps they hold no
  // elements, yet every step must cut the sub-groups of the first one from their recorded
  // shapes, so that only about sub_group_size elements come into memory at once (this once
  // regressed to one sub-group holding everything from the second step on).
  volt_test::TempDir dir;
  auto a = make_params(), b = make_params();
  std::vector<std::vector<int64_t>> shapes;
  for (const auto& p : a) shapes.push_back(p.sizes().vec());
  auto ref = make_opt("adam", a), opt = make_opt("adam", b);
  OptimizerSwapper swapper(*opt, dir / "opt.swp", AioOptions().block_size(64), 40,
                           /*swap_parameters=*/true);
  for (int step = 0; step < 4; ++step) {
    for (size_t i = 0; i < a.size(); ++i) {
      torch::manual_seed(100 * step + static_cast<int>(i));
      const at::Tensor g = torch::randn(shapes[i]);
      a[i].mutable_grad() = g.clone();
      b[i].mutable_grad() = g.clone();
    }
    ref->step();
    int64_t most = 0;
    OptimizerSwapper::SubGroupHooks hooks;
    hooks.ready = [&](const std::vector<at::Tensor>& group) {
      int64_t n = 0;
      for (const auto& p : group) n += p.numel();
      most = std::max(most, n);
    };
    EXPECT_TRUE(swapper.step(
        [&] {
          opt->step();
          return true;
        },
        hooks));
    // 35 + 3 elements, then 40, then 4.
    EXPECT_EQ(swapper.sub_groups(), 3) << "step " << step;
    EXPECT_EQ(most, 40) << "step " << step;
    for (const auto& p : b) EXPECT_EQ(p.numel(), 0) << "a parameter stayed in memory";
  }
  swapper.swap_in_all();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "param " << i;
}

TEST(SubGroups, InMemoryStepsBySubGroupEqualOneStepBitwiseWithHooksInPipelineOrder) {
  // step_by_sub_groups (ZeRO-Infinity with the parameters on NVMe and the optimizer state in
  // memory): the optimizer steps each sub-group alone, its param groups narrowed. Elementwise
  // optimizers give bitwise the whole step's weights and state, also the fused ones, whose flat
  // state is laid out again for each sub-group. The hooks run as a pipeline: a sub-group's read
  // one sub-group ahead (before the previous one steps), `ready` right before its step, `after`
  // right after it.
  for (const std::string kind : {"adam", "adamw", "sgd", "fused_sgd", "fused_adamw"}) {
    for (int64_t sub_group : {1, 40, 1000}) {
      SCOPED_TRACE(kind + " sub_group " + std::to_string(sub_group));
      auto a = make_params(), b = make_params();
      auto ref = make_opt(kind, a), opt = make_opt(kind, b);
      for (int step = 0; step < 4; ++step) {
        set_grads(a, step);
        set_grads(b, step);
        ref->step();
        std::vector<std::string> events;
        auto note = [&](const char* what) {
          return [&events, what](const std::vector<at::Tensor>& g) {
            int64_t n = 0;
            for (const auto& p : g) n += p.numel();
            events.push_back(std::string(what) + std::to_string(n));
          };
        };
        volt::detail::SubGroupHooks hooks{note("read"), note("ready"), note("after")};
        const bool ok = volt::detail::step_by_sub_groups(
            *opt, sub_group,
            [&] {
              int64_t n = 0;
              for (const auto& g : opt->param_groups()) {
                for (const auto& p : g.params()) n += p.numel();
              }
              events.push_back("step" + std::to_string(n));
              opt->step();
              return true;
            },
            hooks);
        EXPECT_TRUE(ok);
        // The parameters hold 35, 3, 40 and 4 elements.
        const std::vector<std::string> expected =
            sub_group == 1    ? std::vector<std::string>{"read35",  "ready35", "read3",  "step35",
                                                         "after35", "ready3",  "read40", "step3",
                                                         "after3",  "ready40", "read4",  "step40",
                                                         "after40", "ready4",  "step4",  "after4"}
            : sub_group == 40 ? std::vector<std::string>{"read38",  "ready38", "read40", "step38",
                                                         "after38", "ready40", "read4",  "step40",
                                                         "after40", "ready4",  "step4",  "after4"}
                              : std::vector<std::string>{"read82", "ready82", "step82", "after82"};
        EXPECT_EQ(events, expected) << "step " << step;
        int64_t all = 0;
        for (const auto& g : opt->param_groups()) all += static_cast<int64_t>(g.params().size());
        EXPECT_EQ(all, 4) << "the param groups are whole again after the step";
      }
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_TRUE(torch::equal(a[i], b[i])) << "param " << i;
      }
      if (kind == "adam" || kind == "fused_adamw") {
        // The state too: one more whole step from it gives the same weights.
        set_grads(a, 9);
        set_grads(b, 9);
        ref->step();
        opt->step();
        for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << i;
      }
    }
  }
}

TEST(SubGroups, AFailedSubGroupStepLeavesTheParamGroupsWhole) {
  auto b = make_params();
  auto opt = make_opt("fused_adamw", b);
  set_grads(b, 0);
  int calls = 0;
  EXPECT_THROW(volt::detail::step_by_sub_groups(*opt, 1,
                                                [&]() -> bool {
                                                  if (++calls == 2) {
                                                    throw volt::ValueError("failing step");
                                                  }
                                                  opt->step();
                                                  return true;
                                                },
                                                {}),
               volt::ValueError);
  ASSERT_EQ(opt->param_groups().size(), 1u);
  EXPECT_EQ(opt->param_groups()[0].params().size(), 4u);
}

}  // namespace
