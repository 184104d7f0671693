// A training loop written by hand around volt::Fabric, for tests/fabric/fabric_test.cpp. Started
// as a plain process with --devices N it launches its other ranks itself (Fabric::launch re-runs
// this binary); started with rank variables it is one rank of that job. Every rank builds the
// model from its own seed (so only setup()'s broadcast makes them agree), trains an MLP with SGD
// on its shard, and writes its final flat parameters to <out>.rank<R>.pt.
//
//   volt_fabric_worker --out PREFIX [--devices N] [--steps S] [--batch B] [--accum K]
//       [--clip NORM] [--save-at STEP --save PATH] [--resume PATH] [--die-rank R --die-step S]
//       [--throw-rank R --throw-step S]
//       [--check-no-sync 1] [--precision NAME] [--timeout S]
//       [--spike-file F [--spike-rank R --spike-step S]]
//   volt_fabric_worker --out PREFIX --devices N --rank-zero-first FILE [--local 0|1]
//       [--first-fails 1]
//   --volt-module 1: the net is set up inside a volt::Module whose training_step computes the
//       loss and logs it with sync_dist; prints "rank R logged loss=X local=Y" at the end (X:
//       what log() kept, Y: this rank's own last loss).
//   --gan 1: two modules set up one after the other, a generator and a discriminator, each
//       with its own optimizer, trained by the alternating GAN loop; writes the generator's and
//       then the discriminator's flat parameters, and prints "gan d grads differ=D" (0/1: whether
//       the ranks' discriminator gradients differ after the generator's backward).
//       --check-module-no-sync 1: the first generator backward runs inside
//       no_backward_sync(g); prints "module no_sync g differ=G d differ=D" and stops. Under
//       ZeRO too (each module's forwards inside its forward_context), with --save-at / --save
//       and --resume (both modules and both optimizers in the state).
//   --gan-branch 1 (with --gan 1): at even steps rank 1's discriminator loss takes the fake
//       without detaching it, so that loss reaches the generator on rank 1 only. --gan-spare 1:
//       the generator holds a Linear no forward uses; prints "rank R spare grad defined=D"
//       (0/1) after the first discriminator backward. --find-unused 1: DDP's
//       find_unused_parameters.
//   --static-graph 1: DDP's static_graph option. --strategy NAME: "ddp" (default), a
//       "deepspeed_stage_N" (parameters partitioned whatever their size), "pipeline" (the net's
//       layers in a volt::Pipeline, one stage per rank) or "model_parallel" (the first Linear
//       column-parallel, the last row-parallel, across --tp ranks: default 2). --pipeline 1: the
//       layers in a volt::Pipeline under any strategy (in one process it runs whole: the
//       reference);
//       --chunks C: its micro-batches (default 1). --schedule 1f1b: the loss through the
//       Pipeline's forward_loss (the 1F1B schedule).
//   --spike-file F: a FabricSpikeDetection callback writing to F, called after each step's
//       backward with the step's loss and its index within the epoch; with --spike-rank and
//       --spike-step rank R passes 50 times its loss at step S.
//   --batchnorm 1: a BatchNorm1d after the first layer (its running statistics are written
//       after the parameters); --sync-bn 1: FabricOptions::sync_batchnorm; --check-buffers 1:
//       prints "buffers differ before=B inside=I" at the second step (whether the ranks'
//       running means differ before forward_context and inside it); --outside 1: the forward
//       under autocast() instead of forward_context(net); --outside-from S: so from step S on.
//   --check-broadcast 1: broadcasts whose ranks pass tensors of other shapes and dtypes, or none;
//       prints "rank R WHAT sizes=S dtype=D sum=X" for each and "rank R error: E" for the one
//       from an undefined source, then stops.
//   --checkpoint-g 1 (with --gan 1): the generator runs wholly inside volt::checkpoint, so the
//       generator loss's graph does not show it; --checkpoint-g 2: and the generator's backward
//       names it (fabric.backward(loss, g)); --checkpoint-g 3: rank 0 so, and rank 1 detaches
//       the generator's output (its generator loss reaches no generator weight).
//
// Prints "rank R world W" after launch, "gathered a,b,..." (every rank's rank through
// all_gather), with --check-no-sync "no_sync grads differ=D synced grads differ=E" (0/1: whether
// the ranks' gradients differ after a backward inside / outside no_backward_sync), and "rank R
// done step=S loss=L" (L: the last loss averaged over the ranks). With --rank-zero-first it only
// runs a rank_zero_first block: rank 0 writes FILE after 300 ms (or throws "could not prepare"
// with --first-fails), the other ranks print "rank R found the file: 0/1". Exit 0 done, 1 a volt
// error (printed), 2 bad usage.

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tiny.h"
#include "volt/core/registry.h"
#include "volt/fabric/fabric.h"
#include "volt/fabric/spike_detection.h"
#include "volt/nn/checkpoint.h"
#include "volt/nn/pipeline.h"

namespace {

torch::nn::Sequential make_net(bool batchnorm) {
  if (batchnorm) {
    return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::BatchNorm1d(16),
                                 torch::nn::Tanh(), torch::nn::Linear(16, 2));
  }
  return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::Tanh(),
                               torch::nn::Linear(16, 2));
}

// The parameters, then the buffers (BatchNorm's running statistics and count), as floats.
at::Tensor flat(const torch::nn::Module& m) {
  std::vector<at::Tensor> all;
  for (const auto& p : m.parameters()) all.push_back(p.detach().reshape({-1}));
  for (const auto& b : m.buffers()) all.push_back(b.detach().reshape({-1}).to(at::kFloat));
  return at::cat(all);
}

// 1 when the ranks' values of `t` are not all equal.
int64_t differ(volt::Fabric& fabric, const at::Tensor& t) {
  const at::Tensor all = fabric.all_gather(t);
  for (int64_t r = 1; r < all.size(0); ++r) {
    if (!at::equal(all[r], all[0])) return 1;
  }
  return 0;
}

// The net inside a volt::Module, as a LightningModule driven by Fabric: its training_step
// logs the loss reduced over the ranks.
class NetModule : public volt::Module {
 public:
  explicit NetModule(torch::nn::Sequential net) : net(register_module("net", std::move(net))) {}
  at::Tensor training_step(const volt::Batch& b, int64_t) override {
    const at::Tensor loss = torch::cross_entropy_loss(net->forward(b.input), b.target);
    log("loss", loss, volt::LogOptions().sync_dist(true));
    return loss;
  }
  std::vector<volt::OptimizerConfig> configure_optimizers() override { return {}; }
  torch::nn::Sequential net;
};

// The classic GAN loop over two set-up modules: the discriminator steps on real rows and on
// the generator's detached output (its loss does not reach the generator), then the generator
// steps through the discriminator (its loss reaches both). The noise comes from the batch rows,
// so one process on the global batch sees the same noise as two ranks on its halves. Each
// module's forwards run inside its forward_context (ZeRO-3 gathers its parameters there).
// check_module_no_sync: the generator's backward of the first step runs inside
// no_backward_sync(g); the run prints whether each module's gradients differ over the ranks and
// stops there. The weights are written after the Fabric is destroyed (ZeRO-3's teardown makes
// the modules whole).
int run_gan(std::unique_ptr<volt::Fabric>& holder, int64_t rank,
            std::map<std::string, std::string>& a, bool ddp) {
  volt::Fabric& fabric = *holder;
  auto num = [&](const char* k, int64_t def) { return a.count(k) ? std::stoll(a[k]) : def; };
  const volt::DataLoader train = fabric.setup_dataloader(
      volt::DataLoader(volt_test::blobs(128, 8, 1),
                       volt::DataLoaderOptions(num("--batch", 8)).shuffle(true).seed(5)));
  if (fabric.world_size() == 2) {
    // A loader the program sharded itself is kept as it is: 5 rows unpadded are 3 and 2 (the
    // Fabric re-sharded it padded, 3 and 3, before session 98).
    const volt::DataLoader own = fabric.setup_dataloader(
        volt::DataLoader(volt_test::blobs(5), volt::DataLoaderOptions(1)).sharded(rank, 2, false));
    if (own.num_batches() != (rank == 0 ? 3 : 2)) {
      std::fprintf(stderr, "rank %lld: a loader sharded by the program has %lld batches\n",
                   static_cast<long long>(rank), static_cast<long long>(own.num_batches()));
      return 1;
    }
  }
  torch::manual_seed(2000 + static_cast<uint64_t>(rank));  // rank 0's weights must win
  torch::nn::Sequential g(torch::nn::Linear(4, 16), torch::nn::Tanh(), torch::nn::Linear(16, 8));
  torch::nn::Sequential d(torch::nn::Linear(8, 16), torch::nn::Tanh(), torch::nn::Linear(16, 1));
  // --gan-spare: a generator parameter no forward uses (registered, not in the sequence).
  const bool spare = num("--gan-spare", 0) != 0;
  if (spare) g->register_module("spare", torch::nn::Linear(2, 2));
  auto opt_g = std::make_shared<torch::optim::SGD>(g->parameters(),
                                                   torch::optim::SGDOptions(0.05).momentum(0.5));
  auto opt_d = std::make_shared<torch::optim::SGD>(d->parameters(),
                                                   torch::optim::SGDOptions(0.05).momentum(0.5));
  fabric.setup(g, {opt_g});
  fabric.setup(d, {opt_d});
  const auto bce = [](const at::Tensor& logits, double target) {
    return torch::binary_cross_entropy_with_logits(logits, at::full_like(logits, target));
  };
  const auto state_of = [&](int64_t step) {
    volt::FabricState state;
    state.module("g", *g)
        .module("d", *d)
        .optimizer("opt_g", *opt_g)
        .optimizer("opt_d", *opt_d)
        .value("step", step);
    return state;
  };
  int64_t step = 0;
  if (a.count("--resume")) {
    volt::FabricState state = state_of(0);
    fabric.load(a["--resume"], state);
    step = state.value("step").toInt();
  }
  const int64_t steps = num("--steps", 12), save_at = num("--save-at", -1);
  const int64_t checkpoint_g = num("--checkpoint-g", 0);
  const int64_t per_epoch = train.num_batches();
  while (step < steps) {
    volt::BatchStream stream = train.stream(step / per_epoch, step % per_epoch);
    volt::Batch b;
    for (; step < steps && stream.next(b);) {
      const at::Tensor real = fabric.to_device(b).input;
      const at::Tensor z = at::sin(real.narrow(1, 0, 4) * 3);
      fabric.zero_grad(*opt_d);
      at::Tensor fake, loss_d;
      {
        auto forward = fabric.forward_context(g);
        // --checkpoint-g 3: rank 0 checkpoints the generator, rank 1 detaches its output.
        const bool checkpointed = checkpoint_g > 0 && (checkpoint_g != 3 || rank == 0);
        fake = checkpointed ? volt::checkpoint(
                                  [s = g.ptr()](const at::Tensor& x) { return s->forward(x); }, z)
                            : g->forward(z);
        if (checkpoint_g == 3 && rank == 1) fake = fake.detach();
      }
      {
        auto forward = fabric.forward_context(d);
        // --gan-branch: a data-dependent branch reaching the generator on one rank only (a
        // forward of its own: the generator loss below backpropagates through `fake`).
        const bool branch = num("--gan-branch", 0) != 0 && rank == 1 && step % 2 == 0;
        loss_d =
            bce(d->forward(real), 1) + bce(d->forward(branch ? g->forward(z) : fake.detach()), 0);
      }
      fabric.backward(loss_d);
      if (spare && step == 0) {
        std::printf("rank %ld spare grad defined=%d\n", static_cast<long>(rank),
                    g->named_parameters()["spare.weight"].grad().defined() ? 1 : 0);
        std::fflush(stdout);
      }
      fabric.step(*opt_d);
      fabric.zero_grad(*opt_g);
      fabric.zero_grad(*opt_d);
      at::Tensor loss_g;
      {
        auto forward = fabric.forward_context(d);
        loss_g = bce(d->forward(fake), 1);
      }
      if (num("--check-module-no-sync", 0) != 0) {
        {
          auto no_sync = fabric.no_backward_sync(g);
          fabric.backward(loss_g);
        }
        std::printf("module no_sync g differ=%ld d differ=%ld\n",
                    static_cast<long>(differ(fabric, g->parameters()[0].grad())),
                    static_cast<long>(differ(fabric, d->parameters()[0].grad())));
        std::fflush(stdout);
        return 0;
      }
      if (checkpoint_g == 2) {
        fabric.backward(loss_g, g);
      } else {
        fabric.backward(loss_g);
      }
      if (step == 0 && ddp) {  // ZeRO keeps each rank's chunk of the gradients
        std::printf("gan d grads differ=%ld\n",
                    static_cast<long>(differ(fabric, d->parameters()[0].grad())));
        std::fflush(stdout);
      }
      fabric.step(*opt_g);
      ++step;
      if (step == save_at) fabric.save(a["--save"], state_of(step));
    }
  }
  holder.reset();
  torch::save(at::cat({flat(*g), flat(*d)}), a["--out"] + ".rank" + std::to_string(rank) + ".pt");
  std::printf("rank %ld done step=%ld\n", static_cast<long>(rank), static_cast<long>(step));
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> a;
  for (int i = 1; i + 1 < argc; i += 2) a[argv[i]] = argv[i + 1];
  auto num = [&](const char* k, int64_t def) { return a.count(k) ? std::stoll(a[k]) : def; };
  if (!a.count("--out")) {
    std::fprintf(stderr, "usage: volt_fabric_worker --out PREFIX [--devices N] ...\n");
    return 2;
  }
  try {
    std::filesystem::create_directories(std::filesystem::path(a["--out"]).parent_path());
    // The registry's "ddp" or "deepspeed_stage_N" with its arguments (a strategy object would
    // also take the accelerator, precision and device count).
    const std::string strategy = a.count("--strategy") ? a["--strategy"] : "ddp";
    std::map<std::string, volt::ParamValue> args{
        {"timeout_s", static_cast<double>(num("--timeout", 30))}};
    if (strategy == "ddp") {
      args["static_graph"] = num("--static-graph", 0) != 0;
      args["find_unused_parameters"] = num("--find-unused", 0) != 0;
    } else if (strategy == "model_parallel") {
      // The first Linear split by its outputs, the last by its inputs (Megatron's MLP pair).
      args["tensor_parallel_size"] = num("--tp", 2);
      args["tp_plan"] = std::vector<std::string>{"0=colwise", "2=rowwise"};
    } else if (strategy != "pipeline") {
      args["param_persistence_threshold"] = int64_t{0};  // stage 3 partitions every parameter
    }
    // Destroyed before the weights are written: its teardown makes a stage-3 module whole.
    std::vector<std::shared_ptr<volt::FabricCallback>> callbacks;
    if (a.count("--spike-file")) {
      callbacks.push_back(std::make_shared<volt::FabricSpikeDetection>(
          volt::SpikeDetectionOptions().exclude_batches_path(a["--spike-file"])));
    }
    auto fabric_holder = std::make_unique<volt::Fabric>(
        volt::FabricOptions()
            .callbacks(callbacks)
            .accelerator("cpu")
            .devices(num("--devices", 1))
            .num_nodes(num("--num-nodes", 1))
            .strategy(volt::named<volt::Strategy>(strategy, std::move(args)))
            .precision(a.count("--precision") ? a["--precision"] : "32-true")
            .sync_batchnorm(num("--sync-bn", 0) != 0));
    volt::Fabric& fabric = *fabric_holder;
    fabric.launch();
    const int64_t rank = fabric.global_rank();
    std::printf("rank %ld world %ld\n", static_cast<long>(rank),
                static_cast<long>(fabric.world_size()));
    std::fflush(stdout);
    const at::Tensor gathered = fabric.all_gather(at::full({1}, rank, at::kLong));
    if (fabric.is_global_zero()) {
      std::string line = "gathered ";
      for (int64_t r = 0; r < gathered.size(0); ++r) {
        line += (r ? "," : "") + std::to_string(gathered[r][0].item<int64_t>());
      }
      fabric.print(line);
    }

    // Every rank asks; Fabric::print decides which print.
    if (num("--print-on-every-rank", 0) != 0)
      fabric.print("printed by rank " + std::to_string(rank));

    if (num("--check-broadcast", 0) != 0) {
      // Rank 0's value reaches rank 1 whatever rank 1 passed (another shape and dtype, or
      // nothing); an undefined value on the source is every rank's ValueError, and the group
      // goes on working; rank 1 sends a bool tensor to rank 0's float placeholder.
      const at::Tensor mine = at::arange(6, at::kFloat).reshape({2, 3}) * (rank + 1);
      const auto show = [&](const std::string& what, const at::Tensor& t) {
        std::printf("rank %ld %s sizes=%s dtype=%s sum=%g\n", static_cast<long>(rank), what.c_str(),
                    c10::str(t.sizes()).c_str(), c10::toString(t.scalar_type()),
                    t.to(at::kDouble).sum().item<double>());
        std::fflush(stdout);
      };
      show("other", fabric.broadcast(rank == 0 ? mine : at::zeros({1}, at::kLong)));
      show("undefined", fabric.broadcast(rank == 0 ? mine : at::Tensor()));
      try {
        fabric.broadcast(rank == 0 ? at::Tensor() : mine);
      } catch (const volt::ValueError& e) {
        std::printf("rank %ld error: %s\n", static_cast<long>(rank), e.what());
      }
      const at::Tensor flags = at::arange(4).reshape({2, 2}).remainder(3).to(at::kBool);
      show("bool", fabric.broadcast(rank == 1 ? flags : at::ones({7}), 1));
      return 0;
    }

    if (a.count("--rank-zero-first")) {
      const std::string file = a["--rank-zero-first"];
      auto first = fabric.rank_zero_first(num("--local", 0) != 0);
      if (rank == 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        if (num("--first-fails", 0) != 0) throw volt::DataError("could not prepare " + file);
        std::FILE* f = std::fopen(file.c_str(), "w");
        if (f != nullptr) std::fclose(f);
      } else {
        std::printf("rank %ld found the file: %d\n", static_cast<long>(rank),
                    std::filesystem::exists(file) ? 1 : 0);
        std::fflush(stdout);
      }
      return 0;
    }

    if (num("--gan", 0) != 0) return run_gan(fabric_holder, rank, a, strategy == "ddp");

    torch::manual_seed(1000 + static_cast<uint64_t>(rank));  // rank 0's weights must win
    auto net = make_net(num("--batchnorm", 0) != 0);
    volt::Pipeline pipe{nullptr};
    if (strategy == "pipeline" || num("--pipeline", 0) != 0) {
      // The same layers (and so the same initial weights and flat order), one stage per rank.
      pipe = volt::Pipeline(net, volt::PipelineOptions().chunks(num("--chunks", 1)));
      net = torch::nn::Sequential(pipe);
    }
    const bool one_f_one_b = pipe && a.count("--schedule") != 0 && a["--schedule"] == "1f1b";
    auto opt = std::make_shared<torch::optim::SGD>(net->parameters(),
                                                   torch::optim::SGDOptions(0.1).momentum(0.9));
    std::shared_ptr<NetModule> as_module;
    if (num("--volt-module", 0) != 0) {
      as_module = std::make_shared<NetModule>(net);
      fabric.setup(as_module, {opt});
    } else {
      fabric.setup(net, {opt});
    }
    const int64_t accum = num("--accum", 1);
    volt::DataLoader train = fabric.setup_dataloader(
        volt::DataLoader(volt_test::blobs(128, 8, 1),
                         volt::DataLoaderOptions(num("--batch", 8)).shuffle(true).seed(5)));

    int64_t step = 0;
    at::Tensor last_loss = at::zeros({});
    if (a.count("--resume")) {
      volt::FabricState state;
      state.module("model", *net)
          .optimizer("opt", *opt)
          .value("step", int64_t{0})
          .tensor("last_loss", last_loss);
      fabric.load(a["--resume"], state);
      step = state.value("step").toInt();
    }
    const int64_t steps = num("--steps", 12);
    const int64_t per_epoch = train.num_batches() / accum;
    const int64_t save_at = num("--save-at", -1);
    while (step < steps) {
      const int64_t epoch = step / per_epoch;
      volt::BatchStream stream = train.stream(epoch, (step % per_epoch) * accum);
      volt::Batch b;
      for (; step < steps && stream.next(b);) {
        if (rank == num("--die-rank", -1) && step == num("--die-step", -1)) ::raise(SIGKILL);
        if (rank == num("--throw-rank", -1) && step == num("--throw-step", -1)) {
          throw volt::DataError("rank " + std::to_string(rank) + " could not read step " +
                                std::to_string(step));
        }
        for (int64_t k = 0; k < accum; ++k) {
          if (k > 0 && !stream.next(b)) break;
          b = fabric.to_device(b);
          const bool check_buffers = num("--check-buffers", 0) != 0 && step == 1 && k == 0;
          int64_t buffers_before = 0;
          if (check_buffers) buffers_before = differ(fabric, net->buffers()[0]);
          at::Tensor loss;
          {
            // --outside 1: the forward under the precision's context alone (no buffer broadcast,
            // no SyncBatchNorm), which sync_batchnorm refuses at backward; --outside-from S: so
            // from step S on.
            std::shared_ptr<void> context;
            if (num("--outside", 0) != 0 || step >= num("--outside-from", steps)) {
              context = fabric.autocast();
            } else if (as_module) {
              context = fabric.forward_context(as_module);
            } else {
              context = fabric.forward_context(net);
            }
            if (check_buffers) {
              std::printf("buffers differ before=%ld inside=%ld\n",
                          static_cast<long>(buffers_before),
                          static_cast<long>(differ(fabric, net->buffers()[0])));
              std::fflush(stdout);
            }
            if (one_f_one_b) {
              loss = pipe->forward_loss(b.input, b.target,
                                        [](const at::Tensor& out, const at::Tensor& target) {
                                          return torch::cross_entropy_loss(out, target);
                                        });
            } else if (as_module) {
              loss = as_module->training_step(b, step);
            } else {
              loss = torch::cross_entropy_loss(net->forward(b.input), b.target);
            }
            loss = loss / accum;
          }
          const bool last = k + 1 == accum;
          {
            auto no_sync = fabric.no_backward_sync(!last);
            fabric.backward(loss);
          }
          if (num("--check-no-sync", 0) != 0 && accum == 2 && step == 0) {
            const int64_t d = differ(fabric, net->parameters()[0].grad());
            if (k == 0) {
              std::printf("no_sync grads differ=%ld", static_cast<long>(d));
            } else {
              std::printf(" synced grads differ=%ld\n", static_cast<long>(d));
            }
            std::fflush(stdout);
          }
          last_loss = loss.detach() * accum;
        }
        const bool spiked = rank == num("--spike-rank", -1) && step == num("--spike-step", -1);
        fabric.call(&volt::FabricSpikeDetection::on_train_batch_end, fabric,
                    spiked ? last_loss * 50.0 : last_loss, step % per_epoch);
        if (a.count("--clip")) fabric.clip_gradients(*opt, std::stod(a["--clip"]));
        fabric.step(*opt);
        fabric.zero_grad(*opt);
        ++step;
        if (step == save_at) {
          volt::FabricState state;
          state.module("model", *net)
              .optimizer("opt", *opt)
              .value("step", step)
              .tensor("last_loss", last_loss);
          fabric.save(a["--save"], state);
        }
      }
    }
    const double mean_loss = fabric.all_reduce(last_loss.to(at::kFloat)).item<double>();
    if (as_module) {
      std::printf("rank %ld logged loss=%.9g local=%.9g\n", static_cast<long>(rank),
                  as_module->run()->callback_metrics().at("loss"), last_loss.item<double>());
    }
    fabric_holder.reset();
    torch::save(flat(*net), a["--out"] + ".rank" + std::to_string(rank) + ".pt");
    std::printf("rank %ld done step=%ld loss=%.9g\n", static_cast<long>(rank),
                static_cast<long>(step), mean_loss);
    std::fflush(stdout);
    return 0;
  } catch (const std::exception& e) {
    std::printf("error: %s\n", e.what());
    std::fflush(stdout);
    return 1;
  }
}
