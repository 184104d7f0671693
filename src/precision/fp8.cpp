#include "volt/precision/fp8.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <ostream>

#include "volt/core/check.h"

namespace volt {
namespace {

struct Layout {
  int mbits;  // explicit mantissa bits
  int emin;   // exponent of the smallest normal
};

Layout layout(Fp8Format f) {
  return f == Fp8Format::kE4M3 ? Layout{3, -6} : Layout{2, -14};
}

}  // namespace

double fp8_max(Fp8Format f) {
  return f == Fp8Format::kE4M3 ? 448.0 : 57344.0;
}

double fp8_min_subnormal(Fp8Format f) {
  const Layout l = layout(f);
  return std::ldexp(1.0, l.emin - l.mbits);
}

at::Tensor fp8_round(const at::Tensor& x_in, Fp8Format format, bool saturate) {
  VOLT_CHECK(x_in.is_floating_point(), ValueError, "[fp8] fp8_round takes a floating tensor, got ",
             x_in.scalar_type(), "; convert it with .to(at::kFloat) first.");
  torch::NoGradGuard no_grad;
  const Layout l = layout(format);
  const at::Tensor x = x_in.to(at::kFloat);
  const at::Tensor a = x.abs();
  // The spacing of fp8 values around |x| is 2^(e - mbits), e = floor(log2 |x|), and stays that
  // of the smallest normal binade below it (subnormals). Built from exponent bits, so exact;
  // dividing and multiplying by a power of two is exact too, leaving round() - ties to even,
  // as IEEE casts - as the only rounding step.
  auto e = std::get<1>(at::frexp(a)).to(at::kInt) - 1;
  e = at::clamp_min(e, l.emin);
  const at::Tensor quantum = ((e - l.mbits + 127) * (1 << 23)).view(at::kFloat);
  at::Tensor r = at::round(a / quantum) * quantum;
  const double max = fp8_max(format);
  const auto over = r > max;  // false for NaN: NaN stays NaN
  if (saturate) {
    r = at::where(over, at::full({}, max, r.options()), r);
  } else {
    const double beyond = format == Fp8Format::kE4M3 ? std::numeric_limits<double>::quiet_NaN()
                                                     : std::numeric_limits<double>::infinity();
    r = at::where(over, at::full({}, beyond, r.options()), r);
  }
  return at::copysign(r, x);  // keeps -0 and the sign of saturated values
}

std::ostream& operator<<(std::ostream& os, const DelayedScalingOptions& o) {
  return os << "DelayedScalingOptions(margin=" << o.margin()
            << ", amax_history_len=" << o.amax_history_len()
            << ", amax_compute_algo=" << o.amax_compute_algo() << ", interval=" << o.interval()
            << ", fp8_format=" << o.fp8_format() << ")";
}

void validate(const DelayedScalingOptions& o) {
  // 2^margin of headroom past fp8's whole exponent range (E5M2 spans about 2^32) maps every
  // value to zero, and past about 2^130 the fp32 scale itself underflows to 0 (0/0: NaN).
  VOLT_CHECK(o.margin() >= 0 && o.margin() <= 32, ConfigError,
             "[DelayedScaling] margin=", o.margin(),
             " must be in [0, 32]: the scale is fp8_max / amax / 2^margin, and a larger margin "
             "leaves no value representable (0-3 is usual).");
  VOLT_CHECK(o.amax_history_len() >= 1, ConfigError,
             "[DelayedScaling] amax_history_len=", o.amax_history_len(),
             " must be >= 1 (e.g. 16).");
  VOLT_CHECK(o.amax_compute_algo() == "max" || o.amax_compute_algo() == "most_recent", ConfigError,
             "[DelayedScaling] amax_compute_algo=\"", o.amax_compute_algo(),
             "\" is not supported; use \"max\" or \"most_recent\".");
  VOLT_CHECK(o.interval() >= 1, ConfigError, "[DelayedScaling] interval=", o.interval(),
             " must be >= 1.");
  VOLT_CHECK(o.fp8_format() == "hybrid" || o.fp8_format() == "e4m3", ConfigError,
             "[DelayedScaling] fp8_format=\"", o.fp8_format(),
             "\" is not supported; use \"hybrid\" (E4M3 forward, E5M2 gradients) or \"e4m3\".");
}

at::Tensor delayed_scale(const at::Tensor& history, const at::Tensor& previous, Fp8Format format,
                         const DelayedScalingOptions& options) {
  torch::NoGradGuard no_grad;
  // "max" skips a NaN entry, as TransformerEngine's reduction (fmaxf) does: one step's NaN
  // amax kept the previous scale for the whole history's length.
  const at::Tensor amax =
      options.amax_compute_algo() == "max"
          ? at::where(at::isnan(history), at::zeros_like(history), history).max()
          : history.select(0, -1);
  // An amax so small that the scale overflows float (below fp8_max / FLT_MAX, ~1e-36) gives
  // float's largest value, as TransformerEngine's delayed_scaling.cu does: an infinite scale
  // turned zeros into NaN (0 * inf) and everything else into 0 when quantizing.
  const at::Tensor scale =
      at::clamp_max((fp8_max(format) / amax) / std::ldexp(1.0, options.margin()),
                    static_cast<double>(std::numeric_limits<float>::max()));
  return at::where(at::logical_and(amax > 0, at::isfinite(amax)), scale, previous);
}

}  // namespace volt
