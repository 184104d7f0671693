// Registers the tuner callbacks (LearningRateFinder, BatchSizeFinder); called once from
// registry() (src/trainer/builtins.cpp).
#include "volt/core/registry.h"
#include "volt/tuner/callbacks.h"

namespace volt::detail {

void register_tuner_callbacks(Registry& r) {
  const LrFinderOptions lf;
  r.callbacks.add(
      "LearningRateFinder",
      "runs the learning-rate range test when fit starts and trains at the suggested rate",
      Params()
          .add("min_lr", lf.min_lr(), "the first rate tried")
          .add("max_lr", lf.max_lr(), "the rate of the last step")
          .add("num_training_steps", lf.num_training(), "optimizer steps (rates) to try")
          .choice("mode", "exponential", {"exponential", "linear"}, "how the rate grows")
          .add("early_stop_threshold", *lf.early_stop_threshold(),
               "stop once the smoothed loss exceeds this many times the best; 0 = never")
          .add("update_attr", true, "train at the suggested rate (else only report it)"),
      [](const Args& a) -> std::shared_ptr<Callback> {
        LrFinderOptions o;
        o.min_lr(a.get<double>("min_lr"))
            .max_lr(a.get<double>("max_lr"))
            .num_training(a.get<int64_t>("num_training_steps"))
            .mode(a.get<std::string>("mode") == "linear" ? LrFinderMode::kLinear
                                                         : LrFinderMode::kExponential);
        const double threshold = a.get<double>("early_stop_threshold");
        o.early_stop_threshold(threshold == 0 ? c10::nullopt : c10::optional<double>(threshold));
        return std::make_shared<LearningRateFinder>(o, a.get<bool>("update_attr"));
      });

  const BatchSizeFinderOptions bs;
  r.callbacks.add(
      "BatchSizeFinder",
      "searches for the largest batch size that fits when an entry point starts and sets it on "
      "the DataModule",
      Params()
          .choice("mode", "power", {"power", "binsearch"},
                  "double until out of memory (power), then bisect (binsearch)")
          .add("steps_per_trial", bs.steps_per_trial(), "steps or batches each trial runs")
          .add("init_val", bs.init_val(), "the first batch size tried")
          .add("max_trials", bs.max_trials(), "the most trials")
          .add("margin", bs.margin(), "binsearch: the size found is reduced by this fraction")
          .add("max_val", *bs.max_val(), "no size above this is tried; 0 = no cap")
          .optional<int64_t>("max_memory_bytes",
                             "CPU: bytes a trial may allocate beyond what is alive when it "
                             "starts (a budget standing in for a full device)"),
      [](const Args& a) -> std::shared_ptr<Callback> {
        BatchSizeFinderOptions o;
        o.mode(a.get<std::string>("mode") == "binsearch" ? BatchSizeScaling::kBinsearch
                                                         : BatchSizeScaling::kPower)
            .steps_per_trial(a.get<int64_t>("steps_per_trial"))
            .init_val(a.get<int64_t>("init_val"))
            .max_trials(a.get<int64_t>("max_trials"))
            .margin(a.get<double>("margin"));
        const int64_t max_val = a.get<int64_t>("max_val");
        o.max_val(max_val == 0 ? c10::nullopt : c10::optional<int64_t>(max_val));
        if (auto m = a.get_optional<int64_t>("max_memory_bytes")) o.max_memory_bytes(*m);
        return std::make_shared<BatchSizeFinder>(o);
      });
}

}  // namespace volt::detail
