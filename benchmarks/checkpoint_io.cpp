// Checkpoint writing: how long a save keeps the training thread, TorchCheckpointIO against
// AsyncCheckpointIO, and what that does to a Trainer run that checkpoints every N steps.
//
//   volt_bench_checkpoint_io [--dir PATH (default /tmp)] [--rounds N (default 5)]
//
// Part 1, one archive of S MiB (float tensors of 1 MiB each, like a model's parameters and Adam
// state), saved to --dir: the previous TorchCheckpointIO encoder (an ostringstream, then two
// copies into the file's bytes) as the reference, today's TorchCheckpointIO (serialised straight
// into the file's bytes), and AsyncCheckpointIO's save() (what the caller waits for) and
// save() + flush() (until the file is on disk), and save() with reuse_buffer=false (a fresh
// buffer per save). Sides alternate call by call; medians of --rounds. Then one load of the same
// file: the previous loader (no envelope checks) against today's, and what today's spends in
// the archive check it runs before libtorch (session 24).
// Part 2: Trainer.fit of an MLP with Adam (10.5 M parameters: a ~126 MB checkpoint), saving
// every 10 steps (ModelCheckpoint, all kept), with each CheckpointIO (Async with and without
// reuse_buffer) and with no checkpoints; fits alternate; median wall seconds.

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "host_memory.h"
#include "io/detail/archive_check.h"
#include "remove_dir.h"
#include "timing.h"
#include "volt/volt.h"

namespace {

using volt_bench::median;
using volt_bench::time_ms;

// The encoder TorchCheckpointIO had until this benchmark was written: the archive into an
// ostringstream, .str() (a copy), appended after the header (another copy); same envelope.
void previous_save(torch::serialize::OutputArchive& ar, const std::string& path) {
  std::ostringstream payload_stream;
  ar.save_to(payload_stream);
  const std::string payload = payload_stream.str();
  std::string file;
  file.reserve(24 + payload.size());
  file.append(24, '\0');  // header fields: the timing is in the copies and the write
  file.append(payload);
  volt::atomic_write_file(path, file);
}

// The loader TorchCheckpointIO had until then: the file through istreambuf_iterator, the
// payload copied out (substr) into an istringstream (envelope checks left out: same in both).
torch::serialize::InputArchive previous_load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream payload(file.substr(24));
  torch::serialize::InputArchive archive;
  archive.load_from(payload);
  return archive;
}

void save_archive_rows(const std::string& dir, int rounds) {
  struct LoadRow {
    int64_t mib;
    double previous, now, check;
  };
  std::vector<LoadRow> loads;
  std::printf("\n## One save (median of %d, ms)\n\n", rounds);
  std::printf(
      "| size | previous encoder | TorchCheckpointIO | Async save() | Async save+flush "
      "| Async save(), no reuse_buffer | caller: sync / async |\n"
      "|---|---:|---:|---:|---:|---:|---:|\n");
  for (int64_t mib : {16, 64, 256}) {
    torch::serialize::OutputArchive ar;
    for (int64_t i = 0; i < mib; ++i) ar.write("t" + std::to_string(i), torch::randn({1 << 18}));
    const std::string path = dir + "/volt_bench_ckpt.ckpt";
    volt::TorchCheckpointIO sync;
    volt::AsyncCheckpointIO async;
    volt::AsyncCheckpointIO fresh(volt::AsyncCheckpointIOOptions().reuse_buffer(false));
    std::vector<double> prev, s, a_call, a_total, f_call;
    for (int r = 0; r < rounds + 1; ++r) {
      const double p = time_ms([&] { previous_save(ar, path); });
      const double t = time_ms([&] { sync.save(ar, path); });
      double call = 0;
      const double total = time_ms([&] {
        call = time_ms([&] { async.save(ar, path); });
        async.flush();
      });
      double fcall = 0;
      time_ms([&] {
        fcall = time_ms([&] { fresh.save(ar, path); });
        fresh.flush();
      });
      if (r == 0) continue;  // warm-up: page cache, allocator
      prev.push_back(p);
      s.push_back(t);
      a_call.push_back(call);
      a_total.push_back(total);
      f_call.push_back(fcall);
    }
    std::printf("| %lld MiB | %.1f | %.1f | %.1f | %.1f | %.1f | %.1fx |\n",
                static_cast<long long>(mib), median(prev), median(s), median(a_call),
                median(a_total), median(f_call), median(s) / median(a_call));
    std::fflush(stdout);
    sync.save(ar, path);
    std::vector<double> lp, ln, lc;
    std::ifstream in(path, std::ios::binary);
    const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (int r = 0; r < rounds + 1; ++r) {
      const double p = time_ms([&] { previous_load(path); });
      const double n = time_ms([&] { sync.load(path); });
      // The archive check alone (part of load since session 24), on the payload in memory.
      const double c = time_ms(
          [&] { volt::detail::check_torch_archive(file.data() + 24, file.size() - 24, path); });
      if (r == 0) continue;
      lp.push_back(p);
      ln.push_back(n);
      lc.push_back(c);
    }
    loads.push_back({mib, median(lp), median(ln), median(lc)});
    std::remove(path.c_str());
  }
  std::printf("\n## One load (file in the page cache; median of %d, ms)\n\n", rounds);
  std::printf(
      "| size | previous loader | TorchCheckpointIO::load | ratio | of which the archive check "
      "|\n|---|---:|---:|---:|---:|\n");
  for (const auto& l : loads) {
    std::printf("| %lld MiB | %.1f | %.1f | %.2fx | %.2f |\n", static_cast<long long>(l.mib),
                l.previous, l.now, l.previous / l.now, l.check);
  }
}

class Mlp : public volt::Module {
 public:
  Mlp() {
    net = register_module("net",
                          torch::nn::Sequential(torch::nn::Linear(1024, 2048), torch::nn::ReLU(),
                                                torch::nn::Linear(2048, 2048), torch::nn::ReLU(),
                                                torch::nn::Linear(2048, 2048), torch::nn::ReLU(),
                                                torch::nn::Linear(2048, 10)));
  }
  torch::Tensor training_step(const volt::Batch& b, int64_t) override {
    return torch::cross_entropy_loss(net->forward(b.input), b.target);
  }
  std::vector<volt::OptimizerConfig> configure_optimizers() override {
    return {volt::OptimizerConfig(
        std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(1e-4)))};
  }
  torch::nn::Sequential net{nullptr};
};

// Wall seconds of one fit and, with an AsyncCheckpointIO, the seconds its save() calls kept the
// training thread (serialising, waiting for max_pending).
struct FitTime {
  double total = 0, caller = 0;
};

FitTime fit_seconds(const std::string& root, int mode, int64_t steps, int64_t every) {
  torch::manual_seed(0);
  Mlp model;
  auto x = torch::randn({steps * 32, 1024});
  auto y = torch::randint(0, 10, {steps * 32});
  volt::DataLoader loader(std::make_shared<volt::TensorDataset>(x, y),
                          volt::DataLoaderOptions(32).shuffle(false));
  auto opts = volt::TrainerOptions()
                  .accelerator("cpu")
                  .default_root_dir(root)
                  .max_steps(steps)
                  .enable_progress_bar(false)
                  .enable_checkpointing(false)
                  .logger(false);
  if (mode > 0) {
    opts.callbacks({std::make_shared<volt::ModelCheckpoint>(volt::ModelCheckpointOptions()
                                                                .dirpath(root + "/ckpt")
                                                                .every_n_train_steps(every)
                                                                .save_top_k(-1))});
  }
  std::shared_ptr<volt::AsyncCheckpointIO> async;
  if (mode >= 2) {
    async = std::make_shared<volt::AsyncCheckpointIO>(
        volt::AsyncCheckpointIOOptions().reuse_buffer(mode == 2));
    opts.checkpoint_io(async);
  }
  volt::Trainer trainer(opts);
  const double ms = time_ms([&] { trainer.fit(model, loader); });
  volt_bench::remove_dir(root + "/ckpt");
  return {ms / 1000, async ? async->stats().caller_seconds : 0.0};
}

void fit_rows(const std::string& dir, int rounds) {
  const int64_t steps = 60, every = 10;
  std::printf("\n## Trainer.fit, %lld steps, a checkpoint every %lld (median of %d, s)\n\n",
              static_cast<long long>(steps), static_cast<long long>(every), rounds);
  const char* names[] = {"no checkpoints", "TorchCheckpointIO", "AsyncCheckpointIO",
                         "AsyncCheckpointIO, reuse_buffer=false"};
  std::vector<double> t[4], caller[4];
  const std::string root = dir + "/volt_bench_ckpt_fit";
  for (int r = 0; r < rounds; ++r) {
    for (int mode = 0; mode < 4; ++mode) {
      const FitTime f = fit_seconds(root, mode, steps, every);
      t[mode].push_back(f.total);
      caller[mode].push_back(f.caller);
    }
  }
  std::printf(
      "| checkpointing | fit (s) | cost of the %lld saves (s) | save() on the training "
      "thread (s) |\n|---|---:|---:|---:|\n",
      static_cast<long long>(steps / every));
  for (int mode = 0; mode < 4; ++mode) {
    std::printf("| %s | %.2f | %.2f | %s |\n", names[mode], median(t[mode]),
                median(t[mode]) - median(t[0]),
                mode >= 2 ? std::to_string(median(caller[mode])).substr(0, 4).c_str() : "");
  }
  volt_bench::remove_dir(root);
}

}  // namespace

int main(int argc, char** argv) {
  volt_bench::same_host_malloc_for_every_contender();
  std::string dir = "/tmp";
  int rounds = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--dir") {
      dir = argv[i + 1];
    } else if (a == "--rounds") {
      rounds = std::max(1, std::atoi(argv[i + 1]));
    } else {
      std::fprintf(stderr, "usage: volt_bench_checkpoint_io [--dir PATH] [--rounds N]\n");
      return 2;
    }
  }
  volt::set_log_sink([](volt::LogLevel, const std::string&) {});
  std::printf("# volt_bench_checkpoint_io: checkpoints written to %s\n", dir.c_str());
  save_archive_rows(dir, rounds);
  fit_rows(dir, rounds);
  return 0;
}
