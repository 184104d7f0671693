// The stacked all_gather and its backward (a sum over the ranks, this rank's slice).
#include "volt/distributed/functional.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <memory>
#include <string>
#include <utility>

#include "distributed/detail/stacked_gather.h"
#include "volt/core/types.h"
#include "volt/distributed/process_group.h"

namespace volt {
namespace detail {
namespace {

// d(stack of every rank's value)/d(this rank's value): each rank's loss sends a gradient for
// every slice; this rank's value gets the sum over the ranks of the gradients for its slice.
class AllGatherBackward : public torch::autograd::Node {
 public:
  AllGatherBackward(std::function<at::Tensor(const at::Tensor&)> sum, int64_t rank,
                    std::vector<int64_t> shape, at::TensorOptions options)
      : sum_(std::move(sum)), rank_(rank), shape_(std::move(shape)), options_(options) {}
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    // A rank whose result got no gradient still takes part in the collective (with zeros).
    const at::Tensor g = grads[0].defined() ? grads[0] : at::zeros(shape_, options_);
    return {sum_(g.contiguous()).select(0, rank_)};
  }
  std::string name() const override { return "volt::AllGatherBackward"; }

 private:
  std::function<at::Tensor(const at::Tensor&)> sum_;
  int64_t rank_;
  std::vector<int64_t> shape_;
  at::TensorOptions options_;
};

}  // namespace

at::Tensor stacked_all_gather(const at::Tensor& value, bool sync_grads,
                              const GatherCollectives& collectives) {
  at::Tensor out;
  {
    c10::NoGradGuard no_grad;
    out = at::stack(collectives.gather(value.detach()));
  }
  if (!sync_grads || !value.requires_grad() || !c10::GradMode::is_enabled()) return out;
  std::shared_ptr<AllGatherBackward> node(
      new AllGatherBackward(collectives.sum, collectives.rank, out.sizes().vec(), out.options()),
      torch::autograd::deleteNode);
  node->set_next_edges(torch::autograd::collect_next_edges(value));
  torch::autograd::create_gradient_edge(out, node);
  return out;
}

}  // namespace detail

at::Tensor all_gather(ProcessGroup& group, const at::Tensor& value, bool sync_grads) {
  detail::GatherCollectives c;
  c.gather = [&group](const at::Tensor& v) { return group.all_gather(v); };
  // The result's backward uses `group`: it must live until that backward has run.
  c.sum = [&group](const at::Tensor& g) { return group.all_reduce(g, Reduce::kSum); };
  c.rank = group.rank();
  return detail::stacked_all_gather(value, sync_grads, c);
}

}  // namespace volt
