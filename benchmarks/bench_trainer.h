#pragma once
// The Trainer every fit benchmark times: the same switches as the Lightning Trainer of the Python
// side (cuda_loop.py, gpt2.py): no logger, checkpoints, progress bar, model summary or sanity
// validation, so both sides time training alone.

#include <cstdint>
#include <string>

#include <volt/volt.h>

namespace volt_bench {

inline volt::TrainerOptions bench_trainer(const std::string& accelerator, int64_t max_steps) {
  return volt::TrainerOptions()
      .accelerator(accelerator)
      .max_steps(max_steps)
      .logger(false)
      .enable_checkpointing(false)
      .enable_progress_bar(false)
      .enable_model_summary(false)
      .num_sanity_val_steps(0);
}

}  // namespace volt_bench
