#pragma once
// What FusedSGD, FusedAdamW and FusedClipNorm share: input checks, the flat state layout of a
// param group, and binding per-parameter state objects to views of it.

#include <ATen/core/Tensor.h>
#include <c10/core/TensorImpl.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <cstdint>
#include <string>
#include <typeinfo>
#include <vector>

#include "core/detail/state_key.h"
#include "volt/core/check.h"

namespace volt {
namespace detail {

/// Why `t` cannot go through the fused CPU kernels ("" when it can). `what` names it in the
/// message ("parameter", "gradient"), `reference` is the libtorch alternative the message
/// suggests; *device is set when the problem is the device.
std::string fusable_reason(const char* component, const char* reference, const char* what,
                           const at::Tensor& t, bool* device = nullptr);

/// Throws (NotAvailable for the device, ValueError otherwise) unless p and grad are contiguous
/// dense float/double CPU tensors of the same dtype and shape, or CUDA tensors the fused CUDA
/// kernels take (cuda_fusable_reason in fused_cuda.h).
void check_fusable(const char* component, const char* reference, const at::Tensor& p,
                   const at::Tensor& grad);

/// Whether two of `tensors` write the same memory: kSame for one tensor listed twice, kShared
/// for two tensors over overlapping bytes of one storage (a weight tied with set_data,
/// overlapping views). The fused kernels would write such memory from two threads at once.
enum class Overlap { kNone, kSame, kShared };
Overlap find_overlap(const std::vector<at::Tensor>& tensors);

/// Throws ConfigError when a parameter appears twice across `groups`: the fused kernels would
/// update it twice in parallel (a data race), so the optimizers refuse that.
void check_params_unique(const char* component,
                         const std::vector<torch::optim::OptimizerParamGroup>& groups);

/// Group `index`'s options as the optimizer's own type `Options` (named `options_name` in the
/// message); ConfigError when the group carries another optimizer's options.
template <typename Options>
Options& group_options(const char* component, const char* options_name,
                       torch::optim::OptimizerParamGroup& group, size_t index) {
  auto* o = dynamic_cast<Options*>(&group.options());
  VOLT_CHECK(o != nullptr, ConfigError, "[", component, "] param group ", index,
             " has options of type ", typeid(group.options()).name(),
             "; give each OptimizerParamGroup ", options_name, ", or none to use the defaults.");
  return *o;
}

/// The state stored under `key` as the optimizer's own type `State` (named `state_name`), or
/// nullptr when there is none; ValueError when it is another optimizer's state (p: its
/// parameter, for the message).
template <typename State>
State* find_state(const char* component, const char* state_name, OptimizerStateMap& state,
                  const OptimizerStateKey& key, const at::Tensor& p) {
  auto it = state.find(key);
  if (it == state.end()) return nullptr;
  auto* st = dynamic_cast<State*>(it->second.get());
  VOLT_CHECK(st != nullptr, ValueError, "[", component, "] the state of a parameter of shape ",
             p.sizes(), " has type ", typeid(*it->second).name(), ", not ", state_name,
             "; restore state with volt::load_optimizer_state or torch::load into this "
             "optimizer.");
  return st;
}

/// A step's closure, run with gradients enabled as torch::optim does; undefined without one.
at::Tensor run_closure(const torch::optim::Optimizer::LossClosure& closure);

/// Where one parameter's state lives inside its group's flat buffers.
struct FlatSlot {
  int bank = -1;       // index into the banks (one per dtype, in order of first appearance)
  int64_t offset = 0;  // first element inside the bank (padded to 64-byte boundaries)
  int64_t numel = 0;
};

/// The flat state of one param group: per dtype one bank, per state kind one contiguous buffer
/// holding every parameter's state back to back. Rebuilt only when the group's parameters
/// change (identity, size or dtype); state objects are then re-bound by bind_state().
class FlatLayout {
 public:
  /// Makes the layout match `params` (a pointer comparison when nothing changed). Returns true
  /// when it was rebuilt; the old buffers stay alive for as long as views of them do.
  bool sync(const std::vector<at::Tensor>& params, int num_kinds);
  /// libtorch's state key of parameter `i` (cached: building it formats a pointer).
  const OptimizerStateKey& key(size_t i) const { return keys_[i]; }
  /// Address of parameter i's state of `kind`, allocating the kind's buffers (zeros) first.
  void* data(size_t i, int kind);
  /// True when `t` is exactly the view of (i, kind) (pointer, size and dtype test).
  bool is_view(const at::Tensor& t, size_t i, int kind) const;
  /// The view of (i, kind) shaped like `p`.
  at::Tensor view(size_t i, int kind, const at::Tensor& p);

 private:
  struct Bank {
    c10::ScalarType dtype;
    int64_t numel = 0;
    std::vector<at::Tensor> buffers;  // per kind; undefined until first use
  };
  std::vector<const c10::TensorImpl*> impls_;
  std::vector<int64_t> numels_;
  std::vector<c10::ScalarType> dtypes_;
  std::vector<OptimizerStateKey> keys_;
  std::vector<FlatSlot> slots_;
  std::vector<Bank> banks_;
};

/// Step start of a fused optimizer: one layout per group, each synced to its group's
/// parameters; after any rebuild the parameters are checked to be unique (check_params_unique).
void sync_layouts(const char* component, std::vector<FlatLayout>& layouts,
                  const std::vector<torch::optim::OptimizerParamGroup>& groups, int num_kinds);

/// Makes `t` (a state object's tensor) the view of (i, kind): nothing when it already is;
/// otherwise copies its values in (zeros if `t` is undefined and `zero_if_undefined`), e.g.
/// after a checkpoint load or a layout rebuild. Throws CheckpointError when `t` has a different
/// number of elements than parameter `p`.
void bind_state(const char* component, const char* name, at::Tensor& t, FlatLayout& layout,
                size_t i, int kind, const at::Tensor& p, bool zero_if_undefined);

/// Contiguous standalone copy of a state view for serialisation (undefined stays undefined).
at::Tensor standalone(const at::Tensor& t);

// State and options are written as IValues under libtorch's own names, so archives written by
// torch::optim::AdamW/SGD load into the fused optimizers and back.

[[noreturn]] void throw_missing(const char* component, const char* name);

/// Reads `name`; throws CheckpointError naming it when it is missing.
template <typename T>
T read_required(torch::serialize::InputArchive& archive, const char* component, const char* name) {
  c10::IValue v;
  if (!archive.try_read(name, v)) throw_missing(component, name);
  return v.to<T>();
}
/// Writes a standalone copy of `t`; undefined tensors are left out, as libtorch does.
void write_tensor(torch::serialize::OutputArchive& archive, const char* name, const at::Tensor& t);
/// The tensor saved under `name`, or an undefined tensor.
at::Tensor read_tensor(torch::serialize::InputArchive& archive, const char* name);
bool equal_or_undefined(const at::Tensor& a, const at::Tensor& b);

}  // namespace detail
}  // namespace volt
