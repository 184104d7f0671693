#include "volt/nn/checkpoint.h"

#include <ATen/Context.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/custom_class.h>
#include <torch/torch.h>

#include <algorithm>
#include <mutex>

#include "core/detail/numbers.h"
#include "core/detail/rng_states.h"
#include "distributed/detail/intercept.h"
#include "nn/detail/recompute_buffers.h"
#include "volt/core/check.h"
#include "volt/precision/autocast.h"
#include "volt/precision/fp8_modules.h"

namespace volt {
namespace {

std::mutex g_defaults_mutex;
CheckpointOptions g_defaults;

// --------------------------------------------------------------------------- forward state

using detail::get_rng_states;
using detail::RngState;
using detail::set_rng_states;

// Every RNG the function may draw from: the CPU default generator (CPU ops, and what a CUDA
// dropout does not use) plus the default generator of each non-CPU device among the inputs,
// through the device-generic context API (no CUDA headers).
std::vector<c10::Device> rng_devices(const std::vector<at::Tensor>& inputs) {
  std::vector<c10::Device> out{c10::Device(c10::kCPU)};
  for (const auto& t : inputs) {
    if (!t.defined() || t.device().is_cpu()) continue;
    if (std::find(out.begin(), out.end(), t.device()) == out.end()) out.push_back(t.device());
  }
  return out;
}

// The autocast state of the forward: the Trainer's autocast region has ended by the time
// backward recomputes, so it is replayed exactly (bf16 vs fp32 GEMMs would give other values).
struct AutocastState {
  bool cpu_enabled = false;
  c10::ScalarType cpu_dtype = c10::kBFloat16;
  bool cuda_enabled = false;
  c10::ScalarType cuda_dtype = c10::kHalf;
  bool fp8 = false;

  static AutocastState current() {
    AutocastState s;
    s.cpu_enabled = AutocastGuard::is_enabled(c10::kCPU);
    s.cpu_dtype = AutocastGuard::dtype(c10::kCPU);
    s.cuda_enabled = AutocastGuard::is_enabled(c10::kCUDA);
    s.cuda_dtype = AutocastGuard::dtype(c10::kCUDA);
    s.fp8 = Fp8Autocast::is_enabled();
    return s;
  }
};

// Sets an AutocastState for its lifetime. The fp8 region goes first: it opens its own bf16
// autocast region, which the exact CPU state then overrides.
class AutocastReplay {
 public:
  explicit AutocastReplay(const AutocastState& s) {
    if (s.fp8 != Fp8Autocast::is_enabled()) {
      fp8_ = std::make_unique<Fp8Autocast>(c10::kCPU, s.fp8);
    }
    cpu_ = std::make_unique<AutocastGuard>(c10::kCPU, s.cpu_dtype, s.cpu_enabled);
    if (s.cuda_enabled || AutocastGuard::is_enabled(c10::kCUDA)) {
      cuda_ = std::make_unique<AutocastGuard>(c10::kCUDA, s.cuda_dtype, s.cuda_enabled);
    }
  }
  ~AutocastReplay() {
    cuda_.reset();
    cpu_.reset();
    fp8_.reset();
  }

 private:
  std::unique_ptr<Fp8Autocast> fp8_;
  std::unique_ptr<AutocastGuard> cpu_, cuda_;
};

// What backward needs besides the saved tensors. Held by the autograd node through a capsule
// in ctx->saved_data (a CustomClassHolder needs no class registration there).
struct CheckpointState : torch::CustomClassHolder {
  CheckpointFunction fn;
  CheckpointOptions options;
  std::vector<c10::Device> devices;  // where each input lived (cpu_checkpointing moves back)
  std::vector<bool> requires_grad;   // per input
  std::vector<bool> defined;         // per input
  std::vector<RngState> rng;         // at forward entry
  AutocastState autocast;
  // The interception the forward ran under (a tensor-parallel Scope's row-parallel sums and
  // split rank, ZeRO's), gone by the time backward recomputes.
  detail::InterceptState intercept;
};

// A host copy of `t` for cpu_checkpointing: pinned when it comes from CUDA, so the copy back
// can be asynchronous; CPU tensors are kept as they are.
at::Tensor to_host(const at::Tensor& t) {
  if (!t.defined() || t.device().is_cpu()) return t;
  const bool pin = t.device().is_cuda();
  at::Tensor host = at::empty(t.sizes(), t.options().device(c10::kCPU).pinned_memory(pin));
  host.copy_(t, /*non_blocking=*/pin);
  return host;
}

class CheckpointNode : public torch::autograd::Function<CheckpointNode> {
 public:
  // tensors = {dummy, inputs...}: the dummy requires grad, so the node joins the graph even
  // when no input does (the first layer on raw data) and its parameters still get gradients.
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                at::TensorList tensors,
                                                c10::intrusive_ptr<CheckpointState> state) {
    // Outputs the loss does not use get no gradient (not zeros): nothing to recompute for them.
    ctx->set_materialize_grads(false);
    std::vector<at::Tensor> inputs(tensors.begin() + 1, tensors.end());
    std::vector<at::Tensor> saved;
    saved.reserve(inputs.size());
    for (const auto& t : inputs) {
      state->devices.push_back(t.defined() ? t.device() : c10::Device(c10::kCPU));
      state->requires_grad.push_back(t.defined() && t.requires_grad());
      state->defined.push_back(t.defined());
      saved.push_back(state->options.cpu_checkpointing() ? to_host(t) : t);
    }
    if (state->options.preserve_rng_state()) state->rng = get_rng_states(rng_devices(inputs));
    state->autocast = AutocastState::current();
    state->intercept = detail::InterceptState::current();
    std::vector<at::Tensor> outputs;
    {
      // No autocast cast cache here: a weight cast under no_grad would be cached without a
      // graph, and a later use of the same weight outside the checkpoint (same region) would
      // get no gradient through it. The casts themselves are identical without the cache.
      c10::optional<AutocastGuard> no_cache;
      if (state->autocast.cpu_enabled || state->autocast.cuda_enabled) {
        // The cache flag is global; the CPU state is set to what it already is.
        no_cache.emplace(c10::kCPU, state->autocast.cpu_dtype, state->autocast.cpu_enabled,
                         /*cache_enabled=*/false);
      }
      outputs = state->fn(inputs);
    }
    for (auto& o : outputs) {
      VOLT_CHECK(o.defined(), ValueError,
                 "[checkpoint] the checkpointed function returned an undefined tensor; return "
                 "only defined tensors.");
      if (!at::isFloatingType(o.scalar_type()) && !at::isComplexType(o.scalar_type())) {
        ctx->mark_non_differentiable({o});
      }
    }
    ctx->save_for_backward(saved);
    ctx->saved_data["state"] = c10::IValue::make_capsule(std::move(state));
    return outputs;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    // The recomputation runs an ordinary backward that accumulates into .grad; under grad() or
    // backward(inputs) it would write gradients no one asked for and return none for the inputs
    // named (PyTorch's reentrant checkpoint refuses the same; the engine knows which it is).
    VOLT_CHECK(torch::autograd::Engine::get_default_engine().is_checkpoint_valid(), ValueError,
               "[checkpoint] a backward through volt::checkpoint computes gradients for every "
               "leaf; torch::autograd::grad() and backward(inputs) are not supported. Call "
               "backward() without inputs, or run this part without checkpointing.");
    auto state =
        c10::static_intrusive_pointer_cast<CheckpointState>(ctx->saved_data["state"].toCapsule());
    // Unpacking checks the version counters: an input modified in place after forward throws
    // here (libtorch's "modified by an inplace operation" error).
    std::vector<at::Tensor> saved = ctx->get_saved_variables();
    std::vector<at::Tensor> inputs;
    inputs.reserve(saved.size());
    for (size_t i = 0; i < saved.size(); ++i) {
      if (!state->defined[i]) {
        inputs.emplace_back();
        continue;
      }
      at::Tensor t = saved[i].detach();
      if (state->options.cpu_checkpointing() && t.device() != state->devices[i]) {
        t = t.to(state->devices[i], /*non_blocking=*/true);
      }
      t.requires_grad_(state->requires_grad[i]);
      inputs.push_back(t);
    }

    std::vector<at::Tensor> outputs;
    {
      RECORD_FUNCTION("volt::checkpoint::recompute", std::vector<c10::IValue>());
      std::vector<RngState> now;
      if (state->options.preserve_rng_state()) {
        std::vector<c10::Device> devices;
        for (const auto& s : state->rng) devices.push_back(s.device);
        now = get_rng_states(devices);
        set_rng_states(state->rng);
      }
      struct RestoreRng {
        const std::vector<RngState>& states;
        ~RestoreRng() { set_rng_states(states); }
      } restore{now};
      torch::AutoGradMode grad(true);
      AutocastReplay replay(state->autocast);
      detail::InterceptReplay intercepting(state->intercept);
      CheckpointRecomputeScope recomputing;
      outputs = state->fn(inputs);
    }
    VOLT_CHECK(outputs.size() == grad_outputs.size(), ValueError,
               "[checkpoint] the checkpointed function returned ", outputs.size(),
               " tensors in recomputation but ", grad_outputs.size(),
               " in forward; it must do the same work both times.");
    std::vector<at::Tensor> roots, grads;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (outputs[i].requires_grad() && grad_outputs[i].defined()) {
        roots.push_back(outputs[i]);
        grads.push_back(grad_outputs[i]);
      }
    }
    // backward, not grad(): parameters accumulate their .grad through the recomputed graph as
    // they would through an ordinary one (their hooks fire too).
    if (!roots.empty()) torch::autograd::backward(roots, grads);

    torch::autograd::variable_list result;
    result.reserve(inputs.size() + 2);
    result.emplace_back();  // the dummy
    for (size_t i = 0; i < inputs.size(); ++i) {
      result.push_back(state->requires_grad[i] ? inputs[i].grad() : at::Tensor());
    }
    result.emplace_back();  // the state (not a tensor)
    return result;
  }
};

// ------------------------------------------------------------------------ Sequential entries

at::Tensor call_entry(torch::nn::AnyModule& any, const at::Tensor& x, const std::string& what) {
  // Entries are checked when wrapped (signature_problem); only the result's type is left.
  torch::nn::AnyValue out = any.any_forward(x);
  const at::Tensor* t = out.try_get<at::Tensor>();
  VOLT_CHECK(t != nullptr, ConfigError, "[checkpoint] ", what, " (",
             c10::demangle(any.type_info().name()), ") returns ",
             c10::demangle(out.type_info().name()),
             ", not a Tensor; checkpoint only Sequential entries of the form Tensor "
             "forward(Tensor), or call volt::checkpoint in your forward.");
  return *t;
}

// Whether running `modules` on `inputs` can produce a gradient: an input needs one or one of
// their parameters trains. When neither does (a fine-tuned model's frozen backbone), there is
// nothing to save or recompute: the modules run once, as they would without checkpointing.
bool needs_gradient(const std::vector<at::Tensor>& inputs,
                    const std::vector<const torch::nn::Module*>& modules) {
  for (const at::Tensor& input : inputs) {
    if (input.defined() && input.requires_grad()) return true;
  }
  for (const torch::nn::Module* m : modules) {
    for (const auto& p : m->parameters(/*recurse=*/true)) {
      if (p.requires_grad()) return true;
    }
  }
  return false;
}

// Stands in for one Sequential entry: calls the original under checkpoint. The original stays
// registered in the Sequential under its name; this module has no parameters of its own and is
// registered nowhere, so parameter names and state dicts do not change.
class CheckpointWrapperImpl : public torch::nn::Module {
 public:
  CheckpointWrapperImpl(torch::nn::AnyModule inner, std::string path,
                        c10::optional<CheckpointOptions> options)
      : torch::nn::Module("volt::CheckpointWrapper"),
        inner_(std::move(inner)),
        path_(std::move(path)),
        options_(options) {}

  at::Tensor forward(at::Tensor x) {
    const std::string what = "module '" + path_ + "'";
    if (!needs_gradient({x}, {inner_.ptr().get()})) return call_entry(inner_, x, what);
    CheckpointFunction fn = [this, what](const std::vector<at::Tensor>& in) {
      detail::RecomputeKeepsBuffers keep({inner_.ptr().get()});  // BatchNorm's statistics
      return std::vector<at::Tensor>{call_entry(inner_, in[0], what)};
    };
    return detail::checkpoint_impl(fn, {x}, options_ ? *options_ : checkpoint_defaults()).at(0);
  }

  const torch::nn::AnyModule& inner() const { return inner_; }
  const std::string& path() const { return path_; }

  // train()/eval() reach the original also where it is not a child (a clone's wrapper, below):
  // a cloned model's Dropout and BatchNorm entries followed eval() only when left unwrapped.
  void train(bool on = true) override {
    torch::nn::Module::train(on);
    inner_.ptr()->train(on);
  }

  // A deep copy that is still checkpointed (Sequential::clone clones each entry through this).
  // The copy stands alone as its Sequential's child, so it registers the cloned original's
  // parameters, buffers and children as its own: parameter names and state dicts of a cloned
  // model are those of the original.
  std::shared_ptr<torch::nn::Module> clone(
      const c10::optional<torch::Device>& device = c10::nullopt) const override {
    auto copy = std::make_shared<CheckpointWrapperImpl>(inner_.clone(device), path_, options_);
    torch::nn::Module& inner = *copy->inner_.ptr();
    for (const auto& p : inner.named_parameters(/*recurse=*/false)) {
      copy->register_parameter(p.key(), p.value(), p.value().requires_grad());
    }
    for (const auto& b : inner.named_buffers(/*recurse=*/false)) {
      copy->register_buffer(b.key(), b.value());
    }
    for (const auto& c : inner.named_children()) copy->register_module(c.key(), c.value());
    return copy;
  }

 private:
  torch::nn::AnyModule inner_;
  std::string path_;
  c10::optional<CheckpointOptions> options_;
};

// Why `any` cannot be a checkpointed entry (it does not take one Tensor), or "" when it can or
// when that cannot be told before it runs. A call with an argument of a private type fails
// AnyModule's argument checks, which run before forward(), so the module never runs: the
// message says how many arguments forward() takes, or the type of the first one.
struct SignatureProbe {};

std::string signature_problem(torch::nn::AnyModule& any) {
  try {
    any.any_forward(SignatureProbe{});
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    const auto arity = msg.find("forward() method expects");
    if (arity != std::string::npos) {
      const auto end = msg.find(", but received", arity);
      return "its " + msg.substr(arity, end == std::string::npos ? end : end - arity);
    }
    const std::string lead = "Expected argument #0 to be of type ";
    const auto type = msg.find(lead);
    if (type != std::string::npos) {
      const auto from = type + lead.size();
      const std::string name = msg.substr(from, msg.find(", but received", from) - from);
      if (name == "at::Tensor") return "";
      return "its forward() takes " + name;
    }
  } catch (...) {
  }
  return "";
}

CheckpointWrapperImpl* as_wrapper(const torch::nn::AnyModule& any) {
  return dynamic_cast<CheckpointWrapperImpl*>(any.ptr().get());
}

// '*' matches within one path component, '**' across components. Dynamic programming over
// the pattern's tokens, O(pattern x path) time and O(path) memory: the recursive matcher it
// replaces tried every split for each star, exponential in the stars (36 stars and a letter the
// path lacks took 0.8 s against a 13-character path, each two more stars about 1.8 times that).
bool glob(const std::string& pattern, const std::string& path) {
  const size_t n = path.size();
  // ok[j]: the pattern's tokens from the current one on match path[j:]. Tokens are taken from
  // the end; "**" is read left to right first ("***" is "**" then "*").
  std::vector<char> ok(n + 1, 0), next(n + 1);
  ok[n] = 1;
  std::vector<std::pair<char, int>> tokens;  // (character, 0) or ('*', 1 or 2 stars)
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '*') {
      tokens.push_back({pattern[i], 0});
    } else if (i + 1 < pattern.size() && pattern[i + 1] == '*') {
      tokens.push_back({'*', 2});
      ++i;
    } else {
      tokens.push_back({'*', 1});
    }
  }
  for (auto t = tokens.rbegin(); t != tokens.rend(); ++t) {
    next.swap(ok);  // next: the tokens after this one
    const auto [c, stars] = *t;
    ok[n] = stars > 0 && next[n];
    for (size_t j = n; j-- > 0;) {
      if (stars == 0) {
        ok[j] = path[j] == c && next[j + 1];
      } else {  // match nothing here, or take path[j] and go on (a '*' stops at a '.')
        ok[j] = next[j] || ((stars == 2 || path[j] != '.') && ok[j + 1]);
      }
    }
  }
  return ok[0] != 0;
}

std::vector<std::string> wrap(torch::nn::Module& root, const std::vector<std::string>& patterns,
                              c10::optional<CheckpointOptions> options) {
  constexpr const char* kTag = "[wrap_activation_checkpointing]";
  VOLT_CHECK(!patterns.empty(), ConfigError, kTag,
             " no module patterns given; pass paths or globs such as \"blocks.*\".");
  const auto named = root.named_modules("", /*include_self=*/false);
  std::vector<std::string> paths;
  for (const auto& kv : named) paths.push_back(kv.key());
  // Every pattern is checked before anything is wrapped, so an error leaves the model as it was.
  std::vector<std::string> matched;
  for (const auto& pattern : patterns) {
    bool any = false;
    for (const auto& path : paths) {
      if (!module_path_matches(pattern, path)) continue;
      any = true;
      if (std::find(matched.begin(), matched.end(), path) == matched.end()) matched.push_back(path);
    }
    if (!any) {
      auto os = detail::c_stream<std::ostringstream>();
      const size_t shown = std::min<size_t>(paths.size(), 12);
      for (size_t i = 0; i < shown; ++i) os << (i ? ", " : "") << '"' << paths[i] << '"';
      if (paths.size() > shown) os << ", ... (" << paths.size() << " in all)";
      VOLT_CHECK(false, ConfigError, kTag, " pattern \"", pattern, "\" matches no submodule of ",
                 root.name(),
                 " (its module paths: ", paths.empty() ? std::string("none") : os.str(),
                 "); use one of those paths or a glob such as \"blocks.*\".");
    }
  }
  struct Target {
    std::string path;
    torch::nn::SequentialImpl* parent;
    torch::nn::AnyModule* entry;
  };
  std::vector<Target> targets;
  for (const auto& path : matched) {
    const auto dot = path.rfind('.');
    const std::string parent_path = dot == std::string::npos ? "" : path.substr(0, dot);
    torch::nn::Module* parent = parent_path.empty() ? &root : named[parent_path].get();
    const auto child = named[path];
    auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(parent);
    // A volt::Pipeline's layers are checkpointed by the pipeline itself, per stage.
    VOLT_CHECK(seq != nullptr || parent->name() != "volt::Pipeline", ConfigError, kTag, " \"", path,
               "\" (", child->name(), ") is a layer of the volt::Pipeline ",
               parent_path.empty() ? "at the root" : "\"" + parent_path + "\"",
               ", which checkpoints its stages itself: set PipelineOptions::checkpoint "
               "(\"always\" or \"except_last\") or activation_checkpoint_interval, or the "
               "pipeline strategy's checkpoint option, instead of wrapping its layers.");
    VOLT_CHECK(seq != nullptr, ConfigError, kTag, " \"", path, "\" (", child->name(),
               ") is a member of ", parent_path.empty() ? "the root" : "\"" + parent_path + "\"",
               " (", parent->name(),
               "), not an entry of a torch::nn::Sequential: C++ modules call their children "
               "through typed members and forward() is not virtual, so volt cannot make that call "
               "checkpointed; call volt::checkpoint(block, x) in ",
               parent->name(), "::forward instead, or choose Sequential entries.");
    torch::nn::AnyModule* entry = nullptr;
    for (auto it = seq->begin(); it != seq->end(); ++it) {
      auto* w = as_wrapper(*it);
      const auto ptr = w != nullptr ? w->inner().ptr() : it->ptr();
      if (ptr.get() == child.get()) entry = &*it;
    }
    if (entry != nullptr && as_wrapper(*entry) == nullptr) {
      const std::string problem = signature_problem(*entry);
      VOLT_CHECK(problem.empty(), ConfigError, kTag, " \"", path, "\" (", child->name(),
                 ") does not take one Tensor in forward(): ", problem,
                 "; only entries of the form Tensor forward(Tensor) can be wrapped. Call "
                 "volt::checkpoint in the parent's forward with a lambda that captures the other "
                 "arguments instead.");
    }
    VOLT_CHECK(entry != nullptr, ConfigError, kTag, " \"", path,
               "\" is registered in the Sequential \"", parent_path,
               "\" but is not one of the modules it calls; call volt::checkpoint(block, x) "
               "where it is called instead.");
    targets.push_back({path, seq, entry});
  }
  std::vector<std::string> wrapped;
  for (auto& t : targets) {
    if (as_wrapper(*t.entry) != nullptr) continue;  // wrapped before: idempotent
    *t.entry =
        torch::nn::AnyModule(std::make_shared<CheckpointWrapperImpl>(*t.entry, t.path, options));
    wrapped.push_back(t.path);
  }
  return wrapped;
}

}  // namespace

std::ostream& operator<<(std::ostream& os, const CheckpointOptions& o) {
  return os << "CheckpointOptions(preserve_rng_state="
            << (o.preserve_rng_state() ? "true" : "false")
            << ", cpu_checkpointing=" << (o.cpu_checkpointing() ? "true" : "false") << ")";
}

CheckpointOptions checkpoint_defaults() {
  std::lock_guard<std::mutex> lock(g_defaults_mutex);
  return g_defaults;
}

void set_checkpoint_defaults(const CheckpointOptions& options) {
  std::lock_guard<std::mutex> lock(g_defaults_mutex);
  g_defaults = options;
}

CheckpointDefaultsGuard::CheckpointDefaultsGuard(const CheckpointOptions& options)
    : previous_(checkpoint_defaults()) {
  set_checkpoint_defaults(options);
}

CheckpointDefaultsGuard::~CheckpointDefaultsGuard() {
  set_checkpoint_defaults(previous_);
}

namespace detail {

std::vector<at::Tensor> checkpoint_impl(const CheckpointFunction& fn,
                                        const std::vector<at::Tensor>& inputs,
                                        const CheckpointOptions& options) {
  VOLT_CHECK(static_cast<bool>(fn), ConfigError,
             "[checkpoint] the function is empty; pass a callable.");
  if (!at::GradMode::is_enabled()) return fn(inputs);  // validation / predict: nothing to save
  auto state = c10::make_intrusive<CheckpointState>();
  state->fn = fn;
  state->options = options;
  std::vector<at::Tensor> tensors;
  tensors.reserve(inputs.size() + 1);
  tensors.push_back(torch::empty({0}, torch::requires_grad()));
  tensors.insert(tensors.end(), inputs.begin(), inputs.end());
  return CheckpointNode::apply(at::TensorList(tensors), std::move(state));
}

std::vector<at::Tensor> checkpoint_module_impl(std::shared_ptr<const torch::nn::Module> module,
                                               const CheckpointFunction& fn,
                                               const std::vector<at::Tensor>& inputs,
                                               const CheckpointOptions& options) {
  VOLT_CHECK(module != nullptr, ConfigError,
             "[checkpoint] the module is null (an empty holder or a null pointer); construct "
             "the module before checkpointing it.");
  if (!needs_gradient(inputs, {module.get()})) return fn(inputs);
  CheckpointFunction run = [module, fn](const std::vector<at::Tensor>& in) {
    RecomputeKeepsBuffers keep({module.get()});  // BatchNorm's statistics move once
    return fn(in);
  };
  return checkpoint_impl(run, inputs, options);
}

}  // namespace detail

at::Tensor checkpoint_sequential(torch::nn::Sequential& sequential, int64_t segments,
                                 const at::Tensor& input, const CheckpointOptions& options) {
  const auto n = static_cast<int64_t>(sequential->size());
  VOLT_CHECK(segments >= 1 && segments <= n, ConfigError,
             "[checkpoint_sequential] segments=", segments, " but the Sequential has ", n,
             " modules; use 1 <= segments <= ", n, ".");
  // torch.utils.checkpoint's split: segments of n / segments modules, the last one taking the
  // rest; it runs without checkpoint since its activations are needed right away.
  const int64_t size = n / segments;
  // Backward calls the segments again after this function returned: they hold the Sequential.
  std::shared_ptr<torch::nn::SequentialImpl> seq = sequential.ptr();
  auto entry = [](torch::nn::SequentialImpl& s, int64_t i) -> torch::nn::AnyModule& {
    return *(s.begin() + i);
  };
  at::Tensor x = input;
  int64_t end = -1;
  for (int64_t start = 0; start < size * (segments - 1); start = end + 1) {
    end = start + size - 1;
    std::vector<const torch::nn::Module*> segment;
    for (int64_t i = start; i <= end; ++i) segment.push_back(entry(*seq, i).ptr().get());
    if (!needs_gradient({x}, segment)) {
      for (int64_t i = start; i <= end; ++i) {
        x = call_entry(entry(*seq, i), x, "Sequential entry " + std::to_string(i));
      }
      continue;
    }
    // `seq` keeps the segment's modules alive for the raw pointers in `segment`.
    CheckpointFunction run = [seq, entry, start, end, segment](const std::vector<at::Tensor>& in) {
      detail::RecomputeKeepsBuffers keep(segment);  // BatchNorm's statistics move once
      at::Tensor h = in[0];
      for (int64_t i = start; i <= end; ++i) {
        h = call_entry(entry(*seq, i), h, "Sequential entry " + std::to_string(i));
      }
      return std::vector<at::Tensor>{h};
    };
    x = detail::checkpoint_impl(run, {x}, options).at(0);
  }
  for (int64_t i = end + 1; i < n; ++i) {
    x = call_entry(entry(*seq, i), x, "Sequential entry " + std::to_string(i));
  }
  return x;
}

at::Tensor checkpoint_sequential(torch::nn::Sequential& sequential, int64_t segments,
                                 const at::Tensor& input) {
  return checkpoint_sequential(sequential, segments, input, checkpoint_defaults());
}

bool module_path_matches(const std::string& pattern, const std::string& path) {
  return glob(pattern, path);
}

std::vector<std::string> wrap_activation_checkpointing(torch::nn::Module& root,
                                                       const std::vector<std::string>& patterns,
                                                       const CheckpointOptions& options) {
  return wrap(root, patterns, options);
}

std::vector<std::string> wrap_activation_checkpointing(torch::nn::Module& root,
                                                       const std::vector<std::string>& patterns) {
  return wrap(root, patterns, c10::nullopt);
}

std::vector<std::string> checkpointed_modules(torch::nn::Module& root) {
  std::vector<std::string> out;
  auto visit = [&out](torch::nn::Module& m) {
    auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(&m);
    if (seq == nullptr) return;
    for (auto it = seq->begin(); it != seq->end(); ++it) {
      if (auto* w = as_wrapper(*it)) out.push_back(w->path());
    }
  };
  // include_self=true would need `root` in a shared_ptr (modules on the stack are common).
  visit(root);
  for (const auto& kv : root.named_modules("", /*include_self=*/false)) visit(*kv.value());
  return out;
}

}  // namespace volt
