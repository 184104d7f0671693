// The pipeline's partition, its GPipe forward (micro-batches through the stages, the last
// stage's output broadcast; each micro-batch's run through a stage checkpointed when asked) and
// its backward (a Node that runs each stage's micro-batches back in reverse order, gradients
// handed to the stage before).
#include "volt/nn/pipeline.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/nn/modules/batchnorm.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <ostream>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "nn/detail/recompute_buffers.h"
#include "volt/core/check.h"
#include "volt/core/log.h"
#include "volt/distributed/process_group.h"
#include "volt/nn/checkpoint.h"

namespace volt {
namespace {

constexpr const char* kTag = "[Pipeline]";
constexpr int64_t kMaxDims = 8;
// Before an activation: micro-batches, dims, dtype, what stage 0's input needs (below), the
// micro-batch's rows at stage 0, sizes.
constexpr int64_t kSizes = 6;
constexpr int64_t kHeader = kSizes + kMaxDims;

constexpr int64_t kTooManyDims = -2;  // in the micro-batch field: the sender is failing
constexpr int64_t kNoBatchRows = -3;  // there: the last stage's output lacks the batch rows
constexpr int64_t kNotJoinable = -4;  // there: its micro-batches' outputs differ past dim 0

[[noreturn]] void throw_too_many_dims(int64_t stage, int64_t dims) {
  VOLT_CHECK(false, ValueError, kTag, " stage ", stage, "'s output has ", dims,
             " dimensions; at most ", kMaxDims,
             " travel between stages: flatten it in the layer that makes it.");
  std::abort();  // unreachable
}

[[noreturn]] void throw_no_batch_rows(int64_t stage, int64_t dims, int64_t size0, int64_t rows) {
  VOLT_CHECK(false, ValueError, kTag, " stage ", stage, "'s output for a micro-batch of ", rows,
             " rows has ",
             dims == 0 ? std::string("no dimensions")
                       : std::to_string(size0) + " rows (dim 0) of " + std::to_string(dims) +
                             " dimensions",
             "; with chunks > 1 the micro-batches' outputs are joined along dim 0, so each must "
             "keep its rows there (or the same multiple of them, as an output flattened to "
             "[rows * T, V]): put the batch first in the last layer (a sequence-first or "
             "reduced output), or use chunks=1.");
  std::abort();  // unreachable
}

[[noreturn]] void throw_not_joinable(int64_t stage, int64_t micro_batch) {
  VOLT_CHECK(false, ValueError, kTag, " stage ", stage, "'s output for micro-batch ", micro_batch,
             " differs from micro-batch 0's past dim 0 (in its other sizes or its dtype), so "
             "the micro-batches' outputs cannot be joined along dim 0; make the last layer's "
             "output shape depend on the batch rows only, or use chunks=1.");
  std::abort();  // unreachable
}

// Stage 0's input, when it needs a gradient: every rank gets that gradient in the backward (so
// the layers before the pipeline train alike everywhere, and a pipeline fed its own output works).
// The stages after 0 learn of it from the headers, so that each can join that broadcast.
struct InputGrad {
  int64_t numel = -1;  // -1: stage 0's input needs no gradient
  c10::ScalarType dtype = at::kFloat;
};

// What travels before an activation: the receiver cannot know its shape or dtype. An output of
// too many dimensions still sends one (saying so), so that the receiver fails with the sender
// instead of waiting for the timeout.
at::Tensor header_of(const at::Tensor& t, int64_t chunks, InputGrad input = {}, int64_t rows = -1) {
  at::Tensor h = at::full({kHeader}, -1, at::kLong);
  auto a = h.accessor<int64_t, 1>();
  if (t.dim() > kMaxDims) {
    a[0] = kTooManyDims;
    a[1] = t.dim();
    return h;
  }
  a[0] = chunks;
  a[1] = t.dim();
  a[2] = static_cast<int64_t>(t.scalar_type());
  a[3] = input.numel;
  a[4] = static_cast<int64_t>(input.dtype);
  a[5] = rows;
  for (int64_t d = 0; d < t.dim(); ++d) a[kSizes + d] = t.size(d);
  return h;
}

bool is_dtype(int64_t v) {
  return v >= 0 && v < static_cast<int64_t>(c10::ScalarType::NumOptions);
}

struct Header {
  int64_t chunks = 0;
  int64_t rows = -1;  // the micro-batch's rows at stage 0 (-1: not told)
  std::vector<int64_t> sizes;
  c10::ScalarType dtype = at::kFloat;
  InputGrad input;
};

Header parse_header(const at::Tensor& h, int64_t rank, int64_t from) {
  auto a = h.accessor<int64_t, 1>();
  if (a[0] == kTooManyDims) throw_too_many_dims(from, a[1]);
  if (a[0] == kNoBatchRows) throw_no_batch_rows(from, a[1], a[2], a[3]);
  if (a[0] == kNotJoinable) throw_not_joinable(from, a[1]);
  bool ok = a[0] >= 1 && a[1] >= 0 && a[1] <= kMaxDims && is_dtype(a[2]) && a[3] >= -1 &&
            is_dtype(a[4]) && a[5] >= -1;
  Header out;
  for (int64_t d = 0; ok && d < a[1]; ++d) {
    ok = a[kSizes + d] >= 0;
    out.sizes.push_back(a[kSizes + d]);
  }
  VOLT_CHECK(ok, DistributedError, kTag, " rank ", rank,
             " got a malformed activation header from rank ", from,
             "; every rank must run the same model and code.");
  out.chunks = a[0];
  out.rows = a[5];
  out.dtype = static_cast<c10::ScalarType>(a[2]);
  out.input = {a[3], static_cast<c10::ScalarType>(a[4])};
  return out;
}

void send_with_header(ProcessGroup& g, const at::Tensor& t, int64_t chunks, InputGrad input,
                      int64_t rows, int64_t dst) {
  g.send(header_of(t, chunks, input, rows), dst);
  if (t.dim() > kMaxDims) throw_too_many_dims(g.rank(), t.dim());
  g.send(t, dst);
}

at::Tensor recv_with_header(ProcessGroup& g, int64_t src, c10::Device device, Header* head) {
  at::Tensor h = at::empty({kHeader}, at::kLong);
  g.recv_(h, src);
  *head = parse_header(h, g.rank(), src);
  at::Tensor t = at::empty(head->sizes, at::TensorOptions().dtype(head->dtype).device(device));
  g.recv_(t, src);
  return t;
}

// Tells apart the groups of tied parameters made by each distribute of this process (every rank
// distributes the same pipelines in the same order).
int64_t next_tied_tag() {
  static std::atomic<int64_t> next{0};
  return next++;
}

// The CPU generator's state travels with the activations (see PipelineImpl::forward).
at::Tensor random_state() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_random_state(const at::Tensor& state) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// A new stream, drawn from the current one.
void reseed_random() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  auto* cpu = at::check_generator<at::CPUGeneratorImpl>(gen);
  cpu->set_current_seed(cpu->random64());
}

// The last stage's `out` (and, with `state`, its CPU generator state) on every rank of the
// pipeline's group. A defined `failed` (the last stage's, from joined()) is broadcast instead
// and fails every rank with its error.
at::Tensor from_last_stage(ProcessGroup& g, at::Tensor out, int64_t chunks, c10::Device device,
                           const at::Tensor& state_like, bool state = true,
                           const at::Tensor& failed = {}) {
  at::NoGradGuard no_grad;
  const int64_t last = g.world_size() - 1;
  const bool is_last = g.rank() == last;
  at::Tensor h = !is_last           ? at::empty({kHeader}, at::kLong)
                 : failed.defined() ? failed
                                    : header_of(out, chunks);
  g.broadcast_(h, last);
  if (is_last && failed.defined()) parse_header(h, last, last);  // throws
  if (is_last && out.dim() > kMaxDims) throw_too_many_dims(last, out.dim());
  if (!is_last) {
    const Header head = parse_header(h, g.rank(), last);
    out = at::empty(head.sizes, at::TensorOptions().dtype(head.dtype).device(device));
  }
  g.broadcast_(out, last);
  if (!state) return out;
  at::Tensor s = is_last ? random_state() : at::empty_like(state_like);
  g.broadcast_(s, last);
  if (!is_last) set_random_state(s);
  return out;
}

// Micro-batch i's input to this stage: on stage 0 its own piece (each after the first on a new
// random stream, drawn from the current one), elsewhere what the stage before sent, whose header
// tells the micro-batch count and what stage 0's input needs, the generator going on from the
// state the sender ended in (see PipelineImpl::forward).
at::Tensor micro_batch_in(ProcessGroup& g, int64_t i, const std::vector<at::Tensor>& pieces,
                          c10::Device device, const at::Tensor& state_like, int64_t* chunks,
                          InputGrad* input_grad, int64_t* rows) {
  const int64_t stage = g.rank();
  if (stage == 0) {
    if (i > 0) reseed_random();
    *rows = pieces[i].size(0);
    return pieces[i];
  }
  Header head;
  at::Tensor xi = recv_with_header(g, stage - 1, device, &head);
  VOLT_CHECK(i == 0 || head.chunks == *chunks, DistributedError, kTag, " rank ", stage,
             " was told of ", head.chunks, " micro-batches after ", *chunks,
             "; every rank must run the same model and code.");
  *chunks = head.chunks;
  *input_grad = head.input;
  *rows = head.rows;
  at::Tensor state = at::empty_like(state_like);
  g.recv_(state, stage - 1);
  set_random_state(state);
  return xi;
}

// Stage 0's batch, detached (needing a gradient when `x` does and the forward records one: its
// gradient then goes to every rank), and its micro-batches: `chunks` of them (fewer only when the
// batch has fewer rows), their sizes differing by at most one row, as torch.distributed.pipelining
// cuts (tensor_split; `chunk` gave 6 rows at 4 chunks 3 micro-batches of 2).
std::vector<at::Tensor> cut_input(const at::Tensor& x, bool graph, int64_t chunks,
                                  at::Tensor* input, InputGrad* input_grad) {
  VOLT_CHECK(x.dim() >= 1 && x.size(0) >= 1, ValueError, kTag,
             " the input needs a batch dimension with at least one row, got ", x.sizes(), ".");
  *input = x.detach();
  if (graph && x.requires_grad()) {
    input->requires_grad_(true);
    *input_grad = {x.numel(), x.scalar_type()};
  }
  return input->tensor_split(std::min(chunks, input->size(0)), 0);
}

// Whether an activation a stage receives can take a gradient (autograd's rule: floating or
// complex). Integer ones (token ids) cross without: the stage sends zeros back, unused.
bool takes_gradient(const at::Tensor& x) {
  return x.is_floating_point() || x.is_complex();
}

// Whether this rank's `x` takes stage 0's input gradient: both need one (and `x` must then be
// what stage 0's input was).
bool takes_input_grad(const at::Tensor& x, const InputGrad& input_grad, int64_t stage) {
  if (!x.requires_grad() || input_grad.numel < 0) return false;
  VOLT_CHECK(x.numel() == input_grad.numel && x.scalar_type() == input_grad.dtype, ValueError, kTag,
             " rank ", stage, "'s input (", x.sizes(), ", ", x.scalar_type(),
             ") is not stage 0's (", input_grad.numel, " elements, ", input_grad.dtype,
             "), and both need its gradient; every rank must compute the pipeline's input with "
             "the same code.");
  return true;
}

// Stage 0's input gradient, flat, on every rank (undefined when that input needs none): it
// exists on stage 0 only, and every rank computed its input alike (the same code before the
// pipeline), so every rank takes it: one broadcast.
at::Tensor input_grad_everywhere(ProcessGroup& g, const at::Tensor& input,
                                 const InputGrad& input_grad, c10::Device device) {
  if (input_grad.numel < 0) return {};
  at::Tensor gx;
  if (g.rank() == 0) {
    const at::Tensor& grad = input.grad();
    gx = (grad.defined() ? grad : at::zeros_like(input)).reshape({-1}).contiguous();
  } else {
    gx = at::empty({input_grad.numel}, at::TensorOptions().dtype(input_grad.dtype).device(device));
  }
  g.broadcast_(gx, 0);
  return gx;
}

// The tied parameters this stage holds that need a gradient (alike on every holder), with the
// group of the stages holding each.
void held_tied(const std::vector<at::Tensor>& all,
               const std::vector<std::shared_ptr<ProcessGroup>>& all_groups,
               std::vector<at::Tensor>* tied, std::vector<std::shared_ptr<ProcessGroup>>* groups) {
  for (size_t k = 0; k < all.size(); ++k) {
    if (all_groups[k] == nullptr || !all[k].requires_grad()) continue;
    tied->push_back(all[k]);
    groups->push_back(all_groups[k]);
  }
}

// The last stage's micro-batch outputs as one batch (a copy: the caller may write it), joined
// along dim 0. With several, each must hold its micro-batch's `rows` there, or the same multiple
// of them (an output flattened to [rows * T, V]), with micro-batch 0's other sizes and dtype (a
// 0-dim output made at::cat throw on the last rank alone; a sequence-first one was joined along
// its sequence): else returns an undefined tensor and sets `failed` to the header that fails
// every rank.
at::Tensor joined(const std::vector<at::Tensor>& outputs, const std::vector<int64_t>& rows,
                  at::Tensor* failed) {
  if (outputs.size() == 1) return outputs[0].clone();
  const auto fail = [&](int64_t code, int64_t a1, int64_t a2, int64_t a3) {
    *failed = at::full({kHeader}, -1, at::kLong);
    auto a = failed->accessor<int64_t, 1>();
    a[0] = code;
    a[1] = a1;
    a[2] = a2;
    a[3] = a3;
    return at::Tensor();
  };
  const at::Tensor& first = outputs[0];
  int64_t per_row = 0;  // output rows per batch row
  for (size_t i = 0; i < outputs.size(); ++i) {
    const at::Tensor& o = outputs[i];
    const int64_t n = o.dim() >= 1 ? o.size(0) : 0;
    if (i == 0 && rows[i] >= 1 && n >= rows[i] && n % rows[i] == 0) per_row = n / rows[i];
    if (per_row == 0 || n != per_row * rows[i]) return fail(kNoBatchRows, o.dim(), n, rows[i]);
    if (o.scalar_type() != first.scalar_type() || o.dim() != first.dim() ||
        o.sizes().slice(1) != first.sizes().slice(1)) {
      return fail(kNotJoinable, static_cast<int64_t>(i), 0, 0);
    }
  }
  return at::cat(outputs, 0);
}

// One forward's micro-batches on this stage, kept for its backward.
struct Flight {
  std::shared_ptr<ProcessGroup> group;
  int64_t stage = 0;
  int64_t stages = 1;
  at::Tensor input;                  // stage 0: the detached batch its micro-batches slice
  std::vector<at::Tensor> inputs;    // per micro-batch: what this stage's layers took ...
  std::vector<at::Tensor> outputs;   // ... and gave (with their graphs)
  InputGrad input_grad;              // stage 0's input: its gradient goes to every rank
  std::vector<int64_t> input_sizes;  // this rank's input, when it takes that gradient
  c10::Device device = at::kCPU;
  // Parameters this stage shares with others (those needing a gradient) and the group of the
  // stages holding each: the backward sums their gradients over those stages.
  std::vector<at::Tensor> tied;
  std::vector<std::shared_ptr<ProcessGroup>> tied_groups;
  bool backward_ran = false;  // the micro-batches are freed by the first
};

// The gradients of the tied parameters this stage holds: this backward's part on each holding
// stage (what it added to the gradient) summed over the stages that hold it, so each has the
// whole gradient. One all-reduce per group of holders, taken in the order of the pipeline's
// tied parameters on every member (alike on every rank: the same model), so no two members wait
// on different groups.
void sum_tied_gradients(const std::vector<at::Tensor>& tied,
                        const std::vector<std::shared_ptr<ProcessGroup>>& groups,
                        const std::vector<at::Tensor>& before) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> parts;
  for (size_t k = 0; k < tied.size(); ++k) {
    const at::Tensor& g = tied[k].grad();
    if (!g.defined()) {
      parts.push_back(at::zeros_like(tied[k]));
    } else {
      parts.push_back(before[k].defined() ? g - before[k] : g.clone());
    }
  }
  std::vector<bool> done(tied.size(), false);
  for (size_t k = 0; k < tied.size(); ++k) {
    if (done[k]) continue;
    std::vector<at::Tensor> same_group;
    for (size_t j = k; j < tied.size(); ++j) {
      if (groups[j] != groups[k]) continue;
      same_group.push_back(parts[j]);
      done[j] = true;
    }
    groups[k]->all_reduce_(same_group, Reduce::kSum);
  }
  for (size_t k = 0; k < tied.size(); ++k) {
    at::Tensor& g = tied[k].mutable_grad();
    if (!g.defined()) {
      g = parts[k];
    } else if (before[k].defined()) {
      g.copy_(before[k] + parts[k]);  // in place: whoever holds the gradient keeps seeing it
    } else {
      g.copy_(parts[k]);
    }
  }
}

class PipelineBackward : public torch::autograd::Node {
 public:
  explicit PipelineBackward(std::shared_ptr<Flight> flight) : flight_(std::move(flight)) {}

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    Flight& f = *flight_;
    // Each stage's backward is an ordinary one that accumulates into .grad (as volt::checkpoint's
    // recomputation): under grad() or backward(inputs) every rank refuses here, before any
    // transfer, instead of writing gradients no one asked for.
    VOLT_CHECK(torch::autograd::Engine::get_default_engine().is_checkpoint_valid(), ValueError,
               kTag,
               " a backward through a pipeline computes gradients for every leaf; "
               "torch::autograd::grad() and backward(inputs) are not supported. Call backward() "
               "without inputs.");
    VOLT_CHECK(!f.backward_ran, ValueError, kTag,
               " a second backward through the same forward; the pipeline frees its micro-batches "
               "after the first (retain_graph is not supported): run the forward again.");
    f.backward_ran = true;
    ProcessGroup& g = *f.group;
    const int64_t last = f.stages - 1;
    const int64_t n = static_cast<int64_t>(f.outputs.size());
    std::vector<at::Tensor> tied_before;  // what the tied gradients held before this backward
    for (size_t k = 0; k < f.tied.size(); ++k) {
      const at::Tensor& grad = f.tied[k].grad();
      tied_before.push_back(grad.defined() ? grad.detach().clone() : at::Tensor());
    }
    // Only the last stage's gradient of the output counts: every rank computed the same loss from
    // the same broadcast output, and the last stage's layers made it.
    std::vector<at::Tensor> from_loss;
    if (f.stage == last) {
      std::vector<int64_t> rows;
      for (const auto& y : f.outputs) rows.push_back(y.size(0));
      std::vector<int64_t> shape = f.outputs[0].sizes().vec();
      shape[0] = std::accumulate(rows.begin(), rows.end(), int64_t{0});
      const at::Tensor whole =
          grads[0].defined() ? grads[0] : at::zeros(shape, f.outputs[0].options());
      from_loss = whole.split_with_sizes(rows, 0);
    }
    for (int64_t i = n - 1; i >= 0; --i) {
      const at::Tensor& y = f.outputs[i];
      at::Tensor gy;
      if (f.stage == last) {
        gy = from_loss[i].contiguous();
      } else {
        gy = at::empty(y.sizes(), y.options().requires_grad(false));
        g.recv_(gy, f.stage + 1);
      }
      if (y.requires_grad()) torch::autograd::backward({y}, {gy});
      if (f.stage > 0) {
        const at::Tensor& x = f.inputs[i];
        const at::Tensor gx = x.grad().defined() ? x.grad() : at::zeros_like(x);
        g.send(gx, f.stage - 1);
      }
      // Done with this micro-batch: its activations (and input gradient) go now, not when the
      // whole backward ends.
      f.inputs[i] = at::Tensor();
      f.outputs[i] = at::Tensor();
    }
    const at::Tensor gx = input_grad_everywhere(g, f.input, f.input_grad, f.device);
    if (!f.tied.empty()) sum_tied_gradients(f.tied, f.tied_groups, tied_before);
    f.inputs.clear();
    f.outputs.clear();
    f.input = at::Tensor();
    if (next_edges().empty()) return {};
    return {gx.view(f.input_sizes)};
  }
  std::string name() const override { return "volt::PipelineBackward"; }

 private:
  std::shared_ptr<Flight> flight_;
};

// The gradients forward_loss's schedule computed with a gradient of 1, held until the returned
// loss's backward: it adds them, scaled by the gradient the loss receives, to the parameters'
// gradients (and hands the input its part), as a backward through forward() would have.
class PipelineLossBackward : public torch::autograd::Node {
 public:
  PipelineLossBackward(std::vector<at::Tensor> params, std::vector<at::Tensor> grads,
                       at::Tensor input_grad, std::vector<int64_t> input_sizes)
      : params_(std::move(params)),
        grads_(std::move(grads)),
        input_grad_(std::move(input_grad)),
        input_sizes_(std::move(input_sizes)) {}

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    VOLT_CHECK(!done_, ValueError, kTag,
               " a second backward through the same forward_loss; its gradients were given to "
               "the parameters by the first (retain_graph is not supported): run it again.");
    done_ = true;
    at::NoGradGuard no_grad;
    // No gradient reached the loss: nothing changes.
    const at::Tensor seed = grads[0].defined() ? grads[0].detach() : at::Tensor();
    if (seed.defined()) {
      for (size_t k = 0; k < params_.size(); ++k) {
        if (!grads_[k].defined()) continue;
        at::Tensor part = grads_[k].mul_(seed);
        at::Tensor& g = params_[k].mutable_grad();
        if (g.defined()) {
          g.add_(part);  // in place, as autograd accumulates: whoever holds it keeps seeing it
        } else {
          g = part;
        }
      }
    }
    params_.clear();
    grads_.clear();
    at::Tensor gx = std::move(input_grad_);
    if (next_edges().empty()) return {};
    if (!seed.defined()) return {at::Tensor()};
    return {gx.mul_(seed).view(input_sizes_)};
  }
  std::string name() const override { return "volt::PipelineLossBackward"; }

 private:
  std::vector<at::Tensor> params_, grads_;  // a parameter, and what the schedule gave it
  at::Tensor input_grad_;                   // stage 0's input's, flat; undefined: none
  std::vector<int64_t> input_sizes_;
  bool done_ = false;
};

// The leaf tensors `root`'s graph accumulates gradients into, short of `stop`'s graph.
std::vector<at::Tensor> graph_leaves(const at::Tensor& root, const at::Tensor& stop) {
  std::vector<at::Tensor> out;
  std::vector<torch::autograd::Node*> todo{root.grad_fn().get()};
  std::unordered_set<torch::autograd::Node*> seen{stop.grad_fn().get()};
  while (!todo.empty()) {
    torch::autograd::Node* n = todo.back();
    todo.pop_back();
    if (n == nullptr || !seen.insert(n).second) continue;
    if (auto* acc = dynamic_cast<torch::autograd::AccumulateGrad*>(n)) out.push_back(acc->variable);
    for (const auto& e : n->next_edges()) todo.push_back(e.function.get());
  }
  return out;
}

// A BatchNorm entry of a stage under deferred_batch_norm: the mean and sum of squared
// deviations of every value it normalised in this forward, per channel (in double, combined
// micro-batch by micro-batch as Chan, Golub and LeVeque's pairwise update).
struct DeferredNorm {
  torch::nn::Module* module = nullptr;
  // The module's members its forward reads for the running statistics.
  at::Tensor* running_mean = nullptr;
  at::Tensor* running_var = nullptr;
  at::Tensor* num_batches_tracked = nullptr;
  c10::optional<double> momentum;
  int64_t count = 0;  // values per channel so far
  at::Tensor mean, m2;
};

template <class Impl>
bool as_norm(torch::nn::Module& m, DeferredNorm* out) {
  auto* bn = dynamic_cast<Impl*>(&m);
  if (bn == nullptr) return false;
  if (out != nullptr) {
    out->module = bn;
    out->running_mean = &bn->running_mean;
    out->running_var = &bn->running_var;
    out->num_batches_tracked = &bn->num_batches_tracked;
    out->momentum = bn->options.momentum();
  }
  return true;
}

bool as_batch_norm(torch::nn::Module& m, DeferredNorm* out = nullptr) {
  return as_norm<torch::nn::BatchNorm1dImpl>(m, out) ||
         as_norm<torch::nn::BatchNorm2dImpl>(m, out) || as_norm<torch::nn::BatchNorm3dImpl>(m, out);
}

// The norm's own forward with its running statistics out of reach (as track_running_stats=false
// has them): it normalises `x` by `x`'s statistics, moving nothing; those are added to `n`.
at::Tensor normalise_deferred(DeferredNorm& n, torch::nn::AnyModule& entry, const at::Tensor& x) {
  at::Tensor y;
  {
    at::Tensor mean = std::exchange(*n.running_mean, at::Tensor());
    at::Tensor var = std::exchange(*n.running_var, at::Tensor());
    at::Tensor tracked = std::exchange(*n.num_batches_tracked, at::Tensor());
    struct PutBack {
      DeferredNorm& n;
      at::Tensor &mean, &var, &tracked;
      ~PutBack() {
        *n.running_mean = std::move(mean);
        *n.running_var = std::move(var);
        *n.num_batches_tracked = std::move(tracked);
      }
    } put_back{n, mean, var, tracked};
    y = entry.forward(x);
  }
  at::NoGradGuard no_grad;
  // Two passes in double (the mean, then the squared deviations from it): exact to double and
  // about 10x faster than at::var_mean over the batch dimension, which libtorch 1.13 runs as a
  // scalar Welford loop (200-300 us for a [16-32, 1024] micro-batch, against 17-23 us for the
  // BatchNorm itself; PERFORMANCE.md "Deferred BatchNorm").
  const at::Tensor v = x.detach().to(at::kDouble);
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < v.dim(); ++d) dims.push_back(d);
  const at::Tensor mean_kept = v.mean(dims, /*keepdim=*/true);
  const at::Tensor m2 = (v - mean_kept).square_().sum(dims);
  const at::Tensor mean = mean_kept.flatten();
  const int64_t count = v.numel() / v.size(1);
  if (n.count == 0) {
    n.mean = mean;
    n.m2 = m2;
  } else {
    const auto total = static_cast<double>(n.count + count);
    const at::Tensor delta = mean - n.mean;
    n.m2 = n.m2 + m2 + delta * delta * (static_cast<double>(n.count) * count / total);
    n.mean = n.mean + delta * (count / total);
  }
  n.count += count;
  return y;
}

// The running statistics move once, by what the whole batch gave, as libtorch's BatchNorm moves
// them (the momentum, or 1 / batches tracked without one; the unbiased variance).
void commit_deferred(DeferredNorm& n) {
  if (n.count == 0) return;
  at::NoGradGuard no_grad;
  double factor = n.momentum.value_or(0.0);
  if (n.num_batches_tracked->defined()) {
    n.num_batches_tracked->add_(1);
    if (!n.momentum) factor = 1.0 / n.num_batches_tracked->item<double>();
  }
  const at::Tensor var = n.m2 / static_cast<double>(std::max<int64_t>(n.count - 1, 1));
  at::Tensor& rm = *n.running_mean;
  at::Tensor& rv = *n.running_var;
  rm.copy_(rm.to(at::kDouble) * (1 - factor) + n.mean * factor);
  rv.copy_(rv.to(at::kDouble) * (1 - factor) + var * factor);
}

}  // namespace

struct PipelineImpl::DeferredNorms {
  std::map<int64_t, DeferredNorm> norms;  // by layer index
};

bool is_checkpoint_mode(const std::string& mode) {
  return mode == "never" || mode == "always" || mode == "except_last";
}

std::ostream& operator<<(std::ostream& os, const PipelineOptions& o) {
  os << "PipelineOptions(chunks=" << o.chunks() << ", balance=[";
  for (size_t i = 0; i < o.balance().size(); ++i) os << (i ? ", " : "") << o.balance()[i];
  return os << "], partition_method=" << o.partition_method() << ", checkpoint=" << o.checkpoint()
            << ", activation_checkpoint_interval=" << o.activation_checkpoint_interval()
            << ", deferred_batch_norm=" << (o.deferred_batch_norm() ? "true" : "false") << ")";
}

std::vector<int64_t> partition_layers(const std::vector<int64_t>& weights, int64_t stages,
                                      const std::vector<int64_t>& balance,
                                      const std::string& method) {
  const auto n = static_cast<int64_t>(weights.size());
  VOLT_CHECK(stages >= 1, ConfigError, kTag, " needs at least one stage, got ", stages, ".");
  VOLT_CHECK(stages <= n, ConfigError, kTag, " ", stages, " stages but only ", n,
             " layers: every stage needs one. Run at most ", n,
             " processes or split the model into more layers.");
  std::vector<int64_t> bounds{0};
  if (!balance.empty()) {
    VOLT_CHECK(static_cast<int64_t>(balance.size()) == stages, ConfigError, kTag, " balance has ",
               balance.size(), " entries for ", stages,
               " stages; give one layer count per stage (process).");
    for (int64_t b : balance) {
      VOLT_CHECK(b >= 1, ConfigError, kTag, " balance entry ", b,
                 " is not a layer count; every stage needs at least one layer.");
      bounds.push_back(bounds.back() + b);
    }
    VOLT_CHECK(bounds.back() == n, ConfigError, kTag, " balance sums to ", bounds.back(),
               " layers but the pipeline has ", n, "; the counts must cover every layer once.");
    return bounds;
  }
  if (method == "uniform") {
    for (int64_t s = 0; s < stages; ++s)
      bounds.push_back(bounds.back() + n / stages + (s < n % stages));
    return bounds;
  }
  VOLT_CHECK(method == "parameters", ConfigError, kTag, " unknown partition_method '", method,
             "'; use \"parameters\" or \"uniform\", or give a balance.");
  // best[k][i]: the smallest largest-run weight of layers [0, i) cut into k runs.
  std::vector<int64_t> prefix{0};
  for (int64_t w : weights) prefix.push_back(prefix.back() + w);
  constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  std::vector<std::vector<int64_t>> best(stages + 1, std::vector<int64_t>(n + 1, kNone));
  std::vector<std::vector<int64_t>> cut(stages + 1, std::vector<int64_t>(n + 1, 0));
  best[0][0] = 0;
  for (int64_t k = 1; k <= stages; ++k) {
    for (int64_t i = k; i <= n - (stages - k); ++i) {
      for (int64_t j = k - 1; j < i; ++j) {
        if (best[k - 1][j] == kNone) continue;
        const int64_t v = std::max(best[k - 1][j], prefix[i] - prefix[j]);
        if (v < best[k][i]) {
          best[k][i] = v;
          cut[k][i] = j;
        }
      }
    }
  }
  std::vector<int64_t> rev{n};
  for (int64_t k = stages, i = n; k > 0; --k) {
    i = cut[k][i];
    rev.push_back(i);
  }
  return {rev.rbegin(), rev.rend()};
}

PipelineImpl::PipelineImpl(torch::nn::Sequential layers, PipelineOptions options)
    : torch::nn::Module("volt::Pipeline"),
      layers_(std::move(layers)),
      options_(std::move(options)) {
  VOLT_CHECK(layers_ && !layers_->is_empty(), ConfigError, kTag,
             " needs a Sequential with at least one layer.");
  set_chunks(options_.chunks());
  set_checkpoint(options_.checkpoint());
  set_activation_checkpoint_interval(options_.activation_checkpoint_interval());
  set_deferred_batch_norm(options_.deferred_batch_norm());
  for (const auto& child : layers_->named_children()) register_module(child.key(), child.value());
  bounds_ = {0, static_cast<int64_t>(layers_->size())};
}

void PipelineImpl::set_chunks(int64_t chunks) {
  VOLT_CHECK(chunks >= 1, ConfigError, kTag,
             " chunks must be at least 1 (the micro-batches per batch), got ", chunks, ".");
  options_.chunks(chunks);
}

void PipelineImpl::set_checkpoint(const std::string& mode) {
  VOLT_CHECK(is_checkpoint_mode(mode), ConfigError, kTag, " checkpoint='", mode,
             "' is not a checkpointing mode; use \"never\", \"always\" or \"except_last\".");
  options_.checkpoint(mode);
}

void PipelineImpl::set_activation_checkpoint_interval(int64_t layers) {
  VOLT_CHECK(layers >= 0, ConfigError, kTag, " activation_checkpoint_interval must be >= 0 (",
             "layers per checkpointed run; 0: off), got ", layers, ".");
  options_.activation_checkpoint_interval(layers);
}

void PipelineImpl::set_deferred_batch_norm(bool on) {
  if (on) {
    for (size_t i = 0; i < layers_->size(); ++i) {
      for (const auto& m : layers_->ptr(i)->named_modules("", /*include_self=*/false)) {
        VOLT_CHECK(!as_batch_norm(*m.value()), ConfigError, kTag,
                   " deferred_batch_norm reaches the BatchNorm layers that are entries of the "
                   "pipeline's Sequential, but ",
                   m.value()->name(), " '", i, ".", m.key(), "' is called by layer ", i,
                   "'s own code, which the pipeline cannot reach: make it an entry of the "
                   "Sequential (layer ",
                   i, "'s parts as entries of their own), or leave deferred_batch_norm off.");
      }
    }
  }
  options_.deferred_batch_norm(on);
}

void PipelineImpl::distribute(std::shared_ptr<ProcessGroup> group) {
  VOLT_CHECK(group != nullptr, ValueError, kTag, " distribute() needs a process group.");
  std::vector<int64_t> weights;
  for (const auto& layer : layers_->children()) {
    int64_t w = 0;
    for (const auto& p : layer->parameters(true)) w += p.numel();
    weights.push_back(w);
  }
  std::vector<int64_t> bounds = partition_layers(weights, group->world_size(), options_.balance(),
                                                 options_.partition_method());
  // Parameters that layers of several stages share (tied weights) are trained by each of those
  // stages (the backward sums their gradients). A shared buffer (running statistics) would be
  // updated by each stage apart: every rank finds the same and fails alike, before any transfer.
  std::unordered_map<const c10::TensorImpl*, std::vector<int64_t>> holders;  // ascending stages
  std::unordered_map<const c10::TensorImpl*, std::pair<int64_t, std::string>> buffer_user;
  std::vector<at::Tensor> params;  // each once, in order of first use
  for (int64_t s = 0; s + 1 < static_cast<int64_t>(bounds.size()); ++s) {
    for (int64_t i = bounds[s]; i < bounds[s + 1]; ++i) {
      for (const auto& p : layers_->ptr(i)->parameters(true)) {
        auto [it, first] = holders.emplace(p.unsafeGetTensorImpl(), std::vector<int64_t>{});
        if (first) params.push_back(p);
        if (it->second.empty() || it->second.back() != s) it->second.push_back(s);
      }
      for (const auto& b : layers_->ptr(i)->named_buffers(true)) {
        if (!b.value().defined()) continue;
        const std::string name = std::to_string(i) + "." + b.key();
        auto [it, first] =
            buffer_user.emplace(b.value().unsafeGetTensorImpl(), std::make_pair(s, name));
        VOLT_CHECK(first || it->second.first == s, ConfigError, kTag, " layers ", it->second.second,
                   " (stage ", it->second.first, ") and ", name, " (stage ", s,
                   ") share one buffer, which each stage would update apart: put the layers "
                   "that share it in one stage (balance).");
      }
    }
  }
  const auto stages = static_cast<int64_t>(bounds.size()) - 1;
  bounds_ = std::move(bounds);
  stage_ = group->rank();
  group_ = std::move(group);
  tied_.clear();
  tied_groups_.clear();
  // Each set of stages that share parameters sums their gradients in a group of its own, so the
  // other stages take no part (the whole pipeline's group when every stage holds them). The
  // groups are made in the order of the parameters' first use, alike on every rank; the tag
  // tells them apart from those of another distribute on the same store.
  std::map<std::vector<int64_t>, std::shared_ptr<ProcessGroup>> groups;
  const std::string tag = "pipeline_tied_" + std::to_string(next_tied_tag());
  for (const auto& p : params) {
    const std::vector<int64_t>& h = holders[p.unsafeGetTensorImpl()];
    if (h.size() < 2) continue;
    tied_.push_back(p);
    std::shared_ptr<ProcessGroup> g;
    if (std::find(h.begin(), h.end(), stage_) != h.end()) {
      auto it = groups.find(h);
      if (it == groups.end()) {
        g = static_cast<int64_t>(h.size()) == stages ? group_ : group_->new_group(h, tag);
        groups.emplace(h, g);
      } else {
        g = it->second;
      }
    }
    tied_groups_.push_back(g);
  }
}

void PipelineImpl::undistribute() {
  restore_other_stages();  // with unset values unless gather() ran
  group_.reset();
  tied_.clear();
  tied_groups_.clear();
  stage_ = 0;
  bounds_ = {0, static_cast<int64_t>(layers_->size())};
}

std::pair<int64_t, int64_t> PipelineImpl::stage_layers(int64_t stage) const {
  VOLT_CHECK(stage >= 0 && stage < num_stages(), ValueError, kTag, " stage ", stage,
             " does not exist; the pipeline has ", num_stages(), ".");
  return {bounds_[stage], bounds_[stage + 1]};
}

std::vector<at::Tensor> PipelineImpl::stage_parameters(int64_t stage) const {
  const auto [first, last] = stage_layers(stage);
  std::vector<at::Tensor> out;
  for (int64_t i = first; i < last; ++i) {
    for (const auto& p : layers_->ptr(i)->parameters(true)) out.push_back(p);
  }
  return out;
}

std::vector<at::Tensor> PipelineImpl::foreign_parameters() const {
  std::vector<at::Tensor> out;
  if (!distributed()) return out;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& p : stage_parameters(stage_)) seen.insert(p.unsafeGetTensorImpl());
  for (int64_t s = 0; s < num_stages(); ++s) {
    if (s == stage_) continue;
    for (auto& p : stage_parameters(s)) {
      if (seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(p);
    }
  }
  return out;
}

std::vector<at::Tensor> PipelineImpl::stage_state(int64_t stage) const {
  std::vector<at::Tensor> out = stage_parameters(stage);
  const auto [first, last] = stage_layers(stage);
  for (int64_t i = first; i < last; ++i) {
    for (const auto& b : layers_->ptr(i)->buffers(true)) {
      if (b.defined()) out.push_back(b);
    }
  }
  return out;
}

void PipelineImpl::release_other_stages() {
  if (!distributed() || released()) return;
  at::NoGradGuard no_grad;
  // This stage's tensors stay (a tied weight is its too), and each is freed once.
  std::unordered_set<const c10::TensorImpl*> kept;
  for (const auto& t : stage_state(stage_)) kept.insert(t.unsafeGetTensorImpl());
  for (int64_t s = 0; s < num_stages(); ++s) {
    if (s == stage_) continue;
    for (auto& t : stage_state(s)) {
      if (!kept.insert(t.unsafeGetTensorImpl()).second) continue;
      released_.emplace_back(t, t.sizes().vec());
      t.set_data(at::empty({0}, t.options()));
    }
  }
}

void PipelineImpl::restore_other_stages() {
  at::NoGradGuard no_grad;
  for (auto& [t, shape] : released_) t.set_data(at::zeros(shape, t.options()));
  released_.clear();
}

std::vector<int64_t> PipelineImpl::whole_shape(const at::Tensor& t) const {
  for (const auto& [r, shape] : released_) {
    if (r.is_same(t)) return shape;
  }
  return t.sizes().vec();
}

void PipelineImpl::gather() {
  if (!distributed()) return;
  restore_other_stages();
  at::NoGradGuard no_grad;
  for (int64_t s = 0; s < num_stages(); ++s) {
    std::vector<at::Tensor> state = stage_state(s);
    if (!state.empty()) group_->broadcast_(state, s);
  }
}

std::vector<at::Tensor> PipelineImpl::gather_beside(const std::vector<at::Tensor>& tensors,
                                                    std::vector<at::Tensor> values,
                                                    int64_t dst) const {
  VOLT_CHECK(tensors.size() == values.size(), ValueError, kTag, " gather_beside got ",
             tensors.size(), " tensors but ", values.size(), " values; give one value each.");
  if (!distributed()) return values;
  VOLT_CHECK(dst >= -1 && dst < num_stages(), ValueError, kTag, " gather_beside got dst=", dst,
             " for a pipeline of ", num_stages(), " stages; give a stage's rank, or -1 for all.");
  std::unordered_map<const c10::TensorImpl*, std::vector<size_t>> at_tensor;
  for (size_t i = 0; i < tensors.size(); ++i) {
    at_tensor[tensors[i].unsafeGetTensorImpl()].push_back(i);
  }
  at::NoGradGuard no_grad;
  if (dst >= 0) {
    // Each entry from the first stage holding its tensor (a tied one is in several), sent to
    // `dst` alone; `dst`'s own stage's entries are already there.
    std::unordered_set<const c10::TensorImpl*> listed;
    for (int64_t s = 0; s < num_stages(); ++s) {
      for (const auto& t : stage_state(s)) {
        if (!listed.insert(t.unsafeGetTensorImpl()).second || s == dst) continue;
        auto it = at_tensor.find(t.unsafeGetTensorImpl());
        if (it == at_tensor.end()) continue;
        for (size_t i : it->second) {
          if (stage_ == s) {
            group_->send(values[i].contiguous(), dst);
          } else if (stage_ == dst) {
            at::Tensor whole = at::empty(whole_shape(t), values[i].options());
            group_->recv_(whole, s);
            values[i] = whole;
          }
        }
      }
    }
    return values;
  }
  for (int64_t s = 0; s < num_stages(); ++s) {
    std::vector<at::Tensor> part;
    for (const auto& t : stage_state(s)) {
      auto it = at_tensor.find(t.unsafeGetTensorImpl());
      if (it == at_tensor.end()) continue;
      for (size_t i : it->second) {
        if (s != stage_) values[i] = at::zeros(whole_shape(t), values[i].options());
        part.push_back(values[i]);
      }
    }
    if (!part.empty()) group_->broadcast_(part, s);
  }
  return values;
}

at::Tensor PipelineImpl::run_layers(int64_t first, int64_t last, at::Tensor x,
                                    DeferredNorms* deferred) {
  for (int64_t i = first; i < last; ++i) {
    torch::nn::AnyModule& entry = *(layers_->begin() + i);
    DeferredNorm* norm = nullptr;
    if (deferred != nullptr) {
      auto it = deferred->norms.find(i);
      if (it != deferred->norms.end()) norm = &it->second;
    }
    x = norm != nullptr ? normalise_deferred(*norm, entry, x) : entry.forward(x);
  }
  return x;
}

at::Tensor PipelineImpl::run_stage(int64_t first, int64_t last, const at::Tensor& x, bool whole,
                                   DeferredNorms* deferred) {
  const int64_t every = whole ? last - first : options_.activation_checkpoint_interval();
  if (every <= 0 || !c10::GradMode::is_enabled()) return run_layers(first, last, x, deferred);
  at::Tensor y = x;
  for (int64_t begin = first; begin < last; begin += every) {
    const int64_t end = std::min(last, begin + every);
    // `deferred` lives through this forward only: the recomputation in backward runs the norms
    // plainly (their statistics put back as every buffer's) and adds nothing.
    auto first_call = std::make_shared<bool>(true);
    y = detail::checkpoint_impl(
        [this, begin, end, deferred, first_call](const std::vector<at::Tensor>& in) {
          std::vector<const torch::nn::Module*> layers;
          for (int64_t i = begin; i < end; ++i) layers.push_back(layers_->ptr(i).get());
          detail::RecomputeKeepsBuffers keep(layers);  // BatchNorm's statistics move once
          DeferredNorms* adds = *first_call ? deferred : nullptr;
          *first_call = false;
          return std::vector<at::Tensor>{run_layers(begin, end, in[0], adds)};
        },
        {y}, checkpoint_defaults())[0];
  }
  return y;
}

void PipelineImpl::collect_deferred(int64_t first, int64_t last, DeferredNorms* out) {
  if (!options_.deferred_batch_norm()) return;
  for (int64_t i = first; i < last; ++i) {
    DeferredNorm n;
    if (as_batch_norm(*layers_->ptr(i), &n) && n.module->is_training() &&
        n.running_mean->defined()) {
      out->norms.emplace(i, n);
    }
  }
}

// GPipe's checkpointing: the last micro-batch's backward comes right after its forward.
bool PipelineImpl::checkpointed(int64_t i, int64_t chunks) const {
  return options_.checkpoint() == "always" ||
         (options_.checkpoint() == "except_last" && i + 1 < chunks);
}

at::Tensor PipelineImpl::forward(const at::Tensor& x) {
  if (!distributed() || num_stages() == 1) {
    return run_stage(0, static_cast<int64_t>(layers_->size()), x, options_.checkpoint() == "always",
                     nullptr);
  }
  ProcessGroup& g = *group_;
  const int64_t last = num_stages() - 1;
  const auto [first, end] = stage_layers(stage_);
  const bool graph = c10::GradMode::is_enabled();
  auto flight = std::make_shared<Flight>();
  flight->group = group_;
  flight->stage = stage_;
  flight->stages = num_stages();

  flight->device = x.device();
  if (graph) held_tied(tied_, tied_groups_, &flight->tied, &flight->tied_groups);
  std::vector<at::Tensor> pieces;
  int64_t chunks = 1;
  if (stage_ == 0) {
    pieces = cut_input(x, graph, options_.chunks(), &flight->input, &flight->input_grad);
    chunks = static_cast<int64_t>(pieces.size());
  }
  // Random layers (dropout) draw as one process running the layers in turn would: the CPU
  // generator's state travels with each micro-batch, so stage s starts micro-batch i where stage
  // s - 1 ended it, and every rank leaves with the last stage's state, so the code after the
  // pipeline draws alike everywhere (with one micro-batch, exactly as one process). Stage 0
  // starts each later micro-batch on a stream drawn from its state, so that its own draws do not
  // repeat those the next stage makes from the state it was sent.
  const at::Tensor state_like = random_state();
  DeferredNorms deferred;
  collect_deferred(first, end, &deferred);
  std::vector<at::Tensor> outputs;
  std::vector<int64_t> output_rows;  // the last stage's: each micro-batch's rows at stage 0
  for (int64_t i = 0; i < chunks; ++i) {
    int64_t rows = -1;
    at::Tensor xi =
        micro_batch_in(g, i, pieces, x.device(), state_like, &chunks, &flight->input_grad, &rows);
    // An integer activation (token ids) takes no gradient: nothing flows back through it.
    if (graph && stage_ > 0 && takes_gradient(xi)) xi.requires_grad_(true);
    // One micro-batch is the whole batch: the norms move their statistics themselves.
    at::Tensor yi = run_stage(first, end, xi, checkpointed(i, chunks),
                              chunks > 1 && !deferred.norms.empty() ? &deferred : nullptr);
    if (stage_ < last) {
      send_with_header(g, yi, chunks, flight->input_grad, rows, stage_ + 1);
      g.send(random_state(), stage_ + 1);
    }
    if (graph) {
      flight->inputs.push_back(xi);
      flight->outputs.push_back(yi);
    }
    if (stage_ == last) {
      outputs.push_back(yi.detach());
      output_rows.push_back(rows);
    }
  }
  if (chunks > 1) {
    for (auto& [layer, norm] : deferred.norms) commit_deferred(norm);
  }
  // This rank's input takes stage 0's input gradient when both need one.
  const bool takes_grad = graph && takes_input_grad(x, flight->input_grad, stage_);
  if (takes_grad) flight->input_sizes = x.sizes().vec();

  // Every rank gets the last stage's output, so the code after the pipeline runs everywhere.
  at::Tensor out, failed;
  if (stage_ == last) out = joined(outputs, output_rows, &failed);
  out = from_last_stage(g, out, chunks, x.device(), state_like, /*state=*/true, failed);
  if (!graph) return out;
  std::shared_ptr<PipelineBackward> node(new PipelineBackward(flight), torch::autograd::deleteNode);
  if (takes_grad) node->set_next_edges(torch::autograd::collect_next_edges(x));
  torch::autograd::create_gradient_edge(out, node);
  return out;
}

at::Tensor PipelineImpl::forward_loss(const at::Tensor& x, const at::Tensor& target,
                                      const LossFn& loss_fn, at::Tensor* output) {
  VOLT_CHECK(static_cast<bool>(loss_fn), ValueError, kTag,
             " forward_loss got no loss function; pass one giving the loss of an output and its "
             "target (a mean over rows).");
  auto one_element = [](const at::Tensor& loss) {
    VOLT_CHECK(loss.defined() && loss.numel() == 1, ValueError, kTag, " the loss function gave ",
               loss.defined() ? loss.sizes() : at::IntArrayRef{},
               loss.defined() ? "" : " (an undefined tensor)",
               "; it must give one element: reduce the loss (a mean over rows).");
    return loss;
  };
  if (!distributed() || num_stages() == 1 || !c10::GradMode::is_enabled()) {
    const at::Tensor y = forward(x);
    if (output != nullptr) *output = y.detach();
    return one_element(loss_fn(y, target));
  }
  ProcessGroup& g = *group_;
  const int64_t stages = num_stages();
  const int64_t last = stages - 1;
  const auto [first, end] = stage_layers(stage_);
  const c10::Device device = x.device();

  // The schedule backpropagates each micro-batch with a gradient of 1 into this stage's
  // parameters (each once here), whose own gradients wait aside until it is over, whatever
  // happens; the returned loss's backward adds what it gave them, scaled.
  std::vector<at::Tensor> params;
  {
    std::unordered_set<const c10::TensorImpl*> seen;
    for (const auto& p : stage_parameters(stage_)) {
      if (seen.insert(p.unsafeGetTensorImpl()).second) params.push_back(p);
    }
  }
  struct PutBack {
    std::vector<at::Tensor>& params;
    std::vector<at::Tensor> held;
    ~PutBack() {
      for (size_t k = 0; k < held.size(); ++k) params[k].mutable_grad() = std::move(held[k]);
    }
  } put_back{params, {}};
  for (auto& p : params) put_back.held.push_back(std::exchange(p.mutable_grad(), at::Tensor()));

  const at::Tensor state_like = random_state();  // as forward(): the generator travels along
  DeferredNorms deferred;
  collect_deferred(first, end, &deferred);
  at::Tensor input;  // stage 0: the detached batch its micro-batches slice
  InputGrad input_grad;
  std::vector<at::Tensor> pieces;
  int64_t chunks = 1;  // stages after 0 learn it from the first activation
  if (stage_ == 0) {
    pieces = cut_input(x, /*graph=*/true, options_.chunks(), &input, &input_grad);
    chunks = static_cast<int64_t>(pieces.size());
  }
  // Sends run while the stage goes on (two neighbours send to each other at once: activations
  // one way, gradients the other). One is waited for once a message back shows that its receiver
  // got past it, so the tensor it holds is freed; the others at the end.
  std::deque<std::pair<int64_t, ProcessGroup::Transfer>> sent_on, sent_back;
  auto settle = [](std::deque<std::pair<int64_t, ProcessGroup::Transfer>>& sent, int64_t upto) {
    while (!sent.empty() && sent.front().first <= upto) {
      sent.front().second.wait();
      sent.pop_front();
    }
  };
  // The warm-up forwards of `stage`: min(stages - stage - 1, micro-batches) (PipeDream-Flush).
  auto warmup_of = [&](int64_t stage) { return std::min(stages - stage - 1, chunks); };
  struct Held {
    at::Tensor input, output;  // the output is the weighted loss on the last stage
  };
  std::deque<Held> held;             // forwarded, not yet backpropagated, oldest first
  at::Tensor loss_sum;               // the last stage's: the weighted losses so far
  std::vector<at::Tensor> outputs;   // the last stage's, when `output` asks for them
  std::vector<int64_t> output_rows;  // and each one's micro-batch rows at stage 0
  int64_t rows = 0;                  // the last stage's: target rows taken so far
  int64_t forwards = 0, backwards = 0;

  auto forward_one = [&] {
    const int64_t i = forwards++;
    int64_t micro_rows = -1;
    at::Tensor xi =
        micro_batch_in(g, i, pieces, device, state_like, &chunks, &input_grad, &micro_rows);
    if (stage_ > 0) {
      if (takes_gradient(xi)) xi.requires_grad_(true);
      // Stage s - 1 ran this forward after the backwards up to i - warm-up - 1.
      settle(sent_back, i - warmup_of(stage_ - 1) - 1);
    }
    // except_last: the last stage runs each micro-batch's backward right after its forward, so
    // recomputing would buy it nothing.
    const bool whole = stage_ == last ? options_.checkpoint() == "always" : checkpointed(i, chunks);
    at::Tensor yi = run_stage(first, end, xi, whole,
                              chunks > 1 && !deferred.norms.empty() ? &deferred : nullptr);
    if (stage_ < last) {
      if (yi.dim() > kMaxDims) {
        send_with_header(g, yi, chunks, input_grad, micro_rows, stage_ + 1);  // throws
      }
      sent_on.emplace_back(i, g.isend(header_of(yi, chunks, input_grad, micro_rows), stage_ + 1));
      sent_on.emplace_back(i, g.isend(yi, stage_ + 1));
      sent_on.emplace_back(i, g.isend(random_state(), stage_ + 1));
    } else {
      const int64_t n = yi.dim() >= 1 ? yi.size(0) : 0;
      VOLT_CHECK(n >= 1 && target.dim() >= 1 && rows + n <= target.size(0), ValueError, kTag,
                 " the target has ", target.dim() >= 1 ? target.size(0) : 0,
                 " rows, fewer than the pipeline's output of ", rows + n,
                 " so far; forward_loss needs one target row per output row (dim 0).");
      if (output != nullptr) {
        outputs.push_back(yi.detach());
        output_rows.push_back(micro_rows);
      }
      const at::Tensor loss = one_element(loss_fn(yi, target.narrow(0, rows, n)));
      if (i == 0) {
        std::unordered_set<const c10::TensorImpl*> own{xi.unsafeGetTensorImpl()};
        for (const auto& p : params) own.insert(p.unsafeGetTensorImpl());
        for (const auto& leaf : graph_leaves(loss, yi)) {
          VOLT_CHECK(own.count(leaf.unsafeGetTensorImpl()) != 0, ConfigError, kTag,
                     " the loss function uses a tensor that needs a gradient and is not the "
                     "last stage's (",
                     leaf.sizes(),
                     "); it runs on the last stage only, so the other ranks would never train "
                     "it: move that layer into the pipeline, or compute the loss from forward().");
        }
      }
      yi = loss.reshape({}) * (static_cast<double>(n) / static_cast<double>(target.size(0)));
      rows += n;
      loss_sum = loss_sum.defined() ? loss_sum + yi.detach() : yi.detach();
    }
    held.push_back({xi, yi});
  };

  auto backward_one = [&] {
    const int64_t i = backwards++;
    const Held mb = std::move(held.front());
    held.pop_front();
    // These backwards run inside the caller's forward (the training_step, under the precision's
    // autocast), and autograd runs them with the caller's autocast state: out of autocast, as the
    // loss's backward after a plain forward runs, or GEMMs a forward kept in fp32 (the CPU size
    // rule) would differentiate in bf16. Checkpointed layers recompute under the forward's state.
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    if (stage_ == last) {
      if (mb.output.requires_grad()) torch::autograd::backward({mb.output});
    } else {
      at::Tensor gy = at::empty(mb.output.sizes(), mb.output.options().requires_grad(false));
      g.recv_(gy, stage_ + 1);
      // Stage s + 1 runs this backward after the forwards up to i + warm-up.
      settle(sent_on, i + warmup_of(stage_ + 1));
      if (mb.output.requires_grad()) torch::autograd::backward({mb.output}, {gy});
    }
    if (stage_ > 0) {
      const at::Tensor& gx = mb.input.grad();
      sent_back.emplace_back(i, g.isend(gx.defined() ? gx : at::zeros_like(mb.input), stage_ - 1));
    }
  };

  forward_one();  // brings the number of micro-batches to the stages after 0
  const int64_t warmup = warmup_of(stage_);
  static std::atomic<bool> told{false};  // once per process: which schedule runs, and how
  if (!told.exchange(true)) {
    log_info("Pipeline", "stage " + std::to_string(stage_) + " of " + std::to_string(stages) +
                             " runs the 1F1B schedule: " + std::to_string(chunks) +
                             " micro-batches, at most " +
                             std::to_string(std::min(stages - stage_, chunks)) + " held at once");
  }
  while (forwards < warmup) forward_one();
  if (warmup == 0) backward_one();  // the last stage: each backward right after its forward
  while (forwards < chunks) {
    forward_one();
    backward_one();
  }
  while (backwards < chunks) backward_one();
  settle(sent_on, chunks);
  settle(sent_back, chunks);
  VOLT_CHECK(stage_ != last || rows == target.size(0), ValueError, kTag, " the target has ",
             target.size(0), " rows but the pipeline's output ", rows,
             "; forward_loss needs one target row per output row (dim 0).");
  if (chunks > 1) {
    for (auto& [layer, norm] : deferred.norms) commit_deferred(norm);
  }
  std::vector<at::Tensor> tied;
  std::vector<std::shared_ptr<ProcessGroup>> tied_groups;
  held_tied(tied_, tied_groups_, &tied, &tied_groups);
  if (!tied.empty()) sum_tied_gradients(tied, tied_groups, std::vector<at::Tensor>(tied.size()));
  // Stage 0's input gradient goes to every rank (as forward()'s backward gives it).
  const at::Tensor gx = input_grad_everywhere(g, input, input_grad, device);
  const bool takes_grad = takes_input_grad(x, input_grad, stage_);
  if (output != nullptr) {
    // As forward() returns it; the generator state comes with the loss.
    at::Tensor whole, failed;
    if (stage_ == last) whole = joined(outputs, output_rows, &failed);
    *output = from_last_stage(g, whole, chunks, device, state_like, /*state=*/false, failed);
  }
  at::Tensor out = from_last_stage(g, stage_ == last ? loss_sum.clone() : at::Tensor(), chunks,
                                   device, state_like);

  std::vector<at::Tensor> grads;
  for (const auto& p : params) grads.push_back(p.grad());  // put_back restores the held ones
  std::shared_ptr<PipelineLossBackward> node(
      new PipelineLossBackward(params, std::move(grads), takes_grad ? gx : at::Tensor(),
                               takes_grad ? x.sizes().vec() : std::vector<int64_t>{}),
      torch::autograd::deleteNode);
  if (takes_grad) node->set_next_edges(torch::autograd::collect_next_edges(x));
  torch::autograd::create_gradient_edge(out, node);
  return out;
}

void PipelineImpl::pretty_print(std::ostream& stream) const {
  stream << "volt::Pipeline(layers=" << layers_->size() << ", chunks=" << options_.chunks();
  if (options_.checkpoint() != "never") stream << ", checkpoint=" << options_.checkpoint();
  if (options_.activation_checkpoint_interval() > 0)
    stream << ", activation_checkpoint_interval=" << options_.activation_checkpoint_interval();
  if (options_.deferred_batch_norm()) stream << ", deferred_batch_norm";
  if (distributed()) stream << ", stage=" << stage_ << " of " << num_stages();
  stream << ")";
}

}  // namespace volt
