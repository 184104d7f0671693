#include "volt/distributed/tensor_parallel.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ExpandUtils.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <fnmatch.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "core/detail/ascii.h"
#include "core/detail/mix64.h"
#include "core/detail/print.h"
#include "distributed/detail/intercept.h"
#include "distributed/detail/split_parameters.h"
#include "kernels/detail/clip_coefficient.h"
#include "volt/core/check.h"
#include "volt/distributed/process_group.h"

namespace volt {
namespace {

constexpr const char* kTag = "[TensorParallel]";

// ----------------------------------------------------------------------------- plan resolution

// A pattern names a module by its whole path or by any trailing part after a '.', so "fc1_*"
// finds "net.fc1_0" whatever the root is (Trainer runs pass the volt::Module, users think of
// the network).
bool path_matches(const std::string& pattern, const std::string& path) {
  if (fnmatch(pattern.c_str(), path.c_str(), 0) == 0) return true;
  for (size_t i = path.find('.'); i != std::string::npos; i = path.find('.', i + 1)) {
    if (fnmatch(pattern.c_str(), path.c_str() + i + 1, 0) == 0) return true;
  }
  return false;
}

// Module::name() is the demangled class name, namespaces included; a policy names the class.
bool type_matches(const std::string& key, const torch::nn::Module& m) {
  const std::string& n = m.name();
  if (n == key) return true;
  return n.size() > key.size() + 2 && n.compare(n.size() - key.size(), key.size(), key) == 0 &&
         n.compare(n.size() - key.size() - 2, 2, "::") == 0;
}

bool packed_qkv_name(const std::string& path) {
  const std::string leaf =
      path.substr(path.rfind('.') == std::string::npos ? 0 : path.rfind('.') + 1);
  for (const char* k : {"qkv", "query_key_value", "c_attn"}) {
    if (leaf.find(k) != std::string::npos) return true;
  }
  return false;
}

std::string join_path(const std::string& a, const std::string& b) {
  return a.empty() ? b : b.empty() ? a : a + "." + b;
}

struct Found {
  std::string kind;  // "Linear", "Embedding" or the module's type
  torch::nn::Module* module;
};

std::string kind_of(torch::nn::Module& m) {
  if (dynamic_cast<torch::nn::LinearImpl*>(&m) != nullptr) return "Linear";
  if (dynamic_cast<torch::nn::EmbeddingImpl*>(&m) != nullptr) return "Embedding";
  return m.name();
}

void check_divides(const TpLayer& layer, torch::nn::Module& m, const TensorParallelOptions& o) {
  const int64_t tp = o.tp_size();
  if (layer.kind == "Embedding") {
    const auto& e = dynamic_cast<torch::nn::EmbeddingImpl&>(m);
    const int64_t rows = e.weight.size(0);
    VOLT_CHECK(rows % tp == 0, ConfigError, kTag, " embedding '", layer.path, "' has ", rows,
               " rows, not divisible by tp_size=", tp, "; use a tp_size dividing ", rows,
               " or keep it replicated.");
    // libtorch renormalises the rows an id names before the lookup, on the weight it is given:
    // a rank's shard, with ids of the whole vocabulary.
    VOLT_CHECK(!e.options.max_norm().has_value(), ConfigError, kTag, " embedding '", layer.path,
               "' has max_norm, which renormalises rows by id before the lookup and cannot run "
               "on a vocabulary split; build it without max_norm, or keep it replicated.");
    return;
  }
  const auto& w = dynamic_cast<torch::nn::LinearImpl&>(m).weight;
  const int64_t n_out = w.size(0), n_in = w.size(1);
  switch (layer.style) {
    case TpStyle::kColwise:
      VOLT_CHECK(n_out % tp == 0, ConfigError, kTag, " column-parallel '", layer.path, "' has ",
                 n_out, " output features, not divisible by tp_size=", tp,
                 "; use a tp_size dividing ", n_out, ".");
      break;
    case TpStyle::kColwiseQkv:
      VOLT_CHECK(n_out % 3 == 0 && (n_out / 3) % tp == 0, ConfigError, kTag, " packed q/k/v '",
                 layer.path, "' has ", n_out, " output features: each third (", n_out / 3,
                 ") must be divisible by tp_size=", tp, "; use a tp_size dividing ", n_out / 3,
                 ", or style colwise if it is not a packed projection.");
      VOLT_CHECK(o.num_heads() == 0 || o.num_heads() % tp == 0, ConfigError, kTag, " ",
                 o.num_heads(), " attention heads are not divisible by tp_size=", tp,
                 " (each rank computes whole heads); use a tp_size dividing ", o.num_heads(), ".");
      break;
    case TpStyle::kRowwise:
      VOLT_CHECK(n_in % tp == 0, ConfigError, kTag, " row-parallel '", layer.path, "' has ", n_in,
                 " input features, not divisible by tp_size=", tp, "; use a tp_size dividing ",
                 n_in, ".");
      break;
    case TpStyle::kReplicated: break;
  }
}

}  // namespace

TpStyle parse_tp_style(const std::string& name) {
  if (name == "colwise") return TpStyle::kColwise;
  if (name == "colwise_qkv") return TpStyle::kColwiseQkv;
  if (name == "rowwise") return TpStyle::kRowwise;
  if (name == "replicated") return TpStyle::kReplicated;
  VOLT_CHECK(false, ConfigError, kTag, " unknown tensor-parallel style \"", name,
             "\"; use colwise, colwise_qkv, rowwise or replicated.");
  return TpStyle::kReplicated;
}

std::string to_string(TpStyle style) {
  switch (style) {
    case TpStyle::kColwise: return "colwise";
    case TpStyle::kColwiseQkv: return "colwise_qkv";
    case TpStyle::kRowwise: return "rowwise";
    case TpStyle::kReplicated: return "replicated";
  }
  return "?";
}

namespace {
std::string trim(const std::string& s) {
  return std::string(detail::ascii_trim(s));
}
}  // namespace

TpPlan parse_tp_plan(const std::vector<std::string>& entries) {
  TpPlan plan;
  for (const std::string& e : entries) {
    const size_t eq = e.find('=');
    VOLT_CHECK(eq != std::string::npos && !trim(e.substr(0, eq)).empty(), ConfigError, kTag,
               " plan entry \"", e, "\" is not \"pattern=style\"; e.g. \"fc1_*=colwise\".");
    plan.emplace_back(trim(e.substr(0, eq)), parse_tp_style(trim(e.substr(eq + 1))));
  }
  return plan;
}

TpInjectionPolicy parse_injection_policy(const std::vector<std::string>& entries) {
  TpInjectionPolicy policy;
  for (const std::string& e : entries) {
    const size_t colon = e.find(':');
    VOLT_CHECK(colon != std::string::npos && !trim(e.substr(0, colon)).empty(), ConfigError, kTag,
               " injection_policy entry \"", e,
               "\" is not \"Module: member, member\"; e.g. \"Block: attn.o, mlp.fc2\".");
    std::vector<std::string> members;
    std::string rest = e.substr(colon + 1);
    for (size_t a = 0; a <= rest.size();) {
      size_t b = rest.find(',', a);
      if (b == std::string::npos) b = rest.size();
      const std::string m = trim(rest.substr(a, b - a));
      if (!m.empty()) members.push_back(m);
      a = b + 1;
    }
    VOLT_CHECK(!members.empty(), ConfigError, kTag, " injection_policy entry \"", e,
               "\" names no member; list the Linears whose outputs are summed.");
    policy.emplace_back(trim(e.substr(0, colon)), members);
  }
  return policy;
}

std::vector<TpLayer> resolve_tensor_parallel_plan(torch::nn::Module& root,
                                                  const TensorParallelOptions& o) {
  VOLT_CHECK(o.tp_size() >= 1, ConfigError, kTag, " tp_size=", o.tp_size(), " must be at least 1.");
  VOLT_CHECK(o.num_heads() >= 0, ConfigError, kTag, " num_heads=", o.num_heads(),
             " must be >= 0 (0: unknown).");
  // The root itself by reference: named_modules(include_self) needs it in a shared_ptr.
  std::vector<std::pair<std::string, torch::nn::Module*>> modules{{"", &root}};
  for (const auto& item : root.named_modules("", /*include_self=*/false)) {
    modules.emplace_back(item.key(), item.value().get());
  }
  std::map<std::string, TpLayer> chosen;  // by path
  std::set<std::string> packed_by_name;   // the policy's packed q/k/v guesses
  std::map<std::string, torch::nn::Module*> by_path;
  for (auto& m : modules) by_path[m.first] = m.second;

  for (const auto& entry : o.injection_policy()) {
    const std::string& key = entry.first;
    bool any = false;
    for (auto& m : modules) {
      if (!type_matches(key, *m.second) && !(m.first.size() && path_matches(key, m.first)))
        continue;
      any = true;
      std::vector<bool> row_used(entry.second.size(), false);
      for (const auto& sub : m.second->named_modules("", /*include_self=*/false)) {
        if (kind_of(*sub.value()) != "Linear") continue;
        TpStyle style = packed_qkv_name(sub.key()) ? TpStyle::kColwiseQkv : TpStyle::kColwise;
        for (size_t r = 0; r < entry.second.size(); ++r) {
          if (path_matches(entry.second[r], sub.key())) {
            style = TpStyle::kRowwise;
            row_used[r] = true;
          }
        }
        const std::string path = join_path(m.first, sub.key());
        if (style == TpStyle::kColwiseQkv) packed_by_name.insert(path);
        chosen[path] = TpLayer{path, "Linear", style};
      }
      for (size_t r = 0; r < entry.second.size(); ++r) {
        VOLT_CHECK(row_used[r], ConfigError, kTag, " injection_policy[\"", key, "\"] names '",
                   entry.second[r], "', which is no Linear inside '",
                   m.first.empty() ? m.second->name() : m.first,
                   "'; list the member Linears whose outputs are summed (e.g. the attention "
                   "output and the second MLP layer).");
      }
    }
    VOLT_CHECK(any, ConfigError, kTag, " injection_policy key \"", key,
               "\" matches no module type or path in ", root.name(),
               "; use a module class name (e.g. Block) or a path pattern (e.g. blocks.*).");
  }
  for (const auto& entry : o.plan()) {
    bool any = false;
    for (auto& m : modules) {
      if (m.first.empty() || !path_matches(entry.first, m.first)) continue;
      any = true;
      const std::string kind = kind_of(*m.second);
      VOLT_CHECK(
          kind == "Linear" || (kind == "Embedding" && (entry.second == TpStyle::kRowwise ||
                                                       entry.second == TpStyle::kReplicated)),
          ConfigError, kTag, " plan entry \"", entry.first, "\" matches '", m.first, "', a ", kind,
          "; volt splits Linear layers (any style) and Embedding layers "
          "(rowwise: vocabulary rows). Narrow the pattern.");
      chosen[m.first] = TpLayer{m.first, kind, entry.second};
      packed_by_name.erase(m.first);  // the plan says what it is
    }
    VOLT_CHECK(any, ConfigError, kTag, " plan entry \"", entry.first, "\" matches no module of ",
               root.name(), "; patterns are module paths such as net.fc1 or blocks.*.fc1.");
  }
  // A packed q/k/v projection guessed by its name: q, k and v each as wide as the input.
  // Grouped-query attention's narrower k and v would be cut across their boundaries.
  for (const std::string& path : packed_by_name) {
    const auto& w = dynamic_cast<torch::nn::LinearImpl&>(*by_path.at(path)).weight;
    VOLT_CHECK(w.size(0) == 3 * w.size(1), ConfigError, kTag, " '", path,
               "' is taken for a packed q/k/v projection by its name but has ", w.size(0),
               " outputs for ", w.size(1),
               " inputs, not three parts as wide as the input (grouped-query attention?). Keep "
               "it whole with a plan entry \"",
               path, "=replicated\", or, if it is packed q/k/v of equal widths, say so with \"",
               path, "=colwise_qkv\".");
  }
  std::vector<TpLayer> out;
  for (auto& kv : chosen) {
    if (kv.second.style == TpStyle::kReplicated) continue;
    if (o.tp_size() > 1) check_divides(kv.second, *by_path.at(kv.first), o);
    out.push_back(kv.second);
  }
  // A split tensor belongs to one layer: a weight tied to another layer (an embedding and the
  // output projection) or a module registered at two paths would be split once per path, or
  // read whole where the other layer expects it whole.
  std::unordered_map<const c10::TensorImpl*, std::string> split_tensors;  // -> its name
  for (const TpLayer& layer : out) {
    for (const auto& p : by_path.at(layer.path)->named_parameters(/*recurse=*/false)) {
      if (p.key() == "weight" || (p.key() == "bias" && layer.style != TpStyle::kRowwise)) {
        split_tensors.emplace(p.value().unsafeGetTensorImpl(), join_path(layer.path, p.key()));
      }
    }
  }
  for (const auto& p : root.named_parameters(/*recurse=*/true)) {
    const auto it = split_tensors.find(p.value().unsafeGetTensorImpl());
    VOLT_CHECK(it == split_tensors.end() || it->second == p.key(), ConfigError, kTag, " '", p.key(),
               "' is the same tensor as '", it->second,
               "', which the plan splits (a tied weight, or one module at two paths); a split "
               "tensor must belong to one layer: keep both unsplit (replicated), or untie them.");
  }
  // partial_grads names whole parameters, at least one each.
  for (const std::string& pattern : o.partial_grads()) {
    bool any = false;
    for (const auto& p : root.named_parameters(/*recurse=*/true)) {
      if (!path_matches(pattern, p.key())) continue;
      any = true;
      VOLT_CHECK(split_tensors.count(p.value().unsafeGetTensorImpl()) == 0, ConfigError, kTag,
                 " partial_grads entry \"", pattern, "\" matches '", p.key(),
                 "', which the plan splits; partial_grads lists whole parameters used on split "
                 "activations: narrow the pattern.");
    }
    VOLT_CHECK(any, ConfigError, kTag, " partial_grads entry \"", pattern,
               "\" matches no parameter of ", root.name(),
               "; patterns are parameter names such as attn.q_norm.weight or blocks.*.scale.");
  }
  return out;
}

// -------------------------------------------------------------------------------- the engine

struct TensorParallelEngine::Shard {
  at::Tensor param;                 // the module's own tensor, resharded in place
  std::vector<int64_t> full_sizes;  // its shape whole
  int64_t dim = 0;                  // split dimension
  bool packed = false;              // [q; k; v] along dim 0, each third split
  // A split Embedding with a padding row: its option, cleared while split (libtorch checks it
  // against the shard's rows before the lookup) and put back by restore().
  torch::nn::EmbeddingImpl* embedding = nullptr;
  c10::optional<int64_t> padding_idx;
};

namespace {

// What the interceptor needs for one row-parallel weight.
struct RowWeight {
  const c10::StorageImpl* storage;  // the weight's (this entry's key)
  ProcessGroup* group;
  int64_t full;   // Linear: input features whole; Embedding: vocabulary rows whole
  int64_t shard;  // this rank's part
  int64_t offset;
  int64_t padding_idx = -1;  // Embedding: the padding row in the whole vocabulary (-1: none)
};

// By storage, so views of the weight (libtorch 1.13's C++ Linear computes addmm(b, x, W.t()) or
// matmul(x, W.t()), not aten::linear) are recognised too.
detail::StorageMap<RowWeight>& rows() {
  static auto* m = new detail::StorageMap<RowWeight>();
  return *m;
}

void register_row(const at::Tensor& weight, RowWeight info) {
  rows().set(detail::storage_of(weight), info);
}

// A column-parallel weight: its layer's input gets Megatron's "f" (identity forward, gradient
// summed over the group in backward) when autograd records.
struct ColWeight {
  const c10::StorageImpl* storage;
  ProcessGroup* group;
};

detail::StorageMap<ColWeight>& cols() {
  static auto* m = new detail::StorageMap<ColWeight>();
  return *m;
}

void register_col(const at::Tensor& weight, ProcessGroup* group) {
  cols().set(detail::storage_of(weight), ColWeight{detail::storage_of(weight), group});
}

// The live engines, for engine_splitting.
struct Engines {
  std::mutex mu;
  std::vector<const TensorParallelEngine*> live;
};

Engines& engines() {
  static auto* e = new Engines();
  return *e;
}

void unregister_weight(const at::Tensor& weight) {
  const c10::StorageImpl* s = detail::storage_of(weight);
  rows().erase_if([&](const RowWeight& r) { return r.storage == s; });
  cols().erase_if([&](const ColWeight& c) { return c.storage == s; });
}

// The ops a Linear's forward reaches its weight through (2.x: linear; 1.13's C++ functional:
// addmm with a bias on 2-D inputs, else matmul), with the weight's argument position.
enum class RowOp { kLinear, kAddmm, kMatmul, kMm, kEmbedding };
struct RowOpInfo {
  c10::OperatorName name;
  RowOp op;
  size_t nargs;
  size_t weight;  // argument index of the (possibly transposed) weight
};
const std::vector<RowOpInfo>& row_ops() {
  static const std::vector<RowOpInfo> ops = {
      {c10::OperatorName("aten::linear", ""), RowOp::kLinear, 3, 1},
      {c10::OperatorName("aten::addmm", ""), RowOp::kAddmm, 5, 2},
      {c10::OperatorName("aten::matmul", ""), RowOp::kMatmul, 2, 1},
      {c10::OperatorName("aten::mm", ""), RowOp::kMm, 2, 1},
      {c10::OperatorName("aten::embedding", ""), RowOp::kEmbedding, 5, 0}};
  return ops;
}

// The sum of the partial products (ProcessGroup reduces bf16 / fp16 in fp32).
at::Tensor sum_across(ProcessGroup& group, const at::Tensor& t) {
  return group.all_reduce(t);
}

// A row-parallel layer's input is either the split output of a column-parallel layer, or whole
// (then each rank takes its slice).
at::Tensor input_slice(at::Tensor x, const RowWeight& info) {
  if (x.size(-1) == info.full && info.full != info.shard) x = x.narrow(-1, info.offset, info.shard);
  VOLT_CHECK(x.size(-1) == info.shard, ValueError, kTag, " a row-parallel Linear expects ",
             info.shard, " (split) or ", info.full, " (whole) input features, got ", x.sizes(),
             "; the layer before it must be column-parallel or unsplit.");
  return x;
}

// The forward of one row-parallel op (the one place for it, with or without autograd):
// y = beta * extra + alpha * sum_r(x_r w_r) (addmm), y = sum_r(x_r W_r^T) + extra (linear, extra
// the bias or empty), y = sum_r(x_r w_r) (matmul, mm). `product_dtype` gets the dtype the
// products ran in. The caller excludes the intercept key.
at::Tensor row_forward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& extra, RowOp op,
                       const RowWeight& info, const c10::Scalar& beta, const c10::Scalar& alpha,
                       at::ScalarType* product_dtype = nullptr) {
  const at::Tensor xs = input_slice(x, info);
  // addmm's product as matmul, not mm: under bf16-mixed on CPU autocast's GEMM size rule (small
  // GEMMs stay fp32 where bf16 is slower) covers linear, addmm and matmul, as for the op whole;
  // mm would always run in bf16.
  const at::Tensor product = op == RowOp::kLinear ? at::linear(xs, w)
                             : op == RowOp::kMm   ? at::mm(xs, w)
                                                  : at::matmul(xs, w);
  if (product_dtype != nullptr) *product_dtype = product.scalar_type();
  const at::Tensor summed = sum_across(*info.group, product);
  // The bias (addmm's self) in the products' dtype, as autocast casts it for the op whole: a
  // bf16 product gives a bf16 output, not an fp32 one promoted by an fp32 bias.
  const at::Tensor e =
      extra.defined() && extra.numel() > 0 && extra.scalar_type() != summed.scalar_type()
          ? extra.to(summed.scalar_type())
          : extra;
  if (op == RowOp::kLinear && e.defined() && e.numel() > 0) return summed + e;
  if (op == RowOp::kAddmm) return at::add(e.mul(beta), summed, alpha);
  return summed;
}

// A vocabulary-split embedding's lookup: ids outside this rank's rows read row 0 and are
// masked out before the sum. `mine` gets the mask of this rank's ids, `local` their rows.
at::Tensor embedding_forward(const at::Tensor& weight, const at::Tensor& idx, const RowWeight& info,
                             at::Tensor* mine_out = nullptr, at::Tensor* local_out = nullptr) {
  // An id outside the whole vocabulary is no rank's: every rank masked it to zeros, where the
  // unsplit lookup fails ("index out of range"). Every rank of the group looks up the same ids,
  // so all fail here together. Checked on the host for CPU ids only (a read of two values); on
  // an accelerator it would be a synchronisation per lookup.
  if (idx.device().is_cpu() && idx.numel() > 0) {
    const auto [lo, hi] = at::aminmax(idx);
    const int64_t low = lo.item<int64_t>(), high = hi.item<int64_t>();
    VOLT_CHECK(low >= 0 && high < info.full, ValueError, kTag, " an embedding id (",
               low < 0 ? low : high, ") is outside the vocabulary of ", info.full,
               " rows, split over the tensor-parallel group; give ids in [0, ", info.full,
               ") (mask padding with the embedding's padding_idx, not a negative id).");
  }
  const at::Tensor mine = idx.ge(info.offset).logical_and(idx.lt(info.offset + info.shard));
  const at::Tensor local = (idx - info.offset).masked_fill(mine.logical_not(), 0);
  const at::Tensor out = at::embedding(weight, local);
  if (mine_out != nullptr) *mine_out = mine;
  if (local_out != nullptr) *local_out = local;
  return sum_across(*info.group, out * mine.unsqueeze(-1).to(out.scalar_type()));
}

// ------------------------------------------------------------------- autograd for training
// Megatron-LM's two conjugate operators, expressed as autograd Functions so that training
// through a split model gives one process's gradients: "f" in front of a column-parallel layer
// (identity forward, the input gradient summed over the group: every rank's slice of the output
// contributes to it) and "g" inside a row-parallel layer (the partial products summed forward,
// the gradient passed through: every rank's part feeds the same sum). The Functions' bodies run
// with the intercept key excluded, so the ops they call are plain ones.

ProcessGroup* group_of(const torch::autograd::AutogradContext* ctx) {
  return reinterpret_cast<ProcessGroup*>(ctx->saved_data.at("group").toInt());
}

c10::IValue group_value(ProcessGroup* group) {
  return c10::IValue(static_cast<int64_t>(reinterpret_cast<intptr_t>(group)));
}

struct CopyToGroup : torch::autograd::Function<CopyToGroup> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            ProcessGroup* group) {
    ctx->saved_data["group"] = group_value(group);
    return x.alias();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    c10::impl::ExcludeDispatchKeyGuard no_intercept(detail::kInterceptKey);
    return {sum_across(*group_of(ctx), grads[0].contiguous()), at::Tensor()};
  }
};

// One row-parallel op whose partial products are summed: y = beta * self + alpha * sum_r(x_r w_r)
// (addmm), y = sum_r(x_r W_r^T) + bias (linear), y = sum_r(x_r w_r) (matmul, mm). `w` is the
// argument as the op got it (for addmm / matmul / mm a transposed view of the weight, so its
// gradient reaches the weight through that view). `x` is whole or this rank's slice.
struct RowParallel : torch::autograd::Function<RowParallel> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& w, const at::Tensor& extra, RowOp op,
                            const RowWeight& info, const c10::Scalar& beta,
                            const c10::Scalar& alpha) {
    c10::impl::ExcludeDispatchKeyGuard no_intercept(detail::kInterceptKey);
    at::ScalarType dtype = at::kFloat;
    at::Tensor out = row_forward(x, w, extra, op, info, beta, alpha, &dtype);
    ctx->save_for_backward({x, w, extra});
    // The dtype the products ran in (bf16 under autocast, which the interceptor runs above and
    // autograd never sees): backward computes in it too and returns each input's own dtype.
    ctx->saved_data["dtype"] = static_cast<int64_t>(dtype);
    ctx->saved_data["group"] = group_value(info.group);
    ctx->saved_data["op"] = static_cast<int64_t>(op);
    ctx->saved_data["full"] = info.full;
    ctx->saved_data["shard"] = info.shard;
    ctx->saved_data["offset"] = info.offset;
    ctx->saved_data["beta"] = beta;
    ctx->saved_data["alpha"] = alpha;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    c10::impl::ExcludeDispatchKeyGuard no_intercept(detail::kInterceptKey);
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &extra = saved[2];
    const auto op = static_cast<RowOp>(ctx->saved_data.at("op").toInt());
    const RowWeight info{nullptr, group_of(ctx), ctx->saved_data.at("full").toInt(),
                         ctx->saved_data.at("shard").toInt(), ctx->saved_data.at("offset").toInt()};
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data.at("dtype").toInt());
    const at::Tensor g = grads[0].to(dtype), w = saved[1].to(dtype);
    at::Tensor grad_x, grad_w, grad_extra;
    // The gradient of the summed part (identity through the sum: g's backward).
    const at::Tensor gp = op == RowOp::kAddmm ? g * ctx->saved_data.at("alpha").toScalar() : g;
    const bool linear = op == RowOp::kLinear;  // w is [out, in_shard]; else [in_shard, out]
    if (ctx->needs_input_grad(0)) {
      const at::Tensor gxs =
          (linear ? at::matmul(gp, w) : at::matmul(gp, w.t())).to(x.scalar_type());
      if (x.size(-1) == info.shard) {
        grad_x = gxs;
      } else {
        // Whole input: each rank has the gradient of its slice; their sum is the whole one.
        grad_x = at::zeros(x.sizes(), gxs.options());
        grad_x.narrow(-1, info.offset, info.shard).copy_(gxs);
        grad_x = sum_across(*info.group, grad_x);
      }
    }
    if (ctx->needs_input_grad(1)) {
      const at::Tensor xs = input_slice(x, info).to(dtype);
      const at::Tensor x2 = xs.reshape({-1, xs.size(-1)}), g2 = gp.reshape({-1, gp.size(-1)});
      grad_w = (linear ? at::mm(g2.t(), x2) : at::mm(x2.t(), g2)).to(saved[1].scalar_type());
    }
    if (extra.numel() > 0 && ctx->needs_input_grad(2)) {
      const at::Tensor ge = op == RowOp::kAddmm ? g * ctx->saved_data.at("beta").toScalar() : g;
      grad_extra = at::sum_to(ge, extra.sizes()).to(extra.scalar_type());
    }
    return {grad_x, grad_w, grad_extra, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// A vocabulary-split embedding: each rank looks up the ids in its rows, zeros elsewhere, and
// the lookups are summed; the weight's gradient is the rows this rank holds.
struct RowParallelEmbedding : torch::autograd::Function<RowParallelEmbedding> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& weight,
                            const at::Tensor& idx, const RowWeight& info, int64_t padding_idx) {
    c10::impl::ExcludeDispatchKeyGuard no_intercept(detail::kInterceptKey);
    at::Tensor mine, local;
    at::Tensor out = embedding_forward(weight, idx, info, &mine, &local);
    // The padding row's gradient stays zero (as aten::embedding's backward).
    const at::Tensor learns = padding_idx >= 0 ? mine.logical_and(idx.ne(padding_idx)) : mine;
    ctx->save_for_backward({local, learns});
    ctx->saved_data["rows"] = weight.size(0);
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    c10::impl::ExcludeDispatchKeyGuard no_intercept(detail::kInterceptKey);
    const auto saved = ctx->get_saved_variables();
    const at::Tensor local = saved[0].reshape({-1}), learns = saved[1].reshape({-1});
    const at::Tensor g = grads[0].reshape({-1, grads[0].size(-1)});
    at::Tensor grad_w = at::zeros({ctx->saved_data.at("rows").toInt(), g.size(1)}, g.options());
    grad_w.index_add_(0, local.masked_select(learns), g.index({learns}));
    return {grad_w, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

bool records(const at::Tensor& t) {
  return t.defined() && t.requires_grad();
}

// A column-parallel op whose input autograd records: the op runs on f(input).
bool column_op(const c10::OperatorHandle& op, const RowOpInfo& which, const ColWeight& col,
               torch::jit::Stack* stack) {
  if (!at::GradMode::is_enabled() || which.op == RowOp::kEmbedding) return false;
  const size_t n = which.nargs, xi = which.op == RowOp::kAddmm ? 1 : 0;
  c10::IValue& slot = (*stack)[stack->size() - n + xi];
  if (!slot.isTensor() || !records(slot.toTensor())) return false;
  // Excluded for the whole op, so the ops it is made of (matmul's mm) are not intercepted
  // again (that would sum the input gradient twice).
  c10::impl::ExcludeDispatchKeyGuard no_intercept(detail::kInterceptKey);
  slot = CopyToGroup::apply(slot.toTensor(), col.group);
  op.callBoxed(stack);
  return true;
}

bool tp_interceptor(const c10::OperatorHandle& op, c10::DispatchKeySet /*keys*/,
                    torch::jit::Stack* stack) {
  if (rows().empty() && cols().empty()) return false;
  const c10::OperatorName& name = op.operator_name();
  const RowOpInfo* which = nullptr;
  for (const auto& r : row_ops()) {
    if (r.name == name) which = &r;
  }
  if (which == nullptr || op.schema().arguments().size() != which->nargs) return false;
  const size_t n = which->nargs;
  const c10::IValue& w = torch::jit::peek(*stack, which->weight, n);
  if (!w.isTensor()) return false;
  const c10::optional<RowWeight> found = rows().find(w.toTensor());
  if (!found) {
    const c10::optional<ColWeight> col = cols().find(w.toTensor());
    return col ? column_op(op, *which, *col, stack) : false;
  }
  const RowWeight info = *found;
  const at::Tensor weight = w.toTensor();
  const bool grad_mode = at::GradMode::is_enabled();
  c10::impl::ExcludeDispatchKeyGuard no_intercept(detail::kInterceptKey);
  at::Tensor out;
  if (which->op == RowOp::kEmbedding) {
    const at::Tensor idx = torch::jit::peek(*stack, 1, n).toTensor();
    // The module's padding row is kept by the engine (its option is cleared while split).
    const int64_t padding_idx =
        info.padding_idx >= 0 ? info.padding_idx : torch::jit::peek(*stack, 2, n).toInt();
    if (grad_mode && records(weight)) {
      VOLT_CHECK(
          !torch::jit::peek(*stack, 3, n).toBool() && !torch::jit::peek(*stack, 4, n).toBool(),
          ValueError, kTag,
          " a vocabulary-split Embedding trains only with dense gradients and "
          "scale_grad_by_freq=false (each rank sees only its rows' counts); build the "
          "Embedding without sparse / scale_grad_by_freq, or keep it replicated.");
      out = RowParallelEmbedding::apply(weight, idx, info, padding_idx);
    } else {
      out = embedding_forward(weight, idx, info);
    }
  } else {
    const size_t xi = which->op == RowOp::kAddmm ? 1 : 0;
    const at::Tensor x_in = torch::jit::peek(*stack, xi, n).toTensor();
    at::Tensor extra;  // linear's bias, addmm's self
    if (which->op == RowOp::kLinear) {
      const c10::IValue& bias = torch::jit::peek(*stack, 2, n);
      if (bias.isTensor()) extra = bias.toTensor();
    } else if (which->op == RowOp::kAddmm) {
      extra = torch::jit::peek(*stack, 0, n).toTensor();
    }
    c10::Scalar beta = 1, alpha = 1;
    if (which->op == RowOp::kAddmm) {
      beta = torch::jit::peek(*stack, 3, n).toScalar();
      alpha = torch::jit::peek(*stack, 4, n).toScalar();
    }
    if (grad_mode && (records(x_in) || records(weight) || records(extra))) {
      // libtorch 1.13's Function::apply needs defined tensors: no bias is an empty one.
      const at::Tensor arg = extra.defined() ? extra : at::empty({0}, weight.options());
      out = RowParallel::apply(x_in, weight, arg, which->op, info, beta, alpha);
    } else {
      out = row_forward(x_in, weight, extra, which->op, info, beta, alpha);
    }
  }
  torch::jit::drop(*stack, n);
  torch::jit::push(*stack, std::move(out));
  return true;
}

}  // namespace

TensorParallelEngine::TensorParallelEngine(torch::nn::Module& root,
                                           std::shared_ptr<ProcessGroup> group,
                                           TensorParallelOptions options)
    : root_(root), group_(std::move(group)), options_(std::move(options)) {
  VOLT_CHECK(group_ != nullptr, ConfigError, kTag, " needs a process group.");
  VOLT_CHECK(options_.tp_size() == group_->world_size(), ConfigError, kTag,
             " tp_size=", options_.tp_size(), " but the process group has ", group_->world_size(),
             " ranks; pass the tensor-parallel group (ProcessGroup::new_group) of tp_size ranks.");
  layers_ = resolve_tensor_parallel_plan(root_, options_);
  VOLT_CHECK(!layers_.empty() || options_.tp_size() == 1, ConfigError, kTag,
             " tp_size=", options_.tp_size(),
             " but nothing to split: give a plan or an injection_policy "
             "naming the model's Linear layers.");
  full_bytes_ = parameter_bytes();
  reshard();
  std::unordered_set<const c10::TensorImpl*> listed;  // a tensor under two names: once
  for (const auto& p : root_.named_parameters(/*recurse=*/true)) {
    for (const std::string& pattern : options_.partial_grads()) {
      if (path_matches(pattern, p.key()) && listed.insert(p.value().unsafeGetTensorImpl()).second) {
        partial_.push_back(PartialGrad{p.value(), p.key(), c10::nullopt});
      }
    }
  }
  track_partial_grads();
  std::lock_guard<std::mutex> lock(engines().mu);
  engines().live.push_back(this);
}

void TensorParallelEngine::track_partial_grads() {
  if (options_.tp_size() == 1) return;
  for (PartialGrad& pg : partial_) {
    if (pg.hook || !pg.param.requires_grad()) continue;
    // A parameter thawed since the last call (mid-epoch, or in a Fabric loop, where nothing
    // calls this between steps: ModelParallelStrategy calls it before each step too) may hold
    // a gradient of backwards the hook did not see: its parts are summed now, once. Every rank
    // of the group thaws alike, so this collective lines up.
    if (split_ && pg.param.grad().defined()) {
      torch::NoGradGuard no_grad;
      c10::impl::ExcludeDispatchKeyGuard no_intercept(detail::kInterceptKey);
      pg.param.mutable_grad() = sum_across(*group_, pg.param.grad());
    }
    // This backward's part of the gradient, before it is accumulated: summed once per backward,
    // so gradients accumulated over several backwards are summed once too. Every rank of the
    // group runs the same graph, so the sums run in the same order everywhere.
    pg.hook = pg.param.register_hook([this](const at::Tensor& grad) -> at::Tensor {
      if (!split_ || !grad.defined()) return grad;
      torch::NoGradGuard no_grad;
      c10::impl::ExcludeDispatchKeyGuard no_intercept(detail::kInterceptKey);
      return sum_across(*group_, grad);
    });
  }
}

c10::optional<std::vector<std::string>> TensorParallelEngine::whole_grads_differing() const {
  if (!split_ || options_.tp_size() == 1) return std::vector<std::string>{};
  std::unordered_set<const c10::TensorImpl*> skip;  // split, listed, or seen under another name
  for (const auto& s : shards_) skip.insert(s->param.unsafeGetTensorImpl());
  for (const auto& pg : partial_) skip.insert(pg.param.unsafeGetTensorImpl());
  torch::NoGradGuard no_grad;
  c10::impl::ExcludeDispatchKeyGuard no_intercept(detail::kInterceptKey);
  // Per parameter [sum(g * w), sum(|g|), defined] with fixed weights w (the same on every rank),
  // so a part of a gradient differs from the whole one in a few numbers to compare. Every rank
  // has the same parameters, so the rows line up.
  std::vector<std::string> names;
  std::vector<at::Tensor> rows;
  bool finite = true;
  for (const auto& item : root_.named_parameters(/*recurse=*/true)) {
    const at::Tensor& p = item.value();
    if (!p.requires_grad() || !skip.insert(p.unsafeGetTensorImpl()).second) continue;
    names.push_back(item.key());
    if (!p.grad().defined()) {
      rows.push_back(at::zeros({3}, at::kDouble));
      continue;
    }
    // On the gradient's device, a slice at a time (an unsplit embedding's gradient is large):
    // only the three numbers come to the host.
    const at::Tensor g = p.grad().detach().reshape({-1});
    const auto f64 = g.options().dtype(at::kDouble);
    at::Tensor weighted = at::zeros({}, f64), absolute = at::zeros({}, f64);
    constexpr int64_t kSlice = int64_t{1} << 22;
    for (int64_t off = 0; off < g.numel(); off += kSlice) {
      const int64_t len = std::min(kSlice, g.numel() - off);
      const at::Tensor part = g.narrow(0, off, len).to(at::kDouble);
      const at::Tensor w = at::sin(at::arange(off, off + len, f64) * 0.7 + 0.3);
      weighted += (part * w).sum();
      absolute += part.abs().sum();
    }
    at::Tensor row = at::stack({weighted, absolute, at::ones({}, f64)}).cpu();
    if (!at::isfinite(row).all().item<bool>()) {
      finite = false;
      row = at::zeros({3}, at::kDouble);
    }
    rows.push_back(row);
  }
  if (names.empty()) return std::vector<std::string>{};
  const at::Tensor mine = at::stack(rows);  // [n, 3]
  // One max reduction gives every row's largest and smallest values, and whether any rank saw a
  // non-finite gradient.
  const at::Tensor flag = at::full({1}, finite ? 0.0 : 1.0, at::kDouble);
  const at::Tensor both =
      group_->all_reduce(at::cat({mine.reshape({-1}), -mine.reshape({-1}), flag}), Reduce::kMax);
  if (both[-1].item<double>() != 0) return c10::nullopt;
  const int64_t n = mine.numel();
  const at::Tensor hi = both.narrow(0, 0, n).reshape({-1, 3});
  const at::Tensor lo = -both.narrow(0, n, n).reshape({-1, 3});
  const at::Tensor spread = hi - lo;              // [n, 3]
  const at::Tensor tol = hi.select(1, 1) * 1e-4;  // of the largest absolute sum
  const at::Tensor differs =
      (spread.select(1, 0) > tol) | (spread.select(1, 1) > tol) | (spread.select(1, 2) > 0);
  std::vector<std::string> out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (differs[static_cast<int64_t>(i)].item<bool>()) out.push_back(names[i]);
  }
  return out;
}

namespace {

// This rank's part of `whole` (shaped as the shard's parameter whole).
at::Tensor slice_of(const TensorParallelEngine::Shard& s, const at::Tensor& whole, int64_t tp,
                    int64_t rank) {
  VOLT_CHECK(whole.sizes().vec() == s.full_sizes, ValueError, kTag,
             " expected a tensor of the "
             "whole parameter's shape ",
             c10::IntArrayRef(s.full_sizes), ", got ", whole.sizes(), ".");
  if (s.packed) {
    const int64_t third = whole.size(0) / 3, n = third / tp;
    std::vector<int64_t> split_shape = {3, third};
    for (int64_t d = 1; d < whole.dim(); ++d) split_shape.push_back(whole.size(d));
    std::vector<int64_t> out_shape = whole.sizes().vec();
    out_shape[0] = 3 * n;
    return whole.reshape(split_shape).narrow(1, rank * n, n).reshape(out_shape);
  }
  const int64_t n = whole.size(s.dim) / tp;
  return whole.narrow(s.dim, rank * n, n);
}

// Every rank's `part` (shaped as the shard) joined whole; collective.
at::Tensor join_parts(const TensorParallelEngine::Shard& s, const at::Tensor& part,
                      ProcessGroup& group) {
  // Gathered in float32 where Gloo lacks the dtype (bfloat16 runs); exact either way.
  const bool widen = part.scalar_type() == at::kBFloat16 || part.scalar_type() == at::kHalf;
  std::vector<at::Tensor> parts = group.all_gather(widen ? part.to(at::kFloat) : part);
  if (widen) {
    for (auto& p : parts) p = p.to(part.scalar_type());
  }
  const at::Tensor full = TensorParallelEngine::join_shards(parts, {s.dim, s.packed});
  VOLT_ASSERT(full.sizes().vec() == s.full_sizes, kTag, " joined shape ", full.sizes(),
              " differs from ", c10::IntArrayRef(s.full_sizes), " (", group.world_size(),
              " ranks)");
  return full;
}

}  // namespace

TensorParallelEngine::SplitLayout TensorParallelEngine::split_layout(
    const at::Tensor& param) const {
  const Shard* s = find_shard(param);
  return s == nullptr ? SplitLayout{} : SplitLayout{s->dim, s->packed};
}

at::Tensor TensorParallelEngine::join_shards(const std::vector<at::Tensor>& shards,
                                             const SplitLayout& layout) {
  VOLT_CHECK(!shards.empty(), ValueError, kTag, " join_shards: no shards to join.");
  const int64_t dim = layout.packed ? 0 : layout.dim;
  VOLT_CHECK(dim >= 0 && dim < shards[0].dim(), ValueError, kTag, " join_shards: split dimension ",
             layout.dim, " for shards of shape ", shards[0].sizes(), ".");
  for (const auto& p : shards) {
    VOLT_CHECK(p.sizes().equals(shards[0].sizes()), ValueError, kTag,
               " join_shards: the shards' shapes differ (", shards[0].sizes(), " and ", p.sizes(),
               "); they are not one parameter's.");
  }
  if (!layout.packed) return at::cat(shards, dim);
  // Every rank holds [q_r; k_r; v_r]: regroup by third.
  VOLT_CHECK(shards[0].size(0) % 3 == 0, ValueError, kTag, " join_shards: a packed q/k/v shard of ",
             shards[0].size(0), " rows is not three equal parts.");
  std::vector<int64_t> whole = shards[0].sizes().vec();
  whole[0] *= static_cast<int64_t>(shards.size());
  std::vector<at::Tensor> thirds;
  for (const auto& p : shards) thirds.push_back(p.reshape({3, p.size(0) / 3, -1}));
  return at::cat(thirds, 1).reshape(whole);
}

const TensorParallelEngine::Shard* TensorParallelEngine::find_shard(const at::Tensor& param) const {
  for (const auto& s : shards_) {
    if (s->param.unsafeGetTensorImpl() == param.unsafeGetTensorImpl()) return s.get();
  }
  return nullptr;
}

std::vector<int64_t> TensorParallelEngine::whole_sizes(const at::Tensor& param) const {
  const Shard* s = find_shard(param);
  return s != nullptr ? s->full_sizes : param.sizes().vec();
}

at::Tensor TensorParallelEngine::gather_whole(const at::Tensor& param,
                                              const at::Tensor& part) const {
  const Shard* s = find_shard(param);
  if (s == nullptr || !part.defined()) return part;
  VOLT_CHECK(part.sizes() == param.sizes(), ValueError, kTag,
             " gather_whole: expected a tensor of "
             "the shard's shape ",
             param.sizes(), ", got ", part.sizes(), ".");
  torch::NoGradGuard no_grad;
  c10::impl::ExcludeDispatchKeyGuard no_intercept(detail::kInterceptKey);
  return join_parts(*s, part.contiguous(), *group_);
}

at::Tensor TensorParallelEngine::shard_of(const at::Tensor& param, const at::Tensor& whole) const {
  const Shard* s = find_shard(param);
  if (s == nullptr || !whole.defined()) return whole;
  torch::NoGradGuard no_grad;
  c10::impl::ExcludeDispatchKeyGuard no_intercept(detail::kInterceptKey);
  return slice_of(*s, whole, options_.tp_size(), group_->rank()).contiguous().clone();
}

void TensorParallelEngine::reshard() {
  if (split_) return;
  const int64_t tp = options_.tp_size(), rank = group_->rank();
  std::map<std::string, torch::nn::Module*> by_path;
  by_path[""] = &root_;
  for (const auto& item : root_.named_modules("", false)) by_path[item.key()] = item.value().get();
  torch::NoGradGuard no_grad;
  c10::impl::ExcludeDispatchKeyGuard no_intercept(detail::kInterceptKey);
  auto reshard = [&](at::Tensor& p, int64_t dim, bool packed) {
    auto s = std::make_unique<Shard>();
    s->param = p;
    s->full_sizes = p.sizes().vec();
    s->dim = dim;
    s->packed = packed;
    p.set_data(slice_of(*s, p, tp, rank).contiguous().clone());
    shards_.push_back(std::move(s));
  };
  for (const TpLayer& layer : layers_) {
    torch::nn::Module* m = by_path.at(layer.path);
    if (layer.kind == "Embedding") {
      auto& e = dynamic_cast<torch::nn::EmbeddingImpl&>(*m);
      const int64_t full = e.weight.size(0), n = full / tp;
      reshard(e.weight, 0, false);
      Shard& shard = *shards_.back();
      shard.embedding = &e;
      shard.padding_idx = e.options.padding_idx();  // the whole vocabulary's row (reset())
      e.options.padding_idx(c10::nullopt);
      register_row(e.weight, RowWeight{detail::storage_of(e.weight), group_.get(), full, n,
                                       rank * n, shard.padding_idx.value_or(-1)});
      continue;
    }
    auto& l = dynamic_cast<torch::nn::LinearImpl&>(*m);
    switch (layer.style) {
      case TpStyle::kColwise:
      case TpStyle::kColwiseQkv: {
        const bool packed = layer.style == TpStyle::kColwiseQkv;
        reshard(l.weight, 0, packed);
        if (l.bias.defined()) reshard(l.bias, 0, packed);
        register_col(l.weight, group_.get());
        break;
      }
      case TpStyle::kRowwise: {
        const int64_t full = l.weight.size(1), n = full / tp;
        reshard(l.weight, 1, false);  // the bias stays whole: added once, after the sum
        register_row(l.weight,
                     RowWeight{detail::storage_of(l.weight), group_.get(), full, n, rank * n});
        break;
      }
      case TpStyle::kReplicated: break;
    }
  }
  detail::add_interceptor(&tp_interceptor);
  split_ = true;
}

TensorParallelEngine::~TensorParallelEngine() {
  for (const PartialGrad& pg : partial_) {
    if (pg.hook) pg.param.remove_hook(*pg.hook);
  }
  for (const auto& s : shards_) {
    unregister_weight(s->param);
    if (s->embedding != nullptr) s->embedding->options.padding_idx(s->padding_idx);
  }
  std::lock_guard<std::mutex> lock(engines().mu);
  auto& live = engines().live;
  live.erase(std::remove(live.begin(), live.end(), this), live.end());
}

const TensorParallelEngine* detail::engine_splitting(const at::Tensor& param) {
  std::lock_guard<std::mutex> lock(engines().mu);
  for (const TensorParallelEngine* e : engines().live) {
    if (e->is_split(param)) return e;
  }
  return nullptr;
}

struct TensorParallelEngine::Scope::Impl {
  explicit Impl(int64_t rank) : previous_rank(detail::split_rank()) {
    detail::set_split_rank(rank);  // SplitRegionRng forks by it
  }
  ~Impl() { detail::set_split_rank(previous_rank); }
  c10::impl::IncludeDispatchKeyGuard include{detail::kInterceptKey};
  int64_t previous_rank;
};

TensorParallelEngine::Scope::Scope(TensorParallelEngine& engine) {
  if (engine.split_ && engine.options_.tp_size() > 1) {
    impl_ = std::make_unique<Impl>(engine.group_->rank());
  }
}

TensorParallelEngine::Scope::~Scope() = default;

SplitRegionRng::SplitRegionRng() {
  const int64_t rank = detail::split_rank();
  if (rank < 0) return;
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  auto* cpu = at::check_generator<at::CPUGeneratorImpl>(gen);
  const uint64_t draw = cpu->random64();  // the shared stream's one draw, alike on every rank
  shared_ = at::Tensor(cpu->get_state());
  cpu->set_current_seed(detail::mix64(draw ^ detail::mix64(static_cast<uint64_t>(rank) + 1)));
}

SplitRegionRng::~SplitRegionRng() {
  if (!shared_.defined()) return;
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(shared_);
}

void TensorParallelEngine::restore() {
  if (!split_) return;
  for (const auto& s : shards_) unregister_weight(s->param);
  torch::NoGradGuard no_grad;
  c10::impl::ExcludeDispatchKeyGuard no_intercept(detail::kInterceptKey);
  for (auto& s : shards_) {
    s->param.set_data(join_parts(*s, s->param, *group_).contiguous());
    if (s->embedding != nullptr) s->embedding->options.padding_idx(s->padding_idx);
  }
  shards_.clear();
  split_ = false;
}

double TensorParallelEngine::grad_norm(const std::vector<at::Tensor>& parameters,
                                       double norm_type) const {
  const bool inf = std::isinf(norm_type) && norm_type > 0;
  VOLT_CHECK(norm_type == 2.0 || inf, ValueError, kTag, " grad_norm: norm_type=", norm_type,
             " is not supported; use 2 or infinity.");
  std::unordered_set<const c10::TensorImpl*> split;
  for (const auto& s : shards_) split.insert(s->param.unsafeGetTensorImpl());
  torch::NoGradGuard no_grad;
  c10::impl::ExcludeDispatchKeyGuard no_intercept(detail::kInterceptKey);
  at::Tensor parts = at::zeros({2}, at::kDouble);  // [split, whole]
  for (const auto& p : parameters) {
    if (!p.grad().defined()) continue;
    const at::Tensor g = p.grad().to(at::kDouble);
    const at::Tensor v = (inf ? g.abs().max() : g.pow(2).sum()).cpu();
    const int64_t i = split.count(p.unsafeGetTensorImpl()) ? 0 : 1;
    parts[i] = inf ? at::maximum(parts[i], v) : parts[i] + v;
  }
  double a = parts[0].item<double>();
  if (split_ && options_.tp_size() > 1) {
    if (inf) {  // a NaN travels as a flag: a max reduction may drop it
      const bool nan = std::isnan(a);
      const at::Tensor both = group_->all_reduce(
          at::tensor({nan ? 0.0 : a, nan ? 1.0 : 0.0}, at::kDouble), Reduce::kMax);
      a = both[1].item<double>() != 0 ? std::nan("") : both[0].item<double>();
    } else {
      a = group_->all_reduce(parts[0].reshape({1}), Reduce::kSum)[0].item<double>();
    }
  }
  const double b = parts[1].item<double>();
  if (inf) return std::isnan(a) || std::isnan(b) ? std::nan("") : std::max(a, b);
  return std::sqrt(a + b);
}

double TensorParallelEngine::clip_grad_norm_(const std::vector<at::Tensor>& parameters,
                                             double max_norm, double norm_type) {
  const double norm = grad_norm(parameters, norm_type);
  const double coef = detail::clip_coefficient(max_norm, norm);  // NaN: every gradient NaN
  if (coef != 1.0) {
    torch::NoGradGuard no_grad;
    c10::impl::ExcludeDispatchKeyGuard no_intercept(detail::kInterceptKey);
    for (const auto& p : parameters) {
      if (p.grad().defined()) p.grad().mul_(coef);
    }
  }
  return norm;
}

int64_t TensorParallelEngine::parameter_bytes() const {
  return detail::storage_bytes(root_.parameters());
}

std::ostream& operator<<(std::ostream& os, const TensorParallelOptions& o) {
  os << "TensorParallelOptions(tp_size=" << o.tp_size() << ", plan=[";
  for (size_t i = 0; i < o.plan().size(); ++i) {
    os << (i ? ", " : "")
       << detail::quoted(o.plan()[i].first + "=" + to_string(o.plan()[i].second));
  }
  os << "], injection_policy=[";
  for (size_t i = 0; i < o.injection_policy().size(); ++i) {
    os << (i ? ", " : "") << detail::quoted(o.injection_policy()[i].first) << ": "
       << detail::quoted_list(o.injection_policy()[i].second);
  }
  return os << "], num_heads=" << o.num_heads()
            << ", partial_grads=" << detail::quoted_list(o.partial_grads()) << ")";
}

}  // namespace volt
