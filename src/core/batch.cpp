#include "volt/core/batch.h"

#include <torch/torch.h>

#include "volt/core/check.h"

namespace volt {

namespace {
// Lightning's extract_batch_size for one tensor: a 0-dim tensor is one sample.
int64_t samples_of(const at::Tensor& t) {
  return t.dim() > 0 ? t.size(0) : 1;
}
}  // namespace

// The samples of a batch, weighting epoch-level means (and counted by ThroughputMonitor): the
// input's, else a combined batch's parts' sum, else the first tensor there is (target, then the
// extra entries by name), as Lightning's extract_batch_size takes the first tensor it finds. A
// 0-dim input and a batch holding its data in `extra` counted 0 samples, so every on_epoch
// mean of their runs was 0.
int64_t Batch::size() const {
  if (input.defined()) return samples_of(input);
  const auto parts = part_names();
  if (!parts.empty()) {
    int64_t n = 0;
    for (const auto& name : parts) n += part(name).size();
    return n;
  }
  if (target.defined()) return samples_of(target);
  for (const auto& kv : extra) {
    if (kv.second.defined()) return samples_of(kv.second);
  }
  return 0;
}

std::vector<std::string> Batch::part_names() const {
  std::vector<std::string> out;
  for (const auto& kv : extra) {
    const auto slash = kv.first.find('/');
    if (slash == std::string::npos || slash == 0) continue;
    std::string name = kv.first.substr(0, slash);
    if (out.empty() || out.back() != name) out.push_back(std::move(name));  // keys are sorted
  }
  return out;
}

namespace {

// The extra entries of part `name`: [first, last) of the sorted map.
template <typename Map>
std::pair<typename Map::const_iterator, typename Map::const_iterator> part_range(
    const Map& extra, const std::string& name) {
  const std::string prefix = name + "/";
  auto first = extra.lower_bound(prefix);
  auto last = first;
  while (last != extra.end() && last->first.compare(0, prefix.size(), prefix) == 0) ++last;
  return {first, last};
}

}  // namespace

bool Batch::has_part(const std::string& name) const {
  const auto r = part_range(extra, name);
  return !name.empty() && r.first != r.second;
}

Batch Batch::part(const std::string& name) const {
  const auto r = part_range(extra, name);
  if (name.empty() || r.first == r.second) {
    const auto names = part_names();
    std::string list;
    for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
    throw ValueError(detail::str_cat(
        "[Batch] this batch has no part '", name, "' (",
        names.empty() ? std::string("it is not a combined loader's batch") : "its parts: " + list,
        "); a CombineMode::kMaxSize loader that has run out is absent from the epoch's later "
        "batches: check has_part() first."));
  }
  Batch out;
  for (auto it = r.first; it != r.second; ++it) {
    const std::string key = it->first.substr(name.size() + 1);
    if (key == "input") {
      out.input = it->second;
    } else if (key == "target") {
      out.target = it->second;
    } else {
      out.extra.emplace(key, it->second);
    }
  }
  return out;
}

Batch Batch::to(const c10::Device& device, bool non_blocking) const {
  Batch out;
  auto move = [&](const at::Tensor& t) { return t.defined() ? t.to(device, non_blocking) : t; };
  out.input = move(input);
  out.target = move(target);
  for (const auto& kv : extra) out.extra.emplace(kv.first, move(kv.second));
  return out;
}

Batch Batch::pin_memory() const {
  Batch out;
  auto pin = [](const at::Tensor& t) { return t.defined() ? t.pin_memory() : t; };
  out.input = pin(input);
  out.target = pin(target);
  for (const auto& kv : extra) out.extra.emplace(kv.first, pin(kv.second));
  return out;
}

}  // namespace volt
