#include "volt/precision/fp8_precision.h"

#include <torch/torch.h>

#include <cstdlib>
#include <ostream>
#include <set>

#include "core/detail/fp8_state.h"
#include "core/detail/print.h"
#include "detail/fp8_hooks.h"
#include "volt/core/check.h"
#include "volt/core/env.h"
#include "volt/core/log.h"
#include "volt/precision/autocast.h"
#include "volt/precision/autocast_ops.h"

namespace volt {

Fp8Precision::Fp8Precision(Fp8PrecisionOptions options)
    : options_(std::move(options)), mixed_(options_.mixed()) {
  validate(options_.recipe());
  VOLT_CHECK(
      options_.mixed().dtype() == "bf16", ConfigError, "[Fp8Precision] mixed.dtype must ",
      "be \"bf16\": fp8 layers return bf16 and the rest of the model runs in bf16 autocast.");
  VOLT_CHECK(!options_.quant() || options_.inference(), ConfigError,
             "[Fp8Precision] quant=true needs inference=true (quantization is for inference).");
  // A bad config file fails here, where the options are built (the CLI's exit 2).
  if (options_.inference()) quant_config(options_.quant());
}

Fp8Precision::~Fp8Precision() = default;

QuantConfig Fp8Precision::quant_config(bool quant) const {
  std::string path = options_.quant_config();
  std::string origin = "quant_config";
  if (path.empty()) {
    if (auto env = env_value("QUANT_CONFIG")) {
      path = *env;
      origin = "QUANT_CONFIG";
    }
  }
  const auto mode = quant ? QuantConfig::kQuantize : QuantConfig::kMeasure;
  if (path.empty()) return QuantConfig().mode(mode);
  QuantConfig c = QuantConfig::from_file(path);
  VOLT_CHECK(c.mode() == mode, ConfigError, "[Fp8Precision] ", origin, " \"", path, "\" has mode ",
             c.mode() == QuantConfig::kMeasure ? "MEASURE" : "QUANTIZE",
             " but quant=", quant ? "true" : "false", " asks for ", quant ? "QUANTIZE" : "MEASURE",
             "; make them agree.");
  return c;
}

Fp8ConversionReport Fp8Precision::convert_modules(torch::nn::Module& model, bool inference,
                                                  bool quant) {
  VOLT_CHECK(!quant || inference, ConfigError,
             "[Fp8Precision] convert_modules(quant=true) needs inference=true.");
  converted_ = true;
  if (!inference) {
    return convert_to_fp8(model,
                          Fp8ConvertOptions().recipe(options_.recipe()).skip(options_.skip()));
  }
  const QuantConfig config = quant_config(quant);
  if (quant) return quantize_fp8(model, config);
  auto report = prepare_fp8_measurement(model, config);
  measuring_ = &model;
  measure_config_ = config;
  return report;
}

void Fp8Precision::setup(c10::Device device) {
  VOLT_CHECK(device.is_cpu(), NotAvailable,
             "[Fp8Precision] fp8 runs on CPU in this build (a "
             "bit-exact emulation); ",
             device,
             " needs the native fp8 path, which waits for a GPU "
             "session (issue #14). Use accelerator cpu, or bf16-mixed.");
  device_ = device.type();
  mixed_.setup(device);
  // GEMMs outside fp8 follow the run's autocast policy, which the fp8 kernels sit on top of:
  // the op lists for the ops they name, else autocast's dtype under the CPU size rule.
  const auto* lists = mixed_.op_lists();
  auto in = [](const std::vector<std::string>& v, const char* op) {
    return std::find(v.begin(), v.end(), op) != v.end();
  };
  for (const auto& [name, op] : {std::make_pair("linear", detail::Fp8GemmOp::kLinear),
                                 std::make_pair("addmm", detail::Fp8GemmOp::kAddmm),
                                 std::make_pair("matmul", detail::Fp8GemmOp::kMatmul)}) {
    c10::optional<c10::ScalarType> dtype;
    if (lists != nullptr && in(lists->fp32_overloads(), name)) dtype = c10::kFloat;
    if (lists != nullptr && in(lists->lower_overloads(), name)) dtype = c10::kBFloat16;
    detail::set_fp8_fallback_dtype(op, dtype);
  }
  kernel_ = detail::acquire_fp8_kernel(device_);  // after the op lists: this kernel wins
}

void Fp8Precision::teardown() {
  if (measuring_ != nullptr && measure_config_) {
    torch::nn::Module* model = measuring_;
    measuring_ = nullptr;
    try {
      save_fp8_measurements(*model, *measure_config_);
    } catch (const Error& e) {
      // A folder that cannot be written too (CheckpointError): teardown must go on, or the fp8
      // kernel and the op lists stayed registered process-wide.
      log_warning("Fp8Precision", std::string("measurements not written: ") + e.what());
    }
  }
  kernel_.reset();
  model_ = nullptr;
  // The next run's module is converted at its set-up (conversion for training is idempotent):
  // a second fit() of the same Trainer trained its model unconverted, in bf16.
  if (!options_.inference()) converted_ = false;
  for (auto op :
       {detail::Fp8GemmOp::kLinear, detail::Fp8GemmOp::kAddmm, detail::Fp8GemmOp::kMatmul}) {
    detail::set_fp8_fallback_dtype(op, c10::nullopt);
  }
  mixed_.teardown();
}

void Fp8Precision::convert_module(torch::nn::Module& module) {
  model_ = &module;
  // Converted already: by the user's convert_modules, or for inference by an earlier run of this
  // Trainer (inference conversion is not undone at teardown). Another model a later predict
  // runs has no fp8 layers yet: it was left unconverted (and unmeasured) before session 98.
  const auto holds_fp8 = [&] {
    for (const auto& l : detail::linear_layers(module)) {
      if (detail::find_fp8(l.second->weight) != nullptr) return true;
    }
    return false;
  };
  if (converted_ && (!options_.inference() || holds_fp8())) return;
  if (options_.inference()) {
    convert_modules(module, true, options_.quant());
  } else if (options_.replace_layers()) {
    convert_modules(module);
  }
}

std::vector<at::Tensor> Fp8Precision::rank_max_state() const {
  std::vector<at::Tensor> out;
  if (model_ == nullptr || options_.inference()) return out;
  // Fp8Linear's buffers, and those convert_to_fp8 gives the Linear layers it converts in place
  // (by their exact names, not a user's buffer that happens to end alike).
  static const std::set<std::string> kNames{"amax_history", "grad_amax", detail::kFp8AmaxHistory,
                                            detail::kFp8GradAmax};
  for (const auto& b : model_->named_buffers(/*recurse=*/true)) {
    const std::string& name = b.key();
    const size_t dot = name.rfind('.');
    if (kNames.count(dot == std::string::npos ? name : name.substr(dot + 1)) != 0) {
      out.push_back(b.value());
    }
  }
  return out;
}

namespace {

// Fp8Autocast with autocast's cast cache off inside, for the reason MixedPrecision's
// forward_context gives.
struct Fp8StepContext {
  explicit Fp8StepContext(c10::DeviceType device)
      : fp8(device), uncached(device, c10::kBFloat16, /*enabled=*/true, /*cache_enabled=*/false) {}
  Fp8Autocast fp8;
  AutocastGuard uncached;
};

}  // namespace

std::shared_ptr<void> Fp8Precision::forward_context() {
  return std::make_shared<Fp8StepContext>(device_);
}

void Fp8Precision::backward(const at::Tensor& loss, Module* module) {
  mixed_.backward(loss, module);
}
void Fp8Precision::unscale_gradients(torch::optim::Optimizer& o) {
  mixed_.unscale_gradients(o);
}
void Fp8Precision::agree_on_found_inf(const std::function<bool(bool)>& any_rank) {
  mixed_.agree_on_found_inf(any_rank);
}
void Fp8Precision::configure_loss_scaler(const GradScalerOptions& options) {
  mixed_.configure_loss_scaler(options);
}
bool Fp8Precision::optimizer_step(torch::optim::Optimizer& o) {
  return mixed_.optimizer_step(o);
}
void Fp8Precision::save_state(torch::serialize::OutputArchive& a) const {
  mixed_.save_state(a);
}
void Fp8Precision::load_state(torch::serialize::InputArchive& a) {
  mixed_.load_state(a);
}

std::ostream& operator<<(std::ostream& os, const Fp8PrecisionOptions& o) {
  return os << "Fp8PrecisionOptions(replace_layers=" << o.replace_layers()
            << ", recipe=" << o.recipe() << ", skip=" << detail::quoted_list(o.skip())
            << ", inference=" << o.inference() << ", quant=" << o.quant()
            << ", quant_config=" << detail::quoted(o.quant_config()) << ", mixed=" << o.mixed()
            << ")";
}

}  // namespace volt
