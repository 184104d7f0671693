#include "volt/profiler/flops.h"

#include <ATen/record_function.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <vector>

#include "volt/core/check.h"

namespace volt {
namespace {

using Shape = std::vector<int64_t>;

enum class Formula { kMm, kAddmm, kBmm, kBaddbmm, kConvolution, kConvolutionBackward };

// torch.utils.flop_counter's table for the ops libtorch 1.13 has (its attention ops came later).
bool formula_of(const char* name, Formula* f) {
  static const std::pair<const char*, Formula> kTable[] = {
      {"aten::mm", Formula::kMm},
      {"aten::addmm", Formula::kAddmm},
      {"aten::bmm", Formula::kBmm},
      {"aten::baddbmm", Formula::kBaddbmm},
      {"aten::convolution", Formula::kConvolution},
      {"aten::_convolution", Formula::kConvolution},
      {"aten::convolution_backward", Formula::kConvolutionBackward},
  };
  for (const auto& [op, formula] : kTable) {
    if (std::strcmp(name, op) == 0) {
      *f = formula;
      return true;
    }
  }
  return false;
}

Shape shape_of(const c10::IValue& v) {
  if (!v.isTensor() || !v.toTensor().defined()) return {};
  const auto sizes = v.toTensor().sizes();
  return Shape(sizes.begin(), sizes.end());
}

int64_t product(const Shape& s, size_t from) {
  int64_t p = 1;
  for (size_t i = from; i < s.size(); ++i) p *= s[i];
  return p;
}

int64_t mm_flops(const Shape& a, const Shape& b) {
  if (a.size() != 2 || b.size() != 2) return 0;
  return 2 * a[0] * b[1] * a[1];
}

int64_t bmm_flops(const Shape& a, const Shape& b) {
  if (a.size() != 3 || b.size() != 3) return 0;
  return 2 * a[0] * a[1] * b[2] * a[2];
}

// torch's conv_flop_count: every output point (input point when transposed) of every batch
// entry convolves the filter over the channel product.
int64_t conv_flops(const Shape& x, const Shape& w, const Shape& out, bool transposed) {
  if (x.size() < 3 || w.size() < 3 || out.size() < 3) return 0;
  const Shape& points = transposed ? x : out;
  return 2 * product(points, 2) * product(w, 2) * x[0] * w[0] * w[1];
}

Shape swap01(Shape s) {
  if (s.size() >= 2) std::swap(s[0], s[1]);
  return s;
}

// A counted op seen at its start: its input shapes (outputs come at its end) and whether it
// is the outermost counted op on its thread.
struct OpContext : at::ObserverContext {
  Formula formula;
  bool outermost = false;
  std::vector<c10::IValue> args;  // the op's arguments, each tensor by its sizes
};

thread_local int counted_depth = 0;

// What the counter counted; one at a time (the op callbacks are plain functions).
struct Tally {
  mutable std::mutex mu;
  std::map<std::string, int64_t> counts;
  int64_t total = 0;

  void add(const char* op, int64_t flops) {
    if (flops <= 0) return;
    std::lock_guard<std::mutex> lock(mu);
    counts[op] += flops;
    total += flops;
  }
};

std::atomic<Tally*> active{nullptr};

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  Formula f;
  if (!formula_of(fn.name(), &f)) return nullptr;
  auto ctx = std::make_unique<OpContext>();
  ctx->formula = f;
  ctx->outermost = counted_depth == 0;
  if (ctx->outermost) {
    const auto in = fn.inputs();
    // Keep sizes only: holding the tensors would keep their storage alive past the op.
    for (const auto& v : in) {
      if (v.isTensor()) {
        const auto& t = v.toTensor();
        ctx->args.emplace_back(t.defined() ? c10::IValue(t.sizes().vec()) : c10::IValue());
      } else {
        ctx->args.push_back(v);
      }
    }
  }
  ++counted_depth;  // last: a throw above leaves the depth as it was (the end sees no context)
  return ctx;
}

Shape arg_shape(const OpContext& c, size_t i) {
  if (i >= c.args.size() || !c.args[i].isIntList()) return {};
  return c.args[i].toIntVector();
}

bool arg_bool(const OpContext& c, size_t i) {
  return i < c.args.size() && c.args[i].isBool() && c.args[i].toBool();
}

int64_t flops_of(const OpContext& c, const at::RecordFunction& fn) {
  switch (c.formula) {
    case Formula::kMm: return mm_flops(arg_shape(c, 0), arg_shape(c, 1));
    case Formula::kAddmm: return mm_flops(arg_shape(c, 1), arg_shape(c, 2));
    case Formula::kBmm: return bmm_flops(arg_shape(c, 0), arg_shape(c, 1));
    case Formula::kBaddbmm: return bmm_flops(arg_shape(c, 1), arg_shape(c, 2));
    case Formula::kConvolution: {
      // (input, weight, bias, stride, padding, dilation, transposed, ...) -> output
      const auto& out = fn.outputs();
      if (out.empty()) return 0;
      return conv_flops(arg_shape(c, 0), arg_shape(c, 1), shape_of(out[0]), arg_bool(c, 6));
    }
    case Formula::kConvolutionBackward: {
      // (grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
      //  output_padding, groups, output_mask) -> (grad_input, grad_weight, grad_bias)
      const Shape grad_out = arg_shape(c, 0), x = arg_shape(c, 1), w = arg_shape(c, 2);
      const bool transposed = arg_bool(c, 7);
      if (c.args.size() < 11 || !c.args[10].isBoolList()) return 0;
      const auto mask = c.args[10].toBoolList();
      const auto& out = fn.outputs();
      int64_t flops = 0;
      if (mask.size() > 0 && mask.get(0) && out.size() > 0) {
        flops += conv_flops(grad_out, w, shape_of(out[0]), !transposed);
      }
      if (mask.size() > 1 && mask.get(1) && out.size() > 1) {
        const Shape grad_w = shape_of(out[1]);
        flops += transposed ? conv_flops(swap01(grad_out), swap01(x), swap01(grad_w), false)
                            : conv_flops(swap01(x), swap01(grad_out), swap01(grad_w), false);
      }
      return flops;
    }
  }
  return 0;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext* raw) {
  auto* c = static_cast<OpContext*>(raw);
  if (c == nullptr) return;
  --counted_depth;
  if (!c->outermost) return;
  if (auto* tally = active.load()) tally->add(fn.name(), flops_of(*c, fn));
}

}  // namespace

struct FlopCounter::Impl {
  at::CallbackHandle handle = 0;
  Tally tally;
};

FlopCounter::FlopCounter() : impl_(std::make_unique<Impl>()) {
  Tally* expected = nullptr;
  VOLT_CHECK(active.compare_exchange_strong(expected, &impl_->tally), ValueError,
             "[FlopCounter] another FlopCounter is counting in this process; let it go out of "
             "scope first (one counter at a time).");
  impl_->handle = at::addThreadLocalCallback(at::RecordFunctionCallback(&on_start, &on_end)
                                                 .needsInputs(true)
                                                 .needsOutputs(true)
                                                 .scopes({at::RecordScope::FUNCTION}));
}

FlopCounter::~FlopCounter() {
  at::removeCallback(impl_->handle);
  active.store(nullptr);
}

int64_t FlopCounter::total_flops() const {
  std::lock_guard<std::mutex> lock(impl_->tally.mu);
  return impl_->tally.total;
}

std::map<std::string, int64_t> FlopCounter::flop_counts() const {
  std::lock_guard<std::mutex> lock(impl_->tally.mu);
  return impl_->tally.counts;
}

int64_t measure_flops(const std::function<at::Tensor()>& forward_fn,
                      const std::function<at::Tensor(const at::Tensor&)>& loss_fn) {
  VOLT_CHECK(static_cast<bool>(forward_fn), ValueError,
             "[measure_flops] forward_fn is empty; pass a function that runs the model's "
             "forward and returns its output.");
  FlopCounter counter;
  const at::Tensor out = forward_fn();
  if (loss_fn) {
    const at::Tensor loss = loss_fn(out);
    VOLT_CHECK(loss.defined() && loss.requires_grad(), ValueError,
               "[measure_flops] loss_fn returned ",
               loss.defined() ? "a tensor that does not require grad" : "an undefined tensor",
               "; return a loss computed from the model's output (e.g. output.sum()) with "
               "gradients enabled.");
    loss.backward();
  }
  return counter.total_flops();
}

}  // namespace volt
