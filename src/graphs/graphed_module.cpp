#include "volt/graphs/graphed_module.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <utility>

#include "volt/core/check.h"
#include "volt/graphs/cuda_graph.h"

namespace volt {
namespace detail {

// What a graphed callable keeps: the placeholders it replays on, the graphs, and which outputs
// and inputs take part in autograd. Shared by the callable and each backward node it creates,
// so a pending backward outlives the callable.
struct GraphedState {
  explicit GraphedState(GraphKey k) : key(std::move(k)) {}
  std::string name;
  TensorFunction forward;
  torch::nn::Module* module = nullptr;
  bool training = false;  // the module's mode at capture
  GraphOptions options;
  GraphKey key;
  TensorList static_inputs;
  TensorList params;
  TensorList static_outputs;
  std::vector<bool> output_grad;   // per output: differentiable at capture
  TensorList static_grad_outputs;  // per output: where backward's incoming gradient goes
  std::vector<bool> surface_grad;  // per input, then per parameter: a gradient is computed
  TensorList static_grad_surface;  // per input, then per parameter: the graph's gradient
  std::unique_ptr<CudaGraph> fwd;
  std::unique_ptr<CudaGraph> bwd;
  bool has_backward = false;
  int64_t replays = 0;
};

}  // namespace detail

namespace {

using detail::GraphedState;

// The autograd node of a replayed forward: puts the incoming gradients into the backward
// graph's static inputs, replays it, and hands its static gradients on.
class GraphedBackward : public torch::autograd::Node {
 public:
  explicit GraphedBackward(std::shared_ptr<GraphedState> state) : state_(std::move(state)) {}

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    GraphedState& s = *state_;
    at::NoGradGuard no_grad;
    size_t k = 0;
    for (size_t i = 0; i < s.static_outputs.size(); ++i) {
      if (!s.output_grad[i]) continue;
      const at::Tensor& g = grads.at(k++);
      at::Tensor& dst = s.static_grad_outputs[i];
      if (!g.defined()) {
        dst.zero_();
      } else if (g.data_ptr() != dst.data_ptr()) {
        dst.copy_(g);
      }
    }
    s.bwd->replay();
    torch::autograd::variable_list out;
    for (size_t j = 0; j < s.static_grad_surface.size(); ++j) {
      if (!s.surface_grad[j]) continue;
      // A copy: handed on as is, AccumulateGrad would keep the graph's buffer as .grad, and
      // the next replay would overwrite (or double) it.
      const at::Tensor& g = s.static_grad_surface[j];
      out.push_back(g.defined() ? g.detach().clone() : at::Tensor());
    }
    return out;
  }

  std::string name() const override { return "volt::GraphedBackward"; }

 private:
  std::shared_ptr<GraphedState> state_;
};

// "float[8, 32] cuda:0", as GraphKey::str writes an input.
std::string describe(const at::Tensor& t) {
  if (!t.defined()) return "undefined";
  const std::string key = GraphKey({t}, false).str();  // "eval(float[8, 32] cuda:0)"
  return key.substr(5, key.size() - 6);
}

// Same shapes, dtypes and devices as the placeholders (values and requires_grad may differ).
void check_signature(const GraphedState& s, const TensorList& inputs) {
  VOLT_CHECK(inputs.size() == s.static_inputs.size(), ValueError, "[Graphs] ", s.name, ": got ",
             inputs.size(), " inputs; the graph was captured for ", s.static_inputs.size(), " (",
             s.key.str(), ").");
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& a = inputs[i];
    const at::Tensor& b = s.static_inputs[i];
    const bool same =
        a.defined() == b.defined() &&
        (!a.defined() || (a.sizes().equals(b.sizes()) && a.scalar_type() == b.scalar_type() &&
                          a.device() == b.device()));
    VOLT_CHECK(same, ValueError, "[Graphs] ", s.name, ": input ", i, " is ", describe(a),
               "; the graph was captured for ", describe(b), " (", s.key.str(),
               "). A graph replays fixed shapes: use volt::GraphedModule to capture one graph "
               "per input signature, or pad inputs to the captured shape.");
  }
}

}  // namespace

GraphedCallable::GraphedCallable(std::shared_ptr<detail::GraphedState> state)
    : state_(std::move(state)) {}

bool GraphedCallable::has_backward() const {
  return state_->has_backward;
}
int64_t GraphedCallable::replays() const {
  return state_->replays;
}
const GraphKey& GraphedCallable::key() const {
  return state_->key;
}

TensorList GraphedCallable::operator()(const TensorList& inputs) const {
  GraphedState& s = *state_;
  if (s.module != nullptr && s.module->is_training() != s.training) {
    return s.forward(inputs);  // captured in the other mode: run eagerly, as the reference
  }
  check_signature(s, inputs);
  {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i].defined() && inputs[i].data_ptr() != s.static_inputs[i].data_ptr()) {
        s.static_inputs[i].copy_(inputs[i]);
      }
    }
  }
  s.fwd->replay();
  ++s.replays;

  TensorList out;
  out.reserve(s.static_outputs.size());
  for (const at::Tensor& o : s.static_outputs) {
    if (!o.defined()) {
      out.emplace_back();
    } else {
      out.push_back(s.options.disable_tensor_cache() ? o.detach().clone() : o.detach());
    }
  }
  if (!s.has_backward || !c10::GradMode::is_enabled()) return out;

  std::shared_ptr<GraphedBackward> node(new GraphedBackward(state_), torch::autograd::deleteNode);
  torch::autograd::edge_list edges;
  const size_t n_in = s.static_inputs.size();
  for (size_t j = 0; j < s.surface_grad.size(); ++j) {
    if (!s.surface_grad[j]) continue;
    const at::Tensor& t = j < n_in ? inputs[j] : s.params[j - n_in];
    auto e = torch::autograd::collect_next_edges(t);
    edges.push_back(e.empty() ? torch::autograd::Edge() : e[0]);
  }
  node->set_next_edges(std::move(edges));
  for (size_t k = 0; k < out.size(); ++k) {
    if (s.output_grad[k]) torch::autograd::set_history(out[k], node);
  }
  return out;
}

GraphedCallable make_graphed_callable(torch::nn::Module& module, TensorFunction forward,
                                      const TensorList& sample_args, const GraphOptions& options,
                                      const std::string& name) {
  options.validate();
  VOLT_CHECK(static_cast<bool>(forward), ConfigError, "[Graphs] ", name,
             ": the forward function is empty; pass the function to capture.");
  check_graph_capture(sample_args, name);
  c10::Device device(c10::kCPU);
  for (const at::Tensor& t : sample_args) {
    if (t.defined()) device = t.device();
  }
  const TensorList params = module.parameters(/*recurse=*/true);
  for (const auto& p : module.named_parameters(/*recurse=*/true)) {
    VOLT_CHECK(p.value().device() == device, NotAvailable, "[Graphs] ", name, ": parameter '",
               p.key(), "' is on ", p.value().device(), " but the inputs are on ", device,
               "; move the module to the inputs' GPU before capturing.");
  }
  VOLT_CHECK(CudaGraph::available(), NotAvailable, "[Graphs] ", name, ": ",
             CudaGraph::unavailable_reason());

  const bool grad_mode = c10::GradMode::is_enabled();
  auto s = std::make_shared<GraphedState>(GraphKey(sample_args, module.is_training(), grad_mode));
  s->name = name;
  s->forward = forward;
  s->module = &module;
  s->training = module.is_training();
  s->options = options;
  s->fwd = std::make_unique<CudaGraph>(name + " (forward)");
  s->bwd = std::make_unique<CudaGraph>(name + " (backward)");
  {
    at::NoGradGuard no_grad;
    for (const at::Tensor& t : sample_args) {
      s->static_inputs.push_back(t.defined() ? t.detach().clone() : at::Tensor());
    }
  }
  for (size_t i = 0; i < sample_args.size(); ++i) {
    if (sample_args[i].defined() && sample_args[i].requires_grad()) {
      s->static_inputs[i].requires_grad_(true);
    }
  }
  s->params = params;

  TensorList surface = s->static_inputs;
  surface.insert(surface.end(), params.begin(), params.end());
  TensorList surface_req;
  for (const at::Tensor& t : surface) {
    const bool wants = grad_mode && t.defined() && t.requires_grad();
    s->surface_grad.push_back(wants);
    if (wants) surface_req.push_back(t);
  }

  auto differentiable = [](const TensorList& outs) {
    TensorList req;
    for (const at::Tensor& o : outs) {
      if (o.defined() && o.requires_grad()) req.push_back(o);
    }
    return req;
  };

  // Warm-up on a side stream: lazy initialisation happens here, not inside the graphs.
  // autograd::grad accumulates nothing into .grad.
  run_on_side_stream(
      [&] {
        TensorList outs = forward(s->static_inputs);
        VOLT_CHECK(!outs.empty(), ValueError, "[Graphs] ", name,
                   ": the forward returned no tensors; return the outputs to replay.");
        const TensorList req = differentiable(outs);
        if (!surface_req.empty() && !req.empty()) {
          TensorList seeds;
          for (const at::Tensor& o : req) seeds.push_back(at::empty_like(o));
          torch::autograd::grad(req, surface_req, seeds, /*retain_graph=*/false,
                                /*create_graph=*/false, /*allow_unused=*/true);
        }
      },
      options.warmup_iters());
  synchronize_cuda();

  s->fwd->capture([&] { s->static_outputs = forward(s->static_inputs); });
  TensorList req;
  for (const at::Tensor& o : s->static_outputs) {
    const bool d = o.defined() && o.requires_grad();
    s->output_grad.push_back(d);
    s->static_grad_outputs.push_back(d ? at::empty_like(o) : at::Tensor());
    if (d) req.push_back(o);
  }
  s->has_backward = !surface_req.empty() && !req.empty();
  if (s->has_backward) {
    TensorList seeds;
    for (size_t k = 0; k < s->static_outputs.size(); ++k) {
      if (s->output_grad[k]) seeds.push_back(s->static_grad_outputs[k]);
    }
    TensorList grads;
    s->bwd->capture(
        [&] {
          grads = torch::autograd::grad(req, surface_req, seeds, /*retain_graph=*/false,
                                        /*create_graph=*/false, /*allow_unused=*/true);
        },
        s->fwd->pool());
    size_t r = 0;
    for (size_t j = 0; j < s->surface_grad.size(); ++j) {
      s->static_grad_surface.push_back(s->surface_grad[j] ? grads.at(r++) : at::Tensor());
    }
  }
  // Drop the (now spent) autograd graph of the capture; replays attach their own node.
  for (at::Tensor& o : s->static_outputs) {
    if (o.defined()) o = o.detach();
  }
  return GraphedCallable(std::move(s));
}

GraphedModule::GraphedModule(torch::nn::Module& module, TensorFunction forward,
                             GraphOptions options, std::string name)
    : GraphedModule(module, std::move(forward), std::move(options), std::move(name), false) {}

GraphedModule::GraphedModule(torch::nn::Module& module, TensorFunction forward,
                             GraphOptions options, std::string name, bool inference)
    : module_(&module),
      forward_(std::move(forward)),
      options_(std::move(options)),
      name_(std::move(name)),
      inference_(inference),
      cache_(options_.max_graphs(), name_) {
  options_.validate();
  VOLT_CHECK(static_cast<bool>(forward_), ConfigError, "[Graphs] ", name_,
             ": the forward function is empty; pass the module's forward.");
}

TensorList GraphedModule::operator()(const TensorList& inputs) {
  if (inference_) {
    at::NoGradGuard no_grad;
    TensorList out = call(inputs);
    if (!options_.asynchronous()) synchronize_cuda();
    return out;
  }
  return call(inputs);
}

TensorList GraphedModule::call(const TensorList& inputs) {
  const GraphKey key(inputs, module_->is_training(), c10::GradMode::is_enabled());
  GraphedCallable& graphed = cache_.get(key, [&] {
    return std::make_unique<GraphedCallable>(
        make_graphed_callable(*module_, forward_, inputs, options_, name_ + " " + key.str()));
  });
  return graphed(inputs);
}

GraphedModule wrap_in_graph(torch::nn::Module& module, TensorFunction forward, GraphOptions options,
                            std::string name) {
  return GraphedModule(module, std::move(forward), std::move(options), std::move(name),
                       /*inference=*/true);
}

}  // namespace volt
