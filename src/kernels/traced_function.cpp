// TracedFunction: libtorch's tracer records the ops; a partition pass groups elementwise chains
// into FusedElementwise kernels; a small interpreter runs the steps. See traced_function.h.
//
// The partition keeps the graph of steps acyclic: a node joins a group only if none of its
// other inputs depends on that group (a group cannot both feed and wait for the same node), and
// all members of a group produce the group's shape (FusedElementwise computes every output at
// the broadcast shape of all its inputs) or, in a group with row reductions, that shape's row
// for the values that do not vary along it. The steps then run in a topological order of the
// groups and single nodes, each value freed after its last use.

#include "volt/kernels/traced_function.h"

#include <ATen/autocast_mode.h>
#include <ATen/core/stack.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>
#include <c10/util/accumulate.h>
#include <torch/csrc/jit/frontend/tracer.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iomanip>
#include <list>
#include <map>
#include <mutex>
#include <ostream>
#include <queue>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "core/detail/ascii.h"
#include "core/detail/host_syncs.h"
#include "core/detail/numbers.h"
#include "kernels/detail/host_read_watch.h"
#include "kernels/detail/row_shapes.h"
#include "volt/core/check.h"
#include "volt/core/errors.h"
#include "volt/core/log.h"

namespace volt {

namespace {

constexpr const char* kComponent = "TracedFunction";

using torch::jit::Node;
using torch::jit::Value;

// Fused kernels are named "<name>_g<k>", and FusedElementwise takes up to 64 characters.
bool valid_name(const std::string& name) {
  if (name.empty() || name.size() > 56) return false;
  return std::all_of(name.begin(), name.end(),
                     [](char c) { return detail::ascii_alnum(c) || c == '_'; });
}

// One step of a trace: a recorded node run through its operator, or a fused chain.
struct Step {
  mutable torch::jit::Operation op{nullptr};  // a recorded node (its call is not const)
  std::shared_ptr<FusedElementwise> fused;    // or a fused chain
  std::vector<int64_t> in;                    // slots read
  std::vector<int64_t> out;                   // slots written
  std::vector<int64_t> release;               // slots whose last reader is this step
};

// The float32 CPU tensor type with known sizes of `v`, or nullptr.
c10::TensorTypePtr float_cpu_tensor(const Value* v) {
  auto t = v->type()->cast<c10::TensorType>();
  if (!t) return nullptr;
  if (t->scalarType() != c10::ScalarType::Float) return nullptr;
  if (!t->device() || !t->device()->is_cpu()) return nullptr;
  if (!t->sizes().concrete_sizes()) return nullptr;
  return t;
}

// The sizes of the float32 CPU tensor `v` (known), or nullopt.
c10::optional<std::vector<int64_t>> sizes_of(const Value* v) {
  auto t = float_cpu_tensor(v);
  if (!t) return c10::nullopt;
  return *t->sizes().concrete_sizes();
}

// A constant number input of a node, or nullopt.
c10::optional<double> constant_number(const Value* v) {
  auto iv = torch::jit::toIValue(v);
  if (!iv) return c10::nullopt;
  if (iv->isDouble()) return iv->toDouble();
  if (iv->isInt()) return static_cast<double>(iv->toInt());
  if (iv->isBool()) return iv->toBool() ? 1.0 : 0.0;
  return c10::nullopt;
}

bool is_none_constant(const Value* v) {
  auto iv = torch::jit::toIValue(v);
  return iv && iv->isNone();
}

// How one recorded op becomes an expression: `arg(i)` is the expression of input i (a tensor,
// or the constant number), nullopt when the op (this overload, these constants) is not fused.
using ArgFn = std::function<jit::Expr(size_t)>;

bool is_tensor_input(const Node* n, size_t i) {
  return n->inputs()[i]->type()->cast<c10::TensorType>() != nullptr;
}

// One fused op: whether a node of its kind can be fused (its overload, the constants it needs)
// and the expression it becomes, `arg(i)` being the expression of input i (a tensor, or the
// constant number). One table, so what is accepted and what is lowered cannot drift apart.
struct Lowering {
  std::function<bool(const Node*)> accepts;
  std::function<jit::Expr(const Node*, const std::function<jit::Expr(size_t)>&)> lower;
  /// A reduction over the last dimension kept as a size of 1 (sum, mean, amax): its chain's
  /// shape is its input's, its output that shape's row.
  bool reduces = false;
  /// Reads whole rows (the reductions, softmax, log_softmax, layer_norm): a chain holding one
  /// runs row by row, and its per-row values come back with a last size of 1.
  bool by_rows = false;
};

// The constant integers of `v`: an int, an int list constant, or the list the tracer builds
// from constants for an IntArrayRef argument (prim::ListConstruct); nullopt for anything else.
c10::optional<std::vector<int64_t>> constant_ints(const Value* v) {
  if (auto iv = torch::jit::toIValue(v)) {
    if (iv->isInt()) return std::vector<int64_t>{iv->toInt()};
    if (iv->isIntList()) return iv->toIntList().vec();
    return c10::nullopt;
  }
  if (v->node()->kind() != c10::prim::ListConstruct) return c10::nullopt;
  std::vector<int64_t> out;
  for (const Value* e : v->node()->inputs()) {
    auto iv = torch::jit::toIValue(e);
    if (!iv || !iv->isInt()) return c10::nullopt;
    out.push_back(iv->toInt());
  }
  return out;
}

// The shortest rows the row loop runs a traced softmax or log_softmax over (see
// softmax_over_last); shorter ones are fused only where the lane loop runs them.
constexpr int64_t kShortExpRow = 128;

// Whether a softmax / log_softmax over `rows` rows of `cols` values is fused: measured against
// libtorch's kernels (log_softmax(x * 0.5) at [4096, cols], docs/PERFORMANCE.md, session 50).
// Rows of at most detail::kLaneCols values run in the lane loop when there are at least
// detail::kLanes of them: 2.4-5.7x libtorch's, except where libtorch's 8-float vectors fill the
// row exactly (8, 16, 24 values: 0.8-1.2x); fewer rows, or rows of 32-127 values, take the row
// loop, 0.4-1.1x; from 128 on it wins (1.2-1.7x).
bool fuse_softmax_over(int64_t rows, int64_t cols) {
  return cols >= kShortExpRow ||
         (cols <= detail::kLaneCols && cols % 8 != 0 && rows >= detail::kLanes);
}

// Whether `n` reduces input 0 over its last dimension only: `dim` (input i) is that dimension
// as an int or a one-element list (-1 or dim - 1), and the rows are not empty.
bool over_last_dim(const Node* n, size_t i) {
  const auto sizes = sizes_of(n->inputs()[0]);
  if (!sizes || sizes->empty() || sizes->back() == 0) return false;
  const auto dims = constant_ints(n->inputs()[i]);
  if (!dims || dims->size() != 1) return false;
  const int64_t dim = dims->front();
  const auto rank = static_cast<int64_t>(sizes->size());
  return dim == -1 || dim == rank - 1;
}

bool is_true_constant(const Value* v) {
  auto iv = torch::jit::toIValue(v);
  return iv && iv->isBool() && iv->toBool();
}

const std::map<std::string, Lowering>& lowerings() {
  using namespace jit;  // NOLINT: the expression language reads as maths
  using Arg = std::function<Expr(size_t)>;
  static const std::map<std::string, Lowering> table = [] {
    auto number = [](const Node* n, size_t i) {
      return constant_number(n->inputs()[i]).has_value();
    };
    auto tensor_or_number = [=](const Node* n, size_t i) {
      return is_tensor_input(n, i) || number(n, i);
    };
    auto overload = [](const Node* n) { return n->schema().overload_name(); };
    // add/sub/rsub (Tensor or Scalar) with a constant alpha.
    auto with_alpha = [=](const Node* n) {
      return (overload(n) == "Tensor" || overload(n) == "Scalar") && n->inputs().size() == 3 &&
             tensor_or_number(n, 1) && number(n, 2);
    };
    auto scaled = [](const Node* n, const Arg& arg, size_t i) {
      const double alpha = *constant_number(n->inputs()[2]);
      return alpha == 1 ? arg(i) : arg(i) * Expr(alpha);
    };
    auto binary = [=](const Node* n) {
      return (overload(n) == "Tensor" || overload(n) == "Scalar") && n->inputs().size() == 2 &&
             tensor_or_number(n, 1);
    };
    auto one_input = [](const Node* n) { return n->inputs().size() == 1; };
    auto unary = [=](Expr (*f)(const Expr&)) {
      return Lowering{one_input, [f](const Node*, const Arg& arg) { return f(arg(0)); }};
    };
    auto clamp_bound = [=](const Node* n) { return overload(n).empty() && number(n, 1); };
    std::map<std::string, Lowering> t;
    t["aten::add"] = {with_alpha,
                      [=](const Node* n, const Arg& arg) { return arg(0) + scaled(n, arg, 1); }};
    t["aten::sub"] = {with_alpha,
                      [=](const Node* n, const Arg& arg) { return arg(0) - scaled(n, arg, 1); }};
    t["aten::rsub"] = {with_alpha,
                       [=](const Node* n, const Arg& arg) { return arg(1) - scaled(n, arg, 0); }};
    t["aten::mul"] = {binary, [](const Node*, const Arg& arg) { return arg(0) * arg(1); }};
    t["aten::div"] = {binary, [](const Node*, const Arg& arg) { return arg(0) / arg(1); }};
    t["aten::neg"] = {one_input, [](const Node*, const Arg& arg) { return -arg(0); }};
    t["aten::abs"] = unary(&jit::abs);
    t["aten::exp"] = unary(&jit::exp);
    t["aten::log"] = unary(&jit::log);
    t["aten::tanh"] = unary(&jit::tanh);
    t["aten::sigmoid"] = unary(&jit::sigmoid);
    t["aten::relu"] = unary(&jit::relu);
    t["aten::sqrt"] = unary(&jit::sqrt);
    t["aten::erf"] = unary(&jit::erf);
    t["aten::rsqrt"] = {one_input,
                        [](const Node*, const Arg& arg) { return Expr(1.0) / sqrt(arg(0)); }};
    t["aten::reciprocal"] = {one_input,
                             [](const Node*, const Arg& arg) { return Expr(1.0) / arg(0); }};
    t["aten::square"] = {one_input, [](const Node*, const Arg& arg) { return arg(0) * arg(0); }};
    t["aten::silu"] = {one_input,
                       [](const Node*, const Arg& arg) { return arg(0) * sigmoid(arg(0)); }};
    auto two_inputs = [](const Node* n) { return n->inputs().size() == 2; };
    auto max_of = [](const Node*, const Arg& arg) { return maximum(arg(0), arg(1)); };
    auto min_of = [](const Node*, const Arg& arg) { return minimum(arg(0), arg(1)); };
    t["aten::maximum"] = {two_inputs, max_of};
    t["aten::minimum"] = {two_inputs, min_of};
    // clamp by selects, not maximum/minimum: at a bound the whole gradient flows (torch's
    // clamp_backward takes min <= x <= max), where maximum's splits it between tied operands.
    auto at_least = [](const Expr& x, const Expr& lo) { return where_greater(lo, x, lo, x); };
    auto at_most = [](const Expr& x, const Expr& hi) { return where_greater(x, hi, hi, x); };
    t["aten::clamp_min"] = {clamp_bound,
                            [=](const Node*, const Arg& arg) { return at_least(arg(0), arg(1)); }};
    t["aten::clamp_max"] = {clamp_bound,
                            [=](const Node*, const Arg& arg) { return at_most(arg(0), arg(1)); }};
    t["aten::clamp"] = {[=](const Node* n) {
                          return overload(n).empty() && n->inputs().size() == 3 &&
                                 (number(n, 1) || is_none_constant(n->inputs()[1])) &&
                                 (number(n, 2) || is_none_constant(n->inputs()[2]));
                        },
                        [=](const Node* n, const Arg& arg) {
                          Expr x = arg(0);
                          if (!is_none_constant(n->inputs()[1])) x = at_least(x, arg(1));
                          if (!is_none_constant(n->inputs()[2])) x = at_most(x, arg(2));
                          return x;
                        }};
    t["aten::leaky_relu"] = {[=](const Node* n) { return two_inputs(n) && number(n, 1); },
                             [](const Node*, const Arg& arg) {
                               const Expr x = arg(0);
                               return where_greater(x, Expr(0.0), x, x * arg(1));
                             }};
    t["aten::pow"] = {[](const Node* n) {
                        if (n->schema().overload_name() != "Tensor_Scalar") return false;
                        auto e = constant_number(n->inputs()[1]);
                        return e && (*e == 2 || *e == 3 || *e == 0.5 || *e == -1);
                      },
                      [](const Node* n, const Arg& arg) {
                        const Expr x = arg(0);
                        const double e = *constant_number(n->inputs()[1]);
                        if (e == 2) return x * x;
                        if (e == 3) return x * x * x;
                        if (e == 0.5) return sqrt(x);
                        return Expr(1.0) / x;  // -1
                      }};
    // Reductions over the last dimension, kept (keepdim=true), in the input's dtype.
    auto keepdim_reduction = [=](const Node* n, const std::string& overload_name, size_t inputs) {
      return overload(n) == overload_name && n->inputs().size() == inputs && over_last_dim(n, 1) &&
             is_true_constant(n->inputs()[2]) && (inputs == 3 || is_none_constant(n->inputs()[3]));
    };
    // The row's length as the replay finds it: after an op whose size follows the data
    // (nonzero, index_select) it is not the traced one.
    auto row_len = [](const Node*) { return row_length(); };
    t["aten::sum"] = {[=](const Node* n) { return keepdim_reduction(n, "dim_IntList", 4); },
                      [](const Node*, const Arg& arg) { return row_sum(arg(0)); }, true, true};
    // libtorch's mean is the sum divided by the count.
    t["aten::mean"] = {[=](const Node* n) { return keepdim_reduction(n, "dim", 4); },
                       [=](const Node* n, const Arg& arg) { return row_sum(arg(0)) / row_len(n); },
                       true, true};
    t["aten::amax"] = {[=](const Node* n) { return keepdim_reduction(n, "", 3); },
                       [](const Node*, const Arg& arg) { return row_max(arg(0)); }, true, true};
    // softmax and log_softmax over the last dimension, without a dtype: max, exp, sum, as
    // libtorch's kernels compute them. The maximum only shifts the row (the result does not
    // depend on it), so no gradient flows through it, as in libtorch's backward formulas.
    // Only over rows where the fused kernel beats libtorch's (fuse_softmax_over); over the
    // others the op stays libtorch's and its neighbours still fuse.
    auto softmax_over_last = [=](const Node* n) {
      if (overload(n) != "int" || n->inputs().size() != 3 || !over_last_dim(n, 1) ||
          !is_none_constant(n->inputs()[2])) {
        return false;
      }
      const std::vector<int64_t> sizes = *sizes_of(n->inputs()[0]);  // not empty: over_last_dim
      return fuse_softmax_over(c10::multiply_integers(sizes) / sizes.back(), sizes.back());
    };
    t["aten::softmax"] = {softmax_over_last,
                          [](const Node*, const Arg& arg) {
                            const Expr x = arg(0);
                            const Expr e = exp(x - detach(row_max(x)));
                            return e / row_sum(e);
                          },
                          false, true};
    t["aten::log_softmax"] = {softmax_over_last,
                              [](const Node*, const Arg& arg) {
                                const Expr d = arg(0) - detach(row_max(arg(0)));
                                return d - log(row_sum(exp(d)));
                              },
                              false, true};
    // layer_norm over the last dimension: (x - mean) * rstd [* weight] [+ bias], the biased
    // variance, rstd = 1 / sqrt(var + eps). Only where no gradient is needed: libtorch's own
    // backward reads its saved statistics and sums the weight's and bias's gradients over rows
    // in one kernel. A fused chain's backward measured 0.6x of eager for a residual +
    // layer_norm forward and backward at [4096, 1024] in session 47, and parity (1.00-1.04x)
    // since session 49 (2x faster forward only; docs/PERFORMANCE.md): no gain to take there.
    t["aten::layer_norm"] = {[](const Node* n) {
                               auto out = n->output()->type()->cast<c10::TensorType>();
                               if (!out || out->requiresGrad().value_or(true)) return false;
                               if (n->inputs().size() != 6) return false;
                               const auto sizes = sizes_of(n->inputs()[0]);
                               const auto shape = constant_ints(n->inputs()[1]);
                               if (!sizes || sizes->empty() || sizes->back() == 0 || !shape ||
                                   *shape != std::vector<int64_t>{sizes->back()} ||
                                   !constant_number(n->inputs()[4])) {
                                 return false;
                               }
                               for (size_t i : {size_t{2}, size_t{3}}) {
                                 if (!is_none_constant(n->inputs()[i]) && !is_tensor_input(n, i)) {
                                   return false;
                                 }
                               }
                               return true;
                             },
                             [=](const Node* n, const Arg& arg) {
                               const Expr x = arg(0), len = row_len(n);
                               const double eps = *constant_number(n->inputs()[4]);
                               const Expr d = x - row_sum(x) / len;
                               Expr y = d * (Expr(1.0) / sqrt(row_sum(d * d) / len + eps));
                               if (!is_none_constant(n->inputs()[2])) y = y * arg(2);
                               if (!is_none_constant(n->inputs()[3])) y = y + arg(3);
                               return y;
                             },
                             false, true};
    t["aten::gelu"] = {[](const Node* n) {
                         if (n->inputs().size() != 2) return false;
                         auto iv = torch::jit::toIValue(n->inputs()[1]);
                         return iv && iv->isString() &&
                                (iv->toStringRef() == "none" || iv->toStringRef() == "tanh");
                       },
                       [](const Node* n, const Arg& arg) {
                         const Expr x = arg(0);
                         if (torch::jit::toIValue(n->inputs()[1])->toStringRef() == "tanh") {
                           return 0.5 * x *
                                  (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
                         }
                         return 0.5 * x * (1.0 + erf(x * 0.7071067811865476));
                       }};
    return t;
  }();
  return table;
}

// Whether `n` is an op the table knows, with the constants it needs.
bool fusible_op(const Node* n) {
  if (n->outputs().size() != 1 || !n->maybeSchema()) return false;
  auto it = lowerings().find(n->kind().toQualString());
  return it != lowerings().end() && it->second.accepts(n);
}

// The table's entry of a fusible node.
const Lowering& lowering_of(const Node* n) {
  return lowerings().at(n->kind().toQualString());
}

// The shape of a chain holding chains of shapes a and b, when they can be one: equal shapes,
// or one the other's row (what a reduction over the last dimension keeps).
c10::optional<std::vector<int64_t>> merged_shape(const std::vector<int64_t>& a,
                                                 const std::vector<int64_t>& b) {
  if (a == b) return a;
  if (!b.empty() && a == detail::row_shape(b)) return b;
  if (!a.empty() && b == detail::row_shape(a)) return a;
  return c10::nullopt;
}

// The expression of a node fusible_op() accepted.
jit::Expr translate(const Node* n, const ArgFn& input_expr) {
  // The operands in input order, so a chain's kernel inputs are numbered as the graph reads them
  // (C++ leaves the evaluation order of `arg(0) + arg(1)` to the compiler).
  std::vector<c10::optional<jit::Expr>> operands(n->inputs().size());
  for (size_t i = 0; i < operands.size(); ++i) {
    if (is_tensor_input(n, i) || constant_number(n->inputs()[i])) operands[i] = input_expr(i);
  }
  return lowerings().at(n->kind().toQualString()).lower(n, [&](size_t i) {
    return *operands.at(i);
  });
}

// Whether `n` can be part of a fused chain: a known op whose tensors are all float32 on the CPU
// with known sizes.
bool fusible(const Node* n) {
  if (!fusible_op(n)) return false;
  if (!float_cpu_tensor(n->output())) return false;
  for (size_t i = 0; i < n->inputs().size(); ++i) {
    if (is_tensor_input(n, i) && !float_cpu_tensor(n->inputs()[i])) return false;
  }
  return true;
}

// The operation of the prim nodes a trace records that the interpreter runs itself (they have
// no registered operator), or nullptr.
torch::jit::Operation prim_operation(const Node* node) {
  const size_t num_inputs = node->inputs().size();
  const size_t num_outputs = node->outputs().size();
  if (node->kind() == c10::prim::ListConstruct) {
    const c10::TypePtr element =
        node->output()->type()->expectRef<c10::ListType>().getElementType();
    return torch::jit::Operation([element, num_inputs](torch::jit::Stack& stack) {
      c10::impl::GenericList list(element);
      list.reserve(num_inputs);
      for (size_t i = stack.size() - num_inputs; i < stack.size(); ++i) list.push_back(stack[i]);
      torch::jit::drop(stack, num_inputs);
      stack.emplace_back(std::move(list));
    });
  }
  if (node->kind() == c10::prim::TupleConstruct) {
    return torch::jit::Operation([num_inputs](torch::jit::Stack& stack) {
      std::vector<c10::IValue> elements(stack.end() - static_cast<int64_t>(num_inputs),
                                        stack.end());
      torch::jit::drop(stack, num_inputs);
      stack.emplace_back(c10::ivalue::Tuple::create(std::move(elements)));
    });
  }
  if (node->kind() == c10::prim::ListUnpack || node->kind() == c10::prim::TupleUnpack) {
    const bool tuple = node->kind() == c10::prim::TupleUnpack;
    return torch::jit::Operation([tuple, num_outputs](torch::jit::Stack& stack) {
      c10::IValue whole = torch::jit::pop(stack);
      std::vector<c10::IValue> elements;
      if (tuple) {
        elements = whole.toTupleRef().elements().vec();
      } else {
        for (const c10::IValue& e : whole.toListRef()) elements.push_back(e);
      }
      TORCH_CHECK(elements.size() == num_outputs, "unpacking ", elements.size(), " values into ",
                  num_outputs);
      for (auto& e : elements) stack.push_back(std::move(e));
    });
  }
  return torch::jit::Operation(nullptr);
}

std::string signature_text(const std::vector<at::Tensor>& inputs) {
  auto os = detail::c_stream<std::ostringstream>();
  os << "(";
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (i) os << ", ";
    const auto& t = inputs[i];
    if (!t.defined()) {
      os << "undefined";
      continue;
    }
    os << t.scalar_type() << t.sizes();
    if (!t.device().is_cpu()) os << "@" << t.device();
    if (t.requires_grad()) os << " requires_grad";
  }
  return os.str() + ")";
}

}  // namespace

std::ostream& operator<<(std::ostream& os, const TraceOptions& o) {
  return os << "TraceOptions(min_fused_ops=" << o.min_fused_ops()
            << ", max_traces=" << o.max_traces() << ", check_calls=" << o.check_calls()
            << ", fuse=" << (o.fuse() ? "true" : "false") << ", fused_options=" << o.fused_options()
            << ")";
}

namespace {

// Ops that return memory nothing has written.
bool allocates_unfilled(const Node* n) {
  static const std::set<std::string> kinds = {"aten::empty", "aten::empty_like", "aten::new_empty",
                                              "aten::empty_strided", "aten::new_empty_strided"};
  return kinds.count(n->kind().toQualString()) > 0;
}

// The first access to `v` or to a view of it, by node position; nullopt when nothing accesses
// it. Ops that return an alias of an input (views) pass the question on to their outputs; the
// graph's return reads after every node; at one position a write counts first.
struct Access {
  size_t at;
  bool write;
};

// Whether `use` reads only its input's sizes, dtype and device (a `*_like` factory's template,
// the shape argument of view_as, expand_as, reshape_as, and size queries), not its values.
bool reads_only_sizes(const torch::jit::Use& use) {
  const std::string kind = use.user->kind().toQualString();
  static const std::set<std::string> shape_of_second = {"aten::view_as", "aten::expand_as",
                                                        "aten::reshape_as"};
  if (shape_of_second.count(kind)) return use.offset == 1;
  static const std::set<std::string> metadata = {"aten::size", "aten::numel", "aten::dim"};
  if (metadata.count(kind)) return true;
  const std::string suffix = "_like";
  return use.offset == 0 && kind.size() > suffix.size() &&
         kind.compare(kind.size() - suffix.size(), suffix.size(), suffix) == 0;
}

c10::optional<Access> first_access(const Value* v,
                                   const std::unordered_map<const Node*, size_t>& position) {
  c10::optional<Access> first;
  auto consider = [&](Access a) {
    if (!first || a.at < first->at || (a.at == first->at && a.write)) first = a;
  };
  for (const torch::jit::Use& use : v->uses()) {
    auto it = position.find(use.user);
    if (it == position.end()) {
      consider({SIZE_MAX, false});
      continue;
    }
    if (reads_only_sizes(use)) continue;
    const c10::FunctionSchema* schema = use.user->maybeSchema();
    const c10::AliasInfo* alias = schema != nullptr && use.offset < schema->arguments().size()
                                      ? schema->arguments()[use.offset].alias_info()
                                      : nullptr;
    if (alias != nullptr && alias->isWrite()) {
      consider({it->second, true});
    } else if (alias != nullptr) {
      for (const Value* out : use.user->outputs()) {
        if (out->type()->cast<c10::TensorType>() == nullptr) continue;
        if (auto a = first_access(out, position)) consider(*a);
      }
    } else {
      consider({it->second, false});
    }
  }
  return first;
}

// What a call ran, in a form two calls can be compared by: one line per recorded op (its kind and
// its inputs: the graph's inputs by position, other ops' outputs by op and position, constants
// by value), then the returned values; constant tensors apart, compared by value. (Output types
// need no comparing: the same ops on inputs of one signature give the same ones.)
struct OpsRun {
  std::vector<std::string> lines;
  std::vector<at::Tensor> constants;
};

std::string constant_text(const c10::IValue& v) {
  auto os = detail::c_stream<std::ostringstream>();
  if (v.isDouble()) {
    os << std::setprecision(17) << v.toDouble();
  } else {
    os << v;
  }
  return os.str();
}

std::string tensor_text(const at::Tensor& t) {
  auto os = detail::c_stream<std::ostringstream>();
  os << t.scalar_type() << t.sizes();
  if (!t.device().is_cpu()) os << "@" << t.device();
  return os.str();
}

OpsRun ops_run(const torch::jit::Graph& graph) {
  OpsRun out;
  std::unordered_map<const Value*, std::string> name;
  for (size_t i = 0; i < graph.inputs().size(); ++i) {
    name[graph.inputs()[i]] = "input " + std::to_string(i);
  }
  auto text_of = [&](const Value* v) {
    auto it = name.find(v);
    return it == name.end() ? std::string("?") : it->second;
  };
  for (const Node* n : graph.nodes()) {
    if (n->kind() == c10::prim::Constant) {
      const c10::optional<c10::IValue> v = torch::jit::toIValue(n->output());
      std::string text;
      if (!v) {
        text = "a constant " + n->output()->type()->str();
      } else if (v->isTensor()) {
        out.constants.push_back(v->toTensor());
        text = "constant tensor " + std::to_string(out.constants.size()) + " " +
               tensor_text(v->toTensor());
      } else {
        text = constant_text(*v);
      }
      name[n->output()] = text;
      continue;
    }
    const size_t op = out.lines.size() + 1;
    auto line = detail::c_stream<std::ostringstream>();
    line << n->kind().toQualString() << "(";
    for (size_t i = 0; i < n->inputs().size(); ++i) {
      line << (i ? ", " : "") << text_of(n->inputs()[i]);
    }
    line << ")";
    for (const c10::Symbol a : n->attributeNames()) line << " " << a.toUnqualString();
    for (size_t o = 0; o < n->outputs().size(); ++o) {
      name[n->outputs()[o]] =
          "op " + std::to_string(op) +
          (n->outputs().size() > 1 ? " output " + std::to_string(o) : std::string());
    }
    out.lines.push_back(line.str());
  }
  auto ret = detail::c_stream<std::ostringstream>();
  ret << "return (";
  for (size_t i = 0; i < graph.outputs().size(); ++i) {
    ret << (i ? ", " : "") << text_of(graph.outputs()[i]);
  }
  out.lines.push_back(ret.str() + ")");
  return out;
}

// Whether two tensors hold the same values (NaN equal to NaN).
bool same_values(const at::Tensor& a, const at::Tensor& b) {
  if (a.unsafeGetTensorImpl() == b.unsafeGetTensorImpl()) return true;
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes() || a.device() != b.device())
    return false;
  if (at::equal(a, b)) return true;
  if (!a.is_floating_point() && !a.is_complex()) return false;
  return ((a == b) | (at::isnan(a) & at::isnan(b))).all().item<bool>();
}

std::string clipped(const std::string& s) {
  constexpr size_t kMax = 240;
  return s.size() <= kMax ? s : s.substr(0, kMax) + "...";
}

// How `call` differs from `trace` (two runs of one signature), or "" when it ran the same ops.
std::string first_difference(const OpsRun& trace, const OpsRun& call) {
  const size_t n = std::min(trace.lines.size(), call.lines.size());
  for (size_t i = 0; i < n; ++i) {
    if (trace.lines[i] == call.lines[i]) continue;
    const bool ret = i + 1 == trace.lines.size() || i + 1 == call.lines.size();
    return (ret ? std::string("after ") + std::to_string(i) + " equal ops, this call ran `"
                : "op " + std::to_string(i + 1) + " of this call is `") +
           clipped(call.lines[i]) + "` where the trace has `" + clipped(trace.lines[i]) + "`";
  }
  for (size_t k = 0; k < trace.constants.size() && k < call.constants.size(); ++k) {
    if (!same_values(trace.constants[k], call.constants[k])) {
      return "constant tensor " + std::to_string(k + 1) + " (" + tensor_text(call.constants[k]) +
             ", a tensor the function read that is not an input) holds other values than at the "
             "trace";
    }
  }
  return "";
}

// One trace: the recorded graph turned into steps over numbered value slots.
struct Trace {
  std::shared_ptr<torch::jit::Graph> graph;  // keeps the nodes the operations came from
  std::vector<c10::IValue> initial;          // slot values before a run: the constants
  std::vector<int64_t> input_slots;
  std::vector<int64_t> output_slots;
  std::vector<Step> steps;
  std::string description;
  OpsRun ops;  // what the traced call ran, for checking later calls against
};

}  // namespace

namespace {

// The live TracedFunctions made with a module, for recheck_module(): each by its module and two
// calls into its state (held weakly: the registry keeps no function alive).
struct LiveTraces {
  struct Entry {
    const torch::nn::Module* module;
    std::function<bool()> gone;
    std::function<void()> recheck;
  };
  std::mutex mu;
  std::vector<Entry> entries;
};

LiveTraces& live_traces() {
  static auto* live = new LiveTraces();  // never destroyed: functions may outlive static teardown
  return *live;
}

}  // namespace

struct TracedFunction::Impl {
  std::string name;
  Fn fn;
  std::shared_ptr<torch::nn::Module> module;
  TraceOptions options;

  std::mutex mu;
  std::list<std::string> recent;  // most recently used first
  struct Entry {
    std::shared_ptr<const Trace> trace;
    std::list<std::string>::iterator position;
    int64_t checks_left = 0;  // calls still to run fn under the tracer and compare
  };
  std::map<std::string, Entry> traces;
  Stats stats;

  void recheck() {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& kv : traces) kv.second.checks_left = std::max<int64_t>(kv.second.checks_left, 1);
  }

  std::vector<at::Tensor> captured() const {
    std::vector<at::Tensor> out;
    if (!module) return out;
    for (const auto& p : module->parameters(true)) out.push_back(p);
    for (const auto& b : module->buffers(true)) out.push_back(b);
    return out;
  }

  std::string key(const std::vector<at::Tensor>& inputs,
                  const std::vector<at::Tensor>& captured) const {
    auto os = detail::c_stream<std::ostringstream>();
    os << signature_text(inputs) << " grad=" << c10::GradMode::is_enabled()
       << " captured=" << captured.size();
    // What the recorded ops depend on in the module: each captured tensor's dtype, device and
    // requires_grad (a model cast or frozen), each submodule's training mode (a BatchNorm put
    // in eval: the trace holds batch_norm(training=true)). Sizes are the module's own.
    if (!captured.empty()) {
      os << " [";
      for (const auto& t : captured) {
        os << static_cast<int>(t.scalar_type()) << (t.requires_grad() ? "g" : "");
        if (!t.device().is_cpu()) os << "@" << t.device();
        os << ",";
      }
      os << "]";
    }
    // Autocast decides which ops run in which dtype; a trace is only valid under the state it
    // was recorded in.
    if (at::autocast::is_cpu_enabled())
      os << " autocast_cpu=" << at::autocast::get_autocast_cpu_dtype();
    if (at::autocast::is_enabled())
      os << " autocast_cuda=" << at::autocast::get_autocast_gpu_dtype();
    if (module) {
      // modules(false): including itself would need a module held by a shared_ptr.
      os << " training=" << module->is_training();
      for (const auto& m : module->modules(/*include_self=*/false)) os << m->is_training();
    }
    return os.str();
  }

  // Runs fn on `inputs` (+ the captured tensors) under the tracer; returns the recorded graph
  // and fn's outputs.
  std::pair<std::shared_ptr<torch::jit::Graph>, std::vector<at::Tensor>> record(
      const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& extra) const;
  std::shared_ptr<const Trace> build(std::shared_ptr<torch::jit::Graph> graph,
                                     const std::string& signature) const;
};

namespace {

// Runs a trace's steps. `args` are the graph's inputs in order.
std::vector<at::Tensor> run(const Trace& t, std::vector<c10::IValue> args) {
  std::vector<c10::IValue> slots = t.initial;
  for (size_t i = 0; i < args.size(); ++i) slots[t.input_slots[i]] = std::move(args[i]);
  torch::jit::Stack stack;
  std::vector<at::Tensor> tensors;
  for (const Step& s : t.steps) {
    if (s.fused) {
      tensors.clear();
      for (int64_t i : s.in) tensors.push_back(slots[i].toTensor());
      std::vector<at::Tensor> outs = (*s.fused)(tensors);
      for (size_t k = 0; k < s.out.size(); ++k) slots[s.out[k]] = std::move(outs[k]);
    } else {
      stack.clear();
      for (int64_t i : s.in) stack.push_back(slots[i]);
      s.op(stack);
      VOLT_ASSERT(stack.size() == s.out.size(), "a recorded op returned ", stack.size(),
                  " values instead of ", s.out.size());
      for (size_t k = 0; k < s.out.size(); ++k) slots[s.out[k]] = std::move(stack[k]);
    }
    for (int64_t i : s.release) slots[i] = c10::IValue();
  }
  std::vector<at::Tensor> out;
  out.reserve(t.output_slots.size());
  for (int64_t i : t.output_slots) out.push_back(slots[i].toTensor());
  return out;
}

}  // namespace

std::pair<std::shared_ptr<torch::jit::Graph>, std::vector<at::Tensor>> TracedFunction::Impl::record(
    const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& extra) const {
  torch::jit::Stack stack;
  for (const auto& t : inputs) {
    VOLT_CHECK(t.defined(), ValueError, "[TracedFunction] '", name,
               "' got an undefined tensor as an input; pass defined tensors only.");
    stack.emplace_back(t);
  }
  for (const auto& t : extra) stack.emplace_back(t);
  const size_t n = inputs.size();
  std::shared_ptr<torch::jit::tracer::TracingState> state;
  torch::jit::Stack outputs;
  detail::HostReadWatch watch;
  try {
    std::tie(state, outputs) = torch::jit::tracer::trace(
        std::move(stack),
        [&](torch::jit::Stack s) {
          std::vector<at::Tensor> args;
          args.reserve(n);
          for (size_t i = 0; i < n; ++i) args.push_back(s[i].toTensor());
          std::vector<at::Tensor> outs = fn(args);
          VOLT_CHECK(!outs.empty(), ValueError, "[TracedFunction] '", name,
                     "' returned no tensors; return at least one.");
          torch::jit::Stack r;
          for (auto& o : outs) {
            VOLT_CHECK(o.defined(), ValueError, "[TracedFunction] '", name,
                       "' returned an undefined tensor; return defined tensors only.");
            r.emplace_back(std::move(o));
          }
          return r;
        },
        [](const at::Tensor&) { return std::string(); }, /*strict=*/true,
        /*force_outplace=*/false);
  } catch (const Error&) {
    throw;
  } catch (const c10::Error& e) {
    throw ValueError(std::string("[TracedFunction] '") + name +
                     "' could not be traced: " + e.what_without_backtrace() +
                     "; pass every tensor the function reads that needs a gradient as an input "
                     "(or the module to the constructor), and return only tensors.");
  } catch (const std::exception& e) {
    // The tracer's own refusals (a captured tensor that requires grad) are runtime_errors.
    std::string what = e.what();
    what = what.substr(0, what.find('\n'));
    throw ValueError(std::string("[TracedFunction] '") + name + "' could not be traced: " + what +
                     "; pass every tensor the function reads that needs a gradient as an input "
                     "(or the module to the constructor), and return only tensors.");
  }
  VOLT_CHECK(watch.op().empty(), ValueError, "[TracedFunction] '", name,
             "' read a tensor's value on the host while traced (", watch.op(), ": ",
             detail::host_sync_source(watch.op()),
             "); a trace keeps that value, and any branch it decided, as a constant. Compute "
             "with tensor ops instead (e.g. at::where for a branch), or do not trace this "
             "function.");
  std::vector<at::Tensor> result;
  for (auto& o : outputs) result.push_back(o.toTensor());
  return {state->graph, std::move(result)};
}

std::shared_ptr<const Trace> TracedFunction::Impl::build(std::shared_ptr<torch::jit::Graph> graph,
                                                         const std::string& signature) const {
  auto trace = std::make_shared<Trace>();
  trace->graph = graph;
  trace->ops = ops_run(*graph);
  std::vector<Node*> nodes;
  std::unordered_map<const Node*, size_t> position;
  for (Node* node : graph->nodes()) {
    if (node->kind() == c10::prim::Constant) continue;
    VOLT_CHECK(node->blocks().empty(), ValueError, "[TracedFunction] '", name, "' recorded a ",
               node->kind().toQualString(),
               " with sub-blocks, which a trace cannot replay; trace a function without it.");
    position[node] = nodes.size();
    nodes.push_back(node);
  }
  // A tensor an `empty` op made and some op reads before any recorded op writes it was filled
  // outside libtorch's ops (a kernel writing through data pointers): a replay would read
  // whatever memory it got.
  for (const Node* node : nodes) {
    if (!allocates_unfilled(node)) continue;
    const auto access = first_access(node->output(), position);
    VOLT_CHECK(!access || access->write, ValueError, "[TracedFunction] '", name,
               "' reads a tensor made by ", node->kind().toQualString(),
               " that no recorded op wrote: it was filled outside libtorch's ops (a custom "
               "kernel writing through data pointers), which a trace cannot replay. Compute it "
               "with libtorch ops while traced (torch::jit::tracer::isTracing()), or do not "
               "trace this function.");
  }
  // Barriers: ops that write memory, draw random numbers or have other side effects run in
  // their recorded order relative to every other op (nothing is fused across them).
  std::vector<int64_t> barrier_before(nodes.size(), -1);  // the last barrier before each node
  std::vector<bool> barrier(nodes.size(), false);
  int64_t last_barrier = -1;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node* node = nodes[i];
    barrier_before[i] = last_barrier;
    const bool aten = node->kind().is_aten();
    barrier[i] =
        node->hasSideEffects() || (aten && (!node->maybeSchema() || node->schema().is_mutable() ||
                                            node->isNondeterministic()));
    if (barrier[i]) last_barrier = static_cast<int64_t>(i);
  }

  // Units: each node starts alone; fusible nodes join a group of a producer when that keeps
  // the units acyclic and the shapes equal.
  std::vector<int64_t> unit(nodes.size());
  std::vector<std::vector<size_t>> members;  // by unit
  std::vector<bool> is_group;                // by unit
  std::vector<std::vector<int64_t>> group_shape;
  auto producer = [&](const Value* v) -> int64_t {
    auto it = position.find(v->node());
    return it == position.end() ? -1 : static_cast<int64_t>(it->second);
  };
  // Whether unit `from` depends on unit `target` (through any chain of inputs).
  auto depends_on = [&](int64_t from, int64_t target) {
    std::vector<int64_t> todo{from};
    std::unordered_set<int64_t> seen{from};
    while (!todo.empty()) {
      const int64_t u = todo.back();
      todo.pop_back();
      if (u == target) return true;
      for (size_t m : members[u]) {
        for (const Value* v : nodes[m]->inputs()) {
          const int64_t p = producer(v);
          if (p < 0) continue;
          const int64_t pu = unit[p];
          if (seen.insert(pu).second) todo.push_back(pu);
        }
      }
    }
    return false;
  };
  // Whether a chain of shape `shape` holding `mems` returns each member's value at the shape the
  // trace recorded: FusedElementwise computes at the broadcast shape of its inputs, and in a
  // chain that reads rows gives the values that do not vary along a row (reductions, and what
  // only they, constants and inputs with a last size of 1 make) a last size of 1. A reduction's
  // input must have the chain's shape, so that it reduces the rows the kernel walks.
  auto shapes_fit = [&](std::vector<size_t> mems, const std::vector<int64_t>& shape) {
    std::sort(mems.begin(), mems.end());
    const bool by_rows = std::any_of(mems.begin(), mems.end(),
                                     [&](size_t m) { return lowering_of(nodes[m]).by_rows; });
    std::unordered_map<const Value*, bool> per_row;
    for (size_t m : mems) {
      const Node* node = nodes[m];
      const Lowering& l = lowering_of(node);
      bool p = true;
      if (l.reduces) {
        if (sizes_of(node->inputs()[0]) != shape) return false;
      } else if (l.by_rows) {
        p = false;
      } else {
        for (size_t i = 0; i < node->inputs().size(); ++i) {
          if (!is_tensor_input(node, i)) continue;
          const Value* v = node->inputs()[i];
          auto it = per_row.find(v);
          if (it != per_row.end()) {
            p = p && it->second;
          } else {
            const auto sizes = sizes_of(v);
            p = p && sizes && detail::per_row_sizes(*sizes);
          }
        }
      }
      per_row[node->output()] = p;
      if (sizes_of(node->output()) != (by_rows && p ? detail::row_shape(shape) : shape))
        return false;
    }
    return true;
  };
  // Whether merging units a and b (and what they hold) keeps the units acyclic: nothing they
  // read from outside may depend on either.
  auto can_merge = [&](int64_t a, int64_t b) {
    for (int64_t u : {a, b}) {
      for (size_t m : members[u]) {
        for (const Value* v : nodes[m]->inputs()) {
          const int64_t q = producer(v);
          if (q < 0 || unit[q] == a || unit[q] == b) continue;
          if (depends_on(unit[q], a) || depends_on(unit[q], b)) return false;
        }
      }
    }
    return true;
  };
  for (size_t i = 0; i < nodes.size(); ++i) {
    Node* node = nodes[i];
    const auto u = static_cast<int64_t>(members.size());
    members.push_back({i});
    unit[i] = u;
    is_group.push_back(options.fuse() && fusible(node));
    group_shape.emplace_back();
    if (!is_group[u]) continue;
    // A reduction's chain has its input's shape; every other op's, its output's.
    group_shape[u] = *sizes_of(lowering_of(node).reduces ? node->inputs()[0] : node->output());
    if (!shapes_fit(members[u], group_shape[u])) {
      is_group[u] = false;
      continue;
    }
    // Join the chains this op reads from (each when that keeps the order acyclic).
    for (const Value* v : node->inputs()) {
      const int64_t p = producer(v);
      if (p < 0) continue;
      const int64_t g = unit[p];
      if (g == u || !is_group[g] || barrier_before[members[g].front()] != barrier_before[i]) {
        continue;
      }
      const auto shape = merged_shape(group_shape[g], group_shape[u]);
      if (!shape) continue;
      std::vector<size_t> together = members[u];
      together.insert(together.end(), members[g].begin(), members[g].end());
      if (!shapes_fit(together, *shape) || !can_merge(u, g)) continue;
      group_shape[u] = *shape;
      for (size_t m : members[g]) unit[m] = u;
      members[u].insert(members[u].end(), members[g].begin(), members[g].end());
      std::sort(members[u].begin(), members[u].end());
      members[g].clear();
    }
  }
  // Groups too short to fuse run as recorded (splitting a unit keeps the order acyclic).
  for (size_t g = 0; g < members.size(); ++g) {
    if (!is_group[g] || members[g].empty() ||
        static_cast<int64_t>(members[g].size()) >= std::max<int64_t>(options.min_fused_ops(), 1)) {
      continue;
    }
    is_group[g] = false;
    for (size_t k = 1; k < members[g].size(); ++k) {
      const size_t m = members[g][k];
      unit[m] = static_cast<int64_t>(members.size());
      members.push_back({m});
      is_group.push_back(false);
      group_shape.emplace_back();
    }
    members[g].resize(1);
  }

  // Slots: every value the steps read or write.
  std::unordered_map<const Value*, int64_t> slot;
  auto slot_of = [&](const Value* v) {
    auto it = slot.find(v);
    if (it != slot.end()) return it->second;
    const auto s = static_cast<int64_t>(trace->initial.size());
    slot[v] = s;
    auto constant = v->node()->kind() == c10::prim::Constant ? torch::jit::toIValue(v)
                                                             : c10::optional<c10::IValue>();
    trace->initial.push_back(constant ? *constant : c10::IValue());
    return s;
  };
  for (const Value* v : graph->inputs()) trace->input_slots.push_back(slot_of(v));

  // Steps in a topological order of the units, earliest first node first.
  std::vector<int64_t> waiting(members.size(), 0);
  std::vector<std::set<int64_t>> consumers(members.size());
  for (size_t u = 0; u < members.size(); ++u) {
    std::set<int64_t> needs;
    for (size_t m : members[u]) {
      for (const Value* v : nodes[m]->inputs()) {
        const int64_t p = producer(v);
        if (p >= 0 && unit[p] != static_cast<int64_t>(u)) needs.insert(unit[p]);
      }
      // The order around barriers: after the last one, and a barrier after everything since
      // the one before it.
      if (barrier_before[m] >= 0) needs.insert(unit[barrier_before[m]]);
      if (barrier[m]) {
        for (size_t j = std::max<int64_t>(barrier_before[m], 0); j < m; ++j) {
          needs.insert(unit[j]);
        }
      }
    }
    needs.erase(static_cast<int64_t>(u));
    waiting[u] = static_cast<int64_t>(needs.size());
    for (int64_t p : needs) consumers[p].insert(static_cast<int64_t>(u));
  }
  using Ready = std::pair<size_t, int64_t>;  // (first member's position, unit)
  std::priority_queue<Ready, std::vector<Ready>, std::greater<>> ready;
  for (size_t u = 0; u < members.size(); ++u) {
    if (!members[u].empty() && waiting[u] == 0) ready.push({members[u].front(), u});
  }
  auto text = detail::c_stream<std::ostringstream>();
  int64_t fused_groups = 0;
  int64_t fused_ops = 0;
  std::unordered_set<const Node*> in_unit;
  while (!ready.empty()) {
    const int64_t u = ready.top().second;
    ready.pop();
    Step step;
    if (!is_group[u]) {
      Node* node = nodes[members[u].front()];
      try {
        step.op = prim_operation(node);
        if (!step.op) step.op = node->getOperation();
      } catch (const c10::Error& e) {
        throw ValueError(std::string("[TracedFunction] '") + name + "' recorded " +
                         node->kind().toQualString() + ", which has no operator to replay it (" +
                         e.what_without_backtrace() + "); trace a function without it.");
      }
      for (const Value* v : node->inputs()) step.in.push_back(slot_of(v));
      for (const Value* v : node->outputs()) step.out.push_back(slot_of(v));
      text << "  " << node->kind().toQualString() << "\n";
    } else {
      in_unit.clear();
      for (size_t m : members[u]) in_unit.insert(nodes[m]);
      std::unordered_map<const Value*, jit::Expr> expr;
      std::vector<const Value*> group_inputs;
      std::string ops;
      for (size_t m : members[u]) {
        Node* node = nodes[m];
        auto arg = [&](size_t i) -> jit::Expr {
          const Value* v = node->inputs()[i];
          auto it = expr.find(v);
          if (it != expr.end()) return it->second;
          if (!is_tensor_input(node, i)) return jit::Expr(*constant_number(v));
          const auto index = static_cast<int64_t>(group_inputs.size());
          group_inputs.push_back(v);
          jit::Expr e = jit::input(index);
          expr.emplace(v, e);
          return e;
        };
        expr.emplace(node->output(), translate(node, arg));
        ops += std::string(ops.empty() ? "" : " ") + node->kind().toUnqualString();
      }
      std::vector<jit::Expr> outputs;
      for (size_t m : members[u]) {
        const Value* v = nodes[m]->output();
        const bool used_outside =
            std::any_of(v->uses().begin(), v->uses().end(),
                        [&](const torch::jit::Use& use) { return !in_unit.count(use.user); });
        if (!used_outside) continue;
        outputs.push_back(expr.at(v));
        step.out.push_back(slot_of(v));
      }
      for (const Value* v : group_inputs) step.in.push_back(slot_of(v));
      const std::string kernel = name + "_g" + std::to_string(fused_groups);
      step.fused =
          std::make_shared<FusedElementwise>(kernel, std::move(outputs), options.fused_options());
      ++fused_groups;
      fused_ops += static_cast<int64_t>(members[u].size());
      text << "  fused '" << kernel << "': " << members[u].size() << " ops (" << ops << "), "
           << step.in.size() << " inputs, " << step.out.size() << " outputs\n";
    }
    trace->steps.push_back(std::move(step));
    for (int64_t c : consumers[u]) {
      if (--waiting[c] == 0) ready.push({members[c].front(), c});
    }
  }
  VOLT_ASSERT(trace->steps.size() ==
                  static_cast<size_t>(std::count_if(members.begin(), members.end(),
                                                    [](const auto& m) { return !m.empty(); })),
              "the partition of '", name, "' is not acyclic");
  for (const Value* v : graph->outputs()) {
    VOLT_CHECK(v->type()->cast<c10::TensorType>() != nullptr, ValueError, "[TracedFunction] '",
               name, "' returns a ", v->type()->str(), "; return tensors only.");
    trace->output_slots.push_back(slot_of(v));
  }

  // Release each value after its last reader or writer (never the graph's outputs).
  std::vector<int64_t> last(trace->initial.size(), -1);
  for (size_t i = 0; i < trace->steps.size(); ++i) {
    for (int64_t s : trace->steps[i].in) last[s] = static_cast<int64_t>(i);
    for (int64_t s : trace->steps[i].out) last[s] = std::max<int64_t>(last[s], i);
  }
  for (int64_t s : trace->output_slots) last[s] = -1;
  for (size_t s = 0; s < last.size(); ++s) {
    if (last[s] >= 0) trace->steps[last[s]].release.push_back(static_cast<int64_t>(s));
  }

  const int64_t total = static_cast<int64_t>(nodes.size());
  auto head = detail::c_stream<std::ostringstream>();
  head << "trace of '" << name << "' for " << signature << ": " << total << " ops, " << fused_ops
       << " of them in " << fused_groups << " fused chain" << (fused_groups == 1 ? "" : "s") << ", "
       << trace->steps.size() << " steps\n";
  trace->description = head.str() + text.str() + "recorded graph:\n" + graph->toString();
  return trace;
}

TracedFunction::TracedFunction(std::string name, Fn fn, TraceOptions options)
    : TracedFunction(std::move(name), nullptr, std::move(fn), options) {}

TracedFunction::TracedFunction(std::string name, torch::nn::Module& module, Fn fn,
                               TraceOptions options)
    : TracedFunction(std::move(name),
                     std::shared_ptr<torch::nn::Module>(&module, [](torch::nn::Module*) {}),
                     std::move(fn), options) {}

TracedFunction::TracedFunction(std::string name, std::shared_ptr<torch::nn::Module> module, Fn fn,
                               TraceOptions options)
    : impl_(std::make_shared<Impl>()) {
  VOLT_CHECK(valid_name(name), ValueError, "[TracedFunction] name '", name,
             "' is not a name: use 1-56 letters, digits and '_' (it names the fused kernels).");
  VOLT_CHECK(static_cast<bool>(fn), ValueError, "[TracedFunction] '", name,
             "' got an empty function; pass the function to trace.");
  VOLT_CHECK(options.min_fused_ops() >= 1, ConfigError,
             "[TracedFunction] min_fused_ops must be >= 1, got ", options.min_fused_ops(),
             "; 1 fuses single ops too, 2 (the default) chains of two or more.");
  VOLT_CHECK(options.check_calls() >= 0, ConfigError,
             "[TracedFunction] check_calls must be >= 0, got ", options.check_calls(),
             "; it is how many calls after a trace run the function again and compare its ops "
             "(0: none).");
  VOLT_CHECK(options.max_traces() >= 1, ConfigError,
             "[TracedFunction] max_traces must be >= 1, got ", options.max_traces(),
             "; it is how many input signatures keep a trace.");
  impl_->name = std::move(name);
  impl_->fn = std::move(fn);
  impl_->module = std::move(module);
  impl_->options = options;
  if (impl_->module) {
    LiveTraces& live = live_traces();
    std::lock_guard<std::mutex> lock(live.mu);
    // Drop the entries of functions gone since (their last copy destroyed).
    live.entries.erase(std::remove_if(live.entries.begin(), live.entries.end(),
                                      [](const LiveTraces::Entry& e) { return e.gone(); }),
                       live.entries.end());
    const std::weak_ptr<Impl> weak = impl_;
    live.entries.push_back({impl_->module.get(), [weak] { return weak.expired(); },
                            [weak] {
                              if (auto impl = weak.lock()) impl->recheck();
                            }});
  }
}

std::vector<at::Tensor> TracedFunction::operator()(const std::vector<at::Tensor>& inputs) const {
  Impl& impl = *impl_;
  const std::vector<at::Tensor> extra = impl.captured();
  const std::string key = impl.key(inputs, extra);
  std::shared_ptr<const Trace> trace;
  {
    std::lock_guard<std::mutex> lock(impl.mu);
    auto it = impl.traces.find(key);
    if (it != impl.traces.end() && it->second.checks_left > 0) {
      // A checked call: fn runs under the tracer again and must record what the trace holds.
      Impl::Entry& entry = it->second;
      --entry.checks_left;
      ++impl.stats.checks;
      auto drop = [&] {
        impl.recent.erase(entry.position);
        impl.traces.erase(it);
      };
      std::pair<std::shared_ptr<torch::jit::Graph>, std::vector<at::Tensor>> call;
      try {
        call = impl.record(inputs, extra);
      } catch (...) {
        drop();  // it behaved otherwise than when traced (e.g. read a value on the host)
        throw;
      }
      const std::string diff = first_difference(entry.trace->ops, ops_run(*call.first));
      if (!diff.empty()) {
        drop();
        throw ValueError(
            "[TracedFunction] '" + impl.name +
            "' ran other ops on a later call with the same input signature than when it was "
            "traced: " +
            diff +
            ". Its ops depend on something besides its input tensors (a counter, a step or batch "
            "index, a value computed on the host, a tensor replaced between calls), so replaying "
            "the trace would repeat the traced call's choices and values. Pass such values as "
            "input tensors, compute branches with tensor ops (at::where), or do not trace this "
            "function.");
      }
      impl.recent.splice(impl.recent.begin(), impl.recent, entry.position);
      return std::move(call.second);
    }
    if (it != impl.traces.end()) {
      ++impl.stats.hits;
      impl.recent.splice(impl.recent.begin(), impl.recent, it->second.position);
      trace = it->second.trace;
    } else {
      auto call = impl.record(inputs, extra);
      std::shared_ptr<const Trace> recorded = impl.build(call.first, signature_text(inputs));
      impl.recent.push_front(key);
      impl.traces[key] = Impl::Entry{recorded, impl.recent.begin(), impl.options.check_calls()};
      ++impl.stats.traces;
      log_info(kComponent, recorded->description.substr(0, recorded->description.find('\n')));
      while (static_cast<int64_t>(impl.traces.size()) > impl.options.max_traces()) {
        impl.traces.erase(impl.recent.back());
        impl.recent.pop_back();
        ++impl.stats.evictions;
      }
      return std::move(call.second);
    }
  }
  std::vector<c10::IValue> args;
  args.reserve(inputs.size() + extra.size());
  for (const auto& t : inputs) args.emplace_back(t);
  for (const auto& t : extra) args.emplace_back(t);
  return run(*trace, std::move(args));
}

std::string TracedFunction::describe(const std::vector<at::Tensor>& inputs) const {
  Impl& impl = *impl_;
  const std::string key = impl.key(inputs, impl.captured());
  {
    std::lock_guard<std::mutex> lock(impl.mu);
    auto it = impl.traces.find(key);
    if (it != impl.traces.end()) return it->second.trace->description;
  }
  (*this)(inputs);
  std::lock_guard<std::mutex> lock(impl.mu);
  return impl.traces.at(key).trace->description;
}

std::string TracedFunction::signature(const std::vector<at::Tensor>& inputs) const {
  return impl_->key(inputs, impl_->captured());
}

void TracedFunction::recheck() const {
  impl_->recheck();
}

void TracedFunction::recheck_module(const torch::nn::Module& module) {
  std::set<const torch::nn::Module*> modules{&module};
  for (const auto& m : module.named_modules("", /*include_self=*/false)) {
    modules.insert(m.value().get());
  }
  // Called after the registry's lock is released: a function's own lock is never taken inside
  // it (a traced fn may construct a TracedFunction, which takes the registry's lock).
  std::vector<std::function<void()>> due;
  {
    LiveTraces& live = live_traces();
    std::lock_guard<std::mutex> lock(live.mu);
    for (const auto& entry : live.entries) {
      if (modules.count(entry.module) != 0) due.push_back(entry.recheck);
    }
  }
  for (const auto& recheck : due) recheck();
}

TracedFunction::Stats TracedFunction::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Stats s = impl_->stats;
  s.kept = static_cast<int64_t>(impl_->traces.size());
  return s;
}

const std::string& TracedFunction::name() const {
  return impl_->name;
}
const TraceOptions& TracedFunction::options() const {
  return impl_->options;
}

}  // namespace volt
