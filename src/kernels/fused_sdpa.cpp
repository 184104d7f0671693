#include "volt/kernels/fused_sdpa.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <mutex>
#include <ostream>

#include "core/detail/numbers.h"
#include "core/detail/tracing.h"
#include "detail/sdpa_cpu.h"
#include "detail/sdpa_cuda.h"
#include "volt/core/check.h"
#include "volt/core/log.h"

namespace volt {
namespace {

std::atomic<bool> g_recompute{true};
thread_local int t_recompute_scope = -1;  // -1: no guard on this thread

std::string shape(const at::Tensor& t) {
  auto os = detail::c_stream<std::ostringstream>();
  os << t.sizes();
  return os.str();
}

// Everything a call needs besides q, k and v, validated once.
struct Call {
  int64_t batch = 0, heads = 0, lq = 0, lk = 0, d = 0, dv = 0;
  double scale = 1.0;
  double dropout_p = 0.0;
  bool causal = false;
  bool left_padding = false;
  bool fast = false;
  bool recompute = true;
  bool needs_grad = false;
  bool want_probs = false;
  bool want_keep = false;
  uint64_t seed = 0;
  bool seeded = false;  // dropout_seed was given
  at::Tensor mask;      // float or bool as given by the user, or undefined
  at::Tensor lens;      // int64 [B] CPU, or undefined
};

// A Call with the problem sizes of q [B,H,Lq,D], k [B,H,Lk,D], v [B,H,Lk,Dv] (shapes checked).
Call call_with_shapes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  Call c;
  c.batch = q.size(0);
  c.heads = q.size(1);
  c.lq = q.size(2);
  c.lk = k.size(2);
  c.d = q.size(3);
  c.dv = v.size(3);
  return c;
}

uint64_t draw_seed() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get<at::CPUGeneratorImpl>()->random64();
}

Call validate(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const SdpaOptions& o) {
  VOLT_CHECK(q.defined() && k.defined() && v.defined(), ValueError,
             "[FusedSDPA] query, key and value must all be defined tensors.");
  VOLT_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, ValueError,
             "[FusedSDPA] query, key and value must be 4-D [batch, heads, seq, head_dim]; got "
             "query ",
             shape(q), ", key ", shape(k), ", value ", shape(v),
             ". Reshape with view(batch, seq, heads, head_dim).transpose(1, 2).");
  VOLT_CHECK(q.size(0) == k.size(0) && q.size(0) == v.size(0), ValueError,
             "[FusedSDPA] batch broadcasting is not supported: query batch ", q.size(0),
             ", key batch ", k.size(0), ", value batch ", v.size(0),
             "; expand the smaller ones to the same batch size first (e.g. "
             "key.expand({B, -1, -1, -1})).");
  VOLT_CHECK(q.size(1) == k.size(1) && q.size(1) == v.size(1), ValueError,
             "[FusedSDPA] query, key and value must have the same number of heads; got query ",
             shape(q), ", key ", shape(k), ", value ", shape(v), ".");
  VOLT_CHECK(k.size(2) == v.size(2), ValueError,
             "[FusedSDPA] key and value must have the same sequence length; got key ", shape(k),
             ", value ", shape(v), ".");
  VOLT_CHECK(q.size(3) == k.size(3), ValueError,
             "[FusedSDPA] query and key must have the same head_dim; got query ", shape(q),
             ", key ", shape(k), ".");
  VOLT_CHECK(q.size(2) > 0 && k.size(2) > 0 && q.size(3) > 0 && v.size(3) > 0, ValueError,
             "[FusedSDPA] empty sequence or head dimension: query ", shape(q), ", key ", shape(k),
             ", value ", shape(v), ".");
  VOLT_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(), ValueError,
             "[FusedSDPA] query, key and value must share a dtype; got ", q.scalar_type(), ", ",
             k.scalar_type(), ", ", v.scalar_type(), ".");
  VOLT_CHECK(q.is_floating_point(), ValueError,
             "[FusedSDPA] query, key and value must be floating point; got ", q.scalar_type(), ".");
  VOLT_CHECK(q.device() == k.device() && q.device() == v.device(), ValueError,
             "[FusedSDPA] query, key and value must be on one device; got ", q.device(), ", ",
             k.device(), ", ", v.device(), ".");
  VOLT_CHECK(o.dropout_p() >= 0.0 && o.dropout_p() < 1.0, ConfigError,
             "[FusedSDPA] dropout_p=", o.dropout_p(), " is outside [0, 1); use e.g. 0.1.");

  Call c = call_with_shapes(q, k, v);
  c.scale = o.scale().has_value() ? *o.scale() : 1.0 / std::sqrt(static_cast<double>(c.d));
  VOLT_CHECK(std::isfinite(c.scale), ConfigError, "[FusedSDPA] scale=", c.scale,
             " is not finite; leave it unset for 1/sqrt(head_dim).");
  c.dropout_p = o.dropout_p();
  c.causal = o.is_causal();
  c.left_padding = o.seq_padding() == SeqPadding::kLeft;
  c.fast = o.softmax_mode() == SoftmaxMode::kFast;
  c.recompute = o.recompute().has_value() ? *o.recompute() : sdpa_recompute_enabled();
  c.needs_grad =
      at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
  c.want_probs = o.return_attn_probs();
  c.want_keep = o.return_dropout_mask();

  if (o.attn_mask().defined()) {
    const at::Tensor& m = o.attn_mask();
    VOLT_CHECK(m.scalar_type() == at::kBool || m.is_floating_point(), ValueError,
               "[FusedSDPA] attn_mask must be bool (true = attend) or floating (added to the "
               "scores); got ",
               m.scalar_type(), ".");
    VOLT_CHECK(m.device() == q.device(), ValueError, "[FusedSDPA] attn_mask is on ", m.device(),
               " but query is on ", q.device(), "; move it to the same device.");
    bool ok = m.dim() <= 4;
    for (int64_t i = 0; ok && i < m.dim(); ++i) {
      const int64_t want = std::array<int64_t, 4>{c.batch, c.heads, c.lq, c.lk}[4 - m.dim() + i];
      ok = m.size(i) == 1 || m.size(i) == want;
    }
    VOLT_CHECK(ok, ValueError, "[FusedSDPA] attn_mask ", shape(m),
               " does not broadcast to [batch, heads, Lq, Lk] = [", c.batch, ", ", c.heads, ", ",
               c.lq, ", ", c.lk, "].");
    c.mask = m;
  }
  if (o.valid_seq_len().defined()) {
    const at::Tensor& n = o.valid_seq_len();
    VOLT_CHECK(c.causal && !c.mask.defined(), ConfigError,
               "[FusedSDPA] valid_seq_len is supported only with is_causal=true and no "
               "attn_mask (as in the reference FusedSDPA); fold the padding into attn_mask "
               "instead.");
    VOLT_CHECK(c.lq == c.lk, ConfigError,
               "[FusedSDPA] valid_seq_len needs self-attention (Lq == Lk); got Lq=", c.lq,
               ", Lk=", c.lk, ".");
    VOLT_CHECK(!at::isFloatingType(n.scalar_type()) && n.scalar_type() != at::kBool &&
                   n.dim() == 1 && n.size(0) == c.batch,
               ValueError, "[FusedSDPA] valid_seq_len must be an integer tensor of shape [",
               c.batch, "] (one length per batch item); got ", n.scalar_type(), " ", shape(n), ".");
    c.lens = n.to(at::kCPU).to(at::kLong).contiguous();
    const int64_t* lp = c.lens.data_ptr<int64_t>();
    for (int64_t b = 0; b < c.batch; ++b) {
      VOLT_CHECK(lp[b] >= 0 && lp[b] <= c.lq, ValueError, "[FusedSDPA] valid_seq_len[", b,
                 "]=", lp[b], " is outside [0, ", c.lq, "] (the padded sequence length).");
    }
  }
  if (c.fast) {
    VOLT_CHECK(q.scalar_type() == at::kBFloat16, ConfigError,
               "[FusedSDPA] softmax_mode=fast supports only bfloat16 inputs (got ", q.scalar_type(),
               "); use SoftmaxMode::kExact or cast to bfloat16.");
    VOLT_CHECK(!(c.needs_grad && c.recompute && !c.causal), ConfigError,
               "[FusedSDPA] softmax_mode=fast is not supported for training in recompute mode "
               "with is_causal=false (as in the reference FusedSDPA); use recompute(false), "
               "is_causal(true) or SoftmaxMode::kExact.");
  }
  VOLT_CHECK(!(c.want_keep && c.recompute), ConfigError,
             "[FusedSDPA] return_dropout_mask needs non-recompute mode (recompute mode never "
             "stores the mask); pass recompute(false) or use SdpaRecomputeGuard(false).");
  VOLT_CHECK(!(c.want_probs && c.needs_grad), ConfigError,
             "[FusedSDPA] return_attn_probs is for inference only; call it under "
             "torch::NoGradGuard or with inputs that do not require grad.");
  if (c.dropout_p > 0 || c.want_keep) c.seed = o.dropout_seed().value_or(0);
  if ((c.dropout_p > 0 || c.want_keep) && !o.dropout_seed().has_value()) c.seed = draw_seed();
  c.seeded = o.dropout_seed().has_value();
  return c;
}

// Why the fused kernel cannot run this call; empty when it can.
std::string fused_unavailable_reason(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const Call& c) {
  if (detail::tracing()) return detail::kTracingReason;
  if (q.is_cuda()) {
    if (!detail::sdpa_cuda_available()) {
      return "this build has no CUDA attention path (it needs libtorch >= 2.1 with CUDA; "
             "tensors on " +
             q.device().str() + ")";
    }
    if (c.lens.defined()) {
      std::string why = detail::sdpa_cuda_varlen_unavailable(q, k, v);
      if (!why.empty()) return why;
      if (c.lens.sum().item<int64_t>() == 0) return "valid_seq_len is 0 for every batch item";
    }
    if (c.mask.defined()) {
      return "an attn_mask on CUDA (libtorch's kernels give NaN rather than zeros for a fully "
             "masked row)";
    }
    if (c.want_probs || c.want_keep) return "return_attn_probs / return_dropout_mask on CUDA";
    if (c.dropout_p > 0 && c.seeded) {
      return "dropout_seed on CUDA (libtorch's kernels draw dropout from the CUDA generator)";
    }
    if (!at::isFloatingType(q.scalar_type())) {
      return std::string("dtype ") + c10::toString(q.scalar_type());
    }
    return {};
  }
  if (!q.device().is_cpu()) return "no fused kernel for tensors on " + q.device().str();
  if (q.scalar_type() != at::kFloat && q.scalar_type() != at::kBFloat16) {
    return std::string("the CPU kernel supports float32 and bfloat16, not ") +
           c10::toString(q.scalar_type());
  }
  if (c.mask.defined() && c.mask.requires_grad() && at::GradMode::is_enabled()) {
    return "attn_mask requires grad (the kernel does not produce a mask gradient)";
  }
  return {};
}

bool materialise(const Call& c) {
  return c.want_probs || c.want_keep || (c.needs_grad && !c.recompute);
}

// Tensors the kernel reads, kept alive while the raw problem points into them.
struct Prepared {
  at::Tensor q, k, v, mask;
  detail::SdpaProblem p;
};

Prepared prepare(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const Call& c) {
  Prepared r;
  r.q = q.to(at::kFloat).contiguous();
  r.k = k.to(at::kFloat).contiguous();
  r.v = v.to(at::kFloat).contiguous();
  auto& p = r.p;
  p.batch = c.batch;
  p.heads = c.heads;
  p.lq = c.lq;
  p.lk = c.lk;
  p.d = c.d;
  p.dv = c.dv;
  p.scale = static_cast<float>(c.scale);
  p.q = r.q.data_ptr<float>();
  p.k = r.k.data_ptr<float>();
  p.v = r.v.data_ptr<float>();
  if (c.mask.defined()) {
    at::Tensor m = c.mask.detach();
    if (m.is_floating_point()) m = m.to(at::kFloat);
    r.mask = m.expand({c.batch, c.heads, c.lq, c.lk});
    for (int i = 0; i < 4; ++i) p.mask_stride[i] = r.mask.stride(i);
    if (r.mask.scalar_type() == at::kBool) {
      p.mask_b = r.mask.data_ptr<bool>();
    } else {
      p.mask_f = r.mask.data_ptr<float>();
    }
  }
  p.causal = c.causal;
  p.valid_len = c.lens.defined() ? c.lens.data_ptr<int64_t>() : nullptr;
  p.left_padding = c.left_padding;
  p.dropout_p = static_cast<float>(c.dropout_p);
  p.seed = c.seed;
  p.fast_exp = c.fast;
  return r;
}

struct ForwardOut {
  at::Tensor out, lse, probs, keep;  // out in the input dtype; lse/probs float32
};

ForwardOut run_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const Call& c) {
  Prepared pr = prepare(q, k, v, c);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  ForwardOut r;
  at::Tensor out = at::empty({c.batch, c.heads, c.lq, c.dv}, f32);
  r.lse = at::empty({c.batch, c.heads, c.lq}, f32);
  if (materialise(c)) {
    r.probs = at::empty({c.batch, c.heads, c.lq, c.lk}, f32);
    if (c.dropout_p > 0 || c.want_keep) {
      r.keep = at::empty({c.batch, c.heads, c.lq, c.lk}, at::TensorOptions().dtype(at::kBool));
    }
  }
  detail::sdpa_forward(pr.p, out.data_ptr<float>(), r.lse.data_ptr<float>(),
                       r.probs.defined() ? r.probs.data_ptr<float>() : nullptr,
                       r.keep.defined() ? r.keep.data_ptr<bool>() : nullptr);
  r.out = out.to(q.scalar_type());
  return r;
}

void save_call(torch::autograd::AutogradContext* ctx, const Call& c) {
  auto& s = ctx->saved_data;
  s["scale"] = c.scale;
  s["dropout_p"] = c.dropout_p;
  s["causal"] = c.causal;
  s["left"] = c.left_padding;
  s["fast"] = c.fast;
  s["seed"] = static_cast<int64_t>(c.seed);
  s["mask"] = c.mask.defined() ? c.mask.detach() : at::Tensor();
  s["lens"] = c.lens;
}

Call load_call(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
               const at::Tensor& v) {
  auto& s = ctx->saved_data;
  Call c = call_with_shapes(q, k, v);
  c.scale = s["scale"].toDouble();
  c.dropout_p = s["dropout_p"].toDouble();
  c.causal = s["causal"].toBool();
  c.left_padding = s["left"].toBool();
  c.fast = s["fast"].toBool();
  c.seed = static_cast<uint64_t>(s["seed"].toInt());
  c.mask = s["mask"].toTensor();
  c.lens = s["lens"].toTensor();
  return c;
}

class SdpaFunction : public torch::autograd::Function<SdpaFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& q, const at::Tensor& k,
                                                const at::Tensor& v, const Call* call,
                                                ForwardOut* extra) {
    ForwardOut r = run_forward(q, k, v, *call);
    ctx->save_for_backward({q, k, v, r.out, r.lse, r.probs, r.keep});
    save_call(ctx, *call);
    *extra = r;
    return {r.out};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3];
    const at::Tensor &lse = saved[4], &probs = saved[5], &keep = saved[6];
    Call c = load_call(ctx, q, k, v);
    Prepared pr = prepare(q, k, v, c);
    at::Tensor o32 = out.to(at::kFloat).contiguous();
    at::Tensor g32 = grads[0].to(at::kFloat).contiguous();
    const auto f32 = at::TensorOptions().dtype(at::kFloat);
    at::Tensor dq = at::empty({c.batch, c.heads, c.lq, c.d}, f32);
    at::Tensor dk = at::empty({c.batch, c.heads, c.lk, c.d}, f32);
    at::Tensor dv = at::empty({c.batch, c.heads, c.lk, c.dv}, f32);
    detail::sdpa_backward(pr.p, o32.data_ptr<float>(), g32.data_ptr<float>(), lse.data_ptr<float>(),
                          probs.defined() ? probs.data_ptr<float>() : nullptr,
                          keep.defined() ? keep.data_ptr<bool>() : nullptr, dq.data_ptr<float>(),
                          dk.data_ptr<float>(), dv.data_ptr<float>());
    return {dq.to(q.scalar_type()), dk.to(k.scalar_type()), dv.to(v.scalar_type()), at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

std::ostream& operator<<(std::ostream& os, const SdpaOptions& o) {
  os << "SdpaOptions(attn_mask="
     << (o.attn_mask().defined() ? shape(o.attn_mask()) : std::string("none"))
     << ", dropout_p=" << o.dropout_p() << ", is_causal=" << o.is_causal() << ", scale=";
  if (o.scale()) {
    os << *o.scale();
  } else {
    os << "1/sqrt(head_dim)";
  }
  os << ", softmax_mode=" << (o.softmax_mode() == SoftmaxMode::kFast ? "fast" : "exact")
     << ", recompute=";
  if (o.recompute()) {
    os << *o.recompute();
  } else {
    os << "scoped(" << sdpa_recompute_enabled() << ")";
  }
  os << ", valid_seq_len="
     << (o.valid_seq_len().defined() ? shape(o.valid_seq_len()) : std::string("none"))
     << ", seq_padding=" << (o.seq_padding() == SeqPadding::kLeft ? "left" : "right")
     << ", return_dropout_mask=" << o.return_dropout_mask()
     << ", return_attn_probs=" << o.return_attn_probs() << ", require_fused=" << o.require_fused()
     << ")";
  return os;
}

std::vector<at::Tensor> SdpaResult::to_list() const {
  std::vector<at::Tensor> out{output};
  if (attn_probs.defined()) out.push_back(attn_probs);
  if (dropout_mask.defined()) out.push_back(dropout_mask);
  return out;
}

SdpaResult fused_sdpa(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                      const SdpaOptions& options) {
  Call c = validate(query, key, value, options);
  const std::string reason = fused_unavailable_reason(query, key, value, c);
  if (!reason.empty()) {
    VOLT_CHECK(!options.require_fused(), NotAvailable,
               "[FusedSDPA] the fused kernel does not "
               "apply: ",
               reason,
               "; drop require_fused(true) to use the reference "
               "composition.");
    if (!detail::tracing()) {
      warn_once("sdpa-fallback:" + reason, "FusedSDPA",
                "using the reference composition: " + reason + ".");
    }
    SdpaOptions resolved = options;
    if (c.dropout_p > 0 || c.want_keep) resolved.dropout_seed(c.seed);
    resolved.recompute(c.recompute);
    return sdpa_reference(query, key, value, resolved);
  }
  SdpaResult result;
  if (query.is_cuda()) {
    // libtorch's fused kernels (FlashAttention / cuDNN / memory-efficient) with its own
    // autograd; they always recompute in backward, and their exp is their own (fast softmax
    // maps to it too).
    // valid_seq_len: FlashAttention's variable-length kernel over the valid tokens only.
    result.output = c.lens.defined()
                        ? detail::sdpa_cuda_varlen(query, key, value, c.lens, c.left_padding,
                                                   c.dropout_p, c.scale)
                        : detail::sdpa_cuda(query, key, value, c.causal, c.dropout_p, c.scale);
    return result;
  }
  ForwardOut r;
  if (c.needs_grad) {
    result.output = SdpaFunction::apply(query, key, value, &c, &r)[0];
  } else {
    at::NoGradGuard no_grad;
    r = run_forward(query, key, value, c);
    result.output = r.out;
  }
  if (c.want_probs) result.attn_probs = r.probs.to(query.scalar_type());
  if (c.want_keep) result.dropout_mask = r.keep;
  return result;
}

SdpaResult sdpa_reference(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                          const SdpaOptions& options) {
  Call c = validate(query, key, value, options);
  if (query.device().is_cpu() && query.scalar_type() == at::kHalf) {
    // libtorch 1.13 has no float16 CPU matmul ("bmm" not implemented for 'Half'): computed in
    // float32 (differentiable through the casts), returned in float16.
    SdpaOptions wide = options;
    const at::Tensor& m = options.attn_mask();
    if (m.defined() && m.scalar_type() == at::kHalf) wide.attn_mask(m.to(at::kFloat));
    SdpaResult r =
        sdpa_reference(query.to(at::kFloat), key.to(at::kFloat), value.to(at::kFloat), wide);
    r.output = r.output.to(at::kHalf);
    if (r.attn_probs.defined()) r.attn_probs = r.attn_probs.to(at::kHalf);
    return r;
  }
  const float neg_inf = -std::numeric_limits<float>::infinity();
  at::Tensor s = at::matmul(query, key.transpose(-2, -1)) * c.scale;
  at::Tensor allowed;
  if (c.causal) {
    allowed = at::ones({c.lq, c.lk}, query.options().dtype(at::kBool)).tril();
  }
  if (c.lens.defined()) {
    at::Tensor pos = at::arange(c.lq, at::TensorOptions().dtype(at::kLong)).unsqueeze(0);
    at::Tensor n = c.lens.unsqueeze(1);
    at::Tensor valid = c.left_padding ? pos >= (c.lq - n) : pos < n;  // [B, L]
    valid = valid.to(query.device());
    at::Tensor both = valid.unsqueeze(1).unsqueeze(3) & valid.unsqueeze(1).unsqueeze(2);
    allowed = allowed.defined() ? allowed & both : both;  // [B, 1, L, L]
  }
  if (c.mask.defined()) {
    if (c.mask.scalar_type() == at::kBool) {
      allowed = allowed.defined() ? allowed & c.mask : c.mask;
    } else {
      s = s + c.mask.to(s.scalar_type());
    }
  }
  if (allowed.defined()) s = s.masked_fill(allowed.logical_not(), neg_inf);
  // Rows with nothing to attend to give zeros (not softmax's NaN) and zero gradients.
  at::Tensor live = (s != neg_inf).any(-1, /*keepdim=*/true);
  s = s.masked_fill(live.logical_not(), 0.0);
  at::Tensor probs = at::softmax(s, -1) * live.to(s.scalar_type());
  SdpaResult result;
  at::Tensor pd = probs;
  if (c.dropout_p > 0 || c.want_keep) {
    at::Tensor keep =
        sdpa_dropout_mask(c.batch, c.heads, c.lq, c.lk, c.dropout_p, c.seed).to(query.device());
    if (c.dropout_p > 0) pd = probs * keep.to(probs.scalar_type()) * (1.0 / (1.0 - c.dropout_p));
    if (c.want_keep) result.dropout_mask = keep;
  }
  result.output = at::matmul(pd, value);
  if (c.want_probs) result.attn_probs = probs;
  return result;
}

at::Tensor sdpa_dropout_mask(int64_t batch, int64_t heads, int64_t lq, int64_t lk, double p,
                             uint64_t seed) {
  VOLT_CHECK(batch >= 0 && heads >= 0 && lq >= 0 && lk >= 0, ValueError,
             "[FusedSDPA] sdpa_dropout_mask sizes must be >= 0; got [", batch, ", ", heads, ", ",
             lq, ", ", lk, "].");
  VOLT_CHECK(p >= 0.0 && p < 1.0, ConfigError, "[FusedSDPA] dropout_p=", p, " is outside [0, 1).");
  at::Tensor keep = at::empty({batch, heads, lq, lk}, at::TensorOptions().dtype(at::kBool));
  detail::sdpa_dropout_keep(batch, heads, lq, lk, static_cast<float>(p), seed,
                            keep.data_ptr<bool>());
  return keep;
}

void set_sdpa_recompute(bool enabled) {
  g_recompute.store(enabled);
}

bool sdpa_recompute_enabled() {
  return t_recompute_scope >= 0 ? t_recompute_scope == 1 : g_recompute.load();
}

SdpaRecomputeGuard::SdpaRecomputeGuard(bool enabled) : previous_(t_recompute_scope) {
  t_recompute_scope = enabled ? 1 : 0;
}

SdpaRecomputeGuard::~SdpaRecomputeGuard() {
  t_recompute_scope = previous_;
}

}  // namespace volt
