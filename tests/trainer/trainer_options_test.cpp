#include <gtest/gtest.h>

#include <sstream>

#include <volt/volt.h>

#include "error_text.h"

namespace {

template <typename F>
std::string config_error(F&& make) {
  return volt_test::error_of<volt::ConfigError>(make);
}

TEST(TrainerOptions, RejectsInvalidValues) {
  using O = volt::TrainerOptions;
  EXPECT_NE(config_error([] { O().max_epochs(-5).validate(); }).find("max_epochs=-5"),
            std::string::npos);
  EXPECT_NE(
      config_error([] { O().limit_train_batches(1.5).validate(); }).find("limit_train_batches=1.5"),
      std::string::npos);
  EXPECT_NE(config_error([] {
              O().accumulate_grad_batches(0).validate();
            }).find("accumulate_grad_batches=0"),
            std::string::npos);
  EXPECT_NE(config_error([] { O().min_epochs(5).max_epochs(2).validate(); }).find("min_epochs=5"),
            std::string::npos);
  EXPECT_NE(config_error([] { O().gradient_clip_val(-1.0).validate(); }).find("gradient_clip_val"),
            std::string::npos);
  EXPECT_NE(config_error([] { O().val_check_interval(0).validate(); }).find("val_check_interval"),
            std::string::npos);
  EXPECT_NE(config_error([] { O().max_time(-3.0).validate(); }).find("max_time"),
            std::string::npos);
  EXPECT_NE(config_error([] { O().log_every_n_steps(0).validate(); }).find("log_every_n_steps"),
            std::string::npos);
  // OpenMP would start them all: 1e5 threads hung the CLI, 1e11 aborted in libgomp.
  EXPECT_NE(config_error([] {
              O().num_threads(100000).validate();
            }).find("num_threads=100000 is more than 1024 threads"),
            std::string::npos);
  EXPECT_NO_THROW(O().num_threads(1024).validate());
}

TEST(TrainerOptions, TrainerConstructorValidates) {
  EXPECT_THROW(volt::Trainer(volt::TrainerOptions().max_epochs(-2)), volt::ConfigError);
  EXPECT_THROW(volt::Trainer(volt::TrainerOptions().accelerator("quantum")), volt::ConfigError);
  EXPECT_THROW(volt::Trainer(volt::TrainerOptions().limit_val_batches(2.0)), volt::ConfigError);
}

TEST(TrainerOptions, PrintsFullConfig) {
  std::ostringstream os;
  os << volt::TrainerOptions().max_epochs(3).limit_train_batches(0.5);
  const std::string s = os.str();
  EXPECT_NE(s.find("max_epochs=3"), std::string::npos) << s;
  EXPECT_NE(s.find("limit_train_batches=0.5"), std::string::npos) << s;
  EXPECT_NE(s.find("accelerator=\"auto\""), std::string::npos) << s;
  for (const char* part :
       {"max_time=none", "gradient_clip_val=none", "seed=none", "default_root_dir=\".\"",
        "reuse_host_memory=1", "progress_refresh_s=0.5", "profiler=none",
        "checkpoint_io=strategy's)"}) {
    EXPECT_NE(s.find(part), std::string::npos) << part << " in " << s;
  }
  os.str("");
  os << volt::TrainerOptions().seed(7).gradient_clip_val(0.5).max_time(60.0).checkpoint_io(
      std::make_shared<volt::AsyncCheckpointIO>());
  for (const char* part : {"max_time=60", "gradient_clip_val=0.5", "seed=7", "checkpoint_io=set"}) {
    EXPECT_NE(os.str().find(part), std::string::npos) << part << " in " << os.str();
  }
}

}  // namespace
