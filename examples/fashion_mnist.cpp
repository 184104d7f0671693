// Trains a CNN (or an MLP, or a small transformer using volt::fused_sdpa) on Fashion-MNIST with
// volt, prints the test accuracy and exports the best model as TorchScript.
//
//   volt_fashion_mnist [--model cnn|mlp|transformer] [--epochs N] [--batch-size B] [--lr LR]
//                      [--data DIR] [--out DIR] [--resume CKPT]

#include <cstdlib>
#include <iostream>
#include <string>

#include "models.h"

namespace {
void usage() {
  std::cerr
      << "usage: volt_fashion_mnist [--model cnn|mlp|transformer] [--epochs N] [--batch-size B] "
         "[--lr LR] [--data DIR] [--out DIR] [--resume CKPT]\n";
}
}  // namespace

int main(int argc, char** argv) {
  std::string model = "cnn", data = volt::kFashionMnistDefaultRoot, out = "runs/fashion_mnist",
              resume;
  int64_t epochs = -1, batch = 64;
  double lr = 1e-3;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        usage();
        std::exit(2);
      }
      return argv[++i];
    };
    try {
      if (a == "--model")
        model = next();
      else if (a == "--epochs")
        epochs = std::stoll(next());
      else if (a == "--batch-size")
        batch = std::stoll(next());
      else if (a == "--lr")
        lr = std::stod(next());
      else if (a == "--data")
        data = next();
      else if (a == "--out")
        out = next();
      else if (a == "--resume")
        resume = next();
      else if (a == "--help" || a == "-h") {
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
  if (model != "cnn" && model != "mlp" && model != "transformer") {
    std::cerr << "--model must be cnn, mlp or transformer, got '" << model << "'\n";
    return 2;
  }
  if (epochs < 0) epochs = model == "cnn" ? 4 : 8;
  try {
    volt_examples::FashionMnistData dm(data, batch, /*num_workers=*/1, /*seed=*/42);
    auto ckpt = std::make_shared<volt::ModelCheckpoint>(volt::ModelCheckpointOptions()
                                                            .monitor("val_acc")
                                                            .mode(volt::Mode::kMax)
                                                            .filename("{epoch}-{val_acc:.4f}")
                                                            .save_last(true));
    volt::Trainer trainer(
        volt::TrainerOptions().max_epochs(epochs).seed(42).default_root_dir(out).callbacks({ckpt}));
    std::unique_ptr<volt::Module> module;
    if (model == "cnn") {
      module = std::make_unique<volt_examples::Classifier<volt_examples::CnnNet>>(
          std::make_shared<volt_examples::CnnNet>(), lr, /*step_size=*/2);
    } else if (model == "transformer") {
      module = std::make_unique<volt_examples::Classifier<volt_examples::TransformerNet>>(
          std::make_shared<volt_examples::TransformerNet>(), lr, /*step_size=*/2);
    } else {
      module = std::make_unique<volt_examples::Classifier<volt_examples::MlpNet>>(
          std::make_shared<volt_examples::MlpNet>(std::vector<int64_t>{256, 128}), lr, 4);
    }
    const auto t0 = std::chrono::steady_clock::now();
    trainer.fit(*module, dm, resume);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    auto metrics = trainer.test(*module, dm, ckpt->best_model_path());
    // The best weights (test loaded them) as a TorchScript file for programs without volt:
    // torch::jit::load in C++, torch.jit.load in Python. Its forward(images) returns classes.
    const std::string exported = out + "/model.pt";
    volt::to_torchscript(*module, torch::zeros({1, 1, 28, 28}),
                         volt::TorchScriptOptions().file_path(exported));
    std::cout << "\n== volt Fashion-MNIST " << model << " ==\n"
              << "fit time:        " << secs << " s (" << epochs << " epochs)\n"
              << "test accuracy:   " << metrics["test_acc"] * 100 << " %  (best checkpoint)\n"
              << "test loss:       " << metrics["test_loss"] << "\n"
              << "best checkpoint: " << ckpt->best_model_path() << "\n"
              << "last checkpoint: " << ckpt->last_model_path() << "\n"
              << "TorchScript:     " << exported << "\n"
              << "CSV logs:        " << trainer.log_dir() << "/metrics.csv\n";
    return 0;
  } catch (const volt::Error& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
}
