#pragma once
// The optimizer step sub-group by sub-group (ZeRO-Infinity, arXiv 2104.07857; issue #12): the
// optimizer's parameters are cut into sub-groups of about `sub_group_size` elements and the
// optimizer steps each one alone, with its param groups narrowed to it, so that what a step
// needs in memory (swapped optimizer state, swapped parameter chunks) is one or two
// sub-groups', not the shard's. OptimizerSwapper adds its state swapping around the same steps;
// step_by_sub_groups() is the step for optimizer state that stays in memory.

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace volt {
namespace detail {

/// What a step does around each sub-group; each hook gets the sub-group's parameters (what the
/// optimizer steps) and may be empty.
struct SubGroupHooks {
  /// One sub-group ahead (while the previous one steps): submit the reads the sub-group needs
  /// (ZeRO-Infinity's parameter chunks), to overlap the current step.
  std::function<void(const std::vector<at::Tensor>&)> read;
  /// Right before the sub-group steps: wait for what `read` submitted.
  std::function<void(const std::vector<at::Tensor>&)> ready;
  /// After it stepped, while its parameters are still in memory (where stepped masters are
  /// rounded into the model and the chunks written back).
  std::function<void(const std::vector<at::Tensor>&)> after;
};

/// Cuts `optimizer`'s parameters, in param-group order, into sub-groups of at most
/// `sub_group_size` elements as counted by `elements` (a parameter swapped out holds none: count
/// its recorded shape); a sub-group holds at least one parameter and never splits one. Unlike
/// DeepSpeed's (_create_fp16_sub_groups: within each param group, a sub-group closed once it
/// reaches sub_group_size, keeping the parameter that crosses it), a sub-group may span param
/// groups and is closed before a parameter would take it past the size: the same steps for
/// element-wise optimizers, other counts and peak memory.
std::vector<std::vector<at::Tensor>> make_sub_groups(
    const torch::optim::Optimizer& optimizer, int64_t sub_group_size,
    const std::function<int64_t(const at::Tensor&)>& elements);

/// Narrows every param group of an optimizer to some of its parameters; restores the full lists
/// however the scope ends.
class NarrowedParams {
 public:
  explicit NarrowedParams(torch::optim::Optimizer& optimizer);
  ~NarrowedParams();
  NarrowedParams(const NarrowedParams&) = delete;
  NarrowedParams& operator=(const NarrowedParams&) = delete;
  /// Each group keeps only its parameters that are in `keep` (none when it is empty).
  void narrow(const std::vector<at::Tensor>& keep);

 private:
  torch::optim::Optimizer& optimizer_;
  std::vector<std::vector<at::Tensor>> saved_;
};

/// Runs `step` (which calls optimizer.step()) once per sub-group of `sub_group_size` elements,
/// with the param groups narrowed to it, `hooks.read` one sub-group ahead, `ready` before and
/// `after` after each step. For optimizer state that stays in memory (elementwise optimizers:
/// Adam, AdamW, SGD step each parameter alone, so the result is the same as one step). Returns
/// whether every call returned true.
bool step_by_sub_groups(torch::optim::Optimizer& optimizer, int64_t sub_group_size,
                        const std::function<bool()>& step, const SubGroupHooks& hooks);

}  // namespace detail
}  // namespace volt
