#pragma once
/// FusedElementwise: a chain of elementwise float32 ops compiled at run time into one CPU loop
/// (one pass over memory instead of one per op), with the plain libtorch composition beside it.
/// Kernels are compiled by the system's C compiler and kept in the KernelCache, so a kernel is
/// compiled once per machine; `reference()` evaluates the same expression with libtorch ops.
///
///   using namespace volt::jit;
///   Expr x = input(0), bias = input(1), res = input(2);
///   Expr y = x + bias;
///   Expr gelu = 0.5 * y * (1.0 + tanh(0.7978845608 * (y + 0.044715 * y * y * y)));
///   volt::FusedElementwise bias_gelu_res("bias_gelu_res", {gelu + res});
///   at::Tensor out = bias_gelu_res({x_t, bias_t, res_t})[0];
///
/// Inputs broadcast as libtorch does, in the forms the loop handles directly: tensors of the
/// output's shape, one-element tensors, rows (sizes 1 except the last, which is the output's:
/// a bias) and columns (a last size of 1, the others the output's or leading 1s: a per-row
/// mean or scale).
/// Anything else (other broadcasts, dtypes, devices, no C compiler) runs `reference()`
/// instead, logged once; `require_fused` turns that into NotAvailable.
///
/// Row reductions: `row_sum` and `row_max` reduce over the last dimension of the outputs' shape
/// and broadcast back along it, so a softmax or a LayerNorm is one expression, and one kernel
/// that makes a few passes over each row while the row stays in cache:
///
///   Expr e = exp(x - detach(row_max(x)));  // the max only shifts the row: no gradient
///   volt::FusedElementwise softmax("softmax", {e / row_sum(e)});
///
/// In an expression with a row operation (row_sum, row_max, row_length, first_column), an
/// output that does not vary along the last dimension (it reads only reductions, constants and
/// inputs whose last size is 1) comes back with a last size of 1, as a keepdim reduction; the
/// others have the full shape. Sums accumulate in double, so they are at least as accurate as
/// libtorch's (equal within rounding, not bit for bit); maxima are exact and propagate NaN.
/// A forward that needs gradients keeps its reductions (a float per row each) for the
/// backward, which reads them instead of making those passes again (under create_graph it
/// recomputes them, so that higher-order gradients see them depend on the inputs).
///
/// exp (and sigmoid's) of arguments below -87, whose results are below 1.7e-38, is 0: glibc's
/// vector expf takes a slow scalar path there, 8x slower on a row masked with -inf.
///
/// Autograd: when an input requires grad, the outputs get a backward that is itself a
/// FusedElementwise, derived symbolically from the expression (libtorch's derivative formulas,
/// recomputing the forward values from the saved inputs in the same loop); a row input's
/// gradient (shape [..., D] of leading 1s, as a bias) is summed over the rows inside that loop,
/// other broadcast inputs' with at::sum_to. Where a derivative uses an output's value (exp,
/// tanh, sigmoid, relu, sqrt, a division) the backward reads the saved output instead of
/// computing it again, when that reads no more full-size tensors; and an output `a / s` whose
/// `s` is a row reduction gives `a` back as `output * s`: a softmax's backward reads its output
/// and makes no exp, as libtorch's (values then equal the recomputing backward's within
/// rounding). An output modified in place after the forward is not read: that backward
/// recomputes. Higher-order gradients (create_graph) recompute every forward value (every
/// gradient then at the full shape, summed by libtorch). The backward holds what it needs: the
/// object may be destroyed before it runs.

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <cstdint>
#include <iosfwd>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace volt {
namespace jit {

/// The operations an expression is made of.
// clang-format off
enum class Op {
  kInput, kConstant,
  kAdd, kSub, kMul, kDiv, kMaximum, kMinimum,
  kNeg, kAbs, kExp, kLog, kTanh, kSigmoid, kRelu, kSqrt, kErf,
  kSelectGt,  ///< a > b ? x : y
  kSelectEq,  ///< a == b ? x : y
  kRowSum,      ///< sum of a row (the last dimension), broadcast along it
  kRowMax,      ///< maximum of a row (NaN if the row has one), broadcast along it
  kRowLength,   ///< the length of the last dimension, as a float
  kFirstColumn, ///< a in the first column of each row, 0 elsewhere
  kDetach,      ///< a, through which no gradient flows
};
// clang-format on

/// A node of an elementwise expression: a value computed per element. Copies share the node,
/// so a sub-expression used twice is computed once.
class Expr {
 public:
  struct Node {
    /// Frees a deep chain without recursing once per node (a recursive free of a chain of ~1e5
    /// nodes would overflow the stack).
    ~Node();
    Op op;
    int64_t index = 0;  // kInput
    double value = 0;   // kConstant
    std::vector<std::shared_ptr<const Node>> args;
  };
  /// A constant (rounded to float32 once, as libtorch rounds a Python scalar).
  Expr(double value);  // NOLINT(google-explicit-constructor): 0.5 * x reads as maths
  explicit Expr(std::shared_ptr<const Node> node) : node_(std::move(node)) {}
  const std::shared_ptr<const Node>& node() const { return node_; }

 private:
  std::shared_ptr<const Node> node_;
};

/// The index-th tensor passed to FusedElementwise::operator() (index >= 0).
Expr input(int64_t index);

Expr operator+(const Expr& a, const Expr& b);
Expr operator-(const Expr& a, const Expr& b);
Expr operator*(const Expr& a, const Expr& b);
Expr operator/(const Expr& a, const Expr& b);
Expr operator-(const Expr& a);
/// NaN-propagating, as at::maximum / at::minimum.
Expr maximum(const Expr& a, const Expr& b);
Expr minimum(const Expr& a, const Expr& b);
Expr abs(const Expr& a);
Expr exp(const Expr& a);
Expr log(const Expr& a);
Expr tanh(const Expr& a);
Expr sigmoid(const Expr& a);
Expr relu(const Expr& a);
Expr sqrt(const Expr& a);
Expr erf(const Expr& a);
/// a > b ? x : y, per element (no gradient flows to a and b).
Expr where_greater(const Expr& a, const Expr& b, const Expr& x, const Expr& y);
/// a == b ? x : y, per element (no gradient flows to a and b).
Expr where_equal(const Expr& a, const Expr& b, const Expr& x, const Expr& y);

/// The sum over the last dimension, the same value at every position of the row (at::sum(a,
/// -1, true) broadcast back). A value that is already constant along the row is summed as often
/// as the row is long.
Expr row_sum(const Expr& a);
/// The maximum over the last dimension, broadcast along the row; NaN when the row holds one
/// (at::amax). Its gradient is split evenly between ties, as libtorch's.
Expr row_max(const Expr& a);
/// The length of the last dimension (1 for zero-dimensional outputs), e.g. row_sum(x) /
/// row_length() for a mean.
Expr row_length();
/// `a` in the first column of each row and 0 in the others: how a per-row gradient enters a
/// full-shape expression (row_sum(first_column(g)) == g).
Expr first_column(const Expr& a);
/// `a`, but no gradient flows through it (at::Tensor::detach): e.g. the maximum a softmax
/// subtracts, which does not change the result, so its gradient is zero mathematically and
/// needs no passes over the row to compute.
Expr detach(const Expr& a);

/// The gradient expressions of `outputs` with respect to inputs 0 .. num_inputs - 1, given the
/// output gradients as inputs num_inputs .. num_inputs + outputs.size() - 1 (libtorch's
/// derivative formulas; an input nothing depends on gets the constant 0). Gradients are values
/// per element of the full shape: an input that was broadcast sums its gradient (at::sum_to).
/// `row_outputs[o]` says output o came back with a last size of 1 (see above); its gradient
/// then enters through first_column. Empty: none did.
std::vector<Expr> gradients(const std::vector<Expr>& outputs, int64_t num_inputs,
                            const std::vector<bool>& row_outputs = {});

}  // namespace jit

/// How a FusedElementwise runs.
struct FusedElementwiseOptions {
  /// Throw NotAvailable instead of running reference() when the compiled loop does not apply
  /// (no compiler, dtype, device, broadcast, inputs that need a gradient). Default: false.
  TORCH_ARG(bool, require_fused) = false;
  /// Look kernels up in, and add them to, KernelCache::global(). Default: true.
  TORCH_ARG(bool, use_disk_cache) = true;
  /// Elements per at::parallel_for chunk. Default: 32768.
  TORCH_ARG(int64_t, grain_size) = 32768;
};

std::ostream& operator<<(std::ostream& os, const FusedElementwiseOptions& options);

namespace jit {

/// Where the kernels of this process came from (process-wide counters).
struct Stats {
  int64_t compiles = 0;     ///< kernels compiled by the C compiler
  int64_t disk_hits = 0;    ///< kernels loaded from the KernelCache
  int64_t memory_hits = 0;  ///< kernels this process had loaded already
  int64_t fallbacks = 0;    ///< calls that ran reference() instead
};
Stats stats();
/// Forgets the kernels loaded so far, so that the next call looks in the disk cache (the
/// libraries stay mapped: kernels handed out stay valid). For tests and benchmarks.
void forget_loaded_kernels();

}  // namespace jit

/// A fused elementwise kernel with one or more float32 outputs; thread-safe to call.
class FusedElementwise {
 public:
  /// `name` (letters, digits, '_') names the kernel in logs and cache entries; `outputs` are
  /// the expressions to compute (ValueError when empty or undefined).
  FusedElementwise(std::string name, std::vector<jit::Expr> outputs,
                   FusedElementwiseOptions options = {});

  /// The outputs for `inputs` (as many as the largest input index + 1), each of the inputs'
  /// broadcast shape (last size 1 for the per-row outputs of an expression with row
  /// operations), contiguous float32. Compiles (or loads) the kernel for this combination of
  /// input forms on first use.
  std::vector<at::Tensor> operator()(const std::vector<at::Tensor>& inputs) const;
  /// The same outputs computed with libtorch ops (differentiable; any dtype and device).
  std::vector<at::Tensor> reference(const std::vector<at::Tensor>& inputs) const;
  /// Why operator() would run reference() for `inputs`, or "" when the compiled loop applies.
  std::string fused_unavailable_reason(const std::vector<at::Tensor>& inputs) const;
  /// The C source of the kernel for `inputs`' forms (what gets compiled; for reading).
  std::string source(const std::vector<at::Tensor>& inputs) const;

  int64_t num_inputs() const { return num_inputs_; }
  /// Whether the expression uses a row operation (row_sum, row_max, row_length, first_column):
  /// its kernel then runs row by row.
  bool by_rows() const { return by_rows_; }
  const std::string& name() const { return name_; }
  const FusedElementwiseOptions& options() const { return options_; }

 private:
  // (inputs, outputs, begin, end, row length, each input's element count)
  using KernelFn = void (*)(const float* const*, float* const*, int64_t, int64_t, int64_t,
                            const int64_t*);
  std::string forms_of(const std::vector<at::Tensor>& inputs, std::string* why) const;
  // The kernel for `forms`, compiled or loaded on first use; nullptr with the reason in *why
  // when it cannot be built (remembered: a fallback does not retry or regenerate every call).
  // *scratch_rows: the rows of `cols` floats per thread a row kernel keeps values in.
  KernelFn kernel_for(const std::string& forms, std::string* why,
                      int64_t* scratch_rows = nullptr) const;

  std::vector<at::Tensor> run_kernel(KernelFn fn, const std::string& forms,
                                     const std::vector<at::Tensor>& inputs,
                                     const std::vector<int64_t>& shape,
                                     const std::vector<bool>& row_out, int64_t scratch_rows) const;
  // Which outputs come back with a last size of 1 for `inputs` (none unless by_rows()).
  std::vector<bool> row_outputs(const std::vector<at::Tensor>& inputs) const;
  // The backward kernel. `forms` empty: the one for create_graph, which recomputes every
  // forward value from the inputs. Else the usual one, for the forward's input forms `forms`:
  // with `with_stats` it reads the forward's reductions (inputs after the output gradients)
  // instead of recomputing them; it reads the forward's outputs (inputs after those) where a
  // derivative uses them and that reads no more full-size tensors (a softmax's backward reads
  // its output, as libtorch's, instead of the exps); `summed[i]`: input i's gradient comes
  // back summed over the rows (a row input's, column_sums_), else at the full shape.
  // Gradients that are one expression (x's and the residual's in x + residual) are one output
  // of the kernel, and an output gradient passed through unchanged is no output at all: both
  // come back as the same tensor, as libtorch's AddBackward hands them on.
  struct Backward {
    std::shared_ptr<const FusedElementwise> kernel;  // nullptr: every gradient passes through
    // Per input needing a gradient, in order: slot >= 0 is that output of the kernel, -1 - k
    // the backward's input k (an output gradient) itself.
    std::vector<int64_t> slots;
  };
  std::shared_ptr<const Backward> backward_for(const std::vector<bool>& needs_grad,
                                               const std::vector<bool>& row_out, bool with_stats,
                                               const std::vector<bool>& summed,
                                               const std::string& forms) const;
  // This expression with its reductions as extra (per-row) outputs: what a forward that needs
  // a gradient runs, so that the backward reads them.
  std::shared_ptr<const FusedElementwise> with_stats() const;

  std::string name_;
  std::vector<jit::Expr> outputs_;
  FusedElementwiseOptions options_;
  int64_t num_inputs_ = 0;
  bool by_rows_ = false;
  std::vector<jit::Expr> reductions_;  // row_sum / row_max nodes, in evaluation order
  // Outputs summed over the rows into one row of the row length (each thread accumulates its
  // rows in doubles): how a backward kernel returns a row input's gradient (a bias, a
  // LayerNorm weight) without writing it at the full shape first. Empty: none.
  std::vector<bool> column_sums_;
  // reads_[i]: the expression reads input i.
  std::vector<bool> reads_;
  mutable std::mutex mu_;
  mutable std::shared_ptr<const FusedElementwise> with_stats_;
  struct Built {
    KernelFn fn = nullptr;  // nullptr: it could not be built, for the reason in `why`
    std::string why;
    int64_t scratch_rows = 0;
  };
  mutable std::map<std::string, Built> kernels_;  // by input forms
  // row_outputs(), by which inputs have a last size of 1 ('1'/'0' per input).
  mutable std::map<std::string, std::vector<bool>> row_outputs_;
  // Backward kernels, by which inputs need a gradient ('1'/'0' per input), which outputs are
  // per row, and which gradients are summed over the rows.
  mutable std::map<std::string, std::shared_ptr<const Backward>> backward_;
};

}  // namespace volt
