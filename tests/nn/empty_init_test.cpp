// EmptyInit (Lightning's init_module(empty_init=True)): the initializers that write a parameter do
// not run, everything else does, and a model so built takes its weights from a checkpoint.

#include "volt/nn/empty_init.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "log_capture.h"
#include "tiny.h"

namespace {

struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc = register_module("fc", torch::nn::Linear(16, 32));
    bn = register_module("bn", torch::nn::BatchNorm1d(32));
    emb = register_module("emb", torch::nn::Embedding(10, 16));
    conv = register_module("conv", torch::nn::Conv1d(torch::nn::Conv1dOptions(1, 4, 3)));
  }
  at::Tensor forward(const at::Tensor& ids) {
    const at::Tensor h = bn->forward(fc->forward(emb->forward(ids)));
    return conv->forward(h.unsqueeze(1)).flatten(1);
  }
  torch::nn::Linear fc{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
  torch::nn::Embedding emb{nullptr};
  torch::nn::Conv1d conv{nullptr};
};
TORCH_MODULE(Net);

// The first numbers the default generator gives after seeding: equal after a build only when
// the build drew none.
at::Tensor draws_after(uint64_t seed, const std::function<void()>& build) {
  torch::manual_seed(seed);
  build();
  return torch::rand({8});
}

}  // namespace

TEST(EmptyInit, SkipsTheParametersInitializersAndRunsTheRest) {
  const at::Tensor fresh = draws_after(7, [] {});
  Net empty{nullptr};
  EXPECT_TRUE(torch::equal(draws_after(7,
                                       [&] {
                                         volt::EmptyInit guard;
                                         EXPECT_TRUE(volt::EmptyInit::active());
                                         empty = Net();
                                       }),
                           fresh))
      << "an initializer drew random numbers under EmptyInit";
  EXPECT_FALSE(volt::EmptyInit::active());
  // Without the guard the same build draws (kaiming_uniform_, normal_ of the embedding).
  EXPECT_FALSE(torch::equal(draws_after(7, [] { Net(); }), fresh));
  // Buffers are initialized: BatchNorm's running statistics are not parameters.
  EXPECT_TRUE(torch::equal(empty->bn->running_mean, torch::zeros({32})));
  EXPECT_TRUE(torch::equal(empty->bn->running_var, torch::ones({32})));
  EXPECT_EQ(empty->bn->num_batches_tracked.item<int64_t>(), 0);

  torch::manual_seed(1);
  const at::Tensor drawn = torch::randn({4});
  volt::EmptyInit guard;
  // Tensors a constructor makes are filled and drawn as usual; a parameter made from one keeps
  // its values; copy_ into a parameter runs; an initializer on a parameter does not.
  EXPECT_EQ(torch::full({64}, 7.0).sum().item<float>(), 448.0F);
  EXPECT_EQ(torch::zeros({64}).abs().sum().item<float>(), 0.0F);  // memory the 7s just freed
  EXPECT_EQ(torch::ones({3}).sum().item<float>(), 3.0F);
  torch::manual_seed(1);
  EXPECT_TRUE(torch::equal(torch::randn({4}), drawn));
  torch::nn::Module holder;
  const at::Tensor p = holder.register_parameter("p", torch::full({2}, 4.0));
  EXPECT_TRUE(torch::equal(p, torch::full({2}, 4.0)));
  torch::nn::Linear lin(2, 2);
  {
    torch::NoGradGuard no_grad;
    lin->weight.copy_(torch::full({2, 2}, 5.0));
    torch::nn::init::constant_(lin->weight, 3.0);
    torch::nn::init::zeros_(lin->weight);
    torch::nn::init::normal_(lin->weight);
    torch::nn::init::kaiming_uniform_(lin->weight);
    lin->weight.fill_(at::scalar_tensor(2.0));
  }
  EXPECT_TRUE(torch::equal(lin->weight, torch::full({2, 2}, 5.0)));
  // Nested guards: the inner one's end leaves the outer active.
  { volt::EmptyInit inner; }
  EXPECT_TRUE(volt::EmptyInit::active());
  {
    torch::NoGradGuard no_grad;
    torch::nn::init::constant_(lin->weight, 3.0);
  }
  EXPECT_TRUE(torch::equal(lin->weight, torch::full({2, 2}, 5.0)));
  // Other threads initialize as usual.
  std::thread other([] {
    EXPECT_FALSE(volt::EmptyInit::active());
    torch::nn::Linear there(2, 2);
    torch::NoGradGuard no_grad;
    torch::nn::init::constant_(there->weight, 3.0);
    EXPECT_TRUE(torch::equal(there->weight, torch::full({2, 2}, 3.0)));
  });
  other.join();
}

// A guard released on another thread (init_module()'s context handed to a worker) ends the
// skipping on the thread that made it, leaves the releasing thread's own state alone, and says so.
TEST(EmptyInit, AGuardDestroyedOnAnotherThreadEndsItsOwnThreadsSkipping) {
  auto guard = std::make_unique<volt::EmptyInit>();
  torch::nn::Linear lin(2, 2);
  const auto initialized = [&] {
    torch::NoGradGuard no_grad;
    torch::nn::init::constant_(lin->weight, 3.0);
    return torch::equal(lin->weight, torch::full({2, 2}, 3.0));
  };
  ASSERT_FALSE(initialized());
  std::vector<std::string> lines;
  bool other_active_after = true, other_initializes = false;
  std::thread other([&] {
    volt::EmptyInit own;  // the releasing thread's own guard stays in force
    lines = volt_test::capture_logs([&] { guard.reset(); });
    other_active_after = volt::EmptyInit::active();
    torch::nn::Linear there(2, 2);
    torch::NoGradGuard no_grad;
    torch::nn::init::constant_(there->weight, 3.0);
    other_initializes = torch::equal(there->weight, torch::full({2, 2}, 3.0));
  });
  other.join();
  EXPECT_TRUE(volt_test::has(lines, "destroyed on another thread")) << lines.size();
  EXPECT_TRUE(other_active_after);
  EXPECT_FALSE(other_initializes);
  EXPECT_FALSE(volt::EmptyInit::active());
  EXPECT_TRUE(initialized());
  // A new guard on this thread works as before.
  {
    volt::EmptyInit again;
    torch::NoGradGuard no_grad;
    torch::nn::init::constant_(lin->weight, 7.0);
  }
  EXPECT_TRUE(torch::equal(lin->weight, torch::full({2, 2}, 3.0)));
  EXPECT_TRUE(initialized());
}

TEST(EmptyInit, AModelBuiltEmptyTakesItsWeightsFromACheckpoint) {
  volt_test::TempDir dir;
  torch::manual_seed(3);
  Net ref;
  ref->eval();
  const std::string path = dir / "net.pt";
  torch::save(ref, path);
  Net empty{nullptr};
  {
    volt::EmptyInit guard;
    empty = Net();
  }
  torch::load(empty, path);
  empty->eval();
  const at::Tensor ids = torch::randint(10, {5});
  EXPECT_TRUE(torch::equal(empty->forward(ids), ref->forward(ids)));
  // After the guard, initializers run again.
  torch::nn::Linear lin(2, 2);
  torch::NoGradGuard no_grad;
  torch::nn::init::constant_(lin->weight, 3.0);
  EXPECT_TRUE(torch::equal(lin->weight, torch::full({2, 2}, 3.0)));
}
