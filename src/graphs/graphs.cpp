#include <c10/core/Layout.h>

#include <functional>
#include <optional>
#include <ostream>
#include <utility>

#include "core/detail/ascii.h"
#include "core/detail/numbers.h"
#include "volt/core/check.h"
#include "volt/core/log.h"
#include "volt/graphs/graph_cache.h"
#include "volt/graphs/graph_options.h"

namespace volt {
namespace {

size_t combine(size_t seed, size_t v) {
  return seed ^ (v + 0x9e3779b97f4a7c15ULL + (seed << 6) + (seed >> 2));
}

// "float", "long", "bfloat16": libtorch's dtype names, lower case.
std::string dtype_name(c10::ScalarType t) {
  return detail::ascii_lower(c10::toString(t));
}

// "float[128, 784]"
std::string describe(const at::Tensor& t) {
  auto os = detail::c_stream<std::ostringstream>();
  os << dtype_name(t.scalar_type()) << t.sizes();
  return os.str();
}

}  // namespace

GraphKey::GraphKey(at::ArrayRef<at::Tensor> inputs, bool training, bool grad_mode,
                   std::string layout)
    : training_(training), grad_mode_(grad_mode), layout_(std::move(layout)) {
  inputs_.reserve(inputs.size());
  hash_ = combine(std::hash<bool>()(training) + 2 * std::hash<bool>()(grad_mode), inputs.size());
  hash_ = combine(hash_, std::hash<std::string>()(layout_));
  for (const at::Tensor& t : inputs) {
    Input in;
    in.defined = t.defined();
    if (in.defined) {
      in.sizes = t.sizes().vec();
      in.dtype = t.scalar_type();
      in.device = t.device();
      in.requires_grad = t.requires_grad();
    }
    hash_ = combine(hash_, in.defined);
    for (int64_t s : in.sizes) hash_ = combine(hash_, std::hash<int64_t>()(s));
    hash_ = combine(hash_, static_cast<size_t>(in.dtype));
    hash_ = combine(hash_, std::hash<c10::Device>()(in.device));
    hash_ = combine(hash_, in.requires_grad);
    inputs_.push_back(std::move(in));
  }
}

bool operator==(const GraphKey& a, const GraphKey& b) {
  if (a.hash_ != b.hash_ || a.training_ != b.training_ || a.grad_mode_ != b.grad_mode_ ||
      a.layout_ != b.layout_ || a.inputs_.size() != b.inputs_.size()) {
    return false;
  }
  for (size_t i = 0; i < a.inputs_.size(); ++i) {
    const GraphKey::Input& x = a.inputs_[i];
    const GraphKey::Input& y = b.inputs_[i];
    if (x.defined != y.defined || x.sizes != y.sizes || x.dtype != y.dtype ||
        x.device != y.device || x.requires_grad != y.requires_grad) {
      return false;
    }
  }
  return true;
}

std::string GraphKey::str() const {
  auto os = detail::c_stream<std::ostringstream>();
  os << (training_ ? "train" : "eval") << (grad_mode_ ? "+grad" : "");
  if (!layout_.empty()) os << '[' << layout_ << ']';
  os << '(';
  for (size_t i = 0; i < inputs_.size(); ++i) {
    const Input& in = inputs_[i];
    if (i > 0) os << ", ";
    if (!in.defined) {
      os << "undefined";
      continue;
    }
    os << dtype_name(in.dtype) << c10::IntArrayRef(in.sizes) << ' ' << in.device;
    if (in.requires_grad) os << " grad";
  }
  os << ')';
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const GraphKey& key) {
  return os << key.str();
}

std::ostream& operator<<(std::ostream& os, const GraphCacheStats& s) {
  return os << "GraphCacheStats(hits=" << s.hits << ", misses=" << s.misses
            << ", evictions=" << s.evictions << ")";
}

namespace detail {

void check_max_graphs(int64_t max_graphs, const std::string& name) {
  VOLT_CHECK(max_graphs >= 1, ConfigError, "[Graphs] ", name, ": max_graphs=", max_graphs,
             " must be >= 1; it is how many captured graphs (one per input signature) are kept.");
}

void throw_no_graph(const std::string& name, const GraphKey& key) {
  throw ValueError("[Graphs] " + name + ": the capture function returned no graph for " +
                   key.str() + "; return the captured graph (a non-null std::unique_ptr).");
}

void log_first_eviction(const std::string& name, const GraphKey& key, int64_t max_graphs) {
  log_info("Graphs", name + ": evicting the graph for " + key.str() +
                         " to stay within max_graphs=" + std::to_string(max_graphs) +
                         " (logged once; all evictions are counted). Many evictions mean the "
                         "input shapes cycle over more graphs than that: raise max_graphs or pad "
                         "inputs to fewer shapes.");
}

}  // namespace detail

void GraphOptions::validate() const {
  VOLT_CHECK(warmup_iters() >= 1, ConfigError, "[Graphs] warmup_iters=", warmup_iters(),
             " must be >= 1; capture needs eager warm-up runs first so that lazy initialisation "
             "happens outside the graph (3 is the usual value).");
  detail::check_max_graphs(max_graphs(), "GraphOptions");
}

std::ostream& operator<<(std::ostream& os, const GraphOptions& o) {
  return os << "GraphOptions(warmup_iters=" << o.warmup_iters() << ", max_graphs=" << o.max_graphs()
            << ", asynchronous=" << o.asynchronous()
            << ", disable_tensor_cache=" << o.disable_tensor_cache() << ")";
}

std::string graph_capture_reason(at::ArrayRef<at::Tensor> inputs) {
  std::optional<c10::Device> device;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& t = inputs[i];
    if (!t.defined()) continue;
    const std::string which = "input " + std::to_string(i) + " (" + describe(t) + ")";
    if (!t.is_cuda()) {
      return which + " is on " + t.device().str() +
             "; a graph replays CUDA kernels only: move the module and its inputs to a CUDA "
             "device, or run this part eagerly";
    }
    if (t.layout() != c10::kStrided) {
      return which + " is not a dense tensor (layout " + c10::str(t.layout()) +
             "); graph inputs are copied into static dense buffers: pass it dense";
    }
    if (device && *device != t.device()) {
      return which + " is on " + t.device().str() + " but an earlier input is on " + device->str() +
             "; one graph runs on one device: put all inputs on one device";
    }
    device = t.device();
  }
  if (!device) {
    return "no defined input tensor; a graph is captured from sample inputs: pass at least one "
           "CUDA tensor";
  }
  return "";
}

void check_graph_capture(at::ArrayRef<at::Tensor> inputs, const std::string& where) {
  const std::string reason = graph_capture_reason(inputs);
  if (!reason.empty()) throw NotAvailable("[Graphs] " + where + ": " + reason + ".");
}

}  // namespace volt
