#include "volt/kernels/fused_elementwise.h"

#include <ATen/ExpandUtils.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/scalar_tensor.h>
#include <c10/core/GradMode.h>
#include <c10/util/accumulate.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <gnu/libc-version.h>
#include <poll.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <map>
#include <optional>
#include <ostream>
#include <set>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "core/detail/ascii.h"
#include "core/detail/machine.h"
#include "core/detail/numbers.h"
#include "core/detail/remove_tree.h"
#include "core/detail/tracing.h"
#include "kernels/detail/row_shapes.h"
#include "volt/core/check.h"
#include "volt/core/env.h"
#include "volt/core/log.h"
#include "volt/kernels/kernel_cache.h"

extern char** environ;

namespace volt {
namespace {
using NodePtr = std::shared_ptr<const jit::Expr::Node>;
}  // namespace

namespace jit {
namespace {

Expr make(Op op, std::vector<NodePtr> args) {
  for (const auto& a : args) {
    VOLT_CHECK(a != nullptr, ValueError, "[FusedElementwise] an operand of ", static_cast<int>(op),
               " is an empty Expr; build expressions from input() and constants.");
  }
  auto n = std::make_shared<Expr::Node>();
  n->op = op;
  n->args = std::move(args);
  return Expr(std::move(n));
}

}  // namespace

Expr::Node::~Node() {
  // Take over the arguments this node owns alone, and theirs, before they are freed: each is then
  // destroyed with no arguments left, so freeing a chain takes a loop instead of a recursion.
  // use_count() == 1 means this node holds the only reference: no other thread can copy it.
  std::vector<std::shared_ptr<const Node>> orphans;
  for (auto& a : args) {
    if (a.use_count() == 1) orphans.push_back(std::move(a));
  }
  while (!orphans.empty()) {
    std::shared_ptr<const Node> n = std::move(orphans.back());
    orphans.pop_back();
    auto& children = const_cast<Node&>(*n).args;
    for (auto& a : children) {
      if (a.use_count() == 1) orphans.push_back(std::move(a));
    }
    children.clear();
  }
}

Expr::Expr(double value) {
  auto n = std::make_shared<Node>();
  n->op = Op::kConstant;
  n->value = value;
  node_ = std::move(n);
}

Expr input(int64_t index) {
  VOLT_CHECK(index >= 0, ValueError, "[FusedElementwise] input(", index,
             ") is negative; inputs are numbered from 0.");
  auto n = std::make_shared<Expr::Node>();
  n->op = Op::kInput;
  n->index = index;
  return Expr(std::move(n));
}

// clang-format off
Expr operator+(const Expr& a, const Expr& b) { return make(Op::kAdd, {a.node(), b.node()}); }
Expr operator-(const Expr& a, const Expr& b) { return make(Op::kSub, {a.node(), b.node()}); }
Expr operator*(const Expr& a, const Expr& b) { return make(Op::kMul, {a.node(), b.node()}); }
Expr operator/(const Expr& a, const Expr& b) { return make(Op::kDiv, {a.node(), b.node()}); }
Expr operator-(const Expr& a) { return make(Op::kNeg, {a.node()}); }
Expr maximum(const Expr& a, const Expr& b) { return make(Op::kMaximum, {a.node(), b.node()}); }
Expr minimum(const Expr& a, const Expr& b) { return make(Op::kMinimum, {a.node(), b.node()}); }
Expr abs(const Expr& a) { return make(Op::kAbs, {a.node()}); }
Expr exp(const Expr& a) { return make(Op::kExp, {a.node()}); }
Expr log(const Expr& a) { return make(Op::kLog, {a.node()}); }
Expr tanh(const Expr& a) { return make(Op::kTanh, {a.node()}); }
Expr sigmoid(const Expr& a) { return make(Op::kSigmoid, {a.node()}); }
Expr relu(const Expr& a) { return make(Op::kRelu, {a.node()}); }
Expr sqrt(const Expr& a) { return make(Op::kSqrt, {a.node()}); }
Expr erf(const Expr& a) { return make(Op::kErf, {a.node()}); }
// clang-format on
Expr where_greater(const Expr& a, const Expr& b, const Expr& x, const Expr& y) {
  return make(Op::kSelectGt, {a.node(), b.node(), x.node(), y.node()});
}
Expr where_equal(const Expr& a, const Expr& b, const Expr& x, const Expr& y) {
  return make(Op::kSelectEq, {a.node(), b.node(), x.node(), y.node()});
}
Expr row_sum(const Expr& a) {
  return make(Op::kRowSum, {a.node()});
}
Expr row_max(const Expr& a) {
  return make(Op::kRowMax, {a.node()});
}
Expr row_length() {
  return make(Op::kRowLength, {});
}
Expr first_column(const Expr& a) {
  return make(Op::kFirstColumn, {a.node()});
}
Expr detach(const Expr& a) {
  return make(Op::kDetach, {a.node()});
}

}  // namespace jit

namespace {

using jit::Op;
using KernelFn = void (*)(const float* const*, float* const*, int64_t, int64_t, int64_t,
                          const int64_t*);
using KeyFn = const char* (*)();

constexpr const char* kComponent = "FusedElementwise";
// Bump when the generated code's calling convention or meaning changes: old cache entries then
// stop matching instead of being loaded.
constexpr const char* kFormat = "volt-jit elementwise v2";
// Distinct nodes in one kernel (its backward included): ~100 bytes of C each, so the compiler
// gets at most a few MB; it also bounds the memory of the reference's intermediate tensors.
constexpr size_t kMaxNodes = 65536;

// -ffp-contract=off keeps a*b+c two roundings, as libtorch computes it, so that chains of
// +, -, * and the comparisons give libtorch's bits exactly. -fno-math-errno lets sqrtf become
// one instruction and the loop vectorise; -march=native is why the CPU model is in the key.
// --no-undefined makes a missing vector math function a link error (retried without) instead
// of a dlopen failure.
const std::vector<std::string> kFlags = {"-std=c11",
                                         "-O3",
                                         "-march=native",
                                         "-fPIC",
                                         "-shared",
                                         "-ffp-contract=off",
                                         "-fno-math-errno",
                                         "-fno-trapping-math",
                                         "-fvisibility=hidden",
                                         "-Wl,--no-undefined"};

// Scalar expf/tanhf/... calls stop a loop from vectorising (measured 30x slower than the
// vectorised loop on GELU). glibc's libmvec has SIMD versions of them (tanhf and erff since
// 2.35, within 4 ulp by its documentation); `declare simd` lets GCC call them. Where libmvec or
// one of its functions is missing, the link fails and the plain loop is built instead.
struct Variant {
  const char* name;
  std::vector<std::string> flags, libs;
};
const std::vector<Variant> kVariants = {
    {"vectorised (libmvec)", {"-DVOLT_MVEC", "-fopenmp-simd"}, {"-lmvec", "-lm"}},
    {"scalar libm", {}, {"-lm"}},
};

// Nodes in evaluation order (arguments before users), each once.
std::vector<NodePtr> topo_order(const std::vector<jit::Expr>& outputs) {
  std::vector<NodePtr> order;
  std::unordered_set<const jit::Expr::Node*> seen;
  // Iterative post-order: expressions can be deep (long chains) and recursion would overflow.
  std::vector<std::pair<NodePtr, size_t>> stack;
  for (const auto& out : outputs) {
    if (seen.count(out.node().get())) continue;
    stack.emplace_back(out.node(), 0);
    while (!stack.empty()) {
      auto& [node, next] = stack.back();
      if (next < node->args.size()) {
        const NodePtr child = node->args[next++];
        if (!seen.count(child.get())) stack.emplace_back(child, 0);
        continue;
      }
      if (seen.insert(node.get()).second) order.push_back(node);
      stack.pop_back();
    }
  }
  return order;
}

std::string float_literal(double v) {
  const float f = static_cast<float>(v);
  if (std::isnan(f)) return "((float)NAN)";
  if (std::isinf(f)) return f > 0 ? "((float)INFINITY)" : "(-(float)INFINITY)";
  // %.9g round-trips a float; the cast keeps it float (no double arithmetic in the loop). In
  // the "C" locale: under de_DE, "(float)0,5" would be the comma operator, 5.
  return detail::c_format("((float)%.9g)", static_cast<double>(f));
}

// The loop body's expression for one node, over the values named v<k> (inputs) and t<id>.
std::string c_expr(const jit::Expr::Node* n,
                   const std::unordered_map<const void*, std::string>& name) {
  auto a = [&](size_t i) { return name.at(n->args[i].get()); };
  switch (n->op) {
    case Op::kInput:
    case Op::kConstant: break;
    case Op::kAdd: return a(0) + " + " + a(1);
    case Op::kSub: return a(0) + " - " + a(1);
    case Op::kMul: return a(0) + " * " + a(1);
    case Op::kDiv: return a(0) + " / " + a(1);
    // NaN wins, as in at::maximum / at::minimum.
    case Op::kMaximum:
      return "(" + a(0) + " > " + a(1) + " || " + a(0) + " != " + a(0) + ") ? " + a(0) + " : " +
             a(1);
    case Op::kMinimum:
      return "(" + a(0) + " < " + a(1) + " || " + a(0) + " != " + a(0) + ") ? " + a(0) + " : " +
             a(1);
    case Op::kNeg: return "-" + a(0);
    case Op::kAbs: return "fabsf(" + a(0) + ")";
    case Op::kExp: return "volt_expf(" + a(0) + ", volt_lo)";
    case Op::kLog: return "logf(" + a(0) + ")";
    case Op::kTanh: return "tanhf(" + a(0) + ")";
    case Op::kSigmoid: return "1.0f / (1.0f + volt_expf(-" + a(0) + ", volt_lo))";
    // NaN passes through, as at::relu (clamp_min) lets it.
    case Op::kRelu:
      return "(" + a(0) + " > 0.0f || " + a(0) + " != " + a(0) + ") ? " + a(0) + " : 0.0f";
    case Op::kSqrt: return "sqrtf(" + a(0) + ")";
    case Op::kErf: return "erff(" + a(0) + ")";
    case Op::kSelectGt: return "(" + a(0) + " > " + a(1) + ") ? " + a(2) + " : " + a(3);
    case Op::kSelectEq: return "(" + a(0) + " == " + a(1) + ") ? " + a(2) + " : " + a(3);
    // Row operations exist only in the row-by-row kernel, where j is the column.
    case Op::kRowLength: return "(float)cols";
    case Op::kFirstColumn: return "(j == 0) ? " + a(0) + " : 0.0f";
    case Op::kDetach: return a(0);
    case Op::kRowSum:
    case Op::kRowMax: break;  // accumulated by the row kernel's passes
  }
  VOLT_ASSERT(false, "[FusedElementwise] c_expr called on a leaf or a reduction");
  return "";
}

bool is_row_op(Op op) {
  return op == Op::kRowSum || op == Op::kRowMax || op == Op::kRowLength || op == Op::kFirstColumn;
}

bool uses_row_ops(const std::vector<NodePtr>& order) {
  return std::any_of(order.begin(), order.end(), [](const NodePtr& n) { return is_row_op(n->op); });
}

const char* const kKernelHead =
    "#include <math.h>\n#include <stdint.h>\n\n"
    "#ifdef VOLT_MVEC\n"
    "#pragma omp declare simd notinbranch\nfloat expf(float);\n"
    "#pragma omp declare simd notinbranch\nfloat logf(float);\n"
    "#pragma omp declare simd notinbranch\nfloat tanhf(float);\n"
    "#pragma omp declare simd notinbranch\nfloat erff(float);\n"
    "#define VOLT_SIMD _Pragma(\"omp simd\")\n"
    "#else\n#define VOLT_SIMD\n#endif\n\n"
    // expf below -87 (results under 1.7e-38, where glibc's vector expf leaves its fast path
    // for a scalar call per element: 8x slower on a softmax row masked with -inf) is 0. The
    // floor is read from memory: with a constant, GCC folds the clamp back into expf(x).
    "static volatile float volt_exp_floor = -87.0f;\n"
    "static inline float volt_expf(float x, float lo) {\n"
    "  const float c = x < lo ? lo : x;\n"
    "  const float e = expf(c);\n"
    "  return c == lo ? 0.0f : e;\n"
    "}\n\n"
    "__attribute__((visibility(\"default\")))\n"
    "void volt_jit_kernel(const float* const* in, float* const* out, int64_t begin,\n"
    "                     int64_t end, int64_t cols, const int64_t* numel) {\n"
    "  const float volt_lo = volt_exp_floor;\n";

using RawNode = const jit::Expr::Node*;

// Names every value of `order` (v<k> the inputs, c<n> the constants, t<n> the rest) and returns
// the kernel's start: kKernelHead, the constants, and the reads of one-element inputs.
std::string kernel_start(const std::vector<NodePtr>& order, const std::string& forms,
                         std::unordered_map<const void*, std::string>* name) {
  auto s = detail::c_stream<std::ostringstream>();
  s << kKernelHead;
  int64_t next = 0;
  for (const auto& node : order) {
    const auto* n = node.get();
    if (n->op == Op::kInput) {
      (*name)[n] = "v" + std::to_string(n->index);
    } else if (n->op == Op::kConstant) {
      (*name)[n] = "c" + std::to_string(next++);
      s << "  const float " << (*name)[n] << " = " << float_literal(n->value) << ";\n";
    } else {
      (*name)[n] = "t" + std::to_string(next++);
    }
  }
  for (size_t k = 0; k < forms.size(); ++k) {
    if (forms[k] == 'S') s << "  const float v" << k << " = in[" << k << "][0];\n";
  }
  return s.str();
}

// How a row kernel is laid out (generate_row_body): which values vary along the row, the
// passes over the row, and which values are kept in scratch rows between passes.
//
// Per row, there is one pass per level of reductions (a reduction whose argument reads other
// reductions is a level above them; the reductions of one level share their pass), the per-row
// values between them computed once, then one pass writing the full-shape outputs. Values that
// vary along the row are recomputed in each pass that needs them (the row stays in cache, so
// memory is read once), except the transcendental ones (exp, log, tanh, sigmoid, erf) that
// several passes need: the first pass stores them in a scratch row that the later ones read
// (a softmax computes each exp once).
struct RowPlan {
  std::vector<NodePtr> order;
  std::unordered_map<const void*, bool> varies;  // along the row
  std::unordered_map<const void*, int> level;    // of the reductions it waits for
  int top = 0;                                   // the highest level
  std::vector<RawNode> stored;                   // kept in scratch rows, in this order
  std::vector<std::vector<RawNode>> roots;       // per pass: what it computes
};

bool is_reduction(Op op) {
  return op == Op::kRowSum || op == Op::kRowMax;
}

bool is_transcendental(Op op) {
  return op == Op::kExp || op == Op::kLog || op == Op::kTanh || op == Op::kSigmoid ||
         op == Op::kErf;
}

// The varying, computed (not input or constant) nodes that `roots` need, in evaluation order;
// the search stops at nodes in `stop` (read from their scratch rows), which are returned too.
std::vector<RawNode> pass_nodes(const RowPlan& plan, const std::vector<RawNode>& roots,
                                const std::unordered_set<const void*>& stop) {
  std::unordered_set<const void*> need;
  std::vector<RawNode> todo;
  for (RawNode r : roots) {
    if (plan.varies.at(r) && need.insert(r).second) todo.push_back(r);
  }
  while (!todo.empty()) {
    RawNode n = todo.back();
    todo.pop_back();
    if (stop.count(n)) continue;
    for (const auto& a : n->args) {
      if (plan.varies.at(a.get()) && need.insert(a.get()).second) todo.push_back(a.get());
    }
  }
  std::vector<RawNode> out;
  for (const auto& n : plan.order) {
    if (need.count(n.get()) && n->op != Op::kInput && n->op != Op::kConstant) {
      out.push_back(n.get());
    }
  }
  return out;
}

RowPlan plan_rows(const std::vector<jit::Expr>& outputs, const std::string& forms) {
  RowPlan plan;
  plan.order = topo_order(outputs);
  for (const auto& node : plan.order) {
    const auto* n = node.get();
    int lv = 0;
    bool v = false;
    for (const auto& a : n->args) {
      lv = std::max(lv, plan.level.at(a.get()));
      v = v || plan.varies.at(a.get());
    }
    if (n->op == Op::kInput) {
      const char f = forms[static_cast<size_t>(n->index)];
      v = f == 'F' || f == 'R';
    }
    if (is_reduction(n->op)) {
      lv += 1;
      v = false;
    }
    if (n->op == Op::kFirstColumn) v = true;
    plan.varies[n] = v;
    plan.level[n] = lv;
    plan.top = std::max(plan.top, lv);
  }
  plan.roots.resize(static_cast<size_t>(plan.top) + 1);
  for (const auto& n : plan.order) {
    if (is_reduction(n->op)) {
      plan.roots[static_cast<size_t>(plan.level.at(n.get())) - 1].push_back(n->args[0].get());
    }
  }
  for (const auto& o : outputs) {
    if (plan.varies.at(o.node().get())) plan.roots.back().push_back(o.node().get());
  }
  // Transcendental values more than one pass needs (without scratch rows) are stored.
  std::unordered_map<const void*, int> passes;
  for (const auto& roots : plan.roots) {
    for (RawNode n : pass_nodes(plan, roots, {})) ++passes[n];
  }
  for (const auto& n : plan.order) {
    if (is_transcendental(n->op) && passes[n.get()] > 1) plan.stored.push_back(n.get());
  }
  return plan;
}

// Whether the elementwise loop walks the output in stretches within rows, its `cols` the row
// length: with a row ('R') or column ('C') input (else `cols` is the whole output).
bool loops_by_row(const std::string& forms) {
  return forms.find_first_of("RC") != std::string::npos;
}

// Whether output `o` is summed over the rows (FusedElementwise::column_sums_).
bool summed(const std::vector<bool>& sums, size_t o) {
  return o < sums.size() && sums[o];
}

// `t` (of `shape`, or broadcasting to it) summed over every row in double: one row of the row
// length, as a summed output is returned.
at::Tensor sum_over_rows(const at::Tensor& t, const std::vector<int64_t>& shape) {
  const int64_t cols = shape.back();
  return at::sum(t.expand(shape).reshape({-1, cols}), {0}, false, at::kDouble).to(at::kFloat);
}

using detail::kLaneCols;
using detail::kLanes;
// The most stack a kernel's short-row scratch may take (a worker thread's stack is MiBs).
constexpr int64_t kLaneStackBytes = int64_t{128} << 10;

// The kernel of an expression with row operations: [begin, end) are whole rows; `out` holds
// the outputs and then, for each stored value, a scratch row of `cols` floats (RowPlan). A
// summed output that varies along the row is this thread's row of `cols` doubles, which the
// kernel adds each row's values to (a per-row one is written per row; run_kernel sums it).
//
// Two loops compute the same values. The row loop walks one row at a time, vectorised along
// the row: a pass per level of reductions, each ending in a horizontal reduction. Over short
// rows (cols <= kLaneCols) that per-row cost dominates (a 10-class log_softmax ran at 0.4x
// libtorch's), so there blocks of kLanes rows run first with one row per vector lane: the
// block's full inputs are transposed into column-major scratch ([column][lane]), every pass
// walks the columns with all lanes at once (reductions are per lane: no horizontal step, and
// no scalar remainder, since the lane count is fixed), and outputs are transposed back. The
// rows left over (fewer than kLanes) take the row loop.
std::string generate_row_body(const std::vector<jit::Expr>& outputs, const std::string& forms,
                              const std::vector<bool>& sums) {
  const RowPlan plan = plan_rows(outputs, forms);
  std::unordered_map<const void*, std::string> name;
  auto s = detail::c_stream<std::ostringstream>();
  s << kernel_start(plan.order, forms, &name);
  // In the lane loop a per-row value (reductions, values computed from them, column inputs) is
  // an array over the lanes, read at lane l; what varies along the row stays a scalar of the
  // lane loop's body.
  std::unordered_map<const void*, std::string> lane_name;
  for (const auto& n : plan.order) {
    const auto* p = n.get();
    const bool per_lane = n->op == Op::kInput ? forms[static_cast<size_t>(n->index)] == 'C'
                                              : n->op != Op::kConstant && !plan.varies.at(p);
    lane_name[p] = per_lane ? name.at(p) + "[l]" : name.at(p);
  }
  // The outputs that vary along the row: summed over the rows (into z<o>) or written whole.
  std::vector<size_t> summed_outputs, full_outputs;
  for (size_t o = 0; o < outputs.size(); ++o) {
    if (!plan.varies.at(outputs[o].node().get())) continue;
    (summed(sums, o) ? summed_outputs : full_outputs).push_back(o);
  }
  for (size_t o : summed_outputs) {
    s << "  double* restrict z" << o << " = (double*)out[" << o << "];\n";
  }
  std::unordered_map<const void*, std::string> scratch;
  for (size_t k = 0; k < plan.stored.size(); ++k) {
    scratch[plan.stored[k]] = "m" + std::to_string(k);
    s << "  float* restrict m" << k << " = out[" << outputs.size() + k << "];\n";
  }
  const bool final_pass = !plan.roots.back().empty();
  // The body of one pass: loads of the varying inputs, then each value, read back from its
  // scratch row when an earlier pass stored it, else computed (and stored the first time).
  // `lanes`: the lane loop's body (values named by lane_name, column-major scratch at j, l).
  auto pass = [&](const std::vector<RawNode>& roots, std::unordered_set<const void*>& done,
                  bool lanes, const std::string& pad) {
    const auto& names = lanes ? lane_name : name;
    const std::string at = lanes ? "[j * " + std::to_string(kLanes) + " + l]" : "[j]";
    const std::vector<RawNode> nodes = pass_nodes(plan, roots, done);
    std::set<int64_t> read;
    auto consider = [&](RawNode n) {
      if (n->op == Op::kInput && plan.varies.at(n)) read.insert(n->index);
    };
    for (RawNode n : nodes) {
      if (done.count(n)) continue;
      for (const auto& a : n->args) consider(a.get());
    }
    for (RawNode r : roots) consider(r);
    for (int64_t k : read) {
      const bool transposed = lanes && forms[static_cast<size_t>(k)] == 'F';
      s << pad << "const float v" << k << " = " << (transposed ? "x" : "p") << k
        << (transposed ? at : "[j]") << ";\n";
    }
    std::vector<RawNode> stores;
    for (RawNode n : nodes) {
      const std::string m = scratch.count(n) ? scratch.at(n) : "";  // its scratch, if stored
      if (done.count(n)) {
        s << pad << "const float " << name.at(n) << " = " << (lanes ? "w" : "") << m << at << ";\n";
        continue;
      }
      s << pad << "const float " << name.at(n) << " = " << c_expr(n, names) << ";\n";
      if (!m.empty()) {
        s << pad << (lanes ? "w" : "") << m << at << " = " << name.at(n) << ";\n";
        stores.push_back(n);
      }
    }
    done.insert(stores.begin(), stores.end());
  };
  // Per-row values of level `lv` that are not reductions, once per row (per lane).
  auto row_values = [&](int lv, bool lanes) {
    auto body = detail::c_stream<std::ostringstream>();
    for (const auto& n : plan.order) {
      const auto* p = n.get();
      if (plan.varies.at(p) || n->op == Op::kInput || n->op == Op::kConstant ||
          is_reduction(n->op) || plan.level.at(p) != lv) {
        continue;
      }
      if (lanes) {
        body << "        " << lane_name.at(p) << " = " << c_expr(p, lane_name) << ";\n";
      } else {
        s << "    const float " << name.at(p) << " = " << c_expr(p, name) << ";\n";
      }
    }
    if (lanes && body.tellp() > 0) {
      s << "      VOLT_SIMD\n      for (int64_t l = 0; l < " << kLanes << "; ++l) {\n"
        << body.str() << "      }\n";
    }
  };
  auto reductions_of = [&](int lv) {
    std::vector<RawNode> out;
    for (const auto& n : plan.order) {
      if (is_reduction(n->op) && plan.level.at(n.get()) == lv) out.push_back(n.get());
    }
    return out;
  };
  const std::string L = std::to_string(kLanes);
  // The final pass's stores: each output that varies along the row, a summed one added (as a
  // double) to <sum><o><sum_at>, the others written to <full><o><full_at>.
  auto store_outputs = [&](const std::string& pad, const std::string& sum,
                           const std::string& sum_at, const std::string& full,
                           const std::string& full_at) {
    for (size_t o = 0; o < outputs.size(); ++o) {
      const auto* n = outputs[o].node().get();
      if (!plan.varies.at(n)) continue;
      if (summed(sums, o)) {
        s << pad << sum << o << sum_at << " += (double)" << name.at(n) << ";\n";
      } else {
        s << pad << full << o << full_at << " = " << name.at(n) << ";\n";
      }
    }
  };

  std::set<int64_t> used;  // inputs the expression reads
  for (const auto& n : plan.order) {
    if (n->op == Op::kInput) used.insert(n->index);
  }
  // The lane loop's scratch lives on the stack: column-major blocks for the full inputs, the
  // stored values and the outputs, lane arrays for the per-row values. A kernel that would need
  // more than kLaneStackBytes (hundreds of inputs) runs every row in the row loop instead.
  int64_t blocks = static_cast<int64_t>(plan.stored.size() + full_outputs.size());
  int64_t lane_arrays = 0;
  for (int64_t k : used) blocks += forms[static_cast<size_t>(k)] == 'F' ? 1 : 0;
  for (const auto& n : plan.order) {
    lane_arrays +=
        n->op == Op::kConstant || plan.varies.at(n.get()) ? 0 : 2;  // value, accumulators
  }
  const bool lanes = blocks * kLaneCols * kLanes * static_cast<int64_t>(sizeof(float)) +
                         lane_arrays * kLanes * static_cast<int64_t>(sizeof(double)) <=
                     kLaneStackBytes;

  s << "  int64_t r = begin / cols;\n  const int64_t r_end = end / cols;\n";
  // The lane loop over blocks of kLanes short rows.
  auto lane_loop = [&]() {
    s << "  if (cols <= " << kLaneCols << " && r_end - r >= " << L << ") {\n";
    for (size_t k = 0; k < forms.size(); ++k) {
      if (!used.count(static_cast<int64_t>(k))) continue;
      if (forms[k] == 'F') s << "    float x" << k << "[" << kLaneCols * kLanes << "];\n";
      if (forms[k] == 'R') s << "    const float* restrict p" << k << " = in[" << k << "];\n";
      if (forms[k] == 'C') s << "    float v" << k << "[" << L << "];\n";
    }
    for (size_t k = 0; k < plan.stored.size(); ++k) {
      s << "    float wm" << k << "[" << kLaneCols * kLanes << "];\n";
    }
    for (const auto& n : plan.order) {
      const auto* p = n.get();
      if (!plan.varies.at(p) && n->op != Op::kInput && n->op != Op::kConstant) {
        s << "    float " << name.at(p) << "[" << L << "];\n";
      }
    }
    for (size_t o : full_outputs) {  // written through column-major y<o>
      s << "    float y" << o << "[" << kLaneCols * kLanes << "];\n";
    }
    s << "    for (; r + " << L << " <= r_end; r += " << L << ") {\n"
      << "      const int64_t i = r * cols;\n";
    for (size_t k = 0; k < forms.size(); ++k) {
      if (!used.count(static_cast<int64_t>(k))) continue;
      // Column by column, the 16 rows' values gathered into one vector (15% faster than row by
      // row with strided stores, measured at 10-31 columns).
      if (forms[k] == 'F') {
        s << "      for (int64_t j = 0; j < cols; ++j) {\n        VOLT_SIMD\n"
          << "        for (int64_t l = 0; l < " << L << "; ++l) x" << k << "[j * " << L
          << " + l] = in[" << k << "][i + l * cols + j];\n      }\n";
      }
      if (forms[k] == 'C') {
        s << "      for (int64_t l = 0; l < " << L << "; ++l) v" << k << "[l] = in[" << k
          << "][(r + l) % numel[" << k << "]];\n";
      }
    }
    std::unordered_set<const void*> done;
    row_values(0, true);
    for (int lv = 1; lv <= plan.top; ++lv) {
      const std::vector<RawNode> reductions = reductions_of(lv);
      auto init = detail::c_stream<std::ostringstream>();
      auto body = detail::c_stream<std::ostringstream>();
      auto fin = detail::c_stream<std::ostringstream>();
      for (RawNode n : reductions) {
        const std::string& t = name.at(n);
        const std::string x = lane_name.at(n->args[0].get());
        if (n->op == Op::kRowSum) {
          s << "      double a" << t << "[" << L << "];\n";
          init << "        a" << t << "[l] = 0.0;\n";
          body << "          a" << t << "[l] += (double)" << x << ";\n";
          fin << "        " << t << "[l] = (float)a" << t << "[l];\n";
        } else {
          s << "      float a" << t << "[" << L << "];\n      int n" << t << "[" << L << "];\n";
          init << "        a" << t << "[l] = -INFINITY;\n        n" << t << "[l] = 0;\n";
          body << "          a" << t << "[l] = " << x << " > a" << t << "[l] ? " << x << " : a" << t
               << "[l];\n"
               << "          n" << t << "[l] |= " << x << " != " << x << ";\n";
          fin << "        " << t << "[l] = n" << t << "[l] ? (float)NAN : a" << t << "[l];\n";
        }
      }
      s << "      for (int64_t l = 0; l < " << L << "; ++l) {\n"
        << init.str() << "      }\n"
        << "      for (int64_t j = 0; j < cols; ++j) {\n        VOLT_SIMD\n"
        << "        for (int64_t l = 0; l < " << L << "; ++l) {\n";
      pass(plan.roots[static_cast<size_t>(lv) - 1], done, true, "          ");
      s << body.str() << "        }\n      }\n"
        << "      VOLT_SIMD\n      for (int64_t l = 0; l < " << L << "; ++l) {\n"
        << fin.str() << "      }\n";
      row_values(lv, true);
    }
    for (size_t o = 0; o < outputs.size(); ++o) {
      const auto* n = outputs[o].node().get();
      if (!plan.varies.at(n)) {
        s << "      for (int64_t l = 0; l < " << L << "; ++l) out[" << o
          << "][r + l] = " << lane_name.at(n) << ";\n";
      }
    }
    if (final_pass) {
      auto zs = detail::c_stream<std::ostringstream>();
      for (size_t o : summed_outputs) zs << (zs.tellp() > 0 ? "," : "") << "s" << o;
      s << "      for (int64_t j = 0; j < cols; ++j) {\n";
      for (size_t o : summed_outputs) s << "        double s" << o << " = 0.0;\n";
      s << "#ifdef VOLT_MVEC\n#pragma omp simd";
      if (zs.tellp() > 0) s << " reduction(+:" << zs.str() << ")";
      s << "\n#endif\n        for (int64_t l = 0; l < " << L << "; ++l) {\n";
      pass(plan.roots.back(), done, true, "          ");
      store_outputs("          ", "s", "", "y", "[j * " + L + " + l]");
      s << "        }\n";
      for (size_t o : summed_outputs) s << "        z" << o << "[j] += s" << o << ";\n";
      s << "      }\n";
      for (size_t o : full_outputs) {
        s << "      for (int64_t l = 0; l < " << L << "; ++l) {\n"
          << "        float* restrict row = out[" << o << "] + i + l * cols;\n"
          << "        for (int64_t j = 0; j < cols; ++j) row[j] = y" << o << "[j * " << L
          << " + l];\n      }\n";
      }
    }
    s << "    }\n  }\n";
  };
  if (lanes) lane_loop();

  // The row loop: the rest of the rows, or all of them when rows are long.
  s << "  for (; r < r_end; ++r) {\n"
    << "    const int64_t i = r * cols;\n";
  for (size_t k = 0; k < forms.size(); ++k) {
    if (forms[k] == 'F') s << "    const float* restrict p" << k << " = in[" << k << "] + i;\n";
    if (forms[k] == 'R') s << "    const float* restrict p" << k << " = in[" << k << "];\n";
    if (forms[k] == 'C') {
      s << "    const float v" << k << " = in[" << k << "][r % numel[" << k << "]];\n";
    }
  }
  std::unordered_set<const void*> done;  // stored values some pass has written already
  row_values(0, false);
  for (int lv = 1; lv <= plan.top; ++lv) {
    const std::vector<RawNode> reductions = reductions_of(lv);
    auto sums_list = detail::c_stream<std::ostringstream>();
    auto maxes = detail::c_stream<std::ostringstream>();
    auto ors = detail::c_stream<std::ostringstream>();
    auto body = detail::c_stream<std::ostringstream>();
    for (RawNode n : reductions) {
      const std::string& t = name.at(n);
      const std::string x = name.at(n->args[0].get());
      if (n->op == Op::kRowSum) {
        s << "    double a" << t << " = 0.0;\n";
        sums_list << (sums_list.tellp() > 0 ? "," : "") << "a" << t;
        body << "      a" << t << " += (double)" << x << ";\n";
      } else {
        s << "    float a" << t << " = -INFINITY;\n    int n" << t << " = 0;\n";
        maxes << (maxes.tellp() > 0 ? "," : "") << "a" << t;
        ors << (ors.tellp() > 0 ? "," : "") << "n" << t;
        body << "      a" << t << " = " << x << " > a" << t << " ? " << x << " : a" << t << ";\n"
             << "      n" << t << " |= " << x << " != " << x << ";\n";
      }
    }
    s << "#ifdef VOLT_MVEC\n#pragma omp simd";
    if (sums_list.tellp() > 0) s << " reduction(+:" << sums_list.str() << ")";
    if (maxes.tellp() > 0) {
      s << " reduction(max:" << maxes.str() << ") reduction(|:" << ors.str() << ")";
    }
    s << "\n#endif\n    for (int64_t j = 0; j < cols; ++j) {\n";
    pass(plan.roots[static_cast<size_t>(lv) - 1], done, false, "      ");
    s << body.str() << "    }\n";
    for (RawNode n : reductions) {
      const std::string& t = name.at(n);
      if (n->op == Op::kRowSum) {
        s << "    const float " << t << " = (float)a" << t << ";\n";
      } else {
        s << "    const float " << t << " = n" << t << " ? (float)NAN : a" << t << ";\n";
      }
    }
    row_values(lv, false);
  }
  for (size_t o = 0; o < outputs.size(); ++o) {
    const auto* n = outputs[o].node().get();
    if (!plan.varies.at(n)) s << "    out[" << o << "][r] = " << name.at(n) << ";\n";
  }
  if (final_pass) {
    for (size_t o : full_outputs) {
      s << "    float* restrict q" << o << " = out[" << o << "] + i;\n";
    }
    s << "    VOLT_SIMD\n    for (int64_t j = 0; j < cols; ++j) {\n";
    pass(plan.roots.back(), done, false, "      ");
    store_outputs("      ", "z", "[j]", "q", "[j]");
    s << "    }\n";
  }
  s << "  }\n}\n";
  return s.str();
}

// The kernel's C source for input forms `forms` ('F' full, 'S' one element, 'R' row, 'C'
// column), without the key line. The loop runs over [begin, end) of the flat output in
// stretches that stay in one row, so that row inputs are read at a running column and the
// inner loop vectorises. A summed output (`sums`; only with a row or column input, so that
// `cols` is the row length) is this thread's row of doubles, added to at the running column.
std::string generate_body(const std::vector<jit::Expr>& outputs, const std::string& forms,
                          const std::vector<bool>& sums) {
  const auto order = topo_order(outputs);
  if (uses_row_ops(order)) return generate_row_body(outputs, forms, sums);
  // Without a row or column input the loop's `cols` is not the row length: run_kernel sums.
  if (!sums.empty() && !loops_by_row(forms)) {
    return generate_body(outputs, forms, {});
  }
  std::unordered_map<const void*, std::string> name;
  auto s = detail::c_stream<std::ostringstream>();
  auto body = detail::c_stream<std::ostringstream>();
  s << kernel_start(order, forms, &name);
  for (const auto& n : order) {
    if (n->op == Op::kInput || n->op == Op::kConstant) continue;
    body << "      const float " << name.at(n.get()) << " = " << c_expr(n.get(), name) << ";\n";
  }
  // Rows of at most kLaneCols values: a stretch (one row) is shorter than a vector or two, and
  // its loop ran mostly as scalar remainder iterations (bias + GELU over 10 columns measured
  // 0.8x eager). There blocks of kLanes whole rows run as one stretch of kLanes * cols values:
  // a row input is read from its row repeated kLanes times (b<k>, filled once), a column input
  // from its values spread over the block's rows (b<k>, filled per block), and a summed output
  // is added to a block-shaped accumulator (zb<o>) folded into its row at the end.
  // (A kernel whose blocks would take more than kLaneStackBytes keeps the stretch loop.)
  int64_t block_bytes = 0;
  for (char f : forms) {
    block_bytes += f == 'R' || f == 'C' ? kLaneCols * kLanes * int64_t{sizeof(float)} : 0;
  }
  for (size_t o = 0; o < outputs.size(); ++o) {
    block_bytes += summed(sums, o) ? kLaneCols * kLanes * int64_t{sizeof(double)} : 0;
  }
  const bool row_blocks = loops_by_row(forms) && block_bytes <= kLaneStackBytes;
  const std::string block = std::to_string(kLanes) + " * cols";
  if (row_blocks) {
    s << "  const int short_rows = cols <= " << kLaneCols << ";\n  int blocks = 0;\n";
    for (size_t k = 0; k < forms.size(); ++k) {
      if (forms[k] == 'R' || forms[k] == 'C') {
        s << "  float b" << k << "[" << kLaneCols * kLanes << "];\n";
      }
      if (forms[k] == 'R') {
        s << "  if (short_rows) {\n    for (int64_t j = 0; j < " << block << "; ++j) b" << k
          << "[j] = in[" << k << "][j % cols];\n  }\n";
      }
    }
    for (size_t o = 0; o < outputs.size(); ++o) {
      if (!summed(sums, o)) continue;
      s << "  double zb" << o << "[" << kLaneCols * kLanes << "];\n"
        << "  if (short_rows) {\n    for (int64_t j = 0; j < " << block << "; ++j) zb" << o
        << "[j] = 0.0;\n  }\n";
    }
  }
  s << "  int64_t i = begin;\n"
    << "  while (i < end) {\n";
  if (row_blocks) {
    s << "    if (short_rows && i % cols == 0 && end - i >= " << block << ") {\n";
    for (size_t k = 0; k < forms.size(); ++k) {
      if (forms[k] == 'F') {
        s << "      const float* restrict p" << k << " = in[" << k << "] + i;\n";
      } else if (forms[k] == 'R') {
        s << "      const float* restrict p" << k << " = b" << k << ";\n";
      } else if (forms[k] == 'C') {
        s << "      for (int64_t l = 0; l < " << kLanes << "; ++l) {\n"
          << "        const float c = in[" << k << "][(i / cols + l) % numel[" << k << "]];\n"
          << "        for (int64_t j = 0; j < cols; ++j) b" << k << "[l * cols + j] = c;\n"
          << "      }\n"
          << "      const float* restrict p" << k << " = b" << k << ";\n";
      }
    }
    for (size_t o = 0; o < outputs.size(); ++o) {
      if (!summed(sums, o)) s << "      float* restrict q" << o << " = out[" << o << "] + i;\n";
    }
    s << "      VOLT_SIMD\n      for (int64_t j = 0; j < " << block << "; ++j) {\n";
    for (size_t k = 0; k < forms.size(); ++k) {
      if (forms[k] != 'S') s << "        const float v" << k << " = p" << k << "[j];\n";
    }
    auto lines = detail::c_stream<std::istringstream>(body.str());
    for (std::string line; std::getline(lines, line);) s << "  " << line << "\n";
    for (size_t o = 0; o < outputs.size(); ++o) {
      const std::string& v = name.at(outputs[o].node().get());
      if (summed(sums, o)) {
        s << "        zb" << o << "[j] += (double)" << v << ";\n";
      } else {
        s << "        q" << o << "[j] = " << v << ";\n";
      }
    }
    s << "      }\n      i += " << block << ";\n      blocks = 1;\n      continue;\n    }\n";
  }
  s << "    const int64_t col = i % cols;\n"
    << "    int64_t n = cols - col;\n"
    << "    if (n > end - i) n = end - i;\n";
  for (size_t k = 0; k < forms.size(); ++k) {
    if (forms[k] == 'F') s << "    const float* restrict p" << k << " = in[" << k << "] + i;\n";
    if (forms[k] == 'R') s << "    const float* restrict p" << k << " = in[" << k << "] + col;\n";
    // A column input is one value per row (repeating over leading dimensions it lacks), and a
    // stretch never leaves its row.
    if (forms[k] == 'C') {
      s << "    const float v" << k << " = in[" << k << "][(i / cols) % numel[" << k << "]];\n";
    }
  }
  for (size_t o = 0; o < outputs.size(); ++o) {
    if (summed(sums, o)) {
      s << "    double* restrict z" << o << " = (double*)out[" << o << "] + col;\n";
    } else {
      s << "    float* restrict q" << o << " = out[" << o << "] + i;\n";
    }
  }
  s << "    VOLT_SIMD\n    for (int64_t j = 0; j < n; ++j) {\n";
  for (size_t k = 0; k < forms.size(); ++k) {
    if (forms[k] == 'F' || forms[k] == 'R') {
      s << "      const float v" << k << " = p" << k << "[j];\n";
    }
  }
  s << body.str();
  for (size_t o = 0; o < outputs.size(); ++o) {
    const std::string& v = name.at(outputs[o].node().get());
    if (summed(sums, o)) {
      s << "      z" << o << "[j] += (double)" << v << ";\n";
    } else {
      s << "      q" << o << "[j] = " << v << ";\n";
    }
  }
  s << "    }\n    i += n;\n  }\n";
  for (size_t o = 0; o < outputs.size(); ++o) {
    if (!row_blocks || !summed(sums, o)) continue;
    s << "  if (blocks) {\n    double* restrict z = (double*)out[" << o << "];\n"
      << "    for (int64_t j = 0; j < " << block << "; ++j) z[j % cols] += zb" << o << "[j];\n"
      << "  }\n";
  }
  s << "}\n";
  return s.str();
}

std::string escape_c_string(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

std::vector<std::string> compiler_command() {
  std::vector<std::string> words;
  auto in = detail::c_stream<std::istringstream>(env_value("VOLT_JIT_CC").value_or("cc"));
  for (std::string w; in >> w;) words.push_back(w);
  if (words.empty()) words.push_back("cc");
  return words;
}

// Runs `argv` (PATH lookup) with stdout and stderr into `log_path`, at most `timeout_s`
// seconds; returns "" on exit code 0, else why not. The compiler must never hang a run.
std::string run_program(const std::vector<std::string>& argv, const std::string& log_path,
                        int timeout_s) {
  std::vector<char*> cargv;
  std::vector<std::string> copy = argv;
  for (auto& a : copy) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, cargv[0], &fa, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return "cannot run '" + argv[0] + "' (" + std::strerror(rc) + ")";
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  bool done = pidfd < 0;  // without pidfds (kernel < 5.3) wait without a deadline
  if (pidfd >= 0) {
    pollfd p{pidfd, POLLIN, 0};
    int r;
    do {
      r = ::poll(&p, 1, timeout_s * 1000);
    } while (r < 0 && errno == EINTR);
    ::close(pidfd);
    done = r > 0;
  }
  if (!done) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!done) return "'" + argv[0] + "' ran longer than " + std::to_string(timeout_s) + " s";
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
  auto log = detail::c_stream<std::ifstream>(log_path);
  std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  if (text.size() > 2000) text = "..." + text.substr(text.size() - 2000);
  const std::string how = WIFEXITED(status)
                              ? "exited with " + std::to_string(WEXITSTATUS(status))
                              : "was killed by signal " + std::to_string(WTERMSIG(status));
  return "'" + argv[0] + "' " + how + ": " + text;
}

// A temporary folder removed with everything in it when this goes out of scope.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "volt-jit-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
  }
  ~TempDir() {
    if (!path_.empty()) detail::remove_tree(path_);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

struct Compiler {
  std::vector<std::string> command;
  std::string identity;  // first line of --version; "" when unusable
  std::string problem;   // why it cannot be used
};

const Compiler& compiler() {
  static const Compiler c = [] {
    Compiler c;
    c.command = compiler_command();
    TempDir dir;
    if (dir.path().empty()) {
      c.problem = "cannot create a temporary folder for the compiler";
      return c;
    }
    auto argv = c.command;
    argv.push_back("--version");
    const std::string log = dir.path() + "/version.txt";
    const std::string why = run_program(argv, log, 60);
    if (!why.empty()) {
      c.problem =
          "no usable C compiler: " + why + " (install gcc or clang, or point VOLT_JIT_CC at one)";
      return c;
    }
    auto in = detail::c_stream<std::ifstream>(log);
    std::getline(in, c.identity);
    if (c.identity.empty()) c.identity = "unknown compiler";
    return c;
  }();
  return c;
}

// The process-wide level of the cache: kernels loaded by key, and keys that failed (with why),
// so that a kernel is compiled or loaded once per process.
struct Loaded {
  std::mutex mu;
  std::unordered_map<std::string, KernelFn> kernels;
  std::unordered_map<std::string, std::string> failed;
  jit::Stats stats;
};

Loaded& loaded() {
  static Loaded* l = new Loaded();  // never destroyed: kernels may run during static teardown
  return *l;
}

// What a kernel is, as the loaded and failed maps and the disk cache key it: everything that
// changes the library (format, volt version, compiler, flags, glibc, CPU model, the generated
// body) and, for reading, its name and input forms.
std::string kernel_key(const std::string& name, const std::string& forms, const std::string& body) {
  std::string flags;
  for (const auto& f : kFlags) flags += f + " ";
#ifdef VOLT_VERSION_STRING
  const char* version = VOLT_VERSION_STRING;
#else
  const char* version = "unknown";
#endif
  auto key = detail::c_stream<std::ostringstream>();
  key << kFormat << "|volt " << version << "|" << name << "|" << forms << "|" << compiler().identity
      << "|" << flags << "|glibc " << ::gnu_get_libc_version() << "|" << detail::cpu_model_name()
      << "|body " << detail::stable_hash_hex(body);
  return key.str();
}

// dlopen of the library at `path`; nullptr with the reason in *why when it fails.
//
// dlopen maps a library's code with PROT_EXEC, which a folder mounted noexec refuses ("failed
// to map segment from shared object"): a hardened /tmp, where kernels are compiled, or a cache
// folder on such a mount. The same bytes copied into an anonymous memory file load anyway,
// through /proc/self/fd. That descriptor stays open as long as the library (the process's
// lifetime), so its number, and with it the path dlopen remembers the library by, is never
// handed to another kernel.
void* dlopen_anywhere(const std::string& path, std::string* why) {
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle != nullptr) return handle;
  const char* e = ::dlerror();
  *why = std::string("dlopen failed: ") + (e ? e : "?");
  auto in = detail::c_stream<std::ifstream>(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) return nullptr;
  const int fd = ::memfd_create("volt-jit-kernel", MFD_CLOEXEC);
  if (fd < 0) {
    *why += std::string("; loading it from memory instead failed: memfd_create: ") +
            std::strerror(errno);
    return nullptr;
  }
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  if (done == bytes.size()) {
    handle = ::dlopen(("/proc/self/fd/" + std::to_string(fd)).c_str(), RTLD_NOW | RTLD_LOCAL);
  }
  if (handle == nullptr) {
    const char* e2 = done == bytes.size() ? ::dlerror() : "cannot write the memory file";
    *why += std::string("; loading it from memory instead failed: ") + (e2 ? e2 : "?");
    ::close(fd);
    return nullptr;
  }
  static std::atomic<bool> said{false};
  if (!said.exchange(true)) {
    log_info(kComponent, "kernels load through memory files: dlopen refused " + path + " (" + *why +
                             "; its folder is probably mounted noexec)");
  }
  why->clear();
  // The descriptor stays open with the library. When the caller then finds another kernel's key
  // in it (a bad cache entry) and closes the library, the descriptor stays open too: one per bad
  // entry, which is removed and compiled again, so at most one per kernel.
  return handle;
}

// Opens the library at `path` and returns its kernel when it carries `key`; "" in *why on success.
KernelFn open_kernel(const std::string& path, const std::string& key, std::string* why) {
  void* handle = dlopen_anywhere(path, why);
  if (handle == nullptr) return nullptr;
  auto key_fn = reinterpret_cast<KeyFn>(::dlsym(handle, "volt_jit_key"));
  auto fn = reinterpret_cast<KernelFn>(::dlsym(handle, "volt_jit_kernel"));
  if (key_fn == nullptr || fn == nullptr || key != key_fn()) {
    *why = "it is not the kernel of this key (another kernel, compiler or volt version)";
    ::dlclose(handle);
    return nullptr;
  }
  why->clear();
  return fn;  // the handle stays open for the process's lifetime
}

// Compiles `source` into a library, loads it, and returns the kernel and the library's bytes.
KernelFn compile_kernel(const std::string& source, const std::string& key, std::string* bytes,
                        std::string* why) {
  const Compiler& cc = compiler();
  if (!cc.problem.empty()) {
    *why = cc.problem;
    return nullptr;
  }
  TempDir dir;
  if (dir.path().empty()) {
    *why = "cannot create a temporary folder to compile in";
    return nullptr;
  }
  // dlopen hands back an already loaded library whose path matches, even one since deleted: a
  // name unique to the key keeps a reused temporary folder name from returning another kernel.
  const std::string stem = dir.path() + "/kernel-" + detail::stable_hash_hex(key);
  const std::string src = stem + ".c", lib = stem + ".so";
  {
    auto out = detail::c_stream<std::ofstream>(src);
    out << source;
    if (!out) {
      *why = "cannot write " + src;
      return nullptr;
    }
  }
  std::string failures;
  const Variant* built = nullptr;
  for (const auto& v : kVariants) {
    auto argv = cc.command;
    argv.insert(argv.end(), kFlags.begin(), kFlags.end());
    argv.insert(argv.end(), v.flags.begin(), v.flags.end());
    argv.insert(argv.end(), {"-o", lib, src});
    argv.insert(argv.end(), v.libs.begin(), v.libs.end());
    const std::string err = run_program(argv, dir.path() + "/compile.txt", 300);
    if (err.empty()) {
      built = &v;
      break;
    }
    failures += std::string(failures.empty() ? "" : "; ") + v.name + ": " + err;
  }
  if (built == nullptr) {
    *why = "compiling failed: " + failures;
    return nullptr;
  }
  if (built != &kVariants.front()) {
    warn_once("jit-no-mvec", kComponent,
              "kernels are built with scalar libm calls, which do not vectorise (" + failures +
                  "); exp/log/tanh/erf chains run slower than libtorch's own kernels.");
  }
  KernelFn fn = open_kernel(lib, key, why);
  if (fn == nullptr) return nullptr;
  auto in = detail::c_stream<std::ifstream>(lib, std::ios::binary);
  bytes->assign((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return fn;
}

std::string shape_str(at::IntArrayRef s) {
  auto os = detail::c_stream<std::ostringstream>();
  os << s;
  return os.str();
}

// The inputs' broadcast shape, after checking that there is one tensor per input: the one check
// of the inputs operator(), reference() and the form classification share.
std::vector<int64_t> checked_shape(const std::string& name, int64_t num_inputs,
                                   const std::vector<at::Tensor>& inputs) {
  VOLT_CHECK(static_cast<int64_t>(inputs.size()) == num_inputs, ValueError, "[FusedElementwise] '",
             name, "' takes ", num_inputs, " inputs (input(0) .. input(", num_inputs - 1,
             ")), got ", inputs.size(), "; pass one tensor per input.");
  std::vector<int64_t> shape;
  for (size_t i = 0; i < inputs.size(); ++i) {
    VOLT_CHECK(inputs[i].defined(), ValueError, "[FusedElementwise] input ", i,
               " is an undefined tensor; pass a tensor for every input.");
    try {
      shape = at::infer_size(shape, inputs[i].sizes());
    } catch (const c10::Error&) {
      VOLT_CHECK(false, ValueError, "[FusedElementwise] input ", i, " of shape ",
                 shape_str(inputs[i].sizes()), " does not broadcast with the shape ",
                 shape_str(shape), " of the inputs before it; pass broadcastable shapes.");
    }
  }
  return shape;
}

// One node with libtorch ops, its arguments already in `memo` (callers go in evaluation order:
// no recursion, so deep expressions cannot overflow the stack).
at::Tensor evaluate(const jit::Expr::Node* n, const std::vector<at::Tensor>& inputs,
                    const std::vector<int64_t>& shape,
                    std::unordered_map<const void*, at::Tensor>* memo) {
  auto a = [&](size_t i) { return memo->at(n->args[i].get()); };
  at::Tensor r;
  switch (n->op) {
    case Op::kInput: r = inputs[n->index]; break;
    case Op::kConstant:
      r = at::scalar_tensor(static_cast<float>(n->value), at::TensorOptions(at::kFloat));
      break;
    case Op::kAdd: r = at::add(a(0), a(1)); break;
    case Op::kSub: r = at::sub(a(0), a(1)); break;
    case Op::kMul: r = at::mul(a(0), a(1)); break;
    case Op::kDiv: r = at::div(a(0), a(1)); break;
    case Op::kMaximum: r = at::maximum(a(0), a(1)); break;
    case Op::kMinimum: r = at::minimum(a(0), a(1)); break;
    case Op::kNeg: r = at::neg(a(0)); break;
    case Op::kAbs: r = at::abs(a(0)); break;
    case Op::kExp: r = at::exp(a(0)); break;
    case Op::kLog: r = at::log(a(0)); break;
    case Op::kTanh: r = at::tanh(a(0)); break;
    case Op::kSigmoid: r = at::sigmoid(a(0)); break;
    case Op::kRelu: r = at::relu(a(0)); break;
    case Op::kSqrt: r = at::sqrt(a(0)); break;
    case Op::kErf: r = at::erf(a(0)); break;
    case Op::kSelectGt:
    case Op::kSelectEq: {
      const at::Tensor x = a(2), y = a(3);
      const auto type = at::result_type(x, y);
      const at::Tensor cond = n->op == Op::kSelectGt ? at::gt(a(0), a(1)) : at::eq(a(0), a(1));
      r = at::where(cond, x.to(type), y.to(type));
      break;
    }
    // The reductions see their argument at the full shape: a value that does not vary along
    // the row is summed once per column, as the loop sums it.
    case Op::kRowSum: r = at::sum(a(0).expand(shape), -1, /*keepdim=*/true); break;
    case Op::kRowMax: r = at::amax(a(0).expand(shape), -1, /*keepdim=*/true); break;
    case Op::kRowLength:
      r = at::scalar_tensor(static_cast<float>(shape.empty() ? 1 : shape.back()),
                            at::TensorOptions(at::kFloat));
      break;
    case Op::kFirstColumn: {
      const at::Tensor x = a(0);
      if (shape.empty()) {
        r = x;
        break;
      }
      const at::Tensor first = at::arange(shape.back(), x.options().dtype(at::kLong)).eq(0);
      r = at::where(first, x, at::zeros({}, x.options()));
      break;
    }
    case Op::kDetach: r = a(0).detach(); break;
  }
  (*memo)[n] = r;
  return r;
}

bool is_valid_name(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s) {
    if (!detail::ascii_alnum(c) && c != '_') return false;
  }
  return true;
}

// `n` over the nodes `now` maps its arguments to: `n` itself when none changed, else a copy.
NodePtr rebuilt(const NodePtr& n, const std::unordered_map<const void*, NodePtr>& now) {
  bool changed = false;
  std::vector<NodePtr> args;
  for (const auto& a : n->args) {
    args.push_back(now.at(a.get()));
    changed = changed || args.back() != a;
  }
  if (!changed) return n;
  auto copy = std::make_shared<jit::Expr::Node>();
  copy->op = n->op;
  copy->index = n->index;
  copy->value = n->value;
  copy->args = std::move(args);
  return copy;
}

// `exprs` with the nodes in `by` replaced by their expressions (the rest rebuilt over them, in
// evaluation order: no recursion).
std::vector<jit::Expr> substitute(const std::vector<jit::Expr>& exprs,
                                  const std::unordered_map<const void*, jit::Expr>& by) {
  std::unordered_map<const void*, NodePtr> now;
  for (const auto& n : topo_order(exprs)) {
    auto it = by.find(n.get());
    now[n.get()] = it != by.end() ? it->second.node() : rebuilt(n, now);
  }
  std::vector<jit::Expr> out;
  for (const auto& e : exprs) out.emplace_back(now.at(e.node().get()));
  return out;
}

// `exprs` with structurally equal sub-expressions made one node (the same op on the same
// operands; inputs equal by index, constants by value), in evaluation order: a value written
// twice, as exp(x - m) / row_sum(exp(x - m)) built by two calls, is then computed, kept and
// differentiated once, as if the caller had reused one Expr.
std::vector<jit::Expr> merge_common(const std::vector<jit::Expr>& exprs) {
  using Key = std::tuple<int, int64_t, uint64_t, std::vector<const void*>>;
  std::map<Key, NodePtr> canonical;
  std::unordered_map<const void*, NodePtr> now;
  for (const auto& n : topo_order(exprs)) {
    NodePtr node = rebuilt(n, now);  // over the arguments' canonical nodes
    std::vector<const void*> arg_ids;
    for (const auto& a : node->args) arg_ids.push_back(a.get());
    uint64_t bits = 0;
    if (n->op == Op::kConstant) std::memcpy(&bits, &n->value, sizeof bits);
    Key key{static_cast<int>(n->op), n->op == Op::kInput ? n->index : 0, bits, std::move(arg_ids)};
    now[n.get()] = canonical.emplace(std::move(key), std::move(node)).first->second;
  }
  std::vector<jit::Expr> out;
  for (const auto& e : exprs) out.emplace_back(now.at(e.node().get()));
  return out;
}

// The autograd node of a fused call: runs the backward FusedElementwise on the saved inputs and
// the output gradients, then sums each gradient down to its input's (broadcast) shape. It owns
// the backward kernel, so the forward object may be gone by the time it runs.
class FusedElementwiseBackward : public torch::autograd::Node {
 public:
  // `fast` runs without create_graph: it reads `stats`, the forward's reductions, after the
  // output gradients (when there are any) and returns the inputs marked in `summed` summed
  // over the rows; `backward` (under create_graph) recomputes the reductions and returns every
  // gradient at the full shape.
  // `fast` reads, after the stats, the outputs marked in `outputs_read` (save_outputs).
  // Each kernel comes with its slots (FusedElementwise::Backward) and may be nullptr when
  // every gradient passes an output gradient through.
  FusedElementwiseBackward(std::string name, std::shared_ptr<const FusedElementwise> backward,
                           std::vector<int64_t> backward_slots,
                           std::shared_ptr<const FusedElementwise> fast,
                           std::vector<int64_t> fast_slots, std::vector<at::Tensor> stats,
                           std::vector<size_t> grad_inputs, std::vector<bool> summed,
                           const std::vector<at::Tensor>& inputs, std::vector<int64_t> shape,
                           const std::vector<bool>& row_out)
      : name_(std::move(name)),
        backward_(std::move(backward)),
        backward_slots_(std::move(backward_slots)),
        fast_(std::move(fast)),
        fast_slots_(std::move(fast_slots)),
        stats_(std::move(stats)),
        grad_inputs_(std::move(grad_inputs)),
        summed_(std::move(summed)),
        num_inputs_(inputs.size()),
        shape_(std::move(shape)) {
    for (bool row : row_out) out_shapes_.push_back(row ? detail::row_shape(shape_) : shape_);
    for (const auto& t : inputs) {
      saved_.emplace_back(t, /*is_output=*/false);
      sizes_.push_back(t.sizes().vec());
    }
  }

  // Keeps the outputs the fast backward reads (`read[o]`), as their data without autograd
  // history (an output's own backward holding the output would be a reference cycle) but with
  // their version counter, so that one modified in place since is noticed.
  void save_outputs(const std::vector<at::Tensor>& outputs, const std::vector<bool>& read) {
    for (size_t o = 0; o < outputs.size(); ++o) {
      const bool r = o < read.size() && read[o];
      outputs_.push_back(r ? outputs[o].tensor_data() : at::Tensor());
      versions_.push_back(r ? outputs[o]._version() : 0);
    }
  }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    VOLT_CHECK(!saved_.empty() || num_inputs_ == 0, ValueError,
               "[FusedElementwise] backward through '", name_,
               "' ran twice; pass retain_graph=true to the first.");
    std::vector<at::Tensor> args;
    for (const auto& v : saved_) args.push_back(v.unpack());
    for (size_t o = 0; o < grads.size(); ++o) {
      args.push_back(grads[o].defined()
                         ? grads[o]
                         : at::zeros(out_shapes_.at(o), at::TensorOptions(at::kFloat)));
    }
    // With create_graph the gradients must be differentiable in the inputs, the reductions
    // included: then they are recomputed from the inputs instead of read. So they are when an
    // output the fast kernel reads was modified in place since the forward.
    bool intact = true;
    for (size_t o = 0; o < outputs_.size(); ++o) {
      intact = intact && (!outputs_[o].defined() || outputs_[o]._version() == versions_[o]);
    }
    const bool fast = !c10::GradMode::is_enabled() && intact;
    const FusedElementwise* kernel = fast ? fast_.get() : backward_.get();
    const std::vector<int64_t>& slots = fast ? fast_slots_ : backward_slots_;
    if (fast) {
      args.insert(args.end(), stats_.begin(), stats_.end());
      // An output the kernel does not read still takes its place: one element, never read.
      for (const auto& out : outputs_) {
        args.push_back(out.defined() ? out : at::zeros({}, at::TensorOptions(at::kFloat)));
      }
    }
    std::vector<at::Tensor> d;
    if (kernel != nullptr) {
      // The backward reads only the inputs its expressions use: those up to its highest index.
      d = (*kernel)(std::vector<at::Tensor>(args.begin(), args.begin() + kernel->num_inputs()));
    }
    torch::autograd::variable_list out(num_inputs_);
    for (size_t k = 0; k < grad_inputs_.size(); ++k) {
      const size_t i = grad_inputs_[k];
      // A kernel's output, or an output gradient passed through (shared, as AddBackward does).
      const int64_t slot = slots[k];
      at::Tensor gk =
          slot >= 0 ? d[static_cast<size_t>(slot)] : args[static_cast<size_t>(-1 - slot)];
      if (fast && summed_[i]) {  // already one row: the input's elements
        out[i] = gk.reshape(sizes_[i]);
        continue;
      }
      if (!gk.sizes().equals(shape_)) gk = gk.expand(shape_);
      out[i] = at::sum_to(gk, sizes_[i]);
    }
    return out;
  }

  std::string name() const override { return "volt::FusedElementwiseBackward"; }
  void release_variables() override {
    saved_.clear();
    stats_.clear();
    outputs_.clear();
  }

 private:
  std::string name_;  // the forward's
  std::shared_ptr<const FusedElementwise> backward_;
  std::vector<int64_t> backward_slots_;
  std::shared_ptr<const FusedElementwise> fast_;
  std::vector<int64_t> fast_slots_;
  std::vector<at::Tensor> stats_;
  std::vector<size_t> grad_inputs_;  // the input each backward output belongs to
  std::vector<bool> summed_;         // per input: fast_ returns its gradient summed over rows
  size_t num_inputs_;
  std::vector<int64_t> shape_;                    // the full shape
  std::vector<std::vector<int64_t>> out_shapes_;  // each output's (per-row ones: last size 1)
  std::vector<torch::autograd::SavedVariable> saved_;
  std::vector<std::vector<int64_t>> sizes_;
  std::vector<at::Tensor> outputs_;  // save_outputs; undefined: not read
  std::vector<uint32_t> versions_;   // their versions then
};

}  // namespace

namespace jit {

std::vector<Expr> gradients(const std::vector<Expr>& outputs, int64_t num_inputs,
                            const std::vector<bool>& row_outputs) {
  VOLT_CHECK(num_inputs >= 0, ValueError, "[FusedElementwise] gradients: num_inputs=", num_inputs,
             " is negative.");
  VOLT_CHECK(row_outputs.empty() || row_outputs.size() == outputs.size(), ValueError,
             "[FusedElementwise] gradients: row_outputs has ", row_outputs.size(), " entries for ",
             outputs.size(), " outputs; pass one per output, or none.");
  for (const auto& out : outputs) {
    VOLT_CHECK(out.node() != nullptr, ValueError, "[FusedElementwise] gradients of an empty Expr.");
  }
  // The gradient expressions reuse the forward nodes: the backward loop recomputes the forward
  // values it needs.
  const std::vector<NodePtr> order = topo_order(outputs);
  std::unordered_map<const Expr::Node*, Expr> adjoint;
  auto add = [&](const NodePtr& n, const Expr& g) {
    auto it = adjoint.find(n.get());
    if (it == adjoint.end()) {
      adjoint.emplace(n.get(), g);
    } else {
      it->second = it->second + g;
    }
  };
  // Adjoints are values per element of the full shape. A per-row output's gradient (a last
  // size of 1) counts once per row, so it enters at the first column only.
  for (size_t o = 0; o < outputs.size(); ++o) {
    const Expr g = input(num_inputs + static_cast<int64_t>(o));
    add(outputs[o].node(), !row_outputs.empty() && row_outputs[o] ? first_column(g) : g);
  }
  std::vector<std::optional<Expr>> grads(static_cast<size_t>(num_inputs));
  // Reverse evaluation order: a node's adjoint is complete before it is propagated. The formulas
  // are libtorch's (tools/autograd/derivatives.yaml), operation for operation, so that a
  // single-use chain of exactly rounded ops gives autograd's bits.
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const Expr::Node* n = it->get();
    auto found = adjoint.find(n);
    if (found == adjoint.end()) continue;
    const Expr g = found->second;
    const Expr r(*it);  // this node's forward value
    auto x = [&](size_t i) { return Expr(n->args[i]); };
    const NodePtr* args = n->args.data();
    switch (n->op) {
      case Op::kInput: {
        VOLT_CHECK(n->index < num_inputs, ValueError,
                   "[FusedElementwise] gradients: the expression "
                   "reads input(",
                   n->index, ") but num_inputs=", num_inputs, ".");
        auto& slot = grads[static_cast<size_t>(n->index)];
        slot = slot ? *slot + g : g;
        break;
      }
      case Op::kConstant: break;
      case Op::kAdd:
        add(args[0], g);
        add(args[1], g);
        break;
      case Op::kSub:
        add(args[0], g);
        add(args[1], -g);
        break;
      case Op::kMul:
        add(args[0], g * x(1));
        add(args[1], g * x(0));
        break;
      case Op::kDiv:
        add(args[0], g / x(1));
        add(args[1], -g * (r / x(1)));  // r is a / b: the same value, one node (saved or not)
        break;
      case Op::kMaximum:
      case Op::kMinimum: {
        // where(a == b, g / 2, g), zeroed where the other operand wins.
        const Expr split = where_equal(x(0), x(1), g / 2.0, g);
        const bool max = n->op == Op::kMaximum;
        add(args[0],
            max ? where_greater(x(1), x(0), 0.0, split) : where_greater(x(0), x(1), 0.0, split));
        add(args[1],
            max ? where_greater(x(0), x(1), 0.0, split) : where_greater(x(1), x(0), 0.0, split));
        break;
      }
      case Op::kNeg: add(args[0], -g); break;
      case Op::kAbs:  // g * sgn(a)
        add(args[0], g * where_greater(x(0), 0.0, 1.0, where_greater(0.0, x(0), -1.0, 0.0)));
        break;
      case Op::kExp: add(args[0], g * r); break;
      case Op::kLog: add(args[0], g / x(0)); break;
      case Op::kTanh: add(args[0], g * (1.0 - r * r)); break;
      case Op::kSigmoid: add(args[0], g * (1.0 - r) * r); break;
      case Op::kRelu:  // threshold_backward: r <= 0 ? 0 : g (NaN passes g, as libtorch)
        add(args[0], where_greater(0.0, r, 0.0, where_equal(r, 0.0, 0.0, g)));
        break;
      case Op::kSqrt: add(args[0], g / (2.0 * r)); break;
      case Op::kErf: add(args[0], 1.1283791670955126 * exp(-(x(0) * x(0))) * g); break;
      case Op::kSelectGt:
        add(args[2], where_greater(x(0), x(1), g, 0.0));
        add(args[3], where_greater(x(0), x(1), 0.0, g));
        break;
      case Op::kSelectEq:
        add(args[2], where_equal(x(0), x(1), g, 0.0));
        add(args[3], where_equal(x(0), x(1), 0.0, g));
        break;
      // A reduction's value is used at every position of its row: its gradient is the sum of
      // the row's adjoints, which every element of the argument then gets (sum_backward).
      case Op::kRowSum: add(args[0], row_sum(g)); break;
      case Op::kRowMax: {
        // amax_backward: (grad / count) * mask, the gradient split between the row's maxima;
        // a NaN row has no maximum equal to itself and gets NaN, as in libtorch.
        const Expr mask = where_equal(x(0), r, 1.0, 0.0);
        add(args[0], (row_sum(g) / row_sum(mask)) * mask);
        break;
      }
      case Op::kRowLength:
      case Op::kDetach: break;
      case Op::kFirstColumn: add(args[0], first_column(g)); break;
    }
  }
  std::vector<Expr> out;
  for (auto& gi : grads) out.push_back(gi ? *gi : Expr(0.0));
  return out;
}

Stats stats() {
  auto& l = loaded();
  std::lock_guard<std::mutex> lock(l.mu);
  return l.stats;
}

void forget_loaded_kernels() {
  auto& l = loaded();
  std::lock_guard<std::mutex> lock(l.mu);
  l.kernels.clear();
  l.failed.clear();
}

}  // namespace jit

std::ostream& operator<<(std::ostream& os, const FusedElementwiseOptions& o) {
  return os << "FusedElementwiseOptions(require_fused=" << (o.require_fused() ? "true" : "false")
            << ", use_disk_cache=" << (o.use_disk_cache() ? "true" : "false")
            << ", grain_size=" << o.grain_size() << ")";
}

FusedElementwise::FusedElementwise(std::string name, std::vector<jit::Expr> outputs,
                                   FusedElementwiseOptions options)
    : name_(std::move(name)), outputs_(std::move(outputs)), options_(options) {
  VOLT_CHECK(is_valid_name(name_), ValueError, "[FusedElementwise] name '", name_,
             "' is not 1-64 letters, digits or '_'; it names cache entries and log lines.");
  VOLT_CHECK(!outputs_.empty(), ValueError, "[FusedElementwise] '", name_,
             "' has no outputs; pass at least one expression.");
  VOLT_CHECK(options_.grain_size() >= 1, ConfigError,
             "[FusedElementwise] grain_size=", options_.grain_size(),
             " is below 1; use a positive number of elements.");
  for (const auto& out : outputs_) {
    VOLT_CHECK(out.node() != nullptr, ValueError, "[FusedElementwise] '", name_,
               "' has an empty output expression.");
  }
  outputs_ = merge_common(outputs_);
  const auto order = topo_order(outputs_);
  VOLT_CHECK(order.size() <= kMaxNodes, ValueError, "[FusedElementwise] '", name_, "' has ",
             order.size(), " distinct nodes, more than the ", kMaxNodes,
             " one generated loop takes; split it into several kernels.");
  for (const auto& n : order) {
    if (n->op == Op::kInput) num_inputs_ = std::max(num_inputs_, n->index + 1);
  }
  reads_.assign(static_cast<size_t>(num_inputs_), false);
  for (const auto& n : order) {
    if (n->op == Op::kInput) reads_[static_cast<size_t>(n->index)] = true;
  }
  by_rows_ = uses_row_ops(order);
  for (const auto& n : order) {
    if (is_reduction(n->op)) reductions_.emplace_back(n);
  }
}

std::vector<bool> FusedElementwise::row_outputs(const std::vector<at::Tensor>& inputs) const {
  std::vector<bool> out(outputs_.size(), false);
  if (!by_rows_) return out;
  // What follows depends only on which inputs are per row: computed once per pattern.
  std::string pattern(inputs.size(), '0');
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (detail::per_row_sizes(inputs[i].sizes())) pattern[i] = '1';
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = row_outputs_.find(pattern); it != row_outputs_.end()) return it->second;
  // Whether a value is the same along the row: reductions, constants, the row length, inputs
  // whose last size is 1 (or that have no dimensions), and what is computed from those only.
  std::unordered_map<const void*, bool> per_row;
  for (const auto& n : topo_order(outputs_)) {
    bool p = true;
    switch (n->op) {
      case Op::kInput: p = pattern[static_cast<size_t>(n->index)] == '1'; break;
      case Op::kRowSum:
      case Op::kRowMax: p = true; break;
      case Op::kFirstColumn: p = false; break;
      default:
        for (const auto& a : n->args) p = p && per_row.at(a.get());
    }
    per_row[n.get()] = p;
  }
  for (size_t o = 0; o < outputs_.size(); ++o) out[o] = per_row.at(outputs_[o].node().get());
  row_outputs_[pattern] = out;
  return out;
}

namespace {

// Each input's form for the loop ('F', 'S', 'R', 'C'), or in *why the first input it cannot
// read and why.
std::string input_forms(const std::vector<at::Tensor>& inputs, const std::vector<int64_t>& shape,
                        std::string* why) {
  std::string forms;
  why->clear();
  for (size_t i = 0; i < inputs.size() && why->empty(); ++i) {
    const at::Tensor& t = inputs[i];
    auto os = detail::c_stream<std::ostringstream>();
    os << "input " << i << " ";
    if (!t.device().is_cpu()) {
      os << "is on " << t.device() << " (the compiled loop is CPU-only)";
    } else if (t.scalar_type() != at::kFloat) {
      os << "is " << t.scalar_type() << " (the compiled loop is float32-only)";
    } else if (t.layout() != at::kStrided) {
      os << "is not a strided tensor";
    } else if (t.sizes().equals(shape)) {
      forms += 'F';
      continue;
    } else if (t.numel() == 1) {
      forms += 'S';
      continue;
    } else {
      bool row = !shape.empty() && t.dim() >= 1 && t.size(-1) == shape.back();
      for (int64_t d = 0; row && d + 1 < t.dim(); ++d) row = t.size(d) == 1;
      if (row) {
        forms += 'R';
        continue;
      }
      // A column: a last size of 1, before it leading 1s and then the output's sizes (so that
      // element (i / row length) % numel is the one to read).
      const int64_t n = static_cast<int64_t>(shape.size()), pad = n - t.dim();
      bool column = n >= 1 && t.dim() >= 1 && t.size(-1) == 1;
      bool leading = true;  // still in the leading 1s
      for (int64_t d = 0; column && d + 1 < n; ++d) {
        const int64_t size = d < pad ? 1 : t.size(d - pad);
        if (leading && size == 1 && shape[d] != 1) continue;
        leading = false;
        column = size == shape[d];
      }
      if (column) {
        forms += 'C';
        continue;
      }
      os << "of shape " << shape_str(t.sizes()) << " broadcasts to " << shape_str(shape)
         << " in a way the loop does not read (it takes full, one-element, row and column "
            "inputs)";
    }
    *why = os.str();
  }
  return forms;
}

// Why a kernel with row operations cannot run on `shape`, or "".
std::string row_problem(bool by_rows, const std::vector<int64_t>& shape) {
  if (by_rows && !shape.empty() && shape.back() == 0) {
    return "its rows are empty (the last size is 0), which the row loop does not reduce";
  }
  return "";
}

}  // namespace

std::string FusedElementwise::forms_of(const std::vector<at::Tensor>& inputs,
                                       std::string* why) const {
  return input_forms(inputs, checked_shape(name_, num_inputs_, inputs), why);
}

std::string FusedElementwise::fused_unavailable_reason(
    const std::vector<at::Tensor>& inputs) const {
  std::string why;
  const std::string forms = forms_of(inputs, &why);
  if (!why.empty()) return why;
  why = row_problem(by_rows_, checked_shape(name_, num_inputs_, inputs));
  if (!why.empty()) return why;
  if (detail::tracing()) return detail::kTracingReason;
  kernel_for(forms, &why);
  return why;
}

std::string FusedElementwise::source(const std::vector<at::Tensor>& inputs) const {
  std::string why;
  const std::string forms = forms_of(inputs, &why);
  VOLT_CHECK(why.empty(), NotAvailable, "[FusedElementwise] '", name_, "': ", why, ".");
  return generate_body(outputs_, forms, column_sums_);
}

FusedElementwise::KernelFn FusedElementwise::kernel_for(const std::string& forms,
                                                        std::string* failure,
                                                        int64_t* scratch_rows) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = kernels_.find(forms);
    if (it != kernels_.end()) {
      *failure = it->second.why;
      if (scratch_rows != nullptr) *scratch_rows = it->second.scratch_rows;
      return it->second.fn;
    }
  }
  const int64_t scratch =
      by_rows_ ? static_cast<int64_t>(plan_rows(outputs_, forms).stored.size()) : 0;
  if (scratch_rows != nullptr) *scratch_rows = scratch;
  // Remembered per instance, failures included, so each form is generated once.
  const auto remember = [&](KernelFn fn, std::string why) {
    if (fn == nullptr && why.empty()) why = "the kernel could not be built";
    std::lock_guard<std::mutex> own(mu_);
    kernels_[forms] = Built{fn, why, scratch};
    *failure = std::move(why);
    return fn;
  };
  const std::string body = generate_body(outputs_, forms, column_sums_);
  const std::string key = kernel_key(name_, forms, body);
  auto& l = loaded();
  std::lock_guard<std::mutex> lock(l.mu);
  const std::string entry = name_ + "-" + detail::stable_hash_hex(key) + ".so";

  KernelFn fn = nullptr;
  if (auto it = l.kernels.find(key); it != l.kernels.end()) {
    ++l.stats.memory_hits;
    fn = it->second;
  } else if (auto failed = l.failed.find(key); failed != l.failed.end()) {
    return remember(nullptr, failed->second);
  } else {
    std::string why;
    KernelCache* cache = options_.use_disk_cache() ? &KernelCache::global() : nullptr;
    if (cache != nullptr) {
      if (auto path = cache->find(entry)) {
        fn = open_kernel(*path, key, &why);
        if (fn != nullptr) {
          ++l.stats.disk_hits;
        } else {
          warn_once("jit-bad-entry:" + entry, kComponent,
                    "cache entry " + *path + " cannot be used (" + why +
                        "); it is removed and the kernel compiled again.");
          cache->remove(entry);
        }
      }
    }
    if (fn == nullptr) {
      const std::string source =
          "const char* volt_jit_key(void);\n"
          "__attribute__((visibility(\"default\")))\n"
          "const char* volt_jit_key(void) { return \"" +
          escape_c_string(key) + "\"; }\n" + body;
      std::string bytes;
      fn = compile_kernel(source, key, &bytes, &why);
      if (fn == nullptr) {
        l.failed[key] = why;  // operator() warns, with this reason, when it falls back
        return remember(nullptr, why);
      }
      ++l.stats.compiles;
      log_info(kComponent, "compiled '" + name_ + "' for input forms " + forms + " (" +
                               std::to_string(bytes.size()) + " bytes)");
      if (cache != nullptr) cache->store(entry, std::move(bytes));
    }
    l.kernels[key] = fn;
  }
  return remember(fn, "");
}

std::vector<at::Tensor> FusedElementwise::operator()(const std::vector<at::Tensor>& inputs) const {
  std::string why;
  const auto shape = checked_shape(name_, num_inputs_, inputs);
  const std::string forms = input_forms(inputs, shape, &why);
  if (why.empty()) why = row_problem(by_rows_, shape);
  if (why.empty() && detail::tracing()) why = detail::kTracingReason;
  std::vector<bool> needs_grad(inputs.size(), false);
  bool any_grad = false;
  if (c10::GradMode::is_enabled()) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      needs_grad[i] = inputs[i].requires_grad();
      any_grad = any_grad || needs_grad[i];
    }
  }
  // A forward that needs gradients runs the variant that also writes its reductions (a float
  // per row each) for the backward, which then does not make the passes computing them again.
  const auto with_reductions = any_grad && !reductions_.empty() ? with_stats() : nullptr;
  const FusedElementwise& runner = with_reductions ? *with_reductions : *this;
  int64_t scratch_rows = 0;
  KernelFn fn = why.empty() ? runner.kernel_for(forms, &why, &scratch_rows) : nullptr;
  if (fn == nullptr) {
    VOLT_CHECK(!options_.require_fused(), NotAvailable, "[FusedElementwise] '", name_,
               "' cannot run fused: ", why, "; fix that or drop require_fused.");
    {
      auto& l = loaded();
      std::lock_guard<std::mutex> lock(l.mu);
      ++l.stats.fallbacks;
    }
    if (!detail::tracing()) {  // under a trace the composition is the design, not a fallback
      // Keyed by the reason without its shapes ("[B, 1, D]"): inputs of changing shapes warn
      // once, not once per shape into a set that never shrinks.
      std::string kind;
      int depth = 0;
      for (char c : why) {
        depth += c == '[' ? 1 : 0;
        if (depth == 0) kind += c;
        depth -= (c == ']' && depth > 0) ? 1 : 0;
      }
      warn_once("jit-fallback:" + name_ + ":" + kind, kComponent,
                "'" + name_ + "' runs the libtorch composition: " + why);
    }
    return reference(inputs);
  }
  const std::vector<bool> row_out = row_outputs(inputs);
  std::vector<at::Tensor> out =
      runner.run_kernel(fn, forms, inputs, shape, runner.row_outputs(inputs), scratch_rows);
  if (!any_grad) return out;
  std::vector<at::Tensor> stats(out.begin() + static_cast<int64_t>(outputs_.size()), out.end());
  out.resize(outputs_.size());
  std::vector<size_t> grad_inputs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (needs_grad[i]) grad_inputs.push_back(i);
  }
  // A backward without create_graph (the usual one) reads the saved reductions and returns each
  // row input's gradient summed over the rows; with create_graph it recomputes the reductions
  // and returns full-shape gradients, summed by libtorch (differentiable in the inputs).
  std::vector<bool> summed_grads(inputs.size(), false);
  for (size_t i = 0; i < inputs.size(); ++i) summed_grads[i] = needs_grad[i] && forms[i] == 'R';
  const auto fast = backward_for(needs_grad, row_out, !stats.empty(), summed_grads, forms);
  const auto recompute = backward_for(needs_grad, row_out, false, {}, "");
  // The outputs it reads: its inputs after the forward's inputs, output gradients and stats.
  std::vector<bool> outputs_read(outputs_.size(), false);
  const size_t first_output = inputs.size() + outputs_.size() + stats.size();
  for (size_t o = 0; fast->kernel && o < outputs_.size(); ++o) {
    const auto& reads = fast->kernel->reads_;
    outputs_read[o] = first_output + o < reads.size() && reads[first_output + o];
  }
  std::shared_ptr<FusedElementwiseBackward> node(
      new FusedElementwiseBackward(name_, recompute->kernel, recompute->slots, fast->kernel,
                                   fast->slots, std::move(stats), grad_inputs, summed_grads, inputs,
                                   shape, row_out),
      torch::autograd::deleteNode);
  node->save_outputs(out, outputs_read);
  torch::autograd::edge_list edges;
  for (const auto& t : inputs) {
    auto e = torch::autograd::collect_next_edges(t);
    edges.push_back(e.empty() ? torch::autograd::Edge() : e[0]);
  }
  node->set_next_edges(std::move(edges));
  for (auto& o : out) torch::autograd::set_history(o, node);
  return out;
}

std::shared_ptr<const FusedElementwise> FusedElementwise::with_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!with_stats_) {
    std::vector<jit::Expr> all = outputs_;
    all.insert(all.end(), reductions_.begin(), reductions_.end());
    with_stats_ =
        std::make_shared<const FusedElementwise>(name_.substr(0, 61) + "_fw", all, options_);
  }
  return with_stats_;
}

std::shared_ptr<const FusedElementwise::Backward> FusedElementwise::backward_for(
    const std::vector<bool>& needs_grad, const std::vector<bool>& row_out, bool with_stats,
    const std::vector<bool>& summed_grads, const std::string& forms) const {
  VOLT_ASSERT(!with_stats || !forms.empty(), "the recomputing backward reads no stats");
  std::string key;
  for (bool b : needs_grad) key += b ? '1' : '0';
  key += '|';
  for (bool b : row_out) key += b ? '1' : '0';
  if (std::find(summed_grads.begin(), summed_grads.end(), true) != summed_grads.end()) {
    key += '|';
    for (bool b : summed_grads) key += b ? '1' : '0';
  }
  if (with_stats) key += "|stats";
  if (!forms.empty()) key += "|" + forms;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = backward_.find(key);
  if (it != backward_.end()) return it->second;
  const auto all = jit::gradients(outputs_, num_inputs_, row_out);
  std::vector<jit::Expr> wanted;
  std::vector<bool> sums;
  for (size_t i = 0; i < needs_grad.size(); ++i) {
    if (!needs_grad[i]) continue;
    wanted.push_back(all[i]);
    sums.push_back(summed(summed_grads, i));
  }
  bool reads_outputs = false;
  if (!forms.empty()) {
    // The forward's reductions become inputs after the output gradients, its outputs inputs
    // after those.
    std::unordered_map<const void*, jit::Expr> saved;
    const auto first_grad = num_inputs_;
    const auto first_stat = first_grad + static_cast<int64_t>(outputs_.size());
    const auto first_output =
        first_stat + (with_stats ? static_cast<int64_t>(reductions_.size()) : 0);
    if (with_stats) {
      for (size_t k = 0; k < reductions_.size(); ++k) {
        saved.emplace(reductions_[k].node().get(),
                      jit::input(first_stat + static_cast<int64_t>(k)));
      }
    }
    const std::vector<jit::Expr> stats_only = substitute(wanted, saved);
    // Where the derivatives use an output's value (r in gradients()), it is read. An output
    // a / s whose s reads only reductions and constants gives a back as output * s, so the
    // values a is computed from (a softmax's exps) need not be computed again.
    for (size_t o = 0; o < outputs_.size(); ++o) {
      const jit::Expr out = jit::input(first_output + static_cast<int64_t>(o));
      const auto& n = outputs_[o].node();
      if (n->op == Op::kInput || n->op == Op::kConstant) continue;  // a copy: read the input
      saved.emplace(n.get(), out);
      if (n->op != Op::kDiv || !with_stats) continue;
      const auto& a = n->args[0];
      if (a->op == Op::kInput || a->op == Op::kConstant || saved.count(a.get()) != 0) continue;
      const jit::Expr s = substitute({jit::Expr(n->args[1])}, saved)[0];
      bool per_row = true;  // s reads stats and constants only
      for (const auto& m : topo_order({s})) {
        if (m->op == Op::kInput) {
          per_row = per_row && m->index >= first_stat && m->index < first_output;
        } else if (m->op != Op::kRowLength && is_row_op(m->op)) {
          per_row = false;
        }
      }
      if (per_row) saved.emplace(a.get(), out * s);
    }
    std::vector<jit::Expr> with_outputs = substitute(wanted, saved);
    // Read the outputs only if that reads no more full-size tensors than the inputs would
    // (an output read beside the inputs it is computed from is one more stream of memory).
    // How many full-size tensors `exprs` read, and whether any of them is an output.
    const auto full_reads = [&](const std::vector<jit::Expr>& exprs) {
      int64_t count = 0;
      bool any_output = false;
      std::vector<bool> seen(static_cast<size_t>(first_output) + outputs_.size(), false);
      for (const auto& m : topo_order(exprs)) {
        if (m->op != Op::kInput || seen[static_cast<size_t>(m->index)]) continue;
        seen[static_cast<size_t>(m->index)] = true;
        const int64_t i = m->index;
        if (i < num_inputs_) count += forms[static_cast<size_t>(i)] == 'F' ? 1 : 0;
        if (i < first_output) continue;
        any_output = true;
        count += row_out[static_cast<size_t>(i - first_output)] ? 0 : 1;
      }
      return std::make_pair(count, any_output);
    };
    const auto [count, any_output] = full_reads(with_outputs);
    reads_outputs = any_output && count <= full_reads(stats_only).first;
    wanted = reads_outputs ? std::move(with_outputs) : stats_only;
  }
  // One kernel output per distinct gradient (equal expressions are one node after
  // merge_common), none for an output gradient passed through unchanged (not summed: a summed
  // one is a reduction the kernel makes).
  wanted = merge_common(wanted);
  auto bwd = std::make_shared<Backward>();
  std::vector<jit::Expr> distinct;
  std::vector<bool> distinct_sums;
  for (size_t k = 0; k < wanted.size(); ++k) {
    const auto& n = wanted[k].node();
    const int64_t grad_index = n->index - num_inputs_;
    if (n->op == Op::kInput && !sums[k] && grad_index >= 0 &&
        grad_index < static_cast<int64_t>(outputs_.size())) {
      bwd->slots.push_back(-1 - n->index);
      continue;
    }
    int64_t slot = -1;
    for (size_t j = 0; j < distinct.size() && slot < 0; ++j) {
      if (distinct[j].node() == n && distinct_sums[j] == sums[k]) slot = static_cast<int64_t>(j);
    }
    if (slot < 0) {
      slot = static_cast<int64_t>(distinct.size());
      distinct.push_back(wanted[k]);
      distinct_sums.push_back(sums[k]);
    }
    bwd->slots.push_back(slot);
  }
  if (!distinct.empty()) {
    const bool any_sum =
        std::find(distinct_sums.begin(), distinct_sums.end(), true) != distinct_sums.end();
    auto kernel =
        std::make_shared<FusedElementwise>(name_.substr(0, 57) + (with_stats ? "_bwds" : "_bwd") +
                                               (reads_outputs ? "o" : "") + (any_sum ? "c" : ""),
                                           std::move(distinct), options_);
    if (any_sum) kernel->column_sums_ = std::move(distinct_sums);
    bwd->kernel = std::move(kernel);
  }
  backward_[key] = bwd;
  return bwd;
}

std::vector<at::Tensor> FusedElementwise::run_kernel(KernelFn fn, const std::string& forms,
                                                     const std::vector<at::Tensor>& inputs,
                                                     const std::vector<int64_t>& shape,
                                                     const std::vector<bool>& row_out,
                                                     int64_t scratch_rows) const {
  c10::AutoGradMode no_grad(false);  // raw loops: nothing here is recorded
  std::vector<at::Tensor> in(inputs.size());
  std::vector<const float*> in_ptr(inputs.size());
  std::vector<int64_t> in_numel(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    in[i] = inputs[i].contiguous();
    in_ptr[i] = in[i].data_ptr<float>();
    in_numel[i] = in[i].numel();
  }
  const int64_t numel = c10::multiply_integers(shape);
  const bool by_row = by_rows_ || loops_by_row(forms);
  const int64_t cols = !by_row ? numel : shape.empty() ? 1 : shape.back();
  // Summed outputs the kernel accumulates (one row of doubles per thread each, added up
  // below), and those summed here from what it wrote (per-row values; no row input).
  std::vector<size_t> summed_in_kernel;
  std::vector<bool> summed_after(outputs_.size(), false);
  for (size_t o = 0; o < outputs_.size(); ++o) {
    if (!summed(column_sums_, o)) continue;
    if (by_row && !row_out[o]) {
      summed_in_kernel.push_back(o);
    } else {
      summed_after[o] = true;
    }
  }
  std::vector<at::Tensor> out(outputs_.size());
  std::vector<float*> out_ptr(outputs_.size(), nullptr);
  for (size_t o = 0; o < outputs_.size(); ++o) {
    if (std::find(summed_in_kernel.begin(), summed_in_kernel.end(), o) != summed_in_kernel.end()) {
      continue;
    }
    out[o] =
        at::empty(row_out[o] ? detail::row_shape(shape) : shape, at::TensorOptions(at::kFloat));
    out_ptr[o] = out[o].data_ptr<float>();
  }
  const int64_t sums = static_cast<int64_t>(summed_in_kernel.size());
  const at::Tensor acc =
      sums == 0 ? at::Tensor()
                : at::zeros({at::get_num_threads(), sums, cols}, at::TensorOptions(at::kDouble));
  // This thread's output pointers: its accumulator rows in place of the summed outputs.
  const auto pointers = [&]() {
    std::vector<float*> ptrs = out_ptr;
    for (int64_t k = 0; k < sums; ++k) {
      ptrs[summed_in_kernel[static_cast<size_t>(k)]] = reinterpret_cast<float*>(
          acc.data_ptr<double>() + (at::get_thread_num() * sums + k) * cols);
    }
    return ptrs;
  };
  if (numel > 0 && by_rows_) {
    // Whole rows per chunk: the kernel reduces each row it gets. Its scratch rows follow the
    // outputs, one set per thread.
    const at::Tensor scratch =
        scratch_rows == 0
            ? at::Tensor()
            : at::empty({at::get_num_threads(), scratch_rows, cols}, at::TensorOptions(at::kFloat));
    at::parallel_for(0, numel / cols, std::max<int64_t>(1, options_.grain_size() / cols),
                     [&](int64_t begin, int64_t end) {
                       std::vector<float*> ptrs = pointers();
                       for (int64_t k = 0; k < scratch_rows; ++k) {
                         ptrs.push_back(scratch.data_ptr<float>() +
                                        (at::get_thread_num() * scratch_rows + k) * cols);
                       }
                       fn(in_ptr.data(), ptrs.data(), begin * cols, end * cols, cols,
                          in_numel.data());
                     });
  } else if (numel > 0) {
    at::parallel_for(0, numel, options_.grain_size(), [&](int64_t begin, int64_t end) {
      std::vector<float*> ptrs = pointers();
      fn(in_ptr.data(), ptrs.data(), begin, end, cols, in_numel.data());
    });
  }
  for (int64_t k = 0; k < sums; ++k) {
    out[summed_in_kernel[static_cast<size_t>(k)]] = acc.select(1, k).sum(0).to(at::kFloat);
  }
  for (size_t o = 0; o < outputs_.size(); ++o) {
    if (summed_after[o]) out[o] = sum_over_rows(out[o], shape);
  }
  return out;
}

std::vector<at::Tensor> FusedElementwise::reference(const std::vector<at::Tensor>& inputs) const {
  const auto shape = checked_shape(name_, num_inputs_, inputs);
  std::unordered_map<const void*, at::Tensor> memo;
  for (const auto& n : topo_order(outputs_)) evaluate(n.get(), inputs, shape, &memo);
  const std::vector<bool> row_out = row_outputs(inputs);
  std::vector<at::Tensor> out;
  for (size_t k = 0; k < outputs_.size(); ++k) {
    const auto& o = outputs_[k];
    at::Tensor r = memo.at(o.node().get());
    // An output that does not depend on every input is broadcast to the common shape (its
    // row shape when it is per row), as the fused loop writes it; contiguous so that both
    // paths return the same layout.
    if (summed(column_sums_, k)) {
      out.push_back(sum_over_rows(r, shape));
      continue;
    }
    const std::vector<int64_t> want = row_out[k] ? detail::row_shape(shape) : shape;
    if (!r.sizes().equals(want)) r = r.expand(want);
    const auto op = o.node()->op;
    // An input or constant passed straight through is copied: outputs never alias inputs.
    out.push_back(op == Op::kInput || op == Op::kConstant ? r.clone(at::MemoryFormat::Contiguous)
                                                          : r.contiguous());
  }
  return out;
}

}  // namespace volt
