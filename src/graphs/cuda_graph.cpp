#include "volt/graphs/cuda_graph.h"

#include <c10/util/Exception.h>
#include <torch/cuda.h>

#include <exception>
#include <string>
#include <utility>

#include "volt/core/check.h"
#include "volt/core/version.h"

// CUDA graphs are built against libtorch >= 2.1 with CUDA (the GPU machine's 2.11 wheel); the
// Debian 1.13 build has the headers but no CUDA, so everything below compiles to NotAvailable.
// VOLT_NO_CUDA_GRAPHS (CMake -DVOLT_CUDA_GRAPHS=OFF) builds the NotAvailable side even with CUDA.
#if defined(VOLT_CUDA) && VOLT_TORCH_AT_LEAST(2, 1) && !defined(VOLT_NO_CUDA_GRAPHS)
#define VOLT_CUDA_GRAPHS 1
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <optional>
#else
#define VOLT_CUDA_GRAPHS 0
#endif

namespace volt {

#if VOLT_CUDA_GRAPHS

namespace {

bool is_host_sync_error(const std::string& what) {
  // libtorch's sync debug mode ("called a synchronizing CUDA operation"), or the driver's
  // refusal of a synchronising call during capture.
  return what.find("synchronizing CUDA operation") != std::string::npos ||
         what.find("not permitted when stream is capturing") != std::string::npos ||
         what.find("cudaErrorStreamCapture") != std::string::npos ||
         (what.find("capture") != std::string::npos &&
          what.find("invalidated") != std::string::npos);
}

// One capture stream per device for every capture (as torch.cuda.graph's default capture
// stream): a backward captured apart from its forward then runs its nodes on the stream it is
// captured on (autograd replays each node on its forward's stream).
c10::cuda::CUDAStream capture_stream(c10::DeviceIndex index) {
  static std::mutex mu;
  static std::map<c10::DeviceIndex, c10::cuda::CUDAStream> streams;
  std::lock_guard<std::mutex> lock(mu);
  auto it = streams.find(index);
  if (it == streams.end()) {
    it =
        streams.emplace(index, c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index)).first;
  }
  return it->second;
}

}  // namespace

struct CudaGraph::Impl {
  std::string name;
  std::unique_ptr<at::cuda::CUDAGraph> graph;
  bool captured = false;
  bool capturing = false;
  int64_t replays = 0;
  c10::Device device = c10::Device(c10::kCUDA, 0);
  // While capturing: the caller's stream, the side stream made current, the sync mode to restore.
  std::optional<c10::cuda::CUDAStream> caller;
  std::optional<c10::cuda::CUDAStream> side;
  c10::cuda::SyncDebugMode previous_sync_mode = c10::cuda::SyncDebugMode::L_DISABLED;

  // Restores what capture_begin changed: the sync debug mode and the caller's stream, which
  // then waits for everything queued on the side stream.
  void restore_streams() noexcept {
    c10::cuda::warning_state().set_sync_debug_mode(previous_sync_mode);
    if (caller.has_value() && side.has_value()) {
      try {
        at::cuda::CUDAEvent done;
        done.record(*side);
        done.block(*caller);
      } catch (...) {  // a broken capture can refuse the event; the streams are restored anyway
      }
      c10::cuda::setCurrentCUDAStream(*caller);
    }
    caller.reset();
    side.reset();
    capturing = false;
  }
};

GraphPool GraphPool::create() {
  VOLT_CHECK(CudaGraph::available(), NotAvailable,
             "[Graphs] GraphPool::create: ", CudaGraph::unavailable_reason());
  const auto id = at::cuda::graph_pool_handle();
  return GraphPool{static_cast<uint64_t>(id.first), static_cast<uint64_t>(id.second)};
}

bool CudaGraph::available() {
  return torch::cuda::is_available();
}

std::string CudaGraph::unavailable_reason() {
  if (available()) return "";
  return "no CUDA device is visible (torch::cuda::device_count()=" +
         std::to_string(torch::cuda::device_count()) +
         "); CUDA graphs need a GPU: check CUDA_VISIBLE_DEVICES and the driver, or run eagerly.";
}

CudaGraph::CudaGraph(std::string name) : impl_(std::make_unique<Impl>()) {
  impl_->name = std::move(name);
}

CudaGraph::~CudaGraph() {
  if (impl_ && impl_->capturing) abort_capture();
}

void CudaGraph::capture_begin(GraphPool pool) {
  Impl& s = *impl_;
  VOLT_CHECK(available(), NotAvailable, "[Graphs] ", s.name, ": ", unavailable_reason());
  VOLT_CHECK(!s.capturing, ValueError, "[Graphs] ", s.name,
             ": capture_begin while already capturing; call capture_end (or abort_capture) "
             "first.");
  VOLT_CHECK(!s.captured, ValueError, "[Graphs] ", s.name,
             ": this graph is already captured; call reset() to capture it again, or use "
             "another CudaGraph.");
  const c10::DeviceIndex index = c10::cuda::current_device();
  s.device = c10::Device(c10::kCUDA, index);
  s.caller = c10::cuda::getCurrentCUDAStream(index);
  s.side = capture_stream(index);
  {
    // The side stream starts after what the caller queued (the static inputs' copies, say).
    at::cuda::CUDAEvent ready;
    ready.record(*s.caller);
    ready.block(*s.side);
  }
  c10::cuda::setCurrentCUDAStream(*s.side);
  s.previous_sync_mode = c10::cuda::warning_state().get_sync_debug_mode();
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
  s.capturing = true;
  try {
    s.graph = std::make_unique<at::cuda::CUDAGraph>();
    decltype(at::cuda::graph_pool_handle()) id{0, 0};
    id.first = static_cast<decltype(id.first)>(pool.first);
    id.second = static_cast<decltype(id.second)>(pool.second);
    s.graph->capture_begin(id);
  } catch (...) {
    s.graph.reset();
    s.restore_streams();
    throw;
  }
}

void CudaGraph::capture_end() {
  Impl& s = *impl_;
  VOLT_CHECK(s.capturing, ValueError, "[Graphs] ", s.name, ": capture_end without capture_begin.");
  VOLT_CHECK(c10::cuda::getCurrentCUDAStream(s.device.index()) == *s.side, ValueError, "[Graphs] ",
             s.name,
             ": capture_end on another stream than the capture's; restore the current stream "
             "(a CUDAStreamGuard inside the captured work must end before capture_end).");
  // How many operations were recorded: none means the work ran elsewhere (CPU tensors,
  // another device or stream), and the graph would silently do nothing.
  size_t nodes = 0;
  {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    cudaGraph_t recording = nullptr;
    if (cudaStreamGetCaptureInfo(s.side->stream(), &status, nullptr, &recording) == cudaSuccess &&
        status == cudaStreamCaptureStatusActive && recording != nullptr) {
      if (cudaGraphGetNodes(recording, nullptr, &nodes) != cudaSuccess) nodes = 1;  // unknown
    } else {
      (void)cudaGetLastError();
      nodes = 1;  // let capture_end report what is wrong
    }
  }
  try {
    s.graph->capture_end();
  } catch (...) {
    s.graph.reset();
    s.restore_streams();
    throw;
  }
  s.restore_streams();
  if (nodes == 0) {
    s.graph.reset();
    VOLT_CHECK(false, NotAvailable, "[Graphs] ", s.name,
               ": the captured work recorded no CUDA operation. Its tensors are on the CPU or "
               "on another device, or it ran on another stream; capture CUDA work on the "
               "current device's current stream (move the module and inputs to the GPU).");
  }
  s.captured = true;
}

void CudaGraph::abort_capture() noexcept {
  Impl& s = *impl_;
  if (!s.capturing) return;
  // End the stream's capture whatever state it is in, then drop what was recorded.
  try {
    if (c10::cuda::getCurrentCUDAStream(s.device.index()) != *s.side) {
      c10::cuda::setCurrentCUDAStream(*s.side);
    }
    s.graph->capture_end();
  } catch (...) {
  }
  (void)cudaGetLastError();  // an invalidated capture leaves a (non-sticky) error behind
  try {
    s.graph.reset();
  } catch (...) {
  }
  s.captured = false;
  s.restore_streams();
}

void CudaGraph::capture(const std::function<void()>& work, GraphPool pool) {
  capture_begin(pool);
  try {
    work();
  } catch (const c10::Error& e) {
    abort_capture();
    const std::string what = e.what_without_backtrace();
    if (is_host_sync_error(what)) {
      throw ValueError("[Graphs] " + impl_->name +
                       ": the captured work synchronised with the host (e.g. .item(), printing "
                       "or copying a CUDA tensor to the CPU, nonzero or masked_select, a "
                       "data-dependent shape); a graph cannot contain that. Move it out of the "
                       "captured region, or read the value from a static output after replay(). "
                       "libtorch said: " +
                       what.substr(0, what.find('\n')));
    }
    throw;
  } catch (...) {
    abort_capture();
    throw;
  }
  capture_end();
}

void CudaGraph::replay() {
  Impl& s = *impl_;
  VOLT_CHECK(!s.capturing, ValueError, "[Graphs] ", s.name,
             ": replay() while capturing; call capture_end() first.");
  VOLT_CHECK(s.captured, ValueError, "[Graphs] ", s.name,
             ": replay() before a successful capture; capture the work first.");
  s.graph->replay();
  ++s.replays;
}

GraphPool CudaGraph::pool() const {
  const Impl& s = *impl_;
  VOLT_CHECK(s.captured, ValueError, "[Graphs] ", s.name,
             ": pool() before a successful capture; share a GraphPool::create() instead.");
  const auto id = s.graph->pool();
  return GraphPool{static_cast<uint64_t>(id.first), static_cast<uint64_t>(id.second)};
}

void CudaGraph::reset() {
  Impl& s = *impl_;
  if (s.capturing) abort_capture();
  s.graph.reset();
  s.captured = false;
  s.replays = 0;
}

#else  // no CUDA graphs in this build

struct CudaGraph::Impl {  // the fields the accessors below read; nothing is ever captured
  std::string name;
  bool captured = false;
  bool capturing = false;
  int64_t replays = 0;
  c10::Device device = c10::Device(c10::kCPU);
};

GraphPool GraphPool::create() {
  VOLT_CHECK(false, NotAvailable, "[Graphs] GraphPool::create: ", CudaGraph::unavailable_reason());
  return {};
}

bool CudaGraph::available() {
  return false;
}

std::string CudaGraph::unavailable_reason() {
  return "this volt was built against a libtorch without CUDA (or older than 2.1, or with "
         "-DVOLT_CUDA_GRAPHS=OFF), so it cannot capture CUDA graphs; run eagerly, or rebuild "
         "volt against a CUDA libtorch.";
}

CudaGraph::CudaGraph(std::string name) : impl_(std::make_unique<Impl>()) {
  impl_->name = std::move(name);
}
CudaGraph::~CudaGraph() = default;

void CudaGraph::capture_begin(GraphPool) {
  VOLT_CHECK(false, NotAvailable, "[Graphs] ", impl_->name, ": ", unavailable_reason());
}
void CudaGraph::capture_end() {
  VOLT_CHECK(false, ValueError, "[Graphs] ", impl_->name, ": capture_end without capture_begin.");
}
void CudaGraph::abort_capture() noexcept {}
void CudaGraph::capture(const std::function<void()>&, GraphPool pool) {
  capture_begin(pool);
}
void CudaGraph::replay() {
  VOLT_CHECK(false, ValueError, "[Graphs] ", impl_->name,
             ": replay() before a successful capture; capture the work first (",
             unavailable_reason(), ")");
}
GraphPool CudaGraph::pool() const {
  VOLT_CHECK(false, ValueError, "[Graphs] ", impl_->name, ": pool() before a successful capture.");
  return {};
}
void CudaGraph::reset() {}

#endif

bool CudaGraph::captured() const {
  return impl_->captured;
}
bool CudaGraph::capturing() const {
  return impl_->capturing;
}
int64_t CudaGraph::replays() const {
  return impl_->replays;
}
const std::string& CudaGraph::name() const {
  return impl_->name;
}
c10::Device CudaGraph::device() const {
  return impl_->device;
}

void run_on_side_stream(const std::function<void()>& work, int64_t iters) {
  VOLT_CHECK(iters >= 0, ConfigError, "[Graphs] run_on_side_stream: iters=", iters,
             " must be >= 0.");
  if (!CudaGraph::available()) {
    for (int64_t i = 0; i < iters; ++i) work();
    return;
  }
#if VOLT_CUDA_GRAPHS
  const c10::DeviceIndex index = c10::cuda::current_device();
  const c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream(index);
  // The capture stream itself, not another pool stream: autograd remembers the stream a leaf's
  // gradient was first accumulated on, and torch 2.x warns ("AccumulateGrad node's stream does
  // not match") when a captured backward later produces that gradient on another one.
  const c10::cuda::CUDAStream side = capture_stream(index);
  at::cuda::CUDAEvent ready;
  ready.record(caller);
  ready.block(side);
  {
    c10::cuda::CUDAStreamGuard guard(side);
    for (int64_t i = 0; i < iters; ++i) work();
  }
  at::cuda::CUDAEvent done;
  done.record(side);
  done.block(caller);
#endif
}

void synchronize_cuda() {
  if (CudaGraph::available()) torch::cuda::synchronize();
}

GraphCaptureGuard::GraphCaptureGuard(CudaGraph& graph, GraphPool pool) : graph_(graph) {
  graph_.capture_begin(pool);
}

GraphCaptureGuard::~GraphCaptureGuard() {
  if (!ended_) graph_.abort_capture();
}

void GraphCaptureGuard::end() {
  VOLT_CHECK(!ended_, ValueError, "[Graphs] ", graph_.name(), ": GraphCaptureGuard::end twice.");
  ended_ = true;
  graph_.capture_end();
}

}  // namespace volt
