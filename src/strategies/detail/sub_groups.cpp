#include "strategies/detail/sub_groups.h"

#include <unordered_set>

namespace volt {
namespace detail {

std::vector<std::vector<at::Tensor>> make_sub_groups(
    const torch::optim::Optimizer& optimizer, int64_t sub_group_size,
    const std::function<int64_t(const at::Tensor&)>& elements) {
  std::vector<std::vector<at::Tensor>> out(1);
  int64_t numel = 0;
  for (const auto& g : optimizer.param_groups()) {
    for (const auto& p : g.params()) {
      const int64_t n = elements(p);
      if (!out.back().empty() && numel + n > sub_group_size) {
        out.emplace_back();
        numel = 0;
      }
      out.back().push_back(p);
      numel += n;
    }
  }
  if (out.back().empty()) out.pop_back();
  return out;
}

NarrowedParams::NarrowedParams(torch::optim::Optimizer& optimizer) : optimizer_(optimizer) {
  for (auto& g : optimizer_.param_groups()) saved_.push_back(g.params());
}

NarrowedParams::~NarrowedParams() {
  auto& groups = optimizer_.param_groups();
  for (size_t g = 0; g < groups.size() && g < saved_.size(); ++g) groups[g].params() = saved_[g];
}

void NarrowedParams::narrow(const std::vector<at::Tensor>& keep) {
  std::unordered_set<const c10::TensorImpl*> mine;
  for (const auto& k : keep) mine.insert(k.unsafeGetTensorImpl());
  auto& groups = optimizer_.param_groups();
  for (size_t g = 0; g < groups.size() && g < saved_.size(); ++g) {
    std::vector<at::Tensor> kept;
    for (const auto& p : saved_[g]) {
      if (mine.count(p.unsafeGetTensorImpl()) != 0) kept.push_back(p);
    }
    groups[g].params() = std::move(kept);
  }
}

bool step_by_sub_groups(torch::optim::Optimizer& optimizer, int64_t sub_group_size,
                        const std::function<bool()>& step, const SubGroupHooks& hooks) {
  const auto groups =
      make_sub_groups(optimizer, sub_group_size, [](const at::Tensor& p) { return p.numel(); });
  const auto call = [&](const std::function<void(const std::vector<at::Tensor>&)>& hook, size_t i) {
    if (hook) hook(groups[i]);
  };
  bool ok = true;
  NarrowedParams narrowed(optimizer);
  if (!groups.empty()) call(hooks.read, 0);
  for (size_t i = 0; i < groups.size(); ++i) {
    call(hooks.ready, i);
    if (i + 1 < groups.size()) call(hooks.read, i + 1);  // in flight while sub-group i steps
    narrowed.narrow(groups[i]);
    ok = step() && ok;
    call(hooks.after, i);
  }
  return ok;
}

}  // namespace detail
}  // namespace volt
