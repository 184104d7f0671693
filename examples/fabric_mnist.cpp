// A training loop written by hand with volt::Fabric (Lightning Fabric in C++): an MLP on
// Fashion-MNIST, data parallel over N processes, checkpointed every epoch and resumable, with
// the test accuracy gathered from every rank at the end.
//
//   volt_fabric_mnist [--devices N] [--strategy S] [--precision P] [--epochs E]
//                     [--max-steps S] [--batch-size B] [--lr LR] [--data DIR] [--out DIR]
//                     [--resume]
//
// --devices 2 runs this binary again as rank 1 (Fabric::launch); --strategy takes "auto",
// "ddp", ZeRO's "deepspeed_stage_1/2/3" (the checkpoint then a folder of shards) or "pipeline"
// (the MLP's layers in a volt::Pipeline, one stage per process, 4 micro-batches); --resume
// continues from <out>/last.ckpt. Metrics go to <out>/fabric/version_N/metrics.csv. Exit 0 done, 1
// a failure while training, 2 bad arguments or options.

#include <volt/volt.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>

namespace {

void usage() {
  std::cerr << "usage: volt_fabric_mnist [--devices N] [--strategy S] [--precision P] "
               "[--epochs E] [--max-steps S] [--batch-size B] [--lr LR] [--data DIR] [--out DIR] "
               "[--resume]\n";
}

// Hooks of this program's own, reached by fabric.call (Lightning Fabric's callbacks).
struct EpochHooks : virtual volt::FabricCallback {
  virtual void on_train_epoch_end(volt::Fabric& fabric, int64_t epoch, int64_t step,
                                  double loss) = 0;
};

// Every rank runs the callbacks; fabric.print writes on rank 0 only.
struct PrintProgress : EpochHooks {
  void on_train_epoch_end(volt::Fabric& fabric, int64_t epoch, int64_t step, double loss) override {
    char line[96];
    std::snprintf(line, sizeof line, "epoch %ld: step %ld, mean loss over the ranks %.4f",
                  static_cast<long>(epoch), static_cast<long>(step), loss);
    fabric.print(line);
  }
};

torch::nn::Sequential make_mlp(bool pipeline) {
  if (pipeline) {
    // The layers split into one stage per process; each batch flows as 4 micro-batches.
    return torch::nn::Sequential(
        torch::nn::Flatten(),
        volt::Pipeline(torch::nn::Sequential(torch::nn::Linear(784, 256), torch::nn::ReLU(),
                                             torch::nn::Linear(256, 128), torch::nn::ReLU(),
                                             torch::nn::Linear(128, 10)),
                       volt::PipelineOptions().chunks(4)));
  }
  return torch::nn::Sequential(torch::nn::Flatten(), torch::nn::Linear(784, 256), torch::nn::ReLU(),
                               torch::nn::Linear(256, 128), torch::nn::ReLU(),
                               torch::nn::Linear(128, 10));
}

struct Args {
  int64_t devices = 1, epochs = 2, max_steps = -1, batch = 64;
  double lr = 1e-3;
  std::string strategy = "auto", precision = "32-true", data = volt::kFashionMnistDefaultRoot,
              out = "runs/fabric_mnist";
  bool resume = false;
};

void train(const Args& args) {
  if (args.batch <= 0 || args.epochs <= 0) {
    throw volt::ConfigError("[fabric_mnist] --batch-size and --epochs must be > 0.");
  }
  volt::Fabric fabric(volt::FabricOptions()
                          .accelerator("cpu")
                          .devices(args.devices)
                          .strategy(args.strategy)
                          .precision(args.precision)
                          .loggers({std::make_shared<volt::CSVLogger>(
                              volt::CSVLoggerOptions(args.out).name("fabric"))})
                          .callbacks({std::make_shared<PrintProgress>()}));
  fabric.launch();  // with --devices 2 the binary runs again from main as rank 1
  std::shared_ptr<volt::FashionMnist> train_set, test_set;
  {
    // Rank 0 reads the files first (and fails alone, with the reason, when they are missing:
    // the others then fail as its process ends); the other ranks read them after.
    auto first = fabric.rank_zero_first();
    std::filesystem::create_directories(args.out);
    train_set = std::make_shared<volt::FashionMnist>(args.data, volt::FashionMnist::Split::kTrain);
    test_set = std::make_shared<volt::FashionMnist>(args.data, volt::FashionMnist::Split::kTest);
  }

  torch::manual_seed(42);  // the same on every rank; setup() would make them agree anyway
  auto net = make_mlp(fabric.strategy().name() == "pipeline");
  auto opt =
      std::make_shared<torch::optim::AdamW>(net->parameters(), torch::optim::AdamWOptions(args.lr));
  fabric.setup(net, {opt});
  volt::DataLoader train = fabric.setup_dataloader(
      volt::DataLoader(train_set, volt::DataLoaderOptions(args.batch).shuffle(true).seed(7)));
  volt::DataLoader test =
      fabric.setup_dataloader(volt::DataLoader(test_set, volt::DataLoaderOptions(256)));

  const std::string ckpt = args.out + "/last.ckpt";
  // Where the next run goes on: an epoch and the first batch of it not yet trained (a run
  // stopped by --max-steps stops mid-epoch; the loader's stream starts at any batch).
  int64_t start_epoch = 0, start_batch = 0, step = 0;
  if (args.resume) {
    volt::FabricState state;
    state.module("model", *net)
        .optimizer("opt", *opt)
        .value("epoch", 0)
        .value("batch", 0)
        .value("step", 0);
    fabric.load(ckpt, state);
    start_epoch = state.value("epoch").toInt();
    start_batch = state.value("batch").toInt();
    step = state.value("step").toInt();
    fabric.print("resumed from " + ckpt + " at epoch " + std::to_string(start_epoch) + ", batch " +
                 std::to_string(start_batch) + ", step " + std::to_string(step));
  }
  auto done = [&] { return args.max_steps >= 0 && step >= args.max_steps; };

  for (int64_t epoch = start_epoch; epoch < args.epochs && !done(); ++epoch) {
    net->train();
    at::Tensor loss_sum = at::zeros({}, at::kDouble);
    const int64_t first = epoch == start_epoch ? start_batch : 0;
    int64_t batches = 0;
    for (volt::Batch& batch : train.stream(epoch, first)) {
      if (done()) break;
      const volt::Batch b = fabric.to_device(batch);
      at::Tensor loss;
      {
        auto forward = fabric.forward_context(net);  // autocast, DDP's buffer broadcast
        loss = torch::cross_entropy_loss(net->forward(b.input), b.target);
      }
      fabric.backward(loss);
      // ZeRO clips inside its step, by its config's gradient_clipping (as in Lightning Fabric).
      if (fabric.strategy().name() != "deepspeed") fabric.clip_gradients(*opt, 1.0);
      fabric.step(*opt);
      fabric.zero_grad(*opt);
      ++step;
      loss_sum += loss.detach().to(at::kDouble);
      ++batches;
      if (step % 50 == 0) fabric.log("train_loss", loss);  // at the steps taken (= step)
    }
    const double mean_loss =
        fabric.all_reduce(loss_sum / std::max<int64_t>(batches, 1)).item<double>();
    fabric.log("epoch_loss", mean_loss);
    fabric.call(&EpochHooks::on_train_epoch_end, fabric, epoch, step, mean_loss);
    const bool finished = first + batches >= train.num_batches();
    volt::FabricState state;
    state.module("model", *net)
        .optimizer("opt", *opt)
        .value("epoch", finished ? epoch + 1 : epoch)
        .value("batch", finished ? 0 : first + batches)
        .value("step", step);
    fabric.save(ckpt, state);  // rank 0 writes atomically; every rank waits for the file
  }

  // Test accuracy over the whole test set: each rank counts its shard, the counts are summed
  // (the distributed sampler pads the last shard with samples from the start, as PyTorch's;
  // a pipeline's ranks all read the whole set, which the ratio does not mind).
  net->eval();
  torch::NoGradGuard no_grad;
  at::Tensor counts = at::zeros({2}, at::kDouble);  // correct, seen
  for (volt::Batch& batch : test.stream(0)) {
    const volt::Batch b = fabric.to_device(batch);
    at::Tensor logits;
    {
      // ZeRO stage 3 gathers the partitioned weights inside the context (evaluations too).
      auto forward = fabric.forward_context(net);
      logits = net->forward(b.input);
    }
    counts[0] += logits.argmax(1).eq(b.target).sum().to(at::kDouble);
    counts[1] += static_cast<double>(b.size());
  }
  counts = fabric.all_reduce(counts, volt::Reduce::kSum);
  const double accuracy = (counts[0] / counts[1]).item<double>();
  fabric.log("test_acc", accuracy);
  char line[96];
  std::snprintf(line, sizeof line, "test accuracy %.4f after %ld steps on %ld process(es)",
                accuracy, static_cast<long>(step), static_cast<long>(fabric.world_size()));
  fabric.print(line);
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        usage();
        std::exit(2);
      }
      return argv[++i];
    };
    try {
      if (a == "--devices") {
        args.devices = std::stoll(next());
      } else if (a == "--strategy") {
        args.strategy = next();
      } else if (a == "--precision") {
        args.precision = next();
      } else if (a == "--epochs") {
        args.epochs = std::stoll(next());
      } else if (a == "--max-steps") {
        args.max_steps = std::stoll(next());
      } else if (a == "--batch-size") {
        args.batch = std::stoll(next());
      } else if (a == "--lr") {
        args.lr = std::stod(next());
      } else if (a == "--data") {
        args.data = next();
      } else if (a == "--out") {
        args.out = next();
      } else if (a == "--resume") {
        args.resume = true;
      } else if (a == "--help" || a == "-h") {
        usage();
        return 0;
      } else {
        std::cerr << "unknown argument '" << a << "'\n";
        usage();
        return 2;
      }
    } catch (const std::logic_error&) {
      std::cerr << "bad value for " << a << "\n";
      return 2;
    }
  }
  // The Fabric lives inside train(): on an error it is gone (its processes torn down, without
  // waiting for ranks that may have died) before the message is printed.
  try {
    train(args);
    return 0;
  } catch (const volt::ConfigError& e) {
    std::cerr << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
