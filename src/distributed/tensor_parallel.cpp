#include "volt/distributed/tensor_parallel.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <fnmatch.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/torch.h>

#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "core/detail/print.h"
#include "distributed/detail/intercept.h"
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
    const int64_t rows = dynamic_cast<torch::nn::EmbeddingImpl&>(m).weight.size(0);
    VOLT_CHECK(rows % tp == 0, ConfigError, kTag, " embedding '", layer.path, "' has ", rows,
               " rows, not divisible by tp_size=", tp, "; use a tp_size dividing ", rows,
               " or keep it replicated.");
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
  const size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
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
    }
    VOLT_CHECK(any, ConfigError, kTag, " plan entry \"", entry.first, "\" matches no module of ",
               root.name(), "; patterns are module paths such as net.fc1 or blocks.*.fc1.");
  }
  std::vector<TpLayer> out;
  for (auto& kv : chosen) {
    if (kv.second.style == TpStyle::kReplicated) continue;
    if (o.tp_size() > 1) check_divides(kv.second, *by_path.at(kv.first), o);
    out.push_back(kv.second);
  }
  return out;
}

// -------------------------------------------------------------------------------- the engine

struct TensorParallelEngine::Shard {
  at::Tensor param;                 // the module's own tensor, resharded in place
  std::vector<int64_t> full_sizes;  // its shape whole
  int64_t dim = 0;                  // split dimension
  bool packed = false;              // [q; k; v] along dim 0, each third split
};

namespace {

// What the interceptor needs for one row-parallel weight.
struct RowWeight {
  const c10::StorageImpl* storage;  // the weight's (this entry's key)
  ProcessGroup* group;
  int64_t full;   // Linear: input features whole; Embedding: vocabulary rows whole
  int64_t shard;  // this rank's part
  int64_t offset;
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

void unregister_row(const at::Tensor& weight) {
  const c10::StorageImpl* s = detail::storage_of(weight);
  rows().erase_if([&](const RowWeight& r) { return r.storage == s; });
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

bool tp_interceptor(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                    torch::jit::Stack* stack) {
  if (rows().empty()) return false;
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
  if (!found) return false;
  const RowWeight info = *found;
  const at::Tensor weight = w.toTensor();
  c10::impl::ExcludeDispatchKeyGuard no_intercept(detail::kInterceptKey);
  at::Tensor out;
  if (which->op == RowOp::kEmbedding) {
    const at::Tensor idx = torch::jit::peek(*stack, 1, n).toTensor();
    const at::Tensor mine = idx.ge(info.offset).logical_and(idx.lt(info.offset + info.shard));
    const at::Tensor local = (idx - info.offset).masked_fill(mine.logical_not(), 0);
    out = at::embedding(weight, local);
    out = sum_across(*info.group, out * mine.unsqueeze(-1).to(out.scalar_type()));
  } else {
    const size_t xi = which->op == RowOp::kAddmm ? 1 : 0;
    const at::Tensor x_in = torch::jit::peek(*stack, xi, n).toTensor();
    VOLT_CHECK(!at::GradMode::is_enabled() || !(x_in.requires_grad() || weight.requires_grad()),
               ValueError, kTag,
               " a row-parallel Linear ran with autograd recording; tensor "
               "parallelism is for inference (predict/validate/test), not training.");
    const at::Tensor x = input_slice(x_in, info);
    switch (which->op) {
      case RowOp::kLinear: {
        out = sum_across(*info.group, at::linear(x, weight));
        const c10::IValue& bias = torch::jit::peek(*stack, 2, n);
        if (bias.isTensor() && bias.toTensor().defined()) out = out + bias.toTensor();
        break;
      }
      case RowOp::kAddmm: {
        const at::Tensor self = torch::jit::peek(*stack, 0, n).toTensor();
        const c10::Scalar beta = torch::jit::peek(*stack, 3, n).toScalar();
        const c10::Scalar alpha = torch::jit::peek(*stack, 4, n).toScalar();
        out = at::add(self.mul(beta), sum_across(*info.group, at::mm(x, weight)), alpha);
        break;
      }
      case RowOp::kMatmul: out = sum_across(*info.group, at::matmul(x, weight)); break;
      case RowOp::kMm: out = sum_across(*info.group, at::mm(x, weight)); break;
      case RowOp::kEmbedding: break;
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
    at::Tensor part;
    if (packed) {
      const int64_t third = p.size(0) / 3, n = third / tp;
      std::vector<int64_t> split_shape = {3, third};
      for (int64_t d = 1; d < p.dim(); ++d) split_shape.push_back(p.size(d));
      std::vector<int64_t> out_shape = p.sizes().vec();
      out_shape[0] = 3 * n;
      part = p.reshape(split_shape).narrow(1, rank * n, n).reshape(out_shape);
    } else {
      const int64_t n = p.size(dim) / tp;
      part = p.narrow(dim, rank * n, n);
    }
    p.set_data(part.contiguous().clone());
    shards_.push_back(std::move(s));
  };
  for (const TpLayer& layer : layers_) {
    torch::nn::Module* m = by_path.at(layer.path);
    if (layer.kind == "Embedding") {
      auto& e = dynamic_cast<torch::nn::EmbeddingImpl&>(*m);
      const int64_t full = e.weight.size(0), n = full / tp;
      reshard(e.weight, 0, false);
      register_row(e.weight,
                   RowWeight{detail::storage_of(e.weight), group_.get(), full, n, rank * n});
      continue;
    }
    auto& l = dynamic_cast<torch::nn::LinearImpl&>(*m);
    switch (layer.style) {
      case TpStyle::kColwise:
      case TpStyle::kColwiseQkv: {
        const bool packed = layer.style == TpStyle::kColwiseQkv;
        reshard(l.weight, 0, packed);
        if (l.bias.defined()) reshard(l.bias, 0, packed);
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
  for (const auto& s : shards_) unregister_row(s->param);
}

struct TensorParallelEngine::Scope::Impl {
  c10::impl::IncludeDispatchKeyGuard include{detail::kInterceptKey};
};

TensorParallelEngine::Scope::Scope(TensorParallelEngine& engine) {
  if (engine.split_ && engine.options_.tp_size() > 1) impl_ = std::make_unique<Impl>();
}

TensorParallelEngine::Scope::~Scope() = default;

void TensorParallelEngine::restore() {
  if (!split_) return;
  for (const auto& s : shards_) unregister_row(s->param);
  torch::NoGradGuard no_grad;
  c10::impl::ExcludeDispatchKeyGuard no_intercept(detail::kInterceptKey);
  const int64_t tp = options_.tp_size();
  for (auto& s : shards_) {
    // Gathered in float32 where Gloo lacks the dtype (bfloat16 runs); exact either way.
    const bool widen =
        s->param.scalar_type() == at::kBFloat16 || s->param.scalar_type() == at::kHalf;
    std::vector<at::Tensor> parts = group_->all_gather(widen ? s->param.to(at::kFloat) : s->param);
    if (widen) {
      for (auto& p : parts) p = p.to(s->param.scalar_type());
    }
    at::Tensor full;
    if (s->packed) {
      // Every rank holds [q_r; k_r; v_r]: regroup by third.
      std::vector<at::Tensor> thirds;
      for (auto& p : parts) thirds.push_back(p.reshape({3, p.size(0) / 3, -1}));
      full = at::cat(thirds, 1).reshape(s->full_sizes);
    } else {
      full = at::cat(parts, s->dim);
    }
    VOLT_ASSERT(full.sizes().vec() == s->full_sizes, kTag, " restored shape ", full.sizes(),
                " differs from ", s->full_sizes, " (tp_size ", tp, ")");
    s->param.set_data(full.contiguous());
  }
  shards_.clear();
  split_ = false;
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
  return os << "], num_heads=" << o.num_heads() << ")";
}

}  // namespace volt
