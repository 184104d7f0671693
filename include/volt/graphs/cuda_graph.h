#pragma once
/// CUDA graph capture and replay: the reference's HPU graphs ("Capture and Replay Training"),
/// on libtorch's at::cuda::CUDAGraph.
///
/// A captured graph replays the same kernels on the same memory: put each batch into static
/// input tensors, replay, read the static outputs. What a step does on the host (Python or C++
/// overhead, kernel launches one by one) is paid once, at capture.
///
///   volt::CudaGraph graph("train_step");
///   at::Tensor x = batch.to(cuda);                       // the static input
///   volt::run_on_side_stream([&] { step(x); }, 3);       // warm-up: lazy state outside graphs
///   optimizer.zero_grad();                                // gradients allocated by the graph
///   graph.capture([&] { loss = step(x); });               // records, does not run
///   for (auto& b : batches) { x.copy_(b); graph.replay(); }  // loss is updated in place
///
/// Capture runs on a side stream (graphs cannot be captured on the default stream) that first
/// waits for the caller's stream; the caller's stream waits for it afterwards. While capturing,
/// volt turns libtorch's sync debug mode to "error", so a host synchronisation in the captured
/// work (`.item()`, printing a CUDA tensor, copying it to the CPU, nonzero) fails at once with a
/// ValueError instead of corrupting the capture. Work that captures nothing (CPU tensors) is a
/// NotAvailable error. Not thread-safe; one capture at a time per process.
///
/// Builds without CUDA compile this and throw NotAvailable from capture (see available()).

#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace volt {

/// A memory pool that graphs can share (at::cuda::graph_pool_handle, or another graph's pool):
/// graphs captured into one pool must be replayed in the order they were captured.
struct GraphPool {
  uint64_t first = 0;
  uint64_t second = 0;
  /// A new shareable pool. Throws NotAvailable where CUDA graphs are not available.
  static GraphPool create();
  /// The default: each graph gets a private pool.
  bool is_private() const { return first == 0 && second == 0; }
};

class CudaGraph {
 public:
  /// `name` names the graph in errors and logs.
  explicit CudaGraph(std::string name = "CudaGraph");
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  /// True when volt was built against a CUDA libtorch and a GPU is visible.
  static bool available();
  /// Why available() is false, or "".
  static std::string unavailable_reason();

  /// Starts capturing the calling thread's CUDA work on the current device: switches the
  /// thread's current stream to a side stream until capture_end(). Throws NotAvailable without
  /// CUDA, ValueError when this graph is already captured or capturing.
  void capture_begin(GraphPool pool = {});
  /// Ends the capture and instantiates the graph; restores the caller's stream, which then
  /// waits for the side stream. Throws NotAvailable when nothing was captured.
  void capture_end();
  /// Ends a capture that failed part way (an exception in the captured work) and drops what was
  /// recorded; restores streams and the sync debug mode. Safe to call when not capturing.
  void abort_capture() noexcept;
  /// capture_begin(pool), work(), capture_end(). If `work` throws, the capture is aborted and
  /// the exception rethrown; a host synchronisation becomes ValueError "[Graphs] ...".
  void capture(const std::function<void()>& work, GraphPool pool = {});

  /// Launches the captured work on the caller's current stream and returns (asynchronous, as a
  /// kernel launch). Throws ValueError when nothing was captured.
  void replay();

  bool captured() const;
  bool capturing() const;
  int64_t replays() const;
  const std::string& name() const;
  /// The device the graph was captured on.
  c10::Device device() const;
  /// This graph's memory pool, for another capture to share (ValueError before a capture).
  GraphPool pool() const;
  /// Drops the graph and its private memory; the object can capture again.
  void reset();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Scoped capture (the reference's `with torch.cuda.graph(g):`): begins in the constructor; call
/// end() at the end of the scope. Leaving the scope without end() (an exception) aborts the
/// capture, so the graph, the streams and the memory pool are left usable.
class GraphCaptureGuard {
 public:
  explicit GraphCaptureGuard(CudaGraph& graph, GraphPool pool = {});
  ~GraphCaptureGuard();
  GraphCaptureGuard(const GraphCaptureGuard&) = delete;
  GraphCaptureGuard& operator=(const GraphCaptureGuard&) = delete;
  void end();

 private:
  CudaGraph& graph_;
  bool ended_ = false;
};

/// Runs `work` `iters` times on a side stream of the current CUDA device (which first waits for
/// the caller's stream; the caller's stream then waits for it): the warm-up before a capture, so
/// that lazy initialisation (library handles, optimizer state, autograd buffers) happens outside
/// the graph. On a build or machine without CUDA, runs `work` on the caller's thread as is.
void run_on_side_stream(const std::function<void()>& work, int64_t iters = 1);

/// Waits until the current CUDA device has finished all queued work (no-op without CUDA).
void synchronize_cuda();

}  // namespace volt
