#include "volt/precision/fp8_modules.h"

#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>
#include <torch/torch.h>

#include <map>
#include <mutex>
#include <ostream>
#include <unordered_map>

#include "core/detail/fp8_state.h"
#include "core/detail/numbers.h"
#include "core/detail/print.h"
#include "detail/fp8_hooks.h"
#include "detail/linear_policy.h"
#include "detail/quiet_dispatcher.h"
#include "volt/core/check.h"
#include "volt/core/log.h"
#include "volt/precision/autocast.h"

namespace volt {
namespace detail {
namespace {

thread_local bool t_fp8_enabled = false;

// What a non-fp8 GEMM gets inside an fp8 region, per op (Fp8GemmOp): -1 = autocast's dtype
// under the CPU size rule (the built-in policy when no rule is installed), else a ScalarType.
std::atomic<int> g_fallback[3] = {{-1}, {-1}, {-1}};

using WeightKey = std::pair<const c10::StorageImpl*, int64_t>;
WeightKey key_of(const at::Tensor& weight) {
  return {weight.storage().unsafeGetStorageImpl(), weight.storage_offset()};
}

struct Layers {
  std::mutex mutex;
  // Keyed by the weight's storage and offset: torch::nn::Linear reaches the dispatcher as
  // addmm(bias, x, W.t()) or matmul(x, W.t()), so the kernel sees a transposed view of the
  // weight, never the parameter itself; the view shares the weight's storage. Not by the data
  // pointer: ZeRO stage 3 (and its NVMe swapping) gives a partitioned weight's StorageImpl new
  // memory at every gather, which once made fp8 silently fall back to plain GEMMs there.
  std::map<WeightKey, std::shared_ptr<Fp8Layer>> by_data;
};
Layers& layers() {
  static Layers* l = new Layers();  // never destroyed: kernels may run during static teardown
  return *l;
}

// The converted layer whose weight W [out, in] is `t` (transposed = false) or whose W^T is `t`
// (transposed = true, the view W.t()), or nullptr.
std::shared_ptr<Fp8Layer> find_layer(const at::Tensor& t, bool transposed) {
  if (!t.defined() || t.dim() != 2 || !t.has_storage()) return nullptr;
  auto layer = find_fp8(t);
  if (!layer) return nullptr;
  const auto module = layer->module.lock();
  auto* lin = module ? dynamic_cast<torch::nn::LinearImpl*>(module.get()) : nullptr;
  if (lin == nullptr) return nullptr;
  const auto& w = lin->weight;
  // Still this layer's weight (not a tensor that reuses the storage of one that died).
  if (!w.defined() || !w.has_storage() ||
      w.storage().unsafeGetStorageImpl() != t.storage().unsafeGetStorageImpl()) {
    return nullptr;
  }
  const bool same = transposed ? t.size(0) == w.size(1) && t.size(1) == w.size(0) &&
                                     t.stride(0) == w.stride(1) && t.stride(1) == w.stride(0)
                               : t.sizes() == w.sizes() && t.strides() == w.strides();
  return same ? layer : nullptr;
}

// The kernel on the autocast key for aten::linear, addmm and matmul. Converted layers
// (recognised by their weight) compute in fp8 inside Fp8Autocast regions; every other call gets
// what the kernel underneath would give it: its tensor arguments cast to the region's dtype
// (through autocast's cast cache, with the CPU size rule), then the op with autocast excluded.
class Fp8GemmKernel final : public c10::OperatorKernel {
 public:
  Fp8GemmKernel(c10::DeviceType device, Fp8GemmOp op)
      : device_(device),
        op_(op),
        key_(at::autocast::get_autocast_dispatch_key_from_device_type(device)) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const size_t n = op.schema().arguments().size();
    auto arg = [&](size_t i) -> c10::IValue& { return (*stack)[stack->size() - n + i]; };
    // x: the input; w: the weight as [out, in] (a view for addmm/matmul); b: the bias.
    at::Tensor x, w, b;
    std::shared_ptr<Fp8Layer> layer;
    if (t_fp8_enabled) {
      if (op_ == Fp8GemmOp::kLinear) {
        x = arg(0).toTensor();
        w = arg(1).toTensor();
        b = arg(2).isNone() ? at::Tensor() : arg(2).toTensor();
        layer = find_layer(w, false);
      } else if (op_ == Fp8GemmOp::kAddmm) {
        const bool plain = arg(3).toScalar().equal(1) && arg(4).toScalar().equal(1);
        b = arg(0).toTensor();
        x = arg(1).toTensor();
        const at::Tensor wt = arg(2).toTensor();
        layer = plain ? find_layer(wt, true) : nullptr;
        // bias + x W^T with a bias of the layer's width only (what Linear passes).
        if (layer && !(b.dim() == 1 && b.size(0) == wt.size(1))) layer = nullptr;
        if (layer) w = wt.t();
      } else {
        x = arg(0).toTensor();
        const at::Tensor wt = arg(1).toTensor();
        layer = x.dim() >= 1 ? find_layer(wt, true) : nullptr;
        if (layer) w = wt.t();
      }
    }
    if (layer == nullptr || layer->mode == Fp8Mode::kMeasure) {
      fallback(op, stack, n);
      if (layer != nullptr) {
        torch::NoGradGuard no_grad;
        const at::Tensor out = stack->back().toTensor();
        auto now = at::stack({amax_of(x), amax_of(w), amax_of(out)});
        layer->stats.copy_(at::maximum(layer->stats, now));
        layer->calls.fetch_add(1);
      }
      return;
    }
    at::Tensor out;
    {
      c10::impl::ExcludeDispatchKeyGuard no_autocast(key_);
      if (layer->mode == Fp8Mode::kTrain) {
        const auto module = layer->module.lock();
        out = fp8_linear_delayed(x, w, b, layer->delayed, module && module->is_training());
      } else {
        out = fp8_linear_static(x, w, b, layer->scales);
      }
    }
    torch::jit::drop(*stack, n);
    stack->emplace_back(std::move(out));
  }

 private:
  void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t n) {
    auto arg = [&](size_t i) -> c10::IValue& { return (*stack)[stack->size() - n + i]; };
    const int fb = g_fallback[static_cast<int>(op_)].load();
    auto dtype = fb >= 0 ? static_cast<c10::ScalarType>(fb) : AutocastGuard::dtype(device_);
    if (fb < 0 && device_ == c10::kCPU) {
      int64_t macs = -1;
      if (op_ == Fp8GemmOp::kLinear) {
        macs = linear_macs(arg(0).toTensor(), arg(1).toTensor());
      } else if (op_ == Fp8GemmOp::kAddmm) {
        macs = gemm_macs(arg(1).toTensor(), arg(2).toTensor());
      } else {
        macs = gemm_macs(arg(0).toTensor(), arg(1).toTensor());
      }
      dtype = cpu_gemm_dtype(macs, dtype);
    }
    for (size_t i = 0; i < n; ++i) {
      if (arg(i).isTensor()) arg(i) = at::autocast::cached_cast(dtype, arg(i).toTensor(), device_);
    }
    c10::impl::ExcludeDispatchKeyGuard no_autocast(key_);
    op.callBoxed(stack);
  }

  c10::DeviceType device_;
  Fp8GemmOp op_;
  c10::DispatchKey key_;
};

struct Registration {
  std::mutex mutex;
  int holders = 0;
  std::unique_ptr<torch::Library> library;
};
Registration& registration() {
  static Registration* r = new Registration();
  return *r;
}

struct Release {
  ~Release() {
    auto& r = registration();
    std::lock_guard<std::mutex> lock(r.mutex);
    if (--r.holders == 0) {
      QuietWarningsGuard quiet;
      r.library.reset();  // libtorch's own autocast kernel for linear is visible again
    }
  }
};

}  // namespace

void attach_fp8(const at::Tensor& weight, std::shared_ptr<Fp8Layer> layer) {
  auto& l = layers();
  std::lock_guard<std::mutex> lock(l.mutex);
  // Drop entries whose module died (their weight's memory may be reused).
  for (auto it = l.by_data.begin(); it != l.by_data.end();) {
    it = it->second->module.expired() ? l.by_data.erase(it) : std::next(it);
  }
  l.by_data[key_of(weight)] = std::move(layer);
}

void detach_fp8(const at::Tensor& weight) {
  auto& l = layers();
  std::lock_guard<std::mutex> lock(l.mutex);
  l.by_data.erase(key_of(weight));
}

std::shared_ptr<Fp8Layer> find_fp8(const at::Tensor& weight) {
  if (!weight.defined() || !weight.has_storage()) return nullptr;
  auto& l = layers();
  std::lock_guard<std::mutex> lock(l.mutex);
  const auto it = l.by_data.find(key_of(weight));
  if (it == l.by_data.end() || it->second->module.expired()) return nullptr;
  return it->second;
}

std::shared_ptr<void> acquire_fp8_kernel(c10::DeviceType device) {
  VOLT_CHECK(device == c10::kCPU, NotAvailable, "[Fp8] fp8 regions run on CPU in this build (a ",
             "bit-exact emulation); ", device, " needs the native fp8 path, which waits for a GPU ",
             "session (issue #14). Use device cpu, or bf16-mixed on ", device, ".");
  auto& r = registration();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.holders++ == 0) {
    QuietWarningsGuard quiet;
    r.library = std::make_unique<torch::Library>(
        torch::Library::IMPL, "aten",
        at::autocast::get_autocast_dispatch_key_from_device_type(device), __FILE__, __LINE__);
    for (const auto& [name, op] :
         {std::make_pair("linear", Fp8GemmOp::kLinear), std::make_pair("addmm", Fp8GemmOp::kAddmm),
          std::make_pair("matmul", Fp8GemmOp::kMatmul)}) {
      r.library->impl(name, torch::CppFunction::makeFromBoxedFunctor(
                                std::make_unique<Fp8GemmKernel>(device, op)));
    }
  }
  return std::make_shared<Release>();
}

void set_fp8_fallback_dtype(Fp8GemmOp op, c10::optional<c10::ScalarType> dtype) {
  g_fallback[static_cast<int>(op)].store(dtype ? static_cast<int>(*dtype) : -1);
}

std::vector<std::pair<std::string, std::shared_ptr<torch::nn::LinearImpl>>> linear_layers(
    torch::nn::Module& model) {
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::LinearImpl>>> out;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    if (auto lin = std::dynamic_pointer_cast<torch::nn::LinearImpl>(item.value())) {
      out.emplace_back(item.key(), std::move(lin));
    }
  }
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<torch::nn::LinearImpl>>> convertible_linears(
    torch::nn::Module& model, const char* component) {
  VOLT_CHECK(dynamic_cast<torch::nn::LinearImpl*>(&model) == nullptr, ConfigError, "[", component,
             "] the model is a Linear itself: fp8 converts the Linear layers inside a model (as "
             "Lightning's convert_module, which replaces its children), so nothing would be "
             "converted; hold it in one, e.g. torch::nn::Sequential(linear).");
  return linear_layers(model);
}

void check_linear_names(
    const std::vector<std::string>& names,
    const std::vector<std::pair<std::string, std::shared_ptr<torch::nn::LinearImpl>>>& linears,
    const char* component, const char* list) {
  for (const auto& name : names) {
    const bool found =
        std::any_of(linears.begin(), linears.end(), [&](const auto& l) { return l.first == name; });
    if (found) continue;
    auto all = detail::c_stream<std::ostringstream>();
    for (const auto& l : linears) all << (&l == &linears.front() ? "" : ", ") << l.first;
    VOLT_CHECK(false, ConfigError, "[", component, "] ", list, " names \"", name,
               "\", which is not a Linear of this model; its Linear layers are: ",
               all.str().empty() ? "(none)" : all.str(), ".");
  }
}

at::Tensor ensure_buffer(torch::nn::Module& module, const std::string& name,
                         const at::Tensor& init) {
  // find() points into the dict: keep it alive while `existing` is used.
  const auto buffers = module.named_buffers(/*recurse=*/false);
  if (const at::Tensor* existing = buffers.find(name)) {
    VOLT_CHECK(existing->sizes() == init.sizes(), ConfigError, "[Fp8] buffer \"", name,
               "\" exists with shape ", existing->sizes(), " but this conversion needs ",
               init.sizes(),
               "; convert with the recipe the layer was converted with (e.g. the "
               "same amax_history_len).");
    return *existing;
  }
  return module.register_buffer(name, init);
}

}  // namespace detail

std::string Fp8ConversionReport::str() const {
  auto os = detail::c_stream<std::ostringstream>();
  os << converted.size() << " Linear layer" << (converted.size() == 1 ? "" : "s") << " in fp8";
  if (!kept.empty()) {
    os << "; kept as they were:";
    for (const auto& k : kept)
      os << " " << k.first << " (" << k.second << ")" << (&k == &kept.back() ? "" : ",");
  }
  return os.str();
}

Fp8ConversionReport convert_to_fp8(torch::nn::Module& model, const Fp8ConvertOptions& options) {
  validate(options.recipe());
  const auto linears = detail::convertible_linears(model, "Fp8");
  detail::check_linear_names(options.skip(), linears, "Fp8", "skip");
  Fp8ConversionReport report;
  const auto& recipe = options.recipe();
  for (const auto& [name, lin] : linears) {
    if (std::find(options.skip().begin(), options.skip().end(), name) != options.skip().end()) {
      report.kept.emplace_back(name, "skipped by name");
      continue;
    }
    const int64_t in = lin->options.in_features(), out = lin->options.out_features();
    if (in % 16 != 0 || out % 16 != 0) {
      auto why = detail::c_stream<std::ostringstream>();
      why << in << "x" << out << " features, not multiples of 16";
      report.kept.emplace_back(name, why.str());
      continue;
    }
    const auto existing = detail::find_fp8(lin->weight);
    if (existing && existing->mode == detail::Fp8Mode::kTrain) {
      // Converted already: kept as it is, which must be what this call asks for.
      const std::string had = detail::str_cat(existing->delayed.recipe),
                        asked = detail::str_cat(recipe);
      VOLT_CHECK(had == asked, ConfigError, "[Fp8] '", name, "' is converted already with ", had,
                 ", not ", asked,
                 "; call release_fp8(model) first to convert it with another "
                 "recipe.");
      report.converted.push_back(name);
      continue;
    }
    auto layer = std::make_shared<detail::Fp8Layer>();
    layer->module = lin;
    layer->name = name;
    layer->mode = detail::Fp8Mode::kTrain;
    const auto f32 = lin->weight.options().dtype(at::kFloat).requires_grad(false);
    layer->delayed = {
        detail::ensure_buffer(*lin, detail::kFp8AmaxHistory,
                              at::zeros({3, recipe.amax_history_len()}, f32)),
        detail::ensure_buffer(*lin, detail::kFp8Scale, at::ones({3}, f32)),
        detail::ensure_buffer(*lin, detail::kFp8GradAmax, at::zeros({1}, f32)),
        detail::ensure_buffer(*lin, detail::kFp8Steps, at::zeros({1}, f32.dtype(at::kLong))),
        recipe};
    detail::attach_fp8(lin->weight, std::move(layer));
    report.converted.push_back(name);
  }
  log_info("Fp8", "convert_to_fp8: " + report.str());
  return report;
}

void release_fp8(torch::nn::Module& model) {
  for (const auto& l : detail::linear_layers(model)) detail::detach_fp8(l.second->weight);
}

bool is_fp8_converted(const at::Tensor& weight) {
  return detail::find_fp8(weight) != nullptr;
}

Fp8Autocast::Fp8Autocast(c10::DeviceType device, bool enabled) : prev_(detail::t_fp8_enabled) {
  if (enabled) {
    registration_ = detail::acquire_fp8_kernel(device);
    autocast_ = std::make_shared<AutocastGuard>(device, c10::kBFloat16);
  }
  detail::t_fp8_enabled = enabled;
}

Fp8Autocast::~Fp8Autocast() {
  detail::t_fp8_enabled = prev_;
  autocast_.reset();
  registration_.reset();
}

bool Fp8Autocast::is_enabled() {
  return detail::t_fp8_enabled;
}

std::ostream& operator<<(std::ostream& os, const Fp8ConvertOptions& o) {
  return os << "Fp8ConvertOptions(recipe=" << o.recipe()
            << ", skip=" << detail::quoted_list(o.skip()) << ")";
}

}  // namespace volt
