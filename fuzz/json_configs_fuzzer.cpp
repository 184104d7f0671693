// libFuzzer target: the JSON configs a user hands volt besides the YAML config.
//   - DeepSpeed JSON (`DeepSpeedStrategyOptions::config`, `--trainer.strategy.init_args.config`):
//     parse_deepspeed_config, then what DeepSpeedStrategy does with an accepted config:
//     resolve_deepspeed_batch at a world size of 1-8, and the optimizer and scheduler the JSON
//     names, built over two parameters and stepped three times.
//   - The fp8 quantization config (QUANT_CONFIG): QuantConfig::parse.
// Bad input must end in a ConfigError (or NotAvailable, for a known option volt does not
// build, such as partition_activations); anything else (another exception, a crash, a sanitizer
// report: UBSan aborts on a float-to-integer overflow or a signed overflow) is a finding. An
// accepted scheduler must give finite learning rates.
//
// Input: byte 0 picks the parser (even: DeepSpeed, odd: quantization config) and, for DeepSpeed,
// the world size ((byte0 / 2) % 8 + 1); the rest is the JSON text.

#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "volt/core/errors.h"
#include "volt/core/log.h"
#include "volt/optim/lr_scheduler.h"
#include "volt/precision/fp8_inference.h"
#include "volt/strategies/deepspeed_config.h"

namespace {

void deepspeed(const std::string& text, int64_t world_size) {
  const volt::DeepSpeedConfig cfg = volt::parse_deepspeed_config(text, "fuzz.json");
  const auto batch = volt::resolve_deepspeed_batch(cfg, world_size, 1);
  if (batch) {
    volt_fuzz::trace("batch " + std::to_string(batch->train_batch_size) + " = " +
                     std::to_string(batch->micro_batch_size) + " x " +
                     std::to_string(batch->accumulation) + " x " + std::to_string(world_size));
  }
  std::vector<at::Tensor> params = {torch::ones({3}, torch::requires_grad()),
                                    torch::ones({2, 2}, torch::requires_grad())};
  auto optimizer = volt::make_deepspeed_optimizer(cfg, params);
  if (!optimizer) return;
  auto scheduler = volt::make_deepspeed_scheduler(cfg, *optimizer);
  for (int step = 0; step < 3; ++step) {
    for (auto& p : params) p.mutable_grad() = torch::full_like(p, 0.5);
    optimizer->step();
    if (scheduler) scheduler->step();
    for (const auto& g : optimizer->param_groups()) {
      const double lr = g.options().get_lr();
      if (!std::isfinite(lr)) {
        volt_fuzz::finding("an accepted DeepSpeed scheduler gave the learning rate " +
                           std::to_string(lr) + " at step " + std::to_string(step) + ":\n" + text);
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const bool quiet = [] {
    volt::set_log_sink([](volt::LogLevel, const std::string&) {});  // warnings about ignored keys
    return true;
  }();
  (void)quiet;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    if (data[0] % 2 == 0) {
      deepspeed(text, (data[0] / 2) % 8 + 1);
    } else {
      volt::QuantConfig::parse(text, "fuzz.json");
    }
  } catch (const volt::ConfigError& e) {
    volt_fuzz::trace(std::string("refused: ") + e.what());
    return 0;
  } catch (const volt::NotAvailable& e) {
    volt_fuzz::trace(std::string("not available: ") + e.what());
    return 0;
  } catch (const std::exception& e) {
    volt_fuzz::finding(std::string("a JSON config let a non-ConfigError escape: ") + e.what());
  }
  volt_fuzz::trace("accepted");
  return 0;
}
