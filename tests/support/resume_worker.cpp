// A training process for the kill-and-resume test. It writes a checkpoint after every batch
// (mid-accumulation included), prints "batch <n>" once that checkpoint is on disk, and at the
// end saves the flattened parameters to --out.
//
//   volt_resume_worker --root DIR --out FILE [--resume CKPT] [--accum K] [--epochs E]
//                      [--wait-at N] [--accelerator cpu|cuda (then deterministic)]

#include <cstdio>
#include <string>

#include "tiny.h"

namespace {

class EveryBatchCheckpoint : public volt::Callback {
 public:
  EveryBatchCheckpoint(std::string path, int64_t wait_at)
      : path_(std::move(path)), wait_at_(wait_at) {}
  std::string state_key() const override { return "EveryBatchCheckpoint"; }
  void on_train_batch_end(volt::RunContext& run, volt::Module&, const volt::Batch&,
                          int64_t) override {
    run.save_checkpoint(path_);
    std::printf("batch %lld\n", static_cast<long long>(run.state().total_batches_done));
    std::fflush(stdout);
    // Block on stdin (the test never writes to it) so the SIGKILL lands at a known batch.
    if (run.state().total_batches_done == wait_at_) std::fgetc(stdin);
  }

 private:
  std::string path_;
  int64_t wait_at_;
};

}  // namespace

int main(int argc, char** argv) {
  std::string root, out, resume, accelerator = "cpu";
  int64_t accum = 3, epochs = 3, wait_at = -1;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--root")
      root = v;
    else if (k == "--out")
      out = v;
    else if (k == "--resume")
      resume = v;
    else if (k == "--accum")
      accum = std::stoll(v);
    else if (k == "--epochs")
      epochs = std::stoll(v);
    else if (k == "--wait-at")
      wait_at = std::stoll(v);
    else if (k == "--accelerator")
      accelerator = v;
  }
  if (root.empty() || out.empty()) {
    std::fprintf(stderr, "usage: volt_resume_worker --root DIR --out FILE [--resume CKPT]\n");
    return 2;
  }
  try {
    // Seed before building the model: libtorch seeds its generator randomly at start-up.
    volt::seed_everything(123);
    volt_test::TinyClassifier model(8, 0.05, /*adam=*/true);
    model.scheduler_step_size = 2;
    model.scheduler_interval = volt::Interval::kStep;
    auto data = volt_test::blobs(200, 8, 1);
    auto val = volt_test::blobs(64, 8, 2);
    volt::Trainer trainer(
        volt_test::quiet(root)
            .accelerator(accelerator)
            .deterministic(accelerator != "cpu")
            .max_epochs(epochs)
            .accumulate_grad_batches(accum)
            .val_check_interval(0.5)
            .logger(true)
            .callbacks({std::make_shared<EveryBatchCheckpoint>(root + "/last.ckpt", wait_at)}));
    trainer.fit(model, volt_test::loader(data, 16, true, /*workers=*/1),
                volt_test::loader(val, 32, false), resume);
    torch::save(model.flat_params().cpu(), out);
    std::printf("done step=%lld checksum=%.17g\n",
                static_cast<long long>(trainer.state().global_step),
                model.flat_params().abs().sum().item<double>());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
