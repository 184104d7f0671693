#include "trainer/detail/metric_store.h"

#include <torch/torch.h>

namespace volt {
namespace detail {

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
  e.values.push_back(v);
  e.weights.push_back(weight);
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
    if (e.values.empty()) continue;
    auto vals = torch::stack(e.values).to(torch::kCPU, torch::kDouble).reshape({-1});
    const bool sync = e.sync_dist && across_ranks;
    double r = 0;
    switch (e.reduce) {
      case Reduce::kMean: {
        auto w = torch::tensor(e.weights, torch::kDouble);
        // (weighted sum, total weight): summed over ranks this is the exact global mean.
        auto sw = torch::stack({(vals * w).sum(), w.sum()});
        if (sync) sw = across_ranks(sw, Reduce::kSum);
        r = sw[0].item<double>() / std::max(1.0, sw[1].item<double>());
        break;
      }
      case Reduce::kSum:
      case Reduce::kMax:
      case Reduce::kMin: {
        auto local = e.reduce == Reduce::kSum   ? vals.sum()
                     : e.reduce == Reduce::kMax ? vals.max()
                                                : vals.min();
        if (sync) local = across_ranks(local, e.reduce);
        r = local.item<double>();
        break;
      }
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
    if (kv.second.values.empty()) continue;
    names.push_back(kv.first);
    torch::serialize::OutputArchive one;
    const auto& e = kv.second;
    at::Tensor values = torch::stack(e.values).to(torch::kCPU, torch::kDouble).reshape({-1});
    at::Tensor weights = torch::tensor(e.weights, torch::kLong);
    if (e.sync_dist && across_ranks) {
      // Every rank's values so far as one: (mean, total weight), or the sum, max or min.
      if (e.reduce == Reduce::kMean) {
        auto sw = across_ranks(torch::stack({(values * weights.to(torch::kDouble)).sum(),
                                             weights.sum().to(torch::kDouble)}),
                               Reduce::kSum);
        const double total = sw[1].item<double>();
        values = torch::tensor({sw[0].item<double>() / std::max(1.0, total)}, torch::kDouble);
        weights = torch::tensor({static_cast<int64_t>(total)}, torch::kLong);
      } else {
        const at::Tensor local = e.reduce == Reduce::kSum   ? values.sum()
                                 : e.reduce == Reduce::kMax ? values.max()
                                                            : values.min();
        values = across_ranks(local, e.reduce).reshape({1}).to(torch::kDouble);
        weights = torch::tensor({int64_t{1}}, torch::kLong);
      }
    }
    one.write("values", values);
    one.write("weights", weights);
    one.write("flags", c10::IValue(c10::List<int64_t>({static_cast<int64_t>(kv.second.reduce),
                                                       kv.second.prog_bar, kv.second.logger,
                                                       kv.second.sync_dist})));
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
    at::Tensor values, weights;
    c10::IValue flags_iv;
    one.read("values", values);
    one.read("weights", weights);
    one.read("flags", flags_iv);
    auto flags = flags_iv.toIntVector();
    if (!sync_dist_entries && flags.size() > 3 && flags[3] != 0) continue;
    auto& e = epoch_[name];
    for (int64_t j = 0; j < values.size(0); ++j) {
      e.values.push_back(values[j]);
      e.weights.push_back(weights[j].item<int64_t>());
    }
    e.reduce = static_cast<Reduce>(flags[0]);
    e.prog_bar = flags[1] != 0;
    e.logger = flags[2] != 0;
    e.sync_dist = flags.size() > 3 && flags[3] != 0;  // absent in checkpoints before sync_dist
  }
}

}  // namespace detail
}  // namespace volt
