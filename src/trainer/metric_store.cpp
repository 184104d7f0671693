#include "trainer/detail/metric_store.h"

#include <torch/torch.h>

#include "volt/core/check.h"

namespace volt {
namespace detail {
namespace {

const char* name_of(Reduce r) {
  constexpr const char* kNames[] = {"mean", "sum", "max", "min"};  // Reduce's order
  return kNames[static_cast<int>(r)];
}

}  // namespace

void MetricStore::add_step(const std::string& key, const at::Tensor& v, bool prog_bar,
                           bool logger) {
  auto& e = step_[key];
  e.value = v;
  e.prog_bar = prog_bar;
  e.logger = logger;
}

void MetricStore::add_epoch(const std::string& key, const at::Tensor& v, int64_t weight,
                            Reduce reduce, bool prog_bar, bool logger, bool sync_dist) {
  auto& e = epoch_[key];
  VOLT_CHECK(e.count == 0 || e.reduce == reduce, ConfigError, "[Module] log(\"", key,
             "\") with reduce=", name_of(reduce), " after reduce=", name_of(e.reduce),
             " in the same epoch: one name has one reduction; log the other under its own name.");
  // Out of place: the entry may have been made under inference mode (an evaluation hook).
  const at::Tensor d = v.detach().to(at::kDouble).reshape({});
  if (e.count == 0) {
    e.acc = reduce == Reduce::kMean ? d * static_cast<double>(weight) : d;
  } else {
    if (e.acc.device() != d.device()) e.acc = e.acc.to(d.device());
    switch (reduce) {
      case Reduce::kMean: e.acc = e.acc + d * static_cast<double>(weight); break;
      case Reduce::kSum: e.acc = e.acc + d; break;
      case Reduce::kMax: e.acc = at::maximum(e.acc, d); break;
      case Reduce::kMin: e.acc = at::minimum(e.acc, d); break;
    }
  }
  e.weight += static_cast<double>(weight);
  ++e.count;
  e.reduce = reduce;
  e.prog_bar = prog_bar;
  e.logger = logger;
  e.sync_dist = sync_dist;
}

Metrics MetricStore::reduce_epoch(Metrics* prog_bar, Metrics* for_logger,
                                  const CrossRankReduce& across_ranks) {
  Metrics out;
  for (auto& kv : epoch_) {
    const auto& e = kv.second;
    if (e.count == 0) continue;
    const at::Tensor acc = e.acc.to(torch::kCPU);
    const bool sync = e.sync_dist && across_ranks;
    double r = 0;
    if (e.reduce == Reduce::kMean) {
      // (weighted sum, total weight): summed over ranks this is the exact global mean.
      auto sw = torch::stack({acc, torch::scalar_tensor(e.weight, torch::kDouble)});
      if (sync) sw = across_ranks(sw, Reduce::kSum);
      r = sw[0].item<double>() / std::max(1.0, sw[1].item<double>());
    } else {
      r = (sync ? across_ranks(acc, e.reduce) : acc).item<double>();
    }
    out[kv.first] = r;
    if (prog_bar && e.prog_bar) (*prog_bar)[kv.first] = r;
    if (for_logger && e.logger) (*for_logger)[kv.first] = r;
  }
  epoch_.clear();
  return out;
}

Metrics MetricStore::step_values(bool only_logger, bool only_prog_bar) const {
  Metrics out;
  for (const auto& kv : step_) {
    if (only_logger && !kv.second.logger) continue;
    if (only_prog_bar && !kv.second.prog_bar) continue;
    out[kv.first] = kv.second.value.item<double>();
  }
  return out;
}

void MetricStore::save(torch::serialize::OutputArchive& ar,
                       const CrossRankReduce& across_ranks) const {
  c10::List<std::string> names;
  for (const auto& kv : epoch_) {
    const auto& e = kv.second;
    if (e.count == 0) continue;
    names.push_back(kv.first);
    at::Tensor acc = e.acc.to(torch::kCPU).reshape({1});
    double weight = e.weight;
    if (e.sync_dist && across_ranks) {
      // Every rank's running reduction so far as one (the weighted sums and weights summed).
      if (e.reduce == Reduce::kMean) {
        const auto sw =
            across_ranks(torch::cat({acc, torch::tensor({weight}, torch::kDouble)}), Reduce::kSum);
        acc = sw.narrow(0, 0, 1);
        weight = sw[1].item<double>();
      } else {
        acc = across_ranks(acc, e.reduce);
      }
    }
    torch::serialize::OutputArchive one;
    one.write("running",
              torch::cat({acc.to(torch::kDouble),
                          torch::tensor({weight, static_cast<double>(e.count)}, torch::kDouble)}));
    one.write("flags", c10::IValue(c10::List<int64_t>(
                           {static_cast<int64_t>(e.reduce), e.prog_bar, e.logger, e.sync_dist})));
    ar.write("m_" + kv.first, one);
  }
  ar.write("names", c10::IValue(names));
}

void MetricStore::load(torch::serialize::InputArchive& ar, bool sync_dist_entries) {
  clear();
  c10::IValue names_iv;
  ar.read("names", names_iv);
  auto names = c10::impl::toTypedList<std::string>(names_iv.toList());
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string name = names.get(i);
    torch::serialize::InputArchive one;
    ar.read("m_" + name, one);
    c10::IValue flags_iv;
    one.read("flags", flags_iv);
    auto flags = flags_iv.toIntVector();
    const bool sync_dist = flags.size() > 3 && flags[3] != 0;  // absent before sync_dist
    if (!sync_dist_entries && sync_dist) continue;
    EpochEntry e;
    e.reduce = static_cast<Reduce>(flags[0]);
    e.prog_bar = flags[1] != 0;
    e.logger = flags[2] != 0;
    e.sync_dist = sync_dist;
    at::Tensor running;
    if (one.try_read("running", running)) {
      e.acc = running[0].clone();
      e.weight = running[1].item<double>();
      e.count = static_cast<int64_t>(running[2].item<double>());
    } else {
      // Checkpoints before session 99 hold every value and its weight: folded here.
      at::Tensor values, weights;
      one.read("values", values);
      one.read("weights", weights);
      for (int64_t j = 0; j < values.size(0); ++j) {
        add_epoch(name, values[j], weights[j].item<int64_t>(), e.reduce, e.prog_bar, e.logger,
                  e.sync_dist);
      }
      continue;
    }
    if (e.count > 0) epoch_[name] = std::move(e);
  }
}

}  // namespace detail
}  // namespace volt
