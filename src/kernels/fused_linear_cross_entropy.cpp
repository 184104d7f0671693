#include "volt/kernels/fused_linear_cross_entropy.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <ostream>
#include <string>

#include "core/detail/numbers.h"
#include "core/detail/tracing.h"
#include "volt/core/check.h"

namespace volt {
namespace {

constexpr const char* kName = "FusedLinearCrossEntropy";
constexpr int64_t kChunkLogitBytes = int64_t{256} << 20;
// pad_classes_to = 0 on CUDA: classes a multiple of kAlignedClasses stay as they are (16-byte
// aligned rows in bf16), others are padded to a multiple of kPadClassesTo.
constexpr int64_t kAlignedClasses = 8;
constexpr int64_t kPadClassesTo = 64;

std::string shape(const at::Tensor& t) {
  auto os = detail::c_stream<std::ostringstream>();
  os << t.sizes();
  return os.str();
}

void validate(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
              const at::Tensor& target, const LinearCrossEntropyOptions& o) {
  VOLT_CHECK(o.chunk_rows() >= 0, ConfigError, "[", kName, "] chunk_rows=", o.chunk_rows(),
             " must be >= 0; pass 0 to size the chunks by memory.");
  VOLT_CHECK(o.pad_classes_to() >= 0, ConfigError, "[", kName,
             "] pad_classes_to=", o.pad_classes_to(),
             " must be >= 0; pass 0 for the automatic choice or 1 for no padding.");
  VOLT_CHECK(input.defined() && weight.defined() && target.defined(), ValueError, "[", kName,
             "] input, weight and target are required; pass an undefined tensor only as bias.");
  VOLT_CHECK(input.dim() == 2 && weight.dim() == 2 && input.size(1) == weight.size(1) &&
                 weight.size(0) > 0,
             ValueError, "[", kName, "] input ", shape(input), " and weight ", shape(weight),
             " do not fit: input is [rows, features] and weight [classes, features] (flatten "
             "[batch, seq, features] activations with reshape({-1, features})).");
  VOLT_CHECK(
      target.dim() == 1 && target.size(0) == input.size(0) && target.scalar_type() == at::kLong,
      ValueError, "[", kName, "] target ", shape(target), " of ", target.scalar_type(),
      " does not fit input ", shape(input), "; pass one int64 class index per row.");
  VOLT_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)), ValueError,
             "[", kName, "] bias ", shape(bias), " does not fit weight ", shape(weight),
             "; pass one value per class, or an undefined tensor.");
  VOLT_CHECK(at::isFloatingType(input.scalar_type()) && at::isFloatingType(weight.scalar_type()),
             ValueError, "[", kName, "] input (", input.scalar_type(), ") and weight (",
             weight.scalar_type(), ") must be floating point.");
  const bool one_device = weight.device() == input.device() && target.device() == input.device() &&
                          (!bias.defined() || bias.device() == input.device());
  VOLT_CHECK(one_device, ValueError, "[", kName,
             "] input, weight, bias and target must be on one device; input is on ", input.device(),
             ", weight on ", weight.device(), ", target on ", target.device(), ".");
  if (target.is_cpu() && target.numel() > 0) {
    const at::Tensor t = target.contiguous();
    const int64_t* p = t.data_ptr<int64_t>();
    const int64_t classes = weight.size(0);
    for (int64_t i = 0; i < t.numel(); ++i) {
      VOLT_CHECK(p[i] == o.ignore_index() || (p[i] >= 0 && p[i] < classes), ValueError, "[", kName,
                 "] target[", i, "] = ", p[i], " is not a class in [0, ", classes,
                 ") nor ignore_index (", o.ignore_index(), ").");
    }
  }
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Forward computes the loss and, chunk by chunk, the gradients of the summed loss; it saves
// them scaled for the reduction, and backward multiplies them by the incoming gradient.
class LinearCrossEntropyFunction : public torch::autograd::Function<LinearCrossEntropyFunction> {
 public:
  // `bias_or_empty`: the bias, or an empty tensor standing for none (autograd's bookkeeping
  // needs a defined tensor in every tensor argument).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input_,
                            const at::Tensor& weight, const at::Tensor& bias_or_empty,
                            const at::Tensor& target, const LinearCrossEntropyOptions* options,
                            bool grad_mode) {
    const at::Tensor bias = bias_or_empty.numel() > 0 ? bias_or_empty : at::Tensor();
    const LinearCrossEntropyOptions& o = *options;
    const at::Tensor input = input_.contiguous();
    const int64_t rows = input.size(0), classes = weight.size(0);
    // Inside a Function's forward grad mode is always off: the caller's (a validation's
    // no_grad) decides whether any gradient is computed.
    const bool grad_input = grad_mode && input_.requires_grad();
    const bool grad_weight = grad_mode && weight.requires_grad();
    const bool grad_bias = grad_mode && bias.defined() && bias.requires_grad();
    const bool any_grad = grad_input || grad_weight || grad_bias;
    // Classes padded with zero rows of weight and bias, in the dtype linear computes in (probed
    // on one row, so autocast and its op lists decide as for the composition): every GEMM's
    // leading dimension is then aligned. The padded logits are left out of the softmax and get
    // a zero gradient, so they change no value but the GEMMs' summation order.
    const int64_t align = o.pad_classes_to() > 0                               ? o.pad_classes_to()
                          : weight.is_cuda() && classes % kAlignedClasses != 0 ? kPadClassesTo
                                                                               : 1;
    const int64_t padded = rows == 0 ? classes : (classes + align - 1) / align * align;
    at::Tensor w = weight, b = bias;
    if (padded != classes) {
      const at::ScalarType ct = at::linear(input.narrow(0, 0, 1), weight.narrow(0, 0, 1),
                                           bias.defined() ? bias.narrow(0, 0, 1) : at::Tensor())
                                    .scalar_type();
      w = at::constant_pad_nd(weight.detach().to(ct), {0, 0, 0, padded - classes});
      if (bias.defined()) b = at::constant_pad_nd(bias.detach().to(ct), {0, padded - classes});
    }
    const int64_t chunk =
        o.chunk_rows() > 0
            ? o.chunk_rows()
            : std::max<int64_t>(1, kChunkLogitBytes / (4 * std::max<int64_t>(padded, 1)));
    const auto f32 = input.options().dtype(at::kFloat);
    // The rows the loss counts, known before any chunk (on the device, no sync), so each chunk's
    // gradient is scaled for the mean before it is rounded to the logits' dtype, as autograd
    // scales it in the composition.
    const at::Tensor count = target.ne(o.ignore_index()).sum().to(at::kFloat);
    const at::Tensor scale = o.reduction() == LossReduction::kMean
                                 ? at::where(count > 0, count.reciprocal(), at::zeros({}, f32))
                                 : at::ones({}, f32);
    // The gradients: float32 accumulators for weight and bias (summed over chunks), input's
    // own dtype for input (each row is written once).
    at::Tensor d_input = grad_input ? at::empty_like(input) : at::Tensor();
    at::Tensor d_weight = grad_weight ? at::zeros({padded, weight.size(1)}, f32) : at::Tensor();
    at::Tensor d_bias = grad_bias ? at::zeros(bias.sizes(), f32) : at::Tensor();
    at::Tensor loss_sum = at::zeros({}, f32);
    for (int64_t start = 0; start < rows; start += chunk) {
      const int64_t n = std::min(chunk, rows - start);
      const at::Tensor x = input.narrow(0, start, n);
      const at::Tensor t = target.narrow(0, start, n);
      at::Tensor z_all = at::linear(x, w, b);  // autocast picks the dtype
      const at::ScalarType logits_dtype = z_all.scalar_type();
      // float32 logits this chunk owns (the lower-precision ones are released at once).
      if (logits_dtype != at::kFloat) z_all = z_all.to(at::kFloat);
      // The real classes (a strided view when padded; the in-place ops below keep it so).
      at::Tensor z = padded == classes ? z_all : z_all.narrow(1, 0, classes);
      const at::Tensor keep = t.ne(o.ignore_index());
      const at::Tensor cls = at::where(keep, t, at::zeros({}, t.options())).unsqueeze(1);
      // Row by row: loss = log(sum(exp(z - max))) - (z[target] - max), with z shifted, then
      // exponentiated and normalised in place (at::logsumexp would allocate another [n, V]).
      z.sub_(std::get<0>(z.max(1, /*keepdim=*/true)));
      const at::Tensor picked = z.gather(1, cls);
      const at::Tensor total = z.exp_().sum(1, /*keepdim=*/true);
      // Ignored rows are left out, not multiplied by 0: their logits may be inf (a padding
      // position), and inf - inf is NaN (torch's nll_loss never reads them either).
      loss_sum.add_(at::where(keep, (total.log() - picked).squeeze(1), at::zeros({}, f32)).sum());
      if (!any_grad) continue;
      // d(loss)/d(logits) = (softmax - one_hot(target)) * scale, zero on ignored rows; in place.
      z.div_(total);
      z.scatter_add_(1, cls, at::full({n, 1}, -1.0, f32));
      z.mul_(scale);
      z.masked_fill_(keep.logical_not().unsqueeze(1), 0.0);  // not * 0: NaN rows stay out
      if (padded != classes) z_all.narrow(1, classes, padded - classes).zero_();
      // The logits' dtype, as autograd hands the gradient of `logits.to(float)` back to them.
      const at::Tensor g = z_all.to(logits_dtype);
      // Into the outputs when the dtypes allow (no temporary), else through at::mm, which
      // autocast casts as it casts linear's backward in the composition.
      const bool same =
          g.scalar_type() == input.scalar_type() && g.scalar_type() == w.scalar_type();
      if (grad_input) {
        at::Tensor rows_out = d_input.narrow(0, start, n);
        if (same) {
          at::mm_out(rows_out, g, w);
        } else {
          rows_out.copy_(at::mm(g, w));
        }
      }
      if (grad_weight) {
        if (same && g.scalar_type() == at::kFloat) {
          d_weight.addmm_(g.t(), x);
        } else {
          d_weight.add_(at::mm(g.t(), x));
        }
      }
      if (grad_bias) d_bias.add_((padded == classes ? g : g.narrow(1, 0, classes)).sum(0));
    }
    // The real classes' rows (contiguous: a prefix of the padded rows).
    if (grad_weight && padded != classes) d_weight = d_weight.narrow(0, 0, classes);
    // The mean over no counted row is NaN, as torch's.
    const at::Tensor loss = o.reduction() == LossReduction::kMean ? loss_sum / count : loss_sum;
    // Kept as plain data, not saved variables: backward hands them out scaled in place, so
    // their memory becomes the gradients instead of being copied once more.
    ctx->saved_data["d_input"] = d_input;
    ctx->saved_data["d_weight"] = d_weight;
    ctx->saved_data["d_bias"] = d_bias;
    ctx->saved_data["input_dtype"] = static_cast<int64_t>(input_.scalar_type());
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weight.scalar_type());
    ctx->saved_data["bias_dtype"] =
        static_cast<int64_t>(bias.defined() ? bias.scalar_type() : at::kFloat);
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    auto& data = ctx->saved_data;
    VOLT_CHECK(data.count("d_input") > 0, ValueError, "[", kName,
               "] backward ran twice through one loss; its gradients were handed out the first "
               "time. Compute the loss again for a second backward.");
    const at::Tensor& g = grad[0];
    const auto scaled = [&](const char* name, const char* dtype) -> at::Tensor {
      at::Tensor d = data[name].toTensor();
      data.erase(name);
      if (!d.defined()) return at::Tensor();
      d.mul_(g.to(d.scalar_type()));
      return d.to(static_cast<at::ScalarType>(data[dtype].toInt()));
    };
    return {scaled("d_input", "input_dtype"),
            scaled("d_weight", "weight_dtype"),
            scaled("d_bias", "bias_dtype"),
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

std::ostream& operator<<(std::ostream& os, const LinearCrossEntropyOptions& o) {
  return os << "LinearCrossEntropyOptions(chunk_rows=" << o.chunk_rows()
            << ", ignore_index=" << o.ignore_index()
            << ", reduction=" << (o.reduction() == LossReduction::kMean ? "mean" : "sum")
            << ", pad_classes_to=" << o.pad_classes_to() << ")";
}

at::Tensor fused_linear_cross_entropy(const at::Tensor& input, const at::Tensor& weight,
                                      const at::Tensor& bias, const at::Tensor& target,
                                      const LinearCrossEntropyOptions& options) {
  validate(input, weight, bias, target, options);
  // Its forward computes the gradients too, by chunks a trace would replay with autograd on
  // top: while traced, the composition (whose elementwise ops the trace can fuse).
  if (detail::tracing())
    return linear_cross_entropy_reference(input, weight, bias, target, options);
  return LinearCrossEntropyFunction::apply(input, weight,
                                           bias.defined() ? bias : at::empty({0}, weight.options()),
                                           target, &options, c10::GradMode::is_enabled());
}

at::Tensor linear_cross_entropy_reference(const at::Tensor& input, const at::Tensor& weight,
                                          const at::Tensor& bias, const at::Tensor& target,
                                          const LinearCrossEntropyOptions& options) {
  validate(input, weight, bias, target, options);
  const at::Tensor logits = at::linear(input, weight, bias).to(at::kFloat);
  return at::cross_entropy_loss(
      logits, target, /*weight=*/{},
      options.reduction() == LossReduction::kMean ? at::Reduction::Mean : at::Reduction::Sum,
      options.ignore_index());
}

}  // namespace volt
