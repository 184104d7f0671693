#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "build_paths.h"
#include "tiny.h"

// volt's schedulers against the lr sequences torch.optim.lr_scheduler produces
// (tools/lr_scheduler_reference.py, checked in as tests/optim/data/lr_scheduler_reference.json).

namespace {

using json = nlohmann::json;
using SchedulerPtr = std::shared_ptr<volt::LRScheduler>;
using OptimizerPtr = std::shared_ptr<torch::optim::Optimizer>;

// Largest relative error allowed against PyTorch's fp64 values.
constexpr double kTolerance = 1e-12;

const json& reference() {
  static const json doc = [] {
    const std::string path =
        volt_test::source_dir() + "/tests/optim/data/lr_scheduler_reference.json";
    std::ifstream f(path);
    EXPECT_TRUE(f.good()) << "missing " << path << "; run tools/lr_scheduler_reference.py";
    return json::parse(f);
  }();
  return doc;
}

// The LambdaLR factors of tools/lr_scheduler_reference.py, same operations.
std::function<double(int64_t)> named_lambda(const std::string& name) {
  if (name == "pow095") return [](int64_t e) { return std::pow(0.95, static_cast<double>(e)); };
  if (name == "warmup10_inv_sqrt") {
    return [](int64_t e) {
      return std::min(static_cast<double>(e + 1) / 10,
                      1 / std::sqrt(static_cast<double>(std::max<int64_t>(e, 1))));
    };
  }
  if (name == "halve_every_7") {
    return [](int64_t e) { return std::pow(0.5, static_cast<double>(e / 7)); };
  }
  if (name == "const095") return [](int64_t) { return 0.95; };
  ADD_FAILURE() << "unknown lambda " << name;
  return [](int64_t) { return 1.0; };
}

// The CyclicLR scale functions of tools/lr_scheduler_reference.py.
std::function<double(double)> named_scale_fn(const std::string& name) {
  if (name == "inv_sqrt") return [](double x) { return 1 / std::sqrt(x); };
  if (name == "inv_linear_0.02") return [](double x) { return 1 / (1 + 0.02 * x); };
  ADD_FAILURE() << "unknown scale function " << name;
  return [](double) { return 1.0; };
}

template <typename Options>
std::unique_ptr<torch::optim::OptimizerOptions> group_options(const Options& o) {
  return std::make_unique<Options>(o);
}

OptimizerPtr make_optimizer(const json& spec) {
  const auto lrs = spec.at("lrs").get<std::vector<double>>();
  const std::string type = spec.at("type");
  std::vector<torch::optim::OptimizerParamGroup> groups;
  auto options = [&](double lr) -> std::unique_ptr<torch::optim::OptimizerOptions> {
    if (type == "sgd") {
      return group_options(torch::optim::SGDOptions(lr).momentum(spec.value("momentum", 0.0)));
    }
    if (type == "rmsprop") {
      return group_options(torch::optim::RMSpropOptions(lr).momentum(spec.at("momentum")));
    }
    auto betas = spec.at("betas").get<std::vector<double>>();
    if (type == "adam") {
      return group_options(torch::optim::AdamOptions(lr).betas({betas[0], betas[1]}));
    }
    return group_options(torch::optim::AdamWOptions(lr).betas({betas[0], betas[1]}));
  };
  for (double lr : lrs) {
    groups.emplace_back(std::vector<torch::Tensor>{torch::zeros({2}, torch::kFloat64)},
                        options(lr));
  }
  if (type == "sgd") {
    return std::make_shared<torch::optim::SGD>(groups, torch::optim::SGDOptions(lrs[0]));
  }
  if (type == "rmsprop") {
    return std::make_shared<torch::optim::RMSprop>(groups, torch::optim::RMSpropOptions(lrs[0]));
  }
  if (type == "adam") {
    return std::make_shared<torch::optim::Adam>(groups, torch::optim::AdamOptions(lrs[0]));
  }
  EXPECT_EQ(type, "adamw");
  return std::make_shared<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(lrs[0]));
}

template <typename T>
std::vector<T> one_or_list(const json& v) {
  return v.is_array() ? v.get<std::vector<T>>() : std::vector<T>{v.get<T>()};
}

SchedulerPtr make_scheduler(const json& spec, torch::optim::Optimizer& opt) {
  const std::string kind = spec.at("kind");
  const json& a = spec.at("args");
  if (kind == "StepLR") return std::make_shared<volt::StepLR>(opt, a["step_size"], a["gamma"]);
  if (kind == "MultiStepLR") {
    return std::make_shared<volt::MultiStepLR>(opt, a["milestones"].get<std::vector<int64_t>>(),
                                               a["gamma"]);
  }
  if (kind == "ExponentialLR") return std::make_shared<volt::ExponentialLR>(opt, a["gamma"]);
  if (kind == "CosineAnnealingLR") {
    return std::make_shared<volt::CosineAnnealingLR>(opt, a["t_max"], a["eta_min"]);
  }
  if (kind == "CosineAnnealingWarmRestarts") {
    return std::make_shared<volt::CosineAnnealingWarmRestarts>(opt, a["t_0"], a["t_mult"],
                                                               a["eta_min"]);
  }
  if (kind == "LinearLR") {
    return std::make_shared<volt::LinearLR>(opt, volt::LinearLROptions()
                                                     .start_factor(a["start_factor"])
                                                     .end_factor(a["end_factor"])
                                                     .total_iters(a["total_iters"]));
  }
  if (kind == "LambdaLR") {
    std::vector<std::function<double(int64_t)>> fns;
    for (const auto& n : a["lambdas"]) fns.push_back(named_lambda(n));
    if (fns.size() == 1) return std::make_shared<volt::LambdaLR>(opt, fns[0]);
    return std::make_shared<volt::LambdaLR>(opt, fns);
  }
  if (kind == "OneCycleLR") {
    volt::OneCycleLROptions o(one_or_list<double>(a["max_lr"]), a["total_steps"]);
    o.pct_start(a["pct_start"])
        .anneal_strategy(a["anneal_strategy"] == "cos" ? volt::AnnealStrategy::kCos
                                                       : volt::AnnealStrategy::kLinear)
        .cycle_momentum(a["cycle_momentum"])
        .base_momentum(a["base_momentum"])
        .max_momentum(a["max_momentum"])
        .div_factor(a["div_factor"])
        .final_div_factor(a["final_div_factor"])
        .three_phase(a["three_phase"]);
    return std::make_shared<volt::OneCycleLR>(opt, o);
  }
  if (kind == "SequentialLR") {
    std::vector<SchedulerPtr> subs;
    for (const auto& s : a["schedulers"]) subs.push_back(make_scheduler(s, opt));
    return std::make_shared<volt::SequentialLR>(opt, subs,
                                                a["milestones"].get<std::vector<int64_t>>());
  }
  if (kind == "ChainedScheduler") {
    std::vector<SchedulerPtr> subs;
    for (const auto& s : a["schedulers"]) subs.push_back(make_scheduler(s, opt));
    return std::make_shared<volt::ChainedScheduler>(subs);
  }
  if (kind == "MultiplicativeLR") {
    std::vector<std::function<double(int64_t)>> fns;
    for (const auto& n : a["lambdas"]) fns.push_back(named_lambda(n));
    if (fns.size() == 1) return std::make_shared<volt::MultiplicativeLR>(opt, fns[0]);
    return std::make_shared<volt::MultiplicativeLR>(opt, fns);
  }
  if (kind == "ConstantLR") {
    return std::make_shared<volt::ConstantLR>(opt, a["factor"], a["total_iters"]);
  }
  if (kind == "PolynomialLR") {
    return std::make_shared<volt::PolynomialLR>(opt, a["total_iters"], a["power"]);
  }
  if (kind == "CyclicLR") {
    volt::CyclicLROptions o(one_or_list<double>(a["base_lr"]), one_or_list<double>(a["max_lr"]));
    const std::string mode = a["mode"];
    o.step_size_up(a["step_size_up"])
        .mode(mode == "triangular"    ? volt::CyclicMode::kTriangular
              : mode == "triangular2" ? volt::CyclicMode::kTriangular2
                                      : volt::CyclicMode::kExpRange)
        .gamma(a["gamma"])
        .scale_mode(a["scale_mode"] == "cycle" ? volt::CyclicScaleMode::kCycle
                                               : volt::CyclicScaleMode::kIterations)
        .cycle_momentum(a["cycle_momentum"])
        .base_momentum(one_or_list<double>(a["base_momentum"]))
        .max_momentum(one_or_list<double>(a["max_momentum"]));
    if (!a["step_size_down"].is_null()) o.step_size_down(a["step_size_down"].get<double>());
    if (!a["scale_fn"].is_null()) o.scale_fn(named_scale_fn(a["scale_fn"]));
    return std::make_shared<volt::CyclicLR>(opt, o);
  }
  if (kind == "SWALR") {
    return std::make_shared<volt::SWALR>(
        opt, one_or_list<double>(a["swa_lr"]), a["anneal_epochs"].get<int64_t>(),
        a["anneal_strategy"] == "cos" ? volt::AnnealStrategy::kCos : volt::AnnealStrategy::kLinear);
  }
  EXPECT_EQ(kind, "ReduceLROnPlateau");
  return std::make_shared<volt::ReduceLROnPlateau>(
      opt, volt::ReduceLROnPlateauOptions()
               .mode(a["mode"] == "min" ? volt::PlateauMode::kMin : volt::PlateauMode::kMax)
               .factor(a["factor"])
               .patience(a["patience"])
               .threshold(a["threshold"])
               .threshold_mode(a["threshold_mode"] == "rel" ? volt::ThresholdMode::kRel
                                                            : volt::ThresholdMode::kAbs)
               .cooldown(a["cooldown"])
               .min_lr(one_or_list<double>(a["min_lr"]))
               .eps(a["eps"]));
}

std::vector<double> group_lrs(torch::optim::Optimizer& opt) {
  std::vector<double> out;
  for (auto& g : opt.param_groups()) out.push_back(g.options().get_lr());
  return out;
}

std::vector<double> group_momenta(torch::optim::Optimizer& opt) {
  std::vector<double> out;
  for (auto& g : opt.param_groups()) {
    auto& o = g.options();
    if (auto* sgd = dynamic_cast<torch::optim::SGDOptions*>(&o)) {
      out.push_back(sgd->momentum());
    } else if (auto* rms = dynamic_cast<torch::optim::RMSpropOptions*>(&o)) {
      out.push_back(rms->momentum());
    } else if (auto* adam = dynamic_cast<torch::optim::AdamOptions*>(&o)) {
      out.push_back(std::get<0>(adam->betas()));
    } else {
      out.push_back(std::get<0>(dynamic_cast<torch::optim::AdamWOptions&>(o).betas()));
    }
  }
  return out;
}

double rel_error(double got, double want) {
  if (got == want) return 0;
  return std::abs(got - want) / std::max(std::abs(want), std::numeric_limits<double>::min());
}

// Tracks the worst error over a whole sequence, so the test can report the tolerance reached.
struct ErrorStats {
  double worst = 0;
  int64_t values = 0, exact = 0;
  void add(double got, double want) {
    const double e = rel_error(got, want);
    worst = std::max(worst, e);
    ++values;
    exact += e == 0;
  }
};

// Steps `sched` once the way the reference did (with the case's metric if it has one).
void step_like_reference(volt::LRScheduler& sched, const json& c, size_t i) {
  if (c.contains("metrics")) {
    sched.step(c["metrics"][i].get<double>());
  } else {
    sched.step();
  }
}

// Compares the optimizer's lrs (and momenta) after `i` steps with the reference.
void expect_matches(torch::optim::Optimizer& opt, volt::LRScheduler& sched, const json& c, size_t i,
                    ErrorStats& stats) {
  const auto want = c["lrs"][i].get<std::vector<double>>();
  const auto got = group_lrs(opt);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(sched.last_lrs(), got) << "after " << i << " steps";
  for (size_t g = 0; g < want.size(); ++g) {
    stats.add(got[g], want[g]);
    EXPECT_LE(rel_error(got[g], want[g]), kTolerance)
        << "group " << g << " after " << i << " steps: " << got[g] << " vs PyTorch " << want[g];
  }
  if (c.contains("momentum")) {
    const auto want_m = c["momentum"][i].get<std::vector<double>>();
    const auto got_m = group_momenta(opt);
    for (size_t g = 0; g < want_m.size(); ++g) {
      stats.add(got_m[g], want_m[g]);
      EXPECT_LE(rel_error(got_m[g], want_m[g]), kTolerance)
          << "momentum of group " << g << " after " << i << " steps";
    }
  }
}

std::string archive_bytes(const volt::LRScheduler& sched) {
  torch::serialize::OutputArchive out;
  sched.save(out);
  std::ostringstream os;
  out.save_to(os);
  return os.str();
}

void load_bytes(volt::LRScheduler& sched, const std::string& bytes) {
  std::istringstream is(bytes);
  torch::serialize::InputArchive in;
  in.load_from(is);
  sched.load(in);
}

template <typename E, typename F>
void expect_error(F&& f, const std::string& phrase) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one saying \"" << phrase << "\"";
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(phrase), std::string::npos) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

// Two param groups with different lrs.
std::shared_ptr<torch::optim::SGD> two_group_sgd(double momentum = 0.9) {
  return std::dynamic_pointer_cast<torch::optim::SGD>(
      make_optimizer({{"type", "sgd"}, {"lrs", {0.1, 0.05}}, {"momentum", momentum}}));
}

TEST(LRScheduler, ReferenceCoversEveryScheduler) {
  std::set<std::string> kinds;
  std::function<void(const json&)> collect = [&](const json& s) {
    kinds.insert(s["kind"].get<std::string>());
    if (s["kind"] == "SequentialLR" || s["kind"] == "ChainedScheduler") {
      for (const auto& sub : s["args"]["schedulers"]) collect(sub);
    }
  };
  for (const auto& c : reference()["cases"]) {
    collect(c["scheduler"]);
    EXPECT_GE(c["steps"].get<int64_t>(), 30) << c["name"];
    EXPECT_EQ(c["optimizer"]["lrs"].size(), 2u) << c["name"];
  }
  for (const char* k : {"StepLR", "MultiStepLR", "ExponentialLR", "CosineAnnealingLR",
                        "CosineAnnealingWarmRestarts", "LinearLR", "LambdaLR", "OneCycleLR",
                        "SequentialLR", "ReduceLROnPlateau", "SWALR", "ConstantLR", "PolynomialLR",
                        "MultiplicativeLR", "CyclicLR", "ChainedScheduler"}) {
    EXPECT_EQ(kinds.count(k), 1u) << k << " has no reference case";
  }
}

TEST(LRScheduler, MatchesPyTorchReference) {
  ErrorStats all;
  for (const auto& c : reference()["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    auto opt = make_optimizer(c["optimizer"]);
    auto sched = make_scheduler(c["scheduler"], *opt);
    ErrorStats stats;
    expect_matches(*opt, *sched, c, 0, stats);
    const size_t steps = c["steps"];
    for (size_t i = 0; i < steps; ++i) {
      step_like_reference(*sched, c, i);
      EXPECT_EQ(sched->last_epoch(), static_cast<int64_t>(i + 1));
      expect_matches(*opt, *sched, c, i + 1, stats);
    }
    all.worst = std::max(all.worst, stats.worst);
    all.values += stats.values;
    all.exact += stats.exact;
  }
  std::cout << "[ reference ] " << reference()["cases"].size() << " cases, " << all.values
            << " values, " << all.exact << " bit-identical, max relative error " << all.worst
            << " (tolerance " << kTolerance << ")\n";
}

// A param group added after the scheduler was built (BaseFinetuning's unfreeze) is scheduled as
// PyTorch's chainable get_lr() schedules it (tools/lr_scheduler_reference.py's
// added_group_cases: StepLR, ExponentialLR, CosineAnnealingLR, LinearLR... scale it; LambdaLR,
// CyclicLR, a SequentialLR milestone... leave it alone); volt left it alone everywhere. A resume
// after it was added, the group added again before the load as BaseFinetuning restores, goes on
// like the uninterrupted run (the group's rate as the optimizer's state restores it: the load
// leaves it alone, as PyTorch's load_state_dict writes no lr).
TEST(LRScheduler, AGroupAddedAfterTheSchedulerIsScheduledAsInPyTorch) {
  const auto& cases = reference()["added_group_cases"];
  ASSERT_GE(cases.size(), 13u);
  for (const auto& c : cases) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const size_t steps = c["steps"];
    const size_t after = c["add_group"]["after"];
    const auto add_group = [&](torch::optim::Optimizer& o) {
      o.add_param_group(torch::optim::OptimizerParamGroup({torch::zeros({2}, torch::kFloat64)}));
      o.param_groups().back().options().set_lr(c["add_group"]["lr"].get<double>());
    };
    const auto expect_step = [&](torch::optim::Optimizer& o, size_t i) {
      const auto want = c["lrs"][i].get<std::vector<double>>();
      const auto got = group_lrs(o);
      ASSERT_EQ(got.size(), want.size()) << "after " << i << " steps";
      for (size_t g = 0; g < want.size(); ++g) {
        EXPECT_LE(rel_error(got[g], want[g]), kTolerance)
            << "group " << g << " after " << i << " steps: " << got[g] << " vs PyTorch " << want[g];
      }
    };
    auto opt = make_optimizer(c["optimizer"]);
    auto sched = make_scheduler(c["scheduler"], *opt);
    const size_t cut = after + 2;
    std::string bytes;
    std::vector<double> lrs_at_cut;
    for (size_t i = 0; i < steps; ++i) {
      if (i == after) add_group(*opt);
      if (i == cut) {
        bytes = archive_bytes(*sched);
        lrs_at_cut = group_lrs(*opt);
      }
      sched->step();
      expect_step(*opt, i + 1);
    }
    auto opt2 = make_optimizer(c["optimizer"]);
    auto resumed = make_scheduler(c["scheduler"], *opt2);
    add_group(*opt2);
    opt2->param_groups().back().options().set_lr(lrs_at_cut.back());  // the optimizer's state
    load_bytes(*resumed, bytes);
    EXPECT_EQ(group_lrs(*opt2), lrs_at_cut);
    for (size_t i = cut; i < steps; ++i) {
      resumed->step();
      expect_step(*opt2, i + 1);
    }
  }
}

TEST(LRScheduler, SaveLoadMidSequenceContinuesLikeUninterrupted) {
  for (const auto& c : reference()["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const size_t steps = c["steps"];
    for (size_t cut : {size_t{1}, steps / 2, steps - 3}) {
      auto opt = make_optimizer(c["optimizer"]);
      auto sched = make_scheduler(c["scheduler"], *opt);
      for (size_t i = 0; i < cut; ++i) step_like_reference(*sched, c, i);
      const std::string bytes = archive_bytes(*sched);

      // A fresh optimizer and scheduler, as in a new process resuming from a checkpoint.
      auto opt2 = make_optimizer(c["optimizer"]);
      auto resumed = make_scheduler(c["scheduler"], *opt2);
      load_bytes(*resumed, bytes);
      EXPECT_EQ(resumed->last_epoch(), static_cast<int64_t>(cut));
      EXPECT_EQ(group_lrs(*opt2), group_lrs(*opt));
      EXPECT_EQ(group_momenta(*opt2), group_momenta(*opt));  // the next optimizer step's
      ErrorStats stats;
      for (size_t i = cut; i < steps; ++i) {
        step_like_reference(*sched, c, i);
        step_like_reference(*resumed, c, i);
        ASSERT_EQ(group_lrs(*opt2), group_lrs(*opt)) << "cut " << cut << ", step " << i + 1;
        ASSERT_EQ(group_momenta(*opt2), group_momenta(*opt)) << "cut " << cut << ", step " << i;
        ASSERT_EQ(resumed->last_lrs(), sched->last_lrs());
        expect_matches(*opt2, *resumed, c, i + 1, stats);
      }
    }
  }
}

TEST(LRScheduler, ASequenceOfOneCycleSchedulesResumesWithTheActiveOnesMomentum) {
  // The second OneCycleLR waits for its milestone; loaded after the first, it set its step-0
  // momentum (max_momentum 0.99) over the active one's, which the first optimizer step after
  // the resume then used.
  const auto make = [](torch::optim::Optimizer& o) {
    return std::make_shared<volt::SequentialLR>(
        o,
        std::vector<SchedulerPtr>{
            std::make_shared<volt::OneCycleLR>(o, volt::OneCycleLROptions({0.5}, 10)),
            std::make_shared<volt::OneCycleLR>(
                o, volt::OneCycleLROptions({0.2}, 10).base_momentum(0.8).max_momentum(0.99))},
        std::vector<int64_t>{10});
  };
  auto opt = two_group_sgd(), opt2 = two_group_sgd();
  auto sched = make(*opt);
  for (int i = 0; i < 4; ++i) sched->step();
  auto resumed = make(*opt2);
  load_bytes(*resumed, archive_bytes(*sched));
  EXPECT_EQ(group_momenta(*opt2), group_momenta(*opt));
  EXPECT_EQ(group_lrs(*opt2), group_lrs(*opt));
  for (int i = 0; i < 10; ++i) {  // across the milestone
    sched->step();
    resumed->step();
    ASSERT_EQ(group_momenta(*opt2), group_momenta(*opt)) << i;
    ASSERT_EQ(group_lrs(*opt2), group_lrs(*opt)) << i;
  }
}

TEST(LRScheduler, PlateauStateRoundTrips) {
  auto opt = two_group_sgd();
  volt::ReduceLROnPlateau a(*opt, volt::ReduceLROnPlateauOptions().patience(3).cooldown(4));
  EXPECT_EQ(a.best(), std::numeric_limits<double>::infinity());  // saved and loaded as inf
  auto fresh = two_group_sgd();
  volt::ReduceLROnPlateau b(*fresh, volt::ReduceLROnPlateauOptions().patience(3).cooldown(4));
  load_bytes(b, archive_bytes(a));
  EXPECT_EQ(b.best(), std::numeric_limits<double>::infinity());
  for (double m : {1.0, 0.5, 0.6, 0.7, 0.8, 0.9}) a.step(m);
  EXPECT_EQ(a.best(), 0.5);
  EXPECT_EQ(a.cooldown_counter(), 4);
  EXPECT_EQ(a.num_bad_epochs(), 0);
  a.step(0.9);
  EXPECT_EQ(a.cooldown_counter(), 3);
  load_bytes(b, archive_bytes(a));
  EXPECT_EQ(b.best(), 0.5);
  EXPECT_EQ(b.cooldown_counter(), 3);
  EXPECT_EQ(b.last_epoch(), 7);
  EXPECT_EQ(group_lrs(*fresh), (std::vector<double>{0.1 * 0.1, 0.05 * 0.1}));
}

TEST(LRScheduler, ChainableFormsComposeWithExternalLrChanges) {
  // PyTorch's recursive forms scale whatever lr is in the group; an outside change (e.g. an lr
  // finder) carries through, where a closed form would overwrite it.
  auto opt = two_group_sgd();
  volt::ExponentialLR sched(*opt, 0.5);
  opt->param_groups()[0].options().set_lr(1.0);
  sched.step();
  EXPECT_EQ(group_lrs(*opt), (std::vector<double>{0.5, 0.025}));
}

TEST(LRScheduler, LoadsCheckpointsWithoutLastLrs) {
  // Checkpoints written before the PyTorch-parity schedulers hold only last_epoch and base_lrs.
  torch::serialize::OutputArchive old;
  old.write("last_epoch", c10::IValue(int64_t{5}));
  old.write("base_lrs", c10::IValue(c10::List<double>({0.1, 0.05})));
  std::ostringstream os;
  old.save_to(os);
  auto opt = two_group_sgd();
  volt::StepLR sched(*opt, 2, 0.5);
  std::istringstream is(os.str());
  torch::serialize::InputArchive in;
  in.load_from(is);
  sched.load(in);
  EXPECT_EQ(sched.last_epoch(), 5);
  EXPECT_EQ(group_lrs(*opt), (std::vector<double>{0.1 * 0.25, 0.05 * 0.25}));
  sched.step();
  EXPECT_EQ(group_lrs(*opt), (std::vector<double>{0.1 * 0.125, 0.05 * 0.125}));
}

TEST(LRScheduler, LoadErrors) {
  auto opt = two_group_sgd();
  volt::StepLR step(*opt, 2);
  const std::string step_bytes = archive_bytes(step);
  auto opt2 = two_group_sgd();
  volt::ExponentialLR exp(*opt2, 0.9);
  expect_error<volt::CheckpointError>([&] { load_bytes(exp, step_bytes); },
                                      "holds the state of a StepLR");
  auto one_group = std::make_shared<torch::optim::SGD>(
      std::vector<torch::Tensor>{torch::zeros({2})}, torch::optim::SGDOptions(0.1));
  volt::StepLR small(*one_group, 2);
  expect_error<volt::CheckpointError>([&] { load_bytes(small, step_bytes); },
                                      "checkpoint has 2 param groups but the optimizer has 1");

  auto make_seq = [](torch::optim::Optimizer& o, size_t n) {
    std::vector<SchedulerPtr> subs;
    std::vector<int64_t> ms;
    for (size_t i = 0; i < n; ++i) {
      subs.push_back(std::make_shared<volt::ExponentialLR>(o, 0.9));
      if (i > 0) ms.push_back(static_cast<int64_t>(3 * i));
    }
    return std::make_shared<volt::SequentialLR>(o, subs, ms);
  };
  auto opt3 = two_group_sgd(), opt4 = two_group_sgd();
  auto seq2 = make_seq(*opt3, 2), seq3 = make_seq(*opt4, 3);
  expect_error<volt::CheckpointError>([&] { load_bytes(*seq3, archive_bytes(*seq2)); },
                                      "checkpoint chains 2 schedulers but this one chains 3");
}

// A group added after the scheduler was built (BackboneFinetuning's) is scaled by StepLR, as
// torch 1.13's chainable get_lr() does (AGroupAddedAfterTheSchedulerIsScheduledAsInPyTorch has
// every scheduler), and last_lrs covers it; removing a group is an error.
TEST(LRScheduler, ParamGroupAddedAfterConstructionIsScaledAndRemovingOneIsAnError) {
  auto opt = two_group_sgd();
  volt::StepLR sched(*opt, 1, 0.5);
  const double lr0 = opt->param_groups()[0].options().get_lr();
  const double lr1 = opt->param_groups()[1].options().get_lr();
  torch::optim::OptimizerParamGroup added({torch::zeros({2})});
  opt->add_param_group(added);
  opt->param_groups()[2].options().set_lr(0.125);
  sched.step();
  EXPECT_DOUBLE_EQ(opt->param_groups()[0].options().get_lr(), lr0 * 0.5);
  EXPECT_DOUBLE_EQ(opt->param_groups()[1].options().get_lr(), lr1 * 0.5);
  EXPECT_DOUBLE_EQ(opt->param_groups()[2].options().get_lr(), 0.125 * 0.5);
  ASSERT_EQ(sched.last_lrs().size(), 3u);
  while (opt->param_groups().size() > 1) opt->param_groups().pop_back();
  expect_error<volt::ConfigError>([&] { sched.step(); },
                                  "do not remove param groups from a scheduled optimizer");
}

// restart_at before the first step: the optimizer and scheduler go on exactly as a pair built
// at the new rates (every reference case: each scheduler kind, SequentialLR's chains, OneCycleLR
// keeping its own initial lrs, momenta included); after a step it is refused.
TEST(LRScheduler, RestartAtIsConstructionAtTheNewRates) {
  for (const auto& c : reference()["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    json tripled = c["optimizer"];
    std::vector<double> lrs;
    for (double lr : c["optimizer"]["lrs"].get<std::vector<double>>()) lrs.push_back(lr * 3);
    tripled["lrs"] = lrs;
    auto opt = make_optimizer(c["optimizer"]);
    auto sched = make_scheduler(c["scheduler"], *opt);
    sched->restart_at(lrs);
    auto fresh_opt = make_optimizer(tripled);
    auto fresh = make_scheduler(c["scheduler"], *fresh_opt);
    ASSERT_EQ(group_lrs(*opt), group_lrs(*fresh_opt));
    ASSERT_EQ(sched->base_lrs(), fresh->base_lrs());
    const size_t steps = c["steps"];
    for (size_t i = 0; i < steps; ++i) {
      step_like_reference(*sched, c, i);
      step_like_reference(*fresh, c, i);
      ASSERT_EQ(group_lrs(*opt), group_lrs(*fresh_opt)) << "step " << i + 1;
      ASSERT_EQ(group_momenta(*opt), group_momenta(*fresh_opt)) << "step " << i + 1;
      ASSERT_EQ(sched->last_lrs(), fresh->last_lrs());
    }
    expect_error<volt::ValueError>([&] { sched->restart_at({0.1}); },
                                   "restart_at() after " + std::to_string(steps) + " step(s)");
  }
  auto opt = two_group_sgd();
  volt::StepLR step(*opt, 2, 0.5);
  step.restart_at({0.3});  // one rate for every group
  EXPECT_EQ(group_lrs(*opt), (std::vector<double>{0.3, 0.3}));
  expect_error<volt::ConfigError>(
      [&] {
        step.restart_at({0.1, 0.2, 0.3});
      },
      "[StepLR] restart_at() got 3 lrs for 2 scheduled param groups");
  expect_error<volt::ConfigError>([&] { step.restart_at({-1.0}); },
                                  "[StepLR] restart_at(): lr=-1 must be positive and finite");
}

TEST(LRScheduler, ConstructorErrors) {
  auto opt = two_group_sgd();
  auto& o = *opt;
  using volt::ConfigError;
  auto empty = std::make_shared<torch::optim::SGD>(std::vector<torch::Tensor>{},
                                                   torch::optim::SGDOptions(0.1));
  empty->param_groups().clear();
  expect_error<ConfigError>([&] { volt::StepLR(*empty, 1); }, "has no param groups");

  expect_error<ConfigError>([&] { volt::StepLR(o, 0); }, "step_size=0 must be >= 1");
  expect_error<ConfigError>([&] { volt::StepLR(o, 2, 0.0); }, "gamma=0 must be > 0");
  expect_error<ConfigError>([&] { volt::MultiStepLR(o, {3, -1}); }, "milestone -1 is negative");
  expect_error<ConfigError>([&] { volt::MultiStepLR(o, {3}, -0.5); }, "gamma=-0.5 must be > 0");
  expect_error<ConfigError>([&] { volt::ExponentialLR(o, 0.0); }, "[ExponentialLR] gamma=0");
  // An infinite gamma is refused as the CLI refuses it (PyTorch takes it and trains on inf).
  const double inf = std::numeric_limits<double>::infinity();
  expect_error<ConfigError>([&] { volt::StepLR(o, 2, inf); }, "gamma=inf must be > 0 and finite");
  expect_error<ConfigError>([&] { volt::MultiStepLR(o, {3}, inf); }, "[MultiStepLR] gamma=inf");
  expect_error<ConfigError>([&] { volt::ExponentialLR(o, inf); }, "[ExponentialLR] gamma=inf");
  expect_error<ConfigError>([&] { volt::CosineAnnealingLR(o, 0); }, "t_max=0 must be >= 1");
  expect_error<ConfigError>([&] { volt::CosineAnnealingLR(o, 10, -1e-3); },
                            "eta_min=-0.001 must be a finite lr >= 0");
  expect_error<ConfigError>([&] { volt::CosineAnnealingLR(o, 10, INFINITY); },
                            "eta_min=inf must be a finite lr >= 0");
  expect_error<ConfigError>([&] { volt::CosineAnnealingWarmRestarts(o, 0); }, "t_0=0 must be >= 1");
  expect_error<ConfigError>([&] { volt::CosineAnnealingWarmRestarts(o, 5, 0); },
                            "t_mult=0 must be >= 1");
  expect_error<ConfigError>([&] { volt::CosineAnnealingWarmRestarts(o, 5, 1, -1.0); },
                            "eta_min=-1 must be a finite lr >= 0");
  expect_error<ConfigError>([&] { volt::CosineAnnealingWarmRestarts(o, 5, 1, INFINITY); },
                            "eta_min=inf must be a finite lr >= 0");
  expect_error<ConfigError>(
      [&] { volt::WarmupLR(o, volt::WarmupLROptions().warmup_min_lr(INFINITY)); },
      "warmup_min_lr=inf and warmup_max_lr=0.001 must be finite lrs >= 0");

  using volt::LinearLROptions;
  expect_error<ConfigError>([&] { volt::LinearLR(o, LinearLROptions().start_factor(0)); },
                            "start_factor=0 must be in (0, 1]");
  expect_error<ConfigError>([&] { volt::LinearLR(o, LinearLROptions().start_factor(1.5)); },
                            "start_factor=1.5 must be in (0, 1]");
  expect_error<ConfigError>([&] { volt::LinearLR(o, LinearLROptions().end_factor(1.1)); },
                            "end_factor=1.1 must be in [0, 1]");
  expect_error<ConfigError>([&] { volt::LinearLR(o, LinearLROptions().end_factor(-0.1)); },
                            "end_factor=-0.1 must be in [0, 1]");
  expect_error<ConfigError>([&] { volt::LinearLR(o, LinearLROptions().total_iters(0)); },
                            "total_iters=0 must be >= 1");

  expect_error<ConfigError>([&] { volt::LambdaLR(o, std::function<double(int64_t)>()); },
                            "factor function is empty");
  expect_error<ConfigError>(
      [&] {
        volt::LambdaLR(o, std::vector<std::function<double(int64_t)>>{named_lambda("pow095")});
      },
      "got 1 factor functions for 2 param groups");
  expect_error<ConfigError>(
      [&] {
        volt::LambdaLR(o, std::vector<std::function<double(int64_t)>>{
                              named_lambda("pow095"), std::function<double(int64_t)>()});
      },
      "factor function 1 is empty");
}

TEST(LRScheduler, OneCycleErrors) {
  auto opt = two_group_sgd();
  auto& o = *opt;
  using volt::ConfigError;
  using volt::OneCycleLROptions;
  expect_error<ConfigError>(
      [&] {
        volt::OneCycleLR(o, OneCycleLROptions(std::vector<double>{0.1, 0.2, 0.3}, 10));
      },
      "got 3 max_lr values for 2 param groups");
  expect_error<ConfigError>([&] { volt::OneCycleLR(o, OneCycleLROptions(0.0, 10)); },
                            "max_lr=0 must be a positive finite lr");
  expect_error<ConfigError>([&] { volt::OneCycleLR(o, OneCycleLROptions(0.1, 0)); },
                            "total_steps=0 must be >= 1");
  expect_error<ConfigError>([&] { volt::OneCycleLR(o, OneCycleLROptions(0.1, 10).pct_start(1.5)); },
                            "pct_start=1.5 must be in [0, 1]");
  expect_error<ConfigError>([&] { volt::OneCycleLR(o, OneCycleLROptions(0.1, 10).div_factor(0)); },
                            "div_factor=0 must be > 0");
  expect_error<ConfigError>(
      [&] { volt::OneCycleLR(o, OneCycleLROptions(0.1, 10).final_div_factor(-1)); },
      "final_div_factor=-1 must be > 0");
  // pct_start * total_steps == 1: PyTorch divides 0 by 0 at step 0.
  expect_error<ConfigError>([&] { volt::OneCycleLR(o, OneCycleLROptions(0.1, 10).pct_start(0.1)); },
                            "makes phase 1 zero steps long");
  // pct_start == 1 leaves nothing for the last phase, reached at step total_steps.
  expect_error<ConfigError>([&] { volt::OneCycleLR(o, OneCycleLROptions(0.1, 10).pct_start(1.0)); },
                            "makes phase 2 zero steps long");
  expect_error<ConfigError>(
      [&] { volt::OneCycleLR(o, OneCycleLROptions(0.1, 10).max_momentum(1.0)); },
      "momentum 1 must be in [0, 1)");
  auto adagrad = std::make_shared<torch::optim::Adagrad>(
      std::vector<torch::Tensor>{torch::zeros({2})}, torch::optim::AdagradOptions(0.1));
  expect_error<ConfigError>([&] { volt::OneCycleLR(*adagrad, OneCycleLROptions(0.1, 10)); },
                            "set cycle_momentum(false)");
  volt::OneCycleLR ok(*adagrad, OneCycleLROptions(0.1, 10).cycle_momentum(false));
  EXPECT_NEAR(ok.last_lrs()[0], 0.1 / 25, 1e-15);

  // Stepping past total_steps is an error and leaves the scheduler as it was.
  volt::OneCycleLR sched(o, OneCycleLROptions(0.1, 4).cycle_momentum(false));
  for (int i = 0; i < 4; ++i) sched.step();
  const auto lrs = group_lrs(o);
  expect_error<ConfigError>([&] { sched.step(); }, "step() called 5 times but total_steps=4");
  EXPECT_EQ(sched.last_epoch(), 4);
  EXPECT_EQ(group_lrs(o), lrs);
}

TEST(LRScheduler, SequentialErrors) {
  auto opt = two_group_sgd(), other = two_group_sgd();
  auto& o = *opt;
  using volt::ConfigError;
  SchedulerPtr a = std::make_shared<volt::LinearLR>(o);
  SchedulerPtr b = std::make_shared<volt::ExponentialLR>(o, 0.9);
  auto seq = [&](std::vector<SchedulerPtr> s, std::vector<int64_t> m) {
    volt::SequentialLR(o, std::move(s), std::move(m));
  };
  expect_error<ConfigError>([&] { seq({}, {}); }, "no schedulers given");
  expect_error<ConfigError>([&] { seq({a, nullptr}, {3}); }, "scheduler 1 is null");
  auto foreign = std::make_shared<volt::StepLR>(*other, 2);
  expect_error<ConfigError>([&] { seq({a, foreign}, {3}); }, "drives a different optimizer");
  auto plateau = std::make_shared<volt::ReduceLROnPlateau>(o);
  expect_error<ConfigError>(
      [&] {
        seq({a, plateau}, {3});
      },
      "is a ReduceLROnPlateau, which cannot be chained");
  auto inner =
      std::make_shared<volt::SequentialLR>(o, std::vector<SchedulerPtr>{b}, std::vector<int64_t>{});
  expect_error<ConfigError>(
      [&] {
        seq({a, inner}, {3});
      },
      "is a SequentialLR, which cannot be chained");
  expect_error<ConfigError>([&] { seq({a, a}, {3}); }, "are the same object");
  expect_error<ConfigError>([&] { seq({a, b}, {3, 6}); }, "got 2 schedulers and 2 milestones");
  auto c = std::make_shared<volt::StepLR>(o, 2);
  expect_error<ConfigError>(
      [&] {
        seq({a, b, c}, {5, 5});
      },
      "milestones must be strictly increasing and >= 1");
  expect_error<ConfigError>(
      [&] {
        seq({a, b}, {0});
      },
      "milestones must be strictly increasing and >= 1");
}

TEST(LRScheduler, PlateauErrors) {
  auto opt = two_group_sgd();
  auto& o = *opt;
  using volt::ConfigError;
  using volt::ReduceLROnPlateauOptions;
  expect_error<ConfigError>(
      [&] { volt::ReduceLROnPlateau(o, ReduceLROnPlateauOptions().factor(1)); },
      "factor=1 must be in [0, 1)");
  expect_error<ConfigError>(
      [&] { volt::ReduceLROnPlateau(o, ReduceLROnPlateauOptions().factor(-0.1)); },
      "factor=-0.1 must be in [0, 1)");
  expect_error<ConfigError>(
      [&] { volt::ReduceLROnPlateau(o, ReduceLROnPlateauOptions().patience(-1)); },
      "patience=-1 must be >= 0");
  expect_error<ConfigError>(
      [&] { volt::ReduceLROnPlateau(o, ReduceLROnPlateauOptions().threshold(-1)); },
      "threshold=-1 must be >= 0");
  expect_error<ConfigError>(
      [&] { volt::ReduceLROnPlateau(o, ReduceLROnPlateauOptions().cooldown(-2)); },
      "cooldown=-2 must be >= 0");
  expect_error<ConfigError>([&] { volt::ReduceLROnPlateau(o, ReduceLROnPlateauOptions().eps(-1)); },
                            "eps=-1 must be >= 0");
  expect_error<ConfigError>(
      [&] {
        volt::ReduceLROnPlateau(o, ReduceLROnPlateauOptions().min_lr({0.1, 0.2, 0.3}));
      },
      "got 3 min_lr values for 2 param groups");
  expect_error<ConfigError>(
      [&] { volt::ReduceLROnPlateau(o, ReduceLROnPlateauOptions().min_lr({-1e-3})); },
      "min_lr=-0.001 must be >= 0");
  volt::ReduceLROnPlateau sched(o);
  EXPECT_EQ(group_lrs(o), (std::vector<double>{0.1, 0.05}));  // construction changes nothing
  expect_error<ConfigError>([&] { sched.step(); }, "set OptimizerConfig::monitor");
  EXPECT_EQ(sched.last_epoch(), 0);
}

TEST(LRScheduler, ConstantPolynomialAndMultiplicativeErrors) {
  auto opt = two_group_sgd();
  auto& o = *opt;
  using volt::ConfigError;
  expect_error<ConfigError>([&] { volt::ConstantLR(o, 0.0); },
                            "[ConstantLR] factor=0 must be in (0, 1]");
  expect_error<ConfigError>([&] { volt::ConstantLR(o, 1.5); }, "factor=1.5 must be in (0, 1]");
  expect_error<ConfigError>([&] { volt::ConstantLR(o, 0.5, -1); }, "total_iters=-1 must be >= 0");
  expect_error<ConfigError>([&] { volt::PolynomialLR(o, 0); },
                            "[PolynomialLR] total_iters=0 must be >= 1");
  expect_error<ConfigError>([&] { volt::PolynomialLR(o, 5, 0.0); },
                            "power=0 must be positive and finite");
  expect_error<ConfigError>([&] { volt::PolynomialLR(o, 5, INFINITY); },
                            "power=inf must be positive and finite");
  expect_error<ConfigError>([&] { volt::MultiplicativeLR(o, std::function<double(int64_t)>()); },
                            "[MultiplicativeLR] factor function is empty");
  expect_error<ConfigError>(
      [&] {
        volt::MultiplicativeLR(
            o, std::vector<std::function<double(int64_t)>>{named_lambda("const095")});
      },
      "got 1 factor functions for 2 param groups");
  expect_error<ConfigError>(
      [&] {
        volt::MultiplicativeLR(o, std::vector<std::function<double(int64_t)>>{
                                      named_lambda("const095"), std::function<double(int64_t)>()});
      },
      "factor function 1 is empty");
  // Nothing was written by the refused constructions.
  EXPECT_EQ(group_lrs(o), (std::vector<double>{0.1, 0.05}));
}

TEST(LRScheduler, CyclicErrors) {
  auto opt = two_group_sgd();
  auto& o = *opt;
  using volt::ConfigError;
  using volt::CyclicLROptions;
  const auto cyclic = [&](CyclicLROptions options) { volt::CyclicLR(o, std::move(options)); };
  expect_error<ConfigError>(
      [&] {
        cyclic(CyclicLROptions({0.1, 0.2, 0.3}, {1.0}));
      },
      "[CyclicLR] got 3 base_lr values for 2 param groups");
  expect_error<ConfigError>(
      [&] {
        cyclic(CyclicLROptions({0.1}, {1.0, 2.0, 3.0}));
      },
      "got 3 max_lr values for 2 param groups");
  expect_error<ConfigError>([&] { cyclic(CyclicLROptions(-0.1, 1.0)); },
                            "base_lr=-0.1 must be >= 0 and finite");
  expect_error<ConfigError>([&] { cyclic(CyclicLROptions(0.1, NAN)); },
                            "max_lr=nan must be >= 0 and finite");
  expect_error<ConfigError>([&] { cyclic(CyclicLROptions(0.1, 1.0).step_size_up(0)); },
                            "step_size_up=0 must be > 0");
  expect_error<ConfigError>([&] { cyclic(CyclicLROptions(0.1, 1.0).step_size_down(-1.0)); },
                            "step_size_down=-1 must be >= 0");
  expect_error<ConfigError>(
      [&] { cyclic(CyclicLROptions(0.1, 1.0).mode(volt::CyclicMode::kExpRange).gamma(0)); },
      "gamma=0 must be positive and finite for mode exp_range");
  expect_error<ConfigError>([&] { cyclic(CyclicLROptions(0.1, 1.0).max_momentum({1.0})); },
                            "momentum 1 must be in [0, 1)");
  expect_error<ConfigError>(
      [&] {
        cyclic(CyclicLROptions(0.1, 1.0).base_momentum({0.8, 0.7, 0.6}));
      },
      "got 3 base_momentum values for 2 param groups");
  auto adagrad = std::make_shared<torch::optim::Adagrad>(
      std::vector<torch::Tensor>{torch::zeros({2})}, torch::optim::AdagradOptions(0.1));
  expect_error<ConfigError>(
      [&] { volt::CyclicLR(*adagrad, CyclicLROptions(0.01, 0.1)); },
      "[CyclicLR] cycle_momentum=true needs an optimizer with momentum or betas");
  volt::CyclicLR without(*adagrad, CyclicLROptions(0.01, 0.1).cycle_momentum(false));
  EXPECT_EQ(group_lrs(*adagrad), (std::vector<double>{0.01}));  // base_lr from construction on
  // A custom scale function replaces the mode, so exp_range's gamma is not needed then.
  volt::CyclicLR custom(o, CyclicLROptions(0.01, 0.1)
                               .mode(volt::CyclicMode::kExpRange)
                               .gamma(0)
                               .scale_fn([](double) { return 0.5; })
                               .step_size_up(2));
  custom.step();
  EXPECT_NEAR(group_lrs(o)[0], 0.01 + 0.09 * 0.5 * 0.5, 1e-15);
}

// PyTorch 1.13's CyclicLR refuses Adam (no "momentum" default); PyTorch 2.x, OneCycleLR and volt
// cycle beta1 instead, by the same formula as SGD's momentum.
TEST(LRScheduler, CyclicLRCyclesAdamsBeta1AsSgdsMomentum) {
  auto sgd = two_group_sgd();
  auto adamw = make_optimizer({{"type", "adamw"}, {"lrs", {0.1, 0.05}}, {"betas", {0.9, 0.999}}});
  const auto options = volt::CyclicLROptions({0.01, 0.001}, {0.1, 0.01})
                           .step_size_up(3)
                           .base_momentum({0.85, 0.8})
                           .max_momentum({0.95, 0.9});
  volt::CyclicLR a(*sgd, options), b(*adamw, options);
  for (int i = 0; i < 12; ++i) {
    ASSERT_EQ(group_lrs(*adamw), group_lrs(*sgd)) << i;
    ASSERT_EQ(group_momenta(*adamw), group_momenta(*sgd)) << i;
    a.step();
    b.step();
  }
  EXPECT_EQ(group_momenta(*sgd), (std::vector<double>{0.95, 0.9}));  // back at base_lr: max
  auto& beta2 = static_cast<torch::optim::AdamWOptions&>(adamw->param_groups()[0].options());
  EXPECT_EQ(std::get<1>(beta2.betas()), 0.999);
}

TEST(LRScheduler, ChainedErrors) {
  auto opt = two_group_sgd(), other = two_group_sgd();
  auto& o = *opt;
  using volt::ConfigError;
  SchedulerPtr a = std::make_shared<volt::ConstantLR>(o, 0.5);
  SchedulerPtr b = std::make_shared<volt::ExponentialLR>(o, 0.9);
  auto chain = [&](std::vector<SchedulerPtr> s) { volt::ChainedScheduler{std::move(s)}; };
  expect_error<ConfigError>([&] { chain({}); }, "[ChainedScheduler] no schedulers given");
  expect_error<ConfigError>([&] { chain({nullptr, a}); }, "scheduler 0 is null");
  expect_error<ConfigError>([&] { chain({a, nullptr}); }, "scheduler 1 is null");
  auto foreign = std::make_shared<volt::StepLR>(*other, 2);
  expect_error<ConfigError>([&] { chain({a, foreign}); }, "drives a different optimizer");
  auto plateau = std::make_shared<volt::ReduceLROnPlateau>(o);
  expect_error<ConfigError>(
      [&] {
        chain({a, plateau});
      },
      "is a ReduceLROnPlateau, which cannot be chained");
  auto seq =
      std::make_shared<volt::SequentialLR>(o, std::vector<SchedulerPtr>{b}, std::vector<int64_t>{});
  expect_error<ConfigError>([&] { chain({a, seq}); }, "is a SequentialLR, which cannot be chained");
  expect_error<ConfigError>([&] { chain({a, a}); }, "are the same object");
  auto stepped = std::make_shared<volt::StepLR>(o, 2);
  stepped->step();
  expect_error<ConfigError>([&] { chain({a, stepped}); }, "has already stepped 1 time(s)");
  auto chained = std::make_shared<volt::ChainedScheduler>(std::vector<SchedulerPtr>{a, b});
  // PyTorch's SequentialLR steps a chain with step(0), which it does not take.
  expect_error<ConfigError>(
      [&] {
        volt::SequentialLR(o, {std::make_shared<volt::LinearLR>(o), chained},
                           std::vector<int64_t>{3});
      },
      "is a ChainedScheduler, which cannot be chained");

  auto opt2 = two_group_sgd(), opt3 = two_group_sgd();
  volt::ChainedScheduler two({std::make_shared<volt::ExponentialLR>(*opt2, 0.9),
                              std::make_shared<volt::ExponentialLR>(*opt2, 0.8)});
  volt::ChainedScheduler one({std::make_shared<volt::ExponentialLR>(*opt3, 0.9)});
  expect_error<volt::CheckpointError>([&] { load_bytes(one, archive_bytes(two)); },
                                      "checkpoint chains 2 schedulers but this one chains 1");
}

TEST(LRScheduler, OptionsPrintEveryField) {
  std::ostringstream os;
  os << volt::LinearLROptions().start_factor(0.25) << "\n"
     << volt::OneCycleLROptions(std::vector<double>{0.5, 1e-7}, 100)
            .anneal_strategy(volt::AnnealStrategy::kLinear)
     << "\n"
     << volt::ReduceLROnPlateauOptions().mode(volt::PlateauMode::kMax).min_lr({0.01, 0.001}) << "\n"
     << volt::CyclicLROptions(0.001, 0.1).step_size_down(7.5).mode(volt::CyclicMode::kExpRange)
     << "\n"
     << volt::CyclicLROptions(0.001, 0.1).scale_fn([](double) { return 1.0; });
  const std::string s = os.str();
  // The lr lists print as every other number: std::to_string's "%f" wrote 1e-7 as 0.000000 until
  // session 90.
  for (const char* key : {"start_factor=0.25",
                          "end_factor=1",
                          "total_iters=5",
                          "max_lr={0.5, 1e-07}",
                          "total_steps=100",
                          "pct_start=0.3",
                          "anneal_strategy=linear",
                          "cycle_momentum=1",
                          "base_momentum=0.85",
                          "max_momentum=0.95",
                          "div_factor=25",
                          "final_div_factor=10000",
                          "three_phase=0",
                          "mode=max",
                          "factor=0.1",
                          "patience=10",
                          "threshold=0.0001",
                          "threshold_mode=rel",
                          "cooldown=0",
                          "min_lr={0.01, 0.001}",
                          "eps=1e-08",
                          "base_lr={0.001}",
                          "max_lr={0.1}",
                          "step_size_up=2000",
                          "step_size_down=7.5",
                          "step_size_down=None",
                          "mode=exp_range",
                          "gamma=1",
                          "scale_fn=None",
                          "scale_fn=custom",
                          "scale_mode=cycle",
                          "base_momentum={0.8}",
                          "max_momentum={0.9}"}) {
    EXPECT_NE(s.find(key), std::string::npos) << key << " missing in " << s;
  }
}

// ------------------------------------------------------------------------- Trainer-level

// TinyClassifier whose configure_optimizers comes from the test.
class ScheduledClassifier : public volt_test::TinyClassifier {
 public:
  using Configure = std::function<volt::OptimizerConfig(std::shared_ptr<torch::optim::SGD>)>;
  explicit ScheduledClassifier(Configure configure) : configure_(std::move(configure)) {}
  std::vector<volt::OptimizerConfig> configure_optimizers() override {
    return {configure_(std::make_shared<torch::optim::SGD>(
        parameters(), torch::optim::SGDOptions(0.1).momentum(0.9)))};
  }

 private:
  Configure configure_;
};

// Records the lr and momentum each optimizer step really uses.
struct LrProbe : volt::Callback {
  std::string state_key() const override { return "LrProbe"; }
  void on_before_optimizer_step(volt::RunContext&, volt::Module&,
                                torch::optim::Optimizer& o) override {
    auto& sgd = static_cast<torch::optim::SGDOptions&>(o.param_groups()[0].options());
    lrs.push_back(sgd.lr());
    momenta.push_back(sgd.momentum());
  }
  std::vector<double> lrs, momenta;
};

TEST(LRScheduler, TrainerStepsOneCycleEverySecondOptimizerStep) {
  volt_test::TempDir dir;
  const auto options = volt::OneCycleLROptions(0.5, 6).pct_start(0.5);
  ScheduledClassifier model([&](std::shared_ptr<torch::optim::SGD> opt) {
    return volt::OptimizerConfig(opt)
        .scheduler(std::make_shared<volt::OneCycleLR>(*opt, options))
        .interval(volt::Interval::kStep)
        .frequency(2);
  });
  auto probe = std::make_shared<LrProbe>();
  volt::Trainer t(volt_test::quiet(dir.path).max_steps(12).callbacks({probe}));
  t.fit(model, volt_test::loader(volt_test::blobs(160)));

  // The same schedule stepped by hand: optimizer step k (1-based) runs after (k-1)/2 steps.
  auto alone = std::make_shared<torch::optim::SGD>(std::vector<torch::Tensor>{torch::zeros({2})},
                                                   torch::optim::SGDOptions(0.1).momentum(0.9));
  volt::OneCycleLR ref(*alone, options);
  std::vector<double> lrs = {ref.last_lrs()[0]}, momenta = {group_momenta(*alone)[0]};
  for (int i = 0; i < 6; ++i) {
    ref.step();
    lrs.push_back(ref.last_lrs()[0]);
    momenta.push_back(group_momenta(*alone)[0]);
  }
  ASSERT_EQ(probe->lrs.size(), 12u);
  for (size_t k = 0; k < 12; ++k) {
    EXPECT_EQ(probe->lrs[k], lrs[k / 2]) << "optimizer step " << k + 1;
    EXPECT_EQ(probe->momenta[k], momenta[k / 2]) << "optimizer step " << k + 1;
  }
  EXPECT_NEAR(lrs[0], 0.5 / 25, 1e-15);  // PyTorch's cos anneal at pct 0 rounds too
  EXPECT_EQ(lrs[2], 0.5);                // the peak, at step pct_start * total_steps - 1 = 2
  EXPECT_LT(lrs[6], lrs[3]);
  EXPECT_EQ(momenta[2], 0.85);
}

TEST(LRScheduler, TrainerFeedsMonitoredMetricToReduceLROnPlateau) {
  volt_test::TempDir dir;
  // An absolute threshold of 1e9 makes every epoch after the first a bad one.
  const auto options =
      volt::ReduceLROnPlateauOptions().patience(0).factor(0.5).threshold(1e9).threshold_mode(
          volt::ThresholdMode::kAbs);
  std::shared_ptr<volt::ReduceLROnPlateau> plateau;
  auto configure = [&](std::string monitor) {
    return [&plateau, options, monitor](std::shared_ptr<torch::optim::SGD> opt) {
      plateau = std::make_shared<volt::ReduceLROnPlateau>(*opt, options);
      return volt::OptimizerConfig(opt).scheduler(plateau).monitor(monitor);
    };
  };
  ScheduledClassifier model(configure("val_loss"));
  auto probe = std::make_shared<LrProbe>();
  volt::Trainer t(
      volt_test::quiet(dir.path).max_epochs(3).limit_train_batches(2).callbacks({probe}));
  t.fit(model, volt_test::loader(volt_test::blobs(160)),
        volt_test::loader(volt_test::blobs(64, 8, 3), 32, false));
  EXPECT_EQ(probe->lrs, (std::vector<double>{0.1, 0.1, 0.1, 0.1, 0.05, 0.05}));
  ASSERT_TRUE(plateau);
  EXPECT_EQ(plateau->last_epoch(), 3);
  EXPECT_EQ(plateau->last_lrs(), (std::vector<double>{0.025}));

  ScheduledClassifier unmonitored(configure(""));
  volt::Trainer bad(volt_test::quiet(dir.path).max_epochs(1).limit_train_batches(2));
  try {
    bad.fit(unmonitored, volt_test::loader(volt_test::blobs(160)));
    ADD_FAILURE() << "ReduceLROnPlateau without monitor did not throw";
  } catch (const volt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("OptimizerConfig::monitor"), std::string::npos)
        << e.what();
  }
}

// A fit resumed from the last checkpoint of an epoch written by its last validation (at
// on_validation_end, val_check_interval 0.5) reaches that epoch's end without validating again:
// the epoch-interval ReduceLROnPlateau steps on the validation's value, which the checkpoint now
// holds. It was not logged there and the resume failed with a ConfigError (Lightning skips that
// step on a restart, so its schedule differs from the uninterrupted fit's).
TEST(LRScheduler, APlateauSchedulerResumesAfterTheEpochsLastValidationLikeTheUninterruptedFit) {
  volt_test::TempDir dir;
  const auto options =
      volt::ReduceLROnPlateauOptions().patience(0).factor(0.5).threshold(1e9).threshold_mode(
          volt::ThresholdMode::kAbs);
  const auto configure = [&](std::shared_ptr<torch::optim::SGD> opt) {
    return volt::OptimizerConfig(opt)
        .scheduler(std::make_shared<volt::ReduceLROnPlateau>(*opt, options))
        .monitor("val_loss");
  };
  const auto data = [] { return volt_test::loader(volt_test::blobs(128), 16, false); };
  const auto val = [] { return volt_test::loader(volt_test::blobs(64, 8, 3), 32, false); };
  const auto run = [&](const std::string& root, int64_t epochs, const std::string& ckpt) {
    torch::manual_seed(11);
    ScheduledClassifier model(configure);
    auto probe = std::make_shared<LrProbe>();
    auto last = std::make_shared<volt::ModelCheckpoint>(
        volt::ModelCheckpointOptions().dirpath(root + "/ckpt").save_last(true).save_top_k(0));
    volt::Trainer t(
        volt_test::quiet(root).max_epochs(epochs).val_check_interval(0.5).callbacks({probe, last}));
    t.fit(model, data(), val(), ckpt);
    return probe->lrs;
  };
  const auto whole = run(dir / "whole", 3, "");
  run(dir / "cut", 1, "");
  std::vector<double> resumed;
  ASSERT_NO_THROW(resumed = run(dir / "cut", 3, dir / "cut/ckpt/last.ckpt"));
  ASSERT_EQ(whole.size(), 24u);
  ASSERT_EQ(resumed.size(), 16u);
  EXPECT_EQ(std::vector<double>(whole.begin() + 8, whole.end()), resumed);
  EXPECT_LT(whole.back(), 0.1);  // the scheduler stepped
}

}  // namespace
