// The DeepSpeed JSON config: parsing (the reference's BF16-Optimizer example, unknown and
// ignored keys, wrong types), DeepSpeed's batch arithmetic, the optimizer and the WarmupLR /
// WarmupDecayLR schedules it names (values worked out from DeepSpeed's formulas), and a 2-rank
// job configured by JSON alone equal to one process.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "requires.h"
#include "tiny.h"
#include "training_jobs.h"
#include "volt/strategies/deepspeed_config.h"

namespace {

using volt::ConfigError;

// The reference's "BF16-Optimizer" configuration (000, "DeepSpeed Configurations").
const char* kReference = R"({
    "train_batch_size": 8,
    "bf16": {"enabled": true},
    "fp16": {"enabled": false},
    "train_micro_batch_size_per_gpu": 2,
    "scheduler": {"type": "WarmupDecayLR",
                  "params": {"warmup_min_lr": 0.02, "warmup_max_lr": 0.05,
                             "warmup_num_steps": 4, "total_num_steps": 8,
                             "warmup_type": "linear"}},
    "zero_allow_untested_optimizer": true,
    "zero_optimization": {"stage": 2}
})";

std::string error_of(const std::string& json) {
  try {
    volt::parse_deepspeed_config(json, "test.json");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(DeepSpeedConfig, ReadsTheReferencesBf16OptimizerExample) {
  const auto c = volt::parse_deepspeed_config(kReference, "ref.json");
  EXPECT_EQ(c.train_batch_size.value_or(-1), 8);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu.value_or(-1), 2);
  EXPECT_FALSE(c.gradient_accumulation_steps.has_value());
  EXPECT_TRUE(c.bf16);
  EXPECT_FALSE(c.fp16);
  EXPECT_TRUE(c.zero);
  EXPECT_EQ(c.stage, 2);
  EXPECT_EQ(c.scheduler_type, "WarmupDecayLR");
  EXPECT_EQ(c.warmup_type, "linear");
  EXPECT_DOUBLE_EQ(c.scheduler_params.at("warmup_max_lr"), 0.05);
  EXPECT_TRUE(c.zero_allow_untested_optimizer.value_or(false));
  EXPECT_TRUE(c.ignored.empty());
}

TEST(DeepSpeedConfig, AnUnknownKeyNamesTheClosestValidOne) {
  const std::string e = error_of(R"({"train_micro_batch_size_per_gpus": 2})");
  EXPECT_NE(e.find("\"train_micro_batch_size_per_gpus\" is not a DeepSpeed key"), std::string::npos)
      << e;
  EXPECT_NE(e.find("did you mean \"train_micro_batch_size_per_gpu\""), std::string::npos) << e;
  const std::string z = error_of(R"({"zero_optimization": {"stgae": 2}})");
  EXPECT_NE(z.find("zero_optimization.stgae"), std::string::npos) << z;
  EXPECT_NE(z.find("\"stage\""), std::string::npos) << z;
}

TEST(DeepSpeedConfig, KnownButUnsupportedKeysAreListedAsIgnored) {
  const auto c = volt::parse_deepspeed_config(
      R"({"steps_per_print": 10, "wall_clock_breakdown": false,
          "zero_optimization": {"stage": 1, "round_robin_gradients": true},
          "fp16": {"enabled": false, "auto_cast": false}, "bf16": {"loss_scale": 0}})",
      "x.json");
  EXPECT_EQ(c.ignored, (std::vector<std::string>{"steps_per_print", "wall_clock_breakdown",
                                                 "bf16.loss_scale", "fp16.auto_cast",
                                                 "zero_optimization.round_robin_gradients"}));
}

TEST(DeepSpeedConfig, Fp16LossScalingKeysAreReadAndChecked) {
  const auto c = volt::parse_deepspeed_config(
      R"({"fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12,
                   "loss_scale_window": 500, "hysteresis": 4, "consecutive_hysteresis": true,
                   "min_loss_scale": 0.25}})",
      "fp16.json");
  EXPECT_TRUE(c.fp16);
  EXPECT_TRUE(c.ignored.empty());
  EXPECT_EQ(c.loss_scale.value_or(-1), 0.0);
  EXPECT_EQ(c.initial_scale_power.value_or(-1), 12);
  EXPECT_EQ(c.loss_scale_window.value_or(-1), 500);
  EXPECT_EQ(c.hysteresis.value_or(-1), 4);
  EXPECT_TRUE(c.consecutive_hysteresis.value_or(false));
  EXPECT_EQ(c.min_loss_scale.value_or(-1), 0.25);
  // Absent keys stay unset (DeepSpeed's defaults apply in the strategy).
  const auto d = volt::parse_deepspeed_config(R"({"fp16": {"enabled": true}})", "d.json");
  EXPECT_FALSE(d.loss_scale || d.initial_scale_power || d.loss_scale_window || d.hysteresis ||
               d.consecutive_hysteresis || d.min_loss_scale);
  auto has = [](const std::string& json, const std::string& phrase) {
    const std::string e = error_of(json);
    EXPECT_NE(e.find(phrase), std::string::npos) << json << " gave: " << e;
  };
  has(R"({"fp16": {"loss_scale": -1}})", "\"fp16.loss_scale\" must be >= 0");
  has(R"({"fp16": {"loss_scale": "big"}})", "\"fp16.loss_scale\" must be a number");
  has(R"({"fp16": {"initial_scale_power": 128}})", "use at most 127");
  has(R"({"fp16": {"initial_scale_power": -1}})", "initial_scale_power\" must be >= 0");
  has(R"({"fp16": {"loss_scale_window": 0}})", "loss_scale_window\" must be >= 1");
  has(R"({"fp16": {"hysteresis": 0}})", "fp16.hysteresis\" must be >= 1");
  has(R"({"fp16": {"consecutive_hysteresis": 1}})", "must be true or false");
  has(R"({"fp16": {"min_loss_scale": 0}})", "\"fp16.min_loss_scale\" must be > 0");
  has(R"({"fp16": {"min_los_scale": 1}})", "did you mean \"min_loss_scale\"");
}

TEST(DeepSpeedConfig, IgnoreUnusedParametersIsReadNotIgnored) {
  EXPECT_FALSE(volt::parse_deepspeed_config("{}", "a.json").ignore_unused_parameters.has_value());
  const auto c = volt::parse_deepspeed_config(
      R"({"zero_optimization": {"stage": 2, "ignore_unused_parameters": false}})", "b.json");
  ASSERT_TRUE(c.ignore_unused_parameters.has_value());
  EXPECT_FALSE(*c.ignore_unused_parameters);
  EXPECT_TRUE(c.ignored.empty());
  EXPECT_NE(error_of(R"({"zero_optimization": {"ignore_unused_parameters": "no"}})")
                .find("\"zero_optimization.ignore_unused_parameters\" must be true or false"),
            std::string::npos);
}

TEST(DeepSpeedConfig, ActivationCheckpointingSection) {
  const auto c = volt::parse_deepspeed_config(
      R"({"activation_checkpointing": {"cpu_checkpointing": true, "partition_activations": false,
          "contiguous_memory_optimization": false, "number_checkpoints": 4,
          "synchronize_checkpoint_boundary": true, "profile": false}})",
      "a.json");
  EXPECT_TRUE(c.cpu_checkpointing);
  EXPECT_EQ(c.ignored,
            (std::vector<std::string>{"activation_checkpointing.number_checkpoints",
                                      "activation_checkpointing.profile",
                                      "activation_checkpointing.synchronize_checkpoint_boundary"}));
  EXPECT_FALSE(volt::parse_deepspeed_config("{}", "b.json").cpu_checkpointing);
  const std::string typo = error_of(R"({"activation_checkpointing": {"cpu_checkpoint": true}})");
  EXPECT_NE(typo.find("activation_checkpointing.cpu_checkpoint\" is not a DeepSpeed key"),
            std::string::npos)
      << typo;
  EXPECT_NE(typo.find("did you mean \"cpu_checkpointing\""), std::string::npos) << typo;
  EXPECT_NE(error_of(R"({"activation_checkpointing": {"cpu_checkpointing": "yes"}})")
                .find("\"activation_checkpointing.cpu_checkpointing\" must be true or false"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"activation_checkpointing": {"number_checkpoints": "four"}})")
                .find("\"activation_checkpointing.number_checkpoints\" must be an integer"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"activation_checkpointing": true})").find("must be a JSON object"),
            std::string::npos);
  for (const char* key : {"partition_activations", "contiguous_memory_optimization"}) {
    try {
      volt::parse_deepspeed_config(
          std::string(R"({"activation_checkpointing": {")") + key + R"(": true}})", "c.json");
      ADD_FAILURE() << key << " accepted";
    } catch (const volt::NotAvailable& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("activation_checkpointing.") + key),
                std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("set it to false"), std::string::npos) << e.what();
    }
  }
}

TEST(DeepSpeedConfig, WrongTypesAndValuesAreConfigErrorsNamingTheKey) {
  EXPECT_NE(
      error_of(R"({"train_batch_size": "eight"})").find("\"train_batch_size\" must be an integer"),
      std::string::npos);
  EXPECT_NE(error_of(R"({"train_batch_size": 0})").find("must be >= 1"), std::string::npos);
  EXPECT_NE(
      error_of(R"({"bf16": {"enabled": "yes"}})").find("bf16.enabled\" must be true or false"),
      std::string::npos);
  EXPECT_NE(error_of(R"({"zero_optimization": {"stage": 5}})").find("use 0, 1, 2 or 3"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"zero_optimization": {"offload_optimizer": {"device": "disk"}}})")
                .find("use \"none\", \"cpu\" or \"nvme\""),
            std::string::npos);
  EXPECT_NE(error_of(R"({"optimizer": {"type": "Adamm"}})").find("did you mean \"Adam\""),
            std::string::npos);
  EXPECT_NE(error_of(R"({"scheduler": {"type": "WarmupDecayLR", "params": {}}})")
                .find("total_num_steps\" is required"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"bf16": {"enabled": true}, "fp16": {"enabled": true}})").find("both"),
            std::string::npos);
  EXPECT_NE(error_of("{not json").find("test.json"), std::string::npos);
  EXPECT_NE(error_of("[1, 2]").find("must be a JSON object"), std::string::npos);
}

// Numbers a JSON file can hold but volt's types cannot: each is a ConfigError naming the key, not
// an undefined float-to-integer cast, a wrapped unsigned value, an overflowing product or
// libtorch's own c10::Error.
TEST(DeepSpeedConfig, OutOfRangeNumbersAreConfigErrorsNamingTheKey) {
  auto has = [](const std::string& json, const std::string& phrase) {
    const std::string e = error_of(json);
    EXPECT_NE(e.find(phrase), std::string::npos) << json << " gave: " << e;
  };
  has(R"({"train_batch_size": 1e300})", "\"train_batch_size\" is outside the 64-bit integer range");
  has(R"({"train_batch_size": 9223372036854775808})",
      "\"train_batch_size\" is outside the 64-bit integer range");
  has(R"({"train_batch_size": 18446744073709551615})",
      "\"train_batch_size\" is outside the 64-bit integer range");
  has(R"({"zero_optimization": {"sub_group_size": -1e30}})",
      "sub_group_size\" is outside the 64-bit integer range");
  has(R"({"gradient_clipping": 1e400})",
      "malformed JSON ([json.exception.out_of_range.406] number overflow");
  has(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 1e300}}})",
      "warmup_num_steps\" is outside the 64-bit integer range");
  has(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 1e17}}})",
      "warmup_num_steps\" is too large: at most 2^53");
  has(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 2.5}}})",
      "warmup_num_steps\" must be an integer");
  has(R"({"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": -3}}})",
      "total_num_steps\" must be >= 0");
  // The largest integer a double holds exactly still parses, as a 64-bit size.
  EXPECT_EQ(volt::parse_deepspeed_config(R"({"train_batch_size": 9.2233720368547748e18})", "a")
                .train_batch_size.value_or(0),
            int64_t{9223372036854774784});

  // Batch arithmetic that overflows int64.
  auto huge = volt::parse_deepspeed_config(
      R"({"train_micro_batch_size_per_gpu": 4611686018427387904})", "b.json");
  try {
    volt::resolve_deepspeed_batch(huge, 4, 1);
    FAIL() << "2^62 x 4 was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("overflows a 64-bit integer"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(volt::resolve_deepspeed_batch(huge, 1, int64_t{1} << 62), ConfigError);

  // torch::optim::SGD's own checks, as ConfigErrors naming the key.
  auto p = torch::zeros({3}, torch::requires_grad());
  auto sgd_error = [&](const std::string& params) -> std::string {
    try {
      volt::make_deepspeed_optimizer(
          volt::parse_deepspeed_config(
              R"({"optimizer": {"type": "SGD", "params": )" + params + "}}", "c.json"),
          {p});
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "accepted";
  };
  EXPECT_NE(sgd_error(R"({"lr": -0.1})").find("\"optimizer.params.lr\" -0.1 must be >= 0"),
            std::string::npos);
  EXPECT_NE(sgd_error(R"({"momentum": -1})").find("optimizer.params.momentum"), std::string::npos);
  EXPECT_NE(sgd_error(R"({"weight_decay": -1})").find("optimizer.params.weight_decay"),
            std::string::npos);
  EXPECT_NE(sgd_error(R"({"nesterov": true})").find("needs momentum > 0 and dampening 0"),
            std::string::npos);
  EXPECT_EQ(sgd_error(R"({"nesterov": true, "momentum": 0.9})"), "accepted");
}

TEST(DeepSpeedConfig, LoadsAFileOrInlineJsonAndAMissingFileIsAnError) {
  volt_test::TempDir dir;
  std::ofstream(dir / "ds.json") << kReference;
  EXPECT_EQ(volt::load_deepspeed_config(dir / "ds.json").stage, 2);
  EXPECT_EQ(volt::load_deepspeed_config(R"(  {"zero_optimization": {"stage": 1}})").stage, 1);
  EXPECT_THROW(volt::load_deepspeed_config(dir / "missing.json"), ConfigError);
}

TEST(DeepSpeedConfig, BatchSizesFollowDeepSpeedsArithmetic) {
  auto c = volt::parse_deepspeed_config(kReference, "ref.json");
  // 8 = 2 x 2 x 2.
  auto b = volt::resolve_deepspeed_batch(c, 2, 2);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->micro_batch_size, 2);
  try {
    volt::resolve_deepspeed_batch(c, 4, 2);  // 2 x 2 x 4 = 16 != 8
    FAIL() << "8 != 2 x 2 x 4 was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("must equal train_micro_batch_size_per_gpu (2) x "
                                         "gradient accumulation (2) x world size (4) = 16"),
              std::string::npos)
        << e.what();
  }
  c.train_micro_batch_size_per_gpu.reset();  // derived: 8 / (2 x 2)
  EXPECT_EQ(volt::resolve_deepspeed_batch(c, 2, 2)->micro_batch_size, 2);
  EXPECT_THROW(volt::resolve_deepspeed_batch(c, 3, 2), ConfigError);  // 8 % 6
  c.gradient_accumulation_steps = 4;                                  // contradicts the Trainer's 2
  EXPECT_THROW(volt::resolve_deepspeed_batch(c, 2, 2), ConfigError);
  volt::DeepSpeedConfig none;
  EXPECT_FALSE(volt::resolve_deepspeed_batch(none, 2, 1).has_value());
}

TEST(DeepSpeedConfig, AdamIsAdamWModeFusedAdamWAndSgdIsSgd) {
  auto p = torch::zeros({3}, torch::requires_grad());
  auto adam = volt::parse_deepspeed_config(
      R"({"optimizer": {"type": "Adam", "params": {"lr": 0.005, "betas": [0.8, 0.9],
           "eps": 1e-6, "weight_decay": 0.1}}})",
      "a.json");
  auto opt = volt::make_deepspeed_optimizer(adam, {p});
  auto* fused = dynamic_cast<volt::FusedAdamW*>(opt.get());
  ASSERT_NE(fused, nullptr);
  const auto& o = static_cast<const volt::FusedAdamWOptions&>(fused->defaults());
  EXPECT_DOUBLE_EQ(o.lr(), 0.005);
  EXPECT_DOUBLE_EQ(std::get<0>(o.betas()), 0.8);
  EXPECT_DOUBLE_EQ(o.eps(), 1e-6);
  EXPECT_TRUE(o.adam_w_mode());
  adam.optimizer_params["adam_w_mode"] = {0.0};
  auto plain = volt::make_deepspeed_optimizer(adam, {p});
  EXPECT_FALSE(static_cast<const volt::FusedAdamWOptions&>(plain->defaults()).adam_w_mode());
  auto sgd = volt::parse_deepspeed_config(
      R"({"optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}}})", "s.json");
  const auto sgd_opt = volt::make_deepspeed_optimizer(sgd, {p});  // kept: s points into it
  auto* s = dynamic_cast<torch::optim::SGD*>(sgd_opt.get());
  ASSERT_NE(s, nullptr);
  EXPECT_DOUBLE_EQ(static_cast<const torch::optim::SGDOptions&>(s->defaults()).momentum(), 0.9);
  EXPECT_EQ(volt::make_deepspeed_optimizer(volt::DeepSpeedConfig{}, {p}), nullptr);
}

std::vector<double> lrs_after_steps(const volt::DeepSpeedConfig& c, int steps) {
  auto p = torch::zeros({1}, torch::requires_grad());
  torch::optim::SGD opt({p}, torch::optim::SGDOptions(0.123));
  auto sched = volt::make_deepspeed_scheduler(c, opt);
  std::vector<double> out{opt.param_groups()[0].options().get_lr()};
  for (int i = 0; i < steps; ++i) {
    sched->step();
    out.push_back(opt.param_groups()[0].options().get_lr());
  }
  return out;
}

TEST(DeepSpeedConfig, WarmupDecayLRFollowsDeepSpeedsSchedule) {
  // The reference's linear WarmupDecayLR: min 0.02, max 0.05, 4 warmup steps, 0 at step 8.
  // After step k DeepSpeed's last_batch_iteration is k-1: gamma = it/4 while it < 4, then
  // (8 - it) / (8 - 4), never below 0. Construction sets warmup_min_lr, as DeepSpeed's
  // "Initialize lr in optimizer" (it left the optimizer's 0.123 for the first step).
  const auto got = lrs_after_steps(volt::parse_deepspeed_config(kReference, "ref.json"), 10);
  const std::vector<double> want{0.02,   0.02,  0.0275, 0.035, 0.0425, 0.05,
                                 0.0425, 0.035, 0.0275, 0.02,  0.02};
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-15) << "step " << i;
}

TEST(DeepSpeedConfig, WarmupLRLogRisesLikeLogThenStays) {
  const auto c = volt::parse_deepspeed_config(
      R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0,
          "warmup_max_lr": 1.0, "warmup_num_steps": 4}}})",
      "w.json");
  const auto got = lrs_after_steps(c, 6);
  // gamma = log(it + 1) / log(4): 0, 0.5, log 3 / log 4, then 1.
  const std::vector<double> want{0.0, 0.0, 0.5, std::log(3.0) / std::log(4.0), 1.0, 1.0, 1.0};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-15) << "step " << i;
}

// ------------------------------------------------------------------------- end to end

TEST(DeepSpeedConfig, ATwoRankJobConfiguredByJsonAloneEqualsOneProcess) {
  VOLT_REQUIRE_GLOO();
  // The module returns no optimizer: the JSON's AdamW (volt's FusedAdamW, lr 0.01, decay 0.01)
  // is built, ZeRO stage 1 partitions it, and the batch arithmetic 16 = 8 x 1 x 2 holds.
  volt_test::TempDir dir;
  const auto ref = volt_test::single_process_reference(dir.path, 16, 1, 1, false,
                                                       {"--optimizer", "fused_adamw"});
  const std::string json = R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 8,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
      "zero_optimization": {"stage": 1}, "steps_per_print": 100})";
  auto job =
      volt_test::run_job({"--root", dir.path, "--out", dir / "zero", "--devices", "2", "--batch",
                          "8", "--epochs", "1", "--optimizer", "none", "--ds-config", json});
  ASSERT_EQ(job.code, 0) << job.output;
  EXPECT_NE(job.output.find("ignored: steps_per_print"), std::string::npos) << job.output;
  volt_test::expect_ranks_equal_reference(dir / "zero", 2, ref);
  // A micro batch the loader does not produce stops the job before its first step.
  auto bad =
      volt_test::run_job({"--root", dir / "b", "--out", dir / "b/w", "--devices", "2", "--batch",
                          "4", "--epochs", "1", "--optimizer", "none", "--ds-config", json});
  EXPECT_EQ(bad.code, 1) << bad.output;
  EXPECT_NE(bad.output.find("train_micro_batch_size_per_gpu=8 but the training loader's batches "
                            "hold 4"),
            std::string::npos)
      << bad.output;
}

}  // namespace
