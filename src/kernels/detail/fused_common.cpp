#include "fused_common.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/detail/numbers.h"
#include "fused_cuda.h"
#include "volt/core/check.h"

namespace volt {
namespace detail {
namespace {

// State offsets are padded to 64 bytes so each parameter's state starts on a cache line.
constexpr int64_t kAlignBytes = 64;

int64_t padded(int64_t numel, int64_t elem_size) {
  const int64_t per_line = kAlignBytes / elem_size;
  return (numel + per_line - 1) / per_line * per_line;
}

}  // namespace

std::string fusable_reason(const char* component, const char* reference, const char* what,
                           const at::Tensor& t, bool* device) {
  if (device) *device = false;
  const bool on_cpu = t.device().is_cpu();
  const bool strided = t.layout() == c10::kStrided;
  const auto dt = t.scalar_type();
  const bool floating = dt == c10::kFloat || dt == c10::kDouble || dt == c10::kBFloat16;
  // Hot path (every parameter, every step): no message, no allocation.
  if (on_cpu && strided && floating && t.is_contiguous()) return {};

  auto os = detail::c_stream<std::ostringstream>();
  os << "[" << component << "] a " << what;
  if (!on_cpu) {
    if (device) *device = true;
    os << " is on " << t.device() << "; "
       << "the fused kernels run on CPU and CUDA tensors only"
       << "; use " << reference << ".";
  } else if (!strided) {
    os << " has layout " << t.layout()
       << " (sparse gradients are not supported); use dense gradients, e.g. nn::Embedding "
          "without sparse=true, or "
       << reference << ".";
  } else if (!floating) {
    os << " of shape " << t.sizes() << " has dtype " << dt
       << "; the fused kernels support float32, float64 and bfloat16. Convert the model to one of "
          "them, or use "
       << reference << ".";
  } else {
    os << " of shape " << t.sizes() << " (strides " << t.strides()
       << ") is not contiguous; the fused kernels need contiguous tensors. Make the parameter "
          "contiguous once before creating the optimizer.";
  }
  return os.str();
}

void check_fusable(const char* component, const char* reference, const at::Tensor& p,
                   const at::Tensor& grad) {
  if (p.is_cuda()) {
    const std::string why = cuda_fusable_reason(component, reference, p, grad);
    if (why.empty()) return;
    if (!fused_cuda_available()) throw NotAvailable(why);
    throw ValueError(why);
  }
  for (auto* item : {&p, &grad}) {
    bool device = false;
    const std::string why =
        fusable_reason(component, reference, item == &p ? "parameter" : "gradient", *item, &device);
    if (why.empty()) continue;
    if (device) throw NotAvailable(why);
    throw ValueError(why);
  }
  VOLT_CHECK(grad.scalar_type() == p.scalar_type() && grad.sizes().equals(p.sizes()), ValueError,
             "[", component, "] a parameter of shape ", p.sizes(), " and dtype ", p.scalar_type(),
             " has a gradient of shape ", grad.sizes(), " and dtype ", grad.scalar_type(),
             "; gradients must match their parameter.");
}

Overlap find_overlap(const std::vector<at::Tensor>& tensors) {
  std::unordered_set<const c10::TensorImpl*> seen;
  // The bytes each tensor spans in its storage: two tensors over the same memory would be
  // written by different threads from the same old values, the last write winning (torch's
  // loop applies both).
  std::map<const void*, std::vector<std::pair<int64_t, int64_t>>> spans;
  for (const auto& t : tensors) {
    if (!seen.insert(t.unsafeGetTensorImpl()).second) return Overlap::kSame;
    if (!t.has_storage() || t.numel() == 0) continue;
    int64_t extent = 1;  // elements from the first to one past the last
    for (int64_t d = 0; d < t.dim(); ++d) extent += (t.size(d) - 1) * std::abs(t.stride(d));
    const int64_t begin = t.storage_offset() * static_cast<int64_t>(t.element_size());
    spans[t.storage().unsafeGetStorageImpl()].emplace_back(
        begin, begin + extent * static_cast<int64_t>(t.element_size()));
  }
  for (auto& [storage, list] : spans) {
    std::sort(list.begin(), list.end());
    for (size_t i = 1; i < list.size(); ++i) {
      if (list[i].first < list[i - 1].second) return Overlap::kShared;
    }
  }
  return Overlap::kNone;
}

void check_params_unique(const char* component,
                         const std::vector<torch::optim::OptimizerParamGroup>& groups) {
  std::vector<at::Tensor> params;
  for (const auto& group : groups) {
    for (const auto& p : group.params()) params.push_back(p);
  }
  const Overlap overlap = find_overlap(params);
  VOLT_CHECK(overlap != Overlap::kSame, ConfigError, "[", component,
             "] a parameter appears more than once in the param groups; its fused updates "
             "would race. Pass each parameter once.");
  VOLT_CHECK(overlap != Overlap::kShared, ConfigError, "[", component,
             "] two parameters share memory (a weight tied with set_data, or overlapping "
             "views of one buffer); their fused updates would race. Tie weights by "
             "assigning the same tensor (each then appears once), or give each its own "
             "memory.");
}

void sync_layouts(const char* component, std::vector<FlatLayout>& layouts,
                  const std::vector<torch::optim::OptimizerParamGroup>& groups, int num_kinds) {
  if (layouts.size() < groups.size()) layouts.resize(groups.size());
  bool rebuilt = false;
  for (size_t g = 0; g < groups.size(); ++g) {
    rebuilt = layouts[g].sync(groups[g].params(), num_kinds) || rebuilt;
  }
  if (!rebuilt) return;
  try {
    check_params_unique(component, groups);
  } catch (...) {
    layouts.clear();  // so the next step checks again
    throw;
  }
}

bool FlatLayout::sync(const std::vector<at::Tensor>& params, int num_kinds) {
  const size_t n = params.size();
  bool same = impls_.size() == n;
  for (size_t i = 0; same && i < n; ++i) {
    same = impls_[i] == params[i].unsafeGetTensorImpl() && numels_[i] == params[i].numel() &&
           dtypes_[i] == params[i].scalar_type();
  }
  if (same) return false;
  impls_.assign(n, nullptr);
  numels_.assign(n, 0);
  dtypes_.assign(n, c10::kFloat);
  keys_.clear();
  slots_.assign(n, FlatSlot{});
  banks_.clear();
  for (size_t i = 0; i < n; ++i) {
    const auto& p = params[i];
    impls_[i] = p.unsafeGetTensorImpl();
    numels_[i] = p.numel();
    dtypes_[i] = p.scalar_type();
    keys_.push_back(state_key_for(p));
    int bank = -1;
    for (size_t b = 0; b < banks_.size(); ++b) {
      if (banks_[b].dtype == dtypes_[i]) bank = static_cast<int>(b);
    }
    if (bank < 0) {
      banks_.push_back(Bank{dtypes_[i], 0, std::vector<at::Tensor>(num_kinds)});
      bank = static_cast<int>(banks_.size()) - 1;
    }
    slots_[i] = FlatSlot{bank, banks_[bank].numel, numels_[i]};
    banks_[bank].numel += padded(numels_[i], c10::elementSize(dtypes_[i]));
  }
  return true;
}

void* FlatLayout::data(size_t i, int kind) {
  const FlatSlot& s = slots_[i];
  Bank& bank = banks_[s.bank];
  at::Tensor& buf = bank.buffers[kind];
  if (!buf.defined()) buf = at::zeros({bank.numel}, at::TensorOptions().dtype(bank.dtype));
  return static_cast<char*>(buf.data_ptr()) + s.offset * c10::elementSize(bank.dtype);
}

bool FlatLayout::is_view(const at::Tensor& t, size_t i, int kind) const {
  const FlatSlot& s = slots_[i];
  const Bank& bank = banks_[s.bank];
  const at::Tensor& buf = bank.buffers[kind];
  return t.defined() && buf.defined() && t.scalar_type() == bank.dtype && t.numel() == s.numel &&
         t.data_ptr() ==
             static_cast<char*>(buf.data_ptr()) + s.offset * c10::elementSize(bank.dtype) &&
         t.is_contiguous();
}

at::Tensor FlatLayout::view(size_t i, int kind, const at::Tensor& p) {
  data(i, kind);  // allocates the buffer on first use
  const FlatSlot& s = slots_[i];
  return banks_[s.bank].buffers[kind].narrow(0, s.offset, s.numel).view(p.sizes());
}

void bind_state(const char* component, const char* name, at::Tensor& t, FlatLayout& layout,
                size_t i, int kind, const at::Tensor& p, bool zero_if_undefined) {
  if (layout.is_view(t, i, kind)) return;
  at::NoGradGuard no_grad;
  at::Tensor v = layout.view(i, kind, p);
  if (t.defined()) {
    VOLT_CHECK(t.numel() == p.numel(), CheckpointError, "[", component, "] state '", name,
               "' has shape ", t.sizes(), " but its parameter has shape ", p.sizes(),
               "; load optimizer state saved for the same model.");
    v.view(-1).copy_(t.reshape(-1));
  } else if (zero_if_undefined) {
    v.zero_();
  }
  t = v;
}

at::Tensor standalone(const at::Tensor& t) {
  return t.defined() ? t.clone(at::MemoryFormat::Contiguous) : t;
}

void throw_missing(const char* component, const char* name) {
  throw CheckpointError(str_cat("[", component, "] the saved optimizer state has no '", name,
                                "'; load state written by ", component,
                                " or by the matching torch::optim optimizer."));
}

void write_tensor(torch::serialize::OutputArchive& archive, const char* name, const at::Tensor& t) {
  if (t.defined()) archive.write(name, c10::IValue(standalone(t)));
}

at::Tensor read_tensor(torch::serialize::InputArchive& archive, const char* name) {
  c10::IValue v;
  return archive.try_read(name, v) ? v.toTensor() : at::Tensor();
}

bool equal_or_undefined(const at::Tensor& a, const at::Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  return a.equal(b);
}

at::Tensor run_closure(const torch::optim::Optimizer::LossClosure& closure) {
  if (closure == nullptr) return {};
  at::AutoGradMode enable_grad(true);
  return closure();
}

}  // namespace detail
}  // namespace volt
